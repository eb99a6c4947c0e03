//! `prx-hooks init [DIR]`: a working workspace to start from (docs/cli.md § `init`).
//!
//! It writes a hooks.json with one hook per common use — an audit log of tool calls (with a
//! matcher), a notifier on `agent_end`, errors to a file — the scripts they run, a sample
//! `events.ndjson`, a README saying what each hook does and what to do next (hooks.json is
//! JSON: it has no comments, so they live there and in the scripts), and a `.gitignore` that
//! keeps the API token and the logs out of version control.
//!
//! It never overwrites anything: if any of its files (or `hooks/`, as a directory or a link to
//! one) already exists, every one that does is named and nothing is written. It puts the whole
//! workspace in place or nothing of it, never writing through a link swapped in while it runs,
//! and a crash leaves at most a temporary directory the next `init` cleans up
//! ([`stage`], `init_stage.rs`).

#[path = "init_stage.rs"]
mod stage;

use crate::BoxError;
use crate::connect::agents::shell_quote;
use clap::Args;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub(crate) struct InitArgs {
    /// The directory to create the workspace in (made if missing; files already there are
    /// never overwritten).
    #[arg(default_value = ".")]
    dir: PathBuf,
}

const HOOKS_JSON: &str = r#"{
  "timeout_ms": 5000,
  "env_passthrough": ["DISPLAY", "WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS"],
  "hooks": {
    "tool_call_start": [
      {
        "id": "audit-tool-calls",
        "command": "./hooks/log-event.sh",
        "args": ["logs/audit.log"],
        "matcher": "shell|Bash|Edit|Write|mcp__.*",
        "stdin_json": true,
        "timeout_ms": 2000
      }
    ],
    "agent_end": [
      {
        "id": "notify-agent-end",
        "command": "./hooks/notify.sh",
        "args": ["logs/notifications.log"],
        "stdin_json": true
      }
    ],
    "error": [
      {
        "id": "errors-to-file",
        "command": "./hooks/log-event.sh",
        "args": ["logs/errors.log"],
        "stdin_json": true
      }
    ]
  }
}
"#;

const LOG_EVENT_SH: &str = r#"#!/bin/sh
# Appends one line per event to the log file named by its first argument (relative to the
# workspace, which is the hook's working directory): when, which event, which agent and
# session, the event's sequence number, and the payload JSON, which arrives on stdin
# ("stdin_json": true) and, for payloads up to 8 KiB, in $ZERO_HOOK_PAYLOAD too.
# Used by two hooks of hooks.json: audit-tool-calls and errors-to-file.
set -eu
log="${1:?usage: log-event.sh LOGFILE}"
mkdir -p "$(dirname "$log")"
payload=$(cat)
printf '%s %s %s/%s #%s %s\n' "$ZERO_HOOK_TIMESTAMP" "$ZERO_HOOK_EVENT" \
    "$ZERO_HOOK_AGENT" "$ZERO_HOOK_SESSION" "$ZERO_HOOK_SEQ" "$payload" >> "$log"
"#;

