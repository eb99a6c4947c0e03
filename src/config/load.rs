//! Reading and validating `<workspace>/hooks.json` (ARCHITECTURE.md § Shell hooks).
//!
//! [`parse`] checks everything at once and reports every problem it finds, each as
//! `FILE:LINE:COL: JSON.PATH: reason` pointing at the offending value (or key). What a spawn
//! needs is decided here, once: the program's absolute path (bare names resolved against
//! [`SANITIZED_PATH`]), the absolute cwd, the checked environment entries, the timeout and a
//! stable id. Nothing the shell backend later does depends on re-reading the file.
//!
//! Leniencies, on purpose: `null` for an optional field means "not given" (serde's `Option`
//! reads PRX files that way), a leading UTF-8 byte order mark is skipped, and a command or cwd
//! that does not exist (yet) is a warning, not an error, so PRX files written for another
//! machine still load (the hook then fails to spawn, visibly).

use super::error::{ConfigError, ConfigErrors, Lines, Path as JPath, quote};
use super::model::{
    Action, DEFAULT_MAX_CONCURRENT, DEFAULT_TIMEOUT_MS, HookLimits, HookTable, Matcher,
};
use super::spanned::{self, Member, Node, RawError, Val};
use crate::event::EventKind;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

mod validate;

use validate::{Draft, Validator};

/// The file's name inside the workspace.
pub const HOOKS_FILE: &str = "hooks.json";
/// Largest accepted hooks.json.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// Most actions in one file (all events together).
pub const MAX_ACTIONS: usize = 256;
/// Most `args` of one action.
pub const MAX_ARGS: usize = 128;
/// Most `env` entries of one action (and most `env_passthrough` names).
pub const MAX_ENV: usize = 128;
/// Most errors listed for one file; the rest are counted on one more line (`… and N more
/// errors (only the first 100 are shown)`), so a hostile or broken file cannot produce
/// megabytes of messages.
pub const MAX_ERRORS: usize = 100;
/// `timeout_ms` range.
pub const MIN_TIMEOUT_MS: u64 = 1;
/// The largest `timeout_ms`: 5 minutes.
pub const MAX_TIMEOUT_MS: u64 = 300_000;
/// Largest `max_concurrent` (the design only asks for ≥ 1; a bound keeps a typo such as
/// `80000000` from sizing anything absurd — at most 64 hook processes run at once anyway).
pub const MAX_MAX_CONCURRENT: u64 = 1024;
/// The PATH bare command names are resolved against, and the PATH every hook gets.
pub const SANITIZED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The names the first releases refused in `env` and `env_passthrough`. The policy is now
/// [`crate::shell::env::RULES`] (every `LD_*` and `DYLD_*`, the C library's setuid list, PATH,
/// HOME in `env`, `ZERO_HOOK_*`; interpreter start-up variables from the agent); HOME in
/// `env_passthrough` is a warning (hooks always get the host's).
pub const BLOCKED_ENV: [&str; 6] = [
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "DYLD_INSERT_LIBRARIES",
    "DYLD_LIBRARY_PATH",
    "PATH",
    "HOME",
];
/// Characters `command` may not contain: hooks run without a shell (plus newlines).
pub const SHELL_METACHARACTERS: &[char] = &[
    ';', '|', '&', '$', '`', '<', '>', '(', ')', '{', '}', '[', ']', '*', '?', '!', '~', '\'', '"',
    '\\', '\n',
];

const TOP_FIELDS: &[&str] = &["timeout_ms", "enabled", "env_passthrough", "path", "hooks"];
const ACTION_FIELDS: &[&str] = &[
    "command",
    "args",
    "env",
    "cwd",
    "timeout_ms",
    "stdin_json",
    "id",
    "enabled",
    "matcher",
    "max_concurrent",
    "limits",
];

/// Whether `name` may never be set for a hook (`LD_PRELOAD`, `PATH`, … in any case): the rules
/// of [`crate::shell::env::RULES`] that apply to a hook's own `env`.
pub fn is_blocked_env(name: &str) -> bool {
    super::env_policy::is_blocked(name)
}

/// Whether `name` is one of ours (`ZERO_HOOK_*`, in any case).
pub fn is_zero_hook_var(name: &str) -> bool {
    name.len() >= 10 && name.as_bytes()[..10].eq_ignore_ascii_case(b"ZERO_HOOK_")
}

/// `[A-Za-z0-9._-]{1,64}`.
pub fn is_valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// hooks.json event keys: trimmed, lowercased, `-` → `_` (`" LLM-Response"` → `llm_response`).
pub fn normalize_event_key(key: &str) -> String {
    key.trim().to_lowercase().replace('-', "_")
}

/// An enabled table with no hooks: what a workspace without hooks.json has.
pub fn empty_table() -> HookTable {
    HookTable {
        enabled: true,
        ..HookTable::default()
    }
}

