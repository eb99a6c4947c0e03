//! A receiver that is down, refuses (503 with Retry-After, 429, 400), resets connections or
//! stalls for 10 s: `emit` is unaffected, spans are retried within the queue's bound, then
//! dropped and counted; shutdown keeps its deadline with a receiver that never answers.

use crate::receiver::{Mode, Receiver};
use crate::*;
use prx_hooks::{Emit, Event, SHUTDOWN_SLACK};
use std::time::{Duration, Instant};

fn tool_pair(em: &prx_hooks::Emitter, tool: &str) {
    assert_eq!(
        em.emit(Event::ToolCallStart {
            tool,
            arguments: "{}"
        }),
        Emit::Queued
    );
    assert_eq!(
        em.emit(Event::ToolCall {
            tool,
            success: true,
            output: ""
        }),
        Emit::Queued
    );
}

fn dead_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    url
}

#[test]
fn a_down_receiver_costs_emit_nothing_drops_are_counted_and_shutdown_keeps_its_deadline() {
    let opts = options(&dead_port_url())
        .queue(256)
        .timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let hooks = hooks_with(opts);
    let em = hooks.emitter("a", "s");
    for _ in 0..10_000 {
        tool_pair(&em, "t");
    }
    wait_for(
        "the builder read everything and the queue overflowed",
        || {
            let s = hooks.stats();
            let o = otel(&s);
            let sink = s.sinks.iter().find(|k| k.name == "otel").unwrap().counts;
            sink.in_flight == 0 && o.dropped_queue_full > 0
        },
    );
    let stats = hooks.stats();
    assert_eq!(
        stats.dropped + stats.dropped_budget,
        0,
        "the ring lost nothing"
    );
    let o = otel(&stats);
    assert!(o.queued <= o.capacity, "{o:?}");
    assert!(balanced(&o), "{o:?}");
    let t0 = Instant::now();
    hooks.shutdown(Duration::from_secs(1));
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(1) + SHUTDOWN_SLACK + Duration::from_secs(2),
        "shutdown took {took:?}"
    );
    let s = hooks.stats();
    let o = otel(&s);
    assert_eq!(o.queued, 0, "{o:?}");
    assert_eq!(o.exported, 0);
    // Every event reached the exporter's sink; what its own queue could not take (the burst
    // outruns the span builder) is dropped there, counted, and nowhere else.
    let sink = s.sinks.iter().find(|k| k.name == "otel").unwrap().counts;
    assert_eq!(sink.sent, 20_000, "{sink:?}");
    assert_eq!(sink.delivered, o.events, "{sink:?} {o:?}");
    assert!(o.spans > 0, "{o:?}");
    assert!(balanced(&o), "{o:?}");
    for sink in &s.sinks {
        assert!(
            sink.counts.balanced() && sink.counts.in_flight == 0,
            "{sink:?}"
        );
    }
}

#[test]
fn refusals_and_resets_are_retried_with_backoff_then_accepted() {
    let rx = Receiver::start();
    rx.script(
        vec![
            Mode::Status(503, Some(1)),
            Mode::Status(429, None),
            Mode::Reset,
        ],
        Mode::Accept,
    );
    // One batch for both spans: the interval is long enough for both to be queued.
    let hooks = hooks_with(options(&rx.url()).batch(64, Duration::from_millis(500)));
    let em = hooks.emitter("a", "s");
    tool_pair(&em, "retried");
    em.emit(Event::TurnComplete);
    let t0 = Instant::now();
    let spans = rx.wait_spans(2, Duration::from_secs(30));
    assert_eq!(spans.len(), 2, "{:?}", names(&spans));
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "Retry-After: 1 was waited"
    );
    assert_eq!(rx.requests(), 4);
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert_eq!((o.exported, o.requests, o.retries), (2, 4, 3), "{o:?}");
    assert!(balanced(&o), "{o:?}");
}

#[test]
fn a_400_is_refused_for_good_and_counted_as_rejected() {
    let rx = Receiver::start();
    rx.set(Mode::Status(400, None));
    let hooks = hooks_with(options(&rx.url()));
    let em = hooks.emitter("a", "s");
    tool_pair(&em, "refused");
    em.emit(Event::TurnComplete);
    wait_for("rejected", || otel(&hooks.stats()).rejected == 2);
    hooks.shutdown(Duration::from_secs(5));
    let o = otel(&hooks.stats());
    assert_eq!((o.requests, o.retries, o.exported), (1, 0, 0), "{o:?}");
    assert!(balanced(&o), "{o:?}");
}

#[test]
fn a_receiver_stalled_for_ten_seconds_costs_emit_nothing_and_its_drops_are_counted() {
    let rx = Receiver::start();
    rx.set(Mode::Stall(Duration::from_secs(10)));
    let opts = options(&rx.url())
        .queue(128)
        .timeouts(Duration::from_secs(2), Duration::from_secs(60));
    let hooks = hooks_with(opts);
    let em = hooks.emitter("a", "s");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        for _ in 0..20 {
            tool_pair(&em, "during-stall");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let during = otel(&hooks.stats());
    assert!(during.dropped_queue_full > 0, "{during:?}");
    assert!(during.queued <= during.capacity, "{during:?}");
    assert!(
        during.retries > 0,
        "stalled requests time out and are retried: {during:?}"
    );
    rx.set(Mode::Accept);
    wait_for("the queue drains once the receiver answers", || {
        otel(&hooks.stats()).queued == 0
    });
    tool_pair(&em, "after-recovery");
    em.emit(Event::TurnComplete);
    wait_for("the span emitted after recovery arrives", || {
        rx.spans()
            .iter()
            .any(|s| s.name == "execute_tool after-recovery")
    });
    hooks.shutdown(Duration::from_secs(5));
    let s = hooks.stats();
    assert_eq!(s.dropped + s.dropped_budget, 0, "the ring lost nothing");
    let o = otel(&s);
    assert!(o.exported > 0 && o.dropped_queue_full > 0, "{o:?}");
    assert_eq!(o.queued, 0);
    assert!(balanced(&o), "{o:?}");
}

#[test]
fn shutdown_with_a_receiver_that_never_answers_keeps_its_deadline() {
    let rx = Receiver::start();
    rx.set(Mode::Stall(Duration::from_secs(120)));
    let hooks = hooks_with(options(&rx.url()));
    let em = hooks.emitter("a", "s");
    for _ in 0..10 {
        tool_pair(&em, "t");
    }
    wait_for("a request is in flight", || rx.requests() >= 1);
    let t0 = Instant::now();
    hooks.shutdown(Duration::from_secs(1));
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(1) + SHUTDOWN_SLACK + Duration::from_secs(2),
        "shutdown took {took:?}"
    );
    let o = otel(&hooks.stats());
    assert!(o.dropped_shutdown >= 10, "{o:?}");
    assert_eq!((o.queued, o.exported), (0, 0), "{o:?}");
    assert!(balanced(&o), "{o:?}");
}
