//! Hook runs kept across restarts: a bounded NDJSON file of outcomes, appended by a thread of
//! its own and read back into the hooks' histories at start (ARCHITECTURE.md § Shell hooks).
//!
//! The file holds at most [`MAX_RUNS`] runs once compacted and never grows past
//! [`MAX_BYTES`] plus one run; it is created mode 0600, never through a symbolic link, and
//! refused when another user owns it. Whoever records a run only hands a copy to a bounded
//! queue: a run that finds it full is not kept, and counted (`run_log.lost` in the stats).

use super::outcome::Outcome;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Runs the file keeps: the last ones, all hooks together.
pub const MAX_RUNS: usize = 1000;

/// Bytes the file may hold before it is compacted; also the most read back at start. A
/// compaction keeps the last [`MAX_RUNS`] runs that fit in half of it, so it happens at most
/// once per `MAX_BYTES / 2` written.
pub const MAX_BYTES: u64 = 16 << 20;

/// Runs waiting to be written; past this, a run is not kept (counted).
const QUEUE: usize = 1024;

/// What a run log counted: runs written, runs not kept (queue full or a write failed), lines
/// of the file that could not be read back at start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunLogCounts {
    /// Runs appended to the file.
    pub written: u64,
    /// Runs not kept: the writer's queue was full, or writing failed (said once).
    pub lost: u64,
    /// Runs read back at start.
    pub loaded: u64,
    /// Lines skipped at start: not a run this version can read (said once).
    pub unreadable: u64,
}

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    lost: AtomicU64,
    loaded: AtomicU64,
    unreadable: AtomicU64,
}

/// The writer's end: hands runs to the thread that appends them.
pub(crate) struct RunLog {
    path: PathBuf,
    /// `None` once closed.
    tx: Mutex<Option<SyncSender<Outcome>>>,
    counts: Arc<Counters>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLog").field("path", &self.path).finish()
    }
}

impl RunLog {
    /// Opens (or creates) the file at `path` and reads back the runs it holds, oldest first.
    pub(crate) fn open(path: &Path) -> io::Result<(RunLog, Vec<Outcome>)> {
        // One writer per file: a second hook system over the same workspace would rewrite the
        // file from its own memory at compaction and lose the first one's runs.
        let lock = lock_beside(path)?;
        let mut file = open_private(path)?;
        let mut file_len = file.metadata()?.len();
        let counts = Arc::new(Counters::default());
        let (lines, unreadable) = read_back(&mut file)?;
        let mut runs = Vec::with_capacity(lines.len());
        let mut kept = VecDeque::with_capacity(lines.len());
        for line in lines {
            match serde_json::from_str::<Outcome>(&line) {
                Ok(o) => {
                    runs.push(o);
                    kept.push_back(line);
                }
                Err(_) => {
                    counts.unreadable.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let unreadable = unreadable + counts.unreadable.load(Ordering::Relaxed);
        counts.unreadable.store(unreadable, Ordering::Relaxed);
        if unreadable > 0 {
            tracing::warn!(
                "{}: {unreadable} line(s) are not hook runs this version reads; skipped",
                path.display()
            );
        }
        counts.loaded.store(runs.len() as u64, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel::<Outcome>(QUEUE);
        // A torn last line (a writer killed mid-line) ends here, so the next run starts a line
        // of its own instead of being glued to the fragment.
        if file_len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(file_len - 1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
                file_len += 1;
            }
        }
        let mut writer = Writer {
            path: path.to_path_buf(),
            _lock: lock,
            broken: false,
            file,
            bytes: file_len,
            kept: VecDeque::new(),
            kept_bytes: 0,
            appended: 0,
            counts: counts.clone(),
            failed_once: false,
        };
        for line in kept {
            writer.remember(line);
        }
        let thread = std::thread::Builder::new()
            .name("prx-run-log".into())
            .spawn(move || {
                while let Ok(o) = rx.recv() {
                    writer.append(&o);
                }
            })?;
        Ok((
            RunLog {
                path: path.to_path_buf(),
                tx: Mutex::new(Some(tx)),
                counts,
                thread: Mutex::new(Some(thread)),
            },
            runs,
        ))
    }

    /// Hands a copy of `o` to the writer without waiting; counted as lost when its queue is
    /// full.
    pub(crate) fn keep(&self, o: &Outcome) {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = tx.as_ref() else { return };
        match tx.try_send(o.clone()) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// What it counted so far.
    pub(crate) fn counts(&self) -> RunLogCounts {
        RunLogCounts {
            written: self.counts.written.load(Ordering::Relaxed),
            lost: self.counts.lost.load(Ordering::Relaxed),
            loaded: self.counts.loaded.load(Ordering::Relaxed),
            unreadable: self.counts.unreadable.load(Ordering::Relaxed),
        }
    }

    /// Writes what is queued and stops the writer.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for RunLog {
    fn drop(&mut self) {
        self.close();
    }
}

/// Takes the exclusive lock of `<path>.lock` (made 0600, never through a link), or says who
/// has it.
fn lock_beside(path: &Path) -> io::Result<File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&name)?;
    // SAFETY: `lock` is an open descriptor for the call; flock touches nothing else.
    let rc = unsafe {
        nix::libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&lock),
            nix::libc::LOCK_EX | nix::libc::LOCK_NB,
        )
    };
    if rc != 0 {
        return Err(io::Error::other(format!(
            "{}: kept by another prx-hooks over this workspace ({}); this one keeps none",
            path.display(),
            io::Error::last_os_error()
        )));
    }
    Ok(lock)
}

