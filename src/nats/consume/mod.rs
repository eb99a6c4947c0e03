//! The consumer: NATS messages → the local pipeline (ARCHITECTURE.md § NATS bridge).
//!
//! ```text
//! NATS ─► core subscription (or a queue group)
//!      │     └► our buffer, bounded in messages and bytes (drops counted: dropped_full)
//!      └► JetStream durable pull consumer (at most 128 in flight; a pull for the room left)
//!            └─► per message: subject → event · Prx-Origin our own? skip · headers checked ·
//!                Nats-Msg-Id seen (window, shared bucket, in flight)? skip · body parsed ·
//!                wait until its hooks' queues have room · emit with a ticket (`settle`) ·
//!                … its hooks ran or skipped it: id into the window (its file, the bucket) ·
//!                then ack; a hook's queue dropped it: nak with a delay
//! ```
//!
//! Delivery is at-least-once: an ack lost on the way, or a process stopped before its hooks
//! settled a message, makes JetStream deliver it again, and the de-dup window (bounded in
//! size and age, persisted when given a file; shared between hosts through a key-value bucket
//! when given one) is what recognizes it. A refused message is terminated (JetStream never
//! redelivers it); one taken but not handed over when the consumer stops is nak'ed, so the
//! next consumer gets it at once.

use super::connect::{ConnState, ConnectError, NatsOptions, runtime};
use super::publish::check_name;
use super::{ConsumeStats, wire};
use crate::Feed;
use crate::emitter::Emit;
use crate::ndjson::{self, ParseOptions};
use async_nats::jetstream;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod consumer;
mod handle;
mod options;
mod pull;
mod pulling;
mod shared;
mod subscribe;
mod window;
mod worker;

pub use consumer::Consumer;
use consumer::*;
pub use options::{
    ConsumeOptions, DEFAULT_BUFFER_BYTES, DEFAULT_BUFFER_MESSAGES, DEFAULT_DEDUP_AGE,
    DEFAULT_DEDUP_IDS, DEFAULT_MAX_DELIVER,
};
use shared::*;
use window::*;
use worker::*;
