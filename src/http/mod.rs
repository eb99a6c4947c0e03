//! The HTTP management API (ARCHITECTURE.md § HTTP API): list, create, update, delete, toggle and test hooks,
//! read their run history, and watch the whole pipeline (`/api/stats`, `/metrics`).
//!
//! Built on axum, behind the `http` feature. The core library stays free of async runtimes:
//! [`router`] returns a plain `axum::Router` a host application mounts in its own server, and
//! [`Server`] runs one on a small tokio runtime of its own for hosts (and `prx-hooks run
//! --listen`) that have none, over TCP or a unix socket, with the connection limits of
//! [`server`](Server) (header and idle timeouts, a connection cap that leaves file descriptors
//! for the hooks).
//!
//! ```text
//! connection ─► Server: cap, header-read timeout, write-stall timeout (hyper HTTP/1)
//! request ─► guard (Host / Origin, before anything else) ─► auth (bearer token; /healthz is open) ─► route
//!              ├─ /api/hooks…  ─► HooksEditor (spawn_blocking: file I/O, fsync)
//!              │                   └─► Hooks::apply_hooks_file  (live before the response)
//!              ├─ …/test        ─► ShellSink::start_once (a slot in the hook's limits or 429;
//!              │                   awaited without a pool thread; killed if the client leaves)
//!              ├─ …/runs        ─► run history
//!              ├─ GET /api/events ─► the live stream (SSE; events.rs: one hub thread, a
//!              │                   bounded queue per client, a backlog for Last-Event-ID)
//!              ├─ POST /api/events ─► ingest.rs: NDJSON lines ─► LineIngest ─► the ring
//!              ├─ POST /api/ingest/{agent} ─► agents::translate ─► one line ─► LineIngest
//!              │                   (and the agent's event name, last seen: GET /api/agents)
//!              └─ /api/stats, /api/plugins, /metrics ─► Hooks::stats()
//! request ─► guard ─► / and /console/* ─► the console page (console.rs: embedded, no token;
//!                                          its API calls carry the token like any client's)
//! ```
//!
//! Every error is JSON, `{"error": "...", "path": "...", "kind": "..."}`, with the status codes
//! of ARCHITECTURE.md § HTTP API: 400 bad JSON, 401 no or wrong token, 403 foreign Host or
//! cross-origin request, 404, 405 (with `Allow`), 408 stalled body, 409 hand edit or broken
//! file, 412 stale `If-Match`, 413 body over [`HttpOptions::max_body_bytes`], 415 not JSON,
//! 422 validation (the loader's own reason; `path` and `LINE:COL` in the body), 429 the hook's
//! limits are full (with `Retry-After`), 503 no workspace or shutting down. axum's plain-text
//! rejections never reach a client: bodies, paths and queries are read by this module. (hyper
//! itself answers requests it cannot parse, with an empty 400 or 431, before any of this runs.)

mod auth;
mod body;
mod conns;
mod console;
mod decide;
mod error;
mod events;
mod guard;
mod hooks;
mod ingest;
mod live;
mod metrics;
mod query;
mod routes;
mod seen;
mod server;
mod status;
pub mod token;

pub use conns::HttpStats;
pub use console::{CONTENT_SECURITY_POLICY, PUBLIC_PATHS as CONSOLE_PATHS};
pub use decide::{DECISION_DEADLINE_HEADER, MAX_DECISION_DEADLINE_MS};
pub use events::{
    DEFAULT_BACKLOG, DEFAULT_BACKLOG_BYTES, DEFAULT_KEEPALIVE, DEFAULT_LINGER, DEFAULT_MAX_STREAMS,
    DEFAULT_STREAM_QUEUE, DEFAULT_STREAM_QUEUE_BYTES, EventStreamOptions, EventStreamStats,
    PLUGIN_INTERVAL, RESERVED_NAMES,
};
pub use ingest::{EVENT_ID_HEADER, IngestStats, TIMESTAMP_HEADER};
pub use seen::{AgentSeen, AgentsReport, EventSeen, KEPT_UNKNOWN_NAMES, UnknownSeen};
pub use server::{Listen, Server, bind_unix};
pub use token::{Token, TokenError, TokenSource};

