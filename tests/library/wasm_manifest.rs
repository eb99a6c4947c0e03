//! plugin.toml loading and validation (ARCHITECTURE.md § WASM plugins): the compat sample and PRX's documented
//! shape load; one test per rule, each asserting the exact message — file, line, column, key
//! path and reason. Real files in temporary workspaces; nothing is mocked, no wasm is compiled
//! (a few bytes stand in for the component).

use prx_hooks::config::ConfigErrors;
use prx_hooks::event::{EventKind, EventMask};
use prx_hooks::wasm::manifest::{self, Manifest, Resources};
use std::path::{Path, PathBuf};
use tempfile::TempDir;

/// A workspace with `plugins/<name>/` holding `plugin.wasm` (a stand-in) and `plugin.toml`.
fn plugin(name: &str, toml: &str) -> (TempDir, PathBuf) {
    let ws = tempfile::tempdir().expect("temp dir");
    let dir = add_plugin(ws.path(), name, toml);
    (ws, dir)
}

fn add_plugin(ws: &Path, name: &str, toml: &str) -> PathBuf {
    let dir = ws.join("plugins").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin.wasm"), b"\0asm\x0d\0\x01\0").unwrap();
    std::fs::write(dir.join("plugin.toml"), toml).unwrap();
    dir
}

fn label(dir: &Path) -> String {
    dir.join("plugin.toml").display().to_string()
}

fn load_ok(dir: &Path) -> Manifest {
    manifest::load(dir).unwrap_or_else(|e| panic!("rejected:\n{e}"))
}

/// Every error line of `dir`'s manifest, which must be rejected; each is one line that starts
/// with the file's label.
fn errors(dir: &Path) -> Vec<String> {
    check_lines(dir, manifest::load(dir))
}

fn check_lines(dir: &Path, r: Result<Manifest, ConfigErrors>) -> Vec<String> {
    let errs = match r {
        Ok(m) => panic!("accepted, expected an error: {m:#?}"),
        Err(e) => e,
    };
    let lines = errs.lines();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(!l.contains(['\n', '\r']), "error spans lines: {l:?}");
        assert!(l.starts_with(&format!("{}:", label(dir))), "{l}");
    }
    lines
}

/// The errors of a manifest `text` for plugin `p`, with the label replaced by `F`.
fn errs_of(text: &str) -> Vec<String> {
    let (_ws, dir) = plugin("p", text);
    let prefix = label(&dir);
    errors(&dir)
        .into_iter()
        .map(|l| format!("F{}", &l[prefix.len()..]))
        .collect()
}

/// The warnings of a manifest `text` for plugin `p`, which must be accepted, with the label
/// replaced by `F`.
fn warns_of(text: &str) -> Vec<String> {
    let (_ws, dir) = plugin("p", text);
    let prefix = label(&dir);
    load_ok(&dir)
        .warnings
        .iter()
        .map(|w| format!("F{}", &w.to_string()[prefix.len()..]))
        .collect()
}

/// `[plugin]` for `p` (lines 1-3), then `rest` from line 4.
fn with(rest: &str) -> String {
    format!("[plugin]\nname = \"p\"\nversion = \"0.1.0\"\n{rest}")
}

const HOOK: &str = "[[capabilities]]\ntype = \"hook\"\nevents = [\"prx.lifecycle.*\"]\n";

fn all_but(kinds: &[EventKind]) -> EventMask {
    EventKind::ALL
        .into_iter()
        .filter(|k| !kinds.contains(k))
        .fold(EventMask::NONE, |m, k| m | k.mask())
}

fn mask(kinds: &[EventKind]) -> EventMask {
    kinds.iter().fold(EventMask::NONE, |m, k| m | k.mask())
}

// ---------------------------------------------------------------------------------------------
// What loads.

#[test]
fn compat_plugin_toml_loads_unchanged() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prx/plugin.toml");
    let text = std::fs::read_to_string(&src).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (the PRX samples in tests/fixtures/prx)",
            src.display()
        )
    });
    let (_ws, dir) = plugin("compat", &text);
    let m = load_ok(&dir);
    assert_eq!(m.name, "compat");
    assert_eq!(m.version, "0.1.0");
    assert_eq!(m.description.as_deref(), Some("Counts lifecycle events"));
    assert_eq!(m.author.as_deref(), Some("Example Author"));
    assert_eq!(m.license.as_deref(), Some("MIT"));
    assert_eq!(m.dir, dir);
    assert_eq!(m.file, label(&dir));
    assert_eq!(m.wasm, dir.join("plugin.wasm"));
    assert_eq!(
        m.resources,
        Resources {
            max_fuel: 50_000_000,
            max_memory_mb: 8,
            max_execution_time_ms: 500,
            max_kv_storage_mb: 1,
            pool_size: 1,
        }
    );
    assert!(m.permissions.events);
    assert_eq!(m.permissions.required, ["log", "kv", "events"]);
    assert!(m.permissions.optional.is_empty());
    assert!(
        m.permissions.http_allowlist.is_empty() && m.permissions.filesystem_allowlist.is_empty()
    );
    assert_eq!(m.patterns, ["prx.lifecycle.*"]);
    assert_eq!(m.events, EventMask::ALL);
    assert_eq!(m.config.get("greeting").map(String::as_str), Some("hello"));
    assert_eq!(m.config.len(), 1);
    assert_eq!(m.capabilities.len(), 1);
    let c = &m.capabilities[0];
    assert!(c.is_hook());
    assert_eq!(c.name.as_deref(), Some("count-events"));
    assert_eq!(c.description.as_deref(), Some("Observes lifecycle events"));
    assert_eq!(c.priority, Some(100));
    assert_eq!(c.events, ["prx.lifecycle.*"]);
}

/// The shape PRX's docs and examples use, with every key PRX reads.
const PRX_DOCS: &str = r#"# ── Required ──
[plugin]
name = "weather-audit"
version = "1.2.0"
description = "Audits tool calls"
wasm = "./build/../component.wasm"
author = "Your Name <you@example.com>"
license = "Apache-2.0"
api_version = "1"

