//! One connection of the ingest socket (`socket_ingest`): its lines into a `LineIngest` of its
//! own, each refused line answered, and a summary when the client shuts its writing half.
//!
//! * **Lines.** Split at `\n`; the last one may end with the client's shutdown instead. A line
//!   longer than `max_event_bytes` + 64 KiB is skipped to its end unheld, an oversize error.
//! * **Answers** ([`Answers`]) are written without blocking while the client writes: what it
//!   does not take waits, at most [`PENDING_BYTES`], and the answers beyond are counted as
//!   unsent. Once it has shut its writing half, the rest and the summary wait for it to read,
//!   at most [`SUMMARY_WAIT`] (not at shutdown); what it still has not taken is counted as
//!   unsent. Every answer is delivered or counted (`errors_unsent`).

use crate::socket_ingest::Shared;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use prx_hooks::ingest::{IngestOptions, IngestReport, LineIngest, Outcome};
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Answers kept for a client that does not read them yet.
const PENDING_BYTES: usize = 64 << 10;

/// How long the last answers and the summary wait for a client that has shut its writing half
/// to read them.
const SUMMARY_WAIT: Duration = Duration::from_secs(5);

/// Reads `conn` to its end (or to the shutdown), answering each refused line; then the summary.
pub(crate) fn read(shared: &Shared, conn: &UnixStream) {
    let opts = IngestOptions::default()
        .lenient(shared.lenient)
        .wait_for_room(true);
    let mut ingest = LineIngest::new(&shared.hooks, opts).stop_on(&shared.stop);
    let mut answers = Answers::default();
    let mut lines = Lines::new(conn, shared.max_line);
    let mut number = 0u64;
    while let Some(piece) = lines.next() {
        number += 1;
        let got = match piece {
            Piece::Line(line) => ingest.line(number, line),
            Piece::TooLong => ingest.unread(number, &format!("more than {}", shared.max_line)),
        };
        if got.outcome == Outcome::Error
            && let Some(e) = got.error
        {
            let mut text = serde_json::to_vec(&e).unwrap_or_default();
            text.push(b'\n');
            answers.send(conn, &text);
        }
    }
    let report = ingest.into_report();
    let summary = Summary::count(shared, &report);
    let unsent = answers.finish(conn, &shared.stop, |unsent| {
        let mut text = serde_json::to_vec(&Summary {
            errors_unsent: unsent,
            ..summary
        })
        .unwrap_or_default();
        text.push(b'\n');
        text
    });
    shared
        .counters
        .errors_unsent
        .fetch_add(unsent, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// The last line a client gets: its lines' outcomes (`stopped` and `errors_unsent` only when
/// not 0).
#[derive(Clone, Copy, Serialize)]
struct Summary {
    queued: u64,
    dropped: u64,
    skipped: u64,
    refused: u64,
    errors: u64,
    #[serde(skip_serializing_if = "is_zero")]
    stopped: u64,
    #[serde(skip_serializing_if = "is_zero")]
    errors_unsent: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Summary {
    /// The connection's report, added to the socket's counters.
    fn count(shared: &Shared, report: &IngestReport) -> Summary {
        let summary = Summary {
            queued: report.queued,
            dropped: report.dropped,
            skipped: report.skipped,
            refused: report.refused,
            errors: report.errors.len() as u64 + report.more_errors,
            stopped: report.stopped,
            errors_unsent: 0,
        };
        let c = &shared.counters;
        for (counter, n) in [
            (&c.queued, summary.queued),
            (&c.dropped, summary.dropped),
            (&c.skipped, summary.skipped),
            (&c.refused, summary.refused),
            (&c.errors, summary.errors),
            (&c.stopped, summary.stopped),
        ] {
            counter.fetch_add(n, Ordering::Relaxed);
        }
        summary
    }
}

/// A connection's lines, read through a 64 KiB buffer.
struct Lines<'c> {
    reader: BufReader<&'c UnixStream>,
    line: Vec<u8>,
    max: usize,
    /// In a line longer than `max`: read on to its end, not kept.
    skipping: bool,
    ended: bool,
}

/// One line of a connection.
enum Piece<'a> {
    Line(&'a [u8]),
    /// Longer than the reader holds: skipped unread.
    TooLong,
}

impl<'c> Lines<'c> {
    fn new(conn: &'c UnixStream, max: usize) -> Lines<'c> {
        Lines {
            reader: BufReader::with_capacity(64 << 10, conn),
            line: Vec::new(),
            max,
            skipping: false,
            ended: false,
        }
    }

    /// The next line (with its newline, if it has one); `None` at the end. A read error ends
    /// the connection as its end does.
    fn next(&mut self) -> Option<Piece<'_>> {
        self.line.clear();
        while !self.ended {
            let buf = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => &[],
            };
            if buf.is_empty() {
                self.ended = true;
                break;
            }
            let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..=i], true),
                None => (buf, false),
            };
            let used = chunk.len();
            if !self.skipping {
                if self.line.len() + used > self.max {
                    self.skipping = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            self.reader.consume(used);
            if end {
                return Some(self.piece());
            }
        }
        // The last line, ended by the client's shutdown instead of a newline.
        (self.skipping || !self.line.is_empty()).then(|| self.piece())
    }

    fn piece(&mut self) -> Piece<'_> {
        if std::mem::take(&mut self.skipping) {
            Piece::TooLong
        } else {
            Piece::Line(&self.line)
        }
    }
}

