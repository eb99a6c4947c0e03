//! Partition leases (docs/nats.md § Per-agent order across hosts): the hosts sharing a
//! durable consumer with partitions split them through a JetStream key-value bucket whose
//! entries expire ([`LEASE_TTL`] after their last write).
//!
//! ```text
//! bucket KV_PRXH_<stream>_<durable>          one durable consumer per partition: <durable>-<k>
//!   h.<host>  presence, written every tick    filter <subject>.<k> (wire::partition_filter)
//!   p.<k>     the holder's host id, or ""      (free), renewed every RENEW_EVERY with
//!             Nats-Expected-Last-Subject-Sequence = the holder's last write
//! ```
//!
//! A host claims a partition only when its key is absent (expired, or never written), free, or
//! its own, with a write conditional on what it read, so two hosts never both win. A renewal
//! refused because the key moved reads the holder again: still this host (an earlier renewal
//! the server took but confirmed too late) or absent (expired while the server was away), it
//! keeps the lease; only another holder makes it lost. After an outage a host claims no absent
//! key for [`GRACE`], so each host, alive throughout, takes its own leases back first.
//!
//! Fencing: each held lease has a [`Lease`] that the runs queued under it check before they
//! start; it admits runs for [`STALE`] after the last confirmed renewal, none once the lease is
//! lost, and none handed over before the lease was taken back after it expired. It holds at most
//! ⌈partitions / hosts present⌉; above that it drains one (stops pulling it, waits until what it
//! handed over from it settled and was acked) and frees it. A host killed stops renewing: its
//! leases and presence expire after [`LEASE_TTL`], which is longer than JetStream's ack wait
//! (10 s) plus [`RENEW_EVERY`], so what it had taken and not acked is already due for
//! redelivery, ahead of anything newer of the partition, when the next holder first pulls.

