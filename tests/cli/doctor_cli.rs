//! `prx-hooks doctor` (docs/cli.md § `doctor`, docs/connect.md § Checking it: doctor): each
//! way an agent's hook fails without a word, set up on purpose in real files with a real
//! server, is found and said, and the exit status tells a script: 0 all good, 1 problems, 2
//! something could not be checked.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn bins() -> String {
    Path::new(BIN)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

struct Setup {
    _root: tempfile::TempDir,
    project: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let project = root.path().join("project");
    let ws = project.join("ws");
    let home = root.path().join("home");
    for d in [&ws, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    Setup {
        project: project.canonicalize().unwrap(),
        ws: ws.canonicalize().unwrap(),
        home: home.canonicalize().unwrap(),
        _root: root,
    }
}

impl Setup {
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(&self.project)
            .env("HOME", &self.home)
            .env("PATH", format!("{}:/usr/bin:/bin", bins()))
            .env_remove("CODEX_HOME")
            .env_remove("PRX_HOOKS_TOKEN")
            .env_remove("GEMINI_CLI_TRUSTED_FOLDERS_PATH");
        c
    }

    fn connect(&self, agent: &str, extra: &[&str]) {
        let ws = self.ws.to_str().unwrap().to_string();
        let mut args = vec!["connect", agent, "--workspace", &ws];
        args.extend(extra);
        let out = self.cmd(&args).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    /// `doctor`: its exit code and stdout.
    fn doctor(&self, env: &[(&str, &str)]) -> (i32, String) {
        let mut c = self.cmd(&["doctor"]);
        for (k, v) in env {
            c.env(k, v);
        }
        let out: Output = c.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            text(&out.stdout) + &text(&out.stderr),
        )
    }

    fn write(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.project.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        p
    }
}

/// A `problem` line of `out` holds every one of `words`.
fn problem(out: &str, words: &[&str]) -> bool {
    out.lines()
        .any(|l| l.trim_start().starts_with("problem") && words.iter().all(|w| l.contains(w)))
}

struct Server(std::process::Child);

