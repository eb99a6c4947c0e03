//! Building OTLP spans: a span record ([`Rec`]) whose strings live in one reused buffer, its
//! protobuf encoding, bounded strings, extras as `prx.extra.*`, ids, times.
//!
//! A span is never an `opentelemetry_proto` `Span` on the way out: those hold a `String` per
//! key, value and id, a dozen allocations per span, freed again on the exporter's thread. A
//! [`Rec`] keeps its attributes as ranges of its own text buffer (static keys as `&'static str`),
//! is encoded straight into the export chunk when it ends, and goes back to the builder's pool
//! with its buffers kept: a span in the steady state allocates nothing.

use super::payload::{Payload, raw_text};
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) type TraceId = [u8; 16];
pub(crate) type SpanId = [u8; 8];

/// The prefix of extra fields' attributes.
pub(crate) const EXTRA_PREFIX: &str = "prx.extra.";

/// The longest an extra field's name is kept (before the prefix).
const MAX_EXTRA_NAME: usize = 128;

/// Span kinds (the OTLP enum's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal = 1,
    Client = 3,
}

/// Random ids: a splitmix64 sequence seeded once from getrandom (ids need to be unique, not
/// secret; W3C trace context asks for randomness in trace ids, which this gives).
pub(crate) struct Ids(u64);

impl Ids {
    pub(crate) fn new() -> Ids {
        let mut seed = [0u8; 8];
        if getrandom::fill(&mut seed).is_err() {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            seed = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
        }
        Ids(u64::from_le_bytes(seed))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        match z ^ (z >> 31) {
            0 => 1,
            n => n,
        }
    }

    pub(crate) fn trace(&mut self) -> TraceId {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next().to_be_bytes());
        id[8..].copy_from_slice(&self.next().to_be_bytes());
        id
    }

    pub(crate) fn span(&mut self) -> SpanId {
        self.next().to_be_bytes()
    }
}

pub(crate) fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// `s` cut to at most `max` bytes at a character boundary (room left for the `…` that marks
/// the cut), and whether it was cut.
pub(crate) fn cut(s: &str, max: usize) -> (&str, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

/// A string of a record: static, or a range of its text buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Text {
    Static(&'static str),
    At(u32, u32),
}

/// An attribute value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val {
    Str(Text),
    Int(i64),
    Bool(bool),
    Double(f64),
}

#[derive(Clone, Copy, Debug)]
struct Attr {
    key: Text,
    val: Val,
}

/// A span event: its attributes are `ev_attrs[first..first + count]`.
#[derive(Clone, Copy, Debug)]
struct Ev {
    time: u64,
    name: &'static str,
    first: u32,
    count: u32,
}

/// One span being built (or finished, until it is encoded).
#[derive(Debug)]
pub(crate) struct Rec {
    pub(crate) trace: TraceId,
    pub(crate) id: SpanId,
    pub(crate) parent: Option<SpanId>,
    pub(crate) kind: Kind,
    pub(crate) start: u64,
    pub(crate) end: u64,
    name: Text,
    text: String,
    attrs: Vec<Attr>,
    ev_attrs: Vec<Attr>,
    events: Vec<Ev>,
    status: Option<Text>,
    pub(crate) dropped_attributes_count: u32,
    links: Vec<(TraceId, SpanId)>,
    pub(crate) dropped_links_count: u32,
}

/// A record's text buffer beyond this capacity is not kept when it goes back to the pool.
const KEEP_TEXT: usize = 16 << 10;

impl Rec {
    pub(crate) fn empty() -> Rec {
        Rec {
            trace: [0; 16],
            id: [0; 8],
            parent: None,
            kind: Kind::Internal,
            start: 0,
            end: 0,
            name: Text::Static(""),
            text: String::new(),
            attrs: Vec::new(),
            ev_attrs: Vec::new(),
            events: Vec::new(),
            status: None,
            dropped_attributes_count: 0,
            links: Vec::new(),
            dropped_links_count: 0,
        }
    }

