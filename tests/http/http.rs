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
use crate::plugins;

use crate::support;

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
        Api::start_built(hooks_json, opts, prepare, |b| b)
    }

    /// `build` configures the hook system (e.g. its shell limits).
    fn start_built(
        hooks_json: Option<&str>,
        opts: impl FnOnce(HttpOptions) -> HttpOptions,
        prepare: impl FnOnce(&Path),
        build: impl FnOnce(prx_hooks::HooksBuilder) -> prx_hooks::HooksBuilder,
    ) -> Api {
        let ws = tempfile::tempdir().unwrap();
        if let Some(text) = hooks_json {
            std::fs::write(ws.path().join("hooks.json"), text).unwrap();
        }
        prepare(ws.path());
        let hooks = Arc::new(
            build(Hooks::builder().workspace(ws.path()))
                .build()
                .unwrap(),
        );
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

    /// A JSON body sent exactly as written.
    fn send(&self, method: &str, path: &str, body: &str) -> Resp {
        let json = [("content-type", "application/json")];
        self.raw(method, path, Some(TOKEN), &json, body.as_bytes())
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

    /// `/metrics` as Prometheus scrapes it: OpenMetrics, asked for by `Accept`.
    fn openmetrics(&self) -> Resp {
        let accept = [("accept", "application/openmetrics-text; version=1.0.0")];
        self.raw("GET", "/metrics", Some(TOKEN), &accept, b"")
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
    // A write's response is the hook plus the loader's warnings about it.
    let mut hook = hook;
    assert_eq!(
        hook.as_object_mut().unwrap().remove("warnings"),
        Some(json!([]))
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
        json!({"id": id, "event": "agent_end", "command": "/bin/echo", "args": ["y", "z"], "warnings": []})
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
    // (A hand edit that breaks the file: errors_about_a_body_… and a_broken_hooks_json_….)
}

#[test]
fn bad_bodies_get_the_right_status_and_message() {
    let api = Api::start(Some(TWO));
    let json_ct = [("content-type", "application/json")];
    let post = |headers: &[(&str, &str)], body: &[u8]| {
        api.raw("POST", "/api/hooks", Some(TOKEN), headers, body)
    };

    let (e, p) = post(&json_ct, b"{\"event\": \"error\",\n \"command\": }").error(400);
    assert!(
        e.starts_with("body:2:") && e.contains(": command: invalid JSON: "),
        "{e}"
    );
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
    assert!(
        e.starts_with("body:1:") && e.contains(": timeout_ms: "),
        "the body's place: {e}"
    );
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
        "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        api.server.local_addr()
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
    assert!(
        e.starts_with("body:1:") && e.contains(": success: missing"),
        "{e}"
    );

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
    let r = api.openmetrics();
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
    assert_eq!(
        value(
            "prx_hooks_subscriber_delivered_total",
            &[("pattern", "prx.lifecycle.*")]
        ),
        num(&sub_stats["delivered"])
    );
    assert_eq!(
        value(
            "prx_hooks_shell_hook_executions_total",
            &[("hook", &id), ("outcome", "ok")]
        ),
        5.0
    );
    // The server's own counters: this test's connections, no timeouts.
    let http = &stats["http"];
    assert!(num(&http["accepted"]) >= 1.0, "{http}");
    assert_eq!(
        value("prx_hooks_http_connections_refused_total", &[]),
        num(&http["refused_over_cap"])
    );
    assert_eq!(
        value("prx_hooks_http_timeouts_total", &[("phase", "header")]),
        0.0
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
    let r = api.openmetrics();
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
    // The double-counting series is kept for dashboards, marked deprecated.
    assert_eq!(find("prx_hooks_plugin_dropped_total", None), 0.0);
    assert!(
        r.text.lines().any(|l| {
            l.starts_with("# HELP prx_hooks_plugin_dropped ") && l.contains("DEPRECATED")
        }),
        "{}",
        r.text
    );
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

// ---------------------------------------------------------------------------------------------
// Hostile clients and standard HTTP. Raw sockets where a client library would hide
// what is on the wire.

/// Sends `request` (head and body as written) on a fresh connection and reads until the server
/// closes it or `wait` passes: (status, raw response, whether the server closed the connection).
fn exchange(addr: std::net::SocketAddr, request: &[u8], wait: Duration) -> (u16, String, bool) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text, closed)
}

/// A host application's own server: `app` under plain `axum::serve` on loopback.
fn serve_with_axum(app: axum::Router) -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    rt.spawn(async move { axum::serve(listener, app).await });
    (rt, addr)
}

/// The JSON body of a raw response.
fn raw_json(text: &str) -> Value {
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

#[test]
fn half_sent_heads_idle_connections_and_stalled_bodies_are_closed_within_seconds() {
    let api = Api::start(Some(TWO));
    let addr = api.server.local_addr();
    // Generous: the defaults are seconds; a server without timeouts never closes these.
    let wait = Duration::from_secs(75);
    let half = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let (_, _, closed) = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", wait);
        (closed, started.elapsed())
    });
    let idle = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(wait)).unwrap();
        write!(s, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let started = std::time::Instant::now();
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(_) => break false,
            }
        };
        assert!(
            String::from_utf8_lossy(&all).starts_with("HTTP/1.1 200"),
            "the request itself was answered"
        );
        (closed, started.elapsed())
    });
    let stalled_body = {
        let head = format!(
            "POST /api/hooks HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"event\""
        );
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let (status, text, closed) = exchange(addr, head.as_bytes(), wait);
            assert!(status == 0 || status == 408, "{text}");
            (closed, started.elapsed())
        })
    };
    for (what, t) in [
        ("a half-sent head", half),
        ("an idle keep-alive connection", idle),
        ("a stalled body", stalled_body),
    ] {
        let (closed, took) = t.join().unwrap();
        assert!(closed, "{what} was still open after {took:?}");
    }
    // Nothing of the stalled body reached the file.
    assert_eq!(api.ids().len(), 2);
}