impl Server {
    fn start(ws: &Path) -> Server {
        let child = Command::new(BIN)
            .args(["run", "--workspace"])
            .arg(ws)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove("PRX_HOOKS_TOKEN")
            .spawn()
            .unwrap();
        crate::support::wait_for("the address file", || {
            ws.join(".prx-hooks/address").exists()
        });
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `send --from AGENT` with `payload`, as the agent's hook runs it.
fn send(ws: &Path, agent: &str, payload: &str) {
    let mut child = Command::new(BIN)
        .args(["send", "--strict", "--from", agent, "--workspace"])
        .arg(ws)
        .stdin(Stdio::piped())
        .env_remove("PRX_HOOKS_TOKEN")
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

const POST_TOOL_USE: &str = r#"{"session_id":"s1","hook_event_name":"PostToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"tool_response":"ok","cwd":"/p"}"#;

#[test]
fn doctor_names_an_event_the_agent_does_not_have_and_a_file_it_would_reject() {
    let s = setup();
    let cmd = format!(
        "prx-hooks-send --from claude-code --workspace {}",
        s.ws.display()
    );
    let wrong = serde_json::json!({"hooks": {"PostToolUsed": [{"hooks": [{"type": "command", "command": cmd}]}]}});
    s.write(".claude/settings.json", &wrong.to_string());
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(
            &out,
            &[
                "PostToolUsed",
                "not an event Claude Code has",
                "did you mean PostToolUse?"
            ]
        ),
        "{out}"
    );
    // A comment: Claude Code's settings are plain JSON.
    let file = s.write(
        ".claude/settings.json",
        &format!("{{\n  // mine\n  \"hooks\": {{\"Stop\": [{{\"hooks\": [{{\"type\": \"command\", \"command\": \"{cmd}\"}}]}}]}}\n}}\n"),
    );
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(
            &out,
            &[
                &format!("{}:2:3", file.display()),
                "a comment",
                "settings error"
            ]
        ),
        "{out}"
    );
    // Gemini CLI takes the comment, not a trailing comma.
    let gemini = s.write(
        ".gemini/settings.json",
        "{\n  // mine\n  \"hooks\": {\"AfterAgent\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"prx-hooks-send --from gemini-cli\"}]},]}\n}\n",
    );
    let (_, out) = s.doctor(&[]);
    assert!(
        problem(&out, &[&format!("{}:3:", gemini.display())]),
        "{out}"
    );
    assert!(!out.contains(&format!("{}:2:3", gemini.display())), "{out}");
}

#[test]
fn doctor_says_claude_code_runs_no_http_hook_on_session_start_and_what_the_server_saw() {
    let s = setup();
    let _server = Server::start(&s.ws);
    let address = std::fs::read_to_string(s.ws.join(".prx-hooks/address")).unwrap();
    let token = std::fs::read_to_string(s.ws.join(".prx-hooks/token")).unwrap();
    let http = serde_json::json!({"type": "http", "url": format!("{}/api/ingest/claude-code", address.trim()),
        "headers": {"Authorization": "Bearer $PRX_HOOKS_TOKEN"}, "allowedEnvVars": ["PRX_HOOKS_TOKEN"]});
    let settings = serde_json::json!({"hooks": {
        "SessionStart": [{"hooks": [http.clone()]}],
        "PostToolUse": [{"hooks": [http]}],
    }});
    s.write(".claude/settings.json", &settings.to_string());
    // What Claude Code's http hook sends, and an event name nobody knows.
    send(&s.ws, "claude-code", POST_TOOL_USE);
    send(
        &s.ws,
        "claude-code",
        r#"{"session_id":"s1","hook_event_name":"BrandNewEvent"}"#,
    );
    let (code, out) = s.doctor(&[("PRX_HOOKS_TOKEN", token.trim())]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(
            &out,
            &[
                "hooks.SessionStart[0].hooks[0]",
                "an http hook on SessionStart",
                "does not run there"
            ]
        ),
        "{out}"
    );
    assert!(
        out.contains("answers with the token of $PRX_HOOKS_TOKEN"),
        "{out}"
    );
    assert!(out.contains("Claude Code seen: PostToolUse "), "{out}");
    assert!(
        out.contains("never seen: SessionStart (an http hook on SessionStart, which Claude Code does not run there"),
        "{out}"
    );
    assert!(
        out.contains(
            "sent 1 event(s) prx-hooks does not know (published as topics): BrandNewEvent"
        ),
        "{out}"
    );
    // The token not in this shell: said (Claude Code needs it in its own environment).
    let (_, out) = s.doctor(&[]);
    assert!(problem(&out, &["PRX_HOOKS_TOKEN", "not set"]), "{out}");
}

#[test]
fn doctor_finds_no_server_a_wrong_token_an_agent_never_seen_and_then_all_good() {
    let s = setup();
    s.connect("claude-code", &[]);
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(&out, &["no server runs for", "prx-hooks run"]),
        "{out}"
    );

    let _server = Server::start(&s.ws);
    let (code, out) = s.doctor(&[("PRX_HOOKS_TOKEN", "not-the-token-0123456789")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(&out, &["refuses the token", "$PRX_HOOKS_TOKEN"]),
        "{out}"
    );

    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(
            &out,
            &["Claude Code: no event seen since the server started"]
        ),
        "{out}"
    );

    // The entry connect wrote, run as Claude Code runs it: seen, all good.
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(s.project.join(".claude/settings.json")).unwrap(),
    )
    .unwrap();
    let cmd = v["hooks"]["PostToolUse"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap();
    let mut child = Command::new("/bin/sh")
        .args(["-c", cmd])
        .env("CLAUDE_PROJECT_DIR", &s.project)
        .env("PATH", format!("{}:/usr/bin:/bin", bins()))
        .env_remove("PRX_HOOKS_TOKEN")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(POST_TOOL_USE.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("Claude Code seen: PostToolUse 0 s ago (1)"),
        "{out}"
    );
    assert!(out.contains("never seen: "), "{out}");
    assert!(out.contains("doctor: 0 problem(s)"), "{out}");

    // A file that cannot be read: a check not made, exit 2.
    std::fs::create_dir_all(s.project.join(".cursor/hooks.json")).unwrap();
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("unchecked"), "{out}");
}

