//! NDJSON event input, as `prx-hooks run --events` reads it: one object per line,
//!
//! ```json
//! {"event":"tool_call","agent":"a","session":"s","payload":{"tool":"shell","success":true,"output":"ok"}}
//! ```
//!
//! The parser is strict, because a typo in a field name silently producing an empty payload is
//! worse than an error: unknown events, unknown fields, missing fields and wrong types are all
//! rejected with a reason that names the field, says what was expected, and gives the column.
//! `payload` may be left out only for `turn_complete`. `tool_call_start.arguments` may be an
//! object (embedded as is) or a string holding JSON text (embedded if it is an object, passed
//! on as a string otherwise); any other JSON value is passed on as its text.
//!
//! serde_json does the parsing: it borrows `arguments` as raw text (so member order and number
//! spelling survive untouched) and knows columns for its errors.

use crate::event::{Event, EventKind, Parts};
use serde::Deserialize;
use serde_json::value::RawValue;

/// One parsed line: the emitter identity and the event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub agent: String,
    pub session: String,
    kind: EventKind,
    strs: [String; 2],
    num: u64,
    flag: bool,
}

impl Record {
    pub fn kind(&self) -> EventKind {
        self.kind
    }

    /// The event, borrowing from the record.
    pub fn event(&self) -> Event<'_> {
        Event::from_parts(Parts {
            kind: self.kind,
            strs: [&self.strs[0], &self.strs[1]],
            num: [self.num],
            flag: self.flag,
        })
    }
}

/// Why a line was rejected. The message is meant to follow `FILE:LINE: ` and is always one
/// line: names quoted from the input have their control characters escaped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LineError(String);

impl LineError {
    fn new(message: String) -> LineError {
        if !message.chars().any(char::is_control) {
            return LineError(message);
        }
        LineError(
            message
                .chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_debug().to_string()
                    } else {
                        c.into()
                    }
                })
                .collect(),
        )
    }

    pub fn message(&self) -> &str {
        &self.0
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    event: String,
    agent: String,
    session: String,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Payload<'a> {
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    success: Option<bool>,
    #[serde(default)]
    messages_count: Option<u64>,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    duration_ms: Option<u64>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    component: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Parses one line (without its newline). Blank lines are the caller's business.
pub fn parse_line(line: &[u8]) -> Result<Record, LineError> {
    let text = std::str::from_utf8(line).map_err(|e| {
        LineError::new(format!(
            "invalid UTF-8 at byte {} (column {})",
            e.valid_up_to(),
            e.valid_up_to() + 1
        ))
    })?;
    expect_object(text, 0, "")?;
    let parsed: Line<'_> = serde_json::from_str(text).map_err(|e| serde_error(&e, 0, ""))?;
    let kind = EventKind::from_name(&parsed.event).ok_or_else(|| unknown_event(&parsed.event))?;
    let payload = match parsed.payload {
        Some(raw) => {
            let base = raw.get().as_ptr() as usize - text.as_ptr() as usize;
            read_payload(kind, raw.get(), base)?
        }
        None if kind.fields().is_empty() => Payload::default(),
        None => {
            return Err(LineError::new(format!(
                "missing field `payload` (a {} event needs {})",
                kind.name(),
                kind.fields().join(", ")
            )));
        }
    };
    build(kind, parsed.agent, parsed.session, payload)
}

/// Parses a payload alone (the `payload` member of a line), for an event of `kind`: what
/// `prx-hooks fire --payload` and the HTTP test endpoint accept. Columns count from the start of
/// `text`.
pub fn parse_payload(
    kind: EventKind,
    text: &str,
    agent: &str,
    session: &str,
) -> Result<Record, LineError> {
    let p = read_payload(kind, text, 0)?;
    build(kind, agent.to_string(), session.to_string(), p)
}

/// A payload object with exactly `kind`'s fields; `base` is its column offset in the line.
fn read_payload(kind: EventKind, text: &str, base: usize) -> Result<Payload<'_>, LineError> {
    expect_object(text, base, "payload: ")?;
    let p: Payload<'_> =
        serde_json::from_str(text).map_err(|e| serde_error(&e, base, "payload: "))?;
    check_fields(kind, &p, text, base)?;
    Ok(p)
}

/// Rejects anything but an object up front, so the error names JSON types rather than our
/// internal structs.
fn expect_object(text: &str, base: usize, prefix: &str) -> Result<(), LineError> {
    if text.trim_start().starts_with('{') {
        return Ok(());
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| serde_error(&e, base, prefix))?;
    let found = match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    };
    Err(LineError::new(format!(
        "{prefix}expected a JSON object, found {found} (column {})",
        base + 1
    )))
}

/// Turns serde_json's "... at line 1 column N" into "... (column N)", shifted by `base` when
/// the text was a slice of the line.
fn serde_error(e: &serde_json::Error, base: usize, prefix: &str) -> LineError {
    let msg = e.to_string();
    let msg = msg.split(" at line ").next().unwrap_or(&msg);
    let what = match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON: ",
        _ => "",
    };
    LineError::new(format!(
        "{prefix}{what}{msg} (column {})",
        base + e.column()
    ))
}

fn unknown_event(name: &str) -> LineError {
    let names: Vec<_> = EventKind::ALL.iter().map(|k| k.name()).collect();
    let hint = crate::suggest(name, &names)
        .map(|s| format!("; did you mean \"{s}\"?"))
        .unwrap_or_else(|| format!("; expected one of {}", names.join(", ")));
    LineError::new(format!("unknown event \"{name}\"{hint}"))
}

