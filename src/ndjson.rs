//! NDJSON event input, as `prx-hooks run --events` reads it: one object per line,
//!
//! ```json
//! {"event":"tool_call","agent":"a","session":"s","payload":{"tool":"shell","success":true,"output":"ok"}}
//! ```
//!
//! The envelope is strict (`event`, `agent`, `session`, `payload`; anything else is a typo worth
//! an error). The payload takes what agents really send (ARCHITECTURE.md § Events):
//!
//! * each documented field of the event, type-checked: a wrong type is an error naming the field
//!   (`payload.success: expected a boolean, found "yes"`);
//! * any other member is an **extra field**, kept byte-exact and delivered after the documented
//!   ones (PRX's runtime adds `provider`/`model` to `agent_start`, `tokens_used` to `agent_end`…);
//! * a missing documented field is an error naming it (with "did you mean" when an extra field
//!   looks like a misspelling of it), except `agent`/`session` of `agent_start`, which the
//!   envelope provides; with [`ParseOptions::lenient`] it is accepted and left out of the
//!   payload instead ([`Record::omitted`]).
//!
//! `agent` and `session` are at most [`MAX_NAME_BYTES`] (256) bytes each: a longer one is an
//! error naming the field and the limit, for topic lines too.
//!
//! `payload` may be left out only for `turn_complete` (or, lenient, when every field may be
//! missing). `tool_call_start.arguments` may be an object (embedded as is) or a string holding
//! JSON text (embedded if it is an object, passed on as a string otherwise); any other JSON value
//! is passed on as its text.
//!
//! Errors read `COLUMN: PATH: REASON` (the caller puts `FILE:LINE:` in front). serde_json reads
//! the line: it borrows member values as raw text (so extra fields, member order and number
//! spelling survive untouched) and knows positions. simd-json would parse faster but has no raw
//! values (it re-spells numbers: `1e2` → `100.0`) and no columns, and this parser already runs
//! well above the 1 M lines/s the input needs (benches/serialize.rs, `ndjson/` group).

use crate::event::{Event, EventKind, Extras, Parts};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// The longest agent name and the longest session id a line may have, in bytes (UTF-8).
///
/// Agents' session ids are UUIDs (36 bytes) or short names; 256 bytes leaves room for a path
/// while keeping what the session map holds per key small (ARCHITECTURE.md § Ingest). It is
/// also the most a NATS consumer takes from a `Prx-Agent` or `Prx-Session` header
/// (`nats::wire::MAX_HEADER_VALUE` is this constant), so whatever a line brings in can cross
/// the NATS bridge.
pub const MAX_NAME_BYTES: usize = 256;

/// How strict [`parse_line_with`] is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParseOptions {
    /// Accept events whose payload lacks documented fields: the fields are left out of the
    /// payload hooks see (`prx-hooks run --lenient`).
    pub lenient: bool,
}

impl ParseOptions {
    /// Missing documented fields are accepted and left out of the payload.
    pub fn lenient() -> ParseOptions {
        ParseOptions { lenient: true }
    }
}

/// One parsed line: the emitter identity, the event, and what came beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The emitting agent's name (`claude-code`, …).
    pub agent: String,
    /// The agent's session id.
    pub session: String,
    kind: EventKind,
    strs: [String; 2],
    num: u64,
    flag: bool,
    /// The extra members as one JSON object's text (`""` for none).
    extras: String,
    omitted: Vec<&'static str>,
}

