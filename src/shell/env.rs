//! The environment of a hook process and the policy behind it (ARCHITECTURE.md § Shell hooks;
//! docs/hooks.md § Shell hooks has the same table).
//!
//! A hook's environment is built from nothing, in this order (a later entry of the same name
//! wins):
//!
//! 1. from the host, when set there: `LANG`, `TERM`, `TZ`, `USER`, `LOGNAME`, `TMPDIR`, the real
//!    locale categories (`LC_ALL`, `LC_CTYPE`, … — [`LOCALE_CATEGORIES`], not any `LC_*`), and
//!    `HOME` (the host's when it is an absolute path, else the passwd entry's);
//! 2. the table's `env_passthrough` names the host has set, minus every name [`RULES`] refuses
//!    for [`Scope::Passthrough`];
//! 3. `PATH`: [`SANITIZED_PATH`], or with `"path": "inherit"` the host's PATH through
//!    [`filter_path`];
//! 4. the `ZERO_HOOK_*` variables;
//! 5. the hook's own `env`, minus every name [`RULES`] refuses for [`Scope::Env`].
//!
//! The parent's share (1–3) is decided once per table (`parent_env`, when the table is set),
//! not per spawn: reading the whole environment takes the process-wide environment lock.
//!
//! What this protects and what it does not: a secret in the agent's environment does not reach
//! a hook *through its environment*. A hook runs as the same user as the agent, so it can read
//! `/proc/<agent pid>/environ` (and its memory) unless the host is made non-dumpable
//! (`harden`, README.md § Security).

use super::payload::{EventRun, MAX_ENV_PAYLOAD};
use crate::config::Action;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

/// `PATH` inside every hook process unless the table says `"path": "inherit"` (and the PATH bare
/// command names are resolved against at load time, by [`crate::config`]).
pub use crate::config::SANITIZED_PATH;

/// Variables passed from the host when set there (besides [`LOCALE_CATEGORIES`] and `HOME`).
pub const ALLOWLIST: [&str; 6] = ["LANG", "TZ", "TERM", "USER", "LOGNAME", "TMPDIR"];

/// The locale categories of POSIX and glibc: the only `LC_*` names taken from the host
/// (`LC_GITHUB_TOKEN` is not a locale).
pub const LOCALE_CATEGORIES: [&str; 13] = [
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
];

/// Where a variable name is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Set by the hook's own `env` (its author also chose the command).
    Env,
    /// Taken from the agent's environment by `env_passthrough`.
    Passthrough,
}

/// One row of the policy: names matching `pattern` (exact, or a prefix when it ends in `*`;
/// compared case-insensitively) are refused from the agent when `in_passthrough`, and in
/// `env` when `in_env`.
#[derive(Debug)]
pub struct Rule {
    pub pattern: &'static str,
    /// Refused in a hook's `env`.
    pub in_env: bool,
    /// Refused in `env_passthrough` (every rule but `HOME`'s: hooks always get the host's
    /// HOME, so listing it there changes nothing and the loader says so in a warning).
    pub in_passthrough: bool,
    pub why: &'static str,
}

const LOADER: &str = "LD_* variables control the dynamic loader (code loaded into the hook)";
const DYLD: &str = "DYLD_* variables control the macOS dynamic loader";
const LIBC: &str = "the C library ignores it in setuid programs: it makes the C library load code \
     or data files";
const OURS: &str = "ZERO_HOOK_* variables are set by prx-hooks";
const STARTUP: &str = "it runs code when an interpreter starts; only the hook's own \"env\" may \
     set it (its author chooses the command), never the agent's environment";

