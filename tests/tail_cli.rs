//! `prx-hooks tail` as a real process following a real `prx-hooks run --listen` (README.md §
//! `tail`): events and runs as lines and as JSON, finding the server from the workspace (TCP
//! and unix socket), reconnecting with `Last-Event-ID` through a real TCP proxy the test cuts,
//! a restarted server told once on stderr, and the exit codes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

/// A child process with its stdout and stderr read line by line on threads of their own.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
    seen_out: Vec<String>,
    seen_err: Vec<String>,
}

fn lines_of(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        cmd.env_remove("PRX_HOOKS_TOKEN")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let out = lines_of(child.stdout.take().unwrap());
        let err = lines_of(child.stderr.take().unwrap());
        Proc {
            stdin: child.stdin.take(),
            child,
            out,
            err,
            seen_out: Vec::new(),
            seen_err: Vec::new(),
        }
    }

    /// `prx-hooks run` over `ws`, emitting what is written to its stdin, serving `listen`.
    fn run(ws: &Path, listen: &str) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--print", "--events", "-", "--workspace"])
            .arg(ws)
            .args(["--listen", listen]);
        let mut p = Proc::spawn(cmd);
        p.err_line("HTTP API on ");
        p
    }

    fn tail(ws: &Path, args: &[&str]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.arg("tail").arg("--workspace").arg(ws).args(args);
        Proc::spawn(cmd)
    }

    fn emit(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn wait(
        rx: &mpsc::Receiver<String>,
        seen: &mut Vec<String>,
        what: &str,
        needle: &str,
    ) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) => {
                    seen.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(_) => panic!("no {what} line with {needle:?}; saw:\n{}", seen.join("\n")),
            }
        }
    }

    fn out_line(&mut self, needle: &str) -> String {
        Proc::wait(&self.out, &mut self.seen_out, "stdout", needle)
    }

    fn err_line(&mut self, needle: &str) -> String {
        Proc::wait(&self.err, &mut self.seen_err, "stderr", needle)
    }

    /// Waits for the process to exit (at most 30 s); its code and what it printed.
    fn exit(mut self) -> (i32, Vec<String>, Vec<String>) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "still running; stderr:\n{}",
                self.seen_err.join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.seen_out.extend(self.out.iter());
        self.seen_err.extend(self.err.iter());
        (
            status.code().unwrap_or(-1),
            std::mem::take(&mut self.seen_out),
            std::mem::take(&mut self.seen_err),
        )
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tool_call(output: &str) -> String {
    serde_json::json!({
        "event": "tool_call", "agent": "coder", "session": "demo-1",
        "payload": {"tool": "shell", "success": false, "output": output}
    })
    .to_string()
}

/// The address `run` wrote (`http://127.0.0.1:PORT`).
fn address(ws: &Path) -> String {
    std::fs::read_to_string(ws.join(".prx-hooks/address"))
        .unwrap()
        .trim()
        .to_string()
}

fn workspace(hooks_json: &str) -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hooks.json"), hooks_json).unwrap();
    ws
}

