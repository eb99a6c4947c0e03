//! Qwen Code's hook events
//! (<https://github.com/QwenLM/qwen-code/blob/main/docs/users/features/hooks.md>, read
//! 2026-12-07 as `@qwen-code/qwen-code` 0.24.4 ships it). Claude-shaped:
//! [`claude_shaped`](super::claude_shaped) maps them.

use super::claude_shaped::{self, Flavor};
use super::plan::Plan;
use super::read::Payload;
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};

/// `command`, `http` and `prompt` (`function` hooks are internal).
const H: Handlers = Handlers::COMMAND
    .with(Handlers::HTTP)
    .with(Handlers::PROMPT);

/// In the documentation's order.
const EVENTS: [HookEvent; 22] = [
    ev("PreToolUse", H, "tool_call_start"),
    ev("PostToolUse", H, "tool_call"),
    ev("PostToolUseFailure", H, "tool_call"),
    ev("PostToolBatch", H, "topic"),
    ev(
        "UserPromptSubmit",
        H,
        "agent_start (with submitted_prompt; else topic)",
    ),
    ev("UserPromptExpansion", H, "topic"),
    ev("SessionStart", H, "topic session_start"),
    ev("SessionEnd", H, "topic session_end").closing(),
    ev("SessionDelete", H, "topic"),
    ev("MessageDisplay", H, "topic").unsubscribed("fires repeatedly as a reply streams"),
    ev("Stop", H, "turn_complete, agent_end").closing(),
    ev("StopFailure", H, "error, agent_end").closing(),
    ev("SubagentStart", H, "agent_start (the subagent's)"),
    ev(
        "SubagentStop",
        H,
        "turn_complete, agent_end (the subagent's)",
    )
    .closing(),
    ev("PreCompact", H, "topic"),
    ev("PostCompact", H, "topic"),
    ev("Notification", H, "topic"),
    ev("PermissionRequest", H, "topic"),
    ev("PermissionDenied", H, "topic"),
    ev("TodoCreated", H, "topic"),
    ev("TodoCompleted", H, "topic"),
    ev("InstructionsLoaded", H, "topic"),
];

const NAMES: [&str; 21] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://github.com/QwenLM/qwen-code/blob/main/docs/users/features/hooks.md",
    event_fields: &["hook_event_name"],
    infer_event: None,
    session_fields: &["session_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // A JSON object on stdout is the answer; other stdout is added to the model's context.
    answers_on_stdout: true,
    map,
};

/// PostToolUse runs "after successful tool execution"; StopFailure runs "instead of `Stop`"
/// when an API error or loop detection ends the turn. UserPromptSubmit runs before model
/// calls that send tool results too: a user's submission carries `submitted_prompt`.
const FLAVOR: Flavor = Flavor {
    stop_is_success: true,
    post_is_success: true,
    prompt_needs: Some("submitted_prompt"),
    failure_component,
};

/// Loop detection is the agent's, every other error the model API's.
fn failure_component(error: Option<&str>) -> &'static str {
    match error {
        Some("loop_detected") => "agent",
        _ => "api",
    }
}

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    claude_shaped::map(p, plan, &FLAVOR)
}
