//! Payload JSON and NDJSON input, side by side in one run (ARCHITECTURE.md § Performance
//! targets; the table):
//!
//! * `payload/<event>`: per event kind, the library's writer (`Event::write_json`: our field
//!   writer with simd-json's SIMD escaper for strings of 32 bytes or more), the writer before
//!   the rewrite (kept here verbatim as a baseline: `former`, with the former `arguments`
//!   compactor, `fuzz/src/former_json.rs`), simd-json's whole serde serializer (`simd_json`)
//!   and serde_json's, both with an equivalent `#[derive(Serialize)]`. All four produce the
//!   same bytes (checked before timing).
//! * `strings/<case>`: one string literal, by length and escape density: our word-at-a-time
//!   escaper vs simd-json's SIMD one (what decides which writes a payload string).
//!   `tool_call_start` carries a 300 B `arguments` object; serde_json parses it into a
//!   `RawValue` on every event (the fair comparison: ours validates it on every event too).
//! * `arguments/<size>`: validating and embedding `arguments` objects of 300 B, 4 KiB and
//!   64 KiB: ours (`json::append_compact_str`, strict, whitespace stripped: what
//!   `Event::write_json` runs on a `&str`), `ours_bytes` (`json::append_compact`, the same on
//!   bytes not known to be UTF-8, as `Bus::publish` runs it), `former` (the compactor before
//!   the rewrite, `fuzz/src/former_json.rs`), serde_json (`RawValue` parse of the `&str`
//!   and a copy), simd-json (parse into a borrowed value and serialize; it also needs a mutable
//!   copy of the input, which is counted). The two inputs past 300 B are pretty-printed in part
//!   (`"k": v, ...`), so whitespace is stripped too.
//! * `ndjson/typical`: `run --events` lines parsed per second (a mix of the 8 events, 130–400 B
//!   each): `ndjson::parse_line`, and simd-json parsing the same lines into borrowed values as a
//!   reference for what a simd-json parser could reach.
//!
//! At the end: RATIOS (criterion medians) and the targets.

mod common;
/// The `arguments` compactor before the rewrite (shared with the fuzz oracle).
#[path = "../fuzz/src/former_json.rs"]
#[allow(dead_code)]
mod former_json;

use common::*;
use criterion::{BenchmarkId, Criterion, Throughput};
use prx_hooks::Event;
use serde::Serialize;
use serde_json::value::RawValue;
use std::hint::black_box;
use std::time::Duration;

/// 300 bytes of realistic tool arguments (an HTTP request), compact.
const ARGS: &str = r#"{"method":"POST","url":"https://api.example.com/v1/search?q=lock-free+ring","headers":{"content-type":"application/json","authorization":"Bearer sk-test-0123456789abcdef"},"body":{"query":"bounded mpsc \"ring\" buffer","limit":20,"filters":["code","docs"],"exact":false,"score":0.75},"timeout_ms":30000}"#;

