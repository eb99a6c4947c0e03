//! Shell hooks with real processes and real files (ARCHITECTURE.md § Shell hooks).
//!
//! Every payload channel is checked from inside a real child (`tests/fixtures/record.sh` writes
//! what it received). The tests build their `HookTable`s directly, with absolute program paths,
//! and feed `ShellSink` through `Sink::deliver` (the pipeline's path) or `run_once`.
//!
//! This binary makes itself a child subreaper: the timeout and grandchild tests leave orphans
//! (a killed or backgrounded `sleep`), and this machine's PID 1 does not reap orphans. As their
//! new parent the test reaps exactly those pids (never `waitpid(-1)`), so no run leaves zombies
//! behind. Whole-process leak checks (zombies, fds, temp files) live in `tests/shell_leaks.rs`,
//! which runs alone.

use prx_hooks::config::{Action, HookTable, Matcher};
use prx_hooks::shell::{
    HookCounts, MAX_ENV_PAYLOAD, Outcome, OutcomeKind, Rlimits, SANITIZED_PATH, ShellLimits,
    ShellSink, ShellStats, event_message,
};
use prx_hooks::{Event, EventKind, Message, Sink};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant, SystemTime};

use crate::procs;
use procs::{alive, all_pids, proc_stat, procs_exactly};

// ---------------------------------------------------------------- helpers

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
    });
}

/// The one place tests build an `Action` (the model may grow fields).
fn action(id: &str, event: EventKind, program: &str, args: &[&str], cwd: &Path) -> Action {
    Action {
        id: id.into(),
        id_explicit: true,
        event,
        index: 0,
        command: program.into(),
        program: Ok(program.into()),
        args: args.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cwd: cwd.to_path_buf(),
        timeout: Duration::from_secs(20),
        timeout_explicit: true,
        stdin_json: false,
        enabled: true,
        matcher: None,
        max_concurrent: 8,
        limits: Default::default(),
    }
}

fn sh(id: &str, event: EventKind, script: &str, cwd: &Path) -> Action {
    action(id, event, "/bin/sh", &["-c", script], cwd)
}

fn table(actions: Vec<Action>) -> Arc<HookTable> {
    Arc::new(HookTable {
        enabled: true,
        env_passthrough: Vec::new(),
        actions: actions.into_iter().map(Arc::new).collect(),
        source: None,
        warnings: Vec::new(),
        path: None,
    })
}

/// A workspace and a private payload directory per test (so "no temp file left" is exact).
struct Env {
    ws: tempfile::TempDir,
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            ws: tempfile::tempdir().unwrap(),
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn ws(&self) -> &Path {
        self.ws.path()
    }

    fn limits(&self) -> ShellLimits {
        ShellLimits {
            tmp_dir: Some(self.tmp.path().to_path_buf()),
            ..ShellLimits::default()
        }
    }

    fn sink(&self, limits: ShellLimits) -> ShellSink {
        ShellSink::standalone(self.ws().to_path_buf(), limits)
    }

