//! `doctor`'s look at the agents' own files: each settings file read as its agent reads it,
//! every entry on an event the agent has with a handler type it runs there, our entries'
//! program and workspace, and the trust Codex and Gemini CLI want before they run a hook.

use super::{Finding, Level};
use crate::connect::agents::{self, is_ours, simple_words};
use crate::connect::json::{self, Node};
use crate::hook_table::{self, Agent};
use prx_hooks::agents::Handlers;
use prx_hooks::text::suggest;
use std::path::{Path, PathBuf};

/// Where one of our entries sends: a workspace (a command) or a URL (an http hook).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Target {
    Workspace(PathBuf),
    Url(String),
}

/// One of our entries.
#[derive(Clone, Debug)]
pub(crate) struct Ours {
    pub event: String,
    pub target: Target,
    /// Why it does not run, when it does not.
    pub why_not: Option<String>,
    /// Its place for Codex's trust record: `(group, handler)`.
    pub place: (usize, usize),
}

/// What one settings file holds.
#[derive(Debug, Default)]
pub(crate) struct FileCheck {
    pub findings: Vec<Finding>,
    pub ours: Vec<Ours>,
}

impl FileCheck {
    fn problem(&mut self, text: String) {
        self.findings.push(Finding::new(Level::Problem, text));
    }
}

/// What the agent does with a file it cannot read.
fn rejected(agent: Agent) -> &'static str {
    match agent {
        Agent::ClaudeCode => "Claude Code reports a settings error and applies none of this file",
        Agent::Codex => "Codex loads none of these hooks",
        Agent::GeminiCli => "Gemini CLI cannot read this file",
        Agent::Cursor => "Cursor runs none of these hooks",
        Agent::QwenCode => "Qwen Code cannot read this file",
        Agent::FactoryDroid => "Factory Droid loads none of these hooks",
        Agent::CopilotCli => "Copilot CLI loads none of this file's hooks",
        Agent::Windsurf => "Cascade loads none of these hooks",
    }
}

/// A hooks settings file (JSON) of `agent`, read as the agent reads it.
pub(crate) fn check_json(agent: Agent, path: &Path, text: &str, project: &Path) -> FileCheck {
    let mut check = FileCheck::default();
    let doc = match json::parse(text, agent.comments()) {
        Ok(doc) => doc,
        Err(e) => {
            check.problem(format!(
                "{}:{}:{}: {}: {}",
                path.display(),
                e.line,
                e.column,
                e.reason,
                rejected(agent)
            ));
            return check;
        }
    };
    let how = if agent.comments() {
        "JSON with comments"
    } else {
        "plain JSON, no comments"
    };
    check.findings.push(Finding::new(
        Level::Ok,
        format!("read as {} reads it ({how})", agent.title()),
    ));
    switched_off(agent, &doc.root, text, &mut check);
    let Some((_, hooks)) = doc.root.get("hooks") else {
        return check;
    };
    let Some(members) = hooks.value.members() else {
        check.problem(format!(
            "hooks: expected an object, found {}",
            hooks.value.what()
        ));
        return check;
    };
    for m in members {
        if !agent.config_members().contains(&m.key.as_str()) {
            check_event(agent, &m.key, &m.value, text, project, &mut check);
        }
    }
    check
}

