//! Workers: take events from the rings, serialize each once, fan it out to the sinks.
//!
//! There is one ring per worker. An emitter is bound to one ring when it is created, so events
//! from one emitter are consumed by one worker, in ring order — which is how per-emitter order
//! holds for every subscriber without any cross-worker coordination.
//!
//! The producer never wakes a worker (a futex wake costs microseconds, far more than `emit`
//! itself). Instead an idle worker spins briefly, yields, then parks with a short timeout (the
//! idle tick, 1 ms by default): delivery latency when idle is at most one tick, and a busy
//! worker never sleeps. After [`DROWSY_TICKS`] empty ticks (about 100 ms) it parks for
//! [`DROWSY_TICK`] (10 ms) at a time: an idle pipeline wakes 100 times a second instead of
//! 1,000, and the first event after a long idle spell waits at most 10 ms.
//!
//! A worker only serializes and hands off. Sinks must not block in [`Sink::deliver`]: the bus
//! does a `try_send` per subscriber, the shell and WASM backends enqueue onto their own threads.
//! A panic inside a sink is caught, logged and counted against it; it never stops the worker.
//!
//! # Shutdown
//!
//! [`Pipeline::shutdown`] is the handshake of ARCHITECTURE.md § Shutdown:
//!
//! 1. close intake: the interest mask goes to zero (later `emit`s are `Skipped` on their first
//!    load) and every ring is closed (an `emit` that passed the interest check before that fails
//!    its claim and is `Skipped` too — see `ring` § Closing);
//! 2. each worker drains its ring up to the tail the close returned, waiting for claims still
//!    being written, and looks at the deadline before every event; what the deadline leaves is
//!    counted as `dropped_shutdown`, never kept;
//! 3. every sink's [`Sink::shutdown`] runs, all at once on threads of their own, with the same
//!    absolute deadline.
//!
//! After `shutdown` returns, every `emit` that returned `Queued` was handed to the sinks or
//! counted in `dropped_shutdown`: `queued == processed + dropped_shutdown`.

use crate::emitter::{EventSlot, Lane, Producers};
use crate::event::{EventKind, EventMask};
pub(crate) use crate::interest::{Interest, InterestHandle};
use crate::message::{Message, Meta};
use crate::ring::{Consumer, Ring};
pub(crate) use crate::sink::Sink;
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

/// How far past its deadline a sink's [`Sink::shutdown`] (and so [`Hooks::shutdown`]) may
/// return: killing and reaping what is left, joining threads, removing files.
///
/// [`Hooks::shutdown`]: crate::Hooks::shutdown
pub const SHUTDOWN_SLACK: Duration = Duration::from_millis(250);

/// Tuning for the workers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerConfig {
    pub(crate) idle_tick: Duration,
}

struct Control {
    /// Set (release) after `deadline`, once every ring is closed.
    stop: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    /// Each worker's accounting of its ring, written only by that worker (see [`Taken`]).
    taken: Box<[CachePadded<Taken>]>,
    /// Panics caught inside `Sink::deliver`.
    sink_panics: AtomicU64,
}

/// What one worker has taken from its ring. Both counters only grow, and each is stored
/// (release) only after the ring positions it counts were popped or abandoned, so
/// `processed + dropped_shutdown <= tail` at every moment (see [`Pipeline::accounting`]).
#[derive(Default)]
struct Taken {
    /// Events taken from the ring for the sinks: counted when the batch is taken, before any
    /// sink sees it (a bus subscriber never receives an event `stats` has not counted).
    processed: AtomicU64,
    /// Positions the shutdown deadline left unprocessed (published or still being written).
    dropped_shutdown: AtomicU64,
    /// Events every sink has been handed (`deliver_batch` returned): stored (release) after
    /// the batch's fan-out, so it trails `processed` by the batch in hand. What a sink did
    /// with them (its `in_flight`) is visible to whoever acquires this count.
    handed: AtomicU64,
}

/// The consumer side of [`crate::Stats`], read as one snapshot by [`Pipeline::accounting`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Accounting {
    pub(crate) processed: u64,
    pub(crate) dropped_shutdown: u64,
    /// Claimed positions no worker has counted yet: in the ring, or being taken from it.
    pub(crate) depth: u64,
    /// Every successful claim (the sum of the tails).
    pub(crate) queued: u64,
}

