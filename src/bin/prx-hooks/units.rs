//! Units on the command line: durations and byte sizes.
//!
//! Shared by `prx-hooks` and `prx-hooks-send`.

use std::time::Duration;

/// `30s`, `1500ms`, `2m`, `1h 30m` (humantime), or a bare number of seconds (`2.5`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.trim().parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"));
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?}: {e} (write 30s, 1500ms, 2m or a number of seconds)"))
}

/// `N`, `NKiB`, `NMiB` or `NGiB` bytes, at least 1 KiB.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (n, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let mult: usize = match unit {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("{s:?}: expected bytes as N, NKiB, NMiB or NGiB")),
    };
    n.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n >= 1 << 10)
        .ok_or_else(|| format!("{s:?}: expected bytes as N, NKiB, NMiB or NGiB, at least 1KiB"))
}
