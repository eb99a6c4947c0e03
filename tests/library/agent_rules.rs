//! One test per mapping rule of docs/agents.md: turns, sessions, subagents, tokens, time,
//! the fields kept, and `success` only from a structured status.

use crate::fixtures::fixture;
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use prx_hooks::ndjson::{Input, ParseOptions, parse_input_with};
use serde_json::{Value, json};

/// The lines `input` (a JSON object) becomes: `(event or topic, agent, session, payload)`.
fn lines(agent: Agent, input: &Value) -> Vec<(String, String, Value)> {
    let opts = TranslateOptions {
        session: (agent == Agent::Kiro).then(|| "k".to_string()),
        ..TranslateOptions::default()
    };
    let t = translate(agent, input.to_string().as_bytes(), &opts)
        .unwrap_or_else(|e| panic!("{agent}: {e}: {input}"));
    let parse = if t.lenient {
        ParseOptions::lenient()
    } else {
        ParseOptions::default()
    };
    t.lines()
        .map(
            |(line, target)| match parse_input_with(line.as_bytes(), parse) {
                Ok(Input::Event(rec)) => {
                    assert_eq!(target, &Target::Lifecycle(rec.kind()));
                    let payload = serde_json::from_str(&rec.payload_json()).unwrap();
                    (rec.kind().name().to_string(), rec.session.clone(), payload)
                }
                Ok(Input::Topic(topic)) => (
                    topic.topic.clone(),
                    topic.session.clone(),
                    serde_json::from_str(&topic.payload).unwrap(),
                ),
                other => panic!("{agent}: {line}: {other:?}"),
            },
        )
        .collect()
}

/// The fixture of `agent`'s `event`, as JSON.
fn sample(agent: Agent, event: &str) -> Value {
    serde_json::from_str(&fixture(agent, event).0).unwrap()
}

fn kinds(lines: &[(String, String, Value)]) -> Vec<&str> {
    lines.iter().map(|l| l.0.as_str()).collect()
}

#[test]
fn a_prompt_opens_a_turn_and_the_turns_end_is_turn_complete_then_agent_end() {
    let opens = [
        (Agent::ClaudeCode, "UserPromptSubmit"),
        (Agent::Codex, "UserPromptSubmit"),
        (Agent::GeminiCli, "BeforeAgent"),
        (Agent::Cursor, "beforeSubmitPrompt"),
        (Agent::CopilotCli, "userPromptSubmitted"),
        (Agent::QwenCode, "UserPromptSubmit"),
        (Agent::FactoryDroid, "UserPromptSubmit"),
        (Agent::Windsurf, "pre_user_prompt"),
        (Agent::Kiro, "userPromptSubmit"),
    ];
    for (agent, event) in opens {
        assert_eq!(
            kinds(&lines(agent, &sample(agent, event))),
            ["agent_start"],
            "{agent}/{event}"
        );
    }
    let closes = [
        (Agent::ClaudeCode, "Stop", Some(true)),
        (Agent::Codex, "Stop", None),
        (Agent::GeminiCli, "AfterAgent", None),
        (Agent::Cursor, "stop", Some(true)),
        (Agent::CopilotCli, "agentStop", Some(true)),
        (Agent::QwenCode, "Stop", Some(true)),
        (Agent::FactoryDroid, "Stop", None),
        (Agent::Windsurf, "post_cascade_response", None),
        (Agent::Kiro, "stop", None),
    ];
    for (agent, event, success) in closes {
        let got = lines(agent, &sample(agent, event));
        assert_eq!(
            kinds(&got),
            ["turn_complete", "agent_end"],
            "{agent}/{event}"
        );
        assert_eq!(got[1].2["success"].as_bool(), success, "{agent}/{event}");
    }
    // Qwen Code fires UserPromptSubmit before a model call that sends tool results too: only
    // the user's submission (`submitted_prompt`) opens a turn.
    let mut again = sample(Agent::QwenCode, "UserPromptSubmit");
    again.as_object_mut().unwrap().remove("submitted_prompt");
    assert_eq!(
        kinds(&lines(Agent::QwenCode, &again)),
        ["prx.agent.qwen-code.UserPromptSubmit"]
    );
}