/// Opens `path` for reading and appending: created 0600, never through a symbolic link, a
/// regular file this user owns, narrowed to 0600 if it was wider.
fn open_private(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => io::Error::other(format!(
                "{}: a symbolic link; hook runs are not kept through one",
                path.display()
            )),
            _ => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(format!(
            "{}: not a regular file",
            path.display()
        )));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { nix::libc::geteuid() };
    if meta.uid() != me {
        return Err(io::Error::other(format!(
            "{}: owned by uid {}, not this user ({me}); not kept",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// The complete lines of the file's last [`MAX_BYTES`], the last [`MAX_RUNS`] of them, and
/// how many lines were too long or not UTF-8.
fn read_back(file: &mut File) -> io::Result<(VecDeque<String>, u64)> {
    let len = file.metadata()?.len();
    let start = len.saturating_sub(MAX_BYTES);
    file.seek(SeekFrom::Start(start))?;
    let mut reader = BufReader::new(file.take(MAX_BYTES));
    let mut lines = VecDeque::new();
    let mut unreadable = 0;
    let mut buf = Vec::new();
    let mut first = start > 0;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        // Started mid-file: the first line is the end of one cut in two.
        if std::mem::take(&mut first) {
            continue;
        }
        if buf.last() != Some(&b'\n') {
            // A run whose writer died mid-line.
            unreadable += 1;
            break;
        }
        buf.pop();
        match String::from_utf8(std::mem::take(&mut buf)) {
            Ok(line) if !line.is_empty() => {
                if lines.len() == MAX_RUNS {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
            Ok(_) => {}
            Err(_) => unreadable += 1,
        }
    }
    Ok((lines, unreadable))
}

/// The thread's side: appends each run as a line; past [`MAX_BYTES`] or twice [`MAX_RUNS`]
/// lines, rewrites the file with its last [`MAX_RUNS`] runs.
struct Writer {
    path: PathBuf,
    /// Held while the writer lives: the exclusive `flock` on `<log>.lock`.
    _lock: File,
    /// A compaction failed: nothing more is written (each run counted lost), so the file stays
    /// within its bound.
    broken: bool,
    file: File,
    /// The last [`MAX_RUNS`] lines that fit in `MAX_BYTES / 2`, without their newlines: what a
    /// compaction writes.
    kept: VecDeque<String>,
    /// Bytes of `kept`, newlines counted.
    kept_bytes: u64,
    /// Bytes in the file.
    bytes: u64,
    /// Lines appended since the last compaction (or the start).
    appended: usize,
    counts: Arc<Counters>,
    failed_once: bool,
}

impl Writer {
    fn append(&mut self, o: &Outcome) {
        if self.broken {
            self.counts.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Ok(mut line) = serde_json::to_string(o) else {
            self.counts.lost.fetch_add(1, Ordering::Relaxed);
            return;
        };
        line.push('\n');
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            self.failed(&e);
            return;
        }
        line.pop();
        self.counts.written.fetch_add(1, Ordering::Relaxed);
        self.bytes += line.len() as u64 + 1;
        self.appended += 1;
        self.remember(line);
        if (self.bytes > MAX_BYTES || self.kept.len() + self.appended > 2 * MAX_RUNS)
            && let Err(e) = self.compact()
        {
            // The run is written; what failed is keeping the file small: stop writing.
            self.broken = true;
            tracing::warn!(
                "{}: cannot be compacted ({e}); no more hook runs are kept in it (counted as \
                 run_log.lost)",
                self.path.display()
            );
        }
    }

    /// Adds `line` to what a compaction keeps, dropping the oldest past its bounds.
    fn remember(&mut self, line: String) {
        self.kept_bytes += line.len() as u64 + 1;
        self.kept.push_back(line);
        while self.kept.len() > MAX_RUNS || (self.kept_bytes > MAX_BYTES / 2 && self.kept.len() > 1)
        {
            let old = self.kept.pop_front().expect("more than one line");
            self.kept_bytes -= old.len() as u64 + 1;
        }
    }

    /// Writes the kept lines to a private file beside the log and renames it over the log.
    fn compact(&mut self) -> io::Result<()> {
        let tmp = self
            .path
            .with_extension(format!("tmp.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        if let Err(e) = self.write_kept(&tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        if let Err(e) = std::fs::rename(&tmp, &self.path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.file = open_private(&self.path)?;
        self.bytes = self.kept_bytes;
        self.appended = 0;
        Ok(())
    }

    /// The kept lines into a new private file at `tmp`.
    fn write_kept(&self, tmp: &Path) -> io::Result<()> {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(tmp)?;
        let mut text = Vec::with_capacity(64 << 10);
        for line in &self.kept {
            text.extend_from_slice(line.as_bytes());
            text.push(b'\n');
            if text.len() > 60 << 10 {
                out.write_all(&text)?;
                text.clear();
            }
        }
        out.write_all(&text)
    }

    fn failed(&mut self, e: &io::Error) {
        self.counts.lost.fetch_add(1, Ordering::Relaxed);
        if !std::mem::replace(&mut self.failed_once, true) {
            tracing::warn!(
                "{}: hook runs are not kept ({e}); counted as run_log.lost",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;
    use crate::shell::OutcomeKind;
    use std::time::{Duration, SystemTime};

    fn run(i: usize, tail: &str) -> Outcome {
        Outcome {
            id: format!("hook-{}", i % 3),
            event: EventKind::ToolCall,
            seq: i as u64,
            agent: "a".into(),
            session: "s".into(),
            direct: i.is_multiple_of(2),
            kind: if i.is_multiple_of(4) {
                OutcomeKind::Exit { code: 3 }
            } else {
                OutcomeKind::Ok
            },
            duration: Duration::from_micros(1234 + i as u64),
            stderr_tail: tail.to_string(),
            pid: Some(100 + i as u32),
            started_at: SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_000),
        }
    }

    fn lines(path: &Path) -> usize {
        std::fs::read_to_string(path).unwrap().lines().count()
    }

    #[test]
    fn runs_are_read_back_as_they_were_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.ndjson");
        let (log, back) = RunLog::open(&path).unwrap();
        assert!(back.is_empty());
        for i in 0..5 {
            log.keep(&run(i, "stderr \u{1b}[31m \"quoted\"\n"));
        }
        log.close();
        assert_eq!(log.counts().written, 5);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (_, back) = RunLog::open(&path).unwrap();
        assert_eq!(back.len(), 5);
        for (i, o) in back.iter().enumerate() {
            let want = run(i, "stderr \u{1b}[31m \"quoted\"\n");
            assert_eq!(
                serde_json::to_string(o).unwrap(),
                serde_json::to_string(&want).unwrap()
            );
            assert_eq!(o.kind, want.kind);
            assert_eq!(o.duration, want.duration);
            assert_eq!(o.started_at, want.started_at);
        }
    }

    #[test]
    fn the_file_keeps_the_last_runs_within_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.ndjson");
        let (log, _) = RunLog::open(&path).unwrap();
        for i in 0..5 * MAX_RUNS {
            // Keep the queue from filling: this test is about the file, not the queue.
            while log.counts().written + log.counts().lost < i as u64 {
                std::thread::yield_now();
            }
            log.keep(&run(i, ""));
        }
        log.close();
        assert_eq!(log.counts().lost, 0);
        assert!(lines(&path) <= 2 * MAX_RUNS + 1, "{} lines", lines(&path));
        let (_, back) = RunLog::open(&path).unwrap();
        assert_eq!(back.len(), MAX_RUNS);
        assert_eq!(
            back.last().unwrap().seq,
            5 * MAX_RUNS as u64 - 1,
            "the newest kept"
        );
        assert_eq!(back[0].seq, 4 * MAX_RUNS as u64, "oldest first");

        // Big runs: bounded in bytes too.
        let big = "x".repeat(16 << 10);
        let (log, _) = RunLog::open(&path).unwrap();
        for i in 0..1500 {
            while log.counts().written + log.counts().lost < i as u64 {
                std::thread::yield_now();
            }
            log.keep(&run(i, &big));
        }
        log.close();
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= MAX_BYTES + (20 << 10), "{size} bytes");
        let (_, back) = RunLog::open(&path).unwrap();
        assert!(!back.is_empty() && back.len() <= MAX_RUNS);
    }

    #[test]
    fn a_torn_or_foreign_line_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.ndjson");
        let (log, _) = RunLog::open(&path).unwrap();
        log.keep(&run(1, ""));
        log.close();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"not\":\"a run\"}\n\xff\xfe\n{\"id\":\"torn")
            .unwrap();
        drop(f);
        let (log, back) = RunLog::open(&path).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(log.counts().unreadable, 3, "{:?}", log.counts());
        assert_eq!(log.counts().loaded, 1);
        // The next run starts a line of its own, not glued to the torn one.
        log.keep(&run(2, ""));
        log.close();
        drop(log);
        let (_, back) = RunLog::open(&path).unwrap();
        assert_eq!(back.iter().map(|o| o.seq).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_second_writer_of_the_same_file_is_refused_not_raced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.ndjson");
        let (first, _) = RunLog::open(&path).unwrap();
        let e = RunLog::open(&path).unwrap_err();
        assert!(e.to_string().contains("kept by another"), "{e}");
        first.close();
        drop(first);
        RunLog::open(&path).expect("free again once the first is gone");
    }

    #[test]
    fn a_compaction_that_fails_stops_the_writing_so_the_file_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.ndjson");
        // The compaction's temporary name is taken by a directory: it cannot be made.
        std::fs::create_dir(path.with_extension(format!("tmp.{}", std::process::id()))).unwrap();
        let (log, _) = RunLog::open(&path).unwrap();
        for i in 0..3 * MAX_RUNS {
            while log.counts().written + log.counts().lost < i as u64 {
                std::thread::yield_now();
            }
            log.keep(&run(i, ""));
        }
        log.close();
        let c = log.counts();
        assert_eq!(c.written + c.lost, 3 * MAX_RUNS as u64, "{c:?}");
        assert!(c.written <= 2 * MAX_RUNS as u64 + 1, "{c:?}");
        assert!(lines(&path) <= 2 * MAX_RUNS + 1, "{} lines", lines(&path));
    }

    #[test]
    fn links_fifos_and_wide_modes_are_refused_or_narrowed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("runs.ndjson");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = RunLog::open(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");

        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = RunLog::open(&fifo).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");

        let wide = dir.path().join("wide");
        std::fs::write(&wide, "").unwrap();
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(RunLog::open(&wide).unwrap());
        let mode = std::fs::metadata(&wide).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
