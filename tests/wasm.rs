//! WASM plugins with real components (ARCHITECTURE.md § WASM plugins).
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

#[path = "support/crafted.rs"]
mod crafted;
#[path = "support/plugins.rs"]
mod plugins;

/// WASM policies (docs/policies.md § WASM policies).
#[cfg(feature = "http")]
#[path = "wasm/policy.rs"]
mod policy;

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
    // The guest publishes its echo before the host counts the call done.
    wait_for(10, "eight calls counted", || {
        let c = plugin(&h, "audit-hook").counts;
        (c.ok, c.sent, c.delivered) == (8, 8, 8)
    });
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
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prx/plugin.toml"),
    )
    .expect("tests/fixtures/prx/plugin.toml (the PRX sample)");
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
    // A plugin without a hook capability is not loaded at all: skipped, and said why.
    assert!(
        plugins(&h)
            .skipped
            .iter()
            .any(|s| s.starts_with("other: a tool plugin")),
        "{:?}",
        plugins(&h).skipped
    );
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
fn a_reload_interrupts_the_old_versions_call_and_the_new_version_runs() {
    let ws = tempfile::tempdir().unwrap();
    let dir = misbehave(
        ws.path(),
        "slow",
        "loop",
        "max_execution_time_ms = 600_000\nmax_fuel = 1_000_000_000_000_000_000",
        "",
    );
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the call to start", || {
        plugin(&h, "slow").counts.instances_created >= 2
    });
    let toml = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        toml.replace("mode = \"loop\"", "mode = \"noop\""),
    )
    .unwrap();
    wait_for(10, "the new version", || plugins(&h).reloads >= 1);
    // The old version's call is stopped at once (not after its 10-minute limit)…
    wait_for(10, "the old call's interruption", || {
        plugin(&h, "slow").counts.failed == 1
    });
    assert_eq!(plugin(&h, "slow").counts.timeouts, 0);
    // …and the new version takes the next event.
    h.emitter("a", "s2").emit(Event::TurnComplete);
    wait_for(10, "a call on the new version", || {
        plugin(&h, "slow").counts.ok == 1
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
    // The last echo can arrive before its call is counted.
    wait_for(10, "every call counted", || {
        plugin(&h, "audit-hook").counts.ok == N * emitters.len() as u64
    });
    let p = plugin(&h, "audit-hook");
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
    // …but one success does not clear its record: on probation, one fault suspends it again,
    // for twice as long.
    em.emit(tool_call);
    wait_for(10, "the second suspension", || {
        plugin(&h, "flaky").counts.suspensions == 2
    });
    let second = plugin(&h, "flaky").suspended_for_ms.unwrap();
    assert!((1000..=2000).contains(&second), "{second}");
    // Ten successes in a row after it clear the record: three faults again, then 1 s again.
    wait_for(10, "the resumption", || {
        plugin(&h, "flaky").state == "running"
    });
    for _ in 0..10 {
        em.emit(Event::TurnComplete);
    }
    wait_for(10, "ten calls", || plugin(&h, "flaky").counts.ok == 11);
    em.emit(tool_call);
    em.emit(tool_call);
    wait_for(10, "two traps", || plugin(&h, "flaky").counts.traps == 6);
    assert_eq!(plugin(&h, "flaky").state, "running");
    em.emit(tool_call);
    wait_for(10, "the third suspension", || {
        plugin(&h, "flaky").counts.suspensions == 3
    });
    let third = plugin(&h, "flaky").suspended_for_ms.unwrap();
    assert!(third <= 1000, "{third}");
}

// ---------------------------------------------------------------- hostile guests

/// Runs `f` on a thread; panics if it has not returned within `secs` (the thread is left to
/// finish: the point is that a hang fails the test instead of hanging it).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not return within {secs} s"))
}

#[test]
fn a_guest_sleeping_in_a_host_call_times_out_at_its_deadline() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "sleeper",
        "sleep",
        "max_execution_time_ms = 200",
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
    wait_for(20, "the sleeping call's timeout", || {
        plugin(&h, "sleeper").counts.timeouts == 1
    });
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    // The instance was replaced; the next call works.
    em.emit(Event::TurnComplete);
    wait_for(10, "the next call", || plugin(&h, "sleeper").counts.ok == 1);
    assert_eq!(plugin(&h, "sleeper").counts.instances_replaced, 1);
}

#[test]
fn a_short_sleep_in_a_guest_completes() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "napper", "sleep", "", "sleep_ms = \"50\"");
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(20, "the call", || plugin(&h, "napper").counts.ok == 1);
}

