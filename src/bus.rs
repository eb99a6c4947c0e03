//! The in-process event bus: topics, patterns, bounded subscriber queues.
//!
//! The bus is always on. It is the first sink of the pipeline (every lifecycle event is offered
//! to it under `prx.lifecycle.<event>`), and anyone holding a [`Bus`] may [`publish`](Bus::publish)
//! custom topics — plugins do, through `prx:host/events`.
//!
//! Patterns are PRX's: an exact topic, a prefix ending in `.*` (any depth below it), or `*`
//! (everything). Each [`Subscription`] has its own bounded queue: a subscriber that does not read
//! loses only its own messages, and those losses are counted on it. Dropping a `Subscription`
//! unsubscribes it.
//!
//! Delivery reads the subscriber list through an `ArcSwap` (no lock for the workers); only
//! subscribe and unsubscribe take the bus's lock, to rebuild that list.

use crate::event::{EventKind, EventMask};
use crate::interest::InterestHandle;
use crate::json;
pub use crate::message::Message;
pub(crate) use crate::message::Meta;
use crate::sink::Sink;
use crate::stats::{SinkCounters, SinkCounts, SubscriberStats};
use arc_swap::ArcSwap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Longest topic or pattern accepted.
pub const MAX_TOPIC_LEN: usize = 256;
/// Topics under this prefix are the pipeline's own; `publish` refuses them.
pub const LIFECYCLE_PREFIX: &str = "prx.lifecycle.";

/// How deep publications may nest (a plugin republishing on receipt cannot loop forever).
pub const MAX_DEPTH: u8 = 8;

/// Why the bus refused a pattern or a publication.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The topic is not dot-separated segments of A-Z a-z 0-9 _ -.
    #[error(
        "invalid topic {topic:?}: {reason}; topics are dot-separated segments of A-Z a-z 0-9 _ -, like \"myapp.audit.done\""
    )]
    InvalidTopic {
        /// The topic given.
        topic: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The pattern is not an exact topic, a prefix ending in `.*`, or `*`.
    #[error(
        "invalid pattern {pattern:?}: {reason}; use an exact topic, a prefix ending in \".*\", or \"*\""
    )]
    InvalidPattern {
        /// The pattern given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The topic is under `prx.lifecycle.`, where only the pipeline publishes.
    #[error("topic {topic:?} is reserved: only the pipeline publishes under \"prx.lifecycle.\"")]
    ReservedTopic {
        /// The topic given.
        topic: String,
    },
    /// The payload is larger than the bus's limit.
    #[error("payload for {topic:?} is {len} bytes; the limit is {max}")]
    PayloadTooLarge {
        /// The topic given.
        topic: String,
        /// The payload's size in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The payload is not one valid JSON value.
    #[error("payload for {topic:?} is not valid JSON (RFC 8259, nested at most 126 deep)")]
    InvalidJson {
        /// The topic given.
        topic: String,
    },
    /// A publication made while handling a publication, nested too deep.
    #[error(
        "publication to {topic:?} nested {depth} deep; the limit is {max} (is a plugin republishing what it receives?)"
    )]
    TooDeep {
        /// The topic given.
        topic: String,
        /// How deep this publication is.
        depth: u8,
        /// The deepest allowed ([`MAX_DEPTH`]).
        max: u8,
    },
    /// The bus has shut down.
    #[error("the bus has shut down")]
    Closed,
}

/// The subscription's bus has shut down and its queue is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the bus has shut down and this subscription's queue is empty")]
pub struct RecvError;

/// Why [`Subscription::try_recv`] returned no message.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    /// No message is waiting.
    #[error("no message is waiting")]
    Empty,
    /// The bus has shut down and the queue is empty.
    #[error("the bus has shut down and this subscription's queue is empty")]
    Closed,
}

/// Why [`Subscription::recv_timeout`] returned no message.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecvTimeoutError {
    /// No message arrived in time.
    #[error("no message arrived in time")]
    Timeout,
    /// The bus has shut down and the queue is empty.
    #[error("the bus has shut down and this subscription's queue is empty")]
    Closed,
}

/// A parsed subscription pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    All,
    /// The prefix including its trailing dot: `prx.lifecycle.`.
    Prefix(Box<str>),
    Exact(Box<str>),
}

impl Pattern {
    pub(crate) fn parse(pattern: &str) -> Result<Pattern, BusError> {
        let bad = |reason: String| BusError::InvalidPattern {
            pattern: pattern.into(),
            reason,
        };
        check_pattern(pattern).map_err(bad)?;
        Ok(match pattern {
            "*" => Pattern::All,
            p => match p.strip_suffix(".*") {
                Some(stem) => Pattern::Prefix(format!("{stem}.").into()),
                None => Pattern::Exact(p.into()),
            },
        })
    }

    pub(crate) fn matches(&self, topic: &str) -> bool {
        match self {
            Pattern::All => true,
            Pattern::Prefix(p) => topic.starts_with(&**p),
            Pattern::Exact(t) => topic == &**t,
        }
    }