/// How [`load`] names the file in messages: `hooks.json` for the current directory, the
/// joined path otherwise.
pub fn file_label(workspace: &Path) -> String {
    if workspace.as_os_str().is_empty() || workspace == Path::new(".") {
        HOOKS_FILE.to_string()
    } else {
        workspace.join(HOOKS_FILE).display().to_string()
    }
}

/// Reads `<workspace>/hooks.json`: `Ok(None)` when it does not exist. Reads at most
/// [`MAX_FILE_BYTES`] + 4 bytes (enough for [`parse`] to report the file as too large), and
/// refuses anything but a regular file.
///
/// The file is opened first, with `O_NONBLOCK` (and `O_NOCTTY`), and the opened descriptor is
/// checked (`fstat`): a FIFO swapped in for hooks.json cannot block the open waiting for a
/// writer, and a file swapped between a check by name and the open cannot slip through, since
/// nothing is decided by name. Symbolic links are followed (a linked hooks.json is fine).
pub fn read_hooks_file(workspace: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = workspace.join(HOOKS_FILE);
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // + 3 for a byte order mark, + 1 to see that the file is too large.
    let cap = MAX_FILE_BYTES as u64 + 4;
    let mut bytes = Vec::with_capacity(meta.len().min(cap) as usize);
    file.take(cap).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Loads `<workspace>/hooks.json`. A missing file is an empty, enabled table (`source: None`);
/// an unreadable or invalid one is every error found.
pub fn load(workspace: &Path) -> Result<HookTable, ConfigErrors> {
    let label = file_label(workspace);
    match read_hooks_file(workspace) {
        Ok(None) => Ok(empty_table()),
        Ok(Some(bytes)) => {
            let mut table = parse(&bytes, &label, workspace)?;
            table.source = Some(workspace.join(HOOKS_FILE));
            Ok(table)
        }
        Err(e) => Err(io_error(&label, &e)),
    }
}

/// A file that could not be read, in the one error format.
pub(crate) fn io_error(label: &str, e: &std::io::Error) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        file: super::error::one_line(label),
        line: 1,
        col: 1,
        path: "$".into(),
        reason: super::error::one_line(&format!("cannot read the file: {e}")),
    }])
}

/// Parses and validates the text of a hooks.json. `file_label` names the file in messages;
/// relative commands and cwds are resolved against `workspace`. The table's `source` is left
/// `None` (the caller knows where the text came from).
pub fn parse(text: &[u8], file_label: &str, workspace: &Path) -> Result<HookTable, ConfigErrors> {
    parse_with_warnings(text, file_label, workspace).0
}

/// [`load`], with the warnings found also when the file has errors (on success they are the
/// table's): what `prx-hooks validate` prints, everything in one pass.
pub fn load_with_warnings(workspace: &Path) -> (Result<HookTable, ConfigErrors>, Vec<String>) {
    let label = file_label(workspace);
    match read_hooks_file(workspace) {
        Ok(None) => (Ok(empty_table()), Vec::new()),
        Ok(Some(bytes)) => {
            let (mut table, warnings) = parse_with_warnings(&bytes, &label, workspace);
            if let Ok(t) = &mut table {
                t.source = Some(workspace.join(HOOKS_FILE));
            }
            (table, warnings)
        }
        Err(e) => (Err(io_error(&label, &e)), Vec::new()),
    }
}

/// [`parse`], with the warnings found also when the text has errors (none when it is not
/// JSON at all: nothing was validated). On success they are the table's.
pub fn parse_with_warnings(
    text: &[u8],
    file_label: &str,
    workspace: &Path,
) -> (Result<HookTable, ConfigErrors>, Vec<String>) {
    let label = super::error::one_line(file_label);
    let fail = |text: &str, errs: Vec<RawError>| (Err(finish(&label, text, errs)), Vec::new());
    let bytes = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    if bytes.len() > MAX_FILE_BYTES {
        return fail(
            "",
            vec![raw(
                0,
                JPath::root(),
                format!(
                    "the file is larger than {} KiB (the limit)",
                    MAX_FILE_BYTES / 1024
                ),
            )],
        );
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let valid = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default();
            return fail(
                valid,
                vec![raw(
                    e.valid_up_to(),
                    JPath::root(),
                    format!("invalid UTF-8 at byte {}", e.valid_up_to()),
                )],
            );
        }
    };
    let parsed = spanned::parse(text);
    let mut errs = parsed.duplicates;
    let root = match parsed.root {
        Ok(root) => root,
        Err(e) => {
            errs.push(e);
            return fail(text, errs);
        }
    };
    let mut v = Validator::new(workspace);
    v.errs = errs;
    let mut table = v.document(&root);
    let lines = Lines::new(text);
    let warnings: Vec<String> = v
        .warns
        .iter()
        .map(|w| {
            let (line, col) = lines.locate(w.pos);
            ConfigError {
                file: label.clone(),
                line,
                col,
                path: w.path.to_string(),
                reason: w.reason.clone(),
            }
            .to_string()
        })
        .collect();
    if v.errs.is_empty() {
        table.warnings = warnings.clone();
        (Ok(table), warnings)
    } else {
        (fail(text, v.errs).0, warnings)
    }
}

