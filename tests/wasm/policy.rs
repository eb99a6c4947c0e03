//! WASM policies with real components (docs/policies.md § WASM policies): the guests
//! `policy-no-rm-rf` and `policy-misbehave` built from `examples/plugins/` by
//! `bash examples/build-plugins.sh`, installed into temporary workspaces and asked through
//! `Hooks::decide` and `POST /api/decide` over loopback — the real decider, plugin loads,
//! watcher and server.

use prx_hooks::Hooks;
use prx_hooks::policy::{Decision, DecisionPoint, PluginPolicyCount, Verdict};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::plugins::install;
use crate::{hooks, wait_for};

/// A policy-only plugin.toml for `name`: `[policy]` lines, then `[resources]` and `[config]`.
fn manifest(name: &str, policy: &str, resources: &str, config: &str) -> String {
    format!(
        "[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n\n[policy]\n{policy}\n\n\
         [resources]\n{resources}\n\n[config]\n{config}\n"
    )
}

fn no_rm_rf(ws: &Path, config: &str) -> PathBuf {
    install(
        ws,
        "no-rm-rf",
        "policy_no_rm_rf",
        &manifest("no-rm-rf", "on = [\"tool_call_start\"]", "", config),
    )
}

fn misbehave(ws: &Path, name: &str, policy: &str, resources: &str, config: &str) -> PathBuf {
    install(
        ws,
        name,
        "policy_misbehave",
        &manifest(name, policy, resources, config),
    )
}

fn bash(command: &str) -> String {
    json!({"tool": "Bash", "arguments": {"command": command}}).to_string()
}

fn ask(h: &Hooks, command: &str) -> Verdict {
    h.decide(DecisionPoint::ToolCallStart, "claude-code", &bash(command))
        .unwrap()
}

fn counts(h: &Hooks, id: &str) -> PluginPolicyCount {
    let stats = h.stats();
    let p = stats.policies().expect("the policies' section");
    p.plugins
        .iter()
        .find(|c| c.policy == id)
        .unwrap_or_else(|| panic!("no WASM policy {id} in {:?}", p.plugins))
        .clone()
}

fn load_errors(h: &Hooks) -> Vec<String> {
    h.plugins().expect("plugins").stats().errors
}

#[test]
fn the_no_rm_rf_guest_denies_rm_rf_and_lets_ls_through() {
    let ws = tempfile::tempdir().unwrap();
    no_rm_rf(ws.path(), "");
    let h = hooks(ws.path());
    assert!(load_errors(&h).is_empty(), "{:?}", load_errors(&h));

    let v = ask(&h, "rm -rf /tmp/victim");
    assert_eq!(v.decision, Some(Decision::Deny));
    assert_eq!(
        v.reason.as_deref(),
        Some("rm -rf is not allowed in this workspace")
    );
    assert_eq!(v.policy.as_deref(), Some("no-rm-rf"));
    // No decision: the agent's own flow runs it.
    assert_eq!(ask(&h, "ls -la").decision, None);
    // Not a point it declared: not asked.
    let prompt = h
        .decide(
            DecisionPoint::Prompt,
            "claude-code",
            r#"{"prompt": "rm -rf /"}"#,
        )
        .unwrap();
    assert_eq!(prompt.decision, None);

    let c = counts(&h, "no-rm-rf");
    assert_eq!(
        (c.calls, c.deny, c.none, c.decisions),
        (2, 1, 1, 1),
        "{c:?}"
    );
    let all = h.stats();
    let p = all.policies().unwrap();
    assert_eq!((p.deny, p.none), (1, 2));
    h.shutdown(Duration::from_secs(5));

    // With `otherwise = "allow"` the same guest allows what it does not deny.
    let ws = tempfile::tempdir().unwrap();
    no_rm_rf(ws.path(), "otherwise = \"allow\"");
    let h = hooks(ws.path());
    let v = ask(&h, "ls");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Allow), Some("no-rm-rf"))
    );
    assert_eq!(ask(&h, "rm -fr x").decision, Some(Decision::Deny));
    h.shutdown(Duration::from_secs(5));
}

