//! The pipeline side of the shell sink: `deliver` enqueues an event for every hook that wants
//! it, matchers and switches deciding, and each outcome is concluded (counted, fed, traced)
//! (ARCHITECTURE.md § Shell hooks).

use super::*;

/// Why `action` does not run, matchers aside (None: it may run).
pub(super) fn skip_reason(table: &HookTable, action: &Action) -> Option<&'static str> {
    if !table.enabled {
        Some("hooks disabled")
    } else if !action.enabled {
        Some("disabled")
    } else {
        None
    }
}

/// Whether `action`'s matcher keeps it from running for a payload naming `tool`, and why
/// (naming the tool and the pattern).
pub(super) fn matcher_skip(action: &Action, tool: Option<&str>) -> Option<String> {
    let m = action.matcher.as_ref()?;
    match tool {
        Some(t) if m.matches(t) => None,
        Some(t) => Some(format!(
            "matcher {} does not match tool {}",
            crate::config::quote(&m.source()),
            crate::config::quote(t)
        )),
        None => Some(format!(
            "matcher {}: the payload names no tool",
            crate::config::quote(&m.source())
        )),
    }
}

/// Where every outcome ends (module docs § Visibility): logged — failures at warn with their
/// stderr tail, everything else at info with the tail at debug; dropped runs at debug (the
/// first of a streak of queue-full drops is said at warn by `deliver`) — and offered to the
/// run subscribers.
pub(super) fn conclude(sh: &Shared, o: &Outcome) {
    if o.kind.is_failure() {
        tracing::warn!("{o}");
        if o.event == EventKind::ToolCallStart
            && o.kind == (OutcomeKind::Exit { code: 2 })
            && !o.direct
        {
            cannot_block(sh, &o.id);
        }
    } else if matches!(o.kind, OutcomeKind::Dropped { .. } | OutcomeKind::Cancelled) {
        tracing::debug!("{}", o.headline());
    } else {
        tracing::info!("{}", o.headline());
        let tail = o.stderr_tail.trim_end();
        if !tail.is_empty() {
            tracing::debug!("hook {} {} stderr: {:?}", o.id, o.event, tail);
        }
    }
    sh.feed.publish(o);
}

/// Most hook ids told (a reloaded table may bring new ones; past this, nobody more is told).
const TOLD_MAX: usize = 1024;

/// Exit 2 is how an agent's own hook blocks a tool (Claude Code, Codex, Gemini CLI): a hook
/// written that way is told once, at its first exit 2 on `tool_call_start`, that here the tool
/// ran anyway (ARCHITECTURE.md § Shell hooks: hooks observe, never decide).
fn cannot_block(sh: &Shared, id: &str) {
    let mut told = sh
        .told_cannot_block
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if told.len() >= TOLD_MAX || told.contains(id) {
        return;
    }
    told.insert(id.to_string());
    drop(told);
    tracing::warn!(
        "hook {id} exited 2 on tool_call_start, which blocks nothing here: hooks run beside the \
         agent and never decide, so the tool ran. A guard that must stop a tool is a policy \
         (policies.json, docs/policies.md) or the agent's own blocking hook; said once per hook"
    );
}

/// Whether outcomes of runs that never happened are wanted (logged or subscribed to): only
/// then are they built on the pipeline worker.
pub(super) fn wants_outcomes(sh: &Shared) -> bool {
    sh.feed.active() || tracing::enabled!(tracing::Level::INFO)
}

impl Sink for ShellSink {
    fn name(&self) -> &str {
        "shell"
    }

