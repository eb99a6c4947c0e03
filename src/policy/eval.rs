//! Deciding: a payload against the rules in force, most restrictive first, and the counts
//! every decision leaves. Nothing here touches the ring, a worker, a hook or a plugin.

use super::model::{Condition, Decision, DecisionPoint, Index, Policy, PolicyTable, Test, Verdict};
use crate::config::ConfigStats;
use serde::Serialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The largest payload a decision reads (JSON text), 1 MiB: a larger one is refused, counted.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// The key of the policies' section in [`Stats`](crate::Stats) and in its JSON.
pub(crate) const STATS_SECTION: &str = "policies";

/// A question that could not be asked (nothing was decided; counted as `refused`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecideError {
    /// The payload is larger than [`MAX_PAYLOAD_BYTES`].
    #[error("the payload is {size} bytes; a decision reads at most {limit} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// [`MAX_PAYLOAD_BYTES`].
        limit: usize,
    },
    /// The payload is not a JSON object.
    #[error("the payload is not a JSON object: {0}")]
    Payload(String),
}

/// Why one policy did or did not answer (what `prx-hooks policy test` prints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Trace {
    /// The policy's id.
    pub policy: String,
    /// Whether it answers this payload.
    pub matched: bool,
    /// Its decision (whether it matched or not).
    pub decision: Decision,
    /// What decided it: the first thing that did not hold, or every condition that did.
    pub why: String,
}

/// Reads a payload's JSON text, within [`MAX_PAYLOAD_BYTES`].
pub(crate) fn read_payload(text: &str) -> Result<Value, DecideError> {
    if text.len() > MAX_PAYLOAD_BYTES {
        return Err(DecideError::TooLarge {
            size: text.len(),
            limit: MAX_PAYLOAD_BYTES,
        });
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(DecideError::Payload(format!(
            "found {}",
            match other {
                Value::Null => "null",
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::String(_) => "a string",
                _ => "an array",
            }
        ))),
        Err(e) => Err(DecideError::Payload(e.to_string())),
    }
}

impl PolicyTable {
    /// Decides with the rules: every enabled rule for `point` that matches `agent` and
    /// `payload`; the most restrictive decision wins, reported with the first such rule in
    /// file order (a deny answers at once). No rule matching: no decision. Command policies
    /// are not run here (no process is started): [`Hooks::decide`](crate::Hooks::decide)
    /// runs them.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::{Decision, DecisionPoint, parse};
    /// let table = parse(br#"{"policies": [
    ///   {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell",
    ///    "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
    ///    "decision": "deny", "reason": "rm -rf is not allowed"}]}"#, "policies.json")?;
    /// let payload = serde_json::json!({"tool": "Bash", "arguments": {"command": "rm -rf /"}});
    /// let v = table.decide(DecisionPoint::ToolCallStart, "claude-code", &payload);
    /// assert_eq!(v.decision, Some(Decision::Deny));
    /// assert_eq!(v.policy.as_deref(), Some("no-rm-rf"));
    /// let ls = serde_json::json!({"tool": "Bash", "arguments": {"command": "ls"}});
    /// assert_eq!(table.decide(DecisionPoint::ToolCallStart, "claude-code", &ls).decision, None);
    /// # Ok::<(), prx_hooks::config::ConfigErrors>(())
    /// ```
    pub fn decide(&self, point: DecisionPoint, agent: &str, payload: &Value) -> Verdict {
        self.decide_at(point, agent, payload).0
    }

    /// [`PolicyTable::decide`], and the index of the reported policy.
    pub(crate) fn decide_at(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &Value,
    ) -> (Verdict, Option<usize>) {
        let start = Instant::now();
        let mut best: Option<(usize, &Policy)> = None;
        if self.enabled {
            let tool = payload.get("tool").and_then(Value::as_str);
            let mut cache = Cache {
                matchers: vec![None; self.index.matchers.len()],
                sets: vec![None; self.index.sets.len()],
            };
            for (i, p) in self.policies.iter().enumerate() {
                if best.is_some_and(|(_, b)| b.decision >= p.decision) {
                    continue;
                }
                if self.hit(p, point, agent, tool, payload, &mut cache) {
                    best = Some((i, p));
                    if p.decision == Decision::Deny {
                        break;
                    }
                }
            }
        }
        let verdict = match best {
            Some((_, p)) => Verdict {
                decision: Some(p.decision),
                reason: Some(p.reason.clone()),
                policy: Some(p.id.clone()),
                context: p.context.clone(),
                elapsed: start.elapsed(),
            },
            None => Verdict::none(start.elapsed()),
        };
        (verdict, best.map(|(i, _)| i))
    }

