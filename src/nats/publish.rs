//! The publisher: bus messages → NATS subjects (ARCHITECTURE.md § NATS bridge).
//!
//! ```text
//! bus ─► Subscription (capacity = buffer; full → dropped, counted on it)
//!          └─► feeder thread: recv, batch ≤ 256 ─► channel (4 batches) ─► publish task
//!                                                  window of unconfirmed messages (≤ window)
//!                                                  core: PUB…, then an echo marker; the echo
//!                                                        coming back confirms what preceded it
//!                                                  JetStream: one ack per message (in order)
//!                                                  reconnect (or a failed ack): send the
//!                                                        whole window again, same ids
//! ```
//!
//! Invariants: a message is counted once, when it settles — `published` (confirmed),
//! `failed` (refused for good by the server) or `dropped_shutdown` (the deadline passed) —
//! and until then it is `buffered`; the subscription counts what it could not hold as
//! `dropped`. Order: messages are sent, and sent again, in the order the bus gave them, on one
//! connection, so a subscriber sees each emitter's events in order (a resend may repeat a
//! tail it has seen: at-least-once, recognized by `Nats-Msg-Id`).

use super::connect::{ConnState, ConnectError, NatsOptions, runtime};
use super::relay::Relays;
use super::wire;
use super::{PublishStats, wire::instance_id};
use crate::bus::{Bus, Message, RecvTimeoutError, Subscription};
use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

mod conn;

use conn::Conn;

/// Default of [`PublishOptions::buffer`].
pub const DEFAULT_BUFFER: usize = 65_536;
/// Default of [`PublishOptions::window`].
pub const DEFAULT_WINDOW: usize = 4_096;
/// Messages the feeder hands over at once.
const BATCH: usize = 256;
/// How long a stream the publisher creates keeps messages.
const STREAM_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// What [`Publisher`] publishes, and where.
#[derive(Clone, Debug)]
pub struct PublishOptions {
    nats: NatsOptions,
    pattern: String,
    prefix: Option<String>,
    stream: Option<String>,
    buffer: usize,
    window: usize,
    partitions: Option<u32>,
}

impl PublishOptions {
    /// Publishes `prx.lifecycle.*` with core NATS to `nats`.
    pub fn new(nats: NatsOptions) -> PublishOptions {
        PublishOptions {
            nats,
            pattern: "prx.lifecycle.*".into(),
            prefix: None,
            stream: None,
            buffer: DEFAULT_BUFFER,
            window: DEFAULT_WINDOW,
            partitions: None,
        }
    }

    /// A lifecycle event's subject gets one more token, its agent's partition among `n`
    /// ([`wire::partition`]): `prx.lifecycle.tool_call.p3`. Consumers sharing a durable
    /// consumer with the same `n` then keep each agent's events in order across hosts. `n` is
    /// taken between 1 and [`wire::MAX_PARTITIONS`].
    pub fn partitions(mut self, n: u32) -> PublishOptions {
        self.partitions = Some(n.clamp(1, super::wire::MAX_PARTITIONS));
        self
    }

    /// Which bus messages are published, in the bus's pattern syntax (an exact topic, a
    /// prefix ending in `.*` matching any depth below it, or `*`) — not NATS's.
    pub fn pattern(mut self, pattern: impl Into<String>) -> PublishOptions {
        self.pattern = pattern.into();
        self
    }

