//! Decoding as the server does: built-in kinds go through their typed form (k8s-openapi), which
//! drops unknown fields and rejects wrong types; custom resources are pruned, defaulted and
//! checked against their openAPIV3Schema. Also the defaults the server fills in for built-in
//! kinds, the CustomResourceDefinition checks and the events.k8s.io <-> core Event conversion.

use serde_json::{Map, Value, json};

use super::errors::{FieldError, quote};
use super::resources::ResourceType;
use super::util::{at, obj_mut, str_at};

/// Why an object could not be decoded.
pub enum DecodeError {
    /// 400: `<Kind> in version "v1" cannot be handled as a <Kind>: <why>`
    BadRequest(String),
    /// 422 with these field errors.
    Invalid(Vec<FieldError>),
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(v: Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(v).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

macro_rules! typed_kinds {
    ($group:expr, $kind:expr, $value:expr, { $($g:literal, $k:literal => $t:ty;)* }) => {
        match ($group, $kind) {
            $(($g, $k) => Some(roundtrip::<$t>($value)),)*
            _ => None,
        }
    };
}

fn typed_roundtrip(group: &str, kind: &str, v: Value) -> Option<Result<Value, String>> {
    use k8s_openapi::api::{admissionregistration, discovery};
    use k8s_openapi::api::{
        apps, autoscaling, batch, coordination, core, events, networking, policy, rbac, scheduling,
        storage,
    };
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as aggregator;
    typed_kinds!(group, kind, v, {
        "", "ConfigMap" => core::v1::ConfigMap;
        "", "Endpoints" => core::v1::Endpoints;
        "", "Event" => core::v1::Event;
        "", "LimitRange" => core::v1::LimitRange;
        "", "Namespace" => core::v1::Namespace;
        "", "Node" => core::v1::Node;
        "", "PersistentVolumeClaim" => core::v1::PersistentVolumeClaim;
        "", "PersistentVolume" => core::v1::PersistentVolume;
        "", "Pod" => core::v1::Pod;
        "", "PodTemplate" => core::v1::PodTemplate;
        "", "ReplicationController" => core::v1::ReplicationController;
        "", "ResourceQuota" => core::v1::ResourceQuota;
        "", "Secret" => core::v1::Secret;
        "", "ServiceAccount" => core::v1::ServiceAccount;
        "", "Service" => core::v1::Service;
        "apps", "ControllerRevision" => apps::v1::ControllerRevision;
        "apps", "DaemonSet" => apps::v1::DaemonSet;
        "apps", "Deployment" => apps::v1::Deployment;
        "apps", "ReplicaSet" => apps::v1::ReplicaSet;
        "apps", "StatefulSet" => apps::v1::StatefulSet;
        "events.k8s.io", "Event" => events::v1::Event;
        "autoscaling", "HorizontalPodAutoscaler" => autoscaling::v2::HorizontalPodAutoscaler;
        "batch", "CronJob" => batch::v1::CronJob;
        "batch", "Job" => batch::v1::Job;
        "networking.k8s.io", "IngressClass" => networking::v1::IngressClass;
        "networking.k8s.io", "Ingress" => networking::v1::Ingress;
        "networking.k8s.io", "NetworkPolicy" => networking::v1::NetworkPolicy;
        "policy", "PodDisruptionBudget" => policy::v1::PodDisruptionBudget;
        "rbac.authorization.k8s.io", "ClusterRoleBinding" => rbac::v1::ClusterRoleBinding;
        "rbac.authorization.k8s.io", "ClusterRole" => rbac::v1::ClusterRole;
        "rbac.authorization.k8s.io", "RoleBinding" => rbac::v1::RoleBinding;
        "rbac.authorization.k8s.io", "Role" => rbac::v1::Role;
        "storage.k8s.io", "StorageClass" => storage::v1::StorageClass;
        "apiextensions.k8s.io", "CustomResourceDefinition" => apiext::CustomResourceDefinition;
        "scheduling.k8s.io", "PriorityClass" => scheduling::v1::PriorityClass;
        "coordination.k8s.io", "Lease" => coordination::v1::Lease;
        "apiregistration.k8s.io", "APIService" => aggregator::APIService;
        "admissionregistration.k8s.io", "MutatingWebhookConfiguration" => admissionregistration::v1::MutatingWebhookConfiguration;
        "admissionregistration.k8s.io", "ValidatingWebhookConfiguration" => admissionregistration::v1::ValidatingWebhookConfiguration;
        "discovery.k8s.io", "EndpointSlice" => discovery::v1::EndpointSlice;
    })
}

/// Decodes `obj` (already checked for apiVersion and kind) as an object of `rt` at `version`.
pub fn decode(rt: &ResourceType, version: &str, obj: Value) -> Result<Value, DecodeError> {
    let cannot = |why: &str| {
        format!(
            "{} in version {} cannot be handled as a {}: {why}",
            rt.kind,
            quote(version),
            rt.kind
        )
    };
    for path in super::validation::micro_time_fields(&rt.group, &rt.kind) {
        if let Some(Value::String(s)) = at(&obj, path) {
            super::validation::parse_micro_time(s)
                .map_err(|e| DecodeError::BadRequest(cannot(&e)))?;
        }
    }
    if let Some(schemas) = &rt.schemas {
        let mut obj = obj;
        let mut errs = Vec::new();
        if let Some(schema) = schemas.get(version) {
            prune_root(schema, &mut obj, &mut errs);
        }
        if !errs.is_empty() {
            return Err(DecodeError::Invalid(errs));
        }
        return Ok(obj);
    }
    if let Err(e) = check_quantities(&obj, false) {
        return Err(DecodeError::BadRequest(cannot(e)));
    }
    let typed = if super::convert::is_hpa_v1(&rt.group, &rt.kind, version) {
        Some(roundtrip::<
            k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler,
        >(obj.clone()))
    } else {
        typed_roundtrip(&rt.group, &rt.kind, obj.clone())
    };
    match typed {
        None => Ok(obj),
        Some(Ok(mut v)) => {
            drop_invented(&obj, &mut v);
            Ok(v)
        }
        Some(Err(e)) => match e
            .strip_prefix("missing field `")
            .and_then(|r| r.split_once('`'))
        {
            Some((field, _)) => Err(DecodeError::Invalid(vec![FieldError::required(
                field.to_string(),
                "",
            )])),
            None => Err(DecodeError::BadRequest(cannot(&e))),
        },
    }
}

/// The maps whose values are resource.Quantity.
const QUANTITY_MAPS: &[&str] = &[
    "limits",
    "requests",
    "hard",
    "used",
    "capacity",
    "allocatable",
    "max",
    "min",
    "default",
    "defaultRequest",
    "maxLimitRequestRatio",
];

/// resource.ParseQuantity's verdict on `s`.
fn parse_quantity(s: &str) -> Result<(), &'static str> {
    const FORMAT: &str = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let number_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(number_len);
    if number.is_empty()
        || !number.chars().any(|c| c.is_ascii_digit())
        || number.matches('.').count() > 1
    {
        return Err(FORMAT);
    }
    let letters_len = suffix
        .find(|c: char| !"eEinumkKMGTP".contains(c))
        .unwrap_or(suffix.len());
    let (letters, exponent) = suffix.split_at(letters_len);
    let exp_digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    if !exp_digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(FORMAT);
    }
    let known = matches!(
        letters,
        "" | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
            | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
    );
    let exponent_form = matches!(letters, "e" | "E") && !exp_digits.is_empty();
    if (known && exponent.is_empty()) || exponent_form {
        Ok(())
    } else {
        Err("unable to parse quantity's suffix")
    }
}

