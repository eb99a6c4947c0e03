//! What the process-level shell tests share: reading `/proc` to find, identify and count
//! processes (ARCHITECTURE.md § Testing: real processes, no mocks).

#![allow(dead_code)] // each test binary uses a different subset

/// `/proc/<pid>/stat`: (state, ppid, pgrp).
pub fn proc_stat(pid: i32) -> Option<(char, i32, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Running (not a zombie, not dead).
pub fn alive(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(s, _, _)| s != 'Z' && s != 'X')
}

/// The command line, arguments joined by spaces (empty for a zombie or a gone process).
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// Live processes whose command line is exactly `cmd` (arguments joined by spaces).
pub fn procs_exactly(cmd: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| alive(p) && cmdline(p).trim_end() == cmd)
        .collect()
}
