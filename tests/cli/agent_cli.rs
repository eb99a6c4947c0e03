//! What an agent or a person reads from the commands beside `run`: `fire`'s exit codes never
//! say "block" to an agent (docs/cli.md § Exit codes), `validate` shows errors and warnings in
//! one pass, and messages name events with the right article.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

fn fire(dir: &std::path::Path, args: &[&str], stdin: &str) -> Output {
    let mut child = bin()
        .arg("fire")
        .args(args)
        .arg("--workspace")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Claude Code, Codex and Gemini CLI read exit 2 from a hook as "block" (a PreToolUse hook's
/// 2 stops the tool call), Cursor as "deny". `fire` run as an agent's hook must never answer 2
/// for its own errors: a bad payload, a bad flag, an unknown event or a broken hooks.json each
/// have a code of their own, none of them 2.
#[test]
fn fire_never_exits_with_the_agents_blocking_code_for_its_own_errors() {
    let dir = tempfile::tempdir().unwrap();
    let code = |out: &Output| out.status.code();
    // A payload that is not the event's (what an agent's own hook JSON on stdin is).
    let out = fire(
        dir.path(),
        &["tool_call_start", "--payload", "-"],
        r#"{"session_id":"abc","tool_name":"Bash","tool_input":{"command":"ls"}}"#,
    );
    assert_eq!(code(&out), Some(65), "bad payload: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("-:1:"),
        "{out:?}"
    );
    let out = fire(dir.path(), &["tool_call", "--payload", "{not json"], "");
    assert_eq!(code(&out), Some(65), "not JSON: {out:?}");
    let out = fire(
        dir.path(),
        &[
            "error",
            "--max-event-bytes",
            "4",
            "--payload",
            r#"{"component":"c","message":"too long"}"#,
        ],
        "",
    );
    assert_eq!(code(&out), Some(65), "oversize: {out:?}");
    let out = fire(dir.path(), &["tool_cal"], "");
    assert_eq!(code(&out), Some(64), "unknown event: {out:?}");
    let out = fire(dir.path(), &["tool_call", "--no-such-flag"], "");
    assert_eq!(code(&out), Some(64), "bad flag: {out:?}");
    let out = bin().args(["fire"]).output().unwrap();
    assert_eq!(code(&out), Some(64), "missing EVENT: {out:?}");
    let out = bin().args(["-v", "fire", "--bogus"]).output().unwrap();
    assert_eq!(code(&out), Some(64), "bad flag after a global one: {out:?}");
    let out = bin().args(["fire", "--help"]).output().unwrap();
    assert_eq!(code(&out), Some(0), "{out:?}");
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks":{"tool_cal":[]}}"#,
    )
    .unwrap();
    let out = fire(dir.path(), &["tool_call"], "");
    assert_eq!(code(&out), Some(78), "hooks.json does not load: {out:?}");
    // A hook that fails is 1, as before; all well is 0.
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks":{"tool_call":[{"command":"/bin/false"}],"error":[{"command":"/bin/true"}]}}"#,
    )
    .unwrap();
    assert_eq!(code(&fire(dir.path(), &["tool_call"], "")), Some(1));
    assert_eq!(code(&fire(dir.path(), &["error"], "")), Some(0));
    // The commands for people and scripts keep 2 for their usage errors.
    let out = bin().args(["validate", "--no-such-flag"]).output().unwrap();
    assert_eq!(code(&out), Some(2), "{out:?}");
    let out = bin().args(["run", "--no-such-flag"]).output().unwrap();
    assert_eq!(code(&out), Some(2), "{out:?}");
}

/// `validate` prints every error and every warning of hooks.json and of the plugins in one
/// pass: a file with both used to show only its errors, and the warnings appeared once the
/// errors were fixed.
#[test]
fn validate_shows_errors_and_warnings_together() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks":{"error":[{"command":"surely-not-a-command-prx"},{"command":"/bin/true","timeout_ms":"5s"}]}}"#,
    )
    .unwrap();
    let plugin = dir.path().join("plugins/broken");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::write(
        plugin.join("plugin.toml"),
        "http_allowlist = []\n\n[plugin]\nname = \"broken\"\nversion = \"1.0.0\"\nwasm = \"broken.wasm\"\n\n[resources]\nmax_memroy_mb = 4\n\n[[capabilities]]\ntype = \"hook\"\nevents = [\"error\"]\n",
    )
    .unwrap();
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stdout.contains("hooks.error[1].timeout_ms: expected an integer"),
        "the hooks.json error: {stdout}"
    );
    assert!(
        stdout.contains("warning: ") && stdout.contains("surely-not-a-command-prx"),
        "the hooks.json warning beside its error: {stdout}"
    );
    assert!(
        stdout.contains("max_memroy_mb"),
        "the plugin's error: {stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("warning: ") && l.contains("http_allowlist")),
        "the plugin's warning beside its error: {stdout}"
    );
}

/// "this one is a agent_end hook": every event gets its article as read aloud (an agent_end,
/// an error, an llm_request, a turn_complete).
#[test]
fn messages_name_each_event_with_its_article() {
    let dir = tempfile::tempdir().unwrap();
    let expect = [
        ("agent_start", "an agent_start hook"),
        ("agent_end", "an agent_end hook"),
        ("llm_request", "an llm_request hook"),
        ("llm_response", "an llm_response hook"),
        ("turn_complete", "a turn_complete hook"),
        ("error", "an error hook"),
    ];
    let hooks: serde_json::Map<String, serde_json::Value> = expect
        .iter()
        .map(|(event, _)| {
            (
                event.to_string(),
                serde_json::json!([{"command": "/bin/true", "matcher": "Bash"}]),
            )
        })
        .collect();
    std::fs::write(
        dir.path().join("hooks.json"),
        serde_json::json!({ "hooks": hooks }).to_string(),
    )
    .unwrap();
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    for (event, phrase) in expect {
        assert!(
            stdout.contains(&format!("(this one is {phrase})")),
            "{event}: {stdout}"
        );
    }
    assert!(
        !stdout.contains(" a agent") && !stdout.contains(" a error"),
        "{stdout}"
    );
}

/// An outcome `fire` cannot print (stdout a full disk, a pipe whose reader is gone) is an
/// internal error, 70 (docs/cli.md § Exit codes: "70, 71: internal error (plugin engine,
/// stdout)"); `println!` panicked instead: exit 101 and a backtrace on the agent's stderr.
/// Likewise `validate`: 1 for its errors, never a panic.
#[test]
fn fire_and_validate_with_an_unwritable_stdout_do_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hooks.json"),
        r#"{"hooks":{"turn_complete":[{"command":"/bin/true"}]}}"#,
    )
    .unwrap();
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let out = bin()
        .args(["fire", "turn_complete", "--workspace"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(full())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    // An error to print: 1, on a stdout that takes it or not.
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(
        bad.path().join("hooks.json"),
        r#"{"hooks":{"turn_complete":[{"command":"/bin/true","bogus":1}]}}"#,
    )
    .unwrap();
    let out = bin()
        .args(["validate", "--workspace"])
        .arg(bad.path())
        .stdout(full())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}
