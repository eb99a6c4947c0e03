//! What the WASM test binaries share: the built guest components, installing a plugin into a
//! workspace, and reading a plugin's kv file from disk (the persistence format of
//! src/wasm/kv.rs, read independently of the code that writes it).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

/// A built guest component; fails with the build command when it is missing.
pub fn guest(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/plugins/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the guest plugins first with `bash examples/build-plugins.sh`",
        path.display()
    );
    path
}

/// Installs `component` with `toml` as `<ws>/plugins/<name>/`.
pub fn install(ws: &Path, name: &str, component: &str, toml: &str) -> PathBuf {
    let dir = ws.join("plugins").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(guest(component), dir.join("plugin.wasm")).unwrap();
    std::fs::write(dir.join("plugin.toml"), toml).unwrap();
    dir
}

/// The audit-hook's own manifest, as users copy it.
pub fn audit_manifest() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/audit-hook/plugin.toml"),
    )
    .unwrap()
}

/// One value of a plugin's kv file, read independently of the code that writes it: the magic
/// `PRXKV2\n`, then records `op (1 set, 2 delete) · key length u32 LE · value length u32 LE ·
/// key · value · CRC-32`; the last record of a key wins. A record cut short ends the file.
pub fn kv_get(ws: &Path, plugin: &str, key: &str) -> Option<Vec<u8>> {
    let bytes = std::fs::read(ws.join(".prx-hooks/kv").join(plugin)).ok()?;
    let mut rest = bytes.strip_prefix(b"PRXKV2\n").expect("kv magic");
    let mut value = None;
    while rest.len() >= 9 {
        let op = rest[0];
        let klen = u32::from_le_bytes(rest[1..5].try_into().unwrap()) as usize;
        let vlen = u32::from_le_bytes(rest[5..9].try_into().unwrap()) as usize;
        if rest.len() < 9 + klen + vlen + 4 {
            break;
        }
        let k = &rest[9..9 + klen];
        if k == key.as_bytes() {
            value = (op == 1).then(|| rest[9 + klen..9 + klen + vlen].to_vec());
        }
        rest = &rest[9 + klen + vlen + 4..];
    }
    value
}

/// A kv value that the guests store as decimal text (0 when absent).
pub fn kv_count(ws: &Path, plugin: &str, key: &str) -> u64 {
    kv_get(ws, plugin, key)
        .map(|v| String::from_utf8(v).unwrap().parse().unwrap())
        .unwrap_or(0)
}
