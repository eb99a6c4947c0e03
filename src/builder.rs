//! [`HooksBuilder`]: every option of the hook system with its default, and [`BuildError`], why
//! [`HooksBuilder::build`] failed (docs/library.md lists the options).

use super::*;
use crate::hooks::ConfigState;

/// Why [`HooksBuilder::build`] failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// An option is out of its range.
    #[error("{option} = {value}: {reason}")]
    InvalidOption {
        /// The option, named as its [`HooksBuilder`] method.
        option: &'static str,
        /// The value given.
        value: String,
        /// The range it must be in.
        reason: &'static str,
    },
    /// The workspace cannot be read.
    #[error("workspace {}: {source}", path.display())]
    Workspace {
        /// The workspace given to [`HooksBuilder::workspace`].
        path: PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// The workspace is not a directory.
    #[error("workspace {} is not a directory", path.display())]
    NotADirectory {
        /// The workspace given to [`HooksBuilder::workspace`].
        path: PathBuf,
    },
    /// A worker, watcher or runner thread could not be started.
    #[error("could not start a worker thread: {0}")]
    Spawn(std::io::Error),
    /// [`HooksBuilder::harden`] could not make the process undumpable.
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
    pub(super) workspace: Option<PathBuf>,
    pub(super) ring_capacity: usize,
    pub(super) workers: usize,
    pub(super) inline_bytes: usize,
    pub(super) byte_budget: usize,
    pub(super) max_event_bytes: usize,
    pub(super) subscriber_queue: usize,
    pub(super) max_publish_bytes: usize,
    pub(super) idle_tick: Duration,
    pub(super) shutdown_timeout: Duration,
    pub(super) reload_debounce: Duration,
    pub(super) shell: shell::ShellLimits,
    pub(super) harden: bool,
    pub(super) sessions: ingest::SessionOptions,
    #[cfg(feature = "nats")]
    pub(super) nats_publish: Option<nats::PublishOptions>,
    #[cfg(feature = "nats")]
    pub(super) nats_consume: Option<nats::ConsumeOptions>,
    #[cfg(feature = "otel")]
    pub(super) otlp: Option<otel::OtlpOptions>,
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
    ///
    /// # Examples
    ///
    /// ```
    /// let ws = std::env::temp_dir().join(format!("prx-hooks-doc-ws-{}", std::process::id()));
    /// std::fs::create_dir_all(&ws)?;
    /// let hooks = prx_hooks::Hooks::builder().workspace(&ws).build()?;
    /// assert_eq!(hooks.workspace(), Some(ws.as_path()));
    /// assert!(hooks.hook_table().actions.is_empty()); // no hooks.json yet
    /// hooks.shutdown(std::time::Duration::from_secs(2));
    /// # std::fs::remove_dir_all(&ws)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().workers(2).ring_capacity(1024).build()?;
    /// assert_eq!(hooks.stats().ring.shards, 2);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
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

    pub(super) fn check(&self) -> Result<(), BuildError> {
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
                    what: "HooksBuilder::nats_publish with HooksBuilder::nats_consume",
                    reason: format!(
                        "the subjects published ({}) overlap the subjects consumed ({}): every consumed event would be published again and consumed again; give PublishOptions::prefix or PublishOptions::pattern (`run --nats-prefix`, `--nats-pattern`) so that they do not",
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
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{BuildError, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// assert!(!hooks.is_shut_down());
    /// let refused = Hooks::builder().workers(0).build();
    /// assert!(matches!(refused, Err(BuildError::InvalidOption { option: "workers", .. })));
    /// # Ok::<(), BuildError>(())
    /// ```
    pub fn build(mut self) -> Result<Hooks, BuildError> {
        self.check()?;
        if self.harden {
            shell::supervisor::harden().map_err(BuildError::Harden)?;
        }
        let built = self.sinks()?;
        let Built {
            sinks,
            bus,
            producers,
            shell,
            #[cfg(feature = "otel")]
            otel,
            #[cfg(feature = "wasm")]
            plugins,
            #[cfg(feature = "wasm")]
            plugin_watcher,
        } = built;
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
        // The WASM policies the plugins' loads put in force (their first load is done).
        #[cfg(feature = "wasm")]
        let wasm_policies = plugins.as_ref().map(|p| p.policies());
        #[cfg(not(feature = "wasm"))]
        let wasm_policies = None;
        // policies.json, loaded before any decision can be asked for.
        let policies = match &self.workspace {
            Some(ws) => policy::Decider::start(
                ws.clone(),
                config::WatchOptions {
                    debounce: self.reload_debounce,
                    ..config::WatchOptions::default()
                },
                wasm_policies,
                self.shell.guard_rlimits(),
            )
            .map_err(BuildError::Spawn)?,
            None => policy::Decider::absent(),
        };
        let per_ring = self.ring_capacity.div_ceil(self.workers);
        let pipeline = Pipeline::start(
            self.workers,
            per_ring,
            producers.clone(),
            sinks.into_sinks(),
            WorkerConfig {
                idle_tick: self.idle_tick,
            },
        )
        .map_err(BuildError::Spawn)?;
        let sessions = ingest::Sessions::new(
            producers.clone(),
            pipeline.lanes().to_vec(),
            self.sessions.clone(),
        );
        #[cfg(feature = "nats")]
        let (publisher, consumer) = self.bridge(&bus, &producers, &pipeline)?;
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
            policies,
            producers,
            sessions,
            seen: std::sync::Arc::new(match &self.workspace {
                Some(ws) => ingest::Seen::in_workspace(ws),
                None => ingest::Seen::in_memory(),
            }),
            next_ring: AtomicUsize::new(0),
            workspace: self.workspace,
            shutdown_timeout: self.shutdown_timeout,
        })
    }

    /// The sinks, each in its interest slot: the bus, the OpenTelemetry exporter, shell hooks,
    /// WASM plugins (and their watcher); the producers that feed them.
    fn sinks(&mut self) -> Result<Built, BuildError> {
        // One interest part per sink: the bus, the OTel exporter, shell hooks, WASM plugins.
        let mut sinks = SinkSlots::new(Interest::new(4));
        let (bus_slot, bus_interest) = sinks.reserve();
        let bus = BusSink::with_limits(
            bus_interest,
            self.subscriber_queue,
            self.max_publish_bytes,
            self.max_event_bytes,
        );
        sinks.fill(bus_slot, Arc::new(bus.clone()));
        let producers = Arc::new(Producers::new(
            sinks.interest.clone(),
            self.inline_bytes,
            self.max_event_bytes,
            self.byte_budget,
        ));
        // The exporter's slot comes before the shell sink's, though the shell sink is made
        // first (the exporter subscribes to its runs): a hook outcome's event is then always
        // queued to the span builder before the outcome exists (ARCHITECTURE.md §
        // OpenTelemetry traces).
        #[cfg(feature = "otel")]
        let otel_slot = self.otlp.is_some().then(|| sinks.reserve());
        let shell = self.workspace.as_ref().map(|ws| {
            let (slot, handle) = sinks.reserve();
            let sink = Arc::new(shell::ShellSink::new(
                ws.clone(),
                handle,
                self.shell.clone(),
            ));
            (slot, sink)
        });
        #[cfg(feature = "otel")]
        let otel = match (self.otlp.take(), otel_slot) {
            (Some(opts), Some((slot, handle))) => {
                let runs = shell
                    .as_ref()
                    .map(|(_, s)| s.subscribe_runs(shell::DEFAULT_RUN_QUEUE * 16));
                let sink =
                    Arc::new(otel::OtelSink::start(opts, handle, runs).map_err(BuildError::Otel)?);
                sinks.fill(slot, sink.clone());
                Some(sink)
            }
            _ => None,
        };
        let shell = shell.map(|(slot, sink)| {
            sinks.fill(slot, sink.clone());
            sink
        });
        #[cfg(feature = "wasm")]
        let (plugins, armed) = self.plugins(&mut sinks, &bus)?;
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
        Ok(Built {
            sinks,
            bus,
            producers,
            shell,
            #[cfg(feature = "otel")]
            otel,
            #[cfg(feature = "wasm")]
            plugins,
            #[cfg(feature = "wasm")]
            plugin_watcher,
        })
    }

    /// The plugins' sink (its first load done) and the watch of their directory, set before
    /// that load and started by the caller.
    #[cfg(feature = "wasm")]
    #[allow(clippy::type_complexity)]
    fn plugins(
        &self,
        sinks: &mut SinkSlots,
        bus: &Bus,
    ) -> Result<(Option<Arc<wasm::WasmSink>>, Option<wasm::ArmedWatcher>), BuildError> {
        // The plugins' watch is set before their first load, so an edit made while it runs
        // (compiling, probing start code: seconds) is reloaded rather than missed.
        let armed = self
            .workspace
            .as_ref()
            .map(|ws| wasm::PluginWatcher::arm(ws.clone(), config::WatchOptions::default().poll));
        let plugins = match &self.workspace {
            Some(ws) => {
                let (slot, handle) = sinks.reserve();
                let sink = wasm::WasmSink::new(ws.clone(), bus.clone(), handle)
                    .map_err(BuildError::Spawn)?;
                for e in sink.errors() {
                    tracing::warn!("plugin: {e}");
                }
                let sink = Arc::new(sink);
                sinks.fill(slot, sink.clone());
                Some(sink)
            }
            None => None,
        };
        Ok((plugins, armed))
    }

    /// The NATS bridge, started last: the publisher is one more bus subscriber; the consumer
    /// feeds the rings like any producer (ARCHITECTURE.md § NATS bridge).
    #[cfg(feature = "nats")]
    fn bridge(
        &mut self,
        bus: &Bus,
        producers: &Arc<Producers>,
        pipeline: &Pipeline,
    ) -> Result<(Option<nats::Publisher>, Option<nats::Consumer>), BuildError> {
        // Both on: what the consumer feeds in is relayed, keeping its origin and id
        // (ARCHITECTURE.md § NATS bridge, "Relaying").
        let relays = match (&self.nats_publish, &self.nats_consume) {
            (Some(p), Some(_)) => Some(Arc::new(nats::relay::Relays::new(p.lifecycle_mask()))),
            _ => None,
        };
        let publisher = match self.nats_publish.take() {
            Some(opts) => Some(
                nats::Publisher::start(bus, opts, relays.clone())
                    .map_err(|e| stop_started(pipeline, bus, e))?,
            ),
            None => None,
        };
        let consumer = match self.nats_consume.take() {
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
                        .map_err(|e| stop_started(pipeline, bus, e))?,
                )
            }
            None => None,
        };
        Ok((publisher, consumer))
    }
}

