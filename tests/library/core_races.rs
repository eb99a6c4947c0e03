//! The core's promises under races and overload: shutdown keeps its deadline while
//! producers keep emitting, emits racing shutdown are never stranded, `seq` follows delivery
//! order for clones on several threads, and the byte budget never refuses an event it has room
//! for. Real threads, real pipeline; liveness is asserted with generous slack, never speed.

use prx_hooks::{Emit, Event, Hooks, SHUTDOWN_SLACK};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// What a loaded 2-core machine may add to any deadline here (scheduling, not work).
const SLACK: Duration = Duration::from_secs(1);

/// A `tool_call` whose output is 64 KiB of control characters: cheap to copy into the ring,
/// slow to serialize (every byte becomes a six-byte `\u00XX` escape).
fn control_output() -> String {
    (0..64 * 1024)
        .map(|i| char::from((i % 31 + 1) as u8))
        .collect()
}

/// Emits `event` until `stop`, counting what `emit` answered (the test's own count, independent
/// of the library's counters).
fn emit_until(
    em: prx_hooks::Emitter,
    stop: Arc<AtomicBool>,
    output: String,
) -> thread::JoinHandle<HashMap<Emit, u64>> {
    thread::spawn(move || {
        let mut answers = HashMap::new();
        let give_up = Instant::now() + Duration::from_secs(20);
        while !stop.load(Ordering::Relaxed) && Instant::now() < give_up {
            let r = em.emit(Event::ToolCall {
                tool: "t",
                success: true,
                output: &output,
            });
            *answers.entry(r).or_insert(0) += 1;
        }
        answers
    })
}

#[test]
fn shutdown_keeps_its_deadline_while_a_producer_keeps_emitting_slow_events() {
    let hooks = Hooks::builder().build().unwrap();
    let _sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap(); // never read
    let stop = Arc::new(AtomicBool::new(false));
    let producer = emit_until(hooks.emitter("a", "s"), stop.clone(), control_output());
    thread::sleep(Duration::from_millis(300)); // the ring and the budget fill up
    let timeout = Duration::from_millis(100);
    let t = Instant::now();
    hooks.shutdown(timeout);
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let answers = producer.join().unwrap();
    assert!(
        took <= timeout + SHUTDOWN_SLACK + SLACK,
        "shutdown(100 ms) took {took:?} while a producer kept emitting"
    );
    let stats = hooks.stats();
    assert_eq!(stats.queued, answers[&Emit::Queued], "{stats:#?}");
    assert_eq!(
        stats.queued,
        stats.processed + stats.dropped_shutdown,
        "queued events neither processed nor counted: {stats:#?}"
    );
    assert!(
        stats.dropped_shutdown > 0,
        "the deadline passed with events queued, yet none was counted: {stats:#?}"
    );
}

#[test]
fn dropping_hooks_keeps_the_shutdown_timeout_while_a_producer_keeps_emitting() {
    let timeout = Duration::from_millis(100);
    let hooks = Hooks::builder().shutdown_timeout(timeout).build().unwrap();
    let _sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = emit_until(hooks.emitter("a", "s"), stop.clone(), control_output());
    thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    drop(hooks);
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();
    assert!(
        took <= timeout + SHUTDOWN_SLACK + SLACK,
        "dropping Hooks (shutdown_timeout 100 ms) took {took:?}"
    );
}

