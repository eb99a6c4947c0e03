//! The HTTP management API (ARCHITECTURE.md § HTTP API): list, create, update, delete, toggle and test hooks,
//! read their run history, and watch the whole pipeline (`/api/stats`, `/metrics`).
//!
//! Built on axum, behind the `http` feature. The core library stays free of async runtimes:
//! [`router`] returns a plain `axum::Router` a host application mounts in its own server, and
//! [`Server`] runs one on a small tokio runtime of its own for hosts (and `prx-hooks run
//! --listen`) that have none.
//!
//! ```text
//! request ─► auth (bearer token; /healthz is open) ─► route
//!              ├─ /api/hooks…  ─► HooksEditor (spawn_blocking: file I/O, fsync)
//!              │                   └─► Hooks::apply_hooks_file  (live before the response)
//!              ├─ …/test, …/runs ─► ShellSink::run_once / run history
//!              └─ /api/stats, /api/plugins, /metrics ─► Hooks::stats()
//! ```
//!
//! Every error is JSON, `{"error": "...", "path": "...", "kind": "..."}`, with the status codes
//! of ARCHITECTURE.md § HTTP API: 400 bad JSON, 401 no or wrong token, 404, 405, 409 hand edit, 412 stale
//! `If-Match`, 413 body over [`HttpOptions::max_body_bytes`], 415 not JSON, 422 validation (the
//! loader's own message, `path` relative to the body), 503 no workspace or shutting down. axum's
//! plain-text rejections never reach a client: bodies, paths and queries are read by this
//! module.

mod auth;
mod body;
mod error;
mod hooks;
mod metrics;
mod server;
mod status;
pub mod token;

pub use server::Server;
pub use token::{Token, TokenError, TokenSource};

use crate::Hooks;
use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use serde::Serialize;
use std::sync::Arc;

/// Largest request body accepted by default (ARCHITECTURE.md § HTTP API): 256 KiB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// How the API is served.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Every route but `/healthz` needs `Authorization: Bearer <token>`.
    pub token: Token,
    /// Larger bodies get 413 (default [`MAX_BODY_BYTES`]).
    pub max_body_bytes: usize,
}

impl HttpOptions {
    pub fn new(token: Token) -> HttpOptions {
        HttpOptions {
            token,
            max_body_bytes: MAX_BODY_BYTES,
        }
    }

    pub fn max_body_bytes(mut self, bytes: usize) -> HttpOptions {
        self.max_body_bytes = bytes;
        self
    }
}

/// What every handler shares.
pub(crate) struct Api {
    pub hooks: Arc<Hooks>,
    pub opts: HttpOptions,
}

pub(crate) type ApiState = axum::extract::State<Arc<Api>>;

/// The API's routes, ready to serve or to mount (`Router::nest("/prx", router(..))`). Serve it
/// with `into_make_service_with_connect_info::<SocketAddr>()` so that the warnings about
/// command-running hooks name the client's address.
pub fn router(hooks: Arc<Hooks>, opts: HttpOptions) -> Router {
    let api = Arc::new(Api { hooks, opts });
    Router::new()
        .route("/healthz", get(status::healthz))
        .route("/api/hooks", get(hooks::list).post(hooks::create))
        .route(
            "/api/hooks/{id}",
            get(hooks::get).put(hooks::update).delete(hooks::delete),
        )
        .route("/api/hooks/{id}/toggle", patch(hooks::toggle))
        .route("/api/hooks/{id}/test", post(hooks::test))
        .route("/api/hooks/{id}/runs", get(hooks::runs))
        .route("/api/plugins", get(status::plugins))
        .route("/api/stats", get(status::stats))
        .route("/metrics", get(metrics::render))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            auth::require,
        ))
        .with_state(api)
}

/// A JSON response (a serialization failure is a 500, never a panic).
pub(crate) fn json_response(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("response serialization failed: {e}"),
        )
            .into_response(),
    }
}
