//! Plugin calls as `execute_hook {plugin}` spans: one per plugin per interval in which it was
//! called, its counts as attributes (as the live stream aggregates them: a span per call would
//! cost every call; the plugin counters already exist).

use super::attrs::{Ids, i, new_span, s, set, set_error};
use crate::wasm::WasmSink;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::SystemTime;

/// The counters read: ok, errors, traps, timeouts, out of fuel, dropped.
type Counts = [u64; 6];

const NAMES: [&str; 6] = [
    "prx.plugin.ok",
    "prx.plugin.errors",
    "prx.plugin.traps",
    "prx.plugin.timeouts",
    "prx.plugin.out_of_fuel",
    "prx.plugin.dropped",
];

/// Set once the plugin backend exists (it is built after the exporter).
pub(crate) type PluginSlot = Arc<OnceLock<Weak<WasmSink>>>;

pub(crate) struct PluginCalls {
    slot: PluginSlot,
    last: HashMap<String, Counts>,
    since: SystemTime,
}

impl PluginCalls {
    pub(crate) fn new(slot: PluginSlot) -> PluginCalls {
        PluginCalls {
            slot,
            last: HashMap::new(),
            since: SystemTime::now(),
        }
    }

    /// One span per plugin called since the last poll, into `out`; returns how many.
    pub(crate) fn poll(&mut self, ids: &mut Ids, out: &mut Vec<Span>) -> u64 {
        let Some(sink) = self.slot.get().and_then(Weak::upgrade) else {
            return 0;
        };
        let now = SystemTime::now();
        let (start, end) = (super::attrs::nanos(self.since), super::attrs::nanos(now));
        self.since = now;
        let mut made = 0;
        for p in sink.stats().plugins {
            let c = &p.counts;
            let counts: Counts = [
                c.ok,
                c.errors,
                c.traps,
                c.timeouts,
                c.out_of_fuel,
                c.dropped,
            ];
            let before = self.last.insert(p.name.clone(), counts).unwrap_or([0; 6]);
            let d: Vec<u64> = (0..6)
                .map(|k| counts[k].saturating_sub(before[k]))
                .collect();
            let calls: u64 = d[..5].iter().sum();
            if calls == 0 && d[5] == 0 {
                continue;
            }
            let name = format!("execute_hook {}", p.name);
            let mut span = new_span(
                name,
                SpanKind::Internal,
                ids.trace(),
                ids.span(),
                None,
                start,
            );
            span.end_time_unix_nano = end.max(start);
            set(&mut span, "prx.hook.id", s(&p.name));
            set(&mut span, "prx.hook.kind", s("plugin"));
            set(&mut span, "prx.plugin.calls", i(calls as i64));
            for (k, n) in NAMES.iter().zip(&d) {
                if *n > 0 {
                    set(&mut span, k, i(*n as i64));
                }
            }
            if d[1..5].iter().any(|n| *n > 0) {
                let why = c.last_error.as_deref().unwrap_or("plugin calls failed");
                set_error(&mut span, "plugin_error", why);
            }
            out.push(span);
            made += 1;
        }
        made
    }
}
