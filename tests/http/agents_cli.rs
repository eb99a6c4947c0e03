//! Every event a hook is written for, of every agent (the fixtures of
//! `tests/fixtures/agents`) delivered by `prx-hooks send --from AGENT` as the agent's hook
//! runs it, and Claude Code's also by its `http` hook type (`POST /api/ingest/claude-code`),
//! to a real `prx-hooks run --listen`: each lifecycle event fires its hook with the agent's
//! fields, each topic shows in `prx-hooks tail`.

use crate::send_cli::{BIN, Server, send};
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use serde_json::{Value, json};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn fixture(agent: Agent, event: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/agents")
        .join(agent.name())
        .join(format!("{event}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .filter(|l| !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A workspace with one hook per lifecycle event, each appending `<event> <payload>` to `log`.
fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let mut hooks = serde_json::Map::new();
    for kind in prx_hooks::EventKind::ALL {
        let script = format!(
            "p=$(cat); printf '%s %s\\n' {} \"$p\" >> {}",
            kind.name(),
            log.display()
        );
        hooks.insert(
            kind.name().into(),
            json!([{"command": "/bin/sh", "args": ["-c", script], "stdin_json": true, "max_concurrent": 1}]),
        );
    }
    let text = json!({"hooks": hooks}).to_string();
    std::fs::write(ws.path().join("hooks.json"), text).unwrap();
    (ws, log)
}

/// The hook runs logged so far: (event, payload).
fn runs(log: &Path) -> Vec<(String, Value)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(e, p)| (e.to_string(), serde_json::from_str(p).unwrap()))
        .collect()
}

/// `prx-hooks tail --json` on the workspace, its lines as they come.
fn tail(ws: &Path) -> (std::process::Child, mpsc::Receiver<Value>) {
    let mut child = Command::new(BIN)
        .args(["tail", "--json", "--workspace"])
        .arg(ws)
        .arg("prx.agent.*")
        .env_remove("PRX_HOOKS_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    (child, rx)
}

fn deliver_every_fixture(via_http: bool) {
    let (ws, log) = workspace();
    let server = Server::start(ws.path());
    let (mut tail, topics) = tail(ws.path());
    // tail is connected once it shows what is published after it (a probe topic line).
    let probe = r#"{"topic":"prx.agent.probe.ready","agent":"probe","session":"p","payload":{}}"#;
    let mut ready = false;
    for _ in 0..100 {
        send(ws.path(), &[], probe.as_bytes());
        if topics.recv_timeout(Duration::from_millis(200)).is_ok() {
            ready = true;
            break;
        }
    }
    assert!(ready, "tail never showed the probe");
    while topics.try_recv().is_ok() {}
    let token = std::fs::read_to_string(ws.path().join(".prx-hooks/token")).unwrap();
    let address = std::fs::read_to_string(ws.path().join(".prx-hooks/address")).unwrap();
    let (mut lifecycle, mut topical) = (Vec::new(), Vec::new());
    let agents: &[Agent] = if via_http {
        &[Agent::ClaudeCode]
    } else {
        &Agent::ALL
    };
    for &agent in agents {
        for &event in agent.events() {
            let input = fixture(agent, event);
            if via_http {
                let resp = ureq::post(format!("{}/api/ingest/claude-code", address.trim()))
                    .header("authorization", format!("Bearer {}", token.trim()))
                    .header("content-type", "application/json")
                    .send(input.as_bytes())
                    .unwrap();
                assert_eq!(resp.status(), 200, "{event}");
                let outcome = resp
                    .headers()
                    .get("x-prx-hooks-outcome")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                let body = resp.into_body().read_to_string().unwrap();
                assert_eq!(body, "{}", "the answer is Claude Code's carry on");
                assert!(outcome == "queued", "{event}: {outcome}");
            } else {
                let mut args = vec!["--from", agent.name()];
                // Kiro CLI's payloads carry no session id.
                if agent == Agent::Kiro {
                    args.extend(["--session", "kiro-session"]);
                }
                let s = send(ws.path(), &args, input.as_bytes());
                // `{}` where the agent reads a hook's stdout as its answer; never stderr.
                let answer = if agent.answers_on_stdout() {
                    "{}\n"
                } else {
                    ""
                };
                assert_eq!(
                    (s.code, s.stdout.as_str(), s.stderr.as_str()),
                    (0, answer, ""),
                    "{agent}/{event}"
                );
            }
            let opts = TranslateOptions {
                session: (agent == Agent::Kiro).then(|| "kiro-session".to_string()),
                ..TranslateOptions::default()
            };
            let t = translate(agent, input.as_bytes(), &opts).unwrap();
            let input: Value = serde_json::from_str(&input).unwrap();
            for (line, target) in t.lines() {
                let line: Value = serde_json::from_str(line).unwrap();
                match target {
                    Target::Lifecycle(kind) => lifecycle.push((agent, event, *kind, input.clone())),
                    Target::Topic(topic) => topical.push((topic.clone(), line["payload"].clone())),
                }
            }
        }
    }
    if !via_http {
        // Codex's older `notify` passes the JSON as the program's last argument.
        let input = fixture(Agent::Codex, "agent-turn-complete");
        let s = send(ws.path(), &["--from", "codex", &input], b"");
        assert_eq!(
            (s.code, s.stdout.as_str(), s.stderr.as_str()),
            (0, "{}\n", "")
        );
        let input: Value = serde_json::from_str(&input).unwrap();
        lifecycle.push((
            Agent::Codex,
            "agent-turn-complete",
            prx_hooks::EventKind::TurnComplete,
            input,
        ));
    }
    // Every topic shows in tail, with the agent's whole object.
    for (topic, input) in &topical {
        let shown = topics
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{topic} never showed in tail"));
        assert_eq!(
            (shown["topic"].as_str(), &shown["payload"]),
            (Some(topic.as_str()), input)
        );
    }
    // Every lifecycle event fires its hook with the agent's fields, each hook in the order
    // its events were sent (hooks of different events run side by side).
    crate::support::wait_for("every hook run", || runs(&log).len() == lifecycle.len());
    let got = runs(&log);
    for kind in prx_hooks::EventKind::ALL {
        let want: Vec<_> = lifecycle.iter().filter(|(_, _, k, _)| *k == kind).collect();
        let ran: Vec<_> = got.iter().filter(|(e, _)| e == kind.name()).collect();
        assert_eq!(want.len(), ran.len(), "{kind}");
        for ((agent, event, _, input), (_, payload)) in want.iter().zip(ran) {
            if let Some(tool) = input["tool_name"].as_str() {
                assert_eq!(payload["tool"].as_str(), Some(tool), "{agent}/{event}");
            }
            for key in [
                "cwd",
                "tool_use_id",
                "transcript_path",
                "hook_event_name",
                "workspace_roots",
                "turn-id",
                "turn_id",
            ] {
                if let Some(v) = input.get(key)
                    && !(*event == "beforeShellExecution" && key == "cwd")
                {
                    assert_eq!(payload.get(key), Some(v), "{agent}/{event}: {key}");
                }
            }
        }
    }
    let _ = tail.kill();
    let _ = tail.wait();
    let (code, report) = server.stop();
    assert_eq!(code, 0, "{report}");
}

#[test]
fn every_documented_event_of_every_agent_through_send_fires_its_hook_or_shows_in_tail() {
    deliver_every_fixture(false);
}

#[test]
fn claude_codes_http_hook_gets_carry_on_at_once_and_fires_the_same_hooks() {
    deliver_every_fixture(true);
}
