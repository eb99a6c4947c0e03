//! Shell hooks: running the actions of `hooks.json` as processes (ARCHITECTURE.md § Shell hooks).
//!
//! ```text
//! pipeline worker ── deliver(msg) ──► per-hook bounded queue (256)        one lock per event;
//!                                      full → dropped, counted            no I/O, no spawn
//! runner thread (one per sink):
//!   start:  oldest startable job (≤ 64 running, ≤ max_concurrent per hook) → payload file
//!           written once per event (0600, in a private 0700 dir in $TMPDIR) → sanitized env
//!           → cwd opened and checked → [run cgroup] → clone(CLONE_VM|CLONE_VFORK) + exec
//!   wait:   poll(pidfds, stderr, stdin, wake eventfd) until the nearest deadline
//!   reap:   exit → waitpid(pid) → outcome, counted → start the next job at once
//!   kill:   deadline → cgroup.kill, or stop + SIGKILL the whole process tree → reap
//! ```
//!
//! * **Never blocks the pipeline.** `deliver` takes one small lock per event and enqueues; the
//!   payload file, the environment, the spawn and the stdin writes (nonblocking) all happen on
//!   the runner thread. One thread both starts and reaps, so a finished hook frees its slot for
//!   the next job without any cross-thread wake-up; `deliver` wakes the runner only when it is
//!   idle.
//! * **Environment**: built from nothing by the rules of [`mod@env`] (the one statement of
//!   them): a few host variables, the real locale categories (not any `LC_*`), `HOME`, the
//!   table's `env_passthrough`, `PATH` = [`SANITIZED_PATH`], the `ZERO_HOOK_*` variables, then
//!   the action's `env`.
//! * **Payload**: `ZERO_HOOK_PAYLOAD` (≤ [`MAX_ENV_PAYLOAD`] bytes, else unset and
//!   `ZERO_HOOK_PAYLOAD_TRUNCATED=1`), `ZERO_HOOK_PAYLOAD_FILE` (shared by the event's hooks,
//!   removed after the last one exits) and, with `stdin_json`, stdin.
//! * **Processes** (`shell::spawn`): started with an empty signal mask and default dispositions,
//!   no descriptor above stderr, in a process group of their own, with `PDEATHSIG` (they die
//!   with the runner thread, which outlives every process it starts), optionally rlimits and
//!   a cgroup; waited per pid through a pidfd (never `waitpid(-1)`, never a SIGCHLD handler);
//!   on timeout everything the hook started is killed (`shell::reactor`); completion is the
//!   leader's exit, never pipe EOF. stdout is discarded, the last 16 KiB of stderr kept.
//! * **Counted**: per hook and in total, `sent = ok + exit + signal + timed_out + spawn_failed +
//!   killed + dropped + cancelled + running + queued` at every moment ([`HookCounts`]).
//! * **Shutdown** ([`ShellSink::shutdown`]): stop accepting, let queued and running hooks finish
//!   until the deadline, then SIGKILL every group still running, cancel what never started,
//!   reap every child, remove every payload file, join the threads.

pub(crate) mod capture;
pub mod cgroup;
mod deliver;
pub mod env;
mod once;
mod outcome;
mod payload;
mod queue;
mod reactor;
mod runlog;
mod runner;
pub mod runs;
mod spawn;
pub mod supervisor;
mod tree;

pub use cgroup::CgroupStatus;
use deliver::{conclude, matcher_skip, skip_reason};
pub use env::SANITIZED_PATH;
use once::OnceGuard;
pub use once::{Busy, OnceRun};
pub use outcome::RunFeedStats;
pub(crate) use outcome::SHELL_SECTION;
pub use outcome::{HookCounts, Outcome, OutcomeKind, ShellStats};
pub use payload::{MAX_ENV_PAYLOAD, event_message, message_from_json};
pub use reactor::STDERR_TAIL;
pub use runlog::{MAX_BYTES as RUN_LOG_MAX_BYTES, MAX_RUNS as RUN_LOG_MAX_RUNS, RunLogCounts};
use runner::{cgroups_for, notify_drained, runner_main};
pub use runs::{DEFAULT_RUN_QUEUE, RunSubscription};
pub(crate) use spawn::Rlimit;
pub use spawn::Rlimits;

use crate::bus::Message;
use crate::config::{Action, HookLimits, HookTable};
use crate::event::{EventKind, EventMask};
use crate::pipeline::{InterestHandle, Sink};
use crate::stats::SinkCounts;
use arc_swap::ArcSwap;
use cgroup::{CgroupLimits, Cgroups};
use outcome::DropReason;
use payload::{EventRun, PayloadDir};
use queue::{Job, Offer, Sched};
use reactor::{Finished, Proc, Reactor};
use runs::RunFeed;
use spawn::SpawnOpts;
use std::collections::HashSet;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The former path of [`crate::__private::spawn`].
#[doc(hidden)]
#[deprecated(note = "use prx_hooks::__private::spawn")]
pub mod bench {
    pub use super::spawn_bench::*;
}

/// The spawn path alone, for `benches/spawn.rs` through [`crate::__private::spawn`] (not an
/// API: no queue, no payload, no reactor — exactly what each hook's process start costs, to
/// compare with other ways of starting a process).
pub(crate) mod spawn_bench {
    use super::{env::ChildEnv, spawn};
    use crate::config::Action;
    use std::path::Path;

    /// Starts `program` (no arguments) in `dir` the way every hook is started.
    pub struct Spawner {
        opts: spawn::SpawnOpts,
        action: Action,
        env: ChildEnv,
    }

