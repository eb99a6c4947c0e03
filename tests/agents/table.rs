//! The agents' tables and the check of a session against one: what each of an agent's events
//! becomes, and whether every bus message and hook run says so.

use crate::harness::{
    Raw, Record, Server, Setup, Tail, hooks_all_ran, is_lifecycle, settle, source_name,
    tail_last_shows_the_same,
};
use serde_json::Value;
use std::time::Duration;

/// What one of the agent's events becomes.
#[derive(Clone, Debug)]
pub enum Becomes {
    /// A lifecycle event: its kind, the members of the agent's object it reads into its own
    /// fields (the rest are kept as extra fields), and checks on its payload.
    Event {
        kind: &'static str,
        reads: &'static [&'static str],
        checks: Vec<Check>,
    },
    /// The agent's whole object on this bus topic.
    Topic(String),
}

impl Becomes {
    fn target(&self) -> String {
        match self {
            Becomes::Event { kind, .. } => format!("prx.lifecycle.{kind}"),
            Becomes::Topic(t) => t.clone(),
        }
    }
}

/// A lifecycle event.
pub fn event(kind: &'static str, reads: &'static [&'static str], checks: Vec<Check>) -> Becomes {
    Becomes::Event {
        kind,
        reads,
        checks,
    }
}

/// A check on a lifecycle payload: the member at a JSON pointer …
#[derive(Clone, Debug)]
pub enum Check {
    /// … is this value;
    Is(&'static str, Value),
    /// … is absent;
    Absent(&'static str),
    /// … is a string containing this;
    Contains(&'static str, &'static str),
    /// … is the value at the second pointer in the agent's object.
    FromAgent(&'static str, &'static str),
}

/// One of the agent's events and what it becomes.
#[derive(Clone, Debug)]
pub struct Row {
    pub event: &'static str,
    /// As docs/agents.md maps it (a turn opens with `agent_start` and closes with
    /// `turn_complete`, then `agent_end`; a session's start and end are topics).
    pub mapped: Vec<Becomes>,
    /// When the agent's object lacks this member, the event becomes the second instead.
    pub unless: Option<(&'static str, Vec<Becomes>)>,
}

/// A row: `event` becomes `mapped`.
pub fn row(event: &'static str, mapped: Vec<Becomes>) -> Row {
    Row {
        event,
        mapped,
        unless: None,
    }
}

/// A row whose event becomes `otherwise` when the agent's object lacks `member`.
pub fn row_unless(
    event: &'static str,
    mapped: Vec<Becomes>,
    member: &'static str,
    otherwise: Vec<Becomes>,
) -> Row {
    Row {
        event,
        mapped,
        unless: Some((member, otherwise)),
    }
}

/// `rows`, then a row for each of `events` they do not name: the agent's whole object on a
/// topic named after the event.
pub fn and_topics<'a>(
    agent: &str,
    mut rows: Vec<Row>,
    events: impl IntoIterator<Item = &'a &'static str>,
) -> Vec<Row> {
    for &e in events {
        if !rows.iter().any(|r| r.event == e) {
            rows.push(row(e, vec![topic(agent, e)]));
        }
    }
    rows
}

/// The agent's whole object on `prx.agent.<agent>.<name>`.
pub fn topic(agent: &str, name: &str) -> Becomes {
    Becomes::Topic(format!("prx.agent.{agent}.{name}"))
}

/// `agent_start` from a prompt: the prompt kept.
pub fn prompt_opens_the_turn() -> Vec<Becomes> {
    vec![event(
        "agent_start",
        &[],
        vec![Check::FromAgent("/prompt", "/prompt")],
    )]
}

/// How the agent's events may be ordered on arrival.
#[derive(Clone, Copy, Debug)]
pub enum Order {
    /// The agent waits for each hook: lifecycle events arrive in the order it sent them.
    Exact,
    /// The agent runs our hooks in the background: two events arrive in order when the agent
    /// sent them at least this far apart (the fake model's pauses and the command's run put
    /// that time between the session's steps).
    Apart(Duration),
}

/// What a session must have delivered.
pub struct Expect<'a> {
    pub agent: &'a str,
    pub table: &'a [Row],
    pub session: &'a str,
    pub order: Order,
}

/// Checks every bus message and hook run against the agent's events and its table: each event
/// arrives as its row says, once; nothing arrives that the agent did not send; each lifecycle
/// event ran its hook once with the bus message's payload and matching `ZERO_HOOK_*`
/// variables; lifecycle events in order.
pub fn check(expect: &Expect, raws: &[Raw], records: &[Record], bus: &[Value]) {
    let agent = expect.agent;
    let show_bus = || {
        bus.iter()
            .map(|m| format!("{} {}", m["topic"], source_name(m).unwrap_or("?")))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Every bus message comes from one of the events the agent sent, with its name and session id.
    for m in bus {
        let name = source_name(m).unwrap_or_else(|| panic!("a message of no event: {m}"));
        assert!(
            raws.iter().any(|r| r.name == name),
            "{agent} never sent {name}, yet it arrived: {m}"
        );
        assert_eq!(m["agent"], agent, "{m}");
        assert_eq!(m["session"], expect.session, "{m}");
    }
    // (raw index, position in its row, message index) of every lifecycle message.
    let mut lifecycle: Vec<(usize, usize, usize)> = Vec::new();
    let mut names: Vec<&str> = raws.iter().map(|r| r.name.as_str()).collect();
    names.sort();
    names.dedup();
    for name in names {
        let row = expect
            .table
            .iter()
            .find(|r| r.event == name)
            .unwrap_or_else(|| {
                panic!("{agent} sent {name}, which its table does not name: add a row")
            });
        let sent: Vec<usize> = (0..raws.len()).filter(|&i| raws[i].name == name).collect();
        let got: Vec<usize> = (0..bus.len())
            .filter(|&i| source_name(&bus[i]) == Some(name))
            .collect();
        // What each time the agent sent it becomes.
        let sends: Vec<Vec<Becomes>> = sent
            .iter()
            .map(|&i| match &row.unless {
                Some((member, other))
                    if raws[i]
                        .object
                        .as_ref()
                        .is_some_and(|o| o.get(member).is_none()) =>
                {
                    other.clone()
                }
                _ => row.mapped.clone(),
            })
            .collect();
        let mut want: Vec<String> = sends.iter().flatten().map(Becomes::target).collect();
        want.sort();
        let mut arrived: Vec<String> = got
            .iter()
            .map(|&i| bus[i]["topic"].as_str().unwrap().to_string())
            .collect();
        arrived.sort();
        assert_eq!(
            arrived,
            want,
            "{agent} sent {name} {} time(s)\nbus:\n{}",
            sent.len(),
            show_bus()
        );
        // Pair the k-th message of each target with the k-th time the agent sent the event
        // that becomes it.
        let mut all: Vec<String> = sends.iter().flatten().map(Becomes::target).collect();
        all.sort();
        all.dedup();
        for target in all {
            let of: Vec<usize> = got
                .iter()
                .copied()
                .filter(|&i| bus[i]["topic"] == target.as_str())
                .collect();
            let sent = &sent;
            let from: Vec<(usize, usize, &Becomes)> = sends
                .iter()
                .enumerate()
                .flat_map(|(k, col)| {
                    col.iter()
                        .enumerate()
                        .filter(|(_, b)| b.target() == target)
                        .map(move |(pos, b)| (sent[k], pos, b))
                })
                .collect();
            for (&i, &(r, pos, becomes)) in of.iter().zip(&from) {
                check_message(expect, becomes, &raws[r], &bus[i]);
                if matches!(becomes, Becomes::Event { .. }) {
                    lifecycle.push((r, pos, i));
                }
            }
        }
    }
    // Each lifecycle message ran its hook once, with its payload and variables.
    let lifecycle_messages: Vec<&Value> = bus.iter().filter(|m| is_lifecycle(m)).collect();
    assert_eq!(
        records.len(),
        lifecycle_messages.len(),
        "hook runs {:?}\nbus:\n{}",
        records.iter().map(|r| &r.hook_event).collect::<Vec<_>>(),
        show_bus()
    );
    let mut seqs: Vec<u64> = records.iter().map(Record::seq).collect();
    seqs.dedup();
    assert_eq!(
        seqs,
        (0..records.len() as u64).collect::<Vec<_>>(),
        "one session's lifecycle events are numbered 0, 1, 2 … with none twice"
    );
    let mut ids: Vec<&str> = records
        .iter()
        .map(|r| r.env["ZERO_HOOK_EVENT_ID"].as_str())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), records.len(), "an event id twice");
    for m in &lifecycle_messages {
        let seq = m["seq"].as_u64().unwrap();
        let r = records
            .iter()
            .find(|r| r.seq() == seq)
            .unwrap_or_else(|| panic!("no hook ran for {m}"));
        let kind = m["event"].as_str().unwrap();
        let env = |k: &str| r.env.get(k).map(String::as_str);
        assert_eq!(r.hook_event, kind, "{m}");
        assert_eq!(
            r.payload, m["payload"],
            "the hook's stdin is the message's payload"
        );
        assert_eq!(env("ZERO_HOOK_EVENT"), Some(kind));
        assert_eq!(env("ZERO_HOOK_AGENT"), Some(agent));
        assert_eq!(env("ZERO_HOOK_SESSION"), Some(expect.session));
        assert_eq!(env("ZERO_HOOK_PAYLOAD"), Some(r.payload_text.as_str()));
        assert_eq!(env("ZERO_HOOK_TIMESTAMP"), m["timestamp"].as_str(), "{m}");
        assert_eq!(env("ZERO_HOOK_EVENT_ID"), m["event_id"].as_str(), "{m}");
        assert!(
            env("ZERO_HOOK_ID").is_some_and(|id| id.starts_with(kind)),
            "{:?}",
            r.env
        );
    }
    // Order: by seq, lifecycle events follow the agent's order (where the agent keeps one).
    lifecycle.sort_by_key(|&(_, _, i)| bus[i]["seq"].as_u64().unwrap());
    for (a, &(ra, pa, ia)) in lifecycle.iter().enumerate() {
        for &(rb, pb, ib) in &lifecycle[a + 1..] {
            // b arrived after a: fine unless the agent sent b's event first.
            let (ta, tb) = (raws[ra].at_ns, raws[rb].at_ns);
            let out_of_order = if ra == rb {
                pb < pa
            } else {
                match expect.order {
                    Order::Exact => tb < ta,
                    Order::Apart(gap) => tb + gap.as_nanos() <= ta,
                }
            };
            assert!(
                !out_of_order,
                "{} (from {}) arrived after {} (from {}), which {agent} sent before it\nbus:\n{}",
                bus[ib]["topic"],
                raws[rb].name,
                bus[ia]["topic"],
                raws[ra].name,
                show_bus()
            );
        }
    }
}

/// One message against its row's entry and the agent's object.
fn check_message(expect: &Expect, becomes: &Becomes, raw: &Raw, m: &Value) {
    let p = &m["payload"];
    match becomes {
        Becomes::Topic(_) => {
            if let Some(object) = &raw.object {
                // A session's end may say how it ended (`success`, from the agent's own reason
                // or status: docs/agents.md); every member the agent sent is there unchanged.
                let mut p = p.clone();
                if let (Some(m), false) = (p.as_object_mut(), object.get("success").is_some())
                    && let Some(s) = m.remove("success")
                {
                    assert!(s.is_boolean(), "success is true or false: {s}");
                }
                assert_eq!(&p, object, "a topic carries the agent's whole object");
            }
        }
        Becomes::Event {
            kind,
            reads,
            checks,
        } => {
            assert_eq!(m["event"], *kind, "{m}");
            if *kind == "agent_start" {
                assert_eq!(
                    (p["agent"].as_str(), p["session"].as_str()),
                    (Some(expect.agent), Some(expect.session)),
                    "{m}"
                );
            }
            // Every member the agent sent is kept (as `agent_<name>` where the event has a field
            // of that name), but those the event reads into its own fields.
            if let Some(object) = raw.object.as_ref().and_then(Value::as_object) {
                for (k, v) in object {
                    if reads.contains(&k.as_str()) {
                        continue;
                    }
                    assert!(
                        p.get(k) == Some(v) || p.get(format!("agent_{k}")) == Some(v),
                        "{kind} from {}: the agent's {k} is not kept: {p}",
                        raw.name
                    );
                }
            }
            for c in checks {
                let (at, ok) = match c {
                    Check::Is(at, want) => (at, p.pointer(at) == Some(want)),
                    Check::Absent(at) => (at, p.pointer(at).is_none()),
                    Check::Contains(at, s) => (
                        at,
                        p.pointer(at)
                            .and_then(Value::as_str)
                            .is_some_and(|v| v.contains(s)),
                    ),
                    Check::FromAgent(at, from) => {
                        let want = raw.object.as_ref().and_then(|o| o.pointer(from));
                        (at, want.is_some() && p.pointer(at) == want)
                    }
                };
                assert!(ok, "{kind} from {}: {c:?} fails at {at}: {p}", raw.name);
            }
        }
    }
}

/// Once the session's events have all arrived ([`settle`]): every one as `expect`'s table says
/// ([`check`]), `tail --last` shows the same, and the server, stopped, ran every hook and
/// dropped nothing. Returns its final report.
pub fn check_settled(
    s: &Setup,
    server: Server,
    mut tail: Tail,
    raws: &[Raw],
    expect: &Expect,
) -> Value {
    settle(s, &mut tail, raws);
    check(expect, raws, &s.records(), &tail.messages());
    tail_last_shows_the_same(&s.ws, &tail.lines);
    drop(tail);
    let report = server.stop();
    hooks_all_ran(&report);
    report
}