/// The settings that turn hooks off: Claude Code's and Qwen Code's `disableAllHooks`, Gemini
/// CLI's `hooksConfig.enabled` (false: no hook runs) and `hooksConfig.disabled` (the names and
/// commands of hooks it skips; ours is named `prx-hooks`).
fn switched_off(agent: Agent, root: &Node, text: &str, check: &mut FileCheck) {
    fn value<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
        node.get(key).map(|(_, m)| &m.value)
    }
    match agent {
        Agent::ClaudeCode | Agent::QwenCode
            if value(root, "disableAllHooks").and_then(|v| v.bool(text)) == Some(true) =>
        {
            check.problem(format!(
                "disableAllHooks is true: {} runs no hook at all",
                agent.title()
            ));
        }
        Agent::GeminiCli => {
            let Some(config) = value(root, "hooksConfig") else {
                return;
            };
            if value(config, "enabled").and_then(|v| v.bool(text)) == Some(false) {
                check.problem(
                    "hooksConfig.enabled is false: Gemini CLI runs no hook (set it to true, or take it out)"
                        .into(),
                );
            }
            let disabled = value(config, "disabled")
                .and_then(Node::items)
                .unwrap_or(&[]);
            for name in disabled.iter().filter_map(Node::str) {
                let ours = name == "prx-hooks"
                    || simple_words(name).is_some_and(|w| agents::is_our_argv(&w, agent));
                if ours {
                    check.problem(format!(
                        "hooksConfig.disabled holds {name:?}: Gemini CLI skips our hooks (`/hooks enable prx-hooks`)"
                    ));
                }
            }
        }
        _ => {}
    }
}

/// One `hooks.<name>` member: the event, and each entry in it.
fn check_event(
    agent: Agent,
    name: &str,
    value: &Node,
    text: &str,
    project: &Path,
    check: &mut FileCheck,
) {
    let Some(items) = value.items() else {
        check.problem(format!(
            "hooks.{name}: expected an array, found {}",
            value.what()
        ));
        return;
    };
    let entries = entries_of(agent, items);
    let event = hook_table::event(agent, name);
    if event.is_none() && !entries.is_empty() {
        let names: Vec<&str> = hook_table::hook_events(agent)
            .iter()
            .map(|e| e.name)
            .collect();
        let hint = suggest(name, &names).map_or(String::new(), |s| format!(" (did you mean {s}?)"));
        check.problem(format!(
            "hooks.{name}: not an event {} has{hint}: its {} entr{} never run{}",
            agent.title(),
            entries.len(),
            if entries.len() == 1 { "y" } else { "ies" },
            if entries.len() == 1 { "s" } else { "" }
        ));
    }
    for (place, path, e) in entries {
        let path = format!("hooks.{name}{path}");
        let kind = e.get("type").and_then(|(_, m)| m.value.str());
        let handler = match (kind, agent) {
            (None, a) if a.untyped_is_command() => Some(Handlers::COMMAND),
            (None, _) => None,
            (Some(k), _) => Handlers::from_name(k),
        };
        let why_not = why_not_run(agent, event, handler, kind, e, text);
        if let (Some(why), Some(_)) = (&why_not, event) {
            check.problem(format!("{path}: {why}"));
        }
        if is_ours(agent, e) {
            ours_entry(agent, name, e, &path, place, why_not, project, check);
        }
    }
}

/// Each entry of an event's array, with its place and its path below `hooks.<event>`.
fn entries_of(agent: Agent, items: &[Node]) -> Vec<((usize, usize), String, &Node)> {
    let mut out = Vec::new();
    for (gi, item) in items.iter().enumerate() {
        if !agent.grouped() {
            out.push(((gi, 0), format!("[{gi}]"), item));
            continue;
        }
        let inner = item.get("hooks").and_then(|(_, m)| m.value.items());
        for (ii, e) in inner.unwrap_or(&[]).iter().enumerate() {
            out.push(((gi, ii), format!("[{gi}].hooks[{ii}]"), e));
        }
    }
    out
}

/// Why `agent` does not run an entry of type `kind` on `event` (`None`: it runs it).
fn why_not_run(
    agent: Agent,
    event: Option<&hook_table::HookEvent>,
    handler: Option<Handlers>,
    kind: Option<&str>,
    entry: &Node,
    text: &str,
) -> Option<String> {
    let Some(event) = event else {
        return Some(format!("not an event {} has", agent.title()));
    };
    let runs: Vec<&str> = event.handlers.names().collect();
    match handler {
        None => Some(match kind {
            Some(k) => format!(
                "a hook of type {k:?}, which {} does not know",
                agent.title()
            ),
            None => "no \"type\": the agent cannot tell what to run".into(),
        }),
        Some(h) if !event.handlers.contains(h) => Some(format!(
            "an {} hook on {}, which {} does not run there (it runs {} hooks there)",
            h.names().next().unwrap_or("?"),
            event.name,
            agent.title(),
            runs.join(", ")
        )),
        Some(_)
            if agent == Agent::Codex
                && entry
                    .get("async")
                    .is_some_and(|(_, m)| m.value.bool(text) == Some(true)) =>
        {
            Some("\"async\": true: Codex skips async hooks".into())
        }
        Some(_) => None,
    }
}

