//! `ndjson::parse_line` on arbitrary bytes.
//!
//! * never panics;
//! * `Err`: the message is non-empty and one line (it is printed after `FILE:LINE: `);
//! * `Ok`: the event's documented payload (`record.event().to_json()`) is one line with no raw
//!   control byte, is a JSON object whose members are exactly `record.kind().fields()`, in that
//!   order, with values of the documented types; the delivered payload (`record.payload_json()`)
//!   is that object's members, byte for byte, followed by the extra fields; and when serde_json
//!   can read the whole line as a `Value`, the record agrees with it: `event` is the kind's name,
//!   `agent`/`session` match, every payload field carries the line's value (`agent_start`'s
//!   `agent`/`session`, when the payload lacks them, the envelope's; `arguments`: an object is
//!   embedded as is, a string is the JSON text — embedded if it is an object, passed on as that
//!   string otherwise — and any other value is passed on as its JSON text), and the extra fields
//!   are exactly the line's other payload members, each with the line's value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::ndjson::parse_line;
use prx_hooks::{Event, EventKind};
use prx_hooks_fuzz::{Serde, assert_one_line, keys, object_members, parse};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let record = match parse_line(data) {
        Ok(r) => r,
        Err(e) => {
            assert_one_line(e.message(), &String::from_utf8_lossy(data));
            assert_eq!(e.to_string(), e.message());
            return;
        }
    };
    let kind = record.kind();
    let event = record.event();
    assert_eq!(event.kind(), kind);
    let payload = event.to_json();
    assert!(
        !payload.bytes().any(|b| b < 0x20),
        "raw control byte in payload {payload:?}"
    );
    let members = object_members(&payload)
        .unwrap_or_else(|e| panic!("payload is not a JSON object ({e}): {payload:?}"));
    assert_eq!(keys(&members), kind.fields(), "payload {payload}");
    // The payload as a whole must be readable by a default serde_json (ARCHITECTURE.md § Events).
    if let Serde::Rejected(e) = parse(payload.as_bytes()) {
        panic!("serde_json cannot read the payload ({e}): {payload}");
    }
    // What hooks get: the documented members byte for byte, then the extra fields.
    let delivered = record.payload_json();
    assert!(
        !delivered.bytes().any(|b| b < 0x20),
        "raw control byte in payload {delivered:?}"
    );
    let all = object_members(&delivered)
        .unwrap_or_else(|e| panic!("payload is not a JSON object ({e}): {delivered:?}"));
    let n = kind.fields().len();
    assert!(all.len() >= n, "documented fields missing: {delivered}");
    for ((k, v), (dk, dv)) in all[..n].iter().zip(&members) {
        assert_eq!((k, v.get()), (dk, dv.get()), "payload {delivered}");
    }
    let extras = &all[n..];
    assert_eq!(
        record.has_extras(),
        !extras.is_empty(),
        "payload {delivered}"
    );
    for (k, _) in extras {
        assert!(
            !kind.fields().contains(&k.as_str()),
            "extra field {k} repeats a documented one: {delivered}"
        );
    }
    if let Serde::Rejected(e) = parse(delivered.as_bytes()) {
        panic!("serde_json cannot read the payload ({e}): {delivered}");
    }

    // Each member has the documented type; `arguments` may hold numbers serde_json cannot
    // convert (RFC 8259 allows them), everything else must parse into a Value.
    let mut fields = serde_json::Map::new();
    for (key, raw) in &members {
        let v = match parse(raw.get().as_bytes()) {
            Serde::Ok(v) => v,
            Serde::OutOfRange if key == "arguments" => continue,
            other => panic!("payload field {key}: {other:?} in {payload}"),
        };
        let type_ok = match key.as_str() {
            "success" => v.is_boolean(),
            "messages_count" | "duration_ms" => v.is_u64(),
            "arguments" => v.is_object() || v.is_string(),
            _ => v.is_string(),
        };
        assert!(type_ok, "payload field {key} has the wrong type: {payload}");
        fields.insert(key.clone(), v);
    }

    // Agreement with serde_json's reading of the line, when it has one.
    let Serde::Ok(line) = parse(data) else { return };
    let line = line.as_object().expect("an accepted line is an object");
    assert_eq!(line.get("event"), Some(&Value::from(kind.name())));
    assert_eq!(line.get("agent"), Some(&Value::from(record.agent.as_str())));
    assert_eq!(
        line.get("session"),
        Some(&Value::from(record.session.as_str()))
    );
    let empty = serde_json::Map::new();
    let given = match line.get("payload") {
        None | Some(Value::Null) => &empty,
        Some(p) => p.as_object().expect("an accepted payload is an object"),
    };
    let given_extras: Vec<&String> = given
        .keys()
        .filter(|k| !kind.fields().contains(&k.as_str()))
        .collect();
    assert_eq!(
        extras.len(),
        given_extras.len(),
        "line {line:?}, payload {delivered}"
    );
    for (k, raw) in extras {
        let want = given.get(k).expect("every extra field comes from the line");
        if let Serde::Ok(got) = parse(raw.get().as_bytes()) {
            assert_eq!(
                &got, want,
                "extra field {k}: line {line:?}, payload {delivered}"
            );
        }
    }
    for &name in kind.fields() {
        let from_envelope;
        let want = match given.get(name) {
            Some(v) => v,
            // agent_start's own fields come from the envelope when the payload lacks them.
            None if kind == EventKind::AgentStart => {
                from_envelope = Value::from(if name == "agent" {
                    record.agent.as_str()
                } else {
                    record.session.as_str()
                });
                &from_envelope
            }
            None => panic!("an accepted payload has every field: {name} is missing"),
        };
        if name != "arguments" {
            assert_eq!(
                fields.get(name),
                Some(want),
                "field {name}: line {line:?}, payload {payload}"
            );
            continue;
        }
        let Event::ToolCallStart { arguments, .. } = event else {
            panic!("arguments on a {kind} event")
        };
        let got = fields.get(name);
        match want {
            Value::Object(_) => assert_eq!(
                got,
                Some(want),
                "arguments: line {line:?}, payload {payload}"
            ),
            Value::String(text) => {
                assert_eq!(
                    arguments, text,
                    "the event's arguments must be the string's contents"
                );
                match got {
                    Some(Value::String(s)) => assert_eq!(s, text),
                    Some(obj @ Value::Object(_)) => {
                        assert_eq!(
                            parse(text.as_bytes()).value(),
                            Some(obj),
                            "arguments {text:?}"
                        )
                    }
                    None => assert!(matches!(parse(text.as_bytes()), Serde::OutOfRange)),
                    Some(other) => panic!("arguments became {other:?}"),
                }
            }
            other => {
                // Passed on as its own JSON text, which reads back as the same value.
                let Some(Value::String(s)) = got else {
                    panic!("arguments {other:?} became {got:?}")
                };
                assert_eq!(s, arguments);
                assert_eq!(
                    parse(s.as_bytes()).value(),
                    Some(other),
                    "arguments text {s:?}"
                );
            }
        }
    }
});
