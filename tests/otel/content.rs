//! What each agent's documented payloads put into spans: without `--otlp-content` only the
//! extra fields docs/otel.md § Content lists (ids, models, tokens, durations, reasons), with
//! it everything; token counts under the GenAI conventions' names either way.

use crate::fixtures::fixture;
use crate::receiver::Receiver;
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

/// Every lifecycle line every agent's fixtures translate to, as `run --events` reads them.
fn all_lines() -> (String, usize) {
    let mut out = String::new();
    let mut n = 0;
    for agent in Agent::ALL {
        for event in agent.hook_events() {
            let (json, _) = fixture(agent, event.name);
            let opts = TranslateOptions {
                session: (agent == Agent::Kiro).then(|| "kiro-session".to_string()),
                ..TranslateOptions::default()
            };
            let t = translate(agent, json.as_bytes(), &opts).unwrap();
            for (line, target) in t.lines() {
                if matches!(target, Target::Lifecycle(_)) {
                    out.push_str(line);
                    out.push('\n');
                    n += 1;
                }
            }
        }
    }
    (out, n)
}

/// Per agent, the names of the span attributes that came from extra fields.
fn exported(content: bool) -> (BTreeMap<String, BTreeSet<String>>, Vec<String>) {
    let (lines, n) = all_lines();
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    std::fs::write(&events, lines).unwrap();
    let rx = Receiver::start();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&events)
        // Some agents leave documented fields out (the translation says so): as the ingest
        // door reads them.
        .arg("--lenient")
        .args(["--otlp", &rx.url()]);
    if content {
        cmd.arg("--otlp-content");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // At least one span per lifecycle line that opens or ends one; the run exported them all
    // before exiting.
    let spans = rx.wait_spans(n / 2, Duration::from_secs(20));
    let mut per_agent: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut values = Vec::new();
    for s in &spans {
        let agent = crate::receiver::attr(s, "gen_ai.agent.name").unwrap_or_default();
        for a in &s.attributes {
            if a.key.starts_with("prx.extra.")
                || a.key.starts_with("gen_ai.usage.")
                || a.key == "prx.content_withheld"
                || a.key == "user.id"
            {
                per_agent
                    .entry(agent.clone())
                    .or_default()
                    .insert(a.key.clone());
            }
            values.push(format!("{:?}", a.value));
        }
    }
    (per_agent, values)
}

#[test]
fn without_content_each_agents_spans_carry_only_the_listed_extra_fields() {
    let (per_agent, values) = exported(false);
    let listed: BTreeSet<&str> = [
        "tool_call_id",
        "tool_use_id",
        "call_id",
        "turn_id",
        "agent_id",
        "agent_type",
        "parent_session",
        "generation_id",
        "conversation_id",
        "request_id",
        "event_id",
        "hook_event_name",
        "model",
        "provider",
        "mcp_server",
        "permission_mode",
        "source",
        "trigger",
        "total_tokens",
        "reasoning_tokens",
        "message_count",
        "duration_ms",
        "duration",
        "reason",
        "stop_reason",
        "finish_reason",
        "status",
        "is_interrupt",
        "exit_code",
        "error_type",
        "policy_decision",
        "policy_id",
        "policy_reason",
    ]
    .into_iter()
    .collect();
    let mut table = String::new();
    for (agent, keys) in &per_agent {
        table.push_str(&format!("{agent}: {keys:?}\n"));
        for k in keys {
            let ok = match k.strip_prefix("prx.extra.") {
                Some(name) => listed.contains(name),
                None => {
                    k.starts_with("gen_ai.usage.") || k == "prx.content_withheld" || k == "user.id"
                }
            };
            assert!(ok, "{agent} exports {k} without --otlp-content");
        }
    }
    println!("{table}");
    // Every agent's payloads carry fields that may hold content: each is withheld and counted.
    for agent in Agent::ALL {
        let keys = per_agent
            .get(agent.name())
            .unwrap_or_else(|| panic!("no span of {agent}:\n{table}"));
        assert!(keys.contains("prx.content_withheld"), "{agent}:\n{table}");
    }
    // What content the fixtures hold never reaches a span: paths, transcripts, prompts.
    for v in &values {
        for secret in ["transcript", "/home/", "/Users/", ".jsonl"] {
            assert!(!v.contains(secret), "{v} holds {secret:?}");
        }
    }
    // Gemini CLI's usageMetadata arrives as tokens under the conventions' names.
    assert!(
        per_agent["gemini-cli"].contains("gen_ai.usage.input_tokens"),
        "{table}"
    );
}

#[test]
fn with_content_the_other_extra_fields_are_exported_too() {
    let (per_agent, _) = exported(true);
    let claude = &per_agent["claude-code"];
    assert!(claude.contains("prx.extra.cwd"), "{claude:?}");
    assert!(claude.contains("prx.extra.transcript_path"), "{claude:?}");
    assert!(
        per_agent
            .values()
            .all(|k| !k.contains("prx.content_withheld")),
        "{per_agent:?}"
    );
}