use crate::Hooks;
use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted by default (ARCHITECTURE.md § HTTP API): 256 KiB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Largest `POST /api/events` body accepted by default: 16 MiB (a batch of thousands of events,
/// or one agent payload carrying a large tool output).
pub const MAX_INGEST_BYTES: usize = 16 * 1024 * 1024;

/// Default of [`HttpOptions::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`HttpOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// How the API is served.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Every route but `/healthz` needs `Authorization: Bearer <token>`.
    pub token: Token,
    /// Larger bodies get 413 (default [`MAX_BODY_BYTES`]), but for the ingest routes.
    pub max_body_bytes: usize,
    /// `POST /api/events` and `POST /api/ingest/{agent}`: larger bodies get 413 (default
    /// [`MAX_INGEST_BYTES`]). An event is still bounded by `max_event_bytes`.
    pub max_ingest_bytes: usize,
    /// [`Server`]: a request head must arrive whole within this, counted from the connection's
    /// start or from the previous response on a kept-alive connection; otherwise the
    /// connection is closed (default [`DEFAULT_HEADER_TIMEOUT`]). A host serving [`router`]
    /// sets its own server's.
    pub header_timeout: Duration,
    /// A request body that sends nothing for this long gets 408 and its connection is closed;
    /// with [`Server`], a client that reads nothing of a response for this long is
    /// disconnected (default [`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// [`Server`]: connections open at once; more are closed as soon as they are accepted.
    /// `None` (the default): computed from RLIMIT_NOFILE minus the descriptors open at start
    /// and what the hooks need at their limits ([`crate::shell::ShellSink::fds_at_limits`]),
    /// at most [`server::MAX_AUTO_CONNECTIONS`](Server::MAX_AUTO_CONNECTIONS). A value larger
    /// than that budget is lowered to it (with a warning): the hooks' descriptors come first.
    pub max_connections: Option<usize>,
    /// `GET /api/events`: queues, backlog, stream cap, keep-alive (docs/http.md § The live
    /// stream).
    pub events: EventStreamOptions,
    /// `POST /api/ingest/{agent}`: read Claude Code's and Codex's transcripts at a turn's end,
    /// for requests from this machine only (docs/agents.md § Transcripts). `None` (the
    /// default): never read.
    pub transcripts: Option<Arc<crate::ingest::Transcripts>>,
    hosts: HostCheck,
}

/// Which `Host` names the API answers to (DNS-rebinding defence) and whether cross-origin
/// browser requests are refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum HostCheck {
    /// On for [`Server`] (loopback addresses, the bound address, `localhost`), off for
    /// [`router`].
    #[default]
    Default,
    /// On, with these names as well.
    Names(Vec<String>),
    /// Off.
    Off,
}

impl HttpOptions {
    /// Options that require `token` as the bearer token, every other field at its default.
    pub fn new(token: Token) -> HttpOptions {
        HttpOptions {
            token,
            max_body_bytes: MAX_BODY_BYTES,
            max_ingest_bytes: MAX_INGEST_BYTES,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
            events: EventStreamOptions::default(),
            transcripts: None,
            hosts: HostCheck::Default,
        }
    }

    /// See [`HttpOptions::events`].
    pub fn events(mut self, events: EventStreamOptions) -> HttpOptions {
        self.events = events;
        self
    }

