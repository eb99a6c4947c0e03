//! The hook payloads of other agents (Claude Code, OpenAI Codex CLI, Gemini CLI, Cursor,
//! GitHub Copilot CLI, Cline, Qwen Code, Factory Droid, Windsurf, Kiro CLI), translated into
//! prx-hooks NDJSON lines (docs/agents.md has every mapping).
//!
//! An agent's hook sends one JSON object per call. [`translate`] turns it into the lines that
//! [`LineIngest`](crate::ingest::LineIngest) reads ([`Translated::lines`]; most payloads make
//! one):
//!
//! * **turns**: the event that opens a turn (a prompt submitted: Claude Code's
//!   `UserPromptSubmit`, Gemini CLI's `BeforeAgent`, Cursor's `beforeSubmitPrompt`, …) is
//!   `agent_start`; the one that closes it (`Stop`, `AfterAgent`, `stop`, …) is
//!   `turn_complete` then `agent_end` (`success` where the agent says how the turn ended); a
//!   turn that fails (`StopFailure`) is `error` then `agent_end` with `success` false;
//! * **tool calls** are `tool_call_start` and `tool_call`, model calls (Gemini CLI)
//!   `llm_request` and `llm_response`;
//! * **sessions** start and end as topics, `prx.agent.<agent>.session_start` and
//!   `prx.agent.<agent>.session_end`: the 8 events are PRX's, and a session is not a turn;
//! * a **subagent** is an emitter of its own: session `<session>/<agent id>`, with the
//!   parent's session as the extra field `parent_session`;
//! * **token counts** the agent gives become `input_tokens`, `output_tokens`,
//!   `cache_read_input_tokens` and `cache_creation_input_tokens`;
//! * `agent` is the agent's name and `session` its session id. A documented field the agent
//!   does not send (Codex never says whether a tool succeeded) is left out of the payload, as
//!   `--lenient` does: such lines are read with [`Translated::lenient`] set. Every other
//!   member the agent sent is kept as an extra field, byte-exact (a member whose name is one
//!   of the event's own fields is kept as `agent_<name>`);
//! * everything else (and events a newer agent version adds) is a **topic line**,
//!   `prx.agent.<agent>.<event>`, carrying the agent's whole object: nothing an agent sends is
//!   dropped silently.
//!
//! [`Agent::hook_events`] says, per documented event, which handler types the agent runs, what
//! it becomes and whether it closes a turn or a session.
//!
//! ```
//! use prx_hooks::agents::{Agent, TranslateOptions, Target, translate};
//! let input = br#"{"session_id":"abc","hook_event_name":"PreToolUse","tool_name":"Bash","tool_input":{"command":"ls"},"cwd":"/p"}"#;
//! let t = translate(Agent::ClaudeCode, input, &TranslateOptions::default())?;
//! assert_eq!(t.target, Target::Lifecycle(prx_hooks::EventKind::ToolCallStart));
//! assert_eq!(t.line, r#"{"event":"tool_call_start","agent":"claude-code","session":"abc","payload":{"tool":"Bash","arguments":{"command":"ls"},"session_id":"abc","hook_event_name":"PreToolUse","cwd":"/p"}}"#);
//! # Ok::<(), prx_hooks::agents::TranslateError>(())
//! ```

mod claude_code;
mod claude_shaped;
mod cline;
mod codex;
mod copilot_cli;
mod cursor;
mod factory_droid;
mod gemini_cli;
mod kiro;
mod plan;
mod qwen_code;
mod read;
pub mod transcript;
mod windsurf;

use crate::EventKind;
use plan::{Plan, payload};
use read::{Members, Payload, one_line, place, quote, shown};
use std::fmt;

/// An agent whose hook payloads [`translate`] reads.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Agent {
    /// Anthropic's Claude Code (`hooks` in `.claude/settings.json`; command and `http` hooks).
    ClaudeCode,
    /// OpenAI's Codex CLI (its hooks, `hooks.json`, and the `notify` program of
    /// `~/.codex/config.toml`).
    Codex,
    /// Google's Gemini CLI (`hooks` in `.gemini/settings.json`).
    GeminiCli,
    /// Cursor (`.cursor/hooks.json`).
    Cursor,
    /// GitHub Copilot CLI (`.github/hooks/*.json`; both of its payload formats).
    CopilotCli,
    /// Cline (executable hook scripts in `.clinerules/hooks/` or `~/Documents/Cline/Hooks/`).
    Cline,
    /// Qwen Code (`hooks` in `.qwen/settings.json`; command and `http` hooks).
    QwenCode,
    /// Factory's Droid (`.factory/hooks.json`, or `hooks` in `.factory/settings.json`).
    FactoryDroid,
    /// Windsurf's Cascade (`hooks.json` of the system, the user or the workspace).
    Windsurf,
    /// Kiro CLI (`hooks` in an agent's configuration, `.kiro/agents/*.json`).
    Kiro,
}