/// Checks every Quantity of a built-in object (resources, quotas, limit ranges, sizeLimit).
fn check_quantities(v: &Value, in_quantity_map: bool) -> Result<(), &'static str> {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if in_quantity_map || k == "sizeLimit" {
                    match x {
                        Value::String(s) => parse_quantity(s)?,
                        Value::Number(_) | Value::Null => {}
                        other => check_quantities(other, false)?,
                    }
                } else {
                    check_quantities(x, QUANTITY_MAPS.contains(&k.as_str()))?;
                }
            }
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(|x| check_quantities(x, false)),
        _ => Ok(()),
    }
}

/// k8s-openapi fills a missing required field with its default; Go leaves it nil. Takes out
/// what the typed form added that is empty, so that validation sees the field missing.
fn drop_invented(input: &Value, output: &mut Value) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            o.retain(|k, v| {
                i.contains_key(k)
                    || !(v.is_null()
                        || v.as_object().is_some_and(|m| m.is_empty())
                        || v.as_array().is_some_and(|a| a.is_empty())
                        || v.as_str() == Some(""))
            });
            for (k, v) in o.iter_mut() {
                if let Some(x) = i.get(k) {
                    drop_invented(x, v);
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (x, v) in i.iter().zip(o.iter_mut()) {
                drop_invented(x, v);
            }
        }
        _ => {}
    }
}

