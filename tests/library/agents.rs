//! Every event each agent's hook documentation lists (`tests/fixtures/agents/<agent>/<event>.json`,
//! each citing its page) translated, and the result read back by the ingest's own parser:
//! the event or topic it maps to, its documented fields, its session, the extras kept.

use prx_hooks::EventKind;
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use prx_hooks::ndjson::{Input, ParseOptions, parse_input_with};
use serde_json::Value;
use std::path::PathBuf;

/// The fixture's JSON (its `//` comment lines removed) and the page it cites.
pub fn fixture(agent: Agent, event: &str) -> (String, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/agents")
        .join(agent.name())
        .join(format!("{event}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (every documented event has a fixture)",
            path.display()
        )
    });
    let source = text
        .lines()
        .find_map(|l| l.strip_prefix("// source: "))
        .unwrap_or_else(|| panic!("{}: no `// source:` line", path.display()))
        .to_string();
    let json: Vec<&str> = text.lines().filter(|l| !l.starts_with("//")).collect();
    (json.join("\n"), source)
}

/// What each documented event maps to (docs/agents.md).
fn expected(agent: Agent, event: &str) -> Option<EventKind> {
    use EventKind::*;
    match (agent, event) {
        (Agent::ClaudeCode | Agent::Codex, "PreToolUse") => Some(ToolCallStart),
        (Agent::GeminiCli, "BeforeTool") => Some(ToolCallStart),
        (Agent::Cursor, "preToolUse" | "beforeShellExecution" | "beforeMCPExecution") => {
            Some(ToolCallStart)
        }
        (Agent::ClaudeCode, "PostToolUse" | "PostToolUseFailure") => Some(ToolCall),
        (Agent::Codex, "PostToolUse") | (Agent::GeminiCli, "AfterTool") => Some(ToolCall),
        (Agent::Cursor, "postToolUse" | "postToolUseFailure") => Some(ToolCall),
        (Agent::Cursor, "afterShellExecution" | "afterMCPExecution") => Some(ToolCall),
        (Agent::ClaudeCode | Agent::Codex | Agent::GeminiCli, "SessionStart") => Some(AgentStart),
        (Agent::Cursor, "sessionStart") => Some(AgentStart),
        (Agent::ClaudeCode | Agent::GeminiCli, "SessionEnd") => Some(AgentEnd),
        (Agent::Cursor, "sessionEnd") => Some(AgentEnd),
        (Agent::ClaudeCode | Agent::Codex, "Stop") | (Agent::GeminiCli, "AfterAgent") => {
            Some(TurnComplete)
        }
        (Agent::Cursor, "stop") | (Agent::Codex, "agent-turn-complete") => Some(TurnComplete),
        (Agent::ClaudeCode | Agent::Codex, "StopFailure") => Some(Error),
        _ => None,
    }
}

#[test]
fn every_documented_event_of_every_agent_translates_to_what_docs_agents_md_says() {
    let mut seen = 0;
    for agent in Agent::ALL {
        assert!(!agent.events().is_empty());
        for &event in agent.events() {
            let (json, source) = fixture(agent, event);
            // Codex's older `notify` program has its own page.
            let page = match (agent, event) {
                (Agent::Codex, "agent-turn-complete") => {
                    "https://developers.openai.com/codex/config-advanced#notifications"
                }
                _ => agent.documentation(),
            };
            assert_eq!(source.split(' ').next(), Some(page), "{agent}/{event}");
            let input: Value = serde_json::from_str(&json).unwrap();
            let t = translate(agent, json.as_bytes(), &TranslateOptions::default())
                .unwrap_or_else(|e| panic!("{agent}/{event}: {e}"));
            assert_eq!(t.event, event);
            assert!(!t.line.contains('\n'));
            let session = ["session_id", "thread-id", "conversation_id"]
                .iter()
                .find_map(|k| input[k].as_str())
                .unwrap();
            let opts = if t.lenient {
                ParseOptions::lenient()
            } else {
                ParseOptions::default()
            };
            match (
                expected(agent, event),
                parse_input_with(t.line.as_bytes(), opts),
            ) {
                (Some(kind), Ok(Input::Event(rec))) => {
                    assert_eq!(
                        (t.target.clone(), rec.kind()),
                        (Target::Lifecycle(kind), kind)
                    );
                    assert_eq!(
                        (rec.agent.as_str(), rec.session.as_str()),
                        (agent.name(), session)
                    );
                    let payload: Value = serde_json::from_str(&rec.payload_json()).unwrap();
                    if matches!(kind, EventKind::ToolCallStart | EventKind::ToolCall) {
                        let tool = input["tool_name"].as_str().unwrap_or("shell");
                        assert_eq!(payload["tool"].as_str(), Some(tool), "{agent}/{event}");
                    }
                    if kind == EventKind::ToolCallStart {
                        assert!(
                            !payload["arguments"].is_null(),
                            "{agent}/{event}: {payload}"
                        );
                    }
                    if kind == EventKind::ToolCall {
                        assert!(payload["output"].is_string(), "{agent}/{event}: {payload}");
                    }
                    if kind == EventKind::Error {
                        assert_eq!(
                            (payload["component"].as_str(), &payload["message"]),
                            (Some("api"), &input["error"]),
                            "{agent}/{event}: {payload}"
                        );
                    }
                    // Every member not moved into a documented field is kept as it was.
                    for (key, value) in input.as_object().unwrap() {
                        let moved = [
                            "tool_name",
                            "tool_input",
                            "tool_response",
                            "tool_output",
                            "error",
                            "error_message",
                            "output",
                            "result_json",
                            "command",
                            "cwd",
                        ];
                        if !moved.contains(&key.as_str()) || payload.get(key).is_some() {
                            assert_eq!(payload.get(key), Some(value), "{agent}/{event}: {key}");
                        }
                    }
                }
                (None, Ok(Input::Topic(topic))) => {
                    assert_eq!(topic.topic, format!("prx.agent.{}.{event}", agent.name()));
                    assert_eq!(t.target, Target::Topic(topic.topic.clone()));
                    assert_eq!(
                        (topic.agent.as_str(), topic.session.as_str()),
                        (agent.name(), session)
                    );
                    let payload: Value = serde_json::from_str(&topic.payload).unwrap();
                    assert_eq!(payload, input, "{agent}/{event}: the whole object");
                }
                (want, got) => panic!(
                    "{agent}/{event}: expected {want:?}, got {got:?} from {}",
                    t.line
                ),
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 72);
}

#[test]
fn tool_results_say_success_only_when_the_agent_does() {
    let success = |agent, event| {
        let (json, _) = fixture(agent, event);
        let t = translate(agent, json.as_bytes(), &TranslateOptions::default()).unwrap();
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
    assert_eq!(success(Agent::GeminiCli, "AfterTool"), Value::Bool(true));
    assert_eq!(success(Agent::Cursor, "postToolUse"), Value::Bool(true));
    assert_eq!(
        success(Agent::Cursor, "postToolUseFailure"),
        Value::Bool(false)
    );
    // Cursor's shell commands and Codex's tools do not say: left out, not guessed.
    assert_eq!(success(Agent::Cursor, "afterShellExecution"), Value::Null);
    assert_eq!(success(Agent::Codex, "PostToolUse"), Value::Null);
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
