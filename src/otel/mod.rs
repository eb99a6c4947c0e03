//! OpenTelemetry traces (ARCHITECTURE.md § OpenTelemetry traces): the lifecycle exported as
//! GenAI spans over OTLP/HTTP, every hook run a child span. The stats section is built without
//! the feature too, so the JSON keys of `/api/stats` never depend on the build.
//!
//! | module | owns |
//! |---|---|
//! | `options` | [`OtlpOptions`]: the endpoint, headers, resource, bounds; `OTEL_*` variables |
//! | `batch` | a worker's events copied into one buffer for the span builder (reused) |
//! | `payload` | an event's payload members, found by one pass over its JSON (no allocation) |
//! | `spans` | the pairing state: events and hook outcomes → finished spans (bounded) |
//! | `attrs` | the span record (`Rec`, reused) and its protobuf encoding, ids, extras |
//! | `export` | encoded span chunks, the bounded export queue, batches, the HTTP client, retries |
//! | `plugins` | plugin calls as `execute_hook {plugin}` child spans, aggregated past a rate (feature `wasm` too) |
//! | `sink` | [`OtelSink`]: the [`Sink`](crate::Sink), its thread, shutdown |

#[cfg(feature = "otel")]
mod attrs;
#[cfg(feature = "otel")]
mod batch;
#[cfg(feature = "otel")]
mod export;
#[cfg(feature = "otel")]
mod options;
#[cfg(feature = "otel")]
mod payload;
#[cfg(all(feature = "otel", feature = "wasm"))]
mod plugins;
#[cfg(feature = "otel")]
mod sink;
#[cfg(feature = "otel")]
mod spans;

#[cfg(feature = "otel")]
pub use options::{OtlpError, OtlpOptions};
#[cfg(feature = "otel")]
pub use sink::OtelSink;

use serde::Serialize;

/// The name of the OpenTelemetry section in [`Stats`](crate::Stats).
pub const STATS_SECTION: &str = "otel";

/// The GenAI semantic conventions version the spans follow (docs/otel.md § OpenTelemetry traces).
pub const SEMCONV_VERSION: &str = "1.41.0";

/// What the exporter did. At any moment
/// `spans = exported + rejected + dropped_queue_full + dropped_retries + dropped_shutdown +
/// queued`; after shutdown `queued` is 0.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OtelStats {
    /// Where spans go (`http://host:4318/v1/traces`).
    pub endpoint: String,
    /// Lifecycle events the span builder read.
    pub events: u64,
    /// Hook outcomes and plugin call records their feeds could not hand over (a full queue).
    pub runs_missed: u64,
    /// Spans finished (each lands in exactly one bucket below).
    pub spans: u64,
    /// Spans the receiver accepted.
    pub exported: u64,
    /// Spans the receiver refused for good (a 4xx other than 429, or a partial success).
    pub rejected: u64,
    /// Spans dropped because the export queue was full.
    pub dropped_queue_full: u64,
    /// Spans dropped after retrying for `retry_for`.
    pub dropped_retries: u64,
    /// Spans still queued at the shutdown deadline.
    pub dropped_shutdown: u64,
    /// Spans waiting in the export queue or in a request.
    pub queued: u64,
    /// The export queue's bound.
    pub capacity: u64,
    /// Starts never ended (ended at the idle limit, at shutdown or by the state's bounds, with
    /// an error status).
    pub unmatched_starts: u64,
    /// Ends without a start (exported as zero-length spans).
    pub unmatched_ends: u64,
    /// `execute_hook` spans made from hook outcomes.
    pub hook_spans: u64,
    /// Export requests sent (first tries and retries).
    pub requests: u64,
    /// Requests that were retried (429, 502, 503, 504, a timeout, a connection error).
    pub retries: u64,
    /// The batch being sent has gone unsettled for the request timeout or longer (the
    /// receiver is down, refusing or not answering). A file replay waits for a lagging
    /// exporter only while this is false.
    pub stalled: bool,
}
