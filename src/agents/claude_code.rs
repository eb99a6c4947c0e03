//! Claude Code's hook events (<https://code.claude.com/docs/en/hooks>, read 2026-12-03).

use super::{Map, Spec, Success, Value};

pub(crate) static SPEC: Spec = Spec {
    docs: "https://code.claude.com/docs/en/hooks",
    event_fields: &["hook_event_name"],
    session_fields: &["session_id"],
    // In the reference's lifecycle order (`connect` writes them in this order).
    events: &[
        "Setup",
        "SessionStart",
        "InstructionsLoaded",
        "UserPromptSubmit",
        "UserPromptExpansion",
        "PreToolUse",
        "PermissionRequest",
        "PermissionDenied",
        "PostToolUse",
        "PostToolUseFailure",
        "PostToolBatch",
        "Notification",
        "SubagentStart",
        "SubagentStop",
        "TaskCreated",
        "TaskCompleted",
        "Stop",
        "StopFailure",
        "TeammateIdle",
        "PreCompact",
        "PostCompact",
        "Elicitation",
        "ElicitationResult",
        "ConfigChange",
        "CwdChanged",
        "FileChanged",
        "WorktreeCreate",
        "WorktreeRemove",
        "SessionEnd",
    ],
    map,
};

fn map(event: &str) -> Map {
    match event {
        "PreToolUse" => Map::ToolStart {
            tool: Value::Member("tool_name"),
            arguments: Value::Member("tool_input"),
        },
        // "Runs immediately after a tool completes successfully"; failures are their own event.
        "PostToolUse" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Member("tool_response"),
            success: Success::Is(true),
        },
        "PostToolUseFailure" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Member("error"),
            success: Success::Is(false),
        },
        "SessionStart" => Map::AgentStart,
        "SessionEnd" => Map::AgentEnd,
        "Stop" => Map::TurnComplete,
        // The turn ended on an API error (`rate_limit`, `overloaded`, …) instead of `Stop`.
        "StopFailure" => Map::Error {
            component: Value::Const("api"),
            message: Value::Member("error"),
        },
        _ => Map::Topic,
    }
}
