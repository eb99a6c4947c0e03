//! The console page at `/` (docs/http.md § Console page; ARCHITECTURE.md § Console page) in a
//! real headless Chromium (chromedriver + fantoccini), against a real `http::Server` over
//! loopback, on a real workspace whose hooks are real shell commands.
//!
//! A screenshot of each state is written to `target/console-screenshots/` (README names
//! them); `PRX_HOOKS_UPDATE_DOCS=1` also copies the overview to `docs/console.png`.

use prx_hooks::http::{CONTENT_SECURITY_POLICY, EventStreamOptions, HttpOptions, Server, Token};
use prx_hooks::{Event, Hooks};
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::browser;

use crate::support;

use crate::proxy;

#[cfg(feature = "wasm")]
use crate::plugins;

use browser::{Page, Viewport, http};
use support::wait_for;

const TOKEN: &str = "console-token-0123456789abcdef";

struct Console {
    ws: tempfile::TempDir,
    hooks: Arc<Hooks>,
    server: Server,
}

impl Console {
    fn start(hooks_json: &str) -> Console {
        Console::start_in(hooks_json, |_| {})
    }

    fn start_in(hooks_json: &str, prepare: impl FnOnce(&Path)) -> Console {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("hooks.json"), hooks_json).unwrap();
        prepare(ws.path());
        let hooks = Arc::new(
            Hooks::builder()
                .workspace(ws.path())
                .reload_debounce(Duration::from_millis(20))
                .build()
                .unwrap(),
        );
        let server = Server::start(
            hooks.clone(),
            HttpOptions::new(Token::new(TOKEN, "test").unwrap()),
            "127.0.0.1:0".parse().unwrap(),
        )
        .unwrap();
        Console { ws, hooks, server }
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr())
    }

    fn ws(&self) -> &Path {
        self.ws.path()
    }

    fn get(&self, path: &str) -> browser::Resp {
        let auth = format!("Bearer {TOKEN}");
        http("GET", &self.url(path), &[("authorization", &auth)], b"")
    }

    fn stats(&self) -> Value {
        let r = self.get("/api/stats");
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()
    }

    fn hook_stat(&self, id: &str, key: &str) -> u64 {
        self.stats()["shell"]["hooks"][id][key]
            .as_u64()
            .unwrap_or(0)
    }

    /// Opens the page and signs in with the token (typed into the login field).
    fn sign_in(&self, viewport: Viewport) -> Page {
        let page = Page::open(viewport);
        page.goto(&self.url("/"));
        page.wait_visible("#token");
        page.fill("#token", TOKEN);
        page.click("#login-submit");
        page.wait_visible("#app");
        page.wait(
            "the live stream to be connected",
            "return document.getElementById('conn').dataset.state === 'live';",
            vec![],
        );
        page
    }
}

fn tool_call(hooks: &Hooks, agent: &str, tool: &str, output: &str) {
    hooks.emitter(agent, "s-1").emit(Event::ToolCall {
        tool,
        success: true,
        output,
    });
}

/// A hook that appends "<tag> <payload>" to `log` (a real /bin/sh process per event).
fn appender(id: &str, event: &str, log: &Path) -> Value {
    json!({"id": id, "event": event, "command": "/bin/sh",
           "args": support::append_args(id, log), "stdin_json": true})
}

fn hooks_file(hooks: &[Value]) -> String {
    let mut by_event = serde_json::Map::new();
    for h in hooks {
        let mut h = h.clone();
        let event = h
            .as_object_mut()
            .unwrap()
            .remove("event")
            .unwrap()
            .as_str()
            .unwrap()
            .to_string();
        by_event
            .entry(event)
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .unwrap()
            .push(h);
    }
    json!({"timeout_ms": 5000, "hooks": by_event}).to_string()
}

#[test]
fn the_page_is_served_without_a_token_with_strict_headers_and_the_api_still_needs_one() {
    let c = Console::start(&hooks_file(&[]));
    let mut tags = Vec::new();
    for (path, ty, needle) in [
        (
            "/",
            "text/html; charset=utf-8",
            "<title>prx-hooks console</title>",
        ),
        (
            "/console/console.js",
            "text/javascript; charset=utf-8",
            "textContent",
        ),
        ("/console/console.css", "text/css; charset=utf-8", ":root"),
        ("/console/icon.svg", "image/svg+xml", "<svg"),
    ] {
        let r = http("GET", &c.url(path), &[], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        assert_eq!(r.header("content-type"), Some(ty), "{path}");
        assert!(r.text.contains(needle), "{path}");
        assert_eq!(
            r.header("content-security-policy"),
            Some(CONTENT_SECURITY_POLICY)
        );
        for part in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
            "require-trusted-types-for 'script'",
        ] {
            assert!(CONTENT_SECURITY_POLICY.contains(part), "{part}");
        }
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
        assert_eq!(r.header("x-frame-options"), Some("DENY"));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("referrer-policy"), Some("no-referrer"));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        let etag = r.header("etag").unwrap().to_string();
        assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
        // Revalidation: the same ETag is 304 with no body; another is the file again.
        let again = http("GET", &c.url(path), &[("if-none-match", &etag)], b"");
        assert_eq!(again.status, 304, "{path}");
        assert!(again.text.is_empty());
        assert_eq!(again.header("etag"), Some(etag.as_str()));
        let other = http("GET", &c.url(path), &[("if-none-match", "\"0\"")], b"");
        assert_eq!(other.status, 200);
        tags.push(etag);
    }
    tags.sort();
    tags.dedup();
    assert_eq!(tags.len(), 4, "one ETag per file");

    // The API around it still wants the token, and the page's routes are GET only (JSON
    // errors, like every route).
    assert_eq!(http("GET", &c.url("/api/hooks"), &[], b"").status, 401);
    assert_eq!(http("GET", &c.url("/api/events"), &[], b"").status, 401);
    assert_eq!(
        http("GET", &c.url("/console/other.js"), &[], b"").status,
        401
    );
    let post = http("POST", &c.url("/"), &[], b"");
    assert_eq!(post.status, 405);
    assert_eq!(post.json()["kind"], "method_not_allowed");
    assert_eq!(http("HEAD", &c.url("/"), &[], b"").status, 200);
    // The Host / Origin check comes first, for the page too (DNS rebinding).
    let rebound = http("GET", &c.url("/"), &[("host", "evil.example:7878")], b"");
    assert_eq!(rebound.status, 403);
}

#[test]
fn a_router_nested_under_a_prefix_serves_the_page_at_the_prefix_with_a_slash() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    let api = prx_hooks::http::router(hooks, HttpOptions::new(Token::new(TOKEN, "test").unwrap()));
    let app: axum::Router = axum::Router::new().nest("/prx", api);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await });
    let base = format!("http://{addr}");
    std::thread::scope(|s| {
        s.spawn(|| {
            // axum routes the page at `/prx` (no slash), where a relative URL resolves
            // under `/`: the page names its files under the prefix.
            let page = http("GET", &format!("{base}/prx"), &[], b"");
            assert_eq!(page.status, 200, "{}", page.text);
            assert!(
                page.text.contains("\"prx/console/console.js\""),
                "{}",
                page.text
            );
            assert!(!page.text.contains("\"console/"));
            let etag = page.header("etag").unwrap().to_string();
            let root = http("GET", &format!("{base}/prx/console/console.css"), &[], b"");
            assert_ne!(root.header("etag"), Some(etag.as_str()));
            let again = http(
                "GET",
                &format!("{base}/prx"),
                &[("if-none-match", &etag)],
                b"",
            );
            assert_eq!(again.status, 304);
            let js = http("GET", &format!("{base}/prx/console/console.js"), &[], b"");
            assert_eq!(js.status, 200);
            assert_eq!(
                http("GET", &format!("{base}/prx/api/hooks"), &[], b"").status,
                401
            );
        })
        .join()
        .unwrap();
    });
    drop(rt);
}

