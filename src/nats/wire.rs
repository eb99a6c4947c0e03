//! The wire format (docs/nats.md § NATS, "Wire format"): subjects, headers, message ids, and the
//! checks the consumer makes before a header value becomes a hook's environment variable.
//!
//! * subject: the bus topic, after an optional prefix (`fleet.prx.lifecycle.tool_call`);
//! * body: the payload JSON exactly as on the bus ([`Message::json`](crate::Message::json));
//! * headers: `Prx-Event`, `Prx-Agent`, `Prx-Session`, `Prx-Seq`, `Prx-Timestamp` (RFC 3339,
//!   UTC, microseconds), `Prx-Origin` (the first publishing process's instance id: a relay
//!   keeps it), `Prx-Hops` (only on a relayed message: how many bridges relayed it) and
//!   `Nats-Msg-Id` = `<instance>-<n>`: 16 random hex digits drawn once per process, then the
//!   publisher's own counter. Unique per event, the same on every retry, and different after a
//!   restart — so JetStream's duplicate window never swallows a new process's events. A relay
//!   keeps the id it consumed.
//!
//! Header values cannot hold CR or LF (they would end the header), so the publisher
//! percent-encodes `%`, every control character and a leading or trailing space; the
//! consumer decodes them and then refuses control characters (NUL included) and values over
//! [`MAX_HEADER_VALUE`] bytes.

use crate::event::EventKind;
use std::borrow::Cow;
use std::sync::OnceLock;

/// The event (`tool_call`); absent for custom topics.
pub const EVENT: &str = "Prx-Event";
/// The emitter's agent, percent-encoded.
pub const AGENT: &str = "Prx-Agent";
/// The emitter's session, percent-encoded.
pub const SESSION: &str = "Prx-Session";
/// The emitter's sequence number.
pub const SEQ: &str = "Prx-Seq";
/// When the agent host took the event: RFC 3339, UTC, microseconds.
pub const TIMESTAMP: &str = "Prx-Timestamp";
/// The first publishing process's instance id.
pub const ORIGIN: &str = "Prx-Origin";
/// How many bridges relayed the message (only on a relayed one).
pub const HOPS: &str = "Prx-Hops";
/// The message id JetStream de-duplicates on, and consumers too.
pub const MSG_ID: &str = "Nats-Msg-Id";

/// A consumer refuses (and counts as `loops`) a message whose `Prx-Hops` is this or more: it
/// has been relayed from one bridge to the next this many times.
pub const MAX_HOPS: u32 = 8;

/// Longest agent or session a consumer accepts from a header (bytes, after decoding): the
/// limit every input has ([`ndjson::MAX_NAME_BYTES`](crate::ndjson::MAX_NAME_BYTES), 256).
pub const MAX_HEADER_VALUE: usize = crate::ndjson::MAX_NAME_BYTES;

/// The agent and session of a consumed message that has no `Prx-Agent` / `Prx-Session`.
pub const DEFAULT_AGENT: &str = "nats";
/// The session of a consumed message that has no `Prx-Session`.
pub const DEFAULT_SESSION: &str = "nats";

/// The subjects every lifecycle event is published under (before a prefix).
pub const LIFECYCLE_SUBJECTS: &str = "prx.lifecycle.>";

/// This process's instance id: 16 lowercase hex digits from getrandom, drawn on first use.
/// Every publisher of the process puts it in `Prx-Origin` and in its message ids; every
/// consumer skips messages that carry it (a process never consumes what it published).
pub fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let mut bytes = [0u8; 8];
        if getrandom::fill(&mut bytes).is_err() {
            // No entropy source (never on Linux ≥ 3.17): time and pid still differ per run.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            bytes = (t ^ ((std::process::id() as u64) << 40)).to_le_bytes();
        }
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    })
}

/// `<instance>-<n>`.
pub fn message_id(instance: &str, n: u64) -> String {
    format!("{instance}-{n}")
}