    fn dir(&self, name: &str) -> PathBuf {
        let d = self.ws().join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Payload files left in the payload directory, or in the sink's private directory inside
    /// it (not counting that directory's `.lock`, which lives as long as the sink).
    fn tmp_files(&self) -> Vec<String> {
        fn walk(dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), out);
                } else if e.file_name() != ".lock" {
                    out.push(e.path().display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(self.tmp.path(), &mut out);
        out
    }
}

fn tool_call(tool: &str, output: &str, seq: u64) -> Message {
    event_message(
        &Event::ToolCall {
            tool,
            success: true,
            output,
        },
        "agent-x",
        "sess-y",
        seq,
    )
}

fn turn(seq: u64) -> Message {
    event_message(&Event::TurnComplete, "agent-x", "sess-y", seq)
}

fn check_balanced(st: &ShellStats) {
    assert!(st.totals.balanced(), "totals unbalanced: {:?}", st.totals);
    for (id, c) in &st.hooks {
        assert!(c.balanced(), "{id} unbalanced: {c:?}");
    }
}

/// Waits until nothing is queued or running, checking the identity at every look.
fn settle(sink: &ShellSink) -> ShellStats {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let st = sink.stats();
        check_balanced(&st);
        assert!(st.totals.sink_counts().balanced());
        if st.totals.running + st.totals.queued + st.direct_running == 0 {
            return st;
        }
        assert!(Instant::now() < until, "did not settle: {:?}", st.totals);
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_env(dir: &Path) -> HashMap<String, String> {
    let raw = std::fs::read(dir.join("env")).unwrap();
    raw.split(|&b| b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let e = String::from_utf8_lossy(e);
            let (k, v) = e.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

fn group_members(pgid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| proc_stat(p).is_some_and(|(_, _, g)| g == pgid))
        .collect()
}

/// The pid of our child whose command line contains `marker`.
fn find_child(marker: &str) -> Option<i32> {
    let me = std::process::id() as i32;
    all_pids().into_iter().find(|&p| {
        proc_stat(p).is_some_and(|(_, ppid, _)| ppid == me)
            && std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
    })
}

/// Kills and reaps (by pid) what a hook left behind that became our child (subreaper).
fn reap_orphans(pids: &[i32]) {
    let me = std::process::id() as i32;
    for &p in pids {
        if proc_stat(p).is_some_and(|(_, ppid, _)| ppid == me) {
            let pid = nix::unistd::Pid::from_raw(p);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
        }
    }
}

/// The hook's leader was reaped: it is not our zombie.
fn assert_reaped(pid: u32) {
    let me = std::process::id() as i32;
    assert!(
        !proc_stat(pid as i32).is_some_and(|(s, ppid, _)| s == 'Z' && ppid == me),
        "hook process {pid} is our zombie"
    );
}

fn only_run(sink: &ShellSink, id: &str) -> Outcome {
    let runs = sink.runs(id);
    assert_eq!(runs.len(), 1, "{id}: {runs:?}");
    runs.into_iter().next().unwrap()
}

fn record(id: &str, event: EventKind, out: &Path, cwd: &Path) -> Action {
    action(
        id,
        event,
        "/bin/sh",
        &[&fixture("record.sh"), out.to_str().unwrap()],
        cwd,
    )
}

// ---------------------------------------------------------------- payload channels

#[test]
fn every_payload_channel_and_the_metadata_reach_the_child() {
    let e = Env::new();
    let out = e.dir("out");
    let cwd = e.dir("logs");
    let mut a = record("rec", EventKind::ToolCall, &out, &cwd);
    a.stdin_json = true;
    a.env = vec![
        ("READ_STDIN".into(), "1".into()),
        ("LEVEL".into(), "info".into()),
    ];
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![a]));
    let msg = tool_call("shell", "total 48\n\"quoted\" \\ é", 41);
    let json = msg.json_str().to_string();
    sink.deliver(&msg);
    drop(msg);
    let st = settle(&sink);
    let o = only_run(&sink, "rec");
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    assert_eq!(st.hooks["rec"].ok, 1);

    let env = read_env(&out);
    assert_eq!(env["ZERO_HOOK_EVENT"], "tool_call");
    assert_eq!(env["ZERO_HOOK_SESSION"], "sess-y");
    assert_eq!(env["ZERO_HOOK_AGENT"], "agent-x");
    assert_eq!(env["ZERO_HOOK_SEQ"], "41");
    assert_eq!(env["ZERO_HOOK_ID"], "rec");
    let ts = &env["ZERO_HOOK_TIMESTAMP"];
    assert!(ts.ends_with('Z'), "UTC: {ts}");
    let t = humantime::parse_rfc3339(ts).unwrap_or_else(|e| panic!("{ts}: {e}"));
    let age = SystemTime::now().duration_since(t).unwrap();
    assert!(age < Duration::from_secs(60), "{ts}");
    assert_eq!(env["ZERO_HOOK_PAYLOAD"], json);
    assert!(!env.contains_key("ZERO_HOOK_PAYLOAD_TRUNCATED"));
    assert_eq!(read(out.join("payload")), json);
    assert_eq!(env["LEVEL"], "info");
    assert_eq!(env["PATH"], SANITIZED_PATH);

    // The payload file: the whole JSON, 0600, in the sink's private directory in our TMPDIR,
    // gone once the hook has exited.
    assert_eq!(read(out.join("file")), json);
    assert_eq!(read(out.join("file_mode")).trim(), "600");
    let file = PathBuf::from(read(out.join("file_path")));
    assert_eq!(file.parent().unwrap().parent().unwrap(), e.tmp.path());
    assert_eq!(env["ZERO_HOOK_PAYLOAD_FILE"], file.to_str().unwrap());
    assert!(!file.exists(), "payload file left behind");
    assert!(e.tmp_files().is_empty());

    assert_eq!(read(out.join("stdin")), json);
    assert_eq!(
        Path::new(read(out.join("cwd")).trim()),
        cwd.canonicalize().unwrap()
    );
    assert_reaped(o.pid.unwrap());
}

#[test]
fn payloads_above_8_kib_leave_the_env_but_arrive_whole_in_the_file_and_on_stdin() {
    let e = Env::new();
    let base = tool_call("t", "", 0).json_str().len();
    let sink = e.sink(e.limits());
    for (name, len) in [
        ("at_limit", MAX_ENV_PAYLOAD),
        ("above", MAX_ENV_PAYLOAD + 1),
        ("big", 20_000),
    ] {
        let out = e.dir(name);
        let mut a = record(name, EventKind::ToolCall, &out, e.ws());
        a.stdin_json = true;
        a.env = vec![("READ_STDIN".into(), "1".into())];
        sink.set_table(table(vec![a]));
        let msg = tool_call("t", &"x".repeat(len - base), 1);
        assert_eq!(msg.json().len(), len);
        let o = sink.run_once(&sink.table().actions[0], &msg);
        assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
        let env = read_env(&out);
        if len <= MAX_ENV_PAYLOAD {
            assert_eq!(env["ZERO_HOOK_PAYLOAD"], msg.json_str(), "{name}");
            assert!(!env.contains_key("ZERO_HOOK_PAYLOAD_TRUNCATED"), "{name}");
        } else {
            assert!(!env.contains_key("ZERO_HOOK_PAYLOAD"), "{name}: unset");
            assert!(!out.join("payload").exists(), "{name}: unset, not empty");
            assert_eq!(env["ZERO_HOOK_PAYLOAD_TRUNCATED"], "1", "{name}");
        }
        assert_eq!(read(out.join("file")), msg.json_str(), "{name}");
        assert_eq!(read(out.join("stdin")), msg.json_str(), "{name}");
    }
    assert!(e.tmp_files().is_empty());
}

#[test]
fn an_events_hooks_share_one_payload_file_removed_after_the_last_exits() {
    let e = Env::new();
    let (o1, o2) = (e.dir("one"), e.dir("two"));
    let first = record("first", EventKind::TurnComplete, &o1, e.ws());
    // The second reads the file well after the first has exited.
    let second = sh(
        "second",
        EventKind::TurnComplete,
        &format!(
            "sleep 0.3; exec /bin/sh {} {}",
            fixture("record.sh"),
            o2.display()
        ),
        e.ws(),
    );
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![first, second]));
    sink.deliver(&turn(3));
    wait_for("the first hook", Duration::from_secs(10), || {
        sink.stats().hooks["first"].ok == 1
    });
    let path = PathBuf::from(read(o1.join("file_path")));
    assert!(path.exists(), "removed while the second hook still runs");
    settle(&sink);
    assert_eq!(read(o2.join("file_path")), path.to_str().unwrap(), "shared");
    assert_eq!(read(o2.join("file")), "{}");
    assert!(!path.exists());
    assert!(e.tmp_files().is_empty());
}

#[test]
fn cwd_defaults_to_the_actions_directory_and_a_missing_one_fails_the_spawn() {
    let e = Env::new();
    let out = e.dir("out");
    let sink = e.sink(e.limits());
    let a = record("ws", EventKind::TurnComplete, &out, e.ws());
    let o = sink.run_once(&a, &turn(0));
    assert_eq!(o.kind, OutcomeKind::Ok);
    assert_eq!(
        Path::new(read(out.join("cwd")).trim()),
        e.ws().canonicalize().unwrap()
    );
    let b = record("gone", EventKind::TurnComplete, &out, &e.ws().join("nope"));
    let o = sink.run_once(&b, &turn(0));
    assert!(matches!(o.kind, OutcomeKind::SpawnFailed { .. }), "{o}");
}

// ---------------------------------------------------------------- environment

/// Runs in a child copy of this test binary (see `the_environment_is_sanitized`) whose own
/// environment holds secrets and loader variables; a no-op in a normal run.
#[test]
fn env_probe() {
    let Some(out) = std::env::var_os("PRX_SHELL_PROBE_OUT") else {
        return;
    };
    let out = PathBuf::from(out);
    let ws = out.parent().unwrap().to_path_buf();
    let mut a = record("probe", EventKind::ToolCall, &out, &ws);
    a.env = vec![
        ("LEVEL".into(), "info".into()),
        // Refused by the loader; refused again at spawn.
        ("PATH".into(), "/evil".into()),
        ("zero_hook_event".into(), "evil".into()),
        ("LD_PRELOAD".into(), "/evil.so".into()),
        ("LD_AUDIT".into(), "/evil-audit.so".into()),
        ("GCONV_PATH".into(), "/evil-gconv".into()),
        ("HOME".into(), "/set-by-the-table".into()),
        // The author chooses the command: interpreter variables may be set in `env`.
        ("BASH_ENV".into(), "/set-by-author".into()),
    ];
    let mut t = (*table(vec![a])).clone();
    t.env_passthrough = vec![
        "MY_PASS".into(),
        "HOME".into(),
        "LD_PRELOAD".into(),
        "PATH".into(),
        "NOT_SET_ANYWHERE".into(),
        // Refused from the agent (a table built by hand bypasses the loader).
        "PYTHONSTARTUP".into(),
        "NLSPATH".into(),
    ];
    let sink = ShellSink::standalone(ws, ShellLimits::default());
    sink.set_table(Arc::new(t));
    sink.deliver(&tool_call("shell", "ok", 0));
    let st = settle(&sink);
    assert_eq!(st.hooks["probe"].ok, 1, "{:?}", sink.runs("probe"));
}

