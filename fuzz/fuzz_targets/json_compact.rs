//! Differential test of the strict JSON compactor (`json::append_compact`) against serde_json.
//! Every input is tried with both `Top::Any` and `Top::Object`, appending to a non-empty buffer.
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
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::__fuzz::{Top, append_compact};
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
