//! The pairing state: lifecycle events and hook outcomes in, finished GenAI spans out. Per
//! emitter (agent, session) an `invoke_agent` span with its open `chat` and `execute_tool`
//! children; bounded per emitter and in total (ARCHITECTURE.md § OpenTelemetry traces).

use super::attrs::{self, Ids, Kind, Rec, SpanId, Text, TraceId};
use super::batch::EventRef;
use super::export::Chunk;
use super::payload::{Member, Payload, raw_text};
use crate::EventKind;
use crate::policy;
use crate::shell::{Outcome, OutcomeKind};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::{Duration, Instant};

/// Event → span pairs remembered for hook outcomes (their parents), oldest forgotten first.
const PARENTS: usize = 65_536;

/// Extra fields naming a tool call's id, in the order they are looked for.
const CALL_ID_FIELDS: [&str; 3] = ["tool_call_id", "tool_use_id", "call_id"];

/// What the span builder is allowed to hold and export.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) content: bool,
    pub(crate) idle_limit: Duration,
    pub(crate) max_open: usize,
    pub(crate) max_emitters: usize,
    pub(crate) max_extras: usize,
    pub(crate) max_value_bytes: usize,
    /// Remember each event's span for hook outcomes (there is a run feed).
    pub(crate) link_hooks: bool,
}

/// The builder's counters (read by the sink into `OtelStats`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) events: u64,
    pub(crate) unmatched_starts: u64,
    pub(crate) unmatched_ends: u64,
    pub(crate) hook_spans: u64,
}

struct Open {
    rec: Rec,
    /// The tool's name and call id (tool spans), in `rec`'s text.
    tool: Text,
    call_id: Option<Text>,
}

impl Open {
    fn new(rec: Rec) -> Open {
        Open {
            rec,
            tool: Text::Static(""),
            call_id: None,
        }
    }
}

struct EmitterState {
    agent: String,
    session: String,
    trace: TraceId,
    root: Option<Open>,
    /// The root was opened by an event other than `agent_start`: `turn_complete` ends it.
    implicit: bool,
    chat: Option<Open>,
    tools: Vec<Open>,
    last_seen: Instant,
    /// The newest event time seen: where spans ended for want of an end stop.
    last_time: u64,
}

impl EmitterState {
    fn open(&self) -> usize {
        usize::from(self.root.is_some()) + usize::from(self.chat.is_some()) + self.tools.len()
    }
}

/// Keys that are already hashes (emitter keys) hash to themselves; pairs are mixed.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// Records kept for reuse (each keeps its buffers).
const POOL: usize = 256;

pub(crate) struct Builder {
    limits: Limits,
    pub(crate) ids: Ids,
    emitters: KeyMap<u64, EmitterState>,
    parents: KeyMap<(u64, u64), (TraceId, SpanId)>,
    parent_order: VecDeque<(u64, u64)>,
    /// Finished spans, encoded, taken by the sink.
    pub(crate) out: Chunk,
    pub(crate) counts: Counts,
    /// Set by the sink before each burst (one clock read for many events).
    pub(crate) now: Instant,
    pool: Vec<Rec>,
    members: Vec<Member>,
    /// The last (agent, session) keyed, and its key.
    last_key: (String, String, u64),
}

fn key(agent: &str, session: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (agent, session).hash(&mut h);
    h.finish()
}

impl Builder {
    pub(crate) fn new(limits: Limits) -> Builder {
        Builder {
            limits,
            ids: Ids::new(),
            emitters: KeyMap::default(),
            parents: KeyMap::default(),
            parent_order: VecDeque::new(),
            out: Chunk::default(),
            counts: Counts::default(),
            now: Instant::now(),
            pool: Vec::new(),
            members: Vec::new(),
            last_key: (String::new(), String::new(), key("", "")),
        }
    }

    /// A cleared record from the pool.
    pub(crate) fn rec(&mut self) -> Rec {
        self.pool.pop().unwrap_or_else(Rec::empty)
    }

    /// Encodes a finished span into `out` and keeps its record for reuse.
    pub(crate) fn emit(&mut self, mut rec: Rec) {
        self.out.push(&rec);
        if self.pool.len() < POOL {
            rec.clear();
            self.pool.push(rec);
        }
    }

