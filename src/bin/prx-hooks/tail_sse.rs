//! `tail`'s incremental SSE parser: bytes in as they arrive, whole events out.
//!
//! It never holds more than a bound, whatever the server sends (docs/cli.md § `tail`).
//!
//! Every field is bounded, not only `data:`:
//!
//! * `data:` lines are appended to the event's data as they arrive; the data, the event's
//!   `id` and its name together never pass `max` (`--max-event-bytes`). An event that would is
//!   marked [`Ev::oversize`]: what it held is freed and its data lines are dropped as they
//!   arrive.
//! * `id:` keeps at most [`MAX_ID_BYTES`]: a longer id is dropped as it arrives and the event
//!   is marked [`Ev::long_id`] (the id is ignored: it would be sent back on every reconnect).
//! * `event:` keeps at most [`MAX_NAME_BYTES`] (a bus topic is at most 256 bytes): a longer
//!   name is dropped as it arrives and the event is marked [`Ev::long_name`] (skipped: what it
//!   is cannot be known).
//! * Comments, `retry:` (tail keeps its own backoff) and unknown fields are ignored, as SSE
//!   says, and dropped as they arrive: only the field name is looked at, at most
//!   [`MAX_FIELD_NAME`] bytes of it.
//!
//! So at any moment the parser holds at most `max` bytes of an event plus one field name and
//! one `id`/`event` value being read (under 300 bytes).

/// The longest `id:` kept. This server's ids are `<instance>-<n>` (16 hex digits, a dash and
/// a number: at most 37 bytes); a longer one is ignored.
pub(super) const MAX_ID_BYTES: usize = 256;

/// The longest `event:` name kept: a bus topic is at most 256 bytes
/// (`prx_hooks::bus::MAX_TOPIC_LEN`), and the stream's own names are shorter.
pub(super) const MAX_NAME_BYTES: usize = prx_hooks::bus::MAX_TOPIC_LEN;

/// The longest field name read: longer than every field SSE defines (`event`, `retry`).
const MAX_FIELD_NAME: usize = 8;

/// One event as SSE defines it.
#[derive(Default, Debug)]
pub(super) struct Ev {
    pub id: Option<String>,
    /// An `id:` longer than [`MAX_ID_BYTES`] was ignored (never held).
    pub long_id: bool,
    pub event: String,
    /// Its `event:` name was longer than [`MAX_NAME_BYTES`] (never held): the event is skipped.
    pub long_name: bool,
    pub data: String,
    /// It was longer than the cap: its data was dropped as it arrived (never held); its other
    /// fields are kept.
    pub oversize: bool,
}

/// The field of the line being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    /// Its name is still being read (no `:` yet).
    Name,
    Data,
    Id,
    Event,
    /// A comment, `retry:`, an unknown field, or the rest of a data line past the cap:
    /// dropped as it arrives.
    Dropped,
}

/// Incremental SSE parser (module docs). Lines end with LF or CRLF.
///
/// Invariant: `ev.id + ev.event + data <= max` bytes, `name <= MAX_FIELD_NAME + 1` and `value
/// <= max(MAX_ID_BYTES, MAX_NAME_BYTES) + 2` (one byte to tell "too long", one for a CR).
pub(super) struct Parser {
    max: usize,
    field: Field,
    /// The current line's field name, while `field` is `Name`.
    name: Vec<u8>,
    /// The current line's `id`/`event` value.
    value: Vec<u8>,
    /// The value's leading space (SSE strips one) is still to be skipped.
    strip_space: bool,
    ev: Ev,
    /// The event's data lines, joined by `\n`.
    data: Vec<u8>,
    /// The event has at least one data line (the next one is preceded by `\n`).
    has_data: bool,
    /// The event has a `data`, `id` or `event` field: a blank line dispatches it (comments,
    /// `retry` and unknown fields make no event).
    any: bool,
}

impl Parser {
    pub(super) fn new(max: usize) -> Parser {
        Parser {
            max,
            field: Field::Name,
            name: Vec::new(),
            value: Vec::new(),
            strip_space: false,
            ev: Ev::default(),
            data: Vec::new(),
            has_data: false,
            any: false,
        }
    }