/// The rings, their workers and the sinks they feed.
pub(crate) struct Pipeline {
    lanes: Vec<Arc<Lane>>,
    sinks: Arc<[Arc<dyn Sink>]>,
    producers: Arc<Producers>,
    control: Arc<Control>,
    workers: Mutex<Option<Vec<JoinHandle<()>>>>,
}

impl Pipeline {
    /// Builds one ring of `slots_per_ring` slots per worker and starts the workers. `sinks[i]`
    /// must own interest part `i`.
    pub(crate) fn start(
        workers: usize,
        slots_per_ring: usize,
        producers: Arc<Producers>,
        sinks: Vec<Arc<dyn Sink>>,
        config: WorkerConfig,
    ) -> std::io::Result<Pipeline> {
        let sinks: Arc<[Arc<dyn Sink>]> = sinks.into();
        let control = Arc::new(Control {
            stop: AtomicBool::new(false),
            deadline: Mutex::new(None),
            taken: (0..workers).map(|_| CachePadded::default()).collect(),
            sink_panics: AtomicU64::new(0),
        });
        let mut lanes = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for index in 0..workers {
            let inline = producers.inline_bytes();
            let (ring, consumer) = Ring::new(slots_per_ring, || EventSlot::new(inline));
            let lane = Arc::new(Lane::new(ring));
            lanes.push(lane.clone());
            let worker = Worker {
                index,
                lane,
                consumer,
                sinks: sinks.clone(),
                producers: producers.clone(),
                control: control.clone(),
                config,
                recycle: VecDeque::with_capacity(1024),
                batch: Vec::with_capacity(BATCH),
                batch_attached: false,
            };
            let handle = thread::Builder::new()
                .name(format!("prx-hooks-worker-{index}"))
                .spawn(move || worker.run());
            match handle {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Stop the ones already running before reporting.
                    *control.deadline.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Instant::now());
                    for lane in &lanes {
                        lane.ring.close();
                    }
                    control.stop.store(true, Ordering::Release);
                    handles.into_iter().for_each(|h| {
                        h.thread().unpark();
                        let _ = h.join();
                    });
                    return Err(e);
                }
            }
        }
        Ok(Pipeline {
            lanes,
            sinks,
            producers,
            control,
            workers: Mutex::new(Some(handles)),
        })
    }

    pub(crate) fn lanes(&self) -> &[Arc<Lane>] {
        &self.lanes
    }

    pub(crate) fn rings(&self) -> impl Iterator<Item = &Ring<EventSlot>> {
        self.lanes.iter().map(|l| &*l.ring)
    }

    pub(crate) fn sinks(&self) -> &[Arc<dyn Sink>] {
        &self.sinks
    }

    /// `processed`, `dropped_shutdown`, `depth` and `queued` such that
    /// `queued == processed + dropped_shutdown + depth` exactly, even while events flow
    /// (ARCHITECTURE.md § Accounting).
    ///
    /// Per ring, the worker's two counters are read first (acquire), the ring's tail after them
    /// (acquire), and `depth` is the tail's claims the worker has not counted. It cannot be
    /// negative: the worker stores a count (release) only after popping the positions it
    /// counts, and a pop acquired the producer's publishing store, which follows its claim of
    /// that position on `tail`; so the claim happens before our acquire load of the count, and
    /// the later load of `tail` sees it or a later claim (coherence). Abandoned positions lie
    /// below the tail `Ring::close` returned before they were counted, by the same argument.
    /// Every counter only grows, so successive snapshots never go back. An event being popped
    /// into a batch is still in `depth` until its batch is counted, microseconds later and
    /// before any sink sees it.
    pub(crate) fn accounting(&self) -> Accounting {
        let mut a = Accounting::default();
        for (lane, taken) in self.lanes.iter().zip(self.control.taken.iter()) {
            let processed = taken.processed.load(Ordering::Acquire);
            let dropped = taken.dropped_shutdown.load(Ordering::Acquire);
            let tail = lane.ring.claimed() as u64;
            a.processed += processed;
            a.dropped_shutdown += dropped;
            a.queued += tail;
            a.depth += tail.saturating_sub(processed + dropped);
        }
        a
    }

    /// Events the workers have handed to every sink (see [`Taken::handed`]): together with the
    /// sinks' `in_flight`, read after it, whether everything queued has reached the sinks.
    pub(crate) fn handed_over(&self) -> u64 {
        self.control
            .taken
            .iter()
            .map(|t| t.handed.load(Ordering::Acquire))
            .sum()
    }

    #[cfg(all(test, not(loom)))]
    fn processed(&self) -> u64 {
        self.accounting().processed
    }

    pub(crate) fn sink_panics(&self) -> u64 {
        self.control.sink_panics.load(Ordering::Relaxed)
    }

    #[cfg(all(test, not(loom)))]
    fn dropped_shutdown(&self) -> u64 {
        self.accounting().dropped_shutdown
    }

    /// The shutdown handshake (module docs § Shutdown): closes intake, lets the workers drain
    /// until `timeout` has passed, then shuts every sink down at once with the same deadline.
    /// Idempotent; a concurrent second call waits for the first to finish.
    pub(crate) fn shutdown(&self, timeout: Duration) {
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(handles) = workers.take() else {
            return;
        };
        let deadline = Instant::now() + timeout;
        *self
            .control
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        // 1. Intake: nothing claims a slot after this (ring § Closing).
        self.producers.interest.close();
        for lane in &self.lanes {
            lane.ring.close();
        }
        // 2. The workers drain what was claimed, up to the deadline.
        self.control.stop.store(true, Ordering::Release);
        for h in handles {
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("a pipeline worker panicked outside a sink");
            }
        }
        // What no worker took was never delivered: its ticket says so.
        self.producers.attachments.drop_undelivered();
        // 3. The sinks, all at once: one sink using its whole deadline must not leave the
        // others none.
        std::thread::scope(|scope| {
            for sink in self.sinks.iter() {
                let spawned = std::thread::Builder::new()
                    .name(format!("prx-hooks-stop-{}", sink.name()))
                    .spawn_scoped(scope, || {
                        sink.shutdown(deadline);
                        let over = Instant::now().saturating_duration_since(deadline);
                        if over > SHUTDOWN_SLACK {
                            tracing::warn!(
                                "the {} backend took {over:?} past the shutdown deadline (the slack is {SHUTDOWN_SLACK:?}): a busy machine, or a bug worth reporting",
                                sink.name()
                            );
                        }
                    });
                if spawned.is_err() {
                    // No thread to be had: do it here, in turn.
                    sink.shutdown(deadline);
                }
            }
        });
    }
}

