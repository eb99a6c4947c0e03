//! WASM plugins with real components (ARCHITECTURE.md § WASM plugins, issue 4).
//!
//! The components are built from the guest crates under `examples/plugins/` by
//! `bash examples/build-plugins.sh` (`.ci/run` does it first). A test that needs one and does not
//! find it fails with that command in its message; nothing here uses a binary without its
//! source. Each test makes its own workspace in a temp dir, installs plugins into
//! `plugins/<name>/` (a `plugin.toml` and the component as `plugin.wasm`), and drives them
//! through `Hooks` — the real pipeline, bus, executors and watcher.

#![cfg(feature = "wasm")]

use prx_hooks::wasm::CallOutcome;
use prx_hooks::wasm::{PluginStats, PluginsStats};
use prx_hooks::{Emit, Event, EventKind, Hooks, Message, Subscription};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "support/plugins.rs"]
mod plugins;

use plugins::{audit_manifest, install, kv_count};

// ---------------------------------------------------------------- helpers

/// A manifest for plugin `name` declaring `events` (TOML array body), with `[resources]` and
/// `[config]` lines appended.
fn manifest(name: &str, events: &str, resources: &str, config: &str) -> String {
    format!(
        "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n\
         [[capabilities]]\ntype = \"hook\"\nevents = [{events}]\n\n\
         [permissions]\nrequired = [\"log\", \"config\", \"kv\", \"events\"]\n\n\
         [resources]\n{resources}\n\n[config]\n{config}\n"
    )
}

fn misbehave(ws: &Path, name: &str, mode: &str, resources: &str, extra: &str) -> PathBuf {
    install(
        ws,
        name,
        "misbehave",
        &manifest(
            name,
            "\"*\"",
            resources,
            &format!("mode = \"{mode}\"\n{extra}"),
        ),
    )
}

fn hooks(ws: &Path) -> Hooks {
    Hooks::builder()
        .workspace(ws)
        .reload_debounce(Duration::from_millis(20))
        .build()
        .unwrap()
}

fn plugins(h: &Hooks) -> PluginsStats {
    h.stats()
        .plugins()
        .cloned()
        .expect("a workspace has a plugin backend")
}

fn plugin(h: &Hooks, name: &str) -> PluginStats {
    plugins(h)
        .plugins
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("plugin {name} is not loaded: {:?}", plugins(h).errors))
}

/// Polls `f` until it holds; panics with `what` after `secs` seconds.
fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn recv(sub: &Subscription) -> Message {
    sub.recv_timeout(Duration::from_secs(10))
        .expect("a message within 10 s")
}

/// The 8 events, one of each, with distinctive payloads.
fn every_event() -> Vec<Event<'static>> {
    vec![
        Event::AgentStart {
            agent: "a\"gent",
            session: "s1",
        },
        Event::LlmRequest {
            provider: "openai",
            model: "gpt",
            messages_count: 3,
        },
        Event::LlmResponse {
            provider: "openai",
            model: "gpt",
            duration_ms: 120,
            success: true,
        },
        Event::ToolCallStart {
            tool: "shell",
            arguments: r#"{"cmd":"ls -la","env":{"X":"ü\n"}}"#,
        },
        Event::ToolCall {
            tool: "shell",
            success: false,
            output: "line1\nline2\t\u{1}",
        },
        Event::TurnComplete,
        Event::Error {
            component: "llm",
            message: "rate limited",
        },
        Event::AgentEnd {
            success: true,
            messages_count: 7,
        },
    ]
}

// ---------------------------------------------------------------- the audit guest