#[test]
fn shutdown_keeps_its_deadline_while_a_guest_sleeps_in_a_host_call() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "sleeper",
        "sleep",
        "max_execution_time_ms = 3_600_000\npool_size = 2",
        "",
    );
    let h = std::sync::Arc::new(hooks(ws.path()));
    for s in ["s1", "s2", "s3", "s4"] {
        h.emitter("a", s).emit(Event::TurnComplete);
    }
    wait_for(10, "a call in progress", || {
        plugin(&h, "sleeper").counts.instances_created >= 2
    });
    std::thread::sleep(Duration::from_millis(200));
    let h2 = h.clone();
    let took = within(30, "shutdown", move || {
        let t = Instant::now();
        h2.shutdown(Duration::from_millis(300));
        t.elapsed()
    });
    // The contract: deadline (300 ms) + 250 ms; 1 s of slack for a loaded machine.
    assert!(took < Duration::from_millis(1300), "{took:?}");
    let p = plugin(&h, "sleeper");
    assert_eq!(p.counts.in_flight, 0, "{:?}", p.counts);
    assert_eq!(
        p.counts.sent,
        p.counts.delivered + p.counts.dropped + p.counts.failed,
        "{:?}",
        p.counts
    );
    assert!(p.counts.failed >= 1, "{:?}", p.counts);
}

#[test]
fn start_code_runs_under_the_plugins_limits_at_load() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "trapstart", "noop", "", "start = \"trap\"");
    misbehave(
        ws.path(),
        "sleepstart",
        "noop",
        "max_execution_time_ms = 300",
        "start = \"sleep\"",
    );
    misbehave(
        ws.path(),
        "loopstart",
        "noop",
        "max_execution_time_ms = 300\nmax_fuel = 1_000_000_000_000_000",
        "start = \"loop\"",
    );
    misbehave(ws.path(), "fine", "noop", "", "");
    let ws_path = ws.path().to_path_buf();
    let h = within(60, "loading", move || hooks(&ws_path));
    let st = plugins(&h);
    let err = |name: &str| {
        st.errors
            .iter()
            .find(|e| e.contains(&format!("/{name}/")))
            .unwrap_or_else(|| panic!("no error for {name}: {:?}", st.errors))
            .clone()
    };
    assert!(
        err("trapstart").contains("cannot instantiate"),
        "{}",
        err("trapstart")
    );
    assert!(
        err("sleepstart").contains("timed out after 300 ms"),
        "{}",
        err("sleepstart")
    );
    assert!(
        err("loopstart").contains("timed out after 300 ms"),
        "{}",
        err("loopstart")
    );
    assert_eq!(st.plugins.len(), 1, "{:?}", st.plugins);
}

