//! The line ingest every NDJSON input shares: parse, check the size, emit through the session
//! map, count.

use super::pace;
use super::sessions::Refused;
use crate::Hooks;
use crate::bus::BusError;
use crate::emitter::Emit;
use crate::event::EventKind;
use crate::ndjson::{self, Input, ParseOptions, TopicRecord};
use serde::Serialize;
use std::sync::atomic::AtomicBool;

/// Errors an [`IngestReport`] keeps; later ones are only counted (`more_errors`).
pub(crate) const MAX_ERRORS: usize = 100;

/// How [`LineIngest`] treats its input.
///
/// # Examples
///
/// ```
/// use prx_hooks::ingest::IngestOptions;
/// let replay = IngestOptions::default().lenient(true).wait_for_room(true);
/// assert!(replay.is_lenient() && replay.waits_for_room());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IngestOptions {
    parse: ParseOptions,
    wait: bool,
}

impl IngestOptions {
    /// Accept events that lack documented payload fields ([`ParseOptions::lenient`]).
    pub fn lenient(mut self, on: bool) -> Self {
        self.parse.lenient = on;
        self
    }

    /// Wait while the pipeline is busy, and for room in the session map, instead of losing
    /// events to the input's own speed (a file replay; `emit` itself never waits). Off: a
    /// full ring is `dropped` and a full session map `refused`, at once.
    pub fn wait_for_room(mut self, on: bool) -> Self {
        self.wait = on;
        self
    }

    /// Whether lines are read leniently (see [`IngestOptions::lenient`]).
    pub fn is_lenient(&self) -> bool {
        self.parse.lenient
    }

    /// Whether ingest waits for room (see [`IngestOptions::wait_for_room`]).
    pub fn waits_for_room(&self) -> bool {
        self.wait
    }
}

/// What happened to one line.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Empty or only whitespace: not an event, not counted.
    Blank,
    /// In the ring.
    Queued,
    /// Refused by `emit`: ring full or byte budget (`stats.dropped`, `dropped_budget`).
    Dropped,
    /// Nobody listens to this event.
    Skipped,
    /// The session map had no room for its key ([`Refused`]).
    Refused,
    /// Not an event, or too large: see [`Ingested::error`].
    Error,
    /// Not read: the ingest was told to stop ([`LineIngest::stop_on`]) before this line's
    /// event could be emitted. Nothing was emitted for it; its reader keeps or says it.
    Stopped,
    /// Its event id ([`LineOrigin`]) belongs to an event that ran already: not emitted again.
    Duplicate,
}

/// Why a line was refused.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IngestErrorKind {
    /// Not a valid NDJSON event (the parser's error, with its column).
    Parse,
    /// Larger than `max_event_bytes` (or too long to be read at all).
    Oversize,
    /// Extra fields `emit_with_extras` refused.
    Extras,
}

/// One refused line: `{"line", "column", "message"}`. `message` is `PATH: REASON` for a parse
/// error (`payload.success: expected a boolean, found "yes"`), the reason otherwise; `column`
/// is 1-based, in bytes, and 1 for errors about the line as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IngestError {
    /// The line's number, from 1.
    pub line: u64,
    /// The byte column, from 1; 1 when the error is about the line as a whole.
    pub column: usize,
    /// `PATH: REASON` for a parse error, the reason otherwise.
    pub message: String,
    /// Why the line was refused (not serialized).
    #[serde(skip)]
    pub kind: IngestErrorKind,
}