    fn lifecycle_mask(&self) -> EventMask {
        EventKind::ALL
            .into_iter()
            .filter(|k| self.matches(k.topic()))
            .fold(EventMask::NONE, |m, k| m | k.mask())
    }
}

/// Checks a subscription pattern (`*`, a topic, or a topic followed by `.*`); the reason says
/// what is wrong. plugin.toml's declared events follow the same rules.
pub(crate) fn check_pattern(pattern: &str) -> Result<(), String> {
    match pattern {
        "*" => Ok(()),
        p => check_topic(p.strip_suffix(".*").unwrap_or(p)),
    }
}

/// The lifecycle events a pattern matches (none for an invalid one).
pub(crate) fn pattern_lifecycle_mask(pattern: &str) -> EventMask {
    Pattern::parse(pattern).map_or(EventMask::NONE, |p| p.lifecycle_mask())
}

/// Checks a concrete topic; the reason says what is wrong.
pub(crate) fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("it is empty".into());
    }
    if topic.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "it is {} bytes long; the limit is {MAX_TOPIC_LEN}",
            topic.len()
        ));
    }
    for (n, segment) in topic.split('.').enumerate() {
        if segment.is_empty() {
            return Err(format!("segment {} is empty", n + 1));
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(format!("character {c:?} is not allowed"));
        }
    }
    Ok(())
}

/// The bus's side of a subscription. It owns the only sender: removing it from the list (on
/// unsubscribe or close) disconnects the receiver.
struct Subscriber {
    info: Arc<SubInfo>,
    pattern: Pattern,
    lifecycle: EventMask,
    tx: flume::Sender<Message>,
}

/// What both sides see: identity, counters, and the queue's receiving end (the bus keeps one
/// only to report its length).
struct SubInfo {
    rx: flume::Receiver<Message>,
    id: u64,
    pattern: Box<str>,
    capacity: usize,
    delivered: AtomicU64,
    dropped: AtomicU64,
    /// How many messages the subscription has taken out of `rx` and not yet returned
    /// (`Subscription::taken`'s length, for stats). Written by the reader for every message:
    /// on a line of its own, away from the counters the worker writes.
    taken: crossbeam_utils::CachePadded<AtomicUsize>,
}

impl Subscriber {
    /// Offers `msg`; counts the outcome on the subscriber. Never blocks.
    fn offer(&self, msg: &Message) -> bool {
        let ok = self.tx.try_send(msg.clone()).is_ok();
        let counter = if ok {
            &self.info.delivered
        } else {
            &self.info.dropped
        };
        counter.fetch_add(1, Ordering::Relaxed);
        ok
    }
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    infos: Vec<std::sync::Weak<SubInfo>>,
}

struct Shared {
    subs: ArcSwap<Vec<Arc<Subscriber>>>,
    /// Serializes changes to `subs` and to the interest mask; lists every subscription still
    /// held by someone (for stats, also after the bus has closed).
    write: Mutex<Registry>,
    interest: InterestHandle,
    counters: SinkCounters,
    queue_capacity: usize,
    /// The largest payload [`Bus::publish`] takes.
    max_payload: usize,
    /// The largest [`Bus::publish_from`] takes: an agent's event that no lifecycle event fits
    /// is bounded like an event (`max_event_bytes`), not like a plugin's publication.
    max_agent_payload: usize,
    publish_seq: AtomicU64,
    closed: AtomicBool,
}

