//! Plugin log lines, bounded: what guests write with `prx:host/log` and to stdout/stderr, and
//! the host's warnings about their calls.
//!
//! A guest must not be able to flood the log, nor to stop its executor by filling a pipe: every
//! line goes through [`PluginLog::line`], which never blocks. Per plugin, a token bucket lets
//! [`BURST`] lines through at once and [`RATE`] lines a second after that; each line is cut at
//! [`MAX_LINE`] bytes (and control characters escaped, so a line stays one line). Lines go
//! through a bounded queue ([`QUEUE`]) to the sink's logger thread ("prx-hooks-plugin-log"),
//! which writes them with `tracing`; when that thread is slow (stderr is a full pipe nobody
//! reads), the queue fills and lines are dropped, not waited for. Every dropped line is counted
//! (`log_dropped` in the plugin's stats) and the logger says once per burst how many were lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lines a plugin may log at once.
pub(super) const BURST: f64 = 200.0;
/// Lines per second after a burst.
pub(super) const RATE: f64 = 50.0;
/// Longest line kept, in bytes (the rest is cut and counted in the line).
pub(super) const MAX_LINE: usize = 4096;
/// Lines waiting for the logger thread, all plugins together.
pub(super) const QUEUE: usize = 4096;

/// Severity of a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

enum Entry {
    Line {
        plugin: Arc<str>,
        stream: &'static str,
        level: Level,
        text: String,
    },
    Dropped {
        plugin: Arc<str>,
        lines: u64,
    },
    /// Sent by [`Logger::shutdown`]: the thread looks at its stop flag (it blocks otherwise).
    Wake,
}

/// The sink's logger: a bounded queue and the thread that empties it.
pub(super) struct Logger {
    tx: flume::Sender<Entry>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How often an idle logger thread looks at its stop flag without being woken (a safety net:
/// [`Logger::shutdown`] wakes it).
const IDLE_CHECK: Duration = Duration::from_secs(1);

impl Logger {
    pub(super) fn start() -> std::io::Result<Logger> {
        let (tx, rx) = flume::bounded(QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prx-hooks-plugin-log".into())
            .spawn(move || {
                // Blocks until a line comes (idle, it costs nothing); `shutdown` sets the flag
                // and sends a Wake, and the queue drains before the flag is looked at.
                loop {
                    match rx.recv_timeout(IDLE_CHECK) {
                        Ok(Entry::Wake) | Err(flume::RecvTimeoutError::Timeout) => {
                            if s.load(Ordering::Acquire) && rx.is_empty() {
                                return;
                            }
                        }
                        Ok(e) => {
                            write(e);
                            // Stopping with the queue drained (a Wake refused by a full queue).
                            if s.load(Ordering::Acquire) && rx.is_empty() {
                                return;
                            }
                        }
                        Err(flume::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Logger {
            tx,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// A plugin's handle on this logger.
    pub(super) fn plugin(&self, name: Arc<str>) -> PluginLog {
        PluginLog {
            plugin: name,
            tx: self.tx.clone(),
            bucket: Mutex::new(Bucket {
                tokens: BURST,
                at: Instant::now(),
                dropped_since: 0,
            }),
            dropped: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Writes what is queued until `deadline`, then stops the thread. A thread still blocked
    /// in a write at the deadline (stderr is a pipe nobody reads) is left to finish that
    /// write on its own: a thread cannot be stopped inside write(2), and waiting would break
    /// the shutdown deadline.
    pub(super) fn shutdown(&self, deadline: Instant) {
        self.stop.store(true, Ordering::Release);
        // A full queue means the thread is busy writing and looks at the flag when it drains.
        let _ = self.tx.try_send(Entry::Wake);
        let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            tracing::debug!("the plugin logger is blocked writing; left to finish on its own");
        }
    }
}

fn write(e: Entry) {
    match e {
        Entry::Wake => {}
        Entry::Line {
            plugin,
            stream,
            level,
            text,
        } => {
            let plugin = &*plugin;
            match level {
                Level::Trace => {
                    tracing::trace!(target: "prx_hooks::plugin", plugin, stream, "{text}")
                }
                Level::Debug => {
                    tracing::debug!(target: "prx_hooks::plugin", plugin, stream, "{text}")
                }
                Level::Info => {
                    tracing::info!(target: "prx_hooks::plugin", plugin, stream, "{text}")
                }
                Level::Warn => {
                    tracing::warn!(target: "prx_hooks::plugin", plugin, stream, "{text}")
                }
                Level::Error => {
                    tracing::error!(target: "prx_hooks::plugin", plugin, stream, "{text}")
                }
            }
        }
        Entry::Dropped { plugin, lines } => tracing::warn!(
            target: "prx_hooks::plugin",
            plugin = &*plugin,
            "{lines} log line(s) dropped (more than {RATE} a second after a burst of {BURST}, \
             or the log output is blocked)"
        ),
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
    /// Lines dropped since the last line that got through.
    dropped_since: u64,
}

/// One plugin's rate-limited way into the logger. Shared by the plugin's versions.
pub(super) struct PluginLog {
    plugin: Arc<str>,
    tx: flume::Sender<Entry>,
    bucket: Mutex<Bucket>,
    dropped: Arc<AtomicU64>,
}

impl PluginLog {
    /// Lines dropped so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Logs one line (cut at [`MAX_LINE`], made one line) unless over the rate or the queue
    /// is full; never blocks.
    pub(super) fn line(&self, level: Level, stream: &'static str, text: &[u8]) {
        let lost = {
            let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * RATE).min(BURST);
            b.at = now;
            if b.tokens < 1.0 {
                b.dropped_since += 1;
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            b.tokens -= 1.0;
            std::mem::take(&mut b.dropped_since)
        };
        if lost > 0 {
            let _ = self.tx.try_send(Entry::Dropped {
                plugin: self.plugin.clone(),
                lines: lost,
            });
        }
        let entry = Entry::Line {
            plugin: self.plugin.clone(),
            stream,
            level,
            text: clean(text),
        };
        if self.tx.try_send(entry).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dropped_since += 1;
        }
    }
}

/// At most [`MAX_LINE`] bytes of `text` as one printable line.
fn clean(text: &[u8]) -> String {
    let cut = text.len().saturating_sub(MAX_LINE);
    let text = String::from_utf8_lossy(&text[..text.len().min(MAX_LINE)]);
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.trim_end_matches(['\r', '\n']).chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    if cut > 0 {
        out.push_str(&format!("… ({cut} more bytes cut)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_and_kept_on_one_line() {
        assert_eq!(clean(b"a\nb\x07c\r\n"), "a\\nb\\u0007c");
        let long = vec![b'x'; MAX_LINE + 10];
        assert!(clean(&long).ends_with("… (10 more bytes cut)"));
    }

    #[test]
    fn a_flood_is_limited_to_the_burst_and_counted() {
        let logger = Logger::start().unwrap();
        let log = logger.plugin("p".into());
        for _ in 0..10_000 {
            log.line(Level::Info, "log", b"x");
        }
        let dropped = log.dropped();
        // The burst passes (plus what refilled meanwhile); the rest is counted.
        assert!(
            (10_000 - 2 * BURST as u64..10_000).contains(&dropped),
            "{dropped}"
        );
        logger.shutdown(Instant::now() + Duration::from_secs(5));
    }
}