[[capabilities]]
type = "tool"
name = "weather_lookup"
description = "Look up weather by city"
events = ["not checked for tools"]

[[capabilities]]
type = "hook"
name = "my_audit_hook"
description = "Observes tool calls"
priority = -5
events = ["agent_start", "LLM-Response"]

[[capabilities]]
type = "hook"

[[capabilities.events]]
pattern = "prx.lifecycle.tool_call"
description = "Tool invocations only"

[[capabilities.events]]
pattern = "tool.call"

[[capabilities]]
type = "cron"
schedule = "0 * * * *"

[permissions]
required = ["log", "config", "kv", "http-outbound"]
optional = ["memory", "events", "llm"]
http_allowlist = ["https://api.openweathermap.org/*", "https://wttr.in/*"]
filesystem_allowlist = ["/tmp/my-plugin/"]

[resources]
max_fuel = 100_000_000
max_memory_mb = 16
max_execution_time_ms = 5_000
max_http_requests_per_call = 10
max_http_requests = 10
max_kv_storage_kb = 1_536
pool_size = 4

[config]
api_key = "test-key"
max_items = 1_000
ratio = 0.5
debug = false
hex = 0x1F
"#;

#[test]
fn prx_documented_shape_loads() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().join("plugins/weather-audit");
    std::fs::create_dir_all(dir.join("build")).unwrap();
    std::fs::write(dir.join("component.wasm"), b"\0asm").unwrap();
    std::fs::write(dir.join("plugin.toml"), PRX_DOCS).unwrap();
    let m = load_ok(&dir);
    assert_eq!(m.name, "weather-audit");
    assert_eq!(m.version, "1.2.0");
    assert_eq!(m.author.as_deref(), Some("Your Name <you@example.com>"));
    assert_eq!(m.license.as_deref(), Some("Apache-2.0"));
    assert_eq!(m.wasm, dir.join("component.wasm"));
    assert_eq!(
        m.patterns,
        [
            "prx.lifecycle.agent_start",
            "prx.lifecycle.llm_response",
            "prx.lifecycle.tool_call",
            "tool.call"
        ]
    );
    assert_eq!(
        m.events,
        mask(&[
            EventKind::AgentStart,
            EventKind::LlmResponse,
            EventKind::ToolCall
        ])
    );
    let kinds: Vec<&str> = m.capabilities.iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, ["tool", "hook", "hook", "cron"]);
    assert_eq!(m.capabilities[0].events, ["not checked for tools"]);
    assert_eq!(m.capabilities[1].priority, Some(-5));
    assert_eq!(
        m.capabilities[2].events,
        ["prx.lifecycle.tool_call", "tool.call"]
    );
    assert_eq!(m.capabilities[3].schedule.as_deref(), Some("0 * * * *"));
    assert!(m.permissions.events);
    assert_eq!(m.permissions.optional, ["memory", "events", "llm"]);
    assert_eq!(
        m.permissions.http_allowlist,
        ["https://api.openweathermap.org/*", "https://wttr.in/*"]
    );
    assert_eq!(m.permissions.filesystem_allowlist, ["/tmp/my-plugin/"]);
    assert_eq!(
        m.resources,
        Resources {
            max_fuel: 100_000_000,
            max_memory_mb: 16,
            max_execution_time_ms: 5000,
            max_kv_storage_mb: 2, // 1536 KiB, rounded up
            pool_size: 4,
        }
    );
    let config: Vec<(&str, &str)> = m
        .config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        config,
        [
            ("api_key", "test-key"),
            ("debug", "false"),
            ("hex", "31"),
            ("max_items", "1000"),
            ("ratio", "0.5"),
        ]
    );
}

#[test]
fn defaults_apply() {
    let (_ws, dir) = plugin("p", &with(HOOK));
    let m = load_ok(&dir);
    assert_eq!(m.resources, Resources::default());
    assert_eq!(
        Resources::default(),
        Resources {
            max_fuel: 1_000_000_000,
            max_memory_mb: 64,
            max_execution_time_ms: 30_000,
            max_kv_storage_mb: 10,
            pool_size: 1,
        }
    );
    assert_eq!(m.wasm, dir.join("plugin.wasm"));
    assert!(!m.permissions.events && m.permissions.required.is_empty());
    assert!(m.config.is_empty() && m.description.is_none() && m.author.is_none());
    // A plugin without hook capabilities loads and wants nothing.
    let (_ws, dir) = plugin(
        "p",
        &with("[[capabilities]]\ntype = \"tool\"\nname = \"t\"\n"),
    );
    let m = load_ok(&dir);
    assert!(m.patterns.is_empty() && m.events.is_empty());
}

fn patterns_of(events: &str) -> (Vec<String>, EventMask) {
    let (_ws, dir) = plugin(
        "p",
        &with(&format!(
            "[[capabilities]]\ntype = \"hook\"\nevents = {events}\n"
        )),
    );
    let m = load_ok(&dir);
    (m.patterns, m.events)
}

