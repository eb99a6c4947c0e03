//! hooks.json loading and validation (ARCHITECTURE.md § Shell hooks): one test per rule, each asserting that
//! the message names the file, line and column, the JSON path and the reason. Real files in
//! temporary workspaces; nothing is mocked.

use prx_hooks::EventKind;
use prx_hooks::config::{self, ConfigErrors, HookTable, Matcher};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;

fn workspace() -> TempDir {
    tempfile::tempdir().expect("temp dir")
}

fn parse_in(ws: &Path, text: &str) -> Result<HookTable, ConfigErrors> {
    config::parse(text.as_bytes(), "hooks.json", ws)
}

fn ok(text: &str) -> (TempDir, HookTable) {
    let ws = workspace();
    let t = parse_in(ws.path(), text).unwrap_or_else(|e| panic!("rejected:\n{e}\n---\n{text}"));
    (ws, t)
}

/// Every error line; the file must be rejected.
fn errors(text: &str) -> Vec<String> {
    let ws = workspace();
    errors_in(ws.path(), text)
}

fn errors_in(ws: &Path, text: &str) -> Vec<String> {
    match parse_in(ws, text) {
        Ok(_) => panic!("accepted, expected an error:\n{text}"),
        Err(e) => {
            let lines = e.lines();
            assert_eq!(lines.len(), e.len());
            assert!(!lines.is_empty());
            for l in &lines {
                assert!(!l.contains(['\n', '\r']), "error spans lines: {l:?}");
                assert!(l.starts_with("hooks.json:"), "{l}");
            }
            lines
        }
    }
}

/// The one error of `text`, which must name `path` and contain `reason`; returns (line, col).
fn one_error(text: &str, path: &str, reason: &str) -> (usize, usize) {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "expected one error, got {errs:#?}");
    check(&errs[0], path, reason)
}

/// `hooks.json:LINE:COL: PATH: REASON` with this path and a reason containing `reason`.
fn check(line: &str, path: &str, reason: &str) -> (usize, usize) {
    let mut parts = line.splitn(4, ':');
    assert_eq!(parts.next(), Some("hooks.json"), "{line}");
    let l: usize = parts.next().and_then(|s| s.parse().ok()).expect(line);
    let c: usize = parts.next().and_then(|s| s.parse().ok()).expect(line);
    let rest = parts.next().expect(line);
    let want = format!(" {path}: ");
    assert!(rest.starts_with(&want), "path {path:?} not in {line:?}");
    assert!(
        rest[want.len()..].contains(reason),
        "reason {reason:?} not in {line:?}"
    );
    (l, c)
}

