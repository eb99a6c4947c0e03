//! Shell-hook spawn throughput (ARCHITECTURE.md § Performance targets: ≥ 90 % of a raw
//! `Command::spawn` + `wait` loop measured in the same run, and ≥ 1,000 spawns/s per core),
//! and the spawn path chosen for hooks measured against the alternatives.
//!
//! Group `spawn_path`, one iteration = one `/bin/true` started and waited for, serially, on the
//! bench thread:
//! * `raw_command` (baseline): `Command::new("/bin/true")`, stdio to /dev/null, `spawn()`,
//!   `wait()`. std's own path (glibc `posix_spawn`): no containment at all.
//! * `fork_pre_exec`: std `Command` with a `pre_exec` that does what containment needs
//!   (every disposition to default, an empty mask, PDEATHSIG, `close_range` CLOEXEC above
//!   stderr) and a stderr pipe: std then forks.
//! * `posix_spawn`: glibc `posix_spawn` by hand with SETSIGMASK (empty), SETSIGDEF (all),
//!   SETPGROUP, `addfchdir_np` to a cwd opened per spawn, `addclosefrom_np(3)`, a stderr pipe
//!   and a pidfd: all of containment except PDEATHSIG, rlimits and a cgroup, which it cannot do.
//! * `clone_vfork`: prx-hooks' path (`__private::spawn::Spawner`: the same as every hook gets —
//!   dispositions, mask, group, PDEATHSIG, cwd checked beneath the workspace, close_range,
//!   stderr pipe, pidfd).
//!
//! Group `spawn`, one iteration = one `/bin/true` *hook* run end to end:
//! * `shell_sink`: `ShellSink::deliver` of one `turn_complete` event per iteration to a table
//!   with one `/bin/true` hook (default limits: `max_concurrent` 8, 64 running), then waiting
//!   until every one has been reaped and counted `ok`. Each run pays for everything a real hook
//!   gets: the queue, the payload file (created, written, removed), the sanitized environment
//!   with the `ZERO_HOOK_*` variables, a stderr pipe, a pidfd, the reaper's poll.
//! * `shell_sink_serial`: the same hook with `max_concurrent` 1: one process at a time, like
//!   the baseline, so the ratio isolates the per-spawn overhead from the concurrency gain.
//! * `shell_sink_cgroup`: `shell_sink` with a cgroup per run (when this process's cgroup v2 is
//!   delegated; skipped with a word otherwise).
//!
//! At the end: spawns/s from the criterion medians and their ratios to the baseline; then
//! paired rounds (every routine back to back in rotating order, median of the per-round
//! ratios: steadier than medians taken minutes apart on a shared machine), once as is and
//! once with 1 GiB of touched memory in this process (what `fork` has to copy the page tables
//! of); then a per-core figure from a fixed run of each sink routine (spawns per CPU-second:
//! this process plus its reaped children, from `getrusage`). The last ones run even when a
//! filter skips the criterion groups (`cargo bench --bench spawn -- none`).

mod common;

use common::*;
use criterion::{Criterion, Throughput};
use nix::libc;
use prx_hooks::config::{Action, HookTable};
use prx_hooks::shell::{ShellLimits, ShellSink, event_message};
use prx_hooks::{Event, EventKind, Message, Sink};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn true_hook(cwd: &Path, max_concurrent: usize) -> Arc<HookTable> {
    let action = Action {
        id: "true".into(),
        id_explicit: true,
        event: EventKind::TurnComplete,
        index: 0,
        command: "/bin/true".into(),
        program: Ok("/bin/true".into()),
        args: Vec::new(),
        env: Vec::new(),
        cwd: cwd.to_path_buf(),
        timeout: Duration::from_secs(30),
        timeout_explicit: true,
        stdin_json: false,
        enabled: true,
        matcher: None,
        max_concurrent,
        limits: Default::default(),
    };
    Arc::new(HookTable {
        enabled: true,
        env_passthrough: Vec::new(),
        actions: vec![Arc::new(action)],
        source: None,
        warnings: Vec::new(),
        path: None,
    })
}

fn raw_spawn() {
    let status = Command::new("/bin/true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn /bin/true")
        .wait()
        .expect("wait");
    assert!(status.success());
}

