//! Gemini CLI (`gemini -p`) against the fake Gemini API: `connect gemini-cli` writes its project
//! settings next to the user's own hooks (the folder trusted in `~/.gemini/trustedFolders.json`,
//! API-key auth in `~/.gemini/settings.json`). Gemini CLI waits for each hook, so lifecycle
//! events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, cli, documented,
    on_every_event, one_session, tool_round_trip,
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

const AGENT: &str = "gemini-cli";

// =============================================================================================
// GEMINI CLI: WHAT EACH OF ITS EVENTS BECOMES
//
// As docs/agents.md maps them: a prompt opens a turn (`BeforeAgent` → `agent_start`),
// `AfterAgent` closes it (`turn_complete`, then `agent_end`), each model call is an
// `llm_request` and its (last) chunk an `llm_response`, a session's start and end are topics of
// their own.
// =============================================================================================
fn table() -> Vec<Row> {
    let topic = |e: &str| topic(AGENT, e);
    let rows = vec![
        row("SessionStart", vec![topic("session_start")]),
        row("BeforeAgent", prompt_opens_the_turn()),
        row(
            "BeforeModel",
            vec![event(
                "llm_request",
                &["llm_request"],
                vec![Check::FromAgent("/model", "/llm_request/model")],
            )],
        ),
        row(
            "AfterModel",
            vec![event(
                "llm_response",
                &["llm_request", "llm_response"],
                vec![Check::FromAgent("/model", "/llm_request/model")],
            )],
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
        row(
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
        ),
        row("SessionEnd", vec![topic("session_end")]),
    ];
    and_topics(AGENT, rows, &documented(Agent::GeminiCli))
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
    let own = json!([{"hooks": [{"name": "users-own", "type": "command", "command": s.users_own_hook()}]}]);
    let hooks = on_every_event(Agent::GeminiCli.events().iter().copied(), &own);
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
    let answered = tool_round_trip(model);
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

    one_session(s, cli, SENT)
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
    let tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);

    let (raws, session) = session(&s, &cli, &model);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
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
    // Gemini CLI waits for each hook: every event is in the spool when it exits.
    s.spooled_each(&cli, &raws);

    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));
    assert!(s.spooled(0).is_empty(), "the replay emptied the spool");

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
}

/// What a session must have delivered: Gemini CLI waits for each hook, so in order.
fn expect<'a>(table: &'a [Row], session: &'a str) -> Expect<'a> {
    Expect {
        agent: AGENT,
        table,
        session,
        order: Order::Exact,
    }
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
    let answered = crate::harness::request_after_tool_call(model);
    answered["contents"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .flat_map(|c| c["parts"].as_array().into_iter().flatten())
                .find(|p| p.get("functionResponse").is_some())
        })
        .unwrap_or_else(|| panic!("no functionResponse in {answered}"))
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
        !crate::harness::asked_a_tool_call(&model),
        "{}",
        model.summary()
    );
}
