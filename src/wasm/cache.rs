//! The compile cache: native code compiled from plugins' components, kept per user, outside
//! every workspace, and authenticated, so that the only bytes ever deserialized (run as native
//! code) are bytes this user's prx-hooks wrote.
//!
//! Where: `$XDG_CACHE_HOME/prx-hooks/wasm/` (else `$HOME/.cache/prx-hooks/wasm/`) holds the
//! entries; `$XDG_STATE_HOME/prx-hooks/cache.key` (else `$HOME/.local/state/prx-hooks/…`) holds a
//! 32-byte secret key, created once with mode 0600 (written to a temporary file, then linked into
//! place, so a second process never reads half a key). Both `prx-hooks` directories are created
//! 0700 and must be directories (not symbolic links) owned by the effective user and writable by
//! no one else; the key must be a regular file owned by the user with no group or other access.
//! When any of this does not hold, or there is no usable `HOME`, the host runs uncached (it
//! compiles every time) and says why once.
//!
//! An entry is `<sha256 of the .wasm and the engine's compatibility hash>.cwasm`: the magic
//! `PRXCW1\n\0`, an HMAC-SHA256 tag, then the serialized component. The tag covers the entry's
//! name and its contents, so an entry copied to another name (another plugin's), edited,
//! truncated or planted by anyone who cannot read the key is refused and recompiled. An entry is
//! read into memory, checked, and only then deserialized: changing the file afterwards changes
//! nothing that runs (wasmtime's `deserialize_file` would map it). What it does not protect
//! against: anyone who can read the key (the same user, root) can forge entries — but they can
//! already run code as that user.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const MAGIC: &[u8; 8] = b"PRXCW1\n\0";
const TAG: usize = 32;
/// What the tag is computed over starts with this (domain separation).
const DOMAIN: &[u8] = b"prx-hooks compile cache v1\0";
/// Largest entry read (a serialized component is a few times its .wasm).
const MAX_ENTRY: u64 = 1 << 30;
/// Entries not used for this long are removed.
const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Temporary files older than this are leftovers of a crash.
const STALE_TMP: Duration = Duration::from_secs(3600);

type HmacSha256 = Hmac<Sha256>;

/// An opened, checked cache directory and its key.
pub struct CompileCache {
    dir: PathBuf,
    key: [u8; 32],
}

impl std::fmt::Debug for CompileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileCache")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The default places: (entries directory, key file), from `XDG_CACHE_HOME` / `XDG_STATE_HOME`
/// when they are absolute paths, else from `HOME`.
pub(super) fn default_paths() -> Result<(PathBuf, PathBuf), String> {
    let var = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let home = var("HOME");
    let root = |xdg: &str, under_home: &str| {
        var(xdg)
            .or_else(|| home.as_ref().map(|h| h.join(under_home)))
            .ok_or_else(|| format!("neither ${xdg} nor $HOME is an absolute path"))
    };
    let cache = root("XDG_CACHE_HOME", ".cache")?;
    let state = root("XDG_STATE_HOME", ".local/state")?;
    Ok((
        cache.join("prx-hooks").join("wasm"),
        state.join("prx-hooks").join("cache.key"),
    ))
}

impl CompileCache {
    /// The user's cache at the default places; `Err` says why there is none.
    pub fn open_default() -> Result<CompileCache, String> {
        let (dir, key) = default_paths()?;
        CompileCache::open(&dir, &key)
    }

