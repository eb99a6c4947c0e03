//! The hub thread: takes bus messages and hook runs, numbers and renders them, and hands each
//! batch to the backlog and the clients (ARCHITECTURE.md § The live stream).

use super::*;

/// The plugin backend's call counters, diffed once a second.
pub(super) struct PluginCounter {
    #[cfg(feature = "wasm")]
    pub(super) sink: Arc<crate::wasm::WasmSink>,
    #[cfg(feature = "wasm")]
    pub(super) last: std::collections::BTreeMap<String, [u64; 10]>,
}

/// The per-call results and drop reasons counted, in the order of [`PluginCounter`]'s arrays.
#[cfg(feature = "wasm")]
pub(super) const PLUGIN_FIELDS: [(&str, &str); 10] = [
    ("results", "ok"),
    ("results", "error"),
    ("results", "trap"),
    ("results", "timeout"),
    ("results", "out_of_fuel"),
    ("results", "busy"),
    ("dropped", "queue_full"),
    ("dropped", "suspended"),
    ("dropped", "shutdown"),
    ("dropped", "reload"),
];

impl PluginCounter {
    #[cfg(feature = "wasm")]
    pub(super) fn new(hooks: &Hooks) -> Option<PluginCounter> {
        let sink = hooks.plugins()?.clone();
        let mut c = PluginCounter {
            sink,
            last: Default::default(),
        };
        c.aggregates(SystemTime::now(), Duration::ZERO);
        Some(c)
    }

    #[cfg(not(feature = "wasm"))]
    pub(super) fn new(_: &Hooks) -> Option<PluginCounter> {
        None
    }

    /// One aggregate per plugin whose counters moved since the last call.
    #[cfg(feature = "wasm")]
    pub(super) fn aggregates(
        &mut self,
        now: SystemTime,
        interval: Duration,
    ) -> Vec<serde_json::Value> {
        let stats = self.sink.stats();
        let mut out = Vec::new();
        for p in &stats.plugins {
            let c = &p.counts;
            let now_counts = [
                c.ok,
                c.errors,
                c.traps,
                c.timeouts,
                c.out_of_fuel,
                c.busy,
                c.dropped_queue_full,
                c.dropped_suspended,
                c.dropped_shutdown,
                c.dropped_reload,
            ];
            let before = self
                .last
                .insert(p.name.clone(), now_counts)
                .unwrap_or([0; 10]);
            if interval.is_zero() {
                continue;
            }
            let mut results = serde_json::Map::new();
            let mut dropped = serde_json::Map::new();
            let mut calls = 0u64;
            for (i, (group, name)) in PLUGIN_FIELDS.iter().enumerate() {
                // A counter that went down (cannot happen: counts outlive versions) is a
                // fresh start.
                let d = now_counts[i].saturating_sub(before[i]);
                if d == 0 {
                    continue;
                }
                if *group == "results" {
                    calls += d;
                    results.insert((*name).into(), d.into());
                } else {
                    dropped.insert((*name).into(), d.into());
                }
            }
            if results.is_empty() && dropped.is_empty() {
                continue;
            }
            out.push(serde_json::json!({
                "plugin": p.name,
                "time": humantime::format_rfc3339_micros(now).to_string(),
                "interval_ms": interval.as_millis() as u64,
                "calls": calls,
                "results": results,
                "dropped": dropped,
                "state": p.state,
                "last_error": c.last_error,
            }));
        }
        out
    }

    #[cfg(not(feature = "wasm"))]
    pub(super) fn aggregates(&mut self, _: SystemTime, _: Duration) -> Vec<serde_json::Value> {
        Vec::new()
    }
}

/// What woke the hub thread.
pub(super) enum Woke {
    Bus(Result<Message, flume::RecvError>),
    Run(Result<Arc<Outcome>, flume::RecvError>),
    Poke,
}

