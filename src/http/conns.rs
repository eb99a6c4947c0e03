//! The connections a [`super::Server`] holds, which of them have shown the token, and which
//! one gives its place to a newcomer when the cap is reached (ARCHITECTURE.md § HTTP API).
//!
//! The cap keeps descriptors for the hooks, so it cannot grow; what it must not become is a
//! door anyone can hold shut. A client without the token can keep a connection busy forever
//! with the public routes (`/healthz` every few seconds, or the console's files) and
//! thousands of such clients would hold every place. So:
//!
//! * a connection is *authenticated* once a request on it has shown the token, and then keeps
//!   its place until it ends (timeouts still apply);
//! * when the cap is reached, a new connection takes the place of the oldest one that has
//!   not — preferring one that has already been answered (it had its turn) over one still
//!   waiting for its first answer (a client that just connected, the token holder among
//!   them) — and that one is closed (`evicted`);
//! * only when every open connection is authenticated is a new one closed at once
//!   (`refused_over_cap`).
//!
//! A newcomer is the youngest connection, so it loses its own place only after every older
//! connection without the token has lost its: a client sending its request at once is
//! served however many others connect.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// The connection counters of a [`Server`](super::Server) (`/api/stats` → `http`, `/metrics` → `http_*`).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HttpStats {
    /// Where it listens (`http://…` or `unix:…`).
    pub listen: String,
    /// The connection cap in force.
    pub max_connections: u64,
    /// Connections open now.
    pub open: u64,
    /// Of those, connections on which a request has shown the token (they keep their place
    /// when the cap is reached).
    pub authenticated: u64,
    /// Connections accepted (including those closed at once over the cap).
    pub accepted: u64,
    /// Connections closed at once because the cap was reached and every open connection had
    /// shown the token.
    pub refused_over_cap: u64,
    /// Connections without the token closed to make room for a new one at the cap (the oldest
    /// first, those already answered before those waiting for their first answer).
    pub evicted: u64,
    /// Connections closed after a 401 or 403 (a request without the right token, a foreign
    /// Host or Origin).
    pub closed_unauthorized: u64,
    /// Failed accepts (out of file descriptors, …).
    pub accept_errors: u64,
    /// Connections closed because a request head did not arrive in time.
    pub header_timeouts: u64,
    /// Requests answered 408 because their body stalled.
    pub body_timeouts: u64,
    /// Connections closed because the client read nothing of a response.
    pub write_timeouts: u64,
}

/// The live counters behind [`HttpStats`].
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    pub(super) listen: String,
    pub(super) max: AtomicU64,
    /// The open connections (their count is `open`).
    pub(super) table: Table,
    pub(super) accepted: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) evicted: AtomicU64,
    pub(crate) closed_unauthorized: AtomicU64,
    pub(super) accept_errors: AtomicU64,
    pub(super) header_timeouts: AtomicU64,
    pub(crate) body_timeouts: AtomicU64,
    pub(super) write_timeouts: AtomicU64,
}

impl ConnCounters {
    /// The connection cap in force now (the event stream's cap follows it).
    pub(crate) fn max_now(&self) -> usize {
        self.max.load(Ordering::Relaxed) as usize
    }

    pub(crate) fn snapshot(&self) -> HttpStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (open, authenticated) = self.table.counts();
        HttpStats {
            listen: self.listen.clone(),
            max_connections: get(&self.max),
            open,
            authenticated,
            accepted: get(&self.accepted),
            refused_over_cap: get(&self.refused),
            evicted: get(&self.evicted),
            closed_unauthorized: get(&self.closed_unauthorized),
            accept_errors: get(&self.accept_errors),
            header_timeouts: get(&self.header_timeouts),
            body_timeouts: get(&self.body_timeouts),
            write_timeouts: get(&self.write_timeouts),
        }
    }
}

/// One open connection, shared by its task, its requests (as an extension) and the table.
#[derive(Debug, Default)]
pub(crate) struct Conn {
    /// Its place in the table: connections are numbered in the order they were accepted.
    id: u64,
    /// A request on it showed the token.
    authenticated: AtomicBool,
    /// It has been sent at least one response.
    answered: AtomicBool,
    /// Told when the connection lost its place; its task then closes it.
    evicted: Notify,
}

impl Conn {
    /// A request on this connection showed the token: it keeps its place from now on.
    pub(crate) fn authenticate(&self) {
        self.authenticated.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// A response was sent on it.
    pub(crate) fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }

    /// Resolves when the connection has lost its place (at once if it already has).
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await
    }
}

/// How a new connection was let in.
pub(crate) enum Admitted {
    /// There was a free place.
    Free(Arc<Conn>),
    /// It took the place of a connection without the token, which is being closed.
    Evicted(Arc<Conn>),
}