    /// The emitter key of (agent, session): SipHash, so distinct emitters never share state;
    /// the last one is kept, since an emitter's events come in runs.
    fn key_of(&mut self, agent: &str, session: &str) -> u64 {
        let (a, s, k) = &mut self.last_key;
        if a.as_str() != agent || s.as_str() != session {
            a.clear();
            a.push_str(agent);
            s.clear();
            s.push_str(session);
            *k = key(agent, session);
        }
        *k
    }

    /// The span an emitter's event became (`seq`), if remembered: a hook's or plugin call's
    /// parent.
    pub(crate) fn parent_of(
        &mut self,
        agent: &str,
        session: &str,
        seq: u64,
    ) -> Option<(TraceId, SpanId)> {
        let k = self.key_of(agent, session);
        self.parents.get(&(k, seq)).copied()
    }

    /// One lifecycle event (custom topics are not spans).
    pub(crate) fn event(&mut self, ev: EventRef<'_>) {
        let kind = ev.kind;
        self.counts.events += 1;
        let t = attrs::nanos(ev.timestamp);
        let mut members = std::mem::take(&mut self.members);
        let payload = Payload::parse(ev.json, &mut members);
        let k = self.key_of(ev.agent, ev.session);
        self.touch(k, ev.agent, ev.session, t);
        let ctx = Ctx {
            key: k,
            t,
            kind,
            payload: &payload,
        };
        let span = match kind {
            EventKind::AgentStart => self.agent_start(&ctx),
            EventKind::AgentEnd => self.agent_end(&ctx),
            EventKind::LlmRequest => self.llm_request(&ctx),
            EventKind::LlmResponse => self.llm_response(&ctx),
            EventKind::ToolCallStart => self.tool_start(&ctx),
            EventKind::ToolCall => self.tool_end(&ctx),
            EventKind::TurnComplete => self.turn_complete(&ctx),
            EventKind::Error => self.error(&ctx),
        };
        self.members = members;
        if self.limits.link_hooks {
            self.remember(k, ev.seq, span);
        }
        if self.emitters.get(&k).is_some_and(|e| e.open() == 0) {
            self.emitters.remove(&k);
        }
    }

    /// The emitter's state, made if new (evicting the least recently seen past the bound).
    fn touch(&mut self, k: u64, agent: &str, session: &str, t: u64) {
        if !self.emitters.contains_key(&k) && self.emitters.len() >= self.limits.max_emitters {
            let oldest = self
                .emitters
                .iter()
                .min_by_key(|(_, e)| e.last_seen)
                .map(|(k, _)| *k);
            if let Some(old) = oldest {
                self.close_emitter(old, "evicted");
            }
        }
        let now = self.now;
        let ids = &mut self.ids;
        let e = self.emitters.entry(k).or_insert_with(|| EmitterState {
            agent: agent.to_string(),
            session: session.to_string(),
            trace: ids.trace(),
            root: None,
            implicit: false,
            chat: None,
            tools: Vec::new(),
            last_seen: now,
            last_time: t,
        });
        e.last_seen = now;
        e.last_time = e.last_time.max(t);
    }

    fn remember(&mut self, k: u64, seq: u64, span: (TraceId, SpanId)) {
        if self.parents.insert((k, seq), span).is_none() {
            self.parent_order.push_back((k, seq));
            if self.parent_order.len() > PARENTS
                && let Some(old) = self.parent_order.pop_front()
            {
                self.parents.remove(&old);
            }
        }
    }

    fn state(&mut self, k: u64) -> &mut EmitterState {
        self.emitters.get_mut(&k).expect("touched before")
    }

    fn common(rec: &mut Rec, e: &EmitterState, op: &'static str) {
        rec.text_attr("gen_ai.operation.name", Text::Static(op));
        rec.str("gen_ai.conversation.id", &e.session);
        // The general conventions' name, which Phoenix groups sessions by.
        rec.str("session.id", &e.session);
        rec.str("gen_ai.agent.name", &e.agent);
    }

    fn extras(&self, rec: &mut Rec, c: &Ctx) {
        attrs::extras(
            rec,
            c.payload,
            c.kind.fields(),
            self.limits.content,
            self.limits.max_extras,
            self.limits.max_value_bytes,
        );
    }

