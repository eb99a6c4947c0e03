//! `policy-no-rm-rf`: a WASM policy (the `prx-hooks:policy` world, wit/policy/policy.wit) that
//! denies a shell command running `rm` with `-r` or `-f`, the example rule of docs/policies.md
//! written as a guest: the regex `\brm\s+-[a-zA-Z]*[rf]` searched in `arguments.command`.
//!
//! Anything else gets no decision (`none`), so the agent's own flow goes on, or `allow` with
//! `[config] otherwise = "allow"`. `[config] reason` replaces the reason given.
//!
//! Build with `examples/build-plugins.sh`.

wit_bindgen::generate!({
    path: ["../../../wit/deps/host", "../../../wit/policy"],
    world: "prx-hooks:policy/policy",
    generate_all,
});

use exports::prx_hooks::policy::decider::{Answer, Decision, Guest};
use prx::host::config;
use std::sync::OnceLock;

const DEFAULT_REASON: &str = "rm -rf is not allowed in this workspace";

fn rule() -> &'static regex::Regex {
    static RULE: OnceLock<regex::Regex> = OnceLock::new();
    RULE.get_or_init(|| regex::Regex::new(r"\brm\s+-[a-zA-Z]*[rf]").expect("a valid regex"))
}

fn otherwise() -> Decision {
    static OTHERWISE: OnceLock<bool> = OnceLock::new();
    if *OTHERWISE.get_or_init(|| config::get("otherwise").as_deref() == Some("allow")) {
        Decision::Allow
    } else {
        Decision::None
    }
}

fn reason() -> &'static str {
    static REASON: OnceLock<String> = OnceLock::new();
    REASON.get_or_init(|| config::get("reason").unwrap_or_else(|| DEFAULT_REASON.into()))
}

struct NoRmRf;

impl Guest for NoRmRf {
    fn decide(point: String, _agent: String, payload_json: String) -> Result<Answer, String> {
        let none = Answer {
            decision: Decision::None,
            reason: None,
            context: None,
        };
        if point != "tool_call_start" {
            return Ok(none);
        }
        let otherwise = Answer {
            decision: otherwise(),
            reason: None,
            context: None,
        };
        let payload: serde_json::Value =
            serde_json::from_str(&payload_json).map_err(|e| format!("payload: {e}"))?;
        let command = payload
            .get("arguments")
            .and_then(|a| a.get("command"))
            .and_then(serde_json::Value::as_str);
        match command {
            Some(c) if rule().is_match(c) => Ok(Answer {
                decision: Decision::Deny,
                reason: Some(reason().to_string()),
                context: None,
            }),
            _ => Ok(otherwise),
        }
    }
}

export!(NoRmRf);
