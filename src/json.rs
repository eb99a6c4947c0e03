//! JSON for the hot path: string literals for payloads, and the validator that embeds the JSON
//! text agents hand us.
//!
//! * [`write_str`]: a JSON string literal, escaped per RFC 8259 — `"` and `\` escaped, control
//!   characters as `\n`-style or `\u00XX` escapes, everything else (non-ASCII included) copied as
//!   UTF-8, which JSON allows. Strings of [`SIMD_MIN`] bytes or more are written by simd-json's
//!   SIMD escaper (32 bytes per step with AVX2), shorter ones by our word-at-a-time scan, which
//!   costs less per call: measured in `benches/serialize.rs` (`strings/`): simd-json is 2× slower
//!   at 16 bytes, even at 32, and 2.5× / 3.3× / 5.8× faster at 256 B / 4 KiB / 64 KiB of plain
//!   text. Both produce the same bytes, which are serde_json's.
//! * [`append_compact`]: a strict validator that copies a JSON text without its insignificant
//!   whitespace. Two parts of a payload are JSON *text* that must reach hooks byte-exact —
//!   `tool_call_start.arguments` and extra fields ([`crate::Extras`]) — and no serializer
//!   embeds text it has not parsed. Strict means RFC 8259 to the letter, including paired UTF-16 surrogates in `\u`
//!   escapes — serde_json's "ignore" path accepts a lone `\ud800`, which a strict reader of our
//!   payload would then reject. Whitespace is dropped so that an embedded object never puts a
//!   newline into an NDJSON line or an environment variable.

/// Nesting deeper than this is rejected. serde_json's default recursion limit accepts exactly
/// this much, so whatever we embed, serde_json can read back.
pub const MAX_DEPTH: u32 = 127;

/// For each byte: 0 = copy as is; otherwise the character after the backslash (`u` = `\u00XX`).
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Strings at least this long are escaped by simd-json (module docs).
pub const SIMD_MIN: usize = 32;

/// Appends `s` as a JSON string literal (quotes included).
#[inline]
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    if s.len() >= SIMD_MIN {
        // Writing into a Vec cannot fail.
        let _ = simd_json::prelude::BaseGenerator::write_string(&mut SimdOut(out), s);
    } else {
        write_str_short(out, s);
    }
}

/// simd-json's string writer, writing into our buffer.
struct SimdOut<'a>(&'a mut Vec<u8>);

impl simd_json::prelude::BaseGenerator for SimdOut<'_> {
    type T = Vec<u8>;
    fn get_writer(&mut self) -> &mut Vec<u8> {
        self.0
    }
    fn write_min(&mut self, _: &[u8], min: u8) -> std::io::Result<()> {
        self.0.push(min);
        Ok(())
    }
}

/// The word-at-a-time escaper, for strings shorter than [`SIMD_MIN`].
#[inline]
fn write_str_short(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut i = 0;
    loop {
        let j = next_special(bytes, i);
        out.extend_from_slice(&bytes[i..j]);
        let Some(&b) = bytes.get(j) else { break };
        write_escape(out, b, ESCAPE[b as usize]);
        i = j + 1;
    }
    out.push(b'"');
}

fn write_escape(out: &mut Vec<u8>, b: u8, esc: u8) {
    if esc == b'u' {
        out.extend_from_slice(b"\\u00");
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 0xf) as usize]);
    } else {
        out.extend_from_slice(&[b'\\', esc]);
    }
}

/// The index of the first byte at or after `from` that a JSON string must escape (below 0x20,
/// `"` or `\`), or `bytes.len()`. Eight bytes at a time: [`specials8`] flags them, and its
/// lowest flag is exact, so the scan jumps straight to it.
#[inline]
fn next_special(bytes: &[u8], mut from: usize) -> usize {
    while let Some(word) = bytes.get(from..from + 8) {
        let flags = specials8(u64::from_le_bytes(word.try_into().unwrap_or([0; 8])));
        if flags != 0 {
            return from + (flags.trailing_zeros() / 8) as usize;
        }
        from += 8;
    }
    while from < bytes.len() && ESCAPE[bytes[from] as usize] == 0 {
        from += 1;
    }
    from
}

