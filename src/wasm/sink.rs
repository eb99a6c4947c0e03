//! [`WasmSink`]: the plugins of a workspace as one pipeline sink, and loading/reloading them.
//!
//! A load scans `<workspace>/plugins/*/plugin.toml`, reads each component once (opened, checked
//! to be a regular file inside its plugin directory through the descriptor actually read), and
//! compares each plugin with the version running by the SHA-256 of the manifest text it parsed
//! and of the component bytes it read. Only what changed is built: compile through the
//! authenticated per-user cache (in parallel, with rayon), find and type-check `on-event`, link
//! (`InstancePre`), instantiate once as a probe under the plugin's own limits. None of that holds
//! the lock `stats()` and shutdown take; loads are serialized by a lock of their own. Then the new
//! set of plugins is swapped in at once (`ArcSwap`; workers read it without locking), the
//! interest mask updated, and every replaced or removed version stopped: its running call is
//! interrupted and its queue dropped (counted `dropped_reload`). A plugin whose new version fails
//! to load keeps its old version running.
//!
//! The engine is created by the first load that finds a plugin, sized for what it found; a
//! later load that needs more pooled instances or a memory reservation of another size builds a
//! new engine and moves every plugin to it (the compile cache makes that a matter of
//! milliseconds, except when the reservation changed, which recompiles).

use super::cache::CompileCache;
use super::calls::CallOutcome;
use super::engine::{Compiled, Sizing, WasmEngine, one_line};
use super::host::{HostState, PluginCtx, linker};
use super::kv::{KvFlusher, KvStore};
use super::log::{Logger, PluginLog};
use super::manifest::{self, Manifest};
use super::plugin::{Breaker, Plugin, PluginShared, find_export};
use crate::bus::{Bus, Message};
use crate::event::{EventKind, EventMask};
use crate::pipeline::{InterestHandle, Sink};
use crate::stats::SinkCounts;
use crate::wasm::{PluginCounts, PluginError, PluginStats, PluginsStats};
use arc_swap::ArcSwap;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wasmtime::component::Linker;

mod fire;
mod load;
mod policies;

pub use fire::FireOutcome;
pub(crate) use load::check;
use load::*;

impl std::fmt::Debug for WasmSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmSink")
            .field("workspace", &self.workspace)
            .field("plugins", &self.live.load().len())
            .finish_non_exhaustive()
    }
}

/// Where kv stores live, under the workspace (compiled components are in the user's cache).
pub const STATE_DIR: &str = ".prx-hooks";

/// The plugin backend.
pub struct WasmSink {
    workspace: PathBuf,
    bus: Bus,
    interest: InterestHandle,
    abort: Arc<AtomicBool>,
    flusher: Arc<KvFlusher>,
    logger: Logger,
    /// The user's compile cache; `None` when it cannot be used (said once at start).
    cache: Option<CompileCache>,
    live: ArcSwap<Vec<Arc<Plugin>>>,
    /// Serializes loads (the watcher, SIGHUP, `reload()`); never held by stats or shutdown.
    loading: Mutex<()>,
    /// Set when the watcher stops or shutdown begins: a load in progress stops waiting (for
    /// another process's kv lock).
    closing: AtomicBool,
    load: Mutex<LoadState>,
    /// Executor threads of every plugin version ever started (joined at shutdown).
    executors: Mutex<Vec<JoinHandle<()>>>,
    /// Finished calls, for the OpenTelemetry exporter.
    calls: Arc<super::calls::CallFeed>,
    /// The WASM policies in force, for the decision lane.
    policies: Arc<crate::policy::PluginPolicies>,
}

