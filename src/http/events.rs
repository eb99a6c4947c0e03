//! `GET /api/events`: the live stream as Server-Sent Events (ARCHITECTURE.md § The live
//! stream; the wire contract is docs/http.md § The live stream).
//!
//! ```text
//! bus ──(one subscription, pattern *)──┐
//! run feed (ShellSink::subscribe_runs)─┼─► hub thread "prx-http-events": numbers each item,
//! plugin counters, diffed each second ─┘     renders its SSE frame once, keeps it in the
//!                                            backlog, try_sends it to every client that wants it
//!                                                 │ (one bounded queue per client; full → counted,
//!                                                 ▼  announced with a `dropped` event)
//!                                  response body of each client (polled by hyper) ─► socket
//! ```
//!
//! **Why one hub and not one bus subscription per client.** An SSE `id:` must be a position
//! in *one* order, so that `Last-Event-ID: X` means "everything after X". Each bus
//! subscription gets its messages in its own interleaving (two workers, or a plugin's
//! `events.publish` on its executor thread, interleave differently in every queue), so no id
//! taken from one queue could mean a position in another's. The hub is the one ordinary bus
//! subscriber (bounded, drops counted on it like any), and the sequencer; each client has its
//! own bounded queue behind it, so a slow client loses only its own messages and never slows
//! the hub, the bus or a worker (`try_send` everywhere).
//!
//! **Costs nothing while nobody watches.** The hub subscribes (and so makes the pipeline
//! serialize every event) only while a client is connected and for `linger` after the last
//! one leaves (so a client reconnecting finds its events in the backlog); then it
//! unsubscribes, forgets the backlog, and its thread ends. A resume across such a pause is
//! told as a gap.
//!
//! **Shutdown.** [`EventHub::close`] (called by `Server::shutdown` before it stops the
//! connections, and when the bus closes at `Hooks::shutdown`) ends every client's body after
//! what its queue holds, the notice of what it lost and a `shutdown` event (kept beside the
//! queue, which may be full), so hyper's graceful shutdown finishes once the clients have read
//! instead of waiting for a response that never ends; later requests get 503.

mod body;
mod query;
mod record;

pub(crate) use query::stream;
use query::{LastId, Start};
use record::{PluginCounter, record};

pub(crate) use body::EventBody;

use super::ApiState;
use super::conns::ConnCounters;
use super::error::ApiError;
use crate::Hooks;
use crate::bus::{Message, Pattern, Subscription};
use crate::event::EventKind;
use crate::shell::{Outcome, RunSubscription};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Default of [`EventStreamOptions::queue`].
pub const DEFAULT_STREAM_QUEUE: usize = 4096;
/// Default of [`EventStreamOptions::queue_bytes`].
pub const DEFAULT_STREAM_QUEUE_BYTES: usize = 8 << 20;
/// Default of [`EventStreamOptions::backlog`].
pub const DEFAULT_BACKLOG: usize = 4096;
/// Default of [`EventStreamOptions::backlog_bytes`].
pub const DEFAULT_BACKLOG_BYTES: usize = 8 << 20;
/// Default of [`EventStreamOptions::max_streams`].
pub const DEFAULT_MAX_STREAMS: usize = 32;
/// Default of [`EventStreamOptions::keepalive`].
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);
/// Default of [`EventStreamOptions::linger`].
pub const DEFAULT_LINGER: Duration = Duration::from_secs(60);

/// Plugin calls are streamed as counts per this interval, never one message per call.
pub const PLUGIN_INTERVAL: Duration = Duration::from_secs(1);

/// The hub's own bus subscription (the bus's default subscriber queue).
const HUB_BUS_QUEUE: usize = 65_536;
/// The hub's run-feed subscription.
const HUB_RUN_QUEUE: usize = 4096;
/// Items the hub takes from each queue before it publishes them under the lock.
const BATCH: usize = 256;

