//! The wasmtime `Engine`: its configuration, the epoch ticker, and compiling components through
//! the on-disk cache.
//!
//! One engine serves every plugin of a workspace. It is created only when plugins exist, with:
//! the component model; fuel (refilled before every call, so `max_fuel` bounds one call, not the
//! plugin's life); epoch interruption, advanced every [`TICK`] by a ticker thread, which is how a
//! call that runs past `max_execution_time_ms` (or past the shutdown deadline) is stopped;
//! `concurrency_support(false)` (we never run guests concurrently inside one store, and the
//! per-call bookkeeping it saves is more than half the cost of a small call); and the pooling
//! allocator sized for the plugins present ([`Sizing`]) — its default reserves slots for 1,000
//! memories of 4 GiB each, terabytes of address space per engine. When a reload brings more
//! instances or a larger memory than the pool was sized for, the sink builds a new engine.
//!
//! Compiled components are cached under `<workspace>/.prx-hooks/cache/` as
//! `<sha256 of the .wasm and of the engine's compatibility hash>.cwasm`, so `fire`, `validate`
//! and restarts load in milliseconds instead of compiling. An entry that fails to load (another
//! wasmtime version, a truncated file) is recompiled and replaced.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: the resolution of `max_execution_time_ms`.
pub const TICK: Duration = Duration::from_millis(5);

/// Core instances, memories and tables one component may have. A Rust `wasm32-wasip2` component
/// has one memory and a few core instances (the program and the shims `wit-component` adds).
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MEMORIES_PER_COMPONENT: u32 = 4;
const TABLES_PER_COMPONENT: u32 = 16;

/// What the pooling allocator must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// Component instances alive at once (pooled instances, their replacements during a reload,
    /// and one for checking a component's exports).
    pub instances: u32,
    /// The largest linear memory any plugin may grow to, in bytes.
    pub max_memory: u64,
}

impl Sizing {
    /// Whether an engine sized `self` can hold what `need` asks.
    pub fn covers(&self, need: &Sizing) -> bool {
        self.instances >= need.instances && self.max_memory >= need.max_memory
    }
}

/// The engine and its ticker thread.
pub struct WasmEngine {
    engine: Engine,
    sizing: Sizing,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

/// Whether a component came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiled {
    Cached,
    Fresh,
}

impl WasmEngine {
    pub fn new(sizing: Sizing) -> Result<WasmEngine, String> {
        let engine = Engine::new(&config(sizing))
            .map_err(|e| format!("cannot create the wasm engine: {e:#}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s) = (engine.clone(), stop.clone());
        let ticker = std::thread::Builder::new()
            .name("prx-hooks-epoch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    e.increment_epoch();
                }
            })
            .map_err(|e| format!("cannot start the epoch ticker: {e}"))?;
        Ok(WasmEngine {
            engine,
            sizing,
            stop,
            ticker: Some(ticker),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn sizing(&self) -> Sizing {
        self.sizing
    }

    /// Compiles `wasm` (the file's bytes), through the cache in `cache_dir` when given.
    pub fn compile(
        &self,
        wasm: &[u8],
        cache_dir: Option<&Path>,
    ) -> Result<(Component, Compiled), String> {
        let Some(dir) = cache_dir else {
            return self.compile_fresh(wasm).map(|c| (c, Compiled::Fresh));
        };
        let entry = dir.join(format!("{}.cwasm", self.cache_key(wasm)));
        if entry.exists() {
            // SAFETY: `deserialize_file` trusts the file to be a component this wasmtime
            // compiled: it maps it and runs its code. The cache directory is ours, inside the
            // workspace (whoever can write there can replace plugins and hooks.json anyway); the
            // entry was written whole (temp file + rename) by `compile` below, its name binds it
            // to these exact .wasm bytes and this engine's compatibility hash, and wasmtime
            // itself checks the header (version, target, tunables) and refuses a mismatch.
            match unsafe { Component::deserialize_file(&self.engine, &entry) } {
                Ok(c) => {
                    touch(&entry);
                    return Ok((c, Compiled::Cached));
                }
                Err(e) => {
                    tracing::debug!(file = %entry.display(), "cache entry unusable ({e}); recompiling")
                }
            }
        }
        let component = self.compile_fresh(wasm)?;
        match component.serialize() {
            Ok(bytes) => {
                if let Err(e) = super::kv::write_atomically(&entry, &bytes) {
                    tracing::debug!(file = %entry.display(), "cannot write the compile cache: {e}");
                }
            }
            Err(e) => tracing::debug!("cannot serialize a compiled component: {e}"),
        }
        Ok((component, Compiled::Fresh))
    }

    fn compile_fresh(&self, wasm: &[u8]) -> Result<Component, String> {
        Component::new(&self.engine, wasm).map_err(|e| one_line(&format!("{e:#}")))
    }

    /// sha256 of the component's bytes and of everything about this engine that decides
    /// whether compiled code is compatible (wasmtime version, target, tunables, features).
    fn cache_key(&self, wasm: &[u8]) -> String {
        struct ShaHasher(Sha256);
        impl Hasher for ShaHasher {
            fn write(&mut self, bytes: &[u8]) {
                self.0.update(bytes);
            }
            fn finish(&self) -> u64 {
                0
            }
        }
        let mut h = ShaHasher(Sha256::new());
        h.write(wasm);
        self.engine.precompile_compatibility_hash().hash(&mut h);
        h.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl WasmEngine {
    /// Stops the epoch ticker (at shutdown; a call still running would never time out).
    pub fn stop_ticker(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.stop_ticker();
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

/// The engine configuration. Benches build their baseline from this same function.
pub fn config(sizing: Sizing) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    let instances = sizing.instances.max(1);
    pool.total_component_instances(instances)
        .total_core_instances(instances * CORE_INSTANCES_PER_COMPONENT)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_memories(instances * MEMORIES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .total_tables(instances * TABLES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size(sizing.max_memory as usize);
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .concurrency_support(false)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// Marks a cache entry as used (for pruning).
fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Removes cache entries not used for `max_age` and not in `keep`.
pub fn prune_cache(dir: &Path, keep: &[PathBuf], max_age: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "cwasm") || keep.contains(&path) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > max_age);
        if old {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A multi-line wasmtime error as one line (`a: b: c`).
pub fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}
