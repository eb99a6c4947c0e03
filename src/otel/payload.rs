//! An event's payload read back for the span builder: its members borrowed from the message's
//! JSON (keys and raw values, one allocation), values decoded only when a span needs them.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// The members of a payload object, in order; empty when the payload is not an object.
#[derive(Default)]
pub(crate) struct Payload<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

/// A JSON string, borrowed when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for Payload<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Payload<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Payload<'de>, A::Error> {
                let mut v = Vec::with_capacity(m.size_hint().unwrap_or(4));
                while let Some((k, raw)) = m.next_entry::<Text<'de>, &'de RawValue>()? {
                    v.push((k.0, raw));
                }
                Ok(Payload(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// A raw JSON value as text: strings decoded, anything else as its (compact) JSON.
pub(crate) fn raw_text(raw: &RawValue) -> Cow<'_, str> {
    let t = raw.get();
    if t.starts_with('"') {
        serde_json::from_str::<Text>(t).map_or(Cow::Borrowed(""), |s| s.0)
    } else {
        Cow::Borrowed(t)
    }
}

impl<'a> Payload<'a> {
    pub(crate) fn parse(json: &'a [u8]) -> Payload<'a> {
        serde_json::from_slice(json).unwrap_or_default()
    }

    pub(crate) fn raw(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// A string member ("" when absent or not a string).
    pub(crate) fn str(&self, key: &str) -> Cow<'a, str> {
        self.str_opt(key).unwrap_or(Cow::Borrowed(""))
    }

    pub(crate) fn str_opt(&self, key: &str) -> Option<Cow<'a, str>> {
        let raw = self.raw(key)?.get();
        raw.starts_with('"')
            .then(|| serde_json::from_str::<Text>(raw).ok().map(|t| t.0))
            .flatten()
    }

    pub(crate) fn bool(&self, key: &str) -> Option<bool> {
        match self.raw(key)?.get() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    pub(crate) fn int(&self, key: &str) -> Option<i64> {
        self.raw(key)?.get().parse().ok()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &'a RawValue)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_ref(), *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_read_borrowed_and_decoded_on_demand() {
        let p = Payload::parse(br#"{"tool":"sh\"ell","success":false,"n":42,"args":{"a":[1]}}"#);
        assert_eq!(p.str("tool"), "sh\"ell");
        assert_eq!(p.bool("success"), Some(false));
        assert_eq!(p.int("n"), Some(42));
        assert_eq!(p.str("n"), "");
        assert_eq!(raw_text(p.raw("args").unwrap()), r#"{"a":[1]}"#);
        assert_eq!(p.iter().count(), 4);
        assert_eq!(Payload::parse(b"[1]").iter().count(), 0);
    }
}