    /// A new span `op what` in the emitter's trace, under its root (made implicitly if none
    /// is open).
    fn child(&mut self, c: &Ctx, op: &'static str, what: &str, kind: Kind) -> Open {
        self.ensure_root(c);
        let id = self.ids.span();
        let mut rec = self.rec();
        let e = &self.emitters[&c.key];
        let root = e.root.as_ref().map(|r| r.rec.id);
        rec.begin(kind, e.trace, id, root, c.t);
        rec.name2(op, what);
        Self::common(&mut rec, e, op);
        self.extras(&mut rec, c);
        Open::new(rec)
    }

    fn ensure_root(&mut self, c: &Ctx) {
        if self.emitters[&c.key].root.is_none() {
            let root = self.root_span(c);
            let e = self.state(c.key);
            e.root = Some(root);
            e.implicit = true;
        }
    }

    fn root_span(&mut self, c: &Ctx) -> Open {
        let (trace, parent) = match self.launcher(c) {
            Some((trace, parent)) => (trace, Some(parent)),
            None => (self.ids.trace(), None),
        };
        let id = self.ids.span();
        let mut rec = self.rec();
        let e = self.state(c.key);
        e.trace = trace;
        rec.begin(Kind::Internal, trace, id, parent, c.t);
        rec.name2("invoke_agent", &e.agent);
        let e = &self.emitters[&c.key];
        Self::common(&mut rec, e, "invoke_agent");
        if let Some(provider) = agent_provider(&e.agent) {
            rec.str("gen_ai.provider.name", provider);
        }
        Open::new(rec)
    }

    /// Where a subagent's run goes (ARCHITECTURE.md § OpenTelemetry traces): a subagent is an
    /// emitter of its own whose events name their parent's session (`parent_session`); while
    /// the parent's turn is open, the subagent's `invoke_agent` is a child of the parent's
    /// newest open tool call (the one that launched it), else of the parent's turn, in the
    /// parent's trace. `None`: the root of a new trace.
    fn launcher(&self, c: &Ctx) -> Option<(TraceId, SpanId)> {
        let parent_session = c.payload.str_opt(PARENT_SESSION)?;
        let e = self.emitters.get(&c.key)?;
        let parent = self.emitters.get(&key(&e.agent, &parent_session))?;
        let root = parent.root.as_ref()?;
        let under = parent.tools.last().map_or(root.rec.id, |t| t.rec.id);
        Some((parent.trace, under))
    }

    fn ids_of(&self, k: u64, o: &Open) -> (TraceId, SpanId) {
        (self.emitters[&k].trace, o.rec.id)
    }

    fn agent_start(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        self.close_children(c.key, "agent restarted");
        if let Some(old) = self.state(c.key).root.take() {
            self.unmatched(old, "agent restarted");
        }
        let mut root = self.root_span(c);
        self.extras(&mut root.rec, c);
        let ids = self.ids_of(c.key, &root);
        let e = self.state(c.key);
        e.root = Some(root);
        e.implicit = false;
        ids
    }

    fn agent_end(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let interrupted = interrupted(c.payload);
        if interrupted {
            self.interrupt_children(c.key);
        } else {
            self.close_children(c.key, "agent ended");
        }
        let mut root = match self.state(c.key).root.take() {
            Some(r) => r,
            None => {
                self.counts.unmatched_ends += 1;
                self.root_span(c)
            }
        };
        let ids = self.ids_of(c.key, &root);
        self.extras(&mut root.rec, c);
        if let Some(n) = c.payload.int("messages_count") {
            root.rec.int("prx.messages_count", n);
        }
        if interrupted {
            // Not a failure, not a clean end: OpenTelemetry has no status for it.
            root.rec.str(END_REASON, "interrupted");
        } else if c.payload.bool("success") == Some(false) {
            root.rec.error("agent_failed", "agent_end: success = false");
        }
        self.finish(root, c.t);
        ids
    }

