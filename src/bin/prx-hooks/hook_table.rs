//! Each agent's hook events as the agent runs them: which handler types it runs on each event,
//! whether the event closes a turn or a session, and whether `connect` writes it.
//!
//! `connect` writes its entries from these tables and `doctor` checks settings files against
//! them (docs/connect.md § Every event, its handler, sync or async). [`hook_events`] is the one
//! place they are read: when the library's agents describe their own hook events, it is the
//! one function to switch over.

/// The agents `connect` and `doctor` know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
    Cursor,
}

impl Agent {
    pub(crate) const ALL: [Agent; 4] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::GeminiCli,
        Agent::Cursor,
    ];

    /// The name in `--from`, topics and URLs: `claude-code`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::GeminiCli => "gemini-cli",
            Agent::Cursor => "cursor",
        }
    }

    /// The name people know it by: `Claude Code`.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code",
            Agent::Codex => "Codex",
            Agent::GeminiCli => "Gemini CLI",
            Agent::Cursor => "Cursor",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Agent> {
        Agent::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The page the events and the file format follow.
    pub(crate) fn docs(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "https://code.claude.com/docs/en/hooks",
            Agent::Codex => "https://developers.openai.com/codex/hooks",
            Agent::GeminiCli => "https://geminicli.com/docs/hooks/reference",
            Agent::Cursor => "https://cursor.com/docs/hooks",
        }
    }

    /// The agent reads `//` and `/* */` comments in its hook settings (Gemini CLI strips them
    /// before parsing). The others read plain JSON: Claude Code's settings reference calls a
    /// comment a syntax error; Codex's and Cursor's readers are not documented to take them.
    pub(crate) fn comments(self) -> bool {
        self == Agent::GeminiCli
    }

    /// The environment variable the agent sets for its hooks to the project's directory
    /// (`None`: Codex sets none; its hooks run in the session's directory).
    pub(crate) fn project_dir_var(self) -> Option<&'static str> {
        match self {
            Agent::ClaudeCode => Some("CLAUDE_PROJECT_DIR"),
            Agent::GeminiCli => Some("GEMINI_PROJECT_DIR"),
            Agent::Cursor => Some("CURSOR_PROJECT_DIR"),
            Agent::Codex => None,
        }
    }

    /// Members of `hooks` that are settings, not events (Gemini CLI tolerates its
    /// `hooksConfig` fields there).
    pub(crate) fn config_members(self) -> &'static [&'static str] {
        match self {
            Agent::GeminiCli => &["enabled", "disabled", "notifications"],
            _ => &[],
        }
    }

    /// Entries of `hooks.<event>` are groups `{matcher?, hooks: [entry…]}` (Cursor lists the
    /// entries themselves).
    pub(crate) fn grouped(self) -> bool {
        self != Agent::Cursor
    }
}

impl std::fmt::Display for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A handler type an agent can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handler {
    Command,
    Http,
    McpTool,
    Prompt,
    Agent,
}

impl Handler {
    /// The `type` value in settings.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Handler::Command => "command",
            Handler::Http => "http",
            Handler::McpTool => "mcp_tool",
            Handler::Prompt => "prompt",
            Handler::Agent => "agent",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Handler> {
        [
            Handler::Command,
            Handler::Http,
            Handler::McpTool,
            Handler::Prompt,
            Handler::Agent,
        ]
        .into_iter()
        .find(|h| h.name() == name)
    }
}

/// Whether `connect` writes an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// By default.
    Yes,
    /// Only when `--events` names it (why: the event's `note`).
    OnRequest,
    /// Never: a hook there changes what the agent does (why: the event's `note`).
    Never,
}

/// One hook event of an agent.
#[derive(Debug)]
pub(crate) struct HookEvent {
    pub(crate) name: &'static str,
    /// The handler types the agent runs on this event.
    pub(crate) handlers: &'static [Handler],
    /// It ends a turn or a session: the agent may exit right after it, so our entry there is
    /// one the agent waits for (docs/connect.md § Synchronous where a turn or session ends).
    pub(crate) closes: bool,
    pub(crate) written: Written,
    /// What to know about it (why it is not written by default).
    pub(crate) note: Option<&'static str>,
}

use Handler::{Agent as AgentH, Command, Http, McpTool, Prompt};

