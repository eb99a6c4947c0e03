//! JSON for the hot path: string literals for payloads, and the validator that embeds the JSON
//! text agents hand us.
//!
//! * [`write_str`]: a JSON string literal, escaped per RFC 8259 — `"` and `\` escaped, control
//!   characters as `\n`-style or `\u00XX` escapes, everything else (non-ASCII included) copied as
//!   UTF-8, which JSON allows. Strings of [`SIMD_MIN`] bytes or more are written by simd-json's
//!   SIMD escaper (32 bytes per step with AVX2), shorter ones by our word-at-a-time scan, which
//!   costs less per call at small sizes (`benches/serialize.rs`, `strings/`; the figures are in
//!   docs/performance.md). Both produce the same bytes, which are serde_json's.
//! * [`append_compact`]: a strict validator that copies a JSON text without its insignificant
//!   whitespace. Two parts of a payload are JSON *text* that must reach hooks byte-exact —
//!   `tool_call_start.arguments` and extra fields ([`crate::Extras`]) — and no serializer
//!   embeds text it has not parsed. Strict means RFC 8259 to the letter, including paired
//!   UTF-16 surrogates in `\u` escapes — serde_json's "ignore" path accepts a lone `\ud800`,
//!   which a strict reader of our payload would then reject. Whitespace is dropped so that an
//!   embedded object never puts a newline into an NDJSON line or an environment variable.
//!   [`check_object`] and [`check_value`] are the same reader without the copy.
//!
//! How the reader is fast (ARCHITECTURE.md § Events; `benches/serialize.rs`, `arguments/`):
//! one pass without recursion (open containers are bits of a `u128`); strings, most of any
//! `arguments` object, are scanned 16 bytes per step with SSE2 ([`scan_string`]); UTF-8 is
//! checked only inside strings that hold a byte ≥ 0x80, the only place such a byte can be valid,
//! and not at all for `&str` input ([`append_compact_str`]); compact input is copied by one
//! `memcpy` at the end, and the pieces between whitespace by 16-byte stores. None of this
//! changes what is accepted, what is written, or where and why a text is refused: the
//! `json_compact` fuzz target checks all three against the recursive reader it replaced
//! (`fuzz/src/former_json.rs`).

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
pub(crate) const SIMD_MIN: usize = 32;

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
pub(crate) fn write_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Appends `true` or `false`.
#[inline]
pub(crate) fn write_bool(out: &mut Vec<u8>, b: bool) {
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
/// each enclosing object costs one level of serde_json's budget. Limits above [`MAX_DEPTH`]
/// count as [`MAX_DEPTH`].
pub fn append_compact_within(out: &mut Vec<u8>, src: &[u8], top: Top, max_depth: u32) -> bool {
    let start = out.len();
    let ok = run::<false, true>(src, top, max_depth, out, None).is_ok();
    if !ok {
        out.truncate(start);
    }
    ok
}

/// [`append_compact_within`] for text already known to be UTF-8 (`&str`): the same bytes and
/// verdicts, without looking at the UTF-8 of strings that hold non-ASCII characters.
#[inline]
pub fn append_compact_str(out: &mut Vec<u8>, src: &str, top: Top, max_depth: u32) -> bool {
    let start = out.len();
    let ok = run::<true, true>(src.as_bytes(), top, max_depth, out, None).is_ok();
    if !ok {
        out.truncate(start);
    }
    ok
}

/// Why [`check_object`] refused a text: the byte offset where reading stopped, and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The byte offset in the text where reading stopped.
    pub at: usize,
    /// What was wrong there.
    pub reason: String,
}

/// Checks that `src` is one JSON object by the same strict rules, nested at most `max_depth`
/// deep, and hands each of its top-level keys (unescaped) to `key`, which may refuse it. Copies
/// nothing and allocates nothing unless a key has an escape in it. When `src` is refused,
/// `key` may have seen some keys of it, even keys after the place the refusal names (a text
/// that is not UTF-8 is refused for that, at the first bad byte, wherever reading stopped).
pub fn check_object(
    src: &[u8],
    max_depth: u32,
    key: &mut dyn FnMut(&str) -> Result<(), String>,
) -> Result<(), Refused> {
    run::<false, false>(src, Top::Object, max_depth, &mut Vec::new(), Some(key))
}

