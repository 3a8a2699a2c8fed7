//! The `/scale` subresource of Deployments, StatefulSets and ReplicaSets, as kube-apiserver
//! serves it: an `autoscaling/v1` Scale whose `spec.replicas` is the object's. A write through
//! it is recorded in managedFields with `subresource: scale` (what the HorizontalPodAutoscaler
//! controller and `kubectl scale` leave), so a server-side apply that sets `spec.replicas`
//! conflicts with it, naming the subresource.

use serde_json::{Value, json};

use super::errors::{ApiError, FieldError};
use super::patch;
use super::resources::ResourceType;
use super::store::{Out, State, Write};
use super::util::at;

/// Whether the kind serves `/scale`.
pub fn serves(rt: &ResourceType) -> bool {
    rt.group == "apps"
        && matches!(
            rt.kind.as_str(),
            "Deployment" | "StatefulSet" | "ReplicaSet"
        )
}

/// The Scale of `obj`.
pub fn of(obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let mut metadata = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(k) {
            metadata.insert(k.into(), v.clone());
        }
    }
    let selector = at(obj, &["spec", "selector", "matchLabels"])
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": {"replicas": at(obj, &["spec", "replicas"]).cloned().unwrap_or(json!(1))},
        "status": {
            "replicas": at(obj, &["status", "replicas"]).cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

/// A GET, PUT or merge PATCH of `/scale`: the Scale as it is (after the write).
pub fn handle(
    state: &mut State,
    w: &Write,
    method: &http::Method,
    content_type: &str,
    body: Option<Value>,
) -> Result<Value, ApiError> {
    let current = state.get(w.rt, w.namespace, w.name)?;
    let scale = of(&current);
    let wanted = match *method {
        http::Method::GET => return Ok(scale),
        http::Method::PUT => {
            body.ok_or_else(|| ApiError::bad_request("the body of the request was empty"))?
        }
        http::Method::PATCH if content_type == "application/merge-patch+json" => {
            let mut next = scale.clone();
            patch::merge_patch(&mut next, &body.unwrap_or(Value::Null));
            next
        }
        http::Method::PATCH => {
            return Err(ApiError::unsupported_media_type(
                content_type,
                &["application/merge-patch+json"],
            ));
        }
        _ => return Err(ApiError::method_not_allowed()),
    };
    let Some(replicas) = at(&wanted, &["spec", "replicas"]).and_then(Value::as_i64) else {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            w.name,
            &[FieldError::required("spec.replicas", "")],
        ));
    };
    let mut next = current.clone();
    next["spec"]["replicas"] = json!(replicas);
    if let Some(rv) = at(&wanted, &["metadata", "resourceVersion"]) {
        next["metadata"]["resourceVersion"] = rv.clone();
    }
    let through = Write { sub: "scale", ..*w };
    match state.update(&through, next)? {
        Out::Object(_, obj) => Ok(of(&obj)),
        Out::Raw(_, body) => Ok(body),
    }
}
