//! [`Decider`]: the policies a [`Hooks`](crate::Hooks) answers with — the table in force
//! (swapped in by the policies.json watcher, read without a lock), and the counts.

use super::command::{Answer, CommandCounters, Runner};
use super::eval::{Counters, DecideError, PoliciesStats, PolicyCount, read_payload, selects};
use super::load::{PoliciesDoc, empty_table};
use super::model::{Decision, DecisionPoint, PolicyTable, SourceTrace, Verdict};
use super::plugins::{PluginPolicies, PluginPolicyCount, ask_all};
use crate::config::{ConfigStats, Reload, Watch, WatchOptions};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The decision lane of one [`Hooks`](crate::Hooks).
pub(crate) struct Decider {
    live: Arc<ArcSwap<Live>>,
    watch: Mutex<WatchState>,
    counters: Counters,
    /// What command policies run with (`None` without a workspace: no policies, ever).
    runner: Option<Runner>,
    /// The WASM policies in force (the plugins' loads write them; `None` without plugins).
    plugins: Option<Arc<PluginPolicies>>,
}

/// The table in force and, per policy, how often it decided (kept by id across reloads).
struct Live {
    table: Arc<PolicyTable>,
    hits: Vec<Arc<AtomicU64>>,
    commands: Vec<Arc<CommandCounters>>,
}

/// The counters of the ids loaded so far, kept across reloads.
#[derive(Default)]
struct Known {
    rules: HashMap<String, Arc<AtomicU64>>,
    commands: HashMap<String, Arc<CommandCounters>>,
}

impl Live {
    /// `table` with the counters of the ids `known` has (new ones for new ids); `known` keeps
    /// only the table's ids, so it stays as large as the file allows.
    fn new(table: Arc<PolicyTable>, known: &mut Known) -> Live {
        let hits: Vec<Arc<AtomicU64>> = table
            .policies
            .iter()
            .map(|p| known.rules.entry(p.id.clone()).or_default().clone())
            .collect();
        known
            .rules
            .retain(|id, _| table.policies.iter().any(|p| &p.id == id));
        let commands: Vec<Arc<CommandCounters>> = table
            .commands
            .iter()
            .map(|c| known.commands.entry(c.id.clone()).or_default().clone())
            .collect();
        known
            .commands
            .retain(|id, _| table.commands.iter().any(|c| &c.id == id));
        Live {
            table,
            hits,
            commands,
        }
    }
}

enum WatchState {
    Live(Watch<PoliciesDoc>),
    Stopped(ConfigStats),
    Absent,
}

impl std::fmt::Debug for Decider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decider")
            .field("policies", &self.live.load().table.policies.len())
            .finish_non_exhaustive()
    }
}

impl Decider {
    /// Without a workspace: no policies, ever.
    pub(crate) fn absent() -> Decider {
        Decider {
            live: Arc::new(ArcSwap::from_pointee(Live {
                table: Arc::new(empty_table()),
                hits: Vec::new(),
                commands: Vec::new(),
            })),
            watch: Mutex::new(WatchState::Absent),
            counters: Counters::default(),
            runner: None,
            plugins: None,
        }
    }

    /// Loads `<workspace>/policies.json` (before this returns) and watches it.
    /// `plugins`: the WASM policies the workspace's plugins put in force (`None`: none);
    /// `rlimits`: what every guard runs under (the hooks' defaults).
    pub(crate) fn start(
        workspace: PathBuf,
        opts: WatchOptions,
        plugins: Option<Arc<PluginPolicies>>,
        rlimits: Vec<crate::shell::Rlimit>,
    ) -> std::io::Result<Decider> {
        let live = Arc::new(ArcSwap::from_pointee(Live {
            table: Arc::new(empty_table()),
            hits: Vec::new(),
            commands: Vec::new(),
        }));
        let swap = live.clone();
        let known: Mutex<Known> = Mutex::default();
        let runner = Runner::new(&workspace, rlimits);
        let reserve = plugins.clone();
        let on_reload = Box::new(move |t: Arc<PolicyTable>| {
            // A WASM policy with one of the file's ids is refused (ids are unique).
            if let Some(set) = &reserve {
                let ids = t.ids().map(|(id, _)| id.to_string()).collect();
                set.reserve(ids, super::POLICIES_FILE.to_string());
            }
            let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
            swap.store(Arc::new(Live::new(t, &mut known)));
        });
        let watch = Watch::<PoliciesDoc>::start_with(workspace, opts, on_reload)?;
        Ok(Decider {
            live,
            watch: Mutex::new(WatchState::Live(watch)),
            counters: Counters::default(),
            runner: Some(runner),
            plugins,
        })
    }

    pub(crate) fn table(&self) -> Arc<PolicyTable> {
        self.live.load().table.clone()
    }

    pub(crate) fn decide(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &str,
        until: Option<Instant>,
    ) -> Result<Verdict, DecideError> {
        let start = Instant::now();
        let value = match read_payload(payload) {
            Ok(v) => v,
            Err(e) => {
                self.counters.refused();
                return Err(e);
            }
        };
        let mut verdict = self.decide_value(point, agent, &value, Some(payload), until, None);
        verdict.elapsed = start.elapsed();
        Ok(verdict)
    }