#[test]
fn event_patterns_normalize() {
    use EventKind::*;
    // Exact bare names, every one of them, and PRX's spellings.
    let names: Vec<String> = EventKind::ALL
        .iter()
        .map(|k| format!("{:?}", k.name()))
        .collect();
    let (p, m) = patterns_of(&format!("[{}]", names.join(", ")));
    let topics: Vec<&str> = EventKind::ALL.iter().map(|k| k.topic()).collect();
    assert_eq!(p, topics);
    assert_eq!(m, EventMask::ALL);
    let (p, m) = patterns_of(r#"["LLM-Response", "Tool-Call-Start", "agent_stop"]"#);
    assert_eq!(
        p,
        [
            "prx.lifecycle.llm_response",
            "prx.lifecycle.tool_call_start",
            "prx.lifecycle.agent_end"
        ]
    );
    assert_eq!(m, mask(&[LlmResponse, ToolCallStart, AgentEnd]));
    // One topic.
    assert_eq!(
        patterns_of(r#"["prx.lifecycle.tool_call"]"#),
        (vec!["prx.lifecycle.tool_call".to_string()], ToolCall.mask())
    );
    // Every lifecycle event; everything.
    assert_eq!(
        patterns_of(r#"["prx.lifecycle.*"]"#),
        (vec!["prx.lifecycle.*".to_string()], EventMask::ALL)
    );
    assert_eq!(
        patterns_of(r#"["*"]"#),
        (vec!["*".to_string()], EventMask::ALL)
    );
    // Custom topics: kept, no lifecycle event.
    assert_eq!(
        patterns_of(r#"["myapp.audit.done", "myapp.jobs.*"]"#),
        (
            vec!["myapp.audit.done".to_string(), "myapp.jobs.*".to_string()],
            EventMask::NONE
        )
    );
    // A mixed list: strings and tables, repeats dropped, file order kept.
    let (p, m) = patterns_of(
        r#"["error", {pattern = "prx.lifecycle.agent_start", description = "start"}, "error", "myapp.x", {pattern = "prx.lifecycle.error"}]"#,
    );
    assert_eq!(
        p,
        [
            "prx.lifecycle.error",
            "prx.lifecycle.agent_start",
            "myapp.x"
        ]
    );
    assert_eq!(m, mask(&[Error, AgentStart]));
    assert_eq!(
        m,
        all_but(&[
            AgentEnd,
            LlmRequest,
            LlmResponse,
            ToolCallStart,
            ToolCall,
            TurnComplete
        ])
    );
}

#[test]
fn patterns_of_several_hooks_merge() {
    let (_ws, dir) = plugin(
        "p",
        &with(
            "[[capabilities]]\ntype = \"hook\"\nevents = [\"tool_call\"]\n\
             [[capabilities]]\ntype = \"tool\"\nevents = [\"agent_start\"]\n\
             [[capabilities]]\ntype = \"hook\"\nevents = [\"tool_call\", \"error\"]\n",
        ),
    );
    let m = load_ok(&dir);
    assert_eq!(
        m.patterns,
        ["prx.lifecycle.tool_call", "prx.lifecycle.error"]
    );
    assert_eq!(m.events, mask(&[EventKind::ToolCall, EventKind::Error]));
}

// ---------------------------------------------------------------------------------------------
// The file.

#[test]
fn manifest_may_not_be_a_symlink() {
    let (ws, dir) = plugin("p", "");
    let real = ws.path().join("real.toml");
    std::fs::write(&real, with(HOOK)).unwrap();
    std::fs::remove_file(dir.join("plugin.toml")).unwrap();
    std::os::unix::fs::symlink(&real, dir.join("plugin.toml")).unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:1:1: $: may not be a symbolic link; put the manifest itself in the plugin directory",
            label(&dir)
        )]
    );
}

#[test]
fn manifest_larger_than_256_kib_is_rejected() {
    let mut text = with(HOOK);
    text.push('#');
    text.push_str(&"x".repeat(256 * 1024 - text.len()));
    assert_eq!(text.len(), 256 * 1024);
    let (_ws, dir) = plugin("p", &text);
    load_ok(&dir); // exactly the limit
    text.push('x');
    std::fs::write(dir.join("plugin.toml"), &text).unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:1:1: $: the file is larger than 256 KiB (the limit)",
            label(&dir)
        )]
    );
    // parse() applies the same limit to text it is given.
    let e = manifest::parse(&text, "x/plugin.toml", &dir).unwrap_err();
    assert_eq!(
        e.lines(),
        ["x/plugin.toml:1:1: $: the file is larger than 256 KiB (the limit)"]
    );
}

#[test]
fn manifest_must_be_utf8() {
    let (_ws, dir) = plugin("p", "");
    let mut bytes = with("description = \"caf").into_bytes();
    bytes.extend_from_slice(b"\xe9\"\n");
    std::fs::write(dir.join("plugin.toml"), bytes).unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:4:19: $: invalid UTF-8 at byte 56; plugin.toml must be UTF-8",
            label(&dir)
        )]
    );
}

#[test]
fn missing_manifest_is_reported() {
    let ws = tempfile::tempdir().unwrap();
    let dir = ws.path().join("plugins/p");
    std::fs::create_dir_all(&dir).unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:1:1: $: no plugin.toml: every directory in plugins/ is a plugin and needs one \
             (directories whose name starts with '.' are ignored)",
            label(&dir)
        )]
    );
}

#[test]
fn toml_syntax_errors_are_located() {
    assert_eq!(
        errs_of("[plugin]\nname = \"p\nversion = \"0.1.0\"\n"),
        ["F:2:10: $: invalid TOML: invalid basic string, expected `\"`"]
    );
    assert_eq!(
        errs_of(&with("version = \"0.2.0\"\n")),
        ["F:4:1: $: invalid TOML: duplicate key"]
    );
    assert_eq!(
        errs_of(&with("[resources]\nmax_fuel = 1\n[resources]\n")),
        ["F:6:2: $: invalid TOML: duplicate key"]
    );
}

// ---------------------------------------------------------------------------------------------
// [plugin]

#[test]
fn missing_plugin_table() {
    assert_eq!(
        errs_of(HOOK),
        [
            "F:1:1: plugin: missing [plugin] (required): the table with the plugin's \"name\" and \"version\""
        ]
    );
}

#[test]
fn a_name_that_differs_from_the_directory_is_a_warning_and_the_directory_names_it() {
    let (_ws, dir) = plugin("audit", &with(HOOK));
    let m = load_ok(&dir);
    assert_eq!(m.name, "audit");
    assert_eq!(m.declared_name.as_deref(), Some("p"));
    let lines: Vec<String> = m.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        lines,
        [format!(
            "{}:2:8: plugin.name: the name \"p\" differs from the plugin's directory name \
             \"audit\"; the directory's name is used (it keys kv, stats and metric labels)",
            label(&dir)
        )]
    );
}

