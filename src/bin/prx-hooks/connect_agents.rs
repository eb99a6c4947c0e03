//! What `connect` writes into each agent's settings, where, and how it finds its entries again.
//!
//! docs/connect.md has the tables and the agents' pages they follow.
//!
//! Claude Code and Gemini CLI group hooks: `hooks.<Event>` is an array of `{matcher?, hooks:
//! [entry…]}`; ours is one group `{"hooks": [entry]}` per event. Cursor lists entries directly:
//! `hooks.<event>` is an array of `{command, …}`. Codex runs one `notify` program (TOML).
//!
//! An entry is ours when it runs this program's `send --from AGENT` (its first word's file
//! name is `prx-hooks`), or, for an `http` hook, when its URL ends with
//! `/api/ingest/AGENT`. Nothing else is ever changed or removed.

use super::json::{self, J, Node, Style};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
    Cursor,
}

impl Agent {
    pub(super) fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
            Agent::Cursor => "cursor",
        }
    }

    pub(super) fn from_name(name: &str) -> Option<Agent> {
        [
            Agent::ClaudeCode,
            Agent::Codex,
            Agent::GeminiCli,
            Agent::Cursor,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }

    /// The documentation the events and the format follow.
    pub(super) fn docs(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "https://code.claude.com/docs/en/hooks",
            Agent::Codex => "https://developers.openai.com/codex/config-advanced#notifications",
            Agent::GeminiCli => "https://geminicli.com/docs/hooks/reference",
            Agent::Cursor => "https://cursor.com/docs/hooks",
        }
    }

    /// The events an entry is written for by default: every one the agent documents
    /// ([`prx_hooks::agents::Agent::events`]), except those where a hook replaces the agent's
    /// own behaviour. Codex's `notify` has none to pick.
    pub(super) fn events(self) -> Vec<&'static str> {
        let all = match self {
            Agent::ClaudeCode => prx_hooks::agents::Agent::ClaudeCode.events(),
            Agent::GeminiCli => prx_hooks::agents::Agent::GeminiCli.events(),
            Agent::Cursor => prx_hooks::agents::Agent::Cursor.events(),
            Agent::Codex => &[],
        };
        all.iter()
            .copied()
            .filter(|e| !self.other_events().contains(e))
            .collect()
    }

    /// Events searched for our entries (to take them out) besides [`Agent::events`]. Claude
    /// Code's WorktreeCreate and WorktreeRemove are never written: a hook there *replaces*
    /// Claude Code's `git worktree` step and must print the new path, which `send` does not.
    fn other_events(self) -> &'static [&'static str] {
        match self {
            Agent::ClaudeCode => &["WorktreeCreate", "WorktreeRemove"],
            _ => &[],
        }
    }

    /// `//` and `/* */` comments are allowed in its settings (Gemini CLI strips them).
    pub(super) fn comments(self) -> bool {
        self == Agent::GeminiCli
    }

    /// The settings file, relative to the project (project scope) or to `$HOME` (user scope).
    pub(super) fn settings_file(self) -> &'static str {
        match self {
            Agent::ClaudeCode => ".claude/settings.json",
            Agent::Codex => ".codex/config.toml",
            Agent::GeminiCli => ".gemini/settings.json",
            Agent::Cursor => ".cursor/hooks.json",
        }
    }

    /// What a file made from nothing starts as (and what `--remove` leaving exactly this
    /// deletes again).
    pub(super) fn skeleton(self) -> &'static str {
        match self {
            Agent::Cursor => "{\n  \"version\": 1\n}\n",
            Agent::Codex => "",
            _ => "{}\n",
        }
    }

    fn grouped(self) -> bool {
        matches!(self, Agent::ClaudeCode | Agent::GeminiCli)
    }
}

/// What our entry does.
#[derive(Clone, Debug)]
pub(super) enum Hook {
    /// A command hook: this shell command line.
    Command(String),
    /// Claude Code's `http` hook posting to this URL.
    Http(String),
}

