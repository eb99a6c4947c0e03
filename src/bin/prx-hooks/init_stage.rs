//! How `init` puts a workspace on disk: all or nothing, never through a link, never over anything.
//!
//! docs/cli.md § `init`.
//!
//! * **One init per directory at a time.** `init` holds an exclusive `flock` on the directory
//!   it works in (the target, or the target's nearest existing ancestor) from before it looks
//!   for leftovers until it is done; another `init` there waits for it (up to
//!   [`LOCK_WAIT`], then names the directory). So a staging directory in it that this process
//!   did not make is a dead `init`'s.
//! * **Staged.** Everything is written into a private temporary directory first
//!   (`.prx-hooks-init-<16 hex>`, 0700), every file and directory created relative to a
//!   descriptor this process made (`mkdirat`, `openat` with `O_EXCL | O_NOFOLLOW`), never by a
//!   path someone could swap a link into, and synced to disk.
//! * **Put in place.** When the target directory is missing, the staged directory *is* it
//!   (with any missing parents inside it): one `renameat2(RENAME_NOREPLACE)` makes the whole
//!   workspace appear at once. When the target exists (empty or not: `init .` in a project),
//!   its five entries cannot appear in one step: a marker file says the staging is complete,
//!   then each entry is moved with `RENAME_NOREPLACE` (`hooks.json`, which makes it a
//!   workspace, last). A failure among those moves puts back the moved ones that are still
//!   what was moved.
//! * **After a crash** (SIGKILL, SIGXFSZ, power loss) there is at most the temporary directory
//!   besides nothing or the whole workspace — except between the moves into an existing
//!   directory, where the entries moved so far are there without `hooks.json`. The next `init`
//!   there removes a staging that was not complete, and finishes one whose moves had begun
//!   (still with `RENAME_NOREPLACE`: it never overwrites what appeared meanwhile; if it cannot,
//!   it names what is in the way); the next `init` of another target in the same directory
//!   names it.

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{FileStat, Mode, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A staging directory's name: this, then 16 lowercase hex digits.
pub(super) const PREFIX: &str = ".prx-hooks-init-";
/// In a staging directory whose entries are being moved into the target: it is complete.
const MARKER: &str = ".prx-hooks-init-complete";
/// How long `init` waits for another one working in the same directory.
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(10);
/// The entries of a workspace in the order they are moved into an existing directory: the
/// file that makes it a workspace last.
pub(super) const ENTRIES: [&str; 5] = [
    ".gitignore",
    "README.md",
    "events.ndjson",
    "hooks",
    "hooks.json",
];
/// Deepest directory tree `remove_tree` descends (a staging directory is shallow; this only
/// bounds what a hostile one could make it do).
const MAX_DEPTH: usize = 64;

fn err(what: impl std::fmt::Display, e: Errno) -> std::io::Error {
    std::io::Error::new(
        std::io::Error::from(e).kind(),
        format!("{what}: {}", std::io::Error::from(e)),
    )
}

fn open_dir_at(at: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(
        at,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn same(a: &FileStat, b: &FileStat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

/// The directory `init` works in, open and locked (module docs) for as long as this lives.
pub(super) struct Base {
    dir: std::fs::File,
    /// Its path as the user gave it, for messages.
    shown: std::path::PathBuf,
}

impl Base {
    /// Opens the directory at `path` (following links: it is the user's path) and locks it,
    /// waiting up to [`LOCK_WAIT`] for another `init` working there.
    pub(super) fn lock(path: &Path) -> std::io::Result<Base> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(path.display(), e))?;
        let dir = std::fs::File::from(fd);
        let until = Instant::now() + LOCK_WAIT;
        loop {
            match dir.try_lock() {
                Ok(()) => {
                    return Ok(Base {
                        dir,
                        shown: path.to_path_buf(),
                    });
                }
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(std::io::Error::other(format!(
                        "{}: another prx-hooks init is working in it (or something else holds a lock on it) for over {} s",
                        path.display(),
                        LOCK_WAIT.as_secs()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("{}: locking it: {e}", path.display()),
                    ));
                }
            }
        }
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }
}

/// A staging directory being filled.
pub(super) struct Stage {
    /// The directory it is in (the target, or the target's nearest existing ancestor).
    base: Base,
    name: OsString,
    /// The staging directory.
    root: OwnedFd,
    /// Where the workspace's entries are written: the staging directory itself, or the
    /// innermost of the missing directories made inside it.
    ws: OwnedFd,
    /// `hooks/` once made, and what it was then.
    hooks: Option<(OwnedFd, FileStat)>,
    /// What each top-level entry written was when it was made ([`ENTRIES`]' names).
    made: Vec<(&'static str, FileStat)>,
    /// The mode a plain `mkdir` gives a directory here (0777 less the umask).
    dir_mode: u32,
}

/// The mode `mkdir` gives a new directory in `dir`: a probe made with 0777 (the kernel takes
/// the umask away), read, and removed. The process's umask is never changed: another thread's
/// files keep theirs.
fn mkdir_mode(dir: BorrowedFd<'_>) -> std::io::Result<u32> {
    let probe = OsStr::new(".mode-probe");
    mkdirat(dir, probe, Mode::from_bits_truncate(0o777)).map_err(|e| err("mkdir", e))?;
    let st = fstatat(dir, probe, AtFlags::AT_SYMLINK_NOFOLLOW);
    let _ = unlinkat(dir, probe, UnlinkatFlags::RemoveDir);
    Ok(st.map_err(|e| err("stat", e))?.st_mode & 0o777)
}

impl Stage {
    /// Creates a staging directory in `base`, holding `missing` (the target's components that
    /// do not exist yet, outermost first; the first is the staging directory itself).
    pub(super) fn create(base: Base, missing: &[OsString]) -> std::io::Result<Stage> {
        let name = OsString::from(format!("{PREFIX}{}", random_hex()));
        mkdirat(base.fd(), name.as_os_str(), Mode::from_bits_truncate(0o700)).map_err(|e| {
            err(
                format_args!("creating a temporary directory in {}", base.shown.display()),
                e,
            )
        })?;
        // From here on, dropping the stage removes the temporary directory.
        let root = match open_dir_at(base.fd(), &name) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = unlinkat(base.fd(), name.as_os_str(), UnlinkatFlags::RemoveDir);
                return Err(err("opening the temporary directory", e));
            }
        };
        let ws = match root.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                let _ = unlinkat(base.fd(), name.as_os_str(), UnlinkatFlags::RemoveDir);
                return Err(e);
            }
        };
        let dir_mode = match mkdir_mode(root.as_fd()) {
            Ok(m) => m,
            Err(e) => {
                let _ = unlinkat(base.fd(), name.as_os_str(), UnlinkatFlags::RemoveDir);
                return Err(e);
            }
        };
        let mut stage = Stage {
            base,
            name,
            root,
            ws,
            hooks: None,
            made: Vec::new(),
            dir_mode,
        };
        let st = fstat(stage.root.as_fd()).map_err(|e| err("fstat", e))?;
        if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
            return Err(std::io::Error::other(
                "the temporary directory was replaced while init made it (another user can write the directory)",
            ));
        }
        for component in missing.iter().skip(1) {
            let shown = Path::new(component).display();
            mkdirat(
                stage.ws.as_fd(),
                component.as_os_str(),
                Mode::from_bits_truncate(0o777),
            )
            .map_err(|e| err(&shown, e))?;
            stage.ws = open_dir_at(stage.ws.as_fd(), component).map_err(|e| err(&shown, e))?;
        }
        Ok(stage)
    }

    /// Writes `rel` (a name in the workspace, or `hooks/<name>`) with `text` and `mode`
    /// (`0o755` is kept whatever the umask; other modes are subject to it).
    pub(super) fn write(&mut self, rel: &str, text: &str, mode: u32) -> std::io::Result<()> {
        let (dir, name) = match rel.split_once('/') {
            Some(("hooks", name)) => (self.hooks()?.as_fd(), name),
            Some(_) => {
                return Err(std::io::Error::other(format!(
                    "{rel}: not a workspace file"
                )));
            }
            None => (self.ws.as_fd(), rel),
        };
        let fd = openat(
            dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| err(rel, e))?;
        if mode == 0o755 {
            fchmod(fd.as_fd(), Mode::from_bits_truncate(0o755)).map_err(|e| err(rel, e))?;
        }
        if let Some(entry) = ENTRIES.iter().find(|e| **e == rel) {
            self.made
                .push((entry, fstat(fd.as_fd()).map_err(|e| err(rel, e))?));
        }
        let mut f = std::fs::File::from(fd);
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| std::io::Error::new(e.kind(), format!("{rel}: {e}")))
    }

    /// `hooks/`, made on first use.
    fn hooks(&mut self) -> std::io::Result<&OwnedFd> {
        if self.hooks.is_none() {
            mkdirat(self.ws.as_fd(), "hooks", Mode::from_bits_truncate(0o777))
                .map_err(|e| err("hooks", e))?;
            let fd =
                open_dir_at(self.ws.as_fd(), OsStr::new("hooks")).map_err(|e| err("hooks", e))?;
            let st = fstat(fd.as_fd()).map_err(|e| err("hooks", e))?;
            self.made.push(("hooks", st));
            self.hooks = Some((fd, st));
        }
        Ok(&self.hooks.as_ref().expect("made above").0)
    }

    /// Syncs what was written, then puts it in place: one rename when the target was missing
    /// (`missing[0]` is its outermost missing component), else entry by entry (module docs).
    ///
    /// Before and after, every entry must still be what this process made: one swapped for a
    /// link (or anything else) in the temporary directory was never written through, but must
    /// not become part of the workspace either (`hooks/`'s scripts are what hooks.json runs).
    pub(super) fn commit(mut self, missing: &[OsString]) -> Result<(), Failure> {
        if self.made.len() != ENTRIES.len() {
            return Err(std::io::Error::other("init wrote only part of the workspace").into());
        }
        if let Some((fd, _)) = &self.hooks {
            fsync(fd.as_fd()).map_err(|e| err("hooks", e))?;
        }
        fsync(self.ws.as_fd()).map_err(|e| err("fsync", e))?;
        self.check(self.ws.as_fd(), &ENTRIES)?;
        if let Some(top) = missing.first() {
            // The staging directory becomes the target (or its outermost missing parent): the
            // mode `mkdir` would have given it, instead of the private 0700.
            fchmod(self.root.as_fd(), Mode::from_bits_truncate(self.dir_mode))
                .map_err(|e| err("chmod", e))?;
            fsync(self.root.as_fd()).map_err(|e| err("fsync", e))?;
            renameat2(
                self.base.fd(),
                self.name.as_os_str(),
                self.base.fd(),
                top.as_os_str(),
                RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(|e| err(Path::new(top).display(), e))?;
            if let Err(e) = self.check(self.ws.as_fd(), &ENTRIES) {
                // Swapped between the check and the rename: take it all back (`Drop` removes it).
                let back = renameat2(
                    self.base.fd(),
                    top.as_os_str(),
                    self.base.fd(),
                    self.name.as_os_str(),
                    RenameFlags::RENAME_NOREPLACE,
                );
                return Err(Failure {
                    error: e,
                    left: if back.is_ok() {
                        Vec::new()
                    } else {
                        vec![Path::new(top).display().to_string()]
                    },
                });
            }
            self.name = OsString::new(); // nothing left to remove
            let _ = fsync(self.base.fd());
            return Ok(());
        }
        let marker = openat(
            self.root.as_fd(),
            MARKER,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| err("the staging marker", e))?;
        fsync(marker.as_fd()).map_err(|e| err("fsync", e))?;
        fsync(self.root.as_fd()).map_err(|e| err("fsync", e))?;
        for (i, name) in ENTRIES.iter().enumerate() {
            let moved = renameat2(
                self.root.as_fd(),
                *name,
                self.base.fd(),
                *name,
                RenameFlags::RENAME_NOREPLACE,
            );
            if let Err(e) = moved {
                return Err(self.put_back(&ENTRIES[..i], err(name, e)));
            }
        }
        if let Err(e) = self.check(self.base.fd(), &ENTRIES) {
            return Err(self.put_back(&ENTRIES, e));
        }
        let _ = fsync(self.base.fd());
        let _ = unlinkat(self.root.as_fd(), MARKER, UnlinkatFlags::NoRemoveDir);
        // Empty now, unless something was added to it meanwhile: removed all the same.
        let _ = remove_tree(self.base.fd(), &self.name, 0);
        self.name = OsString::new();
        Ok(())
    }

    /// Every one of `names` in `dir` is the entry this process made.
    fn check(&self, dir: BorrowedFd<'_>, names: &[&'static str]) -> std::io::Result<()> {
        for name in names {
            let ours = self.made.iter().find(|(n, _)| n == name).map(|(_, st)| st);
            let now = fstatat(dir, *name, AtFlags::AT_SYMLINK_NOFOLLOW);
            if !matches!((ours, &now), (Some(was), Ok(now)) if same(was, now)) {
                return Err(std::io::Error::other(format!(
                    "{name} was replaced in the temporary directory while init ran (nothing was written through it)"
                )));
            }
        }
        Ok(())
    }

    /// After a failed move into an existing directory: moves `moved` back into the temporary
    /// directory (then `Drop` removes it), each only if it is still what this process made —
    /// never what someone put at that name meanwhile, which is left and named.
    fn put_back(&self, moved: &[&'static str], error: std::io::Error) -> Failure {
        let mut left = Vec::new();
        for name in moved {
            let back = self.check(self.base.fd(), &[name]).is_ok()
                && renameat2(
                    self.base.fd(),
                    *name,
                    self.root.as_fd(),
                    *name,
                    RenameFlags::RENAME_NOREPLACE,
                )
                .is_ok();
            if !back && fstatat(self.base.fd(), *name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
                left.push(self.base.shown.join(name).display().to_string());
            }
        }
        let _ = fsync(self.base.fd());
        Failure { error, left }
    }
}

