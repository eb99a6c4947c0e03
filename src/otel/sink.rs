//! `OtelSink`: the [`Sink`] behind the ring that turns events and hook outcomes into spans and
//! exports them, both as tasks of one thread (`prx-otel`, a 1-thread tokio runtime).

use super::batch::Batch;
use super::export::{Exporter, Queue};
use super::options::OtlpOptions;
use super::spans::{Builder, Limits};
use super::{OtelStats, STATS_SECTION};
use crate::bus::Message;
use crate::event::EventMask;
use crate::pipeline::{InterestHandle, Sink};
use crate::shell::{Outcome, RunSubscription};
use crate::stats::SinkCounts;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Events waiting for the span builder (at least; twice the span queue if that is more):
/// beyond it the sink drops them, counted (`dropped`).
const EVENT_QUEUE: usize = 16_384;
/// Events, hook outcomes and plugin calls (each, at most) the span builder takes in one burst
/// before it flushes, looks at the stop request and the sweep, and lets the exporter (a task of
/// the same thread) send: a few milliseconds of work.
const BURST: usize = 4096;
/// How often idle emitters are looked for.
const SWEEP: Duration = Duration::from_secs(1);
/// Emptied batches kept for the workers to fill again.
const SPARE_BATCHES: usize = 64;

#[derive(Default)]
struct Shared {
    /// Events handed over and not yet read by the span builder (the event queue's bound).
    pending: AtomicUsize,
    sent: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
    events: AtomicU64,
    unmatched_starts: AtomicU64,
    unmatched_ends: AtomicU64,
    hook_spans: AtomicU64,
}

/// The OpenTelemetry sink ([`HooksBuilder::otlp`](crate::HooksBuilder::otlp)). `deliver`
/// only copies a worker's batch of events into a reused buffer and hands it over (one send per
/// batch, never waiting): a slow or dead receiver costs the pipeline nothing.
pub struct OtelSink {
    events: flume::Sender<Batch>,
    /// Emptied batches, given back by the span builder.
    spare: flume::Receiver<Batch>,
    events_cap: usize,
    stop: flume::Sender<Instant>,
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    runs: Option<Arc<RunSubscription>>,
    endpoint: String,
    threads: Mutex<Vec<JoinHandle<()>>>,
    #[cfg(feature = "wasm")]
    plugins: super::plugins::PluginSlot,
}