/// One of our entries: what it runs and where it sends, checked.
#[allow(clippy::too_many_arguments)]
fn ours_entry(
    agent: Agent,
    event: &str,
    e: &Node,
    path: &str,
    place: (usize, usize),
    why_not: Option<String>,
    project: &Path,
    check: &mut FileCheck,
) {
    let field = |k: &str| e.get(k).and_then(|(_, m)| m.value.str());
    let target = if field("type") == Some("http") {
        let url = field("url").unwrap_or_default();
        Target::Url(
            url.trim_end_matches(&format!("/api/ingest/{agent}"))
                .to_string(),
        )
    } else {
        let words = field(agent.command_field())
            .or_else(|| field("command"))
            .and_then(simple_words)
            .unwrap_or_default();
        program_found(&words, path, check);
        Target::Workspace(workspace_of(agent, &words, project))
    };
    let closes = hook_table::event(agent, event).is_some_and(|ev| ev.closes);
    let async_ = e.get("async").is_some();
    if agent == Agent::ClaudeCode && closes && async_ {
        check.problem(format!(
            "{path}: \"async\" on {event}: Claude Code may exit without waiting for it (the end of the turn or session is lost); run `prx-hooks connect claude-code` again"
        ));
    }
    check.ours.push(Ours {
        event: event.to_string(),
        target,
        why_not,
        place,
    });
}

/// The command's program exists where the shell would find it.
fn program_found(words: &[String], path: &str, check: &mut FileCheck) {
    let Some(program) = words.first() else {
        return;
    };
    let found = if program.contains('/') {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(program).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    } else {
        crate::connect::find_on_path(program).is_some()
    };
    if !found {
        let problem = format!(
            "{path}: runs {program}, which {}: the agent's hook fails with \"command not found\"; install prx-hooks (`cargo install --locked --path . --target-dir target`) or run `prx-hooks connect` again",
            if program.contains('/') {
                "does not exist or cannot run"
            } else {
                "is not on this shell's PATH"
            }
        );
        // Said once per program.
        if !check
            .findings
            .iter()
            .any(|f| f.text.contains(&format!("runs {program},")))
        {
            check.problem(problem);
        }
    }
}

