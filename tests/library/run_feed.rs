//! The finished-runs hook point: `ShellSink::subscribe_runs`, with real
//! processes through the whole pipeline (`Hooks` over a real workspace).

use prx_hooks::shell::OutcomeKind;
use prx_hooks::{Event, Hooks};
use std::time::{Duration, Instant};

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(30), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn every_run_reaches_the_subscribers_and_none_reaches_the_bus() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("hooks.json"),
        r#"{"hooks": {"tool_call": [
            {"id": "ok", "command": "/bin/sh", "args": ["-c", "echo tail >&2"]},
            {"id": "bad", "command": "/bin/false"},
            {"id": "edits", "command": "/bin/true", "matcher": "Edit|Write"},
            {"id": "off", "command": "/bin/true", "enabled": false}]}}"#,
    )
    .unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let shell = hooks.shell().unwrap().clone();
    let feed = shell.subscribe_runs(64);
    let bus = hooks.bus().subscribe("*").unwrap();
    let em = hooks.emitter("agent-1", "sess-9");
    em.emit(Event::ToolCall {
        tool: "Bash",
        success: true,
        output: "",
    });
    let mut got = Vec::new();
    wait("four outcomes", || {
        got.extend(feed.try_iter());
        got.len() >= 4
    });
    got.sort_by(|a, b| a.id.cmp(&b.id));
    let kinds: Vec<(String, String)> = got
        .iter()
        .map(|o| (o.id.clone(), o.kind.to_string()))
        .collect();
    assert_eq!(kinds[0], ("bad".into(), "exit 1".into()));
    assert_eq!(
        kinds[1],
        (
            "edits".into(),
            r#"skipped (matcher "Edit|Write" does not match tool "Bash")"#.into()
        )
    );
    assert_eq!(kinds[2], ("off".into(), "skipped (disabled)".into()));
    assert_eq!(kinds[3], ("ok".into(), "ok".into()));
    for o in &got {
        assert_eq!(
            (o.agent.as_str(), o.session.as_str(), o.seq),
            ("agent-1", "sess-9", 0)
        );
        assert!(!o.direct);
    }
    assert_eq!(got[3].stderr_tail, "tail\n");
    assert!(got[3].pid.is_some() && got[1].pid.is_none());
    // Only the event itself went onto the bus: no run, no outcome.
    let on_bus: Vec<_> = bus.try_iter().collect();
    assert_eq!(on_bus.len(), 1);
    assert_eq!(on_bus[0].topic(), "prx.lifecycle.tool_call");
    // Direct runs (fire, the API's test route) are published too, marked as such.
    let msg = prx_hooks::shell::event_message(
        &Event::ToolCall {
            tool: "Write",
            success: true,
            output: "",
        },
        "fire",
        "fire",
        0,
    );
    shell.run_once(shell.table().get("edits").unwrap(), &msg);
    let o = feed.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(o.direct && o.kind.is_ok() && o.id == "edits");
    assert_eq!(feed.dropped(), 0);
    hooks.shutdown(Duration::from_secs(5));
    assert!(feed.recv().is_none(), "the subscription ends with the sink");
}

/// A subscriber that never reads loses outcomes (counted), and the runner never waits for it:
/// every event still runs.
#[test]
fn a_stalled_subscriber_misses_outcomes_counted_and_never_slows_the_runner() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("hooks.json"),
        r#"{"hooks": {"turn_complete": [{"id": "t", "command": "/bin/true"}]}}"#,
    )
    .unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let shell = hooks.shell().unwrap().clone();
    let stalled = shell.subscribe_runs(2);
    let em = hooks.emitter("a", "s");
    for _ in 0..50 {
        em.emit(Event::TurnComplete);
    }
    wait("50 runs", || shell.stats().hooks["t"].ok == 50);
    assert_eq!(stalled.queued(), 2);
    assert_eq!(stalled.delivered(), 2);
    assert_eq!(stalled.dropped(), 48);
    assert_eq!(shell.stats().run_feed.dropped, 48);
    assert_eq!(shell.stats().run_feed.subscribers, 1);
    assert!(matches!(stalled.try_recv().unwrap().kind, OutcomeKind::Ok));
    // A dropped subscription is forgotten at the next outcome.
    drop(stalled);
    em.emit(Event::TurnComplete);
    wait("one more run", || shell.stats().hooks["t"].ok == 51);
    assert_eq!(shell.stats().run_feed.subscribers, 0);
    hooks.shutdown(Duration::from_secs(5));
}
