//! What a hook gets to make its own effect happen once (docs/nats.md § Idempotent hooks): the
//! event's id (its `Nats-Msg-Id`), JetStream's delivery count and the reclaimed mark, in the
//! hook's environment and in the bus envelope, through a real redelivery: a host SIGKILLed
//! after its hook ran and before the ack, and the next host taking the message over.

use super::*;

/// A host runs the hook of `m0` (delivery 1) and is SIGKILLed before it acks (the hook is
/// still running); after JetStream's 10 s ack wait a second host gets it again. Its hook sees
/// the same `ZERO_HOOK_EVENT_ID`, `ZERO_HOOK_DELIVERY=2` and `ZERO_HOOK_RECLAIMED=1` (the first
/// host's claim in the shared bucket was never recorded done); its `--print` envelope carries
/// `event_id`, `delivery` and `reclaimed`; and what it relays keeps the id.
#[test]
fn a_redelivered_event_shows_its_hook_the_same_id_delivery_2_and_the_reclaimed_mark() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    fleet_stream(&client);
    let relayed = Collector::start(&server.url(), "again.prx.lifecycle.>");
    publish_ids(&client, 0..1);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    // The first delivery's hook records its run, then holds the message past the kill.
    let script = format!(
        "printf '%s %s %s %s\\n' \"${{ZERO_HOOK_EVENT_ID:--}}\" \"${{ZERO_HOOK_DELIVERY:--}}\" \
         \"${{ZERO_HOOK_RECLAIMED:-0}}\" \"$ZERO_HOOK_PAYLOAD\" >> {}; \
         [ \"$ZERO_HOOK_DELIVERY\" = 1 ] && exec sleep 30; exit 0",
        log.display()
    );
    let hooks = sh_hook("once", &script, serde_json::json!({"timeout_ms": 60000}));
    let url = server.url();
    let args = [
        "--from-nats",
        url.as_str(),
        "--durable",
        "central",
        "--nats-dedup-bucket",
        "PRXRAN",
    ];
    let ws_a = tempfile::tempdir().unwrap();
    write_hooks(ws_a.path(), &hooks);
    let mut a = Consumer::start(ws_a.path(), &args);
    wait_until("the first run", 60, || log_lines(&log).len() == 1);
    a.child.kill().unwrap();
    let _ = a.child.wait();
    let killed = Instant::now();
    // The second host prints what it feeds the bus and relays it under the prefix `again`.
    let ws_b = tempfile::tempdir().unwrap();
    write_hooks(ws_b.path(), &hooks);
    let out = ws_b.path().join("out");
    let stderr = ws_b.path().join("stderr");
    let mut b = bin()
        .args(["run", "--print", "--workspace"])
        .arg(ws_b.path())
        .args(args)
        .args(["--nats", &url, "--nats-prefix", "again"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    wait_until("the redelivery's run", 60, || log_lines(&log).len() >= 2);
    eprintln!(
        "redelivered {:.1} s after the kill (the ack wait is 10 s)",
        killed.elapsed().as_secs_f64()
    );
    wait_until("the relayed copy", 30, || relayed.len() >= 1);
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    b.wait().unwrap();
    let lines = log_lines(&log);
    let fields: Vec<Vec<&str>> = lines.iter().map(|l| l.splitn(4, ' ').collect()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(fields[0][..3], ["m0", "1", "0"], "the first run: {lines:?}");
    assert_eq!(
        fields[1][..3],
        ["m0", "2", "1"],
        "the redelivery: {lines:?}"
    );
    assert_eq!(fields[0][3], fields[1][3], "the same event");
    let r = report(&std::fs::read(&stderr).unwrap());
    assert_eq!(r["stats"]["nats"]["consume"]["reclaimed"], 1, "{r}");
    // The envelope on the bus carries them too.
    let text = std::fs::read_to_string(&out).unwrap();
    let v: Value = serde_json::from_str(text.lines().next().expect("an envelope")).unwrap();
    assert_eq!(v["event_id"], "m0", "{v}");
    assert_eq!(v["delivery"], 2, "{v}");
    assert_eq!(v["reclaimed"], true, "{v}");
    // And the relay keeps the id: a consumer downstream sees the same ZERO_HOOK_EVENT_ID.
    let got = relayed.all();
    assert_eq!(got[0].headers["Nats-Msg-Id"], "m0", "{got:?}");
}

/// Over core NATS a hook sees the id (no delivery count: core NATS never redelivers), and an
/// event without a `Nats-Msg-Id` has neither.
#[test]
fn a_core_consumers_hooks_see_the_event_id_and_no_delivery_count() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let script = format!(
        "printf '%s %s %s\\n' \"${{ZERO_HOOK_EVENT_ID:--}}\" \"${{ZERO_HOOK_DELIVERY:--}}\" \
         \"$ZERO_HOOK_PAYLOAD\" >> {}",
        log.display()
    );
    let hooks = sh_hook("ids", &script, Value::Null);
    write_hooks(ws.path(), &hooks);
    let url = server.url();
    let c = Consumer::start(ws.path(), &["--from-nats", &url]);
    until_consuming(&client, &log, "probe-ids");
    client.publish(
        "prx.lifecycle.tool_call",
        &[],
        r#"{"tool":"t","success":true,"output":"anonymous"}"#,
    );
    client.sync();
    wait_until("the anonymous event", 30, || {
        log_lines(&log).iter().any(|l| l.contains("anonymous"))
    });
    c.stop();
    let lines = log_lines(&log);
    let probe = lines.iter().find(|l| l.contains("probe-ids")).unwrap();
    assert!(probe.starts_with("probe-ids - "), "{probe}");
    let anonymous = lines.iter().find(|l| l.contains("anonymous")).unwrap();
    assert!(anonymous.starts_with("- - "), "{anonymous}");
}

/// Three hosts share a durable consumer and a de-dup bucket; their hook runs one event at a
/// time (`max_concurrent: 1`), so each host holds a queue of events taken and not started. One
/// host is SIGKILLed mid-burst: the others run what it held after the ack wait. The reclaimed
/// mark is accurate: an event carries it only when its hook may have started on the dead host
/// (at most the few it had started and not recorded done), every event that ran twice carries
/// it on its second run, and every run's `ZERO_HOOK_EVENT_ID` is the message's id. Before, the
/// mark went to every event the dead host had taken, started or not: over a hundred marked
/// runs were first runs.
#[test]
fn after_a_host_is_killed_only_what_may_have_run_there_is_marked_reclaimed() {
    let n = 900;
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    fleet_stream(&client);
    publish_ids(&client, 0..n);
    let js = client.jetstream();
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let script = format!(
        "printf '%s %s %s %s\\n' \"${{ZERO_HOOK_EVENT_ID:--}}\" \"${{ZERO_HOOK_DELIVERY:--}}\" \
         \"${{ZERO_HOOK_RECLAIMED:-0}}\" \"$ZERO_HOOK_PAYLOAD\" >> {}; sleep 0.01",
        log.display()
    );
    let hooks = sh_hook("once", &script, serde_json::json!({"max_concurrent": 1}));
    let url = server.url();
    let args = [
        "--from-nats",
        url.as_str(),
        "--durable",
        "central",
        "--nats-dedup-bucket",
        "PRXRAN",
    ];
    let mut hosts: Vec<_> = (0..3)
        .map(|_| {
            let ws = tempfile::tempdir().unwrap();
            write_hooks(ws.path(), &hooks);
            let c = Consumer::start(ws.path(), &args);
            (ws, c)
        })
        .collect();
    wait_until("a quarter ran", 120, || log_lines(&log).len() >= n / 4);
    let (_ws, mut dead) = hosts.remove(0);
    dead.child.kill().unwrap();
    let _ = dead.child.wait();
    wait_until("every event acked", 120, || {
        super::fleet::all_acked(&client, &js, n as u64)
    });
    std::thread::sleep(Duration::from_millis(500));
    // (id, delivery, reclaimed) per run, in the order they were logged.
    let runs: Vec<(String, u64, bool)> = log_lines(&log)
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, ' ').collect();
            let v: Value = serde_json::from_str(f[3]).unwrap();
            assert_eq!(f[0], v["output"], "ZERO_HOOK_EVENT_ID is the id: {l}");
            (f[0].to_string(), f[1].parse().unwrap(), f[2] == "1")
        })
        .collect();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for (id, _, _) in &runs {
        *per_id.entry(id.as_str()).or_default() += 1;
    }
    let mut stats = Vec::new();
    for (_, c) in hosts {
        stats.push(c.stop()["stats"]["nats"]["consume"].clone());
    }
    let marked: Vec<&(String, u64, bool)> = runs.iter().filter(|r| r.2).collect();
    let marked_alone = marked.iter().filter(|r| per_id[r.0.as_str()] == 1).count();
    let mut seen = HashSet::new();
    let unmarked_second: Vec<&(String, u64, bool)> = runs
        .iter()
        .filter(|r| !seen.insert(r.0.clone()) && !r.2)
        .collect();
    let twice = per_id.values().filter(|&&k| k > 1).count();
    eprintln!(
        "a host of 3 killed: {n} events, {} runs, {twice} ran twice, {} marked reclaimed ({marked_alone} of them ran nowhere else); {stats:?}",
        runs.len(),
        marked.len()
    );
    assert_eq!(per_id.len(), n, "every event ran");
    assert!(
        unmarked_second.is_empty(),
        "second runs without the mark: {unmarked_second:?}"
    );
    assert!(
        marked_alone <= 4,
        "{marked_alone} runs marked reclaimed had not run anywhere else (at most the dead host's few started runs may be)"
    );
}

