//! `<workspace>/plugins/<name>/plugin.toml`: the WASM plugin manifest (ARCHITECTURE.md § WASM plugins).
//!
//! Every subdirectory of `<workspace>/plugins/` is one plugin (names starting with `.` are
//! ignored); its `plugin.toml` says what the plugin is, which `.wasm` component to run, which
//! lifecycle events and topics it wants, what it may use and how much. The format is PRX's, so a
//! manifest written for PRX loads unchanged:
//!
//! ```toml
//! [plugin]
//! name = "audit"              # required: 1-64 of A-Z a-z 0-9 _ -, equal to the directory name
//! version = "0.1.0"           # required, non-empty
//! wasm = "plugin.wasm"        # default; relative to the directory, may not leave it
//! description = "…"           # optional, like author, license and PRX's api_version
//!
//! [[capabilities]]
//! type = "hook"               # required; only "hook" capabilities are used here
//! name = "count"              # optional, like description, priority (an integer), schedule
//! events = ["agent_start", "prx.lifecycle.tool_call"]   # a list of patterns, and/or:
//! [[capabilities.events]]
//! pattern = "prx.lifecycle.*"
//! description = "…"
//!
//! [permissions]
//! required = ["log", "kv", "events"]   # "events" grants prx:host/events
//! optional = []
//! http_allowlist = []                  # accepted and kept, unused here (like filesystem_allowlist)
//!
//! [resources]
//! max_fuel = 1_000_000_000    # per call (refilled), ≥ 1
//! max_memory_mb = 64          # 1..=4096
//! max_execution_time_ms = 30_000   # 1..=3600000
//! max_kv_storage_mb = 10      # 0..=1024
//! pool_size = 1               # 0..=64; 0 (what PRX writes) means the default, 1
//!
//! [config]                    # exposed through prx:host/config as strings
//! greeting = "hello"
//! ```
//!
//! Event patterns, in hook capabilities: a bare event name (`tool_call`, or PRX's spelling
//! `Tool-Call`, normalized like hooks.json's event keys; PRX's `agent_stop` means `agent_end`)
//! stands for its topic `prx.lifecycle.tool_call`; `prx.lifecycle.<event>`, `prx.lifecycle.*` and
//! `*` are kept; any other dotted pattern is a bus pattern for custom topics (an exact topic or a
//! prefix ending in `.*`). [`Manifest::patterns`] holds the normalized patterns, without
//! repeats, in file order; [`Manifest::events`] the lifecycle events they match. Other capability
//! types (tool, middleware, cron, provider, storage, …) are accepted and not used.
//!
//! Checks: [`parse`] reports every problem it finds, each as `FILE:LINE:COL: key.path: reason`
//! (TOML dotted paths such as `capabilities[0].events[1].pattern`), pointing at the offending
//! value or key, or at the table header when a required key is missing. TOML syntax errors
//! (duplicate keys among them) are reported alone, with toml's message. Unknown keys anywhere
//! are errors, with a "did you mean" when a known key is close: a misspelled limit must never be
//! silently ignored. Besides the keys above, PRX's other keys are accepted so its manifests load:
//! `[plugin] api_version`, `[[capabilities]] schedule` (cron), `[resources]
//! max_http_requests_per_call` (its code) and `max_http_requests` / `max_kv_storage_kb` (its
//! docs; `max_kv_storage_kb` sets the KV cap, rounded up to whole MiB, when `max_kv_storage_mb`
//! is absent). [`load`] adds the file rules: `plugin.toml` may not be a symbolic link or exceed
//! [`MAX_MANIFEST_BYTES`], and must be UTF-8. The `.wasm` file must exist as a regular file
//! inside the plugin directory, also once symbolic links are resolved; it is not compiled here.

use crate::bus::check_pattern;
use crate::config::{ConfigError, ConfigErrors, Lines, normalize, normalize_event_key, quote};
use crate::event::{EventKind, EventMask};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use toml::Spanned;
use toml::de::{DeString, DeTable, DeValue};

mod check;
mod policy;

use check::Check;
pub use policy::PolicySpec;

