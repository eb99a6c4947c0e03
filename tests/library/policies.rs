//! policies.json and `Hooks::decide` (docs/policies.md): the file as the documentation writes
//! it, its errors (FILE:LINE:COL and the field), the rules' semantics, the limits, hot reload
//! with the real watcher, and that a decision never reaches the ring or a hook.

use prx_hooks::policy::{
    self, DecideError, Decision, DecisionPoint, MAX_PAYLOAD_BYTES, MAX_REGEX_BYTES, Verdict,
};
use prx_hooks::{Event, Hooks};
use serde_json::json;
use std::time::{Duration, Instant};

/// The file docs/policies.md opens with, byte for byte.
const CONTRACT: &str = r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell|run_shell_command|exec_command",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}
]}"#;

fn table(text: &str) -> policy::PolicyTable {
    policy::parse(text.as_bytes(), "policies.json").unwrap_or_else(|e| panic!("{e}"))
}

fn errors(text: &str) -> String {
    match policy::parse(text.as_bytes(), "policies.json") {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

fn tool(t: &policy::PolicyTable, agent: &str, tool: &str, command: &str) -> Verdict {
    let payload = json!({"tool": tool, "arguments": {"command": command}});
    let v = t.decide(DecisionPoint::ToolCallStart, agent, &payload);
    // The fast path (shared matchers, one regex set per path) agrees with the policy-by-policy
    // explanation: the decision is the most restrictive of the policies that matched.
    let (_, traces) = t.explain(DecisionPoint::ToolCallStart, agent, &payload);
    let slow = traces
        .iter()
        .filter(|t| t.matched)
        .map(|t| t.decision)
        .max();
    assert_eq!(v.decision, slow, "{command}: {traces:?}");
    v
}

#[test]
fn the_contract_file_denies_rm_rf_for_every_agents_shell_tool() {
    let t = table(CONTRACT);
    for (agent, shell) in [
        ("claude-code", "Bash"),
        ("prx", "shell"),
        ("gemini-cli", "run_shell_command"),
        ("codex", "exec_command"),
    ] {
        for cmd in [
            "rm -rf /tmp/x",
            "cd a && rm -fr b",
            "rm -r dir",
            "sudo rm -Rf .",
        ] {
            let v = tool(&t, agent, shell, cmd);
            assert_eq!(v.decision, Some(Decision::Deny), "{agent} {shell} {cmd}");
            assert_eq!(v.policy.as_deref(), Some("no-rm-rf"));
            assert_eq!(
                v.reason.as_deref(),
                Some("rm -rf is not allowed in this workspace")
            );
        }
        for cmd in ["ls -la", "rm file.txt", "echo rm", "farm -rf"] {
            assert_eq!(tool(&t, agent, shell, cmd).decision, None, "{cmd}");
        }
    }
    // Another tool, or a tool name that only contains a shell tool's name: no decision.
    assert_eq!(tool(&t, "a", "Write", "rm -rf /").decision, None);
    assert_eq!(tool(&t, "a", "MyBash", "rm -rf /").decision, None);
    // Not on the other decision points.
    let payload = json!({"tool": "Bash", "arguments": {"command": "rm -rf /"}});
    assert_eq!(
        t.decide(DecisionPoint::Permission, "a", &payload).decision,
        None
    );
}

#[test]
fn errors_name_file_line_column_and_field() {
    let cases: &[(&str, &str)] = &[
        (
            "{\"policies\": [\n  {\"id\": \"a\", \"on\": \"tool_call_start\", \"decision\": \"maybe\"}\n]}",
            "policies.json:2:52: policies[0].decision: \"maybe\" is not a decision: expected \"allow\", \"ask\" or \"deny\"",
        ),
        (
            "{\"policies\": [{\"id\": \"a\", \"on\": [\"tool_call\"], \"decision\": \"deny\"}]}",
            "policies.json:1:34: policies[0].on[0]: \"tool_call\" is not a decision point; did you mean \"tool_call_start\"?",
        ),
        (
            "{\"policies\": [{\"id\": \"a\", \"on\": \"tool_call_start\", \"decision\": \"deny\",\n \"when\": {\"arguments.command\": {\"regex\": \"(unclosed\"}}}]}",
            "policies.json:2:42: policies[0].when[\"arguments.command\"].regex: invalid regular expression: unclosed group",
        ),
        (
            "{\"policies\": [{\"id\": \"a\", \"on\": \"prompt\", \"matcher\": \"Bash\", \"decision\": \"deny\"}]}",
            "policies.json:1:43: policies[0].matcher: \"matcher\" names tools, and a prompt has none",
        ),
        (
            "{\"policies\": [{\"id\": \"a\", \"on\": \"prompt\", \"decison\": \"deny\"}]}",
            "policies.json:1:43: policies[0].decison: unknown field \"decison\"; did you mean \"decision\"?",
        ),
        (
            "{\"policies\": [{\"id\": \"a\", \"on\": \"prompt\", \"decision\": \"deny\", \"when\": {\"prompt\": {\"contains\": \"x\"}}}]}",
            "policies.json:1:83: policies[0].when.prompt.contains: unknown test \"contains\"",
        ),
        (
            "{\"policies\": [{\"id\": \"a\", \"on\": \"prompt\", \"decision\": \"deny\", \"when\": {\"a..b\": {\"prefix\": \"x\"}}}]}",
            "policies.json:1:72: policies[0].when[\"a..b\"]: \"a..b\" is not a path",
        ),
        (
            "{\"policies\": [\n{\"id\": \"a\", \"on\": \"prompt\", \"decision\": \"deny\", \"reason\": \"x\"},\n{\"id\": \"a\", \"on\": \"prompt\", \"decision\": \"ask\"}]}",
            "policies.json:3:8: policies[1].id: duplicate id \"a\" (first at 2:8)",
        ),
        (
            "{\"policies\": [{\"on\": \"prompt\", \"decision\": \"deny\"}]}",
            "policies.json:1:15: policies[0]: missing field \"id\"",
        ),
        (
            "{\"policies\": {}}",
            "policies.json:1:14: policies: expected an array of policies, found object",
        ),
        ("{\"policies\": [", "policies.json:1:15: "),
    ];
    for (text, want) in cases {
        let got = errors(text);
        // Every problem is a line of its own, in file order; `want` is one of them.
        assert!(
            got.lines().any(|l| l.starts_with(want)),
            "for {text}\n got: {got}\nwant: {want}…"
        );
    }
}

#[test]
fn the_most_restrictive_decision_wins_with_the_first_such_policys_reason() {
    let t = table(
        r#"{"policies": [
        {"id": "allow-git", "on": "tool_call_start", "matcher": "Bash", "when": {"arguments.command": {"prefix": "git "}}, "decision": "allow", "reason": "git is fine"},
        {"id": "ask-push", "on": "tool_call_start", "matcher": "Bash", "when": {"arguments.command": {"glob": "git push*"}}, "decision": "ask", "reason": "pushing?"},
        {"id": "ask-force", "on": "tool_call_start", "matcher": "Bash", "when": {"arguments.command": {"regex": "--force"}}, "decision": "ask", "reason": "forcing?"},
        {"id": "deny-main", "on": "tool_call_start", "matcher": "Bash", "when": {"arguments.command": {"regex": "push.*\\bmain$"}}, "decision": "deny", "reason": "not main"},
        {"id": "deny-any-force-main", "on": "tool_call_start", "matcher": "Bash", "when": {"arguments.command": {"regex": "--force"}}, "decision": "deny", "reason": "second deny"}
    ]}"#,
    );
    let v = tool(&t, "a", "Bash", "git status");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Allow), Some("allow-git"))
    );
    let v = tool(&t, "a", "Bash", "git push --force origin dev");
    assert_eq!(
        (v.decision, v.policy.as_deref(), v.reason.as_deref()),
        (
            Some(Decision::Deny),
            Some("deny-any-force-main"),
            Some("second deny")
        )
    );
    let v = tool(&t, "a", "Bash", "git push origin dev");
    assert_eq!(
        (v.decision, v.policy.as_deref(), v.reason.as_deref()),
        (Some(Decision::Ask), Some("ask-push"), Some("pushing?"))
    );
    let v = tool(&t, "a", "Bash", "git push --force origin main");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("deny-main"))
    );
    assert_eq!(tool(&t, "a", "Bash", "make").decision, None);
}

