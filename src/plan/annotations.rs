//! The sequencing annotations of every dialect, and how their values are read.
//!
//! Annotation values on a real API server are strings, so a list arrives as the text
//! `["database", "queue"]` or `database, queue`. Charts written for the seed put a comma inside
//! one list element (`["database, queue"]`), so every element is split on commas too.

use std::borrow::Cow;

use serde_json::Value;

/// `helm.sh/layer` (seed 000): the layer of a resource.
pub const LAYER: &str = "helm.sh/layer";
/// `helm.sh/resource-group` (HIP-0025 as merged): the same as [`LAYER`].
pub const RESOURCE_GROUP: &str = "helm.sh/resource-group";
/// `helm.sh/depends-on/layers` (seed 000): layers that must be ready first.
pub const DEPENDS_ON_LAYERS: &str = "helm.sh/depends-on/layers";
/// `helm.sh/depends-on/resource-groups` (HIP-0025): the same as [`DEPENDS_ON_LAYERS`].
pub const DEPENDS_ON_RESOURCE_GROUPS: &str = "helm.sh/depends-on/resource-groups";
/// `helm.sh/depends-on/subcharts` in Chart.yaml: subcharts that must be ready before the chart's
/// own resources.
pub const DEPENDS_ON_SUBCHARTS: &str = "helm.sh/depends-on/subcharts";
/// `werf.io/weight` (seed 003): numeric groups, each ready before the next.
pub const WERF_WEIGHT: &str = "werf.io/weight";
/// `kots.io/creation-phase` (seed 002): numeric phases, applied in order.
pub const KOTS_CREATION_PHASE: &str = "kots.io/creation-phase";
/// `kots.io/deletion-phase` (seed 002): numeric phases of uninstall.
pub const KOTS_DELETION_PHASE: &str = "kots.io/deletion-phase";
/// `kots.io/wait-for-ready` (seed 002): later phases wait until this resource is ready.
pub const KOTS_WAIT_FOR_READY: &str = crate::readiness::WAIT_FOR_READY_ANNOTATION;
/// `kots.io/wait-for-properties` (seed 002): later phases wait until these properties match.
pub const KOTS_WAIT_FOR_PROPERTIES: &str = crate::readiness::WAIT_FOR_PROPERTIES_ANNOTATION;
/// The suffix of werf's external dependency annotations: `<id>.external-dependency.werf.io/resource`.
pub const WERF_EXTERNAL_RESOURCE: &str = ".external-dependency.werf.io/resource";
/// `<id>.external-dependency.werf.io/namespace`.
pub const WERF_EXTERNAL_NAMESPACE: &str = ".external-dependency.werf.io/namespace";
/// `helm.sh/hook-weight`.
pub const HOOK_WEIGHT: &str = "helm.sh/hook-weight";
/// `helm.sh/hook-delete-policy`.
pub const HOOK_DELETE_POLICY: &str = "helm.sh/hook-delete-policy";
/// `helm.sh/hook-output-log-policy`: when Helm prints a hook Job's or Pod's log.
pub const HOOK_OUTPUT_LOG_POLICY: &str = "helm.sh/hook-output-log-policy";

/// The annotations that put a resource into a named layer or make it depend on one.
pub const NAMED_LAYER_KEYS: [&str; 4] = [
    LAYER,
    RESOURCE_GROUP,
    DEPENDS_ON_LAYERS,
    DEPENDS_ON_RESOURCE_GROUPS,
];

/// Every annotation that orders main resources; on a hook each is ignored (with a lint warning).
pub const SEQUENCING_KEYS: [&str; 8] = [
    LAYER,
    RESOURCE_GROUP,
    DEPENDS_ON_LAYERS,
    DEPENDS_ON_RESOURCE_GROUPS,
    WERF_WEIGHT,
    KOTS_CREATION_PHASE,
    KOTS_DELETION_PHASE,
    KOTS_WAIT_FOR_READY,
];

/// The text of an annotation value: strings as they are, other scalars as YAML would print them,
/// lists (which Helm 4 rejects, but other tools produce) as a JSON list.
pub fn text(value: &Value) -> Cow<'_, str> {
    match value {
        Value::String(s) => Cow::Borrowed(s),
        Value::Null => Cow::Borrowed(""),
        other => Cow::Owned(other.to_string()),
    }
}

