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
use crate::wasm::{PluginCounts, PluginStats, PluginsStats};
use arc_swap::ArcSwap;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wasmtime::component::Linker;

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
}

#[derive(Default)]
struct LoadState {
    engine: Option<(Arc<WasmEngine>, Arc<Linker<HostState>>)>,
    /// The running version of each plugin and what it was built from.
    versions: BTreeMap<String, (Fingerprint, Arc<Plugin>)>,
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

/// What a plugin version was built from: SHA-256 of the manifest text parsed and of the
/// component bytes read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    manifest: [u8; 32],
    wasm: [u8; 32],
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).into()
}

/// Reads the component of `m` once, refusing anything that is not a regular file inside the
/// plugin's directory — checked on the descriptor read (its path in /proc/self/fd), so a file
/// swapped for a symbolic link after the manifest was checked is caught.
fn read_component(m: &Manifest) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let label = m.wasm.display();
    let dir = std::fs::canonicalize(&m.dir)
        .map_err(|e| format!("{label}: cannot resolve the plugin directory: {e}"))?;
    // Not waiting for a writer: a FIFO swapped in after the scan must not block the open (the
    // load holds the loads' lock, and shutdown joins the watcher that runs it). Links are
    // followed (the check below is on where the descriptor leads).
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(&m.wasm)
            .map_err(|e| format!("{label}: cannot read: {e}"))?
    };
    let md = file
        .metadata()
        .map_err(|e| format!("{label}: cannot read: {e}"))?;
    if !md.is_file() {
        return Err(format!("{label}: not a regular file"));
    }
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| format!("{label}: cannot resolve the file read: {e}"))?;
    if !real.starts_with(&dir) {
        return Err(format!(
            "{label}: leads outside the plugin directory (to {}); the component must be inside it",
            real.display()
        ));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    file.take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{label}: cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(format!(
            "{label}: larger than {} MiB (the limit)",
            MAX_COMPONENT_BYTES >> 20
        ));
    }
    Ok(bytes)
}

/// Largest component file read.
const MAX_COMPONENT_BYTES: u64 = 256 << 20;

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
}

/// One plugin's answer to [`WasmSink::fire`].
///
/// `Display` is the line `prx-hooks fire` prints: `plugin audit-hook: ok (0.4 ms)`,
/// `plugin x: error: <guest message> (…)`, `plugin x: timed out after 500 ms (…)`,
/// `plugin x: trap: … (…)`.
#[derive(Debug, Clone)]
pub struct FireOutcome {
    pub plugin: String,
    pub event: EventKind,
    /// `None`: no answer in time (its queue stayed full, or the call outlived its deadline by
    /// more than a second).
    pub outcome: Option<CallOutcome>,
    pub duration: Duration,
    pub timeout_ms: u64,
}

impl FireOutcome {
    pub fn is_ok(&self) -> bool {
        self.outcome.as_ref().is_some_and(CallOutcome::is_ok)
    }

    fn words(&self) -> String {
        match &self.outcome {
            Some(o) => o.describe(self.timeout_ms),
            None => "no answer (its queue is full or it is stuck)".into(),
        }
    }
}

impl std::fmt::Display for FireOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {} {}: {} ({:.1} ms)",
            self.plugin,
            self.event,
            self.words(),
            self.duration.as_secs_f64() * 1e3
        )
    }
}

impl serde::Serialize for FireOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (outcome, message) = match &self.outcome {
            Some(CallOutcome::Ok) => ("ok", None),
            Some(CallOutcome::Error(m)) => ("error", Some(m.clone())),
            Some(CallOutcome::Trap(m)) | Some(CallOutcome::Instantiate(m)) => {
                ("trap", Some(m.clone()))
            }
            Some(CallOutcome::Timeout) => ("timed_out", None),
            Some(CallOutcome::OutOfFuel) => ("out_of_fuel", None),
            Some(CallOutcome::Suspended) => ("suspended", None),
            Some(CallOutcome::Busy(m)) => ("busy", Some(m.clone())),
            Some(CallOutcome::Aborted) => ("aborted", None),
            Some(CallOutcome::Interrupted { .. }) => ("interrupted", None),
            None => ("no_answer", None),
        };
        let mut st = s.serialize_struct("FireOutcome", 5)?;
        st.serialize_field("plugin", &self.plugin)?;
        st.serialize_field("event", &self.event)?;
        st.serialize_field("outcome", outcome)?;
        st.serialize_field("message", &message)?;
        st.serialize_field(
            "duration_ms",
            &((self.duration.as_secs_f64() * 1e6).round() / 1e3),
        )?;
        st.end()
    }
}

