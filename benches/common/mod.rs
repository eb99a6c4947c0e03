//! Shared helpers for the benches: the event data they all use, a calibrated per-call timer,
//! latency percentiles, and the RATIOS report printed after `Criterion::final_summary`.
//!
//! Criterion does not print ratios, so every bench reads back the medians criterion just wrote
//! (`<target>/criterion/<group>/<id>/new/estimates.json`, `median.point_estimate`, ns per
//! iteration) and prints them beside the baselines measured in the same process. Estimates not
//! written by this process (a filtered run, `cargo test --benches`) are reported as not measured
//! rather than silently compared against a stale file.

#![allow(dead_code)] // each bench binary uses a different subset

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

pub const AGENT: &str = "agent-1";
pub const SESSION: &str = "session-1";
pub const TOOL: &str = "shell";

/// Realistic tool output (an `ls -la`), ASCII, with newlines that the JSON writer must escape.
/// Benches take prefixes of it.
pub const LS: &str = "total 48\n\
drwxr-xr-x  6 agent agent 4096 Nov 29 22:10 .\n\
drwxr-xr-x 18 agent agent 4096 Nov 29 21:58 ..\n\
-rw-r--r--  1 agent agent 1523 Nov 29 22:09 Cargo.toml\n\
-rw-r--r--  1 agent agent 8817 Nov 29 22:10 README.md\n\
drwxr-xr-x  2 agent agent 4096 Nov 29 22:04 benches\n\
drwxr-xr-x  3 agent agent 4096 Nov 29 22:07 src\n\
drwxr-xr-x  2 agent agent 4096 Nov 29 22:08 tests\n\
-rw-r--r--  1 agent agent  311 Nov 29 22:01 \"notes v2\".txt\n\
-rw-r--r--  1 agent agent 2048 Nov 29 22:02 Cargo.lock\n";

/// The `output` of the emit benches: 200 bytes, so that agent + session + tool + output
/// (7 + 9 + 5 + 200 = 221 bytes) fits the default 256-byte inline slot.
pub fn output_200() -> &'static str {
    let s = &LS[..200];
    assert!(
        AGENT.len() + SESSION.len() + TOOL.len() + s.len() <= 256,
        "the emit benches' event must fit the 256-byte inline slot"
    );
    s
}

/// True when the binary runs as a benchmark (`cargo bench`), false under `cargo test --benches`
/// (criterion then runs every routine once; extra profiling passes are skipped).
pub fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// When this process started (for telling fresh estimates from stale ones). Also takes the
/// first CPU-time snapshot for [`print_machine_note`].
pub fn process_start() -> SystemTime {
    static START: OnceLock<SystemTime> = OnceLock::new();
    *START.get_or_init(|| {
        let _ = cpu_at_start();
        SystemTime::now() - Duration::from_millis(10)
    })
}

/// (busy, steal, total) jiffies of all CPUs, from `/proc/stat` (Linux; zeros elsewhere).
fn cpu_jiffies() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().next() else {
        return (0, 0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    if v.len() < 8 {
        return (0, 0, 0);
    }
    // user nice system idle iowait irq softirq steal
    let total: u64 = v[..8].iter().sum();
    (total - v[3] - v[4], v[7], total)
}

fn cpu_at_start() -> (u64, u64, u64) {
    static AT: OnceLock<(u64, u64, u64)> = OnceLock::new();
    *AT.get_or_init(cpu_jiffies)
}

/// One line on how busy the machine was during the run: CPU busy % (all processes, this one
/// included) and hypervisor steal %. Medians from a run with high steal are not comparable with
/// other runs; the ratios (baselines measured in the same process) hold up better.
pub fn print_machine_note() {
    let (b0, s0, t0) = cpu_at_start();
    let (b1, s1, t1) = cpu_jiffies();
    let dt = t1.saturating_sub(t0).max(1) as f64;
    println!(
        "\nMACHINE during this run: all CPUs {:.0} % busy (this bench included), hypervisor steal \
         {:.1} %; {} CPUs",
        (b1 - b0) as f64 * 100.0 / dt,
        (s1 - s0) as f64 * 100.0 / dt,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}

/// Busy-waits (no sleep, no syscall) for `d`.
#[inline(never)]
pub fn spin_for(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// This thread's kernel thread id (Linux: from `/proc/thread-self`).
pub fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The id of this process's first thread whose name starts with `prefix` (names are cut to 15
/// bytes by the kernel).
pub fn find_thread(prefix: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end().starts_with(prefix) {
            return path.file_name()?.to_str()?.parse().ok();
        }
    }
    None
}

/// Whether thread `tid` of this process is asleep in the kernel (state `S`: parked on a futex,
/// or in `nanosleep`), as opposed to running, runnable, or yielding.
pub fn is_sleeping(tid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    // "tid (comm) S ..." — comm may contain spaces or parentheses: take the last ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|state| state == "S")
}

/// Polls (untimed, ~every 5 µs) until thread `tid` is asleep; false after `timeout`.
pub fn wait_sleeping(tid: u32, timeout: Duration) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if is_sleeping(tid) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        spin_for(Duration::from_micros(5));
    }
}

