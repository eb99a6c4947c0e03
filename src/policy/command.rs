//! Command policies: an existing guard script, written for an agent's command hooks, run
//! contained (the shell hooks' spawn, sanitized environment and process-tree kill) on the
//! deciding thread, its answer read in the agents' formats (docs/policies.md § Command
//! policies).
//!
//! What the guard gets on stdin: the payload the rules read (`tool`, `arguments`, every other
//! member), plus the names Claude Code, Codex and Gemini CLI give the same things
//! (`hook_event_name`, `tool_name`, `tool_input`). One object serves both kinds of guard: a
//! script written for those agents' command hooks reads it unchanged, and one written against
//! the lifecycle payload hooks receive reads it too.

use super::model::{
    CommandPolicy, Decision, DecisionPoint, OnError, SourceAnswer, SourceTrace, trace_into,
};
use crate::shell::capture::{self, Captured, Ended, SpawnOpts};
use crate::shell::env::ChildEnv;
use serde::Serialize;
use serde_json::{Map, Value};
use std::ffi::OsString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The most a guard may write to stdout: its answer. More is an oversized answer, its
/// process tree killed at once (`on_error`).
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The default deadline of a decision, and of each command policy without `timeout_ms`.
pub const DEFAULT_TIMEOUT_MS: u64 = 250;
/// The longest `timeout_ms` a command policy may have.
pub const MAX_TIMEOUT_MS: u64 = 30_000;
/// The most command policies one file may have (each decision may run all of them at once).
pub const MAX_COMMAND_POLICIES: usize = 16;

/// How one command policy's runs ended, counted since its id was first loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CommandCount {
    /// Its id.
    pub policy: String,
    /// Runs started (or tried).
    pub runs: u64,
    /// Answers: allow, ask, deny, no decision.
    pub allow: u64,
    /// See `allow`.
    pub ask: u64,
    /// See `allow`.
    pub deny: u64,
    /// See `allow`.
    pub none: u64,
    /// Killed at its deadline.
    pub timed_out: u64,
    /// Of `timed_out`: killed at the asker's deadline (`Prx-Decision-Deadline-Ms`,
    /// `Hooks::decide_within`), which came before its own (`timeout_ms`).
    pub cut_by_asker: u64,
    /// Exited with a code other than 0 or 2, or killed by a signal.
    pub crashed: u64,
    /// Wrote something on stdout that is not a JSON decision.
    pub bad_answer: u64,
    /// Wrote more than [`MAX_ANSWER_BYTES`] on stdout.
    pub too_large: u64,
    /// Could not be started.
    pub spawn_failed: u64,
    /// Killed unfinished because another source had already decided (a deny).
    pub cancelled: u64,
    /// Failures answered with `on_error: deny`.
    pub on_error_deny: u64,
    /// Decisions it was the reported policy of.
    pub decisions: u64,
}

/// The live counts behind a [`CommandCount`].
#[derive(Debug, Default)]
pub(crate) struct CommandCounters {
    runs: AtomicU64,
    allow: AtomicU64,
    ask: AtomicU64,
    deny: AtomicU64,
    none: AtomicU64,
    timed_out: AtomicU64,
    cut_by_asker: AtomicU64,
    crashed: AtomicU64,
    bad_answer: AtomicU64,
    too_large: AtomicU64,
    spawn_failed: AtomicU64,
    cancelled: AtomicU64,
    on_error_deny: AtomicU64,
    pub(crate) decisions: AtomicU64,
}

impl CommandCounters {
    fn count(&self, r: &Outcome, on_error: OnError) {
        let bump = |c: &AtomicU64| c.fetch_add(1, Ordering::Relaxed);
        bump(&self.runs);
        match r {
            Outcome::Answer(Some((Decision::Allow, _))) => {
                bump(&self.allow);
            }
            Outcome::Answer(Some((Decision::Ask, _))) => {
                bump(&self.ask);
            }
            Outcome::Answer(Some((Decision::Deny, _))) => {
                bump(&self.deny);
            }
            Outcome::Answer(None) => {
                bump(&self.none);
            }
            Outcome::Cancelled => {
                bump(&self.cancelled);
            }
            Outcome::Failed(f) => {
                if let Failure::TimedOut(_, true) = f {
                    bump(&self.cut_by_asker);
                }
                bump(match f {
                    Failure::TimedOut(..) => &self.timed_out,
                    Failure::Crashed(_) => &self.crashed,
                    Failure::BadAnswer(_) => &self.bad_answer,
                    Failure::TooLarge => &self.too_large,
                    Failure::SpawnFailed(_) => &self.spawn_failed,
                });
                if on_error == OnError::Deny {
                    bump(&self.on_error_deny);
                }
            }
        };
    }

