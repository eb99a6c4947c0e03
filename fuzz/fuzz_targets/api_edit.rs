//! What the HTTP API does with a request body: `config::parse_body`, then a `HooksEditor`
//! mutation (the first byte picks create, update, toggle or delete) on a real hooks.json.
//!
//! * never panics; every error is one line and maps to one of the API's statuses (400, 404,
//!   409, 412, 422) — never 500 — with a path relative to the body (`$` is the body itself);
//! * `parse_body` agrees with serde_json: what it accepts serde_json reads as the same value;
//!   what serde_json reads it rejects only for a duplicate key;
//! * a refused mutation leaves hooks.json byte for byte as it was; an accepted one leaves a
//!   file the real loader accepts, holding the hook the editor returned, under its id, and
//!   its warnings are single lines;
//! * `EditError::in_body` (what the API answers) keeps the status, kind and path, stays one
//!   line, and places a validation error in the body (`body:LINE:COL: PATH: …`) whenever the
//!   body has that path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::config::{self, EditError, HooksEditor};
use prx_hooks_fuzz::{Serde, assert_one_line};
use std::path::PathBuf;
use std::sync::OnceLock;

const BASE: &str = r#"{
  "timeout_ms": 4000,
  "hooks": {
    "tool_call": [ { "id": "start", "command": "/bin/true", "args": ["a"] } ],
    "error": [ { "command": "/bin/echo", "env": { "A": "b" } } ]
  }
}
"#;

/// A workspace on tmpfs when there is one (the editor fsyncs every write).
fn workspace() -> &'static PathBuf {
    static WS: OnceLock<PathBuf> = OnceLock::new();
    WS.get_or_init(|| {
        let root = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        // libFuzzer exits without dropping anything: remove what earlier runs, now gone, left.
        if let Ok(entries) = std::fs::read_dir(&root) {
            for e in entries.flatten() {
                let name = e.file_name();
                let pid = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("prx-hooks-fuzz-api-"))
                    .and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let ws = root.join(format!("prx-hooks-fuzz-api-{}", std::process::id()));
        std::fs::create_dir_all(&ws).unwrap();
        ws
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&op, body)) = data.split_first() else {
        return;
    };
    let parsed = config::parse_body(body);
    let value = match (&parsed, prx_hooks_fuzz::parse(body)) {
        (Ok(None), _) => {
            assert!(body.iter().all(u8::is_ascii_whitespace));
            return;
        }
        (Ok(Some(v)), Serde::Ok(reference)) => {
            assert_eq!(v, &reference, "parse_body and serde_json disagree");
            v.clone()
        }
        (Ok(Some(_)), other) => panic!("parse_body accepted what serde_json did not: {other:?}"),
        (Err(e), Serde::Ok(_)) => {
            assert!(
                e.to_string().contains("duplicate key"),
                "rejected valid JSON: {e}"
            );
            check(e);
            return;
        }
        (Err(e), _) => {
            assert_eq!(e.status(), 400, "{e}");
            check(e);
            return;
        }
    };

    let ws = workspace();
    let file = ws.join("hooks.json");
    std::fs::write(&file, BASE).unwrap();
    let editor = HooksEditor::new(ws);
    let written = |w: config::Written| {
        for warning in &w.warnings {
            assert_one_line(warning, warning);
        }
        Some(w.hook)
    };
    let result = match op % 4 {
        0 => editor.create(value).map(written),
        1 => editor.update("start", value, None).map(written),
        2 => editor.toggle("start", None).map(written),
        _ => editor.delete("start", None).map(|_| None),
    };
    match result {
        Err(e) => {
            check(&e);
            let text = std::str::from_utf8(body).expect("parse_body accepted it");
            let placed = e.clone().in_body(text);
            check(&placed);
            assert_eq!(
                (placed.status(), placed.kind(), placed.path()),
                (e.status(), e.kind(), e.path())
            );
            if let Some(rest) = placed.to_string().strip_prefix("body:") {
                // body:LINE:COL: PATH: reason, with LINE and COL inside the body.
                let mut parts = rest.splitn(3, ':');
                let line: usize = parts.next().unwrap().parse().expect("a line number");
                let col: usize = parts.next().unwrap().parse().expect("a column");
                let tail = parts.next().unwrap();
                let lines: Vec<&str> = text.split('\n').collect();
                assert!(line >= 1 && line <= lines.len(), "{placed}");
                assert!(
                    col >= 1 && col <= lines[line - 1].chars().count() + 1,
                    "{placed}"
                );
                assert!(tail.starts_with(&format!(" {}: ", e.path())), "{placed}");
            }
            assert_eq!(
                std::fs::read_to_string(&file).unwrap(),
                BASE,
                "a refused edit wrote: {e}"
            );
        }
        Ok(hook) => {
            let table = config::load(ws)
                .unwrap_or_else(|e| panic!("the editor wrote a file the loader rejects:\n{e}"));
            match hook {
                Some(h) => {
                    let action = table.get(&h.id).expect("the written hook is in the file");
                    assert_eq!(action.event.name(), h.event);
                    assert_eq!(h.json["id"], h.id.as_str());
                }
                None => assert!(table.get("start").is_none()),
            }
        }
    }
});

fn check(e: &EditError) {
    let text = e.to_string();
    assert_one_line(&text, &text);
    assert!(!text.is_empty());
    assert!(
        matches!(e.status(), 400 | 404 | 409 | 412 | 422),
        "status {} for {e}",
        e.status()
    );
    let path = e.path();
    assert!(path == "$" || !path.starts_with('$'), "path {path:?}");
    assert!(!path.contains('\n'), "path {path:?}");
}
