//! Shell-hook containment under the real CLI: `prx-hooks run` and `fire`
//! with real hooks.json files, real processes, real signals (ARCHITECTURE.md § Shell hooks).
//!
//! This binary is a child subreaper, so whatever a `run` leaves behind after it exits (or is
//! killed) becomes our child and is counted, then killed and reaped by pid.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::procs;
use crate::support;
use procs::{alive, all_pids, cmdline, proc_stat, procs_exactly};
use support::{lines, wait_for};

fn subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
    });
}

/// The CLI under test: `PRX_HOOKS_BIN` when set (a copy taken right after the build, for long
/// runs in a target directory other builds share), else cargo's.
fn bin() -> Command {
    let exe =
        std::env::var_os("PRX_HOOKS_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_prx-hooks").into());
    let mut cmd = Command::new(exe);
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// Live processes whose command line contains `marker`.
fn procs_with(marker: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| alive(p) && cmdline(p).contains(marker))
        .collect()
}

/// A unique marker for this test: digits only, so it can ride as `sleep`'s fraction.
fn marker(tag: u32) -> String {
    format!("{}{:03}", std::process::id(), tag)
}

/// Kills and reaps whatever of ours is left (our children: we are the subreaper), and
/// returns what was still alive.
fn kill_leftovers(marker: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut left = Vec::new();
    for p in procs_with(marker) {
        left.push((p, cmdline(p)));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    std::thread::sleep(Duration::from_millis(50));
    // Only orphans reparented to us: a zombie that is one of the processes the tests spawn
    // themselves (`prx-hooks`, `mkfifo`, `cat`) belongs to a `Command` of a test running
    // beside this one, which is about to wait for it (reaped here, its `output()` failed with
    // ECHILD).
    let ours = |p: i32| {
        let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        matches!(comm.trim_end(), "prx-hooks" | "mkfifo" | "cat")
    };
    for p in all_pids() {
        if proc_stat(p).is_some_and(|(s, ppid, _)| ppid == me && s == 'Z') && !ours(p) {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(p), None);
        }
    }
    left
}

struct Ws {
    dir: tempfile::TempDir,
    tmp: tempfile::TempDir,
}

impl Ws {
    fn new(hooks: serde_json::Value) -> Ws {
        let ws = Ws {
            dir: tempfile::tempdir().unwrap(),
            tmp: tempfile::tempdir().unwrap(),
        };
        ws.write(hooks);
        ws
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, hooks: serde_json::Value) {
        std::fs::write(
            self.path().join("hooks.json"),
            serde_json::to_vec_pretty(&hooks).unwrap(),
        )
        .unwrap();
    }

    /// `prx-hooks run` reading events from a pipe on its stdin (closing it ends the input; a
    /// named FIFO would stay open until a signal), stderr captured, TMPDIR our own.
    fn run(&self, extra: &[&str]) -> Run {
        let mut child = bin()
            .env("TMPDIR", self.tmp.path())
            .args(["run", "--workspace"])
            .arg(self.path())
            .args(["--events", "-"])
            .args(extra)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let events = stdin_file(&mut child);
        Run::new(child, events)
    }

    /// Files left under TMPDIR (payload files and the private directories holding them).
    fn tmp_entries(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect()
    }
}

struct Run {
    child: Child,
    events: Option<std::fs::File>,
    /// Reads `run`'s stderr as it comes: a pipe nobody drains fills up (64 KiB: a few hundred
    /// timeout warnings) and then blocks `run`'s logging threads, the hooks' runner included.
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Run {
    fn new(mut child: Child, events: std::fs::File) -> Run {
        let mut pipe = child.stderr.take().expect("stderr piped");
        let stderr = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = std::io::Read::read_to_end(&mut pipe, &mut buf);
            buf
        });
        Run {
            child,
            events: Some(events),
            stderr: Some(stderr),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// One event (its sample payload); `n` only orders the test's own view (hooks see the
    /// worker's `ZERO_HOOK_SEQ`, which counts from 0 per emitter).
    fn emit(&mut self, event: &str, _n: u64) {
        let kind = prx_hooks::EventKind::from_name(event).unwrap();
        let line = format!(
            r#"{{"event":"{event}","agent":"a","session":"s","payload":{}}}"#,
            kind.sample_payload()
        );
        writeln!(self.events.as_mut().unwrap(), "{line}").unwrap();
    }

    /// EOF on the input: `run` drains and exits. Returns (success, stderr).
    fn finish(mut self) -> (bool, String) {
        drop(self.events.take());
        let status = self.child.wait().unwrap();
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (
            status.success(),
            String::from_utf8_lossy(&stderr).into_owned(),
        )
    }

    fn report(stderr: &str) -> serde_json::Value {
        let line = stderr.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stderr}"))
    }
}

