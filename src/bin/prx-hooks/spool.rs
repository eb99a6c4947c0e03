//! The spool: events `prx-hooks send` could not deliver, kept until `run` replays them.
//!
//! They are kept in `<workspace>/.prx-hooks/spool/` until `prx-hooks run` starts there.
//!
//! * **Private.** The directory is made with mode 0700 and must be owned by this user and
//!   closed to others (so nobody else can add, swap or read entries); files are created 0600
//!   with `O_EXCL | O_NOFOLLOW`.
//! * **Bounded.** At most `max_files` entries and `max_bytes` bytes: a new entry first makes
//!   room by removing the oldest ones, each counted in `stats.json` (`dropped`,
//!   `dropped_bytes`); input `send` refused (not JSON, too large) is counted there too
//!   (`bad_input`). Every change happens under an exclusive lock on `.lock`.
//! * **Written whole.** An entry is written to a temporary name, fsynced, then renamed to
//!   `<nanoseconds>-<pid>-<n>.spool`: the names sort in the order the entries were made, and
//!   a crash leaves no partial entry under a final name.
//! * **Replayed once.** `run` takes the lock, reads a chunk of entries in name order, removes
//!   them and fsyncs the directory, and only then emits their events (waiting for room, like a
//!   file replay): a crash mid-replay can lose the chunk it was emitting, never replay one
//!   twice (at most once, like every event in the ring).
//!
//! An entry is one header line, then the body as `send` would have posted it:
//! `{"route":"events"}` + NDJSON lines, or `{"route":"ingest","from":"claude-code",
//! "agent":…,"session":…}` + the agent's own payload.

use prx_hooks::Hooks;
use prx_hooks::ingest::{IngestOptions, IngestReport, LineIngest};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// `<workspace>/` + this.
pub(crate) const SPOOL_DIR: &str = ".prx-hooks/spool";
/// Default bound on the spool's bytes: 64 MiB.
pub(crate) const MAX_BYTES: u64 = 64 << 20;
/// Default bound on the spool's entries.
pub(crate) const MAX_FILES: usize = 10_000;
/// Entries read, removed and fsynced together before their events are emitted.
const CHUNK_FILES: usize = 256;
const CHUNK_BYTES: u64 = 8 << 20;
const SUFFIX: &str = ".spool";
/// How long `send` waits for the spool's lock (held briefly by another `send`, or by a `run`
/// replaying into a full ring for as long as that takes): the agent waits for `send`.
const ADD_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Where an entry's body goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "route", rename_all = "lowercase")]
pub(crate) enum Route {
    /// NDJSON lines in the `run --events` format (`POST /api/events`).
    Events,
    /// One payload of an agent's own hook (`POST /api/ingest/{from}`).
    Ingest {
        from: String,
        agent: Option<String>,
        session: Option<String>,
    },
}

/// What the spool counted while no `run` read it (`stats.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpoolStats {
    /// Entries removed to make room for newer ones.
    pub dropped: u64,
    pub dropped_bytes: u64,
    /// Inputs `send` refused before anything could be delivered (not JSON, too large).
    pub bad_input: u64,
}

/// What one replay did.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    pub entries: u64,
    pub report: IngestReport,
    /// The counts `stats.json` held (reset by the replay).
    pub stats: SpoolStats,
    /// Entries that could not be read (each said as a warning).
    pub unreadable: u64,
}

/// The spool of one workspace.
pub(crate) struct Spool {
    dir: PathBuf,
}

fn err(path: &Path, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{}: {what}", path.display()))
}

