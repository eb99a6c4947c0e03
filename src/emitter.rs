//! The producer side: [`Emitter::emit`] and the ring slot it fills.
//!
//! `emit` runs on the agent's own threads, so it does as little as possible and never waits:
//!
//! 1. one relaxed load of the interest mask — nobody listens: count it, return `Skipped`;
//! 2. one `fetch_add` on this emitter's sequence counter (its own cache line);
//! 3. claim a ring slot and copy the borrowed strings into the slot's preallocated buffer;
//! 4. publish. A full ring is `Dropped` and counted; nothing is retried.
//!
//! Events larger than the inline buffer take their bytes from a global budget and allocate
//! (before claiming the slot, to keep the claim-to-publish window short); the worker frees them
//! and returns the bytes to the budget. Events beyond `max_event_bytes` or beyond the budget are
//! dropped and counted — never truncated.

use crate::event::{Event, EventKind, Parts};
use crate::pipeline::Interest;
use crate::ring::Ring;
use crate::stats::Stats;
use crossbeam_utils::CachePadded;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// What `emit` did with an event. Informational: a hook never changes the agent's flow.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Emit {
    /// In the ring; the workers will deliver it.
    Queued,
    /// Refused (ring full, byte budget exhausted, or larger than `max_event_bytes`) and counted.
    Dropped,
    /// Nobody listens to this event: nothing was copied or queued.
    Skipped,
}

/// One ring slot: an event flattened to scalars plus its strings (agent, session, and up to two
/// event fields) stored back to back.
pub(crate) struct EventSlot {
    kind: EventKind,
    flag: bool,
    num: u64,
    seq: u64,
    lens: [u32; 4],
    inline: Box<[u8]>,
    heap: Option<Box<[u8]>>,
}

impl EventSlot {
    /// A slot with `inline` bytes of preallocated, touched buffer.
    pub(crate) fn new(inline: usize) -> EventSlot {
        EventSlot {
            kind: EventKind::TurnComplete,
            flag: false,
            num: 0,
            seq: 0,
            lens: [0; 4],
            // Non-zero fill so the pages are really written now, not on the first emit.
            inline: vec![0xA5; inline].into_boxed_slice(),
            heap: None,
        }
    }

    fn fill(&mut self, p: &Parts<'_>, strs: [&str; 4], seq: u64, heap: &mut Option<Box<[u8]>>) {
        self.kind = p.kind;
        self.flag = p.flag;
        self.num = p.num[0];
        self.seq = seq;
        self.lens = strs.map(|s| s.len() as u32);
        match heap.take() {
            Some(buf) => self.heap = Some(buf),
            None => copy_into(&mut self.inline, strs),
        }
    }

