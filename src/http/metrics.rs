//! `/metrics`: every counter of [`Stats`], in the OpenMetrics text format when the scrape asks
//! for it (Prometheus does), rendered by `prometheus-client`, the Prometheus project's Rust
//! client, and in the classic text format otherwise (`format.rs`).
//!
//! A scrape builds a fresh registry from one `Hooks::stats()` snapshot, so the values of one
//! scrape are as consistent with each other as the snapshot is, and nothing is kept between
//! scrapes. The metrics are the tables below: the names are a stable contract (docs/stats.md lists
//! them): prefix `prx_hooks_`, counters end in `_total`, labels `reason`, `sink`, `pattern`,
//! `hook`, `outcome`, `plugin`, `result`, `phase`.
//!
//! Every label is bounded by the configuration, never by time: subscriptions are summed per
//! `pattern` (a numeric subscriber id grew forever over a long run), hooks and plugins are
//! what the files define. Series that counted something twice or counted non-runs as runs are
//! kept for dashboards that use them, marked `DEPRECATED` in their help text (and in
//! docs/stats.md), beside the correct ones.

mod format;

use super::error::ApiError;
use super::{ApiState, EventStreamStats, HttpStats};
use crate::Stats;
use crate::config::ConfigStats;
use crate::ingest::AgentTokens;
use crate::nats::{ConsumeStats, PublishStats};
use crate::otel::OtelStats;
use crate::policy::{CommandCount, PoliciesStats, PolicyCount};
use crate::shell::{HookCounts, ShellStats};
use crate::stats::{SinkStats, SubscriberStats};
use crate::wasm::{PluginStats, PluginsStats};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use format::Format;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as PromFamily;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The prefix of every metric's name.
const PREFIX: &str = "prx_hooks";

pub(crate) async fn render(State(api): ApiState, headers: HeaderMap) -> Response {
    let format = Format::negotiate(&headers);
    let http = api.conns.as_ref().map(|c| c.snapshot());
    let events = api.events.stats();
    let stats = match super::status::snapshot(api).await {
        Ok(stats) => stats,
        Err(e) => return e.into_response(),
    };
    let m = metrics(&stats, http.as_ref(), Some(&events));
    let text = match format {
        Format::OpenMetrics => m.openmetrics(),
        Format::Classic => Ok(format::classic(PREFIX, &m.0)),
    };
    match text {
        Ok(text) => (
            StatusCode::OK,
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(format.content_type()),
                ),
                (header::VARY, HeaderValue::from_static("accept")),
            ],
            text,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("rendering metrics failed: {e}")).into_response(),
    }
}

/// The OpenMetrics text for one snapshot (`http`: the serving [`super::Server`]'s counters,
/// if any; `events`: the event stream's).
#[cfg(test)]
pub(crate) fn exposition(
    s: &Stats,
    http: Option<&HttpStats>,
    events: Option<&EventStreamStats>,
) -> Result<String, std::fmt::Error> {
    metrics(s, http, events).openmetrics()
}