    pub(crate) fn snapshot(&self, policy: &str) -> CommandCount {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CommandCount {
            policy: policy.to_string(),
            runs: get(&self.runs),
            allow: get(&self.allow),
            ask: get(&self.ask),
            deny: get(&self.deny),
            none: get(&self.none),
            timed_out: get(&self.timed_out),
            cut_by_asker: get(&self.cut_by_asker),
            crashed: get(&self.crashed),
            bad_answer: get(&self.bad_answer),
            too_large: get(&self.too_large),
            spawn_failed: get(&self.spawn_failed),
            cancelled: get(&self.cancelled),
            on_error_deny: get(&self.on_error_deny),
            decisions: get(&self.decisions),
        }
    }
}

/// Why a run gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    /// Killed after this long: its `timeout_ms`, or (`true`) the time the asker's deadline
    /// left it.
    TimedOut(Duration, bool),
    Crashed(String),
    BadAnswer(String),
    TooLarge,
    SpawnFailed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::TimedOut(t, false) => write!(f, "timed out after {} ms", t.as_millis()),
            Failure::TimedOut(t, true) => write!(
                f,
                "timed out after {} ms, the time left before the asker's deadline",
                t.as_millis()
            ),
            Failure::Crashed(why) => write!(f, "{why}"),
            Failure::BadAnswer(why) => write!(f, "answered {why}"),
            Failure::TooLarge => write!(
                f,
                "wrote more than {MAX_ANSWER_BYTES} bytes on stdout (the limit)"
            ),
            Failure::SpawnFailed(why) => write!(f, "spawn failed: {why}"),
        }
    }
}

/// How one run ended: an answer (`None`: no decision), a failure, or cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Answer(Option<(Decision, Option<String>)>),
    Failed(Failure),
    Cancelled,
}

/// One source's answer as the decision combines it.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) order: usize,
    pub(crate) decision: Decision,
    pub(crate) reason: String,
    pub(crate) policy: String,
    pub(crate) context: Option<String>,
    /// Which command policy (index in the table's `commands`), `None` for a rule.
    pub(crate) command: Option<usize>,
    /// Which WASM policy (index in the set asked), `None` for a rule or a command.
    pub(crate) plugin: Option<usize>,
}

/// What command policies run with: the spawn's shared state for the workspace and the
/// environment's parent share.
pub(crate) struct Runner {
    opts: Result<SpawnOpts, String>,
    base_env: Vec<(OsString, OsString)>,
    /// The hooks' default rlimits, applied to every guard.
    rlimits: Vec<crate::shell::Rlimit>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner").finish_non_exhaustive()
    }
}

impl Runner {
    /// Guards run in `workspace` under `rlimits` (the hooks' default ones).
    pub(crate) fn new(workspace: &std::path::Path, rlimits: Vec<crate::shell::Rlimit>) -> Runner {
        Runner {
            opts: SpawnOpts::new(workspace).map_err(|e| format!("cannot prepare spawns: {e}")),
            base_env: crate::shell::env::parent_env(&[], crate::config::SANITIZED_PATH),
            rlimits,
        }
    }

