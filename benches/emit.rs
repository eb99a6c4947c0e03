//! `emit()` on the producer thread (ARCHITECTURE.md § Performance targets), against the baselines named there.
//!
//! Group `emit`:
//! * `nobody_listening`: no subscriber, the `Skipped` path (target ≤ 5 ns).
//! * `one_listener_sporadic`: one event every ~20 µs (busy-wait between events, untimed) with a
//!   subscriber thread reading `prx.lifecycle.tool_call`. Each `emit` is timed alone; the worker is
//!   idle (in its spin/yield phase, which lasts ~100 µs) when the event arrives.
//! * `one_listener_parked_worker`: the same with 500 µs between events, and before each emit the
//!   bench checks (`/proc/self/task/<tid>/stat`, untimed) that the worker thread is asleep in
//!   `park_timeout`.
//! * `one_listener_burst`: back-to-back emits, timed in chunks of 1,024, while the worker consumes
//!   concurrently. The subscriber is read by the bench thread between chunks (untimed), so the
//!   two cores hold exactly the producer and the worker — the same two threads as the
//!   `arrayqueue_push` baseline (producer + consumer). The ring (65,536) never fills.
//! * `full_ring`: the drop path. See `full_ring` below for how the ring is held full honestly.
//!
//! Group `sessions` (ARCHITECTURE.md § Ingest): the same bursts as `one_listener_burst`, through
//! the session map, against `emit/one_listener_burst` (the plain emitter) in the same process:
//! * `held`: one `SessionEmitter` kept for the whole run (an agent's connection): `emit` plus
//!   the note of the ring's tail.
//! * `get_emit_drop`: `sessions().get(agent, session)`, one emit, drop — what the line ingest does
//!   per line: two short locks of the key's shard and one `Instant::now`.
//! * `get_emit_drop_evicting`: the same over 8,192 keys taken in turn in a map of 4,096, so
//!   every `get` makes an emitter, evicts one (clock) and parks its `seq` — the bound at work.
//! * `new_emitter_per_event`: its baseline without the map: `hooks.emitter(key)` made, one emit,
//!   dropped, over the same keys (what a new key costs anyway: the emitter's allocations and
//!   the producers' registry).
//!
//! Group `baseline` (same data: agent, session, tool and output copied into a 256-byte inline
//! buffer plus scalars, i.e. what a ring slot holds):
//! * `arrayqueue_push`: crossbeam `ArrayQueue::push` in bursts, with a consumer thread popping
//!   (idling exactly like a prx worker: spin, yield, then park with a 1 ms timeout).
//! * `arrayqueue_push_sporadic`, `arrayqueue_push_parked`: the same queue, one push every ~20 µs
//!   / every 500 µs with the consumer checked asleep — the counterparts of the two sporadic emit
//!   cases.
//! * `arrayqueue_full`: `push` into a full `ArrayQueue` (the drop path). The value is built before
//!   `push` and moved back out in the `Err`, because that API takes it by value; prx checks for
//!   room before copying anything. `arrayqueue_full_u64` pushes a `u64` instead: the queue's own
//!   full check without the 288-byte moves.
//! * `relaxed_fetch_add`: one relaxed `fetch_add` on an uncontended, cache-padded counter — the
//!   floor of the `Skipped` path, which counts every skipped event.
//! * `mpsc_serde_json`: the naive pipeline: serialize on the producer with `serde_json::to_vec`
//!   and `std::sync::mpsc::Sender::send` the bytes to a reader thread, in bursts.
//! * `crossbeam_channel_parked`: `crossbeam_channel::Sender::send` of the inline struct to a
//!   receiver thread parked in `recv()`: after each 20 µs pause the bench waits until the receiver
//!   has taken the previous item and is asleep again, so every send pays the futex wake.
//!
//! "Asleep" is checked, not assumed: on a loaded 2-core machine a thread can sit runnable (not
//! parked) for a long time; the notes at the end say how often the check timed out.
//!
//! Sporadic cases time each call alone between two `Instant::now()` calls and subtract the
//! timer's own cost (median of back-to-back pairs, printed). Criterion sizes its runs by wall
//! time, so the untimed pauses and drains keep each bench within its measurement time.
//!
//! At the end: RATIOS (criterion medians) and per-call percentiles.

mod common;

