//! A durable consumer acks only what its hooks ran (ARCHITECTURE.md § NATS bridge, "Acks after
//! the hooks ran"): a burst, a flood published while it consumes, and a server outage, each
//! through a real `run --from-nats … --durable` with a hook of default settings, and every
//! event's hook run at least once, counted in the hook's own output file. Also: the agent's
//! timestamp and seq reach the hook beside the host's.
//!
//! Sizes: `PRX_HOOKS_NATS_BURST_EVENTS` (default 10,000), `PRX_HOOKS_NATS_FLOOD_EVENTS`
//! (default 5,000), `PRX_HOOKS_NATS_OUTAGE_EVENTS` (default 600, about 100 a second).

use super::*;

/// A workspace whose one `tool_call` hook (default settings) appends a line per run: the
/// agent's seq and timestamp, the host's seq, the payload, then the event's id, its delivery
/// count and its reclaim mark (`-` when unset, the mark `0`).
fn default_hook_workspace(dir: &Path) -> std::path::PathBuf {
    let log = dir.join("log");
    let script = format!(
        "printf '%s %s %s %s %s %s %s\\n' \"${{ZERO_HOOK_ORIGIN_SEQ:--}}\" \
         \"${{ZERO_HOOK_ORIGIN_TIMESTAMP:--}}\" \"$ZERO_HOOK_SEQ\" \"$ZERO_HOOK_PAYLOAD\" \
         \"${{ZERO_HOOK_EVENT_ID:--}}\" \"${{ZERO_HOOK_DELIVERY:--}}\" \"${{ZERO_HOOK_RECLAIMED:-0}}\" >> {}",
        log.display()
    );
    let hooks = sh_hook("rec", &script, Value::Null);
    write_hooks(dir, &hooks);
    log
}

/// The stream FLEET and a JetStream context of `client`.
fn stream(client: &Client) -> async_nats::jetstream::Context {
    fleet_stream(client);
    client.jetstream()
}

