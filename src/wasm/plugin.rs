//! One loaded plugin: its pre-linked component, its pool of live instances, and the executor
//! threads that call them.
//!
//! A plugin with `pool_size = N` has N shards. Each shard is a bounded queue (the plugin's queue
//! capacity split evenly), one executor thread ("prx-hooks-wasm") and the one instance that
//! thread owns. Events are routed to a shard by their agent and session, so the events of one
//! emitter always reach the same instance, in emission order, one call at a time; different
//! emitters run in parallel across shards. The pipeline workers only `try_send` into these
//! queues: a plugin that loops forever stalls its own shard, never the bus.
//!
//! Per call the executor refills the instance's fuel to `max_fuel`, sets the deadline (checked
//! at every epoch tick, see [`engine::TICK`](super::engine::TICK)), calls `on-event`, and counts
//! the outcome. A trap, a timeout or running out of fuel throws the instance away (its memory
//! may be inconsistent); the next call instantiates a fresh one from the `InstancePre` (a few
//! microseconds with the pooling allocator). The call itself is a `call_async` future driven by
//! [`drive`](super::drive): a guest waiting inside a host call ends at its deadline too. Faults
//! feed the [`Breaker`], which suspends the plugin (1 s, then 2 s, 4 s, … up to 5 min); events
//! that arrive meanwhile are dropped and counted. A guest `Err(string)` is a failed call but not
//! a fault.
//!
//! A version that is replaced or removed is stopped at once (its `PluginCtx::stop`): the running
//! call is interrupted (counted failed), what is queued is dropped (`dropped_reload`), and its
//! executors exit and free their pool slots.
//!
//! The instance also receives the messages of the subscriptions it made through
//! `events.subscribe` (a second queue per shard), with the full topic as the event name.

use super::calls::CallOutcome;
use super::calls::{CallFeed, PluginCall};
use super::drive::{Driven, drive};
use super::engine::{WasmEngine, one_line};
use super::host::{HostState, InstanceLimits, Interrupted, PluginCtx};
use super::log::Level;
use super::manifest::Manifest;
use crate::bus::Message;
use crate::wasm::PluginCounts;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};
use wasmtime::component::{ComponentExportIndex, InstancePre, TypedFunc};
use wasmtime::{Store, Trap, UpdateDeadline};

/// The export every plugin provides, under the versioned and the bare interface name.
pub const EXPORT_INTERFACES: [&str; 2] =
    ["prx:plugin/hook-exports@0.1.0", "prx:plugin/hook-exports"];
/// The function of [`EXPORT_INTERFACES`] every event is delivered to.
pub const EXPORT_FUNC: &str = "on-event";

/// Faults in a row that suspend a plugin.
const FAULTS_TO_SUSPEND: u32 = 3;
/// Or: this many faults among the last [`WINDOW`] calls.
const WINDOW_FAULTS: u32 = 5;
const WINDOW: u32 = 10;
/// Successes in a row after a suspension that clear the plugin's record (the next suspension
/// is 1 s again).
const PROBATION: u32 = 10;
/// The longest a component's start code may run, whatever its `max_execution_time_ms`: loads
/// (`Hooks::build`, `fire`, `run` start-up, `validate`) wait for it, so an hour-long limit must
/// not let a start-code sleeper stall them (ARCHITECTURE.md § WASM plugins).
pub(super) const MAX_START_MS: u64 = 1000;

/// The time limit of a plugin's start code: its `max_execution_time_ms`, at most
/// [`MAX_START_MS`].
pub(super) fn start_limit_ms(max_execution_time_ms: u64) -> u64 {
    max_execution_time_ms.min(MAX_START_MS)
}

/// The first and the longest suspension.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

type OnEvent = TypedFunc<(&'static str, &'static str), (Result<(), String>,)>;