#[test]
fn audit_guest_sees_every_event_with_the_exact_payload_and_kv_survives_a_restart() {
    let ws = tempfile::tempdir().unwrap();
    let toml = audit_manifest().replace("echo_topic = \"\"", "echo_topic = \"audit.seen\"");
    install(ws.path(), "audit-hook", "audit_hook", &toml);

    let h = hooks(ws.path());
    let lifecycle = h.bus().subscribe("prx.lifecycle.*").unwrap();
    let seen = h.bus().subscribe("audit.seen").unwrap();
    let em = h.emitter("agent-1", "session-1");
    for ev in every_event() {
        assert_eq!(em.emit(ev), Emit::Queued);
    }
    for _ in 0..8 {
        let life = recv(&lifecycle);
        let echo = recv(&seen);
        let kind = life.event().unwrap();
        let expected = format!(
            r#"{{"event":"{}","payload":{}}}"#,
            kind.name(),
            life.json_str()
        );
        assert_eq!(echo.json_str(), expected);
        // One level deeper than the lifecycle event it answers.
        assert_eq!(echo.depth(), 1);
    }
    let p = plugin(&h, "audit-hook");
    assert_eq!((p.counts.ok, p.counts.sent, p.counts.delivered), (8, 8, 8));
    h.shutdown(Duration::from_secs(5));
    // Shutdown wrote the store.
    assert_eq!(kv_count(ws.path(), "audit-hook", "count"), 8);
    assert_eq!(kv_count(ws.path(), "audit-hook", "count.tool_call"), 1);
    drop(h);

    let h = hooks(ws.path());
    let em = h.emitter("agent-1", "session-2");
    em.emit(Event::TurnComplete);
    em.emit(Event::TurnComplete);
    wait_for(10, "two calls", || plugin(&h, "audit-hook").counts.ok == 2);
    // Durable within a second of the write, without a shutdown.
    wait_for(5, "kv flushed", || {
        kv_count(ws.path(), "audit-hook", "count") == 10
    });
    assert_eq!(kv_count(ws.path(), "audit-hook", "count.turn_complete"), 3);
}

#[test]
fn a_manifest_in_prx_docs_shape_loads_and_runs() {
    let ws = tempfile::tempdir().unwrap();
    let compat = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/compat/plugin.toml"),
    )
    .expect("../shared/compat/plugin.toml (the PRX sample) beside the repo");
    install(ws.path(), "compat", "audit_hook", &compat);
    let h = hooks(ws.path());
    let p = plugin(&h, "compat");
    assert_eq!(p.events, ["prx.lifecycle.*"]);
    assert_eq!(p.pool_size, 1, "PRX's pool_size = 0 means the default");
    assert_eq!(p.state, "running");
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the call", || plugin(&h, "compat").counts.ok == 1);
}

#[test]
fn a_guest_built_from_unversioned_wit_links_under_the_bare_names() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "bare",
        "bare_names",
        &manifest("bare", "\"*\"", "", ""),
    );
    let h = hooks(ws.path());
    assert!(plugins(&h).errors.is_empty(), "{:?}", plugins(&h).errors);
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the call", || plugin(&h, "bare").counts.ok == 1);
    h.shutdown(Duration::from_secs(5));
    assert_eq!(kv_count(ws.path(), "bare", "count"), 1);
}

// ---------------------------------------------------------------- declared patterns

