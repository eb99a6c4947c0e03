//! The eight lifecycle events, their topics, and the one JSON writer for their payloads.
//!
//! An [`Event`] borrows its strings from the caller: `emit` copies them into a ring slot and the
//! worker writes the payload JSON exactly once ([`Event::write_json`]), which every sink then
//! shares. The payload fields are PRX's, exactly (ARCHITECTURE.md § Events); metadata (agent,
//! session, seq, timestamp) travels beside the payload, never inside it.
//!
//! Payloads are written field by field into a reused buffer: keys and punctuation are ours
//! (constant), strings go through `json::write_str` — simd-json's SIMD escaper for strings of
//! 32 bytes or more, a word-at-a-time scan below that — and `arguments` of `tool_call_start`
//! and [`Extras`] are JSON *text*, validated and embedded as is (minus insignificant whitespace)
//! by our strict compactor, so their bytes reach hooks exactly as the agent wrote them. simd-json's
//! serde serializer as a whole was measured too and lost to this on every event kind
//! (`benches/serialize.rs`; ARCHITECTURE.md § Events).

use crate::json;
use serde::Serialize;

/// Which lifecycle event something is about, without its data.
#[non_exhaustive]
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum EventKind {
    /// `agent_start`: an agent session began.
    AgentStart = 0,
    /// `agent_end`: an agent session ended.
    AgentEnd = 1,
    /// `llm_request`: the agent sent a request to a language model.
    LlmRequest = 2,
    /// `llm_response`: a language model's response arrived, or the request failed.
    LlmResponse = 3,
    /// `tool_call_start`: the agent is about to call a tool.
    ToolCallStart = 4,
    /// `tool_call`: a tool call finished.
    ToolCall = 5,
    /// `turn_complete`: the agent finished a turn.
    TurnComplete = 6,
    /// `error`: a part of the agent reported an error.
    Error = 7,
}

impl EventKind {
    /// All eight, in declaration order (their `u8` values are their indices).
    pub const ALL: [EventKind; 8] = [
        EventKind::AgentStart,
        EventKind::AgentEnd,
        EventKind::LlmRequest,
        EventKind::LlmResponse,
        EventKind::ToolCallStart,
        EventKind::ToolCall,
        EventKind::TurnComplete,
        EventKind::Error,
    ];

