//! What a guard costs the real Claude Code CLI per tool call: a prx-hooks policy (the
//! `PreToolUse` entry `connect` writes, `prx-hooks-send` asking a real `prx-hooks run --listen`
//! whose policies.json holds the no-rm-rf rule) against a `python3` guard script doing the same
//! regex, each beside sessions with no hook at all and sessions whose hook is `/bin/true` (the
//! floor: Claude Code's own cost of running a command hook).
//!
//! Claude Code (`target/agents`, installed by `.ci/install-agents`) runs offline against the fake
//! Messages API of tests/support/models.rs, which asks for `CALLS` shell tool calls (`echo hi`)
//! one after another, then answers. Each round runs one session of each setup in a rotating
//! order; a setup's cost per tool call is its session's time minus the unguarded session's of
//! the same round, over `CALLS`. Printed: the medians, and prx-hooks' cost as a multiple of
//! python3's (docs/performance.md, docs/policies.md § Speed).
//!
//! Before timing, one session per guard asks for `rm -rf VICTIM`: both guards must deny it (the
//! directory stays), so both do the work compared.
//!
//! `cargo bench --bench guard` (`PRX_HOOKS_GUARD_ROUNDS`, default 7; `PRX_HOOKS_GUARD_CALLS`,
//! default 10; under `cargo test --benches`, 1 round of 2 calls). Without Claude Code installed
//! it says so and exits.

mod common;

#[path = "../tests/support/models.rs"]
mod models;

use models::{Api, ModelServer, Script};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");

const POLICIES: &str = r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell|run_shell_command|exec_command",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}
]}"#;

/// The same rule as a guard script written for Claude Code's command hooks.
const GUARD_PY: &str = r#"import json, re, sys
event = json.load(sys.stdin)
command = (event.get("tool_input") or {}).get("command", "")
if re.fullmatch(r"Bash|shell|run_shell_command|exec_command", event.get("tool_name", "")) \
        and re.search(r"\brm\s+-[a-zA-Z]*[rf]", command):
    print(json.dumps({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": "rm -rf is not allowed in this workspace"}}))
"#;

/// One way of running Claude Code: a project whose settings hold (or not) a `PreToolUse` guard.
struct Setup {
    name: &'static str,
    project: PathBuf,
    /// Per round: this setup's session time less the unguarded one's, over the tool calls, in
    /// ms (negative when the guarded session happened to be the faster).
    costs: Vec<f64>,
}

fn claude() -> Option<PathBuf> {
    let dir = std::env::var_os("PRX_HOOKS_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agents"));
    let program = dir.join("node_modules/.bin/claude");
    program.exists().then_some(program)
}

/// A project directory whose `.claude/settings.json` runs `pre_tool_use` (if any) as its only
/// hook.
fn project(root: &Path, name: &str, pre_tool_use: Option<Value>) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join(".claude")).unwrap();
    let mut settings = json!({"model": "claude-fake"});
    if let Some(entry) = pre_tool_use {
        settings["hooks"] = json!({ "PreToolUse": entry });
    }
    std::fs::write(
        dir.join(".claude/settings.json"),
        serde_json::to_string_pretty(&settings).unwrap(),
    )
    .unwrap();
    dir
}

/// The `PreToolUse` entry `connect claude-code` writes for a workspace holding policies.json.
fn connects_entry(root: &Path, ws: &Path) -> Value {
    let dir = root.join("connected");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(BIN)
        .args(["connect", "claude-code", "--absolute", "--workspace"])
        .arg(ws)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "connect: {out:?}");
    let text = std::fs::read_to_string(dir.join(".claude/settings.json")).unwrap();
    let settings: Value = serde_json::from_str(&text).unwrap();
    settings["hooks"]["PreToolUse"].clone()
}