/// The cost of the timer itself: median of back-to-back `Instant::now()` pairs, in ns. Per-call
/// timings subtract it (it is the same pair that brackets each timed call).
pub fn timer_overhead_ns() -> u64 {
    static OVERHEAD: OnceLock<u64> = OnceLock::new();
    *OVERHEAD.get_or_init(|| {
        let mut v: Vec<u64> = (0..20_001)
            .map(|_| {
                let t0 = Instant::now();
                let t1 = std::hint::black_box(Instant::now());
                (t1 - t0).as_nanos() as u64
            })
            .collect();
        v.sort_unstable();
        v[v.len() / 2]
    })
}

/// Per-call latencies (ns, timer overhead subtracted) recorded by name, for the percentile table.
static LATENCIES: Mutex<Vec<(String, Vec<u64>)>> = Mutex::new(Vec::new());

pub fn record_latencies(name: &str, samples: &[u64]) {
    let mut all = LATENCIES.lock().unwrap();
    match all.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => v.extend_from_slice(samples),
        None => all.push((name.to_string(), samples.to_vec())),
    }
}

pub fn print_latencies() {
    let mut all = LATENCIES.lock().unwrap();
    if all.is_empty() {
        return;
    }
    println!(
        "\nPER-CALL LATENCY (each call timed alone with Instant::now() pairs; {} ns timer \
         overhead subtracted)",
        timer_overhead_ns()
    );
    println!(
        "  {:<44} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "", "p50 ns", "p99 ns", "p99.9 ns", "max ns", "calls"
    );
    for (name, v) in all.iter_mut() {
        v.sort_unstable();
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        println!(
            "  {:<44} {:>9} {:>9} {:>9} {:>9} {:>10}",
            name,
            q(0.50),
            q(0.99),
            q(0.999),
            v[v.len() - 1],
            v.len()
        );
    }
}

/// `<target>/criterion`, found the way criterion finds it (minus its `cargo metadata` fallback):
/// `$CRITERION_HOME`, `$CARGO_TARGET_DIR/criterion`, else `target/criterion` under the crate.
pub fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(dir)
            }
        }
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
    };
    target.join("criterion")
}

/// The median (ns per iteration) criterion wrote for `id` (`group/function[/parameter]`) during
/// this process, or `None` if it was not measured in this run.
pub fn median_ns(id: &str) -> Option<f64> {
    let path = criterion_dir().join(id).join("new/estimates.json");
    let meta = std::fs::metadata(&path).ok()?;
    if meta.modified().ok()? < process_start() {
        return None; // stale: written by an earlier run
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e4 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// `id  median X  = R x  baseline` (time ratio: below 1 means faster than the baseline).
pub fn print_time_ratio(id: &str, baseline: &str) {
    match (median_ns(id), median_ns(baseline)) {
        (Some(a), Some(b)) => println!(
            "{id:<40} median {:>10}  = {:>6.2}x  {baseline} (median {})",
            fmt_ns(a),
            a / b,
            fmt_ns(b)
        ),
        (Some(a), None) => println!(
            "{id:<40} median {:>10}  (baseline {baseline} not measured in this run)",
            fmt_ns(a)
        ),
        (None, _) => {} // filtered out of this run
    }
}

/// `id  median X  target <= T ns: met/MISSED by ...`.
pub fn print_target(id: &str, target_ns: f64) {
    if let Some(a) = median_ns(id) {
        let verdict = if a <= target_ns {
            "met".to_string()
        } else {
            format!(
                "MISSED by {:.1} ns ({:.0} %)",
                a - target_ns,
                (a / target_ns - 1.0) * 100.0
            )
        };
        println!(
            "{id:<40} median {:>10}  target <= {target_ns} ns: {verdict}",
            fmt_ns(a)
        );
    }
}

/// A real `prx-hooks run --listen 127.0.0.1:0` (the binary `bin`) on the workspace `ws`, once
/// it has written its address (the benches that time what reaches a server).
pub fn serve(bin: &str, ws: &std::path::Path) -> std::process::Child {
    use std::process::{Command, Stdio};
    let child = Command::new(bin)
        .args(["run", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(ws)
        .env("RUST_LOG", "warn")
        .env_remove("PRX_HOOKS_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let address = ws.join(".prx-hooks/address");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !address.exists() {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}
