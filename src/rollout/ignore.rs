//! Drift ignore rules (`spec.driftDetection.ignore`, Flux's spelling): which fields of which
//! objects drift detection leaves alone, and what that does to the values compared and applied.
//! **Pure**: the controller hands in the objects.
//!
//! A rule's `paths` are JSON pointers (RFC 6901): `/spec/replicas`, `/webhooks/0/clientConfig/caBundle`
//! (a list item by its index, no wildcards, as in Flux), `~1` for `/` and `~0` for `~` in a key,
//! and `""` for the whole object. Its `target` selects objects by group, version, kind, name and
//! namespace, each an anchored regular expression (Flux's `jsondiff.Selector`); a rule without
//! one applies to every object of the release.

use regex::Regex;
use serde_json::Value;

use crate::api::{IgnoreRule, IgnoreTarget, ObjectKey};

/// A JSON pointer, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// As written in the spec.
    pub text: String,
    /// Its reference tokens, unescaped; none for the whole object.
    tokens: Vec<String>,
}

/// The pointer of the shard label (`/metadata/labels/sequenced.dev~1shard`): a drift check leaves
/// it alone, so that objects applied before shards existed are not corrected for lacking it (the
/// next revision labels them; meanwhile the watch of unlabelled objects sees them).
pub fn shard_label() -> &'static Pointer {
    static SHARD: std::sync::LazyLock<Pointer> = std::sync::LazyLock::new(|| Pointer {
        text: format!(
            "/metadata/labels/{}",
            crate::api::SHARD_LABEL.replace('/', "~1")
        ),
        tokens: vec![
            "metadata".to_string(),
            "labels".to_string(),
            crate::api::SHARD_LABEL.to_string(),
        ],
    });
    &SHARD
}

impl Pointer {
    /// Reads a JSON pointer: `""`, or `/` followed by tokens separated by `/` in which `~` is
    /// only ever `~0` or `~1`.
    pub fn parse(text: &str) -> Result<Pointer, String> {
        if text.is_empty() {
            return Ok(Pointer {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "{text:?} is not a JSON pointer: it must start with / (such as /spec/replicas), or be \"\" for the whole object"
            ));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    token.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => token.push('~'),
                    Some('1') => token.push('/'),
                    _ => {
                        return Err(format!(
                            "{text:?} is not a JSON pointer: ~ must be followed by 0 (for ~) or 1 (for /)"
                        ));
                    }
                }
            }
            tokens.push(token);
        }
        Ok(Pointer {
            text: text.to_string(),
            tokens,
        })
    }

    /// The whole object (`""`).
    pub fn is_whole(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The value at the pointer, if the object has one there.
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.tokens.iter().try_fold(value, step)
    }

    /// The value at the pointer, mutable, if the object has one there.
    fn get_mut<'v>(&self, value: &'v mut Value) -> Option<&'v mut Value> {
        self.tokens.iter().try_fold(value, |v, token| match v {
            Value::Object(m) => m.get_mut(token),
            Value::Array(a) => a.get_mut(index(token)?),
            _ => None,
        })
    }

    /// The container of the value at the pointer and the last token.
    fn parent_mut<'v>(&self, value: &'v mut Value) -> Option<(&'v mut Value, &str)> {
        let (last, init) = self.tokens.split_last()?;
        let parent = init.iter().try_fold(value, |v, token| match v {
            Value::Object(m) => m.get_mut(token),
            Value::Array(a) => a.get_mut(index(token)?),
            _ => None,
        })?;
        Some((parent, last.as_str()))
    }
}

fn step<'v>(v: &'v Value, token: &String) -> Option<&'v Value> {
    match v {
        Value::Object(m) => m.get(token),
        Value::Array(a) => a.get(index(token)?),
        _ => None,
    }
}

/// A list index as RFC 6901 writes it: digits, no leading zero.
fn index(token: &str) -> Option<usize> {
    if token.is_empty()
        || !token.bytes().all(|b| b.is_ascii_digit())
        || (token.len() > 1 && token.starts_with('0'))
    {
        return None;
    }
    token.parse().ok()
}

