//! End-to-end behaviour of the core pipeline: emitters → rings → workers → bus subscribers.
//! Everything here runs the real threads; nothing is mocked.

use prx_hooks::bus::TryRecvError;
use prx_hooks::{Emit, Event, EventKind, Hooks, Stats};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const OUTPUT: &str = "a tool's output, long enough to look like one: 0123456789 abcdefghij";

/// Emits without ever losing an event to a full ring or a full subscriber queue: waits while
/// the pipeline is a quarter full. (Agents do not do this; a test that counts must.)
fn emit_paced(hooks: &Hooks, em: &prx_hooks::Emitter, n: u64) {
    for i in 0..n {
        if i.is_multiple_of(1024) {
            // A quarter of all slots: below one ring's capacity even if every pending event
            // sits in the same one of the two rings.
            while hooks.pending() > hooks.capacity() / 4
                || hooks
                    .stats()
                    .subscribers
                    .iter()
                    .any(|s| s.queued > s.capacity / 2)
            {
                thread::sleep(Duration::from_micros(100));
            }
        }
        assert_eq!(
            em.emit(Event::ToolCall {
                tool: "t",
                success: i.is_multiple_of(2),
                output: OUTPUT
            }),
            Emit::Queued
        );
    }
}

/// The accounting identities, with `emitted` counted by the test itself: the library derives
/// its `emitted` from the buckets, so only an independent count can catch an emit that landed
/// in no bucket, or in two.
fn assert_balanced(stats: &Stats, emitted_by_test: u64) {
    assert_eq!(stats.emitted, emitted_by_test, "{stats:#?}");
    assert_eq!(
        emitted_by_test,
        stats.queued + stats.dropped + stats.dropped_budget + stats.oversize + stats.skipped,
        "{stats:#?}"
    );
    assert_eq!(
        stats.queued,
        stats.processed + stats.dropped_shutdown + stats.ring.depth,
        "{stats:#?}"
    );
    for sink in &stats.sinks {
        assert!(sink.counts.balanced(), "{sink:#?}");
    }
}

#[test]
fn a_million_events_all_delivered_in_order_per_emitter() {
    const PER: u64 = 500_000;
    let hooks = Arc::new(Hooks::builder().workers(2).build().unwrap());
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let reader = thread::spawn(move || {
        let mut next = std::collections::HashMap::<String, u64>::new();
        let mut total = 0u64;
        while total < 2 * PER {
            let msg = sub
                .recv_timeout(Duration::from_secs(30))
                .expect("events stopped arriving");
            let expect = next.entry(msg.session().to_string()).or_insert(0);
            assert_eq!(msg.seq(), *expect, "emitter {} out of order", msg.session());
            assert_eq!(msg.event(), Some(EventKind::ToolCall));
            assert_eq!(msg.agent(), "agent");
            *expect += 1;
            total += 1;
        }
        (total, sub)
    });
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let hooks = hooks.clone();
            thread::spawn(move || {
                let em = hooks.emitter("agent", &format!("session-{p}"));
                emit_paced(&hooks, &em, PER);
            })
        })
        .collect();
    producers.into_iter().for_each(|p| p.join().unwrap());
    let (total, sub) = reader.join().unwrap();
    assert_eq!(total, 2 * PER);
    assert!(
        matches!(sub.try_recv(), Err(TryRecvError::Empty)),
        "more than was emitted arrived"
    );

    hooks.shutdown(Duration::from_secs(5));
    let stats = hooks.stats();
    assert_balanced(&stats, 2 * PER);
    assert_eq!(
        (stats.emitted, stats.queued, stats.processed),
        (2 * PER, 2 * PER, 2 * PER)
    );
    assert_eq!((stats.dropped, stats.skipped, stats.ring.depth), (0, 0, 0));
    let bus = &stats.sinks[0];
    assert_eq!(
        (bus.name.as_str(), bus.counts.sent, bus.counts.delivered),
        ("bus", 2 * PER, 2 * PER)
    );
    assert_eq!(stats.subscribers[0].delivered, 2 * PER);
}

