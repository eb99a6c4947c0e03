//! An event's payload read for the span builder: one pass over the message's JSON that finds
//! the top-level members (key and raw value ranges, into a buffer the builder reuses), values
//! decoded only when a span needs them. No serde, no allocation.
//!
//! The payload was written by the pipeline's own writer (`Event::write_payload`: an object,
//! documented fields first, then extras that `Extras::check` accepted), so the reader only has
//! to find where members start and end; anything it cannot read gives an empty payload, as a
//! payload that is not an object does.

use std::borrow::Cow;

/// One member: key and value as byte ranges of the JSON (the key without its quotes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Member {
    key: (u32, u32),
    key_escaped: bool,
    value: (u32, u32),
}

/// The members of a payload object, in order; empty when the payload is not an object.
pub(crate) struct Payload<'a> {
    json: &'a str,
    members: &'a [Member],
}

/// A raw JSON value (its text, as in the payload).
pub(crate) type Raw<'a> = &'a str;

/// A raw JSON value as text: strings decoded, anything else as its (compact) JSON.
pub(crate) fn raw_text(raw: Raw<'_>) -> Cow<'_, str> {
    if raw.starts_with('"') {
        decode_str(raw).unwrap_or(Cow::Borrowed(""))
    } else {
        Cow::Borrowed(raw)
    }
}

/// A JSON string literal's value, borrowed when it has no escapes.
fn decode_str(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains('\\') {
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    } else {
        Some(Cow::Borrowed(inner))
    }
}

impl<'a> Payload<'a> {
    /// Reads `json`'s members into `members` (cleared first).
    pub(crate) fn parse(json: &'a str, members: &'a mut Vec<Member>) -> Payload<'a> {
        members.clear();
        if scan(json.as_bytes(), members).is_none() {
            members.clear();
        }
        Payload { json, members }
    }

    fn at(&self, r: (u32, u32)) -> &'a str {
        &self.json[r.0 as usize..r.1 as usize]
    }

    pub(crate) fn raw(&self, key: &str) -> Option<Raw<'a>> {
        self.members
            .iter()
            .find(|m| !m.key_escaped && self.at(m.key) == key)
            .map(|m| self.at(m.value))
    }

    /// A string member ("" when absent or not a string).
    pub(crate) fn str(&self, key: &str) -> Cow<'a, str> {
        self.str_opt(key).unwrap_or(Cow::Borrowed(""))
    }

    pub(crate) fn str_opt(&self, key: &str) -> Option<Cow<'a, str>> {
        let raw = self.raw(key)?;
        if raw.starts_with('"') {
            decode_str(raw)
        } else {
            None
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Option<bool> {
        match self.raw(key)? {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    pub(crate) fn int(&self, key: &str) -> Option<i64> {
        self.raw(key)?.parse().ok()
    }

    /// Every member: the key decoded, the value raw.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Cow<'a, str>, Raw<'a>)> + '_ {
        self.members.iter().map(|m| {
            let key = if m.key_escaped {
                let (a, b) = m.key;
                // With its quotes, for the decoder.
                decode_str(&self.json[a as usize - 1..b as usize + 1]).unwrap_or_default()
            } else {
                Cow::Borrowed(self.at(m.key))
            };
            (key, self.at(m.value))
        })
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\t' | b'\r') {
        i += 1;
    }
    i
}

/// The end (past the closing quote) of the string starting at `i`, and whether it has escapes.
fn string_end(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut j = i + 1;
    let mut escaped = false;
    while j < b.len() {
        match b[j] {
            b'"' => return Some((j + 1, escaped)),
            b'\\' => {
                escaped = true;
                j += 2;
            }
            _ => j += 1,
        }
    }
    None
}

/// The end of the value starting at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i).map(|(e, _)| e),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?.0;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

fn scan(b: &[u8], members: &mut Vec<Member>) -> Option<()> {
    let mut i = skip_ws(b, 0);
    if *b.get(i)? != b'{' {
        return None;
    }
    i = skip_ws(b, i + 1);
    if *b.get(i)? == b'}' {
        return Some(());
    }
    loop {
        if *b.get(i)? != b'"' {
            return None;
        }
        let (key_end, key_escaped) = string_end(b, i)?;
        let key = (i as u32 + 1, key_end as u32 - 1);
        i = skip_ws(b, key_end);
        if *b.get(i)? != b':' {
            return None;
        }
        i = skip_ws(b, i + 1);
        let end = value_end(b, i)?;
        members.push(Member {
            key,
            key_escaped,
            value: (i as u32, end as u32),
        });
        i = skip_ws(b, end);
        match *b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some(()),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_borrowed_and_decoded_on_demand() {
        let mut m = Vec::new();
        let p = Payload::parse(
            r#"{"tool":"sh\"ell","success":false,"n":42,"args":{"a":[1,"]}"]},"x\"y":-1.5e3}"#,
            &mut m,
        );
        assert_eq!(p.str("tool"), "sh\"ell");
        assert_eq!(p.bool("success"), Some(false));
        assert_eq!(p.int("n"), Some(42));
        assert_eq!(p.str("n"), "");
        assert_eq!(raw_text(p.raw("args").unwrap()), r#"{"a":[1,"]}"]}"#);
        let all: Vec<_> = p.iter().collect();
        assert_eq!(all.len(), 5);
        assert_eq!(all[4], (Cow::Borrowed("x\"y"), "-1.5e3"));
        let mut m = Vec::new();
        assert_eq!(Payload::parse("[1]", &mut m).iter().count(), 0);
        let mut m = Vec::new();
        assert_eq!(Payload::parse("{}", &mut m).iter().count(), 0);
        let mut m = Vec::new();
        assert_eq!(Payload::parse(r#"{"a":1,"b"#, &mut m).iter().count(), 0);
    }

    #[test]
    fn what_serde_json_reads_the_scanner_reads() {
        let json = r#" { "a" : "x" , "b":[ {"c":"}"} ], "d":null,"e":true, "f":"\u00e9\n" } "#;
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json).unwrap();
        let mut m = Vec::new();
        let p = Payload::parse(json, &mut m);
        let got: Vec<_> = p.iter().map(|(k, _)| k.into_owned()).collect();
        let want: Vec<_> = v.keys().cloned().collect();
        assert_eq!(got, want);
        for (k, raw) in p.iter() {
            let parsed: serde_json::Value = serde_json::from_str(raw).unwrap();
            assert_eq!(&parsed, &v[k.as_ref()], "{k}");
        }
        assert_eq!(p.str("f"), "é\n");
    }
}
