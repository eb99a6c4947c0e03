//! The decision doors over real loopback TCP (docs/policies.md § Doors): `POST /api/decide`,
//! and Claude Code's `http` hook door `POST /api/ingest/claude-code` answering PreToolUse,
//! PermissionRequest and UserPromptSubmit in Claude Code's format while the event is still
//! ingested and its hooks still run.

use crate::ingest::Ingest;
use crate::support::{lines, wait_for};
use serde_json::{Value, json};

const TOKEN: &str = "ingest-token-0123456789abcdef";

const POLICIES: &str = r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell|run_shell_command|exec_command",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"},
  {"id": "ask-web", "on": ["permission", "tool_call_start"], "matcher": "WebFetch", "decision": "ask", "reason": "fetching the web?"},
  {"id": "allow-read", "on": ["permission"], "matcher": "Read", "decision": "allow"},
  {"id": "no-keys", "on": ["prompt"], "when": {"prompt": {"regex": "sk-[A-Za-z0-9]{20}"}}, "decision": "deny", "reason": "the prompt holds an API key"},
  {"id": "prompt-note", "on": ["prompt"], "when": {"prompt": {"prefix": "deploy"}}, "decision": "allow", "context": "deploys go through CI"}
]}"#;

fn start(log: &std::path::Path) -> Ingest {
    let script = format!("cat >> {}; echo >> {}", log.display(), log.display());
    let hooks = json!({"hooks": {"tool_call_start": [
        // One run at a time: two runs appending at once would interleave their lines.
        {"command": "/bin/sh", "args": ["-c", script], "stdin_json": true, "max_concurrent": 1}
    ]}});
    let api = Ingest::start(&hooks.to_string());
    std::fs::write(api.ws.path().join("policies.json"), POLICIES).unwrap();
    assert_eq!(
        api.hooks.apply_policies_file(),
        Some(prx_hooks::config::Reload::Applied)
    );
    api
}

fn post_json(api: &Ingest, path: &str, body: &Value) -> (u16, Value, Option<String>) {
    let url = format!("http://{}{path}", api.server.local_addr());
    let mut resp = Ingest::client()
        .post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .unwrap();
    let outcome = resp
        .headers()
        .get("x-prx-hooks-outcome")
        .map(|v| v.to_str().unwrap().to_string());
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value, outcome)
}

fn bash(command: &str) -> Value {
    json!({"tool": "Bash", "arguments": {"command": command}})
}

