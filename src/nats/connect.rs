//! Connecting: the server list, credentials, TLS, the refusal of an unauthenticated remote
//! server, redaction, and the small tokio runtime each side of the bridge owns.
//!
//! Credentials never reach a log. A URL's `user:password@` or `token@` is taken out of it
//! before async-nats sees it (async-nats prints server addresses at debug level) and given to
//! it as options; everything this module displays goes through [`redact_url`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How to reach the NATS server: one or more URLs (comma-separated, as NATS clients take
/// them), credentials and TLS. The same for the publisher and the consumer.
#[derive(Clone)]
pub struct NatsOptions {
    url: String,
    creds: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_client: Option<(PathBuf, PathBuf)>,
    require_tls: bool,
    insecure: bool,
}

impl std::fmt::Debug for NatsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsOptions")
            .field("url", &redact_url(&self.url))
            .field("creds", &self.creds)
            .field("tls_ca", &self.tls_ca)
            .field("tls_client", &self.tls_client)
            .field("require_tls", &self.require_tls)
            .field("insecure", &self.insecure)
            .finish()
    }
}

/// Why the bridge could not be configured.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A `--nats`/`--from-nats` URL that cannot be used.
    #[error("NATS URL {url:?}: {reason}")]
    Url {
        /// The URL, redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file the bridge reads or writes (credentials, CA, de-dup window).
    #[error("{}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    #[error(
        "refusing to consume from {server}: it is not on this machine and the connection has no credentials, so anyone who can reach it could run this host's hooks; give --nats-creds FILE, user:password@ or a token in the URL, or a TLS client certificate (--nats-tls-cert/--nats-tls-key), or pass --nats-insecure to accept it"
    )]
    /// A server beyond this machine, and no credentials to give it.
    Insecure {
        /// The server, redacted.
        server: String,
    },
    #[error(
        "refusing to consume from {server}: it is not on this machine and does not require authentication (its INFO says auth_required: false), so anyone who can reach it could run this host's hooks, whatever credentials this connection sends; configure the server to require them, or pass --nats-insecure to accept it"
    )]
    /// A server beyond this machine that requires no authentication.
    NoAuthRequired {
        /// The server, redacted.
        server: String,
    },
    /// An option out of range or malformed.
    #[error("{what}: {reason}")]
    Invalid {
        /// What the option is.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The bridge's tokio runtime could not start.
    #[error("could not start the NATS runtime: {0}")]
    Runtime(std::io::Error),
}

/// One server of the list, without its credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Server {
    /// `nats://host:port` or `tls://host:port`: what async-nats is given.
    pub addr: String,
    pub host: String,
    pub tls: bool,
}

/// Credentials found in a URL's user info.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct UrlAuth {
    pub user: Option<String>,
    pub pass: Option<String>,
    pub token: Option<String>,
}

impl std::fmt::Debug for UrlAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |o: &Option<String>| o.as_ref().map(|_| "***");
        f.debug_struct("UrlAuth")
            .field("user", &self.user)
            .field("pass", &shown(&self.pass))
            .field("token", &shown(&self.token))
            .finish()
    }
}

impl NatsOptions {
    /// `nats://host:4222`, `tls://host:4222`, `host:4222`, `nats://user:pass@host`,
    /// `nats://token@host`, or several of them separated by commas.
    pub fn new(url: impl Into<String>) -> NatsOptions {
        NatsOptions {
            url: url.into(),
            creds: None,
            tls_ca: None,
            tls_client: None,
            require_tls: false,
            insecure: false,
        }
    }

    /// A NATS credentials file (`.creds`: a user JWT and its nkey seed, as `nsc` writes it).
    pub fn creds_file(mut self, path: impl AsRef<Path>) -> NatsOptions {
        self.creds = Some(path.as_ref().to_path_buf());
        self
    }

    /// Trust the server certificates signed by this CA (PEM); implies TLS.
    pub fn tls_ca(mut self, path: impl AsRef<Path>) -> NatsOptions {
        self.tls_ca = Some(path.as_ref().to_path_buf());
        self.require_tls = true;
        self
    }

