//! A small, strict JSON reader that remembers where every value and key starts.
//!
//! serde_json knows lines and columns only for its own syntax errors; a validator needs the
//! position of every value it may complain about (`hooks.tool_call[0].command` at 4:20), and
//! needs to see duplicate keys, which serde_json's maps merge silently. So hooks.json is read
//! into this tree: strict RFC 8259 (the same texts serde_json's `Value` parser accepts, which
//! the `hooks_json` fuzz target checks, plus a leading UTF-8 byte order mark), with byte offsets
//! that [`super::error`] turns into `LINE:COL`.
//!
//! Syntax errors stop the reader (nothing after them can be trusted) and carry the path being
//! read; duplicate keys do not stop it: they are collected and the first occurrence is kept.

use super::error::{Path, Seg};
use std::collections::HashMap;

/// Containers nested deeper than this are refused (serde_json's default limit, too).
pub(crate) const MAX_DEPTH: usize = 127;

/// Objects with at least this many members get a hash index of their keys for the duplicate
/// check (below it a scan is cheaper); the parse stays linear in the size of the text.
const INDEX_FROM: usize = 16;

/// A JSON value and the byte offset where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub pos: usize,
    pub val: Val,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Bool(bool),
    /// The number exactly as written (RFC 8259 grammar, already checked).
    Num(String),
    Str(String),
    Arr(Vec<Node>),
    /// Members in written order; a duplicate key is reported and only its first use kept.
    Obj(Vec<Member>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub key: String,
    pub key_pos: usize,
    pub value: Node,
}

impl Val {
    /// The JSON type, as error messages name it ("expected a string, found number").
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Val::Null => "null",
            Val::Bool(_) => "boolean",
            Val::Num(_) => "number",
            Val::Str(_) => "string",
            Val::Arr(_) => "array",
            Val::Obj(_) => "object",
        }
    }
}

/// A problem found while reading, at a byte offset, under a path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawError {
    pub pos: usize,
    pub path: Path,
    pub reason: String,
    /// Another position the reason refers to ("first written at LINE:COL").
    pub first: Option<usize>,
}

/// What [`parse`] found: the tree (unless the syntax was wrong) and every duplicate key.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub root: Result<Node, RawError>,
    pub duplicates: Vec<RawError>,
}

/// Reads one JSON text. `text` must already be valid UTF-8 (offsets index into it).
pub(crate) fn parse(text: &str) -> Parsed {
    let mut p = Parser {
        src: text.as_bytes(),
        i: 0,
        path: Path::root(),
        duplicates: Vec::new(),
    };
    let root = p.document();
    Parsed {
        root,
        duplicates: p.duplicates,
    }
}

struct Parser<'a> {
    src: &'a [u8],
    i: usize,
    path: Path,
    duplicates: Vec<RawError>,
}

type R<T> = Result<T, RawError>;