/// Checks that `src` is one JSON value (any kind) by the same strict rules, nested at most
/// `max_depth` deep. Copies and allocates nothing.
pub fn check_value(src: &[u8], max_depth: u32) -> Result<(), Refused> {
    run::<false, false>(src, Top::Any, max_depth, &mut Vec::new(), None)
}

/// The visitor of an object's top-level keys ([`check_object`]).
type KeyVisitor<'k> = &'k mut (dyn FnMut(&str) -> Result<(), String> + 'k);

/// Validates `src` and, when `COPY`, appends its compact form to `out` (on success only: a
/// refused text leaves `out`'s contents as they were, [`Compact`]). `UTF8`: `src` is known to
/// be UTF-8.
///
/// Not-UTF-8 is found without a pass over the whole input: outside strings only ASCII is valid
/// JSON, and a string holding a byte ≥ 0x80 is checked with `str::from_utf8` when its closing
/// quote is found. A refused text is checked whole afterwards, so that, as before, a text that
/// is not UTF-8 is refused for that, at its first bad byte, whatever else is wrong with it.
fn run<const UTF8: bool, const COPY: bool>(
    src: &[u8],
    top: Top,
    max_depth: u32,
    out: &mut Vec<u8>,
    keys: Option<KeyVisitor<'_>>,
) -> Result<(), Refused> {
    let max_depth = max_depth.min(MAX_DEPTH);
    let verdict = match keys {
        None => parse::<UTF8, COPY, false>(src, top, max_depth, out, None),
        keys @ Some(_) => parse::<UTF8, COPY, true>(src, top, max_depth, out, keys),
    };
    let Err((at, why)) = verdict else {
        return Ok(());
    };
    if !UTF8 && let Err(e) = std::str::from_utf8(src) {
        return Err(Refused {
            at: e.valid_up_to(),
            reason: "not UTF-8".into(),
        });
    }
    let reason = match why {
        Why::Invalid => "invalid JSON".to_string(),
        Why::Says(reason) => reason.to_string(),
        Why::Visitor(reason) => reason,
    };
    Err(Refused {
        at: at.min(src.len()),
        reason,
    })
}

/// Whether `src` is one valid JSON text (any value), by the same strict rules.
#[cfg(test)]
pub(crate) fn is_valid(src: &[u8]) -> bool {
    let mut scratch = Vec::new();
    append_compact(&mut scratch, src, Top::Any)
}

/// Why reading stopped.
#[derive(Debug)]
enum Why {
    /// Nothing more precise to say than "invalid JSON".
    Invalid,
    Says(&'static str),
    /// The key visitor refused a key, for this reason.
    Visitor(String),
}

/// Where reading stopped (the offset [`Refused::at`] reports), and why.
type Stop = (usize, Why);

/// JSON's four whitespace bytes (RFC 8259 § 2) as a bit set over 0..64.
const WS: u64 = 1 << b' ' | 1 << b'\t' | 1 << b'\n' | 1 << b'\r';

#[inline(always)]
fn is_ws(b: u8) -> bool {
    b <= b' ' && WS >> b & 1 != 0
}

/// The byte at `i`, or 0 past the end. A NUL byte is invalid everywhere a peeked byte decides
/// anything (outside strings, and inside them as a control character), so the end and a NUL
/// are refused alike, at `i`.
#[inline(always)]
fn peek(src: &[u8], i: usize) -> u8 {
    src.get(i).copied().unwrap_or(0)
}

/// The value of a hex digit, or 0xff.
static HEX_VALUE: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// The whitespace-dropping copy. `src[copied..]` is what has not been copied yet; only
/// skipping whitespace flushes, so already-compact input is copied with one `memcpy` at the
/// end ([`Compact::finish`]).
///
/// Bytes are written into `out`'s spare capacity, `written` of them after its first `base`;
/// its length is set only by `finish`, so a refused text leaves `out` as it was. Invariants:
/// `out.capacity() >= base + src.len()` (reserved by [`Compact::new`]) and
/// `written <= copied <= src.len()` (each flush writes what it skips past, no more), so
/// writing at `written` as many bytes as are left in `src` after `copied` stays inside the
/// allocation.
struct Compact<'o, const COPY: bool> {
    out: &'o mut Vec<u8>,
    base: usize,
    written: usize,
    copied: usize,
}

impl<'o, const COPY: bool> Compact<'o, COPY> {
    fn new(out: &'o mut Vec<u8>, src: &[u8]) -> Self {
        if COPY {
            // The compact text is never longer than `src`.
            out.reserve(src.len());
        }
        Compact {
            base: out.len(),
            out,
            written: 0,
            copied: 0,
        }
    }

    /// Skips the whitespace at `i` (`b` is the byte there) and returns where it ends and the
    /// byte there; whitespace flushes what came before it. One space or newline between
    /// tokens (`"a": 1, "b": 2`) is handled here; longer runs out of line.
    #[inline(always)]
    fn ws(&mut self, src: &[u8], i: usize, b: u8) -> (usize, u8) {
        if !is_ws(b) {
            return (i, b);
        }
        let next = peek(src, i + 1);
        if is_ws(next) {
            return self.ws_run(src, i);
        }
        self.flush(src, i);
        self.copied = i + 1;
        (i + 1, next)
    }

    #[cold]
    #[inline(never)]
    fn ws_run(&mut self, src: &[u8], from: usize) -> (usize, u8) {
        let mut i = from + 1;
        let mut b = peek(src, i);
        while is_ws(b) {
            i += 1;
            b = peek(src, i);
        }
        self.flush(src, from);
        self.copied = i;
        (i, b)
    }

    /// Copies `src[copied..to]` into `out`'s spare capacity. Pieces between whitespace are
    /// mostly short: one of up to 32 bytes is copied as two 16-byte blocks (running past the
    /// piece, into bytes written again later), not with a `memcpy` call.
    #[inline(always)]
    fn flush(&mut self, src: &[u8], to: usize) {
        if !COPY {
            return;
        }
        let piece = &src[self.copied..to];
        let n = piece.len();
        // SAFETY: the destination, `written` bytes past `base`, is spare capacity, which no
        // reference points into, with room for `src.len() - copied` bytes (struct invariants).
        // The 32-byte copy is taken only when `copied + 32 <= src.len()` (checked): its source
        // is inside `src` and its destination has room for 32. Otherwise exactly the piece is
        // copied (`written + n <= copied + n = to <= src.len()`). Unaligned reads and writes
        // of byte arrays are allowed. Only the first `n` bytes count as written.
        unsafe {
            let dst = self.out.as_mut_ptr().add(self.base + self.written);
            if n <= 32 && self.copied + 32 <= src.len() {
                let from = src.as_ptr().add(self.copied);
                let blocks = from.cast::<[[u8; 16]; 2]>().read_unaligned();
                dst.cast::<[[u8; 16]; 2]>().write_unaligned(blocks);
            } else {
                std::ptr::copy_nonoverlapping(piece.as_ptr(), dst, n);
            }
        }
        self.written += n;
    }

    /// Copies the rest of `src` and makes everything written part of `out`.
    fn finish(mut self, src: &[u8]) {
        if !COPY {
            return;
        }
        let rest = &src[self.copied..];
        // SAFETY: as in `flush`, the destination is spare capacity with room for the
        // `src.len() - copied = rest.len()` bytes copied. The `base + written` bytes before it are
        // initialized (the first `base` were `out`'s, the rest were written by `flush`), and
        // so is `rest` once copied, so the new length covers initialized bytes only and is
        // within the capacity.
        unsafe {
            let dst = self.out.as_mut_ptr().add(self.base + self.written);
            std::ptr::copy_nonoverlapping(rest.as_ptr(), dst, rest.len());
            self.written += rest.len();
            self.out.set_len(self.base + self.written);
        }
    }
}

/// One validating pass over `src`, without recursion: containers open and close on a stack of
/// bits, one per level (`stack & 1` is the innermost: 1 for an object, 0 for an array), which
/// holds [`MAX_DEPTH`] levels in a `u128`. `KEYS`: `keys` is `Some`, and gets the top-level
/// keys.
///
/// Every error is returned with the offset where reading stopped: the same offsets and reasons
/// as the recursive-descent reader this replaced (the `json_compact` fuzz target checks them
/// against it).
#[inline(always)]
fn parse<const UTF8: bool, const COPY: bool, const KEYS: bool>(
    src: &[u8],
    top: Top,
    max_depth: u32,
    out: &mut Vec<u8>,
    mut keys: Option<KeyVisitor<'_>>,
) -> Result<(), Stop> {
    let mut cp = Compact::<COPY>::new(out, src);
    let (mut i, mut b) = cp.ws(src, 0, peek(src, 0));
    if i == src.len() {
        return Err((i, Why::Says("empty")));
    }
    if top == Top::Object && b != b'{' {
        return Err((i, Why::Says("expected a JSON object")));
    }
    // The open containers, innermost in bit 0 (1: an object, 0: an array), above a 1 that
    // marks the bottom: `stack == 1` at the top level, and the depth is the bit above it.
    let mut stack = 1u128;
    'value: loop {
        // A value starts at `i`; `b` is its first byte. Strings are the most common values:
        // tested before the jump table.
        if b == b'"' {
            i = string::<UTF8>(src, i).map_err(|at| (at, Why::Invalid))?;
        } else {
            match b {
                b'{' | b'[' => {
                    if 127 - stack.leading_zeros() >= max_depth {
                        return Err((i, Why::Says("nested too deep")));
                    }
                    let object = b == b'{';
                    stack = stack << 1 | object as u128;
                    (i, b) = cp.ws(src, i + 1, peek(src, i + 1));
                    if b != if object { b'}' } else { b']' } {
                        if object {
                            let top_level = stack == 0b11;
                            (i, b) = member::<UTF8, COPY, KEYS>(
                                src, i, b, top_level, &mut cp, &mut keys,
                            )?;
                        }
                        continue 'value;
                    }
                    i += 1;
                    stack >>= 1;
                }
                b't' => i = literal(src, i, b"true")?,
                b'f' => i = literal(src, i, b"false")?,
                b'n' => i = literal(src, i, b"null")?,
                b'-' | b'0'..=b'9' => i = number(src, i)?,
                _ => return Err((i, Why::Invalid)),
            }
        }
        // After a value: close containers until one goes on after a comma.
        while stack != 1 {
            (i, b) = cp.ws(src, i, peek(src, i));
            let object = stack & 1 != 0;
            match (b, object) {
                (b',', _) => {
                    (i, b) = cp.ws(src, i + 1, peek(src, i + 1));
                    if object {
                        let top_level = stack == 0b11;
                        (i, b) =
                            member::<UTF8, COPY, KEYS>(src, i, b, top_level, &mut cp, &mut keys)?;
                    }
                    continue 'value;
                }
                (b'}', true) | (b']', false) => {
                    i += 1;
                    stack >>= 1;
                }
                _ => return Err((i, Why::Invalid)),
            }
        }
        break;
    }
    let (i, _) = cp.ws(src, i, peek(src, i));
    if i != src.len() {
        return Err((i, Why::Says("more text after the JSON value")));
    }
    cp.finish(src);
    Ok(())
}

