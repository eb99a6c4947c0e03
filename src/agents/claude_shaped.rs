//! The mapping shared by agents whose hooks follow Claude Code's (Claude Code, Qwen Code,
//! Factory Droid): `hook_event_name`, `session_id`, `tool_name`/`tool_input`/`tool_response`,
//! `agent_id` inside a subagent. What differs between them is a [`Flavor`].

use super::TranslateError;
use super::plan::{Out, Plan};
use super::read::{Payload, quote};
use crate::EventKind;

/// What one Claude-shaped agent's documentation says that another's does not.
pub(crate) struct Flavor {
    /// `Stop` fires only when a turn ended cleanly (a failed one fires `StopFailure`):
    /// `agent_end.success` is true. Otherwise it is left out.
    pub stop_is_success: bool,
    /// `PostToolUse` fires only after a tool succeeded (a failed one fires
    /// `PostToolUseFailure`): `tool_call.success` is true. Otherwise it is left out.
    pub post_is_success: bool,
    /// `UserPromptSubmit` opens a turn only when the payload has this member (Qwen Code fires
    /// it for tool results too, and marks the user's submissions with `submitted_prompt`);
    /// without it the event is a topic.
    pub prompt_needs: Option<&'static str>,
    /// `StopFailure`'s `component`, from its `error`.
    pub failure_component: fn(Option<&str>) -> &'static str,
}

/// The lines of a Claude-shaped payload.
pub(crate) fn map(p: &Payload<'_>, plan: &mut Plan, f: &Flavor) -> Result<(), TranslateError> {
    // Inside a subagent (and on its SubagentStart and SubagentStop) the payload carries the
    // subagent's id: its events are its own emitter's.
    plan.subagent(p, "agent_id", None);
    plan.time = p.time_at(&["timestamp"]);
    let sub = plan.subagent.is_some();
    match p.event.as_str() {
        "SessionStart" => {
            plan.push(Out::topic("session_start"));
        }
        "SessionEnd" => {
            plan.push(Out::topic("session_end"));
        }
        "UserPromptSubmit" => match f.prompt_needs {
            Some(member) if !p.has(member) => {
                plan.topic(p);
            }
            _ => {
                plan.push(Out::event(EventKind::AgentStart));
            }
        },
        "PreToolUse" => {
            plan.consume(&["tool_name", "tool_input"]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .set("arguments", p.json("tool_input", "arguments")?),
            );
        }
        "PostToolUse" => {
            plan.consume(&["tool_name", "tool_response"]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .success(f.post_is_success.then_some(true))
                    .set("output", p.text("tool_response", "output")?),
            );
        }
        "PostToolUseFailure" => {
            plan.consume(&["tool_name", "error"]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .success(Some(false))
                    .set("output", p.text("error", "output")?),
            );
        }
        "Stop" => {
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(f.stop_is_success.then_some(true))
                    .field("messages_count", None),
            );
        }
        // The turn ended on an error (`rate_limit`, `overloaded`, …) instead of `Stop`.
        "StopFailure" => {
            let component = (f.failure_component)(p.str_at(&["error"]).as_deref());
            plan.consume(&["error"])
                .push(
                    Out::event(EventKind::Error)
                        .set("component", quote(component))
                        .set("message", p.text("error", "message")?),
                )
                .push(
                    Out::event(EventKind::AgentEnd)
                        .success(Some(false))
                        .field("messages_count", None),
                );
        }
        // A subagent's run is a turn of its own emitter.
        "SubagentStart" if sub => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        "SubagentStop" if sub => {
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(None)
                    .field("messages_count", None),
            );
        }
        _ => {
            plan.topic(p);
        }
    }
    Ok(())
}

/// Claude Code's `StopFailure` errors are all the model API's.
pub(crate) fn api(_: Option<&str>) -> &'static str {
    "api"
}
