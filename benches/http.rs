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
//! RATIOS prints each API route against its direct call, and the per-request overhead.

mod common;

use common::*;
use criterion::Criterion;
use prx_hooks::Hooks;
use prx_hooks::http::{HttpOptions, Server, Token};
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
    drop(server);
    print_machine_note();
}
