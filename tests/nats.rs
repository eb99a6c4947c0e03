//! The NATS bridge against a real nats-server on loopback (ARCHITECTURE.md § NATS bridge).
//! Each test starts its own server (JetStream on, a temporary store, a free port) and kills it;
//! without nats-server installed they fail with `apt-get install -y nats-server`.
//!
//! Sizes scale with `PRX_HOOKS_NATS_EVENTS` (default 100,000: the two-process test) and
//! `PRX_HOOKS_NATS_KILL_EVENTS` (default 25,000: the kill tests, emitted over ~5 s).

#[path = "support/nats.rs"]
mod nats_support;

#[path = "nats/fleet.rs"]
mod fleet;

#[path = "nats/partitions.rs"]
mod partitions;

#[path = "nats/leases.rs"]
mod leases;

#[path = "nats/idempotency.rs"]
mod idempotency;

#[path = "support/plugins.rs"]
mod plugins_support;

#[path = "nats/plugins.rs"]
mod plugins;

use nats_support::{Client, Gate, NatsServer};
use prx_hooks::nats::{ConsumeOptions, NatsOptions, PublishOptions};
use prx_hooks::{Event, Hooks};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// (name, value) pairs of a message a test publishes.
type Headers<'a> = &'a [(&'a str, &'a str)];