const NOTIFY_SH: &str = r#"#!/bin/sh
# A notifier for agent_end: a desktop notification where `notify-send` exists and a desktop
# session is reachable (hooks.json passes DISPLAY, WAYLAND_DISPLAY and
# DBUS_SESSION_BUS_ADDRESS through; every other variable of the agent's environment stays
# behind), and always a line in the log file named by its first argument.
# Replace the notify-send line with what you use: a chat webhook, `mail`, a sound.
set -eu
log="${1:?usage: notify.sh LOGFILE}"
payload=$(cat)
message="agent $ZERO_HOOK_AGENT/$ZERO_HOOK_SESSION finished: $payload"
mkdir -p "$(dirname "$log")"
printf '%s %s\n' "$ZERO_HOOK_TIMESTAMP" "$message" >> "$log"
if command -v notify-send >/dev/null 2>&1 && [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
    notify-send "prx-hooks" "$message" || true
fi
"#;

const EVENTS_NDJSON: &str = r#"{"event":"agent_start","agent":"coder","session":"demo-1","payload":{"agent":"coder","session":"demo-1"}}
{"event":"llm_request","agent":"coder","session":"demo-1","payload":{"provider":"anthropic","model":"claude-sonnet","messages_count":3}}
{"event":"llm_response","agent":"coder","session":"demo-1","payload":{"provider":"anthropic","model":"claude-sonnet","duration_ms":1840,"success":true}}
{"event":"tool_call_start","agent":"coder","session":"demo-1","payload":{"tool":"shell","arguments":{"cmd":"cargo test","cwd":"/src/app"}}}
{"event":"tool_call","agent":"coder","session":"demo-1","payload":{"tool":"shell","success":false,"output":"test result: FAILED. 41 passed; 1 failed"}}
{"event":"error","agent":"coder","session":"demo-1","payload":{"component":"tool","message":"shell exited with status 101"}}
{"event":"turn_complete","agent":"coder","session":"demo-1"}
{"event":"tool_call_start","agent":"coder","session":"demo-1","payload":{"tool":"read_file","arguments":{"path":"src/lib.rs"}}}
{"event":"tool_call","agent":"coder","session":"demo-1","payload":{"tool":"read_file","success":true,"output":"(412 lines)"}}
{"event":"tool_call_start","agent":"coder","session":"demo-1","payload":{"tool":"mcp__github__create_issue","arguments":{"title":"flaky test"}}}
{"event":"tool_call","agent":"coder","session":"demo-1","payload":{"tool":"mcp__github__create_issue","success":true,"output":"created #1234"}}
{"event":"agent_end","agent":"coder","session":"demo-1","payload":{"success":true,"messages_count":9}}
"#;

const GITIGNORE: &str = "# The API token and the server's address (written by `prx-hooks run --listen`), kv\n\
# stores of plugins: never commit them.\n.prx-hooks/\n# What the sample hooks write.\nlogs/\n";

const README: &str = r#"# A prx-hooks workspace

Made by `prx-hooks init`. `hooks.json` is plain JSON (no comments), so here is what it holds:

| hook | event | what it does |
|---|---|---|
| `audit-tool-calls` | `tool_call_start` | appends each call of a tool matching `shell\|Bash\|Edit\|Write\|mcp__.*` (a regex, always against the whole tool name) with its arguments to `logs/audit.log` (`hooks/log-event.sh`); other tools are skipped |
| `notify-agent-end` | `agent_end` | a desktop notification when the agent finishes (where `notify-send` and a desktop session exist), and a line in `logs/notifications.log` (`hooks/notify.sh`) |
| `errors-to-file` | `error` | appends every error event to `logs/errors.log` (`hooks/log-event.sh`) |

Every hook gets the payload JSON on stdin (`"stdin_json": true`) and in `$ZERO_HOOK_PAYLOAD`,
and `$ZERO_HOOK_EVENT`, `$ZERO_HOOK_AGENT`, `$ZERO_HOOK_SESSION`, `$ZERO_HOOK_SEQ`,
`$ZERO_HOOK_TIMESTAMP`, `$ZERO_HOOK_ID`. It runs without a shell, in this directory, with a
sanitized environment, and is killed with everything it started after `timeout_ms`.

## Next

```sh
prx-hooks validate --workspace WORKSPACE                  # every error as FILE:LINE:COL: path: reason
prx-hooks fire tool_call_start --workspace WORKSPACE \
    --payload '{"tool":"shell","arguments":{"cmd":"ls"}}' # run the hooks of one event now
prx-hooks run --workspace WORKSPACE --events WORKSPACE/events.ndjson --print
                                                          # replay the sample events; see logs/
prx-hooks run --workspace WORKSPACE --listen 127.0.0.1:7878
                                                          # the HTTP API and the live stream
prx-hooks tail --workspace WORKSPACE --runs               # in another terminal: watch it live
```

Edit `hooks.json` while `run` runs: the change is live within milliseconds (an invalid edit is
reported and the last good table keeps running). WASM plugins go in
`plugins/<name>/{plugin.toml,plugin.wasm}`.
"#;

/// The files, in the order they are written. The README's commands name the workspace the
/// way the hints on stdout do: each path one shell word ([`shell_quote`]), so a path with
/// spaces, quotes or `$(…)` in it is pasted as it is.
fn files(dir: &Path) -> Vec<(&'static str, String, u32)> {
    let readme = README
        .replace(
            "WORKSPACE/events.ndjson",
            &shell_quote(&dir.join("events.ndjson").display().to_string()),
        )
        .replace("WORKSPACE", &shell_quote(&dir.display().to_string()));
    vec![
        ("hooks.json", HOOKS_JSON.to_string(), 0o600),
        ("hooks/log-event.sh", LOG_EVENT_SH.to_string(), 0o755),
        ("hooks/notify.sh", NOTIFY_SH.to_string(), 0o755),
        ("events.ndjson", EVENTS_NDJSON.to_string(), 0o644),
        ("README.md", readme, 0o644),
        (".gitignore", GITIGNORE.to_string(), 0o644),
    ]
}

pub(crate) fn init(args: InitArgs) -> Result<ExitCode, BoxError> {
    let dir = &args.dir;
    let files = files(dir);
    let (base_path, missing) = split_missing(dir);
    let base = stage::Base::lock(&base_path).map_err(|e| format!("init: {e}"))?;
    // What an interrupted init left where this one works: cleaned, or completed when this
    // directory was its target.
    let recovered =
        stage::recover(&base, &base_path, missing.is_empty()).map_err(|e| format!("init: {e}"))?;
    for n in &recovered.notes {
        say!("prx-hooks init: {n}");
    }
    if recovered.completed {
        report(dir, &files);
        return Ok(ExitCode::SUCCESS);
    }
    // `hooks/` is made by this run too (never reused: a symbolic link to a directory would
    // have the scripts written wherever it points), so an existing one is in the way.
    let existing: Vec<String> = std::iter::once(dir.join("hooks"))
        .chain(files.iter().map(|(name, _, _)| dir.join(name)))
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.display().to_string())
        .collect();
    if !existing.is_empty() {
        return Err(format!(
            "init: refusing to overwrite what exists: {} (nothing was written; choose another directory or move them away)",
            existing.join(", ")
        )
        .into());
    }
    let made = stage::Stage::create(base, &missing)
        .and_then(|mut st| {
            for (name, text, mode) in &files {
                st.write(name, text, *mode)?;
            }
            Ok(st)
        })
        .map_err(stage::Failure::from)
        .and_then(|st| st.commit(&missing));
    if let Err(f) = made {
        let left = if f.left.is_empty() {
            "nothing was left behind".to_string()
        } else {
            format!("could not be taken back: {}", f.left.join(", "))
        };
        return Err(format!("init: {} ({left})", f.error).into());
    }
    report(dir, &files);
    Ok(ExitCode::SUCCESS)
}

