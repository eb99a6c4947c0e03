//! Gemini CLI (`gemini -p`) against the fake Gemini API: `connect gemini-cli` writes its project
//! settings next to the user's own hooks (the folder trusted in `~/.gemini/trustedFolders.json`,
//! API-key auth in `~/.gemini/settings.json`). Gemini CLI waits for each hook, so lifecycle
//! events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, cli, hooks_all_ran,
    sent_as_pinned, settle, tail_last_shows_the_same,
};
use crate::models::{Answer, Api, ModelServer, Script};
use crate::table::{Becomes, Check, Expect, Order, Row, check, differs, event, row, say};
use prx_hooks::agents::Agent;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "gemini-cli";

// =============================================================================================
// GEMINI CLI: WHAT EACH OF ITS EVENTS BECOMES
//
// `mapped` is the turn mapping (docs/agents.md): a prompt opens a turn (`BeforeAgent` →
// `agent_start`), `AfterAgent` closes it (`turn_complete`, then `agent_end`), each model call is an
// `llm_request` and its (last) chunk an `llm_response`, a session's start and end are topics of
// their own. `differs(…, today)` marks where this build still maps otherwise; only that is
// tolerated.
// =============================================================================================
fn table() -> Vec<Row> {
    let topic = |e: &str| Becomes::Topic(format!("prx.agent.{AGENT}.{e}"));
    let mut rows = vec![
        // This build: a session's start is `agent_start`.
        differs(
            "SessionStart",
            vec![topic("session_start")],
            vec![event("agent_start", &[], vec![])],
        ),
        // This build: a topic.
        differs(
            "BeforeAgent",
            vec![event(
                "agent_start",
                &[],
                vec![Check::FromAgent("/prompt", "/prompt")],
            )],
            vec![topic("BeforeAgent")],
        ),
        // This build: a topic.
        differs(
            "BeforeModel",
            vec![event(
                "llm_request",
                &["llm_request"],
                vec![Check::FromAgent("/model", "/llm_request/model")],
            )],
            vec![topic("BeforeModel")],
        ),
        // This build: a topic.
        differs(
            "AfterModel",
            vec![event(
                "llm_response",
                &["llm_request", "llm_response"],
                vec![Check::FromAgent("/model", "/llm_request/model")],
            )],
            vec![topic("AfterModel")],
        ),
        row(
            "BeforeTool",
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
            "AfterTool",
            vec![event(
                "tool_call",
                &["tool_name", "tool_response"],
                vec![
                    Check::Is("/tool", json!("run_shell_command")),
                    // Gemini CLI gives a shell command's exit status only in its text, and
                    // sets `error` only when the tool itself failed: no `success` (docs/agents.md).
                    Check::Absent("/success"),
                    Check::Contains("/output", COMMAND_OUTPUT),
                ],
            )],
        ),
        // This build: `turn_complete` alone.
        differs(
            "AfterAgent",
            // Gemini CLI does not say how the turn ended: no `success`.
            vec![
                event(
                    "turn_complete",
                    &[],
                    vec![Check::Is("/prompt_response", json!(ANSWER))],
                ),
                event("agent_end", &[], vec![Check::Absent("/success")]),
            ],
            vec![event(
                "turn_complete",
                &[],
                vec![Check::Is("/prompt_response", json!(ANSWER))],
            )],
        ),
        // This build: a session's end is `agent_end` (without `success`).
        differs(
            "SessionEnd",
            vec![topic("session_end")],
            vec![event("agent_end", &[], vec![Check::Absent("/success")])],
        ),
    ];
    // Every other event: the agent's whole object on a topic named after it.
    for &e in Agent::GeminiCli.events() {
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
            "session_id",
            "source",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "BeforeAgent",
        &[
            "cwd",
            "hook_event_name",
            "prompt",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "PreCompress",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "timestamp",
            "transcript_path",
            "trigger",
        ],
    ),
    (
        "BeforeModel",
        &[
            "cwd",
            "hook_event_name",
            "llm_request",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "BeforeToolSelection",
        &[
            "cwd",
            "hook_event_name",
            "llm_request",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "AfterModel",
        &[
            "cwd",
            "hook_event_name",
            "llm_request",
            "llm_response",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "BeforeTool",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "timestamp",
            "tool_input",
            "tool_name",
            "transcript_path",
        ],
    ),
    (
        "AfterTool",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "timestamp",
            "tool_input",
            "tool_name",
            "tool_response",
            "transcript_path",
        ],
    ),
    (
        "PreCompress",
        &[
            "cwd",
            "hook_event_name",
            "session_id",
            "timestamp",
            "transcript_path",
            "trigger",
        ],
    ),
    (
        "BeforeModel",
        &[
            "cwd",
            "hook_event_name",
            "llm_request",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "BeforeToolSelection",
        &[
            "cwd",
            "hook_event_name",
            "llm_request",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "AfterModel",
        &[
            "cwd",
            "hook_event_name",
            "llm_request",
            "llm_response",
            "session_id",
            "timestamp",
            "transcript_path",
        ],
    ),
    (
        "AfterAgent",
        &[
            "cwd",
            "hook_event_name",
            "prompt",
            "prompt_response",
            "session_id",
            "stop_hook_active",
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
            "transcript_path",
        ],
    ),
];

/// The user's side: API-key auth and the project trusted (`~/.gemini`), and the project's
/// `.gemini/settings.json` with their own hook on every event. Returns its path and bytes.
fn users_settings(s: &Setup) -> (PathBuf, String) {
    let gemini_home = s.home.join(".gemini");
    std::fs::create_dir_all(&gemini_home).unwrap();
    std::fs::write(
        gemini_home.join("settings.json"),
        json!({"security": {"auth": {"selectedType": "gemini-api-key"}}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        gemini_home.join("trustedFolders.json"),
        json!({ s.project.to_str().unwrap(): "TRUST_FOLDER" }).to_string(),
    )
    .unwrap();
    let mut hooks = serde_json::Map::new();
    for &e in Agent::GeminiCli.events() {
        hooks.insert(
            e.into(),
            json!([{"hooks": [{"name": "users-own", "type": "command", "command": s.users_own_hook()}]}]),
        );
    }
    let settings = s.project.join(".gemini/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let before = serde_json::to_string_pretty(&json!({ "hooks": hooks })).unwrap();
    std::fs::write(&settings, &before).unwrap();
    (settings, before)
}

/// One `gemini -p` session: the model asked for the tool call, then (with the command's output)
/// for the answer; the events Gemini CLI sent, and its session's id. Gemini CLI shows what a
/// hook printed as a "Hook system message": nothing of ours may show.
fn session(s: &Setup, cli: &Cli, model: &ModelServer) -> (Vec<Raw>, String) {
    let mut cmd = Command::new(&cli.program);
    cmd.args(["-p", PROMPT, "--yolo"])
        .env("GOOGLE_GEMINI_BASE_URL", model.url())
        .env("GEMINI_API_KEY", "fake-gemini-key");
    let run = s.run_agent("gemini", cmd, Duration::from_secs(180));
    assert!(
        run.stdout.contains(ANSWER),
        "{}\nmodel:\n{}",
        run.show(),
        model.summary()
    );
    for shown in ["spool", "no server", "Hook system message"] {
        assert!(
            !run.stdout.contains(shown) && !run.stderr.contains(shown),
            "gemini showed {shown:?}: {}",
            run.show()
        );
    }
    let reqs = model.requests();
    let call = reqs
        .iter()
        .position(|r| r.answer == Answer::ToolCall)
        .unwrap_or_else(|| panic!("no tool call asked:\n{}", model.summary()));
    let answered = reqs[call + 1..]
        .iter()
        .find(|r| r.answer == Answer::Text)
        .unwrap_or_else(|| panic!("no answer after the tool call:\n{}", model.summary()));
    let response = answered.body["contents"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .flat_map(|c| c["parts"].as_array().into_iter().flatten())
                .find(|p| p.get("functionResponse").is_some())
        })
        .unwrap_or_else(|| panic!("no functionResponse in {}", answered.body));
    assert!(response.to_string().contains(COMMAND_OUTPUT), "{response}");
    assert_eq!(answered.header("x-goog-api-key"), Some("fake-gemini-key"));

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
fn gemini_cli_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@google/gemini-cli") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::Gemini, Script::shell(COMMAND, ANSWER));
    let (settings, before) = users_settings(&s);
    let server = Server::start(&s.ws);
    let mut tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);

    let (raws, session) = session(&s, &cli, &model);
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
    let report = server.stop();
    hooks_all_ran(&report);

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
    say(&notes);
}

#[test]
fn gemini_cli_with_the_server_down_spools_silently_and_the_next_run_replays_each_event_once() {
    let Some(cli) = cli("@google/gemini-cli") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::Gemini, Script::shell(COMMAND, ANSWER));
    let (settings, before) = users_settings(&s);
    // A workspace whose server ran and has stopped.
    Server::start(&s.ws).stop();
    s.connect(AGENT, &[]);

    let (raws, session) = session(&s, &cli, &model);
    // Gemini CLI waits for each hook: every event is in the spool when it exits; no hook ran.
    let mut sent: Vec<String> = raws.iter().map(|r| r.name.clone()).collect();
    sent.sort();
    assert_eq!(
        s.spooled(0),
        sent,
        "one spool entry per event gemini {} sent",
        cli.version
    );
    assert!(s.records().is_empty());

    let server = Server::start(&s.ws);
    let mut tail = Tail::start(&s.ws, 4096);
    settle(&s, &mut tail, &raws);
    let table = table();
    let expect = Expect {
        agent: AGENT,
        table: &table,
        session: &session,
        order: Order::Exact,
    };
    let notes = check(&expect, &raws, &s.records(), &tail.messages());
    assert!(s.spooled(0).is_empty(), "the replay emptied the spool");
    tail_last_shows_the_same(&s.ws, &tail.lines);
    drop(tail);
    hooks_all_ran(&server.stop());

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
    say(&notes);
}

// ---------------------------------------------------------------------------------------------
// Policies (docs/policies.md § Doors): `connect gemini-cli` with a workspace that holds the
// no-rm-rf rule; the fake model asks to run `rm -rf <victim>`.

/// One `gemini -p --yolo` session.
fn run_guarded(s: &Setup, cli: &Cli, model: &ModelServer) -> crate::harness::AgentRun {
    let mut cmd = Command::new(&cli.program);
    cmd.args(["-p", PROMPT, "--yolo"])
        .env("GOOGLE_GEMINI_BASE_URL", model.url())
        .env("GEMINI_API_KEY", "fake-gemini-key");
    s.run_agent("gemini", cmd, Duration::from_secs(180))
}

/// [`run_guarded`], the model answered after its tool call: what the tool's result told it.
fn guarded_session(s: &Setup, cli: &Cli, model: &ModelServer) -> String {
    let run = run_guarded(s, cli, model);
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
    answered.body["contents"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .flat_map(|c| c["parts"].as_array().into_iter().flatten())
                .find(|p| p.get("functionResponse").is_some())
        })
        .unwrap_or_else(|| panic!("no functionResponse in {}", answered.body))
        .to_string()
}

#[test]
fn gemini_cli_policies_deny_rm_rf_the_tool_does_not_run_and_the_model_is_told_why() {
    let Some(cli) = cli("@google/gemini-cli") else {
        return;
    };
    let (s, victim) = crate::harness::guarded();
    users_settings(&s);
    let server = Server::start(&s.ws);
    s.connect(AGENT, &[]);
    let model = ModelServer::start(Api::Gemini, crate::harness::rm_rf(&victim));
    let result = guarded_session(&s, &cli, &model);
    assert!(victim.join("keep").exists(), "the denied rm -rf ran");
    assert!(
        result.contains("rm -rf is not allowed in this workspace"),
        "the model is told the reason: {result}"
    );
    // An allowed command runs.
    let model = ModelServer::start(Api::Gemini, Script::shell(COMMAND, ANSWER));
    let result = guarded_session(&s, &cli, &model);
    assert!(result.contains(COMMAND_OUTPUT), "{result}");
    server.stop();

    // The server down, --on-unreachable deny: every decision point denies, the prompt first.
    s.connect(AGENT, &["--on-unreachable", "deny"]);
    let model = ModelServer::start(Api::Gemini, crate::harness::rm_rf(&victim));
    let run = run_guarded(&s, &cli, &model);
    assert!(
        victim.join("keep").exists(),
        "rm -rf ran with the server down"
    );
    assert!(
        run.stderr.contains("policy server could not be reached"),
        "{}",
        run.show()
    );
    assert!(
        !model
            .requests()
            .iter()
            .any(|r| r.answer == Answer::ToolCall),
        "{}",
        model.summary()
    );
}
