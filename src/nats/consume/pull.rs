//! A durable JetStream consumer: pulls (one consumer per partition with `--nats-partitions`),
//! takes each message, and acks or naks it once its hooks settled it (ARCHITECTURE.md § NATS
//! bridge).

use super::super::lease::Leases;
use super::pulling::Pulls;
use super::*;

impl Worker {
    pub(super) fn run_jetstream(
        &mut self,
        rt: &tokio::runtime::Runtime,
        client: async_nats::Client,
        durable: &str,
    ) {
        // The context spawns its acker task: inside the runtime.
        let js = {
            let _inside = rt.enter();
            jetstream::new(client.clone())
        };
        let Some((consumer, stream)) = self.open_durable(rt, &js, durable) else {
            return;
        };
        let Some(leases) = self.open_leases(rt, &js, &stream, durable) else {
            return;
        };
        self.lease_table = leases.as_ref().map(|(l, _)| l.table.clone());
        if !self.open_shared(rt, &js) {
            return;
        }
        if leases.is_some() {
            rt.block_on(self.say_earlier_partition_format(&js, &stream));
        }
        self.watch_advisories(rt, &client, &stream, durable);
        let mut parts: HashMap<u32, PullConsumer> = HashMap::new();
        let mut pulls = Pulls::new();
        let mut checked = 0;
        // After a connection was lost, pull one message at a time until one arrives: a
        // message async-nats cannot parse (it drops the connection) is then delivered alone,
        // and reaches JetStream's delivery limit alone.
        let mut careful = false;
        let mut pausing = false;
        while !self.stopping() {
            if self.server_refused(&client, &mut checked) {
                break;
            }
            rt.block_on(self.settle());
            // Borrowed, not cloned: this runs once per pull that ends and per settled message
            // while a source waits, so it must not cost a consumer's clone per partition.
            let sources: Vec<(Option<u32>, &PullConsumer)> = match &leases {
                None => consumer.iter().map(|c| (None, c)).collect(),
                Some((l, _)) => {
                    let held =
                        self.partition_sources(rt, &js, &stream, durable, l, &mut parts, &pulls);
                    held.into_iter().map(|k| (Some(k), &parts[&k])).collect()
                }
            };
            // Back-pressure: each source is pulled on its own, for no more than the room left
            // in messages and bytes, and only while the pipeline has room (ARCHITECTURE.md §
            // NATS bridge, "Acks after the hooks ran").
            let connects = self.state.connects.load(Ordering::Acquire);
            let held = rt.block_on(self.start_pulls(&client, &sources, &mut pulls, careful));
            if held {
                if !std::mem::replace(&mut pausing, true) {
                    self.counters.paused.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                pausing = false;
            }
            let tick = if held {
                Duration::from_millis(2)
            } else {
                Duration::from_millis(100)
            };
            let read = rt.block_on(self.read_pulls(&mut pulls, tick));
            if self.state.connects.load(Ordering::Acquire) != connects || !self.state.is_connected()
            {
                careful = true;
            } else if read.got {
                careful = false;
            }
        }
        rt.block_on(self.read_pulls_to_end(&mut pulls));
        rt.block_on(self.finish(&js));
        if let Some((l, keeper)) = leases {
            rt.block_on(l.quit(keeper));
        }
    }

    /// The durable consumer (without partitions) and the stream it reads; with partitions
    /// only the stream (each partition's consumer is made when its lease is taken, `lease`).
    /// Retried until it works; `None` if stopped meanwhile.
    fn open_durable(
        &mut self,
        rt: &tokio::runtime::Runtime,
        js: &jetstream::Context,
        durable: &str,
    ) -> Option<(Option<PullConsumer>, String)> {
        loop {
            let made = match self.opts.partitions {
                None => rt
                    .block_on(self.durable_consumer(js, durable))
                    .map(|(c, s)| (Some(c), s)),
                Some(_) => rt.block_on(self.stream_name(js)).map(|s| (None, s)),
            };
            match made {
                Ok(c) => {
                    if let Some(consumer) = &c.0 {
                        self.note_max_deliver(consumer);
                    }
                    return Some(c);
                }
                Err(e) => {
                    self.said.warn(format_args!(
                        "NATS consumer: durable {durable:?} on {}: {e}; retrying",
                        self.opts.subject
                    ));
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return None;
                    }
                }
            }
        }
    }

    fn note_max_deliver(&mut self, c: &PullConsumer) {
        let info = c.cached_info();
        self.max_deliver
            .insert(info.name.clone(), info.config.max_deliver);
    }

