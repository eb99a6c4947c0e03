//! A JSON reader that keeps every value's byte span, and text edits at those spans.
//!
//! `connect` changes an agent's settings file where its own entries go and leaves every other
//! byte.
//!
//! [`parse`] reads strict JSON (RFC 8259), and `//` and `/* */` comments as whitespace when
//! asked (Gemini CLI strips them from its settings). It never panics: every failure is a
//! [`ParseError`] at a line and column, nesting is bounded by [`MAX_DEPTH`]. The edits
//! ([`insert_member`], [`push_item`], [`remove_member`], [`remove_item`], [`replace`]) return
//! a new text; new values are laid out like their neighbours ([`Style`]).

use std::fmt::Write as _;

/// Deepest nesting read (settings files are shallow; this bounds the recursion).
pub(super) const MAX_DEPTH: usize = 128;

/// A value and where it is: `text[start..end]`.
#[derive(Debug)]
pub(super) struct Node {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

#[derive(Debug)]
pub(super) enum Kind {
    Object(Vec<Member>),
    Array(Vec<Node>),
    /// The decoded text (a lone surrogate escape decodes to U+FFFD).
    String(String),
    Number,
    Bool,
    Null,
}

/// One `"key": value` of an object; the member's span is `key_start..value.end`.
#[derive(Debug)]
pub(super) struct Member {
    pub key: String,
    pub key_start: usize,
    /// Just after the key's closing quote.
    pub key_end: usize,
    pub value: Node,
}

impl Node {
    /// What it is, for messages: "an object", "an array", "a string"…
    pub(super) fn what(&self) -> &'static str {
        match self.kind {
            Kind::Object(_) => "an object",
            Kind::Array(_) => "an array",
            Kind::String(_) => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }

    pub(super) fn members(&self) -> Option<&[Member]> {
        match &self.kind {
            Kind::Object(m) => Some(m),
            _ => None,
        }
    }

    pub(super) fn items(&self) -> Option<&[Node]> {
        match &self.kind {
            Kind::Array(items) => Some(items),
            _ => None,
        }
    }

    pub(super) fn str(&self) -> Option<&str> {
        match &self.kind {
            Kind::String(s) => Some(s),
            _ => None,
        }
    }

    /// The member named `key`, and its index (the first one: see [`duplicate`]).
    pub(super) fn get(&self, key: &str) -> Option<(usize, &Member)> {
        self.members()?
            .iter()
            .enumerate()
            .find(|(_, m)| m.key == key)
    }
}

/// The second member named `key` in `obj`, if there is one (agents keep the last: an edit of
/// the first would not be what they read).
pub(super) fn duplicate<'a>(obj: &'a Node, key: &str) -> Option<&'a Member> {
    obj.members()?.iter().filter(|m| m.key == key).nth(1)
}

/// Why a text is not JSON, and where (1-based line and column, in characters).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ParseError {
    pub line: usize,
    pub column: usize,
    pub reason: String,
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    // Count characters, not bytes: a column an editor can jump to.
    let column = text
        .get(line_start..offset)
        .map_or(offset - line_start, |s| s.chars().count())
        + 1;
    (line, column)
}

/// Reads `text` as one JSON value (with `comments`, `//` and `/* */` count as whitespace).
///
/// # Examples
///
/// ```ignore
/// let root = parse(r#"{"a": [1, "x"]}"#, false).unwrap();
/// let (_, a) = root.get("a").unwrap();
/// assert_eq!((a.value.start, a.value.end), (6, 14));
/// ```
pub(super) fn parse(text: &str, comments: bool) -> Result<Node, ParseError> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        comments,
    };
    let node = p.value(0)?;
    p.skip_ws()?;
    if p.pos < p.bytes.len() {
        return Err(p.error_at(p.pos, "unexpected text after the JSON value"));
    }
    Ok(node)
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    comments: bool,
}

