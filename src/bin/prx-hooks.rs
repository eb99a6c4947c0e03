//! `prx-hooks`: run the hook pipeline over a workspace, or measure it.
//!
//! docs/cli.md is the contract for flags and output: data (bus messages, bench results) goes
//! to stdout; logs, line errors and stats go to stderr.

/// `eprintln!` that never panics: `run` goes on serving when its stderr is closed (a terminal
/// gone, `2>&1 | head -1`), and what it would have said is lost, not its work.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` that never panics: `validate`'s findings on a stdout that is gone (a closed
/// pipe, a full disk) are lost, its exit code is not.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[cfg(feature = "http")]
#[path = "prx-hooks/client.rs"]
mod client;
#[cfg(feature = "http")]
#[path = "prx-hooks/connect.rs"]
mod connect;
#[path = "prx-hooks/contain.rs"]
mod contain;
#[path = "prx-hooks/fire.rs"]
mod fire;
#[path = "prx-hooks/init.rs"]
mod init;
#[path = "prx-hooks/input.rs"]
mod input;
#[cfg(feature = "http")]
#[path = "prx-hooks/send.rs"]
mod send;
#[cfg(feature = "http")]
#[path = "prx-hooks/socket_ingest.rs"]
mod socket_ingest;
#[path = "prx-hooks/spool.rs"]
mod spool;
#[cfg(feature = "http")]
#[path = "prx-hooks/tail.rs"]
mod tail;
#[path = "prx-hooks/units.rs"]
mod units;
use contain::{contain, shell_limits};
#[path = "prx-hooks/validate.rs"]
mod validate;
use validate::validate;
#[path = "prx-hooks/bench.rs"]
mod bench;
use bench::bench;
use units::parse_duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use input::InputCounters;
use nix::sys::signal::{SigSet, Signal};
#[cfg(feature = "wasm")]
use prx_hooks::Sink;
use prx_hooks::{Emitter, Event, EventKind, Hooks, ndjson};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// `run --nats`, `run --from-nats`, `bench --nats` (docs/nats.md § NATS).
#[cfg(feature = "nats")]
#[path = "../cli/nats.rs"]
mod nats_cli;

/// `run --otlp` (docs/otel.md § OpenTelemetry traces).
#[cfg(feature = "otel")]
#[path = "../cli/otel.rs"]
mod otel_cli;

#[derive(Parser)]
#[command(
    name = "prx-hooks",
    version,
    about = "Lifecycle hooks for AI-agent runtimes that never slow the agent down"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    verbosity: Verbosity,
}

/// `-v`/`-q`: how much is logged on stderr (docs/cli.md § Logging).
#[derive(Args)]
struct Verbosity {
    /// Log more: -v adds debug (each hook's stderr tail), -vv trace. Overrides RUST_LOG.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log less: -q warnings and errors only, -qq errors only. Overrides RUST_LOG.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "verbose")]
    quiet: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pipeline over a workspace, emitting NDJSON events read from --events.
    Run(RunArgs),
    /// Drive the pipeline as hard as possible and report emit latency and throughput.
    Bench(BenchArgs),
    /// Check the workspace's hooks.json; every error as FILE:LINE:COL: PATH: reason.
    Validate(ValidateArgs),
    /// Run every hook for EVENT once, wait, and print one line per outcome.
    Fire(FireArgs),
    /// Create a working workspace in DIR: a sample hooks.json, its scripts, sample events, a
    /// README. Never overwrites anything.
    Init(init::InitArgs),
    /// Follow a running server's live stream: one line per event and per hook run.
    #[cfg(feature = "http")]
    Tail(tail::TailArgs),
    /// Deliver an agent hook's event(s) to the workspace's running server (or its spool):
    /// the command an agent's hook runs. Exits 0 unless --strict.
    #[cfg(feature = "http")]
    Send(send::SendArgs),
    /// Set an agent up to feed prx-hooks: write `send` (or an http hook) into Claude Code's,
    /// Codex's, Gemini CLI's or Cursor's own settings, keeping everything else byte for byte.
    #[cfg(feature = "http")]
    Connect(connect::ConnectArgs),
}