/// The former hand-written payload writer, as it was before simd-json replaced it: the
/// baseline "today's writer" before the rewrite.
mod former {
    static ESCAPE: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 0x20 {
            t[i] = b'u';
            i += 1;
        }
        t[0x08] = b'b';
        t[0x09] = b't';
        t[0x0a] = b'n';
        t[0x0c] = b'f';
        t[0x0d] = b'r';
        t[b'"' as usize] = b'"';
        t[b'\\' as usize] = b'\\';
        t
    };
    const HEX: &[u8; 16] = b"0123456789abcdef";

    pub fn write_str(out: &mut Vec<u8>, s: &str) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        let bytes = s.as_bytes();
        let mut i = 0;
        loop {
            let j = next_special(bytes, i);
            out.extend_from_slice(&bytes[i..j]);
            let Some(&b) = bytes.get(j) else { break };
            let esc = ESCAPE[b as usize];
            if esc == b'u' {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            } else {
                out.extend_from_slice(&[b'\\', esc]);
            }
            i = j + 1;
        }
        out.push(b'"');
    }

    fn next_special(bytes: &[u8], mut from: usize) -> usize {
        while let Some(word) = bytes.get(from..from + 8) {
            let w = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
            const ONES: u64 = 0x0101_0101_0101_0101;
            const HIGHS: u64 = 0x8080_8080_8080_8080;
            let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
            let flags = (w.wrapping_sub(ONES * 0x20) & !w & HIGHS)
                | has_zero(w ^ (ONES * b'"' as u64))
                | has_zero(w ^ (ONES * b'\\' as u64));
            if flags != 0 {
                return from + (flags.trailing_zeros() / 8) as usize;
            }
            from += 8;
        }
        while from < bytes.len() && ESCAPE[bytes[from] as usize] == 0 {
            from += 1;
        }
        from
    }

    pub struct Object<'a> {
        pub out: &'a mut Vec<u8>,
        pub first: bool,
    }

    impl Object<'_> {
        pub fn key(&mut self, key: &str) {
            self.out.push(if self.first { b'{' } else { b',' });
            self.first = false;
            self.out.push(b'"');
            self.out.extend_from_slice(key.as_bytes());
            self.out.extend_from_slice(b"\":");
        }
        pub fn str(&mut self, key: &str, v: &str) {
            self.key(key);
            write_str(self.out, v);
        }
        pub fn u64(&mut self, key: &str, v: u64) {
            self.key(key);
            self.out
                .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        }
        pub fn bool(&mut self, key: &str, v: bool) {
            self.key(key);
            self.out
                .extend_from_slice(if v { b"true" } else { b"false" });
        }
        pub fn finish(self) {
            if self.first {
                self.out.push(b'{');
            }
            self.out.push(b'}');
        }
    }

    /// The former `Event::write_json`.
    pub fn write(ev: &prx_hooks::Event<'_>, out: &mut Vec<u8>) {
        use prx_hooks::Event;
        let mut w = Object { out, first: true };
        match *ev {
            Event::AgentStart { agent, session } => {
                w.str("agent", agent);
                w.str("session", session);
            }
            Event::AgentEnd {
                success,
                messages_count,
            } => {
                w.bool("success", success);
                w.u64("messages_count", messages_count);
            }
            Event::LlmRequest {
                provider,
                model,
                messages_count,
            } => {
                w.str("provider", provider);
                w.str("model", model);
                w.u64("messages_count", messages_count);
            }
            Event::LlmResponse {
                provider,
                model,
                duration_ms,
                success,
            } => {
                w.str("provider", provider);
                w.str("model", model);
                w.u64("duration_ms", duration_ms);
                w.bool("success", success);
            }
            Event::ToolCallStart { tool, arguments } => {
                w.str("tool", tool);
                w.key("arguments");
                let (src, depth) = (arguments.as_bytes(), prx_hooks::__private::json::MAX_DEPTH);
                if !crate::former_json::append_compact_within(w.out, src, true, depth) {
                    write_str(w.out, arguments);
                }
            }
            Event::ToolCall {
                tool,
                success,
                output,
            } => {
                w.str("tool", tool);
                w.bool("success", success);
                w.str("output", output);
            }
            Event::TurnComplete => {}
            Event::Error { component, message } => {
                w.str("component", component);
                w.str("message", message);
            }
            _ => {}
        }
        w.finish();
    }
}

/// serde_json's side: one derive struct per event, same fields, same order.
#[derive(Serialize)]
#[serde(untagged)]
enum Serde<'a> {
    AgentStart {
        agent: &'a str,
        session: &'a str,
    },
    AgentEnd {
        success: bool,
        messages_count: u64,
    },
    LlmRequest {
        provider: &'a str,
        model: &'a str,
        messages_count: u64,
    },
    LlmResponse {
        provider: &'a str,
        model: &'a str,
        duration_ms: u64,
        success: bool,
    },
    ToolCallStart {
        tool: &'a str,
        arguments: &'a RawValue,
    },
    ToolCall {
        tool: &'a str,
        success: bool,
        output: &'a str,
    },
    TurnComplete {},
    Error {
        component: &'a str,
        message: &'a str,
    },
}

/// serde_json (or, `simd`, simd-json's serde serializer) writing `ev` the way the pipeline
/// must: `arguments` parsed (validated) anew.
fn serde_write(ev: &Event<'_>, out: &mut Vec<u8>) {
    serde_or_simd(ev, out, false)
}

