//! The pairing state: lifecycle events and hook outcomes in, finished GenAI spans out. Per
//! emitter (agent, session) an `invoke_agent` span with its open `chat` and `execute_tool`
//! children; bounded per emitter and in total (ARCHITECTURE.md § OpenTelemetry traces).

use super::attrs::{self, Ids, SpanId, TraceId, bounded, i, kv, new_span, s, set, set_error};
use crate::EventKind;
use crate::bus::Message;
use crate::shell::{Outcome, OutcomeKind};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use super::payload::{Payload, raw_text};

/// Event → span pairs remembered for hook outcomes (their parents), oldest forgotten first.
const PARENTS: usize = 65_536;

/// Extra fields naming a tool call's id, in the order they are looked for.
const CALL_ID_FIELDS: [&str; 3] = ["tool_call_id", "tool_use_id", "call_id"];

/// What the span builder is allowed to hold and export.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub content: bool,
    pub idle_limit: Duration,
    pub max_open: usize,
    pub max_emitters: usize,
    pub max_extras: usize,
    pub max_value_bytes: usize,
    /// Remember each event's span for hook outcomes (there is a run feed).
    pub link_hooks: bool,
}

/// The builder's counters (read by the sink into `OtelStats`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub events: u64,
    pub unmatched_starts: u64,
    pub unmatched_ends: u64,
    pub hook_spans: u64,
}