/// The accounting of an ingest: every line that is not blank is in exactly one of `queued`,
/// `dropped`, `skipped`, `refused` or the errors (`errors.len() + more_errors`). Serialized
/// as `{"queued":N,"dropped":N,"skipped":N,"refused":N,"errors":[…],"more_errors":N}`.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IngestReport {
    /// Lines whose event went into the ring ([`Outcome::Queued`]).
    pub queued: u64,
    /// Lines whose event `emit` refused: ring full or byte budget ([`Outcome::Dropped`]).
    pub dropped: u64,
    /// Lines whose event nobody listens to ([`Outcome::Skipped`]).
    pub skipped: u64,
    /// Lines whose session key found no room in the session map ([`Outcome::Refused`]).
    pub refused: u64,
    /// The first 100 refused lines.
    pub errors: Vec<IngestError>,
    /// Refused lines beyond those.
    pub more_errors: u64,
    /// Lines not read because the ingest was told to stop ([`Outcome::Stopped`]); left out of
    /// the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub stopped: u64,
    /// Lines whose event id belongs to an event that ran already ([`Outcome::Duplicate`]):
    /// not emitted again. Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub duplicates: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl IngestReport {
    /// Lines that were events or tried to be (blank ones not counted).
    pub fn lines(&self) -> u64 {
        self.queued
            + self.dropped
            + self.skipped
            + self.refused
            + self.errors.len() as u64
            + self.more_errors
            + self.stopped
            + self.duplicates
    }

    fn count(&mut self, outcome: Outcome, error: Option<&IngestError>) {
        match outcome {
            Outcome::Blank => {}
            Outcome::Queued => self.queued += 1,
            Outcome::Dropped => self.dropped += 1,
            Outcome::Skipped => self.skipped += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::Stopped => self.stopped += 1,
            Outcome::Duplicate => self.duplicates += 1,
            Outcome::Error => match error {
                Some(e) if self.errors.len() < MAX_ERRORS => self.errors.push(e.clone()),
                _ => self.more_errors += 1,
            },
        }
    }
}

/// One line's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingested {
    /// What happened to the line.
    pub outcome: Outcome,
    /// The event, when the line parsed as a lifecycle event.
    pub kind: Option<EventKind>,
    /// The custom topic, when the line was a topic line (`prx.agent.<agent>.<event>`).
    pub topic: Option<String>,
    /// Documented fields the line lacked (lenient input only).
    pub omitted: Vec<&'static str>,
    /// Why it was refused ([`Outcome::Error`]; also set for an oversize event, which `emit`
    /// is still given so that the stats count it).
    pub error: Option<IngestError>,
}

impl Ingested {
    fn just(outcome: Outcome) -> Ingested {
        Ingested {
            outcome,
            kind: None,
            topic: None,
            omitted: Vec::new(),
            error: None,
        }
    }
}

/// What a sender says of a line besides its text: the event's id and its original time
/// (ARCHITECTURE.md § Ingest, "Event ids"). `prx-hooks send` gives both; over HTTP they come
/// from the `Prx-Event-Id` and `Prx-Timestamp` headers.
///
/// # Examples
///
/// ```
/// use prx_hooks::ingest::LineOrigin;
/// let origin = LineOrigin::default().id("3f2a9c").time("2026-12-07T10:00:00.5Z");
/// assert_eq!((origin.event_id(), origin.timestamp()), (Some("3f2a9c"), Some("2026-12-07T10:00:00.5Z")));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineOrigin<'a> {
    id: Option<&'a str>,
    time: Option<&'a str>,
}

impl<'a> LineOrigin<'a> {
    /// The event's id: 1 to [`MAX_ID_BYTES`](super::MAX_ID_BYTES) letters, digits, `.`, `_`,
    /// `:` or `-`, the same every time the event is sent. Hooks see it as
    /// `ZERO_HOOK_EVENT_ID`, NATS as the `Nats-Msg-Id`.
    pub fn id(mut self, id: &'a str) -> Self {
        self.id = Some(id);
        self
    }

    /// When the event happened, RFC 3339 in UTC (`2026-12-07T10:00:00.123456Z`): hooks see
    /// it as `ZERO_HOOK_ORIGIN_TIMESTAMP`.
    pub fn time(mut self, time: &'a str) -> Self {
        self.time = Some(time);
        self
    }

    /// The id given with [`LineOrigin::id`].
    pub fn event_id(&self) -> Option<&'a str> {
        self.id
    }

    /// The time given with [`LineOrigin::time`].
    pub fn timestamp(&self) -> Option<&'a str> {
        self.time
    }

    /// Why this origin is refused, if it is: the id's or the time's form.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::ingest::LineOrigin;
    /// assert!(LineOrigin::default().id("a b").checked().is_err());
    /// assert!(LineOrigin::default().time("yesterday").checked().is_err());
    /// ```
    pub fn checked(&self) -> Result<(), String> {
        self.check()
    }

    fn check(&self) -> Result<(), String> {
        if let Some(id) = self.id {
            super::seen::check_id(id).map_err(|e| format!("event id {id:?}: {e}"))?;
        }
        if let Some(t) = self.time
            && (!t.ends_with('Z') || humantime::parse_rfc3339(t).is_err())
        {
            return Err(format!(
                "time {t:?}: expected RFC 3339 in UTC, such as 2026-12-07T10:00:00.123456Z"
            ));
        }
        Ok(())
    }
}