use super::wire;
use crate::settle::{Fence, Lease, lease_clock};
use async_nats::jetstream;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a lease (and a host's presence) outlives its last write.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(15);
/// A held lease is written again at the first tick this long after its last write (so every
/// 2 s).
const RENEW_EVERY: Duration = Duration::from_millis(1500);
/// Claims, releases and presence: once per tick.
const TICK: Duration = Duration::from_secs(1);
/// A lease not renewed for this long is no longer pulled from (the server may have let it go).
const STALE: Duration = Duration::from_secs(11);
/// After the server did not answer: how long a host claims no absent key, so that every host
/// first takes back its own leases, which expired meanwhile (a host reconnects within 1 s and
/// renews at its next tick; its keeper cuts a tick short at the first unanswered write).
const GRACE: Duration = Duration::from_secs(8);

/// Writes `value` to a key-value `subject` if the subject's last write is `expect` (0: it
/// holds nothing; `None`: unconditional): the write's sequence; `Err(true)` when another
/// write won, `Err(false)` when the server did not answer within 2 s. The bucket writes of
/// the leases and of the shared de-dup record.
pub(crate) async fn write_if(
    js: &jetstream::Context,
    subject: String,
    value: String,
    expect: Option<u64>,
) -> Result<u64, bool> {
    let mut h = async_nats::HeaderMap::new();
    if let Some(e) = expect {
        h.insert(
            "Nats-Expected-Last-Subject-Sequence",
            e.to_string().as_str(),
        );
    }
    let sent = async {
        let ack = js
            .publish_with_headers(subject, h, value.into())
            .await
            .map_err(|_| false)?;
        std::future::IntoFuture::into_future(ack)
            .await
            .map(|a| a.sequence)
            .map_err(|e| e.kind() == jetstream::context::PublishErrorKind::WrongLastSequence)
    };
    tokio::time::timeout(Duration::from_secs(2), sent)
        .await
        .unwrap_or(Err(false))
}

/// One partition this host holds.
struct Held {
    seq: u64,
    renewed: Instant,
    draining: bool,
    /// What the runs handed over from it check before they start.
    lease: Arc<Lease>,
}

impl Held {
    fn new(seq: u64, at: Instant) -> Held {
        let lease = Arc::new(Lease::default());
        lease.renewed(until(at));
        Held {
            seq,
            renewed: at,
            draining: false,
            lease,
        }
    }
}

/// Until when runs may start under a lease written at `at` (its write sent then).
fn until(at: Instant) -> u64 {
    (lease_clock() + STALE.as_millis() as u64).saturating_sub(at.elapsed().as_millis() as u64)
}

/// What the worker and the keeper task share.
#[derive(Default)]
pub(crate) struct Table {
    held: BTreeMap<u32, Held>,
    /// Draining partitions with nothing in flight and no pull standing: the keeper frees them.
    idle: BTreeSet<u32>,
    stopping: bool,
}

impl Table {
    /// The partitions to pull from now: held, not draining, renewed recently.
    pub(crate) fn active(&self) -> Vec<u32> {
        self.held
            .iter()
            .filter(|(_, h)| !h.draining && h.renewed.elapsed() < STALE)
            .map(|(k, _)| *k)
            .collect()
    }

    /// The fence of a message handed over now from partition `k` (`None`: not held).
    pub(crate) fn fence(&self, k: u32) -> Option<Fence> {
        self.held.get(&k).map(|h| h.lease.fence())
    }

    /// A held partition is draining (to be given up once nothing of it is in flight).
    pub(crate) fn draining(&self) -> bool {
        self.held.values().any(|h| h.draining)
    }

    /// The worker: these draining partitions have nothing in flight any more.
    pub(crate) fn drained(&mut self, busy: &BTreeSet<u32>) {
        let ready: Vec<u32> = self
            .held
            .iter()
            .filter(|(k, h)| h.draining && !busy.contains(k))
            .map(|(k, _)| *k)
            .collect();
        self.idle.extend(ready);
    }
}

pub(crate) type Shared = Arc<Mutex<Table>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Table> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bucket and what this host knows of it.
pub(crate) struct Leases {
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    bucket: String,
    partitions: u32,
    pub(crate) table: Shared,
    /// A read or write went unanswered since the keeper last looked.
    unanswered: AtomicBool,
}

/// What became of a renewal.
enum Renewal {
    /// Written (`true`: taken back after it expired, a new epoch).
    Kept(u64, bool),
    /// Another host holds it.
    Lost,
    /// The server did not answer.
    Unanswered,
}

impl Leases {
    pub(crate) async fn open(
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        partitions: u32,
    ) -> Result<Leases, String> {
        let bucket = format!("PRXH_{stream}_{durable}");
        let config = jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age: LEASE_TTL,
            allow_direct: true,
            ..Default::default()
        };
        let s = js
            .get_or_create_stream(config)
            .await
            .map_err(|e| format!("the lease bucket {bucket:?}: {e}"))?;
        Ok(Leases {
            js: js.clone(),
            stream: s,
            bucket,
            partitions,
            table: Shared::default(),
            unanswered: AtomicBool::new(false),
        })
    }

    fn key(&self, k: u32) -> String {
        format!("$KV.{}.p.{k}", self.bucket)
    }

    fn presence(&self) -> String {
        format!("$KV.{}.h.{}", self.bucket, wire::instance_id())
    }

    async fn write(&self, subject: String, value: &str, expect: Option<u64>) -> Result<u64, bool> {
        let w = write_if(&self.js, subject, value.to_string(), expect).await;
        if w == Err(false) {
            self.unanswered.store(true, Ordering::Release);
        }
        w
    }

    /// The holder of partition `k` and the key's sequence; `None` when the key is absent
    /// (`Some(Err)`: the server did not answer).
    async fn holder(&self, k: u32) -> Result<Option<(String, u64)>, ()> {
        let got = tokio::time::timeout(
            Duration::from_secs(2),
            self.stream.get_last_raw_message_by_subject(&self.key(k)),
        )
        .await
        .map_err(|_| self.unanswered.store(true, Ordering::Release))?;
        match got {
            Ok(m) => Ok(Some((
                String::from_utf8_lossy(&m.payload).into_owned(),
                m.sequence,
            ))),
            Err(e) if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
                Ok(None)
            }
            Err(_) => {
                self.unanswered.store(true, Ordering::Release);
                Err(())
            }
        }
    }

    /// Hosts present (their presence written within the TTL), this one included; `None` when
    /// the server did not answer (then nothing is claimed or drained this tick).
    async fn hosts(&self) -> Option<usize> {
        use futures_util::StreamExt;
        let filter = format!("$KV.{}.h.>", self.bucket);
        let count = async {
            let mut subjects = self.stream.info_with_subjects(filter).await.ok()?;
            let mut n = 0;
            while let Some(s) = subjects.next().await {
                s.ok()?;
                n += 1;
            }
            Some(n)
        };
        let n = tokio::time::timeout(Duration::from_secs(2), count)
            .await
            .ok()
            .flatten();
        if n.is_none() {
            self.unanswered.store(true, Ordering::Release);
        }
        n.map(|n: usize| n.max(1))
    }

    /// The keeper: presence, renewals, claims and releases, once a tick, until stopped; then
    /// frees every lease it holds and withdraws its presence.
    pub(crate) async fn keep(self: Arc<Self>) {
        let me = wire::instance_id();
        let mut first = true;
        // Since when the server answers again after it did not (`GRACE`).
        let (mut troubled, mut back): (bool, Option<Instant>) = (false, None);
        loop {
            if lock(&self.table).stopping {
                break;
            }
            let answered = self.tick(me, &mut first, back).await;
            if !answered {
                troubled = true;
            } else if std::mem::take(&mut troubled) {
                back = Some(Instant::now());
                tracing::info!("NATS consumer {me}: the lease bucket answers again");
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// One tick of the keeper; false when the server left a read or write unanswered (the
    /// tick is then cut short).
    async fn tick(&self, me: &str, first: &mut bool, back: Option<Instant>) -> bool {
        self.unanswered.store(false, Ordering::Release);
        let answered = |l: &Self| !l.unanswered.load(Ordering::Acquire);
        let _ = self.write(self.presence(), "", None).await;
        if std::mem::take(first) {
            // Hosts started together see each other before the first claims.
            return answered(self);
        }
        if !answered(self) {
            return false;
        }
        self.renew(me).await;
        if !answered(self) {
            return false;
        }
        self.release().await;
        let Some(hosts) = self.hosts().await else {
            return false;
        };
        {
            let target = (self.partitions as usize).div_ceil(hosts);
            let held = {
                let mut t = lock(&self.table);
                let held = t.held.len();
                if held > target
                    && !t.held.values().any(|h| h.draining)
                    && let Some((k, h)) = t.held.iter_mut().next_back()
                {
                    h.draining = true;
                    tracing::info!("NATS consumer {me}: draining partition {k} (rebalancing)");
                }
                held
            };
            if held < target {
                // Right after an outage an absent key is most likely a live host's expired
                // lease, which it takes back at its next tick: leave it to it.
                let absent_too = back.is_none_or(|b| b.elapsed() >= GRACE);
                self.claim(me, target - held, absent_too).await;
            }
        }
        answered(self)
    }

    /// After the worker's last acks: stops the keeper (`keeper`, its task), frees every
    /// lease this host holds and withdraws its presence, so the others take the partitions
    /// over at their next tick instead of after [`LEASE_TTL`].
    pub(crate) async fn quit(&self, keeper: tokio::task::JoinHandle<()>) {
        lock(&self.table).stopping = true;
        // No renewal may race the frees below (each is conditional on the last write).
        keeper.abort();
        let _ = keeper.await;
        let me = wire::instance_id();
        let held: Vec<(u32, u64)> = lock(&self.table)
            .held
            .iter()
            .map(|(k, h)| (*k, h.seq))
            .collect();
        for (k, mut seq) in held {
            // A renewal the server took but did not confirm in time moved the lease's last
            // write: read it again and free that one, if it is still this host's.
            for _ in 0..3 {
                if self.write(self.key(k), "", Some(seq)).await.is_ok() {
                    tracing::info!("NATS consumer {me}: freed partition {k} (stopping)");
                    break;
                }
                match self.holder(k).await {
                    Ok(Some((h, s))) if h == me => seq = s,
                    _ => break,
                }
            }
        }
        let _ = self.stream.purge().filter(self.presence()).await;
    }

    async fn renew(&self, me: &str) {
        let due: Vec<(u32, u64)> = lock(&self.table)
            .held
            .iter()
            .filter(|(_, h)| h.renewed.elapsed() >= RENEW_EVERY)
            .map(|(k, h)| (*k, h.seq))
            .collect();
        for (k, seq) in due {
            let at = Instant::now();
            match self.renew_one(me, k, seq).await {
                Renewal::Kept(seq, retaken) => {
                    if let Some(h) = lock(&self.table).held.get_mut(&k) {
                        (h.seq, h.renewed) = (seq, at);
                        if retaken {
                            h.lease.retaken(until(at));
                            tracing::info!(
                                "NATS consumer {me}: took partition {k} back: its lease had expired (what was queued under it before is delivered again)"
                            );
                        } else {
                            h.lease.renewed(until(at));
                        }
                    }
                }
                Renewal::Lost => {
                    let mut t = lock(&self.table);
                    if let Some(h) = t.held.remove(&k) {
                        h.lease.lost();
                    }
                    t.idle.remove(&k);
                    tracing::warn!(
                        "NATS consumer {me}: lost partition {k}: its lease was taken after it expired (what was queued under it is not run here)"
                    );
                }
                // Not answered: the rest of the tick waits for the server.
                Renewal::Unanswered => return,
            }
        }
    }

    /// Writes partition `k`'s lease again, conditional on its last write `seq`. A refusal
    /// reads the holder: this host (a renewal the server took and did not confirm in time
    /// moved the sequence) is renewed from there, an absent key (expired while the server was
    /// away or this host stalled, and nobody took it) is taken back; only another holder or a
    /// free key makes it lost.
    async fn renew_one(&self, me: &str, k: u32, mut seq: u64) -> Renewal {
        let mut retaken = false;
        for _ in 0..3 {
            match self.write(self.key(k), me, Some(seq)).await {
                Ok(s) => return Renewal::Kept(s, retaken),
                Err(false) => return Renewal::Unanswered,
                Err(true) => {}
            }
            match self.holder(k).await {
                Ok(Some((h, s))) if h == me => seq = s,
                Ok(None) => (seq, retaken) = (0, true),
                Ok(Some(_)) => return Renewal::Lost,
                Err(()) => return Renewal::Unanswered,
            }
        }
        Renewal::Unanswered
    }

    async fn release(&self) {
        let idle: Vec<(u32, u64)> = {
            let t = lock(&self.table);
            t.idle
                .iter()
                .filter_map(|k| t.held.get(k).map(|h| (*k, h.seq)))
                .collect()
        };
        for (k, seq) in idle {
            if self.write(self.key(k), "", Some(seq)).await.is_ok() {
                let mut t = lock(&self.table);
                t.held.remove(&k);
                t.idle.remove(&k);
                tracing::info!("NATS consumer {}: freed partition {k}", wire::instance_id());
            }
        }
    }

    /// Claims up to `want` partitions not held here: free ones, this host's own (a write it
    /// no longer tracks), and absent ones if `absent_too`.
    async fn claim(&self, me: &str, mut want: usize, absent_too: bool) {
        // Each host starts its scan elsewhere, so that hosts starting together rarely race.
        let start = wire::partition(me, self.partitions);
        for i in 0..self.partitions {
            if want == 0 {
                break;
            }
            let k = (start + i) % self.partitions;
            if lock(&self.table).held.contains_key(&k) {
                continue;
            }
            let expect = match self.holder(k).await {
                Ok(None) if absent_too => 0,
                Ok(Some((h, seq))) if h.is_empty() || h == me => seq,
                _ => continue,
            };
            let at = Instant::now();
            if let Ok(seq) = self.write(self.key(k), me, Some(expect)).await {
                lock(&self.table).held.insert(k, Held::new(seq, at));
                want -= 1;
                tracing::info!("NATS consumer {me}: took partition {k}");
            }
        }
    }
}
