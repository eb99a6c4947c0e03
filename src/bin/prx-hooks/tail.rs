//! `prx-hooks tail`: follows a server's live stream (`GET /api/events`, README.md § The live
//! stream) and prints one line per event and per run, or one JSON object per line with
//! `--json`.
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
//! * **Terminal safety.** Payload text is agent- and LLM-controlled: every control character
//!   (escape sequences included) is printed escaped, never passed to the terminal.
//! * The HTTP client is hyper's client half on a current-thread tokio runtime: both are in the
//!   binary already (the server uses them), and the same code speaks over a unix socket.

use crate::BoxError;
use clap::Args;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prx_hooks::http::token;
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TailArgs {
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
    #[arg(long, value_name = "DURATION", value_parser = crate::parse_duration)]
    give_up: Option<Duration>,
}

/// Where the server is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    /// `host:port` to connect to, and the path prefix the API is mounted under.
    Tcp {
        authority: String,
        prefix: String,
    },
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tcp { authority, prefix } => write!(f, "http://{authority}{prefix}"),
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// `http://HOST:PORT[/PREFIX]`, `HOST:PORT`, or `unix:PATH`.
fn parse_url(url: &str) -> Result<Target, String> {
    let url = url.trim();
    if let Some(path) = url.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(format!("{url:?}: expected unix:PATH"));
        }
        return Ok(Target::Unix(path.into()));
    }
    if url.starts_with("https://") {
        return Err(format!(
            "{url:?}: TLS is not supported; use http:// (the API serves loopback) or unix:PATH"
        ));
    }
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!(
            "{url:?}: expected http://HOST:PORT[/PREFIX] or unix:PATH"
        ));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok(Target::Tcp {
        authority,
        prefix: prefix.to_string(),
    })
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

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

pub fn tail(args: TailArgs) -> Result<ExitCode, BoxError> {
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
}

async fn follow(args: &TailArgs, fixed: Option<Target>, query: &str, style: &Style) -> u8 {
    let mut resume = Resume::default();
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
                        eprintln!("prx-hooks tail: {what} {t}");
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
        match attempt {
            End::StdoutClosed => return 0,
            End::Exit(code, msg) => {
                eprintln!("prx-hooks tail: {msg}");
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
                        eprintln!("prx-hooks tail: {why}; retrying");
                        let since = outage.as_ref().map_or_else(Instant::now, |(t, _)| *t);
                        outage = Some((since, why));
                    }
                }
                if let (Some(limit), Some((since, _))) = (args.give_up, &outage)
                    && since.elapsed() >= limit
                {
                    eprintln!(
                        "prx-hooks tail: giving up after {} without a stream (--give-up)",
                        humantime::format_duration(Duration::from_secs(since.elapsed().as_secs()))
                    );
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

/// The connection's I/O, TCP or unix.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

async fn connect(target: &Target) -> std::io::Result<Box<dyn Io>> {
    let timeout = Duration::from_secs(10);
    let io: Box<dyn Io> = match target {
        Target::Tcp { authority, .. } => {
            let s =
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(authority.as_str()))
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                    })??;
            s.set_nodelay(true)?;
            Box::new(s)
        }
        Target::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
    };
    Ok(io)
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
    let io = match connect(target).await {
        Ok(io) => io,
        Err(e) => return End::Retry(format!("cannot connect to {target}: {e}")),
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake::<_, String>(TokioIo::new(io)).await {
            Ok(x) => x,
            Err(e) => return End::Retry(format!("{target}: {e}")),
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
        Err(e) => return End::Exit(2, format!("cannot build the request: {e}")),
    };
    let resp = match tokio::time::timeout(Duration::from_secs(30), sender.send_request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return End::Retry(format!("{target}: {e}")),
        Err(_) => return End::Retry(format!("{target}: no answer within 30 s")),
    };
    let status = resp.status();
    let mut body = resp.into_body();
    if status != hyper::StatusCode::OK {
        let text = read_small(&mut body).await;
        let msg = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(text);
        conn.abort();
        return match status.as_u16() {
            429 | 502 | 503 | 504 => End::Retry(format!("{target}: {status}: {msg}")),
            s if s >= 500 => End::Retry(format!("{target}: {status}: {msg}")),
            _ => End::Exit(2, format!("{target}: {status}: {msg}")),
        };
    }
    on_connect(target);
    let mut parser = Parser::default();
    let end = loop {
        let wait = resume
            .keepalive
            .map_or(Duration::from_secs(45), |k| 2 * k + Duration::from_secs(5));
        let frame = tokio::time::timeout(
            wait,
            std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)),
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
    };
    conn.abort();
    end
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