#[derive(Default)]
struct LoadState {
    engine: Option<(Arc<WasmEngine>, Arc<Linker<HostState>>)>,
    /// The running version of each plugin and what it was built from.
    versions: BTreeMap<String, (Fingerprint, Arc<Plugin>)>,
    /// The running version of each plugin's policy (`[policy]`) and what it was built from.
    policies: policies::PolicyVersions,
    /// The WASM policies' counters by id: they outlive versions.
    policy_counts: BTreeMap<String, Arc<crate::policy::PluginPolicyCounters>>,
    /// Counters, breakers, logs and kv stores by plugin name: they outlive versions (and
    /// removals).
    counts: BTreeMap<String, Arc<Mutex<PluginCounts>>>,
    breakers: BTreeMap<String, Arc<Mutex<Breaker>>>,
    logs: BTreeMap<String, Arc<PluginLog>>,
    kv: BTreeMap<String, Arc<KvStore>>,
    /// Versions being built by the load in progress (shutdown stops their probes).
    building: Vec<Arc<PluginCtx>>,
    /// Shut down: nothing loads any more.
    closed: bool,
    /// What the current (or, after shutdown, the last) engine's pool holds.
    sizing: Option<Sizing>,
    /// After shutdown: the plugins that were running, for the final stats.
    stopped: Vec<Arc<PluginShared>>,
    errors: Vec<String>,
    warnings: Vec<String>,
    skipped: Vec<String>,
    loads: u64,
    compiled: u64,
    cache_hits: u64,
}

/// What one load did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// Plugins (re)built and started.
    pub started: Vec<String>,
    /// Plugins stopped because their directory went away.
    pub removed: Vec<String>,
    /// Plugins that are not hooks (`name: why`): not ours to run, left alone.
    pub skipped: Vec<String>,
    /// Accepted with a warning (unknown keys PRX ignores, a name that differs from the
    /// directory's, a directory without plugin.toml), one line each.
    pub warnings: Vec<String>,
    /// Every problem, one line each.
    pub errors: Vec<String>,
    /// Every problem, typed: the lines of `errors`, with their file, line, column and key.
    pub problems: Vec<PluginError>,
}

impl LoadReport {
    /// Records a problem (typed, and as its line).
    fn push_error(&mut self, e: PluginError) {
        self.errors.push(e.to_string());
        self.problems.push(e);
    }
}

impl WasmSink {
    /// Creates the sink and loads the workspace's plugins (the first load happens here, so the
    /// plugins are live before any event is emitted). Plugins publish on `bus`; `interest` is
    /// the sink's part of the pipeline's interest mask ([`InterestHandle::detached`] outside a
    /// pipeline). Compiled components are cached in the user's cache when it is usable.
    pub fn new(
        workspace: PathBuf,
        bus: Bus,
        interest: InterestHandle,
    ) -> std::io::Result<WasmSink> {
        let cache = match CompileCache::open_default() {
            Ok(c) => Some(c),
            Err(why) => {
                tracing::info!(
                    "plugins: no compile cache ({why}); components are compiled at every start"
                );
                None
            }
        };
        WasmSink::with_cache(workspace, bus, interest, cache)
    }

    /// [`new`](WasmSink::new) with the compile cache given (`None`: compile every time).
    pub fn with_cache(
        workspace: PathBuf,
        bus: Bus,
        interest: InterestHandle,
        cache: Option<CompileCache>,
    ) -> std::io::Result<WasmSink> {
        let sink = WasmSink {
            workspace,
            bus,
            interest,
            abort: Arc::new(AtomicBool::new(false)),
            flusher: Arc::new(KvFlusher::start()?),
            logger: Logger::start()?,
            cache,
            live: ArcSwap::from_pointee(Vec::new()),
            loading: Mutex::default(),
            closing: AtomicBool::new(false),
            load: Mutex::default(),
            executors: Mutex::default(),
            calls: Arc::default(),
            policies: Arc::default(),
        };
        sink.reload();
        Ok(sink)
    }

    /// A sink outside any pipeline, with a bus of its own: what `prx-hooks fire` uses to run
    /// the plugins once. Call [`Sink::shutdown`] when done (it writes the kv stores).
    pub fn standalone(workspace: PathBuf) -> std::io::Result<WasmSink> {
        let interest = crate::pipeline::Interest::new(2);
        let bus = Bus::new(interest.handle(0), 1024, 1 << 20);
        WasmSink::new(workspace, bus, interest.handle(1))
    }

