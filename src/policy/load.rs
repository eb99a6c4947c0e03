//! Reading and validating `<workspace>/policies.json`: every problem reported at once as
//! `FILE:LINE:COL: JSON.PATH: reason`, with the same JSON reader and error format as hooks.json.

use super::command::MAX_COMMAND_POLICIES;
use super::model::{Condition, Decision, DecisionPoint, Policy, PolicyTable, Test};
use crate::config::spanned::{self, Member, Node, RawError, Val};
use crate::config::{
    ConfigError, ConfigErrors, Doc, JsonPath as JPath, Lines, Matcher, finish_errors, one_line,
    quote, raw_error,
};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The file's name inside the workspace.
pub const POLICIES_FILE: &str = "policies.json";
/// Largest accepted policies.json.
pub const MAX_FILE_BYTES: usize = 256 * 1024;
/// Most policies in one file.
pub const MAX_POLICIES: usize = 1024;
/// Most keys in one policy's `when`.
pub const MAX_CONDITIONS: usize = 32;
/// Most segments of one `when` path (`arguments.command` has 2).
pub const MAX_PATH_SEGMENTS: usize = 32;
/// Longest `regex` (and `matcher`, `agent`) a policy may write, in bytes. Compiled regexes are
/// also bounded (1 MiB each, the `regex` crate's size limit), like hooks' matchers.
pub const MAX_REGEX_BYTES: usize = 4096;

const TOP_FIELDS: &[&str] = &["policies", "enabled", "timeout_ms"];
const POLICY_FIELDS: &[&str] = &[
    "id",
    "on",
    "matcher",
    "agent",
    "when",
    "decision",
    "reason",
    "context",
    "enabled",
    "command",
    "args",
    "timeout_ms",
    "on_error",
];
/// The fields only a rule has (a command policy's command answers).
const RULE_ONLY: &[&str] = &["decision", "reason", "context"];
/// The fields only a command policy has.
const COMMAND_ONLY: &[&str] = &["args", "timeout_ms", "on_error"];
const TESTS: &[&str] = &["regex", "glob", "prefix", "equals"];

/// A workspace without policies.json: no rules, switched on.
pub(crate) fn empty_table() -> PolicyTable {
    PolicyTable {
        enabled: true,
        timeout: std::time::Duration::from_millis(super::command::DEFAULT_TIMEOUT_MS),
        ..PolicyTable::default()
    }
}

fn label(workspace: &Path) -> String {
    crate::config::label_of(workspace, POLICIES_FILE)
}

/// Reads `<workspace>/policies.json` like hooks.json (`O_NONBLOCK`, a regular file only,
/// bounded): `Ok(None)` when it does not exist.
fn read_file(workspace: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(workspace.join(POLICIES_FILE))
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
    let cap = MAX_FILE_BYTES as u64 + 4;
    let mut bytes = Vec::with_capacity(meta.len().min(cap) as usize);
    file.take(cap).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

fn io_error(label: &str, e: &std::io::Error) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        file: one_line(label),
        line: 1,
        col: 1,
        path: "$".into(),
        reason: one_line(&format!("cannot read the file: {e}")),
    }])
}

/// Loads `<workspace>/policies.json`: no file is an empty table (`source: None`).
///
/// # Examples
///
/// ```
/// let ws = std::env::temp_dir().join(format!("prx-hooks-doc-policies-{}", std::process::id()));
/// std::fs::create_dir_all(&ws)?;
/// std::fs::write(ws.join("policies.json"), r#"{"policies": [
///   {"id": "no-rm", "on": ["tool_call_start"], "matcher": "Bash",
///    "when": {"arguments.command": {"prefix": "rm "}}, "decision": "deny", "reason": "no"}]}"#)?;
/// let table = prx_hooks::policy::load(&ws)?;
/// assert_eq!(table.policies[0].id, "no-rm");
/// # std::fs::remove_dir_all(&ws)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load(workspace: &Path) -> Result<PolicyTable, ConfigErrors> {
    load_with_warnings(workspace).0
}

