//! Workers: take events from the rings, serialize each once, fan it out to the sinks.
//!
//! There is one ring per worker. An emitter is bound to one ring when it is created, so events
//! from one emitter are consumed by one worker, in ring order — which is how per-emitter order
//! holds for every subscriber without any cross-worker coordination.
//!
//! The producer never wakes a worker (a futex wake costs microseconds, far more than `emit`
//! itself). Instead an idle worker spins briefly, yields, then parks with a short timeout (the
//! idle tick, 1 ms by default): delivery latency when idle is at most one tick, and a busy
//! worker never sleeps.
//!
//! A worker only serializes and hands off. Sinks must not block in [`Sink::deliver`]: the bus
//! does a `try_send` per subscriber, the shell and WASM backends enqueue onto their own threads.
//! A panic inside a sink is caught, logged and counted against it; it never stops the worker.

use crate::bus::{Message, Meta};
use crate::emitter::{EventSlot, Producers};
use crate::event::{EventKind, EventMask};
use crate::ring::{Consumer, Ring};
use crate::stats::SinkCounts;
use crossbeam_utils::CachePadded;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

/// A backend that receives serialized events: the bus, shell hooks, WASM plugins.
pub trait Sink: Send + Sync {
    /// A short stable name for stats (`bus`, `shell`, `wasm`).
    fn name(&self) -> &str;

    /// Takes one event. Called on a pipeline worker, so it must not block: enqueue and return.
    /// Called only for events this sink's [`InterestHandle`] says it wants.
    fn deliver(&self, msg: &Message);

    /// Takes a batch of events in order (workers hand them over up to 64 at a time, so
    /// a sink can pay its fixed costs once per batch). The batch may hold events the sink does
    /// not want: `wanted` is its interest mask when the batch was taken.
    fn deliver_batch(&self, msgs: &[Message], wanted: EventMask) {
        for msg in msgs {
            if msg.event().is_some_and(|k| wanted.contains(k)) {
                self.deliver(msg);
            }
        }
    }

    /// This sink's counters; `sent = delivered + dropped + failed + in_flight` must hold.
    fn counts(&self) -> SinkCounts;

    /// Finishes queued work, stopping what still runs at `deadline`. Called once, after the
    /// workers have stopped.
    fn shutdown(&self, deadline: Instant) {
        let _ = deadline;
    }
}

/// Which events anyone listens to. `emit` reads `combined` (one relaxed load); each sink owns
/// one part and updates it through its [`InterestHandle`] when its configuration changes.
pub struct Interest {
    combined: CachePadded<AtomicU8>,
    parts: Box<[AtomicU8]>,
    /// Serializes recomputing `combined`; `closed` keeps it at zero after shutdown.
    write: Mutex<bool>,
}

impl Interest {
    pub(crate) fn new(parts: usize) -> Arc<Interest> {
        Arc::new(Interest {
            combined: CachePadded::new(AtomicU8::new(0)),
            parts: (0..parts).map(|_| AtomicU8::new(0)).collect(),
            write: Mutex::new(false),
        })
    }

    pub(crate) fn handle(self: &Arc<Self>, part: usize) -> InterestHandle {
        InterestHandle {
            interest: self.clone(),
            part,
        }
    }

    /// Whether any sink wants `kind` (the `emit` fast path).
    #[inline]
    pub(crate) fn wants(&self, kind: EventKind) -> bool {
        EventMask(self.combined.load(Ordering::Relaxed)).contains(kind)
    }

    fn part(&self, part: usize) -> EventMask {
        EventMask(self.parts[part].load(Ordering::Relaxed))
    }

    /// From now on every event is skipped (after shutdown nobody would deliver it).
    fn close(&self) {
        let mut closed = self.write.lock().unwrap_or_else(|e| e.into_inner());
        *closed = true;
        self.combined.store(0, Ordering::Relaxed);
    }
}

/// A sink's say in the interest mask.
pub struct InterestHandle {
    interest: Arc<Interest>,
    part: usize,
}

impl InterestHandle {
    /// Declares which events this sink wants from now on.
    pub fn set(&self, mask: EventMask) {
        let i = &*self.interest;
        let closed = i.write.lock().unwrap_or_else(|e| e.into_inner());
        i.parts[self.part].store(mask.0, Ordering::Relaxed);
        if !*closed {
            let all = i.parts.iter().fold(0, |m, p| m | p.load(Ordering::Relaxed));
            i.combined.store(all, Ordering::Relaxed);
        }
    }
}

/// Tuning for the workers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerConfig {
    pub idle_tick: Duration,
}

struct Control {
    stop: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    /// Events each worker has processed; written only by that worker.
    processed: Box<[CachePadded<AtomicU64>]>,
    /// Panics caught inside `Sink::deliver`.
    sink_panics: AtomicU64,
}

