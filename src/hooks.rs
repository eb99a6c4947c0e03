//! [`Hooks`]: the running hook system — its emitters, bus, sinks, stats and shutdown
//! (ARCHITECTURE.md § Data flow).

use super::*;

mod decide;

/// The hook system: owns the rings, the workers, the bus and the sinks.
///
/// `Send + Sync`; share it behind an `Arc`. Dropping it shuts down with the builder's
/// `shutdown_timeout` (default 2 s).
pub struct Hooks {
    #[cfg(feature = "otel")]
    pub(super) otel: Option<Arc<otel::OtelSink>>,
    #[cfg(feature = "nats")]
    pub(super) publisher: Option<nats::Publisher>,
    #[cfg(feature = "nats")]
    pub(super) consumer: Option<nats::Consumer>,
    pub(super) pipeline: Pipeline,
    pub(super) bus: Bus,
    pub(super) shell: Option<Arc<shell::ShellSink>>,
    #[cfg(feature = "wasm")]
    pub(super) plugins: Option<Arc<wasm::WasmSink>>,
    #[cfg(feature = "wasm")]
    pub(super) plugin_watcher: std::sync::Mutex<Option<wasm::PluginWatcher>>,
    /// The hooks.json watcher while running; its last stats and table after shutdown.
    pub(super) config: std::sync::Mutex<ConfigState>,
    /// The one hooks.json editor of this workspace (made on first use).
    pub(super) editor: std::sync::OnceLock<config::HooksEditor>,
    /// policies.json and the decisions' counts (the decision lane, `hooks/decide.rs`).
    pub(super) policies: policy::Decider,
    pub(super) producers: Arc<Producers>,
    /// One emitter per (agent, session) for every ingest path (ARCHITECTURE.md § Ingest).
    pub(super) sessions: ingest::Sessions,
    /// The ids of ingested events that ran (ARCHITECTURE.md § Ingest, "Event ids").
    pub(super) seen: Arc<ingest::Seen>,
    pub(super) next_ring: AtomicUsize,
    pub(super) workspace: Option<PathBuf>,
    pub(super) shutdown_timeout: Duration,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("workspace", &self.workspace)
            .field("workers", &self.pipeline.lanes().len())
            .field("bus", &self.bus)
            .finish_non_exhaustive()
    }
}

