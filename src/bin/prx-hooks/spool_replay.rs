//! `run`'s replay of the spool at start: every entry `send` kept, oldest first, into the
//! pipeline, each removed only once every event in it ran (docs/ingest.md § The spool).
//!
//! * **Once.** Every spooled event carries the id `send` gave it when it first tried to
//!   deliver it (an entry an older `send` wrote: `spool:<entry name>`). The hook system
//!   remembers the ids of events that ran, on disk ([`prx_hooks::ingest::LineOrigin`]), so an
//!   event that a server took although `send` never heard its answer, or one of an entry a
//!   replay stopped in the middle of, is not run again: it is counted as a duplicate.
//! * **Nothing lost.** Entries are fed a chunk at a time (waiting for room, like a file
//!   replay); then the replay waits until the hooks have settled every event of the chunk
//!   and removes the entries whose events all ran (or needed nothing: skipped, duplicates,
//!   lines that are not events — said once with the entry's name and line). An entry one of
//!   whose events was dropped (a full hook queue, shutdown) or not emitted stays for the next
//!   `run`.
//! * **Stoppable.** SIGINT/SIGTERM stop the replay at once: what is being waited for is left
//!   in the spool, and `run` drains as usual.

use crate::spool::{Header, Route, Spool, SpoolStats, read_entry, sync_dir};
use prx_hooks::Hooks;
use prx_hooks::ingest::{IngestOptions, IngestReport, LineIngest, LineOrigin, OnSettled};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Entries fed before the replay waits for their events to settle.
const CHUNK_FILES: usize = 256;
const CHUNK_BYTES: u64 = 8 << 20;
/// How often the replay looks at what has settled.
const SETTLE_POLL: Duration = Duration::from_millis(2);

/// What one replay did.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// Entries whose events were fed.
    pub(crate) entries: u64,
    /// Of those, removed: every event in it ran or needed nothing.
    pub(crate) removed: u64,
    /// Entries left for the next `run`: stopped before them, or an event in them did not run.
    pub(crate) kept: u64,
    pub(crate) report: IngestReport,
    /// The counts `stats.json` held (reset by the replay).
    pub(crate) stats: SpoolStats,
    /// Entries that could not be read (each said as a warning, then removed).
    pub(crate) unreadable: u64,
    /// Entries that could not be removed (each said; their events ran, so a later replay
    /// counts them as duplicates).
    pub(crate) unremovable: u64,
    /// The replay was stopped by a signal.
    pub(crate) stopped: bool,
}

/// One entry's events: how many have not settled, and whether one did not run.
#[derive(Default)]
struct Tracker {
    pending: AtomicUsize,
    failed: AtomicBool,
}

impl Tracker {
    /// The call one more of this entry's events reports through.
    fn settled(self: &Arc<Self>) -> OnSettled {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let t = self.clone();
        Box::new(move |done| {
            if !done {
                t.failed.store(true, Ordering::Release);
            }
            t.pending.fetch_sub(1, Ordering::AcqRel);
        })
    }
}

/// Replays every entry into `hooks` (module docs). `None`: there is no spool.
pub(crate) fn replay(
    spool: &Spool,
    hooks: &Hooks,
    stop: &AtomicBool,
) -> std::io::Result<Option<Replayed>> {
    match spool.prepare(false) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(e) => return Err(std::io::Error::other(e.to_string())),
    }
    // Another `run` replaying this spool holds the lock as long as its replay lasts.
    let lock = loop {
        if stop.load(Ordering::Acquire) {
            return Ok(Some(Replayed {
                stopped: true,
                ..Replayed::default()
            }));
        }
        if let Some(lock) = spool.try_lock(Duration::from_millis(100))? {
            break lock;
        }
    };
    let mut done = Replayed {
        stats: spool.read_stats(),
        ..Replayed::default()
    };
    let (tmps, _) = spool.remove_stale_tmps();
    done.stats.tmp_removed += tmps;
    spool.write_stats(&SpoolStats::default())?;
    let entries = spool.entries()?;
    // One ingest for the whole replay, so that it paces across entries (one line each, most
    // of them); each entry's lines are numbered from 1 in its warnings.
    let opts = IngestOptions::default().wait_for_room(true);
    let mut lines = LineIngest::new(hooks, opts).stop_on(stop);
    let mut next = 0;
    for chunk in chunks(&entries) {
        if stop.load(Ordering::Acquire) {
            break;
        }
        next += replay_chunk(spool, &mut lines, stop, chunk, &mut done);
        sync_dir(spool.dir())?;
    }
    done.report = lines.into_report();
    done.kept += (entries.len() - next.min(entries.len())) as u64;
    done.stopped = stop.load(Ordering::Acquire);
    drop(lock);
    Ok(Some(done))
}