#[derive(Args)]
struct FireArgs {
    /// The event: agent_start, agent_end, llm_request, llm_response, tool_call_start,
    /// tool_call, turn_complete or error.
    event: String,
    /// The payload JSON (checked like an NDJSON payload), `@FILE` to read it from a file or
    /// `-` from stdin; without it a sample payload is used.
    #[arg(long, value_name = "JSON|@FILE|-")]
    payload: Option<String>,
    #[command(flatten)]
    limits: EventLimitArgs,
    /// The workspace directory (hooks.json, plugins/).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// One JSON object per outcome instead of text.
    #[arg(long)]
    json: bool,
    /// Run every enabled hook of the event whatever its matcher (by default a hook whose
    /// matcher does not match the payload's tool is skipped, as in `run`).
    #[arg(long)]
    ignore_matcher: bool,
    #[command(flatten)]
    contain: ContainArgs,
}

/// How hook processes are contained (`run` and `fire`).
#[derive(Args)]
struct ContainArgs {
    /// Run each hook in a cgroup v2 of its own: `auto` uses this process's cgroup when it is
    /// delegated to us (else hooks run without one, and the stats say why), `off` never, a
    /// directory that cgroup (which must work, or every hook fails to spawn).
    #[arg(long, value_name = "auto|off|DIR", default_value = "auto")]
    cgroup: String,
    /// A default limit for every hook, KEY=VALUE (repeatable; a hook's "limits" in hooks.json
    /// overrides it): cpu_seconds, open_files, core_bytes, file_size_bytes, memory_bytes,
    /// processes (the last two need a cgroup). Default: core_bytes=0.
    #[arg(long = "hook-limit", value_name = "KEY=VALUE")]
    hook_limit: Vec<String>,
    /// Make this process non-dumpable, so hooks (same user) cannot read its environment or
    /// memory through /proc; it also cannot be debugged or dump core.
    #[arg(long)]
    harden: bool,
}

#[derive(Args)]
struct ValidateArgs {
    /// The workspace directory (hooks.json, plugins/).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// Warnings are errors: exit 1 when there is any.
    #[arg(long)]
    strict: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The workspace directory (hooks.json, plugins/).
    #[arg(long, default_value = ".")]
    workspace: PathBuf,
    /// NDJSON events to emit, one object per line; `-` reads stdin. A FIFO is read as lines arrive.
    #[arg(long, value_name = "FILE|-")]
    events: Option<PathBuf>,
    /// Write every bus message to stdout as one JSON object per line.
    #[arg(long)]
    print: bool,
    /// Serve the HTTP API on ADDR (`127.0.0.1:7878`; a bare port binds 127.0.0.1; `unix:PATH`
    /// a unix socket, mode 0600) until SIGINT/SIGTERM. The address is written to
    /// <workspace>/.prx-hooks/address.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Also read NDJSON lines (the --events format) on a unix stream socket at PATH, mode
    /// 0600 (the file mode is the access rule: no token), until SIGINT/SIGTERM; each refused
    /// line is answered on the connection (docs/ingest.md).
    #[cfg(feature = "http")]
    #[arg(long, value_name = "unix:PATH")]
    ingest: Option<String>,
    /// Another name the API answers to in `Host` (repeatable; besides loopback addresses, the
    /// bound address and localhost); `*` turns the Host/Origin check off.
    #[arg(long, value_name = "NAME", requires = "listen")]
    allow_host: Vec<String>,
    /// The API token's file (mode 0600); else $PRX_HOOKS_TOKEN; else
    /// <workspace>/.prx-hooks/token, generated when absent.
    #[arg(long, value_name = "F", requires = "listen")]
    token_file: Option<PathBuf>,
    /// At the end of the input, wait at most this long for hooks still queued or running
    /// (`30s`, `1500ms`, `2m`; a bare number is seconds) before killing them. Default: the
    /// longest `timeout_ms` in hooks.json (plus 1 s), so every running hook gets its own
    /// timeout. SIGINT/SIGTERM drain for 2 s instead; a second one kills at once.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    drain_timeout: Option<Duration>,
    /// Accept events that lack documented payload fields (other than agent_start's agent and
    /// session, always taken from the envelope): the field is left out of the payload hooks
    /// see, counted per field in the final report, and warned about once per event and field.
    #[arg(long)]
    lenient: bool,
    #[command(flatten)]
    limits: EventLimitArgs,
    #[command(flatten)]
    contain: ContainArgs,
    /// Boxed: the NATS flags are many, and `Command`'s variants should stay alike in size.
    #[cfg(feature = "nats")]
    #[command(flatten)]
    nats: Box<nats_cli::NatsArgs>,
    #[cfg(feature = "otel")]
    #[command(flatten)]
    otel: otel_cli::OtelArgs,
}