#[test]
fn an_emitted_event_and_its_run_arrive_in_tail_as_lines_and_as_json() {
    let ws = workspace(
        r#"{"hooks": {"tool_call": [{"id": "fails", "command": "/bin/sh", "args": ["-c", "echo nope >&2; exit 4"]}]}}"#,
    );
    let mut run = Proc::run(ws.path(), "127.0.0.1:0");
    let mut text = Proc::tail(ws.path(), &["--runs", "--color", "never"]);
    let mut json = Proc::tail(ws.path(), &["--json", "prx.lifecycle.tool_call"]);
    text.err_line("following http://127.0.0.1:");
    json.err_line("following");

    // Agent-controlled text with an escape sequence and a newline in it.
    run.emit(&tool_call("FAILED\x1b[2J 41 passed;\n1 failed"));
    let line = text.out_line("tool_call");
    assert!(
        line.contains(
            "  coder/demo-1  tool_call        shell failed: FAILED\\u{1b}[2J 41 passed;\\n1 failed"
        ),
        "{line}"
    );
    assert!(
        !line.contains('\x1b'),
        "no escape sequence reaches the terminal: {line:?}"
    );
    let (clock, _) = line.split_once("  ").unwrap();
    assert_eq!(clock.len(), "21:24:31.708".len(), "{line}");
    let run_line = text.out_line("hook fails");
    assert!(
        run_line.contains("run  hook fails (tool_call)  exit 4")
            && run_line.ends_with("stderr: nope"),
        "{run_line}"
    );

    // --json: the bus message exactly as `run --print` writes it.
    let printed = run.out_line("prx.lifecycle.tool_call");
    let tailed = json.out_line("prx.lifecycle.tool_call");
    assert_eq!(tailed, printed);
    // The pattern leaves other events out; runs are not asked for.
    run.emit(r#"{"event":"turn_complete","agent":"coder","session":"demo-1"}"#);
    run.emit(&tool_call("second"));
    let next = json.out_line("prx.lifecycle");
    assert!(next.contains("\"output\":\"second\""), "{next}");
    assert!(
        !json
            .seen_out
            .iter()
            .any(|l| l.contains("turn_complete") || l.contains("\"type\":\"run\""))
    );

    // `--json --runs`: runs carry a "type".
    let mut both = Proc::tail(ws.path(), &["--json", "--only-runs"]);
    both.err_line("following");
    run.emit(&tool_call("third"));
    let r: serde_json::Value = serde_json::from_str(&both.out_line("\"type\":\"run\"")).unwrap();
    assert_eq!(
        (r["id"].as_str(), r["code"].as_i64()),
        (Some("fails"), Some(4))
    );
    assert!(
        !both.seen_out.iter().any(|l| l.contains("\"topic\"")),
        "--only-runs shows no bus message"
    );
}

/// A TCP proxy to an upstream that can be changed, whose connections the test can cut and
/// whose door it can close (connections accepted while closed are dropped at once).
struct Proxy {
    addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    open: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = Proxy {
            addr: listener.local_addr().unwrap(),
            upstream: Arc::new(Mutex::new(upstream)),
            open: Arc::new(AtomicBool::new(true)),
            conns: Arc::default(),
        };
        let (up, open, conns) = (p.upstream.clone(), p.open.clone(), p.conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if !open.load(Ordering::SeqCst) {
                    continue;
                }
                let target = *up.lock().unwrap();
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                conns
                    .lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        p
    }

    /// Closes the door and cuts every connection.
    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn reopen(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
        self.open.store(true, Ordering::SeqCst);
    }
}

fn socket_addr(address: &str) -> SocketAddr {
    address.strip_prefix("http://").unwrap().parse().unwrap()
}

#[test]
fn tail_reconnects_with_last_event_id_losing_nothing_and_says_once_when_the_server_restarted() {
    let ws = workspace(r#"{"hooks": {}}"#);
    let mut run = Proc::run(ws.path(), "127.0.0.1:0");
    let proxy = Proxy::start(socket_addr(&address(ws.path())));
    let url = format!("http://{}", proxy.addr);
    let mut tail = Proc::tail(ws.path(), &["--json", "--url", &url]);
    tail.err_line("following");
    run.emit(&tool_call("one"));
    tail.out_line("\"one\"");

    // Cut: what is emitted while the door is closed comes after reconnecting, once.
    proxy.cut();
    tail.err_line("retrying");
    run.emit(&tool_call("two"));
    run.emit(&tool_call("three"));
    run.out_line("\"three\"");
    proxy.reopen(socket_addr(&address(ws.path())));
    tail.err_line("reconnected to");
    tail.out_line("\"three\"");
    let outputs: Vec<String> = tail
        .seen_out
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["payload"]["output"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        outputs,
        ["one", "two", "three"],
        "nothing lost, nothing twice"
    );
    assert!(
        !tail.seen_err.iter().any(|l| l.contains("lost")),
        "{:?}",
        tail.seen_err
    );

    // A restarted server is another instance: said once, then followed.
    proxy.cut();
    run.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, _, _) = run.exit();
    assert_eq!(code, 0);
    let mut run = Proc::run(ws.path(), "127.0.0.1:0");
    proxy.reopen(socket_addr(&address(ws.path())));
    let said = tail.err_line("the server restarted");
    assert!(
        said.contains("events emitted meanwhile were lost"),
        "{said}"
    );
    run.emit(&tool_call("four"));
    tail.out_line("\"four\"");
    let gap: serde_json::Value = serde_json::from_str(
        tail.seen_out
            .iter()
            .find(|l| l.contains("\"type\":\"gap\""))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(gap["reason"], "other_instance");
    assert_eq!(
        tail.seen_err
            .iter()
            .filter(|l| l.contains("restarted"))
            .count(),
        1
    );
}

#[test]
fn tail_finds_a_unix_socket_server_from_the_workspace_and_follows_it_across_restarts() {
    let ws = workspace(r#"{"hooks": {}}"#);
    let sock = ws.path().join("api.sock");
    let listen = format!("unix:{}", sock.display());
    let mut run = Proc::run(ws.path(), &listen);
    let mut tail = Proc::tail(ws.path(), &["--color", "never"]);
    tail.err_line(&format!("following unix:{}", sock.display()));
    run.emit(&tool_call("over the socket"));
    tail.out_line("over the socket");
    // The server goes away (and removes its address file); tail waits, then follows the next.
    run.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(run.exit().0, 0);
    tail.err_line("retrying");
    let mut run = Proc::run(ws.path(), &listen);
    tail.err_line("reconnected to unix:");
    run.emit(&tool_call("after the restart"));
    tail.out_line("after the restart");
}

#[test]
fn tail_last_shows_what_run_did_before_tail_connected() {
    let ws = workspace(r#"{"hooks": {"error": [{"id": "errs", "command": "/bin/true"}]}}"#);
    let mut run = Proc::run(ws.path(), "127.0.0.1:0");
    run.emit(&tool_call("before anyone watched"));
    run.emit(r#"{"event":"error","agent":"coder","session":"demo-1","payload":{"component":"tool","message":"boom"}}"#);
    run.out_line("prx.lifecycle.error");
    let mut tail = Proc::tail(ws.path(), &["--runs", "--last", "10", "--color", "never"]);
    tail.out_line("before anyone watched");
    tail.out_line("hook errs (error)  ok");
}

#[test]
fn tail_exit_codes() {
    let ws = workspace(r#"{"hooks": {}}"#);
    // No server, and told to give up: 1.
    let (code, _, err) = Proc::tail(ws.path(), &["--give-up", "1s"]).exit();
    assert_eq!(code, 1, "{err:?}");
    assert!(
        err[0].contains("waiting for a server") && err[0].contains(".prx-hooks/address"),
        "{err:?}"
    );
    assert!(err.last().unwrap().contains("giving up"), "{err:?}");
    // Usage errors: 2.
    let (code, _, err) = Proc::tail(ws.path(), &["--url", "https://127.0.0.1:1"]).exit();
    assert_eq!(code, 2);
    assert!(err.join("\n").contains("TLS is not supported"), "{err:?}");
    let mut run = Proc::run(ws.path(), "127.0.0.1:0");
    let (code, _, err) = Proc::tail(ws.path(), &["a..b"]).exit();
    assert_eq!(code, 2, "a bad pattern is refused by the server: 400");
    assert!(
        err.join("\n")
            .contains("400 Bad Request: pattern: invalid pattern"),
        "{err:?}"
    );
    // A wrong token: 2, with the server's reason.
    let bad = ws.path().join("bad-token");
    std::fs::write(&bad, "wrong-token-0123456789\n").unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (code, _, err) = Proc::tail(ws.path(), &["--token-file", bad.to_str().unwrap()]).exit();
    assert_eq!(code, 2);
    assert!(
        err.join("\n").contains("401 Unauthorized: wrong token"),
        "{err:?}"
    );
    // A token file others can read is refused before anything is sent: 2.
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (code, _, err) = Proc::tail(ws.path(), &["--token-file", bad.to_str().unwrap()]).exit();
    assert_eq!(code, 2);
    assert!(err.join("\n").contains("chmod 600"), "{err:?}");
    // The reader goes away: 0.
    let mut tail = Proc::tail(ws.path(), &["--json"]);
    tail.err_line("following");
    run.emit(&tool_call("first"));
    tail.out_line("first");
    drop(std::mem::replace(&mut tail.out, mpsc::channel().1));
    // The reading thread still holds the pipe until its next read returns: keep emitting.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        run.emit(&tool_call("more"));
        if let Some(status) = tail.child.try_wait().unwrap() {
            assert_eq!(status.code(), Some(0));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tail did not exit when its stdout closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
