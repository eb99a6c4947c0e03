//! One event as the shell backend holds it: the shared [`Message`], its payload file, and the
//! strings every hook of the event gets in its environment; and the private directory payload
//! files live in.
//!
//! An [`EventRun`] is created by `deliver` (one per event that has at least one hook to run) and
//! shared by that event's jobs through an `Arc`. The payload file is written lazily, by the
//! first of those jobs to be spawned (on the runner thread — never on a pipeline worker), and
//! removed when the last `Arc` goes: after the last of the event's hooks has exited, been
//! killed, or been dropped from its queue at shutdown.
//!
//! Payload files go into a [`PayloadDir`]: `$TMPDIR/prx-hooks-<16 random hex>/`, mode 0700,
//! created by this sink on first use, removed at shutdown. Nobody else can create, replace or
//! read a name in it, so another local user can neither block hooks by planting names (the
//! directory name is unpredictable, and `mkdir` fails rather than reuses) nor read payloads. A
//! `.lock` file in it stays `flock`ed while the directory is in use: at start, directories of
//! ours whose lock can be taken (their host died — `kill -9`, a crash) are removed.

use crate::bus::{Message, Meta};
use crate::event::{Event, EventKind};
use std::borrow::Cow;
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

/// `ZERO_HOOK_PAYLOAD` carries the payload up to this many bytes; above it the variable is unset
/// and `ZERO_HOOK_PAYLOAD_TRUNCATED=1` is set instead.
pub const MAX_ENV_PAYLOAD: usize = 8192;

/// The prefix of payload directories in `$TMPDIR`.
pub(crate) const DIR_PREFIX: &str = "prx-hooks-";

/// The prefix of a payload directory being set up (locked, then renamed to [`DIR_PREFIX`]…):
/// a live host's directory is never seen under [`DIR_PREFIX`] without its lock held.
const NEW_PREFIX: &str = ".prx-hooks-new-";

/// A directory of ours with no `.lock` (its host died between `mkdir` and creating the lock)
/// is taken for stale after this long.
const UNLOCKED_STALE_AFTER: Duration = Duration::from_secs(3600);

/// One sink's private directory for payload files.
pub(crate) struct PayloadDir {
    tmp: PathBuf,
    state: Mutex<DirState>,
    next: AtomicU64,
}

enum DirState {
    /// Not created yet (a sink that never runs a hook creates nothing).
    Unused,
    Open {
        path: PathBuf,
        /// `flock`ed while open; closing it releases the lock.
        _lock: File,
    },
    /// Shut down: no more payload files.
    Closed,
}

impl PayloadDir {
    pub(crate) fn new(tmp: PathBuf) -> PayloadDir {
        PayloadDir {
            tmp,
            state: Mutex::new(DirState::Unused),
            next: AtomicU64::new(0),
        }
    }

    /// Where the directory is created.
    pub(crate) fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// The directory, once created.
    pub(crate) fn path(&self) -> Option<PathBuf> {
        match &*super::lock(&self.state) {
            DirState::Open { path, .. } => Some(path.clone()),
            _ => None,
        }
    }

    /// Writes `json` to a new 0600 file in the directory (created on first use).
    fn write(&self, json: &[u8]) -> std::io::Result<PathBuf> {
        let dir = {
            let mut state = super::lock(&self.state);
            if let DirState::Unused = *state {
                let (path, lock) = create_private(&self.tmp)?;
                *state = DirState::Open { path, _lock: lock };
            }
            match &*state {
                DirState::Open { path, .. } => path.clone(),
                _ => {
                    return Err(std::io::Error::other("the shell backend has shut down"));
                }
            }
        };
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{n}.json"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)?;
        if let Err(e) = f.write_all(json) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(path)
    }

    /// Removes the directory and whatever is still in it; later writes fail. Idempotent.
    pub(crate) fn close(&self) {
        let old = std::mem::replace(&mut *super::lock(&self.state), DirState::Closed);
        if let DirState::Open { path, _lock } = old
            && let Err(e) = std::fs::remove_dir_all(&path)
        {
            tracing::warn!(dir = %path.display(), "could not remove the payload directory: {e}");
        }
    }
}

impl Drop for PayloadDir {
    fn drop(&mut self) {
        self.close();
    }
}