/// The size limit of one event (`run`, `fire`, `bench`).
#[derive(Args)]
struct EventLimitArgs {
    /// The largest event accepted, in bytes (agent, session and payload strings together):
    /// larger ones are refused and reported as oversize.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_EVENT_BYTES)]
    max_event_bytes: usize,
}

/// The library's default `max_event_bytes` (docs/library.md § Configuration).
const DEFAULT_MAX_EVENT_BYTES: usize = 4 << 20;

#[derive(Args)]
struct BenchArgs {
    /// Events to emit, all producers together.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Producer threads, each with its own emitter.
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Bus subscribers reading every event.
    #[arg(long, default_value_t = 1)]
    subscribers: usize,
    /// Bytes of the `output` field of each tool_call event.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Print the results as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limits: EventLimitArgs,
    /// Measure the NATS bridge instead: events/s through it to the server at URL, and emit's
    /// cost with the bridge off and on.
    #[cfg(feature = "nats")]
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// With --nats: publish to this JetStream stream with acks.
    #[cfg(feature = "nats")]
    #[arg(long, value_name = "NAME", requires = "nats")]
    nats_stream: Option<String>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // `fire` runs as an agent's hook: its usage errors must not be 2, the agents'
            // "block" (docs/cli.md § Exit codes).
            return match e.exit_code() {
                0 => ExitCode::SUCCESS,
                _ if fire::fire_invoked() => ExitCode::from(fire::EX_USAGE),
                #[cfg(feature = "http")]
                _ if send_invoked() => ExitCode::from(send::EX_USAGE),
                code => ExitCode::from(code.clamp(1, 255) as u8),
            };
        }
    };
    init_tracing(&cli.verbosity, &cli.command);
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Bench(args) => bench(args),
        Command::Validate(args) => validate(args),
        Command::Fire(args) => return fire::fire_command(args),
        Command::Init(args) => init::init(args),
        #[cfg(feature = "http")]
        Command::Tail(args) => tail::tail(args),
        #[cfg(feature = "http")]
        Command::Send(args) => send::send(args),
        #[cfg(feature = "http")]
        Command::Connect(args) => connect::connect(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            say!("prx-hooks: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(feature = "http")]
/// Whether the command line runs `send` (its usage errors exit [`EX_USAGE`]).
pub fn send_invoked() -> bool {
    std::env::args_os()
        .skip(1)
        .find(|a| !a.as_encoded_bytes().starts_with(b"-"))
        .is_some_and(|a| a == "send")
}

/// The log filter: `-v`/`-q` when given, else `RUST_LOG`, else the command's default — info
/// (every hook run is a line), except for `fire`, which prints each outcome on stdout anyway
/// and logs warnings only.
fn log_filter(v: &Verbosity, command: &Command) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    let level = match (v.verbose, v.quiet) {
        (0, 0) => None,
        (1, _) => Some("info,prx_hooks=debug"),
        (_, 0) => Some("info,prx_hooks=trace"),
        (_, 1) => Some("warn"),
        (_, _) => Some("error"),
    };
    if let Some(level) = level {
        return EnvFilter::new(level);
    }
    EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(match command {
            Command::Fire(_) => "warn",
            #[cfg(feature = "http")]
            Command::Tail(_) | Command::Send(_) => "warn",
            _ => "info",
        })
    })
}

