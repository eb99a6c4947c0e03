//! Model calls read from a coding agent's transcript: Claude Code's session `.jsonl` and
//! Codex's rollout `.jsonl` (docs/agents.md § Transcripts). Their hooks say nothing of model
//! calls or tokens; their transcripts do.
//!
//! Only what a span needs is read (the model, the four token counts, the times, an id); no
//! content (prompts, answers, tool input or output) leaves this module.

use super::Agent;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::collections::HashMap;

/// One model call: a request and the answer it got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelCall {
    /// Stable within its transcript, whichever part of it was read (Claude Code's request id,
    /// else its message id and time; Codex's response id and record number, else its time):
    /// what the derived events' ids are made from.
    pub id: String,
    /// The model that answered (at most [`MAX_MODEL_BYTES`], printable ASCII; else empty).
    pub model: String,
    /// When the request went out (RFC 3339), where the transcript says.
    pub start: Option<String>,
    /// When its answer was written (RFC 3339).
    pub end: String,
    /// Its token counts.
    pub usage: Usage,
}

/// Token counts of one model call, in the meaning every agent's tokens have here (docs/agents.md
/// § The rules every agent follows): `input` leaves out the input read from or written to the
/// cache, which `cache_read` and `cache_creation` count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Input tokens neither read from nor written to the cache.
    pub input: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
    /// Input tokens read from the provider's cache.
    pub cache_read: u64,
    /// Input tokens written to the provider's cache.
    pub cache_creation: u64,
}

/// The longest model name kept.
pub const MAX_MODEL_BYTES: usize = 128;

/// Whether `agent` writes a transcript this module reads.
pub fn reads(agent: Agent) -> bool {
    matches!(agent, Agent::ClaudeCode | Agent::Codex)
}

/// The model calls in `text` (whole lines of a transcript, in file order), oldest first.
/// `first_read`: nothing of this file was read before, so only the calls of its last turn are
/// returned (those after the last prompt). Lines that are not JSON, or not of a shape read
/// here, are passed over.
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::{Agent, transcript};
/// let text = br#"{"type":"user","message":{"role":"user","content":"hi"},"timestamp":"2026-12-07T10:00:00Z"}
/// {"type":"api-request","id":"r1","timestamp":"2026-12-07T10:00:01Z"}
/// {"type":"assistant","requestRef":"r1","timestamp":"2026-12-07T10:00:03Z","message":{"id":"msg_1","model":"claude-sonnet-4-5","usage":{"input_tokens":10,"cache_read_input_tokens":90,"output_tokens":7}}}
/// "#;
/// let calls = transcript::model_calls(Agent::ClaudeCode, text, true);
/// assert_eq!(calls.len(), 1);
/// assert_eq!(calls[0].start.as_deref(), Some("2026-12-07T10:00:01Z"));
/// assert_eq!((calls[0].usage.input, calls[0].usage.cache_read, calls[0].usage.output), (10, 90, 7));
/// ```
pub fn model_calls(agent: Agent, text: &[u8], first_read: bool) -> Vec<ModelCall> {
    match agent {
        Agent::ClaudeCode => claude(text, first_read),
        Agent::Codex => codex(text, first_read),
        _ => Vec::new(),
    }
}

