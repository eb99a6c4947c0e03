//! What a plugin's instance can call: `prx:host/{log,config,kv,events}` and a locked-down WASI.
//!
//! Every host interface is registered twice, as `prx:host/log@0.1.0` and as `prx:host/log`, so a
//! guest built from a versioned or an unversioned copy of the WIT links. WASI p2 is linked with
//! nothing to reach: no preopened directories, no environment, no arguments, no network (socket
//! address checks deny everything, name lookup is off), stdin empty; stdout and stderr go to the
//! plugin's bounded log ([`super::log`]) line by line. Clocks and random are available (random
//! at most [`MAX_RANDOM`] bytes a call). WASI is linked with its async bindings: a guest waiting
//! in `wasi:io/poll` suspends its call's future, which the executor drops at the deadline.
//!
//! Memory ([`InstanceLimits`]): `max_memory_mb` caps the instance as a whole — every linear
//! memory of the component together — and what the host copies out for it (a `kv.get` value or
//! a `kv.list-keys` result larger than what is left of the cap is refused with a trap rather
//! than allocated). What the host copies in is bounded too: `log` and `events.publish` read the
//! guest's strings in place (a log line is cut to [`MAX_LINE`], a payload over the bus's limit is
//! refused before any copy), `wasi:random` gives at most [`MAX_RANDOM`] bytes a call, an
//! instance's subscription queue holds at most [`sub_queue_len`] messages, and it may hold at
//! most [`MAX_HANDLES`] WASI resources at once (streams, pollables: each a host allocation; all
//! handles on stdout share one partial line).
//!
//! Each instance's [`HostState`] knows its plugin ([`PluginCtx`]: name, config, kv store, whether
//! it holds the `events` permission, the bus) and the message it is handling, whose depth is what
//! makes `events.publish` from inside a call nest one level deeper — the bus refuses publications
//! nested more than [`MAX_DEPTH`](crate::bus::MAX_DEPTH), so a plugin that republishes what it
//! receives stops there. Subscriptions an instance makes are its own: they feed its queue, die
//! with it, and only it can cancel them.

use super::kv::{KvError, KvFlusher, KvStore, Wait};
use super::log::PluginLog;
use crate::bus::{Bus, BusError, Message, Subscription};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use wasmtime::component::{ComponentType, Lift, Linker, ResourceTable, WasmStr};
use wasmtime::{ResourceLimiter, StoreContextMut};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// Versions under which the host interfaces are registered (besides the bare names).
const HOST_VERSION: &str = "0.1.0";
/// Subscriptions one instance may hold.
pub(super) const MAX_SUBSCRIPTIONS: usize = 64;
/// Longest line of guest stdout/stderr passed to the log (longer ones are split).
const MAX_LINE: usize = super::log::MAX_LINE;
/// Largest `wasi:random` request (wasmtime-wasi's default is 64 MiB, allocated on the host).
pub(super) const MAX_RANDOM: u64 = 1 << 20;
/// How many subscription messages an instance's queue holds: one per MiB of `max_memory_mb`
/// (at least 16, at most the plugin's per-shard queue), so what is queued (each message at most
/// the bus's payload limit, 1 MiB for plugins) stays within the instance's memory cap for any
/// plugin of 16 MiB or more.
pub(super) fn sub_queue_len(max_memory_mb: u64, per_shard: usize) -> usize {
    (max_memory_mb.clamp(16, 1 << 20) as usize).min(per_shard.max(1))
}

/// WASI resources (streams, pollables, …) one instance may hold at once. Each is a host
/// allocation in the store's resource table (wasmtime's default allows a million, over 100 MiB
/// of host memory behind any `max_memory_mb`); a guest that opens more traps.
pub(super) const MAX_HANDLES: usize = 4096;