/// The whole policy, in the order it is checked. docs/hooks.md § Shell hooks documents this table.
pub const RULES: &[Rule] = &[
    Rule {
        pattern: "LD_*",
        in_env: true,
        in_passthrough: true,
        why: LOADER,
    },
    Rule {
        pattern: "DYLD_*",
        in_env: true,
        in_passthrough: true,
        why: DYLD,
    },
    // glibc's UNSECURE_ENVVARS (sysdeps/generic/unsecvars.h) beyond LD_*.
    Rule {
        pattern: "GCONV_PATH",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "GETCONF_DIR",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "GLIBC_TUNABLES",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "HOSTALIASES",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "LOCALDOMAIN",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "LOCPATH",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "MALLOC_*",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "NIS_PATH",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "NLSPATH",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "RESOLV_HOST_CONF",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "RES_OPTIONS",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "TMPDIR",
        in_env: true,
        in_passthrough: true,
        why: "the C library ignores it in setuid programs; hooks get the host's TMPDIR as is",
    },
    Rule {
        pattern: "TZDIR",
        in_env: true,
        in_passthrough: true,
        why: LIBC,
    },
    Rule {
        pattern: "PATH",
        in_env: true,
        in_passthrough: true,
        why: "hooks get the safe PATH, or with \"path\": \"inherit\" the agent's PATH filtered",
    },
    Rule {
        pattern: "HOME",
        in_env: true,
        in_passthrough: false,
        why: "hooks get the host's HOME (the agent's when it is an absolute path, else the \
              passwd entry's): it decides which configuration files every tool reads",
    },
    Rule {
        pattern: "ZERO_HOOK_*",
        in_env: true,
        in_passthrough: true,
        why: OURS,
    },
    // Interpreter and tool start-up variables: refused from the agent only.
    Rule {
        pattern: "BASH_ENV",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "ENV",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "SHELLOPTS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "BASHOPTS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PS4",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PROMPT_COMMAND",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "BASH_FUNC_*",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONPATH",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONSTARTUP",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONHOME",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONUSERBASE",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONWARNINGS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONBREAKPOINT",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PYTHONINSPECT",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "NODE_OPTIONS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "NODE_PATH",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "NODE_REPL_EXTERNAL_MODULE",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PERL5OPT",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PERL5LIB",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PERLLIB",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PERL5DB",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "RUBYOPT",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "RUBYLIB",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "JAVA_TOOL_OPTIONS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "_JAVA_OPTIONS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "JDK_JAVA_OPTIONS",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "CLASSPATH",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "LUA_INIT*",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "LUA_PATH*",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "LUA_CPATH*",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "TCLLIBPATH",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PHPRC",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "PHP_INI_SCAN_DIR",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "GIT_SSH",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "GIT_SSH_COMMAND",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "GIT_EXEC_PATH",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "GIT_CONFIG*",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
    Rule {
        pattern: "GIT_TEMPLATE_DIR",
        in_env: false,
        in_passthrough: true,
        why: STARTUP,
    },
];

impl Rule {
    /// Whether `name` falls under this rule (case-insensitively).
    pub fn matches(&self, name: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => {
                name.len() >= prefix.len()
                    && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
            }
            None => name.eq_ignore_ascii_case(self.pattern),
        }
    }

    /// A name this rule covers (the pattern with `*` filled in).
    pub fn example(&self) -> String {
        self.pattern.replace('*', "X")
    }
}

/// The rule that refuses `name` in `scope`, if any.
pub fn refusal(name: &str, scope: Scope) -> Option<&'static Rule> {
    RULES
        .iter()
        .find(|r| {
            match scope {
                Scope::Env => r.in_env,
                Scope::Passthrough => r.in_passthrough,
            }
        } && r.matches(name))
}

/// Whether a hook's `env` may never set `name` (compared case-insensitively). Every such name
/// is refused from the agent's environment as well, except `HOME`: hooks get the host's.
pub fn is_blocked(name: &str) -> bool {
    refusal(name, Scope::Env).is_some()
}

/// A real locale category (exact, upper case: the C library reads no other spelling).
pub fn is_locale_category(name: &str) -> bool {
    LOCALE_CATEGORIES.contains(&name)
}

/// A name `execve` can carry without failing the spawn or smuggling a second variable.
fn well_formed(name: &[u8]) -> bool {
    !name.is_empty() && !name.contains(&b'=') && !name.contains(&0)
}

/// A PATH entry left out by [`filter_path`], and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedEntry {
    pub entry: String,
    pub reason: &'static str,
}

