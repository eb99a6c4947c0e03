//! Building OTLP spans: attribute values, bounded strings, extras as `prx.extra.*`, ids, times.

use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{Span, Status, status::StatusCode};
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) type TraceId = [u8; 16];
pub(crate) type SpanId = [u8; 8];

/// The prefix of extra fields' attributes.
pub(crate) const EXTRA_PREFIX: &str = "prx.extra.";

/// Random ids: a splitmix64 sequence seeded once from getrandom (ids need to be unique, not
/// secret; W3C trace context asks for randomness in trace ids, which this gives).
pub(crate) struct Ids(u64);

impl Ids {
    pub(crate) fn new() -> Ids {
        let mut seed = [0u8; 8];
        if getrandom::fill(&mut seed).is_err() {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            seed = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_le_bytes();
        }
        Ids(u64::from_le_bytes(seed))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        match z ^ (z >> 31) {
            0 => 1,
            n => n,
        }
    }

    pub(crate) fn trace(&mut self) -> TraceId {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next().to_be_bytes());
        id[8..].copy_from_slice(&self.next().to_be_bytes());
        id
    }

    pub(crate) fn span(&mut self) -> SpanId {
        self.next().to_be_bytes()
    }
}

pub(crate) fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

/// `s` cut to at most `max` bytes at a character boundary, with `…` when cut.
pub(crate) fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

pub(crate) fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

pub(crate) fn s(v: &str) -> Value {
    Value::StringValue(v.to_string())
}

pub(crate) fn i(v: i64) -> Value {
    Value::IntValue(v)
}

/// Sets `key` on the span, replacing a value set before.
pub(crate) fn set(span: &mut Span, key: &str, value: Value) {
    if let Some(a) = span.attributes.iter_mut().find(|a| a.key == key) {
        a.value = Some(AnyValue { value: Some(value) });
    } else {
        span.attributes.push(kv(key, value));
    }
}

pub(crate) fn new_span(
    name: String,
    kind: SpanKind,
    trace: TraceId,
    id: SpanId,
    parent: Option<SpanId>,
    start: u64,
) -> Span {
    Span {
        trace_id: trace.to_vec(),
        span_id: id.to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name,
        kind: kind as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start,
        ..Default::default()
    }
}

pub(crate) fn set_error(span: &mut Span, error_type: &str, message: &str) {
    span.status = Some(Status {
        message: message.to_string(),
        code: StatusCode::Error as i32,
    });
    set(span, "error.type", s(error_type));
}

pub(crate) fn event(span: &mut Span, name: &str, time: u64, attributes: Vec<KeyValue>) {
    span.events.push(Event {
        time_unix_nano: time,
        name: name.to_string(),
        attributes,
        dropped_attributes_count: 0,
    });
}

/// The extra fields of a payload (members that are not the event's documented fields) as
/// `prx.extra.<name>` attributes: at most `max` of them, strings and nested JSON bounded to
/// `max_bytes`. Returns how many were left out.
pub(crate) fn extras(
    span: &mut Span,
    payload: &super::payload::Payload<'_>,
    documented: &[&str],
    max: usize,
    max_bytes: usize,
) -> u32 {
    let mut left_out = 0;
    let mut n = 0;
    for (k, raw) in payload.iter() {
        if documented.contains(&k) {
            continue;
        }
        if n == max {
            left_out += 1;
            continue;
        }
        n += 1;
        let t = raw.get();
        let value = match t.as_bytes().first() {
            Some(b't') => Value::BoolValue(true),
            Some(b'f') => Value::BoolValue(false),
            Some(b'-' | b'0'..=b'9') => match t.parse::<i64>() {
                Ok(i) => Value::IntValue(i),
                Err(_) => Value::DoubleValue(t.parse().unwrap_or(f64::NAN)),
            },
            _ => Value::StringValue(bounded(&super::payload::raw_text(raw), max_bytes)),
        };
        set(span, &format!("{EXTRA_PREFIX}{}", bounded(k, 128)), value);
    }
    span.dropped_attributes_count += left_out;
    left_out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_at_a_character_boundary_and_marks_the_cut() {
        assert_eq!(bounded("short", 10), "short");
        let cut = bounded("ééééé", 6);
        assert!(cut.len() <= 6 && cut.ends_with('…'), "{cut}");
    }

    #[test]
    fn ids_are_nonzero_and_distinct() {
        let mut ids = Ids::new();
        let a = ids.span();
        let b = ids.span();
        assert_ne!(a, b);
        assert_ne!(a, [0; 8]);
        assert_ne!(ids.trace(), ids.trace());
    }

    #[test]
    fn extras_are_prefixed_typed_and_bounded() {
        let mut span = Span::default();
        let json = br#"{"tool":"t","cwd":"/p","n":3,"ok":true,"obj":{"a":[1,2]},"long":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;
        let payload = super::super::payload::Payload::parse(json);
        let left = extras(&mut span, &payload, &["tool"], 4, 16);
        assert_eq!(left, 1);
        let keys: Vec<_> = span.attributes.iter().map(|a| a.key.as_str()).collect();
        assert!(keys.iter().all(|k| k.starts_with(EXTRA_PREFIX)), "{keys:?}");
        assert!(!keys.contains(&"prx.extra.tool"));
        assert_eq!(span.attributes.len(), 4);
    }
}
