//! Reading a command policy's own fields in policies.json (`command`, `args`, `timeout_ms`,
//! `on_error`), and the file's `timeout_ms`, each error naming FILE:LINE:COL and the field.

use super::command::MAX_TIMEOUT_MS;
use super::load::Checker;
use super::model::{CommandPolicy, OnError};
use super::model::{Condition, DecisionPoint};
use crate::config::spanned::{Member, Node, Val};
use crate::config::{Action, JsonPath as JPath, Matcher, quote};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most `args` of one command policy.
const MAX_ARGS: usize = 256;

/// A command policy's own fields, checked.
pub(super) struct CommandSpec {
    command: String,
    program: PathBuf,
    args: Vec<String>,
    timeout: Duration,
    on_error: OnError,
    cwd: PathBuf,
}

impl CommandSpec {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn into_policy(
        self,
        id: String,
        on: Vec<DecisionPoint>,
        points: u8,
        matcher: Option<Matcher>,
        agent: Option<Matcher>,
        when: Vec<Condition>,
        enabled: bool,
        order: usize,
    ) -> CommandPolicy {
        let action = Action {
            id: id.clone(),
            id_explicit: true,
            event: crate::event::EventKind::ToolCallStart,
            index: order,
            command: self.command.clone(),
            program: Ok(self.program),
            args: self.args.clone(),
            env: Vec::new(),
            cwd: self.cwd,
            timeout: self.timeout,
            timeout_explicit: true,
            stdin_json: true,
            enabled,
            matcher: matcher.clone(),
            max_concurrent: 1,
            limits: Default::default(),
        };
        CommandPolicy {
            id,
            on,
            points,
            matcher,
            agent,
            when,
            command: self.command,
            args: self.args,
            timeout: self.timeout,
            on_error: self.on_error,
            enabled,
            order,
            action,
        }
    }
}

impl Checker {
    /// A `timeout_ms`: a whole number of milliseconds, 1 to [`MAX_TIMEOUT_MS`].
    pub(super) fn timeout_ms(&mut self, node: &Node, path: &JPath) -> Option<Duration> {
        let expected = format!("a whole number of milliseconds, 1 to {MAX_TIMEOUT_MS}");
        let Val::Num(n) = &node.val else {
            self.type_err(node, path, &expected);
            return None;
        };
        match n.parse::<u64>() {
            Ok(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Some(Duration::from_millis(ms)),
            _ => {
                self.err(
                    node.pos,
                    path,
                    format!("{n} is out of range: expected {expected}"),
                );
                None
            }
        }
    }

    /// The fields of a policy with `command`; `None` when one has an error (reported).
    pub(super) fn command(&mut self, members: &[Member], path: &JPath) -> Option<CommandSpec> {
        let field = |name: &str| members.iter().find(|m| m.key == name);
        let m = field("command")?;
        let cpath = path.key("command");
        let written = self.string(&m.value, &cpath)?.to_string();
        let program = self.program(&written, m.value.pos, &cpath);
        let args = match field("args") {
            Some(a) => self.args(&a.value, &path.key("args")),
            None => Some(Vec::new()),
        };
        let timeout = match field("timeout_ms") {
            Some(t) => self.timeout_ms(&t.value, &path.key("timeout_ms")),
            None => Some(self.timeout),
        };
        let on_error = match field("on_error") {
            Some(e) => {
                let epath = path.key("on_error");
                match self.string(&e.value, &epath)? {
                    "none" => Some(OnError::None),
                    "deny" => Some(OnError::Deny),
                    other => {
                        self.err(
                            e.value.pos,
                            &epath,
                            format!(
                                "{} is not a failure mode: expected \"none\" (no decision, the agent's own flow) or \"deny\"",
                                quote(other)
                            ),
                        );
                        None
                    }
                }
            }
            None => Some(OnError::None),
        };
        Some(CommandSpec {
            command: written,
            program: program?,
            args: args?,
            timeout: timeout?,
            on_error: on_error?,
            cwd: self.workspace.clone(),
        })
    }

    fn args(&mut self, node: &Node, path: &JPath) -> Option<Vec<String>> {
        let Val::Arr(items) = &node.val else {
            self.type_err(node, path, "an array of strings");
            return None;
        };
        if items.len() > MAX_ARGS {
            self.err(
                node.pos,
                path,
                format!("{} arguments; at most {MAX_ARGS} are allowed", items.len()),
            );
            return None;
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let ipath = path.index(i);
            let s = self.string(item, &ipath)?;
            if s.contains('\0') {
                self.err(item.pos, &ipath, "contains a NUL byte");
                return None;
            }
            out.push(s.to_string());
        }
        Some(out)
    }

    /// The program `command` names: a bare name looked up in the sanitized PATH, or a path
    /// (absolute, or relative to the workspace) to an executable file.
    fn program(&mut self, cmd: &str, pos: usize, path: &JPath) -> Option<PathBuf> {
        if cmd.is_empty() || cmd.contains('\0') {
            self.err(pos, path, "expected a program: a name or a path, not empty");
            return None;
        }
        if !cmd.contains('/') {
            if cmd.chars().any(char::is_whitespace) {
                self.err(
                    pos,
                    path,
                    format!(
                        "{} contains whitespace: \"command\" is one program, without a shell; put its arguments in \"args\"",
                        quote(cmd)
                    ),
                );
                return None;
            }
            return match crate::config::resolve_bare(cmd) {
                Ok(p) => Some(p),
                Err(why) => {
                    self.err(pos, path, format!("{why}; write its absolute path"));
                    None
                }
            };
        }
        let full = if Path::new(cmd).is_absolute() {
            PathBuf::from(cmd)
        } else {
            match crate::config::normalize(Path::new(cmd)) {
                Some(rel) => self.workspace.join(rel),
                None => {
                    self.err(
                        pos,
                        path,
                        format!(
                            "{} leads out of the workspace: write an absolute path",
                            quote(cmd)
                        ),
                    );
                    return None;
                }
            }
        };
        use std::os::unix::fs::PermissionsExt;
        match std::fs::metadata(&full) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => Some(full),
            Ok(meta) if meta.is_file() => {
                self.err(
                    pos,
                    path,
                    format!("{} is not executable (chmod +x it)", full.display()),
                );
                None
            }
            Ok(_) => {
                self.err(pos, path, format!("{} is not a file", full.display()));
                None
            }
            Err(e) => {
                self.err(pos, path, format!("{}: {e}", full.display()));
                None
            }
        }
    }
}