#[test]
fn a_slow_probe_blocks_neither_stats_nor_shutdown() {
    let ws = tempfile::tempdir().unwrap();
    let h = std::sync::Arc::new(hooks(ws.path()));
    // Its start code sleeps for an hour, and its limit lets it.
    misbehave(
        ws.path(),
        "slowstart",
        "noop",
        "max_execution_time_ms = 3_600_000",
        "start = \"sleep\"",
    );
    // The watcher's reload is now inside the probe (which lasts 1 s: start code is capped at
    // min(max_execution_time_ms, 1 s)).
    std::thread::sleep(Duration::from_millis(400));
    let h2 = h.clone();
    within(10, "stats during a probe", move || h2.stats());
    let h2 = h.clone();
    let took = within(30, "shutdown during a probe", move || {
        let t = Instant::now();
        h2.shutdown(Duration::from_millis(300));
        t.elapsed()
    });
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn removing_a_plugin_stops_its_running_call_and_drops_its_queue() {
    let ws = tempfile::tempdir().unwrap();
    let dir = misbehave(
        ws.path(),
        "stuck",
        "loop",
        "max_execution_time_ms = 600_000\nmax_fuel = 1_000_000_000_000_000_000",
        "",
    );
    let h = hooks(ws.path());
    let em = h.emitter("a", "s");
    for _ in 0..5 {
        em.emit(Event::TurnComplete);
    }
    wait_for(10, "the queue", || {
        plugin(&h, "stuck").counts.in_flight == 5
    });
    std::fs::remove_dir_all(&dir).unwrap();
    wait_for(10, "the removal", || plugins(&h).plugins.is_empty());
    // Its counters are the sink's: the running call is interrupted, the queue dropped.
    wait_for(10, "the sink's counts to settle", || {
        let c = h
            .stats()
            .sinks
            .into_iter()
            .find(|s| s.name == "wasm")
            .unwrap()
            .counts;
        c.in_flight == 0 && c.failed == 1 && c.dropped == 4
    });
}

#[test]
fn replacing_a_plugin_interrupts_the_old_version_and_frees_its_instances() {
    let ws = tempfile::tempdir().unwrap();
    let looping =
        "max_execution_time_ms = 600_000\nmax_fuel = 1_000_000_000_000_000_000\npool_size = 4";
    let dir = misbehave(ws.path(), "stuck", "loop", looping, "");
    install(
        ws.path(),
        "innocent",
        "audit_hook",
        &manifest("innocent", "\"turn_complete\"", "", ""),
    );
    let h = hooks(ws.path());
    let toml = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    // Every reload starts a new version whose four instances loop; each old version must let
    // go of its instances, or the pool runs dry and the innocent plugin cannot instantiate.
    for round in 0..6 {
        for s in 0..16 {
            h.emitter("a", &format!("s{s}")).emit(Event::AgentStart {
                agent: "a",
                session: "s",
            });
        }
        std::fs::write(
            dir.join("plugin.toml"),
            format!("{toml}\n# round {round}\n"),
        )
        .unwrap();
        // Generous for a loaded machine: every round leaves four guests spinning until the
        // reload interrupts them. (This once failed intermittently with "reloads 0": an edit
        // made during the first load was never watched; see the test above.)
        wait_for(60, "the reload", || plugins(&h).reloads > round);
    }
    let em = h.emitter("b", "b");
    for _ in 0..5 {
        em.emit(Event::TurnComplete);
    }
    wait_for(20, "the innocent plugin's calls", || {
        plugin(&h, "innocent").counts.ok == 5
    });
    let innocent = plugin(&h, "innocent");
    assert_eq!(innocent.counts.traps, 0, "{:?}", innocent.counts);
    assert_eq!(innocent.counts.suspensions, 0, "{:?}", innocent.counts);
    let stuck = plugin(&h, "stuck");
    assert!(
        stuck.counts.failed + stuck.counts.dropped_reload > 0,
        "{:?}",
        stuck.counts
    );
    assert_eq!(stuck.counts.timeouts, 0, "{:?}", stuck.counts);
}

#[test]
fn a_plugin_edited_while_the_plugins_load_at_start_is_reloaded() {
    // The watcher used to set up its watch on plugins/ only after the initial load, on its own
    // thread: an edit landing after the load's scan and before that watch was never seen (the
    // intermittent "reload never acted on" of the replacement test below, on a loaded machine).
    // A plugin whose start code sleeps holds the initial load for its 1 s start limit; the
    // edit lands in the middle of it.
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "slowstart",
        "noop",
        "max_execution_time_ms = 1000",
        "start = \"sleep\"",
    );
    let dir = install(
        ws.path(),
        "audit",
        "audit_hook",
        &manifest("audit", "\"turn_complete\"", "", ""),
    );
    let path = dir.join("plugin.toml");
    let toml = std::fs::read_to_string(&path).unwrap();
    let edit = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        std::fs::write(&path, format!("{toml}\n# edited while loading\n")).unwrap();
    });
    let h = hooks(ws.path());
    edit.join().unwrap();
    assert!(
        plugins(&h).errors.iter().any(|e| e.contains("slowstart")),
        "the sleeping start code must fail its probe: {:?}",
        plugins(&h)
    );
    wait_for(
        20,
        "the reload of the plugin edited during the load",
        || plugins(&h).reloads >= 1,
    );
}

#[test]
fn alternating_faults_and_successes_suspend_the_plugin() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "flaky", "flaky", "", "");
    let h = hooks(ws.path());
    let em = h.emitter("a", "s");
    for _ in 0..12 {
        em.emit(Event::TurnComplete);
    }
    wait_for(20, "the calls", || {
        let c = plugin(&h, "flaky").counts;
        c.sent == 12 && c.in_flight == 0
    });
    let p = plugin(&h, "flaky");
    assert!(p.counts.traps >= 4 && p.counts.ok >= 4, "{:?}", p.counts);
    assert_eq!(p.counts.suspensions, 1, "{:?}", p.counts);
}

#[test]
fn concurrent_faults_during_a_suspension_do_not_lengthen_it() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "slowfail",
        "loop",
        "max_execution_time_ms = 400\nmax_fuel = 1_000_000_000_000_000\npool_size = 4",
        "",
    );
    let h = hooks(ws.path());
    // Enough emitters that every one of the four instances runs a call at once.
    for s in 0..32 {
        h.emitter("a", &format!("s{s}")).emit(Event::TurnComplete);
    }
    wait_for(20, "the timeouts", || {
        plugin(&h, "slowfail").counts.timeouts >= 4
    });
    wait_for(20, "the rest", || {
        plugin(&h, "slowfail").counts.in_flight == 0
    });
    let p = plugin(&h, "slowfail");
    assert_eq!(p.counts.suspensions, 1, "{:?}", p.counts);
}