impl WasmSink {
    /// Creates the sink and loads the workspace's plugins (the first load happens here, so the
    /// plugins are live before any event is emitted). Compiled components are cached in the
    /// user's cache when it is usable.
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

    /// Rescans the plugins directory and applies what changed (see the module doc).
    pub fn reload(&self) -> LoadReport {
        let _serial = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        let mut report = LoadReport::default();
        let scan = manifest::scan_all(&self.workspace);
        report
            .errors
            .extend(scan.errors.iter().map(|e| e.to_string()));
        report
            .warnings
            .extend(scan.warnings.iter().map(|e| e.to_string()));
        for m in &scan.manifests {
            report
                .warnings
                .extend(m.warnings.iter().map(|e| e.to_string()));
        }
        report
            .skipped
            .extend(scan.skipped.iter().map(|(n, why)| format!("{n}: {why}")));
        let manifests = scan.manifests;

        // Read every component once; what is read is what gets fingerprinted and compiled.
        let mut read = Vec::with_capacity(manifests.len());
        for m in manifests {
            match read_component(&m) {
                Ok(bytes) => {
                    let fp = Fingerprint {
                        manifest: sha256(m.source.as_bytes()),
                        wasm: sha256(&bytes),
                    };
                    read.push((m, fp, bytes));
                }
                Err(e) => report.errors.push(e),
            }
        }
        let need = sizing_for(read.iter().map(|(m, _, _)| m));

        // kv stores of plugins seen for the first time, opened outside the lock: opening reads
        // the whole log and may wait for another process's lock (ended by `closing`).
        let new_stores: Vec<&Manifest> = {
            let st = self.state();
            read.iter()
                .map(|(m, _, _)| m)
                .filter(|m| !st.kv.contains_key(&m.name))
                .collect()
        };
        let stop = || self.closing.load(Ordering::Relaxed);
        let opened: Vec<(String, Arc<KvStore>)> = new_stores
            .into_iter()
            .map(|m| {
                let cap = m.resources.max_kv_storage_mb << 20;
                let kv = KvStore::open_waiting(&self.state_dir("kv"), &m.name, cap, &stop);
                (m.name.clone(), Arc::new(kv))
            })
            .collect();

        // Under the lock: what to keep, what to build, and the handles new versions share.
        let (engine, all, mut next, to_build) = {
            let mut st = self.state();
            if st.closed {
                return LoadReport::default();
            }
            for (name, kv) in opened {
                self.flusher.register(&kv);
                st.kv.insert(name, kv);
            }
            let engine = st.engine.clone();
            let all = !read.is_empty()
                && engine
                    .as_ref()
                    .is_none_or(|(e, _)| !e.sizing().covers(&need));
            let mut next: BTreeMap<String, (Fingerprint, Arc<Plugin>)> = BTreeMap::new();
            let mut to_build = Vec::new();
            for (m, fp, bytes) in read {
                match st.versions.get(&m.name) {
                    Some((old, p)) if !all && *old == fp => {
                        next.insert(m.name.clone(), (fp, p.clone()));
                    }
                    _ => {
                        let ctx = self.context(&mut st, &m);
                        st.building.push(ctx.clone());
                        to_build.push((m, fp, bytes, ctx));
                    }
                }
            }
            (engine, all, next, to_build)
        };

        // Outside the lock: a new engine if needed, then compile, link and probe.
        let engine = if all {
            // Headroom so that adding a plugin or two does not rebuild the engine.
            let sizing = Sizing {
                instances: need.instances.max(6) + need.instances / 2,
                max_memory: need.max_memory,
            };
            match WasmEngine::new(sizing).and_then(|e| {
                let l = linker(e.engine()).map_err(|x| format!("cannot link the host: {x:#}"))?;
                Ok((Arc::new(e), Arc::new(l)))
            }) {
                Ok(pair) => Some(pair),
                Err(e) => {
                    report.errors.push(e);
                    None
                }
            }
        } else {
            engine
        };
        let built: Vec<_> = match &engine {
            Some((engine, linker)) => to_build
                .into_par_iter()
                .map(|(m, fp, bytes, ctx)| {
                    let r = self.build(engine, linker, &m, &bytes, ctx);
                    (m, fp, r)
                })
                .collect(),
            None => Vec::new(),
        };

        let mut st = self.state();
        st.building.clear();
        if st.closed {
            return LoadReport::default();
        }
        if all && engine.is_some() {
            st.sizing = engine.as_ref().map(|(e, _)| e.sizing());
            st.engine = engine;
        }
        for (m, fp, r) in built {
            let name = m.name.clone();
            let r = match r {
                Err(Prepared::NotHook(why)) => {
                    report.skipped.push(format!("{name}: {why}"));
                    continue;
                }
                Err(Prepared::Failed(e)) => Err(e),
                Ok(x) => Ok(x),
            };
            let started = r.and_then(|(shared, compiled)| {
                if compiled == Compiled::Cached {
                    st.cache_hits += 1;
                } else {
                    st.compiled += 1;
                }
                let (plugin, threads) = Plugin::start(shared)
                    .map_err(|e| format!("{}: cannot start executor: {e}", m.file))?;
                self.executors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(threads);
                Ok(Arc::new(plugin))
            });
            match started {
                Ok(plugin) => {
                    // Changed files (not an engine rebuild of the same ones): a suspension of
                    // the old code does not hold the new code.
                    if st.versions.get(&name).is_none_or(|(old, _)| *old != fp)
                        && let Some(b) = st.breakers.get(&name)
                    {
                        b.lock().unwrap_or_else(|e| e.into_inner()).lift();
                    }
                    report.started.push(name.clone());
                    next.insert(name, (fp, plugin));
                }
                Err(e) => {
                    report.errors.push(e);
                    if let Some(old) = st.versions.get(&name) {
                        tracing::warn!(plugin = %name, "the new version failed to load; the previous one keeps running");
                        next.insert(name, old.clone());
                    }
                }
            }
        }

        report.removed = st
            .versions
            .keys()
            .filter(|n| !next.contains_key(*n))
            .cloned()
            .collect();
        let live: Vec<Arc<Plugin>> = next.values().map(|(_, p)| p.clone()).collect();
        let mask = live
            .iter()
            .fold(EventMask::NONE, |m, p| m.union(p.shared.manifest.events));
        self.live.store(Arc::new(live));
        self.interest.set(mask);
        // Stop every version that is no longer live (replaced or removed).
        for (name, (_, old)) in &st.versions {
            if next.get(name).is_none_or(|(_, p)| !Arc::ptr_eq(p, old)) {
                old.shared.ctx.stop.store(true, Ordering::Relaxed);
            }
        }
        st.versions = next;
        if st.versions.is_empty() {
            // No plugins left: let the engine (its ticker and timers) go once the last retiring
            // executor lets go of it.
            st.engine = None;
        }
        if st.loads == 0 || !report.started.is_empty() || !report.removed.is_empty() {
            st.loads += 1;
        }
        st.errors = report.errors.clone();
        // Said once: when they first appear (or change), not at every reload.
        let new_skips = st.skipped != report.skipped;
        let new_warnings = st.warnings != report.warnings;
        st.warnings = report.warnings.clone();
        st.skipped = report.skipped.clone();
        drop(st);
        if new_skips {
            for line in &report.skipped {
                tracing::info!("plugin {line}: skipped (not ours to run)");
            }
        }
        if new_warnings {
            for line in &report.warnings {
                tracing::warn!("plugin: {line}");
            }
        }
        for name in &report.started {
            tracing::info!(plugin = %name, "plugin loaded");
        }
        for name in &report.removed {
            tracing::info!(plugin = %name, "plugin removed");
        }
        report
    }