struct Worker {
    index: usize,
    lane: Arc<Lane>,
    consumer: Consumer<EventSlot>,
    sinks: Arc<[Arc<dyn Sink>]>,
    producers: Arc<Producers>,
    control: Arc<Control>,
    config: WorkerConfig,
    /// The messages this worker built and handed over, oldest first, for reuse (see
    /// `build_message`). Messages move between `batch` and here without a reference count
    /// being touched, so the worker never writes to a message a subscriber is reading.
    recycle: VecDeque<Message>,
    /// Events taken from the ring, not yet handed to the sinks.
    batch: Vec<Message>,
    /// Whether `batch` holds an event with an attachment (a relay emitter's, [`crate::settle`]).
    /// Such messages let their hold go after the fan-out and are never recycled (their last
    /// holder's drop settles them); batches without one skip that pass.
    batch_attached: bool,
}

/// Events a worker takes from its ring before handing them to the sinks in one go.
pub(crate) const BATCH: usize = 64;

/// How many messages a worker keeps for reuse, at most (about 450 bytes each for typical
/// events: ~7 MiB per worker at the cap, reached only while a subscriber lags this far behind).
/// Lagging further costs allocations, never correctness.
const RECYCLE: usize = 16_384;

/// Empty polls spent spinning, then yielding, before the worker parks for one idle tick. Kept
/// short (a few microseconds of spinning): on a small machine a spinning worker takes the core
/// from the threads that would give it work; yielding hands the core over instead.
const SPIN_POLLS: u32 = 16;
const YIELD_POLLS: u32 = 8;
/// Empty idle ticks (about 100 ms at the default tick) before the worker parks longer.
pub(crate) const DROWSY_TICKS: u32 = 100;
/// The park of a worker idle for [`DROWSY_TICKS`] ticks (or the idle tick, if longer): the
/// delivery latency of the first event after a long idle spell, and what idleness costs
/// (a wake-up every 10 ms). Emit never wakes a worker, so nothing is added to its path.
const DROWSY_TICK: Duration = Duration::from_millis(10);

