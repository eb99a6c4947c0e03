//! Differential test: the simd-json path against serde_json, over arbitrary bytes.
//!
//! 1. **Payload strings** (what the library uses simd-json for): `json::write_str` escapes
//!    strings of 32 bytes or more with simd-json's SIMD writer and shorter ones with our own
//!    scan. For the input as text (lossy UTF-8), padded to cross the threshold and cut below it,
//!    every path must write exactly serde_json's bytes.
//! 2. **Parsing** (what the library does *not* use simd-json for, and why — `src/ndjson.rs`):
//!    serde_json and simd-json must agree on accept/reject and, when both accept, on the value,
//!    except for the known differences, each modelled here:
//!    * numbers: simd-json refuses integers beyond 64 bits and finite values beyond `f64`
//!      (`1e400`) that serde_json reads as floats or refuses as out of range, and it may round
//!      floats differently in the last place; numbers compare as `f64` with a relative margin;
//!    * nesting: serde_json stops at 128 levels, simd-json goes deeper;
//!    * `\u` escapes of lone surrogates: serde_json refuses them in a `Value`.
//!    Any other disagreement is a finding.
//! 3. **The compactor** (`json::append_compact`, whose strings are scanned with SSE2) against
//!    simd-json as a second reader: what the compactor accepts, simd-json reads as the same
//!    value as from the compacted text, short of the known differences above; what simd-json
//!    accepts, the compactor accepts unless the text holds a lone surrogate escape (which the
//!    compactor refuses and simd-json lets through) or nests past 127.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks_fuzz::depth;
use serde_json::Value;

fuzz_target!(|src: &[u8]| {
    strings(src);
    parsing(src);
    compactor(src);
});

fn compactor(src: &[u8]) {
    let mut compact = Vec::new();
    let ok = prx_hooks::__private::json::append_compact(
        &mut compact,
        src,
        prx_hooks::__private::json::Top::Any,
    );
    let mut copy = src.to_vec();
    let simd: Result<simd_json::OwnedValue, _> = simd_json::to_owned_value(&mut copy);
    match (&simd, ok) {
        (Ok(from_src), true) => {
            let mut again = compact.clone();
            let from_compact: simd_json::OwnedValue = simd_json::to_owned_value(&mut again)
                .unwrap_or_else(|e| panic!("simd-json refuses the compacted {compact:?}: {e}"));
            let (a, b): (Value, Value) = (
                serde_json::to_value(from_src).expect("simd-json values serialize"),
                serde_json::to_value(&from_compact).expect("simd-json values serialize"),
            );
            assert!(same(&a, &b), "{src:?}: {a:?} vs {b:?} after compaction");
        }
        (Ok(_), false) => assert!(
            known_difference(src),
            "simd-json accepts {src:?}, the compactor refuses it"
        ),
        (Err(e), true) => assert!(
            known_difference(src),
            "the compactor accepts {src:?}, simd-json refuses it: {e}"
        ),
        (Err(_), false) => {}
    }
}

fn strings(src: &[u8]) {
    let text = String::from_utf8_lossy(src);
    let short: String = text.chars().take(31).collect();
    let long = format!("{:<40}{text}", "padding-to-the-simd-threshold");
    for s in [text.as_ref(), short.as_str(), long.as_str()] {
        let mut ours = Vec::new();
        prx_hooks::__private::json::write_str(&mut ours, s);
        assert_eq!(ours, serde_json::to_vec(s).unwrap(), "{s:?}");
    }
}

/// Whether `src` holds something the known differences cover.
fn known_difference(src: &[u8]) -> bool {
    let text = String::from_utf8_lossy(src);
    // A run of 16+ digits (an integer beyond 64 bits or a float at the edge of f64), or an
    // exponent at all (`1e400`, or rounding of tiny/huge values).
    let mut run = 0;
    let long_number = src.iter().any(|b| {
        run = if b.is_ascii_digit() { run + 1 } else { 0 };
        run >= 16
    });
    let exponent = src
        .windows(2)
        .any(|w| w[0].is_ascii_digit() && matches!(w[1], b'e' | b'E'));
    let surrogate = text.to_ascii_lowercase().contains("\\ud");
    long_number || exponent || surrogate || depth(src) > 127
}

fn parsing(src: &[u8]) {
    let theirs: Result<Value, _> = serde_json::from_slice(src);
    let mut copy = src.to_vec();
    let simd: Result<simd_json::OwnedValue, _> = simd_json::to_owned_value(&mut copy);
    match (&theirs, &simd) {
        (Ok(a), Ok(b)) => {
            let b: Value = serde_json::to_value(b).expect("simd-json values serialize");
            assert!(
                same(a, &b) || known_difference(src),
                "values differ on {src:?}: serde_json {a:?}, simd-json {b:?}"
            );
        }
        (Err(_), Err(_)) => {}
        (a, b) => assert!(
            known_difference(src),
            "accept/reject differ on {src:?}: serde_json {:?}, simd-json {:?}",
            a.as_ref().map(|_| "ok").map_err(|e| e.to_string()),
            b.as_ref().map(|_| "ok").map_err(|e| e.to_string()),
        ),
    }
}

/// Equal values, numbers compared as f64 (serde_json and simd-json type `-0`, `1.0`, big
/// integers differently).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || ((x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
