//! The consumer: NATS messages → the local pipeline (ARCHITECTURE.md § NATS bridge).
//!
//! ```text
//! NATS ─► core subscription (or a queue group)
//!      │     └► our buffer, bounded in messages and bytes (drops counted: dropped_full)
//!      └► JetStream durable pull consumer (at most 128 in flight; a pull for the room left)
//!            └─► per message: subject → event · Prx-Origin our own? skip · headers checked ·
//!                Nats-Msg-Id seen (window, shared bucket, in flight)? skip · body parsed ·
//!                wait until its hooks' queues have room · emit with a ticket (`settle`) ·
//!                … its hooks ran or skipped it: id into the window (its file, the bucket) ·
//!                then ack; a hook's queue dropped it: nak with a delay
//! ```
//!
//! Delivery is at-least-once: an ack lost on the way, or a process stopped before its hooks
//! settled a message, makes JetStream deliver it again, and the de-dup window (bounded in
//! size and age, persisted when given a file; shared between hosts through a key-value bucket
//! when given one) is what recognizes it. A refused message is terminated (JetStream never
//! redelivers it); one taken but not handed over when the consumer stops is nak'ed, so the
//! next consumer gets it at once.

use super::connect::{ConnState, ConnectError, NatsOptions, runtime};
use super::publish::check_name;
use super::{ConsumeStats, wire};
use crate::Feed;
use crate::emitter::Emit;
use crate::ndjson::{self, ParseOptions};
use async_nats::jetstream;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod handle;
mod pull;
mod pulling;
mod window;

use window::*;

/// Default of [`ConsumeOptions::dedup_window`]: ids remembered.
pub const DEFAULT_DEDUP_IDS: usize = 100_000;
/// Default of [`ConsumeOptions::dedup_window`]: how long an id is remembered.
pub const DEFAULT_DEDUP_AGE: Duration = Duration::from_secs(3600);

/// How long a batch's acks and their flush may take before the consumer goes on without them.
const ACKS_WAIT: Duration = Duration::from_secs(2);
/// Default of [`ConsumeOptions::buffer`]: messages.
pub const DEFAULT_BUFFER_MESSAGES: usize = 65_536;
/// Default of [`ConsumeOptions::buffer`]: bytes.
pub const DEFAULT_BUFFER_BYTES: usize = 64 << 20;
/// Default of [`ConsumeOptions::max_deliver`].
pub const DEFAULT_MAX_DELIVER: u32 = 5;
/// Messages pulled at once, at most.
const BATCH: usize = 256;
/// Core NATS: messages handed over per look at `Feed::busy` (what intake can overshoot by).
const CORE_BATCH: usize = 32;
/// The client's channel per subscription, in messages (see `Consumer::start`).
const CLIENT_CHANNEL: usize = 1 << 20;
/// JetStream: messages handed over and not yet settled by their hooks, at most. With the
/// default queue of 256 per hook, the consumer alone never fills a hook's queue; a pull asks
/// for no more than the room left.
const MAX_IN_FLIGHT: usize = 128;
/// A pull's expiry. Messages are handled as they arrive, so this bounds only how long an idle
/// pull stands.
const PULL_EXPIRES: Duration = Duration::from_millis(500);
/// Stopping: how long a standing pull is still read, so that what it brings is nak'ed (at
/// once delivered again) rather than left to the ack wait.
const STOP_READ: Duration = Duration::from_millis(PULL_EXPIRES.as_millis() as u64 + 1000);
/// How long a message a sink dropped waits before JetStream delivers it again.
const RETRY_DELAY: Duration = Duration::from_millis(500);
/// An in-flight message gets an in-progress ack this often, so that the 10 s ack wait does not
/// redeliver it while its hooks still run.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// Emitters kept (one per agent and session seen; the oldest goes first).
const MAX_EMITTERS: usize = 4096;

/// Where [`Consumer`] reads from, and how it de-duplicates.
#[derive(Clone, Debug)]
pub struct ConsumeOptions {
    nats: NatsOptions,
    subject: String,
    durable: Option<String>,
    queue: Option<String>,
    stream: Option<String>,
    shared_dedup: Option<String>,
    dedup_ids: usize,
    dedup_age: Duration,
    dedup_file: Option<PathBuf>,
    parse: ParseOptions,
    max_deliver: u32,
    buffer_messages: usize,
    buffer_bytes: usize,
    partitions: Option<u32>,
}

