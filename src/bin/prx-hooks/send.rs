//! `prx-hooks send`: one agent hook call's event(s) to the workspace's server, or to its spool.
//!
//! The spool keeps them when no server answers (README.md § Connect an agent).
//!
//! It is what an agent's hook waits for, so it stays small: no hook system, no config, no
//! wasmtime; one connection on a current-thread runtime, a bounded read of stdin. It never
//! fails the agent: anything but `--strict` exits 0, and what went wrong is one line on
//! stderr; a success (a spooled event is one) says nothing there. With `--from`, an agent that
//! reads a hook's stdout as its answer gets `{}` on stdout whenever `send` exits 0, or, on an
//! event the agent lets a hook decide (docs/policies.md § Doors), the policies' decision in
//! the agent's own format: the server's, or with no server the fail mode `--on-unreachable`
//! names. Exit codes:
//! 0 delivered, spooled, or refused (said); with `--strict`, 1 when the event was not
//! delivered to a server, a line was refused or the server dropped an event; 64 a usage error
//! (never 2, which agents read as "block").

use crate::BoxError;
use crate::client::{Target, connect, parse_url};
use crate::spool::{self, Header, Route, Spool, SpoolError};
use clap::{Args, ValueEnum};
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use prx_hooks::http::token;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Usage errors: EX_USAGE (sysexits.h), not clap's 2.
pub(crate) const EX_USAGE: u8 = 64;

#[derive(Args)]
pub(crate) struct SendArgs {
    /// The agent's own hook payload (JSON) instead of stdin: Codex's `notify` passes it as
    /// the last argument.
    #[arg(value_name = "PAYLOAD")]
    payload: Option<String>,
    /// The input is this agent's own hook payload: claude-code, codex, gemini-cli, cursor,
    /// copilot-cli, cline, qwen-code, factory-droid, windsurf or kiro (translated by the
    /// server, docs/agents.md; `{}` is printed on stdout for an agent that reads it as the
    /// hook's answer). Without it: NDJSON in the `run --events` format, or one event's payload
    /// with --event.
    #[arg(long, value_name = "AGENT", conflicts_with = "event")]
    from: Option<String>,
    /// Send one event of this kind; stdin (or PAYLOAD) is its payload object (empty: `{}`).
    #[arg(long, value_name = "EVENT", requires_all = ["agent", "session"])]
    event: Option<String>,
    /// The agent name (with --event; with --from it replaces the agent's own name).
    #[arg(long)]
    agent: Option<String>,
    /// The session (with --event; with --from it replaces the agent's session id).
    #[arg(long)]
    session: Option<String>,
    /// The workspace whose server to reach (its .prx-hooks/address and token) and whose
    /// spool keeps what could not be delivered.
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// The server: `http://HOST:PORT[/PREFIX]` or `unix:PATH` (default: the workspace's
    /// address file).
    #[arg(long, value_name = "URL", conflicts_with = "socket")]
    url: Option<String>,
    /// The server's unix socket (same as --url unix:PATH).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The API token's file; else $PRX_HOOKS_TOKEN; else <workspace>/.prx-hooks/token.
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// Exit 1 when the event was not delivered to a server, a line was refused or the server
    /// dropped an event.
    #[arg(long)]
    strict: bool,
    /// Give up on the server after this long and spool (`500ms`, `2s`).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = crate::units::parse_duration)]
    timeout: Duration,
    /// The most input read (`N`, `NKiB`, `NMiB`); more is refused, nothing sent.
    #[arg(long, value_name = "BYTES", default_value = "16MiB", value_parser = crate::units::parse_size)]
    max_bytes: usize,
    /// Bounds of the spool: entries and bytes (the oldest entries are dropped, counted).
    #[arg(long, value_name = "N", default_value_t = spool::MAX_FILES)]
    spool_max_files: usize,
    #[arg(long, value_name = "BYTES", default_value = "64MiB", value_parser = crate::units::parse_size)]
    spool_max_bytes: usize,
    /// With --from, on an event the agent lets a hook decide (a tool about to run, a prompt, a
    /// permission): the answer when no server answers. `none`: nothing decided, the agent's
    /// own flow; `deny`: the agent's deny, its reason saying the policy server could not be
    /// reached. The event is spooled either way.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = OnUnreachable::None)]
    on_unreachable: OnUnreachable,
}