/// Feeds one chunk, waits for its events to settle, removes the entries that are done;
/// returns how many entries it went through (fed or found unreadable).
fn replay_chunk(
    spool: &Spool,
    lines: &mut LineIngest<'_>,
    stop: &AtomicBool,
    chunk: &[(String, u64)],
    done: &mut Replayed,
) -> usize {
    let mut fed: Vec<(&str, Arc<Tracker>)> = Vec::with_capacity(chunk.len());
    let mut went = 0;
    for (name, _) in chunk {
        if stop.load(Ordering::Acquire) {
            break;
        }
        went += 1;
        let path = spool.dir().join(name);
        match read_entry(&path) {
            Ok((header, body)) => {
                let tracker = Arc::new(Tracker::default());
                feed(lines, name, &header, &body, &tracker);
                done.entries += 1;
                fed.push((name, tracker));
            }
            Err(e) => {
                tracing::warn!("spool: {e}; the entry is removed unread");
                done.unreadable += 1;
                remove(&path, done);
            }
        }
    }
    // Every event of the chunk settled, or a signal: what is still out stays in the spool.
    while fed
        .iter()
        .any(|(_, t)| t.pending.load(Ordering::Acquire) > 0)
        && !stop.load(Ordering::Acquire)
    {
        std::thread::sleep(SETTLE_POLL);
    }
    for (name, t) in fed {
        let settled = t.pending.load(Ordering::Acquire) == 0;
        if settled && !t.failed.load(Ordering::Acquire) {
            done.removed += 1;
            remove(&spool.dir().join(name), done);
        } else {
            done.kept += 1;
        }
    }
    went
}

fn remove(path: &Path, done: &mut Replayed) {
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(
            "spool: cannot remove {}: {e}; its events are not run again by a later replay",
            path.display()
        );
        done.unremovable += 1;
    }
}

