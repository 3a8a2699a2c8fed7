//! The kinds the server serves (built in, and those of established CustomResourceDefinitions),
//! and the discovery documents describing them, shaped like discovery-*.json in the recordings.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{Value, json};

/// How `metadata.name` is validated for a kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NameRule {
    /// RFC 1123 subdomain: most kinds.
    Subdomain,
    /// RFC 1123 label: namespaces.
    Label,
    /// RFC 1035 label: services.
    Rfc1035,
    /// Any path segment (no `/`, `%`, not `.` or `..`): RBAC kinds.
    PathSegment,
}

/// One served resource.
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    /// Served versions, preferred first.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource: writes to the main resource leave `.status` alone.
    pub status: bool,
    /// For custom resources: the openAPIV3Schema of each served version.
    pub schemas: Option<BTreeMap<String, Value>>,
    /// Where the objects are kept: events.k8s.io events are core events seen another way.
    pub storage_group: String,
    pub storage_resource: String,
}

impl ResourceType {
    pub fn is_custom(&self) -> bool {
        self.schemas.is_some()
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Whether `metadata.generation` is kept (the strategies that set it in kube-apiserver).
    pub fn uses_generation(&self) -> bool {
        self.is_custom()
            || matches!(
                self.group.as_str(),
                "apps" | "batch" | "policy" | "apiextensions.k8s.io" | "autoscaling"
            )
            || (self.group == "networking.k8s.io" && self.kind != "IngressClass")
            || (self.group.is_empty() && self.kind == "ReplicationController")
    }

    /// Whether a PUT without resourceVersion is accepted (AllowUnconditionalUpdate).
    pub fn unconditional_update(&self) -> bool {
        !(self.is_custom() || self.kind == "Lease" || self.kind == "CustomResourceDefinition")
    }

    /// Whether a PUT of an absent object creates it (AllowCreateOnUpdate).
    pub fn create_on_update(&self) -> bool {
        !self.is_custom()
            && matches!(
                self.kind.as_str(),
                "Lease" | "Endpoints" | "Event" | "Service" | "Node" | "LimitRange"
            )
    }

    pub fn name_rule(&self) -> NameRule {
        match (self.group.as_str(), self.kind.as_str()) {
            ("", "Namespace") => NameRule::Label,
            ("", "Service") => NameRule::Rfc1035,
            ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
            _ => NameRule::Subdomain,
        }
    }

    /// Has a `log` subresource: Pods.
    pub fn serves_log(&self) -> bool {
        self.group.is_empty() && self.kind == "Pod"
    }

    /// A review answered at once and never stored (SelfSubjectAccessReview).
    pub fn is_review(&self) -> bool {
        self.group == "authorization.k8s.io"
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        if self.is_review() {
            vec!["create"]
        } else if self.group.is_empty() && self.kind == "Namespace" {
            vec![
                "create", "delete", "get", "list", "patch", "update", "watch",
            ]
        } else {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    &'static [&'static str],
    bool,
);

/// (group, version, plural, kind, namespaced, short names, categories, status subresource)
const BUILTINS: &[Builtin] = &[
    (
        "",
        "v1",
        "configmaps",
        "ConfigMap",
        true,
        &["cm"],
        &[],
        false,
    ),
    (
        "",
        "v1",
        "endpoints",
        "Endpoints",
        true,
        &["ep"],
        &[],
        false,
    ),
    ("", "v1", "events", "Event", true, &["ev"], &[], false),
    (
        "",
        "v1",
        "limitranges",
        "LimitRange",
        true,
        &["limits"],
        &[],
        false,
    ),
    (
        "",
        "v1",
        "namespaces",
        "Namespace",
        false,
        &["ns"],
        &[],
        true,
    ),
    ("", "v1", "nodes", "Node", false, &["no"], &[], true),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        &[],
        true,
    ),
    (
        "",
        "v1",
        "persistentvolumes",
        "PersistentVolume",
        false,
        &["pv"],
        &[],
        true,
    ),
    ("", "v1", "pods", "Pod", true, &["po"], &["all"], true),
    (
        "",
        "v1",
        "podtemplates",
        "PodTemplate",
        true,
        &[],
        &[],
        false,
    ),
    (
        "",
        "v1",
        "replicationcontrollers",
        "ReplicationController",
        true,
        &["rc"],
        &["all"],
        true,
    ),
    (
        "",
        "v1",
        "resourcequotas",
        "ResourceQuota",
        true,
        &["quota"],
        &[],
        true,
    ),
    ("", "v1", "secrets", "Secret", true, &[], &[], false),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        &[],
        false,
    ),
    (
        "",
        "v1",
        "services",
        "Service",
        true,
        &["svc"],
        &["all"],
        true,
    ),
    (
        "apps",
        "v1",
        "controllerrevisions",
        "ControllerRevision",
        true,
        &[],
        &[],
        false,
    ),
    (
        "apps",
        "v1",
        "daemonsets",
        "DaemonSet",
        true,
        &["ds"],
        &["all"],
        true,
    ),
    (
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        &["deploy"],
        &["all"],
        true,
    ),
    (
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        true,
        &["rs"],
        &["all"],
        true,
    ),
    (
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        true,
        &["sts"],
        &["all"],
        true,
    ),
    (
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        true,
        &["ev"],
        &[],
        false,
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
        false,
        &[],
        &[],
        false,
    ),
    (
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
        &["all"],
        true,
    ),
    (
        "batch",
        "v1",
        "cronjobs",
        "CronJob",
        true,
        &["cj"],
        &["all"],
        true,
    ),
    ("batch", "v1", "jobs", "Job", true, &[], &["all"], true),
    (
        "networking.k8s.io",
        "v1",
        "ingressclasses",
        "IngressClass",
        false,
        &[],
        &[],
        false,
    ),
    (
        "networking.k8s.io",
        "v1",
        "ingresses",
        "Ingress",
        true,
        &["ing"],
        &[],
        true,
    ),
    (
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        &["netpol"],
        &[],
        false,
    ),
    (
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        &[],
        true,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        &[],
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        &[],
        &[],
        false,
    ),
    (
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        &["sc"],
        &[],
        false,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        &["api-extensions"],
        true,
    ),
    (
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        false,
        &["pc"],
        &[],
        false,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        &[],
        &[],
        false,
    ),
    (
        "apiregistration.k8s.io",
        "v1",
        "apiservices",
        "APIService",
        false,
        &[],
        &["api-extensions"],
        true,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        &[],
        &["api-extensions"],
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        &[],
        &["api-extensions"],
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "ValidatingAdmissionPolicy",
        false,
        &[],
        &["api-extensions"],
        true,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "ValidatingAdmissionPolicyBinding",
        false,
        &[],
        &["api-extensions"],
        false,
    ),
    (
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        &[],
        &[],
        false,
    ),
];

