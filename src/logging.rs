//! [`StderrLog`]: a `tracing` subscriber that writes the log to stderr in a way `fork()` cannot
//! wedge, for hosts that fork (the Python package: multiprocessing's `fork` start method,
//! gunicorn's workers).
//!
//! `tracing_subscriber::fmt()` writing to `std::io::stderr` is not such a log: std's `Stderr`
//! serializes its writers with a lock held across the `write(2)`, so a thread that is writing
//! a line when another thread forks leaves that lock held in the child for good (the child has
//! only the forking thread; the owner is gone). The child's first log line, say its own
//! `Hooks` warning about a bad hooks.json, then waits forever. fmt's span registry takes a
//! process-wide mutex too (the `thread_local` crate's thread-id allocator, the first time a
//! thread logs and when a thread that logged exits).
//!
//! Here a record is formatted into a buffer owned by the call and written to fd 2 with one
//! `write(2)`; threads share nothing but the subscriber's settings, which never change. A
//! second `write` happens only when the kernel took part of the record (a signal interrupted a
//! blocking pipe write); a failed write drops the record (no stderr, a closed pipe, a
//! non-blocking stderr that is full). Records of different threads do not interleave on a pipe
//! up to `PIPE_BUF` (4 KiB: the kernel writes such a write whole), nor in a regular file (its
//! offset is taken and advanced under the file's own lock).
//!
//! The format is tracing-subscriber's default (`2026-01-01T12:00:00.000000Z  WARN message
//! key=value`) without the target; spans are not recorded (the library opens none), so no
//! span context is printed. Filtering is by level ([`StderrLog::max_level`]) or by a layer on
//! top, such as tracing-subscriber's `EnvFilter` — whose directives that name a span (`[…]`)
//! keep state behind locks of their own, and so have no place in a process that forks.

use nix::errno::Errno;
use nix::libc;
use std::fmt::{self, Write as _};
use std::os::fd::RawFd;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// The log on stderr, one `write(2)` per record and no lock (see the module's docs).
///
/// ```no_run
/// use tracing::level_filters::LevelFilter;
/// let log = prx_hooks::logging::StderrLog::new().max_level(LevelFilter::WARN);
/// tracing::subscriber::set_global_default(log).expect("no other global subscriber");
/// ```
#[derive(Debug, Clone)]
pub struct StderrLog {
    fd: RawFd,
    ansi: bool,
    max_level: LevelFilter,
}

impl Default for StderrLog {
    fn default() -> Self {
        StderrLog::new()
    }
}

impl StderrLog {
    /// Every event to fd 2, without colours.
    pub fn new() -> StderrLog {
        StderrLog {
            fd: libc::STDERR_FILENO,
            ansi: false,
            max_level: LevelFilter::TRACE,
        }
    }

    /// Colours (ANSI escapes) on the level, the time and field names, as tracing-subscriber
    /// paints them. Off by default; on only for a terminal is the usual choice.
    pub fn ansi(mut self, ansi: bool) -> StderrLog {
        self.ansi = ansi;
        self
    }

    /// Events above this level are not logged (default: every level).
    pub fn max_level(mut self, level: LevelFilter) -> StderrLog {
        self.max_level = level;
        self
    }

    /// The same log to another descriptor (the tests read it from a socket or a pipe).
    #[cfg(test)]
    fn to_fd(fd: RawFd) -> StderrLog {
        StderrLog {
            fd,
            ..StderrLog::new()
        }
    }

    /// One record, as tracing-subscriber's default format writes it without the target.
    fn format(&self, event: &Event<'_>, now: SystemTime, out: &mut String) {
        let level = *event.metadata().level();
        let name = match level {
            Level::TRACE => "TRACE",
            Level::DEBUG => "DEBUG",
            Level::INFO => " INFO",
            Level::WARN => " WARN",
            Level::ERROR => "ERROR",
        };
        if self.ansi {
            out.push_str("\x1b[2m");
            push_timestamp(out, now);
            out.push_str("\x1b[0m ");
            let colour = match level {
                Level::TRACE => "\x1b[35m",
                Level::DEBUG => "\x1b[34m",
                Level::INFO => "\x1b[32m",
                Level::WARN => "\x1b[33m",
                Level::ERROR => "\x1b[31m",
            };
            out.push_str(colour);
            out.push_str(name);
            out.push_str("\x1b[0m ");
        } else {
            push_timestamp(out, now);
            out.push(' ');
            out.push_str(name);
            out.push(' ');
        }
        event.record(&mut Fields {
            out,
            ansi: self.ansi,
            first: true,
        });
        out.push('\n');
    }
}

