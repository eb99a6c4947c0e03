//! `/metrics`: every counter of [`Stats`] in the OpenMetrics text format (which Prometheus
//! scrapes natively), rendered by `prometheus-client`, the Prometheus project's Rust client.
//!
//! A scrape builds a fresh registry from one `Hooks::stats()` snapshot, so the values of one
//! scrape are as consistent with each other as the snapshot is, and nothing is kept between
//! scrapes. The names are a stable contract (README.md lists them): prefix `prx_hooks_`,
//! counters end in `_total`, labels `reason`, `sink`, `subscriber`, `pattern`, `hook`,
//! `outcome`, `plugin`, `result`.

use super::ApiState;
use crate::Stats;
use crate::shell::HookCounts;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub(crate) async fn render(State(api): ApiState) -> Response {
    let stats = match super::status::snapshot(api).await {
        Ok(stats) => stats,
        Err(e) => return e.into_response(),
    };
    match exposition(&stats) {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE))],
            text,
        )
            .into_response(),
        Err(e) => super::error::ApiError::internal(format!("rendering metrics failed: {e}"))
            .into_response(),
    }
}

type Labels = Vec<(&'static str, String)>;

/// One scrape's registry.
struct Metrics(Registry);

impl Metrics {
    fn counter(&mut self, name: &str, help: &str, value: u64) {
        let c = Counter::<u64>::default();
        c.inc_by(value);
        self.0.register(name, help, c);
    }

    fn gauge(&mut self, name: &str, help: &str, value: u64) {
        let g = Gauge::<i64>::default();
        g.set(clamp(value));
        self.0.register(name, help, g);
    }

    fn counters(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (Labels, u64)>,
    ) {
        let family = Family::<Labels, Counter<u64>>::default();
        for (labels, v) in samples {
            family.get_or_create(&escape(labels)).inc_by(v);
        }
        self.0.register(name, help, family);
    }

    fn gauges(&mut self, name: &str, help: &str, samples: impl IntoIterator<Item = (Labels, u64)>) {
        let family = Family::<Labels, Gauge<i64>>::default();
        for (labels, v) in samples {
            family.get_or_create(&escape(labels)).set(clamp(v));
        }
        self.0.register(name, help, family);
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// prometheus-client 0.24 writes label values as they are; the text format needs `\`, `"` and
/// newlines escaped.
fn escape(labels: Labels) -> Labels {
    labels
        .into_iter()
        .map(|(k, v)| {
            let v = if v.contains(['\\', '"', '\n']) {
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
            } else {
                v
            };
            (k, v)
        })
        .collect()
}

/// The text for one snapshot.
pub(crate) fn exposition(s: &Stats) -> Result<String, std::fmt::Error> {
    let mut m = Metrics(Registry::with_prefix("prx_hooks"));
    pipeline(&mut m, s);
    if let Some(c) = &s.config {
        m.counter(
            "config_reloads",
            "hooks.json tables that went live after the first",
            c.reloads,
        );
        m.counter(
            "config_reload_errors",
            "hooks.json loads rejected",
            c.reload_errors,
        );
        m.counter(
            "config_unchanged",
            "hooks.json changes that left its bytes as they were",
            c.unchanged,
        );
        m.gauge(
            "config_loaded",
            "1 if the active table was read from hooks.json",
            c.loaded as u64,
        );
        m.gauge(
            "config_failing",
            "1 while hooks.json on disk is rejected (an older table is active)",
            c.failing as u64,
        );
        m.gauge(
            "config_actions",
            "hooks in the active table",
            c.actions as u64,
        );
        m.gauge(
            "config_enabled",
            "1 if the active table's global switch is on",
            c.enabled as u64,
        );
        m.gauge(
            "config_warnings",
            "load-time warnings of the active table",
            c.warnings as u64,
        );
    }
    if let Some(shell) = &s.shell {
        let hooks = || shell.hooks.iter();
        m.counters(
            "shell_runs",
            "shell hook runs of every hook, by outcome",
            outcomes(&shell.totals, vec![]),
        );
        m.counter(
            "shell_sent",
            "runs the shell backend accepted, every hook",
            shell.totals.sent,
        );
        m.gauge(
            "shell_running",
            "shell hook processes running now",
            shell.totals.running,
        );
        m.gauge(
            "shell_queued",
            "shell hook runs waiting in queues",
            shell.totals.queued,
        );
        m.gauge(
            "shell_direct_running",
            "test and fire runs running now",
            shell.direct_running,
        );
        m.counters(
            "shell_hook_runs",
            "runs of one shell hook, by outcome",
            hooks().flat_map(|(id, c)| outcomes(c, vec![("hook", id.clone())])),
        );
        m.counters(
            "shell_hook_sent",
            "runs one shell hook accepted",
            hooks().map(|(id, c)| (hook(id), c.sent)),
        );
        m.gauges(
            "shell_hook_running",
            "processes of one shell hook running now",
            hooks().map(|(id, c)| (hook(id), c.running)),
        );
        m.gauges(
            "shell_hook_queued",
            "runs of one shell hook waiting",
            hooks().map(|(id, c)| (hook(id), c.queued)),
        );
    }
    if let Some(p) = &s.plugins {
        plugins(&mut m, p);
    }
    let mut text = String::new();
    encode(&mut text, &m.0)?;
    Ok(text)
}

fn hook(id: &str) -> Labels {
    vec![("hook", id.to_string())]
}

/// One sample per outcome of `c`, each with `labels` plus `outcome`.
fn outcomes(c: &HookCounts, labels: Labels) -> Vec<(Labels, u64)> {
    [
        ("ok", c.ok),
        ("exit", c.exit),
        ("signal", c.signal),
        ("timed_out", c.timed_out),
        ("spawn_failed", c.spawn_failed),
        ("killed", c.killed),
        ("dropped", c.dropped),
        ("cancelled", c.cancelled),
        ("skipped", c.skipped),
    ]
    .into_iter()
    .map(|(outcome, v)| {
        let mut l = labels.clone();
        l.push(("outcome", outcome.to_string()));
        (l, v)
    })
    .collect()
}

/// Producers, ring, sinks and bus subscribers.
fn pipeline(m: &mut Metrics, s: &Stats) {
    m.counter("events_emitted", "calls to emit", s.emitted);
    m.counter("events_queued", "events accepted into the ring", s.queued);
    m.counters(
        "events_dropped",
        "events refused by emit, by reason",
        [
            ("ring_full", s.dropped),
            ("byte_budget", s.dropped_budget),
            ("oversize", s.oversize),
        ]
        .map(|(r, v)| (vec![("reason", r.to_string())], v)),
    );
    m.counter(
        "events_dropped_bytes",
        "bytes of every refused event",
        s.dropped_bytes,
    );
    m.counter("events_skipped", "events nobody listened to", s.skipped);
    m.counter(
        "events_processed",
        "events the workers handed to the sinks",
        s.processed,
    );
    m.counter("sink_panics", "panics caught inside a sink", s.sink_panics);
    m.gauge("ring_depth", "events in the rings now", s.ring.depth);
    m.gauge("ring_capacity", "ring slots, all rings", s.ring.capacity);
    m.gauge("ring_shards", "rings (one per worker)", s.ring.shards);
    m.gauge(
        "ring_inline_bytes",
        "bytes of the preallocated slot buffers",
        s.ring.inline_bytes,
    );
    m.gauge(
        "ring_budget_in_use_bytes",
        "bytes of large events held now",
        s.ring.budget_in_use,
    );
    m.gauge(
        "ring_budget_bytes",
        "the large-event byte budget",
        s.ring.budget,
    );
    let sink = |name: &str| vec![("sink", name.to_string())];
    let sinks = || s.sinks.iter();
    m.counters(
        "sink_sent",
        "events given to a sink",
        sinks().map(|x| (sink(&x.name), x.counts.sent)),
    );
    m.counters(
        "sink_delivered",
        "events a sink delivered",
        sinks().map(|x| (sink(&x.name), x.counts.delivered)),
    );
    m.counters(
        "sink_dropped",
        "events a sink dropped",
        sinks().map(|x| (sink(&x.name), x.counts.dropped)),
    );
    m.counters(
        "sink_failed",
        "events a sink failed to deliver",
        sinks().map(|x| (sink(&x.name), x.counts.failed)),
    );
    m.gauges(
        "sink_in_flight",
        "events a sink holds now",
        sinks().map(|x| (sink(&x.name), x.counts.in_flight)),
    );
    let sub = |x: &crate::stats::SubscriberStats| {
        vec![
            ("subscriber", x.id.to_string()),
            ("pattern", x.pattern.clone()),
        ]
    };
    let subs = || s.subscribers.iter();
    m.counters(
        "subscriber_delivered",
        "messages put into a subscription's queue",
        subs().map(|x| (sub(x), x.delivered)),
    );
    m.counters(
        "subscriber_dropped",
        "messages a subscription lost to a full queue",
        subs().map(|x| (sub(x), x.dropped)),
    );
    m.gauges(
        "subscriber_queued",
        "messages waiting in a subscription's queue",
        subs().map(|x| (sub(x), x.queued)),
    );
    m.gauges(
        "subscriber_capacity",
        "a subscription's queue capacity",
        subs().map(|x| (sub(x), x.capacity)),
    );
}

fn plugins(m: &mut Metrics, p: &crate::stats::PluginsStats) {
    m.counter(
        "plugins_reloads",
        "plugin loads that started or stopped a plugin",
        p.reloads,
    );
    m.counter("plugins_compiled", "components compiled", p.compiled);
    m.counter(
        "plugins_cache_hits",
        "components loaded from the compile cache",
        p.cache_hits,
    );
    m.gauge(
        "plugins_load_errors",
        "problems of the last plugin load",
        p.errors.len() as u64,
    );
    m.gauge(
        "plugins_pool_instances",
        "instances the pooling allocator holds",
        p.pool_instances,
    );
    m.gauge(
        "plugins_pool_max_memory_bytes",
        "the pool's largest linear memory",
        p.pool_max_memory_mb << 20,
    );
    let name = |x: &crate::stats::PluginStats| vec![("plugin", x.name.clone())];
    let all = || p.plugins.iter();
    let each = |f: fn(&crate::stats::PluginStats) -> u64| all().map(move |x| (name(x), f(x)));
    m.counters(
        "plugin_sent",
        "lifecycle events given to a plugin",
        each(|x| x.counts.sent),
    );
    m.counters(
        "plugin_delivered",
        "events a plugin handled without error",
        each(|x| x.counts.delivered),
    );
    m.counters(
        "plugin_dropped",
        "events a plugin never saw",
        each(|x| x.counts.dropped),
    );
    m.counters(
        "plugin_failed",
        "events whose call failed",
        each(|x| x.counts.failed),
    );
    m.gauges(
        "plugin_in_flight",
        "events queued or being handled",
        each(|x| x.counts.in_flight),
    );
    m.counters(
        "plugin_dropped_reason",
        "events a plugin never saw, by reason",
        all().flat_map(|x| {
            [
                ("queue_full", x.counts.dropped_queue_full),
                ("suspended", x.counts.dropped_suspended),
                ("shutdown", x.counts.dropped_shutdown),
            ]
            .map(|(r, v)| {
                (
                    vec![("plugin", x.name.clone()), ("reason", r.to_string())],
                    v,
                )
            })
        }),
    );
    m.counters(
        "plugin_calls",
        "on-event calls, by result",
        all().flat_map(|x| {
            [
                ("ok", x.counts.ok),
                ("error", x.counts.errors),
                ("trap", x.counts.traps),
                ("timeout", x.counts.timeouts),
                ("out_of_fuel", x.counts.out_of_fuel),
            ]
            .map(|(r, v)| {
                (
                    vec![("plugin", x.name.clone()), ("result", r.to_string())],
                    v,
                )
            })
        }),
    );
    m.counters(
        "plugin_topic_messages",
        "calls for the plugin's own subscriptions",
        each(|x| x.counts.topic_messages),
    );
    m.counters(
        "plugin_instances_created",
        "instances created",
        each(|x| x.counts.instances_created),
    );
    m.counters(
        "plugin_instances_replaced",
        "instances replaced after a fault",
        each(|x| x.counts.instances_replaced),
    );
    m.counters(
        "plugin_suspensions",
        "times the breaker suspended the plugin",
        each(|x| x.counts.suspensions),
    );
    m.gauges(
        "plugin_queued",
        "events waiting in the plugin's queues",
        each(|x| x.queued),
    );
    m.gauges(
        "plugin_kv_bytes",
        "bytes in the plugin's kv store",
        each(|x| x.kv_bytes),
    );
    m.gauges(
        "plugin_pool_size",
        "the plugin's instances",
        each(|x| x.pool_size),
    );
    m.gauges(
        "plugin_running",
        "1 if the plugin is running (0: suspended or stopped)",
        each(|x| (x.state == "running") as u64),
    );
}
