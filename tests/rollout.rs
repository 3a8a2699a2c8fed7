//! The rollout state machine, step by step, without a cluster: what each step applies, what it
//! waits for and what the status says. Time is passed in; nothing here reads a clock.

use sequenced_testkit as support;

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sequenced::api::v1alpha1::{LayerPhase, ReleasePhase, SequencedReleaseStatus};
use sequenced::history::{Inventory, ObjectKey};
use sequenced::plan::{self, Plan};
use sequenced::rollout::{
    self, Action, Decision, Observations, Revision, Settings, begin, step, uninstall_step,
};
use serde_json::{Value, json};
use support::{chart_tree, object, rendered};
use tempfile::TempDir;

const SHOP: &str = "apiVersion: v2\nname: shop\nversion: 0.1.0\n";

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
}

fn settings() -> Settings {
    Settings {
        sequenced: true,
        wait: true,
        readiness_timeout: Duration::from_secs(300),
        max_history: 10,
        retries: 0,
    }
}

fn plan_of(documents: &[(&str, String)]) -> Plan {
    let dir = TempDir::new().unwrap();
    let tree = chart_tree(dir.path(), &[("shop", SHOP)], &[]);
    let docs: Vec<(String, String)> = documents
        .iter()
        .map(|(f, y)| (format!("shop/{f}"), y.clone()))
        .collect();
    let docs: Vec<(&str, String)> = docs.iter().map(|(s, y)| (s.as_str(), y.clone())).collect();
    plan::plan(&tree, rendered(&tree, &docs)).unwrap_or_else(|e| panic!("{e}"))
}

/// The seed's example: database and queue, then app.
fn shop() -> Plan {
    plan_of(&[
        (
            "templates/db.yaml",
            object("Deployment", "db", &[("helm.sh/layer", "database")]),
        ),
        (
            "templates/queue.yaml",
            object("ConfigMap", "queue", &[("helm.sh/layer", "queue")]),
        ),
        (
            "templates/app.yaml",
            object(
                "Deployment",
                "app",
                &[
                    ("helm.sh/layer", "app"),
                    ("helm.sh/depends-on/layers", "database, queue"),
                ],
            ),
        ),
    ])
}

fn index(plan: &Plan, name: &str) -> usize {
    plan.resources.iter().position(|r| r.name == name).unwrap()
}

fn deployment(name: &str, ready: bool) -> Value {
    let available = if ready { 1 } else { 0 };
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "generation": 1},
        "spec": {"replicas": 1},
        "status": {
            "observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
            "readyReplicas": available, "availableReplicas": available,
            "conditions": [
                {"type": "Available", "status": if ready {"True"} else {"False"}},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}
            ]
        }
    })
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
}

fn started(revision: &Revision) -> SequencedReleaseStatus {
    begin(
        revision,
        &SequencedReleaseStatus::default(),
        Some(1),
        "sha256:1",
        Some("0.1.0"),
        &at(0),
    )
}

fn observe(plan: &Plan, objects: &[(&str, Value)]) -> Observations {
    let mut observed = Observations::default();
    for (name, object) in objects {
        observed
            .resources
            .insert(index(plan, name), Some(object.clone()));
    }
    observed
}

fn applied_layers(plan: &Plan, decision: &Decision) -> Vec<String> {
    decision
        .actions
        .iter()
        .map(|a| match a {
            Action::ApplyLayer(i) => plan.layers[*i].name.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

fn layer_status<'a>(
    status: &'a SequencedReleaseStatus,
    name: &str,
) -> &'a sequenced::api::v1alpha1::LayerStatus {
    status.layers.iter().find(|l| l.name == name).unwrap()
}

fn condition(status: &SequencedReleaseStatus, type_: &str) -> (String, String) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.clone(), c.reason.clone())
}