impl Parser<'_> {
    fn error_at(&self, offset: usize, reason: impl Into<String>) -> ParseError {
        let (line, column) = line_col(self.text, offset);
        ParseError {
            line,
            column,
            reason: reason.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) -> Result<(), ParseError> {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.pos += 1,
                Some(b'/') if self.comments => match self.bytes.get(self.pos + 1) {
                    Some(b'/') => {
                        while self.peek().is_some_and(|b| b != b'\n') {
                            self.pos += 1;
                        }
                    }
                    Some(b'*') => {
                        let start = self.pos;
                        self.pos += 2;
                        loop {
                            match self.peek() {
                                None => return Err(self.error_at(start, "unterminated comment")),
                                Some(b'*') if self.bytes.get(self.pos + 1) == Some(&b'/') => {
                                    self.pos += 2;
                                    break;
                                }
                                Some(_) => self.pos += 1,
                            }
                        }
                    }
                    _ => return Ok(()),
                },
                _ => return Ok(()),
            }
        }
    }

    fn unexpected(&self, wanted: &str) -> ParseError {
        match self.text.get(self.pos..).and_then(|s| s.chars().next()) {
            None => self.error_at(
                self.pos,
                format!("unexpected end of file, expected {wanted}"),
            ),
            Some('/') if !self.comments => self.error_at(
                self.pos,
                "a comment: JSON has none (this agent's settings must be plain JSON)",
            ),
            Some(c) => self.error_at(self.pos, format!("unexpected {c:?}, expected {wanted}")),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, ParseError> {
        self.skip_ws()?;
        if depth > MAX_DEPTH {
            return Err(self.error_at(self.pos, format!("nested deeper than {MAX_DEPTH}")));
        }
        let start = self.pos;
        let kind = match self.peek() {
            Some(b'{') => self.object(depth)?,
            Some(b'[') => self.array(depth)?,
            Some(b'"') => Kind::String(self.string()?),
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(b't') => self.literal("true", Kind::Bool)?,
            Some(b'f') => self.literal("false", Kind::Bool)?,
            Some(b'n') => self.literal("null", Kind::Null)?,
            _ => return Err(self.unexpected("a value")),
        };
        Ok(Node {
            start,
            end: self.pos,
            kind,
        })
    }

    fn literal(&mut self, word: &str, kind: Kind) -> Result<Kind, ParseError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(kind)
        } else {
            Err(self.unexpected("a value"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Kind, ParseError> {
        self.pos += 1; // {
        let mut members = Vec::new();
        self.skip_ws()?;
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Kind::Object(members));
        }
        loop {
            self.skip_ws()?;
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a member name in double quotes"));
            }
            let key_start = self.pos;
            let key = self.string()?;
            let key_end = self.pos;
            self.skip_ws()?;
            if self.peek() != Some(b':') {
                return Err(self.unexpected("':'"));
            }
            self.pos += 1;
            let value = self.value(depth + 1)?;
            members.push(Member {
                key,
                key_start,
                key_end,
                value,
            });
            self.skip_ws()?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Kind::Object(members));
                }
                _ => return Err(self.unexpected("',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Kind, ParseError> {
        self.pos += 1; // [
        let mut items = Vec::new();
        self.skip_ws()?;
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Kind::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_ws()?;
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Kind::Array(items));
                }
                _ => return Err(self.unexpected("',' or ']'")),
            }
        }
    }

    fn number(&mut self) -> Result<Kind, ParseError> {
        let digits = |p: &mut Self| {
            let from = p.pos;
            while p.peek().is_some_and(|b| b.is_ascii_digit()) {
                p.pos += 1;
            }
            p.pos - from
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.unexpected("a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if digits(self) == 0 {
                return Err(self.unexpected("a digit after '.'"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if digits(self) == 0 {
                return Err(self.unexpected("a digit in the exponent"));
            }
        }
        Ok(Kind::Number)
    }

    /// A string at `pos` (its opening quote), decoded.
    fn string(&mut self) -> Result<String, ParseError> {
        let open = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while self
                .peek()
                .is_some_and(|b| b != b'"' && b != b'\\' && b >= 0x20)
            {
                self.pos += 1;
            }
            // `text` is a &str and the run stops only at ASCII bytes: a char boundary.
            out.push_str(&self.text[run..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let at = self.pos;
                    self.pos += 1;
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
                            self.pos += 1;
                            let hi = self.hex4(at)?;
                            let c = if (0xD800..0xDC00).contains(&hi)
                                && self.bytes[self.pos..].starts_with(b"\\u")
                            {
                                let save = self.pos;
                                self.pos += 2;
                                let lo = self.hex4(at)?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                                } else {
                                    self.pos = save;
                                    None
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(c.unwrap_or('\u{FFFD}'));
                            continue;
                        }
                        _ => return Err(self.error_at(at, "invalid escape in a string")),
                    };
                    out.push(c);
                    self.pos += 1;
                }
                Some(_) => {
                    return Err(self.error_at(
                        self.pos,
                        "a control character in a string (write it as an escape)",
                    ));
                }
                None => return Err(self.error_at(open, "unterminated string")),
            }
        }
    }

    fn hex4(&mut self, escape: usize) -> Result<u32, ParseError> {
        let digits = self
            .text
            .get(self.pos..self.pos + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error_at(escape, "invalid \\u escape in a string"))?;
        self.pos += 4;
        u32::from_str_radix(digits, 16)
            .map_err(|_| self.error_at(escape, "invalid \\u escape in a string"))
    }
}

