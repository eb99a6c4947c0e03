//! What `connect` writes into each agent's settings, where, and how it finds its entries again.
//!
//! docs/connect.md has the tables and the agents' pages they follow; the events and handler
//! types come from [`hook_table`](crate::hook_table).
//!
//! Claude Code, Codex (hooks.json), Gemini CLI, Qwen Code and Factory Droid group hooks:
//! `hooks.<Event>` is an array of `{matcher?, hooks: [entry…]}`; ours is one group
//! `{"hooks": [entry]}` per event. Cursor, Copilot CLI and Windsurf list entries directly:
//! `hooks.<event>` is an array of `{command, …}` (Copilot CLI: `{type, bash, …}`). Codex's
//! older `notify` is one program in config.toml.
//!
//! An entry is ours when its command is one simple command (no `&&`, `;`, `|`, redirection or
//! substitution) running `prx-hooks send … --from AGENT` or `prx-hooks-send … --from AGENT`,
//! or, for an `http` hook, when its URL ends with `/api/ingest/AGENT`. Nothing else is ever
//! changed or removed.

use super::json::{self, Doc, J, Node, Style};
use crate::hook_table::{self, Agent, HookEvent};
use prx_hooks::agents::Handlers;
use std::path::Path;

/// The settings file, relative to the project (project scope) or to the user's directory
/// (user scope: `$HOME`, for Codex `$CODEX_HOME`).
pub(crate) fn settings_file(agent: Agent, notify: bool) -> &'static str {
    match agent {
        Agent::ClaudeCode => ".claude/settings.json",
        Agent::Codex if notify => ".codex/config.toml",
        Agent::Codex => ".codex/hooks.json",
        Agent::GeminiCli => ".gemini/settings.json",
        Agent::Cursor => ".cursor/hooks.json",
        Agent::QwenCode => ".qwen/settings.json",
        // Not `.factory/hooks.json`: Droid 0.215 reads only its settings files' `hooks`, and a
        // newer Droid that finds a hooks.json stops reading the user's hooks in settings.json.
        Agent::FactoryDroid => ".factory/settings.json",
        // A file of its own among the repository's hook files: Copilot CLI reads every
        // `.github/hooks/*.json`.
        Agent::CopilotCli => ".github/hooks/prx-hooks.json",
        Agent::Windsurf => ".windsurf/hooks.json",
    }
}

/// What a file made from nothing starts as (and what `--remove` leaving exactly this
/// deletes again).
pub(crate) fn skeleton(agent: Agent, notify: bool) -> &'static str {
    match agent {
        Agent::Cursor | Agent::CopilotCli => "{\n  \"version\": 1\n}\n",
        Agent::Codex if notify => "",
        _ => "{}\n",
    }
}

/// What our entries run: the shell command line, and for Claude Code with `--http` the URL
/// its `http` hooks post to (events where it runs no `http` hook keep the command).
#[derive(Clone, Debug)]
pub(crate) struct Hook {
    pub command: String,
    pub http: Option<String>,
    /// With `--policies`: the decision points' entries (connect_policies.rs).
    pub policies: Option<super::policies::Policies>,
}