/// The high bit of each byte of `w` (little-endian) that is below 0x20, `"` or `\`. These are
/// the classic "has a byte less than n" / "has a zero byte" tricks: a flag can be spurious only
/// above a genuine one (borrows run upwards), so the lowest flag is always exact.
#[inline]
fn specials8(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    control | has_zero(w ^ (ONES * b'"' as u64)) | has_zero(w ^ (ONES * b'\\' as u64))
}

/// Appends an unsigned integer in decimal.
#[inline]
pub fn write_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends `true` or `false`.
#[inline]
pub fn write_bool(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

/// What [`append_compact`] accepts at the top level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Top {
    /// Only a JSON object (`tool_call_start.arguments`).
    Object,
    /// Any JSON value (custom bus payloads).
    Any,
}

/// If `src` is one valid JSON text of the `top` kind, nested at most `MAX_DEPTH` (127) deep,
/// appends it to `out` without insignificant whitespace and returns `true`; otherwise leaves
/// `out` exactly as it was and returns `false`.
pub fn append_compact(out: &mut Vec<u8>, src: &[u8], top: Top) -> bool {
    append_compact_within(out, src, top, MAX_DEPTH)
}

/// [`append_compact`] with a tighter nesting limit, for text that will itself be embedded:
/// each enclosing object costs one level of serde_json's budget.
pub fn append_compact_within(out: &mut Vec<u8>, src: &[u8], top: Top, max_depth: u32) -> bool {
    let start = out.len();
    let ok = run(src, top, max_depth, Some(out), None).is_ok();
    if !ok {
        out.truncate(start);
    }
    ok
}

/// Why [`check_object`] refused a text: the byte offset where reading stopped, and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub at: usize,
    pub reason: String,
}

