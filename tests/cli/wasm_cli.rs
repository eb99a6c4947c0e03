//! `prx-hooks fire`, `validate` and `run` driving real WASM plugins, as real processes.
//!
//! The components come from `bash examples/build-plugins.sh` (see tests/wasm.rs).

use std::path::Path;
use std::process::{Command, Output};

use crate::plugins;

use plugins::{audit_manifest, install, kv_get};

/// A plugin's kv value as text.
fn kv(ws: &Path, plugin: &str, key: &str) -> Option<String> {
    kv_get(ws, plugin, key).map(|v| String::from_utf8(v).unwrap())
}

/// The binary, with `HOME` in a directory of this test binary's own (the compile cache lives
/// under `$HOME/.cache`, its key under `$HOME/.local/state`) and no XDG overrides.
fn bin() -> Command {
    let home = std::env::temp_dir().join(format!("prx-hooks-wasm-cli-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    bin_home(&home)
}

fn bin_home(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.env("RUST_LOG", "info")
        .env("HOME", home)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("XDG_STATE_HOME");
    cmd
}

/// The compile cache entries under `home`.
fn cache_entries(home: &Path) -> Vec<std::path::PathBuf> {
    let dir = home.join(".cache/prx-hooks/wasm");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
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
    let home = tempfile::tempdir().unwrap();
    audit(ws.path());
    for n in 1..=2 {
        let (code, out, err) = run(bin_home(home.path())
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
    // The compiled component is cached in the user's cache, never in the workspace.
    assert_eq!(cache_entries(home.path()).len(), 1);
    assert!(!ws.path().join(".prx-hooks/cache").exists());
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
fn fire_reports_a_broken_plugin_and_runs_the_others() {
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
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("plugin audit-hook tool_call: ok ("),
        "{out}"
    );
    assert!(
        err.contains("plugins/broken/plugin.toml:1:1: plugin: missing \"version\" (required)"),
        "{err}"
    );
}

#[test]
fn fire_on_a_prx_plugins_folder_runs_the_hooks_and_reports_the_rest() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    // A tool plugin, with its own PRX manifest (no hook capability).
    let tool = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/tool-plugin/plugin.toml"),
    )
    .unwrap();
    install(ws.path(), "tool-plugin", "tool_plugin", &tool);
    // A tool component whose manifest says hook: skipped by what it exports.
    install(
        ws.path(),
        "tool-as-hook",
        "tool_plugin",
        &manifest("tool-as-hook", "\"*\"", ""),
    );
    // Keys PRX ignores, and a name that is not the folder's.
    install(
        ws.path(),
        "extra-keys",
        "audit_hook",
        &format!(
            "http_allowlist = [\"https://example.com\"]\n{}",
            manifest("audit", "\"tool_call\"", "").replace(
                "version = \"0.1.0\"",
                "version = \"0.1.0\"\ncapability = \"hook\""
            )
        ),
    );
    // A folder without a manifest, and a broken plugin.
    std::fs::create_dir_all(ws.path().join("plugins/assets")).unwrap();
    install(
        ws.path(),
        "broken",
        "audit_hook",
        "[plugin]\nname = \"broken\"\n",
    );
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("plugin audit-hook tool_call: ok ("),
        "{out}"
    );
    // The folder's name is the plugin's name (it keys kv).
    assert!(
        lines[1].starts_with("plugin extra-keys tool_call: ok ("),
        "{out}"
    );
    assert_eq!(kv(ws.path(), "extra-keys", "count").as_deref(), Some("1"));
    for expected in [
        "plugin tool-plugin: a tool plugin, not a hook: skipped",
        "plugin tool-as-hook: its component exports prx:plugin/tool-exports@0.1.0",
        "unknown key \"http_allowlist\"",
        "unknown key \"capability\"",
        "the name \"audit\" differs from the plugin's directory name \"extra-keys\"",
        "plugins/assets/plugin.toml:1:1: $: no plugin.toml",
        "plugins/broken/plugin.toml:1:1: plugin: missing \"version\"",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    // validate: the broken plugin is the only error; the rest are warnings and notes.
    let (code, out, err) = run(bin().args(["validate", "--workspace"]).arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    let errors: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with("warning: "))
        .collect();
    assert_eq!(errors.len(), 1, "{out}");
    assert!(errors[0].contains("plugins/broken/plugin.toml"), "{out}");
    assert!(err.contains("note: plugin tool-plugin"), "{err}");
}

#[test]
fn a_swapped_or_tampered_cache_entry_is_never_run() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    audit(ws.path());
    install(
        ws.path(),
        "bad",
        "misbehave",
        &manifest("bad", "\"*\"", "mode = \"err\""),
    );
    let fire = || {
        run(bin_home(home.path())
            .args(["fire", "tool_call", "--workspace"])
            .arg(ws.path()))
    };
    let check = |(code, out, err): (i32, String, String)| {
        assert_eq!(code, 1, "{out}{err}");
        assert!(
            out.contains("plugin audit-hook tool_call: ok ("),
            "{out}{err}"
        );
        assert!(
            out.contains("plugin bad tool_call: error: guest error"),
            "{out}{err}"
        );
        err
    };
    check(fire());
    let entries = cache_entries(home.path());
    assert_eq!(entries.len(), 2, "{entries:?}");
    // Each plugin's compiled code copied over the other's entry: both refused, recompiled.
    let (a, b) = (
        std::fs::read(&entries[0]).unwrap(),
        std::fs::read(&entries[1]).unwrap(),
    );
    std::fs::write(&entries[0], &b).unwrap();
    std::fs::write(&entries[1], &a).unwrap();
    let err = check(fire());
    assert_eq!(
        err.matches("compile cache entry refused").count(),
        2,
        "{err}"
    );
    // Rewritten by that run: accepted again.
    let err = check(fire());
    assert!(!err.contains("refused"), "{err}");
    // Truncated in place: refused too, recompiled, nothing crashes.
    for e in &entries {
        let len = std::fs::metadata(e).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(e)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    }
    let err = check(fire());
    assert_eq!(
        err.matches("compile cache entry refused").count(),
        2,
        "{err}"
    );
    assert_eq!(kv(ws.path(), "audit-hook", "count").as_deref(), Some("4"));
}

#[test]
fn a_cache_directory_in_the_workspace_is_never_read_or_written() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    install(
        ws.path(),
        "bad",
        "misbehave",
        &manifest("bad", "\"*\"", "mode = \"err\""),
    );
    // Whatever sits in the workspace's state directory (it was the cache), even a symbolic
    // link to elsewhere, is not looked at.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join(".prx-hooks")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), ws.path().join(".prx-hooks/cache")).unwrap();
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    // validate never writes a cache at all.
    let home = tempfile::tempdir().unwrap();
    let (code, out, err) = run(bin_home(home.path())
        .args(["validate", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(cache_entries(home.path()).is_empty());
    assert!(!home.path().join(".cache").exists());
}

#[test]
fn without_a_usable_home_plugins_run_uncached() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    let (code, out, err) = run(bin()
        .env_remove("HOME")
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("plugin audit-hook tool_call: ok ("),
        "{out}"
    );
    assert!(err.contains("no compile cache"), "{err}");
}

#[test]
fn plugins_load_under_an_address_space_limit() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    install(
        ws.path(),
        "big",
        "misbehave",
        &format!(
            "{}\n[resources]\nmax_memory_mb = 256\npool_size = 4\n",
            manifest("big", "\"*\"", "mode = \"noop\"")
        ),
    );
    // 16 GiB of address space: wasmtime's default reservations (4 GiB per memory slot, four
    // slots per instance) need hundreds of GiB for this pool.
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--as={}", 16u64 << 30))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path())
        .env(
            "HOME",
            std::env::temp_dir().join(format!("prx-hooks-wasm-cli-home-{}", std::process::id())),
        )
        .env("RUST_LOG", "info");
    std::fs::create_dir_all(
        std::env::temp_dir().join(format!("prx-hooks-wasm-cli-home-{}", std::process::id())),
    )
    .unwrap();
    let (code, out, err) = run(&mut cmd);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
}

/// Runs `cmd` with stdout read and stderr piped but never read; kills it after `secs`.
fn run_with_stderr_blocked(cmd: &mut Command, secs: u64) -> Option<i32> {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_log_flood_is_rate_limited_and_a_blocked_stderr_does_not_hang_fire() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "flood",
        "misbehave",
        &format!(
            "{}\n[resources]\nmax_execution_time_ms = 3000\nmax_fuel = 1_000_000_000_000\n",
            manifest(
                "flood",
                "\"*\"",
                "mode = \"logflood\"\ncount = \"20000\"\nsize = \"200\""
            )
        ),
    );
    let (code, out, err) = run(bin()
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    let guest_lines = err.lines().filter(|l| l.contains("xxxxxxxx")).count();
    assert!(
        guest_lines <= 1000,
        "{guest_lines} guest lines reached stderr"
    );
    assert!(err.contains("log line(s) dropped"), "{err}");
    // Nobody reads stderr: 40 000 lines of 200 bytes fill the pipe many times over.
    let code = run_with_stderr_blocked(
        bin()
            .args(["fire", "turn_complete", "--workspace"])
            .arg(ws.path()),
        60,
    );
    assert_eq!(code, Some(0), "fire hung on a full stderr pipe");
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

/// What PRX's own runtime (v0.8.32) emits: documented fields plus its own (`provider`/`model`
/// on agent_start, which lacks agent/session; `duration_ms`/`tokens_used` on agent_end, which
/// lacks success/messages_count; …), members in its order, some whitespace.
const PRX_STREAM: &[(&str, &str, &str)] = &[
    (
        "agent_start",
        r#"{"provider":"openrouter","model":"anthropic/claude-sonnet-4"}"#,
        r#"{"agent":"prx","session":"s-1","provider":"openrouter","model":"anthropic/claude-sonnet-4"}"#,
    ),
    (
        "llm_request",
        r#"{"provider":"openrouter","model":"m","messages_count":3}"#,
        r#"{"provider":"openrouter","model":"m","messages_count":3}"#,
    ),
    (
        "llm_response",
        r#"{"provider":"openrouter", "model":"m","duration_ms":1520,"success":false,"error_message":"rate limited: \u00e9 \"q\"\n"}"#,
        r#"{"provider":"openrouter","model":"m","duration_ms":1520,"success":false,"error_message":"rate limited: \u00e9 \"q\"\n"}"#,
    ),
    (
        "tool_call_start",
        r#"{"tool":"shell","arguments":{"command":"ls -la","timeout":30}}"#,
        r#"{"tool":"shell","arguments":{"command":"ls -la","timeout":30}}"#,
    ),
    (
        "tool_call",
        r#"{"tool":"shell","duration_ms":12,"success":true,"output":"total 0\n"}"#,
        r#"{"tool":"shell","success":true,"output":"total 0\n","duration_ms":12}"#,
    ),
    (
        "turn_complete",
        r#"{"mode":"chat","cte_session_id":"cte-9","response_chars":118}"#,
        r#"{"mode":"chat","cte_session_id":"cte-9","response_chars":118}"#,
    ),
    (
        "error",
        r#"{"component":"provider","message":"boom","retryable":true}"#,
        r#"{"component":"provider","message":"boom","retryable":true}"#,
    ),
    (
        "agent_end",
        r#"{"duration_ms": 5230, "tokens_used": {"input": 1200, "output": 340}}"#,
        r#"{"duration_ms":5230,"tokens_used":{"input":1200,"output":340}}"#,
    ),
];

#[test]
fn a_prx_runtime_stream_reaches_shell_hooks_plugins_and_subscribers_byte_exact() {
    use std::os::unix::fs::PermissionsExt;
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let w = ws.path();
    // The audit-hook plugin echoes every payload it receives, verbatim, to a bus topic.
    install(
        w,
        "audit-hook",
        "audit_hook",
        &audit_manifest().replace("echo_topic = \"\"", "echo_topic = \"audit.echo\""),
    );
    // A shell hook per event saves what it reads on stdin.
    std::fs::create_dir_all(w.join("out")).unwrap();
    let save = w.join("save.sh");
    std::fs::write(&save, "#!/bin/sh\ncat > \"out/$1.json\"\n").unwrap();
    std::fs::set_permissions(&save, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hooks: Vec<String> = PRX_STREAM
        .iter()
        .map(|(event, _, _)| {
            format!(r#""{event}":[{{"command":"./save.sh","args":["{event}"],"stdin_json":true}}]"#)
        })
        .collect();
    std::fs::write(
        w.join("hooks.json"),
        format!(r#"{{"hooks":{{{}}}}}"#, hooks.join(",")),
    )
    .unwrap();
    let mut stream = String::new();
    for (event, payload, _) in PRX_STREAM {
        stream.push_str(&format!(
            r#"{{"event":"{event}","agent":"prx","session":"s-1","payload":{payload}}}"#
        ));
        stream.push('\n');
    }
    std::fs::write(w.join("prx.ndjson"), &stream).unwrap();

    // agent_end lacks documented fields: refused, naming the field, and `run` exits 1.
    let (code, _, err) = run(bin_home(home.path())
        .args(["run", "--events", "prx.ndjson", "--workspace"])
        .arg(w)
        .current_dir(w));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("prx.ndjson:8:"), "{err}");
    assert!(err.contains("payload.success"), "{err}");
    assert!(
        !err.contains("prx.ndjson:1:"),
        "agent_start takes agent/session from the envelope: {err}"
    );
    for f in std::fs::read_dir(w.join("out")).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }

    // --lenient accepts it; every payload reaches the hook, the plugin and the subscriber.
    let (code, out, err) = run(bin_home(home.path())
        .args([
            "run",
            "--lenient",
            "--print",
            "--events",
            "prx.ndjson",
            "--workspace",
        ])
        .arg(w)
        .current_dir(w));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("agent_end.success is missing") && err.contains("--lenient"),
        "{err}"
    );
    assert!(
        err.contains(r#""omitted_fields":{"agent_end.messages_count":1,"agent_end.success":1}"#),
        "{err}"
    );
    for (event, _, expected) in PRX_STREAM {
        let saved = std::fs::read_to_string(w.join("out").join(format!("{event}.json")))
            .unwrap_or_else(|e| panic!("{event}: the shell hook saw nothing ({e}): {err}"));
        assert_eq!(saved, *expected, "shell hook, {event}");
        let lifecycle = format!(r#"{{"topic":"prx.lifecycle.{event}","event":"{event}","#);
        let line = out
            .lines()
            .find(|l| l.starts_with(&lifecycle))
            .unwrap_or_else(|| panic!("subscriber: no {event} in {out}"));
        assert!(
            line.ends_with(&format!(r#","payload":{expected}}}"#)),
            "subscriber, {event}: {line}"
        );
        let echoed = format!(r#""payload":{{"event":"{event}","payload":{expected}}}}}"#);
        assert!(
            out.lines()
                .any(|l| l.starts_with(r#"{"topic":"audit.echo""#) && l.ends_with(&echoed)),
            "plugin, {event}: no {echoed} in {out}"
        );
    }
}

// ------------------------------------------------------------------ guests that wait

/// A manifest for `misbehave` with every permission, `[resources]` and `[config]` lines.
fn misbehave_manifest(name: &str, resources: &str, config: &str) -> String {
    format!(
        "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n[[capabilities]]\ntype = \"hook\"\n\
         events = [\"*\"]\n\n[permissions]\nrequired = [\"log\", \"config\", \"kv\", \"events\"]\n\n\
         [resources]\n{resources}\n\n[config]\n{config}\n"
    )
}

/// Runs `cmd` to its end, killing it after `secs`; `None` if it had to be killed. Also returns
/// how long it ran and its stdout and stderr.
fn run_within(cmd: &mut Command, secs: u64) -> (Option<i32>, std::time::Duration, String, String) {
    use std::io::Read;
    use std::process::Stdio;
    let t = std::time::Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let deadline = t + std::time::Duration::from_secs(secs);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let took = t.elapsed();
    (code, took, o.join().unwrap(), e.join().unwrap())
}

#[test]
fn fire_reports_a_guest_sleeping_in_a_host_call_as_timed_out_and_exits() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "sleeper",
        "misbehave",
        &misbehave_manifest("sleeper", "max_execution_time_ms = 300", "mode = \"sleep\""),
    );
    // The symptom before the fix: `fire` never exited (the guest parked in wasi:io/poll).
    let (code, took, out, err) = run_within(
        bin()
            .args(["fire", "tool_call", "--workspace"])
            .arg(ws.path()),
        60,
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("plugin sleeper tool_call: timed out after 300 ms"),
        "{out}{err}"
    );
    // Its limit plus generous slack for start-up on a loaded machine.
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
}

#[test]
fn fire_and_validate_do_not_wait_for_start_code_past_its_cap() {
    let ws = tempfile::tempdir().unwrap();
    audit(ws.path());
    install(
        ws.path(),
        "slowstart",
        "misbehave",
        &misbehave_manifest(
            "slowstart",
            "max_execution_time_ms = 3_600_000",
            "mode = \"noop\"\nstart = \"sleep\"",
        ),
    );
    // Before: both waited for the start code's hour-long limit.
    let (code, took, out, err) = run_within(
        bin()
            .args(["fire", "tool_call", "--workspace"])
            .arg(ws.path()),
        60,
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    assert!(
        out.contains("plugin audit-hook tool_call: ok"),
        "the other plugin runs: {out}{err}"
    );
    assert!(
        err.contains("start code timed out after 1000 ms"),
        "{out}{err}"
    );
    let (code, took, out, err) =
        run_within(bin().args(["validate", "--workspace"]).arg(ws.path()), 60);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
    assert!(
        out.contains("slowstart") && out.contains("start code timed out after 1000 ms"),
        "{out}{err}"
    );
}

#[test]
fn run_and_fire_write_one_plugins_kv_at_once_without_losing_writes() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "counter",
        "misbehave",
        &misbehave_manifest("counter", "", "mode = \"count\""),
    );
    use std::io::Write;
    use std::process::Stdio;
    let mut run_child = bin()
        .env("RUST_LOG", "warn")
        .args(["run", "--events", "-", "--workspace"])
        .arg(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = run_child.stdin.take().unwrap();
    // `fire` processes, one after another, while `run` handles its events.
    let ws_path = ws.path().to_path_buf();
    let fires = std::thread::spawn(move || {
        for _ in 0..8 {
            let (code, out, err) = run(bin()
                .env("RUST_LOG", "warn")
                .args(["fire", "tool_call", "--workspace"])
                .arg(&ws_path));
            assert_eq!(code, 0, "{out}{err}");
        }
    });
    let mut events = 0;
    while !fires.is_finished() || events < 100 {
        writeln!(
            stdin,
            "{{\"event\":\"turn_complete\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{{}}}}"
        )
        .unwrap();
        events += 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    fires.join().unwrap();
    drop(stdin);
    let out = run_child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert_eq!(
        report["stats"]["plugins"]["plugins"][0]["ok"], events,
        "{err}"
    );
    // Before, each process rewrote the whole store from its own copy: the last writer's copy
    // won and the other's keys were lost.
    assert_eq!(
        kv(ws.path(), "counter", "n.turn_complete").as_deref(),
        Some(&*events.to_string())
    );
    assert_eq!(
        kv(ws.path(), "counter", "n.tool_call").as_deref(),
        Some("8")
    );
}

#[test]
fn a_kv_value_larger_than_the_memory_left_is_refused_without_a_copy() {
    let ws = tempfile::tempdir().unwrap();
    let dir = install(
        ws.path(),
        "big",
        "misbehave",
        &misbehave_manifest(
            "big",
            "max_memory_mb = 64\nmax_kv_storage_mb = 16",
            "mode = \"kvset\"\nsize = \"8388608\"",
        ),
    );
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    // The same plugin, now with 4 MiB for its whole instance, reads the 8 MiB value.
    std::fs::write(
        dir.join("plugin.toml"),
        misbehave_manifest(
            "big",
            "max_memory_mb = 4\nmax_kv_storage_mb = 16",
            "mode = \"kvget\"",
        ),
    )
    .unwrap();
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("trap")
            && out.contains("kv.get: the value of \\\"big\\\" is 8388608 bytes, more than the")
            || out.contains("kv.get: the value of \"big\" is 8388608 bytes, more than the"),
        "{out}{err}"
    );
    // With room for it, it is read.
    std::fs::write(
        dir.join("plugin.toml"),
        misbehave_manifest(
            "big",
            "max_memory_mb = 64\nmax_kv_storage_mb = 16",
            "mode = \"kvget\"",
        ),
    )
    .unwrap();
    let (_, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert!(
        out.contains("error: kv.get big: 8388608 bytes"),
        "{out}{err}"
    );
}

#[test]
fn wasi_random_gives_at_most_1_mib_a_call() {
    let ws = tempfile::tempdir().unwrap();
    let dir = install(
        ws.path(),
        "rnd",
        "misbehave",
        &misbehave_manifest("rnd", "", "mode = \"random\"\nsize = \"1048576\""),
    );
    let (_, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert!(out.contains("error: random: 1048576 bytes"), "{out}{err}");
    std::fs::write(
        dir.join("plugin.toml"),
        misbehave_manifest("rnd", "", "mode = \"random\"\nsize = \"1048577\""),
    )
    .unwrap();
    // Before, up to 64 MiB a call were allocated on the host.
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("rnd tool_call: trap"), "{out}{err}");
    assert!(!out.contains("random: 1048577 bytes"), "{out}{err}");
}

#[test]
fn a_list_keys_result_larger_than_the_memory_left_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    // 20,000 keys of 201 bytes: ~4 MiB of names.
    let prefix = format!("p{}", "x".repeat(195));
    let dir = install(
        ws.path(),
        "keys",
        "misbehave",
        &misbehave_manifest(
            "keys",
            "max_memory_mb = 64\nmax_kv_storage_mb = 64\nmax_execution_time_ms = 30000\nmax_fuel = 10_000_000_000",
            &format!("mode = \"kvfill\"\nprefix = \"{prefix}\"\ncount = \"20000\""),
        ),
    );
    let (code, out, err) = run(bin()
        .args(["fire", "tool_call", "--workspace"])
        .arg(ws.path()));
    assert_eq!(code, 0, "{out}{err}");
    let listing = |memory_mb: u32| {
        std::fs::write(
            dir.join("plugin.toml"),
            misbehave_manifest(
                "keys",
                &format!("max_memory_mb = {memory_mb}\nmax_kv_storage_mb = 64\nmax_execution_time_ms = 30000"),
                "mode = \"listkeys\"\nprefix = \"p\"",
            ),
        )
        .unwrap();
        run(bin()
            .args(["fire", "tool_call", "--workspace"])
            .arg(ws.path()))
    };
    // 4 MiB for the whole instance: the ~4 MiB listing is refused before it is built.
    let (code, out, err) = listing(4);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("trap") && out.contains("kv.list-keys: the keys starting with"),
        "{out}{err}"
    );
    // With room for it, every key is listed.
    let (code, out, err) = listing(64);
    assert_eq!(code, 1, "{out}{err}"); // the guest reports the count as its error
    assert!(out.contains("error: list-keys: 20000 keys"), "{out}{err}");
}

/// A kv file in the workspace is input like any other: a hostile or damaged one must not make
/// the host allocate its size, copy it, or wait for it. Three plugins: one whose kv file is a
/// sparse 1 TiB file that starts with the right magic (no disk space; before, the catch-up
/// allocated all of it and the process aborted), one whose file is 1 TiB of zeros without the
/// magic (before, it was copied aside byte by byte: it filled the disk), one whose file is a
/// FIFO (before, reading its first bytes waited forever). `fire` runs under a 256 MiB file-size
/// limit (so the old copy dies of SIGXFSZ instead of filling the disk) and is killed after 60 s.
#[test]
fn a_hostile_kv_file_is_neither_allocated_copied_nor_waited_for() {
    let ws = tempfile::tempdir().unwrap();
    let kv_dir = ws.path().join(".prx-hooks/kv");
    std::fs::create_dir_all(&kv_dir).unwrap();
    for name in ["sparse", "zeros", "fifo"] {
        install(
            ws.path(),
            name,
            "misbehave",
            &manifest(name, "\"*\"", "mode = \"count\""),
        );
    }
    use std::io::Write;
    let f = std::fs::File::create(kv_dir.join("sparse")).unwrap();
    (&f).write_all(b"PRXKV2\n").unwrap();
    f.set_len(1 << 40).unwrap();
    std::fs::File::create(kv_dir.join("zeros"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let fifo = kv_dir.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let home = std::env::temp_dir().join(format!("prx-hooks-wasm-cli-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mut child = Command::new("prlimit")
        .arg(format!("--fsize={}", 256u64 << 20))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["fire", "turn_complete", "--workspace"])
        .arg(ws.path())
        .env("HOME", &home)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let tail: String = stderr.lines().rev().take(15).collect::<Vec<_>>().join("\n");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{:?}\n{stdout}\n{tail}",
        out.status
    );
    for name in ["fifo", "sparse", "zeros"] {
        assert!(
            stdout.contains(&format!("plugin {name} turn_complete: ok (")),
            "{stdout}"
        );
    }
    // The two files that are no kv log were set aside without a copy; each store starts
    // anew and the plugin's write is in it.
    for name in ["sparse", "zeros"] {
        assert_eq!(kv(ws.path(), name, "n.turn_complete").as_deref(), Some("1"));
    }
    let used: u64 = std::fs::read_dir(&kv_dir)
        .unwrap()
        .flatten()
        .map(|e| {
            use std::os::unix::fs::MetadataExt;
            e.metadata().unwrap().blocks() * 512
        })
        .sum();
    assert!(
        used < 1 << 20,
        "the kv directory takes {used} bytes of disk"
    );
}

/// The kv flusher makes a store durable with fdatasync(2), which takes as long as the disk
/// wants (seconds on a loaded machine). A plugin's calls must not wait for it: before, the
/// flusher held the store's state during the sync, so the next call's `kv.get` waited in a host
/// call no deadline reaches, and an innocent plugin timed out (a fault, feeding the breaker).
/// `strace` delays every fdatasync by 4 s (only that syscall is stopped: `--seccomp-bpf`).
#[test]
fn a_slow_fsync_of_a_kv_store_does_not_hold_up_its_plugins_calls() {
    assert!(
        Command::new("strace").arg("-V").output().is_ok(),
        "strace is needed (apt-get install strace)"
    );
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "counter",
        "misbehave",
        &format!(
            "{}\n[resources]\nmax_execution_time_ms = 500\n",
            manifest("counter", "\"*\"", "mode = \"count\"")
        ),
    );
    let home = std::env::temp_dir().join(format!("prx-hooks-wasm-cli-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mut child = Command::new("strace")
        .args(["-f", "-qq", "--seccomp-bpf", "-o", "/dev/null"])
        .args([
            "-e",
            "trace=fdatasync",
            "-e",
            "inject=fdatasync:delay_enter=4000000",
        ])
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_prx-hooks"))
        // A pipe on stdin: its close ends the input (a named FIFO would stay open).
        .args(["run", "--events", "-"])
        .arg("--workspace")
        .arg(ws.path())
        .env("HOME", &home)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let line = "{\"event\":\"turn_complete\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{}}\n";
    {
        use std::io::Write;
        let mut fifo = child.stdin.take().unwrap();
        // The first call writes; 200 ms later the flusher syncs (4 s). The second call, 1.5 s
        // after the first, reads and writes the same store meanwhile.
        fifo.write_all(line.as_bytes()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        fifo.write_all(line.as_bytes()).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    let p = &report["stats"]["plugins"]["plugins"][0];
    assert_eq!(
        (p["ok"].as_u64(), p["timeouts"].as_u64()),
        (Some(2), Some(0)),
        "{p}"
    );
    assert_eq!(
        kv(ws.path(), "counter", "n.turn_complete").as_deref(),
        Some("2")
    );
}
