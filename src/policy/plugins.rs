//! WASM policies as the decider sees them: a source it asks after the rules, behind a trait
//! (the plugin host implements it, so this module never names the host), the set in force
//! (swapped in by the plugins' loads, read without a lock) and their counts. Without the
//! `wasm` feature nothing builds a WASM policy: the set stays empty.

#![cfg_attr(not(feature = "wasm"), allow(dead_code))]

use super::model::{Decision, DecisionPoint, OnError, SourceAnswer, SourceTrace, trace_into};
use arc_swap::ArcSwap;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Where WASM policies come in the order reports use: after every entry of policies.json.
pub(crate) const ORDER_BASE: usize = usize::MAX / 2;

/// How one call of a WASM policy failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GuestFailure {
    /// Ran past its deadline (running guest code, or waiting in a host call).
    TimedOut,
    /// As `TimedOut`, at the asker's deadline, which came before its own.
    CutByAsker,
    /// Used all of its `max_fuel`.
    OutOfFuel,
    /// Trapped (a memory grow past `max_memory_mb` ends as one), or could not be instantiated.
    Trapped(String),
    /// Returned `err`.
    Error(String),
    /// No instance could be had before its deadline (every one busy, or the engine's pool full).
    Busy(String),
}

impl std::fmt::Display for GuestFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestFailure::TimedOut => f.write_str("timed out"),
            GuestFailure::CutByAsker => f.write_str("timed out (the asker's deadline came first)"),
            GuestFailure::OutOfFuel => f.write_str("ran out of fuel (max_fuel in plugin.toml)"),
            GuestFailure::Trapped(m) => write!(f, "trapped: {m}"),
            GuestFailure::Error(m) => write!(f, "returned an error: {m}"),
            GuestFailure::Busy(m) => write!(f, "no free instance: {m}"),
        }
    }
}

/// What one WASM policy answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GuestAnswer {
    /// A decision (`None`: no decision), with its reason and context.
    Decided(Option<Decision>, Option<String>, Option<String>),
    Failed(GuestFailure),
}

/// A WASM policy, as the decider asks it.
pub(crate) trait PluginPolicy: Send + Sync {
    /// Its id (`[policy] id`).
    fn id(&self) -> &str;
    /// Its plugin's name.
    fn plugin(&self) -> &str;
    /// Whether it answers at `point` (`[policy] on`).
    fn answers(&self, point: DecisionPoint) -> bool;
    /// Its `on_error`.
    fn on_error(&self) -> OnError;
    /// Asks it, on this thread, bounded by its deadline, or by `until` (the decision's
    /// deadline, when the asker gave one) when that comes first.
    fn ask(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload_json: &str,
        until: Option<Instant>,
    ) -> GuestAnswer;
    /// Its counts (kept by id across versions).
    fn counters(&self) -> &PluginPolicyCounters;
}

/// The WASM policies in force, in plugin name order: written by the plugins' loads, read by
/// every decision without a lock.
///
/// Policy ids are unique across policies.json and the plugins: of the policies the loads
/// store, one whose id policies.json has (the ids the decider [reserves](Self::reserve)), or
/// an earlier plugin's policy has, is refused — left out of the set in force, logged and
/// counted once — until the id is free again.
#[derive(Default)]
pub(crate) struct PluginPolicies {
    live: ArcSwap<Vec<Arc<dyn PluginPolicy>>>,
    admit: std::sync::Mutex<Admit>,
    refused: AtomicU64,
}

/// What the set in force is chosen from.
#[derive(Default)]
struct Admit {
    /// The policies the plugins' load stored, in plugin name order.
    all: Vec<Arc<dyn PluginPolicy>>,
    /// policies.json's ids, and the file's name.
    reserved: (std::collections::HashSet<String>, String),
    /// The (plugin, id) pairs refused by the last choice (each logged and counted once).
    refused: std::collections::HashSet<(String, String)>,
}

impl std::fmt::Debug for PluginPolicies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginPolicies")
            .field("policies", &self.live.load().len())
            .finish()
    }
}

impl PluginPolicies {
    /// The set in force now.
    pub(crate) fn load(&self) -> Arc<Vec<Arc<dyn PluginPolicy>>> {
        self.live.load_full()
    }

