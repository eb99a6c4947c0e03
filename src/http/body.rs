//! Reading request bodies: size limit, media type, UTF-8, strict JSON. Each failure becomes
//! the API's JSON error (axum's extractors would answer in plain text).
//!
//! JSON is read twice: by the configuration's strict reader, which knows the line, column and
//! path of a syntax error and reports duplicate keys (serde_json keeps the last one silently),
//! then by serde_json into a `Value` (both accept exactly the same texts).

use super::error::ApiError;
use crate::config::{Lines, spanned};
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
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    check_media_type(headers)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not UTF-8: invalid byte at offset {}",
            e.utf8_error().valid_up_to()
        ))
    })?;
    let parsed = spanned::parse(&text);
    let lines = Lines::new(&text);
    if let Err(e) = parsed.root {
        let (line, col) = lines.locate(e.pos);
        return Err(ApiError::bad_request(format!(
            "invalid JSON at line {line} column {col}: {}",
            e.reason
        ))
        .at(path_or_empty(&e.path)));
    }
    if let Some(d) = parsed.duplicates.first() {
        let (line, col) = lines.locate(d.pos);
        return Err(ApiError::invalid(format!(
            "duplicate key at line {line} column {col}: every key may appear once in an object"
        ))
        .at(path_or_empty(&d.path)));
    }
    let value = serde_json::from_str(&text)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    Ok(Some(JsonBody { value, text }))
}

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
        return Err(too_large());
    }
    let mut buf = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("could not read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
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

fn path_or_empty(path: &crate::config::JsonPath) -> String {
    let p = path.to_string();
    if p == "$" { String::new() } else { p }
}
