//! The patch types kube-apiserver takes: RFC 6902 JSON patch (with the leniency of the Go
//! library it uses: `test` of a missing member against `null` passes), RFC 7386 merge patch,
//! and strategic merge patch for built-in kinds.

use serde_json::{Map, Value};

use super::fields::{Shape, ShapeCtx, shape};

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn parse_pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| format!("JSON pointer must be empty or start with a \"/\": {p}"))?;
    Ok(rest.split('/').map(unescape).collect())
}

/// The container holding the last token of `path`, and that token.
fn parent<'a>(doc: &'a mut Value, path: &[String]) -> Option<(&'a mut Value, String)> {
    let (last, init) = path.split_last()?;
    let mut cur = doc;
    for t in init {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => a.get_mut(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some((cur, last.clone()))
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for t in path {
        cur = match cur {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn add(doc: &mut Value, path: &[String], value: Value, raw: &str) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let missing =
        || format!("add operation does not apply: doc is missing path: \"{raw}\": missing value");
    let (container, key) = parent(doc, path).ok_or_else(missing)?;
    match container {
        Value::Object(m) => {
            m.insert(key, value);
            Ok(())
        }
        Value::Array(a) => {
            let idx = if key == "-" {
                a.len()
            } else {
                key.parse::<usize>().map_err(|_| {
                    format!("Unable to access invalid index: {key}: invalid index referenced")
                })?
            };
            if idx > a.len() {
                return Err(format!(
                    "Unable to access invalid index: {idx}: invalid index referenced"
                ));
            }
            a.insert(idx, value);
            Ok(())
        }
        _ => Err(missing()),
    }
}

fn remove(doc: &mut Value, path: &[String], raw: &str) -> Result<Value, String> {
    let missing = || {
        format!("remove operation does not apply: doc is missing path: \"{raw}\": missing value")
    };
    let (container, key) = parent(doc, path).ok_or_else(missing)?;
    match container {
        Value::Object(m) => m
            .remove(&key)
            .ok_or_else(|| format!("Unable to remove nonexistent key: {key}: missing value")),
        Value::Array(a) => {
            let idx = key.parse::<usize>().map_err(|_| {
                format!("Unable to access invalid index: {key}: invalid index referenced")
            })?;
            if idx >= a.len() {
                return Err(format!(
                    "Unable to access invalid index: {idx}: invalid index referenced"
                ));
            }
            Ok(a.remove(idx))
        }
        _ => Err(missing()),
    }
}

/// Applies an RFC 6902 patch; the error text of [`PatchError::Apply`] is that of the server's
/// patch library (which the server does not pass on).
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::Decode(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        )
    })?;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let raw_path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| PatchError::Apply(format!("operation missing path field: {op}")))?;
        let path = parse_pointer(raw_path).map_err(PatchError::Apply)?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| PatchError::Apply(format!("operation, {kind}, missing value field")))
        };
        let from = || -> Result<(String, Vec<String>), PatchError> {
            let raw = op.get("from").and_then(Value::as_str).ok_or_else(|| {
                PatchError::Apply(format!("operation, {kind}, missing from field"))
            })?;
            Ok((
                raw.to_string(),
                parse_pointer(raw).map_err(PatchError::Apply)?,
            ))
        };
        match kind {
            "add" => add(doc, &path, value()?, raw_path).map_err(PatchError::Apply)?,
            "remove" => {
                remove(doc, &path, raw_path).map_err(PatchError::Apply)?;
            }
            "replace" => {
                let v = value()?;
                if path.is_empty() {
                    *doc = v;
                } else {
                    let missing = || {
                        PatchError::Apply(format!(
                            "replace operation does not apply: doc is missing key: {raw_path}: missing value"
                        ))
                    };
                    let (container, key) = parent(doc, &path).ok_or_else(missing)?;
                    match container {
                        Value::Object(m) if m.contains_key(&key) => {
                            m.insert(key, v);
                        }
                        Value::Array(a) => {
                            let slot = key
                                .parse::<usize>()
                                .ok()
                                .and_then(|i| a.get_mut(i))
                                .ok_or_else(missing)?;
                            *slot = v;
                        }
                        _ => return Err(missing()),
                    }
                }
            }
            "move" => {
                let (raw_from, from) = from()?;
                let v = remove(doc, &from, &raw_from).map_err(PatchError::Apply)?;
                add(doc, &path, v, raw_path).map_err(PatchError::Apply)?;
            }
            "copy" => {
                let (raw_from, from) = from()?;
                let v = get(doc, &from)
                    .cloned()
                    .ok_or_else(|| PatchError::Apply(format!("copy operation does not apply: doc is missing from path: {raw_from}: missing value")))?;
                add(doc, &path, v, raw_path).map_err(PatchError::Apply)?;
            }
            "test" => {
                let want = op.get("value").cloned().unwrap_or(Value::Null);
                let container_exists = path.is_empty() || parent_exists(doc, &path);
                if !container_exists {
                    return Err(PatchError::Apply(format!(
                        "test operation does not apply: is missing path: {raw_path}: missing value"
                    )));
                }
                let have = get(doc, &path);
                let ok = match have {
                    None | Some(Value::Null) => want.is_null(),
                    Some(h) => *h == want,
                };
                if !ok {
                    return Err(PatchError::Apply(format!(
                        "testing value {raw_path} failed: test failed"
                    )));
                }
            }
            other => return Err(PatchError::Apply(format!("Unexpected kind: {other}"))),
        }
    }
    Ok(())
}