/// The entries of `ports` (a container's or a Service's) that are objects.
fn ports(m: &mut Map<String, Value>) -> impl Iterator<Item = &mut Map<String, Value>> {
    m.get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

fn set_default(m: &mut Map<String, Value>, k: &str, v: Value) {
    if m.get(k).is_none_or(Value::is_null) {
        m.insert(k.to_string(), v);
    }
}

fn default_pod_spec(spec: &mut Value, is_pod: bool) {
    let Value::Object(s) = spec else { return };
    set_default(s, "restartPolicy", json!("Always"));
    set_default(s, "terminationGracePeriodSeconds", json!(30));
    set_default(s, "dnsPolicy", json!("ClusterFirst"));
    set_default(s, "securityContext", json!({}));
    set_default(s, "schedulerName", json!("default-scheduler"));
    if is_pod {
        set_default(s, "enableServiceLinks", json!(true));
        set_default(s, "preemptionPolicy", json!("PreemptLowerPriority"));
        set_default(s, "priority", json!(0));
    }
    if let Some(sa) = s.get("serviceAccountName").cloned() {
        set_default(s, "serviceAccount", sa);
    }
    for list in ["containers", "initContainers"] {
        for c in s
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Value::Object(c) = c else { continue };
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            let last = image.rsplit('/').next().unwrap_or("");
            let latest = !image.contains('@') && (!last.contains(':') || last.ends_with(":latest"));
            set_default(
                c,
                "imagePullPolicy",
                json!(if latest { "Always" } else { "IfNotPresent" }),
            );
            set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
            set_default(c, "terminationMessagePolicy", json!("File"));
            set_default(c, "resources", json!({}));
            for p in ports(c) {
                set_default(p, "protocol", json!("TCP"));
            }
        }
    }
}

fn default_template(obj: &mut Value, path: &[&str]) {
    if at(obj, path).is_none() {
        return;
    }
    let t = obj_mut(obj, path);
    let meta = t.entry("metadata").or_insert_with(|| json!({}));
    if let Value::Object(m) = meta {
        m.entry("creationTimestamp").or_insert(Value::Null);
    }
    if let Some(spec) = t.get_mut("spec") {
        default_pod_spec(spec, false);
    }
}