impl ConsumeOptions {
    /// Core NATS, subject `prx.lifecycle.>`, no persisted window.
    pub fn new(nats: NatsOptions) -> ConsumeOptions {
        ConsumeOptions {
            nats,
            subject: wire::LIFECYCLE_SUBJECTS.into(),
            durable: None,
            queue: None,
            stream: None,
            shared_dedup: None,
            dedup_ids: DEFAULT_DEDUP_IDS,
            dedup_age: DEFAULT_DEDUP_AGE,
            dedup_file: None,
            parse: ParseOptions::default(),
            max_deliver: DEFAULT_MAX_DELIVER,
            buffer_messages: DEFAULT_BUFFER_MESSAGES,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            partitions: None,
        }
    }

    /// With [`durable`](ConsumeOptions::durable): per-agent order across hosts. The subjects
    /// carry their agent's partition among `n` (publishers with the same
    /// [`PublishOptions::partitions`](super::PublishOptions::partitions)); each partition has
    /// a durable consumer of its own (`<durable>-<k>`), and the hosts sharing them hold at
    /// most one lease per partition each at a time, in the key-value bucket
    /// `PRXH_<stream>_<durable>`: one host pulls a partition at a time, and a host that dies
    /// has its partitions taken over by the others once its leases expire (15 s).
    pub fn partitions(mut self, n: u32) -> ConsumeOptions {
        self.partitions = Some(n.max(1));
        self
    }

    /// Core NATS: the consumer's buffer between the client and the pipeline holds at most
    /// `messages` messages and `bytes` bytes (defaults 65,536 and 64 MiB; at least 1 and
    /// 1 MiB); what arrives while it is full is dropped and counted (`dropped_full`).
    pub fn buffer(mut self, messages: usize, bytes: usize) -> ConsumeOptions {
        self.buffer_messages = messages.max(1);
        self.buffer_bytes = bytes.max(1 << 20);
        self
    }

    /// The subject filter, in NATS's syntax (`*` one token, `>` the rest) — not the bus's.
    pub fn subject(mut self, filter: impl Into<String>) -> ConsumeOptions {
        self.subject = filter.into();
        self
    }

    /// A JetStream durable pull consumer of this name: it remembers what was acked across
    /// restarts, and is pulled from only while the pipeline has room.
    pub fn durable(mut self, name: impl Into<String>) -> ConsumeOptions {
        self.durable = Some(name.into());
        self
    }

    /// Core NATS: subscribe in this queue group, so that the consumers sharing it split the
    /// events (NATS gives each message to one member). Nothing orders or de-duplicates across
    /// the members: an agent's events may run on several hosts at once, out of order.
    /// Ignored with [`durable`](ConsumeOptions::durable) (a durable consumer's pullers share
    /// its messages already).
    pub fn queue(mut self, group: impl Into<String>) -> ConsumeOptions {
        self.queue = Some(group.into());
        self
    }

    /// JetStream: hosts sharing the durable consumer also share what ran, in a key-value
    /// bucket of this name (the stream `KV_<name>`, one entry per message id, kept for the
    /// window's age): a message redelivered to another host after a lost ack, or stored again
    /// after the stream's duplicate window, is recognized there too. Per event it costs a
    /// claim before the hand-off, a start record before its first hook run starts and a done
    /// record after the hooks ran, before the ack (three JetStream publishes, acked); a message
    /// found started by another host and not done runs and is counted (`reclaimed`): every
    /// event run twice is among those.
    pub fn shared_dedup(mut self, bucket: impl Into<String>) -> ConsumeOptions {
        self.shared_dedup = Some(bucket.into());
        self
    }

    /// The stream the durable consumer reads (default: the stream holding the subject).
    pub fn stream(mut self, name: impl Into<String>) -> ConsumeOptions {
        self.stream = Some(name.into());
        self
    }

    /// Remember the last `ids` message ids for at most `age` (defaults 100,000 and 1 h).
    pub fn dedup_window(mut self, ids: usize, age: Duration) -> ConsumeOptions {
        self.dedup_ids = ids.max(1);
        self.dedup_age = age;
        self
    }