/// The built-in groups in the order a 1.28 server lists them under /apis.
pub const BUILTIN_GROUPS: &[&str] = &[
    "apiregistration.k8s.io",
    "apps",
    "events.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
];

pub fn builtins() -> &'static [ResourceType] {
    static TYPES: OnceLock<Vec<ResourceType>> = OnceLock::new();
    TYPES.get_or_init(|| {
        BUILTINS
            .iter()
            .map(
                |&(group, version, plural, kind, namespaced, short, categories, status)| {
                    // HorizontalPodAutoscaler: v2 preferred (and stored), v1 too.
                    let versions = if group == "autoscaling" {
                        vec![version.into(), "v1".into()]
                    } else {
                        vec![version.into()]
                    };
                    ResourceType {
                        group: group.into(),
                        versions,
                        plural: plural.into(),
                        singular: kind.to_lowercase(),
                        kind: kind.into(),
                        namespaced,
                        short_names: short.iter().map(|s| s.to_string()).collect(),
                        categories: categories.iter().map(|s| s.to_string()).collect(),
                        status,
                        schemas: None,
                        storage_group: if group == "events.k8s.io" {
                            String::new()
                        } else {
                            group.into()
                        },
                        storage_resource: plural.into(),
                    }
                },
            )
            .collect()
    })
}

/// The `APIResource` entries of one group version (`resources` of an APIResourceList).
pub fn api_resources(types: &[&ResourceType]) -> Vec<Value> {
    let mut out = Vec::new();
    let mut sorted: Vec<&&ResourceType> = types.iter().collect();
    sorted.sort_by(|a, b| a.plural.cmp(&b.plural));
    for rt in sorted {
        let mut r = json!({
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": rt.verbs(),
        });
        if !rt.short_names.is_empty() {
            r["shortNames"] = json!(rt.short_names);
        }
        if !rt.categories.is_empty() {
            r["categories"] = json!(rt.categories);
        }
        out.push(r);
        if rt.serves_log() {
            out.push(json!({
                "name": format!("{}/log", rt.plural),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get"],
            }));
        }
        if rt.status {
            out.push(json!({
                "name": format!("{}/status", rt.plural),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    out
}

/// The `APIResourceDiscovery` entries of one group version (aggregated discovery, v2beta1).
pub fn aggregated_resources(types: &[&ResourceType], version: &str) -> Vec<Value> {
    let mut sorted: Vec<&&ResourceType> = types.iter().collect();
    sorted.sort_by(|a, b| a.plural.cmp(&b.plural));
    sorted
        .into_iter()
        .map(|rt| {
            let kind = json!({"group": rt.group, "version": version, "kind": rt.kind});
            let mut r = json!({
                "resource": rt.plural,
                "responseKind": kind,
                "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": rt.singular,
                "verbs": rt.verbs(),
            });
            if !rt.short_names.is_empty() {
                r["shortNames"] = json!(rt.short_names);
            }
            if !rt.categories.is_empty() {
                r["categories"] = json!(rt.categories);
            }
            let mut subresources = Vec::new();
            if rt.serves_log() {
                subresources
                    .push(json!({"subresource": "log", "responseKind": kind, "verbs": ["get"]}));
            }
            if rt.status {
                subresources.push(json!({
                    "subresource": "status",
                    "responseKind": kind,
                    "verbs": ["get", "patch", "update"],
                }));
            }
            if !subresources.is_empty() {
                r["subresources"] = Value::Array(subresources);
            }
            r
        })
        .collect()
}

/// The APIGroup object of a group with the given versions, preferred first.
pub fn api_group(name: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}
