//! Starting one hook process.
//!
//! `std::process::Command` on its posix_spawn path: the program is always an absolute path (a
//! bare name with `PATH` in the child environment would make std fall back to fork+exec), the
//! process group is set with `process_group(0)` (POSIX_SPAWN_SETPGROUP) and there is no
//! `pre_exec` closure — unless rlimits or a cgroup are configured, which need code between fork
//! and exec and are paid for only by those who ask.

use super::env::{SANITIZED_PATH, action_entry_allowed};
use super::payload::{EventRun, MAX_ENV_PAYLOAD};
use crate::config::Action;
use nix::libc;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// Optional resource limits for hook processes (`setrlimit`, soft = hard = the value). Applied
/// between fork and exec, so configuring any of them moves spawning off std's posix_spawn path
/// onto fork+exec — slower in a large parent (ARCHITECTURE.md § Performance targets). Unset fields are left alone.
/// Lowering a hard limit is always allowed; raising one above the parent's needs privileges,
/// and a refused limit fails the spawn (counted as `spawn_failed`, never run unlimited).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// RLIMIT_CPU, seconds of CPU time (the kernel sends SIGXCPU, then SIGKILL).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_AS, bytes of address space.
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_NOFILE, open file descriptors.
    pub open_files: Option<u64>,
    /// RLIMIT_NPROC, processes of the user (not enforced for root).
    pub processes: Option<u64>,
    /// RLIMIT_FSIZE, bytes of the largest file written.
    pub file_size_bytes: Option<u64>,
    /// RLIMIT_CORE, bytes of core dump (0 disables core dumps).
    pub core_bytes: Option<u64>,
}

impl Rlimits {
    fn list(&self) -> Vec<(nix::sys::resource::Resource, u64)> {
        use nix::sys::resource::Resource as R;
        [
            (R::RLIMIT_CPU, self.cpu_seconds),
            (R::RLIMIT_AS, self.address_space_bytes),
            (R::RLIMIT_NOFILE, self.open_files),
            (R::RLIMIT_NPROC, self.processes),
            (R::RLIMIT_FSIZE, self.file_size_bytes),
            (R::RLIMIT_CORE, self.core_bytes),
        ]
        .into_iter()
        .filter_map(|(r, v)| v.map(|v| (r, v)))
        .collect()
    }
}

/// What every spawn of one sink shares.
pub(crate) struct SpawnOpts {
    pub(crate) rlimits: Vec<(nix::sys::resource::Resource, u64)>,
    /// `<cgroup>/cgroup.procs`, opened once for writing (or why it could not be).
    pub(crate) cgroup: Option<Result<Arc<OwnedFd>, String>>,
}

impl SpawnOpts {
    pub(crate) fn new(rlimits: Option<&Rlimits>, cgroup: Option<&PathBuf>) -> SpawnOpts {
        let cgroup = cgroup.map(|dir| {
            let procs = dir.join("cgroup.procs");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&procs)
                .map(|f| Arc::new(OwnedFd::from(f)))
                .map_err(|e| format!("cgroup {}: {e}", procs.display()))
        });
        if let Some(Err(e)) = &cgroup {
            tracing::error!("{e}; every hook will fail to spawn until this is fixed");
        }
        SpawnOpts {
            rlimits: rlimits.map(Rlimits::list).unwrap_or_default(),
            cgroup,
        }
    }
}

/// A hook process that has started: its handles, its pipes and its payload.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    /// `None` when the kernel has no `pidfd_open` (before 5.3) or forbids it; the reactor then
    /// polls `try_wait` on a short tick instead.
    pub(crate) pidfd: Option<OwnedFd>,
    pub(crate) stdin: Option<ChildStdin>,
    pub(crate) stderr: Option<ChildStderr>,
    pub(crate) started: Instant,
    pub(crate) started_at: SystemTime,
}

/// Starts `action` for `run`. Errors are the `spawn failed: …` reason.
pub(crate) fn spawn(action: &Action, run: &EventRun, opts: &SpawnOpts) -> Result<Spawned, String> {
    let program = action.program.as_ref().map_err(Clone::clone)?;
    let payload_file = run.payload_file().map_err(str::to_string)?;
    let strings = run.strings();
    let json = run.msg.json_str();

    let mut cmd = Command::new(program);
    cmd.args(&action.args)
        .env_clear()
        .envs(run.base_env.iter().map(|(k, v)| (k, v)))
        .env("PATH", SANITIZED_PATH)
        .env("ZERO_HOOK_EVENT", action.event.name())
        .env("ZERO_HOOK_SESSION", &strings.session)
        .env("ZERO_HOOK_AGENT", &strings.agent)
        .env("ZERO_HOOK_SEQ", &strings.seq)
        .env("ZERO_HOOK_ID", &action.id)
        .env("ZERO_HOOK_TIMESTAMP", &strings.timestamp)
        .env("ZERO_HOOK_PAYLOAD_FILE", payload_file);
    if json.len() <= MAX_ENV_PAYLOAD {
        cmd.env("ZERO_HOOK_PAYLOAD", json);
    } else {
        cmd.env("ZERO_HOOK_PAYLOAD_TRUNCATED", "1");
    }
    for (k, v) in &action.env {
        if action_entry_allowed(k, v) {
            cmd.env(k, v);
        } else {
            tracing::warn!(hook = %action.id, "env entry {k:?} refused at spawn");
        }
    }
    cmd.current_dir(&action.cwd)
        .process_group(0)
        .stdin(if action.stdin_json {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if !opts.rlimits.is_empty() || opts.cgroup.is_some() {
        install_pre_exec(&mut cmd, opts)?;
    }

    let started = Instant::now();
    let started_at = SystemTime::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let pid = child.id();
    let pidfd = pidfd_open(pid);
    let stdin = child.stdin.take();
    let stderr = child.stderr.take();
    // Our ends only: the child's ends are separate open file descriptions.
    if let Some(p) = &stdin {
        set_nonblocking(p.as_raw_fd());
    }
    if let Some(p) = &stderr {
        set_nonblocking(p.as_raw_fd());
    }
    Ok(Spawned {
        child,
        pid,
        pidfd,
        stdin,
        stderr,
        started,
        started_at,
    })
}

/// Runs between fork and exec: only async-signal-safe calls (setrlimit, write), no allocation.
fn install_pre_exec(cmd: &mut Command, opts: &SpawnOpts) -> Result<(), String> {
    let limits = opts.rlimits.clone();
    let cgroup: Option<Arc<OwnedFd>> = match &opts.cgroup {
        None => None,
        Some(Ok(fd)) => Some(fd.clone()),
        Some(Err(e)) => return Err(e.clone()),
    };
    let closure = move || {
        for &(resource, value) in &limits {
            nix::sys::resource::setrlimit(resource, value, value)?;
        }
        if let Some(fd) = &cgroup {
            // Writing "0" to cgroup.procs moves the writing process: the hook is in the cgroup
            // before it execs, so nothing it forks can escape.
            // SAFETY: a plain write(2) of a static byte to a file descriptor we own.
            let n = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            if n != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the closure only calls async-signal-safe functions and allocates nothing.
    unsafe {
        cmd.pre_exec(closure);
    }
    Ok(())
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd (O_CLOEXEC) or -1. The
    // child is ours and unreaped, so its pid cannot have been reused.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "pidfd_open failed ({}); hook processes are polled every few ms instead",
                std::io::Error::last_os_error()
            )
        });
        return None;
    }
    // SAFETY: a fresh fd nobody else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub(crate) fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on an fd we own, with integer arguments.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}
