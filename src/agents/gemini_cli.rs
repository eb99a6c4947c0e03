//! Gemini CLI's hook events (<https://geminicli.com/docs/hooks/reference>, read 2026-12-07; the
//! same text ships in `@google/gemini-cli` 0.61.0).

use super::plan::{Out, Plan, Tokens};
use super::read::{Payload, quote, string};
use super::{Handlers, HookEvent, Spec, TranslateError, ev, subscribed};
use crate::EventKind;

const C: Handlers = Handlers::COMMAND;

/// The shell tool's name.
const SHELL: &str = "run_shell_command";

/// In the reference's lifecycle order (`connect` writes them in this order).
const EVENTS: [HookEvent; 11] = [
    ev("SessionStart", C, "topic session_start"),
    ev("BeforeAgent", C, "agent_start"),
    ev("BeforeModel", C, "llm_request"),
    ev(
        "AfterModel",
        C,
        "llm_response (the chunk with a finishReason; the others: topic)",
    )
    .noted("fires for every streamed chunk of a reply"),
    ev("BeforeToolSelection", C, "topic"),
    ev("BeforeTool", C, "tool_call_start"),
    ev("AfterTool", C, "tool_call"),
    ev("AfterAgent", C, "turn_complete, agent_end").closing(),
    ev("PreCompress", C, "topic").noted("run in the background"),
    ev("Notification", C, "topic"),
    ev("SessionEnd", C, "topic session_end")
        .closing()
        .noted("Gemini CLI does not wait for its hooks: one may not finish before it exits"),
];

const NAMES: [&str; 11] = subscribed(&EVENTS);

pub(crate) static SPEC: Spec = Spec {
    docs: "https://geminicli.com/docs/hooks/reference",
    event_fields: &["hook_event_name"],
    infer_event: None,
    session_fields: &["session_id"],
    hook_events: &EVENTS,
    events: &NAMES,
    // stdout must be the JSON answer; with stdout empty, stderr is read.
    answers_on_stdout: true,
    map,
};

fn map(p: &Payload<'_>, plan: &mut Plan) -> Result<(), TranslateError> {
    plan.time = p.time_at(&["timestamp"]);
    match p.event.as_str() {
        "SessionStart" => {
            plan.push(Out::topic("session_start"));
        }
        "SessionEnd" => {
            plan.push(Out::topic("session_end"));
        }
        // After the user submitted a prompt, before planning: once per turn.
        "BeforeAgent" => {
            plan.push(Out::event(EventKind::AgentStart));
        }
        // Once per turn after the final response; a failed turn is not told apart.
        "AfterAgent" => {
            plan.push(Out::event(EventKind::TurnComplete)).push(
                Out::event(EventKind::AgentEnd)
                    .success(None)
                    .field("messages_count", None),
            );
        }
        "BeforeModel" => {
            plan.push(
                Out::event(EventKind::LlmRequest)
                    .field("provider", None)
                    .field("model", p.text_at(&["llm_request", "model"]))
                    .field(
                        "messages_count",
                        p.len_at(&["llm_request", "messages"])
                            .map(|n| n.to_string()),
                    ),
            );
        }
        "AfterModel" => match finish_reason(p) {
            // The last chunk of a response: its usage is the response's.
            Some(reason) => {
                let usage = |name: &str| p.count_at(&["llm_response", "usageMetadata", name]);
                let cached = usage("cachedContentTokenCount");
                // Gemini counts cached tokens in the prompt's; PRX's input_tokens, as
                // Anthropic's usage, does not.
                let tokens = Tokens {
                    input: usage("promptTokenCount").map(|n| n.saturating_sub(cached.unwrap_or(0))),
                    output: usage("candidatesTokenCount"),
                    cache_read: cached,
                    cache_creation: None,
                };
                let out = Out::event(EventKind::LlmResponse)
                    .field("provider", None)
                    .field("model", p.text_at(&["llm_request", "model"]))
                    .field("duration_ms", None)
                    .success(None);
                plan.push(tokens.fields(out).set("finish_reason", quote(&reason)));
            }
            None => {
                plan.topic(p);
            }
        },
        "BeforeTool" => {
            plan.consume(&["tool_name", "tool_input"]).push(
                Out::event(EventKind::ToolCallStart)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .set("arguments", p.json("tool_input", "arguments")?),
            );
        }
        // `tool_response` is the tool's result; a tool that failed sets its `error`. A shell
        // command that ran and exited non-zero sets none (its exit code is only in the
        // result's text, never parsed): `success` is said for it only when `error` is set.
        "AfterTool" => {
            let failed = p
                .at(&["tool_response", "error"])
                .is_some_and(|e| e.get() != "null");
            let shell = p.str_at(&["tool_name"]).as_deref() == Some(SHELL);
            let success = match (failed, shell) {
                (true, _) => Some(false),
                (false, true) => None,
                (false, false) => Some(true),
            };
            plan.consume(&["tool_name", "tool_response"]).push(
                Out::event(EventKind::ToolCall)
                    .set("tool", p.tool_at(&["tool_name"])?)
                    .success(success)
                    .set("output", p.text("tool_response", "output")?),
            );
        }
        _ => {
            plan.topic(p);
        }
    }
    Ok(())
}

/// The first candidate's `finishReason` that is set: the chunk ends the response.
fn finish_reason(p: &Payload<'_>) -> Option<String> {
    p.array_at(&["llm_response", "candidates"])
        .into_iter()
        .filter_map(|c| {
            super::read::object(c)?
                .into_iter()
                .find(|(k, _)| k == "finishReason")
                .and_then(|(_, v)| string(v))
        })
        .find(|r| !r.is_empty())
}