#[test]
fn signing_in_keeps_the_token_out_of_urls_and_an_emitted_event_arrives_live() {
    let c = Console::start(&hooks_file(&[]));
    let page = Page::open(Viewport::Desktop);
    page.goto(&c.url("/"));
    page.wait_visible("#token");
    assert_eq!(
        page.js("return document.activeElement.id;", vec![]),
        "token",
        "the token field has the focus"
    );
    page.shot("login");
    // A wrong token: said at the field, nothing stored.
    page.fill("#token", "wrong-token-0123456789abcdef");
    page.click("#login-submit");
    page.wait_visible("#token-error");
    assert!(page.text("#token-error").contains("Wrong token"));
    assert_eq!(
        page.js(
            "return document.getElementById('token').getAttribute('aria-invalid');",
            vec![]
        ),
        "true"
    );
    assert_eq!(
        page.js("return sessionStorage.length;", vec![]),
        0,
        "a refused token is not kept"
    );
    page.fill("#token", TOKEN);
    page.click("#login-submit");
    page.wait_visible("#app");
    assert!(!page.url().contains(TOKEN), "{}", page.url());
    assert_eq!(
        page.js("return sessionStorage.getItem('prx-hooks.token');", vec![]),
        TOKEN
    );
    assert_eq!(page.js("return localStorage.length;", vec![]), 0);
    page.wait(
        "the stream to be live",
        "return document.getElementById('conn').dataset.state === 'live';",
        vec![],
    );

    tool_call(&c.hooks, "coder", "shell", "hello from the agent");
    let row = page.wait(
        "the event in the live list",
        "const r = [...document.querySelectorAll('#stream-list li.row.bus')].find(li => li.textContent.includes('hello from the agent')); return r ? r.textContent : null;",
        vec![],
    );
    let row = row.as_str().unwrap();
    assert!(row.contains("tool_call") && row.contains("coder"), "{row}");
    // Its counters move: the events/s chart has a line and the total counts it.
    page.wait(
        "the emitted counter",
        "return document.getElementById('rate-legend').textContent.includes('emitted 1');",
        vec![],
    );
    // A reload keeps the session (sessionStorage), without asking again.
    page.goto(&c.url("/"));
    page.wait_visible("#app");
    page.wait(
        "the stream after a reload",
        "return document.getElementById('conn').dataset.state === 'live';",
        vec![],
    );
    // Signing out forgets the token.
    page.click("#logout");
    page.wait_visible("#login");
    assert_eq!(page.js("return sessionStorage.length;", vec![]), 0);
    page.assert_no_script_errors();
}

