//! The OpenTelemetry exporter's costs (docs/performance.md § OpenTelemetry export has the figures):
//!
//! * `otel_emit/exporter_off` vs `otel_emit/exporter_on`: one `tool_call_start` +
//!   `tool_call` pair emitted, with a drained bus subscriber in both, the exporter sending to a
//!   real in-process OTLP receiver in the second (criterion, same run);
//! * spans/s end to end and CPU per span: N tool-call spans emitted and exported by prx-hooks,
//!   against the OpenTelemetry Rust SDK's batch span processor and OTLP/HTTP protobuf
//!   exporter sending spans of the same name and attributes to the same receiver, same queue,
//!   batch size and delay, and a ring with room for the round, as the SDK's queue has;
//!   alternated rounds in one run after a warm-up pair. CPU is the process's, less the
//!   receiver thread's.
//!
//! `cargo bench --profile release --bench otel` (`PRX_HOOKS_OTEL_SPANS` sets N, 50,000;
//! `PRX_HOOKS_OTEL_ROUNDS` the rounds of each, 5; `PRX_HOOKS_OTEL_THREADS=1` prints what each
//! thread did in each round: CPU, time waiting for a core, sleeps, preemptions;
//! `PRX_HOOKS_OTEL_ONLY=prx` or `=sdk` runs one side only, for a profiler).

#[path = "../tests/otel/receiver.rs"]
mod receiver;

use criterion::Criterion;
use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, SpanKind, Tracer as _, TracerProvider as _};
use prx_hooks::otel::OtlpOptions;
use prx_hooks::{Emit, Event, Hooks};
use receiver::Receiver;
use std::hint::black_box;
use std::time::{Duration, Instant};

const BATCH: usize = 512;
const DELAY: Duration = Duration::from_millis(20);

fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a local timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Hooks with a drained bus subscriber (so events are queued, not skipped), with or without
/// the exporter.
fn hooks(rx: Option<&Receiver>) -> (Hooks, std::thread::JoinHandle<()>) {
    let mut b = Hooks::builder();
    if let Some(rx) = rx {
        b = b.otlp(OtlpOptions::new(&rx.url()).unwrap());
    }
    let hooks = b.build().unwrap();
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let drain = std::thread::spawn(move || while sub.recv().is_ok() {});
    (hooks, drain)
}

fn emit_on_off(c: &mut Criterion) {
    let rx = Receiver::start();
    let (off, off_drain) = hooks(None);
    let (on, on_drain) = hooks(Some(&rx));
    let mut g = c.benchmark_group("otel_emit");
    for (name, h) in [("exporter_off", &off), ("exporter_on", &on)] {
        let em = h.emitter("bench", "s");
        g.bench_function(name, |b| {
            b.iter(|| {
                black_box(em.emit(Event::ToolCallStart {
                    tool: "grep",
                    arguments: "{}",
                }));
                black_box(em.emit(Event::ToolCall {
                    tool: "grep",
                    success: true,
                    output: "",
                }))
            })
        });
    }
    g.finish();
    for (h, d) in [(off, off_drain), (on, on_drain)] {
        h.shutdown(Duration::from_secs(2));
        let _ = d.join();
    }
}

struct Round {
    secs: f64,
    cpu: Duration,
}

/// One thread's scheduler counters (`/proc/self/task/*`): CPU time, time runnable but waiting
/// for a core, and how often it slept (voluntary switches) or was preempted.
#[derive(Clone, Default)]
struct ThreadTimes {
    name: String,
    run_ns: u64,
    queued_ns: u64,
    sleeps: u64,
    preempted: u64,
}

fn threads() -> std::collections::HashMap<u64, ThreadTimes> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let p = e.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let sched: Vec<u64> = read("schedstat")
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        let status = read("status");
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        out.insert(
            tid,
            ThreadTimes {
                name: read("comm").trim().to_string(),
                run_ns: sched.first().copied().unwrap_or(0),
                queued_ns: sched.get(1).copied().unwrap_or(0),
                sleeps: field("voluntary_ctxt_switches:"),
                preempted: field("nonvoluntary_ctxt_switches:"),
            },
        );
    }
    out
}

