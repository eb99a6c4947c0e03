//! Reading a settings file and replacing it without losing what the agent saves meanwhile
//! (docs/connect.md § How the file is changed).
//!
//! A settings file is read through a descriptor opened without blocking (a FIFO or a device
//! is refused before any read), then replaced by swapping a finished temporary file with it
//! (`renameat2(RENAME_EXCHANGE)`): the file taken out is then checked, under a read lease so
//! that nobody is still writing it, to be the one that was read, same inode and same bytes.
//! When it is not, the agent saved it in between: the two are swapped back, nothing of ours
//! stays, and the caller reads the file again.

use crate::BoxError;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Settings files larger than this are refused (they are a few KiB).
pub(crate) const MAX_SETTINGS_BYTES: u64 = 16 << 20;

/// A settings file as read: its text (`None`: it does not exist) and which file it was.
#[derive(Clone, Debug)]
pub(crate) struct Current {
    pub text: Option<String>,
    ident: Option<(u64, u64)>,
    /// Its permission bits.
    pub mode: Option<u32>,
}

/// What became of a write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Written,
    /// The file changed after it was read: it holds the agent's save, nothing of ours.
    Changed,
}

/// The settings file's text; `None` when it does not exist. Only a regular file is read: a
/// FIFO, a socket or a device is refused without opening it.
pub(crate) fn read_settings(path: &Path) -> Result<Current, BoxError> {
    let missing = Current {
        text: None,
        ident: None,
        mode: None,
    };
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(missing),
        Err(e) => return Err(format!("connect: {}: {e}", path.display()).into()),
        Ok(m) if !m.is_file() => {
            return Err(format!("connect: {}: not a regular file", path.display()).into());
        }
        Ok(_) => {}
    }
    // Without blocking: it may have become a FIFO since.
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(missing),
        Err(e) => return Err(format!("connect: {}: {e}", path.display()).into()),
    };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(format!("connect: {}: not a regular file", path.display()).into());
    }
    let bytes = read_bounded(f, path)?;
    Ok(Current {
        text: Some(utf8(bytes, path)?),
        ident: Some((meta.dev(), meta.ino())),
        mode: Some(meta.mode() & 0o7777),
    })
}

