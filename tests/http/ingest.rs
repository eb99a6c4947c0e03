//! `POST /api/events` over real loopback TCP: NDJSON in the `run --events` format into a real
//! `Hooks` with real hook processes; the report, the limits, order across connections, topic
//! lines, the counters.

use prx_hooks::http::{HttpOptions, Server, Token};
use prx_hooks::{Hooks, HooksBuilder};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use ureq::http::Request;

use crate::support::{lines, wait_for};

const TOKEN: &str = "ingest-token-0123456789abcdef";

pub(crate) struct Ingest {
    pub ws: tempfile::TempDir,
    pub hooks: Arc<Hooks>,
    pub server: Server,
}

pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Ingest {
    pub(crate) fn start(hooks_json: &str) -> Ingest {
        Ingest::start_with(hooks_json, |b| b, |o| o)
    }

    pub(crate) fn start_with(
        hooks_json: &str,
        build: impl FnOnce(HooksBuilder) -> HooksBuilder,
        opts: impl FnOnce(HttpOptions) -> HttpOptions,
    ) -> Ingest {
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("hooks.json"), hooks_json).unwrap();
        let hooks = Arc::new(
            build(Hooks::builder().workspace(ws.path()))
                .build()
                .unwrap(),
        );
        let options = opts(HttpOptions::new(Token::new(TOKEN, "test").unwrap()));
        let server = Server::start(hooks.clone(), options, "127.0.0.1:0".parse().unwrap()).unwrap();
        Ingest { ws, hooks, server }
    }

    /// A client with a connection pool of its own.
    pub(crate) fn client() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into()
    }

    pub(crate) fn post_with(
        &self,
        client: &ureq::Agent,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Answer {
        let url = format!("http://{}{path}", self.server.local_addr());
        let mut req = Request::builder().method("POST").uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = client.run(req.body(body.to_vec()).unwrap()).unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let body =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
        Answer { status, body }
    }

    /// NDJSON with the token.
    pub(crate) fn post(&self, client: &ureq::Agent, path: &str, body: &[u8]) -> Answer {
        let auth = format!("Bearer {TOKEN}");
        let headers = [
            ("authorization", auth.as_str()),
            ("content-type", "application/x-ndjson"),
        ];
        self.post_with(client, path, &headers, body)
    }

    pub(crate) fn stats(&self) -> Value {
        let url = format!("http://{}/api/stats", self.server.local_addr());
        let mut resp = Ingest::client()
            .get(url)
            .header("authorization", format!("Bearer {TOKEN}"))
            .call()
            .unwrap();
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
    }
}

/// A hook on tool_call that waits for `gate` to exist, then appends its payload to `log`.
fn gated(gate: &Path, log: &Path) -> String {
    let script = format!(
        "read -r p; while [ ! -e {} ]; do sleep 0.01; done; printf '%s\\n' \"$p\" >> {}",
        gate.display(),
        log.display()
    );
    json!({"hooks": {"tool_call": [
        // One run at a time: two runs waiting at the gate would race to append once it opens.
        {"command": "/bin/sh", "args": ["-c", script], "stdin_json": true, "timeout_ms": 30000,
         "max_concurrent": 1}
    ]}})
    .to_string()
}

fn tool_call(session: &str, output: &str) -> String {
    json!({"event": "tool_call", "agent": "a", "session": session,
           "payload": {"tool": "shell", "success": true, "output": output}})
    .to_string()
}