    fn chat_span(&mut self, c: &Ctx) -> Open {
        let model = c.payload.str("model");
        let provider = c.payload.str("provider");
        let mut chat = self.child(c, "chat", &model, Kind::Client);
        chat.rec.str("gen_ai.provider.name", &provider);
        // The agent span names the provider of its first model call when its agent does not
        // say it already.
        if let Some(root) = &mut self.state(c.key).root
            && !provider.is_empty()
            && root.rec.attr_text("gen_ai.provider.name").is_none()
        {
            root.rec.str("gen_ai.provider.name", &provider);
        }
        chat.rec.str("gen_ai.request.model", &model);
        chat
    }

    fn llm_request(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        if let Some(old) = self.state(c.key).chat.take() {
            self.unmatched(old, "a new llm_request began");
        }
        let mut chat = self.chat_span(c);
        if let Some(n) = c.payload.int("messages_count") {
            chat.rec.int("prx.messages_count", n);
        }
        let ids = self.ids_of(c.key, &chat);
        self.state(c.key).chat = Some(chat);
        ids
    }

    fn llm_response(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let mut chat = match self.state(c.key).chat.take() {
            Some(chat) => chat,
            None => {
                self.counts.unmatched_ends += 1;
                let mut chat = self.chat_span(c);
                self.place_by_duration(&mut chat, c);
                chat
            }
        };
        self.extras(&mut chat.rec, c);
        chat.rec
            .str("gen_ai.response.model", &c.payload.str("model"));
        if let Some(ms) = c.payload.int("duration_ms") {
            chat.rec.int("prx.llm.duration_ms", ms);
        }
        if c.payload.bool("success") == Some(false) {
            chat.rec.error("llm_error", "llm_response: success = false");
        }
        let ids = self.ids_of(c.key, &chat);
        self.finish(chat, c.t);
        ids
    }

    /// An `execute_tool` span with its tool name and call id.
    fn tool_span(&mut self, c: &Ctx, tool: &str) -> Open {
        let mut open = self.child(c, "execute_tool", tool, Kind::Internal);
        open.rec.str("gen_ai.tool.name", tool);
        if let Some(id) = call_id(c.payload) {
            open.rec.str("gen_ai.tool.call.id", &id);
            open.call_id = open.rec.attr_text("gen_ai.tool.call.id");
        }
        open.tool = open
            .rec
            .attr_text("gen_ai.tool.name")
            .unwrap_or(Text::Static(""));
        open
    }

    fn tool_start(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let tool = c.payload.str("tool");
        let mut open = self.tool_span(c, &tool);
        if self.limits.content
            && let Some(args) = c.payload.raw("arguments")
        {
            let v = open.rec.push_bounded(args, self.limits.max_value_bytes);
            open.rec.text_attr("gen_ai.tool.call.arguments", v);
        }
        let ids = self.ids_of(c.key, &open);
        // Decided before it ran (docs/policies.md § Audit): the decision is a guardrail span
        // under the tool's; a denied tool never runs, so its span ends here, with the reason.
        if let Some(decision) = c.payload.str_opt(policy::DECISION_FIELD) {
            self.guardrail(c, ids, &tool, &decision);
            if decision == "deny" {
                let reason = c.payload.str(policy::REASON_FIELD);
                let reason = if reason.is_empty() {
                    format!(
                        "denied by policy {}",
                        c.payload.str(policy::POLICY_ID_FIELD)
                    )
                } else {
                    reason.into_owned()
                };
                open.rec.error("policy_denied", &reason);
                self.finish(open, c.t);
                return ids;
            }
        }
        // Bounded per emitter: the oldest open tool gives way.
        let max_tools = self.limits.max_open.saturating_sub(2).max(1);
        let e = self.state(c.key);
        e.tools.push(open);
        if e.tools.len() > max_tools {
            let old = e.tools.remove(0);
            self.unmatched(old, "too many open tool calls");
        }
        ids
    }