impl Agent {
    /// Every supported agent, in declaration order.
    pub const ALL: [Agent; 10] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::GeminiCli,
        Agent::Cursor,
        Agent::CopilotCli,
        Agent::Cline,
        Agent::QwenCode,
        Agent::FactoryDroid,
        Agent::Windsurf,
        Agent::Kiro,
    ];

    /// `claude-code`, `codex`, `gemini-cli`, `cursor`, `copilot-cli`, `cline`, `qwen-code`,
    /// `factory-droid`, `windsurf` or `kiro`.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::Agent;
    /// assert_eq!(Agent::from_name("gemini-cli"), Some(Agent::GeminiCli));
    /// assert_eq!(Agent::from_name("claude"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Agent> {
        Agent::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The name in lines, topics and URLs: `claude-code`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(prx_hooks::agents::Agent::Cursor.name(), "cursor");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
            Agent::Cursor => "cursor",
            Agent::CopilotCli => "copilot-cli",
            Agent::Cline => "cline",
            Agent::QwenCode => "qwen-code",
            Agent::FactoryDroid => "factory-droid",
            Agent::Windsurf => "windsurf",
            Agent::Kiro => "kiro",
        }
    }

    /// The name people know it by: `Claude Code`, `GitHub Copilot CLI`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(prx_hooks::agents::Agent::GeminiCli.title(), "Gemini CLI");
    /// ```
    pub fn title(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code",
            Agent::Codex => "Codex",
            Agent::GeminiCli => "Gemini CLI",
            Agent::Cursor => "Cursor",
            Agent::CopilotCli => "GitHub Copilot CLI",
            Agent::Cline => "Cline",
            Agent::QwenCode => "Qwen Code",
            Agent::FactoryDroid => "Factory Droid",
            Agent::Windsurf => "Windsurf",
            Agent::Kiro => "Kiro CLI",
        }
    }

    /// The event named `name` in the agent's documentation (by its name or its
    /// [`alias`](HookEvent::alias)), if it lists one.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::Agent;
    /// assert!(Agent::Codex.hook_event("SessionEnd").is_some_and(|e| e.closes));
    /// assert!(Agent::Codex.hook_event("StopFailure").is_none());
    /// // Copilot CLI's PascalCase name of agentStop.
    /// assert_eq!(Agent::CopilotCli.hook_event("Stop").map(|e| e.name), Some("agentStop"));
    /// ```
    pub fn hook_event(self, name: &str) -> Option<&'static HookEvent> {
        self.hook_events()
            .iter()
            .find(|e| e.name == name || e.alias == Some(name))
    }

    /// The events the agent's documentation lists (docs/agents.md) that a hook should be
    /// written for, each mapped: every one of [`Agent::hook_events`] whose
    /// [`subscribe`](HookEvent::subscribe) is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::Agent;
    /// assert!(Agent::ClaudeCode.events().contains(&"PostToolUse"));
    /// // Fired for every streamed chunk of a reply: documented, not subscribed.
    /// assert!(!Agent::ClaudeCode.events().contains(&"MessageDisplay"));
    /// ```
    pub fn events(self) -> &'static [&'static str] {
        self.spec().events
    }

    /// Every event the agent's documentation lists, in its order, with the handler types the
    /// agent runs for it and what [`translate`] makes of it.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::{Agent, Handlers};
    /// let stop = Agent::ClaudeCode.hook_events().iter().find(|e| e.name == "Stop").unwrap();
    /// assert!(stop.closes && stop.handlers.contains(Handlers::HTTP));
    /// assert_eq!(stop.maps_to, "turn_complete, agent_end");
    /// let start = Agent::ClaudeCode.hook_events().iter().find(|e| e.name == "SessionStart").unwrap();
    /// assert!(!start.handlers.contains(Handlers::HTTP), "Claude Code runs no http hook there");
    /// ```
    pub fn hook_events(self) -> &'static [HookEvent] {
        self.spec().hook_events
    }

    /// Whether the agent reads what a hook prints on stdout as the hook's answer (and, for
    /// some, stderr when stdout is empty): `prx-hooks send --from` then prints `{}`, "no
    /// decision", when it exits 0. False for agents that add stdout to the model's context
    /// (Kiro CLI) or whose documentation does not say (Windsurf).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::Agent;
    /// assert!(Agent::GeminiCli.answers_on_stdout());
    /// assert!(!Agent::Kiro.answers_on_stdout());
    /// ```
    pub fn answers_on_stdout(self) -> bool {
        self.spec().answers_on_stdout
    }

    /// Where the documentation this mapping follows lives.
    pub fn documentation(self) -> &'static str {
        self.spec().docs
    }

    fn spec(self) -> &'static Spec {
        match self {
            Agent::ClaudeCode => &claude_code::SPEC,
            Agent::Codex => &codex::SPEC,
            Agent::GeminiCli => &gemini_cli::SPEC,
            Agent::Cursor => &cursor::SPEC,
            Agent::CopilotCli => &copilot_cli::SPEC,
            Agent::Cline => &cline::SPEC,
            Agent::QwenCode => &qwen_code::SPEC,
            Agent::FactoryDroid => &factory_droid::SPEC,
            Agent::Windsurf => &windsurf::SPEC,
            Agent::Kiro => &kiro::SPEC,
        }
    }
}