/// A header value as the publisher writes it: `%`, control characters and a leading or
/// trailing space percent-encoded, everything else (UTF-8 included) as is.
pub fn encode_value(value: &str) -> Cow<'_, str> {
    let last = value.len().saturating_sub(1);
    let needs = |i: usize, b: u8| {
        b < 0x20 || b == 0x7f || b == b'%' || (b == b' ' && (i == 0 || i == last))
    };
    if !value.bytes().enumerate().any(|(i, b)| needs(i, b)) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 8);
    for (i, c) in value.char_indices() {
        if c.is_ascii() && needs(i, c as u8) {
            out.push_str(&format!("%{:02X}", c as u8));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Decodes `%XX` (a `%` not followed by two hex digits is kept as is).
pub fn decode_value(value: &str) -> Cow<'_, str> {
    if !value.contains('%') {
        return Cow::Borrowed(value);
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Checks a `Prx-Timestamp` before it becomes `ZERO_HOOK_ORIGIN_TIMESTAMP`: RFC 3339 in UTC
/// (`2026-11-29T22:16:48.123456Z`: a `Z`, no offset, at most nanoseconds), as
/// [`check_identity`] otherwise. Returns it as given.
pub fn check_timestamp(value: &str) -> Result<&str, String> {
    check_identity(TIMESTAMP, value)?;
    let b = value.as_bytes();
    let shape = b.len() >= 20
        && b.len() <= 30
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[b.len() - 1] == b'Z'
        && (b.len() == 20 || (b[19] == b'.' && b.len() > 21))
        && b.iter().enumerate().all(|(i, c)| {
            matches!(i, 4 | 7 | 10 | 13 | 16 | 19) || i == b.len() - 1 || c.is_ascii_digit()
        });
    if !shape || humantime::parse_rfc3339(value).is_err() {
        return Err(format!(
            "{TIMESTAMP} {:?} is not an RFC 3339 UTC time (2026-11-29T22:16:48.123456Z)",
            encode_value(value)
        ));
    }
    Ok(value)
}

/// Reads a `Prx-Seq` before it becomes `ZERO_HOOK_ORIGIN_SEQ`: decimal digits only, a `u64`.
pub fn parse_seq(value: &str) -> Result<u64, String> {
    let digits =
        !value.is_empty() && value.len() <= 20 && value.bytes().all(|c| c.is_ascii_digit());
    match value.parse::<u64>() {
        Ok(n) if digits => Ok(n),
        _ => Err(format!(
            "{SEQ} {:?} is not a decimal sequence number",
            encode_value(value)
        )),
    }
}

/// JetStream's delivery count of a message, from the ack subject it came with (JetStream's
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
/// the form with a domain and an account hash before the stream and a token after): decimal
/// digits of a `u64`, at least 1, as [`parse_seq`] reads them. What a hook sees as
/// `ZERO_HOOK_DELIVERY`; `Err` says what is wrong with the subject.
pub fn delivery_of_ack_subject(reply: &str) -> Result<u64, String> {
    let tokens: Vec<&str> = reply.split('.').collect();
    let at = match (tokens.len(), tokens.first(), tokens.get(1)) {
        (9, Some(&"$JS"), Some(&"ACK")) => 4,
        (n, Some(&"$JS"), Some(&"ACK")) if n >= 12 => 6,
        _ => {
            return Err(format!(
                "the reply subject {:?} is not a JetStream ack subject",
                encode_value(reply)
            ));
        }
    };
    match parse_seq(tokens[at]) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "the delivery count {:?} of {:?} is not a number of at least 1",
            encode_value(tokens[at]),
            encode_value(reply)
        )),
    }
}

/// [`delivery_of_ack_subject`] of a pulled message; `None` (said at debug level) when its
/// reply subject is not one.
pub(crate) fn delivery(m: &async_nats::jetstream::Message) -> Option<u64> {
    let reply = m.reply.as_ref()?;
    delivery_of_ack_subject(reply.as_str())
        .map_err(|e| tracing::debug!("NATS consumer: {e}"))
        .ok()
}

/// Checks a decoded agent or session before it becomes `ZERO_HOOK_AGENT` / `…_SESSION`:
/// not empty, at most [`MAX_HEADER_VALUE`] bytes, no control character (NUL, CR, LF, ESC…),
/// no U+FFFD (what invalid UTF-8 decodes to). The reason says what is wrong.
pub fn check_identity(name: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("{name} is empty"));
    }
    if value.len() > MAX_HEADER_VALUE {
        return Err(format!(
            "{name} is {} bytes; the limit is {MAX_HEADER_VALUE}",
            value.len()
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control() || *c == '\u{fffd}') {
        return Err(format!(
            "{name} holds {}",
            match c {
                '\0' => "a NUL byte".to_string(),
                '\u{fffd}' => "invalid UTF-8".to_string(),
                c => format!("the control character {:?}", c),
            }
        ));
    }
    Ok(())
}

/// Checks a subject prefix (`fleet`, `eu.fleet-7`): dot-separated tokens of `A-Z a-z 0-9 _ -`.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    check_tokens(prefix, false)
}

