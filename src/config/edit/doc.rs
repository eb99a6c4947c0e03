//! Operations on the hooks.json tree: find, place, merge and remove a hook, canonical text for
//! ETags (ARCHITECTURE.md § HTTP API).

use super::*;

/// Every hook with its location (event key as written, index).
pub(super) fn flat_hooks(cur: &Current) -> Vec<((String, usize), Hook)> {
    let mut out = Vec::with_capacity(cur.table.actions.len());
    for a in &cur.table.actions {
        let event = a.event.name();
        let Some(key) = event_key(&cur.doc, event) else {
            continue;
        };
        if let Some(J::Obj(members)) = doc_node(&cur.doc, &key, a.index) {
            let hook = flat(members, event, &a.id);
            out.push(((key, a.index), hook));
        }
    }
    out
}

/// The flat API object of a hook.
pub(super) fn flat(members: &[(String, J)], event: &str, id: &str) -> Hook {
    let mut map = serde_json::Map::new();
    for (k, v) in members {
        if matches!(v, J::Null) {
            continue;
        }
        map.insert(k.clone(), v.to_value());
    }
    map.insert("event".into(), Value::String(event.to_string()));
    map.insert("id".into(), Value::String(id.to_string()));
    let json = Value::Object(map);
    let mut canonical = String::new();
    write_canonical(&json, &mut canonical);
    let bytes = canonical.into_bytes();
    Hook {
        id: id.to_string(),
        event: event.to_string(),
        json,
        etag: etag(fnv128(&bytes)),
    }
}

/// Compact JSON with object keys sorted: the same text for the same hook whatever the order
/// of its fields (and whether serde_json's `preserve_order` is on).
pub(super) fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(it, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_str_json(out, k);
                out.push(':');
                if let Some(v) = m.get(k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Bodies nested deeper than this are refused (the file's reader stops at 127 levels, and
/// the conversions here recurse).
pub(super) const MAX_BODY_DEPTH: usize = 64;

pub(super) fn too_deep(v: &Value, depth: usize) -> bool {
    if depth > MAX_BODY_DEPTH {
        return true;
    }
    match v {
        Value::Array(items) => items.iter().any(|i| too_deep(i, depth + 1)),
        Value::Object(m) => m.values().any(|i| too_deep(i, depth + 1)),
        _ => false,
    }
}

pub(super) fn check_depth(v: &Value) -> Result<(), EditError> {
    if too_deep(v, 0) {
        return Err(EditError::BadRequest(format!(
            "the body is nested more than {MAX_BODY_DEPTH} levels deep"
        )));
    }
    Ok(())
}

/// (event key as written, index, normalized event name) of the hook with this id.
pub(super) fn locate(cur: &Current, id: &str) -> Result<(String, usize, String), EditError> {
    let a = cur
        .table
        .get(id)
        .ok_or_else(|| EditError::NotFound { id: id.to_string() })?;
    let key = event_key(&cur.doc, a.event.name())
        .ok_or_else(|| EditError::NotFound { id: id.to_string() })?;
    Ok((key, a.index, a.event.name().to_string()))
}

/// Writes the id of every hook that lacks one (the loader's, so readers see no change).
pub(super) fn materialize_ids(cur: &mut Current) {
    let missing: Vec<(&'static str, usize, String)> = cur
        .table
        .actions
        .iter()
        .filter(|a| !a.id_explicit)
        .map(|a| (a.event.name(), a.index, a.id.clone()))
        .collect();
    for (event, index, id) in missing {
        let Some(key) = event_key(&cur.doc, event) else {
            continue;
        };
        if let Some(J::Obj(m)) = node_mut(&mut cur.doc, &key, index) {
            m.retain(|(k, _)| k != "id");
            m.insert(0, ("id".into(), J::Str(id)));
        }
    }
}

pub(super) fn hooks_members(doc: &J) -> Option<&Vec<(String, J)>> {
    let J::Obj(top) = doc else { return None };
    match top.iter().find(|(k, _)| k == "hooks") {
        Some((_, J::Obj(m))) => Some(m),
        _ => None,
    }
}

pub(super) fn hooks_members_mut(doc: &mut J) -> Option<&mut Vec<(String, J)>> {
    let J::Obj(top) = doc else { return None };
    match top.iter_mut().find(|(k, _)| k == "hooks") {
        Some((_, J::Obj(m))) => Some(m),
        _ => None,
    }
}

/// The key (as written) whose normalized form is `event`.
pub(super) fn event_key(doc: &J, event: &str) -> Option<String> {
    hooks_members(doc)?
        .iter()
        .find(|(k, _)| normalize_event_key(k) == event)
        .map(|(k, _)| k.clone())
}

pub(super) fn doc_node<'a>(doc: &'a J, key: &str, index: usize) -> Option<&'a J> {
    match hooks_members(doc)?.iter().find(|(k, _)| k == key)? {
        (_, J::Arr(items)) => items.get(index),
        _ => None,
    }
}

pub(super) fn node_mut<'a>(doc: &'a mut J, key: &str, index: usize) -> Option<&'a mut J> {
    match hooks_members_mut(doc)?.iter_mut().find(|(k, _)| k == key)? {
        (_, J::Arr(items)) => items.get_mut(index),
        _ => None,
    }
}

