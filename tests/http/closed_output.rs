//! No command panics when its stdout or stderr is closed (`prx-hooks connect | head -2`):
//! every subcommand of both binaries, run as a real process whose output pipe has no reader,
//! does its work and ends with its own exit status — never 101, a panic's.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");
const SEND_BIN: &str = env!("CARGO_BIN_EXE_prx-hooks-send");

/// Which of the child's output pipes has no reader.
#[derive(Clone, Copy, Debug)]
enum Closed {
    Stdout,
    Stderr,
    Both,
}

const ALL: [Closed; 3] = [Closed::Stdout, Closed::Stderr, Closed::Both];

/// A pipe whose read end is already gone: every write to it fails with EPIPE.
fn reader_gone() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer.into()
}

/// What a run left: its status, and the stream that stayed open (to look for a panic's text).
struct Ran {
    status: ExitStatus,
    open: String,
}

fn spawn(cmd: &mut Command, closed: Closed, stdin: &[u8]) -> Child {
    let (out, err) = match closed {
        Closed::Stdout => (reader_gone(), Stdio::piped()),
        Closed::Stderr => (Stdio::piped(), reader_gone()),
        Closed::Both => (reader_gone(), reader_gone()),
    };
    let mut child = cmd
        .env_remove("PRX_HOOKS_TOKEN")
        .env("RUST_LOG", "info")
        .stdin(Stdio::piped())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin).unwrap();
    drop(pipe);
    child
}

/// Runs `cmd` with `closed` gone, waiting at most 60 s (generous: a command that loops on a
/// failed write never ends).
fn run(cmd: &mut Command, closed: Closed, stdin: &[u8]) -> Ran {
    let mut child = spawn(cmd, closed, stdin);
    let open = child
        .stdout
        .take()
        .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>)
        .or_else(|| {
            child
                .stderr
                .take()
                .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>)
        });
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(r) = open {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                text.push_str(&line);
                text.push('\n');
            }
        }
        text
    });
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("still running 60 s after start with {closed:?} closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ran {
        status,
        open: reader.join().unwrap(),
    }
}

#[track_caller]
fn assert_no_panic(what: &str, closed: Closed, ran: &Ran) {
    assert_ne!(
        ran.status.code(),
        Some(101),
        "{what} with {closed:?} closed panicked: {}",
        ran.open
    );
    assert!(
        ran.status.code().is_some(),
        "{what} with {closed:?} closed died of a signal: {:?}",
        ran.status
    );
    assert!(
        !ran.open.contains("panicked"),
        "{what} with {closed:?} closed: {}",
        ran.open
    );
}

fn prx(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    cmd
}

/// A workspace made by `init` (three hooks, sample events), quietly.
fn workspace(dir: &Path) -> std::path::PathBuf {
    let ws = dir.join("ws");
    let out = prx(&["init"]).arg(&ws).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    ws
}

#[test]
fn help_version_and_usage_errors_on_a_closed_output() {
    for closed in ALL {
        for args in [
            &["--help"][..],
            &["--version"],
            &["run", "--help"],
            &["no-such-command"],
            &["run", "--no-such-flag"],
        ] {
            let ran = run(&mut prx(args), closed, b"");
            assert_no_panic(&format!("prx-hooks {args:?}"), closed, &ran);
        }
        let ran = run(&mut Command::new(SEND_BIN), closed, b"");
        assert_no_panic("prx-hooks-send without --from", closed, &ran);
    }
}

