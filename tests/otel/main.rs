//! The OpenTelemetry exporter against a real OTLP/HTTP receiver over loopback (a hyper server
//! decoding the protobuf with opentelemetry-proto): the spans and their links
//! (`spans.rs`), hook runs and plugin calls as child spans (`hooks.rs`), a receiver that is down, refusing,
//! stalled or resetting (`pressure.rs`), and `prx-hooks run --otlp` (`cli.rs`).

mod receiver;
#[path = "../support/plugins.rs"]
mod support_plugins;

mod cli;
mod content;
#[path = "../support/fixtures.rs"]
mod fixtures;
mod hooks;
mod policy;
mod pressure;
mod spans;
mod subagents;

use opentelemetry_proto::tonic::trace::v1::Span;
use prx_hooks::otel::{OtelStats, OtlpOptions};
use prx_hooks::{Hooks, Stats};
use std::time::{Duration, Instant};

/// Options for a test: small batches sent at once.
pub fn options(url: &str) -> OtlpOptions {
    OtlpOptions::new(url)
        .unwrap()
        .batch(64, Duration::from_millis(20))
}

pub fn otel(stats: &Stats) -> OtelStats {
    stats
        .section::<OtelStats>(prx_hooks::otel::STATS_SECTION)
        .expect("the otel section")
        .clone()
}

/// The exporter's accounting: every span finished is in exactly one bucket.
pub fn balanced(o: &OtelStats) -> bool {
    o.spans
        == o.exported
            + o.rejected
            + o.dropped_queue_full
            + o.dropped_retries
            + o.dropped_shutdown
            + o.queued
}

pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn by_name<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

pub fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found = by_name(spans, name);
    assert_eq!(found.len(), 1, "one {name:?} in {:?}", names(spans));
    found[0]
}

pub fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

pub fn is_error(span: &Span) -> bool {
    span.status.as_ref().is_some_and(|s| s.code == 2)
}

pub fn nanos(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Builds `Hooks` exporting to `opts`, without a workspace.
pub fn hooks_with(opts: OtlpOptions) -> Hooks {
    Hooks::builder().otlp(opts).build().unwrap()
}
