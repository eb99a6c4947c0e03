//! `config::parse` (hooks.json validation) on arbitrary bytes.
//!
//! * never panics, and is deterministic (a second parse gives the same ids or the same errors);
//! * `Err`: every error is one line of the shape `hooks.json:LINE:COL: PATH: reason`, with
//!   LINE and COL ≥ 1 and LINE within the file, a non-empty path and reason, and at most
//!   `MAX_ERRORS` of them plus one line counting the rest;
//! * `Ok`: serde_json reads the same text (the validator's own JSON reader accepts nothing
//!   serde_json rejects), and the table agrees with serde_json's reading: one action per array
//!   element, under the normalized event, with the same command, args and env; and every
//!   invariant the shell backend relies on holds — at most 256 actions, ids valid and unique,
//!   ≤ 128 args and env entries, no NUL anywhere, no shell metacharacter in a command, bare
//!   names resolved to absolute paths on the sanitized PATH, no blocked or `ZERO_HOOK_*`
//!   variable, timeouts in 1..=300000 ms, `max_concurrent` ≥ 1, matchers only on tool events,
//!   cwds inside the workspace.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::EventKind;
use prx_hooks::config::{self, HookTable};
use prx_hooks_fuzz::assert_one_line;
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// A small workspace with a script, a directory and a symlink out, so relative commands and
/// cwds have something to resolve to.
fn workspace() -> &'static (PathBuf, PathBuf) {
    static WS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    WS.get_or_init(|| {
        // One fixed directory (created idempotently, so parallel jobs can share it): runs
        // leave nothing new behind.
        let ws = std::env::temp_dir().join("prx-hooks-fuzz-ws");
        let _ = std::fs::create_dir_all(ws.join("hooks"));
        let _ = std::fs::create_dir_all(ws.join("logs"));
        let _ = std::fs::write(ws.join("hooks/x.sh"), "#!/bin/sh\n");
        let _ = std::os::unix::fs::symlink("/tmp", ws.join("out"));
        let canon = ws.canonicalize().unwrap();
        (ws, canon)
    })
}

fuzz_target!(|data: &[u8]| {
    let (ws, canon) = workspace();
    let first = config::parse(data, "hooks.json", ws);
    let second = config::parse(data, "hooks.json", ws);
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert_eq!(ids(a), ids(b), "ids must be deterministic"),
        (Err(a), Err(b)) => assert_eq!(a, b, "errors must be deterministic"),
        _ => panic!("parse is not deterministic"),
    }
    match first {
        Err(errs) => check_errors(data, &errs),
        Ok(table) => check_table(data, &table, canon),
    }
});

fn ids(t: &HookTable) -> Vec<String> {
    t.actions.iter().map(|a| a.id.clone()).collect()
}

fn check_errors(data: &[u8], errs: &config::ConfigErrors) {
    assert!(!errs.is_empty(), "Err with no error");
    assert!(
        errs.len() <= config::MAX_ERRORS + 1,
        "{} error lines: at most MAX_ERRORS and a count",
        errs.len()
    );
    let lines = data.iter().filter(|&&b| b == b'\n').count() + 1;
    for e in errs {
        let text = e.to_string();
        assert_one_line(&text, &String::from_utf8_lossy(data));
        assert_eq!(
            text,
            format!("hooks.json:{}:{}: {}: {}", e.line, e.col, e.path, e.reason)
        );
        assert!(e.line >= 1 && e.col >= 1, "{text}");
        assert!(
            e.line <= lines,
            "line {} of a {lines}-line file: {text}",
            e.line
        );
        assert!(!e.path.is_empty() && !e.reason.is_empty(), "{text}");
        assert!(
            e.path == "$"
                || e.path.starts_with('[')
                || e.path
                    .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "path {:?}",
            e.path
        );
    }
}

