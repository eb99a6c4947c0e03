//! Policies: one decision against 100 rules, with a typical PreToolUse payload (target,
//! docs/policies.md: p50 ≤ 2 µs per decision), beside a `regex::RegexSet` match of the same
//! 100 patterns measured in the same run.
//!
//! The 100 rules are what a team's file looks like grown large: 60 regex rules on
//! `arguments.command` for the four agents' shell tools (the contract's `rm -rf` rule among
//! them), 20 glob rules on `arguments.file_path` for `Write|Edit`, 10 prefix rules, 10 rules on
//! other tools; the payload is a Bash call that matches none, so every rule is looked at (the
//! slowest case: a deny stops early).
//!
//! Group `policy`:
//! * `rules_100_value`: `PolicyTable::decide` with the payload already parsed.
//! * `rules_100_text`: `Hooks::decide` with the payload's JSON text (what `POST /api/decide`
//!   and the Claude Code door pay: parse, decide, count).
//! * `baseline/regexset_100`: `RegexSet::is_match` of the 100 rules' patterns (as regexes)
//!   against the command alone.
//!
//! Group `policy_wasm` (with the `wasm` feature; needs `bash examples/build-plugins.sh`):
//! * `wasm_noop`: `Hooks::decide` with the same payload's JSON text in a workspace whose only
//!   policy is the `policy-misbehave` guest in mode `noop` (a WASM policy answering no
//!   decision): take a pooled instance, refill its fuel, set its deadline, call `decide`,
//!   give the instance back, count (target ≤ 10 µs).
//!
//! Group `policy_http` (a real `Server` on loopback, one kept-alive ureq connection; target
//! ≤ 3× `GET /healthz`):
//! * `http_decide`: `POST /api/decide` with the same payload against the same 100 rules;
//! * `http_healthz`: `GET /healthz` on the same server, the transport floor.
//!
//! FLOOD (after criterion, `--bench` only): whether 10,000 decisions/s over HTTP delay `emit`
//! or hook runs. 24 rounds alternate "flood on" and "flood off" (which goes first alternates);
//! each round times 4,000 emits one by one (a bus subscriber drains them, so they are queued,
//! not skipped) and 6 `tool_call` events from emit to the end of their `/bin/true` hook's run
//! (the run feed). Two client threads, each on its own kept-alive connection, pace
//! `POST /api/decide` at 5,000/s each while the flood is on; the rate reached is printed.

mod common;

use common::*;
use criterion::Criterion;
use prx_hooks::http::{HttpOptions, Server, Token};
use prx_hooks::policy::{DecisionPoint, PolicyTable, parse};
use prx_hooks::{Event, Hooks};
use serde_json::json;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-token-0123456789abcdef";

const PAYLOAD: &str = r#"{"tool":"Bash","arguments":{"command":"cargo test --release --test library policies -- --nocapture","description":"Run the policy tests"},"session_id":"0f9c2b1e-2f43-4d6e-9a51-6c1d2f0e9b7a","hook_event_name":"PreToolUse","cwd":"/home/dev/src/app"}"#;