#[test]
fn name_must_be_valid() {
    // The directory's name is the plugin's: a written name that is no valid name only warns…
    let (_ws, dir) = plugin(
        "p",
        "[plugin]\nname = \"my plugin!\"\nversion = \"1\"\n[[capabilities]]\ntype = \"hook\"\nevents = [\"*\"]\n",
    );
    let m = load_ok(&dir);
    assert_eq!(m.name, "p");
    assert!(
        m.warnings[0]
            .reason
            .contains("differs from the plugin's directory name")
    );
    // …a directory whose name is not a valid plugin name is an error.
    let long = "n".repeat(65);
    let (_ws, dir) = plugin(
        &long,
        &format!("[plugin]\nname = \"{long}\"\nversion = \"1\"\n"),
    );
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:2:8: plugin.name: the plugin's directory name \"{}…\" is not a valid plugin \
             name (1 to 64 characters of A-Z a-z 0-9 _ -); rename the directory",
            label(&dir),
            &long[..64]
        )]
    );
    assert_eq!(
        errs_of("[plugin]\nname = 7\nversion = \"1\"\n"),
        ["F:2:8: plugin.name: expected a string, found 7"]
    );
}

#[test]
fn name_and_version_are_required() {
    assert_eq!(
        errs_of("\n[plugin]\nname = \"p\"\n"),
        ["F:2:1: plugin: missing \"version\" (required): the plugin's version, such as \"0.1.0\""]
    );
    assert_eq!(
        errs_of("[plugin]\nversion = \"1\"\n"),
        [
            "F:1:1: plugin: missing \"name\" (required): the plugin's name, equal to its directory's name"
        ]
    );
    assert_eq!(
        errs_of("[plugin]\nname = \"p\"\nversion = \" \"\n"),
        ["F:3:11: plugin.version: may not be empty: the plugin's version, such as \"0.1.0\""]
    );
}

#[test]
fn wasm_may_not_escape_with_dotdot() {
    assert_eq!(
        errs_of("[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"../x.wasm\"\n"),
        [
            "F:4:8: plugin.wasm: \"../x.wasm\" is outside the plugin directory; the component must be inside it"
        ]
    );
    assert_eq!(
        errs_of("[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"a/../../p/plugin.wasm\"\n"),
        [
            "F:4:8: plugin.wasm: \"a/../../p/plugin.wasm\" is outside the plugin directory; the component must be inside it"
        ]
    );
}

#[test]
fn wasm_may_not_be_absolute() {
    let (_ws, dir) = plugin("p", "");
    let abs = dir.join("plugin.wasm").display().to_string();
    std::fs::write(
        dir.join("plugin.toml"),
        format!("[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"{abs}\"\n"),
    )
    .unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:4:8: plugin.wasm: \"{abs}\" is an absolute path; \"wasm\" is relative to the \
             plugin directory, such as \"plugin.wasm\"",
            label(&dir)
        )]
    );
}

#[test]
fn wasm_symlink_may_not_lead_outside() {
    let (ws, dir) = plugin(
        "p",
        "[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"out.wasm\"\n",
    );
    let outside = ws.path().join("elsewhere.wasm");
    std::fs::write(&outside, b"\0asm").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("out.wasm")).unwrap();
    let canon = outside.canonicalize().unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:4:8: plugin.wasm: \"out.wasm\" leads outside the plugin directory through a \
             symbolic link (to \"{}\")",
            label(&dir),
            canon.display()
        )]
    );
    // Through a symlinked directory too; a symlink that stays inside is fine.
    std::fs::remove_file(dir.join("out.wasm")).unwrap();
    std::os::unix::fs::symlink(ws.path(), dir.join("up")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        "[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"up/elsewhere.wasm\"\n",
    )
    .unwrap();
    assert!(errors(&dir)[0].contains("leads outside the plugin directory through a symbolic link"));
    std::os::unix::fs::symlink("plugin.wasm", dir.join("in.wasm")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        "[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"in.wasm\"\n",
    )
    .unwrap();
    assert_eq!(load_ok(&dir).wasm, dir.join("in.wasm"));
}

#[test]
fn missing_wasm_names_the_full_path() {
    let (_ws, dir) = plugin(
        "p",
        "[plugin]\nname = \"p\"\nversion = \"1\"\nwasm = \"target/p.wasm\"\n",
    );
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:4:8: plugin.wasm: \"target/p.wasm\" does not exist (looked for \"{}\"); build the \
             plugin first (for a Rust guest: cargo build --release --target wasm32-wasip2) and \
             copy the component there",
            label(&dir),
            dir.join("target/p.wasm").display()
        )]
    );
    // The default, when plugin.wasm is missing: pointed at [plugin].
    let (_ws, dir) = plugin("p", &with(HOOK));
    std::fs::remove_file(dir.join("plugin.wasm")).unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:1:1: plugin: \"plugin.wasm\" (the default \"wasm\") does not exist (looked for \
             \"{}\"); build the plugin first (for a Rust guest: cargo build --release --target \
             wasm32-wasip2) and copy the component there",
            label(&dir),
            dir.join("plugin.wasm").display()
        )]
    );
    // A directory is not a component.
    std::fs::create_dir(dir.join("plugin.wasm")).unwrap();
    assert_eq!(
        errors(&dir),
        [format!(
            "{}:1:1: plugin: \"plugin.wasm\" (the default \"wasm\") (\"{}\") is not a regular file",
            label(&dir),
            dir.join("plugin.wasm").display()
        )]
    );
}

// ---------------------------------------------------------------------------------------------
// [resources]

