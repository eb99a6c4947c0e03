//! Differential test of the strict JSON compactor (`json::append_compact` and its checking
//! forms) against serde_json and against the compactor it replaced (`fuzz/src/former_json.rs`).
//! Every input is tried with both `Top::Any` and `Top::Object`, appending to a non-empty buffer.
//!
//! Against serde_json (the reference reader):
//!
//! * `true`: the buffer's old contents are untouched; the appended bytes are `src` minus the
//!   whitespace outside strings, byte for byte (so: no whitespace outside strings, number
//!   spellings and member order kept); they nest at most 127 deep; serde_json reads them as the
//!   same `Value` it reads from `src` — or rejects both only for a number out of `f64` range.
//! * `false`: the buffer is exactly as it was, and serde_json rejects `src` too (or, for
//!   `Top::Object`, `src` is not an object).
//! * whenever serde_json accepts `src` (which implies depth ≤ 127 and valid UTF-8),
//!   `Top::Any` returns `true`, and `Top::Object` returns `true` exactly when it is an object.
//!   No exception is needed for lone surrogate escapes: serde_json refuses them when parsing
//!   into a `Value`, as the strict validator does (see `fuzz/src/lib.rs`).
//!
//! Against the former compactor, at nesting limits 127, 125 and 1: the same verdict and bytes
//! from `append_compact_within` (and from `append_compact_str` when `src` is UTF-8); the same
//! `Refused` (offset and reason) from `check_value` and `check_object`, whose key visitor
//! refuses a repeated key and the key `stop`; and, when `src` is UTF-8, the same keys visited
//! in the same order (for a text that is not UTF-8 the former one visited none: it checked the
//! whole text first).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::__private::json::{
    MAX_DEPTH, Top, append_compact, append_compact_str, append_compact_within, check_object,
    check_value,
};
use prx_hooks_fuzz::former_json;
use prx_hooks_fuzz::{Serde, depth, first_non_ws, has_ws_outside_strings, parse, strip_ws};

const PREFIX: &[u8] = b"{\"prefix\":";

fuzz_target!(|src: &[u8]| {
    let reference = parse(src);
    let any = check(src, Top::Any, &reference);
    let object = check(src, Top::Object, &reference);
    match &reference {
        Serde::Ok(v) => {
            assert!(
                any.is_some(),
                "serde_json accepts {v:?} but append_compact(Any) refuses {src:?}"
            );
            assert_eq!(object.is_some(), v.is_object(), "Top::Object on {src:?}");
        }
        Serde::OutOfRange | Serde::Rejected(_) => {}
    }
    // Object is Any restricted to objects, with the same output.
    match (&any, &object) {
        (Some(a), Some(o)) => assert_eq!(a, o),
        (Some(_), None) => assert_ne!(first_non_ws(src), Some(b'{'), "{src:?}"),
        (None, Some(_)) => panic!("Top::Object accepts what Top::Any refuses: {src:?}"),
        (None, None) => {}
    }
    for max_depth in [MAX_DEPTH, MAX_DEPTH - 2, 1] {
        against_former(src, max_depth);
    }
});

/// Runs `append_compact` and checks its contract; returns the appended bytes when it accepted.
fn check(src: &[u8], top: Top, reference: &Serde) -> Option<Vec<u8>> {
    let mut out = PREFIX.to_vec();
    let ok = append_compact(&mut out, src, top);
    assert_eq!(
        &out[..PREFIX.len().min(out.len())],
        PREFIX,
        "the old contents were changed"
    );
    if !ok {
        assert_eq!(
            out, PREFIX,
            "a refused input must leave the buffer as it was ({top:?}, {src:?})"
        );
        if let Serde::Ok(v) = reference {
            let is_object_mismatch = top == Top::Object && !v.is_object();
            assert!(
                is_object_mismatch,
                "{top:?} refuses {src:?}, which serde_json reads as {v:?}"
            );
        }
        return None;
    }
    let compact = out[PREFIX.len()..].to_vec();
    assert!(
        !has_ws_outside_strings(&compact),
        "whitespace left in {compact:?}"
    );
    assert_eq!(compact, strip_ws(src), "{top:?} on {src:?}");
    assert!(
        depth(src) <= 127,
        "accepted {} levels of nesting",
        depth(src)
    );
    if top == Top::Object {
        assert_eq!(first_non_ws(src), Some(b'{'));
    }
    match reference {
        Serde::Ok(v) => assert_eq!(parse(&compact).value(), Some(v), "{src:?} -> {compact:?}"),
        Serde::OutOfRange => assert!(matches!(parse(&compact), Serde::OutOfRange), "{compact:?}"),
        Serde::Rejected(e) => panic!("{top:?} accepts {src:?}, serde_json says: {e}"),
    }
    Some(compact)
}

/// The library and the former compactor agree on everything observable.
fn against_former(src: &[u8], max_depth: u32) {
    let text = std::str::from_utf8(src).ok();
    for (top, object_only) in [(Top::Any, false), (Top::Object, true)] {
        let (mut new, mut old) = (PREFIX.to_vec(), PREFIX.to_vec());
        let new_ok = append_compact_within(&mut new, src, top, max_depth);
        let old_ok = former_json::append_compact_within(&mut old, src, object_only, max_depth);
        assert_eq!(
            (new_ok, &new),
            (old_ok, &old),
            "append_compact_within({top:?}, {max_depth}) on {src:?}"
        );
        if let Some(text) = text {
            let mut from_str = PREFIX.to_vec();
            let ok = append_compact_str(&mut from_str, text, top, max_depth);
            assert_eq!(
                (ok, &from_str),
                (old_ok, &old),
                "append_compact_str on {src:?}"
            );
        }
    }
    let new = check_value(src, max_depth).map_err(|r| (r.at, r.reason));
    let old = former_json::run(src, false, max_depth, None, None).map_err(|r| (r.at, r.reason));
    assert_eq!(new, old, "check_value({max_depth}) on {src:?}");

    // A visitor like `Extras::check`'s: refuses a repeated key, and one named `stop`.
    fn visitor(seen: &mut Vec<String>) -> impl FnMut(&str) -> Result<(), String> + '_ {
        move |k: &str| {
            let verdict = if k == "stop" {
                Err("no stop".to_string())
            } else if seen.iter().any(|s| s == k) {
                Err(format!("{k} twice"))
            } else {
                Ok(())
            };
            seen.push(k.to_string());
            verdict
        }
    }
    let (mut new_keys, mut old_keys) = (Vec::new(), Vec::new());
    let new =
        check_object(src, max_depth, &mut visitor(&mut new_keys)).map_err(|r| (r.at, r.reason));
    let old = former_json::run(
        src,
        true,
        max_depth,
        None,
        Some(&mut visitor(&mut old_keys)),
    )
    .map_err(|r| (r.at, r.reason));
    assert_eq!(new, old, "check_object({max_depth}) on {src:?}");
    if text.is_some() {
        assert_eq!(new_keys, old_keys, "keys visited in {src:?}");
    }
}