fn read_bounded(f: std::fs::File, path: &Path) -> Result<Vec<u8>, BoxError> {
    let mut bytes = Vec::new();
    f.take(MAX_SETTINGS_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SETTINGS_BYTES {
        return Err(format!(
            "connect: {}: over {MAX_SETTINGS_BYTES} bytes: not a settings file",
            path.display()
        )
        .into());
    }
    Ok(bytes)
}

fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String, BoxError> {
    String::from_utf8(bytes).map_err(|e| {
        let text =
            String::from_utf8_lossy(&e.as_bytes()[..e.utf8_error().valid_up_to()]).into_owned();
        let (line, col) = super::json::line_col(&text, text.len());
        format!(
            "{}:{line}:{col}: not UTF-8 text (nothing was changed)",
            path.display()
        )
        .into()
    })
}

/// `<file>.prx-hooks.bak`.
pub(crate) fn backup_path(file: &Path) -> PathBuf {
    sibling(file, ".prx-hooks.bak")
}

fn sibling(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    file.with_file_name(name)
}

/// The content before the change, in a temporary file beside `backup` (the settings file's
/// mode, without write for others: it may hold secrets); [`commit_backup`] puts it in place.
pub(crate) fn stage_backup(
    backup: &Path,
    text: &str,
    mode: Option<u32>,
) -> Result<PathBuf, BoxError> {
    let mode = mode.map(|m| m & 0o777 & !0o002);
    let dir = parent(backup);
    Ok(write_temp(&dir, backup, text, mode)
        .map_err(|e| format!("connect: the backup {}: {e}", backup.display()))?)
}

/// Puts a staged backup in place, once the settings file was written.
pub(crate) fn commit_backup(staged: &Path, backup: &Path) -> Result<(), BoxError> {
    std::fs::rename(staged, backup).map_err(|e| {
        let _ = std::fs::remove_file(staged);
        format!("connect: the backup {}: {e}", backup.display()).into()
    })
}

fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// `text` in a new temporary file beside `path` (0600 while written, then `mode`; without one,
/// made 0644 less the umask, as any new file), synced. Missing directories are made (0755
/// less the umask). The process's umask is never changed: another thread's files keep theirs.
fn write_temp(dir: &Path, path: &Path, text: &str, mode: Option<u32>) -> std::io::Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{name}.prx-hooks-{}-{stamp:08x}.tmp",
        std::process::id()
    ));
    let result = (|| {
        // The kernel applies the umask to a mode given at creation, never to a chmod.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if mode.is_some() { 0o600 } else { 0o644 })
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        if let Some(mode) = mode {
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        f.sync_all()
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Replaces `path`, read as `was`, with `text`: its old mode kept (without write for others;
/// a new file 0644 less the umask). The file is never replaced by something based on an
/// older read: see the module's comment.
pub(crate) fn replace_file(path: &Path, was: &Current, text: &str) -> Result<Outcome, BoxError> {
    let fail = |e: std::io::Error| -> BoxError {
        format!("connect: writing {}: {e}", path.display()).into()
    };
    let mode = was.mode.map(|m| {
        if m & 0o002 != 0 {
            super::note(format!(
                "{}: was writable by anyone; written without that",
                path.display()
            ));
        }
        m & !0o002
    });
    let dir = parent(path);
    let tmp = write_temp(&dir, path, text, mode).map_err(fail)?;
    let ours = std::fs::metadata(&tmp).map_err(fail)?;
    let ours = (ours.dev(), ours.ino());
    let dirf = std::fs::File::open(&dir).map_err(fail)?;
    let done = swap_in(&dirf, path, &tmp, was, (ours, text));
    if done.is_err() || matches!(done, Ok(Outcome::Changed)) {
        let _ = std::fs::remove_file(&tmp);
    }
    let done = done?;
    if done == Outcome::Written {
        dirf.sync_all().map_err(fail)?;
    }
    Ok(done)
}

/// Puts `tmp` (ours: its identity and text) in place of `path`, checking what it takes out.
fn swap_in(
    dir: &std::fs::File,
    path: &Path,
    tmp: &Path,
    was: &Current,
    ours: ((u64, u64), &str),
) -> Result<Outcome, BoxError> {
    use nix::fcntl::{RenameFlags, renameat2};
    let (name, tmp_name) = (file_name(path), file_name(tmp));
    let flags = if was.text.is_some() {
        RenameFlags::RENAME_EXCHANGE
    } else {
        RenameFlags::RENAME_NOREPLACE
    };
    match renameat2(dir, tmp_name, dir, name, flags) {
        Ok(()) => {}
        // A file appeared where there was none: the agent made it.
        Err(nix::errno::Errno::EEXIST) => return Ok(Outcome::Changed),
        // ENOENT: the file went away since it was read.
        Err(nix::errno::Errno::ENOENT) => return Ok(Outcome::Changed),
        // The file system cannot swap: check, then rename (a narrower window, not none).
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
            return rename_if_unchanged(path, tmp, was);
        }
        Err(e) => return Err(format!("connect: writing {}: {e}", path.display()).into()),
    }
    if was.text.is_none() || taken_out_is(tmp, was.ident, was.text.as_deref()) {
        let _ = std::fs::remove_file(tmp);
        return Ok(Outcome::Written);
    }
    // The agent saved in between: its save goes back in place, ours comes out.
    renameat2(dir, tmp_name, dir, name, RenameFlags::RENAME_EXCHANGE)
        .map_err(|e| format!("connect: putting {} back: {e}", path.display()))?;
    if taken_out_is(tmp, Some(ours.0), Some(ours.1)) {
        return Ok(Outcome::Changed);
    }
    // Saved twice while we swapped: the later save goes in place, the earlier is kept aside.
    renameat2(dir, tmp_name, dir, name, RenameFlags::RENAME_EXCHANGE)
        .map_err(|e| format!("connect: putting {} back: {e}", path.display()))?;
    let aside = sibling(path, ".prx-hooks.conflict");
    std::fs::rename(tmp, &aside)
        .map_err(|e| format!("connect: keeping {}: {e}", aside.display()))?;
    Err(format!(
        "connect: {} was saved twice while connect ran: the last save is in it, the one before in {}; nothing of ours was written: run connect again",
        path.display(),
        aside.display()
    )
    .into())
}

/// Without `renameat2`: the file checked to be what was read, then replaced.
fn rename_if_unchanged(path: &Path, tmp: &Path, was: &Current) -> Result<Outcome, BoxError> {
    let now = read_settings(path)?;
    if now.text != was.text || now.ident != was.ident {
        return Ok(Outcome::Changed);
    }
    std::fs::rename(tmp, path).map_err(|e| format!("connect: writing {}: {e}", path.display()))?;
    Ok(Outcome::Written)
}

/// Deletes `path`, read as `was`, unless it changed since: it is first moved aside, checked,
/// and put back when it is not what was read.
pub(crate) fn remove_file(path: &Path, was: &Current) -> Result<Outcome, BoxError> {
    use nix::fcntl::{RenameFlags, renameat2};
    let dir = parent(path);
    let dirf = std::fs::File::open(&dir)?;
    let aside = dir.join(format!(
        ".{}.prx-hooks-{}.gone",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let fail = |e: nix::errno::Errno| -> BoxError {
        format!("connect: removing {}: {e}", path.display()).into()
    };
    match renameat2(
        &dirf,
        file_name(path),
        &dirf,
        file_name(&aside),
        RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => {}
        Err(nix::errno::Errno::ENOENT) => return Ok(Outcome::Changed),
        Err(e) => return Err(fail(e)),
    }
    if taken_out_is(&aside, was.ident, was.text.as_deref()) {
        let _ = std::fs::remove_file(&aside);
        dirf.sync_all()?;
        return Ok(Outcome::Written);
    }
    match renameat2(
        &dirf,
        file_name(&aside),
        &dirf,
        file_name(path),
        RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => Ok(Outcome::Changed),
        Err(e) => {
            let kept = sibling(path, ".prx-hooks.conflict");
            let _ = std::fs::rename(&aside, &kept);
            Err(format!(
                "connect: {} changed while connect ran and a new one was made meanwhile: the changed one is in {} ({e})",
                path.display(),
                kept.display()
            )
            .into())
        }
    }
}

fn file_name(path: &Path) -> &Path {
    Path::new(path.file_name().unwrap_or_default())
}

/// The file at `path` is `ident` holding `text`, and nobody is writing it: checked under a
/// read lease, which the kernel grants only while no descriptor has it open for writing (a
/// reader, an editor showing the file, does not stand in the way: a write lease would wait for
/// it too). A file system or owner that grants no lease is checked without one.
fn taken_out_is(path: &Path, ident: Option<(u64, u64)>, text: Option<&str>) -> bool {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        // SAFETY: F_SETLEASE on a descriptor this function owns (opened read-only, as a read
        // lease needs); no memory is passed.
        let r =
            unsafe { nix::libc::fcntl(f.as_raw_fd(), nix::libc::F_SETLEASE, nix::libc::F_RDLCK) };
        if r == 0 {
            break;
        }
        let busy = std::io::Error::last_os_error().raw_os_error() == Some(nix::libc::EAGAIN);
        if !busy {
            break; // no lease here: the check below still runs
        }
        if Instant::now() > deadline {
            return false; // still being written
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let Ok(meta) = f.metadata() else {
        return false;
    };
    let mut now = String::new();
    let read = (&f).take(MAX_SETTINGS_BYTES + 1).read_to_string(&mut now);
    read.is_ok() && Some((meta.dev(), meta.ino())) == ident && Some(now.as_str()) == text
}

/// A unified diff of `old` → `new` (3 lines of context), headed `--- FILE` / `+++ FILE`.
pub(crate) fn unified_diff(old: &str, new: &str, name: &str) -> String {
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    let mut out = format!("--- {name}\n+++ {name}\n");
    let all = diff_lines(&a, &b);
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = (0..all.len()).filter(|&k| all[k].0 != ' ').collect();
    let mut k = 0;
    while k < changed.len() {
        // A hunk: changes closer than 2×CONTEXT lines apart go together.
        let first = changed[k];
        let mut last = first;
        while k + 1 < changed.len() && changed[k + 1] <= last + 2 * CONTEXT + 1 {
            k += 1;
            last = changed[k];
        }
        k += 1;
        let from = first.saturating_sub(CONTEXT);
        let to = (last + CONTEXT + 1).min(all.len());
        let a_line = 1 + all[..from].iter().filter(|(op, _)| *op != '+').count();
        let b_line = 1 + all[..from].iter().filter(|(op, _)| *op != '-').count();
        let a_len = all[from..to].iter().filter(|(op, _)| *op != '+').count();
        let b_len = all[from..to].iter().filter(|(op, _)| *op != '-').count();
        let start = |line: usize, len: usize| if len == 0 { line - 1 } else { line };
        out.push_str(&format!(
            "@@ -{},{a_len} +{},{b_len} @@\n",
            start(a_line, a_len),
            start(b_line, b_len)
        ));
        for (op, line) in &all[from..to] {
            out.push(*op);
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    out
}

/// Every line of `a` and `b` marked ' ', '-' or '+': the common prefix and suffix, and the
/// middle by longest common subsequence (bounded; else all of it as changed).
fn diff_lines<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<(char, &'a str)> {
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    let mut ops: Vec<(char, &str)> = a[..pre].iter().map(|l| (' ', *l)).collect();
    if am.len().saturating_mul(bm.len()) <= 4_000_000 {
        let (n, m) = (am.len(), bm.len());
        let mut lcs = vec![0u32; (n + 1) * (m + 1)];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[i * (m + 1) + j] = if am[i] == bm[j] {
                    lcs[(i + 1) * (m + 1) + j + 1] + 1
                } else {
                    lcs[(i + 1) * (m + 1) + j].max(lcs[i * (m + 1) + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n || j < m {
            if i < n && j < m && am[i] == bm[j] {
                ops.push((' ', am[i]));
                i += 1;
                j += 1;
            } else if i < n && (j == m || lcs[(i + 1) * (m + 1) + j] >= lcs[i * (m + 1) + j + 1]) {
                // A changed line shows as `-old` then `+new`.
                ops.push(('-', am[i]));
                i += 1;
            } else {
                ops.push(('+', bm[j]));
                j += 1;
            }
        }
    } else {
        ops.extend(am.iter().map(|l| ('-', *l)));
        ops.extend(bm.iter().map(|l| ('+', *l)));
    }
    ops.extend(a[a.len() - suf..].iter().map(|l| (' ', *l)));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_shows_only_the_changed_lines_with_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let new = "a\nb\nc\nd\nX\ne\nf\ng\nh\n";
        let d = unified_diff(old, new, "f.json");
        assert_eq!(
            d,
            "--- f.json\n+++ f.json\n@@ -2,6 +2,7 @@\n b\n c\n d\n+X\n e\n f\n g\n"
        );
        // A new file: every line added.
        let d = unified_diff("", "{}\n", "n.json");
        assert_eq!(d, "--- n.json\n+++ n.json\n@@ -0,0 +1,1 @@\n+{}\n");
    }

    #[test]
    fn a_file_saved_after_it_was_read_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("settings.json");
        std::fs::write(&file, "{\"a\": 1}\n").unwrap();
        let was = read_settings(&file).unwrap();
        // The agent saves (a new file renamed over it) after connect read it.
        std::fs::write(dir.path().join("new"), "{\"a\": 2}\n").unwrap();
        std::fs::rename(dir.path().join("new"), &file).unwrap();
        assert_eq!(
            replace_file(&file, &was, "{\"ours\": 1}\n").unwrap(),
            Outcome::Changed
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"a\": 2}\n");
        // Saved in place: the same.
        let was = read_settings(&file).unwrap();
        std::fs::write(&file, "{\"a\": 3}\n").unwrap();
        assert_eq!(
            replace_file(&file, &was, "{\"ours\": 1}\n").unwrap(),
            Outcome::Changed
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"a\": 3}\n");
        assert_eq!(remove_file(&file, &was).unwrap(), Outcome::Changed);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"a\": 3}\n");
        // Unchanged: written; then removed.
        let was = read_settings(&file).unwrap();
        assert_eq!(
            replace_file(&file, &was, "{\"ours\": 1}\n").unwrap(),
            Outcome::Written
        );
        let was = read_settings(&file).unwrap();
        assert_eq!(remove_file(&file, &was).unwrap(), Outcome::Written);
        assert!(!file.exists());
        // No temporary file is left.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_reader_holding_the_file_open_is_not_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("settings.json");
        std::fs::write(&file, "{\"a\": 1}\n").unwrap();
        // An editor showing the file: open for reading the whole time.
        let reader = std::fs::File::open(&file).unwrap();
        let was = read_settings(&file).unwrap();
        assert_eq!(
            replace_file(&file, &was, "{\"ours\": 1}\n").unwrap(),
            Outcome::Written
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"ours\": 1}\n");
        let was = read_settings(&file).unwrap();
        let reader2 = std::fs::File::open(&file).unwrap();
        assert_eq!(remove_file(&file, &was).unwrap(), Outcome::Written);
        drop((reader, reader2));
        // A writer still holding it open is one: its write may not have landed yet.
        std::fs::write(&file, "{\"a\": 2}\n").unwrap();
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        let was = read_settings(&file).unwrap();
        assert_eq!(
            replace_file(&file, &was, "{\"ours\": 2}\n").unwrap(),
            Outcome::Changed
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{\"a\": 2}\n");
        drop(writer);
    }

    /// The umask of the process is left alone: a file another thread makes meanwhile gets the
    /// mode it asked for, less the umask, every time.
    #[test]
    fn another_threads_new_files_keep_their_mode_while_connect_writes() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        let file = dir.path().join("settings.json");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let made = {
            let (stop, theirs) = (stop.clone(), theirs.clone());
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = theirs.join(n.to_string());
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o666)
                        .open(&p)
                        .unwrap();
                    n += 1;
                }
                n
            })
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            let _ = std::fs::remove_file(&file);
            let was = read_settings(&file).unwrap();
            assert_eq!(replace_file(&file, &was, "{}\n").unwrap(), Outcome::Written);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let n = made.join().unwrap();
        assert!(n > 0);
        let modes: std::collections::BTreeSet<u32> = std::fs::read_dir(&theirs)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().mode() & 0o777)
            .collect();
        assert_eq!(modes.len(), 1, "{n} files, modes {modes:?}");
        // The settings file made from nothing: 0644 less the same umask.
        let mode = std::fs::metadata(&file).unwrap().mode() & 0o777;
        let umask = 0o666 & !modes.first().unwrap();
        assert_eq!(mode, 0o644 & !umask, "{mode:o}");
    }
}
