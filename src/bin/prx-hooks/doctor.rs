//! `prx-hooks doctor`: does each connected agent's hook reach the workspace's server?
//!
//! Every way a hook fails silently is looked at (docs/connect.md § Checking it: doctor): the
//! agent's settings file read as the agent reads it, each entry on an event the agent has and
//! with a handler type it runs there ([`checks`], against [`hook_table`]), the trust Codex
//! and Gemini CLI want, the server and the token our entries use, and, from the server
//! (`GET /api/agents`), when it last saw each of the agent's events.
//!
//! Exit status: 0 all good, 1 problems found, 2 something could not be checked (and no
//! problem found).

#[path = "doctor_checks.rs"]
mod checks;

use crate::BoxError;
use crate::client::{self, Target as Url};
use crate::connect::{self, agents};
use crate::hook_table::{self, Agent};
use checks::{CodexConfig, FileCheck, Ours, Target, Trust};
use clap::Args;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
#[command(after_help = "\
Looks at, for each agent connected in --project or in the user's files:
  its settings, read as the agent reads them (plain JSON; Gemini CLI's with comments)
  every entry: an event the agent has, a handler type it runs on that event
  our entries: the program on PATH, the workspace, Claude Code's waits where a turn ends
  trust: Codex's /hooks records and trusted projects, Gemini CLI's and Copilot CLI's
         trusted folders
  the server in each workspace our entries name, with the token they use
  what the server last saw of each agent's events, and the events it did not know

Exit codes:
  0  every check passed
  1  a problem was found (each is one line starting with `problem`)
  2  no problem found, but a check could not be made (said on a line starting with `unchecked`)")]
pub(crate) struct DoctorArgs {
    /// The project the agents run in (their project files, Codex's and Gemini's trust).
    #[arg(long, value_name = "DIR", default_value = ".")]
    project: PathBuf,
    /// Only these agents (comma-separated: claude-code, codex, gemini-cli, cursor, qwen-code,
    /// factory-droid, copilot-cli, windsurf).
    #[arg(long, value_name = "AGENT,…", value_delimiter = ',')]
    agent: Vec<String>,
}

/// How a finding weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Ok,
    Info,
    Problem,
    Unchecked,
}

#[derive(Clone, Debug)]
pub(crate) struct Finding {
    pub level: Level,
    pub text: String,
}

impl Finding {
    pub(crate) fn new(level: Level, text: String) -> Finding {
        Finding { level, text }
    }
}

