//! The hub thread: takes bus messages and hook runs, numbers and renders them, and hands each
//! batch to the backlog and the clients (ARCHITECTURE.md § The live stream).

use super::*;

/// The plugin backend's call counters, diffed once a second.
pub(super) struct PluginCounter {
    #[cfg(feature = "wasm")]
    pub(super) sink: Arc<crate::wasm::WasmSink>,
    #[cfg(feature = "wasm")]
    pub(super) last: std::collections::BTreeMap<String, [u64; 11]>,
}

/// The per-call results and drop reasons counted, in the order of [`PluginCounter`]'s arrays.
#[cfg(feature = "wasm")]
pub(super) const PLUGIN_FIELDS: [(&str, &str); 11] = [
    ("results", "ok"),
    ("results", "error"),
    ("results", "trap"),
    ("results", "timeout"),
    ("results", "out_of_fuel"),
    ("results", "busy"),
    ("dropped", "queue_full"),
    ("dropped", "suspended"),
    ("dropped", "shutdown"),
    ("dropped", "reload"),
    ("dropped", "fenced"),
];

impl PluginCounter {
    #[cfg(feature = "wasm")]
    pub(super) fn new(hooks: &Hooks) -> Option<PluginCounter> {
        let sink = hooks.plugins()?.clone();
        let mut c = PluginCounter {
            sink,
            last: Default::default(),
        };
        c.aggregates(SystemTime::now(), Duration::ZERO);
        Some(c)
    }

    #[cfg(not(feature = "wasm"))]
    pub(super) fn new(_: &Hooks) -> Option<PluginCounter> {
        None
    }

    /// One aggregate per plugin whose counters moved since the last call.
    #[cfg(feature = "wasm")]
    pub(super) fn aggregates(
        &mut self,
        now: SystemTime,
        interval: Duration,
    ) -> Vec<serde_json::Value> {
        let stats = self.sink.stats();
        let mut out = Vec::new();
        for p in &stats.plugins {
            let c = &p.counts;
            let now_counts = [
                c.ok,
                c.errors,
                c.traps,
                c.timeouts,
                c.out_of_fuel,
                c.busy,
                c.dropped_queue_full,
                c.dropped_suspended,
                c.dropped_shutdown,
                c.dropped_reload,
                c.dropped_fenced,
            ];
            let before = self
                .last
                .insert(p.name.clone(), now_counts)
                .unwrap_or([0; 11]);
            if interval.is_zero() {
                continue;
            }
            let mut results = serde_json::Map::new();
            let mut dropped = serde_json::Map::new();
            let mut calls = 0u64;
            for (i, (group, name)) in PLUGIN_FIELDS.iter().enumerate() {
                // A counter that went down (cannot happen: counts outlive versions) is a
                // fresh start.
                let d = now_counts[i].saturating_sub(before[i]);
                if d == 0 {
                    continue;
                }
                if *group == "results" {
                    calls += d;
                    results.insert((*name).into(), d.into());
                } else {
                    dropped.insert((*name).into(), d.into());
                }
            }
            if results.is_empty() && dropped.is_empty() {
                continue;
            }
            out.push(serde_json::json!({
                "plugin": p.name,
                "time": humantime::format_rfc3339_micros(now).to_string(),
                "interval_ms": interval.as_millis() as u64,
                "calls": calls,
                "results": results,
                "dropped": dropped,
                "state": p.state,
                "last_error": c.last_error,
            }));
        }
        out
    }

    #[cfg(not(feature = "wasm"))]
    pub(super) fn aggregates(&mut self, _: SystemTime, _: Duration) -> Vec<serde_json::Value> {
        Vec::new()
    }
}

/// What woke the hub thread.
pub(super) enum Woke {
    Bus(Result<Message, flume::RecvError>),
    Run(Result<Arc<Outcome>, flume::RecvError>),
    Poke,
}