fn model_name(m: Option<String>) -> String {
    m.filter(|m| m.len() <= MAX_MODEL_BYTES && m.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_default()
}

// Claude Code: `api-request` lines (newer versions) name a request, and the `assistant` lines
// of its answer point at it (`requestRef`); each content block of an answer is a line of its
// own with the same message id, the last one holding the final usage.

#[derive(Deserialize)]
struct ClaudeLine {
    #[serde(rename = "type")]
    kind: Option<String>,
    id: Option<String>,
    timestamp: Option<String>,
    #[serde(rename = "requestRef")]
    request_ref: Option<String>,
    #[serde(rename = "isSidechain")]
    sidechain: Option<bool>,
    message: Option<ClaudeMessage>,
}

#[derive(Deserialize)]
struct ClaudeMessage {
    id: Option<String>,
    model: Option<String>,
    usage: Option<ClaudeUsage>,
    content: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
struct ClaudeUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: u64,
}

fn claude(text: &[u8], first_read: bool) -> Vec<ModelCall> {
    let mut requests: HashMap<String, String> = HashMap::new();
    let mut calls: Vec<ModelCall> = Vec::new();
    // The key of the call the last assistant line belonged to: its later lines update it.
    let mut open: Option<String> = None;
    // The newest time of a line that is not an answer: where a request without its own line
    // began.
    let mut before: Option<String> = None;
    for line in text.split(|&b| b == b'\n') {
        let Ok(l) = serde_json::from_slice::<ClaudeLine>(line) else {
            continue;
        };
        if l.sidechain == Some(true) {
            continue;
        }
        match l.kind.as_deref() {
            Some("api-request") => {
                if let (Some(id), Some(ts)) = (l.id, l.timestamp.clone()) {
                    requests.insert(id, ts);
                }
                before = l.timestamp.or(before);
                open = None;
            }
            Some("assistant") => {
                let Some(m) = l.message else { continue };
                let Some(u) = m.usage else { continue };
                let Some(end) = l.timestamp else { continue };
                let key = match (&l.request_ref, &m.id) {
                    (Some(r), _) => r.clone(),
                    (None, Some(id)) if open.as_deref().is_some_and(|o| o.starts_with(id)) => {
                        open.clone().unwrap_or_default()
                    }
                    (None, Some(id)) => format!("{id}@{end}"),
                    (None, None) => format!("@{end}"),
                };
                let usage = Usage {
                    input: u.input_tokens,
                    output: u.output_tokens,
                    cache_read: u.cache_read_input_tokens,
                    cache_creation: u.cache_creation_input_tokens,
                };
                match calls.last_mut().filter(|c| c.id == key) {
                    Some(c) => {
                        c.end = end;
                        c.usage = usage;
                    }
                    None => {
                        let start = l
                            .request_ref
                            .as_ref()
                            .and_then(|r| requests.get(r).cloned())
                            .or_else(|| before.clone());
                        calls.push(ModelCall {
                            id: key.clone(),
                            model: model_name(m.model),
                            start,
                            end,
                            usage,
                        });
                    }
                }
                open = Some(key);
            }
            Some("user") => {
                // A prompt (not a tool's result) opens a turn: on a first read, what came
                // before it belongs to earlier turns.
                let prompt = l.message.as_ref().is_some_and(|m| m.content.is_some())
                    && !is_tool_result(line);
                if prompt && first_read {
                    calls.clear();
                }
                before = l.timestamp.or(before);
                open = None;
            }
            _ => {
                if l.timestamp.is_some() {
                    before = l.timestamp;
                }
            }
        }
    }
    calls
}

/// Whether a user line carries a tool's result (its content blocks say `tool_result`), found
/// without decoding the content.
fn is_tool_result(line: &[u8]) -> bool {
    let has = |pat: &[u8]| line.windows(pat.len()).any(|w| w == pat);
    has(br#""tool_result""#) || has(br#""toolUseResult""#)
}

// Codex: a rollout's records are `{timestamp, type, payload}`. `turn_context` names the
// model; `token_usage_record` (newer versions) is one per model response; older versions
// have only `event_msg` `token_count`, whose `last_token_usage` is the last response's.

#[derive(Deserialize)]
struct CodexLine {
    timestamp: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    ordinal: Option<u64>,
    payload: Option<CodexPayload>,
}

#[derive(Deserialize)]
struct CodexPayload {
    #[serde(rename = "type")]
    kind: Option<String>,
    model: Option<String>,
    response_id: Option<String>,
    usage: Option<CodexUsage>,
    info: Option<CodexInfo>,
    role: Option<String>,
}

#[derive(Deserialize)]
struct CodexInfo {
    total_token_usage: Option<CodexUsage>,
    last_token_usage: Option<CodexUsage>,
}

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq)]
struct CodexUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    cached_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

impl CodexUsage {
    /// OpenAI's `input_tokens` counts the cached ones too: they are taken out.
    fn usage(self) -> Usage {
        Usage {
            input: self
                .input_tokens
                .saturating_sub(self.cached_input_tokens)
                .saturating_sub(self.cache_write_input_tokens),
            output: self.output_tokens,
            cache_read: self.cached_input_tokens,
            cache_creation: self.cache_write_input_tokens,
        }
    }
}

