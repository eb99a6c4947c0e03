//! `Emitter`: one method per lifecycle event, the Python side of `prx_hooks::Emitter::emit`.
//!
//! The cost that matters is the call from Python (docs/python.md § What `emit` costs): arguments are
//! borrowed, not copied (`text::utf8`); dicts are written as JSON text into a buffer of the
//! calling thread ([`tojson`](crate::tojson)); the event goes into the ring with the GIL held
//! (releasing it would cost more than the push, which never blocks and takes no lock).

use crate::errors::{extras_error, fork_error};
use crate::fork::Owned;
use crate::text::{str_arg, type_name, utf8};
use crate::tojson;
use prx_hooks::event::{ARGUMENTS_MAX_DEPTH, EXTRAS_MAX_DEPTH};
use prx_hooks::{Emit, Emitter, Event, EventKind, Extras};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::cell::RefCell;

/// A buffer kept by a thread that grew past this is given back after use.
const KEEP_BYTES: usize = 64 << 10;

/// The JSON text buffers of one thread: `arguments`, extras.
#[derive(Default)]
struct Buffers {
    arguments: String,
    extras: String,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::default();
}

/// Runs `f` with this thread's buffers (fresh ones if they are in use: nothing re-enters
/// here today, as no Python code runs while they are borrowed, but it would not be wrong).
fn with_buffers<R>(f: impl FnOnce(&mut Buffers) -> R) -> R {
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut guard) => {
            let bufs = &mut *guard;
            let r = f(bufs);
            for b in [&mut bufs.arguments, &mut bufs.extras] {
                if b.capacity() > KEEP_BYTES {
                    *b = String::new();
                }
            }
            r
        }
        Err(_) => f(&mut Buffers::default()),
    })
}

/// The JSON text of a `dict` (written into `buf`) or of a `str` (borrowed as is: JSON text
/// the library checks).
fn json_text<'a>(
    v: &'a Bound<'_, PyAny>,
    buf: &'a mut String,
    name: &str,
    max_depth: u32,
) -> PyResult<&'a str> {
    if let Ok(s) = v.cast::<PyString>() {
        return utf8(s).map_err(|_| crate::text::surrogate_error(name));
    }
    if v.cast::<PyDict>().is_ok() {
        buf.clear();
        tojson::write(buf, v, max_depth as usize).map_err(|r| r.into_err(name))?;
        return Ok(buf);
    }
    Err(PyTypeError::new_err(format!(
        "{name}: expected a dict or JSON text (str), got {}",
        type_name(v)
    )))
}

/// An agent session's emitter: `em.tool_call_start("shell", {"cmd": "ls"})`.
///
/// Every method returns what happened to the event: `"queued"` (the workers will deliver it),
/// `"dropped"` (ring full, byte budget exhausted or larger than `max_event_bytes`; counted) or
/// `"skipped"` (nobody listens to this event, or the hooks have shut down). `extras=` (a dict
/// or the JSON text of an object) adds payload fields after the documented ones; `omit=`
/// leaves documented fields out (docs/events.md § Extra fields).
#[pyclass(frozen, module = "prx_hooks", name = "Emitter")]
pub struct PyEmitter {
    em: Owned<Emitter>,
}

impl PyEmitter {
    pub(crate) fn new(em: Emitter) -> PyEmitter {
        PyEmitter { em: Owned::new(em) }
    }

    #[inline(always)]
    fn em(&self) -> PyResult<&Emitter> {
        match self.em.get() {
            Some(em) => Ok(em),
            None => Err(inherited()),
        }
    }

    /// Emits `event`: plain `emit` without extras (the common case, inlined), else with this
    /// thread's extras buffer.
    #[inline(always)]
    fn send<'py>(
        &self,
        py: Python<'py>,
        em: &Emitter,
        event: Event<'_>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        if extras.is_none() && omit.is_none() {
            return Ok(outcome(py, em.emit(event)));
        }
        with_buffers(|b| send_with_extras(py, em, event, extras, omit, &mut b.extras))
    }
}

#[cold]
#[inline(never)]
fn inherited() -> PyErr {
    fork_error("Emitter")
}

