//! [`Server`]: the API on its own small tokio runtime, for hosts without one (and for
//! `prx-hooks run --listen`).

use super::{HttpOptions, router};
use crate::Hooks;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A running API server. Dropping it stops it (waiting up to a second for open requests).
pub struct Server {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port) and serves [`router`] on two runtime threads,
    /// plus blocking-pool threads made on demand (at most 64) for file writes and test runs,
    /// which can wait up to a hook's timeout. Binding happens before this returns, so a taken
    /// port is an error here.
    pub fn start(
        hooks: Arc<Hooks>,
        opts: HttpOptions,
        addr: SocketAddr,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(64)
            .thread_name("prx-http")
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(hooks, opts).into_make_service_with_connect_info::<SocketAddr>();
        let done = runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Server {
            addr,
            runtime: Some(runtime),
            stop: Some(stop),
            done: Some(done),
        })
    }

    /// The address it listens on (the real port when started on port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections, lets open requests finish for at most `timeout`, then
    /// closes everything. Idempotent. Safe to call (or to drop the server) from inside another
    /// tokio runtime: the waiting happens on a short-lived thread of its own, where blocking
    /// is allowed.
    pub fn shutdown(&mut self, timeout: Duration) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let done = self.done.take();
        std::thread::scope(|s| {
            s.spawn(move || {
                if let Some(done) = done {
                    match runtime.block_on(async { tokio::time::timeout(timeout, done).await }) {
                        Ok(Ok(Err(e))) => tracing::warn!("HTTP server: {e}"),
                        Ok(Err(e)) => tracing::warn!("HTTP server task failed: {e}"),
                        Err(_) => tracing::warn!(
                            "HTTP server: requests still open after {timeout:?}; closing them"
                        ),
                        Ok(Ok(Ok(()))) => {}
                    }
                }
                runtime.shutdown_timeout(timeout);
            });
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(1));
    }
}
