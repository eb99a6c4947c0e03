//! `POST /api/events` and `POST /api/ingest/{agent}`: events into the pipeline over HTTP,
//! answered as soon as they are in the ring (ARCHITECTURE.md § Ingest).
//!
//! The body is read whole (at most [`HttpOptions::max_ingest_bytes`](super::HttpOptions), 413
//! past it), then every line goes through the one line ingest every input shares
//! ([`LineIngest`]: the `run --events` parser, the oversize check, the session map), so the
//! per-(agent, session) order holds across requests and connections. The answer is the
//! [`IngestReport`]: `{"queued","dropped","skipped","refused","errors","more_errors"}`. A hook
//! is never waited for: `emit` never blocks, and a full ring is `dropped`, counted.

use super::auth::Local;
use super::body::{self, Media};
use super::error::ApiError;
use super::json_response;
use super::query;
use super::{Api, ApiState};
use crate::agents::{Agent, TranslateOptions};
use crate::ingest::{IngestOptions, IngestReport, LineIngest, LineOrigin, Outcome};
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bodies up to this size are read on the connection's task; larger ones on the blocking pool
/// (parsing a few MiB takes milliseconds, which other connections must not wait for).
const INLINE_BYTES: usize = 256 * 1024;

/// What the ingest routes did since the API started: `ingest` in `/api/stats`.
#[derive(Debug, Default)]
pub(crate) struct IngestCounters {
    requests: AtomicU64,
    /// Requests refused whole (413, 415, 400 on the query, 408, 503).
    refused_requests: AtomicU64,
    queued: AtomicU64,
    dropped: AtomicU64,
    skipped: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    duplicates: AtomicU64,
}

/// A snapshot of the ingest routes' counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IngestStats {
    /// Requests to `POST /api/events` and `POST /api/ingest/{agent}`.
    pub requests: u64,
    /// Of those, refused whole (body too large, wrong media type, bad query, stalled body,
    /// shutting down, an agent payload that could not be read).
    pub refused_requests: u64,
    /// Lines in the ring (or, for topic lines, taken by a bus subscriber).
    pub queued: u64,
    /// Lines `emit` refused (ring full, byte budget).
    pub dropped: u64,
    /// Lines nobody listens to.
    pub skipped: u64,
    /// Lines the session map had no room for.
    pub refused: u64,
    /// Lines that were not events, or too large.
    pub errors: u64,
    /// Lines whose event id (`Prx-Event-Id`) belongs to an event that ran already: not
    /// emitted again.
    pub duplicates: u64,
}