/// The shared de-dup bucket stops answering while events wait in a hook's queue (the server
/// SIGSTOPped for 3 s, twice, 1.5 s apart), with `--nats-max-deliver 2`: the runs wait for
/// their start records, which are written once the bucket answers again, and their messages
/// stay in flight. Every event runs, none is nak'ed (`retried` 0), none is given up. Before,
/// the runner thread waited up to 2.5 s for each start record, then for a second refused every
/// run without trying, and each refusal was a nak spending one of the message's two
/// deliveries: 120 naks in this test.
#[test]
fn a_dedup_bucket_that_stops_answering_spends_no_delivery_and_gives_up_nothing() {
    let n = 200;
    let mut server = NatsServer::start();
    let client = Client::connect(&server.url());
    fleet_stream(&client);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let script = format!(
        "printf '%s %s\\n' \"${{ZERO_HOOK_EVENT_ID:--}}\" \"${{ZERO_HOOK_DELIVERY:--}}\" >> {}; sleep 0.02",
        log.display()
    );
    let hooks = sh_hook("once", &script, Value::Null);
    let url = server.url();
    let args = [
        "--from-nats",
        url.as_str(),
        "--durable",
        "central",
        "--nats-dedup-bucket",
        "PRXRAN",
        "--nats-max-deliver",
        "2",
    ];
    let ws = tempfile::tempdir().unwrap();
    write_hooks(ws.path(), &hooks);
    let host = Consumer::start(ws.path(), &args);
    publish_ids(&client, 0..n);
    wait_until("the first runs", 60, || log_lines(&log).len() >= 10);
    for _ in 0..2 {
        server.pause();
        std::thread::sleep(Duration::from_secs(3));
        server.resume();
        std::thread::sleep(Duration::from_millis(1500));
    }
    let js = client.jetstream();
    wait_until("nothing left pending", 120, || {
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
    let stats = host.stop()["stats"]["nats"]["consume"].clone();
    let ran: HashSet<String> = log_lines(&log)
        .iter()
        .filter_map(|l| l.split(' ').next().map(str::to_string))
        .collect();
    eprintln!("{} of {n} ran; {stats}", ran.len());
    assert_eq!(stats["given_up"], 0, "{stats}");
    assert_eq!(
        stats["retried"], 0,
        "no run refused for a late answer: {stats}"
    );
    assert_eq!(ran.len(), n, "every event ran; {stats}");
    server.kill();
}
