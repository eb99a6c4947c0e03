//! Reading an agent's payload: its members as raw JSON text, in order, each with its place in
//! the input (for errors), and the values a mapping takes from them.

use super::TranslateError;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// A JSON object's members in order, values as raw text.
pub(crate) struct Members<'a>(pub Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

/// Line and column (1-based, columns in characters) of byte `pos` of `text`.
pub(crate) fn place(text: &str, pos: usize) -> (usize, usize) {
    crate::text::line_col(text, pos)
}

/// One payload of an agent's hook: its text, its top-level members and the event it names.
pub(crate) struct Payload<'a> {
    pub(crate) text: &'a str,
    pub(crate) members: Vec<(Cow<'a, str>, &'a RawValue)>,
    /// The agent's name for the event (`PostToolUse`).
    pub(crate) event: String,
}

impl<'a> Payload<'a> {
    /// Where `raw` (a value of this payload) starts: line and column.
    pub(crate) fn place_of(&self, raw: &RawValue) -> (usize, usize) {
        let pos = (raw.get().as_ptr() as usize).saturating_sub(self.text.as_ptr() as usize);
        place(self.text, pos)
    }

    /// An error at `raw`'s place.
    pub(crate) fn error_at(
        &self,
        raw: &RawValue,
        path: &str,
        reason: impl Into<String>,
    ) -> TranslateError {
        let (l, c) = self.place_of(raw);
        TranslateError::at(l, c, path, reason)
    }

    /// The top-level member `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.members
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }

    /// Whether the top-level member `name` is present.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The value at `path` (`["llm_request", "model"]`): members of nested objects.
    pub(crate) fn at(&self, path: &[&str]) -> Option<&'a RawValue> {
        let (first, rest) = path.split_first()?;
        let mut raw = self.get(first)?;
        for name in rest {
            raw = object(raw)?
                .into_iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v)?;
        }
        Some(raw)
    }

    /// The string at `path`, decoded; `None` when absent or not a string.
    pub(crate) fn str_at(&self, path: &[&str]) -> Option<String> {
        self.at(path).and_then(string)
    }

    /// The boolean at `path`.
    pub(crate) fn bool_at(&self, path: &[&str]) -> Option<bool> {
        match self.at(path)?.get() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    /// The non-negative integer at `path` (`12`, not `1.5` or `-1`).
    pub(crate) fn count_at(&self, path: &[&str]) -> Option<u64> {
        self.at(path)?.get().parse().ok()
    }

    /// The number at `path`, as the agent wrote it.
    pub(crate) fn number_at(&self, path: &[&str]) -> Option<&'a str> {
        let raw = self.at(path)?.get();
        serde_json::from_str::<serde_json::Number>(raw)
            .is_ok()
            .then_some(raw)
    }

    /// A documented string field from the value at `path`: the string as the agent wrote it
    /// (escapes kept), or the JSON text of any other value as a string; `None` when absent.
    pub(crate) fn text_at(&self, path: &[&str]) -> Option<String> {
        self.at(path).map(text)
    }

    /// [`Payload::text_at`] of a member the event needs: its absence is an error.
    pub(crate) fn text(&self, member: &str, field: &str) -> Result<String, TranslateError> {
        self.get(member)
            .map(text)
            .ok_or_else(|| missing(member, field))
    }

    /// A documented JSON field (`arguments`): the value at `path` as it is.
    pub(crate) fn json_at(&self, path: &[&str]) -> Option<String> {
        self.at(path).map(|raw| raw.get().to_string())
    }

    /// [`Payload::json_at`] of a member the event needs.
    pub(crate) fn json(&self, member: &str, field: &str) -> Result<String, TranslateError> {
        self.json_at(&[member])
            .ok_or_else(|| missing(member, field))
    }

    /// A tool's name: the string at `path` (a member the event needs); anything else, or a
    /// string that is not valid Unicode, is an error at its place.
    pub(crate) fn tool_at(&self, path: &[&str]) -> Result<String, TranslateError> {
        let name = path.join(".");
        let raw = self.at(path).ok_or_else(|| missing(&name, "tool"))?;
        if !raw.get().starts_with('"') {
            return Err(self.error_at(
                raw,
                &name,
                format!("expected a string, found {}", shown(raw.get())),
            ));
        }
        if serde_json::from_str::<String>(raw.get()).is_err() {
            return Err(self.error_at(raw, &name, "not a valid string"));
        }
        Ok(raw.get().to_string())
    }

    /// The number of elements of the array at `path`.
    pub(crate) fn len_at(&self, path: &[&str]) -> Option<usize> {
        serde_json::from_str::<Vec<&RawValue>>(self.at(path)?.get())
            .ok()
            .map(|v| v.len())
    }

    /// The elements of the array at `path`.
    pub(crate) fn array_at(&self, path: &[&str]) -> Vec<&'a RawValue> {
        self.at(path)
            .and_then(|raw| serde_json::from_str::<Vec<&'a RawValue>>(raw.get()).ok())
            .unwrap_or_default()
    }

    /// The time at `path` as RFC 3339 in UTC (`2026-12-07T10:00:00.5Z`): an RFC 3339 string
    /// (any offset) or a number of milliseconds since the Unix epoch. Anything else: `None`.
    pub(crate) fn time_at(&self, path: &[&str]) -> Option<String> {
        let raw = self.at(path)?;
        match string(raw) {
            Some(s) => rfc3339_utc(&s),
            None => {
                let ms: u64 = raw.get().parse().ok()?;
                // Years 1970 to 9999.
                if ms == 0 || ms >= 253_402_300_800_000 {
                    return None;
                }
                let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                Some(humantime::format_rfc3339_millis(t).to_string())
            }
        }
    }
}