/// [`load`], with the warnings found also when the file has errors: what `validate` prints.
pub fn load_with_warnings(workspace: &Path) -> (Result<PolicyTable, ConfigErrors>, Vec<String>) {
    let label = label(workspace);
    match read_file(workspace) {
        Ok(None) => (Ok(empty_table()), Vec::new()),
        Ok(Some(bytes)) => {
            let (mut table, warnings) = parse_with_warnings(&bytes, &label, Some(workspace));
            if let Ok(t) = &mut table {
                t.source = Some(workspace.join(POLICIES_FILE));
            }
            (table, warnings)
        }
        Err(e) => (Err(io_error(&label, &e)), Vec::new()),
    }
}

/// Parses and validates the text of a policies.json; `file_label` names the file in messages.
/// A command policy's relative `command` is resolved against the current directory
/// ([`load`] resolves it against the workspace).
///
/// # Examples
///
/// ```
/// let bad = br#"{"policies": [{"id": "x", "on": "tool_call_start", "decision": "maybe"}]}"#;
/// let errs = prx_hooks::policy::parse(bad, "policies.json").unwrap_err();
/// assert!(errs.to_string().starts_with("policies.json:1:64: policies[0].decision: "));
/// ```
pub fn parse(text: &[u8], file_label: &str) -> Result<PolicyTable, ConfigErrors> {
    parse_with_warnings(text, file_label, None).0
}

fn parse_with_warnings(
    text: &[u8],
    file_label: &str,
    workspace: Option<&Path>,
) -> (Result<PolicyTable, ConfigErrors>, Vec<String>) {
    let label = one_line(file_label);
    let fail = |text: &str, errs: Vec<RawError>| (Err(finish_errors(&label, text, errs)), vec![]);
    let bytes = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    if bytes.len() > MAX_FILE_BYTES {
        let reason = format!(
            "the file is larger than {} KiB (the limit)",
            MAX_FILE_BYTES / 1024
        );
        return fail("", vec![raw_error(0, JPath::root(), reason)]);
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let valid = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default();
            let reason = format!("invalid UTF-8 at byte {}", e.valid_up_to());
            return fail(
                valid,
                vec![raw_error(e.valid_up_to(), JPath::root(), reason)],
            );
        }
    };
    let parsed = spanned::parse(text);
    let workspace = match workspace {
        Some(w) => std::path::absolute(w).unwrap_or_else(|_| w.to_path_buf()),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
    };
    let mut v = Checker {
        errs: parsed.duplicates,
        warns: Vec::new(),
        workspace,
        timeout: std::time::Duration::from_millis(super::command::DEFAULT_TIMEOUT_MS),
        id_pos: Vec::new(),
    };
    let root = match parsed.root {
        Ok(root) => root,
        Err(e) => {
            v.errs.push(e);
            return fail(text, v.errs);
        }
    };
    let table = v.document(&root);
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
        let mut table = table;
        table.id_at = v
            .id_pos
            .iter()
            .map(|(id, pos)| (id.clone(), lines.locate(*pos)))
            .collect();
        table.build_index();
        table.warnings = warnings.clone();
        (Ok(table), warnings)
    } else {
        (fail(text, v.errs).0, warnings)
    }
}

pub(super) struct Checker {
    pub(super) errs: Vec<RawError>,
    warns: Vec<RawError>,
    /// Where a relative command resolves.
    pub(super) workspace: PathBuf,
    /// The file's `timeout_ms` (read before the policies: top-level fields first).
    pub(super) timeout: std::time::Duration,
    /// Each id taken and where its value starts, in file order.
    id_pos: Vec<(String, usize)>,
}

/// One element of `policies` (short-lived: moved into the table as soon as it is read).
#[allow(clippy::large_enum_variant)]
enum Entry {
    Rule(Policy),
    Command(super::model::CommandPolicy),
}

impl Checker {
    pub(super) fn err(&mut self, pos: usize, path: &JPath, reason: impl Into<String>) {
        self.errs.push(raw_error(pos, path.clone(), reason));
    }

    fn warn(&mut self, pos: usize, path: &JPath, reason: impl Into<String>) {
        self.warns.push(raw_error(pos, path.clone(), reason));
    }

    pub(super) fn type_err(&mut self, node: &Node, path: &JPath, expected: &str) {
        let reason = format!("expected {expected}, found {}", node.val.kind());
        self.err(node.pos, path, reason);
    }

