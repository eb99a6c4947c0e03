//! The consuming thread's handle: [`Consumer`] starts the worker, reads its counters, stops it.

use super::*;

#[derive(Default)]
pub(super) struct Counters {
    pub(super) received: AtomicU64,
    pub(super) consumed: AtomicU64,
    pub(super) skipped: AtomicU64,
    pub(super) duplicates: AtomicU64,
    pub(super) own: AtomicU64,
    pub(super) refused_headers: AtomicU64,
    pub(super) refused_body: AtomicU64,
    pub(super) refused_subject: AtomicU64,
    pub(super) refused_oversize: AtomicU64,
    pub(super) without_id: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) paused: AtomicU64,
    pub(super) window: AtomicU64,
    pub(super) loops: AtomicU64,
    pub(super) given_up: AtomicU64,
    pub(super) id_conflicts: AtomicU64,
    pub(super) in_flight: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dropped_full: AtomicU64,
    pub(super) shared_duplicates: AtomicU64,
    pub(super) reclaimed: AtomicU64,
    pub(super) buffered: AtomicU64,
    pub(super) buffered_bytes: AtomicU64,
}

/// The consuming half of the bridge: a thread pulling from NATS into the pipeline. Made by
/// [`HooksBuilder::nats_consume`](crate::HooksBuilder::nats_consume); stopped first when the
/// `Hooks` shuts down.
pub struct Consumer {
    pub(super) counters: Arc<Counters>,
    pub(super) state: Arc<ConnState>,
    pub(super) server: String,
    pub(super) subject: String,
    pub(super) durable: Option<String>,
    pub(super) stop: Arc<AtomicBool>,
    /// Until when a stopping JetStream consumer waits for what is in flight to settle.
    pub(super) drain_until: Arc<Mutex<Option<Instant>>>,
    pub(super) wake: Arc<tokio::sync::Notify>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
}

impl Consumer {
    pub(crate) fn start(feed: Feed, opts: ConsumeOptions) -> Result<Consumer, ConnectError> {
        opts.check()?;
        let server = opts.nats.redacted();
        let state = ConnState::new(format!("NATS consumer ({server})"));
        let (connect, addrs) = opts.nats.connect_options(state.clone(), "consume", true)?;
        // The client's channel for a subscription is drained at once into the core
        // consumer's own bounded buffer, but only when the client's connection task yields,
        // and it reads many messages per turn: room enough that a flood on loopback never
        // overflows it (async-nats reports such drops through a 128-slot event channel, which
        // misses most of them). Its slots are allocated as used.
        let connect = connect.subscription_capacity(CLIENT_CHANNEL);
        let window = Window::open(opts.dedup_ids, opts.dedup_age, opts.dedup_file.clone())?;
        let rt = runtime("prx-nats-consume")?;
        let client = rt
            .block_on(connect.connect(addrs))
            .map_err(|e| ConnectError::Invalid {
                what: "NATS connection",
                reason: e.to_string(),
            })?;
        // A server beyond this machine must ask for credentials (its INFO's auth_required):
        // credentials sent to one that accepts anybody keep nobody out. Checked at the first
        // connection here (when it comes within the connection timeout) and at every
        // connection in the worker.
        if opts.nats.needs_auth_check() {
            let connected = rt.block_on(async {
                let until = tokio::time::Instant::now() + Duration::from_secs(5);
                while client.connection_state() != async_nats::connection::State::Connected {
                    if tokio::time::Instant::now() >= until {
                        return false;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                true
            });
            if connected && !client.server_info().auth_required {
                return Err(ConnectError::NoAuthRequired {
                    server: server.clone(),
                });
            }
        }
        let counters = Arc::new(Counters::default());
        counters
            .window
            .store(window.len() as u64, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let drain_until = Arc::new(Mutex::new(None));
        let notify = Arc::new(tokio::sync::Notify::new());
        let settled = {
            let notify = notify.clone();
            crate::settle::Settled::new(Box::new(move || notify.notify_one()))
        };
        let worker = Worker {
            drain_until: drain_until.clone(),
            notify,
            settled,
            flights: HashMap::new(),
            in_flight_limit: MAX_IN_FLIGHT,
            flying: HashMap::new(),
            next_key: 0,
            shared: None,
            lease_table: None,
            start_down: Arc::default(),
            shared_digest: None,
            max_deliver: HashMap::new(),
            given_up: Arc::new(GivenUp::new(counters.clone())),
            auth_check: opts.nats.needs_auth_check(),
            state: state.clone(),
            server: server.clone(),
            feed,
            opts: opts.clone(),
            counters: counters.clone(),
            stop: stop.clone(),
            wake: wake.clone(),
            window,
            emitters: HashMap::new(),
            emitter_order: VecDeque::new(),
            said: Said::default(),
            made_ids: 0,
        };
        let thread = std::thread::Builder::new()
            .name("prx-nats-consume".into())
            .spawn(move || {
                worker.run(&rt, client);
                rt.shutdown_timeout(Duration::from_millis(100));
            })
            .map_err(ConnectError::Runtime)?;
        Ok(Consumer {
            counters,
            state,
            server,
            subject: opts.subject,
            durable: opts.durable,
            stop,
            drain_until,
            wake,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// What it did so far (also `Hooks::stats` → `nats.consume`).
    pub fn stats(&self) -> ConsumeStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Acquire);
        // `received` last: every other counter is then at most what it implies.
        let mut s = ConsumeStats {
            server: self.server.clone(),
            subject: self.subject.clone(),
            durable: self.durable.clone(),
            connected: self.state.is_connected(),
            consumed: get(&c.consumed),
            skipped: get(&c.skipped),
            duplicates: get(&c.duplicates),
            own: get(&c.own),
            refused_headers: get(&c.refused_headers),
            refused_body: get(&c.refused_body),
            refused_subject: get(&c.refused_subject),
            refused_oversize: get(&c.refused_oversize),
            without_id: get(&c.without_id),
            acked: get(&c.acked),
            paused: get(&c.paused),
            slow_consumer: self.state.slow_consumer.load(Ordering::Relaxed),
            window: get(&c.window),
            loops: get(&c.loops),
            given_up: get(&c.given_up),
            id_conflicts: get(&c.id_conflicts),
            in_flight: get(&c.in_flight),
            retried: get(&c.retried),
            dropped_full: get(&c.dropped_full),
            shared_duplicates: get(&c.shared_duplicates),
            reclaimed: get(&c.reclaimed),
            buffered: get(&c.buffered),
            buffered_bytes: get(&c.buffered_bytes),
            reconnects: self.state.reconnects(),
            ..ConsumeStats::default()
        };
        s.received = get(&c.received);
        s
    }

    /// Stops taking messages and waits for the thread: it naks what it took and did not hand
    /// over; with JetStream it waits until `deadline` for the hooks of what it handed over to
    /// settle, acks those, and naks the rest. Idempotent.
    pub(crate) fn stop(&self, deadline: Instant) {
        {
            let mut d = self.drain_until.lock().unwrap_or_else(|e| e.into_inner());
            if d.is_none() {
                *d = Some(deadline);
            }
        }
        self.stop.store(true, Ordering::Release);
        self.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("server", &self.server)
            .field("subject", &self.subject)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop(Instant::now());
    }
}
