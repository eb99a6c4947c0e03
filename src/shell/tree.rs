//! Killing a hook's whole process tree when there is no cgroup to kill (ARCHITECTURE.md § Shell
//! hooks: containment).
//!
//! A process group is not enough: `setsid` (or `setpgid`) takes a descendant out of it. What
//! still ties such a process to the hook is parentage, as long as its parent lives, so the tree
//! is walked from the leader through `/proc/<pid>/stat` (`/proc/<pid>/task/*/children` is not
//! built into every kernel). The walk first *stops* what it finds (SIGSTOP: a stopped process
//! cannot fork, exit-and-reparent its children, or reap one — so the pids seen stay theirs),
//! top-down, until a round finds nothing new; then everything found gets SIGKILL.
//!
//! What it cannot catch: a descendant whose parent exited before the walk (it was reparented to
//! a subreaper or init, and nothing ties it to the hook any more). Under `prx-hooks run` those
//! become the CLI's children and die at shutdown at the latest ([`super::supervisor`]); with a
//! cgroup, nothing escapes.

use nix::libc;
use std::time::{Duration, Instant};

/// At most this many rounds of stop-and-look (a tree deeper than this is killed as found).
const MAX_ROUNDS: usize = 32;

/// How long one round waits for what it stopped to be stopped, in total.
const STOP_WAIT: Duration = Duration::from_millis(20);

/// One line of `/proc/<pid>/stat`: (pid, state, ppid).
#[derive(Clone, Copy)]
pub(crate) struct ProcEntry {
    pub(crate) pid: i32,
    pub(crate) state: u8,
    pub(crate) ppid: i32,
}

/// `/proc/<pid>/stat` of one process.
pub(crate) fn stat(pid: i32) -> Option<ProcEntry> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&s)
}

fn parse_stat(s: &[u8]) -> Option<ProcEntry> {
    // "pid (comm) S ppid ...": comm may hold anything, so look from the last ')'.
    let open = s.iter().position(|&b| b == b' ')?;
    let pid = std::str::from_utf8(&s[..open]).ok()?.parse().ok()?;
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(s.get(close + 2..)?).ok()?;
    let mut f = rest.split(' ');
    let state = f.next()?.bytes().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some(ProcEntry { pid, state, ppid })
}

/// Every process visible in `/proc`.
pub(crate) fn snapshot() -> Vec<ProcEntry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .collect()
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) with integer arguments. Every pid passed is one we may signal without a
    // reuse race: our unreaped child, or a process seen as the child of a stopped (or zombie)
    // process of the tree, which cannot have reaped it since.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Stops each of `roots` and every descendant it still has, then kills them all (and each
/// root's process group). Each root must be our own unreaped child, so its pid is still its
/// own. One walk serves every root (a shutdown kills them all at once). Returns how many
/// processes besides the roots got SIGKILL.
pub(crate) fn kill_trees(roots: &[i32]) -> usize {
    // The groups first, one call each: most descendants never leave them.
    for &root in roots {
        signal(-root, libc::SIGSTOP);
        signal(root, libc::SIGSTOP);
    }
    let mut found: Vec<i32> = roots.to_vec();
    let mut fresh: Vec<i32> = roots.to_vec();
    for _ in 0..MAX_ROUNDS {
        wait_stopped(&fresh);
        let all = snapshot();
        fresh.clear();
        // Children of anything found, transitively within this snapshot.
        loop {
            let before = fresh.len();
            for e in &all {
                if !found.contains(&e.pid)
                    && !fresh.contains(&e.pid)
                    && (found.contains(&e.ppid) || fresh.contains(&e.ppid))
                {
                    fresh.push(e.pid);
                }
            }
            if fresh.len() == before {
                break;
            }
        }
        if fresh.is_empty() {
            break;
        }
        for &p in &fresh {
            signal(p, libc::SIGSTOP);
        }
        found.extend_from_slice(&fresh);
    }
    // Leaves first, so no parent wakes to a SIGCHLD with a child still to kill.
    for &p in found.iter().rev() {
        signal(p, libc::SIGKILL);
    }
    for &root in roots {
        signal(-root, libc::SIGKILL);
    }
    found.len() - roots.len()
}

/// Waits (briefly) until each of `pids` is stopped or dead: only then can it no longer fork or
/// reap.
fn wait_stopped(pids: &[i32]) {
    let until = Instant::now() + STOP_WAIT;
    for &p in pids {
        loop {
            match stat(p).map(|e| e.state) {
                None | Some(b'T' | b't' | b'Z' | b'X' | b'x') => break,
                Some(_) if Instant::now() >= until => return,
                Some(_) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names() {
        let e = parse_stat(b"42 (a) b) (c) S 7 42 42 0").unwrap();
        assert_eq!((e.pid, e.state, e.ppid), (42, b'S', 7));
        assert!(parse_stat(b"garbage").is_none());
        let me = stat(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
    }
}
