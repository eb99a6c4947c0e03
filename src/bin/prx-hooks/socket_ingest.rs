//! `run --ingest unix:PATH`: a 0600 unix stream socket reading NDJSON lines into the pipeline.
//!
//! It is for local agents that keep a connection open (docs/ingest.md § The socket).
//!
//! * **Access.** No token: the socket file's mode (0600, this user's) is the rule; it is bound
//!   with `http::bind_unix`, inside a private directory, so nobody else can connect before it
//!   is 0600.
//! * **Per connection** (`socket_conn`): a thread with a `LineIngest` of its own that waits for
//!   room, each refused line answered, a summary at the end.
//! * **Bounded.** At most [`MAX_CONNECTIONS`] at once; more are told so and closed, and so is
//!   a connection no thread can be started for (its place freed at once, said on stderr).
//! * **Shutdown** ([`SocketIngest::stop`]). The accept loop waits in `poll` on the listener and
//!   on a wake-up pair, never on the path, so it ends whatever became of the socket file; every
//!   reader is told to stop (a wait for room ends at once) and its connection's reading half is
//!   shut, so it reads what is already there (counted `stopped`) and answers its summary.

use crate::socket_conn;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use prx_hooks::Hooks;
use serde::Serialize;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections read at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long the accept loop pauses after an accept error other than a vanished connection
/// (out of file descriptors: the listener stays readable, and retrying at once would spin).
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

#[derive(Default)]
pub(crate) struct Counters {
    connections: AtomicU64,
    refused_connections: AtomicU64,
    pub(crate) queued: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) stopped: AtomicU64,
    pub(crate) errors_unsent: AtomicU64,
}

/// What the socket did (`ingest_socket` in `run`'s final report).
#[derive(Debug, Default, Serialize)]
pub(crate) struct SocketStats {
    pub path: String,
    pub connections: u64,
    pub refused_connections: u64,
    pub queued: u64,
    pub dropped: u64,
    pub skipped: u64,
    pub refused: u64,
    pub errors: u64,
    pub stopped: u64,
    pub errors_unsent: u64,
}

/// What the accept loop and the readers share.
pub(crate) struct Shared {
    pub(crate) hooks: Arc<Hooks>,
    pub(crate) lenient: bool,
    pub(crate) max_line: usize,
    /// Set at shutdown: readers stop emitting (`LineIngest::stop_on`) and stop waiting.
    pub(crate) stop: AtomicBool,
    pub(crate) counters: Counters,
    /// Clones of the open connections (their places), to shut their reading at shutdown.
    open: Mutex<Vec<(u64, UnixStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Connections that could not be read, said on stderr at most once a minute.
    unserved: Mutex<Throttle>,
}

impl Shared {
    /// Frees the place of connection `id`; its clone.
    fn release(&self, id: u64) -> Option<UnixStream> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let at = open.iter().position(|(i, _)| *i == id)?;
        Some(open.swap_remove(at).1)
    }
}

pub(crate) struct SocketIngest {
    path: PathBuf,
    identity: (u64, u64),
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    /// Shut down to wake the accept loop.
    wake: UnixStream,
}