impl fmt::Display for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The handler types an agent runs for one of its events (a set).
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::Handlers;
/// let h = Handlers::COMMAND.with(Handlers::HTTP);
/// assert!(h.contains(Handlers::COMMAND) && !h.contains(Handlers::PROMPT));
/// assert_eq!(h.names().collect::<Vec<_>>(), ["command", "http"]);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Handlers(u8);

impl Handlers {
    /// A program the agent runs with the payload on stdin (or, for Codex's `notify`, as its
    /// last argument): what `prx-hooks send --from` is.
    pub const COMMAND: Handlers = Handlers(1);
    /// An HTTP POST of the payload (Claude Code's and Qwen Code's `http` hooks): what
    /// `POST /api/ingest/{agent}` takes.
    pub const HTTP: Handlers = Handlers(2);
    /// A tool of an MCP server (Claude Code's `mcp_tool`).
    pub const MCP_TOOL: Handlers = Handlers(4);
    /// A prompt the agent's model evaluates.
    pub const PROMPT: Handlers = Handlers(8);
    /// A subagent the agent runs.
    pub const AGENT: Handlers = Handlers(16);

    const NAMES: [(Handlers, &'static str); 5] = [
        (Handlers::COMMAND, "command"),
        (Handlers::HTTP, "http"),
        (Handlers::MCP_TOOL, "mcp_tool"),
        (Handlers::PROMPT, "prompt"),
        (Handlers::AGENT, "agent"),
    ];

    /// Both sets.
    pub const fn with(self, other: Handlers) -> Handlers {
        Handlers(self.0 | other.0)
    }

    /// Whether every type of `other` is in this set.
    pub const fn contains(self, other: Handlers) -> bool {
        self.0 & other.0 == other.0
    }

    /// The one type an agent's settings name `name` (`command`, `http`, `mcp_tool`, `prompt`,
    /// `agent`), or `None` for a name no agent has.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::Handlers;
    /// assert_eq!(Handlers::from_name("http"), Some(Handlers::HTTP));
    /// assert_eq!(Handlers::from_name("webhook"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Handlers> {
        Handlers::NAMES
            .into_iter()
            .find(|(_, n)| *n == name)
            .map(|(h, _)| h)
    }

    /// The types' names as the agents spell them in their settings (`command`, `http`,
    /// `mcp_tool`, `prompt`, `agent`).
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Handlers::NAMES
            .into_iter()
            .filter(move |(h, _)| self.contains(*h))
            .map(|(_, n)| n)
    }
}