/// The child's stdin pipe as a file to write events to.
fn stdin_file(child: &mut Child) -> std::fs::File {
    std::fs::File::from(std::os::fd::OwnedFd::from(
        child.stdin.take().expect("stdin piped"),
    ))
}

fn hook(command: &str, args: &[&str], timeout_ms: u64) -> serde_json::Value {
    serde_json::json!({ "command": command, "args": args, "timeout_ms": timeout_ms })
}

fn one_hook(event: &str, h: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "hooks": { event: [h] } })
}

fn signal_fields(status: &str) -> (u64, u64) {
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        u64::from_str_radix(line[name.len()..].trim(), 16).unwrap()
    };
    (field("SigBlk:"), field("SigIgn:"))
}

// ---------------------------------------------------------------- item 1: signals

#[test]
fn under_run_a_hook_starts_with_an_empty_mask_and_sigterm_ends_it() {
    subreaper();
    let out = tempfile::tempdir().unwrap();
    let status = out.path().join("status");
    let m = marker(1);
    let ws = Ws::new(serde_json::json!({ "hooks": {
        "turn_complete": [ hook("/bin/cp", &["/proc/self/status", status.to_str().unwrap()], 5000) ],
        "agent_end": [ hook("/bin/sleep", &["30", &format!("0.{m}")], 60_000) ],
    }}));
    let mut run = ws.run(&[]);
    run.emit("turn_complete", 0);
    wait_for("the status copy", || {
        std::fs::read_to_string(&status).is_ok_and(|s| s.contains("SigBlk"))
    });
    let (blocked, ignored) = signal_fields(&std::fs::read_to_string(&status).unwrap());
    assert_eq!(
        (blocked, ignored),
        (0, 0),
        "SigBlk {blocked:016x} SigIgn {ignored:016x}"
    );
    run.emit("agent_end", 1);
    let mut sleeper = Vec::new();
    wait_for("the sleep hook", || {
        sleeper = procs_with(&format!("0.{m}"));
        !sleeper.is_empty()
    });
    let t = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleeper[0]),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for("SIGTERM to end the hook", || !alive(sleeper[0]));
    assert!(t.elapsed() < Duration::from_secs(10));
    let (ok, stderr) = run.finish();
    assert!(ok, "{stderr}");
    let report = Run::report(&stderr);
    assert_eq!(report["stats"]["shell"]["totals"]["signal"], 1, "{report}");
    assert!(kill_leftovers(&m).is_empty());
}

// ---------------------------------------------------------------- item 5: descriptors

