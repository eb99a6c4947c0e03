//! The hook payloads of other agents (Claude Code, OpenAI Codex CLI, Gemini CLI, Cursor),
//! translated into prx-hooks NDJSON lines (docs/agents.md has every mapping).
//!
//! An agent's hook sends one JSON object per call. [`translate`] turns it into one line that
//! [`LineIngest`](crate::ingest::LineIngest) reads:
//!
//! * a **lifecycle event** where one fits (a tool about to run → `tool_call_start`, a tool done
//!   → `tool_call`, a session start → `agent_start`, its end → `agent_end`, a turn done →
//!   `turn_complete`), with `agent` = the agent's name and `session` = its session id. A
//!   documented field the agent does not send (Cursor never says whether a shell command
//!   succeeded) is left out of the payload, as `--lenient` does: such lines are read with
//!   [`Translated::lenient`] set. Every other member the agent sent is kept as an extra
//!   field, byte-exact (a member whose name is one of the event's own fields is kept as
//!   `agent_<name>`);
//! * otherwise (and for events a newer agent version adds) a **topic line**,
//!   `prx.agent.<agent>.<event>`, carrying the agent's whole object: nothing an agent sends is
//!   dropped silently.
//!
//! ```
//! use prx_hooks::agents::{Agent, TranslateOptions, Target, translate};
//! let input = br#"{"session_id":"abc","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"cwd":"/p"}"#;
//! let t = translate(Agent::ClaudeCode, input, &TranslateOptions::default())?;
//! assert_eq!(t.target, Target::Lifecycle(prx_hooks::EventKind::ToolCallStart));
//! assert_eq!(t.line, r#"{"event":"tool_call_start","agent":"claude-code","session":"abc","payload":{"tool":"Bash","arguments":{"command":"ls"},"session_id":"abc","hook_event_name":"PreToolUse","cwd":"/p"}}"#);
//! # Ok::<(), prx_hooks::agents::TranslateError>(())
//! ```

mod claude_code;
mod codex;
mod cursor;
mod gemini_cli;

use crate::EventKind;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// An agent whose hook payloads [`translate`] reads.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Agent {
    /// Anthropic's Claude Code (`hooks` in `.claude/settings.json`; command and `http` hooks).
    ClaudeCode,
    /// OpenAI's Codex CLI (the `notify` program of `~/.codex/config.toml`).
    Codex,
    /// Google's Gemini CLI (`hooks` in `.gemini/settings.json`).
    GeminiCli,
    /// Cursor (`.cursor/hooks.json`).
    Cursor,
}

impl Agent {
    /// Every supported agent, in declaration order.
    pub const ALL: [Agent; 4] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::GeminiCli,
        Agent::Cursor,
    ];

    /// `claude-code`, `codex`, `gemini-cli` or `cursor`.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::Agent;
    /// assert_eq!(Agent::from_name("gemini-cli"), Some(Agent::GeminiCli));
    /// assert_eq!(Agent::from_name("claude"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Agent> {
        Agent::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The name in lines, topics and URLs: `claude-code`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(prx_hooks::agents::Agent::Cursor.name(), "cursor");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
            Agent::Cursor => "cursor",
        }
    }

    /// The events the agent's documentation lists (docs/agents.md), each mapped.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(prx_hooks::agents::Agent::ClaudeCode.events().contains(&"PostToolUse"));
    /// ```
    pub fn events(self) -> &'static [&'static str] {
        self.spec().events
    }

    /// Where the documentation this mapping follows lives.
    pub fn documentation(self) -> &'static str {
        self.spec().docs
    }

    fn spec(self) -> &'static Spec {
        match self {
            Agent::ClaudeCode => &claude_code::SPEC,
            Agent::Codex => &codex::SPEC,
            Agent::GeminiCli => &gemini_cli::SPEC,
            Agent::Cursor => &cursor::SPEC,
        }
    }
}

impl fmt::Display for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What [`translate`] may replace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TranslateOptions {
    /// The line's agent instead of the agent's name (`claude-code`).
    pub agent: Option<String>,
    /// The line's session instead of the agent's session id (required when the agent sends
    /// none).
    pub session: Option<String>,
}

