//! [`Seen`]: the ids of ingested events that ran, remembered so that an event sent again runs
//! once (ARCHITECTURE.md § Ingest, "Event ids").
//!
//! An agent-facing sender gives each event an id when it first sends it (`prx-hooks send`: a
//! random one, kept in the spool entry should the delivery fail). Once every sink the event was
//! handed to has settled it ([`crate::settle`]) and it ran, its id is remembered here; a line
//! that comes back with an id already remembered is not emitted again but counted as a
//! duplicate. That is what makes a delivery whose answer was lost (the server queued it, the
//! sender timed out and spooled it) run once, and a spool replay that stops part way safe to
//! repeat.
//!
//! * **Bounded.** Ids are kept as 128-bit hashes in two generations of at most [`HALF`] each:
//!   the newest `HALF` to `2 × HALF` ids are remembered, in about 4 MiB.
//! * **On disk**, when the hook system has a workspace: each generation is a file of 16-byte
//!   records in `<workspace>/.prx-hooks/` (`seen-ids-<n>`, mode 0600, never followed through
//!   a link), appended to as ids are remembered (one `write(2)` each, no `fsync`: a process
//!   killed with SIGKILL keeps them, a machine that loses power may lose the last ones), and
//!   read back when the next hook system of the workspace starts — so ids remembered before a
//!   restart still count at the replay that follows it.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ids per generation.
pub(crate) const HALF: usize = 65_536;

/// File names: this prefix, then the generation number.
const PREFIX: &str = "seen-ids-";

/// The longest event id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Why an event id is refused: what it must look like.
pub(crate) fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(format!(
            "an event id has 1 to {MAX_ID_BYTES} bytes, not {}",
            id.len()
        ));
    }
    match id
        .bytes()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')))
    {
        Some(i) => Err(format!(
            "an event id has only letters, digits and . _ : - (byte {} is not one)",
            i + 1
        )),
        None => Ok(()),
    }
}

/// The ids of ingested events that ran (module docs).
#[derive(Debug)]
pub(crate) struct Seen {
    inner: Mutex<Inner>,
    /// Lines not emitted because their id was remembered.
    duplicates: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    current: HashSet<u128>,
    previous: HashSet<u128>,
    /// `<workspace>/.prx-hooks`, when remembering on disk.
    dir: Option<PathBuf>,
    generation: u64,
    /// The current generation's file, appended to.
    file: Option<File>,
}

