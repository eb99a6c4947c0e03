//! The hostile-sinks soak (ARCHITECTURE.md § Shutdown and § Accounting): every kind of sink
//! misbehaving at once while two threads emit and a third shuts the pipeline down at a random
//! moment, round after round.
//!
//! Hostile modes (each backend's hardening work adds its own to [`HOSTILE_HOOKS`] /
//! [`HOSTILE_PLUGINS`]):
//! * shell: a hook that sleeps "forever" (longer than any timeout), one whose grandchild ignores
//!   SIGTERM and holds the stderr pipe, one that never reads the 4 MiB payload on its stdin;
//! * plugins: one that loops forever in every call, one that traps on every call;
//! * bus: a subscriber that never reads.
//!
//! Checked every round: shutdown returns within its deadline plus `SHUTDOWN_SLACK` plus a stated
//! scheduling slack; the test's own count of emits agrees with the stats; every queued event is
//! processed or counted as dropped at shutdown; every sink (and every plugin and hook) balances
//! with nothing in flight; no hook process survives (its marker is in no live command line), no
//! zombie child is left, no file descriptor and no temporary file outlives the round. Across
//! rounds the heap live between them (a counting allocator) does not grow and RSS stays bounded.
//! The figures (max emit time, events, drops, heap, RSS) are printed at the end.
//!
//! Length: `PRX_HOOKS_SOAK_SECS` (default 20 s; `.ci/run` sets it, a long run is
//! `PRX_HOOKS_SOAK_SECS=1800 cargo test --release --test soak -- --nocapture`).

#[path = "support/plugins.rs"]
mod plugins;

use prx_hooks::{Event, Hooks, SHUTDOWN_SLACK};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// Scheduling slack on a loaded 2-core machine, beyond `deadline + SHUTDOWN_SLACK`.
const SCHED_SLACK: Duration = Duration::from_secs(2);

/// Every hook's shell carries this in its command line, and every process it starts one of
/// [`SLEEPS`], so a survivor can be found anywhere in /proc.
const MARKER: &str = "prx-soak-marker";
const SLEEPS: [&str; 3] = ["100001", "100002", "100003"];

/// Shell hooks that misbehave: (id, event, argv after /bin/sh -c, stdin_json).
const HOSTILE_HOOKS: &[(&str, &str, &str, bool)] = &[
    // Sleeps far beyond the shutdown deadline.
    ("forever", "tool_call", "exec sleep 100001", false),
    // The leader ignores SIGTERM; its grandchild too, and it holds the stderr pipe open.
    (
        "stubborn",
        "tool_call",
        "trap '' TERM; (trap '' TERM; sleep 100002) & sleep 100002",
        false,
    ),
    // Never reads its stdin (the 4 MiB payload of the large events).
    ("no-stdin", "tool_call", "exec sleep 100003", true),
    // A well-behaved hook beside them, so hooks also finish normally during a round.
    ("fast", "turn_complete", "exit 0", false),
];

/// Plugins that misbehave: (name, misbehave mode, max_execution_time_ms).
const HOSTILE_PLUGINS: &[(&str, &str, u64)] = &[("looper", "loop", 200), ("trapper", "trap", 1000)];