    impl std::fmt::Debug for Spawner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Spawner").finish_non_exhaustive()
        }
    }

    impl Spawner {
        /// A spawner of `program` in `dir`, with the environment every hook gets.
        pub fn new(program: &Path, dir: &Path) -> std::io::Result<Spawner> {
            Ok(Spawner {
                opts: spawn::SpawnOpts::new(dir)?,
                action: Action {
                    id: "bench".into(),
                    id_explicit: true,
                    event: crate::EventKind::TurnComplete,
                    index: 0,
                    command: program.display().to_string(),
                    program: Ok(program.to_path_buf()),
                    args: Vec::new(),
                    env: Vec::new(),
                    cwd: dir.to_path_buf(),
                    timeout: std::time::Duration::from_secs(30),
                    timeout_explicit: true,
                    stdin_json: false,
                    enabled: true,
                    matcher: None,
                    max_concurrent: 1,
                    limits: Default::default(),
                },
                env: ChildEnv::from_pairs(&[("PATH", super::SANITIZED_PATH)]),
            })
        }

        /// Spawns, then waits for the exit (stderr pipe and pidfd included, as for a hook);
        /// returns the raw wait status.
        pub fn spawn_wait(&self) -> Result<i32, String> {
            let req = spawn::Request {
                env: &self.env,
                rlimits: &[],
                cgroup_procs: None,
                capture_stdout: false,
            };
            let sp = spawn::spawn(&self.action, &req, &self.opts)?;
            let mut status = 0;
            // SAFETY: waitpid on the child just started.
            let r = unsafe { nix::libc::waitpid(sp.pid as i32, &mut status, 0) };
            if r < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            Ok(status)
        }
    }
}

/// Default of [`ShellLimits::max_running`].
pub const DEFAULT_MAX_RUNNING: usize = 64;
/// Default of [`ShellLimits::queue_per_action`].
pub const DEFAULT_QUEUE_PER_ACTION: usize = 256;
/// Default of [`ShellLimits::history`].
pub const DEFAULT_HISTORY: usize = 50;

/// How long the runner waits for SIGKILLed processes at shutdown before reporting them killed
/// and leaving their reaping to a detached thread (a process in uninterruptible sleep cannot
/// die until its I/O returns). Well inside [`crate::SHUTDOWN_SLACK`].
const KILL_GRACE: Duration = Duration::from_millis(150);

/// The runner's poll tick when it has no eventfd to be woken through.
const NO_WAKE_TICK: Duration = Duration::from_millis(2);

/// Processes the runner starts in a row before it looks (without waiting) for exits and
/// deadlines again.
const SPAWN_BATCH: usize = 8;

/// Descriptors one running hook holds (its pidfd, our ends of its stderr and stdin pipes),
/// plus one for the payload file its event may hold open while it is written.
const FDS_PER_RUNNING: usize = 4;

/// Descriptors spawns in progress hold for a moment (pipe pairs, /dev/null, the exec-error
/// pipe, a few spawns at once) and the runner's own (eventfd, cgroup.procs).
const FDS_SPAWNING: usize = 32;

/// Limits of the shell backend. `Default` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct ShellLimits {
    /// Hook processes running at once, all hooks together (default 64). Per hook, the
    /// action's `max_concurrent` applies as well.
    pub max_running: usize,
    /// Jobs waiting per hook (default 256); beyond it events are dropped for that hook.
    pub queue_per_action: usize,
    /// Outcomes kept per hook for [`ShellSink::runs`] (default 50).
    pub history: usize,
    /// Resource limits for every hook process (opt-in, see [`Rlimits`]); `hook_limits` and a
    /// hook's own `limits` take precedence for the limits they set.
    pub rlimits: Option<Rlimits>,
    /// Default limits of every hook (a hook's `"limits"` in hooks.json overrides them one by
    /// one). `memory_bytes` and `processes` need a cgroup with those controllers: without
    /// one, a hook that has them fails to spawn rather than run unlimited.
    pub hook_limits: HookLimits,
    /// A delegated cgroup v2 directory: each run gets a cgroup under it (in
    /// `prx-hooks.<pid>.<start>.<n>/hook-<id>/<run>`), killed as a whole at the timeout, at
    /// shutdown, and — for what an exited leader left — at the run's deadline. If it cannot be
    /// used, every hook fails to spawn (never run unconfined when asked to be confined).
    pub cgroup: Option<PathBuf>,
    /// Without `cgroup`: use this process's own cgroup v2 directory when it is delegated to
    /// us (default off in the library; `prx-hooks` turns it on). When it is not, hooks run
    /// without a cgroup and the stats say why.
    pub detect_cgroup: bool,
    /// Where payload files go: a private directory is created in it (default: `$TMPDIR` as it
    /// is when the sink is created, else `/tmp`). Hooks trust what they read there: give a
    /// directory no other user can rename entries in (yours, or sticky as `/tmp`), as
    /// `run --payload-dir` insists.
    pub tmp_dir: Option<PathBuf>,
}

impl ShellLimits {
    /// The rlimits of a process run like a hook without a hook's own `limits` (a command
    /// policy's guard): `rlimits` under `hook_limits`. The cgroup limits (`memory_bytes`,
    /// `processes`) are not among them.
    pub(crate) fn guard_rlimits(&self) -> Vec<Rlimit> {
        runner::merged_rlimits(self.rlimits.unwrap_or_default(), &self.hook_limits).list()
    }
}

