//! Loading the plugins: scan, read, plan under the lock, build outside it, start, swap in;
//! and `validate`'s check, which does the same short of starting anything.

use super::*;
use std::path::Path;

impl WasmSink {
    /// Rescans the plugins directory and applies what changed (see the module doc).
    pub fn reload(&self) -> LoadReport {
        let _serial = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        let (mut report, manifests, failed) = scan(&self.workspace);

        // Read every component once; what is read is what gets fingerprinted and compiled.
        let read = read_all(manifests, &mut report);
        let need = sizing_for(read.iter().map(|(m, _, _)| m));
        // Policies (`[policy]`) are built apart; hooks go on below.
        let any = !read.is_empty();
        let (policy_read, read): (Vec<Read>, Vec<Read>) = {
            let policies = read.iter().filter(|(m, _, _)| m.is_policy()).cloned();
            (
                policies.collect(),
                read.into_iter().filter(|(m, _, _)| m.is_hook()).collect(),
            )
        };

        // kv stores of plugins seen for the first time, opened outside the lock: opening reads
        // the whole log and may wait for another process's lock (ended by `closing`).
        let opened = self.open_stores(&read);

        // Under the lock: what to keep, what to build, and the handles new versions share.
        let Some(plan) = self.plan(opened, read, &need, any) else {
            return LoadReport::default();
        };

        // Outside the lock: a new engine if needed, then compile, link and probe.
        let engine = if plan.all {
            new_engine(&need, &mut report)
        } else {
            plan.engine
        };
        let built: Vec<_> = match &engine {
            Some((engine, linker)) => plan
                .to_build
                .into_par_iter()
                .map(|(m, fp, bytes, ctx)| {
                    let r = self.build(engine, linker, &m, &bytes, ctx);
                    (m, fp, r)
                })
                .collect(),
            None => Vec::new(),
        };

        let policies = self.build_policies(engine.as_ref(), policy_read, &failed, &mut report);

        let mut st = self.state();
        st.building.clear();
        if st.closed {
            return LoadReport::default();
        }
        self.swap_policies(&mut st, policies);
        if plan.all && engine.is_some() {
            st.sizing = engine.as_ref().map(|(e, _)| e.sizing());
            st.engine = engine;
        }
        let mut next = plan.next;
        self.start(&mut st, built, &mut next, &mut report);
        self.swap(&mut st, next, &mut report);
        self.remember(st, &report);
        report
    }

    /// Kv stores for the plugins of `read` that have none yet, opened without the lock.
    fn open_stores(&self, read: &[Read]) -> Vec<(String, Arc<KvStore>)> {
        let new_stores: Vec<&Manifest> = {
            let st = self.state();
            read.iter()
                .map(|(m, _, _)| m)
                .filter(|m| !st.kv.contains_key(&m.name))
                .collect()
        };
        let stop = || self.closing.load(Ordering::Relaxed);
        new_stores
            .into_iter()
            .map(|m| {
                let cap = m.resources.max_kv_storage_mb << 20;
                let kv = KvStore::open_waiting(&self.state_dir("kv"), &m.name, cap, &stop);
                (m.name.clone(), Arc::new(kv))
            })
            .collect()
    }

    /// Under the lock: registers the stores just opened, keeps every unchanged version (all
    /// are rebuilt when the engine must be), and gives each version to build its context.
    /// `None` once shut down.
    fn plan(
        &self,
        opened: Vec<(String, Arc<KvStore>)>,
        read: Vec<Read>,
        need: &Sizing,
        any: bool,
    ) -> Option<Plan> {
        let mut st = self.state();
        if st.closed {
            return None;
        }
        for (name, kv) in opened {
            self.flusher.register(&kv);
            st.kv.insert(name, kv);
        }
        let engine = st.engine.clone();
        let all = any
            && engine
                .as_ref()
                .is_none_or(|(e, _)| !e.sizing().covers(need));
        let mut next: Versions = BTreeMap::new();
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
        Some(Plan {
            engine,
            all,
            next,
            to_build,
        })
    }

