//! Factory Droid (`droid exec`) against the fake Chat Completions API (a custom model with its
//! `baseUrl` in `~/.factory/settings.json`), the user's own hooks in the project's
//! `.factory/settings.json` (the pinned Droid runs the hooks of its settings files, and none of
//! a `hooks.json`), and `connect factory-droid` beside them where this build has it. Droid
//! waits for each hook, so lifecycle events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, cli, hooks_all_ran,
    sent_as_pinned, settle, tail_last_shows_the_same,
};
use crate::models::{Answer, Api, CALL_ID, ModelServer, Script};
use crate::table::{Becomes, Check, Expect, Order, Row, check, event, row, say};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "factory-droid";

/// The hook events of Factory Droid's hooks reference.
const HOOK_EVENTS: [&str; 9] = [
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "Notification",
    "PreCompact",
    "SubagentStop",
    "Stop",
    "SessionEnd",
];

// =============================================================================================
// FACTORY DROID: WHAT EACH OF ITS EVENTS BECOMES
//
// Claude-shaped, mapped as docs/agents.md says: a prompt opens a turn (`agent_start`), `Stop`
// closes it (`turn_complete`, then `agent_end`), a session's start and end are topics of their own.
// =============================================================================================
fn table() -> Vec<Row> {
    let topic = |e: &str| Becomes::Topic(format!("prx.agent.{AGENT}.{e}"));
    let mut rows = vec![
        row("SessionStart", vec![topic("session_start")]),
        row(
            "UserPromptSubmit",
            vec![event(
                "agent_start",
                &[],
                vec![Check::FromAgent("/prompt", "/prompt")],
            )],
        ),
        row(
            "PreToolUse",
            vec![event(
                "tool_call_start",
                &["tool_name", "tool_input"],
                vec![
                    Check::Is("/tool", json!("Execute")),
                    Check::Is("/arguments/command", json!(COMMAND)),
                    Check::FromAgent("/arguments", "/tool_input"),
                ],
            )],
        ),
        row(
            "PostToolUse",
            vec![event(
                "tool_call",
                &["tool_name", "tool_response"],
                vec![
                    Check::Is("/tool", json!("Execute")),
                    // Its pages do not say that PostToolUse fires only after a success.
                    Check::Absent("/success"),
                    Check::Contains("/output", COMMAND_OUTPUT),
                ],
            )],
        ),
        row(
            "Stop",
            // Droid's Stop carries no text of the answer, and its pages do not say that it
            // does not fire on an error: no `success`.
            vec![
                event(
                    "turn_complete",
                    &[],
                    vec![Check::Absent("/last_assistant_message")],
                ),
                event("agent_end", &[], vec![Check::Absent("/success")]),
            ],
        ),
        row("SessionEnd", vec![topic("session_end")]),
    ];
    for e in HOOK_EVENTS {
        if !rows.iter().any(|r| r.event == e) {
            rows.push(row(e, vec![topic(e)]));
        }
    }
    rows
}
// =============================================================================================

/// What one session of the pinned version sends (tests/agents/versions).
const SENT: &[(&str, &[&str])] = &[
    (
        "SessionStart",
        &[
            "CLAUDE_ENV_FILE",
            "cwd",
            "hook_event_name",
            "permission_mode",
            "session_id",
            "source",
            "transcript_path",
        ],
    ),
    (
        "PreToolUse",
        &[
            "cwd",
            "hook_event_name",
            "permission_mode",
            "session_id",
            "tool_input",
            "tool_name",
            "transcript_path",
        ],
    ),
    (
        "PostToolUse",
        &[
            "cwd",
            "hook_event_name",
            "permission_mode",
            "session_id",
            "tool_input",
            "tool_name",
            "tool_response",
            "transcript_path",
        ],
    ),
    (
        "Stop",
        &[
            "cwd",
            "elapsed_time",
            "hook_event_name",
            "message_id",
            "permission_mode",
            "session_id",
            "stop_hook_active",
            "tool_execution_count",
            "transcript_path",
        ],
    ),
    (
        "SessionEnd",
        &[
            "cwd",
            "hook_event_name",
            "message_count",
            "message_id",
            "permission_mode",
            "reason",
            "session_duration_ms",
            "session_id",
            "transcript_path",
        ],
    ),
];