#[test]
fn database_and_queue_start_together_and_app_waits_until_both_are_ready() {
    let plan = shop();
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let status = started(&revision);
    assert_eq!(status.revision, Some(1));
    assert_eq!(status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(status.progress.as_deref(), Some("0/3"));
    assert_eq!(condition(&status, "Reconciling").0, "True");

    // Step 1: nothing applied yet; both independent layers start.
    assert!(rollout::wanted(&revision, &status).is_empty());
    let d1 = step(&revision, &status, &Observations::default(), &at(1));
    let mut first = applied_layers(&plan, &d1);
    first.sort();
    assert_eq!(first, ["database", "queue"]);
    assert_eq!(layer_status(&d1.status, "app").phase, LayerPhase::Pending);
    assert!(!d1.finished);

    // Step 2: the queue exists (ready), the database is not ready yet: app waits, naming db.
    let wanted = rollout::wanted(&revision, &d1.status);
    assert_eq!(wanted.resources.len(), 2);
    let observed = observe(
        &plan,
        &[
            ("db", deployment("db", false)),
            ("queue", config_map("queue")),
        ],
    );
    let d2 = step(&revision, &d1.status, &observed, &at(2));
    assert!(d2.actions.is_empty(), "{:?}", d2.actions);
    assert_eq!(layer_status(&d2.status, "queue").phase, LayerPhase::Ready);
    assert_eq!(
        layer_status(&d2.status, "database").phase,
        LayerPhase::Waiting
    );
    let db_message = layer_status(&d2.status, "database")
        .message
        .clone()
        .unwrap();
    assert!(db_message.contains("Deployment db"), "{db_message}");
    let app_message = layer_status(&d2.status, "app").message.clone().unwrap();
    assert!(app_message.contains("Deployment db"), "{app_message}");
    assert!(
        d2.status
            .message
            .as_deref()
            .unwrap()
            .contains("Deployment db")
    );
    assert_eq!(d2.status.progress.as_deref(), Some("1/3"));
    assert_eq!(
        d2.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
        ["LayerReady"]
    );
    // The next timeout is when db's readiness timeout falls.
    assert_eq!(d2.requeue_after, Some(Duration::from_secs(299)));

    // Step 3: db ready: app is applied in the same step.
    let observed = observe(&plan, &[("db", deployment("db", true))]);
    let d3 = step(&revision, &d2.status, &observed, &at(3));
    assert_eq!(applied_layers(&plan, &d3), ["app"]);

    // Step 4: app ready: the release is Ready.
    let observed = observe(&plan, &[("app", deployment("app", true))]);
    let d4 = step(&revision, &d3.status, &observed, &at(4));
    assert!(d4.finished);
    assert_eq!(d4.status.phase, Some(ReleasePhase::Ready));
    assert_eq!(d4.status.progress.as_deref(), Some("3/3"));
    assert_eq!(
        condition(&d4.status, "Ready"),
        ("True".into(), "Succeeded".into())
    );
    assert_eq!(condition(&d4.status, "Reconciling").0, "False");
    assert_eq!(d4.status.history[0].phase, ReleasePhase::Ready);
    assert_eq!(d4.status.history[0].finished_at, Some(at(4)));
    assert!(d4.events.iter().any(|e| e.reason == "ReleaseReady"));

    // Step 5: nothing left to do, nothing to read.
    assert!(rollout::wanted(&revision, &d4.status).is_empty());
    let d5 = step(&revision, &d4.status, &Observations::default(), &at(5));
    assert!(d5.actions.is_empty() && d5.events.is_empty());
    assert_eq!(d5.status, d4.status);
}

#[test]
fn the_same_inputs_give_the_same_decision() {
    let plan = shop();
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let status = started(&revision);
    let d1 = step(&revision, &status, &Observations::default(), &at(1));
    let observed = observe(
        &plan,
        &[
            ("db", deployment("db", false)),
            ("queue", config_map("queue")),
        ],
    );
    assert_eq!(
        step(&revision, &d1.status, &observed, &at(7)),
        step(&revision, &d1.status, &observed, &at(7))
    );
}

#[test]
fn a_readiness_failure_fails_the_release_naming_the_object() {
    let (plan, d2) = failed_job_release(0);
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    assert!(d2.finished);
    assert_eq!(d2.status.phase, Some(ReleasePhase::Failed));
    let message = d2.status.message.clone().unwrap();
    assert!(
        message.starts_with("layer db of chart shop failed: Job migrate"),
        "{message}"
    );
    assert_eq!(
        condition(&d2.status, "Stalled"),
        ("True".into(), "ReadinessFailed".into())
    );
    assert_eq!(condition(&d2.status, "Ready").0, "False");
    assert_eq!(layer_status(&d2.status, "db").phase, LayerPhase::Failed);
    assert_eq!(d2.status.history[0].phase, ReleasePhase::Failed);
    assert!(
        d2.events
            .iter()
            .any(|e| e.warning && e.reason == "LayerFailed")
    );
    // A failed release does nothing more until its spec changes.
    let d3 = step(&revision, &d2.status, &Observations::default(), &at(3));
    assert!(d3.actions.is_empty());
    assert_eq!(d3.status, d2.status);
}

#[test]
fn a_resource_that_stays_in_progress_times_out_with_its_reason() {
    let plan = plan_of(&[(
        "templates/db.yaml",
        object(
            "Deployment",
            "db",
            &[
                ("helm.sh/layer", "db"),
                ("helm.sh/readiness-timeout", "20s"),
            ],
        ),
    )]);
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(0),
    );
    let slow = observe(&plan, &[("db", deployment("db", false))]);
    let d2 = step(&revision, &d1.status, &slow, &at(5));
    assert_eq!(d2.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(d2.requeue_after, Some(Duration::from_secs(15)));
    assert_eq!(d2.timeouts, 0);
    let d3 = step(&revision, &d2.status, &slow, &at(21));
    assert_eq!(d3.status.phase, Some(ReleasePhase::Failed));
    assert_eq!(d3.timeouts, 1);
    let message = d3.status.message.unwrap();
    assert!(
        message.contains("readiness timeout after 20s: Deployment db"),
        "{message}"
    );
}

#[test]
fn an_object_that_disappears_keeps_its_layer_waiting() {
    let plan = shop();
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(1),
    );
    let mut observed = observe(&plan, &[("queue", config_map("queue"))]);
    observed.resources.insert(index(&plan, "db"), None);
    let d2 = step(&revision, &d1.status, &observed, &at(2));
    let message = layer_status(&d2.status, "database")
        .message
        .clone()
        .unwrap();
    assert_eq!(message, "waiting for Deployment db: not found");
}

