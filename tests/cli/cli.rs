//! The `prx-hooks` binary, run as a real process: NDJSON ingestion, `--print`, stats, signals,
//! FIFOs, and `bench`.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

fn line(event: &str, session: &str, payload: &str) -> String {
    format!(r#"{{"event":"{event}","agent":"agent","session":"{session}","payload":{payload}}}"#)
}

/// The last line of stderr is the final report: `{"input": {...}, "stats": {...}}`.
fn report(stderr: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stderr);
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("no report ({e}) in stderr:\n{text}"))
}

fn printed(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_kind_of_bad_line_is_reported_and_nothing_after_it_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    let mut input = Vec::new();
    let good = |n: u32| {
        line(
            "tool_call",
            "s",
            &format!(r#"{{"tool":"t{n}","success":true,"output":"ok"}}"#),
        )
    };
    let bad: [&[u8]; 7] = [
        b"this is not json",
        br#"{"event":"tool_calls","agent":"a","session":"s"}"#,
        br#"{"event":"error","agent":"a","session":"s","payload":{"component":"c"}}"#,
        br#"{"event":"agent_end","agent":"a","session":"s","payload":{"success":1,"messages_count":2}}"#,
        b"{\"event\":\"error\",\"agent\":\"\xff\xfe\",\"session\":\"s\"}",
        br#"[]"#,
        br#"{"event":"error","agent":"a","session":"s","payload":{"component":"c","message":"m"},"x":1}"#,
    ];
    for (n, b) in bad.iter().enumerate() {
        input.extend_from_slice(good(n as u32).as_bytes());
        input.extend_from_slice(b"\n");
        input.extend_from_slice(b);
        input.extend_from_slice(b"\r\n");
    }
    input.extend_from_slice(b"\n   \n");
    input.extend_from_slice(good(99).as_bytes()); // no trailing newline
    std::fs::write(&events, &input).unwrap();

    let out = bin()
        .args(["run", "--print", "--workspace"])
        .arg(dir.path())
        .arg("--events")
        .arg(&events)
        .output()
        .unwrap();
    // Refused lines make the exit code 1 (docs/cli.md § Exit codes); every good line still went on.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("7 line(s) refused, 0 event(s) dropped"),
        "{stderr}"
    );
    let name = events.display().to_string();
    let expect = [
        (2, "not JSON"),
        (
            4,
            "unknown event \"tool_calls\"; did you mean \"tool_call\"?",
        ),
        (
            6,
            "payload.message: missing (an error event needs component, message)",
        ),
        (
            8,
            "69: payload.success: expected a boolean, found a number 1",
        ),
        (10, "invalid UTF-8 at byte 26"),
        (12, "expected a JSON object, found an array"),
        (14, "x: unknown member"),
    ];
    for (number, reason) in expect {
        let prefix = format!("{name}:{number}:");
        let found = stderr.lines().find(|l| l.starts_with(&prefix));
        assert!(
            found.is_some_and(|l| l.contains(reason)),
            "want {prefix}{reason}\nstderr:\n{stderr}"
        );
    }
    let tools: Vec<_> = printed(&out.stdout)
        .iter()
        .map(|m| m["payload"]["tool"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tools, ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t99"]);
    let r = report(&out.stderr);
    assert_eq!(r["input"]["bad_lines"], 7);
    assert_eq!(r["input"]["events"], 8);
    assert_eq!(r["stats"]["queued"], 8);
    assert_eq!(r["stats"]["sinks"][0]["delivered"], 8);
}

#[test]
fn print_writes_one_envelope_per_message_on_stdout_only() {
    let mut child = bin()
        .args(["run", "--print", "--events", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(
        stdin,
        "{}",
        line("agent_start", "s1", r#"{"agent":"agent","session":"s1"}"#)
    )
    .unwrap();
    writeln!(
        stdin,
        "{}",
        line(
            "tool_call_start",
            "s1",
            r#"{"tool":"sh","arguments":{"cmd":"ls \"x\"","n":[1,2]}}"#
        )
    )
    .unwrap();
    writeln!(
        stdin,
        r#"{{"event":"turn_complete","agent":"agent","session":"s1"}}"#
    )
    .unwrap();
    writeln!(
        stdin,
        "{}",
        line(
            "error",
            "s2",
            r#"{"component":"llm","message":"line1\nline2 é"}"#
        )
    )
    .unwrap();
    writeln!(stdin, "garbage").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    // The garbage line is refused: exit 1, and only on stderr.
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let msgs = printed(&out.stdout);
    assert_eq!(msgs.len(), 4, "{msgs:?}");
    let first = msgs[0].as_object().unwrap();
    let keys: Vec<_> = first.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 7);
    for k in [
        "topic",
        "event",
        "agent",
        "session",
        "seq",
        "timestamp",
        "payload",
    ] {
        assert!(first.contains_key(k), "missing {k} in {first:?}");
    }
    assert_eq!(msgs[1]["topic"], "prx.lifecycle.tool_call_start");
    assert_eq!(msgs[1]["payload"]["arguments"]["cmd"], "ls \"x\"");
    assert_eq!(
        (msgs[1]["seq"].as_u64(), msgs[2]["seq"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(msgs[2]["payload"], serde_json::json!({}));
    assert_eq!(msgs[3]["payload"]["message"], "line1\nline2 é");
    assert_eq!(
        (msgs[3]["session"].as_str(), msgs[3]["seq"].as_u64()),
        (Some("s2"), Some(0))
    );
    let ts = msgs[0]["timestamp"].as_str().unwrap();
    assert!(
        ts.len() == 27 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
        "{ts}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("-:5:1: not JSON"), "{stderr}");
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// Reads one line of the child's stdout, failing (not hanging) after `timeout`.
fn read_line_within(rx: &std::sync::mpsc::Receiver<String>, timeout: Duration) -> String {
    rx.recv_timeout(timeout).expect("no output line in time")
}

fn spawn_stdout_reader(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            if tx.send(l.unwrap()).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn a_fifo_is_read_line_by_line_and_sigterm_drains_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("events.fifo");
    mkfifo(&fifo);
    let mut child = bin()
        .env("RUST_LOG", "info")
        .args(["run", "--print", "--events"])
        .arg(&fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = spawn_stdout_reader(&mut child);
    let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    for n in 0..3 {
        // Each event must come out before the next goes in: nothing waits for EOF.
        writeln!(
            writer,
            "{}",
            line(
                "tool_call",
                "s",
                &format!(r#"{{"tool":"t{n}","success":true,"output":""}}"#)
            )
        )
        .unwrap();
        writer.flush().unwrap();
        let msg: Value =
            serde_json::from_str(&read_line_within(&out, Duration::from_secs(20))).unwrap();
        assert_eq!(msg["payload"]["tool"], format!("t{n}"));
    }
    // The writer stays open (no EOF): only the signal can end the run.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not end the run");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let r = report(&stderr);
    assert_eq!(r["stats"]["processed"], 3);
    assert!(String::from_utf8_lossy(&stderr).contains("SIGTERM"));
    drop(writer);
}

#[test]
fn a_missing_events_file_is_a_clear_error() {
    let out = bin()
        .args(["run", "--events", "/no/such/events.ndjson"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/no/such/events.ndjson: No such file"),
        "{stderr}"
    );
}

#[test]
fn bench_reports_latency_and_throughput_as_json() {
    let out = bin()
        .args([
            "bench",
            "--events",
            "20000",
            "--producers",
            "2",
            "--subscribers",
            "2",
            "--payload-bytes",
            "64",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            r["events"].as_u64(),
            r["producers"].as_u64(),
            r["subscribers"].as_u64()
        ),
        (Some(20000), Some(2), Some(2))
    );
    let p = &r["burst"]["emit_ns"];
    assert!(p["p50"].as_u64() <= p["p99"].as_u64() && p["p99"].as_u64() <= p["max"].as_u64());
    for phase in ["burst", "sustained"] {
        let ph = &r[phase];
        let queued = 20000 - ph["ring_dropped"].as_u64().unwrap();
        // Every queued event reached both subscribers or is counted as a subscriber drop.
        let accounted =
            ph["delivered"].as_u64().unwrap() + ph["subscriber_dropped"].as_u64().unwrap();
        assert_eq!(accounted, 2 * queued, "{phase}");
    }
    assert_eq!(r["sustained"]["ring_dropped"], 0);
    assert_eq!(r["sustained"]["subscriber_dropped"], 0);
}

#[test]
fn oversize_events_are_refused_with_their_line_and_counted_apart_from_drops() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("big.ndjson");
    let small = line(
        "tool_call",
        "s",
        r#"{"tool":"t","success":true,"output":"ok"}"#,
    );
    let big = line(
        "tool_call",
        "s",
        &format!(
            r#"{{"tool":"t","success":true,"output":"{}"}}"#,
            "x".repeat(2000)
        ),
    );
    // Longer than any event of 100 bytes could be, even JSON-escaped: skipped, never held.
    let huge = line(
        "tool_call",
        "s",
        &format!(
            r#"{{"tool":"t","success":true,"output":"{}"}}"#,
            "y".repeat(70_000)
        ),
    );
    std::fs::write(
        &events,
        format!("{small}\n{big}\n{small}\n{huge}\n{small}\n"),
    )
    .unwrap();
    let run = |max: &str| {
        bin()
            .args(["run", "--print", "--max-event-bytes", max, "--workspace"])
            .arg(dir.path())
            .arg("--events")
            .arg(&events)
            .output()
            .unwrap()
    };

    let out = run("1000");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let name = events.display();
    assert!(
        stderr.contains(&format!(
            "{name}:2: event of 2007 bytes exceeds max_event_bytes (1000); raise it with --max-event-bytes"
        )),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("{name}:4: event of ")), "{stderr}");
    let r = report(&out.stderr);
    assert_eq!(r["input"]["oversize"], 2, "{r}");
    assert_eq!(r["input"]["bad_lines"], 0, "{r}");
    // Both reached `emit`, which counted them in the stats (and so in the metrics) as
    // oversize, apart from ring drops.
    assert_eq!(r["stats"]["oversize"], 2, "{r}");
    assert_eq!(r["stats"]["dropped"], 0, "{r}");
    assert_eq!(printed(&out.stdout).len(), 3);

    let out = run("100");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Line 4 was never read whole, so only `run` counts it.
    let r = report(&out.stderr);
    assert_eq!(
        (&r["input"]["oversize"], &r["stats"]["oversize"]),
        (&2.into(), &1.into()),
        "{r}"
    );
    assert!(
        stderr.contains(&format!(
            "{name}:4: event of more than 66136 bytes exceeds max_event_bytes (100)"
        )),
        "{stderr}"
    );

    // Raised, everything goes through and the exit code is 0.
    let out = run("100000");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(printed(&out.stdout).len(), 5);
}

/// docs/cli.md § `run`: `input.oversize` counts every line refused for its size; `stats.oversize`
/// only what reached `emit` and was refused there — not a line too long to be read whole, and
/// not an event nobody listens to (`emit` counts that one as `skipped` before measuring it).
#[test]
fn the_run_report_and_the_stats_count_oversize_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("big.ndjson");
    let payload = |output: &str| format!(r#"{{"tool":"t","success":true,"output":"{output}"}}"#);
    let small = line("tool_call", "s", &payload("ok"));
    let big = line("tool_call", "s", &payload(&"x".repeat(2000)));
    let huge = line("tool_call", "s", &payload(&"y".repeat(70_000)));
    std::fs::write(&events, format!("{small}\n{big}\n{huge}\n{small}\n")).unwrap();
    let run = |print: bool| {
        let mut cmd = bin();
        cmd.arg("run");
        if print {
            cmd.arg("--print");
        }
        let out = cmd
            .args(["--max-event-bytes", "100", "--workspace"])
            .arg(dir.path())
            .arg("--events")
            .arg(&events)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = report(&out.stderr);
        let n = |v: &Value| v.as_u64().unwrap();
        (
            n(&r["input"]["oversize"]),
            n(&r["stats"]["oversize"]),
            n(&r["stats"]["skipped"]),
        )
    };
    // A subscriber listens: the big event is refused by `emit` too; the huge line never got
    // there.
    assert_eq!(run(true), (2, 1, 0));
    // Nobody listens: `emit` skips every event before looking at its size.
    assert_eq!(run(false), (2, 0, 3));
}

#[test]
fn bench_counts_oversize_events_apart_from_ring_drops() {
    let out = bin()
        .args([
            "bench",
            "--events",
            "2000",
            "--payload-bytes",
            "5000000",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("over max_event_bytes (4194304): all are refused as oversize; raise it with --max-event-bytes"),
        "{stderr}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for phase in ["burst", "sustained"] {
        assert_eq!(v[phase]["oversize"], 2000, "{phase}: {v}");
        assert_eq!(v[phase]["ring_dropped"], 0, "{phase}: {v}");
    }
}

#[test]
fn validate_strict_makes_warnings_errors() {
    let dir = tempfile::tempdir().unwrap();
    // A bare command not on the sanitized PATH is a warning, not an error.
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks":{"error":[{"command":"surely-not-a-command-prx"}]}}"#,
    )
    .unwrap();
    let validate = |strict: bool| {
        let mut cmd = bin();
        cmd.args(["validate", "--workspace"]).arg(dir.path());
        if strict {
            cmd.arg("--strict");
        }
        cmd.output().unwrap()
    };
    let out = validate(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout.contains("warning: "), "{stdout}");
    let out = validate(true);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--strict: 1 warning(s), counted as errors"),
        "{out:?}"
    );
}

/// A policy id written twice, in policies.json and a plugin's `[policy] id` or in two
/// plugins: `validate` names both places, the later one as the error.
#[test]
fn validate_refuses_a_policy_id_used_in_policies_json_and_a_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    std::fs::write(
        ws.join("policies.json"),
        "{\"policies\": [\n  {\"id\": \"no-rm-rf\", \"on\": \"tool_call_start\", \"decision\": \"allow\"}\n]}",
    )
    .unwrap();
    let toml = |name: &str, id: &str| {
        format!(
            "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n[policy]\nid = \"{id}\"\non = [\"tool_call_start\"]\n"
        )
    };
    crate::plugins::install(ws, "guard", "policy_no_rm_rf", &toml("guard", "no-rm-rf"));
    crate::plugins::install(ws, "a-one", "policy_no_rm_rf", &toml("a-one", "twice"));
    crate::plugins::install(ws, "b-two", "policy_no_rm_rf", &toml("b-two", "twice"));
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(ws)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let line = |needle: &str| {
        stdout
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle} in\n{stdout}"))
            .to_string()
    };
    let guard = line("guard/plugin.toml:6:6: policy.id: ");
    assert!(
        guard.contains("\"no-rm-rf\"")
            && guard.contains(&format!("{}:2:", ws.join("policies.json").display()))
            && guard.contains("policies[0].id"),
        "{guard}"
    );
    let two = line("b-two/plugin.toml:6:6: policy.id: ");
    assert!(
        two.contains("\"twice\"") && two.contains("a-one/plugin.toml:6:6"),
        "{two}"
    );
    assert!(!stdout.contains("a-one/plugin.toml:6:6: "), "{stdout}");
}

#[test]
fn validate_checks_policies_json_and_warns_on_a_policy_denying_everything() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policies.json");
    let validate = |strict: bool| {
        let mut cmd = bin();
        cmd.args(["validate", "--workspace"]).arg(dir.path());
        if strict {
            cmd.arg("--strict");
        }
        cmd.output().unwrap()
    };
    std::fs::write(
        &file,
        "{\"policies\": [\n  {\"id\": \"all\", \"on\": \"tool_call_start\", \"decision\": \"deny\"}\n]}",
    )
    .unwrap();
    let out = validate(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        stdout.trim(),
        format!(
            "warning: {}:2:3: policies[0]: policy \"all\" denies everything at tool_call_start (no matcher, agent or when narrows it)",
            file.display()
        ),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: ok: 1 polic(ies), 1 enabled, 1 warning(s)",
            file.display()
        )),
        "{stderr}"
    );
    assert_eq!(validate(true).status.code(), Some(1));

    std::fs::write(
        &file,
        "{\"policies\": [\n  {\"id\": \"x\", \"on\": \"tool_call_start\", \"decision\": \"block\"}\n]}",
    )
    .unwrap();
    let out = validate(false);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "{}:2:52: policies[0].decision: \"block\" is not a decision: expected \"allow\", \"ask\" or \"deny\"",
            file.display()
        ),
    );
}

/// `policy test --run-guards`: the command policies run and the WASM policies are asked, each
/// within its deadline, and each one's answer, how it ended and its time are shown; the
/// decision is every source's. Without the flag only the rules decide, and nothing runs.
#[test]
fn policy_test_run_guards_runs_command_and_wasm_policies_and_shows_each_answer() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let ran = ws.join("ran");
    let script = |name: &str, body: &str| {
        let path = ws.join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho x >> {}\n{body}\n", ran.display()),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
        "asks.sh",
        r#"echo '{"decision": "ask", "reason": "the guard asks"}'"#,
    );
    script("slow.sh", "sleep 5");
    std::fs::write(
        ws.join("policies.json"),
        r#"{"policies": [
  {"id": "ls-ok", "on": "tool_call_start", "when": {"arguments.command": {"prefix": "ls"}}, "decision": "allow"},
  {"id": "asks", "on": "tool_call_start", "command": "./asks.sh"},
  {"id": "slow", "on": "tool_call_start", "command": "./slow.sh", "timeout_ms": 200}
]}"#,
    )
    .unwrap();
    crate::plugins::install(
        ws,
        "no-rm-rf",
        "policy_no_rm_rf",
        "[plugin]\nname = \"no-rm-rf\"\nversion = \"0.1.0\"\n\n[policy]\non = [\"tool_call_start\"]\n",
    );
    let test = |args: &[&str], command: &str| {
        let mut child = bin()
            .args(["policy", "test", "--workspace"])
            .arg(ws)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let payload = format!(r#"{{"tool":"Bash","arguments":{{"command":"{command}"}}}}"#);
        child
            .stdin
            .take()
            .unwrap()
            .write_all(payload.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // Rules only: allow by ls-ok, and no guard ran.
    let said = test(&[], "ls");
    assert!(said.contains("decision: allow by ls-ok"), "{said}");
    assert!(!ran.exists(), "a guard ran without --run-guards");

    let said = test(&["--run-guards"], "ls");
    let line = |needle: &str| {
        said.lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no line starting {needle:?} in\n{said}"))
            .to_string()
    };
    let asks = line("command  asks  ask  answered  (");
    assert!(asks.ends_with(" µs)"), "{asks}");
    let slow = line("command  slow  none  failed: timed out after 200 ms; on_error is none  (");
    assert!(slow.ends_with(" µs)"), "{slow}");
    line("wasm     no-rm-rf  none  answered nothing  (");
    assert!(
        said.contains("decision: ask by asks: the guard asks"),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 2);

    // The WASM policy denies: deny wins, reported with it.
    let said = test(&["--run-guards"], "rm -rf build");
    assert!(
        said.lines()
            .any(|l| l.starts_with("wasm     no-rm-rf  deny  answered  (")),
        "{said}"
    );
    assert!(
        said.contains("decision: deny by no-rm-rf: rm -rf is not allowed in this workspace"),
        "{said}"
    );
}

#[test]
fn policy_test_shows_which_policies_matched_and_the_decision() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policies.json"),
        r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell|run_shell_command|exec_command",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"},
  {"id": "ask-web", "on": "tool_call_start", "matcher": "WebFetch", "decision": "ask"}
]}"#,
    )
    .unwrap();
    let test = |args: &[&str], stdin: &str| {
        let mut child = bin()
            .args(["policy", "test", "--workspace"])
            .arg(dir.path())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = test(
        &[],
        r#"{"tool":"Bash","arguments":{"command":"rm -rf build"}}"#,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "match  no-rm-rf  deny  arguments.command held");
    assert_eq!(
        lines[1],
        "-      ask-web  ask  tool \"Bash\" does not match \"WebFetch\""
    );
    assert!(
        lines[2]
            .starts_with("decision: deny by no-rm-rf: rm -rf is not allowed in this workspace  ("),
        "{stdout}"
    );
    // Claude Code's own hook object.
    let out = test(
        &["--agent", "claude-code"],
        r#"{"hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"}}"#,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("-      no-rm-rf  deny  arguments.command does not match"),
        "{stdout}"
    );
    assert!(
        stdout.contains("decision: none (no policy decides; the agent's own flow)"),
        "{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("claude-code PreToolUse is tool_call_start"),
        "{out:?}"
    );
    // Not a payload: named, exit 2.
    let out = test(&[], "[1, 2");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stdin:1:"),
        "{out:?}"
    );
}