#[test]
fn a_stalled_subscriber_loses_only_its_own_messages_and_emit_never_blocks() {
    const PER: u64 = 500_000;
    let hooks = Arc::new(Hooks::builder().build().unwrap());
    let stalled = hooks.bus().subscribe("prx.lifecycle.tool_call").unwrap();
    // Big enough that the reading subscriber never has to drop.
    let reading = hooks
        .bus()
        .subscribe_with_capacity("*", 2 * PER as usize)
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        thread::spawn(move || {
            let mut got = 0u64;
            loop {
                match reading.recv_timeout(Duration::from_millis(50)) {
                    Ok(_) => got += 1,
                    Err(_) if done.load(Ordering::Acquire) && reading.is_empty() => {
                        return (got, reading);
                    }
                    Err(_) => {}
                }
            }
        })
    };
    let started = Instant::now();
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let em = hooks.emitter("agent", &format!("s{p}"));
            thread::spawn(move || {
                let mut outcomes = [0u64; 2];
                for _ in 0..PER {
                    match em.emit(Event::ToolCall {
                        tool: "t",
                        success: true,
                        output: OUTPUT,
                    }) {
                        Emit::Queued => outcomes[0] += 1,
                        _ => outcomes[1] += 1,
                    }
                }
                outcomes
            })
        })
        .collect();
    let outcomes: Vec<_> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    // Liveness, with generous slack: a million non-blocking calls finish in well under a second.
    assert!(started.elapsed() < Duration::from_secs(60), "emit blocked");

    hooks.shutdown(Duration::from_secs(10));
    done.store(true, Ordering::Release);
    let (got, reading) = reader.join().unwrap();
    let stats = hooks.stats();
    assert_balanced(&stats, 2 * PER);
    let queued: u64 = outcomes.iter().map(|o| o[0]).sum();
    assert_eq!(stats.emitted, 2 * PER);
    assert_eq!(stats.queued, queued);
    assert_eq!(stats.dropped, outcomes.iter().map(|o| o[1]).sum::<u64>());
    assert_eq!(stats.processed, queued, "shutdown must drain the ring");
    assert_eq!(got, queued, "the reading subscriber lost events");
    assert_eq!(reading.dropped(), 0);
    assert_eq!(stalled.delivered(), stalled.capacity() as u64);
    assert_eq!(stalled.dropped(), queued - stalled.capacity() as u64);
    assert_eq!(stalled.len(), stalled.capacity());
    let bus = stats.sinks[0].counts;
    assert_eq!(bus.sent, 2 * queued);
    assert_eq!(bus.dropped, stalled.dropped());
    assert_eq!(bus.delivered, queued + stalled.capacity() as u64);
}

#[test]
fn nobody_listening_means_skipped_and_interest_follows_subscriptions() {
    let hooks = Hooks::builder().build().unwrap();
    let em = hooks.emitter("a", "s");
    assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    let sub = hooks.bus().subscribe("prx.lifecycle.error").unwrap();
    assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    assert_eq!(
        em.emit(Event::Error {
            component: "c",
            message: "m"
        }),
        Emit::Queued
    );
    let msg = sub.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (msg.topic(), msg.json_str()),
        ("prx.lifecycle.error", r#"{"component":"c","message":"m"}"#)
    );
    assert_eq!(msg.seq(), 0, "skipped events do not take sequence numbers");
    drop(sub);
    assert_eq!(
        em.emit(Event::Error {
            component: "c",
            message: "m"
        }),
        Emit::Skipped
    );
    let stats = hooks.stats();
    assert_eq!((stats.emitted, stats.skipped, stats.queued), (4, 3, 1));
}

