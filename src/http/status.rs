//! `/healthz`, `/api/stats` and `/api/plugins`: read-only views of [`Hooks::stats`].
//!
//! [`Hooks::stats`]: crate::Hooks::stats

use super::error::ApiError;
use super::json_response;
use super::{Api, ApiState};
use crate::Stats;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::Arc;

/// 200 `{"status":"ok"}` while running, 503 once shutdown has begun. No token needed.
pub(crate) async fn healthz(State(api): ApiState) -> Response {
    if api.hooks.is_shut_down() {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "shutting_down" }),
        )
    } else {
        json_response(StatusCode::OK, &json!({ "status": "ok" }))
    }
}

/// The whole [`Stats`](crate::Stats) snapshot, plus `http` (the [`super::HttpStats`] of the
/// serving [`super::Server`], when the API is served by one) and `events` (the
/// [`super::EventStreamStats`] of `/api/events`).
pub(crate) async fn stats(State(api): ApiState) -> Response {
    let http = api.conns.as_ref().map(|c| c.snapshot());
    let events = api.events.stats();
    let api_ingest = api.ingest.snapshot();
    let transcripts = api.opts.transcripts.as_ref().map(|t| t.stats());
    match snapshot(api).await {
        Ok(stats) => match serde_json::to_value(&stats) {
            Ok(Value::Object(mut m)) => {
                if let Some(http) = http {
                    m.insert("http".into(), json!(http));
                }
                m.insert("events".into(), json!(events));
                m.insert("ingest".into(), json!(api_ingest));
                if let Some(t) = transcripts {
                    m.insert(crate::ingest::TRANSCRIPTS_SECTION.into(), json!(t));
                }
                json_response(StatusCode::OK, &m)
            }
            _ => json_response(StatusCode::OK, &stats),
        },
        Err(e) => e.into_response(),
    }
}

/// `Hooks::stats()` on the blocking pool: it takes the backends' locks, and the plugin
/// backend's is held while a plugin compiles.
pub(crate) async fn snapshot(api: Arc<Api>) -> Result<Stats, ApiError> {
    tokio::task::spawn_blocking(move || api.hooks.stats())
        .await
        .map_err(|e| ApiError::internal(format!("reading the stats failed: {e}")))
}

/// Loaded plugins (events, state, counters) and the last load's errors. `enabled` is false
/// without a workspace or without the `wasm` feature.
pub(crate) async fn plugins(State(api): ApiState) -> Response {
    let stats = match snapshot(api).await {
        Ok(stats) => stats,
        Err(e) => return e.into_response(),
    };
    let body = match stats.plugins() {
        Some(p) => {
            let mut v = serde_json::to_value(p).unwrap_or_else(|_| json!({}));
            if let Value::Object(m) = &mut v {
                m.insert("enabled".into(), true.into());
            }
            v
        }
        None => json!({ "enabled": false, "plugins": [], "errors": [] }),
    };
    json_response(StatusCode::OK, &body)
}

/// `GET /api/sessions`: the sessions the session map holds, most recently used first, each
/// with the tokens its events carried (`{"sessions": [{agent, session, idle_ms,
/// input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens}]}`).
pub(crate) async fn sessions(State(api): ApiState) -> Response {
    let hooks = api.hooks.clone();
    match tokio::task::spawn_blocking(move || hooks.sessions().held()).await {
        Ok(held) => json_response(StatusCode::OK, &json!({ "sessions": held })),
        Err(e) => ApiError::internal(format!("reading the sessions failed: {e}")).into_response(),
    }
}
