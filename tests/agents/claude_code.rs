//! Claude Code (`claude -p`) against the fake Messages API: `connect claude-code` writes its
//! project settings next to the user's own hooks, Claude Code runs our hooks in the background
//! (`async`), and every event arrives as the table says, once. With the server stopped the
//! events wait in the spool, silently, and the next `run` replays each once.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, Server, Setup, Tail, cli, documented,
    hooks_all_ran, of_one_session, on_every_event, sent_as_pinned, settle, tool_round_trip,
};
use crate::models::{Api, ModelServer, Script};
use crate::table::{
    Check, Expect, Order, Row, and_topics, check_settled, event, prompt_opens_the_turn, row, topic,
};
use prx_hooks::agents::Agent;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "claude-code";

// =============================================================================================
// CLAUDE CODE: WHAT EACH OF ITS EVENTS BECOMES
//
// As docs/agents.md maps them: a prompt opens a turn (`agent_start`), `Stop` closes it
// (`turn_complete`, then `agent_end`), a session's start and end are topics of their own.
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
                    Check::Is("/tool", json!("Bash")),
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
                    Check::Is("/tool", json!("Bash")),
                    Check::Is("/success", json!(true)),
                    Check::Contains("/output", COMMAND_OUTPUT),
                    Check::Is("/tool_input/command", json!(COMMAND)),
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
        row(
            "StopFailure",
            vec![
                event(
                    "error",
                    &["error"],
                    vec![Check::Is("/component", json!("api"))],
                ),
                event("agent_end", &[], vec![Check::Is("/success", json!(false))]),
            ],
        ),
        row("SessionEnd", vec![topic("session_end")]),
    ];
    and_topics(AGENT, rows, &documented(Agent::ClaudeCode))
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
            "transcript_path",
        ],
    ),
    (
        "PreToolUse",
        &[
            "cwd",
            "effort",
            "hook_event_name",
            "permission_mode",
            "prompt_id",
            "session_id",
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
            "effort",
            "hook_event_name",
            "permission_mode",
            "prompt_id",
            "session_id",
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
            "effort",
            "hook_event_name",
            "permission_mode",
            "prompt_id",
            "session_id",
            "tool_calls",
            "transcript_path",
        ],
    ),
    (
        "Stop",
        &[
            "background_tasks",
            "cwd",
            "effort",
            "hook_event_name",
            "last_assistant_message",
            "permission_mode",
            "prompt_id",
            "session_crons",
            "session_id",
            "stop_hook_active",
            "transcript_path",
        ],
    ),
    (
        "SessionEnd",
        &[
            "cwd",
            "hook_event_name",
            "prompt_id",
            "reason",
            "session_id",
            "transcript_path",
        ],
    ),
];

/// The fake model's pause before each answer, and the least time apart two of Claude Code's
/// events must be sent for their order to be checked (its hooks run in the background, so
/// events sent together may arrive in either order).
const PAUSE: Duration = Duration::from_millis(1500);
const APART: Duration = Duration::from_millis(1000);

/// The project's `.claude/settings.json`: the user's own hook (recording what Claude Code sends)
/// on every event `connect` writes. Returns its path and bytes.
fn users_settings(s: &Setup) -> (PathBuf, String) {
    let own = json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]}]);
    let hooks = on_every_event(Agent::ClaudeCode.events().iter().copied(), &own);
    let text =
        serde_json::to_string_pretty(&json!({"model": "claude-fake", "hooks": hooks})).unwrap();
    let path = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

fn script() -> Script {
    Script {
        pause: PAUSE,
        ..Script::shell(COMMAND, ANSWER)
    }
}

/// One `claude -p` session; its result (`--output-format json`).
fn session(s: &Setup, cli: &Cli, model: &ModelServer) -> Value {
    session_with(s, cli, model, &[])
}

/// [`session`] with more environment for Claude Code (the token its `http` hooks send).
fn session_with(s: &Setup, cli: &Cli, model: &ModelServer, env: &[(&str, &str)]) -> Value {
    let (result, run) = claude(s, cli, model, env);
    assert_eq!(
        (result["is_error"].as_bool(), result["result"].as_str()),
        (Some(false), Some(ANSWER)),
        "{}\nmodel:\n{}",
        run.show(),
        model.summary()
    );
    result
}

/// One `claude -p` session, whatever its result.
fn claude(
    s: &Setup,
    cli: &Cli,
    model: &ModelServer,
    env: &[(&str, &str)],
) -> (Value, crate::harness::AgentRun) {
    let mut cmd = Command::new(&cli.program);
    cmd.envs(env.iter().copied());
    cmd.args(["-p", PROMPT, "--output-format", "json"])
        .arg("--dangerously-skip-permissions")
        .env("ANTHROPIC_BASE_URL", model.url())
        .env("ANTHROPIC_API_KEY", "sk-ant-fake")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1");
    if nix::unistd::geteuid().is_root() {
        // Claude Code refuses --dangerously-skip-permissions as root outside a sandbox.
        cmd.env("IS_SANDBOX", "1");
    }
    let run = s.run_agent("claude", cmd, Duration::from_secs(180));
    let result: Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("claude's result: {e}: {}", run.show()));
    (result, run)
}