    /// Keep the window in this file (appended before each ack, compacted as it grows), so a
    /// restarted consumer still recognizes what it handed over before.
    pub fn dedup_file(mut self, path: impl AsRef<Path>) -> ConsumeOptions {
        self.dedup_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// A durable consumer it creates lets JetStream deliver a message at most this many
    /// times (default 5, at least 1): a message this client cannot take (async-nats drops
    /// the connection on a header that is not UTF-8) stalls the consumer for at most
    /// `max_deliver` × the 10 s ack wait, then JetStream gives up on it and says so in an
    /// advisory, counted as `given_up`. An existing durable consumer keeps its setting.
    pub fn max_deliver(mut self, n: u32) -> ConsumeOptions {
        self.max_deliver = n.max(1);
        self
    }

    /// How bodies are parsed (`lenient`: documented fields may be missing).
    pub fn parse_options(mut self, parse: ParseOptions) -> ConsumeOptions {
        self.parse = parse;
        self
    }

    /// The connection options.
    pub fn nats(&self) -> &NatsOptions {
        &self.nats
    }

    /// The subject filter consumed, in NATS's syntax.
    pub fn subject_filter(&self) -> &str {
        &self.subject
    }

    pub(crate) fn check(&self) -> Result<(), ConnectError> {
        wire::check_filter(&self.subject).map_err(|reason| ConnectError::Invalid {
            what: "NATS subject (NATS's syntax: tokens, * or a final >)",
            reason: format!("{:?}: {reason}", self.subject),
        })?;
        if let Some(d) = &self.durable {
            check_name(d, "JetStream durable consumer name")?;
        }
        if let Some(s) = &self.stream {
            check_name(s, "JetStream stream name")?;
        }
        if let Some(q) = &self.queue {
            check_name(q, "NATS queue group name")?;
        }
        if let Some(b) = &self.shared_dedup {
            check_name(b, "JetStream key-value bucket name")?;
        }
        if self.partitions.is_some() && !wire::partitionable(&self.subject) {
            return Err(ConnectError::Invalid {
                what: "NATS subject with partitions",
                reason: format!(
                    "{:?}: must end in prx.lifecycle.>, prx.lifecycle.* or prx.lifecycle.<event>",
                    self.subject
                ),
            });
        }
        self.nats.check(true)
    }
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    consumed: AtomicU64,
    skipped: AtomicU64,
    duplicates: AtomicU64,
    own: AtomicU64,
    refused_headers: AtomicU64,
    refused_body: AtomicU64,
    refused_subject: AtomicU64,
    refused_oversize: AtomicU64,
    without_id: AtomicU64,
    acked: AtomicU64,
    paused: AtomicU64,
    window: AtomicU64,
    loops: AtomicU64,
    given_up: AtomicU64,
    id_conflicts: AtomicU64,
    in_flight: AtomicU64,
    retried: AtomicU64,
    dropped_full: AtomicU64,
    shared_duplicates: AtomicU64,
    reclaimed: AtomicU64,
    buffered: AtomicU64,
    buffered_bytes: AtomicU64,
}

/// The consuming half of the bridge: a thread pulling from NATS into the pipeline. Made by
/// [`HooksBuilder::nats_consume`](crate::HooksBuilder::nats_consume); stopped first when the
/// `Hooks` shuts down.
pub struct Consumer {
    counters: Arc<Counters>,
    state: Arc<ConnState>,
    server: String,
    subject: String,
    durable: Option<String>,
    stop: Arc<AtomicBool>,
    /// Until when a stopping JetStream consumer waits for what is in flight to settle.
    drain_until: Arc<Mutex<Option<Instant>>>,
    wake: Arc<tokio::sync::Notify>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Consumer {
    pub(crate) fn start(feed: Feed, opts: ConsumeOptions) -> Result<Consumer, ConnectError> {
        opts.check()?;
        let server = opts.nats.redacted();
        let state = ConnState::new(format!("NATS consumer ({server})"));
        let (connect, addrs) = opts.nats.connect_options(state.clone(), "consume", true)?;
        // The client's channel for a subscription is drained at once into the core
        // consumer's own bounded buffer, but only when the client's connection task yields,
        // and it reads many messages per turn: room enough that a flood on loopback never
        // overflows it (async-nats reports such drops through a 128-slot event channel, which
        // misses most of them). Its slots are allocated as used.
        let connect = connect.subscription_capacity(CLIENT_CHANNEL);
        let window = Window::open(opts.dedup_ids, opts.dedup_age, opts.dedup_file.clone())?;
        let rt = runtime("prx-nats-consume")?;
        let client = rt
            .block_on(connect.connect(addrs))
            .map_err(|e| ConnectError::Invalid {
                what: "NATS connection",
                reason: e.to_string(),
            })?;
        // A server beyond this machine must ask for credentials (its INFO's auth_required):
        // credentials sent to one that accepts anybody keep nobody out. Checked at the first
        // connection here (when it comes within the connection timeout) and at every
        // connection in the worker.
        if opts.nats.needs_auth_check() {
            let connected = rt.block_on(async {
                let until = tokio::time::Instant::now() + Duration::from_secs(5);
                while client.connection_state() != async_nats::connection::State::Connected {
                    if tokio::time::Instant::now() >= until {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                true
            });
            if connected && !client.server_info().auth_required {
                return Err(ConnectError::NoAuthRequired {
                    server: server.clone(),
                });
            }
        }
        let counters = Arc::new(Counters::default());
        counters
            .window
            .store(window.len() as u64, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let drain_until = Arc::new(Mutex::new(None));
        let notify = Arc::new(tokio::sync::Notify::new());
        let settled = {
            let notify = notify.clone();
            crate::settle::Settled::new(Box::new(move || notify.notify_one()))
        };
        let worker = Worker {
            drain_until: drain_until.clone(),
            notify,
            settled,
            flights: HashMap::new(),
            in_flight_limit: MAX_IN_FLIGHT,
            flying: HashMap::new(),
            next_key: 0,
            shared: None,
            lease_table: None,
            start_down: Arc::default(),
            shared_digest: None,
            max_deliver: HashMap::new(),
            given_up: Arc::new(GivenUp::new(counters.clone())),
            auth_check: opts.nats.needs_auth_check(),
            state: state.clone(),
            server: server.clone(),
            feed,
            opts: opts.clone(),
            counters: counters.clone(),
            stop: stop.clone(),
            wake: wake.clone(),
            window,
            emitters: HashMap::new(),
            emitter_order: VecDeque::new(),
            said: Said::default(),
            made_ids: 0,
        };
        let thread = std::thread::Builder::new()
            .name("prx-nats-consume".into())
            .spawn(move || {
                worker.run(&rt, client);
                rt.shutdown_timeout(Duration::from_millis(100));
            })
            .map_err(ConnectError::Runtime)?;
        Ok(Consumer {
            counters,
            state,
            server,
            subject: opts.subject,
            durable: opts.durable,
            stop,
            drain_until,
            wake,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// What it did so far (also `Hooks::stats` → `nats.consume`).
    pub fn stats(&self) -> ConsumeStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Acquire);
        // `received` last: every other counter is then at most what it implies.
        let mut s = ConsumeStats {
            server: self.server.clone(),
            subject: self.subject.clone(),
            durable: self.durable.clone(),
            connected: self.state.is_connected(),
            consumed: get(&c.consumed),
            skipped: get(&c.skipped),
            duplicates: get(&c.duplicates),
            own: get(&c.own),
            refused_headers: get(&c.refused_headers),
            refused_body: get(&c.refused_body),
            refused_subject: get(&c.refused_subject),
            refused_oversize: get(&c.refused_oversize),
            without_id: get(&c.without_id),
            acked: get(&c.acked),
            paused: get(&c.paused),
            slow_consumer: self.state.slow_consumer.load(Ordering::Relaxed),
            window: get(&c.window),
            loops: get(&c.loops),
            given_up: get(&c.given_up),
            id_conflicts: get(&c.id_conflicts),
            in_flight: get(&c.in_flight),
            retried: get(&c.retried),
            dropped_full: get(&c.dropped_full),
            shared_duplicates: get(&c.shared_duplicates),
            reclaimed: get(&c.reclaimed),
            buffered: get(&c.buffered),
            buffered_bytes: get(&c.buffered_bytes),
            reconnects: self.state.reconnects(),
            ..ConsumeStats::default()
        };
        s.received = get(&c.received);
        s
    }

    /// Stops taking messages and waits for the thread: it naks what it took and did not hand
    /// over; with JetStream it waits until `deadline` for the hooks of what it handed over to
    /// settle, acks those, and naks the rest. Idempotent.
    pub(crate) fn stop(&self, deadline: Instant) {
        {
            let mut d = self.drain_until.lock().unwrap_or_else(|e| e.into_inner());
            if d.is_none() {
                *d = Some(deadline);
            }
        }
        self.stop.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("server", &self.server)
            .field("subject", &self.subject)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop(Instant::now());
    }
}

/// What became of one message.
enum Fate {
    /// Handed to the pipeline: ack.
    Handed,
    /// Already handed (duplicate) or our own: ack, nothing to do.
    Skip,
    /// Refused for good: terminate.
    Refused,
    /// Not handed (stopping): nak, so it is delivered again at once.
    Later,
    /// JetStream: a redelivery of the message in flight under this key (its hooks still
    /// run); acked with it.
    InFlight(u64),
}

/// One message, whichever way it came.
struct Incoming<'a> {
    subject: &'a str,
    headers: Option<&'a async_nats::HeaderMap>,
    payload: &'a [u8],
    /// JetStream: its delivery count (1 on the first delivery); `None` over core NATS.
    delivery: Option<u64>,
    /// JetStream with a shared de-dup bucket: another host's claim on it was taken over.
    reclaimed: bool,
    /// With partitions: the lease of its partition, which each run checks before it starts.
    fence: Option<crate::settle::Fence>,
    /// With a shared de-dup bucket: its start record, written before its first run starts.
    start: Option<crate::settle::Start>,
}

impl Incoming<'_> {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers?.get(name).map(|v| v.as_str())
    }
}

struct Worker {
    state: Arc<ConnState>,
    /// A server of the list is remote and `--nats-insecure` is off: check each connection.
    auth_check: bool,
    server: String,
    feed: Feed,
    opts: ConsumeOptions,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    /// Wakes a pull or a wait for the next message when stopping.
    wake: Arc<tokio::sync::Notify>,
    window: Window,
    /// Per (agent, session): the emitter, and the `seq` its next queued event will get (the
    /// key of its relay record).
    emitters: HashMap<(String, String), (crate::Emitter, u64)>,
    emitter_order: VecDeque<(String, String)>,
    said: Said,
    /// Ids made for relayed messages that had none.
    made_ids: u64,
    drain_until: Arc<Mutex<Option<Instant>>>,
    /// Woken by a ticket's report.
    notify: Arc<tokio::sync::Notify>,
    /// Where the tickets of what was handed over report (`crate::settle`).
    settled: Arc<crate::settle::Settled>,
    /// JetStream: handed over, not yet settled, by ticket key.
    flights: HashMap<u64, Flight>,
    /// How many may be in flight now: [`MAX_IN_FLIGHT`], halved each time a sink drops one
    /// (a queue the consumer cannot see, such as a plugin's, was full), and grown by one per
    /// message that ran. So a slow sink is fed about what it takes, and a message is not
    /// dropped and nak'ed again and again until JetStream's delivery limit gives up on it.
    in_flight_limit: usize,
    /// Their ids.
    flying: HashMap<String, u64>,
    next_key: u64,
    /// The shared de-dup bucket ([`ConsumeOptions::shared_dedup`]), once opened.
    shared: Option<Shared>,
    /// With partitions: the leases this host holds.
    lease_table: Option<super::lease::Shared>,
    /// Until when ([`crate::settle::lease_clock`]) no start record is tried: the shared
    /// bucket left one unanswered.
    start_down: Arc<AtomicU64>,
    /// What the bucket holds for the message in hand: the digest it ran with.
    shared_digest: Option<u64>,
    /// JetStream: each durable consumer's delivery limit (`max_deliver`, as the server has
    /// it), by name: a message nak'ed on its last delivery is one JetStream gives up on.
    max_deliver: HashMap<String, i64>,
    /// The give-ups counted, by this host's own naks and by the advisory.
    given_up: Arc<GivenUp>,
}

/// The stream messages counted as given up by JetStream (`given_up`): by this host, when it
/// nak'ed a message on its last allowed delivery (its own state: nothing is missed while
/// disconnected), and by the MAX_DELIVERIES advisory; each stream sequence once (the last
/// 4,096 remembered).
pub(super) struct GivenUp {
    seen: Mutex<(std::collections::HashSet<u64>, VecDeque<u64>)>,
    counters: Arc<Counters>,
}

impl GivenUp {
    const REMEMBERED: usize = 4096;

    fn new(counters: Arc<Counters>) -> GivenUp {
        GivenUp {
            seen: Mutex::new(Default::default()),
            counters,
        }
    }

    /// Counts stream message `seq` as given up; false if it was already.
    pub(super) fn count(&self, seq: Option<u64>) -> bool {
        if let Some(seq) = seq {
            let mut g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let (set, order) = &mut *g;
            if !set.insert(seq) {
                return false;
            }
            order.push_back(seq);
            if order.len() > Self::REMEMBERED
                && let Some(old) = order.pop_front()
            {
                set.remove(&old);
            }
        }
        self.counters.given_up.fetch_add(1, Ordering::AcqRel);
        true
    }
}

/// The shared de-dup bucket: a stream `KV_<bucket>` of subjects `$KV.<bucket>.<key>`, one
/// message per key (the key-value layout), the value the digest the event ran with.
#[derive(Clone)]
struct Shared {
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    bucket: String,
}

impl Shared {
    /// `$KV.<bucket>.<FNV-1a of the id, hex>`: any id, one subject token.
    fn subject(&self, id: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in id.as_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("$KV.{}.{h:016x}{:04x}", self.bucket, id.len() & 0xffff)
    }

    async fn open(js: &jetstream::Context, bucket: &str, age: Duration) -> Result<Shared, String> {
        let config = jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age: age,
            allow_direct: true,
            ..Default::default()
        };
        let stream = js
            .get_or_create_stream(config)
            .await
            .map_err(|e| format!("the de-dup bucket {bucket:?}: {e}"))?;
        Ok(Shared {
            js: js.clone(),
            stream,
            bucket: bucket.to_string(),
        })
    }

    /// Writes `value` under `id`'s key if the key's last write is `expect` (0: the key holds
    /// nothing): the write's sequence; `Err(true)` when the key held something else (another
    /// write won), `Err(false)` when the server did not answer in time.
    async fn write(&self, id: &str, value: String, expect: u64) -> Result<u64, bool> {
        super::lease::write_if(&self.js, self.subject(id), value, Some(expect)).await
    }

    /// What the key of `id` holds now.
    async fn read(&self, id: &str) -> Record {
        let got = tokio::time::timeout(
            ACKS_WAIT,
            self.stream
                .get_last_raw_message_by_subject(&self.subject(id)),
        )
        .await;
        let Ok(Ok(m)) = got else {
            return Record::Absent;
        };
        let text = std::str::from_utf8(&m.payload).unwrap_or("").trim();
        let claimed = |host: &str, started| Record::Claimed {
            host: host.to_string(),
            seq: m.sequence,
            started,
        };
        if let Some(host) = text.strip_prefix("c ") {
            return claimed(host, true);
        }
        match text.strip_prefix("q ") {
            Some(host) => claimed(host, false),
            None if text.is_empty() => Record::Free { seq: m.sequence },
            None => u64::from_str_radix(text, 16).map_or(Record::Absent, Record::Done),
        }
    }

    /// Withdraws this host's claim on `id` (the claim's sequence `seq`) for a message that
    /// was not handed over after all: its key then holds an empty value, which the next
    /// claim replaces without counting it as reclaimed.
    async fn unclaim(&self, id: &str, seq: u64) {
        let _ = self.write(id, String::new(), seq).await;
    }

    /// The start record of `id`, which this host claimed (its claim's sequence in `seq`): the
    /// first of its runs about to start asks for it, and the runs start once the bucket holds
    /// `c <host>` in place of exactly that claim (the sequence moves to the record's). Written
    /// on the consumer's runtime, never on the thread that asks. Unanswered, it is tried again
    /// (after a second, when the bucket left any write unanswered: `down`) until it is
    /// answered, the event's message is gone, or the consumer stops: the run waits, its message
    /// stays in flight (in progress, not redelivered), and a bucket that does not answer for a
    /// while spends none of the message's deliveries. The claim taken over by another host:
    /// refused (the event is nak'ed).
    fn start_record(
        &self,
        id: &str,
        seq: Arc<AtomicU64>,
        down: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
    ) -> crate::settle::Start {
        let (shared, id) = (self.clone(), id.to_string());
        let handle = tokio::runtime::Handle::current();
        crate::settle::Start::new(Box::new(move |answer| {
            let (shared, id) = (shared.clone(), id.clone());
            let (seq, down, stop) = (seq.clone(), down.clone(), stop.clone());
            // On the consumer's runtime (a runtime shut down drops the task and its answer:
            // refused).
            handle.spawn(async move {
                let mine = format!("c {}", wire::instance_id());
                let mut unanswered = false;
                while answer.wanted() && !stop.load(Ordering::Acquire) {
                    let wait = down
                        .load(Ordering::Acquire)
                        .saturating_sub(crate::settle::lease_clock());
                    if wait > 0 {
                        tokio::time::sleep(Duration::from_millis(wait.min(100))).await;
                        continue;
                    }
                    match shared
                        .write(&id, mine.clone(), seq.load(Ordering::Acquire))
                        .await
                    {
                        Ok(s) => {
                            seq.store(s, Ordering::Release);
                            return answer.give(true);
                        }
                        Err(true) => {
                            // An earlier write left unanswered may have been made after all.
                            if unanswered
                                && let Record::Claimed {
                                    host,
                                    seq: s,
                                    started: true,
                                } = shared.read(&id).await
                                && host == wire::instance_id()
                            {
                                seq.store(s, Ordering::Release);
                                return answer.give(true);
                            }
                            return answer.give(false);
                        }
                        Err(false) => {
                            unanswered = true;
                            down.store(crate::settle::lease_clock() + 1000, Ordering::Release);
                        }
                    }
                }
                answer.give(false);
            });
        }))
    }

    /// Claims `id` for this host before its hand-over: the claim's sequence (the done record
    /// replaces exactly it), and what the key held before.
    async fn claim(&self, id: &str) -> (Option<u64>, Record) {
        let mine = || format!("q {}", wire::instance_id());
        match self.write(id, mine(), 0).await {
            Ok(seq) => (Some(seq), Record::Absent),
            Err(true) => {
                let before = self.read(id).await;
                match &before {
                    // This host's own (a redelivery of a message it holds or naked): kept as
                    // it is, so the done record still replaces exactly it.
                    Record::Claimed { host, seq, .. } if host == wire::instance_id() => {
                        (Some(*seq), before)
                    }
                    // Taken over: the dead (or stalled) host's claim becomes ours.
                    Record::Claimed { seq, .. } => {
                        (self.write(id, mine(), *seq).await.ok(), before)
                    }
                    // Withdrawn by a host that did not hand it over.
                    Record::Free { seq } => {
                        (self.write(id, mine(), *seq).await.ok(), Record::Absent)
                    }
                    _ => (None, before),
                }
            }
            Err(false) => {
                tracing::warn!(
                    "NATS consumer: {}: the de-dup bucket did not confirm a claim in time: handed over unclaimed (if this host dies before recording it done, a second run elsewhere is not recognized)",
                    wire::encode_value(id)
                );
                (None, Record::Absent)
            }
        }
    }
}

/// What the shared de-dup bucket holds for a message id.
enum Record {
    Absent,
    /// A claim withdrawn (the message was not handed over): an empty value.
    Free {
        seq: u64,
    },
    /// It ran (its hooks settled it) with this digest: `<digest hex>`.
    Done(u64),
    /// A host took it and has not recorded it done: `q <host's instance id>` while no hook of
    /// it started there, `c <host's instance id>` once one may have (`started`).
    Claimed {
        host: String,
        seq: u64,
        started: bool,
    },
}

type PullConsumer = jetstream::consumer::Consumer<jetstream::consumer::pull::Config>;

/// A JetStream message handed over whose hooks have not all settled it.
struct Flight {
    msg: jetstream::Message,
    id: Option<(String, u64)>,
    /// The sequence of this host's claim on the id in the shared bucket (moved by its start
    /// record).
    claim: Option<Arc<AtomicU64>>,
    /// The partition it was pulled from.
    part: Option<u32>,
    /// Its size as received (subject, headers, body), toward the byte budget.
    bytes: usize,
    /// When it was handed over, or last said to be in progress.
    last: Instant,
}

impl Worker {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The fence of a message taken now from partition `k`: `None` without partitions; one
    /// that admits nothing when the partition is no longer held.
    fn fence_of(&self, k: u32) -> Option<crate::settle::Fence> {
        let t = self.lease_table.as_ref()?;
        let t = t.lock().unwrap_or_else(|e| e.into_inner());
        Some(t.fence(k).unwrap_or_else(crate::settle::Fence::closed))
    }

