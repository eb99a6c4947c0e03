//! `GET /api/events` (docs/http.md § The live stream; ARCHITECTURE.md § The live stream) over real
//! loopback TCP: a real `Hooks` on a temporary workspace, real hook processes, real guest
//! plugins, and an SSE client that reads the wire format from a raw socket.

use prx_hooks::http::{EventStreamOptions, HttpOptions, Server, Token};
use prx_hooks::{Emit, Event, Hooks};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sse;

use crate::support;

#[cfg(feature = "wasm")]
use crate::plugins;

use sse::{Ev, Sse};
use support::wait_for;

const TOKEN: &str = "test-token-0123456789abcdef";

struct Api {
    _ws: tempfile::TempDir,
    hooks: Arc<Hooks>,
    server: Server,
}

impl Api {
    fn start(hooks_json: Option<&str>, opts: impl FnOnce(HttpOptions) -> HttpOptions) -> Api {
        Api::start_in(hooks_json, opts, |_| {})
    }

    fn start_in(
        hooks_json: Option<&str>,
        opts: impl FnOnce(HttpOptions) -> HttpOptions,
        prepare: impl FnOnce(&std::path::Path),
    ) -> Api {
        let ws = tempfile::tempdir().unwrap();
        if let Some(text) = hooks_json {
            std::fs::write(ws.path().join("hooks.json"), text).unwrap();
        }
        prepare(ws.path());
        let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
        let options = opts(HttpOptions::new(Token::new(TOKEN, "test").unwrap()));
        let server = Server::start(hooks.clone(), options, "127.0.0.1:0".parse().unwrap()).unwrap();
        Api {
            _ws: ws,
            hooks,
            server,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Opens a stream with the token; waits for its `ready` event and returns it too.
    fn stream(&self, query: &str, extra: &[(&str, &str)]) -> (Sse, Vec<Ev>, Ev) {
        let auth = format!("Bearer {TOKEN}");
        let mut headers = vec![("Authorization", auth.as_str())];
        headers.extend_from_slice(extra);
        let mut s = Sse::open(self.addr(), &format!("/api/events{query}"), &headers);
        if s.status != 200 {
            let status = s.status;
            panic!("{query}: {status}: {}", s.text());
        }
        let (before, ready) = s.until("ready");
        (s, before, ready)
    }

    fn get_json(&self, path: &str) -> Value {
        let auth = format!("Bearer {TOKEN}");
        let s = Sse::open(
            self.addr(),
            path,
            &[("Authorization", &auth), ("Connection", "close")],
        );
        assert_eq!(s.status, 200);
        serde_json::from_str(&s.text()).unwrap()
    }

    fn event_stats(&self) -> Value {
        self.get_json("/api/stats")["events"].clone()
    }
}

fn tool_call(hooks: &Hooks, output: &str) -> Emit {
    hooks.emitter("coder", "demo-1").emit(Event::ToolCall {
        tool: "shell",
        success: true,
        output,
    })
}

/// The instance and position of an `id:`.
fn split_id(id: &str) -> (&str, u64) {
    let (inst, n) = id.rsplit_once('-').expect("<instance>-<n>");
    (inst, n.parse().expect("a number"))
}

#[test]
fn an_emitted_event_arrives_as_run_print_writes_it_with_its_topic_and_a_resumable_id() {
    let api = Api::start(None, |o| o);
    // A plain bus subscriber beside the stream: the stream's data must be its envelope, byte
    // for byte (what `run --print` writes).
    let sub = api.hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let (mut s, before, ready) = api.stream("?pattern=prx.lifecycle.*", &[]);
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(
        s.header("content-type"),
        Some("text/event-stream; charset=utf-8")
    );
    assert_eq!(s.header("cache-control"), Some("no-cache"));
    let r = ready.json();
    let instance = r["instance"].as_str().unwrap().to_string();
    assert_eq!(instance.len(), 16, "{r}");
    assert_eq!(ready.id.as_deref(), Some(format!("{instance}-0").as_str()));
    // A pattern alone asks for bus messages only.
    assert_eq!(r["kinds"], json!(["bus"]));
    assert_eq!(r["patterns"], json!(["prx.lifecycle.*"]));

    assert_eq!(
        tool_call(&api.hooks, "line one\nline \"two\""),
        Emit::Queued
    );
    let e = s.event().unwrap();
    let msg = sub.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut envelope = Vec::new();
    msg.write_envelope(&mut envelope);
    assert_eq!(e.event, "prx.lifecycle.tool_call");
    assert_eq!(e.data.as_bytes(), &envelope[..]);
    let (inst, n) = split_id(e.id.as_deref().unwrap());
    assert_eq!((inst, n), (instance.as_str(), 1));
    assert_eq!(e.json()["payload"]["output"], "line one\nline \"two\"");

    // Custom topics are streamed too (`*` by default); one spelt like the stream's own
    // events comes as `message`, so it cannot pass for a notice.
    let (mut all, _, _) = api.stream("", &[]);
    api.hooks
        .bus()
        .publish("myapp.audit", r#"{"n":1}"#)
        .unwrap();
    api.hooks
        .bus()
        .publish("dropped", r#"{"count":1000000}"#)
        .unwrap();
    let a = all.event().unwrap();
    assert_eq!(
        (a.event.as_str(), a.json()["payload"]["n"].as_i64()),
        ("myapp.audit", Some(1))
    );
    assert_eq!(a.json()["event"], Value::Null);
    let d = all.event().unwrap();
    assert_eq!(
        (d.event.as_str(), d.json()["topic"].as_str()),
        ("message", Some("dropped"))
    );
    // The first stream's pattern leaves custom topics out: its next event is this one.
    tool_call(&api.hooks, "after");
    let e = s.event().unwrap();
    assert_eq!(e.json()["payload"]["output"], "after");
    let (_, n2) = split_id(e.id.as_deref().unwrap());
    assert_eq!(
        n2, 4,
        "positions count every item of the stream, in one order"
    );
}

#[test]
fn the_stream_needs_the_token_and_a_same_origin_and_checks_its_query() {
    let api = Api::start(None, |o| o);
    let s = Sse::open(api.addr(), "/api/events", &[]);
    assert_eq!(s.status, 401);
    let s = Sse::open(
        api.addr(),
        "/api/events",
        &[("Authorization", "Bearer wrong-token-0123456789")],
    );
    assert_eq!(s.status, 401);
    let auth = format!("Bearer {TOKEN}");
    let s = Sse::open(
        api.addr(),
        "/api/events",
        &[("Authorization", &auth), ("Origin", "http://evil.example")],
    );
    assert_eq!(s.status, 403);
    for (query, status, needle) in [
        ("?pattern=a..b", 400, "pattern"),
        ("?pattern=prx.lifecycle.%2A", 200, ""),
        ("?kinds=bus,run", 400, "did you mean \\\"runs\\\""),
        ("?kinds=", 400, "kinds: empty"),
        ("?kinds=runs&pattern=x", 400, "add bus to kinds"),
        ("?backlog=many", 400, "backlog"),
        ("?patern=x", 400, "did you mean \\\"pattern\\\""),
    ] {
        let s = Sse::open(
            api.addr(),
            &format!("/api/events{query}"),
            &[("Authorization", &auth), ("Connection", "close")],
        );
        assert_eq!(s.status, status, "{query}");
        if status != 200 {
            let text = s.text();
            assert!(text.contains(needle), "{query}: {text}");
        }
    }
    let s = Sse::open(
        api.addr(),
        "/api/events",
        &[("Authorization", &auth), ("Last-Event-ID", "not an id")],
    );
    assert_eq!(s.status, 400);
    assert!(s.text().contains("<instance>-<n>"));
}

#[test]
fn a_slow_client_loses_only_its_own_messages_counted_and_announced_and_the_pipeline_loses_none() {
    let api = Api::start(None, |o| {
        o.events(EventStreamOptions::default().queue(8))
            .idle_timeout(Duration::from_secs(120))
    });
    let auth = format!("Bearer {TOKEN}");
    let (mut fast, _, _) = api.stream("?kinds=bus", &[]);
    let conn = sse::small_buffer_conn(api.addr(), 4096);
    let mut slow = Sse::over(
        Box::new(conn),
        &api.addr().to_string(),
        "/api/events?kinds=bus",
        &[("Authorization", &auth)],
    );
    assert_eq!(slow.status, 200);
    slow.until("ready");
    // The fast client reads on a thread of its own while events flow; the producer stays
    // at most 4 events ahead of it, so its queue of 8 never fills. The slow client reads
    // nothing meanwhile.
    const N: usize = 5_000;
    let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = progress.clone();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::with_capacity(N);
        while got.len() < N {
            let e = fast.event().expect("the fast stream ended");
            assert_eq!(e.event, "prx.lifecycle.tool_call", "{e:?}");
            got.push(e.json()["payload"]["output"].as_str().unwrap().to_string());
            seen.store(got.len(), std::sync::atomic::Ordering::Release);
        }
        got
    });
    let output = "x".repeat(4000);
    let em = api.hooks.emitter("coder", "demo-1");
    let mut early = Vec::new();
    for i in 0..N {
        if i == N / 2 {
            // The slow client reads a little halfway: its queue takes frames again, and the
            // first of them carries the notice of what was lost before it.
            early.extend((0..300).map(|_| slow.event().expect("the slow stream ended")));
        }
        let out = format!("{i} {output}");
        assert_eq!(
            em.emit(Event::ToolCall {
                tool: "shell",
                success: true,
                output: &out
            }),
            Emit::Queued
        );
        while i >= progress.load(std::sync::atomic::Ordering::Acquire) + 4 {
            std::hint::spin_loop();
            if reader.is_finished() {
                break;
            }
        }
    }
    let got = reader.join().unwrap();
    let expected: Vec<String> = (0..N).map(|i| format!("{i} {output}")).collect();
    assert_eq!(got, expected, "the fast client got every event, in order");

    // Now the slow one reads: some events, and a `dropped` notice for each run of losses,
    // whose counts add up to what it did not get.
    wait_for("the hub to hand over everything", || {
        api.event_stats()["items"].as_u64() == Some(N as u64)
    });
    // The only items are the N bus messages, at positions 1..=N: each notice must stand
    // exactly where its losses are (the gap in positions after it).
    let (mut received, mut announced, mut notices) = (0u64, 0u64, 0u64);
    let (mut last_pos, mut pending) = (0u64, 0u64);
    let mut totals = Vec::new();
    let mut early = early.into_iter();
    while received + announced < N as u64 {
        let e = early
            .next()
            .unwrap_or_else(|| slow.event().expect("the slow stream ended"));
        match e.event.as_str() {
            "prx.lifecycle.tool_call" => {
                received += 1;
                let (_, pos) = split_id(e.id.as_deref().unwrap());
                assert_eq!(
                    pos - last_pos - 1,
                    pending,
                    "the notice before position {pos}"
                );
                let i: usize = e.json()["payload"]["output"]
                    .as_str()
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(i as u64, pos - 1);
                (last_pos, pending) = (pos, 0);
            }
            "dropped" => {
                let d = e.json();
                assert_eq!(d["reason"], "client_queue_full", "{d}");
                assert!(e.id.is_none(), "a client's own notice has no id");
                notices += 1;
                announced += d["count"].as_u64().unwrap();
                pending += d["count"].as_u64().unwrap();
                totals.push(d["total"].as_u64().unwrap());
            }
            other => panic!("unexpected {other}: {e:?}"),
        }
    }
    assert_eq!(
        N as u64 - last_pos,
        pending,
        "the last notice covers the tail"
    );
    assert!(
        notices >= 2 && received > 0,
        "received {received}, {announced} announced in {notices}"
    );
    assert_eq!(
        totals.last().copied(),
        Some(announced),
        "`total` is the running sum"
    );
    println!("slow client: {received} received, {announced} lost in {notices} notices");
    let stats = api.event_stats();
    assert_eq!(stats["dropped_client"].as_u64(), Some(announced), "{stats}");
    assert_eq!(stats["dropped_server"].as_u64(), Some(0), "{stats}");
    let core = api.hooks.stats();
    assert_eq!(
        (core.dropped, core.dropped_budget),
        (0, 0),
        "the pipeline lost nothing"
    );
    let hub = core
        .subscribers
        .iter()
        .find(|s| s.pattern == "*")
        .expect("the hub's subscription");
    assert_eq!(hub.dropped, 0);
    // The metrics say the same.
    let auth2 = format!("Bearer {TOKEN}");
    let metrics = Sse::open(
        api.addr(),
        "/metrics",
        &[("Authorization", &auth2), ("Connection", "close")],
    )
    .text();
    assert!(
        metrics.contains(&format!(
            "prx_hooks_http_event_stream_dropped_total{{reason=\"client_queue_full\"}} {announced}"
        )),
        "{metrics}"
    );
    // The fast client's stream ended with its reader thread; the slow one is open.
    assert!(
        metrics.contains("prx_hooks_http_event_streams 1"),
        "{metrics}"
    );
}

#[test]
fn last_event_id_resumes_from_the_backlog_and_says_when_it_cannot() {
    let api = Api::start(None, |o| {
        o.events(
            EventStreamOptions::default()
                .backlog(8, 1 << 20)
                .linger(Duration::from_secs(600)),
        )
    });
    let (mut s, _, ready) = api.stream("?kinds=bus", &[]);
    let instance = ready.json()["instance"].as_str().unwrap().to_string();
    for i in 0..3 {
        tool_call(&api.hooks, &format!("a{i}"));
    }
    let seen: Vec<Ev> = (0..3).map(|_| s.event().unwrap()).collect();
    let last = seen[1].id.clone().unwrap();
    drop(s);
    // Missed while away: a2 (already sent, but after `last`) and b0..b2.
    for i in 0..3 {
        tool_call(&api.hooks, &format!("b{i}"));
    }
    wait_for("the hub to number them", || {
        api.event_stats()["items"].as_u64() == Some(6)
    });
    let (_, replay, ready) = api.stream("?kinds=bus", &[("Last-Event-ID", &last)]);
    let outputs: Vec<String> = replay
        .iter()
        .map(|e| e.json()["payload"]["output"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(outputs, ["a2", "b0", "b1", "b2"]);
    assert_eq!(ready.json()["replayed"], 4);
    assert_eq!(ready.id.as_deref(), Some(format!("{instance}-6").as_str()));

    // Evicted: the backlog holds 8 items; 12 more pass while away.
    for i in 0..12 {
        tool_call(&api.hooks, &format!("c{i}"));
    }
    wait_for("the hub to number them", || {
        api.event_stats()["items"].as_u64() == Some(18)
    });
    let (_, replay, _) = api.stream("?kinds=bus", &[("Last-Event-ID", &format!("{instance}-6"))]);
    let gap = replay[0].json();
    assert_eq!(replay[0].event, "gap");
    assert_eq!(gap["reason"], "evicted", "{gap}");
    assert_eq!(gap["missed"], 4, "{gap}");
    assert_eq!(gap["first_available"], format!("{instance}-11"));
    let outputs: Vec<String> = replay[1..]
        .iter()
        .map(|e| e.json()["payload"]["output"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        outputs,
        (4..12).map(|i| format!("c{i}")).collect::<Vec<_>>()
    );

    // Another instance's id (a restarted server) is recognized as such.
    let (_, replay, _) = api.stream("", &[("Last-Event-ID", "00000000deadbeef-5")]);
    let gap = replay[0].json();
    assert_eq!(
        (replay[0].event.as_str(), gap["reason"].as_str()),
        ("gap", Some("other_instance"))
    );
    assert_eq!(gap["last_event_id"], "00000000deadbeef-5");
    assert_eq!(gap["instance"], instance);
    // Everything this instance holds came after it: all of the backlog (8 items) follows.
    assert_eq!(replay.len(), 1 + 8, "{replay:?}");
    assert_eq!(gap["first_available"], format!("{instance}-11"));
    // An id of ours we never sent.
    let (_, replay, _) = api.stream("", &[("Last-Event-ID", &format!("{instance}-999"))]);
    assert_eq!(replay[0].json()["reason"], "unknown_id");
    // The query parameter does what the header does (for clients that cannot set one), and
    // `?backlog=N` starts with the last N items.
    let (_, replay, _) = api.stream(&format!("?kinds=bus&last_event_id={instance}-16"), &[]);
    assert_eq!(replay.len(), 2, "{replay:?}");
    let (_, replay, _) = api.stream("?backlog=3", &[]);
    let outputs: Vec<&str> = replay
        .iter()
        .map(|e| e.data.as_str())
        .filter(|d| d.contains("\"c"))
        .collect();
    assert_eq!(outputs.len(), 3, "{replay:?}");
    let stats = api.event_stats();
    assert_eq!(
        (stats["resumed"].as_u64(), stats["gaps"].as_u64()),
        (Some(5), Some(3)),
        "{stats}"
    );
}

#[test]
fn a_resume_after_the_stream_stopped_recording_is_a_gap_of_unknown_size() {
    let api = Api::start(None, |o| {
        o.events(EventStreamOptions::default().linger(Duration::from_millis(100)))
    });
    let (mut s, _, _) = api.stream("?kinds=bus", &[]);
    tool_call(&api.hooks, "seen");
    let last = s.event().unwrap().id.unwrap();
    drop(s);
    wait_for("the hub to stop recording", || {
        api.event_stats()["recording"] == json!(false)
    });
    // Nobody listens now: the pipeline skips the event, as with no subscriber at all.
    assert_eq!(tool_call(&api.hooks, "unseen"), Emit::Skipped);
    let (_, replay, _) = api.stream("?kinds=bus", &[("Last-Event-ID", &last)]);
    assert_eq!(replay.len(), 1, "{replay:?}");
    let gap = replay[0].json();
    assert_eq!(gap["reason"], "not_recorded", "{gap}");
    assert_eq!(gap["missed"], Value::Null);
}

#[test]
fn hook_runs_stream_with_their_outcome_duration_exit_code_and_stderr_tail() {
    let hooks_json = r#"{"hooks": {"error": [
        {"id": "fails", "command": "/bin/sh", "args": ["-c", "echo 'disk full' >&2; exit 3"]},
        {"id": "ok", "command": "/bin/true"}
    ]}}"#;
    let api = Api::start(Some(hooks_json), |o| o);
    let (mut s, _, _) = api.stream("?kinds=runs", &[]);
    api.hooks.emitter("coder", "demo-1").emit(Event::Error {
        component: "tool",
        message: "boom",
    });
    let mut runs: Vec<Value> = (0..2)
        .map(|_| {
            let e = s.event().unwrap();
            assert_eq!(e.event, "run", "{e:?}");
            e.json()
        })
        .collect();
    runs.sort_by_key(|r| r["id"].as_str().unwrap().to_string());
    let (fails, ok) = (&runs[0], &runs[1]);
    assert_eq!(fails["id"], "fails");
    assert_eq!(fails["event"], "error");
    assert_eq!(
        (fails["kind"].as_str(), fails["code"].as_i64()),
        (Some("exit"), Some(3))
    );
    assert_eq!(fails["outcome"], "exit 3");
    assert_eq!(fails["ok"], false);
    assert_eq!(fails["stderr_tail"], "disk full\n");
    assert!(fails["duration_ms"].as_f64().unwrap() > 0.0, "{fails}");
    assert_eq!(
        (fails["agent"].as_str(), fails["session"].as_str()),
        (Some("coder"), Some("demo-1"))
    );
    assert_eq!(
        (ok["outcome"].as_str(), ok["ok"].as_bool()),
        (Some("ok"), Some(true))
    );
    // A run not listed in kinds is not sent; the bus message of the same event neither.
    let (mut bus_only, _, _) = api.stream("?kinds=bus", &[]);
    api.hooks.emitter("coder", "demo-1").emit(Event::Error {
        component: "tool",
        message: "again",
    });
    assert_eq!(bus_only.event().unwrap().event, "prx.lifecycle.error");
    assert_eq!(s.event().unwrap().event, "run");
    tool_call(&api.hooks, "marker");
    assert_eq!(bus_only.event().unwrap().event, "prx.lifecycle.tool_call");
}

#[cfg(feature = "wasm")]
#[test]
fn plugin_calls_stream_as_one_aggregate_per_plugin_and_second_not_one_message_each() {
    let api = Api::start_in(
        None,
        |o| o,
        |ws| {
            plugins::install(ws, "audit-hook", "audit_hook", &plugins::audit_manifest());
        },
    );
    let (mut s, _, _) = api.stream("?kinds=plugins", &[]);
    const N: u64 = 300;
    for i in 0..N {
        tool_call(&api.hooks, &format!("{i}"));
    }
    let (mut ok, mut messages) = (0, 0);
    let started = Instant::now();
    while ok < N {
        let e = s.event().unwrap();
        assert_eq!(e.event, "plugin", "{e:?}");
        let a = e.json();
        assert_eq!(a["plugin"], "audit-hook", "{a}");
        assert_eq!(a["state"], "running");
        let interval = a["interval_ms"].as_u64().unwrap();
        assert!((900..=5000).contains(&interval), "{a}");
        assert_eq!(a["calls"], a["results"]["ok"], "{a}");
        ok += a["results"]["ok"].as_u64().unwrap();
        messages += 1;
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "only {ok} calls seen"
        );
    }
    assert_eq!(ok, N);
    assert!(
        messages <= 1 + started.elapsed().as_secs() + 1,
        "{messages} messages"
    );
    println!("{N} calls in {messages} aggregate(s)");
}

#[test]
fn streams_end_with_a_shutdown_event_when_the_server_stops_and_the_hook_system_refuses_after() {
    let mut api = Api::start(None, |o| o);
    let (mut s, _, _) = api.stream("", &[]);
    let started = Instant::now();
    api.server.shutdown(Duration::from_secs(20));
    // Without ending the streams first, the graceful shutdown would wait all 20 s.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let e = s.event().unwrap();
    assert_eq!(
        (e.event.as_str(), e.json()["reason"].as_str()),
        ("shutdown", Some("the server is stopping"))
    );
    assert!(s.next().is_none(), "the body ended");

    // The hook system shutting down ends the stream too, after the last events it drains.
    let api = Api::start(None, |o| o);
    let (mut s, _, _) = api.stream("?kinds=bus", &[]);
    tool_call(&api.hooks, "last");
    api.hooks.shutdown(Duration::from_secs(2));
    let e = s.event().unwrap();
    assert_eq!(e.json()["payload"]["output"], "last");
    let e = s.event().unwrap();
    assert_eq!(
        (e.event.as_str(), e.json()["reason"].as_str()),
        ("shutdown", Some("the hook system shut down"))
    );
    assert!(s.next().is_none());
    let auth = format!("Bearer {TOKEN}");
    let s = Sse::open(api.addr(), "/api/events", &[("Authorization", &auth)]);
    assert_eq!(s.status, 503);
    assert!(s.text().contains("shutting down"));
}

#[test]
fn the_stream_cap_refuses_with_429_counts_it_and_frees_a_place_when_a_client_leaves() {
    let api = Api::start(None, |o| {
        o.events(EventStreamOptions::default().max_streams(2))
    });
    let (a, _, _) = api.stream("", &[]);
    let (_b, _, _) = api.stream("", &[]);
    let auth = format!("Bearer {TOKEN}");
    let s = Sse::open(api.addr(), "/api/events", &[("Authorization", &auth)]);
    assert_eq!(s.status, 429);
    assert_eq!(s.header("retry-after"), Some("5"));
    assert!(s.text().contains("2 event streams are open"));
    let stats = api.event_stats();
    assert_eq!(
        (
            stats["refused"].as_u64(),
            stats["streams"].as_u64(),
            stats["max_streams"].as_u64()
        ),
        (Some(1), Some(2), Some(2))
    );
    drop(a);
    // The server notices the closed connection at its next write (a keep-alive at the
    // latest); an event written now finds it gone.
    wait_for("the place to be free", || {
        tool_call(&api.hooks, "poke");
        api.event_stats()["streams"].as_u64() == Some(1)
    });
    let (_c, _, _) = api.stream("", &[]);
}

#[test]
fn a_quiet_stream_gets_keepalives_and_outlives_the_header_and_idle_timeouts() {
    let api = Api::start(None, |o| {
        o.header_timeout(Duration::from_millis(300))
            .idle_timeout(Duration::from_millis(500))
            .events(EventStreamOptions::default().keepalive(Duration::from_millis(200)))
    });
    let (mut s, _, ready) = api.stream("", &[]);
    assert_eq!(ready.json()["keepalive_ms"], 200);
    let started = Instant::now();
    let mut comments = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let e = s.next().expect("the quiet stream was cut");
        assert!(e.comment, "{e:?}");
        assert_eq!(e.data, "keep-alive");
        comments += 1;
    }
    assert!(comments >= 5, "{comments} keep-alives in 3 s");
    tool_call(&api.hooks, "still here");
    assert_eq!(s.event().unwrap().json()["payload"]["output"], "still here");
    let http = api.server.stats();
    assert_eq!(
        (http.header_timeouts, http.write_timeouts),
        (0, 0),
        "{http:?}"
    );
}

