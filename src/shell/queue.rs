//! Per-hook bounded queues, the limits on running processes, counters and run history — all
//! behind one small lock ([`Sched`]), so that every counter change is one step and a snapshot
//! always satisfies `sent = finished + dropped + cancelled + running + queued`.
//!
//! **Scheduling** ([`Sched::pick`]): every hook with queued work is guaranteed one running
//! process — its *reserved* slot, which the global cap does not count — so hooks that hold
//! every shared slot for minutes (8 hooks sleeping 20 s, 8 processes each) cannot starve a fast
//! one. `max_running` caps the *shared* slots: the processes a hook runs beyond its first (up
//! to its `max_concurrent`). Invariants, under the lock:
//!
//! * `shared_running == Σ max(running − 1, 0)` over the hooks, and `shared_running ≤
//!   max_running` (a hook's first process never counts, so at most `max_running + hooks with
//!   work` processes run);
//! * a hook whose queue is non-empty and that runs nothing is started before any shared slot
//!   is handed out (oldest job first among such hooks);
//! * shared slots go to the hook running the fewest processes, then to the oldest job.
//!
//! Direct runs (`run_once`, `run_matching`, test runs through the API) are not jobs: they
//! count in their hook's `max_concurrent` (a hook whose direct runs fill it starts no pipeline
//! job, reserved slot included) and take shared slots (`shared_running + direct_running ≤
//! max_running` when a test run is admitted; `run_once` and `fire` are never refused).
//!
//! Who takes the lock: `deliver` once per event (for all of that event's hooks together), the
//! runner once per job it starts and once per process it reaps, and readers of stats.
//! Nobody does I/O, spawns, or frees a payload file while holding it.

use super::outcome::{DropReason, HookCounts, Outcome};
use super::payload::EventRun;
use crate::config::Action;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// What became of a job offered to a hook's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Queued; `after_drops`: the queue-full drops of the streak this ends (0: none).
    Queued { after_drops: u64 },
    /// Dropped; `first`: the first queue-full drop since the hook last queued a job.
    Dropped { why: DropReason, first: bool },
}

/// One (event, hook) run waiting for, or holding, a process slot.
pub(crate) struct Job {
    pub(crate) action: Arc<Action>,
    pub(crate) run: Arc<EventRun>,
    /// Global enqueue order: the runner starts the oldest startable job first.
    pub(crate) seq: u64,
}

/// One hook's queue, counters and history.
#[derive(Default)]
pub(crate) struct HookState {
    pub(crate) queue: VecDeque<Job>,
    pub(crate) counts: HookCounts,
    pub(crate) runs: VecDeque<Outcome>,
    /// In the current table (hooks removed by a reload are forgotten once idle).
    pub(crate) in_table: bool,
    /// Queue-full drops since the hook last queued a job (the streak said once).
    pub(crate) drop_streak: u64,
    /// Direct runs (`run_once`, test runs) of this hook running now: they count in its
    /// `max_concurrent` like pipeline runs (but not in its counters).
    pub(crate) direct: u64,
}

/// Everything the lock protects.
#[derive(Default)]
pub(crate) struct Sched {
    pub(crate) hooks: HashMap<String, HookState>,
    pub(crate) totals: HookCounts,
    /// Processes started by `run_once` / `run_matching` and not yet reaped.
    pub(crate) direct_running: u64,
    /// Pipeline processes beyond each hook's first: what `max_running` caps.
    pub(crate) shared_running: u64,
    next_seq: u64,
    /// The runner found nothing to start and is about to sleep in `poll`: whoever queues a
    /// job clears this and wakes it (only then — a busy runner is not woken per event).
    pub(crate) runner_idle: bool,
    /// Shutdown has begun: `deliver` drops, the runner still starts what is queued.
    pub(crate) closing: bool,
    /// The shutdown deadline has passed: start nothing more.
    pub(crate) stop_spawning: bool,
    /// [`ShellSink::kill_now`](super::ShellSink::kill_now): shutdown does not wait at all.
    pub(crate) hurry: bool,
}

impl Sched {
    pub(crate) fn hook(&mut self, id: &str) -> &mut HookState {
        if !self.hooks.contains_key(id) {
            self.hooks.insert(id.to_string(), HookState::default());
        }
        self.hooks.get_mut(id).expect("just inserted")
    }

    /// Counts one skipped (event, hook) pair.
    pub(crate) fn skip(&mut self, id: &str) {
        self.hook(id).counts.skipped += 1;
        self.totals.skipped += 1;
    }

    /// Offers one job to its hook's queue. Either way it is counted as sent; a dropped job is
    /// counted under its reason.
    pub(crate) fn offer(&mut self, action: &Arc<Action>, run: &Arc<EventRun>, cap: usize) -> Offer {
        let seq = self.next_seq;
        let closing = self.closing;
        let h = self.hook(&action.id);
        h.counts.sent += 1;
        let offer = if closing {
            Offer::Dropped {
                why: DropReason::Shutdown,
                first: false,
            }
        } else if h.queue.len() >= cap {
            h.drop_streak += 1;
            Offer::Dropped {
                why: DropReason::QueueFull,
                first: h.drop_streak == 1,
            }
        } else {
            Offer::Queued {
                after_drops: std::mem::take(&mut h.drop_streak),
            }
        };
        match offer {
            Offer::Queued { .. } => {
                h.queue.push_back(Job {
                    action: action.clone(),
                    run: run.clone(),
                    seq,
                });
                h.counts.queued += 1;
            }
            Offer::Dropped { why, .. } => h.counts.drop(why),
        }
        self.totals.sent += 1;
        match offer {
            Offer::Queued { .. } => {
                self.totals.queued += 1;
                self.next_seq += 1;
            }
            Offer::Dropped { why, .. } => self.totals.drop(why),
        }
        offer
    }