/// One event an agent's hook documentation lists ([`Agent::hook_events`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookEvent {
    /// The agent's name for it (`PostToolUse`), as its settings key it.
    pub name: &'static str,
    /// The handler types the agent runs for it.
    pub handlers: Handlers,
    /// It closes a turn or a session (`Stop`, `SessionEnd`): a hook there should run
    /// synchronously, or the agent may exit before a background hook delivered it.
    pub closes: bool,
    /// What [`translate`] makes of it, for people: `tool_call`, `turn_complete, agent_end`,
    /// `topic session_start`, `topic`, with a condition where one decides
    /// (docs/agents.md has the details).
    pub maps_to: &'static str,
    /// Whether a hook should be written for it ([`Agent::events`]): false for events that
    /// fire for every streamed chunk of a reply (Claude Code's `MessageDisplay`) or whose
    /// payload cannot be told apart from another event's ([`note`](HookEvent::note) says
    /// why).
    pub subscribe: bool,
    /// Another name the agent's settings may give it, with the same event (Copilot CLI's
    /// PascalCase names, `PreToolUse` for `preToolUse`, which choose its payloads in
    /// snake_case with `hook_event_name`).
    pub alias: Option<&'static str>,
    /// A hook here takes over a step of the agent (Claude Code's `WorktreeCreate` runs it
    /// instead of `git worktree add`): no hook that only reports should ever be written for it,
    /// even on request ([`note`](HookEvent::note) says why). Implies `subscribe` false.
    pub takes_over: bool,
    /// Whether the agent reads what a hook prints on stdout here as the hook's answer (a
    /// decision, context to add): a hook with nothing to say prints `{}` or nothing, never
    /// text. False where the agent adds stdout to the model's context as it is (Kiro CLI) or
    /// its documentation does not say (Windsurf).
    pub reads_stdout: bool,
    /// What to know about the event, for people: why no hook should be written for it, or
    /// how its mapping is limited (`None`: nothing).
    pub note: Option<&'static str>,
}

/// What [`translate`] may replace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TranslateOptions {
    /// The line's agent instead of the agent's name (`claude-code`).
    pub agent: Option<String>,
    /// The line's session instead of the agent's session id (required when the agent sends
    /// none). A subagent's session is this, `/`, and its id.
    pub session: Option<String>,
}

/// Where a translated payload goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A lifecycle event of this kind (a line in the `run --events` format).
    Lifecycle(EventKind),
    /// `prx.agent.<agent>.<event>`.
    Topic(String),
}

/// One translated payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Translated {
    /// One NDJSON line (no newline): an event in the `run --events` format, or a topic line.
    pub line: String,
    /// Whether the line is a lifecycle event or a topic message, and which.
    pub target: Target,
    /// The agent's own name for the event (`PostToolUse`).
    pub event: String,
    /// A line leaves out a documented field the agent does not send: read them leniently.
    pub lenient: bool,
    /// The lines that follow [`line`](Translated::line), in order: a turn's end is
    /// `turn_complete` then `agent_end`, a failed turn `error` then `agent_end`.
    pub then: Vec<Followup>,
    /// When the event happened, as the agent says (Gemini CLI's, Copilot CLI's, Qwen Code's,
    /// Cline's and Windsurf's `timestamp`), in RFC 3339 UTC: what an ingest passes as
    /// [`LineOrigin::time`](crate::ingest::LineOrigin::time). `None` when the agent gives no
    /// time or one that is not RFC 3339 (or milliseconds since the epoch).
    pub time: Option<String>,
}

/// A line after the first of a [`Translated`] payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followup {
    /// One NDJSON line (no newline).
    pub line: String,
    /// What it is.
    pub target: Target,
}

impl Translated {
    /// Every line, in order: [`line`](Translated::line), then [`then`](Translated::then).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
    /// use prx_hooks::EventKind;
    /// let t = translate(Agent::ClaudeCode, br#"{"session_id":"s","hook_event_name":"Stop"}"#, &TranslateOptions::default())?;
    /// let kinds: Vec<_> = t.lines().map(|(_, target)| target.clone()).collect();
    /// assert_eq!(kinds, [Target::Lifecycle(EventKind::TurnComplete), Target::Lifecycle(EventKind::AgentEnd)]);
    /// # Ok::<(), prx_hooks::agents::TranslateError>(())
    /// ```
    pub fn lines(&self) -> impl Iterator<Item = (&str, &Target)> {
        std::iter::once((self.line.as_str(), &self.target))
            .chain(self.then.iter().map(|f| (f.line.as_str(), &f.target)))
    }
}

