//! `prx-hooks connect AGENT` as a user runs it (docs/cli.md § `connect`, docs/connect.md): the
//! user's settings stay byte for byte, a second connect writes nothing, `--remove` gives the
//! original bytes back, `--dry-run` writes nothing, broken or odd files are refused untouched,
//! and the entries written really deliver: each agent's command, run as the agent runs it,
//! reaches a real `prx-hooks run --listen`.

use crate::stderr::Lines;
use serde_json::Value;
use std::io::{BufRead, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

/// `prx-hooks ARGS` in `cwd`, with `HOME` at `home` (user scope never touches the real one).
fn prx(args: &[&str], cwd: &Path, home: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .env("HOME", home)
        .env("PATH", path_with_bins())
        .env_remove("CODEX_HOME")
        .env_remove("PRX_HOOKS_TOKEN")
        .output()
        .unwrap()
}

/// The directory of the binaries under test first on `PATH` (as after `cargo install`).
fn path_with_bins() -> String {
    let bins = Path::new(BIN)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    format!("{bins}:/usr/bin:/bin")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A project dir, a workspace in it and a home, all in one temporary directory.
struct Setup {
    _root: tempfile::TempDir,
    project: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

fn setup(ws_name: &str) -> Setup {
    let root = tempfile::tempdir().unwrap();
    let project = root.path().join("project");
    let ws = root.path().join(ws_name);
    let home = root.path().join("home");
    for d in [&project, &ws, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    let ws = ws.canonicalize().unwrap();
    Setup {
        _root: root,
        project,
        ws,
        home,
    }
}

impl Setup {
    /// `prx-hooks ARGS`, connecting (not with `--remove`) to the workspace, which lies outside
    /// the project: with `--absolute` (the committable form has tests of its own).
    fn run(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        let ws = self.ws.to_str().unwrap();
        if !args.contains(&"--remove") && !args.contains(&"--workspace") {
            all.extend(["--workspace", ws]);
        }
        if !args.contains(&"--remove") && args.first() == Some(&"connect") {
            all.push("--absolute");
        }
        prx(&all, &self.project, &self.home)
    }
}

/// What our command hook runs, as a shell reads it: `prx-hooks-send --from AGENT --workspace
/// WS`, the small program built beside `prx-hooks` (`connect` prefers it).
fn our_argv(agent: &str, ws: &Path) -> Vec<String> {
    vec![
        env!("CARGO_BIN_EXE_prx-hooks-send").into(),
        "--from".into(),
        agent.into(),
        "--workspace".into(),
        ws.to_str().unwrap().into(),
    ]
}

/// The words `sh` makes of `command` (printed one per line by the shell itself).
fn sh_words(command: &str) -> Vec<String> {
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "for w in {}; do printf '%s\\n' \"$w\"; done",
            command
        ))
        .output()
        .unwrap();
    text(&out.stdout).lines().map(str::to_string).collect()
}

/// Claude Code's documented events, less MessageDisplay and WorktreeCreate/WorktreeRemove
/// (docs/connect.md).
const CLAUDE_EVENTS: [&str; 30] = [
    "Setup",
    "SessionStart",
    "InstructionsLoaded",
    "UserPromptSubmit",
    "UserPromptExpansion",
    "PreToolUse",
    "PermissionRequest",
    "PermissionDenied",
    "PostToolUse",
    "PostToolUseFailure",
    "PostToolBatch",
    "Notification",
    "SubagentStart",
    "SubagentStop",
    "TaskCreated",
    "TaskCompleted",
    "Stop",
    "StopFailure",
    "TeammateIdle",
    "PreCompact",
    "PostCompact",
    "PreModelSwitch",
    "PostModelSwitch",
    "Elicitation",
    "ElicitationResult",
    "ConfigChange",
    "CwdChanged",
    "DirectoryAdded",
    "FileChanged",
    "SessionEnd",
];

/// A Claude Code settings file with the user's own hooks and keys, formatted oddly: tabs and
/// spaces mixed, a one-line object, escapes, non-ASCII, no newline at the end.
const USERS_CLAUDE: &str = "{\n\t\"model\" :\"opus\",\n    \"permissions\": {\"allow\": [\"Bash(ls:*)\"],   \"deny\":[]},\n\t\"hooks\": {\n\t\t\"PreToolUse\": [\n\t\t\t{ \"matcher\": \"Bash\", \"hooks\": [ { \"type\": \"command\", \"command\": \"echo \\\"h\u{e9}\\\" >> /tmp/log\" } ] }\n\t\t],\n\t\t\"Stop\": [{\"hooks\":[{\"type\":\"command\",\"command\":\"notify-send done\",\"timeout\":30}]}]\n\t},\n  \"env\": {\"A\": \"\\u00e9\\n\"}\n}";

fn settings(s: &Setup) -> PathBuf {
    s.project.join(".claude/settings.json")
}

#[test]
fn connect_keeps_the_users_settings_byte_for_byte_twice_changes_nothing_and_remove_restores_them() {
    let s = setup("ws");
    let file = settings(&s);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, USERS_CLAUDE).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let out = s.run(&["connect", "claude-code"]);
    ok(&out);
    let connected = std::fs::read_to_string(&file).unwrap();
    let v: Value = serde_json::from_str(&connected).unwrap_or_else(|e| panic!("{e}: {connected}"));
    let orig: Value = serde_json::from_str(USERS_CLAUDE).unwrap();
    // Every other key is the same value, and the same bytes.
    for key in ["model", "permissions", "env"] {
        assert_eq!(v[key], orig[key], "{key}");
    }
    for piece in [
        "\t\"model\" :\"opus\",\n",
        "    \"permissions\": {\"allow\": [\"Bash(ls:*)\"],   \"deny\":[]},\n",
        "{ \"matcher\": \"Bash\", \"hooks\": [ { \"type\": \"command\", \"command\": \"echo \\\"h\u{e9}\\\" >> /tmp/log\" } ] }",
        "{\"hooks\":[{\"type\":\"command\",\"command\":\"notify-send done\",\"timeout\":30}]}",
        "\n  \"env\": {\"A\": \"\\u00e9\\n\"}\n}",
    ] {
        assert!(
            connected.contains(piece),
            "{piece:?} is gone from:\n{connected}"
        );
    }
    // The user's hooks come first, still; ours is one group per documented event.
    assert_eq!(v["hooks"]["PreToolUse"][0], orig["hooks"]["PreToolUse"][0]);
    assert_eq!(v["hooks"]["Stop"][0], orig["hooks"]["Stop"][0]);
    let hooks = v["hooks"].as_object().unwrap();
    assert_eq!(hooks.len(), CLAUDE_EVENTS.len(), "{:?}", hooks.keys());
    for event in CLAUDE_EVENTS {
        let groups = hooks[event].as_array().unwrap();
        let ours = groups.last().unwrap();
        assert_eq!(ours.as_object().unwrap().len(), 1, "{event}: {ours}");
        let entry = &ours["hooks"][0];
        assert_eq!(entry["type"], "command", "{event}");
        // Where a turn or the session ends Claude Code waits for it (5 s at most); elsewhere
        // it runs it in the background.
        if ["Stop", "SubagentStop", "StopFailure", "SessionEnd"].contains(&event) {
            assert_eq!(entry.get("async"), None, "{event}");
            assert_eq!(entry["timeout"], 5, "{event}");
        } else {
            assert_eq!(entry["async"], true, "{event}");
        }
        let cmd = entry["command"].as_str().unwrap();
        assert_eq!(
            sh_words(cmd),
            our_argv("claude-code", &s.ws),
            "{event}: {cmd}"
        );
    }
    assert!(!hooks.contains_key("WorktreeCreate"));
    // Mode kept; the backup holds the original, with its mode.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    let backup = file.with_file_name("settings.json.prx-hooks.bak");
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), USERS_CLAUDE);
    assert_eq!(mode(&backup), 0o600);
    assert!(
        text(&out.stdout).contains("30 event(s)"),
        "{}",
        text(&out.stdout)
    );

    // Twice: the same bytes, nothing written (not even the backup).
    std::fs::write(&backup, "marker").unwrap();
    let out = s.run(&["connect", "claude-code"]);
    ok(&out);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), connected);
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), "marker");
    assert!(
        text(&out.stdout).contains("nothing written"),
        "{}",
        text(&out.stdout)
    );

    // Remove: the original bytes exactly.
    let out = s.run(&["connect", "claude-code", "--remove"]);
    ok(&out);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), USERS_CLAUDE);
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), connected);
    // And again: nothing of ours is left, nothing changes.
    let out = s.run(&["connect", "claude-code", "--remove"]);
    ok(&out);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), USERS_CLAUDE);
}

