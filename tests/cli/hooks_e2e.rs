//! Shell hooks through the whole pipeline: `Hooks` with a real workspace, a real hooks.json,
//! the real watcher and real child processes; and the CLI's `validate`, `fire` and `run`.

use prx_hooks::{Emit, Event, Hooks};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Writes hooks.json the way editors do: a temporary file renamed over the old one.
fn save(ws: &Path, json: &str) {
    let tmp = ws.join(".hooks.json.tmp");
    std::fs::write(&tmp, json).unwrap();
    std::fs::rename(&tmp, ws.join("hooks.json")).unwrap();
}

use crate::support;

use support::{append_args, lines, wait_for};

/// A hook that appends "<tag> <tool>" to `log` for every tool_call.
fn appender(tag: &str, log: &Path) -> String {
    let args = append_args(tag, log);
    serde_json::json!({ "id": tag, "command": "/bin/sh", "args": args, "stdin_json": true })
        .to_string()
}

#[test]
fn hooks_follow_every_reload_and_a_broken_file_keeps_the_last_good_one() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let em = hooks.emitter("agent", "session");
    let fire = |n: u32| {
        let output = format!("n{n}");
        em.emit(Event::ToolCall {
            tool: "t",
            success: true,
            output: &output,
        })
    };
    // No hooks.json yet: nobody listens.
    assert_eq!(fire(0), Emit::Skipped);

    // Created.
    save(
        ws.path(),
        &format!(r#"{{"hooks":{{"tool_call":[{}]}}}}"#, appender("a", &log)),
    );
    wait_for("the first table", || hooks.hook_table().actions.len() == 1);
    assert_eq!(fire(1), Emit::Queued);
    wait_for("hook a", || {
        lines(&log)
            .iter()
            .any(|l| l.starts_with("a ") && l.contains("n1"))
    });

    // Edited (rename-over): a second hook.
    let two = format!(
        r#"{{"hooks":{{"tool_call":[{},{}]}}}}"#,
        appender("a", &log),
        appender("b", &log)
    );
    save(ws.path(), &two);
    wait_for("the second table", || hooks.hook_table().actions.len() == 2);
    fire(2);
    wait_for("hooks a and b", || {
        lines(&log).iter().filter(|l| l.contains("n2")).count() == 2
    });

    // Broken: invalid JSON, then a bad field. The two-hook table stays active.
    for broken in [
        "{\"hooks\": {",
        r#"{"hooks":{"tool_call":[{"command":"ls; rm"}]}}"#,
    ] {
        std::fs::write(ws.path().join("hooks.json"), broken).unwrap(); // in place
        wait_for("the error to be recorded", || {
            hooks
                .stats()
                .config()
                .is_some_and(|c| c.failing && c.last_error.is_some())
        });
        assert_eq!(hooks.hook_table().actions.len(), 2);
        fire(3);
    }
    wait_for("both hooks still firing", || {
        lines(&log).iter().filter(|l| l.contains("n3")).count() == 4
    });

    // Fixed: back to one hook.
    save(
        ws.path(),
        &format!(r#"{{"hooks":{{"tool_call":[{}]}}}}"#, appender("b", &log)),
    );
    wait_for("the fixed table", || hooks.hook_table().actions.len() == 1);
    fire(4);
    hooks.shutdown(Duration::from_secs(10));
    let n4: Vec<_> = lines(&log)
        .into_iter()
        .filter(|l| l.contains("n4"))
        .collect();
    assert_eq!(n4.len(), 1, "{n4:?}");
    assert!(n4[0].starts_with("b "));

    let stats = hooks.stats();
    let config = stats.config().unwrap().clone();
    assert!(config.reload_errors >= 2, "{config:?}");
    let shell = stats.shell().unwrap().clone();
    assert_eq!(shell.totals.ok, 1 + 2 + 4 + 1);
    for sink in &stats.sinks {
        assert!(sink.counts.balanced(), "{sink:?}");
        assert_eq!(sink.counts.in_flight, 0);
    }
}

#[test]
fn emit_never_blocks_while_every_hook_hangs() {
    let ws = tempfile::tempdir().unwrap();
    let hang = |id: &str| {
        format!(
            r#"{{"id":"{id}","command":"/bin/sleep","args":["60"],"timeout_ms":300000,"max_concurrent":2}}"#
        )
    };
    let json = format!(
        r#"{{"hooks":{{"tool_call":[{},{}],"error":[{}]}}}}"#,
        hang("h1"),
        hang("h2"),
        hang("h3")
    );
    save(ws.path(), &json);
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let em = hooks.emitter("agent", "session");
    let started = Instant::now();
    let mut queued = 0;
    for i in 0..200_000u32 {
        let r = if i % 2 == 0 {
            em.emit(Event::ToolCall {
                tool: "t",
                success: true,
                output: "o",
            })
        } else {
            em.emit(Event::Error {
                component: "c",
                message: "m",
            })
        };
        queued += (r == Emit::Queued) as u32;
    }
    // Liveness with generous slack: 200,000 non-blocking calls take milliseconds.
    assert!(started.elapsed() < Duration::from_secs(30), "emit blocked");
    assert!(queued > 0);
    // The hooks' queues overflowed and said so; the processes are still running. (Drops show
    // as soon as the worker has queued the events; the first spawn may come later on a busy
    // machine, so wait for both.)
    let deadline = Instant::now() + Duration::from_secs(30);
    let shell = loop {
        let shell = hooks.stats().shell().unwrap().clone();
        if (shell.totals.dropped > 0 && shell.totals.running >= 1) || Instant::now() > deadline {
            break shell;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(shell.totals.dropped > 0, "{shell:?}");
    assert!(shell.totals.running >= 1, "{shell:?}");
    // Shutdown kills what still runs and accounts for everything.
    let t = Instant::now();
    hooks.shutdown(Duration::from_millis(500));
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "shutdown hung on hanging hooks"
    );
    let stats = hooks.stats();
    let shell = stats.shell().unwrap().clone();
    assert_eq!((shell.totals.running, shell.totals.queued), (0, 0));
    assert!(shell.totals.killed >= 1);
    assert!(
        stats
            .sinks
            .iter()
            .all(|s| s.counts.balanced() && s.counts.in_flight == 0)
    );
}

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

#[test]
fn validate_and_fire_exit_codes_and_output() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path();
    // No hooks.json: valid, nothing to fire.
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let good = r#"{"hooks":{"tool_call":[
        {"id":"ok","command":"/bin/true"},
        {"id":"fails","command":"/bin/sh","args":["-c","echo boom >&2; exit 3"]},
        {"id":"off","command":"/bin/true","enabled":false}]}}"#;
    std::fs::write(dir.join("hooks.json"), good).unwrap();
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let out = bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failing hook makes fire exit 1: {out:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("hook ok tool_call: ok")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("hook fails tool_call: exit 3") && l.contains("boom")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("hook off tool_call: skipped")),
        "{stdout}"
    );

    let out = bin()
        .args([
            "fire",
            "tool_call",
            "--json",
            "--payload",
            r#"{"tool":"x","success":false,"output":"o"}"#,
            "--workspace",
        ])
        .arg(dir)
        .output()
        .unwrap();
    let kinds: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    assert_eq!(kinds.len(), 3, "{kinds:?}");

    let out = bin()
        .args([
            "fire",
            "tool_call",
            "--payload",
            r#"{"tool":1}"#,
            "--workspace",
        ])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(65),
        "a bad payload is EX_DATAERR, never 2"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--payload:1:9: payload.tool: expected a string, found a number 1")
    );

    let bad = r#"{"hooks":{"tool_call":[{"command":"ls | wc"}]}}"#;
    std::fs::write(dir.join("hooks.json"), bad).unwrap();
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("hooks.json:1:35: hooks.tool_call[0].command: may not contain '|'"),
        "{stdout}"
    );
    let out = bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(78),
        "a configuration error makes fire exit 78 (EX_CONFIG), never 2"
    );
}

