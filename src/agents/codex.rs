//! OpenAI Codex CLI: its hooks (<https://developers.openai.com/codex/hooks>, read 2026-12-07,
//! with the input schemas of the released codex 0.171.0; one JSON object on stdin, its kind
//! in `hook_event_name`) and its older `notify` program
//! (<https://developers.openai.com/codex/config-advanced#notifications>: the object as the
//! program's last argument, its kind in `type`).

use super::plan::{Out, Plan};
use super::read::{Payload, quote};
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

const EVENTS: [HookEvent; 12] = [
    ev("SessionStart", C, "topic session_start"),
    ev(
        "UserPromptSubmit",
        C,
        "agent_start (inside a subagent: topic)",
    ),
    ev("PreToolUse", C, "tool_call_start"),
    ev("PermissionRequest", C, "topic"),
    ev("PostToolUse", C, "tool_call"),
    ev("PreCompact", C, "topic"),
    ev("PostCompact", C, "topic"),
    ev("SubagentStart", C, "agent_start (the subagent's)"),
    ev(
        "SubagentStop",
        C,
        "turn_complete, agent_end (the subagent's)",
    )
    .closing(),
    ev("Stop", C, "turn_complete, agent_end").closing(),
    ev("Interrupt", C, "agent_end").closing(),
    ev("SessionEnd", C, "topic session_end").closing(),
];

const NAMES: [&str; 12] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://developers.openai.com/codex/hooks",
    event_fields: &["hook_event_name", "type"],
    infer_event: None,
    session_fields: &["session_id", "thread-id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // JSON on stdout is the answer (`Stop` and `Interrupt` take nothing else); the `notify`
    // program's stdout is ignored.
    answers_on_stdout: true,
    map,
};

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    // A subagent's hooks carry the parent's `session_id` and the subagent's `agent_id`.
    plan.subagent(p, "agent_id", None);
    let sub = plan.subagent.is_some();
    match p.event.as_str() {
        "SessionStart" => {
            plan.push(Out::topic("session_start"));
        }
        // Only the root thread's shutdown fires it; the turn was closed by `Stop` or
        // `Interrupt` already.
        "SessionEnd" => {
            plan.push(Out::topic("session_end"));
        }
        // Inside a subagent the turn opened at `SubagentStart`.
        "UserPromptSubmit" if !sub => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        "PreToolUse" => {
            plan.consume(&["tool_name", "tool_input"]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .set("arguments", p.json("tool_input", "arguments")?),
            );
        }
        // Fired after a tool ran, a failed shell command too; Codex does not say whether it
        // succeeded: `success` is left out.
        "PostToolUse" => {
            plan.consume(&["tool_name", "tool_response"]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .success(None)
                    .set("output", p.text("tool_response", "output")?),
            );
        }
        "Stop" => {
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(None)
                    .field("messages_count", None),
            );
        }
        // The user interrupted the turn: it ends, not cleanly.
        "Interrupt" => {
            plan.push(
                Out::event(EventKind::AgentEnd)
                    .success(Some(false))
                    .field("messages_count", None),
            );
        }
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
        // Not in codex 0.171.0 (a schema for it exists in the source); should a version send
        // it, it is Claude Code's.
        "StopFailure" => {
            plan.consume(&["error"])
                .push(
                    Out::event(EventKind::Error)
                        .set("component", quote("api"))
                        .set("message", p.text("error", "message")?),
                )
                .push(
                    Out::event(EventKind::AgentEnd)
                        .success(Some(false))
                        .field("messages_count", None),
                );
        }
        // `notify` has no event that opens a turn: no `agent_end` to pair with one.
        "agent-turn-complete" => {
            plan.push(Out::event(EventKind::TurnComplete));
        }
        _ => {
            plan.topic(p);
        }
    }
    Ok(())
}