/// Event names the stream uses for its own events; a custom bus topic spelt like one of them
/// is sent as `message` (SSE's default type; its envelope's `topic` says which).
pub const RESERVED_NAMES: &[&str] = &[
    "ready", "dropped", "gap", "run", "plugin", "shutdown", "message",
];

const KEEPALIVE_FRAME: &[u8] = b": keep-alive\n\n";

/// How the event stream is served (see docs/http.md § The live stream).
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct EventStreamOptions {
    /// Frames queued for one client, and at most this many bytes of them; beyond, that client
    /// loses messages (counted, and told with a `dropped` event). Defaults
    /// [`DEFAULT_STREAM_QUEUE`] (80 ms of a 50,000 events/s flow: what a client descheduled
    /// on a busy machine needs) and [`DEFAULT_STREAM_QUEUE_BYTES`] (so a stalled client
    /// cannot pin thousands of large events).
    pub queue: usize,
    /// The byte cap on one client's queued frames (see `queue`).
    pub queue_bytes: usize,
    /// Items kept for `Last-Event-ID` resumes and `?backlog=N` (default [`DEFAULT_BACKLOG`]),
    /// and at most this many bytes of them (default [`DEFAULT_BACKLOG_BYTES`]).
    pub backlog: usize,
    /// The byte cap on the backlog (see `backlog`).
    pub backlog_bytes: usize,
    /// Streams open at once (default [`DEFAULT_MAX_STREAMS`]); with [`super::Server`], also at
    /// most half its connection cap, so streams never take the connections requests need.
    /// More get 429.
    pub max_streams: usize,
    /// A comment line is sent after this long without anything else (default
    /// [`DEFAULT_KEEPALIVE`]), so proxies and idle timeouts keep a quiet stream open.
    pub keepalive: Duration,
    /// How long the stream keeps recording after its last client left (default
    /// [`DEFAULT_LINGER`]): a client reconnecting within it resumes without a gap.
    pub linger: Duration,
    /// Record from the start and never stop (default `false`: only while a client is
    /// connected, and for `linger` after). `prx-hooks run --listen` turns it on, so a client
    /// joining late sees what just happened (`?backlog=N`, `prx-hooks tail --last N`); it costs
    /// what a bus subscriber to `*` costs: every event is serialized even if nothing else
    /// listens.
    pub always: bool,
}

impl Default for EventStreamOptions {
    fn default() -> Self {
        EventStreamOptions {
            queue: DEFAULT_STREAM_QUEUE,
            queue_bytes: DEFAULT_STREAM_QUEUE_BYTES,
            backlog: DEFAULT_BACKLOG,
            backlog_bytes: DEFAULT_BACKLOG_BYTES,
            max_streams: DEFAULT_MAX_STREAMS,
            keepalive: DEFAULT_KEEPALIVE,
            linger: DEFAULT_LINGER,
            always: false,
        }
    }
}

impl EventStreamOptions {
    /// See [`EventStreamOptions::queue`] (at least 1).
    pub fn queue(mut self, frames: usize) -> Self {
        self.queue = frames.max(1);
        self
    }

    /// See [`EventStreamOptions::queue_bytes`] (one frame always fits, whatever its size).
    pub fn queue_bytes(mut self, bytes: usize) -> Self {
        self.queue_bytes = bytes;
        self
    }

    /// See [`EventStreamOptions::backlog`] (0 turns resuming off).
    pub fn backlog(mut self, items: usize, bytes: usize) -> Self {
        self.backlog = items;
        self.backlog_bytes = bytes;
        self
    }

    /// See [`EventStreamOptions::max_streams`] (0 refuses every stream).
    pub fn max_streams(mut self, n: usize) -> Self {
        self.max_streams = n;
        self
    }

    /// See [`EventStreamOptions::keepalive`] (at least 10 ms).
    pub fn keepalive(mut self, every: Duration) -> Self {
        self.keepalive = every.max(Duration::from_millis(10));
        self
    }

