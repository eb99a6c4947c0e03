//! The HTTP API (ARCHITECTURE.md § HTTP API) over real loopback TCP with a real HTTP client (ureq): a real
//! `Hooks` on a temporary workspace, the real watcher, real hook processes.

use prx_hooks::http::{HttpOptions, Server, Token};
use prx_hooks::{Emit, Event, Hooks};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use ureq::http::Request;

#[cfg(feature = "wasm")]
#[path = "support/plugins.rs"]
mod plugins;

#[path = "support/hooks.rs"]
mod support;

use support::{append_args, lines, wait_for};

const TOKEN: &str = "test-token-0123456789abcdef";

struct Api {
    ws: tempfile::TempDir,
    hooks: Arc<Hooks>,
    server: Server,
    agent: ureq::Agent,
}

/// A response, read whole.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: ureq::http::HeaderMap,
    text: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn etag(&self) -> String {
        self.header("etag").expect("an ETag").to_string()
    }

    /// The JSON error: status, `error`, `path`.
    fn error(&self, status: u16) -> (String, String) {
        assert_eq!(self.status, status, "{}", self.text);
        let v = self.json();
        let error = v["error"].as_str().expect("an error message").to_string();
        let path = v["path"].as_str().expect("a path").to_string();
        (error, path)
    }
}

impl Api {
    fn start(hooks_json: Option<&str>) -> Api {
        Api::start_with(hooks_json, |o| o)
    }

    fn start_with(hooks_json: Option<&str>, opts: impl FnOnce(HttpOptions) -> HttpOptions) -> Api {
        Api::start_prepared(hooks_json, opts, |_| {})
    }

    /// `prepare` fills the workspace before the hook system starts.
    fn start_prepared(
        hooks_json: Option<&str>,
        opts: impl FnOnce(HttpOptions) -> HttpOptions,
        prepare: impl FnOnce(&Path),
    ) -> Api {
        let ws = tempfile::tempdir().unwrap();
        if let Some(text) = hooks_json {
            std::fs::write(ws.path().join("hooks.json"), text).unwrap();
        }
        prepare(ws.path());
        let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
        let options = opts(HttpOptions::new(Token::new(TOKEN, "test").unwrap()));
        let server = Server::start(hooks.clone(), options, "127.0.0.1:0".parse().unwrap()).unwrap();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Api {
            ws,
            hooks,
            server,
            agent,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.local_addr())
    }

    fn ws(&self) -> &Path {
        self.ws.path()
    }