impl Default for ShellLimits {
    fn default() -> Self {
        ShellLimits {
            max_running: DEFAULT_MAX_RUNNING,
            queue_per_action: DEFAULT_QUEUE_PER_ACTION,
            history: DEFAULT_HISTORY,
            rlimits: None,
            hook_limits: HookLimits::default(),
            cgroup: None,
            detect_cgroup: false,
            tmp_dir: None,
        }
    }
}

/// The shell-hook sink. Create it with [`ShellSink::new`], give it tables with
/// [`ShellSink::set_table`], plug it into the pipeline (it implements [`Sink`]).
pub struct ShellSink {
    shared: Arc<Shared>,
    threads: Mutex<Threads>,
}

impl std::fmt::Debug for ShellSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellSink")
            .field("workspace", &self.shared.workspace)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Threads {
    started: bool,
    shut: bool,
    runner: Option<JoinHandle<()>>,
}

/// A table with what is derived from it once.
struct Prepared {
    table: Arc<HookTable>,
    base_env: Arc<[(OsString, OsString)]>,
}

struct Shared {
    workspace: PathBuf,
    max_running: usize,
    queue_per_action: usize,
    history: usize,
    payload: Arc<PayloadDir>,
    opts: Result<SpawnOpts, String>,
    /// Defaults of every hook's limits (`ShellLimits::rlimits` under `hook_limits`).
    rlimits: Rlimits,
    hook_limits: HookLimits,
    cgroups: Result<Option<Cgroups>, String>,
    cgroup_status: CgroupStatus,
    table: ArcSwap<Prepared>,
    interest: InterestHandle,
    sched: Mutex<Sched>,
    /// Shutdown waits here for the queues and processes to drain.
    idle_cv: Condvar,
    runner: RunnerLink,
    /// The finished-runs hook point.
    feed: RunFeed,
    /// Hooks already told that their exit 2 blocked nothing ([`deliver::conclude`]).
    told_cannot_block: Mutex<HashSet<String>>,
    /// Where finished runs are kept across restarts ([`ShellSink::keep_runs`]).
    run_log: std::sync::OnceLock<runlog::RunLog>,
}

/// How the runner thread is woken and handed processes started elsewhere (`run_once`).
struct RunnerLink {
    inbox: Mutex<Inbox>,
    /// An eventfd in the runner's poll set (`None`: the runner polls on [`NO_WAKE_TICK`]);
    /// shared with the start records the runner waits for, whose answers write it.
    wake: Option<Arc<OwnedFd>>,
    /// Jobs picked whose event's start record is being written (`crate::settle::Start`):
    /// each holds its hook's slot, so the hook's later jobs wait behind it, as they would
    /// behind a running process.
    waiting: Mutex<Vec<Job>>,
    /// What their start records' answers call (`RunnerLink::waker`): one, so that a job asked
    /// again registers it once.
    waker: crate::settle::Wake,
    kill_all: AtomicBool,
    exit: AtomicBool,
    /// A [`OnceRun`] was dropped before its outcome: kill the cancelled ones.
    cancel: AtomicBool,
    /// Tests only: the runner panics at the top of its next turn (a stand-in for a bug).
    #[cfg(test)]
    panic: AtomicBool,
}

#[derive(Default)]
struct Inbox {
    /// Direct runs (`run_once`, `run_matching`) for the runner to spawn: every hook process
    /// is spawned by the runner thread, whose exit is what PDEATHSIG follows.
    requests: Vec<Direct>,
    /// The runner has exited: nothing more may be handed to it.
    closed: bool,
}

/// One direct run waiting to be spawned.
struct Direct {
    action: Arc<Action>,
    origin: Origin,
}

/// Who started a process, and where its outcome goes.
enum Origin {
    /// From a hook queue: counted, kept in history.
    Queue(Job),
    /// From `run_once` / `run_matching`: kept in history, sent to the caller.
    Direct {
        id: String,
        event: crate::event::EventKind,
        run: Arc<EventRun>,
        reply: flume::Sender<(usize, Outcome)>,
        index: usize,
    },
    /// From `try_run_once`: kept in history, handed to the [`OnceRun`] (killed if it is
    /// dropped first). Dropped without a report, its guard still completes the run.
    Once {
        id: String,
        event: crate::event::EventKind,
        run: Arc<EventRun>,
        slot: OnceGuard,
    },
}

impl Origin {
    /// A test run whose [`OnceRun`] was dropped before its outcome.
    fn cancelled(&self) -> bool {
        matches!(self, Origin::Once { slot, .. } if slot.slot.cancelled.load(Ordering::Acquire))
    }
}

impl Origin {
    /// A run that never started (spawn failed, cancelled): recorded like a finished one.
    fn not_run(self, sh: &Shared, action: &Action, kind: OutcomeKind) {
        match self {
            Origin::Queue(job) => {
                let o = Outcome::not_run(&action.id, action.event, kind, Some(&job.run.msg));
                drop(job);
                conclude(sh, &o);
                sh.keep_run(&o);
                let mut s = lock(&sh.sched);
                s.finish(o, sh.history);
                notify_drained(sh, &s);
            }
            Origin::Direct {
                run, reply, index, ..
            } => {
                let mut o = Outcome::not_run(&action.id, action.event, kind, Some(&run.msg));
                o.direct = true;
                drop(run);
                let _ = reply.send((index, finish_direct(sh, o)));
            }
            Origin::Once { run, slot, .. } => {
                let mut o = Outcome::not_run(&action.id, action.event, kind, Some(&run.msg));
                o.direct = true;
                drop(run);
                slot.complete(finish_direct(sh, o));
            }
        }
    }
}

