//! Editing `<workspace>/hooks.json` safely: what the HTTP API (ARCHITECTURE.md § HTTP API) sits on.
//!
//! # Model
//!
//! A [`HooksEditor`] owns no copy of the configuration: every call reads the file again. The
//! file is read with the same strict reader the loader uses (so the order of event keys, of
//! hooks and of each hook's fields is kept exactly as written — serde_json's `Map` is not used
//! for the document, it would sort keys without its `preserve_order` feature), mutated, written
//! back pretty-printed (two-space indentation; hand formatting and whitespace are not kept, the
//! content and order are), and validated by the real loader ([`parse`] with the real file
//! label) before it is written, so the API accepts exactly what the loader accepts, with the
//! same messages. Top-level fields the editor does not touch (`enabled`, `timeout_ms`,
//! `env_passthrough`) are kept as written, and event keys are kept as written too (`LLM-Response`
//! stays `LLM-Response`; a hook created for `llm_response` joins that array; a new event gets its
//! normalized name as key). An absent file is the empty document `{"hooks": {}}`. An event
//! array emptied by a delete or a move stays in the file (`"error": []`); a leading byte order
//! mark is not written back.
//!
//! A hook, as the API sees it, is a flat JSON object: the fields written in the file (a field
//! written as `null` means "not given" to the loader and is left out) plus `"event"` (the
//! normalized name) and `"id"`. Values inherited from the top level (the file's `timeout_ms`)
//! are not added. The flat objects are serde_json `Value`s: without serde_json's
//! `preserve_order` feature (this crate does not enable it) their keys come out sorted; the
//! file itself keeps its order. Each hook has a strong ETag (a hash of its flat JSON with
//! sorted keys, so writes to other hooks do not change it), and the list has one (a hash of
//! the file's bytes): quoted 128-bit FNV-1a hex, the same on every build.
//!
//! # Ids
//!
//! The loader gives a hook without an `id` a deterministic one derived from its event and
//! content. The first write through the editor writes those ids into the file (every hook
//! lacking one gets exactly the id readers already saw), so afterwards ids never shift when
//! other hooks are added, removed or edited. Every later write does the same for hooks added
//! by hand without an id. A created hook without an `id` gets the id the loader derives for it,
//! written into the file.
//!
//! # Validation errors
//!
//! [`EditError::Invalid`] carries the loader's reason and a path relative to the request body:
//! `hooks.tool_call[3].args[2]` becomes `args[2]` when the hook being written is
//! `hooks.tool_call[3]`, an unknown event key becomes `event`; the error reads `args[2]:
//! reason` (a position in the document that was about to be written would mean nothing to the
//! client). [`EditError::in_body`] then places it in the body the client sent:
//! `body:LINE:COL: args[2]: reason`. Errors elsewhere in the file keep the loader's line with
//! its document path (`hooks.json:LINE:COL: hooks.error[0].timeout_ms: reason`). Messages name
//! the file `hooks.json`, never where it is: they go to API clients. A few body-shape checks
//! are the editor's own (`event` missing or not a string, an `id` that would change, a
//! duplicate `id` or one a URL path would normalize away on create); their `error` is the
//! reason alone. The loader's warnings about the hook written come back with it
//! ([`Written::warnings`], `command: reason`).
//!
//! # Concurrency and the race window
//!
//! Every call of one editor holds one mutex, so API writers are serialized and each builds on
//! the previous one's file: no update is lost. Use one editor per workspace (two editors on the
//! same file see each other's writes as hand edits).
//!
//! The editor remembers a hash of the file as it last wrote it (before its first write: as it
//! was when the editor first looked at it, [`HooksEditor::baseline`]). A mutation re-reads the
//! file first; when it differs (a hand edit, another program) and the caller did not prove,
//! with an `If-Match` ETag that matches the file as it is now, that its view is current, the
//! mutation is refused with [`EditError::Conflict`] (409) and the file is left as it is. Reads
//! vouch for nobody (the API has one token and no client identity: another client's read says
//! nothing about this one's view), and a 409 changes nothing, so every blind write is refused
//! until a write with a current `If-Match` goes through; blind writes build on that one again.
//! A stale `If-Match` is [`EditError::PreconditionFailed`] (412) whether or not the file was
//! edited by hand.
//!
//! The new document is built from the bytes just re-read, so a hand edit made before that
//! re-read is never overwritten. The remaining window is between that re-read and the
//! `rename` that installs the new file (building, validating, writing and syncing the temporary
//! file: typically well under a millisecond plus the fsync): a hand edit saved inside it is
//! replaced by the API's write and is lost, silently. Closing it would need a lock that every
//! editor of the file honours, which text editors do not. The hand edit is only lost if it was
//! saved inside that window; one saved after the rename replaces the API's write (and the
//! next API call answers 409).
//!
//! # Writes and going live
//!
//! Writes are atomic: a temporary file in the workspace (`.hooks.json.<pid>.<n>.tmp`), written,
//! `fsync`ed, renamed over hooks.json, then the directory is `fsync`ed. The file's permission
//! bits are kept; a new file is 0600 whatever the umask (its hooks' `env` may hold secrets);
//! its owner is the writing process's (a symbolic link named hooks.json is replaced by a
//! regular file). Every successful mutation returns the
//! table the loader built from exactly the bytes written (`source` set, like [`super::load()`]).
//! To make it live before answering, a caller with a [`super::ConfigWatcher`] calls
//! [`super::ConfigWatcher::reload_now`]: it reads the file (normally the bytes just written),
//! swaps the table in and remembers those bytes, so the watcher's own event for the rename is
//! then a no-op ([`super::Reload::Unchanged`]). Calling `ShellSink::set_table` with the returned
//! table directly also works, but the watcher does not know those bytes and re-applies an
//! equal table when its event arrives.

