//! What the consumer remembers: the core intake buffer (bounded in messages and bytes), the
//! once-said warnings, and the de-dup window of message ids (ARCHITECTURE.md § NATS bridge).

use super::*;

/// Core NATS: the consumer's own buffer between the client's subscription channel and the
/// worker, bounded in messages and bytes; what does not fit is dropped and counted
/// (`dropped_full`).
pub(super) struct Intake {
    /// The messages and their bytes (subject, headers and body as the client read them).
    pub(super) q: Mutex<(VecDeque<async_nats::Message>, usize)>,
    pub(super) ready: tokio::sync::Notify,
    pub(super) max_messages: usize,
    pub(super) max_bytes: usize,
    /// `dropped_full`, and the `buffered` gauges (left as they are when the consumer stops:
    /// what was still buffered then).
    pub(super) counters: Arc<Counters>,
}

impl Intake {
    /// The task: moves every message the subscription yields into the buffer at once, so the
    /// client's own channel stays near empty.
    pub(super) async fn fill(self: Arc<Self>, mut sub: async_nats::Subscriber) {
        use futures_util::StreamExt;
        let counters = &self.counters;
        while let Some(m) = sub.next().await {
            let size = m.length.max(m.payload.len());
            let kept = {
                let mut g = self.q.lock().unwrap_or_else(|e| e.into_inner());
                let (q, bytes) = &mut *g;
                let fits = q.len() < self.max_messages && *bytes + size <= self.max_bytes;
                if fits {
                    q.push_back(m);
                    *bytes += size;
                    self.gauges(q.len(), *bytes);
                }
                fits
            };
            if kept {
                self.ready.notify_one();
            } else {
                counters.dropped_full.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Up to `n` messages into `out`; false if there were none.
    pub(super) fn take(&self, out: &mut Vec<async_nats::Message>, n: usize) -> bool {
        let mut g = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let (q, bytes) = &mut *g;
        while out.len() < n {
            let Some(m) = q.pop_front() else { break };
            *bytes -= m.length.max(m.payload.len());
            out.push(m);
        }
        self.gauges(q.len(), *bytes);
        !out.is_empty()
    }

    pub(super) fn gauges(&self, messages: usize, bytes: usize) {
        let c = &self.counters;
        c.buffered.store(messages as u64, Ordering::Relaxed);
        c.buffered_bytes.store(bytes as u64, Ordering::Relaxed);
    }
}

/// Refusals are said at most once a second, with a count of those not said.
#[derive(Default)]
pub(super) struct Said {
    pub(super) last: Option<Instant>,
    pub(super) quiet: u64,
}

impl Said {
    pub(super) fn warn(&mut self, what: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.quiet += 1;
            return;
        }
        self.last = Some(now);
        match std::mem::take(&mut self.quiet) {
            0 => tracing::warn!("{what}"),
            n => tracing::warn!("{what} ({n} more refusal(s) not shown; see the stats)"),
        }
    }
}

/// Whether an id was handed over before, and with what.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Seen {
    No,
    /// With the same digest (or one from a file of the older format, without digests).
    Same,
    /// With another body, agent or session.
    Other,
}

/// FNV-1a, 64 bits, of the event, agent, session and payload JSON: what makes a same-id
/// message a retry rather than another event. Stable across builds (it is persisted); not a
/// MAC — it keeps a forged id from suppressing an event the forger has not seen.
pub(super) fn digest(kind: crate::EventKind, agent: &str, session: &str, payload: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [kind.name(), agent, session, payload] {
        for &b in part.as_bytes().iter().chain(&[0xff]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The de-dup window: the ids handed over with their digests, newest last, at most `cap` of
/// them and none older than `age`; optionally mirrored to a file of `<unix ms>\t<digest
/// hex>\t<id>` lines (ids cannot hold a tab; the older `<unix ms> <id>` lines are read too).
pub(super) struct Window {
    pub(super) set: HashMap<String, Option<u64>>,
    pub(super) order: VecDeque<(String, u64)>,
    pub(super) cap: usize,
    pub(super) age: Duration,
    pub(super) file: Option<(PathBuf, std::fs::File, usize)>,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Window {
    pub(super) fn open(
        cap: usize,
        age: Duration,
        path: Option<PathBuf>,
    ) -> Result<Window, ConnectError> {
        let mut w = Window {
            set: HashMap::new(),
            order: VecDeque::new(),
            cap,
            age,
            file: None,
        };
        let Some(path) = path else {
            return Ok(w);
        };
        let err = |e: std::io::Error| ConnectError::File {
            path: path.clone(),
            reason: e.to_string(),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for line in text.lines() {
                    // A torn last line (a crash mid-write) is skipped.
                    let parsed = match line.split('\t').collect::<Vec<_>>()[..] {
                        [ms, d, id] => u64::from_str_radix(d, 16).ok().map(|d| (ms, Some(d), id)),
                        [_] => line.split_once(' ').map(|(ms, id)| (ms, None, id)),
                        _ => None,
                    };
                    if let Some((ms, d, id)) = parsed
                        && let Ok(ms) = ms.parse::<u64>()
                        && !id.is_empty()
                    {
                        w.push(id.to_string(), d, ms);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(e)),
        }
        w.expire();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Private, as the token's directory is: the ids say what this host ran.
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err)?;
        }
        w.rewrite(&path).map_err(err)?;
        Ok(w)
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn push(&mut self, id: String, digest: Option<u64>, ms: u64) {
        if self.set.insert(id.clone(), digest).is_none() {
            self.order.push_back((id, ms));
        }
        while self.order.len() > self.cap {
            if let Some((old, _)) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(super) fn expire(&mut self) {
        let oldest = now_ms().saturating_sub(self.age.as_millis() as u64);
        while self.order.front().is_some_and(|(_, ms)| *ms < oldest) {
            if let Some((old, _)) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    pub(super) fn seen(&mut self, id: &str, digest: u64) -> Seen {
        self.expire();
        match self.set.get(id) {
            None => Seen::No,
            Some(None) => Seen::Same,
            Some(Some(d)) if *d == digest => Seen::Same,
            Some(Some(_)) => Seen::Other,
        }
    }

    #[cfg(test)]
    pub(super) fn contains(&mut self, id: &str) -> bool {
        self.seen(id, 0) != Seen::No
    }

    /// Remembers `id` as handed over with `digest` (replacing what an id conflict had).
    pub(super) fn insert(&mut self, id: &str, digest: u64) {
        self.push(id.to_string(), Some(digest), now_ms());
    }

    pub(super) fn line(ms: u64, id: &str, digest: Option<u64>) -> String {
        match digest {
            Some(d) => format!("{ms}\t{d:016x}\t{id}\n"),
            None => format!("{ms} {id}\n"),
        }
    }

    /// Appends the ids just handed over; rewrites the file once it holds twice the window.
    pub(super) fn persist(&mut self, ids: &[(String, u64)]) {
        if ids.is_empty() {
            return;
        }
        let Some((path, file, lines)) = &mut self.file else {
            return;
        };
        let ms = now_ms();
        let mut text = String::with_capacity(ids.len() * 48);
        for (id, d) in ids {
            text.push_str(&Window::line(ms, id, Some(*d)));
        }
        if let Err(e) = file.write_all(text.as_bytes()) {
            tracing::warn!(
                "NATS consumer: writing the de-dup window to {}: {e}",
                path.display()
            );
        }
        *lines += ids.len();
        if *lines > 2 * self.cap.max(1024) {
            let path = path.clone();
            if let Err(e) = self.rewrite(&path) {
                tracing::warn!(
                    "NATS consumer: compacting the de-dup window {}: {e}",
                    path.display()
                );
            }
        }
    }

    /// Writes the window whole under a temporary name of its own (`<file>.<pid>.tmp`: the
    /// file's whole name, so two windows never share one; created afresh, O_EXCL and
    /// O_NOFOLLOW, so a planted file or symlink is never written through), renames it into
    /// place (0600), and appends to it from then on (O_NOFOLLOW).
    pub(super) fn rewrite(&mut self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(name);
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)
        };
        let mut f = match create() {
            // Left by a process of the same pid that crashed (or planted): removed (a
            // symlink itself, never its target), then created afresh.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp)?;
                create()?
            }
            r => r?,
        };
        let mut text = String::new();
        for (id, ms) in &self.order {
            text.push_str(&Window::line(*ms, id, self.set.get(id).copied().flatten()));
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)?;
        self.file = Some((path.to_path_buf(), f, self.order.len()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_forgets_by_size_and_age_and_survives_a_reopen() {
        let dir = std::env::temp_dir().join(format!("prx-nats-window-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("seen");
        let mut w = Window::open(3, Duration::from_secs(60), Some(path.clone())).unwrap();
        for id in ["a", "b", "c", "d"] {
            assert!(!w.contains(id));
            w.insert(id, 7);
            w.persist(&[(id.to_string(), 7)]);
        }
        assert!(!w.contains("a"), "the oldest id leaves a full window");
        assert!(w.contains("b") && w.contains("d"));
        drop(w);
        // A torn line at the end (a crash mid-write) is skipped.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"12")
            .unwrap();
        let mut w = Window::open(3, Duration::from_secs(60), Some(path.clone())).unwrap();
        assert!(w.contains("b") && w.contains("c") && w.contains("d") && !w.contains("a"));
        assert_eq!(w.len(), 3);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Age: an id older than the window's age is gone on reopen.
        std::fs::write(&path, format!("1 old\n{} new\n", now_ms())).unwrap();
        let mut w = Window::open(10, Duration::from_secs(60), Some(path)).unwrap();
        assert!(!w.contains("old") && w.contains("new"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_same_id_with_another_digest_is_no_duplicate_and_old_lines_still_match() {
        let dir = std::env::temp_dir().join(format!("prx-nats-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("seen");
        let mut w = Window::open(10, Duration::from_secs(60), Some(path.clone())).unwrap();
        w.insert("x-1", 42);
        w.persist(&[("x-1".to_string(), 42)]);
        assert_eq!(w.seen("x-1", 42), Seen::Same);
        assert_eq!(w.seen("x-1", 43), Seen::Other);
        assert_eq!(w.seen("x-2", 42), Seen::No);
        drop(w);
        // Reopened: the digest came back from the file; an older line (no digest) matches any.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, "{} old id with spaces", now_ms()).unwrap();
        drop(f);
        let mut w = Window::open(10, Duration::from_secs(60), Some(path.clone())).unwrap();
        assert_eq!(w.seen("x-1", 43), Seen::Other);
        assert_eq!(w.seen("x-1", 42), Seen::Same);
        assert_eq!(w.seen("old id with spaces", 7), Seen::Same);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