/// The in-process event bus. Cheap to clone; all clones are the same bus.
#[derive(Clone)]
pub struct Bus(Arc<Shared>);

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("subscriptions", &self.0.subs.load().len())
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl Bus {
    #[cfg(any(test, feature = "wasm"))]
    pub(crate) fn new(interest: InterestHandle, queue_capacity: usize, max_payload: usize) -> Bus {
        Bus::with_limits(interest, queue_capacity, max_payload, max_payload)
    }

    /// [`Bus::new`] whose [`publish_from`](Bus::publish_from) takes up to `max_agent_payload`.
    pub(crate) fn with_limits(
        interest: InterestHandle,
        queue_capacity: usize,
        max_payload: usize,
        max_agent_payload: usize,
    ) -> Bus {
        Bus(Arc::new(Shared {
            subs: ArcSwap::from_pointee(Vec::new()),
            write: Mutex::default(),
            interest,
            counters: SinkCounters::default(),
            queue_capacity: queue_capacity.max(1),
            max_payload,
            max_agent_payload: max_agent_payload.max(max_payload),
            publish_seq: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        }))
    }

    /// Subscribes to `pattern` with the bus's default queue capacity
    /// ([`HooksBuilder::subscriber_queue`](crate::HooksBuilder::subscriber_queue)). A pattern
    /// is an exact topic, a prefix ending in `.*`, or `*`. Lifecycle events are under
    /// `prx.lifecycle.<event>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Event, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
    /// hooks.emitter("my-agent", "s1").emit(Event::TurnComplete);
    /// let msg = sub.recv()?;
    /// assert_eq!(msg.topic(), "prx.lifecycle.turn_complete");
    /// assert!(hooks.bus().subscribe("prx..x").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError> {
        self.subscribe_with_capacity(pattern, self.0.queue_capacity)
    }

    /// Subscribes to `pattern` with a queue of `capacity` messages (at least 1). When the
    /// queue is full, further messages are dropped for this subscription and counted.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe_with_capacity("myapp.*", 1)?;
    /// hooks.bus().publish("myapp.a", "1")?;
    /// hooks.bus().publish("myapp.b", "2")?;
    /// assert_eq!((sub.capacity(), sub.len(), sub.dropped()), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn subscribe_with_capacity(
        &self,
        pattern: &str,
        capacity: usize,
    ) -> Result<Subscription, BusError> {
        let capacity = capacity.max(1);
        let (tx, rx) = flume::bounded(capacity);
        self.subscribe_into(pattern, tx, rx)
    }

    /// Subscribes `pattern` into a queue the caller owns (a plugin's call queue: its messages
    /// and the lifecycle events share one queue, so they reach the plugin in one order). `rx`
    /// is that queue's receiving end, kept for stats; dropping the returned subscription
    /// unsubscribes.
    pub(crate) fn subscribe_into(
        &self,
        pattern: &str,
        tx: flume::Sender<Message>,
        rx: flume::Receiver<Message>,
    ) -> Result<Subscription, BusError> {
        let parsed = Pattern::parse(pattern)?;
        let capacity = tx.capacity().unwrap_or(usize::MAX);
        let mut reg = self.0.write.lock().unwrap_or_else(|e| e.into_inner());
        if self.0.closed.load(Ordering::Acquire) {
            return Err(BusError::Closed);
        }
        reg.next_id += 1;
        let info = Arc::new(SubInfo {
            rx,
            id: reg.next_id,
            pattern: pattern.into(),
            capacity,
            delivered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            taken: crossbeam_utils::CachePadded::new(AtomicUsize::new(0)),
        });
        let sub = Subscriber {
            info: info.clone(),
            lifecycle: parsed.lifecycle_mask(),
            pattern: parsed,
            tx,
        };
        let mut list = Vec::clone(&self.0.subs.load());
        list.push(Arc::new(sub));
        self.replace(list);
        reg.infos.retain(|w| w.strong_count() > 0);
        reg.infos.push(Arc::downgrade(&info));
        Ok(Subscription {
            taken: Mutex::new(VecDeque::new()),
            sub: info,
            bus: self.clone(),
        })
    }

    /// Publishes `json` under a custom `topic` to every matching subscriber, on the caller's
    /// thread, without blocking. Returns how many subscribers took it. The payload must be one
    /// valid JSON value of at most the bus's payload limit; it is stored without insignificant
    /// whitespace.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// assert_eq!(hooks.bus().publish("myapp.audit", r#"{ "ok": true }"#)?, 1);
    /// assert_eq!(sub.recv()?.json_str(), r#"{"ok":true}"#);
    /// assert!(hooks.bus().publish("prx.lifecycle.error", "{}").is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish(&self, topic: &str, json: impl AsRef<[u8]>) -> Result<usize, BusError> {
        self.publish_at_depth(topic, json.as_ref(), 1)
    }

    /// [`publish`](Bus::publish) for an event an agent sent that no lifecycle event fits
    /// (an ingest topic line, [`ndjson::TopicRecord`](crate::ndjson::TopicRecord)): the
    /// message carries the sender's `agent` and `session`, which subscribers, the live stream
    /// and `tail` show.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("prx.agent.*")?;
    /// hooks.bus().publish_from("prx.agent.codex.turn", "codex", "t1", r#"{"n": 1}"#)?;
    /// let msg = sub.recv()?;
    /// assert_eq!((msg.agent(), msg.session(), msg.json_str()), ("codex", "t1", r#"{"n":1}"#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish_from(
        &self,
        topic: &str,
        agent: &str,
        session: &str,
        json: impl AsRef<[u8]>,
    ) -> Result<usize, BusError> {
        let max = self.0.max_agent_payload;
        self.publish_as(topic, json.as_ref(), 1, (agent, session), max)
    }

    /// Whether any subscription's pattern matches `topic` (one lock-free load): what a
    /// publisher checks before building a message nobody would take.
    pub(crate) fn wants(&self, topic: &str) -> bool {
        self.0.subs.load().iter().any(|s| s.pattern.matches(topic))
    }

    /// `publish` for a message caused by another one at `depth - 1` (plugins republishing).
    pub(crate) fn publish_at_depth(
        &self,
        topic: &str,
        json: &[u8],
        depth: u8,
    ) -> Result<usize, BusError> {
        self.publish_as(topic, json, depth, ("", ""), self.0.max_payload)
    }

    fn publish_as(
        &self,
        topic: &str,
        json: &[u8],
        depth: u8,
        (agent, session): (&str, &str),
        max: usize,
    ) -> Result<usize, BusError> {
        check_topic(topic).map_err(|reason| BusError::InvalidTopic {
            topic: topic.into(),
            reason,
        })?;
        if topic.starts_with(LIFECYCLE_PREFIX) {
            return Err(BusError::ReservedTopic {
                topic: topic.into(),
            });
        }
        if depth > MAX_DEPTH {
            return Err(BusError::TooDeep {
                topic: topic.into(),
                depth,
                max: MAX_DEPTH,
            });
        }
        if json.len() > max {
            return Err(BusError::PayloadTooLarge {
                topic: topic.into(),
                len: json.len(),
                max,
            });
        }
        let mut compact = Vec::with_capacity(json.len());
        // One level less than serde_json's limit: the `--print` envelope wraps the payload.
        if !json::append_compact_within(&mut compact, json, json::Top::Any, json::MAX_DEPTH - 1) {
            return Err(BusError::InvalidJson {
                topic: topic.into(),
            });
        }
        if self.0.closed.load(Ordering::Acquire) {
            return Err(BusError::Closed);
        }
        // The compactor only accepts valid UTF-8 inside strings and ASCII outside them.
        let text = String::from_utf8(compact).map_err(|_| BusError::InvalidJson {
            topic: topic.into(),
        })?;
        let seq = self.0.publish_seq.fetch_add(1, Ordering::Relaxed);
        let meta = Meta {
            kind: None,
            seq,
            timestamp: SystemTime::now(),
            depth,
            relay: 0,
        };
        let msg = Message::new(&text, agent, session, topic, meta);
        Ok(self.fan_out(&msg, |s| s.pattern.matches(topic)))
    }

    /// Offers `msg` to every subscriber `wants` picks; counts once for the whole fan-out.
    fn fan_out(&self, msg: &Message, wants: impl Fn(&Subscriber) -> bool) -> usize {
        let subs = self.0.subs.load();
        let (mut sent, mut delivered) = (0u64, 0u64);
        for sub in subs.iter().filter(|s| wants(s)) {
            sent += 1;
            delivered += sub.offer(msg) as u64;
        }
        self.count(sent, delivered);
        delivered as usize
    }

    /// Records one fan-out: `sent` offers, `delivered` of them taken, the rest dropped.
    fn count(&self, sent: u64, delivered: u64) {
        if sent > 0 {
            self.0.counters.update(|c| {
                c.sent += sent;
                c.delivered += delivered;
                c.dropped += sent - delivered;
            });
        }
    }

    /// Per-subscription counters of every subscription still held (after shutdown too).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let _sub = hooks.bus().subscribe("myapp.*")?;
    /// hooks.bus().publish("myapp.x", "1")?;
    /// let stats = hooks.bus().subscribers();
    /// assert_eq!((stats[0].pattern.as_str(), stats[0].delivered), ("myapp.*", 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn subscribers(&self) -> Vec<SubscriberStats> {
        let reg = self.0.write.lock().unwrap_or_else(|e| e.into_inner());
        reg.infos
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .map(|info| SubscriberStats {
                id: info.id,
                pattern: info.pattern.to_string(),
                delivered: info.delivered.load(Ordering::Relaxed),
                dropped: info.dropped.load(Ordering::Relaxed),
                queued: (info.rx.len() + info.taken.load(Ordering::Relaxed)) as u64,
                capacity: info.capacity as u64,
            })
            .collect()
    }

    /// Swaps in a new subscriber list and the interest mask it implies. Caller holds `write`.
    fn replace(&self, list: Vec<Arc<Subscriber>>) {
        let mask = list.iter().fold(EventMask::NONE, |m, s| m | s.lifecycle);
        self.0.subs.store(Arc::new(list));
        self.0.interest.set(mask);
    }

    fn unsubscribe(&self, id: u64) {
        let mut reg = self.0.write.lock().unwrap_or_else(|e| e.into_inner());
        reg.infos.retain(|w| w.strong_count() > 0);
        let list: Vec<_> = self
            .0
            .subs
            .load()
            .iter()
            .filter(|s| s.info.id != id)
            .cloned()
            .collect();
        self.replace(list);
    }

    /// Whether the bus was closed (by [`Hooks::shutdown`](crate::Hooks::shutdown)).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let bus = hooks.bus().clone();
    /// assert!(!bus.is_closed());
    /// hooks.shutdown(std::time::Duration::from_secs(2));
    /// assert!(bus.is_closed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Stops taking messages and disconnects every subscription (each can still read what is
    /// already in its queue, then gets `Closed`).
    pub(crate) fn close(&self) {
        let _guard = self.0.write.lock().unwrap_or_else(|e| e.into_inner());
        self.0.closed.store(true, Ordering::Release);
        self.replace(Vec::new());
    }
}