/// Claude Code's `http` entry posting to `url`, waited for at most 5 s. `deadline_ms`: on a
/// decision point, the `Prx-Decision-Deadline-Ms` header telling the server how long the
/// agent waits for the decision (docs/policies.md § Deadlines).
pub(crate) fn claude_http(url: &str, deadline_ms: Option<i64>) -> J {
    let s = |v: &str| J::Str(v.to_string());
    let obj = |m: Vec<(&str, J)>| J::Obj(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    let mut headers = vec![("Authorization", s("Bearer $PRX_HOOKS_TOKEN"))];
    if let Some(ms) = deadline_ms {
        headers.push(("Prx-Decision-Deadline-Ms", s(&ms.to_string())));
    }
    obj(vec![
        ("type", s("http")),
        ("url", s(url)),
        ("headers", obj(headers)),
        ("allowedEnvVars", J::Arr(vec![s("PRX_HOOKS_TOKEN")])),
        ("timeout", J::Num(5)),
    ])
}

/// Our entry for `event`.
pub(crate) fn entry(agent: Agent, event: &HookEvent, hook: &Hook) -> J {
    let s = |v: &str| J::Str(v.to_string());
    let obj = |m: Vec<(&str, J)>| J::Obj(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    if let Some(decides) = super::policies::entry(agent, event, hook) {
        return decides;
    }
    let cmd = hook.command.as_str();
    match agent {
        Agent::ClaudeCode => match &hook.http {
            // No `async` for http hooks: Claude Code waits for the answer, which the server
            // gives at once (200 {}); the 5 s timeout bounds a server that hangs.
            Some(url) if event.handlers.contains(Handlers::HTTP) => claude_http(url, None),
            // Where a turn or the session ends Claude Code may exit right after: it waits
            // for this one (a `send`, ~2 ms; 5 s at most).
            _ if event.closes => obj(vec![
                ("type", s("command")),
                ("command", s(cmd)),
                ("timeout", J::Num(5)),
            ]),
            // Elsewhere it runs it in the background and never waits.
            _ => obj(vec![
                ("type", s("command")),
                ("command", s(cmd)),
                ("async", J::Bool(true)),
            ]),
        },
        // Codex waits for every hook (it skips `async` ones); it caps SessionEnd's and
        // Interrupt's at 3 s.
        Agent::Codex => obj(vec![
            ("type", s("command")),
            ("command", s(cmd)),
            (
                "timeout",
                J::Num(if matches!(event.name, "SessionEnd" | "Interrupt") {
                    3
                } else {
                    5
                }),
            ),
        ]),
        // Gemini CLI waits for every hook; `send` gives up on the server after 2 s, and the
        // timeout (milliseconds) bounds the rest. `name` is what `/hooks disable` takes.
        Agent::GeminiCli => obj(vec![
            ("name", s("prx-hooks")),
            ("type", s("command")),
            ("command", s(cmd)),
            ("timeout", J::Num(5000)),
        ]),
        Agent::Cursor => obj(vec![("command", s(cmd))]),
        // Copilot CLI waits for a command hook (30 s by default); `cwd` is relative to the
        // repository's root, where `.github/hooks` is: the workspace is relative to it.
        Agent::CopilotCli => obj(vec![
            ("type", s("command")),
            ("bash", s(cmd)),
            ("cwd", s(".")),
            ("timeoutSec", J::Num(5)),
        ]),
        // Windsurf runs it in the workspace's root; what it prints is not shown.
        Agent::Windsurf => obj(vec![("command", s(cmd)), ("show_output", J::Bool(false))]),
        // Both wait for a command hook (timeout in seconds; Qwen Code's default is 60).
        Agent::QwenCode | Agent::FactoryDroid => obj(vec![
            ("type", s("command")),
            ("command", s(cmd)),
            ("timeout", J::Num(5)),
        ]),
    }
}

/// One word for a POSIX shell.
///
/// # Examples
///
/// ```ignore
/// assert_eq!(shell_quote("/opt/prx hooks/bin"), "'/opt/prx hooks/bin'");
/// assert_eq!(shell_quote("it's"), r"'it'\''s'");
/// ```
pub(crate) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@,=".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The words of `line` when it is one simple command (quotes and backslashes read, `$`
/// expansions kept as written); `None` for anything more: an operator (`&&`, `;`, `|`, `&`),
/// a redirection, a subshell, a command substitution, a comment, an unterminated quote.
pub(crate) fn simple_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '`' => return None,
                        '$' if chars.peek() == Some(&'(') => return None,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$' | '`') => word.push(c),
                            '\n' => {}
                            c => {
                                word.push('\\');
                                word.push(c);
                            }
                        },
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') | None => {}
                    Some(c) => word.push(c),
                }
            }
            ';' | '&' | '|' | '<' | '>' | '(' | ')' | '`' | '\n' => return None,
            '$' if chars.peek() == Some(&'(') => return None,
            '#' if !in_word => return None,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

/// The argv runs `prx-hooks send … --from AGENT …` or `prx-hooks-send … --from AGENT …`.
pub(crate) fn is_our_argv(argv: &[String], agent: Agent) -> bool {
    let prog = argv.first().and_then(|p| Path::new(p).file_name());
    let sends = match prog {
        Some(n) if n == "prx-hooks" => argv.get(1).is_some_and(|w| w == "send"),
        Some(n) => n == "prx-hooks-send",
        None => false,
    };
    sends
        && argv
            .windows(2)
            .any(|w| w[0] == "--from" && w[1] == agent.name())
}

/// The entry object is one of ours.
pub(crate) fn is_ours(agent: Agent, entry: &Node) -> bool {
    let field = |name: &str| entry.get(name).and_then(|(_, m)| m.value.str());
    if agent.grouped() && field("type") == Some("http") {
        return field("url").is_some_and(|u| u.ends_with(&format!("/api/ingest/{}", agent.name())));
    }
    if agent.grouped() && field("type").is_some_and(|t| t != "command") {
        return false;
    }
    field(agent.command_field())
        .or_else(|| field("command"))
        .and_then(simple_words)
        .is_some_and(|argv| is_our_argv(&argv, agent))
}

/// A settings file that cannot be edited safely: where and why.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Byte offset in the text (a line and column are made of it), if any.
    pub offset: Option<usize>,
    /// The line and column, when known already (a parse error).
    pub at: Option<(usize, usize)>,
    pub reason: String,
}

impl Refusal {
    fn new(offset: Option<usize>, reason: String) -> Refusal {
        Refusal {
            offset,
            at: None,
            reason,
        }
    }
}

impl From<json::ParseError> for Refusal {
    fn from(e: json::ParseError) -> Refusal {
        Refusal {
            offset: None,
            at: Some((e.line, e.column)),
            reason: e.reason,
        }
    }
}

fn refuse(node: &Node, path: &str, expected: &str) -> Refusal {
    Refusal::new(
        Some(node.start),
        format!("{path}: expected {expected}, found {}", node.what()),
    )
}

/// Where one of our entries is: `hooks.<event>[group]` and, grouped, `.hooks[inner]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Found {
    group: usize,
    inner: Option<usize>,
}