/// Publishes `m<i>` through JetStream, waiting for the stream's ack and retrying (same id)
/// until it comes: the stream holds each once, whatever the server did meanwhile.
fn js_publish(client: &Client, js: &async_nats::jetstream::Context, i: usize) {
    let id = format!("m{i}");
    let body = format!(r#"{{"tool":"t","success":true,"output":"{id}"}}"#);
    client.rt.block_on(async {
        loop {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", id.as_str());
            h.insert("Prx-Agent", "fleet-7");
            h.insert("Prx-Seq", i.to_string().as_str());
            h.insert("Prx-Timestamp", "2020-01-01T00:00:00.000001Z");
            let sent = js
                .publish_with_headers("prx.lifecycle.tool_call", h, body.clone().into())
                .await;
            if let Ok(ack) = sent
                && tokio::time::timeout(Duration::from_secs(2), ack)
                    .await
                    .is_ok_and(|r| r.is_ok())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// Waits (at most `secs`) until every `m<i>` of `0..n` ran at least once; the runs per id.
fn all_ran(log: &Path, n: usize, secs: u64, c: &Consumer) -> HashMap<String, usize> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let counts = runs_per_id(log);
        if (0..n).all(|i| counts.contains_key(&format!("m{i}"))) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} ran after {secs} s: {}",
            counts.len(),
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the hooks' queues dropped (full, or shutdown began), every hook together.
fn shell_dropped(report: &Value) -> u64 {
    report["stats"]["shell"]["totals"]["dropped"]
        .as_u64()
        .expect("the report counts the hooks' drops")
}

#[test]
fn a_burst_through_a_durable_consumer_runs_every_hook_and_acks_nothing_it_dropped() {
    let n = env_n("PRX_HOOKS_NATS_BURST_EVENTS", 10_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let _js = stream(&client);
    // The burst is in the stream before the consumer exists.
    publish_ids(&client, 0..n);
    let ws = tempfile::tempdir().unwrap();
    let log = default_hook_workspace(ws.path());
    let url = server.url();
    let c = Consumer::start(ws.path(), &["--from-nats", &url, "--durable", "central"]);
    let counts = all_ran(&log, n, 60 + n as u64 / 20, &c);
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    let twice = counts.values().filter(|&&k| k > 1).count();
    // Nothing was dropped for a full queue: the intake waited for room per message.
    assert_eq!(shell_dropped(&r), 0, "{}", r["stats"]["shell"]);
    assert_eq!(s["retried"], 0, "{s}");
    assert_eq!(twice, 0, "{twice} ran twice: {s}");
    assert!(s["acked"].as_u64().unwrap() >= n as u64, "{s}");
    // The hook saw the host's numbering and the agent's, side by side.
    let lines = log_lines(&log);
    let l = lines
        .iter()
        .find(|l| l.contains("\"output\":\"m0\""))
        .unwrap();
    assert!(
        l.starts_with("- - "),
        "core publish carried no Prx-Seq: {l}"
    );
}

#[test]
fn a_flood_published_while_consuming_loses_nothing() {
    let n = env_n("PRX_HOOKS_NATS_FLOOD_EVENTS", 5_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let _js = stream(&client);
    let ws = tempfile::tempdir().unwrap();
    let log = default_hook_workspace(ws.path());
    let url = server.url();
    let c = Consumer::start(ws.path(), &["--from-nats", &url, "--durable", "central"]);
    until_consuming(&client, &log, "probe-flood");
    // As fast as the server takes them, while the consumer runs hooks.
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        publish_ids(&client, chunk.iter().copied());
    }
    let counts = all_ran(&log, n, 60 + n as u64 / 20, &c);
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    assert_eq!(shell_dropped(&r), 0, "{}", r["stats"]["shell"]);
    let twice = counts.values().filter(|&&k| k > 1).count();
    assert_eq!(twice, 0, "{twice} ran twice: {s}");
}

#[test]
fn a_server_outage_under_a_steady_flow_loses_nothing_and_hooks_see_the_agents_time() {
    let n = env_n("PRX_HOOKS_NATS_OUTAGE_EVENTS", 600);
    let mut server = NatsServer::start();
    let ws = tempfile::tempdir().unwrap();
    let log = default_hook_workspace(ws.path());
    let url = server.url();
    let (c, killed) = {
        let client = Client::connect(&url);
        let js = stream(&client);
        let c = Consumer::start(ws.path(), &["--from-nats", &url, "--durable", "central"]);
        until_consuming(&client, &log, "probe-outage");
        let killed = std::thread::scope(|scope| {
            let publisher = scope.spawn(|| {
                let start = Instant::now();
                for i in 0..n {
                    // About 100 a second.
                    let at = start + Duration::from_millis(10 * i as u64);
                    if let Some(wait) = at.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    js_publish(&client, &js, i);
                }
            });
            // A third of the way in: the server SIGKILLed for 2 s, then back with its store.
            std::thread::sleep(Duration::from_millis(10 * n as u64 / 3));
            let ran_before = runs_per_id(&log).len();
            server.kill();
            std::thread::sleep(Duration::from_secs(2));
            server.restart();
            publisher.join().unwrap();
            ran_before
        });
        (c, killed)
    };
    let counts = all_ran(&log, n, 120 + n as u64 / 20, &c);
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    assert!(
        killed > 0 && killed < n,
        "the outage came mid-stream: {killed}"
    );
    assert_eq!(shell_dropped(&r), 0, "{}", r["stats"]["shell"]);
    let s = &r["stats"]["nats"]["consume"];
    let twice = counts.values().filter(|&&k| k > 1).count();
    eprintln!("outage: {n} events, {twice} ran more than once (acks lost with the server): {s}");
    // The agent's seq and timestamp, checked, beside the host's.
    for l in log_lines(&log) {
        let Some(i) = l.find("\"output\":\"m") else {
            continue;
        };
        let id: usize = l[i + 11..l[i + 11..].find('"').unwrap() + i + 11]
            .parse()
            .unwrap();
        let mut parts = l.splitn(4, ' ');
        assert_eq!(parts.next(), Some(id.to_string().as_str()), "{l}");
        assert_eq!(parts.next(), Some("2020-01-01T00:00:00.000001Z"), "{l}");
        let host_seq: u64 = parts.next().unwrap().parse().unwrap();
        assert!(host_seq < 10 * n as u64, "{l}");
    }
}

#[test]
fn bad_origin_timestamps_and_seqs_are_refused_and_good_ones_reach_hooks_and_the_bus() {
    let (_server, ws, log, client, c) = core_consumer("probe-origin");
    let body = |id: &str| format!(r#"{{"tool":"t","success":true,"output":"{id}"}}"#);
    let bad: &[(&str, &str)] = &[
        ("Prx-Timestamp", "yesterday"),
        ("Prx-Timestamp", "2020-01-01T00:00:00+01:00"),
        ("Prx-Timestamp", "2020-01-01T00:00:00.Z"),
        ("Prx-Seq", "-1"),
        ("Prx-Seq", "1e3"),
        ("Prx-Seq", "18446744073709551616"),
    ];
    for (i, (k, v)) in bad.iter().enumerate() {
        let id = format!("bad{i}");
        client.publish(
            "prx.lifecycle.tool_call",
            &[("Nats-Msg-Id", id.as_str()), (k, v)],
            &body(&id),
        );
    }
    client.publish(
        "prx.lifecycle.tool_call",
        &[
            ("Nats-Msg-Id", "good"),
            ("Prx-Seq", "2499"),
            ("Prx-Timestamp", "2020-01-01T00:00:00.123456Z"),
        ],
        &body("good"),
    );
    client.sync();
    wait_until("the good one", 30, || {
        log_lines(&log).iter().any(|l| l.contains("\"good\""))
    });
    std::thread::sleep(Duration::from_millis(300));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    assert_eq!(s["refused_headers"], bad.len() as u64, "{s}");
    assert!(
        !log_lines(&log).iter().any(|l| l.contains("\"bad")),
        "a refused message ran"
    );
    drop(ws);
    // The envelope on the bus (`--print`) carries them too.
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let ws = tempfile::tempdir().unwrap();
    let out = ws.path().join("out");
    let mut child = bin()
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--print", "--from-nats", &server.url()])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("an envelope", 30, || {
        client.publish(
            "prx.lifecycle.tool_call",
            &[
                ("Prx-Seq", "2499"),
                ("Prx-Timestamp", "2020-01-01T00:00:00.123456Z"),
            ],
            &body("env"),
        );
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .contains("\"env\"")
    });
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&out).unwrap();
    let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(v["origin_seq"], 2499, "{v}");
    assert_eq!(v["origin_timestamp"], "2020-01-01T00:00:00.123456Z", "{v}");
    assert_ne!(v["timestamp"], v["origin_timestamp"], "{v}");
}

/// Publish → hook start at a quiet fleet's rate (20 events a second), durable and core: the
/// p50 and p99 printed (`--nocapture`), not asserted — a loaded machine's timings are no test.
/// Each hook prints its start time (ns since the epoch) and the time the event was sent.
#[test]
fn latency_at_a_quiet_rate_is_printed_for_durable_and_core_consumers() {
    let n = env_n("PRX_HOOKS_NATS_LATENCY_EVENTS", 60);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let js = stream(&client);
    let url = server.url();
    for (mode, args) in [
        ("durable", vec!["--from-nats", &url, "--durable", "central"]),
        ("core", vec!["--from-nats", &url]),
    ] {
        let ws = tempfile::tempdir().unwrap();
        let log = ws.path().join("log");
        let script = format!(
            "printf '%s %s\\n' \"$(date +%s%N)\" \"$ZERO_HOOK_PAYLOAD\" >> {}",
            log.display()
        );
        let hooks = sh_hook("lat", &script, Value::Null);
        write_hooks(ws.path(), &hooks);
        let c = Consumer::start(ws.path(), &args);
        until_consuming(&client, &log, &format!("probe-{mode}"));
        // Let the probe's redeliveries and the pipeline go quiet.
        std::thread::sleep(Duration::from_millis(500));
        for i in 0..n {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            let body = format!(r#"{{"tool":"t","success":true,"output":"{mode}-{i}-{now}"}}"#);
            let id = format!("{mode}-{i}");
            if mode == "durable" {
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", id.as_str());
                client
                    .rt
                    .block_on(js.publish_with_headers("prx.lifecycle.tool_call", h, body.into()))
                    .unwrap();
            } else {
                client.publish("prx.lifecycle.tool_call", &[("Nats-Msg-Id", &id)], &body);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        wait_until("every latency probe", 60, || {
            log_lines(&log)
                .iter()
                .filter(|l| l.contains(&format!("\"{mode}-")))
                .count()
                >= n
        });
        c.stop();
        let mut ms: Vec<f64> = log_lines(&log)
            .iter()
            .filter_map(|l| {
                let (start, rest) = l.split_once(' ')?;
                let out = rest.split(&format!("\"{mode}-")).nth(1)?;
                let sent = out.split(['-', '"']).nth(1)?;
                Some((start.parse::<u128>().ok()? as f64 - sent.parse::<u128>().ok()? as f64) / 1e6)
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        assert_eq!(ms.len(), n, "one run each");
        let at = |p: f64| ms[((ms.len() as f64 * p) as usize).min(ms.len() - 1)];
        eprintln!(
            "latency {mode}: publish → hook start, {n} events at 20/s: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            at(0.5),
            at(0.99),
            ms[ms.len() - 1]
        );
    }
}

/// A core consumer whose one hook is slow (intake pauses at once), subscribed.
fn slow_core_consumer(url: &str, client: &Client) -> (tempfile::TempDir, Consumer) {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let script = format!(
        "printf '%s\\n' \"$ZERO_HOOK_PAYLOAD\" >> {}; sleep 0.2",
        log.display()
    );
    let hooks = sh_hook("slow", &script, Value::Null);
    write_hooks(ws.path(), &hooks);
    let c = Consumer::start(ws.path(), &["--from-nats", url]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log_lines(&log).iter().any(|l| l.contains("probe")) {
        assert!(Instant::now() < deadline, "never consumed: {}", c.stderr());
        client.publish(
            "prx.lifecycle.tool_call",
            &[],
            r#"{"tool":"probe","success":true,"output":"probe"}"#,
        );
        client.sync();
        std::thread::sleep(Duration::from_millis(300));
    }
    (ws, c)
}

/// The probes the consumer received: each ran the hook (those published before it subscribed
/// reached nobody — core NATS keeps nothing).
fn probes_received(ws: &Path) -> usize {
    log_lines(&ws.join("log"))
        .iter()
        .filter(|l| l.contains("probe"))
        .count()
}

/// `received + dropped_full + buffered + slow_consumer` of a report.
fn accounted(s: &Value) -> u64 {
    ["received", "dropped_full", "buffered", "slow_consumer"]
        .iter()
        .map(|k| s[k].as_u64().unwrap())
        .sum()
}

#[test]
fn a_core_flood_past_the_buffer_counts_every_drop() {
    let n = env_n("PRX_HOOKS_NATS_CORE_FLOOD_EVENTS", 200_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let (ws, c) = slow_core_consumer(&server.url(), &client);
    let body = r#"{"tool":"t","success":true,"output":"x"}"#;
    client.rt.block_on(async {
        for _ in 0..n {
            client
                .client
                .publish("prx.lifecycle.tool_call", body.into())
                .await
                .unwrap();
        }
    });
    client.sync();
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    eprintln!("core flood of {n}: {s}");
    assert!(
        s["dropped_full"].as_u64().unwrap() > 0,
        "the buffer filled: {s}"
    );
    let probes = probes_received(ws.path());
    assert_eq!(
        accounted(s),
        (n + probes) as u64,
        "every message accounted for: {s}"
    );
}

/// The child's peak resident set (VmHWM) in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn large_bodies_stay_within_the_core_buffers_byte_bound() {
    let n = env_n("PRX_HOOKS_NATS_BIG_BODIES", 500);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let (ws, c) = slow_core_consumer(&server.url(), &client);
    let body = format!(
        r#"{{"tool":"t","success":true,"output":"{}"}}"#,
        "x".repeat(600 << 10)
    );
    for _ in 0..n {
        client.publish("prx.lifecycle.tool_call", &[], &body);
    }
    client.sync();
    std::thread::sleep(Duration::from_millis(500));
    let peak = peak_rss_kib(c.child.id());
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    eprintln!(
        "{n} bodies of 600 KiB ({} MiB) into a core consumer: peak RSS {} MiB; {s}",
        n * 600 / 1024,
        peak / 1024
    );
    // The buffer's 64 MiB, the at most 192 events intake lets into the pipeline (the hook
    // queue's 256 less a worker's batch of 64) and what the hook runs, the runtime: well under
    // what n bodies take (without the byte bound all of them were buffered).
    assert!(peak < 300 << 10, "peak RSS {} MiB", peak / 1024);
    assert!(s["buffered_bytes"].as_u64().unwrap() <= 64 << 20, "{s}");
    assert!(s["dropped_full"].as_u64().unwrap() > 0, "{s}");
    let probes = probes_received(ws.path());
    assert_eq!(accounted(s), (n + probes) as u64, "{s}");
}

#[test]
fn core_consumers_in_one_queue_group_split_the_events_and_run_each_once() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    let hosts: Vec<_> = (0..2)
        .map(|h| {
            let ws = tempfile::tempdir().unwrap();
            let log = recording_workspace(ws.path());
            let c = Consumer::start(ws.path(), &["--from-nats", &url, "--queue", "central"]);
            until_consuming(&client, &log, &format!("probe-q{h}"));
            (ws, log, c)
        })
        .collect();
    let n = 400;
    publish_ids(&client, 0..n);
    let total = || -> HashMap<String, usize> {
        let mut all = HashMap::new();
        for (_, log, _) in &hosts {
            for (id, k) in runs_per_id(log) {
                *all.entry(id).or_default() += k;
            }
        }
        all
    };
    wait_until("every id on one host or the other", 60, || {
        total().len() == n
    });
    std::thread::sleep(Duration::from_millis(500));
    let counts = total();
    assert!(counts.values().all(|&k| k == 1), "an id ran on both hosts");
    let per_host: Vec<usize> = hosts
        .iter()
        .map(|(_, log, _)| runs_per_id(log).len())
        .collect();
    assert!(
        per_host.iter().all(|&k| k > 0),
        "both hosts took a share: {per_host:?}"
    );
    for (_, _, c) in hosts {
        c.stop();
    }
}

/// Over core NATS a burst larger than a hook's queue (256) reaches a consumer whose hook is
/// slower than intake: intake counts what is in flight toward the hook, events in the ring
/// included, so it pauses before the queue fills and drops nothing as `dropped_queue_full`.
#[test]
fn a_core_burst_into_a_slow_hook_is_paced_not_dropped_for_a_full_queue() {
    let n = env_n("PRX_HOOKS_NATS_CORE_BURST_EVENTS", 5_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let ws = tempfile::tempdir().unwrap();
    let log = default_hook_workspace(ws.path());
    let url = server.url();
    let c = Consumer::start(ws.path(), &["--from-nats", &url]);
    until_consuming(&client, &log, "probe-core-burst");
    publish_ids(&client, 0..n);
    // Until every event ran, or nothing more ran for 5 s (what was dropped never will).
    let deadline = Instant::now() + Duration::from_secs(60 + n as u64 / 20);
    let (mut last, mut since) = (0, Instant::now());
    let counts = loop {
        let counts = runs_per_id(&log);
        if counts.len() == n || since.elapsed() > Duration::from_secs(5) {
            break counts;
        }
        if counts.len() != last {
            (last, since) = (counts.len(), Instant::now());
        }
        assert!(Instant::now() < deadline, "{} of {n} ran", counts.len());
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    let shell = &r["stats"]["shell"];
    eprintln!(
        "core burst of {n}: {} ran; {s}; shell {shell}",
        counts.len()
    );
    assert_eq!(shell_dropped(&r), 0, "{shell}");
    assert_eq!(s["dropped_full"], 0, "{s}");
    assert_eq!(counts.len(), n, "every event ran: {s}");
    assert!(counts.values().all(|&k| k == 1), "each ran once: {s}");
}

/// Over core NATS, two hosts in one queue group (`--queue central`), each with a hook slower
/// than intake, take a burst of twice `PRX_HOOKS_NATS_CORE_BURST_EVENTS` (default 10,000): each
/// host paces its own intake by what is in flight toward its hook, so neither drops an event
/// as `dropped_queue_full` (nor from its buffer), and every event runs once, on one host.
/// Before intake counted the events in the ring on their way to the hook, 6,859 of such a
/// 10,000 ran and the rest were dropped for a full queue.
#[test]
fn a_core_burst_into_a_queue_group_of_two_hosts_is_paced_not_dropped() {
    let n = 2 * env_n("PRX_HOOKS_NATS_CORE_BURST_EVENTS", 5_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    let hosts: Vec<_> = (0..2)
        .map(|h| {
            let ws = tempfile::tempdir().unwrap();
            let log = default_hook_workspace(ws.path());
            let c = Consumer::start(ws.path(), &["--from-nats", &url, "--queue", "central"]);
            until_consuming(&client, &log, &format!("probe-burst-q{h}"));
            (ws, log, c)
        })
        .collect();
    publish_ids(&client, 0..n);
    let total = || -> HashMap<String, usize> {
        let mut all = HashMap::new();
        for (_, log, _) in &hosts {
            for (id, k) in runs_per_id(log) {
                *all.entry(id).or_default() += k;
            }
        }
        all
    };
    // Until every event ran, or nothing more ran for 5 s (what was dropped never will).
    let deadline = Instant::now() + Duration::from_secs(60 + n as u64 / 20);
    let (mut last, mut since) = (0, Instant::now());
    let counts = loop {
        let counts = total();
        if counts.len() == n || since.elapsed() > Duration::from_secs(5) {
            break counts;
        }
        if counts.len() != last {
            (last, since) = (counts.len(), Instant::now());
        }
        assert!(Instant::now() < deadline, "{} of {n} ran", counts.len());
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut shares = Vec::new();
    for (_, log, c) in hosts {
        let share = runs_per_id(&log).len();
        let r = c.stop();
        let s = r["stats"]["nats"]["consume"].clone();
        let shell = r["stats"]["shell"].clone();
        eprintln!("queue group host: {share} ran; {s}; shell {shell}");
        assert_eq!(shell_dropped(&r), 0, "{shell}");
        assert_eq!(s["dropped_full"], 0, "{s}");
        shares.push(share);
    }
    eprintln!("core burst of {n} into a queue group of two: {shares:?}");
    assert_eq!(counts.len(), n, "every event ran");
    assert!(counts.values().all(|&k| k == 1), "each ran once");
    assert!(shares.iter().all(|&k| k > 0), "both hosts took a share");
}

/// A backlog of 1 MB bodies on a server of default settings (max_payload 1 MB, a client's
/// pending limit of 64 MiB), one host, no fault: every event runs once, in its agent's order,
/// none is delivered twice, and the connection is never dropped as a slow consumer. Pulls are
/// bounded in bytes as well as messages, and so is what is in flight.
#[test]
fn one_megabyte_bodies_run_once_in_order_without_redeliveries() {
    let n = env_n("PRX_HOOKS_NATS_LARGE_EVENTS", 120);
    let server = NatsServer::start();
    // docs/nats.md: at most 32 MiB pulled and not settled, held once more by the pipeline,
    // beside the process's own (about 40 MiB); 192 MiB leaves room for a loaded machine.
    large_bodies_run_once_in_order(&server, n, 1_000_000, 192);
}

/// 3.5 MB bodies on a server started with `max_payload: 8MB`, one host, no fault: every event
/// runs once, in order, none is delivered twice, none is given up. Each pull has room for the
/// largest message the server takes, and what is in flight stays within 4 × max_payload
/// (32 MiB). Before pulls and what is in flight were bounded in bytes, 1-2 of 160 such events
/// were lost after `--nats-max-deliver` attempts, once with `given_up` 0.
#[test]
fn bodies_of_three_and_a_half_megabytes_run_once_in_order_and_none_is_given_up() {
    let n = env_n("PRX_HOOKS_NATS_LARGE_EVENTS", 120) / 2;
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("big.conf");
    std::fs::write(&conf, "max_payload: 8MB\n").unwrap();
    let server = NatsServer::start_with(&["-c", conf.to_str().unwrap()]);
    // 4 × 8 MiB pulled and not settled, held once more by the pipeline, beside the process's
    // own.
    large_bodies_run_once_in_order(&server, n, 3_500_000, 256);
}

/// `n` events of `size`-byte bodies of one agent, published to JetStream, then consumed by
/// one host whose hook runs one at a time; asserted: no reconnect (slow consumer), nothing
/// redelivered, nothing given up, each event run once, in order, peak RSS under `rss_mib`.
fn large_bodies_run_once_in_order(server: &NatsServer, n: usize, size: usize, rss_mib: u64) {
    let client = Client::connect(&server.url());
    let js = stream(&client);
    let filler = "x".repeat(size);
    client.rt.block_on(async {
        for i in 0..n {
            let body = format!(r#"{{"tool":"t","success":true,"output":"{i} {filler}"}}"#);
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("big-{i}").as_str());
            h.insert("Prx-Agent", "big");
            h.insert("Prx-Seq", i.to_string().as_str());
            js.publish_with_headers("prx.lifecycle.tool_call", h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let script = format!(
        "printf '%s %s\\n' \"$ZERO_HOOK_ORIGIN_SEQ\" \"$ZERO_HOOK_DELIVERY\" >> {}",
        log.display()
    );
    let hooks = sh_hook("big", &script, serde_json::json!({"max_concurrent": 1}));
    write_hooks(ws.path(), &hooks);
    let url = server.url();
    let c = Consumer::start(ws.path(), &["--from-nats", &url, "--durable", "central"]);
    let ran = || -> HashSet<String> {
        log_lines(&log)
            .iter()
            .filter_map(|l| l.split(' ').next().map(str::to_string))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 2);
    while ran().len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} ran: {}",
            ran().len(),
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let peak = peak_rss_kib(c.child.id());
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    let info = client.rt.block_on(async {
        let mut c = js
            .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                "central", "FLEET",
            )
            .await
            .unwrap();
        c.info().await.unwrap().clone()
    });
    let lines = log_lines(&log);
    let seqs: Vec<u64> = lines
        .iter()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    let inversions = seqs.windows(2).filter(|w| w[1] < w[0]).count();
    let redelivered = lines.iter().filter(|l| !l.ends_with(" 1")).count();
    eprintln!(
        "{n} bodies of {size} bytes, one host: {} runs, {inversions} inversions, {redelivered} runs of a redelivery, the consumer's num_redelivered {}, peak RSS {} MiB; {s}",
        lines.len(),
        info.num_redelivered,
        peak / 1024
    );
    assert_eq!(
        s["reconnects"], 0,
        "never disconnected (slow consumer): {s}"
    );
    assert_eq!(
        info.num_redelivered, 0,
        "JetStream redelivered nothing: {s}"
    );
    assert_eq!(redelivered, 0, "every run was of a first delivery: {s}");
    assert_eq!(s["given_up"], 0, "nothing given up: {s}");
    assert_eq!(lines.len(), n, "every event ran once: {s}");
    assert_eq!(inversions, 0, "in the agent's order: {seqs:?}");
    assert!(peak < rss_mib << 10, "peak RSS {} MiB", peak / 1024);
}

/// A host stopped with SIGTERM naks what it took and did not run; with `--nats-max-deliver 1`
/// that was each such message's last delivery, so JetStream never delivers it again. The host
/// counts each one itself (`given_up`), though JetStream's advisory comes only when the next
/// host pulls, after it exited: every event that never ran is counted as given up by the host
/// that nak'ed it.
#[test]
fn messages_nakked_on_their_last_delivery_are_counted_given_up_by_the_host_itself() {
    let n = 200;
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let js = stream(&client);
    publish_ids(&client, 0..n);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let script = format!(
        "printf '%s\\n' \"$ZERO_HOOK_PAYLOAD\" >> {}; sleep 0.05",
        log.display()
    );
    let hooks = sh_hook("slow", &script, serde_json::json!({"max_concurrent": 1}));
    let url = server.url();
    let args = [
        "--from-nats",
        url.as_str(),
        "--durable",
        "central",
        "--nats-max-deliver",
        "1",
    ];
    let host = || {
        let ws = tempfile::tempdir().unwrap();
        write_hooks(ws.path(), &hooks);
        let c = Consumer::start(ws.path(), &args);
        (ws, c)
    };
    let (_ws1, first) = host();
    wait_until("the first host ran some", 60, || {
        runs_per_id(&log).len() >= 10
    });
    let r1 = first.stop();
    let given_up = r1["stats"]["nats"]["consume"]["given_up"].as_u64().unwrap();
    // A second host on the same consumer runs what the first did not take.
    let (_ws2, second) = host();
    wait_until("JetStream has nothing left for the consumer", 120, || {
        client.rt.block_on(async {
            let Ok(mut c) = js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    "central", "FLEET",
                )
                .await
            else {
                return false;
            };
            c.info()
                .await
                .is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
        })
    });
    std::thread::sleep(Duration::from_millis(500));
    let r2 = second.stop();
    let counts = runs_per_id(&log);
    eprintln!(
        "{n} events, --nats-max-deliver 1, the first host stopped: {} ran, the first host counted {given_up} given up, the second {}",
        counts.len(),
        r2["stats"]["nats"]["consume"]["given_up"]
    );
    let s1 = &r1["stats"]["nats"]["consume"];
    assert!(counts.values().all(|&k| k == 1), "none ran twice");
    assert!(given_up > 0, "the stop left messages unrun: {s1}");
    // What the first host took and did not ack was on its last delivery: all counted.
    let unacked = s1["consumed"].as_u64().unwrap() - s1["acked"].as_u64().unwrap();
    assert_eq!(given_up, unacked, "{s1}");
    // Every event that never ran is among them. (One nak'ed at the drain deadline may still
    // run while the pipeline drains: counted, and run.)
    assert!(
        n as u64 - counts.len() as u64 <= given_up,
        "{} never ran, {given_up} counted given up: {s1}",
        n - counts.len()
    );
}

/// CPU seconds of a process and its reaped children (its hooks): utime + stime + cutime +
/// cstime from /proc/<pid>/stat.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // After the name: state is field 3, utime 14 … cstime 17 (1-based, man 5 proc).
    let ticks: u64 = fields[11..15]
        .iter()
        .map(|f| f.parse::<u64>().unwrap())
        .sum();
    ticks as f64
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as f64
}

/// The fleet bench: 1, 2 and 3 hosts sharing one durable consumer, a `/bin/true` hook, a
/// backlog of `PRX_HOOKS_NATS_FLEET_EVENTS` (default 3,000) events: events per second until
/// JetStream has every one acked (so every hook ran), and CPU per event (the hosts and their
/// hooks). Printed (`--nocapture`), not asserted: a shared machine's timings are no test;
/// that every event was acked is.
#[test]
fn fleet_bench_one_two_and_three_hosts_sharing_a_durable_consumer() {
    let n = env_n("PRX_HOOKS_NATS_FLEET_EVENTS", 3_000);
    for hosts in 1..=3 {
        let server = NatsServer::start();
        let client = Client::connect(&server.url());
        let js = stream(&client);
        publish_ids(&client, 0..n);
        let url = server.url();
        let start = Instant::now();
        let running: Vec<_> = (0..hosts)
            .map(|_| {
                let ws = tempfile::tempdir().unwrap();
                let hooks = serde_json::json!({"hooks": {"tool_call": [{
                    "id": "true", "command": "/bin/true"
                }]}});
                write_hooks(ws.path(), &hooks);
                let c = Consumer::start(ws.path(), &["--from-nats", &url, "--durable", "central"]);
                (ws, c)
            })
            .collect();
        wait_until("every event acked", 120 + n as u64 / 50, || {
            all_acked(&client, &js, n as u64)
        });
        let secs = start.elapsed().as_secs_f64();
        let cpu: f64 = running.iter().map(|(_, c)| cpu_seconds(c.child.id())).sum();
        let mut acked = 0;
        for (_, c) in running {
            acked += c.stop()["stats"]["nats"]["consume"]["acked"]
                .as_u64()
                .unwrap();
        }
        assert!(acked >= n as u64, "{acked} acked of {n}");
        eprintln!(
            "fleet bench: {hosts} host(s), {n} events, /bin/true hook: {:.0} events/s, {:.0} µs CPU per event (hosts + hooks)",
            n as f64 / secs,
            cpu / n as f64 * 1e6
        );
    }
}

/// The stream FLEET with a duplicate window of 1 s: a copy published later is stored again,
/// and only a consumer's own de-dup recognizes it.
pub(super) fn short_duplicate_window_stream(client: &Client) -> async_nats::jetstream::Context {
    let js = client.jetstream();
    client
        .rt
        .block_on(js.create_stream(async_nats::jetstream::stream::Config {
            name: "FLEET".into(),
            subjects: vec!["prx.lifecycle.>".into()],
            duplicate_window: Duration::from_secs(1),
            ..Default::default()
        }))
        .unwrap();
    js
}

/// Whether JetStream has every message of durable `central` on FLEET acked, `n` at least.
pub(super) fn all_acked(client: &Client, js: &async_nats::jetstream::Context, n: u64) -> bool {
    client.rt.block_on(async {
        let Ok(mut c) = js
            .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                "central", "FLEET",
            )
            .await
        else {
            return false;
        };
        c.info().await.is_ok_and(|i| {
            i.num_pending == 0 && i.num_ack_pending == 0 && i.ack_floor.stream_sequence >= n
        })
    })
}

/// Two hosts share a durable consumer and a de-dup bucket; every event is stored a second
/// time after the stream's duplicate window (as a publisher's late retry is, or what a lost
/// ack makes JetStream deliver again): whichever host gets the copy, it does not run again.
/// Without the bucket (the control half) a host that did not run the original runs the copy.
#[test]
fn hosts_sharing_a_durable_consumer_and_a_dedup_bucket_run_a_late_copy_nowhere() {
    let n = 200;
    for shared in [true, false] {
        let server = NatsServer::start();
        let client = Client::connect(&server.url());
        let js = short_duplicate_window_stream(&client);
        let url = server.url();
        let mut args = vec!["--from-nats", url.as_str(), "--durable", "central"];
        if shared {
            args.extend(["--nats-dedup-bucket", "PRXRAN"]);
        }
        let hosts: Vec<_> = (0..2)
            .map(|_| {
                let ws = tempfile::tempdir().unwrap();
                let log = recording_workspace(ws.path());
                let c = Consumer::start(ws.path(), &args);
                (ws, log, c)
            })
            .collect();
        let total = || -> HashMap<String, usize> {
            let mut all = HashMap::new();
            for (_, log, _) in &hosts {
                for (id, k) in runs_per_id(log) {
                    *all.entry(id).or_default() += k;
                }
            }
            all
        };
        publish_ids(&client, 0..n);
        wait_until("every id ran", 60, || total().len() == n);
        wait_until("every id acked", 60, || all_acked(&client, &js, n as u64));
        std::thread::sleep(Duration::from_millis(1200)); // past the duplicate window
        publish_ids(&client, 0..n);
        wait_until("the copies acked", 60, || {
            all_acked(&client, &js, 2 * n as u64)
        });
        std::thread::sleep(Duration::from_millis(300));
        let counts = total();
        let per_host: Vec<usize> = hosts
            .iter()
            .map(|(_, log, _)| runs_per_id(log).len())
            .collect();
        let twice = counts.values().filter(|&&k| k > 1).count();
        let mut shared_dups = 0;
        for (_, _, c) in hosts {
            shared_dups += c.stop()["stats"]["nats"]["consume"]["shared_duplicates"]
                .as_u64()
                .unwrap();
        }
        eprintln!(
            "shared bucket {shared}: per host {per_host:?}, {twice} ran twice, {shared_dups} recognized by the bucket"
        );
        if shared {
            assert_eq!(twice, 0, "a copy ran again: per host {per_host:?}");
            assert!(shared_dups > 0, "the bucket recognized the copies");
        } else if per_host.iter().all(|&k| k > 0) {
            // The control: both hosts took a share, so copies reached the other host.
            assert!(
                twice > 0,
                "without the bucket a copy on the other host runs again"
            );
        }
    }
}

/// The ids a consumer logged as reclaimed: run although another host had claimed them in the
/// shared de-dup bucket and not recorded them done.
pub(super) fn reclaimed_ids(c: &Consumer) -> HashSet<String> {
    c.stderr()
        .lines()
        .filter(|l| l.contains("reclaimed from host"))
        .filter_map(|l| {
            let rest = &l[l.find("NATS consumer: ")? + 15..];
            Some(rest[..rest.find(':')?].to_string())
        })
        .collect()
}

/// Two hosts share a durable consumer and a de-dup bucket; one is SIGKILLed mid-burst: what
/// it had not settled is redelivered to the other after the ack wait, and every event's hook
/// ran at least once (counted in the two hooks' output). What ran twice is exactly what the
/// survivor recognized as claimed by the dead host and not recorded done: every id that ran
/// twice is among the ids it logged as reclaimed (and counted, `reclaimed`).
#[test]
fn a_host_killed_mid_burst_leaves_nothing_unrun_and_every_second_run_is_reclaimed() {
    let n = env_n("PRX_HOOKS_NATS_KILL_HOST_EVENTS", 2_000);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let js = stream(&client);
    publish_ids(&client, 0..n);
    let url = server.url();
    let args = [
        "--from-nats",
        url.as_str(),
        "--durable",
        "central",
        "--nats-dedup-bucket",
        "PRXRAN",
    ];
    let mut hosts: Vec<_> = (0..2)
        .map(|_| {
            let ws = tempfile::tempdir().unwrap();
            let log = default_hook_workspace(ws.path());
            let c = Consumer::start(ws.path(), &args);
            (ws, log, c)
        })
        .collect();
    let total = |hosts: &[(tempfile::TempDir, std::path::PathBuf, Consumer)]| {
        let mut all: HashMap<String, usize> = HashMap::new();
        for (_, log, _) in hosts {
            for (id, k) in runs_per_id(log) {
                *all.entry(id).or_default() += k;
            }
        }
        all
    };
    wait_until("a quarter ran", 120, || total(&hosts).len() >= n / 4);
    let (_dead_ws, dead_log, mut dead) = hosts.remove(0);
    dead.child.kill().unwrap();
    let _ = dead.child.wait();
    // The ack wait (10 s) passes before JetStream redelivers what the dead host held.
    wait_until("every event acked", 120 + n as u64 / 20, || {
        all_acked(&client, &js, n as u64)
    });
    std::thread::sleep(Duration::from_millis(500));
    // Read last: the dead host's hook processes outlive it and may still have written.
    let mut all = total(&hosts);
    for (id, k) in runs_per_id(&dead_log) {
        *all.entry(id).or_default() += k;
    }
    let missing: Vec<usize> = (0..n)
        .filter(|i| !all.contains_key(&format!("m{i}")))
        .collect();
    let twice: HashSet<String> = all
        .iter()
        .filter(|&(_, &k)| k > 1)
        .map(|(id, _)| id.clone())
        .collect();
    let hosts_logs = [hosts[0].1.clone()];
    let (_alive_ws, _, alive) = hosts.remove(0);
    let reclaimed = reclaimed_ids(&alive);
    let r = alive.stop();
    let s = &r["stats"]["nats"]["consume"];
    eprintln!(
        "host killed mid-burst: {n} events, {} missing, {} ran twice, {} reclaimed by the survivor: {s}",
        missing.len(),
        twice.len(),
        reclaimed.len(),
    );
    assert!(missing.is_empty(), "never ran: {missing:?}");
    let unrecognized: Vec<&String> = twice.difference(&reclaimed).collect();
    assert!(
        unrecognized.is_empty(),
        "ran twice without being reclaimed: {unrecognized:?}"
    );
    assert_eq!(s["reclaimed"].as_u64(), Some(reclaimed.len() as u64), "{s}");
    // What the hooks saw: each run's id is its message's; the survivor's run of an event
    // that ran twice is a redelivery and carries the reclaimed mark.
    let runs = |log: &Path| -> Vec<Run> {
        log_lines(log)
            .iter()
            .filter_map(|l| Run::parse(l))
            .collect()
    };
    let survivor = runs(&hosts_logs[0]);
    for r in survivor.iter().chain(runs(&dead_log).iter()) {
        assert_eq!(
            r.event_id, r.output,
            "ZERO_HOOK_EVENT_ID is the Nats-Msg-Id: {r:?}"
        );
        assert!(r.delivery >= 1, "{r:?}");
    }
    for id in &twice {
        let second: Vec<&Run> = survivor.iter().filter(|r| &r.output == id).collect();
        assert!(
            !second.is_empty(),
            "{id}: its second run was on the survivor"
        );
        for r in second {
            assert!(
                r.reclaimed && r.delivery >= 2,
                "{id}: a second run carries ZERO_HOOK_RECLAIMED=1 and a delivery of 2 or more: {r:?}"
            );
        }
    }
}

/// One line of [`default_hook_workspace`]'s log.
#[derive(Debug)]
struct Run {
    /// The event's `output` (the test's id for it).
    output: String,
    event_id: String,
    delivery: u64,
    reclaimed: bool,
}

impl Run {
    fn parse(line: &str) -> Option<Run> {
        let f: Vec<&str> = line.split(' ').collect();
        let [_, _, _, payload, id, delivery, reclaimed] = f[..] else {
            return None;
        };
        let v: Value = serde_json::from_str(payload).ok()?;
        Some(Run {
            output: v["output"].as_str()?.to_string(),
            event_id: id.to_string(),
            delivery: delivery.parse().unwrap_or(0),
            reclaimed: reclaimed == "1",
        })
    }
}

/// A hook running longer than JetStream's 10 s ack wait: the consumer's in-progress acks keep
/// the message from being redelivered meanwhile, and it runs once.
#[test]
fn a_hook_running_past_the_ack_wait_is_not_redelivered_meanwhile() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let _js = stream(&client);
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let script = format!(
        "echo \"start $ZERO_HOOK_PAYLOAD\" >> {0}; sleep 13; echo end >> {0}",
        log.display()
    );
    let hooks = sh_hook("long", &script, serde_json::json!({"timeout_ms": 60000}));
    write_hooks(ws.path(), &hooks);
    publish_ids(&client, 0..1);
    let url = server.url();
    let c = Consumer::start(ws.path(), &["--from-nats", &url, "--durable", "central"]);
    wait_until("the long hook's end", 60, || {
        log_lines(&log).iter().any(|l| l == "end")
    });
    std::thread::sleep(Duration::from_millis(500));
    let r = c.stop();
    let s = &r["stats"]["nats"]["consume"];
    let starts = log_lines(&log)
        .iter()
        .filter(|l| l.starts_with("start"))
        .count();
    assert_eq!(starts, 1, "{s}");
    assert_eq!(s["duplicates"], 0, "no redelivery while it ran: {s}");
    assert_eq!(s["acked"], 1, "{s}");
}