/// Where a translated payload goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A lifecycle event of this kind (a line in the `run --events` format).
    Lifecycle(EventKind),
    /// `prx.agent.<agent>.<event>`.
    Topic(String),
}

/// One translated payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Translated {
    /// One NDJSON line (no newline): an event in the `run --events` format, or a topic line.
    pub line: String,
    /// Whether the line is a lifecycle event or a topic message, and which.
    pub target: Target,
    /// The agent's own name for the event (`PostToolUse`).
    pub event: String,
    /// The line leaves out a documented field the agent does not send: read it leniently.
    pub lenient: bool,
}

/// Why a payload could not be translated. Displays as `LINE:COL: PATH: REASON` (1-based; the
/// path `$` is the payload as a whole).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslateError {
    line: usize,
    column: usize,
    path: String,
    reason: String,
}

impl TranslateError {
    fn at(line: usize, column: usize, path: &str, reason: impl Into<String>) -> TranslateError {
        let reason: String = reason.into();
        TranslateError {
            line,
            column,
            path: if path.is_empty() {
                "$".into()
            } else {
                crate::ndjson::one_line(path.into())
            },
            reason: reason
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
        }
    }

    /// The 1-based line of the payload where the problem is.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The 1-based column (in characters) on that line.
    pub fn column(&self) -> usize {
        self.column
    }

    /// `$`, `hook_event_name`, `tool_input`, …
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong, on one line (control characters become spaces).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for TranslateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.line, self.column, self.path, self.reason
        )
    }
}

impl std::error::Error for TranslateError {}

/// One agent's documented events and how each maps.
pub(crate) struct Spec {
    pub docs: &'static str,
    /// The members naming the event, the first present wins (`hook_event_name`; Codex's
    /// `notify` program: `type`).
    pub event_fields: &'static [&'static str],
    /// The members holding the session id, the first present wins.
    pub session_fields: &'static [&'static str],
    pub events: &'static [&'static str],
    pub map: fn(&str) -> Map,
}