    /// See [`EventStreamOptions::linger`].
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// See [`EventStreamOptions::always`].
    pub fn record_always(mut self, on: bool) -> Self {
        self.always = on;
        self
    }
}

/// The event stream's counters (`/api/stats` → `events`, `/metrics` → `http_event_*`).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventStreamStats {
    /// This stream's instance: the part of every `id:` before the dash.
    pub instance: String,
    /// Whether the hub is recording now (a client is connected, or left less than `linger`
    /// ago).
    pub recording: bool,
    /// Streams open now, and the cap in force.
    pub streams: u64,
    /// The cap on streams open at once.
    pub max_streams: u64,
    /// Streams opened, and refused over the cap.
    pub opened: u64,
    /// Streams refused because the cap was reached.
    pub refused: u64,
    /// Items numbered (bus messages, runs, plugin aggregates, server-side drop notices).
    pub items: u64,
    /// Frames handed to clients' queues.
    pub delivered: u64,
    /// Messages a client missed because its queue was full (it read too slowly): one per
    /// frame lost, and for a lost `server_queue_full` notice the messages it stood for.
    pub dropped_client: u64,
    /// Bus messages and runs the hub itself lost (its own queues were full): every client
    /// missed them.
    pub dropped_server: u64,
    /// Resumes with `Last-Event-ID`, and those of them that could not be whole (a gap).
    pub resumed: u64,
    /// Resumes that could not be whole: items past the backlog were lost.
    pub gaps: u64,
    /// Items and bytes in the backlog now.
    pub backlog: u64,
    /// Bytes of the items in the backlog now.
    pub backlog_bytes: u64,
}

/// What a client asked for.
#[derive(Clone, Debug)]
struct Filter {
    /// Bus topics (any of these patterns), or none at all.
    bus: Option<Vec<Pattern>>,
    runs: bool,
    plugins: bool,
}

/// What one item of the stream is, for matching it against a [`Filter`].
enum What {
    Bus(Topic),
    Run,
    Plugin,
    /// The hub lost this many items of a kind before numbering them.
    Lost(Source, u64),
}

impl What {
    /// How many messages a client misses when it loses this item's frame: one, or for the
    /// hub's own loss notice, the messages it stands for (so a client's counts still add up).
    fn weight(&self) -> u64 {
        match self {
            What::Lost(_, n) => *n,
            _ => 1,
        }
    }
}

enum Topic {
    Lifecycle(EventKind),
    Custom(Box<str>),
}

#[derive(Clone, Copy)]
enum Source {
    Bus,
    Runs,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Bus => "bus",
            Source::Runs => "runs",
        }
    }
}

impl Filter {
    fn wants(&self, what: &What) -> bool {
        match what {
            What::Bus(topic) => self.bus.as_ref().is_some_and(|ps| {
                let t = match topic {
                    Topic::Lifecycle(k) => k.topic(),
                    Topic::Custom(t) => t,
                };
                ps.iter().any(|p| p.matches(t))
            }),
            What::Run => self.runs,
            What::Plugin => self.plugins,
            What::Lost(Source::Bus, _) => self.bus.is_some(),
            What::Lost(Source::Runs, _) => self.runs,
        }
    }
}

/// One numbered item, rendered.
struct Entry {
    pos: u64,
    what: What,
    frame: Bytes,
}

/// The items kept for resumes, oldest first, bounded in count and bytes.
struct Journal {
    entries: VecDeque<Entry>,
    bytes: usize,
    /// The next position to assign (positions start at 1; 0 means "before everything").
    next: u64,
    /// The first position recorded since the hub last stopped recording: what came before it
    /// and after the position before it was never seen.
    recorded_from: u64,
}

impl Journal {
    fn first_kept(&self) -> u64 {
        self.entries.front().map_or(self.next, |e| e.pos)
    }

    fn push(&mut self, e: Entry, max: usize, max_bytes: usize) {
        self.next = e.pos + 1;
        if max == 0 {
            return;
        }
        self.bytes += e.frame.len();
        self.entries.push_back(e);
        while self.entries.len() > max || (self.bytes > max_bytes && self.entries.len() > 1) {
            if let Some(old) = self.entries.pop_front() {
                self.bytes -= old.frame.len();
            }
        }
    }