/// The circuit breaker. It suspends a plugin after [`FAULTS_TO_SUSPEND`] faults in a row, or
/// [`WINDOW_FAULTS`] faults among its last [`WINDOW`] calls (so alternating faults and successes
/// cannot keep it running); the n-th suspension in a row lasts 1 s × 2ⁿ⁻¹, at most 5 min. After
/// a suspension the plugin is on probation: one fault suspends it again (twice as long), and
/// [`PROBATION`] successes in a row clear its record. Only calls that started while it was not
/// suspended count: calls that were already running when it tripped (other pool instances) or
/// that a `fire` forced during a suspension neither trip it again nor reset it. A new version of
/// the plugin (its files changed) lifts a suspension and keeps the record ([`Breaker::lift`]).
#[derive(Debug, Default)]
pub(super) struct Breaker {
    faults_in_row: u32,
    /// The last [`WINDOW`] outcomes, newest in bit 0 (1 = fault), and how many there are.
    window: u32,
    window_len: u32,
    /// Suspensions since the record was last cleared.
    level: u32,
    /// When the current (or last) suspension began and ends.
    since: Option<Instant>,
    until: Option<Instant>,
    /// After a suspension: successes in a row so far.
    probation: Option<u32>,
}

impl Breaker {
    /// Whether calls are suspended at `now`, and until when.
    pub(super) fn suspended(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|&u| now < u)
    }

    /// Ends the current suspension (a new version of the plugin: what was suspended is not
    /// what runs now). The record stays: the new version is on probation, so one fault
    /// suspends it again, for twice as long.
    pub(super) fn lift(&mut self) {
        self.until = None;
    }

    /// Records the outcome of a call that started at `started`; returns the suspension it
    /// starts, if any.
    fn record(&mut self, fault: bool, started: Instant, now: Instant) -> Option<Duration> {
        if self.since.is_some_and(|s| started < s) || self.until.is_some_and(|u| started < u) {
            return None;
        }
        self.window = ((self.window << 1) | u32::from(fault)) & ((1 << WINDOW) - 1);
        self.window_len = (self.window_len + 1).min(WINDOW);
        if !fault {
            self.faults_in_row = 0;
            if let Some(n) = &mut self.probation {
                *n += 1;
                if *n >= PROBATION {
                    *self = Breaker::default();
                }
            }
            return None;
        }
        self.faults_in_row += 1;
        let trip = self.probation.is_some()
            || self.faults_in_row >= FAULTS_TO_SUSPEND
            || self.window.count_ones() >= WINDOW_FAULTS;
        if !trip {
            return None;
        }
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << self.level.min(16))
            .min(MAX_BACKOFF);
        self.level += 1;
        self.since = Some(now);
        self.until = Some(now + backoff);
        self.probation = Some(0);
        self.faults_in_row = 0;
        self.window = 0;
        self.window_len = 0;
        Some(backoff)
    }
}

/// What the executors of one plugin share.
pub(super) struct PluginShared {
    pub name: Arc<str>,
    pub manifest: Manifest,
    pub ctx: Arc<PluginCtx>,
    pre: InstancePre<HostState>,
    on_event: ComponentExportIndex,
    pub counts: Arc<Mutex<PluginCounts>>,
    pub breaker: Arc<Mutex<Breaker>>,
    /// Where finished calls are offered (the sink's, shared by every plugin).
    calls: Arc<CallFeed>,
    /// Keeps the engine (its ticker and timers) alive as long as an instance of this plugin
    /// may run.
    engine: Arc<WasmEngine>,
}

/// A job for an executor.
pub(super) enum Job {
    /// A lifecycle event from the pipeline (counted in the sink's identity), and its hold on
    /// the ticket of an event consumed from NATS: the event is settled once the call ran.
    Event(Message, CallHold),
    /// `prx-hooks fire` / [`WasmSink::fire`](super::WasmSink::fire): run once, even when
    /// suspended, and report.
    Fire(Message, flume::Sender<CallOutcome>),
}