/// The workspace a `send` command names (`--workspace`, default the directory the hook runs
/// in: the project), the agent's project directory variable standing for `project`.
pub(crate) fn workspace_of(agent: Agent, words: &[String], project: &Path) -> PathBuf {
    let given = words
        .windows(2)
        .find(|w| w[0] == "--workspace")
        .map(|w| w[1].clone())
        .or_else(|| {
            words
                .iter()
                .find_map(|w| w.strip_prefix("--workspace=").map(str::to_string))
        })
        .unwrap_or_else(|| ".".into());
    let expanded = expand(&given, agent, project);
    let p = PathBuf::from(&expanded);
    let p = if p.is_absolute() { p } else { project.join(p) };
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// `$VAR`, `${VAR}` and `${VAR:-default}` in a word: the agents' project directory variables
/// are the project, the others this environment's.
fn expand(word: &str, _agent: Agent, project: &Path) -> String {
    let value = |name: &str| -> Option<String> {
        if Agent::ALL.iter().any(|a| a.project_dir_var() == Some(name)) {
            return Some(project.to_string_lossy().into_owned());
        }
        std::env::var(name).ok().filter(|v| !v.is_empty())
    };
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(body) = after.strip_prefix('{')
            && let Some(end) = body.find('}')
        {
            let inner = &body[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (inner, None),
            };
            out.push_str(
                &value(name)
                    .or(default.map(str::to_string))
                    .unwrap_or_default(),
            );
            rest = &body[end + 1..];
            continue;
        }
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if len == 0 {
            out.push('$');
        } else {
            out.push_str(&value(&after[..len]).unwrap_or_default());
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// What Codex's config.toml says of hooks: our `notify`, the trust records, whether hooks are
/// on, the trusted projects.
#[derive(Debug, Default)]
pub(crate) struct CodexConfig {
    pub notify: Option<Vec<String>>,
    table: Option<toml::Table>,
}

impl CodexConfig {
    /// `config.toml`'s text read (`None`: a file Codex itself could not read, said).
    pub(crate) fn read(path: &Path, text: &str, check: &mut FileCheck) -> Option<CodexConfig> {
        let table: toml::Table = match toml::from_str(text) {
            Ok(t) => t,
            Err(e) => {
                check.problem(format!(
                    "{}: {}: Codex cannot start with it",
                    path.display(),
                    e.message().trim()
                ));
                return None;
            }
        };
        let notify = table.get("notify").and_then(|n| n.as_array()).map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect::<Vec<_>>()
        });
        Some(CodexConfig {
            notify: notify.filter(|argv| agents::is_our_argv(argv, Agent::Codex)),
            table: Some(table),
        })
    }

    fn get(&self, path: &[&str]) -> Option<&toml::Value> {
        let mut v = self.table.as_ref()?.get(*path.first()?)?;
        for key in &path[1..] {
            v = v.as_table()?.get(*key)?;
        }
        Some(v)
    }

    /// Codex's hooks are off (`[features] hooks = false`).
    pub(crate) fn hooks_off(&self) -> bool {
        ["hooks", "codex_hooks"]
            .iter()
            .any(|k| self.get(&["features", k]).and_then(toml::Value::as_bool) == Some(false))
    }

    /// The trust record of our entry at `place` in `hooks_file` for `event`: trusted (a hash
    /// is recorded) and not disabled.
    pub(crate) fn trusted(&self, hooks_file: &Path, event: &str, place: (usize, usize)) -> Trust {
        let key = format!(
            "{}:{}:{}:{}",
            hooks_file.display(),
            snake(event),
            place.0,
            place.1
        );
        let Some(state) = self.get(&["hooks", "state", &key]) else {
            return Trust::Untrusted;
        };
        if state.get("enabled").and_then(toml::Value::as_bool) == Some(false) {
            return Trust::Disabled;
        }
        match state.get("trusted_hash") {
            Some(_) => Trust::Trusted,
            None => Trust::Untrusted,
        }
    }

    /// The project is one Codex trusts (`[projects."<dir>"] trust_level = "trusted"`).
    pub(crate) fn project_trusted(&self, project: &Path) -> bool {
        let key = project.to_string_lossy();
        self.get(&["projects", &key, "trust_level"])
            .and_then(toml::Value::as_str)
            == Some("trusted")
    }
}

/// What Codex recorded for one hook.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Trust {
    Trusted,
    Untrusted,
    Disabled,
}