    /// [`PolicyTable::decide`], with why each rule for `point` did or did not match.
    pub fn explain(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &Value,
    ) -> (Verdict, Vec<Trace>) {
        let verdict = self.decide(point, agent, payload);
        let tool = payload.get("tool").and_then(Value::as_str);
        let traces = self
            .policies
            .iter()
            .filter(|p| p.points & point.bit() != 0)
            .map(|p| {
                let (matched, why) = match matches(p, point, agent, tool, payload) {
                    Ok(why) if !self.enabled => {
                        (false, format!("{why}, but the file's \"enabled\" is false"))
                    }
                    Ok(why) => (true, why),
                    Err(why) => (false, why),
                };
                Trace {
                    policy: p.id.clone(),
                    matched,
                    decision: p.decision,
                    why,
                }
            })
            .collect();
        (verdict, traces)
    }
}

/// What one decision has worked out so far: each shared matcher's answer, and each path's
/// regex set's matches (outer `None`: not asked yet; inner `None`: none matches).
struct Cache {
    matchers: Vec<Option<bool>>,
    sets: Vec<Option<Option<regex::SetMatches>>>,
}

/// The most a path's shared regex set may compile to; past it the path's regexes run one by
/// one (each is already bounded at 1 MiB).
const SET_SIZE_LIMIT: usize = 64 << 20;

impl PolicyTable {
    /// Builds the [`Index`] (after loading; a table built otherwise decides without one).
    pub(crate) fn build_index(&mut self) {
        let mut index = Index::default();
        for p in &mut self.policies {
            p.matcher_ix = p.matcher.as_ref().map(|m| {
                let src = m.source();
                match index.matchers.iter().position(|x| x.source() == src) {
                    Some(i) => i,
                    None => {
                        index.matchers.push(m.clone());
                        index.matchers.len() - 1
                    }
                }
            });
        }
        let mut paths: Vec<(Vec<String>, Vec<String>)> = Vec::new();
        for p in &self.policies {
            for c in &p.when {
                if let Test::Regex(r) = &c.test {
                    match paths.iter_mut().find(|(segs, _)| *segs == c.segments) {
                        Some((_, pats)) => pats.push(r.as_str().to_string()),
                        None => paths.push((c.segments.clone(), vec![r.as_str().to_string()])),
                    }
                }
            }
        }
        let sets: Vec<Option<regex::RegexSet>> = paths
            .iter()
            .map(|(_, pats)| {
                regex::RegexSetBuilder::new(pats)
                    .size_limit(SET_SIZE_LIMIT)
                    .nest_limit(64)
                    .build()
                    .ok()
            })
            .collect();
        let mut next = vec![0usize; paths.len()];
        for p in &mut self.policies {
            for c in &mut p.when {
                if !matches!(c.test, Test::Regex(_)) {
                    continue;
                }
                let at = paths.iter().position(|(segs, _)| *segs == c.segments);
                if let Some(at) = at {
                    let k = next[at];
                    next[at] += 1;
                    c.in_set = sets[at].as_ref().map(|_| (at, k));
                }
            }
        }
        // Keep the sets' indices as the conditions recorded them (a failed set leaves a hole
        // no condition points at).
        index.sets = paths
            .into_iter()
            .zip(sets)
            .map(|((segs, _), set)| (segs, set.unwrap_or_else(regex::RegexSet::empty)))
            .collect();
        self.index = index;
    }

