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
/// crashing hook does not write a core file into the workspace) and `--payload-dir` (which must
/// be a directory).
pub(super) fn shell_limits(args: &ContainArgs) -> Result<prx_hooks::shell::ShellLimits, BoxError> {
    let mut limits = prx_hooks::shell::ShellLimits::default();
    if let Some(dir) = &args.payload_dir {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => limits.tmp_dir = Some(dir.clone()),
            Ok(_) => {
                return Err(format!("--payload-dir {}: not a directory", dir.display()).into());
            }
            Err(e) => return Err(format!("--payload-dir {}: {e}", dir.display()).into()),
        }
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
