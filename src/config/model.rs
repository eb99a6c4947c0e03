//! The validated form of `hooks.json`: what the shell backend runs.
//!
//! A [`HookTable`] is immutable once built; reloads build a new one and swap it in whole
//! (`ArcSwap`), so a running hook always finishes under the table it started with. Everything
//! a spawn needs is decided here, at load time: the program's absolute path, the cwd, the
//! environment entries, the timeout — the spawn path does no parsing and no lookup.

use crate::event::{EventKind, EventMask};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Defaults of ARCHITECTURE.md § Shell hooks (the documented values; PRX's own code differs, see docs/hooks.md).
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// The default `max_concurrent`: processes of one hook running at once.
pub const DEFAULT_MAX_CONCURRENT: usize = 8;

/// Every shell hook of one `hooks.json`, validated.
#[derive(Debug, Clone, Default)]
pub struct HookTable {
    /// PRX's global switch (`"enabled": false` turns every hook off).
    pub enabled: bool,
    /// Exact names of variables passed from the parent environment (never a blocked one).
    pub env_passthrough: Vec<String>,
    /// Every action, in file order (event keys in file order, then array order).
    pub actions: Vec<Arc<Action>>,
    /// Where the table came from (`None`: no hooks.json, an empty table).
    pub source: Option<PathBuf>,
    /// Load-time warnings (e.g. a bare command not found on the sanitized PATH).
    pub warnings: Vec<String>,
    /// `"path": "inherit"`: the host's PATH, filtered ([`crate::shell::env::filter_path`]),
    /// which bare commands were resolved against and hooks get. `None`: the safe default
    /// [`SANITIZED_PATH`](crate::config::SANITIZED_PATH).
    pub path: Option<String>,
}

impl HookTable {
    /// The events at least one enabled action listens to (empty when globally disabled).
    pub fn interest(&self) -> EventMask {
        if !self.enabled {
            return EventMask::NONE;
        }
        self.actions
            .iter()
            .filter(|a| a.enabled)
            .fold(EventMask::NONE, |m, a| m | a.event.mask())
    }

    /// The actions for `kind`, in file order (enabled or not: the caller decides and counts).
    pub fn actions_for(&self, kind: EventKind) -> impl Iterator<Item = &Arc<Action>> {
        self.actions.iter().filter(move |a| a.event == kind)
    }

    /// The action with this id, if the table has one.
    pub fn get(&self, id: &str) -> Option<&Arc<Action>> {
        self.actions.iter().find(|a| a.id == id)
    }
}

/// One hook: a program run for one event.
#[derive(Debug, Clone)]
pub struct Action {
    /// `[A-Za-z0-9._-]{1,64}`, unique in the table. Explicit, or derived deterministically from
    /// the event and the action's content (stable across reloads while the action is unchanged).
    pub id: String,
    /// Whether `id` was written in the file (false: derived).
    pub id_explicit: bool,
    /// The event it runs for.
    pub event: EventKind,
    /// Position in its event's array (for error paths: `hooks.tool_call[2]`).
    pub index: usize,
    /// `command` exactly as written.
    pub command: String,
    /// The absolute program path resolved at load time (bare names against the sanitized PATH,
    /// relative paths against the workspace), or why it could not be resolved — a hook that
    /// cannot be resolved is kept and reported as `spawn failed` when it fires.
    pub program: Result<PathBuf, String>,
    /// Arguments passed to the program as they are, without a shell.
    pub args: Vec<String>,
    /// The action's own `env` entries, in file order (already checked: no blocked names).
    pub env: Vec<(String, String)>,
    /// Absolute working directory (the workspace when `cwd` is absent).
    pub cwd: PathBuf,
    /// How long a run may take before its process group is killed (`timeout_ms`).
    pub timeout: Duration,
    /// Whether the timeout was written on the action (false: inherited from the top level).
    pub timeout_explicit: bool,
    /// Whether the payload is also piped to the process's stdin.
    pub stdin_json: bool,
    /// Whether the hook runs (false: its events are counted as skipped).
    pub enabled: bool,
    /// tool_call_start / tool_call only: which tool names fire this hook.
    pub matcher: Option<Matcher>,
    /// Processes of this hook running at once, at most (default [`DEFAULT_MAX_CONCURRENT`]).
    pub max_concurrent: usize,
    /// `"limits"`: this hook's resource limits (unset ones take the host's defaults).
    pub limits: HookLimits,
}

/// Per-hook resource limits (`"limits"` in hooks.json; `ShellLimits::hook_limits` holds the
/// host's defaults). The rlimits are per process of the hook; `memory_bytes` and `processes`
/// are per run and need a delegated cgroup v2 with the `memory` / `pids` controller (without
/// one a hook that sets them fails to spawn). `RLIMIT_NPROC` (it counts every process of the
/// *user*) and `RLIMIT_AS` (it breaks JVMs and Node) are not offered here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookLimits {
    /// RLIMIT_CPU: seconds of CPU time per process; soft = hard, so at the limit the kernel
    /// sends SIGKILL (no SIGXCPU first).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_NOFILE: open files per process.
    pub open_files: Option<u64>,
    /// RLIMIT_CORE: bytes of core dump (0: none).
    pub core_bytes: Option<u64>,
    /// RLIMIT_FSIZE: bytes of the largest file a process may write.
    pub file_size_bytes: Option<u64>,
    /// cgroup `memory.max` (and `memory.swap.max` 0) of each run.
    pub memory_bytes: Option<u64>,
    /// cgroup `pids.max` of each run: processes and threads at once.
    pub processes: Option<u64>,
}

