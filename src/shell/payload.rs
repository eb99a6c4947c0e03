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
//! ours whose lock can be taken (their host died — `kill -9`, a crash) are removed; only exact
//! names of ours (`prx-hooks-` and 16 hex digits) are considered. Where `RENAME_NOREPLACE` is
//! missing the directory is made by `mkdir` and the locked `.lock` moved in; a directory deleted
//! under a live host is made again on the next payload. ARCHITECTURE.md § Containment.

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

    /// Writes `json` to a new 0600 file in the directory (created on first use, and again if
    /// it was deleted under us — a /tmp cleaner, `rm -rf /tmp/*` — rather than failing every
    /// later hook).
    fn write(&self, json: &[u8]) -> std::io::Result<PathBuf> {
        let mut gone = None;
        let (path, mut f) = loop {
            let dir = {
                let mut state = super::lock(&self.state);
                let recreate = match &*state {
                    DirState::Unused => true,
                    DirState::Open { path, .. } => gone.as_ref() == Some(path),
                    DirState::Closed => {
                        return Err(std::io::Error::other("the shell backend has shut down"));
                    }
                };
                if recreate {
                    if let Some(old) = &gone {
                        tracing::warn!(
                            dir = %old.display(),
                            "the payload directory was deleted while in use: creating a new one"
                        );
                    }
                    let (path, lock) = create_private(&self.tmp)?;
                    *state = DirState::Open { path, _lock: lock };
                }
                match &*state {
                    DirState::Open { path, .. } => path.clone(),
                    _ => unreachable!("just set"),
                }
            };
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{n}.json"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&path)
            {
                Ok(f) => break (path, f),
                // The directory is gone: once (a second ENOENT in a fresh one is an error).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && gone.is_none() => {
                    gone = Some(dir);
                }
                Err(e) => return Err(e),
            }
        };
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
            match rename_noreplace(&new, &path) {
                Ok(()) => Ok(lock),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(nix::libc::EINVAL | nix::libc::ENOSYS)
                    ) =>
                {
                    // No RENAME_NOREPLACE here (NFS, some FUSE file systems, old kernels):
                    // make the final directory with mkdir (which never reuses one) and move the
                    // locked `.lock` into it — a flock follows the open file across a rename.
                    // Until the move the directory has no `.lock`, and such a directory is only
                    // taken for stale once old (UNLOCKED_STALE_AFTER).
                    std::fs::DirBuilder::new().mode(0o700).create(&path)?;
                    let moved =
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                            .and_then(|()| std::fs::rename(new.join(".lock"), path.join(".lock")));
                    if let Err(e) = moved {
                        let _ = std::fs::remove_dir_all(&path);
                        return Err(e);
                    }
                    let _ = std::fs::remove_dir(&new);
                    Ok(lock)
                }
                Err(e) => Err(e),
            }
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