/// An object member up to its value (`i` at the key, `b` the byte there): `"key"`,
/// whitespace, `:`, whitespace. Returns where the value starts and its first byte.
#[inline(always)]
fn member<const UTF8: bool, const COPY: bool, const KEYS: bool>(
    src: &[u8],
    i: usize,
    b: u8,
    top_level: bool,
    cp: &mut Compact<'_, COPY>,
    keys: &mut Option<KeyVisitor<'_>>,
) -> Result<(usize, u8), Stop> {
    const KEY: Why = Why::Says("expected a string key");
    if b != b'"' {
        return Err((i, KEY));
    }
    let end = string::<UTF8>(src, i).map_err(|at| (at, KEY))?;
    if KEYS
        && top_level
        && let Some(visit) = keys.as_deref_mut()
    {
        visit_key(visit, &src[i..end]).map_err(|reason| (i, Why::Visitor(reason)))?;
    }
    let (mut j, mut b) = (end, peek(src, end));
    if b != b':' {
        // Compact text has the colon right after the key; anything else is slower.
        (j, b) = cp.ws(src, j, b);
        if b != b':' {
            return Err((j, Why::Invalid));
        }
    }
    Ok(cp.ws(src, j + 1, peek(src, j + 1)))
}

/// Hands a key (`quoted`: its literal, quotes included) to the key visitor.
#[cold]
fn visit_key(visit: KeyVisitor<'_>, quoted: &[u8]) -> Result<(), String> {
    let raw = &quoted[1..quoted.len() - 1];
    if raw.contains(&b'\\') {
        // Rare: decode the escapes (already validated) to compare what the key means.
        let key: String = serde_json::from_slice(quoted).unwrap_or_default();
        visit(&key)
    } else {
        // `string` checked the key's UTF-8 (or the whole text is known to be UTF-8).
        visit(std::str::from_utf8(raw).unwrap_or_default())
    }
}

