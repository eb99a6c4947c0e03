//! Transcripts read at a turn's end (opt-in): the model calls a coding agent made, as
//! `llm_request` / `llm_response` lines with their token counts and times (docs/agents.md
//! § Transcripts, ARCHITECTURE.md § Ingest).
//!
//! Only the file the agent named in a turn's end (`transcript_path`, a subagent's
//! `agent_transcript_path`), only a regular `.jsonl` file owned by this process's user, opened
//! without following a link, at most [`MAX_READ_BYTES`] per read from where the last read of
//! it ended. What is read is the model, the token counts and the times: no content.

use crate::EventKind;
use crate::agents::transcript::{self, ModelCall};
use crate::agents::{Agent, Target, Translated};
use nix::fcntl::OFlag;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most read of a transcript at one turn's end: the newest part when more was written.
pub const MAX_READ_BYTES: u64 = 8 << 20;

/// Transcripts whose read position is remembered; the least recently read is forgotten first
/// (its next read starts at its last turn again).
pub const MAX_FILES: usize = 1024;

/// The name of the stats section.
pub const STATS_SECTION: &str = "transcripts";

/// What the transcript reader did (`/api/stats` section `transcripts`).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TranscriptStats {
    /// Turn ends whose transcript was read.
    pub reads: u64,
    /// Model calls found (each an `llm_request` and an `llm_response`).
    pub calls: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Bytes passed over: written since the last read beyond [`MAX_READ_BYTES`].
    pub skipped_bytes: u64,
    /// Transcripts not read: not absolute, not `.jsonl`, a link, not a regular file, another
    /// user's, or unreadable.
    pub refused: u64,
}

/// One derived line: an NDJSON event, its id (stable: the same call read again has the same)
/// and its time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedLine {
    /// The `run --events` line.
    pub line: String,
    /// Its event id.
    pub id: String,
    /// When it happened (RFC 3339, UTC).
    pub time: String,
}

/// The transcript reader of one server: read positions and counts.
#[derive(Debug, Default)]
pub struct Transcripts {
    files: Mutex<Files>,
    reads: AtomicU64,
    calls: AtomicU64,
    bytes: AtomicU64,
    skipped: AtomicU64,
    refused: AtomicU64,
}

/// Invariant: `order` holds each key of `offsets` once, least recently read first.
#[derive(Debug, Default)]
struct Files {
    offsets: HashMap<PathBuf, u64>,
    order: VecDeque<PathBuf>,
}

impl Transcripts {
    /// A reader that has read nothing yet.
    pub fn new() -> Transcripts {
        Transcripts::default()
    }