fn init_tracing(v: &Verbosity, command: &Command) {
    let filter = log_filter(v, command);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| QuietStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// stderr for the log, whose write errors are dropped: tracing-subscriber reports a failed
/// write with `eprintln!`, which panics when stderr is closed, and a panicking log call would
/// take the hook worker that logged with it.
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why `run` is finishing.
enum Finish {
    InputDone,
    Signal(Signal),
}

fn run(args: RunArgs) -> Result<ExitCode, BoxError> {
    // Block the termination signals before any thread exists, so every thread inherits the
    // mask and only the waiter below sees them. (Hook processes start with an empty mask and
    // default dispositions: the shell spawn resets both.)
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGHUP);
    signals.thread_block()?;

    let containment = contain(&args.contain)?;
    let builder = Hooks::builder()
        .workspace(&args.workspace)
        .shell_limits(shell_limits(&args.contain)?)
        .max_event_bytes(args.limits.max_event_bytes);
    #[cfg(feature = "nats")]
    let builder = args.nats.apply(builder, &args.workspace, args.lenient)?;
    #[cfg(feature = "otel")]
    let builder = args.otel.apply(builder)?;
    let hooks = Arc::new(builder.build()?);
    // The printer subscribes before the API opens: what a client posts as soon as the
    // address file exists is printed too.
    let printer = if args.print {
        Some(start_printer(&hooks)?)
    } else {
        None
    };
    let mut server = match &args.listen {
        Some(addr) => Some(start_api(&hooks, &args, addr)?),
        None => None,
    };
    // What `prx-hooks send` kept while no server answered (spool.rs), before any new input.
    let spooled = spool::replay_at_start(&hooks, &args.workspace);
    #[cfg(feature = "http")]
    let socket = match &args.ingest {
        Some(arg) => {
            let s = socket_ingest::SocketIngest::start_arg(
                hooks.clone(),
                arg,
                args.lenient,
                args.limits.max_event_bytes,
            )?;
            tracing::info!("reading NDJSON on unix:{}", s.path().display());
            Some(s)
        }
        None => None,
    };
    #[cfg(feature = "http")]
    let serving = server.is_some() || socket.is_some();
    #[cfg(not(feature = "http"))]
    let serving = server.is_some();

    let (done_tx, done_rx) = mpsc::channel();
    let tx = done_tx.clone();
    let reloader = hooks.clone();
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stops = 0u32;
            while let Ok(sig) = signals.wait() {
                if sig != Signal::SIGHUP {
                    stops += 1;
                    if stops >= 2 {
                        second_signal(&reloader, sig);
                    }
                    let _ = tx.send(Finish::Signal(sig));
                    continue;
                }
                match reloader.reload() {
                    Some(outcome) => {
                        tracing::info!("SIGHUP: hooks.json {outcome:?}; plugins rescanned")
                    }
                    None => tracing::info!("SIGHUP: no workspace to reload"),
                }
            }
        })?;

    let input = Arc::new(InputCounters::default());
    // Set at the first SIGINT/SIGTERM: the input stops (a FIFO after what it still holds).
    let stop_input = Arc::new(AtomicBool::new(false));
    let mut reading = args.events.is_some();
    if let Some(path) = args.events.clone() {
        let (hooks, input, tx) = (hooks.clone(), input.clone(), done_tx.clone());
        let reader = input::open_events(&path, stop_input.clone())?;
        let name = if path.as_os_str() == "-" {
            "-".to_string()
        } else {
            path.display().to_string()
        };
        let opts = prx_hooks::ingest::IngestOptions::default().lenient(args.lenient);
        let stop = stop_input.clone();
        thread::Builder::new()
            .name("ndjson".into())
            .spawn(move || {
                if let Err(e) = input::ingest(&hooks, reader, &name, &input, opts, &stop) {
                    input.read_error.store(true, Ordering::Relaxed);
                    say!("{name}: read error: {e}");
                }
                let _ = tx.send(Finish::InputDone);
            })?;
    }
    drop(done_tx);

    // With the API, the end of the input is not the end: serve until a signal.
    let finish = loop {
        match done_rx.recv() {
            Ok(Finish::Signal(sig)) => {
                tracing::info!("{sig}: draining for {SIGNAL_DRAIN:?} and exiting");
                if reading {
                    stop_reading(&stop_input, &done_rx);
                }
                break Finish::Signal(sig);
            }
            Ok(Finish::InputDone) if serving || consumes_nats(&args) => {
                reading = false;
            }
            Ok(Finish::InputDone) | Err(_) => break Finish::InputDone,
        }
    };
    let deadline = match finish {
        Finish::InputDone => {
            drain_input_end(&hooks, args.drain_timeout, &done_rx, drain_floor(&args))
        }
        Finish::Signal(_) => Instant::now() + SIGNAL_DRAIN,
    };
    if let Some(server) = server.as_mut() {
        server.shutdown(Duration::from_secs(2));
        #[cfg(feature = "http")]
        prx_hooks::http::token::remove_address(&args.workspace, &server.listen().to_string());
    }
    #[cfg(feature = "http")]
    let socket_stats = socket.map(|s| s.shutdown());
    #[cfg(not(feature = "http"))]
    let socket_stats: Option<()> = None;
    hooks.shutdown(otel_flush(&args, deadline).saturating_duration_since(Instant::now()));
    let contained = containment.finish();
    if let Some(printer) = printer {
        let _ = printer.join();
    }
    let stats = hooks.stats();
    // docs/cli.md § Exit codes: a line refused (or lost to a full ring or byte budget) is 1. Said
    // before the report, which stays the last line of stderr.
    // Every oversize line was said by `ingest` and (when anything listens) refused by `emit`
    // too: the same events, counted once.
    let oversize = stats.oversize.max(input.oversize.load(Ordering::Relaxed));
    let lost = input.bad_lines.load(Ordering::Relaxed)
        + input.refused.load(Ordering::Relaxed)
        + stats.dropped
        + stats.dropped_budget
        + oversize
        + nats_lost(&stats);
    let failed = lost > 0 || input.read_error.load(Ordering::Relaxed);
    if lost > 0 {
        let refused = match input.refused.load(Ordering::Relaxed) {
            0 => String::new(),
            n => format!(", {n} refused by the session map at shutdown"),
        };
        say!(
            "prx-hooks: {} line(s) refused, {} event(s) dropped (ring full or byte budget), {oversize} oversize{refused}; exiting 1",
            input.bad_lines.load(Ordering::Relaxed),
            stats.dropped + stats.dropped_budget,
        );
    }
    let report = serde_json::json!({
        "input": input.report(),
        "stats": &stats,
        "containment": contained,
        "spool": spooled,
        "ingest_socket": socket_stats,
    });
    say!("{report}");
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// How long the first SIGINT/SIGTERM waits for the input to stop (a FIFO: to hand over what
/// it still holds) before the drain begins.
const STOP_INPUT: Duration = Duration::from_secs(1);

