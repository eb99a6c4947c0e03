//! What `GET /api/hooks` (and `GET /api/hooks/{id}`) show while hooks.json on disk does not
//! load: the table in force, read-only, with the file's error beside it. Without this nobody
//! could see through the API what is running while a hand edit is half done.
//!
//! The hooks are rebuilt from the live table (the file that built it may be gone): the same
//! flat shape as usual, with the values the loader resolved — `cwd` relative to the workspace
//! (absolute when outside it), `timeout_ms` only when the hook set it, `limits` with the keys
//! it set. There is no ETag (a write is refused anyway until the file loads again).

use super::error::ApiError;
use super::json_response;
use crate::Hooks;
use crate::config::{Action, DEFAULT_MAX_CONCURRENT, EditError, HookLimits};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value, json};
use std::path::Path;

/// `{"hooks": [...], "read_only": true, "file_error": {"error", "path", "kind"}}`, 200.
pub(crate) fn list(hooks: &Hooks, error: EditError) -> Response {
    let table = hooks.hook_table();
    let ws = hooks.workspace();
    let list: Vec<Value> = table.actions.iter().map(|a| flat(a, ws)).collect();
    json_response(
        StatusCode::OK,
        &json!({ "hooks": list, "read_only": true, "file_error": file_error(&error) }),
    )
}

/// The live hook with `read_only` and `file_error` beside its fields, or 404.
pub(crate) fn get(hooks: &Hooks, id: &str, error: EditError) -> Result<Response, ApiError> {
    let table = hooks.hook_table();
    let Some(action) = table.get(id) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "no hook has the id {} in the table in force (hooks.json does not load: {error})",
                crate::config::quote(id)
            ),
        ));
    };
    let mut hook = flat(action, hooks.workspace());
    if let Value::Object(m) = &mut hook {
        m.insert("read_only".into(), true.into());
        m.insert("file_error".into(), file_error(&error));
    }
    Ok(json_response(StatusCode::OK, &hook))
}

fn file_error(e: &EditError) -> Value {
    json!({ "error": e.to_string(), "path": e.path(), "kind": e.kind() })
}

/// An action as the API's flat hook object.
fn flat(a: &Action, workspace: Option<&Path>) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), a.id.clone().into());
    m.insert("event".into(), a.event.name().into());
    m.insert("command".into(), a.command.clone().into());
    if !a.args.is_empty() {
        m.insert("args".into(), json!(a.args));
    }
    if !a.env.is_empty() {
        let env: Map<String, Value> = a
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        m.insert("env".into(), env.into());
    }
    let ws = workspace.map(|w| std::path::absolute(w).unwrap_or_else(|_| w.to_path_buf()));
    if ws.as_deref() != Some(a.cwd.as_path()) {
        let cwd = match ws.as_deref().and_then(|w| a.cwd.strip_prefix(w).ok()) {
            Some(rel) => rel.display().to_string(),
            None => a.cwd.display().to_string(),
        };
        m.insert("cwd".into(), cwd.into());
    }
    if a.timeout_explicit {
        m.insert("timeout_ms".into(), (a.timeout.as_millis() as u64).into());
    }
    if a.stdin_json {
        m.insert("stdin_json".into(), true.into());
    }
    if !a.enabled {
        m.insert("enabled".into(), false.into());
    }
    if let Some(matcher) = &a.matcher {
        m.insert("matcher".into(), matcher.source().into());
    }
    if a.max_concurrent != DEFAULT_MAX_CONCURRENT {
        m.insert("max_concurrent".into(), a.max_concurrent.into());
    }
    let limits: Map<String, Value> = HookLimits::KEYS
        .iter()
        .filter_map(|k| Some((k.to_string(), a.limits.get(k)?.into())))
        .collect();
    if !limits.is_empty() {
        m.insert("limits".into(), limits.into());
    }
    Value::Object(m)
}