/// One `claude -p` session in `project` against `model`: its wall time, from spawn to exit.
fn session(program: &Path, project: &Path, home: &Path, model: &ModelServer) -> Duration {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .args([
            "-p",
            "Run the command the model asks for.",
            "--output-format",
            "json",
        ])
        .arg("--dangerously-skip-permissions")
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", model.url())
        .env("ANTHROPIC_API_KEY", "sk-ant-fake")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .current_dir(project)
        .stdin(Stdio::null());
    if nix::unistd::geteuid().is_root() {
        // Claude Code refuses --dangerously-skip-permissions as root outside a sandbox.
        cmd.env("IS_SANDBOX", "1");
    }
    let start = Instant::now();
    let out = cmd.output().unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "claude in {}: {:?}\n{}\n{}",
        project.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let Some(program) = claude() else {
        println!(
            "guard: skipped: Claude Code is not installed in target/agents (bash .ci/install-agents)"
        );
        return;
    };
    // `cargo bench` passes --bench; `cargo test --benches` does not.
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = env_or("PRX_HOOKS_GUARD_ROUNDS", if quick { 1 } else { 7 });
    let calls = env_or("PRX_HOOKS_GUARD_CALLS", if quick { 2 } else { 10 });

    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let (ws, home) = (root.join("prx"), root.join("home"));
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new(BIN).arg("init").arg(&ws).output().unwrap();
    assert!(out.status.success(), "init: {out:?}");
    std::fs::write(ws.join("hooks.json"), r#"{"hooks": {}}"#).unwrap();
    std::fs::write(ws.join("policies.json"), POLICIES).unwrap();
    let guard = root.join("guard.py");
    std::fs::write(&guard, GUARD_PY).unwrap();
    // The interpreter itself, not a version manager's shim in front of it (pyenv's costs
    // ~300 ms a start here): the guard is measured, not the shim.
    let python = json!([{"hooks": [{"type": "command",
        "command": format!("{} {}", python3(), guard.display()), "timeout": 5}]}]);

    let mut server = common::serve(BIN, &ws);
    let mut setups = vec![
        Setup {
            name: "no guard",
            project: project(&root, "none", None),
            costs: Vec::new(),
        },
        Setup {
            name: "/bin/true hook",
            project: project(
                &root,
                "true",
                Some(
                    json!([{"hooks": [{"type": "command", "command": "/bin/true", "timeout": 5}]}]),
                ),
            ),
            costs: Vec::new(),
        },
        Setup {
            name: "prx-hooks policy",
            project: project(&root, "prx", Some(connects_entry(&root, &ws))),
            costs: Vec::new(),
        },
        Setup {
            name: "python3 guard",
            project: project(&root, "python", Some(python)),
            costs: Vec::new(),
        },
    ];

    // Both guards deny rm -rf: they do the work compared.
    for setup in &setups[2..] {
        let victim = setup.project.join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("keep"), "precious").unwrap();
        let script = Script::shell(&format!("rm -rf {}", victim.display()), "done");
        let model = ModelServer::start(Api::Anthropic, script);
        session(&program, &setup.project, &home, &model);
        assert!(
            victim.join("keep").exists(),
            "{}: the denied rm -rf ran",
            setup.name
        );
    }

    let script = Script {
        calls,
        ..Script::shell("echo hi", "done")
    };
    let model = ModelServer::start(Api::Anthropic, script);
    // One session each before timing: the first start of Claude Code reads its files cold.
    for setup in &setups {
        session(&program, &setup.project, &home, &model);
    }
    let mut bare = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut times = [Duration::ZERO; 4];
        for k in 0..setups.len() {
            let i = (round + k) % setups.len();
            times[i] = session(&program, &setups[i].project, &home, &model);
        }
        bare.push(times[0]);
        for i in 1..setups.len() {
            let cost = (times[i].as_secs_f64() - times[0].as_secs_f64()) * 1e3 / calls as f64;
            setups[i].costs.push(cost);
        }
    }
    let _ = server.kill();
    let _ = server.wait();

    println!(
        "guard: Claude Code {}, {rounds} rounds of {calls} tool calls per session",
        version(&program)
    );
    println!(
        "  {:<20} session p50 {}",
        setups[0].name,
        ms(median(bare.clone()))
    );
    let mut medians = Vec::new();
    for setup in &setups[1..] {
        let mut costs = setup.costs.clone();
        costs.sort_by(f64::total_cmp);
        let m = costs[costs.len() / 2];
        medians.push(m);
        let each: Vec<String> = setup.costs.iter().map(|c| format!("{c:.1}")).collect();
        println!(
            "  {:<20} per tool call p50 {m:.1} ms (per round: {} ms)",
            setup.name,
            each.join(" ")
        );
    }
    // medians: /bin/true hook, prx-hooks policy, python3 guard.
    let (floor, prx, python) = (medians[0], medians[1], medians[2]);
    println!(
        "  prx-hooks policy / python3 guard, against no hook: {:.2}x{}",
        prx.max(0.0) / python.max(1e-9),
        if prx <= 0.0 {
            " (no more than the sessions without a hook)"
        } else {
            ""
        }
    );
    println!(
        "  the same above the /bin/true hook (Claude Code's own cost of a command hook): {:.2}x",
        (prx - floor).max(0.0) / (python - floor).max(1e-9)
    );
}

/// The python3 the PATH finds, as the interpreter names itself (`sys.executable`).
fn python3() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn version(program: &Path) -> String {
    Command::new(program)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
