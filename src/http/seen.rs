//! What the server saw of each agent's own hooks (`GET /api/agents`): for every event the
//! agent documents ([`Agent::hook_events`]), when it last came and how often; and how many
//! payloads named an event the agent does not document, with the last few of those names.
//!
//! `POST /api/ingest/{agent}` records each payload it translated (`prx-hooks send --from`
//! posts there too), under the agent of the route. The table is fixed when the router is
//! built: one slot per (agent, known event), plain atomics, so a record costs two relaxed
//! stores and memory does not grow with what agents send; the unknown names are a short list
//! behind a mutex, each cut to [`MAX_NAME_BYTES`].

use super::{ApiState, json_response};
use crate::agents::Agent;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Unknown event names kept per agent (the most recent, each once).
pub const KEPT_UNKNOWN_NAMES: usize = 8;
/// An unknown event name is kept cut to this many bytes.
pub(crate) const MAX_NAME_BYTES: usize = 64;

/// One event name's slot: when it was last seen (milliseconds after the table was made, plus
/// one; 0: never) and how often.
struct Slot {
    name: &'static str,
    last: AtomicU64,
    count: AtomicU64,
}

struct PerAgent {
    agent: Agent,
    events: Vec<Slot>,
    unknown: AtomicU64,
    unknown_names: Mutex<VecDeque<String>>,
}

/// The table `POST /api/ingest/{agent}` fills and `GET /api/agents` reads.
pub(crate) struct AgentsSeen {
    start: Instant,
    start_unix_ms: u64,
    agents: Vec<PerAgent>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AgentsSeen {
    pub(crate) fn new() -> AgentsSeen {
        let agents = Agent::ALL
            .iter()
            .map(|&agent| PerAgent {
                agent,
                // Every event the agent documents (those `connect` leaves out too).
                events: agent
                    .hook_events()
                    .iter()
                    .map(|e| Slot {
                        name: e.name,
                        last: AtomicU64::new(0),
                        count: AtomicU64::new(0),
                    })
                    .collect(),
                unknown: AtomicU64::new(0),
                unknown_names: Mutex::new(VecDeque::new()),
            })
            .collect();
        AgentsSeen {
            start: Instant::now(),
            start_unix_ms: unix_ms(SystemTime::now()),
            agents,
        }
    }

    /// `agent` sent a payload naming `event` (by its name or its alias: Copilot CLI's
    /// PascalCase names count as the camelCase events they are).
    pub(crate) fn record(&self, agent: Agent, event: &str) {
        let Some(per) = self.agents.iter().find(|a| a.agent == agent) else {
            return;
        };
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let known = agent.hook_event(event).map_or(event, |e| e.name);
        if let Some(slot) = per.events.iter().find(|s| s.name == known) {
            slot.last.fetch_max(now, Ordering::Relaxed);
            slot.count.fetch_add(1, Ordering::Relaxed);
            return;
        }
        per.unknown.fetch_add(1, Ordering::Relaxed);
        let name = shown(event);
        let mut names = per
            .unknown_names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        names.retain(|n| *n != name);
        if names.len() == KEPT_UNKNOWN_NAMES {
            names.pop_front();
        }
        names.push_back(name);
    }

    /// What was seen, as of now.
    pub(crate) fn report(&self) -> AgentsReport {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let now_unix_ms = self.start_unix_ms + elapsed - 1;
        let agents = self
            .agents
            .iter()
            .map(|per| AgentSeen {
                agent: per.agent.name().to_string(),
                events: per
                    .events
                    .iter()
                    .map(|s| {
                        let last = s.last.load(Ordering::Relaxed);
                        let age = (last > 0).then(|| elapsed.saturating_sub(last));
                        EventSeen {
                            event: s.name.to_string(),
                            count: s.count.load(Ordering::Relaxed),
                            age_ms: age,
                            last_seen_unix_ms: age.map(|a| now_unix_ms.saturating_sub(a)),
                        }
                    })
                    .collect(),
                unknown: UnknownSeen {
                    count: per.unknown.load(Ordering::Relaxed),
                    names: per
                        .unknown_names
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .iter()
                        .cloned()
                        .collect(),
                },
            })
            .collect();
        AgentsReport {
            since_unix_ms: self.start_unix_ms,
            now_unix_ms,
            agents,
        }
    }
}

/// An agent's event name as kept: control characters as spaces, cut to [`MAX_NAME_BYTES`]
/// on a character boundary.
fn shown(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if out.len() + c.len_utf8() > MAX_NAME_BYTES {
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

/// The answer of `GET /api/agents`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentsReport {
    /// When the server's API started (Unix milliseconds): nothing before it was seen.
    pub since_unix_ms: u64,
    /// The server's clock when it answered.
    pub now_unix_ms: u64,
    /// Every agent the ingest route knows, in [`Agent::ALL`] order.
    pub agents: Vec<AgentSeen>,
}

/// One agent's part of [`AgentsReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentSeen {
    /// `claude-code`, `codex`, …
    pub agent: String,
    /// Every event name its translation knows, seen or not.
    pub events: Vec<EventSeen>,
    /// Payloads naming an event the translation does not know.
    pub unknown: UnknownSeen,
}

/// One event name of an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventSeen {
    /// The agent's own name for it (`PreToolUse`).
    pub event: String,
    /// Payloads seen since the server started.
    pub count: u64,
    /// How long ago the last one came (`None`: never).
    pub age_ms: Option<u64>,
    /// When the last one came, by the server's clock.
    pub last_seen_unix_ms: Option<u64>,
}

