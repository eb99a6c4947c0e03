//! What only a host that owns its whole process may do — the `prx-hooks` CLI, never a library
//! host by default (ARCHITECTURE.md § Shell hooks: containment).
//!
//! * [`Subreaper::start`]: the process becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
//!   whatever a hook leaves behind — a background job, a `setsid` daemon — is reparented to it
//!   instead of init. A thread reaps those orphans as they exit, and
//!   [`Subreaper::kill_orphans`] kills (tree by tree) every one still alive at shutdown.
//!   Reaping orphans means waiting for children the shell backend did not start *as hooks*:
//!   the leaders it did start stay its own to reap (see the registry below), so their exit
//!   statuses are never lost. A host that starts other children of its own must not use this.
//! * [`harden`]: `PR_SET_DUMPABLE 0`, so processes of the same user (hooks included) can no
//!   longer read `/proc/<host>/environ`, `mem`, `maps` or attach a debugger.
//!
//! The registry: every hook leader's pid from its spawn until the shell backend has reaped it.
//! The spawn inserts the pid while holding the registry's lock across the `clone`, so the
//! orphan reaper, which looks a pid up under the same lock, can never take a leader for an
//! orphan. In a host without a subreaper the registry is off and costs one relaxed load per
//! spawn.

use super::tree;
use nix::libc;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

static ACTIVE: AtomicBool = AtomicBool::new(false);
static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    leaders: None,
    spawns: 0,
});
static CHANGED: Condvar = Condvar::new();
static REAPED: AtomicU64 = AtomicU64::new(0);

struct Registry {
    /// Hook leaders not yet reaped by the shell backend.
    leaders: Option<HashSet<libc::pid_t>>,
    /// Spawns so far (the reaper, with no child to wait for, waits for the next one).
    spawns: u64,
}

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held across a spawn's `clone` while the subreaper is active.
pub(crate) struct Registering(Option<MutexGuard<'static, Registry>>);

impl Registering {
    pub(crate) fn begin() -> Registering {
        if ACTIVE.load(Ordering::Acquire) {
            Registering(Some(registry()))
        } else {
            Registering(None)
        }
    }

    /// Records a leader just cloned (`pid > 0`).
    pub(crate) fn insert(mut self, pid: libc::pid_t) {
        if let Some(r) = self.0.as_mut()
            && pid > 0
        {
            r.leaders.get_or_insert_with(HashSet::new).insert(pid);
            r.spawns += 1;
            drop(self);
            CHANGED.notify_all();
        }
    }
}

/// The shell backend has reaped `pid`.
pub(crate) fn unregister(pid: libc::pid_t) {
    if !ACTIVE.load(Ordering::Acquire) {
        return;
    }
    let removed = registry().leaders.as_mut().is_some_and(|l| l.remove(&pid));
    if removed {
        CHANGED.notify_all();
    }
}

/// This process as a child subreaper, with the thread that reaps its orphans.
#[derive(Debug)]
pub struct Subreaper {
    _private: (),
}

impl Subreaper {
    /// Makes this process a child subreaper and starts the orphan reaper. Call it before the
    /// first hook is spawned, in a process whose only children are its hooks (the CLI).
    pub fn start() -> std::io::Result<Subreaper> {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        registry().leaders.get_or_insert_with(HashSet::new);
        ACTIVE.store(true, Ordering::Release);
        std::thread::Builder::new()
            .name("prx-hooks-orphans".into())
            .spawn(reap_orphans)?;
        Ok(Subreaper { _private: () })
    }

    /// Orphans reaped so far.
    pub fn reaped(&self) -> u64 {
        REAPED.load(Ordering::Relaxed)
    }

    /// Kills every descendant still alive that is not a hook leader (call it after the hooks
    /// have shut down: then none is), each with its whole tree, and waits until they have
    /// been reaped or `deadline` passes. Returns how many processes were killed.
    pub fn kill_orphans(&self, deadline: Instant) -> usize {
        // SAFETY: getpid(2) has no preconditions.
        let me = unsafe { libc::getpid() };
        let mut killed = 0;
        loop {
            let orphans: Vec<libc::pid_t> = {
                let reg = registry();
                tree::snapshot()
                    .into_iter()
                    .filter(|e| {
                        e.ppid == me
                            && e.state != b'Z'
                            && !reg.leaders.as_ref().is_some_and(|l| l.contains(&e.pid))
                    })
                    .map(|e| e.pid)
                    .collect()
            };
            if orphans.is_empty() {
                break;
            }
            for pid in orphans {
                // Our child, not yet reaped (the reaper only takes exited ones): its pid is
                // its own.
                killed += 1 + tree::kill_trees(&[pid]);
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // The reaper takes them as they die.
        while Instant::now() < deadline && has_zombie_children(me) {
            std::thread::sleep(Duration::from_millis(2));
        }
        killed
    }
}

fn has_zombie_children(me: libc::pid_t) -> bool {
    tree::snapshot()
        .iter()
        .any(|e| e.ppid == me && e.state == b'Z')
}

/// The orphan reaper: peeks at an exited child without reaping it (`WNOWAIT`), and reaps it
/// unless it is a hook leader (then waits until the shell backend has).
fn reap_orphans() {
    loop {
        // SAFETY: a zeroed siginfo_t is a valid out-parameter for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid(2) with a valid out-pointer; WNOWAIT leaves the child waitable.
        let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r != 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // No child at all: wait for the next spawn (or a second, whichever first).
                _ => {
                    let reg = registry();
                    let seen = reg.spawns;
                    let _ = CHANGED
                        .wait_timeout_while(reg, Duration::from_secs(1), |r| r.spawns == seen);
                    continue;
                }
            }
        }
        // SAFETY: waitid filled `info` for a child event.
        let pid = unsafe { info.si_pid() };
        let reg = registry();
        if reg.leaders.as_ref().is_some_and(|l| l.contains(&pid)) {
            // A hook leader: the shell backend reaps it (promptly: its pidfd is readable).
            let _ = CHANGED.wait_timeout_while(reg, Duration::from_millis(200), |r| {
                r.leaders.as_ref().is_some_and(|l| l.contains(&pid))
            });
            continue;
        }
        drop(reg);
        let mut status = 0;
        // SAFETY: waitpid on a child that has exited and is not a hook leader.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            REAPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE 0`): other processes of the same user —
/// hooks included — can no longer read its `/proc/<pid>/environ`, `mem`, `maps` or `fd/`, nor
/// attach `ptrace` (gdb, strace, perf). Trade-offs: no core dumps of the host, no debugging it
/// without root. Hooks themselves are unaffected (exec makes them dumpable again). Processes
/// with `CAP_SYS_PTRACE` (root) still read everything.
pub fn harden() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether [`harden`] is in effect.
pub fn is_hardened() -> bool {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 0 }
}
