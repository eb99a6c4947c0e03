//! `/healthz`, `/api/stats` and `/api/plugins`: read-only views of [`Hooks::stats`].
//!
//! [`Hooks::stats`]: crate::Hooks::stats

use super::ApiState;
use super::hooks::json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

/// 200 `{"status":"ok"}` while running, 503 once shutdown has begun. No token needed.
pub(crate) async fn healthz(State(api): ApiState) -> Response {
    if api.hooks.is_shut_down() {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "shutting_down" }),
        )
    } else {
        json(StatusCode::OK, &json!({ "status": "ok" }))
    }
}

/// The whole [`Stats`](crate::Stats) snapshot.
pub(crate) async fn stats(State(api): ApiState) -> Response {
    json(StatusCode::OK, &api.hooks.stats())
}

/// Loaded plugins (events, state, counters) and the last load's errors. `enabled` is false
/// without a workspace or without the `wasm` feature.
pub(crate) async fn plugins(State(api): ApiState) -> Response {
    let body = match api.hooks.stats().plugins {
        Some(p) => {
            let mut v = serde_json::to_value(p).unwrap_or_else(|_| json!({}));
            if let Value::Object(m) = &mut v {
                m.insert("enabled".into(), true.into());
            }
            v
        }
        None => json!({ "enabled": false, "plugins": [], "errors": [] }),
    };
    json(StatusCode::OK, &body)
}
