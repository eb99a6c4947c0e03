//! Waiting for hook processes: one `poll(2)` loop over every running process.
//!
//! Per process it watches a pidfd (readable when the process has exited — process exit, never
//! pipe EOF, decides completion), its stderr pipe (read nonblocking into a 16 KiB tail) and, with
//! `stdin_json`, its stdin pipe (written nonblocking as the child reads). The nearest deadline
//! bounds the poll; a process past it gets SIGKILL for its whole process group, then is reaped
//! when its pidfd says it has exited. Reaping is `waitpid(pid)` for that pid only: never
//! `waitpid(-1)` and never a SIGCHLD handler, so the host's own children are left alone.
//!
//! Once the leader has exited the process is finished: what is buffered on stderr is read
//! (bounded), both pipes are closed and the outcome is reported. A grandchild that keeps a pipe
//! open delays nothing, and whatever a leader left running in the background is not touched.

use super::outcome::OutcomeKind;
use super::spawn::Spawned;
use nix::libc;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{ChildStdin, ExitStatus};
use std::time::{Duration, Instant, SystemTime};

/// The stderr tail kept per process.
pub const STDERR_TAIL: usize = 16 * 1024;

/// How long a process without a pidfd may go unchecked.
const NO_PIDFD_TICK: Duration = Duration::from_millis(5);

/// At most this much stderr is read from one process per poll round, so a child flooding
/// stderr cannot keep the runner from its other processes, deadlines and spawns.
const STDERR_PER_ROUND: usize = 64 * 1024;

/// At most this much more stderr is read after the leader exits (a grandchild writing forever
/// must not keep us reading).
const FINAL_STDERR: usize = 64 * 1024;

/// Why we killed a process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kill {
    Timeout,
    Shutdown,
}

/// A running hook process, owned by a reactor, with whatever the owner attached to it.
pub(crate) struct Proc<T> {
    sp: Spawned,
    stdin: Option<Feed>,
    tail: Tail,
    deadline: Instant,
    timeout: Duration,
    kill: Option<Kill>,
    pub(crate) tag: T,
}

/// The payload still to be written to a child's stdin.
struct Feed {
    pipe: ChildStdin,
    data: crate::bus::Message,
    written: usize,
}

impl<T> Proc<T> {
    /// `data` is written to stdin if the process was started with a stdin pipe.
    pub(crate) fn new(
        mut sp: Spawned,
        timeout: Duration,
        data: crate::bus::Message,
        tag: T,
    ) -> Proc<T> {
        let stdin = sp.stdin.take().map(|pipe| Feed {
            pipe,
            data,
            written: 0,
        });
        Proc {
            deadline: sp.started + timeout,
            sp,
            stdin,
            tail: Tail::default(),
            timeout,
            kill: None,
            tag,
        }
    }

    /// SIGKILL to the whole process group, and to the leader itself in case it left the group
    /// (setsid/setpgid). Safe against pid reuse: the leader is not reaped before this returns,
    /// so its pid (and with it the group id) still belongs to it.
    fn kill(&mut self, why: Kill) {
        if self.kill.is_none() {
            self.kill = Some(why);
        }
        let pid = Pid::from_raw(self.sp.pid as i32);
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
    }