    /// Authenticate with this client certificate and key (PEM); implies TLS.
    pub fn tls_client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> NatsOptions {
        self.tls_client = Some((cert.as_ref().to_path_buf(), key.as_ref().to_path_buf()));
        self.require_tls = true;
        self
    }

    /// Insist on TLS (a `tls://` URL does too).
    pub fn require_tls(mut self, on: bool) -> NatsOptions {
        self.require_tls = on;
        self
    }

    /// Accept a server beyond this machine without credentials (consumer only: see
    /// [`ConnectError::Insecure`]).
    pub fn insecure(mut self, on: bool) -> NatsOptions {
        self.insecure = on;
        self
    }

    /// The URL list with credentials replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    pub(crate) fn servers(&self) -> Result<(Vec<Server>, UrlAuth), ConnectError> {
        // Malformed input: no user info at all in the message.
        let bad = |reason: String| ConnectError::Url {
            url: redact(&self.url, false),
            reason,
        };
        let mut servers = Vec::new();
        let mut auth: Option<UrlAuth> = None;
        for part in split_servers(&self.url).into_iter().map(str::trim) {
            if part.is_empty() {
                return Err(bad("an empty server in the list".into()));
            }
            let (scheme, rest) = match part.split_once("://") {
                Some((s, r)) => (s.to_ascii_lowercase(), r),
                None => ("nats".to_string(), part),
            };
            if scheme != "nats" && scheme != "tls" {
                return Err(bad(format!(
                    "scheme {scheme:?} is not supported; use nats:// or tls://"
                )));
            }
            let rest = rest.trim_end_matches('/');
            let (info, hostport) = match rest.rsplit_once('@') {
                Some((i, h)) => (Some(i), h),
                None => (None, rest),
            };
            let (host, port) = split_host_port(hostport).map_err(bad)?;
            let this = match info {
                None => UrlAuth::default(),
                Some(info) => {
                    // Empty parts are no credentials (`nats://@host`, `nats://:@host`).
                    let dec = |s: &str| {
                        Some(super::wire::decode_value(s).into_owned()).filter(|s| !s.is_empty())
                    };
                    match info.split_once(':') {
                        Some((u, p)) => UrlAuth {
                            user: dec(u),
                            pass: dec(p),
                            token: None,
                        },
                        None => UrlAuth {
                            token: dec(info),
                            ..UrlAuth::default()
                        },
                    }
                }
            };
            match &auth {
                Some(a) if info.is_some() && *a != this => {
                    return Err(bad(
                        "the servers of the list carry different credentials".into()
                    ));
                }
                Some(_) if info.is_none() => {}
                _ => auth = Some(this),
            }
            let tls = scheme == "tls";
            let display_host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host.clone()
            };
            servers.push(Server {
                addr: format!("{scheme}://{display_host}:{port}"),
                host,
                tls,
            });
        }
        Ok((servers, auth.unwrap_or_default()))
    }

    /// Checks everything that can be checked without connecting; the consumer also refuses
    /// an unauthenticated remote server (unless `insecure`).
    pub(crate) fn check(&self, consumer: bool) -> Result<(), ConnectError> {
        let (servers, auth) = self.servers()?;
        for path in self.creds.iter().chain(&self.tls_ca) {
            readable(path)?;
        }
        if let Some((c, k)) = &self.tls_client {
            readable(c)?;
            readable(k)?;
        }
        let authenticated = (auth.user.is_some() && auth.pass.is_some())
            || auth.token.is_some()
            || self.creds.is_some()
            || self.tls_client.is_some();
        if let Some(remote) = servers.iter().find(|s| !is_loopback(&s.host)) {
            if consumer && !authenticated && !self.insecure {
                return Err(ConnectError::Insecure {
                    server: remote.addr.clone(),
                });
            }
            let tls = self.require_tls || servers.iter().all(|s| s.tls);
            if authenticated && !tls {
                tracing::warn!(
                    "NATS server {} is not on this machine and the connection is not TLS: credentials and events cross the network in clear text",
                    remote.addr
                );
            }
        }
        Ok(())
    }

    /// A server of the list is beyond this machine and `insecure` is off: the consumer checks
    /// at each connection that the server requires authentication.
    pub(crate) fn needs_auth_check(&self) -> bool {
        !self.insecure
            && self
                .servers()
                .is_ok_and(|(s, _)| s.iter().any(|s| !is_loopback(&s.host)))
    }

    /// async-nats' options (credentials, TLS, a ping every 10 s so a dead server is
    /// noticed), reporting connection events to `state`. `reconnect`: the client reconnects by
    /// itself, forever, with a capped backoff (the consumer); without it (the publisher, which
    /// makes a new client for each connection so that nothing a dead one still held is ever
    /// sent after what it sends again) the first connection is tried once per server and a
    /// lost one is not taken up again.
    pub(crate) fn connect_options(
        &self,
        state: Arc<ConnState>,
        name: &str,
        reconnect: bool,
    ) -> Result<(async_nats::ConnectOptions, Vec<String>), ConnectError> {
        let (servers, auth) = self.servers()?;
        let n = servers.len();
        let calls = AtomicU64::new(0);
        let mut o = async_nats::ConnectOptions::new()
            .name(format!("prx-hooks {name} {}", super::wire::instance_id()))
            .ping_interval(Duration::from_secs(10))
            .connection_timeout(Duration::from_secs(5))
            .event_callback(move |event| {
                let state = state.clone();
                async move { state.event(event) }
            });
        o = if reconnect {
            o.retry_on_initial_connect()
                .max_reconnects(None)
                .reconnect_delay_callback(|attempts| {
                    let exp = attempts.min(10) as u32;
                    Duration::from_millis(2u64.pow(exp)).min(Duration::from_secs(1))
                })
        } else {
            o.reconnect_delay_callback(move |_| {
                if calls.fetch_add(1, Ordering::Relaxed) < n as u64 {
                    Duration::ZERO
                } else {
                    // A lost connection: its owner drops this client long before.
                    Duration::from_secs(3600)
                }
            })
        };
        if let (Some(user), Some(pass)) = (auth.user, auth.pass) {
            o = o.user_and_password(user, pass);
        }
        if let Some(token) = auth.token {
            o = o.token(token);
        }
        if let Some(path) = &self.creds {
            let text = std::fs::read_to_string(path).map_err(|e| ConnectError::File {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            o = o.credentials(&text).map_err(|e| ConnectError::File {
                path: path.clone(),
                reason: format!("not a NATS credentials file (a user JWT and an nkey seed): {e}"),
            })?;
        }
        if let Some(ca) = &self.tls_ca {
            o = o.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls_client {
            o = o.add_client_certificate(cert.clone(), key.clone());
        }
        if self.require_tls || servers.iter().any(|s| s.tls) {
            o = o.require_tls(true);
        }
        Ok((o, servers.into_iter().map(|s| s.addr).collect()))
    }
}

fn readable(path: &Path) -> Result<(), ConnectError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| ConnectError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// `host:port`, `[::1]:port`, `host` (port 4222).
fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| "an IPv6 address needs its closing ]".to_string())?;
        (h, after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err("the host is missing".into());
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')))
    {
        return Err(format!("character {c:?} is not allowed in a host"));
    }
    let port = match port {
        None => 4222,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("port {p:?} is not a number from 1 to 65535"))?,
    };
    Ok((host.to_string(), port))
}