#[test]
fn an_fd_inherited_by_run_does_not_reach_hooks() {
    let out = tempfile::tempdir().unwrap();
    let fds = out.path().join("fds");
    let ws = Ws::new(one_hook(
        "turn_complete",
        hook(
            "/bin/sh",
            &["-c", &format!("exec ls /proc/self/fd > {}", fds.display())],
            5000,
        ),
    ));
    let file = std::fs::File::open("/etc/passwd").unwrap();
    let mut cmd = bin();
    cmd.env("TMPDIR", ws.tmp.path())
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--events", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped());
    {
        use std::os::fd::AsRawFd;
        let raw = file.as_raw_fd();
        // SAFETY: dup2 is async-signal-safe; fd 7 in the child is what a careless parent
        // leaves open (no FD_CLOEXEC).
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::dup2(raw, 7) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let events = stdin_file(&mut child);
    let mut run = Run::new(child, events);
    // `run` really holds fd 7 (the test is about something).
    let link = std::fs::read_link(format!("/proc/{}/fd/7", run.pid())).unwrap();
    assert_eq!(link, Path::new("/etc/passwd"));
    run.emit("turn_complete", 0);
    wait_for("the hook", || fds.exists());
    let (ok, stderr) = run.finish();
    assert!(ok, "{stderr}");
    let listed: Vec<String> = std::fs::read_to_string(&fds)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    // 3 is the directory `ls` itself opened to list.
    assert_eq!(listed, ["0", "1", "2", "3"]);
}

// ---------------------------------------------------------------- item 2: escapes

/// `sh -c 'sleep 321 & exit 0'` ends ok at once; under `run` its background sleep does not
/// outlive a graceful shutdown.
fn background_job_after_exit(cgroup: &str) {
    subreaper();
    let m = marker(if cgroup == "off" { 2 } else { 3 });
    let ws = Ws::new(one_hook(
        "turn_complete",
        hook(
            "/bin/sh",
            &["-c", &format!("sleep 321 0.{m} & exit 0")],
            60_000,
        ),
    ));
    let mut run = ws.run(&["--cgroup", cgroup]);
    run.emit("turn_complete", 0);
    wait_for("the background sleep", || !procs_with(&m).is_empty());
    let (ok, stderr) = run.finish();
    assert!(ok, "{stderr}");
    let report = Run::report(&stderr);
    assert_eq!(report["stats"]["shell"]["totals"]["ok"], 1, "{report}");
    std::thread::sleep(Duration::from_millis(100));
    let left = kill_leftovers(&m);
    assert!(left.is_empty(), "survived run's shutdown: {left:?}");
}

#[test]
fn a_background_job_does_not_outlive_run_without_a_cgroup() {
    background_job_after_exit("off");
}

#[test]
fn a_background_job_does_not_outlive_run_with_a_cgroup() {
    if let Some(why) = no_cgroup() {
        eprintln!("NOT RUN a_background_job_does_not_outlive_run_with_a_cgroup: {why}");
        return;
    }
    background_job_after_exit("auto");
}

/// With `timeout_ms: 500`, `sh -c 'setsid sleep 312 & sleep 100'`: both sleeps die at the
/// timeout, while `run` goes on.
fn setsid_grandchild_at_timeout(cgroup: &str) {
    subreaper();
    let m = marker(if cgroup == "off" { 4 } else { 5 });
    let ws = Ws::new(one_hook(
        "turn_complete",
        hook(
            "/bin/sh",
            &["-c", &format!("setsid sleep 312 0.{m} & sleep 100 0.{m}")],
            500,
        ),
    ));
    let mut run = ws.run(&["--cgroup", cgroup]);
    run.emit("turn_complete", 0);
    let escaper = format!("sleep 312 0.{m}");
    wait_for("the setsid sleep", || !procs_exactly(&escaper).is_empty());
    // Gone well before the run ends.
    let t = Instant::now();
    while !procs_with(&m).is_empty() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<_> = procs_with(&m)
        .into_iter()
        .map(|p| (p, cmdline(p)))
        .collect();
    let (ok, stderr) = run.finish();
    kill_leftovers(&m);
    assert!(left.is_empty(), "survived the timeout: {left:?}");
    assert!(ok, "{stderr}");
    let report = Run::report(&stderr);
    assert_eq!(
        report["stats"]["shell"]["totals"]["timed_out"], 1,
        "{report}"
    );
}

#[test]
fn a_setsid_grandchild_dies_at_the_timeout_without_a_cgroup() {
    setsid_grandchild_at_timeout("off");
}

#[test]
fn a_setsid_grandchild_dies_at_the_timeout_with_a_cgroup() {
    if let Some(why) = no_cgroup() {
        eprintln!("NOT RUN a_setsid_grandchild_dies_at_the_timeout_with_a_cgroup: {why}");
        return;
    }
    setsid_grandchild_at_timeout("auto");
}

/// Why the cgroup tests cannot run here (None: they can). The same detection `run` does.
fn no_cgroup() -> Option<String> {
    prx_hooks::shell::cgroup::detect().err()
}

/// `kill -9` of `run` with hooks running: every hook leader dies with it, and the next start
/// removes the payload files the dead run left.
fn kill_9(cgroup: &str) {
    subreaper();
    let m = marker(if cgroup == "off" { 6 } else { 7 });
    let ws = Ws::new(one_hook(
        "turn_complete",
        serde_json::json!({
            "command": "/bin/sh",
            "args": ["-c", format!("setsid sleep 300 0.{m}9 & exec sleep 300 0.{m}")],
            "timeout_ms": 300_000,
            "max_concurrent": 16,
        }),
    ));
    let mut run = ws.run(&["--cgroup", cgroup]);
    for n in 0..10 {
        run.emit("turn_complete", n);
    }
    let leader = format!("sleep 300 0.{m}");
    let leaders = || procs_exactly(&leader).len();
    wait_for("ten hook leaders", || leaders() >= 10);
    assert!(
        !ws.tmp_entries().is_empty(),
        "payload files exist while hooks run"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = run.child.wait();
    let t = Instant::now();
    while leaders() > 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let survivors = leaders();
    eprintln!(
        "kill -9 of run ({cgroup}): {survivors} of 10 hook leaders alive after {:?}",
        t.elapsed()
    );
    // The next start cleans what the dead run left: its payload directory, and with a
    // cgroup its stale cgroups (the setsid grandchildren in them).
    let grandchildren = procs_with(&format!("0.{m}9")).len();
    let next = ws.run(&["--cgroup", cgroup]);
    wait_for("the stale payload directory to go", || {
        ws.tmp_entries()
            .iter()
            .all(|p| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_none()) || !p.exists())
            && ws.tmp_entries().len() <= 1
    });
    if cgroup != "off" {
        wait_for("the stale cgroup's processes to die", || {
            procs_with(&format!("0.{m}9")).is_empty()
        });
    }
    let (ok, stderr) = next.finish();
    let left = kill_leftovers(&m);
    assert_eq!(survivors, 0, "hook leaders outlived kill -9 of run");
    assert!(ok, "{stderr}");
    assert!(grandchildren <= 10);
    if cgroup != "off" {
        assert!(left.is_empty(), "{left:?}");
    }
    assert!(ws.tmp_entries().is_empty(), "{:?}", ws.tmp_entries());
}

#[test]
fn kill_9_of_run_leaves_no_hook_leader_without_a_cgroup() {
    kill_9("off");
}

#[test]
fn kill_9_of_run_leaves_no_hook_leader_and_the_next_start_kills_stale_cgroups() {
    if let Some(why) = no_cgroup() {
        eprintln!("NOT RUN kill_9_..._stale_cgroups: {why}");
        return;
    }
    kill_9("auto");
}

// ---------------------------------------------------------------- item 12: HOME and PATH

#[test]
fn fire_gives_home_and_inherits_a_filtered_path_on_request() {
    let tools = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let tool = tools.path().join("mytool");
    std::fs::write(
        &tool,
        format!(
            "#!/bin/sh\nprintf '%s\\n%s\\n' \"$HOME\" \"$PATH\" > {}/seen\n",
            out.path().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = Ws::new(serde_json::json!({
        "path": "inherit",
        "hooks": { "turn_complete": [ { "command": "mytool" } ] },
    }));
    let host_path = format!("{}:relative:/usr/bin:/bin", tools.path().display());
    let fire = bin()
        .env("PATH", &host_path)
        .env("HOME", "/home/agent-home")
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path())
        .output()
        .unwrap();
    assert!(fire.status.success(), "{fire:?}");
    let seen = std::fs::read_to_string(out.path().join("seen")).unwrap();
    let mut lines = seen.lines();
    assert_eq!(lines.next(), Some("/home/agent-home"));
    assert_eq!(
        lines.next(),
        Some(format!("{}:/usr/bin:/bin", tools.path().display()).as_str())
    );

    // Without "path": "inherit" the bare name is not found on the safe PATH.
    ws.write(serde_json::json!({
        "hooks": { "turn_complete": [ { "command": "mytool" } ] },
    }));
    let fire = bin()
        .env("PATH", &host_path)
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path())
        .output()
        .unwrap();
    assert!(!fire.status.success());
    let stdout = String::from_utf8_lossy(&fire.stdout);
    assert!(stdout.contains("spawn failed"), "{stdout}");
}

// ---------------------------------------------------------------- item 4: /proc and harden

/// Runs `fire` with a secret in its environment — as `nobody` when we are root (root's hooks
/// could read anything), else as ourselves — and a hook of the same user tries to read its
/// parent's `/proc` files. Returns what the hook saw.
fn read_parent_proc(harden: bool) -> String {
    let out = tempfile::tempdir().unwrap();
    let seen = out.path().join("seen");
    let script = format!(
        "tr '\\0' '\\n' < /proc/$PPID/environ > {0} 2>&1 || echo environ-unreadable >> {0}; \
         cat /proc/$PPID/maps > /dev/null 2>&1 && echo maps-read >> {0} || echo maps-unreadable >> {0}; \
         ls /proc/$PPID/fd > /dev/null 2>&1 && echo fd-listed >> {0} || echo fd-unlisted >> {0}; \
         (: < /proc/$PPID/mem) 2> /dev/null && echo mem-opened >> {0} || echo mem-unopened >> {0}; \
         echo hook-owner=$(stat -c %u /proc/$$/environ) >> {0}",
        seen.display()
    );
    let ws = Ws::new(one_hook(
        "turn_complete",
        hook("/bin/sh", &["-c", &script], 5000),
    ));
    let mut cmd = bin();
    cmd.env("TMPDIR", ws.tmp.path())
        .env("AWS_SECRET_ACCESS_KEY", "hunter7")
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path());
    if nix::unistd::geteuid().is_root() {
        for d in [out.path(), ws.path(), ws.tmp.path()] {
            std::os::unix::fs::chown(d, Some(65534), None).unwrap();
        }
        cmd.uid(65534).gid(65534);
    }
    if harden {
        cmd.arg("--harden");
    }
    let fire = cmd.output().unwrap();
    assert!(fire.status.success(), "{fire:?}");
    std::fs::read_to_string(seen).unwrap()
}

