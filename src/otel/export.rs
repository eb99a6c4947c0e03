//! The export side: a bounded queue of finished spans, and the exporter (a task on the sink's
//! 1-thread tokio runtime, beside the span builder) that sends them in batches over OTLP/HTTP
//! protobuf, retrying with backoff (ARCHITECTURE.md § OpenTelemetry traces).

use super::attrs::{Rec, varint, varint_len};
use super::options::{Endpoint, OtlpOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Requests in flight at once, each over a kept-alive connection of its own. Two let the
/// receiver find the next request waiting instead of sleeping between requests, but gained no
/// measurable rate in `benches/otel.rs` (docs/performance.md § OpenTelemetry export): one, as
/// the SDK's batch processor sends.
pub(crate) const IN_FLIGHT: usize = 1;
/// The longest wait between two tries of one batch (`Retry-After` is honoured up to it).
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// How often a request or a backoff wait looks at the shutdown deadline.
const STOP_POLL: Duration = Duration::from_millis(20);
/// The most of a response body read (a partial-success message or an error text).
const MAX_RESPONSE: usize = 64 * 1024;

/// The export counters, shared by the span builder, the exporter and `OtelSink::stats`.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) spans: AtomicU64,
    pub(crate) exported: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) dropped_queue_full: AtomicU64,
    pub(crate) dropped_retries: AtomicU64,
    pub(crate) dropped_shutdown: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) retries: AtomicU64,
}

fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

/// Finished spans, encoded (each a `ScopeSpans.spans` field), with where each ends: the
/// span builder fills one per burst, the queue holds them, the exporter copies batches out of
/// them into request bodies and gives them back for reuse.
#[derive(Default, Debug)]
pub(crate) struct Chunk {
    pub(crate) bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Chunk {
    pub(crate) fn push(&mut self, rec: &Rec) {
        rec.encode(&mut self.bytes);
        self.ends.push(self.bytes.len());
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.ends[i - 1] }
    }