impl Hooks {
    /// A builder with every option at its default (docs/library.md lists them).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Event, Hooks};
    /// use std::time::Duration;
    /// // Without a workspace: no hooks.json, no plugins; the bus alone.
    /// let hooks = Hooks::builder().workers(2).build()?;
    /// let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
    /// hooks.emitter("my-agent", "s1").emit(Event::TurnComplete);
    /// assert_eq!(sub.recv()?.topic(), "prx.lifecycle.turn_complete");
    /// hooks.shutdown(Duration::from_secs(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> HooksBuilder {
        HooksBuilder::default()
    }

    /// An emitter for one agent session. Emitters are spread over the workers' rings round
    /// robin; an emitter and its clones always use the same one (that is what keeps their
    /// events in order).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let em = hooks.emitter("my-agent", "s1");
    /// assert_eq!(em.session(), "s1");
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
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

    /// The largest event accepted ([`HooksBuilder::max_event_bytes`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().max_event_bytes(1 << 20).build()?;
    /// assert_eq!(hooks.max_event_bytes(), 1 << 20);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn max_event_bytes(&self) -> usize {
        self.producers.max_event_bytes()
    }

    /// The in-process event bus.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("myapp.*")?;
    /// hooks.bus().publish("myapp.started", "{}")?;
    /// assert_eq!(sub.recv()?.topic(), "myapp.started");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The workspace given to [`HooksBuilder::workspace`], if any.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// assert!(hooks.workspace().is_none());
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn workspace(&self) -> Option<&Path> {
        self.workspace.as_deref()
    }

    /// Events in the rings that the workers have not processed yet (cheap: two loads per ring).
    /// A producer that must not lose events, such as a file replay, can pace itself on it.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// assert_eq!(hooks.pending(), 0);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().ring_capacity(4096).build()?;
    /// assert!(hooks.capacity() >= 4096);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn capacity(&self) -> usize {
        self.pipeline.rings().map(|r| r.capacity()).sum()
    }

    /// A snapshot of every counter.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Event, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// hooks.emitter("my-agent", "s1").emit(Event::TurnComplete); // nobody listens
    /// assert_eq!(hooks.stats().skipped, 1);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
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
        stats.set_section(policy::STATS_SECTION, Some(self.policies.stats()));
        stats.set_section(ingest::STATS_SECTION, Some(self.sessions.stats()));
        stats.set_section(ingest::EVENT_IDS_SECTION, Some(self.seen.stats()));
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
    ///
    /// # Examples
    ///
    /// ```
    /// use serde_json::json;
    /// let ws = std::env::temp_dir().join(format!("prx-hooks-doc-editor-{}", std::process::id()));
    /// std::fs::create_dir_all(&ws)?;
    /// let hooks = prx_hooks::Hooks::builder().workspace(&ws).build()?;
    /// let editor = hooks.editor().expect("a workspace");
    /// editor.create(json!({"event": "turn_complete", "command": "true"}))?;
    /// hooks.apply_hooks_file(); // live now, not a debounce later
    /// assert_eq!(hooks.hook_table().actions.len(), 1);
    /// hooks.shutdown(std::time::Duration::from_secs(2));
    /// # std::fs::remove_dir_all(&ws)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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

    /// Re-reads hooks.json and policies.json and rescans the plugins now (what `prx-hooks run`
    /// does on SIGHUP).
    /// An invalid file is reported and the last good table (or plugin version) stays; `None`
    /// without a workspace or after shutdown.
    pub fn reload(&self) -> Option<config::Reload> {
        #[cfg(feature = "wasm")]
        if let Some(p) = &self.plugins {
            for e in p.reload().errors {
                tracing::warn!("plugin: {e}");
            }
        }
        if let Some(config::Reload::Rejected) = self.policies.reload(true) {
            tracing::warn!("policies.json is invalid: the policies in force stay");
        }
        match &*self.config.lock().unwrap_or_else(|e| e.into_inner()) {
            ConfigState::Live(watcher) => Some(watcher.reload_now()),
            _ => None,
        }
    }

    /// Drains what is queued (for at most `timeout`), stops the workers and the sinks, and
    /// closes the bus (subscriptions can still read what they hold). Idempotent. Events
    /// emitted afterwards are `Skipped`.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Emit, Event, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// let em = hooks.emitter("my-agent", "s1");
    /// hooks.shutdown(std::time::Duration::from_secs(2));
    /// assert!(hooks.is_shut_down());
    /// assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
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
        self.policies.stop();
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
    pub(super) producers: Arc<Producers>,
    pub(super) lanes: Vec<Arc<emitter::Lane>>,
    pub(super) sinks: Vec<Arc<dyn Sink>>,
    pub(super) bus: Bus,
    pub(super) next: AtomicUsize,
    pub(crate) max_event_bytes: usize,
    /// The bus subscription of this pipeline's own publisher: not counted by `busy` (it has
    /// its own bounded queue and drop counter; a publish server that is down must not stop
    /// intake).
    pub(super) publisher_sub: Option<u64>,
    /// With a publisher: what the consumer emits is relayed ([`nats::relay`]).
    pub(crate) relays: Option<Arc<nats::relay::Relays>>,
}

#[cfg(feature = "nats")]
impl Feed {
    /// A backend holding this many jobs (queued or running) counts as busy.
    pub(super) const SINK_BUSY: u64 = 128;

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

    /// How many events may be handed over now, at most `most`: none while [`busy`](Self::busy),
    /// and no more than the tightest bounded backend queue can take with what the rings hold
    /// (the events on their way to it count, not only its jobs), as a file replay paces itself.
    pub(crate) fn allowance(&self, most: usize) -> usize {
        if self.busy() {
            return 0;
        }
        let coming = self.lanes.iter().map(|l| l.ring.len()).sum();
        crate::ingest::pace::headroom_allowance(&self.sinks, coming, most)
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

pub(super) enum ConfigState {
    Live(config::ConfigWatcher),
    Stopped(config::ConfigStats, Arc<config::HookTable>),
    Absent,
}

impl Drop for Hooks {
    fn drop(&mut self) {
        self.shutdown(self.shutdown_timeout);
    }
}
