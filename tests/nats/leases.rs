//! Partition leases under faults (docs/nats.md § Per-agent order across hosts): a lease whose
//! renewal the server confirmed late, a host stopped (SIGSTOP) past its lease, a server stopped
//! past the lease. Real `run --from-nats … --durable central --nats-partitions 8` hosts sharing
//! a de-dup bucket, a real publisher, a real nats-server paused and resumed with signals. The
//! hook logs each run's agent, event id, delivery count and reclaimed mark: an event that runs
//! a second time must carry a mark on that run (a delivery above 1 or `ZERO_HOOK_RECLAIMED`).

use super::partitions::{AGENTS, PARTITIONS, host_id, lease_holders, publish_partitioned};
use super::*;

/// A signal to a host.
fn signal(c: &Consumer, s: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.child.id() as i32), s).unwrap();
}

/// One run of the hook: the event (agent, place in its order), its delivery count and mark.
#[derive(Debug)]
#[allow(dead_code)] // `id`: shown when an assertion fails
struct Logged {
    event: (String, String),
    id: String,
    delivery: u64,
    reclaimed: bool,
}

fn logged(log: &Path) -> Vec<Logged> {
    log_lines(log)
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(5, ' ').collect();
            let v: Value = serde_json::from_str(f.get(4)?).ok()?;
            Some(Logged {
                event: (f[0].to_string(), v["output"].as_str()?.to_string()),
                id: f[1].to_string(),
                delivery: f[2].parse().unwrap_or(0),
                reclaimed: f[3] == "1",
            })
        })
        .collect()
}

/// The workspace of a host whose hook (`max_concurrent: 1`, `pause` seconds a run) appends a
/// line per run to `log`.
fn lease_workspace(log: &Path, pause: &str) -> tempfile::TempDir {
    let script = format!(
        "printf '%s %s %s %s %s\\n' \"$ZERO_HOOK_AGENT\" \"${{ZERO_HOOK_EVENT_ID:--}}\" \
         \"${{ZERO_HOOK_DELIVERY:-0}}\" \"${{ZERO_HOOK_RECLAIMED:-0}}\" \"$ZERO_HOOK_PAYLOAD\" >> {}; \
         sleep {pause}",
        log.display()
    );
    let hooks = sh_hook("order", &script, serde_json::json!({"max_concurrent": 1}));
    let ws = tempfile::tempdir().unwrap();
    write_hooks(ws.path(), &hooks);
    ws
}

fn host(url: &str, ws: &Path) -> Consumer {
    let partitions = PARTITIONS.to_string();
    Consumer::start(
        ws,
        &[
            "--from-nats",
            url,
            "--durable",
            "central",
            "--nats-partitions",
            &partitions,
            "--nats-dedup-bucket",
            "PRXRAN",
        ],
    )
}

/// Every run of an event after its first carries a mark (a delivery above 1, or reclaimed);
/// how many events ran twice.
fn every_second_run_is_marked(runs: &[Logged]) -> usize {
    let mut seen = HashSet::new();
    let mut unmarked = Vec::new();
    let mut twice = 0;
    for r in runs {
        if seen.insert(r.event.clone()) {
            continue;
        }
        twice += 1;
        if r.delivery <= 1 && !r.reclaimed {
            unmarked.push(r);
        }
    }
    assert!(
        unmarked.is_empty(),
        "{} second runs with DELIVERY=1 and no reclaimed mark: {:?}",
        unmarked.len(),
        &unmarked[..unmarked.len().min(5)]
    );
    twice
}

/// Waits until every one of `n` events ran at least once.
fn until_all_ran(log: &Path, n: usize, secs: u64) {
    wait_until("every event ran", secs, || {
        logged(log)
            .into_iter()
            .map(|r| r.event)
            .collect::<HashSet<_>>()
            .len()
            >= n
    });
}

/// A lone host whose lease renewals the server took but confirmed only after the client's
/// 2 s wait (the server stopped for 6 s while renewals were on their way) keeps its
/// partitions: it re-reads the holder, finds itself, and goes on. Before, it took its own
/// moved sequence for a takeover ("lost partition") and could claim only absent or freed
/// leases, so it stood locked out of its own partitions until they expired (~12 s).
#[test]
fn a_lone_host_keeps_its_partitions_through_renewals_confirmed_late() {
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    publish_partitioned(&url, 0..1);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let ws = lease_workspace(&log, "0");
    let c = host(&url, ws.path());
    until_all_ran(&log, AGENTS, 60);
    let me = host_id(&c).expect("the host took partitions");
    wait_until("every partition held", 30, || {
        let h = lease_holders(&client);
        h.len() == PARTITIONS as usize && h.values().all(|v| *v == me)
    });
    server.pause();
    std::thread::sleep(Duration::from_secs(6));
    server.resume();
    // Past the next renewals (every 2 s), then more events: they run at once.
    std::thread::sleep(Duration::from_secs(3));
    let resumed = Instant::now();
    publish_partitioned(&url, 1..2);
    until_all_ran(&log, 2 * AGENTS, 8);
    let took = resumed.elapsed();
    let err = c.stderr();
    let lost = err.lines().filter(|l| l.contains("lost partition")).count();
    let holders = lease_holders(&client);
    c.stop();
    eprintln!(
        "lone host: after a 6 s server stop, new events ran within {:.1} s; {lost} partitions lost",
        took.as_secs_f64()
    );
    assert_eq!(lost, 0, "the host lost its own partitions: {err}");
    assert!(
        holders.values().all(|v| *v == me),
        "the host still holds every partition: {holders:?}"
    );
}