/// `127.0.0.0/8`, `::1`, `localhost`.
pub(crate) fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A URL list with every `user:password@` and `token@` replaced: `nats://user:***@host`,
/// `nats://***@host`. What every log line and stats field shows. The user info is found in
/// the whole string before it is split into servers (so a raw comma in a password is
/// masked too); a user name holding `,` or `%` is masked with the rest.
pub fn redact_url(url: &str) -> String {
    redact(url, true)
}

/// Byte ranges of each server's user info (the `@` excluded), found in the whole list: each
/// reaches back from an `@` to the `://` before it — or, for a second server without a
/// scheme after one with user info, to the first comma after that server's `@`. A raw `@`
/// in a password (it should be `%40`) joins the two ranges.
fn userinfo_ranges(url: &str) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    let mut scheme_end = 0;
    let mut prev_at: Option<usize> = None;
    let b = url.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if url[i..].starts_with("://") {
            scheme_end = i + 3;
            i += 3;
            continue;
        }
        if b[i] == b'@' {
            match prev_at {
                Some(p) if p >= scheme_end => match url[p..i].find(',') {
                    // Another server without a scheme.
                    Some(c) => ranges.push((p + c + 1, i)),
                    // The same server: `@` in its password.
                    None => {
                        if let Some(last) = ranges.last_mut() {
                            last.1 = i;
                        }
                    }
                },
                _ => ranges.push((scheme_end, i)),
            }
            prev_at = Some(i);
        }
        i += 1;
    }
    ranges
}

