//! The session map's rules on a real pipeline, one at a time.

use super::*;
use crate::Hooks;

fn hooks(opts: SessionOptions) -> Hooks {
    Hooks::builder().sessions(opts).build().unwrap()
}

fn seqs(sub: &crate::Subscription, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            sub.recv_timeout(Duration::from_secs(10))
                .expect("a message")
                .seq()
        })
        .collect()
}

#[test]
fn one_key_gets_one_emitter_and_its_seq_goes_on_across_handles() {
    let h = hooks(SessionOptions::default());
    let sub = h.bus().subscribe("*").unwrap();
    for _ in 0..3 {
        let em = h.sessions().get("a", "s").unwrap();
        assert_eq!(em.emit(Event::TurnComplete), Emit::Queued);
    }
    assert_eq!(seqs(&sub, 3), [0, 1, 2]);
    let s = h.stats();
    let s = s.sessions().unwrap();
    assert_eq!((s.opened, s.live, s.released), (1, 1, 0));
}

#[test]
fn an_idle_key_is_released_and_comes_back_with_its_seq() {
    let h = hooks(SessionOptions::default().idle(Duration::ZERO));
    let sub = h.bus().subscribe("*").unwrap();
    h.sessions()
        .get("a", "s")
        .unwrap()
        .emit(Event::TurnComplete);
    assert_eq!(seqs(&sub, 1), [0]);
    // Read by the worker, unused for `idle` (0): the next look releases it.
    while h.sessions().sweep() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = h.stats().sessions().cloned().unwrap();
    assert_eq!((s.live, s.released, s.remembered), (0, 1, 1));
    h.sessions()
        .get("a", "s")
        .unwrap()
        .emit(Event::TurnComplete);
    assert_eq!(seqs(&sub, 1), [1], "seq goes on from the remembered number");
    let s = h.stats().sessions().cloned().unwrap();
    assert_eq!((s.opened, s.resumed, s.remembered), (2, 1, 0));
}

#[test]
fn a_forgotten_key_starts_again_at_zero() {
    let h = hooks(SessionOptions::default().idle(Duration::ZERO).remember(0));
    let sub = h.bus().subscribe("*").unwrap();
    h.sessions()
        .get("a", "s")
        .unwrap()
        .emit(Event::TurnComplete);
    assert_eq!(seqs(&sub, 1), [0]);
    while h.sessions().sweep() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    h.sessions()
        .get("a", "s")
        .unwrap()
        .emit(Event::TurnComplete);
    assert_eq!(seqs(&sub, 1), [0]);
    let s = h.stats().sessions().cloned().unwrap();
    assert_eq!((s.forgotten, s.resumed), (1, 0));
}

#[test]
fn a_full_map_evicts_what_has_nothing_in_flight_and_refuses_when_all_is_pinned() {
    let h = hooks(SessionOptions::default().max(1));
    let _sub = h.bus().subscribe("*").unwrap();
    let a = h.sessions().get("a", "s").unwrap();
    let err = h.sessions().get("b", "s").unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(h.stats().sessions().unwrap().refused, 1);
    drop(a);
    // `a` emitted nothing: nothing in flight, so `b` takes its place (idle or not).
    let b = h.sessions().get("b", "s").unwrap();
    b.emit(Event::TurnComplete);
    drop(b);
    let s = h.stats().sessions().cloned().unwrap();
    assert_eq!((s.opened, s.live, s.evicted, s.refused), (2, 1, 1, 1));
}

#[test]
fn an_entry_with_events_in_the_ring_is_never_released() {
    // A worker idle for a while parks for its tick (here 1 s): events wait in the ring.
    let h = Hooks::builder()
        .idle_tick(Duration::from_secs(1))
        .sessions(SessionOptions::default().max(1).idle(Duration::ZERO))
        .build()
        .unwrap();
    let sub = h.bus().subscribe("*").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut refused = false;
    for _ in 0..5 {
        h.sessions()
            .get("a", "s")
            .unwrap()
            .emit(Event::TurnComplete);
        // Just queued: if the worker has not read it yet, `b` must not take `a`'s place.
        let before = h.pending();
        match h.sessions().get("b", "s") {
            Err(_) => {
                assert!(before > 0, "refused although nothing was in flight");
                refused = true;
                break;
            }
            Ok(b) => {
                drop(b);
                // Taken only after the worker read `a`'s event: `a` must have been read.
                assert!(sub.recv_timeout(Duration::from_secs(5)).is_ok());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    assert!(
        refused,
        "the worker never left an event in the ring long enough"
    );
    // Once it is read, the place is free.
    assert!(sub.recv_timeout(Duration::from_secs(5)).is_ok());
    let deadline = Instant::now() + Duration::from_secs(5);
    let b = loop {
        if let Ok(b) = h.sessions().get("b", "s") {
            break b;
        }
        assert!(Instant::now() < deadline, "a's place never freed");
        std::thread::sleep(Duration::from_millis(5));
    };
    drop(b);
}

#[test]
fn small_bounds_use_one_shard_and_large_ones_sixteen_that_add_up() {
    let h = hooks(SessionOptions::default().max(100));
    assert_eq!(h.sessions().shards.len(), 1);
    let h = hooks(SessionOptions::default().max(1000).remember(33));
    let s = h.sessions();
    assert_eq!(s.shards.len(), 16);
    let caps: usize = (0..16).map(|i| s.lock(i).cap).sum();
    assert_eq!(caps, 1000);
}
