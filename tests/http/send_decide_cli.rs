//! `prx-hooks-send --from AGENT` as a decision door (docs/policies.md § Doors), against a real
//! `prx-hooks run --listen` over loopback: on an event the agent lets a hook decide it prints
//! the agent's own documented decision, exit 0, and the event is still ingested; other events
//! get `{}` as before; with no server the fail mode `--on-unreachable` applies and the event
//! is spooled once.

use crate::send_cli::{Sent, Server, payloads};
use crate::support::wait_for;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};

const SEND_BIN: &str = env!("CARGO_BIN_EXE_prx-hooks-send");

const POLICIES: &str = r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell|run_shell_command|exec_command",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"},
  {"id": "ls-is-fine", "on": ["tool_call_start"], "matcher": "Bash|run_shell_command",
   "when": {"arguments.command": {"prefix": "ls"}}, "decision": "allow"},
  {"id": "ask-web", "on": ["tool_call_start"], "matcher": "WebFetch|web_fetch",
   "decision": "ask", "reason": "fetching the web?"},
  {"id": "no-keys", "on": ["prompt"], "when": {"prompt": {"regex": "sk-[A-Za-z0-9]{20}"}},
   "decision": "deny", "reason": "the prompt holds an API key"}
]}"#;

const DENIED: &str = "rm -rf is not allowed in this workspace";

/// A workspace with the policies above and a hook logging every `tool_call_start`.
fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let (ws, log) = crate::send_cli::logging_workspace("tool_call_start");
    std::fs::write(ws.path().join("policies.json"), POLICIES).unwrap();
    (ws, log)
}

/// `prx-hooks-send --workspace WS ARGS` with `stdin`, as an agent's command hook runs it.
fn hook(ws: &Path, args: &[&str], stdin: &Value) -> Sent {
    let mut child = Command::new(SEND_BIN)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env_remove("PRX_HOOKS_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    // A usage error exits before reading: the pipe may be closed.
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.to_string().as_bytes());
    let out = child.wait_with_output().unwrap();
    Sent {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The JSON `send` printed (exit 0 asserted: `send` never exits 2).
fn answer(s: &Sent) -> Value {
    assert_eq!(s.code, 0, "{s:?}");
    serde_json::from_str(s.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {s:?}"))
}

fn tool(agent: &str, tool: &str, command: &str) -> Value {
    let event = if agent == "gemini-cli" {
        "BeforeTool"
    } else {
        "PreToolUse"
    };
    json!({"session_id": format!("{agent}-1"), "hook_event_name": event, "cwd": "/w",
           "transcript_path": null, "tool_name": tool, "tool_input": {"command": command}})
}

fn spooled(ws: &Path) -> usize {
    std::fs::read_dir(ws.join(".prx-hooks/spool"))
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "spool"))
            })
            .count()
        })
        .unwrap_or(0)
}