/// Every field of the event present, and no field of another event.
fn check_fields(kind: EventKind, p: &Payload<'_>, raw: &str, base: usize) -> Result<(), LineError> {
    let present = [
        ("agent", p.agent.is_some()),
        ("session", p.session.is_some()),
        ("success", p.success.is_some()),
        ("messages_count", p.messages_count.is_some()),
        ("provider", p.provider.is_some()),
        ("model", p.model.is_some()),
        ("duration_ms", p.duration_ms.is_some()),
        ("tool", p.tool.is_some()),
        ("arguments", p.arguments.is_some()),
        ("output", p.output.is_some()),
        ("component", p.component.is_some()),
        ("message", p.message.is_some()),
    ];
    let wanted = kind.fields();
    for (name, is) in present {
        if is && !wanted.contains(&name) {
            let column = raw
                .find(&format!("\"{name}\""))
                .map_or(base + 1, |at| base + at + 1);
            return Err(LineError::new(format!(
                "payload: field `{name}` does not belong to a {} event (it has {}) (column {column})",
                kind.name(),
                if wanted.is_empty() {
                    "no fields".to_string()
                } else {
                    wanted.join(", ")
                },
            )));
        }
    }
    for name in wanted {
        if !present.iter().any(|(n, is)| n == name && *is) {
            return Err(LineError::new(format!(
                "payload: missing field `{name}` (a {} event needs {})",
                kind.name(),
                wanted.join(", ")
            )));
        }
    }
    Ok(())
}

/// Assembles the record; fields were checked by `check_fields`.
fn build(
    kind: EventKind,
    agent: String,
    session: String,
    p: Payload<'_>,
) -> Result<Record, LineError> {
    let s = |v: Option<String>| v.unwrap_or_default();
    let (strs, num, flag) = match kind {
        EventKind::AgentStart => ([s(p.agent), s(p.session)], 0, false),
        EventKind::AgentEnd => (
            Default::default(),
            p.messages_count.unwrap_or(0),
            p.success.unwrap_or(false),
        ),
        EventKind::LlmRequest => (
            [s(p.provider), s(p.model)],
            p.messages_count.unwrap_or(0),
            false,
        ),
        EventKind::LlmResponse => (
            [s(p.provider), s(p.model)],
            p.duration_ms.unwrap_or(0),
            p.success.unwrap_or(false),
        ),
        EventKind::ToolCallStart => ([s(p.tool), arguments_text(p.arguments)?], 0, false),
        EventKind::ToolCall => ([s(p.tool), s(p.output)], 0, p.success.unwrap_or(false)),
        EventKind::TurnComplete => (Default::default(), 0, false),
        EventKind::Error => ([s(p.component), s(p.message)], 0, false),
    };
    Ok(Record {
        agent,
        session,
        kind,
        strs,
        num,
        flag,
    })
}

/// `arguments` as the JSON text the event carries: a string's contents, or any other value's
/// own text.
fn arguments_text(raw: Option<&RawValue>) -> Result<String, LineError> {
    let raw = raw.map_or("{}", RawValue::get);
    if raw.starts_with('"') {
        serde_json::from_str::<String>(raw)
            .map_err(|e| LineError::new(format!("payload: field `arguments`: {e}")))
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
            let payload: serde_json::Value = serde_json::from_str(line).unwrap();
            let want = payload
                .get("payload")
                .cloned()
                .unwrap_or(serde_json::json!({}));
            let got: serde_json::Value = serde_json::from_str(&r.event().to_json()).unwrap();
            assert_eq!(got, want, "{line}");
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
    fn bad_lines_say_what_is_wrong() {
        let cases = [
            ("not json", "not JSON: expected ident"),
            ("[1]", "expected a JSON object, found an array (column 1)"),
            (
                r#"{"event":"tool_cal","agent":"a","session":"s"}"#,
                "did you mean \"tool_call\"",
            ),
            (
                r#"{"event":"bogus","agent":"a","session":"s"}"#,
                "expected one of agent_start",
            ),
            (r#"{"agent":"a","session":"s"}"#, "missing field `event`"),
            (
                r#"{"event":"error","session":"s"}"#,
                "missing field `agent`",
            ),
            (
                r#"{"event":"error","agent":1,"session":"s"}"#,
                "invalid type: integer `1`, expected a string (column 26)",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","extra":1}"#,
                "unknown field `extra`",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s"}"#,
                "missing field `payload`",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":{"component":"c"}}"#,
                "payload: missing field `message`",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":{"component":"c","message":"m","tool":"t"}}"#,
                "field `tool` does not belong to a error event",
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":"yes","messages_count":1}}"#,
                "payload: invalid type: string \"yes\", expected a boolean (column 73)",
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":true,"messages_count":-1}}"#,
                "expected u64",
            ),
            (
                r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":true,"messages_count":1.5}}"#,
                "expected u64",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":[]}"#,
                "payload: expected a JSON object, found an array (column 54)",
            ),
            (
                r#"{"event":"error","agent":"a","session":"s","payload":{"bogus":1}}"#,
                "payload: unknown field `bogus`",
            ),
            (r#"{"event":"error""#, "not JSON: EOF while parsing"),
        ];
        for (line, want) in cases {
            let got = err(line);
            assert!(got.contains(want), "{line}\n  got:  {got}\n  want: {want}");
        }
        assert_eq!(
            parse_line(b"{\"event\":\"\xff\"}")
                .unwrap_err()
                .message()
                .to_string(),
            "invalid UTF-8 at byte 10 (column 11)"
        );
    }
}