#[test]
fn sessions_start_and_end_as_topics_not_as_turns() {
    let cases = [
        (Agent::ClaudeCode, "SessionStart", "SessionEnd"),
        (Agent::Codex, "SessionStart", "SessionEnd"),
        (Agent::GeminiCli, "SessionStart", "SessionEnd"),
        (Agent::Cursor, "sessionStart", "sessionEnd"),
        (Agent::CopilotCli, "sessionStart", "sessionEnd"),
        (Agent::QwenCode, "SessionStart", "SessionEnd"),
        (Agent::FactoryDroid, "SessionStart", "SessionEnd"),
    ];
    for (agent, start, end) in cases {
        for (event, topic) in [(start, "session_start"), (end, "session_end")] {
            let input = sample(agent, event);
            let got = lines(agent, &input);
            assert_eq!(
                kinds(&got),
                [format!("prx.agent.{agent}.{topic}")],
                "{agent}/{event}"
            );
            for (key, value) in input.as_object().unwrap() {
                assert_eq!(got[0].2.get(key), Some(value), "{agent}/{event}: {key}");
            }
        }
    }
    // Claude Code's `source` (startup, resume, clear, compact) and `model` are kept.
    let start = lines(
        Agent::ClaudeCode,
        &json!({"session_id":"s","hook_event_name":"SessionStart","source":"resume","model":"claude-opus-4-6"}),
    );
    assert_eq!(
        (&start[0].2["source"], &start[0].2["model"]),
        (&json!("resume"), &json!("claude-opus-4-6"))
    );
}

#[test]
fn a_subagent_is_an_emitter_of_its_own_under_its_parents_session() {
    // Claude Code: the subagent's tool calls carry its `agent_id`.
    let tool = json!({"session_id":"abc","hook_event_name":"PreToolUse","agent_id":"a7","agent_type":"Explore","tool_name":"Read","tool_input":{"file_path":"/p/a"}});
    let got = lines(Agent::ClaudeCode, &tool);
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str()),
        ("tool_call_start", "abc/a7")
    );
    assert_eq!(got[0].2["parent_session"], "abc");
    let main = lines(
        Agent::ClaudeCode,
        &json!({"session_id":"abc","hook_event_name":"PreToolUse","tool_name":"Read","tool_input":{}}),
    );
    assert_eq!(
        (main[0].1.as_str(), &main[0].2["parent_session"]),
        ("abc", &Value::Null)
    );
    // Its start and stop are its own turn.
    let start = lines(
        Agent::ClaudeCode,
        &sample(Agent::ClaudeCode, "SubagentStart"),
    );
    assert_eq!(
        (kinds(&start), start[0].1.as_str()),
        (vec!["agent_start"], "abc123/agent-abc123")
    );
    let stop = lines(Agent::Codex, &sample(Agent::Codex, "SubagentStop"));
    assert_eq!(kinds(&stop), ["turn_complete", "agent_end"]);
    assert!(stop[1].1.contains('/'), "{:?}", stop[1]);
    // Codex: a subagent's prompt is inside the turn its SubagentStart opened.
    let mut prompt = sample(Agent::Codex, "UserPromptSubmit");
    prompt["agent_id"] = json!("sub-1");
    assert_eq!(
        kinds(&lines(Agent::Codex, &prompt)),
        ["prx.agent.codex.UserPromptSubmit"]
    );
    // Cursor names the parent conversation.
    let mut sub = sample(Agent::Cursor, "subagentStart");
    sub["parent_conversation_id"] = json!("conv-parent");
    let got = lines(Agent::Cursor, &sub);
    assert_eq!(got[0].1, "conv-parent/sub-1");
    assert_eq!(got[0].2["parent_session"], "conv-parent");
}

