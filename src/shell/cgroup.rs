//! Hook processes in a delegated cgroup v2 (ARCHITECTURE.md § Shell hooks: containment).
//!
//! ```text
//! <base>/                                  delegated to us (our own cgroup, or ShellLimits::cgroup)
//!   prx-hooks.<pid>.<start time>.<n>/      one per sink (the host's pid and start time: who owns it)
//!     hook-<id>/                           one per hook
//!       <run>/                             one per run: the leader is moved in before it execs
//! ```
//!
//! A run's cgroup holds everything the hook starts, `setsid` or double-forked daemons included,
//! and `cgroup.kill` (Linux 5.14) kills all of it at once: at the hook's timeout, at shutdown,
//! and — when the leader has exited but left processes behind — at the hook's deadline (the
//! run's `timeout_ms` bounds everything it started). Empty run cgroups are removed.
//!
//! A host killed with SIGKILL leaves its `prx-hooks.*` directory and whatever runs in it: the
//! next sink created on the same base kills and removes every such directory whose owner (pid
//! and start time) is gone.
//!
//! Memory and process-count limits (`memory.max`, `pids.max` of each run) need the `memory`
//! and `pids` controllers available down to our directories; which are is detected once and
//! reported in the shell stats. A hook that asks for one that is not available fails to spawn
//! (never runs unlimited).

use serde::Serialize;
use std::collections::HashSet;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The prefix of our per-sink directories.
const PREFIX: &str = "prx-hooks.";

/// How long removing a stale directory waits for what was killed in it to be gone.
const STALE_WAIT: Duration = Duration::from_secs(2);

/// What the shell stats say about cgroups.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CgroupStatus {
    /// Not asked for (`ShellLimits::cgroup` unset and detection off).
    #[default]
    Off,
    /// Every run gets a cgroup under `path`.
    Active {
        /// The delegated cgroup directory the runs' cgroups are made in.
        path: PathBuf,
        /// `memory_bytes` limits can be enforced.
        memory: bool,
        /// `processes` limits can be enforced.
        pids: bool,
    },
    /// Detection found no usable delegated cgroup (hooks run without one).
    Unavailable {
        /// Why detection found none, for the operator.
        reason: String,
    },
    /// A configured cgroup could not be used: every hook fails to spawn.
    Failed {
        /// Why the configured cgroup could not be used.
        reason: String,
    },
}

/// The process's own cgroup v2 directory, if this process may create cgroups in it and the
/// kernel has `cgroup.kill`. `Err` says why not, in words for a person.
pub fn detect() -> Result<PathBuf, String> {
    let own = own_cgroup()?;
    probe(&own)?;
    Ok(own)
}

/// `/proc/self/cgroup`'s v2 line joined to where the v2 hierarchy is mounted.
fn own_cgroup() -> Result<PathBuf, String> {
    let cg = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let rel = cg
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("this process is in no cgroup v2 hierarchy")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    for line in mounts.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split(' ').next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = left.split(' ').collect();
        let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let rel = rel.strip_prefix(unescape(root).as_str()).unwrap_or(rel);
        let dir = Path::new(&unescape(point)).join(rel.trim_start_matches('/'));
        if dir.join("cgroup.procs").exists() {
            return Ok(dir);
        }
    }
    Err("no cgroup v2 hierarchy is mounted".into())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether we may create a cgroup in `dir` and kill it with `cgroup.kill`.
fn probe(dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!("{PREFIX}probe.{}", std::process::id()));
    std::fs::create_dir(&probe).map_err(|e| {
        format!(
            "cannot create a cgroup in {} ({e}): it is not delegated to this user",
            dir.display()
        )
    })?;
    let kill = probe.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&probe);
    if !kill {
        return Err(format!(
            "{} has no cgroup.kill (Linux 5.14 or later is needed)",
            dir.display()
        ));
    }
    Ok(())
}

/// The start time of process `pid` (clock ticks since boot), the 22nd field of its stat.
fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].split(' ').nth(19)?.parse().ok()
}

/// One sink's cgroups.
pub(crate) struct Cgroups {
    host: PathBuf,
    memory: bool,
    pids: bool,
    /// Per-hook parents created so far.
    hooks: Mutex<HashSet<String>>,
    next: AtomicU64,
    /// Killed and removed (shutdown): no more runs.
    closed: AtomicBool,
}

/// Limits set on a run's cgroup.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CgroupLimits {
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) processes: Option<u64>,
}

