//! `prx-hooks run`: the hook pipeline over a workspace, from start to drain and report.
//!
//! The pipeline is fed by `--events`, the API, the ingest socket, the spool and NATS until the
//! input ends or a signal comes; then the drain and the report on stderr (docs/cli.md § `run`).

use crate::contain::{Containment, contain, shell_limits};
use crate::input::{self, InputCounters};
#[cfg(feature = "nats")]
use crate::nats_cli;
#[cfg(feature = "otel")]
use crate::otel_cli;
#[cfg(feature = "http")]
use crate::socket_ingest;
use crate::spool_replay;
use crate::units::parse_duration;
use crate::{BoxError, ContainArgs, EventLimitArgs};
use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use prx_hooks::Hooks;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Args)]
pub(crate) struct RunArgs {
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
    /// At a Claude Code or Codex turn's end sent from this machine, read the transcript it
    /// names for the turn's model calls: `llm_request` / `llm_response` events with their
    /// models, times and tokens (no content; docs/agents.md § Transcripts).
    #[cfg(feature = "http")]
    #[arg(long, requires = "listen")]
    transcripts: bool,
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
    /// End with the whole report as one JSON object on stderr (what stats.json holds, plus the
    /// input's, spool's and containment's counts) even on a terminal, where a one-line summary
    /// is said instead. Without a terminal the JSON is always written.
    #[arg(long)]
    stats_json: bool,
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

/// Why `run` is finishing.
enum Finish {
    InputDone,
    Signal(Signal),
}

/// `run`: start, feed, wait for the end, drain, stop, report. Exit 1 when anything was lost
/// (docs/cli.md § Exit codes).
pub(crate) fn run(args: RunArgs) -> Result<ExitCode, BoxError> {
    check_workspace(&args.workspace)?;
    let signals = block_signals()?;
    let containment = contain(&args.contain)?;
    // Set at the first SIGINT/SIGTERM: the spool's replay stops, and the input (a FIFO after
    // what it still holds).
    let stop_input = Arc::new(AtomicBool::new(false));
    // Opened before anything is replayed or served: a missing file changes nothing.
    let events = match &args.events {
        Some(path) => Some((path, input::open_events(path, stop_input.clone())?)),
        None => None,
    };
    let hooks = Arc::new(build(&args)?);
    keep_runs(&hooks, &args.workspace);
    let (done_tx, done_rx) = mpsc::channel();
    // Signals are watched before the replay starts, so that they can stop it. From here on
    // every way out shuts the hook system down (a thread holding it keeps `Drop` from it).
    let started = watch_signals(signals, hooks.clone(), done_tx.clone(), stop_input.clone())
        .and_then(|()| Front::start(&hooks, &args, &stop_input));
    let front = match started {
        Ok(front) => front,
        Err(e) => {
            hooks.shutdown(SIGNAL_DRAIN);
            drop(containment.finish());
            return Err(e);
        }
    };
    let input = Arc::new(InputCounters::default());
    if let Some((path, reader)) = events
        && let Err(e) = read_events(
            &hooks,
            path,
            reader,
            &args,
            &input,
            &stop_input,
            done_tx.clone(),
        )
    {
        let ended = front.shutdown(&hooks, &args, Instant::now() + SIGNAL_DRAIN, containment);
        say!("prx-hooks: --events {}: {e}", path.display());
        report(&hooks, &args, &input, ended);
        return Ok(ExitCode::from(1));
    }
    drop(done_tx);

    let finish = wait_for_end(&args, front.serving(), &stop_input, &done_rx);
    let deadline = match finish {
        Finish::InputDone => {
            drain_input_end(&hooks, args.drain_timeout, &done_rx, drain_floor(&args))
        }
        Finish::Signal(_) => Instant::now() + SIGNAL_DRAIN,
    };
    let ended = front.shutdown(&hooks, &args, deadline, containment);
    Ok(report(&hooks, &args, &input, ended))
}

/// Hook runs are kept in `<workspace>/.prx-hooks/runs.ndjson` across restarts (the console's
/// and the API's run history); one that cannot be kept is said once, and `run` goes on.
fn keep_runs(hooks: &Hooks, workspace: &std::path::Path) {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let Some(shell) = hooks.shell() else { return };
    let dir = workspace.join(".prx-hooks");
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .and_then(|()| match std::fs::symlink_metadata(&dir) {
            Ok(m)
                if m.is_dir()
                    && (m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o022 != 0) =>
            {
                Err(std::io::Error::other(format!(
                    "{} is another user's or writable by others: the runs file is not kept there",
                    dir.display()
                )))
            }
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(std::io::Error::other(format!(
                "{} is not a directory (a link is not followed)",
                dir.display()
            ))),
            Err(e) => Err(e),
        });
    let kept = made.and_then(|()| shell.keep_runs(&dir.join(RUN_LOG)));
    match kept {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            "{n} hook run(s) read back from {}",
            dir.join(RUN_LOG).display()
        ),
        Err(e) => tracing::warn!("hook runs are not kept across restarts: {e}"),
    }
}

