//! Hot reload of `<workspace>/hooks.json` (and, through the same code, of `policies.json`:
//! [`Doc`] is what differs between the two files).
//!
//! [`ConfigWatcher`] watches the workspace DIRECTORY (not the file: editors save by writing a
//! temporary file and renaming it over, and the file may not exist yet), debounces bursts of
//! events, parses and validates the file, and swaps the new table in (`ArcSwap`, lock-free for
//! readers). Debouncing waits `debounce` (50 ms) after the last change, except when inotify
//! says the writer is done — a close after writing, or a rename onto hooks.json — which
//! reloads after 2 ms: a typical save is live in a few milliseconds, well inside the 100 ms
//! target, and a half-written file is still not read while events keep coming. A file that fails validation is reported (`tracing::warn!`, one line per error, a
//! counter, the text in [`ConfigStats::last_error`]) and the last good table stays active. A
//! deleted file means no shell hooks (a warning). A change that leaves the bytes identical to
//! the active table's does nothing.
//!
//! Watching uses inotify (notify's recommended watcher). When that cannot be set up (no
//! inotify, instance or watch limits reached, the workspace missing), or when asked to
//! (`PRX_HOOKS_POLL=1`, [`WatchOptions::poll`]), it polls instead: every `poll_interval` it
//! `stat`s hooks.json and reloads when the device, inode, size, mtime or ctime (nanoseconds)
//! changed. That is one syscall per poll whatever else is in the workspace; notify's own
//! PollWatcher compares whole-second mtimes (two saves within a second look alike) unless it
//! hashes every file of the directory on every poll.
//!
//! **A linked hooks.json** (`hooks.json -> ~/dotfiles/hooks.json`, possibly through several
//! links) is followed: besides the workspace, every directory along the chain of links is
//! watched, and the chain is re-read after every reload, so re-pointing a link moves the
//! watches to the new target. A directory of the chain that cannot be watched makes the
//! watcher poll the file's signature as well (the same `stat` as above).
//!
//! **Reading never blocks**: the file is opened with `O_NONBLOCK` and the opened descriptor
//! checked (regular file, size cap) before anything is read ([`read_hooks_file`]), so a FIFO
//! or device swapped in for hooks.json is refused at once and can neither wedge this thread
//! nor, through it, SIGHUP reloads and shutdown (which joins this thread).
//!
//! Everything runs on one thread per watcher ("prx-hooks-config"); dropping the watcher stops
//! and joins it.

use super::error::ConfigErrors;
use super::load::{HOOKS_FILE, empty_table, io_error, parse, read_hooks_file};
use super::model::HookTable;
use arc_swap::ArcSwap;
use serde::Serialize;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Called with every table that goes live.
pub(crate) type OnReload<T = HookTable> = Box<dyn Fn(Arc<T>) + Send + Sync>;

/// What a watcher watches: one file of the workspace, read into a table (hooks.json into a
/// [`HookTable`]; `policies.json` into the policy layer's table). Everything in this module
/// but the file's format is shared.
pub(crate) trait Doc: Send + Sync + 'static {
    /// What the file becomes.
    type Table: Send + Sync + 'static;
    /// The file's name inside the workspace.
    const FILE: &'static str;
    /// What the file configures, for log lines ("shell hooks").
    const WHAT: &'static str;
    /// Reads the file without blocking on a FIFO (`Ok(None)`: it does not exist).
    fn read(workspace: &Path) -> io::Result<Option<Vec<u8>>>;
    /// Parses and validates its bytes; errors as `FILE:LINE:COL: PATH: reason`.
    fn parse(bytes: &[u8], label: &str, workspace: &Path) -> Result<Self::Table, ConfigErrors>;
    /// The table of a workspace without the file.
    fn empty() -> Self::Table;
    /// Notes where a table was read from.
    fn set_source(table: &mut Self::Table, file: PathBuf);
    /// Whether the table was read from the file.
    fn loaded(table: &Self::Table) -> bool;
    /// Its load-time warnings.
    fn warnings(table: &Self::Table) -> &[String];
    /// Adds a warning.
    fn warn(table: &mut Self::Table, warning: String);
    /// What of it is live, for the log (`4 shell hook(s) live`).
    fn live(table: &Self::Table) -> String;
    /// How many entries it has, and whether it is switched on as a whole.
    fn size(table: &Self::Table) -> (usize, bool);
}

/// hooks.json.
pub(crate) struct HooksDoc;