use common::*;
use criterion::{Criterion, SamplingMode};
use crossbeam_queue::ArrayQueue;
use prx_hooks::{Emit, Emitter, Event, Hooks, Subscription};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const SPORADIC_PAUSE: Duration = Duration::from_micros(20);
const PARKED_PAUSE: Duration = Duration::from_micros(500);
const BURST_CHUNK: u64 = 1024;
const RING: usize = 65_536;

/// The event's strings, made opaque to the optimizer once, outside the timed loops (a
/// `black_box` per call would add its own stack stores and store-forwarding stalls to a 5 ns
/// measurement).
#[derive(Clone, Copy)]
struct Fields {
    tool: &'static str,
    output: &'static str,
    /// agent, session, tool, output: what the baselines copy.
    strs: [&'static str; 4],
}

fn fields() -> Fields {
    black_box(Fields {
        tool: TOOL,
        output: output_200(),
        strs: [AGENT, SESSION, TOOL, output_200()],
    })
}

/// The event every emit bench sends. The variant is visible to the compiler, as at a real call
/// site; the strings are opaque.
#[inline(always)]
fn event(f: Fields) -> Event<'static> {
    Event::ToolCall {
        tool: f.tool,
        success: true,
        output: f.output,
    }
}

// ---------------------------------------------------------------------------------------------
// The baselines' item: what a ring slot holds, as a plain value.

#[derive(Clone, Copy)]
#[allow(dead_code)] // consumers only hand it to black_box, like a sink would read it
struct InlineEvent {
    kind: u8,
    flag: bool,
    num: u64,
    seq: u64,
    lens: [u32; 4],
    inline: [u8; 256],
}

impl InlineEvent {
    #[inline]
    fn new(strs: [&str; 4], flag: bool, seq: u64) -> InlineEvent {
        let mut e = InlineEvent {
            kind: 5,
            flag,
            num: 0,
            seq,
            lens: strs.map(|s| s.len() as u32),
            inline: [0; 256],
        };
        let mut at = 0;
        for s in strs {
            e.inline[at..at + s.len()].copy_from_slice(s.as_bytes());
            at += s.len();
        }
        e
    }
}

#[inline]
fn inline_event(f: Fields, seq: u64) -> InlineEvent {
    InlineEvent::new(f.strs, true, seq)
}

/// The naive pipeline's message: everything serialized on the producer.
#[derive(serde::Serialize)]
struct Envelope<'a> {
    agent: &'a str,
    session: &'a str,
    seq: u64,
    tool: &'a str,
    success: bool,
    output: &'a str,
}

// ---------------------------------------------------------------------------------------------
// Harnesses shared by prx and the baselines.

/// Times `iters` calls of `op`, each alone: before each one (untimed) a busy-wait of `pause`,
/// then `settle` (e.g. wait until the consumer is asleep). Returns the total with the timer
/// overhead subtracted; records per-call latencies under `name` (bench mode only).
fn time_sporadic(
    name: &str,
    iters: u64,
    pause: Duration,
    mut settle: impl FnMut(),
    mut op: impl FnMut(),
) -> Duration {
    let oh = timer_overhead_ns();
    let mut total = 0u64;
    let mut lat = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        spin_for(pause);
        settle();
        let t0 = Instant::now();
        op();
        let dt = t0.elapsed().as_nanos() as u64;
        total += dt;
        lat.push(dt.saturating_sub(oh));
    }
    if bench_mode() {
        record_latencies(name, &lat);
    }
    Duration::from_nanos(total.saturating_sub(oh * iters))
}

/// Times `iters` calls of `op` back to back in chunks of [`BURST_CHUNK`]; after each chunk
/// (untimed) `settle(accepted_so_far)` waits until the consumer side has caught up. `op` returns
/// whether the item was accepted. Returns (time, calls not accepted).
fn time_burst(
    iters: u64,
    accepted: &mut u64,
    mut op: impl FnMut() -> bool,
    mut settle: impl FnMut(u64),
) -> (Duration, u64) {
    let mut total = Duration::ZERO;
    let mut refused = 0;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BURST_CHUNK);
        let mut ok = 0;
        let t0 = Instant::now();
        for _ in 0..n {
            ok += op() as u64;
        }
        total += t0.elapsed();
        *accepted += ok;
        refused += n - ok;
        left -= n;
        settle(*accepted);
    }
    (total, refused)
}

