//! The JSON tree the editor works on: object members in the order written and numbers as
//! written, so an edit changes only what it names (ARCHITECTURE.md § HTTP API).

use super::*;

/// A JSON value that keeps object members in order (serde_json's map sorts them without the
/// `preserve_order` feature) and numbers exactly as written.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    pub(super) fn from_node(node: Node) -> J {
        match node.val {
            Val::Null => J::Null,
            Val::Bool(b) => J::Bool(b),
            Val::Num(n) => J::Num(n),
            Val::Str(s) => J::Str(s),
            Val::Arr(items) => J::Arr(items.into_iter().map(J::from_node).collect()),
            Val::Obj(members) => J::Obj(
                members
                    .into_iter()
                    .map(|m| (m.key, J::from_node(m.value)))
                    .collect(),
            ),
        }
    }

    pub(super) fn from_value(v: Value) -> J {
        match v {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(b),
            Value::Number(n) => J::Num(n.to_string()),
            Value::String(s) => J::Str(s),
            Value::Array(items) => J::Arr(items.into_iter().map(J::from_value).collect()),
            Value::Object(m) => J::Obj(m.into_iter().map(|(k, v)| (k, J::from_value(v))).collect()),
        }
    }

    /// A merge-patch value put in place: nulls inside objects are removed (RFC 7396).
    pub(super) fn from_value_stripped(v: Value) -> J {
        match v {
            Value::Object(m) => J::Obj(
                m.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, J::from_value_stripped(v)))
                    .collect(),
            ),
            other => J::from_value(other),
        }
    }

    pub(super) fn to_value(&self) -> Value {
        match self {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Num(n) => n
                .parse::<serde_json::Number>()
                .map(Value::Number)
                .or_else(|_| n.parse::<f64>().map(|f| serde_json::json!(f)))
                .unwrap_or(Value::Null),
            J::Str(s) => Value::String(s.clone()),
            J::Arr(items) => Value::Array(items.iter().map(J::to_value).collect()),
            J::Obj(members) => Value::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect(),
            ),
        }
    }

    pub(super) fn is_scalar(&self) -> bool {
        !matches!(self, J::Arr(_) | J::Obj(_))
    }

    /// The document as written to disk: two-space indentation, short arrays and objects of
    /// scalars on one line, a final newline.
    pub(super) fn to_file_bytes(&self) -> Vec<u8> {
        let mut out = String::new();
        self.write_pretty(&mut out, 0);
        out.push('\n');
        out.into_bytes()
    }

    pub(super) fn write_compact(&self, out: &mut String) {
        match self {
            J::Null => out.push_str("null"),
            J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            J::Num(n) => out.push_str(n),
            J::Str(s) => push_str_json(out, s),
            J::Arr(items) => {
                out.push('[');
                for (i, it) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    it.write_compact(out);
                }
                out.push(']');
            }
            J::Obj(members) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    push_str_json(out, k);
                    out.push_str(": ");
                    v.write_compact(out);
                }
                out.push('}');
            }
        }
    }

    pub(super) fn write_pretty(&self, out: &mut String, depth: usize) {
        const INLINE: usize = 72;
        let inline = match self {
            J::Arr(items) => items.iter().all(J::is_scalar),
            J::Obj(members) => members.iter().all(|(_, v)| v.is_scalar()),
            _ => true,
        };
        if inline {
            let mut one = String::new();
            self.write_compact(&mut one);
            if self.is_scalar() || one.len() <= INLINE || self.is_empty() {
                out.push_str(&one);
                return;
            }
        }
        let pad = |out: &mut String, d: usize| {
            for _ in 0..d {
                out.push_str("  ");
            }
        };
        match self {
            J::Arr(items) => {
                out.push_str("[\n");
                for (i, it) in items.iter().enumerate() {
                    pad(out, depth + 1);
                    it.write_pretty(out, depth + 1);
                    if i + 1 < items.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                pad(out, depth);
                out.push(']');
            }
            J::Obj(members) => {
                out.push_str("{\n");
                for (i, (k, v)) in members.iter().enumerate() {
                    pad(out, depth + 1);
                    push_str_json(out, k);
                    out.push_str(": ");
                    v.write_pretty(out, depth + 1);
                    if i + 1 < members.len() {
                        out.push(',');
                    }
                    out.push('\n');
                }
                pad(out, depth);
                out.push('}');
            }
            _ => self.write_compact(out),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        match self {
            J::Arr(a) => a.is_empty(),
            J::Obj(m) => m.is_empty(),
            _ => false,
        }
    }
}

pub(super) fn push_str_json(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(q) => out.push_str(&q),
        Err(_) => out.push_str("\"\""),
    }
}
