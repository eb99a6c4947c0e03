//! The export side: a bounded queue of finished spans, and the exporter thread (a 1-thread
//! tokio runtime) that sends them in batches over OTLP/HTTP protobuf, retrying with backoff
//! (ARCHITECTURE.md § OpenTelemetry traces).

use super::options::{Endpoint, OtlpOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest wait between two tries of one batch (`Retry-After` is honoured up to it).
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// How often a request or a backoff wait looks at the shutdown deadline.
const STOP_POLL: Duration = Duration::from_millis(20);
/// The most of a response body read (a partial-success message or an error text).
const MAX_RESPONSE: usize = 64 * 1024;

/// The export counters, shared by the span builder's thread and the exporter.
#[derive(Default)]
pub(crate) struct Counters {
    pub spans: AtomicU64,
    pub exported: AtomicU64,
    pub rejected: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_retries: AtomicU64,
    pub dropped_shutdown: AtomicU64,
    pub requests: AtomicU64,
    pub retries: AtomicU64,
}

fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

#[derive(Default)]
struct State {
    spans: VecDeque<Span>,
    /// Spans taken in the batch being sent or retried (they count against the bound).
    in_flight: usize,
    stop: Option<Instant>,
}

/// The bounded export queue: `push` never waits (beyond the lock the exporter holds for a
/// `drain`), and a full queue drops the new spans, counted.
pub(crate) struct Queue {
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    capacity: usize,
    batch: usize,
    pub counters: Counters,
}

impl Queue {
    pub(crate) fn new(capacity: usize, batch: usize) -> Queue {
        Queue {
            state: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            capacity,
            batch,
            counters: Counters::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, spans: &mut Vec<Span>) {
        if spans.is_empty() {
            return;
        }
        add(&self.counters.spans, spans.len());
        let mut st = self.lock();
        let room = self.capacity.saturating_sub(st.spans.len() + st.in_flight);
        let take = spans.len().min(room);
        add(&self.counters.dropped_queue_full, spans.len() - take);
        st.spans.extend(spans.drain(..take));
        spans.clear();
        let full = st.spans.len() >= self.batch;
        drop(st);
        if full {
            self.wake.notify_one();
        }
    }

    /// Spans queued or in a request.
    pub(crate) fn queued(&self) -> u64 {
        let st = self.lock();
        (st.spans.len() + st.in_flight) as u64
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity as u64
    }

    /// Everything queued now goes out at once; what is left at `deadline` is dropped, counted.
    pub(crate) fn stop(&self, deadline: Instant) {
        self.lock().stop = Some(deadline);
        self.wake.notify_one();
    }

    fn deadline(&self) -> Option<Instant> {
        self.lock().stop
    }

    /// The next batch: a full one, or what is there when `interval` has passed since the last,
    /// or everything once stopping. `None`: stopped and empty.
    async fn next_batch(&self, last: &mut Instant, interval: Duration) -> Option<Vec<Span>> {
        loop {
            {
                let mut st = self.lock();
                let due = !st.spans.is_empty() && last.elapsed() >= interval;
                if st.spans.len() >= self.batch || due || st.stop.is_some() {
                    if st.spans.is_empty() {
                        return None;
                    }
                    let n = st.spans.len().min(self.batch);
                    st.in_flight += n;
                    *last = Instant::now();
                    return Some(st.spans.drain(..n).collect());
                }
            }
            let wait = interval.saturating_sub(last.elapsed()).max(STOP_POLL);
            let _ = tokio::time::timeout(wait, self.wake.notified()).await;
        }
    }

    fn done(&self, n: usize) {
        let mut st = self.lock();
        st.in_flight -= n;
    }
}

/// What one try of a request came to.
enum Try {
    Accepted { rejected: usize },
    Retry(Option<Duration>),
    Refused(u16),
}

/// The exporter's connection and request template.
pub(crate) struct Exporter {
    endpoint: Endpoint,
    headers: Vec<(HeaderName, HeaderValue)>,
    resource: Resource,
    interval: Duration,
    timeout: Duration,
    retry_for: Duration,
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl Exporter {
    pub(crate) fn new(o: &OtlpOptions) -> Exporter {
        use super::attrs::{kv, s};
        let headers = o
            .headers
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::from_bytes(k.as_bytes()).ok()?,
                    HeaderValue::from_str(v).ok()?,
                ))
            })
            .collect();
        let mut attributes = vec![
            kv("service.name", s(&o.service_name)),
            kv("telemetry.sdk.name", s("prx-hooks")),
            kv("telemetry.sdk.language", s("rust")),
            kv("telemetry.sdk.version", s(env!("CARGO_PKG_VERSION"))),
        ];
        attributes.extend(o.resource.iter().map(|(k, v)| kv(k, s(v))));
        Exporter {
            endpoint: o.endpoint.clone(),
            headers,
            resource: Resource {
                attributes,
                ..Default::default()
            },
            interval: o.interval,
            timeout: o.timeout,
            retry_for: o.retry_for,
            conn: None,
        }
    }

    /// Exports until the queue is stopped and empty.
    pub(crate) async fn run(mut self, queue: Arc<Queue>) {
        let mut last = Instant::now();
        while let Some(batch) = queue.next_batch(&mut last, self.interval).await {
            let n = batch.len();
            let body = self.encode(batch);
            self.send(&queue, body, n).await;
            queue.done(n);
        }
    }

    fn encode(&self, spans: Vec<Span>) -> Bytes {
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "prx-hooks".to_string(),
                        version: env!("CARGO_PKG_VERSION").to_string(),
                        ..Default::default()
                    }),
                    spans,
                    schema_url: format!(
                        "https://opentelemetry.io/schemas/{}",
                        super::SEMCONV_VERSION
                    ),
                }],
                schema_url: String::new(),
            }],
        };
        Bytes::from(req.encode_to_vec())
    }

    /// Sends one batch, retrying as the OTLP spec says (429, 502, 503, 504, transport errors)
    /// with backoff, until accepted, refused, `retry_for` or the shutdown deadline.
    async fn send(&mut self, queue: &Queue, body: Bytes, n: usize) {
        let c = &queue.counters;
        let first = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        loop {
            if queue.deadline().is_some_and(|d| Instant::now() >= d) {
                add(&c.dropped_shutdown, n);
                return;
            }
            add(&c.requests, 1);
            let wait = match self.try_once(queue, body.clone()).await {
                Some(Try::Accepted { rejected }) => {
                    let rejected = rejected.min(n);
                    add(&c.exported, n - rejected);
                    add(&c.rejected, rejected);
                    return;
                }
                Some(Try::Refused(status)) => {
                    tracing::warn!(
                        "OTLP receiver {} refused {n} span(s): HTTP {status}",
                        self.endpoint
                    );
                    add(&c.rejected, n);
                    return;
                }
                Some(Try::Retry(after)) => after.unwrap_or(backoff).min(MAX_BACKOFF),
                None => backoff,
            };
            if first.elapsed() + wait > self.retry_for {
                tracing::warn!(
                    "OTLP receiver {}: gave up on {n} span(s) after {:?}",
                    self.endpoint,
                    first.elapsed()
                );
                add(&c.dropped_retries, n);
                return;
            }
            add(&c.retries, 1);
            sleep_until_stop(queue, wait).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One try, bounded by the request timeout and the shutdown deadline. `None`: a transport
    /// error or a timeout (the connection is dropped).
    async fn try_once(&mut self, queue: &Queue, body: Bytes) -> Option<Try> {
        let start = Instant::now();
        let timeout = self.timeout;
        let result = {
            let mut attempt = std::pin::pin!(self.post(body));
            loop {
                match tokio::time::timeout(STOP_POLL, &mut attempt).await {
                    Ok(r) => break Some(r),
                    Err(_) => {
                        let past = queue.deadline().is_some_and(|d| Instant::now() >= d);
                        if past || start.elapsed() >= timeout {
                            break None;
                        }
                    }
                }
            }
        };
        match result {
            Some(Ok(t)) => Some(t),
            Some(Err(e)) => {
                tracing::debug!("OTLP receiver {}: {e}", self.endpoint);
                self.conn = None;
                None
            }
            None => {
                self.conn = None;
                None
            }
        }
    }

    async fn post(&mut self, body: Bytes) -> Result<Try, String> {
        if self.conn.as_ref().is_none_or(|c| c.is_closed()) {
            self.conn = Some(self.connect().await?);
        }
        let conn = self.conn.as_mut().expect("connected");
        conn.ready().await.map_err(|e| e.to_string())?;
        let mut req = hyper::Request::post(self.endpoint.path.as_str())
            .header(hyper::header::HOST, self.endpoint.authority())
            .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
            .header(
                hyper::header::USER_AGENT,
                concat!("prx-hooks/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        for (k, v) in &self.headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let resp = conn.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = Limited::new(resp.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(match status {
            200..=299 => {
                let rejected = ExportTraceServiceResponse::decode(body)
                    .ok()
                    .and_then(|r| r.partial_success)
                    .map_or(0, |p| p.rejected_spans.max(0) as usize);
                Try::Accepted { rejected }
            }
            429 | 502 | 503 | 504 => Try::Retry(retry_after),
            other => Try::Refused(other),
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let addr = (self.endpoint.host.as_str(), self.endpoint.port);
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(send)
    }
}

/// Sleeps `wait`, or until the shutdown deadline passes.
async fn sleep_until_stop(queue: &Queue, wait: Duration) {
    let end = Instant::now() + wait;
    loop {
        let now = Instant::now();
        if now >= end || queue.deadline().is_some_and(|d| now >= d) {
            return;
        }
        tokio::time::sleep((end - now).min(STOP_POLL)).await;
    }
}