    fn run(mut self, rt: &tokio::runtime::Runtime, client: async_nats::Client) {
        match self.opts.durable.clone() {
            None => self.run_core(rt, client),
            Some(durable) => self.run_jetstream(rt, client, &durable),
        }
    }

    fn run_core(&mut self, rt: &tokio::runtime::Runtime, client: async_nats::Client) {
        let subject = self.opts.subject.clone();
        let sub = loop {
            let subscribed = match &self.opts.queue {
                Some(q) => rt.block_on(client.queue_subscribe(subject.clone(), q.clone())),
                None => rt.block_on(client.subscribe(subject.clone())),
            };
            match subscribed {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!("NATS consumer: subscribing to {}: {e}", self.opts.subject);
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return;
                    }
                }
            }
        };
        // The client's channel is drained at once into a buffer of our own, bounded in
        // messages and bytes, whose drops are counted here, each one (ARCHITECTURE.md § NATS
        // bridge, "Core intake").
        let intake = Arc::new(Intake {
            q: Mutex::new((VecDeque::new(), 0)),
            ready: tokio::sync::Notify::new(),
            max_messages: self.opts.buffer_messages,
            max_bytes: self.opts.buffer_bytes,
            counters: self.counters.clone(),
        });
        let drain = rt.spawn(intake.clone().fill(sub));
        let mut batch: Vec<async_nats::Message> = Vec::with_capacity(BATCH);
        let mut checked = 0;
        while !self.stopping() {
            let allowed = self.wait_for_room();
            if allowed == 0 || self.server_refused(&client, &mut checked) {
                break;
            }
            if !intake.take(&mut batch, allowed) {
                rt.block_on(async {
                    tokio::select! {
                        _ = intake.ready.notified() => {}
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                });
                continue;
            }
            let mut handed = Vec::new();
            for m in batch.drain(..) {
                let incoming = Incoming {
                    subject: m.subject.as_str(),
                    headers: m.headers.as_ref(),
                    payload: &m.payload,
                    delivery: None,
                    reclaimed: false,
                    fence: None,
                    start: None,
                };
                if let (Fate::Handed, Some(id)) = self.handle(&incoming, None) {
                    handed.push(id);
                }
            }
            self.window.persist(&handed);
        }
        // The task owns the subscription: aborted, it drops it (an unsubscribe).
        drain.abort();
        let _ = rt.block_on(drain);
    }

