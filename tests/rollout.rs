//! The rollout of one revision, step by step, without a cluster: what each step applies, what
//! it waits for and what the status says. Time is passed in; nothing here reads a clock.

use sequenced_testkit as support;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sequenced::api::{
    CRD_LAYER, Claim, EventReason, Identity, LayerPhase, ObjectKey, PRUNE_LAYER, Reason,
    ReleasePhase, SequencedReleaseStatus,
};
use sequenced::history::Inventory;
use sequenced::plan::{self, Plan};
use sequenced::rollout::install::{self, InstallAction, InstallStep};
use sequenced::rollout::uninstall::UninstallStep;
use sequenced::rollout::{self, ActionFailure, Observations, Outcome, Revision, Settings, begin};
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
        adopt: false,
        timeout: Duration::from_secs(300),
        interval: Duration::from_secs(600),
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

/// A plan with what a revision needs around it: every resource's identity (in namespace shop),
/// the release, the prune list and the settings.
struct Fixture {
    plan: Plan,
    keys: Vec<ObjectKey>,
    prune: Vec<ObjectKey>,
    settings: Settings,
    me: Identity,
}

impl Fixture {
    fn new(plan: Plan) -> Fixture {
        let keys = plan
            .resources
            .iter()
            .map(|r| ObjectKey {
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                namespace: Some("shop".into()),
                name: r.name.clone(),
            })
            .collect();
        Fixture {
            plan,
            keys,
            prune: Vec::new(),
            settings: settings(),
            me: me(),
        }
    }

    fn with(mut self, settings: Settings) -> Fixture {
        self.settings = settings;
        self
    }

    fn revision(&self) -> Revision<'_> {
        Revision {
            plan: &self.plan,
            keys: &self.keys,
            prune: &self.prune,
            settings: self.settings,
            me: &self.me,
        }
    }

    /// One step. What the step asks to see first and the test did not give is absent: nothing
    /// of the release exists yet, or it is gone.
    fn step(
        &self,
        status: &SequencedReleaseStatus,
        observed: &Observations,
        now: Time,
    ) -> InstallStep {
        let mut observed = observed.clone();
        for _ in 0..4 {
            match install::step(&self.revision(), status, &observed, &now) {
                Outcome::Decided(step) => return step,
                Outcome::Need(wanted) => absent(&mut observed, &wanted),
            }
        }
        panic!("the step keeps asking for observations");
    }

    fn started(&self) -> SequencedReleaseStatus {
        begin(
            &self.revision(),
            &SequencedReleaseStatus::default(),
            Some(1),
            "sha256:1",
            Some("0.1.0"),
            &at(0),
        )
    }

    fn index(&self, name: &str) -> usize {
        self.plan
            .resources
            .iter()
            .position(|r| r.name == name)
            .unwrap()
    }

    fn observe(&self, objects: &[(&str, Value)]) -> Observations {
        let mut observed = Observations::default();
        for (name, object) in objects {
            observed
                .resources
                .insert(self.index(name), Some(object.clone()));
        }
        observed
    }

    fn applied_layers(&self, step: &InstallStep) -> Vec<String> {
        step.actions
            .iter()
            .map(|a| match a {
                InstallAction::ApplyLayer(i) => self.plan.layers[*i].name.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }
}

/// Marks everything `wanted` names that `observed` lacks as absent.
fn absent(observed: &mut Observations, wanted: &rollout::Wanted) {
    for &r in &wanted.resources {
        observed.resources.entry(r).or_insert(None);
    }
    for e in &wanted.external {
        observed.external.entry(*e).or_insert(None);
    }
    for k in &wanted.present {
        observed.present.entry(k.clone()).or_insert(None);
    }
}

fn me() -> Identity {
    Identity {
        owner: "shop/shop".into(),
        release_name: "shop".into(),
        target_namespace: "shop".into(),
    }
}

/// The seed's example: database and queue, then app.
fn shop() -> Fixture {
    Fixture::new(plan_of(&[
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
    ]))
}

fn deployment(name: &str, ready: bool) -> Value {
    let available = if ready { 1 } else { 0 };
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "generation": 1, "annotations": {"sequenced.dev/owner": "shop/shop"}},
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

fn layer_status<'a>(
    status: &'a SequencedReleaseStatus,
    name: &str,
) -> &'a sequenced::api::LayerStatus {
    status.layers.iter().find(|l| l.name == name).unwrap()
}

