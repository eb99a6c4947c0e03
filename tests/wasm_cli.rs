//! `prx-hooks fire`, `validate` and `run` driving real WASM plugins, as real processes.
//!
//! The components come from `bash examples/build-plugins.sh` (see tests/wasm.rs).

use std::path::Path;
use std::process::{Command, Output};

#[path = "support/plugins.rs"]
mod plugins;

use plugins::{audit_manifest, install, kv_get};

/// A plugin's kv value as text.
fn kv(ws: &Path, plugin: &str, key: &str) -> Option<String> {
    kv_get(ws, plugin, key).map(|v| String::from_utf8(v).unwrap())
}

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.env("RUST_LOG", "info");
    cmd
}

fn manifest(name: &str, events: &str, config: &str) -> String {
    format!(
        "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n[[capabilities]]\ntype = \"hook\"\n\
         events = [{events}]\n\n[permissions]\nrequired = [\"events\"]\n\n[config]\n{config}\n"
    )
}

fn audit(ws: &Path) {
    install(ws, "audit-hook", "audit_hook", &audit_manifest());
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().expect("exited"),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn fire_runs_plugins_and_consecutive_fires_share_kv() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    for n in 1..=2 {
        let (code, out, err) = run(bin()
            .args(["fire", "tool_call", "--workspace"])
            .arg(ws.path()));
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.starts_with("plugin audit-hook tool_call: ok ("),
            "{out}"
        );
        // The guest's log line reaches stderr through tracing, tagged with the plugin.
        assert!(err.contains("tool_call: 43 bytes"), "{err}");
        assert!(err.contains("plugin=\"audit-hook\""), "{err}");
        assert_eq!(
            kv(ws.path(), "audit-hook", "count").as_deref(),
            Some(&*n.to_string())
        );
    }
    // The second run loaded the compiled component from the cache.
    let cache: Vec<_> = std::fs::read_dir(ws.path().join(".prx-hooks/cache"))
        .unwrap()
        .collect();
    assert_eq!(cache.len(), 1);
}

#[test]
fn fire_reports_guest_errors_traps_and_json() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "bad",
        "misbehave",
        &manifest("bad", "\"*\"", "mode = \"err\""),
    );
    install(
        ws.path(),
        "boom",
        "misbehave",
        &manifest("boom", "\"*\"", "mode = \"trap\""),
    );
    install(
        ws.path(),
        "chatty",
        "misbehave",
        &manifest("chatty", "\"*\"", "mode = \"stdio\""),
    );
    let (code, out, err) = run(bin()
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("plugin bad turn_complete: error: guest error: as requested ("),
        "{out}"
    );
    assert!(
        lines[1].starts_with("plugin boom turn_complete: trap: "),
        "{out}"
    );
    assert!(lines[1].contains("unreachable"), "{out}");
    assert!(
        lines[2].starts_with("plugin chatty turn_complete: ok ("),
        "{out}"
    );
    // Guest stdout and stderr go to tracing (stderr of prx-hooks), never to stdout.
    assert!(err.contains("stdout line from misbehave"), "{err}");
    assert!(err.contains("stderr line from misbehave"), "{err}");

    let (code, out, _) = run(bin()
        .args(["fire", "turn_complete", "--json", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 1);
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v[0]["plugin"], "bad");
    assert_eq!(v[0]["outcome"], "error");
    assert_eq!(v[0]["message"], "guest error: as requested");
    assert_eq!(v[1]["outcome"], "trap");
    assert_eq!(v[2]["outcome"], "ok");
    assert!(v[2]["duration_ms"].as_f64().unwrap() >= 0.0);
}

#[test]
fn fire_with_a_broken_plugin_is_a_configuration_error() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    install(
        ws.path(),
        "broken",
        "audit_hook",
        "[plugin]\nname = \"broken\"\n",
    );
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.is_empty());
    assert!(
        err.contains("plugins/broken/plugin.toml:1:1: plugin: missing \"version\" (required)"),
        "{err}"
    );
}

#[test]
fn validate_checks_manifests_and_component_exports() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    let (code, out, err) = run(bin().args(["validate", "--workspace"]).arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("ok: 1 plugin(s): audit-hook"), "{err}");

    install(
        ws.path(),
        "wrong",
        "wrong_world",
        &manifest("wrong", "\"*\"", ""),
    );
    let dir = install(
        ws.path(),
        "typo",
        "audit_hook",
        &manifest("typo", "\"tool_cal\"", ""),
    );
    let (code, out, err) = run(bin().args(["validate", "--workspace"]).arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines.iter().any(|l| l.contains(&format!(
            "{}:7:11: capabilities[0].events[0]: unknown event \"tool_cal\"",
            dir.join("plugin.toml").display()
        )) && l.contains("did you mean \"tool_call\"")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("plugins/wrong/plugin.wasm") && l.contains("wrong type")),
        "{out}"
    );
    assert!(err.contains("2 error(s)"), "{err}");
}

#[test]
fn run_feeds_plugins_and_flushes_kv_at_exit() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    let events = ws.path().join("events.ndjson");
    let mut text = String::new();
    for n in 0..25 {
        text.push_str(&format!(
            "{{\"event\":\"llm_request\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{{\"provider\":\"p\",\"model\":\"m\",\"messages_count\":{n}}}}}\n"
        ));
    }
    std::fs::write(&events, text).unwrap();
    let (code, out, err) = run(bin()
        .env("RUST_LOG", "warn")
        .args(["run", "--events"])
        .arg(&events)
        .arg("--workspace")
        .arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    let p = &report["stats"]["plugins"]["plugins"][0];
    assert_eq!(p["name"], "audit-hook");
    assert_eq!(p["state"], "stopped");
    assert_eq!(p["ok"], 25);
    assert_eq!(p["sent"], 25);
    assert_eq!(
        kv(ws.path(), "audit-hook", "count.llm_request").as_deref(),
        Some("25")
    );
}