/// The manifest's file name inside a plugin directory.
pub const MANIFEST_FILE: &str = "plugin.toml";
/// Largest accepted manifest.
pub const MAX_MANIFEST_BYTES: u64 = 256 * 1024;
/// The directory under the workspace that holds one subdirectory per plugin.
pub const PLUGINS_DIR: &str = "plugins";
/// `[plugin] wasm` when it is not given.
pub const DEFAULT_WASM: &str = "plugin.wasm";
/// Longest plugin name.
pub const MAX_NAME_LEN: usize = 64;
/// Most errors one manifest reports; the rest are counted in a last line.
pub const MAX_ERRORS: usize = 100;

/// `max_memory_mb` range.
pub const MAX_MEMORY_MB: u64 = 4096;
/// `max_execution_time_ms` range (1 ms to an hour).
pub const MAX_EXECUTION_TIME_MS: u64 = 3_600_000;
/// `max_kv_storage_mb` range (0 disables writes).
pub const MAX_KV_STORAGE_MB: u64 = 1024;
/// `pool_size` range (0 means the default, 1).
pub const MAX_POOL_SIZE: u32 = 64;

/// Permission names `[permissions] required` / `optional` may list: PRX's host interfaces
/// (its code and docs). Here `log` and `config` are always granted and `events` gates
/// `prx:host/events`; `kv` is accepted (kv is always linked). The others name PRX interfaces this
/// host does not provide; they are accepted so PRX manifests load, and grant nothing.
pub const KNOWN_PERMISSIONS: &[&str] = &[
    "log",
    "config",
    "kv",
    "events",
    "clock",
    "memory",
    "http-outbound",
    "websocket-outbound",
    "filesystem",
    "llm",
    "messaging",
];

/// PRX's capability types (only `hook` is used here). A type that is not one of these is
/// accepted and ignored, unless it is a near miss of one (`hok`), which is an error.
pub const CAPABILITY_TYPES: &[&str] = &[
    "hook",
    "tool",
    "middleware",
    "cron",
    "provider",
    "storage",
    "channel",
];

const TOP_KEYS: &[&str] = &[
    "plugin",
    "capabilities",
    "permissions",
    "resources",
    "config",
    "policy",
];
const PLUGIN_KEYS: &[&str] = &[
    "name",
    "version",
    "wasm",
    "description",
    "author",
    "license",
    "api_version",
];
const CAPABILITY_KEYS: &[&str] = &[
    "type",
    "name",
    "description",
    "priority",
    "events",
    "schedule",
];
const EVENT_KEYS: &[&str] = &["pattern", "description"];
const PERMISSION_KEYS: &[&str] = &[
    "required",
    "optional",
    "http_allowlist",
    "filesystem_allowlist",
];
const RESOURCE_KEYS: &[&str] = &[
    "max_fuel",
    "max_memory_mb",
    "max_execution_time_ms",
    "max_kv_storage_mb",
    "pool_size",
    "max_http_requests_per_call",
    "max_http_requests",
    "max_kv_storage_kb",
];
/// Where a key that is unknown in one table belongs (for the hint).
const SECTIONS: &[(&str, &[&str])] = &[
    ("[plugin]", PLUGIN_KEYS),
    ("[[capabilities]]", CAPABILITY_KEYS),
    ("[permissions]", PERMISSION_KEYS),
    ("[resources]", RESOURCE_KEYS),
    ("[policy]", policy::POLICY_KEYS),
];

