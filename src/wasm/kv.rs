//! The per-plugin key-value store behind `prx:host/kv`.
//!
//! Each plugin has one [`KvStore`], shared by all its pooled instances and kept across instance
//! replacement and reloads (it belongs to the plugin's name, not to a component). It lives in
//! memory and in `<workspace>/.prx-hooks/kv/<plugin>`, an append-only log: every `set` and
//! `delete` appends one record, under an exclusive lock (`<plugin>.lock`, flock) held only for
//! that append. Before appending, and before every read, the store catches up with records
//! other processes appended since it last looked, so `prx-hooks run` and a `prx-hooks fire`
//! next to it share one store without losing each other's writes (per key, the last append
//! wins; a get-then-set in two processes can still interleave, as it can between two pooled
//! instances). The log is fsynced by the [`KvFlusher`] thread at most [`FLUSH_DELAY`] after a
//! change and at shutdown, and compacted (rewritten as one record per live entry, to a temporary
//! file renamed over it, under the lock) when it grows past twice its live size; a process that
//! still has the old file open notices the new inode and reloads.
//!
//! Format: the magic line `PRXKV2\n`, then records `op (1 = set, 2 = delete) · key length (u32
//! LE) · value length (u32 LE) · key · value · CRC-32 of all of that`. A record cut short or
//! failing its CRC ends what is read: a reader stops there, and the next writer (holding the
//! lock, so no append is in progress) truncates it away — a crash mid-append loses that record
//! only. A file that does not start with the magic is moved aside (`<plugin>.corrupt`) with a
//! warning and the store starts empty; a `PRXKV1` file (the former snapshot format) is
//! converted. Temporary files a crash left are removed whenever the lock is taken at open.
//!
//! The file is read as hostile input (it sits in the workspace): opened without following a
//! symbolic link and without waiting (a FIFO), refused unless it is a regular file, read
//! [`READ_CHUNK`] (or one record) at a time whatever length it claims, and set aside by a
//! rename, never a copy (it may be a sparse terabyte).
//!
//! The size cap (`max_kv_storage_mb`) counts each entry's key and value bytes plus
//! [`ENTRY_OVERHEAD`] (what an entry costs in memory besides its bytes), so a store of empty
//! values stays within its cap in memory too; a `set` that would pass it is refused with an
//! error the guest sees.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod flush;

pub(super) use flush::KvFlusher;

/// How long after a change the log is fsynced (the promise is "durable within 1 s").
pub const FLUSH_DELAY: Duration = Duration::from_millis(200);
/// The longest key the store accepts.
pub(super) const MAX_KEY_BYTES: usize = 4096;
/// The longest value the store accepts.
pub(super) const MAX_VALUE_BYTES: usize = 64 << 20;
/// What each entry counts against the cap besides its key and value bytes: its share of the
/// map's nodes and the allocations behind its key and value (measured: ~120 bytes).
pub(super) const ENTRY_OVERHEAD: u64 = 128;
/// How long a write waits for another process's lock before it fails.
const LOCK_WAIT: Duration = Duration::from_secs(2);

const MAGIC: &[u8] = b"PRXKV2\n";
const MAGIC_V1: &[u8] = b"PRXKV1\n";
const SET: u8 = 1;
const DELETE: u8 = 2;
/// op, key length, value length.
const HEADER: usize = 9;
const CRC: usize = 4;

/// One plugin's store.
pub(super) struct KvStore {
    plugin: String,
    /// Held by a write from before it waits for the file lock until it is done.
    writer: Mutex<()>,
    inner: Mutex<Inner>,
}

struct Inner {
    map: BTreeMap<Box<str>, Box<[u8]>>,
    bytes: u64,
    cap: u64,
    /// `None`: in memory only (`validate`, or the file could not be opened).
    log: Option<Log>,
}

/// The open log file.
struct Log {
    path: PathBuf,
    lock: File,
    file: File,
    /// Identity of `file` (a compaction by another process replaces the path's inode).
    ino: (u64, u64),
    /// How far `file` has been read (and applied).
    offset: u64,
    /// Bytes of records that are still live (what a compaction would write).
    live: u64,
    /// Appended since the last fsync.
    dirty: bool,
}

fn entry_size(key: &str, value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64 + ENTRY_OVERHEAD
}