#[test]
fn a_batch_is_answered_with_its_report_while_the_hook_still_waits_and_then_fires_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, log) = (dir.path().join("gate"), dir.path().join("log"));
    let api = Ingest::start(&gated(&gate, &log));
    let body = format!(
        "{}\n{{\"event\":\"tool_call\",\"agent\":\"a\"}}\n\n{}\n{{\"event\":\"tool_call\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{{\"tool\":\"t\",\"success\":\"yes\",\"output\":\"\"}}}}\n",
        tool_call("s", "one"),
        tool_call("s", "two"),
    );
    let client = Ingest::client();
    let r = api.post(&client, "/api/events", body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    // The answer came while every hook run still waits at its gate.
    assert!(lines(&log).is_empty(), "the answer waited for a hook");
    assert_eq!(
        r.body,
        json!({"queued": 2, "dropped": 0, "skipped": 0, "refused": 0, "more_errors": 0,
        "errors": [
          {"line": 2, "column": 1, "message": "session: missing (a line needs event, agent and session)"},
          {"line": 5, "column": 80, "message": "payload.success: expected a boolean, found a string \"yes\""}
        ]})
    );
    std::fs::write(&gate, "").unwrap();
    wait_for("both hook runs", || lines(&log).len() == 2);
    let outputs: Vec<String> = lines(&log)
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["output"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(outputs, ["one", "two"]);
    let stats = api.stats();
    assert_eq!(
        stats["ingest"],
        json!({"requests": 1, "refused_requests": 0, "queued": 2, "dropped": 0, "skipped": 0,
               "refused": 0, "errors": 2, "duplicates": 0})
    );
}

/// Headers, body, path, the status expected, what its error says.
type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<u8>, &'a str, u16, &'a str);

#[test]
fn the_token_the_origin_the_media_type_the_query_and_the_size_are_checked() {
    let api = Ingest::start_with(
        r#"{"hooks": {"tool_call": [{"command": "/bin/true"}]}}"#,
        |b| b,
        |o| o.max_ingest_bytes(4096),
    );
    let client = Ingest::client();
    let line = tool_call("s", "x");
    let auth = format!("Bearer {TOKEN}");
    let nd = ("content-type", "application/x-ndjson");
    let cases: Vec<Case> = vec![
        (
            vec![nd],
            line.clone().into_bytes(),
            "/api/events",
            401,
            "token",
        ),
        (
            vec![("authorization", "Bearer wrong-token-0123456789"), nd],
            line.clone().into_bytes(),
            "/api/events",
            401,
            "token",
        ),
        (
            vec![
                ("authorization", &auth),
                nd,
                ("origin", "http://evil.example"),
            ],
            line.clone().into_bytes(),
            "/api/events",
            403,
            "origin",
        ),
        (
            vec![("authorization", &auth), ("content-type", "text/plain")],
            line.clone().into_bytes(),
            "/api/events",
            415,
            "application/x-ndjson",
        ),
        (
            vec![("authorization", &auth), nd],
            line.clone().into_bytes(),
            "/api/events?lenient=maybe",
            400,
            "lenient: expected true or false",
        ),
        (
            vec![("authorization", &auth), nd],
            line.clone().into_bytes(),
            "/api/events?strict=1",
            400,
            "unknown query parameter",
        ),
        (
            vec![("authorization", &auth), nd],
            format!("{line}\n").repeat(100).into_bytes(),
            "/api/events",
            413,
            "larger than 4096 bytes",
        ),
    ];
    for (headers, body, path, status, says) in cases {
        let r = api.post_with(&client, path, &headers, &body);
        assert_eq!(r.status, status, "{path} {headers:?}: {}", r.body);
        let error = r.body["error"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            error.contains(&says.to_ascii_lowercase()),
            "{status}: {error}"
        );
    }
    // application/json is taken too, and lenient leaves a missing documented field out.
    let lax = r#"{"event":"tool_call","agent":"a","session":"s","payload":{"tool":"t"}}"#;
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let strict = api.post_with(&client, "/api/events", &headers, lax.as_bytes());
    assert_eq!(
        (strict.status, &strict.body["errors"][0]["line"]),
        (200, &json!(1))
    );
    let lenient = api.post_with(
        &client,
        "/api/events?lenient=true",
        &headers,
        lax.as_bytes(),
    );
    assert_eq!(
        (lenient.status, &lenient.body["queued"]),
        (200, &json!(1)),
        "{}",
        lenient.body
    );
    // Every refused request is counted (the 401s and the 403 never reach the route).
    assert_eq!(api.stats()["ingest"]["refused_requests"], json!(4));
}

