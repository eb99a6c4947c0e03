//! The live stream (`GET /api/events`) under load, against baselines run in the same process:
//!
//! * **DELIVERY** — events/s delivered to 1 and to 10 SSE clients (real TCP clients on
//!   loopback, each on its own thread, decoding the chunked body and counting events), the
//!   producer emitting flat out (kept from filling the ring, as `prx-hooks bench` does), with
//!   the events each client lost (`dropped`). Baseline: the same events to one in-process bus
//!   subscriber.
//! * **PACED** — the same clients with the producer held to a fixed rate (bursts of 500 every
//!   10 ms, 50,000 events/s): what a client keeps up with, and whether anything was lost.
//! * **EMIT** — what `emit` costs its caller with 10 SSE clients attached and reading, beside
//!   the same with no client (a plain bus subscriber keeps the events queued, not skipped, in
//!   both): batches of 1,024 back-to-back emits timed as a whole, the pipeline drained between
//!   batches; rounds without clients, then with, then without again; median ns per emit.
//!
//! `cargo bench --bench events` (with `-- --quick`, or under `cargo test --benches`, a short
//! run). It prints the machine's load average before and after, and CPU busy/steal during.

mod common;

use common::*;
use prx_hooks::http::{EventStreamOptions, HttpOptions, Server, Token};
use prx_hooks::{Emit, Event, Hooks};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-token-0123456789abcdef";
const NEEDLE: &[u8] = b"event: prx.lifecycle.tool_call\n";
const DROPPED: &[u8] = b"event: dropped\ndata: {\"count\":";

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A streaming client: counts the events of its stream and the losses it is told of.
struct Client {
    events: Arc<AtomicU64>,
    lost: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        write!(
            s,
            "GET /api/events?kinds=bus&pattern=prx.lifecycle.* HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        let (events, lost, stop) = (Arc::default(), Arc::default(), Arc::default());
        let (e, l, st) = (Arc::clone(&events), Arc::clone(&lost), Arc::clone(&stop));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || read_stream(s, &e, &l, &st, ready_tx));
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the stream did not start");
        Client {
            events,
            lost,
            stop,
            thread: Some(thread),
        }
    }

    fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads the response: skips the head, decodes the chunked body and counts `NEEDLE` in it
/// (and adds up the counts of `dropped` notices), across chunk and read boundaries.
fn read_stream(
    mut s: TcpStream,
    events: &AtomicU64,
    lost: &AtomicU64,
    stop: &AtomicBool,
    ready: std::sync::mpsc::Sender<()>,
) {
    let finder = memchr::memmem::Finder::new(NEEDLE);
    let dropped = memchr::memmem::Finder::new(DROPPED);
    let mut buf = vec![0u8; 256 << 10];
    let mut head = Vec::new();
    // Decoded body bytes not yet searched (a match may straddle two reads).
    let mut body: Vec<u8> = Vec::with_capacity(512 << 10);
    enum St {
        Head,
        Size(Vec<u8>),
        Data(usize),
        Crlf(u8),
    }
    let mut st = St::Head;
    let mut said_ready = false;
    let (mut needle_from, mut drop_from) = (0usize, 0usize);
    while !stop.load(Ordering::Relaxed) {
        let n = match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => return,
        };
        let mut i = 0;
        while i < n {
            match &mut st {
                St::Head => {
                    head.push(buf[i]);
                    i += 1;
                    if head.ends_with(b"\r\n\r\n") {
                        assert!(
                            head.starts_with(b"HTTP/1.1 200"),
                            "{}",
                            String::from_utf8_lossy(&head)
                        );
                        st = St::Size(Vec::new());
                    }
                }
                St::Size(sz) => {
                    let b = buf[i];
                    i += 1;
                    if b == b'\n' {
                        let text = String::from_utf8_lossy(sz).trim().to_string();
                        let len = usize::from_str_radix(&text, 16).unwrap_or(0);
                        if len == 0 {
                            return;
                        }
                        st = St::Data(len);
                    } else {
                        sz.push(b);
                    }
                }
                St::Data(left) => {
                    let take = (*left).min(n - i);
                    body.extend_from_slice(&buf[i..i + take]);
                    i += take;
                    *left -= take;
                    if *left == 0 {
                        st = St::Crlf(2);
                    }
                }
                St::Crlf(left) => {
                    i += 1;
                    *left -= 1;
                    if *left == 0 {
                        st = St::Size(Vec::new());
                    }
                }
            }
        }
        if !said_ready && memchr::memmem::find(&body, b"event: ready\n").is_some() {
            said_ready = true;
            let _ = ready.send(());
        }
        // Matches starting before `needle_from` / `drop_from` were counted already.
        let found = finder.find_iter(&body[needle_from..]).count() as u64;
        if found > 0 {
            events.fetch_add(found, Ordering::Relaxed);
        }
        needle_from = body.len().saturating_sub(NEEDLE.len() - 1).max(needle_from);
        let mut cut_short = false;
        for at in dropped
            .find_iter(&body[drop_from..])
            .map(|m| m + drop_from)
            .collect::<Vec<_>>()
        {
            let rest = &body[at + DROPPED.len()..];
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            if digits == rest.len() {
                drop_from = at; // the count may go on in the next read
                cut_short = true;
                break;
            }
            let n: u64 = std::str::from_utf8(&rest[..digits])
                .unwrap()
                .parse()
                .unwrap_or(0);
            lost.fetch_add(n, Ordering::Relaxed);
            drop_from = at + 1;
        }
        if !cut_short {
            drop_from = drop_from.max(body.len().saturating_sub(DROPPED.len() - 1));
        }
        // Forget what no match can start in any more.
        let cut = needle_from.min(drop_from);
        body.drain(..cut);
        needle_from -= cut;
        drop_from -= cut;
    }
}

