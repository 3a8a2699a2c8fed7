//! The digest of what a release asks for (DESIGN.md, "What starts a revision"): a new revision
//! starts when it changes, and only then (besides a change of the spec itself, a retry or a
//! request). It is a documented, versioned function, so that upgrading the operator never
//! starts a revision by itself:
//!
//! - **v3** (`v3:sha256:<hex>`, written since `spec.postRenderers`): the v2 document with
//!   `scheme: "v3"` and, when the release has post-renderers, `postRenderers` as the spec holds
//!   them (each `{kustomize: {patches: [{patch, target}], images: [...]}}`, the fields that are
//!   set; a patch as its text).
//! - **v2** (`v2:sha256:<hex>`, written from the versioned digest to `spec.postRenderers`): SHA-256 of a canonical
//!   JSON document (object keys sorted, no spaces) holding `scheme: "v2"`, the resolved chart's
//!   identity (`repository <url> <name> <version>`, `oci <reference> <version>`, or the content
//!   hash of a local or packaged chart), the values as data in the order Helm merges them (each
//!   values file parsed, so comments, quoting, key order and layout do not count; a
//!   `valuesFrom[].targetPath` entry as its path and raw value), the release name, the target
//!   namespace, and `spec.commonMetadata` when it stamps anything.
//! - **v1** (`sha256:<hex>`, written before): SHA-256 of the chart identity, each values file's
//!   text (length-prefixed), the release name and the namespace. It could express neither
//!   `targetPath` nor `commonMetadata`.
//!
//! A stored digest is compared under the scheme that wrote it ([`Digests::matches`]): a release
//! that a v1 operator deployed is unchanged for a v2 operator as long as the v1 digest of its
//! spec is the stored one, and one a v2 operator deployed is unchanged for a v3 operator as long
//! as it has no post-renderers (which v2 cannot express) and its v2 digest is the stored one. A
//! future v4 adds its function here and keeps the older ones.
//!
//! Pure: no I/O, no clock.

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::api::{CommonMetadata, PostRenderer};

/// The scheme written by this version of the operator.
pub const SCHEME: &str = "v3";

/// One entry of the values, in merge order.
#[derive(Debug, Clone, PartialEq)]
pub enum ValuesInput<'a> {
    /// A values file's text (`valuesFrom`, or `spec.values` as JSON).
    File(&'a str),
    /// A `valuesFrom[].targetPath` entry: the key's value set at `path`.
    TargetPath { path: &'a str, value: &'a str },
}

/// What a release asks for, as the digest reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked<'a> {
    /// The resolved chart's identity (`Resolved::identity`).
    pub chart: &'a str,
    pub values: Vec<ValuesInput<'a>>,
    pub release_name: &'a str,
    pub namespace: &'a str,
    pub common_metadata: Option<&'a CommonMetadata>,
    /// `spec.postRenderers`.
    pub post_renderers: &'a [PostRenderer],
}

/// The digests of one spec under every scheme that can express it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    /// Under [`SCHEME`]: what a new revision records.
    pub current: String,
    /// Under v2, when the spec uses nothing v2 could not express.
    pub v2: Option<String>,
    /// Under v1, when the spec uses nothing v1 could not express.
    pub v1: Option<String>,
}

impl Digests {
    pub fn of(asked: &Asked) -> Digests {
        Digests {
            current: v3(asked),
            v2: v2(asked),
            v1: v1(asked),
        }
    }

    /// Whether a stored digest is this spec's under the scheme that wrote it: each scheme
    /// writes its own prefix ([`scheme_of`]), so it is the spec's digest under one of them.
    pub fn matches(&self, stored: &str) -> bool {
        stored == self.current
            || self.v2.as_deref() == Some(stored)
            || self.v1.as_deref() == Some(stored)
    }
}

/// The scheme that wrote a stored digest: `v1` for a bare `sha256:`, the prefix otherwise;
/// None for a string no scheme writes.
pub fn scheme_of(stored: &str) -> Option<&str> {
    if stored.starts_with("sha256:") {
        return Some("v1");
    }
    let (scheme, rest) = stored.split_once(':')?;
    rest.starts_with("sha256:").then_some(scheme)
}

