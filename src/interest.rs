//! [`Interest`]: which events any sink wants, one relaxed load on `emit`'s path, and the
//! [`InterestHandle`] each sink sets its own part through (ARCHITECTURE.md § Data flow).

use crate::event::{EventKind, EventMask};
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// Which events anyone listens to. `emit` reads `combined` (one relaxed load); each sink owns
/// one part and updates it through its [`InterestHandle`] when its configuration changes.
pub(crate) struct Interest {
    combined: CachePadded<AtomicU8>,
    parts: Box<[AtomicU8]>,
    /// Serializes recomputing `combined`; `closed` keeps it at zero after shutdown.
    write: Mutex<bool>,
}

impl Interest {
    pub(crate) fn new(parts: usize) -> Arc<Interest> {
        Arc::new(Interest {
            combined: CachePadded::new(AtomicU8::new(0)),
            parts: (0..parts).map(|_| AtomicU8::new(0)).collect(),
            write: Mutex::new(false),
        })
    }

    pub(crate) fn handle(self: &Arc<Self>, part: usize) -> InterestHandle {
        InterestHandle {
            interest: self.clone(),
            part,
        }
    }

    /// Whether any sink wants `kind` (the `emit` fast path).
    #[inline]
    pub(crate) fn wants(&self, kind: EventKind) -> bool {
        EventMask(self.combined.load(Ordering::Relaxed)).contains(kind)
    }

    pub(crate) fn part(&self, part: usize) -> EventMask {
        EventMask(self.parts[part].load(Ordering::Relaxed))
    }

    /// From now on every event is skipped (after shutdown nobody would deliver it).
    pub(crate) fn close(&self) {
        let mut closed = self.write.lock().unwrap_or_else(|e| e.into_inner());
        *closed = true;
        self.combined.store(0, Ordering::Relaxed);
    }
}

/// A sink's say in the interest mask.
pub struct InterestHandle {
    interest: Arc<Interest>,
    part: usize,
}

impl std::fmt::Debug for InterestHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterestHandle")
            .field("part", &self.part)
            .field("mask", &self.interest.part(self.part))
            .finish()
    }
}

impl InterestHandle {
    /// A handle on an interest mask of its own, for a sink outside any pipeline: one that is
    /// driven through [`Sink::deliver`](crate::Sink::deliver) directly, such as a
    /// [`ShellSink`](crate::shell::ShellSink) made with
    /// [`ShellSink::new`](crate::shell::ShellSink::new). What it declares reaches no emitter.
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{EventMask, InterestHandle};
    /// let interest = InterestHandle::detached();
    /// interest.set(EventMask::ALL);
    /// ```
    pub fn detached() -> InterestHandle {
        Interest::new(1).handle(0)
    }

    /// Declares which events this sink wants from now on.
    pub fn set(&self, mask: EventMask) {
        let i = &*self.interest;
        let closed = i.write.lock().unwrap_or_else(|e| e.into_inner());
        i.parts[self.part].store(mask.0, Ordering::Relaxed);
        if !*closed {
            let all = i.parts.iter().fold(0, |m, p| m | p.load(Ordering::Relaxed));
            i.combined.store(all, Ordering::Relaxed);
        }
    }
}