fn record_len(key: &str, value: &[u8]) -> u64 {
    (HEADER + key.len() + value.len() + CRC) as u64
}

fn encode(out: &mut Vec<u8>, op: u8, key: &str, value: &[u8]) {
    let start = out.len();
    out.push(op);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// One decoded record.
struct Record<'a> {
    op: u8,
    key: &'a str,
    value: &'a [u8],
}

/// What starts a buffer of log bytes.
enum Next<'a> {
    /// A complete, valid record, and the bytes it spans.
    Record(Record<'a>, usize),
    /// The start of a record that may be valid: this many bytes would hold it whole.
    Short(usize),
    /// Not a record (a bad op, a length past the limits, a CRC or UTF-8 failure).
    Bad,
}

/// The record at the start of `buf`.
fn next_record(buf: &[u8]) -> Next<'_> {
    let Some(head) = buf.get(..HEADER) else {
        return Next::Short(HEADER);
    };
    let op = head[0];
    let klen = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    let vlen = u32::from_le_bytes(head[5..9].try_into().expect("4 bytes")) as usize;
    if !(op == SET || op == DELETE) || klen > MAX_KEY_BYTES || vlen > MAX_VALUE_BYTES {
        return Next::Bad;
    }
    let end = HEADER + klen + vlen;
    let Some(crc) = buf.get(end..end + CRC) else {
        return Next::Short(end + CRC);
    };
    if crc32fast::hash(&buf[..end]).to_le_bytes() != crc {
        return Next::Bad;
    }
    let Ok(key) = std::str::from_utf8(&buf[HEADER..HEADER + klen]) else {
        return Next::Bad;
    };
    Next::Record(
        Record {
            op,
            key,
            value: &buf[HEADER + klen..end],
        },
        end + CRC,
    )
}

/// How much of a log is read at a time when catching up: what is held besides the map is this
/// or one record, whichever is larger, however large the file claims to be.
const READ_CHUNK: usize = 1 << 20;

/// The former format: a snapshot of length-prefixed keys and values.
fn decode_v1(mut bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let take = |bytes: &mut &[u8]| -> Option<Vec<u8>> {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (value, rest) = rest.split_at_checked(len)?;
        *bytes = rest;
        Some(value.to_vec())
    };
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = String::from_utf8(take(&mut bytes)?).ok()?;
        out.push((key, take(&mut bytes)?));
    }
    Some(out)
}

impl Inner {
    fn apply(&mut self, op: u8, key: &str, value: &[u8]) {
        if let Some(old) = self.map.remove(key) {
            self.bytes -= entry_size(key, &old);
            if let Some(log) = &mut self.log {
                log.live = log.live.saturating_sub(record_len(key, &old));
            }
        }
        if op == SET {
            self.bytes += entry_size(key, value);
            if let Some(log) = &mut self.log {
                log.live += record_len(key, value);
            }
            self.map.insert(key.into(), value.into());
        }
    }

    /// Empties the map and reads `log`'s file from its start.
    fn reload(&mut self) -> io::Result<()> {
        self.map.clear();
        self.bytes = 0;
        if let Some(log) = &mut self.log {
            log.offset = MAGIC.len() as u64;
            log.live = 0;
        }
        self.catch_up(false)
    }