/// Runs `env_probe` in a child copy of this binary with `vars` as its whole environment and
/// returns what the hook's environment was.
fn probe_env(e: &Env, name: &str, vars: &[(&str, &str)]) -> HashMap<String, String> {
    let out = e.dir(name);
    let probe = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "shell::env_probe",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env_clear()
        .env("PRX_SHELL_PROBE_OUT", &out)
        .env("TMPDIR", e.tmp.path())
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    assert!(
        probe.status.success(),
        "the probe failed: {}\n{}{}",
        probe.status,
        String::from_utf8_lossy(&probe.stdout),
        String::from_utf8_lossy(&probe.stderr)
    );
    let raw = std::fs::read(out.join("env")).unwrap();
    for secret in [
        "hunter2",
        "hunter3",
        "hunter4",
        "/opt/evil",
        "evil",
        "/x.dylib",
    ] {
        assert!(
            !String::from_utf8_lossy(&raw).contains(secret),
            "{secret} leaked"
        );
    }
    read_env(&out)
}

#[test]
fn the_environment_is_sanitized() {
    let e = Env::new();
    let env = probe_env(
        &e,
        "probe",
        &[
            ("PRX_TEST_SECRET", "hunter2"),
            ("AWS_SECRET_ACCESS_KEY", "hunter3"),
            ("LC_GITHUB_TOKEN", "hunter4"),
            ("LD_LIBRARY_PATH", "/nonexistent-prx-test"),
            ("DYLD_INSERT_LIBRARIES", "/x.dylib"),
            ("PYTHONSTARTUP", "/opt/evil/startup.py"),
            ("NLSPATH", "/opt/evil/%N"),
            ("HOME", "/home/agent"),
            ("PATH", "/opt/evil/bin:/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_TIME", "C"),
            ("LC_ALL", "C.UTF-8"),
            ("TZ", "UTC"),
            ("TERM", "xterm"),
            ("USER", "agent"),
            ("LOGNAME", "agent"),
            ("MY_PASS", "passed"),
        ],
    );
    let mut names: Vec<&str> = env.keys().map(String::as_str).collect();
    names.sort();
    let expected = [
        "BASH_ENV",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_TIME",
        "LEVEL",
        "LOGNAME",
        "MY_PASS",
        "PATH",
        "TERM",
        "TMPDIR",
        "TZ",
        "USER",
        "ZERO_HOOK_AGENT",
        "ZERO_HOOK_EVENT",
        "ZERO_HOOK_ID",
        "ZERO_HOOK_PAYLOAD",
        "ZERO_HOOK_PAYLOAD_FILE",
        "ZERO_HOOK_SEQ",
        "ZERO_HOOK_SESSION",
        "ZERO_HOOK_TIMESTAMP",
    ];
    // What /bin/sh itself may export to `env`.
    let shell_own = ["PWD", "OLDPWD", "SHLVL", "_"];
    let extra: Vec<&&str> = names
        .iter()
        .filter(|n| !expected.contains(n) && !shell_own.contains(n))
        .collect();
    assert!(
        extra.is_empty(),
        "unexpected variables reached the hook: {extra:?}"
    );
    for n in expected {
        assert!(env.contains_key(n), "{n} missing: {names:?}");
    }
    assert_eq!(env["PATH"], SANITIZED_PATH);
    assert_eq!(env["MY_PASS"], "passed");
    assert_eq!(env["LANG"], "C.UTF-8");
    assert_eq!(env["LEVEL"], "info");
    assert_eq!(env["BASH_ENV"], "/set-by-author");
    assert_eq!(env["HOME"], "/home/agent", "the host's HOME");
    assert_eq!(env["TMPDIR"], e.tmp.path().to_str().unwrap());
    assert_eq!(env["ZERO_HOOK_EVENT"], "tool_call");

    // HOME that is not an absolute path (or unset): the passwd entry's.
    let home = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap()
        .dir;
    for (name, vars) in [
        ("relative", &[("HOME", "relative/home")][..]),
        ("unset", &[][..]),
    ] {
        let env = probe_env(&e, name, vars);
        assert_eq!(Path::new(&env["HOME"]), home, "{name}");
    }
}

// ---------------------------------------------------------------- processes

#[test]
fn a_timeout_kills_the_whole_process_group() {
    subreaper();
    let e = Env::new();
    let marker = format!("prx-timeout-{}", std::process::id());
    let mut a = action(
        "slow",
        EventKind::TurnComplete,
        "/bin/sh",
        &["-c", "sleep 30 & sleep 30", &marker],
        e.ws(),
    );
    a.timeout = Duration::from_millis(200);
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![a.clone()]));
    let start = Instant::now();
    sink.deliver(&turn(0));

    let mut leader = None;
    wait_for("the hook to start", Duration::from_secs(5), || {
        leader = find_child(&marker);
        leader.is_some()
    });
    let leader = leader.unwrap();
    let mut members = Vec::new();
    wait_for("both sleeps", Duration::from_secs(5), || {
        members = group_members(leader);
        members.len() >= 2 || sink.stats().totals.timed_out == 1
    });
    assert!(members.len() >= 2, "the group: {members:?}");

    let st = settle(&sink);
    assert_eq!(st.hooks["slow"].timed_out, 1);
    let o = only_run(&sink, "slow");
    assert_eq!(o.kind, OutcomeKind::TimedOut { after_ms: 200 });
    assert!(o.to_string().contains("timed out after 200 ms"), "{o}");
    assert!(start.elapsed() < Duration::from_secs(2), "10× the timeout");
    wait_for("every sleep to die", Duration::from_secs(2), || {
        members.iter().all(|&p| !alive(p))
    });
    assert_reaped(o.pid.unwrap());
    reap_orphans(&members);
    assert!(e.tmp_files().is_empty(), "{:?}", e.tmp_files());

    // The same through run_once.
    let marker2 = format!("{marker}-once");
    a.args[2] = marker2.clone();
    let started = Instant::now();
    let o = sink.run_once(&a, &turn(1));
    assert_eq!(o.kind, OutcomeKind::TimedOut { after_ms: 200 });
    assert!(started.elapsed() < Duration::from_secs(2));
    let pid = o.pid.unwrap() as i32;
    let left = group_members(pid);
    wait_for("run_once's group to die", Duration::from_secs(2), || {
        left.iter().all(|&p| !alive(p))
    });
    reap_orphans(&left);
    assert!(e.tmp_files().is_empty());
}

