//! GitHub Copilot CLI (`copilot -p`) against the fake Chat Completions API (its own provider:
//! `COPILOT_PROVIDER_BASE_URL`): `connect copilot-cli` writes `.github/hooks/prx-hooks.json`
//! beside the user's own hook file (both in the PascalCase names, whose payloads are
//! snake_case with `hook_event_name`), `doctor` finds it working, `--remove` takes the file
//! away. Copilot CLI waits for each hook, so lifecycle events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, chat_tool_result, cli,
    on_every_event, one_session,
};
use crate::models::{Api, ModelServer, Script};
use crate::table::{
    Check, Expect, Order, Row, check_settled, event, prompt_opens_the_turn, row, topic,
};
use prx_hooks::agents::Agent;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "copilot-cli";

/// The names `connect` writes Copilot CLI's events under (PascalCase where the event has such
/// a name), with the camelCase name each becomes a topic by.
fn hook_events() -> Vec<(&'static str, &'static str)> {
    Agent::CopilotCli
        .hook_events()
        .iter()
        .filter(|e| e.subscribe)
        .map(|e| (e.alias.unwrap_or(e.name), e.name))
        .collect()
}

// =============================================================================================
// GITHUB COPILOT CLI: WHAT EACH OF ITS EVENTS BECOMES
//
// In its PascalCase names, mapped as docs/agents.md says: a prompt opens a turn (`agent_start`),
// `Stop` closes it (`turn_complete`, then `agent_end`), a session's start and end are topics of
// their own.
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
                    Check::FromAgent("/tool", "/tool_name"),
                    Check::Is("/arguments/command", json!(COMMAND)),
                    Check::FromAgent("/arguments", "/tool_input"),
                ],
            )],
        ),
        row(
            "PostToolUse",
            vec![event(
                "tool_call",
                &["tool_name", "tool_result"],
                vec![
                    Check::FromAgent("/tool", "/tool_name"),
                    Check::Is("/success", json!(true)),
                    Check::Contains("/output", COMMAND_OUTPUT),
                ],
            )],
        ),
        row(
            "Stop",
            vec![
                // Copilot CLI's Stop carries no text of the answer; `success` is its
                // `stop_reason` being `end_turn`.
                event(
                    "turn_complete",
                    &[],
                    vec![Check::Is("/stop_reason", json!("end_turn"))],
                ),
                event("agent_end", &[], vec![Check::Is("/success", json!(true))]),
            ],
        ),
        row("SessionEnd", vec![topic("session_end")]),
    ];
    // Every other event: the agent's whole object on a topic of its camelCase name (the
    // payload of `notification` says "Notification" in either format).
    let others: Vec<Row> = hook_events()
        .into_iter()
        .map(|(key, name)| {
            (
                if name == "notification" {
                    "Notification"
                } else {
                    key
                },
                name,
            )
        })
        .filter(|(key, _)| !rows.iter().any(|r| r.event == *key))
        .map(|(key, name)| row(key, vec![topic(name)]))
        .collect();
    rows.into_iter().chain(others).collect()
}
// =============================================================================================

/// What one session of the pinned version sends (tests/agents/versions).
const SENT: &[(&str, &[&str])] = &[
    (
        "SessionStart",
        &[
            "cwd",
            "hook_event_name",
            "initial_prompt",
            "session_id",
            "source",
            "timestamp",
        ],
    ),
    (
        "UserPromptSubmit",
        &[
            "cwd",
            "hook_event_name",
            "prompt",
            "session_id",
            "timestamp",
        ],
    ),
    (
        "PreToolUse",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "timestamp",
            "tool_input",
            "tool_name",
        ],
    ),
    (
        "PostToolUse",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "timestamp",
            "tool_input",
            "tool_name",
            "tool_result",
        ],
    ),
    (
        "Stop",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "stop_hook_active",
            "stop_reason",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "SessionEnd",
        &[
            "cwd",
            "hook_event_name",
            "reason",
            "session_id",
            "timestamp",
        ],
    ),
];

/// The user's side: the project trusted (`trusted_folders` in `~/.copilot/config.json`: Copilot
/// CLI runs no hook of `.github/hooks/` before), and their own hook on every event in the
/// project's `.github/hooks/users-own.json`. Returns its path and bytes.
fn users_hooks(s: &Setup) -> (PathBuf, String) {
    let copilot_home = s.home.join(".copilot");
    std::fs::create_dir_all(&copilot_home).unwrap();
    std::fs::write(
        copilot_home.join("config.json"),
        json!({ "trusted_folders": [s.project.to_str().unwrap()] }).to_string(),
    )
    .unwrap();
    let own = json!([{"type": "command", "bash": s.users_own_hook(), "timeoutSec": 30}]);
    let hooks = on_every_event(hook_events().into_iter().map(|(key, _)| key), &own);
    let path = s.project.join(".github/hooks/users-own.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = serde_json::to_string_pretty(&json!({"version": 1, "hooks": hooks})).unwrap();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// One `copilot -p` session: the model asked for the tool call, then (with the command's
/// output) for the answer; the events Copilot CLI sent, and its session's id.
fn session(s: &Setup, cli: &Cli, model: &ModelServer) -> (Vec<Raw>, String) {
    let mut cmd = Command::new(&cli.program);
    cmd.args(["-p", PROMPT, "--allow-all-tools"])
        .env("COPILOT_PROVIDER_BASE_URL", format!("{}/v1", model.url()))
        .env("COPILOT_PROVIDER_API_KEY", "sk-fake")
        .env("COPILOT_MODEL", "gpt-fake");
    let run = s.run_agent("copilot", cmd, Duration::from_secs(180));
    assert!(
        run.stdout.contains(ANSWER),
        "{}\nmodel:\n{}",
        run.show(),
        model.summary()
    );
    chat_tool_result(model);
    one_session(s, cli, SENT)
}

/// `connect copilot-cli` beside the user's own hook file, one session: every event arrives as
/// the table says; `doctor` finds the file, the trust and the events; `--remove` deletes the
/// file it made, and the user's stays as it was.
#[test]
fn copilot_cli_connect_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@github/copilot") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiChat, Script::shell(COMMAND, ANSWER));
    let (hooks, before) = users_hooks(&s);
    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);
    let ours = s.project.join(".github/hooks/prx-hooks.json");
    let written = std::fs::read_to_string(&ours).unwrap();
    assert!(
        written.contains("\"bash\": \"prx-hooks-send --from copilot-cli --workspace prx\""),
        "{written}"
    );

    let (raws, session) = session(&s, &cli, &model);
    let doctor = s.prx(&["doctor", "--agent", AGENT]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(0), "doctor:\n{said}");
    for want in [
        ".github/hooks/prx-hooks.json (project)",
        "Copilot CLI trusts",
        "GitHub Copilot CLI seen: ",
    ] {
        assert!(said.contains(want), "doctor does not say {want:?}:\n{said}");
    }
    let table = table();
    let expect = Expect {
        agent: AGENT,
        table: &table,
        session: &session,
        order: Order::Exact,
    };
    check_settled(&s, server, tail, &raws, &expect);

    s.connect(AGENT, &["--remove"]);
    assert!(!ours.exists(), "--remove left {}", ours.display());
    assert_eq!(std::fs::read_to_string(&hooks).unwrap(), before);
}