/// An object's members (`None` when `raw` is not an object).
pub(crate) fn object<'a>(raw: &'a RawValue) -> Option<Vec<(Cow<'a, str>, &'a RawValue)>> {
    serde_json::from_str::<Members<'a>>(raw.get())
        .ok()
        .map(|m| m.0)
}

/// A string value, decoded.
pub(crate) fn string(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

/// A string field's JSON: a string as written, any other value's text as a string.
fn text(raw: &RawValue) -> String {
    if raw.get().starts_with('"') {
        raw.get().to_string()
    } else {
        quote(raw.get())
    }
}

/// "missing" for a member the event's `field` is made of.
pub(crate) fn missing(member: &str, field: &str) -> TranslateError {
    TranslateError::at(
        1,
        1,
        member,
        format!("missing (it becomes the event's {field})"),
    )
}

/// `time` in UTC with a `Z`: as given when it is so already, converted from another offset.
fn rfc3339_utc(time: &str) -> Option<String> {
    let t = time.trim();
    if t.len() < 20 || !t.is_ascii() || t.as_bytes()[10] != b'T' {
        return None;
    }
    if t.ends_with('Z') {
        return humantime::parse_rfc3339(t).is_ok().then(|| t.to_string());
    }
    // `±HH:MM` at the end.
    let (local, offset) = t.split_at(t.len() - 6);
    let o = offset.as_bytes();
    let sign = match o[0] {
        b'+' => 1i64,
        b'-' => -1,
        _ => return None,
    };
    if o[3] != b':' {
        return None;
    }
    let hours: i64 = offset[1..3].parse().ok()?;
    let minutes: i64 = offset[4..6].parse().ok()?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    let at = humantime::parse_rfc3339(&format!("{local}Z")).ok()?;
    let shift = std::time::Duration::from_secs(((hours * 60 + minutes) * 60) as u64);
    let utc = if sign > 0 {
        at.checked_sub(shift)?
    } else {
        at.checked_add(shift)?
    };
    utc.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(humantime::format_rfc3339_micros(utc).to_string())
}

pub(crate) fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Valid JSON holds raw line breaks only as whitespace: one line without them.
pub(crate) fn one_line(json: &str) -> String {
    json.replace(['\n', '\r'], " ")
}

/// A raw value for "expected X, found Y" (at most 40 characters of it).
pub(crate) fn shown(raw: &str) -> String {
    let mut chars = raw.chars();
    let head: String = chars.by_ref().take(40).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_become_utc_or_nothing() {
        assert_eq!(
            rfc3339_utc("2026-12-03T08:00:00.000Z").as_deref(),
            Some("2026-12-03T08:00:00.000Z")
        );
        assert_eq!(
            rfc3339_utc("2026-12-03T10:30:00+02:30").as_deref(),
            Some("2026-12-03T08:00:00.000000Z")
        );
        assert_eq!(
            rfc3339_utc("2026-12-03T07:00:00.5-01:00").as_deref(),
            Some("2026-12-03T08:00:00.500000Z")
        );
        for bad in [
            "yesterday",
            "2026-12-03 08:00:00Z",
            "2026-12-03T08:00:00",
            "2026-12-03T08:00:00+2:00",
            "2026-13-03T08:00:00Z",
            "2026-12-03T08:00:00+24:00",
            "0000-01-01T00:00:00+01:00",
        ] {
            assert_eq!(rfc3339_utc(bad), None, "{bad}");
        }
        let p = |json: &'static str| Payload {
            text: json,
            members: serde_json::from_str::<Members<'_>>(json).unwrap().0,
            event: String::new(),
        };
        assert_eq!(
            p(r#"{"t":1764748800000}"#).time_at(&["t"]).as_deref(),
            Some("2025-12-03T08:00:00.000Z")
        );
        assert_eq!(p(r#"{"t":-5}"#).time_at(&["t"]), None);
        assert_eq!(p(r#"{"t":1.5}"#).time_at(&["t"]), None);
        assert_eq!(p(r#"{"t":999999999999999999}"#).time_at(&["t"]), None);
    }
}