    /// Clears the record for reuse, keeping its buffers (unless one grew large).
    pub(crate) fn clear(&mut self) {
        self.text.clear();
        if self.text.capacity() > KEEP_TEXT {
            self.text = String::new();
        }
        self.attrs.clear();
        self.ev_attrs.clear();
        self.events.clear();
        self.links.clear();
        self.status = None;
        self.parent = None;
        self.name = Text::Static("");
        self.dropped_attributes_count = 0;
        self.dropped_links_count = 0;
    }

    /// Starts the (cleared) record as a new span; `end` is `start` until set.
    pub(crate) fn begin(
        &mut self,
        kind: Kind,
        trace: TraceId,
        id: SpanId,
        parent: Option<SpanId>,
        start: u64,
    ) {
        self.kind = kind;
        self.trace = trace;
        self.id = id;
        self.parent = parent;
        self.start = start;
        self.end = start;
    }

    pub(crate) fn text(&self, t: Text) -> &str {
        match t {
            Text::Static(s) => s,
            Text::At(a, b) => &self.text[a as usize..b as usize],
        }
    }

    fn push(&mut self, s: &str) -> Text {
        let a = self.text.len();
        self.text.push_str(s);
        Text::At(a as u32, self.text.len() as u32)
    }

    /// `s` cut to `max` bytes (with `…` when cut) as text of this record.
    pub(crate) fn push_bounded(&mut self, s: &str, max: usize) -> Text {
        let a = self.text.len();
        let (kept, was_cut) = cut(s, max);
        self.text.push_str(kept);
        if was_cut {
            self.text.push('…');
        }
        Text::At(a as u32, self.text.len() as u32)
    }

    /// The span's name, `op` then a space then `what` (`execute_tool grep`).
    pub(crate) fn name2(&mut self, op: &str, what: &str) {
        let a = self.text.len();
        self.text.push_str(op);
        self.text.push(' ');
        self.text.push_str(what);
        self.name = Text::At(a as u32, self.text.len() as u32);
    }

    pub(crate) fn name(&self) -> &str {
        self.text(self.name)
    }

    fn set(&mut self, key: Text, val: Val) {
        let k = self.text(key);
        let found = self.attrs.iter().position(|a| self.text(a.key) == k);
        match found {
            Some(i) => self.attrs[i].val = val,
            None => self.attrs.push(Attr { key, val }),
        }
    }

    /// Sets a string attribute, replacing a value set before.
    pub(crate) fn str(&mut self, key: &'static str, v: &str) {
        let t = self.push(v);
        self.set(Text::Static(key), Val::Str(t));
    }

    /// A string attribute already in this record's text (or static).
    pub(crate) fn text_attr(&mut self, key: &'static str, t: Text) {
        self.set(Text::Static(key), Val::Str(t));
    }

    /// The text of a string attribute set before.
    pub(crate) fn attr_text(&self, key: &str) -> Option<Text> {
        self.attrs.iter().find_map(|a| match a.val {
            Val::Str(t) if self.text(a.key) == key => Some(t),
            _ => None,
        })
    }

    /// `key` set to `val`, replacing a value set before.
    pub(crate) fn set_attr(&mut self, key: &'static str, val: Val) {
        self.set(Text::Static(key), val);
    }

    pub(crate) fn int(&mut self, key: &'static str, v: i64) {
        self.set(Text::Static(key), Val::Int(v));
    }

    pub(crate) fn error(&mut self, error_type: &str, message: &str) {
        self.status = Some(self.push(message));
        self.str("error.type", error_type);
    }

