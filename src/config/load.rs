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
    crate::shell::env::is_blocked(name)
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

fn raw(pos: usize, path: JPath, reason: impl Into<String>) -> RawError {
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
fn finish(label: &str, text: &str, mut errs: Vec<RawError>) -> ConfigErrors {
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

/// One action, checked, waiting for its id.
struct Draft {
    path: JPath,
    event: EventKind,
    index: usize,
    explicit_id: Option<(String, usize)>,
    command: String,
    program: Result<PathBuf, String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd_written: Option<String>,
    cwd: PathBuf,
    timeout_ms: Option<u64>,
    stdin_json: bool,
    enabled: bool,
    matcher: Option<Matcher>,
    max_concurrent: usize,
    limits: HookLimits,
}

struct Validator {
    errs: Vec<RawError>,
    warns: Vec<RawError>,
    /// The workspace as an absolute path (canonical when it exists).
    ws: PathBuf,
    /// The canonical workspace, when it exists: what symlink checks compare against.
    ws_canon: Option<PathBuf>,
    actions_seen: usize,
    /// `"path": "inherit"`: the filtered host PATH bare commands resolve against.
    path: Option<String>,
    /// Bare command names already looked up in the table's PATH.
    resolved: HashMap<String, Result<PathBuf, String>>,
}

impl Validator {
    fn new(workspace: &Path) -> Validator {
        let ws_canon = std::fs::canonicalize(workspace).ok();
        let ws = ws_canon.clone().unwrap_or_else(|| {
            std::path::absolute(workspace).unwrap_or_else(|_| workspace.to_path_buf())
        });
        Validator {
            errs: Vec::new(),
            warns: Vec::new(),
            ws,
            ws_canon,
            actions_seen: 0,
            path: None,
            resolved: HashMap::new(),
        }
    }

    fn err(&mut self, pos: usize, path: &JPath, reason: impl Into<String>) {
        self.errs.push(raw(pos, path.clone(), reason));
    }

    fn warn(&mut self, pos: usize, path: &JPath, reason: impl Into<String>) {
        self.warns.push(raw(pos, path.clone(), reason));
    }

    fn type_err(&mut self, node: &Node, path: &JPath, expected: &str) {
        let reason = format!("expected {expected}, found {}", node.val.kind());
        self.err(node.pos, path, reason);
    }

    fn string<'n>(&mut self, node: &'n Node, path: &JPath) -> Option<&'n str> {
        match &node.val {
            Val::Str(s) => Some(s),
            _ => {
                self.type_err(node, path, "a string");
                None
            }
        }
    }

    /// A string that will reach a process (or the file system): no NUL.
    fn os_string<'n>(&mut self, node: &'n Node, path: &JPath) -> Option<&'n str> {
        let s = self.string(node, path)?;
        if s.contains('\0') {
            self.err(node.pos, path, "may not contain a NUL byte");
            return None;
        }
        Some(s)
    }

    fn boolean(&mut self, node: &Node, path: &JPath) -> Option<bool> {
        match node.val {
            Val::Bool(b) => Some(b),
            _ => {
                self.type_err(node, path, "a boolean");
                None
            }
        }
    }

    /// An integer in `lo..=hi`.
    fn integer(&mut self, node: &Node, path: &JPath, lo: u64, hi: u64, unit: &str) -> Option<u64> {
        let Val::Num(n) = &node.val else {
            self.type_err(node, path, "an integer");
            return None;
        };
        if n.contains(['.', 'e', 'E']) {
            self.err(node.pos, path, format!("expected an integer, found {n}"));
            return None;
        }
        match n.parse::<u64>() {
            Ok(v) if (lo..=hi).contains(&v) => Some(v),
            _ => {
                self.err(
                    node.pos,
                    path,
                    format!("must be between {lo} and {hi}{unit}, found {n}"),
                );
                None
            }
        }
    }

    fn unknown_field(&mut self, m: &Member, path: &JPath, known: &[&str], hint: Option<String>) {
        let mut reason = format!("unknown field {}", quote(&m.key));
        if let Some(s) = crate::suggest(&m.key, known) {
            reason.push_str(&format!("; did you mean \"{s}\"?"));
        } else if let Some(h) = hint {
            reason.push_str(&h);
        } else {
            reason.push_str(&format!("; expected one of {}", known.join(", ")));
        }
        self.err(m.key_pos, &path.key(&m.key), reason);
    }

    fn document(&mut self, root: &Node) -> HookTable {
        let mut table = empty_table();
        let top = JPath::root();
        let Val::Obj(members) = &root.val else {
            self.type_err(root, &top, "a JSON object");
            return table;
        };
        let mut top_timeout = None;
        let mut hooks = None;
        for m in members {
            let path = top.key(&m.key);
            let v = &m.value;
            match m.key.as_str() {
                _ if v.val == Val::Null && TOP_FIELDS.contains(&m.key.as_str()) => {}
                "timeout_ms" => {
                    top_timeout = self.integer(v, &path, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS, " ms")
                }
                "enabled" => table.enabled = self.boolean(v, &path).unwrap_or(true),
                "env_passthrough" => table.env_passthrough = self.passthrough(v, &path),
                "path" => {
                    self.path = self.path_policy(v, &path);
                    table.path = self.path.clone();
                }
                "hooks" => hooks = Some(v),
                _ => {
                    let hint = EventKind::from_name(&normalize_event_key(&m.key)).map(|_| {
                        format!(
                            "; hooks go under \"hooks\": {{\"hooks\": {{{}: [...]}}}}",
                            quote(&m.key)
                        )
                    });
                    self.unknown_field(m, &top, TOP_FIELDS, hint)
                }
            }
        }
        let timeout_ms = top_timeout.unwrap_or(DEFAULT_TIMEOUT_MS);
        let drafts = match hooks {
            Some(h) => self.hooks(h, &top.key("hooks")),
            None => Vec::new(),
        };
        table.actions = self.assign_ids(drafts, timeout_ms);
        table
    }

    /// `"path"`: `"safe"` (the default) or `"inherit"` (the host's PATH, filtered; each entry
    /// left out is a warning).
    fn path_policy(&mut self, node: &Node, path: &JPath) -> Option<String> {
        match self.string(node, path)? {
            "safe" => None,
            "inherit" => {
                let (kept, dropped) = crate::shell::env::inherited_path();
                for w in dropped {
                    self.warn(node.pos, path, w);
                }
                Some(kept)
            }
            other => {
                self.err(
                    node.pos,
                    path,
                    format!(
                        "{} is not a PATH policy: expected \"safe\" (hooks get {SANITIZED_PATH}) or \"inherit\" (the agent's PATH minus empty, relative, missing and world-writable entries)",
                        quote(other)
                    ),
                );
                None
            }
        }
    }

    /// `"limits"`: an object of [`HookLimits::KEYS`] to integers in their ranges.
    fn limits(&mut self, node: &Node, path: &JPath) -> HookLimits {
        let mut out = HookLimits::default();
        let Val::Obj(members) = &node.val else {
            self.type_err(
                node,
                path,
                "an object of limits, such as {\"cpu_seconds\": 60}",
            );
            return out;
        };
        for m in members {
            let p = path.key(&m.key);
            if !HookLimits::KEYS.contains(&m.key.as_str()) {
                self.unknown_field(m, path, &HookLimits::KEYS, None);
                continue;
            }
            if m.value.val == Val::Null {
                continue;
            }
            let (lo, hi) = HookLimits::range(&m.key);
            if let Some(v) = self.integer(&m.value, &p, lo, hi, "") {
                out.set(&m.key, v);
            }
        }
        out
    }

    fn passthrough(&mut self, node: &Node, path: &JPath) -> Vec<String> {
        let Val::Arr(items) = &node.val else {
            self.type_err(node, path, "an array of variable names");
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = path.index(i);
            if i == MAX_ENV {
                self.err(item.pos, &p, format!("too many names: at most {MAX_ENV}"));
                break;
            }
            let Some(name) = self.os_string(item, &p) else {
                continue;
            };
            if !self.env_name(name, item.pos, &p, "pass through") {
                continue;
            }
            if out.iter().any(|n| n == name) {
                self.err(item.pos, &p, format!("{} is listed twice", quote(name)));
                continue;
            }
            if name == "HOME" {
                // Accepted (PRX's files list it) but changes nothing: say so.
                self.warn(
                    item.pos,
                    &p,
                    "HOME is always given to hooks (the agent's when it is an absolute path, \
                     else the passwd entry's): listing it here changes nothing",
                );
            }
            out.push(name.to_string());
        }
        out
    }

    /// Checks a variable name for `env` keys and `env_passthrough`; reports and returns false
    /// when it may not be used ([`crate::shell::env::RULES`]).
    fn env_name(&mut self, name: &str, pos: usize, path: &JPath, verb: &str) -> bool {
        use crate::shell::env::{Scope, refusal};
        let scope = if verb == "set" {
            Scope::Env
        } else {
            Scope::Passthrough
        };
        if name.is_empty() {
            self.err(pos, path, "a variable name may not be empty");
        } else if name.contains('=') {
            self.err(
                pos,
                path,
                format!(
                    "{} is not a valid variable name (it contains '=')",
                    quote(name)
                ),
            );
        } else if name.contains('\0') {
            self.err(pos, path, "a variable name may not contain a NUL byte");
        } else if let Some(rule) = refusal(name, scope) {
            self.err(
                pos,
                path,
                format!("may not {verb} {}: {}", quote(name), rule.why),
            );
        } else {
            return true;
        }
        false
    }

    fn hooks(&mut self, node: &Node, path: &JPath) -> Vec<Draft> {
        let Val::Obj(events) = &node.val else {
            self.type_err(node, path, "an object of event names to arrays of hooks");
            return Vec::new();
        };
        let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
        let mut seen: HashMap<String, (String, usize)> = HashMap::new();
        let mut drafts = Vec::new();
        for m in events {
            let p = path.key(&m.key);
            let norm = normalize_event_key(&m.key);
            let event = EventKind::from_name(&norm);
            if event.is_none() {
                let hint = match crate::suggest(&norm, &names) {
                    Some(s) => format!("; did you mean \"{s}\"?"),
                    None => format!("; expected one of {}", names.join(", ")),
                };
                self.err(
                    m.key_pos,
                    &p,
                    format!("unknown event {}{hint}", quote(&m.key)),
                );
            } else if let Some((first_key, first)) = seen.get(&norm) {
                let reason = format!(
                    "{} is the same event as {} once normalized (trimmed, lowercased, \
                     '-' → '_'); merge the two arrays",
                    quote(&m.key),
                    quote(first_key)
                );
                self.errs.push(RawError {
                    pos: m.key_pos,
                    path: p.clone(),
                    reason,
                    first: Some(*first),
                });
            } else {
                seen.insert(norm, (m.key.clone(), m.key_pos));
            }
            if m.value.val == Val::Null {
                continue;
            }
            let Val::Arr(items) = &m.value.val else {
                self.type_err(&m.value, &p, "an array of hooks");
                continue;
            };
            for (i, item) in items.iter().enumerate() {
                let ip = p.index(i);
                self.actions_seen += 1;
                if self.actions_seen == MAX_ACTIONS + 1 {
                    self.err(
                        item.pos,
                        &ip,
                        format!("too many hooks: at most {MAX_ACTIONS} in one file"),
                    );
                }
                if let Some(d) = self.action(item, event, i, &ip) {
                    drafts.push(d);
                }
            }
        }
        drafts
    }

    fn action(
        &mut self,
        node: &Node,
        event: Option<EventKind>,
        index: usize,
        path: &JPath,
    ) -> Option<Draft> {
        let Val::Obj(members) = &node.val else {
            self.type_err(node, path, "a hook object such as {\"command\": \"...\"}");
            return None;
        };
        let errs_before = self.errs.len();
        let mut d = Draft {
            path: path.clone(),
            event: event.unwrap_or(EventKind::AgentStart),
            index,
            explicit_id: None,
            command: String::new(),
            program: Err(String::new()),
            args: Vec::new(),
            env: Vec::new(),
            cwd_written: None,
            cwd: self.ws.clone(),
            timeout_ms: None,
            stdin_json: false,
            enabled: true,
            matcher: None,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            limits: HookLimits::default(),
        };
        let mut has_command = false;
        for m in members {
            let p = path.key(&m.key);
            let v = &m.value;
            if v.val == Val::Null && ACTION_FIELDS.contains(&m.key.as_str()) && m.key != "command" {
                continue;
            }
            match m.key.as_str() {
                "command" => {
                    has_command = true;
                    if let Some((command, program)) = self.command(v, &p) {
                        d.command = command;
                        d.program = program;
                    }
                }
                "args" => d.args = self.args(v, &p),
                "env" => d.env = self.env(v, &p),
                "cwd" => {
                    if let Some((written, cwd)) = self.cwd(v, &p) {
                        d.cwd_written = Some(written);
                        d.cwd = cwd;
                    }
                }
                "timeout_ms" => {
                    d.timeout_ms = self.integer(v, &p, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS, " ms")
                }
                "stdin_json" => d.stdin_json = self.boolean(v, &p).unwrap_or(false),
                "enabled" => d.enabled = self.boolean(v, &p).unwrap_or(true),
                "max_concurrent" => {
                    d.max_concurrent = self
                        .integer(v, &p, 1, MAX_MAX_CONCURRENT, "")
                        .map_or(DEFAULT_MAX_CONCURRENT, |n| n as usize)
                }
                "id" => {
                    if let Some(id) = self.string(v, &p) {
                        if is_valid_id(id) {
                            d.explicit_id = Some((id.to_string(), v.pos));
                            if id == "." || id == ".." {
                                self.warn(
                                    v.pos,
                                    &p,
                                    format!(
                                        "the id {} cannot be reached through the HTTP API (URL \
                                         paths normalize it away); choose another",
                                        quote(id)
                                    ),
                                );
                            }
                        } else {
                            self.err(
                                v.pos,
                                &p,
                                format!(
                                    "{} is not a valid id: 1 to 64 characters of A-Z a-z 0-9 . _ -",
                                    quote(id)
                                ),
                            );
                        }
                    }
                }
                "matcher" => d.matcher = self.matcher(v, &p, event),
                "limits" => d.limits = self.limits(v, &p),
                _ => {
                    let hint = (m.key == "event").then(|| {
                        "; the event is the key the hook is listed under in \"hooks\"".to_string()
                    });
                    self.unknown_field(m, path, ACTION_FIELDS, hint)
                }
            }
        }
        if !has_command {
            self.err(
                node.pos,
                path,
                "missing \"command\" (required): the program to run",
            );
        }
        (self.errs.len() == errs_before && event.is_some()).then_some(d)
    }

    fn command(&mut self, node: &Node, path: &JPath) -> Option<(String, Result<PathBuf, String>)> {
        let cmd = self.os_string(node, path)?;
        let pos = node.pos;
        if let Some(c) = cmd.chars().find(|c| SHELL_METACHARACTERS.contains(c)) {
            let what = match c {
                '\n' => "a newline".to_string(),
                '\'' => "a single quote (')".to_string(),
                '"' => "a double quote (\")".to_string(),
                c => format!("'{c}'"),
            };
            self.err(
                pos,
                path,
                format!(
                    "may not contain {what} — hooks run without a shell; put arguments in \"args\""
                ),
            );
            return None;
        }
        if cmd.chars().any(|c| c.is_control()) {
            self.err(pos, path, "may not contain control characters");
            return None;
        }
        if cmd.trim().is_empty() {
            self.err(pos, path, "may not be empty: name the program to run");
            return None;
        }
        // A bare name: no '/' in its first word ("python3 /opt/x.py" is a bare name with an
        // argument glued on), unless the whole text names a file in the workspace.
        let first_word = cmd.split_whitespace().next().unwrap_or_default();
        let names_a_workspace_file =
            cmd.contains('/') && std::fs::symlink_metadata(self.ws.join(cmd)).is_ok();
        let bare = !first_word.contains('/') && !names_a_workspace_file;
        if bare {
            if cmd.chars().any(char::is_whitespace) {
                let mut words = cmd.split_whitespace();
                let program = words.next().unwrap_or_default();
                let rest: Vec<String> = words.map(quote).collect();
                self.err(
                    pos,
                    path,
                    format!(
                        "may not contain whitespace: a bare command is one program name; put \
                         arguments in \"args\": \"command\": {}, \"args\": [{}]",
                        quote(program),
                        rest.join(", ")
                    ),
                );
                return None;
            }
            if cmd == "." || cmd == ".." {
                self.err(
                    pos,
                    path,
                    format!("{} is a directory, not a program", quote(cmd)),
                );
                return None;
            }
            // Resolved once per name and file: a file repeating one command thousands of
            // times costs one PATH lookup, not thousands. (The table's "path" is read before
            // any hook: top-level fields come first.)
            let program = match self.resolved.get(cmd) {
                Some(p) => p.clone(),
                None => {
                    let p = resolve_bare_in(cmd, self.path.as_deref().unwrap_or(SANITIZED_PATH));
                    self.resolved.insert(cmd.to_string(), p.clone());
                    p
                }
            };
            if let Err(why) = &program {
                self.warn(pos, path, format!("{why}; the hook will fail to spawn"));
            }
            return Some((cmd.to_string(), program));
        }
        let written = Path::new(cmd);
        let full = if written.is_absolute() {
            written.to_path_buf()
        } else {
            self.inside(written, pos, path, "the command")?
        };
        match std::fs::metadata(&full) {
            Ok(meta) if meta.is_file() => {
                use std::os::unix::fs::PermissionsExt;
                if meta.permissions().mode() & 0o111 == 0 {
                    self.warn(
                        pos,
                        path,
                        format!(
                            "{} is not executable; the hook will fail to spawn",
                            quote(cmd)
                        ),
                    );
                }
            }
            Ok(_) => self.warn(
                pos,
                path,
                format!("{} is not a file; the hook will fail to spawn", quote(cmd)),
            ),
            Err(_) => {
                let hint = if cmd.chars().any(char::is_whitespace) {
                    "; if part of it is meant as an argument, put it in \"args\""
                } else {
                    ""
                };
                self.warn(
                    pos,
                    path,
                    format!(
                        "{} does not exist; the hook will fail to spawn{hint}",
                        quote(cmd)
                    ),
                );
            }
        }
        Some((cmd.to_string(), Ok(full)))
    }

    /// A relative (or absolute) path that must stay inside the workspace: checked lexically,
    /// and, when it exists, again after resolving symlinks. Returns the absolute path.
    fn inside(&mut self, written: &Path, pos: usize, path: &JPath, what: &str) -> Option<PathBuf> {
        let escape = |v: &mut Validator| {
            v.err(
                pos,
                path,
                format!(
                    "{what} {} is outside the workspace; {}",
                    quote(&written.display().to_string()),
                    if what == "the command" {
                        "use a path inside it (such as \"./hooks/x.sh\") or an absolute path"
                    } else {
                        "hooks run in the workspace or a directory inside it"
                    }
                ),
            );
        };
        let (base, rel) = if written.is_absolute() {
            let lexical = normalize(written);
            let rel = [Some(&self.ws), self.ws_canon.as_ref()]
                .into_iter()
                .flatten()
                .find_map(|r| lexical.as_ref().and_then(|l| l.strip_prefix(r).ok()))
                .map(Path::to_path_buf);
            match rel {
                Some(rel) => (self.ws.clone(), rel),
                None => {
                    escape(self);
                    return None;
                }
            }
        } else {
            match normalize(written) {
                Some(rel) => (self.ws.clone(), rel),
                None => {
                    escape(self);
                    return None;
                }
            }
        };
        // (`join` of an empty path would add a trailing '/').
        let full = if rel.as_os_str().is_empty() {
            base
        } else {
            base.join(&rel)
        };
        if let (Some(canon_ws), Ok(canon)) = (&self.ws_canon, std::fs::canonicalize(&full))
            && !canon.starts_with(canon_ws)
        {
            self.err(
                pos,
                path,
                format!(
                    "{what} {} leads outside the workspace through a symbolic link (to {})",
                    quote(&written.display().to_string()),
                    quote(&canon.display().to_string())
                ),
            );
            return None;
        }
        Some(full)
    }

    fn args(&mut self, node: &Node, path: &JPath) -> Vec<String> {
        let Val::Arr(items) = &node.val else {
            self.type_err(node, path, "an array of strings");
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len().min(MAX_ARGS));
        for (i, item) in items.iter().enumerate() {
            let p = path.index(i);
            if i == MAX_ARGS {
                self.err(
                    item.pos,
                    &p,
                    format!("too many arguments: at most {MAX_ARGS}"),
                );
                break;
            }
            if let Some(s) = self.os_string(item, &p) {
                out.push(s.to_string());
            }
        }
        out
    }

    fn env(&mut self, node: &Node, path: &JPath) -> Vec<(String, String)> {
        let Val::Obj(members) = &node.val else {
            self.type_err(node, path, "an object of variable names to strings");
            return Vec::new();
        };
        let mut out = Vec::with_capacity(members.len().min(MAX_ENV));
        for (i, m) in members.iter().enumerate() {
            let p = path.key(&m.key);
            if i == MAX_ENV {
                self.err(
                    m.key_pos,
                    &p,
                    format!("too many variables: at most {MAX_ENV}"),
                );
                break;
            }
            let name_ok = self.env_name(&m.key, m.key_pos, &p, "set");
            let value = self.os_string(&m.value, &p);
            if let (true, Some(value)) = (name_ok, value) {
                out.push((m.key.clone(), value.to_string()));
            }
        }
        out
    }

    fn cwd(&mut self, node: &Node, path: &JPath) -> Option<(String, PathBuf)> {
        let cwd = self.os_string(node, path)?;
        if cwd.is_empty() {
            self.err(
                node.pos,
                path,
                "may not be empty; leave \"cwd\" out to run in the workspace",
            );
            return None;
        }
        let full = self.inside(Path::new(cwd), node.pos, path, "the directory")?;
        match std::fs::metadata(&full) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => self.warn(
                node.pos,
                path,
                format!(
                    "{} is not a directory; the hook will fail to spawn",
                    quote(cwd)
                ),
            ),
            Err(_) => self.warn(
                node.pos,
                path,
                format!(
                    "{} does not exist (yet); the hook will fail to spawn until it does",
                    quote(cwd)
                ),
            ),
        }
        Some((cwd.to_string(), full))
    }

    fn matcher(&mut self, node: &Node, path: &JPath, event: Option<EventKind>) -> Option<Matcher> {
        let src = self.string(node, path)?;
        if let Some(e) = event
            && !matches!(e, EventKind::ToolCallStart | EventKind::ToolCall)
        {
            self.err(
                node.pos,
                path,
                format!(
                    "a matcher only applies to tool_call_start and tool_call hooks (this one \
                     is {} {} hook); remove it",
                    e.article(),
                    e.name()
                ),
            );
            return None;
        }
        match Matcher::parse(src) {
            Ok(m) => m,
            Err(reason) => {
                self.err(node.pos, path, reason);
                None
            }
        }
    }

    /// Gives every draft its id (explicit ones first, so a derived id never takes an explicit
    /// one) and builds the actions.
    fn assign_ids(&mut self, drafts: Vec<Draft>, top_timeout_ms: u64) -> Vec<Arc<Action>> {
        let mut taken: HashMap<String, usize> = HashMap::new();
        for d in &drafts {
            if let Some((id, pos)) = &d.explicit_id {
                match taken.get(id) {
                    Some(&first) => self.errs.push(RawError {
                        pos: *pos,
                        path: d.path.key("id"),
                        reason: format!("duplicate id {}", quote(id)),
                        first: Some(first),
                    }),
                    None => {
                        taken.insert(id.clone(), *pos);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(drafts.len());
        // Per derived base id, the next suffix to try: identical hooks are numbered in one
        // pass (`-2`, `-3`, …) instead of rescanning from `-2` for each.
        let mut next_suffix: HashMap<String, usize> = HashMap::new();
        for d in drafts {
            let (id, id_explicit) = match d.explicit_id {
                Some((id, _)) => (id, true),
                None => {
                    let base = derived_id(&d);
                    let n = next_suffix.entry(base.clone()).or_insert(1);
                    let mut id = if *n == 1 {
                        base.clone()
                    } else {
                        format!("{base}-{n}")
                    };
                    while taken.contains_key(&id) {
                        *n += 1;
                        id = format!("{base}-{n}");
                    }
                    *n += 1;
                    taken.insert(id.clone(), usize::MAX);
                    (id, false)
                }
            };
            let timeout_ms = d.timeout_ms.unwrap_or(top_timeout_ms);
            out.push(Arc::new(Action {
                id,
                id_explicit,
                event: d.event,
                index: d.index,
                command: d.command,
                program: d.program,
                args: d.args,
                env: d.env,
                cwd: d.cwd,
                timeout: Duration::from_millis(timeout_ms),
                timeout_explicit: d.timeout_ms.is_some(),
                stdin_json: d.stdin_json,
                enabled: d.enabled,
                matcher: d.matcher,
                max_concurrent: d.max_concurrent,
                limits: d.limits,
            }));
        }
        out
    }
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