/// The burst pattern again, but each call timed alone, for percentiles (bench mode only).
fn burst_latencies(
    name: &str,
    chunks: u64,
    accepted: &mut u64,
    mut op: impl FnMut() -> bool,
    mut settle: impl FnMut(u64),
) {
    let oh = timer_overhead_ns();
    let mut lat = Vec::with_capacity((chunks * BURST_CHUNK) as usize);
    for _ in 0..chunks {
        for _ in 0..BURST_CHUNK {
            let t0 = Instant::now();
            let ok = op();
            lat.push((t0.elapsed().as_nanos() as u64).saturating_sub(oh));
            *accepted += ok as u64;
        }
        settle(*accepted);
    }
    record_latencies(name, &lat);
}

/// A consumer thread that idles like a prx worker (spin 64 polls with growing spins, yield 16
/// times, then park with a 1 ms timeout) and publishes how many items it has taken.
struct Consumer {
    taken: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tid: u32,
    handle: Option<JoinHandle<()>>,
}

impl Consumer {
    fn start(mut pop: impl FnMut() -> bool + Send + 'static) -> Consumer {
        let taken = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (taken.clone(), stop.clone());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let handle = thread::spawn(move || {
            tid_tx.send(current_tid().unwrap_or(0)).unwrap();
            let mut n = 0u64;
            let mut idle = 0u32;
            while !s.load(Ordering::Relaxed) {
                if pop() {
                    n += 1;
                    while pop() {
                        n += 1;
                    }
                    t.store(n, Ordering::Release);
                    idle = 0;
                    continue;
                }
                idle = idle.saturating_add(1);
                if idle <= 64 {
                    for _ in 0..(1u32 << idle.min(6)) {
                        std::hint::spin_loop();
                    }
                } else if idle <= 80 {
                    thread::yield_now();
                } else {
                    thread::park_timeout(Duration::from_millis(1));
                }
            }
        });
        Consumer {
            taken,
            stop,
            tid: tid_rx.recv().unwrap(),
            handle: Some(handle),
        }
    }

    fn wait_for(&self, n: u64) {
        while self.taken.load(Ordering::Acquire) < n {
            thread::yield_now();
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            h.join().unwrap();
        }
    }
}

/// A thread reading a subscription with `recv()`, counting what it got.
fn reader(sub: Subscription) -> (Arc<AtomicU64>, JoinHandle<()>) {
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    let h = thread::spawn(move || {
        let mut n = 0;
        while let Ok(msg) = sub.recv() {
            black_box(msg.json());
            n += 1;
            g.store(n, Ordering::Release);
        }
    });
    (got, h)
}

fn wait_count(c: &AtomicU64, n: u64) {
    while c.load(Ordering::Acquire) < n {
        thread::yield_now();
    }
}

/// "name: the thread was asleep before N of M timed calls (K timed out waiting)".
fn sleep_note(name: &str, who: &str, asleep: u64, awake: u64) -> String {
    format!(
        "{name}: the {who} thread was asleep (parked) before {asleep} of {} timed calls; {awake} \
         waited 5 ms in vain and were timed anyway",
        asleep + awake
    )
}

fn hooks(ring: usize) -> Hooks {
    Hooks::builder()
        .ring_capacity(ring)
        .workers(1)
        .subscriber_queue(RING)
        .build()
        .expect("build hooks")
}

// ---------------------------------------------------------------------------------------------
// Group `emit`.