    /// Stops recording: what is kept is forgotten, and resumes from before now are gaps. One
    /// position is skipped, standing for what passes unrecorded, so that a resume from the
    /// last position before the pause is told as a gap too.
    fn pause(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.next += 1;
        self.recorded_from = self.next;
    }
}

/// A queued frame; `lost_before` frames were lost just before it (announced first).
struct Out {
    bytes: Bytes,
    lost_before: u64,
}

/// One client, as the hub sees it.
struct Client {
    id: u64,
    filter: Filter,
    tx: tokio::sync::mpsc::Sender<Out>,
    shared: Arc<ClientShared>,
    last_sent: Instant,
}

/// Both ends of a client share these.
#[derive(Default)]
struct ClientShared {
    /// Frames lost since the last `dropped` event.
    unannounced: AtomicU64,
    /// Frames lost over the stream's life.
    lost: AtomicU64,
    /// Bytes of the frames in the queue and in hyper's hands: added before a send, taken off
    /// when hyper has written them (dropped the chunk that carried them; `body.rs`), or by the
    /// sender when the send fails.
    queued_bytes: AtomicUsize,
    /// The `shutdown` frame, set when the hub closes: the body sends it after everything
    /// queued and the notice of what was lost, whatever room the queue had.
    shutdown: Mutex<Option<Bytes>>,
}

impl Client {
    /// Offers a frame without blocking; a full queue (in frames or in bytes) loses it
    /// (counted).
    fn offer(
        &mut self,
        frame: &Bytes,
        weight: u64,
        counters: &Counters,
        now: Instant,
        max_bytes: usize,
    ) {
        let queued = self.shared.queued_bytes.load(Ordering::Relaxed);
        if queued > 0 && queued + frame.len() > max_bytes {
            self.lose(0, weight, counters);
            return;
        }
        let lost_before = self.shared.unannounced.swap(0, Ordering::Relaxed);
        match self.send(frame.clone(), lost_before) {
            Ok(()) => {
                self.last_sent = now;
                counters.delivered.fetch_add(1, Ordering::Relaxed);
            }
            // Full, or the body is gone (its Drop removes it at once): either way the frame
            // and those it carried are still unannounced.
            Err(carried) => self.lose(carried, weight, counters),
        }
    }

    /// `try_send` with the byte count kept; on failure, the losses the frame carried.
    fn send(&self, bytes: Bytes, lost_before: u64) -> Result<(), u64> {
        let len = bytes.len();
        self.shared.queued_bytes.fetch_add(len, Ordering::Relaxed);
        self.tx.try_send(Out { bytes, lost_before }).map_err(|e| {
            self.shared.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            match e {
                tokio::sync::mpsc::error::TrySendError::Full(o) => o.lost_before,
                tokio::sync::mpsc::error::TrySendError::Closed(o) => o.lost_before,
            }
        })
    }