#[test]
fn declared_patterns_select_the_events() {
    let ws = tempfile::tempdir().unwrap();
    let table_form = "[plugin]\nname = \"tables\"\nversion = \"1.0.0\"\n\n\
        [[capabilities]]\ntype = \"hook\"\n\n\
        [[capabilities.events]]\npattern = \"prx.lifecycle.agent_start\"\ndescription = \"starts\"\n\n\
        [[capabilities.events]]\npattern = \"error\"\n";
    install(
        ws.path(),
        "exact",
        "audit_hook",
        &manifest("exact", "\"tool_call\"", "", ""),
    );
    install(
        ws.path(),
        "topic",
        "audit_hook",
        &manifest("topic", "\"prx.lifecycle.llm_request\"", "", ""),
    );
    install(
        ws.path(),
        "prefix",
        "audit_hook",
        &manifest("prefix", "\"prx.lifecycle.*\"", "", ""),
    );
    install(
        ws.path(),
        "star",
        "audit_hook",
        &manifest("star", "\"*\"", "", ""),
    );
    install(ws.path(), "tables", "audit_hook", table_form);
    // A capability of another type contributes nothing.
    install(
        ws.path(),
        "other",
        "audit_hook",
        "[plugin]\nname = \"other\"\nversion = \"1\"\n[[capabilities]]\ntype = \"tool\"\nevents = [\"*\"]\n",
    );
    let h = hooks(ws.path());
    assert!(plugins(&h).errors.is_empty(), "{:?}", plugins(&h).errors);
    let em = h.emitter("a", "s");
    for ev in every_event() {
        em.emit(ev);
    }
    let expect = [
        ("exact", 1),
        ("topic", 1),
        ("prefix", 8),
        ("star", 8),
        ("tables", 2),
    ];
    for (name, n) in expect {
        wait_for(10, name, || plugin(&h, name).counts.ok == n);
    }
    h.shutdown(Duration::from_secs(5));
    for (name, n) in expect {
        assert_eq!(plugin(&h, name).counts.sent, n, "{name}");
    }
    assert_eq!(kv_count(ws.path(), "tables", "count.agent_start"), 1);
    assert_eq!(kv_count(ws.path(), "tables", "count.error"), 1);
    assert_eq!(kv_count(ws.path(), "exact", "count.tool_call"), 1);
    assert_eq!(plugin(&h, "other").counts.sent, 0);
}

// ---------------------------------------------------------------- limits

#[test]
fn an_infinite_loop_is_interrupted_near_its_deadline_and_the_next_call_works() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "looper",
        "loop",
        // Fuel enough for minutes: the clock must stop it.
        "max_execution_time_ms = 300\nmax_fuel = 1_000_000_000_000_000",
        "only = \"tool_call\"",
    );
    let h = hooks(ws.path());
    let em = h.emitter("a", "s");
    let t = Instant::now();
    em.emit(Event::ToolCall {
        tool: "t",
        success: true,
        output: "",
    });
    wait_for(30, "the timeout", || {
        plugin(&h, "looper").counts.timeouts == 1
    });
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "interrupted early: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "interrupted late: {took:?}");
    em.emit(Event::TurnComplete);
    wait_for(10, "the next call", || plugin(&h, "looper").counts.ok == 1);
    let p = plugin(&h, "looper");
    assert_eq!(p.counts.instances_replaced, 1);
    assert_eq!(p.counts.failed, 1);
    assert_eq!(
        p.counts.last_error.as_deref(),
        Some("timed out after 300 ms")
    );
}

#[test]
fn fuel_runs_out_before_the_clock_when_it_is_small() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "fuel",
        "loop",
        "max_fuel = 5_000_000\nmax_execution_time_ms = 60_000",
        "",
    );
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(30, "out of fuel", || {
        plugin(&h, "fuel").counts.out_of_fuel == 1
    });
    // Fuel is refilled per call: the next call runs out again rather than at once.
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(30, "out of fuel again", || {
        plugin(&h, "fuel").counts.out_of_fuel == 2
    });
}

#[test]
fn a_memory_hog_is_refused_at_max_memory_mb() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "hog", "memhog", "max_memory_mb = 16", "");
    install(
        ws.path(),
        "bystander",
        "audit_hook",
        &manifest("bystander", "\"*\"", "", ""),
    );
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(30, "the hog's answer", || {
        plugin(&h, "hog").counts.errors == 1
    });
    let err = plugin(&h, "hog").counts.last_error.unwrap();
    let mib: u64 = err
        .strip_prefix("error: memory refused after ")
        .and_then(|r| r.strip_suffix(" MiB"))
        .unwrap_or_else(|| panic!("unexpected error: {err}"))
        .parse()
        .unwrap();
    assert!((4..16).contains(&mib), "refused after {mib} MiB");
    wait_for(10, "the bystander", || {
        plugin(&h, "bystander").counts.ok == 1
    });
    // The host is fine and so is the hog's instance (a refused grow is not a trap).
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(30, "the second answer", || {
        plugin(&h, "hog").counts.errors == 2
    });
    assert_eq!(plugin(&h, "hog").counts.instances_replaced, 0);
}