    /// Whether `p` answers (the fast path of [`matches`]: no reasons, shared work cached).
    fn hit(
        &self,
        p: &Policy,
        point: DecisionPoint,
        agent: &str,
        tool: Option<&str>,
        payload: &Value,
        cache: &mut Cache,
    ) -> bool {
        if p.points & point.bit() == 0 || !p.enabled {
            return false;
        }
        if let Some(m) = &p.agent
            && !m.matches(agent)
        {
            return false;
        }
        if let Some(m) = &p.matcher {
            let Some(t) = tool else { return false };
            let ok = match p.matcher_ix.and_then(|i| cache.matchers.get_mut(i)) {
                Some(Some(known)) => *known,
                Some(slot) => *slot.insert(m.matches(t)),
                None => m.matches(t),
            };
            if !ok {
                return false;
            }
        }
        p.when.iter().all(|c| match c.in_set {
            Some((s, k)) => {
                let matches = cache.sets[s].get_or_insert_with(|| {
                    let (segs, set) = &self.index.sets[s];
                    let value = lookup(payload, segs)?;
                    // Most questions match none of a path's regexes: one early-exit search
                    // tells, and only a hit pays for the search that names them all.
                    with_text(value, |text| set.is_match(text).then(|| set.matches(text))).flatten()
                });
                matches.as_ref().is_some_and(|m| m.matched(k))
            }
            None => holds(c, payload).is_ok(),
        })
    }
}

/// `f` of the value's text: a string itself, a number or boolean as its JSON spelling; `None`
/// for null, objects and arrays (what text tests never match).
fn with_text<T>(value: &Value, f: impl FnOnce(&str) -> T) -> Option<T> {
    match value {
        Value::String(s) => Some(f(s)),
        Value::Number(n) => Some(f(&n.to_string())),
        Value::Bool(b) => Some(f(if *b { "true" } else { "false" })),
        _ => None,
    }
}

/// What selects the payloads a policy answers (a rule) or runs for (a command policy).
pub(crate) struct Filter<'a> {
    pub(crate) points: u8,
    pub(crate) enabled: bool,
    pub(crate) agent: Option<&'a crate::config::Matcher>,
    pub(crate) matcher: Option<&'a crate::config::Matcher>,
    pub(crate) when: &'a [Condition],
}

impl Policy {
    fn filter(&self) -> Filter<'_> {
        Filter {
            points: self.points,
            enabled: self.enabled,
            agent: self.agent.as_ref(),
            matcher: self.matcher.as_ref(),
            when: &self.when,
        }
    }
}

impl super::model::CommandPolicy {
    pub(crate) fn filter(&self) -> Filter<'_> {
        Filter {
            points: self.points,
            enabled: self.enabled,
            agent: self.agent.as_ref(),
            matcher: self.matcher.as_ref(),
            when: &self.when,
        }
    }
}

/// Whether `p` answers: `Ok(what held)` or `Err(what did not)`.
fn matches(
    p: &Policy,
    point: DecisionPoint,
    agent: &str,
    tool: Option<&str>,
    payload: &Value,
) -> Result<String, String> {
    selects(&p.filter(), point, agent, tool, payload)
}

/// Whether `f` selects the payload: `Ok(what held)` or `Err(what did not)`.
pub(crate) fn selects(
    f: &Filter,
    point: DecisionPoint,
    agent: &str,
    tool: Option<&str>,
    payload: &Value,
) -> Result<String, String> {
    if f.points & point.bit() == 0 {
        return Err(format!("not on {point}"));
    }
    if !f.enabled {
        return Err("disabled".into());
    }
    if let Some(m) = f.agent
        && !m.matches(agent)
    {
        return Err(format!("agent {agent:?} does not match {:?}", m.source()));
    }
    if let Some(m) = f.matcher {
        match tool {
            Some(t) if m.matches(t) => {}
            Some(t) => return Err(format!("tool {t:?} does not match {:?}", m.source())),
            None => return Err("the payload names no tool (\"tool\")".into()),
        }
    }
    let mut held = Vec::new();
    for c in f.when {
        match holds(c, payload) {
            Ok(()) => held.push(c.path.as_str()),
            Err(why) => return Err(why),
        }
    }
    Ok(if held.is_empty() {
        "no condition".into()
    } else {
        format!("{} held", held.join(", "))
    })
}