/// One hostile mode: alone with `on_error = "none"` it gives no decision; beside it a second
/// copy with `on_error = "deny"` denies with the failure as the reason. Each call is cut (at
/// its deadline, or when its memory is refused) and counted; the next call works again (a
/// fresh instance).
fn hostile(mode: &str, resources: &str, failed: fn(&PluginPolicyCount) -> u64, why: &str) {
    let ws = tempfile::tempdir().unwrap();
    let policy = |on_error: &str| {
        format!("on = [\"tool_call_start\"]\ntimeout_ms = 200\non_error = \"{on_error}\"")
    };
    let config = format!("mode = \"{mode}\"");
    let none_id = format!("{mode}-none");
    misbehave(ws.path(), &none_id, &policy("none"), resources, &config);
    let h = hooks(ws.path());
    assert!(load_errors(&h).is_empty(), "{:?}", load_errors(&h));

    for n in 1..=2 {
        let t = Instant::now();
        let v = ask(&h, "ls");
        let took = t.elapsed();
        assert_eq!(v.decision, None, "{mode}: on_error none gives no decision");
        // Liveness only, with generous slack: the call was cut, not left to run.
        assert!(took < Duration::from_secs(10), "{mode}: took {took:?}");
        let c = counts(&h, &none_id);
        assert_eq!(
            (c.calls, failed(&c), c.on_error_deny),
            (n, n, 0),
            "{mode}: {c:?}"
        );
    }

    let deny_id = format!("{mode}-deny");
    misbehave(ws.path(), &deny_id, &policy("deny"), resources, &config);
    let report = h.plugins().unwrap().reload();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let v = ask(&h, "ls");
    assert_eq!(v.decision, Some(Decision::Deny), "{mode}");
    assert_eq!(v.policy.as_deref(), Some(deny_id.as_str()));
    let reason = v.reason.unwrap();
    assert!(
        reason.contains(&format!("WASM policy {deny_id} {why}"))
            && reason.contains("on_error: deny"),
        "{mode}: {reason}"
    );
    let c = counts(&h, &deny_id);
    assert_eq!(
        (c.calls, failed(&c), c.on_error_deny, c.decisions),
        (1, 1, 1, 1),
        "{c:?}"
    );
    // The deny (`{mode}-deny` comes first in plugin name order) ended the question: the
    // `none` copy after it was not asked again.
    assert_eq!(counts(&h, &none_id).calls, 2);
    h.shutdown(Duration::from_secs(5));
}

#[test]
fn a_guest_that_loops_forever_is_cut_at_its_deadline_and_answers_on_error() {
    // Fuel enough for far longer than the deadline: the clock stops it.
    hostile(
        "loop",
        "max_fuel = 1_000_000_000_000_000",
        |c| c.timed_out,
        "timed out",
    );
}

#[test]
fn a_guest_sleeping_in_a_host_call_is_cut_at_its_deadline_and_answers_on_error() {
    hostile("sleep", "", |c| c.timed_out, "timed out");
}

#[test]
fn a_memory_bomb_is_refused_at_max_memory_mb_and_answers_on_error() {
    hostile("memhog", "max_memory_mb = 16", |c| c.trapped, "trapped");
}

#[test]
fn a_guest_out_of_fuel_answers_on_error() {
    hostile(
        "loop",
        "max_fuel = 100000",
        |c| c.out_of_fuel,
        "ran out of fuel",
    );
}

#[test]
fn hot_reload_replaces_the_policy_and_a_broken_manifest_keeps_the_last_good() {
    let ws = tempfile::tempdir().unwrap();
    let on = "on = [\"tool_call_start\"]";
    let dir = misbehave(
        ws.path(),
        "guard",
        on,
        "",
        "mode = \"deny\"\nreason = \"v1\"",
    );
    let h = hooks(ws.path());
    let v = ask(&h, "ls");
    assert_eq!(
        (v.decision, v.reason.as_deref()),
        (Some(Decision::Deny), Some("v1"))
    );

    // The watcher picks the new version up.
    std::fs::write(
        dir.join("plugin.toml"),
        manifest("guard", on, "", "mode = \"allow\"\nreason = \"v2\""),
    )
    .unwrap();
    wait_for(10, "the new version", || {
        ask(&h, "ls").reason.as_deref() == Some("v2")
    });
    assert_eq!(ask(&h, "ls").decision, Some(Decision::Allow));

    // A broken plugin.toml: reported with its place, the last good version stays in force.
    std::fs::write(
        dir.join("plugin.toml"),
        manifest("guard", "on = [\"tool_call_strat\"]", "", "mode = \"deny\""),
    )
    .unwrap();
    let report = h.plugins().unwrap().reload();
    let file = dir.join("plugin.toml").display().to_string();
    assert_eq!(
        report.errors,
        vec![format!(
            "{file}:6:7: policy.on[0]: unknown decision point \"tool_call_strat\"; did you mean \"tool_call_start\"?"
        )]
    );
    let v = ask(&h, "ls");
    assert_eq!(
        (v.decision, v.reason.as_deref()),
        (Some(Decision::Allow), Some("v2"))
    );
    // The counts carried over every version.
    assert_eq!(counts(&h, "guard").calls, ask_count(&h));

    // Removed: no longer asked.
    std::fs::remove_dir_all(&dir).unwrap();
    h.plugins().unwrap().reload();
    assert_eq!(ask(&h, "ls").decision, None);
    assert!(h.stats().policies().unwrap().plugins.is_empty());
    h.shutdown(Duration::from_secs(5));
}