/// Why a payload could not be translated. Displays as `LINE:COL: PATH: REASON` (1-based; the
/// path `$` is the payload as a whole).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslateError {
    line: usize,
    column: usize,
    path: String,
    reason: String,
}

impl TranslateError {
    pub(crate) fn at(
        line: usize,
        column: usize,
        path: &str,
        reason: impl Into<String>,
    ) -> TranslateError {
        let reason: String = reason.into();
        TranslateError {
            line,
            column,
            path: if path.is_empty() {
                "$".into()
            } else {
                crate::ndjson::one_line(path.into())
            },
            reason: reason
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect(),
        }
    }

    /// The 1-based line of the payload where the problem is.
    pub fn line(&self) -> usize {
        self.line
    }

    /// The 1-based column (in characters) on that line.
    pub fn column(&self) -> usize {
        self.column
    }

    /// `$`, `hook_event_name`, `tool_input`, …
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong, on one line (control characters become spaces).
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for TranslateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.line, self.column, self.path, self.reason
        )
    }
}

impl std::error::Error for TranslateError {}

/// One agent's documented events and how each maps.
pub(crate) struct Spec {
    pub docs: &'static str,
    /// The members naming the event, the first present wins (`hook_event_name`; Codex's
    /// `notify` program: `type`).
    pub event_fields: &'static [&'static str],
    /// The event's name when no event field is present, from the members the payload has
    /// (Copilot CLI's camelCase payloads, Cline's).
    pub infer_event: Option<fn(&Payload<'_>) -> Option<&'static str>>,
    /// The members holding the session id, the first present wins.
    pub session_fields: &'static [&'static str],
    pub hook_events: &'static [HookEvent],
    /// The names of the `hook_events` to subscribe to.
    pub events: &'static [&'static str],
    pub answers_on_stdout: bool,
    pub map: fn(&Payload<'_>, &mut Plan) -> Result<(), TranslateError>,
}

/// The names of the events of `all` to subscribe to, in order (`N`: how many there are).
pub(crate) const fn subscribed<const N: usize>(all: &[HookEvent]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut n) = (0, 0);
    while i < all.len() {
        if all[i].subscribe {
            out[n] = all[i].name;
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "N is the number of subscribed events");
    out
}

/// A [`HookEvent`] (for the specs).
pub(crate) const fn ev(name: &'static str, handlers: Handlers, maps_to: &'static str) -> HookEvent {
    HookEvent {
        name,
        handlers,
        closes: false,
        maps_to,
        subscribe: true,
        alias: None,
        takes_over: false,
        reads_stdout: true,
        note: None,
    }
}

impl HookEvent {
    /// It closes a turn or a session.
    pub(crate) const fn closing(mut self) -> HookEvent {
        self.closes = true;
        self
    }

    /// No hook should be written for it, for the reason `why`.
    pub(crate) const fn unsubscribed(mut self, why: &'static str) -> HookEvent {
        self.subscribe = false;
        self.note = Some(why);
        self
    }

    /// The agent's settings may also name it `alias`.
    pub(crate) const fn also(mut self, alias: &'static str) -> HookEvent {
        self.alias = Some(alias);
        self
    }

    /// A hook here takes over a step of the agent, for the reason `why`: never written.
    pub(crate) const fn taking_over(mut self, why: &'static str) -> HookEvent {
        self.takes_over = true;
        self.unsubscribed(why)
    }

    /// The agent does not read the hook's stdout as its answer here.
    pub(crate) const fn stdout_unread(mut self) -> HookEvent {
        self.reads_stdout = false;
        self
    }

    /// What to know about it.
    pub(crate) const fn noted(mut self, note: &'static str) -> HookEvent {
        self.note = Some(note);
        self
    }
}