#[test]
fn init_validate_fire_and_bench_do_their_work_on_a_closed_output() {
    let dir = tempfile::tempdir().unwrap();
    for (i, closed) in ALL.into_iter().enumerate() {
        let ws = dir.path().join(format!("ws-{i}"));
        let ran = run(prx(&["init"]).arg(&ws), closed, b"");
        assert_no_panic("init", closed, &ran);
        assert_eq!(ran.status.code(), Some(0));
        assert!(ws.join("hooks.json").is_file(), "init made no workspace");

        let ran = run(prx(&["validate", "--workspace"]).arg(&ws), closed, b"");
        assert_no_panic("validate", closed, &ran);
        assert_eq!(ran.status.code(), Some(0));
        std::fs::write(ws.join("hooks.json"), "{\"hooks\": [}").unwrap();
        let ran = run(prx(&["validate", "--workspace"]).arg(&ws), closed, b"");
        assert_no_panic("validate (an invalid file)", closed, &ran);
        assert_eq!(
            ran.status.code(),
            Some(1),
            "an invalid file is still exit 1"
        );
        std::fs::remove_file(ws.join("hooks.json")).unwrap();

        // A hook that leaves a mark: `fire` ran it whatever became of its own output.
        let mark = ws.join("fired");
        std::fs::write(
            ws.join("hooks.json"),
            serde_json::json!({"hooks": {"agent_end": [{"id": "mark",
                "command": "/bin/sh", "args": ["-c", format!("echo x >> {}", mark.display())]}]}})
            .to_string(),
        )
        .unwrap();
        let payload = br#"{"success":true,"messages_count":1}"#;
        let ran = run(
            prx(&["fire", "agent_end", "--workspace"]).arg(&ws),
            closed,
            payload,
        );
        assert_no_panic("fire", closed, &ran);
        assert_ne!(
            ran.status.code(),
            Some(2),
            "fire never exits 2 (an agent's block)"
        );
        assert!(mark.is_file(), "fire did not run the hook");

        for extra in [&[][..], &["--json"]] {
            let mut cmd = prx(&["bench", "--events", "20000"]);
            cmd.args(extra);
            let ran = run(&mut cmd, closed, b"");
            assert_no_panic(&format!("bench {extra:?}"), closed, &ran);
        }
    }
}

#[test]
fn connect_writes_the_settings_file_whatever_became_of_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path());
    for (i, closed) in ALL.into_iter().enumerate() {
        let project = dir.path().join(format!("project-{i}"));
        std::fs::create_dir(&project).unwrap();
        let settings = project.join(".claude/settings.json");
        let connect = |extra: &[&str]| {
            let mut cmd = prx(&["connect", "claude-code", "--project"]);
            // --absolute: this test's binaries are not on PATH, which a committable entry needs.
            cmd.arg(&project)
                .arg("--workspace")
                .arg(&ws)
                .arg("--absolute")
                .args(extra);
            cmd
        };
        let ran = run(&mut connect(&["--dry-run"]), closed, b"");
        assert_no_panic("connect --dry-run", closed, &ran);
        assert_eq!(ran.status.code(), Some(0));
        assert!(!settings.exists(), "--dry-run wrote the file");

        let ran = run(&mut connect(&[]), closed, b"");
        assert_no_panic("connect", closed, &ran);
        assert_eq!(ran.status.code(), Some(0));
        let written = std::fs::read_to_string(&settings).unwrap();
        assert!(written.contains("send"), "no entry written: {written}");
        let leftovers: Vec<_> = std::fs::read_dir(settings.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "settings.json" && !n.ends_with(".bak"))
            .collect();
        assert!(leftovers.is_empty(), "left behind: {leftovers:?}");

        // doctor reports on what connect wrote (problems: no server runs; exit 1 or 2, its own).
        let mut doctor = prx(&["doctor", "--project"]);
        doctor.arg(&project);
        let ran = run(&mut doctor, closed, b"");
        assert_no_panic("doctor", closed, &ran);
        assert!(matches!(ran.status.code(), Some(0..=2)), "{:?}", ran.status);

        let ran = run(&mut connect(&["--remove"]), closed, b"");
        assert_no_panic("connect --remove", closed, &ran);
        assert_eq!(ran.status.code(), Some(0));

        // policy test decides a payload from stdin and prints why.
        std::fs::write(
            ws.join("policies.json"),
            r#"{"policies": [{"id": "no-rm", "on": ["tool_call_start"], "matcher": "Bash", "when": {"arguments.command": {"regex": "rm -rf"}}, "decision": "deny", "reason": "no"}]}"#,
        )
        .unwrap();
        let mut policy = prx(&["policy", "test", "--workspace"]);
        policy.arg(&ws);
        let ran = run(
            &mut policy,
            closed,
            br#"{"tool": "Bash", "arguments": {"command": "rm -rf /"}}"#,
        );
        assert_no_panic("policy test", closed, &ran);
        std::fs::remove_file(ws.join("policies.json")).unwrap();
    }
}