    /// An `apply_guardrail {policy}` span under the tool span `parent`, at the event's time:
    /// GenAI's guardrail shape (`gen_ai.operation.name` `apply_guardrail`) with the decision
    /// as a `gen_ai.evaluation.result` event (name, score label, explanation).
    fn guardrail(&mut self, c: &Ctx, parent: (TraceId, SpanId), tool: &str, decision: &str) {
        let policy = c.payload.str(policy::POLICY_ID_FIELD);
        let reason = c.payload.str(policy::REASON_FIELD);
        let id = self.ids.span();
        let mut rec = self.rec();
        rec.begin(Kind::Internal, parent.0, id, Some(parent.1), c.t);
        rec.name2(
            "apply_guardrail",
            if policy.is_empty() { decision } else { &policy },
        );
        let e = &self.emitters[&c.key];
        Self::common(&mut rec, e, "apply_guardrail");
        rec.str("gen_ai.tool.name", tool);
        if let Some(call) = call_id(c.payload) {
            rec.str("gen_ai.tool.call.id", &call);
        }
        rec.str("prx.policy.decision", decision);
        if !policy.is_empty() {
            rec.str("prx.policy.id", &policy);
        }
        let (reason, _) = attrs::cut(&reason, self.limits.max_value_bytes);
        if !reason.is_empty() {
            rec.str("prx.policy.reason", reason);
        }
        let mut result = vec![
            ("gen_ai.evaluation.name", &*policy),
            ("gen_ai.evaluation.score.label", decision),
        ];
        if !reason.is_empty() {
            result.push(("gen_ai.evaluation.explanation", reason));
        }
        rec.event("gen_ai.evaluation.result", c.t, &result);
        rec.end = c.t;
        self.emit(rec);
    }

    fn tool_end(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let tool = c.payload.str("tool");
        let id = call_id(c.payload);
        let e = self.state(c.key);
        let at = match &id {
            Some(id) => e
                .tools
                .iter()
                .rposition(|o| o.call_id.is_some_and(|t| o.rec.text(t) == id.as_ref())),
            None => e.tools.iter().rposition(|o| o.rec.text(o.tool) == tool),
        };
        let mut open = match at {
            Some(at) => e.tools.remove(at),
            None => {
                self.counts.unmatched_ends += 1;
                let mut open = self.tool_span(c, &tool);
                self.place_by_duration(&mut open, c);
                open
            }
        };
        self.extras(&mut open.rec, c);
        if self.limits.content
            && let Some(out) = c.payload.raw("output")
        {
            let v = open
                .rec
                .push_bounded(&raw_text(out), self.limits.max_value_bytes);
            open.rec.text_attr("gen_ai.tool.call.result", v);
        }
        if interrupted(c.payload) {
            open.rec.str(END_REASON, "interrupted");
        } else if c.payload.bool("success") == Some(false) {
            open.rec.error("tool_error", "tool_call: success = false");
        }
        let ids = self.ids_of(c.key, &open);
        self.finish(open, c.t);
        ids
    }

    /// An end that came without its start but says how long it took (`duration_ms`, as
    /// agents that send only the end do): the span starts that long before the end, and an
    /// implicit agent span opened by this end starts no later than it.
    fn place_by_duration(&mut self, open: &mut Open, c: &Ctx) {
        let Some(ms) = c.payload.int("duration_ms").filter(|ms| *ms > 0) else {
            return;
        };
        let start = c.t.saturating_sub((ms as u64).saturating_mul(1_000_000));
        open.rec.start = start;
        let e = self.state(c.key);
        if e.implicit
            && let Some(root) = &mut e.root
            && root.rec.start > start
        {
            root.rec.start = start;
        }
    }

    fn turn_complete(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        self.close_children(c.key, "the turn completed");
        self.ensure_root(c);
        let e = self.state(c.key);
        if e.implicit {
            let mut root = e.root.take().expect("ensured");
            self.extras(&mut root.rec, c);
            let ids = self.ids_of(c.key, &root);
            self.finish(root, c.t);
            return ids;
        }
        let trace = e.trace;
        let root = e.root.as_mut().expect("ensured");
        root.rec.event("turn_complete", c.t, &[]);
        (trace, root.rec.id)
    }