impl Spool {
    pub(crate) fn new(workspace: &Path) -> Spool {
        Spool {
            dir: workspace.join(SPOOL_DIR),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the directory (and `.prx-hooks`) 0700 if missing, checks both are this user's
    /// and closed to others, and locks it: `create` (what `send` does) waits at most
    /// [`ADD_LOCK_WAIT`] for the lock, the replay as long as it takes.
    fn open_locked(&self, create: bool) -> std::io::Result<Option<std::fs::File>> {
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(|e| err(&self.dir, format!("cannot create the spool: {e}")))?;
        }
        for dir in [self.dir.parent().unwrap_or(Path::new(".")), &self.dir] {
            let meta = match std::fs::symlink_metadata(dir) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
                Err(e) => return Err(err(dir, e)),
            };
            // SAFETY: geteuid(2) has no preconditions and cannot fail.
            let me = unsafe { nix::libc::geteuid() };
            if !meta.is_dir() {
                return Err(err(
                    dir,
                    "is not a directory (a symbolic link is never followed)",
                ));
            }
            if meta.uid() != me {
                return Err(err(
                    dir,
                    format!("is owned by uid {}, not by this user", meta.uid()),
                ));
            }
            if meta.permissions().mode() & 0o022 != 0 {
                return Err(err(
                    dir,
                    format!(
                        "is writable by others (mode {:04o}); run `chmod 700 {}`",
                        meta.permissions().mode() & 0o7777,
                        dir.display()
                    ),
                ));
            }
        }
        let lock = self.dir.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&lock)
            .map_err(|e| err(&lock, e))?;
        if !create {
            file.lock().map_err(|e| err(&lock, e))?;
            return Ok(Some(file));
        }
        let deadline = std::time::Instant::now() + ADD_LOCK_WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Some(file)),
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(err(
                        &lock,
                        format!("held by another process for over {ADD_LOCK_WAIT:?}"),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(err(&lock, e)),
            }
        }
    }

    /// The entries, oldest first, with their sizes.
    fn entries(&self) -> std::io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| err(&self.dir, e))? {
            let entry = entry.map_err(|e| err(&self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(SUFFIX) && !name.starts_with('.') {
                let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
                out.push((name, len));
            }
        }
        out.sort();
        Ok(out)
    }

    fn read_stats(&self) -> SpoolStats {
        std::fs::read(self.dir.join("stats.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn write_stats(&self, stats: &SpoolStats) -> std::io::Result<()> {
        let path = self.dir.join("stats.json");
        if *stats == SpoolStats::default() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(&path, e)),
                _ => Ok(()),
            };
        }
        let text = serde_json::to_vec(stats).unwrap_or_default();
        self.write_new(".stats.tmp", &text)?;
        std::fs::rename(self.dir.join(".stats.tmp"), &path).map_err(|e| err(&path, e))
    }

    /// Writes `bytes` to a new file `name` in the spool (0600, O_EXCL, fsynced).
    fn write_new(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let path = self.dir.join(name);
        let _ = std::fs::remove_file(&path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| err(&path, e))?;
        f.write_all(bytes).map_err(|e| err(&path, e))?;
        f.sync_all().map_err(|e| err(&path, e))
    }

    /// Keeps `body` for the next `run`, removing the oldest entries first when the spool would
    /// hold more than `max_files` entries or `max_bytes` bytes (counted). An entry larger than
    /// `max_bytes` on its own is refused.
    pub(crate) fn add(
        &self,
        route: &Route,
        body: &[u8],
        max_files: usize,
        max_bytes: u64,
    ) -> std::io::Result<PathBuf> {
        let _lock = self.open_locked(true)?;
        let mut entry = serde_json::to_vec(route).unwrap_or_default();
        entry.push(b'\n');
        entry.extend_from_slice(body);
        if entry.len() as u64 > max_bytes {
            return Err(err(
                &self.dir,
                format!(
                    "an entry of {} bytes does not fit in the spool's {max_bytes} bytes",
                    entry.len()
                ),
            ));
        }
        let mut entries = self.entries()?;
        let mut total: u64 = entries.iter().map(|(_, n)| n).sum();
        let mut stats = self.read_stats();
        let mut oldest = entries.drain(..).collect::<std::collections::VecDeque<_>>();
        while oldest.len() >= max_files.max(1) || total + entry.len() as u64 > max_bytes {
            let Some((name, len)) = oldest.pop_front() else {
                break;
            };
            if std::fs::remove_file(self.dir.join(&name)).is_ok() {
                stats.dropped += 1;
                stats.dropped_bytes += len;
            }
            total -= len;
        }
        // Later than every entry made before (the lock orders writers; a clock that steps
        // back does not reorder them).
        let last = oldest.back().map_or(0, |(n, _)| stamp(n));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            .max(last + 1);
        let pid = std::process::id();
        let tmp = format!(".{now}-{pid}.tmp");
        self.write_new(&tmp, &entry)?;
        let name = format!("{now:020}-{pid:010}{SUFFIX}");
        let path = self.dir.join(&name);
        std::fs::rename(self.dir.join(&tmp), &path).map_err(|e| err(&path, e))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| err(&self.dir, e))?;
        if stats != self.read_stats() {
            self.write_stats(&stats)?;
        }
        Ok(path)
    }

    /// Counts one input `send` refused (best effort: the spool may not be writable).
    pub(crate) fn count_bad_input(&self) {
        if let Ok(Some(_lock)) = self.open_locked(true) {
            let mut stats = self.read_stats();
            stats.bad_input += 1;
            let _ = self.write_stats(&stats);
        }
    }

    /// Replays every entry into `hooks`, oldest first, and empties the spool (see the module
    /// docs for why nothing is replayed twice). `None`: there is no spool.
    pub(crate) fn replay(&self, hooks: &Hooks) -> std::io::Result<Option<Replayed>> {
        let Some(_lock) = self.open_locked(false)? else {
            return Ok(None);
        };
        let mut done = Replayed {
            stats: self.read_stats(),
            ..Replayed::default()
        };
        self.write_stats(&SpoolStats::default())?;
        let mut lines = LineIngest::new(hooks, IngestOptions::default().wait_for_room(true));
        let entries = self.entries()?;
        for chunk in chunks(&entries) {
            let mut bodies = Vec::with_capacity(chunk.len());
            for (name, _) in chunk {
                let path = self.dir.join(name);
                match read_entry(&path) {
                    Ok(entry) => bodies.push((name.clone(), entry)),
                    Err(e) => {
                        tracing::warn!("spool: {e}; the entry is removed unread");
                        done.unreadable += 1;
                    }
                }
                std::fs::remove_file(&path).map_err(|e| err(&path, e))?;
            }
            std::fs::File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| err(&self.dir, e))?;
            for (name, (route, body)) in bodies {
                done.entries += 1;
                feed(&mut lines, &name, &route, &body);
            }
        }
        done.report = lines.into_report();
        Ok(Some(done))
    }
}