    /// Rebuilds the event from the slot and hands it to `f` with (agent, session, seq). Frees a
    /// large event's buffer afterwards and returns how many budget bytes it held.
    pub(crate) fn read<R>(
        &mut self,
        f: impl FnOnce(Event<'_>, &str, &str, u64) -> R,
    ) -> (R, usize) {
        let heap = self.heap.take();
        let bytes: &[u8] = heap.as_deref().unwrap_or(&self.inline);
        let mut strs = [""; 4];
        let mut at = 0;
        for (s, &len) in strs.iter_mut().zip(&self.lens) {
            let end = at + len as usize;
            // SAFETY: `fill` wrote these exact ranges from `&str`s (inline or into `heap`), so
            // each range is a complete, valid UTF-8 string.
            *s = unsafe { std::str::from_utf8_unchecked(&bytes[at..end]) };
            at = end;
        }
        let parts = Parts {
            kind: self.kind,
            strs: [strs[2], strs[3]],
            num: [self.num],
            flag: self.flag,
        };
        let out = f(Event::from_parts(parts), strs[0], strs[1], self.seq);
        (out, heap.map_or(0, |h| h.len()))
    }
}

fn copy_into(buf: &mut [u8], strs: [&str; 4]) {
    let mut at = 0;
    for s in strs {
        buf[at..at + s.len()].copy_from_slice(s.as_bytes());
        at += s.len();
    }
}

/// Counters written by one emitter (and its clones) on `emit`: one cache line of its own.
#[derive(Default)]
pub(crate) struct EmitterCounters {
    /// Events queued (each took the next sequence number).
    seq: AtomicU64,
    skipped: AtomicU64,
    dropped: AtomicU64,
    dropped_budget: AtomicU64,
    oversize: AtomicU64,
    dropped_bytes: AtomicU64,
}

impl EmitterCounters {
    fn add_to(&self, t: &mut Totals) {
        t.seq += self.seq.load(Relaxed);
        t.skipped += self.skipped.load(Relaxed);
        t.dropped += self.dropped.load(Relaxed);
        t.dropped_budget += self.dropped_budget.load(Relaxed);
        t.oversize += self.oversize.load(Relaxed);
        t.dropped_bytes += self.dropped_bytes.load(Relaxed);
    }
}

#[derive(Default, Clone, Copy)]
struct Totals {
    seq: u64,
    skipped: u64,
    dropped: u64,
    dropped_budget: u64,
    oversize: u64,
    dropped_bytes: u64,
}

/// Everything emitters share: limits, the byte budget, the interest mask, and the registry of
/// live emitters' counters (for stats).
pub(crate) struct Producers {
    pub(crate) interest: Arc<Interest>,
    inline: usize,
    max_event_bytes: usize,
    budget: usize,
    budget_in_use: CachePadded<AtomicUsize>,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    live: HashMap<u64, Arc<CachePadded<EmitterCounters>>>,
    /// Counters of emitters that are gone, folded in when the last clone dropped.
    retired: Totals,
}

impl Producers {
    pub(crate) fn new(
        interest: Arc<Interest>,
        inline: usize,
        max_event_bytes: usize,
        budget: usize,
    ) -> Producers {
        Producers {
            interest,
            inline,
            max_event_bytes,
            budget,
            budget_in_use: CachePadded::new(AtomicUsize::new(0)),
            registry: Mutex::default(),
        }
    }

    fn reserve(&self, bytes: usize) -> bool {
        let prev = self.budget_in_use.fetch_add(bytes, Relaxed);
        if prev + bytes > self.budget {
            self.budget_in_use.fetch_sub(bytes, Relaxed);
            return false;
        }
        true
    }

    pub(crate) fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.budget_in_use.fetch_sub(bytes, Relaxed);
        }
    }

    /// Fills the producer-side fields of `stats`.
    pub(crate) fn fill_stats(&self, stats: &mut Stats) {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = reg.retired;
        reg.live.values().for_each(|c| c.add_to(&mut t));
        drop(reg);
        stats.emitted = t.seq + t.dropped + t.skipped + t.dropped_budget + t.oversize;
        stats.queued = t.seq;
        stats.dropped = t.dropped;
        stats.dropped_budget = t.dropped_budget;
        stats.oversize = t.oversize;
        stats.dropped_bytes = t.dropped_bytes;
        stats.skipped = t.skipped;
        stats.ring.budget = self.budget as u64;
        stats.ring.budget_in_use = self.budget_in_use.load(Relaxed) as u64;
    }

    pub(crate) fn inline_bytes(&self) -> usize {
        self.inline
    }
}

/// A handle agents emit events through, bound to one (agent, session) pair.
///
/// `Clone + Send + Sync` and cheap to clone; clones share the sequence counter. Events from one
/// emitter reach every subscriber in the order their `emit` calls claimed ring slots (for one
/// thread: program order).
#[derive(Clone)]
pub struct Emitter(Arc<EmitterInner>);

struct EmitterInner {
    counters: Arc<CachePadded<EmitterCounters>>,
    /// The pipeline's interest mask, held directly: `emit`'s first check is two loads away.
    interest: Arc<Interest>,
    id: u64,
    agent: Box<str>,
    session: Box<str>,
    ring: Arc<Ring<EventSlot>>,
    producers: Arc<Producers>,
}

