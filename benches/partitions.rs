//! Partitioned intake against unpartitioned intake, in one run: a real nats-server (JetStream,
//! loopback), a backlog of tool_call events of 1, 3, 25 and 100 agents published by a real
//! `prx-hooks run --nats … --nats-partitions P` (8 and 64), consumed by one real
//! `prx-hooks run --from-nats … --durable` with a `/bin/true` hook, with `--nats-partitions P`
//! and without (the same backlog: a consumer of `prx.lifecycle.>` reads past the partition
//! token). Each figure is events/s from the backlog's publication to JetStream holding every
//! event acked; the host is started first and has opened its consumers. The hosts' payload
//! files go to `PRX_HOOKS_BENCH_TMPDIR` when it is set, else to tmpfs when there is one
//! (`payload_tmp`). Target: partitioned ≥ 0.9× unpartitioned, whatever the spread.
//!
//! `cargo bench --bench partitions` (`PRX_HOOKS_PARTITION_BENCH_EVENTS`, default 5,000; under
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

/// The names of the durable consumers named `durable` or `durable-<k>`.
fn consumers(client: &Client, durable: &str) -> Vec<String> {
    let js = client.jetstream();
    client.rt.block_on(async {
        use futures_util::StreamExt;
        let Ok(s) = js.get_stream(STREAM).await else {
            return Vec::new();
        };
        let mut names = s.consumer_names();
        let mut all = Vec::new();
        while let Some(Ok(name)) = names.next().await {
            if name == durable || name.starts_with(&format!("{durable}-")) {
                all.push(name);
            }
        }
        all
    })
}

/// Once the whole backlog is in the stream: drops from the front of `left` each consumer with
/// nothing pending and nothing waiting for an ack (it stays so), adding what it acked to
/// `acked`, and stops at the first still at work. One request per call while the host works,
/// so that watching 64 partitions does not load the server (and the 2-core machine) 64 times
/// as much as watching one consumer; every consumer is seen finished before the figure ends.
fn finished(client: &Client, left: &mut Vec<String>, acked: &mut u64) {
    let js = client.jetstream();
    client.rt.block_on(async {
        let Ok(s) = js.get_stream(STREAM).await else {
            return;
        };
        while let Some(name) = left.first() {
            match s.consumer_info(name).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {
                    *acked += info.ack_floor.consumer_sequence;
                    left.remove(0);
                }
                _ => return,
            }
        }
    });
}

/// Where the hosts write their payload files (`--payload-dir`): `PRX_HOOKS_BENCH_TMPDIR` when
/// set (to measure a file system of one's own), else a directory on tmpfs when `/dev/shm` is
/// one, else the default (`$TMPDIR`).
///
/// Every event's hook run creates and deletes a payload file, in a directory each host makes
/// afresh. On ext4 without a journal, creating a file scans past the inodes deleted in the last
/// minute or more, so what a file costs depends on what ran before and where the directory
/// landed: here the host's CPU per event went from 0.29 to 0.57 ms from run to run, against
/// 0.23–0.28 on tmpfs, hitting either side. The bench measures the consumers, not the file
/// system.
fn payload_tmp() -> Option<tempfile::TempDir> {
    let base = match std::env::var_os("PRX_HOOKS_BENCH_TMPDIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let shm = std::path::Path::new("/dev/shm");
            let tmpfs = nix::sys::statfs::statfs(shm)
                .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
            if !tmpfs {
                return None;
            }
            shm.to_path_buf()
        }
    };
    Some(
        tempfile::Builder::new()
            .prefix("prx-hooks-bench-")
            .tempdir_in(&base)
            .unwrap_or_else(|e| panic!("a directory in {}: {e}", base.display())),
    )
}

/// One host with a `/bin/true` hook on `durable` (partitioned when `partitions` is given),
/// its payload files in `tmp` when given.
fn host(
    url: &str,
    durable: &str,
    partitions: Option<u32>,
    tmp: Option<&std::path::Path>,
) -> (tempfile::TempDir, Child) {
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
    if let Some(tmp) = tmp {
        cmd.arg("--payload-dir").arg(tmp);
    }
    (ws, cmd.spawn().unwrap())
}

/// CPU seconds process `pid` used so far: its own (every thread's), and its reaped children's.
fn cpu_of(pid: u32) -> (f64, f64) {
    cpu_in(&format!("/proc/{pid}/stat"))
}

/// CPU seconds the NATS consumer's threads of host `pid` used so far: those named
/// `prx-nats-consume`, the loop that pulls, takes and acks and its runtime's (the connection's
/// reads, the acks' writes); the hooks' runner and the pipeline apart.
fn consumer_cpu(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("prx-nats-consum"))
        })
        .map(|t| cpu_in(&t.path().join("stat").to_string_lossy()).0)
        .sum()
}

/// utime + stime, and cutime + cstime, in seconds, of a `/proc/…/stat` file.
fn cpu_in(path: &str) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return (0.0, 0.0);
    };
    // After the command's name, in parentheses: utime, stime, cutime, cstime are fields 12–15.
    let f: Vec<f64> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    (at(11) + at(12), at(13) + at(14))
}