    /// Applies what other processes appended since the last look. Without the lock, a record
    /// cut short or bad is left for later; with it (`locked`), it is truncated away (nobody can
    /// be appending).
    fn catch_up(&mut self, locked: bool) -> io::Result<()> {
        let Some(log) = &mut self.log else {
            return Ok(());
        };
        let md = std::fs::metadata(&log.path)?;
        if (md.dev(), md.ino()) != log.ino {
            // Compacted (or replaced) by another process: start over from the new file.
            log.file = open_log(&log.path)?;
            let fmd = log.file.metadata()?;
            log.ino = (fmd.dev(), fmd.ino());
            return self.reload();
        }
        let mut end = md.len();
        if end == log.offset {
            return Ok(());
        }
        // Read in chunks (a record at most 64 MiB), never the whole file at once: its length
        // is whatever the file says, a sparse terabyte included.
        let mut pos = log.offset;
        let mut read_to = log.offset;
        let mut buf: Vec<u8> = Vec::new();
        let mut records = Vec::new();
        loop {
            let mut used = 0;
            let need = loop {
                match next_record(&buf[used..]) {
                    Next::Record(r, n) => {
                        records.push((r.op, r.key.to_string(), r.value.to_vec()));
                        used += n;
                    }
                    Next::Short(n) => break Some(n),
                    Next::Bad => break None,
                }
            };
            buf.drain(..used);
            pos += used as u64;
            let log = self.log.as_mut().expect("checked above");
            log.offset = pos;
            for (op, key, value) in records.drain(..) {
                self.apply(op, &key, &value);
            }
            let Some(need) = need else { break };
            if read_to >= end {
                break;
            }
            let want = (need.saturating_sub(buf.len()).max(READ_CHUNK) as u64).min(end - read_to);
            let have = buf.len();
            buf.resize(have + want as usize, 0);
            let log = self.log.as_ref().expect("checked above");
            let n = read_at_most(&log.file, &mut buf[have..], read_to)?;
            buf.truncate(have + n);
            read_to += n as u64;
            if n == 0 {
                // Shorter than it said (truncated meanwhile).
                end = read_to;
            }
        }
        let log = self.log.as_mut().expect("checked above");
        if log.offset < end && locked {
            // A record cut short or a bad one, and nobody can be appending: drop it.
            log.file.set_len(log.offset)?;
        }
        Ok(())
    }
}

fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn open_log(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(NO_FOLLOW_NO_WAIT)
        .open(path)?;
    regular(file)
}

/// How the store's files are opened: never through a symbolic link (the store is the host's
/// own file, not wherever a link in the workspace points), and without waiting (a FIFO in its
/// place must not block the open); [`regular`] then refuses anything but a regular file.
const NO_FOLLOW_NO_WAIT: i32 = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY;

/// `file` if it is a regular file (checked on the descriptor, not by name).
fn regular(file: File) -> io::Result<File> {
    if file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ))
    }
}

/// Largest file in the former format that is converted (a larger one is set aside).
const MAX_V1_BYTES: u64 = 2 << 30;

/// How long a write may wait for another process's lock: until `until` (at most
/// [`LOCK_WAIT`] from now), and not past `stop` returning true. A guest's write waits no longer
/// than its call's deadline and stops waiting at shutdown or when its version is retired
/// (ARCHITECTURE.md § WASM plugins, "every blocking host path ends at the deadline").
pub(super) struct Wait<'a> {
    pub until: Instant,
    pub stop: &'a dyn Fn() -> bool,
}

impl Wait<'_> {
    /// [`LOCK_WAIT`], nothing stops it (tests).
    #[cfg(test)]
    fn plain() -> Wait<'static> {
        Wait {
            until: Instant::now() + LOCK_WAIT,
            stop: &|| false,
        }
    }
}

/// Why a write did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KvError {
    /// Refused (a limit, an I/O error): the message the guest sees.
    Refused(String),
    /// The wait for another process's lock reached the call's deadline or its stop signal: the
    /// call itself must end (the host raises the interruption).
    GaveUp,
}

impl std::fmt::Display for KvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvError::Refused(m) => f.write_str(m),
            KvError::GaveUp => f.write_str("kv: gave up waiting for the store's lock"),
        }
    }
}