/// The rings, their workers and the sinks they feed.
pub(crate) struct Pipeline {
    rings: Vec<Arc<Ring<EventSlot>>>,
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
            processed: (0..workers)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            sink_panics: AtomicU64::new(0),
        });
        let mut rings = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for index in 0..workers {
            let inline = producers.inline_bytes();
            let (ring, consumer) = Ring::new(slots_per_ring, || EventSlot::new(inline));
            rings.push(ring);
            let worker = Worker {
                index,
                consumer,
                sinks: sinks.clone(),
                producers: producers.clone(),
                control: control.clone(),
                config,
                scratch: Vec::with_capacity(4096),
                recycle: std::collections::VecDeque::with_capacity(1024),
                batch: Vec::with_capacity(BATCH),
            };
            let handle = thread::Builder::new()
                .name(format!("prx-hooks-worker-{index}"))
                .spawn(move || worker.run());
            match handle {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Stop the ones already running before reporting.
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
            rings,
            sinks,
            producers,
            control,
            workers: Mutex::new(Some(handles)),
        })
    }

    pub(crate) fn rings(&self) -> &[Arc<Ring<EventSlot>>] {
        &self.rings
    }

    pub(crate) fn sinks(&self) -> &[Arc<dyn Sink>] {
        &self.sinks
    }

    pub(crate) fn processed(&self) -> u64 {
        self.control
            .processed
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn sink_panics(&self) -> u64 {
        self.control.sink_panics.load(Ordering::Relaxed)
    }

    /// Drains the rings until they are empty or `timeout` has passed, stops the workers, then
    /// shuts the sinks down with what is left of the deadline. Idempotent; a concurrent second
    /// call waits for the first to finish.
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
        self.control.stop.store(true, Ordering::Release);
        for h in handles {
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("a pipeline worker panicked outside a sink");
            }
        }
        self.producers.interest.close();
        for sink in self.sinks.iter() {
            sink.shutdown(deadline);
        }
    }
}

struct Worker {
    index: usize,
    consumer: Consumer<EventSlot>,
    sinks: Arc<[Arc<dyn Sink>]>,
    producers: Arc<Producers>,
    control: Arc<Control>,
    config: WorkerConfig,
    scratch: Vec<u8>,
    /// The last messages this worker built, oldest first, for reuse (see `Message::reuse`).
    recycle: std::collections::VecDeque<Message>,
    /// Events taken from the ring, not yet handed to the sinks.
    batch: Vec<Message>,
}

/// Events a worker takes from its ring before handing them to the sinks in one go.
pub const BATCH: usize = 64;

/// How many messages a worker keeps for reuse, at most (about 450 bytes each for typical
/// events: ~7 MiB per worker at the cap, reached only while a subscriber lags this far behind).
/// Lagging further costs allocations, never correctness.
const RECYCLE: usize = 16_384;

/// Empty polls spent spinning, then yielding, before the worker parks for one idle tick. Kept
/// short (a few microseconds of spinning): on a small machine a spinning worker takes the core
/// from the threads that would give it work; yielding hands the core over instead.
const SPIN_POLLS: u32 = 16;
const YIELD_POLLS: u32 = 8;

impl Worker {
    fn run(mut self) {
        let mut idle = 0u32;
        loop {
            if self.drain_some() {
                idle = 0;
                continue;
            }
            if self.control.stop.load(Ordering::Acquire) && self.may_stop() {
                return;
            }
            idle = idle.saturating_add(1);
            if idle <= SPIN_POLLS {
                for _ in 0..(1u32 << idle.min(4)) {
                    std::hint::spin_loop();
                }
            } else if idle <= SPIN_POLLS + YIELD_POLLS {
                thread::yield_now();
            } else {
                thread::park_timeout(self.config.idle_tick);
            }
        }
    }

    /// Stopping: the ring is empty, or the deadline has passed.
    fn may_stop(&self) -> bool {
        let deadline = *self
            .control
            .deadline
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.consumer.ring().len() == 0 || deadline.is_none_or(|d| Instant::now() >= d)
    }

    /// Processes up to a batch of events; whether there were any.
    fn drain_some(&mut self) -> bool {
        let mut kinds = EventMask::NONE;
        while self.batch.len() < BATCH {
            let (scratch, recycle) = (&mut self.scratch, &mut self.recycle);
            let popped = self.consumer.pop(|slot| {
                slot.read(|event, agent, session, seq| {
                    scratch.clear();
                    event.write_json(scratch);
                    // The writer emits ASCII and copies of `&str` input only.
                    let json = std::str::from_utf8(scratch).unwrap_or("{}");
                    let meta = Meta {
                        kind: Some(event.kind()),
                        seq,
                        timestamp: SystemTime::now(),
                        depth: 0,
                    };
                    build_message(recycle, json, agent, session, meta)
                })
            });
            let Some((msg, budget_bytes)) = popped else {
                break;
            };
            self.producers.release(budget_bytes);
            kinds |= msg.event().map_or(EventMask::NONE, EventKind::mask);
            self.batch.push(msg);
        }
        let n = self.batch.len() as u64;
        if n == 0 {
            return false;
        }
        self.fan_out(kinds);
        self.batch.clear();
        let processed = &self.control.processed[self.index];
        processed.store(processed.load(Ordering::Relaxed) + n, Ordering::Relaxed);
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

/// A message for this event, reusing the oldest one this worker built if every other holder
/// has let go of it. A message still held (a subscriber lagging behind) stays in the queue, so
/// the worker remains its last owner and frees or reuses it itself: messages are not freed on
/// subscriber threads, which would contend with this thread's allocations in malloc. Only past
/// [`RECYCLE`] messages does the worker let the oldest go.
fn build_message(
    recycle: &mut std::collections::VecDeque<Message>,
    json: &str,
    agent: &str,
    session: &str,
    meta: Meta,
) -> Message {
    if let Some(oldest) = recycle.front_mut()
        && oldest.reuse(json, agent, session, meta)
    {
        recycle.rotate_left(1);
        return recycle
            .back()
            .cloned()
            .unwrap_or_else(|| Message::new(json, agent, session, "", meta));
    }
    if recycle.len() >= RECYCLE {
        recycle.pop_front();
    }
    let msg = Message::new(json, agent, session, "", meta);
    recycle.push_back(msg.clone());
    msg
}
