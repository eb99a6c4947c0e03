//! `prx-hooks send` as an agent's hook runs it, against a real `prx-hooks run --listen`: NDJSON
//! and flag events delivered, the spool when no server answers (replayed once by the next
//! `run`), bad input that never fails the agent, per-session order from concurrent senders.

use crate::stderr::Lines;
use crate::support::{lines, wait_for};
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

/// A running `prx-hooks run --listen 127.0.0.1:0` on `ws`.
pub(crate) struct Server {
    child: Child,
    pub lines: Lines,
}

impl Server {
    pub(crate) fn start(ws: &Path) -> Server {
        Server::spawn(ws, &[], Stdio::null())
    }

    /// With more `run` flags.
    pub(crate) fn start_with(ws: &Path, extra: &[&str]) -> Server {
        Server::spawn(ws, extra, Stdio::null())
    }

    /// With `--print`: the bus messages it writes, line by line.
    pub(crate) fn start_printing(ws: &Path) -> (Server, std::sync::mpsc::Receiver<String>) {
        let mut server = Server::spawn(ws, &["--print"], Stdio::piped());
        let out = server.child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (server, rx)
    }

    fn spawn(ws: &Path, extra: &[&str], stdout: Stdio) -> Server {
        let mut child = Command::new(BIN)
            .args(["run", "--workspace"])
            .arg(ws)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("PRX_HOOKS_TOKEN")
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = Lines::of(&mut child);
        lines.find("HTTP API on ");
        Server { child, lines }
    }

