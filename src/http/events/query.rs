//! A stream's request: its query (`pattern`, `kinds`, `backlog`) and its `Last-Event-ID`,
//! read strictly (ARCHITECTURE.md § The live stream).

use super::*;

/// Where a new stream starts.
pub(super) enum Start {
    /// From now.
    Live,
    /// With the last N matching items of the backlog (`?backlog=N`).
    Backlog(usize),
    /// After the item a `Last-Event-ID` names.
    Resume(LastId),
}

pub(super) enum LastId {
    /// One of ours: its position.
    Ours(u64),
    /// Another instance's (a restarted or another server), as given.
    Other(String),
}

/// `GET /api/events`.
pub(crate) async fn stream(
    State(api): ApiState,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (filter, mut start, query_id) = parse_query(&uri)?;
    let header_id = match headers.get("last-event-id") {
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::bad_request("Last-Event-ID is not ASCII; send back an id: the stream sent")
                .at("Last-Event-ID")
        })?),
        None => None,
    };
    // The header (what EventSource sends when it reconnects) wins over the query.
    if let Some(text) = header_id.map(str::to_string).or(query_id) {
        let text = text.trim();
        // An empty id is what a client sends that saw no id yet: a fresh start.
        if !text.is_empty() {
            start = Start::Resume(parse_last_id(text, &api.events.0.instance)?);
        }
    }
    let body = api
        .events
        .0
        .open(&api.hooks, filter, start)
        .map_err(|r| match r {
            Refused::Closed => ApiError::unavailable(
                "the hook system is shutting down; the event stream is closed",
            ),
            Refused::Full(cap) => ApiError::too_many(
                format!(
                    "{cap} event streams are open, the cap (EventStreamOptions::max_streams, at \
                     most half the server's connection cap); close one and retry"
                ),
                5,
            ),
        })?;
    let mut resp = Body::new(body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx buffers responses unless told not to.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    *resp.status_mut() = StatusCode::OK;
    Ok(resp)
}

/// `pattern` (repeatable), `kinds`, `backlog`, `last_event_id`.
pub(super) fn parse_query(uri: &Uri) -> Result<(Filter, Start, Option<String>), ApiError> {
    let mut patterns = Vec::new();
    let mut kinds: Option<(bool, bool, bool)> = None;
    let mut start = Start::Live;
    let mut last_id = None;
    let known = ["pattern", "kinds", "backlog", "last_event_id"];
    for (key, value) in super::super::query::pairs(uri, &known)? {
        let value = value.trim();
        match key {
            "pattern" => {
                let p = Pattern::parse(value)
                    .map_err(|e| ApiError::bad_request(format!("pattern: {e}")).at("pattern"))?;
                patterns.push(p);
            }
            "kinds" => {
                let mut k = (false, false, false);
                for kind in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match kind {
                        "bus" => k.0 = true,
                        "runs" => k.1 = true,
                        "plugins" => k.2 = true,
                        other => {
                            let hint = crate::suggest(other, &["bus", "runs", "plugins"])
                                .map(|s| format!("; did you mean {s:?}?"))
                                .unwrap_or_default();
                            return Err(ApiError::bad_request(format!(
                                "kinds: unknown kind {other:?}{hint} (a comma-separated list of \
                                 bus, runs, plugins)"
                            ))
                            .at("kinds"));
                        }
                    }
                }
                if k == (false, false, false) {
                    return Err(ApiError::bad_request(
                        "kinds: empty; give one or more of bus, runs, plugins",
                    )
                    .at("kinds"));
                }
                kinds = Some(k);
            }
            "backlog" => {
                let n: usize = value.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "backlog: expected a number of items, found {value:?}"
                    ))
                    .at("backlog")
                })?;
                start = Start::Backlog(n);
            }
            // For clients that cannot set headers; parsed in `stream`, like the header.
            "last_event_id" => last_id = Some(value.to_string()),
            _ => unreachable!("pairs() returns known keys only"),
        }
    }
    // A pattern names bus topics, so given alone it asks for bus messages only (runs and
    // plugin counts have no topic it could match); `kinds` widens it.
    let (bus, runs, plugins) = kinds.unwrap_or(if patterns.is_empty() {
        (true, true, true)
    } else {
        (true, false, false)
    });
    if !patterns.is_empty() && !bus {
        return Err(ApiError::bad_request(
            "pattern filters bus messages, but kinds leaves out bus; add bus to kinds or drop \
             the pattern",
        )
        .at("pattern"));
    }
    if patterns.is_empty() {
        patterns.push(Pattern::All);
    }
    let filter = Filter {
        bus: bus.then_some(patterns),
        runs,
        plugins,
    };
    Ok((filter, start, last_id))
}

/// `<instance>-<n>`: one of ours (same instance, a number) or another instance's. `n` is
/// digits only, without a leading zero (as the stream writes it; `query::decimal`), so one id
/// has one spelling: `+3`, `03` or ` 3` are refused, never read as 3.
pub(super) fn parse_last_id(text: &str, instance: &str) -> Result<LastId, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "Last-Event-ID {}: expected <instance>-<n>, an id: this stream sent (like \
             {instance}-42)",
            crate::config::quote(text)
        ))
        .at("Last-Event-ID")
    };
    let (inst, n) = text.rsplit_once('-').ok_or_else(bad)?;
    let n = super::super::query::decimal(n).ok_or_else(bad)?;
    if inst.is_empty() || !inst.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(bad());
    }
    Ok(if inst == instance {
        LastId::Ours(n)
    } else {
        LastId::Other(text.to_string())
    })
}