/// A checked plugin manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Manifest {
    /// `[plugin] name`: equal to the directory's name.
    pub name: String,
    /// `[plugin] version`: non-empty.
    pub version: String,
    /// `[plugin] description`.
    pub description: Option<String>,
    /// `[plugin] author`.
    pub author: Option<String>,
    /// `[plugin] license`.
    pub license: Option<String>,
    /// The plugin directory, as given to [`parse`] / [`load`].
    pub dir: PathBuf,
    /// How messages name the manifest (`ws/plugins/audit/plugin.toml`).
    pub file: String,
    /// The component: `dir` joined with `[plugin] wasm` (lexically normalized). Checked to be
    /// relative, inside `dir` (also through symbolic links) and a regular file.
    pub wasm: PathBuf,
    /// Every capability, in file order (only `hook` ones are used).
    pub capabilities: Vec<Capability>,
    /// The event patterns of all hook capabilities, normalized to topic patterns
    /// (`agent_start` → `prx.lifecycle.agent_start`; `prx.lifecycle.*`, `*` and custom topic
    /// patterns kept), without repeats, in file order.
    pub patterns: Vec<String>,
    /// The lifecycle events [`patterns`](Manifest::patterns) match (serialized as their names).
    #[serde(serialize_with = "serialize_mask")]
    pub events: EventMask,
    /// `[permissions]`.
    pub permissions: Permissions,
    /// `[resources]`, with defaults filled in.
    pub resources: Resources,
    /// `[policy]`: the plugin is a WASM policy too (or only), answering these decision points.
    pub policy: Option<PolicySpec>,
    /// `[config]`: strings as written; integers as decimal text (`1_000` → `1000`), floats,
    /// booleans and date-times as their TOML text.
    pub config: BTreeMap<String, String>,
    /// The text this was parsed from (what the host fingerprints: the file is not read twice).
    #[serde(skip)]
    pub source: String,
    /// `[plugin] name` as written, when it differs from the directory's name (which is the
    /// plugin's name here, as it keys kv, stats and metric labels).
    pub declared_name: Option<String>,
    /// What was accepted but deserves a look: unknown keys at the top level and in `[plugin]`
    /// (PRX ignores them), a name that differs from the directory's. Same format as errors.
    #[serde(skip)]
    pub warnings: Vec<ConfigError>,
}

impl Manifest {
    /// Whether it declares a `hook` capability (what this host runs); other plugins (tools,
    /// middleware, …) are skipped.
    pub fn is_hook(&self) -> bool {
        self.capabilities.iter().any(Capability::is_hook)
    }

    /// Whether it declares `[policy]` (a WASM policy: what the decision lane asks).
    pub fn is_policy(&self) -> bool {
        self.policy.is_some()
    }
}

fn serialize_mask<S: serde::Serializer>(mask: &EventMask, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        EventKind::ALL
            .into_iter()
            .filter(|k| mask.contains(*k))
            .map(EventKind::name),
    )
}

/// One `[[capabilities]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Capability {
    /// `type`: `hook`, `tool`, ….
    pub kind: String,
    /// `name`.
    pub name: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// `priority`: kept, unused here.
    pub priority: Option<i32>,
    /// `schedule` (PRX's cron): kept, unused here.
    pub schedule: Option<String>,
    /// For a hook: its normalized patterns (see [`event_pattern`]). For other types: the
    /// patterns as written.
    pub events: Vec<String>,
}

impl Capability {
    /// Whether it is a `hook` capability (the only kind this host runs).
    pub fn is_hook(&self) -> bool {
        self.kind == "hook"
    }
}

/// `[permissions]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Permissions {
    /// `required`: the host interfaces the plugin needs.
    pub required: Vec<String>,
    /// `optional`: the host interfaces the plugin may use.
    pub optional: Vec<String>,
    /// `"events"` is listed in `required` or `optional`: the plugin may use `prx:host/events`.
    pub events: bool,
    /// Accepted and kept; this host makes no HTTP requests for plugins.
    pub http_allowlist: Vec<String>,
    /// Accepted and kept; plugins get no file system access.
    pub filesystem_allowlist: Vec<String>,
}

/// `[resources]`, with defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Resources {
    /// Fuel per call (refilled before each call); ≥ 1.
    pub max_fuel: u64,
    /// Linear memory cap, MiB; 1..=4096.
    pub max_memory_mb: u64,
    /// Wall-clock limit per call, ms; 1..=3600000.
    pub max_execution_time_ms: u64,
    /// KV storage cap, MiB; 0..=1024.
    pub max_kv_storage_mb: u64,
    /// Live instances kept per plugin; 1..=64 (a written 0 means 1).
    pub pool_size: u32,
}

impl Resources {
    /// Every limit at its default.
    pub const DEFAULT: Resources = Resources {
        max_fuel: 1_000_000_000,
        max_memory_mb: 64,
        max_execution_time_ms: 30_000,
        max_kv_storage_mb: 10,
        pool_size: 1,
    };
}

impl Default for Resources {
    fn default() -> Resources {
        Resources::DEFAULT
    }
}

fn invalid_name(name: &str) -> String {
    format!(
        "{} is not a valid plugin name: 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ -",
        quote(name)
    )
}

