//! The HTTP API's cost over the work it fronts, measured with a real client (ureq, one
//! keep-alive connection) against a real `Server` on loopback, in the same process.
//!
//! Group `api_read`:
//! * `editor_list`: `HooksEditor::list()` called directly (read + parse + flatten hooks.json);
//! * `http_list`: `GET /api/hooks` — the same, plus auth, the blocking-pool hop, JSON and HTTP;
//! * `http_healthz`: `GET /healthz`, the transport floor (no file, no auth);
//! * `http_metrics`: `GET /metrics` (a stats snapshot rendered by prometheus-client).
//!
//! Group `api_write`:
//! * `editor_toggle`: `HooksEditor::toggle` + `Hooks::apply_hooks_file` directly (validate,
//!   temp file, fsync, rename, directory fsync, table live);
//! * `http_toggle`: `PATCH /api/hooks/{id}/toggle`, the same through the API.
//!
//! Group `api_limits` — what the hostile-client defences cost per request: `Server` (hyper
//! driven by our own connection loop: header-read timer, write-stall deadline, connection cap,
//! Host/Origin check) against the same router served by plain `axum::serve` (none of that),
//! both on two runtime threads:
//! * `server_healthz` / `axum_serve_healthz`: `GET /healthz` on a kept-alive connection;
//! * `server_new_conn` / `axum_serve_new_conn`: connect, `GET /healthz`, close (the accept
//!   path: cap accounting, per-connection timer and task).
//!
//! RATIOS prints each API route against its direct call, and the per-request overhead, and
//! each limited server against plain axum (1.0 = the limits cost nothing). On a shared,
//! loaded machine two criterion runs taken a minute apart differ by more than the limits can
//! cost, so PAIRED measures the two servers in alternation instead — 60 rounds, each running a
//! batch (50 requests, or 10 connections) on one server then the same batch on the other (in
//! alternating order) — and prints the median and quartiles of the per-round ratios of wall
//! time and of the CPU time the serving runtime's threads spent (schedstat), which is what the
//! limits would add and which the machine's load moves less.

mod common;

use common::*;
use criterion::Criterion;
use prx_hooks::Hooks;
use prx_hooks::http::{HttpOptions, Server, Token, router};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "bench-token-0123456789abcdef";

const HOOKS: &str = r#"{
  "timeout_ms": 5000,
  "hooks": {
    "tool_call": [
      { "id": "audit-tool-calls", "command": "/bin/true", "args": ["audit.log"], "stdin_json": true, "timeout_ms": 2000 }
    ],
    "tool_call_start": [
      { "id": "audit-github", "command": "/bin/true", "args": ["github.log"], "stdin_json": true, "matcher": "mcp__github__*" }
    ],
    "error": [
      { "id": "audit-errors", "command": "/bin/true", "args": ["errors.log"], "stdin_json": true }
    ]
  }
}
"#;

fn main() {
    let _ = process_start();
    let ws = tempfile::tempdir().expect("tempdir");
    std::fs::write(ws.path().join("hooks.json"), HOOKS).unwrap();
    let hooks = Arc::new(Hooks::builder().workspace(ws.path()).build().unwrap());
    let opts = HttpOptions::new(Token::new(TOKEN, "bench").unwrap());
    let server = Server::start(hooks.clone(), opts, "127.0.0.1:0".parse().unwrap()).unwrap();
    let base = format!("http://{}", server.local_addr());
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(true)
        .build()
        .into();
    let auth = format!("Bearer {TOKEN}");
    let call = |method: &str, path: &str| {
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("authorization", &auth)
            .body(())
            .unwrap();
        let mut resp = agent.run(req).expect("request");
        resp.body_mut().read_to_vec().expect("body").len()
    };
    let editor = hooks.editor().unwrap();

    let mut c = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("api_read");
        g.bench_function("editor_list", |b| {
            b.iter(|| editor.list().unwrap().hooks.len())
        });
        g.bench_function("http_list", |b| b.iter(|| call("GET", "/api/hooks")));
        g.bench_function("http_healthz", |b| b.iter(|| call("GET", "/healthz")));
        g.bench_function("http_metrics", |b| b.iter(|| call("GET", "/metrics")));
        g.finish();
    }
    {
        let mut g = c.benchmark_group("api_write");
        g.bench_function("editor_toggle", |b| {
            b.iter(|| {
                editor.toggle("audit-errors", None).unwrap();
                hooks.apply_hooks_file()
            })
        });
        g.bench_function("http_toggle", |b| {
            b.iter(|| call("PATCH", "/api/hooks/audit-errors/toggle"))
        });
        g.finish();
    }
    {
        // The baseline: the same routes under plain axum::serve on a runtime like Server's.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("plain-http")
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let plain_addr = listener.local_addr().unwrap();
        let app = router(
            hooks.clone(),
            HttpOptions::new(Token::new(TOKEN, "bench").unwrap()),
        );
        rt.spawn(async move { axum::serve(listener, app).await });
        let plain_base = format!("http://{plain_addr}");
        let get = |base: &str| {
            let mut resp = agent
                .get(format!("{base}/healthz"))
                .call()
                .expect("request");
            resp.body_mut().read_to_vec().expect("body").len()
        };
        let mut g = c.benchmark_group("api_limits");
        g.bench_function("server_healthz", |b| b.iter(|| get(&base)));
        g.bench_function("axum_serve_healthz", |b| b.iter(|| get(&plain_base)));
        g.bench_function("server_new_conn", |b| {
            b.iter(|| one_connection(server.local_addr()))
        });
        g.bench_function("axum_serve_new_conn", |b| {
            b.iter(|| one_connection(plain_addr))
        });
        g.finish();
        if bench_mode() {
            println!("\nPAIRED (limited Server / plain axum::serve)");
            let server_addr = server.local_addr();
            let keep_alive = paired(
                60,
                50,
                || {
                    get(&base);
                },
                || {
                    get(&plain_base);
                },
            );
            keep_alive.print("GET /healthz, kept-alive connection");
            let new_conn = paired(
                60,
                10,
                || {
                    one_connection(server_addr);
                },
                || {
                    one_connection(plain_addr);
                },
            );
            new_conn.print("connect + GET /healthz + close");
        }
        drop(rt);
    }
    c.final_summary();
    if !bench_mode() {
        return;
    }

    println!("\nRATIOS");
    print_time_ratio("api_read/http_list", "api_read/editor_list");
    print_time_ratio("api_write/http_toggle", "api_write/editor_toggle");
    print_time_ratio("api_read/http_list", "api_read/http_healthz");
    for (api, direct) in [
        ("api_read/http_list", "api_read/editor_list"),
        ("api_write/http_toggle", "api_write/editor_toggle"),
    ] {
        if let (Some(a), Some(d)) = (median_ns(api), median_ns(direct)) {
            println!("{api:<40} overhead per request {:>9}", fmt_ns(a - d));
        }
    }
    print_time_ratio("api_limits/server_healthz", "api_limits/axum_serve_healthz");
    print_time_ratio(
        "api_limits/server_new_conn",
        "api_limits/axum_serve_new_conn",
    );
    for (limited, plain) in [
        ("api_limits/server_healthz", "api_limits/axum_serve_healthz"),
        (
            "api_limits/server_new_conn",
            "api_limits/axum_serve_new_conn",
        ),
    ] {
        if let (Some(a), Some(d)) = (median_ns(limited), median_ns(plain)) {
            println!("{limited:<40} cost of the limits {:>9}", fmt_ns(a - d));
        }
    }
    drop(server);
    print_machine_note();
}

