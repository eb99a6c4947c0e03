//! What became of one hook run, and the counters every outcome lands in.

use crate::event::EventKind;
use crate::stats::SinkCounts;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

/// How one hook run ended (or why it never started). Every variant is counted separately.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutcomeKind {
    /// Exit status 0.
    Ok,
    /// A non-zero exit status.
    Exit {
        /// The exit status.
        code: i32,
    },
    /// Killed by a signal it did not get from us (a crash, `kill -9` from elsewhere).
    Signal {
        /// The signal's number (`9` for SIGKILL).
        signal: i32,
    },
    /// Ran past its `timeout_ms`: its whole process group got SIGKILL.
    TimedOut {
        /// How long it ran before the kill, in milliseconds.
        after_ms: u64,
    },
    /// Never started: the program could not be resolved at load time, the payload file could
    /// not be written, or the spawn itself failed (missing file, not executable, bad cwd, …).
    SpawnFailed {
        /// What failed, for the operator.
        reason: String,
    },
    /// Still running when the shutdown deadline passed: its process group got SIGKILL.
    Killed,
    /// Not run: the hook or the whole table is disabled, or its matcher did not match.
    Skipped {
        /// Why it was skipped (`"disabled"`, or which matcher did not match the tool).
        reason: String,
    },
    /// Not run: never queued — the hook's queue was full (`"queue full"`) or shutdown had
    /// begun (`"shutdown"`).
    Dropped {
        /// `"queue full"` or `"shutdown"`.
        reason: String,
    },
    /// Queued but not started: the shutdown deadline passed, or the event came from a NATS
    /// partition whose lease this host lost (or let go stale) before the run could start.
    Cancelled,
}

impl OutcomeKind {
    /// Exit status 0.
    pub fn is_ok(&self) -> bool {
        matches!(self, OutcomeKind::Ok)
    }

    /// A run that happened (or was attempted) and did not succeed: exit, signal, timeout, spawn
    /// failure, killed at shutdown. Skipped, dropped and cancelled runs are not failures of the
    /// hook (they are counted, but `prx-hooks fire` exits 0 for them).
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            OutcomeKind::Exit { .. }
                | OutcomeKind::Signal { .. }
                | OutcomeKind::TimedOut { .. }
                | OutcomeKind::SpawnFailed { .. }
                | OutcomeKind::Killed
        )
    }
}

impl fmt::Display for OutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutcomeKind::Ok => f.write_str("ok"),
            OutcomeKind::Exit { code } => write!(f, "exit {code}"),
            OutcomeKind::Signal { signal } => write!(f, "signal {signal}"),
            OutcomeKind::TimedOut { after_ms } => write!(f, "timed out after {after_ms} ms"),
            OutcomeKind::SpawnFailed { reason } => write!(f, "spawn failed: {reason}"),
            OutcomeKind::Killed => f.write_str("killed at shutdown"),
            OutcomeKind::Skipped { reason } => write!(f, "skipped ({reason})"),
            OutcomeKind::Dropped { reason } => write!(f, "dropped ({reason})"),
            OutcomeKind::Cancelled => f.write_str("cancelled at shutdown"),
        }
    }
}

/// One hook run: what happened, how long it took, the end of its stderr.
///
/// `Display` is the line `prx-hooks fire` prints (docs/cli.md):
/// `hook audit tool_call: exit 3 (12.4 ms); stderr: "no such file"`.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    /// The hook's id.
    pub id: String,
    /// The kind of event the hook ran for.
    pub event: EventKind,
    /// The event's sequence number (per emitter; `fire` uses 0).
    pub seq: u64,
    /// The agent and session that emitted the event.
    pub agent: String,
    /// The session of that agent.
    pub session: String,
    /// Run by `run_once` / `run_matching` (`prx-hooks fire`, the API's test route) rather
    /// than for a pipeline event: kept in history and published, not counted.
    pub direct: bool,
    /// How the run ended, or why it never started.
    #[serde(flatten)]
    pub kind: OutcomeKind,
    /// From spawn to reaping (zero when the process never started).
    #[serde(
        rename = "duration_ms",
        serialize_with = "millis",
        deserialize_with = "from_millis"
    )]
    pub duration: Duration,
    /// The last ≤ 16 KiB of its stderr, decoded with replacement characters.
    pub stderr_tail: String,
    /// The process id (also its process group id), when it started.
    pub pid: Option<u32>,
    /// When it was started (or refused).
    #[serde(
        rename = "time",
        serialize_with = "rfc3339",
        deserialize_with = "from_rfc3339"
    )]
    pub started_at: SystemTime,
}