pub(crate) fn raw(pos: usize, path: JPath, reason: impl Into<String>) -> RawError {
    RawError {
        pos,
        path,
        reason: reason.into(),
        first: None,
    }
}

/// Raw errors → `ConfigErrors`, in file order: the first [`MAX_ERRORS`], then one line
/// counting the rest (at the position of the first one left out). Linear in the number of
/// errors and the size of the text.
pub(crate) fn finish(label: &str, text: &str, mut errs: Vec<RawError>) -> ConfigErrors {
    errs.sort_by_key(|e| e.pos);
    if errs.len() > MAX_ERRORS {
        let more = errs.len() - MAX_ERRORS;
        errs.truncate(MAX_ERRORS + 1);
        let last = &mut errs[MAX_ERRORS];
        last.path = JPath::root();
        last.first = None;
        last.reason = format!("… and {more} more errors (only the first {MAX_ERRORS} are shown)");
    }
    let lines = Lines::new(text);
    ConfigErrors(
        errs.into_iter()
            .map(|e| {
                let (line, col) = lines.locate(e.pos);
                let reason = match e.first {
                    Some(first) => {
                        let (l, c) = lines.locate(first);
                        format!("{} (first at {l}:{c})", e.reason)
                    }
                    None => e.reason,
                };
                ConfigError {
                    file: label.to_string(),
                    line,
                    col,
                    path: e.path.to_string(),
                    reason,
                }
            })
            .collect(),
    )
}

/// `<event>-<8 hex>`: a hash of what identifies a hook — its event, command, args, cwd (as
/// written) and matcher. Tuning fields (timeout, enabled, stdin_json, env, max_concurrent) are
/// left out, so switching a hook off or changing its timeout keeps its id (and its run
/// history). FNV-1a, so the value is the same on every build and every machine.
fn derived_id(d: &Draft) -> String {
    let mut h = Fnv::new();
    h.field(d.event.name().as_bytes());
    h.field(d.command.as_bytes());
    h.field(&(d.args.len() as u64).to_le_bytes());
    for a in &d.args {
        h.field(a.as_bytes());
    }
    match &d.cwd_written {
        Some(c) => h.field(c.as_bytes()),
        None => h.field(b"\xff"),
    }
    match &d.matcher {
        Some(m) => h.field(m.source().as_bytes()),
        None => h.field(b"\xff"),
    }
    let x = h.0;
    format!("{}-{:08x}", d.event.name(), (x ^ (x >> 32)) as u32)
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// Length-prefixed, so `["ab","c"]` and `["a","bc"]` differ.
    fn field(&mut self, b: &[u8]) {
        self.bytes(&(b.len() as u64).to_le_bytes());
        self.bytes(b);
    }
}

/// A bare program name looked up in [`SANITIZED_PATH`]: the first executable regular file.
pub fn resolve_bare(name: &str) -> Result<PathBuf, String> {
    resolve_bare_in(name, SANITIZED_PATH)
}

/// A bare program name looked up in `path` (a PATH value): the first executable regular file.
pub fn resolve_bare_in(name: &str, path: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    for dir in path.split(':').filter(|d| d.starts_with('/')) {
        let candidate = Path::new(dir).join(name);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return Ok(candidate);
        }
    }
    Err(format!("{} was not found in {path}", quote(name)))
}

/// Resolves `.` and `..` lexically. `None` when `..` climbs above the start (for a relative
/// path: out of the directory it is relative to).
pub(crate) fn normalize(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return None;
                }
                out.pop();
                depth -= 1;
            }
            Component::Normal(s) => {
                out.push(s);
                depth += 1;
            }
            Component::RootDir | Component::Prefix(_) => out.push(c.as_os_str()),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_lexically() {
        assert_eq!(normalize(Path::new("./a/../b")), Some(PathBuf::from("b")));
        assert_eq!(normalize(Path::new("a/../..")), None);
        assert_eq!(normalize(Path::new("../x")), None);
        assert_eq!(normalize(Path::new("/a/../../b")), None);
        assert_eq!(normalize(Path::new("/a/./b/..")), Some(PathBuf::from("/a")));
    }

    #[test]
    fn event_keys_normalize() {
        assert_eq!(normalize_event_key(" LLM-Response "), "llm_response");
        assert_eq!(normalize_event_key("Tool_Call"), "tool_call");
    }

    #[test]
    fn env_rules() {
        assert!(is_blocked_env("ld_preload") && is_blocked_env("Path") && !is_blocked_env("PATHX"));
        assert!(is_zero_hook_var("zero_hook_x") && !is_zero_hook_var("ZERO_HOOK"));
        assert!(is_valid_id("a.b-c_9") && !is_valid_id("") && !is_valid_id(&"a".repeat(65)));
        assert!(!is_valid_id("a b") && !is_valid_id("é"));
    }
}