#[test]
fn conditions_are_anded_and_a_missing_path_is_no_match() {
    let t = table(
        r#"{"policies": [
        {"id": "env-write", "on": ["tool_call_start", "permission"], "matcher": "Write|Edit", "agent": "claude-*",
         "when": {"arguments.file_path": {"glob": "*.env"}, "arguments.mode": {"equals": 420}, "hook_event_name": {"equals": "PreToolUse"}},
         "decision": "deny", "reason": "no .env", "context": "secrets live in the vault"},
        {"id": "no-secrets-prompt", "on": "prompt", "when": {"prompt": {"regex": "(?i)password\\s*="}}, "decision": "deny"}
    ]}"#,
    );
    let base = json!({"tool": "Write", "arguments": {"file_path": "/w/.env", "mode": 420}, "hook_event_name": "PreToolUse"});
    let v = t.decide(DecisionPoint::ToolCallStart, "claude-code", &base);
    assert_eq!(v.decision, Some(Decision::Deny));
    assert_eq!(v.context.as_deref(), Some("secrets live in the vault"));
    assert_eq!(
        t.decide(DecisionPoint::Permission, "claude-code", &base)
            .decision,
        Some(Decision::Deny)
    );
    // Another agent, another tool, one condition off, one path missing: no decision.
    assert_eq!(
        t.decide(DecisionPoint::ToolCallStart, "codex", &base)
            .decision,
        None
    );
    for payload in [
        json!({"tool": "Read", "arguments": {"file_path": "/w/.env", "mode": 420}, "hook_event_name": "PreToolUse"}),
        json!({"tool": "Write", "arguments": {"file_path": "/w/.envrc", "mode": 420}, "hook_event_name": "PreToolUse"}),
        json!({"tool": "Write", "arguments": {"file_path": "/w/.env", "mode": "420"}, "hook_event_name": "PreToolUse"}),
        json!({"tool": "Write", "arguments": {"file_path": "/w/.env"}, "hook_event_name": "PreToolUse"}),
        json!({"tool": "Write", "arguments": "not an object", "hook_event_name": "PreToolUse"}),
        json!({"arguments": {"file_path": "/w/.env", "mode": 420}, "hook_event_name": "PreToolUse"}),
    ] {
        assert_eq!(
            t.decide(DecisionPoint::ToolCallStart, "claude-code", &payload)
                .decision,
            None,
            "{payload}"
        );
    }
    let v = t.decide(
        DecisionPoint::Prompt,
        "any",
        &json!({"prompt": "my PASSWORD = hunter2"}),
    );
    assert_eq!(v.decision, Some(Decision::Deny));
    assert_eq!(
        v.reason.as_deref(),
        Some("deny by policy no-secrets-prompt")
    );
    let (_, traces) = t.explain(
        DecisionPoint::ToolCallStart,
        "claude-code",
        &json!({"tool": "Write", "arguments": {"file_path": "/w/.envrc"}}),
    );
    assert_eq!(traces.len(), 1);
    assert!(!traces[0].matched);
    assert_eq!(traces[0].why, "arguments.file_path does not match");
}