/// One member of `hooks` holding hooks: its index, name, array, and our entries in it.
struct EventAt<'a> {
    index: usize,
    name: &'a str,
    array: &'a Node,
    ours: Vec<Found>,
}

/// A settings file's `hooks`, checked: where it is and every event array in it.
struct Survey<'a> {
    hooks: Option<(usize, &'a Node)>,
    events: Vec<EventAt<'a>>,
}

/// Reads `root`'s hooks; a shape the agent would not read as we do is refused. Members named
/// like an event the agent has are checked strictly; others (a misspelt event, settings
/// kept among the events) are only searched for our entries.
fn survey<'a>(root: &'a Node, agent: Agent) -> Result<Survey<'a>, Refusal> {
    if root.members().is_none() {
        return Err(refuse(root, "the top level", "an object"));
    }
    if let Some(dup) = json::duplicate(root, "hooks") {
        return Err(Refusal::new(
            Some(dup.key_start),
            "\"hooks\" appears twice (the agent reads only the last)".into(),
        ));
    }
    let mut survey = Survey {
        hooks: None,
        events: Vec::new(),
    };
    let Some((hi, hooks)) = root.get("hooks") else {
        return Ok(survey);
    };
    let hooks = &hooks.value;
    let Some(members) = hooks.members() else {
        return Err(refuse(hooks, "hooks", "an object (event name → array)"));
    };
    survey.hooks = Some((hi, hooks));
    for (index, m) in members.iter().enumerate() {
        if agent.config_members().contains(&m.key.as_str()) {
            continue;
        }
        if let Some(dup) = json::duplicate(hooks, &m.key).filter(|d| d.key_start > m.key_start) {
            return Err(Refusal::new(
                Some(dup.key_start),
                format!(
                    "hooks.{} appears twice (the agent reads only the last)",
                    m.key
                ),
            ));
        }
        let strict = hook_table::event(agent, &m.key).is_some();
        if let Some(array) = event_array(agent, &m.key, &m.value, strict)? {
            let ours = ours_in(agent, &m.key, array, strict)?;
            survey.events.push(EventAt {
                index,
                name: &m.key,
                array,
                ours,
            });
        }
    }
    Ok(survey)
}

