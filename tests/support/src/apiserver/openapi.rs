//! OpenAPI v3 as kube-apiserver serves it at `/openapi/v3` (an index of group versions) and
//! `/openapi/v3/api/v1`, `/openapi/v3/apis/GROUP/VERSION` (one document each): the paths of
//! every resource with their operations, each tagged `x-kubernetes-action` and
//! `x-kubernetes-group-version-kind`, and the query parameters a write takes (`dryRun`,
//! `fieldManager`, `fieldValidation`, `force` for patches).
//!
//! Clients read these to learn whether the server validates fields itself: kubectl's and
//! Helm's `fieldValidation` verifier (cli-runtime `query_param_verifier_v3.go`) looks for the
//! `fieldValidation` query parameter of the PATCH operation of an object's kind, and when the
//! server has it, leaves schema validation to the server (which then answers
//! `fieldValidation=Strict`, see store.rs) instead of downloading OpenAPI v2.
//!
//! Known differences: the documents hold no schemas (`components.schemas` is empty), so
//! `kubectl explain` and client-side schema validation find nothing; no watch paths, no
//! `/openapi/v2`; the `hash` in the index is the document's own digest, not kube-openapi's.

use serde_json::{Map, Value, json};

use super::resources::ResourceType;

/// The path of a group version under /openapi/v3 and in the index: `api/v1`, `apis/apps/v1`.
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The `/openapi/v3` index of the group versions `served` (group, versions).
pub fn index(served: &[(String, Vec<String>)], document: impl Fn(&str, &str) -> Value) -> Value {
    let mut paths = Map::new();
    for (group, versions) in served {
        for version in versions {
            let path = gv_path(group, version);
            let hash = digest(&document(group, version));
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
            );
        }
    }
    json!({ "paths": paths })
}

/// A short stable digest of a document, for the index's `hash`.
fn digest(document: &Value) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    document.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

/// The group version a `/openapi/v3/...` path names: `api/v1` -> ("", "v1").
pub fn parse(rest: &[&str]) -> Option<(String, String)> {
    match rest {
        ["api", version] => Some((String::new(), version.to_string())),
        ["apis", group, version] => Some((group.to_string(), version.to_string())),
        _ => None,
    }
}

fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description,
           "schema": {"type": "string", "uniqueItems": true}})
}

fn path_parameter(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "description": description, "required": true,
           "schema": {"type": "string", "uniqueItems": true}})
}

