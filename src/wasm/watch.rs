//! Hot reload of `<workspace>/plugins/`.
//!
//! [`PluginWatcher`] watches the plugins directory recursively with inotify (and the workspace
//! itself, so a `plugins/` created later is noticed), waits until changes go quiet for the
//! debounce time (a `cargo build` or `cp` writes a `.wasm` in several steps), and asks the sink
//! to reload. The sink rebuilds only plugins whose manifest or component changed, so a spurious
//! wake-up costs a directory scan. When inotify is unavailable, or `PRX_HOOKS_POLL=1` is set, it
//! polls instead: every [`POLL_INTERVAL`] it compares a listing of `plugins/` (each entry's
//! inode, size, and modification and change times, three levels deep) with the previous one.
//!
//! Paths: notify reports absolute paths, so the workspace is made absolute (and canonical) before
//! anything is compared — with a relative workspace (`--workspace .`, the default) no event ever
//! matched before. A `plugins/` directory that is replaced (renamed over, or deleted and created
//! again) is a new inode: the workspace's own watch sees the change, and before each reload the
//! watcher compares the directory's identity with the one it watches and watches the new one.
//!
//! State the host writes (`.prx-hooks/kv`) is outside `plugins/`, so it never wakes the watcher.
//! Dropping the watcher first cancels a load in progress (its probes), so that stopping never
//! waits for a guest's start code.

use super::manifest::PLUGINS_DIR;
use super::sink::WasmSink;
use notify::{RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the polling fallback lists `plugins/`.
pub(super) const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Watches a workspace's plugins; dropping it stops and joins its thread.
pub(crate) struct PluginWatcher {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    sink: Weak<WasmSink>,
}

enum Msg {
    Changed,
    Stop,
}

impl PluginWatcher {
    /// Starts watching `<workspace>/plugins/` now, before the plugins are loaded: the watches
    /// are set (or, when polling, the first listing taken) before this returns, so an edit made
    /// while the first load runs is seen once [`ArmedWatcher::start`] starts the thread.
    pub(crate) fn arm(workspace: PathBuf, poll: bool) -> ArmedWatcher {
        let (tx, rx) = mpsc::channel();
        let workspace = std::fs::canonicalize(&workspace)
            .or_else(|_| std::path::absolute(&workspace))
            .unwrap_or(workspace);
        let plugins = workspace.join(PLUGINS_DIR);
        let mut watcher = if poll {
            None
        } else {
            inotify(&workspace, &plugins, tx.clone())
        };
        let watched = watcher.as_mut().and_then(|w| rewatch(w, &plugins, None));
        let listing = watcher.is_none().then(|| list(&plugins));
        ArmedWatcher {
            tx,
            rx,
            plugins,
            armed: Armed {
                watcher,
                watched,
                listing,
            },
        }
    }
}

/// A watch set up before the first load ([`PluginWatcher::arm`]): what changes meanwhile is
/// queued (inotify) or compared against the listing taken before it (polling).
pub(crate) struct ArmedWatcher {
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    plugins: PathBuf,
    armed: Armed,
}

impl ArmedWatcher {
    /// Starts the watcher's thread, which reloads `sink` after each change once changes have
    /// been quiet for `debounce`.
    pub(crate) fn start(
        self,
        sink: Weak<WasmSink>,
        debounce: Duration,
    ) -> std::io::Result<PluginWatcher> {
        let ArmedWatcher {
            tx,
            rx,
            plugins,
            armed,
        } = self;
        let weak = sink.clone();
        let thread = std::thread::Builder::new()
            .name("prx-hooks-plugins".into())
            .spawn(move || run(&plugins, armed, &rx, &weak, debounce))?;
        Ok(PluginWatcher {
            tx,
            thread: Some(thread),
            sink,
        })
    }
}

/// What [`run`] starts from.
struct Armed {
    watcher: Option<notify::RecommendedWatcher>,
    /// The plugins/ directory the recursive watch is on (device, inode), if any.
    watched: Option<(u64, u64)>,
    /// Polling only: the listing taken when armed.
    listing: Option<Listing>,
}

type Listing = Vec<(PathBuf, u64, u64, i64, i64, i64, i64)>;

impl Drop for PluginWatcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(sink) = self.sink.upgrade() {
            sink.cancel_loads();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An inotify watcher on the workspace (for `plugins/` appearing) and on `plugins/`
/// (recursively); `None` when it cannot be set up.
fn inotify(
    workspace: &Path,
    plugins: &Path,
    tx: mpsc::Sender<Msg>,
) -> Option<notify::RecommendedWatcher> {
    let prefix = plugins.to_path_buf();
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        use notify::event::{AccessKind, AccessMode, EventKind};
        let relevant = match &res {
            // Reading a file (our own reload reads every manifest and component) is not a
            // change; a close after writing is.
            Ok(ev) if matches!(ev.kind, EventKind::Access(a) if a != AccessKind::Close(AccessMode::Write)) => {
                false
            }
            // The kernel's queue overflowed: changes were lost, so look again.
            Ok(ev) if ev.need_rescan() => true,
            Ok(ev) => ev.paths.iter().any(|p| p.starts_with(&prefix)),
            Err(_) => true,
        };
        if relevant {
            let _ = tx.send(Msg::Changed);
        }
    })
    .map_err(|e| tracing::warn!("plugins: cannot watch with inotify ({e}); polling instead"))
    .ok()?;
    w.watch(workspace, RecursiveMode::NonRecursive).ok()?;
    Some(w)
}