impl HookLimits {
    /// The hooks.json keys, in documentation order.
    pub const KEYS: [&'static str; 6] = [
        "cpu_seconds",
        "open_files",
        "core_bytes",
        "file_size_bytes",
        "memory_bytes",
        "processes",
    ];

    /// The value of `key` (one of [`Self::KEYS`]).
    pub fn get(&self, key: &str) -> Option<u64> {
        match key {
            "cpu_seconds" => self.cpu_seconds,
            "open_files" => self.open_files,
            "core_bytes" => self.core_bytes,
            "file_size_bytes" => self.file_size_bytes,
            "memory_bytes" => self.memory_bytes,
            "processes" => self.processes,
            _ => None,
        }
    }

    /// Sets `key` (one of [`Self::KEYS`]); `false` for an unknown key.
    pub fn set(&mut self, key: &str, value: u64) -> bool {
        let slot = match key {
            "cpu_seconds" => &mut self.cpu_seconds,
            "open_files" => &mut self.open_files,
            "core_bytes" => &mut self.core_bytes,
            "file_size_bytes" => &mut self.file_size_bytes,
            "memory_bytes" => &mut self.memory_bytes,
            "processes" => &mut self.processes,
            _ => return false,
        };
        *slot = Some(value);
        true
    }

    /// The range each key accepts: (min, max).
    pub fn range(key: &str) -> (u64, u64) {
        match key {
            "cpu_seconds" => (1, 7 * 24 * 3600),
            "open_files" => (4, 1 << 20),
            "core_bytes" | "file_size_bytes" => (0, 1 << 50),
            "memory_bytes" => (1 << 20, 1 << 50),
            "processes" => (1, 1 << 22),
            _ => (0, 0),
        }
    }
}

/// Which tool names a hook fires for.
///
/// hooks.json's rule ([`Matcher::parse`], docs/hooks.md § Matchers, Claude Code's convention):
///
/// | written | is | matches |
/// |---|---|---|
/// | absent, `""` or `"*"` | — | every tool |
/// | `"/re/"` | regex | `re` against the whole name (anchored) |
/// | contains one of `\|().+[]^$` (`"Edit\|Write"`, `"mcp__.*"`) | regex | the whole name (anchored) |
/// | anything else (`"mcp__*"`, `"Read?"`, `"Bash"`) | glob | the whole name, `*` any run, `?` one character |
///
/// Matching is case-sensitive. Regexes are the `regex` crate's (linear time, no backtracking:
/// no pattern can make matching slow).
#[non_exhaustive]
#[derive(Debug, Clone)]
pub enum Matcher {
    /// `*` and `?` wildcards matching the whole name, case-sensitive (`mcp__*`).
    Glob(String),
    /// A regex as given, matching anywhere in the name unless it anchors itself (for tables
    /// built in code; hooks.json's regexes load as [`Matcher::Anchored`]).
    Regex(regex::Regex),
    /// A regex matched against the whole name, with the text it was written as
    /// (`Edit|Write`, `/^mcp__.*$/`).
    Anchored {
        /// The matcher as written in the file.
        source: String,
        /// The compiled regex, anchored at both ends.
        regex: regex::Regex,
    },
}

/// The characters that make a matcher a regex (besides `/…/`).
pub const REGEX_CHARS: &[char] = &['|', '(', ')', '.', '+', '[', ']', '^', '$', '\\'];

impl Matcher {
    /// Reads a matcher as hooks.json writes it (the table above): `Ok(None)` for one that
    /// matches every tool (`""`), `Err` with the reason for a regex that does not compile.
    pub fn parse(src: &str) -> Result<Option<Matcher>, String> {
        if src.is_empty() {
            return Ok(None);
        }
        let slashed = src.len() >= 2 && src.starts_with('/') && src.ends_with('/');
        if !slashed && !src.contains(REGEX_CHARS) {
            return Ok(Some(Matcher::Glob(src.to_string())));
        }
        let pattern = if slashed { &src[1..src.len() - 1] } else { src };
        if pattern.is_empty() {
            return Err(
                "an empty regular expression; leave \"matcher\" out (or write \"*\") to match \
                 every tool"
                    .into(),
            );
        }
        regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(1 << 20)
            .nest_limit(64)
            .build()
            .map(|regex| {
                Some(Matcher::Anchored {
                    source: src.to_string(),
                    regex,
                })
            })
            .map_err(|e| format!("invalid regular expression: {}", regex_reason(&e)))
    }