/// `hooks.<event>`'s array (`None`: not an array, in a member that is not an event).
fn event_array<'a>(
    agent: Agent,
    name: &str,
    value: &'a Node,
    strict: bool,
) -> Result<Option<&'a Node>, Refusal> {
    match value.items() {
        Some(_) => Ok(Some(value)),
        None if !strict => Ok(None),
        None => {
            let what = if agent.grouped() {
                "an array of hook groups"
            } else {
                "an array of hooks"
            };
            Err(refuse(value, &format!("hooks.{name}"), what))
        }
    }
}

/// Our entries in one event's array.
fn ours_in(agent: Agent, event: &str, array: &Node, strict: bool) -> Result<Vec<Found>, Refusal> {
    let mut found = Vec::new();
    for (gi, item) in array.items().unwrap_or(&[]).iter().enumerate() {
        if !agent.grouped() {
            if item.members().is_some() && is_ours(agent, item) {
                found.push(Found {
                    group: gi,
                    inner: None,
                });
            }
            continue;
        }
        let path = format!("hooks.{event}[{gi}]");
        if item.members().is_none() {
            if strict {
                return Err(refuse(item, &path, "an object ({\"matcher\", \"hooks\"})"));
            }
            continue;
        }
        let Some((_, inner)) = item.get("hooks") else {
            continue;
        };
        let Some(entries) = inner.value.items() else {
            if strict {
                return Err(refuse(&inner.value, &format!("{path}.hooks"), "an array"));
            }
            continue;
        };
        for (ii, e) in entries.iter().enumerate() {
            if e.members().is_some() && is_ours(agent, e) {
                found.push(Found {
                    group: gi,
                    inner: Some(ii),
                });
            }
        }
    }
    Ok(found)
}

/// The byte ranges that take `remove` (per event in `survey.events`, our entries) out, and
/// each container that leaves empty: the group, the event's array, `hooks`.
fn removal_ranges(
    doc: &Doc,
    text: &str,
    survey: &Survey<'_>,
    remove: &[Vec<Found>],
) -> Vec<(usize, usize)> {
    let mut ranges = Vec::new();
    let mut events_gone = Vec::new();
    for (at, gone) in survey.events.iter().zip(remove) {
        if gone.is_empty() {
            continue;
        }
        let items = at.array.items().unwrap_or(&[]);
        let mut groups_gone = Vec::new();
        let mut g = 0;
        while g < gone.len() {
            let group = gone[g].group;
            let inner: Vec<usize> = gone[g..]
                .iter()
                .take_while(|f| f.group == group)
                .filter_map(|f| f.inner)
                .collect();
            g += gone[g..].iter().take_while(|f| f.group == group).count();
            let entries = items[group]
                .get("hooks")
                .and_then(|(_, m)| m.value.items().map(|e| (&m.value, e.len())));
            match entries {
                Some((array, len)) if !inner.is_empty() && inner.len() < len => {
                    ranges.extend(json::removal(doc, text, array, &inner));
                }
                _ => groups_gone.push(group),
            }
        }
        if groups_gone.len() < items.len() {
            ranges.extend(json::removal(doc, text, at.array, &groups_gone));
        } else {
            events_gone.push(at.index);
        }
    }
    let Some((hi, hooks)) = survey.hooks else {
        return ranges;
    };
    if events_gone.is_empty() {
        return ranges;
    }
    events_gone.sort_unstable();
    if events_gone.len() < hooks.members().map_or(0, <[_]>::len) {
        ranges.extend(json::removal(doc, text, hooks, &events_gone));
    } else if doc.root.members().is_some_and(|m| m.len() > 1) {
        ranges.extend(json::removal(doc, text, &doc.root, &[hi]));
    } else {
        ranges.push(json::emptied(doc, text, &doc.root));
    }
    ranges
}