/// A value to write, its members in the order given (serde_json's map would sort them).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum J {
    Obj(Vec<(String, J)>),
    Arr(Vec<J>),
    Str(String),
    Num(i64),
    Bool(bool),
}

impl J {
    /// The same value as serde_json's, to compare with what a file holds whatever its layout.
    pub(super) fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            J::Obj(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_value())).collect()),
            J::Arr(items) => Value::Array(items.iter().map(J::to_value).collect()),
            J::Str(s) => Value::String(s.clone()),
            J::Num(n) => Value::from(*n),
            J::Bool(b) => Value::Bool(*b),
        }
    }
}

/// How new text is laid out, learnt from the file: the newline, one level of indentation, and
/// whether `:` is followed by a space.
#[derive(Clone, Debug)]
pub(super) struct Style {
    pub newline: &'static str,
    pub unit: String,
    pub colon_space: bool,
    /// The file has line breaks at all: new containers are written over several lines.
    pub multiline: bool,
}

impl Style {
    /// The style of `text` (defaults for an empty one: two spaces, `\n`).
    pub(super) fn of(text: &str, root: Option<&Node>) -> Style {
        let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
        let mut unit: Option<String> = None;
        for line in text.lines() {
            let indent: &str = &line[..line.len() - line.trim_start().len()];
            if indent.is_empty() || line.trim().is_empty() {
                continue;
            }
            if indent.starts_with('\t') {
                unit = Some("\t".into());
                break;
            }
            let spaces = indent.bytes().take_while(|&b| b == b' ').count();
            if spaces > 0 && unit.as_ref().is_none_or(|u| spaces < u.len()) {
                unit = Some(" ".repeat(spaces));
            }
        }
        let colon_space = root
            .and_then(first_member_gap)
            .is_none_or(|gap| text[gap.0..gap.1].contains([' ', '\t', '\n']));
        Style {
            newline,
            unit: unit.unwrap_or_else(|| "  ".into()),
            colon_space,
            multiline: text.contains('\n') || text.trim().is_empty(),
        }
    }
}

/// The bytes between the first member's key and its value (`": "`), anywhere in the tree.
fn first_member_gap(node: &Node) -> Option<(usize, usize)> {
    match &node.kind {
        Kind::Object(m) => m.first().map(|m| (m.key_end, m.value.start)),
        Kind::Array(items) => items.iter().find_map(first_member_gap),
        _ => None,
    }
}

/// `s` as a JSON string literal.
pub(super) fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `value` as text whose first line starts at a line indented by `indent` (multi-line), or on
/// one line.
pub(super) fn render(value: &J, style: &Style, indent: &str, multiline: bool) -> String {
    let mut out = String::new();
    render_into(&mut out, value, style, indent, multiline);
    out
}

fn is_scalar(v: &J) -> bool {
    !matches!(v, J::Obj(_) | J::Arr(_))
}