fn env_n(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One message as a subscriber saw it.
#[derive(Clone, Debug)]
struct Got {
    subject: String,
    headers: HashMap<String, String>,
    body: String,
}

/// A subscriber collecting everything on `subject` (its own thread and runtime).
struct Collector {
    got: Arc<Mutex<Vec<Got>>>,
    client: Client,
}

impl Collector {
    fn start(url: &str, subject: &str) -> Collector {
        let client = Client::connect(url);
        let mut sub = client
            .rt
            .block_on(client.client.subscribe(subject.to_string()))
            .unwrap();
        client.sync();
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let g = got.clone();
        client.rt.spawn(async move {
            use futures_util::StreamExt;
            while let Some(m) = sub.next().await {
                let headers = m
                    .headers
                    .iter()
                    .flat_map(|h| h.iter())
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            v.first()
                                .map(|v| v.as_str().to_string())
                                .unwrap_or_default(),
                        )
                    })
                    .collect();
                g.lock().unwrap().push(Got {
                    subject: m.subject.to_string(),
                    headers,
                    body: String::from_utf8_lossy(&m.payload).into_owned(),
                });
            }
        });
        Collector { got, client }
    }

    fn len(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    fn all(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `n` messages arrived, or nothing new came for `quiet`.
    fn wait_for(&self, n: usize, quiet: Duration) -> Vec<Got> {
        let mut last = (self.len(), Instant::now());
        loop {
            let len = self.len();
            if len >= n {
                return self.all();
            }
            if len != last.0 {
                last = (len, Instant::now());
            } else if last.1.elapsed() > quiet {
                return self.all();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
}

/// The last line of stderr: `run`'s report.
fn report(stderr: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stderr);
    let last = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("{}");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn tool_call_line(agent: &str, i: usize) -> String {
    format!(
        r#"{{"event":"tool_call","agent":"{agent}","session":"s","payload":{{"tool":"t","success":true,"output":"{i}"}}}}"#
    )
}

/// Per agent, the `Prx-Seq` of every message in arrival order, and whether ids were unique.
fn check_complete_and_ordered(got: &[Got], agents: &[&str], per_agent: usize) {
    let mut seqs: HashMap<&str, Vec<u64>> = HashMap::new();
    let mut ids = HashSet::new();
    for g in got {
        let id = g.headers["Nats-Msg-Id"].clone();
        assert!(ids.insert(id.clone()), "{id} arrived twice");
        let agent = agents
            .iter()
            .find(|a| **a == g.headers["Prx-Agent"])
            .unwrap_or_else(|| panic!("{g:?}"));
        seqs.entry(agent)
            .or_default()
            .push(g.headers["Prx-Seq"].parse().unwrap());
    }
    for a in agents {
        let s = &seqs[a];
        assert_eq!(
            s.len(),
            per_agent,
            "{a}: {} of {per_agent} arrived",
            s.len()
        );
        let expected: Vec<u64> = (0..per_agent as u64).collect();
        assert!(*s == expected, "{a}: out of order or with gaps");
    }
}

#[test]
fn a_hundred_thousand_events_from_two_agent_processes_arrive_complete_and_in_order() {
    let n = env_n("PRX_HOOKS_NATS_EVENTS", 100_000) / 2 * 2;
    let server = NatsServer::start();
    let sub = Collector::start(&server.url(), "prx.lifecycle.>");
    let dir = tempfile::tempdir().unwrap();
    let agents = ["agent-a", "agent-b"];
    let children: Vec<Child> = agents
        .iter()
        .map(|agent| {
            let file = dir.path().join(format!("{agent}.ndjson"));
            let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
            for i in 0..n / 2 {
                writeln!(f, "{}", tool_call_line(agent, i)).unwrap();
            }
            f.flush().unwrap();
            bin()
                .args(["-q", "run", "--workspace"])
                .arg(dir.path())
                .arg("--events")
                .arg(&file)
                .args(["--nats", &server.url()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        let p = &report(&out.stderr)["stats"]["nats"]["publish"];
        assert_eq!(p["published"], (n / 2) as u64, "{p}");
        assert_eq!(p["dropped"], 0, "{p}");
        assert_eq!(p["buffered"], 0, "{p}");
        assert_eq!(p["offered"], (n / 2) as u64, "{p}");
    }
    let got = sub.wait_for(n, Duration::from_secs(30));
    assert_eq!(got.len(), n, "{} of {n} arrived", got.len());
    check_complete_and_ordered(&got, &agents, n / 2);
    // The wire format, on one message.
    let g = got.iter().find(|g| g.headers["Prx-Seq"] == "7").unwrap();
    assert_eq!(g.subject, "prx.lifecycle.tool_call");
    assert_eq!(g.body, r#"{"tool":"t","success":true,"output":"7"}"#);
    assert_eq!(g.headers["Prx-Event"], "tool_call");
    assert_eq!(g.headers["Prx-Session"], "s");
    let ts = &g.headers["Prx-Timestamp"];
    assert!(humantime::parse_rfc3339(ts).is_ok(), "{ts}");
    let (instance, counter) = g.headers["Nats-Msg-Id"].split_once('-').unwrap();
    assert_eq!(instance, g.headers["Prx-Origin"]);
    assert!(instance.len() == 16 && counter.parse::<u64>().is_ok());
    // Two processes: two instance ids.
    let origins: HashSet<_> = got
        .iter()
        .map(|g| g.headers["Prx-Origin"].clone())
        .collect();
    assert_eq!(origins.len(), 2);
}

/// Emits `n` tool_call events from two emitters, about `rate` a second, calling `at(i)` as it
/// goes (to kill the server mid-stream).
fn emit_paced(hooks: &Hooks, n: usize, rate: usize, mut at: impl FnMut(usize)) {
    let ems = [hooks.emitter("agent-a", "s"), hooks.emitter("agent-b", "s")];
    let start = Instant::now();
    for i in 0..n {
        at(i);
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let out = (i / 2).to_string();
        ems[i % 2].emit(Event::ToolCall {
            tool: "t",
            success: true,
            output: &out,
        });
    }
}

fn publish_stats(hooks: &Hooks) -> prx_hooks::nats::PublishStats {
    hooks
        .stats()
        .nats()
        .and_then(|n| n.publish.clone())
        .expect("a publisher")
}

fn wait_settled(hooks: &Hooks, n: u64) -> prx_hooks::nats::PublishStats {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = publish_stats(hooks);
        if p.published + p.failed + p.dropped >= n && p.buffered == 0 {
            return p;
        }
        assert!(Instant::now() < deadline, "not settled: {p:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn server_killed_for_two_seconds_with_jetstream_nothing_is_lost() {
    let n = env_n("PRX_HOOKS_NATS_KILL_EVENTS", 25_000) / 2 * 2;
    let mut server = NatsServer::start();
    let hooks = Hooks::builder()
        .nats_publish(PublishOptions::new(NatsOptions::new(server.url())).stream("KILLTEST"))
        .build()
        .unwrap();
    let mut killed = false;
    emit_paced(&hooks, n, 5_000, |i| {
        if i == n / 3 {
            // Mid-stream, with acks outstanding.
            server.kill();
            killed = true;
        }
        if killed && i == n / 3 + 10_000.min(n / 3) {
            server.restart();
        }
    });
    if killed && publish_stats(&hooks).reconnects == 0 {
        // Fewer events than the outage lasts: restart now.
        server.restart();
    }
    let p = wait_settled(&hooks, n as u64);
    hooks.shutdown(Duration::from_secs(5));
    assert_eq!(
        (p.dropped, p.failed, p.dropped_shutdown),
        (0, 0, 0),
        "{p:?}"
    );
    assert_eq!(p.published, n as u64, "{p:?}");
    assert!(p.reconnects >= 1, "{p:?}");
    // Read the stream back: every event once (JetStream dropped the retries by Nats-Msg-Id),
    // each agent's in order.
    let client = Client::connect(&server.url());
    let js = client.jetstream();
    let got: Vec<Got> = client.rt.block_on(async {
        use futures_util::StreamExt;
        let stream = js.get_stream("KILLTEST").await.unwrap();
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::Config {
                ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut msgs = consumer.messages().await.unwrap();
        let mut got = Vec::new();
        while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(3), msgs.next()).await
        {
            let headers = m
                .headers
                .iter()
                .flat_map(|h| h.iter())
                .map(|(k, v)| (k.to_string(), v[0].as_str().to_string()))
                .collect();
            got.push(Got {
                subject: m.subject.to_string(),
                headers,
                body: String::from_utf8_lossy(&m.payload).into_owned(),
            });
        }
        got
    });
    assert_eq!(
        got.len(),
        n,
        "the stream holds {} of {n} ({p:?})",
        got.len()
    );
    check_complete_and_ordered(&got, &["agent-a", "agent-b"], n / 2);
}

#[test]
fn server_killed_for_two_seconds_without_jetstream_losses_equal_the_drop_counter() {
    let n = env_n("PRX_HOOKS_NATS_KILL_EVENTS", 25_000) / 2 * 2;
    let mut server = NatsServer::start();
    // The subscriber reaches the server directly, the bridge through a gate: the gate is cut a
    // moment before the kill (so that what the dying server still held for the subscriber —
    // which no core NATS publisher can know of, docs/nats.md says so — does not blur the count) and
    // opened after the subscriber is back, as a core NATS subscriber must be to see anything.
    let gate = Gate::new(server.port);
    let sub = Collector::start(&server.url(), "prx.lifecycle.>");
    let buffer = 2_000;
    let hooks = Hooks::builder()
        .nats_publish(PublishOptions::new(NatsOptions::new(gate.url())).buffer(buffer))
        .build()
        .unwrap();
    let restart_at = n / 3 + 10_000.min(n / 3);
    let mut down = false;
    emit_paced(&hooks, n, 5_000, |i| {
        if i == n / 3 {
            gate.close();
            std::thread::sleep(Duration::from_millis(100));
            server.kill();
            down = true;
        }
        if down && i == restart_at {
            server.restart();
            sub.client.sync(); // the subscriber is subscribed again
            gate.open();
            down = false;
        }
    });
    if down {
        server.restart();
        sub.client.sync();
        gate.open();
    }
    let p = wait_settled(&hooks, n as u64);
    hooks.shutdown(Duration::from_secs(5));
    let got = sub.wait_for(usize::MAX, Duration::from_secs(2));
    let distinct: HashSet<String> = got
        .iter()
        .map(|g| g.headers["Nats-Msg-Id"].clone())
        .collect();
    let lost = n as u64 - distinct.len() as u64;
    assert!(
        p.dropped > 0,
        "the outage should overflow a {buffer}-message buffer: {p:?}"
    );
    assert_eq!(lost, p.dropped + p.dropped_shutdown, "{p:?}");
    assert_eq!(p.published + p.dropped, n as u64, "{p:?}");
    assert!(p.reconnects >= 1, "{p:?}");
    // What did arrive is in order per agent (repeats of a resent tail aside).
    for agent in ["agent-a", "agent-b"] {
        let mut seen = HashSet::new();
        let firsts: Vec<u64> = got
            .iter()
            .filter(|g| g.headers["Prx-Agent"] == agent)
            .filter(|g| seen.insert(g.headers["Nats-Msg-Id"].clone()))
            .map(|g| g.headers["Prx-Seq"].parse().unwrap())
            .collect();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{agent} out of order"
        );
    }
}

/// A workspace whose tool_call hook appends "<agent> <payload>" to `log`.
fn recording_workspace(dir: &Path) -> std::path::PathBuf {
    let log = dir.join("log");
    let script = format!(
        "read -r p; printf '%s %s\\n' \"$ZERO_HOOK_AGENT\" \"$p\" >> {}",
        log.display()
    );
    let hooks = sh_hook(
        "rec",
        &script,
        serde_json::json!({"stdin_json": true, "max_concurrent": 8}),
    );
    write_hooks(dir, &hooks);
    log
}

/// A hooks.json of one `tool_call` hook `id` running `/bin/sh -c script`, with `extra`'s
/// settings (`max_concurrent`, `timeout_ms`, …; `Value::Null`: none) beside them.
fn sh_hook(id: &str, script: &str, extra: Value) -> Value {
    let mut hook = serde_json::json!({"id": id, "command": "/bin/sh", "args": ["-c", script]});
    if let (Some(h), Value::Object(more)) = (hook.as_object_mut(), extra) {
        h.extend(more);
    }
    serde_json::json!({"hooks": {"tool_call": [hook]}})
}

/// Writes `hooks` as `dir`'s hooks.json.
fn write_hooks(dir: &Path, hooks: &Value) {
    std::fs::write(dir.join("hooks.json"), hooks.to_string()).unwrap();
}

fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Consumer {
    child: Child,
    stderr: std::path::PathBuf,
}

impl Consumer {
    fn start(ws: &Path, args: &[&str]) -> Consumer {
        let stderr = ws.join(format!("stderr-{}", nats_support::free_port()));
        let child = bin()
            .args(["run", "--workspace"])
            .arg(ws)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Consumer { child, stderr }
    }

    /// SIGTERM, wait, the report.
    fn stop(mut self) -> Value {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        let text = std::fs::read(&self.stderr).unwrap();
        assert!(
            status.code().is_some(),
            "{status:?}: {}",
            String::from_utf8_lossy(&text)
        );
        report(&text)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// Publishes a probe until the consumer's hook has run for it: the consumer is subscribed.
fn until_consuming(client: &Client, log: &Path, probe: &str) {
    let body = format!(r#"{{"tool":"probe","success":true,"output":"{probe}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log_lines(log).iter().any(|l| l.contains(probe)) {
        assert!(
            Instant::now() < deadline,
            "the consumer never ran the probe"
        );
        client.publish(
            "prx.lifecycle.tool_call",
            &[("Nats-Msg-Id", probe), ("Prx-Agent", "probe")],
            &body,
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How often each `m<N>` id's hook ran.
fn runs_per_id(log: &Path) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for l in log_lines(log) {
        if let Some(i) = l.find("\"output\":\"m") {
            let rest = &l[i + 10..];
            let id = &rest[..rest.find('"').unwrap()];
            *counts.entry(id.to_string()).or_default() += 1;
        }
    }
    counts
}

fn publish_ids(client: &Client, ids: impl Iterator<Item = usize>) {
    for i in ids {
        let id = format!("m{i}");
        let body = format!(r#"{{"tool":"t","success":true,"output":"{id}"}}"#);
        client.publish(
            "prx.lifecycle.tool_call",
            &[("Nats-Msg-Id", id.as_str()), ("Prx-Agent", "fleet-7")],
            &body,
        );
    }
    client.sync();
}

#[test]
fn consume_mode_runs_the_hook_once_per_message_id_also_after_a_restart() {
    let server = NatsServer::start();
    let ws = tempfile::tempdir().unwrap();
    let log = recording_workspace(ws.path());
    let client = Client::connect(&server.url());
    let url = server.url();
    let args = ["--from-nats", url.as_str()];
    let c = Consumer::start(ws.path(), &args);
    until_consuming(&client, &log, "probe-1");
    // Every id twice: a publisher retrying.
    publish_ids(&client, 0..200);
    publish_ids(&client, 0..200);
    wait_until("200 ids", 30, || runs_per_id(&log).len() == 200);
    let first = c.stop();
    let s = &first["stats"]["nats"]["consume"];
    assert!(s["duplicates"].as_u64().unwrap() >= 200, "{s}");
    // A new process: the persisted window still knows the old ids.
    let c = Consumer::start(ws.path(), &args);
    until_consuming(&client, &log, "probe-2");
    publish_ids(&client, (0..200).chain(200..300));
    wait_until("300 ids", 30, || runs_per_id(&log).len() == 300);
    std::thread::sleep(Duration::from_millis(500));
    let second = c.stop();
    let counts = runs_per_id(&log);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    let s = &second["stats"]["nats"]["consume"];
    assert_eq!(s["duplicates"], 200, "{s}");
    assert!(
        log_lines(&log)
            .iter()
            .all(|l| l.starts_with("fleet-7 ") || l.starts_with("probe ")),
        "Prx-Agent became ZERO_HOOK_AGENT"
    );
}

#[test]
fn consume_mode_with_a_durable_consumer_runs_each_id_once_across_a_restart() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    // A short duplicate window, so that a late duplicate is stored again and the consumer's
    // own window is what recognizes it.
    let _js = fleet::short_duplicate_window_stream(&client);
    let ws = tempfile::tempdir().unwrap();
    let log = recording_workspace(ws.path());
    // Published before any consumer exists: the durable consumer delivers them.
    publish_ids(&client, 0..300);
    let url = server.url();
    let args = ["--from-nats", url.as_str(), "--durable", "central"];
    let c = Consumer::start(ws.path(), &args);
    wait_until("some ids", 30, || runs_per_id(&log).len() >= 50);
    let first = c.stop(); // mid-stream, most likely
    let done_before = runs_per_id(&log).len();
    std::thread::sleep(Duration::from_millis(1200)); // past the stream's duplicate window
    publish_ids(&client, 0..50); // late duplicates, stored again by the stream
    publish_ids(&client, 300..350);
    let c = Consumer::start(ws.path(), &args);
    wait_until("350 ids", 60, || runs_per_id(&log).len() == 350);
    std::thread::sleep(Duration::from_millis(500));
    let second = c.stop();
    let counts = runs_per_id(&log);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "ran more than once: {twice:?}");
    let s1 = &first["stats"]["nats"]["consume"];
    let s2 = &second["stats"]["nats"]["consume"];
    assert_eq!(s1["durable"], "central");
    assert_eq!(s2["duplicates"], 50, "{s2}");
    assert!(
        s1["consumed"].as_u64().unwrap() >= done_before as u64,
        "{s1} {done_before}"
    );
    assert!(
        s2["acked"].as_u64().unwrap() >= 50 + 350 - done_before as u64,
        "{s2}"
    );
}

/// A server, a recording workspace and a core consumer of it that has run `probe`.
fn core_consumer(
    probe: &str,
) -> (
    NatsServer,
    tempfile::TempDir,
    std::path::PathBuf,
    Client,
    Consumer,
) {
    let server = NatsServer::start();
    let ws = tempfile::tempdir().unwrap();
    let log = recording_workspace(ws.path());
    let client = Client::connect(&server.url());
    let c = Consumer::start(ws.path(), &["--from-nats", &server.url()]);
    until_consuming(&client, &log, probe);
    (server, ws, log, client, c)
}

#[test]
fn consumed_headers_and_bodies_are_checked_and_nothing_bad_is_fatal() {
    let (_server, _ws, log, client, c) = core_consumer("probe-h");
    let good = r#"{"tool":"t","success":true,"output":"ok"}"#;
    let long = "a".repeat(300);
    let refused: &[(&str, Headers, &str)] = &[
        (
            "prx.lifecycle.tool_call",
            &[("Prx-Agent", "evil%00agent")],
            good,
        ),
        (
            "prx.lifecycle.tool_call",
            &[("Prx-Agent", "evil%1b[31m")],
            good,
        ),
        (
            "prx.lifecycle.tool_call",
            &[("Prx-Session", long.as_str())],
            good,
        ),
        ("prx.lifecycle.tool_call", &[("Prx-Agent", "")], good),
        ("prx.lifecycle.tool_call", &[("Prx-Event", "error")], good),
        ("prx.lifecycle.nope", &[], good),
        ("prx.lifecycle.tool_call", &[], r#"{"tool":1}"#),
        ("prx.lifecycle.tool_call", &[], "not json"),
    ];
    for (subject, headers, body) in refused {
        client.publish(subject, headers, body);
    }
    // Headers are optional; extra payload fields are kept.
    client.publish(
        "prx.lifecycle.tool_call",
        &[],
        r#"{"tool":"t","success":true,"output":"m-plain","model":"x-1"}"#,
    );
    client.publish(
        "prx.lifecycle.tool_call",
        &[("Prx-Agent", "caf%C3%A9 100%25")],
        r#"{"tool":"t","success":true,"output":"m-encoded"}"#,
    );
    client.sync();
    wait_until("the two good messages", 20, || {
        let l = log_lines(&log);
        l.iter().any(|l| l.contains("m-plain")) && l.iter().any(|l| l.contains("m-encoded"))
    });
    let lines = log_lines(&log);
    let plain = lines.iter().find(|l| l.contains("m-plain")).unwrap();
    assert!(plain.starts_with("nats "), "the default agent: {plain}");
    assert!(
        plain.ends_with(r#""output":"m-plain","model":"x-1"}"#),
        "{plain}"
    );
    let enc = lines.iter().find(|l| l.contains("m-encoded")).unwrap();
    assert!(enc.starts_with("café 100% "), "{enc}");
    assert!(!lines.iter().any(|l| l.contains("evil")), "{lines:?}");
    assert_eq!(lines.len(), 3, "the probe and the two good ones: {lines:?}");
    let stderr = c.stderr();
    let report = c.stop();
    let s = &report["stats"]["nats"]["consume"];
    assert_eq!(s["refused_headers"], 5, "{s}");
    assert_eq!(s["refused_subject"], 1, "{s}");
    assert_eq!(s["refused_body"], 2, "{s}");
    assert!(s["without_id"].as_u64().unwrap() >= 2, "{s}");
    assert!(stderr.contains("refused"), "said on stderr: {stderr}");
    // A logged control character is escaped, never written raw to the terminal.
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}

#[test]
fn publishing_and_consuming_overlapping_subjects_is_refused_and_a_relay_is_not() {
    let server = NatsServer::start();
    let ws = tempfile::tempdir().unwrap();
    let url = server.url();
    let out = bin()
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--nats", &url, "--from-nats", &url])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("overlap") && stderr.contains("--nats-prefix"),
        "{stderr}"
    );
    // Consuming the fleet and publishing under a prefix: a relay, no loop.
    let log = recording_workspace(ws.path());
    let relay_sub = Collector::start(&url, "central.prx.lifecycle.>");
    let c = Consumer::start(
        ws.path(),
        &[
            "--from-nats",
            &url,
            "--nats",
            &url,
            "--nats-prefix",
            "central",
        ],
    );
    let client = Client::connect(&url);
    until_consuming(&client, &log, "probe-r");
    publish_ids(&client, 0..10);
    let got = relay_sub.wait_for(11, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    let report = c.stop();
    // Each consumed event relayed once, never consumed again.
    assert!(got.len() >= 11, "{}", got.len());
    let counts = runs_per_id(&log);
    assert_eq!(counts.len(), 10);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    assert_eq!(
        relay_sub.len(),
        got.len(),
        "no loop: nothing more was relayed"
    );
    assert_eq!(report["stats"]["nats"]["consume"]["own"], 0);
}

#[test]
fn a_process_never_consumes_what_it_published() {
    // Two pipelines in one process on overlapping subjects (the library does not refuse
    // this: they are separate Hooks): the consumer skips the publisher's messages.
    let server = NatsServer::start();
    let publisher = Hooks::builder()
        .nats_publish(PublishOptions::new(NatsOptions::new(server.url())))
        .build()
        .unwrap();
    let consumer = Hooks::builder()
        .nats_consume(ConsumeOptions::new(NatsOptions::new(server.url())))
        .build()
        .unwrap();
    let sub = consumer.bus().subscribe("prx.lifecycle.*").unwrap();
    // Wait until the consumer is subscribed: a plain client's message comes through.
    let client = Client::connect(&server.url());
    wait_until("the consumer", 20, || {
        client.publish(
            "prx.lifecycle.turn_complete",
            &[(
                "Nats-Msg-Id",
                format!("p{}", nats_support::free_port()).as_str(),
            )],
            "{}",
        );
        sub.recv_timeout(Duration::from_millis(200)).is_ok()
    });
    while sub.try_recv().is_ok() {}
    let em = publisher.emitter("a", "s");
    for _ in 0..100 {
        em.emit(Event::TurnComplete);
    }
    wait_until("100 published", 20, || {
        publish_stats(&publisher).published == 100
    });
    wait_until("100 skipped", 20, || {
        consumer
            .stats()
            .nats()
            .and_then(|n| n.consume.clone())
            .is_some_and(|c| c.own == 100)
    });
    assert!(
        sub.try_recv().is_err(),
        "an own message reached the pipeline"
    );
}

#[test]
fn a_remote_server_without_credentials_is_refused_before_connecting() {
    let ws = tempfile::tempdir().unwrap();
    // TEST-NET-1: never reached (the refusal comes first).
    let out = bin()
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--from-nats", "nats://192.0.2.1:4222"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("refusing to consume from nats://192.0.2.1:4222")
            && stderr.contains("--nats-insecure")
            && stderr.contains("--nats-creds"),
        "{stderr}"
    );
}

/// `run --events FILE ARGS…` in `ws` at `RUST_LOG=trace`, to the end.
fn run_events(ws: &Path, events: &Path, args: &[&str]) -> std::process::Output {
    bin()
        .env("RUST_LOG", "trace")
        .args(["run", "--workspace"])
        .arg(ws)
        .arg("--events")
        .arg(events)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn credentials_are_used_and_never_logged() {
    let server = NatsServer::start_with(&["--user", "alice", "--pass", "s3cret-pw"]);
    let ws = tempfile::tempdir().unwrap();
    let events = ws.path().join("e.ndjson");
    std::fs::write(&events, tool_call_line("a", 1) + "\n").unwrap();
    let url = format!("nats://alice:s3cret-pw@127.0.0.1:{}", server.port);
    let sub = Collector::start(&url, "prx.lifecycle.>");
    let out = run_events(ws.path(), &events, &["--nats", &url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("s3cret"),
        "the password was logged: {stderr}"
    );
    let p = &report(&out.stderr)["stats"]["nats"]["publish"];
    assert_eq!(
        p["server"],
        format!("nats://alice:***@127.0.0.1:{}", server.port)
    );
    assert_eq!(p["published"], 1, "{p}");
    assert_eq!(sub.wait_for(1, Duration::from_secs(10)).len(), 1);
    // A wrong password: refused by the server, still never logged.
    let bad = format!("nats://alice:wrong-pw@127.0.0.1:{}", server.port);
    let out = run_events(
        ws.path(),
        &events,
        &["--nats", &bad, "--drain-timeout", "1s"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("wrong-pw"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "the event was lost: {stderr}");
}

// ---- the adversarial review: each test below failed on the code before its fix ----

/// A recording workspace whose hook also logs the message id it ran for (`ZERO_HOOK_*`
/// carries no id: the body's `output` is the id the tests publish).
fn runs_of(log: &Path, output: &str) -> usize {
    log_lines(log)
        .iter()
        .filter(|l| l.contains(&format!("\"output\":\"{output}\"")))
        .count()
}

/// Publishes `probe` on `subject` until `log` shows the hook ran for it.
fn until_ran(client: &Client, subject: &str, log: &Path, probe: &str) {
    let body = format!(r#"{{"tool":"probe","success":true,"output":"{probe}"}}"#);
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs_of(log, probe) == 0 {
        assert!(Instant::now() < deadline, "{probe} never ran");
        client.publish(subject, &[("Nats-Msg-Id", probe)], &body);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Item 1: host A relays b.* to a.*, host B relays a.* to b.*: each event crosses each host at
/// most once (origin and id kept, `Prx-Hops` counted), and a message past the hop limit is
/// refused (`loops`).
#[test]
fn two_relaying_hosts_do_not_ping_pong_an_event() {
    let server = NatsServer::start();
    let url = server.url();
    let (wa, wb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (la, lb) = (
        recording_workspace(wa.path()),
        recording_workspace(wb.path()),
    );
    let a = Consumer::start(
        wa.path(),
        &[
            "--nats",
            &url,
            "--nats-prefix",
            "a",
            "--from-nats",
            &url,
            "--subject",
            "b.prx.lifecycle.>",
        ],
    );
    let b = Consumer::start(
        wb.path(),
        &[
            "--nats",
            &url,
            "--nats-prefix",
            "b",
            "--from-nats",
            &url,
            "--subject",
            "a.prx.lifecycle.>",
        ],
    );
    let client = Client::connect(&url);
    until_ran(&client, "a.prx.lifecycle.tool_call", &lb, "probe-b");
    until_ran(&client, "b.prx.lifecycle.tool_call", &la, "probe-a");
    std::thread::sleep(Duration::from_secs(1));
    let all = Collector::start(&url, "*.prx.lifecycle.tool_call");
    let body = |o: &str| format!(r#"{{"tool":"t","success":true,"output":"{o}"}}"#);
    // With an id, without an origin.
    client.publish(
        "a.prx.lifecycle.tool_call",
        &[("Nats-Msg-Id", "loop-1")],
        &body("loop-1"),
    );
    // Nothing at all.
    client.publish("a.prx.lifecycle.tool_call", &[], &body("loop-2"));
    // A foreign origin and no id: the first relay's id is in its window.
    client.publish(
        "a.prx.lifecycle.tool_call",
        &[("Prx-Origin", "0123456789abcdef")],
        &body("loop-3"),
    );
    // Past the hop limit: refused, counted as a loop.
    client.publish(
        "a.prx.lifecycle.tool_call",
        &[("Nats-Msg-Id", "loop-4"), ("Prx-Hops", "99")],
        &body("loop-4"),
    );
    client.sync();
    std::thread::sleep(Duration::from_secs(4));
    let seen = all.len();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(all.len(), seen, "still relaying after 4 s: a loop");
    let got = all.all();
    let count = |o: &str| got.iter().filter(|g| g.body.contains(o)).count();
    // loop-1 and loop-2: published, relayed by B, relayed by A, skipped by B.
    assert!(count("\"loop-1\"") <= 3, "{}", count("\"loop-1\""));
    assert!(count("\"loop-2\"") <= 3, "{}", count("\"loop-2\""));
    assert!(count("\"loop-3\"") <= 3, "{}", count("\"loop-3\""));
    assert_eq!(count("\"loop-4\""), 1, "loop-4 is never relayed");
    assert_eq!(runs_of(&lb, "loop-4"), 0, "loop-4 never runs a hook");
    for o in ["loop-1", "loop-2", "loop-3"] {
        assert_eq!(runs_of(&la, o), 1, "{o} on A");
        assert_eq!(runs_of(&lb, o), 1, "{o} on B");
    }
    // The relayed copy keeps the first publisher's id and counts its hops.
    let relayed = got
        .iter()
        .find(|g| g.subject.starts_with("b.") && g.body.contains("\"loop-1\""))
        .expect("B relayed loop-1");
    assert_eq!(relayed.headers["Nats-Msg-Id"], "loop-1", "{relayed:?}");
    assert_eq!(relayed.headers["Prx-Hops"], "1", "{relayed:?}");
    let ra = a.stop();
    let rb = b.stop();
    let loops = ra["stats"]["nats"]["consume"]["loops"].as_u64().unwrap()
        + rb["stats"]["nats"]["consume"]["loops"].as_u64().unwrap();
    assert_eq!(loops, 1, "loop-4 refused once at the hop limit: {ra} {rb}");
}

/// A stream FLEET holding `prx.lifecycle.>`.
fn fleet_stream(client: &Client) {
    let config = async_nats::jetstream::stream::Config {
        name: "FLEET".into(),
        subjects: vec!["prx.lifecycle.>".into()],
        ..Default::default()
    };
    client
        .rt
        .block_on(client.jetstream().create_stream(config))
        .unwrap();
}

/// Sends one HPUB with raw header bytes (what a non-Rust client may send).
fn raw_hpub(port: u16, subject: &str, header: &[u8], body: &[u8]) {
    use std::io::{BufRead, BufReader};
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let mut w = s;
    w.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true}\r\n")
        .unwrap();
    let mut h = b"NATS/1.0\r\n".to_vec();
    h.extend_from_slice(header);
    h.extend_from_slice(b"\r\n\r\n");
    let mut msg = format!("HPUB {subject} {} {}\r\n", h.len(), h.len() + body.len()).into_bytes();
    msg.extend_from_slice(&h);
    msg.extend_from_slice(body);
    msg.extend_from_slice(b"\r\nPING\r\n");
    w.write_all(&msg).unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("PONG"), "{line}");
}

/// Item 2: a raw non-UTF-8 header byte makes async-nats drop the connection; with a durable
/// consumer JetStream gives up on it after `--nats-max-deliver` deliveries (counted as
/// `given_up`) and the messages behind it are consumed.
#[test]
fn a_message_async_nats_cannot_parse_stalls_a_durable_consumer_only_for_a_bounded_time() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    fleet_stream(&client);
    let body = br#"{"tool":"t","success":true,"output":"bad"}"#;
    raw_hpub(
        server.port,
        "prx.lifecycle.tool_call",
        b"Prx-Agent: caf\xe9",
        body,
    );
    publish_ids(&client, 0..20);
    let ws = tempfile::tempdir().unwrap();
    let log = recording_workspace(ws.path());
    let url = server.url();
    let c = Consumer::start(
        ws.path(),
        &[
            "--from-nats",
            &url,
            "--durable",
            "central",
            "--nats-max-deliver",
            "2",
        ],
    );
    // Behind it within about one ack wait (the consumer pulls one at a time after the lost
    // connection, so the poison message comes alone).
    wait_until("the 20 valid messages", 60, || {
        runs_per_id(&log).len() == 20
    });
    // JetStream gives up at its third delivery (`--nats-max-deliver 2`): the advisory, said.
    wait_until("the MAX_DELIVERIES advisory", 60, || {
        c.stderr().contains("JetStream gave up on stream message 1")
    });
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    assert_eq!(s["given_up"], 1, "{s}");
    assert_eq!(s["consumed"], 20, "{s}");
}

/// Item 3: empty credentials are no credentials, and a remote server that requires no
/// authentication is refused after connecting (its INFO says so), unless --nats-insecure.
#[test]
fn a_remote_server_that_requires_no_credentials_is_refused() {
    // This machine's address on its default route (connecting a UDP socket sends nothing).
    let addr = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").map(|()| u))
        .and_then(|u| u.local_addr())
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .map(|ip| ip.to_string());
    let Some(addr) = addr else {
        eprintln!(
            "SKIPPED LOUDLY: a_remote_server_that_requires_no_credentials_is_refused needs a non-loopback IPv4 address on this machine and found none"
        );
        return;
    };
    let server = NatsServer::start_on(&addr, &[]);
    let ws = tempfile::tempdir().unwrap();
    let run = |url: &str, insecure: bool| {
        let mut cmd = bin();
        cmd.args(["run", "--workspace"])
            .arg(ws.path())
            .args(["--from-nats", url])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if insecure {
            cmd.arg("--nats-insecure");
        }
        let mut child = cmd.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(if insecure { 4 } else { 15 });
        loop {
            if let Some(_status) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                return (
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                return (None, String::from_utf8_lossy(&out.stderr).into_owned());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let port = server.port;
    for url in [
        format!("nats://@{addr}:{port}"),
        format!("nats://:@{addr}:{port}"),
        format!("nats://alice:pw@{addr}:{port}"),
        format!("nats://tok@{addr}:{port}"),
    ] {
        let (code, stderr) = run(&url, false);
        assert_eq!(code, Some(2), "{url}: kept consuming: {stderr}");
        assert!(
            stderr.contains("refusing to consume") && stderr.contains("--nats-insecure"),
            "{url}: {stderr}"
        );
        assert!(
            !stderr.contains("pw@") && !stderr.contains("tok@"),
            "{stderr}"
        );
    }
    // --nats-insecure accepts it (it runs until stopped).
    let (code, stderr) = run(&format!("nats://{addr}:{port}"), true);
    assert_eq!(code, None, "exited: {stderr}");
}

/// Item 4: a comma inside a password never reaches a message, malformed or not; %2C is how
/// a comma is written, and it works.
#[test]
fn a_comma_in_a_password_is_never_shown_and_percent_encoded_it_works() {
    let ws = tempfile::tempdir().unwrap();
    for url in [
        // The reviewer's: read as two servers, the second's "port" was the password.
        "nats://alice:Hunter2,Secret@127.0.0.1:0",
        "nats://alice:Hunter2,Secret@127.0.0.1:x",
        "nats://alice:Hunter2@Secret@[::1",
        "http://alice:Hunter2,Secret@h:1",
    ] {
        let out = bin()
            .args(["run", "--workspace"])
            .arg(ws.path())
            .args(["--from-nats", url])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(
            !stderr.contains("Hunter2") && !stderr.contains("Secret"),
            "{url}: leaked: {stderr}"
        );
    }
    let server = NatsServer::start_with(&["--user", "alice", "--pass", "Hunter2,Secret"]);
    let events = ws.path().join("e.ndjson");
    std::fs::write(&events, tool_call_line("a", 1) + "\n").unwrap();
    // %2C is how a comma is written; a raw one is read as part of the password too.
    for pass in ["Hunter2%2CSecret", "Hunter2,Secret"] {
        let url = format!("nats://alice:{pass}@127.0.0.1:{}", server.port);
        let out = run_events(ws.path(), &events, &["--nats", &url]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{pass}: {stderr}");
        let p = &report(&out.stderr)["stats"]["nats"]["publish"];
        assert_eq!(p["published"], 1, "{pass}: {p}");
        assert_eq!(
            p["server"],
            format!("nats://alice:***@127.0.0.1:{}", server.port)
        );
        assert!(
            !stderr.contains("Hunter2") && !stderr.contains("Secret"),
            "{stderr}"
        );
    }
}

/// Item 5: a publish target that is down does not stop the consumer: the publisher's own
/// queue drops (counted), intake goes on.
#[test]
fn a_down_publish_target_does_not_stop_the_consumer() {
    let n = env_n("PRX_HOOKS_NATS_RELAY_EVENTS", 5_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    fleet_stream(&client);
    for i in 0..n {
        let id = format!("d{i}");
        client.publish(
            "prx.lifecycle.turn_complete",
            &[("Nats-Msg-Id", id.as_str())],
            "{}",
        );
    }
    client.sync();
    let ws = tempfile::tempdir().unwrap();
    let url = server.url();
    let c = Consumer::start(
        ws.path(),
        &[
            "--from-nats",
            &url,
            "--durable",
            "central",
            "--nats",
            "nats://127.0.0.1:1",
            "--nats-prefix",
            "relay",
            "--nats-buffer",
            "1000",
        ],
    );
    let js = client.jetstream();
    wait_until("everything consumed (acked)", 60, || {
        client
            .rt
            .block_on(async {
                let s = js.get_stream("FLEET").await.ok()?;
                let mut c: async_nats::jetstream::consumer::PullConsumer =
                    s.get_consumer("central").await.ok()?;
                c.info().await.ok().map(|i| i.ack_floor.stream_sequence)
            })
            .is_some_and(|floor| floor >= n as u64)
    });
    let r = c.stop();
    let s = &r["stats"]["nats"];
    assert_eq!(s["consume"]["consumed"], n as u64, "{s}");
    assert!(s["publish"]["dropped"].as_u64().unwrap() > 0, "{s}");
}

/// Item 6: --nats-stream names the publisher's stream even with --from-nats.
#[test]
fn nats_stream_names_the_publishers_stream_also_when_consuming() {
    let server = NatsServer::start();
    let url = server.url();
    let ws = tempfile::tempdir().unwrap();
    let events = ws.path().join("e.ndjson");
    std::fs::write(&events, tool_call_line("a", 1) + "\n").unwrap();
    let c = Consumer::start(
        ws.path(),
        &[
            "--events",
            events.to_str().unwrap(),
            "--nats",
            &url,
            "--nats-prefix",
            "relay",
            "--nats-stream",
            "RELAY",
            "--from-nats",
            &url,
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    let r = c.stop();
    let p = &r["stats"]["nats"]["publish"];
    assert_eq!(p["stream"], "RELAY", "{p}");
    assert_eq!(p["acked"], 1, "{p}");
}

/// Item 7: the de-dup window's temporary file never follows a planted symlink, and the
/// directories it creates are 0700.
#[test]
fn the_dedup_window_never_follows_a_planted_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let server = NatsServer::start();
    let url = server.url();
    let ws = tempfile::tempdir().unwrap();
    let victim = ws.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let dir = ws.path().join(".prx-hooks").join("nats-dedup");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(
        ws.path().join(".prx-hooks"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    for name in ["core.prx.lifecycle.tmp", "core.prx.lifecycle.rest.tmp"] {
        std::os::unix::fs::symlink(&victim, dir.join(name)).unwrap();
    }
    let c = Consumer::start(ws.path(), &["--from-nats", &url]);
    std::thread::sleep(Duration::from_secs(2));
    let stderr = c.stderr();
    c.stop();
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious\n",
        "{stderr}"
    );
    // A fresh workspace: the directories are created 0700.
    let ws2 = tempfile::tempdir().unwrap();
    let c = Consumer::start(ws2.path(), &["--from-nats", &url]);
    std::thread::sleep(Duration::from_secs(2));
    c.stop();
    for d in [".prx-hooks", ".prx-hooks/nats-dedup"] {
        let mode = std::fs::metadata(ws2.path().join(d))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{d}");
    }
}

/// Item 8: a pre-sent `Nats-Msg-Id` does not suppress the real event: the same id with a
/// different body is processed and counted as `id_conflicts`.
#[test]
fn a_forged_message_id_does_not_suppress_the_real_event() {
    let (_server, _ws, log, client, c) = core_consumer("probe-f");
    let body = |o: &str| format!(r#"{{"tool":"t","success":true,"output":"{o}"}}"#);
    client.publish(
        "prx.lifecycle.tool_call",
        &[("Nats-Msg-Id", "abc-1")],
        &body("forged"),
    );
    client.publish(
        "prx.lifecycle.tool_call",
        &[("Nats-Msg-Id", "abc-1")],
        &body("real"),
    );
    // A true duplicate is still one.
    client.publish(
        "prx.lifecycle.tool_call",
        &[("Nats-Msg-Id", "abc-1")],
        &body("real"),
    );
    client.sync();
    wait_until("the real event", 10, || runs_of(&log, "real") == 1);
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    assert_eq!(runs_of(&log, "real"), 1, "the true duplicate is skipped");
    assert_eq!(runs_of(&log, "forged"), 1);
    assert_eq!(s["id_conflicts"], 1, "{s}");
    assert!(s["duplicates"].as_u64().unwrap() >= 1, "{s}");
}

/// `run`'s NATS options say a note with `eprintln!`, which panics on a closed stderr (a pipe
/// whose reader is gone): `run` died with 101 and no word instead of its usage answer (2).
/// No NATS server is needed: the flags are refused before any connection.
#[test]
fn run_with_a_closed_stderr_answers_a_nats_usage_error_with_2_not_a_panic() {
    let ws = tempfile::tempdir().unwrap();
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let status = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args([
            "--from-nats",
            "nats://127.0.0.1:1",
            "--nats",
            "nats://127.0.0.1:1",
            "--nats-stream",
            "S",
            "--durable",
            "D",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2), "{status:?}");
}

/// An event `prx-hooks send` kept in the spool is published, when the next `run` replays it,
/// under the id it was first sent with (its entry's id and line: the `Nats-Msg-Id`, so a
/// second delivery of it is a duplicate to JetStream too) and at the time it happened (its
/// entry's time: the `Prx-Timestamp`), not the replay's.
#[test]
fn a_spooled_events_id_and_time_are_its_nats_msg_id_and_prx_timestamp() {
    let server = NatsServer::start();
    let sub = Collector::start(&server.url(), "prx.lifecycle.>");
    let ws = tempfile::tempdir().unwrap();
    let spool = ws.path().join(".prx-hooks/spool");
    std::fs::create_dir_all(&spool).unwrap();
    for d in [ws.path().join(".prx-hooks"), spool.clone()] {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    }
    let header = r#"{"route":"events","id":"sent-7f3a","time":"2026-12-07T10:00:00.000001Z"}"#;
    std::fs::write(
        spool.join("01000000000000000000-0000000001.spool"),
        format!(
            "{header}\n{}\n{}\n",
            tool_call_line("coder", 0),
            tool_call_line("coder", 1)
        ),
    )
    .unwrap();
    let out = bin()
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--events", "/dev/null", "--nats", &server.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let got = sub.wait_for(2, Duration::from_secs(30));
    let mut ids: Vec<(String, String)> = got
        .iter()
        .map(|g| {
            (
                g.headers["Nats-Msg-Id"].clone(),
                g.headers["Prx-Timestamp"].clone(),
            )
        })
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            (
                "sent-7f3a-1".to_string(),
                "2026-12-07T10:00:00.000001Z".to_string()
            ),
            (
                "sent-7f3a-2".to_string(),
                "2026-12-07T10:00:00.000001Z".to_string()
            ),
        ],
        "{text}"
    );
    assert_eq!(
        std::fs::read_dir(&spool)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".spool"))
            .count(),
        0,
        "the entry went once published: {text}"
    );
}