#[test]
fn test_runs_count_in_the_hooks_max_concurrent_and_are_refused_with_429_beyond() {
    let api = Arc::new(Api::start(None));
    let log = api.ws().join("log");
    let script = format!("echo start >> {0}; sleep 2; echo end >> {0}", log.display());
    let hook = api.create(json!({
        "event": "error", "command": "/bin/sh", "args": ["-c", script],
        "max_concurrent": 1, "timeout_ms": 30000
    }));
    let id = hook["id"].as_str().unwrap().to_string();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (api, id) = (api.clone(), id.clone());
            std::thread::spawn(move || {
                let r = api.call("POST", &format!("/api/hooks/{id}/test"), None);
                (
                    r.status,
                    r.header("retry-after").map(str::to_string),
                    r.text,
                )
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let ran = results.iter().filter(|r| r.0 == 200).count();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert!(ran >= 1, "{results:?}");
    assert_eq!(ran + refused.len(), 8, "{results:?}");
    for r in &refused {
        let after: u64 = r.1.as_deref().expect("Retry-After").parse().unwrap();
        assert!(after >= 1, "{r:?}");
        assert_eq!(raw_json_body(&r.2)["kind"], "too_many_requests", "{r:?}");
    }
    // Never two at once: every start is followed by its end before the next start.
    let lines = lines(&log);
    assert_eq!(lines.len(), 2 * ran, "{lines:?}");
    for pair in lines.chunks(2) {
        assert_eq!(pair, ["start", "end"], "overlapping runs: {lines:?}");
    }
}

fn raw_json_body(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

#[test]
fn reads_and_edits_answer_while_test_runs_hold_every_slot() {
    let api = Arc::new(Api::start(Some(TWO)));
    let hook = api.create(json!({
        "event": "error", "command": "/bin/sleep", "args": ["40"],
        "max_concurrent": 100, "timeout_ms": 60000
    }));
    let id = hook["id"].as_str().unwrap().to_string();
    let runs: Vec<_> = (0..70)
        .map(|_| {
            let (api, id) = (api.clone(), id.clone());
            std::thread::spawn(move || {
                api.call("POST", &format!("/api/hooks/{id}/test"), None)
                    .status
            })
        })
        .collect();
    wait_for("the test runs to start", || {
        api.hooks
            .stats()
            .shell()
            .is_some_and(|s| s.direct_running >= 60)
    });
    // Liveness with slack: the runs take 40 s; reads and writes must not wait for them.
    let started = std::time::Instant::now();
    assert_eq!(api.get("/api/hooks").status, 200);
    assert_eq!(api.get("/api/stats").status, 200);
    api.create(json!({"event": "error", "command": "/bin/true"}));
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "reads and a write took {took:?}"
    );
    let statuses: Vec<u16> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
}

#[test]
fn a_test_run_stops_when_its_client_disconnects() {
    let api = Api::start(None);
    let pidfile = api.ws().join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let hook = api.create(json!({
        "event": "error", "command": "/bin/sh", "args": ["-c", script], "timeout_ms": 120000
    }));
    let id = hook["id"].as_str().unwrap();
    let mut s = std::net::TcpStream::connect(api.server.local_addr()).unwrap();
    write!(
        s,
        "POST /api/hooks/{id}/test HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: 0\r\n\r\n",
        api.server.local_addr()
    )
    .unwrap();
    wait_for("the test run to start", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|p| p.trim().parse::<i32>().is_ok())
    });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(s);
    wait_for("the test run's process to be stopped", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
    });
    wait_for("the run in the history", || {
        api.get(&format!("/api/hooks/{id}/runs")).json()["runs"][0]["kind"] == "killed"
    });
}

/// Sends `POST /api/hooks/{id}/test` on a raw connection and returns it unread.
fn test_request(api: &Api, id: &str) -> std::net::TcpStream {
    let addr = api.server.local_addr();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /api/hooks/{id}/test HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Length: 0\r\n\r\n"
    )
    .unwrap();
    s
}

fn direct_running(api: &Api) -> u64 {
    api.hooks.stats().shell().map_or(0, |s| s.direct_running)
}

fn alive(pid: &str) -> bool {
    let pid = pid.trim().parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[test]
fn the_backends_max_running_caps_test_runs_with_429_and_a_disconnect_frees_the_slots() {
    let api = Api::start_built(
        None,
        |o| o,
        |_| {},
        |b| {
            b.shell_limits(prx_hooks::shell::ShellLimits {
                max_running: 2,
                ..Default::default()
            })
        },
    );
    let pids = api.ws().join("pids");
    let script = format!("echo $$ >> {}; exec sleep 60", pids.display());
    let hook = api.create(json!({
        "event": "error", "command": "/bin/sh", "args": ["-c", script],
        "max_concurrent": 10, "timeout_ms": 120000
    }));
    let id = hook["id"].as_str().unwrap().to_string();
    let held: Vec<_> = (0..2).map(|_| test_request(&api, &id)).collect();
    wait_for("both test runs to start", || lines(&pids).len() == 2);
    assert_eq!(direct_running(&api), 2);
    // The hook allows 10, the backend 2: every further run is refused by the backend's cap.
    for _ in 0..3 {
        let r = api.call("POST", &format!("/api/hooks/{id}/test"), None);
        assert_eq!(r.status, 429, "{}", r.text);
        assert_eq!(r.header("retry-after"), Some("1"));
        let body = r.json();
        assert_eq!(body["kind"], "too_many_requests", "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains("max_running"), "{error}");
    }
    assert_eq!(lines(&pids).len(), 2, "more than max_running ran");
    assert_eq!(direct_running(&api), 2);
    drop(held);
    wait_for("the running count to return to 0", || {
        direct_running(&api) == 0
    });
    for pid in lines(&pids) {
        wait_for("the test run's process to be stopped", || !alive(&pid));
    }
    let runs = api.get(&format!("/api/hooks/{id}/runs")).json()["runs"].clone();
    let kinds: Vec<_> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("killed"), json!("killed")], "{runs}");
    // The slots are free again.
    let quick = api.create(json!({"event": "error", "command": "/bin/true"}));
    let r = api.call(
        "POST",
        &format!("/api/hooks/{}/test", quick["id"].as_str().unwrap()),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text);
}

#[test]
fn clients_that_leave_at_once_get_their_runs_cancelled_or_killed_and_free_every_slot() {
    let api = Api::start(None);
    let pids = api.ws().join("pids");
    let script = format!("echo $$ >> {}; exec sleep 60", pids.display());
    let hook = api.create(json!({
        "event": "error", "command": "/bin/sh", "args": ["-c", script],
        "max_concurrent": 100, "timeout_ms": 120000
    }));
    let id = hook["id"].as_str().unwrap().to_string();
    // Each client leaves right after its request: some runs are dropped while they wait for
    // the runner (cancelled, never started), the others once started (killed).
    for _ in 0..20 {
        let s = test_request(&api, &id);
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }
    // Settled: nothing running, and the history has not grown for a second.
    let recorded = || api.hooks.shell().unwrap().runs(&id).len();
    let (mut last, mut since) = (usize::MAX, std::time::Instant::now());
    wait_for("the test runs to settle", || {
        let n = recorded();
        if n != last {
            (last, since) = (n, std::time::Instant::now());
        }
        direct_running(&api) == 0 && since.elapsed() > Duration::from_secs(1)
    });
    // Every process that announced itself is gone, and its run is recorded (the running
    // count drops only when the outcome is recorded).
    let started = lines(&pids);
    for pid in &started {
        wait_for("every test run's process to be stopped", || !alive(pid));
    }
    wait_for("the running count to return to 0", || {
        direct_running(&api) == 0
    });
    let runs = api.get(&format!("/api/hooks/{id}/runs")).json()["runs"].clone();
    let runs = runs.as_array().unwrap();
    let killed = runs.iter().filter(|r| r["kind"] == "killed").count();
    let cancelled = runs.iter().filter(|r| r["kind"] == "cancelled").count();
    eprintln!("{killed} killed, {cancelled} cancelled of 20");
    assert_eq!(killed + cancelled, runs.len(), "{runs:?}");
    // hyper drops the request future on EOF, mostly before the runner took the run (16 or 17
    // of 20 here): the HTTP path does reach cancel-before-start.
    assert!(cancelled >= 1, "{runs:?}");
    // A cancelled run never started: every process that announced itself was killed.
    assert!(started.len() <= killed, "{started:?} {runs:?}");
}

#[test]
fn a_new_hooks_json_is_private_and_an_existing_one_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let api = Api::start(None);
    api.create(json!({"event": "error", "command": "/bin/true", "env": {"API_KEY": "secret"}}));
    let path = api.ws().join("hooks.json");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "a new hooks.json holding env values is {mode:o}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let list = api.get("/api/hooks").etag();
    let r = api.call_if(
        "POST",
        "/api/hooks",
        Some(&json!({"event": "error", "command": "/bin/echo"})),
        Some(&list),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "an existing file keeps its mode");
}

