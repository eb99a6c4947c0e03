//! The spool: events `prx-hooks send` could not deliver, kept until `run` replays them
//! (`spool_replay.rs`; docs/ingest.md § The spool).
//!
//! They are kept in `<workspace>/.prx-hooks/spool/`:
//!
//! * **Private.** `.prx-hooks` and `spool` are made with mode 0700, one level at a time (the
//!   workspace must exist), and must be real directories — never links — owned by this user
//!   and closed to others, checked before anything is made inside them; files are created 0600
//!   with `O_EXCL | O_NOFOLLOW`.
//! * **Written whole, without waiting for anyone.** An entry is written to a temporary name,
//!   fsynced, then renamed to `<nanoseconds>-<pid>.spool` and the directory fsynced: the names
//!   sort in the order the entries were made (by the clock), and a crash leaves no partial
//!   entry under a final name. No lock is taken to write one, so a sender never loses its
//!   event to another sender or to a replay.
//! * **Bounded.** After writing, a sender that gets the lock on `.lock` at once trims: the
//!   oldest entries go first until at most `max_files` entries and `max_bytes` bytes are left,
//!   each counted in `stats.json` (`dropped`, `dropped_bytes`), and temporary files left by a
//!   sender that crashed or ran out of space (`.<nanoseconds>-<pid>.tmp` of a process that is
//!   gone, or older than [`STALE_TMP`]) are removed and counted (`tmp_removed`). A sender that
//!   does not get the lock leaves the trimming to the next one, so the bounds can be passed by
//!   the entries of senders writing at the same moment, and while a replay holds the lock.
//! * **Counted.** Input `send` refused (not JSON, too large) is counted (`bad_input`), and so
//!   is an event it could not keep (`lost`: the disk was full, the file too large).
//!
//! An entry is one header line, then the body as `send` would have posted it:
//! `{"route":"events","id":…,"time":…}` + NDJSON lines, or `{"route":"ingest","from":
//! "claude-code","agent":…,"session":…,"id":…,"time":…}` + the agent's own payload. `id` is the
//! id `send` gave the event(s) when it first tried to deliver them, `time` when that was.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `<workspace>/` + this.
pub(crate) const SPOOL_DIR: &str = ".prx-hooks/spool";
/// Default bound on the spool's bytes: 64 MiB.
pub(crate) const MAX_BYTES: u64 = 64 << 20;
/// Default bound on the spool's entries.
pub(crate) const MAX_FILES: usize = 10_000;
pub(crate) const SUFFIX: &str = ".spool";
/// A temporary file older than this is left over from a sender that died, whatever its pid.
pub(crate) const STALE_TMP: Duration = Duration::from_secs(600);
/// How long counting waits for the lock (the event itself never waits for it).
const COUNT_LOCK_WAIT: Duration = Duration::from_secs(1);

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

/// An entry's first line: its route, and the id and time its events were first sent with
/// (absent in entries an older `send` wrote).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    #[serde(flatten)]
    pub(crate) route: Route,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) time: Option<String>,
}

/// What the spool counted while no `run` read it (`stats.json`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpoolStats {
    /// Entries removed to make room for newer ones.
    #[serde(default)]
    pub(crate) dropped: u64,
    #[serde(default)]
    pub(crate) dropped_bytes: u64,
    /// Inputs `send` refused before anything could be delivered (not JSON, too large).
    #[serde(default)]
    pub(crate) bad_input: u64,
    /// Events `send` could neither deliver nor keep (the disk full, the file too large).
    #[serde(default)]
    pub(crate) lost: u64,
    /// Temporary files of senders that died mid-write, removed.
    #[serde(default)]
    pub(crate) tmp_removed: u64,
}

/// Why an entry could not be kept.
#[derive(Debug)]
pub(crate) enum SpoolError {
    /// The workspace does not exist: nothing is made for it.
    NoWorkspace(PathBuf),
    Io(std::io::Error),
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolError::NoWorkspace(ws) => write!(
                f,
                "the workspace {} does not exist (give --workspace the directory `prx-hooks \
                 run` serves)",
                ws.display()
            ),
            SpoolError::Io(e) => e.fmt(f),
        }
    }
}

impl From<std::io::Error> for SpoolError {
    fn from(e: std::io::Error) -> SpoolError {
        SpoolError::Io(e)
    }
}

pub(crate) fn err(path: &Path, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{}: {what}", path.display()))
}

/// The spool of one workspace.
pub(crate) struct Spool {
    workspace: PathBuf,
    dir: PathBuf,
}

