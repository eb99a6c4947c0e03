//! What the host copies out of a guest's memory (ARCHITECTURE.md § WASM plugins): `log` and `events.publish` read the guest's strings in place. An 8 MiB log line
//! becomes one line cut to the log's line limit, and a 4 MiB publication is refused for its size
//! before anything is copied, so neither call raises the host's live heap by anything near the
//! string's size. Measured with a counting global allocator (linear memories are mapped by
//! wasmtime, not allocated on the heap, so only host copies show up). The tests of this binary
//! take turns ([`ALONE`]), so nothing else allocates beside the one measuring.
//!
//! Handles: every `wasi:cli/stdout` stream, pollable or other WASI resource a guest holds is a
//! host allocation in its store's resource table, and a stream keeps the partial line written
//! to it; a guest that opens streams and never closes them must not turn its small memory limit
//! into a large host heap.

#![cfg(feature = "wasm")]

#[path = "support/live_alloc.rs"]
mod live_alloc;
#[path = "support/plugins.rs"]
mod plugins;

use live_alloc::{PEAK, reset_peak};
use prx_hooks::EventKind;
use prx_hooks::wasm::{CallOutcome, WasmSink};
use std::sync::atomic::Ordering;

fn manifest(name: &str, config: &str) -> String {
    format!(
        "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n\
         [[capabilities]]\ntype = \"hook\"\nevents = [\"turn_complete\"]\n\n\
         [permissions]\nrequired = [\"log\", \"config\", \"events\"]\n\n\
         [resources]\nmax_memory_mb = 64\npool_size = 1\n\n[config]\n{config}\n"
    )
}

/// Held by each test: one measures at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The growth of the live heap at its highest while `f` runs.
fn peak_growth<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = reset_peak();
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

#[test]
fn a_big_log_line_and_an_oversized_publication_are_not_copied_to_the_host() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    plugins::install(
        ws,
        "biglog",
        "misbehave",
        &manifest("biglog", "mode = \"biglog\"\nsize = \"8388608\""),
    );
    plugins::install(
        ws,
        "bigpub",
        "misbehave",
        &manifest("bigpub", "mode = \"publish\"\nsize = \"4194304\""),
    );
    let sink = WasmSink::standalone(ws.to_path_buf()).unwrap();
    assert!(sink.errors().is_empty(), "{:?}", sink.errors());
    let msg = prx_hooks::shell::event_message(&prx_hooks::Event::TurnComplete, "a", "s", 0);
    // The first call instantiates each plugin (stores, WASI contexts): not what is measured.
    sink.fire(EventKind::TurnComplete, &msg);
    let (out, growth) = peak_growth(|| sink.fire(EventKind::TurnComplete, &msg));
    let by = |name: &str| {
        out.iter()
            .find(|o| o.plugin == name)
            .and_then(|o| o.outcome.clone())
            .unwrap_or_else(|| panic!("{name} did not answer: {out:?}"))
    };
    assert_eq!(by("biglog"), CallOutcome::Ok);
    match by("bigpub") {
        CallOutcome::Error(e) => assert!(e.contains("large") || e.contains("limit"), "{e}"),
        other => panic!("a 4 MiB publication must be refused: {other:?}"),
    }
    // A copy of either string would be 4 or 8 MiB; the calls themselves need a few KiB.
    assert!(
        growth < 1 << 20,
        "the live heap grew by {growth} bytes during the calls: a guest string was copied"
    );
    prx_hooks::Sink::shutdown(
        &sink,
        std::time::Instant::now() + std::time::Duration::from_secs(2),
    );
}

#[test]
fn stream_handles_a_guest_never_closes_cost_the_host_a_bounded_amount() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path();
    // 100,000 stdout streams, each holding 4095 bytes of a line that never ends: 400 MiB on the
    // host if each stream keeps its own line, from a guest allowed 16 MiB.
    plugins::install(
        ws,
        "handles",
        "misbehave",
        &manifest(
            "handles",
            "mode = \"handles\"\ncount = \"100000\"\nsize = \"4095\"",
        )
        .replace("max_memory_mb = 64", "max_memory_mb = 16"),
    );
    let sink = WasmSink::standalone(ws.to_path_buf()).unwrap();
    assert!(sink.errors().is_empty(), "{:?}", sink.errors());
    let msg = prx_hooks::shell::event_message(&prx_hooks::Event::TurnComplete, "a", "s", 0);
    let (out, growth) = peak_growth(|| sink.fire(EventKind::TurnComplete, &msg));
    let outcome = out
        .iter()
        .find(|o| o.plugin == "handles")
        .and_then(|o| o.outcome.clone())
        .unwrap_or_else(|| panic!("handles did not answer: {out:?}"));
    // Refused past the host's handle limit (a trap), or all opened within it.
    assert!(
        matches!(outcome, CallOutcome::Trap(_) | CallOutcome::Error(_)),
        "{outcome:?}"
    );
    eprintln!("handles: {outcome:?}, live heap +{growth} bytes at its highest");
    assert!(
        growth < 4 << 20,
        "the live heap grew by {} MiB while a guest with max_memory_mb = 16 opened streams \
         ({outcome:?})",
        growth >> 20
    );
    prx_hooks::Sink::shutdown(
        &sink,
        std::time::Instant::now() + std::time::Duration::from_secs(2),
    );
}