/// Every family of one snapshot.
fn metrics(s: &Stats, http: Option<&HttpStats>, events: Option<&EventStreamStats>) -> Metrics {
    let mut m = Metrics(Vec::new());
    m.single(PIPELINE, s);
    m.split(
        "events_dropped",
        "events refused by emit or left in a ring at shutdown, by reason",
        "reason",
        &[DROPS],
        &[(vec![], s)],
    );
    let sinks: Vec<_> = s
        .sinks
        .iter()
        .map(|x| (label("sink", &x.name), x))
        .collect();
    m.per(SINK, &sinks);
    let patterns = by_pattern(&s.subscribers);
    let subs: Vec<_> = patterns
        .iter()
        .map(|x| (label("pattern", &x.pattern), x))
        .collect();
    m.per(SUBSCRIPTIONS, &subs);
    if let Some(sessions) = s.sessions() {
        let agents: Vec<_> = sessions
            .tokens
            .iter()
            .map(|x| (label("agent", &x.agent), x))
            .collect();
        m.split(
            "tokens",
            "tokens the ingested events carried (their input_tokens, output_tokens and cache \
             token fields), per agent and kind; input leaves the cached input out",
            "kind",
            &[TOKEN_KINDS],
            &agents,
        );
    }
    if let Some(c) = s.config() {
        m.single(CONFIG, c);
    }
    if let Some(shell) = s.shell() {
        m.single(SHELL, shell);
        let total = [(vec![], &shell.totals)];
        m.split(
            "shell_executions",
            "shell hook processes started (or that failed to start), every hook, by outcome",
            "outcome",
            &[EXECUTIONS],
            &total,
        );
        m.split(
            "shell_not_run",
            "shell hook runs that never started, every hook, by reason",
            "reason",
            &[NOT_RUN],
            &total,
        );
        m.split(
            "shell_runs",
            "DEPRECATED: counts runs that never started too; use shell_executions and \
             shell_not_run. Shell hook runs, every hook, by outcome",
            "outcome",
            &[EXECUTIONS, NOT_RUN],
            &total,
        );
        let hooks: Vec<_> = shell
            .hooks
            .iter()
            .map(|(id, c)| (label("hook", id), c))
            .collect();
        m.per(HOOK, &hooks);
        m.split(
            "shell_hook_executions",
            "processes of one shell hook started (or that failed to start), by outcome",
            "outcome",
            &[EXECUTIONS],
            &hooks,
        );
        m.split(
            "shell_hook_not_run",
            "runs of one shell hook that never started, by reason",
            "reason",
            &[NOT_RUN],
            &hooks,
        );
        m.split(
            "shell_hook_runs",
            "DEPRECATED: counts runs that never started too; use shell_hook_executions and \
             shell_hook_not_run. Runs of one shell hook, by outcome",
            "outcome",
            &[EXECUTIONS, NOT_RUN],
            &hooks,
        );
    }
    if let Some(p) = s.plugins() {
        m.single(PLUGINS, p);
        let plugins: Vec<_> = p
            .plugins
            .iter()
            .map(|x| (label("plugin", &x.name), x))
            .collect();
        m.per(PLUGIN, &plugins);
        m.split(
            "plugin_dropped_reason",
            "events a plugin never saw, by reason",
            "reason",
            &[PLUGIN_DROPS],
            &plugins,
        );
        m.split(
            "plugin_calls",
            "on-event calls, by result",
            "result",
            &[CALLS],
            &plugins,
        );
    }
    if let Some(n) = s.nats() {
        if let Some(p) = &n.publish {
            m.single(NATS_PUBLISH, p);
            m.split(
                "nats_publish_dropped",
                "events the NATS publisher lost, by reason",
                "reason",
                &[NATS_PUBLISH_DROPS],
                &[(vec![], p)],
            );
        }
        if let Some(c) = &n.consume {
            m.single(NATS_CONSUME, c);
            m.split(
                "nats_consume_refused",
                "NATS messages the consumer refused, by reason",
                "reason",
                &[NATS_CONSUME_REFUSED],
                &[(vec![], c)],
            );
        }
    }
    if let Some(p) = s.policies() {
        m.split(
            "policy_decisions",
            "questions asked of the policies, by outcome (none: no policy decided; refused: \
             the payload was too large or not an object)",
            "outcome",
            &[POLICY_OUTCOMES],
            &[(vec![], p)],
        );
        let policies: Vec<_> = p
            .by_policy
            .iter()
            .map(|x| {
                let mut l = label("policy", &x.policy);
                l.push(("decision", x.decision.as_str().to_string()));
                (l, x)
            })
            .collect();
        m.per(POLICY, &policies);
        let commands: Vec<_> = p
            .commands
            .iter()
            .map(|x| (label("policy", &x.policy), x))
            .collect();
        m.per(COMMAND_POLICY, &commands);
        m.single(POLICY_IDS, p);
        if let Some(f) = &p.file {
            m.single(POLICIES_FILE, f);
        }
    }
    if let Some(o) = s.section::<OtelStats>(crate::otel::STATS_SECTION) {
        m.single(OTEL, o);
        m.split(
            "otel_spans_dropped",
            "spans the OpenTelemetry exporter lost, by reason",
            "reason",
            &[OTEL_DROPS],
            &[(vec![], o)],
        );
    }
    if let Some(h) = http {
        m.single(HTTP, h);
        m.split(
            "http_timeouts",
            "connections or requests of the HTTP API ended by a timeout, by phase",
            "phase",
            &[TIMEOUTS],
            &[(vec![], h)],
        );
    }
    if let Some(e) = events {
        m.single(EVENTS, e);
        m.split(
            "http_event_stream_dropped",
            "event-stream frames lost, by reason: a client's queue was full (it read too \
             slowly), or the stream's own bus or run-feed queue was (every client lost them)",
            "reason",
            &[EVENT_DROPS],
            &[(vec![], e)],
        );
        m.split(
            "http_event_stream_resumes",
            "event streams opened with a Last-Event-ID, by result",
            "result",
            &[EVENT_RESUMES],
            &[(vec![], e)],
        );
    }
    m
}

/// The subscriptions of one pattern, summed (the label set stays bounded however many
/// subscriptions come and go).
#[derive(Default)]
struct PatternStats {
    pattern: String,
    subscriptions: u64,
    delivered: u64,
    dropped: u64,
    queued: u64,
    capacity: u64,
}