    /// The lines a turn's end derives from its agent's transcript: for each model call since
    /// the last read (the turn's own at a file's first read), an `llm_request` at its start
    /// and an `llm_response` at its end with the tokens. Empty for any other event, an agent
    /// whose transcript is not read here, or a transcript refused (counted).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::{Agent, TranslateOptions, translate};
    /// use prx_hooks::ingest::Transcripts;
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("s.jsonl");
    /// std::fs::write(&path, concat!(
    ///     r#"{"type":"user","message":{"content":"hi"},"timestamp":"2026-12-07T10:00:00Z"}"#, "\n",
    ///     r#"{"type":"assistant","timestamp":"2026-12-07T10:00:02Z","message":{"id":"m1","model":"claude-x","usage":{"input_tokens":3,"output_tokens":4}}}"#, "\n",
    /// ))?;
    /// let stop = serde_json::json!({"session_id": "s", "hook_event_name": "Stop", "transcript_path": path});
    /// let t = translate(Agent::ClaudeCode, stop.to_string().as_bytes(), &TranslateOptions::default())?;
    /// let lines = Transcripts::new().derive(Agent::ClaudeCode, &t);
    /// assert_eq!(lines.len(), 2);
    /// assert!(lines[1].line.contains(r#""output_tokens":4"#));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn derive(&self, agent: Agent, t: &Translated) -> Vec<DerivedLine> {
        let Some((agent_name, session, path)) = turn_end(agent, t) else {
            return Vec::new();
        };
        let calls = match self.read(agent, &path) {
            Some(calls) => calls,
            None => return Vec::new(),
        };
        self.calls.fetch_add(calls.len() as u64, Ordering::Relaxed);
        let mut out = Vec::with_capacity(calls.len() * 2);
        for call in &calls {
            lines_of(agent, &agent_name, &session, &path, call, &mut out);
        }
        out
    }

    /// Ingests what [`derive`](Transcripts::derive) gives for the turn's end `t` into `hooks`,
    /// each line with its own id and time (a call read again is a duplicate, never a second
    /// run); their report, `None` when there were none. Call it before ingesting `t`, so the
    /// model calls come before the turn's end.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::{Agent, TranslateOptions, translate};
    /// use prx_hooks::ingest::Transcripts;
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let stop = br#"{"session_id":"s","hook_event_name":"Stop","transcript_path":"/nowhere.jsonl"}"#;
    /// let t = translate(Agent::ClaudeCode, stop, &TranslateOptions::default())?;
    /// let reader = Transcripts::new();
    /// assert!(reader.ingest(&hooks, Agent::ClaudeCode, &t).is_none());
    /// assert_eq!(reader.stats().refused, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn ingest(
        &self,
        hooks: &crate::Hooks,
        agent: Agent,
        t: &Translated,
    ) -> Option<super::IngestReport> {
        let lines = self.derive(agent, t);
        if lines.is_empty() {
            return None;
        }
        let opts = super::IngestOptions::default().lenient(true);
        let mut ingest = super::LineIngest::new(hooks, opts);
        for (n, d) in (1u64..).zip(&lines) {
            let origin = super::LineOrigin::default().id(&d.id).time(&d.time);
            ingest.line_from(n, d.line.as_bytes(), origin, None);
        }
        Some(ingest.into_report())
    }

    /// The counts so far.
    pub fn stats(&self) -> TranscriptStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TranscriptStats {
            reads: get(&self.reads),
            calls: get(&self.calls),
            bytes: get(&self.bytes),
            skipped_bytes: get(&self.skipped),
            refused: get(&self.refused),
        }
    }

    /// The model calls written to `path` since its last read; `None` when it is refused.
    fn read(&self, agent: Agent, path: &Path) -> Option<Vec<ModelCall>> {
        let refuse = || {
            self.refused.fetch_add(1, Ordering::Relaxed);
            None
        };
        if !path.is_absolute() || path.extension().is_none_or(|e| e != "jsonl") {
            return refuse();
        }
        let Ok(mut file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
            .open(path)
        else {
            return refuse();
        };
        // Held from the file's length to its new read position: two turn ends naming one
        // transcript at once (a retry racing the first try) read it one after the other, so
        // no call is read twice, and neither takes the other's position for a truncation.
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(meta) = file.metadata() else {
            return refuse();
        };
        if !meta.file_type().is_file() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return refuse();
        }
        let len = meta.len();
        let known = files.offsets.get(path).copied();
        let first_read = known.is_none();
        let mut from = known.filter(|&o| o <= len).unwrap_or(0);
        if len - from > MAX_READ_BYTES {
            self.skipped
                .fetch_add(len - MAX_READ_BYTES - from, Ordering::Relaxed);
            from = len - MAX_READ_BYTES;
        }
        let mut text = Vec::with_capacity((len - from) as usize);
        if file.seek(SeekFrom::Start(from)).is_err()
            || (&mut file).take(len - from).read_to_end(&mut text).is_err()
        {
            return refuse();
        }
        // Started inside a line: that line is passed over.
        let mut skip = 0;
        if from > 0 && known != Some(from) {
            skip = text
                .iter()
                .position(|&b| b == b'\n')
                .map_or(text.len(), |i| i + 1);
        }
        // Only whole lines: the rest is read next time.
        let end = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let whole = if end > skip {
            &text[skip..end]
        } else {
            &[][..]
        };
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(text.len() as u64, Ordering::Relaxed);
        files.remember(path, from + end.max(skip) as u64);
        drop(files);
        Some(transcript::model_calls(agent, whole, first_read))
    }
}

impl Files {
    fn remember(&mut self, path: &Path, offset: u64) {
        let Files { offsets, order } = self;
        if offsets.insert(path.to_path_buf(), offset).is_some() {
            order.retain(|p| p != path);
        }
        order.push_back(path.to_path_buf());
        while order.len() > MAX_FILES {
            if let Some(old) = order.pop_front() {
                offsets.remove(&old);
            }
        }
    }
}

/// The agent's name, the session and the transcript a turn's end names; `None` for any other
/// event. A subagent's end names its own transcript; without one, none is read (the main
/// transcript holds the parent's calls).
fn turn_end(agent: Agent, t: &Translated) -> Option<(String, String, PathBuf)> {
    if !transcript::reads(agent) || t.target != Target::Lifecycle(EventKind::TurnComplete) {
        return None;
    }
    let line: serde_json::Value = serde_json::from_str(&t.line).ok()?;
    let payload = line.get("payload")?;
    let member = match t.event.as_str() {
        "SubagentStop" => "agent_transcript_path",
        "Stop" => "transcript_path",
        _ => return None,
    };
    let path = payload.get(member)?.as_str()?;
    Some((
        line.get("agent")?.as_str()?.to_string(),
        line.get("session")?.as_str()?.to_string(),
        PathBuf::from(path),
    ))
}

