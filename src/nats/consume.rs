//! The consumer: NATS messages → the local pipeline (ARCHITECTURE.md § NATS bridge).
//!
//! ```text
//! NATS ─► core subscription            (no flow control: while intake pauses the client's
//!      │                                buffer fills, then it drops — `slow_consumer`)
//!      └► JetStream durable pull consumer (pulls only while the pipeline has room)
//!            └─► per message: subject → event · Prx-Origin our own? skip · headers checked ·
//!                Nats-Msg-Id seen? skip · body parsed (ndjson payload parser) ·
//!                wait while the pipeline is busy · emit (retried until queued) ·
//!                id into the window (and its file) · then ack
//! ```
//!
//! Delivery is at-least-once: an ack lost on the way, or a process stopped between hand-off
//! and ack, makes JetStream deliver the message again, and the de-dup window (bounded in
//! size and age, persisted when given a file) is what recognizes it. A refused message is
//! terminated (JetStream never redelivers it); one taken but not handed over when the
//! consumer stops is nak'ed, so the next consumer gets it at once.

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
/// Default of [`ConsumeOptions::max_deliver`].
pub const DEFAULT_MAX_DELIVER: u32 = 5;
/// Messages pulled at once.
const BATCH: usize = 256;
/// Emitters kept (one per agent and session seen; the oldest goes first).
const MAX_EMITTERS: usize = 4096;

/// Where [`Consumer`] reads from, and how it de-duplicates.
#[derive(Clone, Debug)]
pub struct ConsumeOptions {
    nats: NatsOptions,
    subject: String,
    durable: Option<String>,
    stream: Option<String>,
    dedup_ids: usize,
    dedup_age: Duration,
    dedup_file: Option<PathBuf>,
    parse: ParseOptions,
    max_deliver: u32,
}