/// What [`apply_json`] does.
pub(crate) enum Want<'a> {
    /// Our entry in each of `events` (and in no other event), running `hook`.
    Connect {
        events: &'a [&'static HookEvent],
        hook: &'a Hook,
    },
    /// None of ours anywhere.
    Remove,
}

/// `text` (a JSON settings file of `agent`) with our entries as `want` says; every other byte
/// kept. Also returns how many entries were taken out or replaced (for the summary).
///
/// Every entry to take out goes in one pass over the text; then each wanted event gets its
/// entry replaced in place or added (a few edits, each on a fresh read).
pub(crate) fn apply_json(
    text: &str,
    agent: Agent,
    want: &Want<'_>,
) -> Result<(String, usize), Refusal> {
    let doc = json::parse(text, agent.comments())?;
    let found = survey(&doc.root, agent)?;
    // Per event: ours to take out (all of them, but for the first in each wanted event).
    let wanted = |name: &str| match want {
        Want::Connect { events, .. } => events.iter().any(|e| hook_table::key(agent, e) == name),
        Want::Remove => false,
    };
    let remove: Vec<Vec<Found>> = found
        .events
        .iter()
        .map(|at| {
            let skip = usize::from(wanted(at.name));
            at.ours.iter().skip(skip).copied().collect()
        })
        .collect();
    let mut replaced: usize = remove.iter().map(Vec::len).sum();
    let mut text = json::delete(text, removal_ranges(&doc, text, &found, &remove));
    if let Want::Connect { events, hook } = want {
        for event in *events {
            let (next, changed) = put(&text, agent, event, &entry(agent, event, hook))?;
            replaced += usize::from(changed);
            if let Some(next) = next {
                text = next;
            }
        }
    }
    Ok((text, replaced))
}

/// `text` with our entry for `event` as `entry`: left (`None`), replaced in place (`true`),
/// or added (making `hooks` and `hooks.<event>` if missing).
fn put(
    text: &str,
    agent: Agent,
    event: &HookEvent,
    entry: &J,
) -> Result<(Option<String>, bool), Refusal> {
    let doc = json::parse(text, agent.comments())?;
    let style = Style::of(text, Some(&doc.root));
    let found = survey(&doc.root, agent)?;
    let key = hook_table::key(agent, event);
    let at = found.events.iter().find(|e| e.name == key);
    if let Some((at, first)) = at.and_then(|at| Some((at, *at.ours.first()?))) {
        let group = &at.array.items().unwrap_or(&[])[first.group];
        let node = match first.inner {
            None => Some(group),
            Some(i) => group
                .get("hooks")
                .and_then(|(_, m)| m.value.items()?.get(i)),
        };
        let Some(node) = node else {
            return Ok((None, false));
        };
        let same = serde_json::from_str::<serde_json::Value>(&text[node.start..node.end])
            .is_ok_and(|v| v == entry.to_value());
        if same {
            return Ok((None, false));
        }
        return Ok((Some(json::replace(text, node, entry, &style)), true));
    }
    let item = if agent.grouped() {
        J::Obj(vec![("hooks".into(), J::Arr(vec![entry.clone()]))])
    } else {
        entry.clone()
    };
    let next = match (found.hooks, at) {
        (_, Some(at)) => json::push_item(text, at.array, &item, &style),
        (Some((_, hooks)), None) => {
            json::insert_member(text, hooks, key, &J::Arr(vec![item]), &style)
        }
        (None, _) => json::insert_member(
            text,
            &doc.root,
            "hooks",
            &J::Obj(vec![(key.to_string(), J::Arr(vec![item]))]),
            &style,
        ),
    };
    Ok((Some(next), false))
}

/// Codex's `notify`: what is there now.
pub(crate) enum Notify {
    Missing,
    /// Ours, and whether it is exactly the wanted argv.
    Ours {
        same: bool,
    },
    /// Someone else's program (its words, for the message), and where it is.
    Other {
        shown: String,
        offset: Option<usize>,
    },
}