#[test]
fn a_child_that_never_reads_a_1_mib_stdin_payload_blocks_nothing() {
    let e = Env::new();
    let out = e.dir("out");
    let mut hooks = vec![
        // Never reads, exits on its own.
        sh("sleeper", EventKind::ToolCall, "sleep 0.2", e.ws()),
        // Closes stdin at once.
        sh(
            "closer",
            EventKind::ToolCall,
            "exec 0<&-; sleep 0.1",
            e.ws(),
        ),
        // Reads a little, then exits: our writer gets EPIPE.
        sh(
            "partial",
            EventKind::ToolCall,
            "head -c 100 >/dev/null",
            e.ws(),
        ),
        // Reads everything.
        sh(
            "reader",
            EventKind::ToolCall,
            &format!("wc -c > {}/count", out.display()),
            e.ws(),
        ),
    ];
    // Never reads and never exits: only its timeout ends it.
    let mut stuck = sh("stuck", EventKind::ToolCall, "exec sleep 30", e.ws());
    stuck.timeout = Duration::from_millis(300);
    hooks.push(stuck);
    for h in &mut hooks {
        h.stdin_json = true;
    }
    let sink = e.sink(e.limits());
    sink.set_table(table(hooks));
    let msg = tool_call("shell", &"y".repeat(1 << 20), 0);
    let len = msg.json().len();
    let t = Instant::now();
    sink.deliver(&msg);
    sink.deliver(&msg);
    assert!(t.elapsed() < Duration::from_secs(1), "deliver blocked");
    drop(msg);
    let st = settle(&sink);
    for id in ["sleeper", "closer", "partial", "reader"] {
        assert_eq!(st.hooks[id].ok, 2, "{id}: {:?}", sink.runs(id));
    }
    assert_eq!(st.hooks["stuck"].timed_out, 2);
    assert_eq!(read(out.join("count")).trim(), len.to_string());
    assert!(e.tmp_files().is_empty());
}

#[test]
fn a_grandchild_holding_stderr_open_does_not_delay_completion() {
    subreaper();
    let e = Env::new();
    let marker = format!("prx-grandchild-{}", std::process::id());
    let a = action(
        "bg",
        EventKind::TurnComplete,
        "/bin/sh",
        &[
            "-c",
            "echo starting >&2; (sleep 20; echo late >&2) & echo leader-done >&2; exit 0",
            &marker,
        ],
        e.ws(),
    );
    let sink = e.sink(e.limits());
    let t = Instant::now();
    let o = sink.run_once(&a, &turn(0));
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    assert!(t.elapsed() < Duration::from_secs(5), "waited on pipe EOF");
    assert!(o.stderr_tail.contains("leader-done"), "{:?}", o.stderr_tail);
    // The background job was left alone (it is still running) …
    let left: Vec<i32> = group_members(o.pid.unwrap() as i32)
        .into_iter()
        .filter(|&p| alive(p))
        .collect();
    assert!(!left.is_empty(), "the background job must be left alone");
    // … and we clean it up ourselves.
    for &p in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait_for("the background job", Duration::from_secs(2), || {
        left.iter().all(|&p| !alive(p))
    });
    reap_orphans(&left);
    // Also through the queue.
    sink.set_table(table(vec![a]));
    sink.deliver(&turn(1));
    let st = settle(&sink);
    assert_eq!(st.hooks["bg"].ok, 1);
    let pid = sink.runs("bg")[0].pid.unwrap() as i32;
    let left = group_members(pid);
    reap_orphans(&left);
}

#[test]
fn a_child_flooding_stderr_starves_nothing() {
    let e = Env::new();
    let mut flood = sh(
        "flood",
        EventKind::TurnComplete,
        "exec cat /dev/zero >&2",
        e.ws(),
    );
    flood.timeout = Duration::from_millis(800);
    let mut other = sh("other", EventKind::TurnComplete, "exec sleep 30", e.ws());
    other.timeout = Duration::from_millis(200);
    let quick = action("quick", EventKind::TurnComplete, "/bin/true", &[], e.ws());
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![flood, other, quick]));
    sink.deliver(&turn(0));
    let st = settle(&sink);
    assert_eq!(st.hooks["flood"].timed_out, 1);
    assert_eq!(st.hooks["quick"].ok, 1);
    let o = only_run(&sink, "other");
    assert_eq!(o.kind, OutcomeKind::TimedOut { after_ms: 200 });
    assert!(o.duration < Duration::from_secs(2), "starved: {o}");
    let f = only_run(&sink, "flood");
    assert_eq!(f.stderr_tail.len(), prx_hooks::shell::STDERR_TAIL);
    assert!(f.stderr_tail.bytes().all(|b| b == 0));
}

#[test]
fn outcomes_are_distinct_and_counted() {
    let e = Env::new();
    let w = e.ws();
    let mut missing = action("missing", EventKind::TurnComplete, "nope", &[], w);
    missing.program = Err("\"nope\" not found on PATH /usr/local/bin:/usr/bin:/bin".into());
    let mut timeout = sh("timeout", EventKind::TurnComplete, "exec sleep 10", w);
    timeout.timeout = Duration::from_millis(100);
    let hooks = vec![
        action("ok", EventKind::TurnComplete, "/bin/true", &[], w),
        sh("exit3", EventKind::TurnComplete, "echo boom >&2; exit 3", w),
        sh("sig9", EventKind::TurnComplete, "kill -9 $$", w),
        missing,
        action(
            "enoent",
            EventKind::TurnComplete,
            "/nonexistent/prog",
            &[],
            w,
        ),
        timeout,
    ];
    let sink = e.sink(e.limits());
    sink.set_table(table(hooks));
    sink.deliver(&turn(0));
    let st = settle(&sink);
    let one = |id: &str| only_run(&sink, id);
    assert_eq!(one("ok").kind, OutcomeKind::Ok);
    assert_eq!(one("exit3").kind, OutcomeKind::Exit { code: 3 });
    assert_eq!(one("sig9").kind, OutcomeKind::Signal { signal: 9 });
    assert!(matches!(
        one("missing").kind,
        OutcomeKind::SpawnFailed { .. }
    ));
    assert!(matches!(
        one("enoent").kind,
        OutcomeKind::SpawnFailed { .. }
    ));
    assert_eq!(one("timeout").kind, OutcomeKind::TimedOut { after_ms: 100 });

    let line = one("exit3").to_string();
    assert!(
        line.starts_with("hook exit3 turn_complete: exit 3 ("),
        "{line}"
    );
    assert!(line.contains("stderr: \"boom\""), "{line}");
    assert!(
        one("ok")
            .to_string()
            .starts_with("hook ok turn_complete: ok (")
    );
    assert!(one("sig9").to_string().contains(": signal 9"));
    let l = one("missing").to_string();
    assert!(
        l.starts_with("hook missing turn_complete: spawn failed: \"nope\" not found"),
        "{l}"
    );
    let l = one("enoent").to_string();
    assert!(
        l.contains("spawn failed: /nonexistent/prog: No such file"),
        "{l}"
    );

    let c = |id: &str| st.hooks[id];
    assert_eq!((c("ok").ok, c("ok").sent), (1, 1));
    assert_eq!(c("exit3").exit, 1);
    assert_eq!(c("sig9").signal, 1);
    assert_eq!(c("missing").spawn_failed, 1);
    assert_eq!(c("enoent").spawn_failed, 1);
    assert_eq!(c("timeout").timed_out, 1);
    let t = st.totals;
    assert_eq!(
        (t.sent, t.ok, t.exit, t.signal, t.spawn_failed, t.timed_out),
        (6, 1, 1, 1, 2, 1)
    );
    let s = sink.counts();
    assert_eq!(
        (s.sent, s.delivered, s.failed, s.dropped, s.in_flight),
        (6, 1, 5, 0, 0)
    );
    assert!(e.tmp_files().is_empty());
}