impl Worker {
    fn run(mut self) {
        let mut idle = 0u32;
        loop {
            if self.control.stop.load(Ordering::Acquire) {
                self.finish();
                return;
            }
            if self.drain_some() {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle <= SPIN_POLLS {
                for _ in 0..(1u32 << idle.min(4)) {
                    std::hint::spin_loop();
                }
            } else if idle <= SPIN_POLLS + YIELD_POLLS {
                thread::yield_now();
            } else if idle <= SPIN_POLLS + YIELD_POLLS + DROWSY_TICKS {
                thread::park_timeout(self.config.idle_tick);
            } else {
                thread::park_timeout(self.config.idle_tick.max(DROWSY_TICK));
            }
        }
    }

    /// Processes up to a batch of events; whether there were any.
    fn drain_some(&mut self) -> bool {
        let mut kinds = EventMask::NONE;
        while self.batch.len() < BATCH {
            let (recycle, producers) = (&mut self.recycle, &*self.producers);
            let Some(((msg, attached), budget_bytes)) = self
                .consumer
                .pop(|slot| read_slot(slot, recycle, producers))
            else {
                break;
            };
            self.producers.release(budget_bytes);
            kinds |= msg.event().map_or(EventMask::NONE, EventKind::mask);
            self.batch_attached |= attached;
            self.batch.push(msg);
        }
        self.hand_over(kinds)
    }

    /// Shutdown (module docs § Shutdown): the ring is closed; drains it up to its final tail,
    /// waiting for claims still being written and looking at the deadline before every event,
    /// then counts what the deadline left as `dropped_shutdown`.
    fn finish(&mut self) {
        let deadline = self
            .control
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(Instant::now);
        // Already closed by `Pipeline::shutdown`; closing again returns the same final tail.
        let end = self.lane.ring.close();
        let mut late = false;
        loop {
            let head = self.consumer.head();
            let left = end.wrapping_sub(head);
            if left == 0 {
                break;
            }
            let batch_end = head.wrapping_add(left.min(BATCH));
            let mut kinds = EventMask::NONE;
            let mut released = 0;
            let (recycle, batch) = (&mut self.recycle, &mut self.batch);
            let (producers, batch_attached) = (&*self.producers, &mut self.batch_attached);
            self.consumer.drain_closed(
                batch_end,
                |slot| {
                    let ((msg, attached), budget_bytes) = read_slot(slot, recycle, producers);
                    released += budget_bytes;
                    kinds |= msg.event().map_or(EventMask::NONE, EventKind::mask);
                    *batch_attached |= attached;
                    batch.push(msg);
                },
                || {
                    late = late || Instant::now() >= deadline;
                    late
                },
            );
            self.producers.release(released);
            self.hand_over(kinds);
            if late {
                break;
            }
        }
        if late {
            self.abandon(end);
        }
        // This worker reads no slot again.
        self.lane.consumer_gone();
    }

    /// Past the deadline: frees what is published without delivering it, and counts every
    /// position left below `end` — published or still being written — as `dropped_shutdown`.
    fn abandon(&mut self, end: usize) {
        let first = self.consumer.head();
        let mut released = 0;
        while self.consumer.head() != end {
            match self.consumer.pop(EventSlot::discard) {
                Some(bytes) => released += bytes,
                // Still being written: its producer gets `Queued`, and it is counted below
                // with the rest.
                None => break,
            }
        }
        self.producers.release(released);
        // Release: after the pops above, and `end` came from the close (see `accounting`).
        let dropped = &self.control.taken[self.index].dropped_shutdown;
        dropped.store(
            dropped.load(Ordering::Relaxed) + end.wrapping_sub(first) as u64,
            Ordering::Release,
        );
    }

    /// Hands the batch to the sinks and counts it; whether there was anything.
    fn hand_over(&mut self, kinds: EventMask) -> bool {
        let n = self.batch.len() as u64;
        if n == 0 {
            return false;
        }
        // One clock read per batch, once every event in it has been taken: each event's
        // timestamp is at or after the moment the worker took it (ARCHITECTURE.md § Data flow).
        let now = SystemTime::now();
        for m in &mut self.batch {
            m.stamp(now);
        }
        // Counted before any sink sees the batch (release: after its pops; see `accounting`).
        let processed = &self.control.taken[self.index].processed;
        processed.store(processed.load(Ordering::Relaxed) + n, Ordering::Release);
        self.fan_out(kinds);
        if self.batch_attached {
            // A consumed event's ticket is now held by the sinks that kept work for it only
            // (`crate::settle`): bus subscribers do not delay its ack.
            for m in &self.batch {
                m.release_hold();
            }
        }
        let handed = &self.control.taken[self.index].handed;
        handed.store(handed.load(Ordering::Relaxed) + n, Ordering::Release);
        if std::mem::take(&mut self.batch_attached) {
            // Attached messages are dropped here: their last holder's drop settles them.
            let recycle = &mut self.recycle;
            recycle.extend(self.batch.drain(..).filter(|m| !m.has_attachment()));
        } else {
            self.recycle.extend(self.batch.drain(..));
        }
        if self.recycle.len() > RECYCLE {
            let excess = self.recycle.len() - RECYCLE;
            self.recycle.drain(..excess);
        }
        self.lane.collect(self.consumer.head());
        true
    }

    /// Hands the batch to every sink that wants at least one of its events.
    fn fan_out(&self, kinds: EventMask) {
        for (part, sink) in self.sinks.iter().enumerate() {
            let wanted = self.producers.interest.part(part);
            if wanted.0 & kinds.0 == 0 {
                continue;
            }
            let batch = &self.batch[..];
            if catch_unwind(AssertUnwindSafe(|| sink.deliver_batch(batch, wanted))).is_err() {
                self.control.sink_panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    sink = sink.name(),
                    "sink panicked; the rest of the batch is skipped for it"
                );
            }
        }
    }
}

