//! The plugin calls' feed: each finished `on-event` call for a pipeline event, offered to one
//! reader (the OpenTelemetry exporter, which makes it a child span of its event's span).
//!
//! Costs one relaxed load per call while nobody reads; with a reader, a `try_send` of the
//! event's message and the outcome (a full queue drops the record, counted in `missed`). The
//! executors never wait on it.

use crate::bus::Message;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

/// One finished call.
pub(crate) struct PluginCall {
    pub(crate) plugin: Arc<str>,
    /// The event it was for (agent, session, seq, kind).
    pub(crate) msg: Message,
    pub(crate) outcome: CallOutcome,
    pub(crate) started_at: SystemTime,
    pub(crate) duration: Duration,
    /// The plugin's `max_execution_time_ms` (how a timeout is described).
    pub(crate) timeout_ms: u64,
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

/// What one call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The guest returned `Ok`.
    Ok,
    /// The guest returned `Err(message)`.
    Error(String),
    /// The guest trapped (or a host call failed); the instance was replaced.
    Trap(String),
    /// It ran past `max_execution_time_ms`; the instance was replaced.
    Timeout,
    /// It used all of `max_fuel`; the instance was replaced.
    OutOfFuel,
    /// A fresh instance could not be created.
    Instantiate(String),
    /// The plugin is suspended after repeated faults; the event was dropped.
    Suspended,
    /// No instance could be had from the pool (every slot busy): the call did not run. Not
    /// the plugin's fault.
    Busy(String),
    /// Not run: stopped by shutdown, or the plugin was replaced or removed.
    Aborted,
    /// Stopped while running by shutdown (`shutdown: true`) or because the plugin was replaced
    /// or removed; the instance was replaced.
    Interrupted {
        /// Whether shutdown stopped it (else its plugin was replaced or removed).
        shutdown: bool,
    },
}

impl CallOutcome {
    /// Whether the guest was called (whatever came of it): what settles a consumed event's
    /// plugin call (`crate::settle`). Suspended, busy, not instantiated, aborted: not called.
    pub fn ran(&self) -> bool {
        !matches!(
            self,
            CallOutcome::Suspended
                | CallOutcome::Busy(_)
                | CallOutcome::Instantiate(_)
                | CallOutcome::Aborted
        )
    }
}

impl CallOutcome {
    /// A trap, timeout, out-of-fuel or failed instantiation: what trips the breaker.
    pub(crate) fn is_fault(&self) -> bool {
        matches!(
            self,
            CallOutcome::Trap(_)
                | CallOutcome::Timeout
                | CallOutcome::OutOfFuel
                | CallOutcome::Instantiate(_)
        )
    }

    /// `ok`, `error: …`, `timed out`, `trap: …`: the `prx-hooks fire` wording.
    pub fn describe(&self, timeout_ms: u64) -> String {
        match self {
            CallOutcome::Ok => "ok".into(),
            CallOutcome::Error(m) => format!("error: {m}"),
            CallOutcome::Trap(m) => format!("trap: {m}"),
            CallOutcome::Timeout => format!("timed out after {timeout_ms} ms"),
            CallOutcome::OutOfFuel => "trap: out of fuel (max_fuel in plugin.toml)".into(),
            CallOutcome::Instantiate(m) => format!("trap: cannot instantiate: {m}"),
            CallOutcome::Suspended => "suspended after repeated faults".into(),
            CallOutcome::Busy(m) => format!("not run: no free instance ({m})"),
            CallOutcome::Aborted => "not run: stopped by shutdown or reload".into(),
            CallOutcome::Interrupted { shutdown: true } => "interrupted by shutdown".into(),
            CallOutcome::Interrupted { shutdown: false } => {
                "interrupted: the plugin was replaced or removed".into()
            }
        }
    }

    /// Whether the call returned `Ok`.
    pub fn is_ok(&self) -> bool {
        *self == CallOutcome::Ok
    }
}