    /// Subjects become `<prefix>.<topic>` (`fleet.prx.lifecycle.tool_call`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> PublishOptions {
        self.prefix = Some(prefix.into());
        self
    }

    /// Publish to this JetStream stream and wait for its acks (at-least-once). The stream is
    /// created (file storage, messages kept 24 h, 2-minute duplicate window) if it does not
    /// exist; an existing one is used as it is.
    pub fn stream(mut self, name: impl Into<String>) -> PublishOptions {
        self.stream = Some(name.into());
        self
    }

    /// Messages held while the server is unreachable or slow (default 65,536); beyond that
    /// they are dropped and counted.
    pub fn buffer(mut self, messages: usize) -> PublishOptions {
        self.buffer = messages.max(1);
        self
    }

    /// Messages sent but not yet confirmed at once (default 4,096).
    pub fn window(mut self, messages: usize) -> PublishOptions {
        self.window = messages.max(1);
        self
    }

    /// The lifecycle events the pattern takes.
    pub(crate) fn lifecycle_mask(&self) -> crate::EventMask {
        crate::bus::pattern_lifecycle_mask(&self.pattern)
    }

    /// The NATS filter of every subject this publishes to (`prx.lifecycle.>`).
    pub fn subjects(&self) -> String {
        let f = wire::pattern_filter(self.prefix.as_deref(), &self.pattern);
        match self.partitions {
            // An exact topic: its partitions below it.
            Some(_) if !f.ends_with('>') => format!("{f}.*"),
            _ => f,
        }
    }

    /// The connection options.
    pub fn nats(&self) -> &NatsOptions {
        &self.nats
    }

    pub(crate) fn check(&self) -> Result<(), ConnectError> {
        crate::bus::check_pattern(&self.pattern).map_err(|reason| ConnectError::Invalid {
            what: "NATS publish pattern (the bus's syntax: a topic, PREFIX.* or *)",
            reason: format!("{:?}: {reason}", self.pattern),
        })?;
        if let Some(p) = &self.prefix {
            wire::check_prefix(p).map_err(|reason| ConnectError::Invalid {
                what: "NATS subject prefix",
                reason: format!("{p:?}: {reason}"),
            })?;
        }
        if let Some(s) = &self.stream {
            check_name(s, "JetStream stream name")?;
        }
        self.nats.check(false)
    }
}

/// Stream and consumer names: what JetStream accepts in a subject token.
pub(crate) fn check_name(name: &str, what: &'static str) -> Result<(), ConnectError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ConnectError::Invalid {
            what,
            reason: format!("{name:?}: 1 to 64 characters of A-Z a-z 0-9 _ -"),
        })
    }
}

/// The counters both threads update.
#[derive(Default)]
struct Counters {
    taken: AtomicU64,
    published: AtomicU64,
    acked: AtomicU64,
    duplicates: AtomicU64,
    resent: AtomicU64,
    failed: AtomicU64,
    dropped_shutdown: AtomicU64,
    relayed: AtomicU64,
}

impl Counters {
    fn settled(&self) -> u64 {
        self.published.load(Ordering::Acquire)
            + self.failed.load(Ordering::Acquire)
            + self.dropped_shutdown.load(Ordering::Acquire)
    }
}

/// The feeder thread, the runtime and the publish task on it.
type Threads = (
    JoinHandle<()>,
    tokio::runtime::Runtime,
    tokio::task::JoinHandle<()>,
);

/// The publishing half of the bridge: a bus subscriber on its own runtime. Made by
/// [`HooksBuilder::nats_publish`](crate::HooksBuilder::nats_publish) and shut down with the
/// `Hooks`.
pub struct Publisher {
    sub: Arc<Subscription>,
    counters: Arc<Counters>,
    state: Arc<ConnState>,
    server: String,
    subjects: String,
    stream: Option<String>,
    stop: watch::Sender<Option<Instant>>,
    threads: Mutex<Option<Threads>>,
}