    /// Takes the next job to start, if one may start now (module docs § Scheduling): first a
    /// hook with queued work and nothing running (its reserved slot, outside the cap), oldest
    /// job first; else, while fewer than `max_running` shared slots are taken (direct runs
    /// count among them), the hook under its `max_concurrent` that runs the fewest processes,
    /// oldest job first. A hook's direct runs count in its `max_concurrent`, reserved slot
    /// included. The job moves from queued to running.
    pub(crate) fn pick(&mut self, max_running: usize) -> Option<Job> {
        if self.stop_spawning || self.totals.queued == 0 {
            return None;
        }
        let shared_free = self.shared_running + self.direct_running < max_running as u64;
        // (reserved?, running, seq): the smallest key wins; reserved sorts first.
        let mut best: Option<(&str, (bool, u64, u64))> = None;
        for (id, h) in &self.hooks {
            let Some(front) = h.queue.front() else {
                continue;
            };
            let running = h.counts.running;
            if running + h.direct >= front.action.max_concurrent.max(1) as u64 {
                continue;
            }
            let reserved = running == 0;
            if !reserved && !shared_free {
                continue;
            }
            let key = (!reserved, running + h.direct, front.seq);
            if best.is_none_or(|(_, k)| key < k) {
                best = Some((id, key));
            }
        }
        let id = best?.0.to_string();
        let h = self.hooks.get_mut(&id)?;
        let job = h.queue.pop_front()?;
        if h.counts.running > 0 {
            self.shared_running += 1;
        }
        h.counts.queued -= 1;
        h.counts.running += 1;
        self.totals.queued -= 1;
        self.totals.running += 1;
        Some(job)
    }

    /// A job just picked did not start after all (its event's partition lease was lost):
    /// counted as cancelled instead of running.
    pub(crate) fn fenced(&mut self, id: &str) {
        let h = self.hook(id);
        let was_shared = h.counts.running > 1;
        h.counts.running -= 1;
        h.counts.cancelled += 1;
        if was_shared {
            self.shared_running -= 1;
        }
        self.totals.running -= 1;
        self.totals.cancelled += 1;
    }

    /// Counts a finished pipeline run and keeps its outcome in the hook's history.
    pub(crate) fn finish(&mut self, outcome: Outcome, history: usize) {
        self.totals.finish(&outcome.kind);
        let h = self.hook(&outcome.id);
        let was_shared = h.counts.running > 1;
        h.counts.finish(&outcome.kind);
        push_run(h, outcome, history);
        if was_shared {
            self.shared_running -= 1;
        }
    }

    /// A direct run of hook `id` starts (unconditionally: `run_once`, `fire`).
    pub(crate) fn start_direct(&mut self, id: &str) {
        self.direct_running += 1;
        self.hook(id).direct += 1;
    }

    /// A direct run of hook `id` starts if the hook runs fewer than `max_concurrent` processes
    /// (pipeline and direct) and a shared slot is free (test runs through the API).
    pub(crate) fn try_start_direct(
        &mut self,
        id: &str,
        max_concurrent: usize,
        max_running: usize,
    ) -> Result<(), super::Busy> {
        if self.shared_running + self.direct_running >= max_running as u64 {
            return Err(super::Busy::Backend { limit: max_running });
        }
        let h = self.hook(id);
        if h.counts.running + h.direct >= max_concurrent.max(1) as u64 {
            return Err(super::Busy::Hook {
                id: id.to_string(),
                limit: max_concurrent.max(1),
            });
        }
        self.start_direct(id);
        Ok(())
    }

    /// Keeps the outcome of a direct run (`run_once`) in the hook's history (not counted).
    pub(crate) fn record_direct(&mut self, outcome: Outcome, history: usize) {
        self.direct_running -= 1;
        let h = self.hook(&outcome.id);
        h.direct = h.direct.saturating_sub(1);
        push_run(h, outcome, history);
    }

    /// Keeps a run read back from the run log in its hook's history (not counted).
    pub(crate) fn record_loaded(&mut self, outcome: Outcome, history: usize) {
        push_run(self.hook(&outcome.id), outcome, history);
    }

    /// Shutdown past the deadline: every queued job is cancelled. Returns them, for the caller
    /// to drop outside the lock (dropping may remove payload files).
    pub(crate) fn cancel_all(&mut self) -> Vec<Job> {
        let mut out = Vec::new();
        for h in self.hooks.values_mut() {
            let n = h.queue.len() as u64;
            h.counts.queued -= n;
            h.counts.cancelled += n;
            self.totals.queued -= n;
            self.totals.cancelled += n;
            out.extend(h.queue.drain(..));
        }
        // Not run: an event consumed from NATS is then not acked (`crate::settle`).
        for j in &out {
            j.run.mark_dropped();
        }
        out
    }

    /// A new table: its hooks get entries (so stats list them before they ever fire); hooks no
    /// longer in it are forgotten once nothing of theirs is queued or running.
    pub(crate) fn set_table(&mut self, ids: impl Iterator<Item = String>) {
        for h in self.hooks.values_mut() {
            h.in_table = false;
        }
        for id in ids {
            self.hook(&id).in_table = true;
        }
        self.hooks
            .retain(|_, h| h.in_table || h.counts.running + h.counts.queued + h.direct > 0);
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.totals.running + self.totals.queued
    }
}

fn push_run(h: &mut HookState, outcome: Outcome, history: usize) {
    if history == 0 {
        return;
    }
    while h.runs.len() >= history {
        h.runs.pop_front();
    }
    h.runs.push_back(outcome);
}
