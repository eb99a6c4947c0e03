//! GitHub Copilot CLI (`copilot -p`) against the fake Chat Completions API (its own provider:
//! `COPILOT_PROVIDER_BASE_URL`), the user's own hooks in the project's `.github/hooks/` (in
//! the PascalCase names, whose payloads are snake_case with `hook_event_name`). This build has
//! no `connect` for it: where it translates `copilot-cli`, ours are written beside them by hand.

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

const AGENT: &str = "copilot-cli";

/// Copilot CLI's events in their PascalCase names (its hooks reference).
const HOOK_EVENTS: [&str; 10] = [
    "SessionStart",
    "SessionEnd",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "Stop",
    "SubagentStop",
    "ErrorOccurred",
    "PreCompact",
];

// =============================================================================================
// GITHUB COPILOT CLI: WHAT EACH OF ITS EVENTS BECOMES
//
// In its PascalCase names, mapped as docs/agents.md says: a prompt opens a turn (`agent_start`),
// `Stop` closes it (`turn_complete`, then `agent_end`), a session's start and end are topics of
// their own.
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
    let mut hooks = serde_json::Map::new();
    for e in HOOK_EVENTS {
        hooks.insert(
            e.into(),
            json!([{"type": "command", "bash": s.users_own_hook(), "timeoutSec": 30}]),
        );
    }
    let path = s.project.join(".github/hooks/users-own.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = serde_json::to_string_pretty(&json!({"version": 1, "hooks": hooks})).unwrap();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// Ours, by hand, in `.github/hooks/prx-hooks.json`: `prx-hooks-send --from copilot-cli`.
fn our_hooks(s: &Setup) {
    let ours = format!(
        "prx-hooks-send --from {AGENT} --workspace {}",
        s.ws.display()
    );
    let mut hooks = serde_json::Map::new();
    for e in HOOK_EVENTS {
        hooks.insert(
            e.into(),
            json!([{"type": "command", "bash": ours, "timeoutSec": 30}]),
        );
    }
    let text = serde_json::to_string_pretty(&json!({"version": 1, "hooks": hooks})).unwrap();
    std::fs::write(s.project.join(".github/hooks/prx-hooks.json"), text).unwrap();
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
fn copilot_cli_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@github/copilot") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiChat, Script::shell(COMMAND, ANSWER));
    let (hooks, before) = users_hooks(&s);
    let server = Server::start(&s.ws);
    let mut tail = Tail::start(&s.ws, 4096);
    let translated = prx_hooks::agents::Agent::from_name(AGENT).is_some();
    if translated {
        our_hooks(&s);
    }

    let (raws, session) = session(&s, &cli, &model);
    if !translated {
        // Copilot CLI ran offline and sent what SENT pins.
        say(&[
            "this build does not translate copilot-cli: only Copilot CLI's own events are checked"
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

    assert_eq!(std::fs::read_to_string(&hooks).unwrap(), before);
    say(&notes);
}