fn condition(status: &SequencedReleaseStatus, type_: &str) -> (String, String) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.clone(), c.reason.clone())
}

fn reasons(step: &InstallStep) -> Vec<EventReason> {
    step.events.iter().map(|e| e.reason).collect()
}

#[test]
fn database_and_queue_start_together_and_app_waits_until_both_are_ready() {
    let fx = shop();
    let status = fx.started();
    assert_eq!(status.revision, Some(1));
    assert_eq!(status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(status.progress.as_deref(), Some("0/3"));
    assert_eq!(condition(&status, "Reconciling").0, "True");

    // Step 1: nothing applied yet; both independent layers start.
    assert!(install::wanted(&fx.revision(), &status).is_empty());
    let d1 = fx.step(&status, &Observations::default(), at(1));
    let mut first = fx.applied_layers(&d1);
    first.sort();
    assert_eq!(first, ["database", "queue"]);
    assert_eq!(layer_status(&d1.status, "app").phase, LayerPhase::Pending);
    assert!(!d1.finished);

    // Step 2: the queue exists (ready), the database is not ready yet: app waits, naming db.
    let wanted = install::wanted(&fx.revision(), &d1.status);
    assert_eq!(wanted.resources.len(), 2);
    let observed = fx.observe(&[
        ("db", deployment("db", false)),
        ("queue", config_map("queue")),
    ]);
    let d2 = fx.step(&d1.status, &observed, at(2));
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
        [EventReason::LayerReady]
    );
    // The next timeout is when db's readiness timeout falls.
    assert_eq!(d2.requeue_after, Some(Duration::from_secs(299)));

    // Step 3: db ready: app is applied in the same step.
    let observed = fx.observe(&[("db", deployment("db", true))]);
    let d3 = fx.step(&d2.status, &observed, at(3));
    assert_eq!(fx.applied_layers(&d3), ["app"]);

    // Step 4: app ready: the release is Ready.
    let observed = fx.observe(&[("app", deployment("app", true))]);
    let d4 = fx.step(&d3.status, &observed, at(4));
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
    assert!(
        d4.events
            .iter()
            .any(|e| e.reason == EventReason::ReleaseReady)
    );

    // Step 5: nothing left to do, nothing to read.
    assert!(install::wanted(&fx.revision(), &d4.status).is_empty());
    let d5 = fx.step(&d4.status, &Observations::default(), at(5));
    assert!(d5.actions.is_empty() && d5.events.is_empty());
    assert_eq!(d5.status, d4.status);
}

#[test]
fn the_same_inputs_give_the_same_decision() {
    let fx = shop();
    let status = fx.started();
    let d1 = fx.step(&status, &Observations::default(), at(1));
    let observed = fx.observe(&[
        ("db", deployment("db", false)),
        ("queue", config_map("queue")),
    ]);
    assert_eq!(
        fx.step(&d1.status, &observed, at(7)),
        fx.step(&d1.status, &observed, at(7))
    );
}

#[test]
fn a_readiness_failure_fails_the_release_naming_the_object() {
    let (fx, d2) = failed_job_release(0);
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
            .any(|e| e.warning && e.reason == EventReason::LayerFailed)
    );
    // A failed release does nothing more until its spec changes.
    let d3 = fx.step(&d2.status, &Observations::default(), at(3));
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
    let fx = Fixture::new(plan);
    let d1 = fx.step(&fx.started(), &Observations::default(), at(0));
    let slow = fx.observe(&[("db", deployment("db", false))]);
    let d2 = fx.step(&d1.status, &slow, at(5));
    assert_eq!(d2.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(d2.requeue_after, Some(Duration::from_secs(15)));
    assert_eq!(d2.timeouts, 0);
    let d3 = fx.step(&d2.status, &slow, at(21));
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
    let fx = shop();
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let mut observed = fx.observe(&[("queue", config_map("queue"))]);
    observed.resources.insert(fx.index("db"), None);
    let d2 = fx.step(&d1.status, &observed, at(2));
    let message = layer_status(&d2.status, "database")
        .message
        .clone()
        .unwrap();
    assert_eq!(message, "waiting for Deployment db: not found");
}

#[test]
fn sequencing_none_applies_every_layer_at_once() {
    let fx = shop().with(Settings {
        sequenced: false,
        ..settings()
    });
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    assert_eq!(d1.actions.len(), 3);
    assert!(!d1.status.history[0].sequenced);
}