/// Translates one payload of `agent`'s hook into prx-hooks lines.
///
/// # Examples
///
/// ```
/// use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
/// let t = translate(Agent::ClaudeCode, br#"{"session_id":"s","hook_event_name":"Notification","message":"hi"}"#, &TranslateOptions::default())?;
/// assert_eq!(t.target, Target::Topic("prx.agent.claude-code.Notification".into()));
/// let e = translate(Agent::ClaudeCode, b"{\"hook_event_name\": \"Stop\",\n  \"session_id\": 3\n}", &TranslateOptions::default()).unwrap_err();
/// assert_eq!(e.to_string(), "2:17: session_id: expected a string, found 3");
/// # Ok::<(), prx_hooks::agents::TranslateError>(())
/// ```
pub fn translate(
    agent: Agent,
    input: &[u8],
    opts: &TranslateOptions,
) -> Result<Translated, TranslateError> {
    let spec = agent.spec();
    let text = decode(input)?;
    let mut p = Payload {
        text,
        members: parse_members(text)?,
        event: String::new(),
    };
    unique_names(&p)?;
    p.event = event_name(agent, spec, &p)?;
    let session = session_id(spec, opts, &p)?;
    let agent_name = opts
        .agent
        .clone()
        .unwrap_or_else(|| agent.name().to_string());
    let mut plan = Plan::default();
    (spec.map)(&p, &mut plan)?;
    if plan.lines.is_empty() {
        plan.topic(&p);
    }
    let (session, parent) = match &plan.subagent {
        None => (session, None),
        Some(sub) => {
            let parent = sub.parent.clone().unwrap_or(session);
            (format!("{parent}/{}", sub.id), Some(parent))
        }
    };
    let spread = plan
        .spread
        .map(|name| (name, plan.spread_consumed.as_slice()));
    let mut lines = Vec::with_capacity(plan.lines.len());
    let mut lenient = false;
    for mut out in std::mem::take(&mut plan.lines) {
        if let Some(parent) = &parent {
            out = out.set("parent_session", quote(parent));
        }
        lenient |= out.lenient;
        lines.push(match out.kind {
            Some(kind) => {
                let body = payload(kind.fields(), &out.fields, &p, &plan.consumed, spread);
                (
                    format!(
                        "{{\"event\":{},\"agent\":{},\"session\":{},\"payload\":{}}}",
                        quote(kind.name()),
                        quote(&agent_name),
                        quote(&session),
                        one_line(&body)
                    ),
                    Target::Lifecycle(kind),
                )
            }
            None => {
                let topic = topic(agent, &out.topic);
                // The agent's object as it came, or rebuilt after the fields PRX adds.
                let body = if out.fields.is_empty() {
                    one_line(text.trim())
                } else {
                    one_line(&payload(&[], &out.fields, &p, &[], None))
                };
                (
                    format!(
                        "{{\"topic\":{},\"agent\":{},\"session\":{},\"payload\":{body}}}",
                        quote(&topic),
                        quote(&agent_name),
                        quote(&session),
                    ),
                    Target::Topic(topic),
                )
            }
        });
    }
    let mut lines = lines.into_iter();
    let (line, target) = lines.next().expect("a plan has a line");
    Ok(Translated {
        line,
        target,
        event: p.event,
        lenient,
        then: lines
            .map(|(line, target)| Followup { line, target })
            .collect(),
        time: plan.time,
    })
}

/// The payload as text: UTF-8, without a byte order mark.
fn decode(input: &[u8]) -> Result<&str, TranslateError> {
    let text = std::str::from_utf8(input).map_err(|e| {
        let valid = std::str::from_utf8(&input[..e.valid_up_to()]).unwrap_or_default();
        let (line, col) = place(valid, valid.len());
        TranslateError::at(line, col, "$", "not UTF-8")
    })?;
    // A byte order mark some Windows tools write before the object.
    Ok(text.strip_prefix('\u{feff}').unwrap_or(text))
}

/// The payload's members, in order, each with its raw value.
fn parse_members(
    text: &str,
) -> Result<Vec<(std::borrow::Cow<'_, str>, &serde_json::value::RawValue)>, TranslateError> {
    let members: Members<'_> = serde_json::from_str(text).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON: ",
            _ => "",
        };
        TranslateError::at(
            e.line().max(1),
            e.column().max(1),
            "$",
            format!("{what}{msg}"),
        )
    })?;
    Ok(members.0)
}

/// A name that appears twice is an error at its second place.
fn unique_names(p: &Payload<'_>) -> Result<(), TranslateError> {
    let mut names = std::collections::HashSet::with_capacity(p.members.len());
    for (key, raw) in &p.members {
        if !names.insert(key.as_ref()) {
            return Err(p.error_at(raw, key, "appears twice"));
        }
    }
    Ok(())
}