/// The first SIGINT/SIGTERM: stops the input — a file at its next line, a FIFO after the
/// lines it still holds (written before the signal) — and waits for that, at most
/// [`STOP_INPUT`] (stdin blocked in a read is left behind).
fn stop_reading(stop: &AtomicBool, done: &mpsc::Receiver<Finish>) {
    stop.store(true, Ordering::Release);
    let deadline = Instant::now() + STOP_INPUT;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match done.recv_timeout(left) {
            Ok(Finish::InputDone) | Err(_) => return,
            Ok(Finish::Signal(_)) => {}
        }
    }
}

/// How long SIGINT/SIGTERM lets queued and running hooks finish.
const SIGNAL_DRAIN: Duration = Duration::from_secs(2);

/// Beyond the longest hook timeout, for the last timed-out hook to be reaped and counted as
/// timed out (not as killed at shutdown).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// A second SIGINT/SIGTERM: every hook is killed now instead of at the drain deadline.
fn second_signal(hooks: &Hooks, sig: Signal) {
    tracing::warn!("{sig} again: killing every running hook now");
    if let Some(shell) = hooks.shell() {
        shell.kill_now();
    }
}

/// `run` at the end of its input: lets what was emitted run to its end — every hook under its
/// own timeout — until the pipeline and every backend are idle, or the drain deadline
/// (`--drain-timeout`, default the longest hook timeout + [`DRAIN_GRACE`]). A signal cuts it
/// to [`SIGNAL_DRAIN`]. Returns the deadline to shut down with.
fn drain_input_end(
    hooks: &Hooks,
    cap: Option<Duration>,
    signals: &mpsc::Receiver<Finish>,
    floor: Duration,
) -> Instant {
    let start = Instant::now();
    let longest = hooks
        .hook_table()
        .actions
        .iter()
        .filter(|a| a.enabled)
        .map(|a| a.timeout)
        .max()
        .unwrap_or_default();
    let deadline = start + cap.unwrap_or((longest + DRAIN_GRACE).max(floor));
    let mut said = false;
    loop {
        if idle(hooks) {
            return Instant::now();
        }
        if !said {
            said = true;
            tracing::info!(
                "end of input: waiting up to {:?} for hooks still queued or running ({})",
                deadline - start,
                if cap.is_some() {
                    "--drain-timeout"
                } else {
                    "their longest timeout; --drain-timeout changes it"
                }
            );
        }
        let now = Instant::now();
        if now >= deadline {
            tracing::warn!(
                "drain deadline reached after {:?}: killing what is still running",
                now - start
            );
            return now;
        }
        match signals.recv_timeout((deadline - now).min(Duration::from_millis(10))) {
            Ok(Finish::Signal(sig)) => {
                tracing::info!("{sig}: draining for {SIGNAL_DRAIN:?} and exiting");
                return Instant::now() + SIGNAL_DRAIN;
            }
            Ok(Finish::InputDone) | Err(_) => {}
        }
    }
}

