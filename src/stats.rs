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
use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};

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
    /// `emit_with_extras` calls refused for their extra fields (an `Err` to the caller; not
    /// emits, so outside the identity above).
    pub refused_extras: u64,
    /// Events the workers have taken from the ring for the sinks (counted before the sinks see
    /// them: a received bus message is always counted here).
    pub processed: u64,
    /// Queued events that shutdown's deadline left undelivered: still in a ring when the
    /// deadline passed, counted here instead of being handed to the sinks. After shutdown,
    /// `queued = processed + dropped_shutdown` (before it, the rest is `ring.depth`).
    pub dropped_shutdown: u64,
    /// Panics caught inside a sink (each one is also logged).
    pub sink_panics: u64,
    /// The rings between the emitters and the workers.
    pub ring: RingStats,
    /// One entry per sink, in pipeline order (`bus` first).
    pub sinks: Vec<SinkStats>,
    /// One entry per live bus subscription.
    pub subscribers: Vec<SubscriberStats>,
    /// The backends' own sections (`config`, `shell`, `plugins`), serialized under their names
    /// after the fields above and read back typed with [`Stats::section`] (or the backends'
    /// accessors: `stats.shell()`, `stats.plugins()`, `stats.config()`). The core does not know
    /// their types: arrows point into it, never out of it.
    #[serde(flatten)]
    sections: Sections,
}

impl Stats {
    /// Adds (or replaces) a backend's section. `None` still writes the key (as `null`), so the
    /// JSON keeps the same keys whether or not the backend runs.
    pub fn set_section<T: Section>(&mut self, name: &'static str, section: Option<T>) {
        let section = section.map(|s| Arc::new(s) as Arc<dyn Section>);
        match self.sections.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = section,
            None => self.sections.0.push((name, section)),
        }
    }

    /// A backend's section, typed; `None` when it is absent or of another type.
    pub fn section<T: Section>(&self, name: &str) -> Option<&T> {
        let (_, section) = self.sections.0.iter().find(|(n, _)| *n == name)?;
        let any: &dyn Any = section.as_deref()?;
        any.downcast_ref()
    }

    /// The names of the sections present, in serialization order.
    pub fn section_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.sections.0.iter().map(|(n, _)| *n)
    }
}

/// A backend's part of [`Stats`]: any serializable, comparable snapshot type. Implemented for
/// every type that qualifies; backends do not implement it by hand.
pub trait Section: Any + fmt::Debug + Send + Sync {
    /// The section as JSON (what `/api/stats` and `run`'s exit line show under its name).
    fn to_json(&self) -> serde_json::Value;
    /// Equality across the type erasure (snapshots compare equal when their sections do).
    fn eq_section(&self, other: &dyn Section) -> bool;
}

impl<T: Serialize + PartialEq + fmt::Debug + Send + Sync + 'static> Section for T {
    fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    fn eq_section(&self, other: &dyn Section) -> bool {
        let other: &dyn Any = other;
        other.downcast_ref::<T>() == Some(self)
    }
}

/// The sections of a snapshot, in the order they were added.
#[derive(Clone, Default)]
struct Sections(Vec<(&'static str, Option<Arc<dyn Section>>)>);

impl fmt::Debug for Sections {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(n, s)| (n, s)))
            .finish()
    }
}

impl PartialEq for Sections {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|((na, a), (nb, b))| {
                na == nb
                    && match (a, b) {
                        (Some(a), Some(b)) => a.eq_section(&**b),
                        (None, None) => true,
                        _ => false,
                    }
            })
    }
}

impl Eq for Sections {}

impl Serialize for Sections {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, section) in &self.0 {
            map.serialize_entry(name, &section.as_ref().map(|s| s.to_json()))?;
        }
        map.end()
    }
}

/// The ring(s) between `emit` and the workers.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RingStats {
    /// Events queued and not yet counted as processed (or `dropped_shutdown`): in the rings,
    /// or being taken from them. `queued = processed + dropped_shutdown + depth` in every
    /// snapshot.
    pub depth: u64,
    /// Slots, all rings together.
    pub capacity: u64,
    /// One ring per worker.
    pub shards: u64,
    /// Bytes of the inline slot buffers (preallocated).
    pub inline_bytes: u64,
    /// Bytes of larger events currently held against the byte budget.
    pub budget_in_use: u64,
    /// The byte budget for larger events, all rings together, in bytes.
    pub budget: u64,
}

/// What one sink did with the events it was given.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SinkStats {
    /// The sink's name (`bus`, `shell`, …).
    pub name: String,
    /// Its counters.
    #[serde(flatten)]
    pub counts: SinkCounts,
}

/// The counters of one sink. For the bus, `sent` counts (message, subscriber) pairs.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SinkCounts {
    /// Events the sink was given and accepted responsibility for.
    pub sent: u64,
    /// Of those, the ones it delivered.
    pub delivered: u64,
    /// Of those, the ones it gave up on undelivered (a full queue, shutdown).
    pub dropped: u64,
    /// Of those, the ones whose delivery was tried and failed.
    pub failed: u64,
    /// Of those, the ones not concluded yet.
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
    /// The subscription's id, unique for the life of the bus.
    pub id: u64,
    /// The subject pattern it subscribed with.
    pub pattern: String,
    /// Messages put into this subscriber's queue.
    pub delivered: u64,
    /// Messages this subscriber lost because its queue was full.
    pub dropped: u64,
    /// Messages waiting in its queue now.
    pub queued: u64,
    /// The most messages its queue holds.
    pub capacity: u64,
}

/// A sink's counters behind one small lock: every change is a single step, so the identity
/// `sent = delivered + dropped + failed + in_flight` holds in every snapshot, not just at rest.
/// Sinks take this lock once per event (not per byte or per subscriber), never on `emit`.
#[derive(Debug, Default)]
pub struct SinkCounters(Mutex<SinkCounts>);

impl SinkCounters {
    /// Changes the counters in one step, under the lock.
    pub fn update(&self, f: impl FnOnce(&mut SinkCounts)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// A consistent snapshot of the counters.
    pub fn get(&self) -> SinkCounts {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
