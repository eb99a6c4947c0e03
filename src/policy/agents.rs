//! Agents' own hook payloads as questions: which decision point an agent's event is, and the
//! payload the rules read (the shape `tool_call_start` hooks receive).

use super::model::DecisionPoint;
use crate::agents::Agent;
use serde_json::{Map, Value};

/// An agent's hook payload read as a question to the policies.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Question {
    /// The agent's event name (`PreToolUse`).
    pub event: String,
    /// Its decision point.
    pub point: DecisionPoint,
    /// The payload the rules read: for a tool, `tool_name` → `tool` and `tool_input` →
    /// `arguments`, every other member kept; for a prompt, the agent's object.
    pub payload: Value,
}

/// Reads `payload` (an agent's hook object) as a question: `None` when its event is not one
/// the agent lets a hook decide (Claude Code and Codex: PreToolUse, PermissionRequest,
/// UserPromptSubmit; Gemini CLI: BeforeTool, BeforeAgent).
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::Agent;
/// use prx_hooks::policy::{DecisionPoint, question};
/// let q = question(Agent::ClaudeCode, br#"{"hook_event_name": "PreToolUse",
///     "tool_name": "Bash", "tool_input": {"command": "ls"}}"#).unwrap();
/// assert_eq!(q.point, DecisionPoint::ToolCallStart);
/// assert_eq!(q.payload["arguments"]["command"], "ls");
/// ```
pub fn question(agent: Agent, payload: &[u8]) -> Option<Question> {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(payload) else {
        return None;
    };
    let event = obj.get("hook_event_name")?.as_str()?.to_string();
    let point = decision_point(agent, &event)?;
    let payload = if point.has_tool() {
        Value::Object(tool_payload(obj))
    } else {
        Value::Object(obj)
    };
    Some(Question {
        event,
        point,
        payload,
    })
}

/// The decision point `agent`'s hook event `event` is, if the agent lets a hook decide there
/// (Claude Code and Codex: PreToolUse, PermissionRequest, UserPromptSubmit; Gemini CLI:
/// BeforeTool, BeforeAgent).
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::Agent;
/// use prx_hooks::policy::{DecisionPoint, decision_point};
/// assert_eq!(decision_point(Agent::GeminiCli, "BeforeTool"), Some(DecisionPoint::ToolCallStart));
/// assert_eq!(decision_point(Agent::ClaudeCode, "PostToolUse"), None);
/// ```
pub fn decision_point(agent: Agent, event: &str) -> Option<DecisionPoint> {
    Some(match (agent, event) {
        (Agent::ClaudeCode | Agent::Codex, "PreToolUse") => DecisionPoint::ToolCallStart,
        (Agent::ClaudeCode | Agent::Codex, "PermissionRequest") => DecisionPoint::Permission,
        (Agent::ClaudeCode | Agent::Codex, "UserPromptSubmit") => DecisionPoint::Prompt,
        (Agent::GeminiCli, "BeforeTool") => DecisionPoint::ToolCallStart,
        (Agent::GeminiCli, "BeforeAgent") => DecisionPoint::Prompt,
        _ => return None,
    })
}

fn tool_payload(mut obj: Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(t) = obj.remove("tool_name") {
        out.insert("tool".into(), t);
    }
    if let Some(a) = obj.remove("tool_input") {
        out.insert("arguments".into(), a);
    }
    for (k, v) in obj {
        out.entry(k).or_insert(v);
    }
    out
}
