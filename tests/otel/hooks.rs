//! Every shell hook run is an `execute_hook {id}` child of its event's span: outcome, exit
//! code, timeout, the matcher's skip reason as a span event, stderr only with content.

use crate::receiver::{Receiver, attr};
use crate::*;
use prx_hooks::Event;
use std::time::Duration;

const HOOKS: &str = r#"{"hooks": {
    "tool_call_start": [
        {"id": "guard", "command": "/bin/sh", "args": ["-c", "echo denied >&2; exit 3"]},
        {"id": "github-only", "command": "/bin/true", "matcher": "mcp__github__*"}
    ],
    "tool_call": [
        {"id": "slow", "command": "/bin/sleep", "args": ["5"], "timeout_ms": 200},
        {"id": "audit", "command": "/bin/true"}
    ]}}"#;

fn run(content: bool) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hooks.json"), HOOKS).unwrap();
    let rx = Receiver::start();
    let hooks = prx_hooks::Hooks::builder()
        .workspace(ws.path())
        .otlp(options(&rx.url()).content(content))
        .build()
        .unwrap();
    let em = hooks.emitter("coder", "s-1");
    em.emit(Event::AgentStart {
        agent: "coder",
        session: "s-1",
    });
    em.emit(Event::ToolCallStart {
        tool: "shell",
        arguments: r#"{"cmd":"ls"}"#,
    });
    em.emit(Event::ToolCall {
        tool: "shell",
        success: true,
        output: "",
    });
    em.emit(Event::AgentEnd {
        success: true,
        messages_count: 2,
    });
    // agent + tool + four hook spans
    let spans = rx.wait_spans(6, Duration::from_secs(20));
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert_eq!(o.hook_spans, 4, "{o:?}");
    assert!(balanced(&o), "{o:?}");
    spans
}

#[test]
fn hook_runs_are_execute_hook_children_of_their_events_span() {
    let spans = run(false);
    assert_eq!(spans.len(), 6, "{:?}", names(&spans));
    let agent = one(&spans, "invoke_agent coder");
    let tool = one(&spans, "execute_tool shell");
    for name in [
        "execute_hook guard",
        "execute_hook github-only",
        "execute_hook slow",
        "execute_hook audit",
    ] {
        let h = one(&spans, name);
        assert_eq!(h.trace_id, agent.trace_id, "{name}");
        assert_eq!(
            h.parent_span_id, tool.span_id,
            "{name}: a child of the tool call"
        );
        assert_eq!(h.kind, 1, "{name}");
        assert!(h.start_time_unix_nano <= h.end_time_unix_nano, "{name}");
    }
    let guard = one(&spans, "execute_hook guard");
    assert_eq!(attr(guard, "prx.hook.outcome").as_deref(), Some("exit"));
    assert_eq!(attr(guard, "process.exit.code").as_deref(), Some("3"));
    assert_eq!(
        attr(guard, "prx.hook.event").as_deref(),
        Some("tool_call_start")
    );
    assert!(is_error(guard));
    assert!(attr(guard, "process.pid").is_some());
    assert_eq!(attr(guard, "prx.hook.stderr_tail"), None, "content is off");

    let skipped = one(&spans, "execute_hook github-only");
    assert_eq!(
        attr(skipped, "prx.hook.outcome").as_deref(),
        Some("skipped")
    );
    assert!(!is_error(skipped));
    assert_eq!(skipped.events.len(), 1);
    assert_eq!(skipped.events[0].name, "skipped");
    let reason = format!("{:?}", skipped.events[0].attributes);
    assert!(reason.contains("does not match tool"), "{reason}");

    let slow = one(&spans, "execute_hook slow");
    assert_eq!(attr(slow, "prx.hook.outcome").as_deref(), Some("timed_out"));
    assert_eq!(attr(slow, "prx.hook.timeout_ms").as_deref(), Some("200"));
    assert!(is_error(slow));
    let ms = (slow.end_time_unix_nano - slow.start_time_unix_nano) / 1_000_000;
    assert!(ms >= 200, "ran until its timeout: {ms} ms");

    let audit = one(&spans, "execute_hook audit");
    assert_eq!(attr(audit, "process.exit.code").as_deref(), Some("0"));
    assert!(!is_error(audit));
}

#[test]
fn a_hooks_stderr_tail_is_exported_only_with_content() {
    let spans = run(true);
    let guard = one(&spans, "execute_hook guard");
    assert_eq!(
        attr(guard, "prx.hook.stderr_tail").as_deref(),
        Some("denied\n")
    );
}

#[test]
fn plugin_calls_are_aggregate_execute_hook_spans_with_their_counts() {
    let ws = tempfile::tempdir().unwrap();
    let manifest = crate::support_plugins::audit_manifest();
    crate::support_plugins::install(ws.path(), "audit-hook", "audit_hook", &manifest);
    let rx = Receiver::start();
    let hooks = prx_hooks::Hooks::builder()
        .workspace(ws.path())
        .otlp(options(&rx.url()))
        .build()
        .unwrap();
    let em = hooks.emitter("coder", "s-1");
    for _ in 0..5 {
        em.emit(Event::ToolCall {
            tool: "shell",
            success: true,
            output: "",
        });
    }
    wait_for("a plugin span", || {
        rx.spans()
            .iter()
            .any(|s| s.name == "execute_hook audit-hook")
    });
    hooks.shutdown(Duration::from_secs(5));
    let spans = rx.wait_spans(1, Duration::from_secs(1));
    let plugin: Vec<_> = by_name(&spans, "execute_hook audit-hook");
    let calls: u64 = plugin
        .iter()
        .map(|s| attr(s, "prx.plugin.calls").unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(calls, 5, "every call counted once across the intervals");
    for s in plugin {
        assert_eq!(attr(s, "prx.hook.kind").as_deref(), Some("plugin"));
        assert!(!is_error(s));
        assert!(s.start_time_unix_nano <= s.end_time_unix_nano);
    }
}
