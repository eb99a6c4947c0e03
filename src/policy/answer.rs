//! A decision in each agent's own documented hook answer: what the Claude Code `http` door
//! and `prx-hooks-send --from AGENT` print (docs/policies.md § Doors).

use super::model::{Decision, Verdict};
use crate::agents::Agent;
use serde_json::{Map, Value, json};

/// The answer `agent`'s hook gives on `event` (its own event name, as
/// [`question`](super::question) reads it) for `verdict`; `{}` when nothing decides, the
/// agent is not one policies answer, or the agent has no way to say the decision.
///
/// - Claude Code (<https://code.claude.com/docs/en/hooks>): PreToolUse's
///   `hookSpecificOutput.permissionDecision` and its reason; PermissionRequest's
///   `decision.behavior`; UserPromptSubmit's `decision: "block"` and reason.
/// - Codex (<https://developers.openai.com/codex/hooks>): the same shapes, but its PreToolUse
///   acts only on `deny` (an `ask` there marks the hook failed), so `ask` is a deny
///   with the reason kept and `allow` says nothing.
/// - Gemini CLI (<https://geminicli.com/docs/hooks/reference>): `decision` (`allow` / `deny`)
///   and `reason` at the top level on BeforeTool and BeforeAgent; `ask` is a deny.
///
/// `ask` where the agent has none (PermissionRequest, UserPromptSubmit) is a deny with the
/// reason kept.
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::Agent;
/// use prx_hooks::policy::{Decision, Verdict, answer};
/// let v = Verdict::decided(Decision::Deny, "no");
/// assert_eq!(answer(Agent::GeminiCli, "BeforeTool", &v),
///            serde_json::json!({"decision": "deny", "reason": "no"}));
/// ```
pub fn answer(agent: Agent, event: &str, verdict: &Verdict) -> Value {
    let Some(decision) = verdict.decision else {
        return json!({});
    };
    match agent {
        Agent::ClaudeCode => claude_shaped(event, decision, verdict, true),
        Agent::Codex => claude_shaped(event, decision, verdict, false),
        Agent::GeminiCli => gemini_cli(event, decision, verdict),
        _ => json!({}),
    }
}

/// Claude Code's answer, or Codex's (`asks`: the PreToolUse answer may be `ask` and `allow`).
fn claude_shaped(event: &str, decision: Decision, v: &Verdict, asks: bool) -> Value {
    let reason = v.reason.clone().unwrap_or_default();
    let mut specific = Map::new();
    specific.insert("hookEventName".into(), event.into());
    match event {
        "PreToolUse" => {
            let said = match (decision, asks) {
                (d, true) => d,
                (Decision::Allow, false) => return json!({}),
                (_, false) => Decision::Deny,
            };
            specific.insert("permissionDecision".into(), said.as_str().into());
            specific.insert("permissionDecisionReason".into(), reason.into());
            if let Some(c) = &v.context {
                specific.insert("additionalContext".into(), c.clone().into());
            }
        }
        "PermissionRequest" => {
            let behavior = match decision {
                Decision::Allow => "allow",
                Decision::Ask | Decision::Deny => "deny",
            };
            let mut d = json!({"behavior": behavior});
            if behavior == "deny" {
                d["message"] = reason.into();
            }
            specific.insert("decision".into(), d);
        }
        _ => {
            if let Some(c) = &v.context {
                specific.insert("additionalContext".into(), c.clone().into());
            }
            let mut out = Map::new();
            if decision != Decision::Allow {
                out.insert("decision".into(), "block".into());
                out.insert("reason".into(), reason.into());
            }
            if specific.len() > 1 {
                out.insert("hookSpecificOutput".into(), Value::Object(specific));
            }
            return Value::Object(out);
        }
    }
    json!({ "hookSpecificOutput": specific })
}

/// Gemini CLI's answer on BeforeTool and BeforeAgent.
fn gemini_cli(event: &str, decision: Decision, v: &Verdict) -> Value {
    let mut out = Map::new();
    match decision {
        Decision::Allow => {
            out.insert("decision".into(), "allow".into());
        }
        Decision::Ask | Decision::Deny => {
            out.insert("decision".into(), "deny".into());
            out.insert("reason".into(), v.reason.clone().unwrap_or_default().into());
        }
    }
    if let (Some(c), "BeforeAgent") = (&v.context, event) {
        out.insert(
            "hookSpecificOutput".into(),
            json!({"hookEventName": event, "additionalContext": c}),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_decided_is_an_empty_object_for_every_agent() {
        for a in Agent::ALL {
            assert_eq!(
                answer(a, "PreToolUse", &Verdict::none(Default::default())),
                json!({})
            );
        }
    }

    #[test]
    fn codex_pre_tool_use_says_only_deny() {
        let ask = Verdict::decided(Decision::Ask, "sure?");
        assert_eq!(
            answer(Agent::Codex, "PreToolUse", &ask)["hookSpecificOutput"]["permissionDecision"],
            "deny"
        );
        let allow = Verdict::decided(Decision::Allow, "");
        assert_eq!(answer(Agent::Codex, "PreToolUse", &allow), json!({}));
        assert_eq!(
            answer(Agent::ClaudeCode, "PreToolUse", &allow)["hookSpecificOutput"]["permissionDecision"],
            "allow"
        );
    }
}
