//! Codex (`codex exec`) against the fake Responses API, its hooks in `$CODEX_HOME/hooks.json`
//! two ways: written by `connect codex`, and by hand as docs/agents.md shows (Codex runs them
//! only when trusted: `--dangerously-bypass-hook-trust`). Codex waits for each hook, so
//! lifecycle events arrive in the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, SEND_BIN, Server, Setup, Tail, cli,
    documented, of_one_session, on_every_event, sent_as_pinned, settle, tool_round_trip,
};
use crate::models::{Api, CALL_ID, ModelServer, Script};
use crate::table::{
    Check, Expect, Order, Row, and_topics, check_settled, event, prompt_opens_the_turn, row, topic,
};
use prx_hooks::agents::Agent;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "codex";

// =============================================================================================
// CODEX: WHAT EACH OF ITS HOOK EVENTS BECOMES
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
                    Check::Is("/tool_use_id", json!(CALL_ID)),
                ],
            )],
        ),
        // Codex does not say whether the command succeeded: no `success`.
        row(
            "PostToolUse",
            vec![event(
                "tool_call",
                &["tool_name", "tool_response"],
                vec![
                    Check::Is("/tool", json!("Bash")),
                    Check::Absent("/success"),
                    Check::Contains("/output", COMMAND_OUTPUT),
                    Check::Is("/tool_use_id", json!(CALL_ID)),
                ],
            )],
        ),
        row(
            "Stop",
            // Codex does not say how the turn ended: no `success`.
            vec![
                event(
                    "turn_complete",
                    &[],
                    vec![Check::Is("/last_assistant_message", json!(ANSWER))],
                ),
                event("agent_end", &[], vec![Check::Absent("/success")]),
            ],
        ),
        row("SessionEnd", vec![topic("session_end")]),
        row(
            "Interrupt",
            vec![event(
                "agent_end",
                &[],
                vec![Check::Is("/success", json!(false))],
            )],
        ),
    ];
    and_topics(AGENT, rows, &documented(Agent::Codex))
}
// =============================================================================================

/// What one session of the pinned version sends (tests/agents/versions).
const SENT: &[(&str, &[&str])] = &[
    (
        "SessionStart",
        &[
            "cwd",
            "hook_event_name",
            "model",
            "permission_mode",
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
            "model",
            "permission_mode",
            "prompt",
            "session_id",
            "transcript_path",
            "turn_id",
        ],
    ),
    (
        "PreToolUse",
        &[
            "cwd",
            "hook_event_name",
            "model",
            "permission_mode",
            "session_id",
            "tool_input",
            "tool_name",
            "tool_use_id",
            "transcript_path",
            "turn_id",
        ],
    ),
    (
        "PostToolUse",
        &[
            "cwd",
            "hook_event_name",
            "model",
            "permission_mode",
            "session_id",
            "tool_input",
            "tool_name",
            "tool_response",
            "tool_use_id",
            "transcript_path",
            "turn_id",
        ],
    ),
    (
        "Stop",
        &[
            "cwd",
            "hook_event_name",
            "last_assistant_message",
            "model",
            "permission_mode",
            "session_id",
            "stop_hook_active",
            "transcript_path",
            "turn_id",
        ],
    ),
    (
        "SessionEnd",
        &[
            "cwd",
            "hook_event_name",
            "reason",
            "session_id",
            "transcript_path",
        ],
    ),
];