    /// Any request: `headers` are added after the token (pass `None` as token to omit it).
    fn raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Resp {
        let mut req = Request::builder().method(method).uri(self.url(path));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(body.to_vec()).unwrap();
        let mut resp = self
            .agent
            .run(req)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Resp {
            status,
            headers,
            text,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Resp {
        self.call_if(method, path, body, None)
    }

    fn call_if(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Resp {
        let mut headers = vec![];
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        if body.is_some() {
            headers.push(("content-type", "application/json"));
        }
        if let Some(tag) = if_match {
            headers.push(("if-match", tag));
        }
        self.raw(method, path, Some(TOKEN), &headers, bytes.as_bytes())
    }

    fn get(&self, path: &str) -> Resp {
        self.call("GET", path, None)
    }

    fn create(&self, hook: Value) -> Value {
        let r = self.call("POST", "/api/hooks", Some(&hook));
        assert_eq!(r.status, 201, "{}", r.text);
        assert!(self.loads().is_ok(), "hooks.json invalid after a create");
        r.json()
    }

    fn ids(&self) -> Vec<String> {
        let r = self.get("/api/hooks");
        assert_eq!(r.status, 200, "{}", r.text);
        r.json()["hooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// The file on disk, through the real loader.
    fn loads(&self) -> Result<prx_hooks::config::HookTable, prx_hooks::config::ConfigErrors> {
        prx_hooks::config::load(self.ws())
    }
}

/// A hook that appends "<tag> <output>" to `log` for every tool_call, reading stdin.
fn appender(tag: &str, log: &Path) -> Value {
    let args = append_args(tag, log);
    json!({"event": "tool_call", "command": "/bin/sh", "args": args, "stdin_json": true})
}

fn tool_call(hooks: &Hooks, output: &str) -> Emit {
    hooks.emitter("agent", "session").emit(Event::ToolCall {
        tool: "shell",
        success: true,
        output,
    })
}

const TWO: &str = r#"{
  "timeout_ms": 4000,
  "hooks": {
    "tool_call": [ { "command": "/bin/true", "args": ["a"] } ],
    "agent_start": [ { "id": "start", "command": "/bin/true" } ]
  }
}"#;

#[test]
fn healthz_is_open_and_everything_else_needs_the_token() {
    let api = Api::start(Some(TWO));
    let r = api.raw("GET", "/healthz", None, &[], b"");
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
    for (method, path) in [
        ("GET", "/api/hooks"),
        ("POST", "/api/hooks"),
        ("GET", "/api/hooks/start"),
        ("PUT", "/api/hooks/start"),
        ("DELETE", "/api/hooks/start"),
        ("PATCH", "/api/hooks/start/toggle"),
        ("POST", "/api/hooks/start/test"),
        ("GET", "/api/hooks/start/runs"),
        ("GET", "/api/plugins"),
        ("GET", "/api/stats"),
        ("GET", "/metrics"),
        ("GET", "/api/nothing-here"),
    ] {
        let none = api.raw(method, path, None, &[], b"");
        let (e, _) = none.error(401);
        assert!(e.contains("missing Authorization"), "{method} {path}: {e}");
        assert_eq!(
            none.header("www-authenticate"),
            Some(r#"Bearer realm="prx-hooks""#)
        );
        let wrong = api.raw(method, path, Some("test-token-0123456789abcdeF"), &[], b"");
        assert_eq!(wrong.error(401).0, "wrong token", "{method} {path}");
        let basic = api.raw(
            method,
            path,
            None,
            &[("authorization", "Basic dXNlcjpwYXNz")],
            b"",
        );
        assert!(basic.error(401).0.contains("Bearer scheme"));
    }
    // Nothing was changed by the refused writes.
    assert_eq!(api.ids().len(), 2);
    // The scheme is case-insensitive.
    let r = api.raw(
        "GET",
        "/api/hooks",
        None,
        &[("authorization", &format!("bearer {TOKEN}"))],
        b"",
    );
    assert_eq!(r.status, 200);
}

#[test]
fn list_get_create_update_toggle_delete() {
    let api = Api::start(Some(TWO));
    let list = api.get("/api/hooks");
    assert_eq!(list.status, 200);
    assert_eq!(list.header("content-type"), Some("application/json"));
    let hooks = list.json()["hooks"].as_array().unwrap().clone();
    assert_eq!(hooks.len(), 2);
    // A flat object: the file's fields plus event and id; the top-level timeout is not added.
    assert_eq!(
        hooks[1],
        json!({"id": "start", "event": "agent_start", "command": "/bin/true"})
    );
    assert_eq!(hooks[0]["event"], "tool_call");
    assert!(hooks[0].get("timeout_ms").is_none());
    let derived = hooks[0]["id"].as_str().unwrap().to_string();

    // GET one, with its ETag; If-None-Match answers 304.
    let one = api.get("/api/hooks/start");
    assert_eq!((one.status, one.json()), (200, hooks[1].clone()));
    let tag = one.etag();
    assert!(tag.starts_with('"') && tag.ends_with('"'), "{tag}");
    let cached = api.raw(
        "GET",
        "/api/hooks/start",
        Some(TOKEN),
        &[("if-none-match", &tag)],
        b"",
    );
    assert_eq!((cached.status, cached.text.as_str()), (304, ""));
    let (e, _) = api.get("/api/hooks/nope").error(404);
    assert!(e.contains("\"nope\""), "{e}");

    // POST: 201, the hook with its new id, Location and ETag; live at once.
    let created = api.call(
        "POST",
        "/api/hooks",
        Some(&json!({"event": "error", "command": "/bin/echo", "args": ["x"], "timeout_ms": 500})),
    );
    assert_eq!(created.status, 201, "{}", created.text);
    let hook = created.json();
    let id = hook["id"].as_str().unwrap().to_string();
    assert_eq!(
        created.header("location"),
        Some(format!("/api/hooks/{id}").as_str())
    );
    assert_eq!(hook["timeout_ms"], 500);
    assert!(
        api.hooks.hook_table().get(&id).is_some(),
        "live before the response"
    );
    assert_eq!(api.get(&format!("/api/hooks/{id}")).json(), hook);

    // PUT: a merge patch; null removes a field; moving to another event keeps the id.
    let put = api.call(
        "PUT",
        &format!("/api/hooks/{id}"),
        Some(&json!({"args": ["y", "z"], "timeout_ms": null, "event": "agent_end"})),
    );
    assert_eq!(put.status, 200, "{}", put.text);
    let moved = put.json();
    assert_eq!(
        moved,
        json!({"id": id, "event": "agent_end", "command": "/bin/echo", "args": ["y", "z"]})
    );
    let live = api.hooks.hook_table();
    let action = live.get(&id).unwrap();
    assert_eq!(action.event.name(), "agent_end");
    assert_eq!(action.args, ["y", "z"]);
    let (e, p) = api
        .call(
            "PUT",
            &format!("/api/hooks/{id}"),
            Some(&json!({"id": "other"})),
        )
        .error(422);
    assert!(e.contains("cannot change"), "{e}");
    assert_eq!(p, "id");

    // PATCH toggle: off, then on again; live each time.
    let off = api.call("PATCH", &format!("/api/hooks/{id}/toggle"), None);
    assert_eq!((off.status, &off.json()["enabled"]), (200, &json!(false)));
    assert!(!api.hooks.hook_table().get(&id).unwrap().enabled);
    let on = api.call("PATCH", &format!("/api/hooks/{id}/toggle"), None);
    assert_eq!((on.status, &on.json()["enabled"]), (200, &json!(true)));
    assert!(api.hooks.hook_table().get(&id).unwrap().enabled);
    api.call("PATCH", "/api/hooks/nope/toggle", None).error(404);

    // DELETE: 204, gone from the file and the live table; a second delete is 404.
    let del = api.call("DELETE", &format!("/api/hooks/{id}"), None);
    assert_eq!((del.status, del.text.as_str()), (204, ""));
    assert!(api.hooks.hook_table().get(&id).is_none());
    api.call("DELETE", &format!("/api/hooks/{id}"), None)
        .error(404);
    assert_eq!(api.ids(), [derived, "start".to_string()]);
    assert!(api.loads().is_ok());

    // Wrong methods and unknown paths: JSON errors.
    let (e, _) = api.call("POST", "/api/hooks/start", None).error(405);
    assert!(e.contains("POST is not allowed"), "{e}");
    let (e, _) = api.get("/api/hook").error(404);
    assert!(e.contains("no route"), "{e}");
}

#[test]
fn ids_are_written_once_and_never_shift() {
    let api = Api::start(Some(
        r#"{"hooks":{"tool_call":[
            {"command":"/bin/echo","args":["1"]},
            {"command":"/bin/echo","args":["2"]},
            {"command":"/bin/echo","args":["3"]}]}}"#,
    ));
    let before = api.ids();
    assert_eq!(before.len(), 3);
    // Reading writes nothing; the first write persists every derived id.
    assert!(
        !std::fs::read_to_string(api.ws().join("hooks.json"))
            .unwrap()
            .contains("\"id\"")
    );
    let r = api.call("DELETE", &format!("/api/hooks/{}", before[0]), None);
    assert_eq!(r.status, 204);
    assert_eq!(api.ids(), before[1..]);
    let text = std::fs::read_to_string(api.ws().join("hooks.json")).unwrap();
    for id in &before[1..] {
        assert!(
            text.contains(&format!("\"id\": \"{id}\"")),
            "{id} not persisted:\n{text}"
        );
    }
    // A new hook with the same content as the deleted one does not take anyone's id.
    let again = api.create(json!({"event": "tool_call", "command": "/bin/echo", "args": ["1"]}));
    let ids = api.ids();
    assert_eq!(ids[..2], before[1..]);
    assert_eq!(ids[2], again["id"].as_str().unwrap());
    api.call("DELETE", &format!("/api/hooks/{}", before[1]), None);
    assert_eq!(api.ids(), [before[2].clone(), ids[2].clone()]);
    // A caller-chosen id is kept; a duplicate one is refused.
    let named = api.create(json!({"id": "mine", "event": "error", "command": "/bin/true"}));
    assert_eq!(named["id"], "mine");
    let (e, p) = api
        .call(
            "POST",
            "/api/hooks",
            Some(&json!({"id": "mine", "event": "error", "command": "/bin/true"})),
        )
        .error(422);
    assert!(e.contains("duplicate id"), "{e}");
    assert_eq!(p, "id");
}

#[test]
fn etags_if_match_and_hand_edits() {
    let api = Api::start(Some(TWO));
    let one = api.get("/api/hooks/start");
    let tag = one.etag();
    let list_tag = api.get("/api/hooks").etag();

    // A matching If-Match goes through and changes the ETag.
    let r = api.call_if(
        "PUT",
        "/api/hooks/start",
        Some(&json!({"args": ["1"]})),
        Some(&tag),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let new_tag = r.etag();
    assert_ne!(new_tag, tag);
    assert_eq!(api.get("/api/hooks/start").etag(), new_tag);

    // The old one is stale now: 412, nothing written.
    let before = std::fs::read(api.ws().join("hooks.json")).unwrap();
    for (method, path, body) in [
        ("PUT", "/api/hooks/start", Some(json!({"args": ["2"]}))),
        ("PATCH", "/api/hooks/start/toggle", None),
        ("DELETE", "/api/hooks/start", None),
        (
            "POST",
            "/api/hooks",
            Some(json!({"event": "error", "command": "/bin/true"})),
        ),
    ] {
        let stale = if method == "POST" { &list_tag } else { &tag };
        let (e, _) = api
            .call_if(method, path, body.as_ref(), Some(stale))
            .error(412);
        assert!(e.contains("does not match"), "{method}: {e}");
    }
    assert_eq!(std::fs::read(api.ws().join("hooks.json")).unwrap(), before);

    // A hand edit the API has not seen: the next write is refused with 409 and the file is
    // left as the hand made it; after reading again, the retry goes through.
    let edited = String::from_utf8(before)
        .unwrap()
        .replace("\"/bin/true\"", "\"/bin/echo\"");
    std::fs::write(api.ws().join("hooks.json"), &edited).unwrap();
    let (e, _) = api
        .call("PUT", "/api/hooks/start", Some(&json!({"args": ["3"]})))
        .error(409);
    assert!(e.contains("changed on disk"), "{e}");
    assert_eq!(
        std::fs::read_to_string(api.ws().join("hooks.json")).unwrap(),
        edited
    );
    let fresh = api.get("/api/hooks/start");
    assert_eq!(fresh.json()["command"], "/bin/echo");
    let r = api.call_if(
        "PUT",
        "/api/hooks/start",
        Some(&json!({"args": ["3"]})),
        Some(&fresh.etag()),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["command"], "/bin/echo", "the hand edit survives");

    // A hand edit that breaks the file: writes get 409 with the loader's error; reads too.
    std::fs::write(
        api.ws().join("hooks.json"),
        "{\"hooks\": {\"tool_call\": [}",
    )
    .unwrap();
    let (e, _) = api
        .call("PATCH", "/api/hooks/start/toggle", None)
        .error(409);
    assert!(e.contains("hooks.json"), "{e}");
}

#[test]
fn bad_bodies_get_the_right_status_and_message() {
    let api = Api::start(Some(TWO));
    let json_ct = [("content-type", "application/json")];
    let post = |headers: &[(&str, &str)], body: &[u8]| {
        api.raw("POST", "/api/hooks", Some(TOKEN), headers, body)
    };

    let (e, p) = post(&json_ct, b"{\"event\": \"error\",\n \"command\": }").error(400);
    assert!(e.contains("invalid JSON at line 2 column"), "{e}");
    assert_eq!(p, "command");
    let (e, _) = post(&json_ct, b"").error(400);
    assert!(e.contains("empty"), "{e}");
    let (e, _) = post(&json_ct, b"[1, 2]").error(400);
    assert!(e.contains("must be a JSON object"), "{e}");
    let (e, _) = post(
        &json_ct,
        b"{\"event\": \"error\", \"command\": \"/bin/true\"} x",
    )
    .error(400);
    assert!(e.contains("invalid JSON"), "{e}");
    let (e, _) = post(&json_ct, b"\xff{}").error(400);
    assert!(e.contains("UTF-8"), "{e}");

    // Media type.
    let (e, _) = post(&[], b"{\"event\":\"error\",\"command\":\"/bin/true\"}").error(415);
    assert!(e.contains("application/json"), "{e}");
    post(&[("content-type", "text/plain")], b"{}").error(415);
    post(
        &[("content-type", "application/json; charset=latin1")],
        b"{}",
    )
    .error(415);
    let ok = post(
        &[(
            "content-type",
            "application/merge-patch+json; charset=UTF-8",
        )],
        b"{\"event\":\"error\",\"command\":\"/bin/true\"}",
    );
    assert_eq!(ok.status, 201, "{}", ok.text);

    // Validation: the loader's rules and messages, paths relative to the body.
    let invalid = |body: Value| api.call("POST", "/api/hooks", Some(&body)).error(422);
    let (e, p) = invalid(json!({"event": "error", "command": "/bin/true", "timeout_ms": "5s"}));
    assert_eq!(p, "timeout_ms");
    assert!(e.contains("hooks.json:"), "the loader's line: {e}");
    let (e, p) = invalid(json!({"event": "error", "command": "/bin/true", "comand": "x"}));
    assert_eq!(p, "comand");
    assert!(e.contains("unknown") && e.contains("command"), "{e}");
    let (_, p) = invalid(json!({"event": "error", "command": "/bin/true", "args": ["a", 3]}));
    assert_eq!(p, "args[1]");
    let (e, p) = invalid(json!({"event": "tool_cal", "command": "/bin/true"}));
    assert_eq!(p, "event");
    assert!(e.contains("tool_call"), "did you mean: {e}");
    let (e, _) = invalid(json!({"event": "error", "command": "ls; rm -rf /"}));
    assert!(e.contains("metacharacter") || e.contains("shell"), "{e}");
    let (e, p) = api
        .raw(
            "POST",
            "/api/hooks",
            Some(TOKEN),
            &json_ct,
            br#"{"event":"error","command":"/bin/true","command":"/bin/echo"}"#,
        )
        .error(422);
    assert!(e.contains("duplicate key"), "{e}");
    assert_eq!(p, "command");
    let (e, p) = api
        .call("POST", "/api/hooks", Some(&json!({"command": "/bin/true"})))
        .error(422);
    assert!(e.contains("\"event\" is required"), "{e}");
    assert_eq!(p, "event");

    // PUT bodies: a merge patch must be an object; wrong types are 422.
    let (e, _) = api
        .call("PUT", "/api/hooks/start", Some(&json!("x")))
        .error(400);
    assert!(e.contains("merge patch must be a JSON object"), "{e}");
    let (_, p) = api
        .call("PUT", "/api/hooks/start", Some(&json!({"enabled": "yes"})))
        .error(422);
    assert_eq!(p, "enabled");

    // Oversize, with a Content-Length and chunked.
    let big = format!(
        "{{\"event\":\"error\",\"command\":\"/bin/true\",\"args\":[\"{}\"]}}",
        "x".repeat(300 * 1024)
    );
    let (e, _) = post(&json_ct, big.as_bytes()).error(413);
    assert!(e.contains("262144 bytes"), "{e}");
    let chunked = chunked_post(&api, "/api/hooks", big.as_bytes());
    assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
    assert!(chunked.contains("\"kind\":\"too_large\""), "{chunked}");

    // Nothing of it reached the file.
    let ids = api.ids();
    assert_eq!(ids.len(), 3, "only the one valid create: {ids:?}");
    assert!(api.loads().is_ok());
}

/// POSTs `body` with chunked transfer encoding over a raw socket; returns the raw response.
fn chunked_post(api: &Api, path: &str, body: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(api.server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    for chunk in body.chunks(16 * 1024) {
        if write!(s, "{:x}\r\n", chunk.len()).is_err()
            || s.write_all(chunk).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break; // the server answered and closed early
        }
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_body_limit_can_be_set() {
    let api = Api::start_with(None, |o| o.max_body_bytes(64));
    let body = json!({"event": "error", "command": "/bin/true", "args": ["0123456789012345678901234567890123456789"]});
    let (e, _) = api.call("POST", "/api/hooks", Some(&body)).error(413);
    assert!(e.contains("64 bytes"), "{e}");
}

#[test]
fn a_created_hook_fires_on_the_next_event_and_toggle_stops_and_restarts_it() {
    let api = Api::start(None);
    let log = api.ws().join("log");
    let hook = api.create(appender("h", &log));
    let id = hook["id"].as_str().unwrap().to_string();
    // Live before the response: the very next event runs the real process.
    tool_call(&api.hooks, "first");
    wait_for("the created hook", || {
        lines(&log).iter().any(|l| l.contains("first"))
    });

    let off = api.call("PATCH", &format!("/api/hooks/{id}/toggle"), None);
    assert_eq!(off.json()["enabled"], false);
    // Live before the response: with its only hook off, nobody wants tool_call events.
    assert_eq!(tool_call(&api.hooks, "while-off"), Emit::Skipped);
    let on = api.call("PATCH", &format!("/api/hooks/{id}/toggle"), None);
    assert_eq!(on.json()["enabled"], true);
    tool_call(&api.hooks, "again");
    wait_for("the re-enabled hook", || {
        lines(&log).iter().any(|l| l.contains("again"))
    });
    let all = lines(&log);
    assert!(!all.iter().any(|l| l.contains("while-off")), "{all:?}");

    // The run history, newest first, and the test endpoint (which runs even when disabled).
    wait_for("two runs in the history", || {
        api.get(&format!("/api/hooks/{id}/runs")).json()["runs"]
            .as_array()
            .unwrap()
            .len()
            == 2
    });
    let runs = api.get(&format!("/api/hooks/{id}/runs")).json();
    assert_eq!(runs["id"], id.as_str());
    let first = &runs["runs"][0];
    assert_eq!(
        (first["outcome"].as_str(), first["ok"].as_bool()),
        (Some("ok"), Some(true))
    );
    assert_eq!(first["timed_out"], false);
    assert!(first["duration_ms"].as_f64().unwrap() > 0.0);
    assert!(first["time"].as_str().unwrap().ends_with('Z'));
    let limited = api.get(&format!("/api/hooks/{id}/runs?limit=1")).json();
    assert_eq!(limited["runs"].as_array().unwrap().len(), 1);
    let (e, p) = api.get(&format!("/api/hooks/{id}/runs?limit=0")).error(400);
    assert!(e.contains("positive integer"), "{e}");
    assert_eq!(p, "limit");
    api.get(&format!("/api/hooks/{id}/runs?max=3")).error(400);
    api.get("/api/hooks/nope/runs").error(404);
}

#[test]
fn the_test_endpoint_runs_once_and_reports_failures_with_200() {
    let api = Api::start(None);
    let log = api.ws().join("log");
    let hook = api.create(appender("t", &log));
    let id = hook["id"].as_str().unwrap().to_string();
    api.call("PATCH", &format!("/api/hooks/{id}/toggle"), None);

    // Disabled, no body: the sample payload.
    let r = api.call("POST", &format!("/api/hooks/{id}/test"), None);
    assert_eq!(r.status, 200, "{}", r.text);
    let out = r.json();
    assert_eq!(
        (out["outcome"].as_str(), out["ok"].as_bool()),
        (Some("ok"), Some(true))
    );
    assert!(out["pid"].as_u64().is_some());
    assert_eq!(lines(&log).len(), 1, "ran once: {:?}", lines(&log));
    // A given payload reaches the process.
    let payload = json!({"tool": "git", "success": false, "output": "given-payload"});
    let r = api.call("POST", &format!("/api/hooks/{id}/test"), Some(&payload));
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        lines(&log)[1].contains("given-payload"),
        "{:?}",
        lines(&log)
    );
    // A payload that does not fit the event: 422 with the NDJSON rules' message.
    let (e, _) = api
        .call(
            "POST",
            &format!("/api/hooks/{id}/test"),
            Some(&json!({"tool": "git"})),
        )
        .error(422);
    assert!(e.contains("missing field `success`"), "{e}");

    // A failing hook: 200 with the failure, its exit status and stderr tail.
    let failing = api.create(json!({
        "event": "error", "command": "/bin/sh",
        "args": ["-c", "echo broken-on-purpose >&2; exit 3"]
    }));
    let fid = failing["id"].as_str().unwrap();
    let r = api.call("POST", &format!("/api/hooks/{fid}/test"), None);
    assert_eq!(r.status, 200, "{}", r.text);
    let out = r.json();
    assert_eq!(
        (out["kind"].as_str(), out["code"].as_i64()),
        (Some("exit"), Some(3))
    );
    assert_eq!(
        (out["ok"].as_bool(), out["outcome"].as_str()),
        (Some(false), Some("exit 3"))
    );
    assert!(
        out["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("broken-on-purpose")
    );
    // A timeout: killed, and said so.
    let slow = api.create(
        json!({"event": "error", "command": "/bin/sleep", "args": ["30"], "timeout_ms": 200}),
    );
    let sid = slow["id"].as_str().unwrap();
    let out = api
        .call("POST", &format!("/api/hooks/{sid}/test"), None)
        .json();
    assert_eq!(
        (out["kind"].as_str(), out["timed_out"].as_bool()),
        (Some("timed_out"), Some(true))
    );
    // Test runs land in the history.
    let runs = api.get(&format!("/api/hooks/{sid}/runs")).json();
    assert_eq!(runs["runs"][0]["timed_out"], true);
    api.call("POST", "/api/hooks/nope/test", None).error(404);
}

#[test]
fn fifty_concurrent_writers_all_persist() {
    let api = Arc::new(Api::start(Some(TWO)));
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let api = api.clone();
            std::thread::spawn(move || {
                let body = json!({"id": format!("w{i}"), "event": "tool_call", "command": "/bin/echo", "args": [format!("{i}")]});
                let r = api.call("POST", "/api/hooks", Some(&body));
                assert_eq!(r.status, 201, "writer {i}: {}", r.text);
                // Every file in between is valid too.
                assert!(api.loads().is_ok(), "hooks.json invalid while writers run");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let table = api.loads().expect("hooks.json valid after 50 writers");
    assert_eq!(table.actions.len(), 52);
    for i in 0..50 {
        assert!(table.get(&format!("w{i}")).is_some(), "w{i} lost");
    }
    assert_eq!(api.hooks.hook_table().actions.len(), 52, "all live");
    // And concurrent updates of one hook serialize without losing any field.
    let threads: Vec<_> = (0..20)
        .map(|i| {
            let api = api.clone();
            std::thread::spawn(move || {
                let patch = json!({"env": {format!("V{i}"): "x"}});
                let r = api.call("PUT", "/api/hooks/start", Some(&patch));
                assert_eq!(r.status, 200, "{}", r.text);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let env = api.get("/api/hooks/start").json()["env"].clone();
    assert_eq!(env.as_object().unwrap().len(), 20, "{env}");
}

/// `name{labels} value` lines of an OpenMetrics text, checked for syntax.
type Sample = (String, Vec<(String, String)>, f64);

fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    assert!(text.ends_with("# EOF\n"), "no EOF marker");
    for line in text.lines() {
        if line.starts_with('#') {
            let mut parts = line.splitn(4, ' ');
            assert_eq!(parts.next(), Some("#"));
            assert!(
                matches!(parts.next(), Some("HELP" | "TYPE" | "UNIT" | "EOF")),
                "{line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), vec![]),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed: {line}"));
                let labels = body
                    .split("\",")
                    .filter(|s| !s.is_empty())
                    .map(|kv| {
                        let (k, v) = kv
                            .split_once("=\"")
                            .unwrap_or_else(|| panic!("bad label: {line}"));
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name.to_string(), labels)
            }
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && name.starts_with("prx_hooks_"),
            "bad metric name: {line}"
        );
        out.push((name, labels, value));
    }
    out
}

#[test]
fn metrics_parse_and_match_the_stats() {
    let api = Api::start(None);
    let log = api.ws().join("log");
    let hook = api.create(appender("m", &log));
    let id = hook["id"].as_str().unwrap().to_string();
    let sub = api.hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    for i in 0..5 {
        tool_call(&api.hooks, &format!("e{i}"));
    }
    wait_for("five runs", || lines(&log).len() == 5);
    wait_for("the runs to be counted", || {
        api.hooks.stats().shell().unwrap().clone().hooks[&id].ok == 5
    });
    let r = api.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let samples = parse_metrics(&r.text);
    let stats = api.get("/api/stats").json();
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && labels.len() == l.len()
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .unwrap_or_else(|| panic!("no {name}{labels:?} in\n{}", r.text))
            .2
    };
    let num = |v: &Value| v.as_u64().unwrap() as f64;
    assert_eq!(
        value("prx_hooks_events_emitted_total", &[]),
        num(&stats["emitted"])
    );
    assert_eq!(num(&stats["emitted"]), 5.0);
    assert_eq!(
        value("prx_hooks_events_queued_total", &[]),
        num(&stats["queued"])
    );
    assert_eq!(
        value("prx_hooks_events_processed_total", &[]),
        num(&stats["processed"])
    );
    assert_eq!(
        value("prx_hooks_events_dropped_total", &[("reason", "ring_full")]),
        num(&stats["dropped"])
    );
    assert_eq!(
        value("prx_hooks_events_dropped_total", &[("reason", "oversize")]),
        num(&stats["oversize"])
    );
    assert_eq!(
        value("prx_hooks_events_dropped_total", &[("reason", "shutdown")]),
        num(&stats["dropped_shutdown"])
    );
    assert_eq!(
        value("prx_hooks_ring_capacity", &[]),
        num(&stats["ring"]["capacity"])
    );
    for sink in stats["sinks"].as_array().unwrap() {
        let name = sink["name"].as_str().unwrap();
        assert_eq!(
            value("prx_hooks_sink_sent_total", &[("sink", name)]),
            num(&sink["sent"])
        );
        assert_eq!(
            value("prx_hooks_sink_delivered_total", &[("sink", name)]),
            num(&sink["delivered"])
        );
    }
    let hook_stats = &stats["shell"]["hooks"][&id];
    assert_eq!(
        value(
            "prx_hooks_shell_hook_runs_total",
            &[("hook", &id), ("outcome", "ok")]
        ),
        5.0
    );
    assert_eq!(num(&hook_stats["ok"]), 5.0);
    assert_eq!(
        value("prx_hooks_shell_hook_sent_total", &[("hook", &id)]),
        num(&hook_stats["sent"])
    );
    assert_eq!(
        value("prx_hooks_shell_runs_total", &[("outcome", "exit")]),
        0.0
    );
    assert_eq!(
        value("prx_hooks_config_reloads_total", &[]),
        num(&stats["config"]["reloads"])
    );
    assert_eq!(value("prx_hooks_config_actions", &[]), 1.0);
    let sub_stats = &stats["subscribers"][0];
    let sub_id = sub_stats["id"].to_string();
    assert_eq!(
        value(
            "prx_hooks_subscriber_delivered_total",
            &[("subscriber", &sub_id), ("pattern", "prx.lifecycle.*")]
        ),
        num(&sub_stats["delivered"])
    );
    assert_eq!(num(&sub_stats["delivered"]), 5.0);
    drop(sub);
    // Every sample of a counter family is a `_total`, and every sample belongs to a family
    // declared with `# TYPE`.
    let families: Vec<(&str, &str)> = r
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    assert!(families.contains(&("prx_hooks_events_emitted", "counter")));
    for (name, _, _) in &samples {
        let (_, kind) = families
            .iter()
            .find(|(f, _)| name == f || name.strip_suffix("_total") == Some(f))
            .unwrap_or_else(|| panic!("{name} has no # TYPE line"));
        assert_eq!(
            *kind == "counter",
            name.ends_with("_total"),
            "{name} is a {kind}"
        );
    }
}

#[test]
fn plugins_and_stats_without_plugins() {
    let api = Api::start(Some(TWO));
    let p = api.get("/api/plugins");
    assert_eq!(p.status, 200);
    let v = p.json();
    assert_eq!(v["plugins"], json!([]));
    assert_eq!(v["errors"], json!([]));
    let s = api.get("/api/stats").json();
    assert_eq!(s["config"]["actions"], 2);
    assert!(
        s["sinks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "bus")
    );
}

/// A real plugin (the audit guest) through `/api/plugins` and `/metrics`.
#[cfg(feature = "wasm")]
#[test]
fn plugins_are_listed_with_their_events_state_and_counters() {
    let api = Api::start_prepared(
        None,
        |o| o,
        |ws| {
            plugins::install(ws, "audit-hook", "audit_hook", &plugins::audit_manifest());
        },
    );
    let v = api.get("/api/plugins").json();
    assert_eq!(v["enabled"], true);
    assert_eq!(v["errors"], json!([]), "{v}");
    let p = &v["plugins"][0];
    assert_eq!(
        (p["name"].as_str(), p["state"].as_str()),
        (Some("audit-hook"), Some("running"))
    );
    assert_eq!(p["events"], json!(["prx.lifecycle.*"]));
    for i in 0..3 {
        tool_call(&api.hooks, &format!("p{i}"));
    }
    wait_for("three plugin calls", || {
        api.get("/api/plugins").json()["plugins"][0]["ok"] == 3
    });
    let r = api.get("/metrics");
    let samples = parse_metrics(&r.text);
    let find = |name: &str, extra: Option<(&str, &str)>| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.iter().any(|(k, v)| k == "plugin" && v == "audit-hook")
                    && extra.is_none_or(|(ek, ev)| l.iter().any(|(k, v)| k == ek && v == ev))
            })
            .unwrap_or_else(|| panic!("no {name} in\n{}", r.text))
            .2
    };
    assert_eq!(
        find("prx_hooks_plugin_calls_total", Some(("result", "ok"))),
        3.0
    );
    assert_eq!(find("prx_hooks_plugin_sent_total", None), 3.0);
    assert_eq!(find("prx_hooks_plugin_running", None), 1.0);
}

#[test]
fn a_hooks_system_without_a_workspace_answers_503_for_hooks() {
    let hooks = Arc::new(Hooks::builder().build().unwrap());
    let server = Server::start(
        hooks,
        HttpOptions::new(Token::new(TOKEN, "t").unwrap()),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .get(format!("http://{}/api/hooks", server.local_addr()))
        .header("authorization", format!("Bearer {TOKEN}"))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(v["error"].as_str().unwrap().contains("no workspace"), "{v}");
    let mut s = agent
        .get(format!("http://{}/api/plugins", server.local_addr()))
        .header("authorization", format!("Bearer {TOKEN}"))
        .call()
        .unwrap();
    let v: Value = serde_json::from_str(&s.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(v["enabled"], false);
}

#[test]
fn a_server_stops_cleanly_when_dropped_inside_an_async_host() {
    let api = Api::start(Some(TWO));
    let addr = api.server.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // Blocking on (or dropping) a runtime inside another one panics unless done elsewhere.
    rt.block_on(async move { drop(api) });
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still listening after drop"
    );
}

#[test]
fn after_shutdown_writes_are_refused_and_health_says_so() {
    let api = Api::start(Some(TWO));
    api.hooks.shutdown(Duration::from_secs(1));
    let r = api.raw("GET", "/healthz", None, &[], b"");
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (503, Some("shutting_down"))
    );
    let before = std::fs::read(api.ws().join("hooks.json")).unwrap();
    let (e, _) = api
        .call(
            "POST",
            "/api/hooks",
            Some(&json!({"event": "error", "command": "/bin/true"})),
        )
        .error(503);
    assert!(e.contains("shutting down"), "{e}");
    assert_eq!(std::fs::read(api.ws().join("hooks.json")).unwrap(), before);
    // Reads still work.
    assert_eq!(api.ids().len(), 2);
}

#[test]
fn a_hand_edit_still_goes_live_through_the_watcher() {
    // The API and the watcher share one table: a hand edit after an API write is picked up.
    let api = Api::start(None);
    api.create(json!({"id": "api", "event": "error", "command": "/bin/true"}));
    let path: PathBuf = api.ws().join("hooks.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"api\"", "\"by-hand\"");
    let tmp = api.ws().join(".edit.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    wait_for("the hand edit", || {
        api.hooks.hook_table().get("by-hand").is_some()
    });
    assert_eq!(api.ids(), ["by-hand"]);
}
