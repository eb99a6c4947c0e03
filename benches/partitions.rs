//! Partitioned intake against unpartitioned intake, in one run: a real nats-server (JetStream,
//! loopback), a backlog of tool_call events of 1, 3, 25 and 100 agents published by a real
//! `prx-hooks run --nats … --nats-partitions P` (8 and 64), consumed by one real
//! `prx-hooks run --from-nats … --durable` with a `/bin/true` hook, with `--nats-partitions P`
//! and without (the same backlog: a consumer of `prx.lifecycle.>` reads past the partition
//! token). Each figure is events/s from the backlog's publication to JetStream holding every
//! event acked; the host is started first and has opened its consumers. Target: partitioned
//! ≥ 0.9× unpartitioned, whatever the spread.
//!
//! `cargo bench --bench partitions` (`PRX_HOOKS_PARTITION_BENCH_EVENTS`, default 1,500; under
//! `cargo test --benches`, 200). Needs `nats-server` (`PRX_HOOKS_NATS_SERVER`). Arguments
//! after `--` pick cases: `64` every spread over 64 partitions, `1x64` one agent over 64
//! (`cargo bench --bench partitions -- 1x64 3x64`).

#[path = "../tests/support/nats.rs"]
mod nats_support;

use nats_support::{Client, NatsServer};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");
const STREAM: &str = "BENCH";

/// Publishes `n` tool_call events spread round-robin over `agents` agents through a real
/// `run --nats … --nats-partitions partitions` (which creates the stream).
fn publish(url: &str, agents: usize, partitions: u32, n: usize) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.ndjson");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    for i in 0..n {
        writeln!(
            f,
            r#"{{"event":"tool_call","agent":"agent-{}","session":"s","payload":{{"tool":"t","success":true,"output":"{i}"}}}}"#,
            i % agents
        )
        .unwrap();
    }
    f.flush().unwrap();
    drop(f);
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&file)
        .args(["--nats", url, "--nats-stream", STREAM, "--nats-partitions"])
        .arg(partitions.to_string())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The durable consumers named `durable` or `durable-<k>`: (how many, whether every one has
/// nothing pending and nothing waiting for an ack, acked in all).
fn consumers(client: &Client, durable: &str) -> (usize, bool, u64) {
    let js = client.jetstream();
    client.rt.block_on(async {
        use futures_util::StreamExt;
        let Ok(s) = js.get_stream(STREAM).await else {
            return (0, false, 0);
        };
        let mut names = s.consumer_names();
        let mut all = Vec::new();
        while let Some(Ok(name)) = names.next().await {
            if name == durable || name.starts_with(&format!("{durable}-")) {
                all.push(name);
            }
        }
        let (mut done, mut acked) = (true, 0);
        for name in &all {
            let Ok(info) = s.consumer_info(name).await else {
                return (0, false, 0);
            };
            done &= info.num_pending == 0 && info.num_ack_pending == 0;
            acked += info.ack_floor.consumer_sequence;
        }
        (all.len(), done, acked)
    })
}

/// One host with a `/bin/true` hook on `durable` (partitioned when `partitions` is given).
fn host(url: &str, durable: &str, partitions: Option<u32>) -> (tempfile::TempDir, Child) {
    let ws = tempfile::tempdir().unwrap();
    let hooks = r#"{"hooks": {"tool_call": [{"id": "true", "command": "/bin/true"}]}}"#;
    std::fs::write(ws.path().join("hooks.json"), hooks).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--from-nats", url, "--durable", durable])
        .args(["--from-nats-stream", STREAM])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(p) = partitions {
        cmd.args(["--nats-partitions", &p.to_string()]);
    }
    (ws, cmd.spawn().unwrap())
}

/// Events/s of one host through a backlog of `n` events of `agents` agents published over
/// `published` partitions, the host consuming with `partitions` (None: unpartitioned).
fn rate(
    url: &str,
    client: &Client,
    run: usize,
    agents: usize,
    published: u32,
    partitions: Option<u32>,
    n: usize,
) -> f64 {
    // Emptied before each run.
    let js = client.jetstream();
    client.rt.block_on(async {
        js.get_stream(STREAM).await.unwrap().purge().await.unwrap();
    });
    let durable = format!("run{run}");
    let (_ws, mut child) = host(url, &durable, partitions);
    let want = partitions.map_or(1, |p| p as usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumers(client, &durable).0 < want {
        assert!(Instant::now() < deadline, "the host opened its consumers");
        std::thread::sleep(Duration::from_millis(50));
    }
    let start = Instant::now();
    publish(url, agents, published, n);
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 10);
    loop {
        let (_, done, acked) = consumers(client, &durable);
        if done && acked >= n as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "{acked} of {n} acked");
        std::thread::sleep(Duration::from_millis(10));
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    client.rt.block_on(async {
        use futures_util::StreamExt;
        let s = js.get_stream(STREAM).await.unwrap();
        let mut names = s.consumer_names();
        let mut mine = Vec::new();
        while let Some(Ok(name)) = names.next().await {
            if name == durable || name.starts_with(&format!("{durable}-")) {
                mine.push(name);
            }
        }
        for name in mine {
            let _ = s.delete_consumer(&name).await;
        }
    });
    n as f64 / secs
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let picks: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let picked = |agents: usize, partitions: u32| {
        picks.is_empty()
            || picks
                .iter()
                .any(|p| *p == partitions.to_string() || *p == format!("{agents}x{partitions}"))
    };
    let n: usize = std::env::var("PRX_HOOKS_PARTITION_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 200 } else { 1_500 });
    let server = NatsServer::start();
    let url = server.url();
    let client = Client::connect(&url);
    let config = async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["prx.lifecycle.>".into()],
        ..Default::default()
    };
    client
        .rt
        .block_on(client.jetstream().create_stream(config))
        .unwrap();
    println!("partitioned intake, one host, /bin/true hook, {n} events per figure (events/s):");
    println!("  agents  partitions  unpartitioned  partitioned  ratio");
    let mut run = 0;
    for partitions in [8u32, 64] {
        for agents in [1usize, 3, 25, 100] {
            if !picked(agents, partitions) {
                continue;
            }
            run += 1;
            let flat = rate(&url, &client, run, agents, partitions, None, n);
            run += 1;
            let parted = rate(&url, &client, run, agents, partitions, Some(partitions), n);
            println!(
                "  {agents:>6}  {partitions:>10}  {flat:>13.0}  {parted:>11.0}  {:>5.2}",
                parted / flat
            );
        }
    }
    println!("  target: partitioned ≥ 0.9× unpartitioned");
}