#[test]
fn run_executes_hooks_and_reloads_on_sighup() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let hook = |tag: &str| format!(r#"{{"hooks":{{"tool_call":[{}]}}}}"#, appender(tag, &log));
    std::fs::write(ws.path().join("hooks.json"), hook("first")).unwrap();
    // SIGHUP must reload (or find the watcher already did) and must not end the run. Events
    // come through a pipe on stdin, whose close ends the input (a named FIFO stays open).
    let mut child = bin()
        .env("PRX_HOOKS_POLL", "1")
        .env("RUST_LOG", "info")
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--events", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = child.stdin.take().unwrap();
    let line = |n: u32| {
        format!(
            r#"{{"event":"tool_call","agent":"a","session":"s","payload":{{"tool":"t","success":true,"output":"n{n}"}}}}"#
        )
    };
    use std::io::Write;
    writeln!(events, "{}", line(1)).unwrap();
    wait_for("the first hook", || {
        lines(&log)
            .iter()
            .any(|l| l.starts_with("first") && l.contains("n1"))
    });

    std::fs::write(ws.path().join("hooks.json"), hook("second")).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    writeln!(events, "{}", line(2)).unwrap();
    wait_for("the reloaded hook", || {
        lines(&log)
            .iter()
            .any(|l| l.starts_with("second") && l.contains("n2"))
    });
    drop(events); // EOF: drain and exit 0
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(report["stats"]["shell"]["totals"]["ok"], 2, "{report}");
    // SIGHUP reloaded (or found the poller had just done it) and did not end the run.
    assert!(stderr.contains("SIGHUP: hooks.json"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// run's end-of-input drain, matchers in fire, logging

/// `run --events FILE` over `json`, with `extra` arguments; returns (status, stderr, elapsed).
fn run_over(
    ws: &Path,
    json: &str,
    events: &[&str],
    extra: &[&str],
) -> (std::process::ExitStatus, String, Duration) {
    std::fs::write(ws.join("hooks.json"), json).unwrap();
    let input = ws.join("events.ndjson");
    std::fs::write(&input, events.join("\n") + "\n").unwrap();
    let start = Instant::now();
    // The defaults a user gets: no RUST_LOG.
    let out = bin()
        .env_remove("RUST_LOG")
        .args(["run", "--workspace"])
        .arg(ws)
        .arg("--events")
        .arg(&input)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status, stderr, start.elapsed())
}

/// The exit report (the last stderr line).
fn report(stderr: &str) -> serde_json::Value {
    serde_json::from_str(stderr.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

const AGENT_END: &str = r#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":true,"messages_count":3}}"#;

/// Item 13: a 3 s `agent_end` notifier was killed at 2 s when the input ended ("killed at
/// shutdown (2000.2 ms)") while `fire` ran it fine. At the end of the input, `run` waits for
/// running hooks up to their own timeouts.
#[test]
fn run_lets_hooks_finish_under_their_own_timeouts_at_end_of_input() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let json = serde_json::json!({"hooks": {"agent_end": [{
        "id": "notify", "command": "/bin/sh", "timeout_ms": 20000,
        "args": ["-c", format!("sleep 3; echo done >> {}", log.display())]
    }]}})
    .to_string();
    let (status, stderr, took) = run_over(ws.path(), &json, &[AGENT_END], &[]);
    assert!(status.success(), "{stderr}");
    let r = report(&stderr);
    let totals = &r["stats"]["shell"]["totals"];
    assert_eq!(totals["ok"], 1, "{r}");
    assert_eq!(totals["killed"], 0, "{r}");
    assert_eq!(lines(&log), ["done"]);
    assert!(took >= Duration::from_secs(3));
}

/// `--drain-timeout` caps that wait: a hook that would run for 60 s is killed once it passes.
#[test]
fn drain_timeout_caps_the_end_of_input_wait() {
    let ws = tempfile::tempdir().unwrap();
    let json = r#"{"hooks": {"agent_end": [{"id": "long", "command": "/bin/sleep",
        "args": ["60"], "timeout_ms": 120000}]}}"#;
    let (status, stderr, took) =
        run_over(ws.path(), json, &[AGENT_END], &["--drain-timeout", "500ms"]);
    assert!(status.success(), "{stderr}");
    let totals = &report(&stderr)["stats"]["shell"]["totals"];
    assert_eq!(totals["killed"], 1, "{stderr}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    // A bad value is a usage error naming the flag.
    let out = bin()
        .args(["run", "--drain-timeout", "soon"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--drain-timeout"));
}

/// SIGTERM during the end-of-input drain drains for 2 s instead; a second one kills at once.
#[test]
fn a_signal_shortens_the_drain_and_a_second_kills_at_once() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let ws = tempfile::tempdir().unwrap();
    let json = r#"{"hooks": {"agent_end": [{"id": "long", "command": "/bin/sleep",
        "args": ["60"], "timeout_ms": 120000}]}}"#;
    std::fs::write(ws.path().join("hooks.json"), json).unwrap();
    let input = ws.path().join("events.ndjson");
    std::fs::write(&input, format!("{AGENT_END}\n")).unwrap();
    for second in [false, true] {
        let mut child = bin()
            .env("RUST_LOG", "info")
            .args(["run", "--workspace"])
            .arg(ws.path())
            .arg("--events")
            .arg(&input)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let stderr = child.stderr.take().unwrap();
        let mut reader = std::io::BufReader::new(stderr);
        let mut text = String::new();
        // Wait until the drain has begun (the hook is running).
        loop {
            let mut line = String::new();
            use std::io::BufRead;
            assert!(reader.read_line(&mut line).unwrap() > 0, "{text}");
            text.push_str(&line);
            if line.contains("end of input: waiting") {
                break;
            }
        }
        kill(pid, Signal::SIGTERM).unwrap();
        let first = Instant::now();
        if second {
            std::thread::sleep(Duration::from_millis(100));
            kill(pid, Signal::SIGTERM).unwrap();
        }
        use std::io::Read;
        reader.read_to_string(&mut text).unwrap();
        assert!(child.wait().unwrap().success(), "{text}");
        let took = first.elapsed();
        let r = report(&text);
        assert_eq!(r["stats"]["shell"]["totals"]["killed"], 1, "{text}");
        if second {
            assert!(
                text.contains("again: killing every running hook now"),
                "{text}"
            );
            assert!(
                took < Duration::from_millis(1500),
                "second signal: {took:?}"
            );
        } else {
            assert!(took >= Duration::from_millis(1900), "one signal: {took:?}");
            assert!(took < Duration::from_secs(20), "one signal: {took:?}");
        }
    }
}