/// The member `name`, a string.
fn string(p: &Payload<'_>, name: &str) -> Result<Option<String>, TranslateError> {
    let Some(raw) = p.get(name) else {
        return Ok(None);
    };
    serde_json::from_str::<String>(raw.get())
        .map(Some)
        .map_err(|_| {
            p.error_at(
                raw,
                name,
                format!("expected a string, found {}", shown(raw.get())),
            )
        })
}

/// The agent's name for the event: the first of the spec's event fields present, else what
/// its members say.
fn event_name(agent: Agent, spec: &Spec, p: &Payload<'_>) -> Result<String, TranslateError> {
    if let Some(name) = spec.event_fields.iter().find(|f| p.has(f)) {
        return Ok(string(p, name)?.unwrap_or_default());
    }
    if let Some(name) = spec.infer_event.and_then(|infer| infer(p)) {
        return Ok(name.to_string());
    }
    let by = if spec.infer_event.is_some() {
        ", or by the members it has"
    } else {
        ""
    };
    Err(TranslateError::at(
        1,
        1,
        spec.event_fields[0],
        match spec.event_fields {
            [_] => format!("missing (a {agent} hook payload names its event in it{by})"),
            all => format!(
                "missing (a {agent} hook payload names its event in {}{by})",
                all.join(" or ")
            ),
        },
    ))
}

/// The session: the one given in `opts`, else the first of the spec's session fields present.
fn session_id(
    spec: &Spec,
    opts: &TranslateOptions,
    p: &Payload<'_>,
) -> Result<String, TranslateError> {
    let mut session = None;
    for name in spec.session_fields {
        if p.has(name) {
            session = string(p, name)?;
            break;
        }
    }
    match (&opts.session, session) {
        (Some(s), _) => Ok(s.clone()),
        (None, Some(s)) => Ok(s),
        (None, None) => Err(TranslateError::at(
            1,
            1,
            spec.session_fields[0],
            "missing: the session id is needed (or give one: TranslateOptions::session; `send --session`, `?session=` over HTTP)",
        )),
    }
}

