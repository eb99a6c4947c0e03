//! What every agent's session shares: finding the pinned program, a workspace whose hooks record
//! every run, a real `prx-hooks run --listen`, `connect`, running the agent (the check of what
//! arrived against the agent's table is in `table.rs`).

use crate::models::{Answer, CALL_ID, ModelServer, Request};
use crate::stderr::Lines;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_prx-hooks");
pub const SEND_BIN: &str = env!("CARGO_BIN_EXE_prx-hooks-send");

/// The command the agents' hooks and the fake models agree on, and its output.
pub const COMMAND: &str = "echo hi";
pub const COMMAND_OUTPUT: &str = "hi";
/// The model's final text.
pub const ANSWER: &str = "done: the command printed hi";
pub const PROMPT: &str = "Run `echo hi` in the shell and tell me what it printed.";

// ---------------------------------------------------------------------------------------------
// The pinned programs

/// An installed agent program at its pinned version.
pub struct Cli {
    pub program: PathBuf,
    pub version: String,
}

/// Where `.ci/install-agents` installs the programs.
pub fn agents_dir() -> PathBuf {
    std::env::var_os("PRX_HOOKS_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/agents"))
}

/// `tests/agents/versions`: (package, version, program) per line.
fn pins() -> Vec<(String, String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/versions");
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 3, "{}: {l:?}", path.display());
            (w[0].to_string(), w[1].to_string(), w[2].to_string())
        })
        .collect()
}

/// `package`'s program at its pinned version, or `None` (the first time, after one line on
/// stderr saying why) when `PRX_HOOKS_AGENTS` is `off`, or when it is not installed and `PRX_HOOKS_AGENTS` is not
/// `require`. An installed version other than the pinned one always fails.
pub fn cli(package: &str) -> Option<Cli> {
    let (_, version, program) = pins()
        .into_iter()
        .find(|(p, _, _)| p == package)
        .unwrap_or_else(|| panic!("{package} is not pinned in tests/agents/versions"));
    let mode = std::env::var("PRX_HOOKS_AGENTS").unwrap_or_default();
    let dir = agents_dir();
    // Straight to stderr, past the test harness's capture, once for the whole binary: the one
    // line a developer sees.
    let skip = |why: String| {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            let _ = writeln!(std::io::stderr(), "skipped: the agents' real CLIs: {why}");
        });
        None
    };
    if mode == "off" {
        return skip("PRX_HOOKS_AGENTS=off".into());
    }
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let program = dir.join("node_modules/.bin").join(program);
    let Ok(text) = std::fs::read_to_string(&manifest) else {
        let line = format!(
            "{package}@{version} is not installed in {}: `bash .ci/install-agents` installs the versions tests/agents/versions pins, with npm",
            dir.display()
        );
        assert!(mode != "require", "PRX_HOOKS_AGENTS=require: {line}");
        return skip(line);
    };
    let installed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        installed["version"].as_str(),
        Some(version.as_str()),
        "{} holds another version than tests/agents/versions pins: run `bash .ci/install-agents`",
        manifest.display()
    );
    // The program itself says the same version.
    let out = Command::new(&program)
        .arg("--version")
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains(&version),
        "{} --version: {said} {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(Cli { program, version })
}

// ---------------------------------------------------------------------------------------------
// The workspace, the agent's project and its home

/// A temporary tree: the prx-hooks workspace (`init`, then hooks recording every run), the
/// agent's project (its working directory), its `HOME`, and where the records go.
pub struct Setup {
    _root: tempfile::TempDir,
    pub ws: PathBuf,
    pub project: PathBuf,
    pub home: PathBuf,
    records: PathBuf,
    raw: PathBuf,
    logs: PathBuf,
}

impl Setup {
    pub fn new() -> Setup {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().canonicalize().unwrap();
        // The workspace inside the project, so that what `connect` writes there names no path
        // of this machine.
        let (project, home) = (base.join("project"), base.join("home"));
        let ws = project.join("prx");
        let (records, raw, logs) = (base.join("records"), base.join("raw"), base.join("logs"));
        for d in [&project, &home, &records, &raw, &logs] {
            std::fs::create_dir_all(d).unwrap();
        }
        let out = Command::new(BIN).arg("init").arg(&ws).output().unwrap();
        assert!(out.status.success(), "init: {out:?}");
        // One hook per lifecycle event, each run leaving a directory with its payload (stdin)
        // and its ZERO_HOOK_* variables.
        let mut hooks = serde_json::Map::new();
        for kind in prx_hooks::EventKind::ALL {
            let script = format!(
                "d=$(mktemp -d '{}/{}.XXXXXX') && cat > \"$d/payload\" && env -0 | grep -z '^ZERO_HOOK_' > \"$d/env\"",
                records.display(),
                kind.name()
            );
            hooks.insert(
                kind.name().into(),
                serde_json::json!([{"command": "/bin/sh", "args": ["-c", script], "stdin_json": true}]),
            );
        }
        let text = serde_json::to_string_pretty(&serde_json::json!({ "hooks": hooks })).unwrap();
        std::fs::write(ws.join("hooks.json"), text).unwrap();
        Setup {
            _root: root,
            ws,
            project,
            home,
            records,
            raw,
            logs,
        }
    }