#[inline(always)]
fn literal(src: &[u8], i: usize, word: &[u8]) -> Result<usize, Stop> {
    if src[i..].starts_with(word) {
        Ok(i + word.len())
    } else {
        Err((i, Why::Invalid))
    }
}

/// Skips digits from `i`; where they end.
#[inline(always)]
fn digits(src: &[u8], mut i: usize) -> usize {
    while peek(src, i).is_ascii_digit() {
        i += 1;
    }
    i
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` from `i`; where it ends (what follows is
/// the caller's to judge).
#[inline(always)]
fn number(src: &[u8], mut i: usize) -> Result<usize, Stop> {
    if peek(src, i) == b'-' {
        i += 1;
    }
    match peek(src, i) {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(src, i + 1),
        _ => return Err((i, Why::Invalid)),
    }
    if peek(src, i) == b'.' {
        let end = digits(src, i + 1);
        if end == i + 1 {
            return Err((end, Why::Invalid));
        }
        i = end;
    }
    if let b'e' | b'E' = peek(src, i) {
        i += 1;
        if let b'+' | b'-' = peek(src, i) {
            i += 1;
        }
        let end = digits(src, i);
        if end == i {
            return Err((end, Why::Invalid));
        }
        i = end;
    }
    Ok(i)
}

/// A string literal at `at` (its opening quote), checked; returns the offset after its closing
/// quote, or where reading stopped. Only quotes, backslashes and control characters stop the
/// scan ([`scan_string`]), which also notes whether a byte ≥ 0x80 was passed: the string's
/// UTF-8 is then checked at its closing quote (unless the text is known to be UTF-8).
#[inline(always)]
fn string<const UTF8: bool>(src: &[u8], at: usize) -> Result<usize, usize> {
    let start = at + 1;
    let mut high = 0u32;
    let mut i = start;
    loop {
        i = scan_string::<UTF8>(src, i, &mut high);
        match peek(src, i) {
            b'"' => {
                if !UTF8 && high != 0 && std::str::from_utf8(&src[start..i]).is_err() {
                    // Where exactly does not matter: the whole text is then refused as not
                    // UTF-8 (`run`).
                    return Err(i);
                }
                return Ok(i + 1);
            }
            b'\\' => i = escape(src, i)?,
            // A control character, or the end of the input.
            _ => return Err(i),
        }
    }
}

/// An escape at `i` (its backslash): one of `"\/bfnrt`, or `u` with 4 hex digits where a high
/// surrogate must be followed by `\u` and a low one, and a low one may not stand alone. Returns
/// the offset after it, or where reading stopped.
#[cold]
#[inline(never)]
fn escape(src: &[u8], i: usize) -> Result<usize, usize> {
    let i = i + 1;
    match peek(src, i) {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Ok(i + 1),
        b'u' => {
            let i = i + 1;
            match hex4(src, i) {
                Some(0xD800..=0xDBFF) => {
                    let i = i + 4;
                    if !src[i..].starts_with(b"\\u") {
                        return Err(i);
                    }
                    let i = i + 2;
                    match hex4(src, i) {
                        Some(0xDC00..=0xDFFF) => Ok(i + 4),
                        Some(_) => Err(i + 4),
                        None => Err(i),
                    }
                }
                Some(0xDC00..=0xDFFF) => Err(i + 4),
                None => Err(i),
                Some(_) => Ok(i + 4),
            }
        }
        _ => Err(i),
    }
}

/// The four hex digits at `i`, if all four are there.
#[inline]
fn hex4(src: &[u8], i: usize) -> Option<u16> {
    let digits = src.get(i..i + 4)?;
    let mut v = 0u16;
    for &d in digits {
        let d = HEX_VALUE[d as usize];
        if d > 0xf {
            return None;
        }
        v = v << 4 | d as u16;
    }
    Some(v)
}

/// The index of the first byte at or after `from` that ends a run of plain string bytes (below
/// 0x20, `"` or `\\`), or `bytes.len()`, like [`next_special`]. Unless the text is known to be
/// UTF-8, it also sets bits in `high` if a byte ≥ 0x80 was among those passed (bytes of the
/// last block past the stop may be counted too, which only costs a needless check).
///
/// x86-64: 16 bytes per step with SSE2 (part of the x86-64 baseline, so no run-time detection);
/// the last partial block is read as the input's last 16 bytes, shifted. Elsewhere, and for
/// inputs shorter than 16 bytes: eight bytes per step ([`scan_words`]).
#[inline(always)]
fn scan_string<const UTF8: bool>(bytes: &[u8], mut from: usize, high: &mut u32) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8,
            _mm_or_si128, _mm_set1_epi8,
        };
        // Bit k: byte k of `v` is a quote, a backslash or below 0x20; and bit k: byte k ≥ 0x80.
        #[inline(always)]
        fn masks(v: __m128i) -> (u32, u32) {
            // SAFETY: these intrinsics only need SSE2, which every x86-64 CPU has: it is part
            // of the x86-64 baseline that the target enables (no run-time detection needed).
            unsafe {
                let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
                let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
                // Unsigned v ≤ 0x1f ⟺ max(v, 0x1f) = 0x1f.
                let limit = _mm_set1_epi8(0x1f);
                let control = _mm_cmpeq_epi8(_mm_max_epu8(v, limit), limit);
                let stops = _mm_or_si128(_mm_or_si128(quote, backslash), control);
                (_mm_movemask_epi8(stops) as u32, _mm_movemask_epi8(v) as u32)
            }
        }
        let len = bytes.len();
        while from + 16 <= len {
            // SAFETY: `from + 16 <= len`, so the 16 bytes read are inside `bytes`;
            // `_mm_loadu_si128` has no alignment requirement and needs only SSE2 (above).
            let v = unsafe { _mm_loadu_si128(bytes.as_ptr().add(from).cast()) };
            let (stops, highs) = masks(v);
            if !UTF8 {
                *high |= highs;
            }
            if stops != 0 {
                return from + stops.trailing_zeros() as usize;
            }
            from += 16;
        }
        if from < len && len >= 16 {
            // The last 16 bytes of the input; the `shift` bytes before `from` are dropped.
            let base = len - 16;
            let shift = from - base; // 1..=15, as `from + 16 > len`
            // SAFETY: `base + 16 == len`: the 16 bytes read are the last ones of `bytes`.
            let v = unsafe { _mm_loadu_si128(bytes.as_ptr().add(base).cast()) };
            let (stops, highs) = masks(v);
            if !UTF8 {
                *high |= highs >> shift;
            }
            let stops = stops >> shift;
            return if stops != 0 {
                from + stops.trailing_zeros() as usize
            } else {
                len
            };
        }
    }
    scan_words::<UTF8>(bytes, from, high)
}

