//! The worker's state and what every way of consuming shares: a message's fate, its
//! in-flight record, the give-ups counted once.

use super::*;

/// How long a batch's acks and their flush may take before the consumer goes on without them.
pub(super) const ACKS_WAIT: Duration = Duration::from_secs(2);
/// Messages pulled at once, at most.
pub(super) const BATCH: usize = 256;
/// Core NATS: messages handed over per look at `Feed::busy` (what intake can overshoot by).
pub(super) const CORE_BATCH: usize = 32;
/// The client's channel per subscription, in messages (see `Consumer::start`).
pub(super) const CLIENT_CHANNEL: usize = 1 << 20;
/// JetStream: messages handed over and not yet settled by their hooks, at most. With the
/// default queue of 256 per hook, the consumer alone never fills a hook's queue; a pull asks
/// for no more than the room left.
pub(super) const MAX_IN_FLIGHT: usize = 128;
/// A pull's expiry. Messages are handled as they arrive, so this bounds only how long an idle
/// pull stands.
pub(super) const PULL_EXPIRES: Duration = Duration::from_millis(500);
/// Stopping: how long a standing pull is still read, so that what it brings is nak'ed (at
/// once delivered again) rather than left to the ack wait.
pub(super) const STOP_READ: Duration =
    Duration::from_millis(PULL_EXPIRES.as_millis() as u64 + 1000);
/// How long a message a sink dropped waits before JetStream delivers it again.
pub(super) const RETRY_DELAY: Duration = Duration::from_millis(500);
/// An in-flight message gets an in-progress ack this often, so that the 10 s ack wait does not
/// redeliver it while its hooks still run.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// Emitters kept (one per agent and session seen; the oldest goes first).
pub(super) const MAX_EMITTERS: usize = 4096;

/// What became of one message.
pub(super) enum Fate {
    /// Handed to the pipeline: ack.
    Handed,
    /// Already handed (duplicate) or our own: ack, nothing to do.
    Skip,
    /// Refused for good: terminate.
    Refused,
    /// Not handed (stopping): nak, so it is delivered again at once.
    Later,
    /// JetStream: a redelivery of the message in flight under this key (its hooks still
    /// run); acked with it.
    InFlight(u64),
}

/// One message, whichever way it came.
pub(super) struct Incoming<'a> {
    pub(super) subject: &'a str,
    pub(super) headers: Option<&'a async_nats::HeaderMap>,
    pub(super) payload: &'a [u8],
    /// JetStream: its delivery count (1 on the first delivery); `None` over core NATS.
    pub(super) delivery: Option<u64>,
    /// JetStream with a shared de-dup bucket: another host's claim on it was taken over.
    pub(super) reclaimed: bool,
    /// With partitions: the lease of its partition, which each run checks before it starts.
    pub(super) fence: Option<crate::settle::Fence>,
    /// With a shared de-dup bucket: its start record, written before its first run starts.
    pub(super) start: Option<crate::settle::Start>,
}

impl Incoming<'_> {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers?.get(name).map(|v| v.as_str())
    }
}

