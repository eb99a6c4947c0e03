//! hooks.json hot reload: the time from a change to hooks.json until the new table is live
//! (target (ARCHITECTURE.md § Performance targets): ≤ 100 ms p99).
//!
//! Each variant runs in its own temporary workspace (under `std::env::temp_dir()`) holding a
//! valid hooks.json. One iteration = one save of a new, valid hooks.json (two shapes alternate,
//! and every save carries a fresh action id `bench-<seq>`, so it is never byte-identical to the
//! live one), timed from just before the first byte is written until the new table is seen
//! (the table carrying `bench-<seq>`; a callback with any other table is counted, not accepted).
//!
//! Group `reload`:
//! * `inotify_rename`: a [`ConfigWatcher`] with the default options (50 ms debounce, inotify,
//!   polling forced off) whose `on_reload` callback sends the table down a channel; the save
//!   writes `.hooks.json.tmp` and renames it over hooks.json (how editors save).
//! * `inotify_in_place`: the same watcher; the save truncates and rewrites hooks.json in place
//!   (`std::fs::write`: open with `O_TRUNC`, write, close).
//! * `poll_rename`: the fallback: `WatchOptions { poll: true, .. }` (one `stat` every 25 ms by default,
//!   then the 50 ms debounce), rename saves.
//! * `hooks_rename`: end to end through the public API: `Hooks::builder().workspace(..)`
//!   `.build()`, rename saves, done when `hooks.hook_table()` returns the new table (checked
//!   every ~20 µs; this adds up to one check interval plus a sleep's timer slack).
//!
//! Saves come at human pace, not back to back: before each save (untimed) the bench waits a
//! random 0.5–2.5 ms (inotify) or a random 0–25 ms (poll: a uniformly random phase against the
//! poll ticks; saving right after a reload would always land at the same phase), and checks via
//! `/proc/self/task/<tid>/stat` that the watcher thread is asleep, so every save finds the
//! watcher idle.
//!
//! Besides criterion's medians, every iteration (warm-up included) is recorded; a variant with
//! fewer than 200 recorded saves is topped up after criterion. At the end: p50 / p99 / max per
//! variant and the ratio p99 / 100 ms (below 1 = target met), and the watchers' counters.

mod common;

use common::*;
use criterion::{Criterion, SamplingMode};
use prx_hooks::Hooks;
use prx_hooks::config::{
    ConfigWatcher, HOOKS_FILE, HookTable, WatchOptions, WatcherKind, file_label, parse,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// ARCHITECTURE.md: a hooks.json change is live within 100 ms (p99).
const TARGET: Duration = Duration::from_millis(100);
/// Saves recorded per variant for the percentile table, at least.
const MIN_SAMPLES: usize = 200;
/// A save not live after this is a failure, not a slow sample.
const DEADLINE: Duration = Duration::from_secs(5);
/// The watcher's default poll interval (`WatchOptions::default().poll_interval`).
const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// The watcher thread's name as the kernel keeps it (cut to 15 bytes).
const WATCHER_THREAD: &str = "prx-hooks-confi";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Save {
    /// Write `.hooks.json.tmp`, rename it over hooks.json.
    Rename,
    /// Truncate and rewrite hooks.json.
    InPlace,
}

/// The hooks.json of save number `seq`: two shapes alternate; the id makes every save unique.
fn content(seq: u64) -> String {
    if seq.is_multiple_of(2) {
        format!(
            r#"{{
  "hooks": {{
    "tool_call": [
      {{ "id": "bench-{seq}", "command": "/bin/true", "timeout_ms": 2000 }}
    ]
  }}
}}
"#
        )
    } else {
        format!(
            r#"{{
  "timeout_ms": 5000,
  "hooks": {{
    "turn_complete": [ {{ "id": "bench-{seq}", "command": "/bin/true" }} ],
    "error": [ {{ "id": "errors-{seq}", "command": "/bin/true", "args": ["x"] }} ]
  }}
}}
"#
        )
    }
}

fn id(seq: u64) -> String {
    format!("bench-{seq}")
}

fn is_seq(table: &HookTable, seq: u64) -> bool {
    table.get(&id(seq)).is_some()
}

fn save(ws: &Path, how: Save, text: &str) {
    let file = ws.join(HOOKS_FILE);
    match how {
        Save::Rename => {
            let tmp = ws.join(".hooks.json.tmp");
            std::fs::write(&tmp, text).expect("write the temporary file");
            std::fs::rename(&tmp, &file).expect("rename over hooks.json");
        }
        Save::InPlace => std::fs::write(&file, text).expect("rewrite hooks.json"),
    }
}

/// xorshift64*: the pauses only need to be spread, not unpredictable.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64);
        Rng(seed | 1)
    }

    fn below(&mut self, d: Duration) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        Duration::from_nanos(r % (d.as_nanos() as u64).max(1))
    }
}

/// What makes a table live, and how the bench sees it.
enum Live {
    /// A bare watcher; its callback sends each new table.
    Watcher {
        watcher: ConfigWatcher,
        rx: Receiver<Arc<HookTable>>,
    },
    /// The whole `Hooks`; the bench checks `hook_table()`.
    Hooks(Box<Hooks>),
}