#[test]
fn resources_out_of_range() {
    let cases = [
        ("max_fuel = 0", "expected an integer of at least 1, found 0"),
        (
            "max_fuel = -1",
            "expected an integer of at least 1, found -1",
        ),
        (
            "max_memory_mb = 0",
            "expected an integer between 1 and 4096, found 0",
        ),
        (
            "max_memory_mb = 4_097",
            "expected an integer between 1 and 4096, found 4_097",
        ),
        (
            "max_execution_time_ms = 0",
            "expected an integer between 1 and 3600000, found 0",
        ),
        (
            "max_execution_time_ms = 3_600_001",
            "expected an integer between 1 and 3600000, found 3_600_001",
        ),
        (
            "max_kv_storage_mb = -1",
            "expected an integer between 0 and 1024, found -1",
        ),
        (
            "max_kv_storage_mb = 1025",
            "expected an integer between 0 and 1024, found 1025",
        ),
        (
            "pool_size = 65",
            "expected an integer between 0 and 64, found 65",
        ),
        (
            "pool_size = -1",
            "expected an integer between 0 and 64, found -1",
        ),
        (
            "max_kv_storage_kb = 1048577",
            "expected an integer between 0 and 1048576, found 1048577",
        ),
        (
            "max_http_requests_per_call = 4294967296",
            "expected an integer between 0 and 4294967295, found 4294967296",
        ),
    ];
    for (line, reason) in cases {
        let key = line.split(' ').next().unwrap();
        let col = key.len() + 4;
        assert_eq!(
            errs_of(&with(&format!("{HOOK}[resources]\n{line}\n"))),
            [format!("F:8:{col}: resources.{key}: {reason}")],
            "{line}"
        );
    }
}

#[test]
fn resources_of_the_wrong_type() {
    let cases = [
        (
            "max_fuel = \"1000\"",
            "expected an integer of at least 1, found the string \"1000\"",
        ),
        (
            "max_memory_mb = 64.0",
            "expected an integer between 1 and 4096, found 64.0",
        ),
        (
            "max_execution_time_ms = true",
            "expected an integer between 1 and 3600000, found true",
        ),
        (
            "max_kv_storage_mb = [1]",
            "expected an integer between 0 and 1024, found an array",
        ),
        (
            "pool_size = {n = 1}",
            "expected an integer between 0 and 64, found a table",
        ),
        (
            "max_fuel = 1979-05-27",
            "expected an integer of at least 1, found the date-time 1979-05-27",
        ),
        (
            "max_fuel = 99999999999999999999999",
            "expected an integer of at least 1, found 99999999999999999999999",
        ),
    ];
    for (line, reason) in cases {
        let key = line.split(' ').next().unwrap();
        let col = key.len() + 4;
        assert_eq!(
            errs_of(&with(&format!("{HOOK}[resources]\n{line}\n"))),
            [format!("F:8:{col}: resources.{key}: {reason}")],
            "{line}"
        );
    }
    assert_eq!(
        errs_of(&format!("resources = 5\n{}", with(HOOK))),
        ["F:1:13: resources: expected a table ([resources]), found 5"]
    );
}

#[test]
fn resources_in_range_and_pool_size_zero() {
    let (_ws, dir) = plugin(
        "p",
        &with(&format!(
            "{HOOK}[resources]\nmax_fuel = 9_223_372_036_854_775_807\nmax_memory_mb = 4096\n\
             max_execution_time_ms = 0x36EE80\nmax_kv_storage_mb = 0\npool_size = 0\n\
             max_kv_storage_kb = 5000\n"
        )),
    );
    let r = load_ok(&dir).resources;
    assert_eq!(
        r,
        Resources {
            max_fuel: i64::MAX as u64,
            max_memory_mb: 4096,
            max_execution_time_ms: 3_600_000,
            max_kv_storage_mb: 0, // max_kv_storage_mb wins over max_kv_storage_kb
            pool_size: 1,         // 0 means the default
        }
    );
    let (_ws, dir) = plugin("p", &with(&format!("{HOOK}[resources]\npool_size = 64\n")));
    assert_eq!(load_ok(&dir).resources.pool_size, 64);
}

// ---------------------------------------------------------------------------------------------
// Unknown keys.

#[test]
fn unknown_keys_are_errors_with_did_you_mean() {
    assert_eq!(
        errs_of(&with(&format!("{HOOK}[resources]\nmax_memroy_mb = 8\n"))),
        [
            "F:8:1: resources.max_memroy_mb: unknown key \"max_memroy_mb\"; did you mean \"max_memory_mb\"?"
        ]
    );
    // At the top level and in [plugin], PRX ignores unknown keys: warnings, with the hint.
    assert_eq!(
        warns_of(&with(&format!("wasmm = \"plugin.wasm\"\n{HOOK}"))),
        [
            "F:4:1: plugin.wasmm: unknown key \"wasmm\"; did you mean \"wasm\"? (ignored, as PRX does)"
        ]
    );
    assert_eq!(
        warns_of(&with(&format!("{HOOK}[permision]\nrequired = []\n"))),
        [
            "F:7:2: permision: unknown key \"permision\"; did you mean \"permissions\"? (ignored, as PRX does)"
        ]
    );
    assert_eq!(
        errs_of(&with("[permissions]\nrequried = [\"kv\"]\n")),
        ["F:5:1: permissions.requried: unknown key \"requried\"; did you mean \"required\"?"]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\nevent = [\"error\"]\nevents = [\"error\"]\n"
        )),
        ["F:6:1: capabilities[0].event: unknown key \"event\"; did you mean \"events\"?"]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\n[[capabilities.events]]\npatern = \"error\"\npattern = \"error\"\n"
        )),
        [
            "F:7:1: capabilities[0].events[0].patern: unknown key \"patern\"; did you mean \"pattern\"?"
        ]
    );
    // Far from every key: the keys that are allowed, or where it belongs.
    assert_eq!(
        errs_of(&with(&format!("{HOOK}trigger = \"events.*\"\n"))),
        [
            "F:7:1: capabilities[0].trigger: unknown key \"trigger\"; expected one of type, name, \
          description, priority, events, schedule"
        ]
    );
    assert_eq!(
        warns_of(&with(&format!("{HOOK}[http_allowlist]\n"))),
        [
            "F:7:2: http_allowlist: unknown key \"http_allowlist\"; \"http_allowlist\" belongs in \
             [permissions] (ignored, as PRX does)"
        ]
    );
    assert_eq!(
        warns_of(&with(&format!("pool_size = 2\n{HOOK}"))),
        [
            "F:4:1: plugin.pool_size: unknown key \"pool_size\"; \"pool_size\" belongs in \
             [resources] (ignored, as PRX does)"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// [[capabilities]] and events.

#[test]
fn unknown_event_name_with_did_you_mean() {
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\nevents = [\"tool_call\", \"tool_cal\"]\n"
        )),
        [
            "F:6:24: capabilities[0].events[1]: unknown event \"tool_cal\"; did you mean \"tool_call\"?"
        ]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\n\n[[capabilities.events]]\npattern = \"prx.lifecycle.turn_completed\"\n"
        )),
        [
            "F:8:11: capabilities[0].events[0].pattern: unknown lifecycle event \"turn_completed\"; \
          did you mean \"prx.lifecycle.turn_complete\"?"
        ]
    );
    let e = errs_of(&with(
        "[[capabilities]]\ntype = \"hook\"\nevents = [\"session_start\"]\n",
    ));
    assert_eq!(
        e,
        [
            "F:6:11: capabilities[0].events[0]: unknown event \"session_start\"; expected one of \
          agent_start, agent_end, llm_request, llm_response, tool_call_start, tool_call, \
          turn_complete, error, a topic pattern such as \"prx.lifecycle.*\", or \"*\""
        ]
    );
}

