//! Payload JSON per event (ARCHITECTURE.md § Performance targets: ≤ 150 ns per ~300 B event), against serde_json.
//!
//! Group `serialize`, each writing into a reused `Vec` (cleared, never shrunk):
//! * `write_json/tool_call`, `write_json/tool_call_start`: `Event::write_json`, the one payload
//!   writer the workers use.
//! * `serde_json/tool_call`: `serde_json::to_writer` of an equivalent `#[derive(Serialize)]`
//!   struct (same field order, same bytes out: checked before timing).
//! * `serde_json/tool_call_start`: `arguments` goes through `serde_json::from_str::<&RawValue>`
//!   for every event, then `to_writer`. This is the fair comparison: `write_json` validates the
//!   arguments on every event too (and strips whitespace, which RawValue does not; the bench's
//!   arguments are already compact, so both produce identical bytes).
//! * `serde_json_prevalidated/tool_call_start`: the `RawValue` is parsed once outside the loop,
//!   so serde_json only copies it — serde_json's best case, not something the pipeline could do
//!   (arguments arrive as fresh text on every event).
//!
//! At the end: RATIOS (criterion medians) and the target.

mod common;

use common::*;
use criterion::{BenchmarkId, Criterion, Throughput};
use prx_hooks::Event;
use serde::Serialize;
use serde_json::value::RawValue;
use std::hint::black_box;
use std::time::Duration;

const ARGS: &str = r#"{"method":"POST","url":"https://api.example.com/v1/search?q=lock-free+ring","headers":{"content-type":"application/json","authorization":"Bearer sk-test-0123456789abcdef"},"body":{"query":"bounded mpsc \"ring\" buffer","limit":20,"filters":["code","docs"],"exact":false,"score":0.75},"timeout_ms":30000}"#;

#[derive(Serialize)]
struct ToolCall<'a> {
    tool: &'a str,
    success: bool,
    output: &'a str,
}

#[derive(Serialize)]
struct ToolCallStart<'a> {
    tool: &'a str,
    arguments: &'a RawValue,
}

fn main() {
    process_start();
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("serialize");
    g.sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500));

    let output = &LS[..262];
    let tool_call = Event::ToolCall {
        tool: TOOL,
        success: true,
        output,
    };
    let tool_call_serde = ToolCall {
        tool: TOOL,
        success: true,
        output,
    };
    let tool_call_start = Event::ToolCallStart {
        tool: "http_request",
        arguments: ARGS,
    };
    let raw: &RawValue = serde_json::from_str(ARGS).unwrap();

    // Same bytes out, or the comparison means nothing.
    let mut a = Vec::with_capacity(4096);
    let mut b = Vec::with_capacity(4096);
    tool_call.write_json(&mut a);
    serde_json::to_writer(&mut b, &tool_call_serde).unwrap();
    assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
    let tool_call_len = a.len();
    a.clear();
    b.clear();
    tool_call_start.write_json(&mut a);
    serde_json::to_writer(
        &mut b,
        &ToolCallStart {
            tool: "http_request",
            arguments: raw,
        },
    )
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
    let tool_call_start_len = a.len();

    let mut out: Vec<u8> = Vec::with_capacity(4096);

    g.throughput(Throughput::Bytes(tool_call_len as u64));
    g.bench_function(BenchmarkId::new("write_json", "tool_call"), |bch| {
        bch.iter(|| {
            out.clear();
            black_box(&tool_call).write_json(&mut out);
            black_box(out.len())
        })
    });
    g.bench_function(BenchmarkId::new("serde_json", "tool_call"), |bch| {
        bch.iter(|| {
            out.clear();
            serde_json::to_writer(&mut out, black_box(&tool_call_serde)).unwrap();
            black_box(out.len())
        })
    });

    g.throughput(Throughput::Bytes(tool_call_start_len as u64));
    g.bench_function(BenchmarkId::new("write_json", "tool_call_start"), |bch| {
        bch.iter(|| {
            out.clear();
            black_box(&tool_call_start).write_json(&mut out);
            black_box(out.len())
        })
    });
    g.bench_function(BenchmarkId::new("serde_json", "tool_call_start"), |bch| {
        bch.iter(|| {
            out.clear();
            let arguments: &RawValue = serde_json::from_str(black_box(ARGS)).unwrap();
            let ev = ToolCallStart {
                tool: black_box("http_request"),
                arguments,
            };
            serde_json::to_writer(&mut out, &ev).unwrap();
            black_box(out.len())
        })
    });
    g.bench_function(
        BenchmarkId::new("serde_json_prevalidated", "tool_call_start"),
        |bch| {
            bch.iter(|| {
                out.clear();
                let ev = ToolCallStart {
                    tool: black_box("http_request"),
                    arguments: black_box(raw),
                };
                serde_json::to_writer(&mut out, &ev).unwrap();
                black_box(out.len())
            })
        },
    );
    g.finish();
    c.final_summary();

    let ids = [
        "serialize/write_json/tool_call",
        "serialize/serde_json/tool_call",
        "serialize/write_json/tool_call_start",
        "serialize/serde_json/tool_call_start",
        "serialize/serde_json_prevalidated/tool_call_start",
    ];
    if !ids.iter().any(|id| median_ns(id).is_some()) {
        return; // test mode, or everything filtered out
    }
    println!(
        "\nRATIOS (criterion medians, ns per event; payloads: tool_call {tool_call_len} B, \
         tool_call_start {tool_call_start_len} B; below 1x = faster than the baseline)"
    );
    print_time_ratio(
        "serialize/write_json/tool_call",
        "serialize/serde_json/tool_call",
    );
    print_time_ratio(
        "serialize/write_json/tool_call_start",
        "serialize/serde_json/tool_call_start",
    );
    print_time_ratio(
        "serialize/write_json/tool_call_start",
        "serialize/serde_json_prevalidated/tool_call_start",
    );
    println!("\nTARGETS (ARCHITECTURE.md § Performance targets; medians)");
    print_target("serialize/write_json/tool_call", 150.0);
    print_target("serialize/write_json/tool_call_start", 150.0);
    print_machine_note();
}
