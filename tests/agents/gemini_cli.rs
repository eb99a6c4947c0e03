//! Gemini CLI (`gemini -p`) against the fake Gemini API: `connect gemini-cli` writes its project
//! settings next to the user's own hooks (the folder trusted in `~/.gemini/trustedFolders.json`,
//! API-key auth in `~/.gemini/settings.json`). Gemini CLI waits for each hook, so lifecycle
//! events arrive in the order it sent them.

use crate::harness::{
    ANSWER, Becomes, COMMAND, COMMAND_OUTPUT, Check, Expect, Order, PROMPT, Row, Server, Setup,
    Tail, check, cli, differs, event, hooks_all_ran, row, say, settle, tail_last_shows_the_same,
};
use crate::models::{Answer, Api, ModelServer, Script};
use prx_hooks::agents::Agent;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "gemini-cli";

// =============================================================================================
// GEMINI CLI: WHAT EACH OF ITS EVENTS BECOMES
//
// `mapped` is the turn mapping (docs/agents.md): a prompt opens a turn (`BeforeAgent` →
// `agent_start`), `AfterAgent` closes it (`agent_end` + `turn_complete`), each model call is an
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
                    Check::Is("/success", json!(true)),
                    Check::Contains("/output", COMMAND_OUTPUT),
                ],
            )],
        ),
        // This build: `turn_complete` alone.
        differs(
            "AfterAgent",
            vec![
                event("agent_end", &[], vec![Check::Is("/success", json!(true))]),
                event(
                    "turn_complete",
                    &[],
                    vec![Check::Is("/prompt_response", json!(ANSWER))],
                ),
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

#[test]
fn gemini_cli_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@google/gemini-cli") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::Gemini, Script::shell(COMMAND, ANSWER));
    // The user's side: API-key auth, the project trusted, their own hook on every event.
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

    let server = Server::start(&s.ws);
    let mut tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);

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
    // The model: a tool call, then (with the command's output) the answer.
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
    let session = raws[0].object.as_ref().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    for r in &raws {
        assert_eq!(r.object.as_ref().unwrap()["session_id"], session.as_str());
    }
    for want in [
        "SessionStart",
        "BeforeAgent",
        "BeforeModel",
        "BeforeTool",
        "AfterTool",
        "AfterAgent",
    ] {
        assert!(
            raws.iter().any(|r| r.name == want),
            "gemini {} never sent {want}",
            cli.version
        );
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
    let report = server.stop();
    hooks_all_ran(&report);

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
    say(&notes);
}
