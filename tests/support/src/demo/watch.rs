//! The demo's own watch of its namespace: every Deployment, StatefulSet, Service, ConfigMap,
//! Job and ServiceAccount, one JSON line per change in a log file, stamped with this machine's
//! clock when the watch event arrived (the best resolution an observer outside the operator
//! has). timings.rs reads it back.
//!
//! Lines: `{"at": SECONDS, "event": "created" | "changed" | "ready" | "deleted", "kind", "name",
//! "release", "layer", "generation"}`, where `changed` is a new `metadata.generation` (a spec
//! change), `ready` the first event in which the object is ready by the operator's own rules
//! (`sequenced::readiness`) at that generation, `release` the `meta.helm.sh/release-name`
//! annotation and `layer` the `helm.sh/layer` (or `helm.sh/resource-group`) one; and
//! `{"at": SECONDS, "mark": LABEL}` written by `sequenced-demo mark`.
//!
//! With a pace, it also plays the kubelet for the Pods of the namespace, for a cluster without
//! Nodes (nothing would ever run there): a Pod of a ReplicaSet (a Deployment's) is Running and
//! Ready `pace` after it was first seen; a Pod that runs to completion (a Job's) is Running at
//! once and `pace` later Succeeded or Failed as its `sh -c 'echo ...; exit N'` command says
//! (`crate::workloads::script`; a command it does not understand succeeds). Its statuses are
//! those of the embedded cluster's stand-ins. A Pod's log cannot be given: only a kubelet serves
//! it.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::{Error, Result, client};
use crate::workloads::{container_scripts, pod_status_exiting, runs_to_completion};

/// The kinds watched: `(apiVersion, kind, plural)`.
const KINDS: [(&str, &str, &str); 6] = [
    ("apps/v1", "Deployment", "deployments"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("v1", "Service", "services"),
    ("v1", "ConfigMap", "configmaps"),
    ("batch/v1", "Job", "jobs"),
    ("v1", "ServiceAccount", "serviceaccounts"),
];

/// Seconds since the Unix epoch, now.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Appends one line to the log.
fn append(log: &str, line: &Value) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("cannot open {log}: {e}"))?;
    // One write per line: lines of concurrent writers never mix.
    file.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| Error(format!("cannot write {log}: {e}")))
}

/// `sequenced-demo mark LOG LABEL`.
pub fn mark(log: &str, label: &str) -> Result<u8> {
    append(log, &json!({"at": now(), "mark": label}))?;
    Ok(0)
}

/// Watches the namespace until killed (or the demo's shell exits), and plays the kubelet when
/// given a pace.
pub async fn watch(namespace: &str, log: &str, pace: Option<Duration>) -> Result<u8> {
    let client = client().await?;
    super::exit_with_parent();
    let mut tasks = Vec::new();
    let (listed, mut all_listed) = tokio::sync::mpsc::channel::<()>(KINDS.len());
    for (api_version, kind, plural) in KINDS {
        let resource = crate::api_resource(api_version, kind, plural);
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let log = log.to_string();
        let listed = listed.clone();
        tasks.push(tokio::spawn(async move {
            follow(api, api_version, kind, &log, listed).await
        }));
    }
    if let Some(pace) = pace {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        tasks.push(tokio::spawn(async move {
            kubelet(pods, pace).await;
        }));
    }
    // Once every kind is listed, what comes is news: tell whoever waits.
    for _ in KINDS {
        all_listed.recv().await;
    }
    append(log, &json!({"at": now(), "mark": "watching"}))?;
    futures::future::join_all(tasks).await;
    Ok(0)
}

/// What the watch knows of one object, by uid.
struct Seen {
    generation: i64,
    ready: bool,
}

