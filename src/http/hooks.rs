//! `/api/hooks…`: CRUD through the workspace's [`HooksEditor`], the test run and the run
//! history.
//!
//! Editor calls read, validate, write and fsync files, and a test run waits for a process, so
//! they run on tokio's blocking pool, never on an executor thread. A write is made live with
//! [`Hooks::apply_hooks_file`] before the response is sent: a client that gets 201 can emit an
//! event at once and the new hook sees it.

use super::auth::Caller;
use super::body::{self, JsonBody};
use super::error::ApiError;
use super::{Api, ApiState, json_response};
use crate::Hooks;
use crate::config::{EditError, Hook, HooksEditor, Reload, Written};
use crate::shell::{Outcome, OutcomeKind};
use axum::Extension;
use axum::body::Body;
use axum::extract::Path;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;

/// Agent and session of the events a test run sends.
const TEST_AGENT: &str = "prx-hooks";
const TEST_SESSION: &str = "http-test";

pub(crate) async fn list(State(api): ApiState, headers: HeaderMap) -> Result<Response, ApiError> {
    let listing = blocking(&api, |_, ed| Ok(ed.list()?)).await?;
    if not_modified(&headers, &listing.etag) {
        return Ok(unchanged(&listing.etag));
    }
    let hooks: Vec<&Value> = listing.hooks.iter().map(|h| &h.json).collect();
    Ok(with_etag(
        json_response(StatusCode::OK, &json!({ "hooks": hooks })),
        &listing.etag,
    ))
}

pub(crate) async fn get(
    State(api): ApiState,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let hook = blocking(&api, move |_, ed| Ok(ed.get(&id)?)).await?;
    if not_modified(&headers, &hook.etag) {
        return Ok(unchanged(&hook.etag));
    }
    Ok(hook_response(StatusCode::OK, &hook))
}

pub(crate) async fn create(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let if_match = if_match(&headers)?;
    let body = required(body::json(&headers, body, api.opts.max_body_bytes).await?)?;
    let hook = write(&api, move |ed| {
        ed.create_if(body.value, if_match.as_deref())
    })
    .await?;
    audit(&caller, "created", &hook);
    let mut resp = hook_response(StatusCode::CREATED, &hook);
    if let Ok(location) = HeaderValue::from_str(&format!("/api/hooks/{}", hook.id)) {
        resp.headers_mut().insert(header::LOCATION, location);
    }
    Ok(resp)
}

pub(crate) async fn update(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let if_match = if_match(&headers)?;
    let patch = required(body::json(&headers, body, api.opts.max_body_bytes).await?)?;
    let hook = write(&api, move |ed| {
        ed.update(&id, patch.value, if_match.as_deref())
    })
    .await?;
    audit(&caller, "changed", &hook);
    Ok(hook_response(StatusCode::OK, &hook))
}

pub(crate) async fn toggle(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let if_match = if_match(&headers)?;
    let hook = write(&api, move |ed| ed.toggle(&id, if_match.as_deref())).await?;
    let enabled = hook.json.get("enabled") != Some(&Value::Bool(false));
    audit(&caller, if enabled { "enabled" } else { "disabled" }, &hook);
    Ok(hook_response(StatusCode::OK, &hook))
}

pub(crate) async fn delete(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let if_match = if_match(&headers)?;
    let gone = id.clone();
    blocking(&api, move |hooks, ed| {
        writable(hooks)?;
        ed.delete(&gone, if_match.as_deref())?;
        go_live(hooks);
        Ok(())
    })
    .await?;
    tracing::info!(hook = %id, "hook deleted through the API by {}", caller.0);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Runs the hook once now (even if disabled), with the body as the payload or the event's
/// sample payload, and answers 200 with the outcome whatever it is.
pub(crate) async fn test(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let payload = body::json(&headers, body, api.opts.max_body_bytes).await?;
    let outcome = blocking(&api, move |hooks, _| {
        writable(hooks)?;
        let shell = hooks.shell().ok_or_else(no_workspace)?;
        let table = shell.table();
        let action = table.get(&id).ok_or_else(|| not_live(&id))?;
        let text = payload
            .as_ref()
            .map_or(action.event.sample_payload(), |p: &JsonBody| &p.text);
        let record = crate::ndjson::parse_payload(action.event, text, TEST_AGENT, TEST_SESSION)
            .map_err(|e| ApiError::invalid(e.message()))?;
        let msg = crate::shell::message_from_json(
            action.event,
            &record.payload_json(),
            TEST_AGENT,
            TEST_SESSION,
            0,
        );
        tracing::info!(hook = %id, "test run through the API by {}", caller.0);
        Ok(shell.run_once(action, &msg))
    })
    .await?;
    Ok(json_response(StatusCode::OK, &run_json(&outcome)))
}

/// The hook's last outcomes, newest first: `?limit=N` keeps the N newest.
pub(crate) async fn runs(
    State(api): ApiState,
    id: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let limit = query_limit(&uri)?;
    let shell = api.hooks.shell().ok_or_else(no_workspace)?;
    let mut runs = shell.runs(&id);
    if runs.is_empty() && shell.table().get(&id).is_none() {
        return Err(not_live(&id));
    }
    runs.reverse();
    runs.truncate(limit.unwrap_or(usize::MAX));
    let runs: Vec<Value> = runs.iter().map(run_json).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "id": id, "runs": runs }),
    ))
}

