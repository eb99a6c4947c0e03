//! The agents' own command-line programs, installed from npm at the versions pinned in
//! `tests/agents/versions`, each driven offline through one real session against a fake model
//! server (tests/support/models.rs): `prx-hooks connect AGENT` writes the agent's hooks, the
//! agent runs a shell command the fake model asks for, its hooks run `prx-hooks-send`, and every
//! event must reach a real `prx-hooks run --listen` (its hooks, the live stream, `tail --last`)
//! as the agent's table in its module says, once each and in order.
//!
//! Without the programs (a machine without npm) the binary prints one line saying how to
//! install them and passes; with `PRX_HOOKS_AGENTS=require` (`.ci/run` sets it) a missing
//! program fails, and a version other than the pinned one always does. `PRX_HOOKS_AGENTS=off`
//! skips them (one line each). docs/agents.md § Tested with the real CLIs.

#[path = "../support/models.rs"]
mod models;
#[path = "../otel/receiver.rs"]
mod receiver;
#[path = "../support/stderr.rs"]
mod stderr;
#[path = "../support/hooks.rs"]
mod support;

mod harness;
mod table;

mod claude_code;
mod codex;
mod copilot_cli;
mod factory_droid;
mod gemini_cli;
mod qwen_code;
