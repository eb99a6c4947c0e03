//! The agents `connect` and `doctor` know, and their hook events as both use them: the
//! library's [`Agent::hook_events`](prx_hooks::agents::Agent::hook_events) is the one table
//! (events, handler types, closing or not, written or not); this adds whether `connect` writes
//! an event (docs/connect.md § Every event, its handler, sync or async).

use prx_hooks::agents as lib;
#[cfg(test)]
use prx_hooks::agents::Handlers;

/// The agents `connect` and `doctor` know: those whose hook settings file is documented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Agent {
    ClaudeCode,
    Codex,
    GeminiCli,
    Cursor,
    QwenCode,
    FactoryDroid,
    CopilotCli,
    Windsurf,
}

impl Agent {
    pub(crate) const ALL: [Agent; 8] = [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::GeminiCli,
        Agent::Cursor,
        Agent::QwenCode,
        Agent::FactoryDroid,
        Agent::CopilotCli,
        Agent::Windsurf,
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
            Agent::CopilotCli => lib::Agent::CopilotCli,
            Agent::Windsurf => lib::Agent::Windsurf,
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
    /// (`None`: Codex, Copilot CLI and Windsurf set none).
    pub(crate) fn project_dir_var(self) -> Option<&'static str> {
        match self {
            Agent::ClaudeCode => Some("CLAUDE_PROJECT_DIR"),
            Agent::GeminiCli => Some("GEMINI_PROJECT_DIR"),
            Agent::Cursor => Some("CURSOR_PROJECT_DIR"),
            Agent::QwenCode => Some("QWEN_PROJECT_DIR"),
            Agent::FactoryDroid => Some("FACTORY_PROJECT_DIR"),
            Agent::Codex | Agent::CopilotCli | Agent::Windsurf => None,
        }
    }

    /// The agent runs a project file's hooks in the project's root without a variable
    /// naming it: Copilot CLI in the directory our entry's `cwd` gives ("relative to
    /// repository root"), Windsurf in the workspace root (its `working_directory` default).
    pub(crate) fn runs_in_project(self) -> bool {
        matches!(self, Agent::CopilotCli | Agent::Windsurf)
    }

    /// The member of an entry holding its shell command (Copilot CLI: `bash`; its
    /// cross-platform `command` is read too).
    pub(crate) fn command_field(self) -> &'static str {
        match self {
            Agent::CopilotCli => "bash",
            _ => "command",
        }
    }

    /// An entry without `type` is a command (Cursor's and Windsurf's entries have no type;
    /// Copilot CLI's defaults to `command`).
    pub(crate) fn untyped_is_command(self) -> bool {
        matches!(self, Agent::Cursor | Agent::CopilotCli | Agent::Windsurf)
    }

    /// `connect` writes an event under its [`alias`](prx_hooks::agents::HookEvent::alias)
    /// where it has one: Copilot CLI's PascalCase names, whose payloads carry
    /// `hook_event_name` in snake_case, as the other agents' do.
    pub(crate) fn writes_alias(self) -> bool {
        self == Agent::CopilotCli
    }

    /// Members of `hooks` that are settings, not events (Gemini CLI tolerates its
    /// `hooksConfig` fields there).
    pub(crate) fn config_members(self) -> &'static [&'static str] {
        match self {
            Agent::GeminiCli => &["enabled", "disabled", "notifications"],
            _ => &[],
        }
    }

    /// Entries of `hooks.<event>` are groups `{matcher?, hooks: [entry…]}` (Cursor, Copilot
    /// CLI and Windsurf list the entries themselves).
    pub(crate) fn grouped(self) -> bool {
        !matches!(self, Agent::Cursor | Agent::CopilotCli | Agent::Windsurf)
    }
}

impl std::fmt::Display for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One hook event of an agent: the library's description of it, the one table of which events
/// an agent has, the handler types it runs on each, and whether it closes a turn or a session.
pub(crate) use prx_hooks::agents::HookEvent;

/// Whether `connect` writes an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// By default.
    Yes,
    /// Only when `--events` names it (why: the event's `note`).
    OnRequest,
    /// Never: a hook there takes over a step of the agent (why: the event's `note`).
    Never,
}

/// Whether `connect` writes `event`: as the library's
/// [`subscribe`](prx_hooks::agents::HookEvent::subscribe) and
/// [`takes_over`](prx_hooks::agents::HookEvent::takes_over) say.
pub(crate) fn written(event: &HookEvent) -> Written {
    if event.takes_over {
        Written::Never
    } else if event.subscribe {
        Written::Yes
    } else {
        Written::OnRequest
    }
}

/// Why `connect` does not write `event` by default (`None`: it does).
pub(crate) fn why_not_written(event: &HookEvent) -> Option<&'static str> {
    match written(event) {
        Written::Yes => None,
        _ => Some(
            event
                .note
                .unwrap_or("documented, but no hook is written for it by default"),
        ),
    }
}

/// Every hook event of `agent`, in the order its documentation lists them
/// ([`prx_hooks::agents::Agent::hook_events`]).
pub(crate) fn hook_events(agent: Agent) -> &'static [HookEvent] {
    agent.lib().hook_events()
}

/// The event named `name` of `agent` (by its name or its alias).
pub(crate) fn event(agent: Agent, name: &str) -> Option<&'static HookEvent> {
    agent.lib().hook_event(name)
}

/// The name `connect` writes `event` under in `agent`'s settings.
pub(crate) fn key(agent: Agent, event: &HookEvent) -> &'static str {
    match event.alias {
        Some(alias) if agent.writes_alias() => alias,
        _ => event.name,
    }
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
                assert!(e.handlers.contains(Handlers::COMMAND), "{agent} {}", e.name);
                assert!(
                    !events[..i].iter().any(|o| o.name == e.name),
                    "{agent} {} twice",
                    e.name
                );
                assert_eq!(
                    why_not_written(e).is_some(),
                    written(e) != Written::Yes,
                    "{}",
                    e.name
                );
            }
        }
        let never: Vec<&str> = hook_events(Agent::ClaudeCode)
            .iter()
            .filter(|e| written(e) == Written::Never)
            .map(|e| e.name)
            .collect();
        assert_eq!(never, ["WorktreeCreate", "WorktreeRemove"]);
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
            .filter(|e| !e.handlers.contains(Handlers::HTTP))
            .map(|e| e.name)
            .collect();
        assert_eq!(http_less, ["Setup", "SessionStart"]);
        assert!(event(Agent::Codex, "SessionEnd").is_some_and(|e| e.closes));
    }
}