/// [`scan_string`] eight bytes per step ([`specials8`]), then byte by byte: the whole scan
/// where there is no SSE2, and on x86-64 for inputs shorter than 16 bytes (out of line there,
/// so that the hot loop stays small).
#[cfg_attr(target_arch = "x86_64", cold, inline(never))]
#[cfg_attr(not(target_arch = "x86_64"), inline(always))]
fn scan_words<const UTF8: bool>(bytes: &[u8], mut from: usize, high: &mut u32) -> usize {
    while let Some(word) = bytes.get(from..from + 8) {
        let w = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        if !UTF8 {
            *high |= (w & 0x8080_8080_8080_8080 != 0) as u32;
        }
        let flags = specials8(w);
        if flags != 0 {
            return from + (flags.trailing_zeros() / 8) as usize;
        }
        from += 8;
    }
    while let Some(&b) = bytes.get(from) {
        if ESCAPE[b as usize] != 0 {
            break;
        }
        if !UTF8 {
            *high |= (b >> 7) as u32;
        }
        from += 1;
    }
    from
}

/// The member names of one object seen so far, for "appears twice": a scan while they are few
/// (faster than hashing), a set past [`Seen::SCAN`] (a scan made many members quadratic).
pub(crate) struct Seen<T> {
    names: Vec<T>,
    index: std::collections::HashSet<T>,
}