impl Doc for HooksDoc {
    type Table = HookTable;
    const FILE: &'static str = HOOKS_FILE;
    const WHAT: &'static str = "shell hooks";
    fn read(workspace: &Path) -> io::Result<Option<Vec<u8>>> {
        read_hooks_file(workspace)
    }
    fn parse(bytes: &[u8], label: &str, workspace: &Path) -> Result<HookTable, ConfigErrors> {
        parse(bytes, label, workspace)
    }
    fn empty() -> HookTable {
        empty_table()
    }
    fn set_source(table: &mut HookTable, file: PathBuf) {
        table.source = Some(file);
    }
    fn loaded(table: &HookTable) -> bool {
        table.source.is_some()
    }
    fn warnings(table: &HookTable) -> &[String] {
        &table.warnings
    }
    fn warn(table: &mut HookTable, warning: String) {
        table.warnings.push(warning);
    }
    fn live(table: &HookTable) -> String {
        live(table)
    }
    fn size(table: &HookTable) -> (usize, bool) {
        (table.actions.len(), table.enabled)
    }
}

/// How a watcher names its file in messages: the bare name for the current directory, the
/// joined path otherwise.
pub(crate) fn label_of(workspace: &Path, file: &str) -> String {
    if workspace.as_os_str().is_empty() || workspace == Path::new(".") {
        file.to_string()
    } else {
        workspace.join(file).display().to_string()
    }
}

/// How a [`ConfigWatcher`] watches.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Quiet time after the last file-system event before the file is read (default 50 ms).
    /// A stream of events that never goes quiet still reloads every 10 × `debounce`.
    pub debounce: Duration,
    /// Poll instead of using inotify (default: whether `PRX_HOOKS_POLL=1` is set).
    pub poll: bool,
    /// How often polling looks at the file (default 25 ms: one `stat` of one file, cheap; with
    /// the 50 ms debounce a change is live within about 75 ms, inside the 100 ms target).
    pub poll_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            debounce: Duration::from_millis(50),
            poll: std::env::var_os("PRX_HOOKS_POLL").is_some_and(|v| v == "1"),
            poll_interval: Duration::from_millis(25),
        }
    }
}

/// Which mechanism notices changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum WatcherKind {
    /// inotify (notify's recommended watcher).
    Inotify,
    /// Polling every `poll_interval` ([`WatchOptions`]).
    Poll,
}

impl WatcherKind {
    /// `inotify` or `poll`, as stats and logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            WatcherKind::Inotify => "inotify",
            WatcherKind::Poll => "poll",
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reload {
    /// A new table is live (the callback ran).
    Applied,
    /// The file is as the active table was read from it (or still absent): nothing to do.
    Unchanged,
    /// The file is invalid or unreadable; the last good table stays active.
    Rejected,
}

impl crate::stats::Stats {
    /// The hooks.json watcher's section: reloads, errors (with the last error's text), the
    /// active table's size. `None` without a workspace.
    pub fn config(&self) -> Option<&ConfigStats> {
        self.section(CONFIG_SECTION)
    }
}

/// The key of the watcher's section in [`Stats`](crate::Stats) and in its JSON.
pub(crate) const CONFIG_SECTION: &str = "config";

/// The watcher's counters and state, for `Hooks::stats()` and `/api/stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigStats {
    /// The watched file (`<workspace>/hooks.json`).
    pub source: String,
    /// Whether the active table was read from the file (false: no file, or none valid yet).
    pub loaded: bool,
    /// Tables that went live after the initial load.
    pub reloads: u64,
    /// Loads rejected (invalid or unreadable file), the initial one included.
    pub reload_errors: u64,
    /// Changes that left the file byte-identical to the active table's.
    pub unchanged: u64,
    /// Whether the file on disk is currently rejected (the active table is an older one).
    pub failing: bool,
    /// Every error line of the file while it is rejected; `None` once a valid file is back
    /// (a new table, or the one in force put back as it was) or the file is gone.
    pub last_error: Option<String>,
    /// Actions in the active table.
    pub actions: usize,
    /// The active table's global switch.
    pub enabled: bool,
    /// Load-time warnings of the active table.
    pub warnings: usize,
    /// The mechanism in use.
    pub watcher: WatcherKind,
    /// When the active table went live (RFC 3339, UTC).
    pub last_reload: Option<String>,
}

