//! `run --ingest unix:PATH` against real `prx-hooks run` processes over real unix sockets: the
//! answers and the summary, a client that never reads, a final line without a newline, a
//! client that reads only after writing, SIGTERM while a client waits for room, a socket file
//! removed or replaced while serving, a connection no thread can be started for, and another
//! user racing to connect while the socket is made private.

use crate::send_cli::{BIN, Server, logging_workspace, payloads, tool_call};
use crate::stderr::Lines;
use crate::support::wait_for;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// How long a `run` gets to exit after SIGTERM: its drain is 2 s, the rest is slack for a
/// shared machine.
const EXIT_SLACK: Duration = Duration::from_secs(20);

/// A running `prx-hooks run --ingest unix:<ws>/ingest.sock` (no API).
struct Ingesting {
    child: Child,
    /// The `run` process (`child` itself, or the child of the program that started it).
    pid: i32,
    lines: Lines,
    sock: PathBuf,
}

impl Ingesting {
    fn start(ws: &Path) -> Ingesting {
        Ingesting::start_by(ws, Command::new(BIN), false)
    }

    /// `cmd` is `BIN`, or (`wrapped`) a program that runs `BIN` as its child with the
    /// arguments that follow.
    fn start_by(ws: &Path, mut cmd: Command, wrapped: bool) -> Ingesting {
        let sock = ws.join("ingest.sock");
        let mut child = cmd
            .args(["run", "--workspace"])
            .arg(ws)
            .arg("--ingest")
            .arg(format!("unix:{}", sock.display()))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = Lines::of(&mut child);
        lines.find("reading NDJSON on unix:");
        let pid = if wrapped {
            let me = child.id();
            let children =
                std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap();
            children.split_whitespace().next().unwrap().parse().unwrap()
        } else {
            child.id() as i32
        };
        Ingesting {
            child,
            pid,
            lines,
            sock,
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig).unwrap();
    }

    /// SIGTERM; fails unless `run` exits within [`EXIT_SLACK`]. The exit code, the final report
    /// (stderr's last JSON line) and every stderr line.
    fn stop(self) -> (i32, Value, Vec<String>) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.stop_after_signals()
    }

    /// As [`Ingesting::stop`], for signals already sent.
    fn stop_after_signals(mut self) -> (i32, Value, Vec<String>) {
        let deadline = Instant::now() + EXIT_SLACK;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                panic!(
                    "run did not exit within {EXIT_SLACK:?} of SIGTERM; its stderr:\n{}",
                    self.lines.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let all = self.lines.all();
        let report = all
            .iter()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or(Value::Null);
        (status.code().unwrap_or(-1), report, all)
    }
}

impl Drop for Ingesting {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.pid);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Every line the server writes on `conn` until it closes, as JSON.
fn read_answers(conn: UnixStream) -> Vec<Value> {
    BufReader::new(conn)
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

/// Writes `bytes` (on a thread: the server reads while it writes), shuts the writing half,
/// and returns every line the server answers.
fn exchange(sock: &Path, bytes: Vec<u8>) -> Vec<Value> {
    let conn = UnixStream::connect(sock).unwrap();
    let mut writing = conn.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        writing.write_all(&bytes).unwrap();
        writing.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let got = read_answers(conn);
    writer.join().unwrap();
    got
}

/// The sum of a summary's (or report's) line counts.
fn counted(summary: &Value) -> u64 {
    [
        "queued", "dropped", "skipped", "refused", "errors", "stopped",
    ]
    .iter()
    .map(|k| summary[k].as_u64().unwrap_or(0))
    .sum()
}

#[test]
fn the_ingest_socket_is_private_answers_each_refused_line_and_ends_with_a_summary() {
    let (ws, log) = logging_workspace("tool_call");
    let sock = ws.path().join("ingest.sock");
    let arg = format!("unix:{}", sock.display());
    let server = Server::start_with(ws.path(), &["--ingest", &arg]);
    wait_for("the socket", || sock.exists());
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut conn = UnixStream::connect(&sock).unwrap();
    let body = format!(
        "{}\nnot json\n{}\n",
        tool_call("u", "one"),
        tool_call("u", "two")
    );
    conn.write_all(body.as_bytes()).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let answers = read_answers(conn);
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        (&answers[0]["line"], &answers[0]["column"]),
        (&json!(2), &json!(2))
    );
    assert!(
        answers[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("not JSON")
    );
    assert_eq!(
        answers[1],
        json!({"queued": 2, "dropped": 0, "skipped": 0, "refused": 0, "errors": 1})
    );
    wait_for("both hook runs", || payloads(&log).len() == 2);
    let outputs: Vec<String> = payloads(&log)
        .iter()
        .map(|p| p["output"].as_str().unwrap().into())
        .collect();
    assert_eq!(outputs, ["one", "two"]);
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["ingest_socket"]["queued"], json!(2), "{report}");
    assert!(!sock.exists(), "the socket file is removed at exit");
}

