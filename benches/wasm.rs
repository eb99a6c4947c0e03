//! WASM plugin calls (ARCHITECTURE.md § Performance targets: `on-event` on a reused instance, no-op guest, 300 B payload:
//! ≤ 150 ns over a direct wasmtime typed call with the same `Config`, fuel on in both; ≥ 2 M
//! calls/s per core).
//!
//! The guest is `examples/plugins/misbehave` in mode `noop` (build it with
//! `bash examples/build-plugins.sh`). Groups:
//! * `wasm_call/direct_typed_call` (baseline): the component instantiated with the same engine
//!   `Config`, WASI linked with its synchronous bindings (what the host did before it moved to
//!   `call_async`), `TypedFunc::call` in a loop, fuel set once (high), nothing else.
//! * `wasm_call/direct_async_call`: the same with the host's linker (async WASI) and
//!   `call_async`, polled by the executor's driver: what async costs by itself.
//! * `wasm_call/on_event`: the executor's per-call path on a reused instance: breaker check,
//!   fuel refill, deadline, the driven async call, outcome classification and counters.
//! * `wasm_reservation/{small,4gib}`: `on_event` with memories reserved at the plugin's 64 MiB
//!   limit (explicit bounds checks) and at 4 GiB (bounds checks elided by guard pages).
//! * `wasm_instance/replace`: a fresh instance from the `InstancePre` (the pooling allocator),
//!   what replacing a trapped or timed-out instance costs.
//! * `wasm_cold_start/{compile,cached}`: engine + compile (or load from the on-disk cache) +
//!   link: what `prx-hooks fire` / a restart pays per plugin.
//!
//! After the summary: the per-call overhead (on_event − direct), calls/s per core, and the
//! end-to-end rate through the pipeline (emit → worker → plugin queue → executor → on-event).

mod common;

use common::*;
use criterion::{Criterion, Throughput};
use prx_hooks::__private::wasm as __bench;
use prx_hooks::{Event, Hooks};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A 300-byte `tool_call_start` payload.
const ARGS: &str = r#"{"cmd":"cargo test --release --workspace --all-features -- --nocapture","cwd":"/home/agent/src/prx-hooks","env":{"RUST_LOG":"info","RUST_BACKTRACE":"1"},"timeout_ms":600000,"note":"a realistic tool call with a few fields, nested objects and some text to make it about 300 bytes"}"#;

fn guest() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/plugins/target/wasm32-wasip2/release/misbehave.wasm");
    assert!(
        path.is_file(),
        "{} is missing: run `bash examples/build-plugins.sh`",
        path.display()
    );
    path
}

fn noop_plugin(ws: &Path) -> PathBuf {
    let dir = ws.join("plugins/noop");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest(), dir.join("plugin.wasm")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        "[plugin]\nname = \"noop\"\nversion = \"1.0.0\"\n[[capabilities]]\ntype = \"hook\"\n\
         events = [\"*\"]\n[config]\nmode = \"noop\"\n",
    )
    .unwrap();
    dir
}