/// Core instances, tables and memories one instance may create (the pool's per-component
/// limits are the hard ones; these are the store's).
const MAX_INSTANCES: usize = 64;
const MAX_TABLES: usize = 64;
const MAX_MEMORIES: usize = 8;
/// Elements of all tables of an instance together.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Everything about a plugin that its host functions need, shared by its instances.
pub(super) struct PluginCtx {
    pub name: Arc<str>,
    pub config: BTreeMap<String, String>,
    pub kv: Arc<KvStore>,
    pub flusher: Arc<KvFlusher>,
    /// `"events"` is in the manifest's permissions.
    pub events_allowed: bool,
    pub bus: Bus,
    /// Set at the shutdown deadline: the running call is interrupted at the next tick.
    pub abort: Arc<AtomicBool>,
    /// Set when this version of the plugin is replaced or removed: its running call is
    /// interrupted and its queue dropped.
    pub stop: AtomicBool,
    /// Where its log lines go (shared by the plugin's versions).
    pub log: Arc<PluginLog>,
}

impl PluginCtx {
    /// Whether calls must stop now (shutdown, or this version retired).
    pub(super) fn stopping(&self) -> Option<Interrupted> {
        if self.abort.load(Ordering::Relaxed) {
            Some(Interrupted::Shutdown)
        } else if self.stop.load(Ordering::Relaxed) {
            Some(Interrupted::Replaced)
        } else {
            None
        }
    }
}

/// Why the host interrupted a call (the error the epoch callback raises).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Interrupted {
    #[error("timed out")]
    Timeout,
    #[error("interrupted by shutdown")]
    Shutdown,
    #[error("interrupted: the plugin was replaced or removed")]
    Replaced,
}

/// The store's resource limiter: one memory cap for the whole instance.
#[derive(Debug)]
pub(super) struct InstanceLimits {
    /// `max_memory_mb`, in bytes.
    pub cap: usize,
    /// Bytes of all linear memories together.
    pub memory: usize,
    /// Elements of all tables together.
    pub table_elements: usize,
}

impl InstanceLimits {
    pub(super) fn new(cap: usize) -> InstanceLimits {
        InstanceLimits {
            cap,
            memory: 0,
            table_elements: 0,
        }
    }