/// Reads a list of names: a YAML/JSON flow list (`["a", "b"]`, `[a, b]`), a comma-separated
/// string (`a, b`) or one name. Each element is split on commas and trimmed; empty elements are
/// dropped. The error says what is wrong with the text.
pub fn name_list(value: &Value) -> Result<Vec<Cow<'_, str>>, String> {
    match value {
        Value::Array(items) => Ok(split_names(
            items.iter().map(|i| Cow::Owned(text(i).into_owned())),
        )),
        Value::String(s) if s.trim_start().starts_with('[') => {
            // Most charts write JSON: read that directly (borrowing the names when they hold no
            // escapes), anything else as a YAML flow list.
            if let Ok(items) = serde_json::from_str::<Vec<&str>>(s) {
                return Ok(split_names(items.into_iter().map(Cow::Borrowed)));
            }
            if let Ok(items) = serde_json::from_str::<Vec<String>>(s) {
                return Ok(split_names(items.into_iter().map(Cow::Owned)));
            }
            match crate::yaml::parse(s) {
                Ok(Value::Array(items)) => {
                    let mut out = Vec::with_capacity(items.len());
                    for item in &items {
                        match item {
                            Value::Array(_) | Value::Object(_) => {
                                return Err(
                                    "a list element is itself a list or mapping; write names"
                                        .to_string(),
                                );
                            }
                            other => out.push(Cow::Owned(text(other).into_owned())),
                        }
                    }
                    Ok(split_names(out.into_iter()))
                }
                Ok(_) => Err("it starts with '[' but is not a list".to_string()),
                Err(e) => Err(format!("it is not a valid list: {}", e.message)),
            }
        }
        Value::String(s) => Ok(split_names(std::iter::once(Cow::Borrowed(s.as_str())))),
        other => Ok(split_names(std::iter::once(Cow::Owned(
            text(other).into_owned(),
        )))),
    }
}

/// Every element split on commas and trimmed, without empty names.
fn split_names<'a>(elements: impl Iterator<Item = Cow<'a, str>>) -> Vec<Cow<'a, str>> {
    let mut out = Vec::new();
    for element in elements {
        match element {
            Cow::Borrowed(text) => out.extend(
                text.split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(Cow::Borrowed),
            ),
            Cow::Owned(text) => out.extend(
                text.split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(|name| Cow::Owned(name.to_string())),
            ),
        }
    }
    out
}

/// Whether `name` may name a layer: letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter or digit, at most 63 characters (the rules of a Kubernetes label value).
pub fn valid_layer_name(name: &str) -> bool {
    valid_dns_like(name, 63, |c| matches!(c, b'-' | b'_' | b'.'))
}

fn valid_dns_like(name: &str, max: usize, inner: impl Fn(u8) -> bool) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= max
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(|&c| c.is_ascii_alphanumeric() || inner(c))
        }
        _ => false,
    }
}

/// Whether `key` is a valid Kubernetes annotation key: an optional DNS-subdomain prefix and `/`,
/// then a name of at most 63 characters (letters, digits, `-`, `_`, `.`; alphanumeric at both ends).
pub fn valid_annotation_key(key: &str) -> bool {
    let bytes = key.as_bytes();
    let (prefix, name) = match bytes.iter().position(|&c| c == b'/') {
        Some(at) => (Some(&bytes[..at]), &bytes[at + 1..]),
        None => (None, bytes),
    };
    let name_ok = name.len() <= 63
        && name.first().is_some_and(u8::is_ascii_alphanumeric)
        && name.last().is_some_and(u8::is_ascii_alphanumeric)
        && name
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    let Some(prefix) = prefix else {
        return name_ok;
    };
    name_ok && valid_dns_subdomain(prefix)
}