/// Nothing queued in the rings or being delivered, and no backend with work in flight.
fn idle(hooks: &Hooks) -> bool {
    let stats = hooks.stats();
    // `processed` counts a batch before the sinks get it: what settles the drain is what the
    // sinks were handed, then their in_flight, read after it.
    if hooks.handed_over() + stats.dropped_shutdown < stats.queued {
        return false;
    }
    let stats = hooks.stats();
    stats.sinks.iter().all(|s| s.counts.in_flight == 0) && nats_idle(&stats)
}

/// The NATS publisher has sent and had confirmed everything it was given.
fn nats_idle(_stats: &prx_hooks::Stats) -> bool {
    #[cfg(feature = "nats")]
    return nats_cli::idle(_stats);
    #[cfg(not(feature = "nats"))]
    true
}

/// Events the NATS publisher lost (dropped while the server was unreachable, left at the
/// deadline, refused by the server): like ring drops, they make `run` exit 1.
fn nats_lost(_stats: &prx_hooks::Stats) -> u64 {
    #[cfg(feature = "nats")]
    if let Some(p) = _stats.nats().and_then(|n| n.publish.as_ref()) {
        let lost = p.dropped + p.dropped_shutdown + p.failed;
        if lost > 0 {
            say!(
                "prx-hooks: NATS publisher lost {lost} event(s): {} to a full buffer, {} left at shutdown, {} refused by the server",
                p.dropped,
                p.dropped_shutdown,
                p.failed
            );
        }
        return lost;
    }
    0
}

/// With `--from-nats`, the end of `--events` is not the end: consume until a signal.
fn consumes_nats(_args: &RunArgs) -> bool {
    #[cfg(feature = "nats")]
    return _args.nats.consumes();
    #[cfg(not(feature = "nats"))]
    false
}

/// The shutdown deadline, giving the OpenTelemetry exporter time to send the spans that only
/// end at shutdown (open ones) and what it still holds; it returns as soon as they are sent.
fn otel_flush(_args: &RunArgs, deadline: Instant) -> Instant {
    #[cfg(feature = "otel")]
    if _args.otel.exports() {
        return deadline.max(Instant::now() + otel_cli::FLUSH);
    }
    deadline
}

/// How long the end of the input waits at least (the NATS publisher may be reconnecting).
fn drain_floor(_args: &RunArgs) -> Duration {
    #[cfg(feature = "nats")]
    if _args.nats.publishes() {
        return nats_cli::PUBLISH_DRAIN;
    }
    Duration::ZERO
}

#[cfg(feature = "http")]
type ApiServer = prx_hooks::http::Server;
#[cfg(not(feature = "http"))]
struct ApiServer;
#[cfg(not(feature = "http"))]
impl ApiServer {
    fn shutdown(&mut self, _: Duration) {}
}

