//! Cursor's hook events (<https://cursor.com/docs/hooks>, read 2026-12-03). The session is the
//! conversation. Cursor says whether a generic tool call failed (`postToolUseFailure`) but not
//! whether a shell command or an MCP tool did, so those `tool_call`s leave `success` out.

use super::{Map, Spec, Success, Value};

pub(crate) static SPEC: Spec = Spec {
    docs: "https://cursor.com/docs/hooks",
    event_fields: &["hook_event_name"],
    session_fields: &["conversation_id", "session_id"],
    // In the documentation's order (`connect` writes them in this order).
    events: &[
        "sessionStart",
        "beforeSubmitPrompt",
        "preToolUse",
        "postToolUse",
        "postToolUseFailure",
        "beforeShellExecution",
        "afterShellExecution",
        "beforeMCPExecution",
        "afterMCPExecution",
        "beforeReadFile",
        "afterFileEdit",
        "subagentStart",
        "subagentStop",
        "preCompact",
        "afterAgentResponse",
        "afterAgentThought",
        "stop",
        "sessionEnd",
        "beforeTabFileRead",
        "afterTabFileEdit",
    ],
    map,
};

fn map(event: &str) -> Map {
    match event {
        "preToolUse" => Map::ToolStart {
            tool: Value::Member("tool_name"),
            arguments: Value::Member("tool_input"),
        },
        "postToolUse" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Optional("tool_output"),
            success: Success::Is(true),
        },
        "postToolUseFailure" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Optional("error_message"),
            success: Success::Is(false),
        },
        "beforeShellExecution" => Map::ToolStart {
            tool: Value::Const("shell"),
            arguments: Value::Object(&["command", "cwd"]),
        },
        "afterShellExecution" => Map::ToolDone {
            tool: Value::Const("shell"),
            output: Value::Member("output"),
            success: Success::Unknown,
        },
        "beforeMCPExecution" => Map::ToolStart {
            tool: Value::Member("tool_name"),
            arguments: Value::Member("tool_input"),
        },
        "afterMCPExecution" => Map::ToolDone {
            tool: Value::Member("tool_name"),
            output: Value::Member("result_json"),
            success: Success::Unknown,
        },
        "sessionStart" => Map::AgentStart,
        "sessionEnd" => Map::AgentEnd,
        "stop" => Map::TurnComplete,
        _ => Map::Topic,
    }
}