/// The user's side: the fake model as a custom model (`~/.factory/settings.json`), and the
/// project's `.factory/settings.json` with their own hook on every event. Returns its path and
/// bytes.
fn users_settings(s: &Setup, model: &ModelServer) -> (PathBuf, String) {
    let factory_home = s.home.join(".factory");
    std::fs::create_dir_all(&factory_home).unwrap();
    std::fs::write(
        factory_home.join("settings.json"),
        json!({"customModels": [{"model": "gpt-fake", "displayName": "Fake",
            "baseUrl": format!("{}/v1", model.url()), "apiKey": "sk-fake",
            "provider": "generic-chat-completion-api", "maxOutputTokens": 1000}]})
        .to_string(),
    )
    .unwrap();
    let mut hooks = serde_json::Map::new();
    for e in HOOK_EVENTS {
        hooks.insert(
            e.into(),
            json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]}]),
        );
    }
    let path = s.project.join(".factory/settings.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let before = serde_json::to_string_pretty(&json!({ "hooks": hooks })).unwrap();
    std::fs::write(&path, &before).unwrap();
    (path, before)
}

/// One `droid exec` session: the model asked for the tool call, then (with the command's
/// output) for the answer; the events Droid sent, and its session's id.
fn session(s: &Setup, cli: &Cli, model: &ModelServer) -> (Vec<Raw>, String) {
    let mut cmd = Command::new(&cli.program);
    cmd.args([
        "exec",
        "-m",
        "custom:gpt-fake",
        "--skip-permissions-unsafe",
        PROMPT,
    ]);
    let run = s.run_agent("droid", cmd, Duration::from_secs(180));
    assert!(
        run.stdout.contains(ANSWER),
        "{}\nmodel:\n{}",
        run.show(),
        model.summary()
    );
    let reqs = model.requests();
    let call = reqs
        .iter()
        .position(|r| r.answer == Answer::ToolCall)
        .unwrap_or_else(|| panic!("no tool call asked:\n{}", model.summary()));
    let answered = reqs[call + 1..]
        .iter()
        .find(|r| r.answer == Answer::Text)
        .unwrap_or_else(|| panic!("no answer after the tool call:\n{}", model.summary()));
    let result = answered.body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "tool"))
        .unwrap_or_else(|| panic!("no tool message in {}", answered.body));
    assert_eq!(result["tool_call_id"], CALL_ID);
    assert!(result.to_string().contains(COMMAND_OUTPUT), "{result}");
    assert_eq!(answered.header("authorization"), Some("Bearer sk-fake"));

    let raws = s.raws();
    sent_as_pinned(cli, &raws, SENT);
    let session = raws[0].object.as_ref().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    for r in &raws {
        assert_eq!(r.object.as_ref().unwrap()["session_id"], session.as_str());
    }
    (raws, session)
}

#[test]
fn factory_droid_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("droid") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiChat, Script::shell(COMMAND, ANSWER));
    let (settings, before) = users_settings(&s, &model);
    let server = Server::start(&s.ws);
    let mut tail = Tail::start(&s.ws, 4096);
    let connected = s.try_connect(AGENT);

    let (raws, session) = session(&s, &cli, &model);
    if !connected {
        // Droid ran offline and sent what SENT pins; nothing of ours was written.
        assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
        say(&[
            "this build has no `connect factory-droid`: only Droid's own events are checked"
                .to_string(),
        ]);
        return;
    }
    settle(&s, &mut tail, &raws);
    let table = table();
    let expect = Expect {
        agent: AGENT,
        table: &table,
        session: &session,
        order: Order::Exact,
    };
    let notes = check(&expect, &raws, &s.records(), &tail.messages());
    tail_last_shows_the_same(&s.ws, &tail.lines);
    drop(tail);
    hooks_all_ran(&server.stop());

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
    say(&notes);
}
