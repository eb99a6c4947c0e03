//! Hot reload of hooks.json with the real watcher (inotify, and the polling fallback) on real
//! files: create, edit in place, rename over, break, fix, delete. Liveness is asserted with
//! generous slack (2 s; the design target is 100 ms), never speed.

use prx_hooks::config::{ConfigWatcher, HookTable, Reload, WatchOptions, WatcherKind};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

const SLACK: Duration = Duration::from_secs(2);

struct Harness {
    ws: TempDir,
    watcher: ConfigWatcher,
    calls: Arc<Mutex<Vec<Arc<HookTable>>>>,
}

fn start(poll: bool) -> Harness {
    let ws = tempfile::tempdir().unwrap();
    start_in(ws, poll)
}

fn start_in(ws: TempDir, poll: bool) -> Harness {
    let calls: Arc<Mutex<Vec<Arc<HookTable>>>> = Arc::default();
    let sink = calls.clone();
    let opts = WatchOptions {
        debounce: Duration::from_millis(50),
        poll,
        poll_interval: Duration::from_millis(100),
    };
    let watcher = ConfigWatcher::start_with(
        ws.path().to_path_buf(),
        opts,
        Box::new(move |t| sink.lock().unwrap().push(t)),
    )
    .unwrap();
    let want = if poll {
        WatcherKind::Poll
    } else {
        WatcherKind::Inotify
    };
    assert_eq!(watcher.kind(), want, "this machine must offer inotify");
    assert_eq!(watcher.stats().watcher, want);
    Harness { ws, watcher, calls }
}

impl Harness {
    fn file(&self) -> std::path::PathBuf {
        self.ws.path().join("hooks.json")
    }

    fn calls(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    /// The version marker of the active table: the first hook's first argument.
    fn version(&self) -> Option<String> {
        version(&self.watcher.table())
    }

    fn wait(&self, what: &str, cond: impl Fn(&Harness) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            assert!(
                start.elapsed() < SLACK,
                "{what}: not within {SLACK:?}; stats {:?}",
                self.watcher.stats()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `v` is the active table and the callback has been given it (its last call:
    /// the table is stored just before the callback runs).
    fn wait_version(&self, v: &str) {
        self.wait(&format!("version {v} live"), |h| {
            let last = h.calls.lock().unwrap().last().cloned().unwrap();
            h.version().as_deref() == Some(v) && version(&last).as_deref() == Some(v)
        });
    }
}

fn version(t: &HookTable) -> Option<String> {
    t.actions.first().and_then(|a| a.args.first().cloned())
}

fn config(v: &str) -> String {
    format!(
        r#"{{"hooks": {{"tool_call": [{{"command": "/bin/true", "args": ["{v}"]}}],
             "agent_start": [{{"command": "/bin/true", "id": "start"}}]}}}}"#
    )
}