fn parent_exists(doc: &Value, path: &[String]) -> bool {
    let Some((_, init)) = path.split_last() else {
        return true;
    };
    matches!(get(doc, init), Some(Value::Object(_) | Value::Array(_)))
}

#[derive(Debug)]
pub enum PatchError {
    /// The patch itself could not be read (400).
    Decode(String),
    /// The patch does not apply (422). The text, in the words of the server's patch library, is
    /// for debugging only: the server's 422 does not carry it.
    Apply(#[expect(dead_code, reason = "read through Debug only")] String),
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(pm) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(tm) = target else { return };
    for (k, v) in pm {
        if v.is_null() {
            tm.remove(k);
        } else {
            merge_patch(tm.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Strategic merge patch: maps merge, lists with a merge key merge by it (`$patch: delete`
/// removes an item), finalizers merge as a set, other lists are replaced.
pub fn strategic_merge_patch(
    ctx: ShapeCtx,
    target: &mut Value,
    patch: &Value,
) -> Result<(), String> {
    smp_at(ctx, &mut Vec::new(), target, patch)
}

fn smp_at(
    ctx: ShapeCtx,
    path: &mut Vec<String>,
    target: &mut Value,
    patch: &Value,
) -> Result<(), String> {
    let Value::Object(pm) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match pm.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut v = patch.clone();
            if let Value::Object(m) = &mut v {
                m.remove("$patch");
            }
            *target = v;
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => return Err(format!("Unknown patch type: {other}")),
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(tm) = target else {
        return Ok(());
    };
    for (k, v) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (tm.get_mut(field), v.as_array()) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            tm.remove(k);
            continue;
        }
        path.push(k.clone());
        let existing = tm.entry(k.clone()).or_insert(Value::Null);
        match v {
            Value::Object(_) => {
                let atomic = matches!(shape(ctx, path, v), Shape::AtomicMap);
                if atomic {
                    *existing = v.clone();
                } else {
                    smp_at(ctx, path, existing, v)?;
                }
                if existing.is_null() {
                    tm.remove(k);
                }
            }
            Value::Array(items) => match shape(ctx, path, v) {
                Shape::AssocList(keys) => {
                    let key = keys.first().cloned().unwrap_or_default();
                    if items
                        .iter()
                        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
                    {
                        *existing = Value::Array(
                            items
                                .iter()
                                .filter(|i| i.get("$patch").is_none())
                                .cloned()
                                .collect(),
                        );
                    } else {
                        if !existing.is_array() {
                            *existing = Value::Array(Vec::new());
                        }
                        let Value::Array(list) = existing else {
                            continue;
                        };
                        path.push("[]".into());
                        for item in items {
                            let id = item.get(&key);
                            let pos = list.iter().position(|x| x.get(&key) == id && id.is_some());
                            let delete =
                                item.get("$patch").and_then(Value::as_str) == Some("delete");
                            match (pos, delete) {
                                (Some(p), true) => {
                                    list.remove(p);
                                }
                                (None, true) => {}
                                (Some(p), false) => smp_at(ctx, path, &mut list[p], item)?,
                                (None, false) => {
                                    let mut fresh = Value::Null;
                                    smp_at(ctx, path, &mut fresh, item)?;
                                    list.push(fresh);
                                }
                            }
                        }
                        path.pop();
                    }
                }
                Shape::SetList => {
                    if !existing.is_array() {
                        *existing = Value::Array(Vec::new());
                    }
                    if let Value::Array(list) = existing {
                        for item in items {
                            if !list.contains(item) {
                                list.push(item.clone());
                            }
                        }
                    }
                }
                _ => *existing = v.clone(),
            },
            _ => *existing = v.clone(),
        }
        path.pop();
    }
    Ok(())
}