fn bench_emit(c: &mut Criterion, notes: &mut Vec<String>) {
    let f = fields();
    let mut g = c.benchmark_group("emit");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    // Nobody listening: Skipped.
    {
        let h = hooks(RING);
        let em = h.emitter(AGENT, SESSION);
        assert_eq!(em.emit(event(f)), Emit::Skipped);
        g.bench_function("nobody_listening", |b| b.iter(|| em.emit(event(f))));
        h.shutdown(Duration::from_secs(2));
    }

    // One listener, sporadic events: the worker idle but not yet parked (20 µs apart), and the
    // worker parked (500 µs apart, then the bench checks the worker thread is asleep).
    for (id, pause) in [
        ("one_listener_sporadic", SPORADIC_PAUSE),
        ("one_listener_parked_worker", PARKED_PAUSE),
    ] {
        let h = hooks(RING);
        let (_got, rh) = reader(h.bus().subscribe("prx.lifecycle.tool_call").unwrap());
        let em = h.emitter(AGENT, SESSION);
        let parked = pause > SPORADIC_PAUSE;
        let worker = find_thread("prx-hooks-worke").filter(|_| parked);
        let mut refused = 0u64;
        let (mut asleep, mut awake) = (0u64, 0u64);
        if parked {
            g.sampling_mode(SamplingMode::Flat);
        }
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                time_sporadic(
                    &format!("emit/{id}"),
                    iters,
                    pause,
                    || {
                        if let Some(tid) = worker {
                            match wait_sleeping(tid, Duration::from_millis(5)) {
                                true => asleep += 1,
                                false => awake += 1,
                            }
                        }
                    },
                    || {
                        refused += (black_box(em.emit(event(f))) != Emit::Queued) as u64;
                    },
                )
            })
        });
        g.sampling_mode(SamplingMode::Auto);
        let stats = h.stats();
        h.shutdown(Duration::from_secs(2));
        rh.join().unwrap();
        assert_eq!(refused, 0, "{id}: some emits were not queued");
        assert_eq!(stats.subscribers[0].dropped, 0, "{id}: subscriber dropped");
        if parked && asleep + awake > 0 {
            notes.push(sleep_note(&format!("emit/{id}"), "worker", asleep, awake));
        }
    }

    // One listener, bursts.
    {
        let h = hooks(RING);
        let sub = h.bus().subscribe("prx.lifecycle.tool_call").unwrap();
        let em = h.emitter(AGENT, SESSION);
        let mut accepted = 0u64;
        let mut drained = 0u64;
        let mut refused = 0u64;
        let mut profiled = false;
        g.bench_function("one_listener_burst", |b| {
            let mut op = || black_box(em.emit(event(f))) == Emit::Queued;
            let mut settle = |n: u64| {
                while drained < n {
                    for msg in sub.try_iter() {
                        black_box(msg.json());
                        drained += 1;
                    }
                    std::hint::spin_loop();
                }
            };
            if bench_mode() && !profiled {
                profiled = true;
                let name = "emit/one_listener_burst";
                burst_latencies(name, 200, &mut accepted, &mut op, &mut settle);
            }
            b.iter_custom(|iters| {
                let (t, r) = time_burst(iters, &mut accepted, &mut op, &mut settle);
                refused += r;
                t
            })
        });
        let stats = h.stats();
        h.shutdown(Duration::from_secs(2));
        assert_eq!(refused, 0, "one_listener_burst: the ring filled up");
        assert_eq!(stats.subscribers[0].dropped, 0);
    }

    full_ring(&mut g, notes);
    g.finish();
}