#[test]
fn send_spools_on_a_closed_output_from_both_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path());
    let payload = br#"{"session_id":"s1","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"}}"#;
    let spooled = || {
        std::fs::read_dir(ws.join(".prx-hooks/spool"))
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".spool"))
                })
                .count()
            })
            .unwrap_or(0)
    };
    let mut expected = 0;
    for closed in ALL {
        for bin in [BIN, SEND_BIN] {
            let mut cmd = Command::new(bin);
            if bin == BIN {
                cmd.arg("send");
            }
            cmd.args(["--from", "claude-code", "--workspace"]).arg(&ws);
            let ran = run(&mut cmd, closed, payload);
            assert_no_panic(bin, closed, &ran);
            assert_eq!(ran.status.code(), Some(0), "{bin} {closed:?}: {}", ran.open);
            expected += 1;
            assert_eq!(
                spooled(),
                expected,
                "{bin} with {closed:?} closed spooled nothing"
            );
        }
        // A usage error with nowhere to say it is still exit 64, not a panic.
        let ran = run(Command::new(SEND_BIN).arg("--no-such-flag"), closed, b"");
        assert_no_panic("prx-hooks-send --no-such-flag", closed, &ran);
        assert_eq!(ran.status.code(), Some(64));
    }
}

#[test]
fn run_replays_its_events_and_tail_ends_when_no_one_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(dir.path());
    let log = ws.join("ran.log");
    std::fs::write(
        ws.join("hooks.json"),
        serde_json::json!({"hooks": {"tool_call_start": [{"id": "mark",
            "command": "/bin/sh", "args": ["-c", format!("echo x >> {}", log.display())]}]}})
        .to_string(),
    )
    .unwrap();
    let events: String = (0..50)
        .map(|i| {
            format!(
                "{{\"event\":\"tool_call_start\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{{\"tool\":\"t{i}\",\"arguments\":{{}}}}}}\n"
            )
        })
        .collect();
    let mut runs = 0;
    for closed in ALL {
        let ran = run(
            prx(&["run", "--print", "--events", "-", "--workspace"]).arg(&ws),
            closed,
            events.as_bytes(),
        );
        assert_no_panic("run --print", closed, &ran);
        assert_eq!(ran.status.code(), Some(0), "{}", ran.open);
        runs += 50;
        let ran_hooks = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count();
        assert_eq!(ran_hooks, runs, "run with {closed:?} closed skipped hooks");
    }

    // A server with events in its live stream, and `tail` printing into a closed pipe: it ends
    // (its output has no reader) without a panic.
    let mut server = prx(&[
        "run",
        "--events",
        "-",
        "--listen",
        "127.0.0.1:0",
        "--workspace",
    ])
    .arg(&ws)
    .env_remove("PRX_HOOKS_TOKEN")
    .env("RUST_LOG", "warn")
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut err = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("HTTP API on") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "run ended early");
    }
    std::thread::spawn(move || for _ in err.lines() {});
    let mut stdin = server.stdin.take().unwrap();
    stdin.write_all(events.as_bytes()).unwrap();
    stdin.flush().unwrap();
    for closed in [Closed::Stdout, Closed::Both] {
        let ran = run(
            prx(&["tail", "--last", "20", "--workspace"]).arg(&ws),
            closed,
            b"",
        );
        assert_no_panic("tail", closed, &ran);
    }
    drop(stdin);
    let _ = server.kill();
    let _ = server.wait();
}