/// std `Command` with the containment a hook needs done in `pre_exec`: std forks.
fn fork_spawn(cwd: &Path) {
    let mut cmd = Command::new("/bin/true");
    cmd.env_clear()
        .env("PATH", prx_hooks::shell::SANITIZED_PATH)
        .current_dir(cwd)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: only raw system calls between fork and exec (async-signal-safe), no allocation.
    unsafe {
        cmd.pre_exec(|| {
            let dfl = [0u64; 4];
            for sig in 1..=64 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::syscall(
                        libc::SYS_rt_sigaction,
                        sig,
                        dfl.as_ptr(),
                        std::ptr::null_mut::<libc::c_void>(),
                        8usize,
                    );
                }
            }
            let empty = 0u64;
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &empty as *const u64,
                std::ptr::null_mut::<libc::c_void>(),
                8usize,
            );
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            // CLOEXEC, not close: std's exec-error pipe must survive until exec.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            Ok(())
        });
    }
    let status = cmd.spawn().expect("fork /bin/true").wait().expect("wait");
    assert!(status.success());
}

/// glibc `posix_spawn` by hand, with everything of containment it can do.
struct PosixSpawn {
    program: CString,
    envp: Vec<CString>,
    cwd: CString,
    null: OwnedFd,
}

impl PosixSpawn {
    fn new(cwd: &Path) -> PosixSpawn {
        let null = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .unwrap();
        PosixSpawn {
            program: CString::new("/bin/true").unwrap(),
            envp: vec![CString::new(format!("PATH={}", prx_hooks::shell::SANITIZED_PATH)).unwrap()],
            cwd: CString::new(cwd.as_os_str().as_encoded_bytes()).unwrap(),
            null: null.into(),
        }
    }

