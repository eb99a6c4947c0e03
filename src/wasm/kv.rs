//! The per-plugin key-value store behind `prx:host/kv`.
//!
//! Each plugin has one [`KvStore`], shared by all its pooled instances and kept across instance
//! replacement and reloads (it belongs to the plugin's name, not to a component). It lives in
//! memory and is written to `<workspace>/.prx-hooks/kv/<plugin>` by the [`KvFlusher`] thread at
//! most [`FLUSH_DELAY`] after a change, and once more at shutdown, so a count kept in kv survives
//! a restart and one `prx-hooks fire` sees what the previous one stored. The directory is outside
//! `plugins/`, so writing it never wakes the plugin watcher.
//!
//! The file format is small and self-checking: the magic line `PRXKV1\n`, then per entry the key
//! length (u32 LE), the key (UTF-8), the value length (u32 LE) and the value; a file that does not
//! parse is renamed aside (`<plugin>.corrupt`) and the store starts empty, with a warning. Writes
//! go to a temporary file that is fsynced and renamed over the old one: a crash leaves the old or
//! the new file, never half of one.
//!
//! The size cap (`max_kv_storage_mb`) counts key and value bytes; a `set` that would pass it is
//! refused with an error the guest sees. With `pool_size` > 1, two instances may interleave a
//! get-then-set (each call is atomic, a sequence of calls is not).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long after a change the store is written (the promise is "durable within 1 s").
pub const FLUSH_DELAY: Duration = Duration::from_millis(200);
/// The longest key the store accepts.
pub const MAX_KEY_BYTES: usize = 4096;

const MAGIC: &[u8] = b"PRXKV1\n";

/// One plugin's store.
pub struct KvStore {
    path: PathBuf,
    plugin: String,
    inner: Mutex<Inner>,
    /// Held across a whole flush, so two flushes cannot land an older snapshot last.
    writing: Mutex<()>,
}

struct Inner {
    map: BTreeMap<String, Vec<u8>>,
    bytes: u64,
    cap: u64,
    /// Changed since the last write to disk.
    dirty: bool,
}