/// The uid hooks of [`read_parent_proc`] run as.
fn hook_uid() -> u32 {
    if nix::unistd::geteuid().is_root() {
        65534
    } else {
        nix::unistd::geteuid().as_raw()
    }
}

#[test]
fn a_hook_of_the_same_user_reads_the_hosts_environ_unless_harden() {
    let owner = format!("hook-owner={}", hook_uid());
    let seen = read_parent_proc(false);
    assert!(
        seen.contains("AWS_SECRET_ACCESS_KEY=hunter7"),
        "docs/hooks.md says this is readable; it was not: {seen}"
    );
    assert!(seen.contains("maps-read"), "{seen}");
    assert!(seen.contains("fd-listed"), "{seen}");
    assert!(seen.contains(&owner), "{seen}");
    let seen = read_parent_proc(true);
    assert!(!seen.contains("hunter7"), "{seen}");
    for denied in [
        "environ-unreadable",
        "maps-unreadable",
        "fd-unlisted",
        // Opening `mem` makes the kernel's ptrace-attach check.
        "mem-unopened",
    ] {
        assert!(seen.contains(denied), "{denied} not in {seen}");
    }
    // The hook itself stays dumpable: its own /proc files are its user's, not root's.
    assert!(seen.contains(&owner), "{seen}");
}