/// With `PRX_HOOKS_OTEL_THREADS` set: what each thread did during a round, per span.
fn print_threads(
    who: &str,
    before: &std::collections::HashMap<u64, ThreadTimes>,
    n: usize,
    secs: f64,
) {
    if std::env::var_os("PRX_HOOKS_OTEL_THREADS").is_none() {
        return;
    }
    let after = threads();
    println!(
        "{who}: {:.1} ms; per thread: CPU ms, waiting for a core ms, sleeps, preemptions",
        secs * 1e3
    );
    let mut rows: Vec<_> = after.iter().collect();
    rows.sort_by_key(|(tid, _)| **tid);
    for (tid, a) in rows {
        let b = before.get(tid).cloned().unwrap_or_default();
        let run = a.run_ns.saturating_sub(b.run_ns);
        if run < 100_000 {
            continue;
        }
        println!(
            "  {:<36} {:>8.1} {:>8.1} {:>7} {:>7}  ({:.2} µs/span)",
            a.name,
            run as f64 / 1e6,
            a.queued_ns.saturating_sub(b.queued_ns) as f64 / 1e6,
            a.sleeps.saturating_sub(b.sleeps),
            a.preempted.saturating_sub(b.preempted),
            run as f64 / 1e3 / n as f64,
        );
    }
}

/// Emits `e`, yielding while the ring is full; how many tries were refused.
fn emit_retrying(em: &prx_hooks::Emitter, e: Event<'_>) -> u64 {
    let mut refused = 0;
    while em.emit(e) == Emit::Dropped {
        refused += 1;
        std::thread::yield_now();
    }
    refused
}

fn prx_round(rx: &Receiver, n: usize) -> Round {
    rx.clear();
    let opts = OtlpOptions::new(&rx.url())
        .unwrap()
        .queue(n + 16)
        .batch(BATCH, DELAY);
    // Room for the whole round in the ring too, as the SDK's queue has: neither side ever
    // refuses a span, so neither spends CPU retrying.
    let hooks = Hooks::builder()
        .ring_capacity(2 * n + 16)
        .otlp(opts)
        .build()
        .unwrap();
    let em = hooks.emitter("bench", "s");
    let before = threads();
    let (t0, c0, r0) = (Instant::now(), process_cpu(), rx.cpu());
    let mut refused = 0;
    for _ in 0..n {
        refused += emit_retrying(
            &em,
            Event::ToolCallStart {
                tool: "grep",
                arguments: "{}",
            },
        );
        refused += emit_retrying(
            &em,
            Event::ToolCall {
                tool: "grep",
                success: true,
                output: "",
            },
        );
    }
    emit_retrying(&em, Event::TurnComplete);
    let got = rx.wait_count(n + 1, Duration::from_secs(120));
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (process_cpu() - c0).saturating_sub(rx.cpu() - r0);
    assert_eq!(got, n + 1, "prx-hooks: every span arrived");
    print_threads(
        &format!("prx-hooks ({refused} emits refused by a full ring)"),
        &before,
        n,
        secs,
    );
    hooks.shutdown(Duration::from_secs(2));
    Round { secs, cpu }
}

/// The SDK's HTTP client: a blocking request on the batch processor's own thread, as the
/// SDK's default (reqwest-blocking) client does.
#[derive(Debug)]
struct Blocking(ureq::Agent);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Blocking {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = self.0.post(parts.uri.to_string());
        for (k, v) in &parts.headers {
            req = req.header(k.as_str(), v.to_str()?);
        }
        let resp = req.send(&body[..])?;
        let status = resp.status();
        let body = resp.into_body().read_to_vec()?;
        Ok(http::Response::builder().status(status).body(body.into())?)
    }
}