    /// Starts the executors of every version built; a version that failed keeps the previous
    /// one running. Adds what started to `next`.
    fn start(
        &self,
        st: &mut LoadState,
        built: Vec<Built>,
        next: &mut Versions,
        report: &mut LoadReport,
    ) {
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
                let (plugin, threads) = Plugin::start(shared).map_err(|e| {
                    PluginError::in_file(&m.file, format!("cannot start executor: {e}"))
                })?;
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
                    report.push_error(e);
                    if let Some(old) = st.versions.get(&name) {
                        tracing::warn!(plugin = %name, "the new version failed to load; the previous one keeps running");
                        next.insert(name, old.clone());
                    }
                }
            }
        }
    }

    /// Swaps `next` in at once (the live set, the interest mask) and stops every version that
    /// is no longer live.
    fn swap(&self, st: &mut LoadState, next: Versions, report: &mut LoadReport) {
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
        if st.versions.is_empty() && st.policies.is_empty() {
            // No plugins left: let the engine (its ticker and timers) go once the last retiring
            // executor lets go of it.
            st.engine = None;
        }
        if st.loads == 0 || !report.started.is_empty() || !report.removed.is_empty() {
            st.loads += 1;
        }
    }

    /// Keeps the load's errors, warnings and skips for the stats, and logs what changed.
    fn remember(&self, mut st: MutexGuard<'_, LoadState>, report: &LoadReport) {
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
}

/// A component read: its manifest, what it was built from, its bytes.
pub(super) type Read = (Manifest, Fingerprint, Vec<u8>);

/// A version built (or why not), with what it was built from.
type Built = (
    Manifest,
    Fingerprint,
    Result<(Arc<PluginShared>, Compiled), Prepared>,
);

/// An engine and the host linker made for it.
pub(super) type EnginePair = (Arc<WasmEngine>, Arc<Linker<HostState>>);

/// Each plugin's running version and what it was built from.
pub(super) type Versions = BTreeMap<String, (Fingerprint, Arc<Plugin>)>;

/// What a load decided under the lock.
struct Plan {
    /// The engine in use when the load began.
    engine: Option<EnginePair>,
    /// Whether every plugin is rebuilt (on a new engine).
    all: bool,
    /// The versions kept as they are.
    next: Versions,
    /// The versions to build, each with its new context.
    to_build: Vec<(Manifest, Fingerprint, Vec<u8>, Arc<PluginCtx>)>,
}

/// The scan of the plugins directory: its manifests, and a report holding its errors, warnings
/// and skips.
fn scan(workspace: &Path) -> (LoadReport, Vec<Manifest>, Vec<String>) {
    let mut report = LoadReport::default();
    let scan = manifest::scan_all(workspace);
    for e in scan.errors {
        report.push_error(e.into());
    }
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
    (report, scan.manifests, scan.failed)
}

/// Reads every component once and fingerprints it; a component that cannot be read is an
/// error of the load.
fn read_all(manifests: Vec<Manifest>, report: &mut LoadReport) -> Vec<Read> {
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
            Err(e) => report.push_error(e),
        }
    }
    read
}

/// A new engine and linker sized for `need`, with headroom.
fn new_engine(need: &Sizing, report: &mut LoadReport) -> Option<EnginePair> {
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
            report.push_error(PluginError::host(e));
            None
        }
    }
}

/// What a plugin version was built from: SHA-256 of the manifest text parsed and of the
/// component bytes read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fingerprint {
    manifest: [u8; 32],
    wasm: [u8; 32],
}

pub(super) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).into()
}