use super::error::{ConfigErrors, Path as JPath, quote};
use super::load::{HOOKS_FILE, normalize_event_key, parse, read_hooks_file};
use super::model::HookTable;
use super::spanned::{self, Node, Val};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod body;
mod doc;
mod error;
mod json;

pub use body::parse_body;
pub use error::EditError;

use body::*;
use doc::*;
use error::*;
use json::*;

/// A strong ETag, quoted: `"0123…"` (32 hex digits).
pub type ETag = String;

/// One hook as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hook {
    /// The hook's id (written in the file, or the one derived from its command).
    pub id: String,
    /// The normalized event name.
    pub event: String,
    /// The flat object: the fields written in the file plus `event` and `id`.
    pub json: Value,
    /// The hook's own version, for `If-Match`.
    pub etag: ETag,
}

/// Every hook, in file order, and the ETag of the whole list.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// Every hook, in file order.
    pub hooks: Vec<Hook>,
    /// The version of the whole list, for `If-Match`.
    pub etag: ETag,
}

/// What a successful create, update or toggle did.
#[derive(Debug, Clone)]
pub struct Written {
    /// The hook as it is now in the file.
    pub hook: Hook,
    /// The new list ETag.
    pub list_etag: ETag,
    /// The table the loader built from the bytes written (make it live before answering).
    pub table: Arc<HookTable>,
    /// The loader's warnings about this hook (a bare command not found on the sanitized PATH,
    /// …), each `PATH: reason` with the path relative to the hook (`command`, `$`).
    pub warnings: Vec<String>,
}

/// What a successful delete did.
#[derive(Debug, Clone)]
pub struct Removed {
    /// The new list ETag.
    pub list_etag: ETag,
    /// The table the loader built from the bytes written (make it live before answering).
    pub table: Arc<HookTable>,
}

/// Edits one workspace's hooks.json. Cheap to create; share one per workspace (`Arc`).
///
/// # Examples
///
/// ```
/// use prx_hooks::config::HooksEditor;
/// use serde_json::json;
/// let ws = std::env::temp_dir().join(format!("prx-hooks-doc-edit-{}", std::process::id()));
/// std::fs::create_dir_all(&ws)?;
/// let editor = HooksEditor::new(&ws);
/// let written = editor.create(json!({"event": "tool_call", "id": "audit", "command": "true"}))?;
/// assert_eq!(written.hook.event, "tool_call");
/// assert_eq!(written.table.actions.len(), 1); // the table the loader built from the file
/// let off = editor.toggle("audit", None)?;
/// assert_eq!(off.hook.json["enabled"], json!(false));
/// // The loader's rules hold: a command with shell syntax is refused, nothing is written.
/// let refused = editor.create(json!({"event": "error", "command": "ls | wc"})).unwrap_err();
/// assert_eq!((refused.status(), refused.path()), (422, "command"));
/// editor.delete("audit", None)?;
/// assert!(editor.list()?.hooks.is_empty());
/// # std::fs::remove_dir_all(&ws)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct HooksEditor {
    workspace: PathBuf,
    file: PathBuf,
    /// How messages name the file: `hooks.json`, never where it is (they go to API clients).
    label: String,
    /// The hash of the file as this editor last wrote it, or as it was when the editor first
    /// looked at it ([`HooksEditor::baseline`] or the first call); `None`: not yet. A mutation
    /// without `If-Match` is refused while the file differs from it. Also the lock that
    /// serializes every call.
    written: Mutex<Option<u128>>,
}

