//! Waiting for hook processes: one `poll(2)` loop over every running process.
//!
//! Per process it watches a pidfd (readable when the process has exited — process exit, never
//! pipe EOF, decides completion), its stderr pipe (read nonblocking into a 16 KiB tail) and, with
//! `stdin_json`, its stdin pipe (written nonblocking as the child reads). The nearest deadline
//! bounds the poll. Reaping is `waitpid(pid)` for that pid only: never `waitpid(-1)` and never a
//! SIGCHLD handler, so the host's own children are left alone.
//!
//! **Killing** (at the timeout, at shutdown): a process with a cgroup gets `cgroup.kill`, which
//! takes everything it started; without one, its whole tree is stopped and killed
//! ([`super::tree`]: the process group, and `setsid` descendants found by parentage). The
//! leader is never reaped before that, so its pid (and group id) cannot have been reused.
//!
//! Once the leader has exited the run is finished: what is buffered on stderr is read
//! (bounded), both pipes are closed and the outcome is reported. A grandchild that keeps a pipe
//! open delays nothing. What the leader left running is, with a cgroup, killed at the run's
//! deadline (its cgroup *lingers* until then, and is removed once empty); without one it is not
//! attributable any more (see `supervisor` for what the CLI does about it).

use super::cgroup::RunCgroup;
use super::outcome::OutcomeKind;
use super::spawn::Spawned;
use nix::libc;
use nix::sys::signal::Signal;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

/// The stderr tail kept per process.
pub const STDERR_TAIL: usize = 16 * 1024;

/// How long a process without a pidfd may go unchecked.
const NO_PIDFD_TICK: Duration = Duration::from_millis(5);

/// How often a lingering cgroup (leader gone, processes left) is checked for being empty.
const LINGER_TICK: Duration = Duration::from_millis(50);

/// How often a killed cgroup is checked for being empty.
const KILLED_TICK: Duration = Duration::from_millis(5);

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
    /// The run's cgroup (None: no cgroups in use).
    cgroup: Option<RunCgroup>,
    /// The tree has been walked and killed once; later kills only repeat SIGKILL.
    tree_killed: bool,
    pub(crate) tag: T,
}

/// The payload still to be written to a child's stdin.
struct Feed {
    pipe: File,
    data: crate::bus::Message,
    written: usize,
}

impl<T> Proc<T> {
    /// `data` is written to stdin if the process was started with a stdin pipe.
    pub(crate) fn new(
        mut sp: Spawned,
        timeout: Duration,
        data: crate::bus::Message,
        cgroup: Option<RunCgroup>,
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
            cgroup,
            tree_killed: false,
            tag,
        }
    }

    fn pid(&self) -> i32 {
        self.sp.pid as i32
    }

    /// Marks the process killed (first reason wins) and kills what only it can: its cgroup, or
    /// — when `tree` is false, because the caller walks trees itself — nothing more.
    fn mark_killed(&mut self, why: Kill) {
        if self.kill.is_none() {
            self.kill = Some(why);
        }
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
    }

    /// Whether the leader has exited (its pidfd is readable; without a pidfd, a `waitid`
    /// that peeks without reaping). It stays unreaped either way.
    fn has_exited(&self) -> bool {
        match &self.sp.pidfd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll(2) on one valid pollfd, without waiting.
                unsafe { libc::poll(&mut p, 1, 0) == 1 }
            }
            None => {
                // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid(2).
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: waitid(2) on our own unreaped child; WNOWAIT leaves it unreaped.
                let r = unsafe {
                    libc::waitid(
                        libc::P_PID,
                        self.pid() as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                    )
                };
                // SAFETY: si_pid is set by waitid when a child was found, else still 0.
                r == 0 && unsafe { info.si_pid() } != 0
            }
        }
    }

    /// Kills the process and everything it started: see the module's documentation. Safe
    /// against pid reuse: the leader is not reaped before this returns.
    fn kill(&mut self, why: Kill) {
        self.mark_killed(why);
        if self.tree_killed || self.cgroup.is_some() {
            signal(self.pid(), Signal::SIGKILL);
        } else {
            super::tree::kill_trees(&[self.pid()]);
            self.tree_killed = true;
        }
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
        let flags = if block { 0 } else { libc::WNOHANG };
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own child's pid, with a valid out-pointer.
            let r = unsafe { libc::waitpid(self.pid(), &mut status, flags) };
            if r == self.pid() {
                super::supervisor::unregister(r);
                return Some(Some(ExitStatus::from_raw(status)));
            }
            if r == 0 {
                return None;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // ECHILD: someone else reaped it (a host that sets SIGCHLD to SIG_IGN, or
                // calls waitpid(-1)); the process is gone but its status is lost.
                _ => {
                    super::supervisor::unregister(self.pid());
                    return Some(None);
                }
            }
        }
    }

    /// The outcome of a reaped process, and its cgroup if it has one.
    fn into_finished(mut self, status: Option<ExitStatus>) -> (Finished<T>, Option<Linger>) {
        let linger = self.cgroup.take().map(|cg| Linger {
            cg,
            // Killed: gone in milliseconds. Exited: what it left may live to its deadline.
            deadline: if self.kill.is_some() {
                Instant::now()
            } else {
                self.deadline
            },
            killed: self.kill.is_some(),
            checked: None,
        });
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
        let f = Finished {
            kind,
            duration,
            pid: self.sp.pid,
            started_at: self.sp.started_at,
            stderr_tail: self.tail.into_string(),
            tag: self.tag,
        };
        (f, linger)
    }
}