    /// Every finished call for a pipeline event, from now on (one reader; `None` if there is
    /// one already). The OpenTelemetry exporter's plugin spans.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn subscribe_calls(
        &self,
        capacity: usize,
    ) -> Option<flume::Receiver<super::PluginCall>> {
        self.calls.subscribe(capacity)
    }

    /// Call records the reader's full queue dropped.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) fn calls_missed(&self) -> u64 {
        self.calls.missed()
    }

    /// Problems of the last load, one line each.
    pub fn errors(&self) -> Vec<String> {
        self.state().errors.clone()
    }

    fn state(&self) -> MutexGuard<'_, LoadState> {
        self.load.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state_dir(&self, sub: &str) -> PathBuf {
        self.workspace.join(STATE_DIR).join(sub)
    }

    /// Stops the probes of a load in progress (they end as interrupted). Used when the watcher
    /// stops at shutdown, so that joining it does not wait for a guest's start code.
    pub(crate) fn cancel_loads(&self) {
        self.closing.store(true, Ordering::Relaxed);
        for ctx in &self.state().building {
            ctx.stop.store(true, Ordering::Relaxed);
        }
    }

    /// The loaded plugins, their counters and the last load's problems.
    pub fn stats(&self) -> PluginsStats {
        let st = self.state();
        let now = Instant::now();
        let running = st
            .versions
            .values()
            .map(|(_, p)| (&p.shared, p.queued(), false));
        let stopped = st.stopped.iter().map(|sh| (sh, 0, true));
        let plugins = running
            .chain(stopped)
            .map(|(sh, queued, stopped)| {
                let m = &sh.manifest;
                let until = sh
                    .breaker
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .suspended(now);
                let mut counts = sh.counts().clone();
                counts.log_dropped = sh.ctx.log.dropped();
                PluginStats {
                    name: m.name.clone(),
                    version: m.version.clone(),
                    events: m.patterns.clone(),
                    pool_size: u64::from(m.resources.pool_size.max(1)),
                    state: match (stopped, until) {
                        (true, _) => "stopped",
                        (false, Some(_)) => "suspended",
                        (false, None) => "running",
                    }
                    .into(),
                    suspended_for_ms: until.map(|u| (u - now).as_millis() as u64),
                    queued: queued as u64,
                    kv_bytes: sh.ctx.kv.bytes(),
                    counts,
                }
            })
            .collect();
        let sizing = st.sizing;
        PluginsStats {
            plugins,
            errors: st.errors.clone(),
            reloads: st.loads.saturating_sub(1),
            compiled: st.compiled,
            cache_hits: st.cache_hits,
            pool_instances: sizing.map_or(0, |s| u64::from(s.instances)),
            pool_max_memory_mb: sizing.map_or(0, |s| s.max_memory >> 20),
            address_space_per_instance_mb: sizing.map_or(0, |s| {
                super::engine::address_space_per_instance(s.max_memory) >> 20
            }),
            cache: self.cache.is_some(),
            warnings: st.warnings.clone(),
            skipped: st.skipped.clone(),
        }
    }
}

impl Sink for WasmSink {
    fn name(&self) -> &str {
        "wasm"
    }

    fn deliver(&self, msg: &Message) {
        self.deliver_batch(std::slice::from_ref(msg), EventMask::ALL);
    }

    /// Loads the plugin set once per batch; each plugin takes the events it declared.
    fn deliver_batch(&self, msgs: &[Message], wanted: EventMask) {
        let live = self.live.load();
        for msg in msgs {
            let Some(kind) = msg.event() else { continue };
            if !wanted.contains(kind) {
                continue;
            }
            for p in live.iter() {
                if p.shared.manifest.events.contains(kind) {
                    p.offer_counted(msg);
                }
            }
        }
    }

    /// Every plugin that takes `kind` has room for `more` calls in each of its queues.
    /// The plugin shard with the least room.
    fn headroom(&self) -> Option<(usize, usize)> {
        self.live.load().iter().filter_map(|p| p.headroom()).min()
    }