    fn lose(&self, carried: u64, weight: u64, counters: &Counters) {
        self.shared
            .unannounced
            .fetch_add(carried + weight, Ordering::Relaxed);
        self.shared.lost.fetch_add(weight, Ordering::Relaxed);
        counters.dropped_client.fetch_add(weight, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Counters {
    opened: AtomicU64,
    refused: AtomicU64,
    items: AtomicU64,
    delivered: AtomicU64,
    dropped_client: AtomicU64,
    dropped_server: AtomicU64,
    resumed: AtomicU64,
    gaps: AtomicU64,
}

struct HubState {
    clients: Vec<Client>,
    journal: Journal,
    /// While recording: the hub thread (taken by whoever ends it).
    thread: Option<JoinHandle<()>>,
    recording: bool,
    /// Closed for good, with the reason the `shutdown` event gives.
    closed: Option<&'static str>,
    /// When the last client left (the linger is counted from here).
    idle_since: Instant,
    next_client: u64,
}

struct Hub {
    instance: String,
    opts: EventStreamOptions,
    state: Mutex<HubState>,
    /// Wakes the hub thread (a client left, or the hub closed).
    poke: flume::Sender<()>,
    poked: flume::Receiver<()>,
    /// Streams open (bodies alive), counted apart from `clients` (which `close` empties).
    open: AtomicUsize,
    counters: Counters,
    /// The serving [`super::Server`]'s connection counters (the stream cap follows its cap).
    conns: Option<Arc<ConnCounters>>,
}

/// The event stream of one router: cheap to clone, all clones are the same stream.
#[derive(Clone)]
pub(crate) struct EventHub(Arc<Hub>);

/// Why a stream could not be opened.
enum Refused {
    Closed,
    Full(usize),
}

impl EventHub {
    pub(crate) fn new(opts: EventStreamOptions, conns: Option<Arc<ConnCounters>>) -> EventHub {
        let (poke, poked) = flume::bounded(1);
        let mut nonce = [0u8; 8];
        // Without randomness the instance is still unique enough per process and start time.
        if getrandom::fill(&mut nonce).is_err() {
            let t = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            nonce = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_ne_bytes();
        }
        EventHub(Arc::new(Hub {
            instance: format!("{:016x}", u64::from_ne_bytes(nonce)),
            opts,
            state: Mutex::new(HubState {
                clients: Vec::new(),
                journal: Journal {
                    entries: VecDeque::new(),
                    bytes: 0,
                    next: 1,
                    recorded_from: 1,
                },
                thread: None,
                recording: false,
                closed: None,
                idle_since: Instant::now(),
                next_client: 0,
            }),
            poke,
            poked,
            open: AtomicUsize::new(0),
            counters: Counters::default(),
            conns,
        }))
    }

    /// With [`EventStreamOptions::always`], starts recording now (a hook system already shut
    /// down is left alone).
    pub(crate) fn start(&self, hooks: &Arc<Hooks>) {
        if !self.0.opts.always {
            return;
        }
        let mut st = self.0.lock();
        if st.recording || st.closed.is_some() || hooks.is_shut_down() {
            return;
        }
        let _ = self.0.start_recording(&mut st, hooks);
    }

    /// Ends every stream (each gets a `shutdown` event with `reason`), stops recording and
    /// refuses new streams (503). Idempotent; waits for the hub thread to end.
    pub(crate) fn close(&self, reason: &'static str) {
        let thread = self.0.close(reason);
        if let Some(t) = thread
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }

    pub(crate) fn stats(&self) -> EventStreamStats {
        let hub = &self.0;
        let st = hub.lock();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &hub.counters;
        EventStreamStats {
            instance: hub.instance.clone(),
            recording: st.recording,
            streams: hub.open.load(Ordering::Relaxed) as u64,
            max_streams: hub.cap() as u64,
            opened: get(&c.opened),
            refused: get(&c.refused),
            items: get(&c.items),
            delivered: get(&c.delivered),
            dropped_client: get(&c.dropped_client),
            dropped_server: get(&c.dropped_server),
            resumed: get(&c.resumed),
            gaps: get(&c.gaps),
            backlog: st.journal.entries.len() as u64,
            backlog_bytes: st.journal.bytes as u64,
        }
    }
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream cap in force: the option, and with our own server at most half its
    /// connection cap (which it recomputes at every accept).
    fn cap(&self) -> usize {
        let mut cap = self.opts.max_streams;
        if let Some(c) = &self.conns {
            cap = cap.min((c.max_now() / 2).max(1));
        }
        cap
    }

    fn poke(&self) {
        let _ = self.poke.try_send(());
    }

    /// Marks the hub closed, says so to every client and lets their bodies end. Returns the
    /// hub thread's handle for the caller to join.
    fn close(&self, reason: &'static str) -> Option<JoinHandle<()>> {
        let mut st = self.lock();
        if st.closed.is_none() {
            st.closed = Some(reason);
        }
        let frame = control_frame("shutdown", &serde_json::json!({ "reason": reason }));
        // Not through the queue, which may be full: each body sends what its queue holds,
        // then the notice of its losses, then this, and ends (its sender is dropped here).
        for c in st.clients.drain(..) {
            *c.shared.shutdown.lock().unwrap_or_else(|e| e.into_inner()) = Some(frame.clone());
        }
        if st.recording {
            st.recording = false;
            st.journal.pause();
        }
        let thread = st.thread.take();
        drop(st);
        self.poke();
        thread
    }

    /// Opens a stream: registers the client and returns what it is sent first (a gap notice,
    /// the replay, `ready`) with its queue's receiving end.
    fn open(
        self: &Arc<Hub>,
        hooks: &Arc<Hooks>,
        filter: Filter,
        start: Start,
    ) -> Result<EventBody, Refused> {
        let mut st = self.lock();
        if st.closed.is_some() || hooks.is_shut_down() {
            return Err(Refused::Closed);
        }
        let cap = self.cap();
        if self.open.load(Ordering::Relaxed) >= cap {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Full(cap));
        }
        if !st.recording {
            self.start_recording(&mut st, hooks)?;
        }
        let mut prefix = VecDeque::new();
        let j = &st.journal;
        let last = j.next - 1;
        let replay_after = match &start {
            Start::Live => last,
            Start::Backlog(n) => j
                .entries
                .iter()
                .rev()
                .filter(|e| filter.wants(&e.what))
                .take(*n)
                .last()
                .map_or(last, |e| e.pos - 1),
            Start::Resume(id) => {
                self.counters.resumed.fetch_add(1, Ordering::Relaxed);
                match self.resume_gap(j, id) {
                    Some((gap, after)) => {
                        self.counters.gaps.fetch_add(1, Ordering::Relaxed);
                        prefix.push_back(control_frame("gap", &gap));
                        after
                    }
                    None => match id {
                        LastId::Ours(p) => *p,
                        LastId::Other(_) => j.first_kept().saturating_sub(1),
                    },
                }
            }
        };
        let mut replayed = 0usize;
        for e in j.entries.iter().filter(|e| e.pos > replay_after) {
            if filter.wants(&e.what) {
                prefix.push_back(e.frame.clone());
                replayed += 1;
            }
        }
        let ready = serde_json::json!({
            "instance": self.instance,
            "position": self.id(last),
            "replayed": replayed,
            "kinds": filter.kinds(),
            "patterns": filter.bus.as_ref().map(|ps| ps.iter().map(pattern_text).collect::<Vec<_>>()),
            "backlog": j.entries.len(),
            "keepalive_ms": self.opts.keepalive.as_millis() as u64,
        });
        prefix.push_back(frame(Some(&self.id(last)), "ready", &ready));
        let (tx, rx) = tokio::sync::mpsc::channel(self.opts.queue.max(1));
        let shared = Arc::new(ClientShared::default());
        st.next_client += 1;
        let id = st.next_client;
        st.clients.push(Client {
            id,
            filter,
            tx,
            shared: shared.clone(),
            last_sent: Instant::now(),
        });
        self.open.fetch_add(1, Ordering::Relaxed);
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        Ok(EventBody::new(prefix, rx, shared, self.clone(), id))
    }

    /// A resume that cannot be whole: the `gap` event's data and the position to replay
    /// after. `None`: everything after `id` is in the backlog.
    fn resume_gap(&self, j: &Journal, id: &LastId) -> Option<(serde_json::Value, u64)> {
        let last = j.next - 1;
        let (reason, missed, after) = match id {
            // Another instance's id: everything this one holds came after it (a restarted
            // server), so all of it is replayed.
            LastId::Other(_) => ("other_instance", None, j.first_kept().saturating_sub(1)),
            LastId::Ours(p) if *p > last => ("unknown_id", None, last),
            LastId::Ours(p) if p + 1 < j.recorded_from => {
                ("not_recorded", None, j.recorded_from - 1)
            }
            LastId::Ours(p) if p + 1 < j.first_kept() => {
                ("evicted", Some(j.first_kept() - p - 1), j.first_kept() - 1)
            }
            LastId::Ours(_) => return None,
        };
        let given = match id {
            LastId::Ours(p) => self.id(*p),
            LastId::Other(s) => s.clone(),
        };
        let first = (after < last).then(|| self.id(after + 1));
        Some((
            serde_json::json!({
                "reason": reason,
                "last_event_id": given,
                "instance": self.instance,
                "missed": missed,
                "first_available": first,
            }),
            after,
        ))
    }

    fn id(&self, pos: u64) -> String {
        format!("{}-{pos}", self.instance)
    }

    /// Subscribes to the bus (and the run feed), and starts the hub thread. Caller holds the
    /// state lock.
    fn start_recording(
        self: &Arc<Hub>,
        st: &mut HubState,
        hooks: &Arc<Hooks>,
    ) -> Result<(), Refused> {
        let bus = hooks
            .bus()
            .subscribe_with_capacity("*", HUB_BUS_QUEUE)
            .map_err(|_| Refused::Closed)?;
        let runs = hooks.shell().map(|s| s.subscribe_runs(HUB_RUN_QUEUE));
        let plugins = PluginCounter::new(hooks);
        // A thread that ended by itself (linger) left its handle; it is done or about to be.
        if let Some(old) = st.thread.take() {
            drop(old);
        }
        let hub = self.clone();
        let next = st.journal.next;
        let thread = std::thread::Builder::new()
            .name("prx-http-events".into())
            .spawn(move || record(hub, bus, runs, plugins, next))
            .map_err(|e| {
                tracing::warn!("event stream: cannot start its thread: {e}");
                Refused::Closed
            })?;
        st.thread = Some(thread);
        st.recording = true;
        Ok(())
    }

    /// A body went away.
    fn leave(&self, id: u64) {
        let mut st = self.lock();
        st.clients.retain(|c| c.id != id);
        if self.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            st.idle_since = Instant::now();
        }
        drop(st);
        self.poke();
    }
}

fn pattern_text(p: &Pattern) -> String {
    match p {
        Pattern::All => "*".into(),
        Pattern::Prefix(stem) => format!("{stem}*"),
        Pattern::Exact(t) => t.to_string(),
    }
}

impl Filter {
    fn kinds(&self) -> Vec<&'static str> {
        let mut k = Vec::new();
        if self.bus.is_some() {
            k.push("bus");
        }
        if self.runs {
            k.push("runs");
        }
        if self.plugins {
            k.push("plugins");
        }
        k
    }
}

