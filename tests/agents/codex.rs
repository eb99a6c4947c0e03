//! Codex (`codex exec`) against the fake Responses API, two ways: `connect codex` writes its
//! `notify` program (one event per turn), and the lifecycle hooks of `$CODEX_HOME/hooks.json`
//! written by hand as docs/agents.md shows (Codex runs them only when trusted:
//! `--dangerously-bypass-hook-trust`). Codex waits for each hook, so lifecycle events arrive in
//! the order it sent them.

use crate::harness::{
    ANSWER, COMMAND, COMMAND_OUTPUT, Cli, PROMPT, Raw, SEND_BIN, Server, Setup, Tail, cli,
    hooks_all_ran, sent_as_pinned, settle, tail_last_shows_the_same,
};
use crate::models::{Answer, Api, CALL_ID, ModelServer, Script};
use crate::table::{Becomes, Check, Expect, Order, Row, check, differs, event, row, say};
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const AGENT: &str = "codex";

/// The hook events of the pinned Codex (its hooks.json accepts these names).
const HOOK_EVENTS: [&str; 12] = [
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PermissionRequest",
    "PostToolUse",
    "PreCompact",
    "PostCompact",
    "SubagentStart",
    "SubagentStop",
    "Stop",
    "Interrupt",
    "SessionEnd",
];

// =============================================================================================
// CODEX: WHAT EACH OF ITS EVENTS BECOMES (its hooks, and notify's `agent-turn-complete`)
//
// `mapped` is the turn mapping (docs/agents.md): a prompt opens a turn (`agent_start`), `Stop`
// closes it (`turn_complete`, then `agent_end`), a session's start and end are topics of their own.
// `differs(…, today)` marks where this build still maps otherwise; only that is tolerated.
// =============================================================================================
fn table() -> Vec<Row> {
    let topic = |e: &str| Becomes::Topic(format!("prx.agent.{AGENT}.{e}"));
    let turn_end = |checks: Vec<Check>| event("turn_complete", &[], checks);
    let mut rows = vec![
        // This build: a session's start is `agent_start`.
        differs(
            "SessionStart",
            vec![topic("session_start")],
            vec![event("agent_start", &[], vec![])],
        ),
        // This build: the prompt is a topic.
        differs(
            "UserPromptSubmit",
            vec![event(
                "agent_start",
                &[],
                vec![Check::FromAgent("/prompt", "/prompt")],
            )],
            vec![topic("UserPromptSubmit")],
        ),
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
        // This build: `turn_complete` alone.
        differs(
            "Stop",
            // Codex does not say how the turn ended: no `success`.
            vec![
                turn_end(vec![Check::Is("/last_assistant_message", json!(ANSWER))]),
                event("agent_end", &[], vec![Check::Absent("/success")]),
            ],
            vec![turn_end(vec![Check::Is(
                "/last_assistant_message",
                json!(ANSWER),
            )])],
        ),
        // This build: a topic named after the event.
        differs(
            "SessionEnd",
            vec![topic("session_end")],
            vec![topic("SessionEnd")],
        ),
        // This build: a topic.
        differs(
            "Interrupt",
            vec![event(
                "agent_end",
                &[],
                vec![Check::Is("/success", json!(false))],
            )],
            vec![topic("Interrupt")],
        ),
        // notify's one event: no `agent_end`, as notify has no event that opens a turn.
        row(
            "agent-turn-complete",
            vec![turn_end(vec![
                Check::Session("/thread-id"),
                Check::Is("/last-assistant-message", json!(ANSWER)),
            ])],
        ),
    ];
    // Every other event: the agent's whole object on a topic named after it.
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
    let reqs = model.requests();
    let call = reqs
        .iter()
        .position(|r| r.answer == Answer::ToolCall)
        .unwrap_or_else(|| panic!("no tool call asked:\n{}", model.summary()));
    let answered = reqs[call + 1..]
        .iter()
        .find(|r| r.answer == Answer::Text)
        .unwrap_or_else(|| panic!("no answer after the tool call:\n{}", model.summary()));
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
    let mut hooks = serde_json::Map::new();
    for e in HOOK_EVENTS {
        hooks.insert(
            e.into(),
            json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]}]),
        );
    }
    let path = s.codex_home().join("hooks.json");
    let text = serde_json::to_string_pretty(&json!({ "hooks": hooks })).unwrap();
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// `connect codex` next to the user's config and hooks, one session, `--remove`. Where
/// `connect` writes Codex's hooks (`hooks.json`, trusted for the session with
/// `--dangerously-bypass-hook-trust`), every event the user's hook saw arrives as the table
/// says; where it writes `notify` (untrusted: the user's hooks do not run), the turn arrives
/// once. `--remove` leaves both files as they were.
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
    let mut tail = Tail::start(&s.ws, 4096);
    s.connect(AGENT, &[]);
    let writes_hooks = std::fs::read_to_string(&hooks)
        .unwrap()
        .contains("--from codex");

    let mut notes = Vec::new();
    let (raws, session) = if writes_hooks {
        hooked_session(&s, &cli, &model)
    } else {
        notes.push("this build's `connect codex` writes notify, not hooks.json (codex_hooks_* test the hooks by hand)".to_string());
        let session = session(&s, &cli, &model, false);
        assert!(s.raws().is_empty(), "untrusted hooks ran");
        // notify's object goes to our program alone: only its name is known beforehand.
        let raws = vec![Raw {
            name: "agent-turn-complete".into(),
            at_ns: 0,
            object: None,
        }];
        (raws, session)
    };
    settle(&s, &mut tail, &raws);
    let table = table();
    let expect = Expect {
        agent: AGENT,
        table: &table,
        session: &session,
        order: Order::Exact,
    };
    notes.extend(check(&expect, &raws, &s.records(), &tail.messages()));
    tail_last_shows_the_same(&s.ws, &tail.lines);
    drop(tail);
    hooks_all_ran(&server.stop());

    s.connect(AGENT, &["--remove"]);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), config_before);
    assert_eq!(std::fs::read_to_string(&hooks).unwrap(), hooks_before);
    say(&notes);
}