/// FNV-1a, 64 bits: the derived ids stay the same across restarts and builds.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(b"\0") {
            h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn lines_of(
    agent: Agent,
    name: &str,
    session: &str,
    path: &Path,
    call: &ModelCall,
    out: &mut Vec<DerivedLine>,
) {
    let provider = match agent {
        Agent::Codex => "openai",
        _ => "anthropic",
    };
    let id = fnv(&[path.as_os_str().as_encoded_bytes(), call.id.as_bytes()]);
    let head = |event: &str| serde_json::json!({"event": event, "agent": name, "session": session});
    let start = call.start.clone().unwrap_or_else(|| call.end.clone());
    let mut request = head("llm_request");
    request["payload"] = serde_json::json!({
        "provider": provider, "model": call.model, "source": "transcript",
    });
    let duration = duration_ms(&start, &call.end);
    let u = call.usage;
    let mut response = head("llm_response");
    response["payload"] = serde_json::json!({
        "provider": provider, "model": call.model, "duration_ms": duration, "success": true,
        "input_tokens": u.input, "output_tokens": u.output,
        "cache_read_input_tokens": u.cache_read, "cache_creation_input_tokens": u.cache_creation,
        "source": "transcript",
    });
    out.push(DerivedLine {
        line: request.to_string(),
        id: format!("transcript:{id:016x}:request"),
        time: utc(&start),
    });
    out.push(DerivedLine {
        line: response.to_string(),
        id: format!("transcript:{id:016x}:response"),
        time: utc(&call.end),
    });
}

/// Milliseconds from `start` to `end` (0 when either is not a time or they are backwards).
fn duration_ms(start: &str, end: &str) -> u64 {
    match (
        humantime::parse_rfc3339_weak(start),
        humantime::parse_rfc3339_weak(end),
    ) {
        (Ok(s), Ok(e)) => e
            .duration_since(s)
            .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64),
        _ => 0,
    }
}

