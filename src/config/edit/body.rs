//! The request body: read strictly as JSON, and validation errors pointed at their place in it.

use super::*;

/// Where `path` (as [`JPath`] displays it; `$` is the body) starts in a request body, as
/// 1-based line and character column; `None` when the body has no such place (or is not
/// JSON).
pub(super) fn locate_in_body(body: &str, path: &str) -> Option<(usize, usize)> {
    fn walk(node: &Node, at: &mut JPath, target: &str) -> Option<usize> {
        if at.to_string() == target {
            return Some(node.pos);
        }
        match &node.val {
            Val::Arr(items) => items.iter().enumerate().find_map(|(i, n)| {
                at.push(crate::config::error::Seg::Index(i));
                let found = walk(n, at, target);
                at.pop();
                found
            }),
            Val::Obj(members) => members.iter().find_map(|m| {
                at.push(crate::config::error::Seg::Key(m.key.clone()));
                let found = walk(&m.value, at, target);
                at.pop();
                found
            }),
            _ => None,
        }
    }
    let root = spanned::parse(body).root.ok()?;
    let pos = walk(&root, &mut JPath::root(), path)?;
    Some(crate::config::error::Lines::new(body).locate(pos))
}

impl EditError {
    /// The error as the client who sent `body` should read it: a validation error about a
    /// place in the body starts with that place, `body:LINE:COL: PATH: reason`. Other errors
    /// are returned as they are.
    pub fn in_body(self, body: &str) -> EditError {
        match self {
            EditError::Invalid { error, path } if !path.is_empty() => {
                match locate_in_body(body, &path) {
                    Some((line, col)) => {
                        let error = match error.strip_prefix(&format!("{path}: ")) {
                            Some(reason) => format!("body:{line}:{col}: {path}: {reason}"),
                            None => format!("body:{line}:{col}: {path}: {error}"),
                        };
                        EditError::Invalid { error, path }
                    }
                    None => EditError::Invalid { error, path },
                }
            }
            other => other,
        }
    }
}

/// `event` from a body: required, a string.
pub(super) fn body_event(v: Option<&Value>) -> Result<String, EditError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(EditError::Invalid {
            error: "\"event\" is required: the event the hook runs on, such as \"tool_call\""
                .into(),
            path: "event".into(),
        }),
        Some(other) => Err(EditError::Invalid {
            error: format!("expected a string, found {}", value_kind(other)),
            path: "event".into(),
        }),
    }
}

pub(super) fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Reads a request body as JSON, strictly: UTF-8, RFC 8259 (what serde_json accepts), and no
/// duplicate key (serde_json would keep the last one silently; the loader refuses them in the
/// file, so the API refuses them in bodies). Errors give the line, column and path. `None` for
/// an empty (or all-whitespace) body.
pub fn parse_body(bytes: &[u8]) -> Result<Option<Value>, EditError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let text = std::str::from_utf8(bytes).map_err(|e| EditError::Malformed {
        error: format!(
            "the body is not UTF-8: invalid byte at offset {}",
            e.valid_up_to()
        ),
        path: String::new(),
    })?;
    let parsed = spanned::parse(text);
    let lines = crate::config::error::Lines::new(text);
    if let Err(e) = parsed.root {
        let (line, col) = lines.locate(e.pos);
        return Err(EditError::Malformed {
            error: format!("invalid JSON at line {line} column {col}: {}", e.reason),
            path: e.path.to_string(),
        });
    }
    if let Some(d) = parsed.duplicates.first() {
        let (line, col) = lines.locate(d.pos);
        return Err(EditError::Invalid {
            error: format!(
                "duplicate key at line {line} column {col}: every key may appear once in an object"
            ),
            path: d.path.to_string(),
        });
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| EditError::Malformed {
            error: format!("invalid JSON: {e}"),
            path: String::new(),
        })
}