#[test]
fn sequencing_none_applies_every_layer_at_once() {
    let plan = shop();
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: Settings {
            sequenced: false,
            ..settings()
        },
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(1),
    );
    assert_eq!(d1.actions.len(), 3);
    assert!(!d1.status.history[0].sequenced);
}

#[test]
fn without_wait_only_what_something_waits_on_is_checked() {
    let plan = shop();
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: Settings {
            wait: false,
            ..settings()
        },
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(1),
    );
    let observed = observe(
        &plan,
        &[
            ("db", deployment("db", true)),
            ("queue", config_map("queue")),
        ],
    );
    let d2 = step(&revision, &d1.status, &observed, &at(2));
    assert_eq!(applied_layers(&plan, &d2), ["app"]);
    // Nothing waits on app: it is not read, and the release is Ready once it is applied.
    assert!(rollout::wanted(&revision, &d2.status).resources.is_empty());
    let d3 = step(&revision, &d2.status, &Observations::default(), &at(3));
    assert_eq!(d3.status.phase, Some(ReleasePhase::Ready));
}

#[test]
fn crds_come_first_and_must_be_established() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced",
                 "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    });
    let plan = plan_of(&[
        ("crds/widgets.yaml", crd.to_string()),
        ("templates/widget.yaml", object("Widget", "w", &[])),
    ]);
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let status = started(&revision);
    assert_eq!(status.layers[0].name, rollout::CRD_LAYER);
    let d1 = step(&revision, &status, &Observations::default(), &at(1));
    assert_eq!(d1.actions, [Action::ApplyCrds]);
    assert!(rollout::wanted(&revision, &d1.status).crds);
    let mut observed = Observations::default();
    let mut established = crd.clone();
    established["status"] = json!({"conditions": [{"type": "Established", "status": "True"}, {"type": "NamesAccepted", "status": "True"}]});
    observed.crds.insert(0, Some(crd.clone()));
    let d2 = step(&revision, &d1.status, &observed, &at(2));
    assert!(
        d2.actions.is_empty(),
        "not Established yet: {:?}",
        d2.actions
    );
    observed.crds.insert(0, Some(established));
    let d3 = step(&revision, &d2.status, &observed, &at(3));
    assert_eq!(d3.actions, [Action::ApplyLayer(0)]);
    assert_eq!(
        d3.status.progress.as_deref(),
        Some("0/1"),
        "CRDs are not a layer in the count"
    );
}