impl ConsumeOptions {
    /// Core NATS, subject `prx.lifecycle.>`, no persisted window.
    pub fn new(nats: NatsOptions) -> ConsumeOptions {
        ConsumeOptions {
            nats,
            subject: wire::LIFECYCLE_SUBJECTS.into(),
            durable: None,
            stream: None,
            dedup_ids: DEFAULT_DEDUP_IDS,
            dedup_age: DEFAULT_DEDUP_AGE,
            dedup_file: None,
            parse: ParseOptions::default(),
            max_deliver: DEFAULT_MAX_DELIVER,
        }
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
    wake: Arc<tokio::sync::Notify>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Consumer {
    pub(crate) fn start(feed: Feed, opts: ConsumeOptions) -> Result<Consumer, ConnectError> {
        opts.check()?;
        let server = opts.nats.redacted();
        let state = ConnState::new(format!("NATS consumer ({server})"));
        let (connect, addrs) = opts.nats.connect_options(state.clone(), "consume", true)?;
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
        let worker = Worker {
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
            reconnects: self.state.reconnects(),
            ..ConsumeStats::default()
        };
        s.received = get(&c.received);
        s
    }

    /// Stops taking messages and waits for the thread (it finishes the message in hand, acks
    /// what it handed over, naks the rest). Idempotent.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop();
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
        let mut sub = loop {
            match rt.block_on(client.subscribe(self.opts.subject.clone())) {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!("NATS consumer: subscribing to {}: {e}", self.opts.subject);
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return;
                    }
                }
            }
        };
        let mut batch: Vec<async_nats::Message> = Vec::with_capacity(BATCH);
        let mut checked = 0;
        while !self.stopping() {
            if !self.wait_for_room() || self.server_refused(&client, &mut checked) {
                break;
            }
            rt.block_on(async {
                use futures_util::FutureExt;
                use futures_util::StreamExt;
                let first = tokio::select! {
                    m = tokio::time::timeout(Duration::from_secs(1), sub.next()) => m,
                    _ = self.wake.notified() => return,
                };
                if let Ok(Some(m)) = first {
                    batch.push(m);
                    while batch.len() < BATCH {
                        match sub.next().now_or_never() {
                            Some(Some(m)) => batch.push(m),
                            _ => break,
                        }
                    }
                }
            });
            let mut handed = Vec::new();
            for m in batch.drain(..) {
                let incoming = Incoming {
                    subject: m.subject.as_str(),
                    headers: m.headers.as_ref(),
                    payload: &m.payload,
                };
                if let (Fate::Handed, Some(id)) = self.handle(&incoming) {
                    handed.push(id);
                }
            }
            self.window.persist(&handed);
        }
        let _ = rt.block_on(sub.unsubscribe());
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
        let (consumer, stream) = loop {
            match rt.block_on(self.durable_consumer(&js, durable)) {
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
        // JetStream's MAX_DELIVERIES advisory: a message it stopped delivering (one this
        // client could never take, or one redelivered past the limit).
        let advisory = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}");
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
        while !self.stopping() {
            if !self.wait_for_room() || self.server_refused(&client, &mut checked) {
                break;
            }
            let connects = self.state.connects.load(Ordering::Acquire);
            let size = if careful { 1 } else { BATCH };
            let msgs: Vec<jetstream::Message> = rt.block_on(async {
                use futures_util::StreamExt;
                let pull = async {
                    let batch = consumer
                        .batch()
                        .max_messages(size)
                        .expires(Duration::from_secs(1))
                        .messages()
                        .await?;
                    Ok::<_, jetstream::consumer::pull::BatchError>(
                        batch
                            .filter_map(|m| async { m.ok() })
                            .collect::<Vec<_>>()
                            .await,
                    )
                };
                let pulled = tokio::select! {
                    r = pull => r,
                    _ = self.wake.notified() => Ok(Vec::new()),
                };
                match pulled {
                    Ok(msgs) => msgs,
                    Err(e) => {
                        tracing::debug!("NATS consumer: pull: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Vec::new()
                    }
                }
            });
            if self.state.connects.load(Ordering::Acquire) != connects || !self.state.is_connected()
            {
                careful = true;
            } else if !msgs.is_empty() {
                careful = false;
            }
            let mut fates = Vec::with_capacity(msgs.len());
            let mut handed = Vec::new();
            for m in &msgs {
                let incoming = Incoming {
                    subject: m.subject.as_str(),
                    headers: m.headers.as_ref(),
                    payload: &m.payload,
                };
                let (fate, id) = if self.stopping() {
                    (Fate::Later, None)
                } else {
                    self.handle(&incoming)
                };
                if let (Fate::Handed, Some(id)) = (&fate, id) {
                    handed.push(id);
                }
                fates.push(fate);
            }
            // The ids are on disk before the acks leave: a restart between the two finds them.
            self.window.persist(&handed);
            // At most `ACKS_WAIT`: with the server gone the client neither sends nor answers
            // the flush until it reconnects, and shutdown must not wait for that; what is not
            // acked is delivered again (and recognized by its id).
            let mut acked = 0u64;
            rt.block_on(async {
                let acks = async {
                    for (m, fate) in msgs.iter().zip(&fates) {
                        let kind = match fate {
                            Fate::Handed | Fate::Skip => jetstream::AckKind::Ack,
                            Fate::Refused => jetstream::AckKind::Term,
                            Fate::Later => jetstream::AckKind::Nak(None),
                        };
                        let is_ack = !matches!(fate, Fate::Later);
                        if m.ack_with(kind).await.is_ok() && is_ack {
                            acked += 1;
                        }
                    }
                    // The acks are written before the next pull (or the exit) goes out.
                    let _ = js.client().flush().await;
                };
                let _ = tokio::time::timeout(ACKS_WAIT, acks).await;
            });
            self.counters.acked.fetch_add(acked, Ordering::AcqRel);
        }
    }

    async fn durable_consumer(
        &self,
        js: &jetstream::Context,
        durable: &str,
    ) -> Result<
        (
            jetstream::consumer::Consumer<jetstream::consumer::pull::Config>,
            String,
        ),
        String,
    > {
        let stream = match &self.opts.stream {
            Some(name) => name.clone(),
            None => js
                .stream_by_subject(self.opts.subject.clone())
                .await
                .map_err(|e| {
                    format!(
                        "no stream holds the subject ({e}); give --from-nats-stream or create one"
                    )
                })?,
        };
        let name = stream;
        let stream = js
            .get_stream(&name)
            .await
            .map_err(|e| format!("stream {name:?}: {e}"))?;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.to_string()),
            filter_subject: self.opts.subject.clone(),
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
            .map(|c| (c, name))
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
    fn handle(&mut self, m: &Incoming<'_>) -> (Fate, Option<(String, u64)>) {
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
        let (agent, session, origin) = match identity {
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
        match &id {
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
        loop {
            let emitted = if record.has_extras() {
                match emitter.emit_with_extras(record.event(), &record.extras()) {
                    Ok(e) => e,
                    Err(e) => {
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
                    } else if let Some(e) = self.emitters.get_mut(&(agent.clone(), session.clone()))
                    {
                        // The worker numbers this emitter's queued events 0, 1, 2…
                        e.1 += 1;
                    }
                    break;
                }
                // The ring was full after all (another producer): wait, never drop.
                _ if self.stopping() || self.feed.closed() => return (Fate::Later, None),
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        c.consumed.fetch_add(1, Ordering::AcqRel);
        let id = relay_id.or(id);
        if let Some(id) = &id {
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
