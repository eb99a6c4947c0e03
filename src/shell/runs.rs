//! The one hook point for finished runs: every [`Outcome`] the shell backend produces — a
//! process that ran (ok, exit, signal, timed out, killed), a spawn that failed, and the runs
//! that never happened (skipped, dropped, cancelled) — is offered to each subscription made
//! with [`ShellSink::subscribe_runs`](super::ShellSink::subscribe_runs).
//!
//! Built like the bus's subscriber queues, and deliberately *not* on the bus (a plugin
//! subscribed to `*` must not see the hooks' runs):
//!
//! * **bounded**: each subscription has its own queue of `capacity` outcomes;
//! * **never blocks the producer**: the runner thread (and, for skipped and dropped runs, the
//!   pipeline worker) only `try_send`s; a full queue drops the outcome for that subscription
//!   and counts it ([`RunSubscription::dropped`]);
//! * **costs nothing without subscribers**: outcomes of runs that never happened are only
//!   built when someone listens (or logging wants them);
//! * a subscription ends when it is dropped (its queue goes with it), or when the sink shuts
//!   down (receivers then read what is left and see the end).

use super::outcome::{Outcome, RunFeedStats};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default capacity of a run subscription's queue.
pub const DEFAULT_RUN_QUEUE: usize = 1024;

/// A subscription to finished runs. Read it with [`recv`](Self::recv),
/// [`recv_timeout`](Self::recv_timeout), [`try_recv`](Self::try_recv) or as an iterator;
/// outcomes arrive in the order they were produced for each producing thread.
pub struct RunSubscription {
    rx: flume::Receiver<Arc<Outcome>>,
    slot: Arc<Slot>,
}

/// A subscription's counters, shared by both sides.
struct Slot {
    delivered: AtomicU64,
    dropped: AtomicU64,
    capacity: usize,
}

/// The feed's side of a subscription: the only sender, so closing the feed (or dropping the
/// registration) ends the subscription.
struct Registration {
    tx: flume::Sender<Arc<Outcome>>,
    slot: Arc<Slot>,
}

impl RunSubscription {
    /// The next outcome; `None` once the sink has shut down and everything queued was read.
    pub fn recv(&self) -> Option<Arc<Outcome>> {
        self.rx.recv().ok()
    }

    /// The next outcome, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Arc<Outcome>> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// The next outcome if one is queued.
    pub fn try_recv(&self) -> Option<Arc<Outcome>> {
        self.rx.try_recv().ok()
    }

    /// Every queued outcome, without waiting.
    pub fn try_iter(&self) -> impl Iterator<Item = Arc<Outcome>> + '_ {
        self.rx.try_iter()
    }

    /// Outcomes queued for this subscription.
    pub fn delivered(&self) -> u64 {
        self.slot.delivered.load(Ordering::Relaxed)
    }

    /// Outcomes this subscription missed because its queue was full.
    pub fn dropped(&self) -> u64 {
        self.slot.dropped.load(Ordering::Relaxed)
    }

    /// Outcomes waiting to be read.
    pub fn queued(&self) -> usize {
        self.rx.len()
    }

    /// The most outcomes the queue holds; past that, new ones are dropped and counted.
    pub fn capacity(&self) -> usize {
        self.slot.capacity
    }

    /// The queue's receiving end, for a reader that waits on several queues at once (the HTTP
    /// event stream's hub).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn receiver(&self) -> &flume::Receiver<Arc<Outcome>> {
        &self.rx
    }
}

impl Iterator for RunSubscription {
    type Item = Arc<Outcome>;
    fn next(&mut self) -> Option<Arc<Outcome>> {
        self.recv()
    }
}

impl std::fmt::Debug for RunSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSubscription")
            .field("queued", &self.queued())
            .field("capacity", &self.capacity())
            .field("delivered", &self.delivered())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// The publishing side, owned by the sink.
#[derive(Default)]
pub(crate) struct RunFeed {
    regs: Mutex<Vec<Registration>>,
    /// `regs.len()`, readable without the lock: the producers' "anyone listening?" check.
    live: AtomicUsize,
    /// Outcomes dropped for subscriptions since gone (their own counters went with them).
    dropped_gone: AtomicU64,
    closed: std::sync::atomic::AtomicBool,
}

impl RunFeed {
    pub(crate) fn subscribe(&self, capacity: usize) -> RunSubscription {
        let capacity = capacity.max(1);
        let (tx, rx) = flume::bounded(capacity);
        let slot = Arc::new(Slot {
            delivered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            capacity,
        });
        let mut regs = lock(&self.regs);
        // After shutdown nothing is registered: `tx` drops here and `recv` sees the end.
        if !self.closed.load(Ordering::Acquire) {
            regs.push(Registration {
                tx,
                slot: slot.clone(),
            });
            self.live.store(regs.len(), Ordering::Release);
        }
        RunSubscription { rx, slot }
    }

    /// Whether any subscription is live (a hint: racy by nature, and only used to skip
    /// building outcomes nobody would read).
    pub(crate) fn active(&self) -> bool {
        self.live.load(Ordering::Acquire) > 0
    }

    /// Offers `o` to every subscription without blocking; a full queue drops it (counted) and
    /// a subscription whose receiver is gone is removed.
    pub(crate) fn publish(&self, o: &Outcome) {
        if !self.active() {
            return;
        }
        let o = Arc::new(o.clone());
        let mut regs = lock(&self.regs);
        regs.retain(|r| match r.tx.try_send(o.clone()) {
            Ok(()) => {
                r.slot.delivered.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(flume::TrySendError::Full(_)) => {
                r.slot.dropped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(flume::TrySendError::Disconnected(_)) => {
                self.dropped_gone
                    .fetch_add(r.slot.dropped.load(Ordering::Relaxed), Ordering::Relaxed);
                false
            }
        });
        self.live.store(regs.len(), Ordering::Release);
    }

    /// Shutdown: every subscription sees the end once it has read what is queued.
    pub(crate) fn close(&self) {
        let mut regs = lock(&self.regs);
        self.closed.store(true, Ordering::Release);
        for r in regs.drain(..) {
            self.dropped_gone
                .fetch_add(r.slot.dropped.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.live.store(0, Ordering::Release);
    }

    pub(crate) fn stats(&self) -> RunFeedStats {
        let regs = lock(&self.regs);
        RunFeedStats {
            subscribers: regs.iter().filter(|r| !r.tx.is_disconnected()).count() as u64,
            dropped: self.dropped_gone.load(Ordering::Relaxed)
                + regs
                    .iter()
                    .map(|r| r.slot.dropped.load(Ordering::Relaxed))
                    .sum::<u64>(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
