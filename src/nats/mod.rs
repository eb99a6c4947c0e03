//! The NATS bridge (ARCHITECTURE.md § NATS bridge): a fleet of agent hosts publishes its
//! lifecycle events to NATS, and one central prx-hooks runs the hooks for all of them.
//!
//! ```text
//! agent host                                         central host
//! ──────────                                         ────────────
//! emit ─► ring ─► worker ─► bus ─► Publisher          Consumer ─► parse (ndjson) ─► emit
//!                                   │ bounded queue      ▲  de-dup window         (paced on
//!                                   │ (a subscription)   │  by Nats-Msg-Id         the rings)
//!                                   ▼                    │                         │
//!                         NATS subject = [prefix.]topic ─┘  ack after hand-off ◄───┘
//!                         headers Prx-* + Nats-Msg-Id      (JetStream durable)
//! ```
//!
//! * [`Publisher`] is a bus subscriber (pattern in the bus's syntax, default
//!   `prx.lifecycle.*`): the core is unchanged, and its subscription queue is the bounded
//!   buffer that holds events while the server is unreachable (overflow dropped and counted
//!   on it). Core NATS publishing is confirmed by an echo through the server; JetStream
//!   publishing by the stream's acks. What was not confirmed when the connection dropped is
//!   sent again, with the same `Nats-Msg-Id`.
//! * [`Consumer`] subscribes (core NATS, or a JetStream durable pull consumer), checks the
//!   headers, parses the body with the NDJSON payload parser, skips ids it has already handed
//!   over (a window bounded in size and time, persisted to a file when given one), waits while
//!   the local pipeline is busy, emits, and (JetStream) acks once the event's hooks have run or
//!   skipped it (`crate::settle`), naks what a hook's queue dropped.
//!
//! Both own a small tokio runtime (as [`http::Server`](crate::http) does); the host needs
//! none. They are configured by [`PublishOptions`] and [`ConsumeOptions`] given to
//! [`HooksBuilder`](crate::HooksBuilder), never by hooks.json, and shut down with the
//! [`Hooks`](crate::Hooks): the consumer first (nothing more is taken from NATS while the
//! pipeline drains), the publisher last (it flushes what the drain gave it until the same
//! deadline and counts what is left).
//!
//! The statistics types below exist without the feature too, so the `nats` key of the stats
//! JSON is there (as `null`) whatever was compiled.

use serde::Serialize;

#[cfg(feature = "nats")]
mod connect;
#[cfg(feature = "nats")]
mod consume;
#[cfg(feature = "nats")]
mod lease;
#[cfg(feature = "nats")]
mod publish;
#[cfg(feature = "nats")]
pub(crate) mod relay;
#[cfg(feature = "nats")]
pub mod wire;

#[cfg(feature = "nats")]
pub use connect::{ConnectError, NatsOptions, redact_url};
#[cfg(feature = "nats")]
pub use consume::{
    ConsumeOptions, Consumer, DEFAULT_BUFFER_BYTES, DEFAULT_BUFFER_MESSAGES, DEFAULT_DEDUP_AGE,
    DEFAULT_DEDUP_IDS, DEFAULT_MAX_DELIVER,
};
#[cfg(feature = "nats")]
pub use publish::{DEFAULT_BUFFER, DEFAULT_WINDOW, PublishOptions, Publisher};

/// The stats section's name: `Stats::nats()`, `/api/stats` → `nats`, `/metrics` → `nats_*`.
pub const STATS_SECTION: &str = "nats";

/// The bridge's section of [`Stats`](crate::Stats): `None` parts are not running.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NatsStats {
    /// The publisher's, when one runs.
    pub publish: Option<PublishStats>,
    /// The consumer's, when one runs.
    pub consume: Option<ConsumeStats>,
}

/// What the publisher did. At any moment
/// `offered = published + failed + dropped + dropped_shutdown + buffered`, where `offered`
/// counts the bus messages matching its pattern; after shutdown `buffered` is 0.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PublishStats {
    /// The server, credentials redacted (`nats://user:***@host:4222`).
    pub server: String,
    /// The subjects published to, as a NATS filter (`prx.lifecycle.>`).
    pub subjects: String,
    /// The JetStream stream published to with acks; `None`: core NATS.
    pub stream: Option<String>,
    /// Connected to the server now.
    pub connected: bool,
    /// Bus messages matching the pattern (each one is counted in exactly one bucket below).
    pub offered: u64,
    /// Confirmed by the server: a JetStream ack, or (core NATS) the echo that followed them.
    pub published: u64,
    /// JetStream acks (a subset of `published`).
    pub acked: u64,
    /// Acks that said "duplicate": a retry of a message the stream already had.
    pub duplicates: u64,
    /// Messages sent again because the connection dropped (or an ack failed) before they
    /// were confirmed; each still counts once in `published` when confirmed.
    pub resent: u64,
    /// Refused by the server for good (too large for its `max_payload`, a stream error that
    /// is not a lost connection): counted, logged, not retried.
    pub failed: u64,
    /// Of `offered`, events the consumer of the same `Hooks` fed in, republished with the
    /// `Prx-Origin` and `Nats-Msg-Id` they came with and `Prx-Hops` one more.
    pub relayed: u64,
    /// Waiting to be sent or confirmed now (the queue plus the unconfirmed window).
    pub buffered: u64,
    /// The queue's capacity: what can be held while the server is unreachable.
    pub capacity: u64,
    /// Lost to a full queue (the server was unreachable or slower than the agents).
    pub dropped: u64,
    /// Still buffered when the shutdown deadline passed.
    pub dropped_shutdown: u64,
    /// Connections made after the first one.
    pub reconnects: u64,
}

