//! The producer side: [`Emitter::emit`] and the ring slot it fills.
//!
//! `emit` runs on the agent's own threads, so it does as little as possible and never waits:
//!
//! 1. one relaxed load of the interest mask — nobody listens: count it, return `Skipped`;
//! 2. claim a ring slot (one CAS on the ring's tail) and copy the borrowed strings into the
//!    slot's preallocated buffer;
//! 3. publish (one release store). A full ring is `Dropped` and counted; a closed one (after
//!    shutdown) is `Skipped` and counted; nothing is retried.
//!
//! Queued events need no counter of their own: every successful claim moves a ring's tail, so
//! `queued` is the sum of the tails. Sequence numbers are not taken here either: the worker
//! numbers each event when it pops it ([`SeqCell`]), because ring order *is* delivery order and
//! a counter taken beside the claim could disagree with it when clones emit from several threads
//! (ARCHITECTURE.md § Ordering).
//!
//! Events larger than the inline buffer take their bytes from a global budget and allocate
//! (before claiming the slot, to keep the claim-to-publish window short); the worker frees them
//! and returns the bytes to the budget. Events beyond `max_event_bytes` or beyond the budget are
//! dropped and counted — never truncated. Only those large events allocate, take malloc's locks
//! or can make a syscall (a large allocation may `mmap`); an event that fits inline does none
//! of that.

use crate::event::{Event, EventKind, Extras, ExtrasError};
use crate::interest::Interest;
use crate::ring::{PushError, Ring};
use crate::stats::Stats;
use crossbeam_utils::CachePadded;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

mod slot;

pub(crate) use slot::EventSlot;
use slot::copy_into;

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

/// An emitter's next sequence number. Written only by the worker that consumes the emitter's
/// ring (a plain load and store, no read-modify-write), when it pops one of its events: every
/// clone of an emitter pushes into the same ring, so numbering at pop time follows ring order,
/// which is delivery order.
///
/// Lifetime: slots point at it ([`EventSlot`] holds a raw pointer, so an `emit` costs no
/// reference count). The emitter owns it; when the last clone drops, the cell goes to its
/// [`Lane`]'s graveyard with the ring's tail at that moment, and the worker frees it only after
/// reading past that tail, i.e. after the emitter's last event.
///
/// `relay` (set once, at creation) marks a relay emitter's events — the NATS consumer's —
/// for the publisher (ARCHITECTURE.md § NATS bridge, "Relaying"): the worker reads it from
/// the cache line it already touches for the number, so `emit` pays nothing for it.
#[derive(Debug, Default)]
pub(crate) struct SeqCell {
    next: AtomicU64,
    relay: u64,
}

impl SeqCell {
    /// Takes the next number. Only the ring's consumer calls this.
    fn take(&self) -> u64 {
        let seq = self.next.load(Relaxed);
        self.next.store(seq + 1, Relaxed);
        seq
    }
}

/// One worker's ring, and the sequence cells of emitters that were dropped while some of their
/// events may still be in it.
pub(crate) struct Lane {
    pub(crate) ring: Arc<Ring<EventSlot>>,
    graves: Mutex<Graves>,
    has_graves: AtomicBool,
}

#[derive(Default)]
struct Graves {
    cells: Vec<(Arc<CachePadded<SeqCell>>, usize)>,
    /// The worker has stopped for good: nobody will read a slot again, so a cell can go at once.
    consumer_gone: bool,
}

impl Lane {
    pub(crate) fn new(ring: Arc<Ring<EventSlot>>) -> Lane {
        Lane {
            ring,
            graves: Mutex::default(),
            has_graves: AtomicBool::new(false),
        }
    }

    fn bury(&self, cell: Arc<CachePadded<SeqCell>>) {
        // Every claim the emitter made happened before its last clone dropped (the reference
        // count's release/acquire orders them), so each of its positions is below this tail.
        let tail = self.ring.claimed();
        let mut graves = self.graves.lock().unwrap_or_else(|e| e.into_inner());
        if !graves.consumer_gone {
            graves.cells.push((cell, tail));
            self.has_graves.store(true, Relaxed);
        }
    }