/// `[A-Za-z0-9_-]{1,64}`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// How [`load`] names a plugin directory's manifest in messages: `plugin.toml` for the current
/// directory, the joined path otherwise.
pub fn file_label(dir: &Path) -> String {
    if dir.as_os_str().is_empty() || dir == Path::new(".") {
        MANIFEST_FILE.to_string()
    } else {
        one_line(&dir.join(MANIFEST_FILE).display().to_string())
    }
}

/// Normalizes one event pattern of a hook capability, or says why it is invalid (the reason
/// alone, without the pattern's place). The result is a bus pattern: `*`, `prx.lifecycle.*`,
/// `prx.lifecycle.<event>`, or a custom topic pattern (an exact topic or a prefix + `.*`).
pub fn event_pattern(written: &str) -> Result<String, String> {
    const LIFECYCLE: &str = crate::bus::LIFECYCLE_PREFIX;
    let names: Vec<&str> = EventKind::ALL.iter().map(|k| k.name()).collect();
    if written.is_empty() {
        return Err(
            "an empty pattern matches nothing; write an event name such as \"tool_call\", \
             a topic pattern such as \"prx.lifecycle.*\", or \"*\""
                .into(),
        );
    }
    if written == "*" {
        return Ok("*".into());
    }
    if !written.contains('.') {
        let norm = normalize_event_key(written);
        if let Some(kind) = lifecycle_event(&norm) {
            return Ok(kind.topic().into());
        }
        let hint = match crate::suggest(&norm, &names) {
            Some(s) => format!("; did you mean \"{s}\"?"),
            None => format!(
                "; expected one of {}, a topic pattern such as \"prx.lifecycle.*\", or \"*\"",
                names.join(", ")
            ),
        };
        return Err(format!("unknown event {}{hint}", quote(written)));
    }
    let lower = written.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix(LIFECYCLE)
        && !rest.is_empty()
    {
        let canonical = if rest == "*" {
            Some(format!("{LIFECYCLE}*"))
        } else {
            lifecycle_event(&normalize_event_key(rest)).map(|k| k.topic().to_string())
        };
        if let Some(c) = canonical {
            // The event part is normalized like a bare name; the prefix must be exact.
            if written.starts_with(LIFECYCLE) {
                return Ok(c);
            }
            return Err(format!("topics are case-sensitive; did you mean \"{c}\"?"));
        }
        let rest_written = &written[LIFECYCLE.len()..];
        let hint = match crate::suggest(&normalize_event_key(rest), &names) {
            Some(s) => format!("; did you mean \"{LIFECYCLE}{s}\"?"),
            None => format!(
                "; the lifecycle events are {}, or \"{LIFECYCLE}*\" for all of them",
                names.join(", ")
            ),
        };
        return Err(format!(
            "unknown lifecycle event {}{hint}",
            quote(rest_written)
        ));
    }
    check_pattern(written).map_err(|reason| {
        format!(
            "invalid pattern {}: {reason}; use an event name such as \"tool_call\", an exact \
             topic, a prefix ending in \".*\", or \"*\"",
            quote(written)
        )
    })?;
    Ok(written.to_string())
}

/// The lifecycle events a normalized pattern (see [`event_pattern`]) matches.
pub fn pattern_mask(pattern: &str) -> EventMask {
    crate::bus::pattern_lifecycle_mask(pattern)
}

/// An event name after [`normalize_event_key`], with PRX's `agent_stop` for `agent_end`.
fn lifecycle_event(norm: &str) -> Option<EventKind> {
    match norm {
        "agent_stop" => Some(EventKind::AgentEnd),
        n => EventKind::from_name(n),
    }
}

/// Loads `<dir>/plugin.toml`: it must be a regular file (not a symbolic link) of at most
/// [`MAX_MANIFEST_BYTES`], in UTF-8; then [`parse`] checks it, the plugin's name against the
/// directory's name among the rest.
pub fn load(dir: &Path) -> Result<Manifest, ConfigErrors> {
    let label = file_label(dir);
    let text = read_manifest(dir, &label)?;
    parse(&text, &label, dir)
}