#[test]
fn a_socket_client_that_never_reads_its_answers_costs_another_client_nothing() {
    let (ws, log) = logging_workspace("tool_call");
    let sock = ws.path().join("ingest.sock");
    let arg = format!("unix:{}", sock.display());
    let server = Server::start_with(ws.path(), &["--ingest", &arg]);
    wait_for("the socket", || sock.exists());
    // 50,000 bad lines, none of whose answers is ever read.
    let mut hostile = UnixStream::connect(&sock).unwrap();
    let garbage = "{\"event\":\"nope\"}\n".repeat(50_000);
    let writer = std::thread::spawn(move || {
        let _ = hostile.write_all(garbage.as_bytes());
        hostile
    });
    let mut good = UnixStream::connect(&sock).unwrap();
    let body: String = (0..200)
        .map(|i| format!("{}\n", tool_call("g", &i.to_string())))
        .collect();
    good.write_all(body.as_bytes()).unwrap();
    good.shutdown(std::net::Shutdown::Write).unwrap();
    let mut summary = String::new();
    good.read_to_string(&mut summary).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(summary.trim()).unwrap()["queued"],
        json!(200)
    );
    wait_for("the good client's 200 events", || {
        payloads(&log).len() == 200
    });
    let hostile = writer.join().unwrap();
    drop(hostile);
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
    let s = &report["ingest_socket"];
    assert_eq!(
        (&s["connections"], &s["queued"]),
        (&json!(2), &json!(200)),
        "{report}"
    );
    assert!(s["errors_unsent"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(s["errors"], json!(50_000), "{report}");
}

/// `run` stops serving and exits at SIGTERM whatever became of its socket file meanwhile, and
/// removes the file only if it is still the one it made.
#[test]
fn run_exits_on_sigterm_when_its_socket_file_was_removed_or_replaced() {
    for replaced in ["removed", "another socket", "a file"] {
        let ws = tempfile::tempdir().unwrap();
        let run = Ingesting::start(ws.path());
        let sock = run.sock.clone();
        let served = exchange(&sock, format!("{}\n", tool_call("s", "x")).into_bytes());
        assert_eq!(served.last().unwrap()["skipped"], json!(1), "{served:?}");
        std::fs::remove_file(&sock).unwrap();
        let _other = match replaced {
            "another socket" => Some(UnixListener::bind(&sock).unwrap()),
            "a file" => {
                std::fs::write(&sock, "not run's").unwrap();
                None
            }
            _ => None,
        };
        let (code, report, _) = run.stop();
        assert_eq!(code, 0, "{replaced}: {report}");
        assert_eq!(report["ingest_socket"]["connections"], json!(1), "{report}");
        match replaced {
            "removed" => assert!(!sock.exists()),
            "another socket" => assert!(
                std::fs::symlink_metadata(&sock)
                    .unwrap()
                    .file_type()
                    .is_socket(),
                "the other socket is left in place"
            ),
            _ => assert_eq!(std::fs::read_to_string(&sock).unwrap(), "not run's"),
        }
    }
}

/// Writes tool_call lines (1 KiB of output each) one `write` at a time until one fails; the
/// lines written whole, and whether a part of one more was taken.
fn write_until_refused(mut conn: UnixStream, lines: usize, progress: &AtomicU64) -> (u64, bool) {
    let output = "o".repeat(1024);
    for i in 0..lines {
        let line = format!("{}\n", tool_call(&format!("p{}", i % 8), &output));
        let mut at = 0;
        while at < line.len() {
            match conn.write(&line.as_bytes()[at..]) {
                Ok(0) | Err(_) => return (i as u64, at > 0),
                Ok(n) => at += n,
            }
        }
        progress.store(i as u64 + 1, Ordering::Relaxed);
    }
    (lines as u64, false)
}

/// A hook that takes a minute holds the shell queue past its busy mark, so the socket's
/// reader waits for room: the first SIGTERM still ends `run` within its drain (2 s; hooks
/// killed at its end), the client gets its summary with the lines not read counted as
/// `stopped`, and its later writes fail.
#[test]
fn sigterm_ends_run_within_its_drain_while_a_socket_client_waits_for_room() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = json!({"hooks": {"tool_call": [{
        "command": "/bin/sleep", "args": ["60"], "timeout_ms": 120000, "max_concurrent": 1
    }]}});
    std::fs::write(ws.path().join("hooks.json"), hooks.to_string()).unwrap();
    let run = Ingesting::start(ws.path());
    let conn = UnixStream::connect(&run.sock).unwrap();
    let reading = conn.try_clone().unwrap();
    let reader = std::thread::spawn(move || read_answers(reading));
    let progress = Arc::new(AtomicU64::new(0));
    let p = progress.clone();
    let writer = std::thread::spawn(move || write_until_refused(conn, 20_000, &p));
    // Waiting for room: the client's writes stop going through.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (u64::MAX, Instant::now());
    loop {
        let now = progress.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if now >= 128 && last.1.elapsed() > Duration::from_secs(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the client is never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, report, _) = run.stop();
    let (whole, partial) = writer.join().unwrap();
    let answers = reader.join().unwrap();
    let summary = answers.last().expect("a summary");
    let stopped = summary["stopped"].as_u64().unwrap_or(0);
    assert!(stopped >= 1, "{summary}");
    assert!(summary["queued"].as_u64().unwrap() >= 128, "{summary}");
    assert_eq!(counted(summary), whole + partial as u64, "{summary}");
    let s = &report["ingest_socket"];
    assert_eq!(s["stopped"], json!(stopped), "{report}");
    assert_eq!(counted(s), counted(summary), "{report}");
}

/// The same client held waiting for room, and SIGTERM twice: the second kills the minute-long
/// hook at once (said on stderr) and `run` exits; the client still gets its summary.
#[test]
fn a_second_sigterm_while_a_socket_client_waits_for_room_kills_at_once() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = json!({"hooks": {"tool_call": [{
        "command": "/bin/sleep", "args": ["60"], "timeout_ms": 120000, "max_concurrent": 1
    }]}});
    std::fs::write(ws.path().join("hooks.json"), hooks.to_string()).unwrap();
    let run = Ingesting::start(ws.path());
    let conn = UnixStream::connect(&run.sock).unwrap();
    let reading = conn.try_clone().unwrap();
    let reader = std::thread::spawn(move || read_answers(reading));
    let progress = Arc::new(AtomicU64::new(0));
    let p = progress.clone();
    let writer = std::thread::spawn(move || write_until_refused(conn, 20_000, &p));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (u64::MAX, Instant::now());
    loop {
        let now = progress.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if now >= 128 && last.1.elapsed() > Duration::from_secs(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the client is never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.signal(nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(100));
    run.signal(nix::sys::signal::Signal::SIGTERM);
    let (_, report, stderr) = run.stop_after_signals();
    let _ = writer.join().unwrap();
    let answers = reader.join().unwrap();
    let summary = answers.last().expect("a summary");
    assert!(summary.get("queued").is_some(), "{summary}");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("again: killing every running hook now")),
        "{stderr:#?}"
    );
    assert_eq!(
        report["stats"]["shell"]["totals"]["killed"],
        json!(1),
        "{report}"
    );
}