#[test]
fn disabled_hooks_and_matchers_are_skipped_not_sent() {
    let e = Env::new();
    let w = e.ws();
    let mut disabled = action("disabled", EventKind::ToolCall, "/bin/true", &[], w);
    disabled.enabled = false;
    let mut glob = action("glob", EventKind::ToolCall, "/bin/true", &[], w);
    glob.matcher = Some(Matcher::Glob("mcp__*".into()));
    let mut re = action("re", EventKind::ToolCall, "/bin/true", &[], w);
    re.matcher = Some(Matcher::Regex(regex::Regex::new("^sh").unwrap()));
    let all = action("all", EventKind::ToolCall, "/bin/true", &[], w);
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![disabled, glob, re, all]));
    sink.deliver(&tool_call("shell", "", 0));
    sink.deliver(&tool_call("mcp__github__create", "", 1));
    let st = settle(&sink);
    let c = |id: &str| st.hooks[id];
    assert_eq!((c("disabled").skipped, c("disabled").sent), (2, 0));
    assert_eq!((c("glob").skipped, c("glob").ok), (1, 1));
    assert_eq!((c("re").skipped, c("re").ok), (1, 1));
    assert_eq!((c("all").skipped, c("all").ok), (0, 2));
    assert_eq!((st.totals.skipped, st.totals.sent), (4, 4));

    // fire: every hook once, disabled ones listed as skipped; run_once runs a disabled hook.
    let outs = sink.run_matching(&tool_call("shell", "", 2));
    let kinds: Vec<String> = outs.iter().map(|o| o.kind.to_string()).collect();
    assert_eq!(
        kinds,
        [
            "skipped (disabled)",
            "skipped (matcher \"mcp__*\" does not match tool \"shell\")",
            "ok",
            "ok"
        ],
        "{outs:?}"
    );
    let table = sink.table();
    assert_eq!(
        sink.run_once(&table.actions[0], &turn(0)).kind,
        OutcomeKind::Ok
    );
    assert_eq!(
        sink.stats().totals,
        st.totals,
        "direct runs are not counted"
    );

    // A disabled table skips everything.
    let mut off = (*table).clone();
    off.enabled = false;
    sink.set_table(Arc::new(off));
    sink.deliver(&tool_call("shell", "", 3));
    let st = settle(&sink);
    assert_eq!((st.totals.skipped, st.totals.sent), (8, 4));
}

#[test]
fn queue_overflow_is_dropped_and_counted_per_hook() {
    let e = Env::new();
    // Holds its slot until the burst is over, however slowly this machine runs the test.
    let gate = e.ws().join("gate");
    let mut slow = sh(
        "slow",
        EventKind::TurnComplete,
        &format!("while [ ! -e {} ]; do sleep 0.01; done", gate.display()),
        e.ws(),
    );
    slow.max_concurrent = 1;
    let fast = action("fast", EventKind::TurnComplete, "/bin/true", &[], e.ws());
    let sink = e.sink(ShellLimits {
        queue_per_action: 4,
        ..e.limits()
    });
    sink.set_table(table(vec![slow, fast]));
    for seq in 0..20 {
        sink.deliver(&turn(seq));
        check_balanced(&sink.stats());
    }
    std::fs::write(&gate, "").unwrap();
    let st = settle(&sink);
    let slow = st.hooks["slow"];
    assert_eq!(slow.sent, 20);
    // At most one running and four queued while the burst lasts.
    assert!((15..=16).contains(&slow.dropped), "{slow:?}");
    assert_eq!(slow.ok + slow.dropped, 20);
    let fast = st.hooks["fast"];
    assert_eq!(fast.sent, 20);
    assert_eq!(fast.ok + fast.dropped, 20);
    assert_eq!(st.totals.dropped, slow.dropped + fast.dropped);
    assert_eq!(sink.counts().dropped, st.totals.dropped);
    assert!(e.tmp_files().is_empty());
}

#[test]
fn processes_start_in_delivery_order() {
    let e = Env::new();
    let log = e.ws().join("order");
    let mut a = sh(
        "order",
        EventKind::TurnComplete,
        &format!("echo $ZERO_HOOK_SEQ >> {}", log.display()),
        e.ws(),
    );
    a.max_concurrent = 1;
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![a]));
    for seq in 0..40 {
        sink.deliver(&turn(seq));
    }
    let st = settle(&sink);
    assert_eq!(st.hooks["order"].ok, 40);
    let seen: Vec<u64> = read(&log).lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
}

#[test]
fn counts_balance_at_every_moment() {
    let e = Env::new();
    let w = e.ws();
    let mut t = sh("t", EventKind::TurnComplete, "exec sleep 5", w);
    t.timeout = Duration::from_millis(50);
    let hooks = vec![
        action("a", EventKind::TurnComplete, "/bin/true", &[], w),
        action("b", EventKind::TurnComplete, "/bin/false", &[], w),
        t,
    ];
    let sink = Arc::new(e.sink(ShellLimits {
        max_running: 6,
        queue_per_action: 16,
        ..e.limits()
    }));
    sink.set_table(table(hooks));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (sink, done) = (sink.clone(), done.clone());
        std::thread::spawn(move || {
            let mut looks = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let st = sink.stats();
                check_balanced(&st);
                assert!(sink.counts().balanced());
                // max_running caps the shared slots; each hook has one of its own.
                assert!(st.shared_running <= 6, "global limit: {st:?}");
                assert!(st.totals.running <= 6 + 3, "global limit: {:?}", st.totals);
                looks += 1;
                std::thread::yield_now();
            }
            looks
        })
    };
    for seq in 0..150 {
        sink.deliver(&turn(seq));
        if seq % 10 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let st = settle(&sink);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(watcher.join().unwrap() > 0);
    let sum = |f: fn(&HookCounts) -> u64| st.hooks.values().map(f).sum::<u64>();
    assert_eq!(st.totals.sent, 450);
    assert_eq!(sum(|c| c.sent), 450);
    assert_eq!(st.hooks["a"].exit + st.hooks["a"].signal, 0);
    assert_eq!(
        st.hooks["b"].exit,
        st.hooks["b"].sent - st.hooks["b"].dropped
    );
    assert_eq!(
        st.hooks["t"].timed_out,
        st.hooks["t"].sent - st.hooks["t"].dropped
    );
}

#[test]
fn shutdown_drains_within_the_deadline_then_kills_and_cancels() {
    let e = Env::new();
    // Finishes well within the deadline.
    let quick = sh("quick", EventKind::TurnComplete, "sleep 0.1", e.ws());
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![quick]));
    for seq in 0..3 {
        sink.deliver(&turn(seq));
    }
    sink.shutdown(Instant::now() + Duration::from_secs(10));
    let st = sink.stats();
    assert_eq!(
        (st.totals.ok, st.totals.killed, st.totals.cancelled),
        (3, 0, 0)
    );

    // Cannot finish: two run (max_concurrent), three wait.
    let e = Env::new();
    let mut long = sh("long", EventKind::TurnComplete, "exec sleep 30", e.ws());
    long.max_concurrent = 2;
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![long]));
    for seq in 0..5 {
        sink.deliver(&turn(seq));
    }
    wait_for("two running", Duration::from_secs(5), || {
        sink.stats().totals.running == 2
    });
    let t = Instant::now();
    sink.shutdown(Instant::now() + Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(5));
    let st = sink.stats();
    check_balanced(&st);
    let c = st.hooks["long"];
    assert_eq!(
        (c.sent, c.killed, c.cancelled, c.running, c.queued),
        (5, 2, 3, 0, 0)
    );
    let s = sink.counts();
    assert_eq!((s.failed, s.dropped, s.in_flight), (2, 3, 0));
    for o in sink.runs("long") {
        assert_eq!(o.kind, OutcomeKind::Killed);
        assert_reaped(o.pid.unwrap());
        assert!(!alive(o.pid.unwrap() as i32));
    }
    assert!(e.tmp_files().is_empty(), "{:?}", e.tmp_files());
    // Afterwards: events are dropped, run_once refuses, shutdown is idempotent.
    sink.deliver(&turn(9));
    assert_eq!(sink.stats().hooks["long"].dropped, 1);
    let o = sink.run_once(&sink.table().actions[0], &turn(10));
    assert!(matches!(o.kind, OutcomeKind::SpawnFailed { .. }), "{o}");
    sink.shutdown(Instant::now());
}

