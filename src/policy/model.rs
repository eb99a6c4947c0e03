//! What a loaded policies.json is: decision points, decisions, rules and their conditions.

use crate::config::{Action, Matcher};
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Where an agent asks before going on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DecisionPoint {
    /// A tool is about to run (Claude Code's and Codex's PreToolUse, Gemini CLI's BeforeTool,
    /// the `tool_call_start` lifecycle event). The payload is `tool_call_start`'s:
    /// `{"tool": …, "arguments": {…}, …extra fields}`.
    ToolCallStart,
    /// A user prompt is about to be sent (UserPromptSubmit, BeforeAgent,
    /// beforeSubmitPrompt). The payload is the agent's object (`prompt`, …).
    Prompt,
    /// The agent is about to ask the user for a permission (Claude Code's PermissionRequest).
    /// The payload is shaped like `tool_call_start`'s (`tool`, `arguments`, …).
    Permission,
}

impl DecisionPoint {
    /// Every decision point.
    pub const ALL: [DecisionPoint; 3] = [
        DecisionPoint::ToolCallStart,
        DecisionPoint::Prompt,
        DecisionPoint::Permission,
    ];

    /// `tool_call_start`, `prompt` or `permission`, as policies.json writes it.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::DecisionPoint;
    /// assert_eq!(DecisionPoint::Prompt.as_str(), "prompt");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionPoint::ToolCallStart => "tool_call_start",
            DecisionPoint::Prompt => "prompt",
            DecisionPoint::Permission => "permission",
        }
    }

    /// The point named as policies.json writes it.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::DecisionPoint;
    /// assert_eq!(DecisionPoint::from_name("permission"), Some(DecisionPoint::Permission));
    /// assert_eq!(DecisionPoint::from_name("tool_call"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<DecisionPoint> {
        DecisionPoint::ALL.into_iter().find(|p| p.as_str() == name)
    }

    pub(crate) fn bit(self) -> u8 {
        1 << self as u8
    }

    /// Whether the point's payload names a tool (a `matcher` applies).
    pub fn has_tool(self) -> bool {
        !matches!(self, DecisionPoint::Prompt)
    }
}

impl fmt::Display for DecisionPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a policy answers. Ordered from the least to the most restrictive: when several
/// answer, the greatest wins (`deny` > `ask` > `allow`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Let it run without asking the user.
    Allow,
    /// Ask the user (agents without an ask turn it into a deny, the reason kept).
    Ask,
    /// Refuse, with the reason shown to the agent.
    Deny,
}

impl Decision {
    /// `allow`, `ask` or `deny`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(prx_hooks::policy::Decision::Deny.as_str(), "deny");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Ask => "ask",
            Decision::Deny => "deny",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Decision> {
        [Decision::Allow, Decision::Ask, Decision::Deny]
            .into_iter()
            .find(|d| d.as_str() == name)
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one condition tests the value at its path.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Test {
    /// The `regex` crate's regex, searching anywhere in the value unless anchored.
    Regex(regex::Regex),
    /// `*` and `?` over the whole value (case-sensitive).
    Glob(String),
    /// The value starts with this text.
    Prefix(String),
    /// The value equals this JSON value (strings, numbers, booleans, null, arrays, objects).
    Equals(serde_json::Value),
}

/// One key of a policy's `when`: a path into the payload and its test.
#[derive(Debug, Clone)]
pub struct Condition {
    /// The path as written (`arguments.command`).
    pub path: String,
    /// Its segments (`["arguments", "command"]`).
    pub(crate) segments: Vec<String>,
    /// The test.
    pub test: Test,
    /// Where its regex sits in the table's shared set for its path (set, pattern).
    pub(crate) in_set: Option<(usize, usize)>,
}

/// One rule of policies.json.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Policy {
    /// `id`, unique in the file.
    pub id: String,
    /// The decision points it answers (`on`).
    pub on: Vec<DecisionPoint>,
    pub(crate) points: u8,
    /// The tools it applies to (`matcher`; `None`: every tool).
    pub matcher: Option<Matcher>,
    /// Its matcher among the table's distinct ones.
    pub(crate) matcher_ix: Option<usize>,
    /// The agents it applies to (`agent`, the same syntax; `None`: every agent).
    pub agent: Option<Matcher>,
    /// `when`: every condition must hold (none: always).
    pub when: Vec<Condition>,
    /// What it answers when it matches.
    pub decision: Decision,
    /// Why, as the agent shows it.
    pub reason: String,
    /// Text added to the agent's context where the agent supports it.
    pub context: Option<String>,
    /// `enabled` (default true).
    pub enabled: bool,
    /// Its position among every policy of the file (command policies included).
    pub(crate) order: usize,
}

/// A loaded policies.json: the rules in file order.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PolicyTable {
    /// The rules, in file order.
    pub policies: Vec<Policy>,
    /// The command policies (`command`), in file order.
    pub commands: Vec<CommandPolicy>,
    /// The file's `timeout_ms`: each command policy's deadline unless it sets its own.
    pub timeout: Duration,
    /// The file's global switch (`"enabled": false` switches every policy off).
    pub enabled: bool,
    /// Where the table was read from (`None`: no file).
    pub source: Option<PathBuf>,
    /// Load-time warnings, as `FILE:LINE:COL: PATH: reason`.
    pub warnings: Vec<String>,
    /// What one decision computes once for every policy (built at load).
    pub(crate) index: Index,
    /// Where each policy's `id` is written (line, column), in file order (rules and command
    /// policies).
    pub(crate) id_at: Vec<(String, (usize, usize))>,
}