/// A documented field's value.
#[derive(Clone, Copy)]
pub(crate) enum Value {
    /// This member of the payload (consumed: not kept as an extra field).
    Member(&'static str),
    /// This member when the agent sends it; else the field is left out and the line is read
    /// leniently (for fields an agent's documentation leaves optional).
    Optional(&'static str),
    /// This text.
    Const(&'static str),
    /// An object of these members (consumed), for tools whose input is spread over the payload
    /// (Cursor's shell command and its `cwd`).
    Object(&'static [&'static str]),
}

/// How a tool's `success` is known.
#[derive(Clone, Copy)]
pub(crate) enum Success {
    Is(bool),
    /// False when this member of the response object is present and not null (an error).
    UnlessSet(&'static str, &'static str),
    /// The agent does not say: left out.
    Unknown,
}

/// What one agent event becomes.
#[derive(Clone, Copy)]
pub(crate) enum Map {
    ToolStart {
        tool: Value,
        arguments: Value,
    },
    ToolDone {
        tool: Value,
        output: Value,
        success: Success,
    },
    AgentStart,
    AgentEnd,
    TurnComplete,
    /// `error`: `component` names what failed, `message` says how.
    Error {
        component: Value,
        message: Value,
    },
    Topic,
}

/// A JSON object's members in order, values as raw text.
struct Members<'a>(Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

/// Line and column (1-based, columns in characters) of byte `pos` of `text`.
fn place(text: &str, pos: usize) -> (usize, usize) {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    let before = &text[..pos];
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[start..].chars().count() + 1,
    )
}

/// Translates one payload of `agent`'s hook into one prx-hooks line.
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
/// let t = translate(Agent::ClaudeCode, br#"{"session_id":"s","hook_event_name":"Notification","message":"hi"}"#, &TranslateOptions::default())?;
/// assert_eq!(t.target, Target::Topic("prx.agent.claude-code.Notification".into()));
/// let e = translate(Agent::ClaudeCode, b"{\"hook_event_name\": \"Stop\",\n  \"session_id\": 3\n}", &TranslateOptions::default()).unwrap_err();
/// assert_eq!(e.to_string(), "2:17: session_id: expected a string, found 3");
/// # Ok::<(), prx_hooks::agents::TranslateError>(())
/// ```
pub fn translate(
    agent: Agent,
    input: &[u8],
    opts: &TranslateOptions,
) -> Result<Translated, TranslateError> {
    let spec = agent.spec();
    let text = decode(input)?;
    let members = parse_members(text)?;
    let locate = |raw: &RawValue| {
        let pos = (raw.get().as_ptr() as usize).saturating_sub(text.as_ptr() as usize);
        place(text, pos)
    };
    let names = unique_names(&members, &locate)?;
    let lines = Lines {
        members: &members,
        locate: &locate,
    };
    let event = event_name(agent, spec, &lines)?;
    let session = session_id(spec, opts, &lines)?;
    let agent_name = opts
        .agent
        .clone()
        .unwrap_or_else(|| agent.name().to_string());
    let Some((kind, fields, lenient)) = mapped((spec.map)(&event), &lines)? else {
        let topic = topic(agent, &event);
        let line = format!(
            "{{\"topic\":{},\"agent\":{},\"session\":{},\"payload\":{}}}",
            quote(&topic),
            quote(&agent_name),
            quote(&session),
            one_line(text.trim())
        );
        return Ok(Translated {
            line,
            target: Target::Topic(topic),
            event,
            lenient: false,
        });
    };
    let consumed = consumed(spec, &event);
    let payload = payload(kind, &fields, &members, &names, &consumed, text.len());
    let line = format!(
        "{{\"event\":{},\"agent\":{},\"session\":{},\"payload\":{}}}",
        quote(kind.name()),
        quote(&agent_name),
        quote(&session),
        one_line(&payload)
    );
    Ok(Translated {
        line,
        target: Target::Lifecycle(kind),
        event,
        lenient,
    })
}

/// The payload as text: UTF-8, without a byte order mark.
fn decode(input: &[u8]) -> Result<&str, TranslateError> {
    let text = std::str::from_utf8(input).map_err(|e| {
        let valid = std::str::from_utf8(&input[..e.valid_up_to()]).unwrap_or_default();
        let (line, col) = place(valid, valid.len());
        TranslateError::at(line, col, "$", "not UTF-8")
    })?;
    // A byte order mark some Windows tools write before the object.
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text))
}

/// The payload's members, in order, each with its raw value.
fn parse_members(
    text: &str,
) -> Result<Vec<(std::borrow::Cow<'_, str>, &RawValue)>, TranslateError> {
    let members: Members<'_> = serde_json::from_str(text).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON: ",
            _ => "",
        };
        TranslateError::at(
            e.line().max(1),
            e.column().max(1),
            "$",
            format!("{what}{msg}"),
        )
    })?;
    Ok(members.0)
}

/// The members' names; a name that appears twice is an error at its second place.
fn unique_names<'m>(
    members: &'m [(std::borrow::Cow<'_, str>, &RawValue)],
    locate: &impl Fn(&RawValue) -> (usize, usize),
) -> Result<std::collections::HashSet<&'m str>, TranslateError> {
    let mut names = std::collections::HashSet::with_capacity(members.len());
    for (key, raw) in members {
        if !names.insert(key.as_ref()) {
            let (l, c) = locate(raw);
            return Err(TranslateError::at(l, c, key, "appears twice"));
        }
    }
    Ok(names)
}

/// The member `name`, a string.
fn string<F: Fn(&RawValue) -> (usize, usize)>(
    lines: &Lines<'_, '_, F>,
    name: &str,
    raw: &RawValue,
) -> Result<String, TranslateError> {
    serde_json::from_str::<String>(raw.get()).map_err(|_| {
        let (l, c) = (lines.locate)(raw);
        TranslateError::at(
            l,
            c,
            name,
            format!("expected a string, found {}", shown(raw.get())),
        )
    })
}