fn by_pattern(subs: &[SubscriberStats]) -> Vec<PatternStats> {
    let mut out: Vec<PatternStats> = Vec::new();
    for s in subs {
        let i = match out.iter().position(|p| p.pattern == s.pattern) {
            Some(i) => i,
            None => {
                out.push(PatternStats {
                    pattern: s.pattern.clone(),
                    ..PatternStats::default()
                });
                out.len() - 1
            }
        };
        let p = &mut out[i];
        p.subscriptions += 1;
        p.delivered += s.delivered;
        p.dropped += s.dropped;
        p.queued += s.queued;
        p.capacity += s.capacity;
    }
    out
}

/// One metric family: its name (without the prefix and `_total`), help, type and value.
struct Def<T> {
    name: &'static str,
    help: &'static str,
    gauge: bool,
    value: fn(&T) -> u64,
}

const fn counter<T>(name: &'static str, help: &'static str, value: fn(&T) -> u64) -> Def<T> {
    Def {
        name,
        help,
        gauge: false,
        value,
    }
}

const fn gauge<T>(name: &'static str, help: &'static str, value: fn(&T) -> u64) -> Def<T> {
    Def {
        name,
        help,
        gauge: true,
        value,
    }
}

/// The parts of one counter, told apart by a label (`reason`, `outcome`, `result`).
type Parts<T> = &'static [(&'static str, fn(&T) -> u64)];

const PIPELINE: &[Def<Stats>] = &[
    counter("events_emitted", "calls to emit", |s| s.emitted),
    counter("events_queued", "events accepted into the ring", |s| {
        s.queued
    }),
    counter(
        "events_dropped_bytes",
        "bytes of every refused event",
        |s| s.dropped_bytes,
    ),
    counter("events_skipped", "events nobody listened to", |s| s.skipped),
    counter(
        "events_processed",
        "events the workers handed to the sinks",
        |s| s.processed,
    ),
    counter("sink_panics", "panics caught inside a sink", |s| {
        s.sink_panics
    }),
    gauge("ring_depth", "events in the rings now", |s| s.ring.depth),
    gauge("ring_capacity", "ring slots, all rings", |s| {
        s.ring.capacity
    }),
    gauge("ring_shards", "rings (one per worker)", |s| s.ring.shards),
    gauge(
        "ring_inline_bytes",
        "bytes of the preallocated slot buffers",
        |s| s.ring.inline_bytes,
    ),
    gauge(
        "ring_budget_in_use_bytes",
        "bytes of large events held now",
        |s| s.ring.budget_in_use,
    ),
    gauge("ring_budget_bytes", "the large-event byte budget", |s| {
        s.ring.budget
    }),
];

const DROPS: Parts<Stats> = &[
    ("ring_full", |s| s.dropped),
    ("byte_budget", |s| s.dropped_budget),
    ("oversize", |s| s.oversize),
    // Queued, but still in a ring when the shutdown deadline passed (ARCHITECTURE.md §
    // Shutdown): unlike the reasons above these events were `Queued`, not refused.
    ("shutdown", |s| s.dropped_shutdown),
];

const SINK: &[Def<SinkStats>] = &[
    counter("sink_sent", "events given to a sink", |x| x.counts.sent),
    counter("sink_delivered", "events a sink delivered", |x| {
        x.counts.delivered
    }),
    counter("sink_dropped", "events a sink dropped", |x| {
        x.counts.dropped
    }),
    counter("sink_failed", "events a sink failed to deliver", |x| {
        x.counts.failed
    }),
    gauge("sink_in_flight", "events a sink holds now", |x| {
        x.counts.in_flight
    }),
];

const SUBSCRIPTIONS: &[Def<PatternStats>] = &[
    gauge("subscribers", "live bus subscriptions of a pattern", |x| {
        x.subscriptions
    }),
    counter(
        "subscriber_delivered",
        "messages put into the queues of a pattern's live subscriptions",
        |x| x.delivered,
    ),
    counter(
        "subscriber_dropped",
        "messages a pattern's live subscriptions lost to a full queue",
        |x| x.dropped,
    ),
    gauge(
        "subscriber_queued",
        "messages waiting in a pattern's subscription queues",
        |x| x.queued,
    ),
    gauge(
        "subscriber_capacity",
        "queue capacity of a pattern's subscriptions",
        |x| x.capacity,
    ),
];

const TOKEN_KINDS: Parts<AgentTokens> = &[
    ("input", |x| x.tokens.input),
    ("output", |x| x.tokens.output),
    ("cache_read", |x| x.tokens.cache_read),
    ("cache_creation", |x| x.tokens.cache_creation),
];

const POLICY_OUTCOMES: Parts<PoliciesStats> = &[
    ("allow", |x| x.allow),
    ("ask", |x| x.ask),
    ("deny", |x| x.deny),
    ("none", |x| x.none),
    ("refused", |x| x.refused),
];

