//! The route table: each route is added with its handlers through [`Table::route`], which
//! records the methods it gets, so the 404's list of routes and each route's 405 (its
//! message and `Allow`, RFC 9110 § 15.5.6) come from the table itself and a route added
//! later shows up in both by itself.
//!
//! ```text
//! Table::new().route("/api/hooks", get(list).post(create))
//!     ├─► axum: .route("/api/hooks", MethodRouter(get + post, fallback: 405 naming GET, HEAD, POST))
//!     └─► the list: Route { "/api/hooks", [GET, HEAD, POST] }   (404 hint)
//! ```

use super::Api;
use super::error::{self, ApiError};
use super::guard::Base;
use axum::Extension;
use axum::handler::Handler;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, Router};
use std::sync::Arc;

type State = Arc<Api>;

/// One route and the methods it has.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub path: &'static str,
    pub methods: Arc<[Method]>,
}

/// The handlers of one path and the methods they serve (built like axum's `get(..).post(..)`).
pub(crate) struct Methods {
    router: MethodRouter<State>,
    list: Vec<Method>,
}

macro_rules! methods {
    ($($(#[$doc:meta])* $name:ident => [$($method:ident),+];)+) => {
        impl Methods {
            $(
                $(#[$doc])*
                pub(crate) fn $name<H, T>(mut self, handler: H) -> Methods
                where
                    H: Handler<T, State>,
                    T: 'static,
                {
                    self.router = self.router.$name(handler);
                    self.list.extend([$(Method::$method),+]);
                    self
                }
            )+
        }
    };
}

methods! {
    /// `GET` (axum answers `HEAD` with it, so the route has both).
    get => [GET, HEAD];
    post => [POST];
    put => [PUT];
    patch => [PATCH];
    delete => [DELETE];
}

/// A route's first method, as axum's `get(..)`, `post(..)`: `get(list).post(create)`.
macro_rules! first {
    ($($name:ident),+) => {
        $(
            pub(crate) fn $name<H, T>(handler: H) -> Methods
            where
                H: Handler<T, State>,
                T: 'static,
            {
                Methods {
                    router: MethodRouter::new(),
                    list: Vec::new(),
                }
                .$name(handler)
            }
        )+
    };
}

first!(get, post, patch);

/// Routes and the list of them.
pub(crate) struct Table {
    router: Router<State>,
    routes: Vec<Route>,
}

impl Table {
    pub(crate) fn new() -> Table {
        Table {
            router: Router::new(),
            routes: Vec::new(),
        }
    }

    /// Adds `path` with its handlers; any other method gets a 405 naming the ones it has.
    pub(crate) fn route(mut self, path: &'static str, methods: Methods) -> Table {
        let allowed: Arc<[Method]> = methods.list.into();
        let route = Route {
            path,
            methods: allowed,
        };
        let for_405 = route.clone();
        let not_allowed = move |method: Method, uri: Uri, base: Option<Extension<Base>>| {
            let route = for_405.clone();
            async move { method_not_allowed(&route, &method, &uri, base) }
        };
        self.router = self
            .router
            .route(path, methods.router.fallback(not_allowed));
        self.routes.push(route);
        self
    }

    /// The router and the routes it has, in the order they were added.
    pub(crate) fn into_parts(self) -> (Router<State>, Vec<Route>) {
        (self.router, self.routes)
    }
}

/// `path` as a client reaches it under the mount point (a nested router's `/` is the
/// prefix itself).
pub(crate) fn url(base: &Base, path: &str) -> String {
    if path == "/" && !base.0.is_empty() {
        base.0.clone()
    } else {
        base.url(path)
    }
}

fn methods_text(methods: &[Method]) -> String {
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    names.join(", ")
}

/// 405: what the route has, in the message and in `Allow`.
fn method_not_allowed(
    route: &Route,
    method: &Method,
    uri: &Uri,
    base: Option<Extension<Base>>,
) -> Response {
    let base = base.map(|b| b.0).unwrap_or_default();
    let allowed = methods_text(&route.methods);
    let mut resp = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {} (the route {}); it allows {allowed}",
            crate::config::quote(&base.url(uri.path())),
            url(&base, route.path),
        ),
    )
    .into_response();
    if let Ok(v) = HeaderValue::from_str(&allowed) {
        resp.headers_mut().insert(header::ALLOW, v);
    }
    resp
}

/// 404: every route of `routes`, with its methods, under the mount point.
pub(crate) fn not_found(routes: &[Route], uri: &Uri, base: Option<Extension<Base>>) -> ApiError {
    let base = base.map(|b| b.0).unwrap_or_default();
    let list: Vec<String> = routes
        .iter()
        .map(|r| format!("{} ({})", url(&base, r.path), methods_text(&r.methods)))
        .collect();
    error::not_found(
        &base.url(uri.path()),
        &format!("the routes are {}", list.join(", ")),
    )
}
