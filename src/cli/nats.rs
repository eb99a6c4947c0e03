//! `prx-hooks run --nats …` / `run --from-nats …` and `bench --nats URL`: the CLI side of the
//! NATS bridge (docs/nats.md § NATS). Kept apart from the rest of the command line so the flags,
//! the builder wiring and the bench live in one place.

use clap::Args;
use prx_hooks::nats::{ConsumeOptions, NatsOptions, PublishOptions};
use prx_hooks::{Emitter, Event, Hooks, HooksBuilder, Stats};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The NATS flags of `run`.
#[derive(Args, Default)]
pub struct NatsArgs {
    /// Publish bus messages to the NATS server(s) at URL (`nats://host:4222`, `tls://…`,
    /// `nats://user:pass@host`, comma-separated for several). Credentials are never logged.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// Publish under PREFIX: subjects become PREFIX.prx.lifecycle.<event>.
    #[arg(long, value_name = "PREFIX", requires = "nats")]
    pub nats_prefix: Option<String>,
    /// Which bus messages to publish, in the BUS's pattern syntax (a topic, PREFIX.* for
    /// anything below it, or *) — not NATS's. Default prx.lifecycle.*.
    #[arg(long, value_name = "PATTERN", requires = "nats")]
    pub nats_pattern: Option<String>,
    /// JetStream stream: with --nats, the stream to publish to, waiting for its acks
    /// (at-least-once; created if missing) — also when --from-nats is given; without --nats,
    /// the stream --from-nats --durable reads (as --from-nats-stream).
    #[arg(long, value_name = "NAME")]
    pub nats_stream: Option<String>,
    /// The stream --from-nats --durable reads (default: the one holding --subject).
    #[arg(long, value_name = "NAME", requires = "from_nats")]
    pub from_nats_stream: Option<String>,
    /// A durable consumer this creates gives up on a message after N deliveries (counted as
    /// given_up): a message this client cannot parse stalls it for at most N × 10 s.
    #[arg(
        long,
        value_name = "N",
        requires = "from_nats",
        default_value_t = prx_hooks::nats::DEFAULT_MAX_DELIVER
    )]
    pub nats_max_deliver: u32,
    /// Messages held while the server is unreachable (then dropped and counted).
    #[arg(long, value_name = "N", requires = "nats")]
    pub nats_buffer: Option<usize>,
    /// Consume events from the NATS server(s) at URL and run this workspace's hooks and
    /// plugins for them (runs until SIGINT/SIGTERM).
    #[arg(long, value_name = "URL")]
    pub from_nats: Option<String>,
    /// The subjects to consume, in NATS's syntax (`*` one token, `>` the rest).
    #[arg(
        long,
        value_name = "SUBJECT",
        requires = "from_nats",
        default_value = "prx.lifecycle.>"
    )]
    pub subject: String,
    /// Consume through a JetStream durable pull consumer of this name (acks, redelivery,
    /// back-pressure without loss; remembered across restarts).
    #[arg(long, value_name = "NAME", requires = "from_nats")]
    pub durable: Option<String>,
    /// Core NATS: join this queue group, so that consumers sharing it split the events (each
    /// to one of them; no order or de-dup across them).
    #[arg(
        long,
        value_name = "NAME",
        requires = "from_nats",
        conflicts_with = "durable"
    )]
    pub queue: Option<String>,
    /// With --durable: share what ran with the other hosts of the durable consumer in this
    /// JetStream key-value bucket (created if missing), so a redelivery to another host is
    /// recognized too.
    #[arg(long, value_name = "BUCKET", requires = "durable")]
    pub nats_dedup_bucket: Option<String>,
    /// Per-agent order across hosts: with --nats, lifecycle subjects get a last token, the
    /// agent's partition among N (`p<k>`: docs/nats.md § Per-agent order across hosts gives
    /// the function); with --durable, the hosts
    /// sharing the durable consumer split the N partitions between them through leases, one
    /// host per partition at a time (docs/nats.md § Per-agent order across hosts).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=prx_hooks::nats::wire::MAX_PARTITIONS as i64))]
    pub nats_partitions: Option<u32>,
    /// Message ids remembered to skip duplicates.
    #[arg(
        long,
        value_name = "N",
        requires = "from_nats",
        default_value_t = 100_000
    )]
    pub nats_dedup_ids: usize,
    /// How long a message id is remembered (`1h`, `30m`, seconds).
    #[arg(long, value_name = "DURATION", requires = "from_nats", default_value = "1h", value_parser = crate::parse_duration)]
    pub nats_dedup_age: Duration,
    /// A NATS credentials file (.creds: user JWT + nkey seed, as nsc writes it).
    #[arg(long, value_name = "FILE")]
    pub nats_creds: Option<PathBuf>,
    /// Require TLS (implied by tls:// URLs and the options below).
    #[arg(long)]
    pub nats_tls: bool,
    /// CA certificate(s) (PEM) to verify the server with.
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) to authenticate with (needs --nats-tls-key).
    #[arg(long, value_name = "FILE", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
    /// Consume from a server beyond this machine even without credentials (anyone who can
    /// publish to it can then run this host's hooks).
    #[arg(long, requires = "from_nats")]
    pub nats_insecure: bool,
}