/// `text` (Codex's config.toml) parsed, and what its `notify` is compared with `argv` (read
/// before the spans go: an edit drops them).
pub(crate) fn parse_toml(
    text: &str,
    argv: &[String],
) -> Result<(toml_edit::DocumentMut, Notify), Refusal> {
    let spanned = toml_edit::Document::parse(text).map_err(|e| {
        Refusal::new(
            e.span().map(|s| s.start),
            e.message().trim().replace('\n', "; "),
        )
    })?;
    let state = notify_state(&spanned, argv);
    Ok((spanned.into_mut(), state))
}

/// What `notify` in `root` is, compared with `argv`.
fn notify_state(root: &toml_edit::Table, argv: &[String]) -> Notify {
    let Some(item) = root.get("notify") else {
        return Notify::Missing;
    };
    let offset = root
        .key("notify")
        .and_then(toml_edit::Key::span)
        .or_else(|| item.span())
        .map(|s| s.start);
    let words: Option<Vec<String>> = item.as_array().and_then(|a| {
        a.iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
    });
    match words {
        Some(w) if is_our_argv(&w, Agent::Codex) => Notify::Ours { same: w == argv },
        Some(w) => Notify::Other {
            shown: w
                .iter()
                .map(|w| shell_quote(w))
                .collect::<Vec<_>>()
                .join(" "),
            offset,
        },
        None => Notify::Other {
            shown: item.to_string().trim().to_string(),
            offset,
        },
    }
}

/// `notify = argv` set in `doc`, keeping the line's spacing and trailing comment.
pub(crate) fn set_notify(doc: &mut toml_edit::DocumentMut, argv: &[String]) {
    let array: toml_edit::Array = argv.iter().map(String::as_str).collect();
    match doc
        .get_mut("notify")
        .and_then(toml_edit::Item::as_value_mut)
    {
        Some(v) => {
            let decor = v.decor().clone();
            *v = toml_edit::Value::Array(array);
            *v.decor_mut() = decor;
        }
        None => {
            doc.insert("notify", toml_edit::value(array));
        }
    }
}