/// Numbers the event in `slot` and serializes it straight into its message (see
/// `build_message`); also returns whether the message carries an attachment, and the budget
/// bytes the slot held. A relay emitter's event (the NATS consumer's) and an event emitted with
/// an attachment (an ingested event's id) take what was attached to them ([`crate::settle`]).
/// The timestamp is set by `hand_over`.
fn read_slot(
    slot: &mut EventSlot,
    recycle: &mut VecDeque<Message>,
    producers: &Producers,
) -> ((Message, bool), usize) {
    slot.read(|r| {
        let meta = Meta {
            kind: Some(r.event.kind()),
            seq: r.seq,
            timestamp: SystemTime::UNIX_EPOCH,
            depth: 0,
            relay: r.relay,
        };
        // Room for the strings plus the keys and punctuation around them (a guess: the text
        // grows if it was short).
        let strs = r.event.parts().strs;
        let hint = strs[0].len() + strs[1].len() + r.extras.len() + PAYLOAD_OVERHEAD;
        let write = |out: &mut Vec<u8>| r.event.write_payload(out, r.extras, r.omitted);
        let mut msg = build_message(recycle, hint, r.agent, r.session, meta, write);
        let attached = match (r.token, r.relay) {
            (0, 0) => None,
            (0, relay) => producers.attachments.take(relay, r.seq),
            (token, _) => producers.attachments.take(0, token),
        };
        match attached {
            Some(a) => {
                msg.attach(a);
                (msg, true)
            }
            None => (msg, false),
        }
    })
}

/// Bytes a payload adds to its strings, at most, for every event without extras: keys, quotes,
/// numbers and punctuation (`llm_response`'s are the longest: about 90).
const PAYLOAD_OVERHEAD: usize = 128;

/// A message for this event, reusing the oldest one this worker handed over if every other
/// holder has let go of it. A message still held (a subscriber lagging behind) stays in the
/// queue, so the worker remains its last owner and frees or reuses it itself: messages are not
/// freed on subscriber threads, which would contend with this thread's allocations in malloc.
/// Only past [`RECYCLE`] messages does the worker let the oldest go.
fn build_message(
    recycle: &mut VecDeque<Message>,
    hint: usize,
    agent: &str,
    session: &str,
    meta: Meta,
    write: impl FnOnce(&mut Vec<u8>),
) -> Message {
    if let Some(mut oldest) = recycle.pop_front() {
        if let Some(next) = recycle.front() {
            next.prefetch_for_reuse();
        }
        if oldest.is_unshared() {
            // SAFETY: `write` is `Event::write_payload`, which appends ASCII punctuation,
            // digits and whole copies of `&str` input only (its extras were checked as JSON
            // text, which is `&str` too).
            let rewritten = unsafe { oldest.rewrite(hint, agent, session, meta, write) };
            debug_assert!(rewritten, "an unshared message is rewritten");
            return oldest;
        }
        recycle.push_front(oldest);
    }
    // SAFETY: as above.
    unsafe { Message::lifecycle(hint, agent, session, meta, write) }
}

