//! What an agent waits for when its hook runs `prx-hooks send`, beside the hook commands it
//! would otherwise run, in paired rounds of one process:
//!
//! * `/bin/true` — the floor of any command hook (fork, exec, wait);
//! * `python3 -c pass` — the usual script hook's start alone;
//! * `prx-hooks --version` — this binary's own start (loading, relocations, argument parsing);
//! * `prx-hooks send` — one tool_call on stdin delivered to a real `prx-hooks run --listen`
//!   over loopback (connect, POST, the 200 with the report);
//! * `prx-hooks send --from claude-code` — one Claude Code `PostToolUse` payload, translated
//!   by the server;
//! * the same three with `prx-hooks-send`, the small program `connect` writes into the agents'
//!   settings;
//! * `prx-hooks-send --from claude-code` on a decision point: a `PreToolUse` running
//!   `rm -rf build`, which the workspace's no-rm-rf policy denies (the answer printed on
//!   stdout), and one running `ls`, which no policy decides — beside the `PostToolUse` above,
//!   today's fire-and-forget `send` (docs/policies.md § Speed).
//!
//! Each round runs every command once, in a rotating order, timing spawn to exit. Printed:
//! p50/p90/p99 per command and `send`'s p50 as a multiple of `/bin/true`'s.
//!
//! `cargo bench --bench send` (`PRX_HOOKS_SEND_ROUNDS`, default 300; under `cargo test
//! --benches`, 20).

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");
const SEND_BIN: &str = env!("CARGO_BIN_EXE_prx-hooks-send");

struct Case {
    name: &'static str,
    program: String,
    args: Vec<String>,
    stdin: Vec<u8>,
    times: Vec<Duration>,
}

fn time(case: &Case) -> Duration {
    let start = Instant::now();
    let mut child = Command::new(&case.program)
        .args(&case.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", case.program));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&case.stdin);
    }
    let out = child.wait_with_output().unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}: {:?} {}",
        case.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn start_server(ws: &Path) -> std::process::Child {
    let hooks = r#"{"hooks": {"tool_call": [{"command": "/bin/true"}]}}"#;
    std::fs::write(ws.join("hooks.json"), hooks).unwrap();
    let policies = r#"{"policies": [{"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash",
        "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
        "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}]}"#;
    std::fs::write(ws.join("policies.json"), policies).unwrap();
    common::serve(BIN, ws)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not.
    let quick =
        !std::env::args().any(|a| a == "--bench") || std::env::args().any(|a| a == "--quick");
    let rounds: usize = std::env::var("PRX_HOOKS_SEND_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 20 } else { 300 });
    let ws = tempfile::tempdir().unwrap();
    let mut server = start_server(ws.path());
    let ws_arg = ws.path().display().to_string();
    let tool_call = br#"{"event":"tool_call","agent":"coder","session":"bench","payload":{"tool":"shell","success":true,"output":"ok"}}"#;
    let claude = br#"{"session_id":"bench","transcript_path":"/tmp/t.jsonl","cwd":"/tmp","permission_mode":"default","hook_event_name":"PostToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"tool_response":{"stdout":"a\nb\n","stderr":"","interrupted":false},"tool_use_id":"toolu_01"}"#;
    let pre = |command: &str| {
        format!(
            r#"{{"session_id":"bench","transcript_path":"/tmp/t.jsonl","cwd":"/tmp","permission_mode":"default","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{{"command":"{command}"}},"tool_use_id":"toolu_02"}}"#
        )
        .into_bytes()
    };
    let (denied, undecided) = (pre("rm -rf build"), pre("ls"));
    let case = |name, program: &str, args: &[&str], stdin: &[u8]| Case {
        name,
        program: program.to_string(),
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: stdin.to_vec(),
        times: Vec::with_capacity(rounds),
    };
    let mut cases = vec![
        case("/bin/true", "/bin/true", &[], b""),
        case("python3 -c pass", "python3", &["-c", "pass"], b""),
        case("prx-hooks --version", BIN, &["--version"], b""),
        case(
            "prx-hooks send",
            BIN,
            &["send", "--workspace", &ws_arg],
            tool_call,
        ),
        case(
            "prx-hooks send --from claude-code",
            BIN,
            &["send", "--from", "claude-code", "--workspace", &ws_arg],
            claude,
        ),
        case("prx-hooks-send --version", SEND_BIN, &["--version"], b""),
        case(
            "prx-hooks-send",
            SEND_BIN,
            &["--workspace", &ws_arg],
            tool_call,
        ),
        case(
            "prx-hooks-send --from claude-code",
            SEND_BIN,
            &["--from", "claude-code", "--workspace", &ws_arg],
            claude,
        ),
        case(
            "prx-hooks-send PreToolUse denied",
            SEND_BIN,
            &["--from", "claude-code", "--workspace", &ws_arg],
            &denied,
        ),
        case(
            "prx-hooks-send PreToolUse no decision",
            SEND_BIN,
            &["--from", "claude-code", "--workspace", &ws_arg],
            &undecided,
        ),
    ];
    // Warm the page cache and the server's first connection.
    for c in &cases {
        time(c);
    }
    // The decision point is one: the policy's deny comes back.
    let mut child = Command::new(SEND_BIN)
        .args(["--from", "claude-code", "--workspace", &ws_arg])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(&denied);
    let said = child.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&said.stdout).contains("\"deny\""),
        "{said:?}"
    );
    for round in 0..rounds {
        let n = cases.len();
        for k in 0..n {
            let c = &mut cases[(round + k) % n];
            let t = time(c);
            c.times.push(t);
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    println!("send/ {rounds} paired rounds (spawn to exit, wall clock)");
    let mut p50 = Vec::new();
    for c in &mut cases {
        c.times.sort();
        let (a, b, d) = (pct(&c.times, 0.5), pct(&c.times, 0.9), pct(&c.times, 0.99));
        p50.push(a);
        println!(
            "  {:<34} p50 {:>9}  p90 {:>9}  p99 {:>9}",
            c.name,
            ms(a),
            ms(b),
            ms(d)
        );
    }
    let ratio = |i: usize| p50[i].as_secs_f64() / p50[0].as_secs_f64();
    println!(
        "  send p50 = {:.1}× /bin/true, {:.2}× python3 -c pass (target: ≤ 3 ms and ≤ 4× /bin/true)",
        ratio(3),
        p50[3].as_secs_f64() / p50[1].as_secs_f64()
    );
    println!("  send --from claude-code p50 = {:.1}× /bin/true", ratio(4));
    let of = |i: usize| p50[i].as_secs_f64() / p50[7].as_secs_f64();
    println!(
        "  prx-hooks-send on a decision point p50 = {:.2}× (denied), {:.2}× (no decision) the fire-and-forget PostToolUse (target: ≤ 1.1×)",
        of(8),
        of(9)
    );
    println!(
        "  prx-hooks-send p50 = {:.1}× /bin/true, --from claude-code {:.1}× (target: ≤ 3 ms and ≤ 4× /bin/true)",
        ratio(6),
        ratio(7)
    );
}