/// A last line the client ends with its shutdown instead of a newline is a line like any: a
/// bad one is answered, one of 5 MiB is counted as too large and answered.
#[test]
fn a_last_line_without_a_newline_is_counted_and_answered_whatever_its_size() {
    let ws = tempfile::tempdir().unwrap();
    let run = Ingesting::start(ws.path());
    let got = exchange(
        &run.sock,
        format!("{}\nnot json", tool_call("n", "x")).into_bytes(),
    );
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((&got[0]["line"], &got[0]["column"]), (&json!(2), &json!(2)));
    assert_eq!(
        got[1],
        json!({"queued": 0, "dropped": 0, "skipped": 1, "refused": 0, "errors": 1})
    );
    let got = exchange(&run.sock, vec![b'x'; 5 << 20]);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((&got[0]["line"], &got[0]["column"]), (&json!(1), &json!(1)));
    let message = got[0]["message"].as_str().unwrap();
    assert!(message.contains("exceeds max_event_bytes"), "{message}");
    assert_eq!(
        got[1],
        json!({"queued": 0, "dropped": 0, "skipped": 0, "refused": 0, "errors": 1})
    );
    let (code, report, _) = run.stop();
    assert_eq!(code, 0, "{report}");
    let s = &report["ingest_socket"];
    assert_eq!(
        (&s["errors"], &s["skipped"]),
        (&json!(2), &json!(1)),
        "{report}"
    );
}

