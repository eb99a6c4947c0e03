//! The wasmtime `Engine`: its configuration, the epoch ticker, the timer runtime, and compiling
//! components through the authenticated cache ([`super::cache`]).
//!
//! One engine serves every plugin of a workspace. It is created only when plugins exist, with:
//! the component model; fuel (refilled before every call, so `max_fuel` bounds one call, not the
//! plugin's life); epoch interruption, advanced every [`TICK`] by a ticker thread while a guest
//! runs ([`WasmEngine::running`]; idle, the ticker is parked and costs nothing), which is how a
//! call that runs past `max_execution_time_ms` (or past the shutdown deadline) is stopped while it
//! runs guest code; `concurrency_support(false)` (we never run guests concurrently inside one
//! store); and the pooling allocator sized for the plugins present ([`Sizing`]).
//!
//! Calls are made with `call_async` (see [`super::drive`]): a guest blocked in a WASI host call
//! (`wasi:io/poll` on a clock, which is how `std::thread::sleep` waits) is a suspended future, and
//! the executor drops it at the call's deadline or at shutdown; epochs alone cannot reach a guest
//! that is inside the host (wasmtime's `Config::epoch_interruption` docs say so). WASI's clocks are
//! tokio timers: each engine owns a one-thread tokio runtime that drives them
//! ("prx-hooks-wasm-timer"); executors enter its context and poll their calls themselves.
//!
//! Address space (ARCHITECTURE.md § WASM plugins): each linear memory slot reserves
//! [`reservation`] bytes (the largest `max_memory_mb` rounded up to a power of two, at least
//! 1 MiB) plus a [`GUARD`]; wasmtime's default is 4 GiB + 32 MiB per slot, which put 164 GiB of
//! reservations behind one 64 MiB plugin. A reservation below 4 GiB makes the compiled code check
//! bounds explicitly, and it is part of the compiled code's compatibility hash: a plugin with a
//! larger limit that crosses a power of two rebuilds the engine and recompiles every plugin once.

use super::cache::CompileCache;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances: the resolution of `max_execution_time_ms`.
pub const TICK: Duration = Duration::from_millis(5);

/// Core instances, memories and tables one component may have. A Rust `wasm32-wasip2` component
/// has one memory and a few core instances (the program and the shims `wit-component` adds).
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
/// Linear memories one component instance may have, and the memory slots the pool holds for
/// each instance: a Rust `wasm32-wasip2` component has one; two leave room for a component
/// composed with one more. Every instance has its slots, so no plugin can take another's (with
/// 1.5 slots per instance and 4 allowed, one plugin of three-memory instances took them all);
/// a component with more is refused at load (by wasmtime, when it is compiled for this
/// pool: "…contains 3 Wasm linear memories, which exceeds the configured maximum of 2…").
pub(super) const MEMORIES_PER_COMPONENT: u32 = 2;
const TABLES_PER_COMPONENT: u32 = 16;

/// What the pooling allocator must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// Component instances alive at once (pooled instances, their replacements during a reload,
    /// and probes).
    pub instances: u32,
    /// The largest linear memory any plugin may grow to, in bytes.
    pub max_memory: u64,
}

impl Sizing {
    /// Whether an engine sized `self` can hold what `need` asks without recompiling: enough
    /// instances, and memories that fit the same reservation.
    pub fn covers(&self, need: &Sizing) -> bool {
        self.instances >= need.instances
            && self.max_memory >= need.max_memory
            && reservation(self.max_memory) == reservation(need.max_memory)
    }
}

