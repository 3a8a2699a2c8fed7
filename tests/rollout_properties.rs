//! Property tests of the rollout on random layer DAGs, against a simulated cluster in which
//! each Deployment becomes ready a random number of steps after it is applied: every layer is
//! applied exactly once, never before everything it waits on was seen ready, as soon as that was
//! seen, and the release ends Ready.

use sequenced_testkit as support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;
use sequenced::api::{
    CrdPolicy, DriftDetection, Identity, ObjectKey, OnFailure, ReleasePhase, SequencedReleaseStatus,
};
use sequenced::plan::{self, Plan};
use sequenced::rollout::install::{InstallAction, step, wanted};
use sequenced::rollout::{Observations, Outcome, Revision, Settings, begin};
use serde_json::{Value, json};
use support::{chart_tree, object, rendered};
use tempfile::TempDir;

fn plan_dag(layers: usize, edges: &[(usize, usize)], sizes: &[usize]) -> Plan {
    let dir = TempDir::new().unwrap();
    let tree = chart_tree(
        dir.path(),
        &[("g", "apiVersion: v2\nname: g\nversion: 1.0.0\n")],
        &[],
    );
    let mut depends: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for &(from, to) in edges {
        if to < from {
            depends.entry(from).or_default().push(format!("l{to}"));
        }
    }
    let mut documents = Vec::new();
    let mut n = 0;
    for (layer, size) in sizes.iter().enumerate().take(layers) {
        for _ in 0..*size {
            let name = format!("l{layer}");
            let deps = depends
                .get(&layer)
                .map(|d| d.join(", "))
                .unwrap_or_default();
            let mut annotations = vec![("helm.sh/layer", name.as_str())];
            if !deps.is_empty() {
                annotations.push(("helm.sh/depends-on/layers", deps.as_str()));
            }
            documents.push((
                "g/templates/x.yaml",
                object("Deployment", &format!("r{n}"), &annotations),
            ));
            n += 1;
        }
    }
    plan::plan(&tree, rendered(&tree, &documents)).unwrap_or_else(|e| panic!("{e}"))
}

fn deployment(name: &str, ready: bool) -> Value {
    let n = i64::from(ready);
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "generation": 1},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": n, "availableReplicas": n,
                   "conditions": [{"type": "Available", "status": if ready {"True"} else {"False"}}]}
    })
}

/// Layers, dependency edges, resources per layer, readiness delays.
type Dag = (usize, Vec<(usize, usize)>, Vec<usize>, Vec<u8>);

fn dag() -> impl Strategy<Value = Dag> {
    (1usize..16).prop_flat_map(|layers| {
        (
            Just(layers),
            proptest::collection::vec((0..layers, 0..layers), 0..layers * 2),
            proptest::collection::vec(1usize..3, layers),
            proptest::collection::vec(0u8..4, layers * 3),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn layers_start_exactly_when_what_they_wait_on_was_seen_ready(
        (layers, edges, sizes, delays) in dag()
    ) {
        let plan = plan_dag(layers, &edges, &sizes);
        let settings = Settings {
            sequenced: true, wait: true, readiness_timeout: Duration::from_secs(3600), max_history: 10,
            retries: 0, adopt: false, timeout: Duration::from_secs(300), interval: Duration::from_secs(600), disable_hooks: false, crds: None,
            on_failure: OnFailure::Keep, drift: DriftDetection::Enabled,
        };
        let keys: Vec<ObjectKey> = plan.resources.iter().map(|r| ObjectKey {
            api_version: r.api_version.clone(), kind: r.kind.clone(), namespace: Some("g".into()), name: r.name.clone(),
        }).collect();
        let me = Identity { owner: "g/g".into(), release_name: "g".into(), target_namespace: "g".into(), uid: "u".into() };
        let revision = Revision { plan: &plan, keys: &keys, prune: &[], hooks: &[], upgrade: false, rollback: false, crds: CrdPolicy::Create, run: "u/1".into(), settings, me: &me, test: None, rules: &[], health: &Default::default() };
        let at = |s: i64| Time(Timestamp::from_second(1_800_000_000 + s).unwrap());
        let mut status = begin(&revision, 1, &SequencedReleaseStatus::default(), Some(1), "d", None, &at(0));
        // When each resource was applied and when it becomes ready (in steps).
        let mut applied_at: Vec<Option<usize>> = vec![None; plan.resources.len()];
        let mut layer_applied: Vec<Option<usize>> = vec![None; plan.layers.len()];
        // The step at which each resource was first observed ready.
        let mut seen_ready: Vec<Option<usize>> = vec![None; plan.resources.len()];
        let delay = |r: usize| usize::from(delays[r % delays.len()]);
        let mut finished = false;
        for s in 0..(layers * 8 + 8) {
            let mut observed = Observations::default();
            for r in wanted(&revision, &status).resources {
                let object = applied_at[r].map(|a| deployment(&plan.resources[r].name, s >= a + 1 + delay(r)));
                if object.as_ref().is_some_and(|o| o["status"]["availableReplicas"] == 1) {
                    seen_ready[r].get_or_insert(s);
                }
                observed.resources.insert(r, object);
            }
            // Objects not applied yet do not exist: the layers that start write nothing of others.
            let decision = match step(&revision, &status, &observed, &at(s as i64 + 1)) {
                Outcome::Decided(decision) => decision,
                Outcome::Need(more) => {
                    for r in more.resources {
                        observed.resources.entry(r).or_insert(None);
                    }
                    match step(&revision, &status, &observed, &at(s as i64 + 1)) {
                        Outcome::Decided(decision) => decision,
                        Outcome::Need(again) => panic!("asked again for {again:?}"),
                    }
                }
            };
            for action in &decision.actions {
                let InstallAction::ApplyLayer(l) = action else { panic!("unexpected {action:?}") };
                prop_assert!(layer_applied[*l].is_none(), "layer {l} applied twice");
                layer_applied[*l] = Some(s);
                for r in plan.must_be_ready(*l) {
                    prop_assert!(seen_ready[r].is_some_and(|seen| seen <= s), "layer {l} before r{r} was ready");
                }
                for &r in &plan.layers[*l].resources {
                    applied_at[r] = Some(s);
                }
            }
            // Nothing waits longer than it must: a pending layer whose prerequisites were all
            // seen ready (and whose KOTS-free dependencies were applied) starts now.
            for (l, applied) in layer_applied.iter().enumerate() {
                if applied.is_none() {
                    let ready = plan.must_be_ready(l).iter().all(|&r| seen_ready[r].is_some());
                    prop_assert!(!ready, "layer {l} could start at step {s} but did not");
                }
            }
            status = decision.status;
            if decision.finished {
                finished = true;
                break;
            }
        }
        prop_assert!(finished, "never finished: {:?}", status.message);
        prop_assert_eq!(status.phase, Some(ReleasePhase::Ready));
        prop_assert!(layer_applied.iter().all(Option::is_some));
    }
}
