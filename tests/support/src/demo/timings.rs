//! What the demo measured, from the log of its watch (watch.rs): the hand-off between layers of
//! one revision, and the order in which an uninstall removed a release's objects.
//!
//! A revision's layers, their objects and what each waits for come from the revision's release
//! record (the plan the operator applied, as a rollback would read it), never from a second
//! reading of the chart. The window is from the mark the demo wrote when it made its request to
//! the next mark. In it:
//! - a layer **started** at the first `created` or `changed` (a new generation) line of one of its
//!   objects;
//! - a layer was **ready** at the first `ready` line, after its change, of the last of its
//!   objects that changed (objects the revision did not change were ready all along);
//! - the **hand-off** of a layer that waits on others is from the moment its last prerequisite
//!   became ready to the moment it started.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use sequenced::history::Record;
use sequenced::history::helm::{HELM_RECORD_KEY, HelmRelease, helm_record_name};
use serde_json::Value;

use super::{Error, Result, client};

/// The log lines of the window that starts at the mark `label`.
fn window(log: &str, label: &str) -> Result<(f64, Vec<Value>)> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("cannot read {log}: {e}"))?;
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let start = lines
        .iter()
        .position(|l| l["mark"] == label)
        .ok_or_else(|| Error(format!("no mark {label:?} in {log}")))?;
    let from = lines[start]["at"].as_f64().unwrap_or(0.0);
    let events = lines[start + 1..]
        .iter()
        .take_while(|l| l.get("mark").is_none())
        .cloned()
        .collect();
    Ok((from, events))
}

fn at(line: &Value) -> f64 {
    line["at"].as_f64().unwrap_or(0.0)
}

/// `sequenced-demo timings LOG NS NAME REVISION MARK`: each layer of the revision, when it
/// started and was ready (seconds after the mark), and its hand-off.
pub async fn timings(
    log: &str,
    namespace: &str,
    name: &str,
    revision: i64,
    mark: &str,
) -> Result<u8> {
    let (from, events) = window(log, mark)?;
    let secrets: Api<Secret> = Api::namespaced(client().await?, namespace);
    let secret_name = helm_record_name(name, revision);
    let secret = secrets
        .get(&secret_name)
        .await
        .map_err(|e| format!("cannot read the release record {namespace}/{secret_name}: {e}"))?;
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(HELM_RECORD_KEY))
        .map(|b| b.0.as_slice())
        .unwrap_or_default();
    let record = HelmRelease::decode(&secret_name, data)
        .and_then(|r| Record::from_helm(&secret_name, r))
        .map_err(|e| e.to_string())?;
    let stored = record
        .plan
        .as_ref()
        .ok_or_else(|| Error(format!("{secret_name} keeps no plan")))?;
    let plan = &stored.plan;
    let what = match (record.rollback_to, record.upgrade) {
        (Some(target), _) => format!("rollback to revision {target}"),
        (None, Some(true)) => "upgrade".to_string(),
        _ => "install".to_string(),
    };
    println!("{name} revision {revision} ({what}), seconds after the demo's request:");
    // Per layer: when it started, and when it was ready (None: nothing of it changed).
    let mut started: Vec<Option<f64>> = Vec::new();
    let mut ready: Vec<Option<f64>> = Vec::new();
    for layer in &plan.layers {
        let objects: BTreeSet<(String, String)> = layer
            .resources
            .iter()
            .filter_map(|&r| stored.keys.get(r))
            .map(|k| (k.kind.clone(), k.name.clone()))
            .collect();
        let ours = |l: &&Value| {
            objects.contains(&(
                l["kind"].as_str().unwrap_or("").to_string(),
                l["name"].as_str().unwrap_or("").to_string(),
            ))
        };
        // Each changed object: when it changed, and when it was ready after that.
        let mut changed: BTreeMap<(String, String), (f64, Option<f64>)> = BTreeMap::new();
        for line in events.iter().filter(ours) {
            let key = (
                line["kind"].as_str().unwrap_or("").to_string(),
                line["name"].as_str().unwrap_or("").to_string(),
            );
            match line["event"].as_str() {
                Some("created" | "changed") => {
                    changed.entry(key).or_insert((at(line), None));
                }
                Some("ready") => {
                    if let Some((_, ready @ None)) = changed.get_mut(&key) {
                        *ready = Some(at(line));
                    }
                }
                _ => {}
            }
        }
        started.push(
            changed
                .values()
                .map(|(changed, _)| *changed)
                .min_by(f64::total_cmp),
        );
        let all_ready = changed.values().all(|(_, r)| r.is_some());
        ready.push(if changed.is_empty() || !all_ready {
            None
        } else {
            changed
                .values()
                .filter_map(|(_, r)| *r)
                .max_by(f64::total_cmp)
        });
    }
    let width = plan.layers.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for (i, layer) in plan.layers.iter().enumerate() {
        let mut line = format!("  {:<width$}", layer.name);
        match started[i] {
            Some(s) => line.push_str(&format!("  started +{:.3} s", s - from)),
            None => line.push_str("  unchanged"),
        }
        if let Some(r) = ready[i] {
            line.push_str(&format!("  ready +{:.3} s", r - from));
        } else if started[i].is_some() {
            line.push_str("  not seen ready");
        }
        let prerequisites = plan.must_be_applied(i);
        if !prerequisites.is_empty()
            && let Some(start) = started[i]
        {
            let last = prerequisites
                .iter()
                .filter_map(|&p| ready[p].map(|r| (r, p)))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            match last {
                Some((r, p)) => line.push_str(&format!(
                    "  hand-off {:.1} ms after {} was ready",
                    (start - r) * 1000.0,
                    plan.layers[p].name
                )),
                None => line.push_str("  (its prerequisites did not change)"),
            }
        }
        println!("{}", line.trim_end());
    }
    Ok(0)
}

/// `sequenced-demo deletions LOG NAME MARK`: the layers of release `name` in the order their
/// objects were gone, with when the last one was (seconds after the mark).
pub fn deletions(log: &str, name: &str, mark: &str) -> Result<u8> {
    let (from, events) = window(log, mark)?;
    // By layer: when its last object was gone, and the objects in the order they went.
    let mut layers: BTreeMap<String, (f64, Vec<String>)> = BTreeMap::new();
    for line in events
        .iter()
        .filter(|l| l["event"] == "deleted" && l["release"] == name)
    {
        let layer = line["layer"].as_str().unwrap_or("").to_string();
        let entry = layers.entry(layer).or_insert((0.0, Vec::new()));
        entry.0 = entry.0.max(at(line));
        entry.1.push(format!(
            "{}/{}",
            line["kind"].as_str().unwrap_or(""),
            line["name"].as_str().unwrap_or("")
        ));
    }
    let mut order: Vec<(String, (f64, Vec<String>))> = layers.into_iter().collect();
    order.sort_by(|a, b| a.1.0.total_cmp(&b.1.0));
    let width = order.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    for (layer, (gone, objects)) in order {
        let layer = if layer.is_empty() { "-" } else { &layer };
        println!(
            "  gone +{:.3} s  {layer:<width$}  {}",
            gone - from,
            objects.join(", ")
        );
    }
    Ok(0)
}