    /// Runs every command in `run` (indices into `commands`) at once and collects their
    /// answers. A deny ends the wait once every command before it in file order has answered
    /// (the others are killed, counted as cancelled). Each command is killed at its own
    /// `timeout_ms` or at `until` (the decision's deadline, when the asker gave one),
    /// whichever comes first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_all(
        &self,
        commands: &[CommandPolicy],
        run: &[usize],
        point: DecisionPoint,
        agent: &str,
        payload: &Value,
        counters: &[std::sync::Arc<CommandCounters>],
        until: Option<Instant>,
        trace: Option<&SourceTrace>,
    ) -> Vec<Answer> {
        let stdin = stdin_payload(point, payload);
        let stdin = serde_json::to_vec(&stdin).unwrap_or_default();
        let start = Instant::now();
        let one = |i: usize, cancel: Option<std::os::fd::RawFd>| {
            let c = &commands[i];
            let began = Instant::now();
            let outcome = self.run_one(c, point, agent, &stdin, (start, until), cancel);
            let elapsed = began.elapsed();
            if let Some(k) = counters.get(i) {
                k.count(&outcome, c.on_error);
            }
            let said = trace.map(|_| describe(&outcome, c.on_error));
            let a = answer(c, outcome).map(|mut a| {
                a.command = Some(i);
                a
            });
            if let Some(outcome) = said {
                trace_into(
                    trace,
                    SourceAnswer {
                        policy: c.id.clone(),
                        source: "command",
                        decision: a.as_ref().map(|a| a.decision),
                        outcome,
                        elapsed,
                    },
                );
            }
            (i, a)
        };
        if let [i] = run {
            return one(*i, None).1.into_iter().collect();
        }
        let cancel = capture::eventfd().ok();
        let cancel_fd = cancel.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut answers = Vec::new();
        std::thread::scope(|s| {
            for &i in run {
                let tx = tx.clone();
                let one = &one;
                s.spawn(move || {
                    let _ = tx.send(one(i, cancel_fd));
                });
            }
            drop(tx);
            let mut pending: Vec<usize> = run.iter().map(|&i| commands[i].order).collect();
            for (i, a) in rx {
                pending.retain(|&o| o != commands[i].order);
                let decisive = a.as_ref().is_some_and(|a| {
                    a.decision == Decision::Deny && pending.iter().all(|&o| o > a.order)
                });
                answers.extend(a);
                if decisive {
                    if let Some(fd) = cancel_fd {
                        capture::signal_eventfd(fd);
                    }
                    break;
                }
            }
        });
        answers
    }

    fn run_one(
        &self,
        c: &CommandPolicy,
        point: DecisionPoint,
        agent: &str,
        stdin: &[u8],
        (start, until): (Instant, Option<Instant>),
        cancel: Option<std::os::fd::RawFd>,
    ) -> Outcome {
        let opts = match &self.opts {
            Ok(o) => o,
            Err(e) => return Outcome::Failed(Failure::SpawnFailed(e.clone())),
        };
        // Its own deadline, or the decision's when that comes first.
        let own = start + c.timeout;
        let (deadline, cut) = match until {
            Some(u) if u < own => (u, Some(u.saturating_duration_since(start))),
            _ => (own, None),
        };
        let timed_out = || Failure::TimedOut(cut.unwrap_or(c.timeout), cut.is_some());
        if Instant::now() >= deadline {
            // No time left: nothing is started.
            return Outcome::Failed(timed_out());
        }
        let env = ChildEnv::with_extra(
            &self.base_env,
            &[
                ("ZERO_HOOK_POLICY", &c.id),
                ("ZERO_HOOK_EVENT", point.as_str()),
                ("ZERO_HOOK_AGENT", agent),
            ],
        );
        let captured = capture::run(&capture::Run {
            action: &c.action,
            env: &env,
            opts,
            stdin,
            deadline,
            max_stdout: MAX_ANSWER_BYTES,
            cancel,
            rlimits: &self.rlimits,
        });
        outcome(captured, timed_out)
    }
}