impl NatsArgs {
    pub fn publishes(&self) -> bool {
        self.nats.is_some()
    }

    /// `run` keeps going after the end of `--events` while it consumes.
    pub fn consumes(&self) -> bool {
        self.from_nats.is_some()
    }

    fn connection(&self, url: &str) -> NatsOptions {
        let mut o = NatsOptions::new(url).require_tls(self.nats_tls);
        if let Some(c) = &self.nats_creds {
            o = o.creds_file(c);
        }
        if let Some(ca) = &self.nats_tls_ca {
            o = o.tls_ca(ca);
        }
        if let (Some(c), Some(k)) = (&self.nats_tls_cert, &self.nats_tls_key) {
            o = o.tls_client_cert(c, k);
        }
        o
    }

    /// Adds the publisher and the consumer to the builder. The consumer's de-dup window is
    /// kept in `<workspace>/.prx-hooks/nats-dedup/<durable or core>.<subject>`.
    pub fn apply(
        &self,
        mut builder: HooksBuilder,
        workspace: &Path,
        lenient: bool,
    ) -> Result<HooksBuilder, BoxError> {
        if let Some(url) = &self.nats {
            let mut p = PublishOptions::new(self.connection(url));
            if let Some(prefix) = &self.nats_prefix {
                p = p.prefix(prefix);
            }
            if let Some(pattern) = &self.nats_pattern {
                p = p.pattern(pattern);
            }
            if let Some(stream) = &self.nats_stream {
                p = p.stream(stream);
            }
            if let Some(n) = self.nats_buffer {
                p = p.buffer(n);
            }
            if let Some(n) = self.nats_partitions {
                p = p.partitions(n);
            }
            builder = builder.nats_publish(p);
        }
        if let Some(url) = &self.from_nats {
            let mut c = ConsumeOptions::new(self.connection(url).insecure(self.nats_insecure))
                .subject(&self.subject)
                .dedup_window(self.nats_dedup_ids, self.nats_dedup_age)
                .dedup_file(dedup_file(
                    workspace,
                    self.durable.as_deref(),
                    &self.subject,
                ));
            if lenient {
                c = c.parse_options(prx_hooks::ndjson::ParseOptions::lenient());
            }
            if let Some(d) = &self.durable {
                c = c.durable(d);
            }
            if let Some(q) = &self.queue {
                c = c.queue(q);
            }
            if let Some(b) = &self.nats_dedup_bucket {
                c = c.shared_dedup(b);
            }
            if let (Some(n), Some(_)) = (self.nats_partitions, &self.durable) {
                c = c.partitions(n);
            }
            c = c.max_deliver(self.nats_max_deliver);
            // --nats-stream is the publisher's when there is one (docs/nats.md § NATS, flags).
            match (&self.from_nats_stream, &self.nats_stream, &self.nats) {
                (Some(s), _, _) => c = c.stream(s),
                (None, Some(s), None) => c = c.stream(s),
                // Not `eprintln!`: it panics when stderr is closed.
                (None, Some(s), Some(_)) if self.durable.is_some() => {
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "prx-hooks: --nats-stream {s} is the stream published to (with --nats); the durable consumer reads the stream holding {} (give --from-nats-stream NAME to name it)",
                        self.subject
                    );
                }
                _ => {}
            }
            builder = builder.nats_consume(c);
        }
        Ok(builder)
    }
}