/// An SSE frame: `id:` (when given), `event:`, one `data:` line of compact JSON.
fn frame(id: Option<&str>, name: &str, data: &impl Serialize) -> Bytes {
    let json = serde_json::to_vec(data).unwrap_or_else(|_| b"null".to_vec());
    frame_raw(id, name, &json)
}

fn frame_raw(id: Option<&str>, name: &str, json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(json.len() + name.len() + 48);
    if let Some(id) = id {
        b.put_slice(b"id: ");
        b.put_slice(id.as_bytes());
        b.put_u8(b'\n');
    }
    b.put_slice(b"event: ");
    b.put_slice(name.as_bytes());
    b.put_slice(b"\ndata: ");
    // Compact JSON has no raw newline (strings escape theirs); a stray one would end the
    // field, so it is cut into `data:` lines, which SSE joins back with '\n'.
    for (i, line) in json.split(|&c| c == b'\n').enumerate() {
        if i > 0 {
            b.put_slice(b"\ndata: ");
        }
        b.put_slice(line);
    }
    b.put_slice(b"\n\n");
    b.freeze()
}

/// A bus message's frame, written in one buffer that becomes the frame without a copy: the
/// hub's per-message cost (what limits the stream's rate) is the envelope and one allocation.
fn bus_frame(instance: &str, pos: u64, name: &str, m: &Message) -> Bytes {
    let mut b = Vec::with_capacity(m.json().len() + m.agent().len() + m.session().len() + 192);
    b.extend_from_slice(b"id: ");
    b.extend_from_slice(instance.as_bytes());
    b.push(b'-');
    b.extend_from_slice(itoa::Buffer::new().format(pos).as_bytes());
    b.extend_from_slice(b"\nevent: ");
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(b"\ndata: ");
    let start = b.len();
    m.write_envelope(&mut b);
    if b[start..].contains(&b'\n') {
        // Cannot happen (the envelope is compact JSON), but a raw newline would end the
        // field: the slow path cuts it into `data:` lines.
        let json = b.split_off(start);
        let mut id = String::from(instance);
        id.push('-');
        id.push_str(itoa::Buffer::new().format(pos));
        return frame_raw(Some(&id), name, &json);
    }
    b.extend_from_slice(b"\n\n");
    Bytes::from(b)
}