impl Sink for Bus {
    fn name(&self) -> &str {
        "bus"
    }

    fn deliver(&self, msg: &Message) {
        if let Some(kind) = msg.event() {
            self.fan_out(msg, |s| s.lifecycle.contains(kind));
        }
    }

    /// One subscriber-list load and one counter update per batch; each subscriber still gets
    /// its messages in order.
    fn deliver_batch(&self, msgs: &[Message], _wanted: EventMask) {
        let subs = self.0.subs.load();
        let (mut sent, mut delivered) = (0u64, 0u64);
        for sub in subs.iter() {
            let (mut ok, mut lost) = (0u64, 0u64);
            for msg in msgs {
                if msg.event().is_some_and(|k| sub.lifecycle.contains(k)) {
                    if sub.tx.try_send(msg.clone()).is_ok() {
                        ok += 1;
                    } else {
                        lost += 1;
                    }
                }
            }
            if ok > 0 {
                sub.info.delivered.fetch_add(ok, Ordering::Relaxed);
            }
            if lost > 0 {
                sub.info.dropped.fetch_add(lost, Ordering::Relaxed);
            }
            sent += ok + lost;
            delivered += ok;
        }
        self.count(sent, delivered);
    }

    fn counts(&self) -> SinkCounts {
        self.0.counters.get()
    }
}

