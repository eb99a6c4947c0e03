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
    // Its bytes and its emitter (names included) are given back.
    assert_eq!(s.bytes, 0);
    assert_eq!(h.sessions().producers.live_emitters(), 0);
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

#[test]
fn entries_are_counted_in_bytes_bounded_by_them_and_give_them_back_when_they_go() {
    // Names of 200 and 100 bytes; one shard (`max` below 256) with room for three entries.
    let entry = ENTRY_BYTES + 300;
    let h = hooks(SessionOptions::default().max(100).max_bytes(3 * entry));
    let _sub = h.bus().subscribe("*").unwrap();
    let agent = |i: usize| format!("{i:0200}");
    let session = "s".repeat(100);
    let held: Vec<_> = (0..3)
        .map(|i| h.sessions().get(&agent(i), &session).unwrap())
        .collect();
    let s = h.stats().sessions().cloned().unwrap();
    let e = entry as u64;
    assert_eq!((s.live, s.bytes, s.max_bytes), (3, 3 * e, 3 * e));
    // A fourth key fits the count (100) but not the bytes, and every entry is pinned.
    let err = h.sessions().get(&agent(3), &session).unwrap_err();
    assert!(!err.is_permanent(), "{err}");
    assert!(
        err.to_string().contains(&format!("{} bytes", 3 * entry)),
        "{err}"
    );
    drop(held);
    // Nothing in flight: it takes the place of one of them.
    h.sessions().get(&agent(3), &session).unwrap();
    let s = h.stats().sessions().cloned().unwrap();
    assert_eq!((s.live, s.bytes, s.evicted, s.refused), (3, 3 * e, 1, 1));
    // The bound is in bytes, not keys: even a small key makes room by evicting one more.
    h.sessions().get("a", "s").unwrap();
    let s = h.stats().sessions().cloned().unwrap();
    let small = (ENTRY_BYTES + 2) as u64;
    assert_eq!((s.live, s.bytes, s.evicted), (3, 2 * e + small, 2), "{s:?}");
    // The evicted entries' emitters (and their names) are gone: only the three held are alive.
    assert_eq!(h.sessions().producers.live_emitters(), 3);
}

#[test]
fn a_name_past_the_limit_is_refused_for_good_and_a_shard_holds_one_of_the_longest_at_least() {
    let h = hooks(SessionOptions::default().max_bytes(0));
    let long = "x".repeat(MAX_NAME_BYTES);
    let em = h.sessions().get(&long, &long).unwrap();
    assert_eq!(
        h.stats().sessions().unwrap().bytes,
        (ENTRY_BYTES + 2 * MAX_NAME_BYTES) as u64
    );
    drop(em);
    let err = h.sessions().get("a", &format!("{long}y")).unwrap_err();
    assert!(err.is_permanent());
    assert_eq!(
        err.to_string(),
        "refused: session: 257 bytes; agent and session names are at most 256 bytes"
    );
    assert_eq!(h.stats().sessions().unwrap().refused, 1);
    assert!(!h.sessions().holds("a", &format!("{long}y")));
}