impl Emitter {
    pub(crate) fn new(
        producers: Arc<Producers>,
        ring: Arc<Ring<EventSlot>>,
        agent: &str,
        session: &str,
    ) -> Emitter {
        let counters = Arc::new(CachePadded::new(EmitterCounters::default()));
        let id = {
            let mut reg = producers.registry.lock().unwrap_or_else(|e| e.into_inner());
            reg.next_id += 1;
            let id = reg.next_id;
            reg.live.insert(id, counters.clone());
            id
        };
        Emitter(Arc::new(EmitterInner {
            counters,
            interest: producers.interest.clone(),
            id,
            agent: agent.into(),
            session: session.into(),
            ring,
            producers,
        }))
    }

    /// Hands `event` to the pipeline. Never blocks, never makes a syscall, and allocates only
    /// for events larger than the inline slot size.
    ///
    /// Only the "nobody listens" check is inlined into the caller; the rest is one call away.
    #[inline]
    pub fn emit(&self, event: Event<'_>) -> Emit {
        let e = &*self.0;
        if !e.interest.wants(event.kind()) {
            e.counters.skipped.fetch_add(1, Relaxed);
            return Emit::Skipped;
        }
        self.enqueue(event)
    }

    #[inline(never)]
    fn enqueue(&self, event: Event<'_>) -> Emit {
        let e = &*self.0;
        let p = event.parts();
        let strs = [&*e.agent, &*e.session, p.strs[0], p.strs[1]];
        let total: usize = strs.iter().map(|s| s.len()).sum();
        let mut heap = None;
        if total > e.producers.inline {
            heap = match self.take_large(strs, total) {
                Some(buf) => Some(buf),
                None => return Emit::Dropped,
            };
        }
        // The sequence number is taken only once a slot is ours: a dropped event costs no RMW
        // for it, and `seq` counts exactly the queued events.
        let seq = &e.counters.seq;
        match e
            .ring
            .push(|slot| slot.fill(&p, strs, seq.fetch_add(1, Relaxed), &mut heap))
        {
            Ok(()) => Emit::Queued,
            Err(_full) => {
                if heap.is_some() {
                    e.producers.release(total);
                }
                e.counters.dropped.fetch_add(1, Relaxed);
                e.counters.dropped_bytes.fetch_add(total as u64, Relaxed);
                Emit::Dropped
            }
        }
    }

    /// The slow path for events above the inline size: check the limits, reserve budget,
    /// allocate and fill the buffer. `None` means dropped (and counted).
    #[cold]
    fn take_large(&self, strs: [&str; 4], total: usize) -> Option<Box<[u8]>> {
        let e = &*self.0;
        let counter = if total > e.producers.max_event_bytes {
            &e.counters.oversize
        } else if !e.producers.reserve(total) {
            &e.counters.dropped_budget
        } else {
            let mut buf = vec![0; total].into_boxed_slice();
            copy_into(&mut buf, strs);
            return Some(buf);
        };
        counter.fetch_add(1, Relaxed);
        e.counters.dropped_bytes.fetch_add(total as u64, Relaxed);
        None
    }

    pub fn agent(&self) -> &str {
        &self.0.agent
    }

    pub fn session(&self) -> &str {
        &self.0.session
    }

    /// Whether an event of this kind would be delivered anywhere right now.
    pub fn is_listened(&self, kind: EventKind) -> bool {
        self.0.producers.interest.wants(kind)
    }
}

impl Drop for EmitterInner {
    fn drop(&mut self) {
        let mut reg = self
            .producers
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        reg.live.remove(&self.id);
        let mut t = reg.retired;
        self.counters.add_to(&mut t);
        reg.retired = t;
    }
}

impl std::fmt::Debug for Emitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitter")
            .field("agent", &self.agent())
            .field("session", &self.session())
            .finish()
    }
}