impl PolicyTable {
    /// Every policy's id (rules and command policies, in file order) with where it is written
    /// in the file (line, column, from 1).
    ///
    /// # Examples
    ///
    /// ```
    /// let t = prx_hooks::policy::parse(
    ///     b"{\"policies\": [\n {\"id\": \"a\", \"on\": \"prompt\", \"decision\": \"allow\"}]}",
    ///     "policies.json",
    /// ).unwrap();
    /// assert_eq!(t.ids().collect::<Vec<_>>(), [("a", (2, 9))]);
    /// ```
    pub fn ids(&self) -> impl Iterator<Item = (&str, (usize, usize))> {
        self.id_at.iter().map(|(id, at)| (id.as_str(), *at))
    }
}

/// A decision: what was decided, by which policy, why, and how long deciding took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Verdict {
    /// The winning decision; `None` when no policy decides (the agent's own flow).
    pub decision: Option<Decision>,
    /// The reason of the first policy, in file order, with the winning decision.
    pub reason: Option<String>,
    /// That policy's id.
    pub policy: Option<String>,
    /// That policy's `context`, if it has one.
    pub context: Option<String>,
    /// How long the decision took.
    #[serde(skip)]
    pub elapsed: Duration,
}

impl Verdict {
    /// No policy decides.
    pub fn none(elapsed: Duration) -> Verdict {
        Verdict {
            decision: None,
            reason: None,
            policy: None,
            context: None,
            elapsed,
        }
    }

    /// `decision` with `reason`, by no policy: what a door answers on its own (the fail mode
    /// of `prx-hooks-send --on-unreachable deny`).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::policy::{Decision, Verdict};
    /// let v = Verdict::decided(Decision::Deny, "the policy server could not be reached");
    /// assert_eq!(v.decision, Some(Decision::Deny));
    /// assert_eq!(v.policy, None);
    /// ```
    pub fn decided(decision: Decision, reason: impl Into<String>) -> Verdict {
        Verdict {
            decision: Some(decision),
            reason: Some(reason.into()),
            policy: None,
            context: None,
            elapsed: Duration::ZERO,
        }
    }
}

/// What a table shares between its policies so that one decision computes it once: the
/// distinct tool matchers, and per path one `RegexSet` of every regex written on it (built by
/// `PolicyTable::build_index` at load).
#[derive(Debug, Clone, Default)]
pub(crate) struct Index {
    pub(crate) matchers: Vec<Matcher>,
    pub(crate) sets: Vec<(Vec<String>, regex::RegexSet)>,
}
/// What a source that fails answers: a timeout, a crash, an answer that is not JSON or too
/// large.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OnError {
    /// No decision from this policy (the agent's own flow) — never `allow`.
    #[default]
    None,
    /// Deny, the failure given as the reason.
    Deny,
}

impl OnError {
    /// `none` or `deny`, as written.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::None => "none",
            OnError::Deny => "deny",
        }
    }
}

/// What one command or WASM policy answered in a decision, and how long it took
/// ([`Hooks::decide_traced`](crate::Hooks::decide_traced); `prx-hooks policy test
/// --run-guards` prints it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SourceAnswer {
    /// The policy's id.
    pub policy: String,
    /// `command` or `wasm`.
    pub source: &'static str,
    /// What it gave the decision, its `on_error` applied (`None`: nothing).
    pub decision: Option<Decision>,
    /// How it ended: `answered`, `answered nothing`, `cancelled …` or `failed: … ; on_error …`.
    pub outcome: String,
    /// From its start to its answer.
    pub elapsed: Duration,
}

/// Where a decision's sources write their [`SourceAnswer`]s, when asked to.
pub(crate) type SourceTrace = std::sync::Mutex<Vec<SourceAnswer>>;

/// Adds `a` to `trace`, when there is one.
pub(crate) fn trace_into(trace: Option<&SourceTrace>, a: SourceAnswer) {
    if let Some(t) = trace {
        t.lock().unwrap_or_else(|e| e.into_inner()).push(a);
    }
}

/// One command policy of policies.json (`command`, `args`, `timeout_ms`, `on_error`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommandPolicy {
    /// `id`, unique in the file (among rules too).
    pub id: String,
    /// The decision points it answers (`on`).
    pub on: Vec<DecisionPoint>,
    pub(crate) points: u8,
    /// The tools it runs for (`matcher`; `None`: every tool).
    pub matcher: Option<Matcher>,
    /// The agents it runs for (`agent`; `None`: every agent).
    pub agent: Option<Matcher>,
    /// `when`: it runs only when every condition holds (none: always).
    pub when: Vec<Condition>,
    /// `command` as written.
    pub command: String,
    /// `args`, passed as they are, without a shell.
    pub args: Vec<String>,
    /// `timeout_ms`: how long it may take before its process tree is killed.
    pub timeout: Duration,
    /// `on_error`: what a timeout, crash or bad answer gives.
    pub on_error: OnError,
    /// `enabled` (default true).
    pub enabled: bool,
    /// Its position among every policy of the file (rules included).
    pub(crate) order: usize,
    /// What the spawn runs: the program resolved at load, the workspace as cwd, stdin piped.
    pub(crate) action: Action,
}
