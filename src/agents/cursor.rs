//! Cursor's hook events (<https://cursor.com/docs/hooks>, read 2026-12-07, with payloads
//! captured from Cursor 3.x). The session is the conversation.
//!
//! One shell command fires both families of tool events, `preToolUse`/`postToolUse` and
//! `beforeShellExecution`/`afterShellExecution` (MCP tools likewise): the generic ones are
//! the tool calls (every tool, with `tool_use_id`, `duration` and, for the shell, the exit
//! code), the shell and MCP ones are topics, so a command is one `tool_call_start` and one
//! `tool_call`.

use super::plan::{Out, Plan, Tokens};
use super::read::{Payload, object, quote};
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

/// In the documentation's order (`connect` writes them in this order).
const EVENTS: [HookEvent; 21] = [
    ev("sessionStart", C, "topic session_start"),
    ev("beforeSubmitPrompt", C, "agent_start"),
    ev("preToolUse", C, "tool_call_start"),
    ev("postToolUse", C, "tool_call"),
    ev("postToolUseFailure", C, "tool_call"),
    ev("beforeShellExecution", C, "topic"),
    ev("afterShellExecution", C, "topic"),
    ev("beforeMCPExecution", C, "topic"),
    ev("afterMCPExecution", C, "topic"),
    ev("beforeReadFile", C, "topic"),
    ev("afterFileEdit", C, "topic"),
    ev("subagentStart", C, "agent_start (the subagent's)"),
    ev(
        "subagentStop",
        C,
        "turn_complete (completed), agent_end (the subagent's)",
    )
    .closing(),
    ev("preCompact", C, "topic"),
    ev("afterAgentResponse", C, "llm_response"),
    ev("afterAgentThought", C, "topic"),
    ev("stop", C, "turn_complete (completed), agent_end").closing(),
    ev("sessionEnd", C, "topic session_end (and error when it says one)").closing(),
    ev("beforeTabFileRead", C, "topic"),
    ev("afterTabFileEdit", C, "topic"),
    ev("workspaceOpen", C, "topic").unsubscribed(
        "new in Cursor 3.6 with no documented payload; a Cursor that does not know an event name may refuse the whole file",
    ),
];

const NAMES: [&str; 20] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://cursor.com/docs/hooks",
    event_fields: &["hook_event_name"],
    infer_event: None,
    session_fields: &["conversation_id", "session_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // JSON on stdout (`permission`, `followup_message`, …) is the answer.
    answers_on_stdout: true,
    map,
};

/// The four token counts of `stop` and `afterAgentResponse`, moved to PRX's names.
const TOKENS: [&str; 4] = [
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
];

fn tokens(p: &Payload<'_>, plan: &mut Plan, out: Out) -> Out {
    plan.consume(&TOKENS);
    let n = |name: &str| p.count_at(&[name]);
    Tokens {
        input: n("input_tokens"),
        output: n("output_tokens"),
        cache_read: n("cache_read_tokens"),
        cache_creation: n("cache_write_tokens"),
    }
    .fields(out)
}

/// How a turn or a subagent ended: `completed` is clean, `aborted` and `error` are not.
fn clean(p: &Payload<'_>, member: &str) -> Option<bool> {
    match p.str_at(&[member])?.as_str() {
        "completed" => Some(true),
        "aborted" | "error" => Some(false),
        _ => None,
    }
}

/// A turn's end: `turn_complete` unless it did not end cleanly, then `agent_end`.
fn end(plan: &mut Plan, success: Option<bool>, end: Out) {
    if success != Some(false) {
        plan.push(Out::event(EventKind::TurnComplete));
    }
    plan.push(end);
}

/// `duration` (milliseconds) as `duration_ms`.
fn duration(p: &Payload<'_>, plan: &mut Plan, out: Out) -> Out {
    plan.consume(&["duration"]);
    out.field(
        "duration_ms",
        p.number_at(&["duration"]).map(str::to_string),
    )
}

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    match p.event.as_str() {
        "sessionStart" => {
            plan.push(Out::topic("session_start"));
        }
        "sessionEnd" => {
            let reason = p.str_at(&["reason"]);
            let success = match reason.as_deref() {
                Some("completed" | "window_close" | "user_close") => Some(true),
                Some("aborted" | "error") => Some(false),
                _ => None,
            };
            plan.push(Out::topic("session_end").success(success));
            if reason.as_deref() == Some("error")
                && let Some(message) = p.text_at(&["error_message"])
            {
                plan.push(
                    Out::event(EventKind::Error)
                        .set("component", quote("session"))
                        .set("message", message),
                );
            }
        }
        "beforeSubmitPrompt" => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        "stop" => {
            let success = clean(p, "status");
            let out = Out::event(EventKind::AgentEnd)
                .success(success)
                .field("messages_count", None);
            let out = tokens(p, plan, out);
            end(plan, success, out);
        }
        // The agent's reply: the model, and the tokens it took.
        "afterAgentResponse" => {
            plan.consume(&["model"]);
            let out = Out::event(EventKind::LlmResponse)
                .field("provider", None)
                .field("model", p.text_at(&["model"]))
                .field("duration_ms", None)
                .success(None);
            let out = tokens(p, plan, out);
            plan.push(out);
        }
        "preToolUse" => {
            plan.consume(&["tool_name", "tool_input"]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .set("arguments", p.json("tool_input", "arguments")?),
            );
        }
        // A shell command's `tool_output` is a JSON text with its `exitCode`; other tools
        // that get here succeeded (failures are `postToolUseFailure`).
        "postToolUse" => {
            let exit = p.str_at(&["tool_output"]).and_then(|out| exit_code(&out));
            plan.consume(&["tool_name", "tool_output"]);
            let out = Out::event(EventKind::ToolCall)
                .set("tool", p.tool_at(&["tool_name"])?)
                .success(Some(exit.is_none_or(|code| code == 0)))
                .field("output", p.text_at(&["tool_output"]));
            let out = duration(p, plan, out);
            plan.push(out);
        }
        "postToolUseFailure" => {
            plan.consume(&["tool_name", "error_message"]);
            let out = Out::event(EventKind::ToolCall)
                .set("tool", p.tool_at(&["tool_name"])?)
                .success(Some(false))
                .field("output", p.text_at(&["error_message"]));
            let out = duration(p, plan, out);
            plan.push(out);
        }
        // A subagent is an emitter of its own, under its parent conversation.
        "subagentStart" | "subagentStop" if p.str_at(&["subagent_id"]).is_some() => {
            plan.subagent(p, "subagent_id", p.str_at(&["parent_conversation_id"]));
            if p.event == "subagentStart" {
                plan.push(Out::event(EventKind::AgentStart));
            } else {
                let success = clean(p, "status");
                plan.consume(&["message_count"]);
                let out = Out::event(EventKind::AgentEnd).success(success).field(
                    "messages_count",
                    p.count_at(&["message_count"]).map(|n| n.to_string()),
                );
                end(plan, success, out);
            }
        }
        _ => {
            plan.topic(p);
        }
    }
    Ok(())
}

/// The `exitCode` of a shell tool's output (a JSON object in a string).
fn exit_code(output: &str) -> Option<i64> {
    let members = object(serde_json::from_str(output).ok()?)?;
    members
        .iter()
        .find(|(k, _)| k == "exitCode")
        .and_then(|(_, v)| v.get().parse().ok())
}
