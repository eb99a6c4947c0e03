//! WASM plugins settling JetStream messages (docs/nats.md § What is lost, what is duplicated):
//! real guest components built from examples/plugins behind a real `run --from-nats …
//! --durable`. A message is acked only once every plugin call it was handed to ran, and intake
//! waits while a plugin's queue has no room for it, so nothing is dropped, lost or run twice.
//!
//! Size: `PRX_HOOKS_NATS_PLUGIN_EVENTS` (default 300).

use super::fleet::all_acked;
use super::plugins_support::install;
use super::*;

/// Two plugins take every tool_call: `audit-hook`, which echoes each event it is called with
/// to the bus topic `audit.echo` (printed by `--print`: the evidence of each call), and
/// `misbehave` in `sleep` mode (20 ms a call) with `pool_size = 64`, so its one busy queue
/// holds 16 events (1,024 / 64), far fewer than the 128 messages the consumer may keep in
/// flight. Intake asks every plugin queue for room before each hand-over (`Sink::room`), so
/// the slow queue never overflows: JetStream has every message acked, every event was echoed,
/// both plugins ran exactly once per event, and nothing was nak'ed.
#[test]
fn plugins_settle_jetstream_messages_and_intake_waits_for_a_slow_plugins_queue() {
    let n = env_n("PRX_HOOKS_NATS_PLUGIN_EVENTS", 300);
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    fleet_stream(&client);
    let js = client.jetstream();
    publish_ids(&client, 0..n);
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "audit-hook",
        "audit_hook",
        r#"
[plugin]
name = "audit-hook"
version = "0.1.0"

[[capabilities]]
type = "hook"
name = "audit"
events = ["prx.lifecycle.tool_call"]

[permissions]
required = ["log", "kv", "events"]

[config]
echo_topic = "audit.echo"
"#,
    );
    install(
        ws.path(),
        "misbehave",
        "misbehave",
        r#"
[plugin]
name = "misbehave"
version = "0.1.0"

[[capabilities]]
type = "hook"
events = ["prx.lifecycle.tool_call"]

[permissions]
required = ["log", "config", "kv", "events"]

[resources]
max_memory_mb = 16
max_execution_time_ms = 10_000
pool_size = 64

[config]
mode = "sleep"
sleep_ms = "20"
"#,
    );
    let out = ws.path().join("out");
    let stderr = ws.path().join("stderr");
    let url = server.url();
    let mut child = bin()
        .args(["run", "--print", "--workspace"])
        .arg(ws.path())
        .args(["--from-nats", &url, "--durable", "central"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120 + n as u64 / 5);
    while !all_acked(&client, &js, n as u64) {
        assert!(
            Instant::now() < deadline,
            "not every message acked: {}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let secs = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
    let r = report(&std::fs::read(&stderr).unwrap());
    let plugins = r["stats"]["plugins"]["plugins"].as_array().unwrap().clone();
    let plugin = |name: &str| {
        plugins
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {r}"))
            .clone()
    };
    let (audit, slow) = (plugin("audit-hook"), plugin("misbehave"));
    let s = &r["stats"]["nats"]["consume"];
    // Every event's echo: audit-hook was called with each one.
    let mut echoed: HashMap<String, usize> = HashMap::new();
    for l in std::fs::read_to_string(&out).unwrap().lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        if v["topic"] == "audit.echo"
            && let Some(id) = v["payload"]["payload"]["output"].as_str()
        {
            *echoed.entry(id.to_string()).or_default() += 1;
        }
    }
    let missing: Vec<usize> = (0..n)
        .filter(|i| !echoed.contains_key(&format!("m{i}")))
        .collect();
    eprintln!(
        "plugins: {n} events in {secs:.1} s; misbehave ok {} dropped_queue_full {}; audit-hook ok {}; consumer retried {} acked {}",
        slow["ok"], slow["dropped_queue_full"], audit["ok"], s["retried"], s["acked"]
    );
    assert!(missing.is_empty(), "never echoed: {missing:?}");
    assert_eq!(
        slow["dropped_queue_full"], 0,
        "intake overfilled the slow plugin's queue: {slow}"
    );
    assert_eq!(
        s["retried"], 0,
        "nothing was dropped, so nothing nak'ed: {s}"
    );
    // One call that ran per event, and each message acked once.
    assert_eq!(
        slow["ok"].as_u64().unwrap(),
        n as u64,
        "the slow plugin ran once per event: {slow}"
    );
    assert_eq!(slow["errors"], 0, "{slow}");
    assert_eq!(s["acked"].as_u64().unwrap(), n as u64, "{s}");
    assert_eq!(audit["ok"].as_u64().unwrap(), n as u64, "{audit}");
}

/// A host with partitions is stopped (SIGSTOP) for 17 s, past its leases (15 s), while a slow
/// plugin's queue holds events of its partitions: when it resumes, those queued calls are not
/// made (fenced, counted `dropped_fenced`: their messages are nak'ed and delivered again to
/// whoever holds the partition then, here the same host once it took its leases back), and
/// every event is still called and acked. Before, the plugin executor made every queued call,
/// its partition lease stale or lost (only shell runs were fenced): in this test 102 calls made
/// under stale leases, whose redeliveries the host then skipped as duplicates.
#[test]
fn plugin_calls_queued_under_a_lease_gone_stale_are_not_made() {
    use super::partitions::{AGENTS, PARTITIONS, publish_partitioned};
    let per_agent = 10;
    let n = AGENTS * per_agent;
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    publish_partitioned(&url, 0..per_agent);
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "misbehave",
        "misbehave",
        r#"
[plugin]
name = "misbehave"
version = "0.1.0"

[[capabilities]]
type = "hook"
events = ["prx.lifecycle.tool_call"]

[permissions]
required = ["log", "config", "kv", "events"]

[resources]
max_memory_mb = 16
max_execution_time_ms = 10_000
pool_size = 1

[config]
mode = "sleep"
sleep_ms = "50"
"#,
    );
    let partitions = PARTITIONS.to_string();
    let host = Consumer::start(
        ws.path(),
        &[
            "--from-nats",
            &url,
            "--durable",
            "central",
            "--nats-partitions",
            &partitions,
        ],
    );
    wait_until("the first calls", 60, || {
        host.stderr().contains("took partition")
    });
    std::thread::sleep(Duration::from_secs(1));
    let pid = nix::unistd::Pid::from_raw(host.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(17));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    // Every partition's consumer has nothing pending and nothing waiting for its ack.
    let js = client.jetstream();
    wait_until("every message acked", 120, || {
        client.rt.block_on(async {
            let mut done = 0;
            for k in 0..PARTITIONS {
                let name = format!("central-{k}");
                if let Ok(mut c) = js
                    .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                        name, "FLEET",
                    )
                    .await
                    && c.info()
                        .await
                        .is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
                {
                    done += 1;
                }
            }
            done == PARTITIONS
        })
    });
    let r = host.stop();
    let plugin = r["stats"]["plugins"]["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "misbehave")
        .unwrap_or_else(|| panic!("{r}"))
        .clone();
    let s = &r["stats"]["nats"]["consume"];
    eprintln!("a host stopped 17 s with plugin calls queued: misbehave {plugin}; consumer {s}");
    assert!(
        plugin["dropped_fenced"].as_u64().unwrap_or(0) > 0,
        "calls queued under the stale leases were made: {plugin}"
    );
    // (The call running when the host stopped may time out: its deadline is wall-clock.)
    assert!(
        plugin["ok"].as_u64().unwrap() + plugin["failed"].as_u64().unwrap() >= n as u64,
        "every event called: {plugin}"
    );
    assert_eq!(s["given_up"], 0, "{s}");
}