    /// "a" or "an" before the event's name as it is read aloud: an agent_end, an error, an
    /// llm_request (el-el-em), a tool_call, a turn_complete.
    pub(crate) fn article(self) -> &'static str {
        match self.name().as_bytes()[0] {
            b'a' | b'e' | b'i' | b'o' | b'u' | b'l' => "an",
            _ => "a",
        }
    }

    /// The event's name as it appears in hooks.json, NDJSON and `ZERO_HOOK_EVENT`: `tool_call`.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::AgentStart => "agent_start",
            EventKind::AgentEnd => "agent_end",
            EventKind::LlmRequest => "llm_request",
            EventKind::LlmResponse => "llm_response",
            EventKind::ToolCallStart => "tool_call_start",
            EventKind::ToolCall => "tool_call",
            EventKind::TurnComplete => "turn_complete",
            EventKind::Error => "error",
        }
    }

    /// The bus topic: `prx.lifecycle.tool_call`.
    pub const fn topic(self) -> &'static str {
        match self {
            EventKind::AgentStart => "prx.lifecycle.agent_start",
            EventKind::AgentEnd => "prx.lifecycle.agent_end",
            EventKind::LlmRequest => "prx.lifecycle.llm_request",
            EventKind::LlmResponse => "prx.lifecycle.llm_response",
            EventKind::ToolCallStart => "prx.lifecycle.tool_call_start",
            EventKind::ToolCall => "prx.lifecycle.tool_call",
            EventKind::TurnComplete => "prx.lifecycle.turn_complete",
            EventKind::Error => "prx.lifecycle.error",
        }
    }

    /// Looks an event up by its exact name (`tool_call`). Config keys are normalized before
    /// they get here; this is deliberately strict.
    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The payload's field names, in the order they are written.
    pub const fn fields(self) -> &'static [&'static str] {
        match self {
            EventKind::AgentStart => &["agent", "session"],
            EventKind::AgentEnd => &["success", "messages_count"],
            EventKind::LlmRequest => &["provider", "model", "messages_count"],
            EventKind::LlmResponse => &["provider", "model", "duration_ms", "success"],
            EventKind::ToolCallStart => &["tool", "arguments"],
            EventKind::ToolCall => &["tool", "success", "output"],
            EventKind::TurnComplete => &[],
            EventKind::Error => &["component", "message"],
        }
    }

    /// A small valid payload for this event: what `prx-hooks fire` and the HTTP test endpoint
    /// send when the caller gives none.
    pub const fn sample_payload(self) -> &'static str {
        match self {
            EventKind::AgentStart => r#"{"agent":"prx-hooks","session":"sample"}"#,
            EventKind::AgentEnd => r#"{"success":true,"messages_count":1}"#,
            EventKind::LlmRequest => {
                r#"{"provider":"example","model":"example-model","messages_count":1}"#
            }
            EventKind::LlmResponse => {
                r#"{"provider":"example","model":"example-model","duration_ms":1,"success":true}"#
            }
            EventKind::ToolCallStart => r#"{"tool":"shell","arguments":{"cmd":"true"}}"#,
            EventKind::ToolCall => r#"{"tool":"shell","success":true,"output":""}"#,
            EventKind::TurnComplete => "{}",
            EventKind::Error => r#"{"component":"prx-hooks","message":"sample error"}"#,
        }
    }

    /// This event's bit in an [`EventMask`].
    pub const fn mask(self) -> EventMask {
        EventMask(1 << self as u8)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`EventKind`]s, one bit each: what a sink or subscriber wants to see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventMask(pub u8);

impl EventMask {
    /// The empty set.
    pub const NONE: EventMask = EventMask(0);
    /// Every event kind.
    pub const ALL: EventMask = EventMask(0xff);

    /// Whether `kind` is in the set.
    pub const fn contains(self, kind: EventKind) -> bool {
        self.0 & kind.mask().0 != 0
    }

    /// The kinds in either set.
    pub const fn union(self, other: EventMask) -> EventMask {
        EventMask(self.0 | other.0)
    }

    /// Whether the set has no kind.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: EventMask) -> EventMask {
        self.union(rhs)
    }
}

impl std::ops::BitOrAssign for EventMask {
    fn bitor_assign(&mut self, rhs: EventMask) {
        *self = self.union(rhs);
    }
}

/// What an agent sends beyond an [`Event`]'s documented fields (ARCHITECTURE.md § Events):
///
/// * **extra fields**: a JSON object whose members are written into the payload after the
///   documented fields, byte-exact (minus insignificant whitespace). PRX's own runtime adds
///   such fields (`agent_start` `{provider, model}`, `agent_end` `{duration_ms, tokens_used}`, …).
///   A member may not repeat a documented field or another member.
/// * **omitted fields**: documented fields the agent did not send (lenient input): they are
///   left out of the payload instead of being written with a made-up value.
///
/// Used with [`Emitter::emit_with_extras`](crate::Emitter::emit_with_extras); plain `emit` has
/// none of this and stays as fast as before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras<'a> {
    fields: &'a str,
    omit: &'a [&'a str],
}