fn check_table(data: &[u8], t: &HookTable, canon: &Path) {
    let text = data.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(data);
    assert!(text.len() <= config::MAX_FILE_BYTES);
    let value: Value = serde_json::from_slice(text)
        .unwrap_or_else(|e| panic!("accepted, but serde_json says {e}"));
    let top = value
        .as_object()
        .expect("an accepted document is an object");

    // Invariants.
    assert!(t.actions.len() <= config::MAX_ACTIONS);
    let mut seen = HashSet::new();
    for a in &t.actions {
        assert!(config::is_valid_id(&a.id), "id {:?}", a.id);
        assert!(seen.insert(a.id.clone()), "duplicate id {:?}", a.id);
        assert!(a.args.len() <= config::MAX_ARGS && a.env.len() <= config::MAX_ENV);
        assert!(!a.command.is_empty() && !a.command.contains('\0'));
        assert!(
            !a.command.contains(config::SHELL_METACHARACTERS),
            "metacharacter in {:?}",
            a.command
        );
        assert!(!a.command.chars().any(char::is_control));
        assert!(a.args.iter().all(|s| !s.contains('\0')));
        for (k, v) in &a.env {
            assert!(!k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'));
            assert!(
                !config::is_blocked_env(k) && !config::is_zero_hook_var(k),
                "{k}"
            );
        }
        match &a.program {
            Ok(p) => {
                assert!(p.is_absolute(), "{p:?}");
                if !a.command.contains('/') {
                    assert!(!a.command.chars().any(char::is_whitespace));
                    let dir = p.parent().and_then(|d| d.to_str()).unwrap_or_default();
                    assert!(config::SANITIZED_PATH.split(':').any(|d| d == dir), "{p:?}");
                }
            }
            Err(why) => assert!(!why.is_empty()),
        }
        assert!(
            a.cwd.is_absolute() && a.cwd.starts_with(canon),
            "cwd {:?}",
            a.cwd
        );
        assert!(!a.cwd.as_os_str().as_encoded_bytes().contains(&0));
        let ms = config::MIN_TIMEOUT_MS..=config::MAX_TIMEOUT_MS;
        assert!(
            ms.contains(&(a.timeout.as_millis() as u64)),
            "{:?}",
            a.timeout
        );
        assert!(a.timeout >= Duration::from_millis(1));
        assert!(a.max_concurrent >= 1);
        if a.matcher.is_some() {
            assert!(matches!(
                a.event,
                EventKind::ToolCallStart | EventKind::ToolCall
            ));
        }
    }
    for name in &t.env_passthrough {
        assert!(!config::is_blocked_env(name) && !config::is_zero_hook_var(name));
        assert!(!name.is_empty() && !name.contains(['=', '\0']));
    }
    for w in &t.warnings {
        assert_one_line(w, &String::from_utf8_lossy(data));
        assert!(w.starts_with("hooks.json:"), "{w}");
    }

    // Agreement with serde_json.
    let enabled = top.get("enabled").and_then(Value::as_bool).unwrap_or(true);
    assert_eq!(t.enabled, enabled);
    let hooks = match top.get("hooks") {
        None | Some(Value::Null) => {
            assert!(t.actions.is_empty());
            return;
        }
        Some(h) => h.as_object().expect("accepted hooks is an object"),
    };
    let mut total = 0;
    for (key, list) in hooks {
        let kind = EventKind::from_name(&config::normalize_event_key(key))
            .unwrap_or_else(|| panic!("accepted unknown event {key:?}"));
        let items = match list {
            Value::Null => continue,
            Value::Array(items) => items,
            other => panic!("accepted {other:?} as a list of hooks"),
        };
        total += items.len();
        let actions: Vec<_> = t.actions_for(kind).collect();
        assert_eq!(actions.len(), items.len(), "{key}");
        for (i, (a, item)) in actions.iter().zip(items).enumerate() {
            assert_eq!(a.index, i);
            let item = item.as_object().expect("an accepted hook is an object");
            assert_eq!(
                item.get("command").and_then(Value::as_str),
                Some(a.command.as_str())
            );
            let args: Vec<&str> = match item.get("args") {
                None | Some(Value::Null) => Vec::new(),
                Some(v) => v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap())
                    .collect(),
            };
            assert_eq!(a.args, args);
            let mut env: Vec<(String, String)> = match item.get("env") {
                None | Some(Value::Null) => Vec::new(),
                Some(v) => v
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect(),
            };
            let mut got = a.env.clone();
            env.sort();
            got.sort();
            assert_eq!(got, env);
            match item.get("id").and_then(Value::as_str) {
                Some(id) => assert!(a.id_explicit && a.id == id),
                None => assert!(!a.id_explicit && a.id.starts_with(kind.name())),
            }
            let stdin_json = item
                .get("stdin_json")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            assert_eq!(a.stdin_json, stdin_json);
        }
    }
    assert_eq!(total, t.actions.len());
}