/// A queued plugin call's hold on a consumed event's ticket (`crate::settle`): let go by
/// [`CallHold::ran`] once the call ran (whatever its outcome: returned, trapped, timed out);
/// a job dropped without that (suspended, aborted, still queued when its executor stopped)
/// marks the ticket dropped first, so the event is nak'ed and delivered again.
pub(super) struct CallHold(Option<crate::settle::Hold>);

impl CallHold {
    fn ran(mut self) {
        self.0 = None;
    }
}

impl Drop for CallHold {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.mark_dropped();
        }
    }
}

/// A loaded plugin: shared state plus the queues of its shards. Dropping it closes the queues;
/// the executors finish what is queued (an in-flight call on its old instance) and exit. It is
/// safe to drop anywhere, a pipeline worker included: nothing here joins a thread.
pub(super) struct Plugin {
    pub shared: Arc<PluginShared>,
    shards: Vec<flume::Sender<Job>>,
}

/// What a component exports, for an error saying it lacks an interface: the names, or
/// `nothing`.
pub(super) fn exports_of(
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
) -> String {
    let exports: Vec<String> = component
        .component_type()
        .exports(engine)
        .map(|(n, _)| n.to_string())
        .collect();
    if exports.is_empty() {
        "nothing".to_string()
    } else {
        exports.join(", ")
    }
}