    /// What is left of the cap.
    pub(super) fn headroom(&self) -> usize {
        self.cap.saturating_sub(self.memory)
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = (self.memory - current.min(self.memory)).saturating_add(desired);
        if total > self.cap || maximum.is_some_and(|m| desired > m) {
            return Ok(false);
        }
        self.memory = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total =
            (self.table_elements - current.min(self.table_elements)).saturating_add(desired);
        if total > MAX_TABLE_ELEMENTS || maximum.is_some_and(|m| desired > m) {
            return Ok(false);
        }
        self.table_elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

/// The data of one instance's `Store`.
pub(super) struct HostState {
    pub ctx: Arc<PluginCtx>,
    /// Depth of the message being handled (0 for a lifecycle event).
    pub depth: u8,
    /// When the current call must end.
    pub deadline: Instant,
    /// This instance's own subscriptions, feeding `sub_tx`.
    pub subs: Vec<Subscription>,
    pub sub_tx: flume::Sender<Message>,
    pub sub_rx: flume::Receiver<Message>,
    pub limits: InstanceLimits,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl HostState {
    pub(super) fn new(
        ctx: Arc<PluginCtx>,
        limits: InstanceLimits,
        sub_tx: flume::Sender<Message>,
        sub_rx: flume::Receiver<Message>,
    ) -> HostState {
        let mut wasi = wasmtime_wasi::WasiCtxBuilder::new();
        wasi.stdout(GuestOutput::new(ctx.log.clone(), "stdout"))
            .stderr(GuestOutput::new(ctx.log.clone(), "stderr"))
            .max_random_size(MAX_RANDOM)
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false);
        HostState {
            ctx,
            depth: 0,
            deadline: Instant::now(),
            subs: Vec::new(),
            sub_tx,
            sub_rx,
            limits,
            wasi: wasi.build(),
            table: {
                let mut t = ResourceTable::new();
                t.set_max_capacity(MAX_HANDLES);
                t
            },
        }
    }

    /// The epoch callback's verdict: go on for another tick, or stop the call.
    pub(super) fn check_deadline(&self) -> Result<(), Interrupted> {
        if let Some(why) = self.ctx.stopping() {
            Err(why)
        } else if Instant::now() >= self.deadline {
            Err(Interrupted::Timeout)
        } else {
            Ok(())
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// `prx:host/log`'s `level`. Only ever lifted from a guest's call, never built here.
#[allow(dead_code)]
#[derive(ComponentType, Lift, Clone, Copy, Debug)]
#[component(enum)]
#[repr(u8)]
enum Level {
    #[component(name = "trace")]
    Trace,
    #[component(name = "debug")]
    Debug,
    #[component(name = "info")]
    Info,
    #[component(name = "warn")]
    Warn,
    #[component(name = "error")]
    Error,
}

type Cx<'a> = StoreContextMut<'a, HostState>;
type R<T> = wasmtime::Result<T>;

/// A linker with WASI p2 (its async bindings: calls must be `call_async`) and the host
/// interfaces under both names.
pub(super) fn linker(engine: &wasmtime::Engine) -> R<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    add_host(&mut linker)?;
    Ok(linker)
}

/// The same with WASI's synchronous bindings (what the host used before; benches compare).
pub(super) fn linker_sync(engine: &wasmtime::Engine) -> R<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    add_host(&mut linker)?;
    Ok(linker)
}

fn add_host(linker: &mut Linker<HostState>) -> R<()> {
    for version in [Some(HOST_VERSION), None] {
        let name = |iface: &str| match version {
            Some(v) => format!("prx:host/{iface}@{v}"),
            None => format!("prx:host/{iface}"),
        };
        add_log(linker, &name("log"))?;
        add_config(linker, &name("config"))?;
        add_kv(linker, &name("kv"))?;
        add_events(linker, &name("events"))?;
    }
    Ok(())
}

fn add_log(linker: &mut Linker<HostState>, name: &str) -> R<()> {
    let mut i = linker.instance(name)?;
    // `WasmStr`: the line is read in place from the guest's memory (and cut to a log line
    // there), never copied whole to the host.
    i.func_wrap("log", |cx: Cx<'_>, (level, msg): (Level, WasmStr)| {
        use super::log::Level as L;
        let level = match level {
            Level::Trace => L::Trace,
            Level::Debug => L::Debug,
            Level::Info => L::Info,
            Level::Warn => L::Warn,
            Level::Error => L::Error,
        };
        let msg = msg.to_str(&cx)?;
        cx.data().ctx.log.line(level, "log", msg.as_bytes());
        Ok(())
    })
}

fn add_config(linker: &mut Linker<HostState>, name: &str) -> R<()> {
    let mut i = linker.instance(name)?;
    i.func_wrap("get", |cx: Cx<'_>, (key,): (String,)| {
        Ok((cx.data().ctx.config.get(&key).cloned(),))
    })?;
    i.func_wrap("get-all", |cx: Cx<'_>, (): ()| {
        let all: Vec<(String, String)> = cx
            .data()
            .ctx
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok((all,))
    })
}

fn add_kv(linker: &mut Linker<HostState>, name: &str) -> R<()> {
    let mut i = linker.instance(name)?;
    i.func_wrap("get", |cx: Cx<'_>, (key,): (String,)| {
        let st = cx.data();
        let headroom = st.limits.headroom();
        match st.ctx.kv.get_within(&key, headroom) {
            Ok(v) => Ok((v,)),
            Err(len) => Err(wasmtime::format_err!(
                "kv.get: the value of {key:?} is {len} bytes, more than the {headroom} bytes left \
                 of the instance's max_memory_mb"
            )),
        }
    })?;
    i.func_wrap("set", |cx: Cx<'_>, (key, value): (String, Vec<u8>)| {
        let st = cx.data();
        // A wait for another process's lock ends at the call's deadline, shutdown or retirement.
        let stop = || st.ctx.stopping().is_some();
        let wait = Wait {
            until: st.deadline,
            stop: &stop,
        };
        let r = kv_outcome(st, st.ctx.kv.set_waiting(&key, value, &wait))?;
        if r.is_ok() {
            st.ctx.flusher.touch();
        }
        Ok((r,))
    })?;
    i.func_wrap("delete", |cx: Cx<'_>, (key,): (String,)| {
        let st = cx.data();
        let stop = || st.ctx.stopping().is_some();
        let wait = Wait {
            until: st.deadline,
            stop: &stop,
        };
        let r = kv_outcome(st, st.ctx.kv.delete_waiting(&key, &wait))?;
        if r == Ok(true) {
            st.ctx.flusher.touch();
        }
        Ok((r,))
    })?;
    i.func_wrap("list-keys", |cx: Cx<'_>, (prefix,): (String,)| {
        let st = cx.data();
        let headroom = st.limits.headroom();
        match st.ctx.kv.list_keys_within(&prefix, headroom) {
            Ok(keys) => Ok((keys,)),
            Err(len) => Err(wasmtime::format_err!(
                "kv.list-keys: the keys starting with {prefix:?} take {len} bytes, more than the \
                 {headroom} bytes left of the instance's max_memory_mb"
            )),
        }
    })
}

