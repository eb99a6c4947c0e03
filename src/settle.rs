//! What a consumed event carries beside the bus's own fields (ARCHITECTURE.md § NATS bridge,
//! "Acks after the hooks ran"): the agent's own timestamp and sequence number, and a
//! [`Ticket`] that tells the NATS consumer when every hook the event was handed to has settled
//! it and whether one of them dropped it.
//!
//! The consumer emits through a relay emitter, so the event's bus message carries the
//! emitter's id and a `seq` the consumer knows in advance (see `nats::relay`). Before emitting
//! it puts an [`Attached`] in [`Attachments`] under that key; the pipeline worker takes it when
//! it builds the message, and never puts that message back for reuse. The message holds the
//! ticket while the worker fans it out; a sink that keeps work for it takes a hold of its own
//! ([`crate::bus::Message::hold`]: the shell's `EventRun`, which lives until the event's last
//! hook process was reaped); after the fan-out the worker lets the message's hold go
//! ([`crate::bus::Message::release_hold`]). The last hold dropped reports to the consumer. A
//! sink that drops the event instead of running it (a full hook or plugin queue, shutdown)
//! marks the ticket first, and the report then says dropped. Bus subscribers take no hold: a
//! subscriber reads at its own pace and its drops are counted on it.
//!
//! `Arc`'s last decrement synchronizes with every earlier one, so a mark made before any
//! hold's drop is seen by the ticket's `Drop` (which loads it with `Acquire` anyway).

use std::collections::HashMap;

// loom's under `--cfg loom` (the model below checks the mark-then-drop protocol).
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, Ordering};
#[cfg(loom)]
use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex, MutexGuard};

/// A sink's hold on a consumed event's ticket.
pub(crate) type Hold = Arc<Ticket>;

/// Where tickets report: `(key, ran)` pairs for the consumer to take, and how to wake it.
pub(crate) struct Settled {
    done: Mutex<Vec<(u64, bool)>>,
    wake: Box<dyn Fn() + Send + Sync>,
}

impl Settled {
    pub(crate) fn new(wake: Box<dyn Fn() + Send + Sync>) -> Arc<Settled> {
        Arc::new(Settled {
            done: Mutex::new(Vec::new()),
            wake,
        })
    }

    /// Everything reported since the last call: `(key, ran)`, `ran` false when a sink dropped
    /// the event.
    pub(crate) fn take(&self) -> Vec<(u64, bool)> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One consumed message's settlement: reported exactly once, when dropped.
pub(crate) struct Ticket {
    dropped: AtomicBool,
    to: Report,
}

/// Where a ticket reports.
enum Report {
    /// The NATS consumer's list, under the message's key.
    Settled { key: u64, to: Arc<Settled> },
    /// A call: an ingested event's id is remembered once it ran (`crate::ingest::Seen`),
    /// and its reader told (a spool entry is removed once all its events ran).
    Call(Option<Box<dyn FnOnce(bool) + Send + Sync>>),
}

impl Ticket {
    pub(crate) fn new(key: u64, to: Arc<Settled>) -> Ticket {
        Ticket {
            dropped: AtomicBool::new(false),
            to: Report::Settled { key, to },
        }
    }

    /// A ticket that calls `report(ran)` once, when its last hold goes.
    pub(crate) fn calling(report: Box<dyn FnOnce(bool) + Send + Sync>) -> Ticket {
        Ticket {
            dropped: AtomicBool::new(false),
            to: Report::Call(Some(report)),
        }
    }

    pub(crate) fn mark_dropped(&self) {
        self.dropped.store(true, Ordering::Release);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let ran = !self.dropped.load(Ordering::Acquire);
        match &mut self.to {
            Report::Settled { key, to } => {
                to.done
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((*key, ran));
                (to.wake)();
            }
            Report::Call(report) => {
                if let Some(report) = report.take() {
                    report(ran);
                }
            }
        }
    }
}

/// A partition lease as the runs queued under it see it (docs/nats.md § Per-agent order across
/// hosts): the lease keeper moves `until` forward at each confirmed renewal, sets it to 0 when
/// the lease is lost, and starts a new `epoch` when it takes the lease back after it expired.
/// Monotonic milliseconds since [`lease_clock`]'s start.
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
#[derive(Default)]
pub(crate) struct Lease {
    until: std::sync::atomic::AtomicU64,
    epoch: std::sync::atomic::AtomicU64,
}

/// Milliseconds since the first call (the monotonic clock: it runs on while the process is
/// stopped, so a stopped host finds its leases stale when it resumes).
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
pub(crate) fn lease_clock() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
impl Lease {
    /// Runs under the lease may start until `until` ([`lease_clock`] milliseconds).
    pub(crate) fn renewed(&self, until: u64) {
        self.until
            .store(until, std::sync::atomic::Ordering::Release);
    }