    fn spawn_wait(&self) {
        // SAFETY: plain libc calls on locals initialized by their init functions, and on
        // descriptors and strings we own; every object is destroyed before returning.
        unsafe {
            let cwd = libc::open(
                self.cwd.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            assert!(cwd >= 0);
            let mut pipe = [0; 2];
            assert_eq!(libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
            libc::posix_spawnattr_init(&mut attr);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::posix_spawnattr_setsigmask(&mut attr, &set);
            libc::sigfillset(&mut set);
            libc::posix_spawnattr_setsigdefault(&mut attr, &set);
            libc::posix_spawnattr_setpgroup(&mut attr, 0);
            libc::posix_spawnattr_setflags(
                &mut attr,
                (libc::POSIX_SPAWN_SETSIGMASK
                    | libc::POSIX_SPAWN_SETSIGDEF
                    | libc::POSIX_SPAWN_SETPGROUP) as _,
            );
            let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            libc::posix_spawn_file_actions_init(&mut fa);
            let null = self.null.as_raw_fd();
            libc::posix_spawn_file_actions_adddup2(&mut fa, null, 0);
            libc::posix_spawn_file_actions_adddup2(&mut fa, null, 1);
            libc::posix_spawn_file_actions_adddup2(&mut fa, pipe[1], 2);
            libc::posix_spawn_file_actions_addfchdir_np(&mut fa, cwd);
            libc::posix_spawn_file_actions_addclosefrom_np(&mut fa, 3);
            let argv = [self.program.as_ptr(), std::ptr::null()];
            let envp: Vec<*const libc::c_char> = self
                .envp
                .iter()
                .map(|e| e.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect();
            let mut pid = 0;
            let r = libc::posix_spawn(
                &mut pid,
                self.program.as_ptr(),
                &fa,
                &attr,
                argv.as_ptr() as *const *mut libc::c_char,
                envp.as_ptr() as *const *mut libc::c_char,
            );
            assert_eq!(r, 0, "posix_spawn");
            libc::posix_spawn_file_actions_destroy(&mut fa);
            libc::posix_spawnattr_destroy(&mut attr);
            libc::close(cwd);
            libc::close(pipe[1]);
            let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert_eq!(status, 0);
            libc::close(pipe[0]);
            if pidfd >= 0 {
                drop(OwnedFd::from_raw_fd(pidfd as i32));
            }
        }
    }
}

/// Touches `bytes` of fresh memory and keeps it (what a large host has mapped and written).
fn ballast(bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    for i in (0..bytes).step_by(4096) {
        v[i] = 1;
    }
    v
}

struct Bench {
    sink: ShellSink,
    msg: Message,
}

impl Bench {
    fn new(ws: &Path, max_concurrent: usize) -> Bench {
        Bench::with(ws, max_concurrent, None)
    }

    fn with(ws: &Path, max_concurrent: usize, cgroup: Option<&Path>) -> Bench {
        let sink = ShellSink::standalone(
            ws.to_path_buf(),
            ShellLimits {
                queue_per_action: 1 << 20,
                cgroup: cgroup.map(Path::to_path_buf),
                ..ShellLimits::default()
            },
        );
        sink.set_table(true_hook(ws, max_concurrent));
        let msg = event_message(&Event::TurnComplete, "agent-1", "session-1", 0);
        Bench { sink, msg }
    }

    /// Delivers `n` events and waits until all `n` hooks have been reaped.
    fn run(&self, n: u64) -> Duration {
        let before = self.sink.counts();
        let t = Instant::now();
        for _ in 0..n {
            self.sink.deliver(&self.msg);
        }
        loop {
            let c = self.sink.counts();
            if c.delivered + c.failed + c.dropped
                >= before.delivered + before.failed + before.dropped + n
            {
                let took = t.elapsed();
                assert_eq!(
                    (c.failed, c.dropped),
                    (before.failed, before.dropped),
                    "every /bin/true must succeed: {:?}",
                    self.sink.runs("true").last()
                );
                return took;
            }
            // Sleep about a third of the time the rest should take (≈ 1 ms per hook), so the
            // waiting costs next to no CPU (the per-core figures count this process).
            let left = (before.delivered + before.failed + before.dropped + n)
                .saturating_sub(c.delivered + c.failed + c.dropped);
            std::thread::sleep(Duration::from_micros((left * 300).clamp(100, 20_000)));
        }
    }
}

/// CPU seconds of this process and its reaped children so far.
fn cpu_seconds() -> f64 {
    let usage = |who| {
        let u = nix::sys::resource::getrusage(who).expect("getrusage");
        let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
        tv(u.user_time()) + tv(u.system_time())
    };
    use nix::sys::resource::UsageWho;
    usage(UsageWho::RUSAGE_SELF) + usage(UsageWho::RUSAGE_CHILDREN)
}

/// (spawns per wall second, spawns per CPU second) for `n` runs of `f`.
fn per_core(n: u64, f: impl FnOnce(u64) -> Duration) -> (f64, f64) {
    let cpu0 = cpu_seconds();
    let wall = f(n);
    let cpu = cpu_seconds() - cpu0;
    (n as f64 / wall.as_secs_f64(), n as f64 / cpu)
}

/// The routines compared in paired rounds: (name, one batch of `n`).
type Routine<'a> = (&'static str, Box<dyn Fn(u64) -> Duration + 'a>);

/// Paired rounds: every routine back to back in rotating order, so load from other processes
/// on this shared machine hits all of them alike; prints the median of the per-round
/// throughput ratios to the first routine (the baseline), with min and max.
fn paired(title: &str, rounds: usize, per_round: u64, routines: &[Routine<'_>]) {
    let k = routines.len();
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); k];
    for round in 0..rounds {
        let mut secs = vec![0.0f64; k];
        for j in 0..k {
            let which = (round + j) % k;
            secs[which] = (routines[which].1)(per_round).as_secs_f64();
        }
        for (which, r) in ratios.iter_mut().enumerate() {
            r.push(secs[0] / secs[which]);
        }
    }
    println!(
        "\nPAIRED ROUNDS, {title} ({rounds} rounds of {per_round} spawns each, rotating order; throughput ratio to {}, median [min max])",
        routines[0].0
    );
    for (j, r) in ratios.iter_mut().enumerate().skip(1) {
        r.sort_by(f64::total_cmp);
        let (m, lo, hi) = (r[r.len() / 2], r[0], r[r.len() - 1]);
        let verdict = if m >= 0.90 { "" } else { "  (< 0.90)" };
        println!(
            "{:<28} {m:>6.2}x  [{lo:.2} {hi:.2}]{verdict}",
            routines[j].0
        );
    }
}

fn serial(n: u64, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    (0..n).for_each(|_| f());
    t.elapsed()
}

fn main() {
    let _ = process_start();
    let ws = tempfile::tempdir().expect("tempdir");
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6))
        .configure_from_args();

    let posix = PosixSpawn::new(ws.path());
    let ours = prx_hooks::__private::spawn::Spawner::new(Path::new("/bin/true"), ws.path())
        .expect("spawner");
    let clone_vfork = || {
        assert_eq!(ours.spawn_wait(), Ok(0));
    };
    {
        let mut g = c.benchmark_group("spawn_path");
        g.throughput(Throughput::Elements(1));
        g.bench_function("raw_command", |b| b.iter(raw_spawn));
        g.bench_function("fork_pre_exec", |b| b.iter(|| fork_spawn(ws.path())));
        g.bench_function("posix_spawn", |b| b.iter(|| posix.spawn_wait()));
        g.bench_function("clone_vfork", |b| b.iter(clone_vfork));
        g.finish();
    }