fn read_manifest(dir: &Path, label: &str) -> Result<String, ConfigErrors> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let fail = |pos: usize, text: &str, reason: String| {
        Err(finish(
            label,
            text,
            vec![Raw {
                pos,
                path: "$".into(),
                reason,
            }],
        ))
    };
    let path = dir.join(MANIFEST_FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail(0, "", no_manifest_reason());
        }
        Err(e) => return fail(0, "", format!("cannot read the file: {e}")),
    };
    if meta.file_type().is_symlink() {
        return fail(
            0,
            "",
            "may not be a symbolic link; put the manifest itself in the plugin directory".into(),
        );
    }
    if !meta.is_file() {
        return fail(0, "", "is not a regular file".into());
    }
    let too_large = || {
        format!(
            "the file is larger than {} KiB (the limit)",
            MAX_MANIFEST_BYTES / 1024
        )
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return fail(0, "", too_large());
    }
    // Without following a link or waiting for a writer: a FIFO or a link swapped in since the
    // check above must not block the open (the load holds the loads' lock meanwhile).
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OPEN_FLAGS)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => return fail(0, "", format!("cannot read the file: {e}")),
    };
    // The file opened must be the one examined (not a symbolic link swapped in since).
    match file.metadata() {
        Ok(m) if m.dev() == meta.dev() && m.ino() == meta.ino() => {}
        Ok(_) => {
            return fail(
                0,
                "",
                "was replaced while being read (by a symbolic link?); try again".into(),
            );
        }
        Err(e) => return fail(0, "", format!("cannot read the file: {e}")),
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    if let Err(e) = file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes) {
        return fail(0, "", format!("cannot read the file: {e}"));
    }
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return fail(0, "", too_large());
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let valid = std::str::from_utf8(&e.as_bytes()[..at]).unwrap_or_default();
            fail(
                at,
                valid,
                format!("invalid UTF-8 at byte {at}; plugin.toml must be UTF-8"),
            )
        }
    }
}

/// How plugin files are opened (and then checked on the descriptor): never through a link
/// swapped in, never waiting for a FIFO's writer.
const OPEN_FLAGS: i32 = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY;

fn no_manifest_reason() -> String {
    format!(
        "no {MANIFEST_FILE}: every directory in {PLUGINS_DIR}/ is a plugin and needs one \
         (directories whose name starts with '.' are ignored)"
    )
}

/// What [`scan_all`] found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Hook plugins whose manifest loaded (with their own warnings inside).
    pub manifests: Vec<Manifest>,
    /// Plugins that are not hooks (tools, middleware, …: no `hook` capability), by name with
    /// the reason; not ours to run.
    pub skipped: Vec<(String, String)>,
    /// Directories without a plugin.toml (skipped, as PRX would not load them as hooks), and
    /// the warnings of manifests that failed to load (so that they are said with the errors).
    pub warnings: Vec<ConfigError>,
    /// Every failing manifest's errors, in directory order.
    pub errors: Vec<ConfigError>,
    /// The directories whose manifest failed to load (a running policy of theirs stays).
    pub failed: Vec<String>,
}

/// Loads every plugin under `<workspace>/plugins/`: each subdirectory, in name order, except
/// those whose name starts with `.` (files there are ignored). A missing `plugins/` directory
/// means no plugins. The manifests that load are returned even when others fail; the errors
/// are every failing manifest's, in the same order. Directories without a plugin.toml and
/// plugins without a hook capability are left out (see [`scan_all`], which says so).
pub fn scan(workspace: &Path) -> (Vec<Manifest>, Vec<ConfigError>) {
    let s = scan_all(workspace);
    (s.manifests, s.errors)
}

/// [`scan`], with what was skipped and why.
pub fn scan_all(workspace: &Path) -> Scan {
    let plugins = workspace.join(PLUGINS_DIR);
    let dir_error = |e: std::io::Error| ConfigError {
        file: one_line(&plugins.display().to_string()),
        line: 1,
        col: 1,
        path: "$".into(),
        reason: one_line(&format!("cannot read the plugins directory: {e}")),
    };
    let mut out = Scan::default();
    let entries = match std::fs::read_dir(&plugins) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.errors.push(dir_error(e));
            return out;
        }
    };
    let mut names: Vec<OsString> = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                out.errors.push(dir_error(e));
                break;
            }
        };
        let name = entry.file_name();
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        // Follows a symbolic link to a directory: the plugin is wherever it points.
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            names.push(name);
        }
    }
    names.sort();
    for name in names {
        let dir = plugins.join(&name);
        if std::fs::symlink_metadata(dir.join(MANIFEST_FILE))
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            out.warnings.push(ConfigError {
                file: file_label(&dir),
                line: 1,
                col: 1,
                path: "$".into(),
                reason: format!(
                    "no {MANIFEST_FILE}: the directory is skipped (a plugin needs one to say \
                     which events it takes)"
                ),
            });
            continue;
        }
        match load_with_warnings(&dir) {
            (Ok(m), _) if !m.is_hook() && !m.is_policy() => {
                let kinds: Vec<&str> = m.capabilities.iter().map(|c| c.kind.as_str()).collect();
                let reason = if kinds.is_empty() {
                    "declares no capability".to_string()
                } else {
                    format!("a {} plugin, not a hook", kinds.join("/"))
                };
                out.skipped.push((m.name, reason));
            }
            (Ok(m), _) => out.manifests.push(m),
            (Err(errs), warnings) => {
                out.failed.push(name.to_string_lossy().into_owned());
                out.errors.extend(errs);
                out.warnings.extend(warnings);
            }
        }
    }
    out
}

