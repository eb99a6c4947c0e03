//! A burst of large events does not keep its memory once it has passed:
//! workers recycle messages and keep a serialization buffer, and neither may stay at the size
//! of the largest event it ever carried.
//!
//! A global allocator counts the bytes live in the whole process (every thread), so what the
//! workers keep shows up as it is.

use prx_hooks::{Emit, Event, Hooks};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[path = "support/live_alloc.rs"]
mod live_alloc;
use live_alloc::LIVE;

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