impl Record {
    /// The line's `event`.
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The event's documented fields, borrowing from the record.
    pub fn event(&self) -> Event<'_> {
        Event::from_parts(Parts {
            kind: self.kind,
            strs: [&self.strs[0], &self.strs[1]],
            num: [self.num],
            flag: self.flag,
        })
    }

    /// Extra fields and omitted documented fields, for
    /// [`Emitter::emit_with_extras`](crate::Emitter::emit_with_extras).
    pub fn extras(&self) -> Extras<'_> {
        Extras::fields(&self.extras).omit(&self.omitted)
    }

    /// The extra fields' JSON object text (empty when there are none).
    pub(crate) fn extras_json(&self) -> &str {
        &self.extras
    }

    /// Whether the line carried anything beyond the documented fields (or lacked one).
    pub fn has_extras(&self) -> bool {
        !self.extras.is_empty() || !self.omitted.is_empty()
    }

    /// Documented fields the payload lacked (lenient parsing only).
    pub fn omitted(&self) -> &[&'static str] {
        &self.omitted
    }

    /// The payload JSON hooks will see: documented fields, then the extra ones.
    pub fn payload_json(&self) -> String {
        let omitted = self.extras().check(self.kind).unwrap_or(0);
        let mut out = Vec::with_capacity(64 + self.extras.len());
        self.event().write_payload(&mut out, &self.extras, omitted);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Bytes this event holds in a ring slot (agent, session, fields, extras): what
    /// `max_event_bytes` is compared with.
    pub fn byte_len(&self) -> usize {
        self.agent.len()
            + self.session.len()
            + self.strs.iter().map(String::len).sum::<usize>()
            + self.extras.len()
    }
}

/// Why a line was rejected: the column (1-based, in bytes of the line), the JSON path of the offending member (`payload.success`; empty for the line as a whole) and
/// the reason. Displays as `COLUMN: PATH: REASON`, to follow `FILE:LINE:`; always one line
/// (control characters quoted from the input are escaped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    column: usize,
    path: String,
    reason: String,
    text: String,
}

impl LineError {
    fn new(column: usize, path: &str, reason: String) -> LineError {
        let reason = one_line(reason);
        let path = one_line(path.to_string());
        let text = if path.is_empty() {
            format!("{column}: {reason}")
        } else {
            format!("{column}: {path}: {reason}")
        };
        LineError {
            column,
            path,
            reason,
            text,
        }
    }

    /// The whole message, `COLUMN: PATH: REASON`.
    pub fn message(&self) -> &str {
        &self.text
    }

    /// 1-based byte column in the line.
    pub fn column(&self) -> usize {
        self.column
    }

    /// `payload.success`, `event`, … (empty when the error is about the line as a whole).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong, on one line.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for LineError {}

/// `s` with its control characters escaped (`\n`), so an error stays on one line.
pub(crate) fn one_line(s: String) -> String {
    if !s.chars().any(char::is_control) {
        return s;
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.into()
            }
        })
        .collect()
}

/// A JSON object's members in order, values as raw text.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(4));
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads `text` (which starts at column `base + 1` of the line) as an object's members.
fn members<'a>(text: &'a str, base: usize, path: &str) -> Result<Members<'a>, LineError> {
    let trimmed = text.trim_start();
    if !trimmed.starts_with('{') {
        let at = base + text.len() - trimmed.len() + 1;
        let found = match serde_json::from_str::<&RawValue>(text) {
            Ok(raw) => describe(raw.get()),
            Err(e) => return Err(serde_error(&e, base, path)),
        };
        return Err(LineError::new(
            at,
            path,
            format!("expected a JSON object, found {found}"),
        ));
    }
    serde_json::from_str(text).map_err(|e| serde_error(&e, base, path))
}

/// serde_json's "... at line 1 column N" as our `COLUMN: PATH: REASON`.
fn serde_error(e: &serde_json::Error, base: usize, path: &str) -> LineError {
    let msg = e.to_string();
    let msg = msg.split(" at line ").next().unwrap_or(&msg);
    let what = match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON: ",
        _ => "",
    };
    LineError::new(base + e.column(), path, format!("{what}{msg}"))
}

/// What a raw JSON value is, for "expected X, found Y": `a string "yes"`, `a number -1.5`, …
fn describe(raw: &str) -> String {
    let shown = |s: &str| {
        let mut chars = s.chars();
        let head: String = chars.by_ref().take(40).collect();
        if chars.next().is_some() {
            format!("{head}…")
        } else {
            head
        }
    };
    match raw.as_bytes().first() {
        Some(b'"') => format!("a string {}", shown(raw)),
        Some(b't' | b'f') => format!("a boolean {raw}"),
        Some(b'n') => "null".to_string(),
        Some(b'[') => "an array".to_string(),
        Some(b'{') => "an object".to_string(),
        _ => format!("a number {}", shown(raw)),
    }
}

