//! `Hooks`: the pipeline, and with `listen=` the HTTP API, with `nats=` / `from_nats=` the
//! NATS bridge — `HooksBuilder`'s options as keyword arguments, with its defaults.

use crate::bus::PyBus;
use crate::emitter::PyEmitter;
use crate::errors::{build_error, fork_error};
use crate::fork::Owned;
use crate::nats::{PyNatsConsume, PyNatsPublish};
use crate::{json_loads, seconds, signals_blocked, wait_interruptibly};
use prx_hooks::http::{EventStreamOptions, HttpOptions, Listen, Server, token};
use prx_hooks::{Hooks, HooksBuilder, shell};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyInt, PyString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a `Hooks` owns besides the pipeline: the API server and where it was announced.
pub(crate) struct Core {
    hooks: Arc<Hooks>,
    api: Mutex<Option<Api>>,
    address: Option<String>,
    token: Option<String>,
    token_source: Option<String>,
    workspace: Option<PathBuf>,
    shutdown_timeout: Duration,
}

struct Api {
    server: Server,
    /// The address file written into the workspace (removed at shutdown if still ours).
    announced: bool,
}

impl Core {
    /// The API first (it stops taking requests), then the pipeline, within one deadline.
    fn shutdown(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let api = self.api.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut api) = api {
            api.server.shutdown(timeout);
            if let (true, Some(ws)) = (api.announced, &self.workspace) {
                token::remove_address(ws, &api.server.listen().to_string());
            }
        }
        self.hooks
            .shutdown(deadline.saturating_duration_since(Instant::now()));
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // `Hooks`' own Drop would do the pipeline; the API goes first, as in `shutdown`.
        self.shutdown(self.shutdown_timeout);
    }
}

/// The hook system: `Hooks(workspace=".", listen=None, nats=None, …)`.
#[pyclass(frozen, weakref, module = "prx_hooks", name = "Hooks")]
pub struct PyHooks {
    core: Owned<Arc<Core>>,
}

/// Every live `Hooks` of this process (a `weakref.WeakSet`), for the shutdown at exit.
fn live(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    LIVE.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("weakref")?.getattr("WeakSet")?.call0()?.unbind())
    })
    .map(|l| l.bind(py))
}

/// Shuts down every live `Hooks` (registered to run at interpreter exit, before threads are
/// joined: a thread iterating a subscription then ends, rather than keeping the exit
/// waiting). Those inherited across a fork are skipped: they have nothing to stop here.
#[pyfunction]
pub(crate) fn _shutdown_all(py: Python<'_>) -> PyResult<()> {
    let all: Vec<Bound<'_, PyAny>> = live(py)?.try_iter()?.collect::<PyResult<_>>()?;
    for h in all {
        if let Ok(h) = h.cast::<PyHooks>()
            && let Some(core) = h.get().core.get()
        {
            let core = core.clone();
            let timeout = core.shutdown_timeout;
            wait_interruptibly(py, move || core.shutdown(timeout))?;
        }
    }
    Ok(())
}

/// Where `listen=` serves: a port (127.0.0.1), `"IP:PORT"`, `"localhost:PORT"`, a bare port
/// as text, or `"unix:PATH"` — what `prx-hooks run --listen` takes.
fn listen_at(v: &Bound<'_, PyAny>) -> PyResult<Listen> {
    let loopback = |port: u16| Listen::Tcp(([127, 0, 0, 1], port).into());
    if v.cast::<PyInt>().is_ok() {
        return v
            .extract::<u16>()
            .map(loopback)
            .map_err(|_| PyValueError::new_err(format!("listen={v}: a port is 0 to 65535")));
    }
    let Ok(s) = v.cast::<PyString>() else {
        return Err(PyTypeError::new_err(
            "listen: expected a port (int) or an address (str)",
        ));
    };
    let addr = s.to_cow()?;
    let bad = || {
        PyValueError::new_err(format!(
            "listen={addr:?}: expected IP:PORT (\"127.0.0.1:7878\"), \"localhost:PORT\", a \
             port, or \"unix:PATH\""
        ))
    };
    if let Some(path) = addr.strip_prefix("unix:") {
        return if path.is_empty() {
            Err(bad())
        } else {
            Ok(Listen::Unix(path.into()))
        };
    }
    let port = addr.strip_prefix("localhost:").unwrap_or(&addr);
    if let Ok(port) = port.parse::<u16>() {
        return Ok(loopback(port));
    }
    addr.parse().map(Listen::Tcp).map_err(|_| bad())
}