#[test]
fn ids_a_url_path_would_normalize_are_refused() {
    let api = Api::start(Some(TWO));
    for id in [".", ".."] {
        let (e, p) = api
            .call(
                "POST",
                "/api/hooks",
                Some(&json!({"id": id, "event": "error", "command": "/bin/true"})),
            )
            .error(422);
        assert_eq!(p, "id", "{e}");
        assert!(e.contains("URL"), "{e}");
    }
    assert_eq!(api.ids().len(), 2);
}

#[test]
fn hand_written_ids_a_url_path_would_normalize_load_with_a_warning() {
    let api = Api::start(Some(
        r#"{"hooks": {"error": [
            {"id": ".", "command": "/bin/true"},
            {"id": "..", "command": "/bin/true"},
            {"id": "ok", "command": "/bin/true"}
        ]}}"#,
    ));
    let table = api.loads().expect("the hooks still load");
    assert_eq!(table.actions.len(), 3);
    assert_eq!(table.warnings.len(), 2, "{:?}", table.warnings);
    for (w, id) in table.warnings.iter().zip(["\".\"", "\"..\""]) {
        assert!(
            w.contains(id) && w.contains("HTTP API"),
            "{w} does not name {id}"
        );
    }
    assert_eq!(api.ids(), [".", "..", "ok"]);
}

#[test]
fn a_hand_edit_makes_every_blind_write_conflict_until_one_proves_a_current_view() {
    let api = Api::start(Some(TWO));
    let path = api.ws().join("hooks.json");
    api.create(json!({"id": "mine", "event": "error", "command": "/bin/true"}));
    let edited = std::fs::read_to_string(&path).unwrap().replace(
        "\"id\": \"start\", \"command\": \"/bin/true\"",
        "\"id\": \"start\", \"command\": \"/bin/echo\"",
    );
    assert_ne!(edited, std::fs::read_to_string(&path).unwrap());
    std::fs::write(&path, &edited).unwrap();
    // Another client's read (even a 404) does not vouch for this client's view.
    api.get("/api/hooks/nope");
    api.get("/api/hooks");
    for _ in 0..2 {
        let (e, _) = api
            .call("PUT", "/api/hooks/mine", Some(&json!({"args": ["blind"]})))
            .error(409);
        assert!(e.contains("changed on disk"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
    }
    // A current If-Match proves it: the write goes through, and so do blind writes after it.
    let tag = api.get("/api/hooks/mine").etag();
    let r = api.call_if(
        "PUT",
        "/api/hooks/mine",
        Some(&json!({"args": ["seen"]})),
        Some(&tag),
    );
    assert_eq!(r.status, 200, "{}", r.text);
    let r = api.call("PUT", "/api/hooks/mine", Some(&json!({"args": ["blind"]})));
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("/bin/echo")
    );
}

#[test]
fn repeated_if_match_lines_are_one_list() {
    let api = Api::start(Some(TWO));
    let tag = api.get("/api/hooks/start").etag();
    let stale = "\"00000000000000000000000000000000\"";
    let body = json!({"args": ["x"]}).to_string();
    let put = || {
        let headers = [
            ("content-type", "application/json"),
            ("if-match", stale),
            ("if-match", tag.as_str()),
        ];
        api.raw(
            "PUT",
            "/api/hooks/start",
            Some(TOKEN),
            &headers,
            body.as_bytes(),
        )
    };
    // The current ETag is on the second line: the write goes through.
    let r = put();
    assert_eq!(r.status, 200, "{}", r.text);
    // Both are stale now.
    let r = put();
    assert_eq!(r.status, 412, "{}", r.text);
}

#[test]
fn urls_carry_the_prefix_when_the_router_is_nested() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    let app = axum::Router::new().nest(
        "/prx",
        prx_hooks::http::router(hooks, HttpOptions::new(Token::new(TOKEN, "t").unwrap())),
    );
    let (_rt, addr) = serve_with_axum(app);
    let body = json!({"id": "n", "event": "error", "command": "/bin/true"}).to_string();
    let head = format!(
        "POST /prx/api/hooks HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, text, _) = exchange(addr, head.as_bytes(), Duration::from_secs(30));
    assert_eq!(status, 201, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("location: /prx/api/hooks/n\r\n"),
        "{text}"
    );
    let head = format!(
        "GET /prx/api/nope HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    let (status, text, _) = exchange(addr, head.as_bytes(), Duration::from_secs(30));
    assert_eq!(status, 404, "{text}");
    let e = raw_json(&text)["error"].as_str().unwrap().to_string();
    assert!(e.contains("/prx/api/hooks"), "{e}");
    assert!(!e.contains(" /api/hooks"), "{e}");
}

#[test]
fn foreign_hosts_and_cross_origin_requests_are_refused_before_auth() {
    let api = Api::start(Some(TWO));
    let addr = api.server.local_addr();
    let auth = format!("Bearer {TOKEN}");
    let ask = |host: &str, extra: &[(&str, &str)]| {
        let mut head = format!("GET /api/hooks HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
        for (k, v) in extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        exchange(addr, head.as_bytes(), Duration::from_secs(30))
    };
    // DNS rebinding: a foreign name that resolves to us. Refused with or without a token.
    for extra in [&[("Authorization", auth.as_str())][..], &[][..]] {
        let (status, text, _) = ask(&format!("evil.example:{}", addr.port()), extra);
        assert_eq!(status, 403, "{text}");
        assert_eq!(raw_json(&text)["kind"], "forbidden_host", "{text}");
    }
    // A browser page of another origin.
    let (status, text, _) = ask(
        &addr.to_string(),
        &[("Authorization", &auth), ("Origin", "http://evil.example")],
    );
    assert_eq!(status, 403, "{text}");
    assert_eq!(raw_json(&text)["kind"], "forbidden_origin", "{text}");
    // The bound address, localhost, and a same-origin browser request are served.
    let same = format!("http://{addr}");
    for (host, extra) in [
        (addr.to_string(), vec![("Authorization", auth.as_str())]),
        (
            format!("localhost:{}", addr.port()),
            vec![("Authorization", auth.as_str())],
        ),
        (
            addr.to_string(),
            vec![("Authorization", auth.as_str()), ("Origin", same.as_str())],
        ),
    ] {
        let (status, text, _) = ask(&host, &extra);
        assert_eq!(status, 200, "{host}: {text}");
    }
}

#[test]
fn errors_about_a_body_point_into_the_body_and_never_show_server_paths() {
    let api = Api::start(Some(TWO));
    let ws = api.ws().display().to_string();
    let body = r#"{"event": "tool_call", "command": "/bin/true", "timeout_ms": "5s"}"#;
    let col = body.find("\"5s\"").unwrap() + 1;
    let (e, p) = api.send("POST", "/api/hooks", body).error(422);
    assert_eq!(p, "timeout_ms");
    assert!(
        e.contains(&format!("1:{col}")),
        "the body's line:col ({col}): {e}"
    );
    assert!(
        !e.contains("hooks.tool_call["),
        "a path into the server's file: {e}"
    );
    assert!(!e.contains(&ws), "a server path: {e}");
    // A merge patch: positions in the patch.
    let patch = "{\n  \"args\": [\"a\", 3]\n}";
    let (e, p) = api.send("PUT", "/api/hooks/start", patch).error(422);
    assert_eq!(p, "args[1]");
    assert!(e.contains("body:2:17: args[1]: "), "{e}");
    assert!(!e.contains(&ws), "{e}");
    // 409s name the file, not where it is.
    std::fs::write(api.ws().join("hooks.json"), TWO.replace("\"a\"", "\"b\"")).unwrap();
    let (e, _) = api
        .call("PATCH", "/api/hooks/start/toggle", None)
        .error(409);
    assert!(!e.contains(&ws), "{e}");
    std::fs::write(
        api.ws().join("hooks.json"),
        "{\"hooks\": {\"tool_call\": [}",
    )
    .unwrap();
    let (e, _) = api
        .call("PATCH", "/api/hooks/start/toggle", None)
        .error(409);
    assert!(e.contains("hooks.json"), "{e}");
    assert!(!e.contains(&ws), "{e}");
}

#[test]
fn token_files_are_written_whole_once_and_owned_by_us() {
    use prx_hooks::http::token::{
        ADDRESS_FILE, TOKEN_FILE, TokenSource, remove_address, resolve, write_address,
    };
    use std::os::unix::fs::PermissionsExt;
    // A crash left an empty token file: a new one is generated instead of refusing to start.
    let ws = tempfile::tempdir().unwrap();
    let path = ws.path().join(TOKEN_FILE);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (token, source) = resolve(None, None, ws.path()).expect("an empty file is regenerated");
    assert_eq!(source, TokenSource::Generated(path.clone()));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap().trim(),
        token.as_str()
    );
    // Two servers starting at once in a fresh workspace agree on one token.
    for _ in 0..20 {
        let ws = tempfile::tempdir().unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let both: Vec<_> = (0..2)
            .map(|_| {
                let (dir, barrier) = (ws.path().to_path_buf(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    resolve(None, None, &dir).map(|(t, _)| t.as_str().to_string())
                })
            })
            .collect();
        let got: Vec<_> = both.into_iter().map(|t| t.join().unwrap()).collect();
        let a = got[0].as_ref().expect("first");
        let b = got[1].as_ref().expect("second");
        assert_eq!(a, b);
    }
    // The directory is private, the files too; the address file goes only with its address.
    let ws = tempfile::tempdir().unwrap();
    resolve(None, None, ws.path()).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&ws.path().join(".prx-hooks")), 0o700);
    assert_eq!(mode(&ws.path().join(TOKEN_FILE)), 0o600);
    let address = write_address(ws.path(), "unix:/tmp/x.sock").unwrap();
    assert_eq!(address, ws.path().join(ADDRESS_FILE));
    assert_eq!(mode(&address), 0o600);
    assert_eq!(
        std::fs::read_to_string(&address).unwrap(),
        "unix:/tmp/x.sock\n"
    );
    remove_address(ws.path(), "http://127.0.0.1:1");
    assert!(address.exists(), "another server's address was removed");
    remove_address(ws.path(), "unix:/tmp/x.sock");
    assert!(!address.exists());
    // The workspace's token file is never followed through a symbolic link.
    let elsewhere = ws.path().join("elsewhere");
    std::fs::write(&elsewhere, "0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(ws.path().join(TOKEN_FILE)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.path().join(TOKEN_FILE)).unwrap();
    assert!(
        resolve(None, None, ws.path()).is_err(),
        "a symlinked token file was followed"
    );
    // A token file owned by someone else is refused (root can hand it to nobody).
    let ws = tempfile::tempdir().unwrap();
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(ws.path()).unwrap()) == 0 {
        let path = ws.path().join(TOKEN_FILE);
        resolve(None, None, ws.path()).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let e = resolve(None, None, ws.path()).unwrap_err();
        assert!(e.to_string().contains("owned by"), "{e}");
    }
}