/// One agent: its files' findings and our entries in them.
struct AgentCheck {
    agent: Agent,
    files: Vec<(PathBuf, &'static str, FileCheck)>,
}

impl AgentCheck {
    fn ours(&self) -> impl Iterator<Item = &Ours> {
        self.files.iter().flat_map(|(_, _, f)| f.ours.iter())
    }
}

pub(crate) fn doctor(args: DoctorArgs) -> Result<ExitCode, BoxError> {
    let project = std::fs::canonicalize(&args.project)
        .map_err(|e| format!("doctor: --project {}: {e}", args.project.display()))?;
    let mut agents = Vec::new();
    for name in &args.agent {
        agents.push(
            Agent::from_name(name)
                .ok_or_else(|| format!("doctor: unknown agent {name:?}: {}", Agent::names()))?,
        );
    }
    if agents.is_empty() {
        agents = Agent::ALL.to_vec();
    }
    let mut general = Vec::new();
    let checks: Vec<AgentCheck> = agents
        .iter()
        .map(|&a| check_agent(a, &project, &mut general))
        .collect();
    let servers = ask_servers(&checks);
    for f in &general {
        print_finding(f);
    }
    let mut all = general;
    let mut connected = 0;
    for c in &checks {
        if c.files.is_empty() {
            out!("{}: not connected", c.agent);
            continue;
        }
        connected += 1;
        let mut findings = Vec::new();
        for (path, scope, f) in &c.files {
            out!("{}: {} ({scope})", c.agent, path.display());
            findings.extend(f.findings.iter().cloned());
        }
        findings.extend(trust(c, &project));
        findings.extend(server_lines(c, &servers));
        findings.extend(seen_lines(c, &servers, &project));
        for f in &findings {
            print_finding(f);
        }
        all.extend(findings);
    }
    if connected == 0 {
        let f = Finding::new(
            Level::Problem,
            format!(
                "no agent is connected: no settings file of theirs in {} or in your home holds prx-hooks entries; run `prx-hooks connect AGENT`",
                project.display()
            ),
        );
        print_finding(&f);
        all.push(f);
    }
    let problems = all.iter().filter(|f| f.level == Level::Problem).count();
    let unchecked = all.iter().filter(|f| f.level == Level::Unchecked).count();
    out!("doctor: {problems} problem(s), {unchecked} check(s) that could not be made");
    Ok(ExitCode::from(match (problems, unchecked) {
        (0, 0) => 0,
        (0, _) => 2,
        _ => 1,
    }))
}

fn print_finding(f: &Finding) {
    let tag = match f.level {
        Level::Ok => "ok",
        Level::Info => "info",
        Level::Problem => "problem",
        Level::Unchecked => "unchecked",
    };
    out!("  {tag:<9} {}", f.text);
}

/// The files `connect` writes for `agent` that exist, each checked (a file without a
/// prx-hooks entry is not ours to judge, unless its agent cannot read it and it names us).
fn check_agent(agent: Agent, project: &Path, general: &mut Vec<Finding>) -> AgentCheck {
    let mut files = Vec::new();
    let mut candidates = vec![(project.join(agents::settings_file(agent, false)), "project")];
    let user = connect::user_settings_file(agent, false);
    match user {
        Ok(p) => candidates.push((p, "user")),
        Err(e) => general.push(Finding::new(
            Level::Unchecked,
            format!("{agent}'s user files: {e}"),
        )),
    }
    for (path, scope) in candidates {
        // As connect reads it: a FIFO or a device is refused, not waited on; the size bounded.
        match connect::write::read_settings(&path).map(|c| c.text) {
            // Ours run `prx-hooks` or `prx-hooks-send`, or post to `/api/ingest/AGENT`.
            Ok(Some(text)) if text.contains("prx-hooks") || text.contains("/api/ingest/") => {
                let check = checks::check_json(agent, &path, &text, project);
                files.push((path, scope, check));
            }
            Ok(_) => {}
            Err(e) => general.push(Finding::new(Level::Unchecked, e.to_string())),
        }
    }
    if agent == Agent::Codex
        && let Some(notify) = codex_notify()
    {
        files.push(notify);
    }
    AgentCheck { agent, files }
}

/// Codex's config.toml when it runs our `notify`.
fn codex_notify() -> Option<(PathBuf, &'static str, FileCheck)> {
    let path = connect::codex_home().ok()?.join("config.toml");
    let text = connect::write::read_settings(&path).ok()?.text?;
    let mut check = FileCheck::default();
    let config = CodexConfig::read(&path, &text, &mut check)?;
    let argv = config.notify?;
    let words: Vec<String> = argv.clone();
    let ws = checks::workspace_of(Agent::Codex, &words, Path::new("/"));
    check.findings.push(Finding::new(
        Level::Info,
        "notify runs `prx-hooks send` after each turn (connect codex --notify)".into(),
    ));
    check.ours.push(Ours {
        event: "agent-turn-complete".into(),
        target: Target::Workspace(ws),
        why_not: None,
        place: (0, 0),
    });
    Some((path, "user", check))
}

/// Codex's, Gemini CLI's and Copilot CLI's trust, for the files holding our entries.
fn trust(c: &AgentCheck, project: &Path) -> Vec<Finding> {
    match c.agent {
        Agent::Codex => codex_trust(c, project),
        Agent::GeminiCli => gemini_trust(project),
        // Its user hooks run anywhere; a repository's only in a folder it trusts.
        Agent::CopilotCli if c.files.iter().any(|(_, scope, _)| *scope == "project") => {
            copilot_trust(project)
        }
        _ => Vec::new(),
    }
}

fn copilot_trust(project: &Path) -> Vec<Finding> {
    let home = match connect::copilot_home() {
        Ok(h) => h,
        Err(e) => {
            return vec![Finding::new(
                Level::Unchecked,
                format!("Copilot CLI's trusted folders: {e}"),
            )];
        }
    };
    match checks::copilot_trust(&home, project) {
        Ok(None) => vec![Finding::new(
            Level::Ok,
            format!("Copilot CLI trusts {}", project.display()),
        )],
        Ok(Some(problem)) => vec![Finding::new(Level::Problem, problem)],
        Err(e) => vec![Finding::new(
            Level::Unchecked,
            format!("Copilot CLI's trusted folders: {e}"),
        )],
    }
}

fn codex_trust(c: &AgentCheck, project: &Path) -> Vec<Finding> {
    let mut out = Vec::new();
    let Ok(config_path) = connect::codex_home().map(|h| h.join("config.toml")) else {
        return out;
    };
    let text = std::fs::read_to_string(&config_path).unwrap_or_default();
    let mut check = FileCheck::default();
    let Some(config) = CodexConfig::read(&config_path, &text, &mut check) else {
        return check.findings;
    };
    if config.hooks_off() {
        out.push(Finding::new(
            Level::Problem,
            format!(
                "{}: [features] hooks = false: Codex runs no hook",
                config_path.display()
            ),
        ));
    }
    let hooks_files: Vec<&(PathBuf, &str, FileCheck)> = c
        .files
        .iter()
        .filter(|(p, _, _)| p.ends_with("hooks.json"))
        .collect();
    if config.notify.is_some() && hooks_files.iter().any(|(_, _, f)| !f.ours.is_empty()) {
        out.push(Finding::new(
            Level::Problem,
            "both Codex's hooks and our notify are set: each turn arrives twice; take notify out with `prx-hooks connect codex --notify --remove`".into(),
        ));
    }
    for (path, scope, f) in hooks_files {
        if *scope == "project" && !config.project_trusted(project) {
            out.push(Finding::new(
                Level::Problem,
                format!(
                    "{}: Codex does not trust {} (no trust_level = \"trusted\" in {}): it loads no hook of a project it does not trust",
                    path.display(),
                    project.display(),
                    config_path.display()
                ),
            ));
        }
        let (mut trusted, mut untrusted, mut disabled) = (0, Vec::new(), Vec::new());
        for o in &f.ours {
            match config.trusted(path, &o.event, o.place) {
                Trust::Trusted => trusted += 1,
                Trust::Untrusted => untrusted.push(o.event.as_str()),
                Trust::Disabled => disabled.push(o.event.as_str()),
            }
        }
        if !untrusted.is_empty() {
            out.push(Finding::new(
                Level::Problem,
                format!(
                    "{} of our entries are not trusted ({}): Codex skips them until you trust them in its /hooks menu (or runs them under --dangerously-bypass-hook-trust)",
                    untrusted.len(),
                    untrusted.join(", ")
                ),
            ));
        }
        if !disabled.is_empty() {
            out.push(Finding::new(
                Level::Problem,
                format!("disabled in Codex's /hooks: {}", disabled.join(", ")),
            ));
        }
        if trusted > 0 {
            out.push(Finding::new(
                Level::Ok,
                format!(
                    "{trusted} of our entries trusted in {} (Codex asks again when an entry changes)",
                    config_path.display()
                ),
            ));
        }
    }
    out
}

fn gemini_trust(project: &Path) -> Vec<Finding> {
    let Ok(home) = connect::home() else {
        return vec![Finding::new(
            Level::Unchecked,
            "Gemini CLI's folder trust: $HOME is not set".into(),
        )];
    };
    match checks::gemini_trust(&home, project) {
        Ok(None) => vec![Finding::new(
            Level::Ok,
            format!(
                "Gemini CLI trusts {} (or checks no folder)",
                project.display()
            ),
        )],
        Ok(Some(problem)) => vec![Finding::new(Level::Problem, problem)],
        Err(e) => vec![Finding::new(
            Level::Unchecked,
            format!("Gemini CLI's trusted folders: {e}"),
        )],
    }
}

/// What a server said, per target.
#[derive(Debug)]
enum Server {
    /// It answered with the token: its `GET /api/agents`; where, and whose token.
    Answered {
        url: String,
        token_from: String,
        report: Value,
    },
    Problem(String),
    Unchecked(String),
}

/// Each target our entries name, asked once.
fn ask_servers(checks: &[AgentCheck]) -> BTreeMap<Target, Server> {
    let mut servers = BTreeMap::new();
    for o in checks.iter().flat_map(AgentCheck::ours) {
        if !servers.contains_key(&o.target) {
            servers.insert(o.target.clone(), ask(&o.target));
        }
    }
    servers
}

fn ask(target: &Target) -> Server {
    let env = std::env::var(prx_hooks::http::token::TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty());
    let (url, token, token_from) = match target {
        Target::Url(url) => match env {
            Some(t) => (url.clone(), t, "$PRX_HOOKS_TOKEN".to_string()),
            None => {
                return Server::Problem(format!(
                    "the http hooks post to {url} with $PRX_HOOKS_TOKEN from Claude Code's environment, and it is not set in this shell: set it as for claude (export PRX_HOOKS_TOKEN=\"$(cat WORKSPACE/.prx-hooks/token)\")"
                ));
            }
        },
        Target::Workspace(ws) => match workspace_server(ws, env) {
            Ok(x) => x,
            Err(s) => return s,
        },
    };
    match get_agents(&url, &token) {
        Ok((200, report)) if report["agents"].is_array() => Server::Answered {
            url,
            token_from,
            report,
        },
        Ok((200, _)) => Server::Problem(format!(
            "{url} answered, but not as a prx-hooks server: the address file is stale?"
        )),
        Ok((401, _)) => Server::Problem(format!(
            "the server at {url} refuses the token of {token_from}: the hooks' events are refused and spooled; restart the server or fix the token"
        )),
        Ok((404, _)) => Server::Unchecked(format!(
            "the server at {url} has no GET /api/agents (an older prx-hooks): restart it with this version to see what it received"
        )),
        Ok((status, body)) => Server::Unchecked(format!("{url} answered {status}: {body}")),
        Err(e) => Server::Problem(format!(
            "no server answers at {url} ({e}): events wait in the workspace's spool until `prx-hooks run --listen` serves it again"
        )),
    }
}

/// A workspace's server address and the token `send` would use there.
fn workspace_server(ws: &Path, env: Option<String>) -> Result<(String, String, String), Server> {
    use prx_hooks::http::token;
    if !ws.is_dir() {
        return Err(Server::Problem(format!(
            "the workspace {} does not exist: our entries send nowhere; run `prx-hooks connect` with --workspace",
            ws.display()
        )));
    }
    let address = match token::read_address(ws) {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Err(Server::Problem(format!(
                "no server runs for {}: start `prx-hooks run --workspace {} --listen 127.0.0.1:7878` (until then `send` keeps the events in its spool, replayed at the next start)",
                ws.display(),
                agents::shell_quote(&ws.display().to_string())
            )));
        }
        Err(e) => return Err(Server::Unchecked(format!("{}: {e}", ws.display()))),
    };
    match token::find(None, env.as_deref(), ws) {
        Ok(Some((t, source))) => Ok((address, t.as_str().to_string(), source.to_string())),
        Ok(None) => Err(Server::Problem(format!(
            "{} has no token file: `send` cannot authenticate",
            ws.display()
        ))),
        Err(e) => Err(Server::Problem(format!(
            "the token for {}: {e}",
            ws.display()
        ))),
    }
}

