//! What an idle `prx-hooks run --listen` costs (docs/performance.md): with the sample
//! workspace (its shell hooks and the audit plugin) and no client, its CPU time over 10 s
//! stays under 1 % of one CPU — a behaviour with generous slack, not a speed figure (the
//! measured figures and the command are in docs/performance.md).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// utime + stime of `pid` in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Per thread: name and utime + stime, for the failure message.
fn threads(pid: u32) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let tid: u32 = t.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?;
            Some((format!("{} ({tid})", comm.trim()), ticks))
        })
        .collect();
    out.sort();
    out
}

fn copy_sample_workspace(ws: &Path) {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/workspace");
    for f in ["hooks.json", "events.ndjson", "hooks/audit.sh"] {
        let to = ws.join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(sample.join(f), &to).unwrap();
    }
    crate::plugins::install(
        ws,
        "audit-hook",
        "audit_hook",
        &crate::plugins::audit_manifest(),
    );
}

#[test]
fn an_idle_server_with_the_sample_workspace_costs_close_to_no_cpu() {
    let ws = tempfile::tempdir().unwrap();
    copy_sample_workspace(ws.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
        .args([
            "run",
            "--events",
            "/dev/null",
            "--listen",
            "127.0.0.1:0",
            "--workspace",
        ])
        .arg(ws.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.contains("HTTP API on") {
        assert!(Instant::now() < deadline, "no server: {seen}");
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("run exited: {seen}");
        }
        seen.push_str(&line);
    }
    // Keep reading stderr (a full pipe would block it), and let start-up settle.
    std::thread::spawn(move || for _ in err.lines() {});
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (t0, before) = (Instant::now(), cpu_ticks(pid));
    let per_thread = threads(pid);
    std::thread::sleep(Duration::from_secs(10));
    let used = (cpu_ticks(pid) - before) as f64 / hz;
    let wall = t0.elapsed().as_secs_f64();
    let after = threads(pid);
    let _ = child.kill();
    let _ = child.wait();
    let share = used / wall;
    let busy: Vec<String> = after
        .iter()
        .filter_map(|(name, t)| {
            let was = per_thread
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0, |p| p.1);
            (*t > was).then(|| format!("{name}: {} ticks", t - was))
        })
        .collect();
    eprintln!(
        "idle run --listen: {:.3} % of one CPU over {wall:.1} s ({} threads); {busy:?}",
        share * 100.0,
        after.len()
    );
    assert!(
        share < 0.01,
        "an idle server used {:.2} % of a CPU over {wall:.1} s; per thread: {busy:?}",
        share * 100.0
    );
}
