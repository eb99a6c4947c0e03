//! Oracles shared by the fuzz targets in `fuzz_targets/`.
//!
//! serde_json is the reference JSON reader. It differs from prx-hooks' strict validator
//! (`src/json.rs`) in exactly one accepted way, which the helpers here model:
//!
//! * serde_json (without `arbitrary_precision`) rejects numbers that overflow an `f64`, such as
//!   `1e400` or a 400-digit integer, with "number out of range"; RFC 8259 allows them and so does
//!   our validator. [`parse`] reports that case as [`Serde::OutOfRange`], and only after checking
//!   that serde_json's non-converting reader (`IgnoredAny`) accepts the text and that the text is
//!   UTF-8 (`IgnoredAny` skips strings without checking it), so a genuine error later in the
//!   text cannot hide behind the range error.
//!
//! Checked, and needing no exception (serde_json 1.0.154, see the unit tests below):
//!
//! * lone UTF-16 surrogate escapes (`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`): serde_json rejects
//!   them when parsing into a `Value` ("lone leading surrogate in hex escape" / "unexpected end
//!   of hex escape") — only its `IgnoredAny`/`RawValue` path lets them through — so a `Value`
//!   parse agrees with the strict validator;
//! * nesting: serde_json's default recursion limit accepts exactly 127 levels of `[`/`{`, the
//!   validator's `MAX_DEPTH`; `IgnoredAny` has no limit, so [`depth`] is computed independently.

pub mod former_json;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// What serde_json makes of a JSON text.
#[derive(Debug)]
pub enum Serde {
    /// Parsed into a `Value`.
    Ok(Value),
    /// Rejected only because a number does not fit an `f64` (RFC 8259 allows it).
    OutOfRange,
    /// Rejected; the message says why.
    Rejected(String),
}

impl Serde {
    pub fn value(&self) -> Option<&Value> {
        match self {
            Serde::Ok(v) => Some(v),
            _ => None,
        }
    }
}

/// Parses `src` as one JSON text with serde_json's default settings.
pub fn parse(src: &[u8]) -> Serde {
    match serde_json::from_slice::<Value>(src) {
        Ok(v) => Serde::Ok(v),
        Err(e) => {
            let msg = e.to_string();
            // `IgnoredAny` skips strings without checking their UTF-8, so that is checked here:
            // a text both out of range and not UTF-8 is rejected for the UTF-8.
            if msg.contains("number out of range")
                && std::str::from_utf8(src).is_ok()
                && serde_json::from_slice::<IgnoredAny>(src).is_ok()
            {
                Serde::OutOfRange
            } else {
                Serde::Rejected(msg)
            }
        }
    }
}

/// JSON's four whitespace bytes (RFC 8259 §2).
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Calls `f(byte, inside_string)` for every byte of `text`, a lexically well-formed JSON text.
/// Quotes count as inside; a backslash and the byte after it too.
fn scan(text: &[u8], mut f: impl FnMut(u8, bool)) {
    let (mut in_str, mut escaped) = (false, false);
    for &b in text {
        if in_str {
            f(b, true);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_str = false;
            }
        } else {
            if b == b'"' {
                in_str = true;
            }
            f(b, in_str);
        }
    }
}

/// `text` without the whitespace outside its strings: what a compactor must produce.
pub fn strip_ws(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    scan(text, |b, in_str| {
        if in_str || !is_ws(b) {
            out.push(b)
        }
    });
    out
}

/// Whether `text` has whitespace outside its strings.
pub fn has_ws_outside_strings(text: &[u8]) -> bool {
    let mut found = false;
    scan(text, |b, in_str| found |= !in_str && is_ws(b));
    found
}

/// The deepest nesting of `[`/`{` outside strings (0 for a scalar).
pub fn depth(text: &[u8]) -> usize {
    let (mut cur, mut max) = (0usize, 0usize);
    scan(text, |b, in_str| {
        if in_str {
            return;
        }
        match b {
            b'[' | b'{' => {
                cur += 1;
                max = max.max(cur);
            }
            b']' | b'}' => cur = cur.saturating_sub(1),
            _ => {}
        }
    });
    max
}

/// The first non-whitespace byte.
pub fn first_non_ws(text: &[u8]) -> Option<u8> {
    text.iter().copied().find(|&b| !is_ws(b))
}