/// 20,000 bad lines written before reading anything, and the reading begun only a while after
/// the shutdown of the writing half: each answer is read or counted as unsent (in the summary
/// and the report alike), and the summary comes last.
#[test]
fn a_client_that_reads_only_after_writing_gets_each_answer_or_its_count_and_the_summary() {
    let ws = tempfile::tempdir().unwrap();
    let run = Ingesting::start(ws.path());
    let mut conn = UnixStream::connect(&run.sock).unwrap();
    conn.write_all("{\"event\":\"nope\"}\n".repeat(20_000).as_bytes())
        .unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let got = read_answers(conn);
    let (code, report, _) = run.stop();
    assert_eq!(code, 0, "{report}");
    let s = &report["ingest_socket"];
    assert_eq!(s["errors"], json!(20_000), "{report}");
    let (summary, answers) = got.split_last().expect("a summary");
    let numbers: Vec<u64> = answers
        .iter()
        .map(|a| a["line"].as_u64().expect("an answer"))
        .collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "in order");
    let unsent = s["errors_unsent"].as_u64().unwrap();
    assert_eq!(
        answers.len() as u64 + unsent,
        20_000,
        "every answer read or counted: {report}"
    );
    assert!(summary.get("queued").is_some(), "the last line: {summary}");
    assert_eq!(summary["errors"], json!(20_000), "{summary}");
    assert_eq!(
        summary["errors_unsent"].as_u64().unwrap_or(0),
        unsent,
        "{summary}"
    );
}

/// The tests that run `prx-hooks` as another user need root.
fn root_or_skip(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("{test}: skipped: it runs a process as another user, which needs root");
    }
    root
}

/// A uid no account and no process has (a different one per call).
fn unused_uid() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(61_000);
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let taken: Vec<u32> = passwd
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    let in_use = |uid: u32| {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .is_some_and(|l| l.split_whitespace().skip(1).any(|u| u == uid.to_string()))
            })
        })
    };
    loop {
        let uid = NEXT.fetch_add(1, Ordering::Relaxed);
        if !taken.contains(&uid) && !in_use(uid) {
            return uid;
        }
    }
}