/// What a decision point gets when no server answers (`--on-unreachable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnUnreachable {
    /// No decision: the agent's own flow.
    None,
    /// The agent's deny.
    Deny,
}

/// The reason a deny for want of a server gives the agent.
const UNREACHABLE: &str = "prx-hooks: the policy server could not be reached, and this hook \
                           denies when it cannot ask (--on-unreachable deny)";

/// One line on stderr (a closed stderr is ignored: the agent must go on).
fn say(message: impl std::fmt::Display) {
    let text = message.to_string();
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(2000)
        .collect();
    let _ = writeln!(std::io::stderr(), "prx-hooks send: {text}");
}

/// What the server said.
enum Answer {
    /// 200: the report (or `{}` for an agent payload).
    Taken(Value),
    /// Refused for what it is (400, 413, 415, 422): retrying cannot help.
    Refused(String),
    /// Nobody took it (no server, refused connection, timeout, 401/403, 5xx): spool it.
    Away(String),
}

pub(crate) fn send(args: SendArgs) -> Result<ExitCode, BoxError> {
    // An agent that reads a hook's stdout as its answer (and Gemini CLI its stderr when stdout
    // is empty) gets `{}`, "nothing to say", whenever `send` exits 0; a decision whatever the
    // exit code (Claude Code reads a JSON answer on every exit code).
    let answers = args
        .from
        .as_deref()
        .and_then(prx_hooks::agents::Agent::from_name)
        .is_some_and(|a| a.answers_on_stdout());
    let (code, decided) = deliver_or_spool(args)?;
    let said = match decided {
        Some(answer) => Some(format!("{answer}\n")),
        None if answers && code == ExitCode::SUCCESS => Some("{}\n".to_string()),
        None => None,
    };
    if let Some(said) = said {
        let mut out = std::io::stdout().lock();
        // A closed stdout is the agent's business: it must go on.
        let _ = out.write_all(said.as_bytes()).and_then(|()| out.flush());
    }
    Ok(code)
}

/// The agent's deny for an event it lets a hook decide, when no server answered and
/// `--on-unreachable deny` says so (`None`: any other event, or the mode is `none`).
fn unreachable_answer(args: &SendArgs, route: &Route, body: &[u8]) -> Option<Value> {
    if args.on_unreachable != OnUnreachable::Deny {
        return None;
    }
    let Route::Ingest { from, .. } = route else {
        return None;
    };
    let agent = prx_hooks::agents::Agent::from_name(from)?;
    let q = prx_hooks::policy::question(agent, body)?;
    let verdict =
        prx_hooks::policy::Verdict::decided(prx_hooks::policy::Decision::Deny, UNREACHABLE);
    Some(prx_hooks::policy::answer(agent, &q.event, &verdict))
}