/// Whether a line that was not emitted with its ticket needs no delivery again: it had nothing
/// to run, ran already, or was refused for what it is. Dropped, refused by the session map or
/// stopped: it should be sent again.
fn settles(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Blank
        | Outcome::Queued
        | Outcome::Skipped
        | Outcome::Duplicate
        | Outcome::Error => true,
        Outcome::Dropped | Outcome::Refused | Outcome::Stopped => false,
    }
}

/// What [`LineIngest::line_from`] attaches to a line's event.
struct Attach<'a> {
    origin: LineOrigin<'a>,
    settled: Option<OnSettled>,
}

/// A call made once an ingested event's hooks settled it, with `true` when it ran
/// ([`LineIngest::line_from`]).
pub type OnSettled = Box<dyn FnOnce(bool) + Send + Sync>;

/// Reads NDJSON lines into one [`Hooks`]' pipeline through its [`Sessions`](super::Sessions).
///
/// Per line: [`ndjson::parse_line_with`] (unknown payload members become extra fields; with
/// `lenient`, missing documented fields are left out), then the size check against
/// `max_event_bytes` (an oversize event is an error, said with its line, and still handed to
/// `emit`, which counts it as `oversize`), then an emit through the key's session emitter.
/// With [`IngestOptions::wait_for_room`] it waits first while the pipeline is busy — every
/// 64 lines, and as soon as the events since the last look hold more than an eighth of the
/// byte budget (8 MiB by default), so that large events never exhaust it — and waits for
/// room when the session map refuses a key, until the pipeline shuts down.
///
/// # Examples
///
/// ```
/// use prx_hooks::Hooks;
/// use prx_hooks::ingest::{IngestOptions, LineIngest};
/// let hooks = Hooks::builder().build()?;
/// let _sub = hooks.bus().subscribe("*")?;
/// let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
/// ingest.feed(b"{\"event\":\"turn_complete\",\"agent\":\"a\",\"session\":\"s\"}\n{\"event\":\"nope\"}\n");
/// let report = serde_json::to_string(ingest.report())?;
/// assert_eq!(report, r#"{"queued":1,"dropped":0,"skipped":0,"refused":0,"errors":[{"line":2,"column":1,"message":"agent: missing (a line needs event, agent and session)"}],"more_errors":0}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LineIngest<'h> {
    hooks: &'h Hooks,
    opts: IngestOptions,
    report: IngestReport,
    /// Lines and bytes emitted since the pipeline was last looked at, and how many lines the
    /// last look allowed (`pace::allowance`; 0 before the first look).
    since_lines: usize,
    allowed: usize,
    since_bytes: usize,
    /// The last line number `feed` gave.
    fed: u64,
    /// Set by the reader's owner to stop: no line is emitted after it is seen set.
    stop: Option<&'h AtomicBool>,
}

impl std::fmt::Debug for LineIngest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineIngest")
            .field("opts", &self.opts)
            .field("report", &self.report)
            .field("fed", &self.fed)
            .finish_non_exhaustive()
    }
}

