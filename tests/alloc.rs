//! `emit` allocates nothing for events that fit a slot's inline buffer.
//!
//! A counting global allocator counts allocations made by the thread that has switched
//! counting on (the pipeline's own threads allocate as they please; this is about the
//! agent's thread).

use prx_hooks::{Emit, Event, Hooks};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count<R>(f: impl FnOnce() -> R) -> (R, u64) {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let r = f();
    COUNTING.with(|c| c.set(false));
    (r, ALLOCATIONS.load(Ordering::Relaxed) - before)
}

#[test]
fn steady_state_emit_does_not_allocate() {
    let hooks = Hooks::builder().ring_capacity(1 << 16).build().unwrap();
    let sub = hooks.bus().subscribe("prx.lifecycle.*").unwrap();
    let em = hooks.emitter("agent-1", "session-1");
    let other = hooks.emitter("agent-2", "session-2");
    let output = "o".repeat(150);
    // Warm-up: first use of every path.
    em.emit(Event::ToolCall {
        tool: "shell",
        success: true,
        output: &output,
    });
    let (outcomes, allocations) = count(|| {
        let mut queued = 0;
        for i in 0..20_000u64 {
            let r = match i % 4 {
                0 => em.emit(Event::ToolCall {
                    tool: "shell",
                    success: true,
                    output: &output,
                }),
                1 => em.emit(Event::ToolCallStart {
                    tool: "shell",
                    arguments: r#"{"cmd":"ls -la"}"#,
                }),
                2 => em.emit(Event::LlmResponse {
                    provider: "p",
                    model: "m",
                    duration_ms: i,
                    success: true,
                }),
                _ => other.emit(Event::AgentEnd {
                    success: true,
                    messages_count: i,
                }),
            };
            queued += (r == Emit::Queued) as u32;
        }
        queued
    });
    assert_eq!(allocations, 0, "emit allocated {allocations} times");
    assert!(
        outcomes > 10_000,
        "the events must really have been queued, got {outcomes}"
    );

    // The counter itself works: an event above the inline size does allocate.
    let big = "b".repeat(10_000);
    let (r, allocations) = count(|| {
        em.emit(Event::ToolCall {
            tool: "t",
            success: true,
            output: &big,
        })
    });
    assert_eq!(r, Emit::Queued);
    assert!(allocations >= 1);

    // And nothing was lost on the way.
    hooks.shutdown(Duration::from_secs(10));
    assert_eq!(sub.try_iter().count() as u64, hooks.stats().queued);
}