fn key(kind: &str, name: &str) -> ObjectKey {
    ObjectKey {
        api_version: "v1".into(),
        kind: kind.into(),
        namespace: Some("shop".into()),
        name: name.into(),
    }
}

#[test]
fn an_upgrade_prunes_what_the_previous_revision_had_after_its_layers_are_ready() {
    let plan = plan_of(&[(
        "templates/queue.yaml",
        object("ConfigMap", "queue", &[("helm.sh/layer", "queue")]),
    )]);
    let prune = vec![key("ConfigMap", "old-b"), key("ConfigMap", "old-a")];
    let revision = Revision {
        plan: &plan,
        prune: &prune,
        settings: settings(),
    };
    let previous = SequencedReleaseStatus {
        revision: Some(1),
        ..SequencedReleaseStatus::default()
    };
    let status = begin(&revision, &previous, Some(2), "sha256:2", None, &at(0));
    assert_eq!(status.revision, Some(2));
    assert_eq!(status.layers.last().unwrap().name, rollout::PRUNE_LAYER);
    let d1 = step(&revision, &status, &Observations::default(), &at(1));
    assert_eq!(
        d1.actions,
        [Action::ApplyLayer(0)],
        "prune waits for the layers"
    );
    let d2 = step(
        &revision,
        &d1.status,
        &observe(&plan, &[("queue", config_map("queue"))]),
        &at(2),
    );
    assert_eq!(d2.actions, [Action::Prune]);
    let wanted = rollout::wanted(&revision, &d2.status);
    assert_eq!(wanted.exists, prune);
    let mut observed = Observations {
        exists: HashMap::from([(prune[0].clone(), false), (prune[1].clone(), true)]),
        ..Observations::default()
    };
    let d3 = step(&revision, &d2.status, &observed, &at(3));
    assert_eq!(d3.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(
        layer_status(&d3.status, rollout::PRUNE_LAYER)
            .message
            .as_deref(),
        Some("waiting for ConfigMap shop/old-a to be deleted")
    );
    observed.exists.insert(prune[1].clone(), false);
    let d4 = step(&revision, &d3.status, &observed, &at(4));
    assert_eq!(d4.status.phase, Some(ReleasePhase::Ready));
    assert_eq!(d4.status.history.len(), 1);
}

#[test]
fn uninstall_deletes_dependents_first_and_waits_for_each_step_to_be_gone() {
    let plan = shop();
    let keys: Vec<Option<String>> = plan.resources.iter().map(|_| Some("shop".into())).collect();
    let inventory = Inventory::from_plan(&plan, |i| keys[i].clone());
    let names: Vec<&str> = inventory.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[0], "app", "app goes first: {names:?}");
    let d1 = uninstall_step(
        &inventory,
        true,
        &SequencedReleaseStatus::default(),
        &Observations::default(),
        &at(1),
    );
    assert_eq!(d1.actions, [Action::DeleteStep(0)]);
    assert_eq!(d1.status.phase, Some(ReleasePhase::Uninstalling));
    let pending: Vec<_> = d1.status.layers[1..]
        .iter()
        .map(|l| l.message.clone().unwrap())
        .collect();
    assert!(
        pending
            .iter()
            .all(|m| m == "waiting for layer app of chart shop to be deleted"),
        "{pending:?}"
    );
    // app still exists: nothing more is deleted.
    let wanted = rollout::wanted_for_uninstall(&inventory, &d1.status);
    let mut observed = Observations::default();
    for k in &wanted.exists {
        observed.exists.insert(k.clone(), true);
    }
    let d2 = uninstall_step(&inventory, true, &d1.status, &observed, &at(2));
    assert!(d2.actions.is_empty());
    for k in &wanted.exists {
        observed.exists.insert(k.clone(), false);
    }
    let d3 = uninstall_step(&inventory, true, &d2.status, &observed, &at(3));
    let mut next: Vec<_> = d3.actions.clone();
    next.sort_by_key(|a| format!("{a:?}"));
    assert_eq!(next, [Action::DeleteStep(1), Action::DeleteStep(2)]);
    let mut gone = Observations::default();
    for k in inventory.objects() {
        gone.exists.insert(k.clone(), false);
    }
    let d4 = uninstall_step(&inventory, true, &d3.status, &gone, &at(4));
    assert!(d4.finished);
    assert_eq!(d4.status.message.as_deref(), Some("uninstalled"));
    // Unsequenced: everything at once.
    let all = uninstall_step(
        &inventory,
        false,
        &SequencedReleaseStatus::default(),
        &Observations::default(),
        &at(1),
    );
    assert_eq!(all.actions.len(), inventory.steps.len());
}

