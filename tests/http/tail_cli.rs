//! `prx-hooks tail` as a real process following a real `prx-hooks run --listen` (docs/cli.md §
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

/// Claude Code's `Stop`, sent as its hook entry sends it, becomes an `agent_end` without a
/// message count: `tail` printed `agent_end ?,  messages`; now the fields an event does not
/// have are left out.
#[test]
fn tail_leaves_out_the_fields_an_agents_event_does_not_have() {
    let ws = workspace(r#"{"hooks": {}}"#);
    let mut run = Proc::run(ws.path(), "127.0.0.1:0");
    let mut send = Command::new(BIN)
        .args(["send", "--from", "claude-code", "--workspace"])
        .arg(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    send.stdin
        .take()
        .unwrap()
        .write_all(br#"{"session_id":"s-1","hook_event_name":"Stop","stop_hook_active":false}"#)
        .unwrap();
    assert!(send.wait().unwrap().success());
    run.out_line("prx.lifecycle.agent_end");
    let mut tail = Proc::tail(ws.path(), &["--last", "10", "--color", "never"]);
    let line = tail.out_line("agent_end");
    assert!(line.contains("agent_end        ok"), "{line}");
    assert!(!line.contains('?') && !line.contains("messages"), "{line}");
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

/// A hostile server on loopback, written here with std::net: each connection gets the next of
/// `scripts` (the last one repeats) once its request head is read; the heads are kept.
struct Hostile {
    url: String,
    heads: Arc<Mutex<Vec<String>>>,
}

type Script = Arc<dyn Fn(&mut TcpStream) + Send + Sync>;

fn hostile(scripts: Vec<Script>) -> Hostile {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = heads.clone();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            let script = scripts[n.min(scripts.len() - 1)].clone();
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut b) {
                        Ok(1) => head.push(b[0]),
                        _ => return,
                    }
                }
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).to_lowercase());
                script(&mut conn);
            });
        }
    });
    Hostile { url, heads }
}

/// An SSE response's head: no length, so the body runs until the connection closes.
const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n";