/// A direct or test run is over (or never started): its outcome goes to the run feed and the
/// hook's history (not the counters), its slot is given back and a waiting shutdown woken.
/// Returns the outcome for the caller to hand on, after the lock is released.
fn finish_direct(sh: &Shared, o: Outcome) -> Outcome {
    conclude(sh, &o);
    sh.keep_run(&o);
    let mut s = lock(&sh.sched);
    s.record_direct(o.clone(), sh.history);
    notify_drained(sh, &s);
    o
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Hands a finished run to the run log, when runs are kept.
    fn keep_run(&self, o: &Outcome) {
        if let Some(log) = self.run_log.get() {
            log.keep(o);
        }
    }
}

impl ShellSink {
    /// A sink with an empty table; `interest` is its part of the pipeline's interest mask
    /// ([`InterestHandle::detached`] for a sink driven through [`Sink::deliver`] directly, as
    /// [`standalone`](ShellSink::standalone) does). `workspace` is where the table's relative
    /// paths were resolved (informational: actions carry absolute paths). Threads start with
    /// the first non-empty table.
    pub fn new(workspace: PathBuf, interest: InterestHandle, limits: ShellLimits) -> ShellSink {
        let tmp_dir = limits.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);
        let tmp_dir = std::path::absolute(&tmp_dir).unwrap_or(tmp_dir);
        let opts = SpawnOpts::new(&workspace).map_err(|e| {
            let e = format!("cannot prepare spawning: {e}");
            tracing::error!("shell hooks cannot run: {e}");
            e
        });
        let (cgroups, cgroup_status) = cgroups_for(&limits);
        // What a host killed with SIGKILL left in the same TMPDIR.
        payload::remove_stale(&tmp_dir);
        let wake = reactor::eventfd()
            .inspect_err(|e| {
                // Without an eventfd the reaper still works: it polls on a short tick instead.
                tracing::warn!(
                    "eventfd: {e}; the shell reaper falls back to a {NO_WAKE_TICK:?} tick"
                )
            })
            .ok()
            .map(Arc::new);
        let empty = Prepared {
            table: Arc::new(HookTable::default()),
            base_env: Arc::from(Vec::new()),
        };
        let rlimits = limits.rlimits.unwrap_or_default();
        interest.set(EventMask::NONE);
        ShellSink {
            shared: Arc::new(Shared {
                workspace,
                max_running: limits.max_running.max(1),
                queue_per_action: limits.queue_per_action,
                history: limits.history,
                payload: Arc::new(PayloadDir::new(tmp_dir)),
                opts,
                rlimits,
                hook_limits: limits.hook_limits,
                cgroups,
                cgroup_status,
                table: ArcSwap::from_pointee(empty),
                interest,
                sched: Mutex::new(Sched::default()),
                idle_cv: Condvar::new(),
                runner: RunnerLink {
                    inbox: Mutex::new(Inbox::default()),
                    waker: RunnerLink::waker(wake.clone()),
                    wake,
                    waiting: Mutex::new(Vec::new()),
                    kill_all: AtomicBool::new(false),
                    exit: AtomicBool::new(false),
                    cancel: AtomicBool::new(false),
                    #[cfg(test)]
                    panic: AtomicBool::new(false),
                },
                feed: RunFeed::default(),
                told_cannot_block: Mutex::new(HashSet::new()),
                run_log: std::sync::OnceLock::new(),
            }),
            threads: Mutex::new(Threads::default()),
        }
    }

    /// A sink outside any pipeline, with its own interest mask (for `prx-hooks fire`, tests and
    /// benches that drive [`Sink::deliver`] themselves).
    pub fn standalone(workspace: PathBuf, limits: ShellLimits) -> ShellSink {
        ShellSink::new(workspace, InterestHandle::detached(), limits)
    }

    /// The directory hooks run in, relative `cwd`s resolve against, and `hooks.json` is read from.
    pub fn workspace(&self) -> &Path {
        &self.shared.workspace
    }

    /// Where the private directory payload files are written in is created.
    pub fn tmp_dir(&self) -> &Path {
        self.shared.payload.tmp()
    }

    /// The private directory payload files are written in (0700, created on first use,
    /// removed at shutdown).
    pub fn payload_dir(&self) -> Option<PathBuf> {
        self.shared.payload.path()
    }

    /// Whether hooks run in cgroups, and if not why.
    pub fn cgroup_status(&self) -> CgroupStatus {
        self.shared.cgroup_status.clone()
    }

    /// Swaps in a new table (the config watcher calls this on every successful load) and
    /// updates the interest mask. Jobs already queued or running keep the table they were
    /// delivered under. The parent-environment share (allowlist + `env_passthrough`) is read
    /// here, once per table.
    pub fn set_table(&self, table: Arc<HookTable>) {
        let path = table.path.as_deref().unwrap_or(SANITIZED_PATH);
        let base_env: Arc<[(OsString, OsString)]> =
            env::parent_env(&table.env_passthrough, path).into();
        lock(&self.shared.sched).set_table(table.actions.iter().map(|a| a.id.clone()));
        let mask = table.interest();
        let busy = !table.actions.is_empty();
        self.shared
            .table
            .store(Arc::new(Prepared { table, base_env }));
        if busy && let Err(e) = self.ensure_started() {
            tracing::error!("shell hooks cannot run: {e}");
        }
        let threads = lock(&self.threads);
        if !threads.shut {
            self.shared.interest.set(mask);
        }
    }

    /// The table in use.
    pub fn table(&self) -> Arc<HookTable> {
        self.shared.table.load().table.clone()
    }

    /// Every counter, per hook and in total.
    pub fn stats(&self) -> ShellStats {
        let s = lock(&self.shared.sched);
        ShellStats {
            totals: s.totals,
            hooks: s
                .hooks
                .iter()
                .map(|(id, h)| (id.clone(), h.counts))
                .collect(),
            direct_running: s.direct_running,
            cgroup: self.shared.cgroup_status.clone(),
            shared_running: s.shared_running,
            run_feed: self.shared.feed.stats(),
            run_log: self.shared.run_log.get().map(|l| l.counts()),
        }
    }

    /// Keeps every finished run in the file at `path` from now on (at most
    /// [`RUN_LOG_MAX_RUNS`] runs once compacted, [`RUN_LOG_MAX_BYTES`]; created 0600, never
    /// through a symbolic link) and first reads back the runs it holds into the hooks' histories, so
    /// [`runs`](Self::runs) shows them after a restart. Call it once, before events flow; a
    /// second call is an error. Returns how many runs were read back for hooks of the table in
    /// force (the runs of hooks no longer in it stay in the file, not in the histories).
    ///
    /// # Examples
    ///
    /// ```
    /// # let ws = tempfile::tempdir()?;
    /// let hooks = prx_hooks::Hooks::builder().workspace(ws.path()).build()?;
    /// let shell = hooks.shell().expect("a workspace has a shell sink");
    /// assert_eq!(shell.keep_runs(&ws.path().join("runs.ndjson"))?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keep_runs(&self, path: &Path) -> std::io::Result<usize> {
        let (log, runs) = runlog::RunLog::open(path)?;
        self.shared
            .run_log
            .set(log)
            .map_err(|_| std::io::Error::other("hook runs are kept in a file already"))?;
        // Only hooks of the table in force get their runs back: a hook since removed from
        // hooks.json (or an id nobody configured) does not reappear in the stats.
        let prepared = self.shared.table.load();
        let ids: HashSet<&str> = prepared
            .table
            .actions
            .iter()
            .map(|a| a.id.as_str())
            .collect();
        let mut s = lock(&self.shared.sched);
        let mut n = 0;
        for o in runs.into_iter().filter(|o| ids.contains(o.id.as_str())) {
            s.record_loaded(o, self.shared.history);
            n += 1;
        }
        Ok(n)
    }

    /// Subscribes to every run's outcome from now on (module [`runs`]): processes that
    /// finished, spawns that failed, and runs that were skipped, dropped or cancelled, from the
    /// pipeline and from `run_once`/`run_matching` alike. At most `capacity` outcomes wait
    /// ([`DEFAULT_RUN_QUEUE`] is a good default); beyond that the subscription misses outcomes,
    /// counted in [`RunSubscription::dropped`]. The runner never waits for a subscriber. Ends
    /// (after what is queued) when the sink shuts down.
    pub fn subscribe_runs(&self, capacity: usize) -> RunSubscription {
        self.shared.feed.subscribe(capacity)
    }

    /// The last outcomes of hook `id` (at most [`ShellLimits::history`]), oldest first: runs
    /// from the pipeline and from `run_once` alike (not skipped or dropped events).
    pub fn runs(&self, id: &str) -> Vec<Outcome> {
        lock(&self.shared.sched)
            .hooks
            .get(id)
            .map(|h| h.runs.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Runs `action` once for `msg` now — even if it is disabled, whatever its matcher — and
    /// waits for it (up to its timeout). For `prx-hooks fire` and the HTTP test endpoint: it
    /// blocks the caller, so never call it on a pipeline worker or an async executor thread.
    /// The outcome goes into the hook's history, not into the counters.
    pub fn run_once(&self, action: &Action, msg: &Message) -> Outcome {
        let opts = RunOptions {
            ignore_matcher: true,
        };
        self.run_once_with(action, msg, &opts)
    }

    /// [`run_once`](Self::run_once) with options: unless `opts.ignore_matcher`, a hook whose
    /// matcher does not match the payload's tool comes back [`OutcomeKind::Skipped`] (naming
    /// the tool and the pattern) without running. A disabled hook still runs (this is a test).
    pub fn run_once_with(&self, action: &Action, msg: &Message, opts: &RunOptions) -> Outcome {
        if !opts.ignore_matcher && action.matcher.is_some() {
            let tool = payload::payload_tool(msg.json_str());
            if let Some(reason) = matcher_skip(action, tool.as_deref()) {
                let mut o = Outcome::not_run(
                    &action.id,
                    action.event,
                    OutcomeKind::Skipped { reason },
                    Some(msg),
                );
                o.direct = true;
                conclude(&self.shared, &o);
                return o;
            }
        }
        self.run_direct(&[action], msg)
            .pop()
            .expect("one outcome per action")
    }

    /// Starts `action` once for `msg` now — even if it is disabled — if a slot is free: fewer
    /// than its `max_concurrent` processes of it run (pipeline and direct runs together) and
    /// fewer than [`ShellLimits::max_running`] overall; otherwise [`Busy`]. With
    /// `honour_matcher`, a payload whose tool the hook's matcher does not match is not run
    /// (the outcome is `skipped`, at once). The outcome goes into the hook's history, not into
    /// the counters. For the HTTP test endpoint: it hands the run to the runner thread (which
    /// writes the payload file and spawns, as for every hook) and returns at once; await the
    /// [`OnceRun`] (dropping it kills the run, or keeps it from starting).
    pub fn try_run_once(
        &self,
        action: &Action,
        msg: &Message,
        honour_matcher: bool,
    ) -> Result<OnceRun, Busy> {
        let not_run = |kind| {
            let mut o = Outcome::not_run(&action.id, action.event, kind, Some(msg));
            o.direct = true;
            conclude(&self.shared, &o);
            o
        };
        if honour_matcher && action.matcher.is_some() {
            let tool = payload::payload_tool(msg.json_str());
            if let Some(reason) = matcher_skip(action, tool.as_deref()) {
                return Ok(OnceRun::finished(not_run(OutcomeKind::Skipped { reason })));
            }
        }
        let started = self.ensure_started();
        lock(&self.shared.sched).try_start_direct(
            &action.id,
            action.max_concurrent,
            self.shared.max_running,
        )?;
        let (origin, once) = OnceRun::pending(&self.shared, action, msg);
        let action = Arc::new(action.clone());
        match started {
            Ok(()) => self.shared.to_runner(Direct { action, origin }),
            Err(reason) => {
                origin.not_run(&self.shared, &action, OutcomeKind::SpawnFailed { reason })
            }
        }
        Ok(once)
    }

    /// File descriptors this backend may hold at once with the current table at its limits —
    /// [`ShellLimits::max_running`] shared slots plus one reserved slot per hook (module docs
    /// of `queue`) — what a server sharing the process's RLIMIT_NOFILE must leave free so that
    /// hooks keep spawning. It grows with the table: ask again after a reload.
    pub fn fds_at_limits(&self) -> usize {
        let hooks = self.shared.table.load().table.actions.len();
        (self.shared.max_running + hooks) * FDS_PER_RUNNING + FDS_SPAWNING
    }

    /// Runs every hook of `msg`'s event in the current table once, concurrently, and waits for
    /// all of them; disabled hooks and hooks whose matcher does not match come back as
    /// [`OutcomeKind::Skipped`]. Outcomes in table order. This is `prx-hooks fire`.
    pub fn run_matching(&self, msg: &Message) -> Vec<Outcome> {
        self.run_matching_with(msg, &RunOptions::default())
    }

    /// [`run_matching`](Self::run_matching) with options (`fire --ignore-matcher`: every
    /// enabled hook of the event runs, whatever its matcher).
    pub fn run_matching_with(&self, msg: &Message, opts: &RunOptions) -> Vec<Outcome> {
        let prepared = self.shared.table.load_full();
        let table = &prepared.table;
        let Some(kind) = msg.event() else {
            return Vec::new();
        };
        let tool = payload::payload_tool(msg.json_str());
        let mut run = Vec::new();
        let mut slots: Vec<Result<usize, Outcome>> = Vec::new();
        for a in table.actions_for(kind) {
            let skip = match skip_reason(table, a) {
                Some(why) => Some(why.to_string()),
                None if opts.ignore_matcher => None,
                None => matcher_skip(a, tool.as_deref()),
            };
            match skip {
                Some(reason) => {
                    let mut o = Outcome::not_run(
                        &a.id,
                        a.event,
                        OutcomeKind::Skipped { reason },
                        Some(msg),
                    );
                    o.direct = true;
                    conclude(&self.shared, &o);
                    slots.push(Err(o));
                }
                None => {
                    slots.push(Ok(run.len()));
                    run.push(&**a);
                }
            }
        }
        let mut ran = self
            .run_direct(&run, msg)
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>();
        slots
            .into_iter()
            .map(|s| match s {
                Ok(i) => ran[i].take().expect("each outcome once"),
                Err(o) => o,
            })
            .collect()
    }

    fn run_direct(&self, actions: &[&Action], msg: &Message) -> Vec<Outcome> {
        let mut results: Vec<Option<Outcome>> = vec![None; actions.len()];
        if actions.is_empty() {
            return Vec::new();
        }
        let started = self.ensure_started();
        let prepared = self.shared.table.load_full();
        let run = Arc::new(EventRun::new(
            msg.clone(),
            prepared.base_env.clone(),
            self.shared.payload.clone(),
        ));
        let (tx, rx) = flume::unbounded();
        let mut pending = 0;
        for (i, a) in actions.iter().enumerate() {
            lock(&self.shared.sched).start_direct(&a.id);
            let origin = Origin::Direct {
                id: a.id.clone(),
                event: a.event,
                run: run.clone(),
                reply: tx.clone(),
                index: i,
            };
            let action = Arc::new((*a).clone());
            match &started {
                Ok(()) => self.shared.to_runner(Direct { action, origin }),
                Err(e) => origin.not_run(
                    &self.shared,
                    &action,
                    OutcomeKind::SpawnFailed { reason: e.clone() },
                ),
            }
            pending += 1;
        }
        drop((run, tx));
        for _ in 0..pending {
            match rx.recv() {
                Ok((i, o)) => results[i] = Some(o),
                Err(_) => break,
            }
        }
        results
            .into_iter()
            .zip(actions)
            .map(|(o, a)| {
                o.unwrap_or_else(|| {
                    let mut o = Outcome::not_run(&a.id, a.event, OutcomeKind::Killed, Some(msg));
                    o.direct = true;
                    o
                })
            })
            .collect()
    }

    /// Stops accepting events, lets queued and running hooks finish until `deadline`, then
    /// SIGKILLs every process group still running (counted `killed`), cancels what is still
    /// queued (`cancelled`), reaps every child, removes every payload file and joins the
    /// threads. Idempotent; later events are counted as dropped.
    pub fn shutdown(&self, deadline: Instant) {
        let mut threads = lock(&self.threads);
        if threads.shut {
            return;
        }
        threads.shut = true;
        self.shared.interest.set(EventMask::NONE);
        let sh = &self.shared;
        let cancelled = {
            let mut s = lock(&sh.sched);
            s.closing = true;
            while threads.started && s.in_flight() + s.direct_running > 0 && !s.hurry {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                s = sh
                    .idle_cv
                    .wait_timeout(s, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            s.stop_spawning = true;
            s.cancel_all()
        };
        if !cancelled.is_empty() {
            tracing::warn!(
                "{} queued hook run(s) cancelled at shutdown (never started)",
                cancelled.len()
            );
        }
        for job in cancelled {
            let o = Outcome::not_run(
                &job.action.id,
                job.action.event,
                OutcomeKind::Cancelled,
                Some(&job.run.msg),
            );
            drop(job);
            tracing::debug!("{}", o.headline());
            sh.feed.publish(&o);
        }
        sh.runner.kill_all.store(true, Ordering::Release);
        sh.runner.exit.store(true, Ordering::Release);
        sh.runner.wake();
        if let Some(h) = threads.runner.take()
            && h.join().is_err()
        {
            tracing::error!("the shell runner thread panicked");
        }
        sh.feed.close();
        if let Some(log) = sh.run_log.get() {
            log.close();
        }
        // Every run is over: its payload file is gone; the directory goes too, and whatever
        // is left in our cgroups is killed with them.
        sh.payload.close();
        if let Ok(Some(c)) = &sh.cgroups {
            c.close();
        }
    }

    /// Ends a shutdown's wait at once (or makes the next shutdown not wait): hooks still
    /// running are killed and counted `killed`, queued ones `cancelled`, as at the deadline.
    /// For a second SIGINT/SIGTERM while `prx-hooks run` drains. Does not block.
    pub fn kill_now(&self) {
        lock(&self.shared.sched).hurry = true;
        self.shared.idle_cv.notify_all();
    }

    fn ensure_started(&self) -> Result<(), String> {
        let mut threads = lock(&self.threads);
        if threads.shut {
            return Err("the shell backend has shut down".into());
        }
        if threads.started {
            return Ok(());
        }
        let sh = self.shared.clone();
        // Queued jobs wait for it; without it they are cancelled at shutdown, counted.
        let runner = std::thread::Builder::new()
            .name("prx-hooks-shell".into())
            .spawn(move || runner_main(sh))
            .map_err(|e| format!("cannot start the shell runner thread: {e}"))?;
        threads.runner = Some(runner);
        threads.started = true;
        Ok(())
    }
}

/// Something `deliver` says after releasing the lock.
enum Note {
    Skipped,
    Dropped(DropReason),
    /// The first queue-full drop of a streak (said once, at warn).
    StreakStart,
    /// Queued again after this many queue-full drops.
    Recovered(u64),
}

/// Options of [`ShellSink::run_matching_with`] and [`ShellSink::run_once_with`].
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Run hooks whatever their matcher (`prx-hooks fire --ignore-matcher`).
    pub ignore_matcher: bool,
}

impl RunOptions {
    /// Options that run hooks whatever their matcher (or not).
    pub fn ignore_matcher(mut self, ignore: bool) -> Self {
        self.ignore_matcher = ignore;
        self
    }
}

impl Drop for ShellSink {
    /// Shuts down with the default 2 s drain if nobody did.
    fn drop(&mut self) {
        self.shutdown(Instant::now() + Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;

    fn action(id: &str, event: EventKind, enabled: bool) -> Arc<Action> {
        Arc::new(Action {
            id: id.into(),
            id_explicit: true,
            event,
            index: 0,
            command: "/bin/true".into(),
            program: Ok("/bin/true".into()),
            args: Vec::new(),
            env: Vec::new(),
            cwd: "/".into(),
            timeout: Duration::from_secs(5),
            timeout_explicit: false,
            stdin_json: false,
            enabled,
            matcher: None,
            max_concurrent: 8,
            limits: HookLimits::default(),
        })
    }

    #[test]
    fn set_table_drives_the_interest_mask() {
        let interest = crate::pipeline::Interest::new(1);
        let sink = ShellSink::new("/".into(), interest.handle(0), ShellLimits::default());
        assert!(!interest.wants(EventKind::ToolCall));
        let table = HookTable {
            enabled: true,
            actions: vec![
                action("on", EventKind::ToolCall, true),
                action("off", EventKind::Error, false),
            ],
            ..HookTable::default()
        };
        sink.set_table(Arc::new(table.clone()));
        assert!(interest.wants(EventKind::ToolCall));
        assert!(
            !interest.wants(EventKind::Error),
            "disabled hooks are not listened for"
        );
        let stats = sink.stats();
        assert_eq!(stats.hooks.len(), 2, "listed before they ever fire");

        let off = HookTable {
            enabled: false,
            ..table.clone()
        };
        sink.set_table(Arc::new(off));
        assert!(!interest.wants(EventKind::ToolCall), "globally disabled");

        sink.set_table(Arc::new(table.clone()));
        sink.shutdown(Instant::now());
        assert!(
            !interest.wants(EventKind::ToolCall),
            "nothing after shutdown"
        );
        sink.set_table(Arc::new(table));
        assert!(
            !interest.wants(EventKind::ToolCall),
            "a reload cannot revive it"
        );
    }

    #[test]
    fn deliver_counts_skips_and_drops_without_spawning_when_closed() {
        let sink = ShellSink::standalone("/".into(), ShellLimits::default());
        sink.set_table(Arc::new(HookTable {
            enabled: true,
            actions: vec![
                action("on", EventKind::TurnComplete, true),
                action("off", EventKind::TurnComplete, false),
            ],
            ..HookTable::default()
        }));
        sink.shutdown(Instant::now());
        let msg = event_message(&crate::Event::TurnComplete, "a", "s", 0);
        sink.deliver(&msg);
        let st = sink.stats();
        assert_eq!(
            (st.totals.sent, st.totals.dropped, st.totals.skipped),
            (1, 1, 1)
        );
        assert!(st.totals.balanced() && sink.counts().balanced());
    }

    /// A test run's origin dropped without a report — as when the runner thread panics and
    /// unwinds its reactor and inbox — still completes the run's future and gives its slot
    /// back (ARCHITECTURE.md § HTTP API: a test request never hangs).
    #[test]
    fn a_test_run_dropped_without_a_report_completes_and_frees_its_slot() {
        let sink = ShellSink::standalone("/".into(), ShellLimits::default());
        let a = action("t", EventKind::TurnComplete, true);
        sink.set_table(Arc::new(HookTable {
            enabled: true,
            actions: vec![a.clone()],
            ..HookTable::default()
        }));
        let msg = event_message(&crate::Event::TurnComplete, "a", "s", 0);
        lock(&sink.shared.sched)
            .try_start_direct(&a.id, a.max_concurrent, sink.shared.max_running)
            .unwrap();
        let (origin, mut once) = OnceRun::pending(&sink.shared, &a, &msg);
        assert_eq!(sink.stats().direct_running, 1);
        drop(origin);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let o = match std::pin::Pin::new(&mut once).poll(&mut cx) {
            std::task::Poll::Ready(o) => o,
            std::task::Poll::Pending => panic!("the run's future never completes"),
        };
        assert_eq!(o.kind, OutcomeKind::Cancelled, "{o:?}");
        assert!(o.direct);
        let st = sink.stats();
        assert_eq!(st.direct_running, 0, "the slot is given back");
        let runs = sink.runs("t");
        assert_eq!(runs.len(), 1, "recorded in the history: {runs:?}");
        sink.shutdown(Instant::now());
    }

    /// A test run whose client left while it waited for the runner is recorded `cancelled`
    /// and never started (the runner checks the flag before spawning).
    #[test]
    fn a_test_run_cancelled_before_the_runner_takes_it_never_starts() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("started");
        let a = Arc::new(Action {
            command: "/bin/sh".into(),
            program: Ok("/bin/sh".into()),
            args: vec!["-c".into(), format!("touch {}", marker.display())],
            ..(*action("t", EventKind::TurnComplete, true)).clone()
        });
        let sink = ShellSink::standalone("/".into(), ShellLimits::default());
        sink.set_table(Arc::new(HookTable {
            enabled: true,
            actions: vec![a.clone()],
            ..HookTable::default()
        }));
        sink.ensure_started().unwrap();
        let msg = event_message(&crate::Event::TurnComplete, "a", "s", 0);
        lock(&sink.shared.sched)
            .try_start_direct(&a.id, a.max_concurrent, sink.shared.max_running)
            .unwrap();
        let (origin, once) = OnceRun::pending(&sink.shared, &a, &msg);
        // The client leaves before the runner has taken the request.
        drop(once);
        sink.shared.to_runner(Direct {
            action: a.clone(),
            origin,
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while sink.stats().direct_running > 0 {
            assert!(Instant::now() < deadline, "the slot was never given back");
            std::thread::sleep(Duration::from_millis(10));
        }
        let runs = sink.runs("t");
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0].kind, OutcomeKind::Cancelled, "{runs:?}");
        sink.shutdown(Instant::now() + Duration::from_secs(5));
        assert!(!marker.exists(), "a cancelled test run was started");
    }

    /// A runner that ended by a panic (a bug) must not leave direct runs waiting for it
    /// forever: its inbox is closed on unwind and later requests are refused at once.
    #[test]
    fn a_run_handed_to_a_runner_that_panicked_is_refused_not_left_waiting() {
        let a = action("t", EventKind::TurnComplete, true);
        let sink = Arc::new(ShellSink::standalone("/".into(), ShellLimits::default()));
        sink.set_table(Arc::new(HookTable {
            enabled: true,
            actions: vec![a.clone()],
            ..HookTable::default()
        }));
        sink.ensure_started().unwrap();
        sink.shared.runner.panic.store(true, Ordering::Relaxed);
        sink.shared.runner.wake();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !lock(&sink.threads)
            .runner
            .as_ref()
            .is_some_and(|r| r.is_finished())
        {
            assert!(Instant::now() < deadline, "the runner did not panic");
            std::thread::sleep(Duration::from_millis(5));
        }
        let msg = event_message(&crate::Event::TurnComplete, "a", "s", 0);
        let (tx, rx) = std::sync::mpsc::channel();
        // Detached: on the old code it never returns, and the test must fail, not hang.
        let waiting = sink.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiting.run_once(&a, &msg));
        });
        let o = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("run_once waited for a runner that is gone");
        assert_eq!(o.kind, OutcomeKind::Cancelled, "{o}");
        assert_eq!(sink.stats().direct_running, 0);
        sink.shutdown(Instant::now() + Duration::from_secs(5));
    }
}