/// `listen=`'s arguments.
struct ApiArgs<'a> {
    listen: &'a Bound<'a, PyAny>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    allow_hosts: Vec<String>,
}

/// Resolves the token as `prx-hooks run --listen` does (token=, else token_file=, else
/// $PRX_HOOKS_TOKEN, else `<workspace>/.prx-hooks/token`, generated when absent), starts the
/// server and writes its address beside the token.
fn start_api(
    hooks: &Arc<Hooks>,
    args: ApiArgs<'_>,
    workspace: Option<&Path>,
) -> PyResult<(Api, String, String, String)> {
    let listen = listen_at(args.listen)?;
    let env = std::env::var(token::TOKEN_ENV).ok();
    let (tok, source) = match args.token {
        Some(t) => (
            token::Token::new(t, "token=").map_err(|e| build_error(e.to_string()))?,
            "API token given as token=".to_string(),
        ),
        None => {
            let ws = match (workspace, &args.token_file, &env) {
                (Some(ws), _, _) => ws,
                (None, Some(_), _) | (None, None, Some(_)) => Path::new("."),
                (None, None, None) => {
                    return Err(build_error(
                        "listen= without a workspace needs token= or token_file= (or \
                         $PRX_HOOKS_TOKEN): the generated token lives in \
                         <workspace>/.prx-hooks/token",
                    ));
                }
            };
            let (tok, source) = token::resolve(args.token_file.as_deref(), env.as_deref(), ws)
                .map_err(|e| build_error(e.to_string()))?;
            (tok, source.to_string())
        }
    };
    let secret = tok.as_str().to_string();
    // The live stream keeps its backlog from the start, as under `prx-hooks run --listen`:
    // `prx-hooks tail --last N` shows what happened before anyone watched.
    let opts = HttpOptions::new(tok)
        .allow_hosts(&args.allow_hosts)
        .events(EventStreamOptions::default().record_always(true));
    let server = signals_blocked(|| match &listen {
        Listen::Tcp(addr) => Server::start(hooks.clone(), opts, *addr),
        Listen::Unix(path) => Server::start_unix(hooks.clone(), opts, path),
    })
    .map_err(|e| build_error(format!("listen={listen}: {e}")))?;
    let address = server.listen().to_string();
    let announced = match workspace {
        Some(ws) => {
            token::write_address(ws, &address).map_err(|e| build_error(e.to_string()))?;
            true
        }
        None => false,
    };
    Ok((Api { server, announced }, address, secret, source))
}

/// `nats=`: a URL or a `NatsPublish`.
fn publish_options(v: &Bound<'_, PyAny>) -> PyResult<prx_hooks::nats::PublishOptions> {
    if let Ok(p) = v.cast::<PyNatsPublish>() {
        return Ok(p.get().options());
    }
    match v.cast::<PyString>() {
        Ok(url) => Ok(PyNatsPublish::from_url(&url.to_cow()?).options()),
        Err(_) => Err(PyTypeError::new_err(
            "nats: expected a URL (str) or prx_hooks.NatsPublish",
        )),
    }
}

/// `from_nats=`: a URL or a `NatsConsume`.
fn consume_options(v: &Bound<'_, PyAny>) -> PyResult<prx_hooks::nats::ConsumeOptions> {
    if let Ok(c) = v.cast::<PyNatsConsume>() {
        return Ok(c.get().options());
    }
    match v.cast::<PyString>() {
        Ok(url) => Ok(PyNatsConsume::from_url(&url.to_cow()?).options()),
        Err(_) => Err(PyTypeError::new_err(
            "from_nats: expected a URL (str) or prx_hooks.NatsConsume",
        )),
    }
}

impl PyHooks {
    fn core(&self) -> PyResult<&Arc<Core>> {
        self.core.get().ok_or_else(|| fork_error("Hooks"))
    }
}

