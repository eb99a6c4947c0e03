//! Decisions in the trace (docs/policies.md § Audit): Claude Code's `http` hook door decides a
//! PreToolUse and ingests it; its `execute_tool` span gets an `apply_guardrail` child holding
//! the decision, and a denied call's span ends at the decision with the reason (never as
//! `unfinished`). A real server over loopback, a real OTLP receiver.

use crate::receiver::{Receiver, attr};
use crate::*;
use prx_hooks::http::{HttpOptions, Server, Token};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "otel-policy-token-0123456789abcdef";

const POLICIES: &str = r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"},
  {"id": "allow-ls", "on": ["tool_call_start"], "matcher": "Bash",
   "when": {"arguments.command": {"prefix": "ls"}}, "decision": "allow", "reason": "listing is fine"}
]}"#;

fn post(server: &Server, body: &Value) -> Value {
    let url = format!("http://{}/api/ingest/claude-code", server.local_addr());
    let mut resp = ureq::post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .unwrap();
    serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
}

fn event(name: &str, fields: Value) -> Value {
    let mut v = json!({"session_id": "cc-otel", "hook_event_name": name});
    for (k, x) in fields.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

#[test]
fn a_decision_is_a_guardrail_span_under_the_tool_span_and_a_denied_tool_ends_at_it() {
    let rx = Receiver::start();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("policies.json"), POLICIES).unwrap();
    let hooks = Arc::new(
        prx_hooks::Hooks::builder()
            .workspace(ws.path())
            .otlp(options(&rx.url()))
            .build()
            .unwrap(),
    );
    let opts = HttpOptions::new(Token::new(TOKEN, "test").unwrap());
    let server = Server::start(hooks.clone(), opts, "127.0.0.1:0".parse().unwrap()).unwrap();
    let pre = |id: &str, command: &str| {
        event(
            "PreToolUse",
            json!({"tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": id}),
        )
    };
    let denied = post(&server, &pre("toolu_rm", "rm -rf /tmp/victim"));
    assert_eq!(denied["hookSpecificOutput"]["permissionDecision"], "deny");
    // An allowed call runs, and ends as usual with its PostToolUse.
    post(&server, &pre("toolu_ls", "ls -la"));
    post(
        &server,
        &event(
            "PostToolUse",
            json!({"tool_name": "Bash", "tool_input": {"command": "ls -la"}, "tool_use_id": "toolu_ls",
                   "tool_response": {"stdout": "a b"}}),
        ),
    );
    // No policy decides: no guardrail span.
    post(&server, &pre("toolu_cargo", "cargo test"));
    post(
        &server,
        &event(
            "PostToolUse",
            json!({"tool_name": "Bash", "tool_input": {"command": "cargo test"}, "tool_use_id": "toolu_cargo",
                   "tool_response": {"stdout": "ok"}}),
        ),
    );
    post(&server, &event("Stop", json!({})));
    let spans = rx.wait_spans(6, Duration::from_secs(20));
    let tools = by_name(&spans, "execute_tool Bash");
    assert_eq!(tools.len(), 3, "{}", crate::receiver::render_tree(&spans));
    let call = |id: &str| {
        *tools
            .iter()
            .find(|s| attr(s, "gen_ai.tool.call.id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no tool span {id}"))
    };
    let guards = by_name(&spans, "apply_guardrail no-rm-rf");
    assert_eq!(guards.len(), 1, "{}", crate::receiver::render_tree(&spans));
    let guard = guards[0];

    // The denied call: ended at the decision, error status with the reason, not unfinished.
    let rm = call("toolu_rm");
    assert!(is_error(rm));
    assert_eq!(
        rm.status.as_ref().unwrap().message,
        "rm -rf is not allowed in this workspace"
    );
    assert_eq!(attr(rm, "error.type").as_deref(), Some("policy_denied"));
    assert_eq!(rm.end_time_unix_nano, rm.start_time_unix_nano);
    assert_eq!(
        attr(rm, "prx.extra.policy_decision").as_deref(),
        Some("deny")
    );
    // Its decision: a child span, GenAI's guardrail shape with the evaluation result event.
    assert_eq!(guard.parent_span_id, rm.span_id);
    assert_eq!(guard.trace_id, rm.trace_id);
    assert!(!is_error(guard), "the guardrail itself worked");
    for (k, v) in [
        ("gen_ai.operation.name", "apply_guardrail"),
        ("gen_ai.tool.name", "Bash"),
        ("gen_ai.tool.call.id", "toolu_rm"),
        ("gen_ai.agent.name", "claude-code"),
        ("gen_ai.conversation.id", "cc-otel"),
        ("prx.policy.id", "no-rm-rf"),
        ("prx.policy.decision", "deny"),
        (
            "prx.policy.reason",
            "rm -rf is not allowed in this workspace",
        ),
    ] {
        assert_eq!(attr(guard, k).as_deref(), Some(v), "{k}");
    }
    let ev = guard
        .events
        .iter()
        .find(|e| e.name == "gen_ai.evaluation.result")
        .expect("an evaluation result event");
    let ev_attr = |k: &str| {
        ev.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| match &a.value {
                Some(v) => match &v.value {
                    Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s),
                    ) => Some(s.clone()),
                    _ => None,
                },
                None => None,
            })
    };
    assert_eq!(
        ev_attr("gen_ai.evaluation.name").as_deref(),
        Some("no-rm-rf")
    );
    assert_eq!(
        ev_attr("gen_ai.evaluation.score.label").as_deref(),
        Some("deny")
    );
    assert_eq!(
        ev_attr("gen_ai.evaluation.explanation").as_deref(),
        Some("rm -rf is not allowed in this workspace")
    );
    assert!(guard.start_time_unix_nano <= guard.end_time_unix_nano);
    assert!(guard.end_time_unix_nano <= rm.end_time_unix_nano);

    // The allowed call: a guardrail child with allow, and the tool's own span ends at its
    // PostToolUse, without error.
    let ls = call("toolu_ls");
    assert!(!is_error(ls), "{:?}", ls.status);
    let allow = one(&spans, "apply_guardrail allow-ls");
    assert_eq!(allow.parent_span_id, ls.span_id);
    assert_eq!(attr(allow, "prx.policy.decision").as_deref(), Some("allow"));
    assert!(ls.end_time_unix_nano >= ls.start_time_unix_nano);

    // Undecided: no guardrail span under it.
    let cargo = call("toolu_cargo");
    assert!(!spans.iter().any(|s| s.parent_span_id == cargo.span_id));
    assert!(!is_error(cargo));
    // Nothing ended as unfinished.
    assert!(
        spans
            .iter()
            .all(|s| attr(s, "error.type").as_deref() != Some("unfinished")),
        "{}",
        crate::receiver::render_tree(&spans)
    );
    let mut server = server;
    server.shutdown(Duration::from_secs(5));
    hooks.shutdown(Duration::from_secs(5));
}
