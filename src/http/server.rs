//! [`Server`]: the API on its own small tokio runtime, for hosts without one (and for
//! `prx-hooks run --listen`), over TCP or a unix socket, with the limits that keep it
//! answering the token holder, and the hooks spawning, whatever other clients do.
//!
//! axum's own `serve` runs hyper without a timer (so hyper's header-read timeout is off), with
//! no idle timeout and no connection cap: connections that send half a request stay open
//! forever, and enough of them fill the file-descriptor table until the hooks cannot open
//! their payload files. So the server drives connections itself:
//!
//! ```text
//! accept ─► over the cap? ─► the oldest connection without the token is closed to make room
//!        │                    (`evicted`; conns.rs); every one has shown it ─► the new one is
//!        │                    closed at once (`refused_over_cap`, said once a minute)
//!        └► hyper HTTP/1 connection (TokioTimer)
//!             a 401 or 403 ─► closed after the response                (`closed_unauthorized`)
//!             head not complete within header_timeout (from connect, or from the previous
//!                  response on a kept-alive connection) ─► closed (`header_timeouts`)
//!             body silent for idle_timeout ─► 408, closed            (`body_timeouts`)
//!             response not read for idle_timeout ─► closed           (`write_timeouts`)
//! accept fails (EMFILE…) ─► counted, said once a minute, retried after 50 ms (no spinning)
//! ```
//!
//! The cap leaves file descriptors for the hooks: by default it is RLIMIT_NOFILE (soft) minus
//! the descriptors open when the server starts, minus what the shell backend needs with every
//! hook running ([`ShellSink::fds_at_limits`], which grows with the table, so the cap is
//! computed again at every accept), minus a reserve of [`FD_RESERVE`], at most
//! [`MAX_AUTO_CONNECTIONS`]. The library never changes RLIMIT_NOFILE (`prx-hooks run` raises
//! its soft limit to the hard one before starting the server).
//!
//! [`ShellSink::fds_at_limits`]: crate::shell::ShellSink::fds_at_limits

use super::conns::{Admitted, Conn, ConnCounters, HttpStats};
use super::{HttpOptions, Serving, build};
use crate::Hooks;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The automatic connection cap never exceeds this (a management API needs far fewer).
pub(crate) const MAX_AUTO_CONNECTIONS: usize = 1024;

/// Descriptors kept free beyond what the hooks need: the runtime, the watcher, logs, plugin
/// files, the descriptors a spawn holds for a moment.
pub(crate) const FD_RESERVE: usize = 64;

/// However small the descriptor budget, this many connections are allowed (and a warning
/// says the budget is too small).
const MIN_CONNECTIONS: usize = 4;

/// hyper's read buffer per connection (and with it the largest request head: 431 beyond).
/// hyper's default is ~400 KiB; with hundreds of connections that is memory for nothing.
const MAX_BUF: usize = 64 * 1024;

/// How long the accept loop waits after running out of descriptors before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Where a [`Server`] listens. Displayed as clients address it: `http://127.0.0.1:7878`,
/// `unix:/run/prx.sock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix-domain socket at this path.
    Unix(PathBuf),
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "http://{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A running API server. Dropping it stops it (waiting up to a second for open requests).
///
/// # Examples
///
/// ```
/// use prx_hooks::Hooks;
/// use prx_hooks::http::{HttpOptions, Server, Token};
/// use std::io::{Read, Write};
/// use std::sync::Arc;
/// let hooks = Arc::new(Hooks::builder().build()?);
/// let token = Token::new("0123456789abcdef0123456789abcdef", "the example")?;
/// let mut server = Server::start(hooks, HttpOptions::new(token), "127.0.0.1:0".parse()?)?;
/// let mut conn = std::net::TcpStream::connect(server.local_addr())?;
/// conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
/// let mut answer = String::new();
/// conn.read_to_string(&mut answer)?;
/// assert!(answer.starts_with("HTTP/1.1 200"));
/// assert!(answer.ends_with(r#"{"status":"ok"}"#));
/// server.shutdown(std::time::Duration::from_secs(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Server {
    listen: Listen,
    conns: Arc<ConnCounters>,
    runtime: Option<tokio::runtime::Runtime>,
    /// `/api/events`, ended first at shutdown (its responses never end by themselves).
    events: super::events::EventHub,
    stop: Option<watch::Sender<bool>>,
    done: Option<tokio::task::JoinHandle<()>>,
    /// The socket file to remove at shutdown, with its identity (removed only if still ours).
    socket_file: Option<(PathBuf, (u64, u64))>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("listen", &self.listen)
            .finish_non_exhaustive()
    }
}