/// The model was asked twice in the session's turn: the tool call, then (with its result) the
/// answer.
fn model_saw_the_tool_result(model: &ModelServer) {
    let result = tool_round_trip(model);
    let last = result.body["messages"].as_array().unwrap().last().unwrap();
    let block = last["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_result"))
        .unwrap_or_else(|| panic!("no tool_result in {last}"));
    assert_eq!(block["tool_use_id"], crate::models::TOOL_USE_ID);
    assert!(block.to_string().contains(COMMAND_OUTPUT), "{block}");
    for r in &model.requests() {
        assert_eq!(r.header("x-api-key"), Some("sk-ant-fake"), "{}", r.path);
    }
}

/// The session's id: what Claude Code said, and what every event carried.
fn session_id(result: &Value, raws: &[Raw]) -> String {
    let id = result["session_id"].as_str().unwrap().to_string();
    of_one_session(raws, &id);
    id
}

#[test]
fn claude_code_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@anthropic-ai/claude-code") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::Anthropic, script());
    let (settings, before) = users_settings(&s);
    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);

    let result = session(&s, &cli, &model);
    let raws = s.raws();
    sent_as_pinned(&cli, &raws, SENT);
    let session = session_id(&result, &raws);
    model_saw_the_tool_result(&model);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
}

#[test]
fn claude_code_with_the_server_down_spools_silently_and_the_next_run_replays_each_event_once() {
    let Some(cli) = cli("@anthropic-ai/claude-code") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::Anthropic, script());
    let (settings, before) = users_settings(&s);
    // A workspace whose server ran and has stopped.
    Server::start(&s.ws).stop();
    s.connect(AGENT, &[]);

    let result = session(&s, &cli, &model);
    let raws = s.raws();
    let session = session_id(&result, &raws);
    model_saw_the_tool_result(&model);
    s.spooled_each(&cli, &raws);

    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));
    assert!(s.spooled(0).is_empty(), "the replay emptied the spool");
    let ran = s.records().len();

    // The run after that has nothing to replay: no hook runs again.
    let server = Server::start(&s.ws);
    let mut tail = Tail::start(&s.ws, 4096);
    std::thread::sleep(Duration::from_secs(1));
    tail.poll();
    assert!(tail.lines.is_empty(), "{:?}", tail.lines);
    drop(tail);
    server.stop();
    assert_eq!(s.records().len(), ran);

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before);
}

/// What a session must have delivered: Claude Code runs our hooks in the background, so in
/// order where it sent them [`APART`] apart.
fn expect<'a>(table: &'a [Row], session: &'a str) -> Expect<'a> {
    Expect {
        agent: AGENT,
        table,
        session,
        order: Order::Apart(APART),
    }
}

/// A Claude Code session through the default `connect`, exported to a real OTLP receiver:
/// every `invoke_agent` span the session makes ends (none as "unfinished", the error a span
/// gets when its turn never closed), and the session is one trace.
#[test]
fn claude_code_sessions_trace_closes_in_one_trace() {
    traced_session(&[]);
}

/// The same through `connect --http` (Claude Code's `http` hooks, a command on SessionStart).
#[test]
fn claude_code_sessions_trace_closes_in_one_trace_with_http_hooks() {
    traced_session(&["--http"]);
}

