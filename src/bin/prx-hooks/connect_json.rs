//! Settings files read with `jsonc-parser` (dprint's), and text edits at the byte spans of
//! the values read.
//!
//! `connect` changes an agent's settings file where its own entries go and leaves every other
//! byte. [`parse`] reads a file the way its agent does: plain JSON (RFC 8259), or JSON with
//! `//` and `/* */` comments for an agent that strips them (Gemini CLI), and nothing looser
//! (no trailing commas, single quotes or bare words). It never panics; nesting is bounded by
//! the crate (512). The edits ([`insert_member`], [`push_item`], [`replace`], [`removal`] with
//! [`delete`]) return a new text; new values are laid out like their neighbours ([`Style`]).
//!
//! Why not the crate's own editing tree (its `cst` feature): it lays out what it adds on
//! several lines and rewrites one-line containers, so `connect` then `--remove` would not give
//! the user's bytes back (`the_crates_editing_tree_does_not_give_the_users_bytes_back`).

use jsonc_parser::common::Ranged;
use jsonc_parser::{CollectOptions, CommentCollectionStrategy, ParseOptions, ast, tokens::Token};
use std::fmt::Write as _;

/// A value and where it is: `text[start..end]`.
#[derive(Debug)]
pub(crate) struct Node {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

#[derive(Debug)]
pub(crate) enum Kind {
    Object(Vec<Member>),
    Array(Vec<Node>),
    /// The decoded text.
    String(String),
    Number,
    Bool,
    Null,
}

/// One `"key": value` of an object; the member's span is `key_start..value.end`.
#[derive(Debug)]
pub(crate) struct Member {
    pub key: String,
    pub key_start: usize,
    /// Just after the key's closing quote.
    pub key_end: usize,
    pub value: Node,
}

impl Node {
    /// What it is, for messages: "an object", "an array", "a string"…
    pub(crate) fn what(&self) -> &'static str {
        match self.kind {
            Kind::Object(_) => "an object",
            Kind::Array(_) => "an array",
            Kind::String(_) => "a string",
            Kind::Number => "a number",
            Kind::Bool => "a boolean",
            Kind::Null => "null",
        }
    }

    pub(crate) fn members(&self) -> Option<&[Member]> {
        match &self.kind {
            Kind::Object(m) => Some(m),
            _ => None,
        }
    }

    pub(crate) fn items(&self) -> Option<&[Node]> {
        match &self.kind {
            Kind::Array(items) => Some(items),
            _ => None,
        }
    }

    pub(crate) fn str(&self) -> Option<&str> {
        match &self.kind {
            Kind::String(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn bool(&self, text: &str) -> Option<bool> {
        match &self.kind {
            Kind::Bool => Some(&text[self.start..self.end] == "true"),
            _ => None,
        }
    }

    /// The member named `key`, and its index (the first one: see [`duplicate`]).
    pub(crate) fn get(&self, key: &str) -> Option<(usize, &Member)> {
        self.members()?
            .iter()
            .enumerate()
            .find(|(_, m)| m.key == key)
    }

    /// The spans of its children: members (`key_start..value.end`) or elements.
    fn child_spans(&self) -> Vec<(usize, usize)> {
        match &self.kind {
            Kind::Object(m) => m.iter().map(|m| (m.key_start, m.value.end)).collect(),
            Kind::Array(items) => items.iter().map(|n| (n.start, n.end)).collect(),
            _ => Vec::new(),
        }
    }
}

/// The second member named `key` in `obj`, if there is one (agents keep the last: an edit of
/// the first would not be what they read).
pub(crate) fn duplicate<'a>(obj: &'a Node, key: &str) -> Option<&'a Member> {
    obj.members()?.iter().filter(|m| m.key == key).nth(1)
}

/// Why a text is not what the agent reads, and where (1-based line and column, in
/// characters).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ParseError {
    pub line: usize,
    pub column: usize,
    pub reason: String,
}

pub(crate) use prx_hooks::text::line_col;

/// A settings file read: its value, and where its commas and comments are.
#[derive(Debug)]
pub(crate) struct Doc {
    pub root: Node,
    /// Byte offsets of the commas between values.
    commas: Vec<usize>,
    /// Comments: `(start, end, is a line comment)`; a line comment's end is before its newline.
    comments: Vec<(usize, usize, bool)>,
}