#[test]
fn a_reload_keeps_running_hooks_on_their_table() {
    let e = Env::new();
    let out = e.dir("out");
    let old = sh(
        "old",
        EventKind::TurnComplete,
        &format!("sleep 0.3; echo $ZERO_HOOK_ID > {}/id", out.display()),
        e.ws(),
    );
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![old]));
    sink.deliver(&turn(0));
    wait_for("it to start", Duration::from_secs(5), || {
        sink.stats().totals.running == 1
    });
    sink.set_table(table(vec![]));
    assert!(sink.stats().hooks.contains_key("old"), "kept while running");
    let st = settle(&sink);
    assert_eq!(st.hooks["old"].ok, 1);
    assert_eq!(read(out.join("id")).trim(), "old");
    sink.set_table(table(vec![]));
    let st = sink.stats();
    assert!(!st.hooks.contains_key("old"), "forgotten once idle");
    assert_eq!(st.totals.ok, 1, "totals keep it");
}

#[test]
fn history_keeps_the_last_runs() {
    let e = Env::new();
    let a = sh(
        "h",
        EventKind::TurnComplete,
        "exit $(( ZERO_HOOK_SEQ % 3 ))",
        e.ws(),
    );
    let sink = e.sink(ShellLimits {
        history: 5,
        ..e.limits()
    });
    sink.set_table(table(vec![a]));
    for seq in 0..12 {
        sink.deliver(&turn(seq));
    }
    settle(&sink);
    let runs = sink.runs("h");
    assert_eq!(runs.len(), 5);
    let json = serde_json::to_value(&runs[0]).unwrap();
    assert!(
        json["kind"].is_string() && json["duration_ms"].is_number(),
        "{json}"
    );
    assert!(json["time"].as_str().unwrap().ends_with('Z'));
    assert!(sink.runs("nope").is_empty());
}

// ---------------------------------------------------------------- opt-in limits

#[test]
fn rlimits_apply_when_configured() {
    let e = Env::new();
    let out = e.dir("out");
    let a = sh(
        "ulimit",
        EventKind::TurnComplete,
        &format!("ulimit -n > {0}/n; ulimit -c > {0}/c", out.display()),
        e.ws(),
    );
    let sink = e.sink(ShellLimits {
        rlimits: Some(Rlimits {
            open_files: Some(77),
            core_bytes: Some(0),
            ..Rlimits::default()
        }),
        ..e.limits()
    });
    let o = sink.run_once(&a, &turn(0));
    if let OutcomeKind::SpawnFailed { reason } = &o.kind
        && reason.contains("Operation not permitted")
    {
        eprintln!("SKIPPED rlimits_apply_when_configured: setrlimit refused here ({reason})");
        return;
    }
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    assert_eq!(read(out.join("n")).trim(), "77");
    assert_eq!(read(out.join("c")).trim(), "0");
}

#[test]
fn a_cgroup_applies_when_configured() {
    // A cgroup v2 hierarchy we may create a group in.
    let roots = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];
    let root = roots
        .iter()
        .map(Path::new)
        .find(|r| r.join("cgroup.procs").exists() && r.join("cgroup.controllers").exists());
    let Some(root) = root else {
        eprintln!("SKIPPED a_cgroup_applies_when_configured: no cgroup v2 hierarchy here");
        return;
    };
    let name = format!("prx-hooks-test-{}", std::process::id());
    let dir = root.join(&name);
    if let Err(err) = std::fs::create_dir(&dir) {
        eprintln!(
            "SKIPPED a_cgroup_applies_when_configured: cannot create {}: {err}",
            dir.display()
        );
        return;
    }
    let e = Env::new();
    let out = e.dir("out");
    let a = sh(
        "cg",
        EventKind::TurnComplete,
        &format!("cat /proc/self/cgroup > {}/cg", out.display()),
        e.ws(),
    );
    let sink = e.sink(ShellLimits {
        cgroup: Some(dir.clone()),
        ..e.limits()
    });
    let o = sink.run_once(&a, &turn(0));
    drop(sink);
    let _ = std::fs::remove_dir(&dir);
    if let OutcomeKind::SpawnFailed { reason } = &o.kind {
        eprintln!("SKIPPED a_cgroup_applies_when_configured: the kernel refused ({reason})");
        return;
    }
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    let cg = read(out.join("cg"));
    assert!(cg.contains(&name), "{cg}");

    // A cgroup that cannot be opened fails every spawn rather than running unconfined.
    let sink = e.sink(ShellLimits {
        cgroup: Some("/nonexistent-cgroup".into()),
        ..e.limits()
    });
    let o = sink.run_once(&a, &turn(0));
    assert!(matches!(o.kind, OutcomeKind::SpawnFailed { .. }), "{o}");
}

// ---------------------------------------------------------------- with the real loader

