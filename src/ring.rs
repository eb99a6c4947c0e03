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
//!
//! # Closing
//!
//! The top bit of `tail` is the ring's *closed* flag ([`CLOSED`]); positions use the bits below
//! it (2⁶³ claims: 290 years at a billion a second). [`Ring::close`] sets the flag with one
//! `fetch_or` and returns the final tail `T`. From then on:
//!
//! * no claim can succeed: a producer that loaded `tail` before the close fails its CAS (the
//!   word now differs by the flag), reloads, and sees the flag; one that loads it after sees it
//!   at once. Either way `push` returns [`PushError::Closed`] without touching a slot. This costs
//!   the open ring nothing: the flag rides in the word the claiming CAS already compares.
//! * every position `< T` was claimed before the close, so its producer *will* publish it (the
//!   claim-to-publish window runs no code that can fail or wait). The consumer drains exactly
//!   the positions `head..T`, waiting on any still being written ([`Consumer::drain_closed`]).
//!
//! So after a close and a complete drain, every push that returned `Ok` has been read, and every
//! later push returned `Closed`: nothing is stranded. That is the shutdown handshake of
//! ARCHITECTURE.md § Shutdown; its loom model is `loom_tests::close_*`.

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};
use crossbeam_utils::CachePadded;
use std::sync::Arc;

/// Why [`Ring::push`] stored nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PushError {
    /// Every slot is taken.
    Full,
    /// The ring was closed ([`Ring::close`]).
    Closed,
}

/// The closed flag: the top bit of `tail`.
pub(crate) const CLOSED: usize = 1 << (usize::BITS - 1);

struct Slot<T> {
    stamp: AtomicUsize,
    value: UnsafeCell<T>,
}

pub(crate) struct Ring<T> {
    /// Next position to claim, with the [`CLOSED`] flag in its top bit. Written by producers
    /// (CAS) and once by [`Ring::close`] (`fetch_or`).
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
        let tail = self.tail.load(Ordering::Acquire) & !CLOSED;
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Positions claimed so far: every successful push, ever (the closed flag masked off).
    pub(crate) fn claimed(&self) -> usize {
        self.tail.load(Ordering::Acquire) & !CLOSED
    }

    /// The consumer's next position: every position below it has been read (and its slot's
    /// contents, such as the event's `seq`, taken). Acquire: what the consumer did before
    /// moving past a position is visible to whoever sees the new head.
    pub(crate) fn read_position(&self) -> usize {
        self.head.load(Ordering::Acquire)
    }

