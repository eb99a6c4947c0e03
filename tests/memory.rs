//! A burst of large events does not keep its memory once it has passed (issue 10, item 4):
//! workers recycle messages and keep a serialization buffer, and neither may stay at the size
//! of the largest event it ever carried.
//!
//! A global allocator counts the bytes live in the whole process (every thread), so what the
//! workers keep shows up as it is.

use prx_hooks::{Emit, Event, Hooks};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Live;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only keeps a byte count.
unsafe impl GlobalAlloc for Live {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Live = Live;

const MIB: usize = 1 << 20;

/// Emits `n` small events and waits until the subscriber has read them all.
fn small_flow(hooks: &Hooks, sub: &prx_hooks::Subscription, n: usize) {
    let em = hooks.emitter("agent", "small");
    for i in 0..n {
        while hooks.pending() > 1024 {
            std::thread::yield_now();
        }
        assert_eq!(
            em.emit(Event::ToolCall {
                tool: "t",
                success: i % 2 == 0,
                output: "a short output"
            }),
            Emit::Queued
        );
        while sub.try_recv().is_ok() {}
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while hooks.pending() > 0 || !sub.is_empty() {
        while sub.try_recv().is_ok() {}
        assert!(Instant::now() < deadline, "the flow did not drain");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_burst_of_large_events_does_not_keep_its_memory() {
    let hooks = Hooks::builder().ring_capacity(4096).build().unwrap();
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    // Steady state first: the recycle queue and the buffers at their usual sizes.
    small_flow(&hooks, &sub, 100_000);
    let steady = LIVE.load(Ordering::Relaxed);

    // 40 events of 1 MiB of control characters (each ~6 MiB of JSON), held by the
    // subscriber until all have arrived, then let go.
    let big: String = (0..MIB).map(|i| char::from((i % 31 + 1) as u8)).collect();
    let em = hooks.emitter("agent", "big");
    let mut held = Vec::new();
    for _ in 0..40 {
        assert_eq!(
            em.emit(Event::ToolCall {
                tool: "t",
                success: true,
                output: &big
            }),
            Emit::Queued
        );
        held.push(sub.recv_timeout(Duration::from_secs(30)).unwrap());
    }
    let peak = LIVE.load(Ordering::Relaxed);
    assert!(
        peak > steady + 200 * MIB,
        "the burst was not held ({peak} vs {steady})"
    );
    drop(held);
    drop(big);

    // The burst has passed; small events flow again.
    small_flow(&hooks, &sub, 100_000);
    let after = LIVE.load(Ordering::Relaxed);
    assert!(
        after <= steady + 4 * MIB,
        "{:.1} MiB still allocated after the burst (steady state {:.1} MiB, peak {:.1} MiB)",
        after as f64 / MIB as f64,
        steady as f64 / MIB as f64,
        peak as f64 / MIB as f64,
    );
}