fn write_in_place(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// What editors do: write a temporary file beside, then rename it over.
fn write_rename(path: &Path, text: &str) {
    let tmp = path.with_file_name(".hooks.json.swp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn lifecycle(poll: bool) {
    let h = start(poll);
    // Absent at start: an empty, enabled table, announced once.
    assert_eq!(h.calls(), 1);
    let t = h.watcher.table();
    assert!(t.enabled && t.actions.is_empty() && t.source.is_none());
    let s = h.watcher.stats();
    assert!(!s.loaded && !s.failing && s.reloads == 0 && s.reload_errors == 0);
    assert!(s.source.ends_with("hooks.json"));

    // Created later.
    write_in_place(&h.file(), &config("v1"));
    h.wait_version("v1");
    let s = h.watcher.stats();
    assert!(s.loaded && s.reloads == 1 && s.actions == 2 && s.enabled);
    assert!(s.last_reload.is_some());
    assert_eq!(
        h.watcher.table().source.as_deref(),
        Some(h.file().as_path())
    );

    // Edited in place.
    write_in_place(&h.file(), &config("v2"));
    h.wait_version("v2");

    // Replaced by rename.
    write_rename(&h.file(), &config("v3"));
    h.wait_version("v3");
    let calls = h.calls();

    // Broken: invalid JSON. The last good table stays active; the error is recorded.
    write_in_place(
        &h.file(),
        "{\"hooks\": {\"tool_call\": [\n  {\"command\": \"/bin/true\",}\n]}}",
    );
    // An in-place write is a truncate and a write: on a starved machine the poller can read the
    // empty file in between, which is (rightly) one more rejected load. So these steps wait for
    // the error they cause rather than for an exact count.
    h.wait("the broken file rejected", |h| {
        h.watcher
            .stats()
            .last_error
            .is_some_and(|e| e.contains("hooks.json:2:27: hooks.tool_call[0]: trailing comma"))
    });
    let s = h.watcher.stats();
    assert!(s.failing && s.reload_errors >= 1);
    assert_eq!(
        h.version().as_deref(),
        Some("v3"),
        "the last good table stays"
    );
    assert_eq!(h.calls(), calls, "no callback for a rejected file");

    // Broken differently: a bad field, replaced by rename (the count is read before the write:
    // the watcher may reject the file before this thread looks again).
    let errors = h.watcher.stats().reload_errors;
    write_rename(
        &h.file(),
        r#"{"hooks": {"tool_call": [{"command": "/bin/true", "args": ["v4"], "timeout_ms": 0}]}}"#,
    );
    h.wait("the bad field rejected", |h| {
        h.watcher.stats().last_error.is_some_and(|e| {
            e.contains("hooks.tool_call[0].timeout_ms: must be between 1 and 300000")
        })
    });
    assert_eq!(h.watcher.stats().reload_errors, errors + 1);
    assert_eq!(h.version().as_deref(), Some("v3"));

    // Fixed: live again.
    write_in_place(&h.file(), &config("v5"));
    h.wait_version("v5");
    let s = h.watcher.stats();
    assert!(!s.failing && s.reload_errors > errors);
    assert!(
        s.last_error.is_none(),
        "a valid file clears the error: {s:?}"
    );

    // Deleted: no hooks, with a warning.
    std::fs::remove_file(h.file()).unwrap();
    h.wait("the deletion applied", |h| {
        h.watcher.table().source.is_none()
    });
    let t = h.watcher.table();
    assert!(t.actions.is_empty() && t.enabled);
    assert!(t.warnings[0].contains("was deleted"), "{:?}", t.warnings);
    assert!(version(&h.calls.lock().unwrap().last().unwrap().clone()).is_none());
    assert!(!h.watcher.stats().loaded);

    // And back.
    write_rename(&h.file(), &config("v6"));
    h.wait_version("v6");
}

/// A live edit setting HOME (the host's, never the file's) is rejected like any invalid file:
/// the error names the place, the last good table keeps running.
#[test]
fn a_reload_setting_home_is_refused_and_the_last_good_table_stays() {
    let h = start(false);
    write_rename(&h.file(), &config("v1"));
    h.wait_version("v1");
    let calls = h.calls();
    write_rename(
        &h.file(),
        "{\"hooks\": {\"tool_call\": [\n  {\"command\": \"/bin/true\", \"args\": [\"v2\"], \"env\": {\"HOME\": \"/tmp/x\"}}]}}",
    );
    h.wait("the HOME edit rejected", |h| h.watcher.stats().failing);
    let s = h.watcher.stats();
    let err = s.last_error.unwrap_or_default();
    assert!(
        err.contains("hooks.json:2:52: hooks.tool_call[0].env.HOME: may not set \"HOME\""),
        "{err}"
    );
    assert_eq!(
        h.version().as_deref(),
        Some("v1"),
        "the last good table stays"
    );
    assert_eq!(h.calls(), calls, "no callback for a rejected file");
    assert!(h.watcher.table().actions.iter().all(|a| a.env.is_empty()));
}

/// A broken file put back as it was (the table in force): no new table, but the error is
/// cleared (`failing` false, `last_error` none), as after a fix that makes a new table live.
#[test]
fn restoring_a_broken_file_to_the_table_in_force_clears_the_error() {
    for poll in [false, true] {
        let h = start(poll);
        write_rename(&h.file(), &config("v1"));
        h.wait_version("v1");
        let (calls, reloads) = (h.calls(), h.watcher.stats().reloads);
        write_rename(&h.file(), "{\"hooks\": 1}");
        h.wait("the broken file rejected", |h| h.watcher.stats().failing);
        assert!(h.watcher.stats().last_error.is_some());
        write_rename(&h.file(), &config("v1"));
        h.wait("the error cleared", |h| {
            let s = h.watcher.stats();
            !s.failing && s.last_error.is_none()
        });
        let s = h.watcher.stats();
        assert_eq!(s.reloads, reloads, "the same table: nothing went live");
        assert_eq!(h.calls(), calls);
        assert!(s.unchanged >= 1, "{s:?}");
        // Broken again, then fixed with a new table: cleared too.
        write_rename(&h.file(), "{\"hooks\": 2}");
        h.wait("broken again", |h| h.watcher.stats().failing);
        write_rename(&h.file(), &config("v2"));
        h.wait_version("v2");
        let s = h.watcher.stats();
        assert!(!s.failing && s.last_error.is_none(), "poll {poll}: {s:?}");
    }
}

#[test]
fn lifecycle_with_inotify() {
    lifecycle(false);
}

#[test]
fn lifecycle_with_polling() {
    lifecycle(true);
}

fn broken_at_start(poll: bool) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("hooks.json"),
        r#"{"hooks": {"tool_call": [{"command": "a;b"}]}}"#,
    )
    .unwrap();
    let h = start_in(ws, poll);
    assert!(h.watcher.table().actions.is_empty(), "starts EMPTY");
    assert_eq!(h.calls(), 1);
    let s = h.watcher.stats();
    assert!(s.failing && s.reload_errors == 1 && !s.loaded);
    assert!(
        s.last_error
            .unwrap()
            .contains("hooks.json:1:38: hooks.tool_call[0].command: may not contain ';'")
    );
    write_rename(&h.file(), &config("ok"));
    h.wait_version("ok");
    assert!(!h.watcher.stats().failing);
}

