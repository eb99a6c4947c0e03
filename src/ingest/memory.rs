//! The next `seq` of released keys, remembered in a bounded table.
//!
//! A record is 24 bytes plus the table's overhead, keyed by the key's 64-bit hash (keyed per
//! process, so nobody outside can aim two keys at one record). When two keys ever did share a
//! hash, they would share a record, and the one resumed last would continue from the larger
//! of the two numbers: its `seq` jumps forward, it never goes back or repeats.

use hashbrown::HashTable;
use std::collections::VecDeque;

/// Released keys' next `seq`, at most `cap` of them; the oldest is forgotten first.
///
/// Invariants: every record in `map` has exactly one entry in `order` with the same stamp (the
/// entry made when it was last parked); `order` may also hold stale entries (of records
/// resumed or parked again since), which eviction skips and compaction removes, so it never
/// holds more than `2 × cap + 16` entries.
pub(super) struct SeqMemory {
    /// (key hash, next seq, stamp of the park that wrote it).
    map: HashTable<(u64, u64, u64)>,
    /// (key hash, stamp) in park order, oldest first.
    order: VecDeque<(u64, u64)>,
    cap: usize,
    stamp: u64,
}

impl SeqMemory {
    pub(super) fn new(cap: usize) -> SeqMemory {
        SeqMemory {
            map: HashTable::new(),
            order: VecDeque::new(),
            cap,
            stamp: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Remembers that `hash`'s next `seq` is `next`. Returns how many records it forgot to
    /// stay within its bound (the oldest first; `1` when the bound is 0: this one).
    pub(super) fn park(&mut self, hash: u64, next: u64) -> u64 {
        if self.cap == 0 {
            return 1;
        }
        self.stamp += 1;
        let stamp = self.stamp;
        match self.map.find_mut(hash, |r| r.0 == hash) {
            Some(r) => {
                r.1 = r.1.max(next);
                r.2 = stamp;
            }
            None => {
                self.map.insert_unique(hash, (hash, next, stamp), |r| r.0);
            }
        }
        self.order.push_back((hash, stamp));
        let mut forgot = 0;
        while self.map.len() > self.cap {
            let Some((h, st)) = self.order.pop_front() else {
                break;
            };
            if let Ok(r) = self.map.find_entry(h, |r| r.0 == h && r.2 == st) {
                r.remove();
                forgot += 1;
            }
        }
        if self.order.len() > 2 * self.cap + 16 {
            let map = &self.map;
            self.order
                .retain(|&(h, st)| map.find(h, |r| r.0 == h).is_some_and(|r| r.2 == st));
        }
        forgot
    }

    /// Takes `hash`'s remembered next `seq`, if any.
    pub(super) fn take(&mut self, hash: u64) -> Option<u64> {
        let r = self.map.find_entry(hash, |r| r.0 == hash).ok()?;
        let ((_, next, _), _) = r.remove();
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_records_are_taken_once_and_the_oldest_is_forgotten_first() {
        let mut m = SeqMemory::new(2);
        assert_eq!(m.park(1, 10), 0);
        assert_eq!(m.park(2, 20), 0);
        assert_eq!(m.park(3, 30), 1, "1 is the oldest");
        assert_eq!(m.take(1), None);
        assert_eq!(m.take(2), Some(20));
        assert_eq!(m.take(2), None, "taken once");
        assert_eq!(m.park(2, 21), 0);
        assert_eq!(m.park(4, 40), 1, "3 is now the oldest");
        assert_eq!(
            (m.take(3), m.take(2), m.take(4)),
            (None, Some(21), Some(40))
        );
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_shared_hash_only_ever_moves_seq_forward() {
        let mut m = SeqMemory::new(8);
        m.park(7, 100);
        m.park(7, 5);
        assert_eq!(m.take(7), Some(100));
    }

    #[test]
    fn stale_order_entries_stay_bounded_under_churn() {
        let mut m = SeqMemory::new(4);
        for i in 0..10_000u64 {
            m.park(i % 3, i);
            if i % 2 == 0 {
                m.take(i % 3);
            }
            assert!(m.order.len() <= 2 * 4 + 16 + 1);
        }
        assert_eq!(
            SeqMemory::new(0).park(1, 1),
            1,
            "a bound of 0 remembers nothing"
        );
    }
}
