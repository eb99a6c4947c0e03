//! `prx-hooks bench`: the pipeline measured end to end, with CPU per event per stage.
//!
//! The flags and the report: docs/cli.md § `bench`.

#[cfg(feature = "nats")]
use crate::nats_cli;
use crate::{BoxError, EventLimitArgs};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use prx_hooks::{Emitter, Event, Hooks};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Events to emit, all producers together.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Producer threads, each with its own emitter.
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Bus subscribers reading every event.
    #[arg(long, default_value_t = 1)]
    subscribers: usize,
    /// Bytes of the `output` field of each tool_call event.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Print the results as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limits: EventLimitArgs,
    /// Measure the NATS bridge instead: events/s through it to the server at URL, and emit's
    /// cost with the bridge off and on.
    #[cfg(feature = "nats")]
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// With --nats: publish to this JetStream stream with acks.
    #[cfg(feature = "nats")]
    #[arg(long, value_name = "NAME", requires = "nats")]
    nats_stream: Option<String>,
}

/// Waits (briefly, repeatedly) while the rings are a quarter full (so no single ring can fill)
/// or a subscriber queue is half full.
fn pace(hooks: &Hooks) {
    let busy = || {
        hooks.pending() > hooks.capacity() / 4
            || hooks
                .bus()
                .subscribers()
                .iter()
                .any(|s| s.queued > s.capacity / 2)
    };
    while busy() {
        thread::sleep(Duration::from_micros(200));
    }
}

/// Results of `prx-hooks bench`.
#[derive(serde::Serialize)]
pub(super) struct BenchReport {
    pub(super) events: u64,
    pub(super) producers: usize,
    pub(super) subscribers: usize,
    pub(super) payload_bytes: usize,
    /// Phase 1: producers emit flat out; every emit is timed. Drops are expected once the
    /// producers outrun the workers: that is the ring doing its job.
    pub(super) burst: Phase,
    /// Phase 2: producers keep the pipeline at most half full, so nothing may drop; this is
    /// the sustained delivery rate.
    pub(super) sustained: Phase,
    pub(super) timer_overhead_ns: u64,
}

#[derive(serde::Serialize)]
pub(super) struct Phase {
    pub(super) emit_ns: Option<Percentiles>,
    /// CPU time (not wall time: robust on a busy machine) each stage spent per event, from
    /// /proc/self/task/*/schedstat: producers per emit, workers per processed event,
    /// subscribers per received message.
    pub(super) cpu_ns_per_event: CpuPerEvent,
    pub(super) elapsed_s: f64,
    pub(super) emitted_per_s: f64,
    pub(super) delivered_per_s: f64,
    pub(super) delivered: u64,
    /// Refused by `emit`: ring full or byte budget exhausted.
    pub(super) ring_dropped: u64,
    /// Refused by `emit`: larger than `max_event_bytes` (never a matter of speed).
    pub(super) oversize: u64,
    pub(super) subscriber_dropped: u64,
}

#[derive(serde::Serialize)]
pub(super) struct CpuPerEvent {
    pub(super) producer: f64,
    pub(super) worker: f64,
    pub(super) subscriber: f64,
}

/// CPU nanoseconds the calling thread has run so far (0 where schedstat is unavailable).
pub(super) fn own_cpu_ns() -> u64 {
    cpu_ns(std::path::Path::new("/proc/thread-self/schedstat"))
}

pub(super) fn cpu_ns(schedstat: &std::path::Path) -> u64 {
    std::fs::read_to_string(schedstat)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU nanoseconds of this process's live threads whose name starts with `prefix`.
pub(super) fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .map(|t| cpu_ns(&t.path().join("schedstat")))
        .sum()
}

#[derive(serde::Serialize)]
pub(super) struct Percentiles {
    pub(super) p50: u64,
    pub(super) p99: u64,
    pub(super) p99_9: u64,
    pub(super) max: u64,
}

