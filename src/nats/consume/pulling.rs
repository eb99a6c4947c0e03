//! Standing pulls of a durable consumer: one per source (the consumer, or each partition
//! held), renewed as soon as it ends, all together bounded in messages and bytes.
//!
//! Each source is pulled on its own: an empty partition's pull stands until its expiry while
//! a busy one's is renewed the moment it ends, so an idle partition never holds a busy one
//! back. What the standing pulls may still bring counts toward the in-flight limits with what
//! is in flight already: messages (`Worker::in_flight_limit`) and bytes (each pull's
//! `max_bytes`: 64 KiB for a source whose messages were all smaller, else at least one message
//! of the server's largest size), so a pull never brings more than the host allowed for,
//! whatever the bodies' size.

use super::*;
use futures_util::StreamExt;
use futures_util::stream::{BoxStream, SelectAll};

/// The bytes pulled and not yet settled, at least (standing pulls' `max_bytes` and the bodies
/// in flight together); raised to four of the server's largest messages when that is more.
pub(super) const IN_FLIGHT_BYTES: usize = 32 << 20;
/// What a message may carry beyond the server's `max_payload` (its subject, reply subject and
/// the protocol line), for a pull's `max_bytes`.
const MESSAGE_OVERHEAD: usize = 4096;
/// A pull's `max_bytes` at least, until its source had a message larger (the server refuses a
/// pull a message above its `max_bytes`: the source's next pulls then make room for the
/// largest, `max_payload` and overhead).
const SMALL_PULL_BYTES: usize = 64 << 10;

/// What the standing pulls yield: a message of a source, or the end of its pull.
// Yielded one at a time and moved at once: a box per message would cost more than the size.
#[allow(clippy::large_enum_variant)]
pub(super) enum Pulled {
    Msg(Option<u32>, Result<jetstream::Message, async_nats::Error>),
    End(Option<u32>),
}

/// The pull of one source.
#[derive(Default)]
pub(super) struct Pull {
    /// A pull of it stands.
    standing: bool,
    /// Messages and bytes it asked for, and what came of them so far.
    asked: usize,
    asked_bytes: usize,
    got: usize,
    got_bytes: usize,
    /// Messages its last finished pull brought (the next asks for up to twice as many).
    last_got: usize,
    /// When its last pull ended: the source that waited longest is pulled first.
    ended: Option<Instant>,
    /// Its pulls ask for room for the largest message: one of its pulls was refused a
    /// message larger than its `max_bytes`.
    big: bool,
    /// The standing pull was refused a message larger than its `max_bytes`.
    refused_size: bool,
}

impl Pull {
    /// Messages and bytes it may still bring.
    fn reserved(&self) -> (usize, usize) {
        if !self.standing {
            return (0, 0);
        }
        (
            self.asked.saturating_sub(self.got),
            self.asked_bytes.saturating_sub(self.got_bytes),
        )
    }
}

/// Every source's standing pull, merged.
pub(super) struct Pulls {
    streams: SelectAll<BoxStream<'static, Pulled>>,
    by_source: HashMap<Option<u32>, Pull>,
    /// How many pulls stand, and how many sources the last round had.
    standing: usize,
    sources: usize,
}

impl Pulls {
    pub(super) fn new() -> Pulls {
        Pulls {
            streams: SelectAll::new(),
            by_source: HashMap::new(),
            standing: 0,
            sources: 0,
        }
    }

    /// The partitions with a pull standing (not to be freed meanwhile).
    pub(super) fn standing_parts(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_source
            .iter()
            .filter(|(_, p)| p.standing)
            .filter_map(|(k, _)| *k)
    }

    fn any_standing(&self) -> bool {
        self.standing > 0
    }

    /// A source of the last round has no pull standing (room that comes may go to it).
    fn waiting(&self) -> bool {
        self.standing < self.sources
    }

    fn reserved(&self) -> (usize, usize) {
        self.by_source
            .values()
            .map(Pull::reserved)
            .fold((0, 0), |(m, b), (m2, b2)| (m + m2, b + b2))
    }
}

/// What came of reading the standing pulls for a while.
pub(super) struct Read {
    /// A message came.
    pub(super) got: bool,
}

impl Worker {
    /// The bytes of the largest message the server takes, with its overhead: a pull's
    /// `max_bytes` is never below it, or such a message could never be pulled.
    fn one_message_bytes(client: &async_nats::Client) -> usize {
        client.server_info().max_payload.max(1 << 20) + MESSAGE_OVERHEAD
    }

    /// The byte budget of what is pulled and not settled.
    pub(super) fn byte_budget(client: &async_nats::Client) -> usize {
        IN_FLIGHT_BYTES.max(4 * Self::one_message_bytes(client))
    }

    fn flight_bytes(&self) -> usize {
        self.flights.values().map(|f| f.bytes).sum()
    }

