//! What a consumer reads from NATS, and how it de-duplicates: [`ConsumeOptions`].

use super::*;

/// Default of [`ConsumeOptions::dedup_window`]: ids remembered.
pub const DEFAULT_DEDUP_IDS: usize = 100_000;
/// Default of [`ConsumeOptions::dedup_window`]: how long an id is remembered.
pub const DEFAULT_DEDUP_AGE: Duration = Duration::from_secs(3600);
/// Default of [`ConsumeOptions::buffer`]: messages.
pub const DEFAULT_BUFFER_MESSAGES: usize = 65_536;
/// Default of [`ConsumeOptions::buffer`]: bytes.
pub const DEFAULT_BUFFER_BYTES: usize = 64 << 20;
/// Default of [`ConsumeOptions::max_deliver`].
pub const DEFAULT_MAX_DELIVER: u32 = 5;

/// Where [`Consumer`] reads from, and how it de-duplicates.
#[derive(Clone, Debug)]
pub struct ConsumeOptions {
    pub(super) nats: NatsOptions,
    pub(super) subject: String,
    pub(super) durable: Option<String>,
    pub(super) queue: Option<String>,
    pub(super) stream: Option<String>,
    pub(super) shared_dedup: Option<String>,
    pub(super) dedup_ids: usize,
    pub(super) dedup_age: Duration,
    pub(super) dedup_file: Option<PathBuf>,
    pub(super) parse: ParseOptions,
    pub(super) max_deliver: u32,
    pub(super) buffer_messages: usize,
    pub(super) buffer_bytes: usize,
    pub(super) partitions: Option<u32>,
}

impl ConsumeOptions {
    /// Core NATS, subject `prx.lifecycle.>`, no persisted window.
    pub fn new(nats: NatsOptions) -> ConsumeOptions {
        ConsumeOptions {
            nats,
            subject: wire::LIFECYCLE_SUBJECTS.into(),
            durable: None,
            queue: None,
            stream: None,
            shared_dedup: None,
            dedup_ids: DEFAULT_DEDUP_IDS,
            dedup_age: DEFAULT_DEDUP_AGE,
            dedup_file: None,
            parse: ParseOptions::default(),
            max_deliver: DEFAULT_MAX_DELIVER,
            buffer_messages: DEFAULT_BUFFER_MESSAGES,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            partitions: None,
        }
    }

    /// With [`durable`](ConsumeOptions::durable): per-agent order across hosts. The subjects
    /// carry their agent's partition among `n` (publishers with the same
    /// [`PublishOptions::partitions`](crate::nats::PublishOptions::partitions)); each partition has
    /// a durable consumer of its own (`<durable>-<k>`), and the hosts sharing them hold at
    /// most one lease per partition each at a time, in the key-value bucket
    /// `PRXH_<stream>_<durable>`: one host pulls a partition at a time, and a host that dies
    /// has its partitions taken over by the others once its leases expire (15 s). `n` is taken
    /// between 1 and [`wire::MAX_PARTITIONS`](crate::nats::wire::MAX_PARTITIONS).
    pub fn partitions(mut self, n: u32) -> ConsumeOptions {
        self.partitions = Some(n.clamp(1, crate::nats::wire::MAX_PARTITIONS));
        self
    }

    /// Core NATS: the consumer's buffer between the client and the pipeline holds at most
    /// `messages` messages and `bytes` bytes (defaults 65,536 and 64 MiB; at least 1 and
    /// 1 MiB); what arrives while it is full is dropped and counted (`dropped_full`).
    pub fn buffer(mut self, messages: usize, bytes: usize) -> ConsumeOptions {
        self.buffer_messages = messages.max(1);
        self.buffer_bytes = bytes.max(1 << 20);
        self
    }

    /// The subject filter, in NATS's syntax (`*` one token, `>` the rest) — not the bus's.
    pub fn subject(mut self, filter: impl Into<String>) -> ConsumeOptions {
        self.subject = filter.into();
        self
    }

    /// A JetStream durable pull consumer of this name: it remembers what was acked across
    /// restarts, and is pulled from only while the pipeline has room.
    pub fn durable(mut self, name: impl Into<String>) -> ConsumeOptions {
        self.durable = Some(name.into());
        self
    }