fn soak_secs() -> u64 {
    std::env::var("PRX_HOOKS_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// A tiny deterministic generator (xorshift), so a failing round can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn write_workspace(ws: &Path) {
    let mut hooks: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for (id, event, script, stdin) in HOSTILE_HOOKS {
        hooks.entry(event).or_default().push(serde_json::json!({
            "id": id,
            "command": "/bin/sh",
            "args": ["-c", format!("{script} # {MARKER}"), MARKER],
            "timeout_ms": 300_000,
            "stdin_json": stdin,
        }));
    }
    let file = serde_json::json!({ "hooks": hooks });
    std::fs::write(ws.join("hooks.json"), file.to_string()).unwrap();
    for (name, mode, ms) in HOSTILE_PLUGINS {
        let toml = format!(
            "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n[[capabilities]]\ntype = \"hook\"\n\
             events = [\"tool_call\", \"turn_complete\"]\n\n[resources]\nmax_execution_time_ms = {ms}\n\
             max_memory_mb = 16\n\n[config]\nmode = \"{mode}\"\n"
        );
        plugins::install(ws, name, "misbehave", &toml);
    }
}

/// Live processes whose command line carries the marker.
fn marked_processes() -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let has = |cmd: &[u8], s: &str| cmd.windows(s.len()).any(|w| w == s.as_bytes());
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline"))
            && (has(&cmd, MARKER) || SLEEPS.iter().any(|s| has(&cmd, s)))
        {
            found.push(format!(
                "{pid}: {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            ));
        }
    }
    found
}

/// Our own children, with their state (a `Z` is a zombie nobody reaped).
fn children() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces and parentheses; split after the last ')'.
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = tail.split_whitespace().collect();
        if fields.get(1) == Some(&me.as_str()) {
            found.push(format!("{head}) {}", fields[0]));
        }
    }
    found
}

/// This process's open descriptors and what each points at (for the message when one leaks).
fn open_fds() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .map(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            )
        })
        .collect();
    fds.sort();
    fds
}

/// Resident set size, after asking glibc to give back what its arenas hold free: the soak
/// measures what the pipeline keeps, not what the allocator caches between rounds.
fn rss_kib() -> u64 {
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe { libc::malloc_trim(0) };
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Regular files anywhere under `dir`.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => out.extend(files_under(&p)),
                Ok(_) => out.push(p.display().to_string()),
                Err(_) => {}
            }
        }
    }
    out
}

#[path = "support/live_alloc.rs"]
mod live_alloc;
use live_alloc::LIVE;

#[derive(Default)]
struct Totals {
    rounds: u64,
    emits: BTreeMap<String, u64>,
    max_emit: Duration,
    max_shutdown_over: Duration,
    /// From `drop(hooks)` to no process, zombie, descriptor or temporary file left.
    max_settle: Duration,
    dropped_shutdown: u64,
    processed: u64,
    sink_dropped: BTreeMap<String, u64>,
    sink_failed: BTreeMap<String, u64>,
}

/// How long, after `drop(hooks)`, what a round started may take to be gone (see `round`).
const SETTLE: Duration = Duration::from_secs(5);