/// Parses and checks the text of a plugin.toml. `file_label` names the file in messages; `dir`
/// is the plugin's directory: the name must equal its file name (unless it has none, such as
/// `.`), and `[plugin] wasm` is resolved and checked against it.
pub fn parse(text: &str, file_label: &str, dir: &Path) -> Result<Manifest, ConfigErrors> {
    parse_with_warnings(text, file_label, dir).0
}

/// [`load`], with the manifest's warnings also when it has errors (on success they are the
/// manifest's own).
pub fn load_with_warnings(dir: &Path) -> (Result<Manifest, ConfigErrors>, Vec<ConfigError>) {
    let label = file_label(dir);
    match read_manifest(dir, &label) {
        Ok(text) => parse_with_warnings(&text, &label, dir),
        Err(e) => (Err(e), Vec::new()),
    }
}

/// [`parse`], with the warnings found also when the text has errors (none when it is not
/// TOML: nothing was checked).
pub fn parse_with_warnings(
    text: &str,
    file_label: &str,
    dir: &Path,
) -> (Result<Manifest, ConfigErrors>, Vec<ConfigError>) {
    let label = one_line(file_label);
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        let reason = format!(
            "the file is larger than {} KiB (the limit)",
            MAX_MANIFEST_BYTES / 1024
        );
        return (
            Err(finish(
                &label,
                "",
                vec![Raw {
                    pos: 0,
                    path: "$".into(),
                    reason,
                }],
            )),
            Vec::new(),
        );
    }
    let (root, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        let errs = syntax
            .iter()
            .map(|e| Raw {
                pos: e.span().map_or(0, |s| s.start),
                path: "$".into(),
                reason: format!("invalid TOML: {}", one_line(e.message().trim())),
            })
            .collect();
        return (Err(finish(&label, text, errs)), Vec::new());
    }
    let mut c = Check {
        text,
        dir,
        errs: Vec::new(),
        warns: Vec::new(),
    };
    let mut manifest = c.document(root.get_ref(), &label);
    let warnings = finish(&label, text, c.warns).0;
    if c.errs.is_empty() {
        manifest.warnings = warnings.clone();
        (Ok(manifest), warnings)
    } else {
        (Err(finish(&label, text, c.errs)), warnings)
    }
}

/// One problem, located by byte offset.
struct Raw {
    pos: usize,
    path: String,
    reason: String,
}

/// Raw errors → `ConfigErrors`, in file order, at most [`MAX_ERRORS`] (then a line counting
/// the rest).
fn finish(label: &str, text: &str, mut errs: Vec<Raw>) -> ConfigErrors {
    errs.sort_by_key(|e| e.pos);
    errs.dedup_by(|a, b| a.pos == b.pos && a.path == b.path && a.reason == b.reason);
    if errs.len() > MAX_ERRORS {
        let more = errs.len() - MAX_ERRORS;
        errs.truncate(MAX_ERRORS + 1);
        let last = &mut errs[MAX_ERRORS];
        last.path = "$".into();
        last.reason = format!("… and {more} more errors (only the first {MAX_ERRORS} are shown)");
    }
    let lines = Lines::new(text);
    ConfigErrors(
        errs.into_iter()
            .map(|e| {
                let (line, col) = lines.locate(e.pos);
                ConfigError {
                    file: label.to_string(),
                    line,
                    col,
                    path: e.path,
                    reason: one_line(&e.reason),
                }
            })
            .collect(),
    )
}

