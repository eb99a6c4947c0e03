//! loom: the hand-over a released key's emitter makes to the next one (ARCHITECTURE.md
//! § Ingest), on the real emitter and ring: the release waits until the ring's consumer has
//! read past the tail noted after the last claim, then reads the next `seq`, and the new
//! emitter goes on from it — in every interleaving with the consumer, the numbers are 0, 1, 2
//! in delivery order (never a repeat: the consumer took each number before moving its head).

use crate::emitter::loom_tests::one_ring;
use crate::emitter::{Emit, Emitter};
use crate::event::Event;

#[test]
fn a_released_keys_next_emitter_continues_its_seq_in_delivery_order() {
    loom::model(|| {
        let (producers, lane, mut rx) = one_ring();
        let consumer = {
            let lane = lane.clone();
            loom::thread::spawn(move || {
                let mut seqs = Vec::new();
                while seqs.len() < 3 {
                    match rx.pop(|slot| slot.read(|r| r.seq)) {
                        Some((seq, _)) => seqs.push(seq),
                        None => loom::thread::yield_now(),
                    }
                    lane.collect(rx.head());
                }
                seqs
            })
        };
        let first = Emitter::new(producers.clone(), lane.clone(), "a", "s");
        assert_eq!(first.emit(Event::TurnComplete), Emit::Queued);
        assert_eq!(first.emit(Event::TurnComplete), Emit::Queued);
        let tail = first.ring_claimed();
        while !first.ring_read_past(tail) {
            loom::thread::yield_now();
        }
        let next = first.next_seq();
        drop(first);
        let second = Emitter::resuming(producers, lane, "a", "s", next);
        assert_eq!(second.emit(Event::TurnComplete), Emit::Queued);
        assert_eq!(consumer.join().unwrap(), [0, 1, 2]);
    });
}