    /// `$CODEX_HOME` (under the temporary home).
    pub fn codex_home(&self) -> PathBuf {
        self.home.join(".codex")
    }

    /// `prx-hooks ARGS` in the project, with the temporary `HOME` and `CODEX_HOME`.
    pub fn prx(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .current_dir(&self.project)
            .env("PATH", path())
            .env("HOME", &self.home)
            .env("CODEX_HOME", self.codex_home())
            .env_remove("PRX_HOOKS_TOKEN")
            .output()
            .unwrap()
    }

    /// `prx-hooks connect AGENT --workspace WS ARGS` (or `--remove`); fails the test unless it
    /// exits 0.
    pub fn connect(&self, agent: &str, args: &[&str]) {
        let ws = self.ws.to_str().unwrap();
        let mut all = vec!["connect", agent];
        all.extend(args);
        if !args.contains(&"--remove") {
            all.extend(["--workspace", ws]);
        }
        let out = self.prx(&all);
        assert!(
            out.status.success(),
            "connect {agent} {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A shell command for the agent's settings, as a user's own hook: it records the JSON the
    /// agent sent on stdin, with the time (ns) it ran, and prints nothing.
    pub fn users_own_hook(&self) -> String {
        format!(
            "f=$(mktemp '{}/raw.XXXXXX') && {{ date +%s%N; cat; }} > \"$f\"",
            self.raw.display()
        )
    }

    /// What the agent sent to the user's own hook, in the order it ran.
    pub fn raws(&self) -> Vec<Raw> {
        let mut raws: Vec<Raw> = std::fs::read_dir(&self.raw)
            .unwrap()
            .map(|e| {
                let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
                let (t, json) = text.split_once('\n').unwrap();
                let object: Value = serde_json::from_str(json)
                    .unwrap_or_else(|e| panic!("the agent sent {json:?}: {e}"));
                Raw {
                    name: object["hook_event_name"].as_str().unwrap().to_string(),
                    at_ns: t.trim().parse().unwrap(),
                    object: Some(object),
                }
            })
            .collect();
        raws.sort_by_key(|r| r.at_ns);
        raws
    }

    /// Every hook run so far.
    pub fn records(&self) -> Vec<Record> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.records).unwrap() {
            let dir = e.unwrap().path();
            let (Ok(payload), Ok(env)) = (
                std::fs::read_to_string(dir.join("payload")),
                std::fs::read(dir.join("env")),
            ) else {
                continue; // still being written
            };
            let env: BTreeMap<String, String> = env
                .split(|&b| b == 0)
                .filter(|v| !v.is_empty())
                .map(|v| {
                    let v = String::from_utf8_lossy(v);
                    let (k, v) = v.split_once('=').unwrap();
                    (k.to_string(), v.to_string())
                })
                .collect();
            if !env.contains_key("ZERO_HOOK_SEQ") {
                continue; // env not written yet
            }
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            out.push(Record {
                hook_event: name.split('.').next().unwrap().to_string(),
                payload: serde_json::from_str(&payload)
                    .unwrap_or_else(|e| panic!("{}: {payload:?}: {e}", dir.display())),
                payload_text: payload,
                env,
            });
        }
        out.sort_by_key(|r| r.seq());
        out
    }

    /// The files the agent's stdout and stderr go to.
    fn log(&self, name: &str) -> PathBuf {
        self.logs.join(name)
    }

    /// The agent's event names in the spool's entries (what `send` kept while no server
    /// answered), sorted; waits (10 s at most) until there are `n`, for senders still writing.
    pub fn spooled(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let names = self.spool_names();
            if names.len() >= n || Instant::now() > deadline {
                return names;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn spool_names(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.ws.join(".prx-hooks/spool")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "spool"))
            .map(|p| {
                // A header line, then the agent's object.
                let text = std::fs::read_to_string(&p).unwrap();
                let (_, body) = text.split_once('\n').unwrap();
                let object: Value = serde_json::from_str(body)
                    .unwrap_or_else(|e| panic!("{}: {e}: {body:?}", p.display()));
                source_name(&serde_json::json!({ "payload": object }))
                    .unwrap_or("?")
                    .to_string()
            })
            .collect();
        names.sort();
        names
    }