#[test]
fn doctor_finds_codex_hooks_not_yet_trusted() {
    let s = setup();
    s.connect("codex", &[]);
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(
            &out,
            &[
                "12 of our entries are not trusted",
                "/hooks",
                "--dangerously-bypass-hook-trust"
            ]
        ),
        "{out}"
    );
    // Trusted in /hooks: Codex records a hash per entry in config.toml.
    let hooks = s.home.join(".codex/hooks.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&hooks).unwrap()).unwrap();
    let mut config = String::new();
    for event in v["hooks"].as_object().unwrap().keys() {
        let snake: String = event
            .chars()
            .enumerate()
            .flat_map(|(i, c)| {
                let sep = (i > 0 && c.is_ascii_uppercase()).then_some('_');
                sep.into_iter()
                    .chain(std::iter::once(c.to_ascii_lowercase()))
            })
            .collect();
        config.push_str(&format!(
            "[hooks.state.\"{}:{snake}:0:0\"]\ntrusted_hash = \"sha256:00\"\n",
            hooks.display()
        ));
    }
    std::fs::write(s.home.join(".codex/config.toml"), &config).unwrap();
    let (_, out) = s.doctor(&[]);
    assert!(!problem(&out, &["not trusted"]), "{out}");
    assert!(out.contains("12 of our entries trusted"), "{out}");
    // One disabled in /hooks.
    config.push_str("enabled = false\n");
    std::fs::write(s.home.join(".codex/config.toml"), &config).unwrap();
    let (_, out) = s.doctor(&[]);
    assert!(problem(&out, &["disabled in Codex's /hooks"]), "{out}");
}

#[test]
fn doctor_finds_a_folder_gemini_cli_does_not_trust() {
    let s = setup();
    s.connect("gemini-cli", &[]);
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        problem(&out, &["Gemini CLI does not trust", "no rule for it"]),
        "{out}"
    );
    let folders = s.home.join(".gemini/trustedFolders.json");
    std::fs::create_dir_all(folders.parent().unwrap()).unwrap();
    let parent = s.project.parent().unwrap().to_str().unwrap().to_string();
    let project = s.project.to_str().unwrap().to_string();
    std::fs::write(
        &folders,
        serde_json::json!({parent.clone(): "TRUST_FOLDER", project.clone(): "DO_NOT_TRUST"})
            .to_string(),
    )
    .unwrap();
    let (_, out) = s.doctor(&[]);
    assert!(problem(&out, &["marks", "as not trusted"]), "{out}");
    std::fs::write(
        &folders,
        serde_json::json!({ project: "TRUST_FOLDER" }).to_string(),
    )
    .unwrap();
    let (_, out) = s.doctor(&[]);
    assert!(!problem(&out, &["trust"]), "{out}");
    assert!(out.contains("Gemini CLI trusts"), "{out}");
}

#[test]
fn doctor_finds_hooks_switched_off_in_the_agents_settings() {
    let s = setup();
    s.connect("gemini-cli", &[]);
    s.connect("claude-code", &[]);
    let gemini = s.project.join(".gemini/settings.json");
    let connected = std::fs::read_to_string(&gemini).unwrap();
    // What Gemini CLI's /hooks disable writes, and its switch for every hook.
    let off = connected.replacen(
        '{',
        "{\n  // mine\n  \"hooksConfig\": {\"enabled\": false, \"disabled\": [\"prx-hooks\"]},",
        1,
    );
    std::fs::write(&gemini, off).unwrap();
    let claude = s.project.join(".claude/settings.json");
    let text = std::fs::read_to_string(&claude).unwrap();
    std::fs::write(
        &claude,
        text.replacen('{', "{\"disableAllHooks\": true,", 1),
    )
    .unwrap();
    let (code, out) = s.doctor(&[]);
    assert_eq!(code, 1, "{out}");
    assert!(problem(&out, &["hooksConfig.enabled is false"]), "{out}");
    assert!(
        problem(&out, &["hooksConfig.disabled", "prx-hooks"]),
        "{out}"
    );
    assert!(
        problem(&out, &["disableAllHooks is true", "Claude Code"]),
        "{out}"
    );
}

/// A FIFO where an agent's settings file belongs is said, not waited on (doctor used to block
/// in `read` until a writer came).
#[test]
fn doctor_says_a_settings_fifo_and_does_not_wait_on_it() {
    let s = setup();
    let fifo = s.project.join(".claude/settings.json");
    std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut child = s
        .cmd(&["doctor"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > until {
            let _ = child.kill();
            panic!("doctor waits on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(all.contains("not a regular file"), "{all}");
}
