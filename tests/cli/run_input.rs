//! `run`'s input as an agent host feeds it: a new session per run (memory stays bounded and
//! the session map's counters add up), large events replayed through a FIFO under `--listen`
//! with a slow hook (nothing lost), and a FIFO written by one writer per event (docs/cli.md
//! § `run`, ARCHITECTURE.md § Ingest).

use crate::support::{append_args, lines, wait_for};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// The last line of stderr is the final report.
fn report(stderr: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stderr);
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("no report ({e}) in stderr:\n{text}"))
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits for the child to exit (20 s at most) and returns its stderr.
fn finish(mut child: Child) -> (std::process::ExitStatus, Vec<u8>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("run did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = Vec::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    (status, stderr)
}

fn event_line(agent: &str, n: u64) -> String {
    format!(
        r#"{{"event":"tool_call","agent":"{agent}","session":"s","payload":{{"tool":"t{n}","success":true,"output":""}}}}"#
    )
}

/// An agent host that starts a new agent session per task never sends the same (agent,
/// session) twice: `run` must not keep an emitter for each one forever. Three rounds of 100k
/// new agents took the server from 59 to 354 MiB; here 300k new keys after a warm-up of 50k
/// may grow the process by 64 MiB at most (the session map's bound and its seq memory are a
/// few MiB; the rest is slack for the allocator on a shared machine).
#[test]
fn a_new_agent_per_event_keeps_run_within_a_memory_bound_and_the_session_counters_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .args(["run", "--print", "--events", "-", "--workspace"])
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let printed = Arc::new(AtomicU64::new(0));
    let stdout = child.stdout.take().unwrap();
    let count = printed.clone();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(1 << 16, stdout);
        let mut line = Vec::new();
        while r.read_until(b'\n', &mut line).unwrap() > 0 {
            count.fetch_add(1, Ordering::Relaxed);
            line.clear();
        }
    });
    let mut stdin = std::io::BufWriter::with_capacity(1 << 16, child.stdin.take().unwrap());
    let mut feed = |prefix: &str, n: u64| {
        for i in 0..n {
            writeln!(stdin, "{}", event_line(&format!("{prefix}-{i}"), i)).unwrap();
        }
        stdin.flush().unwrap();
    };
    let wait_printed = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(180);
        while printed.load(Ordering::Relaxed) < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} events printed",
                printed.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    const WARM: u64 = 50_000;
    const MORE: u64 = 300_000;
    feed("warm", WARM);
    wait_printed(WARM);
    std::thread::sleep(Duration::from_millis(200));
    let (base, _) = memory_kib(child.id());
    feed("agent", MORE);
    wait_printed(WARM + MORE);
    let (rss, hwm) = memory_kib(child.id());
    let grown = hwm.saturating_sub(base);
    eprintln!("VmRSS {base} KiB after {WARM}, then {rss} KiB (peak {hwm} KiB) after {MORE} more");
    drop(stdin);
    let (status, stderr) = finish(child);
    reader.join().unwrap();
    assert!(
        grown < 64 << 10,
        "run grew by {} MiB over {MORE} new (agent, session) keys (from {} to a peak of {} MiB)",
        grown >> 10,
        base >> 10,
        hwm >> 10
    );
    assert!(status.success(), "{status:?}");
    let r = report(&stderr);
    let stats = &r["stats"];
    assert_eq!(stats["processed"], WARM + MORE, "{r}");
    let s = &stats["sessions"];
    let n = |k: &str| {
        s[k].as_u64()
            .unwrap_or_else(|| panic!("no sessions.{k} in {s}"))
    };
    // Every key was new, so each made an emitter; all but those still held were released,
    // idle or to make room, and none was refused (a file replay waits for room instead).
    assert_eq!(n("opened"), WARM + MORE, "{s}");
    assert_eq!(n("opened"), n("live") + n("released") + n("evicted"), "{s}");
    assert!(n("live") <= n("max") && n("bytes") <= n("max_bytes"), "{s}");
    assert_eq!(n("refused"), 0, "{s}");
    assert!(n("remembered") <= n("remember"), "{s}");
    assert_eq!(
        n("released") + n("evicted"),
        n("remembered") + n("forgotten") + n("resumed"),
        "every release is remembered, forgotten or resumed: {s}"
    );
    assert_eq!(n("resumed"), 0, "no key came back: {s}");
    assert_eq!(r["input"]["events"], WARM + MORE, "{r}");
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// Opens the FIFO for writing as an agent does, without hanging when nobody reads it any more:
/// retries a non-blocking open (ENXIO: no reader) for 10 s, then fails.
fn open_writer(fifo: &Path) -> std::fs::File {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(f) => {
                // Blocking writes from here on (a whole line ≤ PIPE_BUF is written at once).
                let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
                // SAFETY: fcntl on a descriptor this function owns.
                unsafe {
                    let fl = nix::libc::fcntl(fd, nix::libc::F_GETFL);
                    nix::libc::fcntl(fd, nix::libc::F_SETFL, fl & !nix::libc::O_NONBLOCK);
                }
                return f;
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {
                assert!(
                    Instant::now() < deadline,
                    "nobody reads {} any more: run stopped reading at an earlier writer's end of file",
                    fifo.display()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{}: {e}", fifo.display()),
        }
    }
}

fn hooks_json(dir: &Path, event: &str, log: &Path) {
    let hook = serde_json::json!({"command": "/bin/sh", "args": append_args("ran", log), "stdin_json": true});
    std::fs::write(
        dir.join("hooks.json"),
        serde_json::json!({"hooks": {event: [hook]}}).to_string(),
    )
    .unwrap();
}

/// An agent that opens the FIFO once per event: ten writers one after the other (open, one
/// line, close), then four at once, each writing 25 whole lines. Every event runs the hook.
/// `run` used to stop reading at the first writer's end of file, and the second writer hung in
/// `open()`.
#[test]
fn a_fifo_stays_open_for_writer_after_writer_and_every_event_runs_its_hook() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    hooks_json(dir.path(), "tool_call", &log);
    let fifo = dir.path().join("events.fifo");
    mkfifo(&fifo);
    let child = bin()
        .args(["run", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for n in 0..10u64 {
        let mut w = open_writer(&fifo);
        w.write_all(format!("{}\n", event_line("seq", n)).as_bytes())
            .unwrap();
        drop(w);
        wait_for(&format!("the hook of writer {n}"), || {
            lines(&log).len() as u64 == n + 1
        });
    }
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let mut w = open_writer(&fifo);
                for n in 0..25 {
                    let line = format!("{}\n", event_line(&format!("w{t}"), n));
                    assert!(line.len() <= nix::libc::PIPE_BUF);
                    w.write_all(line.as_bytes()).unwrap();
                }
            })
        })
        .collect();
    writers.into_iter().for_each(|w| w.join().unwrap());
    wait_for("every concurrent writer's hooks", || {
        lines(&log).len() == 110
    });
    // The input of a FIFO ends with the signal; what was written is all delivered.
    sigterm(&child);
    let (status, stderr) = finish(child);
    assert!(
        status.success(),
        "{status:?}\n{}",
        String::from_utf8_lossy(&stderr)
    );
    let r = report(&stderr);
    assert_eq!(r["input"]["lines"], 110, "{r}");
    assert_eq!(r["input"]["bad_lines"], 0, "{r}");
    assert_eq!(r["stats"]["processed"], 110, "{r}");
    let mut tools: Vec<String> = lines(&log)
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l.strip_prefix("ran ").unwrap()).unwrap();
            v["tool"].as_str().unwrap().to_string()
        })
        .collect();
    tools.sort();
    tools.dedup();
    assert_eq!(tools.len(), 25, "tools t0..t24 from every writer");
}

