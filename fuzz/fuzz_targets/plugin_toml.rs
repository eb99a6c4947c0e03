//! `wasm::manifest::parse` (plugin.toml validation) on arbitrary bytes (UTF-8 as is, anything
//! else decoded with replacement).
//!
//! * never panics, and is deterministic (a second parse gives the same manifest or errors);
//! * `Err`: every error is one line of the shape `plugins/p/plugin.toml:LINE:COL: PATH: reason`,
//!   with LINE and COL ≥ 1 and LINE within the file, a non-empty path and reason, at most
//!   `MAX_ERRORS` + 1 of them;
//! * `Ok`: every invariant the plugin host relies on holds — the name is valid and the
//!   directory's (a different written name is only a warning; warnings have the errors' shape), the version non-empty, the component a regular file inside the plugin
//!   directory (also once symbolic links are resolved), every resource in range, every pattern
//!   already normalized (normalizing it again changes nothing), without repeats, equal to the hook
//!   capabilities' patterns, `events` their lifecycle mask, permissions known and `events`
//!   consistent with them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::event::EventMask;
use prx_hooks::wasm::manifest::{self, Manifest};
use prx_hooks_fuzz::assert_one_line;
use std::path::PathBuf;
use std::sync::OnceLock;

const LABEL: &str = "plugins/p/plugin.toml";

/// A plugin directory `p` with `plugin.wasm`, `sub/x.wasm`, a directory `dir.wasm` and a
/// symbolic link `out.wasm` to a file outside, so `wasm` values have something to resolve to.
fn plugin_dir() -> &'static (PathBuf, PathBuf) {
    static DIR: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIR.get_or_init(|| {
        // One fixed directory (created idempotently, so parallel jobs can share it): runs
        // leave nothing new behind.
        let root = std::env::temp_dir().join("prx-hooks-fuzz-plugins");
        let dir = root.join("p");
        let _ = std::fs::create_dir_all(dir.join("sub"));
        let _ = std::fs::create_dir_all(dir.join("dir.wasm"));
        let _ = std::fs::write(dir.join("plugin.wasm"), b"\0asm");
        let _ = std::fs::write(dir.join("sub/x.wasm"), b"\0asm");
        let _ = std::fs::write(root.join("outside.wasm"), b"\0asm");
        let _ = std::os::unix::fs::symlink(root.join("outside.wasm"), dir.join("out.wasm"));
        let canon = dir.canonicalize().unwrap();
        (dir, canon)
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (dir, canon) = plugin_dir();
    let first = manifest::parse(&text, LABEL, dir);
    let second = manifest::parse(&text, LABEL, dir);
    assert_eq!(first, second, "parse is not deterministic");
    match first {
        Err(errs) => {
            assert!(!errs.is_empty(), "Err with no error");
            assert!(
                errs.len() <= manifest::MAX_ERRORS + 1,
                "{} errors",
                errs.len()
            );
            let lines = text.split('\n').count();
            for e in &errs {
                let line = e.to_string();
                assert_one_line(&line, &text);
                assert_eq!(
                    line,
                    format!("{LABEL}:{}:{}: {}: {}", e.line, e.col, e.path, e.reason)
                );
                assert!(e.line >= 1 && e.col >= 1, "{line}");
                assert!(
                    e.line <= lines,
                    "line {} of a {lines}-line file: {line}",
                    e.line
                );
                assert!(!e.path.is_empty() && !e.reason.is_empty(), "{line}");
            }
        }
        Ok(m) => {
            // Warnings (unknown keys PRX ignores, a name other than the directory's) have the
            // errors' shape.
            let lines = text.split('\n').count();
            for w in &m.warnings {
                let line = w.to_string();
                assert_one_line(&line, &text);
                assert!(line.starts_with(LABEL), "{line}");
                assert!(w.line >= 1 && w.col >= 1 && w.line <= lines, "{line}");
            }
            check(&m, dir, canon)
        }
    }
});

fn check(m: &Manifest, dir: &PathBuf, canon: &PathBuf) {
    assert!(
        manifest::is_valid_name(&m.name) && m.name == "p",
        "{:?}",
        m.name
    );
    assert!(!m.version.trim().is_empty());
    assert_eq!(&m.dir, dir);
    assert_eq!(m.file, LABEL);
    assert!(m.wasm.starts_with(dir), "{:?}", m.wasm);
    let meta = std::fs::metadata(&m.wasm).expect("the component exists");
    assert!(meta.is_file(), "{:?}", m.wasm);
    let real = m.wasm.canonicalize().unwrap();
    assert!(real.starts_with(canon), "{real:?} is outside");

    let r = &m.resources;
    assert!(r.max_fuel >= 1);
    assert!((1..=manifest::MAX_MEMORY_MB).contains(&r.max_memory_mb));
    assert!((1..=manifest::MAX_EXECUTION_TIME_MS).contains(&r.max_execution_time_ms));
    assert!(r.max_kv_storage_mb <= manifest::MAX_KV_STORAGE_MB);
    assert!((1..=manifest::MAX_POOL_SIZE).contains(&r.pool_size));

    let mut expected: Vec<&String> = Vec::new();
    for cap in &m.capabilities {
        assert!(!cap.kind.is_empty() || !cap.is_hook());
        if cap.is_hook() {
            assert!(!cap.events.is_empty(), "a hook without events");
            for p in &cap.events {
                if !expected.contains(&p) {
                    expected.push(p);
                }
            }
        }
    }
    assert_eq!(m.patterns.iter().collect::<Vec<_>>(), expected);
    let mut mask = EventMask::NONE;
    for p in &m.patterns {
        assert_eq!(
            manifest::event_pattern(p).as_deref(),
            Ok(p.as_str()),
            "{p:?}"
        );
        mask |= manifest::pattern_mask(p);
    }
    assert_eq!(m.events, mask);

    let perms = &m.permissions;
    for name in perms.required.iter().chain(&perms.optional) {
        assert!(
            manifest::KNOWN_PERMISSIONS.contains(&name.as_str()),
            "{name:?}"
        );
    }
    assert_eq!(
        perms.events,
        perms
            .required
            .iter()
            .chain(&perms.optional)
            .any(|n| n == "events")
    );
}
