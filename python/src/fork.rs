//! Fork safety: what a child process does with objects made before `fork()`.
//!
//! A forked child has one thread: the pipeline's workers, the hooks runner, the watchers and
//! the server runtimes stayed in the parent, and a lock any of them held at the fork stays
//! locked in the child for good. So nothing made before the fork may be used *or dropped* in
//! the child: using it raises [`ForkError`](crate::errors), dropping it leaks it (the memory
//! is the child's copy of the parent's, nothing is lost that was the child's). A `Hooks`
//! created in the child is a new pipeline and works as usual.
//!
//! The check is one relaxed load: a `pthread_atfork` child handler bumps a generation
//! counter, and every object remembers the generation it was made in. (`getpid()` is a
//! system call on current glibc; the counter costs nothing on the emit path.)

use std::mem::ManuallyDrop;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn after_fork_in_child() {
    // Async-signal-safe: one atomic add. The child has one thread, so Relaxed suffices.
    GENERATION.fetch_add(1, Relaxed);
}

/// Registers the child handler (once per process; inherited by children).
pub(crate) fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a handler with no preconditions; the handler only touches an
        // atomic, which is async-signal-safe as POSIX requires of code run after fork().
        let rc = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        if rc != 0 {
            tracing::warn!(
                "pthread_atfork failed ({rc}): objects used after fork() are not detected"
            );
        }
    });
}

/// How many forks separate this process from the one the generation counter started in.
pub(crate) fn generation() -> u64 {
    GENERATION.load(Relaxed)
}

/// A value usable only in the process that made it (see the module's comment).
pub(crate) struct Owned<T> {
    born: u64,
    /// `None` once taken.
    value: ManuallyDrop<Option<T>>,
}

impl<T> Owned<T> {
    pub(crate) fn new(value: T) -> Owned<T> {
        Owned {
            born: generation(),
            value: ManuallyDrop::new(Some(value)),
        }
    }

    /// The value, unless this is a forked child of the process that made it.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        if generation() == self.born {
            self.value.as_ref()
        } else {
            None
        }
    }

    /// Takes the value out (to drop it elsewhere), unless inherited across a fork.
    pub(crate) fn take(&mut self) -> Option<T> {
        if generation() == self.born {
            self.value.take()
        } else {
            None
        }
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if generation() == self.born {
            // SAFETY: dropped once, here; `value` is never used after `drop`.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
        // Inherited: leaked on purpose. Its destructor would join threads that do not exist
        // here or take locks held forever by threads of the parent.
    }
}