struct Open {
    span: Span,
    id: SpanId,
    /// The tool's name and call id (tool spans).
    tool: String,
    call_id: Option<String>,
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

pub(crate) struct Builder {
    limits: Limits,
    pub ids: Ids,
    emitters: HashMap<u64, EmitterState>,
    parents: HashMap<(u64, u64), (TraceId, SpanId)>,
    parent_order: VecDeque<(u64, u64)>,
    /// Finished spans, taken by the sink.
    pub out: Vec<Span>,
    pub counts: Counts,
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
            emitters: HashMap::new(),
            parents: HashMap::new(),
            parent_order: VecDeque::new(),
            out: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// One lifecycle event (custom topics are not spans).
    pub(crate) fn event(&mut self, msg: &Message) {
        let Some(kind) = msg.event() else { return };
        self.counts.events += 1;
        let t = attrs::nanos(msg.timestamp());
        let payload = Payload::parse(msg.json());
        let k = key(msg.agent(), msg.session());
        self.touch(k, msg.agent(), msg.session(), t);
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
        if self.limits.link_hooks {
            self.remember(k, msg.seq(), span);
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
        let trace = self.ids.trace();
        let e = self.emitters.entry(k).or_insert_with(|| EmitterState {
            agent: agent.to_string(),
            session: session.to_string(),
            trace,
            root: None,
            implicit: false,
            chat: None,
            tools: Vec::new(),
            last_seen: Instant::now(),
            last_time: t,
        });
        e.last_seen = Instant::now();
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

    fn common(&self, span: &mut Span, e: &EmitterState, op: &str) {
        set(span, "gen_ai.operation.name", s(op));
        set(span, "gen_ai.conversation.id", s(&e.session));
        set(span, "gen_ai.agent.name", s(&e.agent));
    }

    fn extras(&self, span: &mut Span, c: &Ctx) {
        attrs::extras(
            span,
            c.payload,
            c.kind.fields(),
            self.limits.max_extras,
            self.limits.max_value_bytes,
        );
    }

    /// A new span in the emitter's trace, under its root (made implicitly if none is open).
    fn child(&mut self, c: &Ctx, name: String, kind: SpanKind, op: &str) -> Open {
        self.ensure_root(c);
        let id = self.ids.span();
        let e = &self.emitters[&c.key];
        let root = e.root.as_ref().map(|r| r.id);
        let mut span = new_span(name, kind, e.trace, id, root, c.t);
        self.common(&mut span, e, op);
        self.extras(&mut span, c);
        Open {
            span,
            id,
            tool: String::new(),
            call_id: None,
        }
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
        let trace = self.ids.trace();
        let id = self.ids.span();
        let e = self.state(c.key);
        e.trace = trace;
        let name = format!("invoke_agent {}", e.agent);
        let mut span = new_span(name, SpanKind::Internal, trace, id, None, c.t);
        let e = &self.emitters[&c.key];
        self.common(&mut span, e, "invoke_agent");
        Open {
            span,
            id,
            tool: String::new(),
            call_id: None,
        }
    }

    fn ids_of(&self, k: u64, o: &Open) -> (TraceId, SpanId) {
        (self.emitters[&k].trace, o.id)
    }

    fn agent_start(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        self.close_children(c.key, "agent restarted");
        if let Some(old) = self.state(c.key).root.take() {
            self.unmatched(old, "agent restarted");
        }
        let mut root = self.root_span(c);
        self.extras(&mut root.span, c);
        let ids = self.ids_of(c.key, &root);
        let e = self.state(c.key);
        e.root = Some(root);
        e.implicit = false;
        ids
    }

    fn agent_end(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        self.close_children(c.key, "agent ended");
        let mut root = match self.state(c.key).root.take() {
            Some(r) => r,
            None => {
                self.counts.unmatched_ends += 1;
                self.root_span(c)
            }
        };
        let ids = self.ids_of(c.key, &root);
        self.extras(&mut root.span, c);
        if let Some(n) = c.payload.int("messages_count") {
            set(&mut root.span, "prx.messages_count", i(n));
        }
        if c.payload.bool("success") == Some(false) {
            set_error(&mut root.span, "agent_failed", "agent_end: success = false");
        }
        self.finish(root, c.t);
        ids
    }

    fn llm_request(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        if let Some(old) = self.state(c.key).chat.take() {
            self.unmatched(old, "a new llm_request began");
        }
        let model = c.payload.str("model");
        let mut chat = self.child(c, format!("chat {model}"), SpanKind::Client, "chat");
        set(
            &mut chat.span,
            "gen_ai.provider.name",
            s(&c.payload.str("provider")),
        );
        set(&mut chat.span, "gen_ai.request.model", s(&model));
        if let Some(n) = c.payload.int("messages_count") {
            set(&mut chat.span, "prx.messages_count", i(n));
        }
        let ids = self.ids_of(c.key, &chat);
        self.state(c.key).chat = Some(chat);
        ids
    }

    fn llm_response(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let model = c.payload.str("model");
        let mut chat = match self.state(c.key).chat.take() {
            Some(chat) => chat,
            None => {
                self.counts.unmatched_ends += 1;
                let mut chat = self.child(c, format!("chat {model}"), SpanKind::Client, "chat");
                set(
                    &mut chat.span,
                    "gen_ai.provider.name",
                    s(&c.payload.str("provider")),
                );
                set(&mut chat.span, "gen_ai.request.model", s(&model));
                chat
            }
        };
        self.extras(&mut chat.span, c);
        set(&mut chat.span, "gen_ai.response.model", s(&model));
        if let Some(ms) = c.payload.int("duration_ms") {
            set(&mut chat.span, "prx.llm.duration_ms", i(ms));
        }
        if c.payload.bool("success") == Some(false) {
            set_error(&mut chat.span, "llm_error", "llm_response: success = false");
        }
        let ids = self.ids_of(c.key, &chat);
        self.finish(chat, c.t);
        ids
    }

    fn tool_start(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let tool = c.payload.str("tool").into_owned();
        let mut open = self.child(
            c,
            format!("execute_tool {tool}"),
            SpanKind::Internal,
            "execute_tool",
        );
        set(&mut open.span, "gen_ai.tool.name", s(&tool));
        open.call_id = call_id(c.payload);
        if let Some(id) = &open.call_id {
            set(&mut open.span, "gen_ai.tool.call.id", s(id));
        }
        if self.limits.content
            && let Some(args) = c.payload.raw("arguments")
        {
            let v = bounded(args.get(), self.limits.max_value_bytes);
            set(
                &mut open.span,
                "gen_ai.tool.call.arguments",
                Value::StringValue(v),
            );
        }
        open.tool = tool;
        let ids = self.ids_of(c.key, &open);
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

    fn tool_end(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let tool = c.payload.str("tool");
        let id = call_id(c.payload);
        let e = self.state(c.key);
        let at = match &id {
            Some(id) => e.tools.iter().rposition(|o| o.call_id.as_ref() == Some(id)),
            None => e.tools.iter().rposition(|o| o.tool == tool),
        };
        let mut open = match at {
            Some(at) => e.tools.remove(at),
            None => {
                self.counts.unmatched_ends += 1;
                let mut open = self.child(
                    c,
                    format!("execute_tool {tool}"),
                    SpanKind::Internal,
                    "execute_tool",
                );
                set(&mut open.span, "gen_ai.tool.name", s(&tool));
                if let Some(id) = &id {
                    set(&mut open.span, "gen_ai.tool.call.id", s(id));
                }
                open
            }
        };
        self.extras(&mut open.span, c);
        if self.limits.content
            && let Some(out) = c.payload.raw("output")
        {
            let v = bounded(&raw_text(out), self.limits.max_value_bytes);
            set(
                &mut open.span,
                "gen_ai.tool.call.result",
                Value::StringValue(v),
            );
        }
        if c.payload.bool("success") == Some(false) {
            set_error(&mut open.span, "tool_error", "tool_call: success = false");
        }
        let ids = self.ids_of(c.key, &open);
        self.finish(open, c.t);
        ids
    }

    fn turn_complete(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        self.close_children(c.key, "the turn completed");
        self.ensure_root(c);
        let e = self.state(c.key);
        if e.implicit {
            let mut root = e.root.take().expect("ensured");
            self.extras(&mut root.span, c);
            let ids = self.ids_of(c.key, &root);
            self.finish(root, c.t);
            return ids;
        }
        let trace = e.trace;
        let root = e.root.as_mut().expect("ensured");
        attrs::event(&mut root.span, "turn_complete", c.t, Vec::new());
        (trace, root.id)
    }

    fn error(&mut self, c: &Ctx) -> (TraceId, SpanId) {
        let component = c.payload.str("component");
        let exception = vec![
            kv("exception.type", s(&component)),
            kv(
                "exception.message",
                Value::StringValue(bounded(
                    &c.payload.str("message"),
                    self.limits.max_value_bytes,
                )),
            ),
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
            attrs::event(&mut open.span, "exception", c.t, exception);
            return (trace, open.id);
        }
        // Nothing open: a span of its own, in a trace of its own.
        let trace = self.ids.trace();
        let id = self.ids.span();
        let name = format!("error {component}");
        let mut span = new_span(name, SpanKind::Internal, trace, id, None, c.t);
        let e = &self.emitters[&c.key];
        set(&mut span, "gen_ai.conversation.id", s(&e.session));
        set(&mut span, "gen_ai.agent.name", s(&e.agent));
        self.extras(&mut span, c);
        attrs::event(&mut span, "exception", c.t, exception);
        set_error(&mut span, &component, &c.payload.str("message"));
        self.out.push(span);
        (trace, id)
    }

    fn finish(&mut self, mut open: Open, end: u64) {
        open.span.end_time_unix_nano = end.max(open.span.start_time_unix_nano);
        self.out.push(open.span);
    }

    /// A start that never got its end: ended now, error status, counted.
    fn unmatched(&mut self, mut open: Open, why: &str) {
        self.counts.unmatched_starts += 1;
        set_error(&mut open.span, "unfinished", why);
        let end = open.span.end_time_unix_nano;
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
            o.span.end_time_unix_nano = t;
            self.unmatched(o, why);
        }
    }

    fn close_emitter(&mut self, k: u64, why: &str) {
        self.close_children(k, why);
        if let Some(mut e) = self.emitters.remove(&k)
            && let Some(mut root) = e.root.take()
        {
            root.span.end_time_unix_nano = e.last_time;
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

    /// A hook run (or skip) as an `execute_hook {id}` child of its event's span.
    pub(crate) fn hook(&mut self, o: &Outcome) {
        if o.direct {
            return;
        }
        self.counts.hook_spans += 1;
        let k = key(&o.agent, &o.session);
        let (trace, parent) = match self.parents.get(&(k, o.seq)) {
            Some((t, p)) => (*t, Some(*p)),
            None => (self.ids.trace(), None),
        };
        let start = attrs::nanos(o.started_at);
        let id = self.ids.span();
        let name = format!("execute_hook {}", o.id);
        let mut span = new_span(name, SpanKind::Internal, trace, id, parent, start);
        span.end_time_unix_nano = start + o.duration.as_nanos().min(u128::from(u64::MAX)) as u64;
        set(&mut span, "prx.hook.id", s(&o.id));
        set(&mut span, "prx.hook.event", s(o.event.name()));
        set(&mut span, "prx.hook.outcome", s(outcome_name(&o.kind)));
        set(&mut span, "gen_ai.conversation.id", s(&o.session));
        set(&mut span, "gen_ai.agent.name", s(&o.agent));
        if let Some(pid) = o.pid {
            set(&mut span, "process.pid", i(i64::from(pid)));
        }
        match &o.kind {
            OutcomeKind::Ok => set(&mut span, "process.exit.code", i(0)),
            OutcomeKind::Exit { code } => set(&mut span, "process.exit.code", i(i64::from(*code))),
            OutcomeKind::Signal { signal } => {
                set(&mut span, "prx.hook.signal", i(i64::from(*signal)))
            }
            OutcomeKind::TimedOut { after_ms } => {
                set(&mut span, "prx.hook.timeout_ms", i(*after_ms as i64))
            }
            OutcomeKind::SpawnFailed { reason } => attrs::event(
                &mut span,
                "spawn_failed",
                start,
                vec![kv("prx.hook.reason", s(reason))],
            ),
            OutcomeKind::Skipped { reason } => attrs::event(
                &mut span,
                "skipped",
                start,
                vec![kv("prx.hook.reason", s(reason))],
            ),
            OutcomeKind::Dropped { reason } => attrs::event(
                &mut span,
                "dropped",
                start,
                vec![kv("prx.hook.reason", s(reason))],
            ),
            _ => {}
        }
        if o.kind.is_failure() {
            set_error(&mut span, outcome_name(&o.kind), &o.kind.to_string());
        }
        if self.limits.content && !o.stderr_tail.is_empty() {
            let tail = &o.stderr_tail[tail_start(&o.stderr_tail, self.limits.max_value_bytes)..];
            set(&mut span, "prx.hook.stderr_tail", s(tail));
        }
        self.out.push(span);
    }
}

struct Ctx<'a> {
    key: u64,
    t: u64,
    kind: EventKind,
    payload: &'a Payload<'a>,
}

fn call_id(p: &Payload) -> Option<String> {
    CALL_ID_FIELDS
        .iter()
        .find_map(|k| p.str_opt(k).map(Cow::into_owned))
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
