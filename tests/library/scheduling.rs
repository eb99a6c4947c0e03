//! Scheduling of shell hooks with real processes: slow hooks holding every
//! shared slot cannot starve a fast one, `max_running` caps only the shared slots, and the
//! stats and the run feed say which events were dropped and why.

use prx_hooks::config;
use prx_hooks::shell::{OutcomeKind, ShellLimits, ShellSink, event_message};
use prx_hooks::{Event, Sink};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Liveness bound (the machine is shared and loaded): generous.
const SLACK: Duration = Duration::from_secs(60);

fn sink(ws: &Path, tmp: &Path, json: &str, limits: ShellLimits) -> ShellSink {
    let table = config::parse(json.as_bytes(), "hooks.json", ws).expect("valid hooks.json");
    let sink = ShellSink::standalone(
        ws.to_path_buf(),
        ShellLimits {
            tmp_dir: Some(tmp.to_path_buf()),
            ..limits
        },
    );
    sink.set_table(Arc::new(table));
    sink
}

fn slow_hooks(n: usize, seconds: u32) -> Vec<String> {
    (0..n)
        .map(|i| format!(r#"{{"id": "slow{i}", "command": "/bin/sleep", "args": ["{seconds}"]}}"#))
        .collect()
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < SLACK, "{what}: not within {SLACK:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The reproduction: 8 hooks sleeping 20 s (8 processes each: every one of the 64
/// global slots) and one `/bin/true` hook, 300 events. Today's main gave the fast hook ok 7,
/// dropped 44, cancelled 249. The fast hook must run every event its queue had room for,
/// while the slow ones still hold their slots.
#[test]
fn slow_hooks_holding_every_slot_do_not_starve_a_fast_one() {
    let ws = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut hooks = slow_hooks(8, 20);
    hooks.push(r#"{"id": "fast", "command": "/bin/true"}"#.into());
    let json = format!(r#"{{"hooks": {{"turn_complete": [{}]}}}}"#, hooks.join(","));
    let sink = sink(ws.path(), tmp.path(), &json, ShellLimits::default());
    let feed = sink.subscribe_runs(100_000);
    let events = 300u64;
    for seq in 0..events {
        sink.deliver(&event_message(&Event::TurnComplete, "agent", "s", seq));
    }
    wait("the fast hook drains", || {
        let h = sink.stats().hooks["fast"];
        h.queued + h.running == 0
    });
    let st = sink.stats();
    let fast = st.hooks["fast"];
    assert_eq!(fast.sent, events);
    assert_eq!(
        fast.ok + fast.dropped_queue_full,
        events,
        "every event the fast hook had room for ran: {fast:?}"
    );
    assert!(fast.ok >= 256, "{fast:?}");
    assert_eq!((fast.cancelled, fast.killed, fast.exit), (0, 0, 0));
    assert_eq!(fast.dropped, fast.dropped_queue_full);
    // The slow hooks still hold every slot they may: 8 each (their max_concurrent).
    for i in 0..8 {
        assert_eq!(st.hooks[&format!("slow{i}")].running, 8, "{st:?}");
    }
    assert!(st.shared_running <= 64, "{st:?}");
    // Which events, and why: the feed names every fast event, each once, ran or dropped.
    let mut ran = BTreeSet::new();
    let mut dropped = BTreeSet::new();
    for o in feed.try_iter().filter(|o| o.id == "fast") {
        match &o.kind {
            OutcomeKind::Ok => assert!(ran.insert(o.seq)),
            OutcomeKind::Dropped { reason } => {
                assert_eq!(reason, "queue full");
                assert!(dropped.insert(o.seq));
            }
            other => panic!("fast: {other}"),
        }
    }
    assert_eq!(ran.len() as u64, fast.ok);
    assert_eq!(dropped.len() as u64, fast.dropped_queue_full);
    assert!(ran.is_disjoint(&dropped));
    assert_eq!(ran.union(&dropped).count() as u64, events);
    assert_eq!(feed.dropped(), 0);

    let stop = Instant::now();
    sink.shutdown(Instant::now() + Duration::from_millis(500));
    assert!(
        stop.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        stop.elapsed()
    );
    let st = sink.stats();
    assert!(st.totals.balanced(), "{st:?}");
    assert_eq!(st.totals.running + st.totals.queued, 0);
    assert_eq!(
        st.totals.killed, 64,
        "the slow processes are killed at shutdown"
    );
}

/// `max_running` caps the shared slots only: with a cap of 2, three hooks that each want 8
/// processes run one each (reserved) plus 2 shared — 5 in all — and a fourth hook given work
/// later still starts at once.
#[test]
fn max_running_caps_the_shared_slots_and_every_hook_keeps_its_own() {
    let ws = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let hooks = slow_hooks(3, 30);
    let json = format!(
        r#"{{"hooks": {{"turn_complete": [{}],
            "agent_end": [{{"id": "late", "command": "/bin/sleep", "args": ["30"]}}]}}}}"#,
        hooks.join(",")
    );
    let limits = ShellLimits {
        max_running: 2,
        ..ShellLimits::default()
    };
    let sink = sink(ws.path(), tmp.path(), &json, limits);
    for seq in 0..20 {
        sink.deliver(&event_message(&Event::TurnComplete, "a", "s", seq));
    }
    wait("3 reserved + 2 shared running", || {
        sink.stats().totals.running == 5
    });
    std::thread::sleep(Duration::from_millis(300));
    let st = sink.stats();
    assert_eq!((st.totals.running, st.shared_running), (5, 2), "{st:?}");
    for i in 0..3 {
        assert!(st.hooks[&format!("slow{i}")].running >= 1, "{st:?}");
    }
    sink.deliver(&event_message(
        &Event::AgentEnd {
            success: true,
            messages_count: 1,
        },
        "a",
        "s",
        20,
    ));
    wait("the late hook starts in its reserved slot", || {
        sink.stats().hooks["late"].running == 1
    });
    assert_eq!(sink.stats().shared_running, 2);
    sink.shutdown(Instant::now());
    let st = sink.stats();
    assert!(st.totals.balanced() && st.totals.running == 0, "{st:?}");
}
