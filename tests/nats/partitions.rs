//! Per-agent order across hosts (docs/nats.md § Per-agent order across hosts): hosts sharing
//! `--durable central --nats-partitions 8` and a de-dup bucket, through a backlog of 24 agents'
//! events, while the fleet changes: a host SIGKILLed, a host stopped with SIGTERM, a host
//! joining. In each, every event runs, every agent's events run first in the agent's order,
//! and the partitions end up held by the hosts that are up, within a bound the test prints.
//!
//! Also: a host pulls each partition on its own, so one busy agent over 8 partitions runs about
//! as fast as without partitions; and the partition format is versioned.
//!
//! Sizes: `PRX_HOOKS_NATS_ORDER_EVENTS` (default 1,800), `PRX_HOOKS_NATS_SPREAD_EVENTS` (default
//! 1,000).

use super::fleet::reclaimed_ids;
use super::*;

/// What happens to the fleet a third of the way through the backlog.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    /// The first host is SIGKILLed: its leases expire (15 s) and the others take them.
    Kill,
    /// The first host is sent SIGTERM: it finishes what it took, frees its leases, and the
    /// others take them at their next tick, long before a lease would expire.
    Term,
    /// One more host starts: the first drains partitions one at a time until each holds its
    /// fair share.
    Join,
}

pub(super) const AGENTS: usize = 24;
pub(super) const PARTITIONS: u32 = 8;

/// Publishes, for each `i` of `range`, one tool_call event of every agent (`agent-0` …), agent
/// by agent in turn, through a real `run --nats … --nats-stream FLEET --nats-partitions 8`
/// (which creates the stream). Each event's `output` is its `i`: the agent's order.
pub(super) fn publish_partitioned(url: &str, range: std::ops::Range<usize>) {
    publish_agents(url, AGENTS, range);
}