/// One round: a thread emits while another shuts down at a random moment. Returns the emit
/// answers and the final stats.
fn race_once(round: u64) {
    let hooks = Arc::new(Hooks::builder().ring_capacity(1024).build().unwrap());
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let em = hooks.emitter("a", "s");
    let start = Arc::new(Barrier::new(2));
    let shut = Arc::new(AtomicBool::new(false));
    let producer = {
        let (start, shut) = (start.clone(), shut.clone());
        thread::spawn(move || {
            let (mut queued, mut dropped, mut skipped_after_shut) = (0u64, 0u64, 0u64);
            let mut skipped_seen = false;
            start.wait();
            // Until shutdown has returned, and then a few more: those must all be Skipped.
            let mut after = 0;
            while after < 100 {
                let shut_before = shut.load(Ordering::Acquire);
                match em.emit(Event::TurnComplete) {
                    Emit::Queued => {
                        assert!(!skipped_seen, "round {round}: Queued after a Skipped");
                        assert!(
                            !shut_before,
                            "round {round}: Queued after shutdown returned"
                        );
                        queued += 1;
                    }
                    Emit::Dropped => dropped += 1,
                    Emit::Skipped => {
                        skipped_seen = true;
                        if shut_before {
                            skipped_after_shut += 1;
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
                if shut_before {
                    after += 1;
                }
            }
            (queued, dropped, skipped_after_shut)
        })
    };
    start.wait();
    // A random moment: some rounds shut down at once, some after the ring has filled.
    let spin = (round * 7919) % 4000;
    for _ in 0..spin {
        std::hint::spin_loop();
    }
    hooks.shutdown(Duration::from_secs(5));
    shut.store(true, Ordering::Release);
    let (queued, dropped, skipped_after) = producer.join().unwrap();
    assert_eq!(skipped_after, 100, "round {round}");
    let stats = hooks.stats();
    assert_eq!(stats.queued, queued, "round {round}: {stats:#?}");
    assert_eq!(stats.dropped, dropped, "round {round}: {stats:#?}");
    assert_eq!(
        stats.processed + stats.dropped_shutdown,
        queued,
        "round {round}: an event that returned Queued was stranded: {stats:#?}"
    );
    // A 5 s deadline is never reached by 1,024 turn_complete events: everything was delivered.
    assert_eq!(stats.dropped_shutdown, 0, "round {round}: {stats:#?}");
    assert_eq!(sub.try_iter().count() as u64, queued, "round {round}");
}

#[test]
fn every_emit_racing_shutdown_is_delivered_or_counted_and_later_ones_are_skipped() {
    let rounds: u64 = std::env::var("PRX_HOOKS_RACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for round in 0..rounds {
        race_once(round);
    }
}

#[test]
fn seq_is_strictly_increasing_per_emitter_in_delivery_order_with_clones_on_four_threads() {
    const THREADS: u64 = 4;
    const PER: u64 = 300_000;
    let hooks = Arc::new(Hooks::builder().workers(2).build().unwrap());
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    // Two emitters (one per ring), each cloned onto two threads.
    let emitters = [hooks.emitter("a", "one"), hooks.emitter("a", "two")];
    let reader = thread::spawn(move || {
        let mut next: HashMap<String, u64> = HashMap::new();
        let mut inversions = 0u64;
        let mut total = 0u64;
        while total < THREADS * PER {
            let msg = sub
                .recv_timeout(Duration::from_secs(30))
                .expect("events stopped arriving");
            let expect = next.entry(msg.session().to_string()).or_insert(0);
            if msg.seq() != *expect {
                inversions += 1;
            }
            *expect = msg.seq() + 1;
            total += 1;
        }
        (inversions, next)
    });
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let hooks = hooks.clone();
            let em = emitters[(t % 2) as usize].clone();
            thread::spawn(move || {
                for i in 0..PER {
                    if i % 1024 == 0 {
                        // Pace on the ring and on the reader's queue: nothing may drop.
                        while hooks.pending() > hooks.capacity() / 8
                            || hooks
                                .stats()
                                .subscribers
                                .iter()
                                .any(|s| s.queued > s.capacity / 4)
                        {
                            thread::sleep(Duration::from_micros(50));
                        }
                    }
                    assert_eq!(em.emit(Event::TurnComplete), Emit::Queued);
                }
            })
        })
        .collect();
    producers.into_iter().for_each(|p| p.join().unwrap());
    let (inversions, next) = reader.join().unwrap();
    assert_eq!(inversions, 0, "seq out of delivery order");
    // Consecutive from 0: each emitter's last seq + 1 is its event count.
    assert_eq!(next["one"], 2 * PER);
    assert_eq!(next["two"], 2 * PER);
}

#[test]
fn the_byte_budget_never_refuses_an_event_it_has_room_for() {
    // Budget 100 KiB. One thread keeps asking for 150 KiB (never fits: always refused). Another
    // emits 2 KiB events with at most 16 in the ring (32 KiB): each one always fits, so none
    // may be refused — a failing reservation must not borrow budget, even for an instant.
    let hooks = Arc::new(
        Hooks::builder()
            .ring_capacity(64)
            .byte_budget(100 << 10)
            .max_event_bytes(200 << 10)
            .build()
            .unwrap(),
    );
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let drain = {
        thread::spawn(
            move || {
                while sub.recv_timeout(Duration::from_secs(2)).is_ok() {}
            },
        )
    };
    let stop = Arc::new(AtomicBool::new(false));
    let hog = {
        let (em, stop) = (hooks.emitter("hog", "s"), stop.clone());
        let big = "x".repeat(150 << 10);
        thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(
                    em.emit(Event::Error {
                        component: "c",
                        message: &big
                    }),
                    Emit::Dropped
                );
                n += 1;
            }
            n
        })
    };
    let em = hooks.emitter("fits", "s");
    let small = "y".repeat(2 << 10);
    let refused = AtomicU64::new(0);
    for _ in 0..200_000 {
        while hooks.pending() >= 16 {
            std::hint::spin_loop();
        }
        if em.emit(Event::Error {
            component: "c",
            message: &small,
        }) != Emit::Queued
        {
            refused.fetch_add(1, Ordering::Relaxed);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let hog_tries = hog.join().unwrap();
    hooks.shutdown(Duration::from_secs(5));
    drain.join().unwrap();
    assert!(hog_tries > 0);
    assert_eq!(
        refused.load(Ordering::Relaxed),
        0,
        "events that fit the budget were refused ({hog_tries} oversized reservations raced them)"
    );
    assert_eq!(hooks.stats().dropped_budget, hog_tries);
}

/// docs/stats.md § Stats: `queued = processed + dropped_shutdown + ring.depth` holds in every
/// snapshot, not only at rest: two threads emit, one receives, one takes snapshots as fast as
/// it can and checks each (and that the counters never go back); the receiver checks that what
/// it received is counted as processed.
#[test]
fn the_accounting_identity_holds_in_every_snapshot_while_events_flow() {
    let hooks = Arc::new(
        Hooks::builder()
            .ring_capacity(1024)
            .workers(2)
            .build()
            .unwrap(),
    );
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2)
        .map(|i| {
            let (em, stop) = (hooks.emitter("a", &format!("s{i}")), stop.clone());
            thread::spawn(move || {
                let big = "x".repeat(300); // above the inline bytes: the budget path too
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let r = if n.is_multiple_of(4) {
                        em.emit(Event::Error {
                            component: "c",
                            message: &big,
                        })
                    } else {
                        em.emit(Event::TurnComplete)
                    };
                    n += 1;
                    if r == Emit::Dropped {
                        thread::yield_now();
                    }
                }
                n
            })
        })
        .collect();
    let receiver = {
        let (hooks, stop) = (hooks.clone(), stop.clone());
        thread::spawn(move || {
            let (mut received, mut behind) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                if sub.recv_timeout(Duration::from_millis(10)).is_ok() {
                    received += 1;
                    if received % 64 == 0 && hooks.stats().processed < received {
                        behind += 1;
                    }
                }
            }
            (received, behind)
        })
    };
    let deadline = Instant::now() + Duration::from_millis(1500);
    let (mut snapshots, mut broken) = (0u64, Vec::new());
    let (mut last_queued, mut last_processed) = (0, 0);
    while Instant::now() < deadline {
        let s = hooks.stats();
        snapshots += 1;
        let ok = s.queued == s.processed + s.dropped_shutdown + s.ring.depth
            && s.emitted == s.queued + s.dropped + s.dropped_budget + s.oversize + s.skipped
            && s.queued >= last_queued
            && s.processed >= last_processed;
        if !ok && broken.len() < 5 {
            broken.push(format!(
                "queued {} processed {} dropped_shutdown {} depth {} (previous queued {last_queued}, processed {last_processed})",
                s.queued, s.processed, s.dropped_shutdown, s.ring.depth
            ));
        }
        (last_queued, last_processed) = (s.queued, s.processed);
    }
    stop.store(true, Ordering::Relaxed);
    let emitted: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
    let (received, behind) = receiver.join().unwrap();
    eprintln!("{snapshots} snapshots, {emitted} emits, {received} received");
    assert!(
        broken.is_empty(),
        "snapshots that do not balance: {broken:#?}"
    );
    assert_eq!(
        behind, 0,
        "a received message must already count as processed"
    );
    assert!(
        snapshots > 1000 && received > 1000,
        "{snapshots} {received}"
    );
    hooks.shutdown(Duration::from_secs(5));
    let s = hooks.stats();
    assert_eq!(s.emitted, emitted);
    assert_eq!(
        (s.ring.depth, s.queued),
        (0, s.processed + s.dropped_shutdown)
    );
}

/// The exact case: one event emitted, received, then a snapshot. It was `queued 1, processed
/// 0, depth 0` in three of five tries (the worker counted a batch after handing it over).
#[test]
fn a_snapshot_right_after_recv_counts_the_received_event() {
    // With a workspace the worker hands each batch to the shell sink after the bus: the
    // subscriber is already reading while the worker is still busy with the batch.
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("hooks.json"),
        r#"{"hooks": {"turn_complete": [{"command": "/bin/true"}]}}"#,
    )
    .unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let em = hooks.emitter("a", "s");
    for n in 1..=300u64 {
        assert_eq!(em.emit(Event::TurnComplete), Emit::Queued);
        // Polled, as a host's event loop would: the snapshot follows the message at once.
        let give_up = Instant::now() + Duration::from_secs(5);
        while sub.try_recv().is_err() {
            assert!(Instant::now() < give_up, "event {n} never arrived");
            std::hint::spin_loop();
        }
        let s = hooks.stats();
        assert_eq!(
            (s.queued, s.processed, s.ring.depth),
            (n, n, 0),
            "after receiving event {n}: queued {}, processed {}, depth {}",
            s.queued,
            s.processed,
            s.ring.depth
        );
    }
}