/// Delivers the input, or spools it: what `send` does, and the decision to print, if any.
fn deliver_or_spool(args: SendArgs) -> Result<(ExitCode, Option<Value>), BoxError> {
    let fail = |strict: bool| ExitCode::from(if strict { 1 } else { 0 });
    // A file size limit (ulimit -f) must give EFBIG, which the spool cleans up after, not
    // kill us mid-write.
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions; no handler runs.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let spool = Spool::new(&args.workspace);
    let (route, body) = match input(&args) {
        Ok(x) => x,
        Err(e) => {
            say(format!("{e}; nothing was sent"));
            spool.count(|s| s.bad_input += 1);
            return Ok((fail(args.strict), None));
        }
    };
    // The events' id and time from their first try on: the same if they are spooled and
    // replayed, so that they run once (docs/ingest.md § The rules every way shares).
    let header = Header {
        route,
        id: Some(new_id()),
        time: Some(humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()),
    };
    let answer = match locate(&args) {
        Ok(Some((target, token))) => deliver(&args, &target, &token, &header, &body),
        Ok(None) => Answer::Away(format!(
            "no server: {} does not exist or names a server that has exited",
            args.workspace.join(token::ADDRESS_FILE).display()
        )),
        Err(e) => Answer::Away(e),
    };
    match answer {
        Answer::Taken(report) => {
            let refused = report["errors"].as_array().map_or(0, Vec::len) as u64
                + report["more_errors"].as_u64().unwrap_or(0);
            if let Some(first) = report["errors"].get(0) {
                say(format!(
                    "line {}:{}: {} ({refused} line(s) refused)",
                    first["line"],
                    first["column"],
                    first["message"].as_str().unwrap_or("")
                ));
            }
            // Taken but not queued: the server's ring or byte budget was full, or its session
            // map (its stats count them; `send` says so, the agent goes on).
            let dropped =
                report["dropped"].as_u64().unwrap_or(0) + report["refused"].as_u64().unwrap_or(0);
            if dropped > 0 {
                say(format!(
                    "{dropped} event(s) dropped by the server, which is full (its stats count \
                     them)"
                ));
            }
            // The policies' decision, in the agent's format (`ingest.rs` puts it there).
            let decided = report.get("answer").filter(|a| a.is_object()).cloned();
            let code = if refused + dropped > 0 {
                fail(args.strict)
            } else {
                ExitCode::SUCCESS
            };
            Ok((code, decided))
        }
        Answer::Refused(why) => {
            say(why);
            Ok((fail(args.strict), None))
        }
        Answer::Away(why) => {
            let decided = unreachable_answer(&args, &header.route, &body);
            match spool.add(
                &header,
                &body,
                args.spool_max_files,
                args.spool_max_bytes as u64,
            ) {
                // Kept: a success. Said to a person at a terminal or with --strict, not where
                // an agent reads a hook's output (some read stderr when stdout is empty).
                Ok(path) => {
                    if args.strict || std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                        say(format!(
                            "{why}; spooled to {} (`prx-hooks run` replays it at start)",
                            path.display()
                        ));
                    }
                }
                Err(e @ SpoolError::NoWorkspace(_)) => say(format!("{why}; {e}; nothing was kept")),
                Err(e) => {
                    let counted = spool.count(|s| s.lost += 1);
                    say(format!(
                        "{why}; could not spool the event: {e}; it is lost{}",
                        if counted {
                            " (counted in the spool's stats.json)"
                        } else {
                            ""
                        }
                    ));
                }
            }
            Ok((fail(args.strict), decided))
        }
    }
}

/// The most of `--timeout` kept for the answer's way back: a quarter, at most 500 ms.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// What `send` tells the server it waits for a decision (`Prx-Decision-Deadline-Ms`): the
/// time left before `until` (its `--timeout` from the start), less a margin for the answer to
/// come back, so the server answers, its slower policies cut, before `send` gives up.
fn decision_deadline_ms(timeout: Duration, until: std::time::Instant) -> u128 {
    let margin = (timeout / 4).min(ANSWER_MARGIN);
    until
        .saturating_duration_since(std::time::Instant::now())
        .saturating_sub(margin)
        .as_millis()
        .min(u128::from(prx_hooks::http::MAX_DECISION_DEADLINE_MS))
}

/// When a `--timeout` of `timeout` from `now` ends: a timeout past what the clock can hold
/// (`--timeout 1e19`) ends a year from now instead of overflowing.
fn deadline_of(now: std::time::Instant, timeout: Duration) -> std::time::Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now.checked_add(timeout).unwrap_or(now + YEAR)
}