    /// Opens (creating when missing) the entries directory `dir` and the key file `key_file`,
    /// checking owner and modes as the module doc says.
    pub fn open(dir: &Path, key_file: &Path) -> Result<CompileCache, String> {
        private_dir(dir)?;
        let key_dir = key_file
            .parent()
            .ok_or_else(|| format!("{}: no parent directory", key_file.display()))?;
        private_dir(key_dir)?;
        let key = read_or_create_key(key_file)?;
        let cache = CompileCache {
            dir: dir.to_path_buf(),
            key,
        };
        cache.prune();
        Ok(cache)
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry name for `wasm` compiled by an engine with `engine_hash`
    /// (`Engine::precompile_compatibility_hash`).
    pub fn entry_name(&self, wasm: &[u8], engine_hash: impl Hash) -> String {
        struct ShaHasher(Sha256);
        impl Hasher for ShaHasher {
            fn write(&mut self, bytes: &[u8]) {
                self.0.update(bytes);
            }
            fn finish(&self) -> u64 {
                0
            }
        }
        let mut h = ShaHasher(Sha256::new());
        h.write(wasm);
        engine_hash.hash(&mut h);
        h.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.cwasm"))
    }

    fn mac(&self, name: &str, payload: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(DOMAIN);
        mac.update(name.as_bytes());
        mac.update(b"\0");
        mac.update(payload);
        mac
    }

    /// The serialized component stored under `name`, if there is an entry and its tag checks
    /// out; `None` otherwise (a refused entry is logged and left to be replaced).
    pub fn load(&self, name: &str) -> Option<Vec<u8>> {
        let path = self.path(name);
        let bytes = match read_own_file(&path, MAX_ENTRY) {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(why) => {
                tracing::warn!(file = %path.display(), "compile cache entry refused: {why}; recompiling");
                return None;
            }
        };
        let ok = bytes.len() >= MAGIC.len() + TAG
            && bytes.starts_with(MAGIC)
            && self
                .mac(name, &bytes[MAGIC.len() + TAG..])
                .verify_slice(&bytes[MAGIC.len()..MAGIC.len() + TAG])
                .is_ok();
        if !ok {
            tracing::warn!(file = %path.display(),
                "compile cache entry refused: it was not written by this user's prx-hooks for this \
                 component (its HMAC does not check out); recompiling");
            return None;
        }
        // Marks it as used, for pruning.
        if let Ok(f) = std::fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        let mut bytes = bytes;
        bytes.drain(..MAGIC.len() + TAG);
        Some(bytes)
    }

    /// Stores `payload` (a serialized component) under `name`: a temporary file, fsynced, then
    /// renamed into place. Failures are logged and otherwise ignored (the cache is an
    /// optimization).
    pub fn store(&self, name: &str, payload: &[u8]) {
        let tag = self.mac(name, payload).finalize().into_bytes();
        let path = self.path(name);
        let tmp = self
            .dir
            .join(format!(".{name}.{}.{}.tmp", std::process::id(), unique()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(MAGIC)?;
            f.write_all(&tag)?;
            f.write_all(payload)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(file = %path.display(), "cannot write the compile cache: {e}");
        }
    }

    /// Removes entries unused for 30 days and temporary files a crash left.
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            let max_age = if name.ends_with(".tmp") {
                STALE_TMP
            } else if name.ends_with(".cwasm") {
                MAX_AGE
            } else {
                continue;
            };
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > max_age);
            if old {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

/// A number no other call in this process returns (temporary file names).
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Creates `dir` (0700) when missing, then checks that it is a directory, not a symbolic link,
/// owned by the effective user and writable by no one else.
fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let md = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    if md.file_type().is_symlink() {
        return Err(format!(
            "{} is a symbolic link; it must be a directory of its own",
            dir.display()
        ));
    }
    if !md.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if md.uid() != euid() {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {})",
            dir.display(),
            md.uid(),
            euid()
        ));
    }
    if md.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by others (mode {:o}); chmod 700 it",
            dir.display(),
            md.mode() & 0o777
        ));
    }
    Ok(())
}