fn render_into(out: &mut String, value: &J, style: &Style, indent: &str, multiline: bool) {
    let colon = if style.colon_space { ": " } else { ":" };
    match value {
        J::Str(s) => out.push_str(&quote(s)),
        J::Num(n) => {
            let _ = write!(out, "{n}");
        }
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Obj(members) if members.is_empty() => out.push_str("{}"),
        J::Arr(items) if items.is_empty() => out.push_str("[]"),
        // Arrays of plain values stay on one line: `["PRX_HOOKS_TOKEN"]`.
        J::Arr(items) if !multiline || items.iter().all(is_scalar) => {
            let sep = if style.colon_space { ", " } else { "," };
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                render_into(out, item, style, indent, false);
            }
            out.push(']');
        }
        J::Obj(members) if !multiline => {
            let sep = if style.colon_space { ", " } else { "," };
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                out.push_str(&quote(k));
                out.push_str(colon);
                render_into(out, v, style, indent, false);
            }
            out.push('}');
        }
        J::Obj(members) => {
            let inner = format!("{indent}{}", style.unit);
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(style.newline);
                out.push_str(&inner);
                out.push_str(&quote(k));
                out.push_str(colon);
                render_into(out, v, style, &inner, true);
            }
            out.push_str(style.newline);
            out.push_str(indent);
            out.push('}');
        }
        J::Arr(items) => {
            let inner = format!("{indent}{}", style.unit);
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(style.newline);
                out.push_str(&inner);
                render_into(out, item, style, &inner, true);
            }
            out.push_str(style.newline);
            out.push_str(indent);
            out.push(']');
        }
    }
}

