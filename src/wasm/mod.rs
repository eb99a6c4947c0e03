//! WASM plugin hooks: components built for the `prx:plugin` `hook` world (wit/plugin.wit), each
//! declared by a `<workspace>/plugins/<name>/plugin.toml`.
//!
//! ```text
//! worker ──deliver──► WasmSink ──try_send──► plugin shard queue (bounded, drops counted)
//!                                              └─► executor thread ──► pooled instance ──► on-event
//!                                                   fuel refilled, deadline set, outcome counted;
//!                                                   trap/timeout/out-of-fuel → instance replaced;
//!                                                   repeated faults → suspended with backoff
//! plugins/*/plugin.toml ──PluginWatcher──► WasmSink::reload ──► compile (cache) → InstancePre
//! ```
//!
//! Modules: [`manifest`] (plugin.toml: format, validation, errors; built without the `wasm`
//! feature too, so manifests can be checked and fuzzed without wasmtime), `engine` (the
//! wasmtime engine, epoch ticker, timers, address-space sizing), `cache` (the authenticated
//! per-user compile cache), `drive` (running a call's future to its deadline), `host` (what
//! guests may call: prx:host and a locked-down WASI; the per-instance memory cap), `log`
//! (bounded plugin logging), `kv` (the per-plugin store), `plugin` (instances, executors,
//! outcomes, the breaker), `sink` ([`WasmSink`]: loading, reloading, delivering, stats), `watch`
//! (the plugins directory watcher). ARCHITECTURE.md § WASM plugins is the contract.

mod error;
pub mod manifest;
mod stats;

pub use error::PluginError;

pub(crate) use stats::SECTION as STATS_SECTION;
pub use stats::{PluginCounts, PluginStats, PluginsStats};

#[cfg(feature = "wasm")]
mod cache;
#[cfg(feature = "wasm")]
mod calls;
#[cfg(feature = "wasm")]
mod drive;
#[cfg(feature = "wasm")]
mod engine;
#[cfg(feature = "wasm")]
mod host;
#[cfg(feature = "wasm")]
mod kv;
#[cfg(feature = "wasm")]
mod log;
#[cfg(feature = "wasm")]
mod plugin;
#[cfg(feature = "wasm")]
mod policy;
#[cfg(feature = "wasm")]
mod sink;
#[cfg(feature = "wasm")]
mod watch;

#[cfg(feature = "wasm")]
pub use cache::CompileCache;
#[cfg(feature = "wasm")]
pub use calls::CallOutcome;
#[cfg(feature = "wasm")]
pub(crate) use calls::PluginCall;
#[cfg(feature = "wasm")]
pub use engine::{Compiled, Sizing, TICK, WasmEngine, address_space_per_instance};
#[cfg(feature = "wasm")]
pub use kv::FLUSH_DELAY;
#[cfg(feature = "wasm")]
pub use plugin::{EXPORT_FUNC, EXPORT_INTERFACES};
#[cfg(feature = "wasm")]
pub use policy::{POLICY_FUNC, POLICY_INTERFACES};
#[cfg(feature = "wasm")]
pub use sink::{FireOutcome, LoadReport, STATE_DIR, WasmSink};
#[cfg(feature = "wasm")]
pub(crate) use watch::{ArmedWatcher, PluginWatcher};

/// Jobs queued per plugin (split evenly over its `pool_size` instances).
pub const PLUGIN_QUEUE: usize = 1024;

/// Checks every plugin of a workspace the way loading does — manifest, compile, the `on-event`
/// export and its type, linking against the host, a probe instantiation — without starting
/// anything, without the compile cache and without writing anything. One line per problem
/// (plugins that are not hooks are no problem: see [`manifest::scan_all`]); [`check_plugins`]
/// gives them typed. Used by `prx-hooks validate`.
#[cfg(feature = "wasm")]
pub fn check_workspace(workspace: &std::path::Path) -> Vec<String> {
    check_plugins(workspace)
        .iter()
        .map(|e| e.to_string())
        .collect()
}

