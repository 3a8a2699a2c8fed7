//! Chart values as Helm merges them.
//!
//! Which subcharts are enabled depends on the values Helm computes: the user's values files and
//! `--set` flags merged together, then coalesced with the defaults of every chart in the tree
//! (values.yaml, subchart values under the subchart's name, `global` copied down). These functions
//! reproduce that computation, including its treatment of `null` (a user `null` deletes a default).

use serde_json::{Map, Value};

/// A values tree: the top level of a values.yaml.
pub type Values = Map<String, Value>;

/// The key under which Helm shares values with every subchart.
pub const GLOBAL_KEY: &str = "global";

/// Reads values the way Helm reads values.yaml and `-f` files: every YAML document in the text
/// must be a mapping (or empty), and the documents are merged in order.
pub fn parse_values(text: &str) -> Result<Values, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Helm appends a final newline before it parses values, which matters for a block scalar on
    // the last line (`a: |` ... without a newline at the end still ends in one).
    let owned;
    let text = if text.is_empty() || text.ends_with('\n') {
        text
    } else {
        owned = format!("{text}\n");
        &owned
    };
    let mut merged = Values::new();
    for (index, document) in crate::yaml::parse_documents(text)
        .map_err(|e| format!("invalid YAML at {e}"))?
        .into_iter()
        .enumerate()
    {
        match document {
            Value::Object(map) => merged = merge_maps(merged, map),
            Value::Null => {}
            other => {
                return Err(format!(
                    "document {} is {}, but values must be a mapping of keys to values",
                    index + 1,
                    describe(&other)
                ));
            }
        }
    }
    Ok(merged)
}

/// A few words naming the type of a value, for error messages.
pub fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Merges `overlay` into `base`: maps merge key by key, anything else in `overlay` replaces what
/// `base` has (Helm's `MergeMaps`, used between values files).
pub fn merge_maps(mut base: Values, overlay: Values) -> Values {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(existing)), Value::Object(incoming)) => {
                let merged = merge_maps(std::mem::take(existing), incoming);
                *existing = merged;
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
    base
}

/// The view of a chart that coalescing needs.
pub trait ValuesSource {
    /// The chart's name as its parent sees it (the alias, when it has one).
    fn values_name(&self) -> &str;
    /// The chart's own values.yaml.
    fn default_values(&self) -> &Values;
    /// The subcharts currently attached to the chart.
    fn values_subcharts(&self) -> Box<dyn Iterator<Item = &Self> + '_>;
}

/// Coalesces the user's `values` with the defaults of `chart` and all its subcharts, as Helm's
/// `CoalesceValues` does: the user wins, maps merge, a user `null` removes a default, subchart
/// defaults go under the subchart's name and `global` is copied into every subchart.
///
/// Fails only where Helm fails: when the value under a subchart's name is not a mapping.
pub fn coalesce<C: ValuesSource>(chart: &C, values: &Values) -> Result<Values, String> {
    let mut dest = values.clone();
    coalesce_into(chart, &mut dest)?;
    Ok(dest)
}

fn coalesce_into<C: ValuesSource>(chart: &C, dest: &mut Values) -> Result<(), String> {
    coalesce_defaults(chart, dest);
    for sub in chart.values_subcharts() {
        let name = sub.values_name();
        let entry = dest
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Values::new()));
        if !entry.is_object() {
            return Err(format!(
                "type mismatch on {name}: the value for subchart {name} is {}, not a mapping",
                describe(entry)
            ));
        }
        let parent_globals = dest.get(GLOBAL_KEY).cloned();
        let Some(Value::Object(sub_values)) = dest.get_mut(name) else {
            continue;
        };
        copy_globals(sub_values, parent_globals.as_ref());
        coalesce_into(sub, sub_values)?;
    }
    Ok(())
}

/// Copies the parent's `global` table into a subchart's values. As in Helm, the parent's globals
/// win over globals given for the subchart; nested tables merge.
fn copy_globals(dest: &mut Values, parent_globals: Option<&Value>) {
    let source = match parent_globals {
        None => Values::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return,
    };
    let mut globals = match dest.get(GLOBAL_KEY) {
        None => Values::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return,
    };
    for (key, value) in source {
        match value {
            Value::Object(parent_table) => match globals.get_mut(&key) {
                None => {
                    globals.insert(key, Value::Object(parent_table));
                }
                Some(Value::Object(own)) => {
                    let mut merged = parent_table;
                    coalesce_tables(&mut merged, own.clone(), true);
                    *own = merged;
                }
                Some(_) => {}
            },
            value => {
                if !matches!(globals.get(&key), Some(Value::Object(_))) {
                    globals.insert(key, value);
                }
            }
        }
    }
    dest.insert(GLOBAL_KEY.to_string(), Value::Object(globals));
}

/// Merges the chart's own defaults under the user's values at this level.
fn coalesce_defaults<C: ValuesSource>(chart: &C, dest: &mut Values) {
    for (key, default) in chart.default_values() {
        match dest.get_mut(key) {
            Some(Value::Null) => {
                dest.remove(key);
            }
            Some(Value::Object(user_table)) => {
                if let Value::Object(default_table) = default {
                    let is_subchart = chart.values_subcharts().any(|s| s.values_name() == key);
                    let mut default_table = default_table.clone();
                    if !is_subchart {
                        remove_nulls(&mut default_table);
                    }
                    coalesce_tables(user_table, default_table, is_subchart);
                }
            }
            Some(_) => {}
            None => match default {
                Value::Null => {}
                Value::Object(table) => {
                    let mut table = table.clone();
                    remove_nulls(&mut table);
                    dest.insert(key.clone(), Value::Object(table));
                }
                other => {
                    dest.insert(key.clone(), other.clone());
                }
            },
        }
    }
}