/// One figure: events/s, and CPU per event over the same span: the host's (its hooks'
/// processes apart) and the server's in ms, the host's consumer threads' in µs.
struct Figure {
    rate: f64,
    host_ms: f64,
    server_ms: f64,
    consumer_us: f64,
}

/// Events/s of one host through a backlog of `n` events of `agents` agents published over
/// `published` partitions, the host consuming with `partitions` (None: unpartitioned).
#[allow(clippy::too_many_arguments)]
fn rate(
    url: &str,
    client: &Client,
    server: u32,
    run: usize,
    agents: usize,
    published: u32,
    partitions: Option<u32>,
    n: usize,
    tmp: Option<&std::path::Path>,
) -> Figure {
    // Emptied before each run.
    let js = client.jetstream();
    client.rt.block_on(async {
        js.get_stream(STREAM).await.unwrap().purge().await.unwrap();
    });
    let durable = format!("run{run}");
    let (_ws, mut child) = host(url, &durable, partitions, tmp);
    let want = partitions.map_or(1, |p| p as usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumers(client, &durable).len() < want {
        assert!(Instant::now() < deadline, "the host opened its consumers");
        std::thread::sleep(Duration::from_millis(50));
    }
    let start = Instant::now();
    let (host0, server0) = (cpu_of(child.id()).0, cpu_of(server).0);
    let consumer0 = consumer_cpu(child.id());
    publish(url, agents, published, n);
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 10);
    let (mut left, mut acked) = (consumers(client, &durable), 0);
    loop {
        finished(client, &mut left, &mut acked);
        if left.is_empty() {
            assert!(acked >= n as u64, "{acked} of {n} acked");
            break;
        }
        assert!(Instant::now() < deadline, "{acked} of {n} acked");
        std::thread::sleep(Duration::from_millis(10));
    }
    let secs = start.elapsed().as_secs_f64();
    let (host1, server1) = (cpu_of(child.id()).0, cpu_of(server).0);
    let consumer1 = consumer_cpu(child.id());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    let mine = consumers(client, &durable);
    client.rt.block_on(async {
        let s = js.get_stream(STREAM).await.unwrap();
        for name in mine {
            let _ = s.delete_consumer(&name).await;
        }
    });
    Figure {
        rate: n as f64 / secs,
        host_ms: (host1 - host0) * 1000.0 / n as f64,
        server_ms: (server1 - server0) * 1000.0 / n as f64,
        consumer_us: (consumer1 - consumer0) * 1e6 / n as f64,
    }
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
        .unwrap_or(if quick { 200 } else { 5_000 });
    let server = NatsServer::start();
    let url = server.url();
    let client = Client::connect(&url);
    let pid = server.pid().expect("the server runs");
    let config = async_nats::jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["prx.lifecycle.>".into()],
        ..Default::default()
    };
    client
        .rt
        .block_on(client.jetstream().create_stream(config))
        .unwrap();
    let tmp = payload_tmp();
    println!(
        "partitioned intake, one host, /bin/true hook, {n} events per figure (events/s), payload files in {}:",
        tmp.as_ref().map_or("$TMPDIR (not on tmpfs)".into(), |t| t
            .path()
            .display()
            .to_string())
    );
    println!(
        "  agents  partitions  unpartitioned  partitioned  ratio   CPU ms/event host, server: unpartitioned  partitioned   consumer threads µs/event: unpartitioned  partitioned"
    );
    let mut run = 0;
    for partitions in [8u32, 64] {
        for agents in [1usize, 3, 25, 100] {
            if !picked(agents, partitions) {
                continue;
            }
            // Each side twice, in the order unpartitioned, partitioned, partitioned,
            // unpartitioned: a drift of the machine's load, and what a run leaves behind
            // for the next (on a file system like the one `payload_tmp` avoids), weigh on both
            // alike.
            let mut figures = Vec::new();
            for parted in [false, true, true, false] {
                run += 1;
                let p = parted.then_some(partitions);
                let tmp = tmp.as_ref().map(|t| t.path());
                figures.push(rate(&url, &client, pid, run, agents, partitions, p, n, tmp));
            }
            let mean = |a: &Figure, b: &Figure| Figure {
                rate: 2.0 / (1.0 / a.rate + 1.0 / b.rate),
                host_ms: (a.host_ms + b.host_ms) / 2.0,
                server_ms: (a.server_ms + b.server_ms) / 2.0,
                consumer_us: (a.consumer_us + b.consumer_us) / 2.0,
            };
            let flat = mean(&figures[0], &figures[3]);
            let parted = mean(&figures[1], &figures[2]);
            println!(
                "  {agents:>6}  {partitions:>10}  {:>13.0}  {:>11.0}  {:>5.2}   {:>38.3}, {:.3}  {:.3}, {:.3}   {:>39.0}  {:>11.0}",
                flat.rate,
                parted.rate,
                parted.rate / flat.rate,
                flat.host_ms,
                flat.server_ms,
                parted.host_ms,
                parted.server_ms,
                flat.consumer_us,
                parted.consumer_us,
            );
        }
    }
    println!("  target: partitioned ≥ 0.9× unpartitioned");
}