/// The file [`keep_runs`] uses, in `<workspace>/.prx-hooks/`.
const RUN_LOG: &str = "runs.ndjson";

/// A workspace that is not there is a set-up error that says how to make one.
fn check_workspace(ws: &std::path::Path) -> Result<(), BoxError> {
    match std::fs::metadata(ws) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("workspace {}: not a directory", ws.display()).into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "workspace {} does not exist: make one with `prx-hooks init {}` (hooks.json, \
             sample hooks and events), or give --workspace an existing directory",
            ws.display(),
            ws.display()
        )
        .into()),
        Err(e) => Err(format!("workspace {}: {e}", ws.display()).into()),
    }
}

/// Blocks the termination signals before any thread exists, so every thread inherits the
/// mask and only the waiter ([`watch_signals`]) sees them. (Hook processes start with an empty
/// mask and default dispositions: the shell spawn resets both.)
fn block_signals() -> Result<SigSet, BoxError> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGHUP);
    signals.thread_block()?;
    Ok(signals)
}

/// The pipeline, with the workspace, the hook limits and the NATS and OpenTelemetry flags.
fn build(args: &RunArgs) -> Result<Hooks, BoxError> {
    let builder = Hooks::builder()
        .workspace(&args.workspace)
        .shell_limits(shell_limits(&args.contain)?)
        .max_event_bytes(args.limits.max_event_bytes);
    #[cfg(feature = "nats")]
    let builder = args.nats.apply(builder, &args.workspace, args.lenient)?;
    #[cfg(feature = "otel")]
    let builder = args.otel.apply(builder)?;
    Ok(builder.build()?)
}

/// What `run` starts around the pipeline (all optional): the printer, the API, the spool's
/// replay and the ingest socket.
struct Front {
    printer: Option<thread::JoinHandle<()>>,
    server: Option<ApiServer>,
    /// The spool replay's report.
    spooled: Option<serde_json::Value>,
    #[cfg(feature = "http")]
    socket: Option<socket_ingest::SocketIngest>,
}

/// What the front reports once stopped.
struct Ended {
    spooled: Option<serde_json::Value>,
    #[cfg(feature = "http")]
    socket: Option<socket_ingest::SocketStats>,
    #[cfg(not(feature = "http"))]
    socket: Option<()>,
    contained: serde_json::Value,
}

impl Front {
    fn start(hooks: &Arc<Hooks>, args: &RunArgs, stop: &AtomicBool) -> Result<Front, BoxError> {
        // The printer subscribes before the API opens: what a client posts as soon as the
        // address file exists is printed too.
        let printer = if args.print {
            Some(start_printer(hooks)?)
        } else {
            None
        };
        let server = match &args.listen {
            Some(addr) => Some(start_api(hooks, args, addr)?),
            None => None,
        };
        // What `prx-hooks send` kept while no server answered (spool.rs), before any new input.
        let spooled = spool_replay::replay_at_start(hooks, &args.workspace, stop);
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
        Ok(Front {
            printer,
            server,
            spooled,
            #[cfg(feature = "http")]
            socket,
        })
    }

    /// The API or the ingest socket is open: the end of `--events` is not the end.
    fn serving(&self) -> bool {
        #[cfg(feature = "http")]
        return self.server.is_some() || self.socket.is_some();
        #[cfg(not(feature = "http"))]
        self.server.is_some()
    }