    /// Starts a pull for each source without one, as the room left allows: sources whose last
    /// pull ended longest ago first. A source whose last pull brought messages asks for up to
    /// twice as many (at most [`BATCH`]), one that brought none for one; `careful` (after a
    /// lost connection) asks each for one. Whether room or the pipeline held a source back.
    pub(super) async fn start_pulls(
        &mut self,
        client: &async_nats::Client,
        sources: &[(Option<u32>, &PullConsumer)],
        pulls: &mut Pulls,
        careful: bool,
    ) -> bool {
        pulls.sources = sources.len();
        let one = Self::one_message_bytes(client);
        let budget = Self::byte_budget(client);
        // One lookup per source, then the order: sources that brought messages first (an idle
        // partition's probe must not take the room a busy one needs), then the one whose pull
        // ended longest ago. This runs once per pull that ends and per settled message while a
        // source waits, over up to every partition: no lookup inside the sort, no sum over
        // every source or flight per source.
        let mut waiting: Vec<(bool, Option<Instant>, usize)> = sources
            .iter()
            .enumerate()
            .filter_map(|(i, (k, _))| match pulls.by_source.get(k) {
                Some(p) if p.standing => None,
                p => Some((
                    p.is_none_or(|p| p.last_got == 0),
                    p.and_then(|p| p.ended),
                    i,
                )),
            })
            .collect();
        waiting.sort_unstable();
        let mut busy_left = waiting.iter().filter(|w| !w.0).count();
        let (mut msgs, mut bytes) = pulls.reserved();
        let flying = (self.flights.len(), self.flight_bytes());
        let mut held = false;
        for (_, _, i) in waiting {
            let (k, c) = &sources[i];
            let room = self.in_flight_limit.saturating_sub(flying.0 + msgs);
            let byte_room = budget.saturating_sub(flying.1 + bytes);
            let p = pulls.by_source.get(k);
            let last = p.map_or(0, |p| p.last_got);
            // A pull's bytes cover at least one message: a small one, until the source had
            // one larger (its pull refused as exceeding max_bytes), then the largest.
            let floor = if p.is_some_and(|p| p.big) {
                one
            } else {
                SMALL_PULL_BYTES
            };
            if room == 0 || byte_room < floor || self.feed.busy() {
                held = true;
                break;
            }
            let size = if careful || last == 0 {
                1
            } else {
                (2 * last).clamp(1, BATCH).min(room)
            };
            // A source that brings shares the byte room with the others that do.
            let max_bytes = if last == 0 {
                floor
            } else {
                let share = byte_room / busy_left.max(1);
                busy_left = busy_left.saturating_sub(1);
                share.min(size.saturating_mul(one)).max(floor)
            };
            match c
                .batch()
                .max_messages(size)
                .max_bytes(max_bytes)
                .expires(PULL_EXPIRES)
                .messages()
                .await
            {
                Ok(b) => {
                    let k = *k;
                    pulls.streams.push(
                        b.map(move |m| Pulled::Msg(k, m))
                            .chain(futures_util::stream::once(async move { Pulled::End(k) }))
                            .boxed(),
                    );
                    let p = pulls.by_source.entry(k).or_default();
                    if !std::mem::replace(&mut p.standing, true) {
                        pulls.standing += 1;
                    }
                    p.refused_size = false;
                    (p.asked, p.asked_bytes, p.got, p.got_bytes) = (size, max_bytes, 0, 0);
                    (msgs, bytes) = (msgs + size, bytes + max_bytes);
                }
                Err(e) => tracing::debug!("NATS consumer: pull: {e}"),
            }
        }
        held
    }

    /// Reads the standing pulls, handling each message as it comes, until one ends (its
    /// source can be pulled again), a ticket reports while a source waits for a pull (room
    /// may have come for it: settled first; with every source's pull standing, what settles is
    /// settled and the reading goes on), or `tick` passes; with none standing, waits for a
    /// report, a stop or `tick`.
    pub(super) async fn read_pulls(&mut self, pulls: &mut Pulls, tick: Duration) -> Read {
        let (notify, wake) = (self.notify.clone(), self.wake.clone());
        let mut read = Read { got: false };
        let until = tokio::time::Instant::now() + tick;
        loop {
            if !pulls.any_standing() {
                tokio::select! {
                    _ = notify.notified() => self.settle().await,
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(until) => {}
                }
                return read;
            }
            tokio::select! {
                m = pulls.streams.next() => match m {
                    Some(Pulled::Msg(k, Ok(m))) => {
                        read.got = true;
                        if let Some(p) = pulls.by_source.get_mut(&k) {
                            p.got += 1;
                            p.got_bytes += m.length;
                        }
                        self.take(m, k).await;
                    }
                    Some(Pulled::Msg(k, Err(e))) => {
                        // "409 Message Size Exceeds MaxBytes": the next message is larger
                        // than what this pull had room for.
                        if e.to_string().contains("Exceeds MaxBytes")
                            && let Some(p) = pulls.by_source.get_mut(&k)
                        {
                            p.refused_size = true;
                        }
                        tracing::debug!("NATS consumer: pull: {e}");
                    }
                    Some(Pulled::End(k)) => {
                        if let Some(p) = pulls.by_source.get_mut(&k) {
                            if std::mem::replace(&mut p.standing, false) {
                                pulls.standing -= 1;
                            }
                            p.last_got = p.got;
                            p.ended = Some(Instant::now());
                            if p.refused_size {
                                p.big = true;
                                // Pulled again at once, with room for it.
                                p.last_got = p.last_got.max(1);
                            }
                        }
                        return read;
                    }
                    None => return read,
                },
                _ = notify.notified() => {
                    self.settle().await;
                    if pulls.waiting() {
                        return read;
                    }
                }
                _ = wake.notified() => return read,
                _ = tokio::time::sleep_until(until) => return read,
            }
        }
    }

    /// Stopping: the standing pulls are read to their end (their expiry, or a little more),
    /// and what they still bring is nak'ed by `take`. Left unread, the server would count it
    /// delivered and redeliver it only after the ack wait, behind newer messages of its
    /// partition pulled by the next holder.
    pub(super) async fn read_pulls_to_end(&mut self, pulls: &mut Pulls) {
        let until = tokio::time::Instant::now() + STOP_READ;
        while pulls.any_standing() && tokio::time::Instant::now() < until {
            let left = until - tokio::time::Instant::now();
            self.read_pulls(pulls, left).await;
        }
    }
}