    /// Reads what stderr holds now; `false` once it is closed or broken.
    fn read_stderr(&mut self, budget: usize) -> bool {
        let Some(pipe) = self.sp.stderr.as_mut() else {
            return false;
        };
        let mut buf = [0u8; 8192];
        let mut read = 0;
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => {
                    self.tail.push(&buf[..n]);
                    read += n;
                    if read >= budget {
                        return true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// Writes as much of the payload as the pipe takes; `false` once done or broken (EPIPE: the
    /// child closed stdin or exited — fine).
    fn feed_stdin(&mut self) -> bool {
        let Some(feed) = self.stdin.as_mut() else {
            return false;
        };
        let data = feed.data.json();
        while feed.written < data.len() {
            match feed.pipe.write(&data[feed.written..]) {
                Ok(n) => feed.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    if e.kind() == ErrorKind::BrokenPipe {
                        consume_sigpipe();
                    }
                    return false;
                }
            }
        }
        false
    }

    /// Reaps the leader if it has exited (with `block`, waits for it): `Some(status)`, where
    /// `status` is `None` if the exit status was lost; `None` while it still runs.
    fn try_reap(&mut self, block: bool) -> Option<Option<ExitStatus>> {
        let status = if block {
            self.sp.child.wait().map(Some)
        } else {
            self.sp.child.try_wait()
        };
        match status {
            Ok(Some(s)) => Some(Some(s)),
            Ok(None) => None,
            // ECHILD: someone else reaped it (a host that sets SIGCHLD to SIG_IGN, or calls
            // waitpid(-1)); the process is gone but its status is lost.
            Err(_) => Some(None),
        }
    }

    /// The outcome of a reaped process.
    fn into_finished(mut self, status: Option<ExitStatus>) -> Finished<T> {
        let duration = self.sp.started.elapsed();
        self.stdin = None;
        self.read_stderr(FINAL_STDERR);
        self.sp.stderr = None;
        let kind = match (self.kill, status) {
            (Some(Kill::Timeout), _) => OutcomeKind::TimedOut {
                after_ms: self.timeout.as_millis() as u64,
            },
            (Some(Kill::Shutdown), _) => OutcomeKind::Killed,
            (None, Some(s)) => match (s.code(), s.signal()) {
                (Some(0), _) => OutcomeKind::Ok,
                (Some(code), _) => OutcomeKind::Exit { code },
                (None, Some(signal)) => OutcomeKind::Signal { signal },
                (None, None) => OutcomeKind::Exit { code: -1 },
            },
            (None, None) => {
                self.tail
                    .push(b"\n[prx-hooks: exit status lost: the process was reaped elsewhere]");
                OutcomeKind::Exit { code: -1 }
            }
        };
        Finished {
            kind,
            duration,
            pid: self.sp.pid,
            started_at: self.sp.started_at,
            stderr_tail: self.tail.into_string(),
            tag: self.tag,
        }
    }
}

/// A reaped process.
pub(crate) struct Finished<T> {
    pub(crate) kind: OutcomeKind,
    pub(crate) duration: Duration,
    pub(crate) pid: u32,
    pub(crate) started_at: SystemTime,
    pub(crate) stderr_tail: String,
    pub(crate) tag: T,
}

/// The last [`STDERR_TAIL`] bytes written.
#[derive(Default)]
pub(crate) struct Tail {
    buf: Vec<u8>,
    cut: bool,
}

impl Tail {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= STDERR_TAIL {
            self.buf.clear();
            self.buf
                .extend_from_slice(&bytes[bytes.len() - STDERR_TAIL..]);
            self.cut = true;
            return;
        }
        let over = (self.buf.len() + bytes.len()).saturating_sub(STDERR_TAIL);
        if over > 0 {
            self.buf.drain(..over);
            self.cut = true;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Decoded with replacement characters; a character cut in half at the front is dropped.
    pub(crate) fn into_string(self) -> String {
        let mut bytes = &self.buf[..];
        if self.cut {
            let skip = bytes
                .iter()
                .take(3)
                .take_while(|&&b| b & 0xC0 == 0x80)
                .count();
            bytes = &bytes[skip..];
        }
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// What a poll slot belongs to.
#[derive(Clone, Copy)]
enum Slot {
    Wake,
    Exit(usize),
    Stderr(usize),
    Stdin(usize),
}

/// Every running process of one owner, and the poll set over them.
pub(crate) struct Reactor<T> {
    procs: Vec<Proc<T>>,
    fds: Vec<libc::pollfd>,
    slots: Vec<Slot>,
    exited: Vec<usize>,
}

impl<T> Default for Reactor<T> {
    fn default() -> Self {
        Reactor {
            procs: Vec::new(),
            fds: Vec::new(),
            slots: Vec::new(),
            exited: Vec::new(),
        }
    }
}

impl<T> Reactor<T> {
    pub(crate) fn add(&mut self, mut p: Proc<T>) {
        // Most payloads fit the pipe buffer: write them now rather than after a poll round.
        if !p.feed_stdin() {
            p.stdin = None;
        }
        self.procs.push(p);
    }

    pub(crate) fn len(&self) -> usize {
        self.procs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// SIGKILL to every group (shutdown).
    pub(crate) fn kill_all(&mut self) {
        for p in &mut self.procs {
            p.kill(Kill::Shutdown);
        }
    }

    /// SIGKILL to the groups whose tag `cancelled` says so (a test run whose client left).
    pub(crate) fn kill_where(&mut self, cancelled: impl Fn(&T) -> bool) {
        for p in &mut self.procs {
            if p.kill.is_none() && cancelled(&p.tag) {
                p.kill(Kill::Shutdown);
            }
        }
    }

    /// Takes every remaining process out, unreaped (see the reaper's last resort).
    pub(crate) fn take_all(&mut self) -> Vec<Proc<T>> {
        std::mem::take(&mut self.procs)
    }

    /// One round: kills overdue groups, polls (until the nearest deadline, `cap`, or an event
    /// on `wake`), feeds stdin, reads stderr, and appends every reaped process to `done`.
    /// Returns whether `wake` fired (it is drained).
    pub(crate) fn turn(
        &mut self,
        wake: Option<RawFd>,
        cap: Option<Duration>,
        done: &mut Vec<Finished<T>>,
    ) -> bool {
        let now = Instant::now();
        let mut wait = cap;
        let mut min = |d: Duration| wait = Some(wait.map_or(d, |w| w.min(d)));
        for p in &mut self.procs {
            if p.kill.is_none() {
                if now >= p.deadline {
                    p.kill(Kill::Timeout);
                } else {
                    min(p.deadline - now);
                }
            }
            if p.sp.pidfd.is_none() {
                min(NO_PIDFD_TICK);
            }
        }

        self.fds.clear();
        self.slots.clear();
        let mut add = |fd: RawFd, events: libc::c_short, slot: Slot| {
            self.fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            self.slots.push(slot);
        };
        if let Some(fd) = wake {
            add(fd, libc::POLLIN, Slot::Wake);
        }
        for (i, p) in self.procs.iter().enumerate() {
            if let Some(fd) = &p.sp.pidfd {
                add(fd.as_raw_fd(), libc::POLLIN, Slot::Exit(i));
            }
            if let Some(pipe) = &p.sp.stderr {
                add(pipe.as_raw_fd(), libc::POLLIN, Slot::Stderr(i));
            }
            if let Some(feed) = &p.stdin {
                add(feed.pipe.as_raw_fd(), libc::POLLOUT, Slot::Stdin(i));
            }
        }
        // Round up so a deadline 0.3 ms away does not become a busy loop of zero timeouts.
        let timeout_ms = match wait {
            None => -1,
            Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int,
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
        let n = unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as _, timeout_ms) };

        let mut woken = false;
        self.exited.clear();
        if n > 0 {
            for k in 0..self.fds.len() {
                let revents = self.fds[k].revents;
                if revents == 0 {
                    continue;
                }
                match self.slots[k] {
                    Slot::Wake => {
                        woken = true;
                        drain_eventfd(self.fds[k].fd);
                    }
                    Slot::Exit(i) => self.exited.push(i),
                    Slot::Stderr(i) => {
                        if !self.procs[i].read_stderr(STDERR_PER_ROUND) {
                            self.procs[i].sp.stderr = None;
                        }
                    }
                    Slot::Stdin(i) => {
                        if !self.procs[i].feed_stdin() {
                            self.procs[i].stdin = None;
                        }
                    }
                }
            }
        }
        for (i, p) in self.procs.iter().enumerate() {
            if p.sp.pidfd.is_none() {
                self.exited.push(i);
            }
        }
        // From the back: removing index i disturbs only indices above it, already handled.
        self.exited.sort_unstable();
        self.exited.dedup();
        while let Some(i) = self.exited.pop() {
            // Not yet reaped: no pidfd and still running, or a spurious wake-up.
            if let Some(status) = self.procs[i].try_reap(false) {
                done.push(self.procs.swap_remove(i).into_finished(status));
            }
        }
        woken
    }
}

/// Reaps `p`, waiting for it (used after SIGKILL, when the reactor gives up polling).
pub(crate) fn finish_blocking<T>(mut p: Proc<T>) -> Finished<T> {
    let status = p.try_reap(true).unwrap_or(None);
    p.into_finished(status)
}

/// An eventfd for waking a reactor from another thread.
pub(crate) fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with integer arguments; returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

pub(crate) fn signal_eventfd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to an eventfd we own. A full counter (EAGAIN) means
    // a wake-up is already pending, which is all we want.
    unsafe {
        libc::write(fd, (&one as *const u64).cast(), 8);
    }
}

fn drain_eventfd(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a local from an eventfd we own (nonblocking).
    unsafe {
        libc::read(fd, (&mut v as *mut u64).cast(), 8);
    }
}

/// Blocks SIGPIPE on the calling thread (a reactor thread we own): a write to a pipe whose
/// reader is gone then fails with EPIPE instead of killing a host that did not ignore SIGPIPE.
pub(crate) fn block_sigpipe() {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(Signal::SIGPIPE);
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&set),
        None,
    );
}

/// Takes a SIGPIPE that an EPIPE left pending on this thread (only when it is blocked here and
/// not ignored process-wide), so it can never be delivered later.
fn consume_sigpipe() {
    // SAFETY: sigset operations on a local set, and sigtimedwait with a zero timeout.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        let mut pending: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1 {
            let zero = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::default();
        t.push(b"hello ");
        t.push(b"world");
        assert_eq!(t.into_string(), "hello world");

        let mut t = Tail::default();
        let big = vec![b'a'; STDERR_TAIL + 10];
        t.push(&big);
        t.push(b"END");
        let s = t.into_string();
        assert_eq!(s.len(), STDERR_TAIL);
        assert!(s.ends_with("aEND"));

        // A multi-byte character cut at the front is dropped, not turned into U+FFFD.
        let mut t = Tail::default();
        let mut v = "é".repeat(STDERR_TAIL / 2).into_bytes();
        v.push(b'x');
        t.push(&v);
        let s = t.into_string();
        assert!(!s.contains('\u{fffd}') && s.ends_with('x'), "{}", &s[..8]);
    }
}