    /// Stops the socket's readers (at once: one waiting for room must not wait for the
    /// pipeline, which closes after them), the API, joins the socket's readers, then stops the
    /// pipeline (by `deadline`, or later for the OpenTelemetry flush), then the containment;
    /// joins the printer.
    fn shutdown(
        self,
        hooks: &Hooks,
        args: &RunArgs,
        deadline: Instant,
        containment: Containment,
    ) -> Ended {
        #[cfg(feature = "http")]
        let mut socket = self.socket;
        #[cfg(feature = "http")]
        if let Some(s) = &mut socket {
            s.stop();
        }
        if let Some(mut server) = self.server {
            server.shutdown(Duration::from_secs(2));
            #[cfg(feature = "http")]
            prx_hooks::http::token::remove_address(&args.workspace, &server.listen().to_string());
        }
        #[cfg(feature = "http")]
        let socket = socket.map(|s| s.shutdown());
        #[cfg(not(feature = "http"))]
        let socket: Option<()> = None;
        hooks.shutdown(otel_flush(args, deadline).saturating_duration_since(Instant::now()));
        let contained = containment.finish();
        if let Some(printer) = self.printer {
            let _ = printer.join();
        }
        Ended {
            spooled: self.spooled,
            socket,
            contained,
        }
    }
}