impl Spool {
    pub(crate) fn new(workspace: &Path) -> Spool {
        Spool {
            workspace: workspace.to_path_buf(),
            dir: workspace.join(SPOOL_DIR),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks `.prx-hooks` and `spool` (module docs: private), making each one 0700 when
    /// `create` and it is missing — one level at a time, after the level above it was
    /// checked, so nothing is ever made through a link. `Ok(false)`: missing and not made.
    pub(crate) fn prepare(&self, create: bool) -> Result<bool, SpoolError> {
        if create && !self.workspace.is_dir() {
            return Err(SpoolError::NoWorkspace(self.workspace.clone()));
        }
        let state = self.dir.parent().unwrap_or(Path::new("."));
        for dir in [state, self.dir.as_path()] {
            match std::fs::symlink_metadata(dir) {
                Ok(meta) => check_private(dir, &meta)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(err(dir, format!("cannot create it: {e}")).into()),
                    }
                    let meta = std::fs::symlink_metadata(dir).map_err(|e| err(dir, e))?;
                    check_private(dir, &meta)?;
                }
                Err(e) => return Err(err(dir, e).into()),
            }
        }
        Ok(true)
    }

    /// The lock file, opened (not locked).
    fn lock_file(&self) -> std::io::Result<std::fs::File> {
        let lock = self.dir.join(".lock");
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&lock)
            .map_err(|e| err(&lock, e))
    }

    /// The lock, if it can be had within `wait` (`None`: someone holds it).
    pub(crate) fn try_lock(&self, wait: Duration) -> std::io::Result<Option<std::fs::File>> {
        let file = self.lock_file()?;
        let deadline = Instant::now() + wait;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Some(file)),
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(e)) => return Err(err(&self.dir, e)),
            }
        }
    }

    /// The entries, oldest first, with their sizes: regular files named `*.spool`. Anything
    /// else under such a name (a directory, a link) is no entry: said, and left alone.
    pub(crate) fn entries(&self) -> std::io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| err(&self.dir, e))? {
            let entry = entry.map_err(|e| err(&self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(SUFFIX) || name.starts_with('.') {
                continue;
            }
            match entry.metadata() {
                Ok(m) if m.is_file() => out.push((name, m.len())),
                Ok(_) => tracing::warn!(
                    "spool: {} is not a regular file: not an entry, left alone",
                    self.dir.join(&name).display()
                ),
                Err(_) => {} // gone meanwhile
            }
        }
        out.sort();
        Ok(out)
    }

    pub(crate) fn read_stats(&self) -> SpoolStats {
        std::fs::read(self.dir.join("stats.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes `stats.json` (removes it when every count is 0). Under the lock.
    pub(crate) fn write_stats(&self, stats: &SpoolStats) -> std::io::Result<()> {
        let path = self.dir.join("stats.json");
        if *stats == SpoolStats::default() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(err(&path, e)),
                _ => Ok(()),
            };
        }
        let text = serde_json::to_vec(stats).unwrap_or_default();
        let tmp = self.dir.join(".stats.tmp");
        let _ = std::fs::remove_file(&tmp);
        write_new(&tmp, &text)?;
        std::fs::rename(&tmp, &path).map_err(|e| err(&path, e))
    }

    /// Keeps `body` for the next `run` (module docs), then trims the spool if the lock is free.
    /// An entry larger than `max_bytes` on its own is refused.
    pub(crate) fn add(
        &self,
        header: &Header,
        body: &[u8],
        max_files: usize,
        max_bytes: u64,
    ) -> Result<PathBuf, SpoolError> {
        self.prepare(true)?;
        let mut entry = serde_json::to_vec(header).unwrap_or_default();
        entry.push(b'\n');
        entry.extend_from_slice(body);
        if entry.len() as u64 > max_bytes {
            return Err(err(
                &self.dir,
                format!(
                    "an entry of {} bytes does not fit in the spool's {max_bytes} bytes",
                    entry.len()
                ),
            )
            .into());
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let pid = std::process::id();
        let tmp = self.dir.join(format!(".{now}-{pid}.tmp"));
        if let Err(e) = write_new(&tmp, &entry) {
            // Out of space, or over the file size limit: nothing half-written is left.
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        let path = self.dir.join(format!("{now:020}-{pid:010}{SUFFIX}"));
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(err(&path, e).into());
        }
        sync_dir(&self.dir)?;
        if let Ok(Some(_lock)) = self.try_lock(Duration::ZERO) {
            self.trim(max_files, max_bytes, &path)?;
        }
        Ok(path)
    }

    /// Under the lock: removes the oldest entries (never `keep`) until the spool is within its
    /// bounds, and the temporary files of senders that are gone; each counted.
    fn trim(&self, max_files: usize, max_bytes: u64, keep: &Path) -> std::io::Result<()> {
        let mut stats = self.read_stats();
        let before = stats;
        let (removed, _) = self.remove_stale_tmps();
        stats.tmp_removed += removed;
        let entries = self.entries()?;
        let mut count = entries.len();
        let mut total: u64 = entries.iter().map(|(_, n)| n).sum();
        for (name, len) in &entries {
            if count <= max_files.max(1) && total <= max_bytes {
                break;
            }
            let path = self.dir.join(name);
            if path == keep {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                stats.dropped += 1;
                stats.dropped_bytes += len;
            }
            count -= 1;
            total -= len;
        }
        if stats != before {
            sync_dir(&self.dir)?;
            self.write_stats(&stats)?;
        }
        Ok(())
    }

    /// Removes the temporary files of senders that died mid-write (module docs); returns how
    /// many and their bytes. Under the lock.
    pub(crate) fn remove_stale_tmps(&self) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = tmp_pid(&name) else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            let age = meta.modified().ok().and_then(|m| m.elapsed().ok());
            if alive(pid) && age.is_none_or(|a| a < STALE_TMP) {
                continue;
            }
            if std::fs::remove_file(entry.path()).is_ok() {
                n += 1;
                bytes += meta.len();
            }
        }
        (n, bytes)
    }

    /// Counts with `f` in `stats.json` (best effort: the spool may not be writable, and the
    /// lock is waited for at most [`COUNT_LOCK_WAIT`]). Whether it was counted.
    pub(crate) fn count(&self, f: impl FnOnce(&mut SpoolStats)) -> bool {
        if !matches!(self.prepare(true), Ok(true)) {
            return false;
        }
        let Ok(Some(_lock)) = self.try_lock(COUNT_LOCK_WAIT) else {
            return false;
        };
        let mut stats = self.read_stats();
        f(&mut stats);
        self.write_stats(&stats).is_ok()
    }
}