/// Checks that `src` is one JSON object by the same strict rules, nested at most `max_depth`
/// deep, and hands each of its top-level keys (unescaped) to `key`, which may refuse it. Copies
/// nothing and allocates nothing unless a key has an escape in it.
pub fn check_object(
    src: &[u8],
    max_depth: u32,
    key: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<(), Refused> {
    run(src, Top::Object, max_depth, None, Some(key))
}

/// Checks that `src` is one JSON value (any kind) by the same strict rules, nested at most
/// `max_depth` deep. Copies and allocates nothing.
pub fn check_value(src: &[u8], max_depth: u32) -> Result<(), Refused> {
    run(src, Top::Any, max_depth, None, None)
}

/// The visitor of an object's top-level keys ([`check_object`]).
type KeyVisitor<'k> = &'k mut (dyn FnMut(&str) -> Result<(), String> + 'k);

fn run<'a, 'k>(
    src: &'a [u8],
    top: Top,
    max_depth: u32,
    out: Option<&'a mut Vec<u8>>,
    keys: Option<KeyVisitor<'k>>,
) -> Result<(), Refused> {
    // Checking UTF-8 once up front (std's validator is fast on ASCII) lets the string scanner
    // skip eight plain bytes at a time instead of decoding characters.
    if let Err(e) = std::str::from_utf8(src) {
        return Err(Refused {
            at: e.valid_up_to(),
            reason: "not UTF-8".into(),
        });
    }
    let mut cx = Compactor {
        src,
        i: 0,
        out,
        max_depth,
        copied: 0,
        keys,
        refused: None,
    };
    cx.skip_ws();
    let ok = match (top, cx.peek()) {
        (Top::Object, Some(b'{')) | (Top::Any, Some(_)) => {
            cx.value(0) && {
                cx.skip_ws();
                cx.i == src.len() || cx.fail("more text after the JSON value")
            }
        }
        (Top::Object, Some(_)) => cx.fail("expected a JSON object"),
        (_, None) => cx.fail("empty"),
    };
    if !ok {
        let at = cx.i.min(src.len());
        let reason = cx
            .refused
            .take()
            .unwrap_or_else(|| "invalid JSON".to_string());
        return Err(Refused { at, reason });
    }
    if let Some(out) = cx.out {
        out.extend_from_slice(&src[cx.copied..]);
    }
    Ok(())
}

/// Whether `src` is one valid JSON text (any value), by the same strict rules.
#[cfg(test)]
pub fn is_valid(src: &[u8]) -> bool {
    let mut scratch = Vec::new();
    append_compact(&mut scratch, src, Top::Any)
}

/// Validates by recursive descent. Output is produced by copying the input between whitespace
/// runs: `src[copied..]` is what has not been copied yet, and only skipping whitespace flushes,
/// so already-compact input is copied with one `memcpy` at the end.
struct Compactor<'a, 'k> {
    src: &'a [u8],
    i: usize,
    /// Where the compact copy goes; `None` only checks.
    out: Option<&'a mut Vec<u8>>,
    max_depth: u32,
    copied: usize,
    /// Gets each top-level key of the object ([`check_object`]).
    keys: Option<KeyVisitor<'k>>,
    /// Why reading stopped, when something more precise than "invalid JSON" is known.
    refused: Option<String>,
}

impl Compactor<'_, '_> {
    fn peek(&self) -> Option<u8> {
        self.src.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        let from = self.i;
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
        if self.i > from {
            if let Some(out) = self.out.as_deref_mut() {
                out.extend_from_slice(&self.src[self.copied..from]);
            }
            self.copied = self.i;
        }
    }

    /// Records why reading stops here; always `false`, to return directly.
    fn fail(&mut self, reason: &str) -> bool {
        self.refused.get_or_insert_with(|| reason.to_string());
        false
    }

    /// Hands the key `src[start..end]` (quotes included) to the key visitor.
    fn visit_key(&mut self, start: usize, end: usize) -> bool {
        let Some(visit) = self.keys.as_deref_mut() else {
            return true;
        };
        let raw = &self.src[start + 1..end - 1];
        let verdict = if raw.contains(&b'\\') {
            // Rare: decode the escapes (already validated) to compare what the key means.
            let key: String = serde_json::from_slice(&self.src[start..end]).unwrap_or_default();
            visit(&key)
        } else {
            // The whole input is UTF-8 and the quotes around the key are ASCII.
            visit(std::str::from_utf8(raw).unwrap_or_default())
        };
        match verdict {
            Ok(()) => true,
            Err(reason) => {
                self.i = start;
                self.fail(&reason)
            }
        }
    }

    /// Consumes `b` if it is next.
    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.i += hit as usize;
        hit
    }

    fn value(&mut self, depth: u32) -> bool {
        self.skip_ws();
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => false,
        }
    }

    fn object(&mut self, depth: u32) -> bool {
        if depth > self.max_depth {
            return self.fail("nested too deep");
        }
        self.eat(b'{');
        self.skip_ws();
        if self.eat(b'}') {
            return true;
        }
        loop {
            self.skip_ws();
            let start = self.i;
            if self.peek() != Some(b'"') || !self.string() {
                return self.fail("expected a string key");
            }
            if depth == 1 && !self.visit_key(start, self.i) {
                return false;
            }
            self.skip_ws();
            if !self.eat(b':') || !self.value(depth) {
                return false;
            }
            self.skip_ws();
            if self.eat(b'}') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    fn array(&mut self, depth: u32) -> bool {
        if depth > self.max_depth {
            return self.fail("nested too deep");
        }
        self.eat(b'[');
        self.skip_ws();
        if self.eat(b']') {
            return true;
        }
        loop {
            if !self.value(depth) {
                return false;
            }
            self.skip_ws();
            if self.eat(b']') {
                return true;
            }
            if !self.eat(b',') {
                return false;
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.src[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> bool {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return false,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return false;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return false;
            }
        }
        true
    }

    /// A string literal, copied verbatim once validated. The whole input is known to be UTF-8,
    /// so only quotes, backslashes and control characters matter ([`next_special`]).
    fn string(&mut self) -> bool {
        self.i += 1; // opening quote
        loop {
            self.i = next_special(self.src, self.i);
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return true;
                }
                Some(b'\\') => {
                    if !self.escape() {
                        return false;
                    }
                }
                _ => return false, // a control character, or the end of the input
            }
        }
    }

    /// After a backslash: one of `"\/bfnrt`, or `u` with 4 hex digits where a high surrogate
    /// must be followed by `\u` and a low one, and a low one may not stand alone.
    fn escape(&mut self) -> bool {
        self.i += 1;
        match self.peek() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                self.i += 1;
                true
            }
            Some(b'u') => {
                self.i += 1;
                match self.hex4() {
                    Some(0xD800..=0xDBFF) => {
                        if self.src[self.i..].starts_with(b"\\u") {
                            self.i += 2;
                            matches!(self.hex4(), Some(0xDC00..=0xDFFF))
                        } else {
                            false
                        }
                    }
                    Some(0xDC00..=0xDFFF) | None => false,
                    Some(_) => true,
                }
            }
            _ => false,
        }
    }

    fn hex4(&mut self) -> Option<u16> {
        let digits = self.src.get(self.i..self.i + 4)?;
        let mut v = 0u16;
        for &d in digits {
            v = v << 4 | (d as char).to_digit(16)? as u16;
        }
        self.i += 4;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact(s: &str, top: Top) -> Option<String> {
        let mut out = b"prefix".to_vec();
        let ok = append_compact(&mut out, s.as_bytes(), top);
        if !ok {
            assert_eq!(
                out, b"prefix",
                "a rejected input must leave the buffer as it was"
            );
            return None;
        }
        Some(String::from_utf8(out[6..].to_vec()).unwrap())
    }

    #[test]
    fn escapes_every_control_character_and_round_trips() {
        let all: String = (0u8..0x80).map(char::from).chain("é中😀".chars()).collect();
        let mut out = Vec::new();
        write_str(&mut out, &all);
        // Both escapers, every length across the threshold: the same bytes as serde_json.
        for len in 0..all.len() {
            let s: String = all.chars().take(len).collect();
            let (mut short, mut long) = (Vec::new(), Vec::new());
            write_str_short(&mut short, &s);
            let _ = simd_json::prelude::BaseGenerator::write_string(&mut SimdOut(&mut long), &s);
            assert_eq!(short, serde_json::to_vec(&s).unwrap());
            assert_eq!(long, short);
        }
        let text = std::str::from_utf8(&out).unwrap();
        assert!(
            text.bytes().all(|b| b >= 0x20),
            "raw control byte in {text:?}"
        );
        assert_eq!(serde_json::from_str::<String>(text).unwrap(), all);
        assert!(text.contains(r#"\""#) && text.contains(r"\\") && text.contains(r"\u001f"));
        assert!(text.contains(r"\n") && text.contains(r"\t") && text.contains("中😀"));
    }

    #[test]
    fn the_word_scan_finds_the_first_special_byte_exactly() {
        let bytes = [0u8, 0x1f, b'"', b'\\', 0x20, b'!', 0x7f, 0x80, 0xff, b'a'];
        // Every placement of two bytes from the list in a word of filler, also filler that
        // could provoke borrows (0x00 below a 0x20, 0x80 high bits).
        for filler in [b'a', 0x80, 0xff, 0x21] {
            for &x in &bytes {
                for &y in &bytes {
                    for px in 0..8 {
                        for py in 0..8 {
                            let mut w = [filler; 8];
                            w[px] = x;
                            w[py] = y;
                            let want = w.iter().position(|&b| ESCAPE[b as usize] != 0).unwrap_or(8);
                            assert_eq!(next_special(&w, 0), want, "{w:x?}");
                        }
                    }
                }
            }
        }
        // Every string length around the word boundary, with the special byte anywhere: the
        // scanner must stop at the escaped quote, not before or after it.
        for len in 0..20 {
            for pos in 0..len {
                let mut s = "x".repeat(len);
                s.replace_range(pos..pos + 1, "\"");
                let literal = serde_json::to_string(&s).unwrap();
                assert_eq!(compact(&literal, Top::Any).as_deref(), Some(&*literal));
            }
        }
    }

    #[test]
    fn compacts_objects_and_keeps_strings_intact() {
        let src = "  {\n \"a\" : [1, -2.5e+3, true, null],\t\"b\": {\"c d\": \"x \\\" y\"} }\n";
        assert_eq!(
            compact(src, Top::Object).unwrap(),
            r#"{"a":[1,-2.5e+3,true,null],"b":{"c d":"x \" y"}}"#
        );
        assert_eq!(compact("{}", Top::Object).unwrap(), "{}");
        assert_eq!(compact("[1]", Top::Any).unwrap(), "[1]");
        assert_eq!(compact("\"s\"", Top::Any).unwrap(), "\"s\"");
    }

    #[test]
    fn rejects_what_rfc_8259_rejects() {
        for bad in [
            "",
            "[]",
            "\"x\"",
            "1",
            "{",
            "{]",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{a:1}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":.5}",
            "{\"a\":1e}",
            "{\"a\":-}",
            "{\"a\":tru}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\ud800\"}",
            "{\"a\":\"\\udc00\"}",
            "{\"a\":\"\\ud800\\u0041\"}",
            "{\"a\":\"\u{1}\"}",
            "{} {}",
            "{}x",
            "{\"a\":NaN}",
            "{\"a\":\"\\u12\"}",
        ] {
            assert_eq!(compact(bad, Top::Object), None, "accepted {bad:?}");
        }
        assert!(compact("{\"a\":\"\\ud83d\\ude00\"}", Top::Object).is_some());
    }

    #[test]
    fn check_object_visits_top_level_keys_unescaped_and_says_where_it_stopped() {
        let mut keys = Vec::new();
        let mut visit = |k: &str| {
            keys.push(k.to_string());
            if k == "stop" {
                Err("no stop".to_string())
            } else {
                Ok(())
            }
        };
        let src = br#" {"a": {"nested": 1}, "t\u006fol": [1], "b": "x"} "#;
        assert_eq!(check_object(src, MAX_DEPTH, &mut visit), Ok(()));
        assert_eq!(
            keys,
            ["a", "tool", "b"],
            "nested keys are not visited; escapes decoded"
        );
        let refused = check_object(br#"{"ok":1,"stop":2}"#, MAX_DEPTH, &mut |k: &str| {
            if k == "stop" {
                Err("no stop".into())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!((refused.at, refused.reason.as_str()), (8, "no stop"));
        let err = |src: &[u8]| check_object(src, MAX_DEPTH, &mut |_: &str| Ok(())).unwrap_err();
        assert_eq!(err(b"[1]").reason, "expected a JSON object");
        assert_eq!(err(b"").reason, "empty");
        assert_eq!(err(b"{} x").reason, "more text after the JSON value");
        assert_eq!(err(b"{1:2}").reason, "expected a string key");
        assert_eq!(err(b"{\"a\":\"\xff\"}").reason, "not UTF-8");
        assert_eq!(err(b"{\"a\":\"\xff\"}").at, 6);
        assert_eq!(err(br#"{"a":tru}"#).reason, "invalid JSON");
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(3), "]".repeat(3));
        assert_eq!(
            check_object(deep.as_bytes(), 3, &mut |_: &str| Ok(()))
                .unwrap_err()
                .reason,
            "nested too deep"
        );
    }

    #[test]
    fn rejects_invalid_utf8_and_excess_depth() {
        let mut out = Vec::new();
        assert!(!append_compact(&mut out, b"{\"a\":\"\xff\"}", Top::Object));
        assert!(!append_compact(
            &mut out,
            b"{\"a\":\"\xe2\x82\"}",
            Top::Object
        ));
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(is_valid(deep(MAX_DEPTH as usize).as_bytes()));
        assert!(!is_valid(deep(MAX_DEPTH as usize + 1).as_bytes()));
        let serde_reads = |n| serde_json::from_str::<serde_json::Value>(&deep(n)).is_ok();
        assert!(serde_reads(MAX_DEPTH as usize) && !serde_reads(MAX_DEPTH as usize + 1));
    }
}
