//! A worker's batch of events as the span builder reads them: copied into one buffer by
//! [`OtelSink`](super::OtelSink)'s `deliver_batch`, so the worker's messages are free again at
//! once (it reuses them instead of allocating) and the builder reads contiguous bytes. Batches
//! go back to the sink for reuse (ARCHITECTURE.md § OpenTelemetry traces).

use crate::EventKind;
use crate::bus::Message;
use std::time::SystemTime;

/// A batch kept for reuse keeps its text buffer only up to this capacity (as a worker's
/// serialization buffer does): a burst of large events costs a reallocation, not its memory
/// for good.
const KEEP_TEXT: usize = 64 << 10;

/// One event of a [`Batch`]: its metadata, and where its strings end in the batch's text.
#[derive(Clone, Copy, Debug)]
struct Entry {
    kind: EventKind,
    seq: u64,
    timestamp: SystemTime,
    json_end: usize,
    agent_end: usize,
    session_end: usize,
}

/// Lifecycle events copied out of their messages.
///
/// Invariants: the entries' ends never decrease, and the last entry's `session_end` is the
/// text's length (0 when there are none); entry `i`'s strings start where entry `i - 1`'s
/// session ends.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    text: String,
    entries: Vec<Entry>,
}

/// A lifecycle event as the span builder reads it, from a [`Batch`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventRef<'a> {
    pub(crate) kind: EventKind,
    pub(crate) seq: u64,
    pub(crate) timestamp: SystemTime,
    pub(crate) json: &'a str,
    pub(crate) agent: &'a str,
    pub(crate) session: &'a str,
}

#[cfg(test)]
impl<'a> EventRef<'a> {
    /// The event `m` carries; `None` for a custom topic.
    pub(crate) fn of(m: &'a Message) -> Option<EventRef<'a>> {
        Some(EventRef {
            kind: m.event()?,
            seq: m.seq(),
            timestamp: m.timestamp(),
            json: m.json_str(),
            agent: m.agent(),
            session: m.session(),
        })
    }
}

/// When the event happened: by its sender's clock where it says (an ingested event's
/// `Prx-Timestamp` or agent time, kept through the spool; a NATS event's `Prx-Timestamp`),
/// else when the worker read it (docs/otel.md § Events → spans).
fn event_time(m: &Message) -> SystemTime {
    m.origin_timestamp()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .unwrap_or_else(|| m.timestamp())
}

impl Batch {
    /// Copies `m`'s event in (a custom topic is skipped).
    pub(crate) fn push(&mut self, m: &Message) {
        let Some(kind) = m.event() else { return };
        for part in [m.json_str(), m.agent(), m.session()] {
            self.text.push_str(part);
        }
        let session_end = self.text.len();
        let agent_end = session_end - m.session().len();
        self.entries.push(Entry {
            kind,
            seq: m.seq(),
            timestamp: event_time(m),
            json_end: agent_end - m.agent().len(),
            agent_end,
            session_end,
        });
    }

    /// The text `m`'s event takes in a batch.
    pub(crate) fn bytes_of(m: &Message) -> usize {
        m.json_str().len() + m.agent().len() + m.session().len()
    }

    /// Room for `events` more events of `bytes` text in all, at once.
    pub(crate) fn reserve(&mut self, events: usize, bytes: usize) {
        self.entries.reserve(events);
        self.text.reserve(bytes);
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps the first `n` events.
    pub(crate) fn truncate(&mut self, n: usize) {
        self.entries.truncate(n);
        self.text
            .truncate(self.entries.last().map_or(0, |e| e.session_end));
    }

    /// Empties the batch for reuse; a text buffer grown past [`KEEP_TEXT`] is freed.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.text.clear();
        if self.text.capacity() > KEEP_TEXT {
            self.text = String::new();
        }
    }

    /// The events, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = EventRef<'_>> + '_ {
        let mut start = 0;
        self.entries.iter().map(move |e| {
            let r = EventRef {
                kind: e.kind,
                seq: e.seq,
                timestamp: e.timestamp,
                json: &self.text[start..e.json_end],
                agent: &self.text[e.json_end..e.agent_end],
                session: &self.text[e.agent_end..e.session_end],
            };
            start = e.session_end;
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, Hooks};
    use std::time::Duration;

    #[test]
    fn a_batch_gives_back_each_event_as_its_message_had_it_and_truncates_whole_events() {
        let hooks = Hooks::builder().build().unwrap();
        let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
        let a = hooks.emitter("agent-ä", "s1");
        let b = hooks.emitter("", "");
        a.emit(Event::ToolCallStart {
            tool: "grep",
            arguments: "{\"q\":\"é\"}",
        });
        b.emit(Event::TurnComplete);
        a.emit(Event::Error {
            component: "llm",
            message: "boom",
        });
        let msgs: Vec<Message> = (0..3)
            .map(|_| sub.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        let mut batch = Batch::default();
        for m in &msgs {
            batch.push(m);
        }
        assert_eq!(batch.len(), 3);
        let got: Vec<_> = batch.iter().collect();
        for (e, m) in got.iter().zip(&msgs) {
            let want = EventRef::of(m).unwrap();
            assert_eq!(
                (e.kind, e.seq, e.timestamp, e.json, e.agent, e.session),
                (
                    want.kind,
                    want.seq,
                    want.timestamp,
                    want.json,
                    want.agent,
                    want.session
                )
            );
        }
        batch.truncate(2);
        assert_eq!(batch.len(), 2);
        let last = batch.iter().last().unwrap();
        assert_eq!((last.agent, last.json), ("", msgs[1].json_str()));
        batch.clear();
        assert!(batch.is_empty() && batch.iter().next().is_none());
        hooks.shutdown(Duration::from_secs(2));
    }
}