/// The file as read now.
struct Current {
    hash: u128,
    doc: J,
    table: HookTable,
}

impl HooksEditor {
    /// An editor of `workspace`'s hooks.json; nothing is read until the first call.
    pub fn new(workspace: &Path) -> HooksEditor {
        HooksEditor {
            workspace: workspace.to_path_buf(),
            file: workspace.join(HOOKS_FILE),
            label: HOOKS_FILE.to_string(),
            written: Mutex::new(None),
        }
    }

    /// The file this editor writes.
    pub fn file(&self) -> &Path {
        &self.file
    }

    fn lock(&self) -> MutexGuard<'_, Option<u128>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the file as it is now as the version blind writes may build on, unless the
    /// editor already has one (the HTTP API calls this when it starts serving). A file that
    /// cannot be read now leaves it to the first call.
    pub fn baseline(&self) {
        let mut written = self.lock();
        if written.is_none()
            && let Ok(bytes) = read_hooks_file(&self.workspace)
        {
            *written = Some(fnv128(bytes.as_deref().unwrap_or(b"")));
        }
    }

    /// Every hook, in file order.
    pub fn list(&self) -> Result<Listing, EditError> {
        let mut seen = self.lock();
        let cur = self.read()?;
        seen.get_or_insert(cur.hash);
        let hooks = flat_hooks(&cur)
            .into_iter()
            .map(|(_, h)| h)
            .collect::<Vec<_>>();
        Ok(Listing {
            hooks,
            etag: etag(cur.hash),
        })
    }

    /// One hook.
    pub fn get(&self, id: &str) -> Result<Hook, EditError> {
        let mut seen = self.lock();
        let cur = self.read()?;
        seen.get_or_insert(cur.hash);
        flat_hooks(&cur)
            .into_iter()
            .map(|(_, h)| h)
            .find(|h| h.id == id)
            .ok_or_else(|| EditError::NotFound { id: id.to_string() })
    }

    /// Adds a hook: `body` is a flat object with `event` (required) and the action's fields;
    /// an `id` may be given (valid and unique), else the loader's derived id is assigned and
    /// written. The hook goes at the end of its event's array.
    pub fn create(&self, body: Value) -> Result<Written, EditError> {
        self.create_if(body, None)
    }

    /// [`create`](Self::create), refused with 412 unless `if_match` (when given) names the
    /// current list ETag.
    pub fn create_if(&self, body: Value, if_match: Option<&str>) -> Result<Written, EditError> {
        check_depth(&body)?;
        let Value::Object(map) = body else {
            return Err(EditError::BadRequest(format!(
                "the hook must be a JSON object, found {}",
                value_kind(&body)
            )));
        };
        let mut seen = self.lock();
        let mut cur = self.begin(&mut seen, None, if_match)?;
        let event = body_event(map.get("event"))?;
        if let Some(Value::String(id)) = map.get("id")
            && (id == "." || id == "..")
        {
            return Err(EditError::Invalid {
                error: format!(
                    "the id {} cannot be used: URL paths normalize it away (/api/hooks/{id} is \
                     not this hook's URL); choose another",
                    quote(id)
                ),
                path: "id".into(),
            });
        }
        if let Some(Value::String(id)) = map.get("id")
            && cur.table.get(id).is_some()
        {
            return Err(EditError::Invalid {
                error: format!("duplicate id {}: another hook already has it", quote(id)),
                path: "id".into(),
            });
        }
        let mut obj: Vec<(String, J)> = Vec::new();
        for (k, v) in map {
            if k == "event" || v.is_null() {
                continue;
            }
            obj.push((k, J::from_value(v)));
        }
        let has_id = obj.iter().any(|(k, _)| k == "id");
        materialize_ids(&mut cur);
        let (key, index, new_key) = place(&mut cur.doc, &event, J::Obj(obj))?;
        let loc = Loc {
            key: key.clone(),
            index,
            new_key,
        };
        let mut table = self.validate(&cur.doc, &loc)?;
        if !has_id {
            // The id the loader derived for it, written so it never changes.
            let id = table
                .actions
                .iter()
                .find(|a| a.event.name() == normalize_event_key(&key) && a.index == index)
                .map(|a| a.id.clone())
                .ok_or_else(|| EditError::Io("the new hook vanished while validating".into()))?;
            if let Some(J::Obj(m)) = node_mut(&mut cur.doc, &key, index) {
                m.insert(0, ("id".into(), J::Str(id)));
            }
            table = self.validate(&cur.doc, &loc)?;
        }
        self.commit(&mut seen, &cur.doc, table, &key, index)
    }

