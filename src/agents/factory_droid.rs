//! Factory Droid's hook events (<https://docs.factory.ai/reference/hooks-reference>, read
//! 2026-12-07). Claude-shaped: [`claude_shaped`](super::claude_shaped) maps them. Its pages
//! do not say that `PostToolUse` fires only after a success or that `Stop` does not fire on
//! an error, so `success` is left out of both.

use super::claude_shaped::{self, Flavor};
use super::plan::Plan;
use super::read::Payload;
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};

/// "Currently only `command` is supported".
const C: Handlers = Handlers::COMMAND;

const EVENTS: [HookEvent; 9] = [
    ev("SessionStart", C, "topic session_start"),
    ev("UserPromptSubmit", C, "agent_start"),
    ev("PreToolUse", C, "tool_call_start"),
    ev("PostToolUse", C, "tool_call"),
    ev("Notification", C, "topic"),
    ev("PreCompact", C, "topic"),
    ev(
        "SubagentStop",
        C,
        "turn_complete, agent_end (the subagent's; without agent_id: topic)",
    )
    .closing(),
    ev("Stop", C, "turn_complete, agent_end").closing(),
    ev("SessionEnd", C, "topic session_end").closing(),
];

const NAMES: [&str; 9] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://docs.factory.ai/reference/hooks-reference",
    // Claude Code's names; camelCase ones have been seen too.
    event_fields: &["hook_event_name", "hookEventName"],
    infer_event: None,
    session_fields: &["session_id", "sessionId"],
    hook_events: &EVENTS,
    events: &NAMES,
    // JSON on stdout is the answer, as Claude Code's.
    answers_on_stdout: true,
    map,
};

const FLAVOR: Flavor = Flavor {
    stop_is_success: false,
    post_is_success: false,
    prompt_needs: None,
    failure_component: claude_shaped::api,
};

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    claude_shaped::map(p, plan, &FLAVOR)
}
