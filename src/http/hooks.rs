//! `/api/hooks…`: CRUD through the workspace's [`HooksEditor`], the test run and the run
//! history.
//!
//! Editor calls read, validate, write and fsync files, so they run on tokio's blocking pool,
//! never on an executor thread. A test run waits on no thread at all: it takes a slot in the
//! hook's limits ([`ShellSink::try_run_once`]; none free → 429), and its outcome is awaited;
//! if the client goes away the future is dropped and the process group is killed. A write is
//! made live with [`Hooks::apply_hooks_file`] before the response is sent: a client that gets
//! 201 can emit an event at once and the new hook sees it.
//!
//! [`ShellSink::try_run_once`]: crate::shell::ShellSink::try_run_once

use super::auth::Caller;
use super::body::{self, JsonBody, Media};
use super::error::ApiError;
use super::guard::Base;
use super::{Api, ApiState, json_response, live};
use crate::Hooks;
use crate::config::{EditError, Hook, HooksEditor, Reload, Written};
use crate::shell::{Busy, Outcome, OutcomeKind};
use axum::Extension;
use axum::body::Body;
use axum::extract::Path;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;

/// Agent and session of the events a test run sends.
const TEST_AGENT: &str = "prx-hooks";
const TEST_SESSION: &str = "http-test";

/// What `PATCH` on a hook takes (RFC 5789's `Accept-Patch`).
const ACCEPT_PATCH: &str = "application/merge-patch+json";

pub(crate) async fn list(State(api): ApiState, headers: HeaderMap) -> Result<Response, ApiError> {
    let listing = match blocking(&api, |_, ed| Ok(ed.list())).await? {
        Ok(listing) => listing,
        Err(e @ EditError::FileInvalid { .. }) => return Ok(live::list(&api.hooks, e)),
        Err(e) => return Err(e.into()),
    };
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
    let wanted = id.clone();
    let hook = match blocking(&api, move |_, ed| Ok(ed.get(&wanted))).await? {
        Ok(hook) => hook,
        Err(e @ EditError::FileInvalid { .. }) => return live::get(&api.hooks, &id, e),
        Err(e) => return Err(e.into()),
    };
    if not_modified(&headers, &hook.etag) {
        return Ok(unchanged(&hook.etag));
    }
    Ok(hook_response(StatusCode::OK, &hook, None))
}

pub(crate) async fn create(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    Extension(base): Extension<Base>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let if_match = if_match(&headers)?;
    let body = required(body::json(&api, &headers, body, Media::Json).await?)?;
    let (text, value) = (body.text, without_response_fields(body.value));
    let written = write(&api, text, move |ed| {
        ed.create_if(value, if_match.as_deref())
    })
    .await?;
    audit(&caller, "created", &written);
    let mut resp = hook_response(StatusCode::CREATED, &written.hook, Some(&written.warnings));
    if let Ok(location) =
        HeaderValue::from_str(&base.url(&format!("/api/hooks/{}", written.hook.id)))
    {
        resp.headers_mut().insert(header::LOCATION, location);
    }
    Ok(resp)
}

/// `PATCH`: an RFC 7396 merge patch (`application/merge-patch+json` or `application/json`).
/// `PUT`: the same merge patch with any JSON media type, as it always was (deprecated in
/// favour of `PATCH`; docs/http.md).
pub(crate) async fn update(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    method: Method,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let media = if method == Method::PATCH {
        Media::MergePatch
    } else {
        Media::Json
    };
    let id = hook_id(id)?;
    let if_match = if_match(&headers)?;
    let patch = required(body::json(&api, &headers, body, media).await?)?;
    let (text, value) = (patch.text, without_response_fields(patch.value));
    let written = write(&api, text, move |ed| {
        ed.update(&id, value, if_match.as_deref())
    })
    .await?;
    audit(&caller, "changed", &written);
    Ok(hook_response(
        StatusCode::OK,
        &written.hook,
        Some(&written.warnings),
    ))
}