/// Column (1-based) of `raw` inside `text`, which starts at column `base + 1`.
fn column_of(raw: &RawValue, text: &str, base: usize) -> usize {
    base + (raw.get().as_ptr() as usize).saturating_sub(text.as_ptr() as usize) + 1
}

fn field_str(raw: &RawValue, at: usize, path: &str) -> Result<String, LineError> {
    let text = raw.get();
    match text.as_bytes().first() {
        // Without an escape the string is its text between the quotes: serde_json already
        // refused control characters while reading the raw value, and the line is UTF-8.
        Some(b'"') if text.len() >= 2 && !text.as_bytes().contains(&b'\\') => {
            Ok(text[1..text.len() - 1].to_string())
        }
        Some(b'"') => serde_json::from_str(text)
            .map_err(|e| LineError::new(at, path, format!("invalid string: {e}"))),
        _ => Err(LineError::new(
            at,
            path,
            format!("expected a string, found {}", describe(raw.get())),
        )),
    }
}

fn field_bool(raw: &RawValue, at: usize, path: &str) -> Result<bool, LineError> {
    match raw.get() {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(LineError::new(
            at,
            path,
            format!("expected a boolean, found {}", describe(other)),
        )),
    }
}

fn field_u64(raw: &RawValue, at: usize, path: &str) -> Result<u64, LineError> {
    raw.get().parse::<u64>().map_err(|_| {
        LineError::new(
            at,
            path,
            format!(
                "expected a whole number from 0 to {}, found {}",
                u64::MAX,
                describe(raw.get())
            ),
        )
    })
}

/// Parses one line (without its newline), strictly. Blank lines are the caller's business.
pub fn parse_line(line: &[u8]) -> Result<Record, LineError> {
    parse_line_with(line, ParseOptions::default())
}

/// Parses one line (without its newline) with `options`. A topic line is refused here (its
/// error says so): [`parse_input_with`] reads both forms.
pub fn parse_line_with(line: &[u8], options: ParseOptions) -> Result<Record, LineError> {
    match parse(line, options, false)? {
        Input::Event(record) => Ok(record),
        // `parse` refuses topic lines when they are not allowed.
        Input::Topic(_) => Err(LineError::new(1, "topic", "not an event line".into())),
    }
}

/// A line of either form: a lifecycle event, or an agent's own event for a custom topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A lifecycle event line.
    Event(Record),
    /// A line with a `topic` member instead of an `event`.
    Topic(TopicRecord),
}

/// A topic line, `{"topic":"prx.agent.<agent>.<event>","agent":…,"session":…,"payload":{…}}`:
/// an event an agent sends that no lifecycle event fits (Claude Code's `Notification`, …),
/// published on the bus under `topic` with the line's agent and session
/// ([`Bus::publish_from`](crate::Bus::publish_from)). Shell hooks, which run on lifecycle
/// events, do not see it; plugins, the live stream, `tail` and NATS do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicRecord {
    /// The subject it is published under, `prx.agent.<agent>.<event>`.
    pub topic: String,
    /// The emitting agent's name.
    pub agent: String,
    /// The agent's session id.
    pub session: String,
    /// The payload object's text as the line spelled it.
    pub payload: String,
}

/// Topics a topic line may name start with this.
pub const AGENT_TOPIC_PREFIX: &str = "prx.agent.";

/// Parses one line of either form (without its newline) with `options`.
///
/// # Examples
///
/// ```
/// use prx_hooks::ndjson::{Input, ParseOptions, parse_input_with};
/// let line = br#"{"topic":"prx.agent.claude-code.Notification","agent":"claude-code","session":"s1","payload":{"message":"waiting"}}"#;
/// let Ok(Input::Topic(t)) = parse_input_with(line, ParseOptions::default()) else { panic!() };
/// assert_eq!((t.topic.as_str(), t.payload.as_str()), ("prx.agent.claude-code.Notification", r#"{"message":"waiting"}"#));
/// ```
pub fn parse_input_with(line: &[u8], options: ParseOptions) -> Result<Input, LineError> {
    parse(line, options, true)
}