/// The time part of an entry's name.
fn stamp(name: &str) -> u128 {
    name.split('-')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
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

fn read_entry(path: &Path) -> std::io::Result<(Route, Vec<u8>)> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| err(path, e))?;
    let meta = file.metadata().map_err(|e| err(path, e))?;
    if !meta.is_file() {
        return Err(err(path, "is not a regular file"));
    }
    let mut bytes = Vec::new();
    (&mut file)
        .take(MAX_BYTES.max(meta.len()))
        .read_to_end(&mut bytes)
        .map_err(|e| err(path, e))?;
    let (head, body) = match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => (&bytes[..i], bytes[i + 1..].to_vec()),
        None => (&bytes[..], Vec::new()),
    };
    let route = serde_json::from_slice(head)
        .map_err(|e| err(path, format!("line 1: not a spool header: {e}")))?;
    Ok((route, body))
}

/// One entry's events into the ingest; its refusals are said with the entry's name.
fn feed(lines: &mut LineIngest<'_>, name: &str, route: &Route, body: &[u8]) {
    let before = lines.report().errors.len();
    match route {
        Route::Events => lines.feed(body),
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
                    lines.set_lenient(t.lenient);
                    lines.line(1, t.line.as_bytes());
                    lines.set_lenient(false);
                }
                Err(e) => {
                    lines.refuse(1, 1, &e);
                }
            }
        }
    }
    for e in &lines.report().errors[before..] {
        tracing::warn!(
            "spool/{name}:{}:{}: {}; the event was not replayed",
            e.line,
            e.column,
            e.message
        );
    }
}

/// `run`'s replay at start: every spooled entry into `hooks`, what happened said on stderr
/// (once) and returned for the final report (`"spool"`). Nothing when there is no spool.
pub(crate) fn replay_at_start(hooks: &Hooks, workspace: &Path) -> Option<serde_json::Value> {
    let spool = Spool::new(workspace);
    let done = match spool.replay(hooks) {
        Ok(Some(done)) => done,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!("spool: {e}; nothing was replayed");
            return Some(serde_json::json!({ "error": e.to_string() }));
        }
    };
    let r = &done.report;
    let errors = r.errors.len() as u64 + r.more_errors;
    if done.entries > 0 || done.stats != SpoolStats::default() {
        tracing::info!(
            "spool: replayed {} entr{} from {}: {} queued, {} skipped, {} dropped, {} refused, {errors} not events",
            done.entries,
            if done.entries == 1 { "y" } else { "ies" },
            spool.dir().display(),
            r.queued,
            r.skipped,
            r.dropped,
            r.refused,
        );
    }
    if done.stats.dropped > 0 {
        tracing::warn!(
            "spool: {} entr{} ({} bytes) were dropped, oldest first, while the spool was full",
            done.stats.dropped,
            if done.stats.dropped == 1 { "y" } else { "ies" },
            done.stats.dropped_bytes
        );
    }
    if done.stats.bad_input > 0 {
        tracing::warn!(
            "spool: `prx-hooks send` refused {} input(s) that were not events (each said on its stderr)",
            done.stats.bad_input
        );
    }
    Some(serde_json::json!({
        "entries": done.entries,
        "unreadable": done.unreadable,
        "queued": r.queued,
        "skipped": r.skipped,
        "dropped": r.dropped,
        "refused": r.refused,
        "errors": errors,
        "dropped_while_full": done.stats.dropped,
        "dropped_bytes": done.stats.dropped_bytes,
        "bad_input": done.stats.bad_input,
    }))
}