    /// Applies an RFC 7396 merge patch to the hook's flat object. `id` cannot change; a new
    /// `event` moves the hook to the end of that event's array, keeping its id.
    pub fn update(
        &self,
        id: &str,
        patch: Value,
        if_match: Option<&str>,
    ) -> Result<Written, EditError> {
        check_depth(&patch)?;
        let Value::Object(patch) = patch else {
            return Err(EditError::BadRequest(format!(
                "a merge patch must be a JSON object, found {}",
                value_kind(&patch)
            )));
        };
        let mut seen = self.lock();
        let mut cur = self.begin(&mut seen, Some(id), if_match)?;
        materialize_ids(&mut cur);
        let (old_key, old_index, old_event) = locate(&cur, id)?;
        if let Some(v) = patch.get("id")
            && v.as_str() != Some(id)
        {
            return Err(EditError::Invalid {
                error: format!("the id cannot change (it is {})", quote(id)),
                path: "id".into(),
            });
        }
        let new_event = match patch.get("event") {
            None => old_event.clone(),
            Some(v) => body_event(Some(v))?,
        };
        let Some(J::Obj(members)) = node_mut(&mut cur.doc, &old_key, old_index) else {
            return Err(EditError::NotFound { id: id.to_string() });
        };
        for (k, v) in patch {
            if k == "id" || k == "event" {
                continue;
            }
            merge_member(members, k, v);
        }
        let (key, index, new_key) = if normalize_event_key(&new_event) == old_event {
            (old_key, old_index, false)
        } else {
            let node = remove_node(&mut cur.doc, &old_key, old_index)
                .ok_or_else(|| EditError::NotFound { id: id.to_string() })?;
            place(&mut cur.doc, &new_event, node)?
        };
        let loc = Loc {
            key: key.clone(),
            index,
            new_key,
        };
        let table = self.validate(&cur.doc, &loc)?;
        self.commit(&mut seen, &cur.doc, table, &key, index)
    }

    /// Flips the hook's `enabled` (absent means true, so the first toggle disables it).
    pub fn toggle(&self, id: &str, if_match: Option<&str>) -> Result<Written, EditError> {
        let mut seen = self.lock();
        let mut cur = self.begin(&mut seen, Some(id), if_match)?;
        materialize_ids(&mut cur);
        let (key, index, _) = locate(&cur, id)?;
        let Some(J::Obj(members)) = node_mut(&mut cur.doc, &key, index) else {
            return Err(EditError::NotFound { id: id.to_string() });
        };
        match members.iter_mut().find(|(k, _)| k == "enabled") {
            Some((_, v)) => {
                let now = !matches!(v, J::Bool(false));
                *v = J::Bool(!now);
            }
            None => members.push(("enabled".into(), J::Bool(false))),
        }
        let loc = Loc {
            key: key.clone(),
            index,
            new_key: false,
        };
        let table = self.validate(&cur.doc, &loc)?;
        self.commit(&mut seen, &cur.doc, table, &key, index)
    }

    /// Removes the hook. The other hooks keep their ids (written into the file).
    pub fn delete(&self, id: &str, if_match: Option<&str>) -> Result<Removed, EditError> {
        let mut seen = self.lock();
        let mut cur = self.begin(&mut seen, Some(id), if_match)?;
        materialize_ids(&mut cur);
        let (key, index, _) = locate(&cur, id)?;
        remove_node(&mut cur.doc, &key, index)
            .ok_or_else(|| EditError::NotFound { id: id.to_string() })?;
        let table = self.validate(&cur.doc, &Loc::none())?;
        let bytes = cur.doc.to_file_bytes();
        self.write(&bytes)?;
        let hash = fnv128(&bytes);
        *seen = Some(hash);
        Ok(Removed {
            list_etag: etag(hash),
            table: Arc::new(table),
        })
    }