    /// Whether [`Ring::close`] has run.
    pub(crate) fn is_closed(&self) -> bool {
        self.tail.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Refuses every later push and returns the final tail: positions below it were claimed
    /// before the close and will all be published. Idempotent.
    pub(crate) fn close(&self) -> usize {
        // AcqRel: the returned tail is ordered after every claim below it (the CAS chain on
        // `tail` is one modification order), which is all the drain needs; the stamps carry
        // the slot contents.
        self.tail.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED
    }

    /// Claims a slot, lets `fill` write into it, and publishes it. Fails at once (without
    /// calling `fill`) with [`PushError::Full`] when every slot is taken, or
    /// [`PushError::Closed`] after [`Ring::close`]. Never waits: the loop only retries when
    /// another producer won the same position (that producer made progress) or the ring was
    /// closed under us (the next iteration returns).
    // Inlined into `emit`'s claim: whether the code generator does so on its own changes
    // with the size of the crate around it (docs/performance.md § Comparing two trees).
    #[inline]
    pub(crate) fn push(&self, fill: impl FnOnce(&mut T)) -> Result<(), PushError> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            if pos & CLOSED != 0 {
                return Err(PushError::Closed);
            }
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
                        // SAFETY: our CAS claimed position `pos` (the flag was clear in the
                        // word it replaced, so the ring was open), and `stamp == pos` (acquired
                        // above) means the consumer has released the slot: we own it until the
                        // store below. `fill` must not unwind (a claimed position that is never
                        // published would hold up the consumer for good): every caller's fill
                        // only copies into memory it has already sized.
                        slot.value.with_mut(|v| fill(unsafe { &mut *v }));
                        slot.stamp.store(pos.wrapping_add(1), Ordering::Release);
                        self.prefetch(pos.wrapping_add(1));
                        return Ok(());
                    }
                    Err(current) => pos = current,
                }
            } else if lag < 0 {
                // The slot still holds the previous lap's value: head <= pos - capacity while
                // tail >= pos, so the ring is full. (A closed ring reports Full here rather than
                // Closed when it is also full; the event is refused either way, and the next
                // push sees the flag.)
                return Err(PushError::Full);
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

    /// The next position to read.
    pub(crate) fn head(&self) -> usize {
        self.head
    }

    /// Reads the positions `head..end` of a closed ring (`end` from [`Ring::close`]) in order,
    /// waiting for claims still being written, until they are all read or `give_up` says so.
    /// `read` gets each value; `give_up` is asked before each position. Returns how many
    /// positions were left unread (0 unless `give_up` stopped it).
    ///
    /// Waiting is sound because a position below `end` was claimed while the ring was open,
    /// and its producer publishes it without waiting on anything (module docs § Closing).
    pub(crate) fn drain_closed(
        &mut self,
        end: usize,
        mut read: impl FnMut(&mut T),
        mut give_up: impl FnMut() -> bool,
    ) -> usize {
        let mut spins = 0u32;
        while self.head != end {
            if give_up() {
                break;
            }
            if self.pop(&mut read).is_some() {
                spins = 0;
                continue;
            }
            // Claimed, not yet published: its producer is between its CAS and its store.
            spins += 1;
            if spins < 64 {
                crate::sync::spin_loop();
            } else {
                crate::sync::yield_now();
            }
        }
        end.wrapping_sub(self.head)
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
            Err(PushError::Full)
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
            assert_eq!(ring.push(|v| *v = 0), Err(PushError::Full));
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

/// Model checks: every interleaving of 2 producers and 1 consumer on a tiny ring, and of the
/// close handshake with producers racing it.
/// Run with `RUSTFLAGS="--cfg loom" cargo test --release --no-default-features --lib ring`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::thread;

    /// Pushes from two producers while the consumer pops; checks that everything pushed
    /// successfully arrives exactly once, in per-producer order, untorn, and that a push is
    /// refused as full only when the ring really was full: every refusal must be explained by
    /// `capacity` values pushed and not yet popped at some point of the run.
    fn run(capacity: usize, per_producer: usize) {
        loom::model(move || {
            let (ring, mut rx) = Ring::new(capacity, || (0usize, 0usize, 0usize));
            let handles: Vec<_> = (1..=2)
                .map(|id| {
                    let ring = ring.clone();
                    thread::spawn(move || {
                        let (mut ok, mut full) = (0, 0);
                        for i in 0..per_producer {
                            // The triple lets a torn read show up as a mismatch.
                            match ring.push(|v| *v = (id, i, id * 100 + i)) {
                                Ok(()) => ok += 1,
                                Err(PushError::Full) => full += 1,
                                Err(PushError::Closed) => panic!("nobody closed the ring"),
                            }
                        }
                        (ok, full)
                    })
                })
                .collect();
            let mut seen = vec![Vec::<usize>::new(); 3];
            let mut popped_early = 0;
            let take = |rx: &mut Consumer<(usize, usize, usize)>, seen: &mut Vec<Vec<usize>>| {
                let mut n = 0;
                while let Some((id, i, check)) = rx.pop(|v| *v) {
                    assert_eq!(check, id * 100 + i, "torn slot");
                    seen[id].push(i);
                    n += 1;
                }
                n
            };
            popped_early += take(&mut rx, &mut seen);
            let results: Vec<(usize, usize)> =
                handles.into_iter().map(|h| h.join().unwrap()).collect();
            take(&mut rx, &mut seen);
            let pushed: usize = results.iter().map(|r| r.0).sum();
            let refused: usize = results.iter().map(|r| r.1).sum();
            for list in &seen {
                assert!(list.windows(2).all(|w| w[0] < w[1]), "order: {list:?}");
            }
            assert_eq!(seen.iter().map(Vec::len).sum::<usize>(), pushed);
            // A refusal means `capacity` values were in the ring at that moment, so at least
            // `capacity` pushes succeeded; and no more than the ring could take while the
            // consumer freed `popped_early` slots.
            if refused > 0 {
                assert!(
                    pushed >= capacity,
                    "a free ring refused a push: pushed {pushed}, refused {refused}, \
                     capacity {capacity}"
                );
            } else {
                assert_eq!(pushed, 2 * per_producer);
            }
            assert!(
                pushed <= capacity + popped_early,
                "more pushed than the ring could hold"
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

    /// Strict: with no consumer running, exactly the free slots are taken, in every
    /// interleaving — two producers racing for the last free slot (on a later lap, so the
    /// stamps carry an earlier lap's values) get one `Ok` and one `Full`, never two `Full`s.
    #[test]
    fn refused_only_when_really_full() {
        loom::model(|| {
            let (ring, mut rx) = Ring::new(2, || 0usize);
            for v in 0..3 {
                ring.push(|s| *s = v).unwrap();
                if v < 2 {
                    assert_eq!(rx.pop(|s| *s), Some(v));
                }
            }
            // Positions 0..3 claimed, 0..2 read: one value in, one slot free.
            let racers: Vec<_> = (0..2)
                .map(|id| {
                    let ring = ring.clone();
                    thread::spawn(move || ring.push(|s| *s = 10 + id))
                })
                .collect();
            let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
            let ok = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(ok, 1, "one free slot, two racers: {results:?}");
            assert!(results.contains(&Err(PushError::Full)));
            assert_eq!(rx.pop(|s| *s), Some(2));
            assert!(matches!(rx.pop(|s| *s), Some(10 | 11)));
        });
    }

    #[test]
    fn single_thread_full_then_wrap() {
        loom::model(|| {
            let (ring, mut rx) = Ring::new(2, || 0usize);
            ring.push(|v| *v = 1).unwrap();
            ring.push(|v| *v = 2).unwrap();
            assert_eq!(ring.push(|v| *v = 3), Err(PushError::Full));
            assert_eq!(rx.pop(|v| *v), Some(1));
            ring.push(|v| *v = 4).unwrap();
            assert_eq!(rx.pop(|v| *v), Some(2));
            assert_eq!(rx.pop(|v| *v), Some(4));
            assert_eq!(rx.pop(|v| *v), None);
        });
    }

    /// The shutdown handshake of ARCHITECTURE.md § Shutdown, with its protocol kept and its
    /// clock abstracted: loom cannot model `Instant` or `park_timeout`, so the deadline is
    /// "never" here (`give_up` is `|| false`) and the worker's idle parking is a plain loop.
    /// What is modelled is everything the guarantee rests on: the interest flag producers check
    /// first, the closed bit in the ring's tail, the final tail `close` returns, and the drain
    /// waiting for positions claimed before the close but not yet published. Two producers
    /// race the close from their first push to their last.
    ///
    /// Checked in every interleaving: every push that returned `Ok` (an `emit` that returned
    /// `Queued`) is read exactly once by the consumer — during normal running or by the final
    /// drain — and once the close has returned, no push succeeds.
    #[test]
    fn close_strands_nothing_and_refuses_everything_after_it() {
        loom::model(|| {
            let (ring, mut rx) = Ring::new(4, || 0usize);
            let interest = Arc::new(AtomicBool::new(true));
            let closed = Arc::new(AtomicBool::new(false));
            let producers: Vec<_> = (1..=2)
                .map(|id| {
                    let (ring, interest, closed) = (ring.clone(), interest.clone(), closed.clone());
                    thread::spawn(move || {
                        let mut queued = Vec::new();
                        for i in 0..2 {
                            if !interest.load(Ordering::Relaxed) {
                                continue; // Skipped on the fast path
                            }
                            let was_closed = closed.load(Ordering::Acquire);
                            match ring.push(|v| *v = id * 10 + i) {
                                Ok(()) => {
                                    assert!(!was_closed, "a push succeeded after close returned");
                                    queued.push(id * 10 + i);
                                }
                                Err(PushError::Closed) => {}
                                Err(PushError::Full) => panic!("4 slots hold 4 pushes"),
                            }
                        }
                        queued
                    })
                })
                .collect();
            // The worker, running: takes what is there.
            let mut read = Vec::new();
            if let Some(v) = rx.pop(|v| *v) {
                read.push(v);
            }
            // Shutdown: interest off, close, drain to the final tail.
            interest.store(false, Ordering::Relaxed);
            let end = ring.close();
            closed.store(true, Ordering::Release);
            let left = rx.drain_closed(end, |v| read.push(*v), || false);
            assert_eq!(left, 0);
            let mut queued: Vec<usize> = producers
                .into_iter()
                .flat_map(|p| p.join().unwrap())
                .collect();
            queued.sort_unstable();
            read.sort_unstable();
            assert_eq!(read, queued, "queued events stranded or read twice");
            assert!(ring.is_closed());
            assert_eq!(rx.pop(|v| *v), None);
        });
    }
}