    /// The context of a new version of `m`: its kv store (opened by the load before it took
    /// the lock), counters and log are the plugin's (shared with its other versions), its stop
    /// flag its own.
    fn context(&self, st: &mut LoadState, m: &Manifest) -> Arc<PluginCtx> {
        let cap = m.resources.max_kv_storage_mb << 20;
        let kv = st
            .kv
            .entry(m.name.clone())
            .or_insert_with(|| {
                // Not reached (loads are serialized and stores never removed); if it were, it
                // must not wait under the lock.
                let kv = KvStore::open_waiting(&self.state_dir("kv"), &m.name, cap, &|| true);
                let kv = Arc::new(kv);
                self.flusher.register(&kv);
                kv
            })
            .clone();
        kv.set_cap(cap);
        let log = st
            .logs
            .entry(m.name.clone())
            .or_insert_with(|| Arc::new(self.logger.plugin(m.name.as_str().into())))
            .clone();
        Arc::new(PluginCtx {
            name: m.name.as_str().into(),
            config: m.config.clone(),
            kv,
            flusher: self.flusher.clone(),
            events_allowed: m.permissions.events,
            bus: self.bus.clone(),
            abort: self.abort.clone(),
            stop: AtomicBool::new(false),
            log,
        })
    }

    /// Compiles, links and probes one plugin version (no executors yet).
    fn build(
        &self,
        engine: &Arc<WasmEngine>,
        linker: &Linker<HostState>,
        m: &Manifest,
        bytes: &[u8],
        ctx: Arc<PluginCtx>,
    ) -> Result<(Arc<PluginShared>, Compiled), Prepared> {
        let (pre, export, compiled) = prepare(engine, linker, m, bytes, self.cache.as_ref())?;
        let handles = {
            let mut st = self.state();
            (
                st.counts.entry(m.name.clone()).or_default().clone(),
                st.breakers.entry(m.name.clone()).or_default().clone(),
            )
        };
        let shared = Arc::new(PluginShared::new(
            m.clone(),
            ctx,
            pre,
            export,
            handles,
            engine.clone(),
            self.calls.clone(),
        ));
        probe(&shared, &m.file).map_err(Prepared::Failed)?;
        Ok((shared, compiled))
    }