/// Reads the component of `m` once, refusing anything that is not a regular file inside the
/// plugin's directory — checked on the descriptor read (its path in /proc/self/fd), so a file
/// swapped for a symbolic link after the manifest was checked is caught.
pub(super) fn read_component(m: &Manifest) -> Result<Vec<u8>, PluginError> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let label = m.wasm.display();
    let err = |reason: String| PluginError::in_file(&label, reason);
    let dir = std::fs::canonicalize(&m.dir)
        .map_err(|e| err(format!("cannot resolve the plugin directory: {e}")))?;
    // Not waiting for a writer: a FIFO swapped in after the scan must not block the open (the
    // load holds the loads' lock, and shutdown joins the watcher that runs it). Links are
    // followed (the check below is on where the descriptor leads).
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
            .open(&m.wasm)
            .map_err(|e| err(format!("cannot read: {e}")))?
    };
    let md = file
        .metadata()
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if !md.is_file() {
        return Err(err("not a regular file".into()));
    }
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| err(format!("cannot resolve the file read: {e}")))?;
    if !real.starts_with(&dir) {
        return Err(err(format!(
            "leads outside the plugin directory (to {}); the component must be inside it",
            real.display()
        )));
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    file.take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(err(format!(
            "larger than {} MiB (the limit)",
            MAX_COMPONENT_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// Largest component file read.
pub(super) const MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// The load-time probe: one instantiation under the plugin's limits. A component whose start
/// code traps, loops, sleeps past its time limit (`max_execution_time_ms`, at most
/// [`MAX_START_MS`](crate::wasm::plugin::MAX_START_MS)), or whose memory or tables cannot fit its
/// limits fails here, at load, with the reason, instead of at its first event.
pub(super) fn probe(shared: &PluginShared, label: &str) -> Result<(), PluginError> {
    match shared.instantiate() {
        Ok(_) => Ok(()),
        Err(o) => Err(PluginError::in_file(
            label,
            format!(
                "cannot instantiate: {}",
                match &o {
                    CallOutcome::Instantiate(m) => m.clone(),
                    CallOutcome::Timeout => {
                        let limit = shared.manifest.resources.max_execution_time_ms;
                        let start = crate::wasm::plugin::start_limit_ms(limit);
                        if start < limit {
                            format!(
                                "start code timed out after {start} ms (start code is limited to \
                             max_execution_time_ms, at most {} ms)",
                                crate::wasm::plugin::MAX_START_MS
                            )
                        } else {
                            format!("start code timed out after {start} ms")
                        }
                    }
                    other => other.describe(shared.manifest.resources.max_execution_time_ms),
                }
            ),
        )),
    }
}

/// Why a plugin was not prepared.
pub(super) enum Prepared {
    /// Its component is not a hook (it exports another of PRX's worlds): skipped.
    NotHook(String),
    Failed(PluginError),
}

/// Compiles (through the cache when given), checks the export and links one plugin.
pub(super) fn prepare(
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
    let (component, compiled) = engine.compile(bytes, cache).map_err(|e| {
        Prepared::Failed(PluginError::in_file(
            &wasm_label,
            format!("not a valid component: {e}"),
        ))
    })?;
    let export = find_export(&component, engine.engine()).map_err(|e| {
        let other: Vec<String> = component
            .component_type()
            .exports(engine.engine())
            .map(|(n, _)| n.to_string())
            .filter(|n| n.starts_with("prx:plugin/") && !n.starts_with("prx:plugin/hook-exports"))
            .collect();
        if other.is_empty() {
            Prepared::Failed(PluginError::in_file(&wasm_label, e.to_string()))
        } else {
            Prepared::NotHook(format!(
                "its component exports {} (another PRX world), not hook-exports",
                other.join(", ")
            ))
        }
    })?;
    let pre = linker.instantiate_pre(&component).map_err(|e| {
        Prepared::Failed(PluginError::in_file(
            &wasm_label,
            format!(
                "cannot link: {} (plugins may import prx:host/{{log,config,kv,events}} and WASI p2 only)",
                one_line(&format!("{e:#}"))
            ),
        ))
    })?;
    Ok((pre, export, compiled))
}

/// Pool size the manifests need: every pooled instance, one probe per plugin, two spare (a
/// replaced version frees its instances as soon as its call is interrupted); the largest
/// memory.
pub(super) fn sizing_for<'a>(manifests: impl Iterator<Item = &'a Manifest> + Clone) -> Sizing {
    // A plugin that is a hook and a policy has a pool for each.
    let pooled: u32 = manifests
        .clone()
        .map(|m| m.resources.pool_size.max(1) * (u32::from(m.is_hook()) + u32::from(m.is_policy())))
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

/// `validate`'s check of loaded manifests: everything a load does short of starting executors,
/// without the compile cache (an untrusted checkout never gets native code deserialized, and
/// nothing is written) and with kv stores that live in memory only.
pub(crate) fn check(manifests: &[Manifest]) -> Vec<PluginError> {
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
        Err(e) => return vec![PluginError::host(e)],
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
            if m.is_policy() {
                let log = Arc::new(logger.plugin(m.name.as_str().into()));
                let abort = Arc::new(AtomicBool::new(false));
                let ctx = super::policies::policy_ctx(m, &flusher, &bus, abort, log);
                let counters = Default::default();
                let r = super::policies::prepare_policy(
                    &engine, &linker, m, &bytes, None, ctx, counters,
                );
                if let Err(e) = r {
                    return Some(e);
                }
            }
            if !m.is_hook() {
                return None;
            }
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
        assert!(
            e.to_string().contains("leads outside the plugin directory"),
            "{e}"
        );
        // Swapped for something that is not a regular file.
        std::fs::remove_file(dir.join("plugin.wasm")).unwrap();
        std::fs::create_dir(dir.join("plugin.wasm")).unwrap();
        let e = read_component(&m).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // Typed: the component file as a whole, no place in it, no key.
        assert_eq!(e.file, m.wasm.display().to_string());
        assert_eq!((e.line, e.col, e.path.as_str()), (0, 0, ""));
        assert_eq!(e.reason, "not a regular file");
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
        assert!(e.to_string().contains("not a regular file"), "{e}");
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
