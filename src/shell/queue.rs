//! Per-hook bounded queues, the limits on running processes, counters and run history — all
//! behind one small lock ([`Sched`]), so that every counter change is one step and a snapshot
//! always satisfies `sent = finished + dropped + cancelled + running + queued`.
//!
//! Who takes the lock: `deliver` once per event (for all of that event's hooks together), the
//! runner once per job it starts and once per process it reaps, and readers of stats.
//! Nobody does I/O, spawns, or frees a payload file while holding it.

use super::outcome::{HookCounts, Outcome};
use super::payload::EventRun;
use crate::config::Action;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

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
    next_seq: u64,
    /// The runner found nothing to start and is about to sleep in `poll`: whoever queues a
    /// job clears this and wakes it (only then — a busy runner is not woken per event).
    pub(crate) runner_idle: bool,
    /// Shutdown has begun: `deliver` drops, the runner still starts what is queued.
    pub(crate) closing: bool,
    /// The shutdown deadline has passed: start nothing more.
    pub(crate) stop_spawning: bool,
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

    /// Offers one job to its hook's queue: `true` if queued, `false` if dropped. Either way it
    /// is counted as sent.
    pub(crate) fn offer(&mut self, action: &Arc<Action>, run: &Arc<EventRun>, cap: usize) -> bool {
        let seq = self.next_seq;
        let closing = self.closing;
        let h = self.hook(&action.id);
        h.counts.sent += 1;
        let queued = !closing && h.queue.len() < cap;
        if queued {
            h.queue.push_back(Job {
                action: action.clone(),
                run: run.clone(),
                seq,
            });
            h.counts.queued += 1;
        } else {
            h.counts.dropped += 1;
        }
        self.totals.sent += 1;
        if queued {
            self.totals.queued += 1;
            self.next_seq += 1;
        } else {
            self.totals.dropped += 1;
        }
        queued
    }

    /// Takes the oldest job whose hook is under its `max_concurrent`, if fewer than
    /// `max_running` processes run (direct runs included); it moves from queued to running.
    pub(crate) fn pick(&mut self, max_running: usize) -> Option<Job> {
        if self.stop_spawning || self.totals.running + self.direct_running >= max_running as u64 {
            return None;
        }
        let mut best: Option<(&str, u64)> = None;
        for (id, h) in &self.hooks {
            if let Some(front) = h.queue.front()
                && h.counts.running + h.direct < front.action.max_concurrent.max(1) as u64
                && best.is_none_or(|(_, s)| front.seq < s)
            {
                best = Some((id, front.seq));
            }
        }
        let id = best?.0.to_string();
        let h = self.hooks.get_mut(&id)?;
        let job = h.queue.pop_front()?;
        h.counts.queued -= 1;
        h.counts.running += 1;
        self.totals.queued -= 1;
        self.totals.running += 1;
        Some(job)
    }

    /// Counts a finished pipeline run and keeps its outcome in the hook's history.
    pub(crate) fn finish(&mut self, outcome: Outcome, history: usize) {
        self.totals.finish(&outcome.kind);
        let h = self.hook(&outcome.id);
        h.counts.finish(&outcome.kind);
        push_run(h, outcome, history);
    }

    /// A direct run of hook `id` starts (unconditionally: `run_once`, `fire`).
    pub(crate) fn start_direct(&mut self, id: &str) {
        self.direct_running += 1;
        self.hook(id).direct += 1;
    }

    /// A direct run of hook `id` starts if the hook is under `max_concurrent` and fewer than
    /// `max_running` processes run (test runs through the API).
    pub(crate) fn try_start_direct(
        &mut self,
        id: &str,
        max_concurrent: usize,
        max_running: usize,
    ) -> Result<(), super::Busy> {
        if self.totals.running + self.direct_running >= max_running as u64 {
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