/// `<tmp>/prx-hooks-<random>` (0700; never an existing one) with its `.lock` held: made under a
/// temporary name, locked, then renamed into place without replacing anything.
fn create_private(tmp: &Path) -> std::io::Result<(PathBuf, File)> {
    let mut last = None;
    for _ in 0..16 {
        let name = format!("{:016x}", random_u64()?);
        let new = tmp.join(format!("{NEW_PREFIX}{name}"));
        let path = tmp.join(format!("{DIR_PREFIX}{name}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&new) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        }
        let set_up = || -> std::io::Result<File> {
            // mkdir applied the umask: make sure of 0700 (never wider).
            std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o700))?;
            let lock = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(new.join(".lock"))?;
            // SAFETY: flock on a descriptor we own.
            if unsafe {
                nix::libc::flock(lock.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB)
            } != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            rename_noreplace(&new, &path)?;
            Ok(lock)
        };
        match set_up() {
            Ok(lock) => return Ok((path, lock)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&new);
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    last = Some(e);
                    continue;
                }
                return Err(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free payload directory name")))
}

/// `rename(from, to)` failing with `AlreadyExists` rather than replacing `to`.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(nix::libc::EINVAL))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: renameat2(2) with two valid C strings.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_renameat2,
            nix::libc::AT_FDCWD,
            from.as_ptr(),
            nix::libc::AT_FDCWD,
            to.as_ptr(),
            nix::libc::RENAME_NOREPLACE,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `prx-hooks-*` directories in `tmp` that are ours (owner, 0700, not a symlink) and
/// whose host is gone: their `.lock` can be taken, or there is none and they are old (and
/// `.prx-hooks-new-*` ones a host died setting up, once old). Every sink does this when it is
/// created.
pub(crate) fn remove_stale(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let setting_up = name.starts_with(NEW_PREFIX);
        if !name.starts_with(DIR_PREFIX) && !setting_up {
            continue;
        }
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o777 != 0o700 {
            continue;
        }
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > UNLOCKED_STALE_AFTER);
        let stale = if setting_up {
            old
        } else {
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(path.join(".lock"))
            {
                // SAFETY: flock on a descriptor we own (closed, and so unlocked, right after).
                Ok(f) => unsafe {
                    nix::libc::flock(f.as_raw_fd(), nix::libc::LOCK_EX | nix::libc::LOCK_NB) == 0
                },
                Err(_) => old,
            }
        };
        if stale {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::info!(
                    "removed {}: payload files of a prx-hooks that did not shut down",
                    path.display()
                ),
                Err(e) => tracing::warn!("could not remove stale {}: {e}", path.display()),
            }
        }
    }
}

/// 64 bits from the kernel's random source.
fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom(2) writes at most `b.len()` bytes into `b`.
    let n = unsafe { nix::libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(b))
}

/// One event on its way to its hooks.
pub(crate) struct EventRun {
    pub(crate) msg: Message,
    /// The parent-environment share of the table the event was delivered under.
    pub(crate) base_env: Arc<[(OsString, OsString)]>,
    dir: Arc<PayloadDir>,
    file: OnceLock<Result<PathBuf, String>>,
    strings: OnceLock<Strings>,
}

/// The per-event `ZERO_HOOK_*` values, formatted once.
pub(crate) struct Strings {
    pub(crate) seq: String,
    pub(crate) timestamp: String,
    pub(crate) agent: String,
    pub(crate) session: String,
}

impl EventRun {
    pub(crate) fn new(
        msg: Message,
        base_env: Arc<[(OsString, OsString)]>,
        dir: Arc<PayloadDir>,
    ) -> EventRun {
        EventRun {
            msg,
            base_env,
            dir,
            file: OnceLock::new(),
            strings: OnceLock::new(),
        }
    }

    /// The payload file, written on first use. Its error is remembered: every hook of the event
    /// then fails to spawn with the same reason, and nothing is retried per hook.
    pub(crate) fn payload_file(&self) -> Result<&Path, &str> {
        match self.file.get_or_init(|| {
            self.dir.write(self.msg.json()).map_err(|e| {
                format!(
                    "cannot write the payload file in {}: {e}",
                    self.dir.tmp().display()
                )
            })
        }) {
            Ok(p) => Ok(p),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn strings(&self) -> &Strings {
        self.strings.get_or_init(|| Strings {
            seq: self.msg.seq().to_string(),
            timestamp: self.msg.timestamp_rfc3339(),
            agent: env_safe(self.msg.agent()).into_owned(),
            session: env_safe(self.msg.session()).into_owned(),
        })
    }
}

impl Drop for EventRun {
    fn drop(&mut self) {
        if let Some(Ok(path)) = self.file.get()
            && let Err(e) = std::fs::remove_file(path)
            // Gone with its directory at shutdown.
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %path.display(), "could not remove a hook payload file: {e}");
        }
    }
}

