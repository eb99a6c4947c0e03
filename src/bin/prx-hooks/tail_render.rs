//! How `tail` shows what the server sends, and the one path by which its text reaches a terminal.
//!
//! One line per event, run and plugin aggregate, or one JSON object per line (`--json`); server
//! text reaches a terminal only through [`escape`] (via [`Line::render`] and [`say`]).
//! docs/cli.md § `tail`.

use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON object's members in their order, each value as its exact text.
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> serde::Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Members, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(m) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(m);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The `--json` line of an item, serialized by serde_json (never pasted): the object's
/// members in their order, their values' text untouched, with `"type": kind` first (any
/// `type` member of the server's is left out: ours is the one). `None`: the data is not a
/// JSON object.
pub(super) fn json_line(kind: Option<&str>, data: &str) -> Option<String> {
    use serde::ser::{SerializeMap, Serializer};
    let Members(members) = serde_json::from_str(data).ok()?;
    let mut buf = Vec::with_capacity(data.len() + 16);
    let mut ser = serde_json::Serializer::new(&mut buf);
    let mut map = (&mut ser).serialize_map(None).ok()?;
    if let Some(kind) = kind {
        map.serialize_entry("type", kind).ok()?;
    }
    for (k, v) in &members {
        if kind.is_none() || k != "type" {
            map.serialize_entry(k, v).ok()?;
        }
    }
    map.end().ok()?;
    String::from_utf8(buf).ok().map(json_safe)
}

