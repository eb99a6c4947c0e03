//! Relaying (ARCHITECTURE.md § NATS bridge, "Relaying"): what the consumer tells the
//! publisher of the same `Hooks` about the events it fed in, so that a relayed event keeps
//! its first publisher's `Prx-Origin` and `Nats-Msg-Id` and counts its hops.
//!
//! The consumer emits through relay emitters ([`Emitter::with_relay`](crate::Emitter)); each
//! event's bus message then carries the emitter's relay id, and its `seq` is the emitter's
//! count of events queued before it (the worker numbers them in ring order, and the consumer
//! is the emitter's only user). The consumer records `(relay id, seq) → Relayed` *before*
//! emitting, so the record is there when the publisher takes the message; the publisher
//! removes it. Records the publisher never takes (its queue dropped the message) are evicted
//! oldest first past [`CAPACITY`].

use crate::{EventKind, EventMask};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Records kept at most (the publisher's default queue, and some).
pub(crate) const CAPACITY: usize = 1 << 17;

/// A consumed event as the publisher must republish it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Relayed {
    /// The first publisher's instance id (this process's when the message had none).
    pub origin: String,
    /// Its `Nats-Msg-Id` (one the consumer made when it had none).
    pub id: String,
    /// Its `Prx-Hops` (0 when absent); the publisher sends one more.
    pub hops: u32,
}

/// (relay id, seq): one event of one relay emitter.
type Key = (u64, u64);

pub(crate) struct Relays {
    /// The events the publisher takes (its pattern): no record is made for the others.
    wanted: EventMask,
    /// The records, and their keys oldest first (for eviction).
    inner: Mutex<(HashMap<Key, Relayed>, VecDeque<Key>)>,
}

impl Relays {
    pub(crate) fn new(wanted: EventMask) -> Relays {
        Relays {
            wanted,
            inner: Mutex::default(),
        }
    }

    /// Whether the publisher publishes `kind` (a record for it would never be taken).
    pub(crate) fn wants(&self, kind: EventKind) -> bool {
        self.wanted.contains(kind)
    }

    pub(crate) fn insert(&self, relay: u64, seq: u64, r: Relayed) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        if map.insert((relay, seq), r).is_none() {
            order.push_back((relay, seq));
        }
        // `order` holds every key inserted and not yet evicted, taken ones too (`take` leaves
        // them): bounding it bounds the map, which is a subset of it.
        while order.len() > CAPACITY {
            if let Some(k) = order.pop_front() {
                map.remove(&k);
            }
        }
    }

    pub(crate) fn take(&self, relay: u64, seq: u64) -> Option<Relayed> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // `order` keeps the key until eviction reaches it (removing it is a no-op then).
        g.0.remove(&(relay, seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_taken_once_and_the_oldest_go_past_capacity() {
        let r = Relays::new(EventMask::ALL);
        assert!(r.wants(EventKind::ToolCall));
        assert!(!Relays::new(EventMask::NONE).wants(EventKind::ToolCall));
        let rec = |n: u32| Relayed {
            origin: "o".into(),
            id: format!("id-{n}"),
            hops: n,
        };
        r.insert(7, 0, rec(0));
        r.insert(7, 1, rec(1));
        assert_eq!(r.take(7, 1), Some(rec(1)));
        assert_eq!(r.take(7, 1), None);
        assert_eq!(r.take(8, 0), None, "another emitter");
        for seq in 2..(CAPACITY as u64 + 3) {
            r.insert(7, seq, rec(2));
        }
        assert_eq!(r.take(7, 0), None, "evicted");
        assert!(r.take(7, CAPACITY as u64 + 2).is_some());
    }

    #[test]
    fn records_taken_as_they_come_leave_nothing_behind() {
        let r = Relays::new(EventMask::ALL);
        for seq in 0..(2 * CAPACITY as u64) {
            r.insert(
                1,
                seq,
                Relayed {
                    origin: "o".into(),
                    id: "i".into(),
                    hops: 0,
                },
            );
            assert!(r.take(1, seq).is_some());
        }
        let g = r.inner.lock().unwrap();
        assert!(g.0.is_empty());
        assert!(g.1.len() <= CAPACITY, "the key list grew to {}", g.1.len());
    }
}
