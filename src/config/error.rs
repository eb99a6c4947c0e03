//! Configuration errors: `FILE:LINE:COL: JSON.PATH: reason`, one line each.
//!
//! Lines and columns are 1-based; a column counts characters (Unicode scalar values) from the
//! start of its line, as editors do, and points at the first character of the offending value
//! (its opening quote for a string) or key. Anything quoted from the file has its control
//! characters escaped and is cut at 64 characters, so a message is always a single line.

use std::fmt;

/// One step of a JSON path: `hooks`, `.tool_call`, `[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A JSON path; displayed as `hooks.tool_call[0].command`, `$` for the whole document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Path(Vec<Seg>);

impl Path {
    pub(crate) fn root() -> Path {
        Path(Vec::new())
    }

    pub(crate) fn push(&mut self, seg: Seg) {
        self.0.push(seg)
    }

    pub(crate) fn pop(&mut self) {
        self.0.pop();
    }

    /// Removes and returns the last step.
    pub(crate) fn pop_seg(&mut self) -> Option<Seg> {
        self.0.pop()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear()
    }

    /// This path with a key appended.
    pub(crate) fn key(&self, key: &str) -> Path {
        let mut p = self.clone();
        p.push(Seg::Key(key.to_string()));
        p
    }

    /// This path with an index appended.
    pub(crate) fn index(&self, i: usize) -> Path {
        let mut p = self.clone();
        p.push(Seg::Index(i));
        p
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("$");
        }
        // A pathologically deep path is shortened in the middle (it only happens with nesting
        // far beyond what hooks.json uses, and keeps the line readable).
        const HEAD: usize = 8;
        const TAIL: usize = 4;
        for (n, seg) in self.0.iter().enumerate() {
            if self.0.len() > HEAD + TAIL + 1 && (HEAD..self.0.len() - TAIL).contains(&n) {
                if n == HEAD {
                    f.write_str("…")?;
                }
                continue;
            }
            match seg {
                Seg::Index(i) => write!(f, "[{i}]")?,
                Seg::Key(k) if is_plain_key(k) => {
                    if n > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Key(k) => write!(f, "[{}]", quote(k))?,
            }
        }
        Ok(())
    }
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 64
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(crate) use crate::text::quote;

/// Makes a caller-supplied label (a file name) safe to print on one line.
pub(crate) fn one_line(s: &str) -> String {
    if s.chars()
        .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    {
        let q = quote(s);
        q[1..q.len() - 1].to_string()
    } else {
        s.to_string()
    }
}

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConfigError {
    /// The file as the caller named it (`hooks.json`, `ws/hooks.json`).
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub col: usize,
    /// The JSON path of the offending value: `hooks.tool_call[0].command` (`$`: the document).
    pub path: String,
    /// What is wrong and, where it helps, what to write instead.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file, self.line, self.col, self.path, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in a configuration file (never empty), in file order. Displayed one
/// per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The errors, in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    /// How many errors there are (at least 1).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (never, for a set a load returned).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each error's one-line text.
    pub fn lines(&self) -> Vec<String> {
        self.0.iter().map(|e| e.to_string()).collect()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, e) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Byte offsets → 1-based line and character column.
///
/// Linear over a run of calls with ascending offsets (what error lists are): the column is
/// counted on from the previous call's position when it is on the same line, instead of from
/// the line's start each time (a 256 KiB one-line file with an error every three bytes made
/// that quadratic). Any order is correct; descending offsets only cost a rescan of their line.
pub(crate) struct Lines<'a> {
    text: &'a str,
    starts: Vec<usize>,
    /// The last answer: (byte offset, line index, column before the BOM adjustment).
    last: std::cell::Cell<(usize, usize, usize)>,
}

impl<'a> Lines<'a> {
    pub(crate) fn new(text: &'a str) -> Lines<'a> {
        let mut starts = vec![0];
        starts.extend(
            text.bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Lines {
            text,
            starts,
            last: std::cell::Cell::new((0, 1, 1)),
        }
    }

    pub(crate) fn locate(&self, pos: usize) -> (usize, usize) {
        let mut pos = pos.min(self.text.len());
        while !self.text.is_char_boundary(pos) {
            pos -= 1;
        }
        let line = self.starts.partition_point(|&s| s <= pos);
        let start = self.starts[line - 1];
        let (last_pos, last_line, last_col) = self.last.get();
        let mut col = if last_line == line && last_pos <= pos && last_pos >= start {
            last_col + self.text[last_pos..pos].chars().count()
        } else {
            self.text[start..pos].chars().count() + 1
        };
        self.last.set((pos, line, col));
        // A leading byte order mark is not a column (editors do not show it).
        if line == 1 && col > 1 && self.text.starts_with('\u{feff}') {
            col -= 1;
        }
        (line, col)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_display_like_jq() {
        let p = Path::root()
            .key("hooks")
            .key("tool_call")
            .index(0)
            .key("command");
        assert_eq!(p.to_string(), "hooks.tool_call[0].command");
        assert_eq!(Path::root().to_string(), "$");
        assert_eq!(
            Path::root().key("hooks").key("a b\n").to_string(),
            r#"hooks["a b\n"]"#
        );
        assert_eq!(Path::root().key("LLM-Response").to_string(), "LLM-Response");
        let mut deep = Path::root().key("hooks");
        for _ in 0..20 {
            deep = deep.index(0);
        }
        assert_eq!(
            deep.key("x").to_string(),
            "hooks[0][0][0][0][0][0][0]…[0][0][0].x"
        );
    }

    #[test]
    fn quotes_are_one_line_and_short() {
        assert_eq!(quote("a\"b\\\n\u{2028}\u{0}"), r#""a\"b\\\n\u2028\u0000""#);
        let long = quote(&"é".repeat(100));
        assert_eq!(long.chars().count(), 64 + 3);
    }

    #[test]
    fn locates_lines_and_character_columns() {
        let l = Lines::new("ab\n\"é\":1\n\nx");
        assert_eq!(l.locate(0), (1, 1));
        assert_eq!(l.locate(2), (1, 3));
        assert_eq!(l.locate(3), (2, 1));
        assert_eq!(l.locate(7), (2, 4)); // after "é" (2 bytes) and the quotes
        assert_eq!(l.locate(10), (3, 1));
        assert_eq!(l.locate(11), (4, 1));
        assert_eq!(l.locate(99), (4, 2));
        // Out of order: the same answers as from scratch.
        assert_eq!(l.locate(7), (2, 4));
        assert_eq!(l.locate(6), (2, 3));
        assert_eq!(l.locate(5), (2, 2)); // inside "é": its start
        assert_eq!(l.locate(1), (1, 2));
        let bom = Lines::new("\u{feff}ab");
        assert_eq!(
            (bom.locate(3), bom.locate(4), bom.locate(0)),
            ((1, 1), (1, 2), (1, 1))
        );
    }
}