/// Watches a workspace's hooks.json and keeps the latest valid table.
pub struct ConfigWatcher(Watch<HooksDoc>);

/// Watches one file of a workspace ([`Doc`]) and keeps the latest valid table.
pub(crate) struct Watch<D: Doc> {
    shared: Arc<Shared<D>>,
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

enum Msg {
    Fs(notify::Result<notify::Event>),
    Stop,
}

struct Shared<D: Doc> {
    workspace: PathBuf,
    /// The workspace resolved at start, to recognize events about the directory itself.
    workspace_canon: Option<PathBuf>,
    file: PathBuf,
    label: String,
    table: ArcSwap<D::Table>,
    on_reload: OnReload<D::Table>,
    /// Serializes loads and callbacks.
    state: Mutex<LoadState>,
    stats: Mutex<Counters>,
    kind: AtomicU8,
}

#[derive(Default)]
struct LoadState {
    /// The bytes the active table was read from (`None`: empty table, no file or none valid).
    active: Option<Vec<u8>>,
    /// The bytes of the last rejected file (not reported twice).
    rejected: Option<Vec<u8>>,
}

#[derive(Default)]
struct Counters {
    reloads: u64,
    reload_errors: u64,
    unchanged: u64,
    failing: bool,
    last_error: Option<String>,
    last_reload: Option<SystemTime>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ConfigWatcher {
    /// Loads `<workspace>/hooks.json` and starts watching it with the default options (polling
    /// when `PRX_HOOKS_POLL=1`) and the given debounce. See [`ConfigWatcher::start_with`].
    pub fn start(
        workspace: PathBuf,
        debounce: Duration,
        on_reload: OnReload,
    ) -> io::Result<ConfigWatcher> {
        let opts = WatchOptions {
            debounce,
            ..WatchOptions::default()
        };
        ConfigWatcher::start_with(workspace, opts, on_reload)
    }

    /// Loads `<workspace>/hooks.json` and starts watching it.
    ///
    /// `on_reload` is called once before this returns, with the initial table (an empty one
    /// when the file is missing or invalid — an invalid file is reported and watched, so fixing
    /// it makes it live), then after every table that goes live. Calls are serialized, on the
    /// watcher's thread (or the caller of [`reload_now`](Self::reload_now)); keep them short and
    /// do not call `reload_now` from inside. A panic in the callback is caught and logged.
    ///
    /// Fails only when the watcher thread cannot be started; a workspace that cannot be watched
    /// with inotify (even one that does not exist yet) is polled.
    pub fn start_with(
        workspace: PathBuf,
        opts: WatchOptions,
        on_reload: OnReload,
    ) -> io::Result<ConfigWatcher> {
        Watch::start_with(workspace, opts, on_reload).map(ConfigWatcher)
    }

    /// The active table (a cheap `Arc` clone; lock-free).
    pub fn table(&self) -> Arc<HookTable> {
        self.0.table()
    }

    /// Re-reads and re-validates the file now, on the calling thread, even if it did not
    /// change (bare command names are resolved again: a program installed since is found).
    /// For SIGHUP. Returns when the new table is live (or was rejected).
    pub fn reload_now(&self) -> Reload {
        self.0.reload_now()
    }

    /// Re-reads the file now, on the calling thread, and applies it only if its bytes differ
    /// from the active table's (an API write, made live before the response). Returns when the
    /// new table is live (or was rejected); the watcher's own event for the same bytes is then
    /// [`Reload::Unchanged`].
    pub fn reload_if_changed(&self) -> Reload {
        self.0.reload_if_changed()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ConfigStats {
        self.0.stats()
    }

    /// inotify, or polling.
    pub fn kind(&self) -> WatcherKind {
        self.0.kind()
    }

    /// The workspace whose hooks.json is watched.
    pub fn workspace(&self) -> &Path {
        self.0.workspace()
    }
}

impl std::fmt::Debug for ConfigWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigWatcher")
            .field("file", &self.0.shared.file)
            .field("watcher", &self.kind())
            .finish_non_exhaustive()
    }
}

impl<D: Doc> Watch<D> {
    /// Loads `<workspace>/<D::FILE>` and starts watching it (what [`ConfigWatcher::start_with`]
    /// says, for any [`Doc`]).
    pub(crate) fn start_with(
        workspace: PathBuf,
        opts: WatchOptions,
        on_reload: OnReload<D::Table>,
    ) -> io::Result<Watch<D>> {
        let debounce = opts.debounce.max(Duration::from_millis(1));
        let poll_interval = opts.poll_interval.max(Duration::from_millis(1));
        let shared = Arc::new(Shared {
            file: workspace.join(D::FILE),
            label: label_of(&workspace, D::FILE),
            workspace_canon: std::fs::canonicalize(&workspace).ok(),
            workspace,
            table: ArcSwap::from_pointee(D::empty()),
            on_reload,
            state: Mutex::new(LoadState::default()),
            stats: Mutex::new(Counters::default()),
            kind: AtomicU8::new(WatcherKind::Poll as u8),
        });
        let (tx, rx) = mpsc::channel();
        let watcher = if opts.poll {
            None
        } else {
            match inotify_watcher(&shared.workspace, tx.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(
                        "cannot watch {} with inotify ({e}); polling every {} ms",
                        shared.workspace.display(),
                        poll_interval.as_millis()
                    );
                    None
                }
            }
        };
        let kind = if watcher.is_some() {
            WatcherKind::Inotify
        } else {
            WatcherKind::Poll
        };
        shared.kind.store(kind as u8, Ordering::Relaxed);
        let signature = file_signature(&shared.file);
        shared.initial_load();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("prx-hooks-config".into())
            .spawn(move || {
                Worker {
                    shared: thread_shared,
                    rx,
                    watcher,
                    debounce,
                    poll_interval,
                    signature,
                    links: Links::default(),
                }
                .run()
            })?;
        Ok(Watch {
            shared,
            tx,
            thread: Some(thread),
        })
    }