/// The hub thread: drains the bus subscription and the run feed in batches, numbers and
/// renders each item, publishes the batch under the state lock (backlog, then every client
/// that wants it), sends the plugin aggregates each second and keep-alives to quiet clients,
/// and ends when the hub closes, the bus closes, or nobody has watched for `linger`.
pub(super) fn record(
    hub: Arc<Hub>,
    bus: Subscription,
    runs: Option<RunSubscription>,
    plugins: Option<PluginCounter>,
    next: u64,
) {
    let tick = hub
        .opts
        .keepalive
        .min(PLUGIN_INTERVAL)
        .min(Duration::from_millis(250).max(hub.opts.linger / 4))
        .max(Duration::from_millis(5));
    let mut r = Recorder {
        runs_open: runs.is_some(),
        hub,
        bus,
        runs,
        plugins,
        next,
        msgs: Vec::with_capacity(BATCH),
        outs: Vec::with_capacity(BATCH),
        items: Vec::with_capacity(2 * BATCH),
        bus_lost: 0,
        runs_lost: 0,
        bus_open: true,
        last_plugins: Instant::now(),
    };
    loop {
        let busy = r.take();
        // Render outside the lock; only the hub thread assigns positions.
        r.render();
        r.losses();
        let now = Instant::now();
        r.plugin_aggregates(now);
        if !r.publish(now) {
            return;
        }
        if !busy {
            r.wait(tick, now);
        }
    }
}

/// The hub thread's state between two batches.
struct Recorder {
    hub: Arc<Hub>,
    bus: Subscription,
    runs: Option<RunSubscription>,
    plugins: Option<PluginCounter>,
    /// The position the next item gets.
    next: u64,
    msgs: Vec<Message>,
    outs: Vec<Arc<Outcome>>,
    /// Rendered, numbered items waiting to be published (positions `next - len .. next`).
    items: Vec<(What, Bytes)>,
    /// The subscriptions' drop counters as last announced.
    bus_lost: u64,
    runs_lost: u64,
    bus_open: bool,
    runs_open: bool,
    last_plugins: Instant,
}

impl Recorder {
    /// Takes up to a batch from the bus and from the run feed without waiting; true when
    /// either gave a full batch (more may be waiting).
    fn take(&mut self) -> bool {
        while self.msgs.len() < BATCH {
            match self.bus.receiver().try_recv() {
                Ok(m) => self.msgs.push(m),
                Err(flume::TryRecvError::Empty) => break,
                Err(flume::TryRecvError::Disconnected) => {
                    self.bus_open = false;
                    break;
                }
            }
        }
        if let Some(r) = self.runs.as_ref().filter(|_| self.runs_open) {
            while self.outs.len() < BATCH {
                match r.receiver().try_recv() {
                    Ok(o) => self.outs.push(o),
                    Err(flume::TryRecvError::Empty) => break,
                    Err(flume::TryRecvError::Disconnected) => {
                        self.runs_open = false;
                        break;
                    }
                }
            }
        }
        self.msgs.len() == BATCH || self.outs.len() == BATCH
    }

    /// Numbers and renders what `take` took.
    fn render(&mut self) {
        for m in self.msgs.drain(..) {
            let topic = match m.event() {
                Some(k) => Topic::Lifecycle(k),
                None => Topic::Custom(m.topic().into()),
            };
            let name = match m.topic() {
                t if RESERVED_NAMES.contains(&t) => "message",
                t => t,
            };
            let frame = bus_frame(&self.hub.instance, self.next, name, &m);
            self.items.push((What::Bus(topic), frame));
            self.next += 1;
        }
        for o in self.outs.drain(..) {
            let id = self.hub.id(self.next);
            self.next += 1;
            let run = super::super::hooks::run_json(&o);
            self.items.push((What::Run, frame(Some(&id), "run", &run)));
        }
    }

    /// A `dropped` item for what the subscriptions lost since the last batch.
    fn losses(&mut self) {
        let runs_now = self.runs.as_ref().map_or(0, |r| r.dropped());
        for (source, now_lost) in [(Source::Bus, self.bus.dropped()), (Source::Runs, runs_now)] {
            let seen = match source {
                Source::Bus => &mut self.bus_lost,
                Source::Runs => &mut self.runs_lost,
            };
            if now_lost > *seen {
                let d = now_lost - *seen;
                *seen = now_lost;
                self.hub
                    .counters
                    .dropped_server
                    .fetch_add(d, Ordering::Relaxed);
                let id = self.hub.id(self.next);
                self.next += 1;
                let data = serde_json::json!({
                    "count": d,
                    "reason": "server_queue_full",
                    "source": source.name(),
                });
                self.items
                    .push((What::Lost(source, d), frame(Some(&id), "dropped", &data)));
            }
        }
    }