/// An ignore rule, read.
#[derive(Debug, Clone)]
struct Rule {
    pointers: Vec<Pointer>,
    target: Option<Target>,
}

/// A rule's `target`: each field set an anchored regular expression.
#[derive(Debug, Clone)]
struct Target {
    group: Option<Regex>,
    version: Option<Regex>,
    kind: Option<Regex>,
    name: Option<Regex>,
    namespace: Option<Regex>,
}

impl Target {
    fn read(target: &IgnoreTarget, field: &str) -> Result<Target, String> {
        let re = |name: &str, pattern: &Option<String>| -> Result<Option<Regex>, String> {
            match pattern.as_deref() {
                None | Some("") => Ok(None),
                Some(p) => Regex::new(&format!("^(?:{p})$"))
                    .map(Some)
                    .map_err(|e| format!("{field}.{name}: {p:?} is not a regular expression: {e}")),
            }
        };
        Ok(Target {
            group: re("group", &target.group)?,
            version: re("version", &target.version)?,
            kind: re("kind", &target.kind)?,
            name: re("name", &target.name)?,
            namespace: re("namespace", &target.namespace)?,
        })
    }

    fn matches(&self, key: &ObjectKey) -> bool {
        let (group, version) = match key.api_version.rsplit_once('/') {
            Some((group, version)) => (group, version),
            None => ("", key.api_version.as_str()),
        };
        let ok = |re: &Option<Regex>, value: &str| re.as_ref().is_none_or(|r| r.is_match(value));
        ok(&self.group, group)
            && ok(&self.version, version)
            && ok(&self.kind, &key.kind)
            && ok(&self.name, &key.name)
            && ok(&self.namespace, key.namespace.as_deref().unwrap_or(""))
    }
}

/// The ignore rules of a release, read.
#[derive(Debug, Clone, Default)]
pub struct IgnoreRules {
    rules: Vec<Rule>,
}