/// The open connections, oldest first.
///
/// Invariant: `open` holds exactly the connections counted open — an entry is removed once,
/// either when its connection ends ([`Table::leave`]) or when it is evicted.
#[derive(Debug, Default)]
pub(crate) struct Table {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    open: BTreeMap<u64, Arc<Conn>>,
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets a new connection in under `max`: into a free place, or into the place of the
    /// oldest connection that has not shown the token (answered ones first), which is told
    /// to close. When `max` has shrunk below the open count (a reload left the API fewer
    /// descriptors), as many such connections go as it takes to get under it. `None` when
    /// the rest are authenticated connections.
    pub(crate) fn admit(&self, max: usize) -> Option<Admitted> {
        let mut t = self.lock();
        let mut evicted = false;
        while t.open.len() >= max.max(1) {
            let victim = {
                let without_token = t.open.values().filter(|c| !c.is_authenticated());
                let mut waiting = None;
                let mut answered = None;
                for c in without_token {
                    if c.answered.load(Ordering::Relaxed) {
                        answered = Some(c.id);
                        break;
                    }
                    waiting.get_or_insert(c.id);
                }
                answered.or(waiting)?
            };
            if let Some(old) = t.open.remove(&victim) {
                old.evicted.notify_one();
                evicted = true;
            }
        }
        let id = t.next;
        t.next += 1;
        let conn = Arc::new(Conn {
            id,
            ..Conn::default()
        });
        t.open.insert(id, conn.clone());
        Some(if evicted {
            Admitted::Evicted(conn)
        } else {
            Admitted::Free(conn)
        })
    }

    /// The connection ended (a no-op for one that was evicted: its place is already gone).
    pub(crate) fn leave(&self, conn: &Conn) {
        self.lock().open.remove(&conn.id);
    }

    /// (connections open, of which authenticated).
    pub(crate) fn counts(&self) -> (u64, u64) {
        let t = self.lock();
        let authenticated = t.open.values().filter(|c| c.is_authenticated()).count();
        (t.open.len() as u64, authenticated as u64)
    }
}

#[cfg(test)]
impl Admitted {
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        match self {
            Admitted::Free(c) | Admitted::Evicted(c) => c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(t: &Table) -> Vec<u64> {
        t.lock().open.keys().copied().collect()
    }

    /// The cap shrinks when a reload leaves fewer descriptors for the API: a newcomer then
    /// takes as many places as it takes to get under the new cap, not one.
    #[test]
    fn a_lowered_cap_brings_the_open_count_under_it() {
        let t = Table::default();
        let held: Vec<_> = (0..6).map(|_| t.admit(6).unwrap().conn().clone()).collect();
        held[0].authenticate();
        assert!(matches!(t.admit(3), Some(Admitted::Evicted(_))));
        assert_eq!(ids(&t).len(), 3, "{:?}", ids(&t));
        assert!(ids(&t).contains(&0), "the token holder stays");
        // Only token holders left over the cap: the newcomer is refused.
        for c in t.lock().open.values() {
            c.authenticate();
        }
        assert!(t.admit(2).is_none());
    }

    #[test]
    fn the_oldest_answered_connection_without_the_token_gives_its_place_first() {
        let t = Table::default();
        let a = t.admit(3).unwrap().conn().clone();
        let b = t.admit(3).unwrap().conn().clone();
        let c = t.admit(3).unwrap().conn().clone();
        assert_eq!(ids(&t), [0, 1, 2]);
        // `a` holds the token; `c` was answered; `b` waits for its first answer.
        a.authenticate();
        c.answered();
        let d = t.admit(3).unwrap();
        assert!(matches!(d, Admitted::Evicted(_)));
        assert_eq!(ids(&t), [0, 1, 3], "c, answered, went before b, older");
        // Then the oldest waiting one.
        assert!(matches!(t.admit(3), Some(Admitted::Evicted(_))));
        assert_eq!(ids(&t), [0, 3, 4]);
        // The evicted are told, the others not.
        let told = |c: &Conn| {
            let f = c.evicted();
            ready_at_once(f)
        };
        assert!(told(&b) && told(&c) && !told(&a));
        // Leaving frees a place; leaving twice (or after an eviction) changes nothing.
        t.leave(&b);
        t.leave(&a);
        assert_eq!(t.counts(), (2, 0));
        assert!(matches!(t.admit(3), Some(Admitted::Free(_))));
    }

    #[test]
    fn when_every_place_is_authenticated_a_newcomer_is_refused() {
        let t = Table::default();
        for _ in 0..2 {
            t.admit(2).unwrap().conn().authenticate();
        }
        assert!(t.admit(2).is_none());
        assert_eq!(t.counts(), (2, 2));
    }

    /// Whether a future is ready at its first poll.
    fn ready_at_once(f: impl std::future::Future<Output = ()>) -> bool {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_ready()
    }
}