    /// At each new connection to a server beyond this machine: true (stop consuming, said
    /// once) if it does not require authentication and `--nats-insecure` was not given.
    fn server_refused(&self, client: &async_nats::Client, checked: &mut u64) -> bool {
        if !self.auth_check {
            return false;
        }
        let connects = self.state.connects.load(Ordering::Acquire);
        if connects == *checked || !self.state.is_connected() {
            return false;
        }
        *checked = connects;
        if client.server_info().auth_required {
            return false;
        }
        tracing::error!(
            "{}; not consuming",
            ConnectError::NoAuthRequired {
                server: self.server.clone()
            }
        );
        true
    }

    /// Sleeps `d` in small steps; true if stopping.
    fn pause_or_stop(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if self.stopping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stopping()
    }

    /// Back-pressure: waits until the pipeline can take events without a hook's queue
    /// overflowing (none while the rings are a quarter full, a bus subscriber half full, or a
    /// backend holds many jobs; no more than its tightest queue can take with what the rings
    /// hold on the way to it), and returns how many, at most [`CORE_BATCH`]; 0 if stopping.
    fn wait_for_room(&self) -> usize {
        let mut allowed = self.feed.allowance(CORE_BATCH);
        if allowed > 0 {
            return if self.stopping() { 0 } else { allowed };
        }
        self.counters.paused.fetch_add(1, Ordering::Relaxed);
        while allowed == 0 {
            if self.stopping() {
                return 0;
            }
            std::thread::sleep(Duration::from_micros(500));
            allowed = self.feed.allowance(CORE_BATCH);
        }
        if self.stopping() { 0 } else { allowed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_forgets_by_size_and_age_and_survives_a_reopen() {
        let dir = std::env::temp_dir().join(format!("prx-nats-window-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("seen");
        let mut w = Window::open(3, Duration::from_secs(60), Some(path.clone())).unwrap();
        for id in ["a", "b", "c", "d"] {
            assert!(!w.contains(id));
            w.insert(id, 7);
            w.persist(&[(id.to_string(), 7)]);
        }
        assert!(!w.contains("a"), "the oldest id leaves a full window");
        assert!(w.contains("b") && w.contains("d"));
        drop(w);
        // A torn line at the end (a crash mid-write) is skipped.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"12")
            .unwrap();
        let mut w = Window::open(3, Duration::from_secs(60), Some(path.clone())).unwrap();
        assert!(w.contains("b") && w.contains("c") && w.contains("d") && !w.contains("a"));
        assert_eq!(w.len(), 3);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Age: an id older than the window's age is gone on reopen.
        std::fs::write(&path, format!("1 old\n{} new\n", now_ms())).unwrap();
        let mut w = Window::open(10, Duration::from_secs(60), Some(path)).unwrap();
        assert!(!w.contains("old") && w.contains("new"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_same_id_with_another_digest_is_no_duplicate_and_old_lines_still_match() {
        let dir = std::env::temp_dir().join(format!("prx-nats-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("seen");
        let mut w = Window::open(10, Duration::from_secs(60), Some(path.clone())).unwrap();
        w.insert("x-1", 42);
        w.persist(&[("x-1".to_string(), 42)]);
        assert_eq!(w.seen("x-1", 42), Seen::Same);
        assert_eq!(w.seen("x-1", 43), Seen::Other);
        assert_eq!(w.seen("x-2", 42), Seen::No);
        drop(w);
        // Reopened: the digest came back from the file; an older line (no digest) matches any.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, "{} old id with spaces", now_ms()).unwrap();
        drop(f);
        let mut w = Window::open(10, Duration::from_secs(60), Some(path.clone())).unwrap();
        assert_eq!(w.seen("x-1", 43), Seen::Other);
        assert_eq!(w.seen("x-1", 42), Seen::Same);
        assert_eq!(w.seen("old id with spaces", 7), Seen::Same);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