    /// Each event the agent sent left one entry in the spool (its hooks found no server), and
    /// no hook ran.
    pub fn spooled_each(&self, cli: &Cli, raws: &[Raw]) {
        let mut sent: Vec<String> = raws.iter().map(|r| r.name.clone()).collect();
        sent.sort();
        assert_eq!(
            self.spooled(raws.len()),
            sent,
            "one spool entry per event {} {} sent",
            cli.program.display(),
            cli.version
        );
        assert!(self.records().is_empty());
    }

    /// Runs the agent: `cmd` with only the environment it was given (plus `PATH`, this
    /// build's programs first, and the temporary `HOME`), in the project, stdin closed. Its output goes to files; it is killed (its whole
    /// process group) after `limit`, which fails the test.
    pub fn run_agent(&self, name: &str, mut cmd: Command, limit: Duration) -> AgentRun {
        use std::os::unix::process::CommandExt;
        let (out_path, err_path) = (
            self.log(&format!("{name}.out")),
            self.log(&format!("{name}.err")),
        );
        // Only what is given: no proxy, key or setting of the machine's reaches the agent.
        for (k, _) in std::env::vars_os() {
            if !cmd.get_envs().any(|(set, _)| set == k) {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .current_dir(&self.project)
            .env("PATH", path())
            .env("HOME", &self.home)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() > deadline {
                let pg = nix::unistd::Pid::from_raw(-(child.id() as i32));
                let _ = nix::sys::signal::kill(pg, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let run = AgentRun {
            code: status.and_then(|s| s.code()),
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        };
        assert!(
            status.is_some(),
            "{name} did not finish within {limit:?}: {}",
            run.show()
        );
        assert_eq!(run.code, Some(0), "{name}: {}", run.show());
        run
    }
}

/// The events one session of the pinned version sends, in order, each with the members of its
/// object: what a new version must still send for its table to hold. A version that sends
/// another event, leaves one out or adds, drops or renames a member fails here, with the
/// session as it went, to be pasted once the table says what the new version's events become.
pub fn sent_as_pinned(cli: &Cli, raws: &[Raw], pinned: &[(&str, &[&str])]) {
    let got: Vec<(String, Vec<String>)> = raws
        .iter()
        .map(|r| {
            let mut keys: Vec<String> = r
                .object
                .as_ref()
                .and_then(Value::as_object)
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            keys.sort();
            (r.name.clone(), keys)
        })
        .collect();
    let want: Vec<(String, Vec<String>)> = pinned
        .iter()
        .map(|(name, keys)| {
            let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
            keys.sort();
            (name.to_string(), keys)
        })
        .collect();
    let literal = got
        .iter()
        .map(|(n, k)| format!("    (\"{n}\", &{k:?}),"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        got == want,
        "{} {} sent other events, or other members, than the table was checked against:\n{literal}",
        cli.program.display(),
        cli.version
    );
}

/// The events the agent sent in its one session, as the pinned version sends them
/// ([`sent_as_pinned`]), and the session's id, which every one of them carries.
pub fn one_session(s: &Setup, cli: &Cli, pinned: &[(&str, &[&str])]) -> (Vec<Raw>, String) {
    let raws = s.raws();
    sent_as_pinned(cli, &raws, pinned);
    let session = raws[0].object.as_ref().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    of_one_session(&raws, &session);
    (raws, session)
}

/// Every event the agent sent carries `session` as its `session_id`.
pub fn of_one_session(raws: &[Raw], session: &str) {
    for r in raws {
        assert_eq!(r.object.as_ref().unwrap()["session_id"], session, "{r:?}");
    }
}

/// Every event `agent`'s documentation lists, by the name its settings give it.
pub fn documented(agent: prx_hooks::agents::Agent) -> Vec<&'static str> {
    agent.hook_events().iter().map(|e| e.name).collect()
}

/// `hooks` for an agent's settings: `entry` (a JSON array of groups or of hooks) on each of
/// `events`.
pub fn on_every_event<'a>(
    events: impl IntoIterator<Item = &'a str>,
    entry: &Value,
) -> serde_json::Map<String, Value> {
    events
        .into_iter()
        .map(|e| (e.to_string(), entry.clone()))
        .collect()
}

/// The model was asked for the tool call, then (with the tool's result) for the answer: that
/// second request.
pub fn tool_round_trip(model: &ModelServer) -> Request {
    let reqs = model.requests();
    let call = reqs
        .iter()
        .position(|r| r.answer == Answer::ToolCall)
        .unwrap_or_else(|| panic!("no tool call asked:\n{}", model.summary()));
    reqs[call + 1..]
        .iter()
        .find(|r| r.answer == Answer::Text)
        .cloned()
        .unwrap_or_else(|| panic!("no answer after the tool call:\n{}", model.summary()))
}

/// [`tool_round_trip`] over the Chat Completions API: the answer was asked with the tool's
/// message for the call, holding the command's output, and the agent sent the key `sk-fake`.
pub fn chat_tool_result(model: &ModelServer) {
    let answered = tool_round_trip(model);
    let result = answered.body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "tool"))
        .unwrap_or_else(|| panic!("no tool message in {}", answered.body));
    assert_eq!(result["tool_call_id"], CALL_ID);
    assert!(result.to_string().contains(COMMAND_OUTPUT), "{result}");
    assert_eq!(answered.header("authorization"), Some("Bearer sk-fake"));
}

/// `PATH` with the directory of this build's `prx-hooks` and `prx-hooks-send` first, as for a
/// user who installed them.
pub fn path() -> std::ffi::OsString {
    let bin = Path::new(BIN).parent().unwrap().to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&rest))).unwrap()
}