/// A bound listener, before it is handed to the runtime.
enum Bound {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// The same, registered with the runtime.
enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// What each connection is served with.
#[derive(Clone, Copy)]
struct Limits {
    header: Duration,
    idle: Duration,
}

impl Server {
    /// The automatic connection cap's upper bound (see [`HttpOptions::max_connections`]).
    pub const MAX_AUTO_CONNECTIONS: usize = MAX_AUTO_CONNECTIONS;

    /// Binds `addr` (port 0 picks a free port) and serves the API on two runtime threads,
    /// plus blocking-pool threads made on demand (at most 64) for file reads and writes. Test
    /// runs wait on no thread at all. `Host` and `Origin` are checked (see
    /// [`HttpOptions::allow_hosts`]). Binding happens before this returns, so a taken port is
    /// an error here.
    pub fn start(
        hooks: Arc<Hooks>,
        opts: HttpOptions,
        addr: SocketAddr,
    ) -> std::io::Result<Server> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        Server::launch(hooks, opts, Listen::Tcp(addr), Bound::Tcp(listener), None)
    }

    /// Serves the API on a unix socket at `path`, mode 0600 (only this user, and root, can
    /// connect; the token is still required), so local clients need no TCP port. The socket
    /// is bound under a temporary name, restricted, then renamed into place, so it is never
    /// reachable with looser permissions. A stale socket left at `path` by a dead server is
    /// replaced; a live one (something accepts connections on it) is an `AddrInUse` error,
    /// and any other file there an `AlreadyExists` error. The socket file is removed at
    /// shutdown if it is still this server's.
    pub fn start_unix(
        hooks: Arc<Hooks>,
        opts: HttpOptions,
        path: impl AsRef<Path>,
    ) -> std::io::Result<Server> {
        let path = std::path::absolute(path.as_ref())?;
        let (listener, identity) = bind_unix(&path)?;
        Server::launch(
            hooks,
            opts,
            Listen::Unix(path.clone()),
            Bound::Unix(listener),
            Some((path, identity)),
        )
    }

