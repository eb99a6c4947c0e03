//! Running a guest call — a wasmtime `call_async` or `instantiate_async` future — to its end on
//! the calling thread, with a deadline and a stop signal.
//!
//! The future is polled here; while it is pending (the guest waits in a WASI host call, such as
//! `wasi:io/poll` on a clock) the thread parks until the future's waker unparks it (a timer of the
//! engine's runtime fired) or for at most [`SLICE`], then checks the deadline and the stop
//! signal. At the deadline or on stop the future is dropped: wasmtime resumes the guest's fiber
//! with an error, which unwinds it out of the host call, and the instance is thrown away by the
//! caller. Guest code that runs (rather than waits) is stopped by the epoch callback instead
//! (`HostState::check_deadline`), which makes the future finish with an error.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// Longest park between checks of the deadline and the stop signal.
pub(super) const SLICE: Duration = Duration::from_millis(10);

/// How a driven future ended.
pub(super) enum Driven<T> {
    Done(T),
    /// The deadline passed while it was waiting.
    Deadline,
    /// `stop` said so while it was waiting.
    Stopped,
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static WAKER: Waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
}

/// Polls `fut` until it is ready, the deadline passes, or `stop` returns true.
pub(super) fn drive<F: Future>(
    fut: F,
    deadline: Instant,
    stop: impl Fn() -> bool,
) -> Driven<F::Output> {
    let mut fut = std::pin::pin!(fut);
    WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return Driven::Done(v);
            }
            if stop() {
                return Driven::Stopped;
            }
            let now = Instant::now();
            if now >= deadline {
                return Driven::Deadline;
            }
            std::thread::park_timeout((deadline - now).min(SLICE));
        }
    })
}