#[test]
fn a_trap_replaces_the_instance_and_repeated_traps_suspend_the_plugin() {
    let ws = tempfile::tempdir().unwrap();
    let dir = misbehave(ws.path(), "trapper", "trap", "", "only = \"tool_call\"");
    let h = hooks(ws.path());
    let em = h.emitter("a", "s");
    let tool_call = Event::ToolCall {
        tool: "t",
        success: true,
        output: "",
    };
    em.emit(tool_call);
    wait_for(10, "the trap", || plugin(&h, "trapper").counts.traps == 1);
    em.emit(Event::TurnComplete);
    wait_for(10, "a good call", || plugin(&h, "trapper").counts.ok == 1);
    let p = plugin(&h, "trapper");
    assert_eq!(p.counts.instances_replaced, 1);
    assert!(p.counts.instances_created >= 2, "{:?}", p.counts);
    assert!(p.counts.last_error.unwrap().starts_with("trap: "));

    // Three faults in a row: suspended; what comes meanwhile is dropped and counted.
    for _ in 0..3 {
        em.emit(tool_call);
    }
    wait_for(10, "the suspension", || {
        plugin(&h, "trapper").state == "suspended"
    });
    em.emit(Event::TurnComplete);
    wait_for(10, "a dropped event", || {
        plugin(&h, "trapper").counts.dropped_suspended == 1
    });
    let p = plugin(&h, "trapper");
    assert_eq!(p.counts.suspensions, 1);
    // (It may already have resumed on a slow machine; the backoff test checks the durations.)
    assert!(p.suspended_for_ms.is_none_or(|ms| ms <= 1000));
    // Changing its files resumes it at once.
    let toml = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        toml.replace("mode = \"trap\"", "mode = \"noop\""),
    )
    .unwrap();
    wait_for(10, "the reload", || {
        plugin(&h, "trapper").state == "running"
    });
    em.emit(tool_call);
    wait_for(10, "a call on the new version", || {
        plugin(&h, "trapper").counts.ok == 2
    });
}

#[test]
fn a_plugin_that_republishes_what_it_receives_stops_at_the_depth_limit() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "echo", "republish", "", "topic = \"loop.ping\"");
    let h = hooks(ws.path());
    let pings = h.bus().subscribe("loop.ping").unwrap();
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the refused publish", || {
        plugin(&h, "echo").counts.errors == 1
    });
    let got: Vec<Message> = pings.try_iter().collect();
    assert_eq!(got.len(), usize::from(prx_hooks::bus::MAX_DEPTH));
    for (n, m) in got.iter().enumerate() {
        assert_eq!(m.depth() as usize, n + 1);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(pings.try_recv().is_err(), "the loop went on");
    let p = plugin(&h, "echo");
    assert_eq!(p.counts.topic_messages, 8);
    assert!(p.counts.last_error.unwrap().contains("nested 9 deep"));
}

#[test]
fn a_plugin_cannot_cancel_another_plugins_subscription() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "owner",
        "subscribe",
        "",
        "pattern = \"owner.*\"\nonly = \"agent_start\"",
    );
    misbehave(
        ws.path(),
        "thief",
        "unsubscribe",
        "",
        "only = \"tool_call_start\"",
    );
    let h = hooks(ws.path());
    let subscribed = h.bus().subscribe("misbehave.subscribed").unwrap();
    let answers = h.bus().subscribe("misbehave.unsubscribe").unwrap();
    let em = h.emitter("a", "s");
    em.emit(Event::AgentStart {
        agent: "a",
        session: "s",
    });
    let id = recv(&subscribed).json_str().to_string();
    let args = id.clone(); // {"id":N}
    em.emit(Event::ToolCallStart {
        tool: "x",
        arguments: &args,
    });
    let answer = recv(&answers);
    let v: serde_json::Value = serde_json::from_str(answer.json_str()).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("is not one of this plugin's"),
        "{v}"
    );
    // The owner's subscription still delivers.
    h.bus().publish("owner.ping", "{}").unwrap();
    wait_for(10, "the owner's message", || {
        plugin(&h, "owner").counts.topic_messages == 1
    });
}

