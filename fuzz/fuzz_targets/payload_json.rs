//! `Event::to_json` on arbitrary events (all eight; arbitrary strings, u64s and bools).
//!
//! * the payload is one line with no raw control byte at all;
//! * it is a JSON object whose members are exactly the kind's `fields()`, in that order;
//! * strings read back equal, numbers are written canonically and read back equal, bools too;
//! * `tool_call_start.arguments`: when serde_json reads the text as an object, the payload
//!   holds that object; a string in the payload is the text exactly; an object in the payload is
//!   what serde_json reads from the text — or serde_json refused the text only for a number out
//!   of `f64` range, and then the object is the text minus insignificant whitespace, byte for
//!   byte; any other JSON type is wrong;
//! * the whole payload is readable by a default serde_json (modulo out-of-range numbers);
//! * the event survives an NDJSON round trip: a line carrying its fields (arguments as a JSON
//!   string) parses back with `ndjson::parse_line` to the same event.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prx_hooks::Event;
use prx_hooks_fuzz::{Serde, depth, keys, object_members, parse, strip_ws};
use serde_json::{Value, json};

#[derive(Arbitrary, Debug)]
enum Ev<'a> {
    AgentStart {
        agent: &'a str,
        session: &'a str,
    },
    AgentEnd {
        success: bool,
        messages_count: u64,
    },
    LlmRequest {
        provider: &'a str,
        model: &'a str,
        messages_count: u64,
    },
    LlmResponse {
        provider: &'a str,
        model: &'a str,
        duration_ms: u64,
        success: bool,
    },
    ToolCallStart {
        tool: &'a str,
        arguments: &'a str,
    },
    ToolCall {
        tool: &'a str,
        success: bool,
        output: &'a str,
    },
    TurnComplete,
    Error {
        component: &'a str,
        message: &'a str,
    },
}

enum Want<'a> {
    Str(&'a str),
    U64(u64),
    Bool(bool),
    Arguments(&'a str),
}

fn expand<'a>(ev: &Ev<'a>) -> (Event<'a>, Vec<(&'static str, Want<'a>)>) {
    use Want::*;
    match *ev {
        Ev::AgentStart { agent, session } => (
            Event::AgentStart { agent, session },
            vec![("agent", Str(agent)), ("session", Str(session))],
        ),
        Ev::AgentEnd {
            success,
            messages_count,
        } => (
            Event::AgentEnd {
                success,
                messages_count,
            },
            vec![
                ("success", Bool(success)),
                ("messages_count", U64(messages_count)),
            ],
        ),
        Ev::LlmRequest {
            provider,
            model,
            messages_count,
        } => (
            Event::LlmRequest {
                provider,
                model,
                messages_count,
            },
            vec![
                ("provider", Str(provider)),
                ("model", Str(model)),
                ("messages_count", U64(messages_count)),
            ],
        ),
        Ev::LlmResponse {
            provider,
            model,
            duration_ms,
            success,
        } => (
            Event::LlmResponse {
                provider,
                model,
                duration_ms,
                success,
            },
            vec![
                ("provider", Str(provider)),
                ("model", Str(model)),
                ("duration_ms", U64(duration_ms)),
                ("success", Bool(success)),
            ],
        ),
        Ev::ToolCallStart { tool, arguments } => (
            Event::ToolCallStart { tool, arguments },
            vec![("tool", Str(tool)), ("arguments", Arguments(arguments))],
        ),
        Ev::ToolCall {
            tool,
            success,
            output,
        } => (
            Event::ToolCall {
                tool,
                success,
                output,
            },
            vec![
                ("tool", Str(tool)),
                ("success", Bool(success)),
                ("output", Str(output)),
            ],
        ),
        Ev::TurnComplete => (Event::TurnComplete, vec![]),
        Ev::Error { component, message } => (
            Event::Error { component, message },
            vec![("component", Str(component)), ("message", Str(message))],
        ),
    }
}

