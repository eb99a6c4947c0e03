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
//! microseconds with the pooling allocator). Three such faults in a row suspend the plugin for
//! 1 s, then 2 s, 4 s, … up to 5 min ([`Breaker`]); events that arrive meanwhile are dropped and
//! counted. A guest `Err(string)` is a failed call but not a fault.
//!
//! The instance also receives the messages of the subscriptions it made through
//! `events.subscribe` (a second queue per shard), with the full topic as the event name.

use super::engine::{WasmEngine, one_line};
use super::host::{HostState, Interrupted, PluginCtx};
use super::manifest::Manifest;
use crate::bus::Message;
use crate::wasm::PluginCounts;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wasmtime::component::{ComponentExportIndex, InstancePre, TypedFunc};
use wasmtime::{Store, StoreLimitsBuilder, Trap, UpdateDeadline};

/// The export every plugin provides, under the versioned and the bare interface name.
pub const EXPORT_INTERFACES: [&str; 2] =
    ["prx:plugin/hook-exports@0.1.0", "prx:plugin/hook-exports"];
pub const EXPORT_FUNC: &str = "on-event";

/// Faults in a row that suspend a plugin, and the first and longest suspension.
const FAULTS_TO_SUSPEND: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

type OnEvent = TypedFunc<(&'static str, &'static str), (Result<(), String>,)>;

/// What one call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    Ok,
    /// The guest returned `Err(message)`.
    Error(String),
    /// The guest trapped (or a host call failed); the instance was replaced.
    Trap(String),
    /// It ran past `max_execution_time_ms`; the instance was replaced.
    Timeout,
    /// It used all of `max_fuel`; the instance was replaced.
    OutOfFuel,
    /// A fresh instance could not be created.
    Instantiate(String),
    /// The plugin is suspended after repeated faults; the event was dropped.
    Suspended,
    /// Stopped by shutdown before or while running.
    Aborted,
}

impl CallOutcome {
    /// A trap, timeout, out-of-fuel or failed instantiation: what trips the breaker.
    fn is_fault(&self) -> bool {
        matches!(
            self,
            CallOutcome::Trap(_)
                | CallOutcome::Timeout
                | CallOutcome::OutOfFuel
                | CallOutcome::Instantiate(_)
        )
    }

    /// `ok`, `error: …`, `timed out`, `trap: …`: the `prx-hooks fire` wording.
    pub fn describe(&self, timeout_ms: u64) -> String {
        match self {
            CallOutcome::Ok => "ok".into(),
            CallOutcome::Error(m) => format!("error: {m}"),
            CallOutcome::Trap(m) => format!("trap: {m}"),
            CallOutcome::Timeout => format!("timed out after {timeout_ms} ms"),
            CallOutcome::OutOfFuel => "trap: out of fuel (max_fuel in plugin.toml)".into(),
            CallOutcome::Instantiate(m) => format!("trap: cannot instantiate: {m}"),
            CallOutcome::Suspended => "suspended after repeated faults".into(),
            CallOutcome::Aborted => "aborted by shutdown".into(),
        }
    }

    pub fn is_ok(&self) -> bool {
        *self == CallOutcome::Ok
    }
}

/// The circuit breaker: counts faults in a row and suspends with exponential backoff.
#[derive(Debug, Default)]
pub struct Breaker {
    faults_in_row: u32,
    suspensions: u32,
    until: Option<Instant>,
}

impl Breaker {
    /// Whether calls are suspended at `now`. After the suspension ends the next call runs; a
    /// fault then suspends again, twice as long.
    pub fn suspended(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|&u| now < u)
    }

    fn record(&mut self, fault: bool, now: Instant) -> Option<Duration> {
        if !fault {
            self.faults_in_row = 0;
            self.suspensions = 0;
            self.until = None;
            return None;
        }
        self.faults_in_row += 1;
        let resumed = self.until.take().is_some();
        if self.faults_in_row < FAULTS_TO_SUSPEND && !resumed {
            return None;
        }
        let backoff = FIRST_BACKOFF
            .saturating_mul(1 << self.suspensions.min(16))
            .min(MAX_BACKOFF);
        self.suspensions += 1;
        self.until = Some(now + backoff);
        Some(backoff)
    }
}