/// FNV-1a over 128 bits: stable across builds and processes (the files outlive both).
fn hash(id: &str) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;
    id.bytes()
        .fold(OFFSET, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

impl Seen {
    /// Remembers in memory only.
    pub(crate) fn in_memory() -> Seen {
        Seen::with(Inner {
            current: HashSet::new(),
            previous: HashSet::new(),
            dir: None,
            generation: 0,
            file: None,
        })
    }

    /// Remembers in `<workspace>/.prx-hooks/` too, reading back what an earlier hook system
    /// remembered there. A directory that cannot be used is said once and memory is used.
    pub(crate) fn in_workspace(workspace: &Path) -> Seen {
        let dir = workspace.join(".prx-hooks");
        match Inner::open(&dir) {
            Ok(inner) => Seen::with(inner),
            Err(e) => {
                tracing::warn!(
                    "{}: {e}; event ids are remembered in memory only (an event sent again \
                     after a restart may run twice)",
                    dir.display()
                );
                Seen::in_memory()
            }
        }
    }

    fn with(inner: Inner) -> Seen {
        Seen {
            inner: Mutex::new(inner),
            duplicates: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` ran already.
    pub(crate) fn contains(&self, id: &str) -> bool {
        let h = hash(id);
        let inner = self.lock();
        inner.current.contains(&h) || inner.previous.contains(&h)
    }

    /// Remembers that `id` ran.
    pub(crate) fn record(&self, id: &str) {
        let h = hash(id);
        let mut inner = self.lock();
        if inner.current.contains(&h) || inner.previous.contains(&h) {
            return;
        }
        if inner.current.len() >= HALF {
            inner.rotate();
        }
        inner.current.insert(h);
        inner.append(h);
    }

    /// Counts a line not emitted because its id ran already.
    pub(crate) fn count_duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    /// Lines not emitted because their id ran already, and ids remembered now.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let inner = self.lock();
        (
            self.duplicates.load(Ordering::Relaxed),
            (inner.current.len() + inner.previous.len()) as u64,
        )
    }

    /// The counters for `Stats` (section [`STATS_SECTION`]).
    pub(crate) fn stats(&self) -> EventIdStats {
        let (duplicates, remembered) = self.counts();
        EventIdStats {
            duplicates,
            remembered,
            on_disk: self.lock().dir.is_some(),
        }
    }
}

/// The stats section of event ids: `stats.event_ids()`, section `"event_ids"`.
pub const STATS_SECTION: &str = "event_ids";

/// What event ids did ([`LineOrigin`](super::LineOrigin)): lines not emitted because their
/// event ran already, and how many ids are remembered.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EventIdStats {
    /// Lines not emitted again because their id belongs to an event that ran already.
    pub duplicates: u64,
    /// Ids remembered now (at most 131,072).
    pub remembered: u64,
    /// Whether they are remembered on disk (in the workspace), so they outlive a restart.
    pub on_disk: bool,
}

impl crate::Stats {
    /// The event ids' counters (always present).
    pub fn event_ids(&self) -> Option<&EventIdStats> {
        self.section(STATS_SECTION)
    }
}

impl Inner {
    fn open(dir: &Path) -> std::io::Result<Inner> {
        let mut gens: Vec<u64> = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    if let Some(n) = name.strip_prefix(PREFIX).and_then(|n| n.parse().ok()) {
                        gens.push(n);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        gens.sort_unstable();
        // Only the two newest generations count; older ones are left over from a crash.
        while gens.len() > 2 {
            let old = gens.remove(0);
            let _ = std::fs::remove_file(dir.join(format!("{PREFIX}{old}")));
        }
        let mut inner = Inner {
            current: HashSet::new(),
            previous: HashSet::new(),
            dir: Some(dir.to_path_buf()),
            generation: gens.last().copied().unwrap_or(0),
            file: None,
        };
        if let [previous, _] = gens[..] {
            inner.previous = read_generation(&dir.join(format!("{PREFIX}{previous}")))?;
        }
        if let Some(&current) = gens.last() {
            inner.current = read_generation(&dir.join(format!("{PREFIX}{current}")))?;
        }
        Ok(inner)
    }

    /// The current generation is full: it becomes the previous one, and a new file starts.
    fn rotate(&mut self) {
        self.previous = std::mem::take(&mut self.current);
        self.file = None;
        self.generation += 1;
        if let Some(dir) = &self.dir
            && let Some(old) = self.generation.checked_sub(2)
        {
            let _ = std::fs::remove_file(dir.join(format!("{PREFIX}{old}")));
        }
    }

    fn append(&mut self, h: u128) {
        let Some(dir) = &self.dir else { return };
        if self.file.is_none() {
            match open_append(dir, self.generation) {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    tracing::warn!(
                        "{}: cannot remember event ids there: {e}; they are remembered in \
                         memory only (an event sent again after a restart may run twice)",
                        dir.display()
                    );
                    self.dir = None;
                    return;
                }
            }
        }
        if let Some(f) = &mut self.file
            && let Err(e) = f.write_all(&h.to_le_bytes())
        {
            tracing::warn!(
                "{}: cannot remember event ids there: {e}; they are remembered in memory only",
                dir.display()
            );
            self.dir = None;
            self.file = None;
        }
    }
}

fn open_append(dir: &Path, generation: u64) -> std::io::Result<File> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(dir.join(format!("{PREFIX}{generation}")))
}

use std::os::unix::fs::DirBuilderExt;

/// The hashes of one generation's file (a torn last record, from a crash mid-write, is left
/// out).
fn read_generation(path: &Path) -> std::io::Result<HashSet<u128>> {
    let mut bytes = Vec::new();
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => {
            if !f.metadata()?.is_file() {
                return Err(std::io::Error::other(format!(
                    "{}: not a regular file",
                    path.display()
                )));
            }
            f.take((2 * HALF * 16) as u64).read_to_end(&mut bytes)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(bytes
        .chunks_exact(16)
        .map(|c| u128::from_le_bytes(c.try_into().unwrap_or([0; 16])))
        .collect())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(check_id("0f3a-1").is_ok());
        assert!(check_id("spool:00000000000000000001-0000000042.spool-3").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id(&"a".repeat(129)).is_err());
        assert_eq!(
            check_id("a b").unwrap_err(),
            "an event id has only letters, digits and . _ : - (byte 2 is not one)"
        );
    }

    #[test]
    fn what_ran_is_remembered_across_a_restart_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let seen = Seen::in_workspace(dir.path());
        assert!(!seen.contains("a"));
        seen.record("a");
        seen.record("a");
        assert!(seen.contains("a"));
        drop(seen);
        let again = Seen::in_workspace(dir.path());
        assert!(again.contains("a"), "read back from the file");
        assert!(!again.contains("b"));
        // Two generations: after 2 × HALF more ids, "a" is forgotten, and at most two files
        // are left.
        for i in 0..2 * HALF {
            again.record(&format!("id-{i}"));
        }
        assert!(!again.contains("a"));
        assert!(again.contains(&format!("id-{}", 2 * HALF - 1)));
        let files = std::fs::read_dir(dir.path().join(".prx-hooks"))
            .unwrap()
            .count();
        assert_eq!(files, 2);
        let (_, remembered) = again.counts();
        assert!(remembered as usize <= 2 * HALF);
        drop(again);
        let third = Seen::in_workspace(dir.path());
        assert!(third.contains(&format!("id-{}", 2 * HALF - 1)));
        assert!(third.contains(&format!("id-{}", HALF)));
    }

    #[test]
    fn a_torn_last_record_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let seen = Seen::in_workspace(dir.path());
        seen.record("x");
        drop(seen);
        let path = dir.path().join(".prx-hooks").join(format!("{PREFIX}0"));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(&[1, 2, 3]).unwrap();
        let seen = Seen::in_workspace(dir.path());
        assert!(seen.contains("x"));
        assert_eq!(seen.counts().1, 1);
    }
}