/// The host's `PATH` as hooks get it with `"path": "inherit"`: in order, without duplicates,
/// minus entries that are empty or relative (they name the hook's cwd: the workspace, which
/// hooks.json's writers control), that are not existing directories (someone could create
/// them later), or that are world-writable (any local user could plant a program there).
pub fn filter_path(host: &str) -> (String, Vec<DroppedEntry>) {
    let mut kept: Vec<&str> = Vec::new();
    let mut dropped = Vec::new();
    for entry in host.split(':') {
        let reason = if entry.is_empty() {
            Some("an empty entry means the current directory")
        } else if !entry.starts_with('/') {
            Some("a relative entry resolves against the hook's working directory")
        } else {
            match std::fs::metadata(entry) {
                Err(_) => Some("it does not exist"),
                Ok(m) if !m.is_dir() => Some("it is not a directory"),
                Ok(m) if m.permissions().mode() & 0o002 != 0 => {
                    Some("it is world-writable: any local user could put a program there")
                }
                Ok(_) => None,
            }
        };
        match reason {
            Some(reason) => dropped.push(DroppedEntry {
                entry: entry.to_string(),
                reason,
            }),
            None if !kept.contains(&entry) => kept.push(entry),
            None => {}
        }
    }
    (kept.join(":"), dropped)
}

/// The host's PATH filtered ([`filter_path`]), with each dropped entry as a warning line.
pub fn inherited_path() -> (String, Vec<String>) {
    let host = std::env::var("PATH").unwrap_or_default();
    let (kept, dropped) = filter_path(&host);
    let warnings = dropped
        .into_iter()
        .map(|d| {
            format!(
                "PATH entry {:?} is not passed to hooks: {}",
                d.entry, d.reason
            )
        })
        .collect();
    (kept, warnings)
}

/// `HOME` for hooks: the host's when it is an absolute path, else the passwd entry's.
fn home() -> Option<OsString> {
    if let Some(h) = std::env::var_os("HOME")
        && h.as_bytes().starts_with(b"/")
        && !h.as_bytes().contains(&0)
    {
        return Some(h);
    }
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.dir.into_os_string())
}

/// The host's share (allowlist, locale categories, HOME, `env_passthrough` minus refused names)
/// and `PATH` (`path`: the table's). Sorted by name, for a deterministic child environment.
pub(crate) fn parent_env(passthrough: &[String], path: &str) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, v)| {
            let bytes = k.as_bytes();
            let Ok(name) = std::str::from_utf8(bytes) else {
                return false;
            };
            let host = ALLOWLIST.contains(&name) || is_locale_category(name);
            let passed = passthrough.iter().any(|p| p == name)
                && refusal(name, Scope::Passthrough).is_none()
                && name != "HOME";
            (host || passed) && well_formed(bytes) && !v.as_bytes().contains(&0)
        })
        .collect();
    if let Some(h) = home() {
        out.push(("HOME".into(), h));
    }
    out.push(("PATH".into(), path.into()));
    out.sort();
    out
}

/// Whether an action's `env` entry may be set. The loader has already refused these names;
/// this is the spawn side's own check, so a table built some other way cannot undo the policy.
pub(crate) fn action_entry_allowed(name: &str, value: &str) -> bool {
    refusal(name, Scope::Env).is_none() && well_formed(name.as_bytes()) && !value.contains('\0')
}

/// One hook process's environment as `execve` takes it.
pub(crate) struct ChildEnv {
    vars: Vec<CString>,
}