const POLICY: &[Def<PolicyCount>] = &[counter(
    "policy_decided",
    "questions one policy answered (it was the policy reported), with its decision",
    |x| x.decisions,
)];

const COMMAND_POLICY: &[Def<CommandCount>] = &[
    counter(
        "policy_command_runs",
        "runs of one command policy's guard",
        |x| x.runs,
    ),
    counter(
        "policy_command_timed_out",
        "guard runs killed at their deadline",
        |x| x.timed_out,
    ),
    counter(
        "policy_command_cut_by_asker",
        "guard runs killed at the asker's deadline, before their own timeout_ms (of timed_out)",
        |x| x.cut_by_asker,
    ),
    counter(
        "policy_command_crashed",
        "guard runs that exited with a code other than 0 and 2, or by a signal",
        |x| x.crashed,
    ),
    counter(
        "policy_command_bad_answers",
        "guard runs whose stdout was not a JSON decision",
        |x| x.bad_answer,
    ),
    counter(
        "policy_command_too_large",
        "guard runs killed for writing more than the answer limit on stdout",
        |x| x.too_large,
    ),
    counter(
        "policy_command_spawn_failed",
        "guard runs that could not be started",
        |x| x.spawn_failed,
    ),
    counter(
        "policy_command_cancelled",
        "guard runs killed because another source had already denied",
        |x| x.cancelled,
    ),
    counter(
        "policy_command_decided",
        "questions one command policy answered (it was the policy reported)",
        |x| x.decisions,
    ),
];

const POLICY_IDS: &[Def<PoliciesStats>] = &[counter(
    "policy_duplicate_ids",
    "WASM policies refused at load because policies.json or an earlier plugin has their id",
    |x| x.duplicate_ids,
)];

const POLICIES_FILE: &[Def<ConfigStats>] = &[
    counter(
        "policies_reload_errors",
        "policies.json loads rejected",
        |c| c.reload_errors,
    ),
    gauge(
        "policies_failing",
        "1 while policies.json on disk is rejected",
        |c| c.failing as u64,
    ),
    gauge("policies_loaded", "policies in the active table", |c| {
        c.actions as u64
    }),
];

const CONFIG: &[Def<ConfigStats>] = &[
    counter(
        "config_reloads",
        "hooks.json tables that went live after the first",
        |c| c.reloads,
    ),
    counter("config_reload_errors", "hooks.json loads rejected", |c| {
        c.reload_errors
    }),
    counter(
        "config_unchanged",
        "hooks.json changes that left its bytes as they were",
        |c| c.unchanged,
    ),
    gauge(
        "config_loaded",
        "1 if the active table was read from hooks.json",
        |c| c.loaded as u64,
    ),
    gauge(
        "config_failing",
        "1 while hooks.json on disk is rejected",
        |c| c.failing as u64,
    ),
    gauge("config_actions", "hooks in the active table", |c| {
        c.actions as u64
    }),
    gauge(
        "config_enabled",
        "1 if the active table's global switch is on",
        |c| c.enabled as u64,
    ),
    gauge(
        "config_warnings",
        "load-time warnings of the active table",
        |c| c.warnings as u64,
    ),
];

const SHELL: &[Def<ShellStats>] = &[
    counter(
        "shell_sent",
        "runs the shell backend accepted, every hook",
        |s| s.totals.sent,
    ),
    gauge("shell_running", "shell hook processes running now", |s| {
        s.totals.running
    }),
    gauge("shell_queued", "shell hook runs waiting in queues", |s| {
        s.totals.queued
    }),
    gauge(
        "shell_direct_running",
        "test and fire runs running now",
        |s| s.direct_running,
    ),
];

const HOOK: &[Def<HookCounts>] = &[
    counter("shell_hook_sent", "runs one shell hook accepted", |c| {
        c.sent
    }),
    gauge(
        "shell_hook_running",
        "processes of one shell hook running now",
        |c| c.running,
    ),
    gauge("shell_hook_queued", "runs of one shell hook waiting", |c| {
        c.queued
    }),
];

const EXECUTIONS: Parts<HookCounts> = &[
    ("ok", |c| c.ok),
    ("exit", |c| c.exit),
    ("signal", |c| c.signal),
    ("timed_out", |c| c.timed_out),
    ("spawn_failed", |c| c.spawn_failed),
    ("killed", |c| c.killed),
];

const NOT_RUN: Parts<HookCounts> = &[
    ("dropped", |c| c.dropped),
    ("cancelled", |c| c.cancelled),
    ("skipped", |c| c.skipped),
];