/// Keeps a stream open with keep-alive comments until the client goes away.
fn hold(conn: &mut TcpStream) {
    while conn.write_all(b": keep-alive\n\n").is_ok() {
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `tail` against `server`, with a token file of its own.
fn tail_of(server: &Hostile, args: &[&str]) -> (Proc, tempfile::TempDir) {
    let ws = tempfile::tempdir().unwrap();
    let token = ws.path().join("token");
    std::fs::write(&token, "hostile-token-0123456789\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut all = vec![
        "--url",
        &server.url,
        "--token-file",
        token.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    (Proc::tail(ws.path(), &all), ws)
}

/// Characters that must not reach a terminal raw: C0, DEL, C1, bidirectional formatting.
fn hazardous(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// `line` with tail's own colours taken out; `None` if it holds any other escape sequence.
fn without_our_colours(line: &str) -> Option<String> {
    const OURS: [&str; 9] = [
        "[0m", "[1m", "[2m", "[31m", "[32m", "[33m", "[35m", "[36m", "[1;31m",
    ];
    let mut parts = line.split('\x1b');
    let mut out = parts.next().unwrap().to_string();
    for p in parts {
        let code = OURS.iter().find(|c| p.starts_with(**c))?;
        out.push_str(&p[code.len()..]);
    }
    Some(out)
}

/// Every place a server's text reaches tail's output, each with escape sequences, C1
/// controls, DEL and bidi overrides in it (raw where JSON allows them, `\u001b` where it
/// does not); then a shutdown, then a 400 whose body is raw escape sequences.
fn evil_stream() -> Vec<Script> {
    // (id, event, data): `\u001b` in the JSON text is a JSON escape (written `\\u001b` in a
    // plain Rust string); `\u{…}` and `\x1b` in plain strings are raw characters.
    const ITEMS: [(&str, &str, &str); 12] = [
        ("", "ready", r#"{"keepalive_ms":15000,"instance":"i"}"#),
        (
            "i-1",
            "prx.lifecycle.tool_call",
            "{\"topic\":\"prx.lifecycle.tool_call\",\"event\":\"tool_call\",\"agent\":\"\\u001b]0;PWNED\\u0007\",\"session\":\"s\u{202e}live\",\"timestamp\":\"2026-01-01T00:00:00.000Z\",\"payload\":{\"tool\":\"sh\u{9b}2J\",\"success\":true,\"output\":\"\u{7f}DEL \\u001b[2J\",\"\\u001b[31mkey\":\"\u{2066}v\"}}",
        ),
        // Not JSON: a raw ESC in a string; plain text.
        ("i-2", "prx.lifecycle.error", "{\"x\":\"\x1b[41mRAW\"}"),
        ("i-3", "prx.lifecycle.error", "not json"),
        // Valid JSON over two data lines (joined by a newline).
        ("i-4", "x", "{\"topic\":\"x\",\ndata: \"payload\":{}}"),
        (
            "i-5",
            "t",
            r#"{"topic":"\u001b[35mT","payload":{"a":"\u001b[5m"}}"#,
        ),
        (
            "i-6",
            "run",
            "{\"type\":\"bus\",\"kind\":\"ok\",\"outcome\":\"\\u001b[42mOK\",\"event\":\"e\\u001b[43mV\",\"id\":\"h\u{202e}\",\"time\":\"2026-01-01T00:00:01.000Z\",\"duration_ms\":1.0}",
        ),
        (
            "i-7",
            "run",
            r#"{"kind":"exit","outcome":"exit 1","event":"error","id":"h2","stderr_tail":"x\n\u001b[2Jlast"}"#,
        ),
        (
            "i-8",
            "plugin",
            "{\"plugin\":\"p\\u001b\",\"calls\":3,\"interval_ms\":1000,\"results\":{\"\\u001b[44mK\":3},\"dropped\":{\"\u{9b}D\":1},\"state\":\"\\u001b[45mS\"}",
        ),
        (
            "i-9",
            "gap",
            r#"{"reason":"other_instance","last_event_id":"o\u001b-1","instance":"\u001b]0;T\u0007"}"#,
        ),
        ("i-10", "dropped", r#"{"count":1,"reason":"\u001b[6m"}"#),
        (
            "",
            "shutdown",
            r#"{"reason":"\u001b[41mINJECTED\u001b[0m"}"#,
        ),
    ];
    let stream: Script = Arc::new(|c: &mut TcpStream| {
        let mut s = String::from_utf8(SSE_HEAD.to_vec()).unwrap();
        for (id, event, data) in ITEMS {
            if !id.is_empty() {
                s.push_str(&format!("id: {id}\n"));
            }
            s.push_str(&format!("event: {event}\ndata: {data}\n\n"));
        }
        let _ = c.write_all(s.as_bytes());
    });
    let refuse: Script = Arc::new(|c: &mut TcpStream| {
        let body = "{\"error\":\"\x1b]0;PWNED-TITLE\x07\x1b[2J\u{202e} fake\"}";
        let _ = write!(
            c,
            "HTTP/1.1 400 Bad Request\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
    });
    vec![stream, refuse]
}

#[test]
fn tail_prints_server_text_escaped_with_only_its_own_colours() {
    let server = hostile(evil_stream());
    let (tail, _ws) = tail_of(&server, &["--runs", "--color", "always"]);
    let (code, out, err) = tail.exit();
    assert_eq!(code, 2, "the 400 ends it; stderr: {err:?}");
    for line in &out {
        let plain = without_our_colours(line)
            .unwrap_or_else(|| panic!("an escape sequence not of tail's: {line:?}"));
        assert!(!plain.chars().any(hazardous), "{line:?}");
    }
    for line in &err {
        assert!(!line.chars().any(hazardous), "stderr: {line:?}");
    }
    let out: Vec<String> = out
        .iter()
        .map(|l| without_our_colours(l).unwrap())
        .collect();
    let has = |lines: &[String], needle: &str| {
        assert!(
            lines.iter().any(|l| l.contains(needle)),
            "no line with {needle:?}:\n{}",
            lines.join("\n")
        )
    };
    let expected: [(&[String], &str); 10] = [
        (&out, r"\u{1b}]0;PWNED\u{7}/s\u{202e}live  tool_call"),
        (
            &out,
            r"sh\u{9b}2J ok: \u{7f}DEL \u{1b}[2J \u{1b}[31mkey=\u{2066}v",
        ),
        (&out, r"\u{1b}[35mT"),
        (&out, r"hook h\u{202e} (e\u{1b}[43mV)  \u{1b}[42mOK  1.0 ms"),
        (&out, r"stderr: \u{1b}[2Jlast"),
        (
            &out,
            r"p\u{1b}  3 call(s) in 1000 ms: \u{1b}[44mK 3; dropped \u{9b}D 1 [\u{1b}[45mS]",
        ),
        (
            &err,
            r"the server restarted (stream o\u{1b} is now \u{1b}]0;T\u{7})",
        ),
        (&err, r"going away (\u{1b}[41mINJECTED\u{1b}[0m)"),
        (&err, r"400 Bad Request: {"),
        (&err, r"\u{1b}]0;PWNED-TITLE\u{7}\u{1b}[2J\u{202e} fake"),
    ];
    for (lines, needle) in expected {
        has(lines, needle);
    }
    // Data that is not a JSON object is not shown: counted, said once.
    assert_eq!(
        err.iter().filter(|l| l.contains("not shown:")).count(),
        1,
        "{err:?}"
    );
    has(&err, "in all: 2 item(s) not shown");
}

#[test]
fn tail_json_is_one_valid_object_per_line_serialized_never_pasted() {
    let server = hostile(evil_stream());
    let (tail, _ws) = tail_of(&server, &["--json", "--runs"]);
    let (code, out, err) = tail.exit();
    assert_eq!(code, 2, "stderr: {err:?}");
    let objects: Vec<serde_json::Value> = out
        .iter()
        .map(|l| {
            assert!(!l.chars().any(hazardous), "raw in --json: {l:?}");
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"));
            assert!(v.is_object(), "{l}");
            v
        })
        .collect();
    // The 8 items whose data is a JSON object; the 2 others not shown, said once.
    assert_eq!(objects.len(), 8, "{out:#?}");
    assert_eq!(
        err.iter().filter(|l| l.contains("not shown:")).count(),
        1,
        "{err:?}"
    );
    // Meaning is kept (escaped, not lost).
    assert_eq!(objects[0]["agent"], "\x1b]0;PWNED\x07");
    assert_eq!(objects[0]["payload"]["tool"], "sh\u{9b}2J");
    assert_eq!(objects[0]["session"], "s\u{202e}live");
    assert!(out[0].starts_with(r#"{"topic":"prx.lifecycle.tool_call","event":"tool_call""#));
    assert_eq!(objects[1]["topic"], "x", "two data lines, one JSON line");
    // A server's "type" cannot stand beside tail's: one "type", tail's.
    let run = out.iter().find(|l| l.contains("OK")).unwrap();
    assert_eq!(run.matches("\"type\"").count(), 1, "{run}");
    assert!(run.starts_with(r#"{"type":"run","kind":"ok""#), "{run}");
    let types: Vec<&str> = objects.iter().filter_map(|o| o["type"].as_str()).collect();
    assert_eq!(types, ["run", "run", "plugin", "gap", "dropped"]);
}

/// The peak resident set of a process (`VmHWM`), in KiB.
fn peak_rss_kib(p: &Proc) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[test]
fn tail_skips_an_endless_line_without_holding_it_and_its_memory_stays_bounded() {
    const MIB: usize = 1 << 20;
    let script: Script = Arc::new(|c: &mut TcpStream| {
        let mut go = || -> std::io::Result<()> {
            c.write_all(SSE_HEAD)?;
            c.write_all(b"id: big-1\nevent: prx.lifecycle.tool_call\ndata: ")?;
            let chunk = vec![b'A'; MIB];
            for _ in 0..256 {
                c.write_all(&chunk)?;
            }
            c.write_all(b"\n\nid: big-2\nevent: prx.lifecycle.error\ndata: {\"topic\":\"prx.lifecycle.error\",\"event\":\"error\",\"payload\":{\"component\":\"t\",\"message\":\"after the long one\"}}\n\n")?;
            Ok(())
        };
        if go().is_ok() {
            hold(c);
        }
    });
    let server = hostile(vec![script]);
    let (mut tail, _ws) = tail_of(&server, &["--json"]);
    tail.out_line("after the long one");
    let hwm_kib = peak_rss_kib(&tail);
    assert!(
        hwm_kib < 128 << 10,
        "a 256 MiB line with a 32 MiB cap: peak RSS {hwm_kib} kB"
    );
    let said = tail.err_line("skipped an event");
    assert!(said.contains("longer than 33554432 bytes"), "{said}");
    assert_eq!(tail.seen_out.len(), 1, "{:?}", tail.seen_out);
    eprintln!("peak RSS of tail after a 256 MiB line: {hwm_kib} kB");
}

#[test]
fn an_event_id_that_cannot_be_sent_back_is_ignored_and_the_reconnect_resumes_after_the_last_good_one()
 {
    let first: Script = Arc::new(|c: &mut TcpStream| {
        let _ = c.write_all(SSE_HEAD);
        let _ = c.write_all(b"id: good-1\nevent: prx.lifecycle.error\ndata: {\"topic\":\"prx.lifecycle.error\",\"payload\":\"first\"}\n\n");
        let _ = c.write_all(b"id: bad\x01id\nevent: prx.lifecycle.error\ndata: {\"topic\":\"prx.lifecycle.error\",\"payload\":\"second\"}\n\n");
    });
    let then: Script = Arc::new(|c: &mut TcpStream| {
        let _ = c.write_all(SSE_HEAD);
        let _ = c.write_all(b"id: good-3\nevent: prx.lifecycle.error\ndata: {\"topic\":\"prx.lifecycle.error\",\"payload\":\"third\"}\n\n");
        hold(c);
    });
    let server = hostile(vec![first, then]);
    let (mut tail, _ws) = tail_of(&server, &["--json"]);
    tail.out_line("second");
    tail.out_line("third");
    let heads = server.heads.lock().unwrap().clone();
    assert!(!heads[0].contains("last-event-id"), "{heads:?}");
    assert!(heads[1].contains("last-event-id: good-1\r\n"), "{heads:?}");
    let said = tail.err_line("ignored an event id");
    assert!(said.contains(r"bad\u{1}id"), "{said}");
    assert!(tail.child.try_wait().unwrap().is_none(), "still following");
}

/// Every field of an event is bounded, not only `data:` (docs/cli.md § `tail`): a 31 MiB `id:`,
/// `event:`, `retry:`, comment and unknown field each, some of them inside one event, never
/// held; an id longer than 256 bytes is ignored (never sent back as `Last-Event-ID`), said
/// once; an event whose name is longer than 256 bytes (a bus topic is at most 256) is skipped,
/// said once; everything else goes on.
#[test]
fn tail_bounds_every_field_and_never_sends_a_long_id_back() {
    const MIB: usize = 1 << 20;
    fn item(id: &str, text: &str) -> String {
        let id = if id.is_empty() {
            String::new()
        } else {
            format!("id: {id}\n")
        };
        format!(
            "{id}event: prx.lifecycle.error\ndata: {{\"topic\":\"prx.lifecycle.error\",\"event\":\"error\",\"payload\":{{\"component\":\"t\",\"message\":\"{text}\"}}}}\n\n"
        )
    }
    /// `field` followed by 31 MiB of `byte` and a newline, written as it goes.
    fn huge(c: &mut TcpStream, field: &str, byte: u8) -> std::io::Result<()> {
        c.write_all(field.as_bytes())?;
        let chunk = vec![byte; MIB];
        for _ in 0..31 {
            c.write_all(&chunk)?;
        }
        c.write_all(b"\n")
    }
    let first: Script = Arc::new(|c: &mut TcpStream| {
        let mut go = || -> std::io::Result<()> {
            c.write_all(SSE_HEAD)?;
            c.write_all(item("good-1", "first").as_bytes())?;
            // A 31 MiB id on an event otherwise fine: shown, its id ignored.
            huge(c, "id: ", b'i')?;
            c.write_all(item("", "the long id").as_bytes())?;
            // A 31 MiB event name: skipped (its id is still where the stream is).
            c.write_all(b"id: good-2\n")?;
            huge(c, "event: ", b'e')?;
            c.write_all(b"data: {\"topic\":\"x\",\"payload\":\"the long name\"}\n\n")?;
            // Lines SSE ignores, 31 MiB each, between events and inside one.
            huge(c, "retry: ", b'9')?;
            huge(c, ": ", b'c')?;
            huge(c, "x-unknown: ", b'u')?;
            c.write_all(b"\n")?;
            huge(c, "retry: ", b'9')?;
            huge(c, ":", b'c')?;
            c.write_all(item("", "after the hostile fields").as_bytes())?;
            // An id of 300 bytes: ignored too.
            c.write_all(item(&"j".repeat(300), "the 300-byte id").as_bytes())?;
            Ok(())
        };
        // Then the connection closes: tail reconnects.
        let _ = go();
    });
    let then: Script = Arc::new(|c: &mut TcpStream| {
        let _ = c.write_all(SSE_HEAD);
        let _ = c.write_all(item("good-3", "third").as_bytes());
        hold(c);
    });
    let server = hostile(vec![first, then]);
    let (mut tail, _ws) = tail_of(&server, &["--json"]);
    for text in [
        "first",
        "the long id",
        "after the hostile fields",
        "the 300-byte id",
        "third",
    ] {
        tail.out_line(text);
    }
    assert!(
        !tail.seen_out.iter().any(|l| l.contains("the long name")),
        "{:?}",
        tail.seen_out
    );
    assert_eq!(tail.seen_out.len(), 5, "{:?}", tail.seen_out);
    let heads = server.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "one reconnection");
    assert!(
        heads[1].len() < 1024 && heads[1].contains("last-event-id: good-2\r\n"),
        "the reconnection resumes after the last usable id, in a small head: {} bytes, {:?}",
        heads[1].len(),
        heads[1]
            .lines()
            .find(|l| l.starts_with("last-event-id"))
            .map(|l| &l[..l.len().min(80)])
    );
    let hwm_kib = peak_rss_kib(&tail);
    eprintln!(
        "peak RSS of tail after 31 MiB id, event, retry, comment and unknown lines: {hwm_kib} kB"
    );
    assert!(
        hwm_kib < 32 << 10,
        "none of the 31 MiB lines may be held: peak RSS {hwm_kib} kB"
    );
    let said = tail.err_line("ignored an event id");
    assert!(said.contains("longer than 256 bytes"), "{said}");
    let said = tail.err_line("skipped an event");
    assert!(said.contains("name is longer than 256 bytes"), "{said}");
    let err = &tail.seen_err;
    assert_eq!(
        err.iter()
            .filter(|l| l.contains("ignored an event id"))
            .count(),
        1,
        "said once: {err:?}"
    );
    assert!(
        err.iter().all(|l| l.len() < 1024),
        "no hostile field is echoed whole: {:?}",
        err.iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    assert!(tail.child.try_wait().unwrap().is_none(), "still following");
}