pub(super) fn remove_node(doc: &mut J, key: &str, index: usize) -> Option<J> {
    match hooks_members_mut(doc)?.iter_mut().find(|(k, _)| k == key)? {
        (_, J::Arr(items)) if index < items.len() => Some(items.remove(index)),
        _ => None,
    }
}

/// Appends a hook to its event's array (the existing key whatever its spelling, else a new key
/// with the normalized name). Returns (key, index, whether the key is new).
pub(super) fn place(doc: &mut J, event: &str, node: J) -> Result<(String, usize, bool), EditError> {
    let norm = normalize_event_key(event);
    if !matches!(doc, J::Obj(_)) {
        *doc = J::Obj(Vec::new());
    }
    let J::Obj(top) = doc else {
        return Err(EditError::Io(
            "unreachable: the document is an object".into(),
        ));
    };
    let pos = match top.iter().position(|(k, _)| k == "hooks") {
        Some(p) => p,
        None => {
            top.push(("hooks".into(), J::Obj(Vec::new())));
            top.len() - 1
        }
    };
    if matches!(top[pos].1, J::Null) {
        top[pos].1 = J::Obj(Vec::new());
    }
    let J::Obj(events) = &mut top[pos].1 else {
        return Err(EditError::Io("\"hooks\" is not an object".into()));
    };
    match events
        .iter_mut()
        .find(|(k, _)| normalize_event_key(k) == norm)
    {
        Some((k, v)) => {
            if matches!(v, J::Null) {
                *v = J::Arr(Vec::new());
            }
            let J::Arr(items) = v else {
                return Err(EditError::Io(format!("hooks.{k} is not an array")));
            };
            items.push(node);
            Ok((k.clone(), items.len() - 1, false))
        }
        None => {
            events.push((norm.clone(), J::Arr(vec![node])));
            Ok((norm, 0, true))
        }
    }
}

/// RFC 7396 for one member of an object.
pub(super) fn merge_member(members: &mut Vec<(String, J)>, key: String, patch: Value) {
    match patch {
        Value::Null => members.retain(|(k, _)| *k != key),
        Value::Object(p) => {
            let slot = match members.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    members.push((key, J::Obj(Vec::new())));
                    members.len() - 1
                }
            };
            if !matches!(members[slot].1, J::Obj(_)) {
                members[slot].1 = J::Obj(Vec::new());
            }
            if let J::Obj(inner) = &mut members[slot].1 {
                for (k, v) in p {
                    merge_member(inner, k, v);
                }
            }
        }
        other => {
            let v = J::from_value_stripped(other);
            match members.iter_mut().find(|(k, _)| *k == key) {
                Some((_, slot)) => *slot = v,
                None => members.push((key, v)),
            }
        }
    }
}