const HTTP: &[Def<HttpStats>] = &[
    gauge(
        "http_connections_open",
        "HTTP API connections open now",
        |h| h.open,
    ),
    gauge(
        "http_connections_max",
        "the HTTP API's connection cap",
        |h| h.max_connections,
    ),
    counter(
        "http_connections_accepted",
        "HTTP API connections accepted",
        |h| h.accepted,
    ),
    gauge(
        "http_connections_authenticated",
        "HTTP API connections open now on which a request has shown the token",
        |h| h.authenticated,
    ),
    counter(
        "http_connections_refused",
        "HTTP API connections closed at once over the cap (every open one had shown the token)",
        |h| h.refused_over_cap,
    ),
    counter(
        "http_connections_evicted",
        "HTTP API connections without the token closed to make room for a new one at the cap",
        |h| h.evicted,
    ),
    counter(
        "http_connections_closed_unauthorized",
        "HTTP API connections closed after a 401 or 403",
        |h| h.closed_unauthorized,
    ),
    counter(
        "http_accept_errors",
        "failed accepts (out of file descriptors, …)",
        |h| h.accept_errors,
    ),
];

const EVENTS: &[Def<EventStreamStats>] = &[
    gauge(
        "http_event_streams",
        "GET /api/events streams open now",
        |e| e.streams,
    ),
    gauge(
        "http_event_streams_max",
        "the event-stream cap in force",
        |e| e.max_streams,
    ),
    counter("http_event_streams_opened", "event streams opened", |e| {
        e.opened
    }),
    counter(
        "http_event_streams_refused",
        "event streams refused over the cap (429)",
        |e| e.refused,
    ),
    counter(
        "http_event_stream_items",
        "items the event stream numbered (bus messages, runs, plugin aggregates, drop notices)",
        |e| e.items,
    ),
    counter(
        "http_event_stream_delivered",
        "event-stream frames handed to clients' queues",
        |e| e.delivered,
    ),
    gauge(
        "http_event_stream_backlog",
        "items kept for Last-Event-ID resumes",
        |e| e.backlog,
    ),
    gauge(
        "http_event_stream_backlog_bytes",
        "bytes of the items kept for resumes",
        |e| e.backlog_bytes,
    ),
];

const EVENT_DROPS: Parts<EventStreamStats> = &[
    ("client_queue_full", |e| e.dropped_client),
    ("server_queue_full", |e| e.dropped_server),
];

const EVENT_RESUMES: Parts<EventStreamStats> = &[
    ("whole", |e| e.resumed - e.gaps.min(e.resumed)),
    ("gap", |e| e.gaps),
];

const TIMEOUTS: Parts<HttpStats> = &[
    ("header", |h| h.header_timeouts),
    ("body", |h| h.body_timeouts),
    ("write", |h| h.write_timeouts),
];

const OTEL: &[Def<OtelStats>] = &[
    counter(
        "otel_events",
        "lifecycle events the span builder read",
        |o| o.events,
    ),
    counter("otel_spans", "spans finished", |o| o.spans),
    counter(
        "otel_spans_exported",
        "spans the OTLP receiver accepted",
        |o| o.exported,
    ),
    counter(
        "otel_unmatched_starts",
        "starts never ended, ended at the idle limit, at shutdown or by the bounds",
        |o| o.unmatched_starts,
    ),
    counter(
        "otel_unmatched_ends",
        "ends without a start, exported as zero-length spans",
        |o| o.unmatched_ends,
    ),
    counter(
        "otel_hook_spans",
        "execute_hook spans made from hook outcomes",
        |o| o.hook_spans,
    ),
    counter(
        "otel_runs_missed",
        "hook outcomes the run feed could not hand to the span builder",
        |o| o.runs_missed,
    ),
    counter("otel_requests", "OTLP export requests sent", |o| o.requests),
    counter("otel_retries", "OTLP export requests retried", |o| {
        o.retries
    }),
    gauge(
        "otel_queued",
        "spans waiting in the export queue or in a request",
        |o| o.queued,
    ),
    gauge("otel_capacity", "the export queue's bound", |o| o.capacity),
    gauge(
        "otel_stalled",
        "1 while the batch being sent has gone unsettled for the request timeout",
        |o| u64::from(o.stalled),
    ),
];

const OTEL_DROPS: Parts<OtelStats> = &[
    ("queue_full", |o| o.dropped_queue_full),
    ("retries", |o| o.dropped_retries),
    ("rejected", |o| o.rejected),
    ("shutdown", |o| o.dropped_shutdown),
];