/// A new event id: 128 random bits in hex.
fn new_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness: the time and pid are unique enough on one machine.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        return format!("{nanos:x}-{:x}", std::process::id());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The route and body to post, from PAYLOAD or stdin.
fn input(args: &SendArgs) -> Result<(Route, Vec<u8>), String> {
    let bytes = match &args.payload {
        Some(p) => p.clone().into_bytes(),
        None => {
            if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                return Err(
                    "nothing to send: pipe the event on stdin or pass it as PAYLOAD".into(),
                );
            }
            let mut buf = Vec::new();
            std::io::stdin()
                .lock()
                .take(args.max_bytes as u64 + 1)
                .read_to_end(&mut buf)
                .map_err(|e| format!("reading stdin: {e}"))?;
            buf
        }
    };
    if bytes.len() > args.max_bytes {
        return Err(format!(
            "the input is larger than --max-bytes ({} bytes)",
            args.max_bytes
        ));
    }
    if let Some(from) = &args.from {
        if prx_hooks::agents::Agent::from_name(from).is_none() {
            let names: Vec<&str> = prx_hooks::agents::Agent::ALL
                .iter()
                .map(|a| a.name())
                .collect();
            return Err(format!(
                "--from {from:?}: expected one of {}",
                names.join(", ")
            ));
        }
        let route = Route::Ingest {
            from: from.clone(),
            agent: args.agent.clone(),
            session: args.session.clone(),
        };
        return Ok((route, bytes));
    }
    if let Some(event) = &args.event {
        // Raw line breaks in valid JSON can only be whitespace: one line without them.
        let payload: Vec<u8> = bytes
            .iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
            .collect();
        let payload =
            String::from_utf8(payload).map_err(|_| "the payload is not UTF-8".to_string())?;
        let payload = if payload.trim().is_empty() {
            "{}"
        } else {
            payload.trim()
        };
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let line = format!(
            "{{\"event\":{},\"agent\":{},\"session\":{},\"payload\":{payload}}}\n",
            quote(event),
            quote(args.agent.as_deref().unwrap_or_default()),
            quote(args.session.as_deref().unwrap_or_default()),
        );
        return Ok((Route::Events, line.into_bytes()));
    }
    Ok((Route::Events, bytes))
}

/// The server and its token (`None`: no server has written its address).
fn locate(args: &SendArgs) -> Result<Option<(Target, prx_hooks::http::Token)>, String> {
    let target = if let Some(socket) = &args.socket {
        Target::Unix(socket.clone())
    } else if let Some(url) = &args.url {
        parse_url(url)?
    } else {
        match token::read_address(&args.workspace).map_err(|e| e.to_string())? {
            Some(a) => parse_url(&a)?,
            None => return Ok(None),
        }
    };
    let env = std::env::var(token::TOKEN_ENV).ok();
    match token::find(args.token_file.as_deref(), env.as_deref(), &args.workspace) {
        Ok(Some((t, _))) => Ok(Some((target, t))),
        Ok(None) => Err(format!(
            "no API token: {} does not exist; pass --token-file or set {}",
            args.workspace.join(token::TOKEN_FILE).display(),
            token::TOKEN_ENV
        )),
        Err(e) => Err(e.to_string()),
    }
}

fn deliver(
    args: &SendArgs,
    target: &Target,
    token: &prx_hooks::http::Token,
    header: &Header,
    body: &[u8],
) -> Answer {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return Answer::Away(format!("cannot start the client: {e}")),
    };
    let until = deadline_of(std::time::Instant::now(), args.timeout);
    let post = post(target, token, header, body.to_vec(), (args.timeout, until));
    runtime.block_on(async {
        match tokio::time::timeout(args.timeout, post).await {
            Ok(answer) => answer,
            Err(_) => Answer::Away(format!("{target}: no answer within {:?}", args.timeout)),
        }
    })
}