/// What the executors of one plugin share.
pub struct PluginShared {
    pub name: Arc<str>,
    pub manifest: Manifest,
    pub ctx: Arc<PluginCtx>,
    pre: InstancePre<HostState>,
    on_event: ComponentExportIndex,
    pub counts: Arc<Mutex<PluginCounts>>,
    pub breaker: Mutex<Breaker>,
    /// Keeps the engine (and its ticker) alive as long as an instance of this plugin may run.
    _engine: Arc<WasmEngine>,
}

/// A job for an executor.
pub enum Job {
    /// A lifecycle event from the pipeline (counted in the sink's identity).
    Event(Message),
    /// `prx-hooks fire` / [`WasmSink::fire`](super::WasmSink::fire): run once, even when
    /// suspended, and report.
    Fire(Message, flume::Sender<CallOutcome>),
}

/// A loaded plugin: shared state plus the queues of its shards. Dropping it closes the queues;
/// the executors finish what is queued (an in-flight call on its old instance) and exit. It is
/// safe to drop anywhere, a pipeline worker included: nothing here joins a thread.
pub struct Plugin {
    pub shared: Arc<PluginShared>,
    shards: Vec<flume::Sender<Job>>,
}

/// Finds `on-event` in a component and checks its type.
pub fn find_export(
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
) -> Result<ComponentExportIndex, String> {
    use wasmtime::component::types::{ComponentItem, Type};
    let Some((iface_name, iface)) = EXPORT_INTERFACES
        .iter()
        .find_map(|n| component.get_export_index(None, n).map(|i| (*n, i)))
    else {
        let exports: Vec<String> = component
            .component_type()
            .exports(engine)
            .map(|(n, _)| n.to_string())
            .collect();
        return Err(format!(
            "the component does not export {} (it exports: {}); build it for the `hook` world of wit/plugin.wit",
            EXPORT_INTERFACES[0],
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            }
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
    pub fn new(
        manifest: Manifest,
        ctx: Arc<PluginCtx>,
        pre: InstancePre<HostState>,
        on_event: ComponentExportIndex,
        counts: Arc<Mutex<PluginCounts>>,
        engine: Arc<WasmEngine>,
    ) -> PluginShared {
        PluginShared {
            name: ctx.name.clone(),
            manifest,
            ctx,
            pre,
            on_event,
            counts,
            breaker: Mutex::default(),
            _engine: engine,
        }
    }

    pub fn counts(&self) -> std::sync::MutexGuard<'_, PluginCounts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh instance, ready to call.
    pub fn instantiate(&self) -> Result<Instance, String> {
        let res = &self.manifest.resources;
        let limits = StoreLimitsBuilder::new()
            .memory_size((res.max_memory_mb << 20) as usize)
            .instances(64)
            .tables(64)
            .memories(8)
            .build();
        let (sub_tx, sub_rx) = flume::bounded(self.queue_per_shard());
        let state = HostState::new(self.ctx.clone(), limits, sub_tx, sub_rx);
        let mut store = Store::new(self.pre.engine(), state);
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_callback(|cx| match cx.data().check_deadline() {
            Ok(()) => Ok(UpdateDeadline::Continue(1)),
            Err(why) => Err(why.into()),
        });
        // Instantiation runs the component's start code: it gets the same budget as a call.
        store
            .set_fuel(res.max_fuel)
            .map_err(|e| one_line(&format!("{e:#}")))?;
        store.data_mut().deadline =
            Instant::now() + Duration::from_millis(res.max_execution_time_ms);
        store.set_epoch_deadline(1);
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| one_line(&format!("{e:#}")))?;
        let func = instance
            .get_typed_func::<(&str, &str), (Result<(), String>,)>(&mut store, self.on_event)
            .map_err(|e| one_line(&format!("{e:#}")))?;
        self.counts().instances_created += 1;
        Ok(Instance { store, func })
    }

    fn queue_per_shard(&self) -> usize {
        let shards = self.manifest.resources.pool_size.max(1) as usize;
        (super::PLUGIN_QUEUE / shards).max(16)
    }

    /// Runs one call on `slot` (instantiating first if it is empty) and counts it. `force` runs
    /// even while suspended (a manual `fire`).
    pub fn run(
        &self,
        slot: &mut Option<Instance>,
        event: &str,
        msg: &Message,
        force: bool,
    ) -> CallOutcome {
        if self.ctx.abort.load(std::sync::atomic::Ordering::Relaxed) {
            return CallOutcome::Aborted;
        }
        let now = Instant::now();
        if !force && self.breaker().suspended(now).is_some() {
            return CallOutcome::Suspended;
        }
        if slot.is_none() {
            match self.instantiate() {
                Ok(i) => *slot = Some(i),
                Err(e) => {
                    let outcome = CallOutcome::Instantiate(e);
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
                | CallOutcome::Aborted
        ) {
            *slot = None;
            self.counts().instances_replaced += 1;
        }
        self.after(&outcome, now);
        outcome
    }

    /// Counts and logs an outcome; feeds the breaker.
    fn after(&self, outcome: &CallOutcome, started: Instant) {
        let name = &*self.name;
        let timeout = self.manifest.resources.max_execution_time_ms;
        {
            let mut c = self.counts();
            match outcome {
                CallOutcome::Ok => c.ok += 1,
                CallOutcome::Error(_) => c.errors += 1,
                CallOutcome::Trap(_) | CallOutcome::Instantiate(_) => c.traps += 1,
                CallOutcome::Timeout => c.timeouts += 1,
                CallOutcome::OutOfFuel => c.out_of_fuel += 1,
                CallOutcome::Suspended | CallOutcome::Aborted => {}
            }
            if !matches!(
                outcome,
                CallOutcome::Ok | CallOutcome::Suspended | CallOutcome::Aborted
            ) {
                c.last_error = Some(outcome.describe(timeout));
            }
        }
        match outcome {
            CallOutcome::Ok | CallOutcome::Suspended | CallOutcome::Aborted => {}
            CallOutcome::Error(m) => {
                tracing::warn!(plugin = name, "on-event returned an error: {m}")
            }
            other => tracing::warn!(
                plugin = name,
                "on-event {}; instance replaced",
                other.describe(timeout)
            ),
        }
        if matches!(outcome, CallOutcome::Suspended | CallOutcome::Aborted) {
            return;
        }
        let suspended = self.breaker().record(outcome.is_fault(), started);
        if let Some(backoff) = suspended {
            self.counts().suspensions += 1;
            tracing::warn!(
                plugin = name,
                "suspended for {} after repeated faults; it resumes by itself, or at once when its files change",
                humantime::format_duration(backoff)
            );
        }
    }
}

/// One live instance and its typed `on-event`.
pub struct Instance {
    store: Store<HostState>,
    func: OnEvent,
}

impl Instance {
    /// Refills fuel, sets the deadline, calls `on-event`, classifies the result.
    pub fn call(
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
        match self.func.call(&mut self.store, (event, msg.json_str())) {
            Ok((Ok(()),)) => CallOutcome::Ok,
            Ok((Err(m),)) => CallOutcome::Error(one_line(&m)),
            Err(e) => classify(e),
        }
    }
}

fn classify(e: wasmtime::Error) -> CallOutcome {
    if let Some(why) = e.downcast_ref::<Interrupted>() {
        return match why {
            Interrupted::Timeout => CallOutcome::Timeout,
            Interrupted::Shutdown => CallOutcome::Aborted,
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
    pub fn start(shared: Arc<PluginShared>) -> std::io::Result<(Plugin, Vec<JoinHandle<()>>)> {
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
    pub fn offer_counted(&self, msg: &Message) {
        let mut c = self.shared.counts();
        c.sent += 1;
        if self.shard(msg).try_send(Job::Event(msg.clone())).is_ok() {
            c.in_flight += 1;
        } else {
            c.dropped += 1;
            c.dropped_queue_full += 1;
        }
    }

    /// Queues a manual run of `msg` (even when suspended); the outcome arrives on the returned
    /// channel. `None` when the queue stayed full for `wait`.
    pub fn submit_fire(
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

    /// Queued jobs, all shards together.
    pub fn queued(&self) -> usize {
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

/// An executor: takes jobs in order and runs them on its instance.
fn executor(shared: &PluginShared, jobs: &flume::Receiver<Job>) {
    let mut slot: Option<Instance> = None;
    loop {
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
            Some(Ok(Job::Event(msg))) => {
                let kind = msg.event().map_or("", |k| k.name());
                let outcome = guarded(shared, &mut slot, kind, &msg, false);
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
                        c.dropped_shutdown += 1;
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
                shared.counts().topic_messages += 1;
                let topic = msg.topic().to_string();
                guarded(shared, &mut slot, &topic, &msg, false);
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
