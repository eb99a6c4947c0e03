//! Reading request bodies: size limit, idle timeout and media type here, then the editor's
//! strict JSON reader ([`crate::config::parse_body`]: UTF-8, syntax with line/column/path,
//! duplicate keys). Each failure becomes the API's JSON error (axum's extractors would answer
//! in plain text), and every error about a place in a body reads the same, `body:LINE:COL:
//! PATH: reason` ([`in_body`]; the editor's validation errors come that way already,
//! `EditError::in_body`).

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
    /// `POST /api/events`: NDJSON (`application/x-ndjson`, `application/ndjson`,
    /// `application/jsonl`) or `application/json`.
    Ndjson,
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
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let bytes = e.as_bytes();
            let valid = e.utf8_error().valid_up_to();
            // The valid prefix is text: the place is counted in it.
            let prefix = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
            let (line, col) = locate(prefix, valid);
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_json",
                format!(
                    "body:{line}:{col}: $: not UTF-8: invalid byte 0x{:02x}",
                    bytes[valid]
                ),
            )
            .at("$"));
        }
    };
    let value = crate::config::parse_body(text.as_bytes()).map_err(placed)?;
    Ok(value.map(|value| JsonBody { value, text }))
}

/// The body's bytes, at most `limit` of them (413 past it), in the media type `media` (415
/// otherwise; an empty body needs none): what the ingest routes read, parsing it themselves.
pub(crate) async fn raw(
    api: &Api,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    media: Media,
) -> Result<Vec<u8>, ApiError> {
    let read = Reader {
        limit,
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
    if !bytes.is_empty() {
        check_media_type(headers, media)?;
    }
    Ok(bytes)
}

/// `reason` about the place at byte `pos` of `body`, as every error about a place in a body
/// reads: `body:LINE:COL: PATH: reason` (`$`: the body itself).
pub(crate) fn in_body(body: &str, pos: usize, path: &str, reason: &str) -> String {
    let (line, col) = locate(body, pos);
    let path = if path.is_empty() { "$" } else { path };
    format!("body:{line}:{col}: {path}: {reason}")
}

/// Byte offset → 1-based line (LF-separated) and character column, as the editor counts them
/// (a leading byte order mark is not a column).
fn locate(text: &str, pos: usize) -> (usize, usize) {
    let (line, col) = crate::text::line_col(text, pos);
    if line == 1 && col > 1 && text.starts_with('\u{feff}') {
        return (line, col - 1);
    }
    (line, col)
}

/// The strict reader's errors that name a line and column (`invalid JSON at line L column C:
/// …`, `duplicate key at line L column C: …`) in the `body:LINE:COL: PATH: reason` form.
fn placed(e: crate::config::EditError) -> ApiError {
    let mut api = ApiError::from(e);
    for what in ["invalid JSON", "duplicate key"] {
        let Some(rest) = api
            .error
            .strip_prefix(what)
            .and_then(|r| r.strip_prefix(" at line "))
        else {
            continue;
        };
        let place = rest.split_once(" column ").and_then(|(line, rest)| {
            let (col, reason) = rest.split_once(": ")?;
            Some((
                line.parse::<usize>().ok()?,
                col.parse::<usize>().ok()?,
                reason,
            ))
        });
        if let Some((line, col, reason)) = place {
            let path = if api.path.is_empty() { "$" } else { &api.path };
            api.error = format!("body:{line}:{col}: {path}: {what}: {reason}");
        }
        break;
    }
    api
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
            Media::Ndjson => {
                "NDJSON (one event per line) sent as \"Content-Type: application/x-ndjson\" \
                 (or application/json)"
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
        Media::Ndjson => matches!(
            essence.as_str(),
            "application/x-ndjson"
                | "application/ndjson"
                | "application/jsonl"
                | "application/json"
        ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EditError;

    #[test]
    fn places_are_lines_and_character_columns() {
        let text = "{\n  \"é\": 7\n}";
        assert_eq!(locate(text, 0), (1, 1));
        assert_eq!(locate(text, 2), (2, 1));
        assert_eq!(locate(text, text.find('7').unwrap()), (2, 8));
        assert_eq!(locate(text, 999), (3, 2));
        assert_eq!(locate("\u{feff}ab", 4), (1, 2));
        assert_eq!(in_body(text, 0, "", "r"), "body:1:1: $: r");
    }

    #[test]
    fn the_readers_placed_errors_read_body_line_col_path_reason() {
        let e = placed(EditError::Malformed {
            error: "invalid JSON at line 2 column 13: expected a value".into(),
            path: "command".into(),
        });
        assert_eq!(
            (e.error.as_str(), e.path.as_str(), e.kind),
            (
                "body:2:13: command: invalid JSON: expected a value",
                "command",
                "bad_json"
            )
        );
        let e = placed(EditError::Invalid {
            error: "duplicate key at line 1 column 9: every key may appear once".into(),
            path: String::new(),
        });
        assert_eq!(
            e.error,
            "body:1:9: $: duplicate key: every key may appear once"
        );
        // Without a place, as it was.
        let e = placed(EditError::Malformed {
            error: "invalid JSON: eof".into(),
            path: String::new(),
        });
        assert_eq!(e.error, "invalid JSON: eof");
    }
}