#[test]
fn connect_replaces_its_own_older_entry_and_leaves_a_hand_written_lookalike_of_another_agent() {
    let s = setup("ws2");
    let file = settings(&s);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    // Ours from an older workspace (written by hand the way docs/agents.md showed), and a
    // `send --from cursor` that is not Claude Code's: only the first is ours here.
    let before = r#"{"hooks": {"Stop": [
  {"hooks": [{"type": "command", "command": "prx-hooks send --from claude-code --workspace /old/ws", "async": true}]},
  {"hooks": [{"type": "command", "command": "prx-hooks send --from cursor --workspace /x"}]}
]}}
"#;
    std::fs::write(&file, before).unwrap();
    let out = s.run(&["connect", "claude-code", "--events", "Stop"]);
    ok(&out);
    assert!(
        text(&out.stdout).contains("1 earlier prx-hooks entry replaced"),
        "{}",
        text(&out.stdout)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let groups = v["hooks"]["Stop"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{v}");
    let cmd = groups[0]["hooks"][0]["command"].as_str().unwrap();
    assert_eq!(sh_words(cmd), our_argv("claude-code", &s.ws));
    assert_eq!(
        groups[1]["hooks"][0]["command"],
        "prx-hooks send --from cursor --workspace /x"
    );
    // --remove takes ours out, the other stays.
    ok(&s.run(&["connect", "claude-code", "--remove"]));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(v["hooks"]["Stop"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["hooks"]["Stop"][0]["hooks"][0]["command"],
        "prx-hooks send --from cursor --workspace /x"
    );
}

#[test]
fn dry_run_prints_the_diff_and_writes_nothing() {
    let s = setup("ws");
    let file = settings(&s);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, USERS_CLAUDE).unwrap();
    let out = s.run(&[
        "connect",
        "claude-code",
        "--dry-run",
        "--events",
        "Stop,SessionEnd",
    ]);
    ok(&out);
    let diff = text(&out.stdout);
    let shown = file.display().to_string();
    assert!(
        diff.starts_with(&format!("--- {shown}\n+++ {shown}\n@@ -")),
        "{diff}"
    );
    let added: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .collect();
    let removed: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .collect();
    assert_eq!(
        added
            .iter()
            .filter(|l| l.contains("prx-hooks-send --from claude-code "))
            .count(),
        2,
        "{diff}"
    );
    // The only line of the user's that changes is the one that gains a comma.
    assert_eq!(removed.len(), 1, "{diff}");
    assert!(removed[0].contains("notify-send done"), "{diff}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), USERS_CLAUDE);
    assert!(!file.with_file_name("settings.json.prx-hooks.bak").exists());

    // The diff is what connect then does: applied, it gives the file connect writes.
    let out = s.run(&["connect", "claude-code", "--events", "Stop,SessionEnd"]);
    ok(&out);
    let written = std::fs::read_to_string(&file).unwrap();
    for l in &added {
        assert!(written.contains(&l[1..]), "{l}");
    }
    // A missing file: every line added, and still nothing written.
    let t = setup("ws");
    let out = t.run(&["connect", "cursor", "--dry-run"]);
    ok(&out);
    assert!(
        text(&out.stdout).contains("@@ -0,0 +1,"),
        "{}",
        text(&out.stdout)
    );
    assert!(!t.project.join(".cursor").exists());
    // Nothing to change: no diff.
    let out = s.run(&[
        "connect",
        "claude-code",
        "--dry-run",
        "--events",
        "Stop,SessionEnd",
    ]);
    ok(&out);
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains("nothing to change"));
}

/// `connect` on `file` holding `content` is refused: exit 2, the file untouched, no backup, and
/// stderr's first line starts with `FILE:LINE:COL: ` and holds `reason`.
fn refused(s: &Setup, agent: &str, file: &Path, content: &str, at: (usize, usize), reason: &str) {
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, content).unwrap();
    let out = s.run(&["connect", agent]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{content:?}: {}",
        text(&out.stderr)
    );
    let err = text(&out.stderr);
    let first = err.lines().next().unwrap_or("");
    let head = format!("{}:{}:{}: ", file.display(), at.0, at.1);
    assert!(
        first.starts_with(&head),
        "{content:?}: expected {head:?}, got {err}"
    );
    assert!(
        first.contains(reason),
        "{content:?}: expected {reason:?} in {first}"
    );
    assert!(err.contains("was not changed"), "{err}");
    assert_eq!(std::fs::read_to_string(file).unwrap(), content);
    let mut bak = file.as_os_str().to_owned();
    bak.push(".prx-hooks.bak");
    assert!(
        !Path::new(&bak).exists(),
        "{content:?}: a backup was written"
    );
}