    /// Reads and parses the file as it is now.
    fn read(&self) -> Result<Current, EditError> {
        let bytes = read_hooks_file(&self.workspace)
            .map_err(|e| EditError::Io(format!("{}: cannot read the file: {e}", self.label)))?;
        let Some(bytes) = bytes else {
            return Ok(Current {
                hash: fnv128(b""),
                doc: J::Obj(vec![("hooks".into(), J::Obj(Vec::new()))]),
                table: super::load::empty_table(),
            });
        };
        let hash = fnv128(&bytes);
        let table = parse(&bytes, &self.label, &self.workspace).map_err(|errs| {
            let first = errs.iter().next();
            EditError::FileInvalid {
                error: first.map_or_else(|| errs.to_string(), |e| e.to_string()),
                path: first.map_or_else(|| "$".into(), |e| e.path.clone()),
            }
        })?;
        let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
        let text = std::str::from_utf8(text)
            .map_err(|_| EditError::Io(format!("{}: not UTF-8", self.label)))?;
        let doc = match spanned::parse(text).root {
            Ok(node) => J::from_node(node),
            Err(e) => {
                return Err(EditError::FileInvalid {
                    error: e.reason,
                    path: e.path.to_string(),
                });
            }
        };
        Ok(Current { hash, doc, table })
    }

