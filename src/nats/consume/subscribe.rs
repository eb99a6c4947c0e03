//! Core NATS: a subscription (or a queue group) drained into the bounded intake buffer and
//! handed to the pipeline as its hooks have room (ARCHITECTURE.md § NATS bridge, "Core intake").

use super::*;

impl Worker {
    pub(super) fn run_core(&mut self, rt: &tokio::runtime::Runtime, client: async_nats::Client) {
        let subject = self.opts.subject.clone();
        let sub = loop {
            let subscribed = match &self.opts.queue {
                Some(q) => rt.block_on(client.queue_subscribe(subject.clone(), q.clone())),
                None => rt.block_on(client.subscribe(subject.clone())),
            };
            match subscribed {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!("NATS consumer: subscribing to {}: {e}", self.opts.subject);
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return;
                    }
                }
            }
        };
        // The client's channel is drained at once into a buffer of our own, bounded in
        // messages and bytes, whose drops are counted here, each one (ARCHITECTURE.md § NATS
        // bridge, "Core intake").
        let intake = Arc::new(Intake {
            q: Mutex::new((VecDeque::new(), 0)),
            ready: tokio::sync::Notify::new(),
            max_messages: self.opts.buffer_messages,
            max_bytes: self.opts.buffer_bytes,
            counters: self.counters.clone(),
        });
        let drain = rt.spawn(intake.clone().fill(sub));
        let mut batch: Vec<async_nats::Message> = Vec::with_capacity(BATCH);
        let mut checked = 0;
        while !self.stopping() {
            let allowed = self.wait_for_room();
            if allowed == 0 || self.server_refused(&client, &mut checked) {
                break;
            }
            if !intake.take(&mut batch, allowed) {
                rt.block_on(async {
                    tokio::select! {
                        _ = intake.ready.notified() => {}
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                });
                continue;
            }
            let mut handed = Vec::new();
            for m in batch.drain(..) {
                let incoming = Incoming {
                    subject: m.subject.as_str(),
                    headers: m.headers.as_ref(),
                    payload: &m.payload,
                    delivery: None,
                    reclaimed: false,
                    fence: None,
                    start: None,
                };
                if let (Fate::Handed, Some(id)) = self.handle(&incoming, None) {
                    handed.push(id);
                }
            }
            self.window.persist(&handed);
        }
        // The task owns the subscription: aborted, it drops it (an unsubscribe).
        drain.abort();
        let _ = rt.block_on(drain);
    }

    /// At each new connection to a server beyond this machine: true (stop consuming, said
    /// once) if it does not require authentication and `--nats-insecure` was not given.
    pub(super) fn server_refused(&self, client: &async_nats::Client, checked: &mut u64) -> bool {
        if !self.auth_check {
            return false;
        }
        let connects = self.state.connects.load(Ordering::Acquire);
        if connects == *checked || !self.state.is_connected() {
            return false;
        }
        *checked = connects;
        if client.server_info().auth_required {
            return false;
        }
        tracing::error!(
            "{}; not consuming",
            ConnectError::NoAuthRequired {
                server: self.server.clone()
            }
        );
        true
    }

    /// Sleeps `d` in small steps; true if stopping.
    pub(super) fn pause_or_stop(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if self.stopping() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stopping()
    }

    /// Back-pressure: waits until the pipeline can take events without a hook's queue
    /// overflowing (none while the rings are a quarter full, a bus subscriber half full, or a
    /// backend holds many jobs; no more than its tightest queue can take with what the rings
    /// hold on the way to it), and returns how many, at most [`CORE_BATCH`]; 0 if stopping.
    pub(super) fn wait_for_room(&self) -> usize {
        let mut allowed = self.feed.allowance(CORE_BATCH);
        if allowed > 0 {
            return if self.stopping() { 0 } else { allowed };
        }
        self.counters.paused.fetch_add(1, Ordering::Relaxed);
        while allowed == 0 {
            if self.stopping() {
                return 0;
            }
            std::thread::sleep(Duration::from_micros(500));
            allowed = self.feed.allowance(CORE_BATCH);
        }
        if self.stopping() { 0 } else { allowed }
    }
}