impl<'h> LineIngest<'h> {
    /// An ingest that emits into `hooks`, reading lines as `opts` says.
    pub fn new(hooks: &'h Hooks, opts: IngestOptions) -> LineIngest<'h> {
        LineIngest {
            hooks,
            opts,
            report: IngestReport::default(),
            since_lines: 0,
            allowed: 0,
            since_bytes: 0,
            fed: 0,
            stop: None,
        }
    }

    /// Stops the ingest once `stop` is set: a wait for room ends at once, and that line and
    /// every later one is [`Outcome::Stopped`] (counted as `stopped`, nothing emitted). For
    /// readers that must honour a shutdown while they wait for a busy pipeline.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::Hooks;
    /// use prx_hooks::ingest::{IngestOptions, LineIngest, Outcome};
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// let hooks = Hooks::builder().build()?;
    /// let _sub = hooks.bus().subscribe("*")?;
    /// let stop = AtomicBool::new(false);
    /// let mut ingest = LineIngest::new(&hooks, IngestOptions::default()).stop_on(&stop);
    /// let line = br#"{"event":"turn_complete","agent":"a","session":"s"}"#;
    /// assert_eq!(ingest.line(1, line).outcome, Outcome::Queued);
    /// stop.store(true, Ordering::Release);
    /// assert_eq!(ingest.line(2, line).outcome, Outcome::Stopped);
    /// assert_eq!((ingest.report().queued, ingest.report().stopped), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stop_on(mut self, stop: &'h AtomicBool) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Whether the ingest was told to stop ([`LineIngest::stop_on`]).
    pub fn is_stopped(&self) -> bool {
        pace::stopped(self.stop)
    }

    /// Every line of `text` (split at `\n`; a final line without one counts too), numbered on
    /// from the last line `feed` took (from 1).
    pub fn feed(&mut self, text: &[u8]) {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        if text.is_empty() {
            return;
        }
        for line in text.split(|&b| b == b'\n') {
            self.fed += 1;
            self.line(self.fed, line);
        }
    }

    /// One line (its newline, and a `\r` before it, may be left on). `number` names it in
    /// errors.
    pub fn line(&mut self, number: u64, line: &[u8]) -> Ingested {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let out = self.ingest(number, line, None);
        self.report.count(out.outcome, out.error.as_ref());
        out
    }

    /// [`line`](LineIngest::line) for a line its sender gave an id and a time: a line whose
    /// id belongs to an event that ran already is not emitted again ([`Outcome::Duplicate`]);
    /// otherwise its event carries both to every sink, and once its hooks have settled it
    /// (every hook it was handed to ran or gave up on it; at once when nobody keeps work for
    /// it), its id is remembered if it ran. A bad id or time refuses the line.
    ///
    /// `settled` is called exactly once, with whether the line needs no delivery again:
    /// `true` once its event ran, or at once when there was nothing to run (skipped, a
    /// duplicate, a blank line) or the line is refused for what it is (not an event, too
    /// large); `false` when it should be sent again (the ring or the session map was full,
    /// the ingest was stopped, or a sink gave up on it: a full hook queue, shutdown).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::Hooks;
    /// use prx_hooks::ingest::{IngestOptions, LineIngest, LineOrigin, Outcome};
    /// let hooks = Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("*")?;
    /// let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
    /// let line = br#"{"event":"turn_complete","agent":"a","session":"s"}"#;
    /// let origin = LineOrigin::default().id("e-1");
    /// assert_eq!(ingest.line_from(1, line, origin, None).outcome, Outcome::Queued);
    /// assert_eq!(sub.recv()?.event_id(), Some("e-1"));
    /// // Once it ran (here: handed to the bus, which keeps no work), the same id is not
    /// // emitted again.
    /// # std::thread::sleep(std::time::Duration::from_millis(100));
    /// assert_eq!(ingest.line_from(2, line, origin, None).outcome, Outcome::Duplicate);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn line_from(
        &mut self,
        number: u64,
        line: &[u8],
        origin: LineOrigin<'_>,
        settled: Option<OnSettled>,
    ) -> Ingested {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let plain = origin == LineOrigin::default() && settled.is_none();
        let mut attach = Attach { origin, settled };
        let out = match origin.check() {
            // Nothing to attach: the plain path, which emits without an attachment.
            Ok(()) if plain => self.ingest(number, line, None),
            Ok(()) => self.ingest(number, line, Some(&mut attach)),
            Err(e) => {
                let mut out = Ingested::just(Outcome::Error);
                out.error = Some(IngestError {
                    line: number,
                    column: 1,
                    message: e,
                    kind: IngestErrorKind::Parse,
                });
                out
            }
        };
        // Not handed to a ticket (the event was not emitted with it): settled now.
        if let Some(settled) = attach.settled.take() {
            settled(settles(out.outcome));
        }
        self.report.count(out.outcome, out.error.as_ref());
        out
    }