/// `$CODEX_HOME/config.toml`: the fake model as the provider, as a user writes it. Returns its
/// path and text.
fn users_config(s: &Setup, model: &ModelServer) -> (PathBuf, String) {
    let text = format!(
        "# The model for these sessions.\nmodel = \"gpt-fake\"\nmodel_provider = \"fake\"\n\n[model_providers.fake]\nname = \"fake\"\nbase_url = \"{}/v1\"\nwire_api = \"responses\"\nenv_key = \"PRX_FAKE_OPENAI_KEY\"\n",
        model.url()
    );
    let path = s.codex_home().join("config.toml");
    std::fs::create_dir_all(s.codex_home()).unwrap();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// One `codex exec` session; the session id it printed.
fn session(s: &Setup, cli: &Cli, model: &ModelServer, trust_hooks: bool) -> String {
    let mut cmd = Command::new(&cli.program);
    cmd.args(["exec", "--skip-git-repo-check"])
        .arg("--dangerously-bypass-approvals-and-sandbox");
    if trust_hooks {
        cmd.arg("--dangerously-bypass-hook-trust");
    }
    cmd.arg(PROMPT)
        .env("CODEX_HOME", s.codex_home())
        .env("PRX_FAKE_OPENAI_KEY", "sk-fake");
    let run = s.run_agent("codex", cmd, Duration::from_secs(180));
    assert!(
        run.stdout.contains(ANSWER),
        "{}\nmodel:\n{}",
        run.show(),
        model.summary()
    );
    let answered = tool_round_trip(model);
    let output = answered.body["input"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["type"] == "function_call_output"))
        .unwrap_or_else(|| panic!("no function_call_output in {}", answered.body));
    assert_eq!(output["call_id"], CALL_ID);
    assert!(output.to_string().contains(COMMAND_OUTPUT), "{output}");
    assert_eq!(
        answered.header("authorization"),
        Some("Bearer sk-fake"),
        "{}",
        answered.path
    );
    run.stderr
        .lines()
        .find_map(|l| l.strip_prefix("session id: "))
        .unwrap_or_else(|| panic!("codex named no session: {}", run.show()))
        .trim()
        .to_string()
}

/// The user's own hook on every event, in `$CODEX_HOME/hooks.json`. Returns its path and bytes.
fn users_hooks(s: &Setup) -> (PathBuf, String) {
    let own = json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]}]);
    let hooks = on_every_event(Agent::Codex.events().iter().copied(), &own);
    let path = s.codex_home().join("hooks.json");
    let text = serde_json::to_string_pretty(&json!({ "hooks": hooks })).unwrap();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// `connect codex` next to the user's config and hooks (trusted for the session with
/// `--dangerously-bypass-hook-trust`), one session: every event the user's hook saw arrives as
/// the table says. `--remove` leaves both files as they were.
#[test]
fn codex_connect_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@openai/codex") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiResponses, Script::shell(COMMAND, ANSWER));
    let (config, config_before) = users_config(&s, &model);
    let (hooks, hooks_before) = users_hooks(&s);
    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);
    let written = std::fs::read_to_string(&hooks).unwrap();
    assert!(written.contains("--from codex"), "{written}");

    let (raws, session) = hooked_session(&s, &cli, &model);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), config_before);
    assert_eq!(std::fs::read_to_string(&hooks).unwrap(), hooks_before);
}

/// What a session must have delivered: Codex waits for each hook, so in order.
fn expect<'a>(table: &'a [Row], session: &'a str) -> Expect<'a> {
    Expect {
        agent: AGENT,
        table,
        session,
        order: Order::Exact,
    }
}

/// `$CODEX_HOME/hooks.json` as docs/agents.md § OpenAI Codex CLI shows: `send --from codex` on
/// each hook event, by hand (and no notify, or each turn arrives twice); beside it, the user's
/// own hook.
fn hooks_by_hand(s: &Setup) {
    let ours = format!(
        "{SEND_BIN} --from codex --workspace {}",
        s.ws.to_str().unwrap()
    );
    let hooks = on_every_event(
        Agent::Codex.events().iter().copied(),
        &json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]},
                {"hooks": [{"type": "command", "command": ours}]}]),
    );
    std::fs::write(
        s.codex_home().join("hooks.json"),
        json!({ "hooks": hooks }).to_string(),
    )
    .unwrap();
}

/// One `codex exec` session with its hooks trusted: the events it sent, and its session's id.
fn hooked_session(s: &Setup, cli: &Cli, model: &ModelServer) -> (Vec<Raw>, String) {
    let session = session(s, cli, model, true);
    let raws = s.raws();
    of_one_session(&raws, &session);
    sent_as_pinned(cli, &raws, SENT);
    (raws, session)
}

#[test]
fn codex_hooks_one_tool_call_arrives_as_its_table_says_once_and_in_order() {
    let Some(cli) = cli("@openai/codex") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiResponses, Script::shell(COMMAND, ANSWER));
    users_config(&s, &model);
    hooks_by_hand(&s);
    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);

    let (raws, session) = hooked_session(&s, &cli, &model);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));
}