fuzz_target!(|ev: Ev<'_>| {
    let (event, want) = expand(&ev);
    let payload = event.to_json();
    let mut out = b"prefix".to_vec();
    event.write_json(&mut out);
    assert_eq!(&out[..6], b"prefix", "write_json must append");
    assert_eq!(
        &out[6..],
        payload.as_bytes(),
        "write_json and to_json differ"
    );

    assert!(
        !payload.bytes().any(|b| b < 0x20),
        "raw control byte in {payload:?}"
    );
    let members = object_members(&payload)
        .unwrap_or_else(|e| panic!("payload is not a JSON object ({e}): {payload:?}"));
    assert_eq!(keys(&members), event.kind().fields(), "{payload}");
    let names: Vec<_> = want.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys(&members), names, "{payload}");

    for ((key, raw), (_, want)) in members.iter().zip(&want) {
        let raw = raw.get();
        match *want {
            Want::Str(s) => {
                let got: String =
                    serde_json::from_str(raw).unwrap_or_else(|e| panic!("{key}: {e}: {raw}"));
                assert_eq!(got, s, "{key}");
            }
            Want::U64(n) => assert_eq!(raw, n.to_string(), "{key}"),
            Want::Bool(b) => assert_eq!(raw, if b { "true" } else { "false" }, "{key}"),
            Want::Arguments(text) => check_arguments(text, raw),
        }
    }

    match parse(payload.as_bytes()) {
        Serde::Ok(v) => assert!(v.is_object()),
        Serde::OutOfRange => {}
        Serde::Rejected(e) => panic!("serde_json cannot read the payload ({e}): {payload}"),
    }

    // NDJSON round trip.
    let mut fields = serde_json::Map::new();
    for (key, want) in &want {
        let v = match *want {
            Want::Str(s) | Want::Arguments(s) => Value::from(s),
            Want::U64(n) => Value::from(n),
            Want::Bool(b) => Value::from(b),
        };
        fields.insert(key.to_string(), v);
    }
    let line = json!({
        "event": event.kind().name(),
        "agent": "fuzz-agent",
        "session": "fuzz-session",
        "payload": fields,
    })
    .to_string();
    let record = prx_hooks::ndjson::parse_line(line.as_bytes())
        .unwrap_or_else(|e| panic!("NDJSON round trip failed: {e}\n  line: {line}"));
    assert_eq!(record.event(), event, "NDJSON round trip: {line}");
    assert_eq!(
        (record.agent.as_str(), record.session.as_str()),
        ("fuzz-agent", "fuzz-session")
    );
});

/// `raw` is the payload's `arguments` member for the event's `arguments` text.
fn check_arguments(text: &str, raw: &str) {
    let reference = parse(text.as_bytes());
    // Objects nested deeper than ARGUMENTS_MAX_DEPTH are passed on as strings, so the payload
    // and the `--print` envelope around it stay within serde_json's recursion limit.
    let embeddable = depth(text.as_bytes()) <= prx_hooks::event::ARGUMENTS_MAX_DEPTH as usize;
    if let (Serde::Ok(obj @ Value::Object(_)), true) = (&reference, embeddable) {
        let got = parse(raw.as_bytes());
        assert_eq!(
            got.value(),
            Some(obj),
            "arguments {text:?} embedded as {raw}"
        );
    }
    if raw.starts_with('"') {
        let got: String = serde_json::from_str(raw).expect("a string member reads back");
        assert_eq!(
            got, text,
            "arguments passed on as a string must be the text exactly"
        );
    } else if raw.starts_with('{') {
        match &reference {
            Serde::Ok(v) => assert_eq!(parse(raw.as_bytes()).value(), Some(v), "{text:?}"),
            Serde::OutOfRange => {}
            Serde::Rejected(e) => {
                panic!("arguments {text:?} embedded as {raw}, serde_json says {e}")
            }
        }
        // Embedded as is, minus insignificant whitespace.
        assert_eq!(
            raw.as_bytes(),
            strip_ws(text.as_bytes()),
            "arguments {text:?}"
        );
    } else {
        panic!("arguments {text:?} became neither a string nor an object: {raw}");
    }
}
