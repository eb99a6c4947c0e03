//! What a plugin's instance can call: `prx:host/{log,config,kv,events}` and a locked-down WASI.
//!
//! Every host interface is registered twice, as `prx:host/log@0.1.0` and as `prx:host/log`, so a
//! guest built from a versioned or an unversioned copy of the WIT links. WASI p2 is linked with
//! nothing to reach: no preopened directories, no environment, no arguments, no network (socket
//! address checks deny everything, name lookup is off), stdin empty; stdout and stderr go to
//! `tracing` line by line, tagged with the plugin's name. Clocks and random are available.
//!
//! Each instance's [`HostState`] knows its plugin ([`PluginCtx`]: name, config, kv store, whether
//! it holds the `events` permission, the bus) and the message it is handling, whose depth is what
//! makes `events.publish` from inside a call nest one level deeper — the bus refuses publications
//! nested more than [`MAX_DEPTH`](crate::bus::MAX_DEPTH), so a plugin that republishes what it
//! receives stops there. Subscriptions an instance makes are its own: they feed its queue, die
//! with it, and only it can cancel them.

use super::kv::{KvFlusher, KvStore};
use crate::bus::{Bus, Message, Subscription};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use wasmtime::component::{ComponentType, Lift, Linker, ResourceTable};
use wasmtime::{StoreContextMut, StoreLimits};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// Versions under which the host interfaces are registered (besides the bare names).
const HOST_VERSION: &str = "0.1.0";
/// Subscriptions one instance may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;
/// Longest line of guest stdout/stderr passed to tracing (longer ones are split).
const MAX_LINE: usize = 4096;

/// Everything about a plugin that its host functions need, shared by its instances.
pub struct PluginCtx {
    pub name: Arc<str>,
    pub config: BTreeMap<String, String>,
    pub kv: Arc<KvStore>,
    pub flusher: Arc<KvFlusher>,
    /// `"events"` is in the manifest's permissions.
    pub events_allowed: bool,
    pub bus: Bus,
    /// Set at the shutdown deadline: the running call is interrupted at the next tick.
    pub abort: Arc<AtomicBool>,
}

/// Why the host interrupted a call (the error the epoch callback raises).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Interrupted {
    #[error("timed out")]
    Timeout,
    #[error("interrupted by shutdown")]
    Shutdown,
}

/// The data of one instance's `Store`.
pub struct HostState {
    pub ctx: Arc<PluginCtx>,
    /// Depth of the message being handled (0 for a lifecycle event).
    pub depth: u8,
    /// When the current call must end.
    pub deadline: Instant,
    /// This instance's own subscriptions, feeding `sub_tx`.
    pub subs: Vec<Subscription>,
    pub sub_tx: flume::Sender<Message>,
    pub sub_rx: flume::Receiver<Message>,
    pub limits: StoreLimits,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl HostState {
    pub fn new(
        ctx: Arc<PluginCtx>,
        limits: StoreLimits,
        sub_tx: flume::Sender<Message>,
        sub_rx: flume::Receiver<Message>,
    ) -> HostState {
        let mut wasi = wasmtime_wasi::WasiCtxBuilder::new();
        wasi.stdout(GuestOutput {
            plugin: ctx.name.clone(),
            stream: "stdout",
        })
        .stderr(GuestOutput {
            plugin: ctx.name.clone(),
            stream: "stderr",
        })
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
            table: ResourceTable::new(),
        }
    }

    /// The epoch callback's verdict: go on for another tick, or stop the call.
    pub fn check_deadline(&self) -> Result<(), Interrupted> {
        if self.ctx.abort.load(Ordering::Relaxed) {
            Err(Interrupted::Shutdown)
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

/// A linker with WASI p2 and the host interfaces under both names.
pub fn linker(engine: &wasmtime::Engine) -> R<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    for version in [Some(HOST_VERSION), None] {
        let name = |iface: &str| match version {
            Some(v) => format!("prx:host/{iface}@{v}"),
            None => format!("prx:host/{iface}"),
        };
        add_log(&mut linker, &name("log"))?;
        add_config(&mut linker, &name("config"))?;
        add_kv(&mut linker, &name("kv"))?;
        add_events(&mut linker, &name("events"))?;
    }
    Ok(linker)
}

fn add_log(linker: &mut Linker<HostState>, name: &str) -> R<()> {
    let mut i = linker.instance(name)?;
    i.func_wrap("log", |cx: Cx<'_>, (level, msg): (Level, String)| {
        let plugin = &*cx.data().ctx.name;
        let msg = super::engine::one_line(&msg);
        match level {
            Level::Trace => tracing::trace!(target: "prx_hooks::plugin", plugin, "{msg}"),
            Level::Debug => tracing::debug!(target: "prx_hooks::plugin", plugin, "{msg}"),
            Level::Info => tracing::info!(target: "prx_hooks::plugin", plugin, "{msg}"),
            Level::Warn => tracing::warn!(target: "prx_hooks::plugin", plugin, "{msg}"),
            Level::Error => tracing::error!(target: "prx_hooks::plugin", plugin, "{msg}"),
        }
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
        Ok((cx.data().ctx.kv.get(&key),))
    })?;
    i.func_wrap("set", |cx: Cx<'_>, (key, value): (String, Vec<u8>)| {
        let ctx = &cx.data().ctx;
        let r = ctx.kv.set(&key, value);
        if r.is_ok() {
            ctx.flusher.touch();
        }
        Ok((r,))
    })?;
    i.func_wrap("delete", |cx: Cx<'_>, (key,): (String,)| {
        let ctx = &cx.data().ctx;
        let existed = ctx.kv.delete(&key);
        if existed {
            ctx.flusher.touch();
        }
        Ok((Ok::<bool, String>(existed),))
    })?;
    i.func_wrap("list-keys", |cx: Cx<'_>, (prefix,): (String,)| {
        Ok((cx.data().ctx.kv.list_keys(&prefix),))
    })
}

fn add_events(linker: &mut Linker<HostState>, name: &str) -> R<()> {
    let mut i = linker.instance(name)?;
    i.func_wrap(
        "publish",
        |cx: Cx<'_>, (topic, payload): (String, String)| {
            let st = cx.data();
            let r = permitted(st, "publish").and_then(|()| {
                st.ctx
                    .bus
                    .publish_at_depth(&topic, payload.as_bytes(), st.depth.saturating_add(1))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            });
            if let Err(e) = &r {
                tracing::debug!(plugin = %st.ctx.name, "events.publish refused: {e}");
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
            tracing::debug!(plugin = %st.ctx.name, pattern, id, "subscribed");
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

/// A guest's stdout or stderr: each line becomes a `tracing` event.
struct GuestOutput {
    plugin: Arc<str>,
    stream: &'static str,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LineLogger {
            plugin: self.plugin.clone(),
            stream: self.stream,
            line: Vec::new(),
        })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LineLogger {
            plugin: self.plugin.clone(),
            stream: self.stream,
            line: Vec::new(),
        })
    }
}

struct LineLogger {
    plugin: Arc<str>,
    stream: &'static str,
    line: Vec<u8>,
}

impl LineLogger {
    fn take(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' || self.line.len() >= MAX_LINE {
                self.emit();
                if b == b'\n' {
                    continue;
                }
            }
            self.line.push(b);
        }
    }

    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end_matches('\r');
        tracing::info!(target: "prx_hooks::plugin", plugin = %self.plugin, stream = self.stream, "{text}");
        self.line.clear();
    }
}

impl Drop for LineLogger {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.emit();
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