/// The guard's stdin: the payload, with the agents' command-hook names added where missing.
fn stdin_payload(point: DecisionPoint, payload: &Value) -> Value {
    let mut obj = match payload {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let event = match point {
        DecisionPoint::ToolCallStart => "PreToolUse",
        DecisionPoint::Prompt => "UserPromptSubmit",
        DecisionPoint::Permission => "PermissionRequest",
    };
    obj.entry("hook_event_name")
        .or_insert_with(|| Value::String(event.into()));
    if let Some(t) = obj.get("tool").cloned() {
        obj.entry("tool_name").or_insert(t);
    }
    if let Some(a) = obj.get("arguments").cloned() {
        obj.entry("tool_input").or_insert(a);
    }
    Value::Object(obj)
}

/// A finished run read as an answer: exit 2 denies with stderr as the reason; exit 0 answers
/// with its stdout (nothing: no decision); anything else failed.
/// `timed_out` says how a run killed at its deadline failed.
fn outcome(cap: Captured, timed_out: impl FnOnce() -> Failure) -> Outcome {
    match cap.ended {
        Ended::Cancelled => Outcome::Cancelled,
        Ended::TimedOut => Outcome::Failed(timed_out()),
        Ended::TooLarge => Outcome::Failed(Failure::TooLarge),
        Ended::SpawnFailed(e) => Outcome::Failed(Failure::SpawnFailed(e)),
        Ended::Signaled(sig) => Outcome::Failed(Failure::Crashed(format!(
            "was killed by signal {sig}{}",
            stderr_note(&cap.stderr)
        ))),
        Ended::Exited(2) => {
            let reason = String::from_utf8_lossy(&cap.stderr).trim().to_string();
            Outcome::Answer(Some((
                Decision::Deny,
                (!reason.is_empty()).then_some(reason),
            )))
        }
        Ended::Exited(0) => match read_answer(&cap.stdout) {
            Ok(a) => Outcome::Answer(a),
            Err(why) => Outcome::Failed(Failure::BadAnswer(why)),
        },
        Ended::Exited(code) => Outcome::Failed(Failure::Crashed(format!(
            "exited with code {code}{}",
            stderr_note(&cap.stderr)
        ))),
    }
}

/// How a run ended, in words (`policy test --run-guards`).
fn describe(outcome: &Outcome, on_error: OnError) -> String {
    match outcome {
        Outcome::Answer(Some(_)) => "answered".into(),
        Outcome::Answer(None) => "answered nothing".into(),
        Outcome::Cancelled => "cancelled: a deny before it decided".into(),
        Outcome::Failed(f) => format!("failed: {f}; on_error is {}", on_error.as_str()),
    }
}

fn stderr_note(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let last = text.lines().rev().find(|l| !l.trim().is_empty());
    match last {
        Some(l) => format!(" ({})", crate::config::one_line(l.trim())),
        None => String::new(),
    }
}

/// The answer an outcome gives, `on_error` applied.
fn answer(c: &CommandPolicy, outcome: Outcome) -> Option<Answer> {
    let (decision, reason) = match outcome {
        Outcome::Answer(Some((d, r))) => {
            (d, r.unwrap_or_else(|| format!("{d} by policy {}", c.id)))
        }
        Outcome::Answer(None) | Outcome::Cancelled => return None,
        Outcome::Failed(f) => {
            tracing::warn!(policy = %c.id, "command policy {}: {f}", crate::config::quote(&c.id));
            match c.on_error {
                OnError::None => return None,
                OnError::Deny => (
                    Decision::Deny,
                    format!("policy {} failed ({f}); on_error is deny", c.id),
                ),
            }
        }
    };
    Some(Answer {
        order: c.order,
        decision,
        reason,
        policy: c.id.clone(),
        context: None,
        command: None,
        plugin: None,
    })
}

/// A guard's stdout as a decision, in the formats the agents document: Claude Code's and
/// Codex's `hookSpecificOutput.permissionDecision` (PreToolUse) and
/// `hookSpecificOutput.decision.behavior` (PermissionRequest); the top-level
/// `{"decision": "deny" | "block" | "allow" | "approve" | "ask", "reason"}` (Claude Code's
/// older form, UserPromptSubmit's block, Gemini CLI's); Cursor's `{"permission", "user_message"}`;
/// `{"continue": false, "stopReason"}` as a deny. Empty stdout, or an object with none of
/// these: no decision. Anything else is a bad answer (`Err` says what).
fn read_answer(stdout: &[u8]) -> Result<Option<(Decision, Option<String>)>, String> {
    let text = std::str::from_utf8(stdout).map_err(|_| "stdout that is not UTF-8".to_string())?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text.trim()).map_err(|e| {
        let head: String = text.trim().chars().take(60).collect();
        format!("{} on stdout, not JSON ({e})", crate::config::quote(&head))
    })?;
    let Value::Object(obj) = value else {
        return Err("a JSON value on stdout that is not an object".into());
    };
    let text_of =
        |o: &Map<String, Value>, k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
    let named = |s: &str, field: &str| -> Result<Decision, String> {
        match s {
            "allow" | "approve" => Ok(Decision::Allow),
            "ask" => Ok(Decision::Ask),
            "deny" | "block" => Ok(Decision::Deny),
            other => Err(format!(
                "{field} {} (expected allow, ask or deny)",
                crate::config::quote(other)
            )),
        }
    };
    if let Some(Value::Object(specific)) = obj.get("hookSpecificOutput") {
        if let Some(d) = specific.get("permissionDecision").and_then(Value::as_str) {
            let reason = text_of(specific, "permissionDecisionReason");
            return Ok(Some((named(d, "permissionDecision")?, reason)));
        }
        if let Some(Value::Object(d)) = specific.get("decision")
            && let Some(b) = d.get("behavior").and_then(Value::as_str)
        {
            return Ok(Some((
                named(b, "decision.behavior")?,
                text_of(d, "message"),
            )));
        }
    }
    if let Some(d) = obj.get("decision").and_then(Value::as_str) {
        return Ok(Some((named(d, "decision")?, text_of(&obj, "reason"))));
    }
    if let Some(p) = obj.get("permission").and_then(Value::as_str) {
        let reason = text_of(&obj, "user_message").or_else(|| text_of(&obj, "agent_message"));
        return Ok(Some((named(p, "permission")?, reason)));
    }
    if obj.get("continue") == Some(&Value::Bool(false)) {
        return Ok(Some((Decision::Deny, text_of(&obj, "stopReason"))));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str) -> Result<Option<(Decision, Option<String>)>, String> {
        read_answer(s.as_bytes())
    }

    #[test]
    fn answers_in_each_agents_format() {
        let deny = Some((Decision::Deny, Some("no".to_string())));
        assert_eq!(
            read(
                r#"{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "no"}}"#
            ),
            Ok(deny.clone())
        );
        assert_eq!(
            read(r#"{"hookSpecificOutput": {"decision": {"behavior": "deny", "message": "no"}}}"#),
            Ok(deny.clone())
        );
        assert_eq!(
            read(r#"{"decision": "block", "reason": "no"}"#),
            Ok(deny.clone())
        );
        assert_eq!(
            read(r#"{"permission": "deny", "user_message": "no"}"#),
            Ok(deny.clone())
        );
        assert_eq!(read(r#"{"continue": false, "stopReason": "no"}"#), Ok(deny));
        assert_eq!(
            read(r#"{"decision": "approve"}"#),
            Ok(Some((Decision::Allow, None)))
        );
        assert_eq!(read("  \n"), Ok(None));
        assert_eq!(read(r#"{"suppressOutput": true}"#), Ok(None));
        assert!(read("deny").unwrap_err().contains("not JSON"));
        assert!(
            read(r#"{"decision": "maybe"}"#)
                .unwrap_err()
                .contains("\"maybe\"")
        );
        assert!(read("[1]").unwrap_err().contains("not an object"));
    }

    #[test]
    fn stdin_carries_both_the_lifecycle_and_the_agents_names() {
        let p = serde_json::json!({"tool": "Bash", "arguments": {"command": "ls"}});
        let s = stdin_payload(DecisionPoint::ToolCallStart, &p);
        assert_eq!(s["hook_event_name"], "PreToolUse");
        assert_eq!(s["tool_name"], "Bash");
        assert_eq!(s["tool_input"]["command"], "ls");
        assert_eq!(s["arguments"]["command"], "ls");
        let gemini =
            serde_json::json!({"hook_event_name": "BeforeTool", "tool": "run_shell_command"});
        assert_eq!(
            stdin_payload(DecisionPoint::ToolCallStart, &gemini)["hook_event_name"],
            "BeforeTool"
        );
    }
}