    fn launch(
        hooks: Arc<Hooks>,
        opts: HttpOptions,
        listen: Listen,
        bound: Bound,
        socket_file: Option<(PathBuf, (u64, u64))>,
    ) -> std::io::Result<Server> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(64)
            .thread_name("prx-http")
            .enable_all()
            .build()?;
        let listener = {
            let _enter = runtime.enter();
            match bound {
                Bound::Tcp(l) => Listener::Tcp(tokio::net::TcpListener::from_std(l)?),
                Bound::Unix(l) => {
                    l.set_nonblocking(true)?;
                    Listener::Unix(tokio::net::UnixListener::from_std(l)?)
                }
            }
        };
        let cap = Cap::measure(hooks.clone(), opts.max_connections);
        let conns = Arc::new(ConnCounters {
            listen: listen.to_string(),
            max: AtomicU64::new(cap.now()),
            ..ConnCounters::default()
        });
        let limits = Limits {
            header: opts.header_timeout,
            idle: opts.idle_timeout,
        };
        let events = super::events::EventHub::new(opts.events.clone(), Some(conns.clone()));
        let app = build(
            hooks,
            opts,
            Serving::Own {
                listen: listen.clone(),
                conns: conns.clone(),
                events: events.clone(),
            },
        );
        let (stop, stopped) = watch::channel(false);
        let done = runtime.spawn(accept_loop(
            listener,
            app,
            limits,
            cap,
            conns.clone(),
            stopped,
        ));
        Ok(Server {
            listen,
            conns,
            runtime: Some(runtime),
            events,
            stop: Some(stop),
            done: Some(done),
            socket_file,
        })
    }

    /// The TCP address it listens on (the real port when started on port 0); for a server on
    /// a unix socket, the unspecified address `0.0.0.0:0` (see [`Server::listen`]).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.listen {
            Listen::Tcp(addr) => *addr,
            Listen::Unix(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }

    /// Where it listens.
    pub fn listen(&self) -> &Listen {
        &self.listen
    }

    /// The connection cap in force (see [`HttpOptions::max_connections`]).
    pub fn max_connections(&self) -> usize {
        self.conns.max.load(Ordering::Relaxed) as usize
    }

    /// The connection counters.
    pub fn stats(&self) -> HttpStats {
        self.conns.snapshot()
    }

    /// The event stream's counters (`GET /api/events`).
    pub fn event_stats(&self) -> super::EventStreamStats {
        self.events.stats()
    }

    /// Stops accepting connections, lets open requests finish for at most `timeout`, then
    /// closes everything (a test run still running is killed). Idempotent. Safe to call (or
    /// to drop the server) from inside another tokio runtime: the waiting happens on a
    /// short-lived thread of its own, where blocking is allowed.
    pub fn shutdown(&mut self, timeout: Duration) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let started = Instant::now();
        // Event streams first: hyper's graceful shutdown waits for responses to end, and a
        // stream's never does by itself.
        self.events.close("the server is stopping");
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        let done = self.done.take();
        std::thread::scope(|s| {
            s.spawn(move || {
                if let Some(done) = done {
                    match runtime.block_on(async { tokio::time::timeout(timeout, done).await }) {
                        Ok(Err(e)) => tracing::warn!("HTTP server task failed: {e}"),
                        Err(_) => tracing::warn!(
                            "HTTP server: requests still open after {timeout:?}; closing them"
                        ),
                        Ok(Ok(())) => {}
                    }
                }
                runtime.shutdown_timeout(timeout.saturating_sub(started.elapsed()));
            });
        });
        if let Some((path, identity)) = self.socket_file.take()
            && file_identity(&path).ok() == Some(identity)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(1));
    }
}

/// The connection cap, computed at every accept: the hooks' need grows with the table (one
/// reserved process slot per hook), and a reload may add hooks after the server started.
struct Cap {
    hooks: Arc<Hooks>,
    /// The soft RLIMIT_NOFILE when the server started (the library never changes it).
    soft: usize,
    /// Descriptors open when the server started, before any connection.
    base: usize,
    asked: Option<usize>,
}

impl Cap {
    /// Takes the figures that do not change, and says once if the budget is too small or
    /// lowers what was asked.
    fn measure(hooks: Arc<Hooks>, asked: Option<usize>) -> Cap {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| {
                usize::try_from(soft).unwrap_or(usize::MAX)
            });
        let base = std::fs::read_dir("/proc/self/fd").map_or(FD_RESERVE, |d| d.count());
        let cap = Cap {
            hooks,
            soft,
            base,
            asked,
        };
        let (budget, need) = cap.budget();
        if budget <= MIN_CONNECTIONS {
            tracing::warn!(
                "RLIMIT_NOFILE is {soft}: with {base} descriptors open and {need} kept for the \
                 hooks, the API gets {MIN_CONNECTIONS} connections at most (raise it with \
                 `ulimit -n`)"
            );
        }
        if let Some(n) = asked
            && n > budget
        {
            tracing::warn!(
                "max_connections {n} lowered to {budget}: RLIMIT_NOFILE is {soft}, {base} \
                 descriptors are open and the hooks need {need} at their limits"
            );
        }
        cap
    }

    /// (descriptors the API may use for connections now, what the hooks need now).
    fn budget(&self) -> (usize, usize) {
        let need = self.hooks.shell().map_or(0, |s| s.fds_at_limits());
        let budget = self.soft.saturating_sub(self.base + need + FD_RESERVE);
        (budget.max(MIN_CONNECTIONS), need)
    }

    /// The cap in force now: what was asked (lowered to the budget), else the budget (at most
    /// [`MAX_AUTO_CONNECTIONS`]).
    fn now(&self) -> u64 {
        let (budget, _) = self.budget();
        let cap = match self.asked {
            Some(n) => n.min(budget),
            None => budget.min(MAX_AUTO_CONNECTIONS),
        };
        cap as u64
    }
}

