//! One message checked and handed to the pipeline: headers, body, de-duplication, and the
//! emitter of its agent and session (ARCHITECTURE.md § NATS bridge).

use super::*;

/// What one message's handling came to: its fate, and the id it was handed over under (with
/// its digest).
pub(super) type Handled = (Fate, Option<(String, u64)>);

/// A message's agent, session, origin, and the agent's `Prx-Timestamp` and `Prx-Seq`.
type Identity = (
    String,
    String,
    Option<String>,
    (Option<String>, Option<u64>),
);

/// A message's headers, checked: what the hooks and the relay learn from them.
struct Checked {
    kind: crate::EventKind,
    id: Option<String>,
    /// The id as logs show it.
    shown: String,
    hops: u32,
    agent: String,
    session: String,
    origin: Option<String>,
    /// The agent's `Prx-Timestamp` and `Prx-Seq`.
    origin_time: (Option<String>, Option<u64>),
}

impl Worker {
    /// Everything that happens to one message; the id it was handed over under.
    ///
    /// `ticket`: JetStream's key for this message; its hooks report under it when they have
    /// settled it, and its id enters the window only then (`settle`). Without one (core NATS)
    /// the id enters the window at hand-off.
    pub(super) fn handle(&mut self, m: &Incoming<'_>, ticket: Option<u64>) -> Handled {
        let c = self.counters.clone();
        c.received.fetch_add(1, Ordering::AcqRel);
        let h = match self.check_headers(m) {
            Ok(h) => h,
            Err(refused) => return refused,
        };
        let record = match self.parse_body(m, &h) {
            Ok(r) => r,
            Err(refused) => return refused,
        };
        // De-dup on what the event is (its event, agent, session and payload as the bus will
        // carry it), so that a relayed copy, re-serialized, is still recognized.
        let digest = digest(h.kind, &h.agent, &h.session, &record.payload_json());
        if let Some(seen) = self.seen_before(m, &h, ticket, digest) {
            return seen;
        }
        let max = self.feed.max_event_bytes;
        if record.byte_len() > max {
            return self.refuse(
                &c.refused_oversize,
                format_args!(
                    "NATS consumer: {} ({}): refused: event of {} bytes exceeds max_event_bytes ({})",
                    m.subject,
                    wire::encode_value(&h.shown),
                    record.byte_len(),
                    max
                ),
            );
        }
        self.hand_over(m, h, &record, ticket, digest)
    }

    /// A refusal: counted on `counter`, said (at most once a second), terminated.
    fn refuse(&mut self, counter: &AtomicU64, why: std::fmt::Arguments<'_>) -> Handled {
        counter.fetch_add(1, Ordering::AcqRel);
        self.said.warn(why);
        (Fate::Refused, None)
    }