impl<T: Eq + std::hash::Hash + Clone> Seen<T> {
    const SCAN: usize = 32;

    pub(crate) fn new() -> Seen<T> {
        Seen {
            names: Vec::new(),
            index: std::collections::HashSet::new(),
        }
    }

    /// Adds `name`; `false` (and nothing added) when it was seen already.
    pub(crate) fn insert(&mut self, name: T) -> bool {
        let repeated = if self.index.is_empty() {
            self.names.contains(&name)
        } else {
            self.index.contains(&name)
        };
        if repeated {
            return false;
        }
        if !self.index.is_empty() {
            self.index.insert(name.clone());
        } else if self.names.len() + 1 == Self::SCAN {
            self.index.extend(self.names.iter().cloned());
            self.index.insert(name.clone());
        }
        self.names.push(name);
        true
    }

    /// Every name, in the order added.
    pub(crate) fn names(&self) -> &[T] {
        &self.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_finds_repeats_before_and_past_its_scan_and_keeps_the_order() {
        let mut seen = Seen::new();
        for i in 0..100 {
            assert!(seen.insert(i), "{i}");
            assert!(!seen.insert(i / 2), "{i}: {} was seen", i / 2);
        }
        assert_eq!(seen.names(), (0..100).collect::<Vec<_>>());
    }

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

    /// A strip of whitespace outside strings, byte by byte: what the compactor must write.
    fn strip(src: &[u8]) -> Vec<u8> {
        let (mut out, mut in_str, mut esc) = (Vec::new(), false, false);
        for &b in src {
            if in_str {
                (esc, in_str) = (!esc && b == b'\\', esc || b != b'"');
                out.push(b);
            } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                in_str = b == b'"';
                out.push(b);
            }
        }
        out
    }