/// Decisions asked so far (every one asked the single policy).
fn ask_count(h: &Hooks) -> u64 {
    let s = h.stats();
    let p = s.policies().unwrap();
    p.allow + p.ask + p.deny + p.none
}

#[test]
fn a_component_without_the_policy_export_is_refused_with_a_clear_error() {
    let ws = tempfile::tempdir().unwrap();
    // A hook component (the prx:plugin world) declaring [policy].
    let dir = install(
        ws.path(),
        "hooky",
        "misbehave",
        &manifest("hooky", "on = [\"tool_call_start\"]", "", "mode = \"noop\""),
    );
    let h = hooks(ws.path());
    let errors = load_errors(&h);
    let wasm = dir.join("plugin.wasm").display().to_string();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&format!("{wasm}: [policy] is declared, but the component does not export prx-hooks:policy/decider@0.1.0 (it exports: prx:plugin/hook-exports@0.1.0"))
            && errors[0].ends_with("build it for the `policy` world of wit/policy/policy.wit"),
        "{errors:?}"
    );
    assert_eq!(ask(&h, "rm -rf /").decision, None);
    h.shutdown(Duration::from_secs(5));
}

#[test]
fn rules_come_first_and_the_most_restrictive_source_wins() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("policies.json"),
        r#"{"policies": [
          {"id": "rule-deny-curl", "on": ["tool_call_start"], "when": {"arguments.command": {"prefix": "curl"}}, "decision": "deny", "reason": "no curl"},
          {"id": "rule-allow-bash", "on": ["tool_call_start"], "matcher": "Bash", "decision": "allow", "reason": "bash is fine"}
        ]}"#,
    )
    .unwrap();
    no_rm_rf(ws.path(), "");
    // Fuel enough for far longer than the deadline: the clock stops it, every time.
    misbehave(
        ws.path(),
        "spin",
        "on = [\"tool_call_start\"]\ntimeout_ms = 100",
        "max_fuel = 1_000_000_000_000_000",
        "mode = \"loop\"",
    );
    let h = hooks(ws.path());
    // A rule's deny answers at once: no WASM policy is asked.
    let v = ask(&h, "curl example.com");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("rule-deny-curl"))
    );
    assert_eq!(counts(&h, "spin").calls, 0);
    assert_eq!(counts(&h, "no-rm-rf").calls, 0);
    // A rule allows, the WASM policy denies: deny wins, reported with its policy.
    let v = ask(&h, "rm -rf build");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("no-rm-rf"))
    );
    // Nothing but the rule decides (the spinning policy's failure answers none).
    let v = ask(&h, "ls");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Allow), Some("rule-allow-bash"))
    );
    // Asked for `ls` only: no-rm-rf's deny (before it in plugin name order) ended the `rm -rf`
    // question.
    let spin = counts(&h, "spin");
    assert_eq!((spin.calls, spin.timed_out), (1, 1), "{spin:?}");
    assert_eq!(
        spin.cut_by_asker, 0,
        "its own timeout, not an asker's: {spin:?}"
    );
    h.shutdown(Duration::from_secs(5));
}