    /// Lost: nothing queued under it starts any more.
    pub(crate) fn lost(&self) {
        self.until.store(0, std::sync::atomic::Ordering::Release);
    }

    /// Taken back after it expired: what was queued under the lease before never starts.
    pub(crate) fn retaken(&self, until: u64) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.renewed(until);
    }

    fn into_fence(self) -> Fence {
        std::sync::Arc::new(self).fence()
    }

    /// The fence of a message handed over now.
    pub(crate) fn fence(self: &std::sync::Arc<Self>) -> Fence {
        Fence {
            epoch: self.epoch.load(std::sync::atomic::Ordering::Acquire),
            lease: self.clone(),
        }
    }
}

/// What a queued run of a consumed event checks just before it starts: whether the partition
/// lease it was handed over under is still this host's and fresh.
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
#[derive(Clone)]
pub(crate) struct Fence {
    lease: std::sync::Arc<Lease>,
    epoch: u64,
}

impl Fence {
    /// A fence that admits nothing (a partition no longer held).
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
    pub(crate) fn closed() -> Fence {
        Lease::default().into_fence()
    }

    pub(crate) fn admits(&self) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        self.lease.epoch.load(Acquire) == self.epoch
            && lease_clock() < self.lease.until.load(Acquire)
    }
}

/// A consumed event's start record (docs/nats.md § Several central hosts): asked for once, by
/// the first of its hook runs about to start, written on the NATS consumer's runtime; that run,
/// and the event's other runs, start only once the shared de-dup bucket confirmed that the
/// event may run here. The shell runner does not wait for it ([`Start::poll`]: it goes on with
/// other work and is woken by the answer); a plugin's executor does ([`Start::wait`]).
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
#[derive(Clone)]
pub(crate) struct Start(std::sync::Arc<StartOnce>);

/// Called when a start record's answer came.
pub(crate) type Wake = std::sync::Arc<dyn Fn() + Send + Sync>;

#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
struct StartOnce {
    /// Begins the write; its outcome goes to the [`Answer`].
    record: Box<dyn Fn(Answer) + Send + Sync>,
    state: std::sync::Mutex<StartState>,
    answered: std::sync::Condvar,
}

enum StartState {
    /// Not asked for yet.
    Idle,
    /// Being written; who to wake when it is.
    Pending(Vec<Wake>),
    /// Confirmed (true) or refused (false).
    Done(bool),
}

/// The answer to one start record, given once (dropped unanswered: refused).
#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
pub(crate) struct Answer(Option<std::sync::Weak<StartOnce>>);

#[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
impl Answer {
    /// Whether a run still waits for it (false once the event's message is gone).
    pub(crate) fn wanted(&self) -> bool {
        self.0.as_ref().is_some_and(|w| w.strong_count() > 0)
    }

    /// The record is written (`true`), or the event must not run here (`false`).
    pub(crate) fn give(mut self, ok: bool) {
        let Some(once) = self.0.take().and_then(|w| w.upgrade()) else {
            return;
        };
        let wakes = {
            let mut st = once.state.lock().unwrap_or_else(|e| e.into_inner());
            match std::mem::replace(&mut *st, StartState::Done(ok)) {
                StartState::Pending(w) => w,
                _ => Vec::new(),
            }
        };
        once.answered.notify_all();
        for w in wakes {
            w();
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.0.is_some() {
            Answer(self.0.take()).give(false);
        }
    }
}

impl Start {
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
    pub(crate) fn new(record: Box<dyn Fn(Answer) + Send + Sync>) -> Start {
        Start(std::sync::Arc::new(StartOnce {
            record,
            state: std::sync::Mutex::new(StartState::Idle),
            answered: std::sync::Condvar::new(),
        }))
    }

