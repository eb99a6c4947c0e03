//! OpenAI Codex CLI: its hooks (<https://developers.openai.com/codex/hooks>, read 2026-12-03;
//! one JSON object on stdin, its kind in `hook_event_name`) and its older `notify` program
//! (<https://developers.openai.com/codex/config-advanced#notifications>: the object as the
//! program's last argument, its kind in `type`).

use super::{Map, Spec, Success, Value};

pub(crate) static SPEC: Spec = Spec {
    docs: "https://developers.openai.com/codex/hooks",
    event_fields: &["hook_event_name", "type"],
    session_fields: &["session_id", "thread-id"],
    events: &[
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
        "StopFailure",
        "agent-turn-complete",
    ],
    map,
};

fn map(event: &str) -> Map {
    match event {
        "PreToolUse" => Map::ToolStart {
            tool: Value::Member("tool_name"),
            arguments: Value::Member("tool_input"),
        },
        // Codex fires PostToolUse after the tool ran and does not say whether it succeeded:
        // `success` is left out.
        "PostToolUse" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Member("tool_response"),
            success: Success::Unknown,
        },
        "SessionStart" => Map::AgentStart,
        "Stop" | "agent-turn-complete" => Map::TurnComplete,
        "StopFailure" => Map::Error {
            component: Value::Const("api"),
            message: Value::Member("error"),
        },
        _ => Map::Topic,
    }
}
