//! `Bus::subscribe` and `Bus::publish` on arbitrary patterns, topics and payloads.
//!
//! Input: `TOPIC \n PATTERN \n PAYLOAD` (topic and pattern decoded lossily; the payload is the
//! raw rest, newlines and all). With no second newline there is no pattern; with no newline at
//! all the whole input is the topic and the payload is empty.
//!
//! One `Hooks` (default options: 1 MiB payload limit) lives for the whole run, with a
//! subscription on `*` that is drained every iteration.
//!
//! * `subscribe(pattern)` is `Ok` exactly for `*`, a valid topic, or a valid topic + `.*`
//!   (`fuzz/src/lib.rs` has the reference rules), and an error is an `InvalidPattern`;
//! * `publish(topic, payload)` is `Ok` exactly when the topic is valid, does not start with
//!   `prx.lifecycle.`, the payload is at most 1 MiB and serde_json reads it (or refuses it only
//!   for a number out of `f64` range) and it nests at most 126 deep (the `--print` envelope takes the 127th); otherwise the error is one
//!   of the variants that applies;
//! * `Ok(n)`: `n` is 1 (the `*` subscription) plus 1 when the fuzzed pattern matches the topic
//!   (prefix patterns match any depth below the prefix, not the prefix itself); every receiver
//!   gets one message whose topic is the input, whose JSON is the payload minus insignificant
//!   whitespace, byte for byte, that serde_json reads as the same value, with no event, empty
//!   agent and session, and a publication counter that only goes up.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::{BusError, Hooks, Message, Subscription};
use prx_hooks_fuzz::{Pattern, Serde, assert_one_line, depth, parse, strip_ws, valid_topic};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

const MAX_PAYLOAD: usize = 1 << 20;
const RESERVED: &str = "prx.lifecycle.";

struct World {
    hooks: Hooks,
    all: Subscription,
}

fn world() -> &'static Mutex<World> {
    static WORLD: OnceLock<Mutex<World>> = OnceLock::new();
    WORLD.get_or_init(|| {
        let hooks = Hooks::builder().build().expect("default Hooks build");
        let all = hooks.bus().subscribe("*").expect("subscribe to *");
        Mutex::new(World { hooks, all })
    })
}

static LAST_SEQ: AtomicU64 = AtomicU64::new(0);
static PUBLISHED: AtomicU64 = AtomicU64::new(0);

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == b'\n');
    let topic = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let pattern = parts.next().map(String::from_utf8_lossy);
    let payload = parts.next().unwrap_or_default();

    let world = world().lock().unwrap_or_else(|e| e.into_inner());
    let bus = world.hooks.bus();
    // Whatever an earlier (failed) iteration left behind.
    while world.all.try_recv().is_ok() {}

    // subscribe
    let mut sub: Option<(Subscription, Pattern<'_>)> = None;
    if let Some(pattern) = &pattern {
        let want = Pattern::parse(pattern);
        match bus.subscribe(pattern) {
            Ok(s) => {
                let p = want.unwrap_or_else(|| panic!("subscribe accepted {pattern:?}"));
                assert_eq!(s.pattern(), pattern.as_ref());
                assert!(s.is_empty());
                sub = Some((s, p));
            }
            Err(e) => {
                assert!(want.is_none(), "subscribe refused {pattern:?}: {e}");
                assert!(matches!(e, BusError::InvalidPattern { .. }), "{e:?}");
                assert_one_line(&e.to_string(), pattern);
            }
        }
    }

    // publish
    let topic_ok = valid_topic(&topic);
    let reserved = topic.starts_with(RESERVED);
    let too_large = payload.len() > MAX_PAYLOAD;
    let reference = parse(payload);
    let json_ok = !matches!(reference, Serde::Rejected(_)) && depth(payload) <= 126; // the --print envelope takes one level
    match bus.publish(&topic, payload) {
        Err(e) => {
            let applies = match &e {
                BusError::InvalidTopic { topic: t, .. } => !topic_ok && *t == *topic,
                BusError::ReservedTopic { topic: t } => reserved && *t == *topic,
                BusError::PayloadTooLarge { len, max, .. } => {
                    too_large && *len == payload.len() && *max == MAX_PAYLOAD
                }
                BusError::InvalidJson { .. } => !json_ok,
                _ => false,
            };
            assert!(
                applies,
                "publish({topic:?}, {:?}) failed with {e:?}",
                String::from_utf8_lossy(payload)
            );
            assert!(
                !(topic_ok && !reserved && !too_large && json_ok),
                "publish refused a valid publication: {e}"
            );
        }
        Ok(n) => {
            assert!(topic_ok, "published under invalid topic {topic:?}");
            assert!(!reserved, "published under reserved topic {topic:?}");
            assert!(!too_large);
            assert!(
                json_ok,
                "published invalid JSON {payload:?} ({reference:?})"
            );
            let matching = sub.as_ref().is_some_and(|(_, p)| p.matches(&topic));
            assert_eq!(
                n,
                1 + matching as usize,
                "topic {topic:?}, pattern {pattern:?}"
            );
            let msg = world
                .all
                .try_recv()
                .expect("the * subscription got the message");
            check_message(&msg, &topic, payload, &reference);
            let seq = msg.seq();
            if PUBLISHED.fetch_add(1, Ordering::Relaxed) > 0 {
                assert!(
                    seq > LAST_SEQ.load(Ordering::Relaxed),
                    "publication counter went back"
                );
            }
            LAST_SEQ.store(seq, Ordering::Relaxed);
            if let Some((s, _)) = &sub {
                if matching {
                    let m = s
                        .try_recv()
                        .expect("the matching subscription got the message");
                    assert_eq!(m.json(), msg.json());
                    assert_eq!((m.topic(), m.seq()), (msg.topic(), seq));
                }
                assert!(s.try_recv().is_err(), "one publication, one message");
            }
        }
    }
    assert!(
        world.all.try_recv().is_err(),
        "the * subscription got more than one message"
    );
    drop(sub);
});

fn check_message(msg: &Message, topic: &str, payload: &[u8], reference: &Serde) {
    assert_eq!(msg.topic(), topic);
    assert_eq!(msg.event(), None);
    assert_eq!((msg.agent(), msg.session()), ("", ""));
    assert_eq!(msg.json(), msg.json_str().as_bytes());
    assert_eq!(
        msg.json(),
        strip_ws(payload).as_slice(),
        "payload {payload:?}"
    );
    match reference {
        Serde::Ok(v) => assert_eq!(parse(msg.json()).value(), Some(v)),
        Serde::OutOfRange => assert!(matches!(parse(msg.json()), Serde::OutOfRange)),
        Serde::Rejected(e) => unreachable!("{e}"),
    }
}
