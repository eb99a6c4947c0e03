//! Query strings: `key=value` pairs split, percent-decoded and checked against the keys a
//! route knows, for every route that takes a query (`/api/hooks/{id}/test`, `…/runs`,
//! `/api/events`). An unknown key or a value that is not UTF-8 is a 400 naming the key. Also
//! the one reader of decimal numbers in headers ([`decimal`]).

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

/// A number as a header or an id writes it, parsed strictly: ASCII digits only (no sign, no
/// space, no `0x`, no exponent), no leading zero (`0` itself is fine: `00`, `080` are not one
/// spelling of a number but another string), and within `u64`. `Host` ports
/// (`guard.rs`, also 1..=65535) and `Last-Event-ID` positions (`events.rs`) are read with it.
///
/// `str::parse::<u64>` takes `+3` for 3, which let `<instance>-+3` resume as position 3.
pub(crate) fn decimal(s: &str) -> Option<u64> {
    let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::decimal;

    #[test]
    fn decimals_are_digits_without_a_leading_zero_within_u64() {
        for (s, n) in [
            ("0", 0),
            ("7", 7),
            ("65535", 65535),
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(decimal(s), Some(n), "{s:?}");
        }
        for s in [
            "",
            "+3",
            "-3",
            " 3",
            "3 ",
            "03",
            "00",
            "3.0",
            "0x3",
            "3e0",
            "\u{ff13}",
            "18446744073709551616",
        ] {
            assert_eq!(decimal(s), None, "{s:?}");
        }
    }
}