/// The 100 rules, and each rule's pattern as a regex (for the baseline).
fn rules() -> (String, Vec<String>) {
    let mut policies = Vec::new();
    let mut patterns = Vec::new();
    let shell = "Bash|shell|run_shell_command|exec_command";
    policies.push(
        json!({"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": shell,
        "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
        "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}),
    );
    patterns.push("\\brm\\s+-[a-zA-Z]*[rf]".to_string());
    let words = [
        "curl", "wget", "sudo", "chmod", "chown", "dd", "mkfs", "shutdown", "reboot", "kill",
    ];
    for i in 1..60 {
        let w = words[i % words.len()];
        let re = format!("\\b{w}\\s+.*--danger{i}\\b");
        policies.push(json!({"id": format!("cmd-{i}"), "on": ["tool_call_start"], "matcher": shell,
            "when": {"arguments.command": {"regex": re}}, "decision": if i % 3 == 0 { "ask" } else { "deny" },
            "reason": format!("rule {i}")}));
        patterns.push(re);
    }
    for i in 0..20 {
        let g = format!("*/secrets{i}/*");
        policies.push(json!({"id": format!("file-{i}"), "on": ["tool_call_start", "permission"],
            "matcher": "Write|Edit", "when": {"arguments.file_path": {"glob": g}}, "decision": "deny"}));
        patterns.push(format!("^.*/secrets{i}/.*$"));
    }
    for i in 0..10 {
        let p = format!("git push origin release-{i}");
        policies.push(
            json!({"id": format!("prefix-{i}"), "on": ["tool_call_start"], "matcher": shell,
            "when": {"arguments.command": {"prefix": p}}, "decision": "ask"}),
        );
        patterns.push(format!("^{}", regex::escape(&p)));
    }
    for i in 0..10 {
        policies.push(json!({"id": format!("tool-{i}"), "on": ["tool_call_start"],
            "matcher": format!("mcp__server{i}__*"), "decision": "ask"}));
        patterns.push(format!("^mcp__server{i}__"));
    }
    assert_eq!(policies.len(), 100);
    (json!({ "policies": policies }).to_string(), patterns)
}

fn bench(c: &mut Criterion) {
    let (text, patterns) = rules();
    let table: PolicyTable = parse(text.as_bytes(), "policies.json").expect("valid");
    let payload: serde_json::Value = serde_json::from_str(PAYLOAD).unwrap();
    let command = payload["arguments"]["command"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        table
            .decide(DecisionPoint::ToolCallStart, "claude-code", &payload)
            .decision,
        None,
        "the payload must match no rule (every rule looked at)"
    );
    let set = regex::RegexSet::new(&patterns).unwrap();
    assert!(!set.is_match(&command));

    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("policies.json"), &text).unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    assert_eq!(hooks.policy_table().policies.len(), 100);

    let mut g = c.benchmark_group("policy");
    g.bench_function("rules_100_value", |b| {
        b.iter(|| {
            black_box(table.decide(
                DecisionPoint::ToolCallStart,
                black_box("claude-code"),
                black_box(&payload),
            ))
        })
    });
    g.bench_function("rules_100_text", |b| {
        b.iter(|| {
            black_box(
                hooks
                    .decide(
                        DecisionPoint::ToolCallStart,
                        black_box("claude-code"),
                        black_box(PAYLOAD),
                    )
                    .unwrap(),
            )
        })
    });
    g.finish();
    let mut g = c.benchmark_group("baseline");
    g.bench_function("regexset_100", |b| {
        b.iter(|| black_box(set.is_match(black_box(&command))))
    });
    g.finish();
    hooks.shutdown(std::time::Duration::from_secs(2));
}

/// A workspace with the 100 rules and a `tool_call` hook (`/bin/true`), served over loopback.
struct Served {
    _ws: tempfile::TempDir,
    hooks: Arc<Hooks>,
    server: Server,
}

fn serve(rules: &str) -> Served {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("policies.json"), rules).unwrap();
    std::fs::write(
        ws.path().join("hooks.json"),
        r#"{"hooks": {"tool_call": [{"id": "audit", "command": "/bin/true"}]}}"#,
    )
    .unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    assert_eq!(hooks.policy_table().policies.len(), 100);
    let opts = HttpOptions::new(Token::new(TOKEN, "bench").unwrap());
    let server = Server::start(hooks.clone(), opts, "127.0.0.1:0".parse().unwrap()).unwrap();
    Served {
        _ws: ws,
        hooks,
        server,
    }
}

/// A kept-alive client: `decide()` posts the payload to `/api/decide`, `healthz()` gets it.
struct Client {
    agent: ureq::Agent,
    base: String,
    auth: String,
    body: String,
}

impl Client {
    fn new(s: &Served) -> Client {
        Client {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(true)
                .build()
                .into(),
            base: format!("http://{}", s.server.local_addr()),
            auth: format!("Bearer {TOKEN}"),
            body: format!(
                r#"{{"event":"tool_call_start","agent":"claude-code","session":"s1","payload":{PAYLOAD}}}"#
            ),
        }
    }

    fn decide(&self) -> usize {
        let mut resp = self
            .agent
            .post(format!("{}/api/decide", self.base))
            .header("authorization", &self.auth)
            .header("content-type", "application/json")
            .send(self.body.as_str())
            .expect("decide");
        resp.body_mut().read_to_vec().expect("body").len()
    }

    fn healthz(&self) -> usize {
        let mut resp = self
            .agent
            .get(format!("{}/healthz", self.base))
            .call()
            .expect("healthz");
        resp.body_mut().read_to_vec().expect("body").len()
    }
}