    /// Enqueues one job per enabled, matching hook of the event. One lock, no I/O, no spawn.
    /// Runs that do not happen (skipped, dropped) become outcomes — logged and published —
    /// only when someone wants them, and only after the lock is released.
    fn deliver(&self, msg: &Message) {
        let Some(kind) = msg.event() else { return };
        let prepared = self.shared.table.load();
        let table = &prepared.table;
        let mut actions = table.actions_for(kind).peekable();
        if actions.peek().is_none() {
            return;
        }
        let needs_tool = table.actions_for(kind).any(|a| a.matcher.is_some());
        let tool = if needs_tool {
            payload::payload_tool(msg.json_str())
        } else {
            None
        };
        let sh = &*self.shared;
        let want = wants_outcomes(sh);
        let mut run: Option<Arc<EventRun>> = None;
        let mut queued = false;
        // What to say once the lock is released.
        let mut notes: Vec<(&Arc<Action>, Note)> = Vec::new();
        let mut s = lock(&sh.sched);
        for a in actions {
            let skipped = skip_reason(table, a).is_some()
                || a.matcher
                    .as_ref()
                    .is_some_and(|m| !tool.as_deref().is_some_and(|t| m.matches(t)));
            if skipped {
                s.skip(&a.id);
                if want {
                    notes.push((a, Note::Skipped));
                }
                continue;
            }
            let run = run.get_or_insert_with(|| {
                Arc::new(EventRun::new(
                    msg.clone(),
                    prepared.base_env.clone(),
                    sh.payload.clone(),
                ))
            });
            match s.offer(a, run, sh.queue_per_action) {
                Offer::Queued { after_drops } => {
                    queued = true;
                    if after_drops > 0 {
                        notes.push((a, Note::Recovered(after_drops)));
                    }
                }
                Offer::Dropped { why, first } => {
                    // Not run: an event consumed from NATS is then not acked (`crate::settle`).
                    msg.mark_dropped();
                    if first {
                        notes.push((a, Note::StreakStart));
                    }
                    if want {
                        notes.push((a, Note::Dropped(why)));
                    }
                }
            }
        }
        let wake = queued && std::mem::take(&mut s.runner_idle);
        // Let go of our reference while the runner cannot have taken any job yet: the last
        // reference, and with it the payload file's removal, always belongs to a job.
        drop(run);
        drop(s);
        if wake {
            sh.runner.wake();
        }
        for (a, note) in notes {
            let kind = match note {
                Note::StreakStart => {
                    tracing::warn!(
                        "hook {}: its queue is full ({} runs waiting): dropping its events until \
                         it drains (counted in stats as dropped_queue_full)",
                        a.id,
                        sh.queue_per_action
                    );
                    continue;
                }
                Note::Recovered(n) => {
                    tracing::warn!(
                        "hook {}: its queue has room again; {n} event(s) were dropped",
                        a.id
                    );
                    continue;
                }
                Note::Skipped => {
                    let reason = match skip_reason(table, a) {
                        Some(why) => why.to_string(),
                        None => matcher_skip(a, tool.as_deref()).unwrap_or_default(),
                    };
                    OutcomeKind::Skipped { reason }
                }
                Note::Dropped(why) => OutcomeKind::Dropped {
                    reason: why.as_str().to_string(),
                },
            };
            conclude(sh, &Outcome::not_run(&a.id, a.event, kind, Some(msg)));
        }
    }

    fn counts(&self) -> SinkCounts {
        lock(&self.shared.sched).totals.sink_counts()
    }

    /// Every enabled hook of `kind` has room for `more` jobs in its queue (matchers are not
    /// looked at: a hook that may skip the event still counts).
    fn room(&self, kind: EventKind, more: usize) -> bool {
        let prepared = self.shared.table.load();
        let table = &prepared.table;
        let cap = self.shared.queue_per_action;
        let s = lock(&self.shared.sched);
        table
            .actions_for(kind)
            .filter(|a| skip_reason(table, a).is_none())
            .all(|a| s.hooks.get(&a.id).map_or(0, |h| h.queue.len()) + more <= cap)
    }

    /// The enabled hook whose run queue has the least room.
    fn headroom(&self) -> Option<(usize, usize)> {
        let prepared = self.shared.table.load();
        let table = &prepared.table;
        let cap = self.shared.queue_per_action;
        let s = lock(&self.shared.sched);
        table
            .actions
            .iter()
            .filter(|a| skip_reason(table, a).is_none())
            .map(|a| cap.saturating_sub(s.hooks.get(&a.id).map_or(0, |h| h.queue.len())))
            .min()
            .map(|free| (free, cap))
    }

    fn shutdown(&self, deadline: Instant) {
        ShellSink::shutdown(self, deadline);
    }
}
