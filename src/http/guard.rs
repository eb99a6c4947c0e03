//! The first thing every request meets: the `Host` / `Origin` check (DNS rebinding and
//! cross-site requests, as Jupyter and Syncthing check them), then where the API is mounted.
//!
//! A web page the user opens can make their browser send requests to `127.0.0.1:7878`: under
//! a name of its own that it re-points at 127.0.0.1 (DNS rebinding: `Host` is that name), or
//! cross-site (`Origin` is the page's). Neither can carry the token, but the check runs before
//! authentication so that such a request costs nothing and learns nothing, not even whether a
//! token is wanted.
//!
//! * `Host` (TCP only; a unix socket cannot be reached by a browser): an IP literal that is a
//!   loopback address or the bound address (any IP literal when bound to `0.0.0.0` / `::`: a
//!   rebinding page always sends its name), `localhost`, or an allowed name; any port from 1
//!   to 65535, in digits without a leading zero (a `Host` no browser would send is refused).
//!   A request without `Host` (HTTP/1.0) passes: browsers always send it.
//! * `Origin`, when present, must be `http://` + the request's own `Host` (same origin);
//!   `Origin: null` (sandboxed frames, `file:` pages) is refused.
//!
//! The base path: a host may nest the router (`nest("/prx", router(..))`); the API's own URLs
//! (Location, hints) are built from the path the client used, so they keep the prefix.

use super::error::ApiError;
use super::{Api, HostCheck, Listen};
use axum::extract::{OriginalUri, Request};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use std::net::IpAddr;
use std::sync::Arc;

/// The resolved check.
#[derive(Debug)]
pub(crate) struct Policy {
    /// Lowercased names besides `localhost`.
    names: Vec<String>,
    /// The address the server is bound to (`None`: unknown, only loopback literals pass).
    bound: Option<IpAddr>,
    /// Whether `Host` is checked (not over a unix socket); `Origin` always is.
    check_host: bool,
}

impl Policy {
    /// For [`super::router`]: only when the host application turned it on.
    pub(crate) fn hosted(hosts: &HostCheck) -> Option<Policy> {
        match hosts {
            HostCheck::Names(names) => Some(Policy {
                names: names.clone(),
                bound: None,
                check_host: true,
            }),
            HostCheck::Default | HostCheck::Off => None,
        }
    }

    /// For our own [`super::Server`]: on unless turned off.
    pub(crate) fn served(hosts: &HostCheck, listen: &Listen) -> Option<Policy> {
        let names = match hosts {
            HostCheck::Off => return None,
            HostCheck::Default => Vec::new(),
            HostCheck::Names(n) => n.clone(),
        };
        let (bound, check_host) = match listen {
            Listen::Tcp(addr) => (Some(addr.ip()), true),
            Listen::Unix(_) => (None, false),
        };
        Some(Policy {
            names,
            bound,
            check_host,
        })
    }

    fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let host = headers
            .get(header::HOST)
            .map(|h| h.to_str().unwrap_or("\u{fffd}"));
        if self.check_host
            && let Some(host) = host
            && !self.host_allowed(host)
        {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden_host",
                format!(
                    "this server does not answer to the name {}; it answers to loopback \
                     addresses, its own address and localhost{} (a web page re-pointing a name \
                     of its own at this machine would send that Host; to accept the name, \
                     start with --allow-host NAME or use HttpOptions::allow_hosts)",
                    crate::config::quote(host),
                    self.names_hint()
                ),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("\u{fffd}");
            let same = host.is_some_and(|h| same_origin(origin, h));
            if !same {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden_origin",
                    format!(
                        "cross-origin request from {} refused: the API answers no web page of \
                         another origin (send no Origin header, as non-browser clients do)",
                        crate::config::quote(origin)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn names_hint(&self) -> String {
        if self.names.is_empty() {
            String::new()
        } else {
            format!(" and {}", self.names.join(", "))
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else {
            return false;
        };
        if let Ok(ip) = name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return ip.is_loopback() || self.bound.is_some_and(|b| b == ip || b.is_unspecified());
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name == "localhost" || self.names.contains(&name)
    }
}

/// The name part of a `Host` value (`[::1]:80` → `[::1]`, `a.example:80` → `a.example`);
/// `None` when it is not a valid authority.
fn host_name(host: &str) -> Option<&str> {
    let host = host.trim();
    let name = if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        if !(rest.is_empty() || rest.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        &host[..=end]
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return None,
            None => host,
        }
    };
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_[]:".contains(&b));
    ok.then_some(name)
}

/// A port as a browser writes it: 1 to 65535 in digits, no leading zero (`080` is refused,
/// not read as 80), and not empty (`host:` is refused: no client writes it).
fn valid_port(p: &str) -> bool {
    super::query::decimal(p).is_some_and(|n| (1..=65535).contains(&n))
}

/// Whether `Origin` names the origin `http://<host>` (default port spelled or not).
fn same_origin(origin: &str, host: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://") else {
        return false;
    };
    let strip_default = |s: &str| s.strip_suffix(":80").unwrap_or(s).to_ascii_lowercase();
    strip_default(rest.trim_end_matches('/')) == strip_default(host.trim())
}

/// Where the router is mounted: `/prx` when nested under it, `""` at the root.
#[derive(Clone, Debug, Default)]
pub(crate) struct Base(pub String);

impl Base {
    /// `path` (starting with `/`) under the mount point.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.0)
    }
}

/// Host / Origin first, then the base path for the handlers.
pub(crate) async fn check(
    axum::extract::State(api): axum::extract::State<Arc<Api>>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Some(policy) = &api.guard
        && let Err(e) = policy.check(req.headers())
    {
        return super::auth::refuse(&api, &req, e);
    }
    let base = base_of(&req);
    req.extensions_mut().insert(base);
    next.run(req).await
}

fn base_of(req: &Request) -> Base {
    let seen = req.uri().path();
    let Some(OriginalUri(original)) = req.extensions().get::<OriginalUri>() else {
        return Base::default();
    };
    match original.path().strip_suffix(seen) {
        Some(prefix) => Base(prefix.trim_end_matches('/').to_string()),
        None => Base::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(names: &[&str], bound: &str) -> Policy {
        Policy {
            names: names.iter().map(|s| s.to_string()).collect(),
            bound: Some(bound.parse().unwrap()),
            check_host: true,
        }
    }

    #[test]
    fn hosts() {
        let p = policy(&["prx.internal"], "127.0.0.1");
        for ok in [
            "127.0.0.1:7878",
            "127.0.0.1",
            "127.8.9.1:1",
            "127.0.0.1:65535",
            "[::1]:7878",
            "localhost",
            "LOCALHOST:7878",
            "localhost.:80",
            "prx.internal:7878",
            "PRX.Internal",
        ] {
            assert!(p.host_allowed(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7878",
            "localhost.evil.example",
            "10.0.0.1:7878",
            "127.0.0.1:port",
            "",
            "a b",
            "[::1",
            "prx.internal:123456",
            "127.0.0.1:99999",
            "127.0.0.1:65536",
            "127.0.0.1:0",
            "127.0.0.1:080",
            "127.0.0.1:+80",
            "127.0.0.1:",
            "[::1]:",
            "[::1]:0",
        ] {
            assert!(!p.host_allowed(bad), "{bad}");
        }
        let any = policy(&[], "0.0.0.0");
        assert!(any.host_allowed("10.0.0.1:7878"));
        assert!(!any.host_allowed("evil.example"));
    }

    #[test]
    fn origins() {
        assert!(same_origin("http://127.0.0.1:7878", "127.0.0.1:7878"));
        assert!(same_origin("http://LOCALHOST", "localhost:80"));
        assert!(!same_origin("http://localhost:3000", "localhost:7878"));
        assert!(!same_origin("https://127.0.0.1:7878", "127.0.0.1:7878"));
        assert!(!same_origin("null", "127.0.0.1:7878"));
        assert!(!same_origin("http://evil.example", "127.0.0.1:7878"));
    }
}
