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
//! wasmtime engine, epoch ticker, compile cache), `host` (what guests may call: prx:host and a
//! locked-down WASI), `kv` (the per-plugin store), `plugin` (instances, executors, outcomes,
//! the breaker), `sink` ([`WasmSink`]: loading, reloading, delivering, stats), `watch` (the
//! plugins directory watcher). ARCHITECTURE.md § WASM plugins is the contract.

pub mod manifest;
mod stats;

pub(crate) use stats::SECTION as STATS_SECTION;
pub use stats::{PluginCounts, PluginStats, PluginsStats};

#[cfg(feature = "wasm")]
mod engine;
#[cfg(feature = "wasm")]
mod host;
#[cfg(feature = "wasm")]
mod kv;
#[cfg(feature = "wasm")]
mod plugin;
#[cfg(feature = "wasm")]
mod sink;
#[cfg(feature = "wasm")]
mod watch;

#[cfg(feature = "wasm")]
pub use engine::{Compiled, Sizing, TICK, WasmEngine};
#[cfg(feature = "wasm")]
pub use kv::FLUSH_DELAY;
#[cfg(feature = "wasm")]
pub use plugin::{CallOutcome, EXPORT_FUNC, EXPORT_INTERFACES};
#[cfg(feature = "wasm")]
pub use sink::{FireOutcome, LoadReport, STATE_DIR, WasmSink};
#[cfg(feature = "wasm")]
pub(crate) use watch::PluginWatcher;

/// Jobs queued per plugin (split evenly over its `pool_size` instances).
pub const PLUGIN_QUEUE: usize = 1024;

/// Checks every plugin of a workspace the way loading does — manifest, compile, the `on-event`
/// export and its type, linking against the host, a probe instantiation — without starting
/// anything. One line per problem. Used by `prx-hooks validate`.
#[cfg(feature = "wasm")]
pub fn check_workspace(workspace: &std::path::Path) -> Vec<String> {
    let (manifests, errors) = manifest::scan(workspace);
    let mut out: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    out.extend(sink::check(workspace, &manifests));
    out
}

/// Internals for `benches/wasm.rs`: one plugin's per-call path, and the direct wasmtime call it
/// is compared with. Not part of the API.
#[cfg(feature = "wasm")]
#[doc(hidden)]
pub mod __bench {
    use super::engine::{Compiled, WasmEngine};
    use super::host::{HostState, PluginCtx, linker};
    use super::kv::{KvFlusher, KvStore};
    use super::plugin::{Instance, PluginShared, find_export};
    use crate::bus::{Bus, Message};
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};
    use wasmtime::Store;
    use wasmtime::component::{Component, TypedFunc};

    /// A plugin loaded as the sink loads it, driven on the caller's thread.
    pub struct Loaded {
        shared: Arc<PluginShared>,
        slot: Option<Instance>,
        component: Component,
        engine: Arc<WasmEngine>,
    }

    /// Loads the plugin in `dir` (its plugin.toml and component), compiling through `cache`.
    pub fn load(dir: &Path, cache: Option<&Path>) -> Result<(Loaded, Compiled), String> {
        let m = super::manifest::load(dir).map_err(|e| e.to_string())?;
        let engine = Arc::new(WasmEngine::new(super::engine::Sizing {
            instances: 8,
            max_memory: m.resources.max_memory_mb << 20,
        })?);
        let linker = linker(engine.engine()).map_err(|e| e.to_string())?;
        let bytes = std::fs::read(&m.wasm).map_err(|e| e.to_string())?;
        let (component, compiled) = engine.compile(&bytes, cache)?;
        let export = find_export(&component, engine.engine())?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| e.to_string())?;
        let interest = crate::pipeline::Interest::new(1);
        let kv_dir =
            std::env::temp_dir().join(format!("prx-hooks-bench-kv-{}", std::process::id()));
        let ctx = Arc::new(PluginCtx {
            name: m.name.as_str().into(),
            config: m.config.clone(),
            kv: Arc::new(KvStore::open(&kv_dir, &m.name, u64::MAX)),
            flusher: Arc::new(KvFlusher::start().map_err(|e| e.to_string())?),
            events_allowed: m.permissions.events,
            bus: Bus::new(interest.handle(0), 1024, 1 << 20),
            abort: Arc::new(AtomicBool::new(false)),
        });
        let shared = Arc::new(PluginShared::new(
            m,
            ctx,
            pre,
            export,
            Arc::default(),
            engine.clone(),
        ));
        let loaded = Loaded {
            shared,
            slot: None,
            component,
            engine,
        };
        Ok((loaded, compiled))
    }

    impl Loaded {
        /// One `on-event` through the executor's per-call path (breaker, fuel refill,
        /// deadline, call, classification, counters). Whether it returned `Ok`.
        pub fn call(&mut self, event: &str, msg: &Message) -> bool {
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

        /// The baseline: the same component, engine `Config` and linker, called through a
        /// plain wasmtime `TypedFunc` with fuel on (set once, high) and nothing else.
        pub fn direct(&self) -> Direct {
            let linker = linker(self.engine.engine()).expect("linker");
            let (tx, rx) = flume::bounded(1);
            let limits = wasmtime::StoreLimitsBuilder::new().build();
            let state = HostState::new(self.shared.ctx.clone(), limits, tx, rx);
            let mut store = Store::new(self.engine.engine(), state);
            store.set_fuel(u64::MAX / 2).expect("fuel");
            store.set_epoch_deadline(u64::MAX / 2);
            let instance = linker
                .instantiate(&mut store, &self.component)
                .expect("instantiate");
            let export = find_export(&self.component, self.engine.engine()).expect("export");
            let func = instance
                .get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut store, export)
                .expect("typed func");
            Direct { store, func }
        }
    }

    /// A direct typed call (the baseline).
    pub struct Direct {
        store: Store<HostState>,
        func: TypedFunc<(&'static str, &'static str), (Result<(), String>,)>,
    }

    impl Direct {
        pub fn call(&mut self, event: &str, payload: &str) -> bool {
            matches!(
                self.func.call(&mut self.store, (event, payload)),
                Ok((Ok(()),))
            )
        }
    }
}
