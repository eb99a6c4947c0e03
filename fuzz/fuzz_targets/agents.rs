//! `agents::translate` on arbitrary bytes, for every agent.
//!
//! * never panics;
//! * `Err`: `LINE:COL: PATH: REASON`, one line, line and column from 1;
//! * `Ok`: one line, and the ingest's own parser reads it (leniently when the translation says
//!   so) as the event or the topic the translation names, with the agent's name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prx_hooks::agents::{Agent, Target, TranslateOptions, translate};
use prx_hooks::ndjson::{Input, ParseOptions, parse_input_with};

fuzz_target!(|data: &[u8]| {
    for agent in Agent::ALL {
        match translate(agent, data, &TranslateOptions::default()) {
            Err(e) => {
                let text = e.to_string();
                assert!(
                    !text.contains('\n') && e.line() >= 1 && e.column() >= 1,
                    "{text:?}"
                );
                assert!(text.starts_with(&format!("{}:{}: {}: ", e.line(), e.column(), e.path())));
            }
            Ok(t) => {
                assert!(!t.line.contains('\n'), "{:?}", t.line);
                let opts = if t.lenient {
                    ParseOptions::lenient()
                } else {
                    ParseOptions::default()
                };
                match (parse_input_with(t.line.as_bytes(), opts), &t.target) {
                    (Ok(Input::Event(rec)), Target::Lifecycle(kind)) => {
                        assert_eq!((rec.kind(), rec.agent.as_str()), (*kind, agent.name()));
                    }
                    (Ok(Input::Topic(topic)), Target::Topic(name)) => {
                        assert_eq!((&topic.topic, topic.agent.as_str()), (name, agent.name()));
                    }
                    (got, want) => panic!("{want:?} read back as {got:?}: {}", t.line),
                }
            }
        }
    }
});