fn codex(text: &[u8], first_read: bool) -> Vec<ModelCall> {
    let mut model = String::new();
    let mut records: Vec<ModelCall> = Vec::new();
    let mut counts: Vec<ModelCall> = Vec::new();
    let mut last_total: Option<CodexUsage> = None;
    // Where the next request began: the turn's start, a tool's output, or the last answer.
    let mut before: Option<String> = None;
    for line in text.split(|&b| b == b'\n') {
        let Ok(l) = serde_json::from_slice::<CodexLine>(line) else {
            continue;
        };
        let Some(p) = l.payload else { continue };
        let ts = l.timestamp;
        match (l.kind.as_deref(), p.kind.as_deref()) {
            (Some("turn_context"), _) => {
                model = model_name(p.model);
            }
            (Some("event_msg"), Some("task_started")) => {
                if first_read {
                    records.clear();
                    counts.clear();
                }
                before = ts.or(before);
            }
            (Some("response_item"), Some("function_call_output" | "custom_tool_call_output")) => {
                before = ts.or(before);
            }
            (Some("response_item"), Some("message")) if p.role.as_deref() == Some("user") => {
                before = ts.or(before);
            }
            (Some("token_usage_record"), _) => {
                let (Some(u), Some(end)) = (p.usage, ts) else {
                    continue;
                };
                let id = match l.ordinal {
                    Some(o) => format!("{}#{o}", p.response_id.unwrap_or_default()),
                    None => format!("{}@{end}", p.response_id.unwrap_or_default()),
                };
                records.push(ModelCall {
                    id,
                    model: model.clone(),
                    start: before.replace(end.clone()),
                    end,
                    usage: u.usage(),
                });
            }
            (Some("event_msg"), Some("token_count")) => {
                let Some(info) = p.info else { continue };
                let (Some(total), Some(last), Some(end)) =
                    (info.total_token_usage, info.last_token_usage, ts)
                else {
                    continue;
                };
                // Sent again without a new response (a rate-limit update): the same total.
                if last_total == Some(total) {
                    continue;
                }
                last_total = Some(total);
                counts.push(ModelCall {
                    id: format!("count@{end}"),
                    model: model.clone(),
                    start: before.clone(),
                    end,
                    usage: last.usage(),
                });
            }
            _ => {}
        }
    }
    if records.is_empty() { counts } else { records }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_groups_an_answers_lines_and_takes_the_last_usage() {
        let text = br#"{"type":"user","message":{"role":"user","content":"old"},"timestamp":"2026-12-07T09:00:00Z"}
{"type":"assistant","timestamp":"2026-12-07T09:00:02Z","message":{"id":"msg_0","model":"m","usage":{"input_tokens":1,"output_tokens":1}}}
{"type":"user","message":{"role":"user","content":"new"},"timestamp":"2026-12-07T10:00:00Z"}
{"type":"assistant","timestamp":"2026-12-07T10:00:02Z","message":{"id":"msg_1","model":"m","usage":{"input_tokens":5,"output_tokens":1}}}
{"type":"assistant","timestamp":"2026-12-07T10:00:03Z","message":{"id":"msg_1","model":"m","usage":{"input_tokens":5,"output_tokens":9}}}
{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]},"timestamp":"2026-12-07T10:00:04Z"}
{"type":"assistant","timestamp":"2026-12-07T10:00:06Z","message":{"id":"msg_2","model":"m","usage":{"input_tokens":6,"cache_creation_input_tokens":4,"output_tokens":2}}}
{"type":"assistant","isSidechain":true,"timestamp":"2026-12-07T10:00:07Z","message":{"id":"msg_9","model":"m","usage":{"input_tokens":100,"output_tokens":100}}}
not json
"#;
        let calls = claude(text, true);
        let got: Vec<_> = calls
            .iter()
            .map(|c| {
                (
                    c.start.as_deref(),
                    c.end.as_str(),
                    c.usage.input,
                    c.usage.output,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some("2026-12-07T10:00:00Z"), "2026-12-07T10:00:03Z", 5, 9),
                (Some("2026-12-07T10:00:04Z"), "2026-12-07T10:00:06Z", 6, 2),
            ]
        );
        assert_eq!(calls[1].usage.cache_creation, 4);
        // Not a first read: the earlier turn's call too.
        assert_eq!(claude(text, false).len(), 3);
    }

    #[test]
    fn claude_answers_with_one_message_id_are_two_calls_when_two_requests_made_them() {
        let text = br#"{"type":"api-request","id":"r1","timestamp":"2026-12-07T10:00:00Z"}
{"type":"assistant","requestRef":"r1","timestamp":"2026-12-07T10:00:01Z","message":{"id":"msg_same","model":"m","usage":{"input_tokens":1,"output_tokens":2}}}
{"type":"api-request","id":"r2","timestamp":"2026-12-07T10:00:05Z"}
{"type":"assistant","requestRef":"r2","timestamp":"2026-12-07T10:00:06Z","message":{"id":"msg_same","model":"m","usage":{"input_tokens":3,"output_tokens":4}}}
"#;
        let calls = claude(text, true);
        let ids: Vec<_> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert_eq!(calls[1].start.as_deref(), Some("2026-12-07T10:00:05Z"));
    }

    #[test]
    fn a_model_name_that_is_not_a_name_is_left_out() {
        assert_eq!(
            model_name(Some("claude-sonnet-4-5".into())),
            "claude-sonnet-4-5"
        );
        assert_eq!(model_name(Some("a b".into())), "");
        assert_eq!(model_name(Some("x".repeat(200))), "");
    }

    #[test]
    fn codex_reads_usage_records_else_token_counts() {
        let records = br#"{"timestamp":"2026-12-07T10:00:00Z","type":"event_msg","payload":{"type":"task_started"}}
{"timestamp":"2026-12-07T10:00:00Z","type":"turn_context","payload":{"model":"gpt-5.1-codex"}}
{"timestamp":"2026-12-07T10:00:02Z","ordinal":10,"type":"token_usage_record","payload":{"response_id":"resp_1","usage":{"input_tokens":12,"cached_input_tokens":8,"output_tokens":7}}}
{"timestamp":"2026-12-07T10:00:03Z","type":"response_item","payload":{"type":"function_call_output"}}
{"timestamp":"2026-12-07T10:00:04Z","ordinal":16,"type":"token_usage_record","payload":{"response_id":"resp_1","usage":{"input_tokens":20,"output_tokens":3}}}
{"timestamp":"2026-12-07T10:00:04Z","type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":{"input_tokens":32},"last_token_usage":{"input_tokens":20}}}}
"#;
        let calls = codex(records, true);
        let got: Vec<_> = calls
            .iter()
            .map(|c| (c.id.as_str(), c.model.as_str(), c.start.as_deref(), c.usage))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "resp_1#10",
                    "gpt-5.1-codex",
                    Some("2026-12-07T10:00:00Z"),
                    Usage {
                        input: 4,
                        output: 7,
                        cache_read: 8,
                        cache_creation: 0
                    }
                ),
                (
                    "resp_1#16",
                    "gpt-5.1-codex",
                    Some("2026-12-07T10:00:03Z"),
                    Usage {
                        input: 20,
                        output: 3,
                        cache_read: 0,
                        cache_creation: 0
                    }
                ),
            ]
        );
        let counts = br#"{"timestamp":"2026-12-07T10:00:00Z","type":"event_msg","payload":{"type":"task_started"}}
{"timestamp":"2026-12-07T10:00:02Z","type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":{"input_tokens":12},"last_token_usage":{"input_tokens":12,"output_tokens":1}}}}
{"timestamp":"2026-12-07T10:00:02Z","type":"event_msg","payload":{"type":"token_count","info":{"total_token_usage":{"input_tokens":12},"last_token_usage":{"input_tokens":12,"output_tokens":1}}}}
{"timestamp":"2026-12-07T10:00:05Z","type":"event_msg","payload":{"type":"token_count","info":null}}
"#;
        assert_eq!(
            codex(counts, true).len(),
            1,
            "a repeated total is not a call"
        );
    }
}
