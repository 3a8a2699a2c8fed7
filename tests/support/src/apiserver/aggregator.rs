//! The aggregation layer (k8s.io/kube-aggregator): an APIService with `spec.service` hands its
//! group version to an extension API server behind that Service. Its availability controller
//! writes the `Available` condition; discovery lists the group whether or not it is available
//! (aggregated discovery marks the version `Stale`); a request under `/apis/G/V` of an
//! APIService that is not available gets 503 `service unavailable` in plain text
//! (handler_proxy.go). Recorded in aggregated-api-unavailable.json.
//!
//! There is no network behind a Service here: an extension API server is "running" when a
//! test registered its resources ([`super::TestApiServer::serve_aggregated`]), and it answers
//! list and get of empty collections.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::errors::ApiError;
use super::store::{Key, State};
use super::util::{at, now_time, str_at};

/// One resource an aggregated API server serves.
#[derive(Debug, Clone)]
pub struct Resource {
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
}

/// The extension API servers that run: (group, version) to what each serves.
pub type Backends = BTreeMap<(String, String), Vec<Resource>>;

/// An APIService that routes its group version to a Service.
pub struct Remote {
    pub group: String,
    pub version: String,
    /// Its `Available` condition is True: requests are proxied.
    pub available: bool,
    group_priority: i64,
    version_priority: i64,
}

const GROUP: &str = "apiregistration.k8s.io";
const RESOURCE: &str = "apiservices";

fn int_at(v: &Value, path: &[&str]) -> i64 {
    at(v, path).and_then(Value::as_i64).unwrap_or(0)
}