    /// A span event with string attributes.
    pub(crate) fn event(&mut self, name: &'static str, time: u64, attrs: &[(&'static str, &str)]) {
        let first = self.ev_attrs.len() as u32;
        for (k, v) in attrs {
            let t = self.push(v);
            self.ev_attrs.push(Attr {
                key: Text::Static(k),
                val: Val::Str(t),
            });
        }
        self.events.push(Ev {
            time,
            name,
            first,
            count: attrs.len() as u32,
        });
    }

    /// A link to another span (at most `max`, the rest counted in `dropped_links_count`). Only
    /// plugin-call aggregates link (feature `wasm`).
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub(crate) fn link(&mut self, trace: TraceId, span: SpanId, max: usize) {
        if self.links.contains(&(trace, span)) {
            return;
        }
        if self.links.len() < max {
            self.links.push((trace, span));
        } else {
            self.dropped_links_count += 1;
        }
    }

    /// `prx.extra.<name>` (the name cut to 128 bytes), replacing a value set before.
    fn extra(&mut self, name: &str, val: Val) {
        let a = self.text.len();
        self.text.push_str(EXTRA_PREFIX);
        let (kept, was_cut) = cut(name, MAX_EXTRA_NAME);
        self.text.push_str(kept);
        if was_cut {
            self.text.push('…');
        }
        let key = Text::At(a as u32, self.text.len() as u32);
        self.set(key, val);
    }

    /// Appends this span, encoded as a `ScopeSpans.spans` field (tag 2), to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let len = self.encoded_len();
        key(out, 2, LEN);
        varint(out, len as u64);
        let at = out.len();
        out.reserve(len);
        bytes_field(out, 1, &self.trace);
        bytes_field(out, 2, &self.id);
        if let Some(p) = &self.parent {
            bytes_field(out, 4, p);
        }
        str_field(out, 5, self.name());
        key(out, 6, VARINT);
        varint(out, self.kind as u64);
        fixed64_field(out, 7, self.start);
        fixed64_field(out, 8, self.end);
        for a in &self.attrs {
            self.encode_kv(out, 9, a);
        }
        if self.dropped_attributes_count > 0 {
            key(out, 10, VARINT);
            varint(out, u64::from(self.dropped_attributes_count));
        }
        for e in &self.events {
            key(out, 11, LEN);
            varint(out, self.event_len(e) as u64);
            fixed64_field(out, 1, e.time);
            str_field(out, 2, e.name);
            for a in self.event_attrs(e) {
                self.encode_kv(out, 3, a);
            }
        }
        for (t, s) in &self.links {
            key(out, 13, LEN);
            varint(out, LINK_LEN as u64);
            bytes_field(out, 1, t);
            bytes_field(out, 2, s);
        }
        if self.dropped_links_count > 0 {
            key(out, 14, VARINT);
            varint(out, u64::from(self.dropped_links_count));
        }
        if let Some(m) = self.status {
            key(out, 15, LEN);
            varint(out, self.status_len(m) as u64);
            str_field(out, 2, self.text(m));
            key(out, 3, VARINT);
            varint(out, STATUS_ERROR);
        }
        debug_assert_eq!(out.len() - at, len, "encoded_len agrees with encode");
    }

    fn encoded_len(&self) -> usize {
        let mut n = 18 + 10 + self.parent.map_or(0, |_| 10);
        n += str_len(self.name());
        n += 1 + varint_len(self.kind as u64);
        n += 9 + 9;
        n += self
            .attrs
            .iter()
            .map(|a| nested(self.kv_len(a)))
            .sum::<usize>();
        if self.dropped_attributes_count > 0 {
            n += 1 + varint_len(u64::from(self.dropped_attributes_count));
        }
        n += self
            .events
            .iter()
            .map(|e| nested(self.event_len(e)))
            .sum::<usize>();
        n += self.links.len() * nested(LINK_LEN);
        if self.dropped_links_count > 0 {
            n += 1 + varint_len(u64::from(self.dropped_links_count));
        }
        if let Some(m) = self.status {
            n += nested(self.status_len(m));
        }
        n
    }

    fn event_attrs(&self, e: &Ev) -> &[Attr] {
        &self.ev_attrs[e.first as usize..(e.first + e.count) as usize]
    }

    fn event_len(&self, e: &Ev) -> usize {
        9 + str_len(e.name)
            + self
                .event_attrs(e)
                .iter()
                .map(|a| nested(self.kv_len(a)))
                .sum::<usize>()
    }

    fn status_len(&self, m: Text) -> usize {
        str_len(self.text(m)) + 2
    }

    fn value_len(&self, v: &Val) -> usize {
        match v {
            // A oneof member is written even when it is the default value.
            Val::Str(t) => {
                let n = self.text(*t).len();
                1 + varint_len(n as u64) + n
            }
            Val::Bool(_) => 2,
            Val::Int(i) => 1 + varint_len(*i as u64),
            Val::Double(_) => 9,
        }
    }

    fn kv_len(&self, a: &Attr) -> usize {
        str_len(self.text(a.key)) + nested(self.value_len(&a.val))
    }

    fn encode_kv(&self, out: &mut Vec<u8>, tag: u32, a: &Attr) {
        key(out, tag, LEN);
        varint(out, self.kv_len(a) as u64);
        str_field(out, 1, self.text(a.key));
        key(out, 2, LEN);
        varint(out, self.value_len(&a.val) as u64);
        match a.val {
            Val::Str(t) => {
                let s = self.text(t);
                key(out, 1, LEN);
                varint(out, s.len() as u64);
                out.extend_from_slice(s.as_bytes());
            }
            Val::Bool(b) => {
                key(out, 2, VARINT);
                out.push(u8::from(b));
            }
            Val::Int(i) => {
                key(out, 3, VARINT);
                varint(out, i as u64);
            }
            Val::Double(d) => {
                key(out, 4, FIXED64);
                out.extend_from_slice(&d.to_le_bytes());
            }
        }
    }
}