/// What was made and the commands to try next, on stdout.
fn report(dir: &Path, files: &[(&str, String, u32)]) {
    let shown = dir.display().to_string();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "created a workspace in {shown}:");
    for (name, _, _) in files {
        let what = match *name {
            "hooks.json" => {
                "3 hooks: audit-tool-calls (tool_call_start, with a matcher), notify-agent-end (agent_end), errors-to-file (error)"
            }
            "hooks/log-event.sh" => "appends an event to a log file",
            "hooks/notify.sh" => "desktop notification + a log line",
            "events.ndjson" => "12 sample events",
            "README.md" => "what each hook does, what to do next",
            _ => "keeps .prx-hooks/ (the API token) and logs/ out of git",
        };
        let _ = writeln!(out, "  {name:<20} {what}");
    }
    let q = shell_quote(&shown);
    let _ = writeln!(out, "next:");
    let _ = writeln!(out, "  prx-hooks validate --workspace {q}");
    let _ = writeln!(
        out,
        "  prx-hooks run --workspace {q} --events {} --print",
        shell_quote(&dir.join("events.ndjson").display().to_string())
    );
    let _ = writeln!(
        out,
        "  prx-hooks run --workspace {q} --listen 127.0.0.1:7878   # then: prx-hooks tail --workspace {q} --runs"
    );
}

/// `dir`'s nearest existing ancestor (`dir` itself when it exists) and the components below
/// it that do not exist yet, outermost first (made inside the staging directory).
fn split_missing(dir: &Path) -> (PathBuf, Vec<OsString>) {
    let mut missing = Vec::new();
    let mut d = dir.to_path_buf();
    while !d.as_os_str().is_empty() && d.symlink_metadata().is_err() {
        let Some(name) = d.file_name() else { break };
        missing.push(name.to_os_string());
        d = d.parent().map(Path::to_path_buf).unwrap_or_default();
    }
    if d.as_os_str().is_empty() {
        d = PathBuf::from(".");
    }
    missing.reverse();
    (d, missing)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_sample_files_are_what_they_claim() {
        let v: serde_json::Value = serde_json::from_str(super::HOOKS_JSON).unwrap();
        assert_eq!(v["hooks"].as_object().unwrap().len(), 3);
        for line in super::EVENTS_NDJSON.lines() {
            prx_hooks::ndjson::parse_line(line.as_bytes()).unwrap();
        }
        assert_eq!(super::EVENTS_NDJSON.lines().count(), 12);
        assert_eq!(super::shell_quote("a b"), "'a b'");
        assert_eq!(super::shell_quote("/tmp/x-1"), "/tmp/x-1");
    }
}