/// Checks a NATS subject filter (`prx.lifecycle.>`, `*.prx.lifecycle.tool_call`): tokens of
/// `A-Z a-z 0-9 _ -`, or `*`, or a final `>`.
pub fn check_filter(filter: &str) -> Result<(), String> {
    check_tokens(filter, true)
}

fn check_tokens(s: &str, wildcards: bool) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".into());
    }
    if s.len() > 256 {
        return Err(format!("it is {} bytes; the limit is 256", s.len()));
    }
    let n = s.split('.').count();
    for (i, token) in s.split('.').enumerate() {
        if token.is_empty() {
            return Err(format!("token {} is empty", i + 1));
        }
        if wildcards && (token == "*" || (token == ">" && i + 1 == n)) {
            continue;
        }
        if token == ">" {
            return Err(if wildcards {
                "\">\" may only be the last token".into()
            } else {
                "wildcards are not allowed here".into()
            });
        }
        if let Some(c) = token
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(format!("character {c:?} is not allowed"));
        }
    }
    Ok(())
}

/// The subject a bus topic is published under.
pub fn subject(prefix: Option<&str>, topic: &str) -> String {
    match prefix {
        Some(p) => format!("{p}.{topic}"),
        None => topic.to_string(),
    }
}

/// The NATS filter matching every subject a bus pattern publishes to: `*` → `>`,
/// `prx.lifecycle.*` → `prx.lifecycle.>` (a bus prefix pattern matches any depth), an exact
/// topic → itself; under the prefix.
pub fn pattern_filter(prefix: Option<&str>, pattern: &str) -> String {
    let filter = match pattern {
        "*" => ">".to_string(),
        p => match p.strip_suffix(".*") {
            Some(stem) => format!("{stem}.>"),
            None => p.to_string(),
        },
    };
    subject(prefix, &filter)
}

/// Whether some subject matches both NATS filters.
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let (mut a, mut b) = (a.split('.'), b.split('.'));
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(x), Some(y)) if x == "*" || y == "*" || x == y => continue,
            _ => return false,
        }
    }
}

/// The lifecycle event a subject carries: its last three tokens are `prx.lifecycle.<event>`,
/// or those and a partition token (`prx.lifecycle.tool_call.p3`, [`partition_token`]; the
/// earlier format's bare number, `prx.lifecycle.tool_call.3`, is read past too).
pub fn event_of_subject(subject: &str) -> Option<EventKind> {
    let mut tokens = subject.rsplit('.');
    let mut event = tokens.next()?;
    let number = event.strip_prefix('p').unwrap_or(event);
    // Any partition a u32 names (10 digits), not only those up to MAX_PARTITIONS: another
    // publisher may use more.
    if !number.is_empty() && number.len() <= 10 && number.bytes().all(|b| b.is_ascii_digit()) {
        event = tokens.next()?;
    }
    (tokens.next()? == "lifecycle" && tokens.next()? == "prx")
        .then(|| EventKind::from_name(event))
        .flatten()
}

/// The most partitions a publisher or a consumer of this crate uses
/// ([`PublishOptions::partitions`](super::PublishOptions::partitions) and
/// [`ConsumeOptions::partitions`](super::ConsumeOptions::partitions) take at most this many;
/// `--nats-partitions` refuses more): each partition is a durable consumer and a lease.
pub const MAX_PARTITIONS: u32 = 1024;

/// An agent's partition among `n` (the last subject token with partitions, as
/// [`partition_token`]): the 64-bit FNV-1a of the agent's name as UTF-8 (decoded, as hooks see
/// it), mixed by MurmurHash3's 64-bit finalizer (`fmix64`), then scaled to `n` by its high
/// bits: `(h × n) >> 64`. What another language's publisher computes to publish into the same
/// partitions.
///
/// # Examples
///
/// ```
/// use prx_hooks::nats::wire::partition;
/// // Names differing only in their last letter spread over the partitions.
/// let ks: Vec<u32> = ["worker-a", "worker-i", "worker-q", "worker-y"]
///     .iter()
///     .map(|a| partition(a, 8))
///     .collect();
/// assert_eq!(ks, [6, 2, 5, 7]);
/// assert_eq!(partition("anything", 1), 0);
/// ```
pub fn partition(agent: &str, n: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in agent.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // fmix64: every input bit reaches every output bit, the high ones included.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    ((h as u128 * n.max(1) as u128) >> 64) as u32
}

