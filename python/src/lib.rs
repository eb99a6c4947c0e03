//! `prx_hooks._native`: prx-hooks' Rust library as a Python extension module (PyO3). The
//! package `prx_hooks` (python/prx_hooks/) re-exports it with the framework handlers and
//! the exceptions; docs/python.md describes the API and what each call costs.
//!
//! Nothing here runs on the pipeline's threads: sinks (shell hooks, plugins, the bus's
//! fan-out, NATS) never need the GIL. Python threads enter the library through the emitters
//! (GIL held: a ring push never blocks) and through calls that wait (subscriptions,
//! shutdown), which release the GIL and look at signals between slices.

mod bus;
mod decide;
mod emitter;
mod errors;
mod fork;
mod hooks;
mod nats;
mod text;
mod tojson;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::time::Duration;

/// How long a wait runs without the GIL before it looks at signals (Ctrl-C).
const SIGNAL_SLICE: Duration = Duration::from_millis(50);

/// Seconds given as a float, as a `Duration`: non-negative and finite.
pub(crate) fn seconds(s: f64, name: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| PyValueError::new_err(format!("{name}={s}: expected a number of seconds ≥ 0")))
}

/// Runs `f` with every asynchronous signal blocked in this thread, so that the threads it
/// starts inherit a mask that keeps Ctrl-C, SIGTERM and the rest for Python's threads (a
/// signal a Rust thread took would not interrupt the main thread's `sleep` or `select`).
/// Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP) stay unblocked.
pub(crate) fn signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data that sigfillset/sigdelset initialize; pthread_sigmask
    // only changes this thread's mask, and the old one is put back below.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
        ] {
            libc::sigdelset(&mut all, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let r = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        r
    }
}

/// Runs `f` on a thread of its own (signals blocked) and waits for it without the GIL,
/// checking signals every [`SIGNAL_SLICE`]: a KeyboardInterrupt ends the wait (`f` goes on).
pub(crate) fn wait_interruptibly<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = flume::bounded(1);
    signals_blocked(|| {
        std::thread::Builder::new()
            .name("prx-hooks-py-wait".into())
            .spawn(move || {
                let _ = tx.send(f());
            })
    })
    .map_err(|e| errors::build_error(format!("could not start a thread: {e}")))?;
    loop {
        match py.detach(|| rx.recv_timeout(SIGNAL_SLICE)) {
            Ok(v) => return Ok(v),
            Err(flume::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(flume::RecvTimeoutError::Disconnected) => {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "the shutdown thread panicked (a bug: please report it)",
                ));
            }
        }
    }
}

/// `json.loads(text)`: stats and payloads as Python objects, keys in the library's order.
pub(crate) fn json_loads<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    static LOADS: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    LOADS.import(py, "json", "loads")?.call1((text,))
}

/// The library's warnings (a hook that cannot spawn, a plugin that fails to load, a reload
/// refused) go to stderr, filtered by `PRX_HOOKS_LOG` (`RUST_LOG`'s syntax; default `warn`).
/// Written by the thread that logs: never through Python, never needing the GIL.
///
/// Safe across `fork()` (docs/python.md § Processes, forks, signals): the subscriber is
/// [`prx_hooks::logging::StderrLog`], one `write(2)` to fd 2 per record and no lock, where
/// tracing-subscriber's `fmt` on `std::io::stderr` left a forked child waiting for good on the
/// stderr lock of a parent thread caught mid-line. `EnvFilter` with level and target
/// directives takes no lock either; a directive naming a span (`[…]`) would (a map behind a
/// `RwLock`, a per-thread scope behind the `thread_local` crate's global mutex) and could not
/// match anything (the log records no spans), so it is left out, with a warning.
pub(crate) fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use tracing_subscriber::layer::SubscriberExt;
        let var = std::env::var("PRX_HOOKS_LOG").ok();
        let (directives, spans) = log_directives(var.as_deref());
        let filter = tracing_subscriber::EnvFilter::try_new(&directives)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // Colours only for a person at a terminal, and not with NO_COLOR.
        use std::io::IsTerminal;
        let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        let log = prx_hooks::logging::StderrLog::new().ansi(ansi).with(filter);
        // Another Rust extension may have set the global subscriber: keep it.
        if tracing::subscriber::set_global_default(log).is_ok() && !spans.is_empty() {
            tracing::warn!(
                "PRX_HOOKS_LOG: {} left out: the log records no spans",
                spans.join(", ")
            );
        }
    });
}

/// `PRX_HOOKS_LOG` (default `warn`) as `EnvFilter` directives, and the directives naming a
/// span that were left out (see [`init_logging`]). `EnvFilter` splits on every comma too.
fn log_directives(var: Option<&str>) -> (String, Vec<&str>) {
    let Some(var) = var else {
        return ("warn".into(), Vec::new());
    };
    let (spans, kept): (Vec<&str>, Vec<&str>) = var.split(',').partition(|d| d.contains('['));
    (kept.join(","), spans)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fork::install();
    m.add_class::<hooks::PyHooks>()?;
    m.add_class::<emitter::PyEmitter>()?;
    m.add_class::<bus::PyBus>()?;
    m.add_class::<decide::PyVerdict>()?;
    m.add_class::<bus::PySubscription>()?;
    m.add_class::<bus::PyMessage>()?;
    m.add_class::<nats::PyNatsPublish>()?;
    m.add_class::<nats::PyNatsConsume>()?;
    m.add_function(wrap_pyfunction!(hooks::_shutdown_all, m)?)?;
    m.add(
        "EVENTS",
        prx_hooks::EventKind::ALL
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>(),
    )?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