    /// The active table (a cheap `Arc` clone; lock-free).
    pub(crate) fn table(&self) -> Arc<D::Table> {
        self.shared.table.load_full()
    }

    /// See [`ConfigWatcher::reload_now`].
    pub(crate) fn reload_now(&self) -> Reload {
        self.shared.reload(true)
    }

    /// See [`ConfigWatcher::reload_if_changed`].
    pub(crate) fn reload_if_changed(&self) -> Reload {
        self.shared.reload(false)
    }

    /// A snapshot of the counters (`actions`: the table's entries).
    pub(crate) fn stats(&self) -> ConfigStats {
        let table = self.table();
        let (entries, enabled) = D::size(&table);
        let c = lock(&self.shared.stats);
        ConfigStats {
            source: self.shared.file.display().to_string(),
            loaded: D::loaded(&table),
            reloads: c.reloads,
            reload_errors: c.reload_errors,
            unchanged: c.unchanged,
            failing: c.failing,
            last_error: c.last_error.clone(),
            actions: entries,
            enabled,
            warnings: D::warnings(&table).len(),
            watcher: self.kind(),
            last_reload: c
                .last_reload
                .map(|t| humantime::format_rfc3339_millis(t).to_string()),
        }
    }

    /// inotify, or polling.
    pub(crate) fn kind(&self) -> WatcherKind {
        if self.shared.kind.load(Ordering::Relaxed) == WatcherKind::Inotify as u8 {
            WatcherKind::Inotify
        } else {
            WatcherKind::Poll
        }
    }

    /// The workspace whose file is watched.
    pub(crate) fn workspace(&self) -> &Path {
        &self.shared.workspace
    }
}

impl<D: Doc> Drop for Watch<D> {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn inotify_watcher(
    workspace: &Path,
    tx: mpsc::Sender<Msg>,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher;
    let mut w = notify::recommended_watcher(move |res| {
        let _ = tx.send(Msg::Fs(res));
    })?;
    w.watch(workspace, notify::RecursiveMode::NonRecursive)?;
    Ok(w)
}

/// What polling compares: `None` when the file does not exist.
type Signature = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn file_signature(file: &Path) -> Signature {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).ok().map(|m| {
        (
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    })
}

impl<D: Doc> Shared<D> {
    fn initial_load(&self) {
        let mut st = lock(&self.state);
        match D::read(&self.workspace) {
            Ok(None) => {
                tracing::debug!("{}: no file, no {}", self.label, D::WHAT);
                self.apply(&mut st, D::empty(), None, true);
            }
            Ok(Some(bytes)) => match D::parse(&bytes, &self.label, &self.workspace) {
                Ok(mut table) => {
                    D::set_source(&mut table, self.file.clone());
                    self.apply(&mut st, table, Some(bytes), true);
                }
                Err(errs) => {
                    self.reject(&mut st, &errs, Some(bytes));
                    self.apply(&mut st, D::empty(), None, true);
                }
            },
            Err(e) => {
                self.reject(&mut st, &io_error(&self.label, &e), None);
                self.apply(&mut st, D::empty(), None, true);
            }
        }
    }

