//! [`Message`]: one event or publication as every sink and subscriber sees it, serialized once
//! and shared (ARCHITECTURE.md § Data flow).

use crate::event::EventKind;
use crate::json;
use std::sync::Arc;
use std::time::SystemTime;

/// A recycled message keeps its text buffer only up to this capacity (see [`Message::reuse`]).
const REUSE_KEEP: usize = 16 << 10;

/// One message on the bus: a lifecycle event's payload with its metadata, or a custom
/// publication. Cloning is cheap (one reference count); every subscriber and every sink shares
/// the same bytes, serialized once.
#[derive(Clone)]
pub struct Message(Arc<Inner>);

struct Inner {
    /// `json`, then `agent`, then `session`, then — for custom topics — the topic.
    text: String,
    json_end: usize,
    agent_end: usize,
    session_end: usize,
    topic: Option<&'static str>,
    meta: Meta,
    /// A consumed event's origin and ticket ([`crate::settle`]); never on a recycled message.
    attached: Option<Box<crate::settle::Attached>>,
}

/// A message's metadata besides its strings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub kind: Option<EventKind>,
    pub seq: u64,
    pub timestamp: SystemTime,
    pub depth: u8,
    /// Non-zero: emitted by a relay emitter (the NATS consumer's, see
    /// [`Emitter::relay_id`](crate::Emitter)) of this id; 0 for every other event.
    pub relay: u64,
}

impl Inner {
    fn set(&mut self, json: &str, agent: &str, session: &str, custom_topic: &str, meta: Meta) {
        self.text.clear();
        for part in [json, agent, session, custom_topic] {
            self.text.push_str(part);
        }
        self.json_end = json.len();
        self.agent_end = self.json_end + agent.len();
        self.session_end = self.agent_end + session.len();
        self.topic = meta.kind.map(EventKind::topic);
        self.meta = meta;
    }

    /// [`set`](Inner::set) for a lifecycle event whose payload `write` appends to the text.
    ///
    /// # Safety
    ///
    /// `write` appends valid UTF-8 only.
    unsafe fn set_with(
        &mut self,
        hint: usize,
        agent: &str,
        session: &str,
        meta: Meta,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        if self.text.capacity() > REUSE_KEEP.max(hint) {
            // A large event's buffer is given back rather than kept (see `Message::reuse`).
            self.text = String::with_capacity(hint);
        }
        self.text.clear();
        // SAFETY: the caller promises that `write` appends UTF-8 only, and it appends to a
        // `String` that is empty, so the text is valid UTF-8 when the borrow ends. (Should
        // `write` unwind, what it appended so far are whole appends of UTF-8: `Vec` growth
        // happens before a copy, never inside one.)
        let out = unsafe { self.text.as_mut_vec() };
        out.reserve(hint);
        write(out);
        debug_assert!(
            std::str::from_utf8(out).is_ok(),
            "a payload writer wrote non-UTF-8"
        );
        self.json_end = self.text.len();
        self.text.push_str(agent);
        self.agent_end = self.text.len();
        self.text.push_str(session);
        self.session_end = self.text.len();
        self.topic = meta.kind.map(EventKind::topic);
        self.meta = meta;
        self.attached = None;
    }
}

impl Message {
    pub(crate) fn new(
        json: &str,
        agent: &str,
        session: &str,
        custom_topic: &str,
        meta: Meta,
    ) -> Message {
        let len = json.len() + agent.len() + session.len() + custom_topic.len();
        let mut inner = Inner {
            text: String::with_capacity(len),
            json_end: 0,
            agent_end: 0,
            session_end: 0,
            topic: None,
            meta,
            attached: None,
        };
        inner.set(json, agent, session, custom_topic, meta);
        Message(Arc::new(inner))
    }