#[test]
fn token_counts_become_input_output_and_cache_read_tokens() {
    // Gemini CLI counts cached tokens inside the prompt's; input_tokens does not.
    let got = lines(Agent::GeminiCli, &sample(Agent::GeminiCli, "AfterModel"));
    assert_eq!(kinds(&got), ["llm_response"]);
    let p = &got[0].2;
    assert_eq!(
        (
            &p["input_tokens"],
            &p["output_tokens"],
            &p["cache_read_input_tokens"]
        ),
        (&json!(200), &json!(85), &json!(1000)),
        "{p}"
    );
    assert_eq!(
        (&p["model"], &p["finish_reason"]),
        (&json!("gemini-2.5-pro"), &json!("STOP"))
    );
    let got = lines(Agent::Cursor, &sample(Agent::Cursor, "stop"));
    let p = &got[1].2;
    assert_eq!(
        (
            &p["input_tokens"],
            &p["output_tokens"],
            &p["cache_read_input_tokens"],
            &p["cache_creation_input_tokens"]
        ),
        (&json!(5120), &json!(740), &json!(4096), &json!(512)),
        "{p}"
    );
    assert!(
        p.get("cache_read_tokens").is_none(),
        "moved, not copied: {p}"
    );
}

#[test]
fn gemini_after_model_is_one_llm_response_on_the_chunk_with_a_finish_reason() {
    let mut chunk = sample(Agent::GeminiCli, "AfterModel");
    chunk["llm_response"]["candidates"][0]
        .as_object_mut()
        .unwrap()
        .remove("finishReason");
    assert_eq!(
        kinds(&lines(Agent::GeminiCli, &chunk)),
        ["prx.agent.gemini-cli.AfterModel"]
    );
    let request = lines(Agent::GeminiCli, &sample(Agent::GeminiCli, "BeforeModel"));
    assert_eq!(kinds(&request), ["llm_request"]);
    assert_eq!(request[0].2["model"], "gemini-2.5-pro");
}

#[test]
fn gemini_timestamp_is_the_events_time() {
    let input = sample(Agent::GeminiCli, "BeforeTool");
    let t = translate(
        Agent::GeminiCli,
        input.to_string().as_bytes(),
        &TranslateOptions::default(),
    )
    .unwrap();
    let stamp = input["timestamp"].as_str().unwrap();
    let time = t.time.expect("the time Gemini CLI gives");
    assert_eq!(
        humantime::parse_rfc3339(&time).unwrap(),
        humantime::parse_rfc3339(stamp).unwrap()
    );
}

#[test]
fn cursor_says_how_a_turn_and_a_session_ended_and_keeps_its_fields() {
    let mut stop = sample(Agent::Cursor, "stop");
    for (status, want) in [("aborted", false), ("error", false)] {
        stop["status"] = json!(status);
        let got = lines(Agent::Cursor, &stop);
        // Not a full turn: no turn_complete.
        assert_eq!(kinds(&got), ["agent_end"], "{status}");
        assert_eq!(got[0].2["success"], want);
        assert_eq!(
            (&got[0].2["model"], &got[0].2["generation_id"]),
            (&json!("claude-sonnet-4"), &json!("gen-456"))
        );
    }
    let mut end = sample(Agent::Cursor, "sessionEnd");
    end["reason"] = json!("error");
    end["error_message"] = json!("model unavailable");
    let got = lines(Agent::Cursor, &end);
    assert_eq!(kinds(&got), ["prx.agent.cursor.session_end", "error"]);
    assert_eq!(got[0].2["success"], false);
    assert_eq!(got[0].2["reason"], "error");
    assert_eq!(got[1].2["message"], "model unavailable");
    let done = lines(Agent::Cursor, &sample(Agent::Cursor, "postToolUse"));
    assert_eq!(
        (&done[0].2["duration_ms"], &done[0].2["success"]),
        (&json!(5432), &json!(true))
    );
}