impl Cgroups {
    /// Kills and removes stale directories of dead hosts in `base`, then creates ours.
    pub(crate) fn create(base: &Path) -> Result<Cgroups, String> {
        remove_stale(base);
        static SINKS: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        let start = start_time(pid).unwrap_or(0);
        let n = SINKS.fetch_add(1, Ordering::Relaxed);
        let host = base.join(format!("{PREFIX}{pid}.{start}.{n}"));
        std::fs::create_dir(&host)
            .map_err(|e| format!("cannot create the cgroup {}: {e}", host.display()))?;
        if !host.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&host);
            return Err(format!(
                "{} has no cgroup.kill (Linux 5.14 or later is needed)",
                host.display()
            ));
        }
        // Controllers for the runs: enabled in `base` (if we may) and in our directory.
        let available = |dir: &Path| {
            std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default()
        };
        let enable = |dir: &Path, c: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.subtree_control"))
                .and_then(|mut f| f.write_all(format!("+{c}").as_bytes()))
                .is_ok()
        };
        let mut on = [false; 2];
        for (i, c) in ["memory", "pids"].into_iter().enumerate() {
            let has = |d: &Path| available(d).split_whitespace().any(|x| x == c);
            if !has(&host) && has(base) {
                enable(base, c);
            }
            on[i] = has(&host) && enable(&host, c);
        }
        Ok(Cgroups {
            host,
            memory: on[0],
            pids: on[1],
            hooks: Mutex::new(HashSet::new()),
            next: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }

    pub(crate) fn status(&self) -> CgroupStatus {
        CgroupStatus::Active {
            path: self.host.clone(),
            memory: self.memory,
            pids: self.pids,
        }
    }

    /// A new cgroup for one run of hook `id`, with `limits` set.
    pub(crate) fn run(&self, id: &str, limits: CgroupLimits) -> Result<RunCgroup, String> {
        if self.closed.load(Ordering::Acquire) {
            return Err("the shell backend has shut down".into());
        }
        let name: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let hook = self.host.join(format!("hook-{name}"));
        {
            let mut hooks = super::lock(&self.hooks);
            if !hooks.contains(&name) {
                match std::fs::create_dir(&hook) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("cgroup {}: {e}", hook.display())),
                }
                for (on, c) in [(self.memory, "memory"), (self.pids, "pids")] {
                    if on {
                        let _ =
                            std::fs::write(hook.join("cgroup.subtree_control"), format!("+{c}"));
                    }
                }
                hooks.insert(name);
            }
        }
        for (want, on, what) in [
            (limits.memory_bytes, self.memory, "memory_bytes"),
            (limits.processes, self.pids, "processes"),
        ] {
            if want.is_some() && !on {
                return Err(format!(
                    "{what} needs the {} controller in the delegated cgroup {}, which does not have it; not run",
                    if what == "processes" {
                        "pids"
                    } else {
                        "memory"
                    },
                    self.host.display()
                ));
            }
        }
        let dir = hook.join(self.next.fetch_add(1, Ordering::Relaxed).to_string());
        std::fs::create_dir(&dir).map_err(|e| format!("cgroup {}: {e}", dir.display()))?;
        let run = RunCgroup { dir, procs: None };
        let set = |file: &str, v: u64| {
            std::fs::write(run.dir.join(file), v.to_string())
                .map_err(|e| format!("cgroup {}/{file}: {e}", run.dir.display()))
        };
        if let Some(m) = limits.memory_bytes {
            set("memory.max", m)?;
            // No swap either: memory.max alone would let the hook page out instead.
            let _ = set("memory.swap.max", 0);
        }
        if let Some(p) = limits.processes {
            set("pids.max", p)?;
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(run.dir.join("cgroup.procs"))
            .map_err(|e| format!("cgroup {}/cgroup.procs: {e}", run.dir.display()))?;
        Ok(RunCgroup {
            procs: Some(procs.into()),
            ..run
        })
    }
}

impl Cgroups {
    /// Kills whatever is left in our directory and removes it (shutdown; idempotent).
    pub(crate) fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            kill_and_remove(&self.host, Duration::from_millis(200));
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.close();
    }
}

/// One run's cgroup. Dropping it does not remove it: the reactor does, once it is empty.
pub(crate) struct RunCgroup {
    dir: PathBuf,
    procs: Option<OwnedFd>,
}

impl RunCgroup {
    /// `cgroup.procs`, for the child to move itself in.
    pub(crate) fn procs_fd(&self) -> Option<RawFd> {
        self.procs.as_ref().map(|f| f.as_raw_fd())
    }

    /// Lets go of `cgroup.procs` (once the child is in).
    pub(crate) fn spawned(&mut self) {
        self.procs = None;
    }

    /// SIGKILL to every process in it.
    pub(crate) fn kill(&self) {
        if let Err(e) = std::fs::write(self.dir.join("cgroup.kill"), "1")
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cgroup {}: cgroup.kill: {e}", self.dir.display());
        }
    }

    /// Whether a process still lives in it.
    pub(crate) fn populated(&self) -> bool {
        populated(&self.dir)
    }

    /// Removes it if it is empty; `true` once it is gone.
    pub(crate) fn remove(&self) -> bool {
        match std::fs::remove_dir(&self.dir) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(_) => false,
        }
    }
}

fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|s| s.lines().any(|l| l == "populated 1"))
        .unwrap_or(false)
}

/// `cgroup.kill` on `dir` (the whole subtree), then removes the subtree bottom-up, waiting up to
/// `wait` for the killed processes to be gone.
fn kill_and_remove(dir: &Path, wait: Duration) {
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    let until = Instant::now() + wait;
    while populated(dir) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(2));
    }
    remove_tree(dir);
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("could not remove the cgroup {}: {e}", dir.display());
    }
}

/// Kills and removes `prx-hooks.<pid>.<start>.<n>` directories in `base` whose host is gone.
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let mut parts = rest.split('.');
        let (Some(pid), Some(start)) = (
            parts.next().and_then(|p| p.parse::<u32>().ok()),
            parts.next().and_then(|s| s.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if start_time(pid) == Some(start) {
            continue; // its host is alive
        }
        let dir = e.path();
        tracing::info!(
            "killing and removing the cgroup {}: left by a prx-hooks that did not shut down",
            dir.display()
        );
        kill_and_remove(&dir, STALE_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/sys/fs/cgroup\040x"), "/sys/fs/cgroup x");
        assert_eq!(unescape(r"a\\b"), r"a\\b");
        assert_eq!(unescape(r"plain"), "plain");
    }

    #[test]
    fn own_start_time() {
        assert!(start_time(std::process::id()).is_some());
    }
}
