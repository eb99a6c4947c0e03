//! Every shell hook run is an `execute_hook {id}` child of its event's span: outcome, exit
//! code, timeout, the matcher's skip reason as a span event, stderr only with content.

use crate::receiver::{Receiver, attr};
use crate::*;
use opentelemetry_proto::tonic::trace::v1::Span;
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

fn run(content: bool) -> Vec<Span> {
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

/// The audit-hook plugin in a workspace, exporting with `per_second` plugin spans; `n`
/// `tool_call` events (each an `execute_tool` span of its own). Returns the spans.
fn plugin_run(per_second: u32, n: usize) -> Vec<Span> {
    let ws = tempfile::tempdir().unwrap();
    let manifest = crate::support_plugins::audit_manifest();
    crate::support_plugins::install(ws.path(), "audit-hook", "audit_hook", &manifest);
    let rx = Receiver::start();
    let hooks = prx_hooks::Hooks::builder()
        .workspace(ws.path())
        .otlp(options(&rx.url()).plugin_spans(per_second))
        .build()
        .unwrap();
    let em = hooks.emitter("coder", "s-1");
    for _ in 0..n {
        em.emit(Event::ToolCall {
            tool: "shell",
            success: true,
            output: "",
        });
    }
    // Every call in a span of its own or counted in an aggregate (ended within a second or
    // two of its window), before shutdown.
    wait_for("every plugin call exported", || {
        let spans = rx.spans();
        let calls: usize = by_name(&spans, "execute_hook audit-hook")
            .iter()
            .map(|s| attr(s, "prx.plugin.calls").map_or(1, |c| c.parse().unwrap()))
            .sum();
        calls >= n
    });
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert!(balanced(&o), "{o:?}");
    assert_eq!(o.runs_missed, 0, "{o:?}");
    rx.spans()
}

#[test]
fn each_plugin_call_is_an_execute_hook_child_of_its_events_span_with_outcome_and_duration() {
    let spans = plugin_run(100, 5);
    let tools = by_name(&spans, "execute_tool shell");
    assert_eq!(tools.len(), 5, "{:?}", names(&spans));
    let plugin = by_name(&spans, "execute_hook audit-hook");
    assert_eq!(plugin.len(), 5, "a span per call: {:?}", names(&spans));
    let mut parents: Vec<_> = plugin.iter().map(|s| s.parent_span_id.clone()).collect();
    parents.sort();
    let mut tool_ids: Vec<_> = tools.iter().map(|s| s.span_id.clone()).collect();
    tool_ids.sort();
    assert_eq!(
        parents, tool_ids,
        "each call is a child of its own event's span"
    );
    for s in plugin {
        let tool = tools
            .iter()
            .find(|t| t.span_id == s.parent_span_id)
            .unwrap();
        assert_eq!(s.trace_id, tool.trace_id, "in its event's trace");
        assert_eq!(attr(s, "prx.hook.kind").as_deref(), Some("plugin"));
        assert_eq!(attr(s, "prx.hook.id").as_deref(), Some("audit-hook"));
        assert_eq!(attr(s, "prx.hook.outcome").as_deref(), Some("ok"));
        assert_eq!(attr(s, "prx.hook.event").as_deref(), Some("tool_call"));
        assert_eq!(attr(s, "prx.plugin.calls"), None, "not an aggregate");
        assert!(!is_error(s));
        assert!(
            s.end_time_unix_nano > s.start_time_unix_nano,
            "the call's duration"
        );
        assert!(s.start_time_unix_nano >= tool.start_time_unix_nano);
    }
}

#[test]
fn plugin_calls_past_the_rate_are_one_aggregate_span_linked_to_their_events() {
    let spans = plugin_run(2, 8);
    let tools = by_name(&spans, "execute_tool shell");
    assert_eq!(tools.len(), 8, "{:?}", names(&spans));
    let plugin = by_name(&spans, "execute_hook audit-hook");
    let (aggs, single): (Vec<&Span>, Vec<&Span>) = plugin
        .into_iter()
        .partition(|s| attr(s, "prx.plugin.calls").is_some());
    assert!(
        single.len() >= 2,
        "the first two calls of a second have their own spans"
    );
    assert!(!aggs.is_empty(), "{:?}", names(&spans));
    let aggregated: u64 = aggs
        .iter()
        .map(|s| attr(s, "prx.plugin.calls").unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        single.len() as u64 + aggregated,
        8,
        "every call counted once"
    );
    let trace = &tools[0].trace_id;
    for a in aggs {
        assert_eq!(attr(a, "prx.hook.kind").as_deref(), Some("plugin"));
        assert!(!is_error(a));
        assert_eq!(&a.trace_id, trace, "in the events' trace");
        assert!(
            tools.iter().any(|t| t.span_id == a.parent_span_id),
            "a child of an aggregated call's event span"
        );
        let calls: usize = attr(a, "prx.plugin.calls").unwrap().parse().unwrap();
        assert_eq!(
            a.links.len() + 1,
            calls,
            "linked to the other events' spans"
        );
        for l in &a.links {
            assert_eq!(&l.trace_id, trace);
            assert!(tools.iter().any(|t| t.span_id == l.span_id));
        }
        assert!(a.start_time_unix_nano < a.end_time_unix_nano);
    }
}