/// A kv write's result for the guest; a wait cut short ends the call (as a timeout, or as the
/// interruption that cut it).
fn kv_outcome<T>(st: &HostState, r: Result<T, KvError>) -> R<Result<T, String>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(KvError::Refused(m)) => Ok(Err(m)),
        Err(KvError::GaveUp) => Err(st
            .check_deadline()
            .err()
            .unwrap_or(Interrupted::Timeout)
            .into()),
    }
}

fn add_events(linker: &mut Linker<HostState>, name: &str) -> R<()> {
    let mut i = linker.instance(name)?;
    i.func_wrap(
        "publish",
        // Topic and payload are read in place from the guest's memory: the bus refuses a payload
        // over its size limit before copying anything, so the host copies at most that limit
        // (a few times it when text that is not JSON is quoted).
        |cx: Cx<'_>, (topic, payload): (WasmStr, WasmStr)| {
            let topic = topic.to_str(&cx)?;
            let payload = payload.to_str(&cx)?;
            let st = cx.data();
            let depth = st.depth.saturating_add(1);
            let bus = &st.ctx.bus;
            let r = permitted(st, "publish").and_then(|()| {
                match bus.publish_at_depth(&topic, payload.as_bytes(), depth) {
                    // PRX takes any text: what is not JSON travels as a JSON string.
                    Err(BusError::InvalidJson { .. }) => {
                        let quoted = serde_json::to_string(&*payload).map_err(|e| e.to_string())?;
                        bus.publish_at_depth(&topic, quoted.as_bytes(), depth)
                    }
                    other => other,
                }
                .map(|_| ())
                .map_err(|e| e.to_string())
            });
            if let Err(e) = &r {
                let line = format!("events.publish refused: {e}");
                st.ctx
                    .log
                    .line(super::log::Level::Debug, "host", line.as_bytes());
            }
            Ok((r,))
        },
    )?;
    i.func_wrap("subscribe", |mut cx: Cx<'_>, (pattern,): (String,)| {
        let st = cx.data_mut();
        let r = permitted(st, "subscribe").and_then(|()| {
            if st.subs.len() >= MAX_SUBSCRIPTIONS {
                return Err(format!(
                    "events.subscribe: this instance already holds {MAX_SUBSCRIPTIONS} subscriptions"
                ));
            }
            let sub = st
                .ctx
                .bus
                .subscribe_into(&pattern, st.sub_tx.clone(), st.sub_rx.clone())
                .map_err(|e| e.to_string())?;
            let id = sub.id();
            st.subs.push(sub);
            Ok(id)
        });
        Ok((r,))
    })?;
    i.func_wrap("unsubscribe", |mut cx: Cx<'_>, (id,): (u64,)| {
        let st = cx.data_mut();
        let r = permitted(st, "unsubscribe").and_then(|()| {
            match st.subs.iter().position(|s| s.id() == id) {
                Some(n) => {
                    st.subs.swap_remove(n);
                    Ok(())
                }
                None => Err(format!(
                    "events.unsubscribe: subscription {id} is not one of this plugin's"
                )),
            }
        });
        Ok((r,))
    })
}

