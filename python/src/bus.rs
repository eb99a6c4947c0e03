//! `Bus`, `Subscription`, `Message`: the in-process bus from Python.
//!
//! Waiting (`recv`, iteration) releases the GIL, in slices of [`SLICE`]: between two, the
//! waiting thread takes the GIL back to run signal handlers, so Ctrl-C interrupts it.

use crate::errors::{bus_error, closed_error, fork_error};
use crate::fork::Owned;
use crate::text::utf8;
use crate::{json_loads, seconds, tojson};
use prx_hooks::bus::{RecvTimeoutError, TryRecvError};
use prx_hooks::{Bus, BusError, Message, Subscription};
use pyo3::exceptions::{PyStopIteration, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long a wait runs without the GIL before it looks at signals.
const SLICE: Duration = Duration::from_millis(50);

pub(crate) fn bus_err(e: BusError) -> PyErr {
    match e {
        BusError::Closed => closed_error(e.to_string()),
        e => bus_error(e.to_string()),
    }
}

/// The in-process event bus (`hooks.bus`): subscribe to topics, publish custom ones.
#[pyclass(frozen, module = "prx_hooks", name = "Bus")]
pub struct PyBus {
    bus: Owned<Bus>,
}

impl PyBus {
    pub(crate) fn new(bus: Bus) -> PyBus {
        PyBus {
            bus: Owned::new(bus),
        }
    }

    fn bus(&self) -> PyResult<&Bus> {
        self.bus.get().ok_or_else(|| fork_error("Bus"))
    }
}

#[pymethods]
impl PyBus {
    /// Subscribes to `pattern`: an exact topic, a prefix ending in `.*`, or `*`. `capacity`:
    /// the queue's size (default `subscriber_queue`); `timeout`: iteration ends after this
    /// many seconds without a message (default: only when the bus shuts down).
    #[pyo3(signature = (pattern, *, capacity=None, timeout=None))]
    fn subscribe(
        &self,
        pattern: &str,
        capacity: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<PySubscription> {
        let bus = self.bus()?;
        let timeout = timeout.map(|t| seconds(t, "timeout")).transpose()?;
        let sub = match capacity {
            Some(c) => bus.subscribe_with_capacity(pattern, c),
            None => bus.subscribe(pattern),
        }
        .map_err(bus_err)?;
        Ok(PySubscription {
            sub: Owned::new(Mutex::new(Some(Arc::new(sub)))),
            timeout,
        })
    }

    /// Publishes `payload` under a custom `topic` to every matching subscriber; returns how
    /// many took it. `payload`: JSON text (str) or a value (dict, list, …) written as JSON.
    fn publish(&self, topic: &str, payload: &Bound<'_, PyAny>) -> PyResult<usize> {
        let bus = self.bus()?;
        let mut buf = String::new();
        let text = match payload.cast::<PyString>() {
            Ok(s) => utf8(s).map_err(|_| crate::text::surrogate_error("payload"))?,
            Err(_) => {
                // One level below serde_json's limit, as Bus::publish checks (the `--print`
                // envelope wraps the payload).
                tojson::write(&mut buf, payload, 126).map_err(|r| r.into_err("payload"))?;
                &buf
            }
        };
        bus.publish(topic, text).map_err(bus_err)
    }

    /// Every subscription still held: `[{"id", "pattern", "delivered", "dropped", "queued",
    /// "capacity"}]`.
    fn subscribers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let subs = self.bus()?.subscribers();
        json_loads(py, &serde_json::to_string(&subs).unwrap_or_default())
    }

    /// Whether the hooks have shut down (no more messages will come).
    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self.bus()?.is_closed())
    }
}