    /// [`feed`](LineIngest::feed) for a body its sender gave an id and a time: line `n` of
    /// `text` (from 1, blank ones counted, split at `\n`) is event `<id>-<n>`, so the same
    /// body sent again gives the same ids, and is named `n` in errors (each body on its own,
    /// unlike `feed`); each line is [`line_from`](LineIngest::line_from) with the `settled`
    /// call `settled()` makes for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::Hooks;
    /// use prx_hooks::ingest::{IngestOptions, LineIngest, LineOrigin};
    /// let hooks = Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("*")?;
    /// let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
    /// let body = b"{\"event\":\"turn_complete\",\"agent\":\"a\",\"session\":\"s\"}\n\n{\"event\":\"turn_complete\",\"agent\":\"a\",\"session\":\"s\"}\n";
    /// ingest.feed_from(body, LineOrigin::default().id("b7"), || None);
    /// assert_eq!(sub.recv()?.event_id(), Some("b7-1"));
    /// assert_eq!(sub.recv()?.event_id(), Some("b7-3"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn feed_from(
        &mut self,
        text: &[u8],
        base: LineOrigin<'_>,
        mut settled: impl FnMut() -> Option<OnSettled>,
    ) {
        let text = text.strip_suffix(b"\n").unwrap_or(text);
        if text.is_empty() {
            return;
        }
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let n = i as u64 + 1;
            let id = base.id.map(|id| format!("{id}-{n}"));
            let origin = LineOrigin {
                id: id.as_deref(),
                time: base.time,
            };
            self.line_from(n, line, origin, settled());
        }
    }

    /// A line longer than its reader holds (`bytes` is a description: "more than N"),
    /// skipped unread: an oversize error.
    pub fn unread(&mut self, number: u64, bytes: &str) -> Ingested {
        let mut out = Ingested::just(Outcome::Error);
        out.error = Some(self.oversize(number, bytes));
        self.report.count(out.outcome, out.error.as_ref());
        out
    }

    /// Reads the next lines leniently or not ([`IngestOptions::lenient`]): a translated agent
    /// payload that leaves out a field its agent never sends
    /// ([`Translated::lenient`](crate::agents::Translated::lenient)) among strict lines.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::Hooks;
    /// use prx_hooks::ingest::{IngestOptions, LineIngest};
    /// let hooks = Hooks::builder().build()?;
    /// let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
    /// ingest.set_lenient(true);
    /// ingest.line(1, br#"{"event":"agent_end","agent":"a","session":"s"}"#);
    /// assert!(ingest.report().errors.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_lenient(&mut self, on: bool) {
        self.opts = self.opts.lenient(on);
    }

    /// Every line of an agent's translated payload ([`crate::agents::translate`]), in order,
    /// read leniently where the payload says so: the first keeps `origin`'s event id, line `n`
    /// after it carries `<id>-<n>` (a turn's end is `turn_complete` then `agent_end`, and each
    /// must run once however often the payload is sent again), and the agent's own time, where
    /// it gives one, is the events'. `settled` gives each line its settle call. Returns the
    /// first line's outcome.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::{Agent, TranslateOptions, translate};
    /// use prx_hooks::ingest::{IngestOptions, LineIngest, LineOrigin, Outcome};
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let _sub = hooks.bus().subscribe("*")?;
    /// let stop = br#"{"session_id":"s","hook_event_name":"Stop"}"#;
    /// let t = translate(Agent::ClaudeCode, stop, &TranslateOptions::default())?;
    /// let mut lines = LineIngest::new(&hooks, IngestOptions::default());
    /// let first = lines.translated_from(&t, LineOrigin::default().id("e1"), || None);
    /// assert_eq!(first, Outcome::Queued);
    /// assert_eq!(lines.report().queued, 2); // turn_complete (e1), agent_end (e1-2)
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn translated_from(
        &mut self,
        t: &crate::agents::Translated,
        origin: LineOrigin<'_>,
        mut settled: impl FnMut() -> Option<OnSettled>,
    ) -> Outcome {
        self.set_lenient(t.lenient);
        let origin = match &t.time {
            Some(time) => origin.time(time),
            None => origin,
        };
        let mut first = None;
        for (n, (line, _)) in (1u64..).zip(t.lines()) {
            let numbered = (n > 1)
                .then(|| origin.event_id().map(|id| format!("{id}-{n}")))
                .flatten();
            let o = match &numbered {
                Some(id) => origin.id(id),
                None => origin,
            };
            let got = self.line_from(n, line.as_bytes(), o, settled());
            first.get_or_insert(got.outcome);
        }
        first.unwrap_or(Outcome::Refused)
    }

    /// A line refused before it could be read as an event (an agent payload that could not
    /// be translated, …): an error at `column` with `message`, counted like any.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::Hooks;
    /// use prx_hooks::ingest::{IngestOptions, LineIngest};
    /// let hooks = Hooks::builder().build()?;
    /// let mut ingest = LineIngest::new(&hooks, IngestOptions::default());
    /// ingest.refuse(1, 3, "session_id: missing");
    /// assert_eq!(ingest.report().errors[0].message, "session_id: missing");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refuse(&mut self, number: u64, column: usize, message: &str) -> Ingested {
        let mut out = Ingested::just(Outcome::Error);
        out.error = Some(IngestError {
            line: number,
            column,
            message: message.to_string(),
            kind: IngestErrorKind::Parse,
        });
        self.report.count(out.outcome, out.error.as_ref());
        out
    }

    /// The accounting of every line fed so far.
    pub fn report(&self) -> &IngestReport {
        &self.report
    }

    /// Ends the ingest and returns its accounting.
    pub fn into_report(self) -> IngestReport {
        self.report
    }

    fn oversize(&self, number: u64, bytes: &str) -> IngestError {
        IngestError {
            line: number,
            column: 1,
            message: format!(
                "event of {bytes} bytes exceeds max_event_bytes ({})",
                self.hooks.producers.max_event_bytes()
            ),
            kind: IngestErrorKind::Oversize,
        }
    }

    fn ingest(&mut self, number: u64, line: &[u8], attach: Option<&mut Attach<'_>>) -> Ingested {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ingested::just(Outcome::Blank);
        }
        if self.is_stopped() {
            return Ingested::just(Outcome::Stopped);
        }
        let record = match ndjson::parse_input_with(line, self.opts.parse) {
            Ok(Input::Event(record)) => record,
            Ok(Input::Topic(topic)) => return self.publish(number, topic, attach),
            Err(e) => {
                let message = match e.path() {
                    "" => e.reason().to_string(),
                    p => format!("{p}: {}", e.reason()),
                };
                let mut out = Ingested::just(Outcome::Error);
                out.error = Some(IngestError {
                    line: number,
                    column: e.column(),
                    message,
                    kind: IngestErrorKind::Parse,
                });
                return out;
            }
        };
        let bytes = record.byte_len();
        let mut out = Ingested {
            outcome: Outcome::Queued,
            kind: Some(record.kind()),
            topic: None,
            omitted: record.omitted().to_vec(),
            error: None,
        };
        if let Some(id) = attach.as_ref().and_then(|a| a.origin.id)
            && self.hooks.seen.contains(id)
        {
            self.hooks.seen.count_duplicate();
            return Ingested::just(Outcome::Duplicate);
        }
        let oversize = bytes > self.hooks.producers.max_event_bytes();
        if oversize {
            out.error = Some(self.oversize(number, &bytes.to_string()));
        } else if self.opts.wait {
            self.pace(bytes);
        }
        if self.is_stopped() {
            return Ingested::just(Outcome::Stopped);
        }
        let em = match self.session(&record.agent, &record.session) {
            Ok(em) => em,
            Err(_) if self.is_stopped() => return Ingested::just(Outcome::Stopped),
            Err(_) => {
                out.outcome = if oversize {
                    Outcome::Error
                } else {
                    Outcome::Refused
                };
                return out;
            }
        };
        let emitted = if let Some(attach) = attach.filter(|_| !oversize) {
            let extras = record.extras();
            let extras = record.has_extras().then_some(&extras);
            em.emit_attached(record.event(), extras, self.attached(attach))
        } else if record.has_extras() {
            em.emit_with_extras(record.event(), &record.extras())
        } else {
            Ok(em.emit(record.event()))
        };
        let emitted = match emitted {
            Ok(emitted) => emitted,
            Err(e) => {
                // Checked by the parser already: an error here is a parser bug, reported like
                // a bad line rather than lost.
                out.outcome = Outcome::Error;
                out.error = Some(IngestError {
                    line: number,
                    column: 1,
                    message: e.to_string(),
                    kind: IngestErrorKind::Extras,
                });
                return out;
            }
        };
        if emitted == Emit::Queued && !oversize {
            let tokens = super::Tokens::from_extras(record.extras_json());
            if !tokens.is_zero() {
                em.count_tokens(tokens);
            }
        }
        out.outcome = match emitted {
            // Refused for its size: counted as the error said above (and by `emit` in the
            // stats' `oversize`), not as a drop.
            _ if oversize => Outcome::Error,
            Emit::Queued => Outcome::Queued,
            Emit::Skipped => Outcome::Skipped,
            _ => Outcome::Dropped,
        };
        out
    }

    /// What an event with `attach` carries to its message: its id and time, and the ticket
    /// that remembers the id once the event ran and calls the reader's `settled`.
    fn attached(&self, attach: &mut Attach<'_>) -> crate::settle::Attached {
        let seen = self.hooks.seen.clone();
        let id = attach.origin.id.map(str::to_string);
        let settled = attach.settled.take();
        let remembered = id.clone();
        let report = move |ran: bool| {
            if ran && let Some(id) = &remembered {
                seen.record(id);
            }
            if let Some(settled) = settled {
                settled(ran);
            }
        };
        let ticket = crate::settle::Ticket::calling(Box::new(report));
        let time = attach.origin.time.map(str::to_string);
        crate::settle::Attached::new(time, None, Some(ticket)).with_delivery(id, None, false)
    }

    /// A topic line, published on the bus at once (custom topics have no ring): taken by a
    /// subscriber → queued, by none → skipped, refused by the bus → an error with its reason.
    /// With an id, a topic line that ran already is a duplicate, and one published is
    /// remembered at once (the bus keeps no work for it).
    fn publish(
        &mut self,
        number: u64,
        line: TopicRecord,
        attach: Option<&mut Attach<'_>>,
    ) -> Ingested {
        let id = attach.as_ref().and_then(|a| a.origin.id);
        if let Some(id) = id
            && self.hooks.seen.contains(id)
        {
            self.hooks.seen.count_duplicate();
            return Ingested::just(Outcome::Duplicate);
        }
        let published =
            self.hooks
                .bus()
                .publish_from(&line.topic, &line.agent, &line.session, &line.payload);
        let mut out = Ingested::just(match published {
            Ok(0) => Outcome::Skipped,
            Ok(_) => Outcome::Queued,
            Err(_) => Outcome::Error,
        });
        if let (Ok(_), Some(id)) = (&published, id) {
            self.hooks.seen.record(id);
        }

        if let Err(e) = published {
            out.error = Some(IngestError {
                line: number,
                column: 1,
                message: e.to_string(),
                kind: match e {
                    BusError::PayloadTooLarge { .. } => IngestErrorKind::Oversize,
                    _ => IngestErrorKind::Parse,
                },
            });
        }
        out.topic = Some(line.topic);
        out
    }

    /// The key's session emitter; when waiting for room, asks again until it is given or the
    /// pipeline shuts down (then counts one refusal).
    fn session(&self, agent: &str, session: &str) -> Result<super::SessionEmitter<'h>, Refused> {
        let sessions = self.hooks.sessions();
        if !self.opts.wait {
            return sessions.get(agent, session);
        }
        loop {
            match sessions.get_counted(agent, session, false) {
                Ok(em) => return Ok(em),
                // Counted already: asking again would give the same answer.
                Err(refused) if refused.is_permanent() => return Err(refused),
                Err(refused) if pace::closed(self.hooks) => {
                    sessions.count_refused(agent, session);
                    return Err(refused);
                }
                Err(refused) if self.is_stopped() => return Err(refused),
                Err(_) => std::thread::sleep(pace::NAP),
            }
        }
    }

    /// Waits for room before the first line, then whenever the lines since the last look
    /// reach what it allowed (at most 64, fewer when a backend's queue is nearly full:
    /// `pace::allowance`) or hold an eighth of the byte budget.
    fn pace(&mut self, bytes: usize) {
        let large = bytes > self.hooks.producers.inline_bytes();
        if large {
            self.since_bytes = self.since_bytes.saturating_add(bytes);
        }
        let (budget, _) = self.hooks.producers.budget();
        if self.since_lines >= self.allowed || self.since_bytes >= budget / 8 {
            self.allowed =
                pace::wait_for_room(self.hooks, if large { bytes } else { 0 }, self.stop);
            self.since_lines = 0;
            self.since_bytes = if large { bytes } else { 0 };
        }
        self.since_lines += 1;
    }
}