#[test]
fn a_real_hooks_json_through_the_config_watcher() {
    let e = Env::new();
    let out = e.dir("out");
    let logs = e.dir("logs");
    let write = |enabled: bool| {
        let json = serde_json::json!({
            "timeout_ms": 5000,
            "hooks": { "tool_call": [ {
                "id": "audit",
                "command": "sh",
                "args": [fixture("record.sh"), out],
                "env": { "LEVEL": "info", "READ_STDIN": "1" },
                "cwd": "logs",
                "stdin_json": true,
                "matcher": "mcp__*",
                "enabled": enabled,
            } ] }
        });
        // Rename over, the way editors save.
        let tmp = e.ws().join(".hooks.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
        std::fs::rename(&tmp, e.ws().join("hooks.json")).unwrap();
    };
    write(true);
    let sink = Arc::new(e.sink(e.limits()));
    let target = sink.clone();
    let watcher = prx_hooks::config::ConfigWatcher::start(
        e.ws().to_path_buf(),
        Duration::from_millis(20),
        Box::new(move |t| target.set_table(t)),
    )
    .unwrap();
    let a = sink.table().get("audit").cloned().expect("loaded");
    assert!(
        a.program.as_ref().unwrap().is_absolute(),
        "resolved at load time"
    );

    sink.deliver(&tool_call("shell", "", 0));
    let msg = tool_call("mcp__github__create", "done", 1);
    sink.deliver(&msg);
    let st = settle(&sink);
    assert_eq!((st.hooks["audit"].skipped, st.hooks["audit"].ok), (1, 1));
    let env = read_env(&out);
    assert_eq!(env["LEVEL"], "info");
    assert_eq!(env["ZERO_HOOK_ID"], "audit");
    assert_eq!(read(out.join("stdin")), msg.json_str());
    assert_eq!(
        Path::new(read(out.join("cwd")).trim()),
        logs.canonicalize().unwrap()
    );

    // Disabled by an edit: live within 2 s, then skipped.
    write(false);
    wait_for("the reload", Duration::from_secs(2), || {
        !sink.table().actions[0].enabled
    });
    sink.deliver(&tool_call("mcp__x", "", 2));
    let st = settle(&sink);
    assert_eq!((st.hooks["audit"].skipped, st.hooks["audit"].ok), (2, 1));
    drop(watcher);
    assert!(e.tmp_files().is_empty());
}

// ---------------------------------------------------------------- containment

/// A `sleep` whose command line carries `marker` (GNU sleep adds up its arguments).
fn sleeper(secs: u32, marker: &str) -> String {
    let digits: String = marker.chars().filter(char::is_ascii_digit).collect();
    format!("sleep {secs} 0.{digits}")
}

/// `(SigBlk, SigIgn, SigCgt)` from a copy of `/proc/<pid>/status`.
fn signal_fields(status: &str) -> (u64, u64, u64) {
    let field = |name: &str| {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"));
        u64::from_str_radix(line[name.len()..].trim(), 16).unwrap()
    };
    (field("SigBlk:"), field("SigIgn:"), field("SigCgt:"))
}

#[test]
fn hooks_start_with_an_empty_signal_mask_and_default_dispositions() {
    use nix::sys::signal::{SigHandler, SigSet, Signal, signal};
    // What `prx-hooks run` does: INT/TERM/HUP blocked in every thread (the runner is started
    // from this one and inherits it), plus SIGPIPE; and an ignored signal (std already ignores
    // SIGPIPE process-wide).
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGPIPE,
    ] {
        set.add(s);
    }
    set.thread_block().unwrap();
    // SAFETY: SIG_IGN installs no handler; nothing else in this binary uses SIGUSR2.
    unsafe { signal(Signal::SIGUSR2, SigHandler::SigIgn) }.unwrap();

    let e = Env::new();
    let out = e.dir("out");
    // `cp` itself (no shell in between: a shell resets its own mask and hides the defect).
    let a = action(
        "status",
        EventKind::TurnComplete,
        "/bin/cp",
        &["/proc/self/status", out.join("queued").to_str().unwrap()],
        e.ws(),
    );
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![a.clone()]));
    sink.deliver(&turn(0));
    settle(&sink);
    assert_eq!(only_run(&sink, "status").kind, OutcomeKind::Ok);
    let mut direct = a;
    direct.args[1] = out.join("direct").to_str().unwrap().into();
    let o = sink.run_once(&direct, &turn(1));
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    for name in ["queued", "direct"] {
        let (blocked, ignored, caught) = signal_fields(&read(out.join(name)));
        assert_eq!(
            (blocked, ignored, caught),
            (0, 0, 0),
            "{name}: SigBlk {blocked:016x} SigIgn {ignored:016x} SigCgt {caught:016x}"
        );
    }

    // And so `kill -TERM` ends a hook at once.
    let marker = format!("prx-sigterm-{}", std::process::id());
    let digits: String = marker.chars().filter(char::is_ascii_digit).collect();
    let zero = format!("0.{digits}");
    let sleep = action(
        "sleep",
        EventKind::TurnComplete,
        "/bin/sleep",
        &["20", &zero],
        e.ws(),
    );
    sink.set_table(table(vec![sleep]));
    sink.deliver(&turn(2));
    let mut pid = Vec::new();
    wait_for("the sleep hook", Duration::from_secs(5), || {
        pid = procs_exactly(&format!("/bin/sleep 20 {zero}"));
        !pid.is_empty()
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid[0]), Signal::SIGTERM).unwrap();
    wait_for("SIGTERM to end the hook", Duration::from_secs(5), || {
        sink.stats().hooks["sleep"].running == 0
    });
    let o = only_run(&sink, "sleep");
    assert_eq!(o.kind, OutcomeKind::Signal { signal: 15 }, "{o}");
    set.thread_unblock().unwrap();
}

#[test]
fn descriptors_the_host_inherited_without_cloexec_do_not_reach_hooks() {
    use std::os::fd::AsRawFd;
    let e = Env::new();
    let out = e.dir("out");
    // A descriptor as a host inherits it: no FD_CLOEXEC, above the ones we open.
    let file = std::fs::File::open("/etc/passwd").unwrap();
    // SAFETY: F_DUPFD on a descriptor we own returns a new one we close below.
    let leaked = unsafe { nix::libc::fcntl(file.as_raw_fd(), nix::libc::F_DUPFD, 70) };
    assert!(leaked >= 70);
    // `exec` with the redirection: the shell keeps no saved copy of stdout (fd 10) around.
    let a = sh(
        "fds",
        EventKind::TurnComplete,
        &format!("exec ls /proc/self/fd > {}/fds", out.display()),
        e.ws(),
    );
    let sink = e.sink(e.limits());
    let o = sink.run_once(&a, &turn(0));
    sink.set_table(table(vec![a]));
    sink.deliver(&turn(1));
    settle(&sink);
    // SAFETY: closing the duplicate made above.
    unsafe { nix::libc::close(leaked) };
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    let fds: Vec<String> = read(out.join("fds")).lines().map(String::from).collect();
    // 3 is the directory `ls` itself opened to list.
    assert_eq!(fds, ["0", "1", "2", "3"], "the hook's descriptors");
}

#[test]
fn the_cwd_is_checked_at_spawn_and_named_when_it_fails() {
    let e = Env::new();
    let out = e.dir("out");
    let logs = e.dir("logs");
    let outside = tempfile::tempdir().unwrap();
    let sink = e.sink(e.limits());
    let a = record("cwd", EventKind::TurnComplete, &out, &logs);
    assert_eq!(sink.run_once(&a, &turn(0)).kind, OutcomeKind::Ok);
    assert_eq!(
        Path::new(read(out.join("cwd")).trim()),
        logs.canonicalize().unwrap()
    );
    // A symlink inside the workspace to a directory inside it is fine.
    std::os::unix::fs::symlink(&logs, e.ws().join("alias")).unwrap();
    let b = record(
        "alias",
        EventKind::TurnComplete,
        &out,
        &e.ws().join("alias"),
    );
    assert_eq!(sink.run_once(&b, &turn(1)).kind, OutcomeKind::Ok);
    assert_eq!(
        Path::new(read(out.join("cwd")).trim()),
        logs.canonicalize().unwrap()
    );

    // Swapped for a symlink out of the workspace after it was checked: refused at spawn.
    std::fs::remove_dir(&logs).unwrap();
    std::os::unix::fs::symlink(outside.path(), &logs).unwrap();
    std::fs::remove_file(out.join("done")).unwrap();
    let o = sink.run_once(&a, &turn(2));
    let OutcomeKind::SpawnFailed { reason } = &o.kind else {
        panic!("ran in {}: {o}", read(out.join("cwd")));
    };
    assert!(!out.join("done").exists(), "the hook ran");
    assert!(
        reason.contains(logs.to_str().unwrap()) && reason.contains("outside the workspace"),
        "{reason}"
    );

    // A missing cwd is named as such (not "/bin/sh: No such file or directory").
    std::fs::remove_file(&logs).unwrap();
    let o = sink.run_once(&a, &turn(3));
    let OutcomeKind::SpawnFailed { reason } = &o.kind else {
        panic!("{o}");
    };
    assert!(
        reason.contains(&format!("cwd {}", logs.display()))
            && reason.contains("No such file or directory"),
        "{reason}"
    );
}