    /// Reads agents' transcripts at a turn's end with `reader` (see
    /// [`HttpOptions::transcripts`]); the same reader may serve a spool replay too, so a
    /// transcript is read on from where either left it.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::http::{HttpOptions, Token};
    /// use prx_hooks::ingest::Transcripts;
    /// let opts = HttpOptions::new(Token::generate()?).read_transcripts(std::sync::Arc::new(Transcripts::new()));
    /// assert!(opts.transcripts.is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_transcripts(mut self, reader: Arc<crate::ingest::Transcripts>) -> HttpOptions {
        self.transcripts = Some(reader);
        self
    }

    /// Sets the field `max_body_bytes`.
    pub fn max_body_bytes(mut self, bytes: usize) -> HttpOptions {
        self.max_body_bytes = bytes;
        self
    }

    /// See [`HttpOptions::max_ingest_bytes`].
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::http::{HttpOptions, Token};
    /// let opts = HttpOptions::new(Token::generate()?).max_ingest_bytes(1 << 20);
    /// assert_eq!(opts.max_ingest_bytes, 1 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_ingest_bytes(mut self, bytes: usize) -> HttpOptions {
        self.max_ingest_bytes = bytes;
        self
    }

    /// See [`HttpOptions::header_timeout`] (at least a millisecond).
    pub fn header_timeout(mut self, timeout: Duration) -> HttpOptions {
        self.header_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// See [`HttpOptions::idle_timeout`] (at least a millisecond).
    pub fn idle_timeout(mut self, timeout: Duration) -> HttpOptions {
        self.idle_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// See [`HttpOptions::max_connections`] (at least 1).
    pub fn max_connections(mut self, n: usize) -> HttpOptions {
        self.max_connections = Some(n.max(1));
        self
    }

    /// Checks `Host` and `Origin` before anything else (403 otherwise): `Host` must be a
    /// loopback address, the address [`Server`] is bound to, `localhost`, or one of `names`
    /// (case-insensitive, any port); a request with an `Origin` header must come from the
    /// origin it is sent to (`http://` + its `Host`). This is what keeps a web page in the
    /// user's browser from reaching the API through DNS rebinding or a cross-site request.
    /// [`Server`] checks by default; a host mounting [`router`] under names of its own turns
    /// it on with this. The name `*` turns the check off.
    pub fn allow_hosts<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> HttpOptions {
        let mut list = match std::mem::take(&mut self.hosts) {
            HostCheck::Names(list) => list,
            _ => Vec::new(),
        };
        for n in names {
            let n = n.as_ref().trim().trim_end_matches('.').to_ascii_lowercase();
            if n == "*" {
                self.hosts = HostCheck::Off;
                return self;
            }
            if !n.is_empty() && !list.contains(&n) {
                list.push(n);
            }
        }
        self.hosts = HostCheck::Names(list);
        self
    }

    /// Turns the `Host` / `Origin` check off, also for [`Server`] (for a server behind a
    /// proxy that checks them itself).
    pub fn allow_any_host(mut self) -> HttpOptions {
        self.hosts = HostCheck::Off;
        self
    }
}

/// What every handler shares.
pub(crate) struct Api {
    pub hooks: Arc<Hooks>,
    pub opts: HttpOptions,
    /// The Host / Origin policy (`None`: no check).
    pub guard: Option<guard::Policy>,
    /// Connection counters of the [`Server`] serving this router, if one does.
    pub conns: Option<Arc<conns::ConnCounters>>,
    /// `/api/events`.
    pub events: events::EventHub,
    /// `POST /api/events`, `POST /api/ingest/{agent}`.
    pub ingest: ingest::IngestCounters,
    /// What `POST /api/ingest/{agent}` saw of each agent (`GET /api/agents`).
    pub seen: seen::AgentsSeen,
}

impl Drop for Api {
    /// The router (every clone of it) is gone: its event stream ends with it.
    fn drop(&mut self) {
        self.events.close("the API was dropped");
    }
}

pub(crate) type ApiState = axum::extract::State<Arc<Api>>;

/// How a router is served: by a host application, or by our [`Server`].
pub(crate) enum Serving {
    Hosted,
    Own {
        listen: Listen,
        conns: Arc<conns::ConnCounters>,
        events: events::EventHub,
    },
}

/// The API's routes, ready to serve or to mount (`Router::nest("/prx", router(..))`). Serve it
/// with `into_make_service_with_connect_info::<SocketAddr>()` so that the warnings about
/// command-running hooks name the client's address. The `Host` / `Origin` check is off unless
/// [`HttpOptions::allow_hosts`] turns it on, and the connection limits are the host server's.
pub fn router(hooks: Arc<Hooks>, opts: HttpOptions) -> Router {
    build(hooks, opts, Serving::Hosted)
}

pub(crate) fn build(hooks: Arc<Hooks>, opts: HttpOptions, serving: Serving) -> Router {
    let (guard, conns, events) = match serving {
        Serving::Hosted => (
            guard::Policy::hosted(&opts.hosts),
            None,
            events::EventHub::new(opts.events.clone(), None),
        ),
        Serving::Own {
            listen,
            conns,
            events,
        } => (
            guard::Policy::served(&opts.hosts, &listen),
            Some(conns),
            events,
        ),
    };
    // The editor's view of hooks.json starts now: a hand edit made after this and before the
    // API's first write makes blind writes conflict (409) like any later one.
    if let Some(editor) = hooks.editor() {
        editor.baseline();
    }
    events.start(&hooks);
    let api = Arc::new(Api {
        hooks,
        opts,
        guard,
        conns,
        events,
        ingest: ingest::IngestCounters::default(),
        seen: seen::AgentsSeen::new(),
    });
    // The route table (routes.rs): add a route here, with its handlers, and the 404's list
    // and its 405 name it by themselves.
    use routes::{get, patch, post};
    let (app, mut listed) = routes::Table::new()
        .route("/healthz", get(status::healthz))
        .route("/api/hooks", get(hooks::list).post(hooks::create))
        .route(
            "/api/hooks/{id}",
            get(hooks::get)
                .put(hooks::update)
                .patch(hooks::update)
                .delete(hooks::delete),
        )
        .route("/api/hooks/{id}/toggle", patch(hooks::toggle))
        .route("/api/hooks/{id}/test", post(hooks::test))
        .route("/api/hooks/{id}/runs", get(hooks::runs))
        .route("/api/plugins", get(status::plugins))
        .route("/api/stats", get(status::stats))
        .route("/api/events", get(events::stream).post(ingest::post))
        .route("/api/ingest/{agent}", post(ingest::agent))
        .route("/api/agents", get(seen::list))
        .route("/api/sessions", get(status::sessions))
        .route("/api/decide", post(decide::post))
        .route("/metrics", get(metrics::render))
        .into_parts();
    let (console, console_listed) = console::routes().into_parts();
    listed.extend(console_listed);
    let listed: Arc<[routes::Route]> = listed.into();
    let not_found = move |uri: axum::http::Uri, base: Option<axum::Extension<guard::Base>>| {
        let listed = listed.clone();
        async move { routes::not_found(&listed, &uri, base) }
    };
    app.fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            auth::require,
        ))
        // The console page's static files (console.rs): outside the token check, inside the
        // Host / Origin check.
        .merge(console)
        // Outermost, so it runs first: no auth work for a foreign Host or Origin.
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            guard::check,
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
