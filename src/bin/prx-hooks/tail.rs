//! `prx-hooks tail`: a server's live stream followed, one line per event and per run.
//!
//! The stream is `GET /api/events` (docs/http.md § The live stream); with `--json` each line
//! is one JSON object.
//!
//! * **Finding the server.** `--url` (`http://HOST:PORT[/PREFIX]` or `unix:PATH`), else the
//!   address `prx-hooks run --listen` wrote to `<workspace>/.prx-hooks/address`, read again
//!   before every connection (a restarted server may listen elsewhere). The token:
//!   `--token-file`, else `$PRX_HOOKS_TOKEN`, else `<workspace>/.prx-hooks/token` — read,
//!   never generated.
//! * **Reconnecting.** Any end of the stream that retrying can mend (connection refused or
//!   lost, 429, 503, the server shutting down) is retried with a backoff from 100 ms to 5 s,
//!   with `Last-Event-ID`, so nothing is lost that the server's backlog still holds; what
//!   could not be recovered (the server's `gap` and `dropped` events) is said once on stderr
//!   per occurrence. A stream silent for two keep-alive periods is taken for dead.
//! * **Terminal safety.** Everything the server sends is text agents, LLMs and hooks control
//!   (payloads, hook outcomes, plugin result keys, error bodies, shutdown reasons, ids). Every
//!   piece of it reaches the terminal through one function, [`render::escape`] (via [`render::Line::render`]
//!   for stdout and [`say`] for stderr): C0 and C1 controls, DEL and bidirectional overrides
//!   are printed escaped; the only escape sequences written are our colours.
//! * **`--json`** lines are serialized by serde_json ([`json_line`]), never pasted: one valid
//!   JSON object per line, a server's data that is not a JSON object is not shown (counted,
//!   said once).
//! * **Bounded.** Every field is, as it arrives ([`Parser`], `tail_sse.rs`): an event's data,
//!   id and name together hold at most `--max-event-bytes` (32 MiB), a longer event is dropped;
//!   an id over 256 bytes is ignored and a name over 256 bytes skips its event; comments,
//!   `retry:` and unknown fields are never held. An event id that cannot be sent back as
//!   `Last-Event-ID` (a control character, or too long) is ignored (the last good one is kept).
//!   Each kind is counted and said once.
//! * The HTTP client is hyper's client half on a current-thread tokio runtime: both are in the
//!   binary already (the server uses them), and the same code speaks over a unix socket.

#[path = "tail_render.rs"]
mod render;
#[path = "tail_sse.rs"]
mod sse;

use crate::BoxError;
use crate::client::{Target, connect, parse_url};
use crate::units::parse_size;
use clap::Args;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prx_hooks::http::token;
use render::{cut, event_line, gap_line, json_line, plugin_line, run_line, say};
use serde_json::Value;
use sse::{Ev, MAX_ID_BYTES, MAX_NAME_BYTES, Parser};
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub(crate) struct TailArgs {
    /// Bus topics to show: an exact topic, a prefix ending in `.*`, or `*` (repeatable).
    /// Default: every topic.
    #[arg(value_name = "PATTERN")]
    patterns: Vec<String>,
    /// The server: `http://HOST:PORT[/PREFIX]` or `unix:PATH`. Default: the address in
    /// <workspace>/.prx-hooks/address (written by `prx-hooks run --listen`).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The workspace whose server to follow (its .prx-hooks/address and token).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// The API token's file; else $PRX_HOOKS_TOKEN; else <workspace>/.prx-hooks/token.
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// Show hook runs and plugin-call counts too.
    #[arg(long)]
    runs: bool,
    /// Show only hook runs and plugin-call counts (no bus messages).
    #[arg(long, conflicts_with = "patterns")]
    only_runs: bool,
    /// One JSON object per line: bus messages exactly as `run --print` writes them; runs,
    /// plugin counts and loss notices with a "type" member.
    #[arg(long)]
    json: bool,
    /// Start with the last N matching items the server still holds.
    #[arg(short = 'n', long = "last", value_name = "N", default_value_t = 0)]
    last: usize,
    /// Colours: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    color: String,
    /// Exit 1 when no connection could be made for this long (`30s`, `2m`). Default: keep
    /// trying.
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration)]
    give_up: Option<Duration>,
    /// The most one event may hold (`33554432`, `64MiB`); a longer one is skipped without
    /// being held, counted and said once. Default 32 MiB.
    #[arg(long, value_name = "BYTES", default_value_t = MAX_EVENT_BYTES, value_parser = parse_size)]
    max_event_bytes: usize,
}