#[test]
fn events_functions_need_the_events_permission() {
    let ws = tempfile::tempdir().unwrap();
    let toml = manifest(
        "quiet",
        "\"*\"",
        "",
        "mode = \"subscribe\"\npattern = \"x.*\"",
    )
    .replace("\"events\"]", "]")
    .replace(", ]", "]");
    install(ws.path(), "quiet", "misbehave", &toml);
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the refusal", || plugin(&h, "quiet").counts.errors == 1);
    let err = plugin(&h, "quiet").counts.last_error.unwrap();
    assert!(err.contains("lacks the \"events\" permission"), "{err}");
}

#[test]
fn plugins_reach_no_files_environment_or_network() {
    let ws = tempfile::tempdir().unwrap();
    // Something to connect to: a refused connection must mean the sandbox, not a closed port.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    misbehave(
        ws.path(),
        "escape",
        "escape",
        "",
        &format!("connect = \"{addr}\""),
    );
    // SAFETY: no other thread of this test binary reads or writes the environment.
    unsafe { std::env::set_var("PRX_HOOKS_TEST_SECRET", "s3cret") };
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the call", || {
        let c = plugin(&h, "escape").counts;
        c.ok + c.errors == 1
    });
    let p = plugin(&h, "escape");
    assert_eq!(p.counts.ok, 1, "{:?}", p.counts.last_error);
}

#[test]
fn config_reaches_the_guest() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "cfg",
        "config",
        "",
        "greeting = \"hello\"\nlimit = 5\nflag = true",
    );
    let h = hooks(ws.path());
    let sub = h.bus().subscribe("misbehave.config").unwrap();
    h.emitter("a", "s").emit(Event::TurnComplete);
    let v: serde_json::Value = serde_json::from_str(recv(&sub).json_str()).unwrap();
    assert_eq!(v["greeting"], "hello");
    assert_eq!(v["limit"], "5");
    assert_eq!(v["flag"], "true");
    assert_eq!(v["mode"], "config");
}

// ---------------------------------------------------------------- load errors

#[test]
fn a_component_of_the_wrong_world_is_refused_with_a_clear_error() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "wrong",
        "wrong_world",
        &manifest("wrong", "\"*\"", "", ""),
    );
    install(
        ws.path(),
        "good",
        "audit_hook",
        &manifest("good", "\"*\"", "", ""),
    );
    let h = hooks(ws.path());
    let st = plugins(&h);
    assert_eq!(st.errors.len(), 1, "{:?}", st.errors);
    let e = &st.errors[0];
    assert!(e.contains("plugins/wrong/plugin.wasm"), "{e}");
    assert!(
        e.contains("on-event has the wrong type: expected `func(event: string, payload-json: string) -> result<_, string>`, found `func(string) -> u32`"),
        "{e}"
    );
    assert_eq!(st.plugins.len(), 1);
    assert_eq!(st.plugins[0].name, "good");
}

#[test]
fn a_file_that_is_not_a_component_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    let dir = install(
        ws.path(),
        "junk",
        "audit_hook",
        &manifest("junk", "\"*\"", "", ""),
    );
    std::fs::write(dir.join("plugin.wasm"), b"\0asm\x01\0\0\0garbage").unwrap();
    let h = hooks(ws.path());
    let st = plugins(&h);
    assert_eq!(st.errors.len(), 1);
    assert!(
        st.errors[0].contains("not a valid component"),
        "{:?}",
        st.errors
    );
    assert!(st.plugins.is_empty());
    // Nothing listens, so emit skips.
    assert_eq!(h.emitter("a", "s").emit(Event::TurnComplete), Emit::Skipped);
}