impl Parser<'_> {
    fn err<T>(&self, pos: usize, reason: impl Into<String>) -> R<T> {
        Err(RawError {
            pos,
            path: self.path.clone(),
            reason: reason.into(),
            first: None,
        })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// What the reader found where it expected something else, for messages.
    fn found(&self) -> String {
        let rest = &self.src[self.i.min(self.src.len())..];
        // The reader only stops on char boundaries, so `rest` is valid UTF-8.
        match std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.chars().next())
        {
            None => "the end of the file".to_string(),
            Some(c) if c.is_control() => format!("{}", c.escape_debug()),
            Some(c) => format!("'{c}'"),
        }
    }

    fn document(&mut self) -> R<Node> {
        self.skip_ws();
        let node = self.value(0)?;
        self.skip_ws();
        if self.i < self.src.len() {
            let msg = format!(
                "unexpected {} after the end of the JSON value",
                self.found()
            );
            self.path.clear();
            return self.err(self.i, msg);
        }
        Ok(node)
    }

    fn value(&mut self, depth: usize) -> R<Node> {
        let pos = self.i;
        let val = match self.peek() {
            None => return self.err(pos, "unexpected end of the file; expected a value"),
            Some(b'{') => self.object(depth + 1)?,
            Some(b'[') => self.array(depth + 1)?,
            Some(b'"') => Val::Str(self.string()?),
            Some(b't') => self.literal("true", Val::Bool(true))?,
            Some(b'f') => self.literal("false", Val::Bool(false))?,
            Some(b'n') => self.literal("null", Val::Null)?,
            Some(b'-' | b'0'..=b'9') => Val::Num(self.number()?),
            Some(b'/') => return self.err(pos, "JSON has no comments"),
            Some(b'\'') => return self.err(pos, "strings take double quotes in JSON"),
            Some(_) => {
                let msg = format!("expected a value, found {}", self.found());
                return self.err(pos, msg);
            }
        };
        Ok(Node { pos, val })
    }

    fn literal(&mut self, word: &str, val: Val) -> R<Val> {
        if self.src[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(val)
        } else {
            let msg = format!("expected a value (such as {word}), found {}", self.found());
            self.err(self.i, msg)
        }
    }

    fn object(&mut self, depth: usize) -> R<Val> {
        if depth > MAX_DEPTH {
            return self.err(
                self.i,
                format!("nested too deeply (more than {MAX_DEPTH} levels)"),
            );
        }
        self.i += 1; // {
        let mut members: Vec<Member> = Vec::new();
        let mut index: Option<HashMap<String, usize>> = None;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Val::Obj(members));
        }
        loop {
            self.skip_ws();
            let key_pos = self.i;
            match self.peek() {
                Some(b'"') => {}
                Some(b'}') if !members.is_empty() => {
                    return self.err(key_pos, "trailing comma before '}' is not allowed in JSON");
                }
                Some(b'/') => return self.err(key_pos, "JSON has no comments"),
                _ => {
                    let msg = format!("expected a key in double quotes, found {}", self.found());
                    return self.err(key_pos, msg);
                }
            }
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                let msg = format!("expected ':' after the key, found {}", self.found());
                return self.err(self.i, msg);
            }
            self.i += 1;
            self.skip_ws();
            self.path.push(Seg::Key(key));
            let value = self.value(depth)?;
            let Some(Seg::Key(key)) = self.path.pop_seg() else {
                unreachable!("the key pushed above")
            };
            let first = match &index {
                Some(index) => index.get(key.as_str()).copied(),
                None => members.iter().find(|m| m.key == key).map(|m| m.key_pos),
            };
            if let Some(first) = first {
                let mut path = self.path.clone();
                path.push(Seg::Key(key));
                self.duplicates.push(RawError {
                    pos: key_pos,
                    path,
                    reason: "duplicate key".to_string(),
                    first: Some(first),
                });
            } else {
                // Small objects are scanned; from INDEX_FROM members on, a hash index keeps
                // the duplicate check O(1) per key (a 256 KiB object has ~20 k members).
                if let Some(index) = &mut index {
                    index.insert(key.clone(), key_pos);
                } else if members.len() + 1 >= INDEX_FROM {
                    let mut built: HashMap<String, usize> =
                        HashMap::with_capacity(members.len() * 2 + 1);
                    for m in &members {
                        built.insert(m.key.clone(), m.key_pos);
                    }
                    built.insert(key.clone(), key_pos);
                    index = Some(built);
                }
                members.push(Member {
                    key,
                    key_pos,
                    value,
                });
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(Val::Obj(members));
                }
                Some(b'/') => return self.err(self.i, "JSON has no comments"),
                _ => {
                    let msg = format!(
                        "expected ',' or '}}' after a member, found {}",
                        self.found()
                    );
                    return self.err(self.i, msg);
                }
            }
        }
    }

    fn array(&mut self, depth: usize) -> R<Val> {
        if depth > MAX_DEPTH {
            return self.err(
                self.i,
                format!("nested too deeply (more than {MAX_DEPTH} levels)"),
            );
        }
        self.i += 1; // [
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(Val::Arr(items));
        }
        loop {
            self.skip_ws();
            if self.peek() == Some(b']') && !items.is_empty() {
                return self.err(self.i, "trailing comma before ']' is not allowed in JSON");
            }
            self.path.push(Seg::Index(items.len()));
            let item = self.value(depth)?;
            self.path.pop();
            items.push(item);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(Val::Arr(items));
                }
                Some(b'/') => return self.err(self.i, "JSON has no comments"),
                _ => {
                    let msg = format!(
                        "expected ',' or ']' after an element, found {}",
                        self.found()
                    );
                    return self.err(self.i, msg);
                }
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> R<String> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.err(start, "numbers may not have leading zeros in JSON");
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.err(start, "invalid number"),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return self.err(start, "invalid number: expected digits after '.'");
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return self.err(start, "invalid number: expected digits in the exponent");
            }
        }
        // The grammar above only accepts ASCII, so this slice is on char boundaries.
        Ok(String::from_utf8_lossy(&self.src[start..self.i]).into_owned())
    }

    fn string(&mut self) -> R<String> {
        let start = self.i;
        self.i += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the run of plain bytes at once (the text is valid UTF-8, and the bytes we
            // stop at are ASCII, so the run ends on a char boundary).
            let run = self.i;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.src[run..self.i]).unwrap_or_default());
            match self.peek() {
                None => return self.err(start, "unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let esc = self.i;
                    self.i += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.i += 1;
                            let hi = self.hex4(esc)?;
                            let c = match hi {
                                0xD800..=0xDBFF => {
                                    if self.src[self.i..].starts_with(b"\\u") {
                                        let esc2 = self.i;
                                        self.i += 2;
                                        let lo = self.hex4(esc2)?;
                                        if !(0xDC00..=0xDFFF).contains(&lo) {
                                            return self.err(
                                                esc,
                                                "lone leading surrogate in a \\u escape",
                                            );
                                        }
                                        let cp = 0x10000
                                            + ((hi as u32 - 0xD800) << 10)
                                            + (lo as u32 - 0xDC00);
                                        char::from_u32(cp)
                                    } else {
                                        return self
                                            .err(esc, "lone leading surrogate in a \\u escape");
                                    }
                                }
                                0xDC00..=0xDFFF => {
                                    return self
                                        .err(esc, "lone trailing surrogate in a \\u escape");
                                }
                                _ => char::from_u32(hi as u32),
                            };
                            match c {
                                Some(c) => out.push(c),
                                None => return self.err(esc, "invalid \\u escape"),
                            }
                            continue;
                        }
                        _ => {
                            let msg = format!(
                                "invalid escape '\\{}' in a string",
                                self.found().trim_matches('\'')
                            );
                            return self.err(esc, msg);
                        }
                    };
                    self.i += 1;
                    out.push(c);
                }
                Some(b) => {
                    return self.err(
                        self.i,
                        format!(
                            "control character U+{b:04X} in a string must be escaped (\\u{b:04X})"
                        ),
                    );
                }
            }
        }
    }

    /// Four hex digits after `\u` (the escape started at `esc`).
    fn hex4(&mut self, esc: usize) -> R<u16> {
        let digits = self.src.get(self.i..self.i + 4);
        let value = digits
            .filter(|d| d.iter().all(u8::is_ascii_hexdigit))
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u16::from_str_radix(d, 16).ok());
        match value {
            Some(v) => {
                self.i += 4;
                Ok(v)
            }
            None => self.err(esc, "invalid \\u escape: expected four hex digits"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Node {
        let p = parse(s);
        assert!(p.duplicates.is_empty(), "{s}: {:?}", p.duplicates);
        p.root.unwrap_or_else(|e| panic!("{s}: {e:?}"))
    }

    fn bad(s: &str) -> RawError {
        parse(s).root.expect_err(s)
    }

    #[test]
    fn reads_values_with_positions() {
        let n = ok(r#" {"a": [1, "x\u00e9\ud83d\ude00", true, null], "b": {}}"#);
        let Val::Obj(m) = n.val else { panic!() };
        assert_eq!(n.pos, 1);
        assert_eq!(
            (m[0].key.as_str(), m[0].key_pos, m[0].value.pos),
            ("a", 2, 7)
        );
        let Val::Arr(items) = &m[0].value.val else {
            panic!()
        };
        assert_eq!(items[1].val, Val::Str("xé😀".into()));
        assert_eq!(items[1].pos, 11);
        assert_eq!(items[0].val, Val::Num("1".into()));
    }

    #[test]
    fn reports_duplicates_and_keeps_the_first() {
        let p = parse(r#"{"a": 1, "b": {"c": 1, "c": 2}, "a": 3}"#);
        let Val::Obj(m) = p.root.unwrap().val else {
            panic!()
        };
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].value.val, Val::Num("1".into()));
        assert_eq!(p.duplicates.len(), 2);
        assert_eq!(p.duplicates[0].path.to_string(), "b.c");
        assert_eq!(p.duplicates[1].path.to_string(), "a");
    }

    #[test]
    fn rejects_what_rfc_8259_rejects() {
        for s in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            "1e",
            "-",
            "+1",
            "'a'",
            "tru",
            "nul",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"a\nb\"",
            "{\"a\" 1}",
            "{a:1}",
            "[1 2]",
            "1 2",
            "// c\n{}",
            "\"abc",
        ] {
            let _ = bad(s);
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&deep(127)).root.is_ok());
        assert!(parse(&deep(128)).root.is_err());
    }

    #[test]
    fn syntax_errors_carry_the_path() {
        let e = bad(r#"{"hooks": {"tool_call": [{"command": "x",}]}}"#);
        assert_eq!(e.path.to_string(), "hooks.tool_call[0]");
        assert!(e.reason.contains("trailing comma"), "{}", e.reason);
        assert_eq!(e.pos, 41);
    }
}