    /// Runs `msg` once on every plugin that declared `kind` (even suspended ones), in parallel,
    /// and waits for each answer up to its `max_execution_time_ms` (plus a second).
    pub fn fire(&self, kind: EventKind, msg: &Message) -> Vec<FireOutcome> {
        let live = self.live.load_full();
        let started = Instant::now();
        let pending: Vec<_> = live
            .iter()
            .filter(|p| p.shared.manifest.events.contains(kind))
            .map(|p| {
                let timeout_ms = p.shared.manifest.resources.max_execution_time_ms;
                let wait = Duration::from_millis(timeout_ms) + Duration::from_secs(1);
                (
                    p.shared.name.to_string(),
                    timeout_ms,
                    wait,
                    p.submit_fire(msg.clone(), wait),
                )
            })
            .collect();
        pending
            .into_iter()
            .map(|(plugin, timeout_ms, wait, rx)| {
                let outcome = rx.and_then(|rx| {
                    let left = wait.saturating_sub(started.elapsed());
                    rx.recv_timeout(left).ok()
                });
                FireOutcome {
                    plugin,
                    event: kind,
                    outcome,
                    duration: started.elapsed(),
                    timeout_ms,
                }
            })
            .collect()
    }

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

/// The load-time probe: one instantiation under the plugin's limits. A component whose start
/// code traps, loops, sleeps past its time limit (`max_execution_time_ms`, at most
/// [`MAX_START_MS`](super::plugin::MAX_START_MS)), or whose memory or tables cannot fit its
/// limits fails here, at load, with the reason, instead of at its first event.
fn probe(shared: &PluginShared, label: &str) -> Result<(), String> {
    match shared.instantiate() {
        Ok(_) => Ok(()),
        Err(o) => Err(format!(
            "{label}: cannot instantiate: {}",
            match &o {
                CallOutcome::Instantiate(m) => m.clone(),
                CallOutcome::Timeout => {
                    let limit = shared.manifest.resources.max_execution_time_ms;
                    let start = super::plugin::start_limit_ms(limit);
                    if start < limit {
                        format!(
                            "start code timed out after {start} ms (start code is limited to \
                             max_execution_time_ms, at most {} ms)",
                            super::plugin::MAX_START_MS
                        )
                    } else {
                        format!("start code timed out after {start} ms")
                    }
                }
                other => other.describe(shared.manifest.resources.max_execution_time_ms),
            }
        )),
    }
}

/// Why a plugin was not prepared.
enum Prepared {
    /// Its component is not a hook (it exports another of PRX's worlds): skipped.
    NotHook(String),
    Failed(String),
}

/// Compiles (through the cache when given), checks the export and links one plugin.
fn prepare(
    engine: &WasmEngine,
    linker: &Linker<HostState>,
    m: &Manifest,
    bytes: &[u8],
    cache: Option<&CompileCache>,
) -> Result<
    (
        wasmtime::component::InstancePre<HostState>,
        wasmtime::component::ComponentExportIndex,
        Compiled,
    ),
    Prepared,
> {
    let wasm_label = m.wasm.display();
    let (component, compiled) = engine
        .compile(bytes, cache)
        .map_err(|e| Prepared::Failed(format!("{wasm_label}: not a valid component: {e}")))?;
    let export = find_export(&component, engine.engine()).map_err(|e| {
        let other: Vec<String> = component
            .component_type()
            .exports(engine.engine())
            .map(|(n, _)| n.to_string())
            .filter(|n| n.starts_with("prx:plugin/") && !n.starts_with("prx:plugin/hook-exports"))
            .collect();
        if other.is_empty() {
            Prepared::Failed(format!("{wasm_label}: {e}"))
        } else {
            Prepared::NotHook(format!(
                "its component exports {} (another PRX world), not hook-exports",
                other.join(", ")
            ))
        }
    })?;
    let pre = linker.instantiate_pre(&component).map_err(|e| {
        Prepared::Failed(format!(
            "{wasm_label}: cannot link: {} (plugins may import prx:host/{{log,config,kv,events}} and WASI p2 only)",
            one_line(&format!("{e:#}"))
        ))
    })?;
    Ok((pre, export, compiled))
}

/// Pool size the manifests need: every pooled instance, one probe per plugin, two spare (a
/// replaced version frees its instances as soon as its call is interrupted); the largest
/// memory.
fn sizing_for<'a>(manifests: impl Iterator<Item = &'a Manifest> + Clone) -> Sizing {
    let pooled: u32 = manifests
        .clone()
        .map(|m| m.resources.pool_size.max(1))
        .sum();
    let n = manifests.clone().count() as u32;
    Sizing {
        instances: pooled + n + 2,
        max_memory: manifests
            .map(|m| m.resources.max_memory_mb << 20)
            .max()
            .unwrap_or(1 << 20),
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
    }
}