/// Item 14: `fire` honours matchers (a skipped hook names the tool and the pattern) unless
/// `--ignore-matcher`; Claude Code's `Edit|Write` matches.
#[test]
fn fire_honours_matchers_unless_told_to_ignore_them() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let json = serde_json::json!({"hooks": {"tool_call": [{
        "id": "edits", "command": "/bin/sh", "matcher": "Edit|Write",
        "args": ["-c", format!("echo ran >> {}", log.display())]
    }]}})
    .to_string();
    std::fs::write(ws.path().join("hooks.json"), json).unwrap();
    let fire = |tool: &str, extra: &[&str]| {
        let payload = format!(r#"{{"tool":"{tool}","success":true,"output":""}}"#);
        let out = bin()
            .args(["fire", "tool_call", "--workspace"])
            .arg(ws.path())
            .args(["--payload", &payload])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = fire("Bash", &[]);
    assert_eq!(
        out.trim(),
        r#"hook edits tool_call: skipped (matcher "Edit|Write" does not match tool "Bash")"#
    );
    assert!(lines(&log).is_empty());
    assert!(fire("Bash", &["--ignore-matcher"]).contains("hook edits tool_call: ok"));
    assert!(fire("Write", &[]).contains("hook edits tool_call: ok"));
    assert_eq!(lines(&log), ["ran", "ran"]);
}

/// Item 15: every run is logged at info (hook, event, outcome, duration or exit code), the
/// stderr tail at debug (`-v`), nothing below warn with `-q`.
#[test]
fn run_logs_every_hook_run_and_v_q_set_how_much() {
    let ws = tempfile::tempdir().unwrap();
    let json = r#"{"hooks": {"tool_call": [
        {"id": "fine", "command": "/bin/sh", "args": ["-c", "echo note-to-self >&2"]},
        {"id": "fails", "command": "/bin/sh", "args": ["-c", "exit 3"]},
        {"id": "edits", "command": "/bin/true", "matcher": "Edit|Write"}]}}"#;
    let event = r#"{"event":"tool_call","agent":"a","session":"s","payload":{"tool":"Bash","success":true,"output":""}}"#;
    let (status, stderr, _) = run_over(ws.path(), json, &[event], &[]);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("hook fine tool_call: ok ("), "{stderr}");
    assert!(
        stderr.contains("hook fails tool_call: exit 3 ("),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            r#"hook edits tool_call: skipped (matcher "Edit|Write" does not match tool "Bash")"#
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("note-to-self"),
        "the tail is debug: {stderr}"
    );

    let (_, verbose, _) = run_over(ws.path(), json, &[event], &["-v"]);
    assert!(
        verbose.contains("hook fine tool_call stderr: \"note-to-self\""),
        "{verbose}"
    );
    let (status, quiet, _) = run_over(ws.path(), json, &[event], &["-q"]);
    assert!(status.success());
    assert!(!quiet.contains("hook fine"), "{quiet}");
    assert!(
        quiet.contains("hook fails tool_call: exit 3"),
        "failures still warn: {quiet}"
    );
    assert_eq!(report(&quiet)["stats"]["shell"]["totals"]["ok"], 1);
}

