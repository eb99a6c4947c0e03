//! Claude Code's hook events (<https://code.claude.com/docs/en/hooks>, read 2026-12-07: the
//! reference as of Claude Code 2.1.240, and the event names and input fields of the released
//! 2.1.332). Claude-shaped: [`claude_shaped`](super::claude_shaped) maps them.

use super::claude_shaped::{self, Flavor};
use super::plan::Plan;
use super::read::Payload;
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};

/// `command`, `http` and `mcp_tool`.
const CHM: Handlers = Handlers::COMMAND
    .with(Handlers::HTTP)
    .with(Handlers::MCP_TOOL);
/// All five types.
const ALL: Handlers = CHM.with(Handlers::PROMPT).with(Handlers::AGENT);
/// `SessionStart` and `Setup`: "They don't support `http`, `prompt`, or `agent` hooks".
const CM: Handlers = Handlers::COMMAND.with(Handlers::MCP_TOOL);

/// In the reference's lifecycle order (`connect` writes them in this order).
const EVENTS: [HookEvent; 33] = [
    ev("Setup", CM, "topic"),
    ev("SessionStart", CM, "topic session_start"),
    ev("InstructionsLoaded", CHM, "topic"),
    ev("UserPromptSubmit", ALL, "agent_start"),
    ev("UserPromptExpansion", ALL, "topic"),
    ev("MessageDisplay", CHM, "topic").unsubscribed(
        "fires for every batch of lines of a streamed reply and holds the display until the hook returns",
    ),
    ev("PreToolUse", ALL, "tool_call_start"),
    // Not `agent`, as the binary's own error says.
    ev(
        "PermissionRequest",
        CHM.with(Handlers::PROMPT),
        "topic",
    ),
    ev("PermissionDenied", ALL, "topic"),
    ev("PostToolUse", ALL, "tool_call"),
    ev("PostToolUseFailure", ALL, "tool_call"),
    ev("PostToolBatch", ALL, "topic"),
    ev("Notification", CHM, "topic"),
    ev("SubagentStart", CHM, "agent_start (the subagent's)"),
    ev("SubagentStop", ALL, "turn_complete, agent_end (the subagent's)").closing(),
    ev("TaskCreated", ALL, "topic"),
    ev("TaskCompleted", ALL, "topic"),
    ev("Stop", ALL, "turn_complete, agent_end").closing(),
    ev("StopFailure", CHM, "error, agent_end").closing(),
    ev("TeammateIdle", ALL, "topic"),
    ev("PreCompact", CHM, "topic"),
    ev("PostCompact", CHM, "topic"),
    // Claude Code waits for a hook here before it switches: ours is async (a command) or
    // answered at once (`--http`).
    ev("PreModelSwitch", CHM, "topic").noted(NEWER),
    ev("PostModelSwitch", CHM, "topic").noted(NEWER),
    ev("Elicitation", CHM, "topic"),
    ev("ElicitationResult", CHM, "topic"),
    ev("ConfigChange", CHM, "topic"),
    ev("CwdChanged", CHM, "topic"),
    ev("DirectoryAdded", CHM, "topic").noted(NEWER),
    ev("FileChanged", CHM, "topic"),
    ev("WorktreeCreate", CHM, "topic").taking_over(
        "a hook there replaces Claude Code's own `git worktree add` and must print the new path",
    ),
    ev("WorktreeRemove", CHM, "topic")
        .taking_over("a hook there replaces Claude Code's own worktree removal"),
    ev("SessionEnd", CHM, "topic session_end").closing(),
];

/// What a team sharing a settings file should know of an event new in 2.1.2xx.
const NEWER: &str = "new in Claude Code 2.1.219 to 2.1.251: an older one since 2.1.101 skips the entry and runs the rest (one before 2.1.101 refuses the whole file)";

const NAMES: [&str; 30] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://code.claude.com/docs/en/hooks",
    event_fields: &["hook_event_name"],
    infer_event: None,
    session_fields: &["session_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // stdout whose first character is `{` is the hook's JSON answer.
    answers_on_stdout: true,
    map,
};

/// "Runs immediately after a tool completes successfully" (failures are
/// `PostToolUseFailure`); `Stop` does not fire when an API error ends the turn
/// (`StopFailure` does) nor on an interrupt.
const FLAVOR: Flavor = Flavor {
    stop_is_success: true,
    post_is_success: true,
    prompt_needs: None,
    failure_component: claude_shaped::api,
};

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    claude_shaped::map(p, plan, &FLAVOR)
}