#[test]
fn api_decide_answers_decision_reason_policy_and_elapsed_and_emits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let api = start(&dir.path().join("log"));
    let ask = |event: &str, payload: Value| {
        post_json(
            &api,
            "/api/decide",
            &json!({"event": event, "agent": "claude-code", "session": "s1", "payload": payload}),
        )
    };
    let (status, body, _) = ask("tool_call_start", bash("rm -rf /tmp/victim"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"], "deny");
    assert_eq!(body["reason"], "rm -rf is not allowed in this workspace");
    assert_eq!(body["policy"], "no-rm-rf");
    assert!(body["elapsed_us"].is_u64(), "{body}");

    let (status, body, _) = ask("tool_call_start", bash("ls"));
    assert_eq!(status, 200);
    assert_eq!(
        (&body["decision"], &body["reason"], &body["policy"]),
        (&Value::Null, &Value::Null, &Value::Null),
        "{body}"
    );
    let (_, body, _) = ask("prompt", json!({"prompt": "deploy it"}));
    assert_eq!(
        (&body["decision"], &body["context"]),
        (&json!("allow"), &json!("deploys go through CI"))
    );
    let (_, body, _) = ask("permission", json!({"tool": "WebFetch", "arguments": {}}));
    assert_eq!(body["decision"], "ask");

    // Bad questions: named, nothing decided.
    let (status, body, _) = ask("tool_call", bash("rm -rf /"));
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("event: \"tool_call\" is not a decision point; expected one of tool_call_start, prompt, permission"),
        "{body}"
    );
    let (status, body, _) = post_json(
        &api,
        "/api/decide",
        &json!({"event": "prompt", "agent": "a", "payload": {}, "extra": 1}),
    );
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `extra`"),
        "{body}"
    );
    let (status, body, _) = ask("prompt", json!("text"));
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("payload: the payload is not a JSON object"),
        "{body}"
    );
    let big = "x".repeat(prx_hooks::policy::MAX_PAYLOAD_BYTES);
    let (status, body, _) = ask("prompt", json!({"prompt": big}));
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("a decision reads at most 1048576 bytes"),
        "{body}"
    );

    let stats = api.stats();
    assert_eq!(stats["emitted"], 0, "/api/decide emits nothing: {stats}");
    let p = &stats["policies"];
    assert_eq!(
        (
            &p["deny"],
            &p["none"],
            &p["allow"],
            &p["ask"],
            &p["refused"]
        ),
        (&json!(1), &json!(1), &json!(1), &json!(1), &json!(2)),
        "{p}"
    );
    assert_eq!(
        p["by_policy"][0],
        json!({"policy": "no-rm-rf", "decision": "deny", "decisions": 1})
    );
    let url = format!("http://{}/metrics", api.server.local_addr());
    let text = Ingest::client()
        .get(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    for line in [
        "prx_hooks_policy_decisions_total{outcome=\"deny\"} 1",
        "prx_hooks_policy_decisions_total{outcome=\"refused\"} 2",
        "prx_hooks_policy_decided_total{policy=\"no-rm-rf\",decision=\"deny\"} 1",
        "prx_hooks_policy_decided_total{policy=\"ask-web\",decision=\"ask\"} 1",
        "prx_hooks_policies_loaded 5",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
}

#[test]
fn claude_codes_http_hook_gets_its_documented_decision_and_the_event_is_still_ingested() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let api = start(&log);
    let door = "/api/ingest/claude-code";
    let pre = |command: &str| {
        json!({"session_id": "cc1", "hook_event_name": "PreToolUse", "tool_name": "Bash",
               "tool_input": {"command": command}, "cwd": "/w"})
    };
    let (status, body, outcome) = post_json(&api, door, &pre("rm -rf /tmp/victim"));
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "rm -rf is not allowed in this workspace"}})
    );
    assert_eq!(
        outcome.as_deref(),
        Some("queued"),
        "the event is ingested too"
    );
    let (_, body, outcome) = post_json(&api, door, &pre("ls -la"));
    assert_eq!(body, json!({}), "nothing decides: {{}}");
    assert_eq!(outcome.as_deref(), Some("queued"));
    // Both events reached the tool_call_start hook, the denied one included.
    wait_for("two hook runs", || lines(&log).len() >= 2);
    let runs = lines(&log);
    assert!(runs[0].contains("rm -rf /tmp/victim"), "{runs:?}");
    assert!(runs[1].contains("ls -la"), "{runs:?}");

    // PermissionRequest: allow and deny as `decision.behavior`; ask (none there) is a deny.
    let perm = |tool: &str| {
        json!({"session_id": "cc1", "hook_event_name": "PermissionRequest", "tool_name": tool,
               "tool_input": {"url": "https://example.com"}})
    };
    let (_, body, _) = post_json(&api, door, &perm("Read"));
    assert_eq!(
        body,
        json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}})
    );
    let (_, body, _) = post_json(&api, door, &perm("WebFetch"));
    assert_eq!(
        body,
        json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest",
            "decision": {"behavior": "deny", "message": "fetching the web?"}}})
    );
    let (_, body, _) = post_json(&api, door, &perm("Edit"));
    assert_eq!(body, json!({}));
    // PreToolUse keeps ask.
    let (_, body, _) = post_json(
        &api,
        door,
        &json!({"session_id": "cc1", "hook_event_name": "PreToolUse", "tool_name": "WebFetch", "tool_input": {}}),
    );
    assert_eq!(body["hookSpecificOutput"]["permissionDecision"], "ask");

    // UserPromptSubmit: a block with the reason; an allow with context adds it.
    let prompt = |text: &str| json!({"session_id": "cc1", "hook_event_name": "UserPromptSubmit", "prompt": text});
    let (_, body, outcome) = post_json(
        &api,
        door,
        &prompt("use sk-abcdefghijklmnopqrstuvwxyz please"),
    );
    assert_eq!(
        body,
        json!({"decision": "block", "reason": "the prompt holds an API key"})
    );
    // Ingested as before: its topic line, which nobody here subscribes to.
    assert_eq!(outcome.as_deref(), Some("skipped"));
    let (_, body, _) = post_json(&api, door, &prompt("deploy the app"));
    assert_eq!(
        body,
        json!({"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": "deploys go through CI"}})
    );
    let (_, body, _) = post_json(&api, door, &prompt("hello"));
    assert_eq!(body, json!({}));
    // Not a decision point: `{}` as before.
    let (_, body, _) = post_json(
        &api,
        door,
        &json!({"session_id": "cc1", "hook_event_name": "PostToolUse", "tool_name": "Bash",
                "tool_input": {"command": "rm -rf /"}, "tool_response": "ok"}),
    );
    assert_eq!(body, json!({}));
    let p = &api.stats()["policies"];
    assert_eq!(
        (&p["deny"], &p["ask"], &p["allow"]),
        (&json!(2), &json!(2), &json!(2)),
        "{p}"
    );
    // A payload the ingest cannot read (no session id) still gets its decision, not a 400
    // Claude Code would run the tool on.
    let mut unreadable = pre("rm -rf /tmp/victim");
    unreadable.as_object_mut().unwrap().remove("session_id");
    let (status, body, outcome) = post_json(&api, door, &unreadable);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["hookSpecificOutput"]["permissionDecision"], "deny");
    assert_eq!(outcome.as_deref(), Some("error"));
}