/// The query parameters of a create, update or patch.
fn write_parameters(patch: bool) -> Vec<Value> {
    let mut out = vec![
        query(
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
        ),
        query(
            "fieldManager",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        query(
            "fieldValidation",
            "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn - Strict",
        ),
    ];
    if patch {
        out.push(json!({"name": "force", "in": "query",
            "description": "Force is going to \"force\" Apply requests.",
            "schema": {"type": "boolean", "uniqueItems": true}}));
    }
    out
}

/// The operation id's kind part, as kube-openapi writes it: `CoreV1`, `AppsV1`,
/// `RbacAuthorizationV1`.
fn id_prefix(group: &str, version: &str) -> String {
    let group = if group.is_empty() { "core" } else { group };
    let mut out = String::new();
    let trimmed = group.strip_suffix(".k8s.io").unwrap_or(group);
    for word in trimmed.split(['.', '-']) {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    let mut chars = version.chars();
    if let Some(first) = chars.next() {
        out.extend(first.to_uppercase());
        out.push_str(chars.as_str());
    }
    out
}

fn operation(
    action: &str,
    id: String,
    gvk: &Value,
    parameters: Vec<Value>,
    description: &str,
) -> Value {
    json!({
        "description": description,
        "operationId": id,
        "parameters": parameters,
        "responses": {"200": {"description": "OK"}, "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk,
    })
}

/// The document of one group version: the collection and item paths of each of `types`.
pub fn document(group: &str, version: &str, types: &[ResourceType]) -> Value {
    let mut paths = Map::new();
    let prefix = id_prefix(group, version);
    for rt in types {
        let gvk = json!({"group": group, "version": version, "kind": rt.kind});
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let (collection, scope) = if rt.namespaced {
            (
                format!("{base}/namespaces/{{namespace}}/{}", rt.plural),
                "Namespaced",
            )
        } else {
            (format!("{base}/{}", rt.plural), "")
        };
        let kind = &rt.kind;
        let verbs = rt.verbs();
        let has = |v: &str| verbs.contains(&v);
        let mut common = vec![query(
            "pretty",
            "If 'true', then the output is pretty printed.",
        )];
        if rt.namespaced {
            common.push(path_parameter(
                "namespace",
                "object name and auth scope, such as for teams and projects",
            ));
        }
        let mut item_common = vec![path_parameter("name", &format!("name of the {kind}"))];
        item_common.extend(common.clone());

        let mut ops = Map::new();
        if has("list") {
            ops.insert(
                "get".into(),
                operation(
                    "list",
                    format!("list{prefix}{scope}{kind}"),
                    &gvk,
                    Vec::new(),
                    &format!("list or watch objects of kind {kind}"),
                ),
            );
        }
        if has("create") {
            ops.insert(
                "post".into(),
                operation(
                    "post",
                    format!("create{prefix}{scope}{kind}"),
                    &gvk,
                    write_parameters(false),
                    &format!("create a {kind}"),
                ),
            );
        }
        if has("deletecollection") {
            ops.insert(
                "delete".into(),
                operation(
                    "deletecollection",
                    format!("deleteCollection{prefix}{scope}{kind}"),
                    &gvk,
                    Vec::new(),
                    &format!("delete collection of {kind}"),
                ),
            );
        }
        if !ops.is_empty() {
            ops.insert("parameters".into(), Value::Array(common.clone()));
            paths.insert(collection.clone(), Value::Object(ops));
        }

        let mut item = Map::new();
        if has("get") {
            item.insert(
                "get".into(),
                operation(
                    "get",
                    format!("read{prefix}{scope}{kind}"),
                    &gvk,
                    Vec::new(),
                    &format!("read the specified {kind}"),
                ),
            );
        }
        if has("update") {
            item.insert(
                "put".into(),
                operation(
                    "put",
                    format!("replace{prefix}{scope}{kind}"),
                    &gvk,
                    write_parameters(false),
                    &format!("replace the specified {kind}"),
                ),
            );
        }
        if has("patch") {
            item.insert(
                "patch".into(),
                operation(
                    "patch",
                    format!("patch{prefix}{scope}{kind}"),
                    &gvk,
                    write_parameters(true),
                    &format!("partially update the specified {kind}"),
                ),
            );
        }
        if has("delete") {
            item.insert(
                "delete".into(),
                operation(
                    "delete",
                    format!("delete{prefix}{scope}{kind}"),
                    &gvk,
                    vec![query(
                        "dryRun",
                        "When present, indicates that modifications should not be persisted.",
                    )],
                    &format!("delete a {kind}"),
                ),
            );
        }
        if !item.is_empty() {
            item.insert("parameters".into(), Value::Array(item_common.clone()));
            paths.insert(format!("{collection}/{{name}}"), Value::Object(item));
        }
        if rt.status {
            let mut status = Map::new();
            for (method, action, verb, params) in [
                ("get", "get", "read", Vec::new()),
                ("put", "put", "replace", write_parameters(false)),
                ("patch", "patch", "patch", write_parameters(true)),
            ] {
                status.insert(
                    method.into(),
                    operation(
                        action,
                        format!("{verb}{prefix}{scope}{kind}Status"),
                        &gvk,
                        params,
                        &format!("{verb} status of the specified {kind}"),
                    ),
                );
            }
            status.insert("parameters".into(), Value::Array(item_common));
            paths.insert(
                format!("{collection}/{{name}}/status"),
                Value::Object(status),
            );
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.28.7"},
        "paths": paths,
        "components": {"schemas": {}},
    })
}
