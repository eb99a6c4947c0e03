//! Query strings: `key=value` pairs split, percent-decoded and checked against the keys a
//! route knows, for every route that takes a query (`/api/hooks/{id}/test`, `…/runs`,
//! `/api/events`). An unknown key or a value that is not UTF-8 is a 400 naming the key.

use super::error::ApiError;
use axum::http::Uri;

/// The query's pairs in order, values percent-decoded; each key must be one of `known`.
pub(crate) fn pairs<'u>(uri: &'u Uri, known: &[&str]) -> Result<Vec<(&'u str, String)>, ApiError> {
    let mut out = Vec::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&key) {
            let hint = crate::suggest(key, known)
                .map(|s| format!("; did you mean {s:?}?"))
                .unwrap_or_default();
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {}{hint}; expected {}",
                crate::config::quote(key),
                known.join(", ")
            ))
            .at(key.to_string()));
        }
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| ApiError::bad_request(format!("{key}: not UTF-8")).at(key.to_string()))?;
        out.push((key, value.into_owned()));
    }
    Ok(out)
}