/// What [`paired`] measured: per round, wall time and the server threads' CPU time of `a`
/// and of `b`.
struct Paired {
    batch: usize,
    wall: Vec<(f64, f64)>,
    cpu: Vec<(u64, u64)>,
}

impl Paired {
    fn print(&self, what: &str) {
        let quartiles = |mut r: Vec<f64>| {
            r.sort_by(f64::total_cmp);
            let q = |p: f64| r[((r.len() - 1) as f64 * p).round() as usize];
            format!(
                "median {:.3}x (quartiles {:.3}x .. {:.3}x)",
                q(0.5),
                q(0.25),
                q(0.75)
            )
        };
        let wall = quartiles(self.wall.iter().map(|(a, b)| a / b).collect());
        let cpu = quartiles(
            self.cpu
                .iter()
                .map(|(a, b)| *a as f64 / (*b).max(1) as f64)
                .collect(),
        );
        let n = (self.batch * self.cpu.len()) as f64;
        let (ca, cb) = self
            .cpu
            .iter()
            .fold((0u64, 0u64), |(x, y), (a, b)| (x + a, y + b));
        println!("{what} ({} rounds of {}):", self.cpu.len(), self.batch);
        println!("    wall time                 {wall}");
        println!(
            "    server CPU per request    {cpu}; mean {} limited, {} plain",
            fmt_ns(ca as f64 / n),
            fmt_ns(cb as f64 / n)
        );
    }
}

/// `rounds` rounds, each running `batch` calls of `a` and of `b` back to back (which goes first
/// alternates), timing each batch by the wall clock and by the CPU time of the serving
/// runtime's threads (`prx-http` for `a`, `plain-http` for `b`): CPU time is what the limits
/// would add, and unlike wall time it hardly moves with the machine's load.
fn paired(rounds: usize, batch: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> Paired {
    let mut out = Paired {
        batch,
        wall: Vec::new(),
        cpu: Vec::new(),
    };
    let run = |f: &mut dyn FnMut(), threads: &str| {
        let (t, c) = (std::time::Instant::now(), thread_cpu_ns(threads));
        for _ in 0..batch {
            f();
        }
        (t.elapsed().as_secs_f64(), thread_cpu_ns(threads) - c)
    };
    for i in 0..rounds {
        let ((wa, ca), (wb, cb)) = if i % 2 == 0 {
            let ra = run(&mut a, "prx-http");
            (ra, run(&mut b, "plain-http"))
        } else {
            let rb = run(&mut b, "plain-http");
            (run(&mut a, "prx-http"), rb)
        };
        out.wall.push((wa, wb));
        out.cpu.push((ca, cb));
    }
    out
}

/// CPU time (ns, from schedstat) of this process's threads whose name starts with `prefix`.
fn thread_cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Connect, `GET /healthz` with `Connection: close`, read to the end.
fn one_connection(addr: SocketAddr) -> usize {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read");
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    out.len()
}
