//! Containment: what `run` and `fire` do to their process and their hooks before any hook runs.
//!
//! `--harden`, the child subreaper, cgroups and per-hook limits (docs/cli.md § Containment).

use crate::{BoxError, ContainArgs};
use std::path::PathBuf;
use std::time::Instant;

/// What `run` and `fire` do to their own process before any hook runs: `--harden`, and
/// becoming the child subreaper of everything the hooks leave behind (docs/hooks.md § Security: what holds where).
pub(super) struct Containment {
    pub(super) subreaper: Option<prx_hooks::shell::supervisor::Subreaper>,
    pub(super) hardened: bool,
}

/// Makes this process non-dumpable with `--harden`, and a child subreaper (always: the CLI owns
/// its process; a library host never does this unless it asks).
pub(super) fn contain(args: &ContainArgs) -> Result<Containment, BoxError> {
    use prx_hooks::shell::supervisor;
    if args.harden {
        supervisor::harden().map_err(|e| format!("--harden: prctl(PR_SET_DUMPABLE): {e}"))?;
    }
    let subreaper = supervisor::Subreaper::start()
        .inspect_err(|e| {
            tracing::warn!(
                "cannot become a child subreaper ({e}): what hooks leave behind is reparented to init and not killed at shutdown"
            )
        })
        .ok();
    Ok(Containment {
        subreaper,
        hardened: supervisor::is_hardened(),
    })
}

impl Containment {
    /// After the hooks have shut down: kills every orphan a hook left behind (with its tree)
    /// and says what was done.
    pub(super) fn finish(self) -> serde_json::Value {
        let (killed, reaped) = match &self.subreaper {
            Some(s) => {
                let killed = s.kill_orphans(Instant::now() + prx_hooks::SHUTDOWN_SLACK);
                (killed, s.reaped())
            }
            None => (0, 0),
        };
        if killed > 0 {
            tracing::info!("killed {killed} process(es) hooks had left running");
        }
        serde_json::json!({
            "subreaper": self.subreaper.is_some(),
            "orphans_killed_at_exit": killed,
            "orphans_reaped": reaped,
            "hardened": self.hardened,
        })
    }
}

/// The shell backend's limits from `--cgroup`, `--hook-limit` (default `core_bytes=0`: a
/// crashing hook does not write a core file into the workspace) and `--payload-dir`
/// ([`payload_dir`]).
pub(super) fn shell_limits(args: &ContainArgs) -> Result<prx_hooks::shell::ShellLimits, BoxError> {
    let mut limits = prx_hooks::shell::ShellLimits::default();
    if let Some(dir) = &args.payload_dir {
        limits.tmp_dir = Some(payload_dir(dir)?);
    }
    match args.cgroup.as_str() {
        "auto" => limits.detect_cgroup = true,
        "off" => {}
        dir => limits.cgroup = Some(PathBuf::from(dir)),
    }
    let keys = prx_hooks::config::HookLimits::KEYS;
    limits.hook_limits.core_bytes = Some(0);
    for kv in &args.hook_limit {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--hook-limit {kv:?}: expected KEY=VALUE"))?;
        if !keys.contains(&k) {
            return Err(format!(
                "--hook-limit {kv:?}: unknown limit {k:?}; expected one of {}",
                keys.join(", ")
            )
            .into());
        }
        let (lo, hi) = prx_hooks::config::HookLimits::range(k);
        let v: u64 = v
            .parse()
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| format!("--hook-limit {kv:?}: {k} must be an integer in {lo}..={hi}"))?;
        limits.hook_limits.set(k, v);
    }
    Ok(limits)
}

/// `--payload-dir DIR`, resolved once (symlinks followed here, never again): a directory that
/// no other user can swap entries in, as hooks trust the files in it. DIR and every directory
/// above it must be owned by this user or root, and not writable by group or others unless
/// sticky (as /tmp: others may then add entries but not rename or remove ours).
fn payload_dir(dir: &std::path::Path) -> Result<PathBuf, BoxError> {
    use std::os::unix::fs::MetadataExt;
    let at =
        |what: String| -> BoxError { format!("--payload-dir {}: {what}", dir.display()).into() };
    let real = std::fs::canonicalize(dir).map_err(|e| at(e.to_string()))?;
    let m = std::fs::metadata(&real).map_err(|e| at(e.to_string()))?;
    if !m.is_dir() {
        return Err(at("not a directory".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    for d in real.ancestors() {
        let m = std::fs::metadata(d).map_err(|e| at(format!("{}: {e}", d.display())))?;
        let mode = m.mode();
        let whose = if d == real {
            String::new()
        } else {
            format!(" (its parent {})", d.display())
        };
        if m.uid() != me && m.uid() != 0 {
            return Err(at(format!(
                "owned by uid {}{whose}, not by this user or root: its owner could swap the payload files hooks read",
                m.uid()
            )));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(at(format!(
                "writable by other users without the sticky bit{whose} (mode {:o}): they could swap the payload files hooks read; use a directory only you can write, or a sticky one as /tmp",
                mode & 0o7777
            )));
        }
    }
    Ok(real)
}