impl IngestCounters {
    pub(crate) fn snapshot(&self) -> IngestStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        IngestStats {
            requests: get(&self.requests),
            refused_requests: get(&self.refused_requests),
            queued: get(&self.queued),
            dropped: get(&self.dropped),
            skipped: get(&self.skipped),
            refused: get(&self.refused),
            errors: get(&self.errors),
            duplicates: get(&self.duplicates),
        }
    }

    pub(crate) fn count(&self, report: &IngestReport) {
        let add = |c: &AtomicU64, n: u64| {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.queued, report.queued);
        add(&self.dropped, report.dropped);
        add(&self.skipped, report.skipped);
        add(&self.refused, report.refused);
        add(
            &self.errors,
            report.errors.len() as u64 + report.more_errors,
        );
        add(&self.duplicates, report.duplicates);
    }

    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused_request(&self) {
        self.refused_requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// `POST /api/events[?lenient=true]`: the body's NDJSON lines into the ring; 200 with the
/// [`IngestReport`].
pub(crate) async fn post(
    State(api): ApiState,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    api.ingest.request();
    let refused = |e: ApiError| {
        api.ingest.refused_request();
        e
    };
    let lenient = lenient(&uri).map_err(refused)?;
    let origin = Origin::from_headers(&headers).map_err(refused)?;
    shutting_down(&api).map_err(refused)?;
    let limit = api.opts.max_ingest_bytes;
    let bytes = body::raw(&api, &headers, body, limit, Media::Ndjson)
        .await
        .map_err(refused)?;
    let opts = IngestOptions::default().lenient(lenient);
    let report = feed(&api, opts, bytes, origin).await?;
    api.ingest.count(&report);
    Ok(json_response(StatusCode::OK, &report))
}

/// Feeds `bytes` through a [`LineIngest`] of its own (its lines are numbered from 1), on the
/// blocking pool when they are many.
pub(crate) async fn feed(
    api: &Arc<Api>,
    opts: IngestOptions,
    bytes: Vec<u8>,
    origin: Origin,
) -> Result<IngestReport, ApiError> {
    let run = move |hooks: &crate::Hooks, bytes: &[u8]| {
        let mut lines = LineIngest::new(hooks, opts);
        let base = origin.as_line();
        if base == LineOrigin::default() {
            lines.feed(bytes);
        } else {
            lines.feed_from(bytes, base, || None);
        }
        lines.into_report()
    };
    if bytes.len() <= INLINE_BYTES {
        return Ok(run(&api.hooks, &bytes));
    }
    let hooks = api.hooks.clone();
    tokio::task::spawn_blocking(move || run(&hooks, &bytes))
        .await
        .map_err(|e| ApiError::internal(format!("the ingest failed: {e}")))
}

/// What a sender said of its events in headers (ARCHITECTURE.md § Ingest, "Event ids"):
/// `Prx-Event-Id` (the events' id; line `n` of a `POST /api/events` body is `<id>-<n>`) and
/// `Prx-Timestamp` (when they happened, RFC 3339 in UTC).
#[derive(Clone, Debug, Default)]
pub(crate) struct Origin {
    id: Option<String>,
    time: Option<String>,
}

/// The header naming an ingested event's id (`POST /api/events`, `POST /api/ingest/{agent}`).
pub const EVENT_ID_HEADER: &str = "prx-event-id";
/// The header naming when an ingested event happened.
pub const TIMESTAMP_HEADER: &str = "prx-timestamp";

impl Origin {
    /// Both headers, checked: a bad one is a 400 naming it.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Origin, ApiError> {
        let text = |name: &str| -> Result<Option<String>, ApiError> {
            match headers.get(name) {
                None => Ok(None),
                Some(v) => v.to_str().map(|s| Some(s.trim().to_string())).map_err(|_| {
                    ApiError::bad_request(format!("{name}: not visible ASCII")).at(name)
                }),
            }
        };
        let origin = Origin {
            id: text(EVENT_ID_HEADER)?,
            time: text(TIMESTAMP_HEADER)?,
        };
        // `-<line>` is appended to a body's lines' ids: keep room for it.
        if let Some(id) = &origin.id {
            LineOrigin::default()
                .id(&format!("{id}-1"))
                .checked()
                .map_err(|e| {
                    ApiError::bad_request(format!("{EVENT_ID_HEADER}: {e}")).at(EVENT_ID_HEADER)
                })?;
        }
        if let Some(t) = &origin.time {
            LineOrigin::default().time(t).checked().map_err(|e| {
                ApiError::bad_request(format!("{TIMESTAMP_HEADER}: {e}")).at(TIMESTAMP_HEADER)
            })?;
        }
        Ok(origin)
    }

    pub(crate) fn as_line(&self) -> LineOrigin<'_> {
        let mut o = LineOrigin::default();
        if let Some(id) = &self.id {
            o = o.id(id);
        }
        if let Some(t) = &self.time {
            o = o.time(t);
        }
        o
    }
}

/// 503 once the hook system is shutting down: nothing would reach a hook.
pub(crate) fn shutting_down(api: &Api) -> Result<(), ApiError> {
    if api.hooks.is_shut_down() {
        return Err(ApiError::unavailable(
            "the hook system is shutting down; nothing was queued",
        ));
    }
    Ok(())
}

/// `?lenient=true|false` (also `1`, `0`, or the key alone for true).
fn lenient(uri: &Uri) -> Result<bool, ApiError> {
    let mut on = false;
    for (key, value) in query::pairs(uri, &["lenient"])? {
        on = flag(key, &value)?;
    }
    Ok(on)
}

/// A boolean query parameter's value: empty, `true` or `1`; `false` or `0`.
fn flag(key: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(ApiError::bad_request(format!(
            "{key}: expected true or false, found {}",
            crate::config::quote(other)
        ))
        .at(key.to_string())),
    }
}

