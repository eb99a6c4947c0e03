//! hooks.json under `prx-hooks run` as a user sees it on stderr (docs/hooks.md § Shell hooks): the
//! real watcher's log lines after an edit, a broken file and its repair, and `validate`'s
//! refusal of a HOME set in `env`. Real processes and files; liveness with generous slack.

use crate::stderr::Lines;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `prx-hooks run` over `ws` at log level info, its input held open; its stderr line by line.
struct Run {
    child: Child,
    err: Lines,
}

impl Run {
    fn start(ws: &Path) -> Run {
        let mut child = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
            .args(["run", "--events", "-", "--workspace"])
            .arg(ws)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = Lines::of(&mut child);
        Run { child, err }
    }

    /// The next stderr line containing `needle` (30 s at most); the lines before it are kept.
    fn line(&mut self, needle: &str) -> String {
        self.err.next_with(needle)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What editors do: a temporary file beside, renamed over.
fn save(ws: &Path, text: &str) {
    let tmp = ws.join(".hooks.json.swp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, ws.join("hooks.json")).unwrap();
}

fn four_hooks(disabled: &[&str]) -> String {
    let hooks: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| {
            format!(
                r#"{{"id": "{id}", "command": "/bin/true", "enabled": {}}}"#,
                !disabled.contains(id)
            )
        })
        .collect();
    format!(r#"{{"hooks": {{"tool_call": [{}]}}}}"#, hooks.join(", "))
}

#[test]
fn the_watcher_says_how_many_hooks_are_enabled_and_when_a_broken_file_is_valid_again() {
    let ws = tempfile::tempdir().unwrap();
    save(ws.path(), &four_hooks(&[]));
    let mut run = Run::start(ws.path());
    let first = run.line("shell hook(s)");
    assert!(first.contains(": 4 shell hook(s) live"), "{first}");

    // One switched off: the line says what runs.
    save(ws.path(), &four_hooks(&["d"]));
    let line = run.line("shell hook(s)");
    assert!(
        line.contains(": 3 of 4 shell hook(s) live (1 disabled)"),
        "{line}"
    );

    // Broken, then restored to exactly what is in force: said, not silent.
    let good = four_hooks(&["d"]);
    save(ws.path(), "{\"hooks\": {\"tool_call\": [}}");
    run.line("rejected (1 error(s))");
    save(ws.path(), &good);
    let line = run.line("valid again");
    assert!(
        line.contains("hooks.json is valid again") && line.contains("3 of 4 shell hook(s) live"),
        "{line}"
    );

    // Broken, then fixed with a new table: said as well.
    save(ws.path(), "{\"hooks\": 1}");
    run.line("rejected (1 error(s))");
    save(ws.path(), &four_hooks(&["c", "d"]));
    let line = run.line("valid again");
    assert!(
        line.contains("2 of 4 shell hook(s) live (2 disabled)"),
        "{line}"
    );
    // The global switch off.
    save(
        ws.path(),
        &four_hooks(&[]).replacen("{\"hooks\"", "{\"enabled\": false, \"hooks\"", 1),
    );
    let line = run.line("shell hook(s)");
    assert!(
        line.contains("0 of 4 shell hook(s) live (all disabled: \"enabled\": false)"),
        "{line}"
    );
}

#[test]
fn validate_refuses_home_in_env_at_its_line_and_column() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("hooks.json"),
        "{\"hooks\": {\"error\": [\n  {\"command\": \"/bin/true\", \"env\": {\"HOME\": \"/tmp/x\"}}\n]}}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_prx-hooks"))
        .args(["validate", "--workspace"])
        .arg(ws.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let want = format!(
        "{}:2:36: hooks.error[0].env.HOME: may not set \"HOME\": hooks get the host's HOME",
        ws.path().join("hooks.json").display()
    );
    assert!(
        stdout.lines().any(|l| l.starts_with(&want)),
        "{stdout}\nwant {want}"
    );
}