    /// Puts `set` in force at once (but a policy whose id is taken).
    pub(crate) fn store(&self, set: Vec<Arc<dyn PluginPolicy>>) {
        let mut admit = self.admit.lock().unwrap_or_else(|e| e.into_inner());
        admit.all = set;
        self.choose(&mut admit);
    }

    /// policies.json's ids now (`file` names it in the log): a WASM policy with one of them
    /// is refused, one refused for one it no longer has comes into force.
    pub(crate) fn reserve(&self, ids: std::collections::HashSet<String>, file: String) {
        let mut admit = self.admit.lock().unwrap_or_else(|e| e.into_inner());
        if admit.reserved.0 == ids {
            return;
        }
        admit.reserved = (ids, file);
        self.choose(&mut admit);
    }

    /// WASM policies refused because their id was taken, counted once per refusal.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Stores the policies of `admit.all` whose id is free.
    fn choose(&self, admit: &mut Admit) {
        let mut taken: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        let mut kept = Vec::with_capacity(admit.all.len());
        let mut refused = std::collections::HashSet::new();
        for p in &admit.all {
            let by = if admit.reserved.0.contains(p.id()) {
                Some(admit.reserved.1.clone())
            } else {
                taken.get(p.id()).map(|first| format!("plugin {first}"))
            };
            let Some(by) = by else {
                taken.insert(p.id(), p.plugin());
                kept.push(p.clone());
                continue;
            };
            let key = (p.plugin().to_string(), p.id().to_string());
            if !admit.refused.contains(&key) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    plugin = %p.plugin(),
                    policy = %p.id(),
                    "WASM policy {} of plugin {} refused: {by} already has a policy with this id (policy ids must be unique across policies.json and the plugins)",
                    crate::config::quote(p.id()),
                    p.plugin()
                );
            }
            refused.insert(key);
        }
        admit.refused = refused;
        self.live.store(Arc::new(kept));
    }

    /// Whether any is in force.
    pub(crate) fn is_empty(&self) -> bool {
        self.live.load().is_empty()
    }
}

/// How one WASM policy's calls ended, counted since its id was first loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PluginPolicyCount {
    /// Its id.
    pub policy: String,
    /// Calls made (or tried).
    pub calls: u64,
    /// Answers: allow, ask, deny, no decision.
    pub allow: u64,
    /// See `allow`.
    pub ask: u64,
    /// See `allow`.
    pub deny: u64,
    /// See `allow`.
    pub none: u64,
    /// Cut at its deadline (`timeout_ms`, or the asker's when that came first).
    pub timed_out: u64,
    /// Of `timed_out`: cut at the asker's deadline (`Prx-Decision-Deadline-Ms`,
    /// `Hooks::decide_within`), which came before its own (`timeout_ms`, at most
    /// `max_execution_time_ms`).
    pub cut_by_asker: u64,
    /// Ran out of fuel.
    pub out_of_fuel: u64,
    /// Trapped (memory refused at `max_memory_mb` included) or could not be instantiated.
    pub trapped: u64,
    /// Returned `err`.
    pub errors: u64,
    /// Found no free instance before its deadline.
    pub busy: u64,
    /// Failures answered with `on_error: deny`.
    pub on_error_deny: u64,
    /// Decisions it was the reported policy of.
    pub decisions: u64,
}

/// The live counts behind a [`PluginPolicyCount`].
#[derive(Debug, Default)]
pub(crate) struct PluginPolicyCounters {
    calls: AtomicU64,
    allow: AtomicU64,
    ask: AtomicU64,
    deny: AtomicU64,
    none: AtomicU64,
    timed_out: AtomicU64,
    cut_by_asker: AtomicU64,
    out_of_fuel: AtomicU64,
    trapped: AtomicU64,
    errors: AtomicU64,
    busy: AtomicU64,
    on_error_deny: AtomicU64,
    pub(crate) decisions: AtomicU64,
}