#[test]
fn one_cursor_shell_command_is_one_tool_call_start_and_one_tool_call() {
    let mut started = Vec::new();
    for event in ["preToolUse", "beforeShellExecution"] {
        started.extend(
            kinds(&lines(Agent::Cursor, &sample(Agent::Cursor, event)))
                .into_iter()
                .map(str::to_string),
        );
    }
    assert_eq!(
        started,
        ["tool_call_start", "prx.agent.cursor.beforeShellExecution"]
    );
    let mut done = Vec::new();
    for event in ["postToolUse", "afterShellExecution"] {
        done.extend(
            kinds(&lines(Agent::Cursor, &sample(Agent::Cursor, event)))
                .into_iter()
                .map(str::to_string),
        );
    }
    assert_eq!(done, ["tool_call", "prx.agent.cursor.afterShellExecution"]);
    // A shell command's exit code, from the structured `tool_output`.
    let mut failed = sample(Agent::Cursor, "postToolUse");
    failed["tool_output"] = json!("{\"exitCode\":3,\"stdout\":\"\"}");
    assert_eq!(lines(Agent::Cursor, &failed)[0].2["success"], false);
}

#[test]
fn codex_interrupt_ends_the_turn_and_session_end_ends_the_session_keeping_model_and_turn_id() {
    let got = lines(Agent::Codex, &sample(Agent::Codex, "Interrupt"));
    assert_eq!(kinds(&got), ["agent_end"]);
    assert_eq!(got[0].2["success"], false);
    assert_eq!(got[0].2["turn_id"], "019a7b2c-6000-7000-8000-000000000001");
    let got = lines(Agent::Codex, &sample(Agent::Codex, "SessionEnd"));
    assert_eq!(kinds(&got), ["prx.agent.codex.session_end"]);
    let got = lines(Agent::Codex, &sample(Agent::Codex, "UserPromptSubmit"));
    assert_eq!(
        (&got[0].2["model"], &got[0].2["turn_id"]),
        (
            &json!("gpt-5.1-codex"),
            &json!("019a7b2c-6000-7000-8000-000000000001")
        )
    );
    // The older `notify` program: a turn's end.
    let got = lines(Agent::Codex, &sample(Agent::Codex, "agent-turn-complete"));
    assert_eq!(kinds(&got), ["turn_complete"]);
}

#[test]
fn claude_codes_duration_interrupt_mcp_server_model_and_source_are_kept() {
    let failed = json!({"session_id":"s","hook_event_name":"PostToolUseFailure","tool_name":"mcp__gh__list","tool_input":{},"tool_use_id":"t1","error":"boom","is_interrupt":true,"duration_ms":412,"mcp_server":{"name":"gh","source":"project"}});
    let got = lines(Agent::ClaudeCode, &failed);
    let p = &got[0].2;
    assert_eq!(
        (
            &p["success"],
            &p["is_interrupt"],
            &p["duration_ms"],
            &p["mcp_server"]["name"]
        ),
        (&json!(false), &json!(true), &json!(412), &json!("gh")),
        "{p}"
    );
    let prompt =
        json!({"session_id":"s","hook_event_name":"UserPromptSubmit","prompt":"hi","source":"sdk"});
    assert_eq!(lines(Agent::ClaudeCode, &prompt)[0].2["source"], "sdk");
    let switch = lines(
        Agent::ClaudeCode,
        &sample(Agent::ClaudeCode, "PostModelSwitch"),
    );
    assert_eq!(kinds(&switch), ["prx.agent.claude-code.PostModelSwitch"]);
    assert_eq!(switch[0].2["to_model"], "claude-opus-4-6");
    // A turn that failed on the API: error, then agent_end that did not succeed.
    let failed = lines(Agent::ClaudeCode, &sample(Agent::ClaudeCode, "StopFailure"));
    assert_eq!(kinds(&failed), ["error", "agent_end"]);
    assert_eq!(failed[1].2["success"], false);
}

