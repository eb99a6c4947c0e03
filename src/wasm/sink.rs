//! [`WasmSink`]: the plugins of a workspace as one pipeline sink, and loading/reloading them.
//!
//! A load scans `<workspace>/plugins/*/plugin.toml`, compares each plugin with the version
//! running (the manifest's bytes and the `.wasm` file's identity), and builds only what changed:
//! compile through the cache (in parallel, with rayon), find and type-check `on-event`, link
//! (`InstancePre`), instantiate once as a probe, start the executors. Then the new set of
//! plugins is swapped in at once (`ArcSwap`; workers read it without locking) and the interest
//! mask updated. A plugin whose new version fails to load keeps its old version running; a
//! removed directory stops its plugin. Replaced and removed plugins finish what is queued, each
//! in-flight call on its old instance, then their executors exit.
//!
//! The engine is created by the first load that finds a plugin, sized for what it found; a
//! later load that needs more pooled instances or a larger memory builds a new engine and moves
//! every plugin to it (the compile cache makes that a matter of milliseconds).

use super::engine::{Compiled, Sizing, WasmEngine, one_line};
use super::host::{HostState, PluginCtx, linker};
use super::kv::{KvFlusher, KvStore};
use super::manifest::{self, Manifest};
use super::plugin::{CallOutcome, Plugin, PluginShared, find_export};
use crate::bus::{Bus, Message};
use crate::event::{EventKind, EventMask};
use crate::pipeline::{InterestHandle, Sink};
use crate::stats::SinkCounts;
use crate::wasm::{PluginCounts, PluginStats, PluginsStats};
use arc_swap::ArcSwap;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wasmtime::component::Linker;

/// Where compiled components and kv stores live, under the workspace.
pub const STATE_DIR: &str = ".prx-hooks";

/// The plugin backend.
pub struct WasmSink {
    workspace: PathBuf,
    bus: Bus,
    interest: InterestHandle,
    abort: Arc<AtomicBool>,
    flusher: Arc<KvFlusher>,
    live: ArcSwap<Vec<Arc<Plugin>>>,
    load: Mutex<LoadState>,
    /// Executor threads of every plugin version ever started (joined at shutdown).
    executors: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct LoadState {
    engine: Option<(Arc<WasmEngine>, Arc<Linker<HostState>>)>,
    /// The running version of each plugin and what it was built from.
    versions: BTreeMap<String, (Fingerprint, Arc<Plugin>)>,
    /// Counters and kv stores by plugin name: they outlive versions (and removals).
    counts: BTreeMap<String, Arc<Mutex<PluginCounts>>>,
    kv: BTreeMap<String, Arc<KvStore>>,
    /// Shut down: nothing loads any more.
    closed: bool,
    /// What the current (or, after shutdown, the last) engine's pool holds.
    sizing: Option<Sizing>,
    /// After shutdown: the plugins that were running, for the final stats.
    stopped: Vec<Arc<PluginShared>>,
    errors: Vec<String>,
    loads: u64,
    compiled: u64,
    cache_hits: u64,
}

/// What a plugin version was built from: the manifest's bytes and the component file's
/// identity (device, inode, size, modification and change times).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    manifest: Vec<u8>,
    wasm: Option<(u64, u64, u64, i64, i64, i64, i64)>,
}

impl Fingerprint {
    fn of(m: &Manifest) -> Fingerprint {
        use std::os::unix::fs::MetadataExt;
        let manifest = std::fs::read(m.dir.join(manifest::MANIFEST_FILE)).unwrap_or_default();
        let wasm = std::fs::metadata(&m.wasm).ok().map(|md| {
            (
                md.dev(),
                md.ino(),
                md.size(),
                md.mtime(),
                md.mtime_nsec(),
                md.ctime(),
                md.ctime_nsec(),
            )
        });
        Fingerprint { manifest, wasm }
    }
}