#[test]
fn a_forced_fire_does_not_lift_a_suspension() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(ws.path(), "boom", "trap", "", "only = \"turn_complete\"");
    let sink = prx_hooks::wasm::WasmSink::standalone(ws.path().to_path_buf()).unwrap();
    let turn = prx_hooks::shell::event_message(&Event::TurnComplete, "a", "s", 0);
    for _ in 0..3 {
        sink.fire(EventKind::TurnComplete, &turn);
    }
    let state = |sink: &prx_hooks::wasm::WasmSink| sink.stats().plugins[0].state.clone();
    assert_eq!(state(&sink), "suspended");
    let start = prx_hooks::shell::event_message(
        &Event::AgentStart {
            agent: "a",
            session: "s",
        },
        "a",
        "s",
        0,
    );
    let out = sink.fire(EventKind::AgentStart, &start);
    assert_eq!(out[0].outcome, Some(CallOutcome::Ok));
    assert_eq!(state(&sink), "suspended");
    prx_hooks::Sink::shutdown(&sink, Instant::now() + Duration::from_secs(2));
}

/// docs/plugins.md § WASM plugins: a suspended plugin "resumes by itself or at once when its files
/// change" (and the host's suspension warning says so). The record carries over by name, so the
/// new version is on probation, but the suspension of the old code does not hold the new code.
#[test]
fn a_suspended_plugin_whose_files_change_runs_at_once() {
    let ws = tempfile::tempdir().unwrap();
    let dir = misbehave(ws.path(), "fixme", "trap", "", "");
    let sink = prx_hooks::wasm::WasmSink::standalone(ws.path().to_path_buf()).unwrap();
    let turn = prx_hooks::shell::event_message(&Event::TurnComplete, "a", "s", 0);
    let fixme = |sink: &prx_hooks::wasm::WasmSink| sink.stats().plugins[0].clone();
    // Three faults: 1 s; then one fault after each suspension: 2 s, 4 s, 8 s.
    for _ in 0..3 {
        sink.fire(EventKind::TurnComplete, &turn);
    }
    for _ in 0..3 {
        wait_for(20, "the end of a suspension", || {
            fixme(&sink).state == "running"
        });
        sink.fire(EventKind::TurnComplete, &turn);
    }
    let p = fixme(&sink);
    assert_eq!((p.state.as_str(), p.counts.suspensions), ("suspended", 4));
    assert!(p.suspended_for_ms.unwrap() > 5000, "{p:?}");
    // The user fixes the plugin.
    std::fs::write(
        dir.join("plugin.toml"),
        manifest("fixme", "\"*\"", "", "mode = \"noop\""),
    )
    .unwrap();
    let report = sink.reload();
    assert_eq!(report.started, ["fixme"], "{report:?}");
    assert_eq!(fixme(&sink).state, "running", "{:?}", fixme(&sink));
    prx_hooks::Sink::deliver(&sink, &turn);
    wait_for(10, "the event to be handled", || {
        let c = fixme(&sink).counts;
        c.delivered + c.dropped == 1
    });
    let c = fixme(&sink).counts;
    assert_eq!((c.delivered, c.dropped_suspended), (1, 0), "{c:?}");
    prx_hooks::Sink::shutdown(&sink, Instant::now() + Duration::from_secs(2));
}

#[test]
fn hot_reload_works_with_a_relative_workspace() {
    let ws = tempfile::tempdir_in(".").unwrap();
    let rel = ws
        .path()
        .strip_prefix(std::env::current_dir().unwrap())
        .unwrap_or(ws.path());
    let rel = Path::new(".").join(rel.file_name().unwrap());
    assert!(rel.is_relative());
    let h = hooks(&rel);
    install(
        ws.path(),
        "late",
        "audit_hook",
        &manifest("late", "\"turn_complete\"", "", ""),
    );
    wait_for(10, "the new plugin", || {
        plugins(&h).plugins.iter().any(|p| p.name == "late")
    });
    std::fs::write(
        ws.path().join("plugins/late/plugin.toml"),
        manifest("late", "\"turn_complete\", \"tool_call\"", "", ""),
    )
    .unwrap();
    wait_for(10, "the edit", || plugin(&h, "late").events.len() == 2);
}