/// `emit_with_extras`, `extras=` written into `buf` when it is a dict.
#[inline(never)]
fn send_with_extras<'py>(
    py: Python<'py>,
    em: &Emitter,
    event: Event<'_>,
    extras: Option<&Bound<'py, PyAny>>,
    omit: Option<&Bound<'py, PyAny>>,
    buf: &mut String,
) -> PyResult<Bound<'py, PyString>> {
    let fields = match extras {
        Some(x) if !x.is_none() => json_text(x, buf, "extras", EXTRAS_MAX_DEPTH)?,
        _ => "",
    };
    let names = omitted(omit)?;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    em.emit_with_extras(event, &Extras::fields(fields).omit(&names))
        .map(|e| outcome(py, e))
        .map_err(|e| extras_error(e.to_string()))
}

/// The names given as `omit=` (a str or an iterable of str).
fn omitted(omit: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(omit) = omit.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    if let Ok(s) = omit.cast::<PyString>() {
        return Ok(vec![str_arg(s.as_any(), "omit")?.to_string()]);
    }
    let mut names = Vec::new();
    for item in omit.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "omit: expected field names (str or an iterable of str), got {}",
            type_name(omit)
        ))
    })? {
        names.push(str_arg(&item?, "omit")?.to_string());
    }
    Ok(names)
}