/// Removes `prx-hooks-<16 hex>` directories in `tmp` that are ours (exact name, owner, 0700,
/// not a symlink) and whose host is gone: their `.lock` can be taken, or there is none and they
/// are old (and `.prx-hooks-new-<16 hex>` ones a host died setting up, once old). Every sink does this when it is
/// created.
pub(crate) fn remove_stale(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(setting_up) = name.to_str().and_then(our_name) else {
            continue;
        };
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

/// `Some(false)` for `prx-hooks-<16 lowercase hex>` (a payload directory), `Some(true)` for
/// `.prx-hooks-new-<16 lowercase hex>` (one being set up), `None` for anything else — a user's
/// own `prx-hooks-build` included, which start-up cleaning must never touch.
fn our_name(name: &str) -> Option<bool> {
    let (setting_up, id) = match name.strip_prefix(NEW_PREFIX) {
        Some(id) => (true, id),
        None => (false, name.strip_prefix(DIR_PREFIX)?),
    };
    let hex = id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    hex.then_some(setting_up)
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
    /// An event consumed from NATS: its ticket, held until the last hook process of the event
    /// was reaped (dropped after the payload file is removed; `crate::settle`).
    hold: Option<crate::settle::Hold>,
}

/// The per-event `ZERO_HOOK_*` values, formatted once.
pub(crate) struct Strings {
    pub(crate) seq: String,
    pub(crate) timestamp: String,
    pub(crate) agent: String,
    pub(crate) session: String,
    /// An event consumed from NATS: its agent's `Prx-Timestamp` and `Prx-Seq`.
    pub(crate) origin_timestamp: Option<String>,
    pub(crate) origin_seq: Option<String>,
    /// Its id, JetStream delivery count and reclaim mark (`Message::event_id`, …).
    pub(crate) event_id: Option<String>,
    pub(crate) delivery: Option<String>,
    pub(crate) reclaimed: bool,
}

impl EventRun {
    pub(crate) fn new(
        msg: Message,
        base_env: Arc<[(OsString, OsString)]>,
        dir: Arc<PayloadDir>,
    ) -> EventRun {
        EventRun {
            hold: msg.hold(),
            msg,
            base_env,
            dir,
            file: OnceLock::new(),
            strings: OnceLock::new(),
        }
    }

    /// Its hooks will not run (shutdown): a consumed event is then not acked.
    pub(crate) fn mark_dropped(&self) {
        if let Some(t) = &self.hold {
            t.mark_dropped();
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
            origin_timestamp: self
                .msg
                .origin_timestamp()
                .map(|t| env_safe(t).into_owned()),
            origin_seq: self.msg.origin_seq().map(|n| n.to_string()),
            event_id: self.msg.event_id().map(|t| env_safe(t).into_owned()),
            delivery: self.msg.delivery().map(|n| n.to_string()),
            reclaimed: self.msg.reclaimed(),
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
        relay: 0,
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

    /// Sets a directory's modification time `ago` in the past.
    fn age(path: &Path, ago: Duration) {
        let f = File::open(path).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn stale_cleanup_touches_only_our_exact_names() {
        let tmp = tempfile::tempdir().unwrap();
        let two_hours = Duration::from_secs(7200);
        // A user's own directories that merely start like ours: 0700, old, no lock or an
        // unlocked one. None of them may go.
        let mut theirs = Vec::new();
        for (name, with_lock) in [
            ("prx-hooks-build", false),
            ("prx-hooks-build-locked", true),
            ("prx-hooks-0123456789abcdeg", false),
            ("prx-hooks-0123456789ABCDEF", false),
            ("prx-hooks-0123456789abcdef0", true),
            ("prx-hooks-0123456789abcde", true),
            (".prx-hooks-new-build", false),
            (".prx-hooks-new-0123456789abcdef.bak", false),
        ] {
            let d = tmp.path().join(name);
            std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
            std::fs::write(d.join("keep"), "x").unwrap();
            if with_lock {
                std::fs::write(d.join(".lock"), "").unwrap();
            }
            age(&d, two_hours);
            theirs.push(d);
        }
        // Ours, stale: an unlocked one, an old one without a lock, an old half set-up one.
        let mut ours = Vec::new();
        for (name, with_lock) in [
            ("prx-hooks-00112233aabbccdd", true),
            ("prx-hooks-a0b1c2d3e4f5a6b7", false),
            (".prx-hooks-new-ffeeddccbbaa9988", false),
        ] {
            let d = tmp.path().join(name);
            std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
            if with_lock {
                std::fs::write(d.join(".lock"), "").unwrap();
            }
            age(&d, two_hours);
            ours.push(d);
        }
        remove_stale(tmp.path());
        for d in &theirs {
            assert!(d.join("keep").exists(), "{} was removed", d.display());
        }
        for d in &ours {
            assert!(!d.exists(), "{} was kept", d.display());
        }
    }

    /// Makes renameat2(2) fail with EINVAL in the calling thread only (as on NFS or a FUSE
    /// file system without RENAME_NOREPLACE): a seccomp filter, which applies to the thread
    /// that installs it.
    fn refuse_renameat2_in_this_thread() {
        use nix::libc;
        let stmt = |code: u32, k: u32| libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let mut prog = [
            // seccomp_data.nr is at offset 0.
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
            libc::sock_filter {
                code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
                jt: 0,
                jf: 1,
                k: libc::SYS_renameat2 as u32,
            },
            stmt(
                libc::BPF_RET | libc::BPF_K,
                libc::SECCOMP_RET_ERRNO | libc::EINVAL as u32,
            ),
            stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        ];
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: prctl(2) with a filter program that outlives the call (the kernel copies it).
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog
                ),
                0,
                "{}",
                std::io::Error::last_os_error()
            );
        }
        let e =
            rename_noreplace(Path::new("/nonexistent-a"), Path::new("/nonexistent-b")).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EINVAL),
            "the filter is in place"
        );
    }

    #[test]
    fn without_rename_noreplace_the_directory_is_still_private_and_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        std::thread::spawn(move || {
            refuse_renameat2_in_this_thread();
            let dir = PayloadDir::new(root.clone());
            let file = dir.write(b"{}").unwrap();
            let path = dir.path().unwrap();
            assert_eq!(file.parent(), Some(path.as_path()));
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(our_name(name) == Some(false), "{name}");
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
            // Its lock is held (a start-up cleanup keeps it), and nothing half set up is left.
            remove_stale(&root);
            assert!(file.exists());
            let left: Vec<_> = std::fs::read_dir(&root)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, [path.file_name().unwrap()]);
            dir.close();
            assert!(!path.exists());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_directory_deleted_under_a_live_host_is_recreated() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = PayloadDir::new(tmp.path().to_path_buf());
        dir.write(b"{}").unwrap();
        let first = dir.path().unwrap();
        // A /tmp cleaner (or `rm -rf /tmp/*`) removes it.
        std::fs::remove_dir_all(&first).unwrap();
        let file = dir.write(b"{\"n\":1}").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"{\"n\":1}");
        let second = dir.path().unwrap();
        assert_eq!(file.parent(), Some(second.as_path()));
        let mode = std::fs::metadata(&second).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // Its lock is held again: a start-up cleanup keeps it.
        remove_stale(tmp.path());
        assert!(file.exists());
        dir.close();
        assert!(!second.exists());
    }
}
