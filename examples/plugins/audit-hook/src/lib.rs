//! `audit-hook`: a minimal prx-hooks plugin, and the template to copy for your own.
//!
//! For every event it receives it:
//! 1. logs `"<event>: <N> bytes"` at info level (the host tags the line with the plugin's name);
//! 2. increments two counters in its kv store, `count` and `count.<event>` (decimal ASCII text);
//! 3. if `[config] echo_topic` is set, publishes `{"event":"<event>","payload":<payload>}` there.
//!
//! Build (from the repository root) with `examples/build-plugins.sh`, or directly:
//!
//! ```sh
//! rustup target add wasm32-wasip2
//! cargo build --release --target wasm32-wasip2 \
//!     --manifest-path examples/plugins/Cargo.toml --target-dir examples/plugins/target
//! ```
//!
//! then copy `examples/plugins/target/wasm32-wasip2/release/audit_hook.wasm` to
//! `<workspace>/plugins/audit-hook/plugin.wasm`, next to this crate's `plugin.toml`.

// Generates Rust bindings for the `hook` world in the repository's `wit/` directory: the host
// imports become plain functions (`prx::host::log::log`, ...) and the export becomes the `Guest`
// trait implemented below. `generate_all` also generates the imported `prx:host` interfaces,
// which live in `wit/deps/`.
wit_bindgen::generate!({
    path: "../../../wit",
    world: "hook",
    generate_all,
});

use exports::prx::plugin::hook_exports::Guest;
use prx::host::{config, events, kv, log};

struct AuditHook;

impl Guest for AuditHook {
    fn on_event(event: String, payload_json: String) -> Result<(), String> {
        log::log(
            log::Level::Info,
            &format!("{event}: {} bytes", payload_json.len()),
        );

        increment("count")?;
        increment(&format!("count.{event}"))?;

        // An empty or missing `echo_topic` turns echoing off.
        if let Some(topic) = config::get("echo_topic").filter(|t| !t.is_empty()) {
            // `payload_json` is JSON already, so it is embedded verbatim.
            let message = format!(
                r#"{{"event":{},"payload":{payload_json}}}"#,
                json_string(&event)
            );
            events::publish(&topic, &message)?;
        }
        Ok(())
    }
}

/// Adds one to the counter stored under `key` (decimal ASCII; missing or unreadable counts as 0).
fn increment(key: &str) -> Result<u64, String> {
    let current = kv::get(key)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|text| text.parse::<u64>().ok())
        .unwrap_or(0);
    let next = current + 1;
    kv::set(key, next.to_string().as_bytes())?;
    Ok(next)
}

/// `s` as a quoted JSON string (RFC 8259: escapes `"`, `\` and control characters).
fn json_string(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// Registers `AuditHook` as the component's `prx:plugin/hook-exports` implementation.
export!(AuditHook);