#[test]
fn a_replaced_plugins_directory_is_watched_again() {
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "first",
        "audit_hook",
        &manifest("first", "\"turn_complete\"", "", ""),
    );
    let h = hooks(ws.path());
    assert_eq!(plugins(&h).plugins.len(), 1);
    // Replaced by rename.
    let staging = ws.path().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::rename(ws.path().join("plugins"), ws.path().join("old")).unwrap();
    install(
        &staging,
        "second",
        "audit_hook",
        &manifest("second", "\"turn_complete\"", "", ""),
    );
    std::fs::rename(staging.join("plugins"), ws.path().join("plugins")).unwrap();
    wait_for(10, "the renamed-in directory", || {
        let p = plugins(&h).plugins;
        p.len() == 1 && p[0].name == "second"
    });
    // A change inside the new directory is seen.
    install(
        ws.path(),
        "third",
        "audit_hook",
        &manifest("third", "\"turn_complete\"", "", ""),
    );
    wait_for(10, "a plugin added to it", || {
        plugins(&h).plugins.len() == 2
    });
    // Deleted and created again.
    std::fs::remove_dir_all(ws.path().join("plugins")).unwrap();
    wait_for(10, "the deletion", || plugins(&h).plugins.is_empty());
    install(
        ws.path(),
        "fourth",
        "audit_hook",
        &manifest("fourth", "\"turn_complete\"", "", ""),
    );
    wait_for(10, "the recreated directory", || {
        plugins(&h).plugins.len() == 1
    });
    install(
        ws.path(),
        "fifth",
        "audit_hook",
        &manifest("fifth", "\"turn_complete\"", "", ""),
    );
    wait_for(10, "a plugin added to it", || {
        plugins(&h).plugins.len() == 2
    });
}

#[test]
fn a_payload_that_is_not_json_is_published_as_a_json_string() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "pub",
        "publish",
        "",
        "topic = \"prx.out\"\npayload = \"plain \\\"text\\\"\"",
    );
    let h = hooks(ws.path());
    let sub = h.bus().subscribe("prx.out").unwrap();
    h.emitter("a", "s").emit(Event::TurnComplete);
    let msg = recv(&sub);
    assert_eq!(msg.json_str(), r#""plain \"text\"""#);
    // JSON stays as it is.
    let v: serde_json::Value = serde_json::from_str(msg.json_str()).unwrap();
    assert_eq!(v, "plain \"text\"");
    wait_for(10, "the call", || plugin(&h, "pub").counts.ok == 1);
}