    fn reload(&self, force: bool) -> Reload {
        let mut st = lock(&self.state);
        match D::read(&self.workspace) {
            Ok(None) => {
                if st.active.is_none() {
                    // Still no file (or the rejected one is gone): nothing to swap.
                    let mut c = lock(&self.stats);
                    if c.failing {
                        tracing::info!(
                            "{} was deleted: no {} until it is created again",
                            self.label,
                            D::WHAT
                        );
                    }
                    c.failing = false;
                    c.last_error = None;
                    c.unchanged += 1;
                    st.rejected = None;
                    return Reload::Unchanged;
                }
                let mut table = D::empty();
                let msg = format!(
                    "{} was deleted: no {} until it is created again",
                    self.label,
                    D::WHAT
                );
                D::warn(&mut table, msg);
                st.rejected = None;
                self.apply(&mut st, table, None, false);
                Reload::Applied
            }
            Ok(Some(bytes)) => {
                if !force && st.active.as_deref() == Some(&bytes[..]) {
                    let mut c = lock(&self.stats);
                    if c.failing {
                        // Put back as it was (an undo): the table in force is the file's again.
                        tracing::info!(
                            "{} is valid again (as in force): {}",
                            self.label,
                            D::live(&self.table.load())
                        );
                    }
                    c.failing = false;
                    c.last_error = None;
                    c.unchanged += 1;
                    st.rejected = None;
                    return Reload::Unchanged;
                }
                if !force && st.rejected.as_deref() == Some(&bytes[..]) {
                    return Reload::Rejected;
                }
                match D::parse(&bytes, &self.label, &self.workspace) {
                    Ok(mut table) => {
                        D::set_source(&mut table, self.file.clone());
                        st.rejected = None;
                        self.apply(&mut st, table, Some(bytes), false);
                        Reload::Applied
                    }
                    Err(errs) => {
                        self.reject(&mut st, &errs, Some(bytes));
                        Reload::Rejected
                    }
                }
            }
            Err(e) => {
                self.reject(&mut st, &io_error(&self.label, &e), None);
                Reload::Rejected
            }
        }
    }

    fn apply(&self, st: &mut LoadState, table: D::Table, bytes: Option<Vec<u8>>, initial: bool) {
        for w in D::warnings(&table) {
            tracing::warn!("{w}");
        }
        let mut c = lock(&self.stats);
        if D::loaded(&table) {
            if c.failing && !initial {
                tracing::info!("{} is valid again: {}", self.label, D::live(&table));
            } else {
                tracing::info!("{}: {}", self.label, D::live(&table));
            }
        }
        let table = Arc::new(table);
        self.table.store(table.clone());
        st.active = bytes;
        if !initial {
            c.reloads += 1;
            c.failing = false;
            c.last_error = None;
        }
        c.last_reload = Some(SystemTime::now());
        drop(c);
        let cb = &self.on_reload;
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(table))).is_err() {
            tracing::error!("the {} reload callback panicked", D::FILE);
        }
    }

    fn reject(&self, st: &mut LoadState, errs: &ConfigErrors, bytes: Option<Vec<u8>>) {
        tracing::warn!(
            "{}: rejected ({} error(s)); the last good configuration stays active",
            self.label,
            errs.len()
        );
        for line in errs.lines() {
            tracing::warn!("{line}");
        }
        st.rejected = bytes;
        let mut c = lock(&self.stats);
        c.reload_errors += 1;
        c.failing = true;
        c.last_error = Some(errs.to_string());
    }
}

/// What of `table` runs, for the log: `4 shell hook(s) live`, `3 of 4 shell hook(s) live (1
/// disabled)`, `0 of 4 shell hook(s) live (all disabled: "enabled": false)`.
fn live(table: &HookTable) -> String {
    let all = table.actions.len();
    if !table.enabled {
        return format!("0 of {all} shell hook(s) live (all disabled: \"enabled\": false)");
    }
    let on = table.actions.iter().filter(|a| a.enabled).count();
    if on == all {
        format!("{all} shell hook(s) live")
    } else {
        format!("{on} of {all} shell hook(s) live ({} disabled)", all - on)
    }
}