/// `prx.agent.<agent>.<event>`, the event's name with every character a topic segment may
/// not hold as `_`, at most 64 bytes.
fn topic(agent: Agent, event: &str) -> String {
    let mut segment: String = event
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if segment.is_empty() {
        segment.push('_');
    }
    format!("prx.agent.{}.{segment}", agent.name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndjson::{Input, ParseOptions, parse_input_with};

    fn t(agent: Agent, input: &str) -> Result<Translated, TranslateError> {
        translate(agent, input.as_bytes(), &TranslateOptions::default())
    }

    #[test]
    fn errors_name_the_line_the_column_and_the_member() {
        let e = t(
            Agent::ClaudeCode,
            "{\"session_id\":\"s\",\n \"hook_event_name\": 7}",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "2:21: hook_event_name: expected a string, found 7"
        );
        let e = t(Agent::ClaudeCode, "{\"session_id\": \"s\"").unwrap_err();
        assert!(e.to_string().starts_with("1:18: $: not JSON: EOF"), "{e}");
        let e = t(Agent::ClaudeCode, "[1]").unwrap_err();
        assert!(e.reason().contains("a JSON object"), "{e}");
        let e = t(Agent::ClaudeCode, r#"{"hook_event_name":"Stop"}"#).unwrap_err();
        assert_eq!((e.path(), e.line()), ("session_id", 1));
        let e = t(Agent::Codex, r#"{"thread-id":"t"}"#).unwrap_err();
        assert_eq!(e.path(), "hook_event_name");
        assert!(e.reason().ends_with("in hook_event_name or type)"), "{e}");
        let e = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","session_id":"t","hook_event_name":"Stop"}"#,
        )
        .unwrap_err();
        assert_eq!(e.reason(), "appears twice");
        // A key is shown on one line: its control characters escaped, as the ingest shows them.
        let e = t(
            Agent::ClaudeCode,
            "{\"a\\nb\":1,\"a\\nb\":2,\"hook_event_name\":\"Stop\"}",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "1:18: a\\nb: appears twice");
        assert_eq!(e.path(), "a\\nb");
        let e = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"PreToolUse","tool_input":{}}"#,
        )
        .unwrap_err();
        assert_eq!(e.path(), "tool_name");
        let e = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"PreToolUse","tool_name":1,"tool_input":{}}"#,
        )
        .unwrap_err();
        assert_eq!(e.reason(), "expected a string, found 1");
        assert!(translate(Agent::Cursor, b"\xff", &TranslateOptions::default()).is_err());
    }

    #[test]
    fn a_byte_order_mark_is_skipped_and_optional_members_may_be_missing() {
        let got = t(
            Agent::Cursor,
            "\u{feff}{\"conversation_id\":\"c\",\"hook_event_name\":\"postToolUseFailure\",\"tool_name\":\"Shell\"}",
        )
        .unwrap();
        assert_eq!(
            got.line,
            r#"{"event":"tool_call","agent":"cursor","session":"c","payload":{"tool":"Shell","success":false,"conversation_id":"c","hook_event_name":"postToolUseFailure"}}"#
        );
        assert!(got.lenient, "output is left out");
        let e = t(Agent::Cursor, "\u{feff}\u{feff}{}").unwrap_err();
        assert_eq!((e.line(), e.column()), (1, 1), "{e}");
    }

    #[test]
    fn a_stop_failure_is_an_error_event() {
        let got = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"StopFailure","error":"overloaded","error_details":null}"#,
        )
        .unwrap();
        assert_eq!(
            got.line,
            r#"{"event":"error","agent":"claude-code","session":"s","payload":{"component":"api","message":"overloaded","session_id":"s","hook_event_name":"StopFailure","error_details":null}}"#
        );
        let Ok(Input::Event(rec)) = parse_input_with(got.line.as_bytes(), ParseOptions::default())
        else {
            panic!("{}", got.line)
        };
        assert_eq!(rec.kind(), EventKind::Error);
    }

    #[test]
    fn overrides_replace_the_agent_and_supply_the_session() {
        let opts = TranslateOptions {
            agent: Some("reviewer".into()),
            session: Some("job-7".into()),
        };
        let got = translate(Agent::ClaudeCode, br#"{"hook_event_name":"Stop"}"#, &opts).unwrap();
        assert_eq!(
            got.line,
            r#"{"event":"turn_complete","agent":"reviewer","session":"job-7","payload":{"hook_event_name":"Stop"}}"#
        );
    }

    #[test]
    fn unknown_events_become_topics_with_a_clean_segment() {
        let got = t(
            Agent::GeminiCli,
            r#"{"session_id":"s","hook_event_name":"Brand new.event!"}"#,
        )
        .unwrap();
        assert_eq!(
            got.target,
            Target::Topic("prx.agent.gemini-cli.Brand_new_event_".into())
        );
        assert!(matches!(
            parse_input_with(got.line.as_bytes(), ParseOptions::default()),
            Ok(Input::Topic(_))
        ));
    }

    #[test]
    fn members_named_like_the_events_own_fields_are_kept_under_another_name() {
        let got = t(
            Agent::ClaudeCode,
            r#"{"session_id":"s","hook_event_name":"PostToolUse","tool_name":"X","tool_input":{},"tool_response":"ok","success":"maybe","output":1}"#,
        )
        .unwrap();
        let Ok(Input::Event(rec)) = parse_input_with(got.line.as_bytes(), ParseOptions::default())
        else {
            panic!("{}", got.line)
        };
        let payload = rec.payload_json();
        assert!(
            payload.contains(r#""agent_success":"maybe""#)
                && payload.contains(r#""agent_output":1"#),
            "{payload}"
        );
    }

    #[test]
    fn pretty_printed_input_and_a_20_mib_output_make_one_line() {
        let big = "x".repeat(20 << 20);
        let input = format!(
            "{{\n  \"session_id\": \"s\",\n  \"hook_event_name\": \"PostToolUse\",\n  \"tool_name\": \"Read\",\n  \"tool_input\": {{\n    \"file_path\": \"/a\"\n  }},\n  \"tool_response\": \"{big}\"\n}}"
        );
        let got = t(Agent::ClaudeCode, &input).unwrap();
        assert!(!got.line.contains('\n'));
        let Ok(Input::Event(rec)) = parse_input_with(got.line.as_bytes(), ParseOptions::default())
        else {
            panic!()
        };
        assert_eq!(rec.kind(), EventKind::ToolCall);
        assert!(rec.byte_len() > 20 << 20);
    }
}