#[test]
fn a_file_broken_at_start_is_watched_and_goes_live_when_fixed() {
    broken_at_start(false);
}

#[test]
fn a_file_broken_at_start_is_watched_and_goes_live_when_fixed_polling() {
    broken_at_start(true);
}

#[test]
fn identical_content_is_not_reloaded() {
    let h = start(false);
    write_in_place(&h.file(), &config("same"));
    h.wait_version("same");
    let calls = h.calls();
    let unchanged = h.watcher.stats().unchanged;
    // Rewritten with the very same bytes: noticed, compared, skipped.
    write_rename(&h.file(), &config("same"));
    h.wait("the rewrite noticed", |h| {
        h.watcher.stats().unchanged > unchanged
    });
    assert_eq!(h.calls(), calls);
    assert_eq!(h.watcher.stats().reloads, 1);
}

#[test]
fn reload_now_rereads_even_an_unchanged_file() {
    let h = start(false);
    write_in_place(&h.file(), &config("x"));
    h.wait_version("x");
    let before = Arc::as_ptr(&h.watcher.table());
    let calls = h.calls();
    assert_eq!(h.watcher.reload_now(), Reload::Applied);
    assert_eq!(
        h.calls(),
        calls + 1,
        "the callback ran before reload_now returned"
    );
    assert_ne!(Arc::as_ptr(&h.watcher.table()), before, "a new table");
    // Ids are stable across reloads.
    let a: Vec<String> = h.calls.lock().unwrap()[calls - 1]
        .actions
        .iter()
        .map(|a| a.id.clone())
        .collect();
    let b: Vec<String> = h
        .watcher
        .table()
        .actions
        .iter()
        .map(|a| a.id.clone())
        .collect();
    assert_eq!(a, b);
    // A broken file: rejected synchronously.
    std::fs::write(h.file(), "{").unwrap();
    assert_eq!(h.watcher.reload_now(), Reload::Rejected);
    assert_eq!(h.version().as_deref(), Some("x"));
}

#[test]
fn a_burst_of_writes_ends_with_the_last_one_live() {
    let h = start(false);
    for i in 0..30 {
        write_in_place(&h.file(), &config(&format!("b{i}")));
    }
    h.wait_version("b29");
    // Debounced: far fewer reloads than writes (not a timing assertion: a slow machine may
    // split the burst, but never into one reload per write and then some).
    assert!(h.watcher.stats().reloads <= 30);
}