// ---------------------------------------------------------------- acceptance

/// The acceptance run: N hook runs under `run` (`PRX_HOOKS_ACCEPT_RUNS`, default 400; the
/// report's figure is 10,000), 10 % of them timing out with a setsid grandchild and the rest
/// leaving a short background job, leave no process, no fd and no temp file behind.
fn acceptance(cgroup: &str) {
    subreaper();
    let n: u64 = std::env::var("PRX_HOOKS_ACCEPT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let m = marker(if cgroup == "off" { 8 } else { 9 });
    let log = tempfile::tempdir().unwrap();
    let log = log.path().join("log");
    let script = format!(
        "echo $ZERO_HOOK_SEQ >> {log}; case $ZERO_HOOK_SEQ in \
         *0) setsid sleep 60 0.{m}1 & exec sleep 60 0.{m}2;; \
         *) sleep 0.05 0.{m}3 & exit 0;; esac",
        log = log.display()
    );
    let ws = Ws::new(serde_json::json!({ "hooks": { "turn_complete": [ {
        "command": "/bin/sh", "args": ["-c", script], "timeout_ms": 300,
        "max_concurrent": 32,
    } ] } }));
    let mut run = ws.run(&["--cgroup", cgroup]);
    let fd_count = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let quiet = |started: u64| {
        wait_for("the runs to start", || lines(&log).len() as u64 >= started);
        // Every hook and everything it started gone, while `run` still runs.
        let until = Instant::now() + Duration::from_secs(60);
        while !procs_with(&m).is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let started = Instant::now();
    // A first batch, then `run`'s descriptors at rest (its payload directory exists by now).
    let first = n.min(20);
    for seq in 0..first {
        run.emit("turn_complete", seq);
    }
    quiet(first);
    let fds_early = fd_count(run.pid());
    for seq in first..n {
        run.emit("turn_complete", seq);
        // Pace on the hooks (queue 256 per hook): this is about leaks, not drops.
        if seq % 100 == 99 {
            let want = seq.saturating_sub(150) as usize;
            while lines(&log).len() < want {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    quiet(n);
    let alive_before_exit = procs_with(&m).len();
    let run_pid = run.pid();
    let kids = |pid: i32| {
        all_pids()
            .into_iter()
            .filter(|&p| proc_stat(p).is_some_and(|(_, ppid, _)| ppid == pid))
            .count()
    };
    let run_children = kids(run_pid);
    let fds_late = fd_count(run_pid);
    let (ok, stderr) = run.finish();
    let took = started.elapsed();
    let report = Run::report(&stderr);
    let totals = &report["stats"]["shell"]["totals"];
    let left = kill_leftovers(&m);
    let me = std::process::id() as i32;
    let zombies = || -> HashSet<i32> {
        all_pids()
            .into_iter()
            .filter(|&p| proc_stat(p).is_some_and(|(s, ppid, _)| ppid == me && s == 'Z'))
            .collect()
    };
    // Other tests of this binary run beside this one: a child of theirs that just exited is a
    // zombie until they wait for it. A hook orphan reparented to us stays one (nobody here
    // reaps it): only zombies still there after a while count.
    let mut our_zombies = zombies();
    let since = Instant::now();
    while !our_zombies.is_empty() && since.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        our_zombies = zombies().intersection(&our_zombies).copied().collect();
    }
    eprintln!(
        "acceptance ({cgroup}): {n} runs in {took:?}; ok {} timed_out {}; processes alive before exit {alive_before_exit}, \
         children of run {run_children}, fds of run {fds_early} -> {fds_late}, left after exit {}, temp entries {}",
        totals["ok"],
        totals["timed_out"],
        left.len(),
        ws.tmp_entries().len()
    );
    assert!(ok, "{stderr}");
    assert_eq!(totals["timed_out"], n / 10, "{report}");
    assert_eq!(totals["ok"], n - n / 10, "{report}");
    assert_eq!(alive_before_exit, 0);
    assert_eq!(run_children, 0, "zombies or processes under run");
    assert_eq!(fds_late, fds_early, "run's descriptors");
    assert!(left.is_empty(), "{left:?}");
    assert!(our_zombies.is_empty(), "{our_zombies:?}");
    assert!(ws.tmp_entries().is_empty(), "{:?}", ws.tmp_entries());
}

#[test]
fn acceptance_no_leak_under_run_without_a_cgroup() {
    acceptance("off");
}

#[test]
fn acceptance_no_leak_under_run_with_a_cgroup() {
    if let Some(why) = no_cgroup() {
        eprintln!("NOT RUN acceptance_no_leak_under_run_with_a_cgroup: {why}");
        return;
    }
    acceptance("auto");
}

// ---------------------------------------------------------------- item 16: limits

#[test]
fn per_hook_limits_from_hooks_json_and_cli_defaults() {
    let out = tempfile::tempdir().unwrap();
    let probe = |name: &str| {
        format!(
            "echo $(ulimit -t) $(ulimit -n) $(ulimit -c) $(ulimit -f) > {}/{name}",
            out.path().display()
        )
    };
    let ws = Ws::new(serde_json::json!({ "hooks": { "turn_complete": [
        { "id": "own", "command": "/bin/sh", "args": ["-c", probe("own")],
          "limits": { "cpu_seconds": 7, "open_files": 77, "core_bytes": 4096,
                      "file_size_bytes": 1048576 } },
        { "id": "defaults", "command": "/bin/sh", "args": ["-c", probe("defaults")] },
    ] } }));
    let fire = bin()
        .args([
            "fire",
            "turn_complete",
            "--hook-limit",
            "open_files=55",
            "--workspace",
        ])
        .arg(ws.path())
        .output()
        .unwrap();
    assert!(fire.status.success(), "{fire:?}");
    let read = |n: &str| std::fs::read_to_string(out.path().join(n)).unwrap();
    // cpu, files, core (512-byte blocks in dash: 4096 B = 8), file size (1 MiB = 2048).
    assert_eq!(read("own").trim(), "7 77 8 2048");
    // The CLI's defaults: --hook-limit open_files=55, and core_bytes=0 unless told otherwise.
    let d = read("defaults");
    let d: Vec<&str> = d.split_whitespace().collect();
    assert_eq!((d[1], d[2]), ("55", "0"), "{d:?}");

    // A bad --hook-limit is refused before anything runs.
    let bad = bin()
        .args([
            "fire",
            "turn_complete",
            "--hook-limit",
            "address_space=1",
            "--workspace",
        ])
        .arg(ws.path())
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(64),
        "a usage error of fire is EX_USAGE, never 2"
    );
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown limit \"address_space\""));
}

#[test]
fn a_hook_over_its_cpu_seconds_is_killed_with_sigkill() {
    // soft = hard: at the limit the kernel sends SIGKILL straight away (no SIGXCPU first).
    let ws = Ws::new(serde_json::json!({ "hooks": { "turn_complete": [
        { "id": "spin", "command": "/bin/sh", "args": ["-c", "while :; do :; done"],
          "timeout_ms": 30000, "limits": { "cpu_seconds": 1 } },
    ] } }));
    let fire = bin()
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&fire.stdout),
        String::from_utf8_lossy(&fire.stderr)
    );
    assert!(text.contains("signal 9"), "{text}");
}