/// What the consumer did. `received = consumed + duplicates + own + refused + pending`
/// (`refused()`: every refusal, `loops` included), where
/// `pending` is the messages taken from NATS and not yet handed over or refused.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ConsumeStats {
    /// The server, credentials redacted.
    pub server: String,
    /// The NATS subject filter (`prx.lifecycle.>`).
    pub subject: String,
    /// The JetStream durable consumer; `None`: a core NATS subscription.
    pub durable: Option<String>,
    /// Connected to a server now.
    pub connected: bool,
    /// Messages taken from NATS.
    pub received: u64,
    /// Handed to the local pipeline (emitted; `skipped` ones — nobody listens — included).
    pub consumed: u64,
    /// Of `consumed`, those nobody listened to locally (`Emit::Skipped`).
    pub skipped: u64,
    /// Skipped: their `Nats-Msg-Id` was handed over already, within the de-dup window.
    pub duplicates: u64,
    /// Skipped: published by this process's own publisher (the `Prx-Origin` header).
    pub own: u64,
    /// Refused: a header value that cannot become a hook variable (too long, NUL, control
    /// bytes), or a `Prx-Event` that disagrees with the subject.
    pub refused_headers: u64,
    /// Refused: the body is not a valid payload for its subject's event.
    pub refused_body: u64,
    /// Refused: the subject does not end in `prx.lifecycle.<event>`.
    pub refused_subject: u64,
    /// Refused: larger than `max_event_bytes`.
    pub refused_oversize: u64,
    /// Messages without a `Nats-Msg-Id` (handed over without de-duplication).
    pub without_id: u64,
    /// JetStream acks sent (after hand-off, or terminating a refused message).
    pub acked: u64,
    /// Times intake paused because the local pipeline was busy (back-pressure).
    pub paused: u64,
    /// Core NATS only: messages the client dropped because intake was paused longer than its
    /// buffer lasts (a slow consumer: there is no flow control without JetStream).
    pub slow_consumer: u64,
    /// Ids in the de-dup window now.
    pub window: u64,
    /// Refused: `Prx-Hops` at the limit (`wire::MAX_HOPS`, 8): relays relaying to each other
    /// in a loop.
    pub loops: u64,
    /// JetStream only: messages JetStream stopped delivering after the durable consumer's
    /// `max_deliver` — one this client cannot parse, or one redelivered too often. Never
    /// consumed. Counted by this host when it nak'ed a message on its last allowed delivery
    /// (its own state) and from JetStream's MAX_DELIVERIES advisory, each stream message once.
    pub given_up: u64,
    /// Messages with the `Nats-Msg-Id` of one handed over before but another body, agent or
    /// session: handed over (not skipped as duplicates), and counted here.
    pub id_conflicts: u64,
    /// JetStream only: handed over, waiting for their hooks to settle them before the ack
    /// (a hook ran, whatever its exit, or skipped it), now.
    pub in_flight: u64,
    /// JetStream only: handed over but dropped by a sink (a full queue, shutdown): nak'ed,
    /// JetStream delivers them again.
    pub retried: u64,
    /// Core NATS only: dropped by the consumer's own buffer, full in messages or in bytes
    /// (`ConsumeOptions::buffer`): every such drop, counted by the bridge.
    pub dropped_full: u64,
    /// Of `duplicates`, those recognized by the shared de-dup bucket (they ran on a host
    /// sharing it, maybe this one).
    pub shared_duplicates: u64,
    /// JetStream with a shared de-dup bucket only: handed over although the bucket said
    /// another host had claimed the message and not recorded it done (that host died, or
    /// stalled past the ack wait, between its claim and its record): these may have run
    /// twice. Each is also logged with its id. Every event that ran twice across hosts
    /// sharing the bucket is among them.
    pub reclaimed: u64,
    /// Core NATS only: in that buffer now, and their bytes.
    pub buffered: u64,
    /// The bytes of `buffered`.
    pub buffered_bytes: u64,
    /// Connections made after the first.
    pub reconnects: u64,
}

impl ConsumeStats {
    /// Every message refused, whatever the reason.
    pub fn refused(&self) -> u64 {
        self.refused_headers
            + self.refused_body
            + self.refused_subject
            + self.refused_oversize
            + self.loops
    }
}

impl crate::Stats {
    /// The NATS bridge's section; `None` when neither a publisher nor a consumer runs (or
    /// without the `nats` feature).
    pub fn nats(&self) -> Option<&NatsStats> {
        self.section(STATS_SECTION)
    }
}