/// A subscription's bounded queue of messages. Iterate it (`for msg in sub`), or
/// `recv(timeout)`; `close()` (or leaving a `with` block) unsubscribes.
#[pyclass(frozen, module = "prx_hooks", name = "Subscription")]
pub struct PySubscription {
    /// `None` once closed. The lock is held only to clone the `Arc` out of it.
    sub: Owned<Mutex<Option<Arc<Subscription>>>>,
    timeout: Option<Duration>,
}

impl PySubscription {
    fn sub(&self) -> PyResult<Option<Arc<Subscription>>> {
        let cell = self.sub.get().ok_or_else(|| fork_error("Subscription"))?;
        Ok(cell.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn open(&self) -> PyResult<Arc<Subscription>> {
        self.sub()?
            .ok_or_else(|| closed_error("this subscription was closed"))
    }

    /// Waits at most `timeout` (`None`: until the bus closes), in slices without the GIL.
    fn wait(
        py: Python<'_>,
        sub: &Arc<Subscription>,
        timeout: Option<Duration>,
    ) -> PyResult<Result<Message, RecvTimeoutError>> {
        match sub.try_recv() {
            Ok(m) => return Ok(Ok(m)),
            Err(TryRecvError::Closed) => return Ok(Err(RecvTimeoutError::Closed)),
            Err(_) => {}
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            };
            if slice.is_zero() {
                return Ok(Err(RecvTimeoutError::Timeout));
            }
            match py.detach(|| sub.recv_timeout(slice)) {
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                other => return Ok(other),
            }
        }
    }
}

#[pymethods]
impl PySubscription {
    /// The next message; waits at most `timeout` seconds (`None`: until one comes). Raises
    /// `TimeoutError` when none came in time, `ClosedError` when the hooks have shut down and
    /// the queue is empty.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyMessage> {
        let timeout = timeout.map(|t| seconds(t, "timeout")).transpose()?;
        let sub = self.open()?;
        match Self::wait(py, &sub, timeout)? {
            Ok(m) => Ok(PyMessage::new(m)),
            Err(RecvTimeoutError::Timeout) => Err(PyTimeoutError::new_err(format!(
                "no message on {:?} within {:?}",
                sub.pattern(),
                timeout.unwrap_or_default()
            ))),
            Err(_) => Err(closed_error(
                "the hooks have shut down and this subscription's queue is empty",
            )),
        }
    }

    /// The next message if one is waiting, else `None`. Raises `ClosedError` when the hooks
    /// have shut down and the queue is empty.
    fn try_recv(&self) -> PyResult<Option<PyMessage>> {
        match self.open()?.try_recv() {
            Ok(m) => Ok(Some(PyMessage::new(m))),
            Err(TryRecvError::Closed) => Err(closed_error(
                "the hooks have shut down and this subscription's queue is empty",
            )),
            Err(_) => Ok(None),
        }
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Ends when the bus shuts down (and the queue is empty), when the subscription is
    /// closed, or after `timeout` seconds without a message if the subscription has one.
    fn __next__(&self, py: Python<'_>) -> PyResult<PyMessage> {
        let Some(sub) = self.sub()? else {
            return Err(PyStopIteration::new_err(()));
        };
        match Self::wait(py, &sub, self.timeout)? {
            Ok(m) => Ok(PyMessage::new(m)),
            Err(_) => Err(PyStopIteration::new_err(())),
        }
    }

    /// Unsubscribes (idempotent). Messages still queued are discarded.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let cell = self.sub.get().ok_or_else(|| fork_error("Subscription"))?;
        let sub = cell.lock().unwrap_or_else(|e| e.into_inner()).take();
        // Unsubscribing takes the bus's lock (shared with subscribe and stats): not with the GIL.
        py.detach(move || drop(sub));
        Ok(())
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// Messages waiting in the queue.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.sub()?.map_or(0, |s| s.len()))
    }

    #[getter]
    fn pattern(&self) -> PyResult<String> {
        Ok(self.open()?.pattern().to_string())
    }

    #[getter]
    fn id(&self) -> PyResult<u64> {
        Ok(self.open()?.id())
    }

