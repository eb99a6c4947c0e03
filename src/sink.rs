//! The [`Sink`] trait: what the workers hand each batch of messages to (ARCHITECTURE.md §
//! Data flow).

use crate::event::{EventKind, EventMask};
use crate::message::Message;
use crate::stats::SinkCounts;
use std::time::Instant;

/// A backend that receives serialized events: the bus, shell hooks, WASM plugins.
pub trait Sink: Send + Sync {
    /// A short stable name for stats (`bus`, `shell`, `wasm`).
    fn name(&self) -> &str;

    /// Takes one event. Called on a pipeline worker, so it must not block: enqueue and return.
    /// Called only for events this sink's [`InterestHandle`](crate::InterestHandle) says it wants.
    fn deliver(&self, msg: &Message);

    /// Takes a batch of events in order (workers hand them over up to 64 at a time, so
    /// a sink can pay its fixed costs once per batch). The batch may hold events the sink does
    /// not want: `wanted` is its interest mask when the batch was taken.
    fn deliver_batch(&self, msgs: &[Message], wanted: EventMask) {
        for msg in msgs {
            if msg.event().is_some_and(|k| wanted.contains(k)) {
                self.deliver(msg);
            }
        }
    }

    /// This sink's counters; `sent = delivered + dropped + failed + in_flight` must hold.
    fn counts(&self) -> SinkCounts;

    /// Whether `more` events of `kind` would be taken now rather than dropped for a full
    /// queue: the NATS consumer's per-message back-pressure (ARCHITECTURE.md § NATS bridge).
    /// Default: always.
    fn room(&self, kind: EventKind, more: usize) -> bool {
        let _ = (kind, more);
        true
    }

    /// Whether a producer that paces itself so as to lose nothing (a file replay:
    /// `IngestOptions::wait_for_room`) should wait before it emits more, for work this sink
    /// took and has not finished that its `in_flight` does not show (an exporter's queue of
    /// spans). `coming` is how many events the rings hold that no sink has been handed yet.
    /// `emit` and the live inputs never look at it. Default: never.
    fn lagging(&self, coming: usize) -> bool {
        let _ = coming;
        false
    }

    /// For a producer that paces itself so as to lose nothing: `(free, capacity)` of this
    /// sink's tightest bounded queue (a hook's run queue, a plugin's shard), so that it emits
    /// no more events before it looks again than that queue can still take. `None`: no
    /// bounded queue. Matchers and event kinds are not looked at: every event may land in it.
    /// Default: `None`.
    fn headroom(&self) -> Option<(usize, usize)> {
        None
    }

    /// Finishes queued work, stopping what still runs at `deadline` — the contract every sink
    /// keeps (ARCHITECTURE.md § Shutdown):
    ///
    /// * It is called once, after the workers have stopped: no `deliver` follows it. Every
    ///   sink's `shutdown` runs at the same time as the others', on a thread of its own, with
    ///   the same absolute deadline.
    /// * Until the deadline the sink finishes what it can. At the deadline it stops everything
    ///   still running (processes killed and reaped, guest calls interrupted), counts each job
    ///   still queued as dropped (reason `shutdown`) and each job stopped while running as
    ///   failed, removes its temporary files and joins its threads.
    /// * It returns by `deadline + SHUTDOWN_SLACK` whatever its hooks or guests do (ignore
    ///   SIGTERM, hold pipes open, loop, sleep in a host call), and keeps no thread or child
    ///   alive afterwards.
    /// * Afterwards [`Sink::counts`] has `in_flight == 0`, so `sent == delivered + dropped +
    ///   failed`.
    fn shutdown(&self, deadline: Instant) {
        let _ = deadline;
    }
}
