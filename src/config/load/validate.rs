//! The checks behind hooks.json: one `Validator` pass over the parsed tree, turning each
//! action into a `Draft` or an error at its place (ARCHITECTURE.md § Shell hooks).

use super::*;

/// One action, checked, waiting for its id.
pub(super) struct Draft {
    pub(super) path: JPath,
    pub(super) event: EventKind,
    pub(super) index: usize,
    pub(super) explicit_id: Option<(String, usize)>,
    pub(super) command: String,
    pub(super) program: Result<PathBuf, String>,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) cwd_written: Option<String>,
    pub(super) cwd: PathBuf,
    pub(super) timeout_ms: Option<u64>,
    pub(super) stdin_json: bool,
    pub(super) enabled: bool,
    pub(super) matcher: Option<Matcher>,
    pub(super) max_concurrent: usize,
    pub(super) limits: HookLimits,
}

pub(super) struct Validator {
    pub(super) errs: Vec<RawError>,
    pub(super) warns: Vec<RawError>,
    /// The workspace as an absolute path (canonical when it exists).
    pub(super) ws: PathBuf,
    /// The canonical workspace, when it exists: what symlink checks compare against.
    pub(super) ws_canon: Option<PathBuf>,
    pub(super) actions_seen: usize,
    /// `"path": "inherit"`: the filtered host PATH bare commands resolve against.
    pub(super) path: Option<String>,
    /// Bare command names already looked up in the table's PATH.
    pub(super) resolved: HashMap<String, Result<PathBuf, String>>,
}

impl Validator {
    pub(super) fn new(workspace: &Path) -> Validator {
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

    pub(super) fn err(&mut self, pos: usize, path: &JPath, reason: impl Into<String>) {
        self.errs.push(raw(pos, path.clone(), reason));
    }

    pub(super) fn warn(&mut self, pos: usize, path: &JPath, reason: impl Into<String>) {
        self.warns.push(raw(pos, path.clone(), reason));
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

    /// A string that will reach a process (or the file system): no NUL.
    pub(super) fn os_string<'n>(&mut self, node: &'n Node, path: &JPath) -> Option<&'n str> {
        let s = self.string(node, path)?;
        if s.contains('\0') {
            self.err(node.pos, path, "may not contain a NUL byte");
            return None;
        }
        Some(s)
    }

    pub(super) fn boolean(&mut self, node: &Node, path: &JPath) -> Option<bool> {
        match node.val {
            Val::Bool(b) => Some(b),
            _ => {
                self.type_err(node, path, "a boolean");
                None
            }
        }
    }

    /// An integer in `lo..=hi`.
    pub(super) fn integer(
        &mut self,
        node: &Node,
        path: &JPath,
        lo: u64,
        hi: u64,
        unit: &str,
    ) -> Option<u64> {
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

    pub(super) fn unknown_field(
        &mut self,
        m: &Member,
        path: &JPath,
        known: &[&str],
        hint: Option<String>,
    ) {
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

    pub(super) fn document(&mut self, root: &Node) -> HookTable {
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
    pub(super) fn path_policy(&mut self, node: &Node, path: &JPath) -> Option<String> {
        match self.string(node, path)? {
            "safe" => None,
            "inherit" => {
                let (kept, dropped) = super::super::env_policy::inherited_path();
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
    pub(super) fn limits(&mut self, node: &Node, path: &JPath) -> HookLimits {
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

    pub(super) fn passthrough(&mut self, node: &Node, path: &JPath) -> Vec<String> {
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
    pub(super) fn env_name(&mut self, name: &str, pos: usize, path: &JPath, verb: &str) -> bool {
        use crate::config::env_policy::{Scope, refusal};
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

    pub(super) fn hooks(&mut self, node: &Node, path: &JPath) -> Vec<Draft> {
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

    pub(super) fn action(
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
        let mut d = self.draft(path, event, index);
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
                    if let Some(id) = self.id(v, &p) {
                        d.explicit_id = Some(id);
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

    /// A hook's `id`, with where it is written; a valid id that the HTTP API cannot reach is
    /// a warning, an invalid one an error.
    fn id(&mut self, v: &Node, p: &JPath) -> Option<(String, usize)> {
        let id = self.string(v, p)?;
        if is_valid_id(id) {
            if id == "." || id == ".." {
                self.warn(
                    v.pos,
                    p,
                    format!(
                        "the id {} cannot be reached through the HTTP API (URL \
                         paths normalize it away); choose another",
                        quote(id)
                    ),
                );
            }
            Some((id.to_string(), v.pos))
        } else {
            self.err(
                v.pos,
                p,
                format!(
                    "{} is not a valid id: 1 to 64 characters of A-Z a-z 0-9 . _ -",
                    quote(id)
                ),
            );
            None
        }
    }

    /// A hook with every field at its default, before its members are read.
    fn draft(&self, path: &JPath, event: Option<EventKind>, index: usize) -> Draft {
        Draft {
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
        }
    }

    pub(super) fn command(
        &mut self,
        node: &Node,
        path: &JPath,
    ) -> Option<(String, Result<PathBuf, String>)> {
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
            self.bare_command(cmd, pos, path)
        } else {
            self.path_command(cmd, pos, path)
        }
    }

    /// A command that names a program to find on the PATH: one word, resolved once per name.
    fn bare_command(
        &mut self,
        cmd: &str,
        pos: usize,
        path: &JPath,
    ) -> Option<(String, Result<PathBuf, String>)> {
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
        Some((cmd.to_string(), program))
    }

    /// A command that names a file: absolute, or inside the workspace; one that is not an
    /// executable file is a warning.
    fn path_command(
        &mut self,
        cmd: &str,
        pos: usize,
        path: &JPath,
    ) -> Option<(String, Result<PathBuf, String>)> {
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
    pub(super) fn inside(
        &mut self,
        written: &Path,
        pos: usize,
        path: &JPath,
        what: &str,
    ) -> Option<PathBuf> {
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

    pub(super) fn args(&mut self, node: &Node, path: &JPath) -> Vec<String> {
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

    pub(super) fn env(&mut self, node: &Node, path: &JPath) -> Vec<(String, String)> {
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

    pub(super) fn cwd(&mut self, node: &Node, path: &JPath) -> Option<(String, PathBuf)> {
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

    pub(super) fn matcher(
        &mut self,
        node: &Node,
        path: &JPath,
        event: Option<EventKind>,
    ) -> Option<Matcher> {
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
    pub(super) fn assign_ids(
        &mut self,
        drafts: Vec<Draft>,
        top_timeout_ms: u64,
    ) -> Vec<Arc<Action>> {
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