/// Why a workspace was not put in place, and what of it could not be taken back.
#[derive(Debug)]
pub(super) struct Failure {
    pub error: std::io::Error,
    /// Paths in the target that are there because of this run (empty: nothing was left).
    pub left: Vec<String>,
}

impl From<std::io::Error> for Failure {
    fn from(error: std::io::Error) -> Failure {
        Failure {
            error,
            left: Vec::new(),
        }
    }
}

/// A staging directory that was not put in place is removed (what was written with it).
impl Drop for Stage {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            let _ = remove_tree(self.base.fd(), &self.name, 0);
        }
    }
}

/// What an interrupted `init` left in `base` (locked: every staging directory in it is a dead
/// `init`'s), dealt with (module docs): staging directories that were not complete are
/// removed; a complete one whose moves had begun is finished when `base` is its target
/// (`finish`), else named.
pub(super) fn recover(base: &Base, base_shown: &Path, finish: bool) -> Result<Recovered, String> {
    let mut done = Recovered::default();
    let names = leftovers(base.fd()).map_err(|e| format!("{}: {e}", base_shown.display()))?;
    for name in names {
        let shown = base_shown.join(&name);
        let Ok(fd) = open_dir_at(base.fd(), &name) else {
            continue; // not a directory: not ours
        };
        let Ok(st) = fstat(fd.as_fd()) else { continue };
        if st.st_uid != nix::unistd::geteuid().as_raw() {
            continue; // not ours to touch
        }
        let complete = fstatat(fd.as_fd(), MARKER, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
        if !complete {
            remove_tree(base.fd(), &name, 0)
                .map_err(|e| format!("removing {}: {e}", shown.display()))?;
            done.notes.push(format!(
                "removed {}, left by an interrupted `prx-hooks init` (nothing of it was in place)",
                shown.display()
            ));
            continue;
        }
        if !finish {
            done.notes.push(format!(
                "{} is what an interrupted `prx-hooks init {}` left: run that again to complete it, or remove it",
                shown.display(),
                base_shown.display()
            ));
            continue;
        }
        for entry in ENTRIES {
            match renameat2(
                fd.as_fd(),
                entry,
                base.fd(),
                entry,
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => {
                    return Err(format!(
                        "an interrupted init left {}: its {entry} cannot be put in place ({}); move {} away or remove {}",
                        shown.display(),
                        std::io::Error::from(e),
                        base_shown.join(entry).display(),
                        shown.display()
                    ));
                }
            }
        }
        let _ = fsync(base.fd());
        let _ = unlinkat(fd.as_fd(), MARKER, UnlinkatFlags::NoRemoveDir);
        let _ = unlinkat(base.fd(), name.as_os_str(), UnlinkatFlags::RemoveDir);
        done.notes.push(format!(
            "completed the workspace an interrupted `prx-hooks init` left in {}",
            base_shown.display()
        ));
        done.completed = true;
    }
    Ok(done)
}

/// What [`recover`] did.
#[derive(Default)]
pub(super) struct Recovered {
    /// One line per leftover dealt with, for the user.
    pub notes: Vec<String>,
    /// A workspace an interrupted `init` of this directory had begun to put in place is now
    /// whole: there is nothing left to do.
    pub completed: bool,
}

/// The names in `base` that are a staging directory's ([`PREFIX`], then 16 lowercase hex).
fn leftovers(base: BorrowedFd<'_>) -> nix::Result<Vec<OsString>> {
    let mut dir = Dir::from_fd(open_dir_at(base, OsStr::new("."))?)?;
    let mut out = Vec::new();
    for entry in dir.iter().flatten() {
        let name = entry.file_name().to_bytes();
        let hex = name.strip_prefix(PREFIX.as_bytes());
        if hex.is_some_and(|h| {
            h.len() == 16 && h.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }) {
            out.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    Ok(out)
}

/// Removes `name` in `at` and everything under it, never following a link (a link is removed,
/// not what it points to). A directory that something adds entries to meanwhile is emptied
/// again, a few rounds.
fn remove_tree(at: BorrowedFd<'_>, name: &OsStr, depth: usize) -> nix::Result<()> {
    match unlinkat(at, name, UnlinkatFlags::NoRemoveDir) {
        Err(Errno::EISDIR) | Err(Errno::EPERM) => {}
        other => return other,
    }
    if depth >= MAX_DEPTH {
        return Err(Errno::ELOOP);
    }
    let fd = open_dir_at(at, name)?;
    for _ in 0..8 {
        let mut dir = Dir::from_fd(open_dir_at(fd.as_fd(), OsStr::new("."))?)?;
        let children: Vec<OsString> = dir
            .iter()
            .flatten()
            .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
            .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
            .collect();
        for child in children {
            match remove_tree(fd.as_fd(), &child, depth + 1) {
                // Gone already (moved away meanwhile): nothing to remove.
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        match unlinkat(at, name, UnlinkatFlags::RemoveDir) {
            Err(Errno::ENOTEMPTY) | Err(Errno::EEXIST) => {}
            other => return other,
        }
    }
    Err(Errno::ENOTEMPTY)
}

/// 16 lowercase hex digits, from std's per-process random hash keys (seeded by the kernel's
/// random source), the pid and the time.
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:016x}", h.finish())
}