/// Valid JSON made one line and terminal-safe without changing its meaning. In valid JSON a
/// tab, CR or LF can only be whitespace between tokens (inside strings they are escaped), so
/// they go; every other [`hazardous`] character can only be inside a string, so it becomes a
/// `\uXXXX` escape (all of them are in the BMP).
fn json_safe(s: String) -> String {
    if !s.chars().any(hazardous) {
        return s;
    }
    let mut out = String::with_capacity(s.len() + 32);
    for c in s.chars() {
        match c {
            '\t' | '\n' | '\r' => {}
            c if hazardous(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn gap_line(d: &Value) -> String {
    match d["reason"].as_str() {
        Some("evicted") => format!(
            "{} item(s) were lost while disconnected: the server's backlog no longer held them",
            d["missed"].as_u64().unwrap_or(0)
        ),
        Some("not_recorded") => {
            "events were lost while disconnected: the server stopped recording \
             (no client for a while), so how many is unknown"
                .to_string()
        }
        Some("other_instance") => format!(
            "the server restarted (stream {} is now {}): events emitted meanwhile were lost",
            cut(
                d["last_event_id"]
                    .as_str()
                    .and_then(|s| s.rsplit_once('-'))
                    .map_or("?", |(i, _)| i),
                40
            ),
            cut(d["instance"].as_str().unwrap_or("?"), 40)
        ),
        Some("unknown_id") => {
            "the server does not know where this tail left off; following from now".to_string()
        }
        _ => format!("events were lost: {}", cut(&d.to_string(), 300)),
    }
}

/// `HH:MM:SS.mmm` of an RFC 3339 UTC time.
fn clock(t: &Value) -> String {
    t.as_str()
        .and_then(|s| s.get(11..23))
        .unwrap_or("--:--:--.---")
        .to_string()
}

/// Whether `c` must not reach a terminal as it is: C0 controls, DEL and C1 controls (escape
/// sequences begin with ESC or a C1 such as CSI), and the bidirectional formatting characters
/// that reorder what is displayed (embeddings and overrides U+202A–U+202E, isolates
/// U+2066–U+2069, the marks U+200E, U+200F, U+061C).
fn hazardous(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}'
        )
}

/// Server-provided text made safe for a terminal: every [`hazardous`] character escaped
/// (`\u{1b}`, `\n`, `\u{202e}`). [`Line::render`] and [`say`] pass everything they print
/// through it.
fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(hazardous) {
        return s.into();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if hazardous(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// One line on stderr, escaped (messages carry server text: error bodies, reasons, ids).
pub(super) fn say(msg: &str) {
    say!("prx-hooks tail: {}", escape(msg));
}

/// `s` cut to `max` characters (`…` marks a cut). Escaping comes later, at printing.
pub(super) fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A line for the terminal: pieces of text, each with one of our colours (an SGR code) or
/// none (`""`). [`Line::render`] is where text meets the terminal: every piece is escaped, so
/// the only escape sequences printed are the colours written here.
#[derive(Default)]
pub(super) struct Line(Vec<(&'static str, String)>);

impl Line {
    /// `time  label`: how run and plugin lines begin.
    fn head(time: &Value, sgr: &'static str, label: &'static str) -> Line {
        let mut l = Line::default();
        l.add("2", clock(time)).add("", "  ").add(sgr, label);
        l
    }

    fn add(&mut self, sgr: &'static str, text: impl Into<String>) -> &mut Line {
        self.0.push((sgr, text.into()));
        self
    }

    pub(super) fn render(&self, color: bool) -> String {
        let mut s = String::new();
        for (sgr, text) in &self.0 {
            let text = escape(text);
            if color && !sgr.is_empty() {
                s.push_str(&format!("\x1b[{sgr}m{text}\x1b[0m"));
            } else {
                s.push_str(&text);
            }
        }
        s.truncate(s.trim_end().len());
        s
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The documented fields of each event (the rest are extras, shown as `key=value`).
fn documented(event: &str) -> &'static [&'static str] {
    match event {
        "agent_start" => &["agent", "session"],
        "agent_end" => &["success", "messages_count"],
        "llm_request" => &["provider", "model", "messages_count"],
        "llm_response" => &["provider", "model", "duration_ms", "success"],
        "tool_call_start" => &["tool", "arguments"],
        "tool_call" => &["tool", "success", "output"],
        "error" => &["component", "message"],
        _ => &[],
    }
}

/// `ok` in green, `failed` in red, else `?`.
fn ok(l: &mut Line, v: &Value) {
    match v.as_bool() {
        Some(true) => l.add("32", "ok"),
        Some(false) => l.add("31", "failed"),
        None => l.add("", "?"),
    };
}

pub(super) fn event_line(env: &Value) -> Line {
    let p = &env["payload"];
    let event = env["event"].as_str();
    let mut l = Line::default();
    l.add("2", clock(&env["timestamp"])).add("", "  ");
    let who = match (env["agent"].as_str(), env["session"].as_str()) {
        (Some(a), Some(s)) if !a.is_empty() || !s.is_empty() => {
            format!("{}/{}", cut(a, 40), cut(s, 40))
        }
        _ => "-".to_string(),
    };
    l.add("36", who).add("", "  ");
    let name = cut(
        event.unwrap_or_else(|| env["topic"].as_str().unwrap_or("?")),
        60,
    );
    let sgr = match event {
        Some("error") => "1;31",
        Some(_) => "1",
        None => "35",
    };
    l.add(sgr, format!("{name:<15}")).add("", "  ");
    let start = l.0.len();
    body(&mut l, event, env["topic"].as_str(), p);
    if let (Some(e), Value::Object(m)) = (event, p) {
        let known = documented(e);
        for (k, v) in m.iter().filter(|(k, _)| !known.contains(&k.as_str())) {
            let sep = if l.0.len() > start { " " } else { "" };
            l.add("", format!("{sep}{}={}", cut(k, 40), cut(&text(v), 60)));
        }
    }
    l
}

/// What an event says, from the fields it has: one an agent left out (a lenient line, an
/// agent's hook that gives no exit status) is left out here too, never shown as `?`.
fn body(l: &mut Line, event: Option<&str>, topic: Option<&str>, p: &Value) {
    let has = |field: &str| !matches!(p.get(field), None | Some(Value::Null));
    let f = |field: &str, max: usize| cut(&text(&p[field]), max);
    // The present ones of `fields`, space-separated.
    let words = |fields: &[(&str, usize)]| {
        fields
            .iter()
            .filter(|(k, _)| has(k))
            .map(|(k, max)| f(k, *max))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let messages =
        || has("messages_count").then(|| format!("{} messages", f("messages_count", 20)));
    match event {
        Some("agent_end") => {
            if has("success") {
                ok(l, &p["success"]);
            }
            match (has("success"), messages()) {
                (true, Some(m)) => l.add("", format!(", {m}")),
                (false, Some(m)) => l.add("", m),
                (true, None) => l,
                (false, None) => l.add("2", "ended"),
            };
        }
        Some("llm_request") => {
            let mut parts = vec![words(&[("provider", 40), ("model", 60)])];
            parts.extend(messages());
            parts.retain(|p| !p.is_empty());
            l.add("", parts.join(", "));
        }
        Some("llm_response") => {
            let mut head = words(&[("provider", 40), ("model", 60)]);
            if has("duration_ms") {
                head = format!("{head} {} ms", f("duration_ms", 20))
                    .trim_start()
                    .to_string();
            }
            l.add("", head.clone());
            if has("success") {
                l.add("", if head.is_empty() { "" } else { " " });
                ok(l, &p["success"]);
            }
        }
        Some("tool_call_start") => {
            l.add("", words(&[("tool", 60), ("arguments", 100)]));
        }
        Some("tool_call") => {
            l.add("", f("tool", 60));
            if has("success") {
                l.add("", " ");
                ok(l, &p["success"]);
            }
            if has("output") {
                l.add("", format!(": {}", f("output", 100)));
            }
        }
        Some("error") => {
            l.add("", format!("{}: {}", f("component", 40), f("message", 120)));
        }
        Some(_) => {}
        None if topic == Some("prx.policy.decision") => {
            let decided = match p["decision"].as_str() {
                Some(d) => format!("{d} by {}: {}", f("policy", 64), f("reason", 100)),
                None => "no decision".to_string(),
            };
            l.add(
                "",
                format!("{} {decided} ({} µs)", f("point", 20), f("elapsed_us", 20)),
            );
        }
        None => {
            l.add("", cut(&p.to_string(), 120));
        }
    }
}

pub(super) fn run_line(r: &Value) -> Line {
    let direct = if r["direct"].as_bool() == Some(true) {
        ", test"
    } else {
        ""
    };
    let mut l = Line::head(&r["time"], "36", "run");
    l.add(
        "",
        format!(
            "  hook {} ({}{direct})  ",
            cut(&text(&r["id"]), 64),
            cut(&text(&r["event"]), 40),
        ),
    );
    let sgr = match r["kind"].as_str() {
        Some("ok") => "32",
        Some("skipped" | "dropped" | "cancelled") => "33",
        _ => "31",
    };
    l.add(sgr, cut(&text(&r["outcome"]), 100)).add(
        "",
        format!("  {:.1} ms", r["duration_ms"].as_f64().unwrap_or(0.0)),
    );
    let tail = text(&r["stderr_tail"]);
    let last = tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if !last.is_empty() && r["kind"].as_str() != Some("ok") {
        l.add("", format!("  stderr: {}", cut(last.trim(), 120)));
    }
    l
}

pub(super) fn plugin_line(a: &Value) -> Line {
    let parts = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, n)| format!("{} {}", cut(k, 40), cut(&text(n), 20)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut l = Line::head(&a["time"], "35", "plugin");
    l.add(
        "",
        format!(
            "  {}  {} call(s) in {} ms",
            cut(&text(&a["plugin"]), 64),
            cut(&text(&a["calls"]), 20),
            cut(&text(&a["interval_ms"]), 20),
        ),
    );
    let results = parts(&a["results"]);
    if !results.is_empty() {
        l.add("", format!(": {}", results.join(", ")));
    }
    let dropped = parts(&a["dropped"]);
    if !dropped.is_empty() {
        l.add("", format!("; dropped {}", dropped.join(", ")));
    }
    if a["state"].as_str().is_some_and(|s| s != "running") {
        l.add("", format!(" [{}]", cut(&text(&a["state"]), 60)));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_text_cannot_reach_the_terminal_as_escape_sequences() {
        assert_eq!(escape("a\x1b[2Jb\nc"), "a\\u{1b}[2Jb\\nc");
        assert_eq!(
            escape("\u{9b}31m \u{7f} \u{202e}x\u{2066}"),
            "\\u{9b}31m \\u{7f} \\u{202e}x\\u{2066}"
        );
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("abc", 3), "abc");
        let mut l = Line::default();
        l.add("31", "\x1b[5mX").add("", " \x07 ");
        assert_eq!(l.render(true), "\x1b[31m\\u{1b}[5mX\x1b[0m \\u{7}");
    }

    fn shown(line: &str) -> String {
        let env: Value = serde_json::from_str(line).unwrap();
        let text = event_line(&env).render(false);
        // After the time, who and the event name.
        text.splitn(3, "  ")
            .nth(2)
            .unwrap()
            .trim_start()
            .to_string()
    }

    #[test]
    fn fields_an_event_does_not_have_are_left_out_not_shown_as_question_marks() {
        let e = |event: &str, payload: &str| {
            shown(&format!(
                r#"{{"event":"{event}","agent":"a","session":"s","timestamp":"2026-01-01T00:00:00Z","payload":{payload}}}"#
            ))
        };
        assert_eq!(e("agent_end", "{}"), "agent_end        ended");
        assert_eq!(e("agent_end", r#"{"success":true}"#), "agent_end        ok");
        assert_eq!(
            e("agent_end", r#"{"success":false,"messages_count":3}"#),
            "agent_end        failed, 3 messages"
        );
        assert_eq!(
            e("agent_end", r#"{"messages_count":3}"#),
            "agent_end        3 messages"
        );
        assert_eq!(
            e("tool_call", r#"{"tool":"Bash"}"#),
            "tool_call        Bash"
        );
        assert_eq!(
            e(
                "tool_call",
                r#"{"tool":"Bash","success":true,"output":"x"}"#
            ),
            "tool_call        Bash ok: x"
        );
        assert_eq!(e("llm_request", r#"{"model":"m"}"#), "llm_request      m");
        assert_eq!(
            e(
                "llm_request",
                r#"{"provider":"p","model":"m","messages_count":2}"#
            ),
            "llm_request      p m, 2 messages"
        );
        assert_eq!(e("llm_response", r#"{"model":"m"}"#), "llm_response     m");
        assert_eq!(
            e(
                "llm_response",
                r#"{"provider":"p","model":"m","duration_ms":5,"success":true}"#
            ),
            "llm_response     p m 5 ms ok"
        );
        for (event, payload) in [
            ("agent_end", "{}"),
            ("llm_request", "{}"),
            ("llm_response", "{}"),
            ("tool_call", r#"{"tool":"t"}"#),
        ] {
            assert!(!e(event, payload).contains('?'), "{event} {payload}");
        }
    }

    #[test]
    fn a_policy_decision_reads_as_one_line() {
        let env = serde_json::json!({"topic": "prx.policy.decision", "agent": "claude-code",
            "session": "", "timestamp": null, "payload": {"point": "tool_call_start",
            "decision": "deny", "policy": "no-rm-rf", "reason": "not here", "elapsed_us": 7}});
        let line = event_line(&env).render(false);
        assert!(
            line.ends_with(
                "claude-code/  prx.policy.decision  tool_call_start deny by no-rm-rf: not here (7 µs)"
            ),
            "{line}"
        );
        let mut none = env.clone();
        none["payload"]["decision"] = Value::Null;
        let line = event_line(&none).render(false);
        assert!(
            line.ends_with("tool_call_start no decision (7 µs)"),
            "{line}"
        );
    }

    #[test]
    fn json_lines_are_serialized_not_pasted() {
        assert_eq!(
            json_line(Some("run"), "{\"a\":1}").unwrap(),
            "{\"type\":\"run\",\"a\":1}"
        );
        assert_eq!(json_line(Some("gap"), "{}").unwrap(), "{\"type\":\"gap\"}");
        // The server's own "type" cannot stand beside ours; key order and value text are kept.
        assert_eq!(
            json_line(
                Some("run"),
                "{\"z\":1.50,\"type\":\"bus\",\"a\":{\"b\" :\n [1, 2]}}"
            )
            .unwrap(),
            "{\"type\":\"run\",\"z\":1.50,\"a\":{\"b\" : [1, 2]}}"
        );
        assert_eq!(
            json_line(None, "{\"s\":\"\u{7f}\u{9b}\u{202e}\\u001b\"}").unwrap(),
            "{\"s\":\"\\u007f\\u009b\\u202e\\u001b\"}"
        );
        for bad in [
            "",
            "5",
            "[1]",
            "{\"a\":\"\x1b\"}",
            "{\"a\":1} {",
            "{\"a\":1}}",
        ] {
            assert_eq!(json_line(None, bad), None, "{bad:?}");
        }
    }
}