/// One event as SSE defines it.
#[derive(Default, Debug)]
struct Ev {
    id: Option<String>,
    event: String,
    data: String,
}

/// Incremental SSE parser: bytes in, whole events out (comments skipped).
#[derive(Default)]
struct Parser {
    line: Vec<u8>,
    ev: Ev,
    data: Vec<String>,
    any: bool,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8]) -> Vec<Ev> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            if line.is_empty() {
                if self.any {
                    let mut ev = std::mem::take(&mut self.ev);
                    ev.data = std::mem::take(&mut self.data).join("\n");
                    out.push(ev);
                    self.any = false;
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            self.any = true;
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => self.ev.id = Some(value.to_string()),
                "event" => self.ev.event = value.to_string(),
                "data" => self.data.push(value.to_string()),
                _ => {}
            }
        }
        out
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
    if let Some(id) = &ev.id {
        resume.last_id = Some(id.clone());
    }
    let data: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
    match ev.event.as_str() {
        "ready" => {
            resume.keepalive = data["keepalive_ms"].as_u64().map(Duration::from_millis);
            if let Some(inst) = data["instance"].as_str() {
                resume.instance = Some(inst.to_string());
            }
        }
        "shutdown" => {
            let reason = data["reason"].as_str().unwrap_or("shutting down");
            return Ok(Some(End::Retry(format!(
                "{target}: the server is going away ({reason})"
            ))));
        }
        "gap" => {
            eprintln!("prx-hooks tail: {}", gap_line(&data));
            if style.json {
                writeln!(out, "{}", typed("gap", &ev.data))?;
            }
        }
        "dropped" => {
            let n = data["count"].as_u64().unwrap_or(0);
            let line = match data["reason"].as_str() {
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
            };
            eprintln!("prx-hooks tail: {line}");
            if style.json {
                writeln!(out, "{}", typed("dropped", &ev.data))?;
            }
        }
        "run" => {
            if style.json {
                writeln!(out, "{}", typed("run", &ev.data))?;
            } else {
                writeln!(out, "{}", run_line(&data, style))?;
            }
        }
        "plugin" => {
            if style.json {
                writeln!(out, "{}", typed("plugin", &ev.data))?;
            } else {
                writeln!(out, "{}", plugin_line(&data, style))?;
            }
        }
        _ => {
            // A bus message (`message` is one whose topic is spelt like a notice).
            if style.json {
                writeln!(out, "{}", ev.data)?;
            } else {
                writeln!(out, "{}", event_line(&data, style))?;
            }
        }
    }
    Ok(None)
}

/// `{"type":"<kind>", …the object's members}`, the object's bytes otherwise untouched.
fn typed(kind: &str, data: &str) -> String {
    match data.strip_prefix('{') {
        Some(rest) if rest.trim_start().starts_with('}') => format!("{{\"type\":\"{kind}\"}}"),
        Some(rest) => format!("{{\"type\":\"{kind}\",{rest}"),
        None => format!("{{\"type\":\"{kind}\",\"data\":{data}}}"),
    }
}