impl std::fmt::Debug for OtelSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtelSink")
            .field("endpoint", &self.endpoint)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl OtelSink {
    /// Starts the span builder and the exporter. `runs` (the shell backend's run feed) makes
    /// every hook outcome an `execute_hook` span.
    pub fn start(
        opts: OtlpOptions,
        interest: InterestHandle,
        runs: Option<RunSubscription>,
    ) -> std::io::Result<OtelSink> {
        let events_cap = EVENT_QUEUE.max(opts.queue.saturating_mul(2));
        // Unbounded as a channel: bounded by `Shared::pending`, counted in events.
        let (events, events_rx) = flume::unbounded();
        let (stop, stop_rx) = flume::bounded(1);
        let (spare_tx, spare) = flume::bounded(SPARE_BATCHES);
        let shared = Arc::new(Shared::default());
        let queue = Arc::new(Queue::new(opts.queue, opts.batch, opts.timeout));
        let runs = runs.map(Arc::new);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let exporter = Exporter::new(&opts);
        let limits = Limits {
            content: opts.content,
            idle_limit: opts.idle_limit,
            max_open: opts.max_open_per_emitter,
            max_emitters: opts.max_emitters,
            max_extras: opts.max_extras,
            max_value_bytes: opts.max_value_bytes,
            link_hooks: runs.is_some(),
        };
        #[cfg(feature = "wasm")]
        let plugins = super::plugins::PluginSlot::default();
        let spans = SpanTask {
            #[cfg(feature = "wasm")]
            plugins: super::plugins::PluginCalls::new(plugins.clone(), opts.plugin_spans),
            builder: Builder::new(limits),
            events: events_rx,
            spare: spare_tx,
            runs: runs.clone(),
            stop: stop_rx,
            shared: shared.clone(),
            queue: queue.clone(),
            turn: opts.batch.max(1),
        };
        // One thread for both: a span reaches the exporter without waking another thread
        // (docs/performance.md § OpenTelemetry export).
        let q = queue.clone();
        let thread = std::thread::Builder::new()
            .name("prx-otel".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let export = tokio::spawn(exporter.run_all(q));
                    spans.run().await;
                    let _ = export.await;
                });
                // A DNS lookup of the endpoint's host still hanging on the runtime's blocking
                // pool must not hold the join past the shutdown deadline: it is left behind.
                runtime.shutdown_background();
            })?;
        interest.set(EventMask::ALL);
        Ok(OtelSink {
            events,
            spare,
            events_cap,
            stop,
            shared,
            queue,
            runs,
            endpoint: opts.traces_url(),
            threads: Mutex::new(vec![thread]),
            #[cfg(feature = "wasm")]
            plugins,
        })
    }

    /// Plugin calls become `execute_hook {plugin}` spans, children of their events' spans
    /// (aggregated past `OtlpOptions::plugin_spans` per plugin per second; set once, the
    /// plugin backend is built after this sink).
    #[cfg(feature = "wasm")]
    pub fn watch_plugins(&self, plugins: &Arc<crate::wasm::WasmSink>) {
        super::plugins::watch(&self.plugins, plugins);
    }

    /// A snapshot of the exporter's counters (the `otel` section of [`Stats`](crate::Stats)).
    pub fn stats(&self) -> OtelStats {
        let s = &self.shared;
        let c = &self.queue.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // The queue first: a span counted in `spans` after it would show in no bucket.
        let queued = self.queue.queued();
        OtelStats {
            endpoint: self.endpoint.clone(),
            events: get(&s.events),
            runs_missed: self.runs.as_ref().map_or(0, |r| r.dropped()) + self.plugin_calls_missed(),
            exported: get(&c.exported),
            rejected: get(&c.rejected),
            dropped_queue_full: get(&c.dropped_queue_full),
            dropped_retries: get(&c.dropped_retries),
            dropped_shutdown: get(&c.dropped_shutdown),
            spans: get(&c.spans),
            queued,
            capacity: self.queue.capacity(),
            unmatched_starts: get(&s.unmatched_starts),
            unmatched_ends: get(&s.unmatched_ends),
            hook_spans: get(&s.hook_spans),
            requests: get(&c.requests),
            retries: get(&c.retries),
            stalled: self.queue.stalled(),
        }
    }

    fn plugin_calls_missed(&self) -> u64 {
        #[cfg(feature = "wasm")]
        if let Some(p) = self.plugins.get().and_then(|(_, p)| p.upgrade()) {
            return p.calls_missed();
        }
        0
    }

    fn stop_threads(&self, deadline: Instant) {
        let _ = self.stop.try_send(deadline);
        let threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

impl OtelSink {
    /// An empty batch: a spare one if the span builder gave one back.
    fn batch(&self) -> Batch {
        self.spare.try_recv().unwrap_or_default()
    }

    /// One send per worker batch; what the event queue's bound leaves no room for is dropped,
    /// counted (several workers may together pass the bound by a batch each).
    fn hand_over(&self, mut batch: Batch) {
        let s = &self.shared;
        let n = batch.len();
        s.sent.fetch_add(n as u64, Ordering::Relaxed);
        let room = self
            .events_cap
            .saturating_sub(s.pending.load(Ordering::Relaxed));
        let take = n.min(room);
        if take < n {
            batch.truncate(take);
            s.dropped.fetch_add((n - take) as u64, Ordering::Release);
        }
        if take == 0 {
            return;
        }
        s.pending.fetch_add(take, Ordering::Relaxed);
        if self.events.send(batch).is_err() {
            s.pending.fetch_sub(take, Ordering::Relaxed);
            s.dropped.fetch_add(take as u64, Ordering::Release);
        }
    }
}

impl Sink for OtelSink {
    fn name(&self) -> &str {
        STATS_SECTION
    }

    fn deliver(&self, msg: &Message) {
        let mut batch = self.batch();
        batch.push(msg);
        if !batch.is_empty() {
            self.hand_over(batch);
        }
    }

    /// Copies the wanted events into one buffer (no message is kept: the worker reuses them).
    fn deliver_batch(&self, msgs: &[Message], wanted: EventMask) {
        let wanted = || {
            msgs.iter()
                .filter(move |m| m.event().is_some_and(|k| wanted.contains(k)))
        };
        let mut batch = self.batch();
        let (events, bytes) = wanted().fold((0, 0), |(n, b), m| (n + 1, b + Batch::bytes_of(m)));
        batch.reserve(events, bytes);
        wanted().for_each(|m| batch.push(m));
        if !batch.is_empty() {
            self.hand_over(batch);
        }
    }

    /// The export queue more than half full (the events still in the rings and those the
    /// span builder has not read counted as spans to come) while the receiver takes what is
    /// sent: a file replay waits, so that a receiver slower than the replay loses nothing
    /// (ARCHITECTURE.md § OpenTelemetry traces).
    fn lagging(&self, coming: usize) -> bool {
        let unread = self.shared.pending.load(Ordering::Relaxed);
        self.queue.lagging(coming.saturating_add(unread))
    }

    fn counts(&self) -> SinkCounts {
        let s = &self.shared;
        // Settled counts before `sent`: every message they count was counted in `sent` first.
        let delivered = s.delivered.load(Ordering::Acquire);
        let dropped = s.dropped.load(Ordering::Acquire);
        let sent = s.sent.load(Ordering::Acquire);
        SinkCounts {
            sent,
            delivered,
            dropped,
            failed: 0,
            in_flight: sent.saturating_sub(delivered + dropped),
        }
    }

    /// Reads what is queued until `deadline`, ends every open span (unmatched, counted),
    /// then the exporter sends what it holds until `deadline` (ARCHITECTURE.md § Shutdown).
    fn shutdown(&self, deadline: Instant) {
        self.stop_threads(deadline);
    }
}

impl Drop for OtelSink {
    fn drop(&mut self) {
        self.stop_threads(Instant::now());
    }
}

enum Item {
    Events(Batch),
    Run(Arc<Outcome>),
    RunsClosed,
    #[cfg(feature = "wasm")]
    Call(crate::wasm::PluginCall),
    #[cfg(feature = "wasm")]
    CallsClosed,
    Stop(Instant),
    Nothing,
}

/// The span builder: a task beside the exporter's on the `prx-otel` thread.
struct SpanTask {
    #[cfg(feature = "wasm")]
    plugins: super::plugins::PluginCalls,
    builder: Builder,
    events: flume::Receiver<Batch>,
    spare: flume::Sender<Batch>,
    runs: Option<Arc<RunSubscription>>,
    stop: flume::Receiver<Instant>,
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    /// Finished spans after which a burst ends (the export batch size): the exporter gets a
    /// turn for every batch the builder makes, so it keeps up under a flood.
    turn: usize,
}

impl SpanTask {
    async fn run(mut self) {
        let mut runs = self.runs.clone();
        let mut swept = Instant::now();
        loop {
            self.builder.now = Instant::now();
            // Busy: take what is queued without waiting (one wake-up per message costs more
            // than a batch), publish the spans once for the burst, then let the exporter run.
            if self.burst(runs.as_deref()) {
                if let Ok(deadline) = self.stop.try_recv() {
                    self.drain(runs.as_deref(), deadline).await;
                    break;
                }
                self.tick(&mut swept);
                self.flush();
                tokio::task::yield_now().await;
                continue;
            }
            let item = self.next(runs.as_deref(), swept + SWEEP).await;
            self.builder.now = Instant::now();
            match item {
                Item::Events(batch) => self.read_events(batch),
                Item::Run(o) => {
                    // The event's span first: its message was queued here before the shell
                    // sink saw it (the sinks' order), so this drains it.
                    self.drain_events();
                    self.builder.hook(&o);
                }
                #[cfg(feature = "wasm")]
                Item::Call(c) => {
                    // Likewise: the plugin sink comes after this one.
                    self.drain_events();
                    self.plugins.call(&mut self.builder, &c);
                }
                #[cfg(feature = "wasm")]
                Item::CallsClosed => self.plugins.close(),
                Item::RunsClosed => runs = None,
                Item::Stop(deadline) => {
                    self.drain(runs.as_deref(), deadline).await;
                    break;
                }
                Item::Nothing => {}
            }
            self.tick(&mut swept);
            self.flush();
        }
    }

    /// Waits for the next event batch, hook outcome, plugin call or stop request, or until
    /// `sweep` (then `Nothing`).
    async fn next(&self, runs: Option<&RunSubscription>, sweep: Instant) -> Item {
        #[cfg(feature = "wasm")]
        let calls = async {
            match self.plugins.receiver() {
                Some(rx) => rx.recv_async().await.map_or(Item::CallsClosed, Item::Call),
                None => std::future::pending().await,
            }
        };
        #[cfg(not(feature = "wasm"))]
        let calls = std::future::pending::<Item>();
        let outcomes = async {
            match runs {
                Some(r) => r
                    .receiver()
                    .recv_async()
                    .await
                    .map_or(Item::RunsClosed, Item::Run),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            r = self.stop.recv_async() => Item::Stop(r.unwrap_or_else(|_| Instant::now())),
            r = self.events.recv_async() => r.map_or(Item::Nothing, Item::Events),
            item = outcomes => item,
            item = calls => item,
            _ = tokio::time::sleep_until(sweep.into()) => Item::Nothing,
        }
    }

    /// Once a second: idle emitters ended, plugin aggregates whose second is over ended.
    fn tick(&mut self, swept: &mut Instant) {
        if swept.elapsed() >= SWEEP {
            *swept = Instant::now();
            self.builder.sweep(*swept);
            #[cfg(feature = "wasm")]
            self.plugins.poll(&mut self.builder, false);
        }
    }

    /// The event batches queued now, no more (an outcome's or a plugin call's event was
    /// queued before the outcome or call existed); how many events they held.
    fn drain_events(&mut self) -> usize {
        let mut n = 0;
        for _ in 0..self.events.len() {
            let Ok(batch) = self.events.try_recv() else {
                break;
            };
            n += batch.len();
            self.read_events(batch);
        }
        n
    }

    /// Up to [`BURST`] events, outcomes and plugin calls already queued (the events an outcome
    /// or call drains count against its budget), ending early once a batch of spans is made;
    /// whether there were any.
    fn burst(&mut self, runs: Option<&RunSubscription>) -> bool {
        let mut any = false;
        let mut budget = BURST;
        while budget > 0 && self.builder.out.len() < self.turn {
            let Ok(batch) = self.events.try_recv() else {
                break;
            };
            budget = budget.saturating_sub(batch.len().max(1));
            self.read_events(batch);
            any = true;
        }
        if let Some(r) = runs {
            let mut budget = BURST;
            while budget > 0 && self.builder.out.len() < self.turn {
                let Some(o) = r.try_recv() else { break };
                // Its event first (see `run`).
                budget = budget.saturating_sub(1 + self.drain_events());
                self.builder.hook(&o);
                any = true;
            }
        }
        #[cfg(feature = "wasm")]
        {
            let mut budget = BURST;
            while budget > 0 && self.builder.out.len() < self.turn {
                let Some(Ok(c)) = self.plugins.receiver().map(|r| r.try_recv()) else {
                    break;
                };
                budget = budget.saturating_sub(1 + self.drain_events());
                self.plugins.call(&mut self.builder, &c);
                any = true;
            }
        }
        any
    }

    fn read_events(&mut self, mut batch: Batch) {
        for e in batch.iter() {
            self.builder.event(e);
        }
        let n = batch.len();
        self.shared.pending.fetch_sub(n, Ordering::Relaxed);
        self.shared.delivered.fetch_add(n as u64, Ordering::Release);
        batch.clear();
        let _ = self.spare.try_send(batch);
    }

    /// Hands finished spans to the export queue and publishes the builder's counts.
    fn flush(&mut self) {
        self.queue.push(&mut self.builder.out);
        let c = self.builder.counts;
        let s = &self.shared;
        s.events.store(c.events, Ordering::Relaxed);
        s.unmatched_starts
            .store(c.unmatched_starts, Ordering::Relaxed);
        s.unmatched_ends.store(c.unmatched_ends, Ordering::Relaxed);
        s.hook_spans.store(c.hook_spans, Ordering::Relaxed);
    }

    /// Shutdown: what is queued until the deadline (the rest dropped, counted), every open
    /// span ended, then the exporter told to send what it has until the deadline. The exporter
    /// runs between two passes.
    async fn drain(&mut self, runs: Option<&RunSubscription>, deadline: Instant) {
        loop {
            let mut any = false;
            self.builder.now = Instant::now();
            while let Ok(batch) = self.events.try_recv() {
                any = true;
                if Instant::now() >= deadline {
                    let n = batch.len();
                    self.shared.pending.fetch_sub(n, Ordering::Relaxed);
                    self.shared.dropped.fetch_add(n as u64, Ordering::Release);
                } else {
                    self.read_events(batch);
                }
            }
            if let Some(r) = runs {
                while let Some(o) = r.try_recv() {
                    any = true;
                    if Instant::now() < deadline {
                        self.builder.hook(&o);
                    }
                }
            }
            #[cfg(feature = "wasm")]
            while let Some(Ok(c)) = self.plugins.receiver().map(|r| r.try_recv()) {
                any = true;
                if Instant::now() < deadline {
                    self.plugins.call(&mut self.builder, &c);
                }
            }
            if !any {
                break;
            }
            self.flush();
            tokio::task::yield_now().await;
        }
        #[cfg(feature = "wasm")]
        self.plugins.poll(&mut self.builder, true);
        self.builder.close_all();
        self.flush();
        self.queue.stop(deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventKind;
    use crate::message::Meta;
    use std::time::SystemTime;

    fn message(seq: u64) -> Message {
        let meta = Meta {
            kind: Some(EventKind::ToolCall),
            seq,
            timestamp: SystemTime::now(),
            depth: 0,
            relay: 0,
        };
        Message::new(r#"{"tool":"grep","success":true}"#, "a", "s", "", meta)
    }

    /// The sink keeps no message: once `deliver_batch` returns, the worker is the only holder
    /// again and reuses its message (`Message::reuse` needs it unshared) instead of
    /// allocating a new one, however far the span builder lags.
    #[test]
    fn delivered_messages_are_free_for_the_worker_to_reuse_at_once() {
        // A port nothing listens on: the exporter only retries; the builder still reads.
        let opts = OtlpOptions::new("http://127.0.0.1:9").unwrap();
        let sink = OtelSink::start(opts, InterestHandle::detached(), None).unwrap();
        let mut msgs: Vec<Message> = (0..64).map(message).collect();
        sink.deliver_batch(&msgs, EventMask::ALL);
        sink.deliver(&msgs[0]);
        for (i, m) in msgs.iter_mut().enumerate() {
            let meta = Meta {
                kind: Some(EventKind::ToolCall),
                seq: i as u64,
                timestamp: SystemTime::now(),
                depth: 0,
                relay: 0,
            };
            assert!(m.reuse("{}", "a", "s", meta), "message {i} is still held");
        }
        assert_eq!(sink.counts().sent, 65);
        sink.shutdown(Instant::now() + Duration::from_secs(2));
        assert_eq!(sink.counts().delivered, 65);
        assert_eq!(sink.stats().events, 65);
    }
}