/// `PreToolUse` → `pre_tool_use` (the event's name in Codex's trust keys).
fn snake(event: &str) -> String {
    let mut out = String::new();
    for (i, c) in event.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Copilot CLI's trust in `project`: a folder of `trustedFolders` (in `config.json` of
/// `copilot_home`, which Copilot CLI manages, or `settings.json`) that holds it. `None`:
/// trusted.
pub(crate) fn copilot_trust(copilot_home: &Path, project: &Path) -> Result<Option<String>, String> {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let project = real(project);
    let mut read = Vec::new();
    for name in ["settings.json", "config.json"] {
        let file = copilot_home.join(name);
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        let doc = json::parse(&text, true)
            .map_err(|e| format!("{}:{}:{}: {}", file.display(), e.line, e.column, e.reason))?;
        // `trustedFolders` as Copilot CLI writes it (it rewrites a `trusted_folders` it read).
        let trusted = ["trustedFolders", "trusted_folders"].iter().any(|key| {
            doc.root
                .get(key)
                .and_then(|(_, m)| m.value.items())
                .unwrap_or(&[])
                .iter()
                .filter_map(Node::str)
                .any(|f| project.starts_with(real(Path::new(f))))
        });
        if trusted {
            return Ok(None);
        }
        read.push(file.display().to_string());
    }
    Ok(Some(format!(
        "Copilot CLI does not trust {} yet ({}): it runs no hook of the repository's .github/hooks there; trust the folder when Copilot asks",
        project.display(),
        if read.is_empty() {
            format!("no {}/settings.json or config.json", copilot_home.display())
        } else {
            format!("not in trustedFolders of {}", read.join(" or "))
        }
    )))
}

/// Gemini CLI's trust in `project`: its folder trust setting (on unless
/// `security.folderTrust.enabled` is false in the user's settings) and the longest rule of
/// its trusted folders file that holds the project (`TRUST_PARENT` holds the rule's parent).
pub(crate) fn gemini_trust(home: &Path, project: &Path) -> Result<Option<String>, String> {
    let settings = home.join(".gemini/settings.json");
    if let Ok(text) = std::fs::read_to_string(&settings)
        && let Ok(doc) = json::parse(&text, true)
    {
        let off = doc
            .root
            .get("security")
            .and_then(|(_, s)| s.value.get("folderTrust"))
            .and_then(|(_, f)| f.value.get("enabled"))
            .and_then(|(_, e)| e.value.bool(&text))
            == Some(false);
        if off {
            return Ok(None);
        }
    }
    let file = std::env::var_os("GEMINI_CLI_TRUSTED_FOLDERS_PATH")
        .filter(|p| !p.is_empty())
        .map_or_else(|| home.join(".gemini/trustedFolders.json"), PathBuf::from);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::from("{}"),
        Err(e) => return Err(format!("{}: {e}", file.display())),
    };
    let doc = json::parse(&text, true).map_err(|e| {
        format!(
            "{}:{}:{}: {}: Gemini CLI stops at start with it",
            file.display(),
            e.line,
            e.column,
            e.reason
        )
    })?;
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let project = real(project);
    let mut best: Option<(usize, &str)> = None;
    for m in doc.root.members().unwrap_or(&[]) {
        let level = m.value.str().unwrap_or_default();
        let rule = Path::new(&m.key);
        let holds = if level == "TRUST_PARENT" {
            rule.parent().map(real)
        } else {
            Some(real(rule))
        };
        if holds.is_some_and(|h| project.starts_with(&h))
            && best.is_none_or(|(len, _)| m.key.len() > len)
        {
            best = Some((m.key.len(), level));
        }
    }
    Ok(Some(match best {
        Some((_, "DO_NOT_TRUST")) => format!(
            "{} marks {} as not trusted: Gemini CLI runs no settings hook there, not even the user's",
            file.display(),
            project.display()
        ),
        Some(_) => return Ok(None),
        None => format!(
            "Gemini CLI does not trust {} yet ({} has no rule for it): in a folder it does not trust it runs no settings hook; trust it when Gemini asks",
            project.display(),
            file.display()
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspaces_expand_the_agents_project_variable() {
        let project = Path::new("/nonexistent/p");
        let words: Vec<String> = [
            "prx-hooks-send",
            "--workspace",
            "${CLAUDE_PROJECT_DIR:-.}/ws",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            workspace_of(Agent::ClaudeCode, &words, project),
            PathBuf::from("/nonexistent/p/ws")
        );
        let words: Vec<String> = ["prx-hooks-send"].map(String::from).to_vec();
        assert_eq!(workspace_of(Agent::Cursor, &words, project), project);
        assert_eq!(snake("PreToolUse"), "pre_tool_use");
        assert_eq!(
            suggest("PostToolUsed", &["PreToolUse", "PostToolUse"]),
            Some("PostToolUse")
        );
        assert_eq!(suggest("Whatever", &["PreToolUse", "PostToolUse"]), None);
    }
}