/// A bus subscription: a bounded queue of [`Message`]s matching its pattern. `Send`, not `Clone`.
/// Dropping it unsubscribes.
///
/// # Invariants
///
/// `taken` holds messages already moved out of the queue, older than any still in it. Every
/// read, blocking ones included, runs with `taken` locked, takes from it first and refills it
/// only when it is empty: so messages come out in the order they were published, even to
/// several threads reading one subscription. `taken` holds at most one queue's worth
/// (`capacity`), and `SubInfo::taken` mirrors its length.
pub struct Subscription {
    sub: Arc<SubInfo>,
    bus: Bus,
    /// What the last batch read took from the queue and no read has returned yet. One lock
    /// per batch on the queue, which the publishing worker also locks, instead of one per
    /// message: the two cores then stop passing the queue's lock back and forth for every
    /// event (ARCHITECTURE.md § Memory).
    taken: Mutex<VecDeque<Message>>,
}

impl Subscription {
    /// Waits for the next message.
    ///
    /// Spins and yields briefly before blocking: a subscriber that keeps up stays awake, so the
    /// pipeline worker handing it messages never pays for a futex wake-up (microseconds each,
    /// more than the rest of the delivery together).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// hooks.bus().publish("myapp.x", "[1, 2]")?;
    /// let msg = sub.recv()?;
    /// assert_eq!((msg.topic(), msg.json()), ("myapp.x", &b"[1,2]"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv(&self) -> Result<Message, RecvError> {
        let mut taken = self.lock_taken();
        match self.poll(&mut taken) {
            Some(Ok(msg)) => Ok(msg),
            Some(Err(())) => Err(RecvError),
            // `taken` is empty and stays ours: the next message in the queue is the oldest.
            None => self.sub.rx.recv().map_err(|_| RecvError),
        }
    }

    /// Takes the next message if one is waiting.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::bus::TryRecvError;
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// assert_eq!(sub.try_recv().unwrap_err(), TryRecvError::Empty);
    /// hooks.bus().publish("myapp.x", "1")?;
    /// assert!(sub.try_recv().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// `Empty` too while another thread reads this subscription: what is waiting goes to it.
    pub fn try_recv(&self) -> Result<Message, TryRecvError> {
        let mut taken = match self.taken.try_lock() {
            Ok(taken) => taken,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(TryRecvError::Empty),
        };
        match self.take_or_closed(&mut taken) {
            Some(Ok(msg)) => Ok(msg),
            Some(Err(())) => Err(TryRecvError::Closed),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Waits at most `timeout` for the next message (spinning briefly first, like `recv`).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::bus::RecvTimeoutError;
    /// use std::time::Duration;
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// let waited = sub.recv_timeout(Duration::from_millis(1));
    /// assert_eq!(waited.unwrap_err(), RecvTimeoutError::Timeout);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message, RecvTimeoutError> {
        let deadline = std::time::Instant::now() + timeout;
        let Some(mut taken) = self.lock_taken_until(deadline) else {
            return Err(RecvTimeoutError::Timeout);
        };
        match self.poll(&mut taken) {
            Some(Ok(msg)) => Ok(msg),
            Some(Err(())) => Err(RecvTimeoutError::Closed),
            None => self.sub.rx.recv_deadline(deadline).map_err(|e| match e {
                flume::RecvTimeoutError::Timeout => RecvTimeoutError::Timeout,
                flume::RecvTimeoutError::Disconnected => RecvTimeoutError::Closed,
            }),
        }
    }

    /// The spin-then-yield phase of `recv`: `None` when nothing came (the caller blocks, still
    /// holding `taken`).
    fn poll(&self, taken: &mut VecDeque<Message>) -> Option<Result<Message, ()>> {
        for round in 0..SPIN_ROUNDS + YIELD_ROUNDS {
            if let Some(got) = self.take_or_closed(taken) {
                return Some(got);
            }
            if round < SPIN_ROUNDS {
                (0..1u32 << round.min(4)).for_each(|_| std::hint::spin_loop());
            } else {
                std::thread::yield_now();
            }
        }
        None
    }

    /// The oldest message not yet returned: from `taken`, or else the queue's whole content
    /// moved into `taken` under one lock of the queue. `None` when both are empty; `Err` once
    /// nothing is left and the bus has let go of the queue (closed, or this subscription
    /// removed).
    fn take_or_closed(&self, taken: &mut VecDeque<Message>) -> Option<Result<Message, ()>> {
        if let Some(msg) = taken.pop_front() {
            self.sub.taken.store(taken.len(), Ordering::Relaxed);
            return Some(Ok(msg));
        }
        // Read before the drain: if the queue was already disconnected, nothing can arrive
        // after the drain looked, so an empty drain means the end.
        let closed = self.sub.rx.is_disconnected();
        taken.extend(self.sub.rx.drain());
        match taken.pop_front() {
            Some(msg) => {
                self.sub.taken.store(taken.len(), Ordering::Relaxed);
                Some(Ok(msg))
            }
            None if closed => Some(Err(())),
            None => None,
        }
    }

    fn lock_taken(&self) -> std::sync::MutexGuard<'_, VecDeque<Message>> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `taken`, unless another thread reading this subscription holds it past `deadline`.
    fn lock_taken_until(
        &self,
        deadline: std::time::Instant,
    ) -> Option<std::sync::MutexGuard<'_, VecDeque<Message>>> {
        loop {
            match self.taken.try_lock() {
                Ok(taken) => return Some(taken),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {
                    // Another reader is waiting for a message or taking one: rare, so a short
                    // sleep rather than a second wait queue.
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    std::thread::sleep(left.min(Duration::from_micros(200)));
                }
            }
        }
    }

    /// Messages as they arrive, until the bus shuts down (each step is a [`recv`](Self::recv)).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// hooks.bus().publish("myapp.x", "1")?;
    /// hooks.shutdown(std::time::Duration::from_secs(2));
    /// assert_eq!(sub.iter().count(), 1); // what was queued, then the end
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn iter(&self) -> Iter<'_> {
        Iter(self)
    }

    /// The messages waiting now, without blocking.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// hooks.bus().publish("myapp.x", "1")?;
    /// hooks.bus().publish("myapp.y", "2")?;
    /// let topics: Vec<String> = sub.try_iter().map(|m| m.topic().to_string()).collect();
    /// assert_eq!(topics, ["myapp.x", "myapp.y"]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_iter(&self) -> impl Iterator<Item = Message> + '_ {
        std::iter::from_fn(|| self.try_recv().ok())
    }

    /// The subscription's id on its bus (as [`Bus::subscribers`] shows it).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// assert_eq!(hooks.bus().subscribers()[0].id, sub.id());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn id(&self) -> u64 {
        self.sub.id
    }

    /// The queue's receiving end, for a reader that waits on several queues at once (the HTTP
    /// event stream's hub selects over this and the run feed). Such a reader reads only
    /// through it: `recv` and its kin may have taken older messages out of the queue.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn receiver(&self) -> &flume::Receiver<Message> {
        &self.sub.rx
    }

    /// The pattern subscribed to, as given.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// assert_eq!(hooks.bus().subscribe("myapp.*")?.pattern(), "myapp.*");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pattern(&self) -> &str {
        &self.sub.pattern
    }

    /// Messages waiting in the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// assert!(sub.is_empty());
    /// hooks.bus().publish("myapp.x", "1")?;
    /// assert_eq!((sub.len(), sub.delivered()), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        self.sub.rx.len() + self.sub.taken.load(Ordering::Relaxed)
    }

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most messages the queue holds.
    pub fn capacity(&self) -> usize {
        self.sub.capacity
    }

    /// Messages this subscription lost because its queue was full.
    pub fn dropped(&self) -> u64 {
        self.sub.dropped.load(Ordering::Relaxed)
    }

    /// Messages put into this subscription's queue so far.
    pub fn delivered(&self) -> u64 {
        self.sub.delivered.load(Ordering::Relaxed)
    }
}

