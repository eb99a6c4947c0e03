//! plugin.toml's `[policy]`: the decision points a WASM policy answers, its deadline and what
//! a failure answers (docs/policies.md § WASM policies).

use super::*;
use crate::policy::{DecisionPoint, OnError};

/// `[policy]` keys.
pub(super) const POLICY_KEYS: &[&str] = &["id", "on", "timeout_ms", "on_error"];

/// A plugin's `[policy]`: it exports `prx-hooks:policy/decider` (wit/policy/policy.wit) and
/// answers the decision lane at the points of `on`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PolicySpec {
    /// `id`: how decisions and stats name it (default: the plugin's name).
    pub id: String,
    /// `on`: the decision points it answers (at least one, no repeats).
    pub on: Vec<DecisionPoint>,
    /// `timeout_ms`: how long one decision may take, instantiation included (default
    /// [`DEFAULT_TIMEOUT_MS`](crate::policy::DEFAULT_TIMEOUT_MS), at most
    /// [`MAX_TIMEOUT_MS`](crate::policy::MAX_TIMEOUT_MS), and never more than
    /// `[resources] max_execution_time_ms`).
    pub timeout_ms: u64,
    /// `on_error`: what a timeout, trap, `err` or exhausted limit answers (default `none`).
    pub on_error: OnError,
    /// Where `id` is written in plugin.toml (line, column, from 1); where `[policy]` is when
    /// the id is the plugin's name. Errors about the id name it.
    #[serde(skip)]
    pub id_at: (usize, usize),
}

impl Check<'_> {
    /// Checks `[policy]` (its header at `header`); `None` when it has errors.
    pub(super) fn policy(
        &mut self,
        t: &DeTable<'_>,
        header: usize,
        path: &str,
    ) -> Option<PolicySpec> {
        let before = self.errs.len();
        let mut spec = PolicySpec {
            id: String::new(),
            on: Vec::new(),
            timeout_ms: crate::policy::DEFAULT_TIMEOUT_MS,
            on_error: OnError::None,
            id_at: Lines::new(self.text).locate(header),
        };
        let mut has_on = false;
        for (key, v) in t.iter() {
            let k: &str = key.get_ref();
            let p = key_path(path, k);
            match k {
                "id" => {
                    if let Some(s) = self.string(v, &p) {
                        if is_valid_name(s) {
                            spec.id = s.to_string();
                            spec.id_at = Lines::new(self.text).locate(v.span().start);
                        } else {
                            self.err(
                                v.span().start,
                                &p,
                                format!(
                                    "{} is not a valid policy id: 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ -",
                                    quote(s)
                                ),
                            );
                        }
                    }
                }
                "on" => {
                    has_on = true;
                    spec.on = self.points(v, &p);
                }
                "timeout_ms" => {
                    let max = crate::policy::MAX_TIMEOUT_MS as i64;
                    if let Some(n) = self.integer(v, &p, 1, max) {
                        spec.timeout_ms = n as u64;
                    }
                }
                "on_error" => match self.string(v, &p) {
                    Some("none") => spec.on_error = OnError::None,
                    Some("deny") => spec.on_error = OnError::Deny,
                    Some(other) => self.err(
                        v.span().start,
                        &p,
                        format!(
                            "unknown on_error {}; expected \"none\" (no decision) or \"deny\"",
                            quote(other)
                        ),
                    ),
                    None => {}
                },
                _ => self.unknown_key(key, path, POLICY_KEYS),
            }
        }
        if !has_on {
            self.err(
                header,
                path,
                "missing \"on\" (required): the decision points the policy answers, e.g. on = [\"tool_call_start\"]",
            );
        }
        (self.errs.len() == before).then_some(spec)
    }

    /// `on`: a non-empty array of decision point names, without repeats.
    fn points(&mut self, v: &Val<'_>, path: &str) -> Vec<DecisionPoint> {
        let names: Vec<&str> = DecisionPoint::ALL.iter().map(|p| p.as_str()).collect();
        let mut out = Vec::new();
        let items = self.strings(v, path);
        if items.is_empty() && matches!(v.get_ref(), DeValue::Array(_)) {
            self.err(
                v.span().start,
                path,
                format!(
                    "an empty list answers nothing; expected one or more of {}",
                    names.join(", ")
                ),
            );
        }
        for (name, pos, p) in items {
            match DecisionPoint::from_name(&name) {
                Some(point) if out.contains(&point) => {
                    self.err(pos, &p, format!("{} is listed twice", quote(&name)));
                }
                Some(point) => out.push(point),
                None => {
                    let hint = match crate::suggest(&name, &names) {
                        Some(s) => format!("did you mean \"{s}\"?"),
                        None => format!("expected one of {}", names.join(", ")),
                    };
                    self.err(
                        pos,
                        &p,
                        format!("unknown decision point {}; {hint}", quote(&name)),
                    );
                }
            }
        }
        out
    }
}
