//! Lifecycle hooks for AI-agent runtimes that never slow the agent down.
//!
//! An agent emits lifecycle events through an [`Emitter`]; prx-hooks delivers them to shell
//! hooks, WASM plugins and in-process subscribers without ever blocking the agent:
//!
//! ```text
//! Emitter::emit(Event)            agent thread: interest check, claim a slot, copy, publish
//!   └─► ring (one per worker)     bounded, preallocated, lock-free; full → Dropped, counted
//!         └─► worker              serialize the payload ONCE → Message (Arc'd bytes + metadata)
//!               ├─► bus           every matching Subscription, bounded queue each
//!               ├─► shell hooks   per-hook bounded queue → the shell runner thread
//!               │                 (spawns, waits on pidfds, SIGKILLs groups on timeout)
//!               └─► WASM plugins  per-plugin bounded queues → executor threads → pooled
//!                                 instances → on-event (fuel, deadline, memory cap)
//!
//! <workspace>/hooks.json ──watcher──► parse + validate ──► ShellSink::set_table (a bad file
//!                                                          keeps the last good table)
//! <workspace>/plugins/*/ ──watcher──► manifest + compile (cached) ──► WasmSink (a bad new
//!                                                          version keeps the old one)
//! HTTP API ──► HooksEditor (validate like the loader, atomic write) ──► apply_hooks_file
//!                                                          (live before the response)
//! ```
//!
//! Module map: [`event`] (the 8 events and their JSON), `ring` (the lock-free ring), `emitter`
//! (the producer side), `pipeline` (workers and the [`Sink`] trait), [`bus`] (topics and
//! subscriptions), [`stats`] (counters), [`config`] (hooks.json: model, validation, watcher),
//! [`shell`] (running hooks), [`wasm`] (plugin manifests; with feature `wasm` the plugin host),
//! [`ndjson`] (the `run` input format), [`ingest`] (the session map and the line ingest every
//! input shares), [`agents`] (other agents' hook payloads as lines), `http` (with feature `http`: the management API over
//! [`config::HooksEditor`], run history and stats). Every guarantee is written down in
//! ARCHITECTURE.md § Data flow.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use prx_hooks::{Event, Hooks};
//! let hooks = Hooks::builder().workspace(".").build()?;
//! let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
//! let em = hooks.emitter("my-agent", "session-42");
//! em.emit(Event::ToolCallStart { tool: "shell", arguments: r#"{"cmd":"ls"}"# });
//! let msg = sub.recv()?;
//! assert_eq!(msg.json(), br#"{"tool":"shell","arguments":{"cmd":"ls"}}"#);
//! hooks.shutdown(std::time::Duration::from_secs(2));
//! # Ok(()) }
//! ```

pub mod agents;
pub mod bus;
pub mod config;
mod emitter;
pub mod event;
#[cfg(feature = "http")]
pub mod http;
pub mod ingest;
mod json;
pub mod nats;
pub mod ndjson;
pub mod otel;
mod pipeline;
mod ring;
// Without `nats` nothing attaches (the sinks' side stays: holds and marks are no-ops).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
mod settle;
pub mod shell;
pub mod stats;
mod sync;
pub mod wasm;

pub use bus::{Bus, BusError, Message, Subscription};
pub use emitter::{Emit, Emitter};
pub use event::{Event, EventKind, EventMask, Extras, ExtrasError};
pub use pipeline::{InterestHandle, SHUTDOWN_SLACK, Sink};
pub use stats::Stats;