    /// A lifecycle event's message, its payload appended by `write` straight into the
    /// message's own text (so the pipeline serializes each event once, into the bytes every
    /// sink shares). `hint` is the room to reserve for the payload.
    ///
    /// # Safety
    ///
    /// `write` appends valid UTF-8 only (as the payload writers do: ASCII punctuation, digits
    /// and whole copies of `&str` input).
    pub(crate) unsafe fn lifecycle(
        hint: usize,
        agent: &str,
        session: &str,
        meta: Meta,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Message {
        let mut inner = Inner {
            text: String::new(),
            json_end: 0,
            agent_end: 0,
            session_end: 0,
            topic: None,
            meta,
            attached: None,
        };
        let hint = hint + agent.len() + session.len();
        // SAFETY: passed on from our caller.
        unsafe { inner.set_with(hint, agent, session, meta, write) };
        Message(Arc::new(inner))
    }

    /// [`lifecycle`](Message::lifecycle) into this message's own buffers, keeping its
    /// allocations, if nobody else holds it any more; `false` (and nothing written) if someone
    /// does. Pipeline workers recycle delivered messages this way, so a steady flow allocates
    /// nothing and never frees memory across threads.
    ///
    /// A buffer grown past [`REUSE_KEEP`] by a large event is given back rather than kept: a
    /// worker holds thousands of these messages, and one burst of large events must not pin
    /// their size for good.
    ///
    /// # Safety
    ///
    /// As for [`lifecycle`](Message::lifecycle).
    pub(crate) unsafe fn rewrite(
        &mut self,
        hint: usize,
        agent: &str,
        session: &str,
        meta: Meta,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> bool {
        match Arc::get_mut(&mut self.0) {
            Some(inner) => {
                let hint = hint + agent.len() + session.len();
                // SAFETY: passed on from our caller.
                unsafe { inner.set_with(hint, agent, session, meta, write) };
                true
            }
            None => false,
        }
    }

    /// Whether nobody but the caller holds this message (so [`rewrite`](Message::rewrite)
    /// would succeed).
    #[inline]
    pub(crate) fn is_unshared(&mut self) -> bool {
        Arc::get_mut(&mut self.0).is_some()
    }

    /// Asks for this message's reference counts and first bytes in this core's cache, for
    /// writing: the worker calls it on the message it will reuse next, which a subscriber on
    /// another core let go of last, so that the reuse does not start with a cross-core miss.
    /// A hint only: no access happens in the memory model's sense.
    #[inline]
    pub(crate) fn prefetch_for_reuse(&self) {
        #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
        {
            let data = Arc::as_ptr(&self.0).cast::<i8>();
            // The counts sit just before the data in the same allocation; `wrapping_sub` keeps
            // this free of any pointer-arithmetic precondition, and a prefetch of any address
            // is harmless.
            let counts = data.wrapping_sub(2 * std::mem::size_of::<usize>());
            // SAFETY: prefetching never faults and has no effect on program semantics.
            unsafe {
                use std::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
                _mm_prefetch::<{ _MM_HINT_ET0 }>(counts);
                _mm_prefetch::<{ _MM_HINT_ET0 }>(data);
            }
        }
    }

    /// Attaches what the NATS consumer attached to a consumed event, if nobody else holds the
    /// message yet (a message just built).
    pub(crate) fn attach(&mut self, attached: crate::settle::Attached) {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.attached = Some(Box::new(attached));
        }
    }

    /// Sets [`timestamp`](Message::timestamp), if nobody else holds the message yet (a
    /// message just built).
    #[inline]
    pub(crate) fn stamp(&mut self, timestamp: SystemTime) {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.meta.timestamp = timestamp;
        }
    }

    /// A sink dropped this event (a full queue, shutdown) instead of running it: a consumed
    /// event is then not acked to NATS but delivered again. No-op for every other message.
    pub(crate) fn mark_dropped(&self) {
        if let Some(a) = &self.0.attached {
            a.mark_dropped();
        }
    }

    /// A hold on a consumed event's ticket, for a sink that keeps work for it: the event is
    /// acked once every hold is gone ([`crate::settle`]). `None` for every other message.
    pub(crate) fn hold(&self) -> Option<crate::settle::Hold> {
        self.0.attached.as_ref()?.hold()
    }