// ---------------------------------------------------------------- reload

#[test]
fn plugins_are_added_replaced_and_removed_without_a_restart() {
    let ws = tempfile::tempdir().unwrap();
    let h = hooks(ws.path());
    assert!(plugins(&h).plugins.is_empty());
    let em = h.emitter("a", "s");
    assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);

    // Added: plugins/ itself did not exist yet.
    let dir = install(
        ws.path(),
        "late",
        "audit_hook",
        &manifest("late", "\"turn_complete\"", "", ""),
    );
    wait_for(10, "the new plugin", || {
        plugins(&h).plugins.iter().any(|p| p.name == "late")
    });
    assert_eq!(em.emit(Event::TurnComplete), Emit::Queued);
    wait_for(10, "its call", || plugin(&h, "late").counts.ok == 1);

    // Replaced: a new manifest (now also tool_call) goes live; counters carry on.
    std::fs::write(
        dir.join("plugin.toml"),
        manifest("late", "\"turn_complete\", \"tool_call\"", "", ""),
    )
    .unwrap();
    wait_for(10, "the new version", || {
        plugin(&h, "late").events.len() == 2
    });
    em.emit(Event::ToolCall {
        tool: "t",
        success: true,
        output: "",
    });
    wait_for(10, "the call on the new version", || {
        plugin(&h, "late").counts.ok == 2
    });

    // A broken replacement keeps the old version running.
    std::fs::write(dir.join("plugin.wasm"), b"not wasm").unwrap();
    wait_for(10, "the error", || !plugins(&h).errors.is_empty());
    em.emit(Event::TurnComplete);
    wait_for(10, "the old version still runs", || {
        plugin(&h, "late").counts.ok == 3
    });

    // Removed.
    std::fs::remove_dir_all(&dir).unwrap();
    wait_for(10, "the removal", || plugins(&h).plugins.is_empty());
    assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    assert!(plugins(&h).reloads >= 3);
}

#[test]
fn an_in_flight_call_finishes_on_the_old_instance_during_a_reload() {
    let ws = tempfile::tempdir().unwrap();
    let dir = misbehave(
        ws.path(),
        "slow",
        "loop",
        "max_execution_time_ms = 1_500\nmax_fuel = 1_000_000_000_000_000",
        "",
    );
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    std::thread::sleep(Duration::from_millis(100));
    let toml = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        toml.replace("mode = \"loop\"", "mode = \"noop\""),
    )
    .unwrap();
    // The new version is live while the old call still runs…
    wait_for(10, "the new version", || plugins(&h).reloads >= 1);
    h.emitter("a", "s2").emit(Event::TurnComplete);
    wait_for(10, "a call on the new version", || {
        plugin(&h, "slow").counts.ok == 1
    });
    assert_eq!(plugin(&h, "slow").counts.timeouts, 0);
    // …and the old call ends by its own deadline, counted.
    wait_for(10, "the old call's timeout", || {
        plugin(&h, "slow").counts.timeouts == 1
    });
}

// ---------------------------------------------------------------- never blocking

