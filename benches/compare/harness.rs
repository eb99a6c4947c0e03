//! The core's figures for `benches/compare.sh`: one process measures one tree, through the
//! public API only (what every release since the ring's first one offers), so the same source
//! builds against an earlier commit and the working tree.
//!
//! `harness figures SECS` prints one `name value` line per figure:
//!
//! * `emit_skipped_ns`: `emit` with nobody listening (the `Skipped` path), ns per call;
//! * `emit_burst_p50_ns`, `emit_burst_p99_ns`: each `emit` timed alone while a subscriber
//!   reads and the producer keeps the ring under a quarter full (timer cost subtracted);
//! * `to_1_delivered_mps`, `to_4_delivered_mps`: one producer emits `tool_call` events (200 B
//!   output) flat out for SECS while 1 or 4 subscribers on `prx.lifecycle.tool_call` count
//!   what they receive: events received per second by the slowest subscriber, the ring
//!   overflowing (drops are the ring's answer, not a failure);
//! * `to_1_offered_mps`: the producer's own rate in that run (emits per second, most of them
//!   `Dropped` once the ring is full);
//! * `to_1_sustained_mps`: events per second to one subscriber with the producer keeping at
//!   most 16,384 events in flight (nothing drops);
//! * `payload_<kind>_ns`: `Event::write_json` for each of the 8 kinds, typical sizes.
//!
//! `harness paced N` emits N events to one subscriber with a small window in flight, for
//! `valgrind --tool=callgrind`: the script reads the instructions of `produce` (the producer),
//! `Worker::run` (the worker) and `subscribe_count` (the subscriber) and divides the
//! difference between two N by the difference in events.

use prx_hooks::{Emit, Event, Hooks};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const AGENT: &str = "compare-agent";
const SESSION: &str = "compare-session";
const TOPIC: &str = "prx.lifecycle.tool_call";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("figures"), secs) => {
            let secs = secs.map_or(2.0, |s| s.parse().expect("SECS is a number"));
            figures(Duration::from_secs_f64(secs));
        }
        (Some("paced"), Some(n)) => paced(n.parse().expect("N is a number")),
        _ => {
            eprintln!("usage: harness figures [SECS] | harness paced N");
            std::process::exit(2);
        }
    }
}

fn output() -> String {
    "o".repeat(200)
}

fn figures(secs: Duration) {
    println!("emit_skipped_ns {:.3}", emit_skipped());
    let (p50, p99) = emit_burst();
    println!("emit_burst_p50_ns {p50:.1}");
    println!("emit_burst_p99_ns {p99:.1}");
    let (offered, delivered) = flat_out(1, secs);
    println!("to_1_offered_mps {offered:.3}");
    println!("to_1_delivered_mps {delivered:.3}");
    let (_, delivered4) = flat_out(4, secs);
    println!("to_4_delivered_mps {delivered4:.3}");
    println!("to_1_sustained_mps {:.3}", sustained(secs));
    for (name, ns) in payloads() {
        println!("payload_{name}_ns {ns:.1}");
    }
}

fn emit_skipped() -> f64 {
    let hooks = Hooks::builder().build().expect("build hooks");
    let em = hooks.emitter(AGENT, SESSION);
    let n = 20_000_000u64;
    let t0 = Instant::now();
    for _ in 0..n {
        black_box(em.emit(black_box(Event::TurnComplete)));
    }
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    hooks.shutdown(Duration::from_secs(5));
    ns
}

/// A thread counting what `sub` receives into the returned counter.
fn counter(sub: prx_hooks::bus::Subscription) -> (Arc<AtomicU64>, thread::JoinHandle<()>) {
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    let handle = thread::spawn(move || subscribe_count(&sub, &g));
    (got, handle)
}

#[inline(never)]
fn subscribe_count(sub: &prx_hooks::bus::Subscription, got: &AtomicU64) {
    let mut n = 0;
    while let Ok(msg) = sub.recv() {
        black_box(msg.json());
        n += 1;
        got.store(n, Ordering::Release);
    }
}