/// Sets `pid`'s soft RLIMIT_NPROC to `soft` (a number or `unlimited`) with `prlimit` run as
/// `uid`, the process's own user: lowering it, and raising it back up to the hard limit, takes
/// no privilege (root without CAP_SYS_RESOURCE may not touch another user's limits).
fn set_nproc(pid: i32, uid: u32, soft: &str) {
    let out = Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nproc={soft}:"))
        .uid(uid)
        .gid(uid)
        .output()
        .expect("prlimit (util-linux)");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pid`'s soft RLIMIT_NPROC, as `/proc/PID/limits` shows it.
fn nproc(pid: i32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max processes"))
        .unwrap();
    line.split_whitespace().nth(2).unwrap().to_string()
}

/// The threads of process `pid`.
fn threads(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `run` as a user of its own whose process limit (RLIMIT_NPROC) is lowered to the threads it
/// has: no reader thread can be started. Each connection is told so in one line and closed,
/// its slot freed (more than the 64 slots are refused one after another), counted, and said
/// once on stderr; with the limit lifted, the next client is served.
#[test]
fn a_connection_no_thread_can_be_started_for_is_told_counted_and_frees_its_slot() {
    if !root_or_skip("a_connection_no_thread_can_be_started_for_is_told_counted_and_frees_its_slot")
    {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let uid = unused_uid();
    std::os::unix::fs::chown(ws.path(), Some(uid), Some(uid)).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.uid(uid).gid(uid);
    let run = Ingesting::start_by(ws.path(), cmd, false);
    let was = nproc(run.pid);
    set_nproc(run.pid, uid, &threads(run.pid).to_string());
    for i in 0..70 {
        let conn = UnixStream::connect(&run.sock).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(conn);
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(_) if !line.is_empty() => {}
            got => {
                panic!("client {i}: no answer within 10 s ({got:?}): the connection is held unread")
            }
        }
        let answer: Value = serde_json::from_str(&line).unwrap();
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains("thread"), "client {i}: {answer}");
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "", "client {i}: one line, then closed");
    }
    set_nproc(run.pid, uid, &was);
    let served = exchange(&run.sock, format!("{}\n", tool_call("t", "x")).into_bytes());
    assert_eq!(served.last().unwrap()["skipped"], json!(1), "{served:?}");
    let (code, report, stderr) = run.stop();
    assert_eq!(code, 0, "{report}");
    let s = &report["ingest_socket"];
    assert_eq!(
        (&s["connections"], &s["refused_connections"]),
        (&json!(1), &json!(70)),
        "{report}"
    );
    let said = stderr
        .iter()
        .filter(|l| l.contains("cannot start a thread"))
        .count();
    assert_eq!(said, 1, "{stderr:#?}");
}

/// Not a test: the other user of `no_other_user_can_connect_while_run_makes_its_socket_private`,
/// which starts it. Tries to connect to every socket in the directory it is given (and in
/// the directories there it may enter) until `done` appears there.
#[test]
#[ignore = "started by no_other_user_can_connect_while_run_makes_its_socket_private"]
fn intruder() {
    let Some(dir) = std::env::var_os("PRX_HOOKS_INTRUDER_DIR").map(PathBuf::from) else {
        return;
    };
    // On stderr: the test harness writes its own lines to stdout.
    eprintln!("watching");
    let sockets = |dir: &Path| -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_socket() => out.push(e.path()),
                Ok(t) if t.is_dir() => out.extend(
                    std::fs::read_dir(e.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
                        .map(|e| e.path()),
                ),
                _ => {}
            }
        }
        out
    };
    while !dir.join("done").exists() {
        for path in sockets(&dir) {
            if UnixStream::connect(&path).is_ok() {
                eprintln!("connected {}", path.display());
                return;
            }
        }
        std::thread::yield_now();
    }
    eprintln!("never connected");
}

/// Whether `strace` can run here.
fn strace() -> bool {
    Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Another user of the directory's group tries to connect to every socket that appears there
/// while `run` (with umask 002, as in a user-private-group setup) makes its socket. Under
/// strace every chmod waits 300 ms first, which holds open whatever window there is between
/// binding the socket and making it 0600. The other user never connects.
#[test]
fn no_other_user_can_connect_while_run_makes_its_socket_private() {
    if !root_or_skip("no_other_user_can_connect_while_run_makes_its_socket_private") {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    // The group may enter and write, like a shared project directory.
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut intruder = Command::new(&exe)
        .args([
            "--exact",
            "socket_cli::intruder",
            "--ignored",
            "--nocapture",
        ])
        .env("PRX_HOOKS_INTRUDER_DIR", ws.path())
        .uid(unused_uid())
        .gid(nix::unistd::getgid().as_raw())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, said) = mpsc::channel();
    let out = intruder.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let watching = said.recv_timeout(Duration::from_secs(20));
    assert!(
        watching.as_ref().is_ok_and(|l| l == "watching"),
        "the other user's process did not start ({watching:?}): can any user run {}?",
        exe.display()
    );
    let traced = strace();
    let mut cmd = if traced {
        let mut c = Command::new("strace");
        c.args(["-f", "-qq", "-o", "/dev/null", "--seccomp-bpf"])
            .args(["-e", "trace=chmod,fchmodat"])
            .args(["-e", "inject=chmod,fchmodat:delay_enter=300000", BIN]);
        c
    } else {
        eprintln!("strace cannot run here: racing without holding the chmod window open");
        Command::new(BIN)
    };
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o002);
            Ok(())
        });
    }
    let run = Ingesting::start_by(ws.path(), cmd, traced);
    let mode = std::fs::metadata(&run.sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "with umask 002 too");
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(ws.path().join("done"), "").unwrap();
    let lines: Vec<String> = said.iter().collect();
    intruder.wait().unwrap();
    let (_, report, _) = run.stop();
    assert!(
        lines.iter().all(|l| !l.starts_with("connected")),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l == "never connected"), "{lines:?}");
    assert_eq!(report["ingest_socket"]["connections"], json!(0), "{report}");
    let left: Vec<_> = std::fs::read_dir(ws.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains("ingest.sock"))
        .collect();
    assert!(left.is_empty(), "nothing left behind: {left:?}");
}