    fn error(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let component = c.payload.str("component");
        let message = c.payload.str("message");
        let (message, was_cut) = attrs::cut(&message, self.limits.max_value_bytes);
        let cut_message;
        let message = if was_cut {
            cut_message = format!("{message}…");
            cut_message.as_str()
        } else {
            message
        };
        let exception = [
            ("exception.type", &*component),
            ("exception.message", message),
        ];
        let e = self.state(c.key);
        let trace = e.trace;
        let open = if let Some(tool) = e.tools.last_mut() {
            Some(tool)
        } else if let Some(chat) = e.chat.as_mut() {
            Some(chat)
        } else {
            e.root.as_mut()
        };
        if let Some(open) = open {
            open.rec.event("exception", c.t, &exception);
            return (trace, open.rec.id);
        }
        // Nothing open: a span of its own, in a trace of its own.
        let trace = self.ids.trace();
        let id = self.ids.span();
        let mut rec = self.rec();
        rec.begin(Kind::Internal, trace, id, None, c.t);
        rec.name2("error", &component);
        let e = &self.emitters[&c.key];
        rec.str("gen_ai.conversation.id", &e.session);
        rec.str("gen_ai.agent.name", &e.agent);
        self.extras(&mut rec, c);
        rec.event("exception", c.t, &exception);
        rec.error(&component, &c.payload.str("message"));
        self.emit(rec);
        (trace, id)
    }

    fn finish(&mut self, mut open: Open, end: u64) {
        open.rec.end = end.max(open.rec.start);
        self.emit(open.rec);
    }

    /// A start that never got its end: ended now, error status, counted.
    fn unmatched(&mut self, mut open: Open, why: &str) {
        self.counts.unmatched_starts += 1;
        open.rec.error("unfinished", why);
        let end = open.rec.end;
        self.finish(open, end);
    }

    /// Ends the emitter's open chat and tool spans as unmatched; their end time is the
    /// emitter's newest event.
    fn close_children(&mut self, k: u64, why: &str) {
        let Some(e) = self.emitters.get_mut(&k) else {
            return;
        };
        let t = e.last_time;
        let mut open: Vec<Open> = e.tools.drain(..).collect();
        open.extend(e.chat.take());
        for mut o in open {
            o.rec.end = t;
            self.unmatched(o, why);
        }
    }

    /// The user interrupted the turn: its open chat and tool spans end at the emitter's newest
    /// event, status UNSET with `prx.end_reason = interrupted` (not `unfinished`).
    fn interrupt_children(&mut self, k: u64) {
        let Some(e) = self.emitters.get_mut(&k) else {
            return;
        };
        let t = e.last_time;
        let mut open: Vec<Open> = e.tools.drain(..).collect();
        open.extend(e.chat.take());
        for mut o in open {
            o.rec.str(END_REASON, "interrupted");
            self.finish(o, t);
        }
    }

    fn close_emitter(&mut self, k: u64, why: &str) {
        self.close_children(k, why);
        if let Some(mut e) = self.emitters.remove(&k)
            && let Some(mut root) = e.root.take()
        {
            root.rec.end = e.last_time;
            self.unmatched(root, why);
        }
    }

    /// Ends the open spans of emitters idle for longer than the idle limit.
    pub(crate) fn sweep(&mut self, now: Instant) {
        let idle: Vec<u64> = self
            .emitters
            .iter()
            .filter(|(_, e)| now.duration_since(e.last_seen) >= self.limits.idle_limit)
            .map(|(k, _)| *k)
            .collect();
        for k in idle {
            self.close_emitter(k, "idle limit");
        }
    }

    /// Ends every open span (shutdown).
    pub(crate) fn close_all(&mut self) {
        let all: Vec<u64> = self.emitters.keys().copied().collect();
        for k in all {
            self.close_emitter(k, "shutdown");
        }
    }

    /// A new `execute_hook {id}` span: a child of its event's span when that is remembered,
    /// else the root of a trace of its own.
    pub(crate) fn hook_span(
        &mut self,
        parent: Option<(TraceId, SpanId)>,
        id: &str,
        start: u64,
        duration: Duration,
    ) -> Rec {
        let (trace, parent) = match parent {
            Some((t, p)) => (t, Some(p)),
            None => (self.ids.trace(), None),
        };
        let span = self.ids.span();
        let mut rec = self.rec();
        rec.begin(Kind::Internal, trace, span, parent, start);
        rec.end = start.saturating_add(duration.as_nanos().min(u128::from(u64::MAX)) as u64);
        rec.name2("execute_hook", id);
        rec.str("prx.hook.id", id);
        rec
    }

