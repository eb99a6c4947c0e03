//! The plugin calls' feed: each finished `on-event` call for a pipeline event, offered to one
//! reader (the OpenTelemetry exporter, which makes it a child span of its event's span).
//!
//! Costs one relaxed load per call while nobody reads; with a reader, a `try_send` of the
//! event's message and the outcome (a full queue drops the record, counted in `missed`). The
//! executors never wait on it.

use super::plugin::CallOutcome;
use crate::bus::Message;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

/// One finished call.
pub(crate) struct PluginCall {
    pub plugin: Arc<str>,
    /// The event it was for (agent, session, seq, kind).
    pub msg: Message,
    pub outcome: CallOutcome,
    pub started_at: SystemTime,
    pub duration: Duration,
    /// The plugin's `max_execution_time_ms` (how a timeout is described).
    pub timeout_ms: u64,
}

#[derive(Default)]
pub(crate) struct CallFeed {
    tx: OnceLock<flume::Sender<PluginCall>>,
    live: AtomicBool,
    missed: AtomicU64,
}

impl CallFeed {
    /// The feed's one reader; `None` if there is one already.
    pub(crate) fn subscribe(&self, capacity: usize) -> Option<flume::Receiver<PluginCall>> {
        let (tx, rx) = flume::bounded(capacity.max(1));
        self.tx.set(tx).ok()?;
        self.live.store(true, Ordering::Release);
        Some(rx)
    }

    /// Whether a reader is there (calls are only timed and recorded then).
    pub(crate) fn active(&self) -> bool {
        self.live.load(Ordering::Relaxed)
    }

    pub(crate) fn publish(&self, call: PluginCall) {
        let Some(tx) = self.tx.get() else { return };
        match tx.try_send(call) {
            Ok(()) => {}
            Err(flume::TrySendError::Full(_)) => {
                self.missed.fetch_add(1, Ordering::Relaxed);
            }
            Err(flume::TrySendError::Disconnected(_)) => self.live.store(false, Ordering::Relaxed),
        }
    }

    /// Records dropped because the reader's queue was full.
    pub(crate) fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }
}