#[test]
fn planted_payload_file_names_cannot_block_hooks() {
    let e = Env::new();
    // What another local user can do in a shared /tmp: take every name the predictable
    // scheme would try next.
    let pid = std::process::id();
    for n in 0..3000 {
        std::fs::File::create(e.tmp.path().join(format!("prx-hooks-{pid}-{n}.json"))).unwrap();
    }
    let out = e.dir("out");
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![record(
        "rec",
        EventKind::TurnComplete,
        &out,
        e.ws(),
    )]));
    for seq in 0..6 {
        sink.deliver(&turn(seq));
    }
    let st = settle(&sink);
    assert_eq!(st.hooks["rec"].ok, 6, "{:?}", sink.runs("rec").last());
    // The file lives in a private directory of ours.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let file = PathBuf::from(read(out.join("file_path")));
    let dir = file.parent().unwrap();
    assert_eq!(dir.parent().unwrap(), e.tmp.path());
    let meta = std::fs::symlink_metadata(dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    sink.shutdown(Instant::now() + Duration::from_secs(5));
    assert!(!dir.exists(), "the private directory outlived the sink");
}

/// Waits until every pid in `pids` has died, then reaps those that became our children
/// (subreaper). False if one is still alive after 5 s.
fn all_die(pids: &[i32]) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| alive(p)) {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let me = std::process::id() as i32;
    for &p in pids {
        if proc_stat(p).is_some_and(|(_, ppid, _)| ppid == me) {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(p), None);
        }
    }
    true
}

#[test]
fn a_timeout_kills_setsid_grandchildren_too() {
    subreaper();
    let e = Env::new();
    let marker = format!("prx-setsid-{}", std::process::id());
    let escaper = sleeper(312, &marker);
    let mut a = sh(
        "escape",
        EventKind::TurnComplete,
        &format!("setsid {escaper} & {}", sleeper(100, &marker)),
        e.ws(),
    );
    a.timeout = Duration::from_millis(1500);
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![a]));
    sink.deliver(&turn(0));
    let mut found = Vec::new();
    wait_for("the setsid sleep", Duration::from_secs(5), || {
        found = procs_exactly(&escaper);
        !found.is_empty()
    });
    let st = settle(&sink);
    assert_eq!(st.hooks["escape"].timed_out, 1);
    if !all_die(&found) {
        reap_orphans(&found);
        panic!("the setsid grandchild survived the timeout: {found:?}");
    }
}

#[test]
fn shutdown_kills_setsid_grandchildren_too() {
    subreaper();
    let e = Env::new();
    let marker = format!("prx-setsid-shutdown-{}", std::process::id());
    let escaper = sleeper(313, &marker);
    let a = sh(
        "escape",
        EventKind::TurnComplete,
        &format!("setsid {escaper} & {}", sleeper(101, &marker)),
        e.ws(),
    );
    let sink = e.sink(e.limits());
    sink.set_table(table(vec![a]));
    sink.deliver(&turn(0));
    let mut found = Vec::new();
    wait_for("the setsid sleep", Duration::from_secs(5), || {
        found = procs_exactly(&escaper);
        !found.is_empty()
    });
    let t = Instant::now();
    sink.shutdown(Instant::now() + Duration::from_millis(100));
    assert!(t.elapsed() < Duration::from_millis(100) + prx_hooks::SHUTDOWN_SLACK * 4);
    assert_eq!(sink.stats().totals.killed, 1);
    if !all_die(&found) {
        reap_orphans(&found);
        panic!("the setsid grandchild survived shutdown: {found:?}");
    }
}

/// Runs in a child copy of this binary (see the test below): a library host with one long
/// hook, which writes its pid where the test can find it, then waits to be killed.
#[test]
fn library_host_probe() {
    let Some(out) = std::env::var_os("PRX_SHELL_HOST_OUT") else {
        return;
    };
    let out = PathBuf::from(out);
    let a = sh(
        "long",
        EventKind::TurnComplete,
        &format!("echo $$ > {}/leader; exec sleep 300", out.display()),
        &out,
    );
    let sink = ShellSink::standalone(out.clone(), ShellLimits::default());
    sink.set_table(table(vec![a]));
    sink.deliver(&turn(0));
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn a_library_host_killed_with_sigkill_takes_its_hook_leaders_along() {
    subreaper();
    let e = Env::new();
    let out = e.dir("host");
    let mut host = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["shell::library_host_probe", "--exact", "--test-threads=1"])
        .env("PRX_SHELL_HOST_OUT", &out)
        .env("TMPDIR", e.tmp.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut leader = 0;
    wait_for("the hook to start", Duration::from_secs(20), || {
        leader = std::fs::read_to_string(out.join("leader"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        leader > 0 && alive(leader)
    });
    host.kill().unwrap();
    host.wait().unwrap();
    let died = all_die(&[leader]);
    if !died {
        reap_orphans(&[leader]);
    }
    assert!(died, "the hook leader outlived its library host");
}

#[test]
fn with_a_cgroup_what_an_exited_leader_left_dies_at_the_runs_deadline() {
    subreaper();
    let e = Env::new();
    let limits = ShellLimits {
        detect_cgroup: true,
        ..e.limits()
    };
    let sink = e.sink(limits);
    let status = sink.cgroup_status();
    if !matches!(status, prx_hooks::shell::CgroupStatus::Active { .. }) {
        eprintln!(
            "NOT RUN with_a_cgroup_what_an_exited_leader_left_dies_at_the_runs_deadline: {status:?}"
        );
        return;
    }
    let marker = format!("prx-linger-{}", std::process::id());
    let left = sleeper(314, &marker);
    let mut a = sh(
        "bg",
        EventKind::TurnComplete,
        &format!("setsid {left} & exit 0"),
        e.ws(),
    );
    a.timeout = Duration::from_millis(1500);
    let t = Instant::now();
    let o = sink.run_once(&a, &turn(0));
    assert_eq!(o.kind, OutcomeKind::Ok, "{o}");
    assert!(o.duration < Duration::from_millis(1500), "{o}");
    // The background child may still be between fork and exec when the leader exits: look
    // until it shows, well before the run's deadline.
    let mut found = procs_exactly(&left);
    while found.is_empty() && t.elapsed() < Duration::from_millis(1200) {
        std::thread::sleep(Duration::from_millis(10));
        found = procs_exactly(&left);
    }
    assert_eq!(found.len(), 1, "left running for now");
    let died = all_die(&found);
    if !died {
        reap_orphans(&found);
    }
    assert!(died, "what the leader left outlived the run's deadline");
    assert!(
        t.elapsed() >= Duration::from_millis(1400),
        "killed before its deadline"
    );
}