/// How long dropping the backend waits for executors still running after `shutdown` returned.
const LATE_JOIN: Duration = Duration::from_secs(2);

impl Drop for WasmSink {
    /// Executors a loaded machine kept running past the shutdown deadline have had every call
    /// aborted, so they end within an epoch tick once scheduled: wait for them (up to
    /// [`LATE_JOIN`]) so that no thread — nor the engine, timer runtime and descriptors it holds
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

/// `validate`'s check of loaded manifests: everything a load does short of starting executors,
/// without the compile cache (an untrusted checkout never gets native code deserialized, and
/// nothing is written) and with kv stores that live in memory only.
pub(crate) fn check(manifests: &[Manifest]) -> Vec<String> {
    if manifests.is_empty() {
        return Vec::new();
    }
    let setup = WasmEngine::new(sizing_for(manifests.iter())).and_then(|e| {
        let l = linker(e.engine()).map_err(|x| format!("cannot link the host: {x:#}"))?;
        let f = KvFlusher::start().map_err(|x| format!("cannot start: {x}"))?;
        let g = Logger::start().map_err(|x| format!("cannot start: {x}"))?;
        Ok((Arc::new(e), l, Arc::new(f), g))
    });
    let (engine, linker, flusher, logger) = match setup {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let interest = crate::pipeline::Interest::new(1);
    let bus = Bus::new(interest.handle(0), 1, 1);
    let errors = manifests
        .par_iter()
        .filter_map(|m| {
            let bytes = match read_component(m) {
                Ok(b) => b,
                Err(e) => return Some(e),
            };
            let (pre, export, _) = match prepare(&engine, &linker, m, &bytes, None) {
                Ok(p) => p,
                Err(Prepared::NotHook(_)) => return None,
                Err(Prepared::Failed(e)) => return Some(e),
            };
            let ctx = Arc::new(PluginCtx {
                name: m.name.as_str().into(),
                config: m.config.clone(),
                kv: Arc::new(KvStore::in_memory(m.resources.max_kv_storage_mb << 20)),
                flusher: flusher.clone(),
                events_allowed: m.permissions.events,
                bus: bus.clone(),
                abort: Arc::new(AtomicBool::new(false)),
                stop: AtomicBool::new(false),
                log: Arc::new(logger.plugin(m.name.as_str().into())),
            });
            let shared = PluginShared::new(
                m.clone(),
                ctx,
                pre,
                export,
                Default::default(),
                engine.clone(),
                Default::default(),
            );
            probe(&shared, &m.file).err()
        })
        .collect();
    logger.shutdown(Instant::now() + Duration::from_secs(1));
    engine.stop();
    errors
}

#[cfg(test)]
mod swap_tests {
    use super::*;

    fn plugin_dir(ws: &std::path::Path) -> PathBuf {
        let dir = ws.join("plugins/p");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("plugin.toml"),
            "[plugin]\nname = \"p\"\nversion = \"0.1.0\"\n\n[[capabilities]]\ntype = \"hook\"\nevents = [\"*\"]\n",
        )
        .unwrap();
        std::fs::write(dir.join("plugin.wasm"), b"\0asm inside").unwrap();
        dir
    }

    /// The scan checked `plugin.wasm`; then it is swapped before the load
    /// reads it. What is read is checked again, on the descriptor actually read.
    #[test]
    fn a_component_swapped_for_a_link_outside_after_the_scan_is_refused() {
        let ws = tempfile::tempdir().unwrap();
        let dir = plugin_dir(ws.path());
        let m = manifest::load(&dir).unwrap();
        // Swapped after the manifest was checked: a symbolic link out of the directory.
        let outside = ws.path().join("secret.wasm");
        std::fs::write(&outside, b"\0asm outside").unwrap();
        std::fs::remove_file(dir.join("plugin.wasm")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("plugin.wasm")).unwrap();
        let e = read_component(&m).unwrap_err();
        assert!(e.contains("leads outside the plugin directory"), "{e}");
        // Swapped for something that is not a regular file.
        std::fs::remove_file(dir.join("plugin.wasm")).unwrap();
        std::fs::create_dir(dir.join("plugin.wasm")).unwrap();
        let e = read_component(&m).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        // Swapped for another regular file inside: what is read is what is fingerprinted and
        // compiled (the bytes returned), never the file as the scan saw it.
        std::fs::remove_dir(dir.join("plugin.wasm")).unwrap();
        std::fs::write(dir.join("plugin.wasm"), b"\0asm swapped").unwrap();
        assert_eq!(read_component(&m).unwrap(), b"\0asm swapped");
    }

    /// A component swapped for a FIFO after the scan checked it: opening it must not wait for
    /// a writer (the load holds the loads' lock; the watcher's join at shutdown waits for it).
    #[test]
    fn a_component_swapped_for_a_fifo_after_the_scan_does_not_block_the_load() {
        let ws = tempfile::tempdir().unwrap();
        let dir = plugin_dir(ws.path());
        let m = manifest::load(&dir).unwrap();
        std::fs::remove_file(dir.join("plugin.wasm")).unwrap();
        assert!(
            std::process::Command::new("mkfifo")
                .arg(dir.join("plugin.wasm"))
                .status()
                .unwrap()
                .success()
        );
        let (tx, rx) = std::sync::mpsc::channel();
        // Left blocked in open(2) if it hangs; the test fails instead of hanging.
        std::thread::spawn(move || tx.send(read_component(&m)));
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("read_component returns");
        let e = r.unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
    }

    /// The manifest is parsed once: its fingerprint is the text that was parsed, not the file
    /// as it is when the load compares versions.
    #[test]
    fn the_fingerprint_is_of_the_manifest_text_that_was_parsed() {
        let ws = tempfile::tempdir().unwrap();
        let dir = plugin_dir(ws.path());
        let m = manifest::load(&dir).unwrap();
        let parsed = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
        std::fs::write(dir.join("plugin.toml"), "[plugin]\nname = \"other\"\n").unwrap();
        assert_eq!(m.source, parsed);
    }
}
