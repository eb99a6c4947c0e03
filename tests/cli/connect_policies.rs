//! `prx-hooks connect AGENT --policies` (docs/connect.md § Decision points): the events the
//! agent lets a hook decide get entries it waits for, with the fail mode `--on-unreachable`
//! in their command; a workspace with a policies.json gets them without the flag; the other
//! entries are as before; an agent policies do not answer is refused.

use serde_json::Value;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

struct Setup {
    _root: tempfile::TempDir,
    project: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let project = root.path().join("project");
    let ws = root.path().join("ws");
    let home = root.path().join("home");
    for d in [&project, &ws, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    Setup {
        ws: ws.canonicalize().unwrap(),
        _root: root,
        project,
        home,
    }
}

impl Setup {
    /// `prx-hooks connect ARGS --workspace WS --absolute` in the project.
    fn connect(&self, args: &[&str]) -> Output {
        let bins = Path::new(BIN)
            .parent()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        Command::new(BIN)
            .arg("connect")
            .args(args)
            .arg("--workspace")
            .arg(&self.ws)
            .arg("--absolute")
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env("PATH", format!("{bins}:/usr/bin:/bin"))
            .env_remove("CODEX_HOME")
            .env_remove("PRX_HOOKS_TOKEN")
            .output()
            .unwrap()
    }

    /// Our entry on `event` in `file` (the last group's first entry).
    fn entry(&self, file: &Path, event: &str) -> Value {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        v["hooks"][event].as_array().unwrap().last().unwrap()["hooks"][0].clone()
    }

