//! What a mapping makes of one payload ([`Plan`]: its lines, the members they take, the
//! subagent and the time), and how the lines are written.

use super::read::{Payload, object, quote};
use crate::EventKind;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashSet;

/// One line: a lifecycle event with its documented fields and the fields PRX adds (tokens,
/// `duration_ms`, …), or a topic.
pub(crate) struct Out {
    /// `None`: a topic line, `prx.agent.<agent>.<topic>`.
    pub(crate) kind: Option<EventKind>,
    pub(crate) topic: String,
    /// JSON text of each field, in order: the documented ones first.
    pub(crate) fields: Vec<(&'static str, String)>,
    /// A documented field is left out: the line is read leniently.
    pub(crate) lenient: bool,
}

impl Out {
    pub(crate) fn event(kind: EventKind) -> Out {
        Out {
            kind: Some(kind),
            topic: String::new(),
            fields: Vec::new(),
            lenient: false,
        }
    }

    /// A topic line, `prx.agent.<agent>.<segment>`, with the agent's whole object.
    pub(crate) fn topic(segment: &str) -> Out {
        Out {
            kind: None,
            topic: segment.to_string(),
            fields: Vec::new(),
            lenient: false,
        }
    }

    /// Adds `name` when `value` is known; a documented field left out makes the line lenient.
    pub(crate) fn field(mut self, name: &'static str, value: Option<String>) -> Out {
        match value {
            Some(v) => self.fields.push((name, v)),
            None => {
                if self.kind.is_some_and(|k| k.fields().contains(&name)) {
                    self.lenient = true;
                }
            }
        }
        self
    }

    /// Adds `name` with `value` (JSON text).
    pub(crate) fn set(self, name: &'static str, value: String) -> Out {
        self.field(name, Some(value))
    }

    /// `success`, when known.
    pub(crate) fn success(self, success: Option<bool>) -> Out {
        self.field("success", success.map(|b| b.to_string()))
    }
}

/// A subagent: its own emitter, `<parent session>/<id>`.
pub(crate) struct Subagent {
    pub(crate) id: String,
    /// The parent's session when the payload names it (Cursor's `parent_conversation_id`);
    /// else the payload's session.
    pub(crate) parent: Option<String>,
}

/// What one payload becomes.
#[derive(Default)]
pub(crate) struct Plan {
    pub(crate) lines: Vec<Out>,
    /// Top-level members moved into fields: not copied onto event lines.
    pub(crate) consumed: Vec<&'static str>,
    /// A member whose object's members are copied onto event lines in its place, except
    /// `spread_consumed` (Cline's `postToolUse`, Windsurf's `tool_info`).
    pub(crate) spread: Option<&'static str>,
    pub(crate) spread_consumed: Vec<&'static str>,
    pub(crate) subagent: Option<Subagent>,
    pub(crate) time: Option<String>,
}

impl Plan {
    pub(crate) fn push(&mut self, out: Out) -> &mut Plan {
        self.lines.push(out);
        self
    }

    pub(crate) fn consume(&mut self, members: &[&'static str]) -> &mut Plan {
        self.consumed.extend_from_slice(members);
        self
    }

    /// A topic line named like the event (the existing scheme).
    pub(crate) fn topic(&mut self, p: &Payload<'_>) -> &mut Plan {
        let segment = p.event.clone();
        self.push(Out::topic(&segment))
    }

    /// The subagent of `member`'s string id, when the payload has one.
    pub(crate) fn subagent(
        &mut self,
        p: &Payload<'_>,
        member: &'static str,
        parent: Option<String>,
    ) {
        if let Some(id) = p.str_at(&[member]) {
            self.subagent = Some(Subagent { id, parent });
        }
    }
}

/// The payload of one line: `fields`, then every member of the agent's object not consumed
/// (the spread member's members in its place), each renamed `agent_<name>` while its name is
/// taken (a field, one of the event's own fields, a member already written, or, once renamed,
/// a name the agent sent).
pub(crate) fn payload(
    own: &[&str],
    fields: &[(&'static str, String)],
    p: &Payload<'_>,
    consumed: &[&str],
    spread: Option<(&str, &[&str])>,
) -> String {
    let spread_members = spread.and_then(|(name, _)| p.get(name).and_then(object));
    let mut sent: HashSet<&str> = p.members.iter().map(|(k, _)| k.as_ref()).collect();
    if let Some(ms) = &spread_members {
        sent.extend(ms.iter().map(|(k, _)| k.as_ref()));
    }
    let mut taken: HashSet<Cow<'_, str>> = own.iter().map(|s| Cow::Borrowed(*s)).collect();
    let mut out = String::with_capacity(p.text.len() + 64);
    out.push('{');
    for (name, value) in fields {
        put(&mut out, name, value);
        taken.insert(Cow::Borrowed(name));
    }
    let mut member = |out: &mut String, key: &str, raw: &RawValue| {
        let mut name = key.to_string();
        while taken.contains(name.as_str()) || (name != key && sent.contains(name.as_str())) {
            name = format!("agent_{name}");
        }
        put(out, &name, raw.get());
        taken.insert(Cow::Owned(name));
    };
    for (key, raw) in &p.members {
        if consumed.contains(&key.as_ref()) {
            continue;
        }
        match (spread, &spread_members) {
            (Some((name, skip)), Some(ms)) if name == key => {
                for (k, v) in ms {
                    if !skip.contains(&k.as_ref()) {
                        member(&mut out, k, v);
                    }
                }
            }
            _ => member(&mut out, key, raw),
        }
    }
    out.push('}');
    out
}

fn put(out: &mut String, name: &str, value: &str) {
    if out.len() > 1 {
        out.push(',');
    }
    out.push_str(&quote(name));
    out.push(':');
    out.push_str(value);
}

/// The counts of a usage object as PRX's token fields, each left out when the agent does not
/// give it.
pub(crate) struct Tokens {
    pub(crate) input: Option<u64>,
    pub(crate) output: Option<u64>,
    pub(crate) cache_read: Option<u64>,
    pub(crate) cache_creation: Option<u64>,
}

impl Tokens {
    pub(crate) fn fields(&self, out: Out) -> Out {
        let n = |v: Option<u64>| v.map(|n| n.to_string());
        out.field("input_tokens", n(self.input))
            .field("output_tokens", n(self.output))
            .field("cache_read_input_tokens", n(self.cache_read))
            .field("cache_creation_input_tokens", n(self.cache_creation))
    }
}