    /// Frees the cells of dropped emitters whose events are all read (`head`: the consumer's
    /// next position). Called by the ring's consumer; cheap when there is nothing to free.
    pub(crate) fn collect(&self, head: usize) {
        if !self.has_graves.load(Relaxed) {
            return;
        }
        let mut graves = self.graves.lock().unwrap_or_else(|e| e.into_inner());
        // `tail` not yet reached: tail - head, as a signed distance, is positive.
        graves
            .cells
            .retain(|(_, tail)| (tail.wrapping_sub(head) as isize) > 0);
        if graves.cells.is_empty() {
            self.has_graves.store(false, Relaxed);
        }
    }

    /// The consumer has stopped for good (after shutdown): frees every buried cell, and every
    /// later one as soon as its emitter drops. No slot is read after this, so no pointer to a
    /// cell is dereferenced again.
    pub(crate) fn consumer_gone(&self) {
        let mut graves = self.graves.lock().unwrap_or_else(|e| e.into_inner());
        graves.consumer_gone = true;
        graves.cells.clear();
        self.has_graves.store(false, Relaxed);
    }
}

/// Counters written by one emitter (and its clones) on `emit`: one cache line of its own.
/// Queued events are not counted here: the rings' tails count them.
#[derive(Default)]
pub(crate) struct EmitterCounters {
    skipped: AtomicU64,
    /// `emit_with_extras` calls refused for their extras (not emits: the caller got an error).
    refused_extras: AtomicU64,
    dropped: AtomicU64,
    dropped_budget: AtomicU64,
    oversize: AtomicU64,
    dropped_bytes: AtomicU64,
}

impl EmitterCounters {
    fn add_to(&self, t: &mut Totals) {
        t.skipped += self.skipped.load(Relaxed);
        t.refused_extras += self.refused_extras.load(Relaxed);
        t.dropped += self.dropped.load(Relaxed);
        t.dropped_budget += self.dropped_budget.load(Relaxed);
        t.oversize += self.oversize.load(Relaxed);
        t.dropped_bytes += self.dropped_bytes.load(Relaxed);
    }
}

#[derive(Default, Clone, Copy)]
struct Totals {
    skipped: u64,
    refused_extras: u64,
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
    /// What the NATS consumer attaches to the events it emits, taken by the workers
    /// ([`crate::settle`]).
    pub(crate) attachments: crate::settle::Attachments,
    /// The last token [`Emitter::emit_attached`] gave out (tokens are never 0).
    tokens: AtomicU64,
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
            attachments: crate::settle::Attachments::default(),
            tokens: AtomicU64::new(0),
        }
    }

    /// Takes `bytes` from the byte budget if they fit. A CAS loop, not add-then-undo: a
    /// reservation that fails never shows in `budget_in_use`, so it cannot make a concurrent
    /// one that fits fail too.
    fn reserve(&self, bytes: usize) -> bool {
        self.budget_in_use
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.budget)
            })
            .is_ok()
    }

    pub(crate) fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.budget_in_use.fetch_sub(bytes, Relaxed);
        }
    }

    /// Emitters alive now (a clone of any of them still held).
    #[cfg(test)]
    pub(crate) fn live_emitters(&self) -> usize {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        reg.live.len()
    }

    /// Fills the producer-side fields of `stats`; `queued` is the rings' claims (their tails).
    pub(crate) fn fill_stats(&self, stats: &mut Stats, queued: u64) {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = reg.retired;
        reg.live.values().for_each(|c| c.add_to(&mut t));
        drop(reg);
        stats.emitted = queued + t.dropped + t.skipped + t.dropped_budget + t.oversize;
        stats.queued = queued;
        stats.dropped = t.dropped;
        stats.dropped_budget = t.dropped_budget;
        stats.oversize = t.oversize;
        stats.dropped_bytes = t.dropped_bytes;
        stats.skipped = t.skipped;
        stats.refused_extras = t.refused_extras;
        stats.ring.budget = self.budget as u64;
        stats.ring.budget_in_use = self.budget_in_use.load(Relaxed) as u64;
    }

    pub(crate) fn inline_bytes(&self) -> usize {
        self.inline
    }

    /// A new attachment token (never 0).
    fn next_token(&self) -> u64 {
        self.tokens.fetch_add(1, Relaxed) + 1
    }

    pub(crate) fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }

    /// The byte budget for larger-than-inline events, and how much of it is held now.
    pub(crate) fn budget(&self) -> (usize, usize) {
        (self.budget, self.budget_in_use.load(Relaxed))
    }
}

