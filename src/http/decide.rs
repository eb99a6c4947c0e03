//! The decision doors of the HTTP API (docs/policies.md § Doors): `POST /api/decide` for any
//! agent, and the answer `POST /api/ingest/{claude-code,codex,gemini-cli}` gives on the events
//! those agents let a hook decide (Claude Code's `http` hook, `prx-hooks-send --from`). Both
//! ask [`Hooks::decide`](crate::Hooks::decide): no ring, worker, hook or plugin is waited for.

use super::body::{self, Media};
use super::error::ApiError;
use super::json_response;
use super::{Api, ApiState};
use crate::agents::Agent;
use crate::policy::{
    DECISION_FIELD, DecideError, Decision, DecisionPoint, MAX_PAYLOAD_BYTES, POLICY_ID_FIELD,
    REASON_FIELD, Verdict,
};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::time::Instant;

/// The largest `POST /api/decide` body: a payload at its limit and room for the envelope.
const MAX_BODY_BYTES: usize = MAX_PAYLOAD_BYTES + 64 * 1024;

/// The request header in which an asker says how long it waits for the decision, in whole
/// milliseconds from when the server has read the request's headers (`POST /api/decide`,
/// `POST /api/ingest/{agent}`): every command and WASM policy still running then is cut and
/// answers its `on_error`, so the answer comes in time. `prx-hooks-send` sends its
/// `--timeout` less a margin for the way back (docs/policies.md § Deadlines).
pub const DECISION_DEADLINE_HEADER: &str = "prx-decision-deadline-ms";
/// The largest [`DECISION_DEADLINE_HEADER`] accepted (an hour).
pub const MAX_DECISION_DEADLINE_MS: u64 = 3_600_000;

/// The asker's deadline, [`DECISION_DEADLINE_HEADER`] after `since` (`None`: no header, each
/// source keeps its own). A value that is not a whole number of milliseconds in range is a
/// 400 naming the header.
pub(crate) fn deadline(headers: &HeaderMap, since: Instant) -> Result<Option<Instant>, ApiError> {
    let mut values = headers.get_all(DECISION_DEADLINE_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bad = |found: &str| {
        ApiError::bad_request(format!(
            "{DECISION_DEADLINE_HEADER}: {found} is not a deadline: expected a whole number of \
             milliseconds, 0 to {MAX_DECISION_DEADLINE_MS}"
        ))
        .at(DECISION_DEADLINE_HEADER)
    };
    // Sent twice is as `300, 400` on one line: no single deadline.
    if values.next().is_some() {
        return Err(bad("a header sent more than once"));
    }
    let text = value
        .to_str()
        .map_err(|_| bad("a value that is not visible ASCII"))?;
    // Digits only: `u64::from_str` would also take a leading `+`.
    let digits = text.trim();
    let ms: u64 = Some(digits)
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .filter(|&ms| ms <= MAX_DECISION_DEADLINE_MS)
        .ok_or_else(|| bad(&crate::config::quote(digits)))?;
    Ok(since.checked_add(std::time::Duration::from_millis(ms)))
}

/// The `run --events` envelope, with a decision point as its `event`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    event: String,
    agent: String,
    #[serde(default)]
    #[allow(dead_code)]
    session: Option<String>,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

/// `POST /api/decide`: `{"event": "tool_call_start" | "prompt" | "permission", "agent",
/// "session", "payload"}` in; `{"decision", "reason", "policy", "elapsed_us"}` out (`decision`
/// null when no policy decides). It decides only: nothing is emitted.
pub(crate) async fn post(
    State(api): ApiState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let until = deadline(&headers, received)?;
    let bytes = body::raw(&api, &headers, body, MAX_BODY_BYTES, Media::Json).await?;
    let start = Instant::now();
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| ApiError::bad_request(format!("body: invalid UTF-8: {e}")))?;
    let env: Envelope = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("body:{}:{}: {e}", e.line(), e.column())))?;
    let Some(point) = DecisionPoint::from_name(&env.event) else {
        let names: Vec<&str> = DecisionPoint::ALL.iter().map(|p| p.as_str()).collect();
        return Err(ApiError::bad_request(format!(
            "event: {} is not a decision point; expected one of {}",
            crate::config::quote(&env.event),
            names.join(", ")
        ))
        .at("event"));
    };
    let payload = env.payload.map(RawValue::get).unwrap_or("{}");
    let decided = if !api.hooks.decisions_may_wait() {
        api.hooks.decide(point, &env.agent, payload)
    } else {
        // Command policies run processes and wait for them: off the async workers.
        let (hooks, agent, payload) = (api.hooks.clone(), env.agent.clone(), payload.to_string());
        tokio::task::spawn_blocking(move || hooks.decide_until(point, &agent, &payload, until))
            .await
            .map_err(|e| ApiError::internal(format!("the decision failed: {e}")))?
    };
    let mut verdict = decided.map_err(|e| match e {
        e @ DecideError::TooLarge { .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("payload: {e}"),
        )
        .at("payload"),
        e => ApiError::bad_request(format!("payload: {e}")).at("payload"),
    })?;
    verdict.elapsed = start.elapsed();
    Ok(json_response(StatusCode::OK, &answer(&verdict)))
}

fn answer(v: &Verdict) -> Value {
    let mut out = json!({
        "decision": v.decision.map(Decision::as_str),
        "reason": v.reason,
        "policy": v.policy,
        "elapsed_us": v.elapsed.as_micros() as u64,
    });
    if let (Some(c), Some(o)) = (&v.context, out.as_object_mut()) {
        o.insert("context".into(), Value::String(c.clone()));
    }
    out
}