impl<'a> Extras<'a> {
    /// No extra fields, nothing omitted.
    pub const NONE: Extras<'static> = Extras {
        fields: "",
        omit: &[],
    };

    /// Extra fields: `json_object` is JSON text of one object (`{"model":"m","tokens":3}`).
    pub const fn fields(json_object: &'a str) -> Extras<'a> {
        Extras {
            fields: json_object,
            omit: &[],
        }
    }

    /// Leaves these documented fields out of the payload (names as in the table of docs/events.md).
    pub const fn omit(self, fields: &'a [&'a str]) -> Extras<'a> {
        Extras {
            fields: self.fields,
            omit: fields,
        }
    }

    /// The extra fields' JSON text as given (empty for none).
    pub fn json(&self) -> &'a str {
        self.fields
    }

    /// Checks these extras against `kind` and returns the omitted fields as a bit per
    /// documented field (bit `i` = `kind.fields()[i]`). Strict: the extra fields must be one
    /// JSON object (RFC 8259, nested at most [`EXTRAS_MAX_DEPTH`] deep) whose members repeat
    /// neither a documented field nor each other, and every omitted name must be a documented
    /// field of `kind`.
    pub fn check(&self, kind: EventKind) -> Result<u8, ExtrasError> {
        let documented = kind.fields();
        let mut omitted = 0u8;
        for &name in self.omit {
            match documented.iter().position(|f| *f == name) {
                Some(i) => omitted |= 1 << i,
                None => {
                    return Err(ExtrasError::NotAField {
                        event: kind,
                        field: name.to_string(),
                    });
                }
            }
        }
        if self.fields.is_empty() {
            return Ok(omitted);
        }
        let mut seen = json::Seen::<String>::new();
        let mut key = |k: &str| {
            if documented.contains(&k) {
                return Err(format!(
                    "member \"{k}\" repeats a documented field of {kind}"
                ));
            }
            if !seen.insert(k.to_string()) {
                return Err(format!("member \"{k}\" appears twice"));
            }
            Ok(())
        };
        json::check_object(self.fields.as_bytes(), EXTRAS_MAX_DEPTH, &mut key)
            .map(|()| omitted)
            .map_err(|r| ExtrasError::Invalid {
                at: r.at,
                reason: r.reason,
            })
    }
}

/// Extra fields nest at most this deep: their object's members sit at the payload's own level,
/// and the `--print` envelope adds one more, within serde_json's 127.
pub const EXTRAS_MAX_DEPTH: u32 = json::MAX_DEPTH - 1;

/// Why [`Extras`] were refused. Nothing was emitted.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExtrasError {
    /// The extra fields are not one valid JSON object, or a member is not allowed.
    #[error("extra fields, at byte {at}: {reason}")]
    Invalid {
        /// The byte offset in the extra fields' text where reading stopped.
        at: usize,
        /// What was wrong there.
        reason: String,
    },
    /// An omitted name is not a documented field of the event.
    #[error("cannot omit \"{field}\": {event} has no such field (its fields: {})", fields_list(*.event))]
    NotAField {
        /// The event being emitted.
        event: EventKind,
        /// The name that is not one of its fields.
        field: String,
    },
}

fn fields_list(kind: EventKind) -> String {
    match kind.fields() {
        [] => "none".to_string(),
        f => f.join(", "),
    }
}

/// One lifecycle event, borrowing its data from the caller.
///
/// `arguments` of [`Event::ToolCallStart`] is JSON text: a valid JSON object is embedded in the
/// payload as is (minus insignificant whitespace), anything else becomes a JSON string — never
/// rejected, never lost.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// An agent session began.
    AgentStart {
        /// The agent's name.
        agent: &'a str,
        /// The session's id.
        session: &'a str,
    },
    /// An agent session ended.
    AgentEnd {
        /// Whether the session ended without an error.
        success: bool,
        /// The number of messages in the session.
        messages_count: u64,
    },
    /// The agent sent a request to a language model.
    LlmRequest {
        /// The model's provider.
        provider: &'a str,
        /// The model's name.
        model: &'a str,
        /// The number of messages sent in the request.
        messages_count: u64,
    },
    /// A language model's response arrived, or the request failed.
    LlmResponse {
        /// The model's provider.
        provider: &'a str,
        /// The model's name.
        model: &'a str,
        /// From request to response, in milliseconds.
        duration_ms: u64,
        /// Whether the model answered.
        success: bool,
    },
    /// The agent is about to call a tool.
    ToolCallStart {
        /// The tool's name.
        tool: &'a str,
        /// The call's arguments as JSON text (embedded as an object when it is one, else as a
        /// string).
        arguments: &'a str,
    },
    /// A tool call finished.
    ToolCall {
        /// The tool's name.
        tool: &'a str,
        /// Whether the tool succeeded.
        success: bool,
        /// What the tool returned, as text.
        output: &'a str,
    },
    /// The agent finished a turn.
    TurnComplete,
    /// A part of the agent reported an error.
    Error {
        /// The part that failed.
        component: &'a str,
        /// What went wrong.
        message: &'a str,
    },
}