    pub(super) fn string<'n>(&mut self, node: &'n Node, path: &JPath) -> Option<&'n str> {
        match &node.val {
            Val::Str(s) => Some(s),
            _ => {
                self.type_err(node, path, "a string");
                None
            }
        }
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

    fn unknown(&mut self, m: &Member, path: &JPath, known: &[&str]) {
        let mut reason = format!("unknown field {}", quote(&m.key));
        match crate::suggest(&m.key, known) {
            Some(s) => reason.push_str(&format!("; did you mean \"{s}\"?")),
            None => reason.push_str(&format!("; expected one of {}", known.join(", "))),
        }
        self.err(m.key_pos, &path.key(&m.key), reason);
    }

    fn document(&mut self, root: &Node) -> PolicyTable {
        let mut table = empty_table();
        let Val::Obj(members) = &root.val else {
            self.type_err(root, &JPath::root(), "an object ({\"policies\": [ … ]})");
            return table;
        };
        let top = JPath::root();
        if let Some(m) = members.iter().find(|m| m.key == "timeout_ms")
            && let Some(t) = self.timeout_ms(&m.value, &top.key("timeout_ms"))
        {
            self.timeout = t;
            table.timeout = t;
        }
        let mut order = 0usize;
        for m in members {
            let path = top.key(&m.key);
            match m.key.as_str() {
                "timeout_ms" => {}
                "enabled" => {
                    if let Some(b) = self.boolean(&m.value, &path) {
                        table.enabled = b;
                    }
                }
                "policies" => match &m.value.val {
                    Val::Arr(items) => {
                        if items.len() > MAX_POLICIES {
                            self.err(
                                m.value.pos,
                                &path,
                                format!(
                                    "{} policies; at most {MAX_POLICIES} are allowed",
                                    items.len()
                                ),
                            );
                            continue;
                        }
                        let mut ids: HashMap<String, usize> = HashMap::new();
                        for (i, item) in items.iter().enumerate() {
                            let ipath = path.index(i);
                            if let Some((entry, id_pos)) = self.policy(item, &ipath, order) {
                                let id = match &entry {
                                    Entry::Rule(p) => &p.id,
                                    Entry::Command(c) => &c.id,
                                };
                                if let Some(&first) = ids.get(id) {
                                    let mut e = raw_error(
                                        id_pos,
                                        ipath.key("id"),
                                        format!("duplicate id {}", quote(id)),
                                    );
                                    e.first = Some(first);
                                    self.errs.push(e);
                                    continue;
                                }
                                ids.insert(id.clone(), id_pos);
                                self.id_pos.push((id.clone(), id_pos));
                                order += 1;
                                match entry {
                                    Entry::Rule(p) => table.policies.push(p),
                                    Entry::Command(c) => {
                                        if table.commands.len() == MAX_COMMAND_POLICIES {
                                            self.err(
                                                item.pos,
                                                &ipath,
                                                format!(
                                                    "more than {MAX_COMMAND_POLICIES} command policies (the limit: a decision may run them all at once)"
                                                ),
                                            );
                                        }
                                        table.commands.push(c)
                                    }
                                }
                            }
                        }
                    }
                    _ => self.type_err(&m.value, &path, "an array of policies"),
                },
                _ => self.unknown(m, &top, TOP_FIELDS),
            }
        }
        table
    }

    /// One policy; `None` when it has an error (reported). Also returns where its id is.
    fn policy(&mut self, node: &Node, path: &JPath, order: usize) -> Option<(Entry, usize)> {
        let Val::Obj(members) = &node.val else {
            self.type_err(node, path, "a policy object");
            return None;
        };
        let errors_before = self.errs.len();
        let field = |name: &str| members.iter().find(|m| m.key == name);
        let is_command = field("command").is_some();
        for m in members {
            let key = m.key.as_str();
            if !POLICY_FIELDS.contains(&key) {
                self.unknown(m, path, POLICY_FIELDS);
            } else if is_command && RULE_ONLY.contains(&key) {
                self.err(
                    m.key_pos,
                    &path.key(key),
                    format!(
                        "a command policy has no {}: its command answers (exit 2 denies with stderr as the reason, or a JSON decision on stdout)",
                        quote(key)
                    ),
                );
            } else if !is_command && COMMAND_ONLY.contains(&key) {
                self.err(
                    m.key_pos,
                    &path.key(key),
                    format!(
                        "only a command policy (one with \"command\") has {}",
                        quote(key)
                    ),
                );
            }
        }
        let id = match field("id") {
            Some(m) => self.string(&m.value, &path.key("id")).and_then(|s| {
                if crate::config::is_valid_id(s) {
                    Some((s.to_string(), m.value.pos))
                } else {
                    self.err(
                        m.value.pos,
                        &path.key("id"),
                        format!(
                            "{} is not a valid id: expected 1 to 64 of A-Z a-z 0-9 . _ -",
                            quote(s)
                        ),
                    );
                    None
                }
            }),
            None => {
                self.err(node.pos, path, "missing field \"id\"");
                None
            }
        };
        let on = match field("on") {
            Some(m) => self.points(&m.value, &path.key("on")),
            None => {
                self.err(
                    node.pos,
                    path,
                    "missing field \"on\": the decision points it answers (tool_call_start, prompt, permission)",
                );
                None
            }
        };
        let decision =
            match field("decision") {
                Some(m) => self.string(&m.value, &path.key("decision")).and_then(|s| {
                    match Decision::from_name(s) {
                        Some(d) => Some(d),
                        None => {
                            self.err(
                                m.value.pos,
                                &path.key("decision"),
                                format!(
                                    "{} is not a decision: expected \"allow\", \"ask\" or \"deny\"",
                                    quote(s)
                                ),
                            );
                            None
                        }
                    }
                }),
                None if is_command => None,
                None => {
                    self.err(
                        node.pos,
                        path,
                        "missing field \"decision\": expected \"allow\", \"ask\" or \"deny\"",
                    );
                    None
                }
            };
        let matcher = field("matcher").and_then(|m| self.matcher(m, path, "a tool"));
        if let (Some(m), Some(on)) = (field("matcher"), &on)
            && on.contains(&DecisionPoint::Prompt)
        {
            self.err(
                m.key_pos,
                &path.key("matcher"),
                "\"matcher\" names tools, and a prompt has none: answer \"prompt\" in a policy of its own without \"matcher\"",
            );
        }
        let agent = field("agent").and_then(|m| self.matcher(m, path, "an agent"));
        let when = match field("when") {
            Some(m) => self.conditions(&m.value, &path.key("when")),
            None => Vec::new(),
        };
        let reason = field("reason").and_then(|m| self.string(&m.value, &path.key("reason")));
        let context = field("context")
            .and_then(|m| self.string(&m.value, &path.key("context")))
            .map(str::to_string);
        let enabled = field("enabled")
            .and_then(|m| self.boolean(&m.value, &path.key("enabled")))
            .unwrap_or(true);
        let command = if is_command {
            self.command(members, path)
        } else {
            None
        };
        if self.errs.len() > errors_before {
            return None;
        }
        let ((id, id_pos), on) = (id?, on?);
        let points = on.iter().fold(0, |bits, p| bits | p.bit());
        if is_command {
            let spec = command?;
            return Some((
                Entry::Command(
                    spec.into_policy(id, on, points, matcher, agent, when, enabled, order),
                ),
                id_pos,
            ));
        }
        let decision = decision?;
        let reason = match reason {
            Some(r) => r.to_string(),
            None => format!("{decision} by policy {id}"),
        };
        if decision == Decision::Deny
            && enabled
            && matcher.as_ref().is_none_or(matches_everything)
            && agent.as_ref().is_none_or(matches_everything)
            && when.is_empty()
        {
            let points: Vec<&str> = on.iter().map(|p| p.as_str()).collect();
            self.warn(
                node.pos,
                path,
                format!(
                    "policy {} denies everything at {} (no matcher, agent or when narrows it)",
                    quote(&id),
                    points.join(", ")
                ),
            );
        }
        Some((
            Entry::Rule(Policy {
                id,
                on,
                points,
                matcher,
                matcher_ix: None,
                agent,
                when,
                decision,
                reason,
                context,
                enabled,
                order,
            }),
            id_pos,
        ))
    }

    fn points(&mut self, node: &Node, path: &JPath) -> Option<Vec<DecisionPoint>> {
        let items: Vec<(&Node, JPath)> = match &node.val {
            Val::Str(_) => vec![(node, path.clone())],
            Val::Arr(items) if !items.is_empty() => items
                .iter()
                .enumerate()
                .map(|(i, n)| (n, path.index(i)))
                .collect(),
            Val::Arr(_) => {
                self.err(
                    node.pos,
                    path,
                    "no decision point: expected one or more of \"tool_call_start\", \"prompt\", \"permission\"",
                );
                return None;
            }
            _ => {
                self.type_err(node, path, "a decision point or an array of them");
                return None;
            }
        };
        let mut out = Vec::new();
        for (n, p) in items {
            let name = self.string(n, &p)?;
            match DecisionPoint::from_name(name) {
                Some(point) if !out.contains(&point) => out.push(point),
                Some(_) => self.err(n.pos, &p, format!("{} is listed twice", quote(name))),
                None => {
                    let names: Vec<&str> = DecisionPoint::ALL.iter().map(|p| p.as_str()).collect();
                    // `tool_call` is the lifecycle event after the tool ran: too far for
                    // the edit distance, and the likeliest mix-up.
                    let close = crate::suggest(name, &names)
                        .or((name == "tool_call").then_some("tool_call_start"));
                    let hint = match close {
                        Some(s) => format!("; did you mean \"{s}\"?"),
                        None => format!("; expected one of {}", names.join(", ")),
                    };
                    self.err(
                        n.pos,
                        &p,
                        format!("{} is not a decision point{hint}", quote(name)),
                    );
                }
            }
        }
        Some(out)
    }

    fn matcher(&mut self, m: &Member, path: &JPath, what: &str) -> Option<Matcher> {
        let path = path.key(&m.key);
        let src = self.string(&m.value, &path)?;
        if src.len() > MAX_REGEX_BYTES {
            self.err(
                m.value.pos,
                &path,
                format!(
                    "{} bytes; a matcher is at most {MAX_REGEX_BYTES} bytes",
                    src.len()
                ),
            );
            return None;
        }
        match Matcher::parse(src) {
            Ok(matcher) => matcher,
            Err(reason) => {
                self.err(
                    m.value.pos,
                    &path,
                    format!("{reason} (a glob or regex matching {what}'s whole name)"),
                );
                None
            }
        }
    }

    fn conditions(&mut self, node: &Node, path: &JPath) -> Vec<Condition> {
        let Val::Obj(members) = &node.val else {
            self.type_err(
                node,
                path,
                "an object of conditions ({\"arguments.command\": {\"regex\": \"…\"}})",
            );
            return Vec::new();
        };
        if members.len() > MAX_CONDITIONS {
            self.err(
                node.pos,
                path,
                format!(
                    "{} conditions; at most {MAX_CONDITIONS} are allowed",
                    members.len()
                ),
            );
            return Vec::new();
        }
        members
            .iter()
            .filter_map(|m| self.condition(m, &path.key(&m.key)))
            .collect()
    }

    fn condition(&mut self, m: &Member, path: &JPath) -> Option<Condition> {
        let segments: Vec<String> = m.key.split('.').map(str::to_string).collect();
        if m.key.is_empty() || segments.iter().any(String::is_empty) {
            self.err(
                m.key_pos,
                path,
                format!(
                    "{} is not a path: expected dot-separated field names (\"arguments.command\")",
                    quote(&m.key)
                ),
            );
            return None;
        }
        if segments.len() > MAX_PATH_SEGMENTS {
            self.err(
                m.key_pos,
                path,
                format!(
                    "{} segments; a path has at most {MAX_PATH_SEGMENTS}",
                    segments.len()
                ),
            );
            return None;
        }
        let Val::Obj(tests) = &m.value.val else {
            self.type_err(
                &m.value,
                path,
                "an object with one of \"regex\", \"glob\", \"prefix\", \"equals\"",
            );
            return None;
        };
        let [t] = &tests[..] else {
            self.err(
                m.value.pos,
                path,
                format!(
                    "{} tests; expected exactly one of \"regex\", \"glob\", \"prefix\", \"equals\"",
                    tests.len()
                ),
            );
            return None;
        };
        let tpath = path.key(&t.key);
        let test = match t.key.as_str() {
            "regex" => {
                let src = self.string(&t.value, &tpath)?;
                if src.len() > MAX_REGEX_BYTES {
                    self.err(
                        t.value.pos,
                        &tpath,
                        format!(
                            "{} bytes; a regex is at most {MAX_REGEX_BYTES} bytes",
                            src.len()
                        ),
                    );
                    return None;
                }
                match regex::RegexBuilder::new(src)
                    .size_limit(1 << 20)
                    .nest_limit(64)
                    .build()
                {
                    Ok(r) => Test::Regex(r),
                    Err(regex::Error::CompiledTooBig(limit)) => {
                        self.err(
                            t.value.pos,
                            &tpath,
                            format!("the regex compiles to more than {limit} bytes (the limit)"),
                        );
                        return None;
                    }
                    Err(e) => {
                        let text = e.to_string();
                        let reason = text
                            .lines()
                            .rev()
                            .find_map(|l| l.trim().strip_prefix("error: "))
                            .unwrap_or(&text);
                        self.err(
                            t.value.pos,
                            &tpath,
                            format!("invalid regular expression: {}", one_line(reason)),
                        );
                        return None;
                    }
                }
            }
            "glob" => Test::Glob(self.string(&t.value, &tpath)?.to_string()),
            "prefix" => Test::Prefix(self.string(&t.value, &tpath)?.to_string()),
            "equals" => Test::Equals(to_json(&t.value)),
            _ => {
                let mut reason = format!("unknown test {}", quote(&t.key));
                match crate::suggest(&t.key, TESTS) {
                    Some(s) => reason.push_str(&format!("; did you mean \"{s}\"?")),
                    None => reason.push_str("; expected one of regex, glob, prefix, equals"),
                }
                self.err(t.key_pos, &tpath, reason);
                return None;
            }
        };
        Some(Condition {
            path: m.key.clone(),
            segments,
            test,
            in_set: None,
        })
    }
}

