//! Policies: one decision against 100 rules, with a typical PreToolUse payload (target,
//! docs/policies.md: p50 ≤ 2 µs per decision), beside a `regex::RegexSet` match of the same
//! 100 patterns measured in the same run.
//!
//! The 100 rules are what a team's file looks like grown large: 60 regex rules on
//! `arguments.command` for the four agents' shell tools (the contract's `rm -rf` rule among
//! them), 20 glob rules on `arguments.file_path` for `Write|Edit`, 10 prefix rules, 10 rules on
//! other tools; the payload is a Bash call that matches none, so every rule is looked at (the
//! slowest case: a deny stops early).
//!
//! Group `policy`:
//! * `rules_100_value`: `PolicyTable::decide` with the payload already parsed.
//! * `rules_100_text`: `Hooks::decide` with the payload's JSON text (what `POST /api/decide`
//!   and the Claude Code door pay: parse, decide, count).
//! * `baseline/regexset_100`: `RegexSet::is_match` of the 100 rules' patterns (as regexes)
//!   against the command alone.

mod common;

use common::*;
use criterion::Criterion;
use prx_hooks::Hooks;
use prx_hooks::policy::{DecisionPoint, PolicyTable, parse};
use serde_json::json;
use std::hint::black_box;

const PAYLOAD: &str = r#"{"tool":"Bash","arguments":{"command":"cargo test --release --test library policies -- --nocapture","description":"Run the policy tests"},"session_id":"0f9c2b1e-2f43-4d6e-9a51-6c1d2f0e9b7a","hook_event_name":"PreToolUse","cwd":"/home/dev/src/app"}"#;

/// The 100 rules, and each rule's pattern as a regex (for the baseline).
fn rules() -> (String, Vec<String>) {
    let mut policies = Vec::new();
    let mut patterns = Vec::new();
    let shell = "Bash|shell|run_shell_command|exec_command";
    policies.push(
        json!({"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": shell,
        "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
        "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}),
    );
    patterns.push("\\brm\\s+-[a-zA-Z]*[rf]".to_string());
    let words = [
        "curl", "wget", "sudo", "chmod", "chown", "dd", "mkfs", "shutdown", "reboot", "kill",
    ];
    for i in 1..60 {
        let w = words[i % words.len()];
        let re = format!("\\b{w}\\s+.*--danger{i}\\b");
        policies.push(json!({"id": format!("cmd-{i}"), "on": ["tool_call_start"], "matcher": shell,
            "when": {"arguments.command": {"regex": re}}, "decision": if i % 3 == 0 { "ask" } else { "deny" },
            "reason": format!("rule {i}")}));
        patterns.push(re);
    }
    for i in 0..20 {
        let g = format!("*/secrets{i}/*");
        policies.push(json!({"id": format!("file-{i}"), "on": ["tool_call_start", "permission"],
            "matcher": "Write|Edit", "when": {"arguments.file_path": {"glob": g}}, "decision": "deny"}));
        patterns.push(format!("^.*/secrets{i}/.*$"));
    }
    for i in 0..10 {
        let p = format!("git push origin release-{i}");
        policies.push(
            json!({"id": format!("prefix-{i}"), "on": ["tool_call_start"], "matcher": shell,
            "when": {"arguments.command": {"prefix": p}}, "decision": "ask"}),
        );
        patterns.push(format!("^{}", regex::escape(&p)));
    }
    for i in 0..10 {
        policies.push(json!({"id": format!("tool-{i}"), "on": ["tool_call_start"],
            "matcher": format!("mcp__server{i}__*"), "decision": "ask"}));
        patterns.push(format!("^mcp__server{i}__"));
    }
    assert_eq!(policies.len(), 100);
    (json!({ "policies": policies }).to_string(), patterns)
}

fn bench(c: &mut Criterion) {
    let (text, patterns) = rules();
    let table: PolicyTable = parse(text.as_bytes(), "policies.json").expect("valid");
    let payload: serde_json::Value = serde_json::from_str(PAYLOAD).unwrap();
    let command = payload["arguments"]["command"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        table
            .decide(DecisionPoint::ToolCallStart, "claude-code", &payload)
            .decision,
        None,
        "the payload must match no rule (every rule looked at)"
    );
    let set = regex::RegexSet::new(&patterns).unwrap();
    assert!(!set.is_match(&command));

    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("policies.json"), &text).unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    assert_eq!(hooks.policy_table().policies.len(), 100);

    let mut g = c.benchmark_group("policy");
    g.bench_function("rules_100_value", |b| {
        b.iter(|| {
            black_box(table.decide(
                DecisionPoint::ToolCallStart,
                black_box("claude-code"),
                black_box(&payload),
            ))
        })
    });
    g.bench_function("rules_100_text", |b| {
        b.iter(|| {
            black_box(
                hooks
                    .decide(
                        DecisionPoint::ToolCallStart,
                        black_box("claude-code"),
                        black_box(PAYLOAD),
                    )
                    .unwrap(),
            )
        })
    });
    g.finish();
    let mut g = c.benchmark_group("baseline");
    g.bench_function("regexset_100", |b| {
        b.iter(|| black_box(set.is_match(black_box(&command))))
    });
    g.finish();
    hooks.shutdown(std::time::Duration::from_secs(2));
}

fn main() {
    process_start();
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    if median_ns("policy/rules_100_value").is_none() {
        return; // test mode, or filtered out
    }
    println!("\nRATIOS (same run)");
    print_time_ratio("policy/rules_100_value", "baseline/regexset_100");
    print_time_ratio("policy/rules_100_text", "baseline/regexset_100");
    println!("\nTARGETS");
    print_target("policy/rules_100_value", 2000.0);
    print_target("policy/rules_100_text", 2000.0);
    print_machine_note();
}