/// A deny ends the question: once a source has denied, no later source is asked (a deny
/// cannot be beaten, and the first source with it is the one reported). A command policy's
/// deny: no WASM policy is called; a WASM policy's deny: the WASM policies after it (plugin
/// name order) are not called.
#[test]
fn no_source_is_asked_once_a_deny_is_reached() {
    use std::os::unix::fs::PermissionsExt;
    let ws = tempfile::tempdir().unwrap();
    let guard = ws.path().join("guard.sh");
    std::fs::write(
        &guard,
        "#!/bin/sh\ncase \"$(cat)\" in *'rm -rf'*) echo 'guard says no' >&2; exit 2;; esac\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&guard, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        ws.path().join("policies.json"),
        r#"{"policies": [{"id": "guard", "on": ["tool_call_start"], "command": "./guard.sh", "timeout_ms": 10000}]}"#,
    )
    .unwrap();
    let on = "on = [\"tool_call_start\"]\ntimeout_ms = 100";
    misbehave(
        ws.path(),
        "a-deny",
        on,
        "",
        "mode = \"deny\"\nreason = \"a says no\"",
    );
    // Fuel for far longer than its deadline: asked, it would be cut by the clock.
    misbehave(
        ws.path(),
        "b-spin",
        on,
        "max_fuel = 1_000_000_000_000_000",
        "mode = \"loop\"",
    );
    let h = hooks(ws.path());
    assert!(load_errors(&h).is_empty(), "{:?}", load_errors(&h));

    let v = ask(&h, "rm -rf build");
    assert_eq!(
        (v.decision, v.policy.as_deref(), v.reason.as_deref()),
        (Some(Decision::Deny), Some("guard"), Some("guard says no"))
    );
    assert_eq!(
        counts(&h, "a-deny").calls,
        0,
        "asked after the guard denied"
    );
    assert_eq!(
        counts(&h, "b-spin").calls,
        0,
        "asked after the guard denied"
    );

    let v = ask(&h, "ls");
    assert_eq!(
        (v.decision, v.policy.as_deref(), v.reason.as_deref()),
        (Some(Decision::Deny), Some("a-deny"), Some("a says no"))
    );
    assert_eq!(counts(&h, "a-deny").calls, 1);
    assert_eq!(counts(&h, "b-spin").calls, 0, "asked after a-deny denied");
    h.shutdown(Duration::from_secs(5));
}

/// Policy ids are unique across policies.json and the plugins' `[policy] id`: a WASM policy
/// whose id policies.json already has, or an earlier plugin (name order) already took, is
/// refused at load (logged, counted) and never asked.
#[test]
fn a_wasm_policy_whose_id_is_taken_is_refused_at_load_and_counted() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("policies.json"),
        r#"{"policies": [{"id": "no-rm-rf", "on": "tool_call_start", "matcher": "Read", "decision": "allow"}]}"#,
    )
    .unwrap();
    // Its id defaults to its name, which policies.json has.
    no_rm_rf(ws.path(), "");
    let on = "on = [\"tool_call_start\"]\nid = \"shared\"";
    misbehave(
        ws.path(),
        "x-first",
        on,
        "",
        "mode = \"allow\"\nreason = \"first\"",
    );
    misbehave(
        ws.path(),
        "y-second",
        on,
        "",
        "mode = \"deny\"\nreason = \"second\"",
    );
    let h = hooks(ws.path());

    let v = ask(&h, "rm -rf build");
    assert_eq!(
        (v.decision, v.policy.as_deref(), v.reason.as_deref()),
        (Some(Decision::Allow), Some("shared"), Some("first")),
        "only x-first is in force"
    );
    let stats = h.stats();
    let p = stats.policies().unwrap();
    let ids: Vec<&str> = p.plugins.iter().map(|c| c.policy.as_str()).collect();
    assert_eq!(ids, ["shared"], "{p:?}");
    assert_eq!(p.plugins[0].calls, 1, "{p:?}");
    assert_eq!(p.duplicate_ids, 2, "{p:?}");

    // policies.json lets the id go: no-rm-rf comes into force at the next load of the file.
    std::fs::write(ws.path().join("policies.json"), r#"{"policies": []}"#).unwrap();
    assert_eq!(
        h.apply_policies_file(),
        Some(prx_hooks::config::Reload::Applied)
    );
    let v = ask(&h, "rm -rf build");
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("no-rm-rf"))
    );
    assert_eq!(
        h.stats().policies().unwrap().duplicate_ids,
        2,
        "counted once"
    );
    h.shutdown(Duration::from_secs(5));
}

#[test]
fn post_api_decide_asks_the_wasm_policy() {
    use prx_hooks::http::{HttpOptions, Server, Token};
    use std::sync::Arc;
    const TOKEN: &str = "ingest-token-0123456789abcdef";
    let ws = tempfile::tempdir().unwrap();
    no_rm_rf(ws.path(), "");
    let h = Arc::new(hooks(ws.path()));
    let options = HttpOptions::new(Token::new(TOKEN, "test").unwrap());
    let mut server = Server::start(h.clone(), options, "127.0.0.1:0".parse().unwrap()).unwrap();
    let client: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let post = |command: &str| -> (u16, Value) {
        let body = json!({"event": "tool_call_start", "agent": "codex", "session": "s1",
            "payload": {"tool": "shell", "arguments": {"command": command}}});
        let mut resp = client
            .post(format!("http://{}/api/decide", server.local_addr()))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    };
    let (status, body) = post("rm -rf /tmp/victim");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"], "deny");
    assert_eq!(body["policy"], "no-rm-rf");
    assert_eq!(body["reason"], "rm -rf is not allowed in this workspace");
    let (status, body) = post("ls");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["decision"], Value::Null);
    assert_eq!(counts(&h, "no-rm-rf").calls, 2);
    server.shutdown(Duration::from_secs(5));
    h.shutdown(Duration::from_secs(5));
}

