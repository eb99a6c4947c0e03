//! `prx-hooks run --otlp URL` as a user runs it: the sample workspace's events replayed
//! through its hooks, exported to a real receiver, the span tree printed (README.md §
//! Traces shows it).

use crate::receiver::{Receiver, attr, render_tree};
use crate::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

fn sample_workspace() -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    let ws = tempfile::tempdir().unwrap();
    std::fs::copy(root.join("hooks.json"), ws.path().join("hooks.json")).unwrap();
    std::fs::create_dir(ws.path().join("hooks")).unwrap();
    std::fs::copy(
        root.join("hooks/audit.sh"),
        ws.path().join("hooks/audit.sh"),
    )
    .unwrap();
    ws
}

#[test]
fn run_otlp_exports_the_sample_workspace_as_one_trace_with_its_hooks() {
    let rx = Receiver::start();
    let ws = sample_workspace();
    let events = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace/events.ndjson");
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--events")
        .arg(&events)
        .args(["--otlp", &rx.url(), "--otlp-header", "x-api-key=secret-123"])
        .env("OTEL_SERVICE_NAME", "sample-agent")
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("secret-123"),
        "a header value is never logged"
    );
    let spans = rx.wait_spans(9, Duration::from_secs(10));
    let tree = render_tree(&spans);
    println!("{tree}");
    assert!(
        rx.headers()
            .contains(&("x-api-key".into(), "secret-123".into()))
    );
    let resource = format!("{:?}", rx.resource());
    assert!(resource.contains("sample-agent"), "{resource}");

    let agent = one(&spans, "invoke_agent coder");
    assert!(
        spans.iter().all(|s| s.trace_id == agent.trace_id),
        "one trace:\n{tree}"
    );
    let shell = one(&spans, "execute_tool shell");
    let github = one(&spans, "execute_tool mcp__github__create_issue");
    let chat = one(&spans, "chat claude-sonnet");
    for s in [shell, github, chat] {
        assert_eq!(s.parent_span_id, agent.span_id, "{}:\n{tree}", s.name);
    }
    assert!(is_error(shell));
    let audits = by_name(&spans, "execute_hook audit-tool-calls");
    assert_eq!(audits.len(), 2, "{tree}");
    let github_hooks = by_name(&spans, "execute_hook audit-github");
    assert_eq!(github_hooks.len(), 2, "{tree}");
    let skipped = github_hooks
        .iter()
        .find(|h| attr(h, "prx.hook.outcome").as_deref() == Some("skipped"))
        .expect("the matcher skipped it for shell");
    assert_eq!(skipped.parent_span_id, shell.span_id);
    let ran = github_hooks
        .iter()
        .find(|h| attr(h, "prx.hook.outcome").as_deref() == Some("ok"))
        .expect("it ran for the GitHub tool");
    assert_eq!(ran.parent_span_id, github.span_id);
    let errors = one(&spans, "execute_hook audit-errors");
    assert_eq!(
        errors.parent_span_id, agent.span_id,
        "the error event's span is the agent's"
    );
    let report = stderr.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(report).unwrap();
    let o = &report["stats"]["otel"];
    assert_eq!(o["exported"], o["spans"], "{o}");
    assert_eq!(o["unmatched_starts"], 0, "{o}");
}

#[test]
fn run_refuses_a_bad_otlp_option_naming_it() {
    let out = Command::new(BIN)
        .args([
            "run",
            "--otlp",
            "https://api.example.com",
            "--events",
            "/dev/null",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--otlp") && stderr.contains("TLS"),
        "{stderr}"
    );
    let out = Command::new(BIN)
        .args(["run", "--otlp", "--events", "/dev/null"])
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{stderr}");
}

#[test]
fn run_otlp_without_a_url_takes_the_endpoint_and_headers_from_the_environment() {
    let rx = Receiver::start();
    let ws = tempfile::tempdir().unwrap();
    let events = ws.path().join("events.ndjson");
    std::fs::write(
        &events,
        concat!(
            r#"{"event":"tool_call_start","agent":"a","session":"s","payload":{"tool":"ls","arguments":{}}}"#,
            "\n",
            r#"{"event":"tool_call","agent":"a","session":"s","payload":{"tool":"ls","success":true,"output":""}}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--events")
        .arg(&events)
        .arg("--otlp")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url())
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-team=agents%20team")
        .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The tool span, and the implicit agent span ended at shutdown (no turn_complete).
    let spans = rx.wait_spans(2, Duration::from_secs(10));
    let tool = one(&spans, "execute_tool ls");
    let agent = one(&spans, "invoke_agent a");
    assert_eq!(tool.parent_span_id, agent.span_id);
    assert!(is_error(agent), "unfinished at shutdown");
    assert!(
        rx.headers()
            .contains(&("x-team".into(), "agents team".into()))
    );
    let resource = format!("{:?}", rx.resource());
    assert!(resource.contains("deployment.environment"), "{resource}");
    assert!(rx.paths().iter().all(|p| p == "/v1/traces"));
}
