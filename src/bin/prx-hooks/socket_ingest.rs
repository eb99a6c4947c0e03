//! `run --ingest unix:PATH`: a 0600 unix stream socket reading NDJSON lines into the pipeline.
//!
//! It is for local agents that keep a connection open (docs/ingest.md § The socket).
//!
//! * **Access.** No token: the socket file's mode (0600, this user's) is the rule; it is bound
//!   with `http::bind_unix` (never reachable with a looser mode).
//! * **Per connection.** A thread with a `LineIngest` of its own that waits for room, so a
//!   client is slowed by backpressure instead of losing events; the session map keeps one
//!   (agent, session)'s order across connections. Each refused line is answered with one
//!   NDJSON line `{"line","column","message"}`, written without blocking: a client that never
//!   reads loses those answers (counted `errors_unsent`), never stalls its reader or anyone
//!   else. When the client shuts down its writing half, it gets one summary line
//!   `{"queued","dropped","skipped","refused","errors"}`.
//! * **Bounded.** A line longer than `max_event_bytes` + 64 KiB is skipped to its newline
//!   unheld (an error); at most [`MAX_CONNECTIONS`] at once, more are told so and closed.

use prx_hooks::Hooks;
use prx_hooks::ingest::{IngestOptions, LineIngest};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Connections read at once.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Answers kept for a client that does not read them yet.
const PENDING_BYTES: usize = 64 << 10;

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    refused_connections: AtomicU64,
    queued: AtomicU64,
    dropped: AtomicU64,
    skipped: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    errors_unsent: AtomicU64,
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
    pub errors_unsent: u64,
}

struct Shared {
    hooks: Arc<Hooks>,
    lenient: bool,
    max_line: usize,
    stop: AtomicBool,
    counters: Counters,
    /// Clones of the open connections, to end their reads at shutdown.
    open: Mutex<Vec<(u64, UnixStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) struct SocketIngest {
    path: PathBuf,
    identity: (u64, u64),
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
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
        let shared = Arc::new(Shared {
            hooks,
            lenient,
            max_line: max_event_bytes.saturating_add(64 << 10),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            open: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("ingest-socket".into())
            .spawn(move || accept_loop(listener, s))?;
        Ok(SocketIngest {
            path: path.to_path_buf(),
            identity,
            shared,
            accept: Some(accept),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, ends every connection, joins every thread, removes the socket file if
    /// it is still ours; the counts.
    pub(crate) fn shutdown(mut self) -> SocketStats {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop.
        let _ = UnixStream::connect(&self.path);
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
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
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
        if let Ok(m) = std::fs::symlink_metadata(&self.path) {
            use std::os::unix::fs::MetadataExt;
            if (m.dev(), m.ino()) == self.identity {
                let _ = std::fs::remove_file(&self.path);
            }
        }
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
            errors_unsent: get(&c.errors_unsent),
        }
    }
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let mut next_id = 0u64;
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let mut open = shared.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= MAX_CONNECTIONS {
            drop(open);
            shared
                .counters
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
            let msg = format!(
                "{{\"error\":\"too many connections ({MAX_CONNECTIONS} are open); try again later\"}}\n"
            );
            let mut out = Answers::default();
            out.send(&conn, msg.as_bytes());
            continue;
        }
        next_id += 1;
        let Ok(clone) = conn.try_clone() else {
            continue;
        };
        open.push((next_id, clone));
        drop(open);
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let s = shared.clone();
        let id = next_id;
        let spawned = std::thread::Builder::new()
            .name("ingest-conn".into())
            .spawn(move || {
                read_connection(&s, conn);
                s.open
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(i, _)| *i != id);
            });
        if let Ok(t) = spawned {
            let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
            threads.retain(|t| !t.is_finished());
            threads.push(t);
        }
    }
}

/// Answers written without blocking; what the client does not take waits in `pending`
/// (bounded) and the rest is counted as unsent.
#[derive(Default)]
struct Answers {
    pending: Vec<u8>,
    unsent: u64,
}

impl Answers {
    fn flush(&mut self, conn: &UnixStream) {
        use nix::sys::socket::{MsgFlags, send};
        while !self.pending.is_empty() {
            match send(
                conn.as_raw_fd(),
                &self.pending,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    }

    fn send(&mut self, conn: &UnixStream, line: &[u8]) {
        self.flush(conn);
        if self.pending.len() + line.len() > PENDING_BYTES {
            self.unsent += 1;
            return;
        }
        self.pending.extend_from_slice(line);
        self.flush(conn);
    }
}

fn read_connection(shared: &Shared, conn: UnixStream) {
    let hooks = &shared.hooks;
    let max_line = shared.max_line;
    let opts = IngestOptions::default()
        .lenient(shared.lenient)
        .wait_for_room(true);
    let mut ingest = LineIngest::new(hooks, opts);
    let Ok(reading) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::with_capacity(64 << 10, reading);
    let mut answers = Answers::default();
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut skipping = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok([]) => break,
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        let used = chunk.len();
        if !skipping {
            if line.len() + used > max_line {
                skipping = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if !end {
            continue;
        }
        number += 1;
        let got = if skipping {
            skipping = false;
            ingest.unread(number, &format!("more than {max_line}"))
        } else {
            let got = ingest.line(number, &line);
            line.clear();
            got
        };
        if let Some(e) = got
            .error
            .filter(|_| got.outcome == prx_hooks::ingest::Outcome::Error)
        {
            let mut text = serde_json::to_vec(&e).unwrap_or_default();
            text.push(b'\n');
            answers.send(&conn, &text);
        }
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
    }
    if !line.is_empty() && !skipping {
        number += 1;
        ingest.line(number, &line);
    }
    let report = ingest.into_report();
    let errors = report.errors.len() as u64 + report.more_errors;
    let c = &shared.counters;
    for (counter, n) in [
        (&c.queued, report.queued),
        (&c.dropped, report.dropped),
        (&c.skipped, report.skipped),
        (&c.refused, report.refused),
        (&c.errors, errors),
    ] {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    let summary = serde_json::json!({
        "queued": report.queued, "dropped": report.dropped, "skipped": report.skipped,
        "refused": report.refused, "errors": errors,
    });
    let mut text = summary.to_string().into_bytes();
    text.push(b'\n');
    answers.send(&conn, &text);
    c.errors_unsent.fetch_add(answers.unsent, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Both);
}