/// The engine, its ticker thread and its timer runtime.
pub struct WasmEngine {
    engine: Engine,
    sizing: Sizing,
    stop: Arc<AtomicBool>,
    /// Guest calls and instantiations in progress; the ticker parks while it is 0.
    running: Arc<AtomicUsize>,
    /// The ticker's thread, to wake it when `running` leaves 0 and at `stop`.
    ticker_thread: std::thread::Thread,
    ticker: Mutex<Option<JoinHandle<()>>>,
    timers: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for WasmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmEngine")
            .field("sizing", &self.sizing)
            .field("running", &self.running.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Whether a component came from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiled {
    /// Deserialized from the compile cache.
    Cached,
    /// Compiled now.
    Fresh,
}

impl WasmEngine {
    /// An engine whose pooling allocator holds `sizing`, with its epoch ticker and timers.
    pub fn new(sizing: Sizing) -> Result<WasmEngine, String> {
        let engine = Engine::new(&config(sizing)).map_err(|e| {
            format!(
                "cannot create the wasm engine: {}",
                one_line(&format!("{e:#}"))
            )
        })?;
        let timers = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .thread_name("prx-hooks-wasm-timer")
            .enable_time()
            .enable_io()
            .build()
            .map_err(|e| format!("cannot start the wasm timer thread: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicUsize::new(0));
        let (e, s, r) = (engine.clone(), stop.clone(), running.clone());
        let ticker = std::thread::Builder::new()
            .name("prx-hooks-epoch".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    if r.load(Ordering::SeqCst) == 0 {
                        // No guest runs: nothing to interrupt. `Running::new` unparks us (a
                        // wake between the load and the park leaves the token: park returns).
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(TICK);
                    e.increment_epoch();
                }
            })
            .map_err(|e| format!("cannot start the epoch ticker: {e}"))?;
        Ok(WasmEngine {
            engine,
            sizing,
            stop,
            running,
            ticker_thread: ticker.thread().clone(),
            ticker: Mutex::new(Some(ticker)),
            handle: timers.handle().clone(),
            timers: Mutex::new(Some(timers)),
        })
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Marks a guest call or instantiation as running until the guard drops: the epoch ticker
    /// ticks only while one is. Two atomic operations per call; the first call after an idle
    /// spell also unparks the ticker.
    pub fn running(&self) -> Running<'_> {
        if self.running.fetch_add(1, Ordering::SeqCst) == 0 {
            self.ticker_thread.unpark();
        }
        Running(self)
    }

    /// What the pool holds.
    pub fn sizing(&self) -> Sizing {
        self.sizing
    }

    /// The timer runtime's handle: guest code runs inside its context (WASI clocks are tokio
    /// timers).
    pub fn timers(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }

    /// Compiles `wasm` (the file's bytes), through `cache` when given: an authenticated entry is
    /// loaded instead of compiling, and a fresh compile is stored.
    pub fn compile(
        &self,
        wasm: &[u8],
        cache: Option<&CompileCache>,
    ) -> Result<(Component, Compiled), String> {
        let Some(cache) = cache else {
            return self.compile_fresh(wasm).map(|c| (c, Compiled::Fresh));
        };
        let name = cache.entry_name(wasm, self.engine.precompile_compatibility_hash());
        if let Some(bytes) = cache.load(&name) {
            // SAFETY: `deserialize` runs the bytes as native code. They are in memory (not a
            // mapping another process could change), and `CompileCache::load` returned them only
            // after checking their HMAC under this user's secret key over the entry's name (the
            // .wasm's SHA-256 and this engine's compatibility hash) and contents: they are what
            // `Component::serialize` produced in this process or another one of this user with
            // the same wasmtime and configuration. wasmtime also checks the header (version,
            // target, tunables) and refuses a mismatch.
            match unsafe { Component::deserialize(&self.engine, &bytes) } {
                Ok(c) => return Ok((c, Compiled::Cached)),
                Err(e) => tracing::debug!(entry = %name, "cache entry unusable ({e}); recompiling"),
            }
        }
        let component = self.compile_fresh(wasm)?;
        match component.serialize() {
            Ok(bytes) => cache.store(&name, &bytes),
            Err(e) => tracing::debug!("cannot serialize a compiled component: {e}"),
        }
        Ok((component, Compiled::Fresh))
    }

    fn compile_fresh(&self, wasm: &[u8]) -> Result<Component, String> {
        Component::new(&self.engine, wasm).map_err(|e| one_line(&format!("{e:#}")))
    }

    /// Stops and joins the epoch ticker and the timer runtime's thread (at shutdown, once no
    /// guest runs). Idempotent; dropping the engine does it too.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.ticker_thread.unpark();
        if let Some(t) = self.ticker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        // Nothing is spawned on it; its one thread parks on the timer driver and exits now.
        if let Some(rt) = self.timers.lock().unwrap_or_else(|e| e.into_inner()).take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

/// A guest call in progress ([`WasmEngine::running`]).
#[derive(Debug)]
pub struct Running<'a>(&'a WasmEngine);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The guard region after each linear memory slot.
pub(super) const GUARD: u64 = 64 << 10;
/// A fiber stack for `call_async` (wasm stack plus host frames).
pub(super) const ASYNC_STACK: usize = 1 << 20;
/// The wasm part of it.
const WASM_STACK: usize = 512 << 10;

/// Bytes reserved per linear memory slot for memories of up to `max_memory` bytes.
pub(super) fn reservation(max_memory: u64) -> u64 {
    max_memory.max(1 << 20).next_power_of_two()
}

/// Address space one pooled component instance reserves: its memory slots (reservation, guard
/// and the guard before it) and its fiber stack with its guard page.
pub fn address_space_per_instance(max_memory: u64) -> u64 {
    u64::from(MEMORIES_PER_COMPONENT) * (reservation(max_memory) + 2 * GUARD)
        + ASYNC_STACK as u64
        + 4096
}

/// The engine configuration. Benches build their baseline from this same function.
pub(super) fn config(sizing: Sizing) -> Config {
    let mut pool = PoolingAllocationConfig::default();
    let instances = sizing.instances.max(1);
    pool.total_component_instances(instances)
        .total_core_instances(instances * CORE_INSTANCES_PER_COMPONENT)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_memories(instances * MEMORIES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .total_tables(instances * TABLES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .total_stacks(instances)
        .max_memory_size(sizing.max_memory as usize);
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .concurrency_support(false)
        .memory_reservation(reservation(sizing.max_memory))
        .memory_guard_size(GUARD)
        .memory_reservation_for_growth(0)
        .max_wasm_stack(WASM_STACK)
        .async_stack_size(ASYNC_STACK)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// A multi-line wasmtime error as one line (`a: b: c`).
pub(super) fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}