/// Takes the exclusive lock on `lock`, waiting up to [`LOCK_WAIT`] and no longer than `wait`
/// allows. `Ok(false)`: `wait` ended first.
fn lock(lock: &File, wait: &Wait<'_>) -> io::Result<bool> {
    let until = (Instant::now() + LOCK_WAIT).min(wait.until);
    let hard = Instant::now() + LOCK_WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(true),
            Err(std::fs::TryLockError::WouldBlock) => {
                if (wait.stop)() {
                    return Ok(false);
                }
                let now = Instant::now();
                if now >= until {
                    if now < hard {
                        return Ok(false);
                    }
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "another process holds the store's lock",
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

impl KvStore {
    /// Opens (or starts) the store of `plugin` under `dir` with a cap of `cap` bytes. A store
    /// that cannot be opened works in memory only, with a warning.
    #[cfg(test)]
    pub(super) fn open(dir: &Path, plugin: &str, cap: u64) -> KvStore {
        KvStore::open_waiting(dir, plugin, cap, &|| false)
    }

    /// [`open`](KvStore::open), giving up waiting for another process's lock (a new store
    /// needs it to write its first bytes; an existing log is opened without it) when `stop`
    /// says so.
    pub(super) fn open_waiting(
        dir: &Path,
        plugin: &str,
        cap: u64,
        stop: &dyn Fn() -> bool,
    ) -> KvStore {
        let mut inner = Inner {
            map: BTreeMap::new(),
            bytes: 0,
            cap,
            log: None,
        };
        let wait = Wait {
            until: Instant::now() + LOCK_WAIT,
            stop,
        };
        if let Err(e) = open_into(&mut inner, dir, plugin, &wait) {
            tracing::warn!(plugin, dir = %dir.display(),
                "cannot open the kv store: {e}; it is kept in memory only");
            inner.log = None;
            inner.map.clear();
            inner.bytes = 0;
        }
        KvStore {
            plugin: plugin.to_string(),
            writer: Mutex::new(()),
            inner: Mutex::new(inner),
        }
    }

    /// A store that is never written to disk (`validate`'s probes).
    pub(super) fn in_memory(cap: u64) -> KvStore {
        KvStore {
            plugin: String::new(),
            writer: Mutex::new(()),
            inner: Mutex::new(Inner {
                map: BTreeMap::new(),
                bytes: 0,
                cap,
                log: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store, caught up with other processes' writes (a failure to read them is logged;
    /// what is known is used).
    fn fresh(&self) -> std::sync::MutexGuard<'_, Inner> {
        let mut inner = self.lock();
        if let Err(e) = inner.catch_up(false) {
            tracing::debug!(plugin = %self.plugin, "kv: cannot read other processes' writes: {e}");
        }
        inner
    }

    /// A new cap (the manifest changed). Existing entries stay even when over it; sets that grow
    /// the store are refused until it is under.
    pub(super) fn set_cap(&self, cap: u64) {
        self.lock().cap = cap;
    }

    #[cfg(test)]
    pub(super) fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.fresh().map.get(key).map(|v| v.to_vec())
    }

    /// `get`, refusing (with the value's length) a value longer than `max` bytes instead of
    /// copying it.
    pub(super) fn get_within(&self, key: &str, max: usize) -> Result<Option<Vec<u8>>, usize> {
        match self.fresh().map.get(key) {
            Some(v) if v.len() > max => Err(v.len()),
            v => Ok(v.map(|v| v.to_vec())),
        }
    }

    /// Stores `value` under `key`; refuses keys over [`MAX_KEY_BYTES`], values over
    /// [`MAX_VALUE_BYTES`] and growth past the cap.
    #[cfg(test)]
    pub(super) fn set(&self, key: &str, value: Vec<u8>) -> Result<(), String> {
        self.set_waiting(key, value, &Wait::plain())
            .map_err(|e| e.to_string())
    }

    /// [`set`](KvStore::set), waiting for another process's lock no longer than `wait` allows.
    pub(super) fn set_waiting(
        &self,
        key: &str,
        value: Vec<u8>,
        wait: &Wait<'_>,
    ) -> Result<(), KvError> {
        if key.len() > MAX_KEY_BYTES {
            return Err(KvError::Refused(format!(
                "kv: key is {} bytes; the limit is {MAX_KEY_BYTES}",
                key.len()
            )));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(KvError::Refused(format!(
                "kv: value is {} bytes; the limit is {MAX_VALUE_BYTES}",
                value.len()
            )));
        }
        self.write_with(SET, key, &value, wait, |_| true)
    }

    #[cfg(test)]
    pub(super) fn delete(&self, key: &str) -> Result<bool, String> {
        self.delete_waiting(key, &Wait::plain())
            .map_err(|e| e.to_string())
    }

    /// Removes `key`; whether it was there. Waits for another process's lock no longer than
    /// `wait` allows.
    pub(super) fn delete_waiting(&self, key: &str, wait: &Wait<'_>) -> Result<bool, KvError> {
        let mut existed = false;
        self.write_with(DELETE, key, &[], wait, |inner| {
            existed = inner.map.contains_key(key);
            existed
        })?;
        Ok(existed)
    }

    /// Catches up and appends one record under the file lock, then applies it; `wanted` (seeing
    /// the caught-up store) says whether anything needs writing.
    fn write_with(
        &self,
        op: u8,
        key: &str,
        value: &[u8],
        wait: &Wait<'_>,
        wanted: impl FnOnce(&Inner) -> bool,
    ) -> Result<(), KvError> {
        let refused = |e: String| KvError::Refused(e);
        // Writers of this process take turns here, and wait for another process's lock here,
        // without holding the store's state: reads, `stats()` and the flusher never wait for
        // another process.
        let _turn = loop {
            match self.writer.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if (wait.stop)() || Instant::now() >= wait.until {
                        return Err(KvError::GaveUp);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        let lock_file = self
            .lock()
            .log
            .as_ref()
            .map(|log| log.lock.try_clone())
            .transpose()
            .map_err(|e| refused(format!("kv: {e}")))?;
        if let Some(f) = &lock_file
            && !lock(f, wait).map_err(|e| refused(format!("kv: {e}")))?
        {
            return Err(KvError::GaveUp);
        }
        let locked = lock_file;
        let mut inner = self.lock();
        let result = (|| {
            inner
                .catch_up(true)
                .map_err(|e| refused(format!("kv: cannot read the store: {e}")))?;
            if !wanted(&inner) {
                return Ok(());
            }
            if op == SET {
                let old = inner.map.get(key).map_or(0, |v| entry_size(key, v));
                let new = entry_size(key, value);
                if new > old && inner.bytes - old + new > inner.cap {
                    return Err(refused(format!(
                        "kv: storage limit of {} bytes reached ({} in use, each entry counting \
                         {ENTRY_OVERHEAD} bytes besides its key and value; max_kv_storage_mb in \
                         plugin.toml raises it)",
                        inner.cap, inner.bytes
                    )));
                }
            }
            if let Some(log) = &mut inner.log {
                let mut rec = Vec::with_capacity(record_len(key, value) as usize);
                encode(&mut rec, op, key, value);
                log.file
                    .write_all(&rec)
                    .map_err(|e| refused(format!("kv: cannot write the store: {e}")))?;
                log.offset += rec.len() as u64;
                log.dirty = true;
            }
            inner.apply(op, key, value);
            if let Err(e) = inner.compact_if_large() {
                tracing::warn!(plugin = %self.plugin, "kv: cannot compact the store: {e}");
            }
            Ok(())
        })();
        if let Some(l) = locked {
            let _ = l.unlock();
        }
        result
    }

    /// Keys starting with `prefix`, sorted.
    #[cfg(test)]
    pub(super) fn list_keys(&self, prefix: &str) -> Vec<String> {
        self.list_keys_within(prefix, usize::MAX).expect("no limit")
    }

    /// `list_keys`, refusing (with the bytes they take in a guest: each key's bytes and its
    /// 8-byte pointer and length) keys that take more than `max` bytes instead of copying them.
    pub(super) fn list_keys_within(&self, prefix: &str, max: usize) -> Result<Vec<String>, usize> {
        let inner = self.fresh();
        let keys = || {
            inner
                .map
                .range::<str, _>((
                    std::ops::Bound::Included(prefix),
                    std::ops::Bound::Unbounded,
                ))
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, _)| k)
        };
        let len: usize = keys().map(|k| k.len() + 8).sum();
        if len > max {
            return Err(len);
        }
        Ok(keys().map(|k| k.to_string()).collect())
    }

    /// Bytes the store counts against its cap (keys, values and per-entry overhead).
    pub(super) fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Makes what was appended durable (fsync), if anything was. The sync runs on a duplicate
    /// of the file's descriptor with the store's state unlocked: it takes as long as the disk
    /// wants, and calls (their `kv.get` included, which no deadline reaches inside the host)
    /// and `stats()` must not wait for it. A compaction meanwhile replaces the file with one it
    /// synced itself; syncing the old one is then merely useless.
    pub(super) fn flush(&self) -> io::Result<()> {
        let (file, path) = {
            let mut inner = self.lock();
            let Some(log) = &mut inner.log else {
                return Ok(());
            };
            if !log.dirty {
                return Ok(());
            }
            log.dirty = false;
            (log.file.try_clone(), log.path.clone())
        };
        let r = file.and_then(|f| f.sync_data());
        if let Err(e) = &r {
            if let Some(log) = &mut self.lock().log {
                log.dirty = true;
            }
            tracing::warn!(plugin = %self.plugin, file = %path.display(), "cannot write kv: {e}");
        }
        r
    }
}

impl Inner {
    /// Rewrites the log as one record per live entry when it is more than twice that (and
    /// more than 64 KiB). Called with the file lock held.
    fn compact_if_large(&mut self) -> io::Result<()> {
        let Some(log) = &self.log else {
            return Ok(());
        };
        if log.offset < (64 << 10) || log.offset < 2 * (log.live + MAGIC.len() as u64) {
            return Ok(());
        }
        let mut out = Vec::with_capacity((log.live + MAGIC.len() as u64) as usize);
        out.extend_from_slice(MAGIC);
        for (k, v) in &self.map {
            encode(&mut out, SET, k, v);
        }
        let path = log.path.clone();
        write_atomically(&path, &out)?;
        let log = self.log.as_mut().expect("checked above");
        log.file = open_log(&path)?;
        let md = log.file.metadata()?;
        log.ino = (md.dev(), md.ino());
        log.offset = md.len();
        log.live = out.len() as u64 - MAGIC.len() as u64;
        log.dirty = false;
        Ok(())
    }
}

/// Opens the log of `plugin` under `dir` into `inner`: takes the lock, removes temporary files
/// a crash left, converts or sets aside what is not a PRXKV2 log, and reads it. When another
/// process holds the lock (writing, compacting or opening the store) and the file already is a
/// PRXKV2 log, it is opened and read without the lock, as every read is, and the upkeep is left
/// to a later open: waiting would only delay the load, and giving up would leave the store in
/// memory only. Otherwise (a new store, a file to convert or set aside) it waits for the lock,
/// as `wait` allows.
fn open_into(inner: &mut Inner, dir: &Path, plugin: &str, wait: &Wait<'_>) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let path = dir.join(plugin);
    let lock_file = regular(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(NO_FOLLOW_NO_WAIT)
            .open(dir.join(format!("{plugin}.lock")))?,
    )?;
    match lock_file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            if let Some(log) = open_existing_log(&path, &lock_file)? {
                inner.log = Some(log);
                return inner.catch_up(false);
            }
            if !lock(&lock_file, wait)? {
                return Err(io::Error::other("gave up waiting for the store's lock"));
            }
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    let result = (|| {
        prune_temp_files(dir, plugin);
        let mut file = open_log(&path)?;
        let mut head = Vec::new();
        (&file).take(MAGIC.len() as u64).read_to_end(&mut head)?;
        if head.is_empty() {
            file.write_all(MAGIC)?;
        } else if head == MAGIC_V1 {
            let mut all = Vec::new();
            file.seek(SeekFrom::Start(0))?;
            (&file).take(MAX_V1_BYTES + 1).read_to_end(&mut all)?;
            let entries = if all.len() as u64 > MAX_V1_BYTES {
                None
            } else {
                decode_v1(&all[MAGIC_V1.len()..])
            };
            drop(all);
            let mut out = MAGIC.to_vec();
            for (k, v) in entries.iter().flatten() {
                encode(&mut out, SET, k, v);
            }
            if entries.is_none() {
                set_aside(dir, plugin, &path);
            }
            write_atomically(&path, &out)?;
            file = open_log(&path)?;
        } else if head != MAGIC {
            set_aside(dir, plugin, &path);
            write_atomically(&path, MAGIC)?;
            file = open_log(&path)?;
        }
        let md = file.metadata()?;
        inner.log = Some(Log {
            path: path.clone(),
            lock: lock_file.try_clone()?,
            file,
            ino: (md.dev(), md.ino()),
            offset: MAGIC.len() as u64,
            live: 0,
            dirty: false,
        });
        inner.catch_up(true)
    })();
    let _ = lock_file.unlock();
    result
}

/// The log at `path` if it exists and starts with the magic, opened without the lock (and
/// without creating anything).
fn open_existing_log(path: &Path, lock: &File) -> io::Result<Option<Log>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .custom_flags(NO_FOLLOW_NO_WAIT)
        .open(path)
    {
        Ok(f) => regular(f)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut head = Vec::new();
    (&file).take(MAGIC.len() as u64).read_to_end(&mut head)?;
    if head != MAGIC {
        return Ok(None);
    }
    let md = file.metadata()?;
    Ok(Some(Log {
        path: path.to_path_buf(),
        lock: lock.try_clone()?,
        file,
        ino: (md.dev(), md.ino()),
        offset: MAGIC.len() as u64,
        live: 0,
        dirty: false,
    }))
}

/// Moves a file that is not a kv log out of the way (renamed, never copied: it may be a sparse
/// terabyte); the caller then writes a new log in its place.
fn set_aside(dir: &Path, plugin: &str, path: &Path) {
    let aside = dir.join(format!("{plugin}.corrupt"));
    tracing::warn!(plugin, file = %path.display(),
        "kv file is corrupt; moved to {} and starting empty", aside.display());
    let _ = std::fs::rename(path, &aside);
}

/// Removes `.<plugin>.*.tmp` files (a compaction or conversion a crash interrupted). Called
/// with the lock held, so none of them is being written.
fn prune_temp_files(dir: &Path, plugin: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{plugin}.");
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_cap() {
        let dir = tempfile::tempdir().unwrap();
        let cap = 2 * ENTRY_OVERHEAD + 25;
        let kv = KvStore::open(dir.path(), "p", cap);
        kv.set("count", b"41".to_vec()).unwrap();
        kv.set("count", b"42".to_vec()).unwrap();
        kv.set("count.tool_call", b"1".to_vec()).unwrap();
        assert_eq!(kv.bytes(), 7 + 16 + 2 * ENTRY_OVERHEAD);
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
        let again = KvStore::open(dir.path(), "p", cap);
        assert_eq!(again.get("count").as_deref(), Some(&b"42"[..]));
        assert_eq!(again.delete("count"), Ok(true));
        assert_eq!(again.delete("count"), Ok(false));
        assert_eq!(again.bytes(), 15 + ENTRY_OVERHEAD);
    }

    #[test]
    fn empty_values_count_their_overhead() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), "p", 100 * (ENTRY_OVERHEAD + 8));
        let stored = (0..1000)
            .take_while(|n| kv.set(&format!("k{n:07}"), Vec::new()).is_ok())
            .count();
        assert_eq!(stored, 100);
    }

    #[test]
    fn two_stores_on_one_file_lose_no_writes() {
        let dir = tempfile::tempdir().unwrap();
        let a = KvStore::open(dir.path(), "p", u64::MAX);
        let b = KvStore::open(dir.path(), "p", u64::MAX);
        for n in 0..50 {
            a.set(&format!("a{n}"), b"x".to_vec()).unwrap();
            b.set(&format!("b{n}"), b"y".to_vec()).unwrap();
        }
        // Each sees the other's writes at once, and a fresh open sees all of them.
        assert_eq!(a.get("b49").as_deref(), Some(&b"y"[..]));
        assert_eq!(b.get("a0").as_deref(), Some(&b"x"[..]));
        assert_eq!(
            KvStore::open(dir.path(), "p", u64::MAX).list_keys("").len(),
            100
        );
    }

    #[test]
    fn compaction_keeps_the_file_small_and_other_handles_follow() {
        let dir = tempfile::tempdir().unwrap();
        let a = KvStore::open(dir.path(), "p", u64::MAX);
        let b = KvStore::open(dir.path(), "p", u64::MAX);
        let value = vec![7u8; 1000];
        for n in 0..2000 {
            a.set("hot", value.clone()).unwrap();
            if n % 100 == 0 {
                b.set(&format!("b{n}"), b"y".to_vec()).unwrap();
            }
        }
        let len = std::fs::metadata(dir.path().join("p")).unwrap().len();
        assert!(len < 200_000, "{len}");
        assert_eq!(b.get("hot").as_deref(), Some(&value[..]));
        assert_eq!(a.list_keys("b").len(), 20);
    }

    #[test]
    fn a_torn_tail_is_ignored_and_then_cut() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), "p", u64::MAX);
        kv.set("k", b"v".to_vec()).unwrap();
        drop(kv);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("p"))
            .unwrap();
        f.write_all(&[SET, 200, 0, 0, 0, 1]).unwrap();
        std::fs::write(dir.path().join(".p.999.0.tmp"), b"left by a crash").unwrap();
        let kv = KvStore::open(dir.path(), "p", u64::MAX);
        assert_eq!(kv.get("k").as_deref(), Some(&b"v"[..]));
        assert!(!dir.path().join(".p.999.0.tmp").exists());
        kv.set("k2", b"v2".to_vec()).unwrap();
        let again = KvStore::open(dir.path(), "p", u64::MAX);
        assert_eq!(again.get("k2").as_deref(), Some(&b"v2"[..]));
    }

    #[test]
    fn the_former_format_is_converted_and_garbage_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mut v1 = MAGIC_V1.to_vec();
        for (k, v) in [("a", "1"), ("b", "22")] {
            v1.extend_from_slice(&(k.len() as u32).to_le_bytes());
            v1.extend_from_slice(k.as_bytes());
            v1.extend_from_slice(&(v.len() as u32).to_le_bytes());
            v1.extend_from_slice(v.as_bytes());
        }
        std::fs::write(dir.path().join("p"), &v1).unwrap();
        let kv = KvStore::open(dir.path(), "p", u64::MAX);
        assert_eq!(kv.get("b").as_deref(), Some(&b"22"[..]));
        std::fs::write(dir.path().join("q"), b"garbage").unwrap();
        let kv = KvStore::open(dir.path(), "q", u64::MAX);
        assert!(kv.list_keys("").is_empty());
        assert!(dir.path().join("q.corrupt").exists());
    }

    #[test]
    fn flusher_syncs_within_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let flusher = KvFlusher::start().unwrap();
        let kv = Arc::new(KvStore::open(dir.path(), "p", 1 << 20));
        flusher.register(&kv);
        kv.set("k", b"v".to_vec()).unwrap();
        flusher.touch();
        let deadline = Instant::now() + Duration::from_secs(5);
        while kv.lock().log.as_ref().unwrap().dirty {
            assert!(Instant::now() < deadline, "kv was not synced");
            std::thread::sleep(Duration::from_millis(10));
        }
        let again = KvStore::open(dir.path(), "p", 1 << 20);
        assert_eq!(again.get("k").as_deref(), Some(&b"v"[..]));
    }
}

