//! Counters, and the snapshot [`Hooks::stats`](crate::Hooks::stats) returns.
//!
//! Nothing is lost silently: every event `emit` sees ends up in exactly one producer-side bucket,
//!
//! ```text
//! emitted = queued + dropped + dropped_budget + oversize + skipped
//! ```
//!
//! and for every sink, at any moment,
//!
//! ```text
//! sent = delivered + dropped + failed + in_flight     (in_flight is 0 after a drain)
//! ```
//!
//! Producer counters live on each emitter's own cache line (an `emit` never writes a line
//! another thread's `emit` writes, unless they share an emitter). Sink counters are updated in
//! one step under a small lock ([`SinkCounters`]), so a snapshot of a sink is always consistent
//! and the identity above holds exactly even while events flow.

use serde::Serialize;
use std::sync::Mutex;

/// A point-in-time view of the whole pipeline. Serializes to JSON (it is what `prx-hooks run`
/// prints at exit and what the HTTP API will serve).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Calls to `emit`.
    pub emitted: u64,
    /// Events accepted into the ring.
    pub queued: u64,
    /// Events refused because the ring was full.
    pub dropped: u64,
    /// Events refused because the large-event byte budget was exhausted.
    pub dropped_budget: u64,
    /// Events refused because they were larger than `max_event_bytes`.
    pub oversize: u64,
    /// Bytes (of copied event fields) of every refused event.
    pub dropped_bytes: u64,
    /// Events nobody listened to: not copied, not queued (`Emit::Skipped`).
    pub skipped: u64,
    /// Events the workers have taken from the ring and handed to the sinks.
    pub processed: u64,
    /// Panics caught inside a sink (each one is also logged).
    pub sink_panics: u64,
    pub ring: RingStats,
    /// One entry per sink, in pipeline order (`bus` first).
    pub sinks: Vec<SinkStats>,
    /// One entry per live bus subscription.
    pub subscribers: Vec<SubscriberStats>,
    /// hooks.json: reloads, errors (with the last error's text), the active table's size.
    /// `None` without a workspace.
    pub config: Option<crate::config::ConfigStats>,
    /// Shell hooks, per hook id: outcomes, queue and running counts. `None` without a workspace.
    pub shell: Option<crate::shell::ShellStats>,
    /// WASM plugins: per plugin its state and call outcomes; load errors. `None` without a
    /// workspace or without the `wasm` feature.
    pub plugins: Option<PluginsStats>,
}

/// The ring(s) between `emit` and the workers.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RingStats {
    /// Events in the rings now (queued, not yet processed).
    pub depth: u64,
    /// Slots, all rings together.
    pub capacity: u64,
    /// One ring per worker.
    pub shards: u64,
    /// Bytes of the inline slot buffers (preallocated).
    pub inline_bytes: u64,
    /// Bytes of larger events currently held against the byte budget.
    pub budget_in_use: u64,
    pub budget: u64,
}

/// What one sink did with the events it was given.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    pub name: String,
    #[serde(flatten)]
    pub counts: SinkCounts,
}

/// The counters of one sink. For the bus, `sent` counts (message, subscriber) pairs.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SinkCounts {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub failed: u64,
    pub in_flight: u64,
}

impl SinkCounts {
    /// `sent == delivered + dropped + failed + in_flight`.
    pub fn balanced(&self) -> bool {
        self.sent == self.delivered + self.dropped + self.failed + self.in_flight
    }
}

/// One bus subscription.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SubscriberStats {
    pub id: u64,
    pub pattern: String,
    /// Messages put into this subscriber's queue.
    pub delivered: u64,
    /// Messages this subscriber lost because its queue was full.
    pub dropped: u64,
    /// Messages waiting in its queue now.
    pub queued: u64,
    pub capacity: u64,
}

/// A sink's counters behind one small lock: every change is a single step, so the identity
/// `sent = delivered + dropped + failed + in_flight` holds in every snapshot, not just at rest.
/// Sinks take this lock once per event (not per byte or per subscriber), never on `emit`.
#[derive(Debug, Default)]
pub struct SinkCounters(Mutex<SinkCounts>);

impl SinkCounters {
    pub fn update(&self, f: impl FnOnce(&mut SinkCounts)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn get(&self) -> SinkCounts {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

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
    /// Components compiled, and loaded from the on-disk cache instead.
    pub compiled: u64,
    pub cache_hits: u64,
    /// Component instances the engine's pooling allocator holds (0: no engine yet).
    pub pool_instances: u64,
    /// The pool's largest linear memory, MiB.
    pub pool_max_memory_mb: u64,
}

/// One loaded plugin.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PluginStats {
    pub name: String,
    pub version: String,
    /// The declared event patterns (`prx.lifecycle.*`, …).
    pub events: Vec<String>,
    pub pool_size: u64,
    /// `running`, `suspended` (after repeated faults) or `stopped` (after shutdown).
    pub state: String,
    /// Milliseconds until a suspended plugin runs again.
    pub suspended_for_ms: Option<u64>,
    /// Events waiting in its queues.
    pub queued: u64,
    /// Bytes in its kv store.
    pub kv_bytes: u64,
    #[serde(flatten)]
    pub counts: PluginCounts,
}

/// One plugin's call counters. `sent = delivered + dropped + failed + in_flight` holds for the
/// lifecycle events the pipeline gave it; `ok`, `errors`, `traps`, `timeouts` and `out_of_fuel`
/// count every call (lifecycle events, subscribed topics and `fire`).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PluginCounts {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub failed: u64,
    pub in_flight: u64,
    /// Of `dropped`: its queue was full.
    pub dropped_queue_full: u64,
    /// Of `dropped`: it was suspended.
    pub dropped_suspended: u64,
    /// Of `dropped`: still queued at the shutdown deadline.
    pub dropped_shutdown: u64,
    pub ok: u64,
    /// The guest returned `Err(message)`.
    pub errors: u64,
    /// Traps (and instances that could not be created).
    pub traps: u64,
    pub timeouts: u64,
    pub out_of_fuel: u64,
    /// Calls for messages of its own `events.subscribe` subscriptions.
    pub topic_messages: u64,
    pub instances_created: u64,
    /// Instances thrown away after a trap, timeout or out-of-fuel.
    pub instances_replaced: u64,
    /// Times the breaker suspended it.
    pub suspensions: u64,
    /// The most recent failure, as `prx-hooks fire` words it.
    pub last_error: Option<String>,
}