/// `<workspace>/.prx-hooks/nats-dedup/<durable|core>.<subject, * and > spelled out>`.
fn dedup_file(workspace: &Path, durable: Option<&str>, subject: &str) -> PathBuf {
    let subject: String = subject
        .split('.')
        .map(|t| match t {
            "*" => "star",
            ">" => "rest",
            t => t,
        })
        .collect::<Vec<_>>()
        .join(".");
    workspace
        .join(".prx-hooks")
        .join("nats-dedup")
        .join(format!("{}.{subject}", durable.unwrap_or("core")))
}

/// The publisher has nothing left to send or confirm.
pub fn idle(stats: &Stats) -> bool {
    stats
        .nats()
        .and_then(|n| n.publish.as_ref())
        .is_none_or(|p| p.buffered == 0)
}

/// At the end of the input, how long `run` waits at least for the publisher to flush (it may
/// be reconnecting): 10 s, unless `--drain-timeout` says otherwise.
pub const PUBLISH_DRAIN: Duration = Duration::from_secs(10);

/// `bench --nats URL`: events/s through the bridge to the server, and `emit`'s cost with the
/// bridge off and on, side by side in one run.
#[derive(serde::Serialize)]
pub struct NatsBench {
    pub server: String,
    pub stream: Option<String>,
    pub events: u64,
    pub payload_bytes: usize,
    /// Paced emits (the rings never fill), each timed: without a bridge (a bus subscriber
    /// reads the events) and with one.
    pub emit_ns_bridge_off: Percentiles,
    pub emit_ns_bridge_on: Percentiles,
    /// Every event confirmed by the server (core: echoed; JetStream: acked), from the first
    /// emit to the last confirmation.
    pub bridge_events_per_s: f64,
    pub bridge_elapsed_s: f64,
    pub published: u64,
    pub dropped: u64,
    /// The same events read back by a NATS subscriber of this bench (core NATS only).
    pub subscriber_received: Option<u64>,
    /// The same number of messages (same subject, body and headers) from a plain async-nats
    /// publisher on the same server in the same run, confirmed the same way (core: a flush
    /// and a round trip; JetStream: every ack, 4,096 in flight): what the client library
    /// can do here, beside what the bridge did.
    pub raw_events_per_s: f64,
    pub timer_overhead_ns: u64,
}

#[derive(serde::Serialize)]
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub max: u64,
}

fn percentiles(mut v: Vec<u64>, overhead: u64) -> Percentiles {
    v.sort_unstable();
    let pick = |q: f64| {
        let i = ((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1));
        v.get(i).map_or(0, |s| s.saturating_sub(overhead))
    };
    Percentiles {
        p50: pick(0.5),
        p99: pick(0.99),
        p99_9: pick(0.999),
        max: pick(1.0),
    }
}