    /// Bytes the parser holds now (what the invariant bounds).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.ev.id.as_ref().map_or(0, String::len)
            + self.ev.event.len()
            + self.data.len()
            + self.name.len()
            + self.value.len()
    }

    /// Takes the next bytes of the stream; returns the events they completed.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> Vec<Ev> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let (part, ended) = match memchr::memchr(b'\n', bytes) {
                Some(i) => {
                    let p = &bytes[..i];
                    bytes = &bytes[i + 1..];
                    (p, true)
                }
                None => (std::mem::take(&mut bytes), false),
            };
            self.take(part);
            if ended && let Some(ev) = self.end_line() {
                out.push(ev);
            }
        }
        out
    }

    /// Bytes of the current line (no `\n` among them).
    fn take(&mut self, mut part: &[u8]) {
        if self.field == Field::Name {
            let colon = memchr::memchr(b':', part);
            let name = &part[..colon.unwrap_or(part.len())];
            if self.name.len() + name.len() > MAX_FIELD_NAME {
                // Longer than any field SSE defines: an unknown field, ignored.
                self.name.clear();
                self.field = Field::Dropped;
                return;
            }
            self.name.extend_from_slice(name);
            let Some(colon) = colon else {
                return;
            };
            part = &part[colon + 1..];
            self.field = match &self.name[..] {
                b"data" => self.start_data(),
                b"id" => Field::Id,
                b"event" => Field::Event,
                // A comment (an empty name), `retry`, anything else: ignored.
                _ => Field::Dropped,
            };
            if matches!(&self.name[..], b"data" | b"id" | b"event") {
                self.any = true;
            }
            self.name.clear();
            self.strip_space = true;
        }
        if self.strip_space && !part.is_empty() {
            self.strip_space = false;
            if part[0] == b' ' {
                part = &part[1..];
            }
        }
        match self.field {
            Field::Name | Field::Dropped => {}
            Field::Data => {
                let other = self.ev.id.as_ref().map_or(0, String::len) + self.ev.event.len();
                if other + self.data.len() + part.len() > self.max {
                    self.ev.oversize = true;
                    self.data = Vec::new();
                    self.field = Field::Dropped;
                } else {
                    self.data.extend_from_slice(part);
                }
            }
            Field::Id | Field::Event => {
                let limit = MAX_ID_BYTES.max(MAX_NAME_BYTES) + 2;
                let room = limit.saturating_sub(self.value.len());
                self.value.extend_from_slice(&part[..part.len().min(room)]);
            }
        }
    }

    /// A data line begins: its separator from the previous one, unless the event is already
    /// over the cap.
    fn start_data(&mut self) -> Field {
        if self.ev.oversize {
            return Field::Dropped;
        }
        if self.has_data {
            let other = self.ev.id.as_ref().map_or(0, String::len) + self.ev.event.len();
            if other + self.data.len() + 1 > self.max {
                self.ev.oversize = true;
                self.data = Vec::new();
                return Field::Dropped;
            }
            self.data.push(b'\n');
        }
        self.has_data = true;
        Field::Data
    }

    /// The current line ended: an event when it was the blank line ending one.
    fn end_line(&mut self) -> Option<Ev> {
        let field = std::mem::replace(&mut self.field, Field::Name);
        self.strip_space = false;
        match field {
            Field::Name => {
                // No colon: the whole line is a field name with an empty value, or blank.
                let mut n = self.name.len();
                if n > 0 && self.name[n - 1] == b'\r' {
                    n -= 1;
                }
                let blank = n == 0;
                match &self.name[..n] {
                    b"data" => {
                        self.any = true;
                        self.start_data();
                    }
                    b"id" => {
                        self.any = true;
                        self.ev.id = Some(String::new());
                    }
                    b"event" => {
                        self.any = true;
                        self.ev.event.clear();
                    }
                    _ => {}
                }
                self.name.clear();
                if blank {
                    return self.dispatch();
                }
            }
            Field::Data => {
                if self.data.last() == Some(&b'\r') {
                    self.data.pop();
                }
            }
            Field::Id | Field::Event => {
                if self.value.last() == Some(&b'\r') {
                    self.value.pop();
                }
                let limit = if field == Field::Id {
                    MAX_ID_BYTES
                } else {
                    MAX_NAME_BYTES
                };
                if self.value.len() > limit {
                    // Ignored, as if the line had not been sent (an earlier usable one stays).
                    if field == Field::Id {
                        self.ev.long_id = true;
                    } else {
                        self.ev.long_name = true;
                    }
                } else {
                    let text = lossy(&self.value);
                    if field == Field::Id {
                        self.ev.id = Some(text);
                    } else {
                        self.ev.event = text;
                    }
                    // Held against the cap like data: an event's fields together.
                    self.fit();
                }
                self.value.clear();
            }
            Field::Dropped => {}
        }
        None
    }

    /// After an id or a name was kept: the event still fits the cap, or it is oversize.
    fn fit(&mut self) {
        let other = self.ev.id.as_ref().map_or(0, String::len) + self.ev.event.len();
        if other + self.data.len() > self.max {
            self.ev.oversize = true;
            self.data = Vec::new();
        }
    }

    fn dispatch(&mut self) -> Option<Ev> {
        if !std::mem::take(&mut self.any) {
            return None;
        }
        let mut ev = std::mem::take(&mut self.ev);
        ev.data = lossy_owned(std::mem::take(&mut self.data));
        self.has_data = false;
        Some(ev)
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn lossy_owned(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_is_parsed_across_chunk_boundaries() {
        let mut p = Parser::new(1 << 20);
        assert!(p.feed(b"id: a-1\nevent: x\nda").is_empty());
        let evs = p.feed(b"ta: {}\n\n: keep-alive\n\nevent: y\r\ndata: 1\r\ndata: 2\r\n\r\n");
        assert_eq!(evs.len(), 2);
        assert_eq!(
            (
                evs[0].id.as_deref(),
                evs[0].event.as_str(),
                evs[0].data.as_str()
            ),
            (Some("a-1"), "x", "{}")
        );
        assert_eq!((evs[1].event.as_str(), evs[1].data.as_str()), ("y", "1\n2"));
        // A byte at a time, SSE's corner cases: no space after the colon, one space stripped
        // and only one, a bare `data` line, a field name split across chunks.
        let text = b"data:a\ndata:  b\ndata\nid\nevent:e\n\n";
        let mut p = Parser::new(1 << 20);
        let mut evs = Vec::new();
        for b in text {
            evs.extend(p.feed(&[*b]));
        }
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "a\n b\n");
        assert_eq!(evs[0].id.as_deref(), Some(""));
        assert_eq!(evs[0].event, "e");
    }

    #[test]
    fn an_event_never_holds_more_than_the_cap() {
        let mut p = Parser::new(1024);
        let mut evs = p.feed(b"id: x-1\ndata: ");
        for _ in 0..100 {
            evs.extend(p.feed(&[b'A'; 1000]));
            assert!(p.held() <= 1024);
        }
        evs.extend(p.feed(b"\ndata: more\n\nid: x-2\ndata: {}\n\n"));
        assert_eq!(evs.len(), 2);
        assert!(evs[0].oversize && evs[0].data.is_empty());
        assert_eq!(evs[0].id.as_deref(), Some("x-1"));
        assert!(!evs[1].oversize);
        assert_eq!(
            (evs[1].id.as_deref(), evs[1].data.as_str()),
            (Some("x-2"), "{}")
        );
        // Many data lines, each short, add up.
        let mut p = Parser::new(1024);
        let evs = p.feed(&b"data: 0123456789\n".repeat(200));
        assert!(evs.is_empty() && p.held() <= 1024);
        assert!(p.feed(b"\n")[0].oversize);
    }

    #[test]
    fn every_field_is_bounded_as_it_arrives() {
        let mut p = Parser::new(1024);
        let mut evs = Vec::new();
        for (field, byte) in [
            (&b"id: "[..], b'i'),
            (b"event: ", b'e'),
            (b"retry: ", b'9'),
            (b": ", b'c'),
            (b":", b'c'),
            (b"x-unknown-field: ", b'u'),
            (b"x-unknown-field-without-a-colon", b'u'),
        ] {
            evs.extend(p.feed(field));
            for _ in 0..100 {
                evs.extend(p.feed(&[byte; 1000]));
                assert!(p.held() <= 1024 + 300, "{field:?}: {}", p.held());
            }
            evs.extend(p.feed(b"\n"));
        }
        evs.extend(p.feed(b"data: {}\n\n"));
        assert_eq!(evs.len(), 1);
        let ev = &evs[0];
        assert!(ev.long_id && ev.id.is_none(), "{ev:?}");
        assert!(ev.long_name && ev.event.is_empty(), "{ev:?}");
        assert_eq!(ev.data, "{}");
        // At the limits: kept; one byte over: ignored.
        let id = "i".repeat(MAX_ID_BYTES);
        let name = "e".repeat(MAX_NAME_BYTES);
        let evs = p.feed(format!("id: {id}\r\nevent: {name}\r\ndata: 1\r\n\r\n").as_bytes());
        assert_eq!(evs[0].id.as_deref(), Some(id.as_str()));
        assert_eq!(evs[0].event, name);
        assert!(!evs[0].long_id && !evs[0].long_name);
        let evs = p.feed(format!("id: {id}i\nevent: {name}e\ndata: 1\n\n").as_bytes());
        assert!(evs[0].long_id && evs[0].long_name && evs[0].id.is_none());
        // The id and name count against the cap with the data.
        let mut p = Parser::new(1024);
        let data = "d".repeat(1024 - 2 * 200 + 1);
        let evs = p.feed(
            format!(
                "id: {}\nevent: {}\ndata: {data}\n\n",
                "i".repeat(200),
                "e".repeat(200)
            )
            .as_bytes(),
        );
        assert!(evs[0].oversize, "{} bytes in all", 401 + data.len());
        // A stream of comments and retries holds nothing.
        let mut p = Parser::new(1024);
        for _ in 0..1000 {
            assert!(p.feed(b": keep-alive\nretry: 10\n\n").is_empty());
            assert_eq!(p.held(), 0);
        }
    }
}