    #[test]
    fn the_string_scans_stop_at_the_first_special_byte_and_see_high_bytes() {
        let stops = [b'"', b'\\', 0x00, 0x1f];
        // Under Miri (which checks the unaligned loads and the tail window's offsets) only
        // the lengths, starts and stops around the 16-byte blocks: every one takes too long.
        let picks = |lo: usize, hi: usize| -> Vec<usize> {
            if cfg!(miri) {
                let mut v = vec![lo, lo + 1, (lo + hi) / 2, hi.saturating_sub(1), hi];
                v.retain(|&x| (lo..=hi).contains(&x));
                v.sort_unstable();
                v.dedup();
                v
            } else {
                (lo..=hi).collect()
            }
        };
        let lens: Vec<usize> = if cfg!(miri) {
            vec![0, 1, 15, 16, 17, 31, 32, 33, 47]
        } else {
            (0..48).collect()
        };
        for len in lens {
            for from in picks(0, len) {
                for stop_at in picks(from, len) {
                    for (k, &stop) in stops.iter().enumerate() {
                        let mut bytes: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                        if stop_at < len {
                            bytes[stop_at] = stop;
                        }
                        // A high byte before the stop (when there is room), or none.
                        let high_at = (k % 2 == 0 && stop_at > from).then_some(from);
                        if let Some(h) = high_at {
                            bytes[h] = 0xc3;
                        }
                        let want = if stop_at < len { stop_at } else { len };
                        type Scan = fn(&[u8], usize, &mut u32) -> usize;
                        let scans: [(&str, Scan); 2] = [
                            ("sse2/words", scan_string::<false>),
                            ("words", scan_words::<false>),
                        ];
                        for (name, scan) in scans {
                            let mut high = 0;
                            let got = scan(&bytes, from, &mut high);
                            assert_eq!(got, want, "{name} {len} {from} {stop_at} {bytes:?}");
                            if high_at.is_some() {
                                assert_ne!(high, 0, "{name} missed a high byte in {bytes:?}");
                            }
                        }
                        let mut ignored = 0;
                        assert_eq!(scan_string::<true>(&bytes, from, &mut ignored), want);
                    }
                }
            }
        }
    }

    #[test]
    fn whitespace_around_pieces_of_every_length_is_dropped() {
        // Under Miri, the lengths around the 16- and 32-byte stores only.
        let lengths: Vec<usize> = if cfg!(miri) {
            vec![0, 1, 15, 16, 17, 31, 32, 33, 79]
        } else {
            (0..80).collect()
        };
        for k in lengths {
            let word = "x y".repeat(k / 3 + 1)[..k].to_string();
            for tail in ["", " ", "\n  ", "\t"] {
                for src in [
                    format!("[\"{word}\" ,1]{tail}"),
                    format!("{{ \"{word}\": [ \"{word}\" , {k} ] }}{tail}"),
                    format!("{tail}[{k},\"{word}\"\n,\n\"{word}\"]"),
                ] {
                    let mut out = b"prefix".to_vec();
                    assert!(
                        append_compact(&mut out, src.as_bytes(), Top::Any),
                        "{src:?}"
                    );
                    assert_eq!(out[6..], strip(src.as_bytes()), "{src:?}");
                    let mut from_str = b"prefix".to_vec();
                    assert!(append_compact_str(&mut from_str, &src, Top::Any, MAX_DEPTH));
                    assert_eq!(from_str, out);
                }
            }
        }
    }

