//! The ring slot an event is copied into by `emit` and read back from by the worker.

use super::SeqCell;
use crate::event::{Event, EventKind, Parts};
use crossbeam_utils::CachePadded;
use std::ptr::NonNull;

/// One ring slot: an event flattened to scalars plus its strings (agent, session, up to two
/// event fields and the extra fields' JSON text) stored back to back.
pub(crate) struct EventSlot {
    kind: EventKind,
    flag: bool,
    /// Documented fields left out of the payload (`Extras::check`'s bits).
    omitted: u8,
    num: u64,
    /// The emitter's sequence cell; set by every `fill`, dereferenced only by `read`.
    seq: Option<NonNull<CachePadded<SeqCell>>>,
    /// Non-zero: what was attached to this event is in `Producers::attachments` under
    /// `(0, token)` (an ingested event's id and time, `Emitter::emit_attached`).
    token: u64,
    lens: [u32; 5],
    inline: Box<[u8]>,
    heap: Option<Box<[u8]>>,
}

/// An event as the worker reads it back from a slot.
pub(crate) struct SlotEvent<'a> {
    pub(crate) event: Event<'a>,
    pub(crate) agent: &'a str,
    pub(crate) session: &'a str,
    pub(crate) seq: u64,
    /// The emitter's relay id (0: not a relay emitter).
    pub(crate) relay: u64,
    /// The event's attachment token (0: none; see `EventSlot`).
    pub(crate) token: u64,
    /// Extra fields' JSON text (empty for none), already checked.
    pub(crate) extras: &'a str,
    pub(crate) omitted: u8,
}

// SAFETY: the only non-Send field is `seq`, a pointer to a `SeqCell` — an atomic, so `Sync` — that
// the emitter keeps alive until the consumer has read every slot it filled (see `SeqCell`). Slots
// move between the producer that fills them and the consumer that reads them under the ring's
// stamp protocol, which orders the pointer's write before its read.
unsafe impl Send for EventSlot {}

impl EventSlot {
    /// A slot with `inline` bytes of preallocated, touched buffer.
    pub(crate) fn new(inline: usize) -> EventSlot {
        EventSlot {
            kind: EventKind::TurnComplete,
            flag: false,
            omitted: 0,
            num: 0,
            seq: None,
            token: 0,
            lens: [0; 5],
            // Non-zero fill so the pages are really written now, not on the first emit.
            inline: vec![0xA5; inline].into_boxed_slice(),
            heap: None,
        }
    }

    /// Writes an event into the slot. Runs inside the ring's claim, so it must not unwind: it
    /// only copies into buffers already sized for `strs` (`inline` was checked by the caller,
    /// `heap` was allocated for exactly these strings).
    // Inlined into `Emitter::enqueue`'s claim wherever the code generator places this module:
    // `emit`'s cost must not depend on which file the slot lives in.
    #[inline]
    pub(super) fn fill(
        &mut self,
        p: &Parts<'_>,
        strs: [&str; 5],
        omitted: u8,
        seq: NonNull<CachePadded<SeqCell>>,
        token: u64,
        heap: &mut Option<Box<[u8]>>,
    ) {
        self.kind = p.kind;
        self.flag = p.flag;
        self.omitted = omitted;
        self.num = p.num[0];
        self.seq = Some(seq);
        self.token = token;
        self.lens = strs.map(|s| s.len() as u32);
        match heap.take() {
            Some(buf) => self.heap = Some(buf),
            None => copy_into(&mut self.inline, strs),
        }
    }

    /// Frees a large event's buffer without reading the event (shutdown past its deadline);
    /// returns the budget bytes it held.
    pub(crate) fn discard(&mut self) -> usize {
        self.heap.take().map_or(0, |h| h.len())
    }

    /// Numbers the event (its emitter's next sequence number), rebuilds it from the slot and
    /// hands it to `f` with (agent, session, seq). Frees a large event's buffer afterwards and
    /// returns how many budget bytes it held. Only the ring's consumer may call this.
    pub(crate) fn read<R>(&mut self, f: impl FnOnce(SlotEvent<'_>) -> R) -> (R, usize) {
        // SAFETY: `fill` set the pointer from a live emitter's cell, and the cell outlives
        // every slot its emitter filled until the consumer (us) has read them (`Lane::collect`
        // frees it only once `head` is past the emitter's last position, and this slot's
        // position is below that). Reading happens only on the consumer thread.
        let (seq, relay) = match self.seq {
            Some(cell) => {
                let cell = unsafe { cell.as_ref() };
                (cell.take(), cell.relay)
            }
            None => (0, 0),
        };
        let heap = self.heap.take();
        let bytes: &[u8] = heap.as_deref().unwrap_or(&self.inline);
        let mut strs = [""; 5];
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
        let out = f(SlotEvent {
            event: Event::from_parts(parts),
            agent: strs[0],
            session: strs[1],
            seq,
            relay,
            token: self.token,
            extras: strs[4],
            omitted: self.omitted,
        });
        (out, heap.map_or(0, |h| h.len()))
    }
}

/// Copies `strs` back to back into `buf` (sized for them by the caller).
#[inline]
pub(super) fn copy_into(buf: &mut [u8], strs: [&str; 5]) {
    let mut at = 0;
    for s in strs {
        buf[at..at + s.len()].copy_from_slice(s.as_bytes());
        at += s.len();
    }
}
