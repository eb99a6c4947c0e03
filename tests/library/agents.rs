//! Every event each agent's hook documentation lists (`tests/fixtures/agents/<agent>/<event>.json`,
//! each citing its page) translated, and the result read back by the ingest's own parser:
//! the event or topic it maps to, its documented fields, its session, the extras kept.

use crate::fixtures::fixture;
use prx_hooks::EventKind;
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use prx_hooks::ndjson::{Input, ParseOptions, parse_input_with};
use serde_json::Value;

/// What each documented event maps to (docs/agents.md), line by line: a lifecycle event's
/// name, or `topic:SEGMENT` (`topic` alone: the event's own name).
fn expected(agent: Agent, event: &str) -> &'static [&'static str] {
    const TOOL_START: &[&str] = &["tool_call_start"];
    const TOOL: &[&str] = &["tool_call"];
    const START: &[&str] = &["agent_start"];
    const END: &[&str] = &["turn_complete", "agent_end"];
    const SESSION_START: &[&str] = &["topic:session_start"];
    const SESSION_END: &[&str] = &["topic:session_end"];
    const TOPIC: &[&str] = &["topic"];
    use Agent::*;
    match (agent, event) {
        (ClaudeCode | Codex | QwenCode | FactoryDroid, "PreToolUse") => TOOL_START,
        (ClaudeCode | Codex | QwenCode | FactoryDroid, "PostToolUse") => TOOL,
        (ClaudeCode | QwenCode, "PostToolUseFailure") => TOOL,
        (ClaudeCode | Codex | QwenCode | FactoryDroid, "UserPromptSubmit") => START,
        (ClaudeCode | Codex | QwenCode | FactoryDroid, "Stop") => END,
        (ClaudeCode | Codex | QwenCode | FactoryDroid, "SessionStart") => SESSION_START,
        (ClaudeCode | Codex | QwenCode | FactoryDroid, "SessionEnd") => SESSION_END,
        (ClaudeCode | QwenCode, "StopFailure") => &["error", "agent_end"],
        // The fixtures are inside a subagent (`agent_id`); Factory Droid's has none.
        (ClaudeCode | Codex | QwenCode, "SubagentStart") => START,
        (ClaudeCode | Codex | QwenCode, "SubagentStop") => END,
        (Codex, "Interrupt") => &["agent_end"],
        (GeminiCli, "SessionStart") => SESSION_START,
        (GeminiCli, "SessionEnd") => SESSION_END,
        (GeminiCli, "BeforeAgent") => START,
        (GeminiCli, "AfterAgent") => END,
        (GeminiCli, "BeforeModel") => &["llm_request"],
        (GeminiCli, "AfterModel") => &["llm_response"],
        (GeminiCli, "BeforeTool") => TOOL_START,
        (GeminiCli, "AfterTool") => TOOL,
        (Cursor, "sessionStart") => SESSION_START,
        (Cursor, "sessionEnd") => SESSION_END,
        (Cursor, "beforeSubmitPrompt" | "subagentStart") => START,
        (Cursor, "stop" | "subagentStop") => END,
        (Cursor, "afterAgentResponse") => &["llm_response"],
        (Cursor, "preToolUse") => TOOL_START,
        (Cursor, "postToolUse" | "postToolUseFailure") => TOOL,
        (CopilotCli, "sessionStart") => SESSION_START,
        (CopilotCli, "sessionEnd") => SESSION_END,
        (CopilotCli, "userPromptSubmitted") => START,
        (CopilotCli, "preToolUse") => TOOL_START,
        (CopilotCli, "postToolUse" | "postToolUseFailure") => TOOL,
        (CopilotCli, "agentStop") => END,
        (CopilotCli, "errorOccurred") => &["error"],
        (Cline, "TaskStart" | "TaskResume") => START,
        (Cline, "TaskCancel") => &["agent_end"],
        (Cline, "TaskComplete") => END,
        (Cline, "PreToolUse") => TOOL_START,
        (Cline, "PostToolUse") => TOOL,
        (Windsurf, "pre_user_prompt") => START,
        (Windsurf, "post_cascade_response") => END,
        (Windsurf, e) if e.starts_with("pre_") => TOOL_START,
        (Windsurf, e) if e != "post_setup_worktree" => TOOL,
        (Kiro, "agentSpawn") => SESSION_START,
        (Kiro, "userPromptSubmit") => START,
        (Kiro, "preToolUse") => TOOL_START,
        (Kiro, "postToolUse") => TOOL,
        (Kiro, "stop") => END,
        _ => TOPIC,
    }
}