#[test]
fn validate_checks_policy_plugins_without_asking_for_a_hook_export() {
    let ws = tempfile::tempdir().unwrap();
    no_rm_rf(ws.path(), "");
    let problems = prx_hooks::wasm::check_workspace(ws.path());
    assert!(problems.is_empty(), "{problems:?}");
    let dir = install(
        ws.path(),
        "hooky",
        "misbehave",
        &manifest("hooky", "on = [\"prompt\"]", "", "mode = \"noop\""),
    );
    let problems = prx_hooks::wasm::check_workspace(ws.path());
    let wasm = dir.join("plugin.wasm").display().to_string();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with(&format!(
            "{wasm}: [policy] is declared, but the component does not export prx-hooks:policy/decider@0.1.0"
        )),
        "{problems:?}"
    );
}

/// A workspace whose one WASM policy `id` loops until a clock stops it (`timeout_ms` its own
/// deadline, fuel for far longer), answering `on_error: deny`; loaded.
fn looping(id: &str, timeout_ms: u64) -> (tempfile::TempDir, Hooks) {
    let ws = tempfile::tempdir().unwrap();
    misbehave(
        ws.path(),
        id,
        &format!("on = [\"tool_call_start\"]\ntimeout_ms = {timeout_ms}\non_error = \"deny\""),
        "max_fuel = 1_000_000_000_000_000\nmax_execution_time_ms = 30000",
        "mode = \"loop\"",
    );
    let h = hooks(ws.path());
    assert!(load_errors(&h).is_empty(), "{:?}", load_errors(&h));
    (ws, h)
}

/// The asker's deadline (`Hooks::decide_within`, what `Prx-Decision-Deadline-Ms` sets) cuts a
/// WASM policy before its own `timeout_ms`, and the cut policy answers its `on_error`; with no
/// time left the policy is not called at all.
#[test]
fn the_askers_deadline_cuts_a_wasm_policy_before_its_own_timeout() {
    // Its own deadline: 20 s.
    let (_ws, h) = looping("slow", 20_000);
    let t = Instant::now();
    let v = h
        .decide_within(
            DecisionPoint::ToolCallStart,
            "claude-code",
            &bash("ls"),
            Duration::from_millis(300),
        )
        .unwrap();
    let took = t.elapsed();
    assert_eq!(
        (v.decision, v.policy.as_deref()),
        (Some(Decision::Deny), Some("slow")),
        "{v:?}"
    );
    assert!(
        v.reason.as_deref().unwrap_or("").contains("timed out"),
        "{v:?}"
    );
    // Liveness, with slack: far below the policy's own 20 s.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let c = counts(&h, "slow");
    assert_eq!((c.calls, c.timed_out, c.on_error_deny), (1, 1, 1), "{c:?}");
    assert_eq!(
        c.cut_by_asker, 1,
        "the asker's cut, not its own timeout: {c:?}"
    );

    // No time left: the policy is not called, and still answers its on_error.
    let v = h
        .decide_within(
            DecisionPoint::ToolCallStart,
            "claude-code",
            &bash("ls"),
            Duration::ZERO,
        )
        .unwrap();
    assert_eq!(v.decision, Some(Decision::Deny), "{v:?}");
    let c = counts(&h, "slow");
    assert_eq!((c.timed_out, c.cut_by_asker), (2, 2), "{c:?}");
    h.shutdown(Duration::from_secs(5));

    // An asker's deadline later than the policy's own: the time-out is the policy's.
    let (_ws, h) = looping("quick", 200);
    let v = h
        .decide_within(
            DecisionPoint::ToolCallStart,
            "claude-code",
            &bash("ls"),
            Duration::from_secs(30),
        )
        .unwrap();
    assert_eq!(v.decision, Some(Decision::Deny), "{v:?}");
    let c = counts(&h, "quick");
    assert_eq!((c.timed_out, c.cut_by_asker), (1, 0), "{c:?}");
    h.shutdown(Duration::from_secs(5));
}