    /// Whether a run of this event may start now: false for a consumed event whose partition
    /// lease was lost or went stale since it was handed over (`crate::settle::Fence`), or whose
    /// start record the shared de-dup bucket did not confirm (`crate::settle::Start`; written
    /// by the first call).
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))] // a plugin's executor asks
    pub(crate) fn admits(&self) -> bool {
        self.0.attached.as_ref().is_none_or(|a| a.admits())
    }

    /// As [`admits`](Message::admits), without waiting for the start record: `Pending` while
    /// it is written, and `wake` is called when the answer comes.
    pub(crate) fn admission(&self, wake: &crate::settle::Wake) -> crate::settle::Admission {
        self.0
            .attached
            .as_ref()
            .map_or(crate::settle::Admission::Yes, |a| a.admission(wake))
    }

    /// Whether this message carries what the NATS consumer attached to it.
    pub(crate) fn has_attachment(&self) -> bool {
        self.0.attached.is_some()
    }

    /// After the fan-out: the message lets its own hold go (bus subscribers hold none).
    #[inline]
    pub(crate) fn release_hold(&self) {
        if let Some(a) = &self.0.attached {
            a.release();
        }
    }

    /// When the event happened by its sender's clock, RFC 3339 UTC, where
    /// [`timestamp`](Message::timestamp) is this host's: for an event consumed from NATS the
    /// `Prx-Timestamp` its agent published; for an ingested event the time its sender gave
    /// (`prx-hooks send`, `Prx-Timestamp`; kept through the spool).
    pub fn origin_timestamp(&self) -> Option<&str> {
        self.0.attached.as_ref()?.origin_timestamp.as_deref()
    }

    /// For an event consumed from NATS: the agent's own sequence number (`Prx-Seq`), where
    /// [`seq`](Message::seq) is this host's numbering.
    pub fn origin_seq(&self) -> Option<u64> {
        self.0.attached.as_ref()?.origin_seq
    }

    /// The event's id, the same every time it is delivered: for an event consumed from NATS
    /// the publisher's `Nats-Msg-Id` (the same on every redelivery, on every host and through
    /// relays; for a message that had none, the id a relaying consumer made for it); for an
    /// ingested event the id its sender gave it (`prx-hooks send`, `Prx-Event-Id`), which a
    /// publisher then sends as its `Nats-Msg-Id`. What a hook keys its effect on to make it
    /// happen once (`ZERO_HOOK_EVENT_ID`).
    ///
    /// # Examples
    ///
    /// ```
    /// # let hooks = prx_hooks::Hooks::builder().build().unwrap();
    /// # let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    /// # hooks.emitter("a", "s").emit(prx_hooks::Event::TurnComplete);
    /// # let msg = sub.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
    /// // A local event has none; one a `--from-nats` consumer took has its Nats-Msg-Id.
    /// assert_eq!(msg.event_id(), None);
    /// ```
    pub fn event_id(&self) -> Option<&str> {
        self.0.attached.as_ref()?.event_id.as_deref()
    }

    /// For an event consumed through a JetStream durable consumer: JetStream's delivery count
    /// for its message, 1 on the first delivery, 2 on the next… (`ZERO_HOOK_DELIVERY`).
    pub fn delivery(&self) -> Option<u64> {
        self.0.attached.as_ref()?.delivery
    }

    /// For an event consumed with a shared de-dup bucket: another host had claimed it and not
    /// recorded it done, so its hooks may have run there already (`ZERO_HOOK_RECLAIMED=1`).
    pub fn reclaimed(&self) -> bool {
        self.0.attached.as_ref().is_some_and(|a| a.reclaimed)
    }

    /// [`rewrite`](Message::rewrite) with the payload given as text (tests: whether a message
    /// is free for the worker to reuse).
    #[cfg(test)]
    pub(crate) fn reuse(&mut self, json: &str, agent: &str, session: &str, meta: Meta) -> bool {
        match Arc::get_mut(&mut self.0) {
            Some(inner) => {
                let len = json.len() + agent.len() + session.len();
                if inner.text.capacity() > REUSE_KEEP.max(len) {
                    inner.text = String::with_capacity(len);
                }
                inner.set(json, agent, session, "", meta);
                inner.attached = None;
                true
            }
            None => false,
        }
    }

    /// `prx.lifecycle.tool_call`, or the custom topic it was published under.
    pub fn topic(&self) -> &str {
        self.0.topic.unwrap_or(&self.0.text[self.0.session_end..])
    }

    /// The payload JSON, compact, one line.
    pub fn json(&self) -> &[u8] {
        self.json_str().as_bytes()
    }

    /// The payload JSON as text.
    pub fn json_str(&self) -> &str {
        &self.0.text[..self.0.json_end]
    }

    /// The lifecycle event, or `None` for a custom topic.
    pub fn event(&self) -> Option<EventKind> {
        self.0.meta.kind
    }

    /// The emitter's agent (for custom topics: the agent that sent it, or empty).
    pub fn agent(&self) -> &str {
        &self.0.text[self.0.json_end..self.0.agent_end]
    }

    /// The emitter's session (for custom topics: the sender's, or empty).
    pub fn session(&self) -> &str {
        &self.0.text[self.0.agent_end..self.0.session_end]
    }

    /// Per-emitter sequence number (shared by an emitter's clones), starting at 0; for custom
    /// topics, the bus's own publication counter.
    pub fn seq(&self) -> u64 {
        self.0.meta.seq
    }

    /// When it was published (custom topics); for a lifecycle event, when the worker had taken
    /// the batch holding it from the ring (one clock read per batch of up to 64 events: never
    /// before the event left the ring, and never going back along an emitter's events).
    pub fn timestamp(&self) -> SystemTime {
        self.0.meta.timestamp
    }

    /// [`timestamp`](Message::timestamp) as RFC 3339 in UTC with microseconds:
    /// `2026-11-29T22:16:48.123456Z` (the form of `ZERO_HOOK_TIMESTAMP`).
    pub fn timestamp_rfc3339(&self) -> String {
        humantime::format_rfc3339_micros(self.0.meta.timestamp).to_string()
    }

    /// Appends the message as one line of JSON (no trailing newline), the form `prx-hooks run
    /// --print` writes: `{"topic","event","agent","session","seq","timestamp","payload"}`, with
    /// `event` null for custom topics; an event consumed from NATS has `origin_timestamp` and
    /// `origin_seq` after `timestamp` when its agent sent them, then `event_id` when it had a
    /// `Nats-Msg-Id`, `delivery` through a durable consumer, and `"reclaimed":true` when
    /// another host had claimed it ([`reclaimed`](Message::reclaimed)).
    pub fn write_envelope(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"topic\":");
        json::write_str(out, self.topic());
        out.extend_from_slice(b",\"event\":");
        match self.event() {
            Some(kind) => json::write_str(out, kind.name()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"agent\":");
        json::write_str(out, self.agent());
        out.extend_from_slice(b",\"session\":");
        json::write_str(out, self.session());
        out.extend_from_slice(b",\"seq\":");
        json::write_u64(out, self.seq());
        out.extend_from_slice(b",\"timestamp\":");
        json::write_str(out, &self.timestamp_rfc3339());
        if let Some(ts) = self.origin_timestamp() {
            out.extend_from_slice(b",\"origin_timestamp\":");
            json::write_str(out, ts);
        }
        if let Some(seq) = self.origin_seq() {
            out.extend_from_slice(b",\"origin_seq\":");
            json::write_u64(out, seq);
        }
        if let Some(id) = self.event_id() {
            out.extend_from_slice(b",\"event_id\":");
            json::write_str(out, id);
        }
        if let Some(n) = self.delivery() {
            out.extend_from_slice(b",\"delivery\":");
            json::write_u64(out, n);
        }
        if self.reclaimed() {
            out.extend_from_slice(b",\"reclaimed\":true");
        }
        out.extend_from_slice(b",\"payload\":");
        out.extend_from_slice(self.json());
        out.push(b'}');
    }

    /// How many publications deep this message is (0 for lifecycle events; a plugin
    /// republishing what it received adds one). The bus refuses depths past [`MAX_DEPTH`](crate::bus::MAX_DEPTH).
    pub fn depth(&self) -> u8 {
        self.0.meta.depth
    }

    /// The relay emitter this event came through (the NATS consumer's), 0 for any other.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn relay(&self) -> u64 {
        self.0.meta.relay
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("topic", &self.topic())
            .field("agent", &self.agent())
            .field("session", &self.session())
            .field("seq", &self.seq())
            .field("json", &self.json_str())
            .finish()
    }
}