#[test]
fn fire_reads_its_payload_from_a_file_or_stdin_and_names_where_it_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("seen.json");
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks":{"tool_call":[{"command":"/bin/sh","args":["-c","cat > seen.json"],"stdin_json":true}]}}"#,
    )
    .unwrap();
    let fire = |payload: &str, stdin: Option<&str>, extra: &[&str]| {
        let mut child = bin()
            .args(["fire", "tool_call", "--payload", payload, "--workspace"])
            .arg(dir.path())
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().unwrap()
    };
    // A payload far too large for a command line (1 MiB), pretty-printed, from a file.
    let big = "z".repeat(1 << 20);
    let file = dir.path().join("payload.json");
    std::fs::write(
        &file,
        format!("{{\n  \"tool\": \"t\",\n  \"success\": true,\n  \"output\": \"{big}\",\n  \"extra\": [1, 2]\n}}\n"),
    )
    .unwrap();
    let out = fire(&format!("@{}", file.display()), None, &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let seen = std::fs::read_to_string(&out_file).unwrap();
    assert_eq!(
        seen,
        format!(r#"{{"tool":"t","success":true,"output":"{big}","extra":[1,2]}}"#)
    );
    // Over --max-event-bytes: refused before anything runs.
    let out = fire(
        &format!("@{}", file.display()),
        None,
        &["--max-event-bytes", "4096"],
    );
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("exceeds max_event_bytes (4096); raise it with --max-event-bytes"),
        "{out:?}"
    );
    // An error in the file names its line and column.
    std::fs::write(
        &file,
        "{\n  \"tool\": \"t\",\n  \"success\": \"yes\",\n  \"output\": \"\"\n}\n",
    )
    .unwrap();
    let out = fire(&format!("@{}", file.display()), None, &[]);
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "{}:3:14: payload.success: expected a boolean, found a string \"yes\"",
            file.display()
        )),
        "{out:?}"
    );
    // From stdin.
    std::fs::remove_file(&out_file).unwrap();
    let out = fire(
        "-",
        Some(r#"{"tool":"s","success":false,"output":"o"}"#),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap(),
        r#"{"tool":"s","success":false,"output":"o"}"#
    );
    let out = fire("@/nonexistent/prx-payload.json", None, &[]);
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--payload @/nonexistent/prx-payload.json: "),
        "{out:?}"
    );
}