/// A coding agent's event says what it does in its row: a Claude Code `PreToolUse` shows the
/// tool and its command first, its session id, transcript path and working directory only in
/// the detail, so the command needs no click.
#[test]
fn an_agents_row_shows_the_command_first_and_leaves_file_paths_to_the_detail() {
    let c = Console::start(&hooks_file(&[]));
    let page = c.sign_in(Viewport::Desktop);
    let session = "0f8e2d4c-5b6a-4c3d-9e8f-7a6b5c4d3e2f";
    let body = json!({
        "session_id": session,
        "transcript_path": format!("/home/dev/.claude/projects/-home-dev-src-app/{session}.jsonl"),
        "cwd": "/home/dev/src/app",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "rm -rf build", "description": "Clean the build directory"}
    })
    .to_string();
    let auth = format!("Bearer {TOKEN}");
    let r = http(
        "POST",
        &c.url("/api/ingest/claude-code"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert!(r.status < 300, "{} {}", r.status, r.text);
    let text = page.wait(
        "the agent's row",
        "const r = [...document.querySelectorAll('#stream-list li.row.bus')].find(li => li.textContent.includes('tool_call_start')); return r ? r.querySelector('.text').textContent : null;",
        vec![],
    );
    let text = text.as_str().unwrap();
    assert!(
        text.starts_with("tool: Bash · command: rm -rf build"),
        "{text}"
    );
    for hidden in [
        "transcript_path",
        ".jsonl",
        "session_id",
        "hook_event_name",
        "cwd",
    ] {
        assert!(!text.contains(hidden), "{hidden} in the row: {text}");
    }
    // The detail still has everything.
    page.click("#stream-list li.row.bus .row-head");
    let detail = page.text("#stream-list li.row.bus .detail");
    assert!(detail.contains("transcript_path"), "{detail}");
    page.assert_no_script_errors();
}

#[test]
fn a_decided_tool_calls_row_shows_the_decision_and_its_reason() {
    let c = Console::start_in(&hooks_file(&[]), |ws| {
        std::fs::write(
            ws.join("policies.json"),
            r#"{"policies": [{"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash",
              "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
              "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}]}"#,
        )
        .unwrap();
    });
    let page = c.sign_in(Viewport::Desktop);
    let auth = format!("Bearer {TOKEN}");
    for command in ["rm -rf build", "ls -la"] {
        let body =
            json!({"session_id": "s-1", "hook_event_name": "PreToolUse", "tool_name": "Bash",
                          "tool_input": {"command": command}})
            .to_string();
        let r = http(
            "POST",
            &c.url("/api/ingest/claude-code"),
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let rows = page.wait(
        "the two tool calls' rows and the decision's",
        "const rows = [...document.querySelectorAll('#stream-list li.row.bus')].map(li => ({ \
           event: li.querySelector('.badge.event').textContent, \
           mark: (li.querySelector('.text .badge.decision') || {}).textContent || null, \
           title: (li.querySelector('.text .badge.decision') || {}).title || null, \
           text: li.querySelector('.text').textContent })); \
         return rows.length >= 4 ? rows : null;",
        vec![],
    );
    let rows = rows.as_array().unwrap();
    let find = |event: &str, needle: &str| {
        rows.iter()
            .find(|r| r["event"] == event && r["text"].as_str().unwrap().contains(needle))
            .unwrap_or_else(|| panic!("no {event} row with {needle:?}: {rows:?}"))
    };
    // The decided event: the decision as a badge (the reason as its title), then the
    // decision's words, then what the tool was asked to do.
    let denied = find("tool_call_start", "rm -rf build");
    assert_eq!(denied["mark"], "deny", "{denied}");
    assert_eq!(denied["title"], "rm -rf is not allowed in this workspace");
    let text = denied["text"].as_str().unwrap();
    assert!(
        text.starts_with("deny deny by no-rm-rf: rm -rf is not allowed in this workspace · tool: Bash · command: rm -rf build"),
        "{text}"
    );
    assert!(!text.contains("policy_"), "{text}");
    // The decision as published on the bus.
    let published = find("prx.policy.decision", "no-rm-rf");
    assert_eq!(published["mark"], "deny");
    // No policy decided: the row as before, and the published question says so.
    let plain = find("tool_call_start", "ls -la");
    assert_eq!(plain["mark"], Value::Null, "{plain}");
    assert!(
        plain["text"]
            .as_str()
            .unwrap()
            .starts_with("tool: Bash · command: ls -la")
    );
    let none = find("prx.policy.decision", "no decision");
    assert_eq!(none["mark"], "none");
    page.assert_no_script_errors();
}

/// A server that keeps its runs (as `prx-hooks run` does) shows a hook's runs from before a
/// restart in the page's run history.
#[test]
fn a_hooks_runs_from_before_a_restart_are_in_its_history() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("audit.log");
    let runs_file = log_dir.path().join("runs.ndjson");
    let hooks = hooks_file(&[appender("audit", "tool_call", &log)]);
    let c = Console::start(&hooks);
    let shell = c.hooks.shell().unwrap();
    assert_eq!(shell.keep_runs(&runs_file).unwrap(), 0);
    tool_call(&c.hooks, "coder", "shell", "before the restart");
    wait_for("the run", || support::lines(&log).len() == 1);
    wait_for("the run to be counted", || c.hook_stat("audit", "ok") == 1);
    c.hooks.shutdown(Duration::from_secs(5));
    let mode = std::fs::metadata(&runs_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    drop(c);

    // A new server over the same workspace file: the run is read back before anyone looks.
    let c = Console::start(&hooks);
    assert_eq!(c.hooks.shell().unwrap().keep_runs(&runs_file).unwrap(), 1);
    let page = c.sign_in(Viewport::Desktop);
    page.wait_visible("li.hook[data-id='audit'] button[aria-label='Runs of audit']");
    page.click("li.hook[data-id='audit'] button[aria-label='Runs of audit']");
    page.wait_visible("#runs[open]");
    let outcomes = page.wait(
        "the run from before the restart",
        "const rows = [...document.querySelectorAll('#runs-table tbody tr')].map(tr => tr.children[1].textContent); return rows.length >= 1 ? rows : null;",
        vec![],
    );
    assert_eq!(outcomes, json!(["ok"]), "{outcomes}");
    // Not counted again: the counters are this server's.
    assert_eq!(c.hook_stat("audit", "ok"), 0);
    assert_eq!(c.stats()["shell"]["run_log"]["loaded"], 1);
    page.assert_no_script_errors();
}

#[test]
fn the_stream_resumes_with_last_event_id_after_the_connection_drops() {
    let c = Console::start(&hooks_file(&[]));
    let relay = proxy::Relay::start(c.addr());
    let page = Page::open(Viewport::Desktop);
    page.goto(&format!("http://{}/", relay.addr()));
    page.fill("#token", TOKEN);
    page.click("#login-submit");
    page.wait(
        "the stream",
        "return document.getElementById('conn').dataset.state === 'live';",
        vec![],
    );
    tool_call(&c.hooks, "coder", "shell", "before the cut");
    page.wait(
        "the first event",
        "return document.getElementById('stream-list').textContent.includes('before the cut');",
        vec![],
    );
    let before = c.stats()["events"].clone();
    relay.cut();
    page.wait(
        "the page to notice",
        "return document.getElementById('conn').dataset.state === 'wait';",
        vec![],
    );
    // Emitted while the page is away: the server's backlog keeps it.
    let items = before["items"].as_u64().unwrap();
    tool_call(&c.hooks, "coder", "shell", "during the cut");
    wait_for("the hub to number the event", || {
        c.stats()["events"]["items"].as_u64().unwrap() > items
    });
    relay.restore();
    page.wait(
        "the missed event, replayed",
        "return document.getElementById('stream-list').textContent.includes('during the cut');",
        vec![],
    );
    let after = c.stats()["events"].clone();
    assert_eq!(
        after["resumed"].as_u64().unwrap(),
        before["resumed"].as_u64().unwrap() + 1,
        "one resume with Last-Event-ID: {after}"
    );
    assert_eq!(after["gaps"], before["gaps"], "a whole resume: {after}");
    let shown = page.js(
        "return [...document.querySelectorAll('#stream-list li.row.bus')].map(li => li.textContent).filter(t => t.includes('the cut')).length;",
        vec![],
    );
    assert_eq!(shown, 2, "each event once");
    page.assert_no_script_errors();
}

#[test]
fn a_restarted_server_is_said_and_a_new_token_sends_the_page_back_to_its_login() {
    let mut c = Console::start(&hooks_file(&[]));
    let page = c.sign_in(Viewport::Desktop);
    let addr = c.addr();
    let restart = |c: &mut Console, token: &str| {
        c.server.shutdown(Duration::from_secs(5));
        c.server = Server::start(
            c.hooks.clone(),
            HttpOptions::new(Token::new(token, "test").unwrap()),
            addr,
        )
        .unwrap();
    };
    // The same token: the stream ends with a shutdown notice, resumes from another instance
    // (a gap, said), and is live again.
    restart(&mut c, TOKEN);
    page.wait(
        "the shutdown and restart notices",
        "const t = document.getElementById('stream-list').textContent; return t.includes('shutting down') && t.includes('the server restarted');",
        vec![],
    );
    page.wait(
        "live again",
        "return document.getElementById('conn').dataset.state === 'live';",
        vec![],
    );
    tool_call(&c.hooks, "coder", "shell", "after the restart");
    page.wait(
        "an event from the new server",
        "return document.getElementById('stream-list').textContent.includes('after the restart');",
        vec![],
    );
    // Another token (rotated): the next request is a 401 and the page asks again.
    restart(&mut c, "rotated-token-0123456789abcdef");
    page.wait_visible("#login");
    page.wait(
        "the reason at the field",
        "return document.getElementById('token-error').textContent.includes('refused the token');",
        vec![],
    );
    assert_eq!(page.js("return sessionStorage.length;", vec![]), 0);
    assert!(page.js("return document.getElementById('app').hidden;", vec![]) == true);
    page.fill("#token", "rotated-token-0123456789abcdef");
    page.click("#login-submit");
    page.wait(
        "signed in with the new token",
        "return document.getElementById('conn').dataset.state === 'live';",
        vec![],
    );
    page.assert_no_script_errors();
}

#[test]
fn a_stream_refused_with_429_is_retried_after_retry_after_and_a_503_is_said() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hooks.json"), hooks_file(&[])).unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    let server = Server::start(
        hooks.clone(),
        HttpOptions::new(Token::new(TOKEN, "test").unwrap())
            .events(EventStreamOptions::default().max_streams(1)),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let addr = server.local_addr();
    // Another client holds the only stream.
    let mut holder = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(
        &mut holder,
        format!(
            "GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    wait_for("the holder's stream", || server.event_stats().streams == 1);
    let page = Page::open(Viewport::Desktop);
    page.goto(&format!("http://{addr}/"));
    page.fill("#token", TOKEN);
    page.click("#login-submit");
    page.wait(
        "the 429 said",
        "const n = document.getElementById('stream-note'); return !n.hidden && n.textContent.includes('too many live streams');",
        vec![],
    );
    page.wait(
        "the retry after Retry-After (5 s)",
        "return document.getElementById('conn').textContent === 'Reconnecting in 5 s';",
        vec![],
    );
    // The holder leaves (the hub notices at its next write to it): the page gets the stream.
    drop(holder);
    hooks.emitter("coder", "s-1").emit(Event::TurnComplete);
    page.wait(
        "the stream, retried",
        "return document.getElementById('conn').dataset.state === 'live';",
        vec![],
    );
    assert!(server.event_stats().refused >= 1);
    // The hook system shuts down under the page: the stream ends and is refused (503), said
    // in place; a write is refused too, said at the hooks.
    hooks.shutdown(Duration::from_secs(5));
    page.wait(
        "the 503 said",
        "const n = document.getElementById('stream-note'); return !n.hidden && n.textContent.includes('unavailable');",
        vec![],
    );
    page.click("#new-hook");
    page.fill("#f-command", "/bin/true");
    page.click("#editor-save");
    page.wait(
        "the refused write",
        "const e = document.getElementById('editor-error'); return !e.hidden && e.textContent.includes('shutting down');",
        vec![],
    );
    page.assert_no_script_errors();
}

#[test]
fn toggling_a_hook_makes_the_next_event_skip_it_as_its_run_history_shows() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("audit.log");
    let c = Console::start(&hooks_file(&[
        appender("audit", "tool_call", &log),
        // Stays on: the event still reaches the shell backend, which counts audit's skip (an
        // event no enabled hook wants is skipped at emit and never reaches it).
        json!({"id": "count-tools", "event": "tool_call", "command": "/bin/true"}),
        json!({"id": "notify", "event": "agent_end", "command": "/bin/true"}),
        json!({"id": "errors-to-file", "event": "error", "command": "/bin/true", "enabled": false}),
    ]));
    let page = c.sign_in(Viewport::Desktop);
    page.wait_visible("li.hook[data-id='audit'] button[role='switch'][aria-checked='true']");
    // Grouped by event, in the lifecycle's order (not the file's).
    assert_eq!(
        page.js(
            "return [...document.querySelectorAll('#hooks-list section.group')].map(g => g.dataset.event);",
            vec![]
        ),
        json!(["agent_end", "tool_call", "error"])
    );
    assert_eq!(
        page.js(
            "return document.querySelector(\"li.hook[data-id='errors-to-file'] [role=switch]\").getAttribute('aria-checked');",
            vec![]
        ),
        "false"
    );

    tool_call(&c.hooks, "coder", "shell", "first");
    wait_for("the first run", || support::lines(&log).len() == 1);
    page.wait(
        "the run in the stream",
        "return [...document.querySelectorAll('#stream-list li.row.run')].some(li => li.textContent.includes('hook audit'));",
        vec![],
    );

    page.click("li.hook[data-id='audit'] button[role='switch']");
    page.wait_visible("li.hook[data-id='audit'] button[role='switch'][aria-checked='false']");
    assert!(page.text("#hooks-note").contains("audit disabled"));
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(c.ws().join("hooks.json")).unwrap()).unwrap();
    assert_eq!(file["hooks"]["tool_call"][0]["enabled"], false, "{file}");

    tool_call(&c.hooks, "coder", "shell", "second");
    wait_for("the skip to be counted", || {
        c.hook_stat("audit", "skipped") == 1
    });
    wait_for("the other hook's run", || {
        c.hook_stat("count-tools", "ok") == 2
    });
    assert_eq!(
        support::lines(&log).len(),
        1,
        "the disabled hook did not run"
    );

    // The run history: newest first, the skip, then the run.
    page.click("li.hook[data-id='audit'] button[aria-label='Runs of audit']");
    page.wait_visible("#runs[open]");
    let outcomes = page.wait(
        "both runs in the history",
        "const rows = [...document.querySelectorAll('#runs-table tbody tr')].map(tr => tr.children[1].textContent); return rows.length >= 2 ? rows : null;",
        vec![],
    );
    assert_eq!(outcomes, json!(["skipped (disabled)", "ok"]), "{outcomes}");
    page.wait(
        "the counters to show the skip",
        "const t = document.querySelector(\"li.hook[data-id='audit'] .hook-counts\"); return t && t.textContent.includes('1 skipped');",
        vec![],
    );
    page.shot("run-history");
    page.keys(&fantoccini::key::Key::Escape.to_string());
    page.wait(
        "the dialog to close",
        "return !document.getElementById('runs').open;",
        vec![],
    );
    // The outcomes chart counts it too.
    page.wait(
        "the outcomes chart",
        "return [...document.querySelectorAll('#outcomes-chart .bar-row')].some(r => r.textContent.startsWith('audit'));",
        vec![],
    );
    page.shot("hooks");

    // Stale: hooks.json changes behind the page's back (another client); the page's next
    // write is refused (412), it reloads and says so, and nothing was switched.
    let auth = format!("Bearer {TOKEN}");
    let r = http(
        "POST",
        &c.url("/api/hooks"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        json!({"id": "added-elsewhere", "event": "turn_complete", "command": "/bin/true"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    page.click("li.hook[data-id='notify'] button[role='switch']");
    page.wait(
        "the stale-list notice",
        "return document.getElementById('hooks-note').textContent.includes('changed since this page loaded it');",
        vec![],
    );
    page.wait_visible("li.hook[data-id='added-elsewhere']");
    assert_eq!(
        page.js(
            "return document.querySelector(\"li.hook[data-id='notify'] [role=switch]\").getAttribute('aria-checked');",
            vec![]
        ),
        "true",
        "the refused switch changed nothing"
    );
    assert_eq!(c.get("/api/hooks/notify").json().get("enabled"), None);
    page.assert_no_script_errors();
}

#[test]
fn the_page_is_usable_with_the_keyboard_alone() {
    let c = Console::start(&hooks_file(&[json!({
        "id": "audit", "event": "tool_call", "command": "/bin/true"
    })]));
    let page = Page::open(Viewport::Desktop);
    page.goto(&c.url("/"));
    page.wait_visible("#token");
    use fantoccini::key::Key;
    page.keys(&format!("{TOKEN}{}", Key::Enter));
    page.wait_visible("li.hook[data-id='audit']");
    // Tab from the top: every stop is a real control with a name and a visible focus ring,
    // and the hook's switch is among them.
    page.js(
        "document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);",
        vec![],
    );
    let mut stops = Vec::new();
    for _ in 0..40 {
        page.keys(&Key::Tab.to_string());
        let stop = page.js(
            r#"const e = document.activeElement;
               const cs = getComputedStyle(e);
               const name = e.getAttribute('aria-label') || (e.labels && e.labels[0] && e.labels[0].textContent) || e.textContent;
               return {tag: e.tagName, id: e.id, key: e.dataset.focusKey || '', name: (name || '').trim(),
                       ring: cs.outlineStyle !== 'none' && parseFloat(cs.outlineWidth) > 0};"#,
            vec![],
        );
        stops.push(stop.clone());
        if stop["key"] == "switch:audit" {
            break;
        }
    }
    let last = stops.last().unwrap().clone();
    assert_eq!(
        last["key"], "switch:audit",
        "the switch is reachable: {stops:?}"
    );
    for s in &stops {
        let tag = s["tag"].as_str().unwrap();
        assert!(
            ["BUTTON", "INPUT", "SELECT", "TEXTAREA", "A"].contains(&tag),
            "a focus stop that is not a control: {s}"
        );
        assert!(
            !s["name"].as_str().unwrap().is_empty(),
            "a control without a name: {s}"
        );
        assert_eq!(s["ring"], true, "no visible focus: {s}");
    }
    // Space on the switch switches the hook off.
    page.keys(" ");
    page.wait_visible("li.hook[data-id='audit'] button[role='switch'][aria-checked='false']");
    wait_for("the file to say so", || {
        c.get("/api/hooks/audit").json()["enabled"] == false
    });
    // The editor opens from the keyboard with the focus inside and closes with Escape,
    // returning the focus.
    page.js("document.getElementById('new-hook').focus();", vec![]);
    page.keys(&Key::Enter.to_string());
    page.wait_visible("#editor[open]");
    assert_eq!(
        page.js("return document.activeElement.id;", vec![]),
        "f-event"
    );
    page.keys(&Key::Escape.to_string());
    page.wait(
        "the editor to close",
        "return !document.getElementById('editor').open;",
        vec![],
    );
    assert_eq!(
        page.js("return document.activeElement.id;", vec![]),
        "new-hook"
    );
    // Nothing clickable that is not a button.
    assert_eq!(
        page.js("return document.querySelectorAll('[onclick], div[tabindex], span[tabindex], li[tabindex], a:not([href])').length;", vec![]),
        0
    );
    page.assert_no_script_errors();
}

#[test]
fn a_hook_with_an_error_shows_the_loaders_message_at_its_field() {
    let c = Console::start(&hooks_file(&[]));
    let page = c.sign_in(Viewport::Desktop);
    page.click("#new-hook");
    page.wait_visible("#editor[open]");
    page.js(
        "document.getElementById('f-event').value = 'tool_call';",
        vec![],
    );
    page.fill("#f-id", "audit-shell");
    page.fill("#f-command", "/bin/echo; rm -rf /");
    page.fill("#f-args", "one\ntwo");
    page.click("#editor-save");
    page.wait_visible("#f-command-error");
    let msg = page.text("#f-command-error");
    assert!(msg.contains("may not contain ';'"), "{msg}");
    assert!(!msg.starts_with("body:"), "the place is the field: {msg}");
    assert_eq!(
        page.js(
            "return document.getElementById('f-command').getAttribute('aria-invalid');",
            vec![]
        ),
        "true"
    );
    assert_eq!(
        page.js("return document.activeElement.id;", vec![]),
        "f-command"
    );
    assert!(
        page.text("#editor-error").is_empty(),
        "said at the field only"
    );
    page.shot("editor-error");
    // Another field, another place: the timeout (the loader's range), with the command fixed.
    page.fill("#f-command", "/bin/echo");
    page.fill("#f-timeout_ms", "0");
    page.click("#editor-save");
    page.wait(
        "the timeout's error",
        "const e = document.getElementById('f-timeout_ms-error'); return !e.hidden && e.textContent;",
        vec![],
    );
    assert!(
        page.js(
            "return document.getElementById('f-command-error').hidden;",
            vec![]
        ) == true,
        "the command's error is gone"
    );
    // And a line of the environment the form itself cannot send.
    page.fill("#f-timeout_ms", "2000");
    page.fill("#f-env", "LEVEL=info\nLD_PRELOAD=/tmp/x.so");
    page.click("#editor-save");
    page.wait(
        "the env error",
        "const e = document.getElementById('f-env-error'); return !e.hidden && e.textContent;",
        vec![],
    );
    assert!(
        page.text("#f-env-error").contains("LD_PRELOAD"),
        "{}",
        page.text("#f-env-error")
    );
    page.fill("#f-env", "LEVEL=info");
    page.click("#editor-save");
    page.wait(
        "the editor to close",
        "return !document.getElementById('editor').open;",
        vec![],
    );
    page.wait_visible("li.hook[data-id='audit-shell']");
    let hook = c.get("/api/hooks/audit-shell").json();
    assert_eq!(
        hook,
        json!({"id": "audit-shell", "event": "tool_call", "command": "/bin/echo",
               "args": ["one", "two"], "timeout_ms": 2000, "env": {"LEVEL": "info"},
               "stdin_json": false, "enabled": true})
    );
    // Edit: a merge patch of what changed.
    page.click("li.hook[data-id='audit-shell'] button[aria-label='Edit audit-shell']");
    page.wait_visible("#editor[open]");
    page.fill("#f-args", "three");
    page.fill("#f-timeout_ms", "");
    page.click("#editor-save");
    page.wait(
        "the save",
        "return !document.getElementById('editor').open;",
        vec![],
    );
    wait_for("the edit", || {
        c.get("/api/hooks/audit-shell").json()["args"] == json!(["three"])
    });
    assert_eq!(
        c.get("/api/hooks/audit-shell").json().get("timeout_ms"),
        None
    );
    // Delete, confirmed.
    page.click("li.hook[data-id='audit-shell'] button[aria-label='Delete audit-shell']");
    page.wait_visible("#confirm[open]");
    page.click("#confirm-ok");
    page.wait(
        "the hook to go",
        "return !document.querySelector(\"li.hook[data-id='audit-shell']\");",
        vec![],
    );
    assert_eq!(c.get("/api/hooks/audit-shell").status, 404);
    page.assert_no_script_errors();
}

/// Accepts connections on a port of its own and counts them: a payload that ran would
/// reach it.
fn observer() -> (u16, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for _ in l.incoming() {
            h.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, hits)
}

#[test]
fn script_payloads_in_events_runs_and_stderr_are_shown_as_text_and_never_run() {
    let (port, hits) = observer();
    let payload = format!(
        "<img src=x onerror=\"window.__pwned=1;fetch('http://127.0.0.1:{port}/img')\">\
         <script>window.__pwned=2;fetch('http://127.0.0.1:{port}/script')</script>\
         <svg onload=\"window.__pwned=3\"></svg>"
    );
    let c = Console::start(&hooks_file(&[json!({
        "id": "xss-hook", "event": "tool_call", "command": "/bin/sh",
        "args": ["-c", "printf '%s' \"$1\" >&2; exit 3", "sh", payload],
    })]));
    let page = c.sign_in(Viewport::Desktop);
    // Every CSP violation is recorded from here on (a payload that got into the DOM as
    // markup would cause one when its handler or script was blocked).
    page.js(
        "window.__violations = []; document.addEventListener('securitypolicyviolation', e => window.__violations.push(e.violatedDirective + ' ' + e.blockedURI));",
        vec![],
    );
    page.wait_visible("li.hook[data-id='xss-hook']");
    tool_call(&c.hooks, &payload, &payload, &payload);
    c.hooks
        .bus()
        .publish("myapp.audit", json!({"note": payload}).to_string())
        .unwrap();
    page.wait(
        "the hook's failed run in the stream",
        "return [...document.querySelectorAll('#stream-list li.row.run')].some(li => li.textContent.includes('exit 3'));",
        vec![],
    );
    page.wait(
        "the custom topic",
        "return [...document.querySelectorAll('#stream-list li.row.bus')].some(li => li.textContent.includes('myapp.audit'));",
        vec![],
    );
    // The test button: the run's stderr, literally.
    page.click("li.hook[data-id='xss-hook'] button[aria-label='Test xss-hook']");
    page.wait_visible("li.hook[data-id='xss-hook'] .hook-result pre.stderr");
    assert_eq!(
        page.text("li.hook[data-id='xss-hook'] .hook-result pre.stderr"),
        payload
    );
    assert!(
        page.text("li.hook[data-id='xss-hook'] .hook-result")
            .contains("exit 3")
    );
    // The row's detail and the run history show it literally too.
    page.js(
        "[...document.querySelectorAll('#stream-list li.row.bus .row-head')].forEach(b => b.click());",
        vec![],
    );
    page.click("li.hook[data-id='xss-hook'] button[aria-label='Runs of xss-hook']");
    page.wait(
        "the runs",
        "return document.querySelectorAll('#runs-table tbody pre.stderr').length >= 2;",
        vec![],
    );
    let stderr = page.js(
        "return [...document.querySelectorAll('#runs-table tbody pre.stderr')].map(p => p.textContent);",
        vec![],
    );
    for s in stderr.as_array().unwrap() {
        assert_eq!(s.as_str().unwrap(), payload);
    }
    page.shot("xss-runs");
    page.keys(&fantoccini::key::Key::Escape.to_string());
    // The agent filter lists the payload as an option's text.
    assert!(
        page.js(
            "return [...document.getElementById('filter-agent').options].some(o => o.value === arguments[0]);",
            vec![json!(payload)]
        ) == true
    );
    let shown = page.text("#stream-list");
    assert!(
        shown.contains(&payload[..60]),
        "the payload is displayed as text: {shown}"
    );
    page.shot("xss");
    // A hook id cannot carry markup (the loader refuses it); the refusal, which quotes it,
    // is shown at the field as text.
    page.click("#new-hook");
    page.wait_visible("#editor[open]");
    page.fill("#f-id", &payload);
    page.fill("#f-command", "/bin/true");
    page.click("#editor-save");
    page.wait_visible("#f-id-error");
    let refused = page.text("#f-id-error");
    assert!(
        refused.contains("<img src=x"),
        "quoted literally: {refused}"
    );
    page.shot("xss-hook-id");
    page.keys(&fantoccini::key::Key::Escape.to_string());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        page.js("return window.__pwned === undefined;", vec![]),
        true
    );
    assert_eq!(
        page.js(
            "return document.querySelectorAll('main img, main script, main svg:not(.spark):not(.bar), dialog img, dialog script, [onerror], [onload]').length;",
            vec![]
        ),
        0,
        "no element was made from the payload"
    );
    assert_eq!(page.js("return window.__violations;", vec![]), json!([]));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the payload made no request"
    );

    // Controls: the two defences are live in this browser, so the zeros above mean
    // something. Parsing the payload as markup throws (Trusted Types) …
    let thrown = page.js(
        "try { document.createElement('div').innerHTML = arguments[0]; return 'parsed'; } catch (e) { return e.name; }",
        vec![json!(payload)],
    );
    assert_eq!(thrown, "TypeError");
    // … so does giving an element an inline handler or a script text …
    let thrown = page.js(
        "const r = []; const i = document.createElement('img'); \
         try { i.setAttribute('onerror', 'window.__pwned = 4'); r.push('set'); } catch (e) { r.push(e.name); } \
         const s = document.createElement('script'); \
         try { s.textContent = 'window.__pwned = 5'; document.body.appendChild(s); r.push('ran'); } catch (e) { r.push(e.name); } \
         return r;",
        vec![],
    );
    assert_eq!(thrown, json!(["TypeError", "TypeError"]));
    // … and an inline style is refused by the policy (the page itself has none).
    page.js(
        "const d = document.createElement('div'); d.setAttribute('style', 'display: none'); document.body.appendChild(d); window.__styled = getComputedStyle(d).display;",
        vec![],
    );
    page.wait(
        "the violations to be reported",
        "return window.__violations.length >= 4 ? window.__violations : null;",
        vec![],
    );
    assert_eq!(page.js("return window.__styled;", vec![]), "block");
    let seen = page.js("return window.__violations.join('\\n');", vec![]);
    assert!(
        seen.as_str().unwrap().contains("require-trusted-types-for")
            && seen.as_str().unwrap().contains("style-src"),
        "{seen}"
    );
    assert_eq!(
        page.js("return window.__pwned === undefined;", vec![]),
        true
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[test]
fn the_page_fits_a_phone_screen() {
    let log_dir = tempfile::tempdir().unwrap();
    let c = Console::start(&hooks_file(&[
        appender(
            "audit-tool-calls",
            "tool_call",
            &log_dir.path().join("a.log"),
        ),
        json!({"id": "notify-on-end", "event": "agent_end", "command": "/bin/true", "matcher": null}),
    ]));
    let page = c.sign_in(Viewport::Phone);
    assert_eq!(page.js("return window.innerWidth;", vec![]), 375);
    tool_call(&c.hooks, "coder", "shell", "a tool call seen on a phone");
    page.wait(
        "the event",
        "return document.getElementById('stream-list').textContent.includes('seen on a phone');",
        vec![],
    );
    let overflow = page.js(
        "return [document.documentElement.scrollWidth, ...[...document.querySelectorAll('#app .card')].map(c => Math.ceil(c.getBoundingClientRect().right))];",
        vec![],
    );
    for w in overflow.as_array().unwrap() {
        assert!(
            w.as_f64().unwrap() <= 375.0,
            "wider than the screen: {overflow}"
        );
    }
    // One column: the cards stack.
    let lefts = page.js(
        "return [...document.querySelectorAll('#app .card')].map(c => Math.round(c.getBoundingClientRect().left));",
        vec![],
    );
    let lefts: Vec<f64> = lefts
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert!(lefts.windows(2).all(|w| w[0] == w[1]), "{lefts:?}");
    page.shot("phone");
    page.js("document.getElementById('hooks').scrollIntoView();", vec![]);
    page.shot("phone-hooks");
    page.js(
        "document.getElementById('stream').scrollIntoView();",
        vec![],
    );
    page.shot("phone-stream");
    // The editor fits too.
    page.click("#new-hook");
    page.wait_visible("#editor[open]");
    let right = page.js(
        "return Math.ceil(document.getElementById('editor').getBoundingClientRect().right);",
        vec![],
    );
    assert!(right.as_f64().unwrap() <= 375.0, "{right}");
    page.shot("phone-editor");
    page.assert_no_script_errors();
}

/// The overview README shows: hooks of several events, a live stream with events and runs,
/// counters that moved, and (with the `wasm` feature) a running plugin beside one the breaker
/// suspended, with the reason.
#[test]
fn the_overview_shows_counters_charts_and_plugin_states() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("audit.log");
    let c = Console::start_in(
        &hooks_file(&[
            appender("audit-tool-calls", "tool_call", &log),
            json!({"id": "audit-github", "event": "tool_call_start", "command": "/bin/true", "matcher": "mcp__github__*"}),
            json!({"id": "notify-on-end", "event": "agent_end", "command": "/bin/sh", "args": ["-c", "echo 'notify: no desktop session' >&2; exit 1"]}),
            json!({"id": "errors-to-file", "event": "error", "command": "/bin/true", "stdin_json": true}),
        ]),
        install_plugins,
    );
    let page = c.sign_in(Viewport::Desktop);
    // Traffic at a varying rate, for as long as the test looks at the page (the charts draw
    // the last minute).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (hooks, stop) = (c.hooks.clone(), stop.clone());
        std::thread::spawn(move || {
            let em = hooks.emitter("coder", "demo-1");
            let reviewer = hooks.emitter("reviewer", "demo-2");
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                em.emit(Event::ToolCallStart {
                    tool: if i.is_multiple_of(3) {
                        "mcp__github__create_pr"
                    } else {
                        "shell"
                    },
                    arguments: r#"{"cmd":"cargo test"}"#,
                });
                em.emit(Event::ToolCall {
                    tool: "shell",
                    success: !i.is_multiple_of(5),
                    output: "test result: ok. 42 passed; 0 failed",
                });
                if i.is_multiple_of(10) {
                    reviewer.emit(Event::LlmRequest {
                        provider: "anthropic",
                        model: "claude",
                        messages_count: i + 1,
                    });
                }
                if i == 20 {
                    em.emit(Event::AgentEnd {
                        success: true,
                        messages_count: 12,
                    });
                }
                // Between about 4 and 14 events a second.
                let pause = 70 + 80 * ((i / 15) % 2) + (i * 37 % 40);
                std::thread::sleep(Duration::from_millis(pause));
                i += 1;
            }
            i
        })
    };
    wait_for("the audit runs", || support::lines(&log).len() >= 30);
    page.wait(
        "the failed notifier in the stream",
        "return [...document.querySelectorAll('#stream-list li.row.run')].some(li => li.textContent.includes('notify-on-end'));",
        vec![],
    );
    page.wait(
        "the outcome chart's rows",
        "return document.querySelectorAll('#outcomes-chart .bar-row').length === 4;",
        vec![],
    );
    page.wait(
        "the rate chart's line",
        "return document.querySelectorAll('#rate-chart polyline').length >= 1;",
        vec![],
    );
    page.wait(
        "the shell sink's bar",
        "return [...document.querySelectorAll('#sinks-chart .bar-row')].some(r => r.textContent.startsWith('shell'));",
        vec![],
    );
    // Filters: by agent, then by event.
    page.js(
        "const s = document.getElementById('filter-agent'); s.value = 'reviewer'; s.dispatchEvent(new Event('change'));",
        vec![],
    );
    let agents = page.js(
        "return [...new Set([...document.querySelectorAll('#stream-list li.row.bus .who')].map(w => w.textContent))];",
        vec![],
    );
    assert_eq!(agents, json!(["reviewer / demo-2"]));
    page.js(
        "const a = document.getElementById('filter-agent'); a.value = ''; const s = document.getElementById('filter-event'); s.value = 'run'; s.dispatchEvent(new Event('change'));",
        vec![],
    );
    assert_eq!(
        page.js(
            "return document.querySelectorAll('#stream-list li.row.bus').length;",
            vec![]
        ),
        0
    );
    page.js(
        "const s = document.getElementById('filter-event'); s.value = ''; s.dispatchEvent(new Event('change'));",
        vec![],
    );
    // Pause holds new rows back and counts them; resume shows them.
    page.click("#pause");
    let before = page.js(
        "return document.querySelectorAll('#stream-list li.row').length;",
        vec![],
    );
    c.hooks.emitter("coder", "demo-1").emit(Event::TurnComplete);
    page.wait(
        "the paused count",
        "return document.getElementById('pause').textContent.includes('new');",
        vec![],
    );
    assert_eq!(
        page.js(
            "return document.querySelectorAll('#stream-list li.row').length;",
            vec![]
        ),
        before
    );
    page.click("#pause");
    page.wait(
        "the held row",
        "return [...document.querySelectorAll('#stream-list li.row.bus')].some(li => li.textContent.includes('turn_complete'));",
        vec![],
    );
    check_plugins(&c, &page);
    page.js("window.scrollTo(0, 0);", vec![]);
    page.wait(
        "ten seconds of rates",
        "return document.querySelector('#rate-chart polyline') && document.querySelector('#rate-chart polyline').getAttribute('points').split(' ').length >= 10;",
        vec![],
    );
    let shot = page.shot("overview");
    stop.store(true, Ordering::Relaxed);
    assert!(traffic.join().unwrap() >= 30);
    if std::env::var_os("PRX_HOOKS_UPDATE_DOCS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console.png");
        std::fs::create_dir_all(docs.parent().unwrap()).unwrap();
        std::fs::copy(&shot, &docs).unwrap();
    }
    page.js(
        "document.getElementById('plugins').scrollIntoView();",
        vec![],
    );
    page.shot("plugins");
    page.assert_no_script_errors();
}

#[cfg(feature = "wasm")]
fn install_plugins(ws: &Path) {
    plugins::install(ws, "audit-hook", "audit_hook", &plugins::audit_manifest());
    let trapper = "[plugin]\nname = \"flaky-notifier\"\nversion = \"0.3.1\"\n\n\
        [[capabilities]]\ntype = \"hook\"\nevents = [\"prx.lifecycle.tool_call\"]\n\n\
        [permissions]\nrequired = [\"log\", \"config\", \"kv\", \"events\"]\n\n\
        [config]\nmode = \"trap\"\n";
    plugins::install(ws, "flaky-notifier", "misbehave", trapper);
}

#[cfg(not(feature = "wasm"))]
fn install_plugins(_: &Path) {}

#[cfg(feature = "wasm")]
fn check_plugins(c: &Console, page: &Page) {
    // The trapping plugin is suspended by its breaker (and resumes on probation, to be
    // suspended again for longer): the page shows the state and why.
    let em = c.hooks.emitter("coder", "demo-1");
    let why = page.wait_with(
        "the suspended plugin and its reason",
        || {
            em.emit(Event::ToolCall {
                tool: "shell",
                success: true,
                output: "",
            });
        },
        "const p = document.querySelector(\"li.plugin[data-name='flaky-notifier'][data-state='suspended'] .why\"); return p ? p.textContent : null;",
    );
    assert!(why.as_str().unwrap().contains("trap"), "{why}");
    let running = page.text("li.plugin[data-name='audit-hook'] .badge");
    assert_eq!(running, "running");
    page.wait(
        "the audit plugin's calls",
        "const b = [...document.querySelectorAll(\"li.plugin[data-name='audit-hook'] .bar-row\")].find(r => r.textContent.startsWith('ok')); return b && b.querySelector('.bar-value').textContent !== '0';",
        vec![],
    );
}

#[cfg(not(feature = "wasm"))]
fn check_plugins(_: &Console, page: &Page) {
    page.wait(
        "the plugins panel",
        "return document.getElementById('plugins-list').textContent.includes('not enabled');",
        vec![],
    );
}

#[allow(dead_code)]
fn screenshots() -> PathBuf {
    browser::screenshot_dir()
}

/// Characters that must not reach the page as they are (tail's rule: C0 but for the line
/// breaks of multi-line blocks, DEL, C1, and the bidirectional controls), as a JS regex.
const HAZARDS: &str =
    r"/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]/";

#[test]
fn bidi_and_control_characters_are_shown_escaped_as_tail_shows_them() {
    let c = Console::start(&hooks_file(&[]));
    let page = c.sign_in(Viewport::Desktop);
    // An agent name ending in RIGHT-TO-LEFT OVERRIDE would show everything after it reversed.
    let agent = "coder\u{202e}";
    let output = "fine\u{2066}\u{1b}[31mred\u{9b}2J\u{7f}\u{200f}end";
    tool_call(&c.hooks, agent, "shell\u{061c}", output);
    let row = page.wait(
        "the event in the live list",
        "const r = [...document.querySelectorAll('#stream-list li.row.bus')].find(li => li.textContent.includes('end')); return r ? r.textContent : null;",
        vec![],
    );
    let row = row.as_str().unwrap();
    assert!(row.contains(r"coder\u{202e}"), "{row:?}");
    assert!(row.contains(r"shell\u{61c}"), "{row:?}");
    assert!(
        row.contains(r"fine\u{2066}\u{1b}[31mred\u{9b}2J\u{7f}\u{200f}end"),
        "{row:?}"
    );
    // Opened, its JSON is escaped the same way.
    page.js(
        "document.querySelector('#stream-list li.row.bus .row-head').click();",
        vec![],
    );
    let detail = page.text("#stream-list li.row.bus pre.detail");
    assert!(detail.contains(r"coder\u{202e}"), "{detail}");
    // Nowhere in the page's text, attributes or menus does a hazard remain.
    let found = page.js(
        &format!(
            "const re = {HAZARDS}; const hits = []; \
             for (const n of document.querySelectorAll('body *')) {{ \
               for (const a of n.attributes) if (a.name !== 'value' && re.test(a.value)) hits.push(n.tagName + '@' + a.name + ': ' + JSON.stringify(a.value)); \
               for (const t of n.childNodes) if (t.nodeType === 3 && re.test(t.data)) hits.push(n.tagName + ': ' + JSON.stringify(t.data)); \
             }} return hits;"
        ),
        vec![],
    );
    assert_eq!(found, json!([]), "raw hazards in the page");
    // The agent filter still filters by the real name (the option's value), shown escaped.
    let option = page.js(
        "const o = [...document.getElementById('filter-agent').options].find(o => o.value === arguments[0]); return o ? o.textContent : null;",
        vec![json!(agent)],
    );
    assert_eq!(option, json!(r"coder\u{202e}"));
    page.assert_no_script_errors();
}

#[test]
fn the_filter_menus_are_capped_and_say_that_more_exist() {
    let c = Console::start(&hooks_file(&[]));
    let page = c.sign_in(Viewport::Desktop);
    tool_call(&c.hooks, "agent-0", "shell", "first");
    page.wait(
        "the first agent in the menu",
        "return [...document.getElementById('filter-agent').options].some(o => o.value === 'agent-0');",
        vec![],
    );
    // A filter in use stays in its menu whatever comes after.
    page.js(
        "const s = document.getElementById('filter-agent'); s.value = 'agent-0'; s.dispatchEvent(new Event('change'));",
        vec![],
    );
    const N: usize = 300;
    for i in 1..N {
        tool_call(&c.hooks, &format!("agent-{i}"), "shell", "x");
        c.hooks.bus().publish(&format!("topic.t{i}"), "{}").unwrap();
    }
    let last = format!("agent-{}", N - 1);
    page.wait(
        "the last agent in the menu",
        "return [...document.getElementById('filter-agent').options].some(o => o.value === arguments[0]);",
        vec![json!(last)],
    );
    page.wait(
        "the last topic in the menu",
        "return [...document.getElementById('filter-event').options].some(o => o.value === arguments[0]);",
        vec![json!(format!("topic.t{}", N - 1))],
    );
    for menu in ["filter-agent", "filter-event"] {
        let options = page.js(
            "return [...document.getElementById(arguments[0]).options].map(o => [o.value, o.textContent, o.disabled]);",
            vec![json!(menu)],
        );
        let options = options.as_array().unwrap();
        assert!(
            options.len() <= 202,
            "{menu}: {} options for {N} values",
            options.len()
        );
        let more = options.last().unwrap();
        assert_eq!(more[2], true, "{menu}: the last option is a note: {more}");
        assert!(more[1].as_str().unwrap().contains("more"), "{menu}: {more}");
    }
    assert_eq!(
        page.js(
            "return document.getElementById('filter-agent').value;",
            vec![]
        ),
        "agent-0",
        "the filter in use kept its option"
    );
    page.assert_no_script_errors();
}

/// The session view: the sessions agents send events for, with their tokens, filtered by
/// agent; choosing one shows only its events and hook runs in the live list.
#[test]
fn the_sessions_view_lists_each_sessions_tokens_and_picks_one_for_the_live_list() {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("runs.log");
    let c = Console::start(&hooks_file(&[appender("audit", "tool_call_start", &log)]));
    let page = c.sign_in(Viewport::Desktop);
    let line = |agent: &str, session: &str, event: &str, payload: Value| {
        json!({"event": event, "agent": agent, "session": session, "payload": payload}).to_string()
    };
    let tool = |cmd: &str| json!({"tool": "Bash", "arguments": {"command": cmd}});
    let body = [
        line(
            "coder",
            "s-one",
            "llm_response",
            json!({"provider": "anthropic", "model": "m",
            "duration_ms": 5, "success": true, "input_tokens": 1200, "output_tokens": 34}),
        ),
        line("coder", "s-one", "tool_call_start", tool("ls one")),
        line("coder", "s-two", "tool_call_start", tool("ls two")),
        line("reviewer", "s-three", "tool_call_start", tool("ls three")),
    ]
    .join("\n");
    let auth = format!("Bearer {TOKEN}");
    let r = http(
        "POST",
        &c.url("/api/events"),
        &[
            ("authorization", &auth),
            ("content-type", "application/x-ndjson"),
        ],
        body.as_bytes(),
    );
    assert!(r.status < 300, "{} {}", r.status, r.text);
    // Every hook run is on the stream before the view is read.
    page.wait(
        "three hook runs",
        "return document.querySelectorAll('#stream-list li.row.run').length >= 3;",
        vec![],
    );
    let cells = page.wait(
        "s-one's row with its tokens",
        "const r = document.querySelector('#sessions-list tr[data-session=\"s-one\"]'); return r ? [...r.cells].map(c => c.textContent) : null;",
        vec![],
    );
    let cells: Vec<&str> = cells
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(&cells[..4], ["coder", "s-one", "1200", "34"], "{cells:?}");

    // By agent: the reviewer's session alone.
    page.js(
        "const s = document.getElementById('sessions-agent'); s.value = 'reviewer'; s.dispatchEvent(new Event('change'));",
        vec![],
    );
    let shown = page.wait(
        "the reviewer's sessions only",
        "const rows = [...document.querySelectorAll('#sessions-list tr')].map(r => r.dataset.session); return rows.length === 1 ? rows : null;",
        vec![],
    );
    assert_eq!(shown, json!(["s-three"]));
    page.js(
        "const s = document.getElementById('sessions-agent'); s.value = ''; s.dispatchEvent(new Event('change'));",
        vec![],
    );

    // One session picked: its event, its model call and its hook run, nothing of the others.
    page.wait(
        "s-two's row back",
        "return !!document.querySelector('#sessions-list tr[data-session=\"s-two\"]');",
        vec![],
    );
    page.click("#sessions-list tr[data-session=\"s-one\"] button.link");
    let rows = page.wait(
        "only s-one's rows",
        "const rows = [...document.querySelectorAll('#stream-list li.row')].map(li => li.textContent); return rows.length === 3 ? rows : null;",
        vec![],
    );
    let rows = rows.to_string();
    assert!(
        rows.contains("ls one") && rows.contains("llm_response"),
        "{rows}"
    );
    assert!(rows.contains("hook audit"), "its hook run: {rows}");
    assert!(
        !rows.contains("ls two") && !rows.contains("ls three"),
        "{rows}"
    );
    assert!(page.text("#session-chip").contains("s-one"));

    // The chip lets every session back in.
    page.click("#session-chip");
    page.wait(
        "every row again",
        "return document.querySelectorAll('#stream-list li.row').length >= 7;",
        vec![],
    );
    page.assert_no_script_errors();
}