#[test]
fn a_client_that_stops_reading_is_disconnected_by_the_write_deadline() {
    let api = Api::start(None, |o| {
        o.idle_timeout(Duration::from_secs(1))
            .events(EventStreamOptions::default().queue(16))
    });
    let auth = format!("Bearer {TOKEN}");
    let conn = sse::small_buffer_conn(api.addr(), 4096);
    let mut stalled = Sse::over(
        Box::new(conn),
        &api.addr().to_string(),
        "/api/events?kinds=bus",
        &[("Authorization", &auth)],
    );
    assert_eq!(stalled.status, 200);
    stalled.until("ready");
    let output = "y".repeat(4000);
    wait_for("the server to give up on the client", || {
        for _ in 0..200 {
            tool_call(&api.hooks, &output);
        }
        api.server.stats().write_timeouts >= 1 && api.event_stats()["streams"].as_u64() == Some(0)
    });
    drop(stalled);
}

#[test]
fn with_record_always_a_late_client_gets_what_happened_before_it_connected() {
    let api = Api::start(None, |o| {
        o.events(EventStreamOptions::default().record_always(true))
    });
    // The stream's own subscription is what listens: the event is queued, not skipped.
    assert_eq!(tool_call(&api.hooks, "early"), Emit::Queued);
    wait_for("the hub to number it", || {
        api.event_stats()["items"].as_u64() == Some(1)
    });
    assert_eq!(api.event_stats()["recording"], json!(true));
    let (_, replay, ready) = api.stream("?backlog=10", &[]);
    assert_eq!(replay.len(), 1, "{replay:?}");
    assert_eq!(replay[0].json()["payload"]["output"], "early");
    assert_eq!(ready.json()["replayed"], 1);
}