/// docs/connect.md's table of `agent`: every event, the handler `connect` writes (and with
/// `--http`), whether the agent waits for it, what it becomes, and why.
#[cfg(test)]
pub(crate) fn table_markdown(agent: Agent) -> String {
    use crate::hook_table::Written;
    let command = Hook {
        command: "c".into(),
        http: None,
        policies: None,
    };
    let http = Hook {
        command: "c".into(),
        http: Some("u".into()),
        policies: None,
    };
    let decides = Hook {
        command: "c".into(),
        http: None,
        policies: Some(super::policies::Policies {
            on_unreachable: crate::send::OnUnreachable::None,
        }),
    };
    let waits = |e: &J| match e {
        J::Obj(m)
            if m.iter()
                .any(|(k, v)| k == "async" && matches!(v, J::Bool(true))) =>
        {
            "no (async)"
        }
        _ => "yes",
    };
    let kind = |e: &J| match e {
        J::Obj(m) => m
            .iter()
            .find(|(k, _)| k == "type")
            .and_then(|(_, v)| match v {
                J::Str(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "command".into()),
        _ => String::new(),
    };
    let mut out =
        String::from("| event | handler | waits | becomes | why |\n|---|---|---|---|---|\n");
    for e in hook_table::hook_events(agent) {
        let (handler, wait, why) = match hook_table::written(e) {
            Written::Yes => {
                let c = entry(agent, e, &command);
                let mut handler = kind(&c);
                let mut wait = waits(&c).to_string();
                if agent == Agent::GeminiCli && matches!(e.name, "SessionEnd" | "PreCompress") {
                    wait = "no (Gemini CLI's choice)".into();
                }
                if agent == Agent::Windsurf {
                    wait = "not documented".into();
                }
                if agent == Agent::ClaudeCode {
                    let h = entry(agent, e, &http);
                    handler = format!("{handler}; `--http`: {}", kind(&h));
                    if waits(&h) != waits(&c) {
                        wait = format!("{wait}; `--http`: {}", waits(&h));
                    }
                }
                let mut why = why(agent, e);
                if prx_hooks::policy::decision_point(agent.lib(), e.name).is_some() {
                    let d = entry(agent, e, &decides);
                    handler = format!("{handler}; `--policies`: {}", kind(&d));
                    wait = format!("{wait}; `--policies`: {}", waits(&d));
                    why = format!(
                        "{why}; a decision point: with `--policies` it waits for the policies' answer (§ Decision points)"
                    );
                }
                (handler, wait, why)
            }
            Written::OnRequest => (
                "only with `--events`".into(),
                String::new(),
                hook_table::why_not_written(e)
                    .unwrap_or_default()
                    .to_string(),
            ),
            Written::Never => (
                "never".into(),
                String::new(),
                hook_table::why_not_written(e)
                    .unwrap_or_default()
                    .to_string(),
            ),
        };
        let becomes = e.maps_to;
        out.push_str(&format!(
            "| `{}` | {handler} | {wait} | {becomes} | {why} |\n",
            hook_table::key(agent, e)
        ));
    }
    out
}

/// Why `connect` writes `event` the way it does (docs/connect.md's tables).
#[cfg(test)]
fn why(agent: Agent, event: &HookEvent) -> String {
    let closes = "it ends a turn or the session: the agent may exit right after";
    match agent {
        Agent::ClaudeCode if event.closes => format!(
            "{closes}, and Claude Code does not wait for an async hook (5 s at most)"
        ),
        Agent::ClaudeCode if !event.handlers.contains(Handlers::HTTP) => {
            "Claude Code runs no `http` hook here: a command, async, even with `--http`".into()
        }
        Agent::ClaudeCode => "Claude Code runs a command hook in the background; an `http` hook it waits for (the server answers at once)".into(),
        Agent::Codex if matches!(event.name, "SessionEnd" | "Interrupt") => {
            "Codex waits for every hook and skips async ones; it caps this one at 3 s".into()
        }
        Agent::Codex => "Codex waits for every hook and skips async ones".into(),
        Agent::GeminiCli if event.name == "SessionEnd" => {
            "Gemini CLI does not wait for SessionEnd hooks (nothing `connect` writes changes that): the event may be lost when Gemini exits at once".into()
        }
        Agent::GeminiCli if event.name == "PreCompress" => {
            "Gemini CLI runs PreCompress hooks in the background".into()
        }
        Agent::Windsurf => {
            "its page does not say whether Cascade waits for a hook; `send` is done in ~2 ms".into()
        }
        _ if event.closes => format!("{closes}; {} waits for every hook", agent.title()),
        _ => format!("{} waits for every hook", agent.title()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_connect_md_holds_each_agents_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/connect.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let stale: Vec<String> = Agent::ALL
            .into_iter()
            .map(table_markdown)
            .filter(|t| !doc.contains(t.as_str()))
            .collect();
        assert!(
            stale.is_empty(),
            "docs/connect.md lacks these tables (or holds older ones):\n{}",
            stale.join("\n")
        );
    }

    #[test]
    fn only_one_simple_command_can_be_ours() {
        let words = |l: &str| simple_words(l);
        assert_eq!(
            words(
                r#"prx-hooks-send --from claude-code --workspace "${CLAUDE_PROJECT_DIR:-.}"/'my ws'"#
            ),
            Some(vec![
                "prx-hooks-send".into(),
                "--from".into(),
                "claude-code".into(),
                "--workspace".into(),
                "${CLAUDE_PROJECT_DIR:-.}/my ws".into()
            ])
        );
        for line in [
            "prx-hooks send --from claude-code && notify-send 'done'",
            "prx-hooks send --from claude-code; echo",
            "prx-hooks send --from claude-code | tee log",
            "prx-hooks send --from claude-code > /dev/null",
            "prx-hooks send --from claude-code &",
            "prx-hooks send --from claude-code --workspace $(pwd)",
            "prx-hooks send --from claude-code --workspace \"`pwd`\"",
            "prx-hooks send --from claude-code # note",
            "prx-hooks send --from 'claude-code",
        ] {
            assert_eq!(words(line), None, "{line}");
        }
        let argv = words("/usr/bin/prx-hooks send --from cursor --workspace a#b").unwrap();
        assert!(is_our_argv(&argv, Agent::Cursor));
        assert!(!is_our_argv(&argv, Agent::ClaudeCode));
    }
}
