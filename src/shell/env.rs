//! The environment of a hook process (ARCHITECTURE.md § Shell hooks): cleared, then a small allowlist from the
//! parent, the sanitized `PATH`, the `ZERO_HOOK_*` variables, then the action's own `env`.
//!
//! The parent's share is decided once per table (`parent_env`, when the table is set), not per
//! spawn: it is a handful of variables, and reading the whole environment on every spawn would
//! take the process-wide environment lock each time.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// `PATH` inside every hook process (and the PATH bare command names are resolved against,
/// at load time, by [`crate::config`]).
pub use crate::config::SANITIZED_PATH;

/// Variables passed from the parent when set there (plus every `LC_*`).
pub const ALLOWLIST: [&str; 6] = ["LANG", "TZ", "TERM", "USER", "LOGNAME", "TMPDIR"];

/// Whether `name` may never be passed through or set by a hook's `env`: the loader's blocked
/// names (`LD_PRELOAD`, `LD_LIBRARY_PATH`, `DYLD_*`, `PATH`, `HOME`) and `ZERO_HOOK_*`, compared
/// case-insensitively, exactly as the loader does (one definition for both sides).
pub fn is_blocked(name: &str) -> bool {
    crate::config::is_blocked_env(name) || crate::config::is_zero_hook_var(name)
}

/// A name `Command::env` can carry without failing the spawn or smuggling a second variable.
fn well_formed(name: &[u8]) -> bool {
    !name.is_empty() && !name.contains(&b'=') && !name.contains(&0)
}

/// The parent's contribution: the allowlist, every `LC_*`, and the table's `env_passthrough`,
/// minus anything blocked. Sorted by name, for a deterministic child environment.
pub(crate) fn parent_env(passthrough: &[String]) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, v)| {
            let bytes = k.as_bytes();
            let Ok(name) = std::str::from_utf8(bytes) else {
                return false;
            };
            let wanted = ALLOWLIST.contains(&name)
                || name.starts_with("LC_")
                || passthrough.iter().any(|p| p == name);
            wanted && !is_blocked(name) && well_formed(bytes) && !v.as_bytes().contains(&0)
        })
        .collect();
    out.sort();
    out
}

/// Whether an action's `env` entry may be set. The loader has already refused blocked names;
/// this is the spawn side's own check, so a table built some other way cannot undo the
/// sanitizing either.
pub(crate) fn action_entry_allowed(name: &str, value: &str) -> bool {
    !is_blocked(name) && well_formed(name.as_bytes()) && !value.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_names_case_insensitively() {
        for n in [
            "PATH",
            "path",
            "Home",
            "LD_PRELOAD",
            "ld_library_path",
            "DYLD_INSERT_LIBRARIES",
            "ZERO_HOOK_EVENT",
            "zero_hook_anything",
        ] {
            assert!(is_blocked(n), "{n}");
        }
        for n in ["LANG", "ZERO_HOOKX", "ZERO_HOO", "MY_PATH", "LD_OTHER"] {
            assert!(!is_blocked(n), "{n}");
        }
    }

    #[test]
    fn action_entries_are_checked() {
        assert!(action_entry_allowed("LEVEL", "info"));
        assert!(!action_entry_allowed("PATH", "/tmp"));
        assert!(!action_entry_allowed("A=B", "x"));
        assert!(!action_entry_allowed("", "x"));
        assert!(!action_entry_allowed("A", "x\0y"));
    }
}
