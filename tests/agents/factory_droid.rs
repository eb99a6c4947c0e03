//! Factory Droid (`droid exec`) against the fake Chat Completions API (a custom model with its
//! `baseUrl` in `~/.factory/settings.json`), the user's own hooks in the project's
//! `.factory/settings.json` (the pinned Droid runs the hooks of its settings files, and none of
//! a `hooks.json`), and `connect factory-droid` beside them. Droid
//! waits for each hook, so lifecycle events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, chat_tool_result, cli,
    documented, on_every_event, one_session,
};
use crate::models::{Api, ModelServer, Script};
use crate::table::{
    Check, Expect, Order, Row, and_topics, check_settled, event, prompt_opens_the_turn, row, topic,
};
use prx_hooks::agents::Agent;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "factory-droid";

// =============================================================================================
// FACTORY DROID: WHAT EACH OF ITS EVENTS BECOMES
//
// Claude-shaped, mapped as docs/agents.md says: a prompt opens a turn (`agent_start`), `Stop`
// closes it (`turn_complete`, then `agent_end`), a session's start and end are topics of their own.
// =============================================================================================
fn table() -> Vec<Row> {
    let topic = |e: &str| topic(AGENT, e);
    let rows = vec![
        row("SessionStart", vec![topic("session_start")]),
        row("UserPromptSubmit", prompt_opens_the_turn()),
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
    and_topics(AGENT, rows, &documented(Agent::FactoryDroid))
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
    let own = json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]}]);
    let hooks = on_every_event(Agent::FactoryDroid.events().iter().copied(), &own);
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
    chat_tool_result(model);
    one_session(s, cli, SENT)
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
    let tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);

    let (raws, session) = session(&s, &cli, &model);
    let table = table();
    let expect = Expect {
        agent: AGENT,
        table: &table,
        session: &session,
        order: Order::Exact,
    };
    check_settled(&s, server, tail, &raws, &expect);

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
}