impl<'a> Event<'a> {
    /// Which kind of event this is.
    pub const fn kind(&self) -> EventKind {
        match self {
            Event::AgentStart { .. } => EventKind::AgentStart,
            Event::AgentEnd { .. } => EventKind::AgentEnd,
            Event::LlmRequest { .. } => EventKind::LlmRequest,
            Event::LlmResponse { .. } => EventKind::LlmResponse,
            Event::ToolCallStart { .. } => EventKind::ToolCallStart,
            Event::ToolCall { .. } => EventKind::ToolCall,
            Event::TurnComplete => EventKind::TurnComplete,
            Event::Error { .. } => EventKind::Error,
        }
    }

    /// The event's string fields in payload order (at most two), and its scalars. This is how
    /// an event is flattened into a ring slot and rebuilt from it ([`Event::from_parts`]).
    pub(crate) fn parts(&self) -> Parts<'a> {
        let mut p = Parts {
            kind: self.kind(),
            strs: ["", ""],
            num: [0],
            flag: false,
        };
        match *self {
            Event::AgentStart { agent, session } => p.strs = [agent, session],
            Event::AgentEnd {
                success,
                messages_count,
            } => {
                p.flag = success;
                p.num[0] = messages_count;
            }
            Event::LlmRequest {
                provider,
                model,
                messages_count,
            } => {
                p.strs = [provider, model];
                p.num[0] = messages_count;
            }
            Event::LlmResponse {
                provider,
                model,
                duration_ms,
                success,
            } => {
                p.strs = [provider, model];
                p.num[0] = duration_ms;
                p.flag = success;
            }
            Event::ToolCallStart { tool, arguments } => p.strs = [tool, arguments],
            Event::ToolCall {
                tool,
                success,
                output,
            } => {
                p.strs = [tool, output];
                p.flag = success;
            }
            Event::TurnComplete => {}
            Event::Error { component, message } => p.strs = [component, message],
        }
        p
    }

    /// The inverse of [`Event::parts`].
    pub(crate) fn from_parts(p: Parts<'a>) -> Event<'a> {
        let [a, b] = p.strs;
        match p.kind {
            EventKind::AgentStart => Event::AgentStart {
                agent: a,
                session: b,
            },
            EventKind::AgentEnd => Event::AgentEnd {
                success: p.flag,
                messages_count: p.num[0],
            },
            EventKind::LlmRequest => Event::LlmRequest {
                provider: a,
                model: b,
                messages_count: p.num[0],
            },
            EventKind::LlmResponse => Event::LlmResponse {
                provider: a,
                model: b,
                duration_ms: p.num[0],
                success: p.flag,
            },
            EventKind::ToolCallStart => Event::ToolCallStart {
                tool: a,
                arguments: b,
            },
            EventKind::ToolCall => Event::ToolCall {
                tool: a,
                success: p.flag,
                output: b,
            },
            EventKind::TurnComplete => Event::TurnComplete,
            EventKind::Error => Event::Error {
                component: a,
                message: b,
            },
        }
    }

    /// Appends the payload object to `out`: `{"tool":"shell","success":true,"output":"…"}`.
    ///
    /// This is how payload JSON is produced; the pipeline calls it (through
    /// `Event::write_payload`) once per event.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        self.write_payload(out, "", 0);
    }

    /// Appends the payload object with extra fields after the documented ones and the
    /// documented fields whose bit is set in `omitted` left out (see [`Extras::check`], which
    /// must have accepted `extras` for this event's kind).
    pub(crate) fn write_payload(&self, out: &mut Vec<u8>, extras: &str, omitted: u8) {
        if let Event::TurnComplete = self
            && extras.is_empty()
        {
            // No documented field: one two-byte append, not the writer's two pushes.
            out.extend_from_slice(b"{}");
            return;
        }
        let start = out.len();
        let mut w = ObjectWriter {
            out,
            first: true,
            omitted,
            index: 0,
        };
        match *self {
            Event::AgentStart { agent, session } => {
                w.str("agent", agent);
                w.str("session", session);
            }
            Event::AgentEnd {
                success,
                messages_count,
            } => {
                w.bool("success", success);
                w.u64("messages_count", messages_count);
            }
            Event::LlmRequest {
                provider,
                model,
                messages_count,
            } => {
                w.str("provider", provider);
                w.str("model", model);
                w.u64("messages_count", messages_count);
            }
            Event::LlmResponse {
                provider,
                model,
                duration_ms,
                success,
            } => {
                w.str("provider", provider);
                w.str("model", model);
                w.u64("duration_ms", duration_ms);
                w.bool("success", success);
            }
            Event::ToolCallStart { tool, arguments } => {
                w.str("tool", tool);
                if w.key("arguments") {
                    let top = json::Top::Object;
                    if !json::append_compact_str(w.out, arguments, top, ARGUMENTS_MAX_DEPTH) {
                        json::write_str(w.out, arguments);
                    }
                }
            }
            Event::ToolCall {
                tool,
                success,
                output,
            } => {
                w.str("tool", tool);
                w.bool("success", success);
                w.str("output", output);
            }
            Event::TurnComplete => {}
            Event::Error { component, message } => {
                w.str("component", component);
                w.str("message", message);
            }
        }
        w.finish();
        if !extras.is_empty() {
            append_extras(out, start, extras);
        }
    }

    /// The payload as a `String` (allocates; for tests and tools, not the hot path).
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(128);
        self.write_json(&mut out);
        // The writers emit ASCII punctuation, digits and copies of `&str` input only.
        String::from_utf8(out).expect("payload JSON is UTF-8")
    }
}