impl SocketIngest {
    /// `unix:PATH` as `--ingest` takes it.
    pub(crate) fn start_arg(
        hooks: Arc<Hooks>,
        arg: &str,
        lenient: bool,
        max_event_bytes: usize,
    ) -> std::io::Result<SocketIngest> {
        match arg.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            Some(path) => SocketIngest::start(hooks, Path::new(path), lenient, max_event_bytes),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--ingest {arg:?}: expected unix:PATH"),
            )),
        }
    }

    pub(crate) fn start(
        hooks: Arc<Hooks>,
        path: &Path,
        lenient: bool,
        max_event_bytes: usize,
    ) -> std::io::Result<SocketIngest> {
        let (listener, identity) = prx_hooks::http::bind_unix(path).map_err(|e| {
            std::io::Error::new(e.kind(), format!("--ingest unix:{}: {e}", path.display()))
        })?;
        let started = listener
            .set_nonblocking(true)
            .and_then(|()| UnixStream::pair());
        let (wake, woken) = match started {
            Ok(pair) => pair,
            Err(e) => {
                remove_if_ours(path, identity);
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            hooks,
            lenient,
            max_line: max_event_bytes.saturating_add(64 << 10),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            open: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            unserved: Mutex::new(Throttle::default()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("ingest-socket".into())
            .spawn(move || accept_loop(&listener, &woken, &s));
        let accept = match accept {
            Ok(t) => t,
            Err(e) => {
                remove_if_ours(path, identity);
                return Err(e);
            }
        };
        Ok(SocketIngest {
            path: path.to_path_buf(),
            identity,
            shared,
            accept: Some(accept),
            wake,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting and tells every reader to stop: a wait for room ends at once, lines
    /// still unread are counted as stopped, and no client can write more. Returns at once
    /// ([`SocketIngest::shutdown`] waits for the readers).
    pub(crate) fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.wake.shutdown(std::net::Shutdown::Both);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (_, conn) in self
            .shared
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = conn.shutdown(std::net::Shutdown::Read);
        }
    }

    /// Stops ([`SocketIngest::stop`]), joins every reader, removes the socket file if it is
    /// still the one bound; the counts.
    pub(crate) fn shutdown(mut self) -> SocketStats {
        self.stop();
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
        remove_if_ours(&self.path, self.identity);
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SocketStats {
            path: self.path.display().to_string(),
            connections: get(&c.connections),
            refused_connections: get(&c.refused_connections),
            queued: get(&c.queued),
            dropped: get(&c.dropped),
            skipped: get(&c.skipped),
            refused: get(&c.refused),
            errors: get(&c.errors),
            stopped: get(&c.stopped),
            errors_unsent: get(&c.errors_unsent),
        }
    }
}

/// Removes the socket file at `path` if it is the one bound (same device and inode): one put
/// there by someone else since is left alone.
fn remove_if_ours(path: &Path, identity: (u64, u64)) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::symlink_metadata(path)
        && (m.dev(), m.ino()) == identity
    {
        let _ = std::fs::remove_file(path);
    }
}

/// Waits in `poll` for a connection or for `woken` (the end); takes every connection waiting.
fn accept_loop(listener: &UnixListener, woken: &UnixStream, shared: &Arc<Shared>) {
    let mut next_id = 0u64;
    let mut failed = Throttle::default();
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(woken.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!("ingest socket: poll failed ({e}); no more connections are taken");
                return;
            }
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) || shared.stop.load(Ordering::Acquire) {
            return;
        }
        loop {
            match listener.accept() {
                Ok((conn, _)) => {
                    next_id += 1;
                    admit(shared, conn, next_id);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    if let Some(n) = failed.note() {
                        tracing::warn!(
                            "ingest socket: cannot accept a connection ({e}; {n} time(s) since this was last said); retrying. Raise the open-file limit (ulimit -n) if it is reached"
                        );
                    }
                    if woken_within(woken, ACCEPT_PAUSE) {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

/// Whether `woken` becomes readable (the end) within `wait`.
fn woken_within(woken: &UnixStream, wait: Duration) -> bool {
    let mut fds = [PollFd::new(woken.as_fd(), PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

/// Gives `conn` a place and a reader thread; told so and closed when there is no place, or no
/// thread (or descriptor) for it.
fn admit(shared: &Arc<Shared>, conn: UnixStream, id: u64) {
    let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
    if open.len() >= MAX_CONNECTIONS {
        drop(open);
        let msg = format!("too many connections ({MAX_CONNECTIONS} are open); try again later");
        refuse(shared, &conn, &msg);
        return;
    }
    let clone = match conn.try_clone() {
        Ok(clone) => clone,
        Err(e) => {
            drop(open);
            let cause = format!("cannot open a descriptor for a connection ({e})");
            unserved(
                shared,
                &conn,
                &cause,
                "the open-file limit (ulimit -n; systemd: LimitNOFILE=)",
            );
            return;
        }
    };
    open.push((id, clone));
    drop(open);
    let s = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("ingest-conn".into())
        .spawn(move || {
            socket_conn::read(&s, &conn);
            s.release(id);
        });
    match spawned {
        Ok(t) => {
            shared.counters.connections.fetch_add(1, Ordering::Relaxed);
            let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
            threads.retain(|t| !t.is_finished());
            threads.push(t);
        }
        // The closure, and `conn` with it, is gone: the answer goes through the clone.
        Err(e) => {
            if let Some(clone) = shared.release(id) {
                let cause = format!("cannot start a thread to read a connection ({e})");
                let limit = "the limit on this user's processes and threads (ulimit -u; systemd: LimitNPROC=, TasksMax=)";
                unserved(shared, &clone, &cause, limit);
            }
        }
    }
}

/// Tells a connection it is refused (one line), counts it.
fn refuse(shared: &Shared, conn: &UnixStream, message: &str) {
    shared
        .counters
        .refused_connections
        .fetch_add(1, Ordering::Relaxed);
    let mut line = serde_json::json!({ "error": message })
        .to_string()
        .into_bytes();
    line.push(b'\n');
    socket_conn::Answers::default().send(conn, &line);
}

/// A connection that cannot be read (`cause`, for want of `limit`): refused with the cause,
/// which is said on stderr at most once a minute.
fn unserved(shared: &Shared, conn: &UnixStream, cause: &str, limit: &str) {
    refuse(
        shared,
        conn,
        &format!("the server {cause}; try again later"),
    );
    let noted = shared
        .unserved
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .note();
    let refused = match noted {
        None => return,
        Some(1) => "the connection was refused".to_string(),
        Some(n) => format!("{n} connections were refused since this was last said"),
    };
    tracing::warn!("ingest socket: {cause}: {refused}. Raise {limit}");
}

/// Something to say at most once a minute.
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    since: u64,
}

impl Throttle {
    /// Notes one more time it happened; when it is to be said, how many times since it last
    /// was.
    fn note(&mut self) -> Option<u64> {
        self.since += 1;
        if self
            .last
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
        {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.since))
    }
}