impl Subscriber for StderrLog {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && *metadata.level() <= self.max_level
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max_level)
    }

    // Spans are never enabled (see `enabled`): these are not called by `tracing`'s macros.
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = String::with_capacity(256);
        self.format(event, SystemTime::now(), &mut line);
        write_whole(self.fd, line.as_bytes());
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// `bytes` to `fd`: one `write(2)`, more only for what a partial write left. Errors drop the
/// rest (a log line is not worth blocking or failing for; `EINTR` is retried).
fn write_whole(fd: RawFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: write(2) reads `bytes.len()` bytes of a live slice; a descriptor that is not
        // open is EBADF, not undefined behaviour.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && Errno::last() == Errno::EINTR {
            continue;
        } else {
            return;
        }
    }
}

/// `2026-01-01T12:00:00.000000Z` (UTC, microseconds), as tracing-subscriber's `SystemTime`
/// timer writes it; computed here (no `localtime`, no lock). A clock before 1970 reads 1970.
fn push_timestamp(out: &mut String, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = civil_from_days(secs / 86_400);
    let s = secs % 86_400;
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        since.subsec_micros()
    );
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's `civil_from_days`, for days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// An event's fields as tracing-subscriber's default visitor writes them: the message first
/// (events put it first), then ` name=value` with the value's `Debug`.
struct Fields<'a> {
    out: &'a mut String,
    ansi: bool,
    first: bool,
}

impl Fields<'_> {
    fn name(&mut self, name: &str) {
        let name = name.strip_prefix("r#").unwrap_or(name);
        if self.ansi {
            let _ = write!(self.out, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m");
        } else {
            self.out.push_str(name);
            self.out.push('=');
        }
    }

    fn pad(&mut self) {
        if !self.first {
            self.out.push(' ');
        }
        self.first = false;
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"))
        } else {
            self.record_debug(field, &value)
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.pad();
        self.name(field.name());
        let _ = write!(Escaping(self.out), "{value}");
        let Some(mut source) = value.source() else {
            return;
        };
        // The name as given (an `r#` kept), as tracing-subscriber writes it.
        if self.ansi {
            let _ = write!(
                self.out,
                " \x1b[3m{}\x1b[0m\x1b[3m.sources\x1b[0m\x1b[2m=\x1b[0m[",
                field.name()
            );
        } else {
            let _ = write!(self.out, " {}.sources=[", field.name());
        }
        let mut first = true;
        loop {
            if !first {
                self.out.push_str(", ");
            }
            first = false;
            let _ = write!(Escaping(self.out), "{source}");
            match source.source() {
                Some(next) => source = next,
                None => break,
            }
        }
        self.out.push(']');
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.pad();
        if field.name() == "message" {
            let _ = write!(Escaping(self.out), "{value:?}");
        } else {
            self.name(field.name());
            let _ = write!(self.out, "{value:?}");
        }
    }
}

