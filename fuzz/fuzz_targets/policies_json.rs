//! `policy::parse` (policies.json) on arbitrary bytes.
//!
//! * never panics, and is deterministic (a second parse gives the same ids or the same errors);
//! * `Err`: every error is one line, `policies.json:LINE:COL: PATH: reason`, with LINE and COL
//!   ≥ 1 and LINE within the file, a non-empty path and reason;
//! * `Ok`: serde_json reads the same text, the table holds one policy per element of
//!   `policies` (at most `MAX_POLICIES`, ids unique), and deciding with it, on a payload made
//!   from the same bytes, at every decision point, never panics and reports only a policy of
//!   the table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::policy::{self, DecisionPoint, PolicyTable};
use prx_hooks_fuzz::assert_one_line;
use serde_json::{Value, json};
use std::collections::HashSet;

fuzz_target!(|data: &[u8]| {
    let first = policy::parse(data, "policies.json");
    let second = policy::parse(data, "policies.json");
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert_eq!(ids(a), ids(b), "ids must be deterministic"),
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "errors must be deterministic")
        }
        _ => panic!("parse is not deterministic"),
    }
    match first {
        Err(errs) => {
            let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
            for e in &errs {
                let text = e.to_string();
                assert_one_line(&text, &String::from_utf8_lossy(data));
                assert!(text.starts_with("policies.json:"), "{text}");
                assert!(e.line >= 1 && e.col >= 1 && e.line <= lines, "{text}");
                assert!(!e.path.is_empty() && !e.reason.is_empty(), "{text}");
            }
        }
        Ok(table) => check_table(data, &table),
    }
});

fn ids(t: &PolicyTable) -> Vec<String> {
    let rules = t.policies.iter().map(|p| p.id.clone());
    rules
        .chain(t.commands.iter().map(|c| c.id.clone()))
        .collect()
}

fn check_table(data: &[u8], t: &PolicyTable) {
    let text = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    let value: Value = serde_json::from_slice(text)
        .unwrap_or_else(|e| panic!("accepted, but serde_json says {e}"));
    let n = match value.get("policies") {
        Some(Value::Array(items)) => items.len(),
        _ => 0,
    };
    assert_eq!(
        t.policies.len() + t.commands.len(),
        n,
        "one policy (rule or command) per element"
    );
    assert!(n <= policy::MAX_POLICIES);
    assert!(t.commands.len() <= policy::MAX_COMMAND_POLICIES);
    let mut seen = HashSet::new();
    for id in ids(t) {
        assert!(seen.insert(id.clone()), "duplicate id {id:?}");
    }
    let lossy = String::from_utf8_lossy(data);
    let payload = json!({
        "tool": lossy,
        "prompt": lossy,
        "arguments": {"command": lossy, "file_path": lossy},
    });
    for point in [
        DecisionPoint::ToolCallStart,
        DecisionPoint::Prompt,
        DecisionPoint::Permission,
    ] {
        let v = t.decide(point, "fuzz", &payload);
        if let Some(id) = &v.policy {
            assert!(seen.contains(id), "decided by {id:?}, not in the table");
            assert!(v.decision.is_some(), "a policy without a decision");
        }
    }
}