impl Outcome {
    /// An outcome without a process, for the event `msg` (`None`: no event context).
    pub(crate) fn not_run(
        id: &str,
        event: EventKind,
        kind: OutcomeKind,
        msg: Option<&crate::bus::Message>,
    ) -> Outcome {
        Outcome {
            id: id.to_string(),
            event,
            seq: msg.map_or(0, |m| m.seq()),
            agent: msg.map(|m| m.agent().to_string()).unwrap_or_default(),
            session: msg.map(|m| m.session().to_string()).unwrap_or_default(),
            direct: false,
            kind,
            duration: Duration::ZERO,
            stderr_tail: String::new(),
            pid: None,
            started_at: SystemTime::now(),
        }
    }

    /// The first line of the `Display` form, without the stderr tail: `hook audit tool_call:
    /// exit 3 (12.4 ms)` (what is logged at info; the tail goes to debug).
    pub fn headline(&self) -> String {
        let mut s = format!("hook {} {}: {}", self.id, self.event, self.kind);
        if self.pid.is_some() {
            s.push_str(&format!(" ({:.1} ms)", self.duration.as_secs_f64() * 1e3));
        }
        s
    }
}

/// At most this much of the stderr tail goes into the one-line `Display` form.
const DISPLAY_TAIL: usize = 512;

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.headline())?;
        let tail = self.stderr_tail.trim_end();
        if !tail.is_empty() {
            let mut start = tail.len().saturating_sub(DISPLAY_TAIL);
            while !tail.is_char_boundary(start) {
                start += 1;
            }
            let cut = if start > 0 { "…" } else { "" };
            write!(f, "; stderr: \"{cut}{}\"", tail[start..].escape_debug())?;
        }
        Ok(())
    }
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_micros(*t))
}

fn from_millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let ms = f64::deserialize(d)?;
    Duration::try_from_secs_f64(ms / 1e3).map_err(serde::de::Error::custom)
}

fn from_rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
}

/// The counters of one hook, or of the whole shell backend.
///
/// At every moment (each change is one step under one lock):
///
/// ```text
/// sent = ok + exit + signal + timed_out + spawn_failed + killed     (finished)
///      + dropped + cancelled                                         (never started)
///      + running + queued                                            (in flight)
/// ```
///
/// `sent` counts the runs the backend accepted responsibility for: every (event, hook) pair
/// whose hook was enabled and matched. `skipped` (disabled, matcher) is counted beside it, not in
/// it. Runs made through `run_once` / `run_matching` (`fire`, the HTTP test endpoint) are
/// recorded in the run history but not counted here: they are not pipeline deliveries.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HookCounts {
    /// Runs the backend accepted: every (event, hook) pair whose hook was enabled and matched.
    pub sent: u64,
    /// Runs that exited with status 0.
    pub ok: u64,
    /// Runs that exited with a non-zero status.
    pub exit: u64,
    /// Runs killed by a signal they did not get from the backend.
    pub signal: u64,
    /// Runs killed for passing their `timeout_ms`.
    pub timed_out: u64,
    /// Runs that never started because resolving, writing the payload or spawning failed.
    pub spawn_failed: u64,
    /// Still running at the shutdown deadline; killed.
    pub killed: u64,
    /// Never queued: `dropped_queue_full + dropped_shutdown`.
    pub dropped: u64,
    /// Dropped because the hook's queue was full (`queue_per_action` jobs waiting).
    pub dropped_queue_full: u64,
    /// Dropped because the event arrived after shutdown began.
    pub dropped_shutdown: u64,
    /// Still queued at the shutdown deadline; never started.
    pub cancelled: u64,
    /// Disabled (the hook or the table) or the matcher did not match. Not part of `sent`.
    pub skipped: u64,
    /// Started (or being started) and not reaped yet.
    pub running: u64,
    /// Waiting in the hook's queue.
    pub queued: u64,
}

