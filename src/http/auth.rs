//! Bearer-token authentication, and who is calling (for the audit warnings).

use super::Api;
use super::conns::Conn;
use super::error::ApiError;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderValue, StatusCode, Version, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Who made a request, as the warnings about command-running hooks name them: the peer
/// address (when the server records it) and the User-Agent.
#[derive(Clone, Debug)]
pub(crate) struct Caller(pub String);

/// A peer that has no socket address (a unix-socket client: `unix peer uid U pid P`).
#[derive(Clone, Debug)]
pub(crate) struct PeerName(pub String);

/// Every route but `/healthz` needs `Authorization: Bearer <token>`. A request that shows
/// it marks its connection authenticated (it then keeps its place at the connection cap); a
/// 401 closes the connection (see [`refuse`]).
pub(crate) async fn require(
    axum::extract::State(api): axum::extract::State<Arc<Api>>,
    mut req: Request,
    next: Next,
) -> Response {
    let shown = match check(&api, &req) {
        Ok(()) => true,
        // /healthz is open: without the token it is served, and its connection stays one
        // without the token.
        Err(_) if req.uri().path() == "/healthz" => false,
        Err(e) => return refuse(&api, &req, e),
    };
    if shown && let Some(conn) = req.extensions().get::<Arc<Conn>>() {
        conn.authenticate();
    }
    let caller = describe(&req);
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// The response to a request refused before any route ran (401, 403): on HTTP/1 it closes its
/// connection (`Connection: close`), so a client that has not shown the token cannot keep a
/// connection by asking again and again; counted in [`super::HttpStats::closed_unauthorized`].
pub(crate) fn refuse(api: &Api, req: &Request, e: ApiError) -> Response {
    let mut resp = e.into_response();
    if req.version() <= Version::HTTP_11 {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        if let Some(c) = &api.conns {
            c.closed_unauthorized.fetch_add(1, Ordering::Relaxed);
        }
    }
    resp
}

fn check(api: &Api, req: &Request) -> Result<(), ApiError> {
    let unauthorized = |msg: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg);
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Err(unauthorized(
            "missing Authorization header; send \"Authorization: Bearer <token>\" (the token \
             `prx-hooks run` announced on stderr)",
        ));
    };
    let value = value.as_bytes();
    let token = value
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| value[7..].trim_ascii());
    match token {
        None => Err(unauthorized(
            "the Authorization header must use the Bearer scheme: \"Bearer <token>\"",
        )),
        Some(t) if api.opts.token.matches(t) => Ok(()),
        Some(_) => Err(unauthorized("wrong token")),
    }
}

fn describe(req: &Request) -> Caller {
    let ext = req.extensions();
    let peer = match (ext.get::<PeerName>(), ext.get::<ConnectInfo<SocketAddr>>()) {
        (Some(name), _) => name.0.clone(),
        (None, Some(c)) => c.0.to_string(),
        (None, None) => "unknown peer".to_string(),
    };
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    Caller(format!("{peer} (user agent {agent:?})"))
}

/// Whether the request came from this machine: over the server's unix socket, or from a
/// loopback address. A router hosted by another server (no peer recorded) is not local.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Local(pub bool);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Local {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let ext = &parts.extensions;
        let local = ext.get::<PeerName>().is_some()
            || ext
                .get::<ConnectInfo<SocketAddr>>()
                .is_some_and(|c| c.0.ip().is_loopback());
        Ok(Local(local))
    }
}