fn serde_or_simd(ev: &Event<'_>, out: &mut Vec<u8>, simd: bool) {
    if let (true, Event::ToolCallStart { tool, arguments }) = (simd, ev) {
        // simd-json has no raw values (it would write serde_json's RawValue as a struct):
        // it parses the arguments and writes them back (numbers re-spelt: `1e2` → `100.0`).
        #[derive(Serialize)]
        struct Tcs<'a> {
            tool: &'a str,
            arguments: simd_json::BorrowedValue<'a>,
        }
        let mut copy = arguments.as_bytes().to_vec();
        let arguments = simd_json::to_borrowed_value(&mut copy).unwrap();
        simd_json::serde::to_writer(out, &Tcs { tool, arguments }).unwrap();
        return;
    }
    let s = match *ev {
        Event::AgentStart { agent, session } => Serde::AgentStart { agent, session },
        Event::AgentEnd {
            success,
            messages_count,
        } => Serde::AgentEnd {
            success,
            messages_count,
        },
        Event::LlmRequest {
            provider,
            model,
            messages_count,
        } => Serde::LlmRequest {
            provider,
            model,
            messages_count,
        },
        Event::LlmResponse {
            provider,
            model,
            duration_ms,
            success,
        } => Serde::LlmResponse {
            provider,
            model,
            duration_ms,
            success,
        },
        Event::ToolCallStart { tool, arguments } => Serde::ToolCallStart {
            tool,
            arguments: serde_json::from_str(arguments).unwrap(),
        },
        Event::ToolCall {
            tool,
            success,
            output,
        } => Serde::ToolCall {
            tool,
            success,
            output,
        },
        Event::Error { component, message } => Serde::Error { component, message },
        _ => Serde::TurnComplete {},
    };
    if simd {
        simd_json::serde::to_writer(out, &s).unwrap();
    } else {
        serde_json::to_writer(out, &s).unwrap();
    }
}

/// One event of each kind, with realistic sizes (~130–400 B of payload).
fn events() -> Vec<(&'static str, Event<'static>)> {
    vec![
        (
            "agent_start",
            Event::AgentStart {
                agent: "research-agent",
                session: "session-2026-12-01-0001",
            },
        ),
        (
            "agent_end",
            Event::AgentEnd {
                success: true,
                messages_count: 42,
            },
        ),
        (
            "llm_request",
            Event::LlmRequest {
                provider: "anthropic",
                model: "claude-sonnet-4",
                messages_count: 17,
            },
        ),
        (
            "llm_response",
            Event::LlmResponse {
                provider: "anthropic",
                model: "claude-sonnet-4",
                duration_ms: 1834,
                success: true,
            },
        ),
        (
            "tool_call_start",
            Event::ToolCallStart {
                tool: "http_request",
                arguments: ARGS,
            },
        ),
        (
            "tool_call",
            Event::ToolCall {
                tool: TOOL,
                success: true,
                output: &LS[..262],
            },
        ),
        ("turn_complete", Event::TurnComplete),
        (
            "error",
            Event::Error {
                component: "tool_executor",
                message: "command failed: exit status 2 (stderr: \"ls: cannot access 'x': No such file or directory\")",
            },
        ),
    ]
}

/// An `arguments` object of about `bytes`, built from ARGS-like members, pretty-printed in
/// part so the compactor has whitespace to strip.
fn arguments_of(bytes: usize) -> String {
    let mut s = String::from("{");
    let mut i = 0;
    while s.len() + 2 < bytes {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "\n  \"k{i}\": {{\"path\": \"/src/module_{i}/file.rs\", \"line\": {}, \"ok\": true, \"tags\": [\"a\", \"b\\n\"], \"score\": {}.25}}",
            i * 7,
            i % 10
        ));
        i += 1;
    }
    s.push('}');
    s
}

/// Typical `run --events` lines: the 8 events as NDJSON.
fn ndjson_lines() -> Vec<String> {
    events()
        .into_iter()
        .map(|(name, ev)| {
            format!(
                r#"{{"event":"{name}","agent":"research-agent","session":"session-0001","payload":{}}}"#,
                ev.to_json()
            )
        })
        .collect()
}

