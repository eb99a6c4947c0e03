//! A bounded, preallocated, lock-free multi-producer single-consumer ring.
//!
//! This is the only structure `emit` touches besides a few counters, so it is built for the
//! producer: claiming a slot is one compare-and-swap on `tail`, filling it is a plain copy into
//! memory that was allocated (and touched) when the ring was built, and publishing is one
//! release store. A full ring is detected from a single load and costs the producer nothing
//! more: the event is dropped, never waited for.
//!
//! The algorithm is Dmitry Vyukov's bounded queue, with the consumer side specialized to one
//! thread (each pipeline worker owns one ring, see [`crate::pipeline`]).
//!
//! # Invariants
//!
//! Positions (`head`, `tail`, a claim) are unbounded counters; a position `p` lives in slot
//! `p & mask`. Each slot carries a `stamp`:
//!
//! * `stamp == p`: the slot is free for the producer that claims position `p`.
//! * `stamp == p + 1`: position `p` has been written and published; the consumer may read it.
//! * After reading position `p` the consumer stores `stamp = p + capacity`: free for the
//!   producer of the next lap.
//!
//! A producer owns a slot exclusively from the moment its CAS moves `tail` from `p` to `p + 1`
//! until its release store of `p + 1` into the stamp. The consumer owns it from its acquire load
//! that sees `p + 1` until its release store of `p + capacity`. Those two windows never overlap,
//! which is what makes the `UnsafeCell` accesses below sound. The stamp's release/acquire pairs
//! carry the slot contents across: producer → consumer on publish, consumer → next producer on
//! release.
//!
//! `tail - head` is the depth. A producer preempted between claim and publish holds up the
//! consumer at that position (it sees "empty") but never blocks another producer; that is the
//! price of a lock-free rather than wait-free ring, and it is bounded by one scheduler tick.

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;
use std::sync::Arc;

/// The ring had no free slot; the caller's value was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Full;

struct Slot<T> {
    stamp: AtomicUsize,
    value: UnsafeCell<T>,
}

pub(crate) struct Ring<T> {
    /// Next position to claim. Written by producers (CAS).
    tail: CachePadded<AtomicUsize>,
    /// Next position to read. Written only by the consumer; read by `len` for stats.
    head: CachePadded<AtomicUsize>,
    slots: Box<[Slot<T>]>,
    mask: usize,
}

// SAFETY: a slot's value is only ever accessed by the one thread that owns it under the stamp
// protocol in the module docs, and values move between threads, so `T: Send` suffices.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as above; the ring owns its `T`s.
unsafe impl<T: Send> Send for Ring<T> {}

/// The consuming end of a [`Ring`]. There is exactly one per ring: it is not `Clone`, and `pop`
/// takes `&mut self`, which is what the single-consumer invariant rests on.
pub(crate) struct Consumer<T> {
    ring: Arc<Ring<T>>,
    head: usize,
}

impl<T> Ring<T> {
    /// Builds a ring of `capacity` slots (rounded up to a power of two, at least 2), each
    /// initialized by `init`, and returns it with its only consumer.
    pub(crate) fn new(capacity: usize, mut init: impl FnMut() -> T) -> (Arc<Ring<T>>, Consumer<T>) {
        let capacity = capacity.max(2).next_power_of_two();
        let slots = (0..capacity)
            .map(|i| Slot {
                stamp: AtomicUsize::new(i),
                value: UnsafeCell::new(init()),
            })
            .collect();
        let ring = Arc::new(Ring {
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(0)),
            slots,
            mask: capacity - 1,
        });
        (ring.clone(), Consumer { ring, head: 0 })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Events claimed but not yet consumed (a snapshot; exact when nobody is pushing).
    pub(crate) fn len(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        let tail = self.tail.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Claims a slot, lets `fill` write into it, and publishes it. Fails with [`Full`] at once
    /// (without calling `fill`) when every slot is taken. Never waits: the loop only retries
    /// when another producer won the same position, which means that producer made progress.
    pub(crate) fn push(&self, fill: impl FnOnce(&mut T)) -> Result<(), Full> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[pos & self.mask];
            let stamp = slot.stamp.load(Ordering::Acquire);
            let lag = stamp.wrapping_sub(pos) as isize;
            if lag == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: our CAS claimed position `pos`, and `stamp == pos` (acquired
                        // above) means the consumer has released the slot: we own it until the
                        // store below.
                        slot.value.with_mut(|v| fill(unsafe { &mut *v }));
                        slot.stamp.store(pos.wrapping_add(1), Ordering::Release);
                        self.prefetch(pos.wrapping_add(1));
                        return Ok(());
                    }
                    Err(current) => pos = current,
                }
            } else if lag < 0 {
                // The slot still holds the previous lap's value: head <= pos - capacity while
                // tail >= pos, so the ring is full.
                return Err(Full);
            } else {
                // Another producer already took `pos`; catch up.
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }
}

