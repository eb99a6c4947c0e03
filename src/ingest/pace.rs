//! Back-pressure for producers that must not lose events to their own speed (a file replay):
//! they wait while the pipeline is busy; `emit` itself never waits.

use crate::Hooks;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A backend holding this many jobs (queued or running) counts as busy.
pub(crate) const SINK_BUSY: u64 = 128;

/// How long one wait for room sleeps before looking again.
pub(crate) const NAP: Duration = Duration::from_micros(200);

/// Whether an event of `bytes` (0: one that fits inline) should wait: a ring more than a
/// quarter full, the byte budget too full to take it (more than half of it in use with it
/// counted, unless it is empty), a bus subscriber more than half full, a backend with
/// [`SINK_BUSY`] jobs, or one [lagging](crate::Sink::lagging) with what the rings hold still
/// to come (an exporter's queue).
pub(crate) fn busy(hooks: &Hooks, bytes: usize) -> bool {
    if hooks.pipeline.rings().any(|r| r.len() > r.capacity() / 4) {
        return true;
    }
    if bytes > 0 {
        let (budget, used) = hooks.producers.budget();
        if used > 0 && used.saturating_add(bytes) > budget / 2 {
            return true;
        }
    }
    let coming = hooks.pipeline.rings().map(|r| r.len()).sum();
    hooks
        .pipeline
        .sinks()
        .iter()
        .any(|s| s.counts().in_flight >= SINK_BUSY || s.lagging(coming))
        || hooks
            .bus
            .subscribers()
            .iter()
            .any(|s| s.queued > s.capacity / 2)
}

/// Whether the pipeline has begun shutting down (nothing more will be delivered).
pub(crate) fn closed(hooks: &Hooks) -> bool {
    hooks.pipeline.rings().any(|r| r.is_closed())
}

/// The most events a pacing producer emits between two looks at the pipeline.
pub(crate) const PACE_LINES: usize = 64;

/// How many events may be emitted now before the pipeline is looked at again: 0 while
/// [`busy`]; else at most [`PACE_LINES`], and no more than the tightest bounded queue of any
/// backend ([`Sink::headroom`](crate::Sink::headroom)) can still take with what the rings hold,
/// less a worker's batch in hand (events it has taken from its ring and not yet handed over).
/// An empty queue with nothing coming takes one event, however small it is.
pub(crate) fn allowance(hooks: &Hooks, bytes: usize) -> usize {
    if busy(hooks, bytes) {
        return 0;
    }
    let coming: usize = hooks.pipeline.rings().map(|r| r.len()).sum();
    headroom_allowance(hooks.pipeline.sinks(), coming, PACE_LINES)
}

/// At most `most`, and no more than the tightest bounded queue of any backend
/// ([`Sink::headroom`](crate::Sink::headroom)) can still take with the `coming` events the
/// rings hold, less a worker's batch in hand. An empty queue with nothing coming takes one
/// event.
pub(crate) fn headroom_allowance(
    sinks: &[std::sync::Arc<dyn crate::Sink>],
    coming: usize,
    most: usize,
) -> usize {
    let mut allowed = most;
    for sink in sinks {
        if let Some((free, cap)) = sink.headroom() {
            let margin = crate::pipeline::BATCH.min(cap / 4);
            let mut room = free.saturating_sub(coming + margin);
            if room == 0 && free == cap && coming == 0 {
                room = 1;
            }
            allowed = allowed.min(room);
        }
    }
    allowed
}

/// Waits until events may be emitted ([`allowance`]) and returns how many, or returns 1 once
/// the pipeline shuts down or `stop` is set (a reader told to stop by a signal must not wait
/// for a pipeline that only closes after it has stopped).
pub(crate) fn wait_for_room(hooks: &Hooks, bytes: usize, stop: Option<&AtomicBool>) -> usize {
    loop {
        if closed(hooks) || stopped(stop) {
            return 1;
        }
        match allowance(hooks, bytes) {
            0 => std::thread::sleep(NAP),
            n => return n,
        }
    }
}

/// Whether `stop` is set.
pub(crate) fn stopped(stop: Option<&AtomicBool>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::Acquire))
}