fn hook(event: &str, action: &str) -> String {
    format!(r#"{{"hooks": {{"{event}": [{action}]}}}}"#)
}

fn tc(action: &str) -> String {
    hook("tool_call", action)
}

// ---------------------------------------------------------------------------------------------
// The exact format, and positions

#[test]
fn metacharacter_error_has_the_documented_shape_and_position() {
    let text =
        "{\n  \"hooks\": {\n    \"tool_call\": [\n      { \"command\": \"a; b\" }\n    ]\n  }\n}\n";
    let e = errors(text);
    assert_eq!(
        e,
        [
            "hooks.json:4:20: hooks.tool_call[0].command: may not contain ';' — hooks run without \
             a shell; put arguments in \"args\""
        ]
    );
}

#[test]
fn load_names_the_file_with_its_workspace() {
    let ws = workspace();
    std::fs::write(ws.path().join("hooks.json"), tc(r#"{"command": 1}"#)).unwrap();
    let e = config::load(ws.path()).unwrap_err();
    let want = format!(
        "{}:1:38: hooks.tool_call[0].command: expected a string, found number",
        ws.path().join("hooks.json").display()
    );
    assert_eq!(e.to_string(), want);
    assert_eq!(
        config::file_label(Path::new(".")),
        "hooks.json",
        "the current directory is not spelled out"
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    // "é" is two bytes; the column of the value after it counts it once.
    let text = "{\"hooks\": {\"tool_call\": [{\"args\": [\"é\"], \"command\": 5}]}}";
    let (l, c) = one_error(text, "hooks.tool_call[0].command", "expected a string");
    assert_eq!((l, c), (1, 53));
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let text = r#"{
  "timeout_ms": 0,
  "hooks": {
    "tool_call": [
      { "command": "a|b", "args": [1], "timeout_ms": "5", "stdin_json": "yes" },
      { "comand": "x" }
    ],
    "agent_start": [ { "command": "ls", "matcher": "x*" } ]
  },
  "extra": true
}"#;
    let e = errors(text);
    assert_eq!(e.len(), 9, "{e:#?}");
    check(&e[0], "timeout_ms", "must be between 1 and 300000");
    check(&e[1], "hooks.tool_call[0].command", "may not contain '|'");
    check(
        &e[2],
        "hooks.tool_call[0].args[0]",
        "expected a string, found number",
    );
    check(
        &e[3],
        "hooks.tool_call[0].timeout_ms",
        "expected an integer, found string",
    );
    check(
        &e[4],
        "hooks.tool_call[0].stdin_json",
        "expected a boolean, found string",
    );
    check(&e[5], "hooks.tool_call[1]", "missing \"command\"");
    check(
        &e[6],
        "hooks.tool_call[1].comand",
        "did you mean \"command\"?",
    );
    check(
        &e[7],
        "hooks.agent_start[0].matcher",
        "only applies to tool_call_start and tool_call",
    );
    check(&e[8], "extra", "unknown field \"extra\"");
    // In file order.
    let pos: Vec<(usize, usize)> = e
        .iter()
        .map(|l| {
            let v: Vec<usize> = l
                .split(':')
                .skip(1)
                .take(2)
                .map(|n| n.parse().unwrap())
                .collect();
            (v[0], v[1])
        })
        .collect();
    let mut sorted = pos.clone();
    sorted.sort();
    assert_eq!(pos, sorted);
    assert_eq!(pos[0], (2, 17));
    assert_eq!(pos[6], (6, 9));
}

// ---------------------------------------------------------------------------------------------
// JSON syntax

#[test]
fn syntax_errors_point_at_the_offending_character() {
    let (l, c) = one_error(
        "{\n  \"hooks\": {\n    \"tool_call\": [ {\"command\": \"ls\",} ]\n  }\n}",
        "hooks.tool_call[0]",
        "trailing comma",
    );
    assert_eq!((l, c), (3, 37));
    let (l, c) = one_error("{\"hooks\": {}\n  // note\n}", "$", "JSON has no comments");
    assert_eq!((l, c), (2, 3));
    one_error("{\"hooks\": ", "hooks", "unexpected end of the file");
    one_error("{\"a\": 1} x", "$", "after the end of the JSON value");
    one_error("{'hooks': {}}", "$", "expected a key in double quotes");
    one_error(
        "{\"hooks\": {\"x\": [\"\\q\"]}}",
        "hooks.x[0]",
        "invalid escape",
    );
    one_error(
        "{\"hooks\": {\"x\": \"\\ud800\"}}",
        "hooks.x",
        "lone leading surrogate",
    );
    one_error(
        "[1, 2 3]",
        "$",
        "expected ',' or ']' after an element, found '3'",
    );
    one_error("{\"timeout_ms\": 012}", "timeout_ms", "leading zeros");
    let deep = format!("{{\"hooks\": {}{}}}", "[".repeat(200), "]".repeat(200));
    one_error(
        &deep,
        "hooks[0][0][0][0][0][0][0]…[0][0][0][0]",
        "nested too deeply (more than 127 levels)",
    );
}

#[test]
fn the_document_must_be_an_object() {
    let (l, c) = one_error("\n  [1]", "$", "expected a JSON object, found array");
    assert_eq!((l, c), (2, 3));
    one_error("", "$", "unexpected end of the file");
}

#[test]
fn invalid_utf8_is_located() {
    let ws = workspace();
    let e = config::parse(b"{\"hooks\":\n {\"\xff\": []}}", "hooks.json", ws.path()).unwrap_err();
    assert_eq!(e.len(), 1);
    check(&e.lines()[0], "$", "invalid UTF-8 at byte 13");
    assert_eq!((e.0[0].line, e.0[0].col), (2, 4));
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let ws = workspace();
    let t = config::parse(
        b"\xEF\xBB\xBF{\"hooks\": {\"tool_call\": [{\"command\": \"/bin/true\"}]}}",
        "hooks.json",
        ws.path(),
    )
    .unwrap();
    assert_eq!(t.actions.len(), 1);
}

#[test]
fn duplicate_json_keys_are_errors() {
    let text = "{\"hooks\": {\"tool_call\": [\n  {\"command\": \"ls\",\n   \"command\": \"id\"}]}}";
    let (l, c) = one_error(
        text,
        "hooks.tool_call[0].command",
        "duplicate key (first at 2:4)",
    );
    assert_eq!((l, c), (3, 4));
    one_error(
        r#"{"enabled": true, "enabled": false}"#,
        "enabled",
        "duplicate key (first at 1:2)",
    );
    one_error(
        &tc(r#"{"command": "ls", "env": {"A": "1", "A": "2"}}"#),
        "hooks.tool_call[0].env.A",
        "duplicate key",
    );
}

#[test]
fn the_file_size_is_limited() {
    let pad = " ".repeat(256 * 1024);
    let (l, c) = one_error(&format!("{{{pad}}}"), "$", "larger than 256 KiB");
    assert_eq!((l, c), (1, 1));
    // Just under the limit is fine.
    let pad = " ".repeat(256 * 1024 - 2);
    ok(&format!("{{{pad}}}"));
}

// ---------------------------------------------------------------------------------------------
// Top level

#[test]
fn unknown_top_level_fields_are_errors_with_hints() {
    let (l, c) = one_error(
        "{\n \"timeout\": 5}",
        "timeout",
        "unknown field \"timeout\"; did you mean \"timeout_ms\"?",
    );
    assert_eq!((l, c), (2, 2));
    one_error(
        r#"{"tool_call": []}"#,
        "tool_call",
        r#"hooks go under "hooks""#,
    );
    one_error(
        r#"{"zzzzzzzzzzzz": 1}"#,
        "zzzzzzzzzzzz",
        "expected one of timeout_ms, enabled, env_passthrough, path, hooks",
    );
}

#[test]
fn top_level_enabled_and_timeout_are_honoured() {
    let (_ws, t) = ok(r#"{"enabled": false, "timeout_ms": 5000,
        "hooks": {"tool_call": [{"command": "/bin/true"}, {"command": "/bin/true", "args": ["x"], "timeout_ms": 7}]}}"#);
    assert!(!t.enabled);
    assert!(t.interest().is_empty(), "globally disabled: no interest");
    assert_eq!(t.actions[0].timeout, Duration::from_millis(5000));
    assert!(!t.actions[0].timeout_explicit);
    assert_eq!(t.actions[1].timeout, Duration::from_millis(7));
    assert!(t.actions[1].timeout_explicit);
    one_error(
        r#"{"enabled": 1}"#,
        "enabled",
        "expected a boolean, found number",
    );
    one_error(
        r#"{"timeout_ms": 300001}"#,
        "timeout_ms",
        "must be between 1 and 300000 ms",
    );
    one_error(
        r#"{"hooks": []}"#,
        "hooks",
        "expected an object of event names",
    );
}

#[test]
fn defaults_are_the_documented_ones() {
    let (ws, t) = ok(&tc(r#"{"command": "/bin/true"}"#));
    let a = &t.actions[0];
    assert!(t.enabled);
    assert_eq!(a.timeout, Duration::from_millis(30_000));
    assert!(!a.stdin_json && a.enabled);
    assert_eq!(a.max_concurrent, 8);
    assert!(a.args.is_empty() && a.env.is_empty() && a.matcher.is_none());
    assert_eq!(a.cwd, ws.path().canonicalize().unwrap());
    assert_eq!(a.event, EventKind::ToolCall);
    assert_eq!(a.index, 0);
    assert!(t.source.is_none(), "parse leaves source to the caller");
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

#[test]
fn null_means_not_given() {
    let (_ws, t) = ok(
        r#"{"enabled": null, "timeout_ms": null, "hooks": {"tool_call": [
        {"command": "/bin/true", "args": null, "env": null, "cwd": null, "timeout_ms": null,
         "stdin_json": null, "id": null, "enabled": null, "matcher": null, "max_concurrent": null}]}}"#,
    );
    assert!(t.enabled && t.actions[0].enabled && !t.actions[0].id_explicit);
    one_error(
        &tc(r#"{"command": null}"#),
        "hooks.tool_call[0].command",
        "expected a string, found null",
    );
}

#[test]
fn home_in_env_passthrough_is_a_warning_not_silence() {
    // Hooks always get HOME (the agent's when absolute, else the passwd entry's): listing it
    // changes nothing, and the user is told so.
    let (_ws, t) = ok(r#"{"env_passthrough": ["CI", "HOME"]}"#);
    assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
    check(
        &t.warnings[0],
        "env_passthrough[1]",
        "HOME is always given to hooks",
    );
    let (_ws, t) = ok(r#"{"env_passthrough": ["CI"]}"#);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
}

#[test]
fn env_passthrough_is_checked() {
    let (_ws, t) = ok(r#"{"env_passthrough": ["AWS_REGION", "CI"]}"#);
    assert_eq!(t.env_passthrough, ["AWS_REGION", "CI"]);
    one_error(
        r#"{"env_passthrough": ["ld_preload"]}"#,
        "env_passthrough[0]",
        "may not pass through \"ld_preload\"",
    );
    one_error(
        r#"{"env_passthrough": ["A", "PATH"]}"#,
        "env_passthrough[1]",
        "hooks get the safe PATH",
    );
    one_error(
        r#"{"env_passthrough": ["ZERO_HOOK_PAYLOAD"]}"#,
        "env_passthrough[0]",
        "ZERO_HOOK_* variables are set by prx-hooks",
    );
    one_error(
        r#"{"env_passthrough": ["A=B"]}"#,
        "env_passthrough[0]",
        "not a valid variable name",
    );
    one_error(
        r#"{"env_passthrough": [""]}"#,
        "env_passthrough[0]",
        "may not be empty",
    );
    one_error(
        r#"{"env_passthrough": ["A\u0000"]}"#,
        "env_passthrough[0]",
        "NUL",
    );
    one_error(
        r#"{"env_passthrough": ["A", "A"]}"#,
        "env_passthrough[1]",
        "listed twice",
    );
    one_error(
        r#"{"env_passthrough": "A"}"#,
        "env_passthrough",
        "expected an array of variable names, found string",
    );
}

// ---------------------------------------------------------------------------------------------
// Events

#[test]
fn event_keys_are_normalized() {
    let (_ws, t) = ok(
        r#"{"hooks": {" LLM-Response ": [{"command": "/bin/true"}], "Tool-Call-Start": [{"command": "/bin/true"}]}}"#,
    );
    assert_eq!(t.actions[0].event, EventKind::LlmResponse);
    assert_eq!(t.actions[1].event, EventKind::ToolCallStart);
    assert!(t.actions[0].id.starts_with("llm_response-"));
}

#[test]
fn unknown_events_are_errors_with_did_you_mean() {
    let (l, c) = one_error(
        "{\"hooks\": {\n  \"tool_cal\": []}}",
        "hooks.tool_cal",
        "unknown event \"tool_cal\"; did you mean \"tool_call\"?",
    );
    assert_eq!((l, c), (2, 3));
    one_error(
        r#"{"hooks": {"on_save": []}}"#,
        "hooks.on_save",
        "expected one of agent_start, agent_end, llm_request, llm_response, tool_call_start, tool_call, turn_complete, error",
    );
    // Errors inside an unknown event's hooks are still reported.
    let e = errors(r#"{"hooks": {"x": [{"command": "a|b"}]}}"#);
    assert_eq!(e.len(), 2, "{e:#?}");
}

#[test]
fn keys_that_collide_after_normalization_are_errors() {
    let text = "{\"hooks\": {\n \"tool_call\": [],\n \"Tool-Call\": []}}";
    let (l, c) = one_error(
        text,
        "hooks.Tool-Call",
        "\"Tool-Call\" is the same event as \"tool_call\" once normalized",
    );
    assert_eq!((l, c), (3, 2));
    assert!(errors(text)[0].contains("(first at 2:2)"));
}

#[test]
fn an_event_holds_an_array_of_hook_objects() {
    one_error(
        r#"{"hooks": {"tool_call": {"command": "ls"}}}"#,
        "hooks.tool_call",
        "expected an array of hooks, found object",
    );
    one_error(
        r#"{"hooks": {"tool_call": ["ls"]}}"#,
        "hooks.tool_call[0]",
        "expected a hook object",
    );
}

// ---------------------------------------------------------------------------------------------
// Action fields

#[test]
fn command_is_required() {
    let (l, c) = one_error(
        &tc(r#"{"args": []}"#),
        "hooks.tool_call[0]",
        "missing \"command\" (required)",
    );
    assert_eq!((l, c), (1, 26));
}

#[test]
fn unknown_action_fields_are_errors_with_did_you_mean() {
    one_error(
        &tc(r#"{"command": "/bin/true", "timeout": 5}"#),
        "hooks.tool_call[0].timeout",
        "did you mean \"timeout_ms\"?",
    );
    one_error(
        &tc(r#"{"command": "/bin/true", "stdinjson": true}"#),
        "hooks.tool_call[0].stdinjson",
        "did you mean \"stdin_json\"?",
    );
    one_error(
        &tc(r#"{"command": "/bin/true", "event": "tool_call"}"#),
        "hooks.tool_call[0].event",
        "the event is the key",
    );
}

#[test]
fn wrong_types_name_what_was_expected_and_found() {
    let cases = [
        (
            r#"{"command": 5}"#,
            "hooks.tool_call[0].command",
            "expected a string, found number",
        ),
        (
            r#"{"command": "/bin/true", "args": "x"}"#,
            "hooks.tool_call[0].args",
            "expected an array of strings, found string",
        ),
        (
            r#"{"command": "/bin/true", "args": [true]}"#,
            "hooks.tool_call[0].args[0]",
            "expected a string, found boolean",
        ),
        (
            r#"{"command": "/bin/true", "env": []}"#,
            "hooks.tool_call[0].env",
            "expected an object of variable names to strings, found array",
        ),
        (
            r#"{"command": "/bin/true", "env": {"A": 1}}"#,
            "hooks.tool_call[0].env.A",
            "expected a string, found number",
        ),
        (
            r#"{"command": "/bin/true", "cwd": {}}"#,
            "hooks.tool_call[0].cwd",
            "expected a string, found object",
        ),
        (
            r#"{"command": "/bin/true", "timeout_ms": "5"}"#,
            "hooks.tool_call[0].timeout_ms",
            "expected an integer, found string",
        ),
        (
            r#"{"command": "/bin/true", "stdin_json": 1}"#,
            "hooks.tool_call[0].stdin_json",
            "expected a boolean, found number",
        ),
        (
            r#"{"command": "/bin/true", "enabled": "no"}"#,
            "hooks.tool_call[0].enabled",
            "expected a boolean, found string",
        ),
        (
            r#"{"command": "/bin/true", "id": 7}"#,
            "hooks.tool_call[0].id",
            "expected a string, found number",
        ),
        (
            r#"{"command": "/bin/true", "matcher": []}"#,
            "hooks.tool_call[0].matcher",
            "expected a string, found array",
        ),
        (
            r#"{"command": "/bin/true", "max_concurrent": false}"#,
            "hooks.tool_call[0].max_concurrent",
            "expected an integer, found boolean",
        ),
    ];
    for (action, path, reason) in cases {
        one_error(&tc(action), path, reason);
    }
}

#[test]
fn timeouts_are_between_1_and_300000_ms() {
    for bad in ["0", "300001", "-1", "99999999999999999999999"] {
        one_error(
            &tc(&format!(
                r#"{{"command": "/bin/true", "timeout_ms": {bad}}}"#
            )),
            "hooks.tool_call[0].timeout_ms",
            &format!("must be between 1 and 300000 ms, found {bad}"),
        );
    }
    for bad in ["1.5", "1e3"] {
        one_error(
            &tc(&format!(
                r#"{{"command": "/bin/true", "timeout_ms": {bad}}}"#
            )),
            "hooks.tool_call[0].timeout_ms",
            &format!("expected an integer, found {bad}"),
        );
    }
    for good in [1u64, 300_000] {
        let (_ws, t) = ok(&tc(&format!(
            r#"{{"command": "/bin/true", "timeout_ms": {good}}}"#
        )));
        assert_eq!(t.actions[0].timeout, Duration::from_millis(good));
    }
}

#[test]
fn max_concurrent_is_at_least_one() {
    one_error(
        &tc(r#"{"command": "/bin/true", "max_concurrent": 0}"#),
        "hooks.tool_call[0].max_concurrent",
        "must be between 1 and 1024",
    );
    let (_ws, t) = ok(&tc(r#"{"command": "/bin/true", "max_concurrent": 3}"#));
    assert_eq!(t.actions[0].max_concurrent, 3);
}

#[test]
fn flags_are_read() {
    let (_ws, t) = ok(&tc(
        r#"{"command": "/bin/true", "stdin_json": true, "enabled": false}"#,
    ));
    assert!(t.actions[0].stdin_json && !t.actions[0].enabled);
}

// ---------------------------------------------------------------------------------------------
// Ids

#[test]
fn ids_must_be_valid() {
    for bad in ["", "a b", "a/b", "é", &"a".repeat(65)] {
        one_error(
            &tc(&format!(r#"{{"command": "/bin/true", "id": "{bad}"}}"#)),
            "hooks.tool_call[0].id",
            "is not a valid id: 1 to 64 characters of A-Z a-z 0-9 . _ -",
        );
    }
    let (_ws, t) = ok(&tc(&format!(
        r#"{{"command": "/bin/true", "id": "A.b_c-9{}"}}"#,
        "x".repeat(57)
    )));
    assert_eq!(t.actions[0].id.len(), 64);
    assert!(t.actions[0].id_explicit);
}

#[test]
fn duplicate_ids_are_errors_across_events() {
    let text = "{\"hooks\": {\n \"tool_call\": [{\"command\": \"/bin/true\", \"id\": \"audit\"}],\n \"error\": [{\"command\": \"/bin/true\", \"id\": \"audit\"}]}}";
    let (l, c) = one_error(
        text,
        "hooks.error[0].id",
        "duplicate id \"audit\" (first at 2:47)",
    );
    assert_eq!((l, c), (3, 43));
}

fn ids(t: &HookTable) -> Vec<String> {
    t.actions.iter().map(|a| a.id.clone()).collect()
}

#[test]
fn derived_ids_are_deterministic_valid_and_unique() {
    let text = r#"{"hooks": {
        "tool_call": [{"command": "/bin/true"}, {"command": "/bin/true"}, {"command": "/bin/true", "args": ["x"]}],
        "error": [{"command": "/bin/true"}]}}"#;
    let (ws, a) = ok(text);
    let b = parse_in(ws.path(), text).unwrap();
    assert_eq!(ids(&a), ids(&b), "stable across reloads");
    let id = ids(&a);
    assert!(
        id[0].starts_with("tool_call-") && id[0].len() == "tool_call-".len() + 8,
        "{id:?}"
    );
    assert!(
        id[0]["tool_call-".len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
    );
    assert_eq!(
        id[1],
        format!("{}-2", id[0]),
        "identical hooks get a suffix"
    );
    assert_ne!(id[2], id[0]);
    assert!(id[3].starts_with("error-"));
    let mut uniq = id.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), id.len());
    for i in &id {
        assert!(config::is_valid_id(i), "{i}");
        assert!(a.get(i).is_some());
    }
    assert!(a.actions.iter().all(|a| !a.id_explicit));
}

#[test]
fn derived_ids_survive_other_hooks_being_added_and_removed() {
    let one = r#"{"hooks": {"tool_call": [{"command": "/bin/true", "args": ["a"]}]}}"#;
    let more = r#"{"hooks": {
        "agent_start": [{"command": "/bin/echo"}],
        "tool_call": [{"command": "/bin/echo", "args": ["new"]}, {"command": "/bin/true", "args": ["a"]}, {"command": "/bin/true", "id": "x"}]}}"#;
    let (ws, a) = ok(one);
    let b = parse_in(ws.path(), more).unwrap();
    let id = &a.actions[0].id;
    let same = b.actions.iter().find(|x| x.args == ["a"]).unwrap();
    assert_eq!(
        &same.id, id,
        "same hook, same id, whatever else the file holds"
    );
    assert_eq!(same.index, 1);
}

#[test]
fn derived_ids_ignore_tuning_fields_but_not_what_runs() {
    let base = ok(&tc(r#"{"command": "/bin/true", "args": ["a"]}"#))
        .1
        .actions[0]
        .id
        .clone();
    let tuned = ok(&tc(r#"{"command": "/bin/true", "args": ["a"], "enabled": false, "timeout_ms": 5, "stdin_json": true, "max_concurrent": 2}"#)).1;
    assert_eq!(tuned.actions[0].id, base);
    for other in [
        r#"{"command": "/bin/true", "args": ["b"]}"#,
        r#"{"command": "/bin/echo", "args": ["a"]}"#,
        r#"{"command": "/bin/true", "args": ["a"], "matcher": "x"}"#,
        r#"{"command": "/bin/true", "args": ["a"], "cwd": "."}"#,
    ] {
        assert_ne!(ok(&tc(other)).1.actions[0].id, base, "{other}");
    }
    let e = ok(&hook("error", r#"{"command": "/bin/true", "args": ["a"]}"#)).1;
    assert_ne!(
        e.actions[0].id[e.actions[0].id.len() - 8..],
        base[base.len() - 8..],
        "the event is part of the hash"
    );
}

#[test]
fn derived_ids_never_take_an_explicit_one() {
    let (_ws, t) = ok(&tc(r#"{"command": "/bin/true"}"#));
    let derived = t.actions[0].id.clone();
    let text = tc(&format!(
        r#"{{"command": "/bin/true"}}, {{"command": "/bin/echo", "id": "{derived}"}}"#
    ));
    let (_ws, t) = ok(&text);
    assert_eq!(t.actions[1].id, derived);
    assert_eq!(t.actions[0].id, format!("{derived}-2"));
}

// ---------------------------------------------------------------------------------------------
// Matchers

#[test]
fn matchers_are_globs_or_regexes_on_tool_events_only() {
    let (_ws, t) = ok(
        r#"{"hooks": {"tool_call_start": [{"command": "/bin/true", "matcher": "mcp__*"}],
        "tool_call": [{"command": "/bin/true", "matcher": "/^shell|bash$/"}]}}"#,
    );
    assert!(matches!(&t.actions[0].matcher, Some(Matcher::Glob(g)) if g == "mcp__*"));
    let m = t.actions[1].matcher.as_ref().unwrap();
    assert!(matches!(m, Matcher::Anchored { .. }));
    assert!(m.matches("shell") && m.matches("bash") && !m.matches("zsh"));
    for event in [
        "agent_start",
        "agent_end",
        "llm_request",
        "llm_response",
        "turn_complete",
        "error",
    ] {
        // Each with its article as read aloud: an agent_end, an llm_request (el-el-em).
        let article = if event == "turn_complete" { "a" } else { "an" };
        one_error(
            &hook(event, r#"{"command": "/bin/true", "matcher": "x"}"#),
            &format!("hooks.{event}[0].matcher"),
            &format!(
                "a matcher only applies to tool_call_start and tool_call hooks (this one is {article} {event} hook)"
            ),
        );
    }
}

#[test]
fn invalid_regexes_are_errors() {
    one_error(
        &tc(r#"{"command": "/bin/true", "matcher": "/(abc/"}"#),
        "hooks.tool_call[0].matcher",
        "invalid regular expression: unclosed group",
    );
    one_error(
        &tc(r#"{"command": "/bin/true", "matcher": "Edit|(Write"}"#),
        "hooks.tool_call[0].matcher",
        "invalid regular expression: unclosed group",
    );
    one_error(
        &tc(r#"{"command": "/bin/true", "matcher": "//"}"#),
        "hooks.tool_call[0].matcher",
        "an empty regular expression",
    );
}

/// Claude Code's regex matchers (`Edit|Write`, `mcp__.*`) were read as globs
/// and never matched. The rule: `/re/` or any matcher with one of `|().+[]^$\` is a regex
/// matched against the whole tool name; name characters with `*`/`?` stay a glob; `*` or
/// empty match every tool.
#[test]
fn claude_code_regex_matchers_match_whole_tool_names() {
    let (_ws, t) = ok(r#"{"hooks": {"tool_call": [
        {"id": "edit", "command": "/bin/true", "matcher": "Edit|Write"},
        {"id": "mcp", "command": "/bin/true", "matcher": "mcp__.*"},
        {"id": "glob", "command": "/bin/true", "matcher": "mcp__*"},
        {"id": "one", "command": "/bin/true", "matcher": "Read?"},
        {"id": "star", "command": "/bin/true", "matcher": "*"},
        {"id": "empty", "command": "/bin/true", "matcher": ""},
        {"id": "slashed", "command": "/bin/true", "matcher": "/Bash|Shell/"},
        {"id": "notebook", "command": "/bin/true", "matcher": "Notebook.*Edit"}]}}"#);
    let m = |id: &str, tool: &str| {
        let a = t.get(id).unwrap();
        a.matcher.as_ref().is_none_or(|m| m.matches(tool))
    };
    assert!(m("edit", "Edit") && m("edit", "Write"));
    assert!(!m("edit", "MultiEdit") && !m("edit", "Edit2") && !m("edit", "edit"));
    assert!(m("mcp", "mcp__github__create_issue") && !m("mcp", "my_mcp__x"));
    assert!(m("glob", "mcp__github__x") && !m("glob", "xmcp__"));
    assert!(m("one", "Reads") && !m("one", "Read"));
    assert!(m("star", "anything") && m("star", ""));
    assert!(
        t.get("empty").unwrap().matcher.is_none(),
        "empty: every tool"
    );
    assert!(m("empty", "anything"));
    assert!(m("slashed", "Bash") && m("slashed", "Shell") && !m("slashed", "Bashful"));
    assert!(m("notebook", "NotebookEdit") && !m("notebook", "NotebookRead"));
    assert!(matches!(
        t.get("glob").unwrap().matcher,
        Some(Matcher::Glob(_))
    ));
    assert!(matches!(
        t.get("edit").unwrap().matcher,
        Some(Matcher::Anchored { .. })
    ));
    assert_eq!(
        t.get("edit").unwrap().matcher.as_ref().unwrap().source(),
        "Edit|Write",
        "kept as written"
    );
}

// ---------------------------------------------------------------------------------------------
// Limits

#[test]
fn at_most_256_actions() {
    let actions = vec![r#"{"command": "/bin/true"}"#; 257].join(",\n");
    let text = format!("{{\"hooks\": {{\"tool_call\": [\n{actions}]}}}}");
    let (l, c) = one_error(&text, "hooks.tool_call[256]", "too many hooks: at most 256");
    assert_eq!((l, c), (258, 1));
    let actions = vec![r#"{"command": "/bin/true"}"#; 256].join(",");
    let (_ws, t) = ok(&format!("{{\"hooks\": {{\"tool_call\": [{actions}]}}}}"));
    assert_eq!(t.actions.len(), 256);
}

#[test]
fn at_most_128_args_and_128_env_entries() {
    let args = |n: usize| {
        (0..n)
            .map(|i| format!("\"{i}\""))
            .collect::<Vec<_>>()
            .join(",")
    };
    let env = |n: usize| {
        (0..n)
            .map(|i| format!("\"V{i}\": \"x\""))
            .collect::<Vec<_>>()
            .join(",")
    };
    ok(&tc(&format!(
        r#"{{"command": "/bin/true", "args": [{}], "env": {{{}}}}}"#,
        args(128),
        env(128)
    )));
    one_error(
        &tc(&format!(
            r#"{{"command": "/bin/true", "args": [{}]}}"#,
            args(129)
        )),
        "hooks.tool_call[0].args[128]",
        "too many arguments: at most 128",
    );
    one_error(
        &tc(&format!(
            r#"{{"command": "/bin/true", "env": {{{}}}}}"#,
            env(129)
        )),
        "hooks.tool_call[0].env.V128",
        "too many variables: at most 128",
    );
}

// ---------------------------------------------------------------------------------------------
// Security at load time

#[test]
fn nul_bytes_are_rejected_everywhere() {
    let cases = [
        (
            r#"{"command": "/bin/tr\u0000ue"}"#,
            "hooks.tool_call[0].command",
        ),
        (
            r#"{"command": "/bin/true", "args": ["a\u0000"]}"#,
            "hooks.tool_call[0].args[0]",
        ),
        (
            r#"{"command": "/bin/true", "env": {"A\u0000B": "x"}}"#,
            "hooks.tool_call[0].env[\"A\\u0000B\"]",
        ),
        (
            r#"{"command": "/bin/true", "env": {"A": "x\u0000"}}"#,
            "hooks.tool_call[0].env.A",
        ),
        (
            r#"{"command": "/bin/true", "cwd": "lo\u0000gs"}"#,
            "hooks.tool_call[0].cwd",
        ),
    ];
    for (action, path) in cases {
        let e = errors(&tc(action));
        assert_eq!(e.len(), 1, "{e:?}");
        check(&e[0], path, "NUL");
    }
}

#[test]
fn shell_metacharacters_in_command_are_rejected() {
    for c in [
        ";", "|", "&", "$", "`", "<", ">", "(", ")", "{", "}", "[", "]", "*", "?", "!", "~",
    ] {
        one_error(
            &tc(&format!(r#"{{"command": "/bin/a{c}b"}}"#)),
            "hooks.tool_call[0].command",
            &format!(
                "may not contain '{c}' — hooks run without a shell; put arguments in \"args\""
            ),
        );
    }
    for (escaped, what) in [
        (r"\'", "a single quote (')"),
        (r#"\""#, "a double quote (\")"),
        (r"\\", r"'\'"),
        (r"\n", "a newline"),
    ] {
        let escaped = if escaped == r"\'" { "'" } else { escaped };
        one_error(
            &tc(&format!(r#"{{"command": "/bin/a{escaped}b"}}"#)),
            "hooks.tool_call[0].command",
            &format!("may not contain {what}"),
        );
    }
    // Metacharacters are fine in args (PRX users pass `-d @-` and JSON there).
    ok(&tc(
        r#"{"command": "/bin/true", "args": ["-d", "@-", "a;b|c", "$HOME", "{\"x\": [1]}"]}"#,
    ));
}

#[test]
fn whitespace_in_a_bare_command_is_rejected_with_a_hint() {
    one_error(
        &tc(r#"{"command": "python3 /opt/audit.py -v"}"#),
        "hooks.tool_call[0].command",
        r#"may not contain whitespace: a bare command is one program name; put arguments in "args": "command": "python3", "args": ["/opt/audit.py", "-v"]"#,
    );
    one_error(
        &tc(r#"{"command": "  "}"#),
        "hooks.tool_call[0].command",
        "may not be empty",
    );
    one_error(
        &tc(r#"{"command": ""}"#),
        "hooks.tool_call[0].command",
        "may not be empty",
    );
    one_error(
        &tc(r#"{"command": "a\u0007"}"#),
        "hooks.tool_call[0].command",
        "control characters",
    );
}

fn first_existing(names: &[&str]) -> PathBuf {
    for dir in ["/usr/local/bin", "/usr/bin", "/bin"] {
        for n in names {
            let p = Path::new(dir).join(n);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("none of {names:?} on this machine")
}

#[test]
fn bare_names_are_resolved_at_load_time() {
    let (_ws, t) = ok(&tc(r#"{"command": "sh"}"#));
    assert_eq!(
        t.actions[0].program.as_deref().unwrap(),
        first_existing(&["sh"])
    );
    assert!(t.actions[0].program.as_ref().unwrap().is_absolute());
    assert_eq!(t.actions[0].command, "sh");
}

#[test]
fn a_bare_name_not_found_is_a_warning_and_the_hook_is_kept() {
    let (_ws, t) = ok(&tc(r#"{"command": "no-such-program-prx-hooks-test"}"#));
    let why = t.actions[0].program.as_ref().unwrap_err();
    assert!(
        why.contains("not found in /usr/local/bin:/usr/bin:/bin"),
        "{why}"
    );
    assert_eq!(t.warnings.len(), 1);
    check(
        &t.warnings[0],
        "hooks.tool_call[0].command",
        "was not found in /usr/local/bin:/usr/bin:/bin; the hook will fail to spawn",
    );
}

#[test]
fn relative_commands_resolve_inside_the_workspace() {
    let ws = workspace();
    std::fs::create_dir(ws.path().join("hooks")).unwrap();
    let script = ws.path().join("hooks/x.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = parse_in(
        ws.path(),
        &tc(r#"{"command": "./hooks/x.sh"}, {"command": "hooks/../hooks/x.sh"}"#),
    )
    .unwrap();
    let want = ws.path().canonicalize().unwrap().join("hooks/x.sh");
    assert_eq!(t.actions[0].program.as_deref().unwrap(), want);
    assert_eq!(t.actions[1].program.as_deref().unwrap(), want);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    // Missing or not executable: a warning, the hook kept.
    let t = parse_in(ws.path(), &tc(r#"{"command": "./hooks/missing.sh"}"#)).unwrap();
    check(
        &t.warnings[0],
        "hooks.tool_call[0].command",
        "does not exist",
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let t = parse_in(ws.path(), &tc(r#"{"command": "./hooks/x.sh"}"#)).unwrap();
    check(
        &t.warnings[0],
        "hooks.tool_call[0].command",
        "is not executable",
    );
}

#[test]
fn relative_commands_may_not_escape_the_workspace() {
    for cmd in ["../x.sh", "./a/../../x.sh", "hooks/../../etc/x"] {
        one_error(
            &tc(&format!(r#"{{"command": "{cmd}"}}"#)),
            "hooks.tool_call[0].command",
            "is outside the workspace",
        );
    }
    // Through a symbolic link: caught once the target exists.
    let outside = workspace();
    let target = outside.path().join("evil.sh");
    std::fs::write(&target, "#!/bin/sh\n").unwrap();
    let ws = workspace();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
    let e = errors_in(ws.path(), &tc(r#"{"command": "./link/evil.sh"}"#));
    assert_eq!(e.len(), 1);
    check(
        &e[0],
        "hooks.tool_call[0].command",
        "leads outside the workspace through a symbolic link",
    );
}

#[test]
fn absolute_commands_are_kept_as_written() {
    let (_ws, t) = ok(&tc(
        r#"{"command": "/bin/true"}, {"command": "/opt/not/here"}"#,
    ));
    assert_eq!(
        t.actions[0].program.as_deref().unwrap(),
        Path::new("/bin/true")
    );
    assert_eq!(
        t.actions[1].program.as_deref().unwrap(),
        Path::new("/opt/not/here")
    );
    assert_eq!(t.warnings.len(), 1);
    check(
        &t.warnings[0],
        "hooks.tool_call[1].command",
        "\"/opt/not/here\" does not exist",
    );
}

#[test]
fn blocked_variables_may_not_be_set() {
    // The whole policy, name by name, is in tests/library/env_policy.rs; here the message format.
    for (name, why) in [
        ("LD_PRELOAD", "LD_* variables control the dynamic loader"),
        ("ld_preload", "LD_* variables control the dynamic loader"),
        (
            "LD_LIBRARY_PATH",
            "LD_* variables control the dynamic loader",
        ),
        (
            "DYLD_INSERT_LIBRARIES",
            "DYLD_* variables control the macOS dynamic loader",
        ),
        (
            "DYLD_LIBRARY_PATH",
            "DYLD_* variables control the macOS dynamic loader",
        ),
        ("PATH", "hooks get the safe PATH"),
        ("Path", "hooks get the safe PATH"),
    ] {
        one_error(
            &tc(&format!(
                r#"{{"command": "/bin/true", "env": {{"{name}": "x"}}}}"#
            )),
            &format!("hooks.tool_call[0].env.{name}"),
            &format!("may not set \"{name}\": {why}"),
        );
    }
    // HOME is the host's (or the passwd entry's), like PATH never the file's: refused in any
    // case, at its line and column.
    for name in ["HOME", "home", "Home"] {
        let (line, col) = one_error(
            &format!(
                "{{\"hooks\": {{\"tool_call\": [\n  {{\"command\": \"/bin/true\",\n   \"env\": {{\"LEVEL\": \"x\", \"{name}\": \"/tmp/x\"}}}}]}}}}"
            ),
            &format!("hooks.tool_call[0].env.{name}"),
            &format!("may not set \"{name}\": hooks get the host's HOME"),
        );
        assert_eq!((line, col), (3, 26), "{name}");
    }
    for name in ["ZERO_HOOK_EVENT", "zero_hook_payload", "Zero_Hook_X"] {
        one_error(
            &tc(&format!(
                r#"{{"command": "/bin/true", "env": {{"{name}": "x"}}}}"#
            )),
            &format!("hooks.tool_call[0].env.{name}"),
            "ZERO_HOOK_* variables are set by prx-hooks",
        );
    }
}

#[test]
fn env_names_must_be_valid_and_entries_keep_their_order() {
    one_error(
        &tc(r#"{"command": "/bin/true", "env": {"A=B": "x"}}"#),
        "hooks.tool_call[0].env[\"A=B\"]",
        "not a valid variable name (it contains '=')",
    );
    one_error(
        &tc(r#"{"command": "/bin/true", "env": {"": "x"}}"#),
        "hooks.tool_call[0].env[\"\"]",
        "may not be empty",
    );
    let (_ws, t) = ok(&tc(
        r#"{"command": "/bin/true", "env": {"Z": "1", "A": "", "LEVEL": "info"}}"#,
    ));
    let env: Vec<(&str, &str)> = t.actions[0]
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(env, [("Z", "1"), ("A", ""), ("LEVEL", "info")]);
}

#[test]
fn cwd_is_resolved_inside_the_workspace() {
    let ws = workspace();
    std::fs::create_dir_all(ws.path().join("logs/deep")).unwrap();
    let canon = ws.path().canonicalize().unwrap();
    let t = parse_in(
        ws.path(),
        &tc(&format!(
            r#"{{"command": "/bin/true", "cwd": "logs"}}, {{"command": "/bin/true", "cwd": "./logs/deep/.."}}, {{"command": "/bin/true", "cwd": "{}"}}"#,
            canon.join("logs/deep").display()
        )),
    )
    .unwrap();
    assert_eq!(t.actions[0].cwd, canon.join("logs"));
    assert_eq!(t.actions[1].cwd, canon.join("logs"));
    assert_eq!(t.actions[2].cwd, canon.join("logs/deep"));
    let t = parse_in(
        ws.path(),
        &tc(r#"{"command": "/bin/true", "cwd": "./logs/.."}"#),
    )
    .unwrap();
    assert_eq!(
        t.actions[0].cwd, canon,
        "exactly the workspace, no trailing '/'"
    );
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    // A directory that does not exist yet: a warning.
    let t = parse_in(
        ws.path(),
        &tc(r#"{"command": "/bin/true", "cwd": "later"}"#),
    )
    .unwrap();
    assert_eq!(t.actions[0].cwd, canon.join("later"));
    check(
        &t.warnings[0],
        "hooks.tool_call[0].cwd",
        "does not exist (yet)",
    );
}

#[test]
fn cwd_may_not_escape_the_workspace() {
    for cwd in ["..", "../x", "a/../..", "/tmp", "/"] {
        one_error(
            &tc(&format!(r#"{{"command": "/bin/true", "cwd": "{cwd}"}}"#)),
            "hooks.tool_call[0].cwd",
            "is outside the workspace",
        );
    }
    one_error(
        &tc(r#"{"command": "/bin/true", "cwd": ""}"#),
        "hooks.tool_call[0].cwd",
        "may not be empty",
    );
    let outside = workspace();
    let ws = workspace();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
    let e = errors_in(ws.path(), &tc(r#"{"command": "/bin/true", "cwd": "out"}"#));
    check(
        &e[0],
        "hooks.tool_call[0].cwd",
        "leads outside the workspace through a symbolic link",
    );
}

// ---------------------------------------------------------------------------------------------
// Loading files

#[test]
fn a_missing_file_is_an_empty_enabled_table() {
    let ws = workspace();
    let t = config::load(ws.path()).unwrap();
    assert!(t.enabled && t.actions.is_empty() && t.source.is_none() && t.warnings.is_empty());
    // Even when the workspace itself does not exist.
    let t = config::load(&ws.path().join("nope")).unwrap();
    assert!(t.enabled && t.actions.is_empty());
}

#[test]
fn load_sets_the_source_and_refuses_non_files() {
    let ws = workspace();
    std::fs::write(ws.path().join("hooks.json"), "{}").unwrap();
    let t = config::load(ws.path()).unwrap();
    assert_eq!(
        t.source.as_deref(),
        Some(ws.path().join("hooks.json").as_path())
    );
    std::fs::remove_file(ws.path().join("hooks.json")).unwrap();
    std::fs::create_dir(ws.path().join("hooks.json")).unwrap();
    let e = config::load(ws.path()).unwrap_err();
    assert_eq!(e.len(), 1);
    assert!(
        e.to_string()
            .ends_with("hooks.json:1:1: $: cannot read the file: not a regular file"),
        "{e}"
    );
}

#[test]
fn compat_hooks_json_loads_unchanged() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prx/hooks.json");
    let text = std::fs::read(&src).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the PRX samples in tests/fixtures/prx)",
            src.display()
        )
    });
    let ws = workspace();
    std::fs::write(ws.path().join("hooks.json"), &text).unwrap();
    let t =
        config::load(ws.path()).unwrap_or_else(|e| panic!("the compat hooks.json must load:\n{e}"));
    assert!(t.enabled);
    let events: Vec<EventKind> = t.actions.iter().map(|a| a.event).collect();
    assert_eq!(
        events,
        [
            EventKind::AgentStart,
            EventKind::LlmResponse,
            EventKind::ToolCall,
            EventKind::ToolCall,
            EventKind::Error
        ]
    );
    let by_cmd = |c: &str| t.actions.iter().find(|a| a.command == c).unwrap();
    assert_eq!(
        by_cmd("/usr/bin/logger").timeout,
        Duration::from_millis(3000)
    );
    let py = by_cmd("python3");
    assert!(py.stdin_json);
    assert_eq!(py.timeout, Duration::from_millis(2000));
    let audit = by_cmd("/usr/local/bin/audit");
    assert_eq!(
        audit.timeout,
        Duration::from_millis(5000),
        "the file's top-level timeout_ms"
    );
    assert_eq!(audit.cwd, ws.path().canonicalize().unwrap().join("logs"));
    assert_eq!(audit.env, [("AUDIT_LEVEL".to_string(), "full".to_string())]);
    let curl = by_cmd("curl");
    assert!(curl.args.iter().any(|a| a == "@-"));
    assert_eq!(
        by_cmd("sh").program.as_deref().unwrap(),
        first_existing(&["sh"])
    );
    // Warnings (missing programs, the missing logs directory) but no errors.
    assert!(
        t.warnings
            .iter()
            .any(|w| w.contains("hooks.tool_call[0].cwd")),
        "{:#?}",
        t.warnings
    );
    for w in &t.warnings {
        assert!(w.contains("hooks.json:") && !w.contains('\n'), "{w}");
    }
    let mut ids = t.actions.iter().map(|a| a.id.clone()).collect::<Vec<_>>();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
}

#[test]
fn paths_with_odd_keys_are_quoted_on_one_line() {
    let e = errors("{\"hooks\": {\"a\\nb.c\": []}}");
    check(&e[0], "hooks[\"a\\nb.c\"]", "unknown event \"a\\nb.c\"");
}

#[test]
fn the_size_limit_counts_the_file_without_its_byte_order_mark() {
    let ws = workspace();
    let pad = " ".repeat(256 * 1024 - 2);
    std::fs::write(ws.path().join("hooks.json"), format!("\u{feff}{{{pad}}}")).unwrap();
    config::load(ws.path()).unwrap();
    std::fs::write(ws.path().join("hooks.json"), format!("\u{feff}{{{pad} }}")).unwrap();
    let e = config::load(ws.path()).unwrap_err();
    assert!(e.to_string().contains("larger than 256 KiB"), "{e}");
}

#[test]
fn the_watcher_and_errors_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<config::ConfigWatcher>();
    send_sync::<config::ConfigErrors>();
    send_sync::<config::ConfigStats>();
    send_sync::<HookTable>();
}

// ---------------------------------------------------------------------------------------------
// Linear time and capped errors

/// The parse of `text`, and how long it took.
fn timed_errors(text: &str) -> (Vec<String>, Duration) {
    let ws = workspace();
    let start = std::time::Instant::now();
    let r = parse_in(ws.path(), text);
    let took = start.elapsed();
    (r.expect_err("must be rejected").lines(), took)
}

/// Generous: linear parsing of 256 KiB takes milliseconds; the quadratic code took 1.6–1.9 s
/// for the env object and far longer for the error flood. Liveness, not speed.
const LINEAR_BOUND: Duration = Duration::from_secs(1);

#[test]
fn a_256_kib_env_object_parses_in_linear_time() {
    let mut env = String::new();
    let mut i = 0;
    while env.len() < 256 * 1024 - 200 {
        env.push_str(&format!("\"V{i}\":\"x\","));
        i += 1;
    }
    env.pop();
    let text = tc(&format!(r#"{{"command": "/bin/true", "env": {{{env}}}}}"#));
    assert!(text.len() <= 256 * 1024);
    let (errs, took) = timed_errors(&text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    check(
        &errs[0],
        "hooks.tool_call[0].env.V128",
        "too many variables: at most 128",
    );
    assert!(took < LINEAR_BOUND, "{i} distinct keys took {took:?}");
}

#[test]
fn a_256_kib_object_of_one_repeated_key_reports_capped_duplicates() {
    let mut env = String::new();
    let mut n = 0;
    while env.len() < 256 * 1024 - 200 {
        env.push_str("\"A\":\"x\",");
        n += 1;
    }
    env.pop();
    let text = tc(&format!(r#"{{"command": "/bin/true", "env": {{{env}}}}}"#));
    let (errs, took) = timed_errors(&text);
    assert_eq!(errs.len(), config::MAX_ERRORS + 1, "first N plus a count");
    check(
        &errs[0],
        "hooks.tool_call[0].env.A",
        "duplicate key (first at 1:",
    );
    let last = errs.last().unwrap();
    check(
        last,
        "$",
        &format!(
            "and {} more errors (only the first {} are shown)",
            n - 1 - config::MAX_ERRORS,
            config::MAX_ERRORS
        ),
    );
    assert!(took < LINEAR_BOUND, "{n} duplicate keys took {took:?}");
}

/// A hostile file: 256 KiB of `{}` hooks gave 87 k errors and 8.9 MB of text (logged on
/// every rejected reload and kept in `last_error` while the file is rejected).
#[test]
fn a_256_kib_file_of_empty_hooks_gives_the_first_errors_and_a_count() {
    let n = (256 * 1024 - 40) / 3;
    let items = vec!["{}"; n].join(",");
    let text = format!("{{\"hooks\": {{\"tool_call\": [{items}]}}}}");
    assert!(text.len() <= 256 * 1024);
    let ws = workspace();
    let start = std::time::Instant::now();
    let errs = parse_in(ws.path(), &text).unwrap_err();
    let took = start.elapsed();
    let lines = errs.lines();
    assert_eq!(lines.len(), config::MAX_ERRORS + 1, "first N plus a count");
    check(&lines[0], "hooks.tool_call[0]", "missing \"command\"");
    check(&lines[1], "hooks.tool_call[1]", "missing \"command\"");
    // n hooks without a command, plus "too many hooks" at the 257th.
    let total = n + 1;
    check(
        lines.last().unwrap(),
        "$",
        &format!(
            "and {} more errors (only the first {} are shown)",
            total - config::MAX_ERRORS,
            config::MAX_ERRORS
        ),
    );
    let text_size = errs.to_string().len();
    assert!(text_size < 32 * 1024, "{text_size} bytes of error text");
    assert!(took < LINEAR_BOUND, "{n} errors took {took:?}");
}

/// Many identical hooks (each fine, but too many): their derived ids are numbered without a
/// rescan per hook.
#[test]
fn many_identical_hooks_are_rejected_in_linear_time() {
    let one = r#"{"command":"/bin/true"}"#;
    let n = (256 * 1024 - 40) / (one.len() + 1);
    let text = format!(
        "{{\"hooks\": {{\"tool_call\": [{}]}}}}",
        vec![one; n].join(",")
    );
    let (errs, took) = timed_errors(&text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    check(
        &errs[0],
        "hooks.tool_call[256]",
        "too many hooks: at most 256",
    );
    assert!(took < LINEAR_BOUND, "{n} hooks took {took:?}");
}
