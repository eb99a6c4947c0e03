//! The runner thread: spawns queued and direct runs, waits on their pidfds, kills them at
//! their deadlines and reports what finished (ARCHITECTURE.md § Shell hooks).

use super::*;

impl RunnerLink {
    pub(super) fn wake(&self) {
        if let Some(fd) = &self.wake {
            reactor::signal_eventfd(fd.as_raw_fd());
        }
    }

    /// What a start record's answer calls: it wakes the runner (which polls on a short tick
    /// without an eventfd).
    pub(super) fn waker(wake: Option<Arc<OwnedFd>>) -> crate::settle::Wake {
        Arc::new(move || {
            if let Some(fd) = &wake {
                reactor::signal_eventfd(fd.as_raw_fd());
            }
        })
    }
}

impl Shared {
    /// Hands a direct run to the runner, which spawns it.
    pub(super) fn to_runner(&self, d: Direct) {
        let mut inbox = lock(&self.runner.inbox);
        if inbox.closed {
            // Only possible for a run_once racing shutdown.
            drop(inbox);
            d.origin.not_run(self, &d.action, OutcomeKind::Cancelled);
            return;
        }
        inbox.requests.push(d);
        drop(inbox);
        self.runner.wake();
    }

    /// Spawns `action` for `run` with everything it is owed: its environment, limits, cgroup.
    pub(super) fn spawn(&self, action: &Action, run: &EventRun) -> Result<Spawned, String> {
        let opts = self.opts.as_ref().map_err(Clone::clone)?;
        let env = env::ChildEnv::for_run(action, run)?;
        let limits = effective_limits(&self.hook_limits, &action.limits);
        let rlimits = merged_rlimits(self.rlimits, &limits).list();
        let cgroup_limits = CgroupLimits {
            memory_bytes: limits.memory_bytes,
            processes: limits.processes,
        };
        let mut cg = match &self.cgroups {
            Err(e) => return Err(e.clone()),
            Ok(Some(c)) => Some(c.run(&action.id, cgroup_limits)?),
            Ok(None) => {
                if let Some((what, _)) = [
                    ("memory_bytes", cgroup_limits.memory_bytes),
                    ("processes", cgroup_limits.processes),
                ]
                .into_iter()
                .find(|(_, v)| v.is_some())
                {
                    return Err(format!(
                        "{what} needs a delegated cgroup v2 and none is in use ({}); not run",
                        match &self.cgroup_status {
                            CgroupStatus::Unavailable { reason } => reason.as_str(),
                            _ => "cgroups are off",
                        }
                    ));
                }
                None
            }
        };
        let req = spawn::Request {
            env: &env,
            rlimits: &rlimits,
            cgroup_procs: cg.as_ref().and_then(|c| c.procs_fd()),
            capture_stdout: false,
        };
        match spawn::spawn(action, &req, opts) {
            Ok(sp) => {
                if let Some(c) = cg.as_mut() {
                    c.spawned();
                }
                Ok(Spawned { sp, cgroup: cg })
            }
            Err(e) => {
                if let Some(c) = &cg {
                    c.remove();
                }
                Err(e)
            }
        }
    }
}

/// A started process and its run's cgroup.
pub(super) struct Spawned {
    pub(super) sp: spawn::Spawned,
    pub(super) cgroup: Option<cgroup::RunCgroup>,
}

/// The cgroups a sink uses, from its limits: an explicit directory (which must work), this
/// process's own when detection is on (which may not), or none.
pub(super) fn cgroups_for(limits: &ShellLimits) -> (Result<Option<Cgroups>, String>, CgroupStatus) {
    let (base, required) = match (&limits.cgroup, limits.detect_cgroup) {
        (Some(dir), _) => (Ok(dir.clone()), true),
        (None, true) => (cgroup::detect(), false),
        (None, false) => return (Ok(None), CgroupStatus::Off),
    };
    match base.and_then(|b| Cgroups::create(&b)) {
        Ok(c) => {
            let status = c.status();
            (Ok(Some(c)), status)
        }
        Err(reason) if required => {
            tracing::error!("{reason}; every hook will fail to spawn until this is fixed");
            (Err(reason.clone()), CgroupStatus::Failed { reason })
        }
        Err(reason) => {
            tracing::info!("shell hooks run without a cgroup: {reason}");
            (Ok(None), CgroupStatus::Unavailable { reason })
        }
    }
}

