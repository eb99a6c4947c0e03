//! Each agent's hook events as `connect` and `doctor` use them: the handler types the agent
//! runs on each event and whether it closes a turn or a session, from the library's
//! [`Agent::hook_events`](prx_hooks::agents::Agent::hook_events), and whether `connect`
//! writes the event (docs/connect.md § Every event, its handler, sync or async).

use prx_hooks::agents::{self as lib, Handlers};
use std::sync::OnceLock;

/// The agents `connect` and `doctor` know: those whose hook settings file is documented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
    Cursor,
    QwenCode,
    FactoryDroid,
}

impl Agent {
    pub(crate) const ALL: [Agent; 6] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::GeminiCli,
        Agent::Cursor,
        Agent::QwenCode,
        Agent::FactoryDroid,
    ];

    /// The library's agent (its payloads, its events).
    pub(crate) fn lib(self) -> lib::Agent {
        match self {
            Agent::ClaudeCode => lib::Agent::ClaudeCode,
            Agent::Codex => lib::Agent::Codex,
            Agent::GeminiCli => lib::Agent::GeminiCli,
            Agent::Cursor => lib::Agent::Cursor,
            Agent::QwenCode => lib::Agent::QwenCode,
            Agent::FactoryDroid => lib::Agent::FactoryDroid,
        }
    }

    /// The name in `--from`, topics and URLs: `claude-code`.
    pub(crate) fn name(self) -> &'static str {
        self.lib().name()
    }

    /// The name people know it by: `Claude Code`.
    pub(crate) fn title(self) -> &'static str {
        self.lib().title()
    }

    pub(crate) fn from_name(name: &str) -> Option<Agent> {
        Agent::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The names, for messages: `claude-code, codex, …`.
    pub(crate) fn names() -> String {
        Agent::ALL.map(Agent::name).join(", ")
    }

    /// The page the events and the file format follow.
    pub(crate) fn docs(self) -> &'static str {
        self.lib().documentation()
    }

    /// The agent reads `//` and `/* */` comments in its hook settings (Gemini CLI strips them
    /// before parsing). The others read plain JSON: Claude Code's settings reference calls a
    /// comment a syntax error; the others' readers are not documented to take them.
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
            Agent::QwenCode => Some("QWEN_PROJECT_DIR"),
            Agent::FactoryDroid => Some("FACTORY_PROJECT_DIR"),
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

    /// The library's set holding this one type.
    fn set(self) -> Handlers {
        match self {
            Handler::Command => Handlers::COMMAND,
            Handler::Http => Handlers::HTTP,
            Handler::McpTool => Handlers::MCP_TOOL,
            Handler::Prompt => Handlers::PROMPT,
            Handler::Agent => Handlers::AGENT,
        }
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

/// One hook event of an agent: the library's description of it
/// ([`prx_hooks::agents::HookEvent`]) and whether `connect` writes it.
#[derive(Debug)]
pub(crate) struct HookEvent {
    pub(crate) name: &'static str,
    /// The handler types the agent runs on this event.
    handlers: Handlers,
    /// It ends a turn or a session: the agent may exit right after it, so our entry there is
    /// one the agent waits for (docs/connect.md § Synchronous where a turn or the session ends).
    pub(crate) closes: bool,
    pub(crate) written: Written,
    /// Why it is not written by default.
    pub(crate) note: Option<&'static str>,
}

impl HookEvent {
    /// The agent runs a hook of type `h` on this event.
    pub(crate) fn runs(&self, h: Handler) -> bool {
        self.handlers.contains(h.set())
    }

    /// The types it runs here, by name (`command, http`).
    pub(crate) fn handler_names(&self) -> Vec<&'static str> {
        self.handlers.names().collect()
    }
}

/// Events `connect` never writes, even when `--events` names them: a hook there takes over a
/// step of the agent (the library's note says which).
const NEVER: &[(Agent, &str)] = &[
    (Agent::ClaudeCode, "WorktreeCreate"),
    (Agent::ClaudeCode, "WorktreeRemove"),
];

/// The table of `agent`, made once from the library's.
fn table(agent: Agent) -> Vec<HookEvent> {
    agent
        .lib()
        .hook_events()
        .iter()
        .map(|e| {
            let written = if NEVER.contains(&(agent, e.name)) {
                Written::Never
            } else if e.subscribe {
                Written::Yes
            } else {
                Written::OnRequest
            };
            let note = match written {
                Written::Yes => None,
                _ => Some(
                    e.note
                        .unwrap_or("documented, but no hook is written for it by default"),
                ),
            };
            HookEvent {
                name: e.name,
                handlers: e.handlers,
                closes: e.closes,
                written,
                note,
            }
        })
        .collect()
}

/// Every hook event of `agent`, in the order its documentation lists them
/// ([`prx_hooks::agents::Agent::hook_events`]).
pub(crate) fn hook_events(agent: Agent) -> &'static [HookEvent] {
    static TABLES: OnceLock<Vec<Vec<HookEvent>>> = OnceLock::new();
    let tables = TABLES.get_or_init(|| Agent::ALL.into_iter().map(table).collect());
    let i = Agent::ALL.iter().position(|a| *a == agent).unwrap_or(0);
    &tables[i]
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
            assert!(!events.is_empty(), "{agent}");
            for (i, e) in events.iter().enumerate() {
                assert!(e.runs(Handler::Command), "{agent} {}", e.name);
                assert!(
                    !events[..i].iter().any(|o| o.name == e.name),
                    "{agent} {} twice",
                    e.name
                );
                assert_eq!(e.note.is_some(), e.written != Written::Yes, "{}", e.name);
            }
        }
        for (agent, name) in NEVER {
            assert!(event(*agent, name).is_some(), "{agent} {name}");
        }
        let closing: Vec<&str> = hook_events(Agent::ClaudeCode)
            .iter()
            .filter(|e| e.closes)
            .map(|e| e.name)
            .collect();
        assert_eq!(
            closing,
            ["SubagentStop", "Stop", "StopFailure", "SessionEnd"]
        );
        let http_less: Vec<&str> = hook_events(Agent::ClaudeCode)
            .iter()
            .filter(|e| !e.runs(Handler::Http))
            .map(|e| e.name)
            .collect();
        assert_eq!(http_less, ["Setup", "SessionStart"]);
        assert!(event(Agent::Codex, "SessionEnd").is_some_and(|e| e.closes));
    }
}