/// The crate's options for what the agents read: comments or not, nothing else loose.
fn options(comments: bool) -> ParseOptions {
    ParseOptions {
        allow_comments: comments,
        allow_loose_object_property_names: false,
        allow_trailing_commas: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    }
}

/// Reads `text` as one JSON value (with `comments`, `//` and `/* */` are read as the agent's
/// comment stripping reads them: as blanks).
///
/// # Examples
///
/// ```ignore
/// let doc = parse(r#"{"a": [1, "x"]}"#, false).unwrap();
/// let (_, a) = doc.root.get("a").unwrap();
/// assert_eq!((a.value.start, a.value.end), (6, 14));
/// ```
pub(crate) fn parse(text: &str, comments: bool) -> Result<Doc, ParseError> {
    let at = |offset: usize, reason: String| {
        let (line, column) = line_col(text, offset);
        ParseError {
            line,
            column,
            reason,
        }
    };
    let collect = CollectOptions {
        comments: CommentCollectionStrategy::AsTokens,
        tokens: true,
    };
    let parsed = jsonc_parser::parse_to_ast(text, &collect, &options(comments))
        .map_err(|e| at(e.range().start, describe(e.kind())))?;
    let Some(value) = parsed.value else {
        return Err(at(
            text.len(),
            "unexpected end of file, expected a value".into(),
        ));
    };
    let (mut commas, mut found) = (Vec::new(), Vec::new());
    for t in parsed.tokens.unwrap_or_default() {
        match t.token {
            Token::Comma => commas.push(t.range.start),
            Token::CommentLine(_) => found.push((t.range.start, t.range.end, true)),
            Token::CommentBlock(_) => found.push((t.range.start, t.range.end, false)),
            _ => {}
        }
    }
    // Collected as tokens, comments pass the crate's own check: refused here.
    if let (false, Some(&(start, _, _))) = (comments, found.first()) {
        return Err(at(
            start,
            "a comment: JSON has none (this agent's settings must be plain JSON)".into(),
        ));
    }
    strict(text, &found)?;
    Ok(Doc {
        root: node(&value),
        commas,
        comments: found,
    })
}