const ALL_FIVE: &[Handler] = &[Command, Http, McpTool, Prompt, AgentH];
const NO_AGENT: &[Handler] = &[Command, Http, McpTool, Prompt];
const NO_MODEL: &[Handler] = &[Command, Http, McpTool];
const COMMAND_MCP: &[Handler] = &[Command, McpTool];
const COMMAND: &[Handler] = &[Command];
const COMMAND_PROMPT: &[Handler] = &[Command, Prompt];

const fn ev(name: &'static str, handlers: &'static [Handler], closes: bool) -> HookEvent {
    HookEvent {
        name,
        handlers,
        closes,
        written: Written::Yes,
        note: None,
    }
}

const fn only(
    name: &'static str,
    handlers: &'static [Handler],
    written: Written,
    note: &'static str,
) -> HookEvent {
    HookEvent {
        name,
        handlers,
        closes: false,
        written,
        note: Some(note),
    }
}

const NEWER: &str = "newer than most installed versions (an older Claude Code warns about, or before 2.1.101 rejects, a name it does not know): pick it with --events";

/// Claude Code 2.1.332 (its hooks reference; the handler types per event are its "supported
/// hook types" lists).
static CLAUDE_CODE: [HookEvent; 34] = [
    ev("Setup", COMMAND_MCP, false),
    ev("SessionStart", COMMAND_MCP, false),
    ev("InstructionsLoaded", NO_MODEL, false),
    ev("UserPromptSubmit", ALL_FIVE, false),
    ev("UserPromptExpansion", ALL_FIVE, false),
    ev("PreToolUse", ALL_FIVE, false),
    ev("PermissionRequest", NO_AGENT, false),
    ev("PermissionDenied", ALL_FIVE, false),
    ev("PostToolUse", ALL_FIVE, false),
    ev("PostToolUseFailure", ALL_FIVE, false),
    ev("PostToolBatch", ALL_FIVE, false),
    ev("Notification", NO_MODEL, false),
    ev("SubagentStart", NO_MODEL, false),
    ev("SubagentStop", ALL_FIVE, true),
    ev("TaskCreated", ALL_FIVE, false),
    ev("TaskCompleted", ALL_FIVE, false),
    ev("Stop", ALL_FIVE, true),
    ev("StopFailure", NO_MODEL, true),
    ev("TeammateIdle", ALL_FIVE, false),
    ev("PreCompact", NO_MODEL, false),
    ev("PostCompact", NO_MODEL, false),
    ev("Elicitation", NO_MODEL, false),
    ev("ElicitationResult", NO_MODEL, false),
    ev("ConfigChange", NO_MODEL, false),
    ev("CwdChanged", NO_MODEL, false),
    ev("FileChanged", NO_MODEL, false),
    ev("SessionEnd", NO_MODEL, true),
    only(
        "WorktreeCreate",
        NO_MODEL,
        Written::Never,
        "a hook there replaces Claude Code's own `git worktree` step and must print the new path",
    ),
    only(
        "WorktreeRemove",
        NO_MODEL,
        Written::Never,
        "a hook there replaces Claude Code's own worktree removal",
    ),
    only(
        "MessageDisplay",
        NO_MODEL,
        Written::OnRequest,
        "fires for every batch of streamed lines and holds it until the hook returns",
    ),
    only(
        "PreModelSwitch",
        NO_MODEL,
        Written::OnRequest,
        "a hook that times out there blocks the model switch",
    ),
    only("PostModelSwitch", NO_MODEL, Written::OnRequest, NEWER),
    only("DirectoryAdded", NO_MODEL, Written::OnRequest, NEWER),
    only(
        "PreSkillShellCommand",
        NO_MODEL,
        Written::OnRequest,
        "found in Claude Code's program, not in its documentation",
    ),
];

/// Codex 0.171 (its hooks page and the schemas in its program). It runs `command` hooks only
/// (`prompt` and `agent` hooks are parsed and skipped) and skips any with `"async": true`.
static CODEX: [HookEvent; 12] = [
    ev("SessionStart", COMMAND, false),
    ev("UserPromptSubmit", COMMAND, false),
    ev("PreToolUse", COMMAND, false),
    ev("PermissionRequest", COMMAND, false),
    ev("PostToolUse", COMMAND, false),
    ev("PreCompact", COMMAND, false),
    ev("PostCompact", COMMAND, false),
    ev("SubagentStart", COMMAND, false),
    ev("SubagentStop", COMMAND, true),
    ev("Stop", COMMAND, true),
    ev("Interrupt", COMMAND, true),
    ev("SessionEnd", COMMAND, true),
];