/// Answers written without blocking; what the client does not take waits in `pending`
/// (bounded), and the answers beyond are counted as unsent. Each answer is one line.
#[derive(Default)]
pub(crate) struct Answers {
    pending: Vec<u8>,
    unsent: u64,
}

/// What a flush left.
#[derive(PartialEq)]
enum Flushed {
    All,
    /// The client's buffer is full.
    Some,
    /// The client is gone.
    Broken,
}

impl Answers {
    fn flush(&mut self, conn: &UnixStream) -> Flushed {
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
                Err(nix::errno::Errno::EAGAIN) => return Flushed::Some,
                Err(_) => return Flushed::Broken,
            }
        }
        Flushed::All
    }

    /// Sends `line` (one answer, with its newline) without blocking, or keeps it, or counts
    /// it as unsent when [`PENDING_BYTES`] are already waiting.
    pub(crate) fn send(&mut self, conn: &UnixStream, line: &[u8]) {
        self.flush(conn);
        if self.pending.len() + line.len() > PENDING_BYTES {
            self.unsent += 1;
            return;
        }
        self.pending.extend_from_slice(line);
        self.flush(conn);
    }

    /// Delivers what waits, then the summary (`summary(answers unsent)`), waiting for the
    /// client to read them at most [`SUMMARY_WAIT`] (not at all once `stop` is set). Returns
    /// the answers unsent, those still waiting then included.
    fn finish(
        &mut self,
        conn: &UnixStream,
        stop: &AtomicBool,
        summary: impl FnOnce(u64) -> Vec<u8>,
    ) -> u64 {
        let deadline = Instant::now() + SUMMARY_WAIT;
        if self.drain(conn, stop, deadline) {
            self.pending = summary(self.unsent);
            self.drain(conn, stop, deadline);
        } else {
            self.unsent += self.pending.iter().filter(|&&b| b == b'\n').count() as u64;
        }
        self.pending.clear();
        self.unsent
    }

    /// Flushes until nothing waits (true), the client is gone, `stop` is set or `deadline`.
    fn drain(&mut self, conn: &UnixStream, stop: &AtomicBool, deadline: Instant) -> bool {
        loop {
            match self.flush(conn) {
                Flushed::All => return true,
                Flushed::Broken => return false,
                Flushed::Some => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || stop.load(Ordering::Acquire) {
                return false;
            }
            let wait = left.min(Duration::from_millis(50));
            let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLOUT)];
            let _ = poll(
                &mut fds,
                PollTimeout::try_from(wait).unwrap_or(PollTimeout::ZERO),
            );
        }
    }
}