/// An object's members in written order, duplicates kept, each value as its raw text. (A
/// `Value` map is sorted and merges duplicates; the order of payload fields is part of the
/// contract.) RawValue does not convert numbers, so out-of-range numbers are fine here.
pub fn object_members(text: &str) -> Result<Vec<(String, Box<RawValue>)>, serde_json::Error> {
    struct Members(Vec<(String, Box<RawValue>)>);
    impl<'de> serde::Deserialize<'de> for Members {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Members;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                        out.push(entry);
                    }
                    Ok(Members(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    serde_json::from_str::<Members>(text).map(|m| m.0)
}

/// The member names of [`object_members`].
pub fn keys(members: &[(String, Box<RawValue>)]) -> Vec<&str> {
    members.iter().map(|(k, _)| k.as_str()).collect()
}

/// The bus's topic rule, written independently: 1..=256 bytes of dot-separated, non-empty
/// segments of `A-Z a-z 0-9 _ -`.
pub fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= 256
        && topic.split('.').all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// A subscription pattern: `*`, an exact topic, or a topic followed by `.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern<'a> {
    All,
    Prefix(&'a str),
    Exact(&'a str),
}

impl<'a> Pattern<'a> {
    /// The reference parse: `None` when the bus must refuse the pattern.
    pub fn parse(p: &'a str) -> Option<Pattern<'a>> {
        if p == "*" {
            Some(Pattern::All)
        } else if let Some(stem) = p.strip_suffix(".*") {
            valid_topic(stem).then_some(Pattern::Prefix(stem))
        } else {
            valid_topic(p).then_some(Pattern::Exact(p))
        }
    }

    /// Everything at any depth below a prefix; not the prefix itself.
    pub fn matches(&self, topic: &str) -> bool {
        match *self {
            Pattern::All => true,
            Pattern::Prefix(stem) => topic
                .strip_prefix(stem)
                .is_some_and(|rest| rest.starts_with('.')),
            Pattern::Exact(t) => topic == t,
        }
    }
}

/// A message fit for `FILE:LINE: message`: non-empty, no line break.
pub fn assert_one_line(msg: &str, what: &dyn std::fmt::Debug) {
    assert!(!msg.is_empty(), "empty error message for {what:?}");
    assert!(
        !msg.contains(['\n', '\r']),
        "error message spans lines: {msg:?}\n  for input {what:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_json_rejects_lone_surrogates_into_value() {
        for s in [
            r#""\ud800""#,
            r#""\udc00""#,
            r#"["\ud800\u0041"]"#,
            r#"{"a":"\udbff"}"#,
        ] {
            assert!(
                matches!(parse(s.as_bytes()), Serde::Rejected(_)),
                "{s}: {:?}",
                parse(s.as_bytes())
            );
            // ...while its raw path would let them through: never use that as the oracle.
            assert!(serde_json::from_str::<IgnoredAny>(s).is_ok());
        }
        assert!(matches!(parse(br#""\ud83d\ude00""#), Serde::Ok(_)));
    }

    #[test]
    fn out_of_range_is_recognized_only_when_alone() {
        for s in ["1e400", "-1e400", "[1E+999]", &"9".repeat(400)] {
            assert!(matches!(parse(s.as_bytes()), Serde::OutOfRange), "{s}");
        }
        assert!(matches!(parse(b"1e-400"), Serde::Ok(_)));
        // A syntax error after the big number is still an error, and so is invalid UTF-8 in a
        // string (the fuzzer found the oracle calling that OutOfRange).
        assert!(matches!(parse(b"[1e400,]"), Serde::Rejected(_)));
        assert!(matches!(parse(b"[1e400, \"x\x99\"]"), Serde::Rejected(_)));
    }

    #[test]
    fn serde_json_depth_limit_is_127() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(matches!(parse(deep(127).as_bytes()), Serde::Ok(_)));
        assert!(matches!(parse(deep(128).as_bytes()), Serde::Rejected(_)));
        assert_eq!(depth(deep(128).as_bytes()), 128);
        assert_eq!(depth(br#"{"[[":[{}]}"#), 3);
    }

    #[test]
    fn scanning_respects_strings() {
        let src = b" { \"a b\" : [1, \"\\\" x\\\\\" ] }\n";
        assert_eq!(strip_ws(src), br#"{"a b":[1,"\" x\\"]}"#.to_vec());
        assert!(has_ws_outside_strings(src));
        assert!(!has_ws_outside_strings(&strip_ws(src)));
    }

    #[test]
    fn members_keep_order_and_duplicates() {
        let m = object_members(r#"{"z":1,"a":{"x":1e400},"z":"s"}"#).unwrap();
        assert_eq!(keys(&m), ["z", "a", "z"]);
        assert_eq!(m[1].1.get(), r#"{"x":1e400}"#);
    }

    #[test]
    fn the_former_compactor_agrees_with_the_library_on_known_cases() {
        use prx_hooks::__private::json::{MAX_DEPTH, Top, check_value};
        for src in [
            &b""[..],
            b" ",
            b"{}",
            b" [1, -2.5e+3, true, null] ",
            b"{\"a\":\"\\ud800\"}",
            b"{\"a\":\"\\ud83d\\ude00\"}",
            b"{\"a\":\"\xff\"}",
            b"{\"a\":tru} \xff",
            b"[01]",
            b"{\"a\" 1}",
            b"\"\xe2\x82\"",
            // The refusals `json::tests::refusals_say_where_and_why_as_before` names.
            b"{1:2}",
            b"{\"a\x01\":1}",
            b"{\"a\":1,}",
            b"[\"\\u12\"]",
            b"[\"\\ud800x\"]",
            b"[\"\\ud800\\u0041\"]",
            b"[\"\\udc00\"]",
            b"[\"\\x\"]",
            b"[1.]",
            b"[1e+]",
            b"[-]",
            b"[1 }",
            b"{} x",
            b" \n ",
            b"[[[]]]",
            b"\"abc",
            b"[\"\xe2\x82\"]",
        ] {
            for depth in [MAX_DEPTH, 2] {
                let new = check_value(src, depth).map_err(|r| (r.at, r.reason));
                let old =
                    former_json::run(src, false, depth, None, None).map_err(|r| (r.at, r.reason));
                assert_eq!(new, old, "{src:?}");
            }
            let mut a = b"x".to_vec();
            let mut b = b"x".to_vec();
            assert_eq!(
                prx_hooks::__private::json::append_compact(&mut a, src, Top::Any),
                former_json::append_compact_within(&mut b, src, false, MAX_DEPTH)
            );
            assert_eq!(a, b);
        }
    }

    #[test]
    fn reference_topics_and_patterns() {
        assert!(valid_topic("a.b-c_D9") && !valid_topic("a..b") && !valid_topic("a."));
        assert!(valid_topic(&"a".repeat(256)) && !valid_topic(&"a".repeat(257)));
        let p = Pattern::parse("app.*").unwrap();
        assert!(
            p.matches("app.x") && p.matches("app.x.y") && !p.matches("app") && !p.matches("appx.y")
        );
        assert_eq!(Pattern::parse("*.*"), None);
        assert_eq!(Pattern::parse(".*"), None);
    }
}
