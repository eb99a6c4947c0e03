//! Token counts of what the ingest let in, per session (in the session map) and per agent
//! (bounded): the extra fields `input_tokens`, `output_tokens`, `cache_read_input_tokens` and
//! `cache_creation_input_tokens` of any event (docs/agents.md § The rules every agent follows).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most agents counted by name; the rest are counted as [`OTHER_AGENTS`].
pub const MAX_AGENTS: usize = 64;

/// The name under which agents past [`MAX_AGENTS`] are counted.
pub const OTHER_AGENTS: &str = "(other)";

/// Token counts, in the meaning the extra fields have: `input` leaves out the cached input.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// `input_tokens`.
    #[serde(rename = "input_tokens", default)]
    pub input: u64,
    /// `output_tokens`.
    #[serde(rename = "output_tokens", default)]
    pub output: u64,
    /// `cache_read_input_tokens`.
    #[serde(rename = "cache_read_input_tokens", default)]
    pub cache_read: u64,
    /// `cache_creation_input_tokens`.
    #[serde(rename = "cache_creation_input_tokens", default)]
    pub cache_creation: u64,
}

impl Tokens {
    /// The counts an event's extra fields (a JSON object's text) give; zero when it names
    /// none, or one of them is not a whole number.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::ingest::Tokens;
    /// let t = Tokens::from_extras(r#"{"model":"m","input_tokens":12,"output_tokens":7}"#);
    /// assert_eq!((t.input, t.output), (12, 7));
    /// assert!(Tokens::from_extras(r#"{"output_tokens":"many"}"#).is_zero());
    /// ```
    pub fn from_extras(json_object: &str) -> Tokens {
        if !json_object.contains("_tokens\"") {
            return Tokens::default();
        }
        serde_json::from_str(json_object).unwrap_or_default()
    }

    /// Whether every count is zero.
    pub fn is_zero(&self) -> bool {
        *self == Tokens::default()
    }

    /// Adds `other`, saturating.
    pub fn add(&mut self, other: Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_creation = self.cache_creation.saturating_add(other.cache_creation);
    }
}

/// Tokens per agent name: at most [`MAX_AGENTS`] names, later ones under [`OTHER_AGENTS`].
#[derive(Debug, Default)]
pub(crate) struct ByAgent {
    counts: BTreeMap<String, Tokens>,
}

impl ByAgent {
    pub(crate) fn add(&mut self, agent: &str, t: Tokens) {
        if let Some(c) = self.counts.get_mut(agent) {
            c.add(t);
            return;
        }
        let name = if self.counts.len() < MAX_AGENTS {
            agent
        } else {
            OTHER_AGENTS
        };
        self.counts.entry(name.to_string()).or_default().add(t);
    }

    pub(crate) fn snapshot(&self) -> Vec<AgentTokens> {
        self.counts
            .iter()
            .map(|(agent, tokens)| AgentTokens {
                agent: agent.clone(),
                tokens: *tokens,
            })
            .collect()
    }
}

/// One agent's token counts since start.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentTokens {
    /// The agent's name ([`OTHER_AGENTS`] for agents past [`MAX_AGENTS`]).
    pub agent: String,
    /// Its counts.
    #[serde(flatten)]
    pub tokens: Tokens,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_past_the_bound_are_counted_together() {
        let mut by = ByAgent::default();
        let one = Tokens {
            input: 1,
            ..Tokens::default()
        };
        for i in 0..MAX_AGENTS + 3 {
            by.add(&format!("a{i}"), one);
        }
        by.add("a0", one);
        let snap = by.snapshot();
        assert_eq!(snap.len(), MAX_AGENTS + 1);
        let get = |n: &str| snap.iter().find(|a| a.agent == n).unwrap().tokens.input;
        assert_eq!((get("a0"), get(OTHER_AGENTS)), (2, 3));
    }
}