/// The hub thread: drains the bus subscription and the run feed in batches, numbers and
/// renders each item, publishes the batch under the state lock (backlog, then every client
/// that wants it), sends the plugin aggregates each second and keep-alives to quiet clients,
/// and ends when the hub closes, the bus closes, or nobody has watched for `linger`.
pub(super) fn record(
    hub: Arc<Hub>,
    bus: Subscription,
    runs: Option<RunSubscription>,
    mut plugins: Option<PluginCounter>,
    mut next: u64,
) {
    let mut msgs: Vec<Message> = Vec::with_capacity(BATCH);
    let mut outs: Vec<Arc<Outcome>> = Vec::with_capacity(BATCH);
    let mut items: Vec<(What, Bytes)> = Vec::with_capacity(2 * BATCH);
    let (mut bus_lost, mut runs_lost) = (0u64, 0u64);
    let mut bus_open = true;
    let mut runs_open = runs.is_some();
    let mut last_plugins = Instant::now();
    let tick = hub
        .opts
        .keepalive
        .min(PLUGIN_INTERVAL)
        .min(Duration::from_millis(250).max(hub.opts.linger / 4))
        .max(Duration::from_millis(5));
    loop {
        while msgs.len() < BATCH {
            match bus.receiver().try_recv() {
                Ok(m) => msgs.push(m),
                Err(flume::TryRecvError::Empty) => break,
                Err(flume::TryRecvError::Disconnected) => {
                    bus_open = false;
                    break;
                }
            }
        }
        if let Some(r) = runs.as_ref().filter(|_| runs_open) {
            while outs.len() < BATCH {
                match r.receiver().try_recv() {
                    Ok(o) => outs.push(o),
                    Err(flume::TryRecvError::Empty) => break,
                    Err(flume::TryRecvError::Disconnected) => {
                        runs_open = false;
                        break;
                    }
                }
            }
        }
        let busy = msgs.len() == BATCH || outs.len() == BATCH;
        // Render outside the lock; only the hub thread assigns positions.
        for m in msgs.drain(..) {
            let topic = match m.event() {
                Some(k) => Topic::Lifecycle(k),
                None => Topic::Custom(m.topic().into()),
            };
            let name = match m.topic() {
                t if RESERVED_NAMES.contains(&t) => "message",
                t => t,
            };
            items.push((What::Bus(topic), bus_frame(&hub.instance, next, name, &m)));
            next += 1;
        }
        for o in outs.drain(..) {
            let id = hub.id(next);
            next += 1;
            items.push((
                What::Run,
                frame(Some(&id), "run", &super::super::hooks::run_json(&o)),
            ));
        }
        for (source, now_lost, seen) in [
            (Source::Bus, bus.dropped(), &mut bus_lost),
            (
                Source::Runs,
                runs.as_ref().map_or(0, |r| r.dropped()),
                &mut runs_lost,
            ),
        ] {
            if now_lost > *seen {
                let d = now_lost - *seen;
                *seen = now_lost;
                hub.counters.dropped_server.fetch_add(d, Ordering::Relaxed);
                let id = hub.id(next);
                next += 1;
                let data = serde_json::json!({
                    "count": d,
                    "reason": "server_queue_full",
                    "source": source.name(),
                });
                items.push((What::Lost(source, d), frame(Some(&id), "dropped", &data)));
            }
        }
        let now = Instant::now();
        if let Some(p) = plugins.as_mut()
            && now.duration_since(last_plugins) >= PLUGIN_INTERVAL
        {
            for agg in p.aggregates(SystemTime::now(), now - last_plugins) {
                let id = hub.id(next);
                next += 1;
                items.push((What::Plugin, frame(Some(&id), "plugin", &agg)));
            }
            last_plugins = now;
        }
        // Publish: backlog, then every client that wants it, in position order.
        let mut st = hub.lock();
        if st.closed.is_some() || !st.recording {
            return;
        }
        if !items.is_empty() {
            let first = next - items.len() as u64;
            hub.counters
                .items
                .fetch_add(items.len() as u64, Ordering::Relaxed);
            let (max, max_bytes) = (hub.opts.backlog, hub.opts.backlog_bytes);
            for (i, (what, frame)) in items.drain(..).enumerate() {
                let weight = what.weight();
                for c in st.clients.iter_mut().filter(|c| c.filter.wants(&what)) {
                    c.offer(&frame, weight, &hub.counters, now, hub.opts.queue_bytes);
                }
                let pos = first + i as u64;
                st.journal.push(Entry { pos, what, frame }, max, max_bytes);
            }
        }
        if !bus_open {
            drop(st);
            let _ = hub.close("the hook system shut down");
            return;
        }
        let keepalive = Bytes::from_static(KEEPALIVE_FRAME);
        for c in st
            .clients
            .iter_mut()
            .filter(|c| now.duration_since(c.last_sent) >= hub.opts.keepalive)
        {
            if c.send(keepalive.clone(), 0).is_ok() {
                c.last_sent = now;
            }
        }
        if !hub.opts.always
            && st.clients.is_empty()
            && hub.open.load(Ordering::Relaxed) == 0
            && now.duration_since(st.idle_since) >= hub.opts.linger
        {
            // Nobody has watched for `linger`: stop recording (the pipeline no longer
            // serializes events for us) until the next client.
            st.recording = false;
            st.journal.pause();
            drop(st.thread.take());
            return;
        }
        drop(st);
        if busy {
            continue;
        }
        let wait = tick.min(PLUGIN_INTERVAL.saturating_sub(now.duration_since(last_plugins)));
        let mut sel = flume::Selector::new()
            .recv(bus.receiver(), Woke::Bus)
            .recv(&hub.poked, |_| Woke::Poke);
        if let Some(r) = runs.as_ref().filter(|_| runs_open) {
            sel = sel.recv(r.receiver(), Woke::Run);
        }
        match sel.wait_timeout(wait.max(Duration::from_millis(1))) {
            Ok(Woke::Bus(Ok(m))) => msgs.push(m),
            Ok(Woke::Bus(Err(_))) => bus_open = false,
            Ok(Woke::Run(Ok(o))) => outs.push(o),
            Ok(Woke::Run(Err(_))) => runs_open = false,
            Ok(Woke::Poke) | Err(_) => {}
        }
    }
}