/// `POST /api/ingest/{agent}[?agent=NAME&session=ID&report=true]`: one payload of an agent's own hook
/// (Claude Code's `http` hook type posts it; `prx-hooks send --from` too), translated by
/// [`agents::translate`](crate::agents::translate) into its lifecycle event or its
/// `prx.agent.<agent>.<event>` topic, then ingested like a line of `POST /api/events`.
///
/// Each translated payload's event name is recorded as seen for the agent of the route
/// (`GET /api/agents`, seen.rs).
///
/// The answer is the agents' "no decision, carry on" at once: `200 {}` (on the events Claude
/// Code, Codex and Gemini CLI let a hook decide, what the policies decided, in the agent's
/// documented format: `http/decide.rs`), with the line's
/// outcome in `X-Prx-Hooks-Outcome` (`queued`, `skipped`, `dropped`, `refused`, `error`). A
/// payload that cannot be translated is a 400 naming its place (for Claude Code a non-2xx
/// answer is a non-blocking error: the agent goes on and shows it); an unknown agent a 404.
/// With `report=true` (what `prx-hooks send` asks) the body is the line's [`IngestReport`]
/// instead, so a refusal's reason reaches the sender, and the decision, if any, is its
/// `answer` member.
pub(crate) async fn agent(
    State(api): ApiState,
    Local(local): Local,
    name: Result<Path<String>, PathRejection>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let received = std::time::Instant::now();
    api.ingest.request();
    let refused = |e: ApiError| {
        api.ingest.refused_request();
        e
    };
    let name = name.map(|Path(n)| n).unwrap_or_default();
    let Some(from) = Agent::from_name(&name) else {
        let known: Vec<&str> = Agent::ALL.iter().map(|a| a.name()).collect();
        return Err(refused(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no agent {}: expected one of {}",
                crate::config::quote(&name),
                known.join(", ")
            ),
        )));
    };
    let mut opts = TranslateOptions::default();
    let mut with_report = false;
    for (key, value) in query::pairs(&uri, &["agent", "session", "report"]).map_err(refused)? {
        match key {
            "agent" => opts.agent = Some(value),
            "session" => opts.session = Some(value),
            _ => with_report = flag(key, &value).map_err(refused)?,
        }
    }
    let origin = Origin::from_headers(&headers).map_err(refused)?;
    let until = super::decide::deadline(&headers, received).map_err(refused)?;
    shutting_down(&api).map_err(refused)?;
    let limit = api.opts.max_ingest_bytes;
    let bytes = body::raw(&api, &headers, body, limit, Media::Json)
        .await
        .map_err(refused)?;
    // Policies answer first (docs/policies.md § Doors); the event is ingested as always.
    let name = opts.agent.as_deref().unwrap_or(from.name());
    let (decided, stamp) = match super::decide::door_answer(&api, from, name, &bytes, until).await {
        Some(d) => (Some(d.answer), Some(d.stamp)),
        None => (None, None),
    };
    // A transcript is read off the async threads; only for a request from this machine.
    let transcripts = api
        .opts
        .transcripts
        .clone()
        .filter(|_| local && crate::agents::transcript::reads(from));
    let small = bytes.len() <= INLINE_BYTES && transcripts.is_none();
    let hooks = api.hooks.clone();
    let seen = api.clone();
    let work = move || {
        let mut translated = crate::agents::translate(from, &bytes, &opts)?;
        // The model calls of the turn this payload ends, before its end (docs/agents.md
        // § Transcripts).
        if let Some(reader) = &transcripts
            && let Some(report) = reader.ingest(&hooks, from, &translated)
        {
            seen.ingest.count(&report);
        }
        // The event carries what was decided (docs/policies.md § Audit).
        if let Some(stamp) = &stamp {
            stamp.stamp(&mut translated);
        }
        // Seen, whatever becomes of the line: `prx-hooks doctor` asks what reached us.
        seen.seen.record(from, &translated.event);
        let mut lines = LineIngest::new(&hooks, IngestOptions::default());
        let outcome = lines.translated_from(&translated, origin.as_line(), || None);
        Ok::<_, crate::agents::TranslateError>((outcome, lines.into_report()))
    };
    let done = if small {
        work()
    } else {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| ApiError::internal(format!("the ingest failed: {e}")))?
    };
    let (outcome, report) = match done {
        Ok(x) => x,
        // A decision made stands though the event could not be read: a non-2xx answer would
        // let Claude Code run the tool the policies denied, and `send` print "no decision".
        Err(e) if decided.is_some() => {
            api.ingest.refused_request();
            let decided = decided.unwrap_or_default();
            let body = if with_report {
                // The refusal as a report's error (line 1), the decision as its answer.
                let mut lines = LineIngest::new(&api.hooks, IngestOptions::default());
                lines.refuse(1, 1, &format!("body:{e}"));
                let mut body = serde_json::to_value(lines.into_report()).unwrap_or_default();
                body["answer"] = decided;
                body
            } else {
                decided
            };
            let mut resp = json_response(StatusCode::OK, &body);
            resp.headers_mut()
                .insert("x-prx-hooks-outcome", HeaderValue::from_static("error"));
            return Ok(resp);
        }
        Err(e) => {
            return Err(refused(
                ApiError::bad_request(format!("body:{e}")).at(e.path().to_string()),
            ));
        }
    };
    api.ingest.count(&report);
    let outcome = match outcome {
        Outcome::Queued => "queued",
        Outcome::Skipped => "skipped",
        Outcome::Dropped => "dropped",
        Outcome::Refused => "refused",
        Outcome::Duplicate => "duplicate",
        _ => "error",
    };
    let mut resp = if with_report {
        // `prx-hooks-send` prints the decision it finds here as the hook's answer.
        match (decided, serde_json::to_value(&report)) {
            (Some(answer), Ok(serde_json::Value::Object(mut body))) => {
                body.insert("answer".into(), answer);
                json_response(StatusCode::OK, &body)
            }
            _ => json_response(StatusCode::OK, &report),
        }
    } else {
        json_response(
            StatusCode::OK,
            &decided.unwrap_or_else(|| serde_json::json!({})),
        )
    };
    resp.headers_mut()
        .insert("x-prx-hooks-outcome", HeaderValue::from_static(outcome));
    Ok(resp)
}