impl ChildEnv {
    /// The environment of `action` for `run`: the table's parent share, the `ZERO_HOOK_*`
    /// variables, the action's `env` (which may override the parent share, never the rest).
    pub(crate) fn for_run(action: &Action, run: &EventRun) -> Result<ChildEnv, String> {
        let payload_file = run.payload_file().map_err(str::to_string)?;
        let s = run.strings();
        let json = run.msg.json_str();
        let mut vars: Vec<CString> = Vec::with_capacity(run.base_env.len() + action.env.len() + 9);
        let mut own: Vec<&str> = Vec::with_capacity(action.env.len());
        for (k, v) in &action.env {
            if !action_entry_allowed(k, v) {
                tracing::warn!(hook = %action.id, "env entry {k:?} refused at spawn");
                continue;
            }
            if own.contains(&k.as_str()) {
                continue;
            }
            own.push(k);
            vars.push(entry(k.as_bytes(), v.as_bytes()));
        }
        for (k, v) in run.base_env.iter() {
            if !own.iter().any(|o| OsStr::new(o) == k) {
                vars.push(entry(k.as_bytes(), v.as_bytes()));
            }
        }
        let zero: [(&str, &[u8]); 7] = [
            ("ZERO_HOOK_EVENT", action.event.name().as_bytes()),
            ("ZERO_HOOK_SESSION", s.session.as_bytes()),
            ("ZERO_HOOK_AGENT", s.agent.as_bytes()),
            ("ZERO_HOOK_SEQ", s.seq.as_bytes()),
            ("ZERO_HOOK_ID", action.id.as_bytes()),
            ("ZERO_HOOK_TIMESTAMP", s.timestamp.as_bytes()),
            (
                "ZERO_HOOK_PAYLOAD_FILE",
                payload_file.as_os_str().as_bytes(),
            ),
        ];
        for (k, v) in zero {
            vars.push(entry(k.as_bytes(), v));
        }
        // An event consumed from NATS: its agent's time and numbering beside this host's.
        if let Some(t) = &s.origin_timestamp {
            vars.push(entry(b"ZERO_HOOK_ORIGIN_TIMESTAMP", t.as_bytes()));
        }
        if let Some(n) = &s.origin_seq {
            vars.push(entry(b"ZERO_HOOK_ORIGIN_SEQ", n.as_bytes()));
        }
        if json.len() <= MAX_ENV_PAYLOAD && !json.contains('\0') {
            vars.push(entry(b"ZERO_HOOK_PAYLOAD", json.as_bytes()));
        } else {
            vars.push(entry(b"ZERO_HOOK_PAYLOAD_TRUNCATED", b"1"));
        }
        Ok(ChildEnv { vars })
    }

    /// An environment of exactly `pairs` (benches).
    pub(crate) fn from_pairs(pairs: &[(&str, &str)]) -> ChildEnv {
        ChildEnv {
            vars: pairs
                .iter()
                .map(|(k, v)| entry(k.as_bytes(), v.as_bytes()))
                .collect(),
        }
    }

    /// The NULL-terminated array `execve` takes (valid while `self` lives).
    pub(crate) fn pointers(&self) -> Vec<*const std::ffi::c_char> {
        self.vars
            .iter()
            .map(|v| v.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    }
}

/// `NAME=value`. Names and values were checked for NUL bytes (a NUL-free name from the table,
/// values sanitized by `EventRun::strings`); a stray NUL truncates rather than failing.
fn entry(k: &[u8], v: &[u8]) -> CString {
    let mut b = Vec::with_capacity(k.len() + v.len() + 1);
    b.extend_from_slice(k);
    b.push(b'=');
    b.extend(v.iter().copied().take_while(|&c| c != 0));
    CString::new(b).unwrap_or_else(|e| {
        let mut bytes = e.into_vec();
        let nul = bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len());
        bytes.truncate(nul);
        CString::new(bytes).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_names_case_insensitively() {
        for n in [
            "PATH",
            "path",
            "LD_PRELOAD",
            "ld_library_path",
            "LD_AUDIT",
            "DYLD_INSERT_LIBRARIES",
            "GCONV_PATH",
            "malloc_check_",
            "ZERO_HOOK_EVENT",
            "zero_hook_anything",
        ] {
            assert!(is_blocked(n), "{n}");
        }
        for n in [
            "LANG",
            "ZERO_HOOKX",
            "ZERO_HOO",
            "MY_PATH",
            "LDX",
            "HOMEDIR",
        ] {
            assert!(!is_blocked(n), "{n}");
        }
        assert!(is_blocked("HOME") && is_blocked("home"));
        assert!(refusal("HOME", Scope::Passthrough).is_none());
        assert!(!is_blocked("BASH_ENV"));
        assert!(refusal("BASH_ENV", Scope::Passthrough).is_some());
    }

    #[test]
    fn action_entries_are_checked() {
        assert!(action_entry_allowed("LEVEL", "info"));
        assert!(!action_entry_allowed("PATH", "/tmp"));
        assert!(!action_entry_allowed("HOME", "/tmp"));
        assert!(!action_entry_allowed("A=B", "x"));
        assert!(!action_entry_allowed("", "x"));
        assert!(!action_entry_allowed("A", "x\0y"));
    }

    #[test]
    fn entries_never_carry_a_nul() {
        assert_eq!(entry(b"A", b"x\0y").as_bytes(), b"A=x");
    }
}