/// The drop path, measured with the ring really full and the worker unable to free a slot.
///
/// Workers always run, so a tiny ring racing a live worker would time a mix of queued and
/// dropped emits (and the cache-line ping-pong of the worker freeing slots). Instead: a ring of
/// 2 slots; emit one large event (3 MiB of `ls` output, taken from the byte budget) and one small
/// one. The worker holds the large event's slot until it has serialized it (escaping 3 MiB and
/// copying it into a message takes milliseconds), and the small event occupies the other slot,
/// so every emit in the next window is refused at the "ring full" check. Each window times
/// `FULL_CHUNK` emits (~16k × ~20 ns ≈ 0.3 ms, well inside the window); the outcome of every
/// timed emit is counted and reported, so a window that ended early would show.
fn full_ring(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    notes: &mut Vec<String>,
) {
    let f = fields();
    const FULL_CHUNK: u64 = 16_384;
    let big: String = LS.repeat((3 << 20) / LS.len());
    let h = hooks(2);
    let (got, rh) = reader(h.bus().subscribe("prx.lifecycle.tool_call").unwrap());
    let em = h.emitter(AGENT, SESSION);
    let mut queued = 0u64;
    let (mut timed, mut timed_dropped) = (0u64, 0u64);
    let stall = |em: &Emitter, queued: &mut u64| {
        wait_count(&got, *queued);
        let big_event = Event::ToolCall {
            tool: TOOL,
            success: true,
            output: &big,
        };
        assert_eq!(em.emit(big_event), Emit::Queued);
        assert_eq!(em.emit(event(f)), Emit::Queued);
        *queued += 2;
    };
    g.bench_function("full_ring", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                stall(&em, &mut queued);
                let n = left.min(FULL_CHUNK);
                let mut dropped = 0u64;
                let t0 = Instant::now();
                for _ in 0..n {
                    dropped += (black_box(em.emit(event(f))) == Emit::Dropped) as u64;
                }
                total += t0.elapsed();
                // Anything not dropped was queued (the window closed early).
                queued += n - dropped;
                timed += n;
                timed_dropped += dropped;
                left -= n;
            }
            total
        })
    });
    wait_count(&got, queued);
    let stats = h.stats();
    h.shutdown(Duration::from_secs(2));
    rh.join().unwrap();
    if timed > 0 {
        notes.push(format!(
            "emit/full_ring: {timed_dropped} of {timed} timed emits returned Dropped ({:.3} %); \
             pipeline stats: dropped {}, queued {}",
            timed_dropped as f64 * 100.0 / timed as f64,
            stats.dropped,
            stats.queued
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Group `sessions`.

/// Keys `get_emit_drop_evicting` takes in turn: twice the map's default bound.
const EVICTING_KEYS: usize = 8192;

fn bench_sessions(c: &mut Criterion) {
    let f = fields();
    let mut g = c.benchmark_group("sessions");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let keys: Vec<String> = (0..EVICTING_KEYS).map(|i| format!("agent-{i}")).collect();
    for id in [
        "held",
        "get_emit_drop",
        "get_emit_drop_evicting",
        "new_emitter_per_event",
    ] {
        let h = hooks(RING);
        let sub = h.bus().subscribe("prx.lifecycle.tool_call").unwrap();
        let held = h.sessions().get(AGENT, SESSION).unwrap();
        let mut next = 0usize;
        let (mut accepted, mut drained, mut refused) = (0u64, 0u64, 0u64);
        g.bench_function(id, |b| {
            let mut op = || {
                let emitted = match id {
                    "held" => held.emit(event(f)),
                    "get_emit_drop" => match h.sessions().get(AGENT, SESSION) {
                        Ok(em) => em.emit(event(f)),
                        Err(_) => Emit::Dropped,
                    },
                    "new_emitter_per_event" => {
                        next = (next + 1) % EVICTING_KEYS;
                        h.emitter(&keys[next], SESSION).emit(event(f))
                    }
                    _ => {
                        next = (next + 1) % EVICTING_KEYS;
                        match h.sessions().get(&keys[next], SESSION) {
                            Ok(em) => em.emit(event(f)),
                            Err(_) => Emit::Dropped,
                        }
                    }
                };
                black_box(emitted) == Emit::Queued
            };
            let mut settle = |n: u64| {
                while drained < n {
                    for msg in sub.try_iter() {
                        black_box(msg.json());
                        drained += 1;
                    }
                    std::hint::spin_loop();
                }
            };
            b.iter_custom(|iters| {
                let (t, r) = time_burst(iters, &mut accepted, &mut op, &mut settle);
                refused += r;
                t
            })
        });
        drop(held);
        let stats = h.stats();
        h.shutdown(Duration::from_secs(2));
        assert_eq!(
            refused, 0,
            "sessions/{id}: an emit was refused or not queued"
        );
        assert_eq!(stats.subscribers[0].dropped, 0);
        let s = stats.sessions().unwrap();
        match id {
            "get_emit_drop_evicting" => {
                assert!(s.evicted > 0 && s.live <= s.max, "sessions/{id}: {s:?}")
            }
            "new_emitter_per_event" => {}
            _ => assert_eq!(s.opened, 1, "sessions/{id}: one key, one emitter: {s:?}"),
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Group `baseline`.

fn bench_baselines(c: &mut Criterion, notes: &mut Vec<String>) {
    let f = fields();
    let mut g = c.benchmark_group("baseline");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));

    // ArrayQueue, bursts and sporadic, with a worker-like consumer.
    {
        let q = Arc::new(ArrayQueue::<InlineEvent>::new(RING));
        let qc = q.clone();
        let consumer = Consumer::start(move || match qc.pop() {
            Some(e) => {
                black_box(&e);
                true
            }
            None => false,
        });
        let mut seq = 0u64;
        let mut accepted = 0u64;
        let mut refused = 0u64;
        let mut profiled = false;
        g.bench_function("arrayqueue_push", |b| {
            let mut op = || {
                seq += 1;
                q.push(inline_event(f, seq)).is_ok()
            };
            let mut settle = |n: u64| consumer.wait_for(n);
            if bench_mode() && !profiled {
                profiled = true;
                let name = "baseline/arrayqueue_push";
                burst_latencies(name, 200, &mut accepted, &mut op, &mut settle);
            }
            b.iter_custom(|iters| {
                let (t, r) = time_burst(iters, &mut accepted, &mut op, &mut settle);
                refused += r;
                t
            })
        });
        for (id, pause) in [
            ("arrayqueue_push_sporadic", SPORADIC_PAUSE),
            ("arrayqueue_push_parked", PARKED_PAUSE),
        ] {
            let parked = pause > SPORADIC_PAUSE;
            let (mut asleep, mut awake) = (0u64, 0u64);
            if parked {
                g.sampling_mode(SamplingMode::Flat);
            }
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let name = format!("baseline/{id}");
                    time_sporadic(
                        &name,
                        iters,
                        pause,
                        || {
                            if parked {
                                match wait_sleeping(consumer.tid, Duration::from_millis(5)) {
                                    true => asleep += 1,
                                    false => awake += 1,
                                }
                            }
                        },
                        || {
                            seq += 1;
                            refused += q.push(inline_event(f, seq)).is_err() as u64;
                        },
                    )
                })
            });
            g.sampling_mode(SamplingMode::Auto);
            if parked && asleep + awake > 0 {
                let name = format!("baseline/{id}");
                notes.push(sleep_note(&name, "consumer", asleep, awake));
            }
        }
        drop(consumer);
        assert_eq!(refused, 0, "arrayqueue baseline filled up");
    }

    // ArrayQueue, full: with the same data (moved by value into `push` and back out in the
    // `Err`), and with a u64 (the queue's own full check: a SeqCst fence and two loads).
    {
        let q = ArrayQueue::<InlineEvent>::new(2);
        while q.push(inline_event(f, 0)).is_ok() {}
        let mut seq = 0u64;
        g.bench_function("arrayqueue_full", |b| {
            b.iter(|| {
                seq += 1;
                black_box(q.push(inline_event(f, seq)).is_err())
            })
        });
        let q = ArrayQueue::<u64>::new(2);
        while q.push(0).is_ok() {}
        g.bench_function("arrayqueue_full_u64", |b| {
            b.iter(|| black_box(q.push(black_box(7)).is_err()))
        });
    }

    // What the Skipped path must at least pay: one relaxed fetch_add on an uncontended line.
    {
        let counter = crossbeam_utils::CachePadded::new(AtomicU64::new(0));
        g.bench_function("relaxed_fetch_add", |b| {
            b.iter(|| black_box(&counter).fetch_add(1, Ordering::Relaxed))
        });
    }

    // serde_json + std mpsc, bursts.
    {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let got = Arc::new(AtomicU64::new(0));
        let g2 = got.clone();
        let rh = thread::spawn(move || {
            let mut n = 0;
            while let Ok(v) = rx.recv() {
                black_box(&v);
                n += 1;
                g2.store(n, Ordering::Release);
            }
        });
        let mut seq = 0u64;
        let mut accepted = 0u64;
        g.bench_function("mpsc_serde_json", |b| {
            b.iter_custom(|iters| {
                let op = || {
                    seq += 1;
                    let env = black_box(Envelope {
                        agent: AGENT,
                        session: SESSION,
                        seq,
                        tool: TOOL,
                        success: true,
                        output: output_200(),
                    });
                    tx.send(serde_json::to_vec(&env).unwrap()).is_ok()
                };
                time_burst(iters, &mut accepted, op, |n| wait_count(&got, n)).0
            })
        });
        drop(tx);
        rh.join().unwrap();
    }

    // crossbeam channel to a parked receiver, sporadic. After each pause the bench waits until
    // the receiver has taken the previous item and is asleep in `recv()` again, so every send
    // finds it parked and pays the wake.
    {
        let (tx, rx) = crossbeam_channel::bounded::<InlineEvent>(1024);
        let got = Arc::new(AtomicU64::new(0));
        let g2 = got.clone();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let rh = thread::spawn(move || {
            tid_tx.send(current_tid().unwrap_or(0)).unwrap();
            let mut n = 0;
            while let Ok(e) = rx.recv() {
                black_box(&e);
                n += 1;
                g2.store(n, Ordering::Release);
            }
        });
        let rx_tid = tid_rx.recv().unwrap();
        let mut seq = 0u64;
        let (mut asleep, mut awake) = (0u64, 0u64);
        g.bench_function("crossbeam_channel_parked", |b| {
            b.iter_custom(|iters| {
                let name = "baseline/crossbeam_channel_parked";
                let sent = std::cell::Cell::new(seq);
                let d = time_sporadic(
                    name,
                    iters,
                    SPORADIC_PAUSE,
                    || {
                        wait_count(&got, sent.get());
                        match wait_sleeping(rx_tid, Duration::from_millis(5)) {
                            true => asleep += 1,
                            false => awake += 1,
                        }
                    },
                    || {
                        sent.set(sent.get() + 1);
                        tx.send(inline_event(f, sent.get())).unwrap();
                    },
                );
                seq = sent.get();
                d
            })
        });
        drop(tx);
        rh.join().unwrap();
        if asleep + awake > 0 {
            let name = "baseline/crossbeam_channel_parked";
            notes.push(sleep_note(name, "receiver", asleep, awake));
        }
    }
    g.finish();
}