#[test]
fn a_stalled_clients_queue_is_bounded_in_bytes_not_only_in_frames() {
    // 4,096 frames of room, but 256 KiB: 200 events of 200 KB cannot all wait for a client
    // that reads nothing (its socket holds a few MB at most).
    let api = Api::start(None, |o| {
        o.idle_timeout(Duration::from_secs(120)).events(
            EventStreamOptions::default()
                .queue(4096)
                .queue_bytes(256 << 10),
        )
    });
    let auth = format!("Bearer {TOKEN}");
    let conn = sse::small_buffer_conn(api.addr(), 4096);
    let mut stalled = Sse::over(
        Box::new(conn),
        &api.addr().to_string(),
        "/api/events?kinds=bus",
        &[("Authorization", &auth)],
    );
    assert_eq!(stalled.status, 200);
    stalled.until("ready");
    let big = "z".repeat(200_000);
    let em = api.hooks.emitter("coder", "demo-1");
    for _ in 0..200 {
        while em.emit(Event::ToolCall {
            tool: "shell",
            success: true,
            output: &big,
        }) != Emit::Queued
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    wait_for("the hub to hand everything over", || {
        api.event_stats()["items"].as_u64() == Some(200)
    });
    let lost = api.event_stats()["dropped_client"].as_u64().unwrap();
    assert!(
        lost >= 100,
        "only {lost} of 200 frames of 200 KB lost: the queue held the rest"
    );
    // What it does read adds up: frames received + announced losses = 200.
    let (mut got, mut told) = (0, 0);
    while got + told < 200 {
        let e = stalled.event().unwrap();
        match e.event.as_str() {
            "dropped" => told += e.json()["count"].as_u64().unwrap(),
            _ => got += 1,
        }
    }
    assert_eq!(told, lost);
}

/// Reads a stream to its end: (bus messages received, losses announced, the last event).
fn read_to_the_end(s: &mut Sse) -> (u64, u64, Ev) {
    let (mut got, mut told) = (0u64, 0u64);
    let mut last = None;
    while let Some(e) = s.event() {
        match e.event.as_str() {
            "dropped" => told += e.json()["count"].as_u64().unwrap(),
            "prx.lifecycle.tool_call" => got += 1,
            _ => {}
        }
        last = Some(e);
    }
    (got, told, last.expect("the stream sent nothing"))
}

#[test]
fn a_stream_whose_queue_is_full_at_shutdown_is_told_its_losses_and_shutdown_comes_last() {
    const N: u64 = 2_000;
    for by_server in [true, false] {
        let Api { _ws, hooks, server } = Api::start(None, |o| {
            o.idle_timeout(Duration::from_secs(120))
                .events(EventStreamOptions::default().queue(16))
        });
        let addr = server.local_addr();
        let auth = format!("Bearer {TOKEN}");
        let mut stalled = Sse::over(
            Box::new(sse::small_buffer_conn(addr, 4096)),
            &addr.to_string(),
            "/api/events?kinds=bus",
            &[("Authorization", &auth)],
        );
        assert_eq!(stalled.status, 200);
        stalled.until("ready");
        // 20 MB: more than the socket's buffers hold (a few MB), so the queue is full when
        // the stream is stopped.
        let output = "s".repeat(10_000);
        for _ in 0..N {
            while tool_call(&hooks, &output) != Emit::Queued {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let stats = || server.event_stats();
        wait_for("the hub to number every event", || stats().items == N);
        assert!(stats().dropped_client > 0, "the queue was full");
        // The stream is stopped while its queue is full; the client reads only afterwards.
        let stopping = {
            let hooks = hooks.clone();
            std::thread::spawn(move || {
                let mut server = server;
                if by_server {
                    server.shutdown(Duration::from_secs(60));
                } else {
                    hooks.shutdown(Duration::from_secs(5));
                }
                server
            })
        };
        let (got, told, last) = read_to_the_end(&mut stalled);
        let server = stopping.join().unwrap();
        let how = if by_server {
            "Server::shutdown"
        } else {
            "Hooks::shutdown"
        };
        assert_eq!(
            last.event, "shutdown",
            "{how}: the last event is not shutdown but {:?} (id {:?})",
            last.event, last.id
        );
        assert_eq!(
            got + told,
            N,
            "{how}: {got} received + {told} announced lost != {N} sent"
        );
        assert_eq!(server.event_stats().dropped_client, told, "{how}");
    }
}

#[test]
fn a_pattern_alone_asks_for_bus_messages_and_kinds_widen_it() {
    let hooks_json = r#"{"hooks": {"tool_call": [{"id": "t", "command": "/bin/true"}]}}"#;
    let api = Api::start(Some(hooks_json), |o| {
        o.events(EventStreamOptions::default().record_always(true))
    });
    tool_call(&api.hooks, "p");
    // The bus message and the hook's run are both in the backlog.
    wait_for("the message and the run", || {
        api.event_stats()["items"].as_u64() == Some(2)
    });
    let names = |evs: &[Ev]| evs.iter().map(|e| e.event.clone()).collect::<Vec<_>>();
    let (_, replay, ready) = api.stream("?pattern=prx.lifecycle.*&backlog=10", &[]);
    assert_eq!(ready.json()["kinds"], json!(["bus"]), "{}", ready.data);
    assert_eq!(names(&replay), ["prx.lifecycle.tool_call"]);
    let (_, replay, ready) = api.stream("?pattern=prx.lifecycle.*&kinds=bus,runs&backlog=10", &[]);
    assert_eq!(ready.json()["kinds"], json!(["bus", "runs"]));
    assert_eq!(names(&replay), ["prx.lifecycle.tool_call", "run"]);
    let (_, replay, ready) = api.stream("?backlog=10", &[]);
    assert_eq!(ready.json()["kinds"], json!(["bus", "runs", "plugins"]));
    assert_eq!(names(&replay), ["prx.lifecycle.tool_call", "run"]);
    // A pattern that matches nothing still leaves runs out.
    let (_, replay, _) = api.stream("?pattern=myapp.*&backlog=10", &[]);
    assert!(replay.is_empty(), "{replay:?}");
}

#[test]
fn last_event_ids_are_an_instance_a_dash_and_digits_nothing_else() {
    let api = Api::start(None, |o| o);
    let (_s, _, ready) = api.stream("?kinds=bus", &[]);
    let inst = ready.json()["instance"].as_str().unwrap().to_string();
    for i in 0..3 {
        tool_call(&api.hooks, &format!("e{i}"));
    }
    wait_for("three items", || {
        api.event_stats()["items"].as_u64() == Some(3)
    });
    let auth = format!("Bearer {TOKEN}");
    let open = |id: &str, by_query: bool| {
        let (path, headers): (String, Vec<(&str, &str)>) = if by_query {
            let q = percent_encoding::utf8_percent_encode(id, percent_encoding::NON_ALPHANUMERIC);
            (
                format!("/api/events?kinds=bus&last_event_id={q}"),
                vec![("Authorization", auth.as_str()), ("Connection", "close")],
            )
        } else {
            (
                "/api/events?kinds=bus".to_string(),
                vec![
                    ("Authorization", auth.as_str()),
                    ("Connection", "close"),
                    ("Last-Event-ID", id),
                ],
            )
        };
        Sse::open(api.addr(), &path, &headers)
    };
    // Ours: the replay starts after the position given.
    for (id, replayed) in [
        (format!("{inst}-2"), 1),
        (format!("{inst}-0"), 3),
        (format!("{inst}-3"), 0),
    ] {
        for by_query in [false, true] {
            let mut s = open(&id, by_query);
            assert_eq!(s.status, 200, "{id:?}");
            let (_, ready) = s.until("ready");
            assert_eq!(ready.json()["replayed"], replayed, "{id:?}");
        }
    }
    // The largest position is still an id (one this stream never sent: a gap).
    let mut s = open(&format!("{inst}-18446744073709551615"), false);
    assert_eq!(s.status, 200);
    assert_eq!(s.event().unwrap().json()["reason"], "unknown_id");
    for n in [
        "+3",
        "+0",
        "-3",
        " 3",
        "3 x",
        "03",
        "00",
        "3.0",
        "0x3",
        "3e0",
        "18446744073709551616",
        "",
        "\u{ff13}",
    ] {
        let id = format!("{inst}-{n}");
        for by_query in [false, true] {
            if !by_query && !n.is_ascii() {
                continue; // a header is ASCII (the not-ASCII refusal is tested elsewhere)
            }
            let s = open(&id, by_query);
            assert_eq!(s.status, 400, "{id:?} (query: {by_query})");
            let text = s.text();
            assert!(text.contains("<instance>-<n>"), "{id:?}: {text}");
        }
    }
}
