//! The `prx-hooks` binary as a user runs it: `run`, `fire`, `validate`, `bench`, `init`,
//! `connect`, shell
//! hooks end to end, containment under the CLI and plugins through the CLI.
//!
//! One test binary per area (each links the whole library): the modules are the former
//! per-file binaries, the shared helpers are declared once here.

#[path = "../support/plugins.rs"]
mod plugins;
#[path = "../support/procs.rs"]
mod procs;
#[path = "../support/stderr.rs"]
mod stderr;
#[path = "../support/hooks.rs"]
mod support;

mod agent_cli;
mod cli;
#[cfg(feature = "http")]
mod connect_cli;
#[cfg(feature = "http")]
mod connect_policies;
#[cfg(feature = "http")]
mod connect_safety;
#[cfg(feature = "http")]
mod connect_tables;
mod containment;
#[cfg(feature = "http")]
mod doctor_cli;
mod hooks_e2e;
mod init_cli;
mod run_input;
mod terminal_cli;
mod wasm_cli;
mod watch_log;