impl<T> Ring<T> {
    /// Asks for the next position's slot header in this core's cache, for writing. The
    /// consumer last touched it a lap ago, so when events are sporadic the next `push` would
    /// otherwise start with a cross-core miss on the stamp. A hint only: no access happens in
    /// the memory model's sense, so it is sound whoever owns that slot now.
    #[inline]
    fn prefetch(&self, pos: usize) {
        #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
        {
            let slot: *const Slot<T> = &self.slots[pos & self.mask];
            // SAFETY: prefetching never faults and has no effect on program semantics; the
            // address is that of a live slot of this ring.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(slot.cast())
            };
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
        let _ = pos;
    }
}

impl<T> Consumer<T> {
    pub(crate) fn ring(&self) -> &Arc<Ring<T>> {
        &self.ring
    }

    /// Reads the oldest published value with `read`, then frees its slot. `None` when the ring
    /// is empty or the oldest claim is still being written.
    pub(crate) fn pop<R>(&mut self, read: impl FnOnce(&mut T) -> R) -> Option<R> {
        let ring = &*self.ring;
        let pos = self.head;
        let slot = &ring.slots[pos & ring.mask];
        if slot.stamp.load(Ordering::Acquire) != pos.wrapping_add(1) {
            return None;
        }
        // SAFETY: `stamp == pos + 1` (acquired) means the producer of `pos` has published and
        // will not touch the slot again; no other producer can claim it until we release it
        // below, and we are the only consumer (`&mut self`).
        let out = slot.value.with_mut(|v| read(unsafe { &mut *v }));
        slot.stamp
            .store(pos.wrapping_add(ring.capacity()), Ordering::Release);
        self.head = pos.wrapping_add(1);
        ring.head.store(self.head, Ordering::Release);
        Some(out)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn push_pop_in_order_and_full() {
        let (ring, mut rx) = Ring::new(3, || 0u64);
        assert_eq!(ring.capacity(), 4);
        for i in 0..4 {
            ring.push(|v| *v = i).unwrap();
        }
        assert_eq!(ring.len(), 4);
        assert_eq!(
            ring.push(|_| panic!("fill must not run when full")),
            Err(Full)
        );
        for i in 0..4 {
            assert_eq!(rx.pop(|v| *v), Some(i));
        }
        assert_eq!(rx.pop(|v| *v), None);
        assert_eq!(ring.len(), 0);
    }

    #[test]
    fn wraps_around_many_laps() {
        let (ring, mut rx) = Ring::new(2, || 0usize);
        for i in 0..50 {
            ring.push(|v| *v = i).unwrap();
            ring.push(|v| *v = i + 1000).unwrap();
            assert_eq!(ring.push(|v| *v = 0), Err(Full));
            assert_eq!(rx.pop(|v| *v), Some(i));
            assert_eq!(rx.pop(|v| *v), Some(i + 1000));
        }
    }

    #[test]
    fn values_are_moved_out_and_dropped_once() {
        let (ring, mut rx) = Ring::new(2, || None::<Box<[u8]>>);
        ring.push(|v| *v = Some(vec![7; 100].into())).unwrap();
        let got = rx.pop(|v| v.take()).unwrap().unwrap();
        assert_eq!(got.len(), 100);
        ring.push(|v| *v = Some(vec![1; 10].into())).unwrap();
        drop(rx); // the ring drops the unconsumed box with it (Miri checks for the leak)
        drop(ring);
    }

    #[test]
    fn concurrent_producers_keep_their_own_order() {
        let per = if cfg!(miri) { 200 } else { 100_000 };
        let (ring, mut rx) = Ring::new(64, || (0usize, 0usize));
        let producers: Vec<_> = (0..2)
            .map(|id| {
                let ring = ring.clone();
                thread::spawn(move || {
                    let mut i = 0;
                    while i < per {
                        if ring.push(|v| *v = (id, i)).is_ok() {
                            i += 1;
                        } else {
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0usize; 2];
        while next != [per, per] {
            match rx.pop(|v| *v) {
                Some((id, i)) => {
                    assert_eq!(i, next[id], "producer {id} out of order");
                    next[id] += 1;
                }
                None => thread::yield_now(),
            }
        }
        producers.into_iter().for_each(|p| p.join().unwrap());
        assert_eq!(rx.pop(|v| *v), None);
    }
}

/// Model checks: every interleaving of 2 producers and 1 consumer on a tiny ring.
/// Run with `RUSTFLAGS="--cfg loom" cargo test --release --no-default-features --lib ring`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// Pushes from two producers while the consumer pops; checks that everything pushed
    /// successfully arrives exactly once, in per-producer order, untorn.
    fn run(capacity: usize, per_producer: usize) {
        loom::model(move || {
            let (ring, mut rx) = Ring::new(capacity, || (0usize, 0usize, 0usize));
            let handles: Vec<_> = (1..=2)
                .map(|id| {
                    let ring = ring.clone();
                    thread::spawn(move || {
                        let mut ok = 0;
                        for i in 0..per_producer {
                            // The triple lets a torn read show up as a mismatch.
                            if ring.push(|v| *v = (id, i, id * 100 + i)).is_ok() {
                                ok += 1;
                            }
                        }
                        ok
                    })
                })
                .collect();
            let mut seen = vec![Vec::<usize>::new(); 3];
            let take = |rx: &mut Consumer<(usize, usize, usize)>, seen: &mut Vec<Vec<usize>>| {
                while let Some((id, i, check)) = rx.pop(|v| *v) {
                    assert_eq!(check, id * 100 + i, "torn slot");
                    seen[id].push(i);
                }
            };
            take(&mut rx, &mut seen);
            let pushed: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
            take(&mut rx, &mut seen);
            for list in &seen {
                assert!(list.windows(2).all(|w| w[0] < w[1]), "order: {list:?}");
            }
            assert_eq!(seen.iter().map(Vec::len).sum::<usize>(), pushed);
            assert!(
                pushed >= capacity.min(2 * per_producer),
                "a free ring refused a push"
            );
        });
    }

    #[test]
    fn two_producers_one_consumer() {
        run(2, 2);
    }

    #[test]
    fn full_and_wrap_around() {
        // 3 pushes per producer into 2 slots: some must be refused as full, and the consumer
        // popping concurrently makes the ring wrap.
        run(2, 3);
    }

    #[test]
    fn single_thread_full_then_wrap() {
        loom::model(|| {
            let (ring, mut rx) = Ring::new(2, || 0usize);
            ring.push(|v| *v = 1).unwrap();
            ring.push(|v| *v = 2).unwrap();
            assert_eq!(ring.push(|v| *v = 3), Err(Full));
            assert_eq!(rx.pop(|v| *v), Some(1));
            ring.push(|v| *v = 4).unwrap();
            assert_eq!(rx.pop(|v| *v), Some(2));
            assert_eq!(rx.pop(|v| *v), Some(4));
            assert_eq!(rx.pop(|v| *v), None);
        });
    }
}