#[test]
fn invalid_json_is_refused_with_file_line_column_and_left_untouched() {
    let s = setup("ws");
    let file = settings(&s);
    for (content, at, reason) in [
        (
            "{\n  \"a\": 1,\n}\n",
            (2, 9),
            "a comma before the closing bracket",
        ),
        ("{\"hooks\": {\"Stop\": [}}", (1, 21), "expected a value"),
        ("{\"a\": \"unterminated\n", (1, 7), "unterminated string"),
        ("{} trailing", (1, 4), "unexpected text"),
        ("{\n  // a comment\n}", (2, 3), "a comment: JSON has none"),
        (
            "{\"hooks\": {\"Stop\": []}, \"hooks\": {}}",
            (1, 25),
            "\"hooks\" appears twice",
        ),
    ] {
        refused(&s, "claude-code", &file, content, at, reason);
    }
    // Cursor's too; Codex's TOML with its own parser's reason.
    let cursor = s.project.join(".cursor/hooks.json");
    refused(
        &s,
        "cursor",
        &cursor,
        "{\"version\": 1,, }",
        (1, 15),
        "expected a member name",
    );
    let codex = s.home.join(".codex/hooks.json");
    refused(
        &s,
        "codex",
        &codex,
        "{\"hooks\": {\"Stop\": [}}",
        (1, 21),
        "expected a value",
    );
    // Codex's config.toml (--notify), with toml_edit's reason.
    let config = s.home.join(".codex/config.toml");
    std::fs::write(&config, "# mine\nmodel = \n").unwrap();
    let ws = s.ws.to_str().unwrap();
    let out = s.run(&["connect", "codex", "--notify", "--workspace", ws]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!("{}:2:9: ", config.display()))
            && err.contains("string values must be quoted"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "# mine\nmodel = \n"
    );
}