/// Two hosts share the backlog; one is stopped with SIGSTOP past its lease (20 s; leases
/// expire 15 s after their last renewal), the other takes its partitions and runs what it had
/// taken (redelivered after the ack wait), then the stopped one is resumed. What it had queued
/// for the partitions it lost is not run there (fenced: a queued run starts only while its
/// partition's lease is fresh; losing it cancels the queue, nak'ed for the new holder): every
/// event that runs twice carries a mark on its second run. Before, the resumed host ran its
/// queue after logging "lost partition": about a hundred second runs with DELIVERY=1 and no
/// mark.
#[test]
fn a_host_stopped_past_its_lease_runs_nothing_unmarked_that_the_other_ran() {
    let per_agent = 40;
    let n = AGENTS * per_agent;
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    publish_partitioned(&url, 0..per_agent);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let (ws_a, ws_b) = (lease_workspace(&log, "0.01"), lease_workspace(&log, "0.01"));
    let a = host(&url, ws_a.path());
    let b = host(&url, ws_b.path());
    wait_until("a tenth ran", 60, || logged(&log).len() >= n / 10);
    let a_id = host_id(&a).expect("the first host took partitions");
    let held_by_a = lease_holders(&client)
        .values()
        .filter(|h| **h == a_id)
        .count();
    signal(&a, nix::sys::signal::Signal::SIGSTOP);
    let stopped = Instant::now();
    wait_until("the other host took every partition", 40, || {
        let h = lease_holders(&client);
        h.len() == PARTITIONS as usize && h.values().all(|v| !v.is_empty() && *v != a_id)
    });
    let taken = stopped.elapsed();
    // What the stopped host had taken is redelivered after the ack wait: let the survivor
    // run it before the stopped host resumes.
    std::thread::sleep(Duration::from_secs(20).saturating_sub(taken));
    signal(&a, nix::sys::signal::Signal::SIGCONT);
    until_all_ran(&log, n, 120);
    // The resumed host's queue had its chance to run.
    std::thread::sleep(Duration::from_secs(4));
    let runs = logged(&log);
    let a_err = a.stderr();
    let lost = a_err
        .lines()
        .filter(|l| l.contains("lost partition"))
        .count();
    let sa = a.stop()["stats"]["nats"]["consume"].clone();
    let sb = b.stop()["stats"]["nats"]["consume"].clone();
    let twice = every_second_run_is_marked(&runs);
    eprintln!(
        "a host stopped 20 s: it held {held_by_a} of {PARTITIONS}, taken over {:.1} s after; {} runs of {n} events, {twice} second runs (all marked); it logged {lost} lost; stats {sa} {sb}",
        taken.as_secs_f64(),
        runs.len()
    );
    assert!(held_by_a > 0, "the stopped host held partitions");
    assert!(lost > 0, "the resumed host saw its leases taken: {a_err}");
}

/// Two hosts hold four partitions each; the server is killed and started again 18 s later on
/// its port and store, longer than the lease (15 s), while both hold work: it comes back with
/// every lease expired.
/// Each host, alive throughout, takes its own partitions back before either claims another's:
/// the partitions stay where they were, and no event runs twice with DELIVERY=1 (what a host
/// had queued when its lease went stale is nak'ed and delivered again, not run stale).
/// Before, the hosts raced for the expired leases and swapped them.
#[test]
fn a_server_stopped_past_the_lease_leaves_each_partition_with_its_host() {
    let per_agent = 30;
    let n = AGENTS * per_agent;
    let server = NatsServer::start();
    let client = Client::connect(&server.url());
    let url = server.url();
    publish_partitioned(&url, 0..per_agent);
    let shared = tempfile::tempdir().unwrap();
    let log = shared.path().join("log");
    let (ws_a, ws_b) = (lease_workspace(&log, "0.05"), lease_workspace(&log, "0.05"));
    let a = host(&url, ws_a.path());
    let b = host(&url, ws_b.path());
    wait_until("the partitions shared", 60, || {
        let h = lease_holders(&client);
        let mut per: HashMap<&String, usize> = HashMap::new();
        for v in h.values() {
            *per.entry(v).or_default() += 1;
        }
        h.len() == PARTITIONS as usize && per.len() == 2 && per.values().all(|&k| k == 4)
    });
    wait_until("some ran", 60, || logged(&log).len() >= n / 12);
    let before = lease_holders(&client);
    let ran_before = logged(&log).len();
    let mut server = server;
    server.kill();
    std::thread::sleep(Duration::from_secs(18));
    server.restart();
    let resumed = Instant::now();
    wait_until("every partition held again", 30, || {
        let h = lease_holders(&client);
        h.len() == PARTITIONS as usize && h.values().all(|v| !v.is_empty())
    });
    // Past a few ticks: what is taken now stays.
    std::thread::sleep(Duration::from_secs(4));
    let after = lease_holders(&client);
    let held_again = resumed.elapsed();
    until_all_ran(&log, n, 120);
    std::thread::sleep(Duration::from_secs(1));
    let runs = logged(&log);
    let sa = a.stop()["stats"]["nats"]["consume"].clone();
    let sb = b.stop()["stats"]["nats"]["consume"].clone();
    let moved = before
        .iter()
        .filter(|(k, v)| after.get(k) != Some(v))
        .count();
    eprintln!(
        "server down 18 s: {ran_before} of {n} had run; {moved} of {PARTITIONS} partitions moved; settled {:.1} s after; {} runs; stats {sa} {sb}",
        held_again.as_secs_f64(),
        runs.len()
    );
    let twice = every_second_run_is_marked(&runs);
    eprintln!("{twice} second runs, all marked");
    assert!(ran_before < n, "work was in flight at the stop");
    assert_eq!(before, after, "the partitions stayed with their hosts");
}