    #[test]
    fn refusals_say_where_and_why_as_before() {
        let refused = |src: &[u8]| {
            let r = check_value(src, 2).unwrap_err();
            (r.at, r.reason)
        };
        for (src, at, reason) in [
            (&br#"{"a":tru}"#[..], 5, "invalid JSON"),
            (br#"{"a" 1}"#, 5, "invalid JSON"),
            (b"{1:2}", 1, "expected a string key"),
            (b"{\"a\x01\":1}", 3, "expected a string key"),
            (br#"{"a":1,}"#, 7, "expected a string key"),
            (br#"["\u12"]"#, 4, "invalid JSON"),
            (br#"["\ud800x"]"#, 8, "invalid JSON"),
            (br#"["\ud800\u0041"]"#, 14, "invalid JSON"),
            (br#"["\udc00"]"#, 8, "invalid JSON"),
            (br#"["\x"]"#, 3, "invalid JSON"),
            (b"[1.]", 3, "invalid JSON"),
            (b"[1e+]", 4, "invalid JSON"),
            (b"[-]", 2, "invalid JSON"),
            (b"[01]", 2, "invalid JSON"),
            (b"[1 }", 3, "invalid JSON"),
            (b"{} x", 3, "more text after the JSON value"),
            (b" \n ", 3, "empty"),
            (b"[[[]]]", 2, "nested too deep"),
            (b"\"abc", 4, "invalid JSON"),
            // Not UTF-8 wins over any other reason, wherever it is.
            (b"{\"a\":\"\xff\"}", 6, "not UTF-8"),
            (b"{\"a\":tru} \xff", 10, "not UTF-8"),
            (b"[\"\xe2\x82\"]", 2, "not UTF-8"),
        ] {
            assert_eq!(
                refused(src),
                (at, reason.to_string()),
                "{:?}",
                String::from_utf8_lossy(src)
            );
        }
        // The same without the UTF-8 check, for `&str` input.
        let mut out = Vec::new();
        assert!(!append_compact_str(
            &mut out,
            r#"{"a":"\ud800"}"#,
            Top::Object,
            MAX_DEPTH
        ));
        assert!(out.is_empty());
        assert!(append_compact_str(
            &mut out,
            "{\"é\": \"中😀\"}",
            Top::Object,
            MAX_DEPTH
        ));
        assert_eq!(out, "{\"é\":\"中😀\"}".as_bytes());
    }

    #[test]
    fn nesting_is_counted_to_127_levels_of_either_kind() {
        // Alternating objects and arrays, so both halves of the 128-bit stack hold both kinds.
        let nest = |n: usize| {
            let (mut open, mut close) = (String::new(), String::new());
            for level in 0..n {
                if level % 3 == 0 {
                    open.push_str("{\"k\":");
                    close.insert(0, '}');
                } else {
                    open.push('[');
                    close.insert(0, ']');
                }
            }
            (open, close)
        };
        let (open, close) = nest(127);
        let ok = format!("{open}1{close}");
        assert!(is_valid(ok.as_bytes()));
        assert!(serde_json::from_str::<serde_json::Value>(&ok).is_ok());
        let (open, close) = nest(128);
        let deep = format!("{open}1{close}");
        let r = check_value(deep.as_bytes(), MAX_DEPTH).unwrap_err();
        assert_eq!(r.reason, "nested too deep");
        assert_eq!(r.at, open.len() - 1, "at the 128th opening bracket");
        // A wrong closer deep down is found where it stands.
        let (open, close) = nest(100);
        let wrong = format!("{open}1]{}", &close[1..]);
        let r = check_value(wrong.as_bytes(), MAX_DEPTH).unwrap_err();
        assert_eq!((r.at, r.reason.as_str()), (open.len() + 1, "invalid JSON"));
        // A limit above MAX_DEPTH counts as MAX_DEPTH.
        assert!(check_value(deep.as_bytes(), 1000).is_err());
        assert!(check_value(ok.as_bytes(), 1000).is_ok());
    }
}