/// The last subject token of partition `k`: `p<k>` (`prx.lifecycle.tool_call.p3`). The `p`
/// marks the partition function of [`partition`]; the earlier format (a bare number, FNV-1a
/// modulo `n`) is never read by a partitioned consumer of this one, nor this one by it.
pub fn partition_token(k: u32) -> String {
    format!("p{k}")
}

/// Whether a subject ends in the earlier format's partition token (a bare number after
/// `prx.lifecycle.<event>`): published by a version whose partitioned consumers this one
/// does not share a stream with.
pub fn earlier_partition_format(subject: &str) -> bool {
    let mut tokens = subject.rsplit('.');
    let last = tokens.next().unwrap_or("");
    !last.is_empty()
        && last.bytes().all(|b| b.is_ascii_digit())
        && tokens
            .next()
            .is_some_and(|e| EventKind::from_name(e).is_some())
        && tokens.next() == Some("lifecycle")
        && tokens.next() == Some("prx")
}

/// The subject filter of partition `k` of a consumer's filter: `prx.lifecycle.>` →
/// `prx.lifecycle.*.p<k>`, `prx.lifecycle.tool_call` → `prx.lifecycle.tool_call.p<k>`.
pub fn partition_filter(filter: &str, k: u32) -> String {
    match filter.strip_suffix('>') {
        Some(head) => format!("{head}*.{}", partition_token(k)),
        None => format!("{filter}.{}", partition_token(k)),
    }
}

/// The subject filter matching every partition of a consumer's filter, of either format
/// (`prx.lifecycle.>` → `prx.lifecycle.*.*`).
pub fn partitions_filter(filter: &str) -> String {
    match filter.strip_suffix('>') {
        Some(head) => format!("{head}*.*"),
        None => format!("{filter}.*"),
    }
}