fn traced_session(connect: &[&str]) {
    let Some(cli) = cli("@anthropic-ai/claude-code") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::Anthropic, script());
    // The user's own hooks record what Claude Code sent (the raw payloads).
    let _ = users_settings(&s);
    let receiver = crate::receiver::Receiver::start();
    let otlp = receiver.url();
    let server = Server::start_with(&s.ws, &["--otlp", &otlp, "--transcripts"]);
    s.connect(AGENT, connect);
    let token = std::fs::read_to_string(s.ws.join(".prx-hooks/token")).unwrap();
    session_with(&s, &cli, &model, &[("PRX_HOOKS_TOKEN", token.trim())]);
    let raws = s.raws();
    assert!(raws.iter().any(|r| r.name == "Stop"), "claude sent no Stop");
    // Every event has reached the server (the entries for Stop are synchronous).
    let mut tail = Tail::start(&s.ws, 4096);
    settle(&s, &mut tail, &raws);
    drop(tail);
    hooks_all_ran(&server.stop());
    let spans = receiver.spans();
    let tree = crate::receiver::render_tree(&spans);
    let agents: Vec<_> = spans
        .iter()
        .filter(|sp| sp.name.starts_with("invoke_agent"))
        .collect();
    println!("{tree}");
    assert!(!agents.is_empty(), "no invoke_agent span:\n{tree}");
    for sp in &spans {
        let status = sp.status.as_ref();
        let message = status.map(|st| st.message.as_str()).unwrap_or("");
        assert!(
            !message.contains("unfinished"),
            "{} ended unfinished:\n{tree}",
            sp.name
        );
    }
    let traces: std::collections::HashSet<_> = agents.iter().map(|sp| &sp.trace_id).collect();
    assert_eq!(traces.len(), 1, "one session, one trace:\n{tree}");
    // The turn's two model calls, read from the transcript at the turn's end: chat spans in
    // the turn, at the transcript's times, with the fake model's usage (12 in, 7 out each).
    let chats: Vec<_> = spans
        .iter()
        .filter(|sp| sp.name == "chat claude-fake")
        .collect();
    assert_eq!(chats.len(), 2, "two model calls:\n{tree}");
    for chat in &chats {
        let attr = |k| crate::receiver::attr(chat, k);
        assert_eq!(chat.trace_id, agents[0].trace_id, "{tree}");
        assert_eq!(chat.parent_span_id, agents[0].span_id, "{tree}");
        assert_eq!(attr("gen_ai.usage.input_tokens").as_deref(), Some("12"));
        assert_eq!(attr("gen_ai.usage.output_tokens").as_deref(), Some("7"));
        assert_eq!(attr("gen_ai.provider.name").as_deref(), Some("anthropic"));
        assert!(
            chat.start_time_unix_nano < chat.end_time_unix_nano,
            "{tree}"
        );
        assert!(
            chat.start_time_unix_nano >= agents[0].start_time_unix_nano,
            "{tree}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Policies (docs/policies.md § Doors): the real Claude Code, `connect` with a workspace that
// holds the no-rm-rf rule, the fake model asking to run `rm -rf <victim>`.

/// What the tool result sent back to the model after its tool call says.
fn tool_result(model: &ModelServer) -> String {
    let next = crate::harness::request_after_tool_call(model);
    let last = next["messages"].as_array().unwrap().last().unwrap();
    last["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_result"))
        .unwrap_or_else(|| panic!("no tool_result in {last}"))
        .to_string()
}

#[test]
fn claude_code_policies_deny_rm_rf_the_tool_does_not_run_and_the_model_is_told_why() {
    let Some(cli) = cli("@anthropic-ai/claude-code") else {
        return;
    };
    let (s, victim) = crate::harness::guarded();
    let model = ModelServer::start(Api::Anthropic, crate::harness::rm_rf(&victim));
    let server = Server::start(&s.ws);
    // The workspace holds policies.json: connect writes the decision points synchronous.
    s.connect(AGENT, &[]);
    session(&s, &cli, &model);
    assert!(victim.join("keep").exists(), "the denied rm -rf ran");
    let result = tool_result(&model);
    assert!(
        result.contains("rm -rf is not allowed in this workspace"),
        "the model is told the reason: {result}"
    );
    server.stop();

    // An allowed command runs, its output goes back to the model.
    let model = ModelServer::start(Api::Anthropic, Script::shell(COMMAND, ANSWER));
    let server = Server::start(&s.ws);
    session(&s, &cli, &model);
    model_saw_the_tool_result(&model);
    server.stop();
}

#[test]
fn claude_code_policies_with_the_server_down_apply_the_fail_mode_connect_wrote() {
    let Some(cli) = cli("@anthropic-ai/claude-code") else {
        return;
    };
    let (s, victim) = crate::harness::guarded();
    // A workspace whose server ran and has stopped.
    Server::start(&s.ws).stop();
    s.connect(AGENT, &["--on-unreachable", "deny"]);
    let model = ModelServer::start(Api::Anthropic, crate::harness::rm_rf(&victim));
    // Every decision point denies, the prompt first: Claude Code says why and stops there.
    let (result, run) = claude(&s, &cli, &model, &[]);
    assert!(
        victim.join("keep").exists(),
        "rm -rf ran with the server down"
    );
    let said = result["result"].as_str().unwrap_or_default();
    assert!(
        said.contains("UserPromptSubmit") && said.contains("policy server could not be reached"),
        "{}",
        run.show()
    );
    assert!(
        !crate::harness::asked_a_tool_call(&model),
        "{}",
        model.summary()
    );
    // The denied prompt's event is spooled as any other.
    assert!(
        s.spooled(1).contains(&"UserPromptSubmit".to_string()),
        "{:?}",
        s.spooled(0)
    );

    // The default, none: the agent's own flow (here: it runs).
    s.connect(AGENT, &[]);
    let model = ModelServer::start(Api::Anthropic, crate::harness::rm_rf(&victim));
    session(&s, &cli, &model);
    assert!(!victim.exists(), "with no decision the command ran");
}