/// A hook's limits: its own, else the sink's defaults, field by field.
pub(super) fn effective_limits(defaults: &HookLimits, own: &HookLimits) -> HookLimits {
    HookLimits {
        cpu_seconds: own.cpu_seconds.or(defaults.cpu_seconds),
        open_files: own.open_files.or(defaults.open_files),
        core_bytes: own.core_bytes.or(defaults.core_bytes),
        file_size_bytes: own.file_size_bytes.or(defaults.file_size_bytes),
        memory_bytes: own.memory_bytes.or(defaults.memory_bytes),
        processes: own.processes.or(defaults.processes),
    }
}

/// The rlimits of a hook: `ShellLimits::rlimits`, with the hook's limits over them.
pub(super) fn merged_rlimits(base: Rlimits, l: &HookLimits) -> Rlimits {
    Rlimits {
        cpu_seconds: l.cpu_seconds.or(base.cpu_seconds),
        open_files: l.open_files.or(base.open_files),
        core_bytes: l.core_bytes.or(base.core_bytes),
        file_size_bytes: l.file_size_bytes.or(base.file_size_bytes),
        ..base
    }
}

/// Starts one queued job; a failed spawn is counted at once. A job whose event's start record
/// is being written waits (`RunnerLink::waiting`) without holding the runner.
pub(super) fn start(sh: &Shared, job: Job, reactor: &mut Reactor<Origin>) {
    // A consumed event whose partition lease this host lost (or let go stale) since it was
    // handed over, or whose start the shared de-dup bucket refused (another host took it), is
    // not run here; its ticket says dropped, so the message is nak'ed and delivered again (to
    // the partition's holder): docs/nats.md § Per-agent order across hosts, § Several central
    // hosts.
    let admission = job.run.msg.admission(&sh.runner.waker);
    if admission == crate::settle::Admission::Pending {
        lock(&sh.runner.waiting).push(job);
        return;
    }
    if admission == crate::settle::Admission::No {
        refuse(sh, job);
        return;
    }
    match sh.spawn(&job.action, &job.run) {
        Ok(Spawned { sp, cgroup }) => {
            let (timeout, msg) = (job.action.timeout, job.run.msg.clone());
            reactor.add(Proc::new(sp, timeout, msg, cgroup, Origin::Queue(job)));
        }
        Err(reason) => {
            let action = job.action.clone();
            Origin::Queue(job).not_run(sh, &action, OutcomeKind::SpawnFailed { reason });
        }
    }
}

/// The jobs waiting for their start records, asked again: started, refused, or waiting on;
/// past the shutdown deadline (`killing`), refused.
fn start_waiting(sh: &Shared, killing: bool, reactor: &mut Reactor<Origin>) {
    let waiting = std::mem::take(&mut *lock(&sh.runner.waiting));
    for job in waiting {
        if killing {
            refuse(sh, job);
        } else {
            start(sh, job, reactor);
        }
    }
}

/// A picked job not run: its ticket marked dropped, counted cancelled.
fn refuse(sh: &Shared, job: Job) {
    {
        job.run.mark_dropped();
        let action = job.action.clone();
        let o = Outcome::not_run(
            &action.id,
            action.event,
            OutcomeKind::Cancelled,
            Some(&job.run.msg),
        );
        drop(job);
        conclude(sh, &o);
        let mut s = lock(&sh.sched);
        s.fenced(&action.id);
        notify_drained(sh, &s);
    }
}

