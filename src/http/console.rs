//! The console page at `/` (docs/http.md § Console page; ARCHITECTURE.md § Console page): one
//! HTML page, its script, its style sheet and its icon, embedded in the binary with
//! `include_str!` / `include_bytes!`, so the page needs no build step, no network and no file
//! on disk.
//!
//! These four files are the only routes served without the token: they hold no data. The
//! page asks for the token in a login field, keeps it in `sessionStorage` and sends it in the
//! `Authorization` header of every API call it makes (never in a URL); it reads the live
//! stream with `fetch` and its own SSE parser, since `EventSource` cannot send a header.
//!
//! The page shows text that agents, LLMs and hook processes control (tool names, outputs,
//! stderr, topics), and the token it holds can create hooks, which run commands: an XSS would
//! be a remote code execution. So every response of the page carries
//!
//! * a Content-Security-Policy that allows only this origin's own script, style, images and
//!   connections (`default-src 'self'`; no inline script or style, no `eval`), no plugins, no
//!   `<base>`, no form submission, no framing, and Trusted Types enforcement, under which an
//!   `innerHTML` assignment of a string throws (the script inserts text with `textContent`
//!   only; the policy makes a slip fail loudly rather than parse data as markup);
//! * `X-Frame-Options: DENY` (with `frame-ancestors 'none'`), `X-Content-Type-Options:
//!   nosniff`, `Referrer-Policy: no-referrer`, `Cross-Origin-Opener-Policy` and
//!   `Cross-Origin-Resource-Policy: same-origin`;
//! * its exact content type, a strong `ETag` (a hash of the embedded bytes, computed at
//!   compile time) and `Cache-Control: no-cache`: the browser revalidates every load
//!   (`If-None-Match` → 304), so a new binary's page is never mixed with an old script.
//!
//! The `Host` / `Origin` check runs before these routes as before every other one.

use super::routes::{Table, get};
use axum::extract::OriginalUri;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The policy of every console response (the module's doc says why each part is there).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; font-src 'none'; object-src 'none'; \
     media-src 'none'; worker-src 'none'; manifest-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-src 'none'; frame-ancestors 'none'; \
     require-trusted-types-for 'script'; trusted-types 'none'";

/// One embedded file.
struct Asset {
    bytes: &'static [u8],
    content_type: &'static str,
    /// Quoted, strong: the FNV-1a hash of `bytes`.
    etag: &'static str,
}

/// FNV-1a, 64 bits: a content hash for the ETag, evaluated at compile time.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// `"<16 hex digits>"` of `bytes`, at compile time.
const fn etag_of(bytes: &[u8]) -> [u8; 18] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let h = fnv1a(bytes);
    let mut out = [b'"'; 18];
    let mut i = 0;
    while i < 16 {
        out[1 + i] = HEX[((h >> (60 - 4 * i)) & 0xf) as usize];
        i += 1;
    }
    out
}

macro_rules! asset {
    ($name:ident, $file:literal, $type:literal) => {
        static $name: Asset = {
            const BYTES: &[u8] = include_bytes!(concat!("console/", $file));
            const TAG: [u8; 18] = etag_of(BYTES);
            Asset {
                bytes: BYTES,
                content_type: $type,
                etag: match std::str::from_utf8(&TAG) {
                    Ok(s) => s,
                    Err(_) => panic!("an ETag is ASCII"),
                },
            }
        };
    };
}

asset!(INDEX, "index.html", "text/html; charset=utf-8");
asset!(SCRIPT, "console.js", "text/javascript; charset=utf-8");
asset!(STYLE, "console.css", "text/css; charset=utf-8");
asset!(ICON, "icon.svg", "image/svg+xml");

/// The paths served without the token (and the page's own URLs, relative to where the API is
/// mounted).
pub const PUBLIC_PATHS: [&str; 4] = [
    "/",
    "/console/console.js",
    "/console/console.css",
    "/console/icon.svg",
];

/// The console's routes, merged outside the token check (see [`PUBLIC_PATHS`]).
pub(crate) fn routes() -> Table {
    Table::new()
        .route("/", get(index))
        .route("/console/console.js", get(script))
        .route("/console/console.css", get(style))
        .route("/console/icon.svg", get(icon))
}

/// The page. At the root its relative URLs (`console/console.js`) resolve under `/`. Nested
/// under a prefix (`nest("/prx", …)`), axum routes it at `/prx`, without a slash, where a
/// relative URL would resolve under `/`: that copy names its files under the prefix's last
/// segment (`prx/console/console.js`), and the script finds the API relative to its own URL.
async fn index(OriginalUri(original): OriginalUri, headers: HeaderMap) -> Response {
    let path = original.path();
    let segment = path.rsplit('/').next().unwrap_or("");
    let nested = !segment.is_empty()
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    if !nested {
        return serve(&INDEX, &headers);
    }
    let html = std::str::from_utf8(INDEX.bytes)
        .unwrap_or_default()
        .replace("\"console/", &format!("\"{segment}/console/"));
    let etag = format!("{}-{segment}\"", &INDEX.etag[..INDEX.etag.len() - 1]);
    respond(
        INDEX.content_type,
        html.into_bytes().into(),
        &etag,
        &headers,
    )
}

async fn script(headers: HeaderMap) -> Response {
    serve(&SCRIPT, &headers)
}

async fn style(headers: HeaderMap) -> Response {
    serve(&STYLE, &headers)
}

async fn icon(headers: HeaderMap) -> Response {
    serve(&ICON, &headers)
}

fn serve(asset: &'static Asset, headers: &HeaderMap) -> Response {
    respond(asset.content_type, asset.bytes.into(), asset.etag, headers)
}

fn respond(
    content_type: &'static str,
    body: std::borrow::Cow<'static, [u8]>,
    etag: &str,
    headers: &HeaderMap,
) -> Response {
    let mut resp = if super::hooks::not_modified(headers, etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body,
        )
            .into_response()
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secure(&mut resp);
    resp
}

/// The security headers of every console response.
fn secure(resp: &mut Response) {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_quoted_hex_hashes_of_the_content() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(&etag_of(b"a"), b"\"af63dc4c8601ec8c\"");
        let tags = [INDEX.etag, SCRIPT.etag, STYLE.etag, ICON.etag];
        for (i, t) in tags.iter().enumerate() {
            assert_eq!(t.len(), 18);
            assert!(tags[i + 1..].iter().all(|o| o != t));
        }
    }

    /// The page itself obeys its policy: no inline script, style or event handler, and every
    /// script and style sheet is one of ours.
    #[test]
    fn the_page_has_no_inline_script_or_style() {
        let html = std::str::from_utf8(INDEX.bytes)
            .unwrap()
            .to_ascii_lowercase();
        assert!(!html.contains("<style"), "inline <style>");
        assert!(!html.contains(" style="), "a style attribute");
        assert!(!html.contains("javascript:"));
        for (i, _) in html.match_indices("<script") {
            let tag = &html[i..i + html[i..].find('>').unwrap()];
            assert!(tag.contains("src=\"console/console.js\""), "{tag}");
        }
        for attr in html.split_whitespace() {
            assert!(
                !(attr.starts_with("on") && attr.contains('=')),
                "an inline event handler: {attr}"
            );
        }
        let js = std::str::from_utf8(SCRIPT.bytes).unwrap();
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ] {
            assert!(!js.contains(sink), "console.js uses {sink}");
        }
    }
}
