//! Chart.yaml: what sequencing reads from it.
//!
//! Helm decodes Chart.yaml through JSON into typed Go fields, so a number or boolean written where a
//! string belongs becomes that string (`version: 1.10` is the version `1.1`), and a list where a
//! string belongs is an error. These functions do the same, with messages that name the field.

use std::collections::BTreeMap;

use serde_json::Value;

use super::describe;

/// The fields of a Chart.yaml that sequencing uses.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metadata {
    /// `v1` (Helm 2 charts) or `v2`.
    pub api_version: String,
    pub name: String,
    pub version: String,
    pub app_version: Option<String>,
    /// `application` or `library`.
    pub chart_type: Option<String>,
    pub annotations: BTreeMap<String, String>,
    /// The `dependencies` list. `None` when Chart.yaml has none at all, which Helm treats
    /// differently from an empty list: it then does not look at the subcharts' dependencies.
    pub dependencies: Option<Vec<Dependency>>,
}

/// One entry of `dependencies` in Chart.yaml.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dependency {
    pub name: String,
    /// A version or constraint the subchart in charts/ must satisfy (Helm checks it).
    pub version: String,
    pub repository: String,
    /// Comma-separated value paths; Helm enables the dependency by the first that holds a boolean.
    pub condition: String,
    pub tags: Vec<String>,
    pub alias: Option<String>,
    /// Sibling subcharts (names, aliases or tags) that must be ready before this one (seed 000).
    pub depends_on: Vec<String>,
}

impl Dependency {
    /// The name the parent chart uses for this dependency: the alias, else the name.
    pub fn effective_name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.name)
    }

    /// What the entry declares to switch it on or off, in words (`condition bar.enabled`,
    /// `tags front-end, web`), or `None` when it declares neither. Their values are Helm's to
    /// judge.
    pub fn switches(&self) -> Option<String> {
        let mut parts = Vec::new();
        let condition = self.condition.trim();
        if !condition.is_empty() {
            parts.push(format!("condition {condition}"));
        }
        match self.tags.as_slice() {
            [] => {}
            [tag] => parts.push(format!("tag {tag}")),
            tags => parts.push(format!("tags {}", tags.join(", "))),
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// Reads Chart.yaml (already parsed from YAML). The error says which field is wrong.
pub fn parse_metadata(document: &Value) -> Result<Metadata, String> {
    let map = match document {
        Value::Object(map) => map,
        Value::Null => return Err("Chart.yaml is empty".to_string()),
        other => {
            return Err(format!(
                "Chart.yaml must be a mapping of fields, not {}",
                describe(other)
            ));
        }
    };
    let mut md = Metadata {
        api_version: string_field(map.get("apiVersion"), "apiVersion")?.unwrap_or_default(),
        name: string_field(map.get("name"), "name")?.unwrap_or_default(),
        version: string_field(map.get("version"), "version")?.unwrap_or_default(),
        app_version: string_field(map.get("appVersion"), "appVersion")?,
        chart_type: string_field(map.get("type"), "type")?,
        annotations: BTreeMap::new(),
        dependencies: parse_dependencies(map.get("dependencies"))?,
    };
    match map.get("annotations") {
        None | Some(Value::Null) => {}
        Some(Value::Object(annotations)) => {
            for (key, value) in annotations {
                let field = format!("annotations.{key}");
                let text = match value {
                    Value::Array(_) | Value::Object(_) => {
                        return Err(format!(
                            "{field} must be a string, not {}: Helm rejects it; quote the value, e.g. '{}'",
                            describe(value),
                            serde_json::to_string(value).unwrap_or_default()
                        ));
                    }
                    other => scalar_to_string(other),
                };
                md.annotations.insert(key.clone(), text);
            }
        }
        Some(other) => {
            return Err(format!(
                "annotations must be a mapping of strings, not {}",
                describe(other)
            ));
        }
    }
    Ok(md)
}

/// Reads the `dependencies` of requirements.yaml (charts with apiVersion v1).
pub fn parse_requirements(document: &Value) -> Result<Option<Vec<Dependency>>, String> {
    match document {
        Value::Object(map) => parse_dependencies(map.get("dependencies")),
        Value::Null => Ok(None),
        other => Err(format!(
            "requirements.yaml must be a mapping, not {}",
            describe(other)
        )),
    }
}

fn parse_dependencies(value: Option<&Value>) -> Result<Option<Vec<Dependency>>, String> {
    let list = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(format!(
                "dependencies must be a list, not {}",
                describe(other)
            ));
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (index, entry) in list.iter().enumerate() {
        let map = match entry {
            Value::Object(map) => map,
            Value::Null => {
                return Err(format!(
                    "dependencies[{index}]: dependencies must not contain empty or null nodes"
                ));
            }
            other => {
                return Err(format!(
                    "dependencies[{index}] must be a mapping, not {}",
                    describe(other)
                ));
            }
        };
        let field =
            |name: &str| string_field(map.get(name), &format!("dependencies[{index}].{name}"));
        let alias = field("alias")?.filter(|a| !a.is_empty());
        let dependency = Dependency {
            name: field("name")?.unwrap_or_default(),
            version: field("version")?.unwrap_or_default(),
            repository: field("repository")?.unwrap_or_default(),
            condition: field("condition")?.unwrap_or_default(),
            tags: string_list(
                map.get("tags"),
                &format!("dependencies[{index}].tags"),
                false,
            )?,
            alias,
            depends_on: string_list(
                map.get("depends-on"),
                &format!("dependencies[{index}].depends-on"),
                true,
            )?,
        };
        out.push(dependency);
    }
    Ok(Some(out))
}

/// A string field as Helm decodes it: scalars become strings, lists and maps are errors.
fn string_field(value: Option<&Value>, field: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(_)) | Some(Value::Object(_)) => Err(format!(
            "{field} must be a string, not {}",
            describe(value.unwrap_or(&Value::Null))
        )),
        Some(other) => Ok(Some(sanitize(&scalar_to_string(other)))),
    }
}