impl Publisher {
    pub(crate) fn start(
        bus: &Bus,
        opts: PublishOptions,
        relays: Option<Arc<Relays>>,
    ) -> Result<Publisher, ConnectError> {
        opts.check()?;
        let sub = bus
            .subscribe_with_capacity(&opts.pattern, opts.buffer)
            .map_err(|e| ConnectError::Invalid {
                what: "NATS publish pattern",
                reason: e.to_string(),
            })?;
        let sub = Arc::new(sub);
        let server = opts.nats.redacted();
        let state = ConnState::new(format!("NATS publisher ({server})"));
        // Everything that can be wrong with the options is said now (the task connects).
        opts.nats
            .connect_options(ConnState::new(String::new()), "publish", false)?;
        let rt = runtime("prx-nats-publish")?;
        let counters = Arc::new(Counters::default());
        let (batch_tx, batch_rx) = mpsc::channel::<Vec<Message>>(4);
        let (stop, stop_rx) = watch::channel(None);
        let task = Task {
            nats: opts.nats.clone(),
            jetstream: opts.stream.is_some(),
            stream: opts.stream.clone(),
            subjects: opts.subjects(),
            prefix: opts.prefix.clone(),
            partitions: opts.partitions,
            window_cap: opts.window,
            counters: counters.clone(),
            state: state.clone(),
            next_id: 0,
            echo_subject: format!("_PRX_HOOKS.echo.{}.{}", instance_id(), unique()),
            retry_at: None,
            stream_ready: false,
            relays,
        };
        let handle = rt.spawn(task.run(batch_rx, stop_rx.clone()));
        let feeder = {
            let (sub, counters, stop_rx) = (sub.clone(), counters.clone(), stop_rx);
            std::thread::Builder::new()
                .name("prx-nats-feed".into())
                .spawn(move || feed(&sub, &counters, batch_tx, stop_rx))
                .map_err(ConnectError::Runtime)?
        };
        Ok(Publisher {
            sub,
            counters,
            state,
            server,
            subjects: opts.subjects(),
            stream: opts.stream,
            stop,
            threads: Mutex::new(Some((feeder, rt, handle))),
        })
    }

    /// Its bus subscription's id (the consumer's back-pressure leaves it out).
    pub(crate) fn subscription_id(&self) -> u64 {
        self.sub.id()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PublishStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Acquire);
        // Read what settles last first, so `buffered` is never negative.
        let settled = c.settled();
        let taken = get(&c.taken);
        PublishStats {
            server: self.server.clone(),
            subjects: self.subjects.clone(),
            stream: self.stream.clone(),
            connected: self.state.is_connected(),
            offered: self.sub.delivered() + self.sub.dropped(),
            published: get(&c.published),
            acked: get(&c.acked),
            duplicates: get(&c.duplicates),
            resent: get(&c.resent),
            failed: get(&c.failed),
            relayed: get(&c.relayed),
            buffered: self.sub.len() as u64 + taken.saturating_sub(settled),
            capacity: self.sub.capacity() as u64,
            dropped: self.sub.dropped(),
            dropped_shutdown: get(&c.dropped_shutdown),
            reconnects: self.state.reconnects(),
        }
    }

    /// Flushes what the bus still holds for it until `deadline`, then counts the rest as
    /// `dropped_shutdown` and stops its threads, by `deadline + SHUTDOWN_SLACK`. Call after
    /// the bus has closed (the `Hooks` does), so nothing more arrives. Idempotent.
    pub(crate) fn shutdown(&self, deadline: Instant) {
        let Some((feeder, rt, task)) = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let _ = self.stop.send(Some(deadline));
        let slack = crate::SHUTDOWN_SLACK / 2;
        rt.block_on(async {
            let _ = tokio::time::timeout_at((deadline + slack).into(), task).await;
        });
        let _ = feeder.join();
        rt.shutdown_timeout(slack);
        // Whatever the task could not settle (it was cut off at the slack) is counted here.
        let c = &self.counters;
        let left = c.taken.load(Ordering::Acquire).saturating_sub(c.settled());
        c.dropped_shutdown.fetch_add(left, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("server", &self.server)
            .field("subjects", &self.subjects)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown(Instant::now());
    }
}