const NATS_PUBLISH: &[Def<PublishStats>] = &[
    gauge(
        "nats_publish_connected",
        "1 while the NATS publisher is connected",
        |p| p.connected as u64,
    ),
    counter(
        "nats_publish_offered",
        "bus messages matching the publisher's pattern",
        |p| p.offered,
    ),
    counter(
        "nats_publish_published",
        "messages the NATS server confirmed (an echo, or a JetStream ack)",
        |p| p.published,
    ),
    counter("nats_publish_acked", "JetStream acks", |p| p.acked),
    counter(
        "nats_publish_relayed",
        "consumed events republished with their origin and id",
        |p| p.relayed,
    ),
    counter(
        "nats_publish_duplicates",
        "JetStream acks of a retry the stream already had",
        |p| p.duplicates,
    ),
    counter(
        "nats_publish_resent",
        "messages sent again after a reconnect or a failed ack",
        |p| p.resent,
    ),
    counter(
        "nats_publish_failed",
        "messages the server refused for good",
        |p| p.failed,
    ),
    counter(
        "nats_publish_reconnects",
        "NATS publisher connections after the first",
        |p| p.reconnects,
    ),
    gauge(
        "nats_publish_buffered",
        "messages waiting to be sent or confirmed",
        |p| p.buffered,
    ),
    gauge(
        "nats_publish_capacity",
        "messages the publisher can hold while the server is unreachable",
        |p| p.capacity,
    ),
];

const NATS_PUBLISH_DROPS: Parts<PublishStats> = &[
    ("buffer_full", |p| p.dropped),
    ("shutdown", |p| p.dropped_shutdown),
];

const NATS_CONSUME: &[Def<ConsumeStats>] = &[
    gauge(
        "nats_consume_connected",
        "1 while the NATS consumer is connected",
        |c| c.connected as u64,
    ),
    counter("nats_consume_received", "messages taken from NATS", |c| {
        c.received
    }),
    counter(
        "nats_consume_consumed",
        "messages handed to the pipeline",
        |c| c.consumed,
    ),
    counter(
        "nats_consume_skipped",
        "handed messages nobody listened to",
        |c| c.skipped,
    ),
    counter(
        "nats_consume_duplicates",
        "messages skipped: their Nats-Msg-Id was handed over already",
        |c| c.duplicates,
    ),
    counter(
        "nats_consume_own",
        "messages skipped: published by this process",
        |c| c.own,
    ),
    counter(
        "nats_consume_without_id",
        "messages without a Nats-Msg-Id",
        |c| c.without_id,
    ),
    counter(
        "nats_consume_id_conflicts",
        "messages with a handed-over Nats-Msg-Id but another body: handed over",
        |c| c.id_conflicts,
    ),
    counter(
        "nats_consume_given_up",
        "JetStream messages the durable consumer gave up on after max_deliver deliveries",
        |c| c.given_up,
    ),
    counter("nats_consume_acked", "JetStream acks sent", |c| c.acked),
    counter(
        "nats_consume_paused",
        "times intake paused for a busy pipeline",
        |c| c.paused,
    ),
    counter(
        "nats_consume_slow_consumer",
        "core NATS messages the client dropped while intake was paused",
        |c| c.slow_consumer,
    ),
    counter(
        "nats_consume_reconnects",
        "NATS consumer connections after the first",
        |c| c.reconnects,
    ),
    gauge(
        "nats_consume_window",
        "message ids in the de-dup window",
        |c| c.window,
    ),
    counter(
        "nats_consume_retried",
        "JetStream messages a hook's queue dropped: nak'ed for redelivery",
        |c| c.retried,
    ),
    counter(
        "nats_consume_shared_duplicates",
        "duplicates recognized by the shared de-dup bucket",
        |c| c.shared_duplicates,
    ),
    counter(
        "nats_consume_reclaimed",
        "JetStream messages run although another host had claimed them in the de-dup bucket (maybe run twice)",
        |c| c.reclaimed,
    ),
    counter(
        "nats_consume_dropped_full",
        "core NATS messages dropped by the consumer's full buffer",
        |c| c.dropped_full,
    ),
    gauge(
        "nats_consume_in_flight",
        "JetStream messages handed over and waiting for their hooks before the ack",
        |c| c.in_flight,
    ),
    gauge(
        "nats_consume_buffered",
        "core NATS messages in the consumer's buffer",
        |c| c.buffered,
    ),
    gauge(
        "nats_consume_buffered_bytes",
        "bytes of the core NATS messages in the consumer's buffer",
        |c| c.buffered_bytes,
    ),
];

const NATS_CONSUME_REFUSED: Parts<ConsumeStats> = &[
    ("headers", |c| c.refused_headers),
    ("body", |c| c.refused_body),
    ("subject", |c| c.refused_subject),
    ("oversize", |c| c.refused_oversize),
    ("loop", |c| c.loops),
];