    /// The start of every mutation: re-read, then the conflict checks.
    fn begin(
        &self,
        seen: &mut Option<u128>,
        target: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<Current, EditError> {
        let cur = self.read()?;
        let changed = seen.is_some_and(|h| h != cur.hash);
        seen.get_or_insert(cur.hash);
        let list_etag = etag(cur.hash);
        if let Some(id) = target {
            let hook = flat_hooks(&cur)
                .into_iter()
                .map(|(_, h)| h)
                .find(|h| h.id == id);
            let Some(hook) = hook else {
                return Err(EditError::NotFound { id: id.to_string() });
            };
            if let Some(header) = if_match {
                if if_match_ok(header, &[&hook.etag, &list_etag]) {
                    return Ok(cur);
                }
                return Err(EditError::PreconditionFailed(format!(
                    "If-Match {} does not match the current version of hook {} ({}); read it \
                     again",
                    quote(header),
                    quote(id),
                    hook.etag
                )));
            }
        } else if let Some(header) = if_match {
            if if_match_ok(header, &[&list_etag]) {
                return Ok(cur);
            }
            return Err(EditError::PreconditionFailed(format!(
                "If-Match {} does not match the current list ({list_etag}); read it again",
                quote(header)
            )));
        }
        if changed {
            // Not remembered: every blind write is refused until one proves a current view.
            return Err(EditError::Conflict(format!(
                "{} was changed on disk since the API last wrote it (a hand edit?); nothing was \
                 written: read the hook (or the list) again and send its ETag in If-Match",
                self.label
            )));
        }
        Ok(cur)
    }

    /// Validates a document with the loader; errors are mapped to the request body.
    fn validate(&self, doc: &J, loc: &Loc) -> Result<HookTable, EditError> {
        let bytes = doc.to_file_bytes();
        match parse(&bytes, &self.label, &self.workspace) {
            Ok(mut table) => {
                table.source = Some(self.file.clone());
                Ok(table)
            }
            Err(errs) => Err(map_errors(&errs, loc)),
        }
    }

    fn commit(
        &self,
        seen: &mut Option<u128>,
        doc: &J,
        table: HookTable,
        key: &str,
        index: usize,
    ) -> Result<Written, EditError> {
        let bytes = doc.to_file_bytes();
        self.write(&bytes)?;
        let hash = fnv128(&bytes);
        *seen = Some(hash);
        let event = normalize_event_key(key);
        let action = table
            .actions
            .iter()
            .find(|a| a.event.name() == event && a.index == index)
            .cloned();
        let node = doc_node(doc, key, index);
        let (Some(action), Some(J::Obj(members))) = (action, node) else {
            return Err(EditError::Io(
                "the hook written cannot be found again".into(),
            ));
        };
        let hook = flat(members, &event, &action.id);
        let prefix = JPath::root().key("hooks").key(key).index(index).to_string();
        let warnings = table
            .warnings
            .iter()
            .filter_map(|w| relative_warning(w, &self.label, &prefix))
            .collect();
        Ok(Written {
            hook,
            list_etag: etag(hash),
            table: Arc::new(table),
            warnings,
        })
    }

    /// Temp file + write + fsync + rename + fsync of the directory; keeps the mode bits.
    fn write(&self, bytes: &[u8]) -> Result<(), EditError> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let io = |what: &str, e: std::io::Error| {
            EditError::Io(format!("{}: cannot {what}: {e}", self.label))
        };
        // An existing file keeps its mode; a new one is private (it may hold `env` secrets).
        let mode = std::fs::metadata(&self.file)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o600);
        let dir = match self.file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = dir.join(format!(
            ".{HOOKS_FILE}.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io("create a temporary file", e))?;
            f.write_all(bytes)
                .map_err(|e| io("write the temporary file", e))?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(|e| io("set the file mode", e))?;
            f.sync_all().map_err(|e| io("sync the temporary file", e))?;
            drop(f);
            std::fs::rename(&tmp, &self.file).map_err(|e| io("replace the file", e))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
            return result;
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync the directory", e))
    }
}

/// Whether an `If-Match` header value matches one of the current ETags (`*` matches; weak
/// tags never do: the comparison is strong).
fn if_match_ok(header: &str, current: &[&str]) -> bool {
    header
        .split(',')
        .map(str::trim)
        .any(|t| t == "*" || (!t.starts_with("W/") && current.contains(&t)))
}

fn etag(hash: u128) -> ETag {
    format!("\"{hash:032x}\"")
}

/// 128-bit FNV-1a: the same on every build and machine.
fn fnv128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for &b in bytes {
        h ^= b as u128;
        h = h.wrapping_mul(PRIME);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pretty_printing_round_trips_and_keeps_order() {
        let text = r#"{"z": 1, "a": {"y": [1, 2, {"k": "v\n\u0000"}], "b": []}, "n": -1.5e3}"#;
        let doc = J::from_node(spanned::parse(text).root.unwrap());
        let bytes = doc.to_file_bytes();
        let again = J::from_node(
            spanned::parse(std::str::from_utf8(&bytes).unwrap())
                .root
                .unwrap(),
        );
        assert_eq!(doc, again);
        let s = String::from_utf8(bytes).unwrap();
        assert!(s.find("\"z\"").unwrap() < s.find("\"a\"").unwrap(), "{s}");
        assert!(s.contains("-1.5e3"), "{s}");
    }

    #[test]
    fn if_match_is_strong_and_accepts_lists_and_star() {
        let tags = ["\"ab\"", "\"cd\""];
        assert!(if_match_ok("\"ab\"", &tags));
        assert!(if_match_ok("\"x\", \"cd\"", &tags));
        assert!(if_match_ok("*", &tags));
        assert!(!if_match_ok("W/\"ab\"", &tags));
        assert!(!if_match_ok("\"zz\"", &tags));
        assert!(!if_match_ok("", &tags));
    }

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut m = vec![
            ("a".to_string(), J::Str("b".into())),
            (
                "c".to_string(),
                J::Obj(vec![
                    ("d".into(), J::Str("e".into())),
                    ("f".into(), J::Str("g".into())),
                ]),
            ),
        ];
        let patch = serde_json::json!({"a": "z", "c": {"f": null, "h": {"x": null, "y": 1}}});
        let serde_json::Value::Object(p) = patch else {
            unreachable!()
        };
        for (k, v) in p {
            merge_member(&mut m, k, v);
        }
        let v = J::Obj(m).to_value();
        assert_eq!(
            v,
            serde_json::json!({"a": "z", "c": {"d": "e", "h": {"y": 1}}})
        );
    }

    #[test]
    fn etags_are_quoted_hex() {
        let e = etag(fnv128(b"x"));
        assert_eq!(e.len(), 34);
        assert!(e.starts_with('"') && e.ends_with('"'));
        assert_ne!(etag(fnv128(b"x")), etag(fnv128(b"y")));
    }
}