    /// Decides with every source: the rules first (a rule's deny answers at once), then the
    /// command policies selected, run at once, then the WASM policies in force, asked on this
    /// thread; the most restrictive answer wins, reported with the first source in order
    /// (policies.json's entries in file order, then the WASM policies by plugin name) that
    /// gave it. A deny ends the question: no source after it is asked. `text` is `payload`
    /// as JSON text when the caller has it (WASM policies get it). `until` is the asker's
    /// deadline: every command and WASM policy is cut at it (or at its own `timeout_ms`,
    /// whichever comes first) and answers its `on_error`; rules are never cut.
    pub(crate) fn decide_value(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload: &serde_json::Value,
        text: Option<&str>,
        until: Option<Instant>,
        trace: Option<&SourceTrace>,
    ) -> Verdict {
        let start = Instant::now();
        let live = self.live.load();
        let table = &live.table;
        let (mut verdict, at) = table.decide_at(point, agent, payload);
        let mut won = (None, None);
        if verdict.decision != Some(Decision::Deny) && table.enabled {
            let mut answers = self.run_commands(&live, point, agent, payload, (until, trace));
            let denied = answers.iter().any(|a| a.decision == Decision::Deny);
            let plugins = self.plugins.as_ref().map(|p| p.load());
            if let Some(set) = plugins.as_deref().filter(|s| !s.is_empty() && !denied) {
                let owned;
                let json = match text {
                    Some(t) => t,
                    None => {
                        owned = payload.to_string();
                        &owned
                    }
                };
                answers.extend(ask_all(set, point, agent, json, until, trace));
            }
            if !answers.is_empty() {
                let rule = at.zip(verdict.decision).map(|(i, d)| Answer {
                    order: table.policies[i].order,
                    decision: d,
                    reason: verdict.reason.clone().unwrap_or_default(),
                    policy: verdict.policy.clone().unwrap_or_default(),
                    context: verdict.context.clone(),
                    command: None,
                    plugin: None,
                });
                let best = rule
                    .into_iter()
                    .chain(answers)
                    .max_by(|a, b| a.decision.cmp(&b.decision).then(b.order.cmp(&a.order)));
                if let Some(b) = best {
                    won = (b.command, b.plugin);
                    verdict = Verdict {
                        decision: Some(b.decision),
                        reason: Some(b.reason),
                        policy: Some(b.policy),
                        context: b.context,
                        elapsed: verdict.elapsed,
                    };
                }
                if let (Some(i), Some(set)) = (won.1, plugins.as_deref())
                    && let Some(p) = set.get(i)
                {
                    p.counters().decisions.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        match won {
            (Some(i), _) => {
                if let Some(c) = live.commands.get(i) {
                    c.decisions.fetch_add(1, Ordering::Relaxed);
                }
            }
            (None, Some(_)) => {}
            (None, None) => {
                if let Some(hits) = at.and_then(|i| live.hits.get(i))
                    && verdict.decision.is_some()
                {
                    hits.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        verdict.elapsed = start.elapsed();
        self.counters.count(&verdict);
        verdict
    }

    /// Runs the command policies the question selects (none without a runner) and gives
    /// their answers.
    fn run_commands(
        &self,
        live: &Live,
        point: DecisionPoint,
        agent: &str,
        payload: &serde_json::Value,
        (until, trace): (Option<Instant>, Option<&SourceTrace>),
    ) -> Vec<Answer> {
        let table = &live.table;
        let Some(runner) = &self.runner else {
            return Vec::new();
        };
        if table.commands.is_empty() {
            return Vec::new();
        }
        let tool = payload.get("tool").and_then(serde_json::Value::as_str);
        let run: Vec<usize> = (0..table.commands.len())
            .filter(|&i| {
                let f = table.commands[i].filter();
                selects(&f, point, agent, tool, payload).is_ok()
            })
            .collect();
        if run.is_empty() {
            return Vec::new();
        }
        runner.run_all(
            &table.commands,
            &run,
            point,
            agent,
            payload,
            &live.commands,
            until,
            trace,
        )
    }

    /// Re-reads policies.json now (`force`: even if unchanged).
    pub(crate) fn reload(&self, force: bool) -> Option<Reload> {
        match &*self.watch.lock().unwrap_or_else(|e| e.into_inner()) {
            WatchState::Live(w) if force => Some(w.reload_now()),
            WatchState::Live(w) => Some(w.reload_if_changed()),
            _ => None,
        }
    }

    /// Counts a question refused before deciding (`refused` in the stats).
    #[cfg(feature = "http")]
    pub(crate) fn refused(&self) {
        self.counters.refused();
    }

    /// Stops watching; the table in force stays.
    pub(crate) fn stop(&self) {
        let mut state = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        if let WatchState::Live(w) = &*state {
            *state = WatchState::Stopped(w.stats());
        }
    }

    pub(crate) fn stats(&self) -> PoliciesStats {
        let file = match &*self.watch.lock().unwrap_or_else(|e| e.into_inner()) {
            WatchState::Live(w) => Some(w.stats()),
            WatchState::Stopped(s) => Some(s.clone()),
            WatchState::Absent => None,
        };
        let live = self.live.load();
        let by_policy = live
            .table
            .policies
            .iter()
            .zip(&live.hits)
            .map(|(p, hits)| PolicyCount {
                policy: p.id.clone(),
                decision: p.decision,
                decisions: hits.load(Ordering::Relaxed),
            })
            .collect();
        let commands = live
            .table
            .commands
            .iter()
            .zip(&live.commands)
            .map(|(c, k)| k.snapshot(&c.id))
            .collect();
        let plugins: Vec<PluginPolicyCount> = self
            .plugins
            .as_ref()
            .map(|set| {
                set.load()
                    .iter()
                    .map(|p| p.counters().snapshot(p.id()))
                    .collect()
            })
            .unwrap_or_default();
        let duplicates = self.plugins.as_ref().map_or(0, |p| p.refused());
        self.counters
            .snapshot(file, by_policy, commands, plugins, duplicates)
    }

    /// Whether any WASM policy is in force.
    pub(crate) fn has_plugins(&self) -> bool {
        self.plugins.as_ref().is_some_and(|p| !p.is_empty())
    }
}