/// Blocking iterator over a [`Subscription`]; ends when the bus shuts down.
#[derive(Debug)]
pub struct Iter<'a>(&'a Subscription);

impl Iterator for Iter<'_> {
    type Item = Message;
    fn next(&mut self) -> Option<Message> {
        self.0.recv().ok()
    }
}

impl<'a> IntoIterator for &'a Subscription {
    type Item = Message;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// `recv` polls this many times with a growing spin, then yields this many times, then blocks.
const SPIN_ROUNDS: u32 = 10;
const YIELD_ROUNDS: u32 = 8;

impl Drop for Subscription {
    fn drop(&mut self) {
        self.bus.unsubscribe(self.sub.id);
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.sub.id)
            .field("pattern", &self.pattern())
            .field("queued", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Interest;

    fn bus(capacity: usize) -> (Bus, Arc<Interest>) {
        let interest = Interest::new(1);
        (Bus::new(interest.handle(0), capacity, 1024), interest)
    }

    #[test]
    fn an_agents_topic_is_bounded_like_an_event_a_publication_by_max_payload() {
        let interest = Interest::new(1);
        let bus = Bus::with_limits(interest.handle(0), 8, 1024, 4096);
        let sub = bus.subscribe("prx.agent.*").unwrap();
        let big = format!("{{\"content\":\"{}\"}}", "x".repeat(2000));
        assert!(matches!(
            bus.publish("prx.agent.cursor.beforeReadFile", &big),
            Err(BusError::PayloadTooLarge { max: 1024, .. })
        ));
        bus.publish_from("prx.agent.cursor.beforeReadFile", "cursor", "c", &big)
            .unwrap();
        assert_eq!(sub.try_recv().unwrap().json().len(), big.len());
        let huge = format!("{{\"content\":\"{}\"}}", "x".repeat(5000));
        assert!(matches!(
            bus.publish_from("prx.agent.cursor.beforeReadFile", "cursor", "c", &huge),
            Err(BusError::PayloadTooLarge { max: 4096, .. })
        ));
    }

    fn numbers(sub: &Subscription) -> Vec<u64> {
        sub.try_iter()
            .map(|m| std::str::from_utf8(m.json()).unwrap().parse().unwrap())
            .collect()
    }

    #[test]
    fn a_read_takes_the_queue_in_one_batch_and_keeps_the_order() {
        let (bus, _i) = bus(4);
        let sub = bus.subscribe("t.*").unwrap();
        for n in 0..4 {
            bus.publish("t.x", n.to_string()).unwrap();
        }
        assert_eq!(sub.recv().unwrap().json(), b"0");
        // Three taken with the first, none left in the queue: four more fit, the ninth not.
        assert_eq!(sub.len(), 3);
        for n in 4..9 {
            bus.publish("t.x", n.to_string()).unwrap();
        }
        assert_eq!(sub.len(), 7);
        assert_eq!(sub.dropped(), 1);
        assert_eq!(numbers(&sub), [1, 2, 3, 4, 5, 6, 7]);
        assert!(sub.is_empty());
    }

    #[test]
    fn messages_taken_before_the_bus_closed_are_still_read() {
        let (bus, _i) = bus(8);
        let sub = bus.subscribe("t.*").unwrap();
        for n in 0..3 {
            bus.publish("t.x", n.to_string()).unwrap();
        }
        assert_eq!(sub.try_recv().unwrap().json(), b"0");
        bus.close();
        assert_eq!(sub.recv().unwrap().json(), b"1");
        assert_eq!(
            sub.recv_timeout(Duration::from_millis(1)).unwrap().json(),
            b"2"
        );
        assert!(sub.recv().is_err());
        assert_eq!(sub.try_recv().unwrap_err(), TryRecvError::Closed);
    }

    /// Two threads reading one subscription while a third publishes: every message comes out
    /// exactly once, and each reader sees them in publishing order.
    #[test]
    fn two_readers_of_one_subscription_share_it_exactly_once_in_order() {
        // Miri runs this too (CI's Miri step takes `bus::`), a thousand times slower.
        const N: u64 = if cfg!(miri) { 300 } else { 200_000 };
        let (bus, _i) = bus(1 << 20);
        let sub = Arc::new(bus.subscribe("t.*").unwrap());
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let sub = sub.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Ok(m) = sub.recv() {
                        got.push(
                            std::str::from_utf8(m.json())
                                .unwrap()
                                .parse::<u64>()
                                .unwrap(),
                        );
                    }
                    got
                })
            })
            .collect();
        for n in 0..N {
            bus.publish("t.x", n.to_string()).unwrap();
        }
        bus.close();
        let mut all = Vec::new();
        for r in readers {
            let got = r.join().unwrap();
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "a reader saw them out of order"
            );
            all.extend(got);
        }
        all.sort_unstable();
        assert_eq!(all, (0..N).collect::<Vec<_>>());
    }

    /// While one thread waits in `recv`, another's `try_recv` answers at once and its
    /// `recv_timeout` gives up at its deadline; the next message goes to the waiting thread.
    #[test]
    fn a_waiting_reader_never_blocks_another_readers_try_recv_or_timeout() {
        let (bus, _i) = bus(8);
        let sub = Arc::new(bus.subscribe("t.*").unwrap());
        let waiting = {
            let sub = sub.clone();
            std::thread::spawn(move || sub.recv().map(|m| m.json().to_vec()))
        };
        // Give the waiting thread time to take the lock and block (liveness only).
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(sub.try_recv().unwrap_err(), TryRecvError::Empty);
        let t0 = std::time::Instant::now();
        assert_eq!(
            sub.recv_timeout(Duration::from_millis(50)).unwrap_err(),
            RecvTimeoutError::Timeout
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "recv_timeout overslept"
        );
        bus.publish("t.x", "7").unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), b"7");
    }

    fn msg(kind: EventKind, seq: u64) -> Message {
        let meta = Meta {
            kind: Some(kind),
            seq,
            timestamp: SystemTime::UNIX_EPOCH,
            depth: 0,
            relay: 0,
        };
        Message::new("{}", "agent", "session", "", meta)
    }

    #[test]
    fn a_message_is_reused_only_when_nobody_holds_it() {
        let mut m = msg(EventKind::Error, 1);
        let held = m.clone();
        let meta = Meta {
            kind: Some(EventKind::ToolCall),
            seq: 2,
            timestamp: SystemTime::UNIX_EPOCH,
            depth: 0,
            relay: 0,
        };
        assert!(!m.reuse("{\"a\":1}", "x", "y", meta));
        drop(held);
        assert!(m.reuse("{\"a\":1}", "x", "y", meta));
        assert_eq!(
            (m.topic(), m.json_str(), m.agent(), m.session(), m.seq()),
            ("prx.lifecycle.tool_call", "{\"a\":1}", "x", "y", 2)
        );
    }

    #[test]
    fn patterns_follow_prx_semantics() {
        let all = Pattern::parse("*").unwrap();
        let pre = Pattern::parse("prx.lifecycle.*").unwrap();
        let exact = Pattern::parse("prx.lifecycle.tool_call").unwrap();
        assert!(all.matches("x") && all.matches("prx.lifecycle.error"));
        assert!(pre.matches("prx.lifecycle.tool_call") && pre.matches("prx.lifecycle.a.b"));
        assert!(!pre.matches("prx.lifecycle") && !pre.matches("prx.lifecyclex.a"));
        assert!(exact.matches("prx.lifecycle.tool_call"));
        assert!(!exact.matches("prx.lifecycle.tool_call_start"));
        assert_eq!(pre.lifecycle_mask(), EventMask::ALL);
        assert_eq!(exact.lifecycle_mask(), EventKind::ToolCall.mask());
        assert_eq!(
            Pattern::parse("myapp.*").unwrap().lifecycle_mask(),
            EventMask::NONE
        );
        for bad in [
            "", ".", "a..b", "a.", "*.a", "a.*.b", "a b", "a/b", "a.**", "a*",
        ] {
            assert!(
                matches!(Pattern::parse(bad), Err(BusError::InvalidPattern { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn subscribe_sets_interest_and_drop_clears_it() {
        let (bus, interest) = bus(4);
        assert!(!interest.wants(EventKind::ToolCall));
        let sub = bus.subscribe("prx.lifecycle.tool_call").unwrap();
        assert!(interest.wants(EventKind::ToolCall) && !interest.wants(EventKind::Error));
        drop(sub);
        assert!(!interest.wants(EventKind::ToolCall));
        assert!(bus.subscribers().is_empty());
    }

    #[test]
    fn a_full_queue_drops_only_its_own_messages() {
        let (bus, _i) = bus(2);
        let slow = bus.subscribe("*").unwrap();
        let fast = bus.subscribe("prx.lifecycle.*").unwrap();
        for seq in 0..5 {
            bus.deliver(&msg(EventKind::TurnComplete, seq));
            assert_eq!(fast.try_recv().unwrap().seq(), seq);
        }
        assert_eq!((slow.delivered(), slow.dropped()), (2, 3));
        assert_eq!((fast.delivered(), fast.dropped()), (5, 0));
        assert_eq!(slow.try_recv().unwrap().seq(), 0);
        let c = bus.counts();
        assert_eq!((c.sent, c.delivered, c.dropped), (10, 7, 3));
        assert!(c.balanced());
    }

    #[test]
    fn publish_validates_and_reaches_matching_subscribers() {
        let (bus, _i) = bus(8);
        let sub = bus.subscribe("app.*").unwrap();
        let other = bus.subscribe("other").unwrap();
        assert_eq!(bus.publish("app.audit", " { \"ok\" : true } "), Ok(1));
        let m = sub.try_recv().unwrap();
        assert_eq!(
            (m.topic(), m.json_str(), m.event()),
            ("app.audit", r#"{"ok":true}"#, None)
        );
        assert!(matches!(other.try_recv(), Err(TryRecvError::Empty)));
        let err = bus.publish("prx.lifecycle.tool_call", "{}").unwrap_err();
        assert!(matches!(err, BusError::ReservedTopic { .. }), "{err}");
        assert!(matches!(
            bus.publish("a..b", "{}"),
            Err(BusError::InvalidTopic { .. })
        ));
        assert!(matches!(
            bus.publish("a", "{"),
            Err(BusError::InvalidJson { .. })
        ));
        let big = format!("\"{}\"", "x".repeat(2000));
        assert!(matches!(
            bus.publish("a", big),
            Err(BusError::PayloadTooLarge { .. })
        ));
        assert!(matches!(
            bus.publish_at_depth("a", b"1", MAX_DEPTH + 1),
            Err(BusError::TooDeep { .. })
        ));
    }

    #[test]
    fn close_disconnects_after_the_queue_drains() {
        let (bus, _i) = bus(4);
        let sub = bus.subscribe("*").unwrap();
        bus.deliver(&msg(EventKind::Error, 0));
        bus.close();
        assert_eq!(sub.try_recv().unwrap().seq(), 0);
        assert!(matches!(sub.try_recv(), Err(TryRecvError::Closed)));
        assert!(matches!(sub.recv(), Err(RecvError)));
        assert!(matches!(bus.subscribe("*"), Err(BusError::Closed)));
        assert_eq!(bus.publish("a", "1"), Err(BusError::Closed));
    }
}
