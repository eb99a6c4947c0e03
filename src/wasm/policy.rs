//! WASM policies: a plugin whose plugin.toml has `[policy]` exports `prx-hooks:policy/decider`
//! (wit/policy/policy.wit), and the decision lane asks it on the deciding thread.
//!
//! Each policy keeps its own pool of instances (at most `[resources] pool_size` alive): a
//! decision takes a free one (instantiating one while the pool is not full, or waiting for one
//! until its deadline), refills its fuel, sets the deadline (`[policy] timeout_ms`, at most
//! `max_execution_time_ms`), calls `decide` with `call_async` driven by
//! [`drive`](super::drive) — the epoch stops running guest code, the driver a guest waiting in a
//! host call — and gives the instance back, unless it trapped, timed out or ran out of fuel:
//! then it is thrown away. Nothing here waits on the ring, a worker, a hook or a plugin's event
//! queue (docs/policies.md § WASM policies).

use super::drive::{Driven, drive};
use super::engine::{WasmEngine, one_line};
use super::host::{HostState, InstanceLimits, PluginCtx};
use super::manifest::{Manifest, PolicySpec, Resources};
use super::plugin::{classify, exports_of, is_pool_exhausted, start_limit_ms};
use crate::policy::{
    Decision, DecisionPoint, GuestAnswer, GuestFailure, OnError, PluginPolicy, PluginPolicyCounters,
};
use crate::wasm::CallOutcome;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wasmtime::component::{ComponentExportIndex, ComponentType, InstancePre, Lift, TypedFunc};
use wasmtime::{Store, UpdateDeadline};

/// The export a policy provides, under the versioned and the bare interface name.
pub const POLICY_INTERFACES: [&str; 2] =
    ["prx-hooks:policy/decider@0.1.0", "prx-hooks:policy/decider"];
/// The function of [`POLICY_INTERFACES`] every question goes to.
pub const POLICY_FUNC: &str = "decide";

/// `decider.decision`. Only ever lifted from a guest's answer, never built here.
#[allow(dead_code)]
#[derive(ComponentType, Lift, Clone, Copy, Debug)]
#[component(enum)]
#[repr(u8)]
enum WitDecision {
    #[component(name = "none")]
    None,
    #[component(name = "allow")]
    Allow,
    #[component(name = "ask")]
    Ask,
    #[component(name = "deny")]
    Deny,
}

/// `decider.answer`.
#[derive(ComponentType, Lift, Clone, Debug)]
#[component(record)]
struct WitAnswer {
    decision: WitDecision,
    reason: Option<String>,
    context: Option<String>,
}