#[test]
fn the_lifecycle_event_of_a_decided_tool_call_carries_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let api = start(&log);
    let door = "/api/ingest/claude-code";
    let pre = |tool: &str, command: &str| {
        json!({"session_id": "cc2", "hook_event_name": "PreToolUse", "tool_name": tool,
               "tool_input": {"command": command}, "tool_use_id": "toolu_1"})
    };
    post_json(&api, door, &pre("Bash", "rm -rf /tmp/victim"));
    post_json(&api, door, &pre("WebFetch", "x"));
    post_json(&api, door, &pre("Bash", "ls -la"));
    wait_for("three hook runs", || lines(&log).len() >= 3);
    let runs: Vec<Value> = lines(&log)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // What the tool_call_start hooks receive: the decision beside the documented fields.
    assert_eq!(runs[0]["tool"], "Bash");
    assert_eq!(runs[0]["policy_decision"], "deny", "{}", runs[0]);
    assert_eq!(runs[0]["policy_id"], "no-rm-rf");
    assert_eq!(
        runs[0]["policy_reason"],
        "rm -rf is not allowed in this workspace"
    );
    assert_eq!(runs[0]["tool_use_id"], "toolu_1", "the agent's fields stay");
    assert_eq!(
        (&runs[1]["policy_decision"], &runs[1]["policy_id"]),
        (&json!("ask"), &json!("ask-web"))
    );
    // No policy decided: no decision fields (the hooks see the payload as before).
    for field in ["policy_decision", "policy_id", "policy_reason"] {
        assert!(runs[2].get(field).is_none(), "{}", runs[2]);
    }
}