#[cfg(test)]
mod wait_tests {
    use super::*;

    #[test]
    fn the_storage_limit_error_reads_as_one_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), "p", 200);
        let e = kv.set("k", vec![0; 100]).unwrap_err();
        assert!(
            e.starts_with("kv: storage limit of 200 bytes reached"),
            "{e}"
        );
        assert!(!e.contains("  "), "stray spaces: {e:?}");
        assert!(
            e.contains("counting 128 bytes besides its key and value; max_kv_storage_mb"),
            "{e}"
        );
    }

    #[test]
    fn a_write_stops_waiting_for_another_processs_lock_at_its_deadline_or_stop() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), "p", 1 << 20);
        let other = File::options()
            .write(true)
            .open(dir.path().join("p.lock"))
            .unwrap();
        other.lock().unwrap();
        let t = Instant::now();
        let wait = Wait {
            until: Instant::now() + Duration::from_millis(50),
            stop: &|| false,
        };
        assert_eq!(
            kv.set_waiting("k", b"v".to_vec(), &wait),
            Err(KvError::GaveUp)
        );
        assert!(t.elapsed() < LOCK_WAIT, "{:?}", t.elapsed());
        let stop = std::sync::atomic::AtomicBool::new(true);
        let wait = Wait {
            until: Instant::now() + Duration::from_secs(3600),
            stop: &|| stop.load(std::sync::atomic::Ordering::Relaxed),
        };
        assert_eq!(kv.delete_waiting("k", &wait), Err(KvError::GaveUp));
        // Without a deadline before it, the wait still ends at LOCK_WAIT, refused.
        let wait = Wait {
            until: Instant::now() + Duration::from_secs(3600),
            stop: &|| false,
        };
        assert!(matches!(
            kv.set_waiting("k", b"v".to_vec(), &wait),
            Err(KvError::Refused(_))
        ));
        other.unlock().unwrap();
        assert_eq!(kv.set_waiting("k", b"v".to_vec(), &Wait::plain()), Ok(()));
    }
}