fn signal(pid: i32, sig: Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

/// The cgroup of a finished run that may still hold processes.
pub(crate) struct Linger {
    cg: RunCgroup,
    /// When what is left gets `cgroup.kill`.
    deadline: Instant,
    killed: bool,
    /// When it was last looked at.
    checked: Option<Instant>,
}

impl Linger {
    /// Kills it if due, and removes it once empty: `true` when it is gone.
    fn tend(&mut self, now: Instant, force: bool) -> bool {
        if !self.killed && (force || now >= self.deadline) {
            self.cg.kill();
            self.killed = true;
        }
        let tick = if self.killed {
            KILLED_TICK
        } else {
            LINGER_TICK
        };
        if self.checked.is_some_and(|c| now < c + tick) && !force {
            return false;
        }
        self.checked = Some(now);
        !self.cg.populated() && self.cg.remove()
    }

    /// How long until it needs looking at again.
    fn next(&self, now: Instant) -> Duration {
        let tick = if self.killed {
            KILLED_TICK
        } else {
            LINGER_TICK
        };
        let check = self.checked.map_or(now, |c| c + tick);
        let due = if self.killed {
            check
        } else {
            check.min(self.deadline)
        };
        due.saturating_duration_since(now)
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
    /// Cgroups of finished runs that may still hold processes.
    lingering: Vec<Linger>,
    fds: Vec<libc::pollfd>,
    slots: Vec<Slot>,
    exited: Vec<usize>,
}

impl<T> Default for Reactor<T> {
    fn default() -> Self {
        Reactor {
            procs: Vec::new(),
            lingering: Vec::new(),
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

    /// No process running and no cgroup left to empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.procs.is_empty() && self.lingering.is_empty()
    }

    /// Kills every process (each with everything it started) and every lingering cgroup
    /// (shutdown). The trees of processes without a cgroup are walked together, once.
    pub(crate) fn kill_all(&mut self) {
        let mut roots = Vec::new();
        for p in &mut self.procs {
            p.mark_killed(Kill::Shutdown);
            if p.cgroup.is_none() && !p.tree_killed {
                roots.push(p.pid());
                p.tree_killed = true;
            } else {
                signal(p.pid(), Signal::SIGKILL);
            }
        }
        if !roots.is_empty() {
            super::tree::kill_trees(&roots);
        }
        let now = Instant::now();
        self.lingering.retain_mut(|l| !l.tend(now, true));
    }

    /// Kills (with everything they started) the processes whose tag `cancelled` says so: test
    /// runs whose client left.
    pub(crate) fn kill_where(&mut self, cancelled: impl Fn(&T) -> bool) {
        for p in &mut self.procs {
            if p.kill.is_none() && cancelled(&p.tag) {
                p.kill(Kill::Shutdown);
            }
        }
    }

    /// Takes every remaining process out, unreaped (see the runner's last resort), and lets go
    /// of the lingering cgroups (the sink's own cgroup is killed and removed as a whole).
    pub(crate) fn take_all(&mut self) -> Vec<Proc<T>> {
        self.lingering.clear();
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
        let wait = self.deadlines(cap);
        let n = self.poll(wake, wait);
        let woken = self.dispatch(n);
        self.reap(done);
        woken
    }

    /// Kills the groups past their deadline and lets the lingering cgroups go; returns how
    /// long the poll may wait (the nearest deadline, at most `cap`).
    fn deadlines(&mut self, cap: Option<Duration>) -> Option<Duration> {
        let now = Instant::now();
        let mut wait = cap;
        let mut min = |d: Duration| wait = Some(wait.map_or(d, |w| w.min(d)));
        for p in &mut self.procs {
            if p.kill.is_none() {
                if now >= p.deadline {
                    // A late look (the runner was busy) must not turn an exit that happened in
                    // time into a timeout: an exited leader is reaped below, by its status.
                    if !p.has_exited() {
                        p.kill(Kill::Timeout);
                    }
                } else {
                    min(p.deadline - now);
                }
            }
            if p.sp.pidfd.is_none() {
                min(NO_PIDFD_TICK);
            }
        }
        self.lingering.retain_mut(|l| !l.tend(now, false));
        for l in &self.lingering {
            min(l.next(now));
        }
        wait
    }

    /// Polls `wake`, every exit, stderr and stdin pipe for up to `wait`; returns poll's result.
    fn poll(&mut self, wake: Option<RawFd>, wait: Option<Duration>) -> libc::c_int {
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
        unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as _, timeout_ms) }
    }

    /// Handles what the poll (`n` ready) reported: drains `wake`, notes exits, reads stderr,
    /// feeds stdin. Returns whether `wake` fired.
    fn dispatch(&mut self, n: libc::c_int) -> bool {
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
        woken
    }

    /// Reaps every process that exited (and every one without a pidfd that has), appending
    /// it to `done`.
    fn reap(&mut self, done: &mut Vec<Finished<T>>) {
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
                let (f, linger) = self.procs.swap_remove(i).into_finished(status);
                done.push(f);
                self.linger(linger);
            }
        }
    }
}