const PLUGINS: &[Def<PluginsStats>] = &[
    counter(
        "plugins_reloads",
        "plugin loads that started or stopped a plugin",
        |p| p.reloads,
    ),
    counter("plugins_compiled", "components compiled", |p| p.compiled),
    counter(
        "plugins_cache_hits",
        "components loaded from the compile cache",
        |p| p.cache_hits,
    ),
    gauge(
        "plugins_load_errors",
        "problems of the last plugin load",
        |p| p.errors.len() as u64,
    ),
    gauge(
        "plugins_pool_instances",
        "instances the pooling allocator holds",
        |p| p.pool_instances,
    ),
    gauge(
        "plugins_pool_max_memory_bytes",
        "the pool's largest linear memory",
        |p| p.pool_max_memory_mb << 20,
    ),
];

const PLUGIN: &[Def<PluginStats>] = &[
    counter("plugin_sent", "lifecycle events given to a plugin", |x| {
        x.counts.sent
    }),
    counter(
        "plugin_delivered",
        "events a plugin handled without error",
        |x| x.counts.delivered,
    ),
    counter(
        "plugin_dropped",
        "DEPRECATED: the sum of plugin_dropped_reason; events a plugin never saw",
        |x| x.counts.dropped,
    ),
    counter("plugin_failed", "events whose call failed", |x| {
        x.counts.failed
    }),
    counter(
        "plugin_topic_messages",
        "calls for the plugin's own subscriptions",
        |x| x.counts.topic_messages,
    ),
    counter("plugin_instances_created", "instances created", |x| {
        x.counts.instances_created
    }),
    counter(
        "plugin_instances_replaced",
        "instances replaced after a fault",
        |x| x.counts.instances_replaced,
    ),
    counter(
        "plugin_suspensions",
        "times the breaker suspended the plugin",
        |x| x.counts.suspensions,
    ),
    gauge("plugin_in_flight", "events queued or being handled", |x| {
        x.counts.in_flight
    }),
    gauge(
        "plugin_queued",
        "events waiting in the plugin's queues",
        |x| x.queued,
    ),
    gauge("plugin_kv_bytes", "bytes in the plugin's kv store", |x| {
        x.kv_bytes
    }),
    gauge("plugin_pool_size", "the plugin's instances", |x| {
        x.pool_size
    }),
    gauge(
        "plugin_running",
        "1 if running (0: suspended or stopped)",
        |x| (x.state == "running") as u64,
    ),
];

const PLUGIN_DROPS: Parts<PluginStats> = &[
    ("queue_full", |x| x.counts.dropped_queue_full),
    ("suspended", |x| x.counts.dropped_suspended),
    ("shutdown", |x| x.counts.dropped_shutdown),
    ("fenced", |x| x.counts.dropped_fenced),
];

const CALLS: Parts<PluginStats> = &[
    ("ok", |x| x.counts.ok),
    ("error", |x| x.counts.errors),
    ("trap", |x| x.counts.traps),
    ("timeout", |x| x.counts.timeouts),
    ("out_of_fuel", |x| x.counts.out_of_fuel),
];