/// Follows one kind and writes its changes to the log.
async fn follow(
    api: Api<DynamicObject>,
    api_version: &str,
    kind: &str,
    log: &str,
    listed: tokio::sync::mpsc::Sender<()>,
) {
    let mut listed = Some(listed);
    let mut seen: HashMap<String, Seen> = HashMap::new();
    // Objects listed when the watch (re)starts are known, not news.
    let mut listing = true;
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else {
            continue;
        };
        match event {
            watcher::Event::Init => listing = true,
            watcher::Event::InitDone => {
                listing = false;
                if let Some(listed) = listed.take() {
                    let _ = listed.send(()).await;
                }
            }
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                let Ok(object) = serde_json::to_value(&object) else {
                    continue;
                };
                let at = now();
                let uid = text(&object, "/metadata/uid").to_string();
                let generation = object
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let ready = is_ready(api_version, kind, &object);
                let entry = seen.get(&uid).map(|s| (s.generation, s.ready));
                let mut lines = Vec::new();
                match entry {
                    None if !listing => lines.push("created"),
                    Some((before, _)) if before != generation => lines.push("changed"),
                    _ => {}
                }
                let was_ready = match entry {
                    Some((before, was_ready)) if before == generation => was_ready,
                    None if listing => ready,
                    _ => false,
                };
                if ready && !was_ready {
                    lines.push("ready");
                }
                seen.insert(uid, Seen { generation, ready });
                for what in lines {
                    let _ = append(log, &line(at, what, kind, &object, generation));
                }
            }
            watcher::Event::Delete(object) => {
                let Ok(object) = serde_json::to_value(&object) else {
                    continue;
                };
                let at = now();
                seen.remove(text(&object, "/metadata/uid"));
                let generation = object
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let _ = append(log, &line(at, "deleted", kind, &object, generation));
            }
        }
    }
}

fn line(at: f64, what: &str, kind: &str, object: &Value, generation: i64) -> Value {
    let annotation = |key: &str| {
        object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut layer = annotation("helm.sh/layer");
    if layer.is_empty() {
        layer = annotation("helm.sh/resource-group");
    }
    json!({
        "at": at,
        "event": what,
        "kind": kind,
        "name": text(object, "/metadata/name"),
        "release": annotation("meta.helm.sh/release-name"),
        "layer": layer,
        "generation": generation,
    })
}

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Ready by the operator's rules: its readiness annotations, else the built-in rule of its kind.
fn is_ready(api_version: &str, kind: &str, object: &Value) -> bool {
    let mut object = object.clone();
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    let rules = sequenced::readiness::Rules::from_object(&object).unwrap_or_default();
    sequenced::readiness::assess(&object, &rules).is_ready()
}

/// The kubelet's part on a cluster without Nodes, for the Pods of one namespace (see the
/// module's documentation).
async fn kubelet(pods: Api<Pod>, pace: Duration) {
    // When each Pod (by uid) was first seen.
    let mut first_seen: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(list) = pods.list(&ListParams::default()).await else {
            continue;
        };
        for pod in list.items {
            let Ok(pod) = serde_json::to_value(&pod) else {
                continue;
            };
            if pod
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|t| !t.is_null())
            {
                continue;
            }
            let name = text(&pod, "/metadata/name").to_string();
            let phase = text(&pod, "/status/phase").to_string();
            let since = *first_seen
                .entry(text(&pod, "/metadata/uid").to_string())
                .or_insert_with(Instant::now);
            let status = if runs_to_completion(&pod) {
                if matches!(phase.as_str(), "Succeeded" | "Failed") {
                    continue;
                }
                if since.elapsed() < pace {
                    if phase == "Running" {
                        continue;
                    }
                    pod_status_exiting(&pod, "Running", 0)
                } else {
                    let exit_code = container_scripts(&pod)
                        .into_iter()
                        .filter_map(|(_, script)| script.map(|s| s.exit_code))
                        .find(|&code| code != 0)
                        .unwrap_or(0);
                    if exit_code == 0 {
                        pod_status_exiting(&pod, "Succeeded", 0)
                    } else {
                        pod_status_exiting(&pod, "Failed", exit_code)
                    }
                }
            } else {
                if phase == "Running" || since.elapsed() < pace {
                    continue;
                }
                pod_status_exiting(&pod, "Running", 0)
            };
            let patch = json!({"status": status});
            let _ = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
    }
}
