//! Plugin calls as `execute_hook {plugin}` spans, children of their event's span, read from
//! the plugin backend's call feed (`WasmSink::subscribe_calls`). Up to `per_second` calls of a
//! plugin per second are a span each; past that rate, the rest of that second's calls are one
//! aggregate span with their counts (as the live stream aggregates plugin calls), a child of
//! the first of those calls' event span and linked to the others'.

use super::attrs::{Rec, SpanId, Text, TraceId, nanos};
use super::spans::Builder;
use crate::wasm::{CallOutcome, PluginCall, WasmSink};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The rate window.
const WINDOW: Duration = Duration::from_secs(1);
/// Links an aggregate span keeps to the spans of the events it covers (the rest counted in
/// `dropped_links_count`).
const MAX_LINKS: usize = 32;
/// The call feed's queue.
const CALL_QUEUE: usize = 16_384;

/// Counted outcomes of an aggregate, and their attributes.
const NAMES: [&str; 7] = [
    "prx.plugin.ok",
    "prx.plugin.errors",
    "prx.plugin.traps",
    "prx.plugin.timeouts",
    "prx.plugin.out_of_fuel",
    "prx.plugin.interrupted",
    "prx.plugin.dropped",
];
/// `NAMES`' index of `dropped` (calls that did not run).
const DROPPED: usize = 6;

/// The outcome's name (`prx.hook.outcome`), its counter in `NAMES`, and whether it failed.
fn classify(o: &CallOutcome) -> (&'static str, usize, bool) {
    match o {
        CallOutcome::Ok => ("ok", 0, false),
        CallOutcome::Error(_) => ("error", 1, true),
        CallOutcome::Trap(_) | CallOutcome::Instantiate(_) => ("trap", 2, true),
        CallOutcome::Timeout => ("timed_out", 3, true),
        CallOutcome::OutOfFuel => ("out_of_fuel", 4, true),
        CallOutcome::Interrupted { .. } => ("interrupted", 5, true),
        CallOutcome::Suspended | CallOutcome::Busy(_) | CallOutcome::Aborted => {
            ("dropped", DROPPED, false)
        }
    }
}

/// The plugin backend's call feed, once it exists (it is built after the exporter).
pub(crate) type PluginSlot = Arc<OnceLock<(flume::Receiver<PluginCall>, Weak<WasmSink>)>>;

pub(crate) fn watch(slot: &PluginSlot, plugins: &Arc<WasmSink>) {
    if let Some(rx) = plugins.subscribe_calls(CALL_QUEUE) {
        let _ = slot.set((rx, Arc::downgrade(plugins)));
    }
}

/// One plugin's rate window.
struct Window {
    since: Instant,
    spans: u32,
    agg: Option<Agg>,
}

struct Agg {
    rec: Rec,
    counts: [u64; 7],
    last_error: Option<String>,
}

pub(crate) struct PluginCalls {
    slot: PluginSlot,
    /// The feed ended (the plugin backend is gone).
    closed: bool,
    per_second: u32,
    windows: HashMap<Arc<str>, Window>,
}

impl PluginCalls {
    pub(crate) fn new(slot: PluginSlot, per_second: u32) -> PluginCalls {
        PluginCalls {
            slot,
            closed: false,
            per_second,
            windows: HashMap::new(),
        }
    }

    pub(crate) fn receiver(&self) -> Option<&flume::Receiver<PluginCall>> {
        self.slot.get().filter(|_| !self.closed).map(|(rx, _)| rx)
    }

    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    /// One call: its own span within the rate, else counted in its plugin's aggregate.
    pub(crate) fn call(&mut self, b: &mut Builder, c: &PluginCall) {
        let now = b.now;
        let m = &c.msg;
        let parent = b.parent_of(m.agent(), m.session(), m.seq());
        let w = self.windows.entry(c.plugin.clone()).or_insert(Window {
            since: now,
            spans: 0,
            agg: None,
        });
        if now.duration_since(w.since) >= WINDOW {
            if let Some(agg) = w.agg.take() {
                finish(b, agg);
            }
            w.since = now;
            w.spans = 0;
        }
        let start = nanos(c.started_at);
        let (outcome, counter, failed) = classify(&c.outcome);
        if w.spans < self.per_second {
            w.spans += 1;
            b.counts.hook_spans += 1;
            let mut rec = b.hook_span(parent, &c.plugin, start, c.duration);
            rec.text_attr("prx.hook.kind", Text::Static("plugin"));
            if let Some(kind) = m.event() {
                rec.text_attr("prx.hook.event", Text::Static(kind.name()));
            }
            rec.text_attr("prx.hook.outcome", Text::Static(outcome));
            rec.str("gen_ai.conversation.id", m.session());
            rec.str("gen_ai.agent.name", m.agent());
            if failed {
                rec.error(outcome, &c.outcome.describe(c.timeout_ms));
            }
            b.emit(rec);
            return;
        }
        let end = start.saturating_add(c.duration.as_nanos().min(u128::from(u64::MAX)) as u64);
        let agg = w.agg.get_or_insert_with(|| {
            b.counts.hook_spans += 1;
            let mut rec = b.hook_span(parent, &c.plugin, start, Duration::ZERO);
            rec.text_attr("prx.hook.kind", Text::Static("plugin"));
            Agg {
                rec,
                counts: [0; 7],
                last_error: None,
            }
        });
        agg.counts[counter] += 1;
        agg.rec.start = agg.rec.start.min(start);
        agg.rec.end = agg.rec.end.max(end);
        if failed {
            agg.last_error = Some(c.outcome.describe(c.timeout_ms));
        }
        if let Some((trace, span)) = parent {
            link(&mut agg.rec, trace, span);
        }
    }

    /// Ends the aggregates whose second is over (all of them with `all`).
    pub(crate) fn poll(&mut self, b: &mut Builder, all: bool) {
        let now = b.now;
        self.windows.retain(|_, w| {
            if all || now.duration_since(w.since) >= WINDOW {
                if let Some(agg) = w.agg.take() {
                    finish(b, agg);
                }
                // The plugin's next call opens a new window.
                return false;
            }
            true
        });
    }
}

/// Links the aggregate to an event's span other than its parent.
fn link(rec: &mut Rec, trace: TraceId, span: SpanId) {
    if rec.parent != Some(span) {
        rec.link(trace, span, MAX_LINKS);
    }
}

fn finish(b: &mut Builder, agg: Agg) {
    let Agg {
        mut rec,
        counts,
        last_error,
    } = agg;
    let calls: u64 = counts[..DROPPED].iter().sum();
    rec.int("prx.plugin.calls", calls as i64);
    for (k, n) in NAMES.iter().zip(&counts) {
        if *n > 0 {
            rec.int(k, *n as i64);
        }
    }
    if let Some(why) = last_error {
        rec.error("plugin_error", &why);
    }
    b.emit(rec);
}