#[test]
fn other_files_in_the_workspace_do_not_trigger_reloads() {
    let h = start(false);
    write_in_place(&h.file(), &config("a"));
    h.wait_version("a");
    let s = h.watcher.stats();
    for i in 0..20 {
        std::fs::write(h.ws.path().join(format!("log{i}.txt")), "x").unwrap();
    }
    std::fs::create_dir(h.ws.path().join("plugins")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let after = h.watcher.stats();
    assert_eq!(
        (after.reloads, after.unchanged, after.reload_errors),
        (s.reloads, s.unchanged, s.reload_errors)
    );
}

#[test]
fn dropping_the_watcher_stops_it() {
    let h = start(false);
    let calls = h.calls.clone();
    let file = h.file();
    let Harness { ws, watcher, .. } = h;
    drop(watcher);
    std::fs::write(&file, config("late")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(calls.lock().unwrap().len(), 1, "no callback after drop");
    drop(ws);
}

#[test]
fn a_missing_workspace_falls_back_to_polling_and_is_picked_up_when_created() {
    let parent = tempfile::tempdir().unwrap();
    let ws = parent.path().join("later");
    let calls: Arc<Mutex<Vec<Arc<HookTable>>>> = Arc::default();
    let sink = calls.clone();
    let w = ConfigWatcher::start_with(
        ws.clone(),
        WatchOptions {
            debounce: Duration::from_millis(20),
            poll: false,
            poll_interval: Duration::from_millis(50),
        },
        Box::new(move |t| sink.lock().unwrap().push(t)),
    )
    .unwrap();
    assert_eq!(w.kind(), WatcherKind::Poll);
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("hooks.json"), config("p")).unwrap();
    let start = Instant::now();
    while version(&w.table()).as_deref() != Some("p") {
        assert!(start.elapsed() < SLACK, "{:?}", w.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn stats_serialize() {
    let h = start(true);
    let json = serde_json::to_string(&h.watcher.stats()).unwrap();
    for key in [
        "\"source\"",
        "\"reloads\":0",
        "\"reload_errors\":0",
        "\"last_error\":null",
        "\"actions\":0",
        "\"enabled\":true",
        "\"watcher\":\"poll\"",
        "\"last_reload\"",
    ] {
        assert!(json.contains(key), "{key} in {json}");
    }
}

/// `mkfifo(3)` at `path` (mode 0600).
fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    let rc = unsafe { nix::libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Runs `f` on a thread of its own and gives up waiting after `limit` (the thread is then
/// left behind, wedged: the caller fails the test).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// A FIFO swapped in for hooks.json (between the watcher's `stat` and its
/// `open`) used to block the open forever: later valid files never went live, and SIGHUP
/// (`reload_now`) and shutdown (dropping the watcher) hung. A swapper alternates a FIFO and a
/// regular file under the name as fast as it can while reloads run from the watcher and from
/// another thread; then a valid file must go live, and every call must return.
fn a_fifo_swapped_in_never_wedges(poll: bool) {
    let h = start(poll);
    write_rename(&h.file(), &config("before"));
    h.wait_version("before");
    let Harness { ws, watcher, calls } = h;
    let watcher = Arc::new(watcher);
    let dir = ws.path().to_path_buf();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let swapper = {
        let (dir, stop, done) = (dir.clone(), stop.clone(), done.clone());
        std::thread::spawn(move || {
            let (fifo, file, target) =
                (dir.join("f.tmp"), dir.join("r.tmp"), dir.join("hooks.json"));
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                done.store(swaps, std::sync::atomic::Ordering::Relaxed);
                mkfifo(&fifo);
                std::fs::rename(&fifo, &target).unwrap();
                std::fs::write(&file, config("mid")).unwrap();
                std::fs::rename(&file, &target).unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    // SIGHUP-style reloads racing the swaps.
    // (Detached: on a wedged watcher it never returns.)
    {
        let (w, stop) = (watcher.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                w.reload_now();
            }
        });
    }
    // At least 1.5 s and 200 swaps (a loaded machine swaps slower), at most 30 s.
    let began = std::time::Instant::now();
    while began.elapsed() < Duration::from_millis(1500)
        || (done.load(std::sync::atomic::Ordering::Relaxed) < 200
            && began.elapsed() < Duration::from_secs(30))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 100, "the swapper only managed {swaps} swaps");
    // A FIFO left in place: a reload returns and says why the file was refused.
    let fifo = dir.join("f.tmp");
    mkfifo(&fifo);
    std::fs::rename(&fifo, dir.join("hooks.json")).unwrap();
    let w = watcher.clone();
    assert!(
        within(SLACK, move || w.reload_now()).is_some(),
        "reload_now (SIGHUP) hangs on a FIFO"
    );
    let s = watcher.stats();
    assert!(
        s.failing
            && s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("not a regular file")),
        "a FIFO read is refused with a clear error: {s:?}"
    );
    // Hooks.json is a regular file again; a new valid version must go live.
    write_rename(&dir.join("hooks.json"), &config("after"));
    let w = watcher.clone();
    let live = within(Duration::from_secs(10), move || {
        let start = Instant::now();
        while version(&w.table()).as_deref() != Some("after") {
            if start.elapsed() > SLACK * 2 {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    });
    assert_eq!(
        live,
        Some(true),
        "the valid file never went live: the watcher is wedged"
    );
    let w = watcher.clone();
    assert!(
        within(SLACK, move || w.reload_now()).is_some(),
        "reload_now (SIGHUP) hangs"
    );
    let s = watcher.stats();
    assert!(
        !s.failing && s.last_error.is_none(),
        "the valid file cleared the error: {s:?}"
    );
    // Shutdown: dropping the watcher returns.
    let dropped = within(SLACK, move || {
        // The reloader thread holds a clone until it sees `stop`; wait for it to let go.
        let mut w = watcher;
        loop {
            match Arc::try_unwrap(w) {
                Ok(inner) => return drop(inner),
                Err(back) => w = back,
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert!(dropped.is_some(), "dropping the watcher (shutdown) hangs");
    drop((calls, ws));
}

#[test]
fn a_fifo_swapped_in_never_wedges_the_watcher_or_shutdown() {
    a_fifo_swapped_in_never_wedges(false);
}

#[test]
fn a_fifo_swapped_in_never_wedges_the_polling_watcher_or_shutdown() {
    a_fifo_swapped_in_never_wedges(true);
}

/// A FIFO that is hooks.json from the start (no race needed): refused at once, by the loader
/// and by the watcher, with the reason.
#[test]
fn a_fifo_at_start_is_refused_not_waited_on() {
    let ws = tempfile::tempdir().unwrap();
    mkfifo(&ws.path().join("hooks.json"));
    let p = ws.path().to_path_buf();
    let e = within(SLACK, move || prx_hooks::config::load(&p)).expect("load hangs on a FIFO");
    assert!(e.unwrap_err().to_string().contains("not a regular file"));
    let h = within(SLACK, move || start_in(ws, false)).expect("start hangs on a FIFO");
    assert!(h.watcher.stats().failing);
    write_rename(&h.file(), &config("ok"));
    h.wait_version("ok");
}

/// hooks.json as a symbolic link (dotfiles managers do this). inotify on the
/// workspace sees nothing when the target is edited in its own directory; the watcher must
/// watch every directory along the link chain and follow the link when it is re-pointed.
#[test]
fn a_symlinked_hooks_json_is_reloaded_when_its_target_changes() {
    let h = start(false);
    let elsewhere = tempfile::tempdir().unwrap();
    let mid = tempfile::tempdir().unwrap();
    let real = elsewhere.path().join("real.json");
    std::fs::write(&real, config("t1")).unwrap();
    // ws/hooks.json -> mid/link.json -> elsewhere/real.json
    std::os::unix::fs::symlink(&real, mid.path().join("link.json")).unwrap();
    std::os::unix::fs::symlink(mid.path().join("link.json"), h.file()).unwrap();
    h.wait_version("t1");
    // Edited in place, in the target's directory.
    write_in_place(&real, &config("t2"));
    h.wait_version("t2");
    // Replaced by rename in the target's directory (what editors do).
    let tmp = elsewhere.path().join(".real.json.swp");
    std::fs::write(&tmp, config("t3")).unwrap();
    std::fs::rename(&tmp, &real).unwrap();
    h.wait_version("t3");
    // The middle link re-pointed at another file in another directory.
    let other = tempfile::tempdir().unwrap();
    let real2 = other.path().join("second.json");
    std::fs::write(&real2, config("t4")).unwrap();
    let tmp_link = mid.path().join(".link.tmp");
    std::os::unix::fs::symlink(&real2, &tmp_link).unwrap();
    std::fs::rename(&tmp_link, mid.path().join("link.json")).unwrap();
    h.wait_version("t4");
    // The new target is followed; the old one no longer matters.
    write_in_place(&real2, &config("t5"));
    h.wait_version("t5");
    let reloads = h.watcher.stats().reloads;
    write_in_place(&real, &config("stale"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.version().as_deref(), Some("t5"));
    assert_eq!(
        h.watcher.stats().reloads,
        reloads,
        "the old target is no longer watched"
    );
    // The link in the workspace replaced by a plain file: still watched as before.
    std::fs::remove_file(h.file()).unwrap();
    write_rename(&h.file(), &config("plain"));
    h.wait_version("plain");
    assert_eq!(h.watcher.kind(), WatcherKind::Inotify);
}