#[test]
fn a_disabled_policy_or_file_decides_nothing() {
    let t = table(
        r#"{"policies": [{"id": "a", "on": "prompt", "decision": "deny", "enabled": false, "reason": "x"}]}"#,
    );
    let p = json!({"prompt": "hi"});
    assert_eq!(t.decide(DecisionPoint::Prompt, "a", &p).decision, None);
    let t = table(
        r#"{"enabled": false, "policies": [{"id": "a", "on": "prompt", "when": {"prompt": {"prefix": "h"}}, "decision": "deny"}]}"#,
    );
    assert_eq!(t.decide(DecisionPoint::Prompt, "a", &p).decision, None);
}

#[test]
fn a_policy_denying_everything_is_a_warning_not_an_error() {
    let t = table(
        "{\"policies\": [\n  {\"id\": \"stop\", \"on\": [\"tool_call_start\", \"permission\"], \"matcher\": \"*\", \"decision\": \"deny\"}\n]}",
    );
    assert_eq!(
        t.warnings,
        vec![
            "policies.json:2:3: policies[0]: policy \"stop\" denies everything at tool_call_start, permission (no matcher, agent or when narrows it)"
        ]
    );
    assert_eq!(
        tool(&t, "a", "Read", "").decision,
        Some(Decision::Deny),
        "it still loads and denies"
    );
    // Narrowed: no warning.
    assert!(
        table(r#"{"policies": [{"id": "b", "on": "tool_call_start", "matcher": "Bash", "decision": "deny"}]}"#)
            .warnings
            .is_empty()
    );
}

#[test]
fn oversized_regexes_and_payloads_are_refused_with_their_limits_named() {
    let long = "a".repeat(MAX_REGEX_BYTES + 1);
    let text = format!(
        r#"{{"policies": [{{"id": "a", "on": "prompt", "decision": "deny", "when": {{"prompt": {{"regex": "{long}"}}}}}}]}}"#
    );
    let e = errors(&text);
    assert!(
        e.contains(&format!(
            "policies[0].when.prompt.regex: {} bytes; a regex is at most {MAX_REGEX_BYTES} bytes",
            MAX_REGEX_BYTES + 1
        )),
        "{e}"
    );
    // Short to write, huge once compiled.
    let e = errors(
        r#"{"policies": [{"id": "a", "on": "prompt", "decision": "deny", "when": {"prompt": {"regex": "\\w{1000}\\w{1000}"}}}]}"#,
    );
    assert!(
        e.contains("policies[0].when.prompt.regex: the regex compiles to more than 1048576 bytes (the limit)"),
        "{e}"
    );

    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("policies.json"), CONTRACT).unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let big = format!(r#"{{"prompt": "{}"}}"#, "x".repeat(MAX_PAYLOAD_BYTES));
    let err = hooks.decide(DecisionPoint::Prompt, "a", &big).unwrap_err();
    assert_eq!(
        err,
        DecideError::TooLarge {
            size: big.len(),
            limit: MAX_PAYLOAD_BYTES
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "the payload is {} bytes; a decision reads at most 1048576 bytes",
            big.len()
        )
    );
    assert!(matches!(
        hooks.decide(DecisionPoint::Prompt, "a", "[1]"),
        Err(DecideError::Payload(_))
    ));
    let s = hooks.stats();
    let p = s.policies().unwrap();
    assert_eq!((p.refused, p.deny, p.none), (2, 0, 0));
    hooks.shutdown(Duration::from_secs(2));
}

#[test]
fn hooks_decide_counts_and_never_touches_the_ring_or_a_hook() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("policies.json"), CONTRACT).unwrap();
    let log = ws.path().join("ran.log");
    std::fs::write(
        ws.path().join("hooks.json"),
        json!({"hooks": {"tool_call_start": [{"command": "/bin/sh", "args": ["-c", format!("echo ran >> {}", log.display())]}]}}).to_string(),
    )
    .unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    assert_eq!(hooks.policy_table().policies.len(), 1);
    let sub = hooks.bus().subscribe("prx.policy.*").unwrap();
    let deny = r#"{"tool": "Bash", "arguments": {"command": "rm -rf /"}}"#;
    let ls = r#"{"tool": "Bash", "arguments": {"command": "ls"}}"#;
    for _ in 0..10 {
        let v = hooks
            .decide(DecisionPoint::ToolCallStart, "claude-code", deny)
            .unwrap();
        assert_eq!(v.decision, Some(Decision::Deny));
        assert!(v.elapsed > Duration::ZERO);
        let v = hooks
            .decide(DecisionPoint::ToolCallStart, "claude-code", ls)
            .unwrap();
        assert_eq!(v, Verdict::none(v.elapsed));
    }
    // Every decision is on the bus, from the asking agent.
    let first = sub.recv().unwrap();
    assert_eq!(
        (first.topic(), first.agent()),
        ("prx.policy.decision", "claude-code")
    );
    let v: serde_json::Value = serde_json::from_str(first.json_str()).unwrap();
    assert_eq!(
        (&v["point"], &v["decision"], &v["policy"], &v["reason"]),
        (
            &json!("tool_call_start"),
            &json!("deny"),
            &json!("no-rm-rf"),
            &json!("rm -rf is not allowed in this workspace")
        )
    );
    let second: serde_json::Value = serde_json::from_str(sub.recv().unwrap().json_str()).unwrap();
    assert_eq!(second["decision"], serde_json::Value::Null);
    let s = hooks.stats();
    assert_eq!((s.emitted, s.processed), (0, 0), "a decision emits nothing");
    let p = s.policies().unwrap();
    assert_eq!(
        (p.deny, p.none, p.allow, p.ask, p.refused),
        (10, 10, 0, 0, 0)
    );
    assert_eq!(p.file.as_ref().map(|f| f.actions), Some(1));
    assert_eq!(p.by_policy.len(), 1);
    assert_eq!(
        (
            p.by_policy[0].policy.as_str(),
            p.by_policy[0].decision,
            p.by_policy[0].decisions
        ),
        ("no-rm-rf", Decision::Deny, 10)
    );
    // The hook itself still runs for an emitted event: the lane is unchanged.
    hooks.emitter("a", "s").emit(Event::ToolCallStart {
        tool: "Bash",
        arguments: r#"{"command":"ls"}"#,
    });
    hooks.shutdown(Duration::from_secs(5));
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "one emitted event, one hook run");
}