fn main() {
    let _ = process_start();
    let ws = tempfile::tempdir().expect("tempdir");
    let dir = noop_plugin(ws.path());
    let cache = __bench::cache(
        &ws.path().join("cache/prx-hooks/wasm"),
        &ws.path().join("state/prx-hooks/cache.key"),
    )
    .expect("a compile cache");
    let msg = prx_hooks::shell::event_message(
        &Event::ToolCallStart {
            tool: "shell",
            arguments: ARGS,
        },
        AGENT,
        SESSION,
        0,
    );
    let payload = msg.json_str().to_string();
    assert!((290..=330).contains(&payload.len()), "{}", payload.len());

    let (mut loaded, _) = __bench::load(&dir, Some(&cache), 0).expect("load the noop plugin");
    let (mut wide, _) = __bench::load(&dir, Some(&cache), 4096).expect("load with 4 GiB slots");
    assert!(
        loaded.call("tool_call_start", &msg),
        "the noop guest failed"
    );
    let mut direct = loaded.direct();
    assert!(direct.call("tool_call_start", &payload));
    let mut direct_async = loaded.direct_async();
    assert!(direct_async.call("tool_call_start", &payload));
    assert!(wide.call("tool_call_start", &msg));

    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("wasm_call");
        g.throughput(Throughput::Elements(1));
        g.bench_function("direct_typed_call", |b| {
            b.iter(|| direct.call("tool_call_start", &payload))
        });
        g.bench_function("direct_async_call", |b| {
            b.iter(|| direct_async.call("tool_call_start", &payload))
        });
        g.bench_function("on_event", |b| {
            b.iter(|| loaded.call("tool_call_start", &msg))
        });
        g.finish();
    }
    {
        let mut g = c.benchmark_group("wasm_reservation");
        g.throughput(Throughput::Elements(1));
        g.bench_function("small", |b| b.iter(|| loaded.call("tool_call_start", &msg)));
        g.bench_function("4gib", |b| b.iter(|| wide.call("tool_call_start", &msg)));
        g.finish();
    }
    {
        let mut g = c.benchmark_group("wasm_instance");
        g.bench_function("replace", |b| {
            b.iter_custom(|iters| (0..iters).map(|_| loaded.instantiate()).sum())
        });
        g.finish();
    }
    {
        let mut g = c.benchmark_group("wasm_cold_start");
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(8));
        g.bench_function("compile", |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let t = Instant::now();
                        let (l, _) = __bench::load(&dir, None, 0).unwrap();
                        let d = t.elapsed();
                        drop(l);
                        d
                    })
                    .sum()
            })
        });
        g.bench_function("cached", |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let t = Instant::now();
                        let (l, compiled) = __bench::load(&dir, Some(&cache), 0).unwrap();
                        let d = t.elapsed();
                        assert_eq!(compiled, prx_hooks::wasm::Compiled::Cached);
                        drop(l);
                        d
                    })
                    .sum()
            })
        });
        g.finish();
    }
    c.final_summary();
    if !bench_mode() {
        return;
    }

    println!("\nRATIOS");
    print_time_ratio("wasm_call/on_event", "wasm_call/direct_typed_call");
    print_time_ratio("wasm_call/direct_async_call", "wasm_call/direct_typed_call");
    print_time_ratio("wasm_reservation/small", "wasm_reservation/4gib");
    print_time_ratio("wasm_cold_start/cached", "wasm_cold_start/compile");
    if let (Some(ours), Some(base)) = (
        median_ns("wasm_call/on_event"),
        median_ns("wasm_call/direct_typed_call"),
    ) {
        let over = ours - base;
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        println!(
            "overhead per call        {:>9}  (target <= 150 ns: {})",
            fmt_ns(over),
            verdict(over <= 150.0)
        );
        let rate = 1e9 / ours;
        println!(
            "calls/s on one core      {:>9.2} M  (target >= 2 M: {})",
            rate / 1e6,
            verdict(rate >= 2e6)
        );
    }
    if let Some(r) = median_ns("wasm_instance/replace") {
        println!("instance replacement     {:>9}", fmt_ns(r));
    }

    // End to end: emit → worker → plugin queue → executor thread → on-event, paced so that the
    // plugin's queue never overflows.
    drop(loaded);
    drop(wide);
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let em = hooks.emitter(AGENT, SESSION);
    const N: u64 = 300_000;
    let ok = || {
        hooks.stats().plugins().unwrap().clone().plugins[0]
            .counts
            .ok
    };
    let t = Instant::now();
    let mut sent = 0;
    while sent < N {
        let done = ok();
        while sent < N && sent - done < 512 {
            em.emit(Event::ToolCallStart {
                tool: "shell",
                arguments: ARGS,
            });
            sent += 1;
        }
        std::thread::yield_now();
    }
    while ok() < N {
        std::thread::sleep(Duration::from_micros(200));
    }
    let secs = t.elapsed().as_secs_f64();
    let p = hooks.stats().plugins().unwrap().clone().plugins[0].clone();
    println!(
        "pipeline → plugin        {:>9.2} M calls/s  ({N} events, {} dropped)",
        N as f64 / secs / 1e6,
        p.counts.dropped
    );
    print_machine_note();
}