impl PluginPolicyCounters {
    pub(crate) fn count(&self, a: &GuestAnswer, on_error: OnError) {
        let bump = |c: &AtomicU64| c.fetch_add(1, Ordering::Relaxed);
        bump(&self.calls);
        match a {
            GuestAnswer::Decided(d, _, _) => {
                bump(match d {
                    Some(Decision::Allow) => &self.allow,
                    Some(Decision::Ask) => &self.ask,
                    Some(Decision::Deny) => &self.deny,
                    None => &self.none,
                });
            }
            GuestAnswer::Failed(f) => {
                if let GuestFailure::CutByAsker = f {
                    bump(&self.cut_by_asker);
                }
                bump(match f {
                    GuestFailure::TimedOut | GuestFailure::CutByAsker => &self.timed_out,
                    GuestFailure::OutOfFuel => &self.out_of_fuel,
                    GuestFailure::Trapped(_) => &self.trapped,
                    GuestFailure::Error(_) => &self.errors,
                    GuestFailure::Busy(_) => &self.busy,
                });
                if on_error == OnError::Deny {
                    bump(&self.on_error_deny);
                }
            }
        }
    }

    pub(crate) fn snapshot(&self, policy: &str) -> PluginPolicyCount {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PluginPolicyCount {
            policy: policy.to_string(),
            calls: get(&self.calls),
            allow: get(&self.allow),
            ask: get(&self.ask),
            deny: get(&self.deny),
            none: get(&self.none),
            timed_out: get(&self.timed_out),
            cut_by_asker: get(&self.cut_by_asker),
            out_of_fuel: get(&self.out_of_fuel),
            trapped: get(&self.trapped),
            errors: get(&self.errors),
            busy: get(&self.busy),
            on_error_deny: get(&self.on_error_deny),
            decisions: get(&self.decisions),
        }
    }
}

/// Asks every WASM policy of `set` that answers at `point`, in order, and counts each answer.
/// Each gives its decision, or on failure its `on_error` (`deny` with the failure as the
/// reason; `none`: nothing), as one more source of the decision (`plugin` its index in `set`).
/// The first deny ends the asking: nothing after it can beat it or be reported instead.
/// `until` is the decision's deadline, when the asker gave one: each call is cut at it.
pub(crate) fn ask_all(
    set: &[Arc<dyn PluginPolicy>],
    point: DecisionPoint,
    agent: &str,
    payload_json: &str,
    until: Option<Instant>,
    trace: Option<&SourceTrace>,
) -> Vec<super::command::Answer> {
    let mut out = Vec::new();
    for (i, p) in set.iter().enumerate() {
        if !p.answers(point) {
            continue;
        }
        let began = Instant::now();
        let a = p.ask(point, agent, payload_json, until);
        let elapsed = began.elapsed();
        p.counters().count(&a, p.on_error());
        // How it ended, in words: only built for a trace (`policy test --run-guards`).
        let (answered, outcome): (_, std::borrow::Cow<'static, str>) = match a {
            GuestAnswer::Decided(Some(d), reason, context) => {
                (Some((d, reason, context)), "answered".into())
            }
            GuestAnswer::Decided(None, ..) => (None, "answered nothing".into()),
            GuestAnswer::Failed(f) => {
                let said = format!("failed: {f}; on_error is {}", p.on_error().as_str()).into();
                match p.on_error() {
                    OnError::Deny => (
                        Some((
                            Decision::Deny,
                            Some(format!("WASM policy {} {f} (on_error: deny)", p.id())),
                            None,
                        )),
                        said,
                    ),
                    OnError::None => (None, said),
                }
            }
        };
        if trace.is_some() {
            trace_into(
                trace,
                SourceAnswer {
                    policy: p.id().to_string(),
                    source: "wasm",
                    decision: answered.as_ref().map(|a| a.0),
                    outcome: outcome.into_owned(),
                    elapsed,
                },
            );
        }
        let Some((decision, reason, context)) = answered else {
            continue;
        };
        out.push(super::command::Answer {
            order: ORDER_BASE + i,
            decision,
            reason: reason.unwrap_or_default(),
            policy: p.id().to_string(),
            context,
            command: None,
            plugin: Some(i),
        });
        if decision == Decision::Deny {
            break;
        }
    }
    out
}