pub(super) fn bench(args: BenchArgs) -> Result<ExitCode, BoxError> {
    if args.producers == 0 || args.events == 0 {
        return Err("--producers and --events must be at least 1".into());
    }
    // An event is agent + session + tool + output (see `produce`).
    let event_bytes = "bench".len() + "producer-0".len() + "bench".len() + args.payload_bytes;
    if event_bytes > args.limits.max_event_bytes {
        say!(
            "prx-hooks bench: every event is {event_bytes} bytes, over max_event_bytes ({}): all are refused as oversize; raise it with --max-event-bytes",
            args.limits.max_event_bytes
        );
    }
    let overhead = timer_overhead();
    #[cfg(feature = "nats")]
    if let Some(url) = &args.nats {
        let report = nats_cli::bench(
            url,
            args.nats_stream.as_deref(),
            args.events,
            args.payload_bytes,
            overhead,
        )?;
        if args.json {
            out!("{}", serde_json::to_string(&report)?);
        } else {
            nats_cli::print_bench(&report);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let burst = bench_phase(&args, false, overhead)?;
    let sustained = bench_phase(&args, true, overhead)?;
    let report = BenchReport {
        events: args.events,
        producers: args.producers,
        subscribers: args.subscribers,
        payload_bytes: args.payload_bytes,
        burst,
        sustained,
        timer_overhead_ns: overhead,
    };
    if args.json {
        out!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// One run over a fresh pipeline: `paced` producers wait while the pipeline is half full and
/// are not timed; unpaced ones emit flat out and time every call.
pub(super) fn bench_phase(args: &BenchArgs, paced: bool, overhead: u64) -> Result<Phase, BoxError> {
    let hooks = Arc::new(
        Hooks::builder()
            .max_event_bytes(args.limits.max_event_bytes)
            .build()?,
    );
    let received = Arc::new(AtomicU64::new(0));
    let readers = start_readers(&hooks, args.subscribers, &received)?;

    let label = if paced { "sustained" } else { "burst" };
    let bar = ProgressBar::new(args.events).with_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {label:9} {{bar:40}} {{pos}}/{{len}} {{per_sec}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let output = "x".repeat(args.payload_bytes);
    let emitted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let producers: Vec<_> = (0..args.producers)
        .map(|p| {
            let share = args.events / args.producers as u64;
            let n = share + u64::from((p as u64) < args.events % args.producers as u64);
            let em = hooks.emitter("bench", &format!("producer-{p}"));
            let (hooks, output, emitted) = (hooks.clone(), output.clone(), emitted.clone());
            thread::spawn(move || {
                let samples = produce(&hooks, &em, n, &output, paced, &emitted);
                (samples, own_cpu_ns())
            })
        })
        .collect();
    while producers.iter().any(|p| !p.is_finished()) {
        bar.set_position(emitted.load(Ordering::Relaxed).min(args.events));
        thread::sleep(Duration::from_millis(50));
    }
    let mut samples = Vec::new();
    let mut producer_cpu = 0;
    for p in producers {
        let (s, cpu) = p.join().unwrap_or_default();
        samples.extend(s);
        producer_cpu += cpu;
    }
    let emit_elapsed = start.elapsed();
    bar.finish_and_clear();

    let delivered_at = wait_delivered(&hooks, args.subscribers, &received);
    let elapsed = delivered_at.max(start + emit_elapsed).duration_since(start);
    let stats = hooks.stats();
    let (worker_cpu, subscriber_cpu) = (
        threads_cpu_ns("prx-hooks-worke"),
        threads_cpu_ns("bench-subscribe"),
    );
    hooks.shutdown(Duration::from_secs(2));
    readers.into_iter().for_each(|r| {
        let _ = r.join();
    });

    let delivered = received.load(Ordering::Relaxed);
    let per = |cpu: u64, n: u64| cpu as f64 / n.max(1) as f64;
    Ok(Phase {
        cpu_ns_per_event: CpuPerEvent {
            producer: per(producer_cpu, args.events),
            worker: per(worker_cpu, stats.processed),
            subscriber: per(subscriber_cpu, delivered),
        },
        emit_ns: percentiles(samples, overhead),
        elapsed_s: elapsed.as_secs_f64(),
        emitted_per_s: args.events as f64 / emit_elapsed.as_secs_f64(),
        delivered_per_s: delivered as f64 / args.subscribers.max(1) as f64 / elapsed.as_secs_f64(),
        delivered,
        ring_dropped: stats.dropped + stats.dropped_budget,
        oversize: stats.oversize,
        subscriber_dropped: stats.subscribers.iter().map(|s| s.dropped).sum(),
    })
}

/// One thread per bus subscriber, counting what it receives into `received`.
fn start_readers(
    hooks: &Hooks,
    subscribers: usize,
    received: &Arc<AtomicU64>,
) -> Result<Vec<thread::JoinHandle<()>>, BoxError> {
    (0..subscribers)
        .map(|_| {
            let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
            let received = received.clone();
            Ok(thread::Builder::new()
                .name("bench-subscriber".into())
                .spawn(move || {
                    for _ in sub.iter() {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                })?)
        })
        .collect()
}

/// Waits until every queued event has reached every subscriber or been counted as dropped
/// (or nothing arrived for 10 s); returns when the last one arrived.
fn wait_delivered(hooks: &Hooks, subscribers: usize, received: &AtomicU64) -> Instant {
    let expected = hooks.stats().queued * subscribers as u64;
    let mut last = (received.load(Ordering::Relaxed), Instant::now());
    loop {
        let got = received.load(Ordering::Relaxed);
        let dropped: u64 = hooks.stats().subscribers.iter().map(|s| s.dropped).sum();
        if got != last.0 {
            last = (got, Instant::now());
        }
        if got + dropped >= expected || last.1.elapsed() > Duration::from_secs(10) {
            return last.1;
        }
        thread::sleep(Duration::from_micros(100));
    }
}

/// The emit latencies' percentiles, less the timer's own cost (none without samples).
fn percentiles(mut samples: Vec<u64>, overhead: u64) -> Option<Percentiles> {
    samples.sort_unstable();
    let pick = |q: f64| {
        let i = ((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1));
        samples.get(i).map_or(0, |s| s.saturating_sub(overhead))
    };
    (!samples.is_empty()).then(|| Percentiles {
        p50: pick(0.5),
        p99: pick(0.99),
        p99_9: pick(0.999),
        max: pick(1.0),
    })
}

/// One producer thread's loop; returns its latency samples (none when paced).
pub(super) fn produce(
    hooks: &Hooks,
    em: &Emitter,
    n: u64,
    output: &str,
    paced: bool,
    emitted: &AtomicU64,
) -> Vec<u64> {
    let event = Event::ToolCall {
        tool: "bench",
        success: true,
        output,
    };
    let mut samples = Vec::with_capacity(if paced { 0 } else { n as usize });
    for i in 0..n {
        if i.is_multiple_of(4096) {
            emitted.fetch_add(4096.min(n - i), Ordering::Relaxed);
        }
        if paced {
            if i.is_multiple_of(256) {
                pace(hooks);
            }
            em.emit(event);
        } else {
            let t = Instant::now();
            em.emit(event);
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    samples
}

/// The median cost of the `Instant::now()` pair around each emit, subtracted from the samples.
pub(super) fn timer_overhead() -> u64 {
    let mut v: Vec<u64> = (0..10_001)
        .map(|_| {
            let t = Instant::now();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}

pub(super) fn print_report(r: &BenchReport) {
    out!(
        "{} events, {} producer(s), {} subscriber(s), {}-byte payloads",
        r.events,
        r.producers,
        r.subscribers,
        r.payload_bytes
    );
    for (name, p) in [("burst", &r.burst), ("sustained", &r.sustained)] {
        out!("{name}:");
        if let Some(e) = &p.emit_ns {
            out!(
                "  emit latency  p50 {} ns   p99 {} ns   p99.9 {} ns   max {} ns   ({} ns timer overhead subtracted)",
                e.p50,
                e.p99,
                e.p99_9,
                e.max,
                r.timer_overhead_ns
            );
        }
        out!("  emitted       {:.0} events/s", p.emitted_per_s);
        out!(
            "  delivered     {:.0} events/s per subscriber ({} messages in {:.3} s)",
            p.delivered_per_s,
            p.delivered,
            p.elapsed_s
        );
        out!(
            "  dropped       ring {}   subscribers {}   oversize {}",
            p.ring_dropped,
            p.subscriber_dropped,
            p.oversize
        );
        let c = &p.cpu_ns_per_event;
        out!(
            "  CPU per event producer {:.0} ns   worker {:.0} ns   subscriber {:.0} ns",
            c.producer,
            c.worker,
            c.subscriber
        );
    }
}