fn lookup<'v>(payload: &'v Value, segments: &[String]) -> Option<&'v Value> {
    let mut at = payload;
    for s in segments {
        at = match at {
            Value::Object(m) => m.get(s)?,
            Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

fn holds(c: &Condition, payload: &Value) -> Result<(), String> {
    let Some(value) = lookup(payload, &c.segments) else {
        return Err(format!("{} is missing", c.path));
    };
    if let Test::Equals(want) = &c.test {
        return if value == want {
            Ok(())
        } else {
            Err(format!("{} is not {want}", c.path))
        };
    }
    let number;
    let text = match value {
        Value::String(s) => s.as_str(),
        Value::Number(n) => {
            number = n.to_string();
            number.as_str()
        }
        Value::Bool(true) => "true",
        Value::Bool(false) => "false",
        _ => return Err(format!("{} is not a string, number or boolean", c.path)),
    };
    let ok = match &c.test {
        Test::Regex(r) => r.is_match(text),
        Test::Glob(g) => crate::config::glob_match(g.as_bytes(), text.as_bytes()),
        Test::Prefix(p) => text.starts_with(p.as_str()),
        Test::Equals(_) => unreachable!("handled above"),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{} does not match", c.path))
    }
}

/// Counts of decisions by outcome, kept by the [`Hooks`](crate::Hooks) that answers them.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    allow: AtomicU64,
    ask: AtomicU64,
    deny: AtomicU64,
    none: AtomicU64,
    refused: AtomicU64,
}

impl Counters {
    pub(crate) fn count(&self, verdict: &Verdict) {
        let c = match verdict.decision {
            Some(Decision::Allow) => &self.allow,
            Some(Decision::Ask) => &self.ask,
            Some(Decision::Deny) => &self.deny,
            None => &self.none,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(
        &self,
        file: Option<ConfigStats>,
        by_policy: Vec<PolicyCount>,
        commands: Vec<super::command::CommandCount>,
        plugins: Vec<super::plugins::PluginPolicyCount>,
        duplicate_ids: u64,
    ) -> PoliciesStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PoliciesStats {
            file,
            by_policy,
            commands,
            plugins,
            allow: get(&self.allow),
            ask: get(&self.ask),
            deny: get(&self.deny),
            none: get(&self.none),
            refused: get(&self.refused),
            duplicate_ids,
        }
    }
}

/// The policies' section of [`Stats`](crate::Stats): the file's watcher and the decisions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PoliciesStats {
    /// The policies.json watcher (`None` without a workspace), as hooks.json's `config`.
    pub file: Option<ConfigStats>,
    /// Decisions that allowed.
    pub allow: u64,
    /// Decisions that asked.
    pub ask: u64,
    /// Decisions that denied.
    pub deny: u64,
    /// Questions no policy decided.
    pub none: u64,
    /// Questions refused (payload too large or not a JSON object): nothing was decided.
    pub refused: u64,
    /// Each policy in force, in file order, with how often it was the one reported.
    pub by_policy: Vec<PolicyCount>,
    /// Each command policy in force, in file order: its runs by how they ended (timeouts,
    /// crashes, bad and oversized answers counted apart) and how often it was reported.
    pub commands: Vec<super::command::CommandCount>,
    /// Each WASM policy in force, in plugin name order: its calls by how they ended
    /// (timeouts, fuel, traps, errors, busy counted apart) and how often it was reported.
    pub plugins: Vec<super::plugins::PluginPolicyCount>,
    /// WASM policies refused at load because policies.json or an earlier plugin has their
    /// id (each counted once, when refused).
    pub duplicate_ids: u64,
}

/// How often one policy decided (was the policy reported), since its id was first loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PolicyCount {
    /// Its id.
    pub policy: String,
    /// Its decision.
    pub decision: Decision,
    /// Questions it answered.
    pub decisions: u64,
}

impl crate::stats::Stats {
    /// The policies' section: decisions by outcome and the policies.json watcher.
    pub fn policies(&self) -> Option<&PoliciesStats> {
        self.section(STATS_SECTION)
    }
}