/// The v3 digest: v2's document with the post-renderers.
pub fn v3(asked: &Asked) -> String {
    let mut document = document(asked, "v3");
    if !asked.post_renderers.is_empty()
        && let Some(map) = document.as_object_mut()
    {
        map.insert(
            "postRenderers".into(),
            serde_json::to_value(asked.post_renderers).unwrap_or(Value::Null),
        );
    }
    hashed("v3", &document)
}

/// The v2 digest, None when the spec has post-renderers.
pub fn v2(asked: &Asked) -> Option<String> {
    if !asked.post_renderers.is_empty() {
        return None;
    }
    Some(hashed("v2", &document(asked, "v2")))
}

/// `scheme:sha256:<hex>` of the canonical JSON of `document`.
fn hashed(scheme: &str, document: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(document, &mut canonical);
    format!(
        "{scheme}:sha256:{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    )
}

/// The document v2 hashes (with `scheme` in it), which v3 extends.
fn document(asked: &Asked, scheme: &str) -> Value {
    let values = asked
        .values
        .iter()
        .map(|entry| match entry {
            ValuesInput::File(text) => serde_json::json!({ "file": values_data(text) }),
            ValuesInput::TargetPath { path, value } => {
                serde_json::json!({ "targetPath": { "path": path, "value": value } })
            }
        })
        .collect::<Vec<_>>();
    let mut document = serde_json::json!({
        "scheme": scheme,
        "chart": asked.chart,
        "values": values,
        "releaseName": asked.release_name,
        "namespace": asked.namespace,
    });
    if let Some(common) = asked.common_metadata.filter(|c| !c.is_empty())
        && let Some(map) = document.as_object_mut()
    {
        map.insert(
            "commonMetadata".into(),
            serde_json::json!({ "labels": common.labels, "annotations": common.annotations }),
        );
    }
    document
}

/// The v1 digest, None when the spec uses `targetPath`, `commonMetadata` or post-renderers.
pub fn v1(asked: &Asked) -> Option<String> {
    if asked.common_metadata.is_some_and(|c| !c.is_empty()) || !asked.post_renderers.is_empty() {
        return None;
    }
    let mut hasher = Sha256::new();
    hasher.update(b"chart\0");
    hasher.update(asked.chart.as_bytes());
    for entry in &asked.values {
        let ValuesInput::File(text) = entry else {
            return None;
        };
        hasher.update(b"\0values\0");
        hasher.update((text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    hasher.update(b"\0release\0");
    hasher.update(asked.release_name.as_bytes());
    hasher.update(b"\0");
    hasher.update(asked.namespace.as_bytes());
    Some(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// A values file as data, as Helm reads it; a text that does not parse (helm refuses it when
/// rendering) counts as its text.
fn values_data(text: &str) -> Value {
    match crate::yaml::parse(text) {
        Ok(data) => data,
        Err(_) => serde_json::json!({ "unparsed": text }),
    }
}

/// JSON with object keys sorted and no spaces, whatever order the map keeps them in.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn asked<'a>(values: Vec<ValuesInput<'a>>) -> Asked<'a> {
        Asked {
            chart: "repository https://charts.example.com shop 1.2.3",
            values,
            release_name: "shop",
            namespace: "apps",
            common_metadata: None,
            post_renderers: &[],
        }
    }

    #[test]
    fn values_count_as_data_not_as_text() {
        let a = v3(&asked(vec![ValuesInput::File("a: 1\nb: {c: x}\n")]));
        let b = v3(&asked(vec![ValuesInput::File(
            "# a comment\nb:\n  c: \"x\"\na: 1",
        )]));
        assert_eq!(a, b);
        let c = v3(&asked(vec![ValuesInput::File("a: 2\nb: {c: x}\n")]));
        assert_ne!(a, c);
    }

    #[test]
    fn every_input_moves_the_digest() {
        let base = asked(vec![ValuesInput::File("a: 1")]);
        let digest = v3(&base);
        let mut other = base.clone();
        other.chart = "repository https://charts.example.com shop 1.2.4";
        assert_ne!(v3(&other), digest);
        let mut other = base.clone();
        other.release_name = "shop2";
        assert_ne!(v3(&other), digest);
        let mut other = base.clone();
        other.namespace = "apps2";
        assert_ne!(v3(&other), digest);
        let mut other = base.clone();
        other.values.push(ValuesInput::TargetPath {
            path: "a",
            value: "1",
        });
        assert_ne!(v3(&other), digest);
        let common = CommonMetadata {
            labels: BTreeMap::from([("team".into(), "shop".into())]),
            annotations: BTreeMap::new(),
        };
        let mut other = base.clone();
        other.common_metadata = Some(&common);
        assert_ne!(v3(&other), digest);
        // Stamping nothing is no commonMetadata.
        let empty = CommonMetadata::default();
        let mut other = base.clone();
        other.common_metadata = Some(&empty);
        assert_eq!(v3(&other), digest);
        // A post-renderer, and any change of one.
        let patched = [crate::api::PostRenderer {
            kustomize: Some(crate::api::KustomizePostRenderer {
                patches: vec![crate::api::KustomizePatch {
                    patch: "kind: X".into(),
                    target: None,
                }],
                images: vec![],
            }),
        }];
        let mut other = base.clone();
        other.post_renderers = &patched;
        let with_patch = v3(&other);
        assert_ne!(with_patch, digest);
        let mut changed = patched.clone();
        if let Some(k) = changed[0].kustomize.as_mut() {
            k.patches[0].patch = "kind: Y".into();
        }
        other.post_renderers = &changed;
        assert_ne!(v3(&other), with_patch);
    }

    #[test]
    fn a_stored_digest_is_compared_under_its_scheme() {
        let base = asked(vec![ValuesInput::File("a: 1")]);
        let digests = Digests::of(&base);
        let v1 = digests.v1.clone().expect("v1 expresses plain values files");
        assert!(digests.matches(&digests.current));
        assert!(digests.matches(&v1));
        assert!(!digests.matches("sha256:00"));
        assert!(!digests.matches("v9:sha256:00"));
        assert!(!digests.matches(""));
        let v2 = digests
            .v2
            .clone()
            .expect("v2 expresses a spec without post-renderers");
        assert!(digests.matches(&v2));
        assert_eq!(scheme_of(&v1), Some("v1"));
        assert_eq!(scheme_of(&v2), Some("v2"));
        assert_eq!(scheme_of(&digests.current), Some("v3"));
        // v1 counted the text: a reformatted file is a change under v1, not under v2.
        let reformatted = Digests::of(&asked(vec![ValuesInput::File("a:   1")]));
        assert!(!reformatted.matches(&v1));
        assert!(reformatted.matches(&digests.current));
    }

    #[test]
    fn v1_and_v2_cannot_express_post_renderers() {
        let renderers = [crate::api::PostRenderer::default()];
        let mut with = asked(vec![]);
        with.post_renderers = &renderers;
        let digests = Digests::of(&with);
        assert_eq!((&digests.v1, &digests.v2), (&None, &None));
        // A release a v2 operator deployed before it had post-renderers is not taken for this
        // spec: its stored v2 digest matches nothing.
        let without = Digests::of(&asked(vec![]));
        assert!(!digests.matches(without.v2.as_deref().unwrap()));
    }

    #[test]
    fn v1_cannot_express_target_paths_or_common_metadata() {
        let with_path = asked(vec![ValuesInput::TargetPath {
            path: "a",
            value: "1",
        }]);
        assert_eq!(v1(&with_path), None);
        let common = CommonMetadata {
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([("team".into(), "shop".into())]),
        };
        let mut with_common = asked(vec![]);
        with_common.common_metadata = Some(&common);
        assert_eq!(v1(&with_common), None);
    }
}
