//! `prx-hooks run --listen` as a real process: the token (generated, from a file, from the
//! environment), the API beside NDJSON ingestion, the audit warning, and SIGTERM draining.

use crate::stderr::Lines;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `prx-hooks run --listen`, its stderr collected line by line.
struct Daemon {
    child: Child,
    lines: Lines,
}

impl Daemon {
    fn start(ws: &Path, extra: &[&str], env_token: Option<&str>) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
        cmd.args(["run", "--workspace"])
            .arg(ws)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra);
        Daemon::spawn(cmd, env_token)
    }

    /// Runs `cmd` (a `prx-hooks run …`, possibly behind a wrapper) with stderr collected.
    fn spawn(mut cmd: Command, env_token: Option<&str>) -> Daemon {
        cmd.env("RUST_LOG", "warn")
            .env_remove("PRX_HOOKS_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(t) = env_token {
            cmd.env("PRX_HOOKS_TOKEN", t);
        }
        let mut child = cmd.spawn().unwrap();
        let lines = Lines::of(&mut child);
        Daemon { child, lines }
    }

    /// Waits for a stderr line containing `needle`; returns it.
    fn wait_line(&mut self, needle: &str) -> String {
        self.lines.find(needle)
    }

    fn base(&mut self) -> String {
        let line = self.wait_line("HTTP API on ");
        line.rsplit(' ').next().unwrap().to_string()
    }

    /// SIGTERM, then the exit status and the rest of stderr.
    fn terminate(mut self) -> (i32, Vec<String>) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = self.child.wait().unwrap();
        (status.code().unwrap_or(-1), self.lines.all())
    }
}

impl Drop for Daemon {
    /// A failed test does not leave its daemon behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn get(base: &str, path: &str, token: &str) -> (u16, Value) {
    let mut r = agent()
        .get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {token}"))
        .call()
        .unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

#[test]
fn run_listen_generates_a_token_serves_the_api_beside_ndjson_and_drains_on_sigterm() {
    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let events = ws.path().join("events.ndjson");
    std::fs::write(
        &events,
        r#"{"event":"agent_start","agent":"a","session":"s","payload":{"agent":"a","session":"s"}}
"#,
    )
    .unwrap();
    let events_arg = events.to_str().unwrap().to_string();
    let mut d = Daemon::start(ws.path(), &["--events", &events_arg], None);
    let base = d.base();
    let announced = d.wait_line("API token generated into");
    let token_file = ws.path().join(".prx-hooks/token");
    assert!(
        announced.contains(token_file.to_str().unwrap()),
        "{announced}"
    );
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(token.len(), 64);

    // The input ended, but with --listen the daemon keeps serving.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, stats) = get(&base, "/api/stats", &token);
        assert_eq!(status, 200);
        if stats["emitted"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the NDJSON event never arrived: {stats}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&base, "/api/hooks", "wrong-token-0123456789").0, 401);

    // A hook created over HTTP runs a real process for the next event, and the creation is
    // logged at warn with who and what.
    let script = format!("echo fired >> {}", log.display());
    let body = json!({"id": "made-by-api", "event": "agent_end", "command": "/bin/sh", "args": ["-c", script]});
    let mut r = agent()
        .post(format!("{base}/api/hooks"))
        .header("authorization", format!("Bearer {token}"))
        .content_type("application/json")
        .send(body.to_string())
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        201,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    let warned = d.wait_line("created through the API by 127.0.0.1:");
    assert!(
        warned.contains("WARN") && warned.contains("made-by-api") && warned.contains("/bin/sh"),
        "{warned}"
    );
    let mut r = agent()
        .post(format!("{base}/api/hooks/made-by-api/test"))
        .header("authorization", format!("Bearer {token}"))
        .send_empty()
        .unwrap();
    let out: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(out["outcome"], "ok", "{out}");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "fired\n");

    let (code, rest) = d.terminate();
    assert_eq!(code, 0, "{}", rest.join("\n"));
    let report: Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(report["stats"]["config"]["actions"], 1);

    // A restart reuses the token file, so clients keep working.
    let mut d = Daemon::start(ws.path(), &[], None);
    let base = d.base();
    assert!(
        d.wait_line("API token read from")
            .contains(".prx-hooks/token")
    );
    assert_eq!(get(&base, "/api/hooks/made-by-api", &token).0, 200);
    assert_eq!(d.terminate().0, 0);
}

