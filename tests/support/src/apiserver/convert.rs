//! Conversion between served versions of one built-in kind: HorizontalPodAutoscaler is served as
//! `autoscaling/v2` (preferred, and how it is stored) and `autoscaling/v1`, as kube-apiserver
//! serves it. v1 holds one CPU target; what else v2 has travels in v1 annotations
//! (`autoscaling.alpha.kubernetes.io/...`), so that a v1 round trip loses nothing (the shape of
//! kubernetes pkg/apis/autoscaling/v1/conversion.go; the annotations hold the v2 form here).

use serde_json::{Map, Value, json};

const METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
const BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";
const CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
const CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";

/// Whether an object of `group`/`kind` at `version` is a HorizontalPodAutoscaler in v1 form.
pub fn is_hpa_v1(group: &str, kind: &str, version: &str) -> bool {
    group == "autoscaling" && kind == "HorizontalPodAutoscaler" && version == "v1"
}

fn is_cpu_utilization(metric: &Value) -> bool {
    metric["type"] == "Resource"
        && metric["resource"]["name"] == "cpu"
        && metric["resource"]["target"]["type"] == "Utilization"
}

fn annotations(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = obj.as_object_mut()?.entry("metadata").or_insert(json!({}));
    let ann = meta
        .as_object_mut()?
        .entry("annotations")
        .or_insert(json!({}));
    ann.as_object_mut()
}

/// Moves `value` (when not empty) into annotation `key` as JSON.
fn stash(obj: &mut Value, key: &str, value: Option<Value>) {
    let Some(value) = value.filter(|v| v.as_array().is_none_or(|a| !a.is_empty())) else {
        return;
    };
    if let Some(ann) = annotations(obj) {
        ann.insert(key.into(), Value::String(value.to_string()));
    }
}

/// Takes annotation `key` out again, parsed.
fn unstash(obj: &mut Value, key: &str) -> Option<Value> {
    let ann = obj.pointer_mut("/metadata/annotations")?.as_object_mut()?;
    let text = ann.remove(key)?;
    serde_json::from_str(text.as_str()?).ok()
}

/// Drops an empty `metadata.annotations`.
fn tidy(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
        && meta
            .get("annotations")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
    {
        meta.remove("annotations");
    }
}

fn copy(from: &Value, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k) {
            to.insert((*k).into(), v.clone());
        }
    }
}

/// A HorizontalPodAutoscaler as `autoscaling/v2` shows it (and stores it), from its v1 form.
pub fn hpa_v1_to_v2(mut obj: Value) -> Value {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let status = obj.get("status").cloned();
    let mut metrics = unstash(&mut obj, METRICS)
        .and_then(|m| m.as_array().cloned())
        .unwrap_or_default();
    let behavior = unstash(&mut obj, BEHAVIOR);
    let conditions = unstash(&mut obj, CONDITIONS);
    let mut current = unstash(&mut obj, CURRENT_METRICS)
        .and_then(|m| m.as_array().cloned())
        .unwrap_or_default();
    tidy(&mut obj);
    if let Some(cpu) = spec.get("targetCPUUtilizationPercentage") {
        metrics.push(json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": cpu}}}));
    }
    let mut out = Map::new();
    copy(
        &spec,
        &mut out,
        &["scaleTargetRef", "minReplicas", "maxReplicas"],
    );
    if !metrics.is_empty() {
        out.insert("metrics".into(), Value::Array(metrics));
    }
    if let Some(b) = behavior {
        out.insert("behavior".into(), b);
    }
    let m = obj.as_object_mut();
    if let Some(m) = m {
        m.insert("apiVersion".into(), json!("autoscaling/v2"));
        m.insert("spec".into(), Value::Object(out));
        if let Some(status) = status {
            let mut st = Map::new();
            copy(
                &status,
                &mut st,
                &[
                    "observedGeneration",
                    "lastScaleTime",
                    "currentReplicas",
                    "desiredReplicas",
                ],
            );
            if let Some(cpu) = status.get("currentCPUUtilizationPercentage") {
                current.push(json!({"type": "Resource", "resource": {"name": "cpu",
                    "current": {"averageUtilization": cpu}}}));
            }
            if !current.is_empty() {
                st.insert("currentMetrics".into(), Value::Array(current));
            }
            if let Some(c) = conditions {
                st.insert("conditions".into(), c);
            }
            m.insert("status".into(), Value::Object(st));
        }
    }
    obj
}

/// A stored (v2) HorizontalPodAutoscaler as `autoscaling/v1` shows it.
pub fn hpa_v2_to_v1(mut obj: Value) -> Value {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let status = obj.get("status").cloned();
    let metrics = spec
        .get("metrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let cpu = metrics.iter().position(is_cpu_utilization);
    let target = cpu.and_then(|i| {
        metrics[i]["resource"]["target"]
            .get("averageUtilization")
            .cloned()
    });
    let others: Vec<Value> = metrics
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != cpu)
        .map(|(_, m)| m.clone())
        .collect();
    stash(&mut obj, METRICS, Some(Value::Array(others)));
    stash(&mut obj, BEHAVIOR, spec.get("behavior").cloned());
    let mut out = Map::new();
    copy(
        &spec,
        &mut out,
        &["scaleTargetRef", "minReplicas", "maxReplicas"],
    );
    if let Some(t) = target {
        out.insert("targetCPUUtilizationPercentage".into(), t);
    }
    let mut st = Map::new();
    if let Some(status) = &status {
        copy(
            status,
            &mut st,
            &[
                "observedGeneration",
                "lastScaleTime",
                "currentReplicas",
                "desiredReplicas",
            ],
        );
        let current = status
            .get("currentMetrics")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let cpu = current
            .iter()
            .position(|m| m["type"] == "Resource" && m["resource"]["name"] == "cpu");
        if let Some(u) = cpu.and_then(|i| {
            current[i]["resource"]["current"]
                .get("averageUtilization")
                .cloned()
        }) {
            st.insert("currentCPUUtilizationPercentage".into(), u);
        }
        let rest: Vec<Value> = current
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != cpu)
            .map(|(_, m)| m.clone())
            .collect();
        stash(&mut obj, CURRENT_METRICS, Some(Value::Array(rest)));
        stash(&mut obj, CONDITIONS, status.get("conditions").cloned());
    }
    tidy(&mut obj);
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!("autoscaling/v1"));
        m.insert("spec".into(), Value::Object(out));
        if status.is_some() {
            m.insert("status".into(), Value::Object(st));
        }
    }
    obj
}