    /// Before a nak: a message on its last allowed delivery is one JetStream will give up on
    /// (never deliver again): counted (`given_up`) and said, from this host's own state, so
    /// that a give-up is counted even when the advisory is missed (sent while disconnected,
    /// or after this process exited).
    pub(super) fn nak_gives_up(&self, m: &jetstream::Message) {
        let Ok(info) = m.info() else {
            return;
        };
        let Some(&max) = self.max_deliver.get(info.consumer) else {
            return;
        };
        if max > 0 && info.delivered >= max && self.given_up.count(Some(info.stream_sequence)) {
            tracing::warn!(
                "NATS consumer ({}): durable {:?}: stream message {} not run on its last delivery ({} of --nats-max-deliver {max}): JetStream will not deliver it again",
                self.server,
                info.consumer,
                info.stream_sequence,
                info.delivered
            );
        }
    }

    /// With partitions: the lease bucket, and its keeper running (`Some(None)` without
    /// partitions). Retried until it works; `None` if stopped meanwhile.
    #[allow(clippy::type_complexity)]
    fn open_leases(
        &mut self,
        rt: &tokio::runtime::Runtime,
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
    ) -> Option<Option<(Arc<Leases>, tokio::task::JoinHandle<()>)>> {
        let n = match self.opts.partitions {
            None => return Some(None),
            Some(n) => n,
        };
        loop {
            match rt.block_on(Leases::open(js, stream, durable, n)) {
                Ok(l) => {
                    let l = Arc::new(l);
                    let keeper = rt.spawn(l.clone().keep());
                    return Some(Some((l, keeper)));
                }
                Err(e) => {
                    self.said.warn(format_args!("NATS consumer: {e}; retrying"));
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return None;
                    }
                }
            }
        }
    }

    /// With `--nats-dedup-bucket`: the shared bucket, retried until it opens; false if
    /// stopped meanwhile.
    fn open_shared(&mut self, rt: &tokio::runtime::Runtime, js: &jetstream::Context) -> bool {
        let Some(bucket) = self.opts.shared_dedup.clone() else {
            return true;
        };
        loop {
            match rt.block_on(Shared::open(js, &bucket, self.opts.dedup_age)) {
                Ok(s) => {
                    self.shared = Some(s);
                    return true;
                }
                Err(e) => {
                    self.said.warn(format_args!("NATS consumer: {e}; retrying"));
                    if self.pause_or_stop(Duration::from_secs(1)) {
                        return false;
                    }
                }
            }
        }
    }

    /// With partitions: says (on stderr) how many messages of the stream are on subjects of
    /// the earlier partition format, which no partition consumer of this version reads
    /// (`wire::partition_token`): publishers of both versions must not share a stream.
    async fn say_earlier_partition_format(&self, js: &jetstream::Context, stream: &str) {
        use futures_util::StreamExt;
        let filter = wire::partitions_filter(&self.opts.subject);
        let count = async {
            let mut old = 0;
            let s = js.get_stream(stream).await.ok()?;
            let mut subjects = s.info_with_subjects(&filter).await.ok()?;
            while let Some(Ok((subject, n))) = subjects.next().await {
                if wire::earlier_partition_format(&subject) {
                    old += n;
                }
            }
            Some(old)
        };
        if let Ok(Some(old)) = tokio::time::timeout(Duration::from_secs(5), count).await
            && old > 0
        {
            tracing::warn!(
                "NATS consumer: stream {stream:?} holds {old} messages of the earlier partition format (subjects ending in the partition number alone, published by an older prx-hooks): no partition consumer of this version reads them; publish with this version (subjects ending in p<partition>)"
            );
        }
    }

    /// JetStream's MAX_DELIVERIES advisory: a message it stopped delivering (one this client
    /// could never take, or one redelivered past the limit), counted and said.
    fn watch_advisories(
        &self,
        rt: &tokio::runtime::Runtime,
        client: &async_nats::Client,
        stream: &str,
        durable: &str,
    ) {
        let advisory = match self.opts.partitions {
            None => format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}"),
            Some(_) => format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*"),
        };
        match rt.block_on(client.subscribe(advisory.clone())) {
            Ok(mut sub) => {
                let given_up = self.given_up.clone();
                let what = format!("NATS consumer ({}): durable {durable:?}", self.server);
                rt.spawn(async move {
                    use futures_util::StreamExt;
                    while let Some(m) = sub.next().await {
                        let seq = serde_json::from_slice::<serde_json::Value>(&m.payload)
                            .ok()
                            .and_then(|v| v["stream_seq"].as_u64());
                        // Counted already when this host nak'ed its last delivery.
                        if !given_up.count(seq) {
                            continue;
                        }
                        tracing::warn!(
                            "{what}: JetStream gave up on stream message {} after the maximum deliveries (--nats-max-deliver); it will not be consumed",
                            seq.map_or("?".to_string(), |s| s.to_string())
                        );
                    }
                });
            }
            Err(e) => tracing::warn!("NATS consumer: subscribing to {advisory}: {e}"),
        }
    }

    /// With partitions, what to pull from: the partitions held and not draining (their
    /// consumers made on first use, kept in `parts`); draining ones with nothing in flight
    /// and no pull standing are marked free to give up.
    #[allow(clippy::too_many_arguments)]
    fn partition_sources(
        &mut self,
        rt: &tokio::runtime::Runtime,
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        leases: &Leases,
        parts: &mut HashMap<u32, PullConsumer>,
        pulls: &Pulls,
    ) -> Vec<u32> {
        let active = {
            let mut t = leases.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.draining() {
                let busy = self
                    .flights
                    .values()
                    .filter_map(|f| f.part)
                    .chain(pulls.standing_parts())
                    .collect();
                t.drained(&busy);
            }
            t.active()
        };
        let mut v = Vec::with_capacity(active.len());
        for k in active {
            if let std::collections::hash_map::Entry::Vacant(slot) = parts.entry(k) {
                match rt.block_on(self.partition_consumer(js, stream, durable, k)) {
                    Ok(c) => {
                        self.note_max_deliver(&c);
                        slot.insert(c);
                    }
                    Err(e) => {
                        self.said.warn(format_args!(
                            "NATS consumer: durable {durable}-{k}: {e}; retrying"
                        ));
                        continue;
                    }
                }
            }
            v.push(k);
        }
        v
    }

    /// One pulled message: waits until its hooks' queues have room for it (and for what is
    /// already in flight), hands it over, and acks it at once if nothing is to run.
    pub(super) async fn take(&mut self, m: jetstream::Message, part: Option<u32>) {
        self.wait_for_hook_room(m.subject.as_str()).await;
        let key = self.next_key;
        self.next_key += 1;
        self.shared_digest = None;
        // Fencing: what the partition's lease admits now, checked again before each run.
        let fence = part.and_then(|k| self.fence_of(k));
        let fenced = fence.as_ref().is_some_and(|f| !f.admits());
        // The claim goes first: a host that dies after it leaves a record saying the message
        // may have run (ARCHITECTURE.md § NATS bridge, "Shared de-dup").
        let (mut claim, mut before) = (None, Record::Absent);
        if let Some(shared) = &self.shared
            && !self.stopping()
            && !fenced
            && let Some(id) = m.headers.as_ref().and_then(|h| h.get(wire::MSG_ID))
        {
            (claim, before) = shared.claim(id.as_str()).await;
            if let Record::Done(d) = &before {
                self.shared_digest = Some(*d);
            }
        }
        // Taken over from another host's claim with a start record: its hooks may have run
        // there. (A claim without one: they had not started.)
        let reclaimed_from = match &before {
            Record::Claimed {
                host,
                started: true,
                ..
            } if host != wire::instance_id() => Some(host.clone()),
            _ => None,
        };
        let claim = claim.map(|s| Arc::new(AtomicU64::new(s)));
        let start = match (&self.shared, &claim) {
            (Some(shared), Some(seq)) => {
                m.headers
                    .as_ref()
                    .and_then(|h| h.get(wire::MSG_ID))
                    .map(|id| {
                        let down = self.start_down.clone();
                        shared.start_record(id.as_str(), seq.clone(), down)
                    })
            }
            _ => None,
        };
        let (fate, id) = if self.stopping() || fenced {
            (Fate::Later, None)
        } else {
            let incoming = Incoming {
                subject: m.subject.as_str(),
                headers: m.headers.as_ref(),
                payload: &m.payload,
                delivery: wire::delivery(&m),
                reclaimed: reclaimed_from.is_some(),
                fence,
                start,
            };
            self.handle(&incoming, Some(key))
        };
        let kind = match fate {
            Fate::Handed => {
                let m_len = m.length;
                if let Some((id, _)) = &id {
                    self.flying.insert(id.clone(), key);
                    if let Some(host) = &reclaimed_from {
                        self.counters.reclaimed.fetch_add(1, Ordering::AcqRel);
                        tracing::warn!(
                            "NATS consumer: {}: reclaimed from host {}, which claimed it and did not record it done: run here, it may have run there too",
                            wire::encode_value(id),
                            wire::encode_value(host)
                        );
                    }
                }
                self.flights.insert(
                    key,
                    Flight {
                        msg: m,
                        id,
                        claim,
                        part,
                        bytes: m_len,
                        last: Instant::now(),
                    },
                );
                self.counters
                    .in_flight
                    .store(self.flights.len() as u64, Ordering::Relaxed);
                return;
            }
            // A redelivery of one whose hooks still run: its ack goes to this delivery.
            Fate::InFlight(k) => {
                if let Some(f) = self.flights.get_mut(&k) {
                    f.msg = m;
                }
                return;
            }
            Fate::Skip => jetstream::AckKind::Ack,
            Fate::Refused => jetstream::AckKind::Term,
            Fate::Later => jetstream::AckKind::Nak(None),
        };
        self.answer(m, claim.map(|c| c.load(Ordering::Acquire)), kind)
            .await;
    }

    /// Waits until the hooks' queues of the subject's event have room for one more message
    /// (and for what is already in flight), settling what finishes meanwhile.
    async fn wait_for_hook_room(&mut self, subject: &str) {
        let kind = wire::event_of_subject(subject);
        if let Some(kind) = kind {
            let mut paused = false;
            while !self.stopping() && !self.feed.room(kind, self.flights.len() + 1) {
                if !std::mem::replace(&mut paused, true) {
                    self.counters.paused.fetch_add(1, Ordering::Relaxed);
                }
                let notify = self.notify.clone();
                tokio::select! {
                    _ = notify.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
                self.settle().await;
            }
        }
    }

    /// A pulled message not handed over: its claim given back, then acked, terminated or
    /// nak'ed as `kind` says.
    async fn answer(&self, m: jetstream::Message, claim: Option<u64>, kind: jetstream::AckKind) {
        // Claimed, then not handed over (stopping, refused, a duplicate): nothing of it ran
        // here, so the next host to take it must not count it as reclaimed.
        if let (Some(seq), Some(shared)) = (claim, &self.shared)
            && let Some(id) = m.headers.as_ref().and_then(|h| h.get(wire::MSG_ID))
        {
            shared.unclaim(id.as_str(), seq).await;
        }
        let is_ack = !matches!(kind, jetstream::AckKind::Nak(_));
        if !is_ack {
            self.nak_gives_up(&m);
        }
        if tokio::time::timeout(ACKS_WAIT, m.ack_with(kind))
            .await
            .is_ok_and(|r| r.is_ok())
            && is_ack
        {
            self.counters.acked.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Takes what the hooks settled: the ids of what ran into the window (and its file,
    /// before the acks leave), acks for them, a nak with a delay for what a sink dropped;
    /// and an in-progress ack for what has been running a while.
    pub(super) async fn settle(&mut self) {
        let settled = self.settled.take();
        let mut ran_ids = Vec::new();
        let mut done = Vec::new();
        let mut out = Vec::with_capacity(settled.len());
        for (key, ran) in settled {
            let Some(f) = self.flights.remove(&key) else {
                continue;
            };
            self.in_flight_limit = if ran {
                (self.in_flight_limit + 1).min(MAX_IN_FLIGHT)
            } else {
                (self.in_flight_limit / 2).max(1)
            };
            if let Some((id, d)) = &f.id {
                self.flying.remove(id);
                if ran {
                    self.window.insert(id, *d);
                    ran_ids.push((id.clone(), *d));
                    let claim = f.claim.as_ref().map_or(0, |c| c.load(Ordering::Acquire));
                    done.push((id.clone(), *d, claim));
                }
            }
            out.push((f.msg, ran));
        }
        let c = self.counters.clone();
        c.in_flight
            .store(self.flights.len() as u64, Ordering::Relaxed);
        if let Some(shared) = &self.shared
            && !done.is_empty()
        {
            // Done replaces this host's claim (or, without one, is written create-if-absent):
            // the first record of an id wins, a later write fails and changes nothing. Written
            // before the acks leave.
            let writes = async {
                let mut acks = Vec::with_capacity(done.len());
                for (id, d, claim) in &done {
                    let mut h = async_nats::HeaderMap::new();
                    h.insert(
                        "Nats-Expected-Last-Subject-Sequence",
                        claim.to_string().as_str(),
                    );
                    if let Ok(ack) = shared
                        .js
                        .publish_with_headers(shared.subject(id), h, format!("{d:016x}").into())
                        .await
                    {
                        acks.push(ack);
                    }
                }
                for ack in acks {
                    let _ = std::future::IntoFuture::into_future(ack).await;
                }
            };
            let _ = tokio::time::timeout(ACKS_WAIT, writes).await;
        }
        if !out.is_empty() {
            self.window.persist(&ran_ids);
            c.window.store(self.window.len() as u64, Ordering::Relaxed);
            let acks = async {
                for (m, ran) in &out {
                    if *ran {
                        if m.ack().await.is_ok() {
                            c.acked.fetch_add(1, Ordering::AcqRel);
                        }
                    } else {
                        c.retried.fetch_add(1, Ordering::AcqRel);
                        self.nak_gives_up(m);
                        let _ = m.ack_with(jetstream::AckKind::Nak(Some(RETRY_DELAY))).await;
                    }
                }
            };
            // With the server gone the client holds the acks until it reconnects; what is
            // not acked is delivered again (and recognized by its id).
            let _ = tokio::time::timeout(ACKS_WAIT, acks).await;
        }
        let now = Instant::now();
        let progress = async {
            for f in self.flights.values_mut() {
                if now.duration_since(f.last) >= PROGRESS_EVERY {
                    f.last = now;
                    let _ = f.msg.ack_with(jetstream::AckKind::Progress).await;
                }
            }
        };
        let _ = tokio::time::timeout(ACKS_WAIT, progress).await;
    }

    /// Stopping: waits (until the deadline `stop` was given) for what is in flight to
    /// settle, acks it, naks the rest (delivered again at once), flushes.
    pub(super) async fn finish(&mut self, js: &jetstream::Context) {
        let until = *self.drain_until.lock().unwrap_or_else(|e| e.into_inner());
        let until = until.unwrap_or_else(Instant::now);
        while !self.flights.is_empty() && Instant::now() < until {
            let notify = self.notify.clone();
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            self.settle().await;
        }
        let left: Vec<Flight> = self.flights.drain().map(|(_, f)| f).collect();
        self.flying.clear();
        self.counters.in_flight.store(0, Ordering::Relaxed);
        let naks = async {
            for f in &left {
                self.nak_gives_up(&f.msg);
                let _ = f.msg.ack_with(jetstream::AckKind::Nak(None)).await;
            }
            let _ = js.client().flush().await;
        };
        let _ = tokio::time::timeout(ACKS_WAIT, naks).await;
    }

    /// The stream the durable consumer reads: given, or the one holding the subject.
    pub(super) async fn stream_name(&self, js: &jetstream::Context) -> Result<String, String> {
        match &self.opts.stream {
            Some(name) => Ok(name.clone()),
            None => js
                .stream_by_subject(self.opts.subject.clone())
                .await
                .map_err(|e| {
                    format!(
                        "no stream holds the subject ({e}); give --from-nats-stream or create one"
                    )
                }),
        }
    }

    pub(super) async fn durable_consumer(
        &self,
        js: &jetstream::Context,
        durable: &str,
    ) -> Result<(PullConsumer, String), String> {
        let name = self.stream_name(js).await?;
        self.pull_consumer(js, &name, durable, self.opts.subject.clone())
            .await
            .map(|c| (c, name))
    }

    /// Partition `k`'s durable consumer, `<durable>-<k>`, on its partition's subjects.
    pub(super) async fn partition_consumer(
        &self,
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        k: u32,
    ) -> Result<PullConsumer, String> {
        let filter = wire::partition_filter(&self.opts.subject, k);
        self.pull_consumer(js, stream, &format!("{durable}-{k}"), filter)
            .await
    }

    pub(super) async fn pull_consumer(
        &self,
        js: &jetstream::Context,
        stream: &str,
        durable: &str,
        filter: String,
    ) -> Result<PullConsumer, String> {
        let stream = js
            .get_stream(stream)
            .await
            .map_err(|e| format!("stream {stream:?}: {e}"))?;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.to_string()),
            filter_subject: filter,
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(10),
            max_ack_pending: (4 * BATCH) as i64,
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            max_deliver: self.opts.max_deliver as i64,
            ..Default::default()
        };
        stream
            .get_or_create_consumer(durable, config)
            .await
            .map_err(|e| e.to_string())
    }
}
