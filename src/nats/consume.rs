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
    /// claim before the hand-off and a done record after the hooks ran, before the ack (two
    /// JetStream publishes, acked); a message found claimed by another host and not done runs
    /// and is counted (`reclaimed`): every event run twice is among those.
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

    pub fn nats(&self) -> &NatsOptions {
        &self.nats
    }

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
            flying: HashMap::new(),
            next_key: 0,
            shared: None,
            shared_digest: None,
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
    /// Their ids.
    flying: HashMap<String, u64>,
    next_key: u64,
    /// The shared de-dup bucket ([`ConsumeOptions::shared_dedup`]), once opened.
    shared: Option<Shared>,
    /// What the bucket holds for the message in hand: the digest it ran with.
    shared_digest: Option<u64>,
}

/// The shared de-dup bucket: a stream `KV_<bucket>` of subjects `$KV.<bucket>.<key>`, one
/// message per key (the key-value layout), the value the digest the event ran with.
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
        match text.strip_prefix("c ") {
            Some(host) => Record::Claimed {
                host: host.to_string(),
                seq: m.sequence,
            },
            None => u64::from_str_radix(text, 16).map_or(Record::Absent, Record::Done),
        }
    }

    /// Claims `id` for this host before its hand-over: the claim's sequence (the done record
    /// replaces exactly it), and what the key held before.
    async fn claim(&self, id: &str) -> (Option<u64>, Record) {
        let mine = || format!("c {}", wire::instance_id());
        match self.write(id, mine(), 0).await {
            Ok(seq) => (Some(seq), Record::Absent),
            Err(true) => {
                let before = self.read(id).await;
                let seq = match &before {
                    // Taken over: the dead (or stalled) host's claim becomes ours.
                    Record::Claimed { seq, .. } => self.write(id, mine(), *seq).await.ok(),
                    _ => None,
                };
                (seq, before)
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
    /// It ran (its hooks settled it) with this digest: `<digest hex>`.
    Done(u64),
    /// A host took it and has not recorded it done: `c <host's instance id>`.
    Claimed {
        host: String,
        seq: u64,
    },
}

type PullConsumer = jetstream::consumer::Consumer<jetstream::consumer::pull::Config>;

/// A JetStream message handed over whose hooks have not all settled it.
struct Flight {
    msg: jetstream::Message,
    id: Option<(String, u64)>,
    /// The sequence of this host's claim on the id in the shared bucket.
    claim: Option<u64>,
    /// The partition it was pulled from.
    part: Option<u32>,
    /// When it was handed over, or last said to be in progress.
    last: Instant,
}

impl Worker {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
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
            if !self.wait_for_room() || self.server_refused(&client, &mut checked) {
                break;
            }
            if !intake.take(&mut batch, CORE_BATCH) {
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

    fn run_jetstream(
        &mut self,
        rt: &tokio::runtime::Runtime,
        client: async_nats::Client,
        durable: &str,
    ) {
        // The context spawns its acker task: inside the runtime.
        let js = {
            let _inside = rt.enter();
            jetstream::new(client.clone())
        };
        // Without partitions one durable consumer; with them, one per partition, made when
        // its lease is taken (`lease`).
        let (consumer, stream) = loop {
            let made = match self.opts.partitions {
                None => rt
                    .block_on(self.durable_consumer(&js, durable))
                    .map(|(c, s)| (Some(c), s)),
                Some(_) => rt.block_on(self.stream_name(&js)).map(|s| (None, s)),
            };
            match made {
                Ok(c) => break c,
                Err(e) => {
                    self.said.warn(format_args!(
                        "NATS consumer: durable {durable:?} on {}: {e}; retrying",
                        self.opts.subject
                    ));
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return;
                    }
                }
            }
        };
        let leases = match self.opts.partitions {
            None => None,
            Some(n) => loop {
                match rt.block_on(super::lease::Leases::open(&js, &stream, durable, n)) {
                    Ok(l) => {
                        let l = Arc::new(l);
                        rt.spawn(l.clone().keep());
                        break Some(l);
                    }
                    Err(e) => {
                        self.said.warn(format_args!("NATS consumer: {e}; retrying"));
                        if self.pause_or_stop(Duration::from_secs(1)) {
                            return;
                        }
                    }
                }
            },
        };
        let mut parts: HashMap<u32, PullConsumer> = HashMap::new();
        if let Some(bucket) = self.opts.shared_dedup.clone() {
            loop {
                match rt.block_on(Shared::open(&js, &bucket, self.opts.dedup_age)) {
                    Ok(s) => {
                        self.shared = Some(s);
                        break;
                    }
                    Err(e) => {
                        self.said.warn(format_args!("NATS consumer: {e}; retrying"));
                        if self.pause_or_stop(Duration::from_secs(1)) {
                            return;
                        }
                    }
                }
            }
        }
        // JetStream's MAX_DELIVERIES advisory: a message it stopped delivering (one this
        // client could never take, or one redelivered past the limit).
        let advisory = match self.opts.partitions {
            None => format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}"),
            Some(_) => format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"),
        };
        match rt.block_on(client.subscribe(advisory.clone())) {
            Ok(mut sub) => {
                let counters = self.counters.clone();
                let what = format!("NATS consumer ({}): durable {durable:?}", self.server);
                rt.spawn(async move {
                    use futures_util::StreamExt;
                    while let Some(m) = sub.next().await {
                        counters.given_up.fetch_add(1, Ordering::AcqRel);
                        let seq = serde_json::from_slice::<serde_json::Value>(&m.payload)
                            .ok()
                            .and_then(|v| v["stream_seq"].as_u64());
                        tracing::warn!(
                            "{what}: JetStream gave up on stream message {} after the maximum deliveries (--nats-max-deliver); it will not be consumed",
                            seq.map_or("?".to_string(), |s| s.to_string())
                        );
                    }
                });
            }
            Err(e) => tracing::warn!("NATS consumer: subscribing to {advisory}: {e}"),
        }
        let mut checked = 0;
        // After a connection was lost, pull one message at a time until one arrives: a
        // message async-nats cannot parse (it drops the connection) is then delivered alone,
        // and reaches JetStream's delivery limit alone.
        let mut careful = false;
        let mut pausing = false;
        let (notify, wake) = (self.notify.clone(), self.wake.clone());
        while !self.stopping() {
            if self.server_refused(&client, &mut checked) {
                break;
            }
            rt.block_on(self.settle());
            // Back-pressure: pull only what can be in flight, and only while the pipeline
            // has room (ARCHITECTURE.md § NATS bridge, "Acks after the hooks ran").
            let room = MAX_IN_FLIGHT.saturating_sub(self.flights.len());
            if room == 0 || self.feed.busy() {
                if !std::mem::replace(&mut pausing, true) {
                    self.counters.paused.fetch_add(1, Ordering::Relaxed);
                }
                rt.block_on(async {
                    tokio::select! {
                        _ = notify.notified() => {}
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                    }
                });
                continue;
            }
            pausing = false;
            // What to pull from: the one consumer, or the partitions held and not draining.
            let sources: Vec<(Option<u32>, PullConsumer)> = match (&leases, &consumer) {
                (None, Some(c)) => vec![(None, c.clone())],
                (Some(l), _) => {
                    let busy = self.flights.values().filter_map(|f| f.part).collect();
                    let active = {
                        let mut t = l.table.lock().unwrap_or_else(|e| e.into_inner());
                        t.drained(&busy);
                        t.active()
                    };
                    let mut v = Vec::with_capacity(active.len());
                    for k in active {
                        if let std::collections::hash_map::Entry::Vacant(slot) = parts.entry(k) {
                            match rt.block_on(self.partition_consumer(&js, &stream, durable, k)) {
                                Ok(c) => {
                                    slot.insert(c);
                                }
                                Err(e) => {
                                    self.said.warn(format_args!(
                                        "NATS consumer: durable {durable}-{k}: {e}; retrying"
                                    ));
                                    continue;
                                }
                            }
                        }
                        v.push((Some(k), parts[&k].clone()));
                    }
                    v
                }
                (None, None) => Vec::new(),
            };
            if sources.is_empty() {
                rt.block_on(async {
                    tokio::select! {
                        _ = notify.notified() => {}
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                });
                continue;
            }
            let connects = self.state.connects.load(Ordering::Acquire);
            let size = if careful {
                1
            } else {
                (room.min(BATCH) / sources.len()).max(1)
            };
            let got = rt.block_on(async {
                use futures_util::StreamExt;
                let mut got = false;
                let mut batches = Vec::with_capacity(sources.len());
                for (k, c) in &sources {
                    match c
                        .batch()
                        .max_messages(size)
                        .expires(PULL_EXPIRES)
                        .messages()
                        .await
                    {
                        Ok(b) => batches.push(b.map(move |m| (*k, m)).boxed()),
                        Err(e) => tracing::debug!("NATS consumer: pull: {e}"),
                    }
                }
                if batches.is_empty() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return got;
                }
                let mut batch = futures_util::stream::select_all(batches);
                // Each message is handled as it arrives (a quiet fleet's event does not
                // wait for the pull to expire); settled ones are acked meanwhile.
                loop {
                    tokio::select! {
                        m = batch.next() => match m {
                            Some((k, Ok(m))) => {
                                got = true;
                                self.take(m, k).await;
                            }
                            Some((_, Err(e))) => tracing::debug!("NATS consumer: pull: {e}"),
                            None => break,
                        },
                        _ = notify.notified() => self.settle().await,
                        _ = wake.notified() => break,
                    }
                }
                got
            });
            if self.state.connects.load(Ordering::Acquire) != connects || !self.state.is_connected()
            {
                careful = true;
            } else if got {
                careful = false;
            }
        }
        rt.block_on(self.finish(&js));
        if let Some(l) = leases {
            rt.block_on(l.quit());
        }
    }

    /// One pulled message: waits until its hooks' queues have room for it (and for what is
    /// already in flight), hands it over, and acks it at once if nothing is to run.
    async fn take(&mut self, m: jetstream::Message, part: Option<u32>) {
        let kind = wire::event_of_subject(m.subject.as_str());
        if let Some(kind) = kind {
            let mut paused = false;
            while !self.stopping() && !self.feed.room(kind, self.flights.len() + 1) {
                if !std::mem::replace(&mut paused, true) {
                    self.counters.paused.fetch_add(1, Ordering::Relaxed);
                }
                let notify = self.notify.clone();
                tokio::select! {
                    _ = notify.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
                self.settle().await;
            }
        }
        let key = self.next_key;
        self.next_key += 1;
        self.shared_digest = None;
        // The claim goes first: a host that dies after it leaves a record saying the message
        // may have run (ARCHITECTURE.md § NATS bridge, "Shared de-dup").
        let (mut claim, mut before) = (None, Record::Absent);
        if let Some(shared) = &self.shared
            && !self.stopping()
            && let Some(id) = m.headers.as_ref().and_then(|h| h.get(wire::MSG_ID))
        {
            (claim, before) = shared.claim(id.as_str()).await;
            if let Record::Done(d) = &before {
                self.shared_digest = Some(*d);
            }
        }
        let (fate, id) = if self.stopping() {
            (Fate::Later, None)
        } else {
            let incoming = Incoming {
                subject: m.subject.as_str(),
                headers: m.headers.as_ref(),
                payload: &m.payload,
            };
            self.handle(&incoming, Some(key))
        };
        let kind = match fate {
            Fate::Handed => {
                if let Some((id, _)) = &id {
                    self.flying.insert(id.clone(), key);
                    if let Record::Claimed { host, .. } = &before
                        && host != wire::instance_id()
                    {
                        self.counters.reclaimed.fetch_add(1, Ordering::AcqRel);
                        tracing::warn!(
                            "NATS consumer: {}: reclaimed from host {}, which claimed it and did not record it done: run here, it may have run there too",
                            wire::encode_value(id),
                            wire::encode_value(host)
                        );
                    }
                }
                self.flights.insert(
                    key,
                    Flight {
                        msg: m,
                        id,
                        claim: claim.take(),
                        part,
                        last: Instant::now(),
                    },
                );
                self.counters
                    .in_flight
                    .store(self.flights.len() as u64, Ordering::Relaxed);
                return;
            }
            // A redelivery of one whose hooks still run: its ack goes to this delivery.
            Fate::InFlight(k) => {
                if let Some(f) = self.flights.get_mut(&k) {
                    f.msg = m;
                }
                return;
            }
            Fate::Skip => jetstream::AckKind::Ack,
            Fate::Refused => jetstream::AckKind::Term,
            Fate::Later => jetstream::AckKind::Nak(None),
        };
        let is_ack = !matches!(kind, jetstream::AckKind::Nak(_));
        if tokio::time::timeout(ACKS_WAIT, m.ack_with(kind))
            .await
            .is_ok_and(|r| r.is_ok())
            && is_ack
        {
            self.counters.acked.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Takes what the hooks settled: the ids of what ran into the window (and its file,
    /// before the acks leave), acks for them, a nak with a delay for what a sink dropped;
    /// and an in-progress ack for what has been running a while.
    async fn settle(&mut self) {
        let settled = self.settled.take();
        let mut ran_ids = Vec::new();
        let mut done = Vec::new();
        let mut out = Vec::with_capacity(settled.len());
        for (key, ran) in settled {
            let Some(f) = self.flights.remove(&key) else {
                continue;
            };
            if let Some((id, d)) = &f.id {
                self.flying.remove(id);
                if ran {
                    self.window.insert(id, *d);
                    ran_ids.push((id.clone(), *d));
                    done.push((id.clone(), *d, f.claim.unwrap_or(0)));
                }
            }
            out.push((f.msg, ran));
        }
        let c = self.counters.clone();
        c.in_flight
            .store(self.flights.len() as u64, Ordering::Relaxed);
        if let Some(shared) = &self.shared
            && !done.is_empty()
        {
            // Done replaces this host's claim (or, without one, is written create-if-absent):
            // the first record of an id wins, a later write fails and changes nothing. Written
            // before the acks leave.
            let writes = async {
                let mut acks = Vec::with_capacity(done.len());
                for (id, d, claim) in &done {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert(
                        "Nats-Expected-Last-Subject-Sequence",
                        claim.to_string().as_str(),
                    );
                    if let Ok(ack) = shared
                        .js
                        .publish_with_headers(shared.subject(id), h, format!("{d:016x}").into())
                        .await
                    {
                        acks.push(ack);
                    }
                }
                for ack in acks {
                    let _ = std::future::IntoFuture::into_future(ack).await;
                }
            };
            let _ = tokio::time::timeout(ACKS_WAIT, writes).await;
        }
        if !out.is_empty() {
            self.window.persist(&ran_ids);
            c.window.store(self.window.len() as u64, Ordering::Relaxed);
            let acks = async {
                for (m, ran) in &out {
                    if *ran {
                        if m.ack().await.is_ok() {
                            c.acked.fetch_add(1, Ordering::AcqRel);
                        }
                    } else {
                        c.retried.fetch_add(1, Ordering::AcqRel);
                        let _ = m.ack_with(jetstream::AckKind::Nak(Some(RETRY_DELAY))).await;
                    }
                }
            };
            // With the server gone the client holds the acks until it reconnects; what is
            // not acked is delivered again (and recognized by its id).
            let _ = tokio::time::timeout(ACKS_WAIT, acks).await;
        }
        let now = Instant::now();
        let progress = async {
            for f in self.flights.values_mut() {
                if now.duration_since(f.last) >= PROGRESS_EVERY {
                    f.last = now;
                    let _ = f.msg.ack_with(jetstream::AckKind::Progress).await;
                }
            }
        };
        let _ = tokio::time::timeout(ACKS_WAIT, progress).await;
    }

    /// Stopping: waits (until the deadline `stop` was given) for what is in flight to
    /// settle, acks it, naks the rest (delivered again at once), flushes.
    async fn finish(&mut self, js: &jetstream::Context) {
        let until = *self.drain_until.lock().unwrap_or_else(|e| e.into_inner());
        let until = until.unwrap_or_else(Instant::now);
        while !self.flights.is_empty() && Instant::now() < until {
            let notify = self.notify.clone();
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            self.settle().await;
        }
        let left: Vec<Flight> = self.flights.drain().map(|(_, f)| f).collect();
        self.flying.clear();
        self.counters.in_flight.store(0, Ordering::Relaxed);
        let naks = async {
            for f in &left {
                let _ = f.msg.ack_with(jetstream::AckKind::Nak(None)).await;
            }
            let _ = js.client().flush().await;
        };
        let _ = tokio::time::timeout(ACKS_WAIT, naks).await;
    }

    /// The stream the durable consumer reads: given, or the one holding the subject.
    async fn stream_name(&self, js: &jetstream::Context) -> Result<String, String> {
        match &self.opts.stream {
            Some(name) => Ok(name.clone()),
            None => js
                .stream_by_subject(self.opts.subject.clone())
                .await
                .map_err(|e| {
                    format!(
                        "no stream holds the subject ({e}); give --from-nats-stream or create one"
                    )
                }),
        }
    }

    async fn durable_consumer(
        &self,
        js: &jetstream::Context,
        durable: &str,
    ) -> Result<(PullConsumer, String), String> {
        let name = self.stream_name(js).await?;
        self.pull_consumer(js, &name, durable, self.opts.subject.clone())
            .await
            .map(|c| (c, name))
    }

    /// Partition `k`'s durable consumer, `<durable>-<k>`, on its partition's subjects.
    async fn partition_consumer(
        &self,
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        k: u32,
    ) -> Result<PullConsumer, String> {
        let filter = wire::partition_filter(&self.opts.subject, k);
        self.pull_consumer(js, stream, &format!("{durable}-{k}"), filter)
            .await
    }

    async fn pull_consumer(
        &self,
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        filter: String,
    ) -> Result<PullConsumer, String> {
        let stream = js
            .get_stream(stream)
            .await
            .map_err(|e| format!("stream {stream:?}: {e}"))?;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.to_string()),
            filter_subject: filter,
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(10),
            max_ack_pending: (4 * BATCH) as i64,
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            max_deliver: self.opts.max_deliver as i64,
            ..Default::default()
        };
        stream
            .get_or_create_consumer(durable, config)
            .await
            .map_err(|e| e.to_string())
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

    /// Back-pressure: waits while the pipeline is busy (the rings a quarter full, a bus
    /// subscriber half full, a backend holding many jobs). False if stopping.
    fn wait_for_room(&self) -> bool {
        if !self.feed.busy() {
            return !self.stopping();
        }
        self.counters.paused.fetch_add(1, Ordering::Relaxed);
        while self.feed.busy() {
            if self.stopping() {
                return false;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        !self.stopping()
    }

    /// Everything that happens to one message; the id it was handed over under.
    ///
    /// `ticket`: JetStream's key for this message; its hooks report under it when they have
    /// settled it, and its id enters the window only then (`settle`). Without one (core NATS)
    /// the id enters the window at hand-off.
    fn handle(&mut self, m: &Incoming<'_>, ticket: Option<u64>) -> (Fate, Option<(String, u64)>) {
        let c = self.counters.clone();
        c.received.fetch_add(1, Ordering::AcqRel);
        let refuse = |this: &mut Self, counter: &AtomicU64, why: std::fmt::Arguments<'_>| {
            counter.fetch_add(1, Ordering::AcqRel);
            this.said.warn(why);
            (Fate::Refused, None)
        };
        let Some(kind) = wire::event_of_subject(m.subject) else {
            return refuse(
                self,
                &c.refused_subject,
                format_args!(
                    "NATS consumer: {}: refused: the subject does not end in prx.lifecycle.<event>",
                    m.subject
                ),
            );
        };
        if m.header(wire::ORIGIN) == Some(wire::instance_id()) {
            c.own.fetch_add(1, Ordering::AcqRel);
            return (Fate::Skip, None);
        }
        let id = m.header(wire::MSG_ID).map(str::to_string);
        let shown = id.as_deref().unwrap_or("no Nats-Msg-Id").to_string();
        // Relayed from bridge to bridge too often: a loop between relays (or a forgery).
        let hops = match m.header(wire::HOPS).map(|h| h.trim().parse::<u32>()) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                return refuse(
                    self,
                    &c.refused_headers,
                    format_args!(
                        "NATS consumer: {} ({}): refused: Prx-Hops {:?} is not a number",
                        m.subject,
                        wire::encode_value(&shown),
                        wire::encode_value(m.header(wire::HOPS).unwrap_or(""))
                    ),
                );
            }
        };
        if hops >= wire::MAX_HOPS {
            return refuse(
                self,
                &c.loops,
                format_args!(
                    "NATS consumer: {} ({}): refused: relayed {hops} times (the limit is {}): relays publish to each other's subjects in a loop",
                    m.subject,
                    wire::encode_value(&shown),
                    wire::MAX_HOPS
                ),
            );
        }
        if let Some(e) = m.header(wire::EVENT)
            && e != kind.name()
        {
            return refuse(
                self,
                &c.refused_headers,
                format_args!(
                    "NATS consumer: {} ({}): refused: Prx-Event {:?} disagrees with the subject",
                    m.subject,
                    wire::encode_value(&shown),
                    wire::encode_value(e)
                ),
            );
        }
        if let Some(id) = &id
            && let Err(why) = wire::check_identity("Nats-Msg-Id", id)
        {
            return refuse(
                self,
                &c.refused_headers,
                format_args!("NATS consumer: {}: refused: {why}", m.subject),
            );
        }
        // Decoded and checked: the agent and session become hook variables, the origin is
        // relayed.
        let ident = |header: &str| -> Result<Option<String>, String> {
            match m.header(header) {
                None => Ok(None),
                Some(v) => {
                    let v = wire::decode_value(v);
                    wire::check_identity(header, &v)?;
                    Ok(Some(v.into_owned()))
                }
            }
        };
        let identity = ident(wire::AGENT).and_then(|a| {
            let s = ident(wire::SESSION)?;
            Ok((
                a.unwrap_or_else(|| wire::DEFAULT_AGENT.into()),
                s.unwrap_or_else(|| wire::DEFAULT_SESSION.into()),
                ident(wire::ORIGIN)?,
            ))
        });
        // The agent's own time and numbering, for the hooks beside this host's.
        let origin_time = m
            .header(wire::TIMESTAMP)
            .map(wire::check_timestamp)
            .transpose()
            .and_then(|t| {
                let n = m.header(wire::SEQ).map(wire::parse_seq).transpose()?;
                Ok((t.map(str::to_string), n))
            });
        let identity = identity.and_then(|(a, s, o)| Ok((a, s, o, origin_time?)));
        let (agent, session, origin, origin_time) = match identity {
            Ok(pair) => pair,
            Err(why) => {
                return refuse(
                    self,
                    &c.refused_headers,
                    format_args!(
                        "NATS consumer: {} ({}): refused: {why}",
                        m.subject,
                        wire::encode_value(&shown)
                    ),
                );
            }
        };
        let record = std::str::from_utf8(m.payload)
            .map_err(|e| format!("the body is not UTF-8 (byte {})", e.valid_up_to()))
            .and_then(|text| {
                ndjson::parse_payload_with(kind, text.trim(), &agent, &session, self.opts.parse)
                    .map_err(|e| format!("body:{e}"))
            });
        let record = match record {
            Ok(r) => r,
            Err(why) => {
                return refuse(
                    self,
                    &c.refused_body,
                    format_args!(
                        "NATS consumer: {} ({}): refused: not a valid {kind} payload: {why}",
                        m.subject,
                        wire::encode_value(&shown)
                    ),
                );
            }
        };
        // De-dup on what the event is (its event, agent, session and payload as the bus will
        // carry it), so that a relayed copy, re-serialized, is still recognized.
        let digest = digest(kind, &agent, &session, &record.payload_json());
        // A redelivery of a message whose hooks still run (JetStream's ack wait passed, or
        // an in-progress ack was lost): it is acked with the first when they settle.
        if ticket.is_some()
            && let Some(id) = &id
            && let Some(&k) = self.flying.get(id)
            && self
                .flights
                .get(&k)
                .is_some_and(|f| f.id.as_ref().is_some_and(|(_, d)| *d == digest))
        {
            c.duplicates.fetch_add(1, Ordering::AcqRel);
            return (Fate::InFlight(k), None);
        }
        let shared_ran = self.shared_digest.take() == Some(digest);
        match &id {
            // Ran on a host sharing the bucket (this one included).
            Some(_) if shared_ran => {
                c.duplicates.fetch_add(1, Ordering::AcqRel);
                c.shared_duplicates.fetch_add(1, Ordering::AcqRel);
                return (Fate::Skip, None);
            }
            Some(id) => match self.window.seen(id, digest) {
                Seen::Same => {
                    c.duplicates.fetch_add(1, Ordering::AcqRel);
                    return (Fate::Skip, None);
                }
                // The id of an event handed over, with another body, agent or session: not
                // a retry. Processed (a forger pre-sending ids must not suppress real
                // events), counted, said.
                Seen::Other => {
                    c.id_conflicts.fetch_add(1, Ordering::AcqRel);
                    self.said.warn(format_args!(
                        "NATS consumer: {} ({}): the id of an event handed over before, with another body: handled as a new event",
                        m.subject,
                        wire::encode_value(&shown)
                    ));
                }
                Seen::No => {}
            },
            None => {
                c.without_id.fetch_add(1, Ordering::AcqRel);
            }
        }
        let max = self.feed.max_event_bytes;
        if record.byte_len() > max {
            return refuse(
                self,
                &c.refused_oversize,
                format_args!(
                    "NATS consumer: {} ({}): refused: event of {} bytes exceeds max_event_bytes ({})",
                    m.subject,
                    wire::encode_value(&shown),
                    record.byte_len(),
                    max
                ),
            );
        }
        // Relaying: the id the publisher will send (one of ours when the message had none,
        // remembered in the window so that it is recognized if it comes back).
        let relay_id = match (&id, self.feed.relays.is_some()) {
            (Some(id), _) => Some(id.clone()),
            (None, true) => {
                self.made_ids += 1;
                Some(format!("{}-r{}", wire::instance_id(), self.made_ids))
            }
            (None, false) => None,
        };
        let relays = self.feed.relays.clone();
        let (emitter, next_seq) = self.emitter(&agent, &session);
        if let (Some(relays), Some(rid)) = (&relays, &relay_id)
            && relays.wants(kind)
        {
            relays.insert(
                emitter.relay_id(),
                next_seq,
                super::relay::Relayed {
                    origin: origin
                        .clone()
                        .unwrap_or_else(|| wire::instance_id().to_string()),
                    id: rid.clone(),
                    hops,
                },
            );
        }
        // What the message of this event carries to the hooks: the agent's time and
        // numbering, and the ticket its hooks report through (`crate::settle`).
        let attached = ticket.is_some() || origin_time.0.is_some() || origin_time.1.is_some();
        if attached {
            self.feed.attachments().insert(
                emitter.relay_id(),
                next_seq,
                crate::settle::Attached::new(
                    origin_time.0,
                    origin_time.1,
                    ticket.map(|k| crate::settle::Ticket::new(k, self.settled.clone())),
                ),
            );
        }
        // Not emitted after all: the attachment is taken back (a ticket then reports `ran`
        // for a skipped event, `dropped` for one not handed over — ignored, it is nak'ed).
        let take_back = |this: &Self, dropped: bool| {
            if let Some(a) = this.feed.attachments().take(emitter.relay_id(), next_seq) {
                if dropped {
                    a.mark_dropped();
                }
                drop(a);
            }
        };
        loop {
            let emitted = if record.has_extras() {
                match emitter.emit_with_extras(record.event(), &record.extras()) {
                    Ok(e) => e,
                    Err(e) => {
                        take_back(self, true);
                        return refuse(
                            self,
                            &c.refused_body,
                            format_args!("NATS consumer: {}: refused: {e}", m.subject),
                        );
                    }
                }
            } else {
                emitter.emit(record.event())
            };
            match emitted {
                Emit::Queued | Emit::Skipped if !self.feed.closed() => {
                    if emitted == Emit::Skipped {
                        c.skipped.fetch_add(1, Ordering::AcqRel);
                        take_back(self, false);
                    } else if let Some(e) = self.emitters.get_mut(&(agent.clone(), session.clone()))
                    {
                        // The worker numbers this emitter's queued events 0, 1, 2…
                        e.1 += 1;
                    }
                    break;
                }
                // The ring was full after all (another producer): wait, never drop.
                _ if self.stopping() || self.feed.closed() => {
                    take_back(self, true);
                    return (Fate::Later, None);
                }
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        c.consumed.fetch_add(1, Ordering::AcqRel);
        let id = relay_id.or(id);
        if let Some(id) = &id
            && ticket.is_none()
        {
            self.window.insert(id, digest);
            c.window.store(self.window.len() as u64, Ordering::Relaxed);
        }
        (Fate::Handed, id.map(|id| (id, digest)))
    }

    /// The emitter for (agent, session), and the `seq` its next queued event gets.
    fn emitter(&mut self, agent: &str, session: &str) -> (crate::Emitter, u64) {
        let key = (agent.to_string(), session.to_string());
        if let Some((e, next)) = self.emitters.get(&key) {
            return (e.clone(), *next);
        }
        if self.emitters.len() >= MAX_EMITTERS
            && let Some(old) = self.emitter_order.pop_front()
        {
            self.emitters.remove(&old);
        }
        let e = self.feed.emitter(agent, session);
        self.emitters.insert(key.clone(), (e.clone(), 0));
        self.emitter_order.push_back(key);
        (e, 0)
    }
}

/// Core NATS: the consumer's own buffer between the client's subscription channel and the
/// worker, bounded in messages and bytes; what does not fit is dropped and counted
/// (`dropped_full`).
struct Intake {
    /// The messages and their bytes (subject, headers and body as the client read them).
    q: Mutex<(VecDeque<async_nats::Message>, usize)>,
    ready: tokio::sync::Notify,
    max_messages: usize,
    max_bytes: usize,
    /// `dropped_full`, and the `buffered` gauges (left as they are when the consumer stops:
    /// what was still buffered then).
    counters: Arc<Counters>,
}

impl Intake {
    /// The task: moves every message the subscription yields into the buffer at once, so the
    /// client's own channel stays near empty.
    async fn fill(self: Arc<Self>, mut sub: async_nats::Subscriber) {
        use futures_util::StreamExt;
        let counters = &self.counters;
        while let Some(m) = sub.next().await {
            let size = m.length.max(m.payload.len());
            let kept = {
                let mut g = self.q.lock().unwrap_or_else(|e| e.into_inner());
                let (q, bytes) = &mut *g;
                let fits = q.len() < self.max_messages && *bytes + size <= self.max_bytes;
                if fits {
                    q.push_back(m);
                    *bytes += size;
                    self.gauges(q.len(), *bytes);
                }
                fits
            };
            if kept {
                self.ready.notify_one();
            } else {
                counters.dropped_full.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Up to `n` messages into `out`; false if there were none.
    fn take(&self, out: &mut Vec<async_nats::Message>, n: usize) -> bool {
        let mut g = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let (q, bytes) = &mut *g;
        while out.len() < n {
            let Some(m) = q.pop_front() else { break };
            *bytes -= m.length.max(m.payload.len());
            out.push(m);
        }
        self.gauges(q.len(), *bytes);
        !out.is_empty()
    }

    fn gauges(&self, messages: usize, bytes: usize) {
        let c = &self.counters;
        c.buffered.store(messages as u64, Ordering::Relaxed);
        c.buffered_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

/// Refusals are said at most once a second, with a count of those not said.
#[derive(Default)]
struct Said {
    last: Option<Instant>,
    quiet: u64,
}

impl Said {
    fn warn(&mut self, what: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.quiet += 1;
            return;
        }
        self.last = Some(now);
        match std::mem::take(&mut self.quiet) {
            0 => tracing::warn!("{what}"),
            n => tracing::warn!("{what} ({n} more refusal(s) not shown; see the stats)"),
        }
    }
}

/// Whether an id was handed over before, and with what.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    No,
    /// With the same digest (or one from a file of the older format, without digests).
    Same,
    /// With another body, agent or session.
    Other,
}

/// FNV-1a, 64 bits, of the event, agent, session and payload JSON: what makes a same-id
/// message a retry rather than another event. Stable across builds (it is persisted); not a
/// MAC — it keeps a forged id from suppressing an event the forger has not seen.
fn digest(kind: crate::EventKind, agent: &str, session: &str, payload: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [kind.name(), agent, session, payload] {
        for &b in part.as_bytes().iter().chain(&[0xff]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The de-dup window: the ids handed over with their digests, newest last, at most `cap` of
/// them and none older than `age`; optionally mirrored to a file of `<unix ms>\t<digest
/// hex>\t<id>` lines (ids cannot hold a tab; the older `<unix ms> <id>` lines are read too).
struct Window {
    set: HashMap<String, Option<u64>>,
    order: VecDeque<(String, u64)>,
    cap: usize,
    age: Duration,
    file: Option<(PathBuf, std::fs::File, usize)>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Window {
    fn open(cap: usize, age: Duration, path: Option<PathBuf>) -> Result<Window, ConnectError> {
        let mut w = Window {
            set: HashMap::new(),
            order: VecDeque::new(),
            cap,
            age,
            file: None,
        };
        let Some(path) = path else {
            return Ok(w);
        };
        let err = |e: std::io::Error| ConnectError::File {
            path: path.clone(),
            reason: e.to_string(),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for line in text.lines() {
                    // A torn last line (a crash mid-write) is skipped.
                    let parsed = match line.split('\t').collect::<Vec<_>>()[..] {
                        [ms, d, id] => u64::from_str_radix(d, 16).ok().map(|d| (ms, Some(d), id)),
                        [_] => line.split_once(' ').map(|(ms, id)| (ms, None, id)),
                        _ => None,
                    };
                    if let Some((ms, d, id)) = parsed
                        && let Ok(ms) = ms.parse::<u64>()
                        && !id.is_empty()
                    {
                        w.push(id.to_string(), d, ms);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        w.expire();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Private, as the token's directory is: the ids say what this host ran.
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err)?;
        }
        w.rewrite(&path).map_err(err)?;
        Ok(w)
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn push(&mut self, id: String, digest: Option<u64>, ms: u64) {
        if self.set.insert(id.clone(), digest).is_none() {
            self.order.push_back((id, ms));
        }
        while self.order.len() > self.cap {
            if let Some((old, _)) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn expire(&mut self) {
        let oldest = now_ms().saturating_sub(self.age.as_millis() as u64);
        while self.order.front().is_some_and(|(_, ms)| *ms < oldest) {
            if let Some((old, _)) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    fn seen(&mut self, id: &str, digest: u64) -> Seen {
        self.expire();
        match self.set.get(id) {
            None => Seen::No,
            Some(None) => Seen::Same,
            Some(Some(d)) if *d == digest => Seen::Same,
            Some(Some(_)) => Seen::Other,
        }
    }

    #[cfg(test)]
    fn contains(&mut self, id: &str) -> bool {
        self.seen(id, 0) != Seen::No
    }

    /// Remembers `id` as handed over with `digest` (replacing what an id conflict had).
    fn insert(&mut self, id: &str, digest: u64) {
        self.push(id.to_string(), Some(digest), now_ms());
    }

    fn line(ms: u64, id: &str, digest: Option<u64>) -> String {
        match digest {
            Some(d) => format!("{ms}\t{d:016x}\t{id}\n"),
            None => format!("{ms} {id}\n"),
        }
    }

    /// Appends the ids just handed over; rewrites the file once it holds twice the window.
    fn persist(&mut self, ids: &[(String, u64)]) {
        if ids.is_empty() {
            return;
        }
        let Some((path, file, lines)) = &mut self.file else {
            return;
        };
        let ms = now_ms();
        let mut text = String::with_capacity(ids.len() * 48);
        for (id, d) in ids {
            text.push_str(&Window::line(ms, id, Some(*d)));
        }
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(
                "NATS consumer: writing the de-dup window to {}: {e}",
                path.display()
            );
        }
        *lines += ids.len();
        if *lines > 2 * self.cap.max(1024) {
            let path = path.clone();
            if let Err(e) = self.rewrite(&path) {
                tracing::warn!(
                    "NATS consumer: compacting the de-dup window {}: {e}",
                    path.display()
                );
            }
        }
    }

    /// Writes the window whole under a temporary name of its own (`<file>.<pid>.tmp`: the
    /// file's whole name, so two windows never share one; created afresh, O_EXCL and
    /// O_NOFOLLOW, so a planted file or symlink is never written through), renames it into
    /// place (0600), and appends to it from then on (O_NOFOLLOW).
    fn rewrite(&mut self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(name);
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)
        };
        let mut f = match create() {
            // Left by a process of the same pid that crashed (or planted): removed (a
            // symlink itself, never its target), then created afresh.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp)?;
                create()?
            }
            r => r?,
        };
        let mut text = String::new();
        for (id, ms) in &self.order {
            text.push_str(&Window::line(*ms, id, self.set.get(id).copied().flatten()));
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)?;
        self.file = Some((path.to_path_buf(), f, self.order.len()));
        Ok(())
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