/// The agent's name for the event: the first of the spec's event fields present.
fn event_name<F: Fn(&RawValue) -> (usize, usize)>(
    agent: Agent,
    spec: &Spec,
    lines: &Lines<'_, '_, F>,
) -> Result<String, TranslateError> {
    match spec
        .event_fields
        .iter()
        .find_map(|&f| Some((f, lines.get(f)?)))
    {
        Some((name, raw)) => string(lines, name, raw),
        None => Err(TranslateError::at(
            1,
            1,
            spec.event_fields[0],
            match spec.event_fields {
                [_] => format!("missing (a {agent} hook payload names its event in it)"),
                all => format!(
                    "missing (a {agent} hook payload names its event in {})",
                    all.join(" or ")
                ),
            },
        )),
    }
}

/// The session: the one given in `opts`, else the first of the spec's session fields present.
fn session_id<F: Fn(&RawValue) -> (usize, usize)>(
    spec: &Spec,
    opts: &TranslateOptions,
    lines: &Lines<'_, '_, F>,
) -> Result<String, TranslateError> {
    let mut session = None;
    for name in spec.session_fields {
        if let Some(raw) = lines.get(name) {
            session = Some(string(lines, name, raw)?);
            break;
        }
    }
    match (&opts.session, session) {
        (Some(s), _) => Ok(s.clone()),
        (None, Some(s)) => Ok(s),
        (None, None) => Err(TranslateError::at(
            1,
            1,
            spec.session_fields[0],
            "missing: the session id is needed (or give one: TranslateOptions::session; `send --session`, `?session=` over HTTP)",
        )),
    }
}