/// Reads a regular file owned by this user, refusing symbolic links and files larger than
/// `max`; `Ok(None)` when it does not exist.
fn read_own_file(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    let md = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    if !md.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if md.uid() != euid() {
        return Err(format!("it belongs to uid {}, not to this user", md.uid()));
    }
    if md.len() > max {
        return Err(format!("it is larger than {max} bytes"));
    }
    let f = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let opened = f.metadata().map_err(|e| format!("cannot read it: {e}"))?;
    if (opened.dev(), opened.ino()) != (md.dev(), md.ino()) {
        return Err("it was replaced while being opened".into());
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    Ok(Some(bytes))
}

/// The key in `path`, creating it (32 random bytes, mode 0600) when there is none.
fn read_or_create_key(path: &Path) -> Result<[u8; 32], String> {
    for _ in 0..2 {
        match read_own_file(path, 64) {
            Ok(Some(bytes)) => {
                let md = std::fs::metadata(path)
                    .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
                if md.permissions().mode() & 0o077 != 0 {
                    return Err(format!(
                        "{} is readable by others (mode {:o}): a leaked key lets anyone plant \
                         native code; delete it (a new one is made)",
                        path.display(),
                        md.permissions().mode() & 0o777
                    ));
                }
                return bytes.try_into().map_err(|b: Vec<u8>| {
                    format!(
                        "{} holds {} bytes, not a 32-byte key; delete it (a new one is made)",
                        path.display(),
                        b.len()
                    )
                });
            }
            Ok(None) => create_key(path)?,
            Err(why) => return Err(format!("{}: {why}", path.display())),
        }
    }
    Err(format!("{}: cannot create the key", path.display()))
}

/// Writes a new key to a temporary file and links it into place; losing a race with another
/// process is fine (the caller reads whichever key won).
fn create_key(path: &Path) -> Result<(), String> {
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    let tmp = path.with_extension(format!("{}.{}.tmp", std::process::id(), unique()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()?;
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    result.map_err(|e| format!("cannot create {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(root: &Path) -> CompileCache {
        CompileCache::open(
            &root.join("c/prx-hooks/wasm"),
            &root.join("s/prx-hooks/cache.key"),
        )
        .unwrap()
    }

    #[test]
    fn an_entry_round_trips_and_is_bound_to_its_name() {
        let root = tempfile::tempdir().unwrap();
        let c = cache(root.path());
        let (a, b) = (c.entry_name(b"wasm a", 1u64), c.entry_name(b"wasm b", 1u64));
        assert_ne!(a, c.entry_name(b"wasm a", 2u64));
        c.store(&a, b"code of a");
        c.store(&b, b"code of b");
        assert_eq!(c.load(&a).as_deref(), Some(&b"code of a"[..]));
        // Another plugin's entry copied over this one: refused.
        std::fs::copy(c.path(&b), c.path(&a)).unwrap();
        assert_eq!(c.load(&a), None);
        // Truncated or flipped: refused.
        let full = std::fs::read(c.path(&b)).unwrap();
        std::fs::write(c.path(&b), &full[..full.len() - 1]).unwrap();
        assert_eq!(c.load(&b), None);
        let mut flipped = full.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(c.path(&b), &flipped).unwrap();
        assert_eq!(c.load(&b), None);
        // Another key (another user's cache, or a key deleted since): refused.
        std::fs::write(c.path(&b), &full).unwrap();
        assert!(c.load(&b).is_some());
        std::fs::remove_file(root.path().join("s/prx-hooks/cache.key")).unwrap();
        assert_eq!(cache(root.path()).load(&b), None);
    }

    #[test]
    fn modes_owner_and_symlinks_are_checked() {
        let root = tempfile::tempdir().unwrap();
        let c = cache(root.path());
        let key = root.path().join("s/prx-hooks/cache.key");
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(c.dir()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = CompileCache::open(c.dir(), &key).unwrap_err();
        assert!(err.contains("readable by others"), "{err}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(c.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = CompileCache::open(c.dir(), &key).unwrap_err();
        assert!(err.contains("writable by others"), "{err}");
        // A symbolic link in place of the directory.
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let link = root.path().join("c2/prx-hooks");
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = CompileCache::open(&link, &key).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        // An entry that is a symbolic link is not followed.
        std::fs::set_permissions(c.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let c = cache(root.path());
        let name = c.entry_name(b"x", 0u64);
        c.store(&name, b"payload");
        let real = root.path().join("real.cwasm");
        std::fs::rename(c.path(&name), &real).unwrap();
        std::os::unix::fs::symlink(&real, c.path(&name)).unwrap();
        assert_eq!(c.load(&name), None);
    }
}