/// Binds a unix socket at `path` with mode 0600, never reachable by another user on the way:
/// it is bound inside a directory made for the purpose beside `path` (mode 0700, this
/// user's), made 0600 there, renamed over `path`, and the directory removed. (Not through the
/// umask, which is the whole process's.) A live socket at `path` is refused (another server
/// listens), a dead one replaced, anything else refused. Returns the listener and the socket
/// file's (device, inode), so that its owner can remove it later only if it is still the same
/// file. [`Server::start_unix`] and `prx-hooks run --ingest` bind with it.
///
/// # Examples
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("ingest.sock");
/// let (_listener, _id) = prx_hooks::http::bind_unix(&path)?;
/// use std::os::unix::fs::PermissionsExt;
/// assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
/// assert_eq!(std::fs::read_dir(dir.path())?.count(), 1, "the private directory is gone");
/// assert!(prx_hooks::http::bind_unix(&path).is_err(), "a live socket is refused");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn bind_unix(path: &Path) -> io::Result<(std::os::unix::net::UnixListener, (u64, u64))> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another server is listening on it", path.display()),
                ));
            }
            // A dead server's socket: replaced by the rename below.
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists and is not a socket", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| io::Error::other(e.to_string()))?;
    let private = dir.join(format!(
        ".{name}.{}.{:016x}.d",
        std::process::id(),
        u64::from_ne_bytes(nonce)
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let tmp = private.join("s");
    let placed = bind_in_private(&private, &tmp, path);
    // After the rename `tmp` is gone; after a failure the socket (if any) goes with the
    // directory.
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir(&private);
    placed
}

/// Binds `tmp` inside `private` (just made, this user's), makes it 0600 and renames it to
/// `path`; the listener and the file's (device, inode).
fn bind_in_private(
    private: &Path,
    tmp: &Path,
    path: &Path,
) -> io::Result<(std::os::unix::net::UnixListener, (u64, u64))> {
    use std::os::unix::fs::PermissionsExt;
    // The umask can only have taken bits away from mkdir's 0700: exactly 0700, so that this
    // user can bind inside whatever the umask is.
    std::fs::set_permissions(private, std::fs::Permissions::from_mode(0o700))?;
    let listener = std::os::unix::net::UnixListener::bind(tmp)?;
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o600))?;
    let identity = file_identity(tmp)?;
    std::fs::rename(tmp, path)?;
    Ok((listener, identity))
}

fn file_identity(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Says something at most once a minute (with how often it happened meanwhile).
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    since: u64,
}

impl Throttle {
    fn note(&mut self, say: impl FnOnce(u64)) {
        self.since += 1;
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            say(self.since);
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}

/// Gives the connection's place back when its task ends (or is dropped).
struct OpenSlot(Arc<ConnCounters>, Arc<Conn>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.table.leave(&self.1);
    }
}

async fn accept_loop(
    listener: Listener,
    app: Router,
    limits: Limits,
    cap: Cap,
    conns: Arc<ConnCounters>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tasks = JoinSet::new();
    let (mut over_cap, mut failing) = (Throttle::default(), Throttle::default());
    loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = stopped.changed() => break,
            a = accept(&listener) => a,
        };
        let (io, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                conns.accept_errors.fetch_add(1, Ordering::Relaxed);
                failing.note(|n| {
                    tracing::warn!("HTTP API: accepting a connection failed ({n}x): {e}")
                });
                // Out of descriptors (or memory): the pending connection stays in the
                // backlog; try again shortly instead of spinning.
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        conns.accepted.fetch_add(1, Ordering::Relaxed);
        let max = cap.now();
        conns.max.store(max, Ordering::Relaxed);
        let conn = match conns.table.admit(max as usize) {
            Some(Admitted::Free(conn)) => conn,
            Some(Admitted::Evicted(conn)) => {
                conns.evicted.fetch_add(1, Ordering::Relaxed);
                conn
            }
            None => {
                conns.refused.fetch_add(1, Ordering::Relaxed);
                over_cap.note(|n| {
                    tracing::warn!(
                        "HTTP API: {max} connections open, the cap, every one of them \
                         authenticated; closed {n} more at once"
                    )
                });
                drop(io);
                continue;
            }
        };
        let slot = OpenSlot(conns.clone(), conn);
        let (app, stopped, conns) = (app.clone(), stopped.clone(), conns.clone());
        match io {
            Stream::Tcp(s) => {
                tasks.spawn(serve_connection(s, peer, app, limits, stopped, conns, slot))
            }
            Stream::Unix(s) => {
                tasks.spawn(serve_connection(s, peer, app, limits, stopped, conns, slot))
            }
        };
    }
    // Stop accepting at once; open connections finish their request (they saw `stopped`).
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Who is on the other end, put into every request's extensions.
#[derive(Clone, Debug)]
enum Peer {
    Tcp(SocketAddr),
    /// `unix peer uid U pid P`.
    Unix(String),
}