    fn room(&self, kind: EventKind, more: usize) -> bool {
        self.live
            .load()
            .iter()
            .filter(|p| p.shared.manifest.events.contains(kind))
            .all(|p| p.room(more))
    }

    fn counts(&self) -> SinkCounts {
        let st = self.state();
        let mut total = SinkCounts::default();
        for c in st.counts.values() {
            let c = c.lock().unwrap_or_else(|e| e.into_inner());
            total.sent += c.sent;
            total.delivered += c.delivered;
            total.dropped += c.dropped;
            total.failed += c.failed;
            total.in_flight += c.in_flight;
        }
        total
    }

    /// Closes every queue, lets the executors finish until `deadline`, then interrupts what
    /// still runs (the epoch callback, or the call's driver, sees the abort flag within a tick)
    /// and counts what is left as dropped; flushes every kv store; stops the engine's threads.
    /// Returns by `deadline` plus a few ticks whatever the guests do.
    fn shutdown(&self, deadline: Instant) {
        self.closing.store(true, Ordering::Relaxed);
        {
            let mut st = self.state();
            st.closed = true;
            for ctx in &st.building {
                ctx.stop.store(true, Ordering::Relaxed);
            }
            // Keep what the stats need; dropping the plugins closes their queues.
            st.stopped = st
                .versions
                .values()
                .map(|(_, p)| p.shared.clone())
                .collect();
            st.versions.clear();
            self.live.store(Arc::new(Vec::new()));
            // No decision asks a policy any more; a call in progress ends at its deadline, or
            // at once when the engine stops below.
            self.policies.store(Vec::new());
            self.interest.set(EventMask::NONE);
        }
        let threads =
            std::mem::take(&mut *self.executors.lock().unwrap_or_else(|e| e.into_inner()));
        while Instant::now() < deadline && threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.abort.store(true, Ordering::Relaxed);
        // Every call now ends within a tick (running guest code) or a driver slice (waiting in
        // a host call); the slack covers a loaded machine.
        let hard = deadline + crate::pipeline::SHUTDOWN_SLACK / 2;
        while Instant::now() < hard && threads.iter().any(|t| !t.is_finished()) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut late = Vec::new();
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            } else {
                late.push(t);
            }
        }
        if !late.is_empty() {
            tracing::warn!(
                "plugins: {} executor(s) did not stop by the shutdown deadline (a loaded machine?); dropping the backend waits for them briefly",
                late.len()
            );
            // Joined when the sink is dropped (see `Drop`), not left to outlive it.
            *self.executors.lock().unwrap_or_else(|e| e.into_inner()) = late;
        }
        self.flusher.stop();
        self.logger.shutdown(hard);
        let engine = self.state().engine.take();
        if let Some((engine, _)) = engine {
            engine.stop();
        }
        for sh in &self.state().stopped {
            sh.engine_stop();
        }
        let policies = std::mem::take(&mut self.state().policies);
        for (_, p) in policies.values() {
            p.engine().stop();
        }
    }
}

/// How long dropping the backend waits for executors still running after `shutdown` returned.
const LATE_JOIN: Duration = Duration::from_secs(2);

impl Drop for WasmSink {
    /// Executors a loaded machine kept running past the shutdown deadline have had every call
    /// aborted, so they end within an epoch tick once scheduled: wait for them (up to
    /// `LATE_JOIN`, 2 s) so that no thread — nor the engine, timer runtime and descriptors it holds
    /// — outlives the backend.
    fn drop(&mut self) {
        self.abort.store(true, Ordering::Relaxed);
        let late = std::mem::take(self.executors.get_mut().unwrap_or_else(|e| e.into_inner()));
        let until = Instant::now() + LATE_JOIN;
        for t in late {
            while !t.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::error!(
                    "a plugin executor is still running {LATE_JOIN:?} after its backend was dropped; detaching it"
                );
            }
        }
    }
}
