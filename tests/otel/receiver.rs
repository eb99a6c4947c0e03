//! A real OTLP/HTTP receiver over loopback: hyper's HTTP/1 server decoding the protobuf
//! `ExportTraceServiceRequest` with opentelemetry-proto. It can answer 200, a status (503 with
//! `Retry-After`, 400…), stall, or reset connections, to test the exporter against each.
//! Shared by the tests and `benches/otel.rs`.

#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How the receiver answers a request.
#[derive(Clone, Debug)]
pub enum Mode {
    Accept,
    /// A status and an optional `Retry-After` (seconds).
    Status(u16, Option<u64>),
    /// Waits this long, then accepts.
    Stall(Duration),
    /// Closes the connection without answering.
    Reset,
}

#[derive(Default)]
struct State {
    spans: Mutex<Vec<(Arc<Vec<KeyValue>>, Span)>>,
    grew: Condvar,
    /// Modes for the next requests, then `then`.
    script: Mutex<(VecDeque<Mode>, Option<Mode>)>,
    requests: AtomicU64,
    accepted_requests: AtomicU64,
    headers: Mutex<Vec<(String, String)>>,
    paths: Mutex<Vec<String>>,
}

pub struct Receiver {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        state.script.lock().unwrap().1 = Some(Mode::Accept);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(serve(listener, st, stopped));
            })
            .unwrap();
        Receiver {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The base URL (`--otlp URL`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on every request is answered so.
    pub fn set(&self, mode: Mode) {
        let mut s = self.state.script.lock().unwrap();
        s.0.clear();
        s.1 = Some(mode);
    }

    /// The next requests are answered by `first`, in order, then by `then`.
    pub fn script(&self, first: Vec<Mode>, then: Mode) {
        *self.state.script.lock().unwrap() = (first.into(), Some(then));
    }

    /// Forgets the spans received so far.
    pub fn clear(&self) {
        self.state.spans.lock().unwrap().clear();
    }

    /// The CPU time the receiver's thread has used (so a bench can leave it out).
    pub fn cpu(&self) -> Duration {
        use std::os::unix::thread::JoinHandleExt;
        let t = self.thread.as_ref().expect("running").as_pthread_t();
        let mut clock: libc::clockid_t = 0;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a live thread (joined only in `drop`, which cannot run during this
        // call), and both out-pointers point to locals of the right types.
        let ok = unsafe {
            libc::pthread_getcpuclockid(t, &mut clock) == 0
                && libc::clock_gettime(clock, &mut ts) == 0
        };
        assert!(ok, "the receiver thread's CPU clock");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    pub fn accepted_requests(&self) -> u64 {
        self.state.accepted_requests.load(Ordering::Relaxed)
    }

    /// Every header of every request (names lower-case).
    pub fn headers(&self) -> Vec<(String, String)> {
        self.state.headers.lock().unwrap().clone()
    }

    pub fn paths(&self) -> Vec<String> {
        self.state.paths.lock().unwrap().clone()
    }

    pub fn spans(&self) -> Vec<Span> {
        let s = self.state.spans.lock().unwrap();
        s.iter().map(|(_, s)| s.clone()).collect()
    }

    pub fn span_count(&self) -> usize {
        self.state.spans.lock().unwrap().len()
    }

    /// The resource attributes of the last request.
    pub fn resource(&self) -> Vec<KeyValue> {
        let s = self.state.spans.lock().unwrap();
        s.last().map(|(r, _)| r.to_vec()).unwrap_or_default()
    }

    /// Waits until at least `n` spans arrived (or `timeout`); returns how many did.
    pub fn wait_count(&self, n: usize, timeout: Duration) -> usize {
        let end = Instant::now() + timeout;
        let mut s = self.state.spans.lock().unwrap();
        while s.len() < n && Instant::now() < end {
            s = self
                .state
                .grew
                .wait_timeout(s, Duration::from_millis(5))
                .unwrap()
                .0;
        }
        s.len()
    }

    /// Waits until at least `n` spans arrived (or `timeout`), then returns all.
    pub fn wait_spans(&self, n: usize, timeout: Duration) -> Vec<Span> {
        let end = Instant::now() + timeout;
        let mut s = self.state.spans.lock().unwrap();
        while s.len() < n && Instant::now() < end {
            s = self
                .state
                .grew
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        s.iter().map(|(_, s)| s.clone()).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves until `stopped`; dropping the runtime then ends every connection.
async fn serve(
    listener: std::net::TcpListener,
    state: Arc<State>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(accept(listener, state));
    let _ = stopped.await;
}

async fn accept(listener: tokio::net::TcpListener, state: Arc<State>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let st = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(st.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                .await;
        });
    }
}

fn next_mode(state: &State) -> Mode {
    let mut s = state.script.lock().unwrap();
    match s.0.pop_front() {
        Some(m) => m,
        None => s.1.clone().unwrap_or(Mode::Accept),
    }
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    state.requests.fetch_add(1, Ordering::Relaxed);
    state
        .paths
        .lock()
        .unwrap()
        .push(req.uri().path().to_string());
    {
        let mut h = state.headers.lock().unwrap();
        for (k, v) in req.headers() {
            h.push((k.as_str().to_string(), v.to_str().unwrap_or("").to_string()));
        }
    }
    let mode = next_mode(&state);
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?;
    let answer = |status: u16| {
        Response::builder()
            .status(status)
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    match mode {
        Mode::Accept => {}
        Mode::Stall(d) => tokio::time::sleep(d).await,
        Mode::Reset => return Err(std::io::Error::other("reset by the test receiver")),
        Mode::Status(code, after) => {
            let mut r = answer(code);
            if let Some(s) = after {
                r.headers_mut()
                    .insert("retry-after", s.to_string().parse().unwrap());
            }
            return Ok(r);
        }
    }
    let decoded =
        ExportTraceServiceRequest::decode(body.to_bytes()).map_err(std::io::Error::other)?;
    {
        let mut spans = state.spans.lock().unwrap();
        for rs in decoded.resource_spans {
            let resource = Arc::new(rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push((resource.clone(), span));
                }
            }
        }
    }
    state.accepted_requests.fetch_add(1, Ordering::Relaxed);
    state.grew.notify_all();
    Ok(answer(200))
}

/// A span's attribute as text (strings as they are, other values debug-printed).
pub fn attr(span: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let kv = span.attributes.iter().find(|a| a.key == key)?;
    Some(match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

/// The span tree as text: one line per span, children indented under their parent, in start
/// order (what docs/otel.md § The sample workspace's trace shows).
pub fn render_tree(spans: &[Span]) -> String {
    let mut sorted: Vec<&Span> = spans.iter().collect();
    sorted.sort_by_key(|s| (s.start_time_unix_nano, s.end_time_unix_nano));
    let ids: std::collections::HashSet<&[u8]> =
        sorted.iter().map(|s| s.span_id.as_slice()).collect();
    let mut out = String::new();
    for root in sorted
        .iter()
        .filter(|s| s.parent_span_id.is_empty() || !ids.contains(s.parent_span_id.as_slice()))
    {
        render(&sorted, root, 0, &mut out);
    }
    out
}

fn render(all: &[&Span], span: &Span, depth: usize, out: &mut String) {
    use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
    let ms = (span
        .end_time_unix_nano
        .saturating_sub(span.start_time_unix_nano)) as f64
        / 1e6;
    let error = span
        .status
        .as_ref()
        .is_some_and(|s| s.code == StatusCode::Error as i32);
    let kind = match span.kind {
        3 => "CLIENT",
        _ => "INTERNAL",
    };
    out.push_str(&format!(
        "{}{} [{kind}{}] {ms:.1} ms",
        "  ".repeat(depth),
        span.name,
        if error { ", error" } else { "" },
    ));
    for e in &span.events {
        let reason = e
            .attributes
            .iter()
            .find(|a| a.key == "prx.hook.reason" || a.key == "exception.message")
            .and_then(|a| a.value.as_ref())
            .and_then(|v| match v.value.as_ref()? {
                opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => {
                    Some(s.clone())
                }
                _ => None,
            });
        match reason {
            Some(r) => out.push_str(&format!(" · event {}: {r}", e.name)),
            None => out.push_str(&format!(" · event {}", e.name)),
        }
    }
    out.push('\n');
    for child in all.iter().filter(|c| c.parent_span_id == span.span_id) {
        render(all, child, depth + 1, out);
    }
}