/// The servers of a list: split on the commas outside user info.
fn split_servers(url: &str) -> Vec<&str> {
    let ranges = userinfo_ranges(url);
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in url.char_indices() {
        if c == ',' && !ranges.iter().any(|(a, b)| *a <= i && i < *b) {
            out.push(&url[start..i]);
            start = i + 1;
        }
    }
    out.push(&url[start..]);
    out
}

/// `show_user`: keep a plain user name (`user:***@`); otherwise every user info is `***@`.
fn redact(url: &str, show_user: bool) -> String {
    let mut out = String::with_capacity(url.len());
    let mut at = 0;
    for (a, b) in userinfo_ranges(url) {
        out.push_str(&url[at..a]);
        let info = &url[a..b];
        match info.split_once(':') {
            Some((user, _))
                if show_user && !user.is_empty() && !user.contains([',', '%', '/', ' ']) =>
            {
                out.push_str(user);
                out.push_str(":***");
            }
            _ => out.push_str("***"),
        }
        at = b;
    }
    out.push_str(&url[at..]);
    out
}

/// What the connection's event callback saw.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    pub connected: AtomicBool,
    /// Successful connections (the first one included).
    pub connects: AtomicU64,
    /// Messages the client dropped for a slow subscription.
    pub slow_consumer: AtomicU64,
    /// Said once per disconnection: the first failure is a warning, the rest debug.
    said_down: AtomicBool,
    what: String,
}

impl ConnState {
    pub(crate) fn new(what: String) -> Arc<ConnState> {
        Arc::new(ConnState {
            what,
            ..ConnState::default()
        })
    }

    fn event(&self, event: async_nats::Event) {
        use async_nats::Event;
        match event {
            Event::Connected => {
                let n = self.connects.fetch_add(1, Ordering::AcqRel);
                self.connected.store(true, Ordering::Release);
                if n > 0 || self.said_down.swap(false, Ordering::AcqRel) {
                    tracing::info!("{}: connected again", self.what);
                } else {
                    tracing::debug!("{}: connected", self.what);
                }
            }
            Event::Disconnected => {
                self.connected.store(false, Ordering::Release);
                if !self.said_down.swap(true, Ordering::AcqRel) {
                    tracing::warn!("{}: disconnected; reconnecting", self.what);
                }
            }
            Event::SlowConsumer(_) => {
                self.slow_consumer.fetch_add(1, Ordering::Relaxed);
            }
            Event::ServerError(e) => tracing::warn!("{}: server error: {e}", self.what),
            Event::ClientError(e) => tracing::warn!("{}: client error: {e}", self.what),
            Event::LameDuckMode => {
                tracing::info!("{}: the server is shutting down (lame duck)", self.what)
            }
            Event::Draining | Event::Closed => {}
        }
    }

    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub(crate) fn reconnects(&self) -> u64 {
        self.connects.load(Ordering::Acquire).saturating_sub(1)
    }
}