fn gap_line(d: &Value) -> String {
    match d["reason"].as_str() {
        Some("evicted") => format!(
            "{} item(s) were lost while disconnected: the server's backlog no longer held them",
            d["missed"].as_u64().unwrap_or(0)
        ),
        Some("not_recorded") => {
            "events were lost while disconnected: the server stopped recording \
             (no client for a while), so how many is unknown"
                .to_string()
        }
        Some("other_instance") => format!(
            "the server restarted (stream {} is now {}): events emitted meanwhile were lost",
            d["last_event_id"]
                .as_str()
                .and_then(|s| s.rsplit_once('-'))
                .map_or("?", |(i, _)| i),
            d["instance"].as_str().unwrap_or("?")
        ),
        Some("unknown_id") => {
            "the server does not know where this tail left off; following from now".to_string()
        }
        _ => format!("events were lost: {d}"),
    }
}

/// `HH:MM:SS.mmm` of an RFC 3339 UTC time.
fn clock(t: &Value) -> String {
    t.as_str()
        .and_then(|s| s.get(11..23))
        .unwrap_or("--:--:--.---")
        .to_string()
}

/// Text an agent controls, made safe for a terminal: control characters escaped, cut to
/// `max` characters.
fn clean(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n >= max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The documented fields of each event (the rest are extras, shown as `key=value`).
fn documented(event: &str) -> &'static [&'static str] {
    match event {
        "agent_start" => &["agent", "session"],
        "agent_end" => &["success", "messages_count"],
        "llm_request" => &["provider", "model", "messages_count"],
        "llm_response" => &["provider", "model", "duration_ms", "success"],
        "tool_call_start" => &["tool", "arguments"],
        "tool_call" => &["tool", "success", "output"],
        "error" => &["component", "message"],
        _ => &[],
    }
}

fn event_line(env: &Value, style: &Style) -> String {
    let p = &env["payload"];
    let event = env["event"].as_str();
    let ok = |v: &Value| match v.as_bool() {
        Some(true) => style.paint("32", "ok"),
        Some(false) => style.paint("31", "failed"),
        None => "?".to_string(),
    };
    let mut summary = match event {
        Some("agent_start") => String::new(),
        Some("agent_end") => format!(
            "{}, {} messages",
            ok(&p["success"]),
            text(&p["messages_count"])
        ),
        Some("llm_request") => format!(
            "{} {}, {} messages",
            clean(&text(&p["provider"]), 40),
            clean(&text(&p["model"]), 60),
            text(&p["messages_count"])
        ),
        Some("llm_response") => format!(
            "{} {} {} ms {}",
            clean(&text(&p["provider"]), 40),
            clean(&text(&p["model"]), 60),
            text(&p["duration_ms"]),
            ok(&p["success"])
        ),
        Some("tool_call_start") => format!(
            "{} {}",
            clean(&text(&p["tool"]), 60),
            clean(&text(&p["arguments"]), 100)
        ),
        Some("tool_call") => format!(
            "{} {}: {}",
            clean(&text(&p["tool"]), 60),
            ok(&p["success"]),
            clean(&text(&p["output"]), 100)
        ),
        Some("error") => format!(
            "{}: {}",
            clean(&text(&p["component"]), 40),
            clean(&text(&p["message"]), 120)
        ),
        Some(_) => String::new(),
        None => clean(&p.to_string(), 120),
    };
    if let (Some(e), Value::Object(m)) = (event, p) {
        let known = documented(e);
        for (k, v) in m.iter().filter(|(k, _)| !known.contains(&k.as_str())) {
            if !summary.is_empty() {
                summary.push(' ');
            }
            summary.push_str(&format!("{}={}", clean(k, 40), clean(&text(v), 60)));
        }
    }
    let name = event.unwrap_or_else(|| env["topic"].as_str().unwrap_or("?"));
    let painted = match event {
        Some("error") => style.paint("1;31", &format!("{name:<15}")),
        Some(_) => style.paint("1", &format!("{name:<15}")),
        None => style.paint("35", &format!("{:<15}", clean(name, 60))),
    };
    let who = match (env["agent"].as_str(), env["session"].as_str()) {
        (Some(a), Some(s)) if !a.is_empty() || !s.is_empty() => {
            format!("{}/{}", clean(a, 40), clean(s, 40))
        }
        _ => "-".to_string(),
    };
    format!(
        "{}  {}  {}  {}",
        style.paint("2", &clock(&env["timestamp"])),
        style.paint("36", &who),
        painted,
        summary
    )
    .trim_end()
    .to_string()
}

