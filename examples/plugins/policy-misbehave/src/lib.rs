//! `policy-misbehave`: a TEST-ONLY WASM policy (the `prx-hooks:policy` world,
//! wit/policy/policy.wit) whose answer is chosen by `[config] mode`, read once per instance.
//!
//! | mode      | on every `decide`                                                          |
//! |-----------|----------------------------------------------------------------------------|
//! | `noop`    | no decision (`none`): the benches' guest                                   |
//! | `allow`, `ask`, `deny` | that decision, with `[config] reason` (default `policy-misbehave: <mode>`) |
//! | `loop`    | spins forever (the deadline or fuel must stop it)                          |
//! | `memhog`  | grows its memory 1 MiB at a time, touching it, until refused (then traps)  |
//! | `sleep`   | `std::thread::sleep(sleep_ms)` (default an hour): blocks in `wasi:io/poll`  |
//! | `trap`    | executes `unreachable`                                                     |
//! | `err`     | `Err("guest error: as requested")`                                         |
//!
//! An unknown or missing mode answers `Err` naming it.
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

fn mode() -> &'static str {
    static MODE: OnceLock<String> = OnceLock::new();
    MODE.get_or_init(|| config::get("mode").unwrap_or_default())
}

fn answer(decision: Decision) -> Answer {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    let reason = REASON.get_or_init(|| config::get("reason")).clone();
    Answer {
        decision,
        reason: reason.or_else(|| Some(format!("policy-misbehave: {}", mode()))),
        context: config::get("context"),
    }
}

struct Misbehave;

impl Guest for Misbehave {
    fn decide(_point: String, _agent: String, _payload_json: String) -> Result<Answer, String> {
        match mode() {
            "noop" => Ok(Answer {
                decision: Decision::None,
                reason: None,
                context: None,
            }),
            "allow" => Ok(answer(Decision::Allow)),
            "ask" => Ok(answer(Decision::Ask)),
            "deny" => Ok(answer(Decision::Deny)),
            "loop" => spin(),
            "memhog" => memhog(),
            "sleep" => {
                let ms = config::get("sleep_ms")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(3_600_000);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(answer(Decision::Allow))
            }
            "trap" => core::arch::wasm32::unreachable(),
            "err" => Err("guest error: as requested".into()),
            "" => Err("policy-misbehave: config key `mode` is missing".into()),
            other => Err(format!("policy-misbehave: unknown mode {other:?}")),
        }
    }
}

/// Spins without end; `black_box` keeps the loop from being optimized away.
fn spin() -> Result<Answer, String> {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

/// Keeps 1 MiB blocks, each touched, until an allocation is refused (an abort: a trap).
fn memhog() -> Result<Answer, String> {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = vec![0u8; 1 << 20];
        block[0] = 1;
        kept.push(std::hint::black_box(block));
    }
}

export!(Misbehave);