    /// The plugin aggregates, once a [`PLUGIN_INTERVAL`].
    fn plugin_aggregates(&mut self, now: Instant) {
        if let Some(p) = self.plugins.as_mut()
            && now.duration_since(self.last_plugins) >= PLUGIN_INTERVAL
        {
            for agg in p.aggregates(SystemTime::now(), now - self.last_plugins) {
                let id = self.hub.id(self.next);
                self.next += 1;
                self.items
                    .push((What::Plugin, frame(Some(&id), "plugin", &agg)));
            }
            self.last_plugins = now;
        }
    }

    /// Publishes the batch (backlog, then every client that wants it, in position order),
    /// sends keep-alives to quiet clients, and decides whether recording goes on: false when
    /// the hub closed, the bus closed, or nobody has watched for `linger`.
    fn publish(&mut self, now: Instant) -> bool {
        let hub = &self.hub;
        let mut st = hub.lock();
        if st.closed.is_some() || !st.recording {
            return false;
        }
        if !self.items.is_empty() {
            let first = self.next - self.items.len() as u64;
            hub.counters
                .items
                .fetch_add(self.items.len() as u64, Ordering::Relaxed);
            let (max, max_bytes) = (hub.opts.backlog, hub.opts.backlog_bytes);
            for (i, (what, frame)) in self.items.drain(..).enumerate() {
                let weight = what.weight();
                for c in st.clients.iter_mut().filter(|c| c.filter.wants(&what)) {
                    c.offer(&frame, weight, &hub.counters, now, hub.opts.queue_bytes);
                }
                let pos = first + i as u64;
                st.journal.push(Entry { pos, what, frame }, max, max_bytes);
            }
        }
        if !self.bus_open {
            drop(st);
            let _ = hub.close("the hook system shut down");
            return false;
        }
        let keepalive = Bytes::from_static(KEEPALIVE_FRAME);
        for c in st
            .clients
            .iter_mut()
            .filter(|c| now.duration_since(c.last_sent) >= hub.opts.keepalive)
        {
            if c.send(keepalive.clone(), 0).is_ok() {
                c.last_sent = now;
            }
        }
        if !hub.opts.always
            && st.clients.is_empty()
            && hub.open.load(Ordering::Relaxed) == 0
            && now.duration_since(st.idle_since) >= hub.opts.linger
        {
            // Nobody has watched for `linger`: stop recording (the pipeline no longer
            // serializes events for us) until the next client.
            st.recording = false;
            st.journal.pause();
            drop(st.thread.take());
            return false;
        }
        true
    }

    /// Waits for the next message, run or poke, at most until the next keep-alive or plugin
    /// tick.
    fn wait(&mut self, tick: Duration, now: Instant) {
        let since = now.duration_since(self.last_plugins);
        let wait = tick.min(PLUGIN_INTERVAL.saturating_sub(since));
        let mut sel = flume::Selector::new()
            .recv(self.bus.receiver(), Woke::Bus)
            .recv(&self.hub.poked, |_| Woke::Poke);
        if let Some(r) = self.runs.as_ref().filter(|_| self.runs_open) {
            sel = sel.recv(r.receiver(), Woke::Run);
        }
        match sel.wait_timeout(wait.max(Duration::from_millis(1))) {
            Ok(Woke::Bus(Ok(m))) => self.msgs.push(m),
            Ok(Woke::Bus(Err(_))) => self.bus_open = false,
            Ok(Woke::Run(Ok(o))) => self.outs.push(o),
            Ok(Woke::Run(Err(_))) => self.runs_open = false,
            Ok(Woke::Poke) | Err(_) => {}
        }
    }
}