#[test]
fn metrics_labels_are_bounded_and_the_new_series_exist() {
    let api = Api::start(Some(TWO));
    for _ in 0..5 {
        drop(api.hooks.bus().subscribe("app.*").unwrap());
    }
    let _a = api.hooks.bus().subscribe("app.*").unwrap();
    let _b = api.hooks.bus().subscribe("app.*").unwrap();
    tool_call(&api.hooks, "x");
    let text = api.openmetrics().text;
    let samples = parse_metrics(&text);
    assert!(
        samples
            .iter()
            .all(|(_, labels, _)| labels.iter().all(|(k, _)| k != "subscriber")),
        "an id label: {text}"
    );
    let subs: Vec<_> = samples
        .iter()
        .filter(|(n, l, _)| n == "prx_hooks_subscribers" && l.iter().any(|(_, v)| v == "app.*"))
        .collect();
    assert_eq!(subs.len(), 1, "{text}");
    assert_eq!(subs[0].2, 2.0);
    for name in [
        "prx_hooks_events_dropped_total{reason=\"shutdown\"}",
        "prx_hooks_shell_executions_total{outcome=\"ok\"}",
        "prx_hooks_shell_not_run_total{reason=\"skipped\"}",
    ] {
        assert!(text.contains(name), "{name} missing: {text}");
    }
    for deprecated in ["shell_runs", "shell_hook_runs"] {
        let help = format!("# HELP prx_hooks_{deprecated} ");
        assert!(
            text.lines()
                .any(|l| l.starts_with(&help) && l.contains("DEPRECATED")),
            "{deprecated} not marked: {text}"
        );
    }
}

#[test]
fn patch_is_a_merge_patch_and_put_still_works() {
    let api = Api::start(Some(TWO));
    let patch = |ct: &str, body: &str| {
        api.raw(
            "PATCH",
            "/api/hooks/start",
            Some(TOKEN),
            &[("content-type", ct)],
            body.as_bytes(),
        )
    };
    let r = patch(
        "application/merge-patch+json",
        r#"{"args": ["p"], "enabled": false}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["args"], json!(["p"]));
    assert_eq!(r.json()["enabled"], false);
    // RFC 5789: a hook says what PATCH takes.
    let got = api.get("/api/hooks/start");
    assert_eq!(
        got.header("accept-patch"),
        Some("application/merge-patch+json")
    );
    // The idempotent toggle: twice off stays off.
    let r = patch("application/merge-patch+json", r#"{"enabled": false}"#);
    assert_eq!(r.json()["enabled"], false, "{}", r.text);
    assert!(!api.hooks.hook_table().get("start").unwrap().enabled);
    // JSON Patch (RFC 6902) is another format: refused, with what to send.
    let (e, _) = patch(
        "application/json-patch+json",
        r#"[{"op":"remove","path":"/args"}]"#,
    )
    .error(415);
    assert!(e.contains("merge-patch"), "{e}");
    // PUT keeps working as before.
    let r = api.call("PUT", "/api/hooks/start", Some(&json!({"enabled": true})));
    assert_eq!(
        (r.status, r.json()["enabled"].clone()),
        (200, json!(true)),
        "{}",
        r.text
    );
    // A method a route does not have: 405 naming the ones it has.
    let r = api.raw("POST", "/api/hooks/start", Some(TOKEN), &[], b"");
    assert_eq!(r.status, 405, "{}", r.text);
    let allow = r.header("allow").unwrap_or_default().to_string();
    assert!(
        allow.contains("PATCH") && allow.contains("GET"),
        "{allow:?}"
    );
}

#[test]
fn writes_return_the_loaders_warnings_and_round_trip() {
    let api = Api::start(Some(TWO));
    let r = api.call(
        "POST",
        "/api/hooks",
        Some(&json!({"id": "w", "event": "error", "command": "no-such-command-prx-test"})),
    );
    assert_eq!(r.status, 201, "{}", r.text);
    let created = r.json();
    let warnings = created["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{created}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("no-such-command-prx-test"),
        "{created}"
    );
    let merge_patch = |body: &Value, etag: &str| {
        let headers = [
            ("content-type", "application/merge-patch+json"),
            ("if-match", etag),
        ];
        let bytes = body.to_string();
        api.raw(
            "PATCH",
            "/api/hooks/w",
            Some(TOKEN),
            &headers,
            bytes.as_bytes(),
        )
    };
    // What a write returns — its warnings included — can be sent back as a merge patch
    // unchanged: writes ignore `warnings`.
    let file_before = std::fs::read_to_string(api.ws().join("hooks.json")).unwrap();
    let r = merge_patch(&created, &r.etag());
    assert_eq!(r.status, 200, "{}", r.text);
    let patched = r.json();
    assert_eq!(patched["warnings"], created["warnings"], "{patched}");
    let file = std::fs::read_to_string(api.ws().join("hooks.json")).unwrap();
    assert!(!file.contains("warnings"), "{file}");
    assert_eq!(file, file_before, "an unchanged hook rewrote the file");
    // So can what a GET returns.
    let got = api.get("/api/hooks/w");
    let r = merge_patch(&got.json(), &got.etag());
    assert_eq!(r.status, 200, "{}", r.text);
    // A write without warnings says so with an empty list.
    let r = api.call("PUT", "/api/hooks/start", Some(&json!({"args": ["q"]})));
    assert_eq!(r.json()["warnings"], json!([]), "{}", r.text);
}

#[test]
fn a_broken_hooks_json_still_shows_the_live_table_read_only() {
    let api = Api::start(Some(TWO));
    api.create(json!({
        "id": "live", "event": "error", "command": "/bin/true",
        "limits": {"cpu_seconds": 5, "open_files": 64}
    }));
    let before = api.get("/api/hooks/live").json();
    assert_eq!(before["limits"]["cpu_seconds"], 5, "{before}");
    std::fs::write(
        api.ws().join("hooks.json"),
        "{\"hooks\": {\"tool_call\": [}",
    )
    .unwrap();
    wait_for("the watcher to reject the file", || {
        api.hooks.stats().config().is_some_and(|c| c.failing)
    });
    let r = api.get("/api/hooks");
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["read_only"], true, "{v}");
    assert!(
        v["file_error"]["error"]
            .as_str()
            .unwrap()
            .contains("hooks.json"),
        "{v}"
    );
    let ids: Vec<_> = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].clone())
        .collect();
    assert!(
        ids.contains(&json!("live")) && ids.contains(&json!("start")),
        "{v}"
    );
    let one = api.get("/api/hooks/live");
    assert_eq!(one.status, 200, "{}", one.text);
    // The same hook as the file showed, limits included.
    let mut shown = one.json();
    let m = shown.as_object_mut().unwrap();
    assert_eq!(m.remove("read_only"), Some(json!(true)));
    assert!(m.remove("file_error").is_some());
    assert_eq!(shown, before);
    // Writes still say what is wrong.
    api.call("PATCH", "/api/hooks/live/toggle", None).error(409);
}