/// Whether a matcher is written to match every name (`*`, `.*`, `/.*/`).
fn matches_everything(m: &Matcher) -> bool {
    matches!(m.source().as_str(), "*" | ".*" | "/.*/" | "^.*$" | "/^.*$/")
}

/// A reader node as a JSON value (numbers as serde_json reads their spelling).
fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value;
    match &node.val {
        Val::Null => Value::Null,
        Val::Bool(b) => Value::Bool(*b),
        Val::Num(n) => serde_json::from_str(n).unwrap_or(Value::Null),
        Val::Str(s) => Value::String(s.clone()),
        Val::Arr(items) => Value::Array(items.iter().map(to_json).collect()),
        Val::Obj(members) => Value::Object(
            members
                .iter()
                .map(|m| (m.key.clone(), to_json(&m.value)))
                .collect(),
        ),
    }
}

/// policies.json, for the workspace watcher.
pub(crate) struct PoliciesDoc;

impl Doc for PoliciesDoc {
    type Table = PolicyTable;
    const FILE: &'static str = POLICIES_FILE;
    const WHAT: &'static str = "policies";
    fn read(workspace: &Path) -> std::io::Result<Option<Vec<u8>>> {
        read_file(workspace)
    }
    fn parse(bytes: &[u8], label: &str, workspace: &Path) -> Result<PolicyTable, ConfigErrors> {
        parse_with_warnings(bytes, label, Some(workspace)).0
    }
    fn empty() -> PolicyTable {
        empty_table()
    }
    fn set_source(table: &mut PolicyTable, file: PathBuf) {
        table.source = Some(file);
    }
    fn loaded(table: &PolicyTable) -> bool {
        table.source.is_some()
    }
    fn warnings(table: &PolicyTable) -> &[String] {
        &table.warnings
    }
    fn warn(table: &mut PolicyTable, warning: String) {
        table.warnings.push(warning);
    }
    fn live(table: &PolicyTable) -> String {
        let on = table.policies.iter().filter(|p| p.enabled).count()
            + table.commands.iter().filter(|c| c.enabled).count();
        if table.enabled {
            format!("{on} polic(ies) live")
        } else {
            format!("policies switched off (\"enabled\": false; {on} written)")
        }
    }
    fn size(table: &PolicyTable) -> (usize, bool) {
        (table.policies.len() + table.commands.len(), table.enabled)
    }
}