/// A frame without an id: the stream's own notices (`gap`, `dropped`, `shutdown`).
fn control_frame(name: &str, data: &impl Serialize) -> Bytes {
    frame(None, name, data)
}

#[cfg(test)]
mod tests {
    use super::query::parse_last_id;
    use super::*;

    #[test]
    fn frames_are_one_event_each_and_split_stray_newlines() {
        let f = frame_raw(Some("ab-1"), "prx.lifecycle.error", b"{\"a\":1}");
        assert_eq!(
            &f[..],
            b"id: ab-1\nevent: prx.lifecycle.error\ndata: {\"a\":1}\n\n"
        );
        let f = frame_raw(None, "x", b"1\n2");
        assert_eq!(&f[..], b"event: x\ndata: 1\ndata: 2\n\n");
    }

    #[test]
    fn a_bus_frame_is_the_envelope_run_print_writes() {
        let meta = crate::bus::Meta {
            kind: Some(EventKind::Error),
            seq: 3,
            timestamp: SystemTime::UNIX_EPOCH,
            depth: 0,
            relay: 0,
        };
        let m = Message::new("{\"a\":1}", "ag", "se", "", meta);
        let mut env = Vec::new();
        m.write_envelope(&mut env);
        let f = bus_frame("00ff", 12, "prx.lifecycle.error", &m);
        let mut want = b"id: 00ff-12\nevent: prx.lifecycle.error\ndata: ".to_vec();
        want.extend_from_slice(&env);
        want.extend_from_slice(b"\n\n");
        assert_eq!(&f[..], &want[..]);
    }