#[test]
fn a_command_policy_answers_api_decide_and_claude_codes_door() {
    use std::os::unix::fs::PermissionsExt;
    let api = Ingest::start(r#"{"hooks": {}}"#);
    let ws = api.ws.path();
    // A guard written for Claude Code's command hooks: tool_input on stdin, exit 2 to deny.
    let guard = ws.join("no-rm-rf.sh");
    std::fs::write(
        &guard,
        "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in *'\"tool_input\"'*'rm -rf'*) echo 'guard says no' >&2; exit 2;; esac\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&guard, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        ws.join("policies.json"),
        json!({"policies": [{"id": "guard", "on": ["tool_call_start"], "matcher": "Bash",
            "command": "./no-rm-rf.sh", "timeout_ms": 10000}]})
        .to_string(),
    )
    .unwrap();
    assert_eq!(
        api.hooks.apply_policies_file(),
        Some(prx_hooks::config::Reload::Applied)
    );
    let ask = |command: &str| {
        post_json(
            &api,
            "/api/decide",
            &json!({"event": "tool_call_start", "agent": "claude-code", "payload": bash(command)}),
        )
    };
    let (status, body, _) = ask("rm -rf /tmp/victim");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["decision"], &body["reason"], &body["policy"]),
        (&json!("deny"), &json!("guard says no"), &json!("guard")),
        "{body}"
    );
    let (_, body, _) = ask("ls");
    assert_eq!(body["decision"], Value::Null, "{body}");
    let (status, body, _) = post_json(
        &api,
        "/api/ingest/claude-code",
        &json!({"session_id": "cc1", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                "tool_input": {"command": "rm -rf /"}, "cwd": "/w"}),
    );
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "deny", "permissionDecisionReason": "guard says no"}})
    );
    let stats = api.stats();
    let c = &stats["policies"]["commands"][0];
    assert_eq!(
        (
            &c["policy"],
            &c["runs"],
            &c["deny"],
            &c["none"],
            &c["decisions"]
        ),
        (&json!("guard"), &json!(3), &json!(2), &json!(1), &json!(2)),
        "{stats}"
    );
    let url = format!("http://{}/metrics", api.server.local_addr());
    let text = Ingest::client()
        .get(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    for line in [
        "prx_hooks_policy_command_runs_total{policy=\"guard\"} 3",
        "prx_hooks_policy_command_timed_out_total{policy=\"guard\"} 0",
        "prx_hooks_policy_command_cut_by_asker_total{policy=\"guard\"} 0",
        "prx_hooks_policy_command_decided_total{policy=\"guard\"} 2",
        "prx_hooks_policy_duplicate_ids_total 0",
        "prx_hooks_policies_loaded 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
}

/// `Prx-Decision-Deadline-Ms`: the asker's deadline caps every slower source. A guard that
/// sleeps 5 s under a `timeout_ms` of 10 s is cut at the 300 ms the asker waits and answers
/// its `on_error`, counted as timed out; without the header it is left its own deadline; a
/// bad value is a 400 naming the header.
#[test]
fn the_askers_deadline_cuts_a_slower_command_policy_and_it_answers_on_error() {
    use std::os::unix::fs::PermissionsExt;
    let api = Ingest::start(r#"{"hooks": {}}"#);
    let ws = api.ws.path();
    let guard = ws.join("slow.sh");
    std::fs::write(&guard, "#!/bin/sh\nsleep 5\n").unwrap();
    std::fs::set_permissions(&guard, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        ws.join("policies.json"),
        json!({"policies": [{"id": "slow", "on": ["tool_call_start"], "matcher": "Bash",
            "command": "./slow.sh", "timeout_ms": 10000, "on_error": "deny"}]})
        .to_string(),
    )
    .unwrap();
    assert_eq!(
        api.hooks.apply_policies_file(),
        Some(prx_hooks::config::Reload::Applied)
    );
    let auth = format!("Bearer {TOKEN}");
    let ask = |deadline: &str| {
        let body = json!({"event": "tool_call_start", "agent": "claude-code",
                          "payload": bash("ls")});
        api.post_with(
            &Ingest::client(),
            "/api/decide",
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
                (prx_hooks::http::DECISION_DEADLINE_HEADER, deadline),
            ],
            body.to_string().as_bytes(),
        )
    };
    let a = ask("300");
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        (&a.body["decision"], &a.body["policy"]),
        (&json!("deny"), &json!("slow")),
        "{}",
        a.body
    );
    let reason = a.body["reason"].as_str().unwrap();
    assert!(
        reason.contains("timed out after ") && reason.contains("the asker's deadline"),
        "{reason}"
    );
    // Liveness only, with slack: cut well before the guard's 5 s.
    assert!(
        a.body["elapsed_us"].as_u64().unwrap() < 4_000_000,
        "{}",
        a.body
    );
    let c = &api.stats()["policies"]["commands"][0];
    assert_eq!(
        (&c["runs"], &c["timed_out"], &c["cut_by_asker"]),
        (&json!(1), &json!(1), &json!(1)),
        "{c}"
    );

    // The Claude Code door honours it too.
    let a = api.post_with(
        &Ingest::client(),
        "/api/ingest/claude-code",
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
            (prx_hooks::http::DECISION_DEADLINE_HEADER, "200"),
        ],
        json!({"session_id": "cc1", "hook_event_name": "PreToolUse", "tool_name": "Bash",
               "tool_input": {"command": "ls"}, "cwd": "/w"})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(
        a.body["hookSpecificOutput"]["permissionDecision"], "deny",
        "{}",
        a.body
    );
    let c = &api.stats()["policies"]["commands"][0];
    assert_eq!(
        (&c["runs"], &c["timed_out"], &c["cut_by_asker"]),
        (&json!(2), &json!(2), &json!(2)),
        "{c}"
    );

    for bad in ["soon", "-1", "1.5", "3600001", "+300", "", " "] {
        let a = ask(bad);
        assert_eq!(a.status, 400, "{bad}: {}", a.body);
        let said = a.body.to_string();
        assert!(
            said.contains(prx_hooks::http::DECISION_DEADLINE_HEADER)
                && said.contains("milliseconds"),
            "{bad}: {said}"
        );
    }
    // Sent twice, whichever comes first: refused as `300,400` on one line is.
    for pair in [["300", "soon"], ["soon", "300"]] {
        let body = json!({"event": "tool_call_start", "agent": "claude-code",
                          "payload": bash("ls")});
        let a = api.post_with(
            &Ingest::client(),
            "/api/decide",
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
                (prx_hooks::http::DECISION_DEADLINE_HEADER, pair[0]),
                (prx_hooks::http::DECISION_DEADLINE_HEADER, pair[1]),
            ],
            body.to_string().as_bytes(),
        );
        assert_eq!(a.status, 400, "{pair:?}: {}", a.body);
        assert!(a.body.to_string().contains("more than once"), "{}", a.body);
    }
    let c = &api.stats()["policies"]["commands"][0];
    assert_eq!(c["runs"], 2, "a refused question runs nothing: {c}");
    // The asker's cuts, as /metrics has them.
    let url = format!("http://{}/metrics", api.server.local_addr());
    let text = Ingest::client()
        .get(url)
        .header("authorization", auth.as_str())
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let line = "prx_hooks_policy_command_cut_by_asker_total{policy=\"slow\"} 2";
    assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
}

