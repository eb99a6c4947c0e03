//! `prx-hooks run --otlp URL` as a user runs it: the sample workspace's events replayed
//! through its hooks, exported to a real receiver, the span tree printed (docs/otel.md §
//! The sample workspace's trace shows it).

use crate::receiver::{Mode, Receiver, attr, render_tree};
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

/// `sessions` turns of `pairs` tool calls each: (the NDJSON, the spans it makes — a tool span
/// per call and an implicit agent span per turn).
fn turns(sessions: usize, pairs: usize) -> (String, u64) {
    let mut text = String::new();
    for s in 0..sessions {
        for i in 0..pairs {
            text += &format!(
                "{{\"event\":\"tool_call_start\",\"agent\":\"a\",\"session\":\"s{s}\",\"payload\":{{\"tool\":\"t{i}\",\"arguments\":{{}}}}}}\n\
                 {{\"event\":\"tool_call\",\"agent\":\"a\",\"session\":\"s{s}\",\"payload\":{{\"tool\":\"t{i}\",\"success\":true,\"output\":\"\"}}}}\n"
            );
        }
        text += &format!("{{\"event\":\"turn_complete\",\"agent\":\"a\",\"session\":\"s{s}\"}}\n");
    }
    (text, (sessions * (pairs + 1)) as u64)
}

/// `run --events FILE --otlp URL`: the exit code, stderr's lines, the report's `otel` section.
fn replay(
    text: &str,
    url: &str,
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<String>, serde_json::Value) {
    let ws = tempfile::tempdir().unwrap();
    let events = ws.path().join("events.ndjson");
    std::fs::write(&events, text).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--events")
        .arg(&events)
        .args(["--otlp", url])
        .env("RUST_LOG", "error");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stderr: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    let report: serde_json::Value =
        serde_json::from_str(stderr.last().map_or("", String::as_str)).unwrap_or_default();
    let otel = report["stats"]["otel"].clone();
    (out.status.code(), stderr, otel)
}

/// A replay outruns any receiver: the span builder makes spans far faster than a collector
/// takes them. Against a healthy receiver that takes 250 ms per request, the replay waits for
/// the exporter's queue as it waits for the rings and hook queues: every span arrives.
#[test]
fn a_replay_to_a_slow_receiver_waits_for_the_exporter_and_loses_no_span() {
    let rx = Receiver::start();
    rx.set(Mode::Stall(Duration::from_millis(250)));
    let (text, spans) = turns(100, 50);
    let (code, stderr, o) = replay(&text, &rx.url(), &[]);
    println!("{o}");
    assert_eq!(o["dropped_queue_full"], 0, "{o}");
    assert_eq!(
        (o["spans"].as_u64(), o["exported"].as_u64()),
        (Some(spans), Some(spans)),
        "{o}"
    );
    assert_eq!(rx.span_count() as u64, spans);
    assert_eq!(code, Some(0), "{}", stderr.join("\n"));
}

/// A receiver that never answers: the replay stops waiting for it once a request has gone
/// unanswered for the request timeout, so `run` ends; the spans it lost are said once, with
/// their count and reasons, and `run` exits 1.
#[test]
fn spans_lost_to_a_receiver_that_never_answers_are_said_once_and_run_exits_1() {
    let rx = Receiver::start();
    rx.set(Mode::Stall(Duration::from_secs(3600)));
    let (text, spans) = turns(100, 50);
    let start = std::time::Instant::now();
    let (code, stderr, o) = replay(&text, &rx.url(), &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")]);
    println!("{:?}: {o}", start.elapsed());
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(o["spans"].as_u64(), Some(spans), "{o}");
    assert_eq!(o["exported"], 0, "{o}");
    let said: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("OpenTelemetry"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {stderr:?}");
    let lost = o["dropped_queue_full"].as_u64().unwrap() + o["dropped_shutdown"].as_u64().unwrap();
    assert!(
        said[0].contains(&format!("lost {lost} span(s)")) && said[0].contains("full queue"),
        "the count and the reasons: {}",
        said[0]
    );
    assert_eq!(code, Some(1), "{}", stderr.join("\n"));
}

/// A spool entry as `send` writes it: its header (route, id, the event's time), then the line.
fn spooled(ws: &Path, n: usize, time: &str, line: serde_json::Value) {
    let dir = ws.join(".prx-hooks/spool");
    std::fs::create_dir_all(&dir).unwrap();
    for d in [ws.join(".prx-hooks"), dir.clone()] {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    let header = serde_json::json!({"route": "events", "id": format!("e{n}"), "time": time});
    let name = format!("{:020}-{:010}.spool", 1_000_000_000_000u64 + n as u64, 1);
    std::fs::write(dir.join(name), format!("{header}\n{line}\n")).unwrap();
}

#[test]
fn a_replayed_spool_exports_spans_at_the_events_own_times() {
    let rx = Receiver::start();
    let ws = tempfile::tempdir().unwrap();
    let envelope = |event: &str, payload: serde_json::Value| serde_json::json!({"event": event, "agent": "coder", "session": "s1", "payload": payload});
    spooled(
        ws.path(),
        0,
        "2026-12-07T10:00:00Z",
        envelope(
            "tool_call_start",
            serde_json::json!({"tool": "shell", "arguments": {}}),
        ),
    );
    spooled(
        ws.path(),
        1,
        "2026-12-07T10:00:03.5Z",
        envelope(
            "tool_call",
            serde_json::json!({"tool": "shell", "success": true, "output": ""}),
        ),
    );
    spooled(
        ws.path(),
        2,
        "2026-12-07T10:00:04Z",
        envelope("turn_complete", serde_json::json!({})),
    );
    let empty = ws.path().join("none.ndjson");
    std::fs::write(&empty, "").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--events")
        .arg(&empty)
        .args(["--otlp", &rx.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = rx.wait_spans(2, Duration::from_secs(10));
    let at = |t: &str| nanos(humantime::parse_rfc3339(t).unwrap());
    let tool = one(&spans, "execute_tool shell");
    assert_eq!(
        (tool.start_time_unix_nano, tool.end_time_unix_nano),
        (at("2026-12-07T10:00:00Z"), at("2026-12-07T10:00:03.5Z")),
        "the agent's times, not the replay's"
    );
    let agent = one(&spans, "invoke_agent coder");
    assert_eq!(agent.end_time_unix_nano, at("2026-12-07T10:00:04Z"));
}