/// The defaults kube-apiserver fills in when it decodes a built-in kind.
pub fn apply_defaults(rt: &ResourceType, obj: &mut Value) {
    if rt.is_custom() {
        return;
    }
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Namespace") => {
            if let Some(name) = str_at(obj, &["metadata", "name"]).map(String::from) {
                obj_mut(obj, &["metadata", "labels"])
                    .insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        ("", "Secret") => {
            let m = obj_mut(obj, &[]);
            set_default(m, "type", json!("Opaque"));
        }
        // A core Event's MicroTime is a struct, never left out: `null` when unset.
        ("", "Event") => {
            set_default(obj_mut(obj, &[]), "eventTime", Value::Null);
        }
        ("", "Pod") => {
            if let Some(spec) = obj.get_mut("spec") {
                default_pod_spec(spec, true);
            }
        }
        ("", "Service") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "type", json!("ClusterIP"));
            set_default(spec, "sessionAffinity", json!("None"));
            let type_ = spec
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if type_ != "ExternalName" {
                set_default(spec, "internalTrafficPolicy", json!("Cluster"));
            }
            if type_ == "NodePort" || type_ == "LoadBalancer" {
                set_default(spec, "externalTrafficPolicy", json!("Cluster"));
            }
            for p in ports(spec) {
                set_default(p, "protocol", json!("TCP"));
                if let Some(port) = p.get("port").cloned() {
                    set_default(p, "targetPort", port);
                }
            }
        }
        ("", "PersistentVolumeClaim") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "volumeMode", json!("Filesystem"));
        }
        ("apps", "Deployment") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "replicas", json!(1));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            set_default(spec, "strategy", json!({}));
            if let Some(Value::Object(s)) = spec.get_mut("strategy") {
                set_default(s, "type", json!("RollingUpdate"));
                if s.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
                    set_default(s, "rollingUpdate", json!({}));
                    if let Some(Value::Object(r)) = s.get_mut("rollingUpdate") {
                        set_default(r, "maxUnavailable", json!("25%"));
                        set_default(r, "maxSurge", json!("25%"));
                    }
                }
            }
            default_template(obj, &["spec", "template"]);
        }
        ("apps", "ReplicaSet") => {
            set_default(obj_mut(obj, &["spec"]), "replicas", json!(1));
            default_template(obj, &["spec", "template"]);
        }
        ("apps", "StatefulSet") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "replicas", json!(1));
            set_default(spec, "podManagementPolicy", json!("OrderedReady"));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            set_default(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
            default_template(obj, &["spec", "template"]);
        }
        ("apps", "DaemonSet") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
            default_template(obj, &["spec", "template"]);
        }
        ("batch", "Job") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "parallelism", json!(1));
            set_default(spec, "completions", json!(1));
            set_default(spec, "backoffLimit", json!(6));
            set_default(spec, "completionMode", json!("NonIndexed"));
            set_default(spec, "suspend", json!(false));
            default_template(obj, &["spec", "template"]);
        }
        ("batch", "CronJob") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "concurrencyPolicy", json!("Allow"));
            set_default(spec, "suspend", json!(false));
            set_default(spec, "successfulJobsHistoryLimit", json!(3));
            set_default(spec, "failedJobsHistoryLimit", json!(1));
            default_template(obj, &["spec", "jobTemplate", "spec", "template"]);
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            for subject in obj
                .get_mut("subjects")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let Value::Object(s) = subject else { continue };
                let group = match s.get("kind").and_then(Value::as_str) {
                    Some("User" | "Group") => "rbac.authorization.k8s.io",
                    _ => "",
                };
                if s.get("apiGroup")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    s.insert("apiGroup".into(), json!(group));
                }
                if group.is_empty() && s.get("apiGroup").and_then(Value::as_str) == Some("") {
                    s.remove("apiGroup");
                }
            }
        }
        ("networking.k8s.io", "NetworkPolicy") => {
            let spec = obj_mut(obj, &["spec"]);
            if spec.get("policyTypes").is_none() {
                let mut types = vec![json!("Ingress")];
                if spec.get("egress").is_some() {
                    types.push(json!("Egress"));
                }
                spec.insert("policyTypes".into(), Value::Array(types));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            let spec = obj_mut(obj, &["spec"]);
            set_default(spec, "conversion", json!({"strategy": "None"}));
            if let Some(Value::Object(names)) = spec.get_mut("names")
                && let Some(kind) = names.get("kind").and_then(Value::as_str).map(String::from)
            {
                set_default(names, "singular", json!(kind.to_lowercase()));
                set_default(names, "listKind", json!(format!("{kind}List")));
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(want: &str, v: &Value) -> bool {
    match want {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        _ => true,
    }
}

fn preserves(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

fn prune_root(schema: &Value, obj: &mut Value, errs: &mut Vec<FieldError>) {
    let Value::Object(m) = obj else { return };
    let metadata = m.remove("metadata");
    let api_version = m.remove("apiVersion");
    let kind = m.remove("kind");
    walk_schema(schema, obj, "", errs);
    if let Value::Object(m) = obj {
        for (k, v) in [
            ("apiVersion", api_version),
            ("kind", kind),
            ("metadata", metadata),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        }
    }
}

fn child_path(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// Prunes unknown fields and nulls, fills defaults and checks types, enums and required fields.
fn walk_schema(schema: &Value, v: &mut Value, path: &str, errs: &mut Vec<FieldError>) {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            errs.push(FieldError::invalid(
                path,
                type_name(v),
                format!(
                    "{path} in body must be of type int-or-string: {}",
                    quote(type_name(v))
                ),
            ));
        }
        return;
    }
    if let Some(want) = schema.get("type").and_then(Value::as_str)
        && !type_ok(want, v)
    {
        let shown = if path.is_empty() {
            "body".to_string()
        } else {
            format!("{path} in body")
        };
        errs.push(FieldError::invalid(
            path,
            type_name(v),
            format!("{shown} must be of type {want}: {}", quote(type_name(v))),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        let shown: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        errs.push(FieldError {
            kind: super::errors::FieldErrorKind::NotSupported(v.to_string()),
            field: path.to_string(),
            detail: format!("supported values: {}", shown.join(", ")),
        });
    }
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keep_unknown = preserves(schema) || additional == Some(&Value::Bool(true));
            let embedded = schema.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let child_schema = props
                    .and_then(|p| p.get(&k))
                    .or(additional.filter(|a| a.is_object()));
                let is_null = m.get(&k).is_some_and(Value::is_null);
                match child_schema {
                    Some(cs) => {
                        if is_null {
                            if cs.get("nullable") != Some(&Value::Bool(true)) {
                                m.remove(&k);
                            }
                            continue;
                        }
                        if let Some(child) = m.get_mut(&k) {
                            walk_schema(cs, child, &child_path(path, &k), errs);
                        }
                    }
                    None => {
                        let meta_field =
                            embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata");
                        if !keep_unknown && !meta_field {
                            m.remove(&k);
                        }
                    }
                }
            }
            if let Some(props) = props {
                for (k, cs) in props {
                    if !m.contains_key(k)
                        && let Some(d) = cs.get("default")
                    {
                        m.insert(k.clone(), d.clone());
                    }
                }
            }
            for r in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(r) = r.as_str()
                    && !m.contains_key(r)
                {
                    errs.push(FieldError::required(child_path(path, r), ""));
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk_schema(is, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

/// The version priority kube uses to pick a preferred version: GA, then beta, then alpha,
/// higher numbers first, other strings last.
pub fn version_priority(v: &str) -> (u8, i64, i64, String) {
    let parse = |s: &str| -> Option<(i64, u8, i64)> {
        let rest = s.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let major: i64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((major, 0, 0));
        }
        for (word, rank) in [("beta", 1u8), ("alpha", 2u8)] {
            if let Some(n) = tail.strip_prefix(word) {
                return Some((major, rank, n.parse().ok()?));
            }
        }
        None
    };
    match parse(v) {
        Some((major, rank, minor)) => (rank, -major, -minor, String::new()),
        None => (3, 0, 0, v.to_string()),
    }
}

/// The resource type a CustomResourceDefinition defines.
pub fn crd_type(crd: &Value) -> Option<ResourceType> {
    let spec = crd.get("spec")?;
    let group = spec.get("group")?.as_str()?.to_string();
    let names = spec.get("names")?;
    let kind = names.get("kind")?.as_str()?.to_string();
    let plural = names.get("plural")?.as_str()?.to_string();
    let strs = |k: &str| -> Vec<String> {
        names
            .get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut versions = Vec::new();
    let mut schemas = std::collections::BTreeMap::new();
    let mut status = false;
    for v in spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = v.get("name").and_then(Value::as_str) else {
            continue;
        };
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            status = at(v, &["subresources", "status"]).is_some();
        }
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        versions.push(name.to_string());
        schemas.insert(
            name.to_string(),
            at(v, &["schema", "openAPIV3Schema"])
                .cloned()
                .unwrap_or(json!({})),
        );
    }
    versions.sort_by_key(|v| version_priority(v));
    Some(ResourceType {
        singular: names
            .get("singular")
            .and_then(Value::as_str)
            .map(String::from)
            .unwrap_or(kind.to_lowercase()),
        namespaced: spec.get("scope").and_then(Value::as_str) == Some("Namespaced"),
        short_names: strs("shortNames"),
        categories: strs("categories"),
        status,
        schemas: Some(schemas),
        storage_group: group.clone(),
        storage_resource: plural.clone(),
        group,
        versions,
        plural,
        kind,
    })
}

/// Whether a CEL rule works on strings in ways whose cost grows with their length and number
/// (kube-apiserver's cost estimator charges them per possible element).
fn costly_rule(rule: &str) -> bool {
    [
        ".matches(",
        ".startsWith(",
        ".endsWith(",
        ".contains(",
        ".find(",
        ".split(",
        ".all(",
        ".exists(",
    ]
    .iter()
    .any(|f| rule.contains(f))
}

fn check_structural(node: &Value, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    check_structural_in(node, path, root, false, errs)
}

/// `unbounded`: the node is (inside) the items of an array without `maxItems`. There
/// kube-apiserver's cost estimator takes the array to hold as many items as a request of 3 MiB
/// could, and refuses a rule on strings (a regular expression, a prefix) as over its budget;
/// the test API server refuses such a rule too, so that a CRD it accepts is one the real server
/// accepts (a rough cut of the estimator: it never computes the cost itself).
fn check_structural_in(
    node: &Value,
    path: &str,
    root: bool,
    unbounded: bool,
    errs: &mut Vec<FieldError>,
) {
    if unbounded
        && let Some(rules) = node
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
    {
        for (i, rule) in rules.iter().enumerate() {
            if rule
                .get("rule")
                .and_then(Value::as_str)
                .is_some_and(costly_rule)
            {
                errs.push(FieldError::forbidden(
                    format!("{path}.x-kubernetes-validations[{i}].rule"),
                    "estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
                ));
            }
        }
    }
    let ty = node.get("type").and_then(Value::as_str).unwrap_or("");
    if root {
        if ty.is_empty() {
            errs.push(FieldError::required(
                format!("{path}.type"),
                "must not be empty at the root",
            ));
        } else if ty != "object" {
            errs.push(FieldError::invalid(
                format!("{path}.type"),
                ty,
                "must be object at the root",
            ));
        }
    }
    // CEL needs a type to compile against: kube-apiserver gives none to a node without `type`
    // (only `x-kubernetes-int-or-string` is `dyn`), so it refuses the CRD's rules there, as
    // `model.SchemaDeclType` and `cel.Compile` do.
    let rules = node
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty());
    if rules && ty.is_empty() && node.get("x-kubernetes-int-or-string") != Some(&Value::Bool(true))
    {
        errs.push(FieldError::internal(
            format!("{path}.x-kubernetes-validations"),
            "rule compiler initialization error: Failed to convert to declType for CEL validation rules",
        ));
    }
    let exempt = |n: &Value| {
        n.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
            || n.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
    };
    // A child schema is checked like its parent and must say its type.
    let mut child = |schema: &Value, child_path: String, what: &str, unbounded: bool| {
        check_structural_in(schema, &child_path, false, unbounded, errs);
        let untyped = schema
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty();
        if untyped && !exempt(schema) {
            errs.push(FieldError::required(
                format!("{child_path}.type"),
                format!("must not be empty for specified {what}"),
            ));
        }
    };
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        let mut names: Vec<&String> = props.keys().collect();
        names.sort();
        for name in names {
            child(
                &props[name],
                format!("{path}.properties[{name}]"),
                "object fields",
                unbounded,
            );
        }
    }
    if let Some(items) = node.get("items").filter(|i| i.is_object()) {
        let bounded = node.get("maxItems").is_some_and(Value::is_u64);
        child(
            items,
            format!("{path}.items"),
            "array items",
            unbounded || !bounded,
        );
    }
    if let Some(ap) = node.get("additionalProperties").filter(|i| i.is_object()) {
        child(
            ap,
            format!("{path}.additionalProperties"),
            "object fields",
            unbounded,
        );
    }
}

/// ValidateCustomResourceDefinition, the parts that matter here.
pub fn validate_crd(crd: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let s = |p: &[&str]| str_at(crd, p).unwrap_or("").to_string();
    let group = s(&["spec", "group"]);
    let plural = s(&["spec", "names", "plural"]);
    let name = s(&["metadata", "name"]);
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &name,
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else {
        for m in super::validation::dns1123_subdomain(&group) {
            errs.push(FieldError::invalid("spec.group", &group, m));
        }
        if !group.contains('.') {
            errs.push(FieldError::invalid(
                "spec.group",
                &group,
                "should be a domain with at least one dot",
            ));
        }
    }
    let scope = s(&["spec", "scope"]);
    if scope != "Namespaced" && scope != "Cluster" {
        errs.push(FieldError::not_supported(
            "spec.scope",
            &scope,
            &["Cluster", "Namespaced"],
        ));
    }
    for (field, value) in [
        ("plural", &plural),
        ("singular", &s(&["spec", "names", "singular"])),
    ] {
        if value.is_empty() {
            if field == "plural" {
                errs.push(FieldError::required("spec.names.plural", ""));
            }
        } else {
            for m in super::validation::dns1123_label(value) {
                errs.push(FieldError::invalid(format!("spec.names.{field}"), value, m));
            }
        }
    }
    if s(&["spec", "names", "kind"]).is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    }
    let versions = at(crd, &["spec", "versions"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::required(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
        return errs;
    }
    let storage = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if storage != 1 {
        errs.push(FieldError::invalid_raw(
            "spec.versions",
            "[]apiextensions.CustomResourceDefinitionVersion{...}",
            "must have exactly one version marked as storage version",
        ));
    }
    let schemas: Vec<Option<&Value>> = versions
        .iter()
        .map(|v| at(v, &["schema", "openAPIV3Schema"]))
        .collect();
    let all_same = schemas.iter().all(|s| *s == schemas[0]);
    for (i, schema) in schemas.iter().enumerate() {
        let base = if all_same {
            "spec.validation.openAPIV3Schema".to_string()
        } else {
            format!("spec.versions[{i}].schema.openAPIV3Schema")
        };
        match schema {
            None => errs.push(FieldError::required(
                format!("spec.versions[{i}].schema.openAPIV3Schema"),
                "schemas are required",
            )),
            Some(schema) => check_structural(schema, &base, true, &mut errs),
        }
        if all_same {
            break;
        }
    }
    errs
}

/// kube-apiserver's `ValidateCustomResourceDefinitionStoredVersions`, run on every write of a
/// CRD (its spec and its status): every version in `status.storedVersions` must remain in
/// `spec.versions` until a storage migration removes it from the status. So an update that
/// drops a version objects were stored in is refused (422). `creating`: the server filled
/// `status.storedVersions` itself, a nil list when no version is the storage version.
pub fn validate_crd_stored_versions(crd: &Value, creating: bool) -> Vec<FieldError> {
    let stored = at(crd, &["status", "storedVersions"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if stored.is_empty() {
        return vec![FieldError::invalid_raw(
            "status.storedVersions",
            if creating {
                "[]string(nil)"
            } else {
                "[]string{}"
            },
            "must have at least one stored version",
        )];
    }
    let versions: Vec<&str> = at(crd, &["spec", "versions"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    stored
        .iter()
        .enumerate()
        .filter_map(|(i, v)| Some((i, v.as_str()?)))
        .filter(|(_, v)| !versions.contains(v))
        .map(|(i, v)| {
            FieldError::invalid(
                format!("status.storedVersions[{i}]"),
                v,
                format!("missing from spec.versions; {v} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {v} and it is removed from status.storedVersions"),
            )
        })
        .collect()
}

const EVENT_RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// An events.k8s.io/v1 Event in its core/v1 form (how the server keeps it).
pub fn event_to_core(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        for (from, to) in EVENT_RENAMES {
            if let Some(x) = m.remove(*from) {
                m.insert(to.to_string(), x);
            }
        }
        m.insert("apiVersion".into(), json!("v1"));
    }
    v
}

/// A core/v1 Event seen through events.k8s.io/v1.
pub fn event_from_core(mut v: Value) -> Value {
    if let Value::Object(m) = &mut v {
        for (to, from) in EVENT_RENAMES {
            if let Some(x) = m.remove(*from) {
                m.insert(to.to_string(), x);
            }
        }
        m.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    }
    v
}

/// The paths (`spec.template.spec.foo`, `spec.containers[0].bar`, as Go's strict decoder
/// writes them) of the fields of `raw` that `decoded` lacks: fields the kind does not have,
/// dropped by the typed round trip or pruned by the schema. Nulls are not counted.
pub fn unknown_fields(raw: &Value, decoded: &Value, at: &str, out: &mut Vec<String>) {
    match (raw, decoded) {
        (Value::Object(raw), Value::Object(decoded)) => {
            for (key, value) in raw {
                let path = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                match decoded.get(key) {
                    Some(inner) => unknown_fields(value, inner, &path, out),
                    None if !value.is_null() => out.push(path),
                    None => {}
                }
            }
        }
        (Value::Array(raw), Value::Array(decoded)) if raw.len() == decoded.len() => {
            for (i, (value, inner)) in raw.iter().zip(decoded).enumerate() {
                unknown_fields(value, inner, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}
