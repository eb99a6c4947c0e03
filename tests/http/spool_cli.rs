//! The spool under faults, with real `prx-hooks run` and `prx-hooks-send` processes: a signal
//! during the replay, a missing `--events` file, an answer lost after the server took the
//! events, a hundred senders at once, a sender over its file size limit, entries that are not
//! files, a linked state directory, a missing workspace. Nothing is lost, run twice or stuck.

use crate::send_cli::{BIN, Sent, Server, send};
use crate::stderr::Lines;
use crate::support::{lines, wait_for};
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SEND_BIN: &str = env!("CARGO_BIN_EXE_prx-hooks-send");

fn tool_call(session: &str, output: &str) -> String {
    json!({"event": "tool_call", "agent": "coder", "session": session,
           "payload": {"tool": "shell", "success": true, "output": output}})
    .to_string()
}

/// The spool's entries, oldest first.
fn entries(ws: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(ws.join(".prx-hooks/spool"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    out.retain(|p| p.extension().is_some_and(|e| e == "spool") && p.is_file());
    out.sort();
    out
}

/// Writes `n` entries the way `send` does (header line, then the body), named in order, older
/// than anything `send` writes now: event `i`'s id is `e<i>`, so its line's is `e<i>-1`.
fn plant(ws: &Path, n: usize, body: impl Fn(usize) -> String) {
    let dir = ws.join(".prx-hooks/spool");
    std::fs::create_dir_all(&dir).unwrap();
    for d in [ws.join(".prx-hooks"), dir.clone()] {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    for i in 0..n {
        let header = json!({"route": "events", "id": format!("e{i}"), "time": "2026-12-07T10:00:00.000001Z"});
        let text = format!("{header}\n{}\n", body(i));
        let name = format!("{:020}-{:010}.spool", 1_000_000_000_000u64 + i as u64, 1);
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// A workspace whose `tool_call` hook appends its event's id (`ZERO_HOOK_EVENT_ID`) to `ids`,
/// then runs `then`.
fn id_workspace(then: &str) -> (tempfile::TempDir, PathBuf) {
    let ws = tempfile::tempdir().unwrap();
    let ids = ws.path().join("ids");
    write_hooks(ws.path(), &ids, then);
    (ws, ids)
}

fn write_hooks(ws: &Path, ids: &Path, then: &str) {
    let script = format!("echo \"$ZERO_HOOK_EVENT_ID\" >> {}; {then}", ids.display());
    let hooks = json!({"hooks": {"tool_call": [
        {"command": "/bin/sh", "args": ["-c", script], "timeout_ms": 60_000, "max_concurrent": 1}
    ]}});
    std::fs::write(ws.join("hooks.json"), hooks.to_string()).unwrap();
}

fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Waits for `child` at most `limit`; kills it after that. Its exit code, or `None` if killed.
fn wait_at_most(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The JSON report, stderr's last JSON line.
fn report_of(lines: &[String]) -> Value {
    lines
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap_or(Value::Null)
}

/// SIGTERM while `run` replays a spool into a slow hook: it stopped only once the whole replay
/// was done (signals were not watched yet), and the chunk it had removed before emitting was
/// lost. Now the signal ends it within the drain, what did not run stays in the spool, and the
/// next `run` runs exactly the rest: every event once.
#[test]
fn sigterm_during_a_spool_replay_ends_run_and_the_next_run_runs_each_event_once() {
    let (ws, ids) = id_workspace("sleep 0.3");
    plant(ws.path(), 400, |i| tool_call("s", &i.to_string()));
    let mut run = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = Lines::of(&mut run);
    wait_for("a hook to start", || !lines(&ids).is_empty());
    sigterm(&run);
    let code = wait_at_most(&mut run, Duration::from_secs(20));
    assert!(code.is_some(), "run did not exit 20 s after SIGTERM");
    let report = report_of(&stderr.all());
    assert_eq!(report["spool"]["stopped"], json!(true), "{report}");
    // A hook the drain deadline killed counts as run (it started; whether its effect happened
    // is its own business: it has ZERO_HOOK_EVENT_ID to make it happen once).
    let killed = report["stats"]["shell"]["totals"]["killed"]
        .as_u64()
        .unwrap() as usize;
    // What had not run stays (entries go once every event in them ran).
    let first = lines(&ids).len();
    let kept = entries(ws.path()).len();
    assert!(first < 400 && kept > 0, "{first} ran, {kept} kept");

    write_hooks(ws.path(), &ids, "true");
    let server = Server::start(ws.path());
    wait_for("the rest to run", || entries(ws.path()).is_empty());
    let (_, report) = server.stop();
    let mut ran = lines(&ids);
    let n = ran.len();
    ran.sort();
    ran.dedup();
    assert_eq!(ran.len(), n, "no event twice: {report}");
    assert!(
        n <= 400 && n + killed >= 400,
        "every event once but those killed at the first drain's deadline ({killed}): {n}: {report}"
    );
    assert!(
        ran.iter()
            .all(|id| id.starts_with('e') && id.ends_with("-1"))
    );
}

/// SIGINT, or SIGTERM twice, while `run` replays a spool into a hook that would take a
/// minute: SIGINT stops the replay as SIGTERM does (the drain kills the hook at its end), a
/// second SIGTERM kills the running hook at once (said on stderr); either way `run` exits,
/// what did not run stays in the spool, and the next `run` runs exactly the rest.
#[test]
fn sigint_or_a_second_sigterm_during_a_spool_replay_ends_run_and_loses_nothing() {
    use nix::sys::signal::Signal;
    let cases: [&[Signal]; 2] = [&[Signal::SIGINT], &[Signal::SIGTERM, Signal::SIGTERM]];
    for signals in cases {
        let (ws, ids) = id_workspace("sleep 60");
        plant(ws.path(), 400, |i| tool_call("s", &i.to_string()));
        let mut run = Command::new(BIN)
            .args(["run", "--workspace"])
            .arg(ws.path())
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = Lines::of(&mut run);
        wait_for("a hook to start", || !lines(&ids).is_empty());
        for sig in signals {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.id() as i32), *sig).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        let code = wait_at_most(&mut run, Duration::from_secs(20));
        let all = stderr.all();
        assert!(
            code.is_some(),
            "{signals:?}: run did not exit 20 s after the signal:\n{}",
            all.join("\n")
        );
        let report = report_of(&all);
        assert_eq!(
            report["spool"]["stopped"],
            json!(true),
            "{signals:?}: {report}"
        );
        assert_eq!(
            report["stats"]["shell"]["totals"]["killed"],
            json!(1),
            "{signals:?}: the minute-long hook is killed: {report}"
        );
        let again = all
            .iter()
            .any(|l| l.contains("again: killing every running hook now"));
        assert_eq!(
            again,
            signals.len() == 2,
            "{signals:?}:\n{}",
            all.join("\n")
        );
        let first = lines(&ids).len();
        let kept = entries(ws.path()).len();
        assert!(
            first < 400 && kept > 0,
            "{signals:?}: {first} ran, {kept} kept"
        );

        write_hooks(ws.path(), &ids, "true");
        let server = Server::start(ws.path());
        wait_for("the rest to run", || entries(ws.path()).is_empty());
        let (_, report) = server.stop();
        let mut ran = lines(&ids);
        let n = ran.len();
        ran.sort();
        ran.dedup();
        assert_eq!(ran.len(), n, "{signals:?}: no event twice: {report}");
        assert!(
            (399..=400).contains(&n),
            "{signals:?}: every event once but the one killed: {n}: {report}"
        );
    }
}

/// `run --ingest` whose socket cannot be made fails to start after the spool was replayed:
/// the replayed events ran once and their entries are gone, or they stay; none is lost.
#[test]
fn a_failed_start_after_the_spool_replay_loses_nothing() {
    let (ws, ids) = id_workspace("true");
    plant(ws.path(), 3, |i| tool_call("s", &i.to_string()));
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--ingest")
        .arg(format!(
            "unix:{}",
            ws.path().join("no-such-dir/in.sock").display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("no-such-dir"), "{err}");
    let ran = lines(&ids).len();
    let kept = entries(ws.path()).len();
    assert_eq!(ran + kept, 3, "{ran} ran, {kept} kept: {err}");

    // The next run runs what stayed, and nothing twice.
    let server = Server::start(ws.path());
    wait_for("the rest to run", || entries(ws.path()).is_empty());
    wait_for("three runs", || lines(&ids).len() >= 3);
    let (_, report) = server.stop();
    let mut all = lines(&ids);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 3, "{:?}: {report}", lines(&ids));
    assert_eq!(lines(&ids).len(), 3, "none twice: {report}");
}

/// `run --events` naming a missing file: the spool was replayed into a hook system that then
/// exited without draining it, and its entries were gone. Now the file is opened first.
#[test]
fn a_missing_events_file_leaves_the_spool_as_it_was() {
    let (ws, ids) = id_workspace("true");
    plant(ws.path(), 3, |i| tool_call("s", &i.to_string()));
    let out = Command::new(BIN)
        .args(["run", "--workspace"])
        .arg(ws.path())
        .arg("--events")
        .arg(ws.path().join("missing.ndjson"))
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.ndjson"), "{err}");
    assert_eq!(entries(ws.path()).len(), 3, "{err}");
    assert!(lines(&ids).is_empty());
}

/// Messages printed by `run --print` so far, gathered from `rx`.
fn drain(rx: &std::sync::mpsc::Receiver<String>, into: &mut Vec<Value>) {
    while let Ok(l) = rx.try_recv() {
        if let Ok(v) = serde_json::from_str(&l) {
            into.push(v);
        }
    }
}

/// The server took 30,000 events but `send` gave up waiting for its answer after 40 ms and
/// spooled them, and the next `run` replayed all 30,000 again. Now each event keeps the id
/// it was first sent with, the server remembers the ids of what ran, and the replay counts
/// them as duplicates.
#[test]
fn events_a_server_took_whose_answer_was_lost_do_not_run_again() {
    let ws = tempfile::tempdir().unwrap();
    let n = 30_000;
    let body: String = (0..n)
        .map(|i| tool_call("s", &i.to_string()) + "\n")
        .collect();
    let (server, rx) = Server::start_printing(ws.path());
    let sent = send(ws.path(), &["--timeout", "40ms"], body.as_bytes());
    assert_eq!(sent.code, 0, "{sent:?}");
    assert_eq!(
        entries(ws.path()).len(),
        1,
        "the answer came in time: {sent:?}"
    );
    let mut printed = Vec::new();
    wait_for("the 30,000 events", || {
        drain(&rx, &mut printed);
        printed.len() == n
    });
    let first_id = printed[0]["event_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(first_id.ends_with("-1"), "{}", printed[0]);
    let (_, _) = server.stop();

    let (server, rx) = Server::start_printing(ws.path());
    wait_for("the replay", || entries(ws.path()).is_empty());
    let (_, report) = server.stop();
    let mut again = Vec::new();
    drain(&rx, &mut again);
    assert!(again.is_empty(), "{} ran again: {report}", again.len());
    assert_eq!(report["spool"]["duplicates"], json!(n), "{report}");
    assert_eq!(report["spool"]["removed"], json!(1), "{report}");
}

/// A TCP relay to `target` that holds each answer `delay` before passing it on, as a server
/// whose socket write is slow would.
fn slow_answers(target: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let Ok(server) = TcpStream::connect(target) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut s_out);
                let _ = s_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                let mut first = true;
                while let Ok(n) = s_in.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if std::mem::take(&mut first) {
                        std::thread::sleep(delay);
                    }
                    if c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_out.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

/// With `send`'s default 2 s timeout, a server whose answer takes 3 s to come back: the server
/// ran the hook, `send` spooled the event, and the next `run` ran it again. Now the replay
/// knows its id and counts it as a duplicate: the hook runs once.
#[test]
fn an_answer_held_past_sends_default_timeout_does_not_make_a_second_run() {
    let (ws, ids) = id_workspace("true");
    let server = Server::start(ws.path());
    let address = std::fs::read_to_string(ws.path().join(".prx-hooks/address")).unwrap();
    let target: std::net::SocketAddr = address
        .trim()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let relay = slow_answers(target, Duration::from_secs(3));
    let url = format!("http://{relay}");
    let sent = send(
        ws.path(),
        &["--url", &url],
        tool_call("s", "once").as_bytes(),
    );
    assert_eq!(sent.code, 0, "{sent:?}");
    assert_eq!(
        entries(ws.path()).len(),
        1,
        "the answer came in time: {sent:?}"
    );
    wait_for("the hook", || lines(&ids).len() == 1);
    let (_, _) = server.stop();

    let server = Server::start(ws.path());
    wait_for("the replay", || entries(ws.path()).is_empty());
    let (_, report) = server.stop();
    assert_eq!(
        lines(&ids).len(),
        1,
        "ran again: {:?}: {report}",
        lines(&ids)
    );
    assert_eq!(report["spool"]["duplicates"], json!(1), "{report}");
}

/// 100 senders at once into a spool of 10,000 entries with no server: 57 waited over a second
/// for the spool's lock, said their event was lost, exited 0, and nothing counted it. Now a
/// sender keeps its event without the lock; what the bound removes is counted.
#[test]
fn a_hundred_senders_at_once_lose_nothing_to_each_other() {
    let ws = tempfile::tempdir().unwrap();
    plant(ws.path(), 10_000, |i| tool_call("old", &i.to_string()));
    let senders: Vec<Child> = (0..100)
        .map(|i| {
            let mut c = Command::new(SEND_BIN)
                .arg("--workspace")
                .arg(ws.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let line = tool_call("new", &i.to_string());
            c.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
            c
        })
        .collect();
    for c in senders {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(!err.contains("lost"), "{err}");
    }
    let kept = entries(ws.path());
    let stats: Value = std::fs::read(ws.path().join(".prx-hooks/spool/stats.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(json!({}));
    let dropped = stats["dropped"].as_u64().unwrap_or(0) as usize;
    assert_eq!(
        kept.len() + dropped,
        10_100,
        "every entry kept or counted: {stats}"
    );
    let mut new = 0;
    for e in &kept {
        if std::fs::read_to_string(e).unwrap().contains("\"new\"") {
            new += 1;
        }
    }
    assert_eq!(new, 100, "every sender's event is among the newest, kept");
}

/// Runs `prx-hooks-send` with its file size limit at `limit` bytes.
fn send_limited(ws: &Path, limit: u64, stdin: &[u8]) -> Sent {
    let mut cmd = Command::new(SEND_BIN);
    cmd.arg("--workspace")
        .arg(ws)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE, limit, limit)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    Sent {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn tmp_files(ws: &Path) -> Vec<String> {
    std::fs::read_dir(ws.join(".prx-hooks/spool"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".tmp"))
                .collect()
        })
        .unwrap_or_default()
}

/// A sender whose write passed its file size limit was killed by SIGXFSZ mid-write and left
/// its `.tmp` file forever, outside the spool's bounds. Now it gets EFBIG, removes its file,
/// says the event is lost and counts it; and a temporary file of a sender that is gone is
/// removed and counted by the next one.
#[test]
fn a_sender_over_its_file_size_limit_leaves_nothing_behind_and_counts_the_loss() {
    let ws = tempfile::tempdir().unwrap();
    // A first entry makes the spool.
    assert_eq!(send(ws.path(), &[], tool_call("s", "0").as_bytes()).code, 0);
    let big = tool_call("s", &"x".repeat(4096));
    let sent = send_limited(ws.path(), 1024, big.as_bytes());
    assert_eq!(sent.code, 0, "{sent:?}");
    assert!(sent.stderr.contains("lost"), "{sent:?}");
    assert!(
        tmp_files(ws.path()).is_empty(),
        "{:?}",
        tmp_files(ws.path())
    );
    let stats = std::fs::read_to_string(ws.path().join(".prx-hooks/spool/stats.json")).unwrap();
    assert!(stats.contains("\"lost\":1"), "{stats}");

    // A sender that died mid-write: its pid is gone.
    let gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    let _ = gone.wait_with_output();
    let stale = format!(".1700000000000000000-{pid}.tmp");
    std::fs::write(
        ws.path().join(".prx-hooks/spool").join(&stale),
        "{\"route\"",
    )
    .unwrap();
    assert_eq!(send(ws.path(), &[], tool_call("s", "1").as_bytes()).code, 0);
    assert!(
        tmp_files(ws.path()).is_empty(),
        "{:?}",
        tmp_files(ws.path())
    );
    let stats = std::fs::read_to_string(ws.path().join(".prx-hooks/spool/stats.json")).unwrap();
    assert!(stats.contains("\"tmp_removed\":1"), "{stats}");
    assert_eq!(entries(ws.path()).len(), 2);
}

/// Two entries with bad lines: the replay's warnings numbered lines across entries (`:3:` for
/// the second line of the second entry). Now each names its entry's own line.
#[test]
fn replay_warnings_name_each_entrys_own_line() {
    let ws = tempfile::tempdir().unwrap();
    plant(ws.path(), 2, |i| {
        if i == 0 {
            "{\"event\":\"nope\"}".to_string()
        } else {
            format!("{}\n{{\"event\":\"nope\"}}", tool_call("s", "ok"))
        }
    });
    let names: Vec<String> = entries(ws.path())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut server = Server::start_with(ws.path(), &["--print"]);
    let first = server.lines.find(&format!("spool/{}:", names[0]));
    assert!(first.contains(&format!("spool/{}:1:", names[0])), "{first}");
    let second = server.lines.find(&format!("spool/{}:", names[1]));
    assert!(
        second.contains(&format!("spool/{}:2:", names[1])),
        "{second}"
    );
    server.stop();
}

/// `.prx-hooks` a link to a directory elsewhere: `send` refused it, but only after it had made
/// `spool/` inside the link's target. Now nothing is made through a link.
#[test]
fn a_linked_state_directory_is_refused_before_anything_is_made_in_its_target() {
    let ws = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), ws.path().join(".prx-hooks")).unwrap();
    let sent = send(ws.path(), &["--strict"], tool_call("s", "0").as_bytes());
    assert_eq!(sent.code, 1, "{sent:?}");
    assert!(sent.stderr.contains("symbolic link"), "{sent:?}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

/// `spool/zz.spool` a directory: removing it failed, which ended the replay after the chunk's
/// other entries had been removed, and said "nothing was replayed" — they were lost. Now it is
/// no entry: said, left alone, and the others replay and go.
#[test]
fn an_entry_name_that_is_a_directory_does_not_stop_the_replay() {
    let ws = tempfile::tempdir().unwrap();
    plant(ws.path(), 3, |i| tool_call("s", &i.to_string()));
    std::fs::create_dir(ws.path().join(".prx-hooks/spool/zz.spool")).unwrap();
    let (mut server, rx) = Server::start_printing(ws.path());
    let mut printed = Vec::new();
    wait_for("the three entries", || {
        drain(&rx, &mut printed);
        printed.len() == 3
    });
    server.lines.find("zz.spool is not a regular file");
    wait_for("their removal", || entries(ws.path()).is_empty());
    let (_, report) = server.stop();
    assert_eq!(report["spool"]["removed"], json!(3), "{report}");
    assert!(ws.path().join(".prx-hooks/spool/zz.spool").is_dir());
}

/// `send --workspace` naming a directory that does not exist made the whole tree and spooled
/// there. Now it makes nothing and says so once (exit 0; 1 with --strict).
#[test]
fn send_to_a_missing_workspace_makes_nothing_and_says_so_once() {
    let parent = tempfile::tempdir().unwrap();
    let ws = parent.path().join("no-such-workspace");
    let sent = send(&ws, &[], tool_call("s", "0").as_bytes());
    assert_eq!(sent.code, 0, "{sent:?}");
    assert_eq!(sent.stderr.lines().count(), 1, "{sent:?}");
    assert!(sent.stderr.contains("does not exist"), "{sent:?}");
    assert!(!ws.exists());
    let strict = send(&ws, &["--strict"], tool_call("s", "0").as_bytes());
    assert_eq!(strict.code, 1, "{strict:?}");
    assert!(!ws.exists());
}