#[test]
fn kots_phases_without_gates_are_applied_in_one_step() {
    let plan = plan_of(&[
        (
            "templates/a.yaml",
            object("ConfigMap", "a", &[("kots.io/creation-phase", "-1")]),
        ),
        (
            "templates/b.yaml",
            object("ConfigMap", "b", &[("kots.io/creation-phase", "1")]),
        ),
        (
            "templates/c.yaml",
            object(
                "Deployment",
                "c",
                &[
                    ("kots.io/creation-phase", "2"),
                    ("kots.io/wait-for-ready", "true"),
                ],
            ),
        ),
        (
            "templates/d.yaml",
            object("ConfigMap", "d", &[("kots.io/creation-phase", "3")]),
        ),
    ]);
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(1),
    );
    assert_eq!(
        d1.actions.len(),
        3,
        "phases -1, 1 and 2 go at once; 3 waits for c: {:?}",
        d1.actions
    );
    let d2 = step(
        &revision,
        &d1.status,
        &observe(&plan, &[("c", deployment("c", true))]),
        &at(2),
    );
    assert_eq!(d2.actions.len(), 1);
}

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let plan = shop();
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: settings(),
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(1),
    );
    let d2 = step(
        &revision,
        &d1.status,
        &observe(&plan, &[("queue", config_map("queue"))]),
        &at(30),
    );
    let time = |s: &SequencedReleaseStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Reconciling")
            .unwrap()
            .last_transition_time
            .clone()
    };
    assert_eq!(time(&d2.status), at(0));
}