/// The lifecycle event a mapping makes, its documented fields, and whether one was left out;
/// `None` for an event that goes to a topic.
#[allow(clippy::type_complexity)]
fn mapped<F: Fn(&RawValue) -> (usize, usize)>(
    map: Map,
    lines: &Lines<'_, '_, F>,
) -> Result<Option<(EventKind, Vec<(&'static str, String)>, bool)>, TranslateError> {
    Ok(Some(match map {
        Map::Topic => return Ok(None),
        Map::ToolStart { tool, arguments } => {
            let mut f = Fields::default();
            f.text(lines, "tool", tool)?;
            f.json(lines, "arguments", arguments)?;
            (EventKind::ToolCallStart, f.list, f.lenient)
        }
        Map::ToolDone {
            tool,
            output,
            success,
        } => {
            let mut f = Fields::default();
            f.text(lines, "tool", tool)?;
            let success = match success {
                Success::Is(b) => Some(b),
                Success::UnlessSet(object, member) => Some(!lines.is_set(object, member)),
                Success::Unknown => None,
            };
            match success {
                Some(b) => f.list.push(("success", b.to_string())),
                None => f.lenient = true,
            }
            f.text(lines, "output", output)?;
            (EventKind::ToolCall, f.list, f.lenient)
        }
        Map::AgentStart => (EventKind::AgentStart, vec![], false),
        Map::AgentEnd => (EventKind::AgentEnd, vec![], true),
        Map::TurnComplete => (EventKind::TurnComplete, vec![], false),
        Map::Error { component, message } => {
            let mut f = Fields::default();
            f.text(lines, "component", component)?;
            f.text(lines, "message", message)?;
            (EventKind::Error, f.list, f.lenient)
        }
    }))
}

/// The event's payload: the documented fields, then every member not consumed, renamed
/// `agent_<name>` when its name is taken.
fn payload(
    kind: EventKind,
    fields: &[(&'static str, String)],
    members: &[(std::borrow::Cow<'_, str>, &RawValue)],
    names: &std::collections::HashSet<&str>,
    consumed: &[&str],
    size: usize,
) -> String {
    let mut payload = String::with_capacity(size + 64);
    payload.push('{');
    for (name, value) in fields {
        if payload.len() > 1 {
            payload.push(',');
        }
        payload.push_str(&quote(name));
        payload.push(':');
        payload.push_str(value);
    }
    let own = kind.fields();
    for (key, raw) in members {
        if consumed.contains(&key.as_ref()) {
            continue;
        }
        if payload.len() > 1 {
            payload.push(',');
        }
        let mut name = key.to_string();
        // Not onto a name the agent sent either (`success` beside `agent_success`).
        while own.contains(&name.as_str())
            || fields.iter().any(|(f, _)| *f == name)
            || (name != key.as_ref() && names.contains(name.as_str()))
        {
            name = format!("agent_{name}");
        }
        payload.push_str(&quote(&name));
        payload.push(':');
        payload.push_str(raw.get());
    }
    payload.push('}');
    payload
}

/// The members a mapping consumes (moved into documented fields).
fn consumed(spec: &Spec, event: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut add = |v: Value| match v {
        Value::Member(m) | Value::Optional(m) => out.push(m),
        Value::Object(ms) => out.extend_from_slice(ms),
        Value::Const(_) => {}
    };
    match (spec.map)(event) {
        Map::ToolStart { tool, arguments } => {
            add(tool);
            add(arguments);
        }
        Map::ToolDone { tool, output, .. } => {
            add(tool);
            add(output);
        }
        Map::Error { component, message } => {
            add(component);
            add(message);
        }
        _ => {}
    }
    out
}

/// The documented fields of one line, in order, and whether one is left out.
#[derive(Default)]
struct Fields {
    list: Vec<(&'static str, String)>,
    lenient: bool,
}

impl Fields {
    /// Whether `value` is an [`Value::Optional`] member the agent did not send (then the
    /// field is left out).
    fn absent<F: Fn(&RawValue) -> (usize, usize)>(
        &mut self,
        lines: &Lines<'_, '_, F>,
        value: Value,
    ) -> bool {
        let absent = matches!(value, Value::Optional(m) if lines.get(m).is_none());
        self.lenient |= absent;
        absent
    }

    /// Adds `field`, a string, unless it is an absent optional member.
    fn text<F: Fn(&RawValue) -> (usize, usize)>(
        &mut self,
        lines: &Lines<'_, '_, F>,
        field: &'static str,
        value: Value,
    ) -> Result<(), TranslateError> {
        self.add(lines, field, value, Lines::text)
    }

    /// Adds `field`, JSON, unless it is an absent optional member.
    fn json<F: Fn(&RawValue) -> (usize, usize)>(
        &mut self,
        lines: &Lines<'_, '_, F>,
        field: &'static str,
        value: Value,
    ) -> Result<(), TranslateError> {
        self.add(lines, field, value, Lines::json)
    }

    fn add<'l, 'm, 'a, F: Fn(&RawValue) -> (usize, usize)>(
        &mut self,
        lines: &'l Lines<'m, 'a, F>,
        field: &'static str,
        value: Value,
        read: fn(&'l Lines<'m, 'a, F>, &str, Value) -> Result<String, TranslateError>,
    ) -> Result<(), TranslateError> {
        if !self.absent(lines, value) {
            self.list.push((field, read(lines, field, value)?));
        }
        Ok(())
    }
}

/// The documented fields' values, read from the payload.
struct Lines<'m, 'a, F: Fn(&RawValue) -> (usize, usize)> {
    members: &'m [(std::borrow::Cow<'a, str>, &'a RawValue)],
    locate: &'m F,
}

impl<F: Fn(&RawValue) -> (usize, usize)> Lines<'_, '_, F> {
    fn get(&self, name: &str) -> Option<&RawValue> {
        self.members
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }

    fn missing(&self, name: &str, field: &str) -> TranslateError {
        TranslateError::at(
            1,
            1,
            name,
            format!("missing (it becomes the event's {field})"),
        )
    }

    /// A string field: the member's string, or the JSON text of any other value.
    fn text(&self, field: &str, value: Value) -> Result<String, TranslateError> {
        match value {
            Value::Const(s) => Ok(quote(s)),
            Value::Member(m) | Value::Optional(m) => {
                let raw = self.get(m).ok_or_else(|| self.missing(m, field))?;
                if raw.get().starts_with('"') {
                    if field == "tool" && serde_json::from_str::<String>(raw.get()).is_err() {
                        let (l, c) = (self.locate)(raw);
                        return Err(TranslateError::at(l, c, m, "not a valid string"));
                    }
                    Ok(raw.get().to_string())
                } else if field == "tool" {
                    let (l, c) = (self.locate)(raw);
                    Err(TranslateError::at(
                        l,
                        c,
                        m,
                        format!("expected a string, found {}", shown(raw.get())),
                    ))
                } else {
                    Ok(quote(raw.get()))
                }
            }
            Value::Object(ms) => Ok(quote(&self.object(ms))),
        }
    }

    /// A JSON field (`arguments`): the member's value as it is, or an object of members.
    fn json(&self, field: &str, value: Value) -> Result<String, TranslateError> {
        match value {
            Value::Const(s) => Ok(quote(s)),
            Value::Member(m) | Value::Optional(m) => {
                let raw = self.get(m).ok_or_else(|| self.missing(m, field))?;
                Ok(raw.get().to_string())
            }
            Value::Object(ms) => Ok(self.object(ms)),
        }
    }

    fn object(&self, names: &[&str]) -> String {
        let mut out = String::from("{");
        for name in names {
            if let Some(raw) = self.get(name) {
                if out.len() > 1 {
                    out.push(',');
                }
                out.push_str(&quote(name));
                out.push(':');
                out.push_str(raw.get());
            }
        }
        out.push('}');
        out
    }

    /// Whether `object.member` is present and not null.
    fn is_set(&self, object: &str, member: &str) -> bool {
        let Some(raw) = self.get(object) else {
            return false;
        };
        match serde_json::from_str::<Members<'_>>(raw.get()) {
            Ok(m) => m.0.iter().any(|(k, v)| k == member && v.get() != "null"),
            Err(_) => false,
        }
    }
}

/// `prx.agent.<agent>.<event>`, the event's name with every character a topic segment may
/// not hold as `_`, at most 64 bytes.
fn topic(agent: Agent, event: &str) -> String {
    let mut segment: String = event
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if segment.is_empty() {
        segment.push('_');
    }
    format!("prx.agent.{}.{segment}", agent.name())
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Valid JSON holds raw line breaks only as whitespace: one line without them.
fn one_line(json: &str) -> String {
    json.replace(['\n', '\r'], " ")
}

/// A raw value for "expected X, found Y" (at most 40 characters of it).
fn shown(raw: &str) -> String {
    let mut chars = raw.chars();
    let head: String = chars.by_ref().take(40).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndjson::{Input, ParseOptions, parse_input_with};

    fn t(agent: Agent, input: &str) -> Result<Translated, TranslateError> {
        translate(agent, input.as_bytes(), &TranslateOptions::default())
    }

    #[test]
    fn errors_name_the_line_the_column_and_the_member() {
        let e = t(
            Agent::ClaudeCode,
            "{\"session_id\":\"s\",\n \"hook_event_name\": 7}",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "2:21: hook_event_name: expected a string, found 7"
        );
        let e = t(Agent::ClaudeCode, "{\"session_id\": \"s\"").unwrap_err();
        assert!(e.to_string().starts_with("1:18: $: not JSON: EOF"), "{e}");
        let e = t(Agent::ClaudeCode, "[1]").unwrap_err();
        assert!(e.reason().contains("a JSON object"), "{e}");
        let e = t(Agent::ClaudeCode, r#"{"hook_event_name":"Stop"}"#).unwrap_err();
        assert_eq!((e.path(), e.line()), ("session_id", 1));
        let e = t(Agent::Codex, r#"{"thread-id":"t"}"#).unwrap_err();
        assert_eq!(e.path(), "hook_event_name");
        assert!(e.reason().ends_with("in hook_event_name or type)"), "{e}");
        let e = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","session_id":"t","hook_event_name":"Stop"}"#,
        )
        .unwrap_err();
        assert_eq!(e.reason(), "appears twice");
        // A key is shown on one line: its control characters escaped, as the ingest shows them.
        let e = t(
            Agent::ClaudeCode,
            "{\"a\\nb\":1,\"a\\nb\":2,\"hook_event_name\":\"Stop\"}",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "1:18: a\\nb: appears twice");
        assert_eq!(e.path(), "a\\nb");
        let e = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"PreToolUse","tool_input":{}}"#,
        )
        .unwrap_err();
        assert_eq!(e.path(), "tool_name");
        let e = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"PreToolUse","tool_name":1,"tool_input":{}}"#,
        )
        .unwrap_err();
        assert_eq!(e.reason(), "expected a string, found 1");
        assert!(translate(Agent::Cursor, b"\xff", &TranslateOptions::default()).is_err());
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_optional_members_may_be_missing() {
        let got = t(
            Agent::Cursor,
            "\u{feff}{\"conversation_id\":\"c\",\"hook_event_name\":\"postToolUseFailure\",\"tool_name\":\"Shell\"}",
        )
        .unwrap();
        assert_eq!(
            got.line,
            r#"{"event":"tool_call","agent":"cursor","session":"c","payload":{"tool":"Shell","success":false,"conversation_id":"c","hook_event_name":"postToolUseFailure"}}"#
        );
        assert!(got.lenient, "output is left out");
        let e = t(Agent::Cursor, "\u{feff}\u{feff}{}").unwrap_err();
        assert_eq!((e.line(), e.column()), (1, 1), "{e}");
    }

    #[test]
    fn a_stop_failure_is_an_error_event() {
        let got = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"StopFailure","error":"overloaded","error_details":null}"#,
        )
        .unwrap();
        assert_eq!(
            got.line,
            r#"{"event":"error","agent":"claude-code","session":"s","payload":{"component":"api","message":"overloaded","session_id":"s","hook_event_name":"StopFailure","error_details":null}}"#
        );
        let Ok(Input::Event(rec)) = parse_input_with(got.line.as_bytes(), ParseOptions::default())
        else {
            panic!("{}", got.line)
        };
        assert_eq!(rec.kind(), EventKind::Error);
    }

    #[test]
    fn overrides_replace_the_agent_and_supply_the_session() {
        let opts = TranslateOptions {
            agent: Some("reviewer".into()),
            session: Some("job-7".into()),
        };
        let got = translate(Agent::ClaudeCode, br#"{"hook_event_name":"Stop"}"#, &opts).unwrap();
        assert_eq!(
            got.line,
            r#"{"event":"turn_complete","agent":"reviewer","session":"job-7","payload":{"hook_event_name":"Stop"}}"#
        );
    }

    #[test]
    fn unknown_events_become_topics_with_a_clean_segment() {
        let got = t(
            Agent::GeminiCli,
            r#"{"session_id":"s","hook_event_name":"Brand new.event!"}"#,
        )
        .unwrap();
        assert_eq!(
            got.target,
            Target::Topic("prx.agent.gemini-cli.Brand_new_event_".into())
        );
        assert!(matches!(
            parse_input_with(got.line.as_bytes(), ParseOptions::default()),
            Ok(Input::Topic(_))
        ));
    }

    #[test]
    fn members_named_like_the_events_own_fields_are_kept_under_another_name() {
        let got = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"PostToolUse","tool_name":"X","tool_input":{},"tool_response":"ok","success":"maybe","output":1}"#,
        )
        .unwrap();
        let Ok(Input::Event(rec)) = parse_input_with(got.line.as_bytes(), ParseOptions::default())
        else {
            panic!("{}", got.line)
        };
        let payload = rec.payload_json();
        assert!(
            payload.contains(r#""agent_success":"maybe""#)
                && payload.contains(r#""agent_output":1"#),
            "{payload}"
        );
    }

    #[test]
    fn pretty_printed_input_and_a_20_mib_output_make_one_line() {
        let big = "x".repeat(20 << 20);
        let input = format!(
            "{{\n  \"session_id\": \"s\",\n  \"hook_event_name\": \"PostToolUse\",\n  \"tool_name\": \"Read\",\n  \"tool_input\": {{\n    \"file_path\": \"/a\"\n  }},\n  \"tool_response\": \"{big}\"\n}}"
        );
        let got = t(Agent::ClaudeCode, &input).unwrap();
        assert!(!got.line.contains('\n'));
        let Ok(Input::Event(rec)) = parse_input_with(got.line.as_bytes(), ParseOptions::default())
        else {
            panic!()
        };
        assert_eq!(rec.kind(), EventKind::ToolCall);
        assert!(rec.byte_len() > 20 << 20);
    }
}