/// `GET URL/api/agents` with the token: the status and the JSON body.
fn get_agents(url: &str, token: &str) -> Result<(u16, Value), String> {
    let target = client::parse_url(url)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let fut = async {
            let io = client::connect(&target, Duration::from_secs(2))
                .await
                .map_err(|e| e.to_string())?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake::<
                _,
                http_body_util::Empty<bytes::Bytes>,
            >(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
            let conn = tokio::spawn(conn);
            let (host, prefix) = match &target {
                Url::Tcp { authority, prefix } => (authority.as_str(), prefix.as_str()),
                Url::Unix(_) => ("localhost", ""),
            };
            let req = hyper::Request::get(format!("{prefix}/api/agents"))
                .header(hyper::header::HOST, host)
                .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
                .body(http_body_util::Empty::new())
                .map_err(|e| e.to_string())?;
            let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let body = http_body_util::Limited::new(resp.into_body(), 4 << 20)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            conn.abort();
            Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
        };
        tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .map_err(|_| "no answer within 5 s".to_string())?
    })
}

/// The servers our entries of `c` reach, said once each.
fn server_lines(c: &AgentCheck, servers: &BTreeMap<Target, Server>) -> Vec<Finding> {
    let mut targets: Vec<&Target> = c.ours().map(|o| &o.target).collect();
    targets.sort();
    targets.dedup();
    targets
        .into_iter()
        .filter_map(|t| servers.get(t).map(|s| (t, s)))
        .map(|(t, s)| match s {
            Server::Answered {
                url, token_from, ..
            } => Finding::new(
                Level::Ok,
                format!(
                    "server {url}{} answers with the token of {token_from}",
                    match t {
                        Target::Workspace(ws) => format!(" (workspace {})", ws.display()),
                        Target::Url(_) => String::new(),
                    }
                ),
            ),
            Server::Problem(p) => Finding::new(Level::Problem, p.clone()),
            Server::Unchecked(u) => Finding::new(Level::Unchecked, u.clone()),
        })
        .collect()
}

