//! Gemini CLI's hook events (<https://geminicli.com/docs/hooks/reference>, read 2026-12-03).

use super::{Map, Spec, Success, Value};

pub(crate) static SPEC: Spec = Spec {
    docs: "https://geminicli.com/docs/hooks/reference",
    event_fields: &["hook_event_name"],
    session_fields: &["session_id"],
    // In the reference's lifecycle order (`connect` writes them in this order).
    events: &[
        "SessionStart",
        "BeforeAgent",
        "BeforeModel",
        "AfterModel",
        "BeforeToolSelection",
        "BeforeTool",
        "AfterTool",
        "AfterAgent",
        "PreCompress",
        "Notification",
        "SessionEnd",
    ],
    map,
};

fn map(event: &str) -> Map {
    match event {
        "BeforeTool" => Map::ToolStart {
            tool: Value::Member("tool_name"),
            arguments: Value::Member("tool_input"),
        },
        // `tool_response` is the tool's raw result; a failed tool sets its `error`.
        "AfterTool" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Member("tool_response"),
            success: Success::UnlessSet("tool_response", "error"),
        },
        "SessionStart" => Map::AgentStart,
        "SessionEnd" => Map::AgentEnd,
        "AfterAgent" => Map::TurnComplete,
        _ => Map::Topic,
    }
}