pub(crate) async fn toggle(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let if_match = if_match(&headers)?;
    let written = write(&api, String::new(), move |ed| {
        ed.toggle(&id, if_match.as_deref())
    })
    .await?;
    let enabled = written.hook.json.get("enabled") != Some(&Value::Bool(false));
    audit(
        &caller,
        if enabled { "enabled" } else { "disabled" },
        &written,
    );
    Ok(hook_response(
        StatusCode::OK,
        &written.hook,
        Some(&written.warnings),
    ))
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
/// sample payload, and answers 200 with the outcome whatever it is. The hook's matcher is
/// honoured (a payload whose tool it does not match is `skipped`) unless `?matcher=ignore`.
/// The run counts in the hook's `max_concurrent` and the backend's `max_running`: with no slot
/// free the answer is 429 with `Retry-After`. A client that disconnects stops the run.
pub(crate) async fn test(
    State(api): ApiState,
    Extension(caller): Extension<Caller>,
    id: Result<Path<String>, PathRejection>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let honour_matcher = match super::query::pairs(&uri, &["matcher"])?.as_slice() {
        [] => true,
        [(_, v)] if v == "ignore" => false,
        [(_, v)] if v == "honour" || v == "honor" => true,
        [(_, v)] => {
            return Err(ApiError::bad_request(format!(
                "matcher must be ignore (or honour, the default), found {}",
                crate::config::quote(v)
            ))
            .at("matcher"));
        }
        _ => return Err(ApiError::bad_request("matcher is given twice").at("matcher")),
    };
    let payload = body::json(&api, &headers, body, Media::Json).await?;
    writable(&api.hooks)?;
    let shell = api.hooks.shell().ok_or_else(no_workspace)?.clone();
    let table = shell.table();
    let action = table.get(&id).ok_or_else(|| not_live(&id))?.clone();
    let text = payload
        .as_ref()
        .map_or(action.event.sample_payload(), |p: &JsonBody| &p.text);
    let record = crate::ndjson::parse_payload(action.event, text, TEST_AGENT, TEST_SESSION)
        .map_err(|e| payload_error(&e, payload.is_some().then_some(text)))?;
    let msg = crate::shell::message_from_json(
        action.event,
        &record.payload_json(),
        TEST_AGENT,
        TEST_SESSION,
        0,
    );
    // Takes a slot (the scheduler's lock; the first run also starts the runner thread) and
    // hands the run to the shell runner thread, which writes the payload file and spawns it as
    // it does every hook (ARCHITECTURE.md § HTTP API).
    let started =
        tokio::task::spawn_blocking(move || shell.try_run_once(&action, &msg, honour_matcher))
            .await
            .map_err(|e| ApiError::internal(format!("the test run's worker failed: {e}")))?;
    let run = started
        .map_err(|busy: Busy| ApiError::too_many(busy.to_string(), busy.retry_after_secs()))?;
    tracing::info!(hook = %id, "test run through the API by {}", caller.0);
    // Dropped with this future when the client disconnects: the run is then killed.
    let outcome = run.await;
    Ok(json_response(StatusCode::OK, &run_json(&outcome)))
}

/// The hook's last outcomes, newest first: `?limit=N` keeps the N newest.
pub(crate) async fn runs(
    State(api): ApiState,
    id: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Result<Response, ApiError> {
    let id = hook_id(id)?;
    let limit = match super::query::pairs(&uri, &["limit"])?.pop() {
        None => None,
        Some((_, value)) => Some(value.parse::<usize>().ok().filter(|n| *n > 0).ok_or_else(
            || {
                ApiError::bad_request(format!(
                    "limit must be a positive integer, found {}",
                    crate::config::quote(&value)
                ))
                .at("limit")
            },
        )?),
    };
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
pub(crate) fn run_json(o: &Outcome) -> Value {
    let mut v = serde_json::to_value(o).unwrap_or_else(|_| json!({}));
    if let Value::Object(m) = &mut v {
        m.insert("outcome".into(), o.kind.to_string().into());
        m.insert("ok".into(), o.kind.is_ok().into());
        let timed_out = matches!(o.kind, OutcomeKind::TimedOut { .. });
        m.insert("timed_out".into(), timed_out.into());
    }
    v
}

/// A create, update or toggle: refused while shutting down, live before it returns. Errors
/// about the request body point into `body`; the loader's warnings are logged.
async fn write(
    api: &Arc<Api>,
    body: String,
    edit: impl FnOnce(&HooksEditor) -> Result<Written, EditError> + Send + 'static,
) -> Result<Written, ApiError> {
    let written = blocking(api, move |hooks, ed| {
        writable(hooks)?;
        let written = edit(ed).map_err(|e| e.in_body(&body))?;
        go_live(hooks);
        Ok(written)
    })
    .await?;
    for warning in &written.warnings {
        tracing::warn!(hook = %written.hook.id, "hooks.json: {warning}");
    }
    Ok(written)
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

/// A test payload the event refuses (422): placed in the body when it is the body
/// (`body:LINE:COL: PATH: reason`, `PATH` relative to the body, which is the payload), else
/// about the event's own sample payload.
fn payload_error(e: &crate::ndjson::LineError, body: Option<&str>) -> ApiError {
    let path = match e.path() {
        "payload" | "" => "$",
        p => p.strip_prefix("payload.").unwrap_or(p),
    };
    match body {
        Some(body) => {
            let pos = e.column().saturating_sub(1);
            ApiError::invalid(body::in_body(body, pos, path, e.reason())).at(path)
        }
        None => ApiError::invalid(format!("the event's sample payload: {}", e.message())).at(path),
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

/// Every `If-Match` line, joined into one list (RFC 9110 § 5.3: repeated lines are one
/// comma-separated list).
fn if_match(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut all: Vec<&str> = Vec::new();
    for v in headers.get_all(header::IF_MATCH) {
        all.push(
            v.to_str()
                .map_err(|_| ApiError::bad_request("the If-Match header is not ASCII"))?,
        );
    }
    Ok((!all.is_empty()).then(|| all.join(", ")))
}

/// `If-None-Match` names the current version (or is `*`).
pub(super) fn not_modified(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == etag)
}

/// A body as a write takes it: what responses carry next to the hook's fields (`warnings`,
/// and `read_only` / `file_error` while hooks.json does not load) is dropped, so a response
/// can be sent back as it came.
fn without_response_fields(mut body: Value) -> Value {
    if let Value::Object(m) = &mut body {
        for k in ["warnings", "read_only", "file_error"] {
            m.remove(k);
        }
    }
    body
}

/// Warns about every hook written through the API: each one runs a command.
fn audit(caller: &Caller, what: &str, written: &Written) {
    let hook = &written.hook;
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

/// The hook with its ETag; write responses add the loader's `warnings` about it.
fn hook_response(status: StatusCode, hook: &Hook, warnings: Option<&[String]>) -> Response {
    let mut resp = match warnings {
        None => json_response(status, &hook.json),
        Some(w) => {
            let mut body = hook.json.clone();
            if let Value::Object(m) = &mut body {
                m.insert("warnings".into(), json!(w));
            }
            json_response(status, &body)
        }
    };
    resp.headers_mut()
        .insert("accept-patch", HeaderValue::from_static(ACCEPT_PATCH));
    with_etag(resp, &hook.etag)
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