/// A runtime of one worker thread (the client's connection task) named `name`; the bridge's
/// own thread drives it with `block_on`.
pub(crate) fn runtime(name: &str) -> Result<tokio::runtime::Runtime, ConnectError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(ConnectError::Runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_redacted_and_taken_out_of_the_url() {
        let url = "nats://alice:s3cr%40t@10.0.0.1:4333,tls://tok@nats.example";
        let shown = redact_url(url);
        assert_eq!(
            shown,
            "nats://alice:***@10.0.0.1:4333,tls://***@nats.example"
        );
        let o = NatsOptions::new(url);
        assert!(!format!("{o:?}").contains("s3cr"), "{o:?}");
        let err = o.servers().unwrap_err().to_string();
        assert!(
            err.contains("different credentials") && !err.contains("s3cr"),
            "{err}"
        );
        let (servers, auth) = NatsOptions::new("nats://alice:s3cr%40t@10.0.0.1:4333")
            .servers()
            .unwrap();
        assert_eq!(servers[0].addr, "nats://10.0.0.1:4333");
        assert_eq!(auth.pass.as_deref(), Some("s3cr@t"));
        let (servers, _) = NatsOptions::new("[::1]:5000, localhost").servers().unwrap();
        assert_eq!(servers[0].addr, "nats://[::1]:5000");
        assert_eq!(servers[1].addr, "nats://localhost:4222");
    }

    #[test]
    fn a_remote_server_without_credentials_is_refused_to_a_consumer() {
        let refused = NatsOptions::new("nats://192.0.2.7:4222").check(true);
        assert!(
            matches!(refused, Err(ConnectError::Insecure { .. })),
            "{refused:?}"
        );
        let msg = refused.unwrap_err().to_string();
        assert!(
            msg.contains("--nats-insecure") && msg.contains("192.0.2.7"),
            "{msg}"
        );
        // TLS alone says nothing about who may publish.
        assert!(
            NatsOptions::new("tls://192.0.2.7:4222")
                .check(true)
                .is_err()
        );
        for ok in [
            NatsOptions::new("nats://192.0.2.7:4222").insecure(true),
            NatsOptions::new("nats://u:p@192.0.2.7:4222"),
            NatsOptions::new("nats://token@192.0.2.7:4222"),
            NatsOptions::new("127.0.0.1:4222"),
            NatsOptions::new("nats://localhost"),
            NatsOptions::new("[::1]:4222"),
        ] {
            assert!(ok.check(true).is_ok(), "{ok:?}");
        }
        // A publisher is not refused (it runs nothing a server sends).
        assert!(
            NatsOptions::new("nats://192.0.2.7:4222")
                .check(false)
                .is_ok()
        );
    }

    #[test]
    fn empty_credentials_are_none_and_a_raw_comma_stays_in_the_password() {
        for url in [
            "nats://@192.0.2.7:4222",
            "nats://:@192.0.2.7:4222",
            "nats://u:@192.0.2.7",
        ] {
            let refused = NatsOptions::new(url).check(true);
            assert!(
                matches!(refused, Err(ConnectError::Insecure { .. })),
                "{url}"
            );
        }
        let url = "nats://alice:Hunter2,Secret@127.0.0.1:14222";
        assert_eq!(redact_url(url), "nats://alice:***@127.0.0.1:14222");
        let (servers, auth) = NatsOptions::new(url).servers().unwrap();
        assert_eq!(servers.len(), 1);
        assert_eq!(auth.pass.as_deref(), Some("Hunter2,Secret"));
        let (_, auth) = NatsOptions::new("nats://alice:Hunter2%2CSecret@h")
            .servers()
            .unwrap();
        assert_eq!(auth.pass.as_deref(), Some("Hunter2,Secret"));
        // Two servers, the second without a scheme; a raw @ in a password.
        assert_eq!(redact_url("a:pw1@h1:1,b:pw2@h2:2"), "a:***@h1:1,b:***@h2:2");
        assert_eq!(redact_url("nats://a:p@w@h"), "nats://a:***@h");
        for bad in [
            "nats://alice:Hunter2,Secret@127.0.0.1:x",
            "http://alice:Hunter2,Secret@h",
            "nats://alice:Hunter2,Secret@[::1",
        ] {
            let e = NatsOptions::new(bad).servers().unwrap_err().to_string();
            assert!(
                !e.contains("Hunter2") && !e.contains("Secret") && !e.contains("alice"),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, why) in [
            ("http://h:1", "scheme"),
            ("nats://h:0", "port"),
            ("nats://h:x", "port"),
            ("nats://:4222", "host"),
            ("a,,b", "empty server"),
            ("nats://h st", "character"),
        ] {
            let e = NatsOptions::new(url).servers().unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