#[test]
fn policies_json_hot_reloads_and_keeps_the_last_good_table() {
    let ws = tempfile::tempdir().unwrap();
    let file = ws.path().join("policies.json");
    let hooks = Hooks::builder()
        .workspace(ws.path())
        .reload_debounce(Duration::from_millis(20))
        .build()
        .unwrap();
    let rm = r#"{"tool": "Bash", "arguments": {"command": "rm -rf x"}}"#;
    let decide = || {
        hooks
            .decide(DecisionPoint::ToolCallStart, "claude-code", rm)
            .unwrap()
    };
    assert_eq!(decide().decision, None, "no file: no decision");
    let wait = |what: &str, cond: &dyn Fn() -> bool| {
        let until = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < until, "waited 5 s for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    std::fs::write(&file, CONTRACT).unwrap();
    wait("the file to go live", &|| {
        decide().decision == Some(Decision::Deny)
    });

    // Broken: refused with its position, the last good table stays.
    std::fs::write(&file, "{\"policies\": [\n  {\"id\": 7}]}").unwrap();
    wait("the rejection", &|| {
        hooks
            .stats()
            .policies()
            .unwrap()
            .file
            .as_ref()
            .unwrap()
            .failing
    });
    let stats = hooks.stats();
    let f = stats.policies().unwrap().file.clone().unwrap();
    let err = f.last_error.unwrap();
    assert!(
        err.contains("policies.json:2:10: policies[0].id: expected a string, found number"),
        "{err}"
    );
    assert_eq!(decide().decision, Some(Decision::Deny), "last good kept");

    // Fixed, to an allow: live.
    std::fs::write(&file, CONTRACT.replace("\"deny\"", "\"allow\"")).unwrap();
    wait("the fix to go live", &|| {
        decide().decision == Some(Decision::Allow)
    });
    assert!(
        !hooks
            .stats()
            .policies()
            .unwrap()
            .file
            .as_ref()
            .unwrap()
            .failing
    );

    // Deleted: no policies.
    std::fs::remove_file(&file).unwrap();
    wait("the deletion", &|| decide().decision.is_none());
    hooks.shutdown(Duration::from_secs(2));
    // After shutdown the last table still answers.
    assert_eq!(decide().decision, None);
}