#[test]
fn success_comes_only_from_a_structured_status_never_from_text() {
    // Gemini CLI: a shell command that exited 3 has its code only in the text.
    let shell = json!({"session_id":"s","hook_event_name":"AfterTool","tool_name":"run_shell_command","tool_input":{"command":"exit 3"},"tool_response":{"llmContent":"Command: exit 3\nExit Code: 3","returnDisplay":"Exit Code: 3"}});
    assert_eq!(lines(Agent::GeminiCli, &shell)[0].2.get("success"), None);
    let read = json!({"session_id":"s","hook_event_name":"AfterTool","tool_name":"read_file","tool_input":{},"tool_response":{"llmContent":"Error: failed"}});
    assert_eq!(lines(Agent::GeminiCli, &read)[0].2["success"], true);
    let failed = json!({"session_id":"s","hook_event_name":"AfterTool","tool_name":"run_shell_command","tool_input":{},"tool_response":{"llmContent":"","error":{"message":"spawn failed"}}});
    assert_eq!(lines(Agent::GeminiCli, &failed)[0].2["success"], false);
    // Claude Code's exit code is in PostToolUseFailure's text: the event says it failed.
    let cc = lines(
        Agent::ClaudeCode,
        &sample(Agent::ClaudeCode, "PostToolUseFailure"),
    );
    assert_eq!(cc[0].2["success"], false);
    // Codex fires PostToolUse after a failed command too and says nothing structured.
    let mut codex = sample(Agent::Codex, "PostToolUse");
    codex["tool_response"] = json!("Exit code: 1\nerror");
    assert_eq!(lines(Agent::Codex, &codex)[0].2.get("success"), None);
}

#[test]
fn hook_events_say_handlers_closing_events_and_who_reads_stdout() {
    use prx_hooks::agents::Handlers;
    for agent in Agent::ALL {
        let events = agent.hook_events();
        for (i, e) in events.iter().enumerate() {
            assert!(e.handlers.contains(Handlers::COMMAND), "{agent} {}", e.name);
            assert!(
                !events[..i].iter().any(|o| o.name == e.name),
                "{agent} {} twice",
                e.name
            );
            assert_eq!(e.subscribe, agent.events().contains(&e.name));
            assert!(
                e.subscribe || e.note.is_some(),
                "{agent} {}: why not",
                e.name
            );
            assert!(!e.maps_to.is_empty());
            if !agent.answers_on_stdout() {
                assert!(!e.reads_stdout, "{agent} {}", e.name);
            }
        }
    }
    let closing = |agent: Agent| -> Vec<&str> {
        agent
            .hook_events()
            .iter()
            .filter(|e| e.closes)
            .map(|e| e.name)
            .collect()
    };
    assert_eq!(
        closing(Agent::ClaudeCode),
        ["SubagentStop", "Stop", "StopFailure", "SessionEnd"]
    );
    assert_eq!(
        closing(Agent::Codex),
        ["SubagentStop", "Stop", "Interrupt", "SessionEnd"]
    );
    let http_less: Vec<&str> = Agent::ClaudeCode
        .hook_events()
        .iter()
        .filter(|e| !e.handlers.contains(Handlers::HTTP))
        .map(|e| e.name)
        .collect();
    assert_eq!(http_less, ["Setup", "SessionStart"]);
    assert!(!Agent::ClaudeCode.events().contains(&"MessageDisplay"));
    assert!(!Agent::ClaudeCode.events().contains(&"WorktreeCreate"));
    assert!(Agent::GeminiCli.answers_on_stdout() && !Agent::Kiro.answers_on_stdout());
    let copilot = Agent::CopilotCli.hook_event("sessionStart").unwrap();
    assert!(!copilot.reads_stdout && copilot.handlers.contains(Handlers::PROMPT));
}