fn outcome(py: Python<'_>, e: Emit) -> Bound<'_, PyString> {
    match e {
        Emit::Queued => intern!(py, "queued"),
        Emit::Skipped => intern!(py, "skipped"),
        _ => intern!(py, "dropped"),
    }
    .clone()
}

/// A count or a duration in milliseconds: a non-negative int.
#[inline(always)]
fn count(v: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if v.is_exact_instance_of::<pyo3::types::PyInt>()
        && let Ok(n) = v.extract::<u64>()
    {
        return Ok(n);
    }
    count_slow(v, name)
}

#[cold]
#[inline(never)]
fn count_slow(v: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    if v.cast::<pyo3::types::PyBool>().is_ok() || v.cast::<pyo3::types::PyInt>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "{name}: expected int, got {}",
            type_name(v)
        )));
    }
    v.extract::<u64>().map_err(|_| {
        PyValueError::new_err(format!(
            "{name}: expected an int from 0 to 2**64 - 1, got {}",
            v.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// A `success` flag: exactly True or False.
#[inline(always)]
fn flag(v: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    // SAFETY: the two singletons are only compared by address.
    let (t, f) = unsafe { (ffi::Py_True(), ffi::Py_False()) };
    if v.as_ptr() == t {
        Ok(true)
    } else if v.as_ptr() == f {
        Ok(false)
    } else {
        Err(not_bool(v, name))
    }
}

#[cold]
#[inline(never)]
fn not_bool(v: &Bound<'_, PyAny>, name: &str) -> PyErr {
    PyTypeError::new_err(format!("{name}: expected bool, got {}", type_name(v)))
}

#[pymethods]
impl PyEmitter {
    /// `agent_start {agent, session}`; both default to the emitter's own.
    #[pyo3(signature = (agent=None, session=None, *, extras=None, omit=None))]
    fn agent_start<'py>(
        &self,
        py: Python<'py>,
        agent: Option<&Bound<'py, PyAny>>,
        session: Option<&Bound<'py, PyAny>>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let agent = match agent {
            Some(a) if !a.is_none() => str_arg(a, "agent")?,
            _ => em.agent(),
        };
        let session = match session {
            Some(s) if !s.is_none() => str_arg(s, "session")?,
            _ => em.session(),
        };
        self.send(py, em, Event::AgentStart { agent, session }, extras, omit)
    }

    /// `agent_end {success, messages_count}`.
    #[pyo3(signature = (success, messages_count, *, extras=None, omit=None))]
    fn agent_end<'py>(
        &self,
        py: Python<'py>,
        success: &Bound<'py, PyAny>,
        messages_count: &Bound<'py, PyAny>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let ev = Event::AgentEnd {
            success: flag(success, "success")?,
            messages_count: count(messages_count, "messages_count")?,
        };
        self.send(py, em, ev, extras, omit)
    }

    /// `llm_request {provider, model, messages_count}`.
    #[pyo3(signature = (provider, model, messages_count, *, extras=None, omit=None))]
    fn llm_request<'py>(
        &self,
        py: Python<'py>,
        provider: &Bound<'py, PyAny>,
        model: &Bound<'py, PyAny>,
        messages_count: &Bound<'py, PyAny>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let ev = Event::LlmRequest {
            provider: str_arg(provider, "provider")?,
            model: str_arg(model, "model")?,
            messages_count: count(messages_count, "messages_count")?,
        };
        self.send(py, em, ev, extras, omit)
    }

    /// `llm_response {provider, model, duration_ms, success}`.
    #[pyo3(signature = (provider, model, duration_ms, success, *, extras=None, omit=None))]
    #[allow(clippy::too_many_arguments)]
    fn llm_response<'py>(
        &self,
        py: Python<'py>,
        provider: &Bound<'py, PyAny>,
        model: &Bound<'py, PyAny>,
        duration_ms: &Bound<'py, PyAny>,
        success: &Bound<'py, PyAny>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let ev = Event::LlmResponse {
            provider: str_arg(provider, "provider")?,
            model: str_arg(model, "model")?,
            duration_ms: count(duration_ms, "duration_ms")?,
            success: flag(success, "success")?,
        };
        self.send(py, em, ev, extras, omit)
    }

    /// `tool_call_start {tool, arguments}`: `arguments` a dict (written as JSON here) or JSON
    /// text (a valid object is embedded as is, anything else becomes a JSON string, as in
    /// Rust); `None` is `{}`.
    #[pyo3(signature = (tool, arguments=None, *, extras=None, omit=None))]
    fn tool_call_start<'py>(
        &self,
        py: Python<'py>,
        tool: &Bound<'py, PyAny>,
        arguments: Option<&Bound<'py, PyAny>>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let tool = str_arg(tool, "tool")?;
        let text = match arguments {
            None => Some("{}"),
            Some(a) => crate::text::exact_str(a),
        };
        if let Some(arguments) = text {
            return self.send(
                py,
                em,
                Event::ToolCallStart { tool, arguments },
                extras,
                omit,
            );
        }
        // A dict (or None, or a str subclass): written into this thread's buffer.
        with_buffers(|b| {
            let arguments = match arguments {
                Some(a) if !a.is_none() => {
                    json_text(a, &mut b.arguments, "arguments", ARGUMENTS_MAX_DEPTH)?
                }
                _ => "{}",
            };
            let ev = Event::ToolCallStart { tool, arguments };
            if extras.is_none() && omit.is_none() {
                return Ok(outcome(py, em.emit(ev)));
            }
            send_with_extras(py, em, ev, extras, omit, &mut b.extras)
        })
    }

    /// `tool_call {tool, success, output}` (`output` defaults to "").
    #[pyo3(signature = (tool, success, output=None, *, extras=None, omit=None))]
    fn tool_call<'py>(
        &self,
        py: Python<'py>,
        tool: &Bound<'py, PyAny>,
        success: &Bound<'py, PyAny>,
        output: Option<&Bound<'py, PyAny>>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let ev = Event::ToolCall {
            tool: str_arg(tool, "tool")?,
            success: flag(success, "success")?,
            output: match output {
                Some(o) => str_arg(o, "output")?,
                None => "",
            },
        };
        self.send(py, em, ev, extras, omit)
    }

    /// `turn_complete {}`.
    #[pyo3(signature = (*, extras=None, omit=None))]
    fn turn_complete<'py>(
        &self,
        py: Python<'py>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        self.send(py, em, Event::TurnComplete, extras, omit)
    }

    /// `error {component, message}`.
    #[pyo3(signature = (component, message, *, extras=None, omit=None))]
    fn error<'py>(
        &self,
        py: Python<'py>,
        component: &Bound<'py, PyAny>,
        message: &Bound<'py, PyAny>,
        extras: Option<&Bound<'py, PyAny>>,
        omit: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyString>> {
        let em = self.em()?;
        let ev = Event::Error {
            component: str_arg(component, "component")?,
            message: str_arg(message, "message")?,
        };
        self.send(py, em, ev, extras, omit)
    }

    /// Whether an event of this kind (`"tool_call"`) would be delivered anywhere right now.
    fn is_listened(&self, event: &str) -> PyResult<bool> {
        let kind = EventKind::from_name(event).ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown event {event:?}; the events are {}",
                EventKind::ALL.map(|k| k.name()).join(", ")
            ))
        })?;
        Ok(self.em()?.is_listened(kind))
    }

    #[getter]
    fn agent(&self) -> PyResult<&str> {
        Ok(self.em()?.agent())
    }

    #[getter]
    fn session(&self) -> PyResult<&str> {
        Ok(self.em()?.session())
    }

    fn __repr__(&self) -> String {
        match self.em.get() {
            Some(em) => format!(
                "<prx_hooks.Emitter agent={:?} session={:?}>",
                em.agent(),
                em.session()
            ),
            None => "<prx_hooks.Emitter (inherited across fork(): unusable)>".into(),
        }
    }
}