/// `$CODEX_HOME/hooks.json` as docs/agents.md § OpenAI Codex CLI shows: `send --from codex` on
/// each hook event, by hand (and no notify, or each turn arrives twice); beside it, the user's
/// own hook.
fn hooks_by_hand(s: &Setup) {
    let ours = format!(
        "{SEND_BIN} --from codex --workspace {}",
        s.ws.to_str().unwrap()
    );
    let mut hooks = serde_json::Map::new();
    for e in HOOK_EVENTS {
        hooks.insert(
            e.into(),
            json!([{"hooks": [{"type": "command", "command": s.users_own_hook()}]},
                   {"hooks": [{"type": "command", "command": ours}]}]),
        );
    }
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
    for r in &raws {
        assert_eq!(
            r.object.as_ref().unwrap()["session_id"],
            session.as_str(),
            "{r:?}"
        );
    }
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
    let mut tail = Tail::start(&s.ws, 4096);

    let (raws, session) = hooked_session(&s, &cli, &model);
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
    say(&notes);
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
    // Codex waits for each hook: every event is in the spool when it exits; no hook ran.
    let mut sent: Vec<String> = raws.iter().map(|r| r.name.clone()).collect();
    sent.sort();
    assert_eq!(
        s.spooled(0),
        sent,
        "one spool entry per event codex {} sent",
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
    say(&notes);
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
    let reqs = model.requests();
    let call = reqs
        .iter()
        .position(|r| r.answer == Answer::ToolCall)
        .unwrap_or_else(|| panic!("no tool call asked:\n{}", model.summary()));
    let answered = reqs[call + 1..]
        .iter()
        .find(|r| r.answer == Answer::Text)
        .unwrap_or_else(|| panic!("no answer after the tool call:\n{}", model.summary()));
    answered.body["input"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["type"] == "function_call_output"))
        .unwrap_or_else(|| panic!("no function_call_output in {}", answered.body))
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
        !model
            .requests()
            .iter()
            .any(|r| r.answer == Answer::ToolCall),
        "{}",
        model.summary()
    );
}