fn round(ws: &Path, tmp: &Path, seed: u64, totals: &mut Totals) {
    let mut rng = Rng(seed | 1);
    let fds_before = open_fds();
    let hooks = Arc::new(
        Hooks::builder()
            .workspace(ws)
            .max_event_bytes(8 << 20)
            .build()
            .unwrap(),
    );
    // Never read; bounded, so it only loses its own messages.
    let stuck = hooks.bus().subscribe_with_capacity("*", 1024).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(3));
    let big = Arc::new("b".repeat(4 << 20));
    let emitters: Vec<_> = (0..2)
        .map(|t| {
            let (em, stop, start, big) = (
                hooks.emitter("soak", &format!("emitter-{t}")),
                stop.clone(),
                start.clone(),
                big.clone(),
            );
            thread::spawn(move || {
                let mut answers: BTreeMap<String, u64> = BTreeMap::new();
                let mut max = Duration::ZERO;
                let mut i = 0u64;
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let event = match i % 4 {
                        0 if i.is_multiple_of(4000) => Event::ToolCall {
                            tool: "big",
                            success: true,
                            output: &big,
                        },
                        0 | 1 => Event::ToolCall {
                            tool: "t",
                            success: true,
                            output: "ok",
                        },
                        2 => Event::TurnComplete,
                        _ => Event::LlmRequest {
                            provider: "p",
                            model: "m",
                            messages_count: i,
                        },
                    };
                    let t0 = Instant::now();
                    let r = em.emit(event);
                    max = max.max(t0.elapsed());
                    *answers.entry(format!("{r:?}")).or_default() += 1;
                    if i.is_multiple_of(64) {
                        thread::yield_now(); // leave the pipeline some of the 2 cores
                    }
                }
                (answers, max)
            })
        })
        .collect();
    start.wait();
    // Shut down at a random moment, with a random deadline.
    thread::sleep(Duration::from_millis(200 + rng.below(1500)));
    let timeout = Duration::from_millis(50 + rng.below(700));
    let shutter = {
        let hooks = hooks.clone();
        thread::spawn(move || {
            let t0 = Instant::now();
            hooks.shutdown(timeout);
            t0.elapsed()
        })
    };
    let took = shutter.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut answers: BTreeMap<String, u64> = BTreeMap::new();
    for e in emitters {
        let (a, max) = e.join().unwrap();
        totals.max_emit = totals.max_emit.max(max);
        for (k, v) in a {
            *answers.entry(k).or_default() += v;
        }
    }
    let limit = timeout + SHUTDOWN_SLACK + SCHED_SLACK;
    assert!(
        took <= limit,
        "seed {seed}: shutdown({timeout:?}) took {took:?} (limit {limit:?})"
    );
    totals.max_shutdown_over = totals.max_shutdown_over.max(took.saturating_sub(timeout));

    let stats = hooks.stats();
    let count = |k: &str| answers.get(k).copied().unwrap_or(0);
    let own_total: u64 = answers.values().sum();
    assert_eq!(stats.emitted, own_total, "seed {seed}: {stats:#?}");
    assert_eq!(stats.queued, count("Queued"), "seed {seed}");
    assert_eq!(
        stats.dropped + stats.dropped_budget + stats.oversize,
        count("Dropped"),
        "seed {seed}"
    );
    assert_eq!(stats.skipped, count("Skipped"), "seed {seed}");
    assert_eq!(
        stats.queued,
        stats.processed + stats.dropped_shutdown,
        "seed {seed}: queued events neither processed nor counted: {stats:#?}"
    );
    for sink in &stats.sinks {
        assert!(sink.counts.balanced(), "seed {seed}: {sink:#?}");
        assert_eq!(
            sink.counts.in_flight, 0,
            "seed {seed}: {sink:#?} after shutdown"
        );
        *totals.sink_dropped.entry(sink.name.clone()).or_default() += sink.counts.dropped;
        *totals.sink_failed.entry(sink.name.clone()).or_default() += sink.counts.failed;
    }
    let shell = stats.shell().expect("a workspace has a shell backend");
    for (id, h) in &shell.hooks {
        assert!(h.balanced(), "seed {seed}: hook {id}: {h:#?}");
        assert_eq!(
            (h.running, h.queued),
            (0, 0),
            "seed {seed}: hook {id}: {h:#?}"
        );
    }
    let plugins = stats.plugins().expect("a workspace has a plugin backend");
    assert_eq!(
        plugins.plugins.len(),
        HOSTILE_PLUGINS.len(),
        "seed {seed}: {:?}",
        plugins.errors
    );
    for p in &plugins.plugins {
        let c = &p.counts;
        assert_eq!(
            c.sent,
            c.delivered + c.dropped + c.failed + c.in_flight,
            "seed {seed}: plugin {}: {c:#?}",
            p.name
        );
        assert_eq!(c.in_flight, 0, "seed {seed}: plugin {}: {c:#?}", p.name);
    }
    totals.rounds += 1;
    totals.dropped_shutdown += stats.dropped_shutdown;
    totals.processed += stats.processed;
    for (k, v) in answers {
        *totals.emits.entry(k).or_default() += v;
    }

    drop(stuck);
    let dropping = Instant::now();
    drop(hooks);
    // Nothing outlives the round: processes, zombies, descriptors, temporary files. A process
    // killed with SIGKILL exits when the kernel schedules it: on a loaded machine that is not
    // the instant `drop` returns, so this is a liveness check with slack (SETTLE); how long it
    // took is reported.
    let settled = |fds: &[String]| {
        marked_processes().is_empty()
            && children().is_empty()
            && fds.len() == fds_before.len()
            && files_under(tmp).is_empty()
    };
    while !settled(&open_fds()) && dropping.elapsed() < SETTLE {
        thread::sleep(Duration::from_millis(5));
    }
    totals.max_settle = totals.max_settle.max(dropping.elapsed());
    let survivors = marked_processes();
    assert!(
        survivors.is_empty(),
        "seed {seed}: hook processes survived: {survivors:#?}"
    );
    let kids = children();
    assert!(
        kids.is_empty(),
        "seed {seed}: children left (Z = zombie): {kids:#?}"
    );
    let fds_after = open_fds();
    assert_eq!(
        fds_after.len(),
        fds_before.len(),
        "seed {seed}: descriptors leaked: before {fds_before:#?}, after {fds_after:#?}"
    );
    let left = files_under(tmp);
    assert!(
        left.is_empty(),
        "seed {seed}: temporary files left: {left:#?}"
    );
}

