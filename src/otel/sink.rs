//! `OtelSink`: the [`Sink`] behind the ring that turns events and hook outcomes into spans on
//! a thread of its own (`prx-otel-spans`) and hands them to the exporter (`prx-otel-export`).

use super::export::{Exporter, Queue};
use super::options::OtlpOptions;
use super::spans::{Builder, Limits};
use super::{OtelStats, STATS_SECTION};
use crate::bus::Message;
use crate::event::EventMask;
use crate::pipeline::{InterestHandle, Sink};
use crate::shell::{Outcome, RunSubscription};
use crate::stats::SinkCounts;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Events waiting for the span builder (at least; twice the span queue if that is more):
/// beyond it the sink drops them, counted (`dropped`).
const EVENT_QUEUE: usize = 16_384;
/// Events (and outcomes) taken per burst before the stop request and the sweep are looked at.
const BURST: usize = 1024;
/// How often idle emitters are looked for.
const SWEEP: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Shared {
    sent: AtomicU64,
    delivered: AtomicU64,
    dropped: AtomicU64,
    events: AtomicU64,
    unmatched_starts: AtomicU64,
    unmatched_ends: AtomicU64,
    hook_spans: AtomicU64,
}

/// The OpenTelemetry sink ([`HooksBuilder::otlp`](crate::HooksBuilder::otlp)). `deliver`
/// only `try_send`s a message clone: a slow or dead receiver costs the pipeline nothing.
pub struct OtelSink {
    events: flume::Sender<Message>,
    stop: flume::Sender<Instant>,
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    runs: Option<Arc<RunSubscription>>,
    endpoint: String,
    threads: Mutex<Vec<JoinHandle<()>>>,
    #[cfg(feature = "wasm")]
    plugins: super::plugins::PluginSlot,
}

impl OtelSink {
    /// Starts the span builder and the exporter. `runs` (the shell backend's run feed) makes
    /// every hook outcome an `execute_hook` span.
    pub fn start(
        opts: OtlpOptions,
        interest: InterestHandle,
        runs: Option<RunSubscription>,
    ) -> std::io::Result<OtelSink> {
        let (events, events_rx) = flume::bounded(EVENT_QUEUE.max(opts.queue.saturating_mul(2)));
        let (stop, stop_rx) = flume::bounded(1);
        let shared = Arc::new(Shared::default());
        let queue = Arc::new(Queue::new(opts.queue, opts.batch));
        let runs = runs.map(Arc::new);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let exporter = Exporter::new(&opts);
        let q = queue.clone();
        let export = std::thread::Builder::new()
            .name("prx-otel-export".into())
            .spawn(move || runtime.block_on(exporter.run(q)))?;
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
        let worker = SpanThread {
            #[cfg(feature = "wasm")]
            plugins: super::plugins::PluginCalls::new(plugins.clone()),
            builder: Builder::new(limits),
            events: events_rx,
            runs: runs.clone(),
            stop: stop_rx,
            shared: shared.clone(),
            queue: queue.clone(),
        };
        let spans = match std::thread::Builder::new()
            .name("prx-otel-spans".into())
            .spawn(move || worker.run())
        {
            Ok(t) => t,
            Err(e) => {
                queue.stop(Instant::now());
                let _ = export.join();
                return Err(e);
            }
        };
        interest.set(EventMask::ALL);
        Ok(OtelSink {
            events,
            stop,
            shared,
            queue,
            runs,
            endpoint: opts.traces_url(),
            threads: Mutex::new(vec![spans, export]),
            #[cfg(feature = "wasm")]
            plugins,
        })
    }

    /// Plugin calls become `execute_hook {plugin}` spans, one per plugin per second in which
    /// it was called (set once; the plugin backend is built after this sink).
    #[cfg(feature = "wasm")]
    pub fn watch_plugins(&self, plugins: &Arc<crate::wasm::WasmSink>) {
        let _ = self.plugins.set(Arc::downgrade(plugins));
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
            runs_missed: self.runs.as_ref().map_or(0, |r| r.dropped()),
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
        }
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

impl Sink for OtelSink {
    fn name(&self) -> &str {
        STATS_SECTION
    }