/// Emits `n` tool_call events, each timed, pacing every 256 (untimed) so that no ring and no
/// subscription (the bridge's buffer is one) is more than half full: nothing may drop, and
/// the rate measured is the bridge's sustained one.
fn timed_emits(hooks: &Hooks, em: &Emitter, n: u64, output: &str) -> Vec<u64> {
    let event = Event::ToolCall {
        tool: "bench",
        success: true,
        output,
    };
    let mut samples = Vec::with_capacity(n as usize);
    for i in 0..n {
        if i.is_multiple_of(256) {
            while hooks.pending() > hooks.capacity() / 4
                || hooks
                    .bus()
                    .subscribers()
                    .iter()
                    .any(|s| s.queued > s.capacity / 2)
            {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let t = Instant::now();
        em.emit(event);
        samples.push(t.elapsed().as_nanos() as u64);
    }
    samples
}

pub fn bench(
    url: &str,
    stream: Option<&str>,
    events: u64,
    payload_bytes: usize,
    overhead: u64,
) -> Result<NatsBench, BoxError> {
    let output = "x".repeat(payload_bytes);
    // Bridge off: a bus subscriber reads everything (the pipeline does the same work up to
    // the bus either way).
    let off = {
        let hooks = Hooks::builder().build()?;
        let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
        let reader = std::thread::spawn(move || sub.iter().count());
        let em = hooks.emitter("bench", "off");
        let samples = timed_emits(&hooks, &em, events, &output);
        hooks.shutdown(Duration::from_secs(2));
        let _ = reader.join();
        samples
    };
    // A subscriber on the server counts what arrives (core NATS: what the bridge published).
    let received = Arc::new(AtomicU64::new(0));
    // Its own runtime, driving the subscriber's connection all along (a client nobody reads
    // from makes the server stall the publisher).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = if stream.is_none() {
        let client = rt.block_on(async_nats::connect(strip_userinfo(url)))?;
        let mut sub = rt.block_on(client.subscribe("prx.lifecycle.>"))?;
        rt.block_on(client.flush())?;
        let received = received.clone();
        Some(rt.spawn(async move {
            use futures_util::StreamExt;
            while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(3), sub.next()).await {
                received.fetch_add(1, Ordering::Relaxed);
            }
            drop(client);
        }))
    } else {
        None
    };
    let mut p = PublishOptions::new(NatsOptions::new(url));
    if let Some(s) = stream {
        p = p.stream(s);
    }
    let hooks = Hooks::builder().nats_publish(p).build()?;
    let em = hooks.emitter("bench", "on");
    let start = Instant::now();
    let on = timed_emits(&hooks, &em, events, &output);
    let mut last = (0, Instant::now());
    let end = loop {
        let s = hooks.stats();
        let p = s.nats().and_then(|n| n.publish.clone()).unwrap_or_default();
        if p.published + p.failed + p.dropped >= events {
            break Instant::now();
        }
        if p.published != last.0 {
            last = (p.published, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(30) {
            break last.1;
        }
        std::thread::sleep(Duration::from_micros(500));
    };
    let stats = hooks.stats();
    hooks.shutdown(Duration::from_secs(5));
    let p = stats
        .nats()
        .and_then(|n| n.publish.clone())
        .unwrap_or_default();
    let subscriber_received = listener.map(|h| {
        let _ = rt.block_on(h);
        received.load(Ordering::Relaxed)
    });
    let raw_events_per_s = raw_publisher(&rt, url, stream, events, &output)?;
    drop(rt);
    let elapsed = end.duration_since(start).as_secs_f64();
    Ok(NatsBench {
        server: prx_hooks::nats::redact_url(url),
        stream: stream.map(str::to_string),
        events,
        payload_bytes,
        emit_ns_bridge_off: percentiles(off, overhead),
        emit_ns_bridge_on: percentiles(on, overhead),
        bridge_events_per_s: p.published as f64 / elapsed.max(1e-9),
        bridge_elapsed_s: elapsed,
        published: p.published,
        dropped: p.dropped + p.dropped_shutdown,
        subscriber_received,
        raw_events_per_s,
        timer_overhead_ns: overhead,
    })
}

/// A plain async-nats publisher sending `events` messages like the bridge's (subject, headers,
/// body): events/s until the server confirmed the last (core: flush, then a request through
/// the server; JetStream: acks awaited with up to 4,096 in flight).
fn raw_publisher(
    rt: &tokio::runtime::Runtime,
    url: &str,
    stream: Option<&str>,
    events: u64,
    output: &str,
) -> Result<f64, BoxError> {
    let body = bytes_body(output);
    rt.block_on(async {
        let client = async_nats::connect(strip_userinfo(url)).await?;
        let headers = |i: u64| {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Prx-Event", "tool_call");
            h.insert("Prx-Agent", "bench");
            h.insert("Prx-Session", "raw");
            h.insert("Prx-Seq", i.to_string().as_str());
            h.insert("Prx-Timestamp", "2026-01-01T00:00:00.000000Z");
            h.insert("Prx-Origin", "0000000000000000");
            h.insert(
                "Nats-Msg-Id",
                format!("raw-{}-{i}", std::process::id()).as_str(),
            );
            h
        };
        let subject = "prx.lifecycle.tool_call";
        let start = Instant::now();
        match stream {
            None => {
                for i in 0..events {
                    client
                        .publish_with_headers(subject, headers(i), body.clone().into())
                        .await?;
                }
                client.flush().await?;
                // A round trip through the server: everything before it was processed.
                let inbox = client.new_inbox();
                let mut sub = client.subscribe(inbox.clone()).await?;
                client.publish(inbox, "".into()).await?;
                use futures_util::StreamExt;
                let _ = tokio::time::timeout(Duration::from_secs(30), sub.next()).await;
            }
            Some(_) => {
                let js = async_nats::jetstream::new(client.clone());
                let mut acks = std::collections::VecDeque::new();
                for i in 0..events {
                    if acks.len() >= 4096
                        && let Some(ack) = acks.pop_front()
                    {
                        let _ = std::future::IntoFuture::into_future(ack).await;
                    }
                    acks.push_back(
                        js.publish_with_headers(subject, headers(i), body.clone().into())
                            .await?,
                    );
                }
                for ack in acks {
                    let _ = std::future::IntoFuture::into_future(ack).await;
                }
            }
        }
        Ok(events as f64 / start.elapsed().as_secs_f64().max(1e-9))
    })
}

/// The bench's body, as the bridge sends it: the payload JSON of its events.
fn bytes_body(output: &str) -> String {
    Event::ToolCall {
        tool: "bench",
        success: true,
        output,
    }
    .to_json()
}

/// The bench's own subscriber connects without the URL's credentials in its address.
fn strip_userinfo(url: &str) -> String {
    url.split(',')
        .next()
        .map(|u| match u.split_once("://") {
            Some((s, r)) => format!("{s}://{}", r.rsplit_once('@').map_or(r, |(_, h)| h)),
            None => u.rsplit_once('@').map_or(u, |(_, h)| h).to_string(),
        })
        .unwrap_or_default()
}

pub fn print_bench(b: &NatsBench) {
    out!(
        "{} events, {}-byte payloads, NATS {}{}",
        b.events,
        b.payload_bytes,
        b.server,
        b.stream
            .as_ref()
            .map(|s| format!(" (JetStream stream {s}, acks)"))
            .unwrap_or_else(|| " (core NATS)".into())
    );
    out!(
        "  emit latency, ns ({} ns timer overhead subtracted):",
        b.timer_overhead_ns
    );
    out!("                  p50     p99   p99.9     max");
    for (name, p) in [
        ("bridge off", &b.emit_ns_bridge_off),
        ("bridge on ", &b.emit_ns_bridge_on),
    ] {
        out!(
            "    {name}  {:>7} {:>7} {:>7} {:>7}",
            p.p50,
            p.p99,
            p.p99_9,
            p.max
        );
    }
    out!(
        "  through the bridge  {:.0} events/s ({} confirmed in {:.3} s, {} dropped)",
        b.bridge_events_per_s,
        b.published,
        b.bridge_elapsed_s,
        b.dropped
    );
    if let Some(n) = b.subscriber_received {
        out!("  read back by a NATS subscriber  {n}");
    }
    out!(
        "  a raw async-nats publisher, same messages, same server  {:.0} events/s (the bridge: {:.2}x)",
        b.raw_events_per_s,
        b.bridge_events_per_s / b.raw_events_per_s.max(1e-9)
    );
}