#[test]
fn send_prints_each_agents_documented_decision_and_the_event_is_still_ingested() {
    let (ws, log) = workspace();
    let server = Server::start(ws.path());
    fn from(agent: &str) -> [&str; 2] {
        ["--from", agent]
    }

    // Claude Code: PreToolUse's permissionDecision and reason; allow as allow; nothing: {}.
    let cc = from("claude-code");
    let s = hook(
        ws.path(),
        &cc,
        &tool("claude-code", "Bash", "rm -rf /tmp/victim"),
    );
    assert_eq!(
        answer(&s),
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "deny", "permissionDecisionReason": DENIED}}),
        "{s:?}"
    );
    let s = hook(ws.path(), &cc, &tool("claude-code", "Bash", "ls -la"));
    assert_eq!(
        answer(&s)["hookSpecificOutput"]["permissionDecision"],
        "allow"
    );
    let s = hook(ws.path(), &cc, &tool("claude-code", "Bash", "echo hi"));
    assert_eq!(answer(&s), json!({}), "nothing decides: {{}} as before");
    let s = hook(
        ws.path(),
        &cc,
        &json!({"session_id": "claude-code-1", "hook_event_name": "UserPromptSubmit",
                "prompt": "use sk-abcdefghijklmnopqrstuvwxyz"}),
    );
    assert_eq!(
        answer(&s),
        json!({"decision": "block", "reason": "the prompt holds an API key"})
    );
    // Not a decision point: `{}` as before, though a rule would match its command.
    let s = hook(
        ws.path(),
        &cc,
        &json!({"session_id": "claude-code-1", "hook_event_name": "PostToolUse", "tool_name": "Bash",
                "tool_input": {"command": "rm -rf /tmp/victim"}, "tool_response": "ok"}),
    );
    assert_eq!(answer(&s), json!({}));

    // Codex: PreToolUse's permissionDecision deny; an ask (Codex has none) is a deny; an
    // allow, which Codex's PreToolUse does not take, is no answer.
    let cx = from("codex");
    let s = hook(ws.path(), &cx, &tool("codex", "Bash", "rm -rf /tmp/victim"));
    assert_eq!(
        answer(&s),
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "deny", "permissionDecisionReason": DENIED}})
    );
    let s = hook(ws.path(), &cx, &tool("codex", "WebFetch", "x"));
    assert_eq!(
        answer(&s),
        json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "deny", "permissionDecisionReason": "fetching the web?"}})
    );
    let s = hook(ws.path(), &cx, &tool("codex", "Bash", "ls"));
    assert_eq!(answer(&s), json!({}));

    // Gemini CLI: BeforeTool's top-level decision and reason.
    let gm = from("gemini-cli");
    let s = hook(
        ws.path(),
        &gm,
        &tool("gemini-cli", "run_shell_command", "rm -fr /tmp/victim"),
    );
    assert_eq!(answer(&s), json!({"decision": "deny", "reason": DENIED}));
    let s = hook(
        ws.path(),
        &gm,
        &tool("gemini-cli", "run_shell_command", "ls /tmp"),
    );
    assert_eq!(answer(&s), json!({"decision": "allow"}));
    let s = hook(
        ws.path(),
        &gm,
        &tool("gemini-cli", "run_shell_command", "echo"),
    );
    assert_eq!(answer(&s), json!({}));

    // Every tool call reached the tool_call_start hook, the denied ones included.
    wait_for("nine tool_call_start hook runs", || {
        payloads(&log).len() == 9
    });
    let commands: Vec<String> = payloads(&log)
        .iter()
        .map(|p| p["arguments"]["command"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        commands.iter().filter(|c| c.starts_with("rm -")).count(),
        3,
        "{commands:?}"
    );
    assert_eq!(spooled(ws.path()), 0, "all delivered");
    let (code, _) = server.stop();
    assert_eq!(code, 0);
}

#[test]
fn with_no_server_send_applies_its_fail_mode_and_spools_the_event_once() {
    let (ws, log) = workspace();
    let deny = ["--from", "claude-code", "--on-unreachable", "deny"];
    let rm = tool("claude-code", "Bash", "rm -rf /tmp/victim");

    // deny: Claude Code's deny, the reason saying why.
    let s = hook(ws.path(), &deny, &rm);
    let a = answer(&s);
    assert_eq!(
        a["hookSpecificOutput"]["permissionDecision"], "deny",
        "{s:?}"
    );
    let reason = a["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains("policy server could not be reached"),
        "{reason}"
    );
    assert_eq!(spooled(ws.path()), 1, "spooled as before");
    // Whatever the command: no server, no rules read.
    let s = hook(ws.path(), &deny, &tool("claude-code", "Bash", "ls"));
    assert_eq!(
        answer(&s)["hookSpecificOutput"]["permissionDecision"],
        "deny"
    );
    // Gemini CLI's and Codex's own deny.
    let s = hook(
        ws.path(),
        &["--from", "gemini-cli", "--on-unreachable", "deny"],
        &tool("gemini-cli", "run_shell_command", "ls"),
    );
    let a = answer(&s);
    assert_eq!(a["decision"], "deny", "{s:?}");
    assert!(
        a["reason"]
            .as_str()
            .unwrap()
            .contains("policy server could not be reached")
    );
    let s = hook(
        ws.path(),
        &["--from", "codex", "--on-unreachable", "deny"],
        &tool("codex", "Bash", "ls"),
    );
    assert_eq!(
        answer(&s)["hookSpecificOutput"]["permissionDecision"],
        "deny"
    );
    // Not a decision point: nothing decided though the mode is deny.
    let s = hook(
        ws.path(),
        &deny,
        &json!({"session_id": "claude-code-1", "hook_event_name": "PostToolUse", "tool_name": "Bash",
                "tool_input": {"command": "ls"}, "tool_response": "ok"}),
    );
    assert_eq!(answer(&s), json!({}));
    // The default, none: nothing decided, the agent's own flow.
    let s = hook(ws.path(), &["--from", "claude-code"], &rm);
    assert_eq!(answer(&s), json!({}));
    let s = hook(
        ws.path(),
        &["--from", "claude-code", "--on-unreachable", "none"],
        &rm,
    );
    assert_eq!(answer(&s), json!({}));
    // A bad mode is a usage error, not a decision.
    let s = hook(
        ws.path(),
        &["--from", "claude-code", "--on-unreachable", "allow"],
        &rm,
    );
    assert_eq!(s.code, 64, "{s:?}");
    assert!(
        s.stderr.contains("none") && s.stderr.contains("deny"),
        "{s:?}"
    );

    // Each event spooled once; the next run replays each once (six tool calls reach the hook).
    assert_eq!(spooled(ws.path()), 7);
    let server = Server::start(ws.path());
    wait_for("the six spooled tool calls", || payloads(&log).len() >= 6);
    wait_for("the spool emptied", || spooled(ws.path()) == 0);
    let (_, report) = server.stop();
    assert_eq!(payloads(&log).len(), 6, "{report}");
}