/// A list of strings. With `split_commas`, a single string `a, b` is also accepted.
fn string_list(
    value: Option<&Value>,
    field: &str,
    split_commas: bool,
) -> Result<Vec<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::Array(_) | Value::Object(_) | Value::Null => Err(format!(
                    "{field} must be a list of strings; it holds {}",
                    describe(item)
                )),
                other => Ok(sanitize(&scalar_to_string(other))),
            })
            .collect(),
        Some(Value::String(text)) if split_commas => Ok(text
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()),
        Some(other) => Err(format!(
            "{field} must be a list of strings, not {}",
            describe(other)
        )),
    }
}

/// Helm's `sanitizeString`: whitespace becomes a plain space, unprintable characters go.
fn sanitize(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_whitespace() {
                Some(' ')
            } else if c.is_control() {
                None
            } else {
                Some(c)
            }
        })
        .collect()
}

/// A scalar as the string Go's YAML-to-JSON decoding makes of it when the target is a string.
pub fn scalar_to_string(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.to_string()
            } else if let Some(u) = n.as_u64() {
                u.to_string()
            } else {
                crate::yaml::format_float32(n.as_f64().unwrap_or_default())
            }
        }
        Value::Array(_) | Value::Object(_) => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_dependencies_with_alias_tags_and_depends_on() {
        let md = parse_metadata(&json!({
            "apiVersion": "v2", "name": "foo", "version": "0.1.0",
            "annotations": {"helm.sh/depends-on/subcharts": "[\"bar\", \"rabbitmq\"]", "n": 1.5},
            "dependencies": [
                {"name": "bar", "version": "0.1.0", "depends-on": ["nginx", "rabbitmq"], "condition": "bar.enabled"},
                {"name": "nginx", "version": 18, "alias": "web", "tags": ["front", "web"], "depends-on": "a, b"},
            ]
        }))
        .unwrap();
        let deps = md.dependencies.clone().unwrap();
        assert_eq!(deps[0].depends_on, vec!["nginx", "rabbitmq"]);
        assert_eq!(deps[0].condition, "bar.enabled");
        assert_eq!(deps[1].version, "18");
        assert_eq!(deps[1].effective_name(), "web");
        assert_eq!(deps[1].tags, vec!["front", "web"]);
        assert_eq!(deps[1].depends_on, vec!["a", "b"]);
        assert_eq!(md.annotations["n"], "1.5");
    }

    #[test]
    fn a_list_annotation_is_an_error_that_says_how_to_fix_it() {
        let err = parse_metadata(&json!({
            "apiVersion": "v2", "name": "foo", "version": "0.1.0",
            "annotations": {"helm.sh/depends-on/subcharts": ["bar", "rabbitmq"]},
        }))
        .unwrap_err();
        assert!(
            err.contains("annotations.helm.sh/depends-on/subcharts must be a string"),
            "{err}"
        );
        assert!(err.contains(r#"'["bar","rabbitmq"]'"#), "{err}");
    }

    #[test]
    fn numbers_become_strings_as_in_go() {
        assert_eq!(scalar_to_string(&json!(1.10)), "1.1");
        assert_eq!(scalar_to_string(&json!(2)), "2");
        assert_eq!(scalar_to_string(&json!(true)), "true");
        assert_eq!(scalar_to_string(&json!(0.5)), "0.5");
        assert_eq!(scalar_to_string(&json!(1000000.0)), "1e+06");
        assert_eq!(scalar_to_string(&json!(123456.0)), "123456");
        assert_eq!(scalar_to_string(&json!(0.00001)), "1e-05");
    }
}