#[test]
fn large_events_use_the_budget_and_oversize_ones_are_dropped_and_counted() {
    let hooks = Hooks::builder()
        .inline_bytes(64)
        .max_event_bytes(100_000)
        .build()
        .unwrap();
    let sub = hooks.bus().subscribe("*").unwrap();
    let em = hooks.emitter("agent", "session");
    let big = "é".repeat(40_000); // 80,000 bytes: above inline, within the limit
    assert_eq!(
        em.emit(Event::ToolCall {
            tool: "t",
            success: true,
            output: &big
        }),
        Emit::Queued
    );
    let msg = sub.recv_timeout(Duration::from_secs(10)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(msg.json()).unwrap();
    assert_eq!(v["output"], big.as_str());
    let huge = "x".repeat(100_001);
    assert_eq!(
        em.emit(Event::ToolCall {
            tool: "t",
            success: true,
            output: &huge
        }),
        Emit::Dropped
    );
    hooks.shutdown(Duration::from_secs(5));
    let stats = hooks.stats();
    assert_eq!((stats.queued, stats.oversize, stats.dropped), (1, 1, 0));
    assert_eq!(
        stats.dropped_bytes,
        (100_001 + 1 + "agent".len() + "session".len()) as u64
    );
    assert_eq!(
        stats.ring.budget_in_use, 0,
        "budget bytes must come back once processed"
    );
    assert_balanced(&stats, 2);
}

#[test]
fn shutdown_drains_then_closes_and_later_emits_are_skipped() {
    let hooks = Hooks::builder().build().unwrap();
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let em = hooks.emitter("a", "s");
    for _ in 0..10_000 {
        em.emit(Event::TurnComplete);
    }
    hooks.shutdown(Duration::from_secs(10));
    hooks.shutdown(Duration::from_secs(10)); // idempotent
    assert_eq!(sub.try_iter().count(), 10_000);
    assert!(matches!(sub.try_recv(), Err(TryRecvError::Closed)));
    assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    assert!(hooks.bus().subscribe("*").is_err());
    let stats = hooks.stats();
    assert_eq!((stats.processed, stats.ring.depth), (10_000, 0));
}

#[test]
fn clones_share_the_sequence_and_emitters_are_send_sync() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<prx_hooks::Emitter>();
    fn assert_send<T: Send>() {}
    assert_send::<prx_hooks::Subscription>();
    let hooks = Hooks::builder().build().unwrap();
    let sub = hooks.bus().subscribe("*").unwrap();
    let em = hooks.emitter("a", "s");
    let clone = em.clone();
    em.emit(Event::TurnComplete);
    clone.emit(Event::TurnComplete);
    let seqs: Vec<_> = (0..2)
        .map(|_| sub.recv_timeout(Duration::from_secs(10)).unwrap().seq())
        .collect();
    assert_eq!(seqs, [0, 1]);
}

#[test]
fn builder_rejects_bad_options_with_a_reason() {
    let err =
        |b: prx_hooks::HooksBuilder| b.build().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(Hooks::builder().workers(0)).contains("workers = 0: must be between 1 and 64"));
    assert!(err(Hooks::builder().ring_capacity(1)).contains("ring_capacity"));
    assert!(
        err(Hooks::builder().workspace("/definitely/not/here")).contains("/definitely/not/here")
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    assert!(err(Hooks::builder().workspace(file.path())).contains("is not a directory"));
}

#[test]
fn extras_reach_subscribers_after_the_documented_fields_and_count_against_the_budgets() {
    use prx_hooks::Extras;
    let hooks = Hooks::builder()
        .inline_bytes(64)
        .max_event_bytes(1000)
        .build()
        .unwrap();
    let sub = hooks.bus().subscribe("*").unwrap();
    let em = hooks.emitter("a", "s");
    // PRX's runtime shapes: agent_start with provider/model, agent_end without its fields.
    let start = Extras::fields(r#"{"provider":"openai","model":"gpt-x"}"#);
    let r = em.emit_with_extras(
        Event::AgentStart {
            agent: "a",
            session: "s",
        },
        &start,
    );
    assert_eq!(r, Ok(Emit::Queued));
    let end = Extras::fields(r#"{"duration_ms":12,"tokens_used":300}"#)
        .omit(&["success", "messages_count"]);
    let r = em.emit_with_extras(
        Event::AgentEnd {
            success: false,
            messages_count: 0,
        },
        &end,
    );
    assert_eq!(r, Ok(Emit::Queued));
    let got: Vec<String> = (0..2)
        .map(|_| {
            sub.recv_timeout(Duration::from_secs(10))
                .unwrap()
                .json_str()
                .to_string()
        })
        .collect();
    assert_eq!(
        got,
        [
            r#"{"agent":"a","session":"s","provider":"openai","model":"gpt-x"}"#,
            r#"{"duration_ms":12,"tokens_used":300}"#
        ]
    );
    // Extras count against max_event_bytes (1000) like any field: 990 bytes of them drop it.
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(990));
    let r = em.emit_with_extras(Event::TurnComplete, &Extras::fields(&big));
    assert_eq!(r, Ok(Emit::Dropped));
    // Refused extras are an error to the caller, counted, and never emitted.
    let bad = em.emit_with_extras(Event::TurnComplete, &Extras::fields(r#"{"a":1,"a":2}"#));
    assert!(
        bad.unwrap_err()
            .to_string()
            .contains(r#"member "a" appears twice"#)
    );
    hooks.shutdown(Duration::from_secs(5));
    let stats = hooks.stats();
    assert_eq!(
        (stats.queued, stats.oversize, stats.refused_extras),
        (2, 1, 1)
    );
    assert_balanced(&stats, 3);
}