type Decide = TypedFunc<(&'static str, &'static str, &'static str), (Result<WitAnswer, String>,)>;

/// The longest reason or context kept from a guest's answer (the rest is cut).
const MAX_TEXT: usize = 4096;

/// Finds `decide` in a component that declares `[policy]`.
pub(super) fn find_policy_export(
    component: &wasmtime::component::Component,
    engine: &wasmtime::Engine,
) -> Result<ComponentExportIndex, String> {
    let Some((name, iface)) = POLICY_INTERFACES
        .iter()
        .find_map(|n| component.get_export_index(None, n).map(|i| (*n, i)))
    else {
        return Err(format!(
            "[policy] is declared, but the component does not export {} (it exports: {}); build it for the `policy` world of wit/policy/policy.wit",
            POLICY_INTERFACES[0],
            exports_of(component, engine)
        ));
    };
    match component.get_export(Some(&iface), POLICY_FUNC) {
        Some((wasmtime::component::types::ComponentItem::ComponentFunc(_), index)) => Ok(index),
        _ => Err(format!("{name} has no function `{POLICY_FUNC}`")),
    }
}

/// One instance of a policy and its typed `decide`.
struct Slot {
    store: Store<HostState>,
    func: Decide,
}

/// The free instances and how many are alive.
#[derive(Default)]
struct Pool {
    free: Vec<Slot>,
    alive: u32,
}

/// A loaded WASM policy (one version of its plugin).
pub(crate) struct WasmPolicy {
    spec: PolicySpec,
    /// Its plugin's name.
    plugin: String,
    resources: Resources,
    ctx: Arc<PluginCtx>,
    pre: InstancePre<HostState>,
    decide: ComponentExportIndex,
    engine: Arc<WasmEngine>,
    pool: Mutex<Pool>,
    freed: Condvar,
    counters: Arc<PluginPolicyCounters>,
}

impl WasmPolicy {
    /// A policy of `m` (which has `[policy]`), not yet probed.
    pub(super) fn new(
        m: &Manifest,
        ctx: Arc<PluginCtx>,
        pre: InstancePre<HostState>,
        decide: ComponentExportIndex,
        engine: Arc<WasmEngine>,
        counters: Arc<PluginPolicyCounters>,
    ) -> Option<WasmPolicy> {
        Some(WasmPolicy {
            spec: m.policy.clone()?,
            plugin: m.name.clone(),
            resources: m.resources,
            ctx,
            pre,
            decide,
            engine,
            pool: Mutex::default(),
            freed: Condvar::new(),
            counters,
        })
    }

    /// The load-time probe: one instance under the plugin's limits (its start code bounded
    /// like a hook's), `decide` type-checked; kept as the pool's first instance.
    pub(super) fn probe(&self) -> Result<(), String> {
        let limit = start_limit_ms(self.resources.max_execution_time_ms);
        let _running = self.engine.running();
        let timers = self.engine.timers();
        let _rt = timers.enter();
        let slot = self
            .instantiate(Instant::now() + Duration::from_millis(limit))
            .map_err(|f| match f {
                GuestFailure::TimedOut => format!("start code timed out after {limit} ms"),
                GuestFailure::Trapped(m) => m,
                other => other.to_string(),
            })?;
        let mut pool = self.lock();
        pool.alive += 1;
        pool.free.push(slot);
        Ok(())
    }

    /// The engine it runs on (stopped at shutdown).
    pub(super) fn engine(&self) -> &Arc<WasmEngine> {
        &self.engine
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The deadline of one decision: `timeout_ms`, at most `max_execution_time_ms`.
    fn limit(&self) -> Duration {
        Duration::from_millis(
            self.spec
                .timeout_ms
                .min(self.resources.max_execution_time_ms),
        )
    }

    fn instantiate(&self, deadline: Instant) -> Result<Slot, GuestFailure> {
        let limits = InstanceLimits::new((self.resources.max_memory_mb << 20) as usize);
        let (tx, rx) = flume::bounded(1);
        let mut store = Store::new(
            self.pre.engine(),
            HostState::new(self.ctx.clone(), limits, tx, rx),
        );
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_callback(|cx| match cx.data().check_deadline() {
            Ok(()) => Ok(UpdateDeadline::Continue(1)),
            Err(why) => Err(why.into()),
        });
        let trapped = |e: wasmtime::Error| GuestFailure::Trapped(one_line(&format!("{e:#}")));
        store.set_fuel(self.resources.max_fuel).map_err(trapped)?;
        store.data_mut().deadline = deadline;
        store.set_epoch_deadline(1);
        let ctx = self.ctx.clone();
        let instance = match drive(self.pre.instantiate_async(&mut store), deadline, || {
            ctx.stopping().is_some()
        }) {
            Driven::Done(Ok(i)) => i,
            Driven::Done(Err(e)) if is_pool_exhausted(&e) => {
                return Err(GuestFailure::Busy(one_line(&format!("{e:#}"))));
            }
            Driven::Done(Err(e)) => return Err(failure(classify(e))),
            Driven::Deadline => return Err(GuestFailure::TimedOut),
            Driven::Stopped => return Err(GuestFailure::Trapped("interrupted".into())),
        };
        let func = instance
            .get_typed_func::<(&str, &str, &str), (Result<WitAnswer, String>,)>(
                &mut store,
                self.decide,
            )
            .map_err(|e| {
                GuestFailure::Trapped(format!(
                    "{}#{POLICY_FUNC} has the wrong type (expected `func(point: string, agent: string, payload-json: string) -> result<answer, string>` of wit/policy/policy.wit): {}",
                    POLICY_INTERFACES[0],
                    one_line(&format!("{e:#}"))
                ))
            })?;
        Ok(Slot { store, func })
    }

    /// A free instance: one of the pool's, a new one while fewer than `pool_size` are alive,
    /// or the first one given back before `deadline`.
    fn take(&self, deadline: Instant) -> Result<Slot, GuestFailure> {
        let size = self.resources.pool_size.max(1);
        let mut pool = self.lock();
        loop {
            if let Some(s) = pool.free.pop() {
                return Ok(s);
            }
            if pool.alive < size {
                pool.alive += 1;
                drop(pool);
                return self.instantiate(deadline).inspect_err(|_| self.discard());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(GuestFailure::Busy(format!(
                    "all {size} instance(s) of its pool stayed busy (pool_size in plugin.toml)"
                )));
            }
            pool = self
                .freed
                .wait_timeout(pool, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// An instance thrown away: its place in the pool is free.
    fn discard(&self) {
        self.lock().alive -= 1;
        self.freed.notify_one();
    }

    fn give_back(&self, slot: Slot) {
        self.lock().free.push(slot);
        self.freed.notify_one();
    }
}

/// A failed call's outcome as the decision lane counts it.
fn failure(o: CallOutcome) -> GuestFailure {
    match o {
        CallOutcome::Timeout => GuestFailure::TimedOut,
        CallOutcome::OutOfFuel => GuestFailure::OutOfFuel,
        CallOutcome::Trap(m) | CallOutcome::Instantiate(m) | CallOutcome::Error(m) => {
            GuestFailure::Trapped(m)
        }
        CallOutcome::Busy(m) => GuestFailure::Busy(m),
        other => GuestFailure::Trapped(other.describe(0)),
    }
}

fn cut(s: Option<String>) -> Option<String> {
    s.map(|mut s| {
        if s.len() > MAX_TEXT {
            let mut at = MAX_TEXT;
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            s.truncate(at);
        }
        s
    })
}

impl PluginPolicy for WasmPolicy {
    fn id(&self) -> &str {
        &self.spec.id
    }

    fn plugin(&self) -> &str {
        &self.plugin
    }

    fn answers(&self, point: DecisionPoint) -> bool {
        self.spec.on.contains(&point)
    }

    fn on_error(&self) -> OnError {
        self.spec.on_error
    }

    fn counters(&self) -> &PluginPolicyCounters {
        &self.counters
    }

    fn ask(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload_json: &str,
        until: Option<Instant>,
    ) -> GuestAnswer {
        let now = Instant::now();
        let own = now + self.limit();
        let (deadline, asker) = match until {
            Some(u) if u < own => (u, true),
            _ => (own, false),
        };
        match self.call(point, agent, payload_json, now, deadline) {
            GuestAnswer::Failed(GuestFailure::TimedOut) if asker => {
                GuestAnswer::Failed(GuestFailure::CutByAsker)
            }
            a => a,
        }
    }
}

impl WasmPolicy {
    /// One call, started at `now`, cut at `deadline`.
    fn call(
        &self,
        point: DecisionPoint,
        agent: &str,
        payload_json: &str,
        now: Instant,
        deadline: Instant,
    ) -> GuestAnswer {
        if deadline <= now {
            // No time left: no instance is taken (a call cut at once would cost it).
            return GuestAnswer::Failed(GuestFailure::TimedOut);
        }
        // The epoch ticker runs while this call (and an instantiation) does.
        let _running = self.engine.running();
        let timers = self.engine.timers();
        let _rt = timers.enter();
        let mut slot = match self.take(deadline) {
            Ok(s) => s,
            Err(f) => return GuestAnswer::Failed(f),
        };
        if let Err(e) = slot.store.set_fuel(self.resources.max_fuel) {
            self.discard();
            return GuestAnswer::Failed(GuestFailure::Trapped(one_line(&format!("{e:#}"))));
        }
        slot.store.data_mut().deadline = deadline;
        slot.store.set_epoch_deadline(1);
        let ctx = &self.ctx;
        let call = slot
            .func
            .call_async(&mut slot.store, (point.as_str(), agent, payload_json));
        let answer = match drive(call, deadline, || ctx.stopping().is_some()) {
            Driven::Done(Ok((Ok(a),))) => Ok(GuestAnswer::Decided(
                match a.decision {
                    WitDecision::None => None,
                    WitDecision::Allow => Some(Decision::Allow),
                    WitDecision::Ask => Some(Decision::Ask),
                    WitDecision::Deny => Some(Decision::Deny),
                },
                cut(a.reason),
                cut(a.context),
            )),
            Driven::Done(Ok((Err(m),))) => Ok(GuestAnswer::Failed(GuestFailure::Error(one_line(
                &cut(Some(m)).unwrap_or_default(),
            )))),
            Driven::Done(Err(e)) => Err(failure(classify(e))),
            Driven::Deadline => Err(GuestFailure::TimedOut),
            Driven::Stopped => Err(GuestFailure::Trapped("interrupted by shutdown".into())),
        };
        match answer {
            Ok(a) => {
                self.give_back(slot);
                a
            }
            Err(f) => {
                // Its memory may be inconsistent: the next call gets a fresh instance.
                drop(slot);
                self.discard();
                GuestAnswer::Failed(f)
            }
        }
    }
}