/// The hook entry for one event.
pub(super) fn entry(agent: Agent, hook: &Hook) -> J {
    let s = |v: &str| J::Str(v.to_string());
    let obj = |m: Vec<(&str, J)>| J::Obj(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
    match (agent, hook) {
        // `async`: Claude Code runs it in the background, never waiting for it.
        (Agent::ClaudeCode, Hook::Command(cmd)) => obj(vec![
            ("type", s("command")),
            ("command", s(cmd)),
            ("async", J::Bool(true)),
        ]),
        // No `async` for http hooks: Claude Code waits for the answer, which the server gives
        // at once (200 {}); the 5 s timeout bounds a server that hangs (default 600 s).
        (Agent::ClaudeCode, Hook::Http(url)) => obj(vec![
            ("type", s("http")),
            ("url", s(url)),
            (
                "headers",
                obj(vec![("Authorization", s("Bearer $PRX_HOOKS_TOKEN"))]),
            ),
            ("allowedEnvVars", J::Arr(vec![s("PRX_HOOKS_TOKEN")])),
            ("timeout", J::Num(5)),
        ]),
        // Gemini CLI waits for every hook; `send` gives up on the server after 2 s, and the
        // timeout (milliseconds) bounds the rest. `name` is what `/hooks disable` takes.
        (Agent::GeminiCli, Hook::Command(cmd)) | (Agent::GeminiCli, Hook::Http(cmd)) => obj(vec![
            ("name", s("prx-hooks")),
            ("type", s("command")),
            ("command", s(cmd)),
            ("timeout", J::Num(5000)),
        ]),
        (_, Hook::Command(cmd)) | (_, Hook::Http(cmd)) => obj(vec![("command", s(cmd))]),
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
pub(super) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@,=".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The words of a POSIX shell command line (quotes and backslashes; no expansion). `None`
/// for an unterminated quote.
pub(super) fn shell_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
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
pub(super) fn is_our_argv(argv: &[String], agent: Agent) -> bool {
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
fn is_ours(agent: Agent, entry: &Node) -> bool {
    let field = |name: &str| entry.get(name).and_then(|(_, m)| m.value.str());
    if agent == Agent::ClaudeCode
        && field("type") == Some("http")
        && field("url").is_some_and(|u| u.ends_with(&format!("/api/ingest/{}", agent.name())))
    {
        return true;
    }
    if agent.grouped() && field("type").is_some_and(|t| t != "command") {
        return false;
    }
    field("command")
        .and_then(shell_words)
        .is_some_and(|argv| is_our_argv(&argv, agent))
}

/// A settings file that cannot be edited safely: where and why.
#[derive(Debug)]
pub(super) struct Refusal {
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

fn refuse(node: &Node, path: &str, expected: &str) -> Refusal {
    Refusal::new(
        Some(node.start),
        format!("{path}: expected {expected}, found {}", node.what()),
    )
}

/// Where one of our entries is: `hooks.<event>[group]` and, grouped, `.hooks[inner]`.
#[derive(Clone, Copy)]
struct Found {
    group: usize,
    inner: Option<usize>,
}

/// The located containers of one event.
struct Located<'a> {
    root: &'a Node,
    /// `hooks` and its index in the root.
    hooks: Option<(usize, &'a Node)>,
    /// `hooks.<event>` and its index in `hooks`.
    event: Option<(usize, &'a Node)>,
    ours: Vec<Found>,
}

fn locate<'a>(root: &'a Node, agent: Agent, event: &str) -> Result<Located<'a>, Refusal> {
    if root.members().is_none() {
        return Err(refuse(root, "the top level", "an object"));
    }
    if let Some(dup) = json::duplicate(root, "hooks") {
        return Err(Refusal::new(
            Some(dup.key_start),
            "\"hooks\" appears twice (the agent reads only the last)".into(),
        ));
    }
    let mut found = Located {
        root,
        hooks: None,
        event: None,
        ours: Vec::new(),
    };
    let Some((hi, hooks)) = root.get("hooks") else {
        return Ok(found);
    };
    let hooks = &hooks.value;
    if hooks.members().is_none() {
        return Err(refuse(hooks, "hooks", "an object (event name → array)"));
    }
    found.hooks = Some((hi, hooks));
    if let Some(dup) = json::duplicate(hooks, event) {
        return Err(Refusal::new(
            Some(dup.key_start),
            format!("hooks.{event} appears twice (the agent reads only the last)"),
        ));
    }
    let Some((ei, ev)) = hooks.get(event) else {
        return Ok(found);
    };
    let ev = &ev.value;
    let Some(items) = ev.items() else {
        let what = if agent.grouped() {
            "an array of hook groups"
        } else {
            "an array of hooks"
        };
        return Err(refuse(ev, &format!("hooks.{event}"), what));
    };
    found.event = Some((ei, ev));
    for (gi, item) in items.iter().enumerate() {
        if !agent.grouped() {
            if item.members().is_some() && is_ours(agent, item) {
                found.ours.push(Found {
                    group: gi,
                    inner: None,
                });
            }
            continue;
        }
        let path = format!("hooks.{event}[{gi}]");
        if item.members().is_none() {
            return Err(refuse(item, &path, "an object ({\"matcher\", \"hooks\"})"));
        }
        let Some((_, inner)) = item.get("hooks") else {
            continue;
        };
        let Some(entries) = inner.value.items() else {
            return Err(refuse(&inner.value, &format!("{path}.hooks"), "an array"));
        };
        for (ii, e) in entries.iter().enumerate() {
            if e.members().is_some() && is_ours(agent, e) {
                found.ours.push(Found {
                    group: gi,
                    inner: Some(ii),
                });
            }
        }
    }
    Ok(found)
}

/// The entry node of `f`.
fn entry_node<'a>(loc: &Located<'a>, f: Found) -> Option<&'a Node> {
    let (_, ev) = loc.event?;
    let group = ev.items()?.get(f.group)?;
    match f.inner {
        None => Some(group),
        Some(i) => group.get("hooks")?.1.value.items()?.get(i),
    }
}

/// Takes `f` out of `text`, and each container that leaves empty: the group, the event's
/// array, `hooks`.
fn take_out(text: &str, loc: &Located<'_>, f: Found) -> String {
    let (Some((hi, hooks)), Some((ei, ev))) = (loc.hooks, loc.event) else {
        return text.to_string();
    };
    let items = ev.items().unwrap_or(&[]);
    if let Some(inner) = f.inner {
        let group = &items[f.group];
        if let Some((_, entries)) = group.get("hooks")
            && entries.value.items().is_some_and(|e| e.len() > 1)
        {
            return json::remove_item(text, &entries.value, inner);
        }
    }
    if items.len() > 1 {
        return json::remove_item(text, ev, f.group);
    }
    if hooks.members().is_some_and(|m| m.len() > 1) {
        return json::remove_member(text, hooks, ei);
    }
    json::remove_member(text, loc.root, hi)
}

/// What [`apply_json`] does.
pub(super) enum Want<'a> {
    /// Our entry `entry` in each of `events` (and in no other event).
    Connect { events: &'a [&'a str], entry: J },
    /// None of ours anywhere.
    Remove,
}