/// A guard written for an agent's own blocking hook (exit 2) is told once, at its first exit 2
/// on `tool_call_start`, that here it blocked nothing; a hook exiting 2 on another event, or
/// another status, is a failure like any other and not told.
#[test]
fn a_hook_exiting_2_on_tool_call_start_is_told_once_that_hooks_cannot_block() {
    let ws = tempfile::tempdir().unwrap();
    let json = serde_json::json!({"hooks": {
        "tool_call_start": [
            {"id": "guard", "command": "/bin/sh", "args": ["-c", "echo refusing rm -rf >&2; exit 2"]},
            {"id": "other", "command": "/bin/sh", "args": ["-c", "exit 3"]}
        ],
        "agent_end": [{"id": "late", "command": "/bin/sh", "args": ["-c", "exit 2"]}]
    }})
    .to_string();
    let start = r#"{"event":"tool_call_start","agent":"a","session":"s","payload":{"tool":"Bash","arguments":{"command":"rm -rf x"}}}"#;
    let (status, stderr, _) = run_over(ws.path(), &json, &[start, start, start, AGENT_END], &[]);
    assert!(status.success(), "hook failures are not run's: {stderr}");
    let told: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("blocks nothing here"))
        .collect();
    assert_eq!(told.len(), 1, "{stderr}");
    assert!(told[0].contains("hook guard exited 2"), "{}", told[0]);
    assert!(told[0].contains("the tool ran"), "{}", told[0]);
    let r = report(&stderr);
    assert_eq!(r["stats"]["shell"]["totals"]["exit"], 7, "{r}");
}
