//! The publisher's connections: one client on a runtime of its own each, made (with the
//! JetStream stream) and made again when lost (ARCHITECTURE.md § NATS bridge, "Publishing").

use super::{Out, STREAM_MAX_AGE, Task};
use crate::nats::connect::{ConnState, runtime};
use async_nats::jetstream;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One connection: a client of its own on a runtime of its own. When it is lost the runtime
/// is shut down with everything the client still held, so nothing sent before can reach the
/// server after what the next connection sends again (that is what keeps the order).
pub(super) struct Conn {
    rt: Option<tokio::runtime::Runtime>,
    pub(super) client: async_nats::Client,
    pub(super) js: Option<jetstream::Context>,
    pub(super) echo: async_nats::Subscriber,
    state: Arc<ConnState>,
}

impl Conn {
    /// It connected and then lost the connection.
    pub(super) fn lost(&self) -> bool {
        self.state.connects.load(Ordering::Acquire) > 0 && !self.state.is_connected()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Task {
    /// The connection is lost (or there was none yet): a new one, and everything unconfirmed
    /// sent again on it; `None` when the shutdown deadline passed first.
    pub(super) async fn reconnect(
        &mut self,
        old: Option<Conn>,
        window: &mut VecDeque<Out>,
        marker: &mut u64,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> Option<Conn> {
        if old.is_some() {
            drop(old);
            self.state.connected.store(false, Ordering::Release);
            for o in window.iter_mut() {
                o.sent = false;
                o.ack = None;
            }
        }
        let c = self.connect(stop).await?;
        let n = self.state.connects.fetch_add(1, Ordering::AcqRel);
        self.state.connected.store(true, Ordering::Release);
        if n > 0 {
            tracing::info!(
                "NATS publisher: connected again; sending {} unconfirmed message(s) again",
                window.len()
            );
            self.counters
                .resent
                .fetch_add(window.len() as u64, Ordering::AcqRel);
        }
        self.transmit(&c, window, 0, marker).await;
        Some(c)
    }

    /// A new connection (and, the first time with JetStream, the stream), retried with a
    /// backoff from 10 ms to 1 s; `None` when the shutdown deadline passes first.
    async fn connect(&mut self, stop: &mut watch::Receiver<Option<Instant>>) -> Option<Conn> {
        let mut backoff = Duration::ZERO;
        let mut said = false;
        loop {
            let deadline = *stop.borrow_and_update();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            match self.try_connect().await {
                Ok(c) => {
                    if let (Some(js), false) = (&c.js, self.stream_ready) {
                        self.stream_ready = self.ensure_stream(js, &c, stop).await;
                    }
                    return Some(c);
                }
                Err(e) => {
                    if !said {
                        said = true;
                        tracing::debug!("NATS publisher: cannot connect: {e}; retrying");
                    }
                }
            }
            backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            let until = deadline.map_or(far, tokio::time::Instant::from);
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = tokio::time::sleep_until(until) => return None,
                _ = stop.changed() => {}
            }
        }
    }

    async fn try_connect(&self) -> Result<Conn, String> {
        let state = ConnState::new(format!("NATS publisher ({})", self.nats.redacted()));
        let (opts, addrs) = self
            .nats
            .connect_options(state.clone(), "publish", false)
            .map_err(|e| e.to_string())?;
        // Never blocks a publish: at most the window and a marker per message are pending.
        let capacity = 2 * self.window_cap + 64;
        let opts = opts.client_capacity(capacity);
        let rt = runtime("prx-nats-conn").map_err(|e| e.to_string())?;
        let (jetstream, echo_subject) = (self.jetstream, self.echo_subject.clone());
        let made = rt.spawn(async move {
            let client = opts.connect(addrs).await.map_err(|e| e.to_string())?;
            let js = jetstream.then(|| {
                jetstream::ContextBuilder::new()
                    .ack_timeout(Duration::from_secs(5))
                    .max_ack_inflight(capacity)
                    .build(client.clone())
            });
            let echo = client
                .subscribe(echo_subject)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((client, js, echo))
        });
        match made.await {
            Ok(Ok((client, js, echo))) => Ok(Conn {
                rt: Some(rt),
                client,
                js,
                echo,
                state,
            }),
            Ok(Err(e)) => {
                rt.shutdown_background();
                Err(e)
            }
            Err(e) => {
                rt.shutdown_background();
                Err(e.to_string())
            }
        }
    }

    /// Creates the stream if it does not exist; true once it does (or another stream holds
    /// the subjects: the acks will say).
    async fn ensure_stream(
        &self,
        js: &jetstream::Context,
        conn: &Conn,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        let Some(name) = &self.stream else {
            return true;
        };
        let config = jetstream::stream::Config {
            name: name.to_string(),
            subjects: vec![self.subjects.clone()],
            storage: jetstream::stream::StorageType::File,
            max_age: STREAM_MAX_AGE,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        let mut said = false;
        loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(_) => return true,
                // The server said no (another stream holds these subjects, a limit…): publish
                // anyway; the acks say which stream stores them, or why not.
                Err(e)
                    if matches!(
                        e.kind(),
                        jetstream::context::CreateStreamErrorKind::JetStream(_)
                    ) =>
                {
                    tracing::warn!(
                        "NATS publisher: JetStream stream {name:?} for {}: {e}; publishing without creating it",
                        self.subjects
                    );
                    return true;
                }
                Err(e) => {
                    if !said {
                        said = true;
                        tracing::warn!(
                            "NATS publisher: JetStream stream {name:?} for {}: {e}; retrying",
                            self.subjects
                        );
                    }
                    if stop.borrow().is_some() || conn.lost() {
                        return false;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }
}
