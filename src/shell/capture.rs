//! One contained process run on the calling thread, its stdout captured (command policies):
//! the hooks' spawn and containment, waited for by a small `poll(2)` loop of its own, so a
//! decision never waits on a hook's runner, queue or slot.
//!
//! The process gets the payload on stdin, its stdout is read up to a byte limit, the last
//! [`STDERR_TAIL`] bytes of stderr are kept. When its leader exits, the rest of its process
//! group is killed (a guard answers; it leaves nothing running). At the deadline, when stdout
//! passes its limit, or when the caller cancels, the whole process tree is stopped and killed
//! (`tree::kill_trees`). Every child is reaped before this returns.

use super::env::ChildEnv;
use super::reactor::STDERR_TAIL;
pub(crate) use super::reactor::{eventfd, signal_eventfd};
use super::spawn;
pub(crate) use super::spawn::SpawnOpts;
use crate::config::Action;
use nix::libc;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// How a captured run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The leader exited with this code.
    Exited(i32),
    /// The leader was killed by this signal (not by us).
    Signaled(i32),
    /// The deadline passed; the tree was killed.
    TimedOut,
    /// Stdout passed the byte limit; the tree was killed.
    TooLarge,
    /// The caller cancelled (another source decided first); the tree was killed.
    Cancelled,
    /// It did not start: why.
    SpawnFailed(String),
}

/// What a captured run left.
#[derive(Debug)]
pub(crate) struct Captured {
    pub(crate) ended: Ended,
    pub(crate) stdout: Vec<u8>,
    /// The last [`STDERR_TAIL`] bytes.
    pub(crate) stderr: Vec<u8>,
}

/// What one run needs.
pub(crate) struct Run<'a> {
    pub(crate) action: &'a Action,
    pub(crate) env: &'a ChildEnv,
    pub(crate) opts: &'a SpawnOpts,
    pub(crate) stdin: &'a [u8],
    pub(crate) deadline: Instant,
    pub(crate) max_stdout: usize,
    /// An eventfd the caller signals to cancel the run (`None`: never cancelled).
    pub(crate) cancel: Option<RawFd>,
    /// The process's rlimits (the hooks' defaults: [`ShellLimits::guard_rlimits`](super::ShellLimits::guard_rlimits)).
    pub(crate) rlimits: &'a [super::spawn::Rlimit],
}