    /// A hook run (or skip) as an `execute_hook {id}` child of its event's span.
    pub(crate) fn hook(&mut self, o: &Outcome) {
        if o.direct {
            return;
        }
        self.counts.hook_spans += 1;
        let parent = self.parent_of(&o.agent, &o.session, o.seq);
        let start = attrs::nanos(o.started_at);
        let mut rec = self.hook_span(parent, &o.id, start, o.duration);
        rec.text_attr("prx.hook.event", Text::Static(o.event.name()));
        rec.text_attr("prx.hook.outcome", Text::Static(outcome_name(&o.kind)));
        rec.str("gen_ai.conversation.id", &o.session);
        rec.str("gen_ai.agent.name", &o.agent);
        if let Some(pid) = o.pid {
            rec.int("process.pid", i64::from(pid));
        }
        match &o.kind {
            OutcomeKind::Ok => rec.int("process.exit.code", 0),
            OutcomeKind::Exit { code } => rec.int("process.exit.code", i64::from(*code)),
            OutcomeKind::Signal { signal } => rec.int("prx.hook.signal", i64::from(*signal)),
            OutcomeKind::TimedOut { after_ms } => rec.int("prx.hook.timeout_ms", *after_ms as i64),
            OutcomeKind::SpawnFailed { reason } => rec.event(
                "spawn_failed",
                start,
                &[("prx.hook.reason", reason.as_str())],
            ),
            OutcomeKind::Skipped { reason } => {
                rec.event("skipped", start, &[("prx.hook.reason", reason.as_str())])
            }
            OutcomeKind::Dropped { reason } => {
                rec.event("dropped", start, &[("prx.hook.reason", reason.as_str())])
            }
            _ => {}
        }
        if o.kind.is_failure() {
            rec.error(outcome_name(&o.kind), &o.kind.to_string());
        }
        if self.limits.content && !o.stderr_tail.is_empty() {
            let tail = &o.stderr_tail[tail_start(&o.stderr_tail, self.limits.max_value_bytes)..];
            rec.str("prx.hook.stderr_tail", tail);
        }
        self.emit(rec);
    }
}

struct Ctx<'a> {
    key: u64,
    t: u64,
    kind: EventKind,
    payload: &'a Payload<'a>,
}

/// The extra field a subagent's events name their parent's session with (crate::agents).
const PARENT_SESSION: &str = "parent_session";

/// Why a span ended when it is neither a success nor a failure (`interrupted`).
const END_REASON: &str = "prx.end_reason";

/// Whether the user interrupted what this event ends: `is_interrupt` (Claude Code's, Cursor's
/// and Qwen Code's tool failures) or Codex's `Interrupt` hook.
fn interrupted(p: &Payload<'_>) -> bool {
    p.bool("is_interrupt") == Some(true) || p.str("hook_event_name") == "Interrupt"
}

/// The provider of a coding agent that talks to one (the GenAI conventions' well-known
/// values); `None` for agents that use several (Cursor, Copilot CLI, …) and for every other
/// name, whose spans take the provider of their first model call.
fn agent_provider(agent: &str) -> Option<&'static str> {
    use crate::agents::Agent;
    match Agent::from_name(agent)? {
        Agent::ClaudeCode => Some("anthropic"),
        Agent::Codex => Some("openai"),
        Agent::GeminiCli => Some("gcp.gemini"),
        _ => None,
    }
}

fn call_id<'a>(p: &Payload<'a>) -> Option<std::borrow::Cow<'a, str>> {
    CALL_ID_FIELDS.iter().find_map(|k| p.str_opt(k))
}

fn tail_start(s: &str, max: usize) -> usize {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    start
}

pub(crate) fn outcome_name(k: &OutcomeKind) -> &'static str {
    match k {
        OutcomeKind::Ok => "ok",
        OutcomeKind::Exit { .. } => "exit",
        OutcomeKind::Signal { .. } => "signal",
        OutcomeKind::TimedOut { .. } => "timed_out",
        OutcomeKind::SpawnFailed { .. } => "spawn_failed",
        OutcomeKind::Killed => "killed",
        OutcomeKind::Skipped { .. } => "skipped",
        OutcomeKind::Dropped { .. } => "dropped",
        OutcomeKind::Cancelled => "cancelled",
    }
}