    /// Core NATS: subscribe in this queue group, so that the consumers sharing it split the
    /// events (NATS gives each message to one member). Nothing orders or de-duplicates across
    /// the members: an agent's events may run on several hosts at once, out of order.
    /// Ignored with [`durable`](ConsumeOptions::durable) (a durable consumer's pullers share
    /// its messages already).
    pub fn queue(mut self, group: impl Into<String>) -> ConsumeOptions {
        self.queue = Some(group.into());
        self
    }

    /// JetStream: hosts sharing the durable consumer also share what ran, in a key-value
    /// bucket of this name (the stream `KV_<name>`, one entry per message id, kept for the
    /// window's age): a message redelivered to another host after a lost ack, or stored again
    /// after the stream's duplicate window, is recognized there too. Per event it costs a
    /// claim before the hand-off, a start record before its first hook run starts and a done
    /// record after the hooks ran, before the ack (three JetStream publishes, acked); a message
    /// found started by another host and not done runs and is counted (`reclaimed`): every
    /// event run twice is among those.
    pub fn shared_dedup(mut self, bucket: impl Into<String>) -> ConsumeOptions {
        self.shared_dedup = Some(bucket.into());
        self
    }

    /// The stream the durable consumer reads (default: the stream holding the subject).
    pub fn stream(mut self, name: impl Into<String>) -> ConsumeOptions {
        self.stream = Some(name.into());
        self
    }

    /// Remember the last `ids` message ids for at most `age` (defaults 100,000 and 1 h).
    pub fn dedup_window(mut self, ids: usize, age: Duration) -> ConsumeOptions {
        self.dedup_ids = ids.max(1);
        self.dedup_age = age;
        self
    }

    /// Keep the window in this file (appended before each ack, compacted as it grows), so a
    /// restarted consumer still recognizes what it handed over before.
    pub fn dedup_file(mut self, path: impl AsRef<Path>) -> ConsumeOptions {
        self.dedup_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// A durable consumer it creates lets JetStream deliver a message at most this many
    /// times (default 5, at least 1): a message this client cannot take (async-nats drops
    /// the connection on a header that is not UTF-8) stalls the consumer for at most
    /// `max_deliver` × the 10 s ack wait, then JetStream gives up on it and says so in an
    /// advisory, counted as `given_up`. An existing durable consumer keeps its setting.
    pub fn max_deliver(mut self, n: u32) -> ConsumeOptions {
        self.max_deliver = n.max(1);
        self
    }

    /// How bodies are parsed (`lenient`: documented fields may be missing).
    pub fn parse_options(mut self, parse: ParseOptions) -> ConsumeOptions {
        self.parse = parse;
        self
    }

    /// The connection options.
    pub fn nats(&self) -> &NatsOptions {
        &self.nats
    }

    /// The subject filter consumed, in NATS's syntax.
    pub fn subject_filter(&self) -> &str {
        &self.subject
    }

    pub(crate) fn check(&self) -> Result<(), ConnectError> {
        wire::check_filter(&self.subject).map_err(|reason| ConnectError::Invalid {
            what: "NATS subject (NATS's syntax: tokens, * or a final >)",
            reason: format!("{:?}: {reason}", self.subject),
        })?;
        if let Some(d) = &self.durable {
            check_name(d, "JetStream durable consumer name")?;
        }
        if let Some(s) = &self.stream {
            check_name(s, "JetStream stream name")?;
        }
        if let Some(q) = &self.queue {
            check_name(q, "NATS queue group name")?;
        }
        if let Some(b) = &self.shared_dedup {
            check_name(b, "JetStream key-value bucket name")?;
        }
        if self.partitions.is_some() && !wire::partitionable(&self.subject) {
            return Err(ConnectError::Invalid {
                what: "NATS subject with partitions",
                reason: format!(
                    "{:?}: must end in prx.lifecycle.>, prx.lifecycle.* or prx.lifecycle.<event>",
                    self.subject
                ),
            });
        }
        self.nats.check(true)
    }
}
