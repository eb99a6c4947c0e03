//! GitHub Copilot CLI's hook events
//! (<https://docs.github.com/en/copilot/reference/copilot-cli-reference/cli-hooks-reference>,
//! read 2026-12-07).
//!
//! Its payload has two formats, picked by how the settings spell the event: camelCase names
//! (`preToolUse`) send camelCase fields (`sessionId`, `toolName`, `timestamp` in milliseconds)
//! and no event name; PascalCase names (`PreToolUse`) send Claude Code's snake_case fields
//! with `hook_event_name` and an RFC 3339 `timestamp`. Both are read; a camelCase payload's
//! event is known by its members, and topics use the camelCase names either way.

use super::plan::{Out, Plan};
use super::read::Payload;
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

/// In the reference's order of payloads, each with its PascalCase name where it has one.
const EVENTS: [HookEvent; 13] = [
    // `prompt` hooks: on sessionStart only.
    ev(
        "sessionStart",
        C.with(Handlers::PROMPT),
        "topic session_start",
    )
    .also("SessionStart")
    .stdout_unread(),
    ev("sessionEnd", C, "topic session_end")
        .also("SessionEnd")
        .closing()
        .stdout_unread(),
    ev("userPromptSubmitted", C, "agent_start")
        .also("UserPromptSubmit")
        .stdout_unread(),
    ev("preToolUse", C, "tool_call_start").also("PreToolUse"),
    ev("postToolUse", C, "tool_call").also("PostToolUse"),
    ev("postToolUseFailure", C, "tool_call").also("PostToolUseFailure"),
    ev("agentStop", C, "turn_complete, agent_end")
        .also("Stop")
        .closing(),
    ev("subagentStart", C, "topic"),
    ev("subagentStop", C, "topic").also("SubagentStop"),
    ev("errorOccurred", C, "error")
        .also("ErrorOccurred")
        .stdout_unread(),
    ev("preCompact", C, "topic")
        .also("PreCompact")
        .stdout_unread(),
    ev("permissionRequest", C, "topic").unsubscribed(
        "its payload is not documented: a camelCase one cannot be told from a preToolUse",
    ),
    // Its payload says `hook_event_name` "Notification" in both formats; the reference gives
    // it no PascalCase name to configure.
    ev("notification", C, "topic"),
];

const NAMES: [&str; 12] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://docs.github.com/en/copilot/reference/copilot-cli-reference/cli-hooks-reference",
    event_fields: &["hook_event_name"],
    infer_event: Some(infer),
    session_fields: &["sessionId", "session_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // JSON on stdout (`permissionDecision`, `decision`, `behavior`) is the answer; `{}` is
    // "fall through".
    answers_on_stdout: true,
    map,
};

/// A camelCase payload's event, by the members only it has.
fn infer(p: &Payload<'_>) -> Option<&'static str> {
    let has = |m: &str| p.has(m);
    Some(if has("toolResult") {
        "postToolUse"
    } else if has("toolName") && has("error") {
        "postToolUseFailure"
    } else if has("toolName") {
        "preToolUse"
    } else if has("errorContext") {
        "errorOccurred"
    } else if has("agentName") && has("stopReason") {
        "subagentStop"
    } else if has("agentName") {
        "subagentStart"
    } else if has("stopReason") {
        "agentStop"
    } else if has("trigger") {
        "preCompact"
    } else if has("reason") {
        "sessionEnd"
    } else if has("source") {
        "sessionStart"
    } else if has("prompt") {
        "userPromptSubmitted"
    } else {
        return None;
    })
}

/// The camelCase name of a PascalCase event (its [`alias`](HookEvent::alias)).
fn canonical(event: &str) -> &str {
    if event == "Notification" {
        return "notification";
    }
    EVENTS
        .iter()
        .find(|e| e.alias == Some(event))
        .map_or(event, |e| e.name)
}

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    plan.time = p.time_at(&["timestamp"]);
    // camelCase or snake_case, whichever the payload has.
    let name = |camel: &'static str, snake: &'static str| if p.has(camel) { camel } else { snake };
    let event = canonical(&p.event);
    match event {
        "sessionStart" => {
            plan.push(Out::topic("session_start"));
        }
        "sessionEnd" => {
            let success = match p.str_at(&["reason"]).as_deref() {
                Some("complete" | "user_exit") => Some(true),
                Some("error" | "abort" | "timeout") => Some(false),
                _ => None,
            };
            plan.push(Out::topic("session_end").success(success));
        }
        "userPromptSubmitted" => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        "preToolUse" => {
            let (tool, args) = (
                name("toolName", "tool_name"),
                name("toolArgs", "tool_input"),
            );
            plan.consume(&[tool, args]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&[tool])?)
                    .set("arguments", p.json(args, "arguments")?),
            );
        }
        // "After each tool completes successfully"; the snake_case format's `result_type`
        // also says `failure`, `denied` or `error`.
        "postToolUse" => {
            let tool = name("toolName", "tool_name");
            let (result, kind, text) = if p.has("toolResult") {
                ("toolResult", "resultType", "textResultForLlm")
            } else {
                ("tool_result", "result_type", "text_result_for_llm")
            };
            let success = match p.str_at(&[result, kind]) {
                Some(k) => k == "success",
                None => true,
            };
            plan.consume(&[tool, result]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&[tool])?)
                    .success(Some(success))
                    .field(
                        "output",
                        p.text_at(&[result, text]).or_else(|| p.text_at(&[result])),
                    ),
            );
        }
        "postToolUseFailure" => {
            let tool = name("toolName", "tool_name");
            plan.consume(&[tool, "error"]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&[tool])?)
                    .success(Some(false))
                    .set("output", p.text("error", "output")?),
            );
        }
        // The main agent finished a turn; `stopReason` `end_turn` is a clean end.
        "agentStop" => {
            let success = p
                .str_at(&[name("stopReason", "stop_reason")])
                .map(|r| r == "end_turn");
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(success)
                    .field("messages_count", None),
            );
        }
        // `errorContext`: `model_call`, `tool_execution`, `system` or `user_input`.
        "errorOccurred" => {
            let context = name("errorContext", "error_context");
            plan.consume(&[context]).push(
                Out::event(EventKind::Error)
                    .field("component", p.text_at(&[context]))
                    .field(
                        "message",
                        p.text_at(&["error", "message"])
                            .or_else(|| p.text_at(&["error"])),
                    ),
            );
        }
        // A subagent is named by its type (`agentName`), not an id of its own, and its tools'
        // payloads do not say it: not an emitter of its own.
        _ => {
            plan.push(Out::topic(event));
        }
    }
    Ok(())
}