    /// The answer if there is one (`Some(true)`: the run may start); else the record is
    /// asked for (the first time) and `wake` is called when it comes.
    pub(crate) fn poll(&self, wake: &Wake) -> Option<bool> {
        {
            let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *st {
                StartState::Done(ok) => return Some(*ok),
                StartState::Pending(w) => {
                    // Asked again (the runner's tick): the same waker once.
                    if !w.iter().any(|x| std::sync::Arc::ptr_eq(x, wake)) {
                        w.push(wake.clone());
                    }
                    return None;
                }
                StartState::Idle => *st = StartState::Pending(vec![wake.clone()]),
            }
        }
        // Outside the lock: an answer given at once (a runtime gone) takes it.
        (self.0.record)(Answer(Some(std::sync::Arc::downgrade(&self.0))));
        None
    }

    /// Asks for the record if nobody did, and waits for the answer.
    pub(crate) fn wait(&self) -> bool {
        let noop: Wake = std::sync::Arc::new(|| {});
        if let Some(ok) = self.poll(&noop) {
            return ok;
        }
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let StartState::Done(ok) = &*st {
                return *ok;
            }
            st = self.0.answered.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Whether a run of a consumed event may start now ([`Attached::admission`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It may.
    Yes,
    /// It must not: its partition lease was lost, or the bucket refused its start.
    No,
    /// Its start record is being written: ask again when woken.
    Pending,
}

/// The agent's side of a consumed event, what a hook needs to make its effect happen once,
/// and the message's hold on its ticket (taken out after the fan-out).
#[derive(Default)]
pub(crate) struct Attached {
    /// `Prx-Timestamp` as published (checked RFC 3339, UTC).
    pub(crate) origin_timestamp: Option<String>,
    /// `Prx-Seq` as published.
    pub(crate) origin_seq: Option<u64>,
    /// The event's id: its `Nats-Msg-Id` (checked as an identity), the same on every
    /// redelivery, on every host and through relays; or the id a relay made for a message
    /// that had none.
    pub(crate) event_id: Option<String>,
    /// JetStream's delivery count for this message (1 on the first delivery).
    pub(crate) delivery: Option<u64>,
    /// Another host had claimed the event in the shared de-dup bucket and not recorded it
    /// done: it may have run there.
    pub(crate) reclaimed: bool,
    /// The message's hold on the ticket, until the fan-out is over.
    pub(crate) ticket: Mutex<Option<Arc<Ticket>>>,
    /// With partitions: the lease it was handed over under, checked before each run starts.
    pub(crate) fence: Option<Fence>,
    /// With a shared de-dup bucket: the start record its first run writes before it starts.
    pub(crate) start: Option<Start>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("origin_timestamp", &self.origin_timestamp)
            .field("origin_seq", &self.origin_seq)
            .field("event_id", &self.event_id)
            .field("delivery", &self.delivery)
            .field("reclaimed", &self.reclaimed)
            .field("ticket", &self.slot().is_some())
            .finish()
    }
}

impl Attached {
    pub(crate) fn new(
        origin_timestamp: Option<String>,
        origin_seq: Option<u64>,
        ticket: Option<Ticket>,
    ) -> Attached {
        Attached {
            origin_timestamp,
            origin_seq,
            event_id: None,
            delivery: None,
            reclaimed: false,
            ticket: Mutex::new(ticket.map(Arc::new)),
            fence: None,
            start: None,
        }
    }

    /// Its first run records its start through `start` before it starts.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
    pub(crate) fn with_start(mut self, start: Option<Start>) -> Attached {
        self.start = start;
        self
    }

    /// Runs of the event start only while `fence` admits them.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // made by the NATS consumer only
    pub(crate) fn with_fence(mut self, fence: Option<Fence>) -> Attached {
        self.fence = fence;
        self
    }

    /// Whether a run of the event may start now: false when its partition lease was lost or
    /// went stale since it was handed over, or its start was refused; waits for its start
    /// record (a plugin's executor).
    pub(crate) fn admits(&self) -> bool {
        self.fence.as_ref().is_none_or(Fence::admits)
            && self.start.as_ref().is_none_or(Start::wait)
            && self.fence.as_ref().is_none_or(Fence::admits)
    }

    /// As [`admits`](Self::admits), without waiting: `Pending` while its start record is
    /// written, and `wake` is called when the answer comes (the shell runner).
    pub(crate) fn admission(&self, wake: &Wake) -> Admission {
        if !self.fence.as_ref().is_none_or(Fence::admits) {
            return Admission::No;
        }
        match self.start.as_ref().map(|s| s.poll(wake)) {
            None | Some(Some(true)) => Admission::Yes,
            Some(Some(false)) => Admission::No,
            Some(None) => Admission::Pending,
        }
    }

    /// With the event's id, JetStream's delivery count and whether it was reclaimed from
    /// another host (the idempotency key hooks see as `ZERO_HOOK_EVENT_ID`, …).
    pub(crate) fn with_delivery(
        mut self,
        event_id: Option<String>,
        delivery: Option<u64>,
        reclaimed: bool,
    ) -> Attached {
        self.event_id = event_id;
        self.delivery = delivery;
        self.reclaimed = reclaimed;
        self
    }

    fn slot(&self) -> MutexGuard<'_, Option<Arc<Ticket>>> {
        self.ticket.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Another hold on the ticket, while the message still has its own.
    pub(crate) fn hold(&self) -> Option<Arc<Ticket>> {
        self.slot().clone()
    }

    pub(crate) fn release(&self) {
        let t = self.slot().take();
        drop(t);
    }

    pub(crate) fn mark_dropped(&self) {
        if let Some(t) = &*self.slot() {
            t.mark_dropped();
        }
    }
}

/// `(relay id, seq)` → what the message of that event carries. Put by the consumer before it
/// emits, taken by the worker that builds the message.
#[derive(Default)]
pub(crate) struct Attachments {
    map: Mutex<HashMap<(u64, u64), Attached>>,
}

impl Attachments {
    pub(crate) fn insert(&self, relay: u64, seq: u64, a: Attached) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((relay, seq), a);
    }

    pub(crate) fn take(&self, relay: u64, seq: u64) -> Option<Attached> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(relay, seq))
    }