fn parse(line: &[u8], options: ParseOptions, topics: bool) -> Result<Input, LineError> {
    let text = std::str::from_utf8(line).map_err(|e| {
        LineError::new(
            e.valid_up_to() + 1,
            "",
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })?;
    let envelope = members(text, 0, "")?;
    let (mut event, mut topic, mut agent, mut session, mut payload) =
        (None, None, None, None, None);
    for (key, raw) in &envelope.0 {
        let at = column_of(raw, text, 0);
        let slot = match &**key {
            "event" => &mut event,
            "topic" => &mut topic,
            "agent" => &mut agent,
            "session" => &mut session,
            "payload" => {
                if payload.replace(*raw).is_some() {
                    return Err(LineError::new(at, "payload", "appears twice".into()));
                }
                continue;
            }
            other => {
                let hint = crate::suggest(other, &["event", "agent", "session", "payload"])
                    .map(|s| format!("; did you mean \"{s}\"?"))
                    .unwrap_or_else(|| {
                        "; a line has event, agent, session and payload (extra event fields go \
                         inside payload)"
                            .to_string()
                    });
                let at = text.find(&format!("\"{other}\"")).map_or(at, |i| i + 1);
                return Err(LineError::new(at, other, format!("unknown member{hint}")));
            }
        };
        let value = field_str(raw, at, key)?;
        if matches!(&**key, "agent" | "session") && value.len() > MAX_NAME_BYTES {
            return Err(LineError::new(at, key, name_too_long(value.len())));
        }
        if slot.replace((value, at)).is_some() {
            return Err(LineError::new(at, key, "appears twice".into()));
        }
    }
    let missing = |name: &str| {
        LineError::new(
            1,
            name,
            "missing (a line needs event, agent and session)".into(),
        )
    };
    if let Some((topic, at)) = topic {
        if !topics {
            return Err(LineError::new(
                at,
                "topic",
                "a topic line is not read here (only the ingest reads topic lines)".into(),
            ));
        }
        if event.is_some() {
            return Err(LineError::new(
                at,
                "topic",
                "a line has either event or topic, not both".into(),
            ));
        }
        return topic_line(text, topic, at, agent, session, payload).map(Input::Topic);
    }
    let (event, at) = event.ok_or_else(|| missing("event"))?;
    let (agent, _) = agent.ok_or_else(|| missing("agent"))?;
    let (session, _) = session.ok_or_else(|| missing("session"))?;
    let kind = EventKind::from_name(&event).ok_or_else(|| unknown_event(&event, at))?;
    match payload {
        Some(raw) => {
            let base = column_of(raw, text, 0) - 1;
            read_payload(kind, raw.get(), base, agent, session, options).map(Input::Event)
        }
        None => {
            let fields = kind.fields();
            if !fields.is_empty() && !options.lenient && kind != EventKind::AgentStart {
                return Err(LineError::new(
                    text.len().max(1),
                    "payload",
                    format!(
                        "missing ({} {kind} event needs {})",
                        kind.article(),
                        fields.join(", ")
                    ),
                ));
            }
            read_payload(kind, "{}", 0, agent, session, options).map(Input::Event)
        }
    }
}

/// Why an agent or session name of `len` bytes is refused.
pub(crate) fn name_too_long(len: usize) -> String {
    format!("{len} bytes; agent and session names are at most {MAX_NAME_BYTES} bytes")
}

/// The rest of a topic line: its topic's shape, agent, session and an object payload.
fn topic_line(
    text: &str,
    topic: String,
    at: usize,
    agent: Option<(String, usize)>,
    session: Option<(String, usize)>,
    payload: Option<&RawValue>,
) -> Result<TopicRecord, LineError> {
    let missing = |name: &str| {
        LineError::new(
            1,
            name,
            "missing (a topic line needs topic, agent, session and payload)".into(),
        )
    };
    let shape = match topic.strip_prefix(AGENT_TOPIC_PREFIX) {
        Some(rest) if rest.split('.').count() >= 2 => crate::bus::check_topic(&topic),
        _ => Err(format!(
            "expected \"{AGENT_TOPIC_PREFIX}<agent>.<event>\", found {topic:?}"
        )),
    };
    if let Err(reason) = shape {
        return Err(LineError::new(at, "topic", reason));
    }
    let (agent, _) = agent.ok_or_else(|| missing("agent"))?;
    let (session, _) = session.ok_or_else(|| missing("session"))?;
    let raw = payload.ok_or_else(|| missing("payload"))?;
    let at = column_of(raw, text, 0);
    if !raw.get().starts_with('{') {
        return Err(LineError::new(
            at,
            "payload",
            format!("expected a JSON object, found {}", describe(raw.get())),
        ));
    }
    let depth = crate::event::EXTRAS_MAX_DEPTH;
    if let Err(r) = crate::json::check_value(raw.get().as_bytes(), depth) {
        return Err(LineError::new(
            at + r.at,
            "payload",
            format!(
                "{} (a topic payload must be strict JSON, at most {depth} levels deep)",
                r.reason
            ),
        ));
    }
    Ok(TopicRecord {
        topic,
        agent,
        session,
        payload: raw.get().to_string(),
    })
}

/// Parses a payload alone (the `payload` member of a line), strictly, for an event of `kind`:
/// what `prx-hooks fire --payload` and the HTTP test endpoint accept. Columns count from the
/// start of `text`.
pub fn parse_payload(
    kind: EventKind,
    text: &str,
    agent: &str,
    session: &str,
) -> Result<Record, LineError> {
    parse_payload_with(kind, text, agent, session, ParseOptions::default())
}

/// [`parse_payload`] with `options`.
pub fn parse_payload_with(
    kind: EventKind,
    text: &str,
    agent: &str,
    session: &str,
    options: ParseOptions,
) -> Result<Record, LineError> {
    read_payload(
        kind,
        text,
        0,
        agent.to_string(),
        session.to_string(),
        options,
    )
}

/// Reads a payload object for `kind`; `base` is its column offset in the line.
fn read_payload(
    kind: EventKind,
    text: &str,
    base: usize,
    agent: String,
    session: String,
    options: ParseOptions,
) -> Result<Record, LineError> {
    let members = members(text, base, "payload")?;
    let fields = kind.fields();
    let mut strs: [Option<String>; 2] = [None, None];
    let (mut num, mut flag): (Option<u64>, Option<bool>) = (None, None);
    let mut present = 0u8;
    let mut extras = String::new();
    let mut extra_names = crate::json::Seen::<&str>::new();
    for (key, raw) in &members.0 {
        let at = column_of(raw, text, base);
        let path = format!("payload.{key}");
        let Some(index) = fields.iter().position(|f| *f == key.as_ref()) else {
            if !extra_names.insert(key.as_ref()) {
                return Err(LineError::new(at, &path, "appears twice".into()));
            }
            push_extra(&mut extras, key, raw, at, &path)?;
            continue;
        };
        if present & (1 << index) != 0 {
            return Err(LineError::new(at, &path, "appears twice".into()));
        }
        present |= 1 << index;
        match fields[index] {
            "success" => flag = Some(field_bool(raw, at, &path)?),
            "messages_count" | "duration_ms" => num = Some(field_u64(raw, at, &path)?),
            "arguments" => strs[1] = Some(arguments_text(raw, at, &path)?),
            // Every other documented field is one of the event's (at most two) strings.
            name => strs[string_slot(kind, name)] = Some(field_str(raw, at, &path)?),
        }
    }
    if !extras.is_empty() {
        extras.push('}');
    }
    let mut omitted = Vec::new();
    for (index, &field) in fields.iter().enumerate() {
        if present & (1 << index) != 0 {
            continue;
        }
        // agent_start's own fields: the envelope's, when the payload does not repeat them.
        if kind == EventKind::AgentStart {
            strs[index] = Some(if index == 0 {
                agent.clone()
            } else {
                session.clone()
            });
            continue;
        }
        if options.lenient {
            omitted.push(field);
            continue;
        }
        return Err(missing(kind, field, extra_names.names(), base));
    }
    let [a, b] = strs;
    Ok(Record {
        agent,
        session,
        kind,
        strs: [a.unwrap_or_default(), b.unwrap_or_default()],
        num: num.unwrap_or(0),
        flag: flag.unwrap_or(false),
        extras,
        omitted,
    })
}

/// Appends an extra (undocumented) member to `extras`, checked as strictly as
/// `emit_with_extras` checks it.
fn push_extra(
    extras: &mut String,
    key: &str,
    raw: &RawValue,
    at: usize,
    path: &str,
) -> Result<(), LineError> {
    // serde_json read the value leniently (it lets a lone `\u` surrogate through): an
    // extra field must pass the check `emit_with_extras` makes, here, with its column.
    let depth = crate::event::EXTRAS_MAX_DEPTH - 1;
    if let Err(r) = crate::json::check_value(raw.get().as_bytes(), depth) {
        return Err(LineError::new(
            at + r.at,
            path,
            format!(
                "{} (an extra field must be strict JSON: \\u surrogates in pairs, at most {depth} levels deep)",
                r.reason
            ),
        ));
    }
    extras.push(if extras.is_empty() { '{' } else { ',' });
    // The name re-quoted (JSON-equal; byte-equal unless it held escapes), the value
    // byte-exact.
    extras.push_str(&serde_json::to_string(key).unwrap_or_default());
    extras.push(':');
    extras.push_str(raw.get());
    Ok(())
}

/// The error for `kind`'s documented `field` missing from a payload whose column is `base`,
/// with a hint when an extra member's name is close to it.
#[cold]
fn missing(kind: EventKind, field: &str, extra_names: &[&str], base: usize) -> LineError {
    let hint = crate::suggest(field, extra_names)
        .map(|s| format!("; did you mean to write \"{field}\" instead of \"{s}\"?"))
        .unwrap_or_default();
    LineError::new(
        base + 1,
        &format!("payload.{field}"),
        format!(
            "missing ({} {kind} event needs {}){hint}",
            kind.article(),
            kind.fields().join(", ")
        ),
    )
}

/// Which of `kind`'s (up to two) string slots its documented string field `name` goes in.
fn string_slot(kind: EventKind, name: &str) -> usize {
    let strings: &[&str] = match kind {
        EventKind::AgentStart => &["agent", "session"],
        EventKind::LlmRequest | EventKind::LlmResponse => &["provider", "model"],
        EventKind::ToolCallStart => &["tool", "arguments"],
        EventKind::ToolCall => &["tool", "output"],
        EventKind::Error => &["component", "message"],
        EventKind::AgentEnd | EventKind::TurnComplete => &[],
    };
    strings.iter().position(|s| *s == name).unwrap_or(0)
}

fn unknown_event(name: &str, at: usize) -> LineError {
    let names: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
    let hint = crate::suggest(name, &names)
        .map(|s| format!("; did you mean \"{s}\"?"))
        .unwrap_or_else(|| format!("; expected one of {}", names.join(", ")));
    LineError::new(at, "event", format!("unknown event \"{name}\"{hint}"))
}

/// `arguments` as the JSON text the event carries: a string's contents, or any other value's
/// own text.
fn arguments_text(raw: &RawValue, at: usize, path: &str) -> Result<String, LineError> {
    let raw = raw.get();
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw)
            .map_err(|e| LineError::new(at, path, format!("invalid string: {e}")))
    } else {
        Ok(raw.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: &str) -> String {
        parse_line(line.as_bytes())
            .unwrap_err()
            .message()
            .to_string()
    }

    #[test]
    fn parses_every_event() {
        let lines = [
            r#"{"event":"agent_start","agent":"a","session":"s","payload":{"agent":"a","session":"s"}}"#,
            r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":true,"messages_count":3}}"#,
            r#"{"event":"llm_request","agent":"a","session":"s","payload":{"provider":"p","model":"m","messages_count":1}}"#,
            r#"{"event":"llm_response","agent":"a","session":"s","payload":{"provider":"p","model":"m","duration_ms":5,"success":false}}"#,
            r#"{"event":"tool_call_start","agent":"a","session":"s","payload":{"tool":"t","arguments":{"b":1,"a":[2]}}}"#,
            r#"{"event":"tool_call","agent":"a","session":"s","payload":{"tool":"t","success":true,"output":"o\n"}}"#,
            r#"{"event":"turn_complete","agent":"a","session":"s"}"#,
            r#"{"event":"error","agent":"a","session":"s","payload":{"component":"c","message":"m"}}"#,
        ];
        for (line, kind) in lines.iter().zip(EventKind::ALL) {
            let r = parse_line(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(
                (r.kind(), r.agent.as_str(), r.session.as_str()),
                (kind, "a", "s")
            );
            assert!(!r.has_extras());
            let payload: serde_json::Value = serde_json::from_str(line).unwrap();
            let want = payload
                .get("payload")
                .cloned()
                .unwrap_or(serde_json::json!({}));
            let got: serde_json::Value = serde_json::from_str(&r.event().to_json()).unwrap();
            assert_eq!(got, want, "{line}");
            assert_eq!(r.payload_json(), r.event().to_json());
        }
    }

    #[test]
    fn arguments_keep_member_order_and_strings_pass_through() {
        let r = parse_line(br#"{"event":"tool_call_start","agent":"a","session":"s","payload":{"tool":"t","arguments":{"z":1,"a":2}}}"#).unwrap();
        assert_eq!(
            r.event().to_json(),
            r#"{"tool":"t","arguments":{"z":1,"a":2}}"#
        );
        let r = parse_line(br#"{"event":"tool_call_start","agent":"a","session":"s","payload":{"tool":"t","arguments":"{\"x\":1}"}}"#).unwrap();
        assert_eq!(r.event().to_json(), r#"{"tool":"t","arguments":{"x":1}}"#);
        let r = parse_line(br#"{"event":"tool_call_start","agent":"a","session":"s","payload":{"tool":"t","arguments":"ls -la"}}"#).unwrap();
        assert_eq!(r.event().to_json(), r#"{"tool":"t","arguments":"ls -la"}"#);
    }

    #[test]
    fn unknown_payload_members_are_extras_kept_byte_exact_after_the_documented_fields() {
        // PRX's runtime: agent_start with provider/model and no agent/session.
        let r = parse_line(br#"{"event":"agent_start","agent":"a","session":"s","payload":{"provider":"openai","model":"gpt-x"}}"#).unwrap();
        assert_eq!(
            r.payload_json(),
            r#"{"agent":"a","session":"s","provider":"openai","model":"gpt-x"}"#
        );
        // Numbers keep their spelling, nested values their order; whitespace goes.
        let r = parse_line(br#"{"event":"llm_response","agent":"a","session":"s","payload":{"provider":"p","error_message": null, "model":"m","duration_ms":5,"success":false,"cost":1e2,"z":{"b": -0, "a":[1.50]}}}"#).unwrap();
        assert_eq!(
            r.payload_json(),
            r#"{"provider":"p","model":"m","duration_ms":5,"success":false,"error_message":null,"cost":1e2,"z":{"b":-0,"a":[1.50]}}"#
        );
        assert_eq!(
            r.extras().json(),
            r#"{"error_message":null,"cost":1e2,"z":{"b": -0, "a":[1.50]}}"#
        );
        // turn_complete: extras are the whole payload.
        let r = parse_line(br#"{"event":"turn_complete","agent":"a","session":"s","payload":{"mode":"chat","response_chars":12}}"#).unwrap();
        assert_eq!(r.payload_json(), r#"{"mode":"chat","response_chars":12}"#);
    }

    /// serde_json lets a lone surrogate escape through a raw value; an extra field holding one
    /// is refused with its path, as `emit_with_extras` would refuse it (found by fuzzing).
    #[test]
    fn an_extra_field_must_be_strict_json() {
        let line = br#"{"event":"turn_complete","agent":"a","session":"s","payload":{"ok":1,"m":"x\ude00"}}"#;
        let e = parse_line(line).unwrap_err();
        assert_eq!(e.path(), "payload.m", "{e}");
        assert!(e.reason().contains("strict JSON"), "{e}");
        let fine = br#"{"event":"turn_complete","agent":"a","session":"s","payload":{"m":"x\ud83d\ude00"}}"#;
        let r = parse_line(fine).unwrap();
        assert_eq!(r.payload_json(), r#"{"m":"x\ud83d\ude00"}"#);
    }

    #[test]
    fn lenient_accepts_missing_documented_fields_and_leaves_them_out() {
        // PRX's agent_end: {duration_ms, tokens_used}, no success/messages_count.
        let line = br#"{"event":"agent_end","agent":"a","session":"s","payload":{"duration_ms":12,"tokens_used":300}}"#;
        assert!(parse_line(line).is_err());
        let r = parse_line_with(line, ParseOptions::lenient()).unwrap();
        assert_eq!(r.omitted(), ["success", "messages_count"]);
        assert_eq!(r.payload_json(), r#"{"duration_ms":12,"tokens_used":300}"#);
        let r = parse_line_with(
            br#"{"event":"error","agent":"a","session":"s"}"#,
            ParseOptions::lenient(),
        )
        .unwrap();
        assert_eq!(r.payload_json(), "{}");
    }

    #[test]
    fn bad_lines_say_where_what_and_why() {
        let cases = [
            ("not json", "2: not JSON: expected ident"),
            ("[1]", "1: expected a JSON object, found an array"),
            (
                r#"{"event":"tool_cal","agent":"a","session":"s"}"#,
                r#"10: event: unknown event "tool_cal"; did you mean "tool_call"?"#,
            ),
            (
                r#"{"event":"bogus","agent":"a","session":"s"}"#,
                "expected one of agent_start",
            ),
            (r#"{"agent":"a","session":"s"}"#, "1: event: missing"),
            (r#"{"event":"error","session":"s"}"#, "1: agent: missing"),
            (
                r#"{"event":"error","agent":1,"session":"s"}"#,
                "26: agent: expected a string, found a number 1",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","extra":1}"#,
                "44: extra: unknown member",
            ),
            (
                r#"{"event":"error","agent":"a","sesion":"s","payload":{}}"#,
                r#"did you mean "session"?"#,
            ),
            (
                r#"{"event":"error","agent":"a","session":"s"}"#,
                "payload: missing (an error event needs component, message)",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":{"component":"c"}}"#,
                "54: payload.message: missing (an error event needs component, message)",
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":"yes","messages_count":1}}"#,
                r#"69: payload.success: expected a boolean, found a string "yes""#,
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":true,"messages_count":-1}}"#,
                "payload.messages_count: expected a whole number from 0 to 18446744073709551615, found a number -1",
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":true,"messages_count":1.5}}"#,
                "found a number 1.5",
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"sucess":true,"messages_count":1}}"#,
                r#"payload.success: missing (an agent_end event needs success, messages_count); did you mean to write "success" instead of "sucess"?"#,
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":[]}"#,
                "54: payload: expected a JSON object, found an array",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":{"component":"c","component":"d","message":"m"}}"#,
                "payload.component: appears twice",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":{"x":1,"x":2,"component":"c","message":"m"}}"#,
                "payload.x: appears twice",
            ),
            (r#"{"event":"error""#, "not JSON: EOF while parsing"),
        ];
        for (line, want) in cases {
            let got = err(line);
            assert!(got.contains(want), "{line}\n  got:  {got}\n  want: {want}");
        }
        assert_eq!(
            parse_line(b"{\"event\":\"\xff\"}").unwrap_err().message(),
            "11: invalid UTF-8 at byte 10"
        );
    }

    #[test]
    fn agent_and_session_names_are_bounded_at_their_column_for_events_and_topics() {
        let max = "x".repeat(MAX_NAME_BYTES);
        let line = |agent: &str, session: &str| {
            format!(r#"{{"event":"turn_complete","agent":"{agent}","session":"{session}"}}"#)
        };
        let r = parse_line(line(&max, &max).as_bytes()).unwrap();
        assert_eq!(
            (r.agent.len(), r.session.len()),
            (MAX_NAME_BYTES, MAX_NAME_BYTES)
        );
        assert_eq!(
            err(&line(&format!("{max}y"), "s")),
            "34: agent: 257 bytes; agent and session names are at most 256 bytes"
        );
        // Counted in bytes: 129 two-byte characters are 258 bytes.
        let e = parse_line(line("a", &"é".repeat(129)).as_bytes()).unwrap_err();
        assert_eq!((e.path(), e.column()), ("session", 48));
        assert!(e.reason().starts_with("258 bytes;"), "{e}");
        let topic = format!(
            r#"{{"topic":"prx.agent.a.Note","agent":"{max}y","session":"s","payload":{{}}}}"#
        );
        let e = parse_input_with(topic.as_bytes(), ParseOptions::default()).unwrap_err();
        assert_eq!(e.path(), "agent");
    }
}