/// Merges the members of the JSON object `extras` into the object that ends `out` (it starts at
/// `start`): `{"a":1}` + `{"b":2}` → `{"a":1,"b":2}`, whitespace removed. `extras` was checked
/// when it was emitted ([`Extras::check`]); should it not compact after all, the payload is
/// left with its documented fields only.
fn append_extras(out: &mut Vec<u8>, start: usize, extras: &str) {
    let documented_empty = out.len() - start == 2; // `{}`
    let restore = out.len();
    if documented_empty {
        out.truncate(start);
    } else {
        out.pop(); // the closing brace: the extras' own one closes the payload
    }
    let at = out.len();
    let top = json::Top::Object;
    if !json::append_compact_str(out, extras, top, EXTRAS_MAX_DEPTH) {
        // `out` is back at `at`: close the documented object again.
        out.truncate(at);
        out.extend_from_slice(if documented_empty { b"{}" } else { b"}" });
        debug_assert_eq!(out.len(), restore);
        return;
    }
    if documented_empty {
        return; // the extras' object is the payload
    }
    if out.len() - at == 2 {
        // `{}`: nothing to add; close the documented object again.
        out.truncate(at);
        out.push(b'}');
    } else {
        out[at] = b','; // `{"a":1` + `,"b":2}`
    }
}

/// `arguments` objects nested deeper than this are passed on as a string: the payload object and
/// the `--print` envelope around it take two more levels, and serde_json's default reader stops
/// at 127 levels. Every payload we write stays readable.
pub const ARGUMENTS_MAX_DEPTH: u32 = json::MAX_DEPTH - 2;