    /// Keeps the first `n` spans.
    fn truncate(&mut self, n: usize) {
        if n < self.len() {
            self.bytes.truncate(self.start(n));
            self.ends.truncate(n);
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

/// Chunks kept for reuse (beyond it they are freed), and the largest kept.
const FREE_CHUNKS: usize = 8;
const KEEP_CHUNK: usize = 1 << 20;

struct State {
    /// Queued chunks, each with the index of its first span not yet taken.
    chunks: VecDeque<(Chunk, usize)>,
    /// Spans in `chunks` not yet taken.
    queued: usize,
    /// Spans taken in the batch being sent or retried (they count against the bound).
    in_flight: usize,
    stop: Option<Instant>,
    free: Vec<Chunk>,
    /// When the last batch was taken (a partial batch waits `interval` from it).
    last: Instant,
    /// When the batch being sent (the oldest, with several senders) was taken; `None` while
    /// no batch is out.
    sending: Option<Instant>,
}

impl Default for State {
    fn default() -> State {
        State {
            chunks: VecDeque::new(),
            queued: 0,
            in_flight: 0,
            stop: None,
            free: Vec::new(),
            last: Instant::now(),
            sending: None,
        }
    }
}

/// The bounded export queue: `push` never waits (beyond the lock the exporter holds to copy a
/// batch out), and a full queue drops the new spans, counted.
pub(crate) struct Queue {
    state: Mutex<State>,
    wake: tokio::sync::Notify,
    capacity: usize,
    batch: usize,
    /// How long a batch may stay out before the exporter counts as stalled (the request
    /// timeout).
    stall: Duration,
    pub(crate) counters: Counters,
}

impl Queue {
    pub(crate) fn new(capacity: usize, batch: usize, stall: Duration) -> Queue {
        Queue {
            state: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            capacity,
            batch,
            stall,
            counters: Counters::default(),
        }
    }

    /// Whether a paced producer should wait for the exporter: the queue, with `coming` more
    /// spans on their way to it, is more than half full, and the exporter is not stalled (a
    /// receiver that takes its requests gets the time it needs; waiting for one that does not
    /// would only stop the producer). `emit` never looks at this.
    pub(crate) fn lagging(&self, coming: usize) -> bool {
        let st = self.lock();
        st.queued + st.in_flight + coming > self.capacity / 2 && !self.stalled_in(&st)
    }

    /// Whether the batch being sent has been out for the request timeout or longer without
    /// being settled (the receiver is down, refusing, or not answering: retries go on).
    pub(crate) fn stalled(&self) -> bool {
        self.stalled_in(&self.lock())
    }

    fn stalled_in(&self, st: &State) -> bool {
        st.sending.is_some_and(|t| t.elapsed() >= self.stall)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the spans of `chunk` (what does not fit is dropped, counted); `chunk` is left
    /// empty, with a reused buffer.
    pub(crate) fn push(&self, chunk: &mut Chunk) {
        if chunk.is_empty() {
            return;
        }
        let n = chunk.len();
        add(&self.counters.spans, n);
        let mut st = self.lock();
        let room = self.capacity.saturating_sub(st.queued + st.in_flight);
        let take = n.min(room);
        add(&self.counters.dropped_queue_full, n - take);
        let mut spare = st.free.pop().unwrap_or_default();
        if take == 0 {
            chunk.clear();
            st.free.push(spare);
            return;
        }
        chunk.truncate(take);
        std::mem::swap(chunk, &mut spare);
        st.chunks.push_back((spare, 0));
        st.queued += take;
        let full = st.queued >= self.batch;
        drop(st);
        if full {
            self.wake.notify_one();
        }
    }

    /// Spans queued or in a request.
    pub(crate) fn queued(&self) -> u64 {
        let st = self.lock();
        (st.queued + st.in_flight) as u64
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity as u64
    }

    /// Everything queued now goes out at once; what is left at `deadline` is dropped, counted.
    pub(crate) fn stop(&self, deadline: Instant) {
        self.lock().stop = Some(deadline);
        // Every sender waiting now, and a permit for one between two looks.
        self.wake.notify_waiters();
        self.wake.notify_one();
    }

    fn deadline(&self) -> Option<Instant> {
        self.lock().stop
    }

    /// Copies up to `batch` spans into `body`; how many.
    fn take(&self, st: &mut State, body: &mut Vec<u8>) -> usize {
        let mut n = 0;
        while n < self.batch {
            let Some((chunk, first)) = st.chunks.front_mut() else {
                break;
            };
            let k = (chunk.len() - *first).min(self.batch - n);
            if k == 0 {
                break;
            }
            body.extend_from_slice(&chunk.bytes[chunk.start(*first)..chunk.ends[*first + k - 1]]);
            *first += k;
            n += k;
            if *first == chunk.len() {
                let (mut done, _) = st.chunks.pop_front().expect("a front chunk");
                if st.free.len() < FREE_CHUNKS && done.bytes.capacity() <= KEEP_CHUNK {
                    done.clear();
                    st.free.push(done);
                }
            }
        }
        st.queued -= n;
        st.in_flight += n;
        if n > 0 {
            st.sending.get_or_insert_with(Instant::now);
        }
        n
    }

    /// The next batch, appended to `body`: a full one, or what is there when `interval` has
    /// passed since the last batch taken (by any sender), or everything once stopping. `None`:
    /// stopped and empty.
    async fn next_batch(&self, interval: Duration, body: &mut Vec<u8>) -> Option<usize> {
        loop {
            let since = {
                let mut st = self.lock();
                let due = st.queued > 0 && st.last.elapsed() >= interval;
                if st.queued >= self.batch || due || st.stop.is_some() {
                    if st.queued == 0 {
                        return None;
                    }
                    st.last = Instant::now();
                    let n = self.take(&mut st, body);
                    let more = st.queued >= self.batch || (st.stop.is_some() && st.queued > 0);
                    drop(st);
                    if more {
                        // Another full batch: the other sender takes it.
                        self.wake.notify_one();
                    }
                    return Some(n);
                }
                st.last
            };
            let wait = interval.saturating_sub(since.elapsed()).max(STOP_POLL);
            let _ = tokio::time::timeout(wait, self.wake.notified()).await;
        }
    }

    fn done(&self, n: usize) {
        let mut st = self.lock();
        st.in_flight -= n;
        if st.in_flight == 0 {
            st.sending = None;
        }
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
    frame: Frame,
    interval: Duration,
    timeout: Duration,
    retry_for: Duration,
    conn: Option<SendRequest<Full<Bytes>>>,
}

impl Exporter {
    pub(crate) fn new(o: &OtlpOptions) -> Exporter {
        use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
        let kv = |k: &str, v: &str| KeyValue {
            key: k.to_string(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(v.to_string())),
            }),
            ..Default::default()
        };
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
            kv("service.name", &o.service_name),
            kv("telemetry.sdk.name", "prx-hooks"),
            kv("telemetry.sdk.language", "rust"),
            kv("telemetry.sdk.version", env!("CARGO_PKG_VERSION")),
        ];
        attributes.extend(o.resource.iter().map(|(k, v)| kv(k, v)));
        Exporter {
            endpoint: o.endpoint.clone(),
            headers,
            frame: Frame::new(Resource {
                attributes,
                ..Default::default()
            }),
            interval: o.interval,
            timeout: o.timeout,
            retry_for: o.retry_for,
            conn: None,
        }
    }

    /// Exports until the queue is stopped and empty, [`IN_FLIGHT`] requests at a time (this
    /// sender and its copies, each with a connection of its own).
    pub(crate) async fn run_all(self, queue: Arc<Queue>) {
        let senders: Vec<_> = (1..IN_FLIGHT)
            .map(|_| tokio::spawn(self.copy().run(queue.clone())))
            .collect();
        self.run(queue).await;
        for s in senders {
            let _ = s.await;
        }
    }

    /// A sender like this one, without its connection.
    fn copy(&self) -> Exporter {
        Exporter {
            endpoint: self.endpoint.clone(),
            headers: self.headers.clone(),
            frame: self.frame.clone(),
            interval: self.interval,
            timeout: self.timeout,
            retry_for: self.retry_for,
            conn: None,
        }
    }

    /// One sender: exports until the queue is stopped and empty.
    async fn run(mut self, queue: Arc<Queue>) {
        loop {
            let mut body = Vec::with_capacity(self.frame.body_hint);
            body.resize(self.frame.room, 0);
            let Some(n) = queue.next_batch(self.interval, &mut body).await else {
                break;
            };
            self.frame.body_hint = self.frame.body_hint.max(body.len() + 64);
            let body = self.frame.finish(body);
            self.send(&queue, body, n).await;
            queue.done(n);
        }
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

/// The request around the spans: `ExportTraceServiceRequest { resource_spans: [ResourceSpans
/// { resource, scope_spans: [ScopeSpans { scope, spans, schema_url }] }] }`, its fixed parts
/// encoded once. A body is the spans, copied by the queue after `room` bytes left for the
/// request's head, which is written just before them once their length is known.
#[derive(Clone)]
struct Frame {
    /// `ResourceSpans.resource` (tag 1), encoded.
    resource: Vec<u8>,
    /// `ScopeSpans.scope` (tag 1), encoded.
    scope: Vec<u8>,
    /// `ScopeSpans.schema_url` (tag 3), encoded.
    schema: Vec<u8>,
    /// Room for the head: the two keys and lengths (at most 1 + 10 bytes each) and the
    /// resource and scope.
    room: usize,
    /// The capacity to give the next body (the largest seen).
    body_hint: usize,
}

impl Frame {
    fn new(resource: Resource) -> Frame {
        let field = |tag: u32, m: &dyn Fn(&mut Vec<u8>)| {
            let mut v = Vec::new();
            m(&mut v);
            let mut out = vec![((tag as u8) << 3) | 2];
            varint(&mut out, v.len() as u64);
            out.extend_from_slice(&v);
            out
        };
        let resource = field(1, &|v| resource.encode(v).expect("a Vec grows"));
        let scope = InstrumentationScope {
            name: "prx-hooks".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        };
        let scope = field(1, &|v| scope.encode(v).expect("a Vec grows"));
        let url = format!(
            "https://opentelemetry.io/schemas/{}",
            super::SEMCONV_VERSION
        );
        let schema = field(3, &|v| v.extend_from_slice(url.as_bytes()));
        let room = 2 * 11 + resource.len() + scope.len();
        Frame {
            resource,
            scope,
            schema,
            room,
            body_hint: 64 << 10,
        }
    }

    /// `body` is `room` bytes, then the encoded spans: the whole request.
    fn finish(&self, mut body: Vec<u8>) -> Bytes {
        let spans = body.len() - self.room;
        body.extend_from_slice(&self.schema);
        let scope_spans = self.scope.len() + spans + self.schema.len();
        let resource_spans = self.resource.len() + 1 + varint_len(scope_spans as u64) + scope_spans;
        let mut head = Vec::with_capacity(self.room);
        head.push((1 << 3) | 2);
        varint(&mut head, resource_spans as u64);
        head.extend_from_slice(&self.resource);
        head.push((2 << 3) | 2);
        varint(&mut head, scope_spans as u64);
        head.extend_from_slice(&self.scope);
        let at = self.room - head.len();
        body[at..self.room].copy_from_slice(&head);
        Bytes::from(body).slice(at..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::attrs::Kind;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

    #[test]
    fn batches_are_whole_requests_split_across_chunks_in_order() {
        let q = Queue::new(10, 4, Duration::from_secs(10));
        let mut chunk = Chunk::default();
        let mut rec = Rec::empty();
        for i in 0..12u64 {
            rec.clear();
            rec.begin(Kind::Internal, [1; 16], (i + 1).to_be_bytes(), None, i);
            rec.name2("span", &i.to_string());
            chunk.push(&rec);
            if i % 3 == 2 {
                q.push(&mut chunk);
                assert!(chunk.is_empty());
            }
        }
        // Room for 10: the fourth chunk's last two spans are dropped.
        assert_eq!(q.counters.dropped_queue_full.load(Ordering::Relaxed), 2);
        assert_eq!(q.queued(), 10);
        let frame = Frame::new(Resource::default());
        let mut names = Vec::new();
        loop {
            let mut body = vec![0; frame.room];
            let n = q.take(&mut q.lock(), &mut body);
            if n == 0 {
                break;
            }
            assert!(n <= 4);
            let req = ExportTraceServiceRequest::decode(frame.finish(body)).unwrap();
            let rs = &req.resource_spans[0];
            assert!(rs.resource.is_some());
            let ss = &rs.scope_spans[0];
            assert_eq!(ss.scope.as_ref().unwrap().name, "prx-hooks");
            assert!(ss.schema_url.ends_with(crate::otel::SEMCONV_VERSION));
            assert_eq!(ss.spans.len(), n);
            names.extend(ss.spans.iter().map(|s| s.name.clone()));
            q.done(n);
        }
        let want: Vec<_> = (0..10).map(|i| format!("span {i}")).collect();
        assert_eq!(names, want);
        assert_eq!(q.queued(), 0);
    }

    #[test]
    fn a_paced_producer_waits_for_a_queue_over_half_full_unless_the_exporter_is_stalled() {
        let q = Queue::new(10, 4, Duration::from_millis(50));
        let mut chunk = Chunk::default();
        let mut rec = Rec::empty();
        for i in 0..6u64 {
            rec.clear();
            rec.begin(Kind::Internal, [1; 16], (i + 1).to_be_bytes(), None, i);
            chunk.push(&rec);
        }
        q.push(&mut chunk);
        assert!(q.lagging(0), "6 of 10");
        assert!(!q.stalled(), "nothing out yet");
        let mut body = Vec::new();
        assert_eq!(q.take(&mut q.lock(), &mut body), 4);
        assert!(q.lagging(0), "the batch out counts against the bound");
        std::thread::sleep(Duration::from_millis(80));
        assert!(q.stalled(), "out for longer than the request timeout");
        assert!(!q.lagging(0), "a stalled exporter is not waited for");
        q.done(4);
        assert!(!q.stalled());
        assert!(!q.lagging(0), "2 of 10");
        assert!(q.lagging(4), "2 of 10, 4 more coming");
    }
}
