//! The session map under races (ARCHITECTURE.md § Ingest): threads racing on one key get one
//! emitter, and a key's events keep their order and numbering across releases, while other
//! threads churn the map with new keys so that it releases and evicts all the time.

use prx_hooks::ingest::{IngestOptions, LineIngest, SessionOptions};
use prx_hooks::{Emit, Event, Hooks};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Four threads emit 5,120 events each for the same two keys through the map (a tiny one: 16
/// entries, idle time 0, so entries go whenever they have nothing in flight), two more threads
/// churn it with a thousand keys each all the time (releases and evictions), on four workers
/// (four rings). The producers go in rounds of 256 events a thread; between rounds both keys
/// are released, so every round makes them again, with four threads racing to do it. For each
/// key the subscriber must see `seq` 0, 1, 2, … with no gap or repeat — a second emitter for a
/// key (a lost race, or a release while its events are in flight) would repeat numbers — and
/// each thread's events in the order it emitted them, across every release.
#[test]
fn one_keys_events_keep_order_and_seq_across_releases_with_threads_racing() {
    let hooks = Arc::new(
        Hooks::builder()
            .workers(4)
            .sessions(SessionOptions::default().max(16).idle(Duration::ZERO))
            .build()
            .unwrap(),
    );
    let sub = hooks
        .bus()
        .subscribe_with_capacity("prx.lifecycle.tool_call", 1 << 20)
        .unwrap();
    const PER: u64 = 5_000;
    const KEYS: [&str; 2] = ["k0", "k1"];
    // The subscriber is read while the threads run, checking as it goes; it stops once it has
    // seen `expected` events of the two keys (known when the producers are done).
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let checker = {
        let expected = expected.clone();
        std::thread::spawn(move || {
            let mut next_seq: HashMap<String, u64> = HashMap::new();
            let mut last: HashMap<(String, u64), u64> = HashMap::new();
            let mut seen = 0;
            let mut deadline = None;
            loop {
                let want_all = expected.load(Ordering::Acquire);
                if seen >= want_all {
                    break;
                }
                let msg = match sub.recv_timeout(Duration::from_millis(100)) {
                    Ok(msg) => msg,
                    Err(e) => {
                        // Once the total is known, the rest must come within 20 s.
                        if want_all != u64::MAX {
                            let d =
                                *deadline.get_or_insert(Instant::now() + Duration::from_secs(20));
                            assert!(
                                Instant::now() < d,
                                "every event of the two keys arrives: {e:?} after {seen} of {want_all}, seq {next_seq:?}, {} dropped by the subscriber",
                                sub.dropped()
                            );
                        }
                        continue;
                    }
                };
                if !KEYS.contains(&msg.agent()) {
                    continue;
                }
                seen += 1;
                let want = next_seq.entry(msg.agent().to_string()).or_insert(0);
                assert_eq!(
                    msg.seq(),
                    *want,
                    "{}: seq out of order or repeated",
                    msg.agent()
                );
                *want += 1;
                let payload: serde_json::Value = serde_json::from_slice(msg.json()).unwrap();
                let (t, i) = payload["tool"].as_str().unwrap().split_once(':').unwrap();
                let (t, i): (u64, u64) = (t.parse().unwrap(), i.parse().unwrap());
                let prev = last.insert((msg.agent().to_string(), t), i);
                assert!(
                    prev.is_none_or(|p| p < i),
                    "thread {t}'s events of {} out of order: {prev:?} then {i}",
                    msg.agent()
                );
            }
            (seen, next_seq.values().sum::<u64>(), sub.dropped())
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..2)
        .map(|c| {
            let (hooks, stop) = (hooks.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    // A pool of keys, so that the remembered numbers stay within their bound
                    // (a forgotten k0 or k1 would start again at 0).
                    match hooks
                        .sessions()
                        .get(&format!("churn-{c}-{}", n % 1000), "s")
                    {
                        // One in 16 is queued (in flight for a while), the rest nobody
                        // listens to (never in flight): the map always has some of both,
                        // without the churn taking the ring from the producers.
                        Ok(em) if n.is_multiple_of(16) => {
                            em.emit(Event::ToolCall {
                                tool: "churn",
                                success: true,
                                output: "",
                            });
                        }
                        Ok(em) => {
                            em.emit(Event::TurnComplete);
                        }
                        Err(_) => std::thread::yield_now(),
                    }
                }
            })
        })
        .collect();
    // In rounds of 256 events a thread; between rounds the producers pause together for a
    // moment, so that the keys' events are read and the churn releases them, and then race
    // to make each key again.
    let round = Arc::new(std::sync::Barrier::new(4));
    let done = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let stuck = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..4)
        .map(|t| {
            let (hooks, round, done) = (hooks.clone(), round.clone(), done.clone());
            let (rounds, stuck) = (rounds.clone(), stuck.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                loop {
                    for _ in 0..256 {
                        let key = KEYS[(i % 2) as usize];
                        let tool = format!("{t}:{i}");
                        loop {
                            // Refused only while the map is full of entries in flight.
                            let Ok(em) = hooks.sessions().get(key, "s") else {
                                std::thread::yield_now();
                                continue;
                            };
                            let ev = Event::ToolCall {
                                tool: &tool,
                                success: true,
                                output: "",
                            };
                            // Dropped (the ring full): try again. Skipped only when the
                            // checker gave up (and dropped the subscription): stop trying.
                            if em.emit(ev) != Emit::Dropped {
                                break;
                            }
                            drop(em);
                            std::thread::yield_now();
                        }
                        i += 1;
                    }
                    if round.wait().is_leader() {
                        // Both keys go before the next round (read by now, unpinned, idle 0):
                        // every round makes each of them again, from its remembered `seq`.
                        let deadline = Instant::now() + Duration::from_secs(10);
                        // (No panic here: the other producers would wait at the barrier.)
                        while KEYS.iter().any(|k| hooks.sessions().holds(k, "s")) {
                            if Instant::now() > deadline {
                                stuck.store(true, Ordering::Relaxed);
                                break;
                            }
                            hooks.sessions().sweep();
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        rounds.fetch_add(1, Ordering::Relaxed);
                        done.store(i >= PER || stuck.load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                    round.wait();
                    if done.load(Ordering::Relaxed) {
                        return i;
                    }
                }
            })
        })
        .collect();
    let emitted: u64 = producers.into_iter().map(|p| p.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    churn.into_iter().for_each(|c| c.join().unwrap());
    expected.store(emitted, Ordering::Release);
    let (seen, numbered, sub_dropped) = checker.join().unwrap();
    assert_eq!((seen, numbered, sub_dropped), (emitted, emitted, 0));

    assert!(
        !stuck.load(Ordering::Relaxed),
        "k0 and k1 were not released within 10 s"
    );
    let rounds = rounds.load(Ordering::Relaxed);
    assert_eq!(rounds, PER.div_ceil(256));
    let stats = hooks.stats();
    let s = stats.sessions().unwrap();
    assert!(
        s.resumed >= 2 * (rounds - 1),
        "each key made again after each pause went on from its number: {s:?}"
    );
    assert_eq!(s.opened, s.live + s.released + s.evicted, "{s:?}");
    assert_eq!(s.forgotten, 0, "{s:?}");
}

/// The ingest's accounting: every line in exactly one bucket, the first 100 errors kept with
/// their line and column, then only counted — the JSON an HTTP route answers.
#[test]
fn the_line_ingest_counts_every_line_once_and_keeps_the_first_hundred_errors() {
    let hooks = Hooks::builder()
        .max_event_bytes(1000)
        .sessions(SessionOptions::default().max(1))
        .build()
        .unwrap();
    let _sub = hooks.bus().subscribe("prx.lifecycle.tool_call").unwrap();
    let mut text = String::new();
    let ok = |agent: &str| {
        format!(
            r#"{{"event":"tool_call","agent":"{agent}","session":"s","payload":{{"tool":"t","success":true,"output":""}}}}"#
        ) + "\n"
    };
    text += &ok("a"); // 1 queued
    text += "\n   \n"; // 2, 3 blank
    text +=
        r#"{"event":"error","agent":"a","session":"s","payload":{"component":"c","message":"m"}}"#; // 4 skipped
    text += "\n";
    text += &format!(
        r#"{{"event":"tool_call","agent":"a","session":"s","payload":{{"tool":"t","success":true,"output":"{}"}}}}"#,
        "x".repeat(2000)
    ); // 5 oversize
    text += "\n";
    for _ in 0..120 {
        text += "{\"event\":\"tool_call\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{\"tool\":\"t\",\"success\":\"yes\",\"output\":\"\"}}\n";
    }
    let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
    ingest.feed(text.as_bytes());
    // With room for one key, a pinned key refuses another.
    let held = hooks.sessions().get("a", "s").unwrap();
    let out = ingest.line(200, ok("b").as_bytes());
    assert_eq!(out.outcome, prx_hooks::ingest::Outcome::Refused);
    drop(held);
    let r = ingest.report();
    assert_eq!((r.queued, r.skipped, r.dropped, r.refused), (1, 1, 0, 1));
    assert_eq!(r.errors.len(), 100);
    assert_eq!(
        r.more_errors, 21,
        "121 errors: the oversize line and 120 bad ones"
    );
    assert_eq!(r.lines(), 124);
    assert_eq!(r.errors[0].line, 5);
    assert!(
        r.errors[0]
            .message
            .contains("exceeds max_event_bytes (1000)"),
        "{:?}",
        r.errors[0]
    );
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(
        json["errors"][1],
        serde_json::json!({"line": 6, "column": 80, "message": "payload.success: expected a boolean, found a string \"yes\""})
    );
    // The members in the documented order (a `Value`'s map would sort them: look at the text).
    let text = serde_json::to_string(r).unwrap();
    assert!(
        text.starts_with(r#"{"queued":1,"dropped":0,"skipped":1,"refused":1,"errors":[{"#)
            && text.ends_with(r#"}],"more_errors":21}"#),
        "{text}"
    );
    // `emit` saw the oversize event too, and counted it.
    assert_eq!(hooks.stats().oversize, 1);
}

/// Agent and session names are bounded (`ndjson::MAX_NAME_BYTES`, 256 bytes): a line with a
/// longer one is an error naming the field and the limit, counted once, and its key never
/// reaches the session map; a name of exactly the limit is an event like any. Topic lines
/// follow the same rule.
#[test]
fn a_name_longer_than_the_limit_is_an_error_naming_it_and_never_reaches_the_session_map() {
    const LIMIT: usize = 256;
    let hooks = Hooks::builder().build().unwrap();
    let _sub = hooks.bus().subscribe("*").unwrap();
    let line = |agent: &str, session: &str| {
        format!(
            r#"{{"event":"tool_call","agent":"{agent}","session":"{session}","payload":{{"tool":"t","success":true,"output":""}}}}"#
        ) + "\n"
    };
    let at_limit = "a".repeat(LIMIT);
    let mut text = line(&at_limit, &at_limit);
    text += &line(&"a".repeat(LIMIT + 1), "s");
    text += &line("a", &"s".repeat(1 << 20));
    text += &format!(
        r#"{{"topic":"prx.agent.a.Note","agent":"a","session":"{}","payload":{{}}}}"#,
        "s".repeat(LIMIT + 1)
    );
    text += "\n";
    let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
    ingest.feed(text.as_bytes());
    let r = ingest.report();
    assert_eq!(
        (r.queued, r.dropped, r.skipped, r.refused),
        (1, 0, 0, 0),
        "{r:?}"
    );
    assert_eq!(r.errors.len(), 3, "{r:?}");
    let fields = ["agent", "session", "session"];
    for (e, field) in r.errors.iter().zip(fields) {
        assert!(
            e.message.starts_with(&format!("{field}: "))
                && e.message.contains(&format!("{LIMIT} bytes")),
            "names the field and the limit: {e:?}"
        );
    }
    assert!(
        r.errors[1].message.contains("1048576 bytes"),
        "{:?}",
        r.errors[1]
    );
    let s = hooks.stats().sessions().cloned().unwrap();
    assert_eq!(
        s.opened, 1,
        "only the name at the limit got an emitter: {s:?}"
    );
}