pub(super) struct Worker {
    pub(super) state: Arc<ConnState>,
    /// A server of the list is remote and `--nats-insecure` is off: check each connection.
    pub(super) auth_check: bool,
    pub(super) server: String,
    pub(super) feed: Feed,
    pub(super) opts: ConsumeOptions,
    pub(super) counters: Arc<Counters>,
    pub(super) stop: Arc<AtomicBool>,
    /// Wakes a pull or a wait for the next message when stopping.
    pub(super) wake: Arc<tokio::sync::Notify>,
    pub(super) window: Window,
    /// Per (agent, session): the emitter, and the `seq` its next queued event will get (the
    /// key of its relay record).
    pub(super) emitters: HashMap<(String, String), (crate::Emitter, u64)>,
    pub(super) emitter_order: VecDeque<(String, String)>,
    pub(super) said: Said,
    /// Ids made for relayed messages that had none.
    pub(super) made_ids: u64,
    pub(super) drain_until: Arc<Mutex<Option<Instant>>>,
    /// Woken by a ticket's report.
    pub(super) notify: Arc<tokio::sync::Notify>,
    /// Where the tickets of what was handed over report (`crate::settle`).
    pub(super) settled: Arc<crate::settle::Settled>,
    /// JetStream: handed over, not yet settled, by ticket key.
    pub(super) flights: HashMap<u64, Flight>,
    /// How many may be in flight now: [`MAX_IN_FLIGHT`], halved each time a sink drops one
    /// (a queue the consumer cannot see, such as a plugin's, was full), and grown by one per
    /// message that ran. So a slow sink is fed about what it takes, and a message is not
    /// dropped and nak'ed again and again until JetStream's delivery limit gives up on it.
    pub(super) in_flight_limit: usize,
    /// Their ids.
    pub(super) flying: HashMap<String, u64>,
    pub(super) next_key: u64,
    /// The shared de-dup bucket ([`ConsumeOptions::shared_dedup`]), once opened.
    pub(super) shared: Option<Shared>,
    /// With partitions: the leases this host holds.
    pub(super) lease_table: Option<super::super::lease::Shared>,
    /// Until when ([`crate::settle::lease_clock`]) no start record is tried: the shared
    /// bucket left one unanswered.
    pub(super) start_down: Arc<AtomicU64>,
    /// What the bucket holds for the message in hand: the digest it ran with.
    pub(super) shared_digest: Option<u64>,
    /// JetStream: each durable consumer's delivery limit (`max_deliver`, as the server has
    /// it), by name: a message nak'ed on its last delivery is one JetStream gives up on.
    pub(super) max_deliver: HashMap<String, i64>,
    /// The give-ups counted, by this host's own naks and by the advisory.
    pub(super) given_up: Arc<GivenUp>,
}

/// The stream messages counted as given up by JetStream (`given_up`): by this host, when it
/// nak'ed a message on its last allowed delivery (its own state: nothing is missed while
/// disconnected), and by the MAX_DELIVERIES advisory; each stream sequence once (the last
/// 4,096 remembered).
pub(super) struct GivenUp {
    pub(super) seen: Mutex<(std::collections::HashSet<u64>, VecDeque<u64>)>,
    pub(super) counters: Arc<Counters>,
}

impl GivenUp {
    const REMEMBERED: usize = 4096;

    pub(super) fn new(counters: Arc<Counters>) -> GivenUp {
        GivenUp {
            seen: Mutex::new(Default::default()),
            counters,
        }
    }

    /// Counts stream message `seq` as given up; false if it was already.
    pub(super) fn count(&self, seq: Option<u64>) -> bool {
        if let Some(seq) = seq {
            let mut g = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            let (set, order) = &mut *g;
            if !set.insert(seq) {
                return false;
            }
            order.push_back(seq);
            if order.len() > Self::REMEMBERED
                && let Some(old) = order.pop_front()
            {
                set.remove(&old);
            }
        }
        self.counters.given_up.fetch_add(1, Ordering::AcqRel);
        true
    }
}

pub(super) type PullConsumer = jetstream::consumer::Consumer<jetstream::consumer::pull::Config>;

/// A JetStream message handed over whose hooks have not all settled it.
pub(super) struct Flight {
    pub(super) msg: jetstream::Message,
    pub(super) id: Option<(String, u64)>,
    /// The sequence of this host's claim on the id in the shared bucket (moved by its start
    /// record).
    pub(super) claim: Option<Arc<AtomicU64>>,
    /// The partition it was pulled from.
    pub(super) part: Option<u32>,
    /// Its size as received (subject, headers, body), toward the byte budget.
    pub(super) bytes: usize,
    /// When it was handed over, or last said to be in progress.
    pub(super) last: Instant,
}

impl Worker {
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The fence of a message taken now from partition `k`: `None` without partitions; one
    /// that admits nothing when the partition is no longer held.
    pub(super) fn fence_of(&self, k: u32) -> Option<crate::settle::Fence> {
        let t = self.lease_table.as_ref()?;
        let t = t.lock().unwrap_or_else(|e| e.into_inner());
        Some(t.fence(k).unwrap_or_else(crate::settle::Fence::closed))
    }

    pub(super) fn run(mut self, rt: &tokio::runtime::Runtime, client: async_nats::Client) {
        match self.opts.durable.clone() {
            None => self.run_core(rt, client),
            Some(durable) => self.run_jetstream(rt, client, &durable),
        }
    }
}