#[test]
fn without_wait_only_what_something_waits_on_is_checked() {
    let fx = shop().with(Settings {
        wait: false,
        ..settings()
    });
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let observed = fx.observe(&[
        ("db", deployment("db", true)),
        ("queue", config_map("queue")),
    ]);
    let d2 = fx.step(&d1.status, &observed, at(2));
    assert_eq!(fx.applied_layers(&d2), ["app"]);
    // Nothing waits on app: it is not read, and the release is Ready once it is applied.
    assert!(
        install::wanted(&fx.revision(), &d2.status)
            .resources
            .is_empty()
    );
    let d3 = fx.step(&d2.status, &Observations::default(), at(3));
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
    let fx = Fixture::new(plan);
    let status = fx.started();
    assert_eq!(status.layers[0].name, CRD_LAYER);
    let d1 = fx.step(&status, &Observations::default(), at(1));
    assert_eq!(d1.actions, [InstallAction::ApplyCrds]);
    assert!(install::wanted(&fx.revision(), &d1.status).crds);
    let mut observed = Observations::default();
    let mut established = crd.clone();
    established["status"] = json!({"conditions": [{"type": "Established", "status": "True"}, {"type": "NamesAccepted", "status": "True"}]});
    observed.crds.insert(0, Some(crd.clone()));
    let d2 = fx.step(&d1.status, &observed, at(2));
    assert!(
        d2.actions.is_empty(),
        "not Established yet: {:?}",
        d2.actions
    );
    observed.crds.insert(0, Some(established));
    let d3 = fx.step(&d2.status, &observed, at(3));
    assert_eq!(d3.actions, [InstallAction::ApplyLayer(0)]);
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

/// Whose an object says it is: the release's own, or someone else's.
fn claim(owner: &str) -> Option<Claim> {
    Some(Claim {
        owner: Some(owner.to_string()),
        ..Claim::default()
    })
}

#[test]
fn an_upgrade_prunes_what_the_previous_revision_had_after_its_layers_are_ready() {
    let mut fx = Fixture::new(plan_of(&[(
        "templates/queue.yaml",
        object("ConfigMap", "queue", &[("helm.sh/layer", "queue")]),
    )]));
    let old = [
        key("ConfigMap", "old-b"),
        key("ConfigMap", "old-a"),
        key("ConfigMap", "theirs"),
    ];
    fx.prune = old.to_vec();
    let previous = SequencedReleaseStatus {
        revision: Some(1),
        ..SequencedReleaseStatus::default()
    };
    let status = begin(&fx.revision(), &previous, Some(2), "sha256:2", None, &at(0));
    assert_eq!(status.revision, Some(2));
    assert_eq!(status.layers.last().unwrap().name, PRUNE_LAYER);
    let d1 = fx.step(&status, &Observations::default(), at(1));
    assert_eq!(
        d1.actions,
        [InstallAction::ApplyLayer(0)],
        "prune waits for the layers"
    );
    // Before pruning, the objects are looked at: only those that are still there and ours go.
    let queue_ready = fx.observe(&[("queue", config_map("queue"))]);
    let Outcome::Need(wanted) = install::step(&fx.revision(), &d1.status, &queue_ready, &at(2))
    else {
        panic!("the prune objects are observed first");
    };
    assert_eq!(wanted.present, old);
    let mut observed = queue_ready.clone();
    observed.present.insert(old[0].clone(), None);
    observed.present.insert(old[1].clone(), claim("shop/shop"));
    observed.present.insert(old[2].clone(), claim("shop/other"));
    let d2 = fx.step(&d1.status, &observed, at(2));
    assert_eq!(d2.actions, [InstallAction::Prune(vec![old[1].clone()])]);
    assert_eq!(install::wanted(&fx.revision(), &d2.status).present, old);
    let d3 = fx.step(&d2.status, &observed, at(3));
    assert_eq!(d3.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(
        layer_status(&d3.status, PRUNE_LAYER).message.as_deref(),
        Some("waiting for ConfigMap shop/old-a to be deleted")
    );
    observed.present.insert(old[1].clone(), None);
    let d4 = fx.step(&d3.status, &observed, at(4));
    assert_eq!(d4.status.phase, Some(ReleasePhase::Ready));
    assert_eq!(d4.status.history.len(), 1);
}

#[test]
fn an_object_of_someone_else_fails_the_step_before_anything_is_written() {
    let fx = shop();
    // database and queue would start together; queue's object belongs to another release.
    let mut theirs = config_map("queue");
    theirs["metadata"]["annotations"] =
        json!({"meta.helm.sh/release-name": "other", "meta.helm.sh/release-namespace": "shop"});
    let observed = fx.observe(&[("queue", theirs)]);
    let Outcome::Need(wanted) = install::step(&fx.revision(), &fx.started(), &observed, &at(1))
    else {
        panic!("the objects of the starting layers are observed first");
    };
    assert_eq!(wanted.resources, [fx.index("db")].into());
    let d1 = fx.step(&fx.started(), &observed, at(1));
    assert!(
        d1.actions.is_empty(),
        "nothing is written: {:?}",
        d1.actions
    );
    assert_eq!(d1.status.phase, Some(ReleasePhase::Failed));
    assert_eq!(
        condition(&d1.status, "Stalled"),
        ("True".into(), "OwnershipConflict".into())
    );
    let queue = layer_status(&d1.status, "queue");
    assert_eq!(queue.phase, LayerPhase::Failed);
    assert_eq!(
        queue.message.as_deref(),
        Some(
            "ConfigMap shop/queue (chart shop, templates/queue.yaml) belongs to Helm release other in namespace shop; it is left alone"
        )
    );
    assert_eq!(
        layer_status(&d1.status, "database").phase,
        LayerPhase::Pending
    );
    assert_eq!(reasons(&d1), [EventReason::LayerFailed]);

    // An object nobody owns is taken over only with adopt.
    let observed = fx.observe(&[("queue", config_map("queue"))]);
    let refused = fx.step(&fx.started(), &observed, at(1));
    assert!(refused.actions.is_empty());
    assert!(
        refused
            .status
            .message
            .as_deref()
            .unwrap()
            .contains("set spec.adopt: true"),
        "{:?}",
        refused.status.message
    );
    let adopting = shop().with(Settings {
        adopt: true,
        ..settings()
    });
    let d1 = adopting.step(&adopting.started(), &observed, at(1));
    assert_eq!(d1.actions.len(), 2);
}

#[test]
fn a_failed_action_names_its_layer_and_the_layers_after_it_go_back_to_pending() {
    let fx = shop().with(Settings {
        retries: 1,
        ..settings()
    });
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    assert_eq!(d1.actions.len(), 2);
    let refused = ActionFailure {
        transient: false,
        reason: Reason::ApplyFailed,
        message: "applying Deployment shop/db: invalid (chart shop, templates/db.yaml)".into(),
    };
    let (status, events, retry) = install::fail_action(&fx.revision(), &d1, 0, &refused, &at(1));
    let failed = status
        .layers
        .iter()
        .find(|l| l.phase == LayerPhase::Failed)
        .unwrap();
    assert_eq!(failed.message.as_deref(), Some(refused.message.as_str()));
    assert_eq!(
        status
            .layers
            .iter()
            .filter(|l| l.phase == LayerPhase::Pending)
            .count(),
        2,
        "the other starting layer and app"
    );
    assert_eq!(
        condition(&status, "Reconciling"),
        ("True".into(), "RetryScheduled".into())
    );
    assert_eq!(retry, Some(Duration::from_secs(5)));
    assert_eq!(events.len(), 1);
    // A transient error leaves the layer Applying, to be tried again, and counts no failure.
    let busy = ActionFailure {
        transient: true,
        ..refused
    };
    let (status, events, retry) = install::fail_action(&fx.revision(), &d1, 1, &busy, &at(1));
    assert_eq!(status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(status.failures, None);
    assert!(
        status
            .layers
            .iter()
            .any(|l| l.phase == LayerPhase::Applying)
    );
    assert!(events.is_empty() && retry.is_none());
    // Interrupted after the first action: the second layer was not reached.
    let cut = install::cut_short(&fx.revision(), &d1, 1);
    assert_eq!(
        cut.layers
            .iter()
            .filter(|l| l.phase == LayerPhase::Waiting)
            .count(),
        1
    );
}

/// One uninstall step; what it asks to see and the test did not give is gone.
fn uninstall(
    inventory: &Inventory,
    sequenced: bool,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    now: Time,
) -> UninstallStep {
    let mut observed = observed.clone();
    for _ in 0..4 {
        match rollout::uninstall_step(inventory, sequenced, status, &observed, &me(), &now) {
            Outcome::Decided(step) => return step,
            Outcome::Need(wanted) => absent(&mut observed, &wanted),
        }
    }
    panic!("the uninstall keeps asking for observations");
}

#[test]
fn uninstall_deletes_dependents_first_and_waits_for_each_step_to_be_gone() {
    let fx = shop();
    let inventory = Inventory::from_plan(&fx.plan, |_| Some("shop".into()));
    let names: Vec<&str> = inventory.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[0], "app", "app goes first: {names:?}");
    let ours = |keys: &[ObjectKey]| {
        let mut observed = Observations::default();
        for k in keys {
            observed.present.insert(k.clone(), claim("shop/shop"));
        }
        observed
    };
    let app = inventory.steps[0].objects.clone();
    let d1 = uninstall(
        &inventory,
        true,
        &SequencedReleaseStatus::default(),
        &ours(&app),
        at(1),
    );
    assert_eq!(d1.deletes, [(0, app.clone())]);
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
    let d2 = uninstall(&inventory, true, &d1.status, &ours(&app), at(2));
    assert!(d2.deletes.is_empty());
    // app is gone: the other two start together; one of their objects is someone else's now,
    // and is left alone.
    let mut observed = Observations::default();
    for k in inventory.objects() {
        observed.present.insert(k.clone(), claim("shop/shop"));
    }
    for k in &app {
        observed.present.insert(k.clone(), None);
    }
    let theirs = inventory.steps[1].objects[0].clone();
    observed.present.insert(theirs.clone(), claim("shop/other"));
    let d3 = uninstall(&inventory, true, &d2.status, &observed, at(3));
    let started: Vec<usize> = d3.deletes.iter().map(|(i, _)| *i).collect();
    assert_eq!(started, [1, 2]);
    assert!(!d3.deletes[0].1.contains(&theirs));
    let d4 = uninstall(
        &inventory,
        true,
        &d3.status,
        &Observations::default(),
        at(4),
    );
    assert!(d4.finished);
    assert_eq!(d4.status.message.as_deref(), Some("uninstalled"));
    // Unsequenced: everything at once.
    let all = uninstall(
        &inventory,
        false,
        &SequencedReleaseStatus::default(),
        &observed,
        at(1),
    );
    assert_eq!(all.deletes.len(), inventory.steps.len());
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
    let fx = Fixture::new(plan);
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    assert_eq!(
        d1.actions.len(),
        3,
        "phases -1, 1 and 2 go at once; 3 waits for c: {:?}",
        d1.actions
    );
    let d2 = fx.step(
        &d1.status,
        &fx.observe(&[("c", deployment("c", true))]),
        at(2),
    );
    assert_eq!(d2.actions.len(), 1);
}

#[test]
fn conditions_keep_their_transition_time_while_unchanged() {
    let fx = shop();
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let d2 = fx.step(
        &d1.status,
        &fx.observe(&[("queue", config_map("queue"))]),
        at(30),
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
fn failed_job_release(retries: u32) -> (Fixture, InstallStep) {
    let plan = plan_of(&[(
        "templates/job.yaml",
        object("Job", "migrate", &[("helm.sh/layer", "db")]),
    )]);
    let fx = Fixture::new(plan).with(Settings {
        retries,
        ..settings()
    });
    let d1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let failed_job = json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate"},
        "status": {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]}
    });
    let d2 = fx.step(&d1.status, &fx.observe(&[("migrate", failed_job)]), at(2));
    (fx, d2)
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
    let (fx, first) = failed_job_release(2);
    let revision = fx.revision();
    // The retry is a new revision of the same spec: the count goes on.
    let retry = begin(&revision, &first.status, Some(1), "sha256:1", None, &at(10));
    assert_eq!(retry.revision, Some(2));
    assert_eq!(retry.failures, Some(1));
    let (second, delay) = rollout::failed(
        &retry,
        Some(1),
        Reason::ReadinessFailed,
        "again",
        2,
        &at(20),
    );
    assert_eq!(second.failures, Some(2));
    assert_eq!(delay, Some(Duration::from_secs(10)));
    let (third, delay) = rollout::failed(
        &second,
        Some(1),
        Reason::ReadinessFailed,
        "again",
        2,
        &at(40),
    );
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
