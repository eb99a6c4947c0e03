//! What the shell-hook test binaries share: a hook command that records each event it gets,
//! reading the record back, and waiting for a condition with generous slack (liveness, not
//! speed: the machines are shared).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::time::{Duration, Instant};

/// Arguments for `/bin/sh` (with `stdin_json: true`): append "<tag> <payload>" to `log`.
pub fn append_args(tag: &str, log: &Path) -> [String; 2] {
    let script = format!(
        "read -r p; printf '%s %s\\n' {tag} \"$p\" >> {}",
        log.display()
    );
    ["-c".to_string(), script]
}

/// The lines of `log` (none while it does not exist).
pub fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Polls `cond` every 10 ms; fails after 20 s.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