fn run(
    plugins: &Path,
    armed: Armed,
    rx: &mpsc::Receiver<Msg>,
    sink: &Weak<WasmSink>,
    debounce: Duration,
) {
    let Armed {
        mut watcher,
        mut watched,
        listing,
    } = armed;
    let polling = watcher.is_none();
    // Polling: the listing from before the first load, so an edit made during it differs.
    let mut listing = listing.unwrap_or_else(|| list(plugins));
    let mut dirty_since: Option<Instant> = None;
    loop {
        let wait = match dirty_since {
            Some(t) => debounce.saturating_sub(t.elapsed()),
            None if polling => POLL_INTERVAL,
            None => Duration::from_secs(3600),
        };
        match rx.recv_timeout(wait) {
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(Msg::Changed) => {
                dirty_since = Some(Instant::now());
                continue;
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if polling {
            let now = list(plugins);
            if now != listing {
                listing = now;
                dirty_since = Some(Instant::now());
                continue;
            }
        }
        if dirty_since.is_none_or(|t| t.elapsed() < debounce) {
            continue;
        }
        dirty_since = None;
        if let Some(w) = watcher.as_mut() {
            watched = rewatch(w, plugins, watched);
        }
        let Some(sink) = sink.upgrade() else { return };
        let report = sink.reload();
        for e in &report.errors {
            tracing::warn!("plugin: {e}");
        }
    }
}

/// Watches `plugins/` recursively when it exists and is not the directory already watched
/// (it was created, or replaced by another one); returns the identity now watched.
fn rewatch(
    w: &mut notify::RecommendedWatcher,
    plugins: &Path,
    watched: Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let now = std::fs::metadata(plugins)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()));
    if now == watched {
        return watched;
    }
    if watched.is_some() {
        let _ = w.unwatch(plugins);
    }
    match now {
        Some(_) if w.watch(plugins, RecursiveMode::Recursive).is_ok() => now,
        _ => None,
    }
}

/// `plugins/` three levels deep: each entry's path, inode, size, and times.
fn list(plugins: &Path) -> Listing {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![(plugins.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(md) = std::fs::metadata(&path) else {
                continue;
            };
            if md.is_dir() && depth < 2 {
                stack.push((path.clone(), depth + 1));
            }
            out.push((
                path,
                md.ino(),
                md.size(),
                md.mtime(),
                md.mtime_nsec(),
                md.ctime(),
                md.ctime_nsec(),
            ));
        }
    }
    out.sort();
    out
}