/// The indentation of the line `offset` is on.
fn line_indent(text: &str, offset: usize) -> &str {
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = &text[start..];
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// Where a new element goes after the elements whose starts are `starts` (non-empty), in the
/// container opening at `open`: the whitespace that precedes the last one (a newline and an
/// indentation, or a space, or nothing), and whether that is a line break.
fn separator(
    text: &str,
    open: usize,
    starts: &[usize],
    ends: &[usize],
    style: &Style,
) -> (String, bool) {
    let last = starts.len() - 1;
    let from = if last == 0 { open + 1 } else { ends[last - 1] };
    let lead = &text[from..starts[last]];
    // After the comma (and any comment), the whitespace run right before the element.
    let ws_len = lead.len() - lead.trim_end_matches([' ', '\t', '\n', '\r']).len();
    let ws = &lead[lead.len() - ws_len..];
    if last == 0 && !ws.contains('\n') {
        // `{"a": 1}`: the space after `{` says nothing of the one after a comma.
        let sep = if style.colon_space { " " } else { "" };
        return (sep.to_string(), false);
    }
    (ws.to_string(), ws.contains('\n'))
}

/// Inserts `"key": value` as the last member of object `obj`.
pub(super) fn insert_member(text: &str, obj: &Node, key: &str, value: &J, style: &Style) -> String {
    let members = obj.members().unwrap_or(&[]);
    let colon = if style.colon_space { ": " } else { ":" };
    if members.is_empty() {
        return fill_empty(
            text,
            obj,
            |indent, ml| format!("{}{colon}{}", quote(key), render(value, style, indent, ml)),
            style,
        );
    }
    let starts: Vec<usize> = members.iter().map(|m| m.key_start).collect();
    let ends: Vec<usize> = members.iter().map(|m| m.value.end).collect();
    let (ws, ml) = separator(text, obj.start, &starts, &ends, style);
    let indent = if ml {
        ws.rsplit('\n').next().unwrap_or("").to_string()
    } else {
        String::new()
    };
    let at = *ends.last().unwrap_or(&obj.start);
    let new = format!(
        ",{ws}{}{colon}{}",
        quote(key),
        render(value, style, &indent, ml)
    );
    splice(text, at, at, &new)
}

/// Appends `value` as the last element of array `arr`.
pub(super) fn push_item(text: &str, arr: &Node, value: &J, style: &Style) -> String {
    let items = arr.items().unwrap_or(&[]);
    if items.is_empty() {
        return fill_empty(
            text,
            arr,
            |indent, ml| render(value, style, indent, ml),
            style,
        );
    }
    let starts: Vec<usize> = items.iter().map(|n| n.start).collect();
    let ends: Vec<usize> = items.iter().map(|n| n.end).collect();
    let (ws, ml) = separator(text, arr.start, &starts, &ends, style);
    let indent = if ml {
        ws.rsplit('\n').next().unwrap_or("").to_string()
    } else {
        String::new()
    };
    let at = *ends.last().unwrap_or(&arr.start);
    let new = format!(",{ws}{}", render(value, style, &indent, ml));
    splice(text, at, at, &new)
}

/// An empty container's inside replaced by one element (`make(indent, multiline)`).
fn fill_empty(
    text: &str,
    node: &Node,
    make: impl FnOnce(&str, bool) -> String,
    style: &Style,
) -> String {
    let base = line_indent(text, node.start).to_string();
    if style.multiline {
        let inner = format!("{base}{}", style.unit);
        let body = make(&inner, true);
        let new = format!("{nl}{inner}{body}{nl}{base}", nl = style.newline);
        splice(text, node.start + 1, node.end - 1, &new)
    } else {
        splice(text, node.start + 1, node.end - 1, &make("", false))
    }
}

/// Removes member `index` of object `obj`, with its comma and the whitespace before it.
pub(super) fn remove_member(text: &str, obj: &Node, index: usize) -> String {
    let members = obj.members().unwrap_or(&[]);
    let spans: Vec<(usize, usize)> = members.iter().map(|m| (m.key_start, m.value.end)).collect();
    remove_span(text, obj, &spans, index)
}

/// Removes element `index` of array `arr`, with its comma and the whitespace before it.
pub(super) fn remove_item(text: &str, arr: &Node, index: usize) -> String {
    let items = arr.items().unwrap_or(&[]);
    let spans: Vec<(usize, usize)> = items.iter().map(|n| (n.start, n.end)).collect();
    remove_span(text, arr, &spans, index)
}

fn remove_span(text: &str, container: &Node, spans: &[(usize, usize)], index: usize) -> String {
    let Some(&(start, end)) = spans.get(index) else {
        return text.to_string();
    };
    if spans.len() == 1 {
        // The only one: the container becomes empty (`{}`, `[]`).
        return splice(text, container.start + 1, container.end - 1, "");
    }
    if index + 1 == spans.len() {
        // The last one: from the end of the one before (its comma goes too).
        return splice(text, spans[index - 1].1, end, "");
    }
    // `element,` and the whitespace after it: the next element takes its place, after the
    // whitespace that preceded the removed one. A comment after the comma stays.
    let next = spans[index + 1].0;
    let ws = |at: usize| {
        at + text[at..].len() - text[at..].trim_start_matches([' ', '\t', '\n', '\r']).len()
    };
    let comma = ws(end);
    let cut = if text.as_bytes().get(comma) == Some(&b',') {
        ws(comma + 1).min(next)
    } else {
        next // a comment before the comma: up to the next element
    };
    splice(text, start, cut, "")
}

/// `node`'s text replaced by `value`, laid out from the line it starts on (over several
/// lines when the file has line breaks and the old text had them too).
pub(super) fn replace(text: &str, node: &Node, value: &J, style: &Style) -> String {
    let indent = line_indent(text, node.start).to_string();
    let ml = style.multiline && text[node.start..node.end].contains('\n');
    splice(
        text,
        node.start,
        node.end,
        &render(value, style, &indent, ml),
    )
}

fn splice(text: &str, from: usize, to: usize, with: &str) -> String {
    let mut out = String::with_capacity(text.len() + with.len());
    out.push_str(&text[..from]);
    out.push_str(with);
    out.push_str(&text[to..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(m: &[(&str, J)]) -> J {
        J::Obj(m.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
    }

    fn s(v: &str) -> J {
        J::Str(v.into())
    }

    /// `edit` applied to `text`, checked to be JSON serde_json reads as `expect`.
    fn valid(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn spans_cover_exactly_each_value_and_member() {
        let text = r#" { "a" : [1, -2.5e3, "x\"y"], "b": {"c": null}, "d": true } "#;
        let root = parse(text, false).unwrap();
        assert_eq!(&text[root.start..root.end], text.trim());
        let (i, a) = root.get("a").unwrap();
        assert_eq!(i, 0);
        assert_eq!(&text[a.key_start..a.key_end], r#""a""#);
        assert_eq!(&text[a.value.start..a.value.end], r#"[1, -2.5e3, "x\"y"]"#);
        let items = a.value.items().unwrap();
        assert_eq!(items[2].str(), Some("x\"y"));
        assert_eq!(&text[items[1].start..items[1].end], "-2.5e3");
        let (_, b) = root.get("b").unwrap();
        assert_eq!(&text[b.value.start..b.value.end], r#"{"c": null}"#);
        assert_eq!(root.get("d").unwrap().1.value.what(), "a boolean");
    }

    #[test]
    fn strings_decode_escapes_and_surrogate_pairs() {
        let root = parse(r#"["\u00e9\ud83d\ude00\n\/", "\ud800x", "é"]"#, false).unwrap();
        let items = root.items().unwrap();
        assert_eq!(items[0].str(), Some("é😀\n/"));
        assert_eq!(items[1].str(), Some("\u{FFFD}x"));
        assert_eq!(items[2].str(), Some("é"));
    }

    #[test]
    fn errors_name_line_and_column_and_never_panic() {
        let cases: &[(&str, (usize, usize), &str)] = &[
            ("{\n  \"a\": 1,\n}", (3, 1), "member name"),
            ("{\"a\" 1}", (1, 6), "':'"),
            ("[1 2]", (1, 4), "',' or ']'"),
            ("{\"a\": tru}", (1, 7), "a value"),
            ("\"abc", (1, 1), "unterminated string"),
            ("{} x", (1, 4), "after the JSON value"),
            ("", (1, 1), "end of file"),
            ("[01]", (1, 3), "',' or ']'"),
            ("[1.]", (1, 4), "digit after '.'"),
            ("[\"\t\"]", (1, 3), "control character"),
            ("[\"\\x\"]", (1, 3), "invalid escape"),
            ("{\"é\": // c\n1}", (1, 7), "a comment"),
            ("[\"é\", ?]", (1, 7), "unexpected '?'"),
        ];
        for (text, (line, column), reason) in cases {
            let e = parse(text, false).expect_err(text);
            assert_eq!((e.line, e.column), (*line, *column), "{text:?}: {e:?}");
            assert!(e.reason.contains(reason), "{text:?}: {e:?}");
        }
        let deep = "[".repeat(MAX_DEPTH + 10);
        assert!(
            parse(&deep, false)
                .unwrap_err()
                .reason
                .contains("nested deeper")
        );
        // Every prefix of a valid text fails cleanly (or parses), never panics.
        let text = r#"{"a": [1, {"b": "c\u00e9"}], "d": -1.5e-3, "e": null}"#;
        for end in 0..text.len() {
            if text.is_char_boundary(end) {
                let _ = parse(&text[..end], true);
            }
        }
    }

    #[test]
    fn comments_are_whitespace_only_when_allowed() {
        let text = "// top\n{ /* a */ \"a\": 1 // b\n}";
        assert!(parse(text, false).is_err());
        let root = parse(text, true).unwrap();
        assert_eq!(&text[root.start..root.end], "{ /* a */ \"a\": 1 // b\n}");
        assert!(
            parse("{ /* open", true)
                .unwrap_err()
                .reason
                .contains("unterminated comment")
        );
    }

    #[test]
    fn a_member_inserted_follows_the_layout_of_the_one_before() {
        let cases = [
            // Four spaces, pretty.
            (
                "{\n    \"a\": 1\n}\n",
                "{\n    \"a\": 1,\n    \"k\": {\n        \"x\": [\"v\"]\n    }\n}\n",
            ),
            // Tabs.
            (
                "{\n\t\"a\": 1\n}",
                "{\n\t\"a\": 1,\n\t\"k\": {\n\t\t\"x\": [\"v\"]\n\t}\n}",
            ),
            // One line, compact: stays compact.
            (r#"{"a":1}"#, r#"{"a":1,"k":{"x":["v"]}}"#),
            // One line with spaces.
            (r#"{ "a": 1 }"#, r#"{ "a": 1, "k": {"x": ["v"]} }"#),
            (r#"{"a": 1}"#, r#"{"a": 1, "k": {"x": ["v"]}}"#),
            // Empty, in a multi-line file.
            ("{}\n", "{\n  \"k\": {\n    \"x\": [\"v\"]\n  }\n}\n"),
            // CRLF line ends.
            (
                "{\r\n  \"a\": 1\r\n}\r\n",
                "{\r\n  \"a\": 1,\r\n  \"k\": {\r\n    \"x\": [\"v\"]\r\n  }\r\n}\r\n",
            ),
        ];
        let value = obj(&[("x", J::Arr(vec![s("v")]))]);
        for (text, want) in cases {
            let root = parse(text, false).unwrap();
            let style = Style::of(text, Some(&root));
            let got = insert_member(text, &root, "k", &value, &style);
            assert_eq!(got, want, "from {text:?}");
            valid(&got);
        }
    }

    #[test]
    fn an_item_pushed_and_removed_again_gives_back_the_same_bytes() {
        let texts = [
            "[\n  1,\n  2\n]",
            "[1,2]",
            "[ 1, 2 ]",
            "{\"h\": [\n        {\"a\": 1}\n    ]}",
            "[\n  1, // one\n  2\n]",
        ];
        for text in texts {
            let comments = text.contains("//");
            let root = parse(text, comments).unwrap();
            let arr = match root.get("h") {
                Some((_, m)) => &m.value,
                None => &root,
            };
            let style = Style::of(text, Some(&root));
            let n = arr.items().unwrap().len();
            let pushed = push_item(text, arr, &obj(&[("z", J::Num(3))]), &style);
            let root2 = parse(&pushed, comments).unwrap();
            let arr2 = match root2.get("h") {
                Some((_, m)) => &m.value,
                None => &root2,
            };
            assert_eq!(arr2.items().unwrap().len(), n + 1, "{pushed}");
            let back = remove_item(&pushed, arr2, n);
            assert_eq!(
                back, text,
                "push then remove of {text:?} (pushed: {pushed:?})"
            );
        }
    }

    #[test]
    fn removing_the_first_middle_or_only_element_keeps_the_rest_as_it_was() {
        let text = "[\n  1,\n  2,\n  3\n]";
        let root = parse(text, false).unwrap();
        assert_eq!(remove_item(text, &root, 0), "[\n  2,\n  3\n]");
        assert_eq!(remove_item(text, &root, 1), "[\n  1,\n  3\n]");
        assert_eq!(remove_item(text, &root, 2), "[\n  1,\n  2\n]");
        let one = "{\"a\": [ 7 ]}";
        let root = parse(one, false).unwrap();
        assert_eq!(
            remove_item(one, &root.get("a").unwrap().1.value, 0),
            "{\"a\": []}"
        );
        assert_eq!(remove_member(one, &root, 0), "{}");
        // A comment after the comma stays with what follows it.
        let c = "[\n  1, // about two\n  2\n]";
        let root = parse(c, true).unwrap();
        assert_eq!(remove_item(c, &root, 0), "[\n  // about two\n  2\n]");
        // Members: first and last.
        let m = "{ \"a\": 1, \"b\": [2], \"c\": 3 }";
        let root = parse(m, false).unwrap();
        assert_eq!(remove_member(m, &root, 0), "{ \"b\": [2], \"c\": 3 }");
        assert_eq!(remove_member(m, &root, 2), "{ \"a\": 1, \"b\": [2] }");
        valid(&remove_member(m, &root, 1));
    }

    #[test]
    fn replace_rewrites_one_value_in_place() {
        let text = "{\n  \"a\": {\n    \"x\": 1\n  },\n  \"b\": 2\n}";
        let root = parse(text, false).unwrap();
        let style = Style::of(text, Some(&root));
        let a = &root.get("a").unwrap().1.value;
        let got = replace(text, a, &obj(&[("y", s("z"))]), &style);
        assert_eq!(got, "{\n  \"a\": {\n    \"y\": \"z\"\n  },\n  \"b\": 2\n}");
    }

    #[test]
    fn line_col_counts_characters() {
        let text = "ab\né€x";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 3), (2, 1));
        assert_eq!(line_col(text, text.len() - 1), (2, 3));
    }
}