fn chunks(entries: &[(String, u64)]) -> Vec<&[(String, u64)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, (_, len)) in entries.iter().enumerate() {
        if i > start && (i - start >= CHUNK_FILES || bytes + len > CHUNK_BYTES) {
            out.push(&entries[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < entries.len() {
        out.push(&entries[start..]);
    }
    out
}

/// One entry's events into the pipeline, numbered from line 1 of the entry's body; its
/// refusals are said with the entry's name and line.
fn feed(
    lines: &mut LineIngest<'_>,
    name: &str,
    header: &Header,
    body: &[u8],
    tracker: &Arc<Tracker>,
) {
    let fallback = format!("spool:{name}");
    let id = header.id.as_deref().unwrap_or(&fallback);
    let mut origin = LineOrigin::default().id(id);
    if let Some(t) = &header.time {
        origin = origin.time(t);
    }
    let before = lines.report().errors.len();
    let more_before = lines.report().more_errors;
    match &header.route {
        Route::Events => lines.feed_from(body, origin, || Some(tracker.settled())),
        Route::Ingest {
            from,
            agent,
            session,
        } => {
            let opts = prx_hooks::agents::TranslateOptions {
                agent: agent.clone(),
                session: session.clone(),
            };
            match prx_hooks::agents::Agent::from_name(from)
                .ok_or_else(|| format!("unknown agent {from:?}"))
                .and_then(|a| {
                    prx_hooks::agents::translate(a, body, &opts).map_err(|e| e.to_string())
                }) {
                Ok(t) => {
                    // The entry's id on the first line, `<id>-<n>` on the others.
                    lines.translated_from(&t, origin, || Some(tracker.settled()));
                }
                Err(e) => {
                    lines.refuse(1, 1, &e);
                }
            }
        }
    }
    let report = lines.report();
    for e in &report.errors[before..] {
        tracing::warn!(
            "spool/{name}:{}:{}: {}; the event was not replayed",
            e.line,
            e.column,
            e.message
        );
    }
    let unsaid = report.more_errors - more_before;
    if unsaid > 0 {
        tracing::warn!("spool/{name}: {unsaid} more line(s) that are not events were not replayed");
    }
}

/// `run`'s replay at start: every spooled entry into `hooks`, what happened said on stderr
/// (once) and returned for the final report (`"spool"`). Nothing when there is no spool.
pub(crate) fn replay_at_start(
    hooks: &Hooks,
    workspace: &Path,
    stop: &AtomicBool,
) -> Option<serde_json::Value> {
    let spool = Spool::new(workspace);
    let done = match replay(&spool, hooks, stop) {
        Ok(Some(done)) => done,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(
                "spool: {e}; the replay stopped there, and what it had not removed stays"
            );
            return Some(serde_json::json!({ "error": e.to_string() }));
        }
    };
    say(&spool, &done);
    let r = &done.report;
    Some(serde_json::json!({
        "entries": done.entries,
        "removed": done.removed,
        "kept": done.kept,
        "unreadable": done.unreadable,
        "unremovable": done.unremovable,
        "stopped": done.stopped,
        "queued": r.queued,
        "skipped": r.skipped,
        "dropped": r.dropped,
        "refused": r.refused,
        "duplicates": r.duplicates,
        "not_replayed": r.stopped,
        "errors": r.errors.len() as u64 + r.more_errors,
        "dropped_while_full": done.stats.dropped,
        "dropped_bytes": done.stats.dropped_bytes,
        "bad_input": done.stats.bad_input,
        "lost": done.stats.lost,
        "tmp_removed": done.stats.tmp_removed,
    }))
}

/// What the replay did, on stderr.
fn say(spool: &Spool, done: &Replayed) {
    let r = &done.report;
    let errors = r.errors.len() as u64 + r.more_errors;
    let plural = |n: u64| if n == 1 { "y" } else { "ies" };
    if done.entries > 0 || done.kept > 0 || done.stats != SpoolStats::default() {
        tracing::info!(
            "spool: replayed {} entr{} from {}: {} queued, {} already run (duplicates), {} skipped, {} dropped, {} refused, {errors} not events; {} removed, {} kept for the next run",
            done.entries,
            plural(done.entries),
            spool.dir().display(),
            r.queued,
            r.duplicates,
            r.skipped,
            r.dropped,
            r.refused,
            done.removed,
            done.kept,
        );
    }
    if done.stopped {
        tracing::warn!(
            "spool: the replay was stopped by a signal; {} entr{} stay in the spool for the next run",
            done.kept,
            plural(done.kept)
        );
    }
    let s = &done.stats;
    if s.dropped > 0 {
        tracing::warn!(
            "spool: {} entr{} ({} bytes) were dropped, oldest first, while the spool was full",
            s.dropped,
            plural(s.dropped),
            s.dropped_bytes
        );
    }
    if s.bad_input > 0 {
        tracing::warn!(
            "spool: `prx-hooks send` refused {} input(s) that were not events (each said on its stderr)",
            s.bad_input
        );
    }
    if s.lost > 0 {
        tracing::warn!(
            "spool: `prx-hooks send` could neither deliver nor keep {} event(s) (each said on its stderr: a full disk, a file size limit)",
            s.lost
        );
    }
    if s.tmp_removed > 0 {
        tracing::info!(
            "spool: removed {} temporary file(s) left by senders that died mid-write",
            s.tmp_removed
        );
    }
}