impl KvStore {
    /// Opens (or starts) the store of `plugin` under `dir` with a cap of `cap` bytes.
    pub fn open(dir: &Path, plugin: &str, cap: u64) -> KvStore {
        let path = dir.join(plugin);
        let map = match std::fs::read(&path) {
            Ok(bytes) => decode(&bytes).unwrap_or_else(|| {
                let aside = dir.join(format!("{plugin}.corrupt"));
                tracing::warn!(plugin, file = %path.display(),
                    "kv file is corrupt; moved to {} and starting empty", aside.display());
                let _ = std::fs::rename(&path, &aside);
                BTreeMap::new()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(plugin, file = %path.display(), "cannot read kv file: {e}; starting empty");
                BTreeMap::new()
            }
        };
        let bytes = map.iter().map(|(k, v)| entry_size(k, v)).sum();
        KvStore {
            path,
            plugin: plugin.to_string(),
            inner: Mutex::new(Inner {
                map,
                bytes,
                cap,
                dirty: false,
            }),
            writing: Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new cap (the manifest changed). Existing entries stay even when over it; sets that grow
    /// the store are refused until it is under.
    pub fn set_cap(&self, cap: u64) {
        self.lock().cap = cap;
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().map.get(key).cloned()
    }

    /// Stores `value` under `key`; refuses keys over [`MAX_KEY_BYTES`] and growth past the cap.
    pub fn set(&self, key: &str, value: Vec<u8>) -> Result<(), String> {
        if key.len() > MAX_KEY_BYTES {
            return Err(format!(
                "kv: key is {} bytes; the limit is {MAX_KEY_BYTES}",
                key.len()
            ));
        }
        let mut inner = self.lock();
        let old = inner.map.get(key).map_or(0, |v| entry_size(key, v));
        let new = entry_size(key, &value);
        let total = inner.bytes - old + new;
        if new > old && total > inner.cap {
            return Err(format!(
                "kv: storage limit of {} bytes reached ({} in use; max_kv_storage_mb in plugin.toml raises it)",
                inner.cap, inner.bytes
            ));
        }
        inner.bytes = total;
        inner.map.insert(key.to_string(), value);
        inner.dirty = true;
        Ok(())
    }

    /// Removes `key`; whether it was there.
    pub fn delete(&self, key: &str) -> bool {
        let mut inner = self.lock();
        match inner.map.remove(key) {
            Some(v) => {
                inner.bytes -= entry_size(key, &v);
                inner.dirty = true;
                true
            }
            None => false,
        }
    }

    /// Keys starting with `prefix`, sorted.
    pub fn list_keys(&self, prefix: &str) -> Vec<String> {
        self.lock()
            .map
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Key and value bytes stored.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Writes the store if it changed since the last write. The lock is held only to copy the
    /// entries out, never across file I/O.
    pub fn flush(&self) -> io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let snapshot = {
            let mut inner = self.lock();
            if !inner.dirty {
                return Ok(());
            }
            inner.dirty = false;
            encode(&inner.map)
        };
        let result = write_atomically(&self.path, &snapshot);
        if let Err(e) = &result {
            self.lock().dirty = true;
            tracing::warn!(plugin = %self.plugin, file = %self.path.display(), "cannot write kv: {e}");
        }
        result
    }
}

fn entry_size(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64
}

fn encode(map: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for (k, v) in map {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}

fn decode(mut bytes: &[u8]) -> Option<BTreeMap<String, Vec<u8>>> {
    bytes = bytes.strip_prefix(MAGIC)?;
    let mut map = BTreeMap::new();
    let take = |bytes: &mut &[u8]| -> Option<Vec<u8>> {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (value, rest) = rest.split_at_checked(len)?;
        *bytes = rest;
        Some(value.to_vec())
    };
    while !bytes.is_empty() {
        let key = String::from_utf8(take(&mut bytes)?).ok()?;
        let value = take(&mut bytes)?;
        map.insert(key, value);
    }
    Some(map)
}

/// Temp file in the same directory, fsync, rename, fsync the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile_in(dir, path)?;
    tmp.1.write_all(bytes)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path)?;
    std::fs::File::open(dir)?.sync_all()
}

fn tempfile_in(dir: &Path, path: &Path) -> io::Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    for n in 0u32.. {
        let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 100 => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// The thread that writes changed stores: woken by [`KvFlusher::touch`], it waits
/// [`FLUSH_DELAY`] to gather a burst of writes, then writes every dirty store.
pub struct KvFlusher {
    shared: Arc<FlushShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct FlushShared {
    state: Mutex<FlushState>,
    wake: Condvar,
}

#[derive(Default)]
struct FlushState {
    stores: Vec<Weak<KvStore>>,
    /// When the earliest unflushed change happened.
    pending_since: Option<Instant>,
    stop: bool,
}

impl KvFlusher {
    pub fn start() -> io::Result<KvFlusher> {
        let shared = Arc::new(FlushShared {
            state: Mutex::new(FlushState::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("prx-hooks-kv".into())
            .spawn(move || flush_loop(&s))?;
        Ok(KvFlusher {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FlushState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a store to be flushed when it changes.
    pub fn register(&self, store: &Arc<KvStore>) {
        let mut st = self.state();
        st.stores.retain(|w| w.strong_count() > 0);
        if !st.stores.iter().any(|w| w.as_ptr() == Arc::as_ptr(store)) {
            st.stores.push(Arc::downgrade(store));
        }
    }

    /// A store changed: write it within [`FLUSH_DELAY`].
    pub fn touch(&self) {
        let mut st = self.state();
        if st.pending_since.is_none() {
            st.pending_since = Some(Instant::now());
            self.shared.wake.notify_one();
        }
    }

    /// Writes every dirty store now and stops the thread. Idempotent.
    pub fn stop(&self) {
        self.state().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for KvFlusher {
    fn drop(&mut self) {
        self.stop();
    }
}

fn flush_loop(shared: &FlushShared) {
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let due = st.pending_since.map(|t| t + FLUSH_DELAY);
        let now = Instant::now();
        if st.stop || due.is_some_and(|d| d <= now) {
            st.pending_since = None;
            let stores: Vec<_> = st.stores.iter().filter_map(Weak::upgrade).collect();
            let stop = st.stop;
            drop(st);
            for store in stores {
                let _ = store.flush();
            }
            if stop {
                return;
            }
            st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        st = match due {
            Some(d) => {
                shared
                    .wake
                    .wait_timeout(st, d - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_cap() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), "p", 25);
        kv.set("count", b"41".to_vec()).unwrap();
        kv.set("count", b"42".to_vec()).unwrap();
        kv.set("count.tool_call", b"1".to_vec()).unwrap();
        assert_eq!(kv.bytes(), 7 + 16);
        assert!(
            kv.set("other", b"x".to_vec())
                .unwrap_err()
                .contains("limit")
        );
        // Shrinking is always allowed.
        kv.set("count.tool_call", Vec::new()).unwrap();
        assert_eq!(kv.list_keys("count"), ["count", "count.tool_call"]);
        assert_eq!(kv.list_keys("count."), ["count.tool_call"]);
        kv.flush().unwrap();
        let again = KvStore::open(dir.path(), "p", 25);
        assert_eq!(again.get("count").as_deref(), Some(&b"42"[..]));
        assert!(again.delete("count"));
        assert!(!again.delete("count"));
        assert_eq!(again.bytes(), 15);
    }

    #[test]
    fn corrupt_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p"), b"PRXKV1\n\xff\xff\xff\xff").unwrap();
        let kv = KvStore::open(dir.path(), "p", 100);
        assert_eq!(kv.list_keys(""), Vec::<String>::new());
        assert!(dir.path().join("p.corrupt").exists());
    }

    #[test]
    fn flusher_writes_within_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = KvFlusher::start().unwrap();
        let kv = Arc::new(KvStore::open(dir.path(), "p", 100));
        flusher.register(&kv);
        kv.set("k", b"v".to_vec()).unwrap();
        flusher.touch();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !dir.path().join("p").exists() {
            assert!(Instant::now() < deadline, "kv was not flushed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let again = KvStore::open(dir.path(), "p", 100);
        assert_eq!(again.get("k").as_deref(), Some(&b"v"[..]));
    }
}
