//! The checks behind plugin.toml: one `Check` pass over the parsed TOML, each rule reporting
//! at its key (ARCHITECTURE.md § WASM plugins).

use super::*;

pub(super) struct Check<'t> {
    pub(super) text: &'t str,
    pub(super) dir: &'t Path,
    pub(super) errs: Vec<Raw>,
    pub(super) warns: Vec<Raw>,
}

impl Check<'_> {
    pub(super) fn err(&mut self, pos: usize, path: &str, reason: impl Into<String>) {
        self.errs.push(Raw {
            pos,
            path: path.to_string(),
            reason: reason.into(),
        });
    }

    /// What a value is, for "expected …, found …": scalars as written.
    pub(super) fn found(&self, v: &Val<'_>) -> String {
        match v.get_ref() {
            DeValue::String(s) => format!("the string {}", quote(s)),
            DeValue::Array(_) => "an array".into(),
            DeValue::Table(_) => "a table".into(),
            DeValue::Datetime(d) => format!("the date-time {d}"),
            DeValue::Integer(_) | DeValue::Float(_) | DeValue::Boolean(_) => {
                let written = self.text.get(v.span()).unwrap_or_default();
                let q = quote(written);
                q[1..q.len() - 1].to_string()
            }
        }
    }

    pub(super) fn type_err(&mut self, v: &Val<'_>, path: &str, expected: &str) {
        let reason = format!("expected {expected}, found {}", self.found(v));
        self.err(v.span().start, path, reason);
    }

    pub(super) fn string<'v>(&mut self, v: &'v Val<'_>, path: &str) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s),
            _ => {
                self.type_err(v, path, "a string");
                None
            }
        }
    }

    /// An integer in `lo..=hi`.
    pub(super) fn integer(&mut self, v: &Val<'_>, path: &str, lo: i64, hi: i64) -> Option<i64> {
        if let DeValue::Integer(i) = v.get_ref()
            && let Ok(n) = i128::from_str_radix(i.as_str(), i.radix())
            && (lo as i128..=hi as i128).contains(&n)
        {
            return Some(n as i64);
        }
        let expected = if hi == i64::MAX {
            format!("an integer of at least {lo}")
        } else {
            format!("an integer between {lo} and {hi}")
        };
        self.type_err(v, path, &expected);
        None
    }

    pub(super) fn table<'v, 'i>(
        &mut self,
        v: &'v Val<'i>,
        path: &str,
        expected: &str,
    ) -> Option<&'v DeTable<'i>> {
        match v.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => {
                self.type_err(v, path, expected);
                None
            }
        }
    }

    /// An array of strings: each with its position and path.
    pub(super) fn strings(&mut self, v: &Val<'_>, path: &str) -> Vec<(String, usize, String)> {
        let DeValue::Array(items) = v.get_ref() else {
            self.type_err(v, path, "an array of strings");
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = index_path(path, i);
            if let Some(s) = self.string(item, &p) {
                out.push((s.to_string(), item.span().start, p));
            }
        }
        out
    }

    /// An unknown key where PRX ignores them (the top level, `[plugin]`): a warning.
    pub(super) fn unknown_key_warning(&mut self, key: &Key<'_>, parent: &str, known: &[&str]) {
        let before = self.errs.len();
        self.unknown_key(key, parent, known);
        let mut w = self.errs.split_off(before);
        if let Some(w) = w.first_mut() {
            w.reason.push_str(" (ignored, as PRX does)");
        }
        self.warns.extend(w);
    }

    pub(super) fn unknown_key(&mut self, key: &Key<'_>, parent: &str, known: &[&str]) {
        let k: &str = key.get_ref();
        let mut reason = format!("unknown key {}", quote(k));
        if let Some(s) = crate::suggest(k, known) {
            reason.push_str(&format!("; did you mean \"{s}\"?"));
        } else if let Some((section, _)) = SECTIONS
            .iter()
            .find(|(_, keys)| keys.contains(&k) && !std::ptr::eq(*keys, known))
        {
            reason.push_str(&format!("; \"{k}\" belongs in {section}"));
        } else {
            reason.push_str(&format!("; expected one of {}", known.join(", ")));
        }
        self.err(key.span().start, &key_path(parent, k), reason);
    }

    pub(super) fn document(&mut self, root: &DeTable<'_>, label: &str) -> Manifest {
        let mut m = Manifest {
            name: String::new(),
            version: String::new(),
            description: None,
            author: None,
            license: None,
            dir: self.dir.to_path_buf(),
            file: label.to_string(),
            wasm: self.dir.join(DEFAULT_WASM),
            capabilities: Vec::new(),
            patterns: Vec::new(),
            events: EventMask::NONE,
            permissions: Permissions::default(),
            resources: Resources::DEFAULT,
            config: BTreeMap::new(),
            policy: None,
            source: self.text.to_string(),
            declared_name: None,
            warnings: Vec::new(),
        };
        let mut has_plugin = false;
        for (key, v) in root.iter() {
            let k: &str = key.get_ref();
            let path = key_path("", k);
            match k {
                "plugin" => {
                    has_plugin = true;
                    if let Some(t) = self.table(v, &path, "a table ([plugin])") {
                        self.plugin(t, v.span().start, &mut m);
                    }
                }
                "capabilities" => self.capabilities(v, &path, &mut m),
                "permissions" => {
                    if let Some(t) = self.table(v, &path, "a table ([permissions])") {
                        m.permissions = self.permissions(t, &path);
                    }
                }
                "resources" => {
                    if let Some(t) = self.table(v, &path, "a table ([resources])") {
                        m.resources = self.resources(t, &path);
                    }
                }
                "config" => {
                    if let Some(t) = self.table(v, &path, "a table ([config])") {
                        m.config = self.config(t, &path);
                    }
                }
                "policy" => {
                    if let Some(t) = self.table(v, &path, "a table ([policy])") {
                        m.policy = self.policy(t, v.span().start, &path);
                    }
                }
                _ => self.unknown_key_warning(key, "", TOP_KEYS),
            }
        }
        if !has_plugin {
            self.err(
                0,
                "plugin",
                "missing [plugin] (required): the table with the plugin's \"name\" and \"version\"",
            );
        }
        for cap in &m.capabilities {
            if cap.is_hook() {
                for p in &cap.events {
                    if !m.patterns.contains(p) {
                        m.patterns.push(p.clone());
                    }
                }
            }
        }
        m.events = m
            .patterns
            .iter()
            .fold(EventMask::NONE, |acc, p| acc | pattern_mask(p));
        if let Some(p) = &mut m.policy
            && p.id.is_empty()
        {
            p.id = m.name.clone();
        }
        m
    }

    pub(super) fn plugin(&mut self, t: &DeTable<'_>, header: usize, m: &mut Manifest) {
        let path = "plugin";
        let mut name = None;
        let mut version = None;
        let mut wasm: Option<(&str, usize, String)> = None;
        for (key, v) in t.iter() {
            let k: &str = key.get_ref();
            let p = key_path(path, k);
            match k {
                "name" => name = self.string(v, &p).map(|s| (s, v.span().start, p)),
                "version" => version = self.string(v, &p).map(|s| (s, v.span().start, p)),
                "wasm" => wasm = self.string(v, &p).map(|s| (s, v.span().start, p)),
                "description" => m.description = self.string(v, &p).map(str::to_string),
                "author" => m.author = self.string(v, &p).map(str::to_string),
                "license" => m.license = self.string(v, &p).map(str::to_string),
                "api_version" => {
                    self.string(v, &p);
                }
                _ => self.unknown_key_warning(key, path, PLUGIN_KEYS),
            }
        }
        let has = |k: &str| t.iter().any(|(key, _)| &**key.get_ref() == k);
        match name {
            Some((n, pos, p)) => {
                if let Some(named) = self.name(n, pos, &p) {
                    m.declared_name = (named != n).then(|| n.to_string());
                    m.name = named;
                }
            }
            None if !has("name") => self.err(
                header,
                path,
                "missing \"name\" (required): the plugin's name, equal to its directory's name",
            ),
            None => {}
        }
        match version {
            Some((v, pos, p)) => {
                if v.trim().is_empty() {
                    self.err(
                        pos,
                        &p,
                        "may not be empty: the plugin's version, such as \"0.1.0\"",
                    );
                } else {
                    m.version = v.to_string();
                }
            }
            None if !has("version") => self.err(
                header,
                path,
                "missing \"version\" (required): the plugin's version, such as \"0.1.0\"",
            ),
            None => {}
        }
        match wasm {
            Some((w, pos, p)) => {
                if let Some(full) = self.wasm(w, pos, &p, false) {
                    m.wasm = full;
                }
            }
            None if !has("wasm") => {
                if let Some(full) = self.wasm(DEFAULT_WASM, header, path, true) {
                    m.wasm = full;
                }
            }
            None => {}
        }
    }

    /// The plugin's name: its directory's name (which keys kv, stats and labels), or the
    /// written one when the directory has none (`.`). A written name that differs from the
    /// directory's, or is not a valid name, is a warning then (PRX requires neither); a directory
    /// name that is not a valid name is an error.
    pub(super) fn name(&mut self, name: &str, pos: usize, path: &str) -> Option<String> {
        let Some(dir_name) = self.dir.file_name() else {
            if !is_valid_name(name) {
                self.err(pos, path, invalid_name(name));
                return None;
            }
            return Some(name.to_string());
        };
        let Some(dir_name) = dir_name.to_str().filter(|d| is_valid_name(d)) else {
            self.err(
                pos,
                path,
                format!(
                    "the plugin's directory name {} is not a valid plugin name (1 to \
                     {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ -); rename the directory",
                    quote(&dir_name.to_string_lossy())
                ),
            );
            return None;
        };
        if dir_name != name {
            self.warns.push(Raw {
                pos,
                path: path.to_string(),
                reason: format!(
                    "the name {} differs from the plugin's directory name {}; the directory's \
                     name is used (it keys kv, stats and metric labels)",
                    quote(name),
                    quote(dir_name)
                ),
            });
        }
        Some(dir_name.to_string())
    }

    /// `[plugin] wasm`: relative, inside the directory (lexically and through symbolic links),
    /// an existing regular file. Returns the joined path.
    pub(super) fn wasm(
        &mut self,
        written: &str,
        pos: usize,
        path: &str,
        default: bool,
    ) -> Option<PathBuf> {
        let what = if default {
            format!("{} (the default \"wasm\")", quote(written))
        } else {
            quote(written)
        };
        if written.is_empty() {
            self.err(
                pos,
                path,
                format!("may not be empty; leave \"wasm\" out for the default \"{DEFAULT_WASM}\""),
            );
            return None;
        }
        if written.contains('\0') {
            self.err(pos, path, "may not contain a NUL byte");
            return None;
        }
        let p = Path::new(written);
        if p.has_root() {
            self.err(
                pos,
                path,
                format!(
                    "{what} is an absolute path; \"wasm\" is relative to the plugin directory, \
                     such as \"{DEFAULT_WASM}\""
                ),
            );
            return None;
        }
        let Some(rel) = normalize(p) else {
            self.err(
                pos,
                path,
                format!("{what} is outside the plugin directory; the component must be inside it"),
            );
            return None;
        };
        let full = if rel.as_os_str().is_empty() {
            self.dir.to_path_buf()
        } else {
            self.dir.join(&rel)
        };
        let shown = quote(&full.display().to_string());
        match std::fs::metadata(&full) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => {
                self.err(pos, path, format!("{what} ({shown}) is not a regular file"));
                return None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.err(
                    pos,
                    path,
                    format!(
                        "{what} does not exist (looked for {shown}); build the plugin first (for \
                         a Rust guest: cargo build --release --target wasm32-wasip2) and copy the \
                         component there"
                    ),
                );
                return None;
            }
            Err(e) => {
                self.err(pos, path, format!("cannot read {shown}: {e}"));
                return None;
            }
        }
        if let (Ok(canon_dir), Ok(canon)) = (
            std::fs::canonicalize(self.dir),
            std::fs::canonicalize(&full),
        ) && !canon.starts_with(&canon_dir)
        {
            self.err(
                pos,
                path,
                format!(
                    "{what} leads outside the plugin directory through a symbolic link (to {})",
                    quote(&canon.display().to_string())
                ),
            );
            return None;
        }
        Some(full)
    }

    pub(super) fn capabilities(&mut self, v: &Val<'_>, path: &str, m: &mut Manifest) {
        let DeValue::Array(items) = v.get_ref() else {
            self.type_err(v, path, "an array of tables ([[capabilities]])");
            return;
        };
        for (i, item) in items.iter().enumerate() {
            let p = index_path(path, i);
            if let Some(t) = self.table(item, &p, "a table ([[capabilities]])")
                && let Some(cap) = self.capability(t, item.span().start, &p)
            {
                m.capabilities.push(cap);
            }
        }
    }

    pub(super) fn capability(
        &mut self,
        t: &DeTable<'_>,
        header: usize,
        path: &str,
    ) -> Option<Capability> {
        let mut cap = Capability {
            kind: String::new(),
            name: None,
            description: None,
            priority: None,
            schedule: None,
            events: Vec::new(),
        };
        let mut kind_ok = false;
        let mut has_kind = false;
        let mut events = None;
        for (key, v) in t.iter() {
            let k: &str = key.get_ref();
            let p = key_path(path, k);
            match k {
                "type" => {
                    has_kind = true;
                    if let Some(s) = self.string(v, &p) {
                        kind_ok = self.capability_type(s, v.span().start, &p);
                        cap.kind = s.to_string();
                    }
                }
                "name" => cap.name = self.string(v, &p).map(str::to_string),
                "description" => cap.description = self.string(v, &p).map(str::to_string),
                "schedule" => cap.schedule = self.string(v, &p).map(str::to_string),
                "priority" => {
                    cap.priority = self
                        .integer(v, &p, i32::MIN.into(), i32::MAX.into())
                        .map(|n| n as i32)
                }
                "events" => events = Some((v, p)),
                _ => self.unknown_key(key, path, CAPABILITY_KEYS),
            }
        }
        if !has_kind {
            self.err(
                header,
                path,
                "missing \"type\" (required): \"hook\" for a plugin that receives lifecycle events",
            );
        }
        let hook = cap.kind == "hook";
        match events {
            Some((v, p)) => cap.events = self.events(v, &p, hook),
            None if hook => self.err(
                header,
                path,
                "missing \"events\": a hook receives only the events it lists, such as \
                 events = [\"prx.lifecycle.*\"] or [[capabilities.events]] tables with a \"pattern\"",
            ),
            None => {}
        }
        kind_ok.then_some(cap)
    }

    /// Accepts any type but a near miss of a known one (`hok`).
    pub(super) fn capability_type(&mut self, kind: &str, pos: usize, path: &str) -> bool {
        if CAPABILITY_TYPES.contains(&kind) {
            return true;
        }
        match crate::suggest(kind, CAPABILITY_TYPES) {
            Some(s) => {
                self.err(
                    pos,
                    path,
                    format!(
                        "unknown capability type {}; did you mean \"{s}\"?",
                        quote(kind)
                    ),
                );
                false
            }
            None => true,
        }
    }

    /// `events`: strings and/or `{pattern, description}` tables. For a hook, each pattern is
    /// checked and normalized; for other types only the shape is checked.
    pub(super) fn events(&mut self, v: &Val<'_>, path: &str, hook: bool) -> Vec<String> {
        let DeValue::Array(items) = v.get_ref() else {
            self.type_err(
                v,
                path,
                "an array of event patterns, such as [\"prx.lifecycle.*\"]",
            );
            return Vec::new();
        };
        if hook && items.is_empty() {
            self.err(
                v.span().start,
                path,
                "lists no events: a hook receives only the events it lists, such as \
                 [\"prx.lifecycle.*\"]",
            );
        }
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let p = index_path(path, i);
            let (pattern, pos, pp) = match item.get_ref() {
                DeValue::String(s) => (s.to_string(), item.span().start, p),
                DeValue::Table(t) => {
                    let mut pattern = None;
                    for (key, ev) in t.iter() {
                        let k: &str = key.get_ref();
                        let kp = key_path(&p, k);
                        match k {
                            "pattern" => {
                                pattern = self
                                    .string(ev, &kp)
                                    .map(|s| (s.to_string(), ev.span().start, kp))
                            }
                            "description" => {
                                self.string(ev, &kp);
                            }
                            _ => self.unknown_key(key, &p, EVENT_KEYS),
                        }
                    }
                    match pattern {
                        Some(x) => x,
                        None => {
                            if !t.iter().any(|(k, _)| &**k.get_ref() == "pattern") {
                                self.err(
                                    item.span().start,
                                    &p,
                                    "missing \"pattern\" (required): the event or topic \
                                     pattern, such as \"prx.lifecycle.*\"",
                                );
                            }
                            continue;
                        }
                    }
                }
                _ => {
                    self.type_err(
                        item,
                        &p,
                        "an event pattern (a string) or a table with a \"pattern\"",
                    );
                    continue;
                }
            };
            if !hook {
                out.push(pattern);
                continue;
            }
            match event_pattern(&pattern) {
                Ok(norm) => out.push(norm),
                Err(reason) => self.err(pos, &pp, reason),
            }
        }
        out
    }

    pub(super) fn permissions(&mut self, t: &DeTable<'_>, path: &str) -> Permissions {
        let mut perms = Permissions::default();
        for (key, v) in t.iter() {
            let k: &str = key.get_ref();
            let p = key_path(path, k);
            match k {
                "required" | "optional" => {
                    let mut names = Vec::new();
                    for (name, pos, np) in self.strings(v, &p) {
                        if KNOWN_PERMISSIONS.contains(&name.as_str()) {
                            names.push(name);
                        } else {
                            self.err(pos, &np, unknown_permission(&name));
                        }
                    }
                    if k == "required" {
                        perms.required = names;
                    } else {
                        perms.optional = names;
                    }
                }
                "http_allowlist" => {
                    perms.http_allowlist = self.strings(v, &p).into_iter().map(|s| s.0).collect()
                }
                "filesystem_allowlist" => {
                    perms.filesystem_allowlist =
                        self.strings(v, &p).into_iter().map(|s| s.0).collect()
                }
                _ => self.unknown_key(key, path, PERMISSION_KEYS),
            }
        }
        perms.events = perms
            .required
            .iter()
            .chain(&perms.optional)
            .any(|n| n == "events");
        perms
    }

    pub(super) fn resources(&mut self, t: &DeTable<'_>, path: &str) -> Resources {
        let mut r = Resources::DEFAULT;
        let mut kv_mb_given = false;
        let mut kv_kb = None;
        for (key, v) in t.iter() {
            let k: &str = key.get_ref();
            let p = key_path(path, k);
            let int = |c: &mut Self, lo: u64, hi: u64| {
                c.integer(v, &p, lo as i64, hi.min(i64::MAX as u64) as i64)
                    .map(|n| n as u64)
            };
            match k {
                "max_fuel" => {
                    if let Some(n) = int(self, 1, u64::MAX) {
                        r.max_fuel = n;
                    }
                }
                "max_memory_mb" => {
                    if let Some(n) = int(self, 1, MAX_MEMORY_MB) {
                        r.max_memory_mb = n;
                    }
                }
                "max_execution_time_ms" => {
                    if let Some(n) = int(self, 1, MAX_EXECUTION_TIME_MS) {
                        r.max_execution_time_ms = n;
                    }
                }
                "max_kv_storage_mb" => {
                    kv_mb_given = true;
                    if let Some(n) = int(self, 0, MAX_KV_STORAGE_MB) {
                        r.max_kv_storage_mb = n;
                    }
                }
                "max_kv_storage_kb" => kv_kb = int(self, 0, MAX_KV_STORAGE_MB * 1024),
                "pool_size" => {
                    if let Some(n) = int(self, 0, MAX_POOL_SIZE.into()) {
                        r.pool_size = (n as u32).max(1);
                    }
                }
                "max_http_requests_per_call" | "max_http_requests" => {
                    int(self, 0, u32::MAX.into());
                }
                _ => self.unknown_key(key, path, RESOURCE_KEYS),
            }
        }
        if let (false, Some(kb)) = (kv_mb_given, kv_kb) {
            r.max_kv_storage_mb = kb.div_ceil(1024);
        }
        r
    }

    pub(super) fn config(&mut self, t: &DeTable<'_>, path: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (key, v) in t.iter() {
            let k: &str = key.get_ref();
            let value = match v.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
                    Ok(n) => n.to_string(),
                    Err(_) => i.to_string(),
                },
                DeValue::Float(f) => f.as_str().to_string(),
                DeValue::Boolean(b) => b.to_string(),
                DeValue::Datetime(d) => d.to_string(),
                DeValue::Array(_) | DeValue::Table(_) => {
                    self.type_err(
                        v,
                        &key_path(path, k),
                        "a string, number or boolean ([config] values reach the plugin as \
                         strings; write a list as one string, such as \"a,b\")",
                    );
                    continue;
                }
            };
            out.insert(k.to_string(), value);
        }
        out
    }
}
