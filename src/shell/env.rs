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
//! (`harden`, docs/hooks.md § Security: what holds where).

use super::payload::{EventRun, MAX_ENV_PAYLOAD};
use crate::config::Action;
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// `PATH` inside every hook process unless the table says `"path": "inherit"` (and the PATH bare
/// command names are resolved against at load time, by [`crate::config`]).
pub use crate::config::SANITIZED_PATH;

use crate::config::env_policy::well_formed;
pub use crate::config::env_policy::{
    ALLOWLIST, DroppedEntry, LOCALE_CATEGORIES, RULES, Rule, Scope, filter_path, inherited_path,
    is_blocked, is_locale_category, refusal,
};

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
        // And what makes its effect happen once: its id, delivery count, reclaim mark.
        if let Some(id) = &s.event_id {
            vars.push(entry(b"ZERO_HOOK_EVENT_ID", id.as_bytes()));
        }
        if let Some(n) = &s.delivery {
            vars.push(entry(b"ZERO_HOOK_DELIVERY", n.as_bytes()));
        }
        if s.reclaimed {
            vars.push(entry(b"ZERO_HOOK_RECLAIMED", b"1"));
        }
        if json.len() <= MAX_ENV_PAYLOAD && !json.contains('\0') {
            vars.push(entry(b"ZERO_HOOK_PAYLOAD", json.as_bytes()));
        } else {
            vars.push(entry(b"ZERO_HOOK_PAYLOAD_TRUNCATED", b"1"));
        }
        Ok(ChildEnv { vars })
    }

    /// The parent share `base` (from [`parent_env`]) and then `extra`, which wins over it
    /// (a command policy's environment).
    pub(crate) fn with_extra(base: &[(OsString, OsString)], extra: &[(&str, &str)]) -> ChildEnv {
        let mut vars: Vec<CString> = extra
            .iter()
            .map(|(k, v)| entry(k.as_bytes(), v.as_bytes()))
            .collect();
        for (k, v) in base {
            if !extra.iter().any(|(e, _)| OsStr::new(e) == k) {
                vars.push(entry(k.as_bytes(), v.as_bytes()));
            }
        }
        ChildEnv { vars }
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