/// The session a fixture's line gets: the agent's session id (Kiro CLI sends none: the
/// test gives one), `/` and the subagent's id inside a subagent.
fn session_of(agent: Agent, input: &Value) -> (String, Option<String>) {
    let session = [
        "session_id",
        "thread-id",
        "conversation_id",
        "sessionId",
        "taskId",
        "trajectory_id",
    ]
    .iter()
    .find_map(|k| input[k].as_str())
    .unwrap_or("kiro-session")
    .to_string();
    let sub = match agent {
        Agent::Cursor => input["subagent_id"].as_str(),
        _ => input["agent_id"].as_str(),
    };
    match sub {
        Some(id) => (format!("{session}/{id}"), Some(session)),
        None => (session, None),
    }
}

/// Members a mapping moves into an event's documented or token fields.
const MOVED: [&str; 24] = [
    "tool_name",
    "tool_input",
    "tool_response",
    "tool_output",
    "error",
    "error_message",
    "output",
    "command",
    "cwd",
    "toolName",
    "toolArgs",
    "toolResult",
    "tool_result",
    "errorContext",
    "error_context",
    "duration",
    "model",
    "message_count",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "tool_info",
    "hook_event_name",
];

#[test]
fn every_documented_event_of_every_agent_translates_to_what_docs_agents_md_says() {
    let mut seen = 0;
    for agent in Agent::ALL {
        assert!(!agent.events().is_empty());
        for event in agent.hook_events() {
            let event = event.name;
            let (json, source) = fixture(agent, event);
            assert_eq!(
                source.split(' ').next(),
                Some(agent.documentation()),
                "{agent}/{event}"
            );
            let input: Value = serde_json::from_str(&json).unwrap();
            let opts = TranslateOptions {
                session: (agent == Agent::Kiro).then(|| "kiro-session".to_string()),
                ..TranslateOptions::default()
            };
            let t = translate(agent, json.as_bytes(), &opts)
                .unwrap_or_else(|e| panic!("{agent}/{event}: {e}"));
            // Copilot CLI's `notification` payload names itself `Notification`.
            assert!(t.event.eq_ignore_ascii_case(event), "{agent}/{event}");
            let (session, parent) = session_of(agent, &input);
            let parse = if t.lenient {
                ParseOptions::lenient()
            } else {
                ParseOptions::default()
            };
            let want = expected(agent, event);
            let got: Vec<(&str, &Target)> = t.lines().collect();
            assert_eq!(got.len(), want.len(), "{agent}/{event}: {got:?}");
            for (i, ((line, target), want)) in got.into_iter().zip(want).enumerate() {
                assert!(!line.contains('\n'));
                match (
                    want.strip_prefix("topic"),
                    parse_input_with(line.as_bytes(), parse),
                ) {
                    (None, Ok(Input::Event(rec))) => {
                        let kind = rec.kind();
                        assert_eq!(
                            (kind.name(), target),
                            (*want, &Target::Lifecycle(kind)),
                            "{agent}/{event}"
                        );
                        assert_eq!(
                            (rec.agent.as_str(), rec.session.as_str()),
                            (agent.name(), session.as_str()),
                            "{agent}/{event}"
                        );
                        let payload: Value = serde_json::from_str(&rec.payload_json()).unwrap();
                        assert_eq!(
                            payload["parent_session"].as_str(),
                            parent.as_deref(),
                            "{agent}/{event}"
                        );
                        if kind == EventKind::ToolCallStart {
                            assert!(payload["tool"].is_string(), "{agent}/{event}: {payload}");
                            assert!(
                                !payload["arguments"].is_null(),
                                "{agent}/{event}: {payload}"
                            );
                        }
                        if kind == EventKind::ToolCall {
                            assert!(payload["tool"].is_string(), "{agent}/{event}: {payload}");
                        }
                        // Every member not moved into a field is kept as it was (spread
                        // agents keep their nested members instead).
                        if i == 0 && !matches!(agent, Agent::Cline | Agent::Windsurf) {
                            for (key, value) in input.as_object().unwrap() {
                                if !MOVED.contains(&key.as_str()) || payload.get(key).is_some() {
                                    assert_eq!(
                                        payload.get(key),
                                        Some(value),
                                        "{agent}/{event}: {key}"
                                    );
                                }
                            }
                        }
                    }
                    (Some(segment), Ok(Input::Topic(topic))) => {
                        let segment = segment.strip_prefix(':').unwrap_or(event);
                        let name = format!("prx.agent.{}.{segment}", agent.name());
                        assert_eq!(topic.topic, name, "{agent}/{event}");
                        assert_eq!(target, &Target::Topic(name));
                        assert_eq!(
                            (topic.agent.as_str(), topic.session.as_str()),
                            (agent.name(), session.as_str())
                        );
                        // The agent's whole object, and `success` where it says how a
                        // session ended.
                        let mut payload: Value = serde_json::from_str(&topic.payload).unwrap();
                        payload.as_object_mut().unwrap().remove("success");
                        assert_eq!(payload, input, "{agent}/{event}: the whole object");
                    }
                    (want, got) => {
                        panic!("{agent}/{event}: expected {want:?}, got {got:?} from {line}")
                    }
                }
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 145);
}

#[test]
fn tool_results_say_success_only_when_the_agent_does() {
    let success = |agent, event| {
        let (json, _) = fixture(agent, event);
        let opts = TranslateOptions {
            session: Some("s".into()),
            ..TranslateOptions::default()
        };
        let t = translate(agent, json.as_bytes(), &opts).unwrap();
        let opts = if t.lenient {
            ParseOptions::lenient()
        } else {
            ParseOptions::default()
        };
        let Ok(Input::Event(rec)) = parse_input_with(t.line.as_bytes(), opts) else {
            panic!()
        };
        serde_json::from_str::<Value>(&rec.payload_json()).unwrap()["success"].clone()
    };
    assert_eq!(success(Agent::ClaudeCode, "PostToolUse"), Value::Bool(true));
    assert_eq!(
        success(Agent::ClaudeCode, "PostToolUseFailure"),
        Value::Bool(false)
    );
    // Gemini CLI sets no error when a shell command exits non-zero: not said.
    assert_eq!(success(Agent::GeminiCli, "AfterTool"), Value::Null);
    assert_eq!(success(Agent::Cursor, "postToolUse"), Value::Bool(true));
    assert_eq!(
        success(Agent::Cursor, "postToolUseFailure"),
        Value::Bool(false)
    );
    // Codex's tools, Kiro CLI's and Windsurf's MCP tools do not say: left out, not guessed.
    assert_eq!(success(Agent::Codex, "PostToolUse"), Value::Null);
    assert_eq!(success(Agent::Kiro, "postToolUse"), Value::Null);
    assert_eq!(success(Agent::Windsurf, "post_mcp_tool_use"), Value::Null);
    // A structured exit status or result type where the agent gives one.
    assert_eq!(
        success(Agent::Windsurf, "post_run_command"),
        Value::Bool(false)
    );
    assert_eq!(success(Agent::Cline, "PostToolUse"), Value::Bool(false));
    assert_eq!(success(Agent::CopilotCli, "postToolUse"), Value::Bool(true));
    assert_eq!(
        success(Agent::CopilotCli, "PostToolUse"),
        Value::Bool(false)
    );
    assert_eq!(
        success(Agent::QwenCode, "PostToolUseFailure"),
        Value::Bool(false)
    );
    let failed = r#"{"session_id":"s","hook_event_name":"AfterTool","tool_name":"x","tool_input":{},"tool_response":{"error":{"message":"boom"}}}"#;
    let t = translate(
        Agent::GeminiCli,
        failed.as_bytes(),
        &TranslateOptions::default(),
    )
    .unwrap();
    assert!(t.line.contains(r#""success":false"#), "{}", t.line);
}

/// A member renamed `agent_<name>` (its name is one of the event's own fields) must not
/// collide with a member the agent sent under that name: the agent's payload has no duplicate
/// key, so its line must have none either (the ingest refuses a line with one).
#[test]
fn a_renamed_member_does_not_collide_with_a_member_already_named_so() {
    let input = br#"{"session_id":"s","hook_event_name":"PostToolUse","tool_name":"X","tool_input":{},"tool_response":"ok","success":"a","agent_success":"b"}"#;
    let got = translate(Agent::ClaudeCode, input, &TranslateOptions::default()).unwrap();
    let parsed = parse_input_with(got.line.as_bytes(), ParseOptions::default());
    let rec = match parsed {
        Ok(Input::Event(rec)) => rec,
        Ok(_) => panic!("not an event: {}", got.line),
        Err(e) => panic!("the line is refused: {e:?}\n{}", got.line),
    };
    let payload: Value = serde_json::from_str(&rec.payload_json()).unwrap();
    assert_eq!(payload["agent_success"], "b", "{payload}");
    assert!(
        payload.as_object().unwrap().values().any(|v| v == "a"),
        "the agent's `success` is kept under some name: {payload}"
    );
}

/// The duplicate-key check compared every member with every one before it: a 2 MB payload
/// of 160 000 members took ~23 s of the server's CPU (a 16 MiB one, `send`'s default bound,
/// about half an hour), inline on the connection's task below 256 KiB.
#[test]
fn many_members_are_translated_in_linear_time() {
    let mut input = String::from(r#"{"session_id":"s","hook_event_name":"Notification""#);
    for i in 0..200_000 {
        input.push_str(&format!(",\"k{i}\":0"));
    }
    input.push('}');
    let start = std::time::Instant::now();
    let got = translate(
        Agent::ClaudeCode,
        input.as_bytes(),
        &TranslateOptions::default(),
    );
    assert!(got.is_ok());
    let took = start.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "200 000 members took {took:?}"
    );
}

/// The same for the line the ingest reads (every input: `POST /api/events`, `run --events`,
/// the socket, a translated agent payload): its check for a repeated extra member scans the
/// ones seen (src/ndjson.rs, and again src/event.rs), quadratic in their number. A 1.8 MB
/// `tool_call` line of 160 000 extras kept `POST /api/events` busy ~32 s.
#[test]
fn a_line_with_many_extra_members_is_parsed_in_linear_time() {
    let mut line = String::from(
        r#"{"event":"tool_call","agent":"a","session":"s","payload":{"tool":"t","success":true,"output":"o""#,
    );
    for i in 0..200_000 {
        line.push_str(&format!(",\"k{i}\":0"));
    }
    line.push_str("}}");
    let start = std::time::Instant::now();
    let parsed = parse_input_with(line.as_bytes(), ParseOptions::default());
    assert!(matches!(parsed, Ok(Input::Event(_))));
    let took = start.elapsed();
    assert!(
        took < std::time::Duration::from_secs(5),
        "200 000 extra members took {took:?}"
    );
}