/// `text` (a JSON settings file of `agent`) with our entries as `want` says; every other byte
/// kept. Also returns how many entries were taken out or replaced (for the summary).
pub(super) fn apply_json(
    text: &str,
    agent: Agent,
    want: &Want<'_>,
) -> Result<(String, usize), Refusal> {
    let mut text = text.to_string();
    let mut replaced = 0;
    let documented = agent.events();
    let all = documented.iter().chain(agent.other_events());
    let order: Vec<&str> = match want {
        Want::Connect { events, .. } => events
            .iter()
            .copied()
            .chain(all.copied().filter(|e| !events.contains(e)))
            .collect(),
        Want::Remove => all.copied().collect(),
    };
    let parse = |t: &str| {
        json::parse(t, agent.comments()).map_err(|e| Refusal {
            offset: None,
            at: Some((e.line, e.column)),
            reason: e.reason,
        })
    };
    for event in order {
        let wanted = match want {
            Want::Connect { events, entry } if events.contains(&event) => Some(entry),
            _ => None,
        };
        // One change at a time, each on a fresh parse: every span is exact.
        for _round in 0..10_000 {
            let root = parse(&text)?;
            let style = Style::of(&text, Some(&root));
            let loc = locate(&root, agent, event)?;
            let next = match (wanted, loc.ours.first()) {
                (None, None) => break,
                (None, Some(&f)) => {
                    replaced += 1;
                    take_out(&text, &loc, f)
                }
                (Some(entry), None) => insert(&text, &loc, agent, event, entry, &style),
                (Some(entry), Some(&first)) => {
                    let node = entry_node(&loc, first);
                    let same = node
                        .and_then(|n| {
                            serde_json::from_str::<serde_json::Value>(&text[n.start..n.end]).ok()
                        })
                        .is_some_and(|v| v == entry.to_value());
                    if !same {
                        replaced += 1;
                        match node {
                            Some(n) => json::replace(&text, n, entry, &style),
                            None => break,
                        }
                    } else if let Some(&extra) = loc.ours.get(1) {
                        replaced += 1;
                        take_out(&text, &loc, extra)
                    } else {
                        break;
                    }
                }
            };
            text = next;
        }
    }
    Ok((text, replaced))
}

/// `text` with our entry for `event` added, making `hooks` and `hooks.<event>` if missing.
fn insert(
    text: &str,
    loc: &Located<'_>,
    agent: Agent,
    event: &str,
    entry: &J,
    style: &Style,
) -> String {
    let item = if agent.grouped() {
        J::Obj(vec![("hooks".into(), J::Arr(vec![entry.clone()]))])
    } else {
        entry.clone()
    };
    match (loc.hooks, loc.event) {
        (_, Some((_, ev))) => json::push_item(text, ev, &item, style),
        (Some((_, hooks)), None) => {
            json::insert_member(text, hooks, event, &J::Arr(vec![item]), style)
        }
        (None, _) => json::insert_member(
            text,
            loc.root,
            "hooks",
            &J::Obj(vec![(event.to_string(), J::Arr(vec![item]))]),
            style,
        ),
    }
}

/// Codex's `notify`: what is there now.
pub(super) enum Notify {
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
pub(super) fn parse_toml(
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
pub(super) fn set_notify(doc: &mut toml_edit::DocumentMut, argv: &[String]) {
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