#[test]
fn the_test_route_honours_the_matcher_unless_told_to_ignore_it() {
    let api = Api::start(None);
    let log = api.ws().join("log");
    let mut hook = appender("m", &log);
    hook["matcher"] = json!("Bash");
    let id = api.create(hook)["id"].as_str().unwrap().to_string();
    let other = json!({"tool": "Read", "success": true, "output": "o"});
    let r = api.call("POST", &format!("/api/hooks/{id}/test"), Some(&other));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["kind"], "skipped", "{}", r.text);
    assert!(
        r.json()["outcome"].as_str().unwrap().contains("matcher"),
        "{}",
        r.text
    );
    assert!(lines(&log).is_empty());
    let r = api.call(
        "POST",
        &format!("/api/hooks/{id}/test?matcher=ignore"),
        Some(&other),
    );
    assert_eq!(r.json()["outcome"], "ok", "{}", r.text);
    assert_eq!(lines(&log).len(), 1);
    let bash = json!({"tool": "Bash", "success": true, "output": "o"});
    let r = api.call("POST", &format!("/api/hooks/{id}/test"), Some(&bash));
    assert_eq!(r.json()["outcome"], "ok", "{}", r.text);
    assert_eq!(lines(&log).len(), 2);
}

#[test]
fn a_client_that_reads_no_response_is_disconnected_after_the_idle_timeout() {
    let api = Api::start_with(Some(TWO), |o| o.idle_timeout(Duration::from_secs(1)));
    let addr = api.server.local_addr();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut writer = s.try_clone().unwrap();
    // Thousands of pipelined scrapes, never reading: the responses fill both socket buffers.
    let one =
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n");
    std::thread::spawn(move || {
        for _ in 0..5000 {
            if writer.write_all(one.as_bytes()).is_err() {
                return;
            }
        }
    });
    wait_for("the stalled connection to be dropped", || {
        api.server.stats().write_timeouts >= 1
    });
    // The server closed it: reading drains what was sent, then ends.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    assert_eq!(api.server.stats().open, 0, "{:?}", api.server.stats());
    // And the API still answers.
    assert_eq!(api.get("/api/hooks").status, 200);
}

#[test]
fn a_host_application_turns_the_host_check_on_for_its_own_names() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    let opts = HttpOptions::new(Token::new(TOKEN, "t").unwrap()).allow_hosts(["app.example"]);
    let app = prx_hooks::http::router(hooks, opts);
    let (_rt, addr) = serve_with_axum(app);
    let ask = |host: &str| {
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        exchange(addr, head.as_bytes(), Duration::from_secs(30)).0
    };
    assert_eq!(ask("app.example"), 200);
    assert_eq!(ask(&format!("APP.example:{}", addr.port())), 200);
    assert_eq!(ask(&addr.to_string()), 200);
    assert_eq!(ask("evil.example"), 403);
}

