//! One event as the shell backend holds it: the shared [`Message`], its payload file, and the
//! strings every hook of the event gets in its environment.
//!
//! An [`EventRun`] is created by `deliver` (one per event that has at least one hook to run) and
//! shared by that event's jobs through an `Arc`. The payload file is written lazily, by the
//! first of those jobs to be spawned (on the runner thread — never on a pipeline worker), and
//! removed when the last `Arc` goes: after the last of the event's hooks has exited, been
//! killed, or been dropped from its queue at shutdown.

use crate::bus::{Message, Meta};
use crate::event::{Event, EventKind};
use std::borrow::Cow;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

/// `ZERO_HOOK_PAYLOAD` carries the payload up to this many bytes; above it the variable is unset
/// and `ZERO_HOOK_PAYLOAD_TRUNCATED=1` is set instead.
pub const MAX_ENV_PAYLOAD: usize = 8192;

/// One event on its way to its hooks.
pub(crate) struct EventRun {
    pub(crate) msg: Message,
    /// The parent-environment share of the table the event was delivered under.
    pub(crate) base_env: Arc<[(OsString, OsString)]>,
    tmp_dir: Arc<Path>,
    file: OnceLock<Result<PathBuf, String>>,
    strings: OnceLock<Strings>,
}

/// The per-event `ZERO_HOOK_*` values, formatted once.
pub(crate) struct Strings {
    pub(crate) seq: String,
    pub(crate) timestamp: String,
    pub(crate) agent: String,
    pub(crate) session: String,
}

impl EventRun {
    pub(crate) fn new(
        msg: Message,
        base_env: Arc<[(OsString, OsString)]>,
        tmp_dir: Arc<Path>,
    ) -> EventRun {
        EventRun {
            msg,
            base_env,
            tmp_dir,
            file: OnceLock::new(),
            strings: OnceLock::new(),
        }
    }

    /// The payload file, written on first use. Its error is remembered: every hook of the event
    /// then fails to spawn with the same reason, and nothing is retried per hook.
    pub(crate) fn payload_file(&self) -> Result<&Path, &str> {
        match self.file.get_or_init(|| {
            write_payload_file(&self.tmp_dir, self.msg.json()).map_err(|e| {
                format!(
                    "cannot write the payload file in {}: {e}",
                    self.tmp_dir.display()
                )
            })
        }) {
            Ok(p) => Ok(p),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn strings(&self) -> &Strings {
        self.strings.get_or_init(|| Strings {
            seq: self.msg.seq().to_string(),
            timestamp: self.msg.timestamp_rfc3339(),
            agent: env_safe(self.msg.agent()).into_owned(),
            session: env_safe(self.msg.session()).into_owned(),
        })
    }
}

impl Drop for EventRun {
    fn drop(&mut self) {
        if let Some(Ok(path)) = self.file.get()
            && let Err(e) = std::fs::remove_file(path)
        {
            tracing::warn!(file = %path.display(), "could not remove a hook payload file: {e}");
        }
    }
}

/// A NUL cannot travel in an environment variable (the spawn would fail); agent and session
/// names are free text, so a NUL in them becomes U+FFFD rather than failing every hook.
fn env_safe(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{fffd}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// Creates `prx-hooks-<pid>-<n>.json` in `dir`, mode 0600, exclusively (`O_CREAT|O_EXCL`: a
/// planted file or symlink under that name is never followed or reused), holding `json`.
fn write_payload_file(dir: &Path, json: &[u8]) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let mut last = None;
    for _ in 0..64 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("prx-hooks-{pid}-{n}.json"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                return match f.write_all(json) {
                    Ok(()) => Ok(path),
                    Err(e) => {
                        let _ = std::fs::remove_file(&path);
                        Err(e)
                    }
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free payload file name")))
}

/// The `tool` field of a `tool_call` / `tool_call_start` payload (what matchers match).
/// Payloads written by the pipeline start with it, so the common case reads one string without
/// parsing the rest; anything else falls back to a full parse.
pub(crate) fn payload_tool(json: &str) -> Option<Cow<'_, str>> {
    if let Some(rest) = json.strip_prefix("{\"tool\":\"") {
        let end = rest.find(['"', '\\'])?;
        if rest.as_bytes()[end] == b'"' {
            return Some(Cow::Borrowed(&rest[..end]));
        }
        // An escape inside the name: let serde_json decode the string.
        let mut de = serde_json::Deserializer::from_str(&json["{\"tool\":".len()..]);
        return serde::Deserialize::deserialize(&mut de)
            .ok()
            .map(Cow::Owned);
    }
    #[derive(serde::Deserialize)]
    struct Tool {
        tool: String,
    }
    serde_json::from_str::<Tool>(json)
        .ok()
        .map(|t| Cow::Owned(t.tool))
}

/// The [`Message`] a pipeline worker would build for `event`: its payload serialized once by
/// [`Event::write_json`], stamped now. For `prx-hooks fire`, the HTTP test endpoint and tests.
pub fn event_message(event: &Event<'_>, agent: &str, session: &str, seq: u64) -> Message {
    message_from_json(event.kind(), &event.to_json(), agent, session, seq)
}

/// A lifecycle [`Message`] for `kind` carrying `json` as its payload, exactly as given (the
/// caller validates it: `fire --payload` and the HTTP test endpoint accept a user's payload).
pub fn message_from_json(
    kind: EventKind,
    json: &str,
    agent: &str,
    session: &str,
    seq: u64,
) -> Message {
    let meta = Meta {
        kind: Some(kind),
        seq,
        timestamp: SystemTime::now(),
        depth: 0,
    };
    Message::new(json, agent, session, "", meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_from_payloads() {
        let m = |e: Event<'_>| event_message(&e, "a", "s", 0);
        let msg = m(Event::ToolCall {
            tool: "mcp__github__create",
            success: true,
            output: "x",
        });
        assert_eq!(
            payload_tool(msg.json_str()).as_deref(),
            Some("mcp__github__create")
        );
        let msg = m(Event::ToolCallStart {
            tool: "we\"ird\\name",
            arguments: "{}",
        });
        assert_eq!(
            payload_tool(msg.json_str()).as_deref(),
            Some("we\"ird\\name")
        );
        assert_eq!(
            payload_tool(r#"{"other":1,"tool":"late"}"#).as_deref(),
            Some("late")
        );
        assert_eq!(payload_tool(r#"{"other":1}"#), None);
        assert_eq!(payload_tool("{}"), None);
    }

    #[test]
    fn nul_free_env_strings() {
        assert_eq!(env_safe("a\0b"), "a\u{fffd}b");
        assert!(matches!(env_safe("ab"), Cow::Borrowed(_)));
    }

    #[test]
    fn payload_file_lifecycle() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let msg = event_message(&Event::TurnComplete, "a", "s", 7);
        let run = EventRun::new(msg, Arc::from(Vec::new()), Arc::from(dir.path()));
        let path = run.payload_file().unwrap().to_path_buf();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(run.payload_file().unwrap(), path, "written once");
        assert_eq!(run.strings().seq, "7");
        drop(run);
        assert!(!path.exists());
    }

    #[test]
    fn payload_file_error_is_remembered() {
        let msg = event_message(&Event::TurnComplete, "a", "s", 0);
        let run = EventRun::new(
            msg,
            Arc::from(Vec::new()),
            Arc::from(Path::new("/nonexistent/prx-hooks-test")),
        );
        let e = run.payload_file().unwrap_err().to_string();
        assert!(e.contains("/nonexistent/prx-hooks-test"), "{e}");
        assert_eq!(run.payload_file().unwrap_err(), e);
    }
}