/// [`check_workspace`], each problem with its file, line, column and key path.
///
/// # Examples
///
/// ```
/// let ws = std::env::temp_dir().join(format!("prx-hooks-doc-check-{}", std::process::id()));
/// std::fs::create_dir_all(ws.join("plugins/audit"))?;
/// std::fs::write(ws.join("plugins/audit/plugin.toml"), "[plugin]\nname = \"audit\"\n")?;
/// let problems = prx_hooks::wasm::check_plugins(&ws);
/// let e = &problems[0];
/// assert!(e.file.ends_with("plugins/audit/plugin.toml"));
/// assert_eq!((e.line, e.col), (1, 1));
/// assert_eq!(e.path, "plugin"); // the table, where the key is missing
/// assert!(e.reason.contains("version"), "{e}");
/// # std::fs::remove_dir_all(&ws)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[cfg(feature = "wasm")]
pub fn check_plugins(workspace: &std::path::Path) -> Vec<PluginError> {
    let (manifests, errors) = manifest::scan(workspace);
    let mut out: Vec<PluginError> = errors.into_iter().map(PluginError::from).collect();
    out.extend(sink::check(&manifests));
    out
}

/// The former path of [`crate::__private::wasm`].
#[cfg(feature = "wasm")]
#[doc(hidden)]
#[deprecated(note = "use prx_hooks::__private::wasm")]
pub mod __bench {
    pub use super::bench::*;
}