/// Why following stopped or paused.
enum End {
    /// Retry (with this said on stderr, once per outage).
    Retry(String),
    /// Stop with this exit code and message.
    Exit(u8, String),
    /// stdout is closed: the reader went away.
    StdoutClosed,
}

/// How the lines look.
struct Style {
    json: bool,
    color: bool,
}

pub(crate) fn tail(args: TailArgs) -> Result<ExitCode, BoxError> {
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        "auto" => {
            std::io::IsTerminal::is_terminal(&std::io::stdout())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
        other => return Err(format!("--color {other:?}: expected auto, always or never").into()),
    };
    let fixed = args.url.as_deref().map(parse_url).transpose()?;
    let query = query(&args);
    let style = Style {
        json: args.json,
        color: color && !args.json,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(follow(&args, fixed, &query, &style));
    Ok(ExitCode::from(code))
}

fn query(args: &TailArgs) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let kinds = match (args.only_runs, args.runs) {
        (true, _) => "runs,plugins",
        (false, true) => "bus,runs,plugins",
        (false, false) => "bus",
    };
    let mut q = format!("kinds={}", enc(kinds));
    for p in &args.patterns {
        q.push_str("&pattern=");
        q.push_str(&enc(p));
    }
    if args.last > 0 {
        q.push_str(&format!("&backlog={}", args.last));
    }
    q
}

/// What a stream left to the next connection.
#[derive(Default)]
struct Resume {
    last_id: Option<String>,
    keepalive: Option<Duration>,
    /// The server's instance, once known (a different one later means it restarted).
    instance: Option<String>,
    /// `--max-event-bytes`.
    max_event_bytes: usize,
    refused: Refused,
}