#[test]
fn a_manifest_rewritten_while_reloads_run_ends_with_the_last_version_running() {
    // with the real watcher and real reloads: plugin.toml is rewritten again
    // and again (in place, so a reload can also see it half-written, and by rename) at gaps
    // around the debounce time, so that writes land while reloads scan, parse and fingerprint.
    // A host that fingerprinted the file as it was after the parse (not the text it parsed)
    // could label the version it runs with a later text and never load that text: after each
    // burst, the version that answers must be the last one written.
    let ws = tempfile::tempdir().unwrap();
    let text = |v: u32| {
        manifest(
            "swap",
            "\"turn_complete\"",
            "",
            &format!("mode = \"publish\"\ntopic = \"swap.out\"\npayload = '{{\"v\":{v}}}'"),
        )
    };
    let dir = install(ws.path(), "swap", "misbehave", &text(0));
    let path = dir.join("plugin.toml");
    let h = hooks(ws.path());
    let sub = h.bus().subscribe("swap.out").unwrap();
    let em = h.emitter("a", "s");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        | 1;
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let mut v = 0;
    for burst in 0..6 {
        for _ in 0..25 {
            v += 1;
            if next() % 2 == 0 {
                std::fs::write(&path, text(v)).unwrap();
            } else {
                let tmp = dir.join(".plugin.toml.tmp");
                std::fs::write(&tmp, text(v)).unwrap();
                std::fs::rename(&tmp, &path).unwrap();
            }
            std::thread::sleep(Duration::from_millis(u64::from(next() % 40)));
        }
        // Quiet now: the last text must come to run, and stay.
        let want = format!("{{\"v\":{v}}}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            while sub.try_recv().is_ok() {}
            em.emit(Event::TurnComplete);
            let got = sub.recv_timeout(Duration::from_secs(5));
            if got.as_ref().is_ok_and(|m| m.json_str() == want) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "burst {burst} (seed {seed}): the last manifest written ({want}) never ran; \
                 the plugin answers {:?}; {:?}",
                got.map(|m| m.json_str().to_owned()),
                plugins(&h)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn a_busy_plugins_subscription_queue_holds_one_message_per_mib_of_its_memory_limit() {
    // What an instance's subscriptions queue is host memory the guest causes: at most
    // max(16, max_memory_mb) messages (each at most the bus's 1 MiB payload limit), the rest
    // dropped and counted by the bus — not 1024 per instance.
    let ws = tempfile::tempdir().unwrap();
    install(
        ws.path(),
        "listener",
        "misbehave",
        &manifest(
            "listener",
            "\"agent_start\"",
            "max_memory_mb = 20\nmax_execution_time_ms = 20_000\npool_size = 1",
            "mode = \"subscribe\"\npattern = \"flood.*\"\nsleep_ms = \"3000\"",
        ),
    );
    let h = hooks(ws.path());
    let subscribed = h.bus().subscribe("misbehave.subscribed").unwrap();
    h.emitter("a", "s").emit(Event::AgentStart {
        agent: "a",
        session: "s",
    });
    recv(&subscribed);
    // The first flood message puts the instance to sleep for 3 s; the rest arrive meanwhile.
    for n in 0..200 {
        h.bus()
            .publish("flood.x", format!("{{\"n\":{n}}}").as_bytes())
            .unwrap();
    }
    let flood = h
        .bus()
        .subscribers()
        .into_iter()
        .find(|s| s.pattern == "flood.*")
        .expect("the plugin's subscription");
    assert_eq!(flood.capacity, 20, "{flood:?}");
    assert!(flood.queued <= 20, "{flood:?}");
    assert!(
        flood.dropped >= 200 - 21 && flood.delivered <= 21,
        "at most one message taken and 20 queued: {flood:?}"
    );
    assert_eq!(flood.dropped + flood.delivered, 200, "{flood:?}");
}

#[test]
fn kv_entries_count_their_overhead_against_the_cap() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "filler",
        "kvfill",
        "max_kv_storage_mb = 1\nmax_fuel = 1_000_000_000_000",
        "count = \"2000000\"",
    );
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(60, "the refusal", || {
        plugin(&h, "filler").counts.errors == 1
    });
    let p = plugin(&h, "filler");
    assert!(
        p.counts
            .last_error
            .as_deref()
            .unwrap()
            .contains("storage limit"),
        "{:?}",
        p.counts
    );
    assert!(p.kv_bytes <= 1 << 20, "{}", p.kv_bytes);
    // Empty values under a 1 MiB cap: a few thousand entries, not the hundreds of thousands
    // that counting only key bytes let in.
    let path = ws.path().join(".prx-hooks/kv/filler");
    wait_for(10, "the kv file", || path.exists());
    let file = std::fs::metadata(&path).unwrap().len();
    assert!(file < 512 << 10, "{file} bytes on disk");
}

// ------------------------------------------- host calls that wait on files

/// Holds the kv file lock of `plugin` the way another `prx-hooks` process would (flock on its
/// own open file description) until the returned file is dropped.
fn hold_kv_lock(ws: &Path, plugin: &str) -> std::fs::File {
    let f = std::fs::File::options()
        .write(true)
        .open(ws.join(".prx-hooks/kv").join(format!("{plugin}.lock")))
        .expect("the store's lock file exists once the plugin is loaded");
    f.lock().unwrap();
    f
}

#[test]
fn a_kv_write_waiting_for_another_processs_lock_ends_at_the_calls_deadline() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "counter",
        "count",
        "max_execution_time_ms = 300",
        "",
    );
    let h = hooks(ws.path());
    let held = hold_kv_lock(ws.path(), "counter");
    h.emitter("a", "s").emit(Event::TurnComplete);
    // The lock is let go 1 s after the call started (its deadline was at 300 ms). Before, the
    // write was still waiting (up to 2 s) and went through then, in a call past its deadline.
    std::thread::sleep(Duration::from_secs(1));
    drop(held);
    wait_for(20, "the call's end", || {
        let c = plugin(&h, "counter").counts;
        c.timeouts + c.errors + c.ok >= 1
    });
    let c = plugin(&h, "counter").counts;
    assert_eq!((c.timeouts, c.errors, c.ok), (1, 0, 0), "{c:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        kv_count(ws.path(), "counter", "n.turn_complete"),
        0,
        "a write went through after the call's deadline"
    );
    // With the lock free again, the next call writes.
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(20, "the next call", || plugin(&h, "counter").counts.ok == 1);
    h.shutdown(Duration::from_secs(2));
    assert_eq!(kv_count(ws.path(), "counter", "n.turn_complete"), 1);
}