fn start(opts: EventStreamOptions) -> (Arc<Hooks>, Server) {
    // PRX_EVENTS_QUEUE sets the per-client queue (default: the library's).
    let opts = match std::env::var("PRX_EVENTS_QUEUE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(q) => opts.queue(q),
        None => opts,
    };
    let hooks = Arc::new(Hooks::builder().build().unwrap());
    let options = HttpOptions::new(Token::new(TOKEN, "bench").unwrap()).events(opts);
    let server = Server::start(hooks.clone(), options, "127.0.0.1:0".parse().unwrap()).unwrap();
    (hooks, server)
}

/// Emits `n` tool_call events from one emitter, flat out but keeping the ring at most a
/// quarter full; returns when the last is queued.
fn produce(hooks: &Hooks, n: u64) {
    let em = hooks.emitter(AGENT, SESSION);
    let output = output_200();
    let limit = hooks.capacity() / 4;
    for i in 0..n {
        if i % 256 == 0 {
            while hooks.pending() > limit {
                std::hint::spin_loop();
            }
        }
        while em.emit(Event::ToolCall {
            tool: TOOL,
            success: true,
            output,
        }) != Emit::Queued
        {
            std::thread::yield_now();
        }
    }
}

/// Waits until `done` says every event arrived, or nothing moved for 3 s.
fn settle(mut progress: impl FnMut() -> (u64, bool)) -> Instant {
    let mut last = (0, Instant::now());
    loop {
        let (count, done) = progress();
        if done {
            return Instant::now();
        }
        if count != last.0 {
            last = (count, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(3) {
            return last.1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn delivery(n: u64) {
    println!("DELIVERY: {n} tool_call events (200 B output) from one producer, flat out");
    // Baseline: one in-process bus subscriber.
    {
        let (hooks, _server) = start(EventStreamOptions::default());
        let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        let reader = std::thread::spawn(move || {
            while g.load(Ordering::Relaxed) < n {
                if sub.recv_timeout(Duration::from_secs(5)).is_err() {
                    return;
                }
                g.fetch_add(1, Ordering::Relaxed);
            }
        });
        let t0 = Instant::now();
        produce(&hooks, n);
        let end = settle(|| {
            (
                got.load(Ordering::Relaxed),
                got.load(Ordering::Relaxed) >= n,
            )
        });
        let _ = reader.join();
        let secs = (end - t0).as_secs_f64();
        println!(
            "  baseline, 1 bus subscriber (in-process): {:>10.0} events/s ({} of {n})",
            got.load(Ordering::Relaxed) as f64 / secs,
            got.load(Ordering::Relaxed)
        );
    }
    for k in [1usize, 10] {
        let (hooks, server) = start(EventStreamOptions::default());
        let clients: Vec<Client> = (0..k)
            .map(|_| Client::connect(server.local_addr()))
            .collect();
        let t0 = Instant::now();
        produce(&hooks, n);
        let end = settle(|| {
            let all = clients
                .iter()
                .map(|c| c.events() + c.lost())
                .min()
                .unwrap_or(0);
            (clients.iter().map(Client::events).sum(), all >= n)
        });
        let secs = (end - t0).as_secs_f64();
        let got: Vec<u64> = clients.iter().map(Client::events).collect();
        let lost: u64 = clients.iter().map(Client::lost).sum();
        let stats = server.event_stats();
        let per_client = got.iter().sum::<u64>() as f64 / k as f64 / secs;
        println!(
            "  {k:>2} SSE client(s): {:>10.0} events/s per client, {:>10.0} frames/s in all; \
             received {} of {} ({lost} lost, told; unaccounted {}; server: {} lost by slow \
             clients, {} by the stream itself)",
            per_client,
            per_client * k as f64,
            got.iter().sum::<u64>(),
            n * k as u64,
            (n * k as u64).saturating_sub(got.iter().sum::<u64>() + lost),
            stats.dropped_client,
            stats.dropped_server
        );
        drop(clients);
    }
}

fn paced(n: u64, rate: u64) {
    println!("PACED: {n} events at {rate} events/s");
    let burst = rate / 100;
    for k in [1usize, 10] {
        let (hooks, server) = start(EventStreamOptions::default());
        let clients: Vec<Client> = (0..k)
            .map(|_| Client::connect(server.local_addr()))
            .collect();
        let em = hooks.emitter(AGENT, SESSION);
        let t0 = Instant::now();
        let mut sent = 0;
        while sent < n {
            for _ in 0..burst.min(n - sent) {
                while em.emit(Event::ToolCall {
                    tool: TOOL,
                    success: true,
                    output: output_200(),
                }) != Emit::Queued
                {
                    std::thread::yield_now();
                }
                sent += 1;
            }
            let due = t0 + Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let end = settle(|| {
            let all = clients
                .iter()
                .map(|c| c.events() + c.lost())
                .min()
                .unwrap_or(0);
            (clients.iter().map(Client::events).sum(), all >= n)
        });
        let got: u64 = clients.iter().map(Client::events).sum();
        let lost: u64 = clients.iter().map(Client::lost).sum();
        let stats = server.event_stats();
        println!(
            "  {k:>2} SSE client(s): received {got} of {} in {:.2} s ({lost} lost: {} by slow \
             clients, {} by the stream itself)",
            n * k as u64,
            (end - t0).as_secs_f64(),
            stats.dropped_client,
            stats.dropped_server
        );
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

/// `rounds` batches of 1,024 back-to-back emits; ns per emit of each batch.
fn emit_rounds(hooks: &Hooks, rounds: usize, sub_seen: &AtomicU64) -> Vec<f64> {
    let em = hooks.emitter(AGENT, SESSION);
    let output = output_200();
    let mut out = Vec::with_capacity(rounds);
    let mut emitted = sub_seen.load(Ordering::Relaxed);
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..1024 {
            let r = em.emit(Event::ToolCall {
                tool: TOOL,
                success: true,
                output,
            });
            debug_assert_eq!(r, Emit::Queued);
        }
        out.push(t.elapsed().as_nanos() as f64 / 1024.0);
        emitted += 1024;
        // Drained: the ring empty and the subscriber caught up, so every batch starts alike.
        while hooks.pending() > 0 || sub_seen.load(Ordering::Relaxed) < emitted {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

fn emit_cost(rounds: usize) {
    println!("EMIT: ns per emit, batches of 1,024, {rounds} batches per phase (median, p90)");
    let (hooks, server) = start(EventStreamOptions::default());
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let drain = std::thread::spawn(move || {
        while sub.recv().is_ok() {
            s.fetch_add(1, Ordering::Relaxed);
        }
    });
    let show = |name: &str, mut v: Vec<f64>| -> f64 {
        let med = percentile(&mut v, 0.5);
        println!(
            "  {name:<36} median {med:>6.1} ns, p90 {:>6.1} ns",
            percentile(&mut v, 0.9)
        );
        med
    };
    // Warm up.
    emit_rounds(&hooks, rounds / 10 + 1, &seen);
    let a = show(
        "no SSE client (1 bus subscriber)",
        emit_rounds(&hooks, rounds, &seen),
    );
    let clients: Vec<Client> = (0..10)
        .map(|_| Client::connect(server.local_addr()))
        .collect();
    let b = show(
        "10 SSE clients reading (+ the same)",
        emit_rounds(&hooks, rounds, &seen),
    );
    let lost: u64 = clients.iter().map(Client::lost).sum();
    drop(clients);
    // The stream's hub keeps recording for `linger` after the last client: wait it out? No —
    // its subscription costs the worker, not the caller of emit; measured as it is.
    let a2 = show("no SSE client again", emit_rounds(&hooks, rounds, &seen));
    println!(
        "  ratio with 10 clients / without: {:.2} (against the mean of both phases without; \
         {lost} frames lost by the clients)",
        b / ((a + a2) / 2.0)
    );
    hooks.shutdown(Duration::from_secs(2));
    let _ = drain.join();
}

fn main() {
    let quick = !bench_mode() || std::env::args().any(|a| a == "--quick");
    let _ = process_start();
    println!("load average before: {}", loadavg());
    delivery(if quick { 20_000 } else { 1_000_000 });
    paced(if quick { 20_000 } else { 500_000 }, 50_000);
    emit_cost(if quick { 20 } else { 400 });
    println!("load average after: {}", loadavg());
    print_machine_note();
}