/// Writes one payload object, field by field in the order of docs/events.md's table. Field `index` (counted in
/// calls to `key`) is skipped when its bit is set in `omitted` (lenient input).
struct ObjectWriter<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
    omitted: u8,
    index: u8,
}

impl ObjectWriter<'_> {
    /// Writes `"key":` unless this field is omitted; whether the value should follow.
    #[inline]
    fn key(&mut self, key: &str) -> bool {
        let i = self.index;
        self.index += 1;
        if self.omitted & (1 << i) != 0 {
            return false;
        }
        self.out.push(if self.first { b'{' } else { b',' });
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes()); // keys are ours: plain ASCII
        self.out.extend_from_slice(b"\":");
        true
    }
    #[inline]
    fn str(&mut self, key: &str, v: &str) {
        if self.key(key) {
            json::write_str(self.out, v);
        }
    }
    #[inline]
    fn u64(&mut self, key: &str, v: u64) {
        if self.key(key) {
            json::write_u64(self.out, v);
        }
    }
    #[inline]
    fn bool(&mut self, key: &str, v: bool) {
        if self.key(key) {
            json::write_bool(self.out, v);
        }
    }
    #[inline]
    fn finish(self) {
        if self.first {
            self.out.push(b'{');
        }
        self.out.push(b'}');
    }
}