#[test]
fn a_unix_socket_server_is_private_replaces_a_stale_socket_and_cleans_up() {
    use std::os::unix::fs::PermissionsExt;
    let ws = tempfile::tempdir().unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    let opts = || HttpOptions::new(Token::new(TOKEN, "t").unwrap());
    let path = ws.path().join("api.sock");
    // A dead server's socket is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let server = Server::start_unix(hooks.clone(), opts(), &path).unwrap();
    assert_eq!(
        server.listen().to_string(),
        format!("unix:{}", path.display())
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let ask = |target: &str| {
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(ask("/api/hooks").starts_with("HTTP/1.1 200"));
    // Any Host is fine over a unix socket (no browser reaches it); Origin is still checked.
    let stats = ask("/api/stats");
    assert!(stats.contains("\"listen\":\"unix:"), "{stats}");
    // A live socket is not taken over; another file is not clobbered.
    let e = Server::start_unix(hooks.clone(), opts(), &path)
        .err()
        .unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    let file = ws.path().join("not-a-socket");
    std::fs::write(&file, "x").unwrap();
    let e = Server::start_unix(hooks.clone(), opts(), &file)
        .err()
        .unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
    drop(server);
    assert!(!path.exists(), "the socket is removed at shutdown");
    // Nothing but the files we made is left in the directory (no temporary socket).
    let mut names: Vec<_> = std::fs::read_dir(ws.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["not-a-socket"]);
}

// ---------------------------------------------------------------------------------------------
// Clients without the token (ARCHITECTURE.md § HTTP API: the connection cap).

/// One flood client: a keep-alive connection that asks for a public route (`/healthz`) every
/// `every`, and connects again `retry` after the server closes it.
struct Pest {
    conn: Option<std::net::TcpStream>,
    next: std::time::Instant,
}

/// Runs `clients` flood clients against `addr` until `stop` is set; returns how many requests
/// they sent and how often the server closed one of them.
fn flood(
    addr: std::net::SocketAddr,
    clients: usize,
    every: Duration,
    retry: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        use std::sync::atomic::Ordering;
        let now = std::time::Instant::now();
        let mut pests: Vec<Pest> = (0..clients)
            .map(|_| Pest {
                conn: None,
                next: now,
            })
            .collect();
        let (mut sent, mut closed) = (0u64, 0u64);
        let mut buf = [0u8; 4096];
        while !stop.load(Ordering::Relaxed) {
            let now = std::time::Instant::now();
            for p in &mut pests {
                if let Some(s) = &mut p.conn {
                    let gone = loop {
                        match s.read(&mut buf) {
                            Ok(0) => break true,
                            Ok(_) => continue,
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                            Err(_) => break true,
                        }
                    };
                    if gone {
                        closed += 1;
                        p.conn = None;
                        p.next = now + retry;
                        continue;
                    }
                }
                if p.next > now {
                    continue;
                }
                if p.conn.is_none() {
                    match std::net::TcpStream::connect(addr) {
                        Ok(s) => {
                            s.set_nonblocking(true).unwrap();
                            p.conn = Some(s);
                        }
                        Err(_) => {
                            p.next = now + retry;
                            continue;
                        }
                    }
                }
                let s = p.conn.as_mut().unwrap();
                if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    .is_ok()
                {
                    sent += 1;
                }
                p.next = now + every;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (sent, closed)
    })
}

/// The token holder's request on a fresh connection, retried until it is answered 200 or
/// `within` passes: (answered, attempts).
fn served_within(addr: std::net::SocketAddr, within: Duration) -> (bool, u32) {
    let head = format!(
        "GET /api/stats HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    let deadline = std::time::Instant::now() + within;
    let mut attempts = 0;
    while std::time::Instant::now() < deadline {
        attempts += 1;
        if exchange(addr, head.as_bytes(), Duration::from_secs(5)).0 == 200 {
            return (true, attempts);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (false, attempts)
}

#[test]
fn a_connection_that_has_not_shown_the_token_is_closed_after_its_401_or_403() {
    let api = Api::start(Some(TWO));
    let addr = api.server.local_addr();
    let wait = Duration::from_secs(5);
    let (status, text, closed) = exchange(
        addr,
        b"GET /api/hooks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        wait,
    );
    assert_eq!(status, 401, "{text}");
    assert!(closed, "a 401 left its connection open for {wait:?}");
    let (status, text, closed) = exchange(
        addr,
        b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        wait,
    );
    assert_eq!(status, 403, "{text}");
    assert!(closed, "a 403 left its connection open for {wait:?}");
    // A public route answered keeps its connection (HTTP/1.1 keep-alive), as does the token
    // holder's.
    for head in [
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".to_string(),
        format!(
            "GET /api/hooks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        ),
    ] {
        let (status, text, closed) = exchange(addr, head.as_bytes(), Duration::from_millis(500));
        assert_eq!(status, 200, "{text}");
        assert!(!closed, "{head:?} was closed: {text}");
    }
    let http = api.get("/api/stats").json()["http"].clone();
    assert_eq!(http["closed_unauthorized"], 2, "{http}");
}

#[test]
fn clients_without_the_token_holding_every_connection_do_not_keep_the_token_holder_out() {
    // 40 clients on a cap of 16, each asking for /healthz every 200 ms on a kept-alive
    // connection: without eviction they hold all 16 for good (the header timeout never runs
    // out between their requests) and the token holder is closed at once, every time.
    let api = Api::start_with(Some(TWO), |o| o.max_connections(16));
    let addr = api.server.local_addr();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pests = flood(
        addr,
        40,
        Duration::from_millis(200),
        Duration::from_millis(100),
        stop.clone(),
    );
    wait_for_open(&api, 16);
    std::thread::sleep(Duration::from_millis(500));
    let mut attempts = Vec::new();
    for i in 0..20 {
        let (served, n) = served_within(addr, Duration::from_secs(10));
        assert!(
            served,
            "request {i} of the token holder was not served in 10 s ({n} attempts); {:?}",
            api.server.stats()
        );
        attempts.push(n);
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (sent, closed) = pests.join().unwrap();
    let http = api.get("/api/stats").json()["http"].clone();
    println!("token holder attempts {attempts:?}; flood sent {sent}, closed {closed}; {http}");
    assert!(sent > 100, "the flood ran: {sent} requests");
    let evicted = http["evicted"].as_u64().unwrap_or(0);
    assert!(evicted > 0, "{http}");
    // Counted in the metrics as in the stats (no connection came or went since).
    let text = api.openmetrics().text;
    assert!(
        text.lines()
            .any(|l| l == format!("prx_hooks_http_connections_evicted_total {evicted}")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("prx_hooks_http_connections_authenticated ")),
        "{text}"
    );
}

/// Waits until the server holds `n` connections.
fn wait_for_open(api: &Api, n: u64) {
    support::wait_for(&format!("{n} connections open"), || {
        api.server.stats().open >= n
    });
}

// ---------------------------------------------------------------------------------------------
// /metrics in both exposition formats, checked by Prometheus' own parsers.

/// Prometheus' own tool (Debian's `prometheus` package). Missing, the test fails: it never
/// passes without having checked anything.
fn promtool() -> &'static str {
    const PROMTOOL: &str = "/usr/bin/promtool";
    assert!(
        Path::new(PROMTOOL).exists(),
        "{PROMTOOL} is missing: these tests check /metrics with Prometheus' own parsers; \
         install it with `apt-get install prometheus` (the prometheus package ships promtool)"
    );
    PROMTOOL
}

/// `promtool check metrics` (the classic text format's parser and linter) on `text`:
/// (exit code, what it said).
fn promtool_check(text: &str) -> (i32, String) {
    let mut child = std::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), said)
}

/// Prometheus' OpenMetrics parser (the one `promtool tsdb create-blocks-from openmetrics`
/// imports with) on `text`, each sample given a timestamp (the importer needs one): the
/// number of samples it imported, or what it said.
fn promtool_openmetrics(text: &str) -> Result<u64, String> {
    let dir = tempfile::tempdir().unwrap();
    let stamped: String = text
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l} 1700000000\n")
            }
        })
        .collect();
    let file = dir.path().join("metrics.om");
    std::fs::write(&file, stamped).unwrap();
    let out = std::process::Command::new(promtool())
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&file)
        .arg(dir.path().join("blocks"))
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(said);
    }
    // BLOCK ULID  MIN TIME  MAX TIME  DURATION  NUM SAMPLES  …: the fifth column.
    Ok(said
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(4)?.parse::<u64>().ok())
        .sum())
}