async fn follow(args: &TailArgs, fixed: Option<Target>, query: &str, style: &Style) -> u8 {
    let mut resume = Resume {
        max_event_bytes: args.max_event_bytes,
        ..Resume::default()
    };
    let mut backoff = Duration::from_millis(100);
    let mut outage: Option<(Instant, String)> = None;
    let mut connected_once = false;
    let stdout = std::io::stdout();
    loop {
        let started = Instant::now();
        let attempt = match locate(args, fixed.as_ref()) {
            Ok(Some((target, token))) => {
                stream(
                    &target,
                    &token,
                    query,
                    &mut resume,
                    style,
                    &stdout,
                    &mut |t| {
                        let what = if connected_once {
                            "reconnected to"
                        } else {
                            "following"
                        };
                        say(&format!("{what} {t}"));
                        connected_once = true;
                    },
                )
                .await
            }
            Ok(None) => End::Retry(format!(
                "waiting for a server: {} does not exist (`prx-hooks run --listen` writes it; or pass --url)",
                args.workspace.join(token::ADDRESS_FILE).display()
            )),
            Err(e) => End::Exit(2, e),
        };
        if let (End::StdoutClosed | End::Exit(..), Some(s)) = (&attempt, resume.refused.summary()) {
            say(&s);
        }
        match attempt {
            End::StdoutClosed => return 0,
            End::Exit(code, msg) => {
                say(&msg);
                return code;
            }
            End::Retry(why) => {
                // A stream that ran a while resets the backoff and the outage clock.
                if started.elapsed() > Duration::from_secs(5) {
                    backoff = Duration::from_millis(100);
                    outage = None;
                }
                match &outage {
                    Some((_, said)) if *said == why => {}
                    _ => {
                        say(&format!("{why}; retrying"));
                        let since = outage.as_ref().map_or_else(Instant::now, |(t, _)| *t);
                        outage = Some((since, why));
                    }
                }
                if let (Some(limit), Some((since, _))) = (args.give_up, &outage)
                    && since.elapsed() >= limit
                {
                    say(&format!(
                        "giving up after {} without a stream (--give-up)",
                        humantime::format_duration(Duration::from_secs(since.elapsed().as_secs()))
                    ));
                    if let Some(s) = resume.refused.summary() {
                        say(&s);
                    }
                    return 1;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The server and token to use now (`None`: no address file yet).
fn locate(
    args: &TailArgs,
    fixed: Option<&Target>,
) -> Result<Option<(Target, prx_hooks::http::Token)>, String> {
    let target = match fixed {
        Some(t) => t.clone(),
        None => match token::read_address(&args.workspace).map_err(|e| e.to_string())? {
            Some(a) => parse_url(&a).map_err(|e| {
                format!(
                    "{}: {e}",
                    args.workspace.join(token::ADDRESS_FILE).display()
                )
            })?,
            None => return Ok(None),
        },
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

/// One connection: request, then events until the stream ends.
async fn stream(
    target: &Target,
    token: &prx_hooks::http::Token,
    query: &str,
    resume: &mut Resume,
    style: &Style,
    stdout: &std::io::Stdout,
    on_connect: &mut dyn FnMut(&Target),
) -> End {
    let open = match open(target, token, query, resume).await {
        Ok(open) => open,
        Err(end) => return end,
    };
    on_connect(target);
    let Open {
        mut body,
        conn,
        sender: _sender,
    } = open;
    let end = read_events(&mut body, target, resume, style, stdout).await;
    conn.abort();
    end
}

/// A stream the server answered 200 to: its body, the connection's task and the request's
/// sender (kept until the stream ends).
struct Open {
    body: Incoming,
    conn: tokio::task::JoinHandle<hyper::Result<()>>,
    sender: hyper::client::conn::http1::SendRequest<String>,
}

/// Connects and asks for the stream (resuming after `resume`'s last id). Any other answer
/// than 200 is an [`End`]: retried when retrying can mend it (429, 5xx), else the exit.
async fn open(
    target: &Target,
    token: &prx_hooks::http::Token,
    query: &str,
    resume: &Resume,
) -> Result<Open, End> {
    let io = match connect(target, Duration::from_secs(10)).await {
        Ok(io) => io,
        Err(e) => return Err(End::Retry(format!("cannot connect to {target}: {e}"))),
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake::<_, String>(TokioIo::new(io)).await {
            Ok(x) => x,
            Err(e) => return Err(End::Retry(format!("{target}: {e}"))),
        };
    let conn = tokio::spawn(conn);
    let (host, prefix) = match target {
        Target::Tcp { authority, prefix } => (authority.as_str(), prefix.as_str()),
        Target::Unix(_) => ("localhost", ""),
    };
    let mut req = hyper::Request::get(format!("{prefix}/api/events?{query}"))
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "text/event-stream")
        .header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", token.as_str()),
        )
        .header(
            hyper::header::USER_AGENT,
            concat!("prx-hooks-tail/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(id) = &resume.last_id {
        req = req.header("last-event-id", id.as_str());
    }
    let req = match req.body(String::new()) {
        Ok(r) => r,
        Err(e) => return Err(End::Exit(2, format!("cannot build the request: {e}"))),
    };
    let resp = match tokio::time::timeout(Duration::from_secs(30), sender.send_request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(End::Retry(format!("{target}: {e}"))),
        Err(_) => return Err(End::Retry(format!("{target}: no answer within 30 s"))),
    };
    let status = resp.status();
    let mut body = resp.into_body();
    if status != hyper::StatusCode::OK {
        let text = read_small(&mut body).await;
        let msg = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        // Server text: cut here, escaped when said.
        let msg = cut(&msg, 500);
        conn.abort();
        return Err(match status.as_u16() {
            429 | 502 | 503 | 504 => End::Retry(format!("{target}: {status}: {msg}")),
            s if s >= 500 => End::Retry(format!("{target}: {status}: {msg}")),
            _ => End::Exit(2, format!("{target}: {status}: {msg}")),
        });
    }
    Ok(Open { body, conn, sender })
}

/// Reads the stream's frames and shows their events until the stream ends, falls silent for
/// two keep-alive periods, or stdout fails.
async fn read_events(
    body: &mut Incoming,
    target: &Target,
    resume: &mut Resume,
    style: &Style,
    stdout: &std::io::Stdout,
) -> End {
    let mut parser = Parser::new(resume.max_event_bytes);
    loop {
        let wait = resume
            .keepalive
            .map_or(Duration::from_secs(45), |k| 2 * k + Duration::from_secs(5));
        let frame = tokio::time::timeout(
            wait,
            std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)),
        )
        .await;
        let bytes = match frame {
            Err(_) => {
                break End::Retry(format!(
                    "{target}: nothing received for {wait:?}; reconnecting"
                ));
            }
            Ok(None) => break End::Retry(format!("{target}: the stream ended")),
            Ok(Some(Err(e))) => break End::Retry(format!("{target}: {e}")),
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(b) => b,
                Err(_) => continue,
            },
        };
        let mut out = stdout.lock();
        let mut stop = None;
        for ev in parser.feed(&bytes) {
            match show(&ev, resume, style, target, &mut out) {
                Ok(None) => {}
                Ok(Some(end)) => {
                    stop = Some(end);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    stop = Some(End::StdoutClosed);
                    break;
                }
                Err(e) => {
                    stop = Some(End::Exit(2, format!("writing to stdout: {e}")));
                    break;
                }
            }
        }
        if stop.is_none() {
            match out.flush() {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    stop = Some(End::StdoutClosed)
                }
                Err(e) => stop = Some(End::Exit(2, format!("writing to stdout: {e}"))),
                Ok(()) => {}
            }
        }
        if let Some(end) = stop {
            break end;
        }
    }
}

/// An error response's body (at most 64 KiB of it).
async fn read_small(body: &mut Incoming) -> String {
    let mut out = Vec::new();
    while out.len() < 64 << 10 {
        match tokio::time::timeout(
            Duration::from_secs(10),
            std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)),
        )
        .await
        {
            Ok(Some(Ok(f))) => {
                if let Ok(b) = f.into_data() {
                    out.extend_from_slice(&b);
                }
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The most one event may hold (its lines and its data together) unless `--max-event-bytes`
/// says otherwise: the server's default `max_event_bytes` (4 MiB) at its worst escaping (× 6)
/// plus the envelope, with room to spare.
const MAX_EVENT_BYTES: usize = 32 << 20;

/// What tail refused or skipped, counted across connections; each kind is said on stderr
/// when first seen, and the totals when tail exits.
#[derive(Default)]
struct Refused {
    /// Items whose data was not a JSON object (not shown).
    not_json: u64,
    /// Events longer than the cap (skipped).
    oversize: u64,
    /// Event ids that cannot be sent back in `Last-Event-ID` (ignored).
    bad_id: u64,
    /// Event ids longer than `MAX_ID_BYTES` (ignored, never held).
    long_id: u64,
    /// Events whose name was longer than `MAX_NAME_BYTES` (skipped, never held).
    long_name: u64,
}

impl Refused {
    fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.not_json > 0 {
            parts.push(format!(
                "{} item(s) not shown (data not a JSON object)",
                self.not_json
            ));
        }
        if self.oversize > 0 {
            parts.push(format!("{} over-long event(s) skipped", self.oversize));
        }
        if self.bad_id > 0 {
            parts.push(format!("{} unusable event id(s) ignored", self.bad_id));
        }
        if self.long_id > 0 {
            parts.push(format!(
                "{} event id(s) over {MAX_ID_BYTES} bytes ignored",
                self.long_id
            ));
        }
        if self.long_name > 0 {
            parts.push(format!(
                "{} event(s) with a name over {MAX_NAME_BYTES} bytes skipped",
                self.long_name
            ));
        }
        (!parts.is_empty()).then(|| format!("in all: {}", parts.join(", ")))
    }
}

/// Prints (or acts on) one event. `Some(end)`: this connection is over.
fn show(
    ev: &Ev,
    resume: &mut Resume,
    style: &Style,
    target: &Target,
    out: &mut impl Write,
) -> std::io::Result<Option<End>> {
    if !admit(ev, resume, target) {
        return Ok(None);
    }
    if ev.data.is_empty() {
        // No data line: SSE dispatches no event (its id, if any, was taken above).
        return Ok(None);
    }
    let parse = || serde_json::from_str::<Value>(&ev.data).unwrap_or(Value::Null);
    match ev.event.as_str() {
        "ready" => {
            let data = parse();
            resume.keepalive = data["keepalive_ms"].as_u64().map(Duration::from_millis);
            if let Some(inst) = data["instance"].as_str() {
                resume.instance = Some(inst.to_string());
            }
            Ok(None)
        }
        "shutdown" => {
            let data = parse();
            let reason = data["reason"].as_str().unwrap_or("shutting down");
            Ok(Some(End::Retry(format!(
                "{target}: the server is going away ({})",
                cut(reason, 200)
            ))))
        }
        _ => show_item(ev, resume, style, target, out).map(|()| None),
    }
}

/// Takes the event's id for `Last-Event-ID` (or counts why not), and counts the events that
/// are skipped unread: false for those.
fn admit(ev: &Ev, resume: &mut Resume, target: &Target) -> bool {
    if let Some(id) = &ev.id {
        // An id is sent back as a header on the next connection: one that cannot be (a
        // control character) is ignored, and the last good one kept.
        if hyper::header::HeaderValue::from_str(id).is_ok() {
            resume.last_id = Some(id.clone());
        } else {
            resume.refused.bad_id += 1;
            if resume.refused.bad_id == 1 {
                say(&format!(
                    "ignored an event id from {target} that cannot be sent back ({}): a reconnection resumes after the last usable one (said once; counted)",
                    cut(id, 80)
                ));
            }
        }
    }
    if ev.long_id {
        // Sent back on every reconnect, it would make each request head that large.
        resume.refused.long_id += 1;
        if resume.refused.long_id == 1 {
            say(&format!(
                "ignored an event id from {target} longer than {MAX_ID_BYTES} bytes (this server's are <instance>-<n>, under 40), without holding it: a reconnection resumes after the last usable one (said once; counted)"
            ));
        }
    }
    if ev.long_name {
        resume.refused.long_name += 1;
        if resume.refused.long_name == 1 {
            say(&format!(
                "skipped an event from {target} whose name is longer than {MAX_NAME_BYTES} bytes (a bus topic is at most {MAX_NAME_BYTES}), without holding it (said once; counted)"
            ));
        }
        return false;
    }
    if ev.oversize {
        resume.refused.oversize += 1;
        if resume.refused.oversize == 1 {
            say(&format!(
                "skipped an event from {target} longer than {} bytes (--max-event-bytes), without holding it (said once; counted)",
                resume.max_event_bytes
            ));
        }
        return false;
    }
    true
}

/// One item of the stream: a bus message, run or plugin line on stdout; a loss notice
/// (`gap`, `dropped`) on stderr, and with `--json` on stdout too.
fn show_item(
    ev: &Ev,
    resume: &mut Resume,
    style: &Style,
    target: &Target,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let kind = match ev.event.as_str() {
        k @ ("gap" | "dropped" | "run" | "plugin") => Some(k),
        // A bus message (`message` is one whose topic is spelt like a notice).
        _ => None,
    };
    let json = if style.json {
        json_line(kind, &ev.data)
    } else {
        None
    };
    // With --json a bus message, run or plugin line is serialized from the text as it is: it
    // is parsed into a value only where one is read (a large event is not held twice more).
    let data = if style.json && !matches!(kind, Some("gap" | "dropped")) {
        Value::Null
    } else {
        serde_json::from_str::<Value>(&ev.data).unwrap_or(Value::Null)
    };
    let object = if style.json {
        json.is_some()
    } else {
        data.is_object()
    };
    if !object {
        resume.refused.not_json += 1;
        if resume.refused.not_json == 1 {
            say(&format!(
                "not shown: an item from {target} ({}) whose data is not a JSON object (said once; counted)",
                cut(&ev.event, 60)
            ));
        }
        return Ok(());
    }
    match kind {
        Some("gap") => say(&gap_line(&data)),
        Some("dropped") => say(&dropped_line(&data)),
        _ => {}
    }
    if let Some(line) = json {
        writeln!(out, "{line}")?;
    } else if !style.json {
        let line = match kind {
            Some("run") => run_line(&data),
            Some("plugin") => plugin_line(&data),
            Some(_) => return Ok(()),
            None => event_line(&data),
        };
        writeln!(out, "{}", line.render(style.color))?;
    }
    Ok(())
}

/// The stderr line of a `dropped` notice.
fn dropped_line(data: &Value) -> String {
    let n = data["count"].as_u64().unwrap_or(0);
    match data["reason"].as_str() {
        Some("client_queue_full") => format!(
            "lost {n} event(s): this terminal read too slowly for the server's queue ({} lost in all)",
            data["total"].as_u64().unwrap_or(n)
        ),
        _ => format!(
            "the server lost {n} {} before sending them (its stream's queue was full)",
            match data["source"].as_str() {
                Some("runs") => "run(s)",
                _ => "bus message(s)",
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("32MiB"), Ok(32 << 20));
        assert!(parse_size("12").is_err() && parse_size("1KB").is_err());
    }
}