/// [`publish_partitioned`] for `agents` agents.
pub(super) fn publish_agents(url: &str, agents: usize, range: std::ops::Range<usize>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.ndjson");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    for i in range {
        for a in 0..agents {
            writeln!(f, "{}", tool_call_line(&format!("agent-{a}"), i)).unwrap();
        }
    }
    f.flush().unwrap();
    drop(f);
    let partitions = PARTITIONS.to_string();
    let out = run_events(
        dir.path(),
        &file,
        &[
            "--nats",
            url,
            "--nats-stream",
            "FLEET",
            "--nats-partitions",
            &partitions,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Partition → holder (a host's instance id; "" when free), read from the lease bucket.
pub(super) fn lease_holders(client: &Client) -> HashMap<u32, String> {
    let js = client.jetstream();
    client.rt.block_on(async {
        let mut out = HashMap::new();
        let Ok(s) = js.get_stream("KV_PRXH_FLEET_central").await else {
            return out;
        };
        for k in 0..PARTITIONS {
            if let Ok(m) = s
                .get_last_raw_message_by_subject(&format!("$KV.PRXH_FLEET_central.p.{k}"))
                .await
            {
                out.insert(k, String::from_utf8_lossy(&m.payload).into_owned());
            }
        }
        out
    })
}

/// A host's instance id, from its log of the partitions it took.
pub(super) fn host_id(c: &Consumer) -> Option<String> {
    let err = c.stderr();
    let l = err.lines().find(|l| l.contains(": took partition"))?;
    let rest = &l[l.find("NATS consumer ")? + 14..];
    Some(rest[..rest.find(':')?].to_string())
}

/// Waits (at most `secs`) until `cond` holds of the lease table; how long that took.
fn leases_until(
    client: &Client,
    secs: u64,
    what: &str,
    cond: impl Fn(&HashMap<u32, String>) -> bool,
) -> Duration {
    let from = Instant::now();
    loop {
        let now = lease_holders(client);
        if now.len() == PARTITIONS as usize && cond(&now) {
            return from.elapsed();
        }
        assert!(
            from.elapsed() < Duration::from_secs(secs),
            "{what}: not after {secs} s: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One line of the shared log: the agent and the event's place in its agent's order.
fn parse_run(line: &str) -> (String, u64) {
    let (agent, payload) = line.split_once(' ').unwrap();
    let v: Value = serde_json::from_str(payload).unwrap();
    let i = v["output"].as_str().unwrap().parse().unwrap();
    (agent.to_string(), i)
}

/// Per agent, the order of each event's first run; and how many runs were second runs.
fn first_runs(log: &Path) -> (HashMap<String, Vec<u64>>, usize) {
    let mut first: HashMap<String, Vec<u64>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut twice = 0;
    for l in log_lines(log) {
        let run = parse_run(&l);
        if !seen.insert(run.clone()) {
            twice += 1;
            continue;
        }
        first.entry(run.0).or_default().push(run.1);
    }
    (first, twice)
}

/// An inversion is an event that first ran after a later one of its agent had.
fn inversions(first: &HashMap<String, Vec<u64>>) -> usize {
    let mut n = 0;
    for seqs in first.values() {
        let mut max = None;
        for &s in seqs {
            if max.is_some_and(|m| s < m) {
                n += 1;
            }
            max = max.max(Some(s));
        }
    }
    n
}

/// `hosts` hosts take a backlog; a third of the way through, `change` happens to the fleet.
/// In the one log all hosts' hooks append to (a hook of `max_concurrent: 1`, so that one host
/// runs an agent's events one at a time), every agent's events run first in the agent's order.
/// A kill may leave events that run twice, all among what the survivors logged as reclaimed; a
/// SIGTERM or a join runs every event exactly once.
fn partitions_through(change: Change, hosts: usize) {
    let per_agent = env_n("PRX_HOOKS_NATS_ORDER_EVENTS", 1_800) / AGENTS;
    let n = AGENTS * per_agent;
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    // A joining host needs work still to come: the second half is published after it starts.
    let first_part = if change == Change::Join {
        per_agent / 2
    } else {
        per_agent
    };
    publish_partitioned(&url, 0..first_part);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let script = format!(
        "printf '%s %s\\n' \"$ZERO_HOOK_AGENT\" \"$ZERO_HOOK_PAYLOAD\" >> {}",
        log.display()
    );
    let hooks = sh_hook("order", &script, serde_json::json!({"max_concurrent": 1}));
    let partitions = PARTITIONS.to_string();
    let args = [
        "--from-nats",
        url.as_str(),
        "--durable",
        "central",
        "--nats-partitions",
        partitions.as_str(),
        "--nats-dedup-bucket",
        "PRXRAN",
    ];
    let start = || {
        let ws = tempfile::tempdir().unwrap();
        write_hooks(ws.path(), &hooks);
        let c = Consumer::start(ws.path(), &args);
        (ws, c)
    };
    let mut running: Vec<_> = (0..hosts).map(|_| start()).collect();
    let runs = || log_lines(&log).len();
    wait_until("a third ran", 120, || runs() >= first_part * AGENTS / 3);
    let first_id = host_id(&running[0].1).expect("the first host took a partition");
    let before = lease_holders(&client);
    let held_by_first = before.values().filter(|h| **h == first_id).count();
    let mut stopped = None;
    let (settled, what) = match change {
        Change::Kill | Change::Term => {
            let (ws, mut c) = running.remove(0);
            let changed = Instant::now();
            if change == Change::Kill {
                c.child.kill().unwrap();
                let _ = c.child.wait();
            } else {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(c.child.id() as i32),
                    nix::sys::signal::Signal::SIGTERM,
                )
                .unwrap();
                stopped = Some((ws, c));
            }
            // A kill waits for the leases to expire (15 s; the stated bound is 20 s); a
            // SIGTERM frees them as the host exits.
            let bound = if change == Change::Kill { 30 } else { 10 };
            leases_until(
                &client,
                bound,
                "the stopped host's partitions taken over",
                |now| now.values().all(|h| !h.is_empty() && *h != first_id),
            );
            (changed.elapsed(), "all held by the others")
        }
        Change::Join => {
            running.push(start());
            let joined = Instant::now();
            for k in 0..4 {
                let from = first_part + (per_agent - first_part) * k / 4;
                let to = first_part + (per_agent - first_part) * (k + 1) / 4;
                publish_partitioned(&url, from..to);
                std::thread::sleep(Duration::from_millis(700));
            }
            let fair = (PARTITIONS as usize).div_ceil(running.len());
            leases_until(&client, 60, "the partitions shared fairly", |now| {
                let mut per: HashMap<&String, usize> = HashMap::new();
                for h in now.values() {
                    *per.entry(h).or_default() += 1;
                }
                per.len() == running.len()
                    && per.keys().all(|h| !h.is_empty())
                    && per.values().all(|&k| k <= fair)
            });
            (joined.elapsed(), "shared fairly by both")
        }
    };
    wait_until("every event ran", 180, || {
        log_lines(&log)
            .iter()
            .map(|l| parse_run(l))
            .collect::<HashSet<_>>()
            .len()
            >= n
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut reclaimed = 0;
    for (_, c) in &running {
        reclaimed += reclaimed_ids(c).len();
    }
    let (first, twice) = first_runs(&log);
    let inverted = inversions(&first);
    let mut stats = Vec::new();
    if let Some((_ws, c)) = stopped {
        stats.push(c.stop()["stats"]["nats"]["consume"].clone());
    }
    for (_, c) in running {
        stats.push(c.stop()["stats"]["nats"]["consume"].clone());
    }
    eprintln!(
        "partitions, {hosts} hosts, {change:?}: {n} events of {AGENTS} agents; the first host held {held_by_first} of {PARTITIONS} partitions, {what} {:.1} s after; {inverted} inversions, {twice} ran twice, {reclaimed} reclaimed; hosts: {stats:?}",
        settled.as_secs_f64()
    );
    assert!(
        held_by_first > 0,
        "the first host held partitions: {before:?}"
    );
    assert_eq!(first.len(), AGENTS);
    for (a, seqs) in &first {
        assert_eq!(seqs.len(), per_agent, "{a}: every event ran");
    }
    assert_eq!(inverted, 0, "an agent's events ran out of order");
    if change == Change::Kill {
        assert!(
            twice <= reclaimed,
            "{twice} ran twice, {reclaimed} reclaimed"
        );
    } else {
        assert_eq!((twice, reclaimed), (0, 0), "nothing runs twice: {stats:?}");
    }
}

#[test]
fn two_hosts_with_partitions_keep_each_agents_order_when_one_is_killed() {
    partitions_through(Change::Kill, 2);
}

#[test]
fn three_hosts_with_partitions_keep_each_agents_order_when_one_is_killed() {
    partitions_through(Change::Kill, 3);
}

#[test]
fn a_host_stopped_with_sigterm_frees_its_partitions_at_once_and_nothing_runs_twice() {
    partitions_through(Change::Term, 2);
}

#[test]
fn a_host_joining_takes_its_share_of_the_partitions_and_order_holds() {
    partitions_through(Change::Join, 1);
}

/// A host with a `/bin/sh` hook that appends a line per run, consuming `args`; its log.
fn counting_host(url: &str, args: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, Consumer) {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let script = format!("echo x >> {}", log.display());
    let hooks = sh_hook("count", &script, Value::Null);
    write_hooks(ws.path(), &hooks);
    let mut all = vec!["--from-nats", url];
    all.extend_from_slice(args);
    let c = Consumer::start(ws.path(), &all);
    (ws, log, c)
}

/// How long a host took (from its start) until its hook ran `n` times; its report.
fn time_host(url: &str, args: &[&str], n: usize) -> (Duration, Value) {
    let from = Instant::now();
    let (_ws, log, c) = counting_host(url, args);
    let bound = Duration::from_secs(120 + n as u64 / 10);
    while log_lines(&log).len() < n {
        assert!(
            from.elapsed() < bound,
            "{} of {n} ran in {bound:?}: {}",
            log_lines(&log).len(),
            c.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = from.elapsed();
    (took, c.stop())
}

/// One agent's events all land in one partition of 8: the host must pull that partition
/// again as soon as a pull of it ends, not wait for the seven empty ones' pulls to expire.
/// The same backlog is consumed twice in one run, without partitions and with them; with them
/// it may take three times as long and 5 s more (a loaded machine; the leases' first tick),
/// no more. A host that pulled all its partitions in rounds, each ending when the last pull
/// expired, took about 16 events per 500 ms.
#[test]
fn one_busy_agent_over_eight_partitions_is_not_held_back_by_the_empty_ones() {
    let n = env_n("PRX_HOOKS_NATS_SPREAD_EVENTS", 1_000);
    let server = NatsServer::start();
    let url = server.url();
    publish_agents(&url, 1, 0..n);
    let flat_args = ["--durable", "flat", "--from-nats-stream", "FLEET"];
    let (flat, _) = time_host(&url, &flat_args, n);
    let partitions = PARTITIONS.to_string();
    let part_args = [
        "--durable",
        "part",
        "--nats-partitions",
        partitions.as_str(),
    ];
    let (parted, r) = time_host(&url, &part_args, n);
    let s = &r["stats"]["nats"]["consume"];
    eprintln!(
        "{n} events of one agent: without partitions {:.1} s, over {PARTITIONS} partitions {:.1} s; {s}",
        flat.as_secs_f64(),
        parted.as_secs_f64()
    );
    assert!(
        parted <= 3 * flat + Duration::from_secs(5),
        "over partitions {parted:?}, without {flat:?}"
    );
}

/// A stream holding messages of the earlier partition format (a bare number after the event,
/// FNV-1a modulo N): a partitioned consumer of this version reads none of them and says so,
/// with their number, rather than leaving them unread unknowingly.
#[test]
fn a_partitioned_consumer_says_when_the_stream_holds_the_earlier_partition_format() {
    let server = NatsServer::start();
    let url = server.url();
    let client = Client::connect(&url);
    fleet_stream(&client);
    let js = client.jetstream();
    client.rt.block_on(async {
        for i in 0..3 {
            let body = format!(r#"{{"tool":"t","success":true,"output":"old-{i}"}}"#);
            js.publish("prx.lifecycle.tool_call.3", body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });
    publish_agents(&url, 2, 0..2);
    let partitions = PARTITIONS.to_string();
    let (_ws, log, c) = counting_host(
        &url,
        &[
            "--durable",
            "part",
            "--nats-partitions",
            partitions.as_str(),
        ],
    );
    wait_until("the new format's events ran", 60, || {
        log_lines(&log).len() >= 4
    });
    wait_until("the warning", 30, || {
        c.stderr().contains("earlier partition format")
    });
    let err = c.stderr();
    let r = c.stop();
    assert_eq!(log_lines(&log).len(), 4, "{r}");
    let line = err
        .lines()
        .find(|l| l.contains("earlier partition format"))
        .unwrap();
    assert!(line.contains("3 messages"), "{line}");
}
