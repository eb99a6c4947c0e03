//! The strict JSON validator/compactor as `src/json.rs` had it before it was rewritten for
//! speed: a recursive descent over input checked for UTF-8 up front. Kept verbatim
//! in behaviour, in one file shared by two users:
//!
//! * the `json_compact` fuzz target, as an oracle: the new code must accept the same texts,
//!   write the same bytes, and refuse at the same offset for the same reason;
//! * `benches/serialize.rs` (included by path), as the `former` baseline measured in the same
//!   run.
//!
//! Not used by the library. Self-contained (std and serde_json only).

/// Why a text was refused: the byte offset where reading stopped, and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub at: usize,
    pub reason: String,
}

/// The visitor of an object's top-level keys.
pub type KeyVisitor<'k> = &'k mut (dyn FnMut(&str) -> Result<(), String> + 'k);

/// The former `json::run`: validates `src` (one JSON object if `object_only`, else any value)
/// nested at most `max_depth` deep, appends it without whitespace to `out` if given (on
/// success only: on failure `out` may hold a partial copy, which the former callers truncated),
/// and hands each top-level key of an object to `keys`.
pub fn run(
    src: &[u8],
    object_only: bool,
    max_depth: u32,
    out: Option<&mut Vec<u8>>,
    keys: Option<KeyVisitor<'_>>,
) -> Result<(), Refused> {
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
    let ok = match (object_only, cx.peek()) {
        (true, Some(b'{')) | (false, Some(_)) => {
            cx.value(0) && {
                cx.skip_ws();
                cx.i == src.len() || cx.fail("more text after the JSON value")
            }
        }
        (true, Some(_)) => cx.fail("expected a JSON object"),
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

/// The former `json::append_compact_within`.
pub fn append_compact_within(
    out: &mut Vec<u8>,
    src: &[u8],
    object_only: bool,
    max_depth: u32,
) -> bool {
    let start = out.len();
    let ok = run(src, object_only, max_depth, Some(out), None).is_ok();
    if !ok {
        out.truncate(start);
    }
    ok
}

static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

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

fn specials8(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    control | has_zero(w ^ (ONES * b'"' as u64)) | has_zero(w ^ (ONES * b'\\' as u64))
}

struct Compactor<'a, 'k> {
    src: &'a [u8],
    i: usize,
    out: Option<&'a mut Vec<u8>>,
    max_depth: u32,
    copied: usize,
    keys: Option<KeyVisitor<'k>>,
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

    fn fail(&mut self, reason: &str) -> bool {
        self.refused.get_or_insert_with(|| reason.to_string());
        false
    }

    fn visit_key(&mut self, start: usize, end: usize) -> bool {
        let Some(visit) = self.keys.as_deref_mut() else {
            return true;
        };
        let raw = &self.src[start + 1..end - 1];
        let verdict = if raw.contains(&b'\\') {
            let key: String = serde_json::from_slice(&self.src[start..end]).unwrap_or_default();
            visit(&key)
        } else {
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

    fn string(&mut self) -> bool {
        self.i += 1;
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
                _ => return false,
            }
        }
    }

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