#[test]
fn values_of_the_wrong_shape_are_refused_naming_their_path() {
    let s = setup("ws");
    let file = settings(&s);
    for (content, at, reason) in [
        (
            "[]",
            (1, 1),
            "the top level: expected an object, found an array",
        ),
        (
            "{\"hooks\": []}",
            (1, 11),
            "hooks: expected an object (event name → array), found an array",
        ),
        (
            "{\"hooks\": {\"Stop\": {}}}",
            (1, 20),
            "hooks.Stop: expected an array of hook groups, found an object",
        ),
        (
            "{\"hooks\": {\"Stop\": [\"x\"]}}",
            (1, 21),
            "hooks.Stop[0]: expected an object",
        ),
        (
            "{\"hooks\": {\"Stop\": [{\"hooks\": {}}]}}",
            (1, 31),
            "hooks.Stop[0].hooks: expected an array, found an object",
        ),
    ] {
        refused(&s, "claude-code", &file, content, at, reason);
    }
    let cursor = s.project.join(".cursor/hooks.json");
    refused(
        &s,
        "cursor",
        &cursor,
        "{\"version\": 1, \"hooks\": {\"stop\": \"x\"}}",
        (1, 34),
        "hooks.stop: expected an array of hooks, found a string",
    );
}

#[test]
fn a_missing_settings_file_and_its_directory_are_made_and_remove_takes_the_file_away_again() {
    let s = setup("ws");
    let out = s.run(&["connect", "cursor", "--events", "stop,afterFileEdit"]);
    ok(&out);
    let file = s.project.join(".cursor/hooks.json");
    let written = std::fs::read_to_string(&file).unwrap();
    let v: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(v["version"], 1);
    for event in ["stop", "afterFileEdit"] {
        let entries = v["hooks"][event].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].as_object().unwrap().len(), 1, "{}", entries[0]);
        assert_eq!(
            sh_words(entries[0]["command"].as_str().unwrap()),
            our_argv("cursor", &s.ws)
        );
    }
    assert!(written.ends_with("}\n"));
    // Not writable by others, readable by the user; no backup of nothing.
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode & 0o600, mode & 0o022), (0o600, 0), "{mode:o}");
    assert!(!s.project.join(".cursor/hooks.json.prx-hooks.bak").exists());
    // The file held only ours: --remove takes it away (a backup stays).
    let out = s.run(&["connect", "cursor", "--remove"]);
    ok(&out);
    assert!(!file.exists());
    assert!(
        text(&out.stdout).contains("removed the file"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(s.project.join(".cursor/hooks.json.prx-hooks.bak")).unwrap(),
        written
    );
}

