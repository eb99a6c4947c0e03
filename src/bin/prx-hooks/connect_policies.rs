//! `connect --policies`: our entries on the events an agent lets a hook decide, written so the
//! agent waits for the policies' answer (docs/connect.md § Decision points).
//!
//! Claude Code, Codex and Gemini CLI read a decision from a hook's stdout; `prx-hooks-send
//! --from AGENT` prints the server's there (docs/policies.md § Doors). Those entries are
//! synchronous command entries: Claude Code's other command entries are async (a decision
//! from an async hook has no effect), and its `http` hook fails open when the server is down,
//! so with `--on-unreachable deny` the decision points get command entries even with `--http`.

use super::agents::Hook;
use super::json::J;
use crate::hook_table::{Agent, HookEvent};
use crate::send::OnUnreachable;
use prx_hooks::agents::Handlers;
use std::path::Path;

/// The agents whose decision points `connect --policies` writes.
pub(crate) const AGENTS: [Agent; 3] = [Agent::ClaudeCode, Agent::Codex, Agent::GeminiCli];

/// How long the agent waits for a decision entry: 5 s (Gemini CLI counts milliseconds).
/// `send` gives up on the server after 2 s (its `--timeout`) and then applies the fail mode,
/// so its answer comes before the agent's own timeout.
const TIMEOUT_S: i64 = 5;

/// The decision deadline Claude Code's `http` entries on decision points tell the server
/// (`Prx-Decision-Deadline-Ms`): the entry's 5 s less a second for the way back.
const HTTP_DEADLINE_MS: i64 = TIMEOUT_S * 1000 - 1000;

/// The decision points' entries, as `connect` was asked for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Policies {
    /// What the entry answers when no server does.
    pub(crate) on_unreachable: OnUnreachable,
}

/// Whether `connect` writes decision entries: asked (`--policies`, `--on-unreachable`), or
/// the workspace holds policies ([`has_policies`]). `Err` for an agent policies do not
/// answer, when asked.
pub(crate) fn wanted(
    agent: Agent,
    asked: bool,
    on_unreachable: Option<OnUnreachable>,
    workspace: &Path,
) -> Result<Option<Policies>, String> {
    let asked = asked || on_unreachable.is_some();
    let found = has_policies(workspace);
    if !AGENTS.contains(&agent) {
        return match asked {
            true => Err(format!(
                "connect {agent}: --policies: policies answer only {}'s hooks so far; leave \
                 --policies and --on-unreachable out",
                AGENTS.map(Agent::name).join(", ")
            )),
            false => Ok(None),
        };
    }
    Ok((asked || found).then_some(Policies {
        on_unreachable: on_unreachable.unwrap_or(OnUnreachable::None),
    }))
}

/// Whether the workspace holds policies: a policies.json, or a plugin whose plugin.toml
/// declares `[policy]` (a WASM policy; a plugin.toml that does not load is not counted).
fn has_policies(workspace: &Path) -> bool {
    workspace.join(prx_hooks::policy::POLICIES_FILE).is_file()
        || prx_hooks::wasm::manifest::scan(workspace)
            .0
            .iter()
            .any(prx_hooks::wasm::manifest::Manifest::is_policy)
}

/// Our entry on `event` when it is a decision point of `agent` and decision entries are
/// wanted (`None`: the entry `connect` writes anyway).
pub(crate) fn entry(agent: Agent, event: &HookEvent, hook: &Hook) -> Option<J> {
    let policies = hook.policies?;
    prx_hooks::policy::decision_point(agent.lib(), event.name)?;
    let deny = policies.on_unreachable == OnUnreachable::Deny;
    // Claude Code waits for an `http` hook, and the server answers it with the decision, cut
    // to what the agent waits; only when the server is down must a command answer instead.
    if agent == Agent::ClaudeCode
        && let Some(url) = &hook.http
        && event.handlers.contains(Handlers::HTTP)
        && !deny
    {
        return Some(super::agents::claude_http(url, Some(HTTP_DEADLINE_MS)));
    }
    let command = if deny {
        format!("{} --on-unreachable deny", hook.command)
    } else {
        hook.command.clone()
    };
    let s = |v: &str| J::Str(v.to_string());
    let obj = |m: Vec<(&str, J)>| J::Obj(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    Some(match agent {
        Agent::GeminiCli => obj(vec![
            ("name", s("prx-hooks")),
            ("type", s("command")),
            ("command", s(&command)),
            ("timeout", J::Num(TIMEOUT_S * 1000)),
        ]),
        _ => obj(vec![
            ("type", s("command")),
            ("command", s(&command)),
            ("timeout", J::Num(TIMEOUT_S)),
        ]),
    })
}