fn main() {
    process_start();
    if bench_mode() {
        timer_overhead_ns();
    }
    let mut c = Criterion::default().configure_from_args();
    let mut notes = Vec::new();
    bench_emit(&mut c, &mut notes);
    bench_sessions(&mut c);
    bench_baselines(&mut c, &mut notes);
    c.final_summary();

    let ids = [
        "emit/nobody_listening",
        "emit/one_listener_sporadic",
        "emit/one_listener_parked_worker",
        "emit/one_listener_burst",
        "emit/full_ring",
        "sessions/held",
        "sessions/get_emit_drop",
        "sessions/get_emit_drop_evicting",
        "sessions/new_emitter_per_event",
        "baseline/arrayqueue_push",
        "baseline/arrayqueue_push_sporadic",
        "baseline/arrayqueue_push_parked",
        "baseline/arrayqueue_full",
        "baseline/arrayqueue_full_u64",
        "baseline/relaxed_fetch_add",
        "baseline/mpsc_serde_json",
        "baseline/crossbeam_channel_parked",
    ];
    if !ids.iter().any(|id| median_ns(id).is_some()) {
        return; // test mode, or everything filtered out
    }
    println!("\nRATIOS (criterion medians, ns per emit/push; below 1x = faster than the baseline)");
    print_time_ratio("emit/one_listener_burst", "baseline/arrayqueue_push");
    print_time_ratio("emit/one_listener_burst", "baseline/mpsc_serde_json");
    print_time_ratio(
        "emit/one_listener_sporadic",
        "baseline/arrayqueue_push_sporadic",
    );
    print_time_ratio(
        "emit/one_listener_sporadic",
        "baseline/crossbeam_channel_parked",
    );
    print_time_ratio(
        "emit/one_listener_parked_worker",
        "baseline/arrayqueue_push_parked",
    );
    print_time_ratio(
        "emit/one_listener_parked_worker",
        "baseline/crossbeam_channel_parked",
    );
    print_time_ratio("emit/full_ring", "baseline/arrayqueue_full");
    print_time_ratio("emit/full_ring", "baseline/arrayqueue_full_u64");
    print_time_ratio("emit/nobody_listening", "baseline/relaxed_fetch_add");
    print_time_ratio("sessions/held", "emit/one_listener_burst");
    print_time_ratio("sessions/get_emit_drop", "emit/one_listener_burst");
    print_time_ratio(
        "sessions/get_emit_drop_evicting",
        "sessions/new_emitter_per_event",
    );
    println!("\nTARGETS (ARCHITECTURE.md § Performance targets; medians)");
    print_target("emit/nobody_listening", 5.0);
    print_target("emit/one_listener_sporadic", 50.0);
    print_target("emit/one_listener_parked_worker", 50.0);
    print_target("emit/one_listener_burst", 50.0);
    print_target("emit/full_ring", 25.0);
    print_latencies();
    println!("  (targets: emit p50 <= 50 ns, p99 <= 200 ns, p99.9 <= 1 µs)");
    for n in notes {
        println!("{n}");
    }
    print_machine_note();
}