impl<T> Reactor<T> {
    /// Keeps a finished run's cgroup until it is empty (removed at once if it already is).
    fn linger(&mut self, linger: Option<Linger>) {
        if let Some(mut l) = linger
            && !l.tend(Instant::now(), false)
        {
            self.lingering.push(l);
        }
    }
}

/// The outcome of a process that was SIGKILLed and did not die within the grace period (stuck
/// in uninterruptible sleep): reported as what it is now, and reaped later by `reap_later`.
pub(crate) fn finish_unreaped<T>(p: Proc<T>) -> (Finished<T>, Unreaped) {
    let pid = p.pid();
    let (f, linger) = p.into_finished(None);
    (f, Unreaped { pid, linger })
}

/// A killed process not reaped yet, and its cgroup.
pub(crate) struct Unreaped {
    pid: i32,
    linger: Option<Linger>,
}

impl Unreaped {
    /// Waits for the process and removes its cgroup (on a detached thread: it may take as long
    /// as the kernel keeps it in uninterruptible sleep).
    pub(crate) fn reap(mut self) {
        let mut status = 0;
        // SAFETY: waitpid on our own unreaped child.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        super::supervisor::unregister(self.pid);
        if let Some(l) = self.linger.as_mut() {
            l.tend(Instant::now(), true);
        }
    }
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

    /// A runner that looks late (busy killing trees, spawning a batch) must not count a
    /// process that exited well before its deadline as timed out.
    #[test]
    fn a_process_that_exited_before_a_late_check_is_not_timed_out() {
        use crate::config::Action;
        let dir = tempfile::tempdir().unwrap();
        let action = Action {
            id: "late".into(),
            id_explicit: true,
            event: crate::EventKind::TurnComplete,
            index: 0,
            command: "/bin/true".into(),
            program: Ok("/bin/true".into()),
            args: Vec::new(),
            env: Vec::new(),
            cwd: dir.path().to_path_buf(),
            timeout: Duration::from_millis(100),
            timeout_explicit: true,
            stdin_json: false,
            enabled: true,
            matcher: None,
            max_concurrent: 1,
            limits: Default::default(),
        };
        let env = super::super::env::ChildEnv::from_pairs(&[("PATH", "/usr/bin:/bin")]);
        let req = super::super::spawn::Request {
            env: &env,
            rlimits: &[],
            cgroup_procs: None,
            capture_stdout: false,
        };
        let opts = super::super::spawn::SpawnOpts::new(dir.path()).unwrap();
        let sp = super::super::spawn::spawn(&action, &req, &opts).unwrap();
        let msg = super::super::payload::event_message(&crate::Event::TurnComplete, "a", "s", 0);
        let mut reactor: Reactor<()> = Reactor::default();
        reactor.add(Proc::new(sp, action.timeout, msg, None, ()));
        // /bin/true is long gone; the runner only looks now, past the deadline.
        std::thread::sleep(Duration::from_millis(300));
        let mut done = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        while done.is_empty() && Instant::now() < until {
            reactor.turn(None, Some(Duration::from_millis(50)), &mut done);
        }
        assert_eq!(done.len(), 1);
        assert!(
            matches!(done[0].kind, OutcomeKind::Ok),
            "{:?}",
            done[0].kind
        );
    }

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
