//! The decision lane's entry points on [`Hooks`]: asked in-process, answered from the
//! policies in force without touching the ring, a worker, a hook or a plugin
//! (docs/policies.md).

use super::*;
use crate::policy::{DecideError, DecisionPoint, PolicyTable, Verdict};

impl Hooks {
    /// Asks the policies in force (`<workspace>/policies.json`) whether `agent` may go on at
    /// `point`, with `payload` the lifecycle payload as hooks receive it (JSON text:
    /// `{"tool": "Bash", "arguments": {"command": "…"}}` for a tool). `Ok` with
    /// [`Verdict::decision`] `None` when no policy decides; `Err` (nothing decided) for a
    /// payload over [`MAX_PAYLOAD_BYTES`](crate::policy::MAX_PAYLOAD_BYTES) or not a JSON
    /// object. Every answer is counted ([`Stats::policies`]). Nothing is emitted: the agent
    /// sends its event as usual. Rules answer first; command policies the question selects
    /// then run as processes on this thread (several at once on threads of their own), each
    /// bounded by its `timeout_ms` (docs/policies.md § Command policies), and the WASM
    /// policies in force are called on this thread, one after another, each bounded by its
    /// `timeout_ms` (docs/policies.md § WASM policies): from an async executor, call it where
    /// blocking is allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::{Decision, DecisionPoint};
    /// let ws = std::env::temp_dir().join(format!("prx-hooks-doc-decide-{}", std::process::id()));
    /// std::fs::create_dir_all(&ws)?;
    /// std::fs::write(ws.join("policies.json"), r#"{"policies": [
    ///   {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell",
    ///    "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
    ///    "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}]}"#)?;
    /// let hooks = prx_hooks::Hooks::builder().workspace(&ws).build()?;
    /// let v = hooks.decide(DecisionPoint::ToolCallStart, "my-agent",
    ///     r#"{"tool": "shell", "arguments": {"command": "rm -rf build"}}"#)?;
    /// assert_eq!(v.decision, Some(Decision::Deny));
    /// assert_eq!(v.reason.as_deref(), Some("rm -rf is not allowed in this workspace"));
    /// hooks.shutdown(std::time::Duration::from_secs(2));
    /// # std::fs::remove_dir_all(&ws)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &str,
    ) -> Result<Verdict, DecideError> {
        self.decide_until(point, agent, payload, None)
    }

    /// [`Hooks::decide`] for an asker that waits at most `within`: every command policy and
    /// WASM policy still running when `within` has passed (or its own `timeout_ms`, whichever
    /// comes first) is cut and answers its `on_error`, counted as timed out, so the answer
    /// comes in time (docs/policies.md § Deadlines). Rules are never cut: they take
    /// microseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::DecisionPoint;
    /// use std::time::Duration;
    /// let hooks = prx_hooks::Hooks::builder().build()?; // no workspace: no policies
    /// let v = hooks.decide_within(DecisionPoint::ToolCallStart, "my-agent",
    ///     r#"{"tool": "shell", "arguments": {"command": "ls"}}"#, Duration::from_millis(500))?;
    /// assert_eq!(v.decision, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide_within(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &str,
        within: std::time::Duration,
    ) -> Result<Verdict, DecideError> {
        let until = std::time::Instant::now().checked_add(within);
        self.decide_until(point, agent, payload, until)
    }

    /// [`Hooks::decide`] cut at `until` (`None`: each source's own deadline).
    pub(crate) fn decide_until(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &str,
        until: Option<std::time::Instant>,
    ) -> Result<Verdict, DecideError> {
        let verdict = self.policies.decide(point, agent, payload, until)?;
        self.announce(point, agent, &verdict);
        Ok(verdict)
    }

    /// [`Hooks::decide`] with the payload already parsed (no size limit applies: the caller
    /// holds it). `elapsed` is the rules' time alone.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::DecisionPoint;
    /// let hooks = prx_hooks::Hooks::builder().build()?; // no workspace: no policies
    /// let v = hooks.decide_value(DecisionPoint::Prompt, "a", &serde_json::json!({"prompt": "hi"}));
    /// assert_eq!(v.decision, None);
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn decide_value(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &serde_json::Value,
    ) -> Verdict {
        self.decide_value_until(point, agent, payload, None)
    }

    /// [`Hooks::decide_value`] cut at `until` (`None`: each source's own deadline).
    pub(crate) fn decide_value_until(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &serde_json::Value,
        until: Option<std::time::Instant>,
    ) -> Verdict {
        let verdict = self
            .policies
            .decide_value(point, agent, payload, None, until, None);
        self.announce(point, agent, &verdict);
        verdict
    }

    /// [`Hooks::decide_value`], with what each command policy and WASM policy asked
    /// answered and how long it took, in the order they answered (`prx-hooks policy test
    /// --run-guards`). A source not asked (not selected, or after a deny) is not listed.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::DecisionPoint;
    /// let hooks = prx_hooks::Hooks::builder().build()?; // no workspace: no policies
    /// let (v, sources) = hooks.decide_traced(DecisionPoint::Prompt, "a", &serde_json::json!({"prompt": "hi"}));
    /// assert_eq!((v.decision, sources.len()), (None, 0));
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn decide_traced(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &serde_json::Value,
    ) -> (Verdict, Vec<crate::policy::SourceAnswer>) {
        let trace = std::sync::Mutex::new(Vec::new());
        let verdict = self
            .policies
            .decide_value(point, agent, payload, None, None, Some(&trace));
        self.announce(point, agent, &verdict);
        (
            verdict,
            trace.into_inner().unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Publishes a decision on the bus as [`policy::DECISION_TOPIC`] when a subscription wants
    /// it (the live stream, `tail`, a NATS publisher): `{"point", "decision", "policy",
    /// "reason", "elapsed_us"}`, from the asking agent. Nobody subscribed, or no policy in
    /// force (no policies.json, or one without policies: the lane is off), nothing is built.
    fn announce(&self, point: DecisionPoint, agent: &str, v: &Verdict) {
        if !self.bus.wants(policy::DECISION_TOPIC) {
            return;
        }
        let table = self.policies.table();
        let no_file =
            table.source.is_none() || (table.policies.is_empty() && table.commands.is_empty());
        if no_file && !self.policies.has_plugins() {
            return;
        }
        let json = serde_json::json!({
            "point": point.as_str(),
            "decision": v.decision.map(|d| d.as_str()),
            "policy": v.policy,
            "reason": v.reason,
            "elapsed_us": v.elapsed.as_micros() as u64,
        });
        // A subscriber's full queue drops it there, counted by the bus as any message.
        let _ = self
            .bus
            .publish_from(policy::DECISION_TOPIC, agent, "", json.to_string());
    }

    /// The policies in force now (empty without a workspace or a policies.json).
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// assert!(hooks.policy_table().policies.is_empty());
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn policy_table(&self) -> Arc<PolicyTable> {
        self.policies.table()
    }

    /// Whether a decision may wait (a command policy's process, a WASM policy's call, each up
    /// to its deadline): the HTTP doors then decide off their async workers.
    #[cfg(feature = "http")]
    pub(crate) fn decisions_may_wait(&self) -> bool {
        !self.policies.table().commands.is_empty() || self.policies.has_plugins()
    }

    /// Whether any WASM policy is in force.
    #[cfg(feature = "http")]
    pub(crate) fn has_wasm_policies(&self) -> bool {
        self.policies.has_plugins()
    }

    /// Counts a question refused before it could be asked (a payload over the limit).
    #[cfg(feature = "http")]
    pub(crate) fn count_refused_decision(&self) {
        self.policies.refused();
    }

    /// Loads policies.json now if it changed since the table in force was read (the watcher
    /// would, a debounce later). `None` without a workspace or after shutdown.
    pub fn apply_policies_file(&self) -> Option<config::Reload> {
        self.policies.reload(false)
    }
}