use bus::Bus as BusSink;
use emitter::Producers;
use pipeline::{Interest, Pipeline, WorkerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Why [`HooksBuilder::build`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{option} = {value}: {reason}")]
    InvalidOption {
        option: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("workspace {}: {source}", path.display())]
    Workspace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("workspace {} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("could not start a worker thread: {0}")]
    Spawn(std::io::Error),
    #[error("harden: prctl(PR_SET_DUMPABLE, 0): {0}")]
    Harden(std::io::Error),
    /// The NATS bridge could not be configured (a bad URL, an unreadable file, an
    /// unauthenticated remote server for a consumer, subjects that would loop).
    #[cfg(feature = "nats")]
    #[error("NATS: {0}")]
    Nats(nats::ConnectError),
    /// The OpenTelemetry exporter could not start its threads or runtime.
    #[cfg(feature = "otel")]
    #[error("OpenTelemetry exporter: {0}")]
    Otel(std::io::Error),
}

/// Configures and starts [`Hooks`]. Every option has a default (docs/library.md lists them).
#[derive(Clone, Debug)]
pub struct HooksBuilder {
    workspace: Option<PathBuf>,
    ring_capacity: usize,
    workers: usize,
    inline_bytes: usize,
    byte_budget: usize,
    max_event_bytes: usize,
    subscriber_queue: usize,
    max_publish_bytes: usize,
    idle_tick: Duration,
    shutdown_timeout: Duration,
    reload_debounce: Duration,
    shell: shell::ShellLimits,
    harden: bool,
    sessions: ingest::SessionOptions,
    #[cfg(feature = "nats")]
    nats_publish: Option<nats::PublishOptions>,
    #[cfg(feature = "nats")]
    nats_consume: Option<nats::ConsumeOptions>,
    #[cfg(feature = "otel")]
    otlp: Option<otel::OtlpOptions>,
}

impl Default for HooksBuilder {
    fn default() -> Self {
        HooksBuilder {
            workspace: None,
            ring_capacity: 65_536,
            workers: 1,
            inline_bytes: 256,
            byte_budget: 64 << 20,
            max_event_bytes: 4 << 20,
            subscriber_queue: 65_536,
            max_publish_bytes: 1 << 20,
            idle_tick: Duration::from_millis(1),
            shutdown_timeout: Duration::from_secs(2),
            reload_debounce: Duration::from_millis(50),
            shell: shell::ShellLimits::default(),
            harden: false,
            sessions: ingest::SessionOptions::default(),
            #[cfg(feature = "nats")]
            nats_publish: None,
            #[cfg(feature = "nats")]
            nats_consume: None,
            #[cfg(feature = "otel")]
            otlp: None,
        }
    }
}

impl HooksBuilder {
    /// The directory holding `hooks.json` and `plugins/`. Without one there are no shell hooks
    /// and no plugins; the bus works all the same.
    pub fn workspace(mut self, dir: impl AsRef<Path>) -> Self {
        self.workspace = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Ring slots, all workers together (default 65,536; rounded up to a power of two per ring).
    pub fn ring_capacity(mut self, slots: usize) -> Self {
        self.ring_capacity = slots;
        self
    }

    /// Worker threads, each with its own ring (default 1).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Bytes each slot holds inline for an event's strings (agent, session and the event's
    /// fields); larger events use the byte budget. Default 256.
    pub fn inline_bytes(mut self, bytes: usize) -> Self {
        self.inline_bytes = bytes;
        self
    }

    /// Bytes all larger-than-inline events in the rings may hold at once (default 64 MiB).
    pub fn byte_budget(mut self, bytes: usize) -> Self {
        self.byte_budget = bytes;
        self
    }

    /// Events whose strings exceed this are dropped and counted as `oversize` (default 4 MiB).
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        self.max_event_bytes = bytes;
        self
    }

    /// Default queue capacity of a bus subscription (default 65,536 messages).
    pub fn subscriber_queue(mut self, messages: usize) -> Self {
        self.subscriber_queue = messages;
        self
    }

    /// Largest payload [`Bus::publish`] accepts (default 1 MiB). An agent's event published
    /// with [`Bus::publish_from`] (the ingest's topic lines) may be as large as an event
    /// ([`max_event_bytes`](Self::max_event_bytes)).
    pub fn max_publish_bytes(mut self, bytes: usize) -> Self {
        self.max_publish_bytes = bytes;
        self
    }

    /// How long an idle worker parks between polls (default 1 ms): the delivery latency of an
    /// event that arrives while the pipeline is idle. After about 100 empty ticks the worker
    /// parks 10 ms at a time (or this tick, if longer): the first event after a long idle spell
    /// waits at most that, and an idle pipeline wakes 100 times a second.
    pub fn idle_tick(mut self, tick: Duration) -> Self {
        self.idle_tick = tick;
        self
    }

    /// How long `Drop` lets the pipeline drain (default 2 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long the workspace watcher waits for more changes before reloading hooks.json
    /// (default 50 ms; a rename onto hooks.json or a close after writing reloads sooner).
    pub fn reload_debounce(mut self, debounce: Duration) -> Self {
        self.reload_debounce = debounce;
        self
    }

    /// Limits of the shell backend: processes running at once (64), queue per hook (256), run
    /// history per hook (50), optional rlimits or cgroup for hook processes.
    pub fn shell_limits(mut self, limits: shell::ShellLimits) -> Self {
        self.shell = limits;
        self
    }

    /// Makes the whole host process non-dumpable when built ([`shell::supervisor::harden`]):
    /// hooks, which run as the same user, can then no longer read its environment or memory
    /// through `/proc`. Off by default: it also stops debuggers and core dumps of the host.
    /// Only the host can ask for it (never hooks.json, which the HTTP API can write).
    pub fn harden(mut self, on: bool) -> Self {
        self.harden = on;
        self
    }

    /// The session map's bound and idle time ([`Hooks::sessions`]; default 4,096 emitters,
    /// released after 10 s idle, 65,536 released keys' `seq` remembered).
    pub fn sessions(mut self, opts: ingest::SessionOptions) -> Self {
        self.sessions = opts;
        self
    }

    /// Publishes the bus messages matching the options' pattern to NATS ([`nats::Publisher`],
    /// docs/nats.md § NATS). Built with the rest; nothing waits for the server, which may be
    /// unreachable at first (events are buffered).
    #[cfg(feature = "nats")]
    pub fn nats_publish(mut self, opts: nats::PublishOptions) -> Self {
        self.nats_publish = Some(opts);
        self
    }

    /// Feeds events from NATS into this pipeline ([`nats::Consumer`], docs/nats.md § NATS).
    /// Refused with [`nats_publish`](HooksBuilder::nats_publish) when the two subjects
    /// overlap: what is consumed would be published again, and consumed again.
    #[cfg(feature = "nats")]
    pub fn nats_consume(mut self, opts: nats::ConsumeOptions) -> Self {
        self.nats_consume = Some(opts);
        self
    }

    /// Exports the lifecycle as OpenTelemetry GenAI spans, every hook run a child span
    /// ([`otel::OtelSink`], docs/otel.md § OpenTelemetry traces).
    #[cfg(feature = "otel")]
    pub fn otlp(mut self, opts: otel::OtlpOptions) -> Self {
        self.otlp = Some(opts);
        self
    }

    fn check(&self) -> Result<(), BuildError> {
        let bad = |option, value: usize, reason| {
            Err(BuildError::InvalidOption {
                option,
                value: value.to_string(),
                reason,
            })
        };
        if !(1..=64).contains(&self.workers) {
            return bad("workers", self.workers, "must be between 1 and 64");
        }
        if !(2..=1 << 24).contains(&self.ring_capacity) {
            return bad(
                "ring_capacity",
                self.ring_capacity,
                "must be between 2 and 16,777,216 slots",
            );
        }
        if self.inline_bytes > 1 << 16 {
            return bad("inline_bytes", self.inline_bytes, "must be at most 65,536");
        }
        if !(1..=u32::MAX as usize).contains(&self.max_event_bytes) {
            return bad(
                "max_event_bytes",
                self.max_event_bytes,
                "must be between 1 and 4 GiB - 1",
            );
        }
        if self.byte_budget < self.max_event_bytes.min(self.inline_bytes + 1) {
            return bad(
                "byte_budget",
                self.byte_budget,
                "must hold at least one event larger than inline_bytes",
            );
        }
        if self.subscriber_queue == 0 {
            return bad("subscriber_queue", 0, "must be at least 1");
        }
        if self.idle_tick.is_zero() || self.idle_tick > Duration::from_secs(1) {
            return bad(
                "idle_tick (µs)",
                self.idle_tick.as_micros() as usize,
                "must be between 1 µs and 1 s",
            );
        }
        #[cfg(feature = "nats")]
        {
            if let Some(p) = &self.nats_publish {
                p.check().map_err(BuildError::Nats)?;
            }
            if let Some(c) = &self.nats_consume {
                c.check().map_err(BuildError::Nats)?;
            }
            if let (Some(p), Some(c)) = (&self.nats_publish, &self.nats_consume)
                && nats::wire::filters_overlap(&p.subjects(), c.subject_filter())
            {
                return Err(BuildError::Nats(nats::ConnectError::Invalid {
                    what: "--nats with --from-nats",
                    reason: format!(
                        "the subjects published ({}) overlap the subjects consumed ({}): every consumed event would be published again and consumed again; give --nats-prefix (or --nats-pattern) so that they do not",
                        p.subjects(),
                        c.subject_filter()
                    ),
                }));
            }
        }
        if let Some(dir) = &self.workspace {
            let meta = std::fs::metadata(dir).map_err(|source| BuildError::Workspace {
                path: dir.clone(),
                source,
            })?;
            if !meta.is_dir() {
                return Err(BuildError::NotADirectory { path: dir.clone() });
            }
        }
        Ok(())
    }

    /// Validates the options and starts the workers.
    pub fn build(self) -> Result<Hooks, BuildError> {
        self.check()?;
        if self.harden {
            shell::supervisor::harden().map_err(BuildError::Harden)?;
        }
        // Interest parts, one per sink in the sinks' order (the workers pair them by index):
        // 0 the bus, [the OTel exporter], shell hooks, WASM plugins.
        let interest = Interest::new(4);
        #[cfg(feature = "otel")]
        let first_backend = 1 + usize::from(self.otlp.is_some());
        #[cfg(not(feature = "otel"))]
        let first_backend = 1;
        let bus = BusSink::with_limits(
            interest.handle(0),
            self.subscriber_queue,
            self.max_publish_bytes,
            self.max_event_bytes,
        );
        let producers = Arc::new(Producers::new(
            interest,
            self.inline_bytes,
            self.max_event_bytes,
            self.byte_budget,
        ));
        let per_ring = self.ring_capacity.div_ceil(self.workers);
        let mut sinks: Vec<Arc<dyn Sink>> = vec![Arc::new(bus.clone())];
        let shell = self.workspace.as_ref().map(|ws| {
            let handle = producers.interest.handle(first_backend);
            Arc::new(shell::ShellSink::new(
                ws.clone(),
                handle,
                self.shell.clone(),
            ))
        });
        // Before the shell sink: a hook outcome's event is then always queued to the span
        // builder before the outcome exists (ARCHITECTURE.md § OpenTelemetry traces).
        #[cfg(feature = "otel")]
        let otel = match self.otlp {
            Some(opts) => {
                let runs = shell
                    .as_ref()
                    .map(|s| s.subscribe_runs(shell::DEFAULT_RUN_QUEUE * 16));
                let sink = otel::OtelSink::start(opts, producers.interest.handle(1), runs)
                    .map_err(BuildError::Otel)?;
                let sink = Arc::new(sink);
                sinks.push(sink.clone());
                Some(sink)
            }
            None => None,
        };
        if let Some(shell) = &shell {
            sinks.push(shell.clone());
        }
        // The plugins' watch is set before their first load, so an edit made while it runs
        // (compiling, probing start code: seconds) is reloaded rather than missed.
        #[cfg(feature = "wasm")]
        let armed = self
            .workspace
            .as_ref()
            .map(|ws| wasm::PluginWatcher::arm(ws.clone(), config::WatchOptions::default().poll));
        #[cfg(feature = "wasm")]
        let plugins = match &self.workspace {
            Some(ws) => {
                let sink = wasm::WasmSink::new(
                    ws.clone(),
                    bus.clone(),
                    producers.interest.handle(first_backend + 1),
                )
                .map_err(BuildError::Spawn)?;
                for e in sink.errors() {
                    tracing::warn!("plugin: {e}");
                }
                Some(Arc::new(sink))
            }
            None => None,
        };
        #[cfg(feature = "wasm")]
        if let Some(p) = &plugins {
            sinks.push(p.clone());
        }
        #[cfg(all(feature = "otel", feature = "wasm"))]
        if let (Some(o), Some(p)) = (&otel, &plugins) {
            o.watch_plugins(p);
        }
        #[cfg(feature = "wasm")]
        let plugin_watcher = match (armed, &plugins) {
            (Some(armed), Some(p)) => Some(
                armed
                    .start(Arc::downgrade(p), self.reload_debounce)
                    .map_err(BuildError::Spawn)?,
            ),
            _ => None,
        };
        // The watcher loads hooks.json once before `start` returns, so the first table is
        // live before any event can be emitted.
        let config = match (&self.workspace, &shell) {
            (Some(ws), Some(shell)) => {
                let shell = shell.clone();
                let on_reload = Box::new(move |table| shell.set_table(table));
                Some(
                    config::ConfigWatcher::start(ws.clone(), self.reload_debounce, on_reload)
                        .map_err(BuildError::Spawn)?,
                )
            }
            _ => None,
        };
        let pipeline = Pipeline::start(
            self.workers,
            per_ring,
            producers.clone(),
            sinks,
            WorkerConfig {
                idle_tick: self.idle_tick,
            },
        )
        .map_err(BuildError::Spawn)?;
        let sessions =
            ingest::Sessions::new(producers.clone(), pipeline.lanes().to_vec(), self.sessions);
        // The bridge last: the publisher is one more bus subscriber; the consumer feeds the
        // rings like any producer (ARCHITECTURE.md § NATS bridge).
        // Both on: what the consumer feeds in is relayed, keeping its origin and id
        // (ARCHITECTURE.md § NATS bridge, "Relaying").
        #[cfg(feature = "nats")]
        let relays = match (&self.nats_publish, &self.nats_consume) {
            (Some(p), Some(_)) => Some(Arc::new(nats::relay::Relays::new(p.lifecycle_mask()))),
            _ => None,
        };
        #[cfg(feature = "nats")]
        let publisher = match self.nats_publish {
            Some(opts) => Some(
                nats::Publisher::start(&bus, opts, relays.clone())
                    .map_err(|e| stop_started(&pipeline, &bus, e))?,
            ),
            None => None,
        };
        #[cfg(feature = "nats")]
        let consumer = match self.nats_consume {
            Some(opts) => {
                let feed = Feed {
                    producers: producers.clone(),
                    lanes: pipeline.lanes().to_vec(),
                    sinks: pipeline.sinks().to_vec(),
                    bus: bus.clone(),
                    next: AtomicUsize::new(0),
                    max_event_bytes: self.max_event_bytes,
                    publisher_sub: publisher.as_ref().map(nats::Publisher::subscription_id),
                    relays,
                };
                Some(
                    nats::Consumer::start(feed, opts)
                        .map_err(|e| stop_started(&pipeline, &bus, e))?,
                )
            }
            None => None,
        };
        Ok(Hooks {
            #[cfg(feature = "otel")]
            otel,
            #[cfg(feature = "nats")]
            publisher,
            #[cfg(feature = "nats")]
            consumer,
            pipeline,
            bus,
            shell,
            #[cfg(feature = "wasm")]
            plugins,
            #[cfg(feature = "wasm")]
            plugin_watcher: std::sync::Mutex::new(plugin_watcher),
            config: std::sync::Mutex::new(match config {
                Some(watcher) => ConfigState::Live(watcher),
                None => ConfigState::Absent,
            }),
            editor: std::sync::OnceLock::new(),
            producers,
            sessions,
            next_ring: AtomicUsize::new(0),
            workspace: self.workspace,
            shutdown_timeout: self.shutdown_timeout,
        })
    }
}

/// The hook system: owns the rings, the workers, the bus and the sinks.
///
/// `Send + Sync`; share it behind an `Arc`. Dropping it shuts down with the builder's
/// `shutdown_timeout` (default 2 s).
pub struct Hooks {
    #[cfg(feature = "otel")]
    otel: Option<Arc<otel::OtelSink>>,
    #[cfg(feature = "nats")]
    publisher: Option<nats::Publisher>,
    #[cfg(feature = "nats")]
    consumer: Option<nats::Consumer>,
    pipeline: Pipeline,
    bus: Bus,
    shell: Option<Arc<shell::ShellSink>>,
    #[cfg(feature = "wasm")]
    plugins: Option<Arc<wasm::WasmSink>>,
    #[cfg(feature = "wasm")]
    plugin_watcher: std::sync::Mutex<Option<wasm::PluginWatcher>>,
    /// The hooks.json watcher while running; its last stats and table after shutdown.
    config: std::sync::Mutex<ConfigState>,
    /// The one hooks.json editor of this workspace (made on first use).
    editor: std::sync::OnceLock<config::HooksEditor>,
    producers: Arc<Producers>,
    /// One emitter per (agent, session) for every ingest path (ARCHITECTURE.md § Ingest).
    sessions: ingest::Sessions,
    next_ring: AtomicUsize,
    workspace: Option<PathBuf>,
    shutdown_timeout: Duration,
}

impl Hooks {
    pub fn builder() -> HooksBuilder {
        HooksBuilder::default()
    }

    /// An emitter for one agent session. Emitters are spread over the workers' rings round
    /// robin; an emitter and its clones always use the same one (that is what keeps their
    /// events in order).
    pub fn emitter(&self, agent: &str, session: &str) -> Emitter {
        let lanes = self.pipeline.lanes();
        let lane = lanes[self.next_ring.fetch_add(1, Ordering::Relaxed) % lanes.len()].clone();
        Emitter::new(self.producers.clone(), lane, agent, session)
    }

    /// The session map every ingest path shares: one emitter per (agent, session), released
    /// when idle, bounded ([`ingest::Sessions`]).
    pub fn sessions(&self) -> &ingest::Sessions {
        &self.sessions
    }

    /// The largest event accepted (`HooksBuilder::max_event_bytes`).
    pub fn max_event_bytes(&self) -> usize {
        self.producers.max_event_bytes()
    }

    /// The in-process event bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    pub fn workspace(&self) -> Option<&Path> {
        self.workspace.as_deref()
    }

    /// Events in the rings that the workers have not processed yet (cheap: two loads per ring).
    /// A producer that must not lose events, such as a file replay, can pace itself on it.
    pub fn pending(&self) -> usize {
        self.pipeline.rings().map(|r| r.len()).sum()
    }

    /// Events the workers have handed to every sink so far. `stats().processed` counts an
    /// event when a worker takes it from its ring, before the sinks see it; this counts it
    /// once every sink's `deliver` returned. A producer waiting for its events to reach the
    /// hooks (as `prx-hooks run` does at the end of its input) compares this with the events
    /// it queued, then reads the sinks' `in_flight` in a `stats()` taken after it.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build().unwrap();
    /// assert_eq!(hooks.handed_over(), 0);
    /// ```
    pub fn handed_over(&self) -> u64 {
        self.pipeline.handed_over()
    }

    /// Ring slots, all rings together.
    pub fn capacity(&self) -> usize {
        self.pipeline.rings().map(|r| r.capacity()).sum()
    }

    /// A snapshot of every counter.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        // One consistent read: `queued = processed + dropped_shutdown + depth` exactly
        // (`Pipeline::accounting`, ARCHITECTURE.md § Accounting).
        let a = self.pipeline.accounting();
        stats.processed = a.processed;
        stats.dropped_shutdown = a.dropped_shutdown;
        stats.ring.depth = a.depth;
        self.producers.fill_stats(&mut stats, a.queued);
        stats.sink_panics = self.pipeline.sink_panics();
        stats.ring.shards = self.pipeline.lanes().len() as u64;
        stats.ring.capacity = self.pipeline.rings().map(|r| r.capacity() as u64).sum();
        stats.ring.inline_bytes = stats.ring.capacity * self.producers.inline_bytes() as u64;
        stats.sinks = self
            .pipeline
            .sinks()
            .iter()
            .map(|s| stats::SinkStats {
                name: s.name().to_string(),
                counts: s.counts(),
            })
            .collect();
        stats.subscribers = self.bus.subscribers();
        // The backends' sections, in the order the JSON has always had them.
        let config = match &*self.config.lock().unwrap_or_else(|e| e.into_inner()) {
            ConfigState::Live(watcher) => Some(watcher.stats()),
            ConfigState::Stopped(stats, _) => Some(stats.clone()),
            ConfigState::Absent => None,
        };
        stats.set_section(config::CONFIG_SECTION, config);
        stats.set_section(shell::SHELL_SECTION, self.shell.as_ref().map(|s| s.stats()));
        #[cfg(feature = "wasm")]
        let plugins = self.plugins.as_ref().map(|p| p.stats());
        #[cfg(not(feature = "wasm"))]
        let plugins: Option<wasm::PluginsStats> = None;
        stats.set_section(wasm::STATS_SECTION, plugins);
        #[cfg(feature = "nats")]
        let bridge =
            (self.publisher.is_some() || self.consumer.is_some()).then(|| nats::NatsStats {
                publish: self.publisher.as_ref().map(|p| p.stats()),
                consume: self.consumer.as_ref().map(|c| c.stats()),
            });
        #[cfg(not(feature = "nats"))]
        let bridge: Option<nats::NatsStats> = None;
        stats.set_section(nats::STATS_SECTION, bridge);
        #[cfg(feature = "otel")]
        let traces = self.otel.as_ref().map(|o| o.stats());
        #[cfg(not(feature = "otel"))]
        let traces: Option<otel::OtelStats> = None;
        stats.set_section(otel::STATS_SECTION, traces);
        stats.set_section(ingest::STATS_SECTION, Some(self.sessions.stats()));
        stats
    }

    /// The WASM plugin backend (when there is a workspace): loaded plugins, `fire`, `reload`.
    #[cfg(feature = "wasm")]
    pub fn plugins(&self) -> Option<&Arc<wasm::WasmSink>> {
        self.plugins.as_ref()
    }

    /// The shell backend (when there is a workspace): its table, run history, `run_once`.
    pub fn shell(&self) -> Option<&Arc<shell::ShellSink>> {
        self.shell.as_ref()
    }

    /// The hooks.json table in force now (empty without a workspace or a hooks.json).
    pub fn hook_table(&self) -> Arc<config::HookTable> {
        match &*self.config.lock().unwrap_or_else(|e| e.into_inner()) {
            ConfigState::Live(watcher) => watcher.table(),
            ConfigState::Stopped(_, table) => table.clone(),
            ConfigState::Absent => Arc::new(config::empty_table()),
        }
    }

    /// The editor of this workspace's hooks.json (what the HTTP API writes through); `None`
    /// without a workspace. There is one per `Hooks`, so every writer in the process is
    /// serialized by it. After a successful edit call [`Hooks::apply_hooks_file`] to make the
    /// written file live at once.
    pub fn editor(&self) -> Option<&config::HooksEditor> {
        let ws = self.workspace.as_deref()?;
        Some(self.editor.get_or_init(|| config::HooksEditor::new(ws)))
    }

    /// Loads hooks.json now if it changed since the active table was read (the watcher would,
    /// a debounce later): when this returns, the file's table is live. `None` without a
    /// workspace or after shutdown.
    pub fn apply_hooks_file(&self) -> Option<config::Reload> {
        match &*self.config.lock().unwrap_or_else(|e| e.into_inner()) {
            ConfigState::Live(watcher) => Some(watcher.reload_if_changed()),
            _ => None,
        }
    }

    /// Whether [`Hooks::shutdown`] has begun.
    pub fn is_shut_down(&self) -> bool {
        self.pipeline.rings().any(|r| r.is_closed())
            || matches!(
                &*self.config.lock().unwrap_or_else(|e| e.into_inner()),
                ConfigState::Stopped(..)
            )
            || self.bus.is_closed()
    }

    /// Re-reads hooks.json and rescans the plugins now (what `prx-hooks run` does on SIGHUP).
    /// An invalid file is reported and the last good table (or plugin version) stays; `None`
    /// without a workspace or after shutdown.
    pub fn reload(&self) -> Option<config::Reload> {
        #[cfg(feature = "wasm")]
        if let Some(p) = &self.plugins {
            for e in p.reload().errors {
                tracing::warn!("plugin: {e}");
            }
        }
        match &*self.config.lock().unwrap_or_else(|e| e.into_inner()) {
            ConfigState::Live(watcher) => Some(watcher.reload_now()),
            _ => None,
        }
    }

    /// Drains what is queued (for at most `timeout`), stops the workers and the sinks, and
    /// closes the bus (subscriptions can still read what they hold). Idempotent. Events
    /// emitted afterwards are `Skipped`.
    pub fn shutdown(&self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        // Nothing more from NATS: what it still holds is delivered again to the next consumer.
        #[cfg(feature = "nats")]
        if let Some(c) = &self.consumer {
            c.stop(deadline);
        }
        // Stop reloading first: the table in force now is the one the drain runs under.
        #[cfg(feature = "wasm")]
        drop(
            self.plugin_watcher
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        {
            let mut state = self.config.lock().unwrap_or_else(|e| e.into_inner());
            if let ConfigState::Live(watcher) = &*state {
                *state = ConfigState::Stopped(watcher.stats(), watcher.table());
            }
        }
        self.pipeline
            .shutdown(deadline.saturating_duration_since(std::time::Instant::now()));
        self.bus.close();
        // The publisher flushes what the drain gave it, until the same deadline.
        #[cfg(feature = "nats")]
        if let Some(p) = &self.publisher {
            p.shutdown(deadline);
        }
    }
}

/// What the NATS consumer needs of the pipeline: emitters, and whether it has room (the
/// back-pressure `run --events` applies to a file replay).
#[cfg(feature = "nats")]
pub(crate) struct Feed {
    producers: Arc<Producers>,
    lanes: Vec<Arc<emitter::Lane>>,
    sinks: Vec<Arc<dyn Sink>>,
    bus: Bus,
    next: AtomicUsize,
    pub(crate) max_event_bytes: usize,
    /// The bus subscription of this pipeline's own publisher: not counted by `busy` (it has
    /// its own bounded queue and drop counter; a publish server that is down must not stop
    /// intake).
    publisher_sub: Option<u64>,
    /// With a publisher: what the consumer emits is relayed ([`nats::relay`]).
    pub(crate) relays: Option<Arc<nats::relay::Relays>>,
}

#[cfg(feature = "nats")]
impl Feed {
    /// A backend holding this many jobs (queued or running) counts as busy.
    const SINK_BUSY: u64 = 128;

    pub(crate) fn emitter(&self, agent: &str, session: &str) -> Emitter {
        let lane = self.lanes[self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()].clone();
        Emitter::with_relay(
            self.producers.clone(),
            lane,
            agent,
            session,
            // Always: the consumer attaches its tickets and the agents' time by relay id
            // (`settle`); the publisher relays only with `relays`.
            true,
        )
    }

    /// A ring a quarter full, a bus subscriber half full (but this pipeline's NATS
    /// publisher: it drops and counts on its own), or a backend with many jobs.
    pub(crate) fn busy(&self) -> bool {
        self.lanes
            .iter()
            .any(|l| l.ring.len() > l.ring.capacity() / 4)
            || self
                .bus
                .subscribers()
                .iter()
                .any(|s| s.queued > s.capacity / 2 && Some(s.id) != self.publisher_sub)
            || self
                .sinks
                .iter()
                .any(|s| s.counts().in_flight >= Self::SINK_BUSY)
    }

    /// Whether every backend can take `more` events of `kind` now without dropping one for
    /// a full queue (per-message back-pressure, ARCHITECTURE.md § NATS bridge).
    pub(crate) fn room(&self, kind: EventKind, more: usize) -> bool {
        self.sinks.iter().all(|s| s.room(kind, more))
    }

    /// The attachments the workers take ([`settle`]).
    pub(crate) fn attachments(&self) -> &settle::Attachments {
        &self.producers.attachments
    }

    /// Shut down: nothing emitted now would be delivered.
    pub(crate) fn closed(&self) -> bool {
        self.lanes.iter().any(|l| l.ring.is_closed())
    }
}

enum ConfigState {
    Live(config::ConfigWatcher),
    Stopped(config::ConfigStats, Arc<config::HookTable>),
    Absent,
}

/// A bridge that cannot start fails the build after the pipeline has started: its workers
/// and sinks are stopped before the error is returned, so a caller that retries `build` does
/// not leak a pipeline each time.
#[cfg(feature = "nats")]
fn stop_started(pipeline: &Pipeline, bus: &Bus, e: nats::ConnectError) -> BuildError {
    pipeline.shutdown(Duration::ZERO);
    bus.close();
    BuildError::Nats(e)
}

impl Drop for Hooks {
    fn drop(&mut self) {
        self.shutdown(self.shutdown_timeout);
    }
}

/// The candidate closest to `word` by edit distance, if it is close enough to be a likely typo
/// (for "did you mean …?" hints in error messages).
pub(crate) fn suggest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + (ca != *cb) as usize).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    let word = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (distance(&word, c), *c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Internals exposed for the fuzz targets under `fuzz/`. Not part of the API.
#[doc(hidden)]
pub mod __fuzz {
    pub use crate::json::{
        MAX_DEPTH, Refused, Top, append_compact, append_compact_str, append_compact_within,
        check_object, check_value, write_str,
    };
}
