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

#[path = "support/hooks.rs"]
mod support;

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
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--payload: payload: invalid type"));

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
        Some(2),
        "a configuration error makes fire exit 2"
    );
}

#[test]
fn run_executes_hooks_and_reloads_on_sighup() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let hook = |tag: &str| format!(r#"{{"hooks":{{"tool_call":[{}]}}}}"#, appender(tag, &log));
    std::fs::write(ws.path().join("hooks.json"), hook("first")).unwrap();
    let fifo = ws.path().join("events");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // SIGHUP must reload (or find the watcher already did) and must not end the run.
    let child = bin()
        .env("PRX_HOOKS_POLL", "1")
        .env("RUST_LOG", "info")
        .args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--events")
        .arg(&fifo)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
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