fn run_line(r: &Value, style: &Style) -> String {
    let outcome = text(&r["outcome"]);
    let painted = match r["kind"].as_str() {
        Some("ok") => style.paint("32", &outcome),
        Some("skipped" | "dropped" | "cancelled") => style.paint("33", &clean(&outcome, 100)),
        _ => style.paint("31", &clean(&outcome, 100)),
    };
    let mut line = format!(
        "{}  {}  hook {} ({}{})  {}  {:.1} ms",
        style.paint("2", &clock(&r["time"])),
        style.paint("36", "run"),
        clean(&text(&r["id"]), 64),
        text(&r["event"]),
        if r["direct"].as_bool() == Some(true) {
            ", test"
        } else {
            ""
        },
        painted,
        r["duration_ms"].as_f64().unwrap_or(0.0)
    );
    let tail = text(&r["stderr_tail"]);
    let last = tail
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if !last.is_empty() && r["kind"].as_str() != Some("ok") {
        line.push_str(&format!("  stderr: {}", clean(last.trim(), 120)));
    }
    line
}

fn plugin_line(a: &Value, style: &Style) -> String {
    let parts = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|m| m.iter().map(|(k, n)| format!("{k} {n}")).collect())
            .unwrap_or_default()
    };
    let mut line = format!(
        "{}  {}  {}  {} call(s) in {} ms",
        style.paint("2", &clock(&a["time"])),
        style.paint("35", "plugin"),
        clean(&text(&a["plugin"]), 64),
        text(&a["calls"]),
        text(&a["interval_ms"]),
    );
    let results = parts(&a["results"]);
    if !results.is_empty() {
        line.push_str(&format!(": {}", results.join(", ")));
    }
    let dropped = parts(&a["dropped"]);
    if !dropped.is_empty() {
        line.push_str(&format!("; dropped {}", dropped.join(", ")));
    }
    if a["state"].as_str().is_some_and(|s| s != "running") {
        line.push_str(&format!(" [{}]", text(&a["state"])));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_addresses_parse() {
        assert_eq!(
            parse_url("http://127.0.0.1:7878").unwrap(),
            Target::Tcp {
                authority: "127.0.0.1:7878".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            parse_url("localhost:9/prx/").unwrap(),
            Target::Tcp {
                authority: "localhost:9".into(),
                prefix: "/prx".into()
            }
        );
        assert_eq!(
            parse_url("unix:/run/p.sock").unwrap(),
            Target::Unix("/run/p.sock".into())
        );
        assert!(parse_url("https://x:1").unwrap_err().contains("TLS"));
        assert!(parse_url("unix:").is_err());
    }

    #[test]
    fn sse_is_parsed_across_chunk_boundaries() {
        let mut p = Parser::default();
        assert!(p.feed(b"id: a-1\nevent: x\nda").is_empty());
        let evs = p.feed(b"ta: {}\n\n: keep-alive\n\nevent: y\r\ndata: 1\r\ndata: 2\r\n\r\n");
        assert_eq!(evs.len(), 2);
        assert_eq!(
            (
                evs[0].id.as_deref(),
                evs[0].event.as_str(),
                evs[0].data.as_str()
            ),
            (Some("a-1"), "x", "{}")
        );
        assert_eq!((evs[1].event.as_str(), evs[1].data.as_str()), ("y", "1\n2"));
    }

    #[test]
    fn agent_text_cannot_reach_the_terminal_as_escape_sequences() {
        assert_eq!(clean("a\x1b[2Jb\nc", 100), "a\\u{1b}[2Jb\\nc");
        assert_eq!(clean("abcdef", 3), "abc…");
        assert_eq!(typed("run", "{\"a\":1}"), "{\"type\":\"run\",\"a\":1}");
        assert_eq!(typed("gap", "{}"), "{\"type\":\"gap\"}");
    }
}