/// A payload the policies can decide but the ingest cannot read (Claude Code's PreToolUse
/// without its `session_id`): the decision still reaches the agent, and the refusal is said.
#[test]
fn a_decision_stands_when_the_event_itself_cannot_be_read() {
    let (ws, _log) = workspace();
    let server = Server::start(ws.path());
    let mut rm = tool("claude-code", "Bash", "rm -rf /tmp/victim");
    rm.as_object_mut().unwrap().remove("session_id");
    let sent = hook(ws.path(), &["--from", "claude-code"], &rm);
    let got = answer(&sent);
    assert_eq!(
        got["hookSpecificOutput"]["permissionDecision"], "deny",
        "{sent:?}"
    );
    assert_eq!(
        got["hookSpecificOutput"]["permissionDecisionReason"], DENIED,
        "{sent:?}"
    );
    assert!(sent.stderr.contains("session_id"), "said: {sent:?}");
    assert_eq!(spooled(ws.path()), 0, "taken, not spooled");
    drop(server);
}

/// A guard slower than `send --timeout` (it sleeps 5 s under a `timeout_ms` of 10 s): `send`
/// tells the server how long it waits (`Prx-Decision-Deadline-Ms`), the server cuts the guard
/// at that deadline and answers with its `on_error`, so `send` prints the server's decision
/// and the event is delivered, not spooled.
#[test]
fn send_gets_an_answer_within_its_timeout_though_a_guard_is_slower() {
    use std::os::unix::fs::PermissionsExt;
    let (ws, log) = crate::send_cli::logging_workspace("tool_call_start");
    let guard = ws.path().join("slow.sh");
    std::fs::write(&guard, "#!/bin/sh\nsleep 5\n").unwrap();
    std::fs::set_permissions(&guard, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        ws.path().join("policies.json"),
        json!({"policies": [
            {"id": "slow-deny", "on": ["tool_call_start"], "matcher": "Bash",
             "command": "./slow.sh", "timeout_ms": 10000, "on_error": "deny"},
            {"id": "slow-none", "on": ["tool_call_start"], "matcher": "Read",
             "command": "./slow.sh", "timeout_ms": 10000}
        ]})
        .to_string(),
    )
    .unwrap();
    let server = Server::start(ws.path());
    let args = ["--from", "claude-code", "--timeout", "1s"];

    // on_error deny: the guard cut at send's deadline denies, the reason saying so.
    let started = std::time::Instant::now();
    let s = hook(ws.path(), &args, &tool("claude-code", "Bash", "ls"));
    let a = answer(&s);
    assert_eq!(
        a["hookSpecificOutput"]["permissionDecision"], "deny",
        "the server's on_error, not send's fail mode: {s:?}"
    );
    let reason = a["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap();
    assert!(
        reason.contains("slow-deny") && reason.contains("timed out"),
        "{reason}"
    );
    assert_eq!(spooled(ws.path()), 0, "delivered, not spooled: {s:?}");
    // Liveness, with slack: well before the guard's own 5 s.
    assert!(started.elapsed() < std::time::Duration::from_secs(4));

    // on_error none: no decision, `{}`, and still delivered.
    let mut read = tool("claude-code", "Read", "");
    read["tool_input"] = json!({"file_path": "/w/a"});
    let s = hook(ws.path(), &args, &read);
    assert_eq!(answer(&s), json!({}), "{s:?}");
    assert_eq!(spooled(ws.path()), 0, "delivered, not spooled: {s:?}");

    // The events reached the hook, the cut decision stamped on the first.
    wait_for("both tool calls", || payloads(&log).len() >= 2);
    let got = payloads(&log);
    assert_eq!(got[0]["policy_decision"], "deny", "{got:?}");
    assert_eq!(got[0]["policy_id"], "slow-deny", "{got:?}");
    assert!(got[1].get("policy_decision").is_none(), "{got:?}");
    let (_, report) = server.stop();
    assert_eq!(payloads(&log).len(), 2, "each once: {report}");
}