/// A run as the API shows it: the outcome's fields plus `outcome` (the line `fire` prints),
/// `ok` and `timed_out`.
fn run_json(o: &Outcome) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or_else(|_| json!({}));
    if let Value::Object(m) = &mut v {
        m.insert("outcome".into(), o.kind.to_string().into());
        m.insert("ok".into(), o.kind.is_ok().into());
        let timed_out = matches!(o.kind, OutcomeKind::TimedOut { .. });
        m.insert("timed_out".into(), timed_out.into());
    }
    v
}

/// A create, update or toggle: refused while shutting down, live before it returns.
async fn write(
    api: &Arc<Api>,
    edit: impl FnOnce(&HooksEditor) -> Result<Written, EditError> + Send + 'static,
) -> Result<Hook, ApiError> {
    blocking(api, move |hooks, ed| {
        writable(hooks)?;
        let written = edit(ed)?;
        go_live(hooks);
        Ok(written.hook)
    })
    .await
}

/// Runs `f` with the editor on the blocking pool.
async fn blocking<T: Send + 'static>(
    api: &Arc<Api>,
    f: impl FnOnce(&Hooks, &HooksEditor) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let api = api.clone();
    tokio::task::spawn_blocking(move || {
        let editor = api.hooks.editor().ok_or_else(no_workspace)?;
        f(&api.hooks, editor)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request's worker failed: {e}")))?
}

fn writable(hooks: &Hooks) -> Result<(), ApiError> {
    if hooks.is_shut_down() {
        return Err(ApiError::unavailable(
            "the hook system is shutting down; nothing was changed",
        ));
    }
    Ok(())
}

/// Makes the file just written live (the watcher would, a debounce later).
fn go_live(hooks: &Hooks) {
    if let Some(Reload::Rejected) = hooks.apply_hooks_file() {
        // Only possible when a hand edit broke the file right after the API wrote it.
        tracing::warn!("hooks.json changed after the API wrote it and does not load; see stats");
    }
}

fn no_workspace() -> ApiError {
    ApiError::unavailable("this hook system has no workspace, so there is no hooks.json to manage")
}

fn not_live(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no hook has the id {} in the active configuration",
            crate::config::quote(id)
        ),
    )
}

fn hook_id(id: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    id.map(|Path(id)| id)
        .map_err(|e| ApiError::bad_request(format!("bad hook id in the path: {}", e.body_text())))
}

fn required(body: Option<JsonBody>) -> Result<JsonBody, ApiError> {
    body.ok_or_else(|| ApiError::bad_request("the request body is empty; expected a JSON object"))
}

fn if_match(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get(header::IF_MATCH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.to_string()))
            .map_err(|_| ApiError::bad_request("the If-Match header is not ASCII")),
    }
}

/// `If-None-Match` names the current version (or is `*`).
fn not_modified(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

fn query_limit(uri: &Uri) -> Result<Option<usize>, ApiError> {
    let mut limit = None;
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "limit" {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {}; expected limit",
                crate::config::quote(key)
            ))
            .at(key.to_string()));
        }
        let n = value
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "limit must be a positive integer, found {}",
                    crate::config::quote(value)
                ))
                .at("limit")
            })?;
        limit = Some(n);
    }
    Ok(limit)
}

/// Warns about every hook written through the API: each one runs a command.
fn audit(caller: &Caller, what: &str, hook: &Hook) {
    let field = |k: &str| hook.json.get(k).map_or(Value::Null, Value::clone);
    tracing::warn!(
        hook = %hook.id,
        event = %hook.event,
        command = %field("command"),
        args = %field("args"),
        "hook {what} through the API by {}: it runs a command",
        caller.0
    );
}

fn hook_response(status: StatusCode, hook: &Hook) -> Response {
    with_etag(json_response(status, &hook.json), &hook.etag)
}

fn unchanged(etag: &str) -> Response {
    with_etag(StatusCode::NOT_MODIFIED.into_response(), etag)
}

fn with_etag(mut resp: Response, etag: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(etag) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}