/// Starts the thread that alone receives SIGINT, SIGTERM and SIGHUP: SIGHUP reloads the
/// workspace; the others end `run`, and a second one kills every running hook at once.
fn watch_signals(
    signals: SigSet,
    reloader: Arc<Hooks>,
    tx: mpsc::Sender<Finish>,
    stop: Arc<AtomicBool>,
) -> Result<(), BoxError> {
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stops = 0u32;
            while let Ok(sig) = signals.wait() {
                if sig != Signal::SIGHUP {
                    stop.store(true, Ordering::Release);
                    if stops == 0 {
                        tracing::info!("{sig}: stopping the input and draining");
                    }
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
    Ok(())
}

/// Starts the thread that emits the NDJSON lines of `--events`; it sends
/// [`Finish::InputDone`] at the end of the input.
fn read_events(
    hooks: &Arc<Hooks>,
    path: &Path,
    reader: input::Input,
    args: &RunArgs,
    input: &Arc<InputCounters>,
    stop_input: &Arc<AtomicBool>,
    tx: mpsc::Sender<Finish>,
) -> Result<(), BoxError> {
    let (hooks, input) = (hooks.clone(), input.clone());
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
    Ok(())
}

/// Waits for what ends `run`: a signal, or the end of the input. With the API, the ingest
/// socket or `--from-nats`, the end of the input is not the end: `run` serves until a signal.
fn wait_for_end(
    args: &RunArgs,
    serving: bool,
    stop_input: &AtomicBool,
    done_rx: &mpsc::Receiver<Finish>,
) -> Finish {
    let mut reading = args.events.is_some();
    loop {
        match done_rx.recv() {
            Ok(Finish::Signal(sig)) => {
                tracing::info!("{sig}: draining for {SIGNAL_DRAIN:?} and exiting");
                if reading {
                    stop_reading(stop_input, done_rx);
                }
                break Finish::Signal(sig);
            }
            Ok(Finish::InputDone) if serving || consumes_nats(args) => {
                reading = false;
            }
            Ok(Finish::InputDone) | Err(_) => break Finish::InputDone,
        }
    }
}

/// The end of `run`, on stderr: what was lost in one line, then the report (the last line).
/// Exit 1 when anything was lost or the input failed to read.
fn report(hooks: &Hooks, args: &RunArgs, input: &InputCounters, ended: Ended) -> ExitCode {
    let stats = hooks.stats();
    // docs/cli.md § Exit codes: a line refused (or lost to a full ring or byte budget) is 1. Said
    // before the report, which stays the last line of stderr.
    // Every oversize line was said by `ingest` and (when anything listens) refused by `emit`
    // too: the same events, counted once.
    // The exporters say what they lost on lines of their own.
    let oversize = stats.oversize.max(input.oversize.load(Ordering::Relaxed));
    let lines_lost = input.bad_lines.load(Ordering::Relaxed)
        + input.refused.load(Ordering::Relaxed)
        + stats.dropped
        + stats.dropped_budget
        + oversize;
    let lost = lines_lost + nats_lost(&stats) + otel_lost(&stats);
    let failed = lost > 0 || input.read_error.load(Ordering::Relaxed);
    if lines_lost > 0 {
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
        "containment": ended.contained,
        "spool": ended.spooled,
        "ingest_socket": ended.socket,
    });
    if args.stats_json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        say!("{report}");
    } else {
        say!("{}", summary(&stats, lost));
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The end of a run for a person at a terminal: what was processed and lost, in one line.
/// `lost` is what makes the exit code 1 (refused lines, drops, exporters' losses); events
/// still queued at the drain's deadline are said apart.
fn summary(stats: &prx_hooks::Stats, lost: u64) -> String {
    let late = match stats.dropped_shutdown {
        0 => String::new(),
        n => format!(", {n} still queued at the deadline"),
    };
    let failed: Vec<String> = stats
        .sinks
        .iter()
        .filter(|s| s.counts.failed + s.counts.dropped > 0)
        .map(|s| {
            format!(
                "{} {} failed, {} dropped",
                s.name, s.counts.failed, s.counts.dropped
            )
        })
        .collect();
    let failed = match failed.is_empty() {
        true => String::new(),
        false => format!("; {}", failed.join("; ")),
    };
    let unheard = match stats.skipped {
        0 => String::new(),
        n => format!(", {n} that nothing listened to"),
    };
    format!(
        "prx-hooks: stopped: {} event(s), {} processed{unheard}, {lost} lost{late}{failed} (the \
         whole report: run --stats-json)",
        stats.emitted, stats.processed
    )
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

/// What the OpenTelemetry exporter lost — spans dropped for a full export queue, given up after
/// retrying, refused by the receiver or left at shutdown, and events its span builder had no
/// room for — said in one line; like ring drops, they make `run` exit 1.
fn otel_lost(_stats: &prx_hooks::Stats) -> u64 {
    #[cfg(feature = "otel")]
    if let Some(o) = _stats.section::<prx_hooks::otel::OtelStats>(prx_hooks::otel::STATS_SECTION) {
        let spans = o.dropped_queue_full + o.dropped_retries + o.rejected + o.dropped_shutdown;
        let events: u64 = (_stats.sinks.iter())
            .filter(|s| s.name == prx_hooks::otel::STATS_SECTION)
            .map(|s| s.counts.dropped)
            .sum();
        if spans + events > 0 {
            let events = match events {
                0 => String::new(),
                n => format!("; {n} event(s) found the span builder's queue full"),
            };
            say!(
                "prx-hooks: OpenTelemetry export to {} lost {spans} span(s): {} to a full queue, {} given up after retrying, {} refused by the receiver, {} left at shutdown{events}",
                o.endpoint,
                o.dropped_queue_full,
                o.dropped_retries,
                o.rejected,
                o.dropped_shutdown,
            );
        }
        return spans + events;
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
    let mut opts = HttpOptions::new(token)
        .allow_hosts(&args.allow_host)
        .events(EventStreamOptions::default().record_always(true));
    if args.transcripts {
        opts = opts.read_transcripts(Arc::new(prx_hooks::ingest::Transcripts::new()));
    }
    let server = match &listen {
        Listen::Tcp(addr) => Server::start(hooks.clone(), opts, *addr),
        Listen::Unix(path) => Server::start_unix(hooks.clone(), opts, path),
    }
    .map_err(|e| listen_error(addr, &e))?;
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
    if let Listen::Tcp(_) = listen {
        // The console is the API's own page (docs/http.md § Console page): said once, with
        // what to sign in with, since nothing else points at it.
        let sign_in = match &source {
            token::TokenSource::Env => format!("the token in ${}", token::TOKEN_ENV),
            token::TokenSource::File(p)
            | token::TokenSource::Workspace(p)
            | token::TokenSource::Generated(p) => format!("the token in {}", p.display()),
        };
        say!("prx-hooks: console on {address}/ (sign in with {sign_in})");
    }
    Ok(server)
}

/// `--listen`'s error, with what to do when the address is taken.
#[cfg(feature = "http")]
fn listen_error(addr: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        format!(
            "--listen {addr}: the address is in use (another `prx-hooks run`, or another \
             program, listens there): stop it, or listen elsewhere (--listen 127.0.0.1:0 picks a \
             free port; the workspace's .prx-hooks/address says which)"
        )
    } else {
        format!("--listen {addr}: {e}")
    }
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