    /// After the workers stopped: what no worker took was never delivered, so each one left
    /// is marked dropped before it goes (its ticket then reports `dropped`, not `ran`).
    pub(crate) fn drop_undelivered(&self) {
        let left = std::mem::take(&mut *self.map.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, a) in left {
            a.mark_dropped();
        }
    }
}

/// The protocol under every interleaving: a sink marks and drops its hold on one thread,
/// another sink drops its hold on another, the worker releases the message's: the report comes
/// once, after the last of them, and says dropped.
#[cfg(loom)]
mod loom_tests {
    use super::*;

    #[test]
    fn a_mark_before_any_drop_reaches_the_one_report() {
        loom::model(|| {
            let s = Settled::new(Box::new(|| {}));
            let a = Attached::new(None, None, Some(Ticket::new(9, s.clone())));
            let (h1, h2) = (a.hold().unwrap(), a.hold().unwrap());
            let t1 = loom::thread::spawn(move || {
                h1.mark_dropped();
                drop(h1);
            });
            let t2 = loom::thread::spawn(move || drop(h2));
            a.release();
            t1.join().unwrap();
            t2.join().unwrap();
            assert_eq!(s.take(), vec![(9, false)]);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_reports_once_when_dropped_and_says_whether_a_sink_dropped_it() {
        let s = Settled::new(Box::new(|| {}));
        let a = Ticket::new(1, s.clone());
        let b = Ticket::new(2, s.clone());
        b.mark_dropped();
        drop(a);
        drop(b);
        assert_eq!(s.take(), vec![(1, true), (2, false)]);
        assert!(s.take().is_empty());
        let at = Attachments::default();
        at.insert(
            5,
            0,
            Attached::new(None, None, Some(Ticket::new(3, s.clone()))),
        );
        assert!(at.take(5, 1).is_none());
        let a = at.take(5, 0).expect("put");
        a.mark_dropped();
        drop(a);
        assert_eq!(s.take(), vec![(3, false)]);
        // Reported when the last hold goes, not the message's own.
        let a = Attached::new(None, None, Some(Ticket::new(4, s.clone())));
        let hold = a.hold();
        a.release();
        assert!(s.take().is_empty());
        a.mark_dropped();
        drop(hold);
        assert_eq!(
            s.take(),
            vec![(4, true)],
            "marked after the release: no effect"
        );
        let a = Attached::new(None, None, Some(Ticket::new(5, s.clone())));
        let hold = a.hold();
        a.mark_dropped();
        a.release();
        drop(hold);
        assert_eq!(s.take(), vec![(5, false)]);
    }
}