fn bench_http(c: &mut Criterion, served: &Served) {
    let client = Client::new(served);
    let answer = {
        let mut resp = client
            .agent
            .post(format!("{}/api/decide", client.base))
            .header("authorization", &client.auth)
            .header("content-type", "application/json")
            .send(client.body.as_str())
            .unwrap();
        resp.body_mut().read_to_string().unwrap()
    };
    assert!(answer.starts_with(r#"{"decision":null"#), "{answer}");
    let mut g = c.benchmark_group("policy_http");
    g.bench_function("http_decide", |b| b.iter(|| client.decide()));
    g.bench_function("http_healthz", |b| b.iter(|| client.healthz()));
    g.finish();
}

/// Quantile `p` of `v` (sorted here).
fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// What one condition (flood on or off) measured over its rounds.
#[derive(Default)]
struct Side {
    emit_ns: Vec<f64>,
    /// Per round: the median emit, for the paired ratios.
    emit_round_p50: Vec<f64>,
    hook_ms: Vec<f64>,
    hook_round_p50: Vec<f64>,
}

fn flood(served: &Served) {
    const ROUNDS: usize = 24;
    const EMITS: usize = 4_000;
    const HOOK_RUNS: usize = 6;
    const PER_THREAD: u64 = 5_000; // decisions/s, two threads
    let hooks = &served.hooks;
    let on = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            let (on, stop, sent) = (on.clone(), stop.clone(), sent.clone());
            let client = Client::new(served);
            std::thread::spawn(move || {
                let gap = Duration::from_nanos(1_000_000_000 / PER_THREAD);
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if !on.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(1));
                        next = Instant::now();
                        continue;
                    }
                    client.decide();
                    sent.fetch_add(1, Ordering::Relaxed);
                    next += gap;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    } else if now - next > Duration::from_millis(50) {
                        next = now; // behind: no burst to catch up
                    }
                }
            })
        })
        .collect();
    // The emits' listener: a subscriber drained on its own thread.
    let sub = hooks.bus().subscribe("prx.lifecycle.llm_request").unwrap();
    let drain_stop = stop.clone();
    let drain = std::thread::spawn(move || {
        while !drain_stop.load(Ordering::Relaxed) {
            let _ = sub.recv_timeout(Duration::from_millis(20));
        }
    });
    let runs = hooks.shell().expect("shell hooks").subscribe_runs(1024);
    let em = hooks.emitter("bench", "flood");
    let mut sides = [Side::default(), Side::default()]; // [off, on]
    let mut flood_time = Duration::ZERO;
    let mut flood_sent = 0;
    for round in 0..ROUNDS * 2 {
        let flooding = (round % 2 == 0) == (round / 2 % 2 == 0);
        on.store(flooding, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100)); // the flood reaches its pace
        let (t0, s0) = (Instant::now(), sent.load(Ordering::Relaxed));
        let side = &mut sides[usize::from(flooding)];
        let mut round_emits = Vec::with_capacity(EMITS);
        for _ in 0..EMITS {
            let t = Instant::now();
            black_box(em.emit(Event::LlmRequest {
                provider: "anthropic",
                model: "claude",
                messages_count: 3,
            }));
            round_emits.push(t.elapsed().as_nanos() as f64);
        }
        let mut round_hooks = Vec::with_capacity(HOOK_RUNS);
        for _ in 0..HOOK_RUNS {
            while runs.try_recv().is_some() {}
            let t = Instant::now();
            em.emit(Event::ToolCall {
                tool: "shell",
                success: true,
                output: "ok",
            });
            runs.recv_timeout(Duration::from_secs(10))
                .expect("a hook run");
            round_hooks.push(t.elapsed().as_secs_f64() * 1e3);
            std::thread::sleep(Duration::from_millis(10));
        }
        if flooding {
            flood_time += t0.elapsed();
            flood_sent += sent.load(Ordering::Relaxed) - s0;
        }
        side.emit_round_p50
            .push(quantile(&mut round_emits.clone(), 0.5));
        side.hook_round_p50
            .push(quantile(&mut round_hooks.clone(), 0.5));
        side.emit_ns.extend(round_emits);
        side.hook_ms.extend(round_hooks);
    }
    on.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    drain.join().unwrap();
    let [off, fl] = &mut sides;
    println!(
        "\nFLOOD ({ROUNDS} rounds each, alternated): POST /api/decide at {:.0}/s while on (target 10,000/s)",
        flood_sent as f64 / flood_time.as_secs_f64()
    );
    for (what, a, b, unit) in [
        ("emit", &mut off.emit_ns, &mut fl.emit_ns, "ns"),
        (
            "tool_call emit -> hook run end",
            &mut off.hook_ms,
            &mut fl.hook_ms,
            "ms",
        ),
    ] {
        println!(
            "{what:<32} off: p50 {:.1} p99 {:.1} {unit}   on: p50 {:.1} p99 {:.1} {unit}",
            quantile(a, 0.5),
            quantile(a, 0.99),
            quantile(b, 0.5),
            quantile(b, 0.99)
        );
    }
    let ratios = |a: &[f64], b: &[f64]| {
        let mut r: Vec<f64> = b.iter().zip(a).map(|(on, off)| on / off).collect();
        let (q1, q2, q3) = (
            quantile(&mut r, 0.25),
            quantile(&mut r, 0.5),
            quantile(&mut r, 0.75),
        );
        format!("median {q2:.3}x (quartiles {q1:.3}x .. {q3:.3}x)")
    };
    println!(
        "per-round p50, on / off: emit {}; hook run {}",
        ratios(&off.emit_round_p50, &fl.emit_round_p50),
        ratios(&off.hook_round_p50, &fl.hook_round_p50)
    );
    let p = hooks.stats();
    let p = p.policies().expect("policies");
    println!(
        "decisions counted: {} (none) {} (refused)",
        p.none, p.refused
    );
}