/// Event names an agent sent that its translation does not know.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnknownSeen {
    /// How many payloads named such an event since the server started.
    pub count: u64,
    /// The last few, most recent last (each once, at most [`KEPT_UNKNOWN_NAMES`]).
    pub names: Vec<String>,
}

/// `GET /api/agents`: [`AgentsReport`].
pub(crate) async fn list(axum::extract::State(api): ApiState) -> Response {
    json_response(StatusCode::OK, &api.seen.report())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_events_keep_their_last_time_and_unknown_names_stay_few_and_short() {
        let seen = AgentsSeen::new();
        seen.record(Agent::ClaudeCode, "PreToolUse");
        seen.record(Agent::ClaudeCode, "PreToolUse");
        // Copilot CLI's PascalCase name is its preToolUse.
        seen.record(Agent::CopilotCli, "PreToolUse");
        for i in 0..20 {
            seen.record(Agent::Cursor, &format!("newEvent{i}"));
        }
        seen.record(Agent::Cursor, &"x\u{1b}".repeat(100));
        let r = seen.report();
        let claude = r.agents.iter().find(|a| a.agent == "claude-code").unwrap();
        let pre = claude
            .events
            .iter()
            .find(|e| e.event == "PreToolUse")
            .unwrap();
        assert_eq!(pre.count, 2);
        assert!(pre.age_ms.is_some() && pre.last_seen_unix_ms.is_some());
        let stop = claude.events.iter().find(|e| e.event == "Stop").unwrap();
        assert_eq!((stop.count, stop.age_ms), (0, None));
        let copilot = r.agents.iter().find(|a| a.agent == "copilot-cli").unwrap();
        let pre = copilot.events.iter().find(|e| e.event == "preToolUse");
        assert_eq!(pre.map(|e| e.count), Some(1));
        assert_eq!(copilot.unknown.count, 0);
        let cursor = r.agents.iter().find(|a| a.agent == "cursor").unwrap();
        assert_eq!(cursor.unknown.count, 21);
        assert_eq!(cursor.unknown.names.len(), KEPT_UNKNOWN_NAMES);
        let last = cursor.unknown.names.last().unwrap();
        assert!(
            last.len() <= MAX_NAME_BYTES && !last.contains('\u{1b}'),
            "{last:?}"
        );
        assert_eq!(cursor.unknown.names[0], "newEvent13");
    }
}
