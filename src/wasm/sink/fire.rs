//! [`WasmSink::fire`]: running one event on every plugin that declared it, and each one's answer.

use super::*;

/// One plugin's answer to [`WasmSink::fire`].
///
/// `Display` is the line `prx-hooks fire` prints: `plugin audit-hook: ok (0.4 ms)`,
/// `plugin x: error: <guest message> (…)`, `plugin x: timed out after 500 ms (…)`,
/// `plugin x: trap: … (…)`.
#[derive(Debug, Clone)]
pub struct FireOutcome {
    /// The plugin's name.
    pub plugin: String,
    /// The event it was called with.
    pub event: EventKind,
    /// `None`: no answer in time (its queue stayed full, or the call outlived its deadline by
    /// more than a second).
    pub outcome: Option<CallOutcome>,
    /// From the start of `fire` to its answer.
    pub duration: Duration,
    /// The plugin's `max_execution_time_ms`.
    pub timeout_ms: u64,
}

impl FireOutcome {
    /// Whether the plugin answered `Ok`.
    pub fn is_ok(&self) -> bool {
        self.outcome.as_ref().is_some_and(CallOutcome::is_ok)
    }

    fn words(&self) -> String {
        match &self.outcome {
            Some(o) => o.describe(self.timeout_ms),
            None => "no answer (its queue is full or it is stuck)".into(),
        }
    }
}

impl std::fmt::Display for FireOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {} {}: {} ({:.1} ms)",
            self.plugin,
            self.event,
            self.words(),
            self.duration.as_secs_f64() * 1e3
        )
    }
}

impl serde::Serialize for FireOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (outcome, message) = match &self.outcome {
            Some(CallOutcome::Ok) => ("ok", None),
            Some(CallOutcome::Error(m)) => ("error", Some(m.clone())),
            Some(CallOutcome::Trap(m)) | Some(CallOutcome::Instantiate(m)) => {
                ("trap", Some(m.clone()))
            }
            Some(CallOutcome::Timeout) => ("timed_out", None),
            Some(CallOutcome::OutOfFuel) => ("out_of_fuel", None),
            Some(CallOutcome::Suspended) => ("suspended", None),
            Some(CallOutcome::Busy(m)) => ("busy", Some(m.clone())),
            Some(CallOutcome::Aborted) => ("aborted", None),
            Some(CallOutcome::Interrupted { .. }) => ("interrupted", None),
            None => ("no_answer", None),
        };
        let mut st = s.serialize_struct("FireOutcome", 5)?;
        st.serialize_field("plugin", &self.plugin)?;
        st.serialize_field("event", &self.event)?;
        st.serialize_field("outcome", outcome)?;
        st.serialize_field("message", &message)?;
        st.serialize_field(
            "duration_ms",
            &((self.duration.as_secs_f64() * 1e6).round() / 1e3),
        )?;
        st.end()
    }
}

impl WasmSink {
    /// Runs `msg` once on every plugin that declared `kind` (even suspended ones), in parallel,
    /// and waits for each answer up to its `max_execution_time_ms` (plus a second).
    pub fn fire(&self, kind: EventKind, msg: &Message) -> Vec<FireOutcome> {
        let live = self.live.load_full();
        let started = Instant::now();
        let pending: Vec<_> = live
            .iter()
            .filter(|p| p.shared.manifest.events.contains(kind))
            .map(|p| {
                let timeout_ms = p.shared.manifest.resources.max_execution_time_ms;
                let wait = Duration::from_millis(timeout_ms) + Duration::from_secs(1);
                (
                    p.shared.name.to_string(),
                    timeout_ms,
                    wait,
                    p.submit_fire(msg.clone(), wait),
                )
            })
            .collect();
        pending
            .into_iter()
            .map(|(plugin, timeout_ms, wait, rx)| {
                let outcome = rx.and_then(|rx| {
                    let left = wait.saturating_sub(started.elapsed());
                    rx.recv_timeout(left).ok()
                });
                FireOutcome {
                    plugin,
                    event: kind,
                    outcome,
                    duration: started.elapsed(),
                    timeout_ms,
                }
            })
            .collect()
    }
}