/// A one-layer release whose Job failed at second 2, with `retries`.
fn failed_job_release(retries: u32) -> (Plan, Decision) {
    let plan = plan_of(&[(
        "templates/job.yaml",
        object("Job", "migrate", &[("helm.sh/layer", "db")]),
    )]);
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: Settings {
            retries,
            ..settings()
        },
    };
    let d1 = step(
        &revision,
        &started(&revision),
        &Observations::default(),
        &at(1),
    );
    let failed_job = json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate"},
        "status": {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}
    });
    let d2 = step(
        &revision,
        &d1.status,
        &observe(&plan, &[("migrate", failed_job)]),
        &at(2),
    );
    (plan, d2)
}

#[test]
fn a_failure_with_retries_left_schedules_a_retry_instead_of_stalling() {
    let (_, failed) = failed_job_release(2);
    let status = &failed.status;
    assert_eq!(status.phase, Some(ReleasePhase::Failed));
    assert_eq!(status.failures, Some(1));
    assert_eq!(condition(status, "Stalled").0, "False");
    assert_eq!(
        condition(status, "Reconciling"),
        ("True".into(), "RetryScheduled".into())
    );
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .ends_with("; retry 1 of 2 in 5s"),
        "{:?}",
        status.message
    );
    assert_eq!(failed.requeue_after, Some(Duration::from_secs(5)));
    // Due five seconds after the failure, not before.
    assert_eq!(
        rollout::retry_due(status, 2, &at(4)),
        Some(Duration::from_secs(3))
    );
    assert_eq!(rollout::retry_due(status, 2, &at(7)), Some(Duration::ZERO));
    // Without retries the same failure stalls and nothing is scheduled.
    let (_, stalled) = failed_job_release(0);
    assert_eq!(condition(&stalled.status, "Stalled").0, "True");
    assert_eq!(stalled.requeue_after, None);
    assert_eq!(rollout::retry_due(&stalled.status, 0, &at(100)), None);
}

#[test]
fn retries_count_up_with_doubling_delays_until_they_run_out() {
    let (plan, first) = failed_job_release(2);
    let revision = Revision {
        plan: &plan,
        prune: &[],
        settings: Settings {
            retries: 2,
            ..settings()
        },
    };
    // The retry is a new revision of the same spec: the count goes on.
    let retry = begin(&revision, &first.status, Some(1), "sha256:1", None, &at(10));
    assert_eq!(retry.revision, Some(2));
    assert_eq!(retry.failures, Some(1));
    let (second, delay) = rollout::failed(&retry, Some(1), "ReadinessFailed", "again", 2, &at(20));
    assert_eq!(second.failures, Some(2));
    assert_eq!(delay, Some(Duration::from_secs(10)));
    let (third, delay) = rollout::failed(&second, Some(1), "ReadinessFailed", "again", 2, &at(40));
    assert_eq!(third.failures, Some(3));
    assert_eq!(delay, None);
    assert_eq!(condition(&third, "Stalled").0, "True");
    assert_eq!(rollout::retry_due(&third, 2, &at(1000)), None);
    // A new generation (or digest) starts counting again.
    let changed = begin(&revision, &third, Some(2), "sha256:1", None, &at(50));
    assert_eq!(changed.failures, None);
    assert_eq!(
        [1, 2, 3, 7, 30].map(rollout::retry_delay),
        [5, 10, 20, 300, 300].map(Duration::from_secs)
    );
}

#[test]
fn an_interrupted_operation_is_reconciling_and_keeps_its_layers() {
    let (_, failed) = failed_job_release(0);
    let mut status = failed.status;
    status.phase = Some(ReleasePhase::Deploying);
    let interrupted = rollout::interrupted(&status, "interrupted: controller a stopped", &at(9));
    assert_eq!(
        condition(&interrupted, "Reconciling"),
        ("True".into(), "Interrupted".into())
    );
    assert_eq!(condition(&interrupted, "Stalled").0, "False");
    assert_eq!(interrupted.phase, Some(ReleasePhase::Deploying));
    assert_eq!(interrupted.layers, status.layers);
    assert_eq!(interrupted.lock, None);
}