/// `run --listen --transcripts --otlp` with the hooks by hand: at the turn's `Stop`, the
/// server reads the rollout Codex named (`transcript_path`) for the turn's model calls, which
/// reach the receiver as `chat` spans inside the turn with the fake model's usage (12 in, 7
/// out per response); the session is one trace and no span ends unfinished.
#[test]
fn codex_turns_model_calls_come_from_its_rollout_as_chat_spans_with_the_fake_models_usage() {
    let Some(cli) = cli("@openai/codex") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiResponses, Script::shell(COMMAND, ANSWER));
    users_config(&s, &model);
    hooks_by_hand(&s);
    let receiver = crate::receiver::Receiver::start();
    let otlp = receiver.url();
    let server = Server::start_with(&s.ws, &["--otlp", &otlp, "--transcripts"]);
    let (raws, _session) = hooked_session(&s, &cli, &model);
    let stop = raws
        .iter()
        .find(|r| r.name == "Stop")
        .unwrap_or_else(|| panic!("codex sent no Stop"));
    let stop = stop.object.clone().unwrap_or_default();
    let rollout = stop["transcript_path"].as_str().unwrap_or_default();
    assert!(rollout.ends_with(".jsonl"), "Stop named no rollout: {stop}");
    // What the rollout holds of tokens: per-response usage records, or running token counts.
    let text = std::fs::read_to_string(rollout).unwrap();
    let records = |kind: &str| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["type"] == kind || v["payload"]["type"] == kind)
            .count()
    };
    let (usage_records, token_counts) = (records("token_usage_record"), records("token_count"));
    println!("rollout: {usage_records} token_usage_record, {token_counts} token_count");
    assert!(
        usage_records + token_counts > 0,
        "no tokens in the rollout:\n{text}"
    );
    let mut tail = Tail::start(&s.ws, 4096);
    settle(&s, &mut tail, &raws);
    drop(tail);
    let read = api_stats(&s)["transcripts"].clone();
    server.stop();
    let spans = receiver.spans();
    let tree = crate::receiver::render_tree(&spans);
    println!("{tree}\ntranscripts: {read}");
    for sp in &spans {
        let message = sp
            .status
            .as_ref()
            .map(|st| st.message.as_str())
            .unwrap_or("");
        assert!(
            !message.contains("unfinished"),
            "{} ended unfinished:\n{tree}",
            sp.name
        );
    }
    let agents: Vec<_> = spans
        .iter()
        .filter(|sp| sp.name == "invoke_agent codex")
        .collect();
    assert_eq!(agents.len(), 1, "one turn:\n{tree}");
    let turn = agents[0];
    assert!(
        spans.iter().all(|sp| sp.trace_id == turn.trace_id),
        "one trace:\n{tree}"
    );
    // Two responses: the tool call, then the answer.
    let chats: Vec<_> = spans
        .iter()
        .filter(|sp| sp.name == "chat gpt-fake")
        .collect();
    assert_eq!(chats.len(), 2, "two model calls:\n{tree}\n{read}");
    for chat in &chats {
        let attr = |k| crate::receiver::attr(chat, k);
        assert_eq!(chat.parent_span_id, turn.span_id, "{tree}");
        assert_eq!(attr("gen_ai.usage.input_tokens").as_deref(), Some("12"));
        assert_eq!(attr("gen_ai.usage.output_tokens").as_deref(), Some("7"));
        assert_eq!(attr("gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(attr("prx.extra.source").as_deref(), Some("transcript"));
        assert!(
            chat.start_time_unix_nano <= chat.end_time_unix_nano,
            "{tree}"
        );
        assert!(
            chat.start_time_unix_nano >= turn.start_time_unix_nano,
            "{tree}"
        );
        assert!(chat.end_time_unix_nano <= turn.end_time_unix_nano, "{tree}");
    }
    assert_eq!(read["calls"], 2, "{read}");
}

/// `GET /api/stats` of the workspace's server.
fn api_stats(s: &Setup) -> serde_json::Value {
    let dir = s.ws.join(".prx-hooks");
    let address = std::fs::read_to_string(dir.join("address")).unwrap();
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    let mut resp = ureq::get(format!("{}/api/stats", address.trim()))
        .header("authorization", format!("Bearer {}", token.trim()))
        .call()
        .unwrap();
    serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
}

#[test]
fn codex_hooks_with_the_server_down_spool_and_the_next_run_replays_each_event_once() {
    let Some(cli) = cli("@openai/codex") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiResponses, Script::shell(COMMAND, ANSWER));
    users_config(&s, &model);
    hooks_by_hand(&s);
    // A workspace whose server ran and has stopped.
    Server::start(&s.ws).stop();

    let (raws, session) = hooked_session(&s, &cli, &model);
    // Codex waits for each hook: every event is in the spool when it exits.
    s.spooled_each(&cli, &raws);

    let server = Server::start(&s.ws);
    let tail = Tail::start(&s.ws, 4096);
    let table = table();
    check_settled(&s, server, tail, &raws, &expect(&table, &session));
    assert!(s.spooled(0).is_empty(), "the replay emptied the spool");
}