#[test]
fn cursor_entries_go_next_to_the_users_own() {
    let s = setup("ws");
    let file = s.project.join(".cursor/hooks.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "{\n  \"version\": 1,\n  \"hooks\": {\n    \"afterFileEdit\": [{ \"command\": \"./hooks/format.sh\" }]\n  }\n}\n";
    std::fs::write(&file, mine).unwrap();
    ok(&s.run(&["connect", "cursor"]));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let hooks = v["hooks"].as_object().unwrap();
    assert_eq!(hooks.len(), 20, "{:?}", hooks.keys());
    assert_eq!(
        v["hooks"]["afterFileEdit"][0]["command"],
        "./hooks/format.sh"
    );
    assert_eq!(v["hooks"]["afterFileEdit"].as_array().unwrap().len(), 2);
    ok(&s.run(&["connect", "cursor", "--remove"]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
}

#[test]
fn gemini_cli_keeps_comments_and_its_disabled_list() {
    let s = setup("ws");
    let file = s.project.join(".gemini/settings.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "{\n  // my theme\n  \"ui\": {\"theme\": \"GitHub\"}, /* why */\n  \"hooks\": {\n    \"disabled\": [\"secret-scanner\"],\n    \"BeforeTool\": [\n      {\"matcher\": \"write_file\", \"hooks\": [{\"type\": \"command\", \"command\": \"./scan.sh\"}]}\n    ]\n  }\n}\n";
    std::fs::write(&file, mine).unwrap();
    let out = s.run(&["connect", "gemini-cli"]);
    ok(&out);
    let said = text(&out.stderr);
    assert!(
        said.contains("hooksConfig.enabled") && said.contains("trust"),
        "{said}"
    );
    assert!(!said.contains("Enable Hooks System"), "{said}");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(
        written.starts_with("{\n  // my theme\n  \"ui\": {\"theme\": \"GitHub\"}, /* why */\n"),
        "{written}"
    );
    // What Gemini CLI reads: the file without its comments.
    let plain: String = written
        .lines()
        .map(|l| l.split(" /*").next().unwrap())
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let v: Value = serde_json::from_str(&plain).unwrap_or_else(|e| panic!("{e}: {plain}"));
    assert_eq!(
        v["hooks"]["disabled"],
        serde_json::json!(["secret-scanner"])
    );
    assert_eq!(v["hooks"]["BeforeTool"][0]["matcher"], "write_file");
    let events = [
        "SessionStart",
        "BeforeAgent",
        "BeforeModel",
        "AfterModel",
        "BeforeToolSelection",
        "BeforeTool",
        "AfterTool",
        "AfterAgent",
        "PreCompress",
        "Notification",
        "SessionEnd",
    ];
    for event in events {
        let entry = &v["hooks"][event].as_array().unwrap().last().unwrap()["hooks"][0];
        assert_eq!(entry["name"], "prx-hooks", "{event}");
        assert_eq!(entry["type"], "command");
        assert_eq!(entry["timeout"], 5000);
        assert_eq!(
            sh_words(entry["command"].as_str().unwrap()),
            our_argv("gemini-cli", &s.ws)
        );
    }
    assert_eq!(v["hooks"].as_object().unwrap().len(), events.len() + 1);
    ok(&s.run(&["connect", "gemini-cli", "--remove"]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
}

#[test]
fn codex_notify_goes_into_the_users_config_toml_with_its_comments_kept_when_asked() {
    let s = setup("ws");
    let file = s.home.join(".codex/config.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "# Codex, mine\nmodel = \"o3\"   # the best one\napproval_policy = \"on-request\"\n\n# MCP servers\n[mcp_servers.docs]\ncommand = \"npx\"\nargs = [\"-y\", \"docs-mcp\"]\n";
    std::fs::write(&file, mine).unwrap();
    let out = s.run(&["connect", "codex", "--notify"]);
    ok(&out);
    let written = std::fs::read_to_string(&file).unwrap();
    let doc: toml::Table = toml::from_str(&written).unwrap();
    let notify: Vec<String> = doc["notify"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(notify, our_argv("codex", &s.ws));
    // Every line of the user's is still there, in order; one line was added.
    let (a, b): (Vec<&str>, Vec<&str>) = (mine.lines().collect(), written.lines().collect());
    assert_eq!(b.len(), a.len() + 1, "{written}");
    let kept: Vec<&str> = b
        .iter()
        .copied()
        .filter(|l| !l.starts_with("notify = "))
        .collect();
    assert_eq!(kept, a);
    // notify is a top-level key: it must come before the first table.
    let at = |p: &str| written.find(p).unwrap();
    assert!(at("notify = ") < at("[mcp_servers.docs]"), "{written}");
    ok(&s.run(&["connect", "codex", "--notify"]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), written);
    ok(&s.run(&["connect", "codex", "--notify", "--remove"]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);

    // A project's config.toml cannot run notify: refused, nothing made.
    let out = s.run(&["connect", "codex", "--notify", "--scope", "project"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--scope user"),
        "{}",
        text(&out.stderr)
    );
    assert!(!s.project.join(".codex").exists());
}

#[test]
fn codex_refuses_to_replace_another_notify_program_unless_forced() {
    let s = setup("ws");
    let file = s.home.join(".codex/config.toml");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "model = \"o3\"\nnotify = [\"python3\", \"/home/me/notify.py\"] # desktop\n";
    std::fs::write(&file, mine).unwrap();
    let out = s.run(&["connect", "codex", "--notify"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "{}:2:1: notify already runs `python3 /home/me/notify.py`",
            file.display()
        )),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
    // --remove leaves someone else's notify.
    let out = s.run(&["connect", "codex", "--notify", "--remove"]);
    ok(&out);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
    // --force: replaced, the trailing comment kept, the old line in the backup.
    let out = s.run(&["connect", "codex", "--notify", "--force"]);
    ok(&out);
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(
        written.starts_with("model = \"o3\"\nnotify = ["),
        "{written}"
    );
    assert!(written.ends_with("] # desktop\n"), "{written}");
    assert_eq!(
        std::fs::read_to_string(s.home.join(".codex/config.toml.prx-hooks.bak")).unwrap(),
        mine
    );
    // $CODEX_HOME is where Codex looks when it is set.
    let other = s.home.join("codex-home");
    let out = Command::new(BIN)
        .args(["connect", "codex", "--notify", "--workspace"])
        .arg(&s.ws)
        .env("HOME", &s.home)
        .env("CODEX_HOME", &other)
        .output()
        .unwrap();
    ok(&out);
    assert!(other.join("config.toml").exists());
}

#[test]
fn usage_errors_exit_2_and_write_nothing() {
    let s = setup("ws");
    for (args, says) in [
        (vec!["connect", "claude"], "unknown agent"),
        (
            vec!["connect", "cursor", "--http"],
            "--http is for Claude Code only",
        ),
        (
            vec!["connect", "cursor", "--events", "PreToolUse"],
            "unknown event \"PreToolUse\"",
        ),
        (
            vec!["connect", "claude-code", "--scope", "global"],
            "invalid value",
        ),
        (
            vec!["connect", "claude-code", "--force"],
            "--force is for codex --notify",
        ),
        (
            vec!["connect", "claude-code", "--events", "WorktreeCreate"],
            "never written",
        ),
        (
            vec!["connect", "cursor", "--notify"],
            "--notify is for codex",
        ),
    ] {
        let out = s.run(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = prx(
        &["connect", "claude-code", "--workspace", "no-such-dir"],
        &s.project,
        &s.home,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("is not a directory"));
    assert!(!s.project.join(".claude").exists());
    // --help documents the exit codes and the files.
    let out = prx(&["connect", "--help"], &s.project, &s.home);
    ok(&out);
    let help = text(&out.stdout);
    assert!(
        help.contains("Exit codes:") && help.contains(".codex/config.toml"),
        "{help}"
    );
}

#[test]
fn user_scope_writes_under_home() {
    let s = setup("ws");
    ok(&s.run(&[
        "connect",
        "claude-code",
        "--scope",
        "user",
        "--events",
        "Stop",
    ]));
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(s.home.join(".claude/settings.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(v["hooks"]["Stop"].as_array().unwrap().len(), 1);
    assert!(!s.project.join(".claude").exists());
    ok(&s.run(&["connect", "claude-code", "--scope", "user", "--remove"]));
    assert!(!s.home.join(".claude/settings.json").exists());
}

/// A running `prx-hooks run --listen ADDR --print` on `ws`: its bus messages as they come.
struct Server {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
    /// Its stderr, read to the end (kept, so the pipe stays open).
    _stderr: Lines,
}

impl Server {
    fn start(ws: &Path, listen: &str) -> Server {
        let mut child = Command::new(BIN)
            .args(["run", "--print", "--workspace"])
            .arg(ws)
            .args(["--listen", listen])
            .env("RUST_LOG", "info")
            .env_remove("PRX_HOOKS_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = Lines::of(&mut child);
        lines.find("HTTP API on ");
        let stdout = child.stdout.take().unwrap();
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Server {
            child,
            out,
            _stderr: lines,
        }
    }

    /// The next bus message whose topic is `topic` (30 s at most).
    fn expect(&self, topic: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = self.out.recv_timeout(left) else {
                break;
            };
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["topic"] == topic {
                return v;
            }
        }
        panic!("no {topic} message");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fixture(agent: &str, event: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/agents")
        .join(agent)
        .join(format!("{event}.json"));
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `command` with `sh -c` and `stdin`, as Claude Code, Gemini CLI and Cursor run a hook.
fn run_hook(command: &str, stdin: &str) {
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
    ok(&out);
    // `{}` on stdout, "no decision": these agents read a hook's stdout as its answer;
    // nothing on stderr on a path that succeeded.
    assert_eq!(text(&out.stdout), "{}\n", "{command}");
    assert_eq!(text(&out.stderr), "", "{command}");
}

#[test]
fn the_written_entries_deliver_each_agents_events_to_a_running_server() {
    // A workspace whose path needs quoting: a space and a quote.
    let s = setup("my ws's");
    let server = Server::start(&s.ws, "127.0.0.1:0");
    let hook_of = |file: &Path, event: &str, grouped: bool| -> String {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let last = v["hooks"][event]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        let entry = if grouped {
            last["hooks"][0].clone()
        } else {
            last
        };
        entry["command"].as_str().unwrap().to_string()
    };

    ok(&s.run(&["connect", "claude-code"]));
    let cmd = hook_of(&settings(&s), "PostToolUse", true);
    run_hook(&cmd, &fixture("claude-code", "PostToolUse"));
    let m = server.expect("prx.lifecycle.tool_call");
    assert_eq!(
        (m["agent"].as_str(), m["payload"]["tool"].as_str()),
        (Some("claude-code"), Some("Write"))
    );

    ok(&s.run(&["connect", "gemini-cli"]));
    let cmd = hook_of(&s.project.join(".gemini/settings.json"), "BeforeTool", true);
    run_hook(&cmd, &fixture("gemini-cli", "BeforeTool"));
    let m = server.expect("prx.lifecycle.tool_call_start");
    assert_eq!(m["agent"], "gemini-cli");

    ok(&s.run(&["connect", "cursor"]));
    let cmd = hook_of(&s.project.join(".cursor/hooks.json"), "stop", false);
    run_hook(&cmd, &fixture("cursor", "stop"));
    let m = server.expect("prx.lifecycle.turn_complete");
    assert_eq!(m["agent"], "cursor");

    // Codex's hooks: a command with the payload on stdin, as the others.
    ok(&s.run(&["connect", "codex"]));
    let cmd = hook_of(&s.home.join(".codex/hooks.json"), "PostToolUse", true);
    run_hook(&cmd, &fixture("codex", "PostToolUse"));
    let m = server.expect("prx.lifecycle.tool_call");
    assert_eq!(m["agent"], "codex");

    // Codex runs notify's argv itself (no shell), the JSON as its last argument.
    ok(&s.run(&["connect", "codex", "--notify"]));
    let doc: toml::Table =
        toml::from_str(&std::fs::read_to_string(s.home.join(".codex/config.toml")).unwrap())
            .unwrap();
    let argv: Vec<&str> = doc["notify"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .arg(fixture("codex", "agent-turn-complete"))
        .env_remove("PRX_HOOKS_TOKEN")
        .output()
        .unwrap();
    ok(&out);
    assert_eq!(text(&out.stderr), "", "{argv:?}");
    let m = server.expect("prx.lifecycle.turn_complete");
    assert_eq!(m["agent"], "codex");
}

#[test]
fn http_takes_the_servers_tcp_address_and_refuses_a_unix_socket() {
    let s = setup("ws");
    let server = Server::start(&s.ws, "127.0.0.1:0");
    let address = std::fs::read_to_string(s.ws.join(".prx-hooks/address")).unwrap();
    let out = s.run(&[
        "connect",
        "claude-code",
        "--http",
        "--events",
        "PostToolUse",
    ]);
    ok(&out);
    assert_eq!(
        text(&out.stderr).matches("PRX_HOOKS_TOKEN").count(),
        2,
        "said once: {}",
        text(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(settings(&s)).unwrap()).unwrap();
    let entry = &v["hooks"]["PostToolUse"][0]["hooks"][0];
    let url = format!("{}/api/ingest/claude-code", address.trim());
    assert_eq!(
        *entry,
        serde_json::json!({
            "type": "http",
            "url": url,
            "headers": {"Authorization": "Bearer $PRX_HOOKS_TOKEN"},
            "allowedEnvVars": ["PRX_HOOKS_TOKEN"],
            "timeout": 5
        })
    );
    // What Claude Code then sends: the payload, the header filled from the environment.
    let token = std::fs::read_to_string(s.ws.join(".prx-hooks/token")).unwrap();
    let resp = ureq::post(&url)
        .header("authorization", format!("Bearer {}", token.trim()))
        .header("content-type", "application/json")
        .send(fixture("claude-code", "PostToolUse").as_bytes())
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        server.expect("prx.lifecycle.tool_call")["agent"],
        "claude-code"
    );
    // The command hook replaces the http one (one entry of ours per event), and back.
    ok(&s.run(&["connect", "claude-code", "--events", "PostToolUse"]));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(settings(&s)).unwrap()).unwrap();
    assert_eq!(v["hooks"]["PostToolUse"].as_array().unwrap().len(), 1);
    assert_eq!(v["hooks"]["PostToolUse"][0]["hooks"][0]["type"], "command");
    drop(server);

    let sock = s.ws.join("api.sock");
    let _unix = Server::start(&s.ws, &format!("unix:{}", sock.display()));
    let out = s.run(&["connect", "claude-code", "--http"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("a unix socket"),
        "{}",
        text(&out.stderr)
    );
    // A URL given is used as it is.
    let out = s.run(&[
        "connect",
        "claude-code",
        "--http",
        "http://127.0.0.1:7878/",
        "--events",
        "Stop",
    ]);
    ok(&out);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(settings(&s)).unwrap()).unwrap();
    assert_eq!(
        v["hooks"]["Stop"][0]["hooks"][0]["url"],
        "http://127.0.0.1:7878/api/ingest/claude-code"
    );
}

#[test]
fn a_settings_file_that_is_a_link_is_edited_where_it_points_and_the_link_stays() {
    let s = setup("ws");
    let real = s.home.join("dotfiles/claude.json");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    std::fs::write(&real, "{\"model\": \"opus\"}\n").unwrap();
    let link = settings(&s);
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    ok(&s.run(&["connect", "claude-code", "--events", "Stop"]));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&real).unwrap()).unwrap();
    assert_eq!(v["model"], "opus");
    assert_eq!(v["hooks"]["Stop"].as_array().unwrap().len(), 1);
}

#[test]
fn without_prx_hooks_send_beside_it_connect_writes_prx_hooks_send_and_both_are_ours() {
    let s = setup("ws");
    // A copy of `prx-hooks` alone in its directory (as when only it was installed).
    let alone = s.ws.parent().unwrap().join("bin");
    std::fs::create_dir_all(&alone).unwrap();
    let copy = alone.join("prx-hooks");
    std::fs::copy(BIN, &copy).unwrap();
    // A process another test thread forks while the copy is open for writing holds it open
    // until it execs: running the copy fails with ETXTBSY until then.
    let out = (0..100)
        .find_map(|_| {
            match Command::new(&copy)
                .args(["connect", "claude-code", "--events", "Stop", "--absolute"])
                .arg("--workspace")
                .arg(&s.ws)
                .current_dir(&s.project)
                .env("HOME", &s.home)
                .env_remove("PRX_HOOKS_TOKEN")
                .output()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(Duration::from_millis(20));
                    None
                }
                r => Some(r.unwrap()),
            }
        })
        .expect("the copy stays busy");
    ok(&out);
    let command = |s: &Setup| {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(settings(s)).unwrap()).unwrap();
        assert_eq!(v["hooks"]["Stop"].as_array().unwrap().len(), 1, "{v}");
        v["hooks"]["Stop"][0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let words = sh_words(&command(&s));
    assert_eq!(
        words[..2],
        [copy.to_str().unwrap().to_string(), "send".to_string()]
    );
    assert_eq!(words[2..], our_argv("claude-code", &s.ws)[1..]);
    // The installed pair recognises that entry as its own and replaces it with prx-hooks-send;
    // --remove then leaves the file as it was before either.
    ok(&s.run(&["connect", "claude-code", "--events", "Stop"]));
    assert_eq!(sh_words(&command(&s)), our_argv("claude-code", &s.ws));
    ok(&s.run(&["connect", "claude-code", "--remove"]));
    assert!(!settings(&s).exists());
}