#[test]
fn limits_are_validated_like_everything_else() {
    let ws = Ws::new(serde_json::json!({ "hooks": { "turn_complete": [
        { "command": "/bin/true", "limits": { "cpu_seconds": 0 } },
        { "command": "/bin/true", "limits": { "adress_space": 1 } },
        { "command": "/bin/true", "limits": { "memory_bytes": 10 } },
        { "command": "/bin/true", "limits": [1] },
    ] } }));
    let v = bin()
        .args(["validate", "--workspace"])
        .arg(ws.path())
        .output()
        .unwrap();
    assert_eq!(v.status.code(), Some(1), "{v:?}");
    let text =
        String::from_utf8_lossy(&v.stdout).into_owned() + &String::from_utf8_lossy(&v.stderr);
    for want in [
        "hooks.turn_complete[0].limits.cpu_seconds",
        "hooks.turn_complete[1].limits.adress_space: unknown field",
        "hooks.turn_complete[2].limits.memory_bytes",
        "hooks.turn_complete[3].limits",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
}

/// memory_bytes / processes need a cgroup with those controllers: without one the hook fails
/// to spawn, saying why, and never runs unlimited.
#[test]
fn cgroup_only_limits_are_refused_where_they_cannot_hold() {
    let out = tempfile::tempdir().unwrap();
    let ran = out.path().join("ran");
    let ws = Ws::new(one_hook(
        "turn_complete",
        serde_json::json!({ "command": "/bin/touch", "args": [ran],
                            "limits": { "memory_bytes": 104857600, "processes": 16 } }),
    ));
    for cgroup in ["off", "auto"] {
        let fire = bin()
            .args(["fire", "turn_complete", "--cgroup", cgroup, "--workspace"])
            .arg(ws.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&fire.stdout);
        let enforced = cgroup == "auto"
            && matches!(prx_hooks::shell::cgroup::detect(), Ok(dir)
                if std::fs::read_to_string(dir.join("cgroup.controllers"))
                    .is_ok_and(|c| c.contains("memory") && c.contains("pids")));
        if enforced {
            assert!(fire.status.success(), "{stdout}");
            continue;
        }
        eprintln!("{cgroup}: {stdout}");
        assert_eq!(fire.status.code(), Some(1), "{stdout}");
        assert!(
            stdout.contains("spawn failed") && stdout.contains("not run"),
            "{stdout}"
        );
        assert!(!ran.exists(), "ran unlimited");
    }
}

#[test]
fn run_reports_the_cgroup_it_uses() {
    let ws = Ws::new(one_hook("turn_complete", hook("/bin/true", &[], 5000)));
    for (flag, want) in [("off", "off"), ("auto", "auto")] {
        let (ok, stderr) = ws.run(&["--cgroup", flag]).finish();
        assert!(ok, "{stderr}");
        let report = Run::report(&stderr);
        let state = &report["stats"]["shell"]["cgroup"]["state"];
        let expected = match (want, no_cgroup()) {
            ("off", _) => "off",
            (_, None) => "active",
            (_, Some(_)) => "unavailable",
        };
        assert_eq!(state, expected, "{report}");
        assert_eq!(report["containment"]["subreaper"], true);
    }
}

#[test]
fn the_builder_can_harden_the_host() {
    let hooks = prx_hooks::Hooks::builder().harden(true).build().unwrap();
    assert!(prx_hooks::shell::supervisor::is_hardened());
    if nix::unistd::geteuid().is_root() {
        // Root (CAP_SYS_PTRACE) is not kept out: a root process reads the hardened environ.
        let cat = Command::new("/bin/cat")
            .arg(format!("/proc/{}/environ", std::process::id()))
            .output()
            .unwrap();
        assert!(cat.status.success(), "{cat:?}");
        assert!(!cat.stdout.is_empty());
    }
    drop(hooks);
    // SAFETY: prctl with integer arguments (dumpable again: other tests read our /proc).
    unsafe { nix::libc::prctl(nix::libc::PR_SET_DUMPABLE, 1 as nix::libc::c_ulong, 0, 0, 0) };
}

#[test]
fn payload_files_go_to_payload_dir_while_hooks_keep_their_tmpdir() {
    let out = tempfile::tempdir().unwrap();
    let payloads = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let seen = out.path().join("seen");
    let ws = Ws::new(serde_json::json!({ "hooks": { "turn_complete": [
        { "id": "where", "command": "/bin/sh",
          "args": ["-c", format!("echo \"$ZERO_HOOK_PAYLOAD_FILE $TMPDIR\" > {}", seen.display())] },
    ] } }));
    let fire = bin()
        .args(["fire", "turn_complete", "--payload-dir"])
        .arg(payloads.path())
        .arg("--workspace")
        .arg(ws.path())
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(fire.status.success(), "{fire:?}");
    let said = std::fs::read_to_string(&seen).unwrap();
    let (file, tmpdir) = said.trim().split_once(' ').unwrap();
    let file = std::path::Path::new(file);
    let dir = file.parent().and_then(|d| d.parent()).unwrap();
    assert_eq!(
        std::fs::canonicalize(dir).unwrap(),
        std::fs::canonicalize(payloads.path()).unwrap(),
        "{said}"
    );
    assert!(
        file.parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("prx-hooks-")),
        "a private directory of its own in --payload-dir: {said}"
    );
    assert_eq!(
        tmpdir,
        tmp.path().to_str().unwrap(),
        "the hook's TMPDIR is the host's"
    );

    // A --payload-dir that is not a directory is refused before anything runs, for fire and run.
    let missing = out.path().join("missing");
    let bad = bin()
        .args(["fire", "turn_complete", "--payload-dir"])
        .arg(&missing)
        .arg("--workspace")
        .arg(ws.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("--payload-dir") && said.contains("missing"),
        "{said}"
    );
    let bad = bin()
        .args(["run", "--payload-dir"])
        .arg(&missing)
        .arg("--workspace")
        .arg(ws.path())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--payload-dir"));

    // A file, and a directory other users may rename entries in (writable by them, no
    // sticky bit), are refused; one with the sticky bit (as /tmp) is taken.
    use std::os::unix::fs::PermissionsExt;
    let file = out.path().join("file");
    std::fs::write(&file, "").unwrap();
    let open = out.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let sticky = out.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let fire_in = |dir: &std::path::Path| {
        bin()
            .args(["fire", "turn_complete", "--payload-dir"])
            .arg(dir)
            .arg("--workspace")
            .arg(ws.path())
            .output()
            .unwrap()
    };
    for (dir, why) in [(&file, "not a directory"), (&open, "other users")] {
        let bad = fire_in(dir);
        assert_eq!(bad.status.code(), Some(64), "{dir:?}: {bad:?}");
        let said = String::from_utf8_lossy(&bad.stderr);
        assert!(
            said.contains("--payload-dir") && said.contains(why),
            "{said}"
        );
    }
    let ok = fire_in(&sticky);
    assert!(ok.status.success(), "{ok:?}");
    let said = std::fs::read_to_string(&seen).unwrap();
    assert!(said.starts_with(sticky.to_str().unwrap()), "{said}");
}
