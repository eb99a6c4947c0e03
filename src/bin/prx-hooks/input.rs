//! `run --events`: the input read and each line handed to the library's line ingest.
//!
//! The input is a file, stdin, or a FIFO kept open for writer after writer (docs/cli.md
//! § `run`, ARCHITECTURE.md § Ingest).

use prx_hooks::Hooks;
use prx_hooks::ingest::{IngestErrorKind, IngestOptions, LineIngest, Outcome};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What `run` read from `--events` (the final report's `"input"`).
#[derive(Default)]
pub(crate) struct InputCounters {
    pub(crate) lines: AtomicU64,
    pub(crate) events: AtomicU64,
    /// Lines refused by the parser or the extras check (each reported as FILE:LINE:COL).
    pub(crate) bad_lines: AtomicU64,
    /// Events over `max_event_bytes` (each reported as FILE:LINE).
    pub(crate) oversize: AtomicU64,
    /// Events the session map had no room for when the pipeline shut down (a replay waits
    /// for room until then).
    pub(crate) refused: AtomicU64,
    /// `--lenient`: events accepted without a documented field, per `event.field`.
    omitted: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    pub(crate) read_error: AtomicBool,
}

impl InputCounters {
    pub(crate) fn report(&self) -> serde_json::Value {
        let omitted = self
            .omitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        serde_json::json!({
            "lines": self.lines.load(Ordering::Relaxed),
            "events": self.events.load(Ordering::Relaxed),
            "bad_lines": self.bad_lines.load(Ordering::Relaxed),
            "oversize": self.oversize.load(Ordering::Relaxed),
            "refused": self.refused.load(Ordering::Relaxed),
            "omitted_fields": omitted,
        })
    }

    /// Counts a lenient event's missing fields; returns each `event.field` seen first.
    fn omit(&self, kind: prx_hooks::EventKind, fields: &[&str]) -> Vec<String> {
        let mut map = self.omitted.lock().unwrap_or_else(|e| e.into_inner());
        let mut first = Vec::new();
        for f in fields {
            let key = format!("{}.{f}", kind.name());
            let n = map.entry(key.clone()).or_insert(0);
            if *n == 0 {
                first.push(key);
            }
            *n += 1;
        }
        first
    }
}

/// The longest line read whole: the largest event JSON-escaped at worst (`\u0000` is six bytes
/// per byte) plus room for the envelope. Longer lines are skipped unread and reported oversize,
/// so a line without a newline cannot take all memory.
fn max_line_bytes(max_event_bytes: usize) -> usize {
    max_event_bytes.saturating_mul(6).saturating_add(64 << 10)
}

/// What a FIFO still holds is read after a stop, up to this much (the default largest pipe).
const FIFO_DRAIN: usize = 1 << 20;

/// Opens `--events`: `-` is stdin, a file is read to its end, and a named FIFO is held open
/// for writing too, so that its input never ends when one writer closes: writer after writer
/// (an agent opening it once per event) is read, until `stop`. An anonymous pipe (`/dev/stdin`
/// fed by `|`) ends with its writer, as stdin does.
pub(crate) fn open_events(path: &Path, stop: Arc<AtomicBool>) -> Result<Input, BoxError> {
    let plain = |reader: Box<dyn Read + Send>| Input {
        reader,
        drains: false,
    };
    if path.as_os_str() == "-" {
        return Ok(plain(Box::new(std::io::stdin())));
    }
    let shown = || path.display().to_string();
    // Non-blocking, so that opening a FIFO does not wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{}: {e}", shown()))?;
    let meta = file.metadata().map_err(|e| format!("{}: {e}", shown()))?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let proc_fd = format!("/proc/self/fd/{fd}");
    let anonymous = std::fs::read_link(&proc_fd)
        .is_ok_and(|target| target.as_os_str().as_encoded_bytes().starts_with(b"pipe:"));
    if !meta.file_type().is_fifo() || anonymous {
        // O_NONBLOCK does nothing to a regular file's reads; a pipe gets blocking reads back.
        return Ok(plain(Box::new(blocking(file)?)));
    }
    // The FIFO that was opened, not whatever the path names now: through /proc.
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&proc_fd)
    {
        Ok(rw) => Ok(Input {
            reader: Box::new(FifoInput {
                file: rw,
                stop,
                left: None,
            }),
            drains: true,
        }),
        Err(e) => {
            tracing::warn!(
                "{}: cannot hold the FIFO open for writing ({e}): its input ends when its first writer closes it",
                shown()
            );
            // The descriptor above was opened without waiting for a writer: a read now would
            // see the end at once. Open it again, blocking, which waits for the first writer.
            match std::fs::File::open(&proc_fd) {
                Ok(waiting) => Ok(plain(Box::new(waiting))),
                Err(_) => Ok(plain(Box::new(blocking(file)?))),
            }
        }
    }
}

