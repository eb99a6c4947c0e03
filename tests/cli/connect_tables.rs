//! What `connect` writes for each agent (docs/connect.md § Every event, its handler, sync or
//! async; § A file the team can commit): a project file with no path of this machine in it
//! that still delivers, Codex's hooks with the trust step said, Claude Code's `--http` keeping
//! a command where it runs no `http` hook.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

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

fn bins() -> String {
    Path::new(BIN)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

/// A project with a workspace inside it, a home, all in one temporary directory.
struct Setup {
    root: tempfile::TempDir,
    project: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let project = root.path().join("my project");
    let ws = project.join("prx ws");
    let home = root.path().join("home");
    for d in [&ws, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    Setup {
        project: project.canonicalize().unwrap(),
        ws: ws.canonicalize().unwrap(),
        home,
        root,
    }
}

impl Setup {
    fn run_with_path(&self, args: &[&str], path: &str) -> Output {
        Command::new(BIN)
            .args(args)
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env("PATH", path)
            .env_remove("CODEX_HOME")
            .env_remove("PRX_HOOKS_TOKEN")
            .output()
            .unwrap()
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with_path(args, &format!("{}:/usr/bin:/bin", bins()))
    }

    fn json(&self, rel: &str) -> Value {
        let t = std::fs::read_to_string(self.project.join(rel)).unwrap();
        serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t}"))
    }
}

/// A running `prx-hooks run --listen 127.0.0.1:0 --print` on `ws`: its bus messages.
struct Server {
    child: std::process::Child,
    out: std::sync::mpsc::Receiver<Value>,
}

impl Server {
    fn start(ws: &Path) -> Server {
        let mut child = Command::new(BIN)
            .args(["run", "--print", "--workspace"])
            .arg(ws)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env_remove("PRX_HOOKS_TOKEN")
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, out) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(v) = serde_json::from_str(&l)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        crate::support::wait_for("the address file", || {
            ws.join(".prx-hooks/address").exists()
        });
        Server { child, out }
    }

    fn expect(&self, topic: &str) -> Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.out.recv_timeout(left) {
                Ok(v) if v["topic"] == topic => return v,
                Ok(_) => {}
                Err(_) => break,
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

/// `command` run by `sh -c` as an agent runs a hook: in `cwd`, with `env`, the payload on
/// stdin; nothing on stdout or stderr.
fn run_hook(command: &str, cwd: &Path, env: &[(&str, &Path)], stdin: &str) {
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg(command)
        .current_dir(cwd)
        .env("PATH", format!("{}:/usr/bin:/bin", bins()))
        .env_remove("PRX_HOOKS_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    ok(&out);
    assert_eq!(
        (text(&out.stdout), text(&out.stderr)),
        ("{}\n".to_string(), String::new()),
        "{command}"
    );
}

#[test]
fn connect_writes_a_project_file_with_no_path_of_this_machine_that_still_delivers() {
    let s = setup();
    let server = Server::start(&s.ws);
    let ws = s.ws.to_str().unwrap();
    for agent in ["claude-code", "gemini-cli", "cursor"] {
        let out = s.run(&["connect", agent, "--workspace", ws]);
        ok(&out);
        assert!(
            text(&out.stdout).contains("can be committed"),
            "{}",
            text(&out.stdout)
        );
    }
    let root = s.root.path().to_str().unwrap();
    for rel in [
        ".claude/settings.json",
        ".gemini/settings.json",
        ".cursor/hooks.json",
    ] {
        let written = std::fs::read_to_string(s.project.join(rel)).unwrap();
        assert!(
            !written.contains(root),
            "{rel} names this machine:\n{written}"
        );
        assert!(!written.contains(&bins()), "{rel}:\n{written}");
    }
    let claude = s.json(".claude/settings.json");
    let cmd = claude["hooks"]["PostToolUse"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap();
    assert_eq!(
        cmd,
        "prx-hooks-send --from claude-code --workspace \"${CLAUDE_PROJECT_DIR:-.}\"/'prx ws'"
    );
    // Claude Code runs it with CLAUDE_PROJECT_DIR set, from whatever directory.
    run_hook(
        cmd,
        Path::new("/"),
        &[("CLAUDE_PROJECT_DIR", &s.project)],
        &fixture("claude-code", "PostToolUse"),
    );
    assert_eq!(
        server.expect("prx.lifecycle.tool_call")["agent"],
        "claude-code"
    );
    // Without the variable (an agent that does not set it), from the project.
    let gemini = s.json(".gemini/settings.json");
    let cmd = gemini["hooks"]["BeforeTool"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap();
    assert!(cmd.contains("${GEMINI_PROJECT_DIR:-.}"), "{cmd}");
    run_hook(cmd, &s.project, &[], &fixture("gemini-cli", "BeforeTool"));
    assert_eq!(
        server.expect("prx.lifecycle.tool_call_start")["agent"],
        "gemini-cli"
    );
    let cursor = s.json(".cursor/hooks.json");
    let cmd = cursor["hooks"]["stop"][0]["command"].as_str().unwrap();
    run_hook(
        cmd,
        Path::new("/"),
        &[("CURSOR_PROJECT_DIR", &s.project)],
        &fixture("cursor", "stop"),
    );
    assert_eq!(
        server.expect("prx.lifecycle.turn_complete")["agent"],
        "cursor"
    );
}

#[test]
fn connect_refuses_to_put_this_machines_paths_in_a_project_file_unless_asked() {
    let s = setup();
    let outside = s.root.path().join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    let outside = outside.to_str().unwrap();
    let out = s.run(&["connect", "claude-code", "--workspace", outside]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("outside the project") && err.contains("--absolute"),
        "{err}"
    );
    // prx-hooks-send not on PATH: said, nothing written.
    let ws = s.ws.to_str().unwrap();
    let out = s.run_with_path(
        &["connect", "claude-code", "--workspace", ws],
        "/usr/bin:/bin",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("on PATH"),
        "{}",
        text(&out.stderr)
    );
    assert!(!s.project.join(".claude").exists());
    // Asked: this machine's paths, and the dry run shows them.
    let out = s.run(&[
        "connect",
        "claude-code",
        "--workspace",
        outside,
        "--absolute",
        "--dry-run",
    ]);
    ok(&out);
    assert!(text(&out.stdout).contains(outside), "{}", text(&out.stdout));
    assert!(!s.project.join(".claude").exists());
    // Codex has no project directory variable: a project hooks.json wants --absolute.
    let out = s.run(&["connect", "codex", "--scope", "project", "--workspace", ws]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--absolute"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn connect_codex_writes_its_hooks_synchronous_and_says_how_to_trust_them() {
    let s = setup();
    let ws = s.ws.to_str().unwrap();
    let out = s.run(&["connect", "codex", "--workspace", ws]);
    ok(&out);
    let err = text(&out.stderr);
    assert!(
        err.contains("/hooks") && err.contains("--dangerously-bypass-hook-trust"),
        "{err}"
    );
    let file = s.home.join(".codex/hooks.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let hooks = v["hooks"].as_object().unwrap();
    let events: Vec<&str> = hooks.keys().map(String::as_str).collect();
    for e in [
        "SessionStart",
        "PreToolUse",
        "PostToolUse",
        "Stop",
        "SessionEnd",
        "Interrupt",
    ] {
        assert!(events.contains(&e), "{e}: {events:?}");
    }
    assert!(!events.contains(&"StopFailure"), "{events:?}");
    assert_eq!(events.len(), 12);
    for (event, groups) in hooks {
        let entry = &groups[0]["hooks"][0];
        assert_eq!(entry["type"], "command");
        assert_eq!(entry.get("async"), None, "{event}: Codex skips async hooks");
        let limit = if event == "SessionEnd" || event == "Interrupt" {
            3
        } else {
            5
        };
        assert_eq!(entry["timeout"], limit, "{event}");
    }
    // A user file: this machine's paths are right there.
    let cmd = hooks["Stop"][0]["hooks"][0]["command"].as_str().unwrap();
    assert!(
        cmd.contains(ws) || cmd.contains(&format!("'{ws}'")),
        "{cmd}"
    );
    assert!(!s.home.join(".codex/config.toml").exists());
    // With our notify still set, connect says each turn would arrive twice.
    ok(&s.run(&["connect", "codex", "--notify", "--workspace", ws]));
    let out = s.run(&["connect", "codex", "--workspace", ws]);
    ok(&out);
    assert!(text(&out.stderr).contains("twice"), "{}", text(&out.stderr));
    ok(&s.run(&["connect", "codex", "--remove"]));
    assert!(!file.exists());
}

#[test]
fn connect_http_keeps_a_command_where_claude_code_runs_no_http_hook() {
    let s = setup();
    let ws = s.ws.to_str().unwrap();
    let out = s.run(&[
        "connect",
        "claude-code",
        "--workspace",
        ws,
        "--http",
        "http://127.0.0.1:7878",
    ]);
    ok(&out);
    let err = text(&out.stderr);
    assert!(
        err.contains("Setup and SessionStart keep a command hook"),
        "{err}"
    );
    let v = s.json(".claude/settings.json");
    for event in ["Setup", "SessionStart"] {
        let entry = &v["hooks"][event][0]["hooks"][0];
        assert_eq!(entry["type"], "command", "{event}");
        assert_eq!(entry["async"], true, "{event}");
    }
    for event in ["PreToolUse", "Stop", "SessionEnd"] {
        assert_eq!(v["hooks"][event][0]["hooks"][0]["type"], "http", "{event}");
    }
}

#[test]
fn connect_qwen_code_and_factory_droid_write_every_event_synchronous_and_remove_gives_the_bytes_back()
 {
    let s = setup();
    let ws = s.ws.to_str().unwrap();
    for (agent, rel, var, events) in [
        ("qwen-code", ".qwen/settings.json", "QWEN_PROJECT_DIR", 21),
        (
            "factory-droid",
            ".factory/settings.json",
            "FACTORY_PROJECT_DIR",
            9,
        ),
    ] {
        let file = s.project.join(rel);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let mine = "{\n  \"model\": \"mine\"\n}\n";
        std::fs::write(&file, mine).unwrap();
        ok(&s.run(&["connect", agent, "--workspace", ws]));
        let v = s.json(rel);
        let hooks = v["hooks"].as_object().unwrap();
        assert_eq!(hooks.len(), events, "{agent}: {:?}", hooks.keys());
        assert_eq!(v["model"], "mine");
        for (event, groups) in hooks {
            let entry = &groups[0]["hooks"][0];
            assert_eq!(entry["type"], "command", "{agent} {event}");
            assert_eq!(entry.get("async"), None, "{agent} {event}");
            assert_eq!(entry["timeout"], 5, "{agent} {event}");
            let cmd = entry["command"].as_str().unwrap();
            assert!(
                cmd.starts_with(&format!(
                    "prx-hooks-send --from {agent} --workspace \"${{{var}:-.}}\"/"
                )),
                "{cmd}"
            );
        }
        // Qwen Code's MessageDisplay fires per streamed chunk: only on request.
        assert!(!hooks.contains_key("MessageDisplay"));
        ok(&s.run(&["connect", agent, "--remove"]));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), mine, "{agent}");
    }
}

/// Copilot CLI and Windsurf give their hooks no project variable but run them in the project's
/// root: the workspace is written relative to it. Copilot CLI's entries go in a file of their
/// own (its PascalCase names where the event has one), which `--remove` deletes; Windsurf's go
/// beside the user's own in `.windsurf/hooks.json`, which `--remove` gives back byte for byte.
/// User scope writes each one's user file. Neither program runs here (Windsurf has no CLI;
/// Copilot CLI's real sessions are in tests/agents): this is what the files say.
#[test]
fn connect_copilot_cli_and_windsurf_write_the_workspace_relative_to_the_project() {
    let s = setup();
    let ws = s.ws.to_str().unwrap();

    ok(&s.run(&["connect", "copilot-cli", "--workspace", ws]));
    let v = s.json(".github/hooks/prx-hooks.json");
    assert_eq!(v["version"], 1);
    let hooks = v["hooks"].as_object().unwrap();
    let mut keys: Vec<&str> = hooks.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "ErrorOccurred",
            "PostToolUse",
            "PostToolUseFailure",
            "PreCompact",
            "PreToolUse",
            "SessionEnd",
            "SessionStart",
            "Stop",
            "SubagentStop",
            "UserPromptSubmit",
            "notification",
            "subagentStart",
        ]
    );
    for (event, entries) in hooks {
        assert_eq!(entries.as_array().unwrap().len(), 1, "{event}");
        let e = &entries[0];
        assert_eq!(
            (&e["type"], &e["cwd"], &e["timeoutSec"]),
            (&"command".into(), &".".into(), &5.into()),
            "{event}"
        );
        assert_eq!(
            e["bash"], "prx-hooks-send --from copilot-cli --workspace 'prx ws'",
            "{event}"
        );
    }
    let out = s.run(&["connect", "copilot-cli", "--workspace", ws]);
    ok(&out);
    assert!(
        text(&out.stdout).contains("already connected"),
        "{}",
        text(&out.stdout)
    );
    // doctor reads it as Copilot CLI does: every entry on an event it has; the folder is not
    // trusted yet.
    let out = s.run(&["doctor", "--agent", "copilot-cli"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("Copilot CLI does not trust"), "{said}");
    assert!(!said.contains("not an event"), "{said}");
    ok(&s.run(&["connect", "copilot-cli", "--remove"]));
    assert!(!s.project.join(".github/hooks/prx-hooks.json").exists());
    ok(&s.run(&[
        "connect",
        "copilot-cli",
        "--workspace",
        ws,
        "--scope",
        "user",
    ]));
    let user = s.home.join(".copilot/hooks/prx-hooks.json");
    let written = std::fs::read_to_string(&user).unwrap();
    assert!(written.contains("--from copilot-cli"), "{written}");
    assert!(written.contains(&format!("'{ws}'")), "{written}");
    ok(&s.run(&["connect", "copilot-cli", "--remove", "--scope", "user"]));
    assert!(!user.exists());

    let file = s.project.join(".windsurf/hooks.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mine = "{\n  \"hooks\": {\n    \"post_write_code\": [\n      { \"command\": \"npx prettier --write .\", \"show_output\": true }\n    ]\n  }\n}\n";
    std::fs::write(&file, mine).unwrap();
    ok(&s.run(&["connect", "windsurf", "--workspace", ws]));
    let v = s.json(".windsurf/hooks.json");
    let hooks = v["hooks"].as_object().unwrap();
    assert_eq!(hooks.len(), 11, "{:?}", hooks.keys());
    assert_eq!(
        v["hooks"]["post_write_code"][0]["command"],
        "npx prettier --write ."
    );
    for (event, entries) in hooks {
        let ours = entries.as_array().unwrap().last().unwrap();
        assert_eq!(
            ours,
            &serde_json::json!({"command": "prx-hooks-send --from windsurf --workspace 'prx ws'", "show_output": false}),
            "{event}"
        );
    }
    ok(&s.run(&["connect", "windsurf", "--remove"]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), mine);
    ok(&s.run(&["connect", "windsurf", "--workspace", ws, "--scope", "user"]));
    let user = s.home.join(".codeium/windsurf/hooks.json");
    assert!(
        std::fs::read_to_string(&user)
            .unwrap()
            .contains("--from windsurf")
    );
    ok(&s.run(&["connect", "windsurf", "--remove", "--scope", "user"]));
    assert!(!user.exists());
}