/// `t` as RFC 3339 in UTC with a `Z`, as an event's time must be (the transcripts' are).
fn utc(t: &str) -> String {
    match humantime::parse_rfc3339_weak(t) {
        Ok(time) => humantime::format_rfc3339_micros(time).to_string(),
        Err(_) => humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{TranslateOptions, translate};
    use std::io::Write;

    fn prompt(t: &str) -> String {
        format!(r#"{{"type":"user","message":{{"content":"p"}},"timestamp":"{t}"}}"#) + "\n"
    }

    fn answer(id: &str, t: &str, out: u64) -> String {
        format!(
            r#"{{"type":"assistant","timestamp":"{t}","message":{{"id":"{id}","model":"claude-x","usage":{{"input_tokens":3,"output_tokens":{out}}}}}}}"#
        ) + "\n"
    }

    fn stop(path: &Path) -> Translated {
        let body = serde_json::json!({"session_id": "s", "hook_event_name": "Stop", "transcript_path": path});
        translate(
            Agent::ClaudeCode,
            body.to_string().as_bytes(),
            &TranslateOptions::default(),
        )
        .unwrap()
    }

    fn outputs(lines: &[DerivedLine]) -> Vec<u64> {
        lines
            .iter()
            .filter_map(|l| {
                let v: serde_json::Value = serde_json::from_str(&l.line).ok()?;
                v["payload"]["output_tokens"].as_u64()
            })
            .collect()
    }

    #[test]
    fn each_turn_end_reads_on_from_where_the_last_one_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(prompt("2026-12-07T09:00:00Z").as_bytes())
            .unwrap();
        f.write_all(answer("m0", "2026-12-07T09:00:01Z", 1).as_bytes())
            .unwrap();
        f.write_all(prompt("2026-12-07T10:00:00Z").as_bytes())
            .unwrap();
        f.write_all(answer("m1", "2026-12-07T10:00:01Z", 2).as_bytes())
            .unwrap();
        // Half a line: read once it is whole.
        f.write_all(br#"{"type":"assistant","#).unwrap();
        let r = Transcripts::new();
        let first = r.derive(Agent::ClaudeCode, &stop(&path));
        assert_eq!(outputs(&first), [2], "the last turn only, at a first read");
        assert_eq!(first[0].time, "2026-12-07T10:00:00.000000Z");
        assert_eq!(first[1].time, "2026-12-07T10:00:01.000000Z");
        assert!(first[1].line.contains(r#""duration_ms":1000"#), "{first:?}");
        f.write_all(
            br#""timestamp":"2026-12-07T10:00:05Z","message":{"id":"m2","model":"claude-x","usage":{"input_tokens":3,"output_tokens":7}}}"#,
        )
        .unwrap();
        f.write_all(b"\n").unwrap();
        f.write_all(answer("m3", "2026-12-07T10:00:09Z", 9).as_bytes())
            .unwrap();
        let next = r.derive(Agent::ClaudeCode, &stop(&path));
        assert_eq!(
            outputs(&next),
            [7, 9],
            "what came since, the split line whole"
        );
        assert!(r.derive(Agent::ClaudeCode, &stop(&path)).is_empty());
        // Read again from scratch (a restart): the same calls, the same ids.
        let again = Transcripts::new().derive(Agent::ClaudeCode, &stop(&path));
        assert_eq!(again.last().map(|l| &l.id), next.last().map(|l| &l.id));
        let s = r.stats();
        assert_eq!((s.reads, s.calls, s.refused), (3, 3, 0));
    }

    #[test]
    fn only_a_regular_jsonl_file_of_this_user_named_absolutely_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("s.jsonl");
        std::fs::write(
            &good,
            prompt("2026-12-07T10:00:00Z") + &answer("m", "2026-12-07T10:00:01Z", 1),
        )
        .unwrap();
        let other = dir.path().join("notes.txt");
        std::fs::copy(&good, &other).unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let fifo = dir.path().join("fifo.jsonl");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let r = Transcripts::new();
        for bad in [
            PathBuf::from("s.jsonl"),
            other,
            link,
            fifo,
            dir.path().join("missing.jsonl"),
        ] {
            assert!(
                r.derive(Agent::ClaudeCode, &stop(&bad)).is_empty(),
                "{bad:?}"
            );
        }
        assert_eq!(r.stats().refused, 5);
        if nix::unistd::geteuid().is_root() {
            // Another user's transcript (root can make one).
            let theirs = dir.path().join("theirs.jsonl");
            std::fs::copy(&good, &theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(r.derive(Agent::ClaudeCode, &stop(&theirs)).is_empty());
            assert_eq!(r.stats().refused, 6);
        }
        assert_eq!(r.derive(Agent::ClaudeCode, &stop(&good)).len(), 2);
    }

    #[test]
    fn a_read_takes_at_most_the_newest_max_read_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut text = prompt("2026-12-07T10:00:00Z");
        let filler = format!(r#"{{"type":"progress","data":"{}"}}"#, "x".repeat(1 << 20)) + "\n";
        for _ in 0..9 {
            text.push_str(&filler);
        }
        text.push_str(&answer("m", "2026-12-07T10:00:01Z", 5));
        std::fs::write(&path, &text).unwrap();
        let r = Transcripts::new();
        let lines = r.derive(Agent::ClaudeCode, &stop(&path));
        assert_eq!(outputs(&lines), [5]);
        let s = r.stats();
        assert_eq!(s.bytes, MAX_READ_BYTES);
        assert_eq!(s.skipped_bytes, text.len() as u64 - MAX_READ_BYTES);
    }

    #[test]
    fn turn_ends_racing_on_one_transcript_read_each_call_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut text = prompt("2026-12-07T10:00:00Z");
        for i in 0..200 {
            text.push_str(&answer(&format!("m{i}"), "2026-12-07T10:00:01Z", 1));
        }
        std::fs::write(&path, text).unwrap();
        let r = Transcripts::new();
        let t = stop(&path);
        let lines: usize = std::thread::scope(|s| {
            let racers: Vec<_> = (0..8)
                .map(|_| s.spawn(|| r.derive(Agent::ClaudeCode, &t).len()))
                .collect();
            racers.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(lines, 400, "each call's two lines once");
        assert_eq!(r.stats().calls, 200);
    }

    #[test]
    fn read_positions_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let r = Transcripts::new();
        for i in 0..MAX_FILES + 5 {
            let path = dir.path().join(format!("{i}.jsonl"));
            std::fs::write(&path, prompt("2026-12-07T10:00:00Z")).unwrap();
            r.derive(Agent::ClaudeCode, &stop(&path));
        }
        let files = r.files.lock().unwrap();
        assert_eq!(
            (files.offsets.len(), files.order.len()),
            (MAX_FILES, MAX_FILES)
        );
        assert!(!files.offsets.contains_key(&dir.path().join("0.jsonl")));
    }

    #[test]
    fn other_events_and_agents_read_nothing() {
        let pre = br#"{"session_id":"s","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{},"transcript_path":"/t.jsonl"}"#;
        let t = translate(Agent::ClaudeCode, pre, &TranslateOptions::default()).unwrap();
        let r = Transcripts::new();
        assert!(r.derive(Agent::ClaudeCode, &t).is_empty());
        assert_eq!(r.stats(), TranscriptStats::default());
    }
}