fn main() {
    process_start();
    let mut c = Criterion::default().configure_from_args();
    let mut out: Vec<u8> = Vec::with_capacity(1 << 17);

    // Same bytes out, or the comparison means nothing.
    for (name, ev) in events() {
        let (mut a, mut b, mut s, mut j) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        ev.write_json(&mut a);
        former::write(&ev, &mut b);
        serde_write(&ev, &mut s);
        serde_or_simd(&ev, &mut j, true);
        assert_eq!(a, b, "{name}: the library and the former writer differ");
        assert_eq!(a, s, "{name}: the library and serde_json differ");
        assert_eq!(
            a, j,
            "{name}: the library and simd-json's serializer differ"
        );
    }

    let mut g = c.benchmark_group("payload");
    g.sample_size(40)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000));
    for (name, ev) in events() {
        out.clear();
        ev.write_json(&mut out);
        g.throughput(Throughput::Bytes(out.len() as u64));
        g.bench_function(BenchmarkId::new(name, "library"), |b| {
            b.iter(|| {
                out.clear();
                black_box(&ev).write_json(&mut out);
                black_box(out.len())
            })
        });
        g.bench_function(BenchmarkId::new(name, "simd_json"), |b| {
            b.iter(|| {
                out.clear();
                serde_or_simd(black_box(&ev), &mut out, true);
                black_box(out.len())
            })
        });
        g.bench_function(BenchmarkId::new(name, "former"), |b| {
            b.iter(|| {
                out.clear();
                former::write(black_box(&ev), &mut out);
                black_box(out.len())
            })
        });
        g.bench_function(BenchmarkId::new(name, "serde_json"), |b| {
            b.iter(|| {
                out.clear();
                serde_write(black_box(&ev), &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("arguments");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000));
    let sizes = [
        ("300B", ARGS.to_string()),
        ("4KiB", arguments_of(4096)),
        ("64KiB", arguments_of(65536)),
    ];
    for (size, args) in &sizes {
        g.throughput(Throughput::Bytes(args.len() as u64));
        let top = prx_hooks::__private::json::Top::Object;
        let depth = prx_hooks::__private::json::MAX_DEPTH;
        let (mut a, mut b, mut f) = (Vec::new(), Vec::new(), Vec::new());
        assert!(prx_hooks::__private::json::append_compact_str(
            &mut a, args, top, depth
        ));
        assert!(prx_hooks::__private::json::append_compact(
            &mut b,
            args.as_bytes(),
            top
        ));
        assert!(former_json::append_compact_within(
            &mut f,
            args.as_bytes(),
            true,
            depth
        ));
        assert!(a == b && a == f, "{size}: the compactors differ");
        g.bench_function(BenchmarkId::new(*size, "ours"), |b| {
            b.iter(|| {
                out.clear();
                black_box(prx_hooks::__private::json::append_compact_str(
                    &mut out,
                    black_box(args),
                    top,
                    depth,
                ))
            })
        });
        g.bench_function(BenchmarkId::new(*size, "ours_bytes"), |b| {
            b.iter(|| {
                out.clear();
                black_box(prx_hooks::__private::json::append_compact(
                    &mut out,
                    black_box(args.as_bytes()),
                    top,
                ))
            })
        });
        g.bench_function(BenchmarkId::new(*size, "former"), |b| {
            b.iter(|| {
                out.clear();
                black_box(former_json::append_compact_within(
                    &mut out,
                    black_box(args.as_bytes()),
                    true,
                    depth,
                ))
            })
        });
        g.bench_function(BenchmarkId::new(*size, "serde_json"), |b| {
            b.iter(|| {
                out.clear();
                let raw: &RawValue = serde_json::from_str(black_box(args)).unwrap();
                out.extend_from_slice(raw.get().as_bytes());
                black_box(out.len())
            })
        });
        let mut copy = args.as_bytes().to_vec();
        g.bench_function(BenchmarkId::new(*size, "simd_json"), |b| {
            b.iter(|| {
                out.clear();
                copy.clear();
                copy.extend_from_slice(black_box(args.as_bytes()));
                let v = simd_json::to_borrowed_value(&mut copy).unwrap();
                simd_json::serde::to_writer(&mut out, &v).unwrap();
                black_box(out.len())
            })
        });
    }
    g.finish();

    // Strings alone: the former word-at-a-time escaper vs simd-json's SIMD one, by length and
    // by how many escapes they hold (this is what decides which one writes a payload string).
    struct Simd<'a>(&'a mut Vec<u8>);
    impl simd_json::prelude::BaseGenerator for Simd<'_> {
        type T = Vec<u8>;
        fn get_writer(&mut self) -> &mut Vec<u8> {
            self.0
        }
        fn write_min(&mut self, _: &[u8], min: u8) -> std::io::Result<()> {
            self.0.push(min);
            Ok(())
        }
    }
    let plain =
        |n: usize| "abcdefghij klmnopqrstuvwxyz 0123456789 ".repeat(n / 39 + 1)[..n].to_string();
    let strings = [
        ("plain_16", plain(16)),
        ("plain_32", plain(32)),
        ("plain_64", plain(64)),
        ("plain_256", plain(256)),
        ("plain_4096", plain(4096)),
        ("plain_65536", plain(65536)),
        ("ls_262", LS[..262].to_string()),
        (
            "controls_4096",
            (0..4096).map(|i| char::from((i % 31 + 1) as u8)).collect(),
        ),
    ];
    let mut g = c.benchmark_group("strings");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(800));
    for (name, text) in &strings {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        former::write_str(&mut a, text);
        simd_json::prelude::BaseGenerator::write_string(&mut Simd(&mut b), text).unwrap();
        assert_eq!(a, b, "{name}");
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(BenchmarkId::new(*name, "swar"), |bch| {
            bch.iter(|| {
                out.clear();
                former::write_str(&mut out, black_box(text));
                black_box(out.len())
            })
        });
        g.bench_function(BenchmarkId::new(*name, "simd_json"), |bch| {
            bch.iter(|| {
                out.clear();
                let _ = simd_json::prelude::BaseGenerator::write_string(
                    &mut Simd(&mut out),
                    black_box(text),
                );
                black_box(out.len())
            })
        });
    }
    g.finish();

    let lines = ndjson_lines();
    let total: usize = lines.iter().map(String::len).sum();
    let mut g = c.benchmark_group("ndjson");
    g.sample_size(30)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .throughput(Throughput::Elements(lines.len() as u64));
    g.bench_function(BenchmarkId::new("typical", "parse_line"), |b| {
        b.iter(|| {
            for line in &lines {
                black_box(prx_hooks::ndjson::parse_line(black_box(line.as_bytes())).unwrap());
            }
        })
    });
    let mut copy = Vec::with_capacity(4096);
    g.bench_function(BenchmarkId::new("typical", "simd_json_value"), |b| {
        b.iter(|| {
            for line in &lines {
                copy.clear();
                copy.extend_from_slice(black_box(line.as_bytes()));
                black_box(simd_json::to_borrowed_value(&mut copy).unwrap());
            }
        })
    });
    g.finish();
    c.final_summary();

    let names: Vec<&str> = events().iter().map(|(n, _)| *n).collect();
    if median_ns(&format!("payload/{}/library", names[0])).is_none() {
        return; // test mode, or everything filtered out
    }
    println!("\nRATIOS (criterion medians, ns per event; below 1x = faster than the baseline)");
    for name in &names {
        let ours = format!("payload/{name}/library");
        print_time_ratio(&ours, &format!("payload/{name}/former"));
        print_time_ratio(&ours, &format!("payload/{name}/simd_json"));
        print_time_ratio(&ours, &format!("payload/{name}/serde_json"));
    }
    for (size, _) in &sizes {
        let ours = format!("arguments/{size}/ours");
        print_time_ratio(&ours, &format!("arguments/{size}/former"));
        print_time_ratio(&ours, &format!("arguments/{size}/serde_json"));
        print_time_ratio(&ours, &format!("arguments/{size}/simd_json"));
        print_time_ratio(
            &format!("arguments/{size}/ours_bytes"),
            &format!("arguments/{size}/serde_json"),
        );
    }
    print_time_ratio(
        "ndjson/typical/parse_line",
        "ndjson/typical/simd_json_value",
    );
    println!("\nTARGETS (medians)");
    for name in &names {
        let limit = if *name == "tool_call_start" { 0.8 } else { 0.5 };
        let (Some(ours), Some(serde)) = (
            median_ns(&format!("payload/{name}/library")),
            median_ns(&format!("payload/{name}/serde_json")),
        ) else {
            continue;
        };
        let ratio = ours / serde;
        println!(
            "payload/{name:<16} {ratio:.2}x serde_json  target <= {limit}x: {}",
            if ratio <= limit { "met" } else { "MISSED" }
        );
    }
    if let Some(per_batch) = median_ns("ndjson/typical/parse_line") {
        let per_line = per_batch / lines.len() as f64;
        let rate = 1e9 / per_line;
        println!(
            "ndjson parse_line: {:.0} ns per line ({} B average) = {:.2} M lines/s on one core  target >= 1 M/s: {}",
            per_line,
            total / lines.len(),
            rate / 1e6,
            if rate >= 1e6 { "met" } else { "MISSED" }
        );
    }
    print_machine_note();
}
