//! `bare-names`: a TEST-ONLY guest built from an unversioned copy of the WIT (`wit/` here), so it
//! imports `prx:host/log`, `prx:host/kv`, ... and exports `prx:plugin/hook-exports` without
//! `@0.1.0`. It logs each event at info and increments kv `count` (decimal ASCII).
//! Build with `examples/build-plugins.sh`.

wit_bindgen::generate!({
    path: "wit",
    world: "hook",
    generate_all,
});

use exports::prx::plugin::hook_exports::Guest;
use prx::host::{kv, log};

struct BareNames;

impl Guest for BareNames {
    fn on_event(event: String, payload_json: String) -> Result<(), String> {
        log::log(
            log::Level::Info,
            &format!("{event}: {} bytes", payload_json.len()),
        );
        let count = kv::get("count")
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        kv::set("count", count.to_string().as_bytes())
    }
}

export!(BareNames);
