//! A subagent's run in its parent's trace: Claude Code's `SubagentStart` … `SubagentStop`
//! inside the `Task` tool call that launched it, through `run --events --otlp`.

use crate::receiver::{Receiver, attr};
use crate::{is_error, names, one};
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

/// A Claude Code turn that launches one subagent, which runs one Bash command.
const SESSION: [&str; 9] = [
    r#"{"session_id":"s1","hook_event_name":"UserPromptSubmit","prompt":"explore","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"PreToolUse","tool_name":"Task","tool_input":{"subagent_type":"Explore"},"tool_use_id":"toolu_task","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"SubagentStart","agent_id":"agent-1","agent_type":"Explore","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"tool_use_id":"toolu_ls","agent_id":"agent-1","agent_type":"Explore","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"PostToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"tool_response":{"stdout":"a"},"tool_use_id":"toolu_ls","agent_id":"agent-1","agent_type":"Explore","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"SubagentStop","stop_hook_active":false,"agent_id":"agent-1","agent_type":"Explore","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"PostToolUse","tool_name":"Task","tool_input":{"subagent_type":"Explore"},"tool_response":{"result":"done"},"tool_use_id":"toolu_task","cwd":"/p"}"#,
    r#"{"session_id":"s1","hook_event_name":"Stop","stop_hook_active":false,"cwd":"/p"}"#,
    // A second turn of the same session: a trace of its own, as every turn.
    r#"{"session_id":"s1","hook_event_name":"UserPromptSubmit","prompt":"again","cwd":"/p"}"#,
];

fn lines() -> String {
    let mut out = String::new();
    for payload in SESSION {
        let t = translate(
            Agent::ClaudeCode,
            payload.as_bytes(),
            &TranslateOptions::default(),
        )
        .unwrap();
        for (line, target) in t.lines() {
            if matches!(target, Target::Lifecycle(_)) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[test]
fn a_subagents_run_is_a_nested_invoke_agent_under_the_tool_call_that_launched_it() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    std::fs::write(&events, lines()).unwrap();
    let rx = Receiver::start();
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&events)
        .arg("--lenient")
        .args(["--otlp", &rx.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first turn, its two tool calls, the subagent; the second turn, ended at shutdown.
    let spans = rx.wait_spans(5, Duration::from_secs(20));
    let turns: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent claude-code" && s.parent_span_id.is_empty())
        .collect();
    assert_eq!(turns.len(), 2, "{:?}", names(&spans));
    let turn = turns
        .iter()
        .find(|s| !is_error(s))
        .expect("the first turn ended cleanly");
    let task = one(&spans, "execute_tool Task");
    assert_eq!(task.trace_id, turn.trace_id);
    assert_eq!(task.parent_span_id, turn.span_id);
    assert!(!is_error(task));

    let subs: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent claude-code" && !s.parent_span_id.is_empty())
        .collect();
    assert_eq!(subs.len(), 1, "one nested agent span: {:?}", names(&spans));
    let sub = subs[0];
    assert_eq!(
        sub.trace_id, turn.trace_id,
        "the subagent is in its parent's trace"
    );
    assert_eq!(
        sub.parent_span_id, task.span_id,
        "under the tool call that launched it"
    );
    assert!(!is_error(sub), "{:?}", sub.status);
    assert_eq!(
        attr(sub, "gen_ai.conversation.id").as_deref(),
        Some("s1/agent-1")
    );
    assert!(
        sub.start_time_unix_nano >= task.start_time_unix_nano
            && sub.end_time_unix_nano <= task.end_time_unix_nano,
        "inside the tool call's time"
    );

    let ls = one(&spans, "execute_tool Bash");
    assert_eq!(ls.trace_id, turn.trace_id);
    assert_eq!(
        ls.parent_span_id, sub.span_id,
        "the subagent's tool call is its own"
    );

    let second = turns.iter().find(|s| is_error(s)).expect("the open turn");
    assert_ne!(second.trace_id, turn.trace_id, "each turn is a trace");
    assert_eq!(
        attr(second, "session.id").as_deref(),
        Some("s1"),
        "grouped by session"
    );
}
