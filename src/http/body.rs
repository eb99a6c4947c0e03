//! Reading request bodies: size limit, idle timeout and media type here, then the editor's
//! strict JSON reader ([`crate::config::parse_body`]: UTF-8, syntax with line/column/path,
//! duplicate keys). Each failure becomes the API's JSON error (axum's extractors would answer
//! in plain text).

use super::Api;
use super::error::ApiError;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a route takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Media {
    /// `application/json` or `application/<something>+json`.
    Json,
    /// `PATCH`: `application/merge-patch+json` (RFC 7396) or `application/json`.
    MergePatch,
}

/// A parsed JSON body and its text.
pub(crate) struct JsonBody {
    pub value: Value,
    pub text: String,
}

/// Reads the body as JSON. An empty body is `None` (the caller decides whether it may be).
pub(crate) async fn json(
    api: &Api,
    headers: &HeaderMap,
    body: Body,
    media: Media,
) -> Result<Option<JsonBody>, ApiError> {
    let read = Reader {
        limit: api.opts.max_body_bytes,
        idle: api.opts.idle_timeout,
    };
    let bytes = match read.limited(headers, body).await {
        Err(e) if e.status == StatusCode::REQUEST_TIMEOUT => {
            if let Some(c) = &api.conns {
                c.body_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
        r => r?,
    };
    // An empty body needs no Content-Type (`POST …/test` without a payload).
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    check_media_type(headers, media)?;
    let value = crate::config::parse_body(&bytes)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| ApiError::internal("a body read as JSON is not UTF-8"))?;
    Ok(value.map(|value| JsonBody { value, text }))
}

/// Of a body over the limit, up to this much more is read and thrown away before the 413 is
/// sent, so that a client that writes its whole body before reading (most do) gets the 413
/// instead of a broken pipe. Larger bodies are answered at once and the connection closed.
const DRAIN_BYTES: u64 = 1 << 20;

struct Reader {
    limit: usize,
    idle: Duration,
}

impl Reader {
    /// The body's bytes, refusing more than `limit` (413) whether or not a Content-Length says so,
    /// and a body that sends nothing for `idle` (408).
    async fn limited(&self, headers: &HeaderMap, mut body: Body) -> Result<Vec<u8>, ApiError> {
        let limit = self.limit;
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
                self.drain(&mut body, DRAIN_BYTES + limit as u64).await;
            }
            return Err(too_large());
        }
        let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
        while let Some(data) = self.next(&mut body).await? {
            if buf.len() + data.len() > limit {
                self.drain(&mut body, DRAIN_BYTES).await;
                return Err(too_large());
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf)
    }

    /// The next data frame (trailers are skipped), `None` at the end; 408 after `idle` of silence.
    async fn next(&self, body: &mut Body) -> Result<Option<Bytes>, ApiError> {
        loop {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx));
            let frame = tokio::time::timeout(self.idle, frame).await.map_err(|_| {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request body stalled: nothing arrived for {:?}; nothing was changed",
                        self.idle
                    ),
                )
            })?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(ApiError::bad_request(format!(
                        "could not read the request body: {e}"
                    )));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// Reads and discards at most about `max` more bytes of the body (stopping at a stall).
    async fn drain(&self, body: &mut Body, max: u64) {
        let mut seen = 0u64;
        while seen <= max {
            match self.next(body).await {
                Ok(Some(data)) => seen += data.len() as u64,
                _ => return,
            }
        }
    }
}

/// `application/json` or `application/<something>+json` (for `PATCH`: a merge patch),
/// optionally with `charset=utf-8`.
fn check_media_type(headers: &HeaderMap, media: Media) -> Result<(), ApiError> {
    let unsupported = |found: &str| {
        let expected = match media {
            Media::Json => "JSON sent as \"Content-Type: application/json\"",
            Media::MergePatch => {
                "a JSON merge patch (RFC 7396) sent as \"Content-Type: \
                 application/merge-patch+json\" (or application/json); JSON Patch (RFC 6902) is \
                 not supported"
            }
        };
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("the body must be {expected}; found {found}"),
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
    let json = match media {
        Media::Json => {
            essence == "application/json"
                || (essence.starts_with("application/") && essence.ends_with("+json"))
        }
        Media::MergePatch => {
            essence == "application/json" || essence == "application/merge-patch+json"
        }
    };
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