type Labels = Vec<(&'static str, String)>;

fn label(key: &'static str, value: &str) -> Labels {
    vec![(key, value.to_string())]
}

/// One metric family of a scrape: its name (without the prefix and `_total`), help, type
/// and samples (label values as they are, escaped by each format).
struct Family {
    name: String,
    help: String,
    gauge: bool,
    /// A family with labels; `false`: one unlabelled metric.
    labelled: bool,
    samples: Vec<(Labels, u64)>,
}

/// One scrape's families, in the order they are exposed.
struct Metrics(Vec<Family>);

impl Metrics {
    /// One unlabelled metric per definition.
    fn single<T>(&mut self, defs: &[Def<T>], x: &T) {
        for d in defs {
            self.0.push(Family {
                name: d.name.into(),
                help: d.help.into(),
                gauge: d.gauge,
                labelled: false,
                samples: vec![(Vec::new(), (d.value)(x))],
            });
        }
    }

    /// One family per definition, one sample per item.
    fn per<T>(&mut self, defs: &[Def<T>], items: &[(Labels, &T)]) {
        for d in defs {
            let samples = items.iter().map(|(l, x)| (l.clone(), (d.value)(x)));
            self.family(d.name, d.help, d.gauge, samples);
        }
    }

    /// One counter family: for every item, one sample per part, the part named by `key`.
    fn split<T>(
        &mut self,
        name: &str,
        help: &str,
        key: &'static str,
        parts: &[Parts<T>],
        items: &[(Labels, &T)],
    ) {
        let samples = items.iter().flat_map(|(labels, x)| {
            parts
                .iter()
                .flat_map(|p| p.iter())
                .map(move |(part, value)| {
                    let mut l = labels.clone();
                    l.push((key, part.to_string()));
                    (l, value(x))
                })
        });
        self.family(name, help, false, samples);
    }

    fn family(
        &mut self,
        name: &str,
        help: &str,
        gauge: bool,
        samples: impl Iterator<Item = (Labels, u64)>,
    ) {
        self.0.push(Family {
            name: name.into(),
            help: help.into(),
            gauge,
            labelled: true,
            samples: samples.collect(),
        });
    }

    /// The OpenMetrics text, by `prometheus-client`.
    fn openmetrics(&self) -> Result<String, std::fmt::Error> {
        let mut r = Registry::with_prefix(PREFIX);
        for f in &self.0 {
            match (f.labelled, f.gauge) {
                (false, gauge) => {
                    let v = f.samples.first().map_or(0, |(_, v)| *v);
                    if gauge {
                        let g = Gauge::<i64>::default();
                        g.set(clamp(v));
                        r.register(&f.name, &f.help, g);
                    } else {
                        let c = Counter::<u64>::default();
                        c.inc_by(v);
                        r.register(&f.name, &f.help, c);
                    }
                }
                (true, true) => {
                    let family = PromFamily::<Labels, Gauge<i64>>::default();
                    for (labels, v) in &f.samples {
                        family.get_or_create(&escape(labels.clone())).set(clamp(*v));
                    }
                    r.register(&f.name, &f.help, family);
                }
                (true, false) => {
                    let family = PromFamily::<Labels, Counter<u64>>::default();
                    for (labels, v) in &f.samples {
                        family.get_or_create(&escape(labels.clone())).inc_by(*v);
                    }
                    r.register(&f.name, &f.help, family);
                }
            }
        }
        let mut text = String::new();
        encode(&mut text, &r)?;
        Ok(text)
    }
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// prometheus-client 0.24 writes label values as they are; the text format needs `\`, `"` and
/// newlines escaped (the classic format escapes its own: `format.rs`).
fn escape(labels: Labels) -> Labels {
    labels
        .into_iter()
        .map(|(k, v)| {
            if v.contains(['\\', '"', '\n']) {
                let v = v
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                (k, v)
            } else {
                (k, v)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_otel_exporter_has_its_families() {
        let mut s = Stats::default();
        let o = OtelStats {
            spans: 9,
            exported: 5,
            dropped_queue_full: 2,
            dropped_retries: 1,
            rejected: 1,
            queued: 0,
            stalled: true,
            ..Default::default()
        };
        s.set_section(crate::otel::STATS_SECTION, Some(o));
        let text = exposition(&s, None, None).unwrap();
        for line in [
            "prx_hooks_otel_spans_total 9",
            "prx_hooks_otel_spans_exported_total 5",
            r#"prx_hooks_otel_spans_dropped_total{reason="queue_full"} 2"#,
            r#"prx_hooks_otel_spans_dropped_total{reason="retries"} 1"#,
            r#"prx_hooks_otel_spans_dropped_total{reason="rejected"} 1"#,
            "prx_hooks_otel_queued 0",
            "prx_hooks_otel_stalled 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in {text}");
        }
        let text = exposition(&Stats::default(), None, None).unwrap();
        assert!(!text.contains("otel_"), "{text}");
    }

    #[test]
    fn the_nats_bridge_has_its_families() {
        let mut s = Stats::default();
        let n = crate::nats::NatsStats {
            publish: Some(PublishStats {
                published: 7,
                dropped: 2,
                dropped_shutdown: 1,
                connected: true,
                relayed: 5,
                ..Default::default()
            }),
            consume: Some(ConsumeStats {
                duplicates: 3,
                refused_headers: 4,
                loops: 6,
                given_up: 8,
                id_conflicts: 9,
                ..Default::default()
            }),
        };
        s.set_section(crate::nats::STATS_SECTION, Some(n));
        let text = exposition(&s, None, None).unwrap();
        for line in [
            "prx_hooks_nats_publish_published_total 7",
            "prx_hooks_nats_publish_connected 1",
            r#"prx_hooks_nats_publish_dropped_total{reason="buffer_full"} 2"#,
            r#"prx_hooks_nats_publish_dropped_total{reason="shutdown"} 1"#,
            "prx_hooks_nats_consume_duplicates_total 3",
            r#"prx_hooks_nats_consume_refused_total{reason="headers"} 4"#,
            r#"prx_hooks_nats_consume_refused_total{reason="loop"} 6"#,
            "prx_hooks_nats_consume_given_up_total 8",
            "prx_hooks_nats_consume_id_conflicts_total 9",
            "prx_hooks_nats_publish_relayed_total 5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in {text}");
        }
        // Without a bridge, none of them.
        let text = exposition(&Stats::default(), None, None).unwrap();
        assert!(!text.contains("nats_"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = Stats::default();
        s.subscribers.push(SubscriberStats {
            id: 7,
            pattern: "a\"b\\c\nd".into(),
            ..Default::default()
        });
        let text = exposition(&s, None, None).unwrap();
        assert!(
            text.contains(r#"prx_hooks_subscriber_queued{pattern="a\"b\\c\nd"} 0"#),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