#[test]
fn shutdown_ends_a_kv_write_waiting_for_another_processs_lock() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "counter",
        "count",
        "max_execution_time_ms = 60_000",
        "",
    );
    let h = std::sync::Arc::new(hooks(ws.path()));
    let held = hold_kv_lock(ws.path(), "counter");
    h.emitter("a", "s").emit(Event::TurnComplete);
    // The call is now waiting for the lock (it started within a few ms).
    std::thread::sleep(Duration::from_millis(300));
    // Before: stats waited for the store, which the write held while it waited (2 s).
    let t = Instant::now();
    let c = plugin(&h, "counter").counts;
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "stats took {:?}",
        t.elapsed()
    );
    assert_eq!(c.in_flight, 1, "{c:?}");
    let h2 = h.clone();
    within(30, "shutdown", move || {
        h2.shutdown(Duration::from_millis(100))
    });
    let c = plugin(&h, "counter").counts;
    assert_eq!(c.in_flight, 0, "{c:?}");
    assert_eq!(c.failed, 1, "{c:?}");
    // Before: the executor was still waiting for the lock (up to 2 s) after shutdown returned,
    // and wrote as soon as the lock was let go.
    drop(held);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        kv_count(ws.path(), "counter", "n.turn_complete"),
        0,
        "a write went through after shutdown"
    );
}

#[test]
fn a_start_code_sleeper_with_an_hour_long_limit_does_not_stall_loading() {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        "slowstart",
        "noop",
        "max_execution_time_ms = 3_600_000",
        "start = \"sleep\"",
    );
    misbehave(ws.path(), "fine", "noop", "", "");
    let ws_path = ws.path().to_path_buf();
    // Before: `build` waited for the start code up to its hour-long limit.
    let (h, took) = within(60, "Hooks::build", move || {
        let t = Instant::now();
        let h = hooks(&ws_path);
        (h, t.elapsed())
    });
    // The cap is 1 s; generous slack for a loaded machine.
    assert!(took < Duration::from_secs(20), "{took:?}");
    let st = plugins(&h);
    assert!(
        st.errors
            .iter()
            .any(|e| e.contains("/slowstart/") && e.contains("start code timed out after 1000 ms")),
        "{:?}",
        st.errors
    );
    assert_eq!(st.plugins.len(), 1, "{:?}", st.plugins);
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the other plugin's call", || {
        plugin(&h, "fine").counts.ok == 1
    });
}

/// Opening a plugin's kv store takes its file lock, which another process may hold (a `fire`
/// writing, compacting or opening a large store). That wait must hold neither `stats()` nor
/// shutdown (before: the load opened every new store under the state lock, 2 s per store), and
/// a store that is already a log must not be left in memory only because its lock was busy
/// for a moment (before: its writes were never written).
#[test]
fn opening_kv_stores_whose_locks_another_process_holds_blocks_neither_stats_nor_shutdown() {
    let ws = tempfile::tempdir().unwrap();
    let h = std::sync::Arc::new(hooks(ws.path()));
    let kv_dir = ws.path().join(".prx-hooks/kv");
    std::fs::create_dir_all(&kv_dir).unwrap();
    let names: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
    // Their stores exist (earlier runs wrote them), and another process holds their locks.
    let held: Vec<std::fs::File> = names
        .iter()
        .map(|n| {
            std::fs::write(kv_dir.join(n), b"PRXKV2\n").unwrap();
            let f = std::fs::File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(kv_dir.join(format!("{n}.lock")))
                .unwrap();
            f.lock().unwrap();
            f
        })
        .collect();
    for n in &names {
        misbehave(ws.path(), n, "count", "", "");
    }
    // The watcher's load is now opening the stores.
    std::thread::sleep(Duration::from_millis(500));
    let h2 = h.clone();
    let took = within(60, "stats while stores open", move || {
        let t = Instant::now();
        h2.stats();
        t.elapsed()
    });
    assert!(took < Duration::from_secs(3), "stats took {took:?}");
    wait_for(30, "the five plugins", || plugins(&h).plugins.len() == 5);
    drop(held);
    let em = h.emitter("a", "s");
    em.emit(Event::TurnComplete);
    wait_for(10, "five calls", || {
        plugins(&h).plugins.iter().all(|p| p.counts.ok == 1)
    });
    let h2 = h.clone();
    let took = within(60, "shutdown", move || {
        let t = Instant::now();
        h2.shutdown(Duration::from_secs(2));
        t.elapsed()
    });
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    for n in &names {
        assert_eq!(
            kv_count(ws.path(), n, "n.turn_complete"),
            1,
            "{n}'s write is not in its kv file (kept in memory only?)"
        );
    }
}