#[test]
fn bad_patterns() {
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\nevents = [\"myapp..x\", \"a.*.b\", \"\"]\n"
        )),
        [
            "F:6:11: capabilities[0].events[0]: invalid pattern \"myapp..x\": segment 2 is empty; \
             use an event name such as \"tool_call\", an exact topic, a prefix ending in \".*\", or \"*\"",
            "F:6:23: capabilities[0].events[1]: invalid pattern \"a.*.b\": character '*' is not \
             allowed; use an event name such as \"tool_call\", an exact topic, a prefix ending in \".*\", or \"*\"",
            "F:6:32: capabilities[0].events[2]: an empty pattern matches nothing; write an event \
             name such as \"tool_call\", a topic pattern such as \"prx.lifecycle.*\", or \"*\"",
        ]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\nevents = [\"PRX.LIFECYCLE.ERROR\"]\n"
        )),
        [
            "F:6:11: capabilities[0].events[0]: topics are case-sensitive; did you mean \"prx.lifecycle.error\"?"
        ]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\nevents = \"prx.lifecycle.*\"\n"
        )),
        [
            "F:6:10: capabilities[0].events: expected an array of event patterns, such as \
          [\"prx.lifecycle.*\"], found the string \"prx.lifecycle.*\""
        ]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\nevents = [3, {description = \"x\"}]\n"
        )),
        [
            "F:6:11: capabilities[0].events[0]: expected an event pattern (a string) or a table \
             with a \"pattern\", found 3",
            "F:6:14: capabilities[0].events[1]: missing \"pattern\" (required): the event or topic \
             pattern, such as \"prx.lifecycle.*\"",
        ]
    );
    // Other capability types: the shape is checked, the patterns are not.
    let (_ws, dir) = plugin(
        "p",
        &with(
            "[[capabilities]]\ntype = \"middleware\"\nevents = [\"what.ever..\", {pattern = \"\"}]\n",
        ),
    );
    assert!(load_ok(&dir).patterns.is_empty());
}

#[test]
fn hook_capability_rules() {
    assert_eq!(
        errs_of(&with("[[capabilities]]\ntype = \"hook\"\nname = \"h\"\n")),
        [
            "F:4:1: capabilities[0]: missing \"events\": a hook receives only the events it lists, \
          such as events = [\"prx.lifecycle.*\"] or [[capabilities.events]] tables with a \"pattern\""
        ]
    );
    assert_eq!(
        errs_of(&with("[[capabilities]]\ntype = \"hook\"\nevents = []\n")),
        [
            "F:6:10: capabilities[0].events: lists no events: a hook receives only the events it \
          lists, such as [\"prx.lifecycle.*\"]"
        ]
    );
    assert_eq!(
        errs_of(&with("[[capabilities]]\nname = \"h\"\n")),
        [
            "F:4:1: capabilities[0]: missing \"type\" (required): \"hook\" for a plugin that receives lifecycle events"
        ]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hok\"\nevents = [\"*\"]\n"
        )),
        ["F:5:8: capabilities[0].type: unknown capability type \"hok\"; did you mean \"hook\"?"]
    );
    assert_eq!(
        errs_of(&with(
            "[[capabilities]]\ntype = \"hook\"\npriority = 1.5\nevents = [\"*\"]\n"
        )),
        [
            "F:6:12: capabilities[0].priority: expected an integer between -2147483648 and 2147483647, found 1.5"
        ]
    );
    assert_eq!(
        errs_of(&with("[capabilities]\ntype = \"hook\"\n")),
        ["F:4:1: capabilities: expected an array of tables ([[capabilities]]), found a table"]
    );
    // A type that is no near miss is accepted and ignored (PRX may add types).
    let (_ws, dir) = plugin("p", &with("[[capabilities]]\ntype = \"widget\"\n"));
    assert_eq!(load_ok(&dir).capabilities[0].kind, "widget");
}

// ---------------------------------------------------------------------------------------------
// [permissions] and [config]