/// Whether the APIService's `Available` condition is True.
pub fn is_available(apiservice: &Value) -> bool {
    at(apiservice, &["status", "conditions"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Available" && c["status"] == "True")
}

/// The APIServices with a `spec.service`, in the order /apis lists groups: higher
/// groupPriorityMinimum first, then by name.
pub fn remotes(state: &State) -> Vec<Remote> {
    let mut out: Vec<Remote> = state
        .of_resource(GROUP, RESOURCE, None)
        .filter(|(_, o)| at(o, &["spec", "service"]).is_some_and(|s| !s.is_null()))
        .map(|(_, o)| Remote {
            group: str_at(o, &["spec", "group"]).unwrap_or("").to_string(),
            version: str_at(o, &["spec", "version"]).unwrap_or("").to_string(),
            available: is_available(o),
            group_priority: int_at(o, &["spec", "groupPriorityMinimum"]),
            version_priority: int_at(o, &["spec", "versionPriority"]),
        })
        .filter(|r| !r.group.is_empty() && !r.version.is_empty())
        .collect();
    out.sort_by(|a, b| {
        (b.group_priority, &a.group, b.version_priority, &a.version).cmp(&(
            a.group_priority,
            &b.group,
            a.version_priority,
            &b.version,
        ))
    });
    out
}

/// Whether `group`/`version` belongs to an extension API server, and if so whether it is
/// available.
pub fn remote(state: &State, group: &str, version: &str) -> Option<bool> {
    remotes(state)
        .into_iter()
        .find(|r| r.group == group && r.version == version)
        .map(|r| r.available)
}

/// The `Available` condition the availability controllers give an APIService: (status,
/// reason, message), in the order remote_available_controller.go checks. A running backend
/// (a registered one) stands for the Service's endpoints and its answer to discovery.
pub fn availability(state: &State, apiservice: &Value) -> (bool, &'static str, String) {
    let Some(service) = at(apiservice, &["spec", "service"]).filter(|s| !s.is_null()) else {
        return (
            true,
            "Local",
            "Local APIServices are always available".into(),
        );
    };
    let name = service.get("name").and_then(Value::as_str).unwrap_or("");
    let namespace = service
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let port = service.get("port").and_then(Value::as_i64).unwrap_or(443);
    let group = str_at(apiservice, &["spec", "group"]).unwrap_or("");
    let version = str_at(apiservice, &["spec", "version"]).unwrap_or("");
    let key = Key {
        group: String::new(),
        resource: "services".into(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    let Some(svc) = state.objects.get(&key) else {
        return (
            false,
            "ServiceNotFound",
            format!("service/{name} in \"{namespace}\" is not present"),
        );
    };
    let running = state
        .backends
        .contains_key(&(group.to_string(), version.to_string()));
    let type_ = str_at(svc, &["spec", "type"]).unwrap_or("ClusterIP");
    if type_ == "ClusterIP" {
        let found = at(svc, &["spec", "ports"])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("port").and_then(Value::as_i64) == Some(port));
        let Some(found) = found else {
            return (
                false,
                "ServicePortError",
                format!("service/{name} in \"{namespace}\" is not listening on port {port}"),
            );
        };
        if !running {
            let port_name = found.get("name").and_then(Value::as_str).unwrap_or("");
            return (
                false,
                "MissingEndpoints",
                format!(
                    "endpointslices for service/{name} in \"{namespace}\" have no addresses with port name \"{port_name}\""
                ),
            );
        }
    }
    if !running {
        let host = match type_ {
            "ExternalName" => str_at(svc, &["spec", "externalName"]).unwrap_or(""),
            _ => str_at(svc, &["spec", "clusterIP"]).unwrap_or(""),
        };
        let url = format!("https://{host}:{port}/apis/{group}/{version}");
        return (
            false,
            "FailedDiscoveryCheck",
            format!(
                "failing or missing response from {url}: Get \"{url}\": dial tcp {host}:{port}: connect: connection refused"
            ),
        );
    }
    (true, "Passed", "all checks passed".into())
}

/// Sets the `Available` condition as SetAPIServiceCondition does: the transition time changes
/// with the status only.
pub fn set_available(apiservice: &mut Value, available: bool, reason: &str, message: &str) {
    let status = if available { "True" } else { "False" };
    let Some(obj) = apiservice.as_object_mut() else {
        return;
    };
    let s = obj.entry("status").or_insert_with(|| json!({}));
    if !s.is_object() {
        *s = json!({});
    }
    let conditions = s
        .as_object_mut()
        .map(|m| m.entry("conditions").or_insert_with(|| json!([])));
    let Some(Value::Array(list)) = conditions else {
        return;
    };
    match list.iter_mut().find(|c| c["type"] == "Available") {
        Some(c) => {
            if c["status"] != status {
                c["status"] = json!(status);
                c["lastTransitionTime"] = json!(now_time());
            }
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
        None => list.push(json!({
            "type": "Available",
            "status": status,
            "lastTransitionTime": now_time(),
            "reason": reason,
            "message": message,
        })),
    }
}

fn verbs() -> Value {
    json!(["get", "list"])
}

/// The APIResourceList an extension API server answers for its group version.
pub fn resource_list(group: &str, version: &str, resources: &[Resource]) -> Value {
    let list: Vec<Value> = resources
        .iter()
        .map(|r| {
            json!({"name": r.plural, "singularName": r.kind.to_lowercase(),
                   "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs()})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1",
           "groupVersion": format!("{group}/{version}"), "resources": list})
}

/// The aggregated discovery entries of a running extension API server's resources.
pub fn discovery_resources(group: &str, version: &str, resources: &[Resource]) -> Vec<Value> {
    resources
        .iter()
        .map(|r| {
            json!({
                "resource": r.plural,
                "responseKind": {"group": group, "version": version, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.kind.to_lowercase(),
                "verbs": verbs(),
            })
        })
        .collect()
}

/// What a running extension API server answers under `/apis/G/V/`: `rest` is the path after
/// it. Its collections are empty.
pub fn serve(
    get: bool,
    group: &str,
    version: &str,
    resources: &[Resource],
    rest: &[&str],
) -> Result<Value, ApiError> {
    if rest.is_empty() {
        return if get {
            Ok(resource_list(group, version, resources))
        } else {
            Err(ApiError::method_not_allowed())
        };
    }
    let (plural, name, namespaced) = match rest {
        ["namespaces", _, plural] => (*plural, "", true),
        ["namespaces", _, plural, name] => (*plural, *name, true),
        [plural] => (*plural, "", false),
        [plural, name] => (*plural, *name, false),
        _ => return Err(ApiError::no_such_resource()),
    };
    let Some(r) = resources
        .iter()
        .find(|r| r.plural == plural && (r.namespaced || !namespaced))
    else {
        return Err(ApiError::no_such_resource());
    };
    if !get {
        return Err(ApiError::method_not_allowed());
    }
    if name.is_empty() {
        return Ok(json!({"kind": format!("{}List", r.kind),
                         "apiVersion": format!("{group}/{version}"),
                         "metadata": {}, "items": []}));
    }
    Err(ApiError::not_found(group, plural, name))
}
