//! The environment policy of shell hooks, name by name, through the real loader
//! (ARCHITECTURE.md § Shell hooks). What reaches a real child process
//! is checked in `tests/library/shell.rs` (`the_environment_is_sanitized`).

use prx_hooks::config::{self, HookTable};
use prx_hooks::shell::env::{self as policy, Scope};
use std::path::Path;

fn parse(ws: &Path, text: &str) -> Result<HookTable, Vec<String>> {
    config::parse(text.as_bytes(), "hooks.json", ws).map_err(|e| e.lines())
}

fn set_in_env(name: &str) -> String {
    format!(
        r#"{{"hooks": {{"turn_complete": [{{"command": "/bin/true", "env": {{"{name}": "x"}}}}]}}}}"#
    )
}

fn pass_through(name: &str) -> String {
    format!(r#"{{"env_passthrough": ["{name}"]}}"#)
}

/// Refused in both `env` and `env_passthrough`: the dynamic loader's variables (all of them,
/// in any case) and the C library's list of variables it strips for setuid programs.
const REFUSED_EVERYWHERE: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "ld_audit",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "LD_BIND_NOW",
    "LD_ANYTHING_NEW",
    "DYLD_INSERT_LIBRARIES",
    "DYLD_LIBRARY_PATH",
    "DYLD_FRAMEWORK_PATH",
    "GCONV_PATH",
    "GETCONF_DIR",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "LOCPATH",
    "MALLOC_TRACE",
    "MALLOC_CHECK_",
    "MALLOC_ARENA_MAX",
    "NIS_PATH",
    "NLSPATH",
    "RESOLV_HOST_CONF",
    "RES_OPTIONS",
    "TMPDIR",
    "TZDIR",
    "PATH",
    "ZERO_HOOK_EVENT",
];

/// Refused from the agent (`env_passthrough`) only: the hook's author may set them in `env`.
const REFUSED_FROM_THE_AGENT: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "BASH_FUNC_x%%",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONWARNINGS",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "LUA_INIT",
    "LUA_PATH",
    "PHPRC",
    "GIT_SSH_COMMAND",
    "GIT_EXEC_PATH",
    "GIT_CONFIG_PARAMETERS",
];

/// Fine in both.
const ALLOWED: &[&str] = &["AWS_REGION", "CI", "MY_LD_PATH", "LDX", "PYTHON", "HOMEDIR"];

#[test]
fn refused_everywhere_name_by_name() {
    let ws = tempfile::tempdir().unwrap();
    for name in REFUSED_EVERYWHERE {
        for (what, text) in [
            ("env", set_in_env(name)),
            ("passthrough", pass_through(name)),
        ] {
            let errs = parse(ws.path(), &text).expect_err(&format!("{what} {name} accepted"));
            assert_eq!(errs.len(), 1, "{what} {name}: {errs:?}");
            assert!(errs[0].contains(&format!("\"{name}\"")), "{}", errs[0]);
        }
        assert!(policy::refusal(name, Scope::Env).is_some(), "{name}");
        assert!(
            policy::refusal(name, Scope::Passthrough).is_some(),
            "{name}"
        );
    }
}

#[test]
fn interpreter_start_up_variables_only_from_the_hooks_author() {
    let ws = tempfile::tempdir().unwrap();
    for name in REFUSED_FROM_THE_AGENT {
        let t = parse(ws.path(), &set_in_env(name))
            .unwrap_or_else(|e| panic!("env {name} refused: {e:?}"));
        assert_eq!(t.actions[0].env, [(name.to_string(), "x".to_string())]);
        let errs = parse(ws.path(), &pass_through(name))
            .expect_err(&format!("passthrough {name} accepted"));
        assert_eq!(errs.len(), 1, "{name}: {errs:?}");
        assert!(
            errs[0].contains(&format!("\"{name}\"")) && errs[0].contains("env_passthrough[0]"),
            "{}",
            errs[0]
        );
        assert!(policy::refusal(name, Scope::Env).is_none(), "{name}");
        assert!(
            policy::refusal(name, Scope::Passthrough).is_some(),
            "{name}"
        );
    }
}