/// An opened `--events`.
pub(crate) struct Input {
    reader: Box<dyn Read + Send>,
    /// A FIFO: after the stop, reading on gives what it still holds, then the end.
    drains: bool,
}

/// `file` with blocking reads.
fn blocking(file: std::fs::File) -> std::io::Result<std::fs::File> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: F_GETFL/F_SETFL on a descriptor `file` owns; no memory is passed.
    let ok = unsafe {
        let flags = nix::libc::fcntl(fd, nix::libc::F_GETFL);
        flags >= 0 && nix::libc::fcntl(fd, nix::libc::F_SETFL, flags & !nix::libc::O_NONBLOCK) >= 0
    };
    if ok {
        Ok(file)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A named FIFO read while this process holds a write end of it too: a writer closing it
/// is no end of file. Reads wait (poll, 100 ms at a time) until data comes or `stop` is set;
/// after `stop` it returns what the FIFO still holds (at most [`FIFO_DRAIN`]), then the end.
struct FifoInput {
    file: std::fs::File,
    stop: Arc<AtomicBool>,
    /// Bytes still to read after the stop.
    left: Option<usize>,
}

impl Read for FifoInput {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            if stopping && self.left.is_none() {
                self.left = Some(FIFO_DRAIN);
            }
            let want = self.left.map_or(buf.len(), |l| l.min(buf.len()));
            if want == 0 {
                return Ok(0);
            }
            match (&self.file).read(&mut buf[..want]) {
                Ok(n) => {
                    if let Some(l) = &mut self.left {
                        *l -= n;
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if stopping {
                        return Ok(0);
                    }
                    let mut fds = [nix::poll::PollFd::new(
                        self.file.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16)) {
                        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads one line into `line` (newline included), at most `max` bytes of it; the rest of a
/// longer line is read and thrown away. Returns the line's full length (0 at the end).
fn read_line_capped(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(total);
        }
        let (chunk, done) = match memchr::memchr(b'\n', buf) {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        let room = max.saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let n = chunk.len();
        total += n;
        reader.consume(n);
        if done {
            return Ok(total);
        }
    }
}

/// Reads NDJSON lines and hands each to the library's line ingest, which waits while the
/// pipeline is busy (a replay must not lose events to its own speed; `emit` itself never
/// waits). Every refused line is said on stderr, once, as `FILE:LINE:COL: path: reason` (or
/// `FILE:LINE: event of N bytes exceeds …`). Stops at the end of the input or, after `stop`,
/// at the next line.
pub(crate) fn ingest(
    hooks: &Hooks,
    Input { reader, drains }: Input,
    name: &str,
    input: &InputCounters,
    opts: IngestOptions,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let mut lines = LineIngest::new(hooks, opts.wait_for_room(true));
    let mut line = Vec::with_capacity(4096);
    let mut number = 0u64;
    let max_line = max_line_bytes(hooks.max_event_bytes());
    loop {
        line.clear();
        let len = read_line_capped(&mut reader, &mut line, max_line)?;
        if len == 0 {
            return Ok(());
        }
        number += 1;
        input.lines.fetch_add(1, Ordering::Relaxed);
        let got = if len > line.len() {
            lines.unread(number, &format!("more than {max_line}"))
        } else {
            lines.line(number, &line)
        };
        if let Some(e) = &got.error {
            match e.kind {
                IngestErrorKind::Oversize => {
                    input.oversize.fetch_add(1, Ordering::Relaxed);
                    say!(
                        "{name}:{number}: {}; raise it with --max-event-bytes",
                        e.message
                    );
                }
                IngestErrorKind::Parse => {
                    input.bad_lines.fetch_add(1, Ordering::Relaxed);
                    say!("{name}:{number}:{}: {}", e.column, e.message);
                }
                _ => {
                    input.bad_lines.fetch_add(1, Ordering::Relaxed);
                    say!("{name}:{number}: {}", e.message);
                }
            }
        }
        if let (Some(kind), false) = (got.kind, got.omitted.is_empty()) {
            for field in input.omit(kind, &got.omitted) {
                tracing::warn!(
                    "{name}:{number}: {field} is missing; accepted (--lenient): hooks see the payload without it (said once per field)"
                );
            }
        }
        match got.outcome {
            Outcome::Queued | Outcome::Skipped => {
                input.events.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Refused => {
                input.refused.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        // After a stop, a FIFO's reader gives what the FIFO still holds, then the end; any
        // other input stops at the next line.
        if !drains && stop.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}