/// The median cost of two back-to-back `Instant::now()`.
fn timer_cost() -> f64 {
    let mut v: Vec<u64> = (0..10_001)
        .map(|_| {
            let a = Instant::now();
            let b = Instant::now();
            (b - a).as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2] as f64
}

fn emit_burst() -> (f64, f64) {
    let hooks = Hooks::builder().build().expect("build hooks");
    let (got, reader) = counter(hooks.bus().subscribe(TOPIC).expect("subscribe"));
    let em = hooks.emitter(AGENT, SESSION);
    let out = output();
    let quarter = 65_536 / 4;
    let n = 400_000u64;
    let mut times = Vec::with_capacity(n as usize);
    for i in 0..n {
        while i - got.load(Ordering::Acquire) > quarter {
            thread::sleep(Duration::from_micros(50));
        }
        let event = Event::ToolCall {
            tool: "shell",
            success: true,
            output: &out,
        };
        let t0 = Instant::now();
        let r = em.emit(event);
        let t = t0.elapsed();
        assert_eq!(r, Emit::Queued, "the ring is kept under a quarter full");
        times.push(t.as_nanos() as u64);
    }
    hooks.shutdown(Duration::from_secs(10));
    drop(hooks);
    reader.join().expect("reader");
    let timer = timer_cost();
    times.sort_unstable();
    let at = |q: f64| (times[((times.len() - 1) as f64 * q) as usize] as f64 - timer).max(0.0);
    (at(0.50), at(0.99))
}

/// One producer flat out for `secs`, `subs` subscribers counting: (offered, delivered to the
/// slowest subscriber), in millions per second.
fn flat_out(subs: usize, secs: Duration) -> (f64, f64) {
    let hooks = Hooks::builder().build().expect("build hooks");
    let counters: Vec<_> = (0..subs)
        .map(|_| counter(hooks.bus().subscribe(TOPIC).expect("subscribe")))
        .collect();
    let em = hooks.emitter(AGENT, SESSION);
    let out = output();
    let mut offered = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < secs {
        for _ in 0..1024 {
            black_box(em.emit(Event::ToolCall {
                tool: "shell",
                success: true,
                output: &out,
            }));
        }
        offered += 1024;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let delivered = counters
        .iter()
        .map(|(g, _)| g.load(Ordering::Acquire))
        .min()
        .unwrap_or(0);
    hooks.shutdown(Duration::from_secs(10));
    drop(hooks);
    for (_, h) in counters {
        h.join().expect("reader");
    }
    (
        offered as f64 / elapsed / 1e6,
        delivered as f64 / elapsed / 1e6,
    )
}

fn sustained(secs: Duration) -> f64 {
    let hooks = Hooks::builder().build().expect("build hooks");
    let (got, reader) = counter(hooks.bus().subscribe(TOPIC).expect("subscribe"));
    let em = hooks.emitter(AGENT, SESSION);
    let out = output();
    let mut sent = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < secs {
        while sent - got.load(Ordering::Acquire) > 16_384 {
            thread::sleep(Duration::from_micros(50));
        }
        for _ in 0..256 {
            let r = em.emit(Event::ToolCall {
                tool: "shell",
                success: true,
                output: &out,
            });
            assert_eq!(r, Emit::Queued, "the window keeps the ring from filling");
        }
        sent += 256;
    }
    while got.load(Ordering::Acquire) < sent {
        thread::sleep(Duration::from_micros(20));
    }
    let rate = sent as f64 / t0.elapsed().as_secs_f64() / 1e6;
    hooks.shutdown(Duration::from_secs(10));
    drop(hooks);
    reader.join().expect("reader");
    rate
}

fn payloads() -> Vec<(&'static str, f64)> {
    let out = output();
    let args = r#"{"cmd":"cargo test --workspace","cwd":"/src/app","env":{"RUST_LOG":"info"},"timeout_ms":120000}"#;
    let events = [
        (
            "agent_start",
            Event::AgentStart {
                agent: AGENT,
                session: SESSION,
            },
        ),
        (
            "agent_end",
            Event::AgentEnd {
                success: true,
                messages_count: 12,
            },
        ),
        (
            "llm_request",
            Event::LlmRequest {
                provider: "anthropic",
                model: "claude-sonnet-4",
                messages_count: 12,
            },
        ),
        (
            "llm_response",
            Event::LlmResponse {
                provider: "anthropic",
                model: "claude-sonnet-4",
                duration_ms: 1830,
                success: true,
            },
        ),
        (
            "tool_call_start",
            Event::ToolCallStart {
                tool: "shell",
                arguments: args,
            },
        ),
        (
            "tool_call",
            Event::ToolCall {
                tool: "shell",
                success: true,
                output: &out,
            },
        ),
        ("turn_complete", Event::TurnComplete),
        (
            "error",
            Event::Error {
                component: "tool",
                message: "shell exited with status 101",
            },
        ),
    ];
    let mut buf = Vec::with_capacity(1024);
    events
        .iter()
        .map(|(name, event)| {
            let n = 2_000_000u64;
            let t0 = Instant::now();
            for _ in 0..n {
                buf.clear();
                black_box(event).write_json(&mut buf);
                black_box(&buf);
            }
            (*name, t0.elapsed().as_nanos() as f64 / n as f64)
        })
        .collect()
}

/// `n` events to one subscriber, at most 2,048 in flight (for callgrind: see the module docs).
fn paced(n: u64) {
    let hooks = Hooks::builder().build().expect("build hooks");
    let (got, reader) = counter(hooks.bus().subscribe(TOPIC).expect("subscribe"));
    let em = hooks.emitter(AGENT, SESSION);
    produce(&em, n, &got);
    hooks.shutdown(Duration::from_secs(30));
    drop(hooks);
    reader.join().expect("reader");
    assert_eq!(got.load(Ordering::Acquire), n, "every event delivered");
}

#[inline(never)]
fn produce(em: &prx_hooks::Emitter, n: u64, got: &AtomicU64) {
    let out = output();
    for i in 0..n {
        if i % 256 == 0 {
            while i - got.load(Ordering::Acquire) > 2_048 {
                thread::sleep(Duration::from_micros(50));
            }
        }
        let r = em.emit(Event::ToolCall {
            tool: "shell",
            success: true,
            output: &out,
        });
        assert_eq!(r, Emit::Queued, "the window keeps the ring from filling");
    }
}