#[test]
fn emit_never_blocks_while_a_plugin_loops_forever() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "stuck",
        "loop",
        "max_execution_time_ms = 3_600_000\nmax_fuel = 1_000_000_000_000_000_000",
        "",
    );
    let h = hooks(ws.path());
    let em = h.emitter("a", "s");
    let t = Instant::now();
    let mut queued = 0u64;
    for _ in 0..200_000 {
        if em.emit(Event::TurnComplete) == Emit::Queued {
            queued += 1;
        }
    }
    // Liveness with generous slack: 200 k emits that never wait take milliseconds.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    wait_for(30, "the pipeline to drain", || h.pending() == 0);
    let p = plugin(&h, "stuck");
    assert!(p.counts.dropped_queue_full > 0);
    // The queue is full; the executor holds one more job (running) unless, on a busy machine,
    // the queue filled before the executor took the first one.
    let q = prx_hooks::wasm::PLUGIN_QUEUE as u64;
    assert!((q..=q + 1).contains(&p.counts.in_flight), "{:?}", p.counts);
    assert_eq!(p.counts.sent, p.counts.in_flight + p.counts.dropped);
    assert!(queued > 0);
    // Shutdown interrupts the looping call at its deadline and counts what was queued.
    let t = Instant::now();
    h.shutdown(Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let p = plugin(&h, "stuck");
    assert_eq!(p.state, "stopped");
    assert_eq!(p.counts.in_flight, 0);
    assert_eq!(p.counts.timeouts, 0);
    assert!(p.counts.dropped_shutdown >= prx_hooks::wasm::PLUGIN_QUEUE as u64);
    let sink = h
        .stats()
        .sinks
        .into_iter()
        .find(|s| s.name == "wasm")
        .unwrap();
    assert!(sink.counts.balanced(), "{:?}", sink.counts);
}

// ---------------------------------------------------------------- pools and order

#[test]
fn a_pool_keeps_each_emitters_events_in_order() {
    let ws = tempfile::tempdir().unwrap();
    let toml = audit_manifest()
        .replace("echo_topic = \"\"", "echo_topic = \"audit.seen\"")
        .replace("pool_size = 1", "pool_size = 3");
    install(ws.path(), "audit-hook", "audit_hook", &toml);
    let h = hooks(ws.path());
    assert_eq!(plugin(&h, "audit-hook").pool_size, 3);
    let seen = h.bus().subscribe("audit.seen").unwrap();
    let emitters: Vec<_> = (0..6)
        .map(|i| h.emitter("agent", &format!("s{i}")))
        .collect();
    const N: u64 = 200;
    // The payload says which emitter sent it and in which position.
    let names: Vec<String> = (0..emitters.len()).map(|i| format!("e{i}")).collect();
    for n in 0..N {
        if n % 10 == 0 {
            // Stay well inside the plugin's queues (1,024 split over 3 instances): nothing in
            // the ring, fewer than 100 events queued for the plugin, before the next 60.
            wait_for(30, "the plugin to catch up", || {
                h.pending() == 0 && plugin(&h, "audit-hook").counts.in_flight < 100
            });
        }
        let position = n.to_string();
        for (em, name) in emitters.iter().zip(&names) {
            em.emit(Event::AgentStart {
                agent: name,
                session: &position,
            });
        }
    }
    let mut next: std::collections::HashMap<String, u64> = Default::default();
    for _ in 0..N as usize * emitters.len() {
        let m = seen
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no echo: {:#?}", h.stats()));
        let v: serde_json::Value = serde_json::from_str(m.json_str()).unwrap();
        let who = v["payload"]["agent"].as_str().unwrap().to_string();
        let n: u64 = v["payload"]["session"].as_str().unwrap().parse().unwrap();
        let expected = next.entry(who.clone()).or_insert(0);
        assert_eq!(
            n,
            *expected,
            "{who}'s events out of order: {:?}",
            plugin(&h, "audit-hook")
        );
        *expected += 1;
    }
    assert!(next.values().all(|&n| n == N));
    let p = plugin(&h, "audit-hook");
    assert_eq!(p.counts.ok, N * emitters.len() as u64);
    // Six emitters over three instances: more than one instance worked.
    assert!(p.counts.instances_created >= 3, "{:?}", p.counts);
}

#[test]
fn fire_runs_every_matching_plugin_once_even_when_suspended() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "audit-hook",
        "audit_hook",
        &manifest("audit-hook", "\"*\"", "", ""),
    );
    misbehave(ws.path(), "bad", "err", "", "");
    misbehave(ws.path(), "notme", "noop", "", "");
    std::fs::write(
        ws.path().join("plugins/notme/plugin.toml"),
        manifest("notme", "\"agent_end\"", "", "mode = \"noop\""),
    )
    .unwrap();
    let sink = prx_hooks::wasm::WasmSink::standalone(ws.path().to_path_buf()).unwrap();
    assert!(sink.errors().is_empty(), "{:?}", sink.errors());
    let msg = prx_hooks::shell::event_message(&Event::TurnComplete, "a", "s", 0);
    let mut out = sink.fire(EventKind::TurnComplete, &msg);
    out.sort_by(|a, b| a.plugin.cmp(&b.plugin));
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].plugin, "audit-hook");
    assert_eq!(out[0].outcome, Some(CallOutcome::Ok));
    assert!(
        out[0]
            .to_string()
            .starts_with("plugin audit-hook turn_complete: ok (")
    );
    assert_eq!(
        out[1].outcome,
        Some(CallOutcome::Error("guest error: as requested".into()))
    );
    assert!(
        out[1]
            .to_string()
            .starts_with("plugin bad turn_complete: error: guest error: as requested (")
    );
    // A plugin that traps is suspended after three faults; fire runs it all the same.
    misbehave(ws.path(), "boom", "trap", "", "");
    assert!(sink.reload().started == ["boom"]);
    for n in 1..=4 {
        let out = sink.fire(EventKind::TurnComplete, &msg);
        let boom = out.iter().find(|o| o.plugin == "boom").unwrap();
        assert!(
            matches!(&boom.outcome, Some(CallOutcome::Trap(m)) if m.contains("unreachable")),
            "fire {n}: {boom}"
        );
    }
    let st = sink.stats();
    let boom = st.plugins.iter().find(|p| p.name == "boom").unwrap();
    assert_eq!(boom.state, "suspended");
    assert_eq!(boom.counts.traps, 4);
    prx_hooks::Sink::shutdown(&sink, Instant::now() + Duration::from_secs(2));
    assert_eq!(kv_count(ws.path(), "audit-hook", "count"), 5);
}