/// Group `policy_wasm`: a workspace whose only policy is the no-op WASM guest (skipped,
/// said, when the guest is not built).
#[cfg(feature = "wasm")]
fn bench_wasm(c: &mut Criterion) {
    let guest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/plugins/target/wasm32-wasip2/release/policy_misbehave.wasm");
    if !guest.is_file() {
        println!(
            "policy_wasm: skipped, {} is missing (bash examples/build-plugins.sh)",
            guest.display()
        );
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().join("plugins/noop");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&guest, dir.join("plugin.wasm")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        "[plugin]\nname = \"noop\"\nversion = \"0.1.0\"\n\n[policy]\non = [\"tool_call_start\"]\n\n[config]\nmode = \"noop\"\n",
    )
    .unwrap();
    let hooks = Hooks::builder().workspace(ws.path()).build().unwrap();
    let v = hooks
        .decide(DecisionPoint::ToolCallStart, "claude-code", PAYLOAD)
        .unwrap();
    assert_eq!(v.decision, None);
    let stats = hooks.stats();
    let p = stats.policies().unwrap();
    assert_eq!(p.plugins.len(), 1, "the no-op policy is loaded");
    assert_eq!(p.plugins[0].none, 1, "and answered: {:?}", p.plugins[0]);
    let mut g = c.benchmark_group("policy_wasm");
    g.bench_function("wasm_noop", |b| {
        b.iter(|| {
            black_box(
                hooks
                    .decide(
                        DecisionPoint::ToolCallStart,
                        black_box("claude-code"),
                        black_box(PAYLOAD),
                    )
                    .unwrap(),
            )
        })
    });
    g.finish();
    let stats = hooks.stats();
    let w = &stats.policies().unwrap().plugins[0];
    assert_eq!(w.calls, w.none, "every call answered: {w:?}");
    hooks.shutdown(Duration::from_secs(2));
}

fn main() {
    process_start();
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    #[cfg(feature = "wasm")]
    bench_wasm(&mut c);
    let served = serve(&rules().0);
    bench_http(&mut c, &served);
    c.final_summary();
    if bench_mode() && std::env::var_os("PRX_BENCH_NO_FLOOD").is_none() {
        flood(&served);
    }
    let Served { hooks, server, .. } = served;
    drop(server);
    hooks.shutdown(Duration::from_secs(2));
    if !bench_mode() {
        return; // test mode
    }
    println!("\nRATIOS (same run)");
    print_time_ratio("policy/rules_100_value", "baseline/regexset_100");
    print_time_ratio("policy/rules_100_text", "baseline/regexset_100");
    print_time_ratio("policy_http/http_decide", "policy_http/http_healthz");
    println!("\nTARGETS");
    print_target("policy/rules_100_value", 2000.0);
    print_target("policy/rules_100_text", 2000.0);
    print_target("policy_wasm/wasm_noop", 10_000.0);
    if let Some(h) = median_ns("policy_http/http_healthz") {
        print_target("policy_http/http_decide", 3.0 * h);
    }
    print_machine_note();
}