fn permitted(st: &HostState, what: &str) -> Result<(), String> {
    if st.ctx.events_allowed {
        Ok(())
    } else {
        Err(format!(
            "events.{what}: plugin {:?} lacks the \"events\" permission (add it to [permissions] required in plugin.toml)",
            &*st.ctx.name
        ))
    }
}

/// A guest's stdout or stderr: each line goes to the plugin's bounded log. Every handle the
/// guest opens on it (`get-stdout` makes a new one each time) shares one partial line, so what
/// the host holds for it is one line however many handles there are.
struct GuestOutput {
    log: Arc<PluginLog>,
    stream: &'static str,
    line: Arc<Mutex<Vec<u8>>>,
}

impl GuestOutput {
    fn new(log: Arc<PluginLog>, stream: &'static str) -> GuestOutput {
        GuestOutput {
            log,
            stream,
            line: Arc::default(),
        }
    }

    fn handle(&self) -> LineLogger {
        LineLogger {
            log: self.log.clone(),
            stream: self.stream,
            line: self.line.clone(),
        }
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.handle())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.handle())
    }
}

/// One handle on a guest's stdout or stderr.
struct LineLogger {
    log: Arc<PluginLog>,
    stream: &'static str,
    line: Arc<Mutex<Vec<u8>>>,
}

impl LineLogger {
    fn line(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.line.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&mut self, bytes: &[u8]) {
        let mut line = self.line();
        for &b in bytes {
            if b == b'\n' || line.len() >= MAX_LINE {
                self.emit(&mut line);
                if b == b'\n' {
                    continue;
                }
            }
            line.push(b);
        }
    }

    fn emit(&self, line: &mut Vec<u8>) {
        self.log.line(super::log::Level::Info, self.stream, line);
        line.clear();
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        let mut line = self.line();
        if !line.is_empty() {
            self.emit(&mut line);
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineLogger {
    async fn ready(&mut self) {}
}

impl OutputStream for LineLogger {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.take(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LineLogger {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.take(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cap_holds_for_all_memories_of_an_instance_together() {
        let mut l = InstanceLimits::new(10 << 20);
        // Two memories created with 4 MiB each: both fit.
        assert!(l.memory_growing(0, 4 << 20, None).unwrap());
        assert!(l.memory_growing(0, 4 << 20, None).unwrap());
        assert_eq!(l.headroom(), 2 << 20);
        // Growing the first by 3 MiB would pass the cap for the instance (11 MiB).
        assert!(!l.memory_growing(4 << 20, 7 << 20, None).unwrap());
        // By 2 MiB it fits exactly; then nothing more does, in either memory.
        assert!(l.memory_growing(4 << 20, 6 << 20, None).unwrap());
        assert!(!l.memory_growing(4 << 20, (4 << 20) + 65536, None).unwrap());
        assert!(!l.memory_growing(0, 65536, None).unwrap());
        assert_eq!(l.headroom(), 0);
    }

    #[test]
    fn a_real_store_holds_two_memories_to_one_cap() {
        // The limiter as wasmtime drives it: two linear memories of one store, each of which
        // could grow to the cap alone, share it.
        use wasmtime::{Engine, Memory, MemoryType, Store};
        const MIB_PAGES: u64 = 16; // 64 KiB pages
        let engine = Engine::default();
        let mut store = Store::new(&engine, InstanceLimits::new(10 << 20));
        store.limiter(|l| l);
        let four = MemoryType::new(4 * MIB_PAGES as u32, None);
        let a = Memory::new(&mut store, four.clone()).unwrap();
        let b = Memory::new(&mut store, four).unwrap();
        assert_eq!(store.data().memory, 8 << 20);
        assert!(a.grow(&mut store, 3 * MIB_PAGES).is_err(), "11 MiB in all");
        a.grow(&mut store, 2 * MIB_PAGES).unwrap();
        assert!(b.grow(&mut store, 1).is_err(), "the cap is spent");
        assert_eq!(store.data().headroom(), 0);
        assert!(Memory::new(&mut store, MemoryType::new(1, None)).is_err());
    }
}
