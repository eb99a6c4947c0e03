//! Qwen Code (`qwen -p`) against the fake Chat Completions API (its `openai` auth type with
//! `OPENAI_BASE_URL`): `connect qwen-code` writes the project's `.qwen/settings.json` next to the
//! user's own hooks (the folder trusted in `~/.qwen/trustedFolders.json`). Qwen Code waits for
//! each hook, so lifecycle events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, chat_tool_result, cli,
    documented, on_every_event, one_session,
};
use crate::models::{Api, ModelServer, Script};
use crate::table::{
    Check, Expect, Order, Row, and_topics, check_settled, event, prompt_opens_the_turn, row,
    row_unless, topic,
};
use prx_hooks::agents::Agent;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "qwen-code";

// =============================================================================================
// QWEN CODE: WHAT EACH OF ITS EVENTS BECOMES
//
// Claude-shaped, mapped as docs/agents.md says: a prompt opens a turn (`agent_start`), `Stop`
// closes it (`turn_complete`, then `agent_end`), a session's start and end are topics of their own.
// =============================================================================================
fn table() -> Vec<Row> {
    let topic = |e: &str| topic(AGENT, e);
    let rows = vec![
        row("SessionStart", vec![topic("session_start")]),
        // Qwen Code runs UserPromptSubmit again before the model call that carries the tool's
        // result: only a user's submission (`submitted_prompt`) opens a turn.
        row_unless(
            "UserPromptSubmit",
            prompt_opens_the_turn(),
            "submitted_prompt",
            vec![topic("UserPromptSubmit")],
        ),
        row(
            "PreToolUse",
            vec![event(
                "tool_call_start",
                &["tool_name", "tool_input"],
                vec![
                    Check::Is("/tool", json!("run_shell_command")),
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
                    Check::Is("/tool", json!("run_shell_command")),
                    Check::Is("/success", json!(true)),
                    Check::Contains("/output", COMMAND_OUTPUT),
                ],
            )],
        ),
        row(
            "PostToolUseFailure",
            vec![event(
                "tool_call",
                &["tool_name", "error"],
                vec![Check::Is("/success", json!(false))],
            )],
        ),
        row(
            "Stop",
            vec![
                event(
                    "turn_complete",
                    &[],
                    vec![Check::Is("/last_assistant_message", json!(ANSWER))],
                ),
                event("agent_end", &[], vec![Check::Is("/success", json!(true))]),
            ],
        ),
        row("SessionEnd", vec![topic("session_end")]),
    ];
    and_topics(AGENT, rows, &documented(Agent::QwenCode))
}
// =============================================================================================

/// What one session of the pinned version sends (tests/agents/versions).
const SENT: &[(&str, &[&str])] = &[
    (
        "InstructionsLoaded",
        &[
            "cwd",
            "file_path",
            "hook_event_name",
            "load_reason",
            "memory_type",
            "permission_mode",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "SessionStart",
        &[
            "cwd",
            "hook_event_name",
            "model",
            "permission_mode",
            "session_id",
            "source",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "Notification",
        &[
            "cwd",
            "hook_event_name",
            "message",
            "notification_type",
            "permission_mode",
            "session_id",
            "timestamp",
            "title",
            "transcript_path",
        ],
    ),
    (
        "UserPromptSubmit",
        &[
            "cwd",
            "hook_event_name",
            "permission_mode",
            "prompt",
            "prompt_id",
            "session_id",
            "submitted_prompt",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "PreToolUse",
        &[
            "cwd",
            "hook_event_name",
            "permission_mode",
            "prompt_id",
            "session_id",
            "timestamp",
            "tool_call_id",
            "tool_input",
            "tool_name",
            "tool_use_id",
            "transcript_path",
        ],
    ),
    (
        "PostToolUse",
        &[
            "cwd",
            "duration_ms",
            "hook_event_name",
            "permission_mode",
            "prompt_id",
            "session_id",
            "timestamp",
            "tool_call_id",
            "tool_input",
            "tool_name",
            "tool_response",
            "tool_use_id",
            "transcript_path",
        ],
    ),
    (
        "PostToolBatch",
        &[
            "cwd",
            "hook_event_name",
            "permission_mode",
            "prompt_id",
            "session_id",
            "timestamp",
            "tool_calls",
            "transcript_path",
        ],
    ),
    (
        "UserPromptSubmit",
        &[
            "cwd",
            "hook_event_name",
            "permission_mode",
            "prompt",
            "prompt_id",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "Stop",
        &[
            "background_tasks",
            "context_limit",
            "context_usage",
            "crons",
            "cwd",
            "hook_event_name",
            "input_tokens",
            "last_assistant_message",
            "permission_mode",
            "prompt_id",
            "session_id",
            "stop_hook_active",
            "timestamp",
            "transcript_path",
        ],
    ),
];

/// The user's side: the project trusted (`~/.qwen`), and the project's `.qwen/settings.json`
/// with their own hook on every event `connect` writes (all but MessageDisplay, which fires
/// as a reply streams). Returns its path and bytes.
fn users_settings(s: &Setup) -> (PathBuf, String) {
    let qwen_home = s.home.join(".qwen");
    std::fs::create_dir_all(&qwen_home).unwrap();
    std::fs::write(
        qwen_home.join("trustedFolders.json"),
        json!({ s.project.to_str().unwrap(): "TRUST_FOLDER" }).to_string(),
    )
    .unwrap();
    let own = json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]}]);
    let hooks = on_every_event(Agent::QwenCode.events().iter().copied(), &own);
    let settings = s.project.join(".qwen/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    // `$version` 4: Qwen Code rewrites an older settings file (adding it) when it starts.
    let before = serde_json::to_string_pretty(&json!({ "$version": 4, "hooks": hooks })).unwrap();
    std::fs::write(&settings, &before).unwrap();
    (settings, before)
}

/// One `qwen -p` session: the model asked for the tool call, then (with the command's output)
/// for the answer; the events Qwen Code sent, and its session's id.
fn session(s: &Setup, cli: &Cli, model: &ModelServer) -> (Vec<Raw>, String) {
    let mut cmd = Command::new(&cli.program);
    cmd.args(["-p", PROMPT, "--yolo", "--auth-type", "openai"])
        .env("OPENAI_BASE_URL", format!("{}/v1", model.url()))
        .env("OPENAI_API_KEY", "sk-fake")
        .env("OPENAI_MODEL", "gpt-fake")
        .env("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1");
    let run = s.run_agent("qwen", cmd, Duration::from_secs(180));
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
fn qwen_code_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@qwen-code/qwen-code") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiChat, Script::shell(COMMAND, ANSWER));
    let (settings, before) = users_settings(&s);
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