/// What one load did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// Plugins (re)built and started.
    pub started: Vec<String>,
    /// Plugins stopped because their directory went away.
    pub removed: Vec<String>,
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
            Some(CallOutcome::Aborted) => ("aborted", None),
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
    /// plugins are live before any event is emitted).
    pub fn new(
        workspace: PathBuf,
        bus: Bus,
        interest: InterestHandle,
    ) -> std::io::Result<WasmSink> {
        let sink = WasmSink {
            workspace,
            bus,
            interest,
            abort: Arc::new(AtomicBool::new(false)),
            flusher: Arc::new(KvFlusher::start()?),
            live: ArcSwap::from_pointee(Vec::new()),
            load: Mutex::default(),
            executors: Mutex::default(),
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

    /// Rescans the plugins directory and applies what changed (see the module doc).
    pub fn reload(&self) -> LoadReport {
        let mut st = self.state();
        if st.closed {
            return LoadReport::default();
        }
        let mut report = LoadReport::default();
        let (manifests, errors) = manifest::scan(&self.workspace);
        report.errors.extend(errors.iter().map(|e| e.to_string()));

        let need = sizing_for(&manifests);
        let mut all = false;
        if !manifests.is_empty()
            && st
                .engine
                .as_ref()
                .is_none_or(|(e, _)| !e.sizing().covers(&need))
        {
            // Headroom so that adding a plugin or two does not rebuild the engine.
            let sizing = Sizing {
                instances: need.instances.max(8) + need.instances / 2,
                max_memory: need.max_memory,
            };
            match WasmEngine::new(sizing).and_then(|e| {
                let l = linker(e.engine()).map_err(|x| format!("cannot link the host: {x:#}"))?;
                Ok((Arc::new(e), Arc::new(l)))
            }) {
                Ok(pair) => {
                    st.sizing = Some(pair.0.sizing());
                    st.engine = Some(pair);
                    all = true;
                }
                Err(e) => report.errors.push(e),
            }
        }

        let mut next: BTreeMap<String, (Fingerprint, Arc<Plugin>)> = BTreeMap::new();
        let mut to_build = Vec::new();
        for m in manifests {
            let fp = Fingerprint::of(&m);
            match st.versions.get(&m.name) {
                Some((old, p)) if !all && *old == fp => {
                    next.insert(m.name.clone(), (fp, p.clone()));
                }
                _ => to_build.push((m, fp)),
            }
        }

        if let Some((engine, linker)) = st.engine.clone() {
            let cache = self.state_dir("cache");
            let cache = std::fs::create_dir_all(&cache).is_ok().then_some(cache);
            let built: Vec<_> = to_build
                .into_par_iter()
                .map(|(m, fp)| {
                    let r = prepare(&engine, &linker, &m, cache.as_deref());
                    (m, fp, r)
                })
                .collect();
            for (m, fp, r) in built {
                let name = m.name.clone();
                match r.and_then(|(pre, export, compiled)| {
                    if compiled == Compiled::Cached {
                        st.cache_hits += 1;
                    } else {
                        st.compiled += 1;
                    }
                    self.start_plugin(&mut st, m, pre, export, &engine)
                }) {
                    Ok(plugin) => {
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
            if let Some(dir) = &cache {
                super::engine::prune_cache(dir, &[], Duration::from_secs(7 * 24 * 3600));
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
        st.versions = next;
        if st.versions.is_empty() {
            // No plugins left: let the engine (and its ticker) go once the last retiring
            // executor lets go of it.
            st.engine = None;
        }
        if st.loads == 0 || !report.started.is_empty() || !report.removed.is_empty() {
            st.loads += 1;
        }
        st.errors = report.errors.clone();
        for name in &report.started {
            tracing::info!(plugin = %name, "plugin loaded");
        }
        for name in &report.removed {
            tracing::info!(plugin = %name, "plugin removed");
        }
        report
    }

    fn start_plugin(
        &self,
        st: &mut LoadState,
        m: Manifest,
        pre: wasmtime::component::InstancePre<HostState>,
        export: wasmtime::component::ComponentExportIndex,
        engine: &Arc<WasmEngine>,
    ) -> Result<Arc<Plugin>, String> {
        let cap = m.resources.max_kv_storage_mb << 20;
        let kv = st
            .kv
            .entry(m.name.clone())
            .or_insert_with(|| {
                let kv = Arc::new(KvStore::open(&self.state_dir("kv"), &m.name, cap));
                self.flusher.register(&kv);
                kv
            })
            .clone();
        kv.set_cap(cap);
        let counts = st.counts.entry(m.name.clone()).or_default().clone();
        let ctx = Arc::new(PluginCtx {
            name: m.name.as_str().into(),
            config: m.config.clone(),
            kv,
            flusher: self.flusher.clone(),
            events_allowed: m.permissions.events,
            bus: self.bus.clone(),
            abort: self.abort.clone(),
        });
        let label = m.file.clone();
        let shared = Arc::new(PluginShared::new(
            m,
            ctx,
            pre,
            export,
            counts,
            engine.clone(),
        ));
        // A probe: a component whose memory or tables cannot fit its limits fails here, at
        // load, with the reason, instead of at its first event.
        shared
            .instantiate()
            .map_err(|e| format!("{label}: cannot instantiate: {e}"))?;
        let (plugin, threads) =
            Plugin::start(shared).map_err(|e| format!("{label}: cannot start executor: {e}"))?;
        self.executors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(threads);
        Ok(Arc::new(plugin))
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
                    counts: sh.counts().clone(),
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
        }
    }
}

/// Compiles (through the cache), checks the export and links one plugin.
fn prepare(
    engine: &WasmEngine,
    linker: &Linker<HostState>,
    m: &Manifest,
    cache: Option<&Path>,
) -> Result<
    (
        wasmtime::component::InstancePre<HostState>,
        wasmtime::component::ComponentExportIndex,
        Compiled,
    ),
    String,
> {
    let wasm_label = m.wasm.display();
    let bytes = std::fs::read(&m.wasm).map_err(|e| format!("{wasm_label}: cannot read: {e}"))?;
    let (component, compiled) = engine
        .compile(&bytes, cache)
        .map_err(|e| format!("{wasm_label}: not a valid component: {e}"))?;
    let export =
        find_export(&component, engine.engine()).map_err(|e| format!("{wasm_label}: {e}"))?;
    let pre = linker.instantiate_pre(&component).map_err(|e| {
        format!(
            "{wasm_label}: cannot link: {} (plugins may import prx:host/{{log,config,kv,events}} and WASI p2 only)",
            one_line(&format!("{e:#}"))
        )
    })?;
    Ok((pre, export, compiled))
}

/// Pool size the manifests need: every pooled instance, as many again for replacements during a
/// reload, two for probes; the largest memory.
fn sizing_for(manifests: &[Manifest]) -> Sizing {
    let pooled: u32 = manifests.iter().map(|m| m.resources.pool_size.max(1)).sum();
    Sizing {
        instances: pooled * 2 + manifests.len() as u32 + 2,
        max_memory: manifests
            .iter()
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
    /// still runs (the epoch callback sees the abort flag within a tick) and counts what is
    /// left as dropped; flushes every kv store.
    fn shutdown(&self, deadline: Instant) {
        {
            let mut st = self.state();
            st.closed = true;
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
        for t in threads {
            let _ = t.join();
        }
        self.flusher.stop();
        if let Some((engine, _)) = self.state().engine.take() {
            engine.stop_ticker();
        }
    }
}

/// `validate`'s check of loaded manifests: everything a load does short of starting executors.
pub(crate) fn check(workspace: &Path, manifests: &[Manifest]) -> Vec<String> {
    if manifests.is_empty() {
        return Vec::new();
    }
    let setup = WasmEngine::new(sizing_for(manifests)).and_then(|e| {
        let l = linker(e.engine()).map_err(|x| format!("cannot link the host: {x:#}"))?;
        let f = KvFlusher::start().map_err(|x| format!("cannot start: {x}"))?;
        Ok((Arc::new(e), l, Arc::new(f)))
    });
    let (engine, linker, flusher) = match setup {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let cache = workspace.join(STATE_DIR).join("cache");
    let cache = std::fs::create_dir_all(&cache).is_ok().then_some(cache);
    let interest = crate::pipeline::Interest::new(1);
    let bus = Bus::new(interest.handle(0), 1, 1);
    let kv_dir = workspace.join(STATE_DIR).join("kv");
    manifests
        .par_iter()
        .filter_map(|m| {
            let (pre, export, _) = match prepare(&engine, &linker, m, cache.as_deref()) {
                Ok(p) => p,
                Err(e) => return Some(e),
            };
            let ctx = Arc::new(PluginCtx {
                name: m.name.as_str().into(),
                config: m.config.clone(),
                kv: Arc::new(KvStore::open(&kv_dir, &m.name, u64::MAX)),
                flusher: flusher.clone(),
                events_allowed: m.permissions.events,
                bus: bus.clone(),
                abort: Arc::new(AtomicBool::new(false)),
            });
            let counts = Arc::default();
            let shared = PluginShared::new(m.clone(), ctx, pre, export, counts, engine.clone());
            shared
                .instantiate()
                .err()
                .map(|e| format!("{}: cannot instantiate: {e}", m.file))
        })
        .collect()
}
