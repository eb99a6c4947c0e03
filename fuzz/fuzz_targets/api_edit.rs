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

/// The workspaces' names: `prx-hooks-fuzz-api-<pid>-<ns>`, made under `…-new-<pid>-<ns>` first.
const WS_PREFIX: &str = "prx-hooks-fuzz-api-";

/// A workspace on tmpfs when there is one (the editor fsyncs every write).
///
/// libFuzzer exits without dropping anything, so a workspace outlives its process. Each one's
/// `.lock` is held (`flock`) by its process for as long as it lives: it is made and locked
/// under a temporary name, then renamed into place, and a workspace whose lock anybody can take
/// belongs to a process that is gone and is removed. A live worker's, in any PID namespace
/// sharing the directory, is never touched.
fn workspace() -> &'static PathBuf {
    static WS: OnceLock<(PathBuf, std::fs::File)> = OnceLock::new();
    &WS.get_or_init(|| {
        let root = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        remove_left_behind(&root);
        // Unique among processes sharing the directory, whatever their PID namespace.
        let name = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let new = root.join(format!("{WS_PREFIX}new-{name}"));
        std::fs::create_dir(&new).unwrap();
        let lock = std::fs::File::create(new.join(".lock")).unwrap();
        lock.try_lock().expect("a new workspace's lock is free");
        let ws = root.join(format!("{WS_PREFIX}{name}"));
        std::fs::rename(&new, &ws).unwrap();
        (ws, lock)
    })
    .0
}

/// Removes the workspaces in `root` whose process is gone (their lock is free).
fn remove_left_behind(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        // Not one being made (`new-…`): its lock may not be taken yet.
        let mine = name
            .to_str()
            .and_then(|n| n.strip_prefix(WS_PREFIX))
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
        if !mine {
            continue;
        }
        // No lock file: not one of these (or from before they had one): left alone.
        let Ok(lock) = std::fs::File::open(e.path().join(".lock")) else {
            continue;
        };
        if lock.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
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