#[test]
fn token_file_beats_the_environment_which_beats_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let file = ws.path().join("my-token");
    std::fs::write(&file, "token-from-the-file-000000\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file_arg = file.to_str().unwrap().to_string();

    let mut d = Daemon::start(
        ws.path(),
        &["--token-file", &file_arg],
        Some("token-from-the-env-00000000"),
    );
    let base = d.base();
    assert_eq!(
        get(&base, "/api/hooks", "token-from-the-file-000000").0,
        200
    );
    assert_eq!(
        get(&base, "/api/hooks", "token-from-the-env-00000000").0,
        401
    );
    assert_eq!(d.terminate().0, 0);

    let mut d = Daemon::start(ws.path(), &[], Some("token-from-the-env-00000000"));
    let base = d.base();
    assert!(
        d.wait_line("API token read from $PRX_HOOKS_TOKEN")
            .contains("PRX_HOOKS_TOKEN")
    );
    assert_eq!(
        get(&base, "/api/hooks", "token-from-the-env-00000000").0,
        200
    );
    assert_eq!(d.terminate().0, 0);
    assert!(
        !ws.path().join(".prx-hooks/token").exists(),
        "nothing generated"
    );
}

#[test]
fn bad_tokens_and_addresses_are_refused_before_serving() {
    let ws = tempfile::tempdir().unwrap();
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
        cmd.args(["run", "--workspace"])
            .arg(ws.path())
            .args(args)
            .env_remove("PRX_HOOKS_TOKEN");
        if let Some(t) = env {
            cmd.env("PRX_HOOKS_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--listen", "127.0.0.1:0"], Some("short"));
    assert_eq!(code, Some(2));
    assert!(
        err.contains("PRX_HOOKS_TOKEN") && err.contains("at least 16"),
        "{err}"
    );

    let open = ws.path().join("open-token");
    std::fs::write(&open, "0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, err) = run(
        &[
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            open.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("chmod 600"), "{err}");

    let (code, err) = run(
        &["--listen", "nowhere"],
        Some("token-from-the-env-00000000"),
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("expected IP:PORT"), "{err}");

    // A taken port.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = run(&["--listen", &addr], Some("token-from-the-env-00000000"));
    assert_eq!(code, Some(2));
    assert!(err.contains(&addr) && err.contains("in use"), "{err}");
    assert!(
        err.contains("listen elsewhere"),
        "no way out is said: {err}"
    );

    // --token-file needs --listen.
    let (code, err) = run(&["--token-file", "x"], None);
    assert_eq!(code, Some(2));
    assert!(err.contains("--listen"), "{err}");
}

#[test]
fn run_says_once_where_the_console_is_and_what_to_sign_in_with() {
    let ws = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(ws.path(), &[], None);
    let base = d.base();
    let line = d.wait_line("console on ");
    let token_file = ws.path().join(".prx-hooks/token");
    assert!(
        line.contains(&format!("console on {base}/"))
            && line.contains(&token_file.display().to_string()),
        "{line}"
    );
    // The address said is the console's: the page answers there.
    let page = agent().get(&format!("{base}/")).call().unwrap();
    assert_eq!(page.status(), 200);
    let (_, rest) = d.terminate();
    let said = rest.iter().filter(|l| l.contains("console on")).count();
    assert_eq!(said, 1, "{rest:?}");

    let mut d = Daemon::start(ws.path(), &[], Some("token-from-the-env-00000000"));
    let line = d.wait_line("console on ");
    assert!(line.contains("$PRX_HOOKS_TOKEN"), "{line}");
}

#[test]
fn a_missing_workspace_says_how_to_make_one() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("ws");
    let out = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["run", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(&missing)
        .env_remove("PRX_HOOKS_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("prx-hooks init {}", missing.display())),
        "{err}"
    );
    assert!(
        !missing.exists(),
        "run made the workspace it said was missing"
    );
}

/// README's "Connect an agent" section, followed as written on a fresh machine: its commands
/// run in order in an empty project directory (`prx-hooks` found on PATH, a home of its own),
/// the console line it shows is the one `run` prints, and the settings file `connect` writes
/// delivers a Claude Code event to the server it started, spooling nothing.
#[test]
fn readmes_connect_steps_work_in_order_on_a_fresh_machine() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = &readme[readme
        .find("## Connect an agent")
        .expect("README has a Connect section")..];
    let block = |fence: &str| -> Vec<String> {
        let start = section.find(fence).expect(fence) + fence.len();
        let end = start + section[start..].find("\n```").unwrap();
        section[start..end]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    };
    let commands = block("```sh\n");
    let shown = block("```text\n");
    assert_eq!(shown.len(), 1, "{shown:?}");

    let fresh = tempfile::tempdir().unwrap();
    let project = fresh.path().join("project");
    let home = fresh.path().join("home");
    std::fs::create_dir(&project).unwrap();
    std::fs::create_dir(&home).unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_prx-hooks")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let command = |words: &[&str]| {
        let mut c = Command::new(words[0]);
        c.args(&words[1..])
            .current_dir(&project)
            .env("HOME", &home)
            .env("PATH", &path)
            .env_remove("PRX_HOOKS_TOKEN")
            .env_remove("CLAUDE_PROJECT_DIR");
        c
    };
    let mut server: Option<(Child, Lines)> = None;
    for line in &commands {
        let line = line.split(" #").next().unwrap().trim();
        let (line, background) = match line.strip_suffix('&') {
            Some(l) => (l.trim(), true),
            None => (line, false),
        };
        let line = line.replace("127.0.0.1:7878", "127.0.0.1:0");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "prx-hooks", "{line}");
        if background {
            let mut child = command(&words)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = Lines::of(&mut child);
            let api = lines.find("HTTP API on ");
            let addr = api.rsplit(' ').next().unwrap().to_string();
            let console = lines.find("console on ");
            assert_eq!(
                console,
                shown[0].replace("http://127.0.0.1:7878", &addr),
                "README shows another console line than `{line}` prints"
            );
            server = Some((child, lines));
        } else {
            let out = command(&words).output().unwrap();
            assert!(
                out.status.success(),
                "`{line}` failed in a fresh project: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let (mut child, _lines) = server.expect("README starts a server");

    // What Claude Code runs at the end of a turn, as it runs it (the project's root as cwd
    // and CLAUDE_PROJECT_DIR).
    let settings: Value = serde_json::from_slice(
        &std::fs::read(project.join(".claude/settings.json")).expect("connect wrote the file"),
    )
    .unwrap();
    let stop = settings["hooks"]["Stop"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap_or_else(|| panic!("no Stop entry: {settings}"))
        .to_string();
    let mut entry = command(&["/bin/sh", "-c", &stop]);
    entry
        .env("CLAUDE_PROJECT_DIR", &project)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut hook = entry.spawn().unwrap();
    use std::io::Write as _;
    hook.stdin
        .take()
        .unwrap()
        .write_all(
            br#"{"session_id":"readme-1","hook_event_name":"Stop","stop_hook_active":false}"#,
        )
        .unwrap();
    let out = hook.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{stop}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spool = project.join("prx/.prx-hooks/spool");
    let spooled = std::fs::read_dir(&spool)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".spool"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(spooled, 0, "the event was spooled, not delivered");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// A hook's runs outlive `prx-hooks run`: kept in `.prx-hooks/runs.ndjson` (mode 0600), they
/// are in the API's (and so the console's) run history of the next `run` before any event.
#[test]
fn a_hooks_runs_are_kept_across_a_restart_of_run() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = json!({"hooks": {"tool_call": [{"id": "audit", "command": "/bin/true"}]}});
    std::fs::write(ws.path().join("hooks.json"), hooks.to_string()).unwrap();
    let runs = |base: &str| {
        let (status, body) = get(base, "/api/hooks/audit/runs", TOKEN);
        assert_eq!(status, 200, "{body}");
        body["runs"].as_array().cloned().unwrap_or_default()
    };
    let mut d = Daemon::start(ws.path(), &[], Some(TOKEN));
    let base = d.base();
    let (status, report) = post(
        &base,
        "/api/events",
        "application/x-ndjson",
        tool_call_line("kept").as_bytes(),
    );
    assert_eq!(status, 200, "{report}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while runs(&base).is_empty() {
        assert!(Instant::now() < deadline, "the hook never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, rest) = d.terminate();
    assert_eq!(code, 0, "{}", rest.join("\n"));
    let file = ws.path().join(".prx-hooks/runs.ndjson");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let mut d = Daemon::start(ws.path(), &[], Some(TOKEN));
    let base = d.base();
    let kept = runs(&base);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0]["outcome"], json!("ok"), "{kept:?}");
    let (code, _) = d.terminate();
    assert_eq!(code, 0);
}

/// `POST /api/events` with `Prx-Event-Id: <id>` (line `n` is `<id>-<n>`): the answer's JSON.
fn post_with_id(base: &str, id: &str, body: &str) -> Value {
    let mut r = agent()
        .post(format!("{base}/api/events"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("prx-event-id", id)
        .content_type("application/x-ndjson")
        .send(body.as_bytes())
        .unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    assert_eq!(r.status().as_u16(), 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// The ids of events that ran are remembered on disk, bounded: after 140,000 of them a real
/// `run` holds at most two files of 65,536 records, and the next `run` of the workspace still
/// knows the newest (sent again: a duplicate, not run) and has forgotten the oldest (run).
#[test]
fn event_ids_are_remembered_on_disk_across_a_restart_and_bounded() {
    const BATCHES: usize = 14;
    const PER_BATCH: usize = 10_000;
    let ws = tempfile::tempdir().unwrap();
    let body = |n: usize| -> String { (0..n).map(|i| tool_call_line(&i.to_string())).collect() };
    let mut d = Daemon::start(ws.path(), &["--print"], Some(TOKEN));
    let base = d.base();
    let batch = body(PER_BATCH);
    for b in 0..BATCHES {
        let answer = post_with_id(&base, &format!("b{b}"), &batch);
        assert_eq!(answer["queued"], json!(PER_BATCH), "{answer}");
    }
    let (code, rest) = d.terminate();
    assert_eq!(code, 0, "{}", rest.join("\n"));
    let report: Value = rest
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    let ids = &report["stats"]["event_ids"];
    assert!(ids["remembered"].as_u64().unwrap() <= 2 * 65_536, "{ids}");
    let files: Vec<u64> = std::fs::read_dir(ws.path().join(".prx-hooks"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("seen-ids-"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files.iter().all(|&len| len <= 65_536 * 16), "{files:?}");

    let mut d = Daemon::start(ws.path(), &["--print"], Some(TOKEN));
    let base = d.base();
    let newest = post_with_id(&base, &format!("b{}", BATCHES - 1), &body(PER_BATCH));
    assert_eq!(
        (&newest["queued"], &newest["duplicates"]),
        (&json!(0), &json!(PER_BATCH)),
        "the newest ids are remembered: {newest}"
    );
    let oldest = post_with_id(&base, "b0", &body(1));
    // `duplicates` is left out of the answer when 0.
    assert_eq!(
        (&oldest["queued"], oldest.get("duplicates")),
        (&json!(1), None),
        "the oldest id is forgotten: {oldest}"
    );
    let (code, _) = d.terminate();
    assert_eq!(code, 0);
}

/// The kept runs are bounded: 1,200 hook runs through a real `run`, and the next `run` of the
/// workspace reads back the last 1,000 (the file under 16 MiB, mode 0600).
#[test]
fn the_runs_kept_across_a_restart_are_the_last_thousand() {
    let ws = tempfile::tempdir().unwrap();
    let hooks = json!({"hooks": {"tool_call": [{"id": "audit", "command": "/bin/true"}]}});
    std::fs::write(ws.path().join("hooks.json"), hooks.to_string()).unwrap();
    let events = ws.path().join("events.ndjson");
    let lines: String = (0..1_200).map(|i| tool_call_line(&i.to_string())).collect();
    std::fs::write(&events, lines).unwrap();
    let run = |events: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
            .args(["run", "--workspace"])
            .arg(ws.path())
            .arg("--events")
            .arg(events)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        let report: Value = err
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        report["stats"]["shell"]["run_log"].clone()
    };
    let first = run(&events);
    assert_eq!(first["written"], json!(1_200), "{first}");
    let file = ws.path().join(".prx-hooks/runs.ndjson");
    let meta = std::fs::metadata(&file).unwrap();
    assert!(meta.len() <= 16 << 20, "{}", meta.len());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let empty = ws.path().join("none.ndjson");
    std::fs::write(&empty, "").unwrap();
    let second = run(&empty);
    assert_eq!(second["loaded"], json!(1_000), "{second}");
}

use crate::support;

const TOKEN: &str = "token-for-the-cli-tests-0000";

/// One NDJSON tool_call line whose output is `tag`.
fn tool_call_line(tag: &str) -> String {
    format!(
        "{{\"event\":\"tool_call\",\"agent\":\"a\",\"session\":\"s\",\"payload\":{{\"tool\":\"t\",\"success\":true,\"output\":\"{tag}\"}}}}\n"
    )
}

/// The status of a GET, or `None` when the connection failed (refused, reset, timed out).
fn try_status(base: &str, path: &str) -> Option<u16> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    agent
        .get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .call()
        .ok()
        .map(|r| r.status().as_u16())
}

#[test]
fn a_flood_of_half_sent_requests_under_nofile_1024_leaves_hooks_running_and_the_api_serving() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    // This process holds the 1,100 client sockets: raise its own soft limit.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 4096,
        "the test needs room for 1,100 sockets (hard limit {hard})"
    );

    let ws = tempfile::tempdir().unwrap();
    let log = ws.path().join("log");
    let hooks = json!({"hooks": {"tool_call": [{
        "command": "/bin/sh", "args": support::append_args("ran", &log), "stdin_json": true
    }]}});
    std::fs::write(ws.path().join("hooks.json"), hooks.to_string()).unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.args(["--nofile=1024", "--"])
        .arg(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--listen", "127.0.0.1:0", "--events", "-"])
        .stdin(Stdio::piped());
    let mut d = Daemon::spawn(cmd, Some(TOKEN));
    let mut events = d.child.stdin.take().unwrap();
    let base = d.base();
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    events
        .write_all(tool_call_line("before").as_bytes())
        .unwrap();
    support::wait_for("the hook before the flood", || {
        support::lines(&log).iter().any(|l| l.contains("before"))
    });

    let flood_started = Instant::now();
    let mut held = Vec::new();
    for _ in 0..1100 {
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
            let _ = s.write_all(b"GET /api/hooks HTTP/1.1\r\nHost: 127.0.0.1\r\n");
            held.push(s);
        }
    }
    // While the flood is held, hooks keep spawning.
    events
        .write_all(tool_call_line("during").as_bytes())
        .unwrap();
    support::wait_for("the hook during the flood", || {
        support::lines(&log).iter().any(|l| l.contains("during"))
    });
    // The token holder is served while the flood holds every place: its connection takes
    // the place of the oldest one without the token, long before the header timeout (10 s)
    // would free one.
    let flood_held = Instant::now();
    let deadline = flood_started + Duration::from_secs(90);
    while try_status(&base, "/api/hooks") != Some(200) {
        assert!(
            Instant::now() < deadline,
            "the API still does not answer {:?} after the flood began",
            flood_started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        flood_held.elapsed() < Duration::from_secs(8),
        "the token holder waited {:?} for a place",
        flood_held.elapsed()
    );
    assert_eq!(try_status(&base, "/healthz"), Some(200));
    // The cap left room for the hooks, made room by closing the oldest flood connections,
    // and the header timeout closed the rest.
    let (_, stats) = get(&base, "/api/stats", TOKEN);
    let http = &stats["http"];
    let cap = http["max_connections"].as_u64().unwrap();
    assert!(cap + 256 < 1024, "no headroom for the hooks: {http}");
    assert!(http["evicted"].as_u64().unwrap() > 0, "{http}");
    eprintln!("after the flood: {http}");
    // The server closes every one of the flood's connections (evicted at the cap, after the
    // header timeout otherwise).
    let mut open: Vec<TcpStream> = held;
    while !open.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} flood connections still open after {:?}",
            open.len(),
            flood_started.elapsed()
        );
        open.retain_mut(|s| {
            s.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 256];
            match s.read(&mut buf) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            }
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, stats) = get(&base, "/api/stats", TOKEN);
    assert!(
        stats["http"]["header_timeouts"].as_u64().unwrap() > 0,
        "{}",
        stats["http"]
    );
    events
        .write_all(tool_call_line("after").as_bytes())
        .unwrap();
    support::wait_for("the hook after the flood", || {
        support::lines(&log).iter().any(|l| l.contains("after"))
    });
    let (code, rest) = d.terminate();
    assert_eq!(code, 0, "{}", rest.join("\n"));
    let report: Value = serde_json::from_str(rest.last().unwrap()).unwrap();
    assert_eq!(report["stats"]["shell"]["totals"]["ok"], 3, "{report}");
}

/// A raw HTTP/1.1 request over a unix socket: (status, body).
fn unix_get(path: &Path, target: &str, token: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[test]
fn listen_on_a_private_unix_socket_and_say_where_beside_the_token() {
    let ws = tempfile::tempdir().unwrap();
    let sock = ws.path().join("api.sock");
    let listen = format!("unix:{}", sock.display());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--listen", &listen]);
    let mut d = Daemon::spawn(cmd, Some(TOKEN));
    d.wait_line(&format!("HTTP API on {listen}"));
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(unix_get(&sock, "/api/hooks", TOKEN).0, 200);
    assert_eq!(
        unix_get(&sock, "/api/hooks", "wrong-token-0123456789").0,
        401
    );
    let address = ws.path().join(".prx-hooks/address");
    assert_eq!(std::fs::read_to_string(&address).unwrap().trim(), listen);
    assert_eq!(d.terminate().0, 0);
    assert!(!sock.exists(), "the socket is removed at exit");
    assert!(!address.exists(), "the address file is removed at exit");

    // TCP: the address file holds the URL.
    let mut d = Daemon::start(ws.path(), &[], Some(TOKEN));
    let base = d.base();
    assert_eq!(std::fs::read_to_string(&address).unwrap().trim(), base);
    assert_eq!(d.terminate().0, 0);
}

#[test]
fn allow_host_admits_the_names_given_and_no_others() {
    use std::io::{Read, Write};
    let ws = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(ws.path(), &["--allow-host", "prx.internal"], Some(TOKEN));
    let base = d.base();
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let ask = |host: &str| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "GET /api/hooks HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.get(9..12)
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(0)
    };
    assert_eq!(ask(&format!("prx.internal:{}", addr.port())), 200);
    assert_eq!(ask("PRX.internal"), 200);
    assert_eq!(ask(&format!("localhost:{}", addr.port())), 200);
    assert_eq!(ask(&format!("other.internal:{}", addr.port())), 403);
    assert_eq!(d.terminate().0, 0);
}

/// Resident memory of process `pid` (`VmRSS`), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

#[test]
fn stalled_streams_hold_at_most_their_queue_bytes_until_the_socket_takes_them() {
    use crate::sse;
    use std::io::Write;
    // The real binary with its defaults: each stream's queue holds 8 MiB. glibc is told to map
    // every block of 128 KiB and more on its own, so a freed frame leaves the resident set at
    // once and VmRSS measures what is held (not what the allocator keeps for later).
    const STREAMS: usize = 8;
    const QUEUE: u64 = prx_hooks::http::DEFAULT_STREAM_QUEUE_BYTES as u64;
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--listen", "127.0.0.1:0", "--events", "-"])
        .env("MALLOC_MMAP_THRESHOLD_", "131072")
        .stdin(Stdio::piped());
    let mut d = Daemon::spawn(cmd, Some(TOKEN));
    let mut events = d.child.stdin.take().unwrap();
    let pid = d.child.id();
    let base = d.base();
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let big = tool_call_line(&"x".repeat(1 << 20));
    let mut sent = 0u64;
    // One event at a time, each numbered before the next is written: frames reach each stream
    // one by one, as a live flow does.
    let mut emit = |n: usize| {
        for _ in 0..n {
            events.write_all(big.as_bytes()).unwrap();
            sent += 1;
            support::wait_for("the stream to number the event", || {
                get(&base, "/api/stats", TOKEN).1["events"]["items"].as_u64() == Some(sent)
            });
        }
    };
    // Warm up: the ring's pages, the workers' buffers and the backlog (8 MiB of the last
    // frames, shared with every queue) are in the baseline.
    emit(40);
    std::thread::sleep(Duration::from_millis(300));
    let baseline = rss(pid);
    let auth = format!("Bearer {TOKEN}");
    let mut streams: Vec<sse::Sse> = (0..STREAMS)
        .map(|_| {
            let conn = sse::small_buffer_conn(addr, 4096);
            let mut s = sse::Sse::over(
                Box::new(conn),
                &addr.to_string(),
                "/api/events?kinds=bus",
                &[("Authorization", &auth)],
            );
            assert_eq!(s.status, 200);
            s.until("ready");
            s
        })
        .collect();
    // Every stream stalls: the socket's buffers, then its queue fill up.
    emit(24);
    // Each reads a little (the socket's buffers and the frame the server was writing), so the
    // server hands it more, then stalls again while events go on.
    for s in &mut streams {
        let start = s.body_bytes;
        while s.body_bytes < start + (4 << 20) {
            s.next().expect("the stream ended");
        }
    }
    emit(24);
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss(pid).saturating_sub(baseline);
    let (_, stats) = get(&base, "/api/stats", TOKEN);
    let dropped = stats["events"]["dropped_client"].as_u64().unwrap();
    println!(
        "{STREAMS} stalled streams: the server grew by {} MiB (baseline {} MiB); {dropped} frames lost",
        grown >> 20,
        baseline >> 20
    );
    assert!(dropped > STREAMS as u64, "the streams stalled: {stats}");
    // What the streams may hold: one queue's worth of frames older than the backlog (the
    // streams stalled together, so they hold the same ones), and slack for the rest.
    assert!(
        grown < 2 * QUEUE + (8 << 20),
        "{STREAMS} stalled streams took {} MiB: more than their queues' {} MiB",
        grown >> 20,
        (2 * QUEUE) >> 20
    );
    drop(streams);
    let (code, rest) = d.terminate();
    assert_eq!(code, 0, "{}", rest.join("\n"));
}

/// `POST` with the token, the answer's status and JSON.
fn post(base: &str, path: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
    let mut r = agent()
        .post(format!("{base}{path}"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .content_type(content_type)
        .send(body)
        .unwrap();
    let text = r.body_mut().read_to_string().unwrap();
    (
        r.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

#[test]
fn huge_session_ids_are_refused_by_name_and_the_server_keeps_none_of_them() {
    // The real binary with its defaults. glibc maps every block of 128 KiB and more on its
    // own, so a freed id leaves the resident set at once and VmRSS measures what is held.
    const LINES: usize = 600;
    const PER_REQUEST: usize = 15;
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prx-hooks"));
    cmd.args(["run", "--workspace"])
        .arg(ws.path())
        .args(["--listen", "127.0.0.1:0"])
        .env("MALLOC_MMAP_THRESHOLD_", "131072");
    let mut d = Daemon::spawn(cmd, Some(TOKEN));
    let pid = d.child.id();
    let base = d.base();
    let ndjson = "application/x-ndjson";
    let (status, _) = post(
        &base,
        "/api/events",
        ndjson,
        tool_call_line("warm").as_bytes(),
    );
    assert_eq!(status, 200);
    std::thread::sleep(Duration::from_millis(300));
    let baseline = rss(pid);

    // Every id a new key of 1 MiB.
    let id = |i: usize| format!("{i:07}{}", "s".repeat((1 << 20) - 7));
    let line = |i: usize| {
        format!(
            "{{\"event\":\"tool_call\",\"agent\":\"a\",\"session\":\"{}\",\"payload\":{{\"tool\":\"t\",\"success\":true,\"output\":\"\"}}}}\n",
            id(i)
        )
    };
    let mut reports = Vec::new();
    for r in 0..LINES / PER_REQUEST {
        let body: String = (0..PER_REQUEST)
            .map(|i| line(r * PER_REQUEST + i))
            .collect();
        let (status, report) = post(&base, "/api/events", ndjson, body.as_bytes());
        assert_eq!(status, 200, "{report}");
        reports.push(report);
    }
    // An agent's own payload, translated: the same rule.
    let payload = format!(
        r#"{{"session_id":"{}","hook_event_name":"Stop"}}"#,
        id(LINES)
    );
    let (status, translated) = post(
        &base,
        "/api/ingest/claude-code?report=true",
        "application/json",
        payload.as_bytes(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let grown = rss(pid).saturating_sub(baseline);
    let (_, stats) = get(&base, "/api/stats", TOKEN);
    println!(
        "{LINES} lines with 1 MiB session ids: the server grew by {} MiB (baseline {} MiB); sessions {}",
        grown >> 20,
        baseline >> 20,
        stats["sessions"]
    );
    assert!(
        grown < 64 << 20,
        "the server grew by {} MiB: it holds the ids",
        grown >> 20
    );
    for r in &reports {
        assert_eq!(r["queued"], 0, "{r}");
        assert_eq!(
            r["errors"].as_array().map(Vec::len),
            Some(PER_REQUEST),
            "{r}"
        );
        let message = r["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("session: 1048576 bytes") && message.contains("256 bytes"),
            "names the field and the limit: {message}"
        );
    }
    assert_eq!(status, 200, "{translated}");
    assert_eq!(
        translated["errors"][0]["message"],
        reports[0]["errors"][0]["message"]
    );
    // The Stop payload makes two lines (turn_complete, then agent_end), each refused.
    assert_eq!(
        translated["errors"].as_array().map(Vec::len),
        Some(2),
        "{translated}"
    );
    assert_eq!(
        stats["ingest"]["errors"],
        LINES as u64 + 2,
        "{}",
        stats["ingest"]
    );
    assert_eq!(stats["sessions"]["opened"], 1, "{}", stats["sessions"]);
    let (code, rest) = d.terminate();
    assert_eq!(code, 0, "{}", rest.join("\n"));
}