    #[test]
    fn last_event_ids_are_ours_or_another_instances() {
        assert!(matches!(
            parse_last_id("00ff-7", "00ff"),
            Ok(LastId::Ours(7))
        ));
        assert!(matches!(parse_last_id("abcd-7", "00ff"), Ok(LastId::Other(s)) if s == "abcd-7"));
        for bad in [
            "", "7", "00ff-", "00ff-x", "-7", "a b-1", "00ff--1", "00ff-+3", "00ff-03", "00ff- 3",
        ] {
            assert!(parse_last_id(bad, "00ff").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_journal_keeps_its_bounds_and_knows_what_it_lost() {
        let mut j = Journal {
            entries: VecDeque::new(),
            bytes: 0,
            next: 1,
            recorded_from: 1,
        };
        for pos in 1..=10 {
            let frame = Bytes::from(vec![b'x'; 10]);
            j.push(
                Entry {
                    pos,
                    what: What::Run,
                    frame,
                },
                4,
                35,
            );
        }
        assert_eq!(
            (j.entries.len(), j.bytes, j.first_kept(), j.next),
            (3, 30, 8, 11)
        );
        j.pause();
        assert_eq!(
            (j.entries.len(), j.first_kept(), j.recorded_from),
            (0, 12, 12)
        );
    }
}