fn sdk_round(rx: &Receiver, n: usize) -> Round {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    rx.clear();
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{}/v1/traces", rx.url()))
        .with_http_client(Blocking(agent))
        .build()
        .unwrap();
    let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(n + 16)
        .with_max_export_batch_size(BATCH)
        .with_scheduled_delay(DELAY)
        .build();
    let bsp = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
        .with_batch_config(config)
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_span_processor(bsp)
        .build();
    let tracer = provider.tracer("bench");
    let before = threads();
    let (t0, c0, r0) = (Instant::now(), process_cpu(), rx.cpu());
    for _ in 0..n {
        let mut span = tracer
            .span_builder("execute_tool grep")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.conversation.id", "s"),
                KeyValue::new("gen_ai.agent.name", "bench"),
                KeyValue::new("gen_ai.tool.name", "grep"),
            ])
            .start(&tracer);
        span.end();
    }
    let got = rx.wait_count(n, Duration::from_secs(120));
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (process_cpu() - c0).saturating_sub(rx.cpu() - r0);
    assert_eq!(got, n, "SDK: every span arrived");
    print_threads("SDK", &before, n, secs);
    let _ = provider.shutdown();
    Round { secs, cpu }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn export_rates() {
    let var = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = var("PRX_HOOKS_OTEL_SPANS", 50_000);
    let pairs = var("PRX_HOOKS_OTEL_ROUNDS", 5).max(1);
    let rx = Receiver::start();
    let only = std::env::var("PRX_HOOKS_OTEL_ONLY").unwrap_or_default();
    assert!(
        ["", "prx", "sdk"].contains(&only.as_str()),
        "PRX_HOOKS_OTEL_ONLY={only}: expected prx or sdk"
    );
    // A warm-up pair, not counted: the first round of each side in a fresh process is the
    // slowest (memory the allocator hands out for the first time, a first connection).
    if only.is_empty() {
        prx_round(&rx, n);
        sdk_round(&rx, n);
    }
    let (mut ours, mut sdk) = (Vec::new(), Vec::new());
    // Alternated, each pair back to back: a change of the machine's load hits both alike.
    for _ in 0..pairs {
        if only != "sdk" {
            ours.push(prx_round(&rx, n));
        }
        if only != "prx" {
            sdk.push(sdk_round(&rx, n));
        }
    }
    if ours.is_empty() || sdk.is_empty() {
        for (name, rounds) in [("prx-hooks", &ours), ("SDK", &sdk)] {
            for r in rounds.iter() {
                let (rate, cpu) = (n as f64 / r.secs, r.cpu.as_secs_f64() * 1e6 / n as f64);
                println!("{name}: {rate:.0} spans/s, {cpu:.2} CPU µs/span");
            }
        }
        return;
    }
    let rate = |r: &Round| n as f64 / r.secs;
    let cpu = |r: &Round| r.cpu.as_secs_f64() * 1e6 / n as f64;
    println!(
        "\nexport end to end, {n} spans to one in-process OTLP/HTTP receiver, {pairs} alternated rounds each:"
    );
    println!(
        "{:<28} {:>12} {:>16}   per round: spans/s, CPU µs/span",
        "", "spans/s", "CPU µs/span"
    );
    for (name, rounds) in [
        ("prx-hooks exporter", &ours),
        ("OTel SDK batch processor", &sdk),
    ] {
        let each: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:.0}/{:.2}", rate(r), cpu(r)))
            .collect();
        println!(
            "{name:<28} {:>12.0} {:>16.2}   {}",
            median(rounds.iter().map(rate).collect()),
            median(rounds.iter().map(cpu).collect()),
            each.join(" ")
        );
    }
    let ratios = |f: &dyn Fn(&Round) -> f64| -> Vec<f64> {
        ours.iter().zip(&sdk).map(|(o, s)| f(o) / f(s)).collect()
    };
    for (what, v) in [("spans/s", ratios(&rate)), ("CPU per span", ratios(&cpu))] {
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "prx-hooks / SDK, {what}, per pair: median {:.2}×, range {:.2}–{:.2}×",
            median(v),
            sorted[0],
            sorted[sorted.len() - 1]
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    emit_on_off(&mut c);
    c.final_summary();
    export_rates();
}
