//! Lifecycle hooks for AI-agent runtimes that never slow the agent down.
//!
//! An agent emits lifecycle events through an [`Emitter`]; prx-hooks delivers them to shell
//! hooks, WASM plugins and in-process subscribers without ever blocking the agent:
//!
//! ```text
//! Emitter::emit(Event)            agent thread: interest check, claim a slot, copy, publish
//!   └─► ring (one per worker)     bounded, preallocated, lock-free; full → Dropped, counted
//!         └─► worker              serialize the payload ONCE → Message (Arc'd bytes + metadata)
//!               ├─► bus           every matching Subscription, bounded queue each
//!               ├─► shell hooks   per-hook bounded queue → the shell runner thread
//!               │                 (spawns, waits on pidfds, SIGKILLs groups on timeout)
//!               └─► WASM plugins  per-plugin bounded queues → executor threads → pooled
//!                                 instances → on-event (fuel, deadline, memory cap)
//!
//! <workspace>/hooks.json ──watcher──► parse + validate ──► ShellSink::set_table (a bad file
//!                                                          keeps the last good table)
//! <workspace>/plugins/*/ ──watcher──► manifest + compile (cached) ──► WasmSink (a bad new
//!                                                          version keeps the old one)
//! HTTP API ──► HooksEditor (validate like the loader, atomic write) ──► apply_hooks_file
//!                                                          (live before the response)
//! ```
//!
//! Module map: [`event`] (the 8 events and their JSON), `ring` (the lock-free ring), `emitter`
//! (the producer side), `pipeline` (workers and the [`Sink`] trait), [`bus`] (topics and
//! subscriptions), [`stats`] (counters), [`config`] (hooks.json: model, validation, watcher),
//! [`shell`] (running hooks), [`wasm`] (plugin manifests; with feature `wasm` the plugin host),
//! [`ndjson`] (the `run` input format), [`ingest`] (the session map and the line ingest every
//! input shares), [`agents`] (other agents' hook payloads as lines), [`logging`] (a log on
//! stderr that `fork()` cannot wedge), `http` (with feature `http`: the management API over
//! [`config::HooksEditor`], run history and stats). Every guarantee is written down in
//! ARCHITECTURE.md § Data flow.
//!
//! # Cargo features
//!
//! | feature | default | adds |
//! |---|---|---|
//! | `cli` | on | the `prx-hooks` and `prx-hooks-send` binaries |
//! | `wasm` | on | [`wasm`]'s plugin host (wasmtime components, pooled instances, hard limits) |
//! | `http` | on | `http`: the management API, the live stream and the console (axum) |
//! | `nats` | on | [`nats`]' bridge to NATS and JetStream (async-nats) |
//! | `otel` | on | [`otel`]: OpenTelemetry GenAI spans over OTLP/HTTP |
//!
//! The core (`--no-default-features`) starts no async runtime; each feature that needs one
//! owns it.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use prx_hooks::{Event, Hooks};
//! let hooks = Hooks::builder().workspace(".").build()?;
//! let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
//! let em = hooks.emitter("my-agent", "session-42");
//! em.emit(Event::ToolCallStart { tool: "shell", arguments: r#"{"cmd":"ls"}"# });
//! let msg = sub.recv()?;
//! assert_eq!(msg.json(), br#"{"tool":"shell","arguments":{"cmd":"ls"}}"#);
//! hooks.shutdown(std::time::Duration::from_secs(2));
//! # Ok(()) }
//! ```

#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod agents;
pub mod bus;
pub mod config;
mod emitter;
pub mod event;
#[cfg(feature = "http")]
pub mod http;
pub mod ingest;
mod interest;
mod json;
pub mod logging;
mod message;
pub mod nats;
pub mod ndjson;
pub mod otel;
mod pipeline;
pub mod policy;
mod ring;
// Without `nats` nothing attaches (the sinks' side stays: holds and marks are no-ops).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
mod settle;
pub mod shell;
mod sink;
pub mod stats;
mod sync;
pub mod wasm;

pub use bus::{Bus, BusError, Message, Subscription};
pub use emitter::{Emit, Emitter};
pub use event::{Event, EventKind, EventMask, Extras, ExtrasError};
pub use interest::InterestHandle;
pub use pipeline::SHUTDOWN_SLACK;
pub use sink::Sink;
pub use stats::Stats;

mod builder;
mod hooks;
#[doc(hidden)]
pub mod text;

pub use builder::{BuildError, HooksBuilder};
#[cfg(feature = "nats")]
pub(crate) use hooks::Feed;
pub use hooks::Hooks;
pub(crate) use text::suggest;

use bus::Bus as BusSink;
use emitter::Producers;
use pipeline::{Interest, Pipeline, WorkerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Internals for the benches under `benches/` and the fuzz targets under `fuzz/`. Not part of
/// the API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    /// The JSON compaction and checks the fuzz targets and `benches/serialize.rs` drive.
    pub mod json {
        pub use crate::json::{
            MAX_DEPTH, Refused, Top, append_compact, append_compact_str, append_compact_within,
            check_object, check_value, write_str,
        };
    }

    /// The spawn path alone, for `benches/spawn.rs`.
    pub mod spawn {
        pub use crate::shell::spawn_bench::*;
    }

    /// One plugin's per-call path and the direct wasmtime calls it is compared with, for
    /// `benches/wasm.rs`.
    #[cfg(feature = "wasm")]
    pub mod wasm {
        pub use crate::wasm::bench::*;
    }
}

/// The former path of [`__private::json`].
#[doc(hidden)]
#[deprecated(note = "use prx_hooks::__private::json")]
pub mod __fuzz {
    pub use crate::__private::json::*;
}