#[test]
fn a_suspended_plugin_resumes_by_itself_and_backs_off_exponentially() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "flaky", "trap", "", "only = \"tool_call\"");
    let h = hooks(ws.path());
    let em = h.emitter("a", "s");
    let tool_call = Event::ToolCall {
        tool: "t",
        success: true,
        output: "",
    };
    for _ in 0..3 {
        em.emit(tool_call);
    }
    wait_for(10, "the first suspension", || {
        plugin(&h, "flaky").state == "suspended"
    });
    let first = plugin(&h, "flaky").suspended_for_ms.unwrap();
    assert!(first <= 1000, "{first}");
    // It resumes by itself after the backoff: the next event runs (a good one here)…
    wait_for(10, "the resumption", || {
        plugin(&h, "flaky").state == "running"
    });
    em.emit(Event::TurnComplete);
    wait_for(10, "a call after the suspension", || {
        plugin(&h, "flaky").counts.ok == 1
    });
    assert_eq!(plugin(&h, "flaky").counts.dropped_suspended, 0);
    // …and a success resets the breaker: it takes three faults again, then 1 s again.
    em.emit(tool_call);
    em.emit(tool_call);
    wait_for(10, "two traps", || plugin(&h, "flaky").counts.traps == 5);
    assert_eq!(plugin(&h, "flaky").state, "running");
    em.emit(tool_call);
    wait_for(10, "the second suspension", || {
        plugin(&h, "flaky").counts.suspensions == 2
    });
    // A fault right after a suspension ends doubles the next one.
    wait_for(10, "the resumption", || {
        plugin(&h, "flaky").state == "running"
    });
    em.emit(tool_call);
    wait_for(10, "the third suspension", || {
        plugin(&h, "flaky").counts.suspensions == 3
    });
    let third = plugin(&h, "flaky").suspended_for_ms.unwrap();
    assert!((1000..=2000).contains(&third), "{third}");
}