    /// SIGTERM; the exit code and the final report (stderr's last line).
    pub(crate) fn stop(mut self) -> (i32, Value) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        let all = self.lines.all();
        let report = all
            .iter()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or(Value::Null);
        (status.code().unwrap_or(-1), report)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a `send` did.
#[derive(Debug)]
pub(crate) struct Sent {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `prx-hooks send ARGS` with `stdin`, as an agent's hook would.
pub(crate) fn send(ws: &Path, args: &[&str], stdin: &[u8]) -> Sent {
    send_by(&[BIN, "send"], ws, args, stdin)
}

/// `prx-hooks-send`, the same command as a program of its own.
const SEND_BIN: &str = env!("CARGO_BIN_EXE_prx-hooks-send");

/// Runs `program ARGS` (`[BIN, "send"]` or `[SEND_BIN]`) with `stdin`.
fn send_by(program: &[&str], ws: &Path, args: &[&str], stdin: &[u8]) -> Sent {
    let mut child = Command::new(program[0])
        .args(&program[1..])
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env_remove("PRX_HOOKS_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let bytes = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&bytes);
    });
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    Sent {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A workspace whose hook appends every payload of `event` to `log`, one run at a time (in
/// the order the pipeline delivered them).
pub(crate) fn logging_workspace(event: &str) -> (tempfile::TempDir, PathBuf) {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let script = format!("cat >> {}; echo >> {}", log.display(), log.display());
    let hooks = json!({"hooks": {event: [
        {"command": "/bin/sh", "args": ["-c", script], "stdin_json": true, "max_concurrent": 1}
    ]}});
    std::fs::write(ws.path().join("hooks.json"), hooks.to_string()).unwrap();
    (ws, log)
}

pub(crate) fn payloads(log: &Path) -> Vec<Value> {
    lines(log)
        .iter()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(crate) fn tool_call(session: &str, output: &str) -> String {
    json!({"event": "tool_call", "agent": "coder", "session": session,
           "payload": {"tool": "shell", "success": true, "output": output}})
    .to_string()
}

fn spooled(ws: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(ws.join(".prx-hooks/spool"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    out.retain(|p| p.extension().is_some_and(|e| e == "spool"));
    out.sort();
    out
}

#[test]
fn ndjson_and_an_event_from_flags_reach_the_running_server_and_fire_the_hook() {
    let (ws, log) = logging_workspace("tool_call");
    let server = Server::start(ws.path());
    let s = send(
        ws.path(),
        &[],
        format!("{}\n", tool_call("s1", "piped")).as_bytes(),
    );
    assert_eq!((s.code, s.stdout.as_str(), s.stderr.as_str()), (0, "", ""));
    // A pretty-printed payload (line breaks and all) for one event given by flags.
    let pretty = "{\n  \"tool\": \"edit\",\n  \"success\": false,\n  \"output\": \"flags\"\n}\n";
    let s = send(
        ws.path(),
        &[
            "--event",
            "tool_call",
            "--agent",
            "coder",
            "--session",
            "s1",
        ],
        pretty.as_bytes(),
    );
    assert_eq!((s.code, s.stderr.as_str()), (0, ""));
    wait_for("two hook runs", || payloads(&log).len() == 2);
    let got = payloads(&log);
    assert_eq!(
        (
            got[0]["output"].as_str(),
            got[1]["output"].as_str(),
            &got[1]["success"]
        ),
        (Some("piped"), Some("flags"), &json!(false))
    );
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["spool"], Value::Null, "no spool was made");
}

#[test]
fn with_the_server_down_send_spools_exits_0_and_the_next_run_replays_each_event_once_in_order() {
    let (ws, log) = logging_workspace("tool_call");
    for i in 0..3 {
        let s = send(ws.path(), &[], tool_call("s", &i.to_string()).as_bytes());
        assert_eq!(s.code, 0, "{s:?}");
        // Kept is a success: nothing on stderr, which some agents read as a hook's output
        // when its stdout is empty.
        assert_eq!(s.stderr, "", "{s:?}");
    }
    let strict = send(ws.path(), &["--strict"], tool_call("s", "3").as_bytes());
    assert_eq!(strict.code, 1, "{strict:?}");
    assert!(
        strict.stderr.contains("no server") && strict.stderr.contains("spooled"),
        "with --strict it is said: {strict:?}"
    );
    assert_eq!(strict.stderr.lines().count(), 1, "{strict:?}");
    let files = spooled(ws.path());
    assert_eq!(files.len(), 4);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&ws.path().join(".prx-hooks/spool")), 0o700);
    assert!(files.iter().all(|f| mode(f) == 0o600));

    let server = Server::start(ws.path());
    wait_for("the four spooled events", || payloads(&log).len() == 4);
    let outputs: Vec<String> = payloads(&log)
        .iter()
        .map(|p| p["output"].as_str().unwrap().into())
        .collect();
    assert_eq!(outputs, ["0", "1", "2", "3"]);
    // An entry goes once its events' hooks have finished, a moment after they wrote the log.
    wait_for("the spool emptied", || spooled(ws.path()).is_empty());
    let (_, report) = server.stop();
    assert_eq!(
        (&report["spool"]["entries"], &report["spool"]["queued"]),
        (&json!(4), &json!(4)),
        "{report}"
    );
    // Once: the next run finds nothing to replay.
    let server = Server::start(ws.path());
    std::thread::sleep(Duration::from_millis(500));
    let (_, report) = server.stop();
    assert_eq!(report["spool"]["entries"], json!(0), "{report}");
    assert_eq!(payloads(&log).len(), 4);
}

#[test]
fn a_full_spool_drops_its_oldest_entries_counted_and_said_by_the_replay() {
    let (ws, log) = logging_workspace("tool_call");
    for i in 0..5 {
        let s = send(
            ws.path(),
            &["--spool-max-files", "3"],
            tool_call("s", &i.to_string()).as_bytes(),
        );
        assert_eq!(s.code, 0, "{s:?}");
    }
    assert_eq!(spooled(ws.path()).len(), 3);
    let mut server = Server::start(ws.path());
    wait_for("the three kept events", || payloads(&log).len() == 3);
    let outputs: Vec<String> = payloads(&log)
        .iter()
        .map(|p| p["output"].as_str().unwrap().into())
        .collect();
    assert_eq!(outputs, ["2", "3", "4"]);
    server.lines.find("2 entries");
    let (_, report) = server.stop();
    assert_eq!(report["spool"]["dropped_while_full"], json!(2), "{report}");
}

#[test]
fn bad_input_never_fails_the_agent_and_is_said_in_one_line_and_counted() {
    let (ws, _log) = logging_workspace("tool_call");
    let server = Server::start(ws.path());
    // Not JSON: the server refuses the line, counts it, send says it and exits 0.
    let s = send(ws.path(), &[], b"this is not json\n");
    assert_eq!(s.code, 0, "{s:?}");
    assert!(s.stderr.contains("line 1:2: not JSON"), "{s:?}");
    assert_eq!(s.stderr.lines().count(), 1);
    assert_eq!(send(ws.path(), &["--strict"], b"{}\n").code, 1);
    // 100 MB on stdin: refused after --max-bytes, nothing sent, counted in the spool's stats.
    let s = send(ws.path(), &[], &vec![b'x'; 100 << 20]);
    assert_eq!(s.code, 0, "{s:?}");
    assert!(s.stderr.contains("larger than --max-bytes"), "{s:?}");
    let stats: Value = serde_json::from_slice(
        &std::fs::read(ws.path().join(".prx-hooks/spool/stats.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stats["bad_input"], json!(1));
    // A usage error is not 2 (which agents read as "block").
    let s = send(ws.path(), &["--no-such-flag"], b"");
    assert_eq!(s.code, 64, "{s:?}");
    // A closed stdout changes nothing: send writes nothing there.
    let mut child = Command::new(BIN)
        .args(["send", "--workspace"])
        .arg(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child
        .stdin
        .take()
        .unwrap()
        .write_all(tool_call("s", "closed").as_bytes())
        .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let (_, report) = server.stop();
    assert_eq!(report["stats"]["dropped"], json!(0), "{report}");
}

#[test]
fn concurrent_senders_keep_each_sessions_order() {
    let (ws, _log) = logging_workspace("tool_call");
    let (server, printed) = Server::start_printing(ws.path());
    let (sessions, each) = (4, 15);
    std::thread::scope(|scope| {
        for s in 0..sessions {
            let ws = ws.path();
            scope.spawn(move || {
                for i in 0..each {
                    let sent = send(
                        ws,
                        &[],
                        tool_call(&format!("s{s}"), &i.to_string()).as_bytes(),
                    );
                    assert_eq!((sent.code, sent.stderr.as_str()), (0, ""));
                }
            });
        }
    });
    // `run --print` writes bus messages in the order the pipeline delivered them.
    let mut per: std::collections::HashMap<String, Vec<(u64, u64)>> = Default::default();
    for _ in 0..sessions * each {
        let line = printed
            .recv_timeout(Duration::from_secs(30))
            .expect("a printed event");
        let m: Value = serde_json::from_str(&line).unwrap();
        let output: u64 = m["payload"]["output"].as_str().unwrap().parse().unwrap();
        per.entry(m["session"].as_str().unwrap().into())
            .or_default()
            .push((m["seq"].as_u64().unwrap(), output));
    }
    let _ = server.stop();
    assert_eq!(per.len(), sessions);
    for (session, got) in per {
        let want: Vec<(u64, u64)> = (0..each as u64).map(|i| (i, i)).collect();
        assert_eq!(got, want, "{session}");
    }
}

#[test]
fn prx_hooks_send_the_program_does_what_prx_hooks_send_does() {
    let (ws, log) = logging_workspace("tool_call");
    let programs: [&[&str]; 2] = [&[BIN, "send"], &[SEND_BIN]];
    let server = Server::start(ws.path());
    for (i, program) in programs.iter().enumerate() {
        let s = send_by(
            program,
            ws.path(),
            &[],
            tool_call("s", &i.to_string()).as_bytes(),
        );
        assert_eq!((s.code, s.stdout.as_str(), s.stderr.as_str()), (0, "", ""));
    }
    wait_for("both events' hooks", || payloads(&log).len() == 2);
    let (code, _) = server.stop();
    assert_eq!(code, 0);
    // The same answers, byte for byte, to a usage error, --help's exit, a spool and --strict.
    let answers = |program: &[&str]| -> Vec<(i32, String)> {
        [
            (&["--no-such-flag"][..], ""),
            (&["--event", "tool_call"][..], "{}"),
            (&[][..], "{\"event\":\"nope\"}\n"),
            (&[][..], tool_call("s", "down").as_str()),
            (&["--strict"][..], tool_call("s", "strict").as_str()),
        ]
        .iter()
        .map(|(args, stdin)| {
            let s = send_by(program, ws.path(), args, stdin.as_bytes());
            // Each program names itself in clap's usage lines; spool entries have their own
            // names.
            let mut said = s.stderr.replace("prx-hooks-send", "prx-hooks send");
            if let (Some(a), Some(b)) = (said.find("/spool/"), said.find(".spool ")) {
                said.replace_range(a..b, "/spool/ENTRY");
            }
            (s.code, said)
        })
        .collect()
    };
    let (full, small) = (answers(programs[0]), answers(programs[1]));
    assert_eq!(
        full.iter().map(|a| a.0).collect::<Vec<_>>(),
        [64, 64, 0, 0, 1],
        "{full:?}"
    );
    for (a, b) in full.iter().zip(&small) {
        assert_eq!(a.0, b.0, "{a:?} / {b:?}");
        if a.0 == 64 {
            // clap's own wording; the first line is what matters.
            assert_eq!(a.1.lines().next(), b.1.lines().next());
        } else {
            assert_eq!(a, b);
        }
    }
    let help = send_by(&[SEND_BIN, "--help"], ws.path(), &[], b"");
    assert_eq!(help.code, 0, "{help:?}");
    assert!(help.stdout.contains("Exit codes:"), "{}", help.stdout);
    // Three each: `send` does not judge lines; the server does when it replays them.
    assert_eq!(spooled(ws.path()).len(), 6);
}

#[test]
fn run_whose_stderr_is_closed_keeps_serving_and_exits_0() {
    let (ws, log) = logging_workspace("tool_call");
    let mut child = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env_remove("PRX_HOOKS_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read up to the address line, then close the pipe (a terminal gone, `2>&1 | head -1`).
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("address written to") {
        use std::io::Read;
        assert_eq!(stderr.read(&mut byte).unwrap(), 1, "run ended early");
        seen.push(byte[0]);
    }
    drop(stderr);
    for i in 0..3 {
        let s = send(ws.path(), &[], tool_call("s", &i.to_string()).as_bytes());
        assert_eq!((s.code, s.stderr.as_str()), (0, ""), "{s:?}");
    }
    wait_for("three hook runs", || payloads(&log).len() == 3);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn an_agents_topic_carries_as_much_as_an_event_does() {
    // Cursor's beforeReadFile carries the file: 2 MiB is over the library's default publish
    // bound (1 MiB) and under the event bound `run` uses (4 MiB).
    let (ws, _log) = logging_workspace("tool_call");
    let (server, printed) = Server::start_printing(ws.path());
    let content = "x".repeat(2 << 20);
    let input = json!({
        "hook_event_name": "beforeReadFile",
        "conversation_id": "c1",
        "file_path": "/p/big.txt",
        "content": content,
    });
    let s = send(
        ws.path(),
        &["--from", "cursor"],
        input.to_string().as_bytes(),
    );
    assert_eq!((s.code, s.stderr.as_str()), (0, ""), "{s:?}");
    let line = std::iter::from_fn(|| printed.recv_timeout(Duration::from_secs(20)).ok())
        .find(|l| l.contains("prx.agent.cursor.beforeReadFile"))
        .expect("the topic was printed");
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        v["payload"]["content"].as_str().map(str::len),
        Some(2 << 20)
    );
    // Over the event bound it is refused, said, and counted.
    let huge = json!({"hook_event_name": "beforeReadFile", "conversation_id": "c1",
        "content": "y".repeat(5 << 20)});
    let s = send(
        ws.path(),
        &["--from", "cursor"],
        huge.to_string().as_bytes(),
    );
    assert_eq!(s.code, 0, "{s:?}");
    assert!(
        s.stderr.contains("refused") && s.stderr.contains("4194304"),
        "said, with the bound: {s:?}"
    );
    // The refusal was the sender's to hear: the server's own input was fine.
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
}

/// Runs `prx-hooks-send ARGS` and kills it after `limit`: (exit code or None if killed, how
/// long it took, stderr).
fn send_within(
    ws: &Path,
    args: &[&str],
    stdin: &[u8],
    limit: Duration,
) -> (Option<i32>, Duration, String) {
    let start = std::time::Instant::now();
    let mut child = Command::new(SEND_BIN)
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env_remove("PRX_HOOKS_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    (code, start.elapsed(), err)
}

/// The agent waits for `send`: a spool whose lock another process holds (a `run` replaying a
/// large spool into a full ring holds it while it waits for room; any process can take it)
/// must not hold the agent past `--timeout`. It blocked on the lock for as long as it was held.
#[test]
fn a_held_spool_lock_does_not_hold_the_agent() {
    let ws = tempfile::tempdir().unwrap();
    // A first send makes the spool (no server: spooled).
    let s = send(ws.path(), &[], tool_call("s", "0").as_bytes());
    assert_eq!(s.code, 0, "{s:?}");
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(ws.path().join(".prx-hooks/spool/.lock"))
        .unwrap();
    lock.lock().unwrap();
    let (code, took, err) = send_within(
        ws.path(),
        &["--timeout", "500ms"],
        tool_call("s", "1").as_bytes(),
        Duration::from_secs(10),
    );
    drop(lock);
    assert_eq!(code, Some(0), "killed after {took:?}: {err}");
    assert!(took < Duration::from_secs(5), "{took:?}: {err}");
}

/// A stale address file naming a port another program now serves: a 200 that is not an
/// ingest report is not a delivery. `send` took it for one (exit 0 even with --strict,
/// nothing said, nothing spooled: the event was lost silently).
#[test]
fn a_200_that_is_not_a_report_is_not_taken_for_a_delivery() {
    let ws = tempfile::tempdir().unwrap();
    // A server that answers every request 200 "ok" (a dev server, a health endpoint...).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let mut seen = Vec::new();
                while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                    match std::io::Read::read(&mut conn, &mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            });
        }
    });
    let dir = ws.path().join(".prx-hooks");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (name, text) in [
        ("address", format!("http://127.0.0.1:{port}\n")),
        ("token", "0123456789abcdef0123456789abcdef\n".to_string()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let s = send(ws.path(), &["--strict"], tool_call("s", "lost").as_bytes());
    assert_eq!(s.code, 1, "not delivered: {s:?}");
    assert_eq!(spooled(ws.path()).len(), 1, "kept for the next run: {s:?}");
}

/// `-v`/`-q` are global flags of `prx-hooks`, so `prx-hooks send -q` is a valid hook
/// command; `prx-hooks-send -q` was a usage error (64, nothing sent).
#[test]
fn prx_hooks_send_takes_the_verbosity_flags_prx_hooks_send_takes() {
    let ws = tempfile::tempdir().unwrap();
    for flag in ["-v", "-q", "-qq", "--quiet"] {
        let full = send_by(
            &[BIN, "send"],
            ws.path(),
            &[flag],
            tool_call("s", flag).as_bytes(),
        );
        let small = send_by(
            &[SEND_BIN],
            ws.path(),
            &[flag],
            tool_call("s", flag).as_bytes(),
        );
        assert_eq!(full.code, 0, "{flag}: {full:?}");
        assert_eq!(small.code, full.code, "{flag}: {small:?}");
    }
    // Both spooled each (no server).
    assert_eq!(spooled(ws.path()).len(), 8);
}

/// A server killed with SIGKILL leaves its address file; when another program then listens
/// on that port, `send` must not hand it the workspace's token: the address is stale once the
/// process that wrote it is gone.
#[test]
fn the_address_of_a_server_killed_with_sigkill_gets_no_token() {
    let (ws, _log) = logging_workspace("tool_call");
    let mut server = Server::start(ws.path());
    let address = std::fs::read_to_string(ws.path().join(".prx-hooks/address")).unwrap();
    let port: u16 = address.trim().rsplit(':').next().unwrap().parse().unwrap();
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    assert!(
        ws.path().join(".prx-hooks/address").exists(),
        "SIGKILL left it"
    );
    // Another program takes the port and records what it hears.
    let listener = (0..200)
        .find_map(|_| {
            std::net::TcpListener::bind(("127.0.0.1", port))
                .map_err(|_| std::thread::sleep(Duration::from_millis(10)))
                .ok()
        })
        .expect("the port is free again");
    listener.set_nonblocking(true).unwrap();
    let s = send(ws.path(), &["--strict"], tool_call("s", "x").as_bytes());
    assert_eq!(s.code, 1, "{s:?}");
    assert!(
        s.stderr.contains("no server") && s.stderr.contains("spooled"),
        "{s:?}"
    );
    assert!(
        listener.accept().is_err(),
        "send connected to the stranger on port {port}"
    );
    assert_eq!(spooled(ws.path()).len(), 1);
}

/// Gemini CLI reads a hook's stdout as its answer and, when stdout is empty, its stderr: a
/// `send --from` for an agent that reads stdout answers `{}` there and says nothing on stderr
/// on every path that succeeded (spooled or delivered), from both programs. Kiro CLI adds a
/// hook's stdout to the model's context: nothing there. A failed `--strict` send answers
/// nothing.
#[test]
fn send_from_an_agent_that_reads_stdout_answers_an_empty_object_and_keeps_stderr_empty() {
    let ws = tempfile::tempdir().unwrap();
    let gemini = r#"{"session_id":"g","hook_event_name":"BeforeTool","timestamp":"2026-12-07T10:00:00.000Z","cwd":"/p","tool_name":"read_file","tool_input":{"absolute_path":"/p/a"}}"#;
    let kiro = r#"{"hook_event_name":"preToolUse","cwd":"/p","tool_name":"fs_read","tool_input":{"path":"a"}}"#;
    let programs: [&[&str]; 2] = [&[BIN, "send"], &[SEND_BIN]];
    let run = |program: &[&str], args: &[&str], stdin: &str| {
        let s = send_by(program, ws.path(), args, stdin.as_bytes());
        (s.code, s.stdout, s.stderr)
    };
    let answer = |code: i32, stdout: &str| (code, stdout.to_string(), String::new());
    for program in programs {
        // No server: spooled, a success.
        assert_eq!(
            run(program, &["--from", "gemini-cli"], gemini),
            answer(0, "{}\n")
        );
        assert_eq!(
            run(program, &["--from", "kiro", "--session", "k"], kiro),
            answer(0, "")
        );
        let (code, stdout, stderr) = run(program, &["--from", "gemini-cli", "--strict"], gemini);
        assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
        assert!(stderr.contains("spooled to"), "{stderr}");
    }
    assert_eq!(spooled(ws.path()).len(), 6);
    let server = Server::start(ws.path());
    wait_for("the spool replayed", || spooled(ws.path()).is_empty());
    for program in programs {
        assert_eq!(
            run(program, &["--from", "gemini-cli", "--strict"], gemini),
            answer(0, "{}\n")
        );
        assert_eq!(
            run(program, &["--from", "kiro", "--session", "k"], kiro),
            answer(0, "")
        );
    }
    let (code, _) = server.stop();
    assert_eq!(code, 0);
}

/// A turn's end is two lines (`turn_complete`, then `agent_end`): spooled while no server
/// answered, the replay runs both, each once, with the agent's own time where it gives one
/// (Gemini CLI's `timestamp`).
#[test]
fn a_spooled_turns_end_replays_as_turn_complete_then_agent_end() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let mut hooks = serde_json::Map::new();
    for event in ["turn_complete", "agent_end"] {
        let script = format!(
            "printf '%s %s\\n' {event} \"$ZERO_HOOK_ORIGIN_TIMESTAMP\" >> {}",
            log.display()
        );
        hooks.insert(
            event.into(),
            json!([{"command": "/bin/sh", "args": ["-c", script], "max_concurrent": 1}]),
        );
    }
    std::fs::write(
        ws.path().join("hooks.json"),
        json!({ "hooks": hooks }).to_string(),
    )
    .unwrap();
    let stop = r#"{"session_id":"g","hook_event_name":"AfterAgent","timestamp":"2026-12-07T10:00:00.250Z","prompt":"hi","prompt_response":"done","stop_hook_active":false}"#;
    let s = send(ws.path(), &["--from", "gemini-cli"], stop.as_bytes());
    assert_eq!(
        (s.code, s.stdout.as_str(), s.stderr.as_str()),
        (0, "{}\n", "")
    );
    assert_eq!(spooled(ws.path()).len(), 1);
    let server = Server::start(ws.path());
    wait_for("both hooks", || lines(&log).len() == 2);
    let mut got = lines(&log);
    got.sort();
    assert_eq!(
        got,
        [
            "agent_end 2026-12-07T10:00:00.250Z",
            "turn_complete 2026-12-07T10:00:00.250Z"
        ]
    );
    let (code, _) = server.stop();
    assert_eq!(code, 0);
    assert_eq!(lines(&log).len(), 2, "each ran once");
}
