//! The decision lane: `<workspace>/policies.json` answers allow / deny / ask before a tool
//! runs, a prompt is sent or a permission is asked for (docs/policies.md, ARCHITECTURE.md
//! § Policies). Hooks observe; only policies decide, and only when asked.

mod agents;
mod answer;
mod command;
mod decider;
mod eval;
mod load;
mod load_command;
mod model;
mod plugins;

pub use agents::{Question, decision_point, question};
pub use answer::answer;
pub use command::{
    CommandCount, DEFAULT_TIMEOUT_MS, MAX_ANSWER_BYTES, MAX_COMMAND_POLICIES, MAX_TIMEOUT_MS,
};
pub(crate) use decider::Decider;
pub(crate) use eval::STATS_SECTION;
pub use eval::{DecideError, MAX_PAYLOAD_BYTES, PoliciesStats, PolicyCount, Trace};
pub use load::{
    MAX_CONDITIONS, MAX_FILE_BYTES, MAX_PATH_SEGMENTS, MAX_POLICIES, MAX_REGEX_BYTES,
    POLICIES_FILE, load, load_with_warnings, parse,
};
pub use model::{
    CommandPolicy, Condition, Decision, DecisionPoint, OnError, Policy, PolicyTable, SourceAnswer,
    Test, Verdict,
};
pub use plugins::PluginPolicyCount;
#[cfg(feature = "wasm")]
pub(crate) use plugins::{
    GuestAnswer, GuestFailure, PluginPolicies, PluginPolicy, PluginPolicyCounters,
};

/// The bus topic every decision is published under (when a subscription wants it).
pub const DECISION_TOPIC: &str = "prx.policy.decision";

/// The extra field a decided lifecycle event carries with its decision (`allow`, `ask`,
/// `deny`): set by the doors that both decide and ingest (docs/policies.md § Audit).
pub const DECISION_FIELD: &str = "policy_decision";
/// The extra field with the id of the policy reported (beside [`DECISION_FIELD`]).
pub const POLICY_ID_FIELD: &str = "policy_id";
/// The extra field with that policy's reason, when it has one.
pub const REASON_FIELD: &str = "policy_reason";
