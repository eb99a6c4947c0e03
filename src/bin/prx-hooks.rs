//! `prx-hooks`: run the hook pipeline over a workspace, or measure it.
//!
//! docs/cli.md is the contract for flags and output: data (bus messages, bench results) goes
//! to stdout; logs, line errors and stats go to stderr.

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]
// A closed stdout or stderr is never a panic: `say!` and `out!` instead of the print macros
// that panic (clippy.toml).
#![deny(clippy::disallowed_macros)]

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

#[path = "prx-hooks/bench.rs"]
mod bench;
#[cfg(feature = "http")]
#[path = "prx-hooks/client.rs"]
mod client;
#[cfg(feature = "http")]
#[path = "prx-hooks/connect.rs"]
mod connect;
#[path = "prx-hooks/contain.rs"]
mod contain;
#[cfg(feature = "http")]
#[path = "prx-hooks/doctor.rs"]
mod doctor;
#[path = "prx-hooks/fire.rs"]
mod fire;
#[cfg(feature = "http")]
#[path = "prx-hooks/hook_table.rs"]
mod hook_table;
#[path = "prx-hooks/init.rs"]
mod init;
#[path = "prx-hooks/input.rs"]
mod input;
#[path = "prx-hooks/policy_test.rs"]
mod policy_test;
#[path = "prx-hooks/run.rs"]
mod run;
#[cfg(feature = "http")]
#[path = "prx-hooks/send.rs"]
mod send;
#[cfg(feature = "http")]
#[path = "prx-hooks/socket_conn.rs"]
mod socket_conn;
#[cfg(feature = "http")]
#[path = "prx-hooks/socket_ingest.rs"]
mod socket_ingest;
#[cfg_attr(not(feature = "http"), allow(dead_code))] // `send` uses the rest.
#[path = "prx-hooks/spool.rs"]
mod spool;
#[path = "prx-hooks/spool_replay.rs"]
mod spool_replay;
#[cfg(feature = "http")]
#[path = "prx-hooks/tail.rs"]
mod tail;
#[cfg_attr(not(feature = "http"), allow(dead_code))] // `send` uses the rest.
#[path = "prx-hooks/units.rs"]
mod units;
#[path = "prx-hooks/validate.rs"]
mod validate;

/// `run --nats`, `run --from-nats`, `bench --nats` (docs/nats.md § NATS). Its lints are its
/// own (src/cli/).
#[cfg(feature = "nats")]
#[path = "../cli/nats.rs"]
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod nats_cli;

/// `run --otlp` (docs/otel.md § OpenTelemetry traces). Its lints are its own (src/cli/).
#[cfg(feature = "otel")]
#[path = "../cli/otel.rs"]
#[allow(missing_docs, unreachable_pub, missing_debug_implementations)]
mod otel_cli;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;
/// The NATS flags parse their durations as `run`'s do.
#[cfg(feature = "nats")]
use units::parse_duration;

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
    Run(run::RunArgs),
    /// Drive the pipeline as hard as possible and report emit latency and throughput.
    Bench(bench::BenchArgs),
    /// Check the workspace's hooks.json and policies.json; every error as FILE:LINE:COL: PATH:
    /// reason.
    Validate(validate::ValidateArgs),
    /// Run every hook for EVENT once, wait, and print one line per outcome.
    Fire(fire::FireArgs),
    /// Policies (policies.json): `policy test` decides a payload offline.
    Policy(policy_test::PolicyArgs),
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
    /// Check that each connected agent's hooks reach the workspace's server: its settings read
    /// as the agent reads them, events and handler types it runs, trust, the server and its
    /// token, and what the server last saw of each agent. Exit 0 all good, 1 problems, 2
    /// cannot check.
    #[cfg(feature = "http")]
    Doctor(doctor::DoctorArgs),
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
    /// Where the hooks' payload files go (`ZERO_HOOK_PAYLOAD_FILE`): a private directory is
    /// made in DIR (default: `$TMPDIR`, else /tmp). A directory on tmpfs keeps a busy host's
    /// file creation cheap without changing the hooks' own `TMPDIR`.
    #[arg(long, value_name = "DIR")]
    payload_dir: Option<std::path::PathBuf>,
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
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::bench(args),
        Command::Validate(args) => validate::validate(args),
        Command::Fire(args) => return fire::fire_command(args),
        Command::Policy(args) => policy_test::policy(args),
        Command::Init(args) => init::init(args),
        #[cfg(feature = "http")]
        Command::Tail(args) => tail::tail(args),
        #[cfg(feature = "http")]
        Command::Send(args) => send::send(args),
        #[cfg(feature = "http")]
        Command::Connect(args) => connect::connect(args),
        #[cfg(feature = "http")]
        Command::Doctor(args) => doctor::doctor(args),
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
            Command::Tail(_) | Command::Send(_) | Command::Doctor(_) => "warn",
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