/// HOME is the host's (or the passwd entry's) by design: a hooks.json may not set it, like
/// PATH; listing it in `env_passthrough` changes nothing and is a warning (PRX's files list it).
#[test]
fn home_is_refused_in_env_and_a_warning_in_env_passthrough() {
    let ws = tempfile::tempdir().unwrap();
    for name in ["HOME", "home"] {
        let errs = parse(ws.path(), &set_in_env(name)).expect_err(&format!("env {name} accepted"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("hooks.json:1:")
                && errs[0].contains(&format!(
                    "hooks.turn_complete[0].env.{name}: may not set \"{name}\": hooks get the host's HOME"
                )),
            "{}",
            errs[0]
        );
        let rule = policy::refusal(name, Scope::Env).expect("a rule of RULES");
        assert_eq!(rule.pattern, "HOME");
        assert!(policy::is_blocked(name));
    }
    assert!(policy::refusal("HOME", Scope::Passthrough).is_none());
    let t = parse(ws.path(), &pass_through("HOME")).unwrap();
    assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
    // Through a real file, as `validate` reads it: FILE:LINE:COL.
    std::fs::write(
        ws.path().join("hooks.json"),
        "{\"hooks\": {\"error\": [\n  {\"command\": \"/bin/true\", \"env\": {\"HOME\": \"/tmp/x\"}}\n]}}\n",
    )
    .unwrap();
    let errs = config::load(ws.path()).unwrap_err().lines();
    let want = format!(
        "{}:2:36: hooks.error[0].env.HOME: may not set \"HOME\"",
        ws.path().join("hooks.json").display()
    );
    assert!(
        errs.len() == 1 && errs[0].starts_with(&want),
        "{errs:?}\nwant {want}"
    );
}

#[test]
fn ordinary_names_pass() {
    let ws = tempfile::tempdir().unwrap();
    for name in ALLOWED {
        parse(ws.path(), &set_in_env(name)).unwrap_or_else(|e| panic!("env {name}: {e:?}"));
        parse(ws.path(), &pass_through(name)).unwrap_or_else(|e| panic!("pass {name}: {e:?}"));
    }
}

#[test]
fn only_real_locale_categories_come_from_the_agent() {
    for name in [
        "LC_ALL",
        "LC_CTYPE",
        "LC_NUMERIC",
        "LC_TIME",
        "LC_COLLATE",
        "LC_MONETARY",
        "LC_MESSAGES",
        "LC_PAPER",
        "LC_NAME",
        "LC_ADDRESS",
        "LC_TELEPHONE",
        "LC_MEASUREMENT",
        "LC_IDENTIFICATION",
    ] {
        assert!(policy::is_locale_category(name), "{name}");
    }
    for name in ["LC_GITHUB_TOKEN", "LC_", "LC_time", "LC_ALLX"] {
        assert!(!policy::is_locale_category(name), "{name}");
    }
}

#[test]
fn every_rule_in_the_documented_table_is_enforced() {
    // The table docs/hooks.md documents is the one the code checks: each row's example is refused
    // exactly where the row says.
    for rule in policy::RULES {
        let example = rule.example();
        assert_eq!(
            policy::refusal(&example, Scope::Env).is_some(),
            rule.in_env,
            "{example}"
        );
        assert_eq!(
            policy::refusal(&example, Scope::Passthrough).is_some(),
            rule.in_passthrough,
            "{example}"
        );
        // Only HOME is allowed through (with a warning): hooks always get the host's.
        assert!(rule.in_passthrough || rule.pattern == "HOME", "{example}");
    }
}

#[test]
fn path_inherit_keeps_only_safe_absolute_directories() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let open = dir.path().join("world-writable");
    std::fs::create_dir(&good).unwrap();
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let host = format!(
        "{}::relative/bin:{}:/nonexistent-prx-dir:/usr/bin:.",
        good.display(),
        open.display()
    );
    let (kept, dropped) = policy::filter_path(&host);
    assert_eq!(kept, format!("{}:/usr/bin", good.display()));
    assert_eq!(dropped.len(), 5, "{dropped:?}");
    for d in &dropped {
        assert!(!d.entry.is_empty() || d.reason.contains("empty"), "{d:?}");
    }
    assert!(dropped.iter().any(|d| d.entry == "relative/bin"));
    assert!(
        dropped
            .iter()
            .any(|d| d.entry == open.to_str().unwrap() && d.reason.contains("world-writable"))
    );
}

#[test]
fn path_inherit_in_hooks_json() {
    let ws = tempfile::tempdir().unwrap();
    let t = parse(ws.path(), r#"{"path": "safe"}"#).unwrap();
    assert_eq!(t.path, None);
    let t = parse(ws.path(), r#"{"path": "inherit"}"#).unwrap();
    assert!(t.path.is_some(), "inherit: the host's filtered PATH");
    let errs = parse(ws.path(), r#"{"path": "/usr/bin"}"#).unwrap_err();
    assert!(
        errs[0].contains("path") && errs[0].contains("\"inherit\""),
        "{errs:?}"
    );
}