/// Finds `on-event` in a component and checks its type.
pub(super) fn find_export(
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
) -> Result<ComponentExportIndex, String> {
    use wasmtime::component::types::{ComponentItem, Type};
    let Some((iface_name, iface)) = EXPORT_INTERFACES
        .iter()
        .find_map(|n| component.get_export_index(None, n).map(|i| (*n, i)))
    else {
        return Err(format!(
            "the component does not export {} (it exports: {}); build it for the `hook` world of wit/plugin.wit",
            EXPORT_INTERFACES[0],
            exports_of(component, engine)
        ));
    };
    let Some((item, index)) = component.get_export(Some(&iface), EXPORT_FUNC) else {
        return Err(format!("{iface_name} has no function `{EXPORT_FUNC}`"));
    };
    let ComponentItem::ComponentFunc(f) = item else {
        return Err(format!("{iface_name}#{EXPORT_FUNC} is not a function"));
    };
    let params: Vec<Type> = f.params().map(|(_, t)| t).collect();
    let results: Vec<Type> = f.results().collect();
    let ok = params.len() == 2
        && params.iter().all(|t| matches!(t, Type::String))
        && results.len() == 1
        && matches!(&results[0], Type::Result(r)
            if r.ok().is_none() && matches!(r.err(), Some(Type::String)));
    if !ok {
        return Err(format!(
            "{iface_name}#{EXPORT_FUNC} has the wrong type: expected `func(event: string, payload-json: string) -> result<_, string>`, found `func({}) -> {}`",
            params
                .iter()
                .map(describe_type)
                .collect::<Vec<_>>()
                .join(", "),
            results
                .iter()
                .map(describe_type)
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    Ok(index)
}

fn describe_type(t: &wasmtime::component::types::Type) -> String {
    use wasmtime::component::types::Type;
    match t {
        Type::String => "string".into(),
        Type::Bool => "bool".into(),
        Type::U32 => "u32".into(),
        Type::U64 => "u64".into(),
        Type::S32 => "s32".into(),
        Type::S64 => "s64".into(),
        Type::Result(_) => "result<…>".into(),
        Type::Option(_) => "option<…>".into(),
        Type::List(_) => "list<…>".into(),
        other => format!("{other:?}")
            .split(['(', ' '])
            .next()
            .unwrap_or("?")
            .to_lowercase(),
    }
}

impl PluginShared {
    /// `counts` and `breaker` belong to the plugin's name and outlive its versions.
    pub(super) fn new(
        manifest: Manifest,
        ctx: Arc<PluginCtx>,
        pre: InstancePre<HostState>,
        on_event: ComponentExportIndex,
        (counts, breaker): (Arc<Mutex<PluginCounts>>, Arc<Mutex<Breaker>>),
        engine: Arc<WasmEngine>,
        calls: Arc<CallFeed>,
    ) -> PluginShared {
        PluginShared {
            name: ctx.name.clone(),
            manifest,
            ctx,
            pre,
            on_event,
            counts,
            breaker,
            calls,
            engine,
        }
    }

    /// Stops the engine's threads (after shutdown).
    pub(super) fn engine_stop(&self) {
        self.engine.stop();
    }

    /// Logs a host line about this plugin (rate-limited with its own lines).
    fn log(&self, level: Level, text: &str) {
        self.ctx.log.line(level, "host", text.as_bytes());
    }

    pub(super) fn counts(&self) -> std::sync::MutexGuard<'_, PluginCounts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh instance, ready to call. Instantiation runs the component's start code: it gets
    /// the same limits as a call (fuel, memory, shutdown and retirement), and a deadline of
    /// [`start_limit_ms`].
    pub(super) fn instantiate(&self) -> Result<Instance, CallOutcome> {
        // Start code is interrupted by the epoch like a call: the ticker runs meanwhile.
        let _running = self.engine.running();
        let res = &self.manifest.resources;
        let limits = InstanceLimits::new((res.max_memory_mb << 20) as usize);
        let (sub_tx, sub_rx) = flume::bounded(super::host::sub_queue_len(
            res.max_memory_mb,
            self.queue_per_shard(),
        ));
        let state = HostState::new(self.ctx.clone(), limits, sub_tx, sub_rx);
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_callback(|cx| match cx.data().check_deadline() {
            Ok(()) => Ok(UpdateDeadline::Continue(1)),
            Err(why) => Err(why.into()),
        });
        store
            .set_fuel(res.max_fuel)
            .map_err(|e| CallOutcome::Instantiate(one_line(&format!("{e:#}"))))?;
        let deadline =
            Instant::now() + Duration::from_millis(start_limit_ms(res.max_execution_time_ms));
        store.data_mut().deadline = deadline;
        store.set_epoch_deadline(1);
        let timers = self.engine.timers();
        let _rt = timers.enter();
        let ctx = self.ctx.clone();
        let instance = match drive(self.pre.instantiate_async(&mut store), deadline, || {
            ctx.stopping().is_some()
        }) {
            Driven::Done(Ok(i)) => i,
            Driven::Done(Err(e)) if is_pool_exhausted(&e) => {
                return Err(CallOutcome::Busy(one_line(&format!("{e:#}"))));
            }
            Driven::Done(Err(e)) => {
                return Err(match classify(e) {
                    CallOutcome::Trap(m) => CallOutcome::Instantiate(m),
                    other => other,
                });
            }
            Driven::Deadline => return Err(CallOutcome::Timeout),
            Driven::Stopped => return Err(interrupted(&ctx)),
        };
        let func = instance
            .get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut store, self.on_event)
            .map_err(|e| CallOutcome::Instantiate(one_line(&format!("{e:#}"))))?;
        self.counts().instances_created += 1;
        Ok(Instance {
            store,
            func,
            ctx: self.ctx.clone(),
        })
    }

    fn queue_per_shard(&self) -> usize {
        let shards = self.manifest.resources.pool_size.max(1) as usize;
        (super::PLUGIN_QUEUE / shards).max(16)
    }

    /// Runs one call on `slot` (instantiating first if it is empty) and counts it. `force` runs
    /// even while suspended (a manual `fire`).
    pub(super) fn run(
        &self,
        slot: &mut Option<Instance>,
        event: &str,
        msg: &Message,
        force: bool,
    ) -> CallOutcome {
        if self.ctx.stopping().is_some() {
            return CallOutcome::Aborted;
        }
        let now = Instant::now();
        if !force && self.breaker().suspended(now).is_some() {
            return CallOutcome::Suspended;
        }
        // The epoch ticker runs while this call (and its instantiation) does.
        let _running = self.engine.running();
        if slot.is_none() {
            match self.instantiate() {
                Ok(i) => *slot = Some(i),
                Err(outcome) => {
                    self.after(&outcome, now);
                    return outcome;
                }
            }
        }
        let inst = slot.as_mut().expect("instantiated above");
        let outcome = inst.call(
            event,
            msg,
            self.manifest.resources.max_fuel,
            now + Duration::from_millis(self.manifest.resources.max_execution_time_ms),
        );
        if matches!(
            outcome,
            CallOutcome::Trap(_)
                | CallOutcome::Timeout
                | CallOutcome::OutOfFuel
                | CallOutcome::Interrupted { .. }
        ) {
            *slot = None;
            self.counts().instances_replaced += 1;
        }
        self.after(&outcome, now);
        outcome
    }

    /// Counts and logs an outcome; feeds the breaker.
    fn after(&self, outcome: &CallOutcome, started: Instant) {
        let timeout = self.manifest.resources.max_execution_time_ms;
        let quiet = matches!(
            outcome,
            CallOutcome::Ok
                | CallOutcome::Suspended
                | CallOutcome::Aborted
                | CallOutcome::Interrupted { .. }
        );
        {
            let mut c = self.counts();
            match outcome {
                CallOutcome::Ok => c.ok += 1,
                CallOutcome::Error(_) => c.errors += 1,
                CallOutcome::Trap(_) | CallOutcome::Instantiate(_) => c.traps += 1,
                CallOutcome::Timeout => c.timeouts += 1,
                CallOutcome::OutOfFuel => c.out_of_fuel += 1,
                CallOutcome::Busy(_) => c.busy += 1,
                CallOutcome::Suspended | CallOutcome::Aborted | CallOutcome::Interrupted { .. } => {
                }
            }
            if !quiet {
                c.last_error = Some(outcome.describe(timeout));
            }
        }
        match outcome {
            _ if quiet => {}
            CallOutcome::Error(m) => {
                self.log(Level::Warn, &format!("on-event returned an error: {m}"))
            }
            CallOutcome::Busy(m) => self.log(
                Level::Warn,
                &format!("on-event not run: no free instance in the pool ({m})"),
            ),
            other => self.log(
                Level::Warn,
                &format!("on-event {}; instance replaced", other.describe(timeout)),
            ),
        }
        if (quiet && !outcome.is_ok()) || matches!(outcome, CallOutcome::Busy(_)) {
            return;
        }
        let suspended = self
            .breaker()
            .record(outcome.is_fault(), started, Instant::now());
        if let Some(backoff) = suspended {
            self.counts().suspensions += 1;
            self.log(
                Level::Warn,
                &format!(
                    "suspended for {} after repeated faults; it resumes by itself, or at once when its files change",
                    humantime::format_duration(backoff)
                ),
            );
        }
    }
}

/// One live instance and its typed `on-event`.
pub(super) struct Instance {
    store: Store<HostState>,
    func: OnEvent,
    ctx: Arc<PluginCtx>,
}

impl Instance {
    /// Refills fuel, sets the deadline, calls `on-event`, classifies the result.
    pub(super) fn call(
        &mut self,
        event: &str,
        msg: &Message,
        fuel: u64,
        deadline: Instant,
    ) -> CallOutcome {
        if let Err(e) = self.store.set_fuel(fuel) {
            return CallOutcome::Trap(one_line(&format!("{e:#}")));
        }
        let st = self.store.data_mut();
        st.deadline = deadline;
        st.depth = msg.depth();
        self.store.set_epoch_deadline(1);
        let ctx = &self.ctx;
        let call = self
            .func
            .call_async(&mut self.store, (event, msg.json_str()));
        match drive(call, deadline, || ctx.stopping().is_some()) {
            Driven::Done(Ok((Ok(()),))) => CallOutcome::Ok,
            Driven::Done(Ok((Err(m),))) => CallOutcome::Error(one_line(&m)),
            Driven::Done(Err(e)) => classify(e),
            Driven::Deadline => CallOutcome::Timeout,
            Driven::Stopped => interrupted(ctx),
        }
    }
}

fn interrupted(ctx: &PluginCtx) -> CallOutcome {
    CallOutcome::Interrupted {
        shutdown: ctx.stopping() == Some(Interrupted::Shutdown),
    }
}

pub(super) fn is_pool_exhausted(e: &wasmtime::Error) -> bool {
    e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>()
        .is_some()
        || format!("{e:#}").contains("maximum concurrent limit")
}

pub(super) fn classify(e: wasmtime::Error) -> CallOutcome {
    if let Some(why) = e.downcast_ref::<Interrupted>() {
        return match why {
            Interrupted::Timeout => CallOutcome::Timeout,
            Interrupted::Shutdown => CallOutcome::Interrupted { shutdown: true },
            Interrupted::Replaced => CallOutcome::Interrupted { shutdown: false },
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => CallOutcome::OutOfFuel,
        Some(Trap::Interrupt) => CallOutcome::Timeout,
        _ => CallOutcome::Trap(one_line(&format!("{e:#}"))),
    }
}

impl Plugin {
    /// Starts the shards' executor threads; returns their handles (the sink joins them).
    pub(super) fn start(
        shared: Arc<PluginShared>,
    ) -> std::io::Result<(Plugin, Vec<JoinHandle<()>>)> {
        let n = shared.manifest.resources.pool_size.max(1) as usize;
        let cap = shared.queue_per_shard();
        let mut shards = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let (tx, rx) = flume::bounded(cap);
            let s = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("prx-hooks-wasm-{}-{i}", truncate(&shared.name, 12)))
                .spawn(move || executor(&s, &rx))?;
            shards.push(tx);
            threads.push(thread);
        }
        Ok((Plugin { shared, shards }, threads))
    }

    fn shard(&self, msg: &Message) -> &flume::Sender<Job> {
        if self.shards.len() == 1 {
            &self.shards[0]
        } else {
            &self.shards[emitter_hash(msg) % self.shards.len()]
        }
    }

    /// Offers a lifecycle event and counts it (`sent`, then `in_flight` or `dropped`). The
    /// counters' lock is held across the `try_send`, so the executor cannot count the call's
    /// end before its start.
    pub(super) fn offer_counted(&self, msg: &Message) {
        let mut c = self.shared.counts();
        c.sent += 1;
        let job = Job::Event(msg.clone(), CallHold(msg.hold()));
        if self.shard(msg).try_send(job).is_ok() {
            c.in_flight += 1;
        } else {
            c.dropped += 1;
            c.dropped_queue_full += 1;
            // Not run: an event consumed from NATS is then not acked (`crate::settle`).
            msg.mark_dropped();
        }
    }

    /// Queues a manual run of `msg` (even when suspended); the outcome arrives on the returned
    /// channel. `None` when the queue stayed full for `wait`.
    pub(super) fn submit_fire(
        &self,
        msg: Message,
        wait: Duration,
    ) -> Option<flume::Receiver<CallOutcome>> {
        let (tx, rx) = flume::bounded(1);
        self.shard(&msg)
            .send_timeout(Job::Fire(msg, tx), wait)
            .ok()?;
        Some(rx)
    }

    /// Whether every shard can take `more` jobs now: the event's shard is not known before
    /// it arrives, so each must have the room (the NATS consumer's back-pressure).
    pub(super) fn room(&self, more: usize) -> bool {
        self.shards
            .iter()
            .all(|s| s.capacity().is_none_or(|cap| s.len() + more <= cap))
    }

    /// `(free, capacity)` of the shard with the least room (`None`: unbounded shards).
    pub(super) fn headroom(&self) -> Option<(usize, usize)> {
        self.shards
            .iter()
            .filter_map(|s| s.capacity().map(|cap| (cap.saturating_sub(s.len()), cap)))
            .min()
    }

    /// Queued jobs, all shards together.
    pub(super) fn queued(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Routes one emitter (agent + session) to one shard.
fn emitter_hash(msg: &Message) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    msg.agent().hash(&mut h);
    msg.session().hash(&mut h);
    h.finish() as usize
}

/// An executor: takes jobs in order and runs them on its instance. Once its version is
/// stopped it runs nothing more: it drops (and counts) what is still queued until the queue's
/// senders are gone, then exits.
fn executor(shared: &PluginShared, jobs: &flume::Receiver<Job>) {
    // Guest code waits on the engine's timers (WASI clocks are tokio timers).
    let timers = shared.engine.timers();
    let _rt = timers.enter();
    let mut slot: Option<Instance> = None;
    loop {
        if slot.is_some() && shared.ctx.stopping().is_some() {
            // Its subscriptions go with it.
            slot = None;
        }
        let job = match &slot {
            Some(inst) if !inst.store.data().subs.is_empty() => {
                let subs = inst.store.data().sub_rx.clone();
                flume::Selector::new()
                    .recv(jobs, |r| r.ok().map(Ok))
                    .recv(&subs, |r| r.ok().map(Err))
                    .wait()
            }
            _ => jobs.recv().ok().map(Ok),
        };
        match job {
            None => break,
            Some(Ok(Job::Event(msg, hold))) => {
                // A consumed event whose partition lease this host lost (or let go stale) since
                // it was handed over, or whose start the shared de-dup bucket refused, is not
                // called here: its hold marks the ticket dropped as it goes, so the message is
                // nak'ed and delivered again, to the partition's holder. Its start record is
                // written, and waited for, before the call (docs/nats.md § Per-agent order
                // across hosts, § Several central hosts).
                if !msg.admits() {
                    drop(hold);
                    let mut c = shared.counts();
                    c.in_flight -= 1;
                    c.dropped += 1;
                    c.dropped_fenced += 1;
                    continue;
                }
                let kind = msg.event().map_or("", |k| k.name());
                let timed = shared
                    .calls
                    .active()
                    .then(|| (SystemTime::now(), Instant::now()));
                let outcome = guarded(shared, &mut slot, kind, &msg, false);
                if let Some((started_at, started)) = timed {
                    shared.calls.publish(PluginCall {
                        plugin: shared.name.clone(),
                        msg: msg.clone(),
                        outcome: outcome.clone(),
                        started_at,
                        duration: started.elapsed(),
                        timeout_ms: shared.manifest.resources.max_execution_time_ms,
                    });
                }
                // Not run: the hold marks the ticket dropped as it goes.
                if outcome.ran() {
                    hold.ran();
                }
                let mut c = shared.counts();
                c.in_flight -= 1;
                match outcome {
                    CallOutcome::Ok => c.delivered += 1,
                    CallOutcome::Suspended => {
                        c.dropped += 1;
                        c.dropped_suspended += 1;
                    }
                    CallOutcome::Aborted => {
                        c.dropped += 1;
                        if shared.ctx.stopping() == Some(Interrupted::Shutdown) {
                            c.dropped_shutdown += 1;
                        } else {
                            c.dropped_reload += 1;
                        }
                    }
                    _ => c.failed += 1,
                }
            }
            Some(Ok(Job::Fire(msg, reply))) => {
                let name = match msg.event() {
                    Some(k) => k.name(),
                    None => msg.topic(),
                };
                let outcome = guarded(shared, &mut slot, name, &msg, true);
                let _ = reply.send(outcome);
            }
            Some(Err(msg)) => {
                if shared.ctx.stopping().is_none() {
                    shared.counts().topic_messages += 1;
                    let topic = msg.topic().to_string();
                    guarded(shared, &mut slot, &topic, &msg, false);
                }
            }
        }
    }
    // Subscriptions die with the instance; kv is flushed by the sink at shutdown.
    drop(slot);
}

/// [`PluginShared::run`], with a panic on the host side (a bug, not the guest's doing: guest
/// faults are traps) contained: it is counted and logged as a trap, the instance is thrown away,
/// and the executor goes on — a dead executor would silently turn every later event into a
/// queue-full drop.
fn guarded(
    shared: &PluginShared,
    slot: &mut Option<Instance>,
    event: &str,
    msg: &Message,
    force: bool,
) -> CallOutcome {
    let run = std::panic::AssertUnwindSafe(|| shared.run(slot, event, msg, force));
    match std::panic::catch_unwind(run) {
        Ok(outcome) => outcome,
        Err(panic) => {
            *slot = None;
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let outcome = CallOutcome::Trap(format!("host panic: {}", one_line(&what)));
            shared.after(&outcome, Instant::now());
            outcome
        }
    }
}

#[cfg(test)]
mod breaker_tests {
    use super::*;

    #[test]
    fn alternating_faults_and_successes_trip_it() {
        let mut b = Breaker::default();
        let t = Instant::now();
        let mut tripped = None;
        for n in 0..WINDOW {
            let at = t + Duration::from_millis(u64::from(n));
            if let Some(d) = b.record(n % 2 == 0, at, at) {
                tripped = Some((n, d));
                break;
            }
        }
        assert_eq!(tripped, Some((8, FIRST_BACKOFF)));
    }

    #[test]
    fn faults_of_calls_that_started_before_the_trip_do_not_escalate() {
        let mut b = Breaker::default();
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        assert_eq!(b.record(true, ms(0), ms(10)), None);
        assert_eq!(b.record(true, ms(0), ms(11)), None);
        assert_eq!(b.record(true, ms(0), ms(12)), Some(FIRST_BACKOFF));
        // Three more instances were running since t: their faults land during the suspension.
        for n in 13..16 {
            assert_eq!(b.record(true, ms(0), ms(n)), None);
        }
        // A call forced during the suspension succeeds: it does not clear the record.
        assert_eq!(b.record(false, ms(500), ms(501)), None);
        assert!(b.suspended(ms(600)).is_some());
        // After it: on probation, one fault suspends again, twice as long.
        assert_eq!(b.record(true, ms(1100), ms(1101)), Some(2 * FIRST_BACKOFF));
        // Ten successes in a row after that clear the record.
        for n in 0..PROBATION {
            let at = ms(3200 + u64::from(n));
            assert_eq!(b.record(false, at, at), None);
        }
        let at = ms(4000);
        assert_eq!(b.record(true, at, at), None);
        assert_eq!(b.record(true, at, at), None);
        assert_eq!(b.record(true, at, at), Some(FIRST_BACKOFF));
    }
}

#[cfg(test)]
mod call_hold_tests {
    use super::*;
    use crate::settle::{Attached, Settled, Ticket};

    #[test]
    fn a_queued_call_settles_its_event_when_it_ran_and_marks_it_dropped_when_not() {
        let s = Settled::new(Box::new(|| {}));
        let a = Attached::new(None, None, Some(Ticket::new(1, s.clone())));
        let b = Attached::new(None, None, Some(Ticket::new(2, s.clone())));
        let (ran, unrun) = (CallHold(a.hold()), CallHold(b.hold()));
        // The worker lets the messages' holds go after the fan-out: the queued calls keep them.
        a.release();
        b.release();
        assert!(s.take().is_empty(), "still queued: nothing settled");
        ran.ran();
        drop(unrun);
        assert_eq!(s.take(), vec![(1, true), (2, false)]);
        assert!(CallOutcome::Trap("x".into()).ran() && CallOutcome::Timeout.ran());
        assert!(CallOutcome::Interrupted { shutdown: true }.ran());
        for not in [
            CallOutcome::Suspended,
            CallOutcome::Aborted,
            CallOutcome::Busy("full".into()),
            CallOutcome::Instantiate("no".into()),
        ] {
            assert!(!not.ran());
        }
    }
}