    /// The matcher as written (`mcp__*`, `Edit|Write`, `/^sh/`).
    pub fn source(&self) -> String {
        match self {
            Matcher::Glob(g) => g.clone(),
            Matcher::Regex(r) => format!("/{}/", r.as_str()),
            Matcher::Anchored { source, .. } => source.clone(),
        }
    }

    /// Whether the tool named `tool` fires the hook.
    pub fn matches(&self, tool: &str) -> bool {
        match self {
            Matcher::Glob(g) => glob_match(g.as_bytes(), tool.as_bytes()),
            Matcher::Regex(r) => r.is_match(tool),
            Matcher::Anchored { regex, .. } => regex.is_match(tool),
        }
    }
}

/// regex's errors span several lines (the pattern, a caret, the message); keep the message.
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    let reason = text
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map(str::to_string)
        .unwrap_or_else(|| text.lines().map(str::trim).collect::<Vec<_>>().join("; "));
    super::error::one_line(&reason)
}

/// `*` (any run, possibly empty) and `?` (any one character) over the whole text. Iterative
/// with one backtrack point, so it is linear-ish and cannot blow up on adversarial patterns.
pub(crate) fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    // ASCII (tool names almost always are): byte by byte, nothing allocated.
    if pattern.is_ascii() && text.is_ascii() {
        return glob(pattern, text, b'*', b'?');
    }
    let text = std::str::from_utf8(text)
        .map(|t| t.chars().collect::<Vec<_>>())
        .unwrap_or_default();
    let pattern = std::str::from_utf8(pattern)
        .map(|p| p.chars().collect::<Vec<_>>())
        .unwrap_or_default();
    glob(&pattern, &text, '*', '?')
}

/// [`glob_match`] over units of text (bytes of ASCII, or characters): `any` is `*`, `one` `?`.
fn glob<T: Copy + PartialEq>(pattern: &[T], text: &[T], any: T, one: T) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(&c) if c == any => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == one || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_the_whole_name() {
        let m = |p: &str, t: &str| Matcher::Glob(p.into()).matches(t);
        assert!(m("mcp__*", "mcp__github__create"));
        assert!(m("mcp__*", "mcp__"));
        assert!(!m("mcp__*", "xmcp__a"));
        assert!(m("sh?ll", "shell") && !m("sh?ll", "shel"));
        assert!(m("*", "") && m("a*b*c", "aXXbYYc") && !m("a*b*c", "aXXbYY"));
        assert!(!m("Shell", "shell"), "case-sensitive");
        // `?` is one character, not one byte, beyond ASCII (the ASCII path is byte by byte).
        assert!(m("a?c", "aéc") && !m("a??c", "aéc") && m("é*", "éa") && !m("e*", "éa"));
        assert!(m("é*", "éa"));
        assert!(
            !m(&"*a".repeat(30), &"a".repeat(29)),
            "no exponential blow-up, and correct"
        );
    }

    #[test]
    fn the_rule_picks_glob_or_anchored_regex() {
        let m = |p: &str| Matcher::parse(p).unwrap().unwrap();
        assert!(matches!(m("mcp__*"), Matcher::Glob(_)));
        assert!(matches!(m("Read?"), Matcher::Glob(_)));
        assert!(matches!(m("*"), Matcher::Glob(_)));
        assert!(Matcher::parse("").unwrap().is_none());
        for (p, yes, no) in [
            (
                "Edit|Write",
                &["Edit", "Write"][..],
                &["MultiEdit", "Edit2", "Writer"][..],
            ),
            (
                "mcp__.*",
                &["mcp__github__x", "mcp__"],
                &["xmcp__a", "mcp_"],
            ),
            ("/Bash/", &["Bash"], &["Bashful", "bash"]),
            ("/^sh|bash$/", &["sh", "bash"], &["zsh", "shell"]),
            ("(Read)", &["Read"], &["Reads"]),
            ("a+", &["a", "aaa"], &["ab", ""]),
        ] {
            let mm = m(p);
            assert!(matches!(mm, Matcher::Anchored { .. }), "{p}");
            assert_eq!(mm.source(), p);
            for y in yes {
                assert!(mm.matches(y), "{p} must match {y}");
            }
            for n in no {
                assert!(!mm.matches(n), "{p} must not match {n}");
            }
        }
        assert!(
            Matcher::parse("(abc")
                .unwrap_err()
                .contains("unclosed group")
        );
        assert!(
            Matcher::parse("//")
                .unwrap_err()
                .contains("empty regular expression")
        );
    }

    #[test]
    fn regexes_search() {
        let r = Matcher::Regex(regex::Regex::new("^mcp__.*__create$").unwrap());
        assert!(r.matches("mcp__github__create") && !r.matches("mcp__github__delete"));
        assert_eq!(r.source(), "/^mcp__.*__create$/");
    }
}