impl HookCounts {
    /// The identity in the type's documentation.
    pub fn balanced(&self) -> bool {
        self.sent
            == self.ok
                + self.exit
                + self.signal
                + self.timed_out
                + self.spawn_failed
                + self.killed
                + self.dropped
                + self.cancelled
                + self.running
                + self.queued
    }

    /// The pipeline's view: delivered = ok; dropped = dropped + cancelled; failed = exit +
    /// signal + timed_out + spawn_failed + killed; in_flight = running + queued.
    pub fn sink_counts(&self) -> SinkCounts {
        SinkCounts {
            sent: self.sent,
            delivered: self.ok,
            dropped: self.dropped + self.cancelled,
            failed: self.exit + self.signal + self.timed_out + self.spawn_failed + self.killed,
            in_flight: self.running + self.queued,
        }
    }

    /// Counts one dropped run.
    pub(crate) fn drop(&mut self, why: DropReason) {
        self.dropped += 1;
        match why {
            DropReason::QueueFull => self.dropped_queue_full += 1,
            DropReason::Shutdown => self.dropped_shutdown += 1,
        }
    }

    /// Counts one finished run.
    pub(crate) fn finish(&mut self, kind: &OutcomeKind) {
        self.running -= 1;
        match kind {
            OutcomeKind::Ok => self.ok += 1,
            OutcomeKind::Exit { .. } => self.exit += 1,
            OutcomeKind::Signal { .. } => self.signal += 1,
            OutcomeKind::TimedOut { .. } => self.timed_out += 1,
            OutcomeKind::SpawnFailed { .. } => self.spawn_failed += 1,
            OutcomeKind::Killed => self.killed += 1,
            // Not outcomes of a process: counted where they happen, never here.
            OutcomeKind::Skipped { .. } | OutcomeKind::Dropped { .. } | OutcomeKind::Cancelled => {
                debug_assert!(false, "{kind} reported as a finished process");
                self.running += 1;
            }
        }
    }
}

impl crate::stats::Stats {
    /// The shell backend's section: per hook id its outcomes, queue and running counts.
    /// `None` without a workspace.
    pub fn shell(&self) -> Option<&ShellStats> {
        self.section(SHELL_SECTION)
    }
}

/// The key of the shell backend's section in [`Stats`](crate::Stats) and in its JSON.
pub(crate) const SHELL_SECTION: &str = "shell";

/// A snapshot of the shell backend's counters ([`ShellSink::stats`](super::ShellSink::stats)).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShellStats {
    /// Every hook together, including hooks since removed from the table.
    pub totals: HookCounts,
    /// Per hook id: the hooks of the current table, and removed ones that still had work in
    /// flight at the last reload. A hook removed and later re-added starts from zero.
    pub hooks: BTreeMap<String, HookCounts>,
    /// Processes started by `run_once` / `run_matching` that have not finished yet.
    pub direct_running: u64,
    /// Whether runs get cgroups (detected or configured at start), and if not why.
    pub cgroup: super::CgroupStatus,
    /// Shared slots in use: pipeline processes beyond each hook's first, capped by
    /// `ShellLimits::max_running` (a hook's first process is its reserved slot).
    pub shared_running: u64,
    /// The finished-runs hook point ([`ShellSink::subscribe_runs`](super::ShellSink::subscribe_runs)).
    pub run_feed: RunFeedStats,
    /// The file runs are kept in across restarts, when they are
    /// ([`ShellSink::keep_runs`](super::ShellSink::keep_runs)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_log: Option<super::RunLogCounts>,
}

/// Why an event was dropped for a hook (each counted apart in [`HookCounts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DropReason {
    /// The hook's queue held `queue_per_action` jobs.
    QueueFull,
    /// Delivered after shutdown began.
    Shutdown,
}

impl DropReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue full",
            DropReason::Shutdown => "shutdown",
        }
    }
}

/// The feed's counters, for [`ShellStats`](ShellStats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunFeedStats {
    /// Live subscriptions.
    pub subscribers: u64,
    /// Outcomes dropped because a subscription's queue was full (all subscriptions, ever).
    pub dropped: u64,
}