    #[getter]
    fn capacity(&self) -> PyResult<usize> {
        Ok(self.open()?.capacity())
    }

    /// Messages this subscription lost because its queue was full.
    #[getter]
    fn dropped(&self) -> PyResult<u64> {
        Ok(self.open()?.dropped())
    }

    /// Messages put into this subscription's queue so far.
    #[getter]
    fn delivered(&self) -> PyResult<u64> {
        Ok(self.open()?.delivered())
    }

    #[getter]
    fn closed(&self) -> PyResult<bool> {
        Ok(self.sub()?.is_none())
    }

    fn __repr__(&self) -> String {
        match self.sub() {
            Ok(Some(s)) => format!(
                "<prx_hooks.Subscription {:?} queued={}>",
                s.pattern(),
                s.len()
            ),
            Ok(None) => "<prx_hooks.Subscription (closed)>".into(),
            Err(_) => "<prx_hooks.Subscription (inherited across fork(): unusable)>".into(),
        }
    }
}

/// One bus message: a lifecycle event's payload and metadata, or a custom publication.
#[pyclass(frozen, module = "prx_hooks", name = "Message")]
pub struct PyMessage {
    msg: Message,
    payload: PyOnceLock<Py<PyAny>>,
}

impl PyMessage {
    fn new(msg: Message) -> PyMessage {
        PyMessage {
            msg,
            payload: PyOnceLock::new(),
        }
    }
}

#[pymethods]
impl PyMessage {
    /// `prx.lifecycle.tool_call`, or the custom topic.
    #[getter]
    fn topic(&self) -> &str {
        self.msg.topic()
    }

    /// The payload's JSON text, compact, one line: the bytes hooks and plugins get.
    #[getter]
    fn json(&self) -> &str {
        self.msg.json_str()
    }

    /// The payload parsed (`json.loads` of `json`, once).
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.payload
            .get_or_try_init(py, || {
                Ok::<_, PyErr>(json_loads(py, self.msg.json_str())?.unbind())
            })
            .map(|p| p.bind(py).clone())
    }

    /// The lifecycle event's name (`"tool_call"`), `None` for a custom topic.
    #[getter]
    fn event(&self) -> Option<&'static str> {
        self.msg.event().map(|k| k.name())
    }

    /// The emitter's agent ("" for custom topics).
    #[getter]
    fn agent(&self) -> &str {
        self.msg.agent()
    }

    /// The emitter's session ("" for custom topics).
    #[getter]
    fn session(&self) -> &str {
        self.msg.session()
    }

    /// Per-emitter sequence number from 0, in delivery order (custom topics: the bus's own).
    #[getter]
    fn seq(&self) -> u64 {
        self.msg.seq()
    }

    /// When a worker took the event from the ring (or it was published), seconds since the
    /// Unix epoch (as `time.time()`).
    #[getter]
    fn timestamp(&self) -> f64 {
        self.msg
            .timestamp()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    }

    /// The timestamp as RFC 3339 in UTC with microseconds (`ZERO_HOOK_TIMESTAMP`'s form).
    #[getter]
    fn timestamp_rfc3339(&self) -> String {
        self.msg.timestamp_rfc3339()
    }

    /// Publications deep (0 for lifecycle events).
    #[getter]
    fn depth(&self) -> u8 {
        self.msg.depth()
    }

    /// The message as `prx-hooks run --print` writes it: one line of JSON with topic, event,
    /// agent, session, seq, timestamp and payload.
    fn envelope(&self) -> String {
        let mut out = Vec::new();
        self.msg.write_envelope(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    fn __repr__(&self) -> String {
        format!(
            "<prx_hooks.Message {} agent={:?} session={:?} seq={} {}>",
            self.msg.topic(),
            self.msg.agent(),
            self.msg.session(),
            self.msg.seq(),
            self.msg.json_str()
        )
    }
}
