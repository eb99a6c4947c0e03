//! The flusher thread: writes every changed store at most `FLUSH_DELAY` after its first
//! change, so a burst of writes costs one fsync (ARCHITECTURE.md § WASM plugins).

use super::*;

/// The thread that writes changed stores: woken by [`KvFlusher::touch`], it waits
/// [`FLUSH_DELAY`] to gather a burst of writes, then writes every dirty store.
pub(crate) struct KvFlusher {
    pub(super) shared: Arc<FlushShared>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
}

pub(super) struct FlushShared {
    pub(super) state: Mutex<FlushState>,
    pub(super) wake: Condvar,
}

#[derive(Default)]
pub(super) struct FlushState {
    pub(super) stores: Vec<Weak<KvStore>>,
    /// When the earliest unflushed change happened.
    pub(super) pending_since: Option<Instant>,
    pub(super) stop: bool,
}

impl KvFlusher {
    pub(crate) fn start() -> io::Result<KvFlusher> {
        let shared = Arc::new(FlushShared {
            state: Mutex::new(FlushState::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("prx-hooks-kv".into())
            .spawn(move || flush_loop(&s))?;
        Ok(KvFlusher {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, FlushState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a store to be flushed when it changes.
    pub(crate) fn register(&self, store: &Arc<KvStore>) {
        let mut st = self.state();
        st.stores.retain(|w| w.strong_count() > 0);
        if !st.stores.iter().any(|w| w.as_ptr() == Arc::as_ptr(store)) {
            st.stores.push(Arc::downgrade(store));
        }
    }

    /// A store changed: write it within [`FLUSH_DELAY`].
    pub(crate) fn touch(&self) {
        let mut st = self.state();
        if st.pending_since.is_none() {
            st.pending_since = Some(Instant::now());
            self.shared.wake.notify_one();
        }
    }

    /// Writes every dirty store now and stops the thread. Idempotent.
    pub(crate) fn stop(&self) {
        self.state().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for KvFlusher {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(super) fn flush_loop(shared: &FlushShared) {
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let due = st.pending_since.map(|t| t + FLUSH_DELAY);
        let now = Instant::now();
        if st.stop || due.is_some_and(|d| d <= now) {
            st.pending_since = None;
            let stores: Vec<_> = st.stores.iter().filter_map(Weak::upgrade).collect();
            let stop = st.stop;
            drop(st);
            for store in stores {
                let _ = store.flush();
            }
            if stop {
                return;
            }
            st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        st = match due {
            Some(d) => {
                shared
                    .wake
                    .wait_timeout(st, d - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
        };
    }
}