/// Starts one direct run (on the runner thread, like every spawn).
pub(super) fn start_direct(sh: &Shared, d: Direct, reactor: &mut Reactor<Origin>) {
    let Direct { action, origin } = d;
    let run = match &origin {
        Origin::Direct { run, .. } | Origin::Once { run, .. } => run.clone(),
        Origin::Queue(job) => job.run.clone(),
    };
    match sh.spawn(&action, &run) {
        Ok(Spawned { sp, cgroup }) => {
            reactor.add(Proc::new(
                sp,
                action.timeout,
                run.msg.clone(),
                cgroup,
                origin,
            ));
        }
        Err(reason) => {
            drop(run);
            origin.not_run(sh, &action, OutcomeKind::SpawnFailed { reason });
        }
    }
}

/// Closes the runner's inbox when the runner ends, and refuses (`cancelled`) whatever still waits
/// in it. After a normal exit the inbox is already closed and empty; after a panic (a bug) no
/// direct or test run keeps waiting for a runner that is gone, and later ones are refused at once.
pub(super) struct InboxGuard<'a>(&'a Shared);

impl Drop for InboxGuard<'_> {
    fn drop(&mut self) {
        let requests = {
            let mut inbox = lock(&self.0.runner.inbox);
            inbox.closed = true;
            std::mem::take(&mut inbox.requests)
        };
        for Direct { action, origin } in requests {
            origin.not_run(self.0, &action, OutcomeKind::Cancelled);
        }
    }
}

/// Wakes a waiting shutdown once everything has drained.
pub(super) fn notify_drained(sh: &Shared, s: &Sched) {
    if s.closing && s.in_flight() + s.direct_running == 0 {
        sh.idle_cv.notify_all();
    }
}

/// The runner thread: starts queued jobs, waits for processes, kills overdue groups, reaps,
/// counts. Runs until shutdown has killed and reaped everything.
pub(super) fn runner_main(sh: Arc<Shared>) {
    let _refuse_on_unwind = InboxGuard(&sh);
    reactor::block_sigpipe();
    let link = &sh.runner;
    let wake = link.wake.as_ref().map(|fd| fd.as_raw_fd());
    let mut reactor: Reactor<Origin> = Reactor::default();
    let mut done = Vec::new();
    let mut killing_since: Option<Instant> = None;
    loop {
        #[cfg(test)]
        if link.panic.load(Ordering::Relaxed) {
            panic!("the shell runner panics (asked by a test)");
        }
        let killing = link.kill_all.load(Ordering::Acquire);
        start_waiting(&sh, killing, &mut reactor);
        start_queued(&sh, &mut reactor, &mut done);
        let waiting = !lock(&link.waiting).is_empty();
        let requests = {
            let mut inbox = lock(&link.inbox);
            if link.exit.load(Ordering::Acquire)
                && inbox.requests.is_empty()
                && reactor.is_empty()
                && !waiting
            {
                inbox.closed = true;
                return;
            }
            std::mem::take(&mut inbox.requests)
        };
        start_requests(&sh, requests, killing, &mut reactor);
        // A test run dropped before its outcome: its flag is set before `cancel`, and every
        // request taken above was either refused or is in the reactor now, so none is missed.
        if link.cancel.swap(false, Ordering::AcqRel) {
            reactor.kill_where(Origin::cancelled);
        }
        if killing {
            reactor.kill_all();
            let since = *killing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= KILL_GRACE && !reactor.is_empty() {
                give_up_stuck(&sh, &mut reactor);
                continue;
            }
        }
        // About to sleep: say so, unless a job became startable meanwhile. `deliver` clears
        // the flag and writes the eventfd, which stays readable until the poll below drains it,
        // so no wake-up is lost between here and the poll.
        {
            let mut s = lock(&sh.sched);
            match s.pick(sh.max_running) {
                Some(job) => {
                    drop(s);
                    start(&sh, job, &mut reactor);
                    continue;
                }
                None => s.runner_idle = true,
            }
        }
        // With kill_all set, poll on a short tick: the killed processes go in milliseconds.
        // A job waiting for its start record is asked again at least every WAITING_TICK (its
        // partition lease may go meanwhile; the answer wakes the runner before that).
        let waiting = !lock(&link.waiting).is_empty();
        let cap = match (killing_since, wake) {
            (Some(_), _) => Some(Duration::from_millis(10)),
            (None, None) => Some(NO_WAKE_TICK),
            (None, Some(_)) if waiting => Some(WAITING_TICK),
            (None, Some(_)) => None,
        };
        reactor.turn(wake, cap, &mut done);
        lock(&sh.sched).runner_idle = false;
        done.drain(..).for_each(|f| report(&sh, f));
    }
}