/// What [`HooksBuilder::sinks`] made.
struct Built {
    sinks: SinkSlots,
    bus: Bus,
    producers: Arc<Producers>,
    shell: Option<Arc<shell::ShellSink>>,
    #[cfg(feature = "otel")]
    otel: Option<Arc<otel::OtelSink>>,
    #[cfg(feature = "wasm")]
    plugins: Option<Arc<wasm::WasmSink>>,
    #[cfg(feature = "wasm")]
    plugin_watcher: Option<wasm::PluginWatcher>,
}

/// A bridge that cannot start fails the build after the pipeline has started: its workers
/// and sinks are stopped before the error is returned, so a caller that retries `build` does
/// not leak a pipeline each time.
#[cfg(feature = "nats")]
pub(super) fn stop_started(pipeline: &Pipeline, bus: &Bus, e: nats::ConnectError) -> BuildError {
    pipeline.shutdown(Duration::ZERO);
    bus.close();
    BuildError::Nats(e)
}

/// The sinks in delivery order, each paired with its interest part by construction: the
/// workers hand sink `i` the events interest part `i` asked for, and both come from one
/// [`SinkSlots::reserve`].
struct SinkSlots {
    interest: Arc<Interest>,
    /// Reserved slots in order; every one is filled before [`SinkSlots::into_sinks`].
    sinks: Vec<Option<Arc<dyn Sink>>>,
}

/// A reserved place in the delivery order (its interest part has the same index).
#[must_use]
struct Slot(usize);

impl SinkSlots {
    fn new(interest: Arc<Interest>) -> SinkSlots {
        SinkSlots {
            interest,
            sinks: Vec::new(),
        }
    }

    /// The next place in the delivery order and the interest handle of the same index.
    fn reserve(&mut self) -> (Slot, InterestHandle) {
        let i = self.sinks.len();
        self.sinks.push(None);
        (Slot(i), self.interest.handle(i))
    }

    fn fill(&mut self, slot: Slot, sink: Arc<dyn Sink>) {
        self.sinks[slot.0] = Some(sink);
    }

    /// The sinks in slot order. A reserved slot left empty would shift every later sink onto
    /// another's interest part, so it is a bug in `build`, caught here.
    fn into_sinks(self) -> Vec<Arc<dyn Sink>> {
        let reserved = self.sinks.len();
        let sinks: Vec<_> = self.sinks.into_iter().flatten().collect();
        assert_eq!(sinks.len(), reserved, "a reserved sink slot was left empty");
        sinks
    }
}