/// Whether `name` is a DNS subdomain (RFC 1123), as Kubernetes names most objects and
/// annotation prefixes: at most 253 characters, labels of lower-case letters, digits and '-'
/// joined by dots, each starting and ending with a letter or digit.
pub fn valid_dns_subdomain(name: &[u8]) -> bool {
    name.len() <= 253
        && name.split(|&c| c == b'.').all(|label| {
            label.len() <= 63
                && label
                    .first()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .last()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .iter()
                    .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

/// Reads an integer annotation (`"-1"`, `"5"`). Leading `+` and surrounding spaces are accepted, as
/// Go's `strconv.Atoi` after trimming would.
pub fn integer(value: &Value) -> Result<i64, String> {
    let text = text(value);
    let trimmed = text.trim();
    trimmed
        .strip_prefix('+')
        .unwrap_or(trimmed)
        .parse::<i64>()
        .ok()
        .filter(|_| !trimmed.is_empty())
        .ok_or_else(|| format!("{text:?} is not an integer"))
}

/// An external object a resource waits for: `KIND[.GROUP]/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectReference {
    pub kind: String,
    pub group: Option<String>,
    pub name: String,
}

/// Reads `KIND[.GROUP]/NAME` (`secret/my-secret`, `deployment.apps/web`).
pub fn object_reference(value: &Value) -> Result<ObjectReference, String> {
    let text = text(value);
    let trimmed = text.trim();
    let Some((kind_group, name)) = trimmed.split_once('/') else {
        return Err(format!("{text:?} is not KIND[.GROUP]/NAME"));
    };
    if name.is_empty() || name.contains('/') || kind_group.is_empty() {
        return Err(format!("{text:?} is not KIND[.GROUP]/NAME"));
    }
    let (kind, group) = match kind_group.split_once('.') {
        Some((kind, group)) => (kind, Some(group.to_string())),
        None => (kind_group, None),
    };
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("{text:?} is not KIND[.GROUP]/NAME"));
    }
    if group.as_deref().is_some_and(|g| g.is_empty()) {
        return Err(format!("{text:?} is not KIND[.GROUP]/NAME"));
    }
    Ok(ObjectReference {
        kind: kind.to_string(),
        group,
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn name_lists_in_every_spelling() {
        let cases = [
            (json!("database"), vec!["database"]),
            (json!("database,queue"), vec!["database", "queue"]),
            (json!(" database , queue "), vec!["database", "queue"]),
            (json!("[\"database, queue\"]"), vec!["database", "queue"]),
            (
                json!("[\"database\", \"queue\"]"),
                vec!["database", "queue"],
            ),
            (json!("[database, queue]"), vec!["database", "queue"]),
            (
                json!(["database, queue", "cache"]),
                vec!["database", "queue", "cache"],
            ),
            (json!("[]"), vec![]),
            (json!(""), vec![]),
        ];
        for (input, expected) in cases {
            let names: Vec<String> = name_list(&input)
                .unwrap()
                .into_iter()
                .map(|n| n.into_owned())
                .collect();
            assert_eq!(names, expected, "{input}");
        }
    }

    #[test]
    fn malformed_lists_are_errors() {
        for input in ["[a,", "[\"a\"", "[[a]]", "[{a: b}]"] {
            assert!(name_list(&json!(input)).is_err(), "{input}");
        }
    }

    #[test]
    fn annotation_keys() {
        for key in [
            "helm.sh/layer",
            "werf.io/weight",
            "db.external-dependency.werf.io/resource",
            "simple",
            "a_b.c-d",
        ] {
            assert!(valid_annotation_key(key), "{key}");
        }
        for key in [
            "helm.sh/depends-on/layers",
            "",
            "/x",
            "a/",
            "Helm.sh/x",
            "-a/b",
            "a/-b",
            "a b",
        ] {
            assert!(!valid_annotation_key(key), "{key}");
        }
    }

    #[test]
    fn integers() {
        assert_eq!(integer(&json!("-1")).unwrap(), -1);
        assert_eq!(integer(&json!(" +5 ")).unwrap(), 5);
        assert_eq!(integer(&json!(3)).unwrap(), 3);
        assert!(integer(&json!("1.5")).is_err());
        assert!(integer(&json!("")).is_err());
        assert!(integer(&json!("ten")).is_err());
    }

    #[test]
    fn object_references() {
        assert_eq!(
            object_reference(&json!("secret/my-secret")).unwrap(),
            ObjectReference {
                kind: "secret".into(),
                group: None,
                name: "my-secret".into()
            }
        );
        assert_eq!(
            object_reference(&json!("Deployment.apps/web")).unwrap(),
            ObjectReference {
                kind: "Deployment".into(),
                group: Some("apps".into()),
                name: "web".into()
            }
        );
        for bad in ["secret", "/x", "secret/", "a/b/c", "se cret/x", "secret./x"] {
            assert!(object_reference(&json!(bad)).is_err(), "{bad}");
        }
    }
}