/// Fills `dst` (the user's table) with what `src` (the defaults) has and `dst` lacks.
/// Without `merge`, a `null` in `dst` removes the default instead of keeping a null.
fn coalesce_tables(dst: &mut Values, mut src: Values, merge: bool) {
    let src_non_null: std::collections::HashSet<String> = src
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, _)| k.clone())
        .collect();
    for (key, value) in dst.iter() {
        if value.is_null() {
            src.insert(key.clone(), Value::Null);
        }
    }
    for (key, value) in src {
        match dst.get_mut(&key) {
            Some(Value::Null) if !merge && src_non_null.contains(&key) => {
                dst.remove(&key);
            }
            None => {
                dst.insert(key, value);
            }
            Some(Value::Object(dst_table)) => {
                if let Value::Object(src_table) = value {
                    coalesce_tables(dst_table, src_table, merge);
                }
            }
            Some(_) => {}
        }
    }
}

fn remove_nulls(map: &mut Values) {
    map.retain(|_, v| !v.is_null());
    for value in map.values_mut() {
        if let Value::Object(sub) = value {
            remove_nulls(sub);
        }
    }
}

/// The table at a dotted path (`a.b`), as Helm's `Values.Table`.
pub fn table<'a>(values: &'a Values, path: &str) -> Option<&'a Values> {
    let mut current = values;
    for part in path.split('.') {
        match current.get(part) {
            Some(Value::Object(map)) => current = map,
            _ => return None,
        }
    }
    Some(current)
}

/// The value at a dotted path (`a.b.enabled`), as Helm's `Values.PathValue`: only a value that is
/// not itself a table counts.
pub fn path_value<'a>(values: &'a Values, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return None;
    }
    let (parent, key) = match path.rsplit_once('.') {
        Some((parent, key)) => (table(values, parent)?, key),
        None => (values, path),
    };
    match parent.get(key) {
        Some(Value::Object(_)) | None => None,
        Some(value) => Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Values {
        match v {
            Value::Object(m) => m,
            _ => Values::new(),
        }
    }

    struct TestChart {
        name: &'static str,
        values: Values,
        subs: Vec<TestChart>,
    }

    impl ValuesSource for TestChart {
        fn values_name(&self) -> &str {
            self.name
        }
        fn default_values(&self) -> &Values {
            &self.values
        }
        fn values_subcharts(&self) -> Box<dyn Iterator<Item = &Self> + '_> {
            Box::new(self.subs.iter())
        }
    }

    #[test]
    fn merge_maps_merges_tables_and_replaces_the_rest() {
        let a = map(json!({"a": {"x": 1, "y": 2}, "b": [1], "c": 1}));
        let b = map(json!({"a": {"y": 3, "z": 4}, "b": [2], "c": {"d": 1}}));
        assert_eq!(
            Value::Object(merge_maps(a, b)),
            json!({"a": {"x": 1, "y": 3, "z": 4}, "b": [2], "c": {"d": 1}})
        );
    }

    #[test]
    fn values_files_merge_their_documents() {
        let v = parse_values("a: {x: 1}\n---\na: {z: 2}\n---\n").unwrap();
        assert_eq!(Value::Object(v), json!({"a": {"x": 1, "z": 2}}));
        // YAML 1.1, as Helm reads it: the key `y` is the boolean true.
        let v = parse_values("enabled: no\ny: 1\n").unwrap();
        assert_eq!(Value::Object(v), json!({"enabled": false, "true": 1}));
        let last = parse_values("a: |\n  x").unwrap();
        assert_eq!(
            last["a"],
            json!("x\n"),
            "a final newline is added, as Helm does"
        );
        let err = parse_values("- a\n- b\n").unwrap_err();
        assert!(err.contains("document 1 is a list"), "{err}");
        assert!(parse_values("a: [\n").unwrap_err().contains("invalid YAML"));
    }

    #[test]
    fn coalesce_puts_defaults_under_user_values_and_subcharts_under_their_names() {
        let chart = TestChart {
            name: "foo",
            values: map(
                json!({"a": 1, "t": {"x": 1, "y": 2}, "gone": 5, "bar": {"enabled": false}}),
            ),
            subs: vec![TestChart {
                name: "bar",
                values: map(json!({"enabled": true, "port": 80})),
                subs: vec![],
            }],
        };
        let user = map(json!({"t": {"y": 3}, "gone": null, "global": {"g": 1}}));
        let out = coalesce(&chart, &user).unwrap();
        assert_eq!(
            Value::Object(out),
            json!({
                "a": 1,
                "t": {"x": 1, "y": 3},
                "global": {"g": 1},
                "bar": {"enabled": false, "port": 80, "global": {"g": 1}},
            })
        );
    }

    #[test]
    fn coalesce_fails_like_helm_when_a_subchart_value_is_not_a_table() {
        let chart = TestChart {
            name: "foo",
            values: Values::new(),
            subs: vec![TestChart {
                name: "bar",
                values: Values::new(),
                subs: vec![],
            }],
        };
        let err = coalesce(&chart, &map(json!({"bar": "x"}))).unwrap_err();
        assert!(err.contains("type mismatch on bar"), "{err}");
    }

    #[test]
    fn path_value_only_returns_leaves() {
        let v = map(json!({"a": {"b": {"c": true}}, "x": 1}));
        assert_eq!(path_value(&v, "a.b.c"), Some(&json!(true)));
        assert_eq!(path_value(&v, "x"), Some(&json!(1)));
        assert_eq!(path_value(&v, "a.b"), None);
        assert_eq!(path_value(&v, "a.z.c"), None);
        assert_eq!(path_value(&v, ""), None);
        assert!(table(&v, "a.b").is_some());
        assert!(table(&v, "x").is_none());
    }
}