/// What the agent's run printed.
pub struct AgentRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl AgentRun {
    pub fn show(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// An event as the agent sent it to the user's own hook (or, for Codex's `notify`, only its
/// name: nothing else sees it).
#[derive(Clone, Debug)]
pub struct Raw {
    pub name: String,
    pub at_ns: u128,
    pub object: Option<Value>,
}

/// One run of a workspace hook: the payload it read and its `ZERO_HOOK_*` variables.
#[derive(Clone, Debug)]
pub struct Record {
    /// The event the hook is for (its directory's name).
    pub hook_event: String,
    pub payload: Value,
    pub payload_text: String,
    pub env: BTreeMap<String, String>,
}

impl Record {
    pub fn seq(&self) -> u64 {
        self.env["ZERO_HOOK_SEQ"].parse().unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// The server and the live stream

/// A running `prx-hooks run --workspace WS --listen 127.0.0.1:0`.
pub struct Server {
    child: Child,
    lines: Lines,
}

impl Server {
    pub fn start(ws: &Path) -> Server {
        Server::start_with(ws, &[])
    }

    /// [`Server::start`] with more of `run`'s flags (`--otlp URL`).
    pub fn start_with(ws: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .args(["run", "--workspace"])
            .arg(ws)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("PRX_HOOKS_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = Lines::of(&mut child);
        lines.find("HTTP API on ");
        Server { child, lines }
    }

    /// SIGTERM; fails unless it exits 0. Its final report (stderr's last JSON line).
    pub fn stop(mut self) -> Value {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        let all = self.lines.all();
        assert_eq!(status.code(), Some(0), "run: {}", all.join("\n"));
        all.iter()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or(Value::Null)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The server's final report: every hook it was sent ran and exited 0, and it dropped no event.
pub fn hooks_all_ran(report: &Value) {
    let totals = &report["stats"]["shell"]["totals"];
    assert!(totals["sent"].as_u64().is_some_and(|n| n > 0), "{report}");
    assert_eq!(totals["ok"], totals["sent"], "{report}");
    for k in [
        "exit",
        "signal",
        "killed",
        "timed_out",
        "spawn_failed",
        "dropped",
    ] {
        assert_eq!(totals[k], 0, "shell.totals.{k}: {report}");
    }
    assert_eq!(report["stats"]["dropped"], 0, "{report}");
}

/// `prx-hooks tail --json --last N` on the workspace: its lines (bus messages) as they come.
pub struct Tail {
    child: Child,
    rx: mpsc::Receiver<String>,
    /// Every line so far.
    pub lines: Vec<String>,
}

impl Tail {
    pub fn start(ws: &Path, last: usize) -> Tail {
        let mut child = Command::new(BIN)
            .args(["tail", "--json", "--last", &last.to_string(), "--workspace"])
            .arg(ws)
            .env_remove("PRX_HOOKS_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Tail {
            child,
            rx,
            lines: Vec::new(),
        }
    }

    /// Takes what has come so far.
    pub fn poll(&mut self) {
        while let Ok(l) = self.rx.try_recv() {
            self.lines.push(l);
        }
    }

    /// Waits (30 s at most) until `n` lines came.
    pub fn wait_for(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.lines.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) => self.lines.push(l),
                Err(_) => panic!(
                    "tail showed {} of {n} lines:\n{}",
                    self.lines.len(),
                    self.lines.join("\n")
                ),
            }
        }
    }

    /// The bus messages so far, parsed.
    pub fn messages(&self) -> Vec<Value> {
        self.lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("tail: {l:?}: {e}")))
            .collect()
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every event the agent sent shows on the bus (at least one message each) and
/// every lifecycle message has run its hook, and nothing more came for half a second.
pub fn settle(setup: &Setup, tail: &mut Tail, raws: &[Raw]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut quiet_since: Option<(Instant, usize, usize)> = None;
    loop {
        tail.poll();
        let messages = tail.messages();
        let lifecycle = messages.iter().filter(|m| is_lifecycle(m)).count();
        let records = setup.records().len();
        let covered = raws.iter().all(|r| {
            messages
                .iter()
                .any(|m| source_name(m) == Some(r.name.as_str()))
        });
        if covered && records == lifecycle {
            match quiet_since {
                Some((t, m, r)) if m == messages.len() && r == records => {
                    if t.elapsed() >= Duration::from_millis(500) {
                        return;
                    }
                }
                _ => quiet_since = Some((Instant::now(), messages.len(), records)),
            }
        } else {
            quiet_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after the session: {} event(s) the agent sent, {} bus message(s), {lifecycle} lifecycle, {records} hook run(s)\nsent: {:?}\nbus:\n{}",
            raws.len(),
            messages.len(),
            raws.iter().map(|r| &r.name).collect::<Vec<_>>(),
            tail.lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `prx-hooks tail --json --last N`, with N what the live stream showed: the same lines, and no
/// more.
pub fn tail_last_shows_the_same(ws: &Path, live: &[String]) {
    let mut again = Tail::start(ws, live.len());
    again.wait_for(live.len());
    std::thread::sleep(Duration::from_millis(500));
    again.poll();
    assert_eq!(again.lines, live, "tail --last {}", live.len());
}

pub fn is_lifecycle(m: &Value) -> bool {
    m["topic"]
        .as_str()
        .is_some_and(|t| t.starts_with("prx.lifecycle."))
}

/// The agent's name for the event a bus message came from (its `hook_event_name`, or Codex
/// notify's `type`).
pub fn source_name(m: &Value) -> Option<&str> {
    let p = &m["payload"];
    p["hook_event_name"]
        .as_str()
        .or_else(|| p["type"].as_str())
        .or_else(|| p["agent_hook_event_name"].as_str())
}

// ---------------------------------------------------------------------------------------------
// Policies (docs/policies.md § Doors)

/// The rule set docs/policies.md opens with, as written.
pub const NO_RM_RF: &str = r#"{"policies": [
  {"id": "no-rm-rf", "on": ["tool_call_start"], "matcher": "Bash|shell|run_shell_command|exec_command",
   "when": {"arguments.command": {"regex": "\\brm\\s+-[a-zA-Z]*[rf]"}},
   "decision": "deny", "reason": "rm -rf is not allowed in this workspace"}
]}"#;

/// A workspace with the rule, and a victim directory holding one file.
pub fn guarded() -> (Setup, PathBuf) {
    let s = Setup::new();
    std::fs::write(s.ws.join("policies.json"), NO_RM_RF).unwrap();
    let victim = s.project.join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep"), "precious").unwrap();
    (s, victim)
}

/// The model's one tool call: `rm -rf VICTIM`.
pub fn rm_rf(victim: &Path) -> crate::models::Script {
    crate::models::Script::shell(&format!("rm -rf {}", victim.display()), ANSWER)
}

/// The body of the model request that followed the first tool call (what the tool's result
/// told the model), for the policy tests.
pub fn request_after_tool_call(model: &ModelServer) -> Value {
    let reqs = model.requests();
    let call = reqs
        .iter()
        .position(|r| r.answer == Answer::ToolCall)
        .unwrap_or_else(|| panic!("no tool call asked:\n{}", model.summary()));
    reqs[call + 1..]
        .iter()
        .find(|r| r.answer == Answer::Text)
        .unwrap_or_else(|| panic!("no request after the tool call:\n{}", model.summary()))
        .body
        .clone()
}

/// Whether the model was ever asked for a tool call (a run denied at its prompt never is).
pub fn asked_a_tool_call(model: &ModelServer) -> bool {
    model
        .requests()
        .iter()
        .any(|r| r.answer == Answer::ToolCall)
}