/// The whole handshake on real threads with a tiny ring: small enough for Miri (`.ci/run` runs
/// `pipeline::` under it), which checks the slot handover between producers, the worker's
/// drain and the shutdown for data races and leaks.
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::bus::Bus;
    use crate::emitter::Emitter;
    use crate::event::Event;
    use crate::{Emit, Stats};

    #[test]
    fn shutdown_racing_two_emitting_threads_strands_nothing() {
        let per = if cfg!(miri) { 40 } else { 20_000 };
        let interest = Interest::new(1);
        let bus = Bus::new(interest.handle(0), 1 << 16, 1 << 10);
        let producers = Arc::new(Producers::new(interest, 32, 1 << 10, 1 << 12));
        let sub = bus.subscribe("*").unwrap();
        let pipeline = Pipeline::start(
            1,
            8,
            producers.clone(),
            vec![Arc::new(bus.clone())],
            WorkerConfig {
                idle_tick: Duration::from_micros(100),
            },
        )
        .unwrap();
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let em = Emitter::new(producers.clone(), pipeline.lanes()[0].clone(), "a", "s");
                std::thread::spawn(move || {
                    let big = "b".repeat(40); // above the 32 inline bytes: budget and heap
                    let mut queued = 0u64;
                    for i in 0..per {
                        let event = if (i + t) % 3 == 0 {
                            Event::Error {
                                component: "c",
                                message: &big,
                            }
                        } else {
                            Event::TurnComplete
                        };
                        if em.emit(event) == Emit::Queued {
                            queued += 1;
                        }
                    }
                    queued
                })
            })
            .collect();
        std::thread::yield_now();
        pipeline.shutdown(Duration::from_secs(10));
        let queued: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let claimed: u64 = pipeline.rings().map(|r| r.claimed() as u64).sum();
        assert_eq!(claimed, queued);
        assert_eq!(pipeline.processed() + pipeline.dropped_shutdown(), queued);
        assert_eq!(
            pipeline.dropped_shutdown(),
            0,
            "10 s is plenty for a few events"
        );
        assert_eq!(sub.try_iter().count() as u64, queued);
        let mut stats = Stats::default();
        producers.fill_stats(&mut stats, claimed);
        assert_eq!(
            stats.ring.budget_in_use, 0,
            "every large event's bytes returned"
        );
    }

    /// One bus, one ring of `slots`, every event wanted by a subscriber on `*`.
    fn one_ring(slots: usize) -> (Arc<Producers>, Pipeline, crate::bus::Subscription) {
        let interest = Interest::new(1);
        let bus = Bus::new(interest.handle(0), 1 << 16, 1 << 10);
        let producers = Arc::new(Producers::new(interest, 64, 1 << 10, 1 << 12));
        let sub = bus.subscribe("*").unwrap();
        let config = WorkerConfig {
            idle_tick: Duration::from_micros(100),
        };
        let pipeline =
            Pipeline::start(1, slots, producers.clone(), vec![Arc::new(bus)], config).unwrap();
        (producers, pipeline, sub)
    }

    #[test]
    fn timestamps_are_never_before_the_emit_and_never_go_back() {
        let n = if cfg!(miri) { 20 } else { 2_000 };
        let (producers, pipeline, sub) = one_ring(64);
        let em = Emitter::new(producers, pipeline.lanes()[0].clone(), "a", "s");
        let mut last = SystemTime::UNIX_EPOCH;
        for i in 0..n {
            let before = SystemTime::now();
            assert_eq!(em.emit(Event::TurnComplete), Emit::Queued);
            let msg = sub.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(msg.seq(), i);
            assert!(
                msg.timestamp() >= before,
                "event {i} stamped before its emit"
            );
            assert!(
                msg.timestamp() >= last,
                "event {i} stamped before the one ahead of it"
            );
            last = msg.timestamp();
        }
        pipeline.shutdown(Duration::from_secs(5));
    }

    #[test]
    fn a_relayed_events_message_settles_after_the_fan_out_and_is_never_reused() {
        use crate::settle::{Attached, Settled, Ticket};
        let more = if cfg!(miri) { 40 } else { 3 * BATCH as u64 };
        let (producers, pipeline, sub) = one_ring(256);
        let lane = pipeline.lanes()[0].clone();
        let relay = Emitter::with_relay(producers.clone(), lane.clone(), "r", "s", true);
        let plain = Emitter::new(producers.clone(), lane, "p", "s");
        let settled = Settled::new(Box::new(|| {}));
        let ticket = Ticket::new(7, settled.clone());
        let attached = Attached::new(None, Some(41), Some(ticket));
        let attached = attached.with_delivery(Some("id-7".into()), Some(1), false);
        producers.attachments.insert(relay.relay_id(), 0, attached);
        assert_eq!(relay.emit(Event::TurnComplete), Emit::Queued);
        let held = sub.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(held.event_id(), Some("id-7"));
        // The subscriber still holds the message: bus subscribers take no hold, so the ticket
        // reports once the fan-out is over.
        let deadline = Instant::now() + Duration::from_secs(10);
        while settled.take() != [(7, true)] {
            assert!(Instant::now() < deadline, "the ticket never reported");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        // Many more events go through the worker's reuse queue; none of them is built into the
        // relayed event's message (it was never put back), and none carries its attachment.
        for i in 0..more {
            let call = Event::ToolCallStart {
                tool: "shell",
                arguments: "{}",
            };
            assert_eq!(plain.emit(call), Emit::Queued);
            let msg = sub.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!((msg.agent(), msg.seq()), ("p", i));
            assert_eq!((msg.event_id(), msg.origin_seq()), (None, None));
        }
        pipeline.shutdown(Duration::from_secs(5));
    }

    /// Events emitted with an attachment (an ingested event's id): each ticket reports exactly
    /// once, `ran` for what was delivered, `dropped` for what the shutdown deadline left in the
    /// ring (before, those reported `ran` when the map was dropped).
    #[test]
    fn every_attached_event_settles_once_and_what_shutdown_left_settles_dropped() {
        use crate::settle::{Attached, Ticket};
        use std::sync::atomic::AtomicUsize;
        let n = if cfg!(miri) { 12 } else { 200 };
        let (producers, pipeline, sub) = one_ring(16);
        let em = Emitter::new(producers.clone(), pipeline.lanes()[0].clone(), "a", "s");
        let (ran, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut queued = 0;
        for i in 0..n {
            let (r, d) = (ran.clone(), dropped.clone());
            let ticket = Ticket::calling(Box::new(move |ok| {
                if ok { &r } else { &d }.fetch_add(1, Ordering::Relaxed);
            }));
            let attached = Attached::new(None, None, Some(ticket)).with_delivery(
                Some(format!("id-{i}")),
                None,
                false,
            );
            if em.emit_attached(Event::TurnComplete, None, attached) == Ok(Emit::Queued) {
                queued += 1;
            }
        }
        pipeline.shutdown(Duration::ZERO);
        let delivered = sub.try_iter().count();
        let (ran, dropped) = (ran.load(Ordering::Relaxed), dropped.load(Ordering::Relaxed));
        assert_eq!(ran + dropped, n, "each ticket reported once");
        assert_eq!(ran, delivered, "ran: exactly what was delivered");
        assert_eq!(dropped, n - delivered, "queued {queued}");
    }

    #[test]
    fn past_the_deadline_what_is_left_is_counted_not_kept() {
        let interest = Interest::new(1);
        let bus = Bus::new(interest.handle(0), 1 << 16, 1 << 10);
        let producers = Arc::new(Producers::new(interest, 32, 1 << 10, 1 << 12));
        let _sub = bus.subscribe("*").unwrap();
        let pipeline = Pipeline::start(
            1,
            16,
            producers.clone(),
            vec![Arc::new(bus)],
            WorkerConfig {
                idle_tick: Duration::from_micros(100),
            },
        )
        .unwrap();
        let em = Emitter::new(producers.clone(), pipeline.lanes()[0].clone(), "a", "s");
        let mut queued = 0;
        while queued < 16 && em.emit(Event::TurnComplete) == Emit::Queued {
            queued += 1;
        }
        // A deadline already past: the worker may still be mid-batch, but whatever it has not
        // handed over is counted.
        pipeline.shutdown(Duration::ZERO);
        assert_eq!(
            pipeline.processed() + pipeline.dropped_shutdown(),
            queued,
            "processed {} + dropped_shutdown {} != queued {queued}",
            pipeline.processed(),
            pipeline.dropped_shutdown()
        );
        assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    }
}
