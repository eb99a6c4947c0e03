//! Text helpers shared by every error message, the binaries' included: where a byte is as a
//! line and a column, quoting a value on one line, and "did you mean …?" hints. Not part of
//! the library's API.

/// The 1-based line and column (in characters: a column an editor can jump to) of byte
/// `offset` of `text`; an offset past the end or inside a character counts from the character
/// it is in.
///
/// # Examples
///
/// ```
/// assert_eq!(prx_hooks::text::line_col("ab\néx", 5), (2, 2));
/// ```
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.bytes().filter(|&b| b == b'\n').count() + 1,
        before[start..].chars().count() + 1,
    )
}

/// The candidate closest to `word` by edit distance (case aside), if it is close enough to be
/// a likely typo (for "did you mean …?" hints in error messages).
///
/// # Examples
///
/// ```
/// assert_eq!(prx_hooks::text::suggest("PreTolUse", &["PreToolUse", "Stop"]), Some("PreToolUse"));
/// assert_eq!(prx_hooks::text::suggest("banana", &["PreToolUse", "Stop"]), None);
/// ```
pub fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.to_lowercase().chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    let word = word.to_lowercase();
    candidates
        .iter()
        .map(|c| (distance(&word, c), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `s` in double quotes, escaped like a JSON string (control characters, `"`, `\`, and the
/// Unicode line separators), and cut at 64 characters with `…`. Always one line.
pub(crate) fn quote(s: &str) -> String {
    const MAX: usize = 64;
    let mut out = String::with_capacity(s.len().min(MAX) + 2);
    out.push('"');
    for (n, c) in s.chars().enumerate() {
        if n == MAX {
            out.push('…');
            break;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