    /// The subject and headers, checked and decoded; a refusal (or our own message skipped)
    /// as `Err`.
    fn check_headers(&mut self, m: &Incoming<'_>) -> Result<Checked, Handled> {
        let c = self.counters.clone();
        let Some(kind) = wire::event_of_subject(m.subject) else {
            return Err(self.refuse(
                &c.refused_subject,
                format_args!(
                    "NATS consumer: {}: refused: the subject does not end in prx.lifecycle.<event>",
                    m.subject
                ),
            ));
        };
        if m.header(wire::ORIGIN) == Some(wire::instance_id()) {
            c.own.fetch_add(1, Ordering::AcqRel);
            return Err((Fate::Skip, None));
        }
        let id = m.header(wire::MSG_ID).map(str::to_string);
        let shown = id.as_deref().unwrap_or("no Nats-Msg-Id").to_string();
        // Relayed from bridge to bridge too often: a loop between relays (or a forgery).
        let hops = match m.header(wire::HOPS).map(|h| h.trim().parse::<u32>()) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                return Err(self.refuse(
                    &c.refused_headers,
                    format_args!(
                        "NATS consumer: {} ({}): refused: Prx-Hops {:?} is not a number",
                        m.subject,
                        wire::encode_value(&shown),
                        wire::encode_value(m.header(wire::HOPS).unwrap_or(""))
                    ),
                ));
            }
        };
        if hops >= wire::MAX_HOPS {
            return Err(self.refuse(
                &c.loops,
                format_args!(
                    "NATS consumer: {} ({}): refused: relayed {hops} times (the limit is {}): relays publish to each other's subjects in a loop",
                    m.subject,
                    wire::encode_value(&shown),
                    wire::MAX_HOPS
                ),
            ));
        }
        if let Some(e) = m.header(wire::EVENT)
            && e != kind.name()
        {
            return Err(self.refuse(
                &c.refused_headers,
                format_args!(
                    "NATS consumer: {} ({}): refused: Prx-Event {:?} disagrees with the subject",
                    m.subject,
                    wire::encode_value(&shown),
                    wire::encode_value(e)
                ),
            ));
        }
        if let Some(id) = &id
            && let Err(why) = wire::check_identity("Nats-Msg-Id", id)
        {
            return Err(self.refuse(
                &c.refused_headers,
                format_args!("NATS consumer: {}: refused: {why}", m.subject),
            ));
        }
        let (agent, session, origin, origin_time) = self.identity(m, &shown)?;
        Ok(Checked {
            kind,
            id,
            shown,
            hops,
            agent,
            session,
            origin,
            origin_time,
        })
    }

    /// The agent, session and origin headers decoded and checked, and the agent's timestamp
    /// and seq; a refusal as `Err`.
    fn identity(&mut self, m: &Incoming<'_>, shown: &str) -> Result<Identity, Handled> {
        let c = self.counters.clone();
        // Decoded and checked: the agent and session become hook variables, the origin is
        // relayed.
        let ident = |header: &str| -> Result<Option<String>, String> {
            match m.header(header) {
                None => Ok(None),
                Some(v) => {
                    let v = wire::decode_value(v);
                    wire::check_identity(header, &v)?;
                    Ok(Some(v.into_owned()))
                }
            }
        };
        let identity = ident(wire::AGENT).and_then(|a| {
            let s = ident(wire::SESSION)?;
            Ok((
                a.unwrap_or_else(|| wire::DEFAULT_AGENT.into()),
                s.unwrap_or_else(|| wire::DEFAULT_SESSION.into()),
                ident(wire::ORIGIN)?,
            ))
        });
        // The agent's own time and numbering, for the hooks beside this host's.
        let origin_time = m
            .header(wire::TIMESTAMP)
            .map(wire::check_timestamp)
            .transpose()
            .and_then(|t| {
                let n = m.header(wire::SEQ).map(wire::parse_seq).transpose()?;
                Ok((t.map(str::to_string), n))
            });
        let identity = identity.and_then(|(a, s, o)| Ok((a, s, o, origin_time?)));
        let (agent, session, origin, origin_time) = match identity {
            Ok(pair) => pair,
            Err(why) => {
                return Err(self.refuse(
                    &c.refused_headers,
                    format_args!(
                        "NATS consumer: {} ({}): refused: {why}",
                        m.subject,
                        wire::encode_value(shown)
                    ),
                ));
            }
        };
        Ok((agent, session, origin, origin_time))
    }

    /// The body, parsed as a payload of the subject's event.
    fn parse_body(&mut self, m: &Incoming<'_>, h: &Checked) -> Result<ndjson::Record, Handled> {
        let c = self.counters.clone();
        let kind = h.kind;
        let record = std::str::from_utf8(m.payload)
            .map_err(|e| format!("the body is not UTF-8 (byte {})", e.valid_up_to()))
            .and_then(|text| {
                ndjson::parse_payload_with(kind, text.trim(), &h.agent, &h.session, self.opts.parse)
                    .map_err(|e| format!("body:{e}"))
            });
        record.map_err(|why| {
            self.refuse(
                &c.refused_body,
                format_args!(
                    "NATS consumer: {} ({}): refused: not a valid {kind} payload: {why}",
                    m.subject,
                    wire::encode_value(&h.shown)
                ),
            )
        })
    }

    /// Whether the message was handed over before: still in flight (JetStream), or run here
    /// or on a host sharing the bucket; `None` when it is to be handed over.
    fn seen_before(
        &mut self,
        m: &Incoming<'_>,
        h: &Checked,
        ticket: Option<u64>,
        digest: u64,
    ) -> Option<Handled> {
        let c = self.counters.clone();
        let (id, shown) = (&h.id, &h.shown);
        // A redelivery of a message whose hooks still run (JetStream's ack wait passed, or
        // an in-progress ack was lost): it is acked with the first when they settle.
        if ticket.is_some()
            && let Some(id) = id
            && let Some(&k) = self.flying.get(id)
            && self
                .flights
                .get(&k)
                .is_some_and(|f| f.id.as_ref().is_some_and(|(_, d)| *d == digest))
        {
            c.duplicates.fetch_add(1, Ordering::AcqRel);
            return Some((Fate::InFlight(k), None));
        }
        let shared_ran = self.shared_digest.take() == Some(digest);
        match id {
            // Ran on a host sharing the bucket (this one included).
            Some(_) if shared_ran => {
                c.duplicates.fetch_add(1, Ordering::AcqRel);
                c.shared_duplicates.fetch_add(1, Ordering::AcqRel);
                return Some((Fate::Skip, None));
            }
            Some(id) => match self.window.seen(id, digest) {
                Seen::Same => {
                    c.duplicates.fetch_add(1, Ordering::AcqRel);
                    return Some((Fate::Skip, None));
                }
                // The id of an event handed over, with another body, agent or session: not
                // a retry. Processed (a forger pre-sending ids must not suppress real
                // events), counted, said.
                Seen::Other => {
                    c.id_conflicts.fetch_add(1, Ordering::AcqRel);
                    self.said.warn(format_args!(
                        "NATS consumer: {} ({}): the id of an event handed over before, with another body: handled as a new event",
                        m.subject,
                        wire::encode_value(shown)
                    ));
                }
                Seen::No => {}
            },
            None => {
                c.without_id.fetch_add(1, Ordering::AcqRel);
            }
        }
        None
    }

    /// Emits the event (waiting while the ring is full) with what its message carries to the
    /// hooks, and its relay record.
    fn hand_over(
        &mut self,
        m: &Incoming<'_>,
        h: Checked,
        record: &ndjson::Record,
        ticket: Option<u64>,
        digest: u64,
    ) -> Handled {
        let c = self.counters.clone();
        let Checked {
            kind,
            id,
            hops,
            agent,
            session,
            origin,
            origin_time,
            ..
        } = h;
        // Relaying: the id the publisher will send (one of ours when the message had none,
        // remembered in the window so that it is recognized if it comes back).
        let relay_id = match (&id, self.feed.relays.is_some()) {
            (Some(id), _) => Some(id.clone()),
            (None, true) => {
                self.made_ids += 1;
                Some(format!("{}-r{}", wire::instance_id(), self.made_ids))
            }
            (None, false) => None,
        };
        let relays = self.feed.relays.clone();
        let (emitter, next_seq) = self.emitter(&agent, &session);
        if let (Some(relays), Some(rid)) = (&relays, &relay_id)
            && relays.wants(kind)
        {
            relays.insert(
                emitter.relay_id(),
                next_seq,
                super::super::relay::Relayed {
                    origin: origin
                        .clone()
                        .unwrap_or_else(|| wire::instance_id().to_string()),
                    id: rid.clone(),
                    hops,
                },
            );
        }
        // What the message of this event carries to the hooks: the agent's time and
        // numbering, the event's id and delivery count (what makes a hook's effect happen
        // once), and the ticket its hooks report through (`crate::settle`).
        let attached = ticket.is_some()
            || relay_id.is_some()
            || origin_time.0.is_some()
            || origin_time.1.is_some();
        if attached {
            self.feed.attachments().insert(
                emitter.relay_id(),
                next_seq,
                crate::settle::Attached::new(
                    origin_time.0,
                    origin_time.1,
                    ticket.map(|k| crate::settle::Ticket::new(k, self.settled.clone())),
                )
                .with_delivery(relay_id.clone(), m.delivery, m.reclaimed)
                .with_fence(m.fence.clone())
                .with_start(m.start.clone()),
            );
        }
        if let Some(refused) = self.emit_waiting(m, &emitter, next_seq, record, &agent, &session) {
            return refused;
        }
        c.consumed.fetch_add(1, Ordering::AcqRel);
        let id = relay_id.or(id);
        if let Some(id) = &id
            && ticket.is_none()
        {
            self.window.insert(id, digest);
            c.window.store(self.window.len() as u64, Ordering::Relaxed);
        }
        (Fate::Handed, id.map(|id| (id, digest)))
    }

    /// Emits the record through `emitter`, waiting while the ring is full; `None` once it is
    /// queued (or skipped: nobody listens), else what became of the message (refused, or
    /// later: the pipeline is closing).
    fn emit_waiting(
        &mut self,
        m: &Incoming<'_>,
        emitter: &crate::Emitter,
        next_seq: u64,
        record: &ndjson::Record,
        agent: &str,
        session: &str,
    ) -> Option<Handled> {
        let c = self.counters.clone();
        // Not emitted after all: the attachment is taken back (a ticket then reports `ran`
        // for a skipped event, `dropped` for one not handed over — ignored, it is nak'ed).
        let take_back = |this: &Self, dropped: bool| {
            if let Some(a) = this.feed.attachments().take(emitter.relay_id(), next_seq) {
                if dropped {
                    a.mark_dropped();
                }
                drop(a);
            }
        };
        loop {
            let emitted = if record.has_extras() {
                match emitter.emit_with_extras(record.event(), &record.extras()) {
                    Ok(e) => e,
                    Err(e) => {
                        take_back(self, true);
                        return Some(self.refuse(
                            &c.refused_body,
                            format_args!("NATS consumer: {}: refused: {e}", m.subject),
                        ));
                    }
                }
            } else {
                emitter.emit(record.event())
            };
            match emitted {
                Emit::Queued | Emit::Skipped if !self.feed.closed() => {
                    if emitted == Emit::Skipped {
                        c.skipped.fetch_add(1, Ordering::AcqRel);
                        take_back(self, false);
                    } else if let Some(e) = self
                        .emitters
                        .get_mut(&(agent.to_string(), session.to_string()))
                    {
                        // The worker numbers this emitter's queued events 0, 1, 2…
                        e.1 += 1;
                    }
                    return None;
                }
                // The ring was full after all (another producer): wait, never drop.
                _ if self.stopping() || self.feed.closed() => {
                    take_back(self, true);
                    return Some((Fate::Later, None));
                }
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }

    /// The emitter for (agent, session), and the `seq` its next queued event gets.
    pub(super) fn emitter(&mut self, agent: &str, session: &str) -> (crate::Emitter, u64) {
        let key = (agent.to_string(), session.to_string());
        if let Some((e, next)) = self.emitters.get(&key) {
            return (e.clone(), *next);
        }
        if self.emitters.len() >= MAX_EMITTERS
            && let Some(old) = self.emitter_order.pop_front()
        {
            self.emitters.remove(&old);
        }
        let e = self.feed.emitter(agent, session);
        self.emitters.insert(key.clone(), (e.clone(), 0));
        self.emitter_order.push_back(key);
        (e, 0)
    }
}
