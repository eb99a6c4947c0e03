//! `prx-hooks-send`: `prx-hooks send` as a program of its own, for agents' hook commands.
//!
//! The same code, arguments, exit codes and spool as `prx-hooks send`
//! (`src/bin/prx-hooks/send.rs`), in a binary that links only what sending needs: an agent
//! waits for every hook call, and the full `prx-hooks` (wasmtime, the server, the CLI) takes
//! about twice as long to load and relocate (docs/ingest.md § Start-up).

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]
// A closed stdout or stderr is never a panic: no print macro that panics (clippy.toml).
#![deny(clippy::disallowed_macros)]

#[allow(dead_code)] // `tail` uses the rest.
#[path = "prx-hooks/client.rs"]
mod client;
#[path = "prx-hooks/send.rs"]
mod send;
#[allow(dead_code)] // `run`'s replay uses the rest.
#[path = "prx-hooks/spool.rs"]
mod spool;
#[path = "prx-hooks/units.rs"]
mod units;

use clap::Parser;
use std::io::Write as _;
use std::process::ExitCode;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Deliver an agent's hook call to the workspace's running prx-hooks server (or spool it):
/// the same as `prx-hooks send`, starting faster.
#[derive(Parser)]
#[command(
    name = "prx-hooks-send",
    version,
    after_help = "Exit codes: 0 delivered, spooled, or refused (said on stderr); with --strict, 1 \
                  when the event was not delivered or a line was refused; 64 a usage error."
)]
struct Cli {
    #[command(flatten)]
    args: send::SendArgs,
    /// `prx-hooks`'s global -v/-q, taken so a hook command may switch programs (`send` logs
    /// nothing they change).
    #[arg(short, long, hide = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[arg(short, long, hide = true, action = clap::ArgAction::Count, conflicts_with = "verbose")]
    quiet: u8,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.exit_code() {
                0 => ExitCode::SUCCESS,
                _ => ExitCode::from(send::EX_USAGE),
            };
        }
    };
    match send::send(cli.args) {
        Ok(code) => code,
        Err(e) => {
            // Never a panic on a closed stderr (an agent that stopped reading).
            let _ = writeln!(std::io::stderr(), "prx-hooks-send: {e}");
            ExitCode::FAILURE
        }
    }
}