/// How often a job waiting for its start record is asked again, at most, when nothing wakes
/// the runner.
const WAITING_TICK: Duration = Duration::from_millis(100);

/// Starts everything that may start now; between batches, reaps without waiting so that
/// finished hooks free their slots.
fn start_queued(sh: &Shared, reactor: &mut Reactor<Origin>, done: &mut Vec<Finished<Origin>>) {
    let mut started = 0;
    loop {
        // (A statement of its own: the guard must not live on into `start`.)
        let job = lock(&sh.sched).pick(sh.max_running);
        let Some(job) = job else { break };
        start(sh, job, reactor);
        started += 1;
        if started % SPAWN_BATCH == 0 {
            reactor.turn(None, Some(Duration::ZERO), done);
            done.drain(..).for_each(|f| report(sh, f));
        }
    }
}

/// Starts the direct runs taken from the inbox, or refuses them (shutting down, or their
/// client left).
fn start_requests(
    sh: &Shared,
    requests: Vec<Direct>,
    killing: bool,
    reactor: &mut Reactor<Origin>,
) {
    for d in requests {
        if killing || d.origin.cancelled() {
            // Past the shutdown deadline, or a test run whose client left while it waited
            // here: never started.
            let Direct { action, origin } = d;
            origin.not_run(sh, &action, OutcomeKind::Cancelled);
        } else {
            start_direct(sh, d, reactor);
        }
    }
}

/// Whatever did not die within the grace is stuck in the kernel: counts it as killed now (the
/// shutdown contract's deadline) and reaps it when it can be, on a detached thread.
fn give_up_stuck(sh: &Shared, reactor: &mut Reactor<Origin>) {
    let left = reactor.take_all();
    if !left.is_empty() {
        tracing::error!(
            "{} hook process(es) survived SIGKILL for {KILL_GRACE:?} (uninterruptible sleep?); counted as killed, a detached thread reaps them",
            left.len()
        );
    }
    let mut unreaped = Vec::new();
    for p in left {
        let (f, u) = reactor::finish_unreaped(p);
        report(sh, f);
        unreaped.push(u);
    }
    if !unreaped.is_empty() {
        let _ = std::thread::Builder::new()
            .name("prx-hooks-shell-last-reaper".into())
            .spawn(move || unreaped.into_iter().for_each(reactor::Unreaped::reap));
    }
}

/// Counts and records a reaped process. The job (and with it possibly the event's payload
/// file) is dropped first, so once the counters say a hook finished, its file is gone if it was
/// the event's last hook.
pub(super) fn report(sh: &Shared, f: Finished<Origin>) {
    let Finished {
        kind,
        duration,
        pid,
        started_at,
        stderr_tail,
        tag,
    } = f;
    let outcome = |id: &str, event, msg: &Message, direct| Outcome {
        id: id.to_string(),
        event,
        seq: msg.seq(),
        agent: msg.agent().to_string(),
        session: msg.session().to_string(),
        direct,
        kind,
        duration,
        stderr_tail,
        pid: Some(pid),
        started_at,
    };
    match tag {
        Origin::Queue(job) => {
            let o = outcome(&job.action.id, job.action.event, &job.run.msg, false);
            drop(job);
            conclude(sh, &o);
            sh.keep_run(&o);
            let mut s = lock(&sh.sched);
            s.finish(o, sh.history);
            notify_drained(sh, &s);
        }
        Origin::Direct {
            id,
            event,
            run,
            reply,
            index,
        } => {
            let o = outcome(&id, event, &run.msg, true);
            drop(run);
            let _ = reply.send((index, finish_direct(sh, o)));
        }
        Origin::Once {
            id,
            event,
            run,
            slot,
        } => {
            let o = outcome(&id, event, &run.msg, true);
            drop(run);
            slot.complete(finish_direct(sh, o));
        }
    }
}