/// A NUL cannot travel in an environment variable (the spawn would fail); agent and session
/// names are free text, so a NUL in them becomes U+FFFD rather than failing every hook.
fn env_safe(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{fffd}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// The `tool` field of a `tool_call` / `tool_call_start` payload (what matchers match).
/// Payloads written by the pipeline start with it, so the common case reads one string without
/// parsing the rest; anything else falls back to a full parse.
pub(crate) fn payload_tool(json: &str) -> Option<Cow<'_, str>> {
    if let Some(rest) = json.strip_prefix("{\"tool\":\"") {
        let end = rest.find(['"', '\\'])?;
        if rest.as_bytes()[end] == b'"' {
            return Some(Cow::Borrowed(&rest[..end]));
        }
        // An escape inside the name: let serde_json decode the string.
        let mut de = serde_json::Deserializer::from_str(&json["{\"tool\":".len()..]);
        return serde::Deserialize::deserialize(&mut de)
            .ok()
            .map(Cow::Owned);
    }
    #[derive(serde::Deserialize)]
    struct Tool {
        tool: String,
    }
    serde_json::from_str::<Tool>(json)
        .ok()
        .map(|t| Cow::Owned(t.tool))
}

/// The [`Message`] a pipeline worker would build for `event`: its payload serialized once by
/// [`Event::write_json`], stamped now. For `prx-hooks fire`, the HTTP test endpoint and tests.
pub fn event_message(event: &Event<'_>, agent: &str, session: &str, seq: u64) -> Message {
    message_from_json(event.kind(), &event.to_json(), agent, session, seq)
}

/// A lifecycle [`Message`] for `kind` carrying `json` as its payload, exactly as given (the
/// caller validates it: `fire --payload` and the HTTP test endpoint accept a user's payload).
pub fn message_from_json(
    kind: EventKind,
    json: &str,
    agent: &str,
    session: &str,
    seq: u64,
) -> Message {
    let meta = Meta {
        kind: Some(kind),
        seq,
        timestamp: SystemTime::now(),
        depth: 0,
    };
    Message::new(json, agent, session, "", meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_from_payloads() {
        let m = |e: Event<'_>| event_message(&e, "a", "s", 0);
        let msg = m(Event::ToolCall {
            tool: "mcp__github__create",
            success: true,
            output: "x",
        });
        assert_eq!(
            payload_tool(msg.json_str()).as_deref(),
            Some("mcp__github__create")
        );
        let msg = m(Event::ToolCallStart {
            tool: "we\"ird\\name",
            arguments: "{}",
        });
        assert_eq!(
            payload_tool(msg.json_str()).as_deref(),
            Some("we\"ird\\name")
        );
        assert_eq!(
            payload_tool(r#"{"other":1,"tool":"late"}"#).as_deref(),
            Some("late")
        );
        assert_eq!(payload_tool(r#"{"other":1}"#), None);
        assert_eq!(payload_tool("{}"), None);
    }

    #[test]
    fn nul_free_env_strings() {
        assert_eq!(env_safe("a\0b"), "a\u{fffd}b");
        assert!(matches!(env_safe("ab"), Cow::Borrowed(_)));
    }

    #[test]
    fn payload_file_lifecycle() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(PayloadDir::new(tmp.path().to_path_buf()));
        let msg = event_message(&Event::TurnComplete, "a", "s", 7);
        let run = EventRun::new(msg, Arc::from(Vec::new()), dir.clone());
        let path = run.payload_file().unwrap().to_path_buf();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let private = path.parent().unwrap();
        assert_eq!(private.parent().unwrap(), tmp.path());
        let mode = std::fs::metadata(private).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(run.payload_file().unwrap(), path, "written once");
        assert_eq!(run.strings().seq, "7");
        drop(run);
        assert!(!path.exists());
        assert!(private.exists(), "kept while the sink lives");
        dir.close();
        assert!(!private.exists());
        let msg = event_message(&Event::TurnComplete, "a", "s", 8);
        let run = EventRun::new(msg, Arc::from(Vec::new()), dir);
        assert!(run.payload_file().is_err(), "closed");
    }

    #[test]
    fn payload_file_error_is_remembered() {
        let msg = event_message(&Event::TurnComplete, "a", "s", 0);
        let dir = Arc::new(PayloadDir::new("/nonexistent/prx-hooks-test".into()));
        let run = EventRun::new(msg, Arc::from(Vec::new()), dir);
        let e = run.payload_file().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/prx-hooks-test"), "{e}");
        assert_eq!(run.payload_file().unwrap_err(), e);
    }

    #[test]
    fn stale_directories_of_dead_hosts_are_removed_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let live = PayloadDir::new(tmp.path().to_path_buf());
        live.write(b"{}").unwrap();
        let live_path = live.path().unwrap();
        // A dead host's: unlocked .lock, a payload file.
        let (dead, lock) = create_private(tmp.path()).unwrap();
        std::fs::write(dead.join("0.json"), "{}").unwrap();
        drop(lock);
        // Someone else's look-alike: not 0700.
        let other = tmp.path().join("prx-hooks-other");
        std::fs::create_dir(&other).unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        remove_stale(tmp.path());
        assert!(!dead.exists());
        assert!(live_path.exists());
        assert!(other.exists());
    }
}