/// Runs `run.action` to its end, its deadline, its stdout limit or a cancel.
pub(crate) fn run(run: &Run) -> Captured {
    let req = spawn::Request {
        env: run.env,
        rlimits: run.rlimits,
        cgroup_procs: None,
        capture_stdout: true,
    };
    let mut sp = match spawn::spawn(run.action, &req, run.opts) {
        Ok(sp) => sp,
        Err(e) => {
            return Captured {
                ended: Ended::SpawnFailed(e),
                stdout: Vec::new(),
                stderr: Vec::new(),
            };
        }
    };
    let pid = sp.pid as i32;
    let mut out = Vec::new();
    let mut err = Tail::default();
    let mut fed = 0usize;
    let mut stdin = sp.stdin.take();
    if run.stdin.is_empty() {
        stdin = None;
    }
    let mut stdout = sp.stdout.take();
    let mut stderr = sp.stderr.take();
    let ended = loop {
        if let Some(w) = &mut stdin {
            match w.write(&run.stdin[fed..]) {
                Ok(n) => fed += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // EPIPE: it does not read stdin; what it was given is all it gets.
                Err(_) => fed = run.stdin.len(),
            }
            if fed >= run.stdin.len() {
                stdin = None;
            }
        }
        if let Some(r) = &mut stdout
            && drain(r, |b| out.extend_from_slice(b))
        {
            stdout = None;
        }
        if out.len() > run.max_stdout {
            break Ended::TooLarge;
        }
        if let Some(r) = &mut stderr
            && drain(r, |b| err.push(b))
        {
            stderr = None;
        }
        if exited(pid, sp.pidfd.as_ref().map(AsRawFd::as_raw_fd)) {
            // What it wrote before it exited is in the pipes: read it, without waiting on
            // anything it left holding them.
            if let Some(r) = &mut stdout {
                drain(r, |b| out.extend_from_slice(b));
            }
            if let Some(r) = &mut stderr {
                drain(r, |b| err.push(b));
            }
            if out.len() > run.max_stdout {
                break Ended::TooLarge;
            }
            // Still a zombie, so its group id is still its own: nothing it started outlives it.
            signal(-pid, libc::SIGKILL);
            break match reap(pid) {
                Some(s) if libc::WIFSIGNALED(s) => Ended::Signaled(libc::WTERMSIG(s)),
                Some(s) => Ended::Exited(libc::WEXITSTATUS(s)),
                None => Ended::Exited(-1),
            };
        }
        let now = Instant::now();
        if now >= run.deadline {
            break Ended::TimedOut;
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(5);
        let mut watch = |fd: RawFd, events: libc::c_short| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            })
        };
        let tick = match &sp.pidfd {
            Some(fd) => {
                watch(fd.as_raw_fd(), libc::POLLIN);
                run.deadline - now
            }
            // No pidfd (kernels before 5.3): the exit is checked on a short tick.
            None => (run.deadline - now).min(Duration::from_millis(2)),
        };
        if let Some(r) = &stdout {
            watch(r.as_raw_fd(), libc::POLLIN);
        }
        if let Some(r) = &stderr {
            watch(r.as_raw_fd(), libc::POLLIN);
        }
        if let Some(w) = &stdin {
            watch(w.as_raw_fd(), libc::POLLOUT);
        }
        if let Some(c) = run.cancel {
            watch(c, libc::POLLIN);
        }
        let ms = tick.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, ms) };
        if let Some(c) = run.cancel
            && fds.last().is_some_and(|p| p.fd == c && p.revents != 0)
        {
            break Ended::Cancelled;
        }
    };
    if matches!(ended, Ended::TimedOut | Ended::TooLarge | Ended::Cancelled) {
        super::tree::kill_trees(&[pid]);
        reap(pid);
    }
    out.truncate(run.max_stdout + 1);
    Captured {
        ended,
        stdout: out,
        stderr: err.0,
    }
}

/// At most this much is read from one pipe per round, so a process writing as fast as we
/// read cannot keep us from its deadline.
const ROUND_BYTES: usize = 64 * 1024;

/// Reads what `r` has now, at most [`ROUND_BYTES`]; `true` at EOF (or an error other than
/// "nothing yet").
fn drain(r: &mut std::fs::File, mut sink: impl FnMut(&[u8])) -> bool {
    let mut buf = [0u8; 16 * 1024];
    let mut read = 0;
    loop {
        if read >= ROUND_BYTES {
            return false;
        }
        match r.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                read += n;
                sink(&buf[..n]);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// The last [`STDERR_TAIL`] bytes written.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
        if self.0.len() > STDERR_TAIL {
            let cut = self.0.len() - STDERR_TAIL;
            self.0.drain(..cut);
        }
    }
}

/// Whether our child `pid` has exited (left unreaped).
fn exited(pid: i32, pidfd: Option<RawFd>) -> bool {
    if let Some(fd) = pidfd {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd, without waiting.
        return unsafe { libc::poll(&mut p, 1, 0) } == 1;
    }
    // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid(2).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid(2) on our own unreaped child; WNOWAIT leaves it unreaped.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is set by waitid when a child was found, else still 0.
    r == 0 && unsafe { info.si_pid() } == pid
}

/// Reaps our child `pid` (blocking: it has exited or was SIGKILLed); its wait status.
fn reap(pid: i32) -> Option<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own unreaped child, with a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            super::supervisor::unregister(pid);
            return Some(status);
        }
        if r < 0 && std::io::Error::last_os_error().kind() == ErrorKind::Interrupted {
            continue;
        }
        super::supervisor::unregister(pid);
        return None;
    }
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) with integer arguments, on the group of our own unreaped child.
    unsafe {
        libc::kill(pid, sig);
    }
}