#[test]
fn unknown_permission() {
    assert_eq!(
        errs_of(&with(&format!(
            "{HOOK}[permissions]\nrequired = [\"log\", \"evnets\"]\noptional = [\"http\", \"gpu\"]\n"
        ))),
        [
            "F:8:20: permissions.required[1]: unknown permission \"evnets\"; did you mean \"events\"?",
            "F:9:13: permissions.optional[0]: unknown permission \"http\"; did you mean \"http-outbound\"?",
            "F:9:21: permissions.optional[1]: unknown permission \"gpu\"; expected one of log, config, \
             kv, events, clock, memory, http-outbound, websocket-outbound, filesystem, llm, messaging",
        ]
    );
    assert_eq!(
        errs_of(&with(&format!(
            "{HOOK}[permissions]\nhttp_allowlist = \"https://x\"\n"
        ))),
        [
            "F:8:18: permissions.http_allowlist: expected an array of strings, found the string \"https://x\""
        ]
    );
    // "events" in optional grants it too.
    let (_ws, dir) = plugin(
        "p",
        &with(&format!("{HOOK}[permissions]\noptional = [\"events\"]\n")),
    );
    assert!(load_ok(&dir).permissions.events);
}

#[test]
fn config_values() {
    assert_eq!(
        errs_of(&with(&format!(
            "{HOOK}[config]\ntags = [\"a\", \"b\"]\n\"my key\" = {{ x = 1 }}\n"
        ))),
        [
            "F:8:8: config.tags: expected a string, number or boolean ([config] values reach the \
             plugin as strings; write a list as one string, such as \"a,b\"), found an array",
            "F:9:12: config.\"my key\": expected a string, number or boolean ([config] values reach \
             the plugin as strings; write a list as one string, such as \"a,b\"), found a table",
        ]
    );
    let (_ws, dir) = plugin(
        "p",
        &with(&format!(
            "{HOOK}[config]\ns = \"x\"\ni = -1_000\nf = 1e3\nb = true\nd = 1979-05-27T07:32:00Z\n\"\" = \"\"\n"
        )),
    );
    let c = load_ok(&dir).config;
    let got: Vec<(&str, &str)> = c.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        got,
        [
            ("", ""),
            ("b", "true"),
            ("d", "1979-05-27T07:32:00Z"),
            ("f", "1e3"),
            ("i", "-1000"),
            ("s", "x")
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Several at once.

#[test]
fn every_error_is_reported_in_file_order() {
    let text = "\
[plugin]
name = \"p\"
wasm = \"../escape.wasm\"
colour = \"red\"

[[capabilities]]
type = \"hook\"
events = [\"tool_cal\", \"prx.lifecycle.*\"]

[permissions]
required = [\"kv\", \"event\"]

[resources]
max_memory_mb = 0
max_fuel = 10
pool_size = \"2\"

[config]
list = []
";
    assert_eq!(
        errs_of(text),
        [
            "F:1:1: plugin: missing \"version\" (required): the plugin's version, such as \"0.1.0\"",
            "F:3:8: plugin.wasm: \"../escape.wasm\" is outside the plugin directory; the component must be inside it",
            // (`colour` in [plugin] is a warning: PRX ignores unknown keys there.)
            "F:8:11: capabilities[0].events[0]: unknown event \"tool_cal\"; did you mean \"tool_call\"?",
            "F:11:19: permissions.required[1]: unknown permission \"event\"; did you mean \"events\"?",
            "F:14:17: resources.max_memory_mb: expected an integer between 1 and 4096, found 0",
            "F:16:13: resources.pool_size: expected an integer between 0 and 64, found the string \"2\"",
            "F:19:8: config.list: expected a string, number or boolean ([config] values reach the \
             plugin as strings; write a list as one string, such as \"a,b\"), found an array",
        ]
    );
}

#[test]
fn parse_without_a_directory_name_skips_the_name_check() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("plugin.wasm"), b"\0asm").unwrap();
    // `<ws>/sub/..` has no file name to compare with.
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let dir = ws.path().join("sub/..");
    assert_eq!(dir.file_name(), None);
    let m = manifest::parse(&with(HOOK), "plugin.toml", &dir).unwrap();
    assert_eq!(m.name, "p");
    assert_eq!(m.file, "plugin.toml");
    assert_eq!(manifest::file_label(Path::new(".")), "plugin.toml");
    assert_eq!(
        manifest::file_label(Path::new("ws/plugins/a")),
        "ws/plugins/a/plugin.toml"
    );
}

// ---------------------------------------------------------------------------------------------
// scan

#[test]
fn scan_loads_every_plugin_in_name_order() {
    let ws = tempfile::tempdir().unwrap();
    let w = ws.path();
    assert_eq!(
        manifest::scan(w),
        (Vec::new(), Vec::new()),
        "no plugins/ directory"
    );
    for name in ["zeta", "alpha", "mid"] {
        add_plugin(
            w,
            name,
            &format!("[plugin]\nname = \"{name}\"\nversion = \"1\"\n{HOOK}"),
        );
    }
    // Broken ones do not keep the good ones from loading.
    add_plugin(w, "broken", "[plugin]\nname = \"broken\"\n");
    std::fs::create_dir_all(w.join("plugins/empty")).unwrap();
    // Hidden directories and plain files are ignored.
    std::fs::create_dir_all(w.join("plugins/.cache")).unwrap();
    add_plugin(w, ".disabled", "garbage = [");
    std::fs::write(w.join("plugins/README.md"), "notes").unwrap();
    let (manifests, errors) = manifest::scan(w);
    let names: Vec<&str> = manifests.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["alpha", "mid", "zeta"]);
    assert_eq!(manifests[0].dir, w.join("plugins/alpha"));
    let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        lines,
        [format!(
            "{}:1:1: plugin: missing \"version\" (required): the plugin's version, such as \"0.1.0\"",
            label(&w.join("plugins/broken"))
        ),]
    );
    // A directory without plugin.toml is skipped with a warning (PRX does not require one).
    let scan = manifest::scan_all(w);
    let warnings: Vec<String> = scan.warnings.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        warnings,
        [format!(
            "{}:1:1: $: no plugin.toml: the directory is skipped (a plugin needs one to say which \
             events it takes)",
            label(&w.join("plugins/empty"))
        )]
    );
    // A plugin without a hook capability (a PRX tool) is skipped, said with its kind.
    add_plugin(
        w,
        "tool",
        "[plugin]\nname = \"tool\"\nversion = \"1\"\n[[capabilities]]\ntype = \"tool\"\n",
    );
    let scan = manifest::scan_all(w);
    assert_eq!(
        scan.skipped,
        [("tool".to_string(), "a tool plugin, not a hook".to_string())]
    );
    assert_eq!(scan.manifests.len(), 3);
}