/// A directory of the spool's path must be a real directory, this user's, closed to others.
fn check_private(dir: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
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
    Ok(())
}

/// The pid in a sender's temporary file name (`.<nanoseconds>-<pid>.tmp`).
fn tmp_pid(name: &str) -> Option<i32> {
    let stem = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (nanos, pid) = stem.split_once('-')?;
    nanos.parse::<u128>().ok()?;
    pid.parse().ok()
}

/// Whether process `pid` exists (a process of another user counts: EPERM).
fn alive(pid: i32) -> bool {
    use nix::errno::Errno;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e != Errno::ESRCH,
    }
}

/// Writes `bytes` to the new file `path` (0600, O_EXCL, never through a link), fsynced.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| err(path, e))?;
    f.write_all(bytes).map_err(|e| err(path, e))?;
    f.sync_all().map_err(|e| err(path, e))
}

pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err(dir, e))
}

/// An entry's header and body (at most [`MAX_BYTES`] of it, or its size).
pub(crate) fn read_entry(path: &Path) -> std::io::Result<(Header, Vec<u8>)> {
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
    let header = serde_json::from_slice(head)
        .map_err(|e| err(path, format!("line 1: not a spool header: {e}")))?;
    Ok((header, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_old_and_new_entries() {
        let old: Header = serde_json::from_str(r#"{"route":"events"}"#).unwrap();
        assert_eq!((old.route, old.id, old.time), (Route::Events, None, None));
        let new = Header {
            route: Route::Ingest {
                from: "codex".into(),
                agent: None,
                session: Some("s".into()),
            },
            id: Some("ab12".into()),
            time: Some("2026-12-07T10:00:00.000001Z".into()),
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(
            text,
            r#"{"route":"ingest","from":"codex","agent":null,"session":"s","id":"ab12","time":"2026-12-07T10:00:00.000001Z"}"#
        );
        assert_eq!(serde_json::from_str::<Header>(&text).unwrap(), new);
    }

    #[test]
    fn temporary_names_give_their_pid() {
        assert_eq!(tmp_pid(".1733568000000000000-4242.tmp"), Some(4242));
        assert_eq!(tmp_pid(".stats.tmp"), None);
        assert_eq!(tmp_pid("1-2.tmp"), None);
    }
}