async fn accept(listener: &Listener) -> io::Result<(Stream, Peer)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, addr) = l.accept().await?;
            Ok((Stream::Tcp(s), Peer::Tcp(addr)))
        }
        Listener::Unix(l) => {
            let (s, _) = l.accept().await?;
            let who = match s.peer_cred() {
                Ok(c) => match c.pid() {
                    Some(pid) => format!("unix peer uid {} pid {pid}", c.uid()),
                    None => format!("unix peer uid {}", c.uid()),
                },
                Err(_) => "unix peer".to_string(),
            };
            Ok((Stream::Unix(s), Peer::Unix(who)))
        }
    }
}

async fn serve_connection<IO>(
    io: IO,
    peer: Peer,
    app: Router,
    limits: Limits,
    stopped: watch::Receiver<bool>,
    conns: Arc<ConnCounters>,
    slot: OpenSlot,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = slot.1.clone();
    // Evicted (conns.rs): dropped at once, closing the socket.
    tokio::select! {
        () = serve_http1(io, peer, app, limits, stopped, conns, conn.clone()) => {}
        () = conn.evicted() => {}
    }
    drop(slot);
}

async fn serve_http1<IO>(
    io: IO,
    peer: Peer,
    app: Router,
    limits: Limits,
    mut stopped: watch::Receiver<bool>,
    conns: Arc<ConnCounters>,
    conn: Arc<Conn>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(WriteDeadline::new(io, limits.idle));
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            // auth.rs marks the connection authenticated when the request shows the token.
            req.extensions_mut().insert(conn.clone());
            match &peer {
                Peer::Tcp(addr) => {
                    req.extensions_mut().insert(ConnectInfo(*addr));
                }
                Peer::Unix(who) => {
                    req.extensions_mut()
                        .insert(super::auth::PeerName(who.clone()));
                }
            }
            let mut app = app.clone();
            let conn = conn.clone();
            async move {
                let resp = tower_service::Service::call(&mut app, req).await;
                conn.answered();
                resp
            }
        });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header)
        .max_buf_size(MAX_BUF);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let result = if *stopped.borrow() {
        conn.as_mut().graceful_shutdown();
        conn.await
    } else {
        tokio::select! {
            r = conn.as_mut() => r,
            _ = stopped.changed() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            conns.header_timeouts.fetch_add(1, Ordering::Relaxed);
        } else if is_write_stall(&e) {
            conns.write_timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The error a stalled write ends its connection with.
#[derive(Debug)]
struct WriteStalled(Duration);

impl fmt::Display for WriteStalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the client read nothing of the response for {:?}",
            self.0
        )
    }
}

impl std::error::Error for WriteStalled {}

fn is_write_stall(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>()
            && io.get_ref().is_some_and(|i| i.is::<WriteStalled>())
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// An I/O stream whose writes fail once they have made no progress for `timeout`: a client
/// that stops reading (its receive window full) cannot hold the connection, its buffers and
/// its request's resources forever. Reads pass through: a silent head is hyper's header
/// timeout, a silent body the body reader's.
struct WriteDeadline<IO> {
    io: IO,
    timeout: Duration,
    /// Armed when a write first returns `Pending`, disarmed by any progress.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> WriteDeadline<IO> {
    fn new(io: IO, timeout: Duration) -> WriteDeadline<IO> {
        WriteDeadline {
            io,
            timeout,
            timer: None,
        }
    }

    /// Passes `r` on, arming the timer while it is `Pending` and failing once the timer fires.
    fn watch<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let timeout = self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                WriteStalled(timeout),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteDeadline<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, r)
    }
}
