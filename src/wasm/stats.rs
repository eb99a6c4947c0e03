//! The plugin backend's section of [`Stats`]: what `hooks.stats().plugins()` returns and what
//! `/api/stats` shows under `plugins`. Built without the `wasm` feature too (the section is then
//! always `None`), so the JSON keeps the same keys in every build.

use crate::stats::Stats;
use serde::Serialize;

impl Stats {
    /// The WASM plugin backend's section: per plugin its state and call outcomes; load
    /// errors. `None` without a workspace or without the `wasm` feature.
    pub fn plugins(&self) -> Option<&PluginsStats> {
        self.section(SECTION)
    }
}

/// The key of this section in [`Stats`] and in its JSON.
pub(crate) const SECTION: &str = "plugins";

/// The WASM plugin backend.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PluginsStats {
    /// Loaded plugins, by name.
    pub plugins: Vec<PluginStats>,
    /// Problems of the last load (`FILE:LINE:COL: key: reason`, or a compile error); a plugin
    /// whose new version fails keeps its old version running.
    pub errors: Vec<String>,
    /// Loads after the first that started or stopped a plugin (a plugin directory was added,
    /// changed or removed).
    pub reloads: u64,
    /// Components compiled.
    pub compiled: u64,
    /// Components loaded from the on-disk cache instead of compiled.
    pub cache_hits: u64,
    /// Component instances the engine's pooling allocator holds (0: no engine yet).
    pub pool_instances: u64,
    /// The pool's largest linear memory, MiB.
    pub pool_max_memory_mb: u64,
    /// Address space each pooled instance reserves (memory slots with their reservation and
    /// guards, and a fiber stack), MiB; `pool_instances` times this is the engine's total.
    pub address_space_per_instance_mb: u64,
    /// Whether compiled components are cached (the user's cache directory is usable).
    pub cache: bool,
    /// Warnings of the last load (unknown keys PRX ignores, a name that differs from its
    /// directory's, a directory without plugin.toml).
    pub warnings: Vec<String>,
    /// Plugins that are not hooks (`name: why`), left alone.
    pub skipped: Vec<String>,
}

/// One loaded plugin.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PluginStats {
    /// The plugin's name (`[plugin] name`).
    pub name: String,
    /// Its version (`[plugin] version`).
    pub version: String,
    /// The declared event patterns (`prx.lifecycle.*`, …).
    pub events: Vec<String>,
    /// Instances it runs at once (`[resources] pool_size`).
    pub pool_size: u64,
    /// `running`, `suspended` (after repeated faults) or `stopped` (after shutdown).
    pub state: String,
    /// Milliseconds until a suspended plugin runs again.
    pub suspended_for_ms: Option<u64>,
    /// Events waiting in its queues.
    pub queued: u64,
    /// Bytes in its kv store.
    pub kv_bytes: u64,
    /// Its call counters.
    #[serde(flatten)]
    pub counts: PluginCounts,
}

/// One plugin's call counters. `sent = delivered + dropped + failed + in_flight` holds for the
/// lifecycle events the pipeline gave it; `ok`, `errors`, `traps`, `timeouts` and `out_of_fuel`
/// count every call (lifecycle events, subscribed topics and `fire`).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PluginCounts {
    /// Lifecycle events the pipeline offered it.
    pub sent: u64,
    /// Of `sent`: calls that returned `Ok`.
    pub delivered: u64,
    /// Of `sent`: never called (see the `dropped_*` counters for why).
    pub dropped: u64,
    /// Of `sent`: calls that failed (an error, a trap, a timeout, out of fuel).
    pub failed: u64,
    /// Of `sent`: queued or running now.
    pub in_flight: u64,
    /// Of `dropped`: its queue was full.
    pub dropped_queue_full: u64,
    /// Of `dropped`: it was suspended.
    pub dropped_suspended: u64,
    /// Of `dropped`: still queued at the shutdown deadline.
    pub dropped_shutdown: u64,
    /// Of `dropped`: still queued when its version was replaced or removed.
    pub dropped_reload: u64,
    /// Of `dropped`: an event consumed from NATS that may no longer run on this host (its
    /// partition lease was lost, or another host took it: docs/nats.md), not called.
    pub dropped_fenced: u64,
    /// Calls that returned `Ok`.
    pub ok: u64,
    /// The guest returned `Err(message)`.
    pub errors: u64,
    /// Traps (and instances that could not be created).
    pub traps: u64,
    /// Calls that ran past `max_execution_time_ms`.
    pub timeouts: u64,
    /// Calls that used up `max_fuel`.
    pub out_of_fuel: u64,
    /// Calls for messages of its own `events.subscribe` subscriptions.
    pub topic_messages: u64,
    /// Instances created.
    pub instances_created: u64,
    /// Instances thrown away after a trap, timeout or out-of-fuel.
    pub instances_replaced: u64,
    /// Times the breaker suspended it.
    pub suspensions: u64,
    /// Calls not run because the engine's pool had no free instance (not counted as faults).
    pub busy: u64,
    /// Log lines (its `log` calls, stdout, stderr and the host's lines about it) dropped by
    /// the rate limit or a full log queue.
    pub log_dropped: u64,
    /// The most recent failure, as `prx-hooks fire` words it.
    pub last_error: Option<String>,
}