#[test]
fn every_sink_misbehaving_at_once_while_shutdown_races_the_emitters() {
    // The workspace first (it must not be under the TMPDIR below), then payload files go to a
    // private $TMPDIR, so leftovers are ours to see.
    let ws = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: set before this test starts any thread, and this binary has one test.
    unsafe { std::env::set_var("TMPDIR", tmp.path()) };
    write_workspace(ws.path());
    let secs = soak_secs();
    let t0 = Instant::now();
    let mut totals = Totals::default();
    // One round first, so RSS is measured with every lazy allocation made (engine, caches).
    round(ws.path(), tmp.path(), 0x9e37_79b9_7f4a_7c15, &mut totals);
    let rss_start = rss_kib();
    let mut rss_max = rss_start;
    let live_start = LIVE.load(Ordering::Relaxed);
    let mut live_max = live_start;
    let mut seed = 1u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        seed += 1;
        round(
            ws.path(),
            tmp.path(),
            seed.wrapping_mul(0x2545_f491_4f6c_dd1d),
            &mut totals,
        );
        rss_max = rss_max.max(rss_kib());
        let live = LIVE.load(Ordering::Relaxed);
        live_max = live_max.max(live);
        if std::env::var_os("PRX_HOOKS_SOAK_VERBOSE").is_some() {
            eprintln!(
                "round {}: live heap {} KiB, RSS {} MiB",
                totals.rounds,
                live / 1024,
                rss_kib() / 1024
            );
        }
    }
    let rss_end = rss_kib();
    println!(
        "soak: {} rounds in {:.0} s; emits {:?}; processed {}; dropped at shutdown {}; \
         sink drops {:?}; sink failures {:?}; max emit {:?}; shutdown at most {:?} past its \
         deadline; everything gone at most {:?} after drop; heap live between rounds {} KiB after the first, {} KiB max; RSS {} MiB \
         after the first round, {} MiB max, {} MiB at the end",
        totals.rounds,
        t0.elapsed().as_secs_f64(),
        totals.emits,
        totals.processed,
        totals.dropped_shutdown,
        totals.sink_dropped,
        totals.sink_failed,
        totals.max_emit,
        totals.max_shutdown_over,
        totals.max_settle,
        live_start / 1024,
        live_max / 1024,
        rss_start / 1024,
        rss_max / 1024,
        rss_end / 1024,
    );
    // What the pipeline keeps between rounds: nothing. Every round builds and drops a whole
    // pipeline (hundreds of MiB go through it); a leak of one message per round shows here.
    assert!(
        live_max <= live_start + (1 << 20),
        "heap live between rounds grew from {} KiB to {} KiB",
        live_start / 1024,
        live_max / 1024
    );
    // RSS also counts what glibc keeps cached (arenas, thread stacks) after `malloc_trim`: up to
    // ~150 MiB here across rounds, bounded but not returned. It must stay bounded.
    assert!(
        rss_max <= rss_start + 256 * 1024,
        "RSS grew from {} MiB to {} MiB",
        rss_start / 1024,
        rss_max / 1024
    );
}