#[test]
fn metrics_speak_the_classic_format_unless_openmetrics_is_asked_for_and_prometheus_parses_both() {
    let api = Api::start(None);
    let log = api.ws().join("log");
    let hook = api.create(appender("m", &log));
    let id = hook["id"].as_str().unwrap().to_string();
    let _sub = api.hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    tool_call(&api.hooks, "one");
    wait_for("the run", || lines(&log).len() == 1);
    wait_for("the run to be counted", || {
        api.hooks.stats().shell().unwrap().clone().hooks[&id].ok == 1
    });
    let scrape = |accept: Option<&str>| {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let r = api.raw("GET", "/metrics", Some(TOKEN), &headers, b"");
        assert_eq!(r.status, 200, "{}", r.text);
        r
    };
    // curl, a browser, `promtool check metrics`' users and Prometheus before OpenMetrics: the
    // classic text format, which `promtool check metrics` parses and lints clean.
    for accept in [
        None,
        Some("*/*"),
        Some("text/plain"),
        Some("text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
        Some("application/openmetrics-text;q=0,text/plain"),
    ] {
        let r = scrape(accept);
        assert_eq!(
            r.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8"),
            "Accept {accept:?}"
        );
        assert!(!r.text.contains("# EOF"), "Accept {accept:?}");
        let (code, said) = promtool_check(&r.text);
        assert_eq!(
            (code, said.as_str()),
            (0, ""),
            "Accept {accept:?}: promtool check metrics:\n{said}\n{}",
            r.text
        );
        assert!(
            r.text.lines().any(|l| l
                == format!(
                    "prx_hooks_shell_hook_executions_total{{hook=\"{id}\",outcome=\"ok\"}} 1"
                )),
            "{}",
            r.text
        );
    }
    // What Prometheus sends: OpenMetrics, which its OpenMetrics parser imports whole.
    for accept in [
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "application/openmetrics-text",
        "text/plain;q=0.5, application/openmetrics-text; version=1.0.0",
    ] {
        let r = scrape(Some(accept));
        assert_eq!(
            r.header("content-type"),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            "Accept {accept:?}"
        );
        let samples = r.text.lines().filter(|l| !l.starts_with('#')).count() as u64;
        assert!(samples > 100, "{}", r.text);
        assert_eq!(
            promtool_openmetrics(&r.text),
            Ok(samples),
            "Accept {accept:?}:\n{}",
            r.text
        );
    }
}

#[test]
fn host_ports_are_digits_from_1_to_65535() {
    let api = Api::start(Some(TWO));
    let addr = api.server.local_addr();
    let ask = |host: &str| {
        let head = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        exchange(addr, head.as_bytes(), Duration::from_secs(30))
    };
    let own = addr.to_string();
    for ok in [
        own.as_str(),
        "127.0.0.1",
        "127.0.0.1:1",
        "127.0.0.1:80",
        "127.0.0.1:65535",
        "localhost:9",
        "[::1]:65535",
        "[::1]",
    ] {
        let (status, text, _) = ask(ok);
        assert_eq!(status, 200, "Host: {ok}: {text}");
    }
    for bad in [
        "127.0.0.1:99999",
        "127.0.0.1:65536",
        "127.0.0.1:0",
        "127.0.0.1:00",
        "127.0.0.1:080",
        "127.0.0.1:+80",
        "127.0.0.1:-80",
        "127.0.0.1: 80",
        "127.0.0.1:8 0",
        "127.0.0.1:",
        "127.0.0.1:0x50",
        "localhost:123456",
        "[::1]:99999",
        "[::1]:",
        "[::1]:0",
    ] {
        let (status, text, _) = ask(bad);
        assert_eq!(status, 403, "Host: {bad}: {text}");
        assert_eq!(raw_json(&text)["kind"], "forbidden_host", "{text}");
    }
}

/// The words of a hint that are routes (`/…`).
fn routes_in(hint: &str) -> Vec<String> {
    hint.split([' ', ','])
        .map(|w| w.trim_matches(|c: char| c == ';' || c == '.' || c == '"'))
        .filter(|w| w.starts_with('/'))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_404_lists_every_route_and_a_405_names_the_methods_of_its_route() {
    let api = Api::start(Some(TWO));
    let (e, _) = api.get("/api/nope").error(404);
    let listed = routes_in(&e);
    for route in [
        "/api/hooks",
        "/api/hooks/{id}",
        "/api/hooks/{id}/toggle",
        "/api/hooks/{id}/test",
        "/api/hooks/{id}/runs",
        "/api/plugins",
        "/api/stats",
        "/api/events",
        "/api/ingest/{agent}",
        "/metrics",
        "/healthz",
        "/",
        "/console/console.js",
    ] {
        assert!(
            listed.iter().any(|r| r == route),
            "{route} is not in the 404's list: {e}"
        );
    }
    for (method, path) in [
        ("DELETE", "/api/events"),
        ("GET", "/api/ingest/claude-code"),
        ("DELETE", "/api/stats"),
        ("GET", "/api/hooks/start/toggle"),
        ("GET", "/api/hooks/start/test"),
        ("PUT", "/metrics"),
        ("POST", "/healthz"),
        ("POST", "/"),
        ("DELETE", "/console/console.js"),
        ("POST", "/api/hooks/start"),
    ] {
        let r = api.raw(method, path, Some(TOKEN), &[], b"");
        let (e, _) = r.error(405);
        let allow = r
            .header("allow")
            .unwrap_or_else(|| panic!("{method} {path}: no Allow header"))
            .to_string();
        let allowed: Vec<&str> = allow.split(',').map(str::trim).collect();
        assert!(!allowed.is_empty() && !allowed.contains(&method), "{allow}");
        for m in &allowed {
            assert!(
                e.split([' ', ',', ';', '(', ')']).any(|w| w == *m),
                "{method} {path}: the message does not name {m} (Allow: {allow}): {e}"
            );
        }
    }
}

/// `body:LINE:COL: rest` → (line, col, rest).
fn body_place(e: &str) -> (usize, usize, String) {
    let place = (|| {
        let rest = e.strip_prefix("body:")?;
        let (line, rest) = rest.split_once(':')?;
        let (col, rest) = rest.split_once(": ")?;
        Some((line.parse().ok()?, col.parse().ok()?, rest.to_string()))
    })();
    place.unwrap_or_else(|| panic!("not body:LINE:COL: …: {e}"))
}

#[test]
fn every_error_about_a_place_in_a_body_reads_body_line_col_path_reason() {
    let api = Api::start(Some(TWO));
    // Hook writes: create, and both spellings of the merge patch.
    for (method, path) in [
        ("POST", "/api/hooks"),
        ("PATCH", "/api/hooks/start"),
        ("PUT", "/api/hooks/start"),
    ] {
        let what = format!("{method} {path}");
        // Not JSON, on line 2, at the value that is missing.
        let body = "{\"event\": \"error\",\n \"command\": }";
        let (e, p) = api.send(method, path, body).error(400);
        assert_eq!(p, "command", "{what}: {e}");
        let (line, col, rest) = body_place(&e);
        assert_eq!((line, col), (2, 13), "{what}: {e}");
        assert!(rest.starts_with("command: "), "{what}: {e}");
        // A duplicate key, at the second one.
        let body =
            "{\"event\": \"error\", \"command\": \"/bin/true\",\n  \"command\": \"/bin/echo\"}";
        let (e, p) = api.send(method, path, body).error(422);
        assert_eq!(p, "command", "{what}: {e}");
        let (line, col, rest) = body_place(&e);
        assert_eq!((line, col), (2, 3), "{what}: {e}");
        assert!(rest.starts_with("command: duplicate key"), "{what}: {e}");
        // A value of the wrong type.
        let body = "{\"event\": \"error\", \"command\": \"/bin/true\",\n  \"timeout_ms\": \"5s\"}";
        let (e, p) = api.send(method, path, body).error(422);
        assert_eq!(p, "timeout_ms", "{what}: {e}");
        assert_eq!(body_place(&e).0, 2, "{what}: {e}");
    }
    // The test route's payload: the event's fields, placed in the body the same way.
    let test = "/api/hooks/start/test";
    let (e, p) = api.send("POST", test, "{\n  \"agent\": 7\n}").error(422);
    assert_eq!(p, "agent", "{e}");
    let (line, col, rest) = body_place(&e);
    assert_eq!((line, col), (2, 12), "{e}");
    assert!(rest.starts_with("agent: "), "{e}");
    let (e, _) = api
        .send("POST", test, "{\"agent\": \"a\",\n \"session\": \"s\"} x")
        .error(400);
    assert_eq!(body_place(&e).0, 2, "{e}");
    let (e, _) = api
        .send("POST", test, "{\"agent\": \"a\", \"agent\": \"b\"}")
        .error(422);
    let (line, col, rest) = body_place(&e);
    assert_eq!((line, col), (1, 16), "{e}");
    assert!(rest.starts_with("agent: duplicate key"), "{e}");
}

#[test]
fn token_fields_add_up_per_session_and_per_agent_in_sessions_stats_and_metrics() {
    let api = Api::start(None);
    let _sub = api.hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let response = |agent: &str, session: &str, input: u64, output: u64, cache: u64| {
        format!(
            r#"{{"event":"llm_response","agent":"{agent}","session":"{session}","payload":{{"provider":"p","model":"m","duration_ms":1,"success":true,"input_tokens":{input},"output_tokens":{output},"cache_read_input_tokens":{cache}}}}}"#
        )
    };
    let body = [
        response("coder", "s1", 10, 1, 100),
        response("coder", "s1", 20, 2, 0),
        response("coder", "s2", 5, 5, 0),
        response("reviewer", "s3", 7, 0, 0),
        // Not a number: nothing counted, the event still queued.
        r#"{"event":"llm_response","agent":"coder","session":"s1","payload":{"provider":"p","model":"m","duration_ms":1,"success":true,"input_tokens":"lots"}}"#.to_string(),
    ]
    .join("\n");
    let r = api.send("POST", "/api/events", &body);
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["queued"], 5, "{}", r.text);

    let sessions = api.get("/api/sessions").json();
    let list = sessions["sessions"].as_array().unwrap();
    let find = |s: &str| {
        list.iter()
            .find(|x| x["session"] == s)
            .unwrap_or_else(|| panic!("{s} in {sessions}"))
    };
    assert_eq!(find("s1")["agent"], "coder");
    assert_eq!(
        (
            &find("s1")["input_tokens"],
            &find("s1")["output_tokens"],
            &find("s1")["cache_read_input_tokens"]
        ),
        (&json!(30), &json!(3), &json!(100))
    );
    assert_eq!(find("s3")["input_tokens"], 7);

    let stats = api.get("/api/stats").json();
    let tokens = stats["sessions"]["tokens"].as_array().unwrap().clone();
    let coder = tokens.iter().find(|a| a["agent"] == "coder").unwrap();
    assert_eq!(
        (&coder["input_tokens"], &coder["output_tokens"]),
        (&json!(35), &json!(8))
    );

    let text = api.get("/metrics").text;
    for (series, value) in [
        (r#"prx_hooks_tokens_total{agent="coder",kind="input"}"#, 35),
        (
            r#"prx_hooks_tokens_total{agent="coder",kind="cache_read"}"#,
            100,
        ),
        (
            r#"prx_hooks_tokens_total{agent="reviewer",kind="output"}"#,
            0,
        ),
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(series))
            .unwrap_or_else(|| panic!("{series} missing:\n{text}"));
        assert_eq!(line, format!("{series} {value}"), "{text}");
    }
}

#[test]
fn a_claude_code_turn_end_from_this_machine_brings_its_transcripts_model_calls_first() {
    let reader = Arc::new(prx_hooks::ingest::Transcripts::new());
    let api = Api::start_with(None, |o| o.read_transcripts(reader.clone()));
    let sub = api.hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let transcript = api.ws().join("session.jsonl");
    std::fs::write(
        &transcript,
        concat!(
            r#"{"type":"user","message":{"role":"user","content":"go"},"timestamp":"2026-12-07T10:00:00.000Z"}"#,
            "\n",
            r#"{"type":"api-request","id":"req-1","timestamp":"2026-12-07T10:00:00.500Z"}"#,
            "\n",
            r#"{"type":"assistant","requestRef":"req-1","timestamp":"2026-12-07T10:00:02.000Z","message":{"id":"msg_1","model":"claude-x","content":[{"type":"text","text":"SECRET ANSWER"}],"usage":{"input_tokens":12,"cache_read_input_tokens":30,"output_tokens":7}}}"#,
            "\n",
        ),
    )
    .unwrap();
    let stop =
        json!({"session_id": "s1", "hook_event_name": "Stop", "transcript_path": transcript});
    let post = |body: &Value| {
        let r = api.send("POST", "/api/ingest/claude-code", &body.to_string());
        assert_eq!(r.status, 200, "{}", r.text);
    };
    post(&stop);
    let got: Vec<_> = (0..4)
        .map(|_| sub.recv_timeout(Duration::from_secs(10)).unwrap())
        .collect();
    let kinds: Vec<_> = got.iter().map(|m| m.topic().to_string()).collect();
    assert_eq!(
        kinds,
        [
            "prx.lifecycle.llm_request",
            "prx.lifecycle.llm_response",
            "prx.lifecycle.turn_complete",
            "prx.lifecycle.agent_end"
        ]
    );
    let response: Value = serde_json::from_slice(got[1].json()).unwrap();
    assert_eq!(
        (
            &response["model"],
            &response["input_tokens"],
            &response["cache_read_input_tokens"],
            &response["output_tokens"],
            &response["duration_ms"]
        ),
        (
            &json!("claude-x"),
            &json!(12),
            &json!(30),
            &json!(7),
            &json!(1500)
        )
    );
    assert!(!got[1].json_str().contains("SECRET"), "no content");
    assert_eq!(
        got[0].origin_timestamp(),
        Some("2026-12-07T10:00:00.500000Z")
    );
    assert_eq!(
        got[1].origin_timestamp(),
        Some("2026-12-07T10:00:02.000000Z")
    );
    assert_eq!(got[0].agent(), "claude-code");
    assert_eq!(got[0].session(), "s1");

    // The same turn's end again (a retry): nothing new in the transcript, no model call twice.
    post(&stop);
    let again: Vec<_> = (0..2)
        .map(|_| {
            sub.recv_timeout(Duration::from_secs(10))
                .unwrap()
                .topic()
                .to_string()
        })
        .collect();
    assert_eq!(
        again,
        ["prx.lifecycle.turn_complete", "prx.lifecycle.agent_end"]
    );
    let stats = api.get("/api/stats").json();
    assert_eq!(stats["transcripts"]["reads"], 2, "{stats}");
    assert_eq!(stats["transcripts"]["calls"], 1, "{stats}");
    assert_eq!(
        stats["sessions"]["tokens"][0]["output_tokens"], 7,
        "{stats}"
    );

    // A path that is not a transcript is not read, and is counted.
    post(&json!({"session_id": "s1", "hook_event_name": "Stop", "transcript_path": "/etc/passwd"}));
    let stats = api.get("/api/stats").json();
    assert_eq!(stats["transcripts"]["refused"], 1, "{stats}");
}

#[test]
fn without_transcripts_asked_for_a_turn_end_reads_none() {
    let api = Api::start(None);
    let sub = api.hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let transcript = api.ws().join("session.jsonl");
    std::fs::write(
        &transcript,
        r#"{"type":"assistant","timestamp":"2026-12-07T10:00:02Z","message":{"id":"m","model":"x","usage":{"input_tokens":1,"output_tokens":1}}}"#.to_string() + "\n",
    )
    .unwrap();
    let stop =
        json!({"session_id": "s1", "hook_event_name": "Stop", "transcript_path": transcript});
    let r = api.send("POST", "/api/ingest/claude-code", &stop.to_string());
    assert_eq!(r.status, 200, "{}", r.text);
    let first = sub.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(first.topic(), "prx.lifecycle.turn_complete");
    assert!(api.get("/api/stats").json().get("transcripts").is_none());
}