/// The feeder thread: bus → batches, until the bus closes (or the task is gone, at the
/// deadline: what the subscription still holds is then counted as `dropped_shutdown`).
fn feed(
    sub: &Subscription,
    counters: &Counters,
    tx: mpsc::Sender<Vec<Message>>,
    stop: watch::Receiver<Option<Instant>>,
) {
    loop {
        let first = match sub.recv_timeout(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => {
                if tx.is_closed() {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        let mut batch = Vec::with_capacity(BATCH);
        batch.push(first);
        batch.extend(sub.try_iter().take(BATCH - 1));
        let n = batch.len() as u64;
        counters.taken.fetch_add(n, Ordering::AcqRel);
        // Blocks while the task is behind (the server is unreachable): the subscription's
        // queue is the buffer then. Past the deadline the task is gone and this fails.
        let mut pending = batch;
        loop {
            match tx.try_send(pending) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Full(b)) => {
                    pending = b;
                    if stop.borrow().is_some_and(|d| Instant::now() >= d) {
                        counters.dropped_shutdown.fetch_add(n, Ordering::AcqRel);
                        return drain_at_shutdown(sub, counters);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    counters.dropped_shutdown.fetch_add(n, Ordering::AcqRel);
                    return drain_at_shutdown(sub, counters);
                }
            }
        }
    }
}

/// Past the deadline: what the subscription still holds is counted, not sent.
fn drain_at_shutdown(sub: &Subscription, counters: &Counters) {
    let n = sub.try_iter().count() as u64;
    counters.taken.fetch_add(n, Ordering::AcqRel);
    counters.dropped_shutdown.fetch_add(n, Ordering::AcqRel);
}

type AckFuture = Pin<
    Box<
        dyn Future<
                Output = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
            > + Send,
    >,
>;

/// One message taken from the bus and not yet confirmed.
struct Out {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
    id: String,
    /// Sent on the current connection.
    sent: bool,
    /// Core NATS: the echo marker sent after it; its return confirms this message.
    marker: u64,
    /// JetStream: its ack.
    ack: Option<AckFuture>,
}

/// What one turn of the publish loop saw.
enum Step {
    Stop,
    Tick,
    Ack(Result<jetstream::publish::PublishAck, jetstream::context::PublishError>),
    Echo(Option<async_nats::Message>),
    Batch(Option<Vec<Message>>),
}

struct Task {
    nats: NatsOptions,
    jetstream: bool,
    stream: Option<String>,
    subjects: String,
    prefix: Option<String>,
    /// Lifecycle subjects end in their agent's partition among this many.
    partitions: Option<u32>,
    window_cap: usize,
    counters: Arc<Counters>,
    /// The publisher's view for stats: `connects` counts connections made.
    state: Arc<ConnState>,
    next_id: u64,
    echo_subject: String,
    /// After a failed ack: no sending again before this (a missing stream answers at once).
    retry_at: Option<Instant>,
    stream_ready: bool,
    /// With a consumer in the same `Hooks`: what it fed in, to republish as it came.
    relays: Option<Arc<Relays>>,
}

impl Task {
    async fn run(
        mut self,
        mut batches: mpsc::Receiver<Vec<Message>>,
        mut stop: watch::Receiver<Option<Instant>>,
    ) {
        let mut window: VecDeque<Out> = VecDeque::new();
        let mut marker = 0u64;
        let mut input_open = true;
        let mut conn: Option<Conn> = None;
        loop {
            let deadline = *stop.borrow_and_update();
            if deadline.is_some_and(|d| Instant::now() >= d) || (!input_open && window.is_empty()) {
                break;
            }
            if conn.as_ref().is_none_or(Conn::lost) {
                match self
                    .reconnect(conn.take(), &mut window, &mut marker, &mut stop)
                    .await
                {
                    Some(c) => conn = Some(c),
                    None => break,
                }
                continue;
            }
            let c = conn.as_mut().expect("connected above");
            // After a failed ack on a live connection: what was not confirmed, again.
            if window.front().is_some_and(|o| !o.sent)
                && self.retry_at.is_none_or(|t| Instant::now() >= t)
            {
                self.retry_at = None;
                let n = window.len() as u64;
                self.counters.resent.fetch_add(n, Ordering::AcqRel);
                self.transmit(c, &mut window, 0, &mut marker).await;
                continue;
            }
            let room = window.len() < self.window_cap;
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            let until = deadline.map_or(far, tokio::time::Instant::from);
            let mut front_ack = window.front_mut().and_then(|o| o.ack.take());
            let has_ack = front_ack.is_some();
            let waiting = !window.is_empty();
            let jetstream = c.js.is_some();
            let step = tokio::select! {
                biased;
                _ = tokio::time::sleep_until(until) => Step::Stop,
                _ = stop.changed() => Step::Tick,
                r = async { front_ack.as_mut().expect("guarded by has_ack").await }, if has_ack => Step::Ack(r),
                m = futures_util::StreamExt::next(&mut c.echo), if !jetstream && waiting => Step::Echo(m),
                b = batches.recv(), if room && input_open => Step::Batch(b),
                // Notice a lost connection while waiting for echoes or acks that will not come.
                _ = tokio::time::sleep(Duration::from_millis(50)), if waiting => Step::Tick,
            };
            if let Step::Ack(r) = step {
                self.settle_ack(r, &mut window);
                continue;
            }
            if let (Some(f), Some(o)) = (front_ack, window.front_mut()) {
                o.ack = Some(f);
            }
            match step {
                Step::Stop => break,
                Step::Echo(Some(m)) => self.confirm_echo(&m, &mut window),
                Step::Batch(Some(batch)) => {
                    let from = window.len();
                    self.take_batch(batch, &mut window);
                    let c = conn.as_ref().expect("connected above");
                    self.transmit(c, &mut window, from, &mut marker).await;
                }
                Step::Batch(None) => input_open = false,
                Step::Echo(None) | Step::Tick | Step::Ack(_) => {}
            }
        }
        drop(conn);
        self.count_left(&window, &mut batches);
    }

    /// Core NATS: an echo marker came back, confirming every message sent before it.
    fn confirm_echo(&self, m: &async_nats::Message, window: &mut VecDeque<Out>) {
        let n = std::str::from_utf8(&m.payload)
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        while let Some(n) = n
            && window.front().is_some_and(|o| o.sent && o.marker <= n)
        {
            window.pop_front();
            self.counters.published.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The deadline: what is unconfirmed is counted (the feeder counts what it still had).
    fn count_left(&self, window: &VecDeque<Out>, batches: &mut mpsc::Receiver<Vec<Message>>) {
        let c = &self.counters;
        c.dropped_shutdown
            .fetch_add(window.len() as u64, Ordering::AcqRel);
        batches.close();
        while let Ok(b) = batches.try_recv() {
            c.dropped_shutdown
                .fetch_add(b.len() as u64, Ordering::AcqRel);
        }
    }

    fn take_batch(&mut self, batch: Vec<Message>, window: &mut VecDeque<Out>) {
        for msg in batch {
            // A relayed event keeps its first publisher's origin and id, one hop more.
            let relayed = match (&self.relays, msg.relay()) {
                (Some(r), relay) if relay != 0 => r.take(relay, msg.seq()),
                _ => None,
            };
            let (id, origin, hops) = match relayed {
                Some(r) => {
                    self.counters.relayed.fetch_add(1, Ordering::AcqRel);
                    (r.id, r.origin, Some(r.hops.saturating_add(1)))
                }
                // An ingested event keeps the id its sender gave it (`prx-hooks send`), so a
                // second delivery of it is also a duplicate to JetStream.
                None => match msg.event_id() {
                    Some(id) => (id.to_string(), instance_id().to_string(), None),
                    None => {
                        let id = wire::message_id(instance_id(), self.next_id);
                        self.next_id += 1;
                        (id, instance_id().to_string(), None)
                    }
                },
            };
            window.push_back(Out {
                subject: match self.partitions {
                    Some(n) if msg.event().is_some() => format!(
                        "{}.{}",
                        wire::subject(self.prefix.as_deref(), msg.topic()),
                        wire::partition_token(wire::partition(msg.agent(), n))
                    ),
                    _ => wire::subject(self.prefix.as_deref(), msg.topic()),
                },
                headers: headers(&msg, &id, &origin, hops),
                payload: Bytes::copy_from_slice(msg.json()),
                id,
                sent: false,
                marker: 0,
                ack: None,
            });
        }
    }

    /// Sends the window from `from` on (in order), then (core NATS) one echo marker.
    async fn transmit(&self, c: &Conn, window: &mut VecDeque<Out>, from: usize, marker: &mut u64) {
        if from >= window.len() {
            return;
        }
        *marker += 1;
        let mut refused = Vec::new();
        for (i, o) in window.iter_mut().enumerate().skip(from) {
            o.marker = *marker;
            o.sent = true;
            let sent = match &c.js {
                Some(js) => {
                    let publish = jetstream::message::PublishMessage::build()
                        .payload(o.payload.clone())
                        .headers(o.headers.clone())
                        .message_id(&o.id);
                    js.send_publish(o.subject.clone(), publish)
                        .await
                        .map(|ack| o.ack = Some(ack.into_future()))
                        .map_err(|e| {
                            (
                                e.kind()
                                    == jetstream::context::PublishErrorKind::MaxPayloadExceeded,
                                e.to_string(),
                            )
                        })
                }
                // Refused for good only when the message itself is wrong (too large, a bad
                // subject); a send that failed (the connection going) is sent again.
                None => c
                    .client
                    .publish_with_headers(o.subject.clone(), o.headers.clone(), o.payload.clone())
                    .await
                    .map_err(|e| {
                        use async_nats::client::PublishErrorKind as K;
                        (
                            matches!(e.kind(), K::MaxPayloadExceeded | K::InvalidSubject),
                            e.to_string(),
                        )
                    }),
            };
            match sent {
                Ok(()) => {}
                // Too large for the server (or a bad subject): never retried.
                Err((true, why)) => refused.push((i, why)),
                Err((false, why)) => {
                    tracing::debug!("NATS publisher: {}: {why}; sending again", o.id);
                    o.sent = false;
                }
            }
        }
        if c.js.is_none() {
            // The marker's subject is this publisher's alone; its return means the server
            // processed everything above (a connection's messages are processed in order).
            let n = Bytes::from(marker.to_string());
            let _ = c.client.publish(self.echo_subject.clone(), n).await;
        }
        for (i, why) in refused.into_iter().rev() {
            if let Some(o) = window.remove(i) {
                tracing::warn!("NATS publisher: {} ({}) refused: {why}", o.subject, o.id);
            }
            self.counters.failed.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn settle_ack(
        &mut self,
        ack: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
        window: &mut VecDeque<Out>,
    ) {
        use jetstream::context::PublishErrorKind as K;
        match ack {
            Ok(ack) => {
                window.pop_front();
                let c = &self.counters;
                c.published.fetch_add(1, Ordering::AcqRel);
                c.acked.fetch_add(1, Ordering::AcqRel);
                if ack.duplicate {
                    c.duplicates.fetch_add(1, Ordering::AcqRel);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    K::TimedOut | K::BrokenPipe | K::StreamNotFound | K::MaxAckPending
                ) =>
            {
                // Not stored, or not known to be: everything unconfirmed goes again (on this
                // connection after a pause, or on the next), with the same ids.
                tracing::debug!(
                    "NATS publisher: ack of {} failed: {e}; sending again",
                    window.front().map_or("?", |o| o.id.as_str())
                );
                for o in window.iter_mut() {
                    o.sent = false;
                    o.ack = None;
                }
                self.retry_at = Some(Instant::now() + Duration::from_millis(250));
            }
            Err(e) => {
                if let Some(o) = window.pop_front() {
                    tracing::warn!(
                        "NATS publisher: {} ({}) refused by the stream: {e}",
                        o.subject,
                        o.id
                    );
                }
                self.counters.failed.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

/// A number no other publisher of this process uses (the echo subject).
fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The headers of one message (docs/nats.md § NATS, "Wire format").
fn headers(msg: &Message, id: &str, origin: &str, hops: Option<u32>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(kind) = msg.event() {
        h.insert(wire::EVENT, kind.name());
    }
    if !msg.agent().is_empty() {
        h.insert(wire::AGENT, wire::encode_value(msg.agent()).into_owned());
    }
    if !msg.session().is_empty() {
        h.insert(
            wire::SESSION,
            wire::encode_value(msg.session()).into_owned(),
        );
    }
    h.insert(wire::SEQ, msg.seq().to_string());
    // The agent's own time where the event carries it (an ingested event's `Prx-Timestamp`).
    match msg.origin_timestamp() {
        Some(t) => h.insert(wire::TIMESTAMP, t),
        None => h.insert(wire::TIMESTAMP, msg.timestamp_rfc3339()),
    }
    h.insert(wire::ORIGIN, origin);
    if let Some(hops) = hops {
        h.insert(wire::HOPS, hops.to_string());
    }
    h.insert(wire::MSG_ID, id);
    h
}