/// Internals for `benches/wasm.rs` through [`crate::__private::wasm`]: one plugin's per-call
/// path, and the direct wasmtime calls it is compared with. Not part of the API.
#[cfg(feature = "wasm")]
pub(crate) mod bench {
    use super::cache::CompileCache;
    use super::drive::{Driven, drive};
    use super::engine::{Compiled, WasmEngine};
    use super::host::{HostState, InstanceLimits, PluginCtx, linker, linker_sync};
    use super::kv::{KvFlusher, KvStore};
    use super::log::Logger;
    use super::plugin::{Instance, PluginShared, find_export};
    use crate::bus::{Bus, Message};
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};
    use wasmtime::Store;
    use wasmtime::component::{Component, TypedFunc};

    /// A plugin loaded as the sink loads it, driven on the caller's thread.
    #[allow(missing_debug_implementations)]
    pub struct Loaded {
        shared: Arc<PluginShared>,
        slot: Option<Instance>,
        component: Component,
        engine: Arc<WasmEngine>,
        _logger: Logger,
    }

    /// Loads the plugin in `dir` (its plugin.toml and component) with memories reserved for
    /// `reserve_mb` (at least its own limit), compiling through `cache`.
    pub fn load(
        dir: &Path,
        cache: Option<&CompileCache>,
        reserve_mb: u64,
    ) -> Result<(Loaded, Compiled), String> {
        let m = super::manifest::load(dir).map_err(|e| e.to_string())?;
        let engine = Arc::new(WasmEngine::new(super::engine::Sizing {
            instances: 8,
            max_memory: (m.resources.max_memory_mb.max(reserve_mb)) << 20,
        })?);
        let linker = linker(engine.engine()).map_err(|e| e.to_string())?;
        let bytes = std::fs::read(&m.wasm).map_err(|e| e.to_string())?;
        let (component, compiled) = engine.compile(&bytes, cache)?;
        let export = find_export(&component, engine.engine())?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| e.to_string())?;
        let interest = crate::pipeline::Interest::new(1);
        let logger = Logger::start().map_err(|e| e.to_string())?;
        let ctx = Arc::new(PluginCtx {
            name: m.name.as_str().into(),
            config: m.config.clone(),
            kv: Arc::new(KvStore::in_memory(u64::MAX)),
            flusher: Arc::new(KvFlusher::start().map_err(|e| e.to_string())?),
            events_allowed: m.permissions.events,
            bus: Bus::new(interest.handle(0), 1024, 1 << 20),
            abort: Arc::new(AtomicBool::new(false)),
            stop: AtomicBool::new(false),
            log: Arc::new(logger.plugin(m.name.as_str().into())),
        });
        let shared = Arc::new(PluginShared::new(
            m,
            ctx,
            pre,
            export,
            Default::default(),
            engine.clone(),
            Default::default(),
        ));
        let loaded = Loaded {
            shared,
            slot: None,
            component,
            engine,
            _logger: logger,
        };
        Ok((loaded, compiled))
    }

    impl Loaded {
        /// One `on-event` through the executor's per-call path (breaker, fuel refill,
        /// deadline, the driven async call, classification, counters). Whether it returned `Ok`.
        pub fn call(&mut self, event: &str, msg: &Message) -> bool {
            let timers = self.engine.timers();
            let _rt = timers.enter();
            self.shared.run(&mut self.slot, event, msg, false).is_ok()
        }

        /// A fresh instance from the `InstancePre` (what replacing a trapped one costs).
        pub fn instantiate(&self) -> Duration {
            let t = Instant::now();
            let i = self.shared.instantiate().expect("instantiate");
            let d = t.elapsed();
            drop(i);
            d
        }

        fn store(&self) -> Store<HostState> {
            let (tx, rx) = flume::bounded(1);
            let state = HostState::new(
                self.shared.ctx.clone(),
                InstanceLimits::new(usize::MAX),
                tx,
                rx,
            );
            let mut store = Store::new(self.engine.engine(), state);
            store.set_fuel(u64::MAX / 2).expect("fuel");
            store.set_epoch_deadline(u64::MAX / 2);
            store
        }

        /// The old baseline: the same component and engine `Config`, WASI linked with its
        /// synchronous bindings, called through a plain `TypedFunc::call` with fuel on (set
        /// once, high) and nothing else.
        pub fn direct(&self) -> Direct {
            let linker = linker_sync(self.engine.engine()).expect("linker");
            let mut store = self.store();
            let instance = linker
                .instantiate(&mut store, &self.component)
                .expect("instantiate");
            let export = find_export(&self.component, self.engine.engine()).expect("export");
            let func = instance
                .get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut store, export)
                .expect("typed func");
            Direct { store, func }
        }

        /// The same with the host's linker (async WASI) and `call_async`, polled on this thread
        /// by the executor's driver: what async costs by itself.
        pub fn direct_async(&self) -> DirectAsync {
            let linker = linker(self.engine.engine()).expect("linker");
            let mut store = self.store();
            let timers = self.engine.timers();
            let _rt = timers.enter();
            let instance = match drive(
                linker.instantiate_async(&mut store, &self.component),
                Instant::now() + Duration::from_secs(60),
                || false,
            ) {
                Driven::Done(i) => i.expect("instantiate"),
                _ => panic!("instantiation did not finish"),
            };
            let export = find_export(&self.component, self.engine.engine()).expect("export");
            let func = instance
                .get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut store, export)
                .expect("typed func");
            DirectAsync {
                store,
                func,
                timers,
            }
        }
    }

    type OnEvent = TypedFunc<(&'static str, &'static str), (Result<(), String>,)>;

    /// A direct synchronous typed call (the old baseline).
    #[allow(missing_debug_implementations)]
    pub struct Direct {
        store: Store<HostState>,
        func: OnEvent,
    }

    impl Direct {
        /// Calls `on-event`; whether it returned `Ok`.
        pub fn call(&mut self, event: &str, payload: &str) -> bool {
            matches!(
                self.func.call(&mut self.store, (event, payload)),
                Ok((Ok(()),))
            )
        }
    }

    /// A direct `call_async`, driven (the async baseline).
    #[allow(missing_debug_implementations)]
    pub struct DirectAsync {
        store: Store<HostState>,
        func: OnEvent,
        timers: tokio::runtime::Handle,
    }

    impl DirectAsync {
        /// Calls `on-event` and drives it; whether it returned `Ok`.
        pub fn call(&mut self, event: &str, payload: &str) -> bool {
            let _rt = self.timers.enter();
            let far = Instant::now() + Duration::from_secs(60);
            matches!(
                drive(
                    self.func.call_async(&mut self.store, (event, payload)),
                    far,
                    || false
                ),
                Driven::Done(Ok((Ok(()),)))
            )
        }
    }

    /// Opens a compile cache at explicit places (benches measure a cold start from it).
    pub fn cache(dir: &Path, key: &Path) -> Result<CompileCache, String> {
        CompileCache::open(dir, key)
    }
}