#[test]
fn scan_reports_an_unreadable_plugins_path() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("plugins"), "not a directory").unwrap();
    let (m, e) = manifest::scan(ws.path());
    assert!(m.is_empty());
    assert_eq!(e.len(), 1);
    let line = e[0].to_string();
    assert!(
        line.starts_with(&format!(
            "{}:1:1: $: cannot read the plugins directory: ",
            ws.path().join("plugins").display()
        )),
        "{line}"
    );
}

/// A plugin.toml swapped for a FIFO between the check of the name and the open (by another
/// process renaming files into place, as fast as it can): a load must never wait for a writer.
/// Before, `load` examined the path, then opened it with a blocking open(2): when the FIFO
/// landed in between, the load (and with it the watcher's reload, and the shutdown that joins
/// the watcher) waited forever.
#[test]
fn a_manifest_swapped_for_a_fifo_mid_load_never_blocks_it() {
    let toml = "[plugin]\nname = \"p\"\nversion = \"0.1.0\"\n\n[[capabilities]]\ntype = \"hook\"\nevents = [\"*\"]\n";
    let (_ws, dir) = plugin("p", toml);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let (file, fifo) = (dir.join(".file"), dir.join(".fifo"));
            let fifo_c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::write(&file, toml).unwrap();
                std::fs::rename(&file, dir.join("plugin.toml")).unwrap();
                // SAFETY: a NUL-terminated path; mkfifo(3) only creates a node.
                assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o600) }, 0);
                std::fs::rename(&fifo, dir.join("plugin.toml")).unwrap();
                n += 1;
            }
            n
        })
    };
    // Loads for 5 s (tens of thousands: the window is a few microseconds wide, and was hit
    // within a few thousand loads before); each must return.
    let (tx, rx) = std::sync::mpsc::channel();
    let loader = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < until {
                // Refused (not a regular file, or replaced while read) or loaded: either is fine.
                let _ = manifest::load(&dir);
                tx.send(()).unwrap();
            }
        })
    };
    let mut loads = 0u64;
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(()) => loads += 1,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("a load has waited for 10 s (after {loads} loads): it opened a FIFO");
            }
        }
    }
    assert!(loads > 1000, "only {loads} loads");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    loader.join().unwrap();
    assert!(swapper.join().unwrap() > 100, "the swapper hardly ran");
}

// ---------------------------------------------------------------------------------------------
// `[policy]`: a WASM policy (docs/policies.md § WASM policies).

#[test]
fn a_policy_section_loads_with_its_defaults_and_a_policy_only_plugin_is_not_skipped() {
    use prx_hooks::policy::{DecisionPoint, OnError};
    let (ws, dir) = plugin(
        "p",
        &with("[policy]\non = [\"tool_call_start\", \"permission\"]\n"),
    );
    let m = load_ok(&dir);
    let p = m.policy.as_ref().expect("a policy");
    assert_eq!(p.id, "p", "the id defaults to the plugin's name");
    assert_eq!(
        p.on,
        vec![DecisionPoint::ToolCallStart, DecisionPoint::Permission]
    );
    assert_eq!(p.timeout_ms, prx_hooks::policy::DEFAULT_TIMEOUT_MS);
    assert_eq!(p.on_error, OnError::None);
    assert!(!m.is_hook() && m.is_policy());
    // Without a hook capability it is still ours to run: a policy.
    let scan = manifest::scan_all(ws.path());
    assert_eq!(scan.manifests.len(), 1, "{:?}", scan.skipped);
    assert!(scan.skipped.is_empty());

    let (_ws, dir) = plugin(
        "p",
        &with(&format!(
            "{HOOK}[policy]\nid = \"guard\"\non = [\"prompt\"]\ntimeout_ms = 50\non_error = \"deny\"\n"
        )),
    );
    let m = load_ok(&dir);
    let p = m.policy.as_ref().unwrap();
    assert_eq!(
        (p.id.as_str(), p.timeout_ms, p.on_error),
        ("guard", 50, OnError::Deny)
    );
    assert!(m.is_hook() && m.is_policy());
}

#[test]
fn policy_keys_are_checked_with_file_line_column_and_key() {
    assert_eq!(
        errs_of(&with(
            "[policy]\non = [\"tool_call_strat\", \"prompt\", \"prompt\"]\ntimeout = 10\non_error = \"allow\"\ntimeout_ms = 0\nid = \"a b\"\n"
        )),
        vec![
            "F:5:7: policy.on[0]: unknown decision point \"tool_call_strat\"; did you mean \"tool_call_start\"?",
            "F:5:36: policy.on[2]: \"prompt\" is listed twice",
            "F:6:1: policy.timeout: unknown key \"timeout\"; did you mean \"timeout_ms\"?",
            "F:7:12: policy.on_error: unknown on_error \"allow\"; expected \"none\" (no decision) or \"deny\"",
            "F:8:14: policy.timeout_ms: expected an integer between 1 and 30000, found 0",
            "F:9:6: policy.id: \"a b\" is not a valid policy id: 1 to 64 characters of A-Z a-z 0-9 _ -",
        ]
    );
    assert_eq!(
        errs_of(&with("[policy]\non_error = \"deny\"\n")),
        vec![
            "F:4:1: policy: missing \"on\" (required): the decision points the policy answers, e.g. on = [\"tool_call_start\"]"
        ]
    );
    assert_eq!(
        errs_of(&with("[policy]\non = []\n")),
        vec![
            "F:5:6: policy.on: an empty list answers nothing; expected one or more of tool_call_start, prompt, permission"
        ]
    );
}