#[test]
fn one_sessions_events_keep_their_order_across_requests_on_different_connections() {
    let api = Ingest::start(r#"{"hooks": {}}"#);
    let sub = api
        .hooks
        .bus()
        .subscribe("prx.lifecycle.tool_call")
        .unwrap();
    let clients = [Ingest::client(), Ingest::client(), Ingest::client()];
    let n = 300;
    for i in 0..n {
        let r = api.post(
            &clients[i % 3],
            "/api/events",
            tool_call("s", &i.to_string()).as_bytes(),
        );
        assert_eq!(
            (r.status, &r.body["queued"]),
            (200, &json!(1)),
            "{}",
            r.body
        );
    }
    for i in 0..n {
        let msg = sub.recv_timeout(Duration::from_secs(20)).unwrap();
        let payload: Value = serde_json::from_str(msg.json_str()).unwrap();
        assert_eq!(
            (msg.seq(), payload["output"].as_str()),
            (i as u64, Some(&*i.to_string()))
        );
    }
}

#[test]
fn topic_lines_reach_bus_subscribers_with_their_agent_and_session_and_bad_ones_are_refused() {
    let api = Ingest::start(r#"{"hooks": {}}"#);
    let client = Ingest::client();
    let line = r#"{"topic":"prx.agent.claude-code.Notification","agent":"claude-code","session":"abc","payload":{"message":"Claude needs your permission"}}"#;
    // Nobody listens yet: skipped, not lost silently.
    let r = api.post(&client, "/api/events", line.as_bytes());
    assert_eq!(
        (r.status, &r.body["skipped"]),
        (200, &json!(1)),
        "{}",
        r.body
    );
    let sub = api.hooks.bus().subscribe("prx.agent.*").unwrap();
    let bad = [
        r#"{"topic":"prx.lifecycle.tool_call","agent":"a","session":"s","payload":{}}"#,
        r#"{"topic":"prx.agent.a b.x","agent":"a","session":"s","payload":{}}"#,
        r#"{"topic":"prx.agent.a.x","agent":"a","session":"s","payload":[1]}"#,
        r#"{"topic":"prx.agent.a.x","event":"tool_call","agent":"a","session":"s","payload":{}}"#,
        r#"{"topic":"prx.agent.a.x","agent":"a","payload":{}}"#,
    ];
    let body = format!("{line}\n{}\n", bad.join("\n"));
    let r = api.post(&client, "/api/events", body.as_bytes());
    assert_eq!(
        (r.status, &r.body["queued"]),
        (200, &json!(1)),
        "{}",
        r.body
    );
    let errors: Vec<(u64, String)> = r.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().unwrap(),
                e["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    for ((line, message), says) in errors.iter().zip([
        "expected \"prx.agent.<agent>.<event>\"",
        "character ' ' is not allowed",
        "payload: expected a JSON object, found an array",
        "either event or topic",
        "session: missing",
    ]) {
        assert!(message.contains(says), "line {line}: {message}");
    }
    let msg = sub.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (
            msg.topic(),
            msg.agent(),
            msg.session(),
            msg.json_str(),
            msg.event()
        ),
        (
            "prx.agent.claude-code.Notification",
            "claude-code",
            "abc",
            r#"{"message":"Claude needs your permission"}"#,
            None
        )
    );
    assert!(sub.try_recv().is_err(), "a refused line was published");
}

#[test]
fn errors_past_a_hundred_are_counted_and_an_oversize_line_costs_only_itself() {
    let api = Ingest::start_with(r#"{"hooks": {}}"#, |b| b.max_event_bytes(64 * 1024), |o| o);
    let _sub = api.hooks.bus().subscribe("*").unwrap();
    let client = Ingest::client();
    let mut body = "not json\n".repeat(150);
    body.push_str(&tool_call("s", &"x".repeat(100 * 1024)));
    body.push('\n');
    body.push_str(&tool_call("s", "small"));
    let r = api.post(&client, "/api/events", body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["errors"].as_array().unwrap().len(), 100);
    assert_eq!(r.body["more_errors"], json!(51));
    assert_eq!(r.body["queued"], json!(1));
    assert_eq!(
        r.body["errors"][0]["message"]
            .as_str()
            .map(|m| m.starts_with("not JSON")),
        Some(true)
    );
    assert_eq!(api.stats()["ingest"]["errors"], json!(151));
}

#[test]
fn a_shut_down_hook_system_answers_503_and_queues_nothing() {
    let api = Ingest::start(r#"{"hooks": {}}"#);
    api.hooks.shutdown(Duration::from_secs(5));
    let r = api.post(
        &Ingest::client(),
        "/api/events",
        tool_call("s", "x").as_bytes(),
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body["error"].as_str().unwrap().contains("shutting down"));
    let _ = &api.ws;
}