/// A handle agents emit events through, bound to one (agent, session) pair.
///
/// `Clone + Send + Sync` and cheap to clone; clones share the sequence numbers. Events from one
/// emitter reach every subscriber in the order their `emit` calls claimed ring slots (for one
/// thread: program order), and `seq` counts up by one in that order, clones included.
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
    /// Numbered by the ring's worker; handed to the lane's graveyard on drop.
    seq: Arc<CachePadded<SeqCell>>,
    lane: Arc<Lane>,
    producers: Arc<Producers>,
}

impl Emitter {
    pub(crate) fn new(
        producers: Arc<Producers>,
        lane: Arc<Lane>,
        agent: &str,
        session: &str,
    ) -> Emitter {
        Emitter::with_relay(producers, lane, agent, session, false)
    }

    /// An emitter whose events carry its id as their relay id ([`Emitter::relay_id`]): the
    /// NATS consumer's, so that the publisher of the same `Hooks` knows what it relays.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn with_relay(
        producers: Arc<Producers>,
        lane: Arc<Lane>,
        agent: &str,
        session: &str,
        relay: bool,
    ) -> Emitter {
        Emitter::build(producers, lane, agent, session, relay, 0)
    }

    /// An emitter whose first queued event is numbered `next_seq`: a key's emitter made again
    /// by [`crate::ingest::Sessions`] after the previous one was released with nothing left in
    /// the ring, so that `seq` goes on where it stopped (ARCHITECTURE.md § Ingest).
    pub(crate) fn resuming(
        producers: Arc<Producers>,
        lane: Arc<Lane>,
        agent: &str,
        session: &str,
        next_seq: u64,
    ) -> Emitter {
        Emitter::build(producers, lane, agent, session, false, next_seq)
    }

    fn build(
        producers: Arc<Producers>,
        lane: Arc<Lane>,
        agent: &str,
        session: &str,
        relay: bool,
        next_seq: u64,
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
            ring: lane.ring.clone(),
            seq: Arc::new(CachePadded::new(SeqCell {
                next: AtomicU64::new(next_seq),
                relay: if relay { id } else { 0 },
            })),
            lane,
            producers,
        }))
    }

    /// Bytes an emitter whose agent and session names hold `name_bytes` together takes on the
    /// heap: its own allocation, its counters', its `seq` cell's, its place in the registry of
    /// live emitters and the names (allocator rounding left out). What the session map counts
    /// against its byte bound (ARCHITECTURE.md § Ingest).
    pub(crate) const fn heap_bytes(name_bytes: usize) -> usize {
        /// An `Arc<T>`'s allocation: the two counts, then `T`, aligned as `T` is.
        const fn arc<T>() -> usize {
            std::mem::size_of::<(AtomicUsize, AtomicUsize, T)>()
        }
        arc::<EmitterInner>()
            + arc::<CachePadded<EmitterCounters>>()
            + arc::<CachePadded<SeqCell>>()
            + std::mem::size_of::<(u64, Arc<CachePadded<EmitterCounters>>)>()
            + name_bytes
    }

    /// Hands `event` to the pipeline. Never blocks, never makes a syscall, and allocates only
    /// for events larger than the inline slot size.
    ///
    /// Only the "nobody listens" check is inlined into the caller; the rest is one call away.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Emit, Event, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// let em = hooks.emitter("my-agent", "s1");
    /// // Nobody listens yet: nothing is copied or queued.
    /// assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
    /// let sub = hooks.bus().subscribe("prx.lifecycle.tool_call_start")?;
    /// let call = Event::ToolCallStart { tool: "shell", arguments: r#"{"cmd": "ls"}"# };
    /// assert_eq!(em.emit(call), Emit::Queued);
    /// let msg = sub.recv()?;
    /// assert_eq!(msg.json_str(), r#"{"tool":"shell","arguments":{"cmd":"ls"}}"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn emit(&self, event: Event<'_>) -> Emit {
        let e = &*self.0;
        if !e.interest.wants(event.kind()) {
            e.counters.skipped.fetch_add(1, Relaxed);
            return Emit::Skipped;
        }
        self.enqueue(event, "", 0, 0)
    }

    /// [`emit`](Emitter::emit) with what agents really send beside the documented fields:
    /// extra payload fields, written after the documented ones byte-exact, and documented
    /// fields left out (lenient input). See [`Extras`].
    ///
    /// The extras are checked first, on this thread (one pass over their text): refused ones
    /// are an `Err` — nothing is emitted, and the refusal is counted in
    /// `Stats::refused_extras`. Accepted ones count against `inline_bytes` and the byte budget
    /// like any field. Plain `emit` is unaffected.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Event, Extras, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
    /// let em = hooks.emitter("my-agent", "s1");
    /// let end = Event::AgentEnd { success: true, messages_count: 4 };
    /// em.emit_with_extras(end, &Extras::fields(r#"{"tokens_used": 300}"#))?;
    /// let json = sub.recv()?.json_str().to_string();
    /// assert_eq!(json, r#"{"success":true,"messages_count":4,"tokens_used":300}"#);
    /// // A member that repeats a documented field is refused; nothing is emitted.
    /// assert!(em.emit_with_extras(end, &Extras::fields(r#"{"messages_count": 1}"#)).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn emit_with_extras(
        &self,
        event: Event<'_>,
        extras: &Extras<'_>,
    ) -> Result<Emit, ExtrasError> {
        let e = &*self.0;
        let omitted = match extras.check(event.kind()) {
            Ok(omitted) => omitted,
            Err(err) => {
                e.counters.refused_extras.fetch_add(1, Relaxed);
                return Err(err);
            }
        };
        if !e.interest.wants(event.kind()) {
            e.counters.skipped.fetch_add(1, Relaxed);
            return Ok(Emit::Skipped);
        }
        Ok(self.enqueue(event, extras.json(), omitted, 0))
    }

    /// [`emit_with_extras`](Emitter::emit_with_extras) (or [`emit`](Emitter::emit), with no
    /// extras) of an event that carries `attached` to its message: an ingested event's id and
    /// original time, and the ticket that reports once its hooks settled it. Not emitted
    /// (dropped, refused, or the pipeline closed): `attached` goes at once, marked dropped.
    /// Skipped because nobody listens: it goes unmarked (nothing had to run, so it is done).
    pub(crate) fn emit_attached(
        &self,
        event: Event<'_>,
        extras: Option<&Extras<'_>>,
        attached: crate::settle::Attached,
    ) -> Result<Emit, ExtrasError> {
        let e = &*self.0;
        let omitted = match extras.map(|x| x.check(event.kind())) {
            None => 0,
            Some(Ok(omitted)) => omitted,
            Some(Err(err)) => {
                e.counters.refused_extras.fetch_add(1, Relaxed);
                attached.mark_dropped();
                return Err(err);
            }
        };
        if !e.interest.wants(event.kind()) {
            e.counters.skipped.fetch_add(1, Relaxed);
            return Ok(Emit::Skipped);
        }
        let token = e.producers.next_token();
        let attachments = &e.producers.attachments;
        attachments.insert(0, token, attached);
        let emitted = self.enqueue(event, extras.map_or("", |x| x.json()), omitted, token);
        if emitted != Emit::Queued
            && let Some(a) = attachments.take(0, token)
        {
            // Dropped, or skipped because the pipeline closed under us: never delivered.
            a.mark_dropped();
        }
        Ok(emitted)
    }

    #[inline(never)]
    fn enqueue(&self, event: Event<'_>, extras: &str, omitted: u8, token: u64) -> Emit {
        let e = &*self.0;
        let p = event.parts();
        let strs = [&*e.agent, &*e.session, p.strs[0], p.strs[1], extras];
        let total: usize = strs.iter().map(|s| s.len()).sum();
        let mut heap = None;
        if total > e.producers.inline {
            heap = match self.take_large(strs, total) {
                Some(buf) => Some(buf),
                None => return Emit::Dropped,
            };
        }
        let seq = NonNull::from(&*e.seq);
        match e
            .ring
            .push(|slot| slot.fill(&p, strs, omitted, seq, token, &mut heap))
        {
            Ok(()) => Emit::Queued,
            Err(refused) => {
                if heap.is_some() {
                    e.producers.release(total);
                }
                if refused == PushError::Closed {
                    // Shut down after our interest check: nobody will deliver it.
                    e.counters.skipped.fetch_add(1, Relaxed);
                    return Emit::Skipped;
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
    fn take_large(&self, strs: [&str; 5], total: usize) -> Option<Box<[u8]>> {
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

    /// Non-zero for a relay emitter ([`Emitter::with_relay`]): the id its events carry.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))]
    pub(crate) fn relay_id(&self) -> u64 {
        self.0.seq.relay
    }

    /// The ring's claimed tail now: read right after one of this thread's claims, every
    /// position this emitter has claimed so far on this thread is below it.
    pub(crate) fn ring_claimed(&self) -> usize {
        self.0.ring.claimed()
    }

    /// Whether the worker has read every position below `tail` of this emitter's ring (so
    /// none of the events claimed before `tail` was taken is still in the ring).
    pub(crate) fn ring_read_past(&self, tail: usize) -> bool {
        (tail.wrapping_sub(self.0.ring.read_position()) as isize) <= 0
    }

    /// The `seq` the worker will give this emitter's next event. Final (nobody else writes it)
    /// once [`ring_read_past`](Emitter::ring_read_past) holds for a tail taken after the
    /// emitter's last claim: the worker takes the number before it moves the ring's head
    /// (release), and `ring_read_past` loads the head with acquire.
    pub(crate) fn next_seq(&self) -> u64 {
        self.0.seq.next.load(Relaxed)
    }

    /// The agent this emitter's events come from.
    ///
    /// # Examples
    ///
    /// ```
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let em = hooks.emitter("my-agent", "s1");
    /// assert_eq!((em.agent(), em.session()), ("my-agent", "s1"));
    /// # Ok::<(), prx_hooks::BuildError>(())
    /// ```
    pub fn agent(&self) -> &str {
        &self.0.agent
    }

    /// The session this emitter's events belong to.
    pub fn session(&self) -> &str {
        &self.0.session
    }

    /// Whether an event of this kind would be delivered anywhere right now.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::EventKind;
    /// let hooks = prx_hooks::Hooks::builder().build()?;
    /// let em = hooks.emitter("my-agent", "s1");
    /// assert!(!em.is_listened(EventKind::Error));
    /// let _sub = hooks.bus().subscribe("prx.lifecycle.error")?;
    /// assert!(em.is_listened(EventKind::Error));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_listened(&self, kind: EventKind) -> bool {
        self.0.producers.interest.wants(kind)
    }
}

impl Drop for EmitterInner {
    fn drop(&mut self) {
        // The lane keeps the cell until the worker has read this emitter's last event.
        self.lane.bury(self.seq.clone());
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

/// The emitter and its slots on their own, with a tiny ring and the test thread as consumer:
/// small enough for Miri, which checks the raw `SeqCell` pointers, the unchecked UTF-8 and the
/// slot handover for undefined behaviour and leaks (`.ci/run` runs `emitter::` under Miri).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::event::EventMask;
    use crate::ring::Consumer;

    fn setup(
        slots: usize,
        inline: usize,
        budget: usize,
    ) -> (Arc<Producers>, Arc<Lane>, Consumer<EventSlot>) {
        let interest = Interest::new(1);
        interest.handle(0).set(EventMask::ALL);
        let producers = Arc::new(Producers::new(interest, inline, 1 << 20, budget));
        let (ring, consumer) = Ring::new(slots, || EventSlot::new(inline));
        (producers, Arc::new(Lane::new(ring)), consumer)
    }

    /// Pops one event as the worker does: (tool or component, seq, budget bytes released).
    fn pop(rx: &mut Consumer<EventSlot>) -> Option<(String, String, u64, usize)> {
        rx.pop(|slot| {
            slot.read(|r| {
                let field = match r.event {
                    Event::ToolCall { tool, .. } => tool.to_string(),
                    Event::Error { message, .. } => message.to_string(),
                    other => format!("{:?}", other.kind()),
                };
                (r.agent.to_string(), field, r.seq)
            })
        })
        .map(|((agent, field, seq), bytes)| (agent, field, seq, bytes))
    }

    #[test]
    fn inline_and_large_events_round_trip_numbered_in_ring_order() {
        let (producers, lane, mut rx) = setup(4, 16, 1 << 10);
        let em = Emitter::new(producers.clone(), lane.clone(), "agent", "s");
        let big = "x".repeat(100);
        assert_eq!(
            em.emit(Event::ToolCall {
                tool: "t",
                success: true,
                output: "o"
            }),
            Emit::Queued
        );
        assert_eq!(
            em.emit(Event::Error {
                component: "c",
                message: &big
            }),
            Emit::Queued
        );
        assert_eq!(producers.budget_in_use.load(Relaxed), 5 + 1 + 1 + 100);
        assert_eq!(pop(&mut rx), Some(("agent".into(), "t".into(), 0, 0)));
        let (_, message, seq, bytes) = pop(&mut rx).unwrap();
        assert_eq!((message, seq, bytes), (big, 1, 107));
        producers.release(bytes);
        assert_eq!(producers.budget_in_use.load(Relaxed), 0);
        assert_eq!(pop(&mut rx), None);
    }

    #[test]
    fn a_dropped_emitter_keeps_its_cell_until_its_last_event_is_read() {
        let (producers, lane, mut rx) = setup(4, 64, 1 << 10);
        let em = Emitter::new(producers.clone(), lane.clone(), "gone", "s");
        let clone = em.clone();
        for _ in 0..3 {
            assert_eq!(clone.emit(Event::TurnComplete), Emit::Queued);
        }
        drop(em);
        drop(clone); // the last clone: its cell goes to the graveyard, its events stay
        assert!(lane.has_graves.load(Relaxed));
        // The consumer reads through the buried cell (Miri: no use after free) ...
        for want in 0..3 {
            assert_eq!(pop(&mut rx).map(|e| e.2), Some(want));
            lane.collect(rx.head());
        }
        // ... and the cell is freed once its last event is read (Miri: no leak).
        assert!(!lane.has_graves.load(Relaxed));
        assert!(lane.graves.lock().unwrap().cells.is_empty());
    }

    #[test]
    fn a_cell_is_not_freed_while_an_older_emitters_events_are_still_ahead() {
        let (producers, lane, mut rx) = setup(8, 64, 1 << 10);
        let first = Emitter::new(producers.clone(), lane.clone(), "first", "s");
        let second = Emitter::new(producers.clone(), lane.clone(), "second", "s");
        first.emit(Event::TurnComplete);
        second.emit(Event::TurnComplete);
        second.emit(Event::TurnComplete);
        drop(second);
        lane.collect(rx.head()); // nothing read yet: the cell must stay
        assert_eq!(lane.graves.lock().unwrap().cells.len(), 1);
        assert_eq!(pop(&mut rx).map(|e| (e.0, e.2)), Some(("first".into(), 0)));
        lane.collect(rx.head());
        assert_eq!(lane.graves.lock().unwrap().cells.len(), 1);
        assert_eq!(pop(&mut rx).map(|e| (e.0, e.2)), Some(("second".into(), 0)));
        assert_eq!(pop(&mut rx).map(|e| (e.0, e.2)), Some(("second".into(), 1)));
        lane.collect(rx.head());
        assert!(lane.graves.lock().unwrap().cells.is_empty());
        // After the consumer is gone, cells go at once: emitters made after shutdown leak none.
        lane.consumer_gone();
        let late = Emitter::new(producers.clone(), lane.clone(), "late", "s");
        late.emit(Event::TurnComplete);
        drop(late);
        assert!(lane.graves.lock().unwrap().cells.is_empty());
        drop(first);
    }

    #[test]
    fn clones_on_two_threads_are_numbered_in_delivery_order() {
        let per = if cfg!(miri) { 20 } else { 20_000 };
        let (producers, lane, mut rx) = setup(4, 64, 1 << 10);
        let em = Emitter::new(producers, lane, "a", "s");
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let em = em.clone();
                std::thread::spawn(move || {
                    let tool = if t == 0 { "zero" } else { "one" };
                    let mut sent = 0;
                    while sent < per {
                        if em.emit(Event::ToolCall {
                            tool,
                            success: true,
                            output: "",
                        }) == Emit::Queued
                        {
                            sent += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = 0;
        while next < 2 * per {
            match pop(&mut rx) {
                Some((_, _, seq, _)) => {
                    assert_eq!(seq, next, "numbered out of delivery order");
                    next += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        threads.into_iter().for_each(|t| t.join().unwrap());
    }

    #[test]
    fn a_closed_ring_skips_and_counts_and_frees_a_large_events_budget() {
        let (producers, lane, _rx) = setup(4, 8, 1 << 10);
        let em = Emitter::new(producers.clone(), lane.clone(), "agent", "s");
        lane.ring.close();
        assert_eq!(em.emit(Event::TurnComplete), Emit::Skipped);
        assert_eq!(
            em.emit(Event::Error {
                component: "c",
                message: "large enough"
            }),
            Emit::Skipped
        );
        assert_eq!(producers.budget_in_use.load(Relaxed), 0);
        let mut stats = Stats::default();
        producers.fill_stats(&mut stats, lane.ring.claimed() as u64);
        assert_eq!((stats.emitted, stats.skipped, stats.queued), (2, 2, 0));
    }
}

/// loom: the real emitter's `seq` assignment with two clones racing on one ring, and the
/// consumer numbering at pop time, in every interleaving.
#[cfg(all(test, loom))]
pub(crate) mod loom_tests {
    use super::*;
    use crate::event::EventMask;

    /// The loom models' pipeline: one ring of 4 slots (32 inline bytes each), every event
    /// wanted, and its consumer.
    pub(crate) fn one_ring() -> (Arc<Producers>, Arc<Lane>, crate::ring::Consumer<EventSlot>) {
        let interest = Interest::new(1);
        interest.handle(0).set(EventMask::ALL);
        let producers = Arc::new(Producers::new(interest, 32, 1 << 10, 1 << 10));
        let (ring, rx) = Ring::new(4, || EventSlot::new(32));
        (producers, Arc::new(Lane::new(ring)), rx)
    }

    #[test]
    fn clones_racing_get_seq_in_delivery_order() {
        loom::model(|| {
            let (producers, lane, mut rx) = one_ring();
            let em = Emitter::new(producers, lane.clone(), "a", "s");
            let threads: Vec<_> = ["x", "y"]
                .into_iter()
                .map(|tool| {
                    let em = em.clone();
                    loom::thread::spawn(move || {
                        for _ in 0..2 {
                            assert_eq!(
                                em.emit(Event::ToolCall {
                                    tool,
                                    success: true,
                                    output: ""
                                }),
                                Emit::Queued
                            );
                        }
                    })
                })
                .collect();
            drop(em);
            let mut seqs = Vec::new();
            let read = |rx: &mut crate::ring::Consumer<EventSlot>, seqs: &mut Vec<u64>| {
                while let Some(((), _)) = rx.pop(|slot| slot.read(|r| seqs.push(r.seq))) {}
            };
            read(&mut rx, &mut seqs);
            threads.into_iter().for_each(|t| t.join().unwrap());
            read(&mut rx, &mut seqs);
            lane.collect(rx.head());
            assert_eq!(seqs, [0, 1, 2, 3], "seq must follow delivery order");
        });
    }
}