/// Writes text with the characters a terminal would act on spelled out (ESC, BEL, BS, FF,
/// DEL, the C1 controls), as tracing-subscriber does for messages and errors: a hooks.json or
/// a plugin cannot drive the terminal of whoever reads the log.
struct Escaping<'a>(&'a mut String);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' => {
                    let _ = write!(self.0, "\\x{:02x}", c as u32);
                }
                '\u{80}'..='\u{9f}' => {
                    let _ = write!(self.0, "\\u{{{:x}}}", c as u32);
                }
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};

    /// Every datagram waiting on `sock` (each is one `write(2)` of the subscriber).
    fn datagrams(sock: &UnixDatagram) -> Vec<String> {
        sock.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = Vec::new();
        while let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8(buf[..n].to_vec()).unwrap());
        }
        got
    }

    /// What follows the timestamp, after checking its shape.
    fn after_timestamp(line: &str) -> &str {
        let (ts, rest) = line.split_at(27);
        let b = ts.as_bytes();
        assert!(
            b.len() == 27
                && b[4] == b'-'
                && b[10] == b'T'
                && b[19] == b'.'
                && b[26] == b'Z'
                && ts.chars().filter(char::is_ascii_digit).count() == 20,
            "{line:?}"
        );
        rest
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("reading hooks.json")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_record_is_one_write_of_the_whole_line() {
        // A datagram socket keeps each write(2) apart: one datagram per write.
        let (rx, tx) = UnixDatagram::pair().unwrap();
        let log = StderrLog::to_fd(tx.as_raw_fd());
        let big = "x".repeat(64 * 1024);
        let err = Outer(std::io::Error::other("disk on fire"));
        tracing::subscriber::with_default(log, || {
            tracing::warn!(
                hook = "lint",
                runs = 3,
                "hooks.json: rejected ({} error(s))",
                2
            );
            tracing::error!(error = &err as &dyn std::error::Error, "{big}");
            tracing::info!(r#type = ?Some(1), ok = true, "done");
            tracing::debug!("no fields");
        });
        let got = datagrams(&rx);
        let rest: Vec<&str> = got.iter().map(|l| after_timestamp(l)).collect();
        assert_eq!(
            rest.len(),
            4,
            "{:?}",
            got.iter().map(|l| l.len()).collect::<Vec<_>>()
        );
        assert_eq!(
            rest[0],
            "  WARN hooks.json: rejected (2 error(s)) hook=\"lint\" runs=3\n"
        );
        // The 64 KiB record came in one piece too (a shorter datagram would be a second write).
        assert!(
            rest[1]
                == format!(" ERROR {big} error=reading hooks.json error.sources=[disk on fire]\n"),
            "{} bytes: {:?}…",
            rest[1].len(),
            &rest[1][..40]
        );
        assert_eq!(rest[2], "  INFO done type=Some(1) ok=true\n");
        assert_eq!(rest[3], " DEBUG no fields\n");
    }

    #[test]
    fn levels_above_the_maximum_and_spans_are_not_logged() {
        let (rx, tx) = UnixDatagram::pair().unwrap();
        let log = StderrLog::to_fd(tx.as_raw_fd()).max_level(LevelFilter::WARN);
        tracing::subscriber::with_default(log, || {
            let span = tracing::warn_span!("a span", n = 1);
            let _in = span.enter();
            tracing::info!("not this");
            tracing::warn!("this");
        });
        let got = datagrams(&rx);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(after_timestamp(&got[0]), "  WARN this\n");
    }

    #[test]
    fn colours_paint_what_tracing_subscriber_paints_and_messages_cannot_drive_the_terminal() {
        let (rx, tx) = UnixDatagram::pair().unwrap();
        let log = StderrLog::to_fd(tx.as_raw_fd()).ansi(true);
        tracing::subscriber::with_default(log, || {
            tracing::warn!(file = "hooks.json", "bad \x1b[2J\x07 name \u{9b}");
        });
        let got = datagrams(&rx);
        assert_eq!(got.len(), 1, "{got:?}");
        let line = got[0].strip_prefix("\x1b[2m").unwrap();
        assert_eq!(
            &line[27..],
            "\x1b[0m \x1b[33m WARN\x1b[0m bad \\x1b[2J\\x07 name \\u{9b} \
             \x1b[3mfile\x1b[0m\x1b[2m=\x1b[0m\"hooks.json\"\n"
        );
    }

    /// The format is tracing-subscriber's default without the target (the CLI's, and the
    /// Python package's before it logged through this), plain and in colour, timestamps aside.
    #[cfg(feature = "cli")]
    #[test]
    fn the_format_is_tracing_subscribers_default_without_the_target() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        fn events() {
            let err = Outer(std::io::Error::other("gone \x1b[1m"));
            let lone = std::io::Error::other("alone");
            tracing::warn!(a = 1, b = "two", c = ?[3], "m {}", 4);
            tracing::error!(e = &err as &dyn std::error::Error, "failed");
            tracing::error!(r#e = &lone as &dyn std::error::Error);
            tracing::info!(x = 1.5, "tab\there \x1b[31m \u{9b}");
            tracing::debug!(y = -2, z = 3u64, "");
            tracing::trace!(r#loop = false, "{:?}", "quoted");
        }
        for ansi in [false, true] {
            let buf = Buf::default();
            let theirs = tracing_subscriber::fmt()
                .with_writer({
                    let buf = buf.clone();
                    move || buf.clone()
                })
                .with_ansi(ansi)
                .with_target(false)
                .with_max_level(tracing::Level::TRACE)
                .finish();
            tracing::subscriber::with_default(theirs, events);
            let theirs = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            let (rx, tx) = UnixDatagram::pair().unwrap();
            tracing::subscriber::with_default(StderrLog::to_fd(tx.as_raw_fd()).ansi(ansi), events);
            let ours = datagrams(&rx);
            assert_eq!(ours.len(), 6);
            let strip = |l: &str| {
                let dim = if ansi { "\x1b[2m" } else { "" };
                after_timestamp(l.strip_prefix(dim).unwrap()).to_string()
            };
            let ours: Vec<String> = ours.iter().map(|l| strip(l)).collect();
            let theirs: Vec<String> = theirs.split_inclusive('\n').map(strip).collect();
            assert_eq!(ours, theirs, "ansi: {ansi}");
        }
    }

    #[test]
    fn a_failed_write_drops_the_record() {
        // No descriptor: EBADF, nothing panics, nothing loops.
        tracing::subscriber::with_default(StderrLog::to_fd(-1), || tracing::error!("lost"));
        write_whole(-1, b"lost\n");
    }

    #[test]
    fn timestamps_are_utc_with_microseconds() {
        let at = |secs: u64, micros: u32| {
            let mut s = String::new();
            push_timestamp(
                &mut s,
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros.into()),
            );
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_825_599, 7), "2000-02-29T11:59:59.000007Z");
        assert_eq!(at(1_709_251_199, 999_999), "2024-02-29T23:59:59.999999Z");
        assert_eq!(at(4_102_444_800, 0), "2100-01-01T00:00:00.000000Z");
        let mut s = String::new();
        push_timestamp(&mut s, UNIX_EPOCH - Duration::from_secs(1));
        assert_eq!(s, "1970-01-01T00:00:00.000000Z");
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors we then own.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh descriptors, owned once each.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    fn queued(fd: RawFd) -> i32 {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD stores an int.
        unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        n
    }

    /// The property the module exists for: a thread in the middle of writing a record when
    /// another thread forks leaves nothing held that the child's own records wait for. Here the
    /// thread is stuck in its write (a pipe nobody reads), the worst case of "in the middle";
    /// with std's `Stderr` the child's log line would wait for that thread's lock forever.
    #[test]
    fn a_child_forked_while_another_thread_is_inside_a_write_still_logs() {
        let (r, w) = pipe();
        let dispatch = tracing::Dispatch::new(StderrLog::to_fd(w.as_raw_fd()));
        fn child_line() {
            tracing::warn!("from the child");
        }
        // The child's callsite registered here, before the fork (registration takes
        // tracing-core's dispatcher list lock, which other tests' `with_default` take too).
        tracing::dispatcher::with_default(&dispatch, child_line);
        let mut drain = vec![0u8; 1 << 20];
        // SAFETY: reading that line into our buffer from our pipe.
        assert!(unsafe { libc::read(r.as_raw_fd(), drain.as_mut_ptr().cast(), drain.len()) } > 0);
        let big = "y".repeat(1 << 20);
        let writer = {
            let dispatch = dispatch.clone();
            let big = big.clone();
            std::thread::spawn(move || {
                tracing::dispatcher::with_default(&dispatch, || tracing::warn!("{big}"))
            })
        };
        // SAFETY: F_GETPIPE_SZ returns the pipe's capacity.
        let capacity = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while queued(r.as_raw_fd()) < capacity {
            assert!(
                Instant::now() < deadline,
                "the writer never filled the pipe"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The writer is inside its write(2), blocked on the full pipe.
        let (sink_r, sink_w) = pipe();
        // SAFETY: the child only redirects the log's descriptor, logs and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: dup2 onto the log's descriptor, then _exit: nothing of the parent's
            // state is unwound in the child.
            unsafe {
                libc::dup2(sink_w.as_raw_fd(), w.as_raw_fd());
                tracing::dispatcher::with_default(&dispatch, child_line);
                libc::_exit(0);
            }
        }
        assert!(pid > 0);
        drop(sink_w);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut status = 0;
        let done = loop {
            // SAFETY: waiting for our own child.
            let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if got == pid {
                break true;
            }
            if Instant::now() > deadline {
                // SAFETY: our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break false;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut line = vec![0u8; 4096];
        // SAFETY: reading into our buffer from our pipe (the child has exited).
        let n = unsafe { libc::read(sink_r.as_raw_fd(), line.as_mut_ptr().cast(), line.len()) };
        // Let the parent's writer finish before asserting (it holds the pipe's other end).
        let mut total = 0usize;
        while total < big.len() {
            // SAFETY: as above.
            let n = unsafe { libc::read(r.as_raw_fd(), drain.as_mut_ptr().cast(), drain.len()) };
            assert!(n > 0);
            total += n as usize;
        }
        writer.join().unwrap();
        assert!(done, "the child's log line waited for the parent's writer");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let line = String::from_utf8_lossy(&line[..n.max(0) as usize]).into_owned();
        assert_eq!(after_timestamp(&line), "  WARN from the child\n");
    }

    #[test]
    fn civil_dates_round_the_leap_years() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(47_540), (2100, 2, 28));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
    }
}
