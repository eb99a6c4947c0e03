//! Test runs started one at a time (`ShellSink::try_run_once`): why one could not start, and
//! the future its caller awaits (ARCHITECTURE.md § Shell hooks).

use super::*;

/// Why [`ShellSink::try_run_once`] did not start a run: every slot it may use is taken.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    #[error(
        "hook {} already runs {limit} process(es), its max_concurrent; try again when one finishes",
        crate::config::quote(.id)
    )]
    /// The hook already runs as many processes as its `max_concurrent` allows.
    Hook {
        /// The hook's id.
        id: String,
        /// Its `max_concurrent`.
        limit: usize,
    },
    #[error(
        "{limit} hook processes are running, the backend's max_running; try again when one finishes"
    )]
    /// The backend already runs as many hook processes as its `max_running` allows.
    Backend {
        /// The backend's `max_running`.
        limit: usize,
    },
}

impl Busy {
    /// When to try again (for `Retry-After`): a second (a slot frees when a run finishes, which
    /// its timeout bounds).
    pub fn retry_after_secs(&self) -> u64 {
        1
    }
}

/// A run started by [`ShellSink::try_run_once`]: a future of its outcome, which needs no
/// thread to wait on (the runner wakes it). Dropping it before the outcome keeps a run the
/// runner has not taken yet from starting (its history records `cancelled`) or kills a started
/// run's process group (the runner reaps it and records `killed`).
pub struct OnceRun {
    pub(super) slot: Arc<OnceSlot>,
    /// Where to ask for the kill (`None`: finished before it started).
    pub(super) shared: Option<Arc<Shared>>,
    pub(super) done: bool,
}

impl std::fmt::Debug for OnceRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnceRun")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(super) struct OnceSlot {
    pub(super) state: Mutex<(Option<Outcome>, Option<std::task::Waker>)>,
    pub(super) cancelled: AtomicBool,
}

/// The runner's end of a test run: completes its [`OnceRun`] once. If it is dropped without
/// an outcome — the runner thread panicked and unwound its reactor, or the request was lost
/// some other way — it records the run as `cancelled` and gives its slot back, so the HTTP
/// request never hangs and the running counts return to 0 (ARCHITECTURE.md § HTTP API).
pub(super) struct OnceGuard {
    pub(super) slot: Arc<OnceSlot>,
    /// Weak: a guard waiting in the runner's inbox must not keep the backend alive.
    pub(super) shared: std::sync::Weak<Shared>,
    pub(super) id: String,
    pub(super) event: crate::event::EventKind,
    pub(super) msg: Message,
    pub(super) done: bool,
}

impl OnceGuard {
    pub(super) fn complete(mut self, o: Outcome) {
        self.done = true;
        self.slot.complete(o);
    }
}

impl Drop for OnceGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut o = Outcome::not_run(
            &self.id,
            self.event,
            OutcomeKind::Cancelled,
            Some(&self.msg),
        );
        o.direct = true;
        if let Some(sh) = self.shared.upgrade() {
            tracing::error!(
                "a test run of hook {} ended without an outcome (did the shell runner thread panic?); recorded as cancelled",
                crate::config::quote(&self.id)
            );
            o = finish_direct(&sh, o);
        }
        self.slot.complete(o);
    }
}

impl OnceSlot {
    pub(super) fn complete(&self, o: Outcome) {
        let waker = {
            let mut st = lock(&self.state);
            st.0 = Some(o);
            st.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl OnceRun {
    /// A test run whose slot `try_start_direct` has just taken: the origin to hand to the
    /// runner, and the future of its outcome.
    pub(super) fn pending(sh: &Arc<Shared>, action: &Action, msg: &Message) -> (Origin, OnceRun) {
        let prepared = sh.table.load_full();
        let run = Arc::new(EventRun::new(
            msg.clone(),
            prepared.base_env.clone(),
            sh.payload.clone(),
        ));
        let slot = Arc::new(OnceSlot::default());
        let origin = Origin::Once {
            id: action.id.clone(),
            event: action.event,
            run,
            slot: OnceGuard {
                slot: slot.clone(),
                shared: Arc::downgrade(sh),
                id: action.id.clone(),
                event: action.event,
                msg: msg.clone(),
                done: false,
            },
        };
        let once = OnceRun {
            slot,
            shared: Some(sh.clone()),
            done: false,
        };
        (origin, once)
    }

    pub(super) fn finished(o: Outcome) -> OnceRun {
        let slot = OnceSlot::default();
        lock(&slot.state).0 = Some(o);
        OnceRun {
            slot: Arc::new(slot),
            shared: None,
            done: false,
        }
    }
}

impl std::future::Future for OnceRun {
    type Output = Outcome;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Outcome> {
        let taken = {
            let mut st = lock(&self.slot.state);
            match st.0.take() {
                Some(o) => Some(o),
                None => {
                    st.1 = Some(cx.waker().clone());
                    None
                }
            }
        };
        match taken {
            Some(o) => {
                self.done = true;
                std::task::Poll::Ready(o)
            }
            None => std::task::Poll::Pending,
        }
    }
}

impl Drop for OnceRun {
    fn drop(&mut self) {
        if self.done || lock(&self.slot.state).0.is_some() {
            return;
        }
        if let Some(sh) = &self.shared {
            self.slot.cancelled.store(true, Ordering::Release);
            sh.runner.cancel.store(true, Ordering::Release);
            sh.runner.wake();
        }
    }
}