/// The same wait at shutdown: a load opening stores whose locks are held is cancelled with it.
#[test]
fn shutdown_does_not_wait_for_a_load_opening_locked_kv_stores() {
    let ws = tempfile::tempdir().unwrap();
    let h = std::sync::Arc::new(hooks(ws.path()));
    let kv_dir = ws.path().join(".prx-hooks/kv");
    std::fs::create_dir_all(&kv_dir).unwrap();
    // New stores (no log yet): opening them must wait for the lock to write the first bytes.
    let _held: Vec<std::fs::File> = (0..5)
        .map(|i| {
            let n = format!("q{i}");
            let f = std::fs::File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(kv_dir.join(format!("{n}.lock")))
                .unwrap();
            f.lock().unwrap();
            misbehave(ws.path(), &n, "count", "", "");
            f
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let h2 = h.clone();
    let took = within(60, "shutdown during the load", move || {
        let t = Instant::now();
        h2.shutdown(Duration::from_millis(300));
        t.elapsed()
    });
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
}

/// A plugin directory that is a symbolic link (a developer links the crate's output in) loads
/// from wherever it points (manifest.rs: "the plugin is wherever it points"); an edit there is
/// a change of that plugin like any other and must be reloaded.
#[test]
fn an_edit_inside_a_symlinked_plugin_directory_is_reloaded() {
    let ws = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let real = install(
        elsewhere.path(),
        "linked",
        "audit_hook",
        &manifest("linked", "\"turn_complete\"", "", ""),
    );
    std::fs::create_dir_all(ws.path().join("plugins")).unwrap();
    std::os::unix::fs::symlink(&real, ws.path().join("plugins/linked")).unwrap();
    let h = hooks(ws.path());
    assert_eq!(plugin(&h, "linked").events, ["prx.lifecycle.turn_complete"]);
    std::fs::write(
        real.join("plugin.toml"),
        manifest("linked", "\"turn_complete\", \"tool_call\"", "", ""),
    )
    .unwrap();
    wait_for(10, "the edit to be reloaded", || {
        plugin(&h, "linked").events.len() == 2
    });
}

/// A component instance may have several linear memories; each takes a slot of the engine's
/// pool, which all plugins share. A plugin whose instances each take the most memories a
/// component may have (two), with `pool_size = 64`, must not take the slots other plugins
/// need: before, the pool held 1.5 memory slots per instance and allowed 4, so a three-memory
/// plugin took all 150 with 50 instances, and a plugin added next could not instantiate (its
/// probe failed: it never loaded).
#[test]
fn a_plugin_with_several_memories_per_instance_cannot_starve_the_others_of_pool_slots() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().join("plugins/hog");
    std::fs::create_dir_all(&dir).unwrap();
    // Two memories per instance: the most a component may have (a third is refused, below).
    std::fs::write(dir.join("plugin.wasm"), crafted::hook_with_memories(2)).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        manifest("hog", "\"*\"", "pool_size = 64", ""),
    )
    .unwrap();
    let h = hooks(ws.path());
    let hog_loaded = plugins(&h).plugins.iter().any(|p| p.name == "hog");
    assert!(hog_loaded, "{:?}", plugins(&h).errors);
    // Events from many emitters reach every one of its 64 shards: each makes an instance.
    for i in 0..1000 {
        h.emitter(&format!("agent-{i}"), "s")
            .emit(Event::TurnComplete);
    }
    wait_for(60, "hog's calls", || {
        let c = plugin(&h, "hog").counts;
        c.sent == 1000 && c.in_flight == 0
    });
    misbehave(ws.path(), "good", "noop", "", "");
    wait_for(30, "the new plugin's load", || {
        let p = plugins(&h);
        p.plugins.iter().any(|p| p.name == "good") || p.errors.iter().any(|e| e.contains("good"))
    });
    let p = plugins(&h);
    assert!(
        p.plugins.iter().any(|p| p.name == "good"),
        "the new plugin did not load: {:?}",
        p.errors
    );
    h.emitter("another", "s").emit(Event::TurnComplete);
    wait_for(10, "its call", || plugin(&h, "good").counts.ok == 1);
}

/// A component whose instances have three memories is refused at load, saying why.
#[test]
fn a_component_with_three_memories_per_instance_is_refused_at_load() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().join("plugins/hog");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin.wasm"), crafted::hook_with_memories(3)).unwrap();
    std::fs::write(dir.join("plugin.toml"), manifest("hog", "\"*\"", "", "")).unwrap();
    let h = hooks(ws.path());
    let p = plugins(&h);
    assert!(p.plugins.iter().all(|p| p.name != "hog"), "it loaded");
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("3 Wasm linear memories")),
        "{:?}",
        p.errors
    );
}

/// The hand-encoded component runs (so the test above exercises the pool, not the encoder).
#[test]
fn a_hand_encoded_component_with_one_memory_runs() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().join("plugins/crafted");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin.wasm"), crafted::hook_with_memories(1)).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        manifest("crafted", "\"*\"", "", ""),
    )
    .unwrap();
    let h = hooks(ws.path());
    h.emitter("a", "s").emit(Event::TurnComplete);
    wait_for(10, "the call", || plugin(&h, "crafted").counts.ok == 1);
}