/// An event flattened to plain data: the ring stores these fields, not the enum.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parts<'a> {
    pub kind: EventKind,
    pub strs: [&'a str; 2],
    pub num: [u64; 1],
    pub flag: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse(ev: Event<'_>) -> Value {
        let text = ev.to_json();
        assert!(!text.contains('\n'), "payload must be one line: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn every_event_has_exactly_its_fields() {
        let cases = [
            (
                Event::AgentStart {
                    agent: "a",
                    session: "s",
                },
                json!({"agent":"a","session":"s"}),
            ),
            (
                Event::AgentEnd {
                    success: true,
                    messages_count: 7,
                },
                json!({"success":true,"messages_count":7}),
            ),
            (
                Event::LlmRequest {
                    provider: "p",
                    model: "m",
                    messages_count: u64::MAX,
                },
                json!({"provider":"p","model":"m","messages_count":u64::MAX}),
            ),
            (
                Event::LlmResponse {
                    provider: "p",
                    model: "m",
                    duration_ms: 12,
                    success: false,
                },
                json!({"provider":"p","model":"m","duration_ms":12,"success":false}),
            ),
            (
                Event::ToolCallStart {
                    tool: "shell",
                    arguments: r#"{"cmd":"ls"}"#,
                },
                json!({"tool":"shell","arguments":{"cmd":"ls"}}),
            ),
            (
                Event::ToolCall {
                    tool: "t",
                    success: true,
                    output: "o",
                },
                json!({"tool":"t","success":true,"output":"o"}),
            ),
            (Event::TurnComplete, json!({})),
            (
                Event::Error {
                    component: "c",
                    message: "m",
                },
                json!({"component":"c","message":"m"}),
            ),
        ];
        for (ev, want) in cases {
            assert_eq!(parse(ev), want, "{:?}", ev.kind());
            let keys: Vec<_> = want.as_object().unwrap().keys().cloned().collect();
            let mut fields: Vec<_> = ev.kind().fields().iter().map(|s| s.to_string()).collect();
            fields.sort();
            let mut keys = keys;
            keys.sort();
            assert_eq!(keys, fields);
            assert_eq!(Event::from_parts(ev.parts()), ev);
        }
    }

    #[test]
    fn strings_are_escaped() {
        let nasty = "quote \" backslash \\ nl \n tab \t nul \0 bell \u{7} é 中 😀 \u{2028}";
        let v = parse(Event::ToolCall {
            tool: nasty,
            success: true,
            output: nasty,
        });
        assert_eq!(v["tool"], nasty);
        assert_eq!(v["output"], nasty);
    }

    #[test]
    fn invalid_arguments_become_a_string_and_objects_are_embedded() {
        for bad in [
            "",
            "not json",
            "[1,2]",
            "\"s\"",
            "{\"a\":",
            "{\"a\":\"\\ud800\"}",
            "{} {}",
        ] {
            let v = parse(Event::ToolCallStart {
                tool: "t",
                arguments: bad,
            });
            assert_eq!(v["arguments"], Value::String(bad.into()), "{bad:?}");
        }
        let deep = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n - 1), "]".repeat(n - 1));
        let v = parse(Event::ToolCallStart {
            tool: "t",
            arguments: &deep(ARGUMENTS_MAX_DEPTH as usize),
        });
        assert!(v["arguments"].is_object());
        let too_deep = deep(ARGUMENTS_MAX_DEPTH as usize + 1);
        let v = parse(Event::ToolCallStart {
            tool: "t",
            arguments: &too_deep,
        });
        assert_eq!(v["arguments"], Value::String(too_deep));
        let pretty = "{\n  \"path\": \"/tmp/a b\",\n  \"n\": [1, 2.5e3]\n}";
        let v = parse(Event::ToolCallStart {
            tool: "t",
            arguments: pretty,
        });
        assert_eq!(v["arguments"], json!({"path":"/tmp/a b","n":[1,2.5e3]}));
    }

    #[test]
    fn names_and_topics_agree() {
        for k in EventKind::ALL {
            assert_eq!(k.topic(), format!("prx.lifecycle.{}", k.name()));
            assert_eq!(EventKind::from_name(k.name()), Some(k));
            assert_eq!(EventKind::ALL[k as usize], k);
        }
        assert_eq!(EventKind::from_name("Tool_Call"), None);
    }

    /// The payload bytes are what the hand-written writer produced before simd-json replaced
    /// it, which is what serde_json writes: every control character, quote and backslash
    /// escaped the same way (`\u001f`, lowercase hex), nothing else escaped, UTF-8 copied.
    #[test]
    fn simd_json_writes_byte_for_byte_what_serde_json_writes() {
        #[derive(Serialize)]
        struct Tc<'a> {
            tool: &'a str,
            success: bool,
            output: &'a str,
        }
        let all: String = (0u8..0x80)
            .map(char::from)
            .chain("é中😀\u{7f}\u{2028}".chars())
            .collect();
        for len in [0, 1, 7, 8, 9, 31, 32, 33, all.len()] {
            let s: String = all.chars().take(len).collect();
            let ours = Event::ToolCall {
                tool: &s,
                success: len % 2 == 0,
                output: &s,
            }
            .to_json();
            let theirs = serde_json::to_string(&Tc {
                tool: &s,
                success: len % 2 == 0,
                output: &s,
            })
            .unwrap();
            assert_eq!(ours, theirs);
        }
        let ours = Event::LlmResponse {
            provider: "p",
            model: "m",
            duration_ms: u64::MAX,
            success: false,
        }
        .to_json();
        assert_eq!(
            ours,
            format!(
                r#"{{"provider":"p","model":"m","duration_ms":{},"success":false}}"#,
                u64::MAX
            )
        );
    }

    fn payload(ev: Event<'_>, extras: &Extras<'_>) -> String {
        let omitted = extras.check(ev.kind()).unwrap();
        let mut out = Vec::new();
        ev.write_payload(&mut out, extras.json(), omitted);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn extras_follow_the_documented_fields_byte_exact() {
        let tc = Event::ToolCall {
            tool: "t",
            success: true,
            output: "o",
        };
        let x = Extras::fields(r#" { "n" : 1e2, "z": {"b":-0, "a": [1.50, "s t"]} } "#);
        assert_eq!(
            payload(tc, &x),
            r#"{"tool":"t","success":true,"output":"o","n":1e2,"z":{"b":-0,"a":[1.50,"s t"]}}"#
        );
        assert_eq!(
            payload(tc, &Extras::fields("{}")),
            r#"{"tool":"t","success":true,"output":"o"}"#
        );
        assert_eq!(
            payload(Event::TurnComplete, &x),
            r#"{"n":1e2,"z":{"b":-0,"a":[1.50,"s t"]}}"#
        );
        assert_eq!(payload(Event::TurnComplete, &Extras::fields(" {} ")), "{}");
        let args = Event::ToolCallStart {
            tool: "t",
            arguments: r#"{"a": 1}"#,
        };
        assert_eq!(
            payload(args, &Extras::fields(r#"{"x":true}"#)),
            r#"{"tool":"t","arguments":{"a":1},"x":true}"#
        );
    }

    /// Extras that do not compact (they bypassed `Extras::check`) leave the documented payload
    /// whole; the fallback used to overwrite it with closing braces (found by the ndjson_line
    /// fuzz target).
    #[test]
    fn extras_that_do_not_compact_leave_the_documented_payload_whole() {
        let lone = r#"{"x":"\ude00"}"#;
        let mut out = b"prefix".to_vec();
        let ev = Event::ToolCall {
            tool: "t",
            success: true,
            output: "o",
        };
        ev.write_payload(&mut out, lone, 0);
        assert_eq!(out, br#"prefix{"tool":"t","success":true,"output":"o"}"#);
        out.clear();
        Event::TurnComplete.write_payload(&mut out, lone, 0);
        assert_eq!(out, b"{}");
    }

    #[test]
    fn omitted_fields_are_left_out() {
        let end = Event::AgentEnd {
            success: false,
            messages_count: 0,
        };
        let x = Extras::fields(r#"{"duration_ms":12,"tokens_used":300}"#)
            .omit(&["success", "messages_count"]);
        assert_eq!(payload(end, &x), r#"{"duration_ms":12,"tokens_used":300}"#);
        assert_eq!(
            payload(end, &Extras::NONE.omit(&["success", "messages_count"])),
            "{}"
        );
        let args = Event::ToolCallStart {
            tool: "t",
            arguments: "{}",
        };
        assert_eq!(
            payload(args, &Extras::NONE.omit(&["tool"])),
            r#"{"arguments":{}}"#
        );
        assert_eq!(
            payload(args, &Extras::NONE.omit(&["arguments"])),
            r#"{"tool":"t"}"#
        );
        let tc = Event::ToolCall {
            tool: "t",
            success: true,
            output: "o",
        };
        assert_eq!(
            payload(tc, &Extras::NONE.omit(&["success"])),
            r#"{"tool":"t","output":"o"}"#
        );
    }

    #[test]
    fn extras_that_do_not_fit_are_refused_with_a_reason() {
        let kind = EventKind::ToolCall;
        let err = |x: Extras<'_>| x.check(kind).unwrap_err().to_string();
        assert_eq!(
            err(Extras::fields(r#"{"tool":"x"}"#)),
            r#"extra fields, at byte 1: member "tool" repeats a documented field of tool_call"#
        );
        assert_eq!(
            err(Extras::fields(r#"{"t\u006fol":"x"}"#)),
            r#"extra fields, at byte 1: member "tool" repeats a documented field of tool_call"#
        );
        assert_eq!(
            err(Extras::fields(r#"{"a":1,"a":2}"#)),
            r#"extra fields, at byte 7: member "a" appears twice"#
        );
        assert_eq!(
            err(Extras::fields("[1]")),
            "extra fields, at byte 0: expected a JSON object"
        );
        assert_eq!(
            err(Extras::fields(r#"{"a":}"#)),
            "extra fields, at byte 5: invalid JSON"
        );
        assert_eq!(
            err(Extras::NONE.omit(&["tokens"])),
            r#"cannot omit "tokens": tool_call has no such field (its fields: tool, success, output)"#
        );
        assert_eq!(
            Extras::NONE.omit(&["output", "tool"]).check(kind),
            Ok(0b101)
        );
    }
}