impl IgnoreRules {
    /// Reads `spec.driftDetection.ignore`; the error names the first malformed pointer or
    /// regular expression by its field (`spec.driftDetection.ignore[0].paths[1]: ...`).
    pub fn read(rules: &[IgnoreRule]) -> Result<IgnoreRules, String> {
        let mut read = Vec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate() {
            let field = format!("spec.driftDetection.ignore[{i}]");
            let pointers = rule
                .paths
                .iter()
                .enumerate()
                .map(|(j, p)| Pointer::parse(p).map_err(|e| format!("{field}.paths[{j}]: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let target = match &rule.target {
                Some(t) => Some(Target::read(t, &format!("{field}.target"))?),
                None => None,
            };
            read.push(Rule { pointers, target });
        }
        Ok(IgnoreRules { rules: read })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The pointers ignored in the object `key`: those of every rule whose target selects it.
    pub fn for_object(&self, key: &ObjectKey) -> Vec<&Pointer> {
        self.rules
            .iter()
            .filter(|r| r.target.as_ref().is_none_or(|t| t.matches(key)))
            .flat_map(|r| r.pointers.iter())
            .collect()
    }
}

/// Whether the whole object is ignored (a pointer `""`).
pub fn whole(pointers: &[&Pointer]) -> bool {
    pointers.iter().any(|p| p.is_whole())
}

/// `value` without what is at `pointers`, to compare: a map entry is removed, a list item is
/// set to null (so that the indexes of the items after it, which other pointers may name, stay
/// as they are). A pointer the value does not have changes nothing.
pub fn strip(value: &mut Value, pointers: &[&Pointer]) {
    for pointer in pointers {
        if pointer.is_whole() {
            *value = Value::Null;
            continue;
        }
        match pointer.parent_mut(value) {
            Some((Value::Object(m), last)) => {
                m.remove(last);
            }
            Some((Value::Array(a), last)) => {
                if let Some(item) = index(last).and_then(|i| a.get_mut(i)) {
                    *item = Value::Null;
                }
            }
            _ => {}
        }
    }
}

/// The object to apply when it must not change what is at `pointers` in the `live` object:
/// where the object sets an ignored field, the live value replaces the chart's (or, when the
/// live object has none, the field is left out). Fields the object does not set are not added:
/// they are not applied, so server-side apply leaves them as they are. The whole object (`""`)
/// is the caller's to leave alone.
///
/// Why the live value and not leaving the field out: server-side apply removes a field that
/// the field manager (`sequenced`) owns and no longer applies, so an ignored `spec.replicas`
/// left out would be reset to its default. Applying the live value changes nothing there (and
/// is no conflict with the manager that set it, which keeps owning it with `sequenced`), while
/// the other fields of the object are corrected as the chart says.
pub fn keep_live(object: &mut Value, live: &Value, pointers: &[&Pointer]) {
    for pointer in pointers {
        if pointer.is_whole() || pointer.get(object).is_none() {
            continue;
        }
        match pointer.get(live) {
            Some(value) => {
                if let Some(at) = pointer.get_mut(object) {
                    *at = value.clone();
                }
            }
            None => {
                // Gone from the live object: not put back. (A list item cannot be left out
                // without moving the items after it: it stays as the chart says.)
                if let Some((Value::Object(m), last)) = pointer.parent_mut(object) {
                    m.remove(last);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    fn rules(value: Value) -> Result<IgnoreRules, String> {
        let rules: Vec<IgnoreRule> = serde_json::from_value(value).unwrap();
        IgnoreRules::read(&rules)
    }

    fn texts(pointers: &[&Pointer]) -> Vec<String> {
        pointers.iter().map(|p| p.text.clone()).collect()
    }

    #[test]
    fn pointers_are_read_as_rfc_6901_says() {
        let p = Pointer::parse("/metadata/annotations/example.com~1a~0b").unwrap();
        let object = json!({"metadata": {"annotations": {"example.com/a~b": "x"}}});
        assert_eq!(p.get(&object), Some(&json!("x")));
        assert!(Pointer::parse("").unwrap().is_whole());
        let list = json!({"webhooks": [{"clientConfig": {"caBundle": "Q0E="}}]});
        let ca = Pointer::parse("/webhooks/0/clientConfig/caBundle").unwrap();
        assert_eq!(ca.get(&list), Some(&json!("Q0E=")));
        // `01` is not an index, `-` (past the end) names no item.
        assert_eq!(
            Pointer::parse("/webhooks/01/clientConfig")
                .unwrap()
                .get(&list),
            None
        );
        assert_eq!(Pointer::parse("/webhooks/-").unwrap().get(&list), None);
    }

    #[test]
    fn malformed_pointers_are_refused_naming_the_field() {
        for (path, why) in [
            ("spec/replicas", "must start with /"),
            ("/data/a~2", "~ must be followed by 0"),
            ("/data/a~", "~ must be followed by 0"),
        ] {
            let err = rules(json!([{"paths": ["/ok", path]}])).unwrap_err();
            assert!(
                err.starts_with("spec.driftDetection.ignore[0].paths[1]: ") && err.contains(why),
                "{err}"
            );
        }
        let err = rules(json!([{"paths": ["/a"], "target": {"name": "("}}])).unwrap_err();
        assert!(
            err.starts_with(
                "spec.driftDetection.ignore[0].target.name: \"(\" is not a regular expression"
            ),
            "{err}"
        );
    }

    #[test]
    fn targets_select_by_group_version_kind_name_and_namespace_anchored() {
        let r = rules(json!([
            {"paths": ["/spec/replicas"], "target": {"group": "apps", "kind": "Deployment", "name": "app"}},
            {"paths": ["/webhooks/0/clientConfig/caBundle"], "target": {"kind": ".*WebhookConfiguration"}},
            {"paths": ["/data/stamp"], "target": {"version": "v1beta1|v1", "kind": "ConfigMap", "namespace": "shop"}},
            {"paths": ["/metadata/labels/x"]},
        ]))
        .unwrap();
        let app = key("apps/v1", "Deployment", Some("shop"), "app");
        assert_eq!(
            texts(&r.for_object(&app)),
            ["/spec/replicas", "/metadata/labels/x"]
        );
        // Anchored: `app` does not select `app-2`, `apps` not `apps.example.com`.
        let other = key("apps/v1", "Deployment", Some("shop"), "app-2");
        assert_eq!(texts(&r.for_object(&other)), ["/metadata/labels/x"]);
        let crd = key("apps.example.com/v1", "Deployment", Some("x"), "app");
        assert_eq!(texts(&r.for_object(&crd)), ["/metadata/labels/x"]);
        let webhook = key(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            None,
            "hook",
        );
        assert_eq!(
            texts(&r.for_object(&webhook)),
            ["/webhooks/0/clientConfig/caBundle", "/metadata/labels/x"]
        );
        let cm = key("v1", "ConfigMap", Some("shop"), "settings");
        assert_eq!(
            texts(&r.for_object(&cm)),
            ["/data/stamp", "/metadata/labels/x"]
        );
        let elsewhere = key("v1", "ConfigMap", Some("other"), "settings");
        assert_eq!(texts(&r.for_object(&elsewhere)), ["/metadata/labels/x"]);
    }

    #[test]
    fn strip_removes_what_is_there_and_ignores_what_is_not() {
        let mut v =
            json!({"spec": {"replicas": 5, "paused": false}, "webhooks": [{"a": 1}, {"a": 2}]});
        let ps = [
            Pointer::parse("/spec/replicas").unwrap(),
            Pointer::parse("/spec/missing/deeper").unwrap(),
            Pointer::parse("/webhooks/0").unwrap(),
            Pointer::parse("/webhooks/1/a").unwrap(),
            Pointer::parse("/webhooks/7/a").unwrap(),
        ];
        strip(&mut v, &ps.iter().collect::<Vec<_>>());
        assert_eq!(
            v,
            json!({"spec": {"paused": false}, "webhooks": [null, {}]})
        );
    }

    #[test]
    fn keep_live_applies_the_live_value_of_an_ignored_field_the_chart_sets() {
        let ps = [
            Pointer::parse("/spec/replicas").unwrap(),
            Pointer::parse("/webhooks/0/clientConfig/caBundle").unwrap(),
            Pointer::parse("/data/gone").unwrap(),
            Pointer::parse("/data/unset").unwrap(),
        ];
        let ps: Vec<&Pointer> = ps.iter().collect();
        let mut object = json!({
            "spec": {"replicas": 1, "paused": false},
            "webhooks": [{"clientConfig": {"caBundle": ""}}],
            "data": {"gone": "chart", "kept": "chart"},
        });
        let live = json!({
            "spec": {"replicas": 5, "paused": true},
            "webhooks": [{"clientConfig": {"caBundle": "Q0E="}}],
            "data": {"kept": "edited", "unset": "theirs"},
        });
        keep_live(&mut object, &live, &ps);
        assert_eq!(
            object,
            json!({
                // The ignored fields as they are live; the others as the chart says.
                "spec": {"replicas": 5, "paused": false},
                "webhooks": [{"clientConfig": {"caBundle": "Q0E="}}],
                // Removed live: left out. Not set by the chart: not added.
                "data": {"kept": "chart"},
            })
        );
    }

    #[test]
    fn the_whole_object_is_ignored_with_an_empty_pointer() {
        let r = rules(json!([{"paths": [""], "target": {"kind": "Secret"}}])).unwrap();
        let secret = key("v1", "Secret", Some("a"), "s");
        assert!(whole(&r.for_object(&secret)));
        assert!(!whole(&r.for_object(&key(
            "v1",
            "ConfigMap",
            Some("a"),
            "s"
        ))));
    }
}