/// What the agent's own JSON reader refuses and the crate takes (a raw control character in a
/// string, nesting past 128): the text, comments blanked out, read by serde_json.
fn strict(text: &str, comments: &[(usize, usize, bool)]) -> Result<(), ParseError> {
    let mut plain = text.as_bytes().to_vec();
    for &(start, end, _) in comments {
        for b in &mut plain[start..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    let plain = String::from_utf8_lossy(&plain);
    serde_json::from_str::<serde::de::IgnoredAny>(&plain)
        .map(|_| ())
        .map_err(|e| {
            let reason = e.to_string();
            let reason = reason.split(" at line ").next().unwrap_or(&reason);
            // serde_json counts bytes and may stop before the character it refuses: the
            // place is the control character itself, in characters.
            let line_start: usize = plain
                .split_inclusive('\n')
                .take(e.line().max(1) - 1)
                .map(str::len)
                .sum();
            let mut at = (line_start + e.column().saturating_sub(1)).min(plain.len());
            if reason.starts_with("control character") {
                at += plain.as_bytes()[at..]
                    .iter()
                    .position(|b| *b < 0x20)
                    .unwrap_or(0);
            }
            while !plain.is_char_boundary(at) {
                at -= 1;
            }
            let (line, column) = line_col(&plain, at);
            ParseError {
                line,
                column,
                reason: reason.to_string(),
            }
        })
}

/// The crate's reason, worded like the rest of our messages.
fn describe(kind: &jsonc_parser::errors::ParseErrorKind) -> String {
    use jsonc_parser::errors::ParseErrorKind as K;
    match kind {
        K::CommentsNotAllowed => {
            "a comment: JSON has none (this agent's settings must be plain JSON)".into()
        }
        K::TrailingCommasNotAllowed => {
            "a comma before the closing bracket: JSON allows none there".into()
        }
        K::ExpectedStringObjectProperty | K::UnexpectedTokenInObject => {
            "unexpected text, expected a member name in double quotes".into()
        }
        K::UnexpectedComma => "unexpected comma, expected a value or a member".into(),
        K::MultipleRootJsonValues => {
            "unexpected text after the settings object (JSON holds one value)".into()
        }
        K::UnexpectedCloseBrace | K::UnexpectedCloseBracket => {
            format!("{kind}, expected a value").to_lowercase()
        }
        other => {
            let s = other.to_string();
            let mut c = s.chars();
            c.next()
                .map_or(s.clone(), |f| f.to_lowercase().chain(c).collect())
        }
    }
}

/// Our tree of the crate's.
fn node(value: &ast::Value<'_>) -> Node {
    let r = value.range();
    let kind = match value {
        ast::Value::Object(o) => Kind::Object(
            o.properties
                .iter()
                .map(|p| {
                    let name = p.name.range();
                    let key = match &p.name {
                        ast::ObjectPropName::String(l) => l.value.to_string(),
                        ast::ObjectPropName::Word(w) => w.value.to_string(),
                    };
                    Member {
                        key,
                        key_start: name.start,
                        key_end: name.end,
                        value: node(&p.value),
                    }
                })
                .collect(),
        ),
        ast::Value::Array(a) => Kind::Array(a.elements.iter().map(node).collect()),
        ast::Value::StringLit(s) => Kind::String(s.value.to_string()),
        ast::Value::NumberLit(_) => Kind::Number,
        ast::Value::BooleanLit(_) => Kind::Bool,
        ast::Value::NullKeyword(_) => Kind::Null,
    };
    Node {
        start: r.start,
        end: r.end,
        kind,
    }
}

/// A value to write, its members in the order given (serde_json's map would sort them).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum J {
    Obj(Vec<(String, J)>),
    Arr(Vec<J>),
    Str(String),
    Num(i64),
    Bool(bool),
}

impl J {
    /// The same value as serde_json's, to compare with what a file holds whatever its layout.
    pub(crate) fn to_value(&self) -> serde_json::Value {
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
pub(crate) struct Style {
    pub newline: &'static str,
    pub unit: String,
    pub colon_space: bool,
    /// The file has line breaks at all: new containers are written over several lines.
    pub multiline: bool,
}

impl Style {
    /// The style of `text` (defaults for an empty one: two spaces, `\n`).
    pub(crate) fn of(text: &str, root: Option<&Node>) -> Style {
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
pub(crate) fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `value` as text whose first line starts at a line indented by `indent` (multi-line), or on
/// one line.
pub(crate) fn render(value: &J, style: &Style, indent: &str, multiline: bool) -> String {
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
pub(crate) fn insert_member(text: &str, obj: &Node, key: &str, value: &J, style: &Style) -> String {
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
pub(crate) fn push_item(text: &str, arr: &Node, value: &J, style: &Style) -> String {
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

/// The byte ranges that take the children `remove` of `container` out of `text` (indices in
/// ascending order, not every child: a container left empty goes from its own parent, or with
/// [`emptied`]), each with the comma that separated it and the blank space before it. A
/// comment stays, wherever it is: after the comma of the child before, after the removed
/// child on its line, or between two removed children's runs.
pub(crate) fn removal(
    doc: &Doc,
    text: &str,
    container: &Node,
    remove: &[usize],
) -> Vec<(usize, usize)> {
    let spans = container.child_spans();
    let n = spans.len();
    let mut ranges = Vec::new();
    let mut k = 0;
    while k < remove.len() {
        // A run of adjacent children to take out: a..=b.
        let a = remove[k];
        let mut b = a;
        while k + 1 < remove.len() && remove[k + 1] == b + 1 {
            k += 1;
            b += 1;
        }
        k += 1;
        if b + 1 < n {
            // A child follows: the run, its last comma and the blanks after that comma go;
            // the next child takes the run's place.
            let next = spans[b + 1].0;
            let after = skip_blanks(text, spans[b].1);
            let cut = if text.as_bytes().get(after) == Some(&b',') {
                skip_blanks(text, after + 1).min(next)
            } else {
                next // a comment before the comma: up to the next child
            };
            ranges.push((spans[a].0, cut));
        } else if a > 0 {
            // The last ones: the comma after the child before goes (not what follows it), and
            // the run with the blanks before it.
            let (prev_end, start) = (spans[a - 1].1, spans[a].0);
            if let Some(c) = doc.comma_between(prev_end, start) {
                ranges.push((c, c + 1));
                ranges.push((
                    blanks_before(doc, text, c + 1, start, spans[b].1),
                    spans[b].1,
                ));
            }
        }
    }
    ranges
}

/// The range that empties `container` of its only child `index`: all of its inside (`{}`),
/// or, when a comment is in there, the child and the blanks before it only.
pub(crate) fn emptied(doc: &Doc, text: &str, container: &Node) -> (usize, usize) {
    let inside = (container.start + 1, container.end - 1);
    let spans = container.child_spans();
    let commented = doc
        .comments
        .iter()
        .any(|&(s, _, _)| s > inside.0 && s < inside.1);
    match spans.as_slice() {
        [(start, end)] if commented => (blanks_before(doc, text, inside.0, *start, *end), *end),
        _ => inside,
    }
}

/// Where the blanks before `start` begin (not before `floor`). After a line comment, the
/// newline that ends it stays when something follows `end` on its line.
fn blanks_before(doc: &Doc, text: &str, floor: usize, start: usize, end: usize) -> usize {
    let lead = &text[floor..start];
    let from = floor + lead.trim_end_matches([' ', '\t', '\n', '\r']).len();
    let after_line_comment = doc.comments.iter().any(|&(_, e, line)| line && e == from);
    let rest = &text[end..];
    let line_rest = &rest[..rest.find('\n').unwrap_or(rest.len())];
    if after_line_comment && !line_rest.trim().is_empty() {
        return text[from..start].find('\n').map_or(from, |i| from + i + 1);
    }
    from
}

/// `at` past spaces, tabs and line ends.
fn skip_blanks(text: &str, at: usize) -> usize {
    at + text[at..].len() - text[at..].trim_start_matches([' ', '\t', '\n', '\r']).len()
}

impl Doc {
    /// The first comma in `from..to`.
    fn comma_between(&self, from: usize, to: usize) -> Option<usize> {
        let i = self.commas.partition_point(|&c| c < from);
        self.commas.get(i).copied().filter(|&c| c < to)
    }
}

/// `text` without the byte ranges `ranges` (disjoint), in one pass.
pub(crate) fn delete(text: &str, mut ranges: Vec<(usize, usize)>) -> String {
    ranges.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (from, to) in ranges {
        let from = from.max(at);
        out.push_str(&text[at..from]);
        at = to.max(at);
    }
    out.push_str(&text[at..]);
    out
}

/// `node`'s text replaced by `value`, laid out from the line it starts on (over several
/// lines when the file has line breaks and the old text had them too).
pub(crate) fn replace(text: &str, node: &Node, value: &J, style: &Style) -> String {
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

    fn valid(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    /// `text` with children `remove` of the container `pick` finds taken out.
    fn remove(text: &str, pick: impl Fn(&Node) -> &Node, remove: &[usize]) -> String {
        let doc = parse(text, true).unwrap();
        let c = pick(&doc.root);
        delete(text, removal(&doc, text, c, remove))
    }

    fn root(n: &Node) -> &Node {
        n
    }

    fn member_h(n: &Node) -> &Node {
        &n.get("h").unwrap().1.value
    }

    #[test]
    fn spans_cover_exactly_each_value_and_member() {
        let text = r#" { "a" : [1, -2.5e3, "x\"y"], "b": {"c": null}, "d": true } "#;
        let root = parse(text, false).unwrap().root;
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
        assert_eq!(root.get("d").unwrap().1.value.bool(text), Some(true));
        let decoded = parse(r#"["\u00e9\ud83d\ude00\n\/", "é"]"#, false)
            .unwrap()
            .root;
        let items = decoded.items().unwrap();
        assert_eq!(items[0].str(), Some("é😀\n/"));
        assert_eq!(items[1].str(), Some("é"));
    }

    #[test]
    fn what_the_agents_refuse_is_refused_at_its_line_and_column() {
        let cases: &[(&str, bool, (usize, usize), &str)] = &[
            (
                "{\n  \"a\": 1,\n}",
                true,
                (2, 9),
                "a comma before the closing bracket",
            ),
            ("{\"a\" 1}", false, (1, 6), "expected colon"),
            ("[1 2]", false, (1, 3), "expected comma"),
            ("{\"a\": tru}", false, (1, 7), "unexpected token"),
            ("\"abc", false, (1, 1), "unterminated string"),
            ("{} x", false, (1, 4), "json holds one value"),
            ("", false, (1, 1), "end of file"),
            ("[01]", false, (1, 3), "expected comma"),
            ("[1.]", false, (1, 2), "decimal point"),
            ("[\"\t\"]", false, (1, 3), "control character"),
            ("[\"\\x\"]", false, (1, 3), "invalid escape"),
            (
                "{\"é\": // c\n1}",
                false,
                (1, 7),
                "a comment: JSON has none",
            ),
            ("[\"é\", ?]", false, (1, 7), "unexpected token"),
            ("{'a': 1}", true, (1, 2), "single-quoted"),
            ("{a: 1}", true, (1, 2), "expected a member name"),
            ("{\"a\": \"\\ud800\"}", false, (1, 8), "unpaired"),
            ("{ /* open", true, (1, 3), "unterminated comment"),
        ];
        for (text, comments, (line, column), reason) in cases {
            let e = parse(text, *comments).expect_err(text);
            assert_eq!((e.line, e.column), (*line, *column), "{text:?}: {e:?}");
            assert!(
                e.reason.to_lowercase().contains(&reason.to_lowercase()),
                "{text:?}: {e:?}"
            );
        }
        let deep = "[".repeat(600);
        assert!(parse(&deep, false).unwrap_err().reason.contains("nesting"));
        // Every prefix of a valid text fails cleanly (or parses), never panics.
        let text = r#"{"a": [1, {"b": "c\u00e9"}], /* x */ "d": -1.5e-3, "e": null}"#;
        for end in 0..text.len() {
            if text.is_char_boundary(end) {
                let _ = parse(&text[..end], true);
            }
        }
    }

    #[test]
    fn comments_are_read_only_where_the_agent_reads_them() {
        let text = "// top\n{ /* a */ \"a\": 1 // b\n}";
        assert!(parse(text, false).is_err());
        let doc = parse(text, true).unwrap();
        assert_eq!(
            &text[doc.root.start..doc.root.end],
            "{ /* a */ \"a\": 1 // b\n}"
        );
        assert_eq!(doc.comments.len(), 3);
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
            let root = parse(text, false).unwrap().root;
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
            "[\n  1,\n  2 // two\n]",
            "{\"h\": [{\"a\": 1}]}",
        ];
        for text in texts {
            fn pick(n: &Node) -> &Node {
                match n.get("h") {
                    Some((_, m)) => &m.value,
                    None => n,
                }
            }
            let doc = parse(text, true).unwrap();
            let style = Style::of(text, Some(&doc.root));
            let n = pick(&doc.root).items().unwrap().len();
            let pushed = push_item(text, pick(&doc.root), &obj(&[("z", J::Num(3))]), &style);
            let back = remove(&pushed, pick, &[n]);
            assert_eq!(
                back, text,
                "push then remove of {text:?} (pushed: {pushed:?})"
            );
        }
    }

    #[test]
    fn removing_some_children_keeps_the_rest_and_every_comment() {
        let text = "[\n  1,\n  2,\n  3\n]";
        assert_eq!(remove(text, root, &[0]), "[\n  2,\n  3\n]");
        assert_eq!(remove(text, root, &[1]), "[\n  1,\n  3\n]");
        assert_eq!(remove(text, root, &[2]), "[\n  1,\n  2\n]");
        assert_eq!(remove(text, root, &[0, 2]), "[\n  2\n]");
        assert_eq!(remove(text, root, &[1, 2]), "[\n  1\n]");
        // A comment after the comma of the child before stays, and the text stays JSON
        // with comments.
        let c = "[\n  1, // about one\n  2\n]";
        assert_eq!(remove(c, root, &[1]), "[\n  1 // about one\n]");
        let c = "[\n  1, // about one\n  2]";
        let got = remove(c, root, &[1]);
        assert_eq!(got, "[\n  1 // about one\n]");
        parse(&got, true).unwrap();
        // A comment after the comma that goes with a removed child stays with what follows.
        let c = "[\n  1, // about two\n  2\n]";
        assert_eq!(remove(c, root, &[0]), "[\n  // about two\n  2\n]");
        // Members: first, last, middle.
        let m = "{ \"a\": 1, \"b\": [2], \"c\": 3 }";
        assert_eq!(remove(m, root, &[0]), "{ \"b\": [2], \"c\": 3 }");
        assert_eq!(remove(m, root, &[2]), "{ \"a\": 1, \"b\": [2] }");
        valid(&remove(m, root, &[1]));
        // Emptied: the inside goes, unless a comment is in there.
        let one = "{\"h\": [ 7 ]}";
        let doc = parse(one, true).unwrap();
        let h = member_h(&doc.root);
        let r = emptied(&doc, one, h);
        assert_eq!(delete(one, vec![r]), "{\"h\": []}");
        let kept = "{\n  // mine\n  \"h\": 1\n}\n";
        let doc = parse(kept, true).unwrap();
        assert_eq!(
            delete(kept, vec![emptied(&doc, kept, &doc.root)]),
            "{\n  // mine\n}\n"
        );
    }

    #[test]
    fn ten_thousand_children_go_in_one_pass() {
        let n = 10_000;
        let mut text = String::from("[\n  0");
        for i in 1..=n {
            text.push_str(&format!(",\n  {i}"));
        }
        text.push_str("\n]");
        let all: Vec<usize> = (1..=n).collect();
        let started = std::time::Instant::now();
        assert_eq!(remove(&text, root, &all), "[\n  0\n]");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn replace_rewrites_one_value_in_place() {
        let text = "{\n  \"a\": {\n    \"x\": 1\n  },\n  \"b\": 2\n}";
        let root = parse(text, false).unwrap().root;
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

    /// What keeps our edits: the crate's editing tree, given the same append and removal,
    /// does not give a one-line array's bytes back, and spreads a one-line object over
    /// several lines. When this fails, the crate does: use it.
    #[test]
    fn the_crates_editing_tree_does_not_give_the_users_bytes_back() {
        use jsonc_parser::cst::{CstInputValue, CstRootNode};
        let text = "{\"hooks\": {\"Stop\": [{\"hooks\": []}]}}\n";
        let cst = CstRootNode::parse(text, &ParseOptions::default()).unwrap();
        let arr = cst
            .object_value()
            .and_then(|o| o.object_value("hooks"))
            .and_then(|h| h.array_value("Stop"))
            .unwrap();
        arr.append(CstInputValue::Object(vec![(
            "a".into(),
            CstInputValue::Bool(true),
        )]));
        let added = cst.to_string();
        let cst = CstRootNode::parse(&added, &ParseOptions::default()).unwrap();
        let arr = cst
            .object_value()
            .and_then(|o| o.object_value("hooks"))
            .and_then(|h| h.array_value("Stop"))
            .unwrap();
        arr.elements().last().unwrap().clone().remove();
        assert_ne!(cst.to_string(), text, "the crate round-trips now");
        // Ours: the same append and removal give the bytes back, on one line.
        let doc = parse(text, false).unwrap();
        let style = Style::of(text, Some(&doc.root));
        let stop = &doc
            .root
            .get("hooks")
            .unwrap()
            .1
            .value
            .get("Stop")
            .unwrap()
            .1
            .value;
        let ours = push_item(text, stop, &obj(&[("a", J::Bool(true))]), &style);
        assert_eq!(
            ours,
            "{\"hooks\": {\"Stop\": [{\"hooks\": []}, {\"a\": true}]}}\n"
        );
        let back = remove(
            &ours,
            |n| &n.get("hooks").unwrap().1.value.get("Stop").unwrap().1.value,
            &[1],
        );
        assert_eq!(back, text);
    }
}