/// How soon a reload follows an event that says the writer is done.
const SETTLE: Duration = Duration::from_millis(2);

/// A burst of changes waiting for its reload.
#[derive(Clone, Copy)]
struct Burst {
    first: Instant,
    due: Instant,
}

enum Signal {
    Ignore,
    Changing,
    Settled,
}

struct Worker<D: Doc> {
    shared: Arc<Shared<D>>,
    rx: mpsc::Receiver<Msg>,
    watcher: Option<notify::RecommendedWatcher>,
    debounce: Duration,
    poll_interval: Duration,
    signature: Signature,
    links: Links,
}

/// When hooks.json is a symbolic link: every file along the chain of links (each named in its
/// parent directory as resolved, which is how inotify reports it) and the directories watched
/// for them beside the workspace. A change to any of them can change what hooks.json reads.
#[derive(Default)]
struct Links {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
    /// A directory of the chain could not be watched (it does not exist, or the watch limit
    /// is reached): the file's signature is polled as well until it can.
    unwatched: bool,
}

/// Most links followed (the kernel's own limit, ELOOP, is 40).
const MAX_LINKS: usize = 40;

/// The chain of symbolic links from `file`: each target in turn, named through its parent
/// directory resolved (`/real/dir/name`), up to the first path that is not a link.
fn link_chain(file: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut cur = file.to_path_buf();
    while out.len() < MAX_LINKS {
        let Ok(target) = std::fs::read_link(&cur) else {
            break;
        };
        let next = match cur.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
        let next = match (next.parent(), next.file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir)
                .map(|d| d.join(name))
                .unwrap_or(next),
            _ => next,
        };
        if out.contains(&next) {
            break; // a loop: reading fails with ELOOP, and is reported as such
        }
        out.push(next.clone());
        cur = next;
    }
    out
}

