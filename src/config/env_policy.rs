//! The environment policy: which names a hook's `env` and the table's `env_passthrough` may
//! carry, and which `PATH` entries hooks inherit. The loader checks hooks.json against it; the
//! shell backend applies it when it builds a hook's environment (`shell::env`, which re-exports
//! it; ARCHITECTURE.md § Shell hooks).

use std::os::unix::fs::PermissionsExt;

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
    /// The name, or a prefix ending in `*`, compared case-insensitively.
    pub pattern: &'static str,
    /// Refused in a hook's `env`.
    pub in_env: bool,
    /// Refused in `env_passthrough` (every rule but `HOME`'s: hooks always get the host's
    /// HOME, so listing it there changes nothing and the loader says so in a warning).
    pub in_passthrough: bool,
    /// Why such a name is refused, as the loader's message says it.
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
pub(crate) fn well_formed(name: &[u8]) -> bool {
    !name.is_empty() && !name.contains(&b'=') && !name.contains(&0)
}

/// A PATH entry left out by [`filter_path`], and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedEntry {
    /// The entry as it was in PATH.
    pub entry: String,
    /// Why it was left out.
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
