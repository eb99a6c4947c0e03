//! Kiro CLI's hooks (<https://kiro.dev/docs/cli/hooks>, read 2026-12-07), defined in an agent's
//! configuration. A hook gets `hook_event_name` (camelCase: `agentSpawn`) and `cwd`, and for
//! tools `tool_name`, `tool_input` and (`postToolUse`) `tool_response`. The page shows no
//! session id: give one (`send --session`).

use super::plan::{Out, Plan};
use super::read::Payload;
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

const EVENTS: [HookEvent; 5] = [
    ev("agentSpawn", C, "topic session_start").stdout_unread(),
    ev("userPromptSubmit", C, "agent_start").stdout_unread(),
    ev("preToolUse", C, "tool_call_start").stdout_unread(),
    ev("postToolUse", C, "tool_call").stdout_unread(),
    ev("stop", C, "turn_complete, agent_end")
        .stdout_unread()
        .closing(),
];

const NAMES: [&str; 5] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://kiro.dev/docs/cli/hooks",
    event_fields: &["hook_event_name"],
    infer_event: None,
    session_fields: &["session_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // stdout is captured (added to the context on agentSpawn and userPromptSubmit), not an
    // answer: a logging hook prints nothing.
    answers_on_stdout: false,
    map,
};

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    match p.event.as_str() {
        // The agent starts: the session's start.
        "agentSpawn" => {
            plan.push(Out::topic("session_start"));
        }
        "userPromptSubmit" => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        "preToolUse" => {
            plan.consume(&["tool_name", "tool_input"]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .set("arguments", p.json("tool_input", "arguments")?),
            );
        }
        // The page does not say whether it fires after a failure, nor how one would show.
        "postToolUse" => {
            plan.consume(&["tool_name", "tool_response"]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .success(None)
                    .field("output", p.text_at(&["tool_response"])),
            );
        }
        "stop" => {
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
