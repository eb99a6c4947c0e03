//! Reading request bodies: size limit and media type here, then the editor's strict JSON
//! reader ([`crate::config::parse_body`]: UTF-8, syntax with line/column/path, duplicate keys).
//! Each failure becomes the API's JSON error (axum's extractors would answer in plain text).

use super::error::ApiError;
use axum::body::{Body, HttpBody};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value;
use std::pin::Pin;

/// A parsed JSON body and its text.
pub(crate) struct JsonBody {
    pub value: Value,
    pub text: String,
}

/// Reads the body as JSON. An empty body is `None` (the caller decides whether it may be).
pub(crate) async fn json(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Option<JsonBody>, ApiError> {
    let bytes = read_limited(headers, body, limit).await?;
    // An empty body needs no Content-Type (`POST …/test` without a payload).
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    check_media_type(headers)?;
    let value = crate::config::parse_body(&bytes)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| ApiError::internal("a body read as JSON is not UTF-8"))?;
    Ok(value.map(|value| JsonBody { value, text }))
}

/// Of a body over the limit, up to this much more is read and thrown away before the 413 is
/// sent, so that a client that writes its whole body before reading (most do) gets the 413
/// instead of a broken pipe. Larger bodies are answered at once and the connection closed.
const DRAIN_BYTES: u64 = 1 << 20;

/// The body's bytes, refusing more than `limit` (413) whether or not a Content-Length says so.
async fn read_limited(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        if declared.is_some_and(|n| n <= limit as u64 + DRAIN_BYTES) {
            drain(&mut body, DRAIN_BYTES + limit as u64).await;
        }
        return Err(too_large());
    }
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                drain(&mut body, DRAIN_BYTES).await;
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

/// Reads and discards at most about `max` more bytes of the body.
async fn drain(body: &mut Body, max: u64) {
    let mut seen = 0u64;
    while seen <= max {
        match std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => return,
        }
    }
}

/// `application/json` or `application/<something>+json`, optionally with `charset=utf-8`.
fn check_media_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let unsupported = |found: &str| {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body must be JSON sent as \"Content-Type: application/json\"; found {found}"
            ),
        )
    };
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(unsupported("no Content-Type"));
    };
    let Ok(value) = value.to_str() else {
        return Err(unsupported("a Content-Type that is not ASCII"));
    };
    let mut parts = value.split(';').map(str::trim);
    let essence = parts.next().unwrap_or("").to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    let utf8 = parts.all(|p| match p.split_once('=') {
        Some((k, v)) if k.trim().eq_ignore_ascii_case("charset") => {
            v.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    if json && utf8 {
        Ok(())
    } else {
        Err(unsupported(&format!("{value:?}")))
    }
}