/// A command policy runs contained as a shell hook does: the hooks' default limits
/// (`ShellLimits::hook_limits`, what `run --hook-limit` sets; `core_bytes` 0 under `run`)
/// apply to the guard's process too.
#[test]
fn a_command_policy_runs_under_the_hooks_rlimits() {
    use std::os::unix::fs::PermissionsExt;
    let api = Ingest::start_with(
        r#"{"hooks": {}}"#,
        |b| {
            let mut limits = prx_hooks::shell::ShellLimits::default();
            limits.hook_limits.open_files = Some(77);
            limits.hook_limits.core_bytes = Some(0);
            b.shell_limits(limits)
        },
        |o| o,
    );
    let ws = api.ws.path();
    let seen = ws.join("limits");
    std::fs::write(
        ws.join("limits.sh"),
        format!(
            "#!/bin/sh\n{{ ulimit -n; ulimit -c; }} > {}\n",
            seen.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(ws.join("limits.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        ws.join("policies.json"),
        json!({"policies": [{"id": "limits", "on": ["tool_call_start"],
            "command": "./limits.sh", "timeout_ms": 10000}]})
        .to_string(),
    )
    .unwrap();
    assert_eq!(
        api.hooks.apply_policies_file(),
        Some(prx_hooks::config::Reload::Applied)
    );
    let (status, body, _) = post_json(
        &api,
        "/api/decide",
        &json!({"event": "tool_call_start", "agent": "a", "payload": bash("ls")}),
    );
    assert_eq!((status, &body["decision"]), (200, &Value::Null), "{body}");
    let got = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(got.lines().collect::<Vec<_>>(), ["77", "0"], "{got}");
}
