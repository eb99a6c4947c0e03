//! Windsurf's Cascade hooks (<https://docs.windsurf.com/windsurf/cascade/hooks>, read
//! 2026-12-07). Every payload has `agent_action_name` (the event), `trajectory_id` (the
//! session), `execution_id`, `timestamp` and the action's details in `tool_info`.
//!
//! The page shows no event for a session's start or end, and no exit status but a shell
//! command's `exit_code`.

use super::plan::{Out, Plan};
use super::read::{Payload, missing, quote};
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

const EVENTS: [HookEvent; 11] = [
    ev("pre_user_prompt", C, "agent_start").stdout_unread(),
    ev("pre_read_code", C, "tool_call_start").stdout_unread(),
    ev("post_read_code", C, "tool_call").stdout_unread(),
    ev("pre_write_code", C, "tool_call_start").stdout_unread(),
    ev("post_write_code", C, "tool_call").stdout_unread(),
    ev("pre_run_command", C, "tool_call_start").stdout_unread(),
    ev("post_run_command", C, "tool_call").stdout_unread(),
    ev("pre_mcp_tool_use", C, "tool_call_start").stdout_unread(),
    ev("post_mcp_tool_use", C, "tool_call").stdout_unread(),
    ev("post_cascade_response", C, "turn_complete, agent_end")
        .stdout_unread()
        .closing(),
    ev("post_setup_worktree", C, "topic").stdout_unread(),
];

const NAMES: [&str; 11] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://docs.windsurf.com/windsurf/cascade/hooks",
    event_fields: &["agent_action_name"],
    infer_event: None,
    session_fields: &["trajectory_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // A pre-hook blocks by exiting 2; the page does not say stdout is read.
    answers_on_stdout: false,
    map,
};

const INFO: &str = "tool_info";

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    plan.time = p.time_at(&["timestamp"]);
    let event = p.event.as_str();
    // The built-in actions, by the tool name PRX gives them.
    let builtin = match event {
        "pre_read_code" | "post_read_code" => Some("read_code"),
        "pre_write_code" | "post_write_code" => Some("write_code"),
        "pre_run_command" | "post_run_command" => Some("run_command"),
        _ => None,
    };
    match (event, builtin) {
        ("pre_user_prompt", _) => {
            plan.spread = Some(INFO);
            plan.push(Out::event(EventKind::AgentStart));
        }
        // After Cascade's response: the turn is over; how it ended is not said.
        ("post_cascade_response", _) => {
            plan.spread = Some(INFO);
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(None)
                    .field("messages_count", None),
            );
        }
        (_, Some(tool)) if event.starts_with("pre_") => {
            plan.consume(&[INFO]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", quote(tool))
                    .set("arguments", p.json(INFO, "arguments")?),
            );
        }
        (_, Some(tool)) => {
            let output = match tool {
                "read_code" => "content",
                _ => "output",
            };
            // A shell command's exit code; the other actions give no status.
            let success = (tool == "run_command")
                .then(|| p.number_at(&[INFO, "exit_code"]).map(|c| c == "0"))
                .flatten();
            plan.spread = Some(INFO);
            plan.spread_consumed = vec![output];
            plan.push(
                Out::event(EventKind::ToolCall)
                    .set("tool", quote(tool))
                    .success(success)
                    .field("output", p.text_at(&[INFO, output])),
            );
        }
        ("pre_mcp_tool_use", _) => {
            plan.spread = Some(INFO);
            plan.spread_consumed = vec!["mcp_tool_name", "mcp_tool_arguments"];
            plan.push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&[INFO, "mcp_tool_name"])?)
                    .set(
                        "arguments",
                        p.json_at(&[INFO, "mcp_tool_arguments"])
                            .ok_or_else(|| missing("tool_info.mcp_tool_arguments", "arguments"))?,
                    ),
            );
        }
        ("post_mcp_tool_use", _) => {
            plan.spread = Some(INFO);
            plan.spread_consumed = vec!["mcp_tool_name", "mcp_result"];
            plan.push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&[INFO, "mcp_tool_name"])?)
                    .success(None)
                    .field("output", p.text_at(&[INFO, "mcp_result"])),
            );
        }
        _ => {
            plan.topic(p);
        }
    }
    Ok(())
}
