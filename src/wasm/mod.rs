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
//! plugins directory watcher). DESIGN.md §5 is the contract.

pub mod manifest;

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