impl<D: Doc> Worker<D> {
    fn run(mut self) {
        let mut pending: Option<Burst> = None;
        let mut next_poll = Instant::now() + self.poll_interval;
        if self.refresh_links() {
            // A target changed between the initial load and the new watches: look again.
            self.shared.reload(false);
        }
        loop {
            let now = Instant::now();
            let mut wake = pending.map(|b| b.due);
            if self.polling() {
                wake = Some(wake.map_or(next_poll, |w| w.min(next_poll)));
            }
            let msg = match wake {
                Some(at) => self.rx.recv_timeout(at.saturating_duration_since(now)),
                None => self.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match msg {
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(Msg::Fs(event)) => {
                    let signal = self.classify(event);
                    self.note(&mut pending, signal);
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if self.polling() && now >= next_poll {
                next_poll = now + self.poll_interval;
                let sig = file_signature(&self.shared.file);
                if sig != self.signature {
                    self.signature = sig;
                    self.note(&mut pending, Signal::Changing);
                }
            }
            if pending.is_some_and(|b| Instant::now() >= b.due) {
                pending = None;
                self.shared.reload(false);
                // The links may lead elsewhere now: watch where they lead, and read once more
                // in case the new target changed before its directory was watched.
                if self.refresh_links() {
                    self.shared.reload(false);
                }
            }
        }
        // Dropping the notify watcher here stops its thread.
        drop(self.watcher.take());
    }

    /// Polling: no inotify at all, or a directory of the link chain that inotify cannot watch.
    fn polling(&self) -> bool {
        self.watcher.is_none() || self.links.unwatched
    }

    /// Whether an event about `p` concerns what hooks.json reads: hooks.json in the workspace,
    /// or a file along its chain of links.
    fn is_ours(&self, p: &Path) -> bool {
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
            return false;
        };
        let canon = self.shared.workspace_canon.as_deref();
        let in_workspace = dir == self.shared.workspace || Some(dir) == canon;
        if in_workspace && name == D::FILE {
            return true;
        }
        if self.links.files.is_empty() {
            return false;
        }
        if self.links.dirs.iter().any(|d| d == p) {
            return true; // a directory of the chain itself was removed or moved
        }
        match (in_workspace, canon) {
            (true, Some(canon)) => self.links.files.contains(&canon.join(name)),
            _ => self.links.files.iter().any(|f| f == p),
        }
    }

    /// Re-reads the chain of links from hooks.json and moves the extra inotify watches to the
    /// directories it goes through now. Returns whether the chain changed.
    fn refresh_links(&mut self) -> bool {
        use notify::Watcher;
        let Some(watcher) = self.watcher.as_mut() else {
            return false;
        };
        let files = link_chain(&self.shared.file);
        if files == self.links.files
            && !self.links.unwatched
            && self.links.dirs.iter().all(|d| d.is_dir())
        {
            return false;
        }
        let canon = self.shared.workspace_canon.as_deref();
        let mut dirs: Vec<PathBuf> = Vec::new();
        for f in &files {
            if let Some(d) = f.parent()
                && Some(d) != canon
                && d != self.shared.workspace
                && !dirs.iter().any(|x| x == d)
            {
                dirs.push(d.to_path_buf());
            }
        }
        for old in &self.links.dirs {
            if !dirs.contains(old) {
                let _ = watcher.unwatch(old);
            }
        }
        let mut unwatched = false;
        let mut watched = Vec::with_capacity(dirs.len());
        for d in dirs {
            if self.links.dirs.contains(&d) && d.is_dir() {
                watched.push(d);
                continue;
            }
            match watcher.watch(&d, notify::RecursiveMode::NonRecursive) {
                Ok(()) => watched.push(d),
                Err(e) => {
                    if !self.links.unwatched {
                        tracing::warn!(
                            "{}: cannot watch {} (on the link chain) with inotify ({e}); \
                             polling the file every {} ms as well",
                            self.shared.label,
                            d.display(),
                            self.poll_interval.as_millis()
                        );
                    }
                    unwatched = true;
                }
            }
        }
        if unwatched && !self.links.unwatched {
            self.signature = file_signature(&self.shared.file);
        }
        if !files.is_empty() {
            tracing::debug!(
                "{}: a symbolic link; watching {} director(ies) along its chain",
                self.shared.label,
                watched.len()
            );
        }
        let changed = files != self.links.files;
        self.links = Links {
            files,
            dirs: watched,
            unwatched,
        };
        changed
    }

    /// Schedules the reload a signal asks for: `debounce` after the latest change (but no
    /// later than 10 × `debounce` after the first of a burst), or almost at once when the
    /// writer is known to be done.
    fn note(&self, pending: &mut Option<Burst>, signal: Signal) {
        let now = Instant::now();
        let first = pending.map_or(now, |b| b.first);
        let due = match signal {
            Signal::Ignore => return,
            Signal::Changing => (now + self.debounce).min(first + self.debounce * 10),
            Signal::Settled => now + SETTLE.min(self.debounce),
        };
        *pending = Some(Burst { first, due });
    }

    /// What a file-system event says about hooks.json. Our own reads show up as opens; those
    /// are ignored. A close after writing, or a rename onto hooks.json, means the writer is
    /// done ([`Signal::Settled`]); anything else touching the name may be half-way
    /// ([`Signal::Changing`]: an editor may move the file away before writing the new one).
    /// When the workspace directory itself goes away, inotify cannot follow it any more:
    /// switch to polling, which notices it coming back.
    fn classify(&mut self, event: notify::Result<notify::Event>) -> Signal {
        use notify::EventKind;
        use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("watching {}: {e}", self.shared.workspace.display());
                return Signal::Changing;
            }
        };
        if event.need_rescan() {
            return Signal::Changing;
        }
        if matches!(event.kind, EventKind::Access(AccessKind::Open(_))) {
            return Signal::Ignore;
        }
        if self.watcher.is_some()
            && matches!(event.kind, EventKind::Remove(_) | EventKind::Modify(_))
            && event.paths.iter().any(|p| {
                p == &self.shared.workspace || Some(p) == self.shared.workspace_canon.as_ref()
            })
        {
            tracing::warn!(
                "the workspace {} was removed or moved; polling every {} ms",
                self.shared.workspace.display(),
                self.poll_interval.as_millis()
            );
            self.watcher = None;
            self.shared
                .kind
                .store(WatcherKind::Poll as u8, Ordering::Relaxed);
            self.signature = file_signature(&self.shared.file);
            return Signal::Changing;
        }
        let is_ours = |p: &PathBuf| self.is_ours(p);
        let settled = match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => {
                event.paths.first().is_some_and(is_ours)
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                event.paths.first().is_some_and(is_ours)
            }
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                event.paths.get(1).is_some_and(is_ours)
            }
            _ => false,
        };
        if settled {
            Signal::Settled
        } else if event.paths.iter().any(is_ours) {
            Signal::Changing
        } else {
            Signal::Ignore
        }
    }
}
