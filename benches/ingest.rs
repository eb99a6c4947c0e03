//! Events/s into a running hook system through `POST /api/events` (batches of 1 and of 1,000
//! lines, one kept-alive connection) beside the same lines read by the line ingest as
//! `run --events` reads a file, in one run. A bus subscriber drains every event; each figure
//! is from the first line sent to the last event received. Lines HTTP lost to a full ring
//! (it never waits) are printed.
//!
//! Then the socket: the same lines sent over `run --ingest unix:PATH` to a real `prx-hooks
//! run --print`, beside the same binary reading them with `--events FILE`, each timed from
//! the start of the send (or of the process) to the last printed event.
//!
//! `cargo bench --bench ingest` (`PRX_HOOKS_INGEST_LINES`, default 200,000; under `cargo test
//! --benches`, 20,000).

use prx_hooks::Hooks;
use prx_hooks::http::{HttpOptions, Server, Token};
use prx_hooks::ingest::{IngestOptions, LineIngest};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-token-0123456789abcdef";

struct Rig {
    hooks: Arc<Hooks>,
    server: Server,
    got: Arc<AtomicU64>,
}

fn rig() -> Rig {
    let hooks = Arc::new(Hooks::builder().build().unwrap());
    let sub = hooks.bus().subscribe_with_capacity("*", 1 << 16).unwrap();
    let got = Arc::new(AtomicU64::new(0));
    let counter = got.clone();
    std::thread::spawn(move || {
        while sub.recv().is_ok() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let opts = HttpOptions::new(Token::new(TOKEN, "bench").unwrap());
    let server = Server::start(hooks.clone(), opts, "127.0.0.1:0".parse().unwrap()).unwrap();
    Rig { hooks, server, got }
}

fn line(i: usize) -> String {
    format!(
        "{{\"event\":\"tool_call\",\"agent\":\"coder\",\"session\":\"s{}\",\"payload\":{{\"tool\":\"shell\",\"success\":true,\"output\":\"line {i} of the bench, about as long as a short tool output\",\"cwd\":\"/home/user/project\"}}}}\n",
        i % 8
    )
}

/// Waits until the subscriber has `want` events (or nothing more arrives for a second).
fn settle(rig: &Rig, want: u64, start: u64) -> u64 {
    let mut last = (rig.got.load(Ordering::Relaxed), Instant::now());
    loop {
        let n = rig.got.load(Ordering::Relaxed) - start;
        if n >= want {
            return n;
        }
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(1) {
            return n;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let lines: usize = std::env::var("PRX_HOOKS_INGEST_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 20_000 } else { 200_000 });
    let text: String = (0..lines).map(line).collect();
    let rig = rig();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("http://{}/api/events", rig.server.local_addr());
    let post = |body: &str| {
        let mut r = agent
            .post(&url)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/x-ndjson")
            .send(body)
            .unwrap();
        assert_eq!(r.status(), 200);
        let report: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        report["dropped"].as_u64().unwrap_or(0)
    };

    // The file replay: `run --events` feeds a LineIngest that waits for room.
    let before = rig.got.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut ingest = LineIngest::new(&rig.hooks, IngestOptions::default().wait_for_room(true));
    ingest.feed(text.as_bytes());
    let n = settle(&rig, lines as u64, before);
    let file = n as f64 / t.elapsed().as_secs_f64();

    // HTTP, batches of 1,000 lines.
    let batch: Vec<&str> = text.split_inclusive('\n').collect();
    let before = rig.got.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut dropped = 0;
    for chunk in batch.chunks(1000) {
        dropped += post(&chunk.concat());
    }
    let n = settle(&rig, lines as u64 - dropped, before);
    let http_1000 = n as f64 / t.elapsed().as_secs_f64();

    // HTTP, one line per request (a tenth of the lines).
    let ones = (lines / 10).max(1);
    let before = rig.got.load(Ordering::Relaxed);
    let t = Instant::now();
    let mut dropped_1 = 0;
    for l in &batch[..ones] {
        dropped_1 += post(l);
    }
    let n1 = settle(&rig, ones as u64 - dropped_1, before);
    let http_1 = n1 as f64 / t.elapsed().as_secs_f64();

    println!("ingest/ {lines} tool_call lines, one subscriber draining");
    println!(
        "  run --events (line ingest, waits for room)  {:>10.0} events/s",
        file
    );
    println!(
        "  POST /api/events, batches of 1,000          {:>10.0} events/s  ({:.2}× the file; {dropped} dropped)",
        http_1000,
        http_1000 / file
    );
    println!(
        "  POST /api/events, 1 line per request        {:>10.0} events/s  ({:.3}× the file; {dropped_1} dropped; {ones} requests)",
        http_1,
        http_1 / file
    );
    println!("  target: HTTP batches of 1,000 ≥ 0.5× the file");
    let (file, socket) = through_the_binary(&text, lines);
    println!("  prx-hooks run --events FILE --print         {file:>10.0} events/s");
    println!(
        "  prx-hooks run --ingest unix:PATH --print    {socket:>10.0} events/s  ({:.2}× the file)",
        socket / file
    );
    println!("  target: the socket ≥ 0.8× the file");
}

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

/// Counts `--print`'s lines until `want` arrived; the time since `start`.
fn count_printed(child: &mut std::process::Child, want: usize, start: Instant) -> f64 {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let mut n = 0;
    for line in std::io::BufReader::with_capacity(1 << 20, out).lines() {
        if line.is_err() {
            break;
        }
        n += 1;
        if n == want {
            break;
        }
    }
    assert_eq!(n, want, "every event printed");
    n as f64 / start.elapsed().as_secs_f64()
}

fn through_the_binary(text: &str, lines: usize) -> (f64, f64) {
    use std::process::{Command, Stdio};
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hooks.json"), r#"{"hooks": {}}"#).unwrap();
    let file = ws.path().join("events.ndjson");
    std::fs::write(&file, text).unwrap();
    let spawn = |extra: &[&str]| {
        Command::new(BIN)
            .args(["run", "--print", "--workspace"])
            .arg(ws.path())
            .args(extra)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let start = Instant::now();
    let mut child = spawn(&["--events", file.to_str().unwrap()]);
    let from_file = count_printed(&mut child, lines, start);
    let _ = child.wait();
    let sock = ws.path().join("ingest.sock");
    let arg = format!("unix:{}", sock.display());
    let mut child = spawn(&["--ingest", &arg]);
    while !sock.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let mut conn = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let bytes = text.as_bytes().to_vec();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        conn.write_all(&bytes).unwrap();
        conn
    });
    let from_socket = count_printed(&mut child, lines, start);
    drop(writer.join());
    let _ = child.kill();
    let _ = child.wait();
    (from_file, from_socket)
}