/// Gemini CLI 0.61 (its hooks reference): `command` hooks only; it waits for every hook but
/// SessionEnd's (not awaited) and PreCompress's (run in the background).
static GEMINI_CLI: [HookEvent; 11] = [
    ev("SessionStart", COMMAND, false),
    ev("BeforeAgent", COMMAND, false),
    ev("BeforeModel", COMMAND, false),
    ev("AfterModel", COMMAND, false),
    ev("BeforeToolSelection", COMMAND, false),
    ev("BeforeTool", COMMAND, false),
    ev("AfterTool", COMMAND, false),
    ev("AfterAgent", COMMAND, true),
    ev("PreCompress", COMMAND, false),
    ev("Notification", COMMAND, false),
    ev("SessionEnd", COMMAND, true),
];

/// Cursor (its hooks page): `command` and `prompt` hooks; it waits for every hook.
static CURSOR: [HookEvent; 21] = [
    ev("sessionStart", COMMAND_PROMPT, false),
    ev("beforeSubmitPrompt", COMMAND_PROMPT, false),
    ev("preToolUse", COMMAND_PROMPT, false),
    ev("postToolUse", COMMAND_PROMPT, false),
    ev("postToolUseFailure", COMMAND_PROMPT, false),
    ev("beforeShellExecution", COMMAND_PROMPT, false),
    ev("afterShellExecution", COMMAND_PROMPT, false),
    ev("beforeMCPExecution", COMMAND_PROMPT, false),
    ev("afterMCPExecution", COMMAND_PROMPT, false),
    ev("beforeReadFile", COMMAND_PROMPT, false),
    ev("afterFileEdit", COMMAND_PROMPT, false),
    ev("subagentStart", COMMAND_PROMPT, false),
    ev("subagentStop", COMMAND_PROMPT, true),
    ev("preCompact", COMMAND_PROMPT, false),
    ev("afterAgentResponse", COMMAND_PROMPT, false),
    ev("afterAgentThought", COMMAND_PROMPT, false),
    ev("stop", COMMAND_PROMPT, true),
    ev("sessionEnd", COMMAND_PROMPT, true),
    ev("beforeTabFileRead", COMMAND_PROMPT, false),
    ev("afterTabFileEdit", COMMAND_PROMPT, false),
    only(
        "workspaceOpen",
        COMMAND_PROMPT,
        Written::OnRequest,
        "new in Cursor 3.6: an older Cursor may refuse the whole file for a name it does not know",
    ),
];

/// Every hook event of `agent`, in the order its documentation lists them.
pub(crate) fn hook_events(agent: Agent) -> &'static [HookEvent] {
    match agent {
        Agent::ClaudeCode => &CLAUDE_CODE,
        Agent::Codex => &CODEX,
        Agent::GeminiCli => &GEMINI_CLI,
        Agent::Cursor => &CURSOR,
    }
}

/// The event named `name` of `agent`.
pub(crate) fn event(agent: Agent, name: &str) -> Option<&'static HookEvent> {
    hook_events(agent).iter().find(|e| e.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_connect_writes_runs_a_command_and_names_are_unique() {
        for agent in Agent::ALL {
            let events = hook_events(agent);
            for (i, e) in events.iter().enumerate() {
                assert!(e.handlers.contains(&Handler::Command), "{agent} {}", e.name);
                assert!(
                    !events[..i].iter().any(|o| o.name == e.name),
                    "{agent} {} twice",
                    e.name
                );
                assert_eq!(e.note.is_some(), e.written != Written::Yes, "{}", e.name);
            }
        }
        let closing: Vec<&str> = hook_events(Agent::ClaudeCode)
            .iter()
            .filter(|e| e.closes)
            .map(|e| e.name)
            .collect();
        assert_eq!(closing, ["SubagentStop", "Stop", "StopFailure", "SessionEnd"]);
        let http_less: Vec<&str> = hook_events(Agent::ClaudeCode)
            .iter()
            .filter(|e| !e.handlers.contains(&Handler::Http))
            .map(|e| e.name)
            .collect();
        assert_eq!(http_less, ["Setup", "SessionStart"]);
    }
}