    fn claude(&self) -> PathBuf {
        self.project.join(".claude/settings.json")
    }
}

fn ok(out: &Output) -> String {
    let said = format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    said
}

/// Runs an entry's command with `sh -c` and `stdin`, as the agent does; its stdout.
fn run_hook(command: &str, stdin: &str) -> String {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("PRX_HOOKS_TOKEN")
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const RM: &str = r#"{"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
    "tool_input": {"command": "rm -rf /tmp/victim"}, "cwd": "/w"}"#;

#[test]
fn policies_make_claude_codes_decision_points_synchronous_commands_with_the_fail_mode() {
    let s = setup();
    // Without policies: PreToolUse is async, as before.
    ok(&s.connect(&["claude-code"]));
    assert_eq!(s.entry(&s.claude(), "PreToolUse")["async"], true);

    let said = ok(&s.connect(&["claude-code", "--policies", "--on-unreachable", "deny"]));
    assert!(
        said.contains("PreToolUse") && said.contains("with no server: deny"),
        "{said}"
    );
    for event in ["PreToolUse", "PermissionRequest", "UserPromptSubmit"] {
        let e = s.entry(&s.claude(), event);
        assert_eq!(e["type"], "command", "{event}: {e}");
        assert_eq!(e["async"], Value::Null, "the agent waits: {e}");
        assert_eq!(e["timeout"], 5, "{e}");
        assert!(
            e["command"]
                .as_str()
                .unwrap()
                .ends_with(" --on-unreachable deny"),
            "{e}"
        );
    }
    // Not a decision point: as before.
    assert_eq!(s.entry(&s.claude(), "PostToolUse")["async"], true);
    // Twice: nothing to change.
    let said = ok(&s.connect(&["claude-code", "--on-unreachable", "deny"]));
    assert!(said.contains("nothing written"), "{said}");

    // The entry, run as Claude Code runs it with no server: Claude Code's deny.
    let cmd = s.entry(&s.claude(), "PreToolUse")["command"]
        .as_str()
        .unwrap()
        .to_string();
    let out: Value = serde_json::from_str(&run_hook(&cmd, RM)).unwrap();
    assert_eq!(out["hookSpecificOutput"]["permissionDecision"], "deny");

    // --http: the decision points keep the http hook (the server answers it) unless a deny
    // must come when the server is down: then a command.
    ok(&s.connect(&["claude-code", "--http", "http://127.0.0.1:9", "--policies"]));
    let e = s.entry(&s.claude(), "PreToolUse");
    assert_eq!(e["type"], "http");
    // The server is told how long Claude Code waits (its 5 s, less a second for the way back).
    assert_eq!(e["headers"]["Prx-Decision-Deadline-Ms"], "4000", "{e}");
    assert_eq!(e["timeout"], 5, "{e}");
    let e = s.entry(&s.claude(), "PostToolUse");
    assert_eq!(e["headers"].get("Prx-Decision-Deadline-Ms"), None, "{e}");
    ok(&s.connect(&[
        "claude-code",
        "--http",
        "http://127.0.0.1:9",
        "--on-unreachable",
        "deny",
    ]));
    assert_eq!(s.entry(&s.claude(), "PreToolUse")["type"], "command");
    assert_eq!(s.entry(&s.claude(), "PostToolUse")["type"], "http");

    // Back without: async again (ours replaced, one entry per event).
    ok(&s.connect(&["claude-code"]));
    let e = s.entry(&s.claude(), "PreToolUse");
    assert_eq!(e["async"], true, "{e}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(s.claude()).unwrap()).unwrap();
    assert_eq!(v["hooks"]["PreToolUse"].as_array().unwrap().len(), 1);
}

#[test]
fn a_workspace_with_a_policies_json_gets_decision_entries_without_the_flag() {
    let s = setup();
    std::fs::write(s.ws.join("policies.json"), r#"{"policies": []}"#).unwrap();
    let said = ok(&s.connect(&["claude-code"]));
    assert!(said.contains("policies decide on"), "{said}");
    let e = s.entry(&s.claude(), "PreToolUse");
    assert_eq!(
        (e["async"].clone(), e["timeout"].clone()),
        (Value::Null, 5.into())
    );
    assert!(!e["command"].as_str().unwrap().contains("--on-unreachable"));

    // Codex and Gemini CLI wait for every hook already: the fail mode goes into the command.
    ok(&s.connect(&["codex", "--on-unreachable", "deny"]));
    let e = s.entry(&s.home.join(".codex/hooks.json"), "PreToolUse");
    assert!(
        e["command"]
            .as_str()
            .unwrap()
            .ends_with(" --on-unreachable deny"),
        "{e}"
    );
    assert_eq!(e["timeout"], 5);
    let e = s.entry(&s.home.join(".codex/hooks.json"), "PostToolUse");
    assert!(
        !e["command"].as_str().unwrap().contains("--on-unreachable"),
        "{e}"
    );
    ok(&s.connect(&["gemini-cli", "--on-unreachable", "deny"]));
    let gemini = s.project.join(".gemini/settings.json");
    let e = s.entry(&gemini, "BeforeTool");
    assert_eq!(e["timeout"], 5000);
    let cmd = e["command"].as_str().unwrap().to_string();
    assert!(cmd.ends_with(" --on-unreachable deny"), "{e}");
    let out: Value = serde_json::from_str(&run_hook(
        &cmd,
        r#"{"session_id": "g", "hook_event_name": "BeforeTool", "tool_name": "run_shell_command",
            "tool_input": {"command": "ls"}, "cwd": "/w", "timestamp": "2026-12-07T00:00:00Z"}"#,
    ))
    .unwrap();
    assert_eq!(out["decision"], "deny");
    assert!(
        s.entry(&gemini, "BeforeAgent")["command"]
            .as_str()
            .unwrap()
            .ends_with(" --on-unreachable deny")
    );
}

/// A workspace whose only policies are WASM ones (a plugin with `[policy]`, no policies.json)
/// gets the decision entries too; a plugin that is only a hook does not bring them.
#[test]
fn a_workspace_with_only_a_wasm_policy_gets_decision_entries_without_the_flag() {
    let s = setup();
    let plugin = |name: &str, extra: &str| {
        let dir = s.ws.join("plugins").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("plugin.wasm"), b"\0asm").unwrap();
        std::fs::write(
            dir.join("plugin.toml"),
            format!("[plugin]\nname = \"{name}\"\nversion = \"0.1.0\"\n{extra}"),
        )
        .unwrap();
    };
    // A hook plugin alone: no decision entries.
    plugin(
        "audit",
        "[[capabilities]]\ntype = \"hook\"\nevents = [\"tool_call\"]\n",
    );
    ok(&s.connect(&["claude-code"]));
    assert_eq!(s.entry(&s.claude(), "PreToolUse")["async"], true);

    plugin("guard", "[policy]\non = [\"tool_call_start\"]\n");
    assert!(!s.ws.join("policies.json").exists());
    let said = ok(&s.connect(&["claude-code"]));
    assert!(said.contains("policies decide on"), "{said}");
    let e = s.entry(&s.claude(), "PreToolUse");
    assert_eq!(
        (e["async"].clone(), e["timeout"].clone()),
        (Value::Null, 5.into()),
        "{e}"
    );
}

#[test]
fn policies_for_an_agent_they_do_not_answer_are_refused() {
    let s = setup();
    let out = s.connect(&["cursor", "--policies"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--policies") && err.contains("claude-code"),
        "{err}"
    );
    assert!(!s.project.join(".cursor/hooks.json").exists());
    // A workspace with policies: Cursor's entries as before, no refusal.
    std::fs::write(s.ws.join("policies.json"), r#"{"policies": []}"#).unwrap();
    ok(&s.connect(&["cursor"]));
    let out = s.connect(&["codex", "--notify", "--policies"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
