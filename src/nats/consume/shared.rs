//! The shared de-dup bucket: claims, start records and done records of message ids
//! (ARCHITECTURE.md § NATS bridge, "Shared de-dup").

use super::*;

/// The shared de-dup bucket: a stream `KV_<bucket>` of subjects `$KV.<bucket>.<key>`, one
/// message per key (the key-value layout), the value the digest the event ran with.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) js: jetstream::Context,
    pub(super) stream: jetstream::stream::Stream,
    pub(super) bucket: String,
}

impl Shared {
    /// `$KV.<bucket>.<FNV-1a of the id, hex>`: any id, one subject token.
    pub(super) fn subject(&self, id: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in id.as_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("$KV.{}.{h:016x}{:04x}", self.bucket, id.len() & 0xffff)
    }

    pub(super) async fn open(
        js: &jetstream::Context,
        bucket: &str,
        age: Duration,
    ) -> Result<Shared, String> {
        let config = jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age: age,
            allow_direct: true,
            ..Default::default()
        };
        let stream = js
            .get_or_create_stream(config)
            .await
            .map_err(|e| format!("the de-dup bucket {bucket:?}: {e}"))?;
        Ok(Shared {
            js: js.clone(),
            stream,
            bucket: bucket.to_string(),
        })
    }

    /// Writes `value` under `id`'s key if the key's last write is `expect` (0: the key holds
    /// nothing): the write's sequence; `Err(true)` when the key held something else (another
    /// write won), `Err(false)` when the server did not answer in time.
    pub(super) async fn write(&self, id: &str, value: String, expect: u64) -> Result<u64, bool> {
        super::super::lease::write_if(&self.js, self.subject(id), value, Some(expect)).await
    }

    /// What the key of `id` holds now.
    pub(super) async fn read(&self, id: &str) -> Record {
        let got = tokio::time::timeout(
            ACKS_WAIT,
            self.stream
                .get_last_raw_message_by_subject(&self.subject(id)),
        )
        .await;
        let Ok(Ok(m)) = got else {
            return Record::Absent;
        };
        let text = std::str::from_utf8(&m.payload).unwrap_or("").trim();
        let claimed = |host: &str, started| Record::Claimed {
            host: host.to_string(),
            seq: m.sequence,
            started,
        };
        if let Some(host) = text.strip_prefix("c ") {
            return claimed(host, true);
        }
        match text.strip_prefix("q ") {
            Some(host) => claimed(host, false),
            None if text.is_empty() => Record::Free { seq: m.sequence },
            None => u64::from_str_radix(text, 16).map_or(Record::Absent, Record::Done),
        }
    }

    /// Withdraws this host's claim on `id` (the claim's sequence `seq`) for a message that
    /// was not handed over after all: its key then holds an empty value, which the next
    /// claim replaces without counting it as reclaimed.
    pub(super) async fn unclaim(&self, id: &str, seq: u64) {
        let _ = self.write(id, String::new(), seq).await;
    }

    /// The start record of `id`, which this host claimed (its claim's sequence in `seq`): the
    /// first of its runs about to start asks for it, and the runs start once the bucket holds
    /// `c <host>` in place of exactly that claim (the sequence moves to the record's). Written
    /// on the consumer's runtime, never on the thread that asks. Unanswered, it is tried again
    /// (after a second, when the bucket left any write unanswered: `down`) until it is
    /// answered, the event's message is gone, or the consumer's runtime ends (after a stopping
    /// consumer's drain: runs still start while it drains): the run waits, its message
    /// stays in flight (in progress, not redelivered), and a bucket that does not answer for a
    /// while spends none of the message's deliveries. The claim taken over by another host:
    /// refused (the event is nak'ed).
    pub(super) fn start_record(
        &self,
        id: &str,
        seq: Arc<AtomicU64>,
        down: Arc<AtomicU64>,
    ) -> crate::settle::Start {
        let (shared, id) = (self.clone(), id.to_string());
        let handle = tokio::runtime::Handle::current();
        crate::settle::Start::new(Box::new(move |answer| {
            let (shared, id) = (shared.clone(), id.clone());
            let (seq, down) = (seq.clone(), down.clone());
            // On the consumer's runtime (a runtime shut down drops the task and its answer:
            // refused).
            handle.spawn(async move {
                let mine = format!("c {}", wire::instance_id());
                let mut unanswered = false;
                while answer.wanted() {
                    let wait = down
                        .load(Ordering::Acquire)
                        .saturating_sub(crate::settle::lease_clock());
                    if wait > 0 {
                        tokio::time::sleep(Duration::from_millis(wait.min(100))).await;
                        continue;
                    }
                    match shared
                        .write(&id, mine.clone(), seq.load(Ordering::Acquire))
                        .await
                    {
                        Ok(s) => {
                            seq.store(s, Ordering::Release);
                            return answer.give(true);
                        }
                        Err(true) => {
                            // An earlier write left unanswered may have been made after all.
                            if unanswered
                                && let Record::Claimed {
                                    host,
                                    seq: s,
                                    started: true,
                                } = shared.read(&id).await
                                && host == wire::instance_id()
                            {
                                seq.store(s, Ordering::Release);
                                return answer.give(true);
                            }
                            return answer.give(false);
                        }
                        Err(false) => {
                            unanswered = true;
                            down.store(crate::settle::lease_clock() + 1000, Ordering::Release);
                        }
                    }
                }
                answer.give(false);
            });
        }))
    }

    /// Claims `id` for this host before its hand-over: the claim's sequence (the done record
    /// replaces exactly it), and what the key held before.
    pub(super) async fn claim(&self, id: &str) -> (Option<u64>, Record) {
        let mine = || format!("q {}", wire::instance_id());
        match self.write(id, mine(), 0).await {
            Ok(seq) => (Some(seq), Record::Absent),
            Err(true) => {
                let before = self.read(id).await;
                match &before {
                    // This host's own (a redelivery of a message it holds or naked): kept as
                    // it is, so the done record still replaces exactly it.
                    Record::Claimed { host, seq, .. } if host == wire::instance_id() => {
                        (Some(*seq), before)
                    }
                    // Taken over: the dead (or stalled) host's claim becomes ours.
                    Record::Claimed { seq, .. } => {
                        (self.write(id, mine(), *seq).await.ok(), before)
                    }
                    // Withdrawn by a host that did not hand it over.
                    Record::Free { seq } => {
                        (self.write(id, mine(), *seq).await.ok(), Record::Absent)
                    }
                    _ => (None, before),
                }
            }
            Err(false) => {
                tracing::warn!(
                    "NATS consumer: {}: the de-dup bucket did not confirm a claim in time: handed over unclaimed (if this host dies before recording it done, a second run elsewhere is not recognized)",
                    wire::encode_value(id)
                );
                (None, Record::Absent)
            }
        }
    }
}

/// What the shared de-dup bucket holds for a message id.
pub(super) enum Record {
    Absent,
    /// A claim withdrawn (the message was not handed over): an empty value.
    Free {
        seq: u64,
    },
    /// It ran (its hooks settled it) with this digest: `<digest hex>`.
    Done(u64),
    /// A host took it and has not recorded it done: `q <host's instance id>` while no hook of
    /// it started there, `c <host's instance id>` once one may have (`started`).
    Claimed {
        host: String,
        seq: u64,
        started: bool,
    },
}