async fn post(
    target: &Target,
    token: &prx_hooks::http::Token,
    header: &Header,
    body: Vec<u8>,
    (timeout, until): (Duration, std::time::Instant),
) -> Answer {
    let route = &header.route;
    let io = match connect(target, timeout).await {
        Ok(io) => io,
        Err(e) => return Answer::Away(format!("cannot connect to {target}: {e}")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Full<bytes::Bytes>,
    >(TokioIo::new(io))
    .await
    {
        Ok(x) => x,
        Err(e) => return Answer::Away(format!("{target}: {e}")),
    };
    let conn = tokio::spawn(conn);
    let (host, prefix) = match target {
        Target::Tcp { authority, prefix } => (authority.as_str(), prefix.as_str()),
        Target::Unix(_) => ("localhost", ""),
    };
    let (path, media) = match route {
        Route::Events => ("/api/events".to_string(), "application/x-ndjson"),
        Route::Ingest {
            from,
            agent,
            session,
        } => {
            let mut path = format!("/api/ingest/{from}");
            let enc = |s: &str| {
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
            };
            // The report, not Claude Code's `{}`: a refused line's reason is said here.
            path.push_str("?report=true");
            for (k, v) in [("agent", agent), ("session", session)] {
                if let Some(v) = v {
                    path.push_str(&format!("&{k}={}", enc(v)));
                }
            }
            (path, "application/json")
        }
    };
    let req = hyper::Request::post(format!("{prefix}{path}"))
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, media)
        .header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", token.as_str()),
        )
        .header(
            hyper::header::USER_AGENT,
            concat!("prx-hooks-send/", env!("CARGO_PKG_VERSION")),
        )
        .header(
            prx_hooks::http::EVENT_ID_HEADER,
            header.id.as_deref().unwrap_or_default(),
        )
        .header(
            prx_hooks::http::TIMESTAMP_HEADER,
            header.time.as_deref().unwrap_or_default(),
        )
        .header(
            prx_hooks::http::DECISION_DEADLINE_HEADER,
            decision_deadline_ms(timeout, until).to_string(),
        )
        .body(http_body_util::Full::new(bytes::Bytes::from(body)));
    let req = match req {
        Ok(r) => r,
        Err(e) => return Answer::Refused(format!("cannot build the request: {e}")),
    };
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return Answer::Away(format!("{target}: {e}")),
    };
    let status = resp.status().as_u16();
    let limited = http_body_util::Limited::new(resp.into_body(), 1 << 20);
    let text = match limited.collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(e) => return Answer::Away(format!("{target}: reading the answer: {e}")),
    };
    conn.abort();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let said = || {
        let msg = value["error"]
            .as_str()
            .map_or_else(|| text.clone(), str::to_string);
        format!("{target}: {status}: {msg}")
    };
    match status {
        // Only an ingest report is a delivery: a stale address file can name a port another
        // program serves now, and its 200 took nothing.
        200 if !value["queued"].is_u64() => Answer::Away(format!(
            "{target}: 200 without an ingest report: not a prx-hooks server"
        )),
        200 => Answer::Taken(value),
        400 | 404 | 405 | 413 | 415 | 422 => Answer::Refused(said()),
        _ => Answer::Away(said()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_past_what_the_clock_holds_ends_a_year_out_and_the_header_stays_in_range() {
        let now = std::time::Instant::now();
        let huge = Duration::from_secs_f64(1e19);
        let until = deadline_of(now, huge);
        assert!(until >= now + Duration::from_secs(365 * 24 * 3600));
        assert_eq!(
            deadline_of(now, Duration::from_secs(2)),
            now + Duration::from_secs(2)
        );
        assert_eq!(
            decision_deadline_ms(huge, until),
            u128::from(prx_hooks::http::MAX_DECISION_DEADLINE_MS)
        );
    }
}