    let pooled = Bench::new(ws.path(), 8);
    let serial_sink = Bench::new(ws.path(), 1);
    let cgroup_base = prx_hooks::shell::cgroup::detect();
    let cgrouped = match &cgroup_base {
        Ok(dir) => Some(Bench::with(ws.path(), 8, Some(dir))),
        Err(why) => {
            println!("shell_sink_cgroup: not measured: {why}");
            None
        }
    };
    {
        let mut g = c.benchmark_group("spawn");
        g.throughput(Throughput::Elements(1));
        g.bench_function("raw_command", |b| b.iter(raw_spawn));
        g.bench_function("shell_sink", |b| b.iter_custom(|iters| pooled.run(iters)));
        g.bench_function("shell_sink_serial", |b| {
            b.iter_custom(|iters| serial_sink.run(iters))
        });
        if let Some(cg) = &cgrouped {
            g.bench_function("shell_sink_cgroup", |b| {
                b.iter_custom(|iters| cg.run(iters))
            });
        }
        g.finish();
    }
    c.final_summary();

    if !bench_mode() {
        return; // `cargo test --benches`: criterion ran each routine once; that is enough
    }
    let rate = |id: &str| median_ns(id).map(|ns| 1e9 / ns);
    for (group, ids) in [
        (
            "spawn_path",
            &["raw_command", "fork_pre_exec", "posix_spawn", "clone_vfork"][..],
        ),
        (
            "spawn",
            &[
                "raw_command",
                "shell_sink",
                "shell_sink_serial",
                "shell_sink_cgroup",
            ][..],
        ),
    ] {
        let base = rate(&format!("{group}/raw_command"));
        if base.is_none() {
            continue;
        }
        println!("\nTHROUGHPUT {group} (criterion medians; ratio to raw_command)");
        for id in ids {
            if let (Some(r), Some(b)) = (rate(&format!("{group}/{id}")), base) {
                println!("{id:<28} {r:>8.0} spawns/s  {:>5.2}x", r / b);
            }
        }
    }

    const ROUNDS: usize = 12;
    const PER_ROUND: u64 = 300;
    let mut routines: Vec<Routine<'_>> = vec![
        ("raw_command", Box::new(|n| serial(n, raw_spawn))),
        (
            "fork_pre_exec",
            Box::new(|n| serial(n, || fork_spawn(ws.path()))),
        ),
        (
            "posix_spawn",
            Box::new(|n| serial(n, || posix.spawn_wait())),
        ),
        ("clone_vfork", Box::new(|n| serial(n, clone_vfork))),
        ("shell_sink", Box::new(|n| pooled.run(n))),
        ("shell_sink_serial", Box::new(|n| serial_sink.run(n))),
    ];
    if let Some(cg) = &cgrouped {
        routines.push(("shell_sink_cgroup", Box::new(|n| cg.run(n))));
    }
    paired("this process as is", ROUNDS, PER_ROUND, &routines);
    // A host with 1 GiB written: fork copies its page tables on every spawn; the vfork-style
    // paths share them.
    let big = ballast(1 << 30);
    paired(
        "with 1 GiB touched in this process",
        ROUNDS / 2,
        PER_ROUND / 2,
        &routines[..4],
    );
    drop(big);

    const N: u64 = 2_000;
    println!(
        "\nPER CORE ({N} spawns each; CPU = this process + its reaped children; target >= 1,000/s per core)"
    );
    let mut rows = vec![
        ("raw_command", per_core(N, |n| serial(n, raw_spawn))),
        ("shell_sink", per_core(N, |n| pooled.run(n))),
        ("shell_sink_serial", per_core(N, |n| serial_sink.run(n))),
    ];
    if let Some(cg) = &cgrouped {
        rows.push(("shell_sink_cgroup", per_core(N, |n| cg.run(n))));
    }
    for (id, (wall, cpu)) in rows {
        let verdict = if cpu >= 1_000.0 { "met" } else { "MISSED" };
        println!("{id:<28} {wall:>8.0} spawns/s wall  {cpu:>8.0} spawns per CPU-second  {verdict}");
    }
    for b in [&pooled, &serial_sink].into_iter().chain(cgrouped.as_ref()) {
        b.sink.shutdown(Instant::now() + Duration::from_secs(2));
    }
    print_machine_note();
}
