//! Cline's hooks (<https://docs.cline.bot/customization/hooks>, read 2026-12-07). A hook is an
//! executable script Cline runs with one JSON object on stdin: `taskId`, `clineVersion`,
//! `timestamp` (milliseconds), `workspacePath`, and one member named after the hook in
//! camelCase (`preToolUse: {tool, parameters}`), which also names the event. The hook
//! reference page adds `hookName`, read first when present.
//!
//! The session is the task. Cline has no event that ends a turn, only the task's end
//! (`TaskComplete`, `TaskCancel`): a task is the turn, from `TaskStart` (or `TaskResume`) on.

use super::plan::{Out, Plan};
use super::read::Payload;
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

const EVENTS: [HookEvent; 8] = [
    ev("TaskStart", C, "agent_start"),
    ev("TaskResume", C, "agent_start"),
    ev("TaskCancel", C, "agent_end").closing(),
    ev("TaskComplete", C, "turn_complete, agent_end").closing(),
    ev("PreToolUse", C, "tool_call_start"),
    ev("PostToolUse", C, "tool_call"),
    ev("UserPromptSubmit", C, "topic"),
    ev("PreCompact", C, "topic"),
];

const NAMES: [&str; 8] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://docs.cline.bot/customization/hooks",
    event_fields: &["hookName"],
    infer_event: Some(infer),
    session_fields: &["taskId"],
    hook_events: &EVENTS,
    events: &NAMES,
    // A JSON object on stdout (`cancel`, `contextModification`) is the answer.
    answers_on_stdout: true,
    map,
};

/// Each hook's member, and the hook.
const KEYS: [(&str, &str); 8] = [
    ("taskStart", "TaskStart"),
    ("taskResume", "TaskResume"),
    ("taskCancel", "TaskCancel"),
    ("taskComplete", "TaskComplete"),
    ("preToolUse", "PreToolUse"),
    ("postToolUse", "PostToolUse"),
    ("userPromptSubmit", "UserPromptSubmit"),
    ("preCompact", "PreCompact"),
];

fn infer(p: &Payload<'_>) -> Option<&'static str> {
    KEYS.iter().find(|(k, _)| p.has(k)).map(|(_, e)| *e)
}

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    plan.time = p.time_at(&["timestamp"]);
    let Some(&(key, _)) = KEYS.iter().find(|(_, e)| *e == p.event) else {
        plan.topic(p);
        return Ok(());
    };
    // The hook's own member, spread onto the event's payload.
    plan.spread = Some(key);
    match p.event.as_str() {
        "TaskStart" | "TaskResume" => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        // "When a task finishes successfully".
        "TaskComplete" => {
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(Some(true))
                    .field("messages_count", None),
            );
        }
        // The user cancelled the task.
        "TaskCancel" => {
            plan.push(
                Out::event(EventKind::AgentEnd)
                    .success(Some(false))
                    .field("messages_count", None),
            );
        }
        "PreToolUse" => {
            let tool = if p.at(&[key, "tool"]).is_some() {
                "tool"
            } else {
                "toolName"
            };
            plan.spread_consumed = vec![tool, "parameters"];
            plan.push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&[key, tool])?)
                    .set(
                        "arguments",
                        p.json_at(&[key, "parameters"]).ok_or_else(|| {
                            super::read::missing(&format!("{key}.parameters"), "arguments")
                        })?,
                    ),
            );
        }
        // After the tool ran, successfully or not: its `success` says.
        "PostToolUse" => {
            let tool = if p.at(&[key, "tool"]).is_some() {
                "tool"
            } else {
                "toolName"
            };
            plan.spread_consumed = vec![tool, "success", "result", "durationMs"];
            plan.push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&[key, tool])?)
                    .success(p.bool_at(&[key, "success"]))
                    .field("output", p.text_at(&[key, "result"]))
                    .field(
                        "duration_ms",
                        p.number_at(&[key, "durationMs"]).map(str::to_string),
                    ),
            );
        }
        // The task, not the prompt, is the turn.
        _ => {
            plan.spread = None;
            plan.topic(p);
        }
    }
    Ok(())
}