/// A decision made at an agent's door: the agent's answer, and the verdict its lifecycle
/// event carries (docs/policies.md § Audit).
pub(crate) struct Decided {
    /// What the agent's hook gets, in its documented format.
    pub(crate) answer: Value,
    /// What the event carries.
    pub(crate) stamp: Stamp,
}

/// The decision an ingested event is stamped with.
pub(crate) struct Stamp {
    verdict: Verdict,
}

impl Stamp {
    /// Adds the decision to the translated event's payload as extra fields
    /// ([`policy::DECISION_FIELD`](crate::policy::DECISION_FIELD), `policy_id`, and
    /// `policy_reason` when the policy has one), so that the event's hooks,
    /// the bus, the console and the trace see what was decided. No decision, or a topic
    /// line (a prompt): unchanged.
    pub(crate) fn stamp(&self, t: &mut crate::agents::Translated) {
        let Some(decision) = self.verdict.decision else {
            return;
        };
        if !matches!(t.target, crate::agents::Target::Lifecycle(_)) {
            return;
        }
        stamp_line(&mut t.line, decision, &self.verdict);
    }
}

/// The `run --events` line with `payload` as its last member, `{…,"payload":{…}}`: the
/// fields go at the payload's end (JSON text of their own, no re-serialising of the rest).
fn stamp_line(line: &mut String, decision: Decision, v: &Verdict) {
    if !line.ends_with("}}") || !line.contains(r#""payload":{"#) {
        return;
    }
    let empty = line.ends_with("{}}");
    line.truncate(line.len() - 2);
    let mut fields = Map::new();
    fields.insert(DECISION_FIELD.into(), decision.as_str().into());
    if let Some(p) = &v.policy {
        fields.insert(POLICY_ID_FIELD.into(), p.clone().into());
    }
    if let Some(r) = &v.reason {
        fields.insert(REASON_FIELD.into(), r.clone().into());
    }
    let text = Value::Object(fields).to_string();
    if !empty {
        line.push(',');
    }
    line.push_str(&text[1..text.len() - 1]);
    line.push_str("}}");
}

/// What `POST /api/ingest/{agent}` answers an agent's hook on an event policies decide, in
/// the agent's own format ([`policy::answer`](crate::policy::answer); `None`: `{}` as before —
/// not a decision point, not JSON, an agent policies do not answer), with the stamp its
/// lifecycle event carries. Claude Code's `http` hook reads the answer as the body;
/// `prx-hooks-send` finds it as the report's `answer`. `agent` is the name policies match
/// (the `agent` query parameter, or the agent's own name); `until` the asker's deadline
/// ([`deadline`]).
pub(crate) async fn door_answer(
    api: &Api,
    from: Agent,
    agent: &str,
    bytes: &[u8],
    until: Option<Instant>,
) -> Option<Decided> {
    if !matches!(from, Agent::ClaudeCode | Agent::Codex | Agent::GeminiCli) {
        return None;
    }
    // No policy in force: nothing to decide, and the payload is not parsed a second time
    // (the ingest translates it). Past the payload limit a decision is refused, counted, and
    // the agent's own flow goes on.
    let table = api.hooks.policy_table();
    if table.policies.is_empty() && table.commands.is_empty() && !api.hooks.has_wasm_policies() {
        return None;
    }
    if bytes.len() > crate::policy::MAX_PAYLOAD_BYTES {
        api.hooks.count_refused_decision();
        return None;
    }
    let q = crate::policy::question(from, bytes)?;
    let verdict = if !api.hooks.decisions_may_wait() {
        api.hooks.decide_value(q.point, agent, &q.payload)
    } else {
        // Command policies run processes and wait for them: off the async workers. A join
        // error (the decision panicked) decides nothing: the agent's own flow.
        let (hooks, agent) = (api.hooks.clone(), agent.to_string());
        let (point, payload) = (q.point, q.payload);
        tokio::task::spawn_blocking(move || {
            hooks.decide_value_until(point, &agent, &payload, until)
        })
        .await
        .ok()?
    };
    Some(Decided {
        answer: crate::policy::answer(from, &q.event, &verdict),
        stamp: Stamp { verdict },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(line: &str) -> Value {
        let mut line = line.to_string();
        let mut v = Verdict::none(std::time::Duration::ZERO);
        v.policy = Some("no-rm-rf".into());
        stamp_line(&mut line, Decision::Deny, &v);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    #[test]
    fn the_decision_joins_the_payload_whatever_its_last_member_is() {
        for payload in [
            r#"{}"#,
            r#"{"tool":"Bash"}"#,
            // A last member that is itself an empty object.
            r#"{"tool":"Bash","tool_input":{}}"#,
            r#"{"tool":"Bash","nested":{"a":{}}}"#,
        ] {
            let line = format!(
                r#"{{"event":"tool_call_start","agent":"a","session":"s","payload":{payload}}}"#
            );
            let v = stamped(&line);
            assert_eq!(v["payload"][DECISION_FIELD], "deny", "{line}");
            assert_eq!(v["payload"][POLICY_ID_FIELD], "no-rm-rf", "{line}");
            let before: Value = serde_json::from_str(payload).unwrap();
            for (k, val) in before.as_object().unwrap() {
                assert_eq!(&v["payload"][k], val, "{line}");
            }
        }
    }
}