// Protobuf wire format (every tag here is below 16: one key byte).
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
/// `Status.code` = `STATUS_CODE_ERROR`.
const STATUS_ERROR: u64 = 2;
/// A link with a trace and a span id only.
const LINK_LEN: usize = 18 + 10;

fn key(out: &mut Vec<u8>, tag: u32, wire: u8) {
    debug_assert!(tag < 16);
    out.push(((tag as u8) << 3) | wire);
}

pub(crate) fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field's size with its key and length.
fn nested(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// A string field (omitted when empty, as proto3 does).
fn str_len(s: &str) -> usize {
    if s.is_empty() { 0 } else { nested(s.len()) }
}

fn str_field(out: &mut Vec<u8>, tag: u32, s: &str) {
    if !s.is_empty() {
        bytes_field(out, tag, s.as_bytes());
    }
}

fn bytes_field(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    key(out, tag, LEN);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn fixed64_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    key(out, tag, FIXED64);
    out.extend_from_slice(&v.to_le_bytes());
}

/// Extra fields exported without `--otlp-content`: ids, names of models and providers, token
/// counts, durations, statuses and reasons. Everything else may carry content (tool input and
/// output, prompts, messages, paths, transcripts) and stays out unless content is on, so a
/// field an agent adds tomorrow is withheld by default (docs/otel.md § Content).
pub(crate) const SAFE_EXTRAS: &[&str] = &[
    // ids
    "user_id",
    "tool_call_id",
    "tool_use_id",
    "call_id",
    "turn_id",
    "agent_id",
    "agent_type",
    // the names an application gave its agents (the Agents SDK's agent and handoff)
    "agent_name",
    "handoff_from",
    "parent_session",
    "generation_id",
    "conversation_id",
    "request_id",
    "event_id",
    "hook_event_name",
    // models, providers, modes
    "model",
    "provider",
    "mcp_server",
    "permission_mode",
    "source",
    "trigger",
    // tokens
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "total_tokens",
    "reasoning_tokens",
    "message_count",
    // durations
    "duration_ms",
    "duration",
    // statuses and reasons
    "reason",
    "stop_reason",
    "finish_reason",
    "status",
    "is_interrupt",
    "exit_code",
    "error_type",
    "policy_decision",
    "policy_id",
    "policy_reason",
];

/// The conventions' input count: every input token, the cached ones included.
const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";

/// Token counts exported under the GenAI conventions' names rather than as `prx.extra.*`.
const USAGE: [(&str, &str); 6] = [
    ("input_tokens", INPUT_TOKENS),
    ("output_tokens", "gen_ai.usage.output_tokens"),
    (
        "cache_read_input_tokens",
        "gen_ai.usage.cache_read.input_tokens",
    ),
    ("cache_read_tokens", "gen_ai.usage.cache_read.input_tokens"),
    (
        "cache_creation_input_tokens",
        "gen_ai.usage.cache_creation.input_tokens",
    ),
    (
        "cache_write_tokens",
        "gen_ai.usage.cache_creation.input_tokens",
    ),
];

/// The attribute counting the extra fields withheld for want of `--otlp-content`.
pub(crate) const WITHHELD: &str = "prx.content_withheld";

/// The extra fields of a payload (members that are not the event's documented fields) as
/// `prx.extra.<name>` attributes: at most `max` of them, strings and nested JSON bounded to
/// `max_bytes`. Without `content`, only [`SAFE_EXTRAS`] are exported and the others are
/// counted in [`WITHHELD`]; token counts that are integers become `gen_ai.usage.*`, the input
/// count with the cached counts added (an event's `input_tokens` leaves them out, the
/// conventions' includes them). Returns how many were left out for the bound.
pub(crate) fn extras(
    rec: &mut Rec,
    payload: &Payload<'_>,
    documented: &[&str],
    content: bool,
    max: usize,
    max_bytes: usize,
) -> u32 {
    let mut left_out = 0;
    let mut withheld = 0;
    let mut n = 0;
    // The input count, and the cached counts to add to it.
    let (mut input, mut cached) = (None, 0i64);
    for (k, raw) in payload.iter() {
        if documented.contains(&k.as_ref()) {
            continue;
        }
        if !content && !SAFE_EXTRAS.contains(&k.as_ref()) {
            withheld += 1;
            continue;
        }
        if n == max {
            left_out += 1;
            continue;
        }
        let value = match raw.as_bytes().first() {
            // OpenTelemetry has no null: the attribute is left out, as the SDKs do.
            Some(b'n') => continue,
            Some(b't') => Val::Bool(true),
            Some(b'f') => Val::Bool(false),
            Some(b'-' | b'0'..=b'9') => match raw.parse::<i64>() {
                Ok(i) => Val::Int(i),
                // An integer past i64 keeps its digits; only a fraction or exponent is a double.
                Err(_) if !raw.contains(['.', 'e', 'E']) => {
                    Val::Str(rec.push_bounded(raw, max_bytes))
                }
                Err(_) => Val::Double(raw.parse().unwrap_or(f64::NAN)),
            },
            _ => Val::Str(rec.push_bounded(&raw_text(raw), max_bytes)),
        };
        n += 1;
        match (USAGE.iter().find(|(name, _)| *name == k.as_ref()), value) {
            (Some(&(_, INPUT_TOKENS)), Val::Int(i)) => input = Some(i),
            (Some(&(_, key)), Val::Int(i)) => {
                if key.starts_with("gen_ai.usage.cache_") {
                    cached = cached.saturating_add(i);
                }
                rec.int(key, i);
            }
            _ if k.as_ref() == "user_id" => rec.set_attr("user.id", value),
            _ => rec.extra(&k, value),
        }
    }
    if let Some(i) = input {
        rec.int(INPUT_TOKENS, i.saturating_add(cached));
    }
    if withheld > 0 {
        rec.int(WITHHELD, withheld);
    }
    rec.dropped_attributes_count += left_out;
    left_out
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::{ScopeSpans, Span};
    use prost::Message as _;

    fn decode(rec: &Rec) -> Span {
        let mut buf = Vec::new();
        rec.encode(&mut buf);
        let mut s = ScopeSpans::decode(&buf[..]).unwrap();
        assert_eq!(s.spans.len(), 1);
        s.spans.remove(0)
    }

    fn attr(span: &Span, key: &str) -> Option<Value> {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.clone()?.value)
    }

    #[test]
    fn cut_keeps_a_character_boundary() {
        assert_eq!(cut("short", 10), ("short", false));
        let (kept, was_cut) = cut("ééééé", 6);
        assert!(was_cut && kept.len() + '…'.len_utf8() <= 6, "{kept}");
    }

    #[test]
    fn ids_are_nonzero_and_distinct() {
        let mut ids = Ids::new();
        let a = ids.span();
        let b = ids.span();
        assert_ne!(a, b);
        assert_ne!(a, [0; 8]);
        assert_ne!(ids.trace(), ids.trace());
    }

    #[test]
    fn varint_len_matches_the_encoding() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut b = Vec::new();
            varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
    }

    #[test]
    fn a_record_decodes_as_the_span_it_describes() {
        let mut r = Rec::empty();
        r.begin(Kind::Client, [7; 16], [3; 8], Some([9; 8]), 1_000);
        r.end = 2_000;
        r.name2("chat", "gpt-x");
        r.str("gen_ai.operation.name", "chat");
        r.str("gen_ai.provider.name", "");
        r.int("prx.messages_count", -5);
        r.int("prx.messages_count", 12);
        r.event(
            "exception",
            1_500,
            &[("exception.type", "tool"), ("exception.message", "boom")],
        );
        r.link([1; 16], [2; 8], 1);
        r.link([4; 16], [5; 8], 1);
        r.error("llm_error", "llm_response: success = false");
        r.dropped_attributes_count = 2;
        let s = decode(&r);
        assert_eq!(s.trace_id, vec![7; 16]);
        assert_eq!(s.span_id, vec![3; 8]);
        assert_eq!(s.parent_span_id, vec![9; 8]);
        assert_eq!(s.name, "chat gpt-x");
        assert_eq!(s.kind, 3);
        assert_eq!(
            (s.start_time_unix_nano, s.end_time_unix_nano),
            (1_000, 2_000)
        );
        assert_eq!(
            attr(&s, "gen_ai.operation.name"),
            Some(Value::StringValue("chat".into()))
        );
        assert_eq!(
            attr(&s, "gen_ai.provider.name"),
            Some(Value::StringValue(String::new()))
        );
        assert_eq!(attr(&s, "prx.messages_count"), Some(Value::IntValue(12)));
        assert_eq!(
            attr(&s, "error.type"),
            Some(Value::StringValue("llm_error".into()))
        );
        assert_eq!(s.attributes.len(), 4, "a replaced value is not repeated");
        assert_eq!(s.dropped_attributes_count, 2);
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].name, "exception");
        assert_eq!(s.events[0].time_unix_nano, 1_500);
        assert_eq!(s.events[0].attributes.len(), 2);
        assert_eq!(s.links.len(), 1);
        assert_eq!(s.links[0].trace_id, vec![1; 16]);
        assert_eq!(s.dropped_links_count, 1);
        let st = s.status.unwrap();
        assert_eq!(
            (st.code, st.message.as_str()),
            (2, "llm_response: success = false")
        );

        // Reused: nothing of the first span is left.
        r.clear();
        r.begin(Kind::Internal, [1; 16], [1; 8], None, 5);
        r.name2("execute_tool", "grep");
        let s = decode(&r);
        assert_eq!(s.name, "execute_tool grep");
        assert!(s.attributes.is_empty() && s.events.is_empty() && s.links.is_empty());
        assert!(s.status.is_none() && s.parent_span_id.is_empty());
    }

    #[test]
    fn extras_are_prefixed_typed_and_bounded() {
        let mut r = Rec::empty();
        r.begin(Kind::Internal, [1; 16], [1; 8], None, 0);
        let json = r#"{"tool":"t","cwd":"/p","n":3,"ok":true,"obj":{"a":[1,2]},"long":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;
        let mut members = Vec::new();
        let payload = Payload::parse(json, &mut members);
        let left = extras(&mut r, &payload, &["tool"], true, 4, 16);
        assert_eq!(left, 1);
        let s = decode(&r);
        let keys: Vec<_> = s.attributes.iter().map(|a| a.key.as_str()).collect();
        assert!(keys.iter().all(|k| k.starts_with(EXTRA_PREFIX)), "{keys:?}");
        assert!(!keys.contains(&"prx.extra.tool"));
        assert_eq!(s.attributes.len(), 4);
        assert_eq!(attr(&s, "prx.extra.n"), Some(Value::IntValue(3)));
        assert_eq!(attr(&s, "prx.extra.ok"), Some(Value::BoolValue(true)));
        assert_eq!(
            attr(&s, "prx.extra.obj"),
            Some(Value::StringValue(r#"{"a":[1,2]}"#.into()))
        );
        assert_eq!(s.dropped_attributes_count, 1);
    }

    #[test]
    fn extras_keep_their_json_type_null_left_out_and_large_integers_exact() {
        let mut r = Rec::empty();
        r.begin(Kind::Internal, [1; 16], [1; 8], None, 0);
        let json = r#"{"gone":null,"big":18446744073709551615,"neg":-9223372036854775808,"real":1.5e3,"id":"12"}"#;
        let mut members = Vec::new();
        let payload = Payload::parse(json, &mut members);
        assert_eq!(extras(&mut r, &payload, &[], true, 32, 4096), 0);
        let s = decode(&r);
        assert_eq!(
            attr(&s, "prx.extra.gone"),
            None,
            "OpenTelemetry has no null"
        );
        assert_eq!(
            attr(&s, "prx.extra.big"),
            Some(Value::StringValue("18446744073709551615".into())),
            "past i64: its digits, not a rounded double"
        );
        assert_eq!(attr(&s, "prx.extra.neg"), Some(Value::IntValue(i64::MIN)));
        assert_eq!(attr(&s, "prx.extra.real"), Some(Value::DoubleValue(1500.0)));
        assert_eq!(
            attr(&s, "prx.extra.id"),
            Some(Value::StringValue("12".into()))
        );
    }

    #[test]
    fn without_content_only_safe_extras_leave_and_tokens_use_the_conventions_names() {
        let mut r = Rec::empty();
        r.begin(Kind::Internal, [1; 16], [1; 8], None, 0);
        let json = r#"{"tool_input":{"command":"curl -H 'Authorization: Bearer s3cret'"},"cwd":"/home/me","prompt":"my password is","model":"m1","input_tokens":120,"output_tokens":30,"cache_read_input_tokens":7,"tool_use_id":"t1","brand_new_field":"x"}"#;
        let mut members = Vec::new();
        let payload = Payload::parse(json, &mut members);
        extras(&mut r, &payload, &[], false, 32, 4096);
        let s = decode(&r);
        let mut keys: Vec<_> = s.attributes.iter().map(|a| a.key.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "gen_ai.usage.cache_read.input_tokens",
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.output_tokens",
                "prx.content_withheld",
                "prx.extra.model",
                "prx.extra.tool_use_id",
            ]
        );
        assert_eq!(
            attr(&s, "gen_ai.usage.input_tokens"),
            Some(Value::IntValue(127)),
            "with the 7 cached"
        );
        assert_eq!(attr(&s, WITHHELD), Some(Value::IntValue(4)));
        assert!(!format!("{s:?}").contains("s3cret"));
    }

    /// An event's `input_tokens` leaves the cached ones out (Anthropic's meaning, which every
    /// agent's translation follows: docs/agents.md); the conventions' `gen_ai.usage.input_tokens`
    /// includes them, its cache counts being parts of it (Phoenix prices them so).
    #[test]
    fn the_conventions_input_tokens_include_the_cached_ones() {
        let usage = |json: &str| {
            let mut r = Rec::empty();
            r.begin(Kind::Client, [1; 16], [1; 8], None, 0);
            let mut members = Vec::new();
            extras(
                &mut r,
                &Payload::parse(json, &mut members),
                &[],
                false,
                32,
                4096,
            );
            let s = decode(&r);
            [
                "gen_ai.usage.input_tokens",
                "gen_ai.usage.cache_read.input_tokens",
                "gen_ai.usage.cache_creation.input_tokens",
                "gen_ai.usage.output_tokens",
            ]
            .map(|k| match attr(&s, k) {
                Some(Value::IntValue(i)) => Some(i),
                _ => None,
            })
        };
        assert_eq!(
            usage(
                r#"{"input_tokens":100,"cache_read_input_tokens":20,"cache_creation_input_tokens":5,"output_tokens":50}"#
            ),
            [Some(125), Some(20), Some(5), Some(50)]
        );
        // Gemini CLI's translation: promptTokenCount 1200 of which 1000 cached.
        assert_eq!(
            usage(r#"{"input_tokens":200,"output_tokens":85,"cache_read_input_tokens":1000}"#),
            [Some(1200), Some(1000), None, Some(85)]
        );
        // The short names (`cache_read_tokens`, `cache_write_tokens`); and no cache counts:
        // the input as given.
        assert_eq!(
            usage(r#"{"input_tokens":10,"cache_read_tokens":3,"cache_write_tokens":4}"#),
            [Some(17), Some(3), Some(4), None]
        );
        assert_eq!(
            usage(r#"{"input_tokens":10,"output_tokens":5}"#),
            [Some(10), None, None, Some(5)]
        );
        // Cache counts without an input count: no input count is made up.
        assert_eq!(
            usage(r#"{"cache_read_input_tokens":3}"#),
            [None, Some(3), None, None]
        );
    }
}