/// Codex runs the hooks of `hooks.json` only once they are trusted (`/hooks` in its interface,
/// or `--dangerously-bypass-hook-trust`): untrusted, not one runs, ours nor the user's.
#[test]
fn codex_hooks_not_trusted_never_run() {
    let Some(cli) = cli("@openai/codex") else {
        return;
    };
    let s = Setup::new();
    let model = ModelServer::start(Api::OpenAiResponses, Script::shell(COMMAND, ANSWER));
    users_config(&s, &model);
    hooks_by_hand(&s);
    let server = Server::start(&s.ws);

    session(&s, &cli, &model, false);
    assert!(s.raws().is_empty(), "untrusted hooks ran: {:?}", s.raws());
    let report = server.stop();
    assert_eq!(report["stats"]["emitted"], 0, "{report}");
    assert!(s.records().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Policies (docs/policies.md § Doors): `connect codex` with a workspace that holds the
// no-rm-rf rule; the fake model asks to run `rm -rf <victim>`.

/// One `codex exec` session with our hooks trusted.
fn run_guarded(s: &Setup, cli: &Cli) -> crate::harness::AgentRun {
    let mut cmd = Command::new(&cli.program);
    cmd.args(["exec", "--skip-git-repo-check"])
        .arg("--dangerously-bypass-approvals-and-sandbox")
        .arg("--dangerously-bypass-hook-trust")
        .arg(PROMPT)
        .env("CODEX_HOME", s.codex_home())
        .env("PRX_FAKE_OPENAI_KEY", "sk-fake");
    s.run_agent("codex", cmd, Duration::from_secs(180))
}

/// [`run_guarded`], the model answered after its tool call: what the tool's result told it.
fn guarded_session(s: &Setup, cli: &Cli, model: &ModelServer) -> String {
    let run = run_guarded(s, cli);
    assert!(
        run.stdout.contains(ANSWER),
        "{}\nmodel:\n{}",
        run.show(),
        model.summary()
    );
    let answered = crate::harness::request_after_tool_call(model);
    answered["input"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["type"] == "function_call_output"))
        .unwrap_or_else(|| panic!("no function_call_output in {answered}"))
        .to_string()
}

#[test]
fn codex_policies_deny_rm_rf_the_tool_does_not_run_and_the_model_is_told_why() {
    let Some(cli) = cli("@openai/codex") else {
        return;
    };
    let (s, victim) = crate::harness::guarded();
    let model = ModelServer::start(Api::OpenAiResponses, crate::harness::rm_rf(&victim));
    users_config(&s, &model);
    let server = Server::start(&s.ws);
    s.connect(AGENT, &[]);
    let result = guarded_session(&s, &cli, &model);
    assert!(victim.join("keep").exists(), "the denied rm -rf ran");
    assert!(
        result.contains("rm -rf is not allowed in this workspace"),
        "the model is told the reason: {result}"
    );
    // An allowed command runs.
    let model = ModelServer::start(Api::OpenAiResponses, Script::shell(COMMAND, ANSWER));
    users_config(&s, &model);
    let result = guarded_session(&s, &cli, &model);
    assert!(result.contains(COMMAND_OUTPUT), "{result}");
    server.stop();

    // The server down, --on-unreachable deny: every decision point denies, the prompt first.
    s.connect(AGENT, &["--on-unreachable", "deny"]);
    let model = ModelServer::start(Api::OpenAiResponses, crate::harness::rm_rf(&victim));
    users_config(&s, &model);
    let run = run_guarded(&s, &cli);
    assert!(
        victim.join("keep").exists(),
        "rm -rf ran with the server down"
    );
    assert!(
        run.stderr.contains("UserPromptSubmit Blocked"),
        "{}",
        run.show()
    );
    assert!(
        !crate::harness::asked_a_tool_call(&model),
        "{}",
        model.summary()
    );
}