    fn deliver(&self, msg: &Message) {
        self.shared.sent.fetch_add(1, Ordering::Relaxed);
        if self.events.try_send(msg.clone()).is_err() {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
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
    Event(Message),
    Run(Arc<Outcome>),
    RunsClosed,
    Stop(Instant),
    Nothing,
}

/// The `prx-otel-spans` thread.
struct SpanThread {
    #[cfg(feature = "wasm")]
    plugins: super::plugins::PluginCalls,
    builder: Builder,
    events: flume::Receiver<Message>,
    runs: Option<Arc<RunSubscription>>,
    stop: flume::Receiver<Instant>,
    shared: Arc<Shared>,
    queue: Arc<Queue>,
}

impl SpanThread {
    fn run(mut self) {
        let mut runs = self.runs.clone();
        let mut swept = Instant::now();
        loop {
            // Busy: take what is queued without a selector (one per wake-up costs more than
            // an event), then publish the spans once for the burst.
            if self.burst(runs.as_deref()) {
                if let Ok(deadline) = self.stop.try_recv() {
                    self.drain(runs.as_deref(), deadline);
                    break;
                }
                if swept.elapsed() >= SWEEP {
                    swept = Instant::now();
                    self.builder.sweep(swept);
                    self.poll_plugins();
                }
                self.flush();
                continue;
            }
            let item = {
                let mut sel = flume::Selector::new()
                    .recv(&self.events, |r| r.map_or(Item::Nothing, Item::Event))
                    .recv(&self.stop, |r| {
                        r.map_or(Item::Stop(Instant::now()), Item::Stop)
                    });
                if let Some(r) = &runs {
                    sel = sel.recv(r.receiver(), |r| r.map_or(Item::RunsClosed, Item::Run));
                }
                sel.wait_timeout(SWEEP).unwrap_or(Item::Nothing)
            };
            match item {
                Item::Event(m) => self.event(&m),
                Item::Run(o) => {
                    // The event's span first: its message was queued here before the shell
                    // sink saw it (the sinks' order), so this drains it.
                    while let Ok(m) = self.events.try_recv() {
                        self.event(&m);
                    }
                    self.builder.hook(&o);
                }
                Item::RunsClosed => runs = None,
                Item::Stop(deadline) => {
                    self.drain(runs.as_deref(), deadline);
                    break;
                }
                Item::Nothing => {}
            }
            if swept.elapsed() >= SWEEP {
                swept = Instant::now();
                self.builder.sweep(swept);
                self.poll_plugins();
            }
            self.flush();
        }
    }

    /// Up to `BURST` events and outcomes already queued; whether there were any.
    fn burst(&mut self, runs: Option<&RunSubscription>) -> bool {
        let mut any = false;
        for _ in 0..BURST {
            let Ok(m) = self.events.try_recv() else { break };
            self.event(&m);
            any = true;
        }
        if let Some(r) = runs {
            for _ in 0..BURST {
                let Some(o) = r.try_recv() else { break };
                // Its event first (see `run`).
                while let Ok(m) = self.events.try_recv() {
                    self.event(&m);
                }
                self.builder.hook(&o);
                any = true;
            }
        }
        any
    }

    fn poll_plugins(&mut self) {
        #[cfg(feature = "wasm")]
        {
            let b = &mut self.builder;
            b.counts.hook_spans += self.plugins.poll(&mut b.ids, &mut b.out);
        }
    }

    fn event(&mut self, m: &Message) {
        self.builder.event(m);
        self.shared.delivered.fetch_add(1, Ordering::Release);
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
    /// span ended, then the exporter told to send what it has until the deadline.
    fn drain(&mut self, runs: Option<&RunSubscription>, deadline: Instant) {
        loop {
            let mut any = false;
            while let Ok(m) = self.events.try_recv() {
                any = true;
                if Instant::now() >= deadline {
                    self.shared.dropped.fetch_add(1, Ordering::Release);
                } else {
                    self.event(&m);
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
            if !any {
                break;
            }
        }
        self.builder.close_all();
        self.poll_plugins();
        self.flush();
        self.queue.stop(deadline);
    }
}