#[pymethods]
impl PyHooks {
    #[new]
    #[pyo3(signature = (
        workspace = Some(PathBuf::from(".")),
        *,
        listen = None,
        token = None,
        token_file = None,
        allow_hosts = Vec::new(),
        nats = None,
        from_nats = None,
        ring_capacity = 65_536,
        workers = 1,
        inline_bytes = 256,
        byte_budget = 64 << 20,
        max_event_bytes = 4 << 20,
        subscriber_queue = 65_536,
        max_publish_bytes = 1 << 20,
        idle_tick = 0.001,
        shutdown_timeout = 2.0,
        reload_debounce = 0.05,
        max_running = shell::ShellLimits::default().max_running,
        queue_per_hook = shell::ShellLimits::default().queue_per_action,
        run_history = shell::ShellLimits::default().history,
        cgroup = None,
        detect_cgroup = false,
        tmp_dir = None,
        harden = false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        workspace: Option<PathBuf>,
        listen: Option<&Bound<'_, PyAny>>,
        token: Option<String>,
        token_file: Option<PathBuf>,
        allow_hosts: Vec<String>,
        nats: Option<&Bound<'_, PyAny>>,
        from_nats: Option<&Bound<'_, PyAny>>,
        ring_capacity: usize,
        workers: usize,
        inline_bytes: usize,
        byte_budget: usize,
        max_event_bytes: usize,
        subscriber_queue: usize,
        max_publish_bytes: usize,
        idle_tick: f64,
        shutdown_timeout: f64,
        reload_debounce: f64,
        max_running: usize,
        queue_per_hook: usize,
        run_history: usize,
        cgroup: Option<PathBuf>,
        detect_cgroup: bool,
        tmp_dir: Option<PathBuf>,
        harden: bool,
    ) -> PyResult<Py<PyHooks>> {
        crate::init_logging();
        crate::fork::install();
        let shutdown_timeout = seconds(shutdown_timeout, "shutdown_timeout")?;
        let shell_limits = shell::ShellLimits {
            max_running,
            queue_per_action: queue_per_hook,
            history: run_history,
            cgroup,
            detect_cgroup,
            tmp_dir,
            ..Default::default()
        };
        let mut builder: HooksBuilder = Hooks::builder()
            .ring_capacity(ring_capacity)
            .workers(workers)
            .inline_bytes(inline_bytes)
            .byte_budget(byte_budget)
            .max_event_bytes(max_event_bytes)
            .subscriber_queue(subscriber_queue)
            .max_publish_bytes(max_publish_bytes)
            .idle_tick(seconds(idle_tick, "idle_tick")?)
            .shutdown_timeout(shutdown_timeout)
            .reload_debounce(seconds(reload_debounce, "reload_debounce")?)
            .shell_limits(shell_limits)
            .harden(harden);
        if let Some(ws) = &workspace {
            builder = builder.workspace(ws);
        }
        if let Some(n) = nats.filter(|n| !n.is_none()) {
            builder = builder.nats_publish(publish_options(n)?);
        }
        if let Some(n) = from_nats.filter(|n| !n.is_none()) {
            builder = builder.nats_consume(consume_options(n)?);
        }
        if listen.is_none() && (token.is_some() || token_file.is_some() || !allow_hosts.is_empty())
        {
            return Err(PyValueError::new_err(
                "token=, token_file= and allow_hosts= configure the HTTP API: give listen= too",
            ));
        }
        // Threads the library starts inherit this thread's signal mask: with every signal
        // blocked, Ctrl-C reaches a Python thread (and interrupts its blocking call), never a
        // worker. Building reads files and may connect: without the GIL.
        let built = py.detach(|| signals_blocked(|| builder.build()));
        let hooks = Arc::new(built.map_err(|e| build_error(e.to_string()))?);
        let (api, address, secret, source) = match listen.filter(|l| !l.is_none()) {
            Some(listen) => {
                let args = ApiArgs {
                    listen,
                    token,
                    token_file,
                    allow_hosts,
                };
                match start_api(&hooks, args, workspace.as_deref()) {
                    Ok((api, a, t, s)) => (Some(api), Some(a), Some(t), Some(s)),
                    Err(e) => {
                        let h = hooks.clone();
                        py.detach(move || h.shutdown(Duration::ZERO));
                        return Err(e);
                    }
                }
            }
            None => (None, None, None, None),
        };
        let core = Arc::new(Core {
            hooks,
            api: Mutex::new(api),
            address,
            token: secret,
            token_source: source,
            workspace,
            shutdown_timeout,
        });
        let obj = Py::new(
            py,
            PyHooks {
                core: Owned::new(core),
            },
        )?;
        live(py)?.call_method1("add", (obj.clone_ref(py),))?;
        Ok(obj)
    }

    /// An emitter for one agent session. Its events keep their order (one ring).
    fn emitter(&self, agent: &str, session: &str) -> PyResult<PyEmitter> {
        Ok(PyEmitter::new(self.core()?.hooks.emitter(agent, session)))
    }

    /// Asks the policies in force (`<workspace>/policies.json`) whether `agent` may go on at
    /// `point` (`"tool_call_start"`, `"prompt"`, `"permission"`), `payload` the lifecycle
    /// payload as hooks receive it (a dict or JSON text). A `Verdict`; `DecideError` for a
    /// payload over the limit or not a JSON object. Counted; nothing is emitted. `within`
    /// (seconds): how long the caller waits; command and WASM policies still running then are
    /// cut and answer their `on_error` (docs/policies.md § Deadlines).
    #[pyo3(signature = (point, agent, payload=None, *, within=None))]
    fn decide(
        &self,
        py: Python<'_>,
        point: &str,
        agent: &str,
        payload: Option<&Bound<'_, PyAny>>,
        within: Option<f64>,
    ) -> PyResult<crate::decide::PyVerdict> {
        crate::decide::decide(py, &self.core()?.hooks, point, agent, payload, within)
    }

    /// The in-process bus.
    #[getter]
    fn bus(&self) -> PyResult<PyBus> {
        Ok(PyBus::new(self.core()?.hooks.bus().clone()))
    }

    /// Every counter (the same keys as `/api/stats` and `prx-hooks run`'s report).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.core()?.hooks.stats();
        let text = serde_json::to_string(&stats).map_err(|e| build_error(e.to_string()))?;
        json_loads(py, &text)
    }

    /// Events in the rings not processed yet.
    fn pending(&self) -> PyResult<usize> {
        Ok(self.core()?.hooks.pending())
    }

    /// Re-reads hooks.json and rescans the plugins now (what SIGHUP does to `prx-hooks run`):
    /// `"applied"`, `"unchanged"` or `"rejected"` (the last good table stays), `None` without
    /// a workspace or after shutdown.
    fn reload(&self, py: Python<'_>) -> PyResult<Option<&'static str>> {
        let hooks = self.core()?.hooks.clone();
        let outcome = py.detach(move || signals_blocked(|| hooks.reload()));
        Ok(outcome.map(|r| match r {
            prx_hooks::config::Reload::Applied => "applied",
            prx_hooks::config::Reload::Unchanged => "unchanged",
            _ => "rejected",
        }))
    }

    /// Drains what is queued for at most `timeout` seconds (default `shutdown_timeout`),
    /// stops the API, the workers, hooks, plugins and the NATS bridge, and closes the bus.
    /// Idempotent; later emits return `"skipped"`. Ctrl-C interrupts the wait (the shutdown
    /// itself goes on, and keeps its deadline).
    #[pyo3(signature = (timeout=None))]
    fn shutdown(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let core = self.core()?.clone();
        let timeout = match timeout {
            Some(t) => seconds(t, "timeout")?,
            None => core.shutdown_timeout,
        };
        wait_interruptibly(py, move || core.shutdown(timeout))
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.shutdown(py, None)?;
        Ok(false)
    }

    /// Whether `shutdown` has begun.
    #[getter]
    fn is_shut_down(&self) -> PyResult<bool> {
        Ok(self.core()?.hooks.is_shut_down())
    }

    #[getter]
    fn workspace(&self) -> PyResult<Option<PathBuf>> {
        Ok(self.core()?.workspace.clone())
    }

    /// Where the API serves (`http://127.0.0.1:7878`, `unix:/path`), `None` without `listen=`.
    #[getter]
    fn api_address(&self) -> PyResult<Option<String>> {
        Ok(self.core()?.address.clone())
    }

    /// The API's bearer token, `None` without `listen=`.
    #[getter]
    fn api_token(&self) -> PyResult<Option<String>> {
        Ok(self.core()?.token.clone())
    }

    /// Where the token came from (`API token generated into …/.prx-hooks/token …`).
    #[getter]
    fn api_token_source(&self) -> PyResult<Option<String>> {
        Ok(self.core()?.token_source.clone())
    }

    fn __repr__(&self) -> String {
        match self.core.get() {
            Some(c) => format!(
                "<prx_hooks.Hooks workspace={:?}{}{}>",
                c.workspace,
                c.address
                    .as_ref()
                    .map(|a| format!(" api={a}"))
                    .unwrap_or_default(),
                if c.hooks.is_shut_down() {
                    " (shut down)"
                } else {
                    ""
                }
            ),
            None => "<prx_hooks.Hooks (inherited across fork(): unusable)>".into(),
        }
    }
}

impl Drop for PyHooks {
    fn drop(&mut self) {
        // The last reference shuts down (up to `shutdown_timeout`): without the GIL, so that
        // other Python threads run meanwhile. Inherited across a fork: leaked (fork.rs).
        if let Some(core) = self.core.take() {
            Python::attach(|py| py.detach(move || drop(core)));
        }
    }
}
