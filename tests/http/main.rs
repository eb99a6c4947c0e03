//! The HTTP API over loopback: routes and limits, the live stream, `run --listen`, `tail` and
//! the console page in a real headless Chromium.
//!
//! One test binary per area (each links the whole library): the modules are the former
//! per-file binaries, the shared helpers are declared once here.

#[path = "../support/browser.rs"]
mod browser;
#[path = "../support/plugins.rs"]
mod plugins;
#[path = "../support/proxy.rs"]
mod proxy;
#[path = "../support/sse.rs"]
mod sse;
#[path = "../support/stderr.rs"]
mod stderr;
#[path = "../support/hooks.rs"]
mod support;

mod agents_cli;
mod closed_output;
mod console;
mod decide;
mod http;
mod http_cli;
mod http_events;
mod idle_cli;
mod ingest;
mod send_cli;
mod send_decide_cli;
mod socket_cli;
mod spool_cli;
mod tail_cli;