/// A file replay must not lose events to its own speed (docs/cli.md § `run`): 400 events of
/// 1 MiB through a FIFO under `--listen` (the live stream's hub is one more subscriber), with
/// a hook that takes 100 ms a run. Pacing every 256 lines on ring slots alone lost 123–192 of
/// them to the 64 MiB byte budget in some runs, and the hook's queue (256) overflows unless the
/// replay waits for it too.
#[test]
fn large_events_replayed_through_a_fifo_under_listen_with_a_slow_hook_are_all_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let script = format!("sleep 0.1; echo ran >> {}", log.display());
    std::fs::write(
        dir.path().join("hooks.json"),
        serde_json::json!({"hooks": {"tool_call": [{"command": "/bin/sh", "args": ["-c", script]}]}})
            .to_string(),
    )
    .unwrap();
    let fifo = dir.path().join("events.fifo");
    mkfifo(&fifo);
    let child = bin()
        .args(["run", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    const N: usize = 400;
    let output = "x".repeat(1 << 20);
    let mut w = open_writer(&fifo);
    for n in 0..N {
        let line = format!(
            r#"{{"event":"tool_call","agent":"big","session":"s","payload":{{"tool":"t{n}","success":true,"output":"{output}"}}}}"#
        );
        w.write_all(line.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
    }
    drop(w);
    let deadline = Instant::now() + Duration::from_secs(120);
    while lines(&log).len() < N && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&child);
    let (status, stderr) = finish(child);
    let r = report(&stderr);
    let stats = &r["stats"];
    assert_eq!(stats["dropped"], 0, "{stats}");
    assert_eq!(stats["dropped_budget"], 0, "{stats}");
    let shell = stats["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "shell")
        .unwrap();
    assert_eq!(shell["dropped"], 0, "{shell}");
    assert_eq!(
        lines(&log).len(),
        N,
        "the hook ran for every event: {stats}"
    );
    assert!(status.success(), "{status:?}");
}

/// Small events through a FIFO into a slow hook, written as one burst after the worker has been
/// idle long enough to park 10 ms at a time: the replay looked at the pipeline every 64 lines
/// and waited only while a backend held 128 jobs, so while the parked worker left the lines in
/// the ring it saw an idle hook, and thousands went through at once to a hook queue of 256 —
/// the rest dropped (`dropped_queue_full`). It now emits no more between two looks than the
/// tightest hook queue can take with what the rings hold.
#[test]
fn a_burst_of_small_events_into_a_slow_hook_after_an_idle_spell_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let script = format!("echo ran >> {}", log.display());
    std::fs::write(
        dir.path().join("hooks.json"),
        serde_json::json!({"hooks": {"tool_call": [
            {"command": "/bin/sh", "args": ["-c", script], "max_concurrent": 1}
        ]}})
        .to_string(),
    )
    .unwrap();
    let fifo = dir.path().join("events.fifo");
    mkfifo(&fifo);
    let child = bin()
        .args(["run", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = open_writer(&fifo);
    // The worker parks 10 ms at a time after ~100 ms without events.
    std::thread::sleep(Duration::from_millis(500));
    const N: usize = 2_000;
    let body: String = (0..N as u64)
        .map(|n| format!("{}\n", event_line("burst", n)))
        .collect();
    w.write_all(body.as_bytes()).unwrap();
    drop(w);
    let deadline = Instant::now() + Duration::from_secs(120);
    while lines(&log).len() < N && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&child);
    let (_, stderr) = finish(child);
    let r = report(&stderr);
    let stats = &r["stats"];
    let shell = stats["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "shell")
        .unwrap();
    assert_eq!(shell["dropped"], 0, "{shell}");
    assert_eq!(
        lines(&log).len(),
        N,
        "the hook ran for every event: {stats}"
    );
}