type Val<'i> = Spanned<DeValue<'i>>;
type Key<'i> = Spanned<DeString<'i>>;

/// A TOML dotted path: `capabilities[0].events[1].pattern`, `config."a b"`.
fn key_path(parent: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key.len() <= 64
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key = if bare { key.to_string() } else { quote(key) };
    if parent.is_empty() {
        key
    } else {
        format!("{parent}.{key}")
    }
}

fn index_path(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

fn unknown_permission(name: &str) -> String {
    let close = crate::suggest(name, KNOWN_PERMISSIONS).or_else(|| {
        KNOWN_PERMISSIONS
            .iter()
            .copied()
            .find(|k| !name.is_empty() && k.starts_with(&name.to_ascii_lowercase()))
    });
    match close {
        Some(s) => format!("unknown permission {}; did you mean \"{s}\"?", quote(name)),
        None => format!(
            "unknown permission {}; expected one of {}",
            quote(name),
            KNOWN_PERMISSIONS.join(", ")
        ),
    }
}

/// Makes a text safe to print on one line (control characters escaped).
fn one_line(s: &str) -> String {
    if s.chars()
        .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    {
        let mut out = String::with_capacity(s.len() + 8);
        for c in s.chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                    out.push_str(&format!("\\u{:04x}", c as u32))
                }
                c => out.push(c),
            }
        }
        out
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_normalize() {
        let ok = |p: &str| event_pattern(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(ok("agent_start"), "prx.lifecycle.agent_start");
        assert_eq!(ok("LLM-Response"), "prx.lifecycle.llm_response");
        assert_eq!(ok("agent_stop"), "prx.lifecycle.agent_end");
        assert_eq!(ok("prx.lifecycle.tool_call"), "prx.lifecycle.tool_call");
        assert_eq!(ok("prx.lifecycle.Tool-Call"), "prx.lifecycle.tool_call");
        assert_eq!(ok("prx.lifecycle.agent_stop"), "prx.lifecycle.agent_end");
        assert_eq!(ok("prx.lifecycle.*"), "prx.lifecycle.*");
        assert_eq!(ok("*"), "*");
        assert_eq!(ok("myapp.audit.*"), "myapp.audit.*");
        assert_eq!(ok("tool.call"), "tool.call");
        for bad in [
            "",
            "tool_cal",
            "prx.lifecycle.nope",
            "a..b",
            "a.*.b",
            "PRX.lifecycle.*",
        ] {
            assert!(event_pattern(bad).is_err(), "{bad}");
        }
        assert!(
            event_pattern("tool_cal")
                .unwrap_err()
                .contains("did you mean \"tool_call\"")
        );
        assert!(
            event_pattern("prx.lifecycle.tool_cal")
                .unwrap_err()
                .contains("did you mean \"prx.lifecycle.tool_call\"")
        );
        assert!(
            event_pattern("PRX.Lifecycle.tool_call")
                .unwrap_err()
                .contains("case-sensitive; did you mean \"prx.lifecycle.tool_call\"")
        );
    }

    #[test]
    fn masks() {
        assert_eq!(pattern_mask("*"), EventMask::ALL);
        assert_eq!(pattern_mask("prx.lifecycle.*"), EventMask::ALL);
        assert_eq!(pattern_mask("prx.*"), EventMask::ALL);
        assert_eq!(
            pattern_mask("prx.lifecycle.tool_call"),
            EventKind::ToolCall.mask()
        );
        assert_eq!(pattern_mask("myapp.*"), EventMask::NONE);
        assert_eq!(pattern_mask("prx.lifecycle"), EventMask::NONE);
    }

    #[test]
    fn paths_and_quotes() {
        assert_eq!(key_path("", "plugin"), "plugin");
        assert_eq!(key_path("config", "a b"), "config.\"a b\"");
        assert_eq!(index_path("capabilities", 2), "capabilities[2]");
        assert_eq!(quote("a\"\n"), "\"a\\\"\\n\"");
        assert_eq!(one_line("a\nb"), "a\\nb");
    }

    #[test]
    fn lines_skip_a_bom() {
        let l = Lines::new("\u{feff}a = 1\nb");
        assert_eq!(l.locate(3), (1, 1));
        assert_eq!(l.locate(9), (2, 1));
    }
}