/// Starts the HTTP API, writes its address beside the token, and says on stderr where it
/// listens and where its token is.
#[cfg(feature = "http")]
fn start_api(hooks: &Arc<Hooks>, args: &RunArgs, addr: &str) -> Result<ApiServer, BoxError> {
    use prx_hooks::http::{EventStreamOptions, HttpOptions, Server, token};
    let listen = listen_addr(addr)?;
    let env = std::env::var(token::TOKEN_ENV).ok();
    let (token, source) =
        token::resolve(args.token_file.as_deref(), env.as_deref(), &args.workspace)?;
    raise_nofile();
    // The live stream keeps its backlog from the start, so `tail --last N` shows what the
    // replay did before anyone watched.
    let opts = HttpOptions::new(token)
        .allow_hosts(&args.allow_host)
        .events(EventStreamOptions::default().record_always(true));
    let server = match &listen {
        Listen::Tcp(addr) => Server::start(hooks.clone(), opts, *addr),
        Listen::Unix(path) => Server::start_unix(hooks.clone(), opts, path),
    }
    .map_err(|e| format!("--listen {addr}: {e}"))?;
    if let Listen::Tcp(addr) = listen
        && !server.local_addr().ip().is_loopback()
    {
        tracing::warn!(
            "the API listens on {addr}, beyond this machine: anyone with the token can run commands"
        );
    }
    let address = server.listen().to_string();
    let file = token::write_address(&args.workspace, &address)?;
    say!("prx-hooks: HTTP API on {address}");
    say!("prx-hooks: address written to {}", file.display());
    say!("prx-hooks: {source}");
    Ok(server)
}

/// Raises the soft RLIMIT_NOFILE to the hard one: the API's connection cap is what is left
/// of it after the hooks' needs (said once if it cannot be raised).
#[cfg(feature = "http")]
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
    }
}

#[cfg(feature = "http")]
use prx_hooks::http::Listen;

#[cfg(not(feature = "http"))]
fn start_api(_: &Arc<Hooks>, _: &RunArgs, _: &str) -> Result<ApiServer, BoxError> {
    Err("--listen: this prx-hooks was built without the `http` feature".into())
}

/// `127.0.0.1:7878`, `[::1]:7878`, `localhost:7878`, a bare port (on 127.0.0.1), or
/// `unix:PATH`.
#[cfg(feature = "http")]
fn listen_addr(addr: &str) -> Result<Listen, BoxError> {
    if let Some(path) = addr.strip_prefix("unix:") {
        if path.is_empty() {
            return Err(format!("--listen {addr:?}: expected unix:PATH").into());
        }
        return Ok(Listen::Unix(path.into()));
    }
    if let Ok(port) = addr.parse::<u16>() {
        return Ok(Listen::Tcp(([127, 0, 0, 1], port).into()));
    }
    if let Some(port) = addr.strip_prefix("localhost:") {
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("--listen {addr:?}: bad port"))?;
        return Ok(Listen::Tcp(([127, 0, 0, 1], port).into()));
    }
    addr.parse().map(Listen::Tcp).map_err(|_| {
        format!(
            "--listen {addr:?}: expected IP:PORT (127.0.0.1:7878), localhost:PORT, PORT or \
             unix:PATH"
        )
        .into()
    })
}

/// Waits (briefly, repeatedly) while the rings are a quarter full (so no single ring can fill)
/// or a subscriber queue is half full.
fn pace(hooks: &Hooks) {
    let busy = || {
        hooks.pending() > hooks.capacity() / 4
            || hooks
                .bus()
                .subscribers()
                .iter()
                .any(|s| s.queued > s.capacity / 2)
    };
    while busy() {
        thread::sleep(Duration::from_micros(200));
    }
}

/// Prints every bus message to stdout until the bus closes.
fn start_printer(hooks: &Hooks) -> Result<thread::JoinHandle<()>, BoxError> {
    let sub = hooks.bus().subscribe("*")?;
    Ok(thread::Builder::new().name("print".into()).spawn(move || {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let mut buf = Vec::with_capacity(1 << 16);
        while let Ok(first) = sub.recv() {
            for msg in std::iter::once(first).chain(sub.try_iter()) {
                msg.write_envelope(&mut buf);
                buf.push(b'\n');
                if buf.len() > 1 << 15 {
                    if out.write_all(&buf).is_err() {
                        return;
                    }
                    buf.clear();
                }
            }
            if out.write_all(&buf).and_then(|()| out.flush()).is_err() {
                return; // stdout closed: nothing more to do
            }
            buf.clear();
        }
    })?)
}