struct Rig {
    /// Declared before `dir`: the watcher stops before the workspace goes away.
    live: Live,
    ws: PathBuf,
    _dir: tempfile::TempDir,
    how: Save,
    seq: u64,
    rng: Rng,
    max_pause: Duration,
    watcher_tid: Option<u32>,
    /// Saves recorded (ns), warm-up included.
    samples: Vec<u64>,
    /// Callbacks that carried some other table (there should be none).
    stale: u64,
    /// Pre-save checks that found the watcher thread asleep / not asleep within 5 ms.
    asleep: u64,
    awake: u64,
}

enum Kind {
    Watcher { poll: bool },
    Hooks,
}

impl Rig {
    fn new(kind: Kind, how: Save) -> Rig {
        assert!(
            find_thread(WATCHER_THREAD).is_none(),
            "the previous variant's watcher is still running"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().to_path_buf();
        for seq in [0, 1] {
            if let Err(e) = parse(content(seq).as_bytes(), &file_label(&ws), &ws) {
                panic!("the bench's hooks.json #{seq} is invalid:\n{e}");
            }
        }
        save(&ws, Save::InPlace, &content(0));
        let (live, max_pause) = match kind {
            Kind::Watcher { poll } => {
                let (tx, rx) = mpsc::channel();
                let opts = WatchOptions {
                    poll,
                    ..WatchOptions::default()
                };
                assert_eq!(opts.debounce, Duration::from_millis(50));
                assert_eq!(opts.poll_interval, POLL_INTERVAL);
                let on_reload = Box::new(move |t: Arc<HookTable>| {
                    let _ = tx.send(t);
                });
                let watcher = ConfigWatcher::start_with(ws.clone(), opts, on_reload)
                    .expect("start the watcher");
                let want = if poll {
                    WatcherKind::Poll
                } else {
                    WatcherKind::Inotify
                };
                assert_eq!(watcher.kind(), want, "watcher kind");
                let initial = rx.recv_timeout(DEADLINE).expect("the initial load");
                assert!(is_seq(&initial, 0), "the initial table");
                let max_pause = if poll {
                    POLL_INTERVAL
                } else {
                    Duration::from_millis(2)
                };
                (Live::Watcher { watcher, rx }, max_pause)
            }
            Kind::Hooks => {
                let hooks = Hooks::builder().workspace(&ws).build().expect("Hooks");
                assert!(is_seq(&hooks.hook_table(), 0), "the initial table");
                let kind = hooks.stats().config().map(|c| c.watcher);
                assert_eq!(
                    kind,
                    Some(WatcherKind::Inotify),
                    "Hooks polls (PRX_HOOKS_POLL=1 set?)"
                );
                (Live::Hooks(Box::new(hooks)), Duration::from_millis(2))
            }
        };
        Rig {
            watcher_tid: watcher_thread(),
            live,
            ws,
            _dir: dir,
            how,
            seq: 0,
            rng: Rng::new(),
            max_pause,
            samples: Vec::new(),
            stale: 0,
            asleep: 0,
            awake: 0,
        }
    }

    /// One save, timed until the new table is live.
    fn once(&mut self) -> Duration {
        // Untimed: a human-paced gap, and the watcher idle.
        let floor = if self.max_pause < POLL_INTERVAL {
            Duration::from_micros(500)
        } else {
            Duration::ZERO
        };
        std::thread::sleep(floor + self.rng.below(self.max_pause));
        if let Some(tid) = self.watcher_tid {
            match wait_sleeping(tid, Duration::from_millis(5)) {
                true => self.asleep += 1,
                false => self.awake += 1,
            }
        }
        self.seq += 1;
        let seq = self.seq;
        let text = content(seq);

        let t0 = Instant::now();
        save(&self.ws, self.how, &text);
        let took = match &self.live {
            Live::Watcher { rx, .. } => loop {
                match rx.recv_timeout(DEADLINE.saturating_sub(t0.elapsed())) {
                    Ok(t) if is_seq(&t, seq) => break t0.elapsed(),
                    Ok(_) => self.stale += 1,
                    Err(RecvTimeoutError::Timeout) => self.missed(seq),
                    Err(RecvTimeoutError::Disconnected) => panic!("the watcher stopped"),
                }
            },
            Live::Hooks(hooks) => loop {
                if is_seq(&hooks.hook_table(), seq) {
                    break t0.elapsed();
                }
                if t0.elapsed() > DEADLINE {
                    self.missed(seq);
                }
                std::thread::sleep(Duration::from_micros(20));
            },
        };
        self.samples.push(took.as_nanos() as u64);
        took
    }

    fn missed(&self, seq: u64) -> ! {
        panic!(
            "save #{seq} not live after {DEADLINE:?}; watcher stats: {:?}",
            self.config_stats()
        )
    }

    fn config_stats(&self) -> Option<prx_hooks::config::ConfigStats> {
        match &self.live {
            Live::Watcher { watcher, .. } => Some(watcher.stats()),
            Live::Hooks(hooks) => hooks.stats().config().cloned(),
        }
    }

    fn note(&self, name: &str) -> String {
        let c = self.config_stats();
        let checked = match self.watcher_tid {
            Some(_) => format!(
                "asleep before {} of {} saves",
                self.asleep,
                self.asleep + self.awake
            ),
            None => "thread not found, not checked".to_string(),
        };
        format!(
            "{name}: {} saves; reloads {}, rejected {}, unchanged {}; stale callbacks {}; \
             watcher {checked}",
            self.seq,
            c.as_ref().map_or(0, |c| c.reloads),
            c.as_ref().map_or(0, |c| c.reload_errors),
            c.as_ref().map_or(0, |c| c.unchanged),
            self.stale,
        )
    }
}

/// The watcher thread's id. The thread names itself once it runs, which may be a moment after
/// `start` returned.
fn watcher_thread() -> Option<u32> {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let tid = find_thread(WATCHER_THREAD);
        if tid.is_some() || Instant::now() >= until {
            return tid;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

struct Variant {
    id: &'static str,
    kind: fn() -> Kind,
    how: Save,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        id: "inotify_rename",
        kind: || Kind::Watcher { poll: false },
        how: Save::Rename,
    },
    Variant {
        id: "inotify_in_place",
        kind: || Kind::Watcher { poll: false },
        how: Save::InPlace,
    },
    Variant {
        id: "poll_rename",
        kind: || Kind::Watcher { poll: true },
        how: Save::Rename,
    },
    Variant {
        id: "hooks_rename",
        kind: || Kind::Hooks,
        how: Save::Rename,
    },
];

/// (variant, sorted samples in ns) for the table at the end, and the notes.
type Results = Vec<(String, Vec<u64>)>;

fn bench_reload(c: &mut Criterion, results: &mut Results, notes: &mut Vec<String>) {
    let mut g = c.benchmark_group("reload");
    g.sampling_mode(SamplingMode::Flat);
    for v in &VARIANTS {
        let poll = matches!((v.kind)(), Kind::Watcher { poll: true });
        if poll {
            // ~150 ms timed (~250 ms wall with the pause) per save: about 150 saves here.
            g.sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(20));
        } else {
            g.sample_size(20)
                .warm_up_time(Duration::from_millis(300))
                .measurement_time(Duration::from_secs(2));
        }
        let mut rig = Rig::new((v.kind)(), v.how);
        g.bench_function(v.id, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| rig.once()).sum())
        });
        let name = format!("reload/{}", v.id);
        if rig.samples.is_empty() {
            continue; // filtered out
        }
        if bench_mode() {
            while rig.samples.len() < MIN_SAMPLES {
                rig.once();
            }
        }
        notes.push(rig.note(&name));
        let mut samples = std::mem::take(&mut rig.samples);
        samples.sort_unstable();
        results.push((name, samples));
    }
    g.finish();
}

fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

fn main() {
    process_start();
    let mut c = Criterion::default().configure_from_args();
    let mut results = Results::new();
    let mut notes = Vec::new();
    bench_reload(&mut c, &mut results, &mut notes);
    c.final_summary();

    if !bench_mode() || results.is_empty() {
        return; // `cargo test --benches`, or everything filtered out
    }
    println!(
        "\nRELOAD LATENCY (hooks.json saved → new table live; every save recorded, warm-up \
         included)"
    );
    println!(
        "  {:<26} {:>10} {:>10} {:>10} {:>10} {:>6} {:>12}",
        "", "median*", "p50", "p99", "max", "saves", "p99/100ms"
    );
    for (name, v) in &results {
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        let p99 = q(0.99);
        println!(
            "  {:<26} {:>10} {:>10} {:>10} {:>10} {:>6} {:>11.3}x",
            name,
            median_ns(name).map_or("-".into(), fmt_ns),
            ms(q(0.50)),
            ms(p99),
            ms(v[v.len() - 1]),
            v.len(),
            p99 as f64 / TARGET.as_nanos() as f64
        );
    }
    println!("  (* criterion's median of per-sample means)");
    println!("\nTARGET (ARCHITECTURE.md: hooks.json change → live ≤ 100 ms p99)");
    for (name, v) in &results {
        let p99 = v[((v.len() - 1) as f64 * 0.99).round() as usize];
        let verdict = if p99 <= TARGET.as_nanos() as u64 {
            format!(
                "met ({:.0} % of the budget)",
                p99 as f64 * 100.0 / TARGET.as_nanos() as f64
            )
        } else {
            format!(
                "MISSED by {} ({:.0} %)",
                ms(p99 - TARGET.as_nanos() as u64),
                (p99 as f64 / TARGET.as_nanos() as f64 - 1.0) * 100.0
            )
        };
        println!("  {name:<26} p99 {:>10}: {verdict}", ms(p99));
    }
    println!();
    for n in notes {
        println!("{n}");
    }
    print_machine_note();
}