/// Whether a consumer's filter can be partitioned: it ends in `prx.lifecycle.>`,
/// `prx.lifecycle.*` or `prx.lifecycle.<event>`.
pub fn partitionable(filter: &str) -> bool {
    let mut t = filter.rsplit('.');
    let last = t.next().unwrap_or("");
    (last == ">" || last == "*" || EventKind::from_name(last).is_some())
        && t.next() == Some("lifecycle")
        && t.next() == Some("prx")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn partitions_are_a_last_token_that_consumers_read_past() {
        assert_eq!(
            event_of_subject("prx.lifecycle.tool_call.3"),
            Some(EventKind::ToolCall)
        );
        assert_eq!(
            event_of_subject("fleet.prx.lifecycle.tool_call"),
            Some(EventKind::ToolCall)
        );
        assert_eq!(event_of_subject("prx.lifecycle.3"), None);
        assert_eq!(
            event_of_subject("prx.lifecycle.tool_call.p3"),
            Some(EventKind::ToolCall)
        );
        assert_eq!(event_of_subject("prx.lifecycle.p3"), None);
        // Every partition a u32 names is read past, not only four digits' worth.
        for k in [9_999, 10_000, MAX_PARTITIONS, u32::MAX] {
            let subject = format!("prx.lifecycle.error.{}", partition_token(k));
            assert_eq!(
                event_of_subject(&subject),
                Some(EventKind::Error),
                "{subject}"
            );
        }
        assert_eq!(event_of_subject("prx.lifecycle.error.p12345678901"), None);
        assert_eq!(partition("", 1), 0);
        assert_eq!(partition_filter("prx.lifecycle.>", 2), "prx.lifecycle.*.p2");
        assert_eq!(
            partition_filter("prx.lifecycle.tool_call", 0),
            "prx.lifecycle.tool_call.p0"
        );
        assert_eq!(
            partitions_filter("a.prx.lifecycle.>"),
            "a.prx.lifecycle.*.*"
        );
        assert!(earlier_partition_format("a.prx.lifecycle.tool_call.3"));
        assert!(!earlier_partition_format("prx.lifecycle.tool_call.p3"));
        assert!(!earlier_partition_format("prx.lifecycle.tool_call"));
        assert!(partitionable("a.prx.lifecycle.>") && partitionable("prx.lifecycle.error"));
        assert!(!partitionable("prx.>") && !partitionable(">"));
    }

    #[test]
    fn the_partition_function_is_fixed_and_names_differing_in_a_last_letter_spread() {
        // FNV-1a 64 then fmix64, high bits scaled to n: values another language's publisher
        // must reproduce.
        let fnv = |s: &str| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &b in s.as_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h
        };
        assert_eq!(fnv("a"), 0xaf63_dc4c_8601_ec8c);
        let fmix = |mut h: u64| {
            h ^= h >> 33;
            h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
            h ^= h >> 33;
            h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
            h ^ (h >> 33)
        };
        for name in ["", "a", "worker-a", "agent-17"] {
            for n in [1u32, 8, 64, 1000, 1 << 31] {
                let want = ((fmix(fnv(name)) as u128 * n as u128) >> 64) as u32;
                assert_eq!(partition(name, n), want, "{name} {n}");
            }
        }
        // Golden values, computed by an independent implementation (Python's arbitrary
        // precision integers): a change of the function fails here, not in a fleet.
        let golden: [(&str, [u32; 3]); 8] = [
            ("", [7, 59, 959]),
            ("a", [4, 32, 522]),
            ("worker-a", [6, 52, 845]),
            ("worker-i", [2, 20, 322]),
            ("worker-q", [5, 44, 709]),
            ("worker-y", [7, 57, 925]),
            ("agent-17", [0, 5, 93]),
            ("h\u{e9}llo", [6, 48, 774]),
        ];
        for (name, want) in golden {
            let got = [8, 64, 1024].map(|n| partition(name, n));
            assert_eq!(got, want, "{name:?}");
        }
        // FNV-1a modulo 8 put these four on one partition: their last bytes differ only
        // above the low three bits.
        let names = ["worker-a", "worker-i", "worker-q", "worker-y"];
        let old: HashSet<u64> = names.iter().map(|a| fnv(a) % 8).collect();
        assert_eq!(old.len(), 1, "the earlier function's collision");
        let new: HashSet<u32> = names.iter().map(|a| partition(a, 8)).collect();
        assert!(new.len() >= 3, "{:?}", names.map(|a| partition(a, 8)));
        // 64 agents `agent-<i>` over 8 partitions: none empty, none with more than twice
        // its share.
        let mut per = [0usize; 8];
        for i in 0..64 {
            per[partition(&format!("agent-{i}"), 8) as usize] += 1;
        }
        assert!(per.iter().all(|&c| (1..=16).contains(&c)), "{per:?}");
    }

    #[test]
    fn origin_timestamps_and_seqs_are_checked_strictly() {
        for ok in [
            "2026-11-29T22:16:48.123456Z",
            "2020-01-01T00:00:00Z",
            "2020-01-01T00:00:00.1Z",
            "2020-01-01T00:00:00.123456789Z",
        ] {
            assert_eq!(check_timestamp(ok), Ok(ok));
        }
        for bad in [
            "",
            "yesterday",
            "2020-01-01 00:00:00Z",
            "2020-01-01T00:00:00+01:00",
            "2020-01-01T00:00:00.Z",
            "2020-13-01T00:00:00Z",
            "2020-01-01T25:00:00Z",
            "2020-01-01T00:00:00\nZ",
            "2020-01-01T00:00:00.1234567890Z",
            " 2020-01-01T00:00:00Z",
        ] {
            assert!(check_timestamp(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_seq("0"), Ok(0));
        assert_eq!(parse_seq("2499"), Ok(2499));
        assert_eq!(parse_seq("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            "-1",
            "+1",
            " 1",
            "1.0",
            "0x10",
            "18446744073709551616",
            "1e3",
        ] {
            assert!(parse_seq(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn delivery_counts_are_read_from_either_form_of_ack_subject_and_checked() {
        assert_eq!(
            delivery_of_ack_subject("$JS.ACK.FLEET.central.2.10.9.1733450000000000000.0"),
            Ok(2)
        );
        assert_eq!(
            delivery_of_ack_subject("$JS.ACK.dom.ACCHASH.FLEET.central-3.1.10.9.17334.0.r4nd"),
            Ok(1)
        );
        for bad in [
            "",
            "_INBOX.abc",
            "$JS.ACK.FLEET.central.0.10.9.1.0",
            "$JS.ACK.FLEET.central.-1.10.9.1.0",
            "$JS.ACK.FLEET.central.1e3.10.9.1.0",
            "$JS.ACK.FLEET.central.99999999999999999999.10.9.1.0",
            "$JS.ACK.FLEET.central.1.10.9.1",
            "$JS.NAK.FLEET.central.1.10.9.1.0",
        ] {
            assert!(delivery_of_ack_subject(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_round_trip_and_never_hold_cr_or_lf() {
        for v in [
            "agent-7",
            "é ü ✓",
            "a\r\nPrx-Agent: forged",
            "100%",
            " padded ",
            "tab\there",
            "nul\0",
            "%zz",
            "%",
        ] {
            let enc = encode_value(v);
            assert!(!enc.contains(['\r', '\n', '\0']), "{enc:?}");
            assert!(!enc.starts_with(' ') && !enc.ends_with(' '), "{enc:?}");
            assert_eq!(decode_value(&enc), v, "{v:?} → {enc:?}");
        }
        assert_eq!(encode_value("plain"), Cow::Borrowed("plain"));
    }

    #[test]
    fn identities_are_checked() {
        assert!(check_identity("agent", "build-bot é").is_ok());
        for (v, why) in [
            ("", "empty"),
            ("a\0b", "NUL"),
            ("a\nb", "control"),
            ("a\u{1b}[31m", "control"),
            ("bad \u{fffd}", "UTF-8"),
        ] {
            let e = check_identity("agent", v).unwrap_err();
            assert!(e.contains(why), "{v:?}: {e}");
        }
        let long = "x".repeat(MAX_HEADER_VALUE + 1);
        assert!(
            check_identity("agent", &long)
                .unwrap_err()
                .contains("257 bytes")
        );
        // A decoded value is what is checked: an encoded NUL is refused too.
        assert!(check_identity("agent", &decode_value("a%00b")).is_err());
    }

    #[test]
    fn filters_and_overlap() {
        assert_eq!(pattern_filter(None, "prx.lifecycle.*"), "prx.lifecycle.>");
        assert_eq!(pattern_filter(Some("eu"), "*"), "eu.>");
        assert_eq!(
            pattern_filter(Some("eu"), "prx.lifecycle.tool_call"),
            "eu.prx.lifecycle.tool_call"
        );
        let yes = [
            ("prx.lifecycle.>", "prx.lifecycle.>"),
            ("prx.lifecycle.>", "prx.lifecycle.tool_call"),
            ("*.prx.lifecycle.>", "eu.prx.lifecycle.error"),
            (">", "anything.at.all"),
            ("prx.*.tool_call", "prx.lifecycle.>"),
        ];
        for (a, b) in yes {
            assert!(filters_overlap(a, b) && filters_overlap(b, a), "{a} {b}");
        }
        let no = [
            ("prx.lifecycle.>", "eu.prx.lifecycle.>"),
            ("prx.lifecycle.>", "prx.lifecycle"),
            ("prx.lifecycle.error", "prx.lifecycle.tool_call"),
            ("a.*", "a.b.c"),
        ];
        for (a, b) in no {
            assert!(!filters_overlap(a, b) && !filters_overlap(b, a), "{a} {b}");
        }
    }

    #[test]
    fn subjects_name_their_event() {
        assert_eq!(
            event_of_subject("prx.lifecycle.tool_call"),
            Some(EventKind::ToolCall)
        );
        assert_eq!(
            event_of_subject("eu.fleet.prx.lifecycle.error"),
            Some(EventKind::Error)
        );
        for s in [
            "prx.lifecycle.nope",
            "lifecycle.error",
            "error",
            "x.lifecycle.error",
        ] {
            assert_eq!(event_of_subject(s), None, "{s}");
        }
        assert!(check_filter("prx.lifecycle.>").is_ok());
        assert!(check_filter("*.prx.lifecycle.*").is_ok());
        assert!(check_filter("prx.>.x").is_err());
        assert!(check_filter("prx..x").is_err());
        assert!(check_prefix("eu.fleet-1").is_ok());
        assert!(check_prefix("eu.*").is_err());
        assert!(check_prefix("a b").is_err());
    }

    #[test]
    fn instance_ids_are_16_hex_digits() {
        let id = instance_id();
        assert_eq!(id.len(), 16);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(instance_id(), id);
        assert_eq!(message_id(id, 42), format!("{id}-42"));
    }
}