/// What the servers saw of `c`'s agent: our events seen (how long ago), never seen (and why,
/// when the agent does not run that entry), the events it sent that nobody knows.
fn seen_lines(c: &AgentCheck, servers: &BTreeMap<Target, Server>, project: &Path) -> Vec<Finding> {
    let mut out = Vec::new();
    // Per event: (age in ms, count), merged over the servers.
    let mut seen: BTreeMap<String, (Option<u64>, u64)> = BTreeMap::new();
    let mut since: Option<u64> = None;
    let mut unknown: (u64, Vec<String>) = (0, Vec::new());
    let mut answered = false;
    for s in servers.values() {
        let Server::Answered { report, .. } = s else {
            continue;
        };
        if !c
            .ours()
            .any(|o| servers.get(&o.target).is_some_and(|x| std::ptr::eq(x, s)))
        {
            continue;
        }
        answered = true;
        let now = report["now_unix_ms"].as_u64().unwrap_or(0);
        let started = now.saturating_sub(report["since_unix_ms"].as_u64().unwrap_or(now));
        since = Some(since.map_or(started, |s| s.min(started)));
        let Some(agent) = report["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["agent"] == c.agent.name()))
        else {
            continue;
        };
        for e in agent["events"].as_array().into_iter().flatten() {
            let entry = seen.entry(e["event"].as_str().unwrap_or_default().to_string());
            let slot = entry.or_insert((None, 0));
            slot.1 += e["count"].as_u64().unwrap_or(0);
            if let Some(age) = e["age_ms"].as_u64() {
                slot.0 = Some(slot.0.map_or(age, |a: u64| a.min(age)));
            }
        }
        unknown.0 += agent["unknown"]["count"].as_u64().unwrap_or(0);
        for n in agent["unknown"]["names"].as_array().into_iter().flatten() {
            if let Some(n) = n.as_str() {
                unknown.1.push(n.to_string());
            }
        }
    }
    if !answered {
        return out;
    }
    let total: u64 = seen.values().map(|(_, n)| n).sum::<u64>() + unknown.0;
    let up = since.map_or(String::new(), |s| format!(" ({} ago)", ago(s)));
    if total == 0 {
        out.push(Finding::new(
            Level::Problem,
            format!(
                "{}: no event seen since the server started{up}: start it in {} (if it runs: is the folder trusted, is prx-hooks-send on its PATH?)",
                c.agent.title(),
                project.display()
            ),
        ));
        return out;
    }
    out.extend(event_lines(c, &seen));
    if unknown.0 > 0 {
        out.push(Finding::new(
            Level::Info,
            format!(
                "{} sent {} event(s) prx-hooks does not know (published as topics): {}",
                c.agent.title(),
                unknown.0,
                unknown.1.join(", ")
            ),
        ));
    }
    out
}

/// Our events seen, most recent first; those never seen, with why when the agent does not
/// run the entry.
fn event_lines(c: &AgentCheck, seen: &BTreeMap<String, (Option<u64>, u64)>) -> Vec<Finding> {
    let mut ours: Vec<&Ours> = c.ours().collect();
    ours.sort_by(|a, b| a.event.cmp(&b.event));
    ours.dedup_by(|a, b| a.event == b.event);
    let mut recent: Vec<(u64, String)> = Vec::new();
    let mut never = Vec::new();
    for o in ours {
        // The server counts an event under its documented name, not its alias.
        let name = hook_table::event(c.agent, &o.event).map_or(o.event.as_str(), |e| e.name);
        match seen.get(name) {
            Some((Some(age), n)) => {
                recent.push((*age, format!("{} {} ago ({n})", o.event, ago(*age))))
            }
            _ => never.push(match &o.why_not {
                Some(why) => format!("{} ({why})", o.event),
                None => o.event.clone(),
            }),
        }
    }
    recent.sort();
    let mut out = Vec::new();
    if !recent.is_empty() {
        let shown: Vec<String> = recent.into_iter().map(|(_, s)| s).collect();
        out.push(Finding::new(
            Level::Ok,
            format!("{} seen: {}", c.agent.title(), shown.join(", ")),
        ));
    }
    if !never.is_empty() {
        out.push(Finding::new(
            Level::Info,
            format!("never seen: {}", never.join(", ")),
        ));
    }
    out
}

/// `3 s`, `4 min`, `2 h`, `3 d`.
fn ago(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}
