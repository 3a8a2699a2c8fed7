//! The rollout of one revision, step by step, without a cluster: what each step applies, what
//! it waits for and what the status says. Time is passed in; nothing here reads a clock.

use sequenced_testkit as support;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sequenced::api::{
    CRD_LAYER, Claim, CrdPolicy, EventReason, Identity, LayerPhase, ObjectKey, OnFailure,
    PRUNE_LAYER, Reason, ReleasePhase, SequencedReleaseStatus,
};
use sequenced::history::{HookRecord, Inventory};
use sequenced::plan::{self, Plan};
use sequenced::readiness::HealthChecks;
use sequenced::rollout::hooks::HookAction;
use sequenced::rollout::install::{self, InstallAction, InstallStep};
use sequenced::rollout::uninstall::UninstallStep;
use sequenced::rollout::{self, ActionFailure, Observations, Outcome, Revision, Settings, begin};
use serde_json::{Value, json};
use support::{chart_tree, object, rendered, widget_crd};
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
        disable_hooks: false,
        crds: None,
        on_failure: OnFailure::Keep,
        drift: sequenced::api::DriftDetection::Enabled,
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
    hooks: Vec<HookRecord>,
    upgrade: bool,
    crds: CrdPolicy,
    settings: Settings,
    me: Identity,
    /// `spec.healthCheckExprs`, compiled.
    health: HealthChecks,
}

impl Fixture {
    fn new(plan: Plan) -> Fixture {
        let (keys, hooks) = support::identities(&plan, "shop");
        Fixture {
            plan,
            keys,
            prune: Vec::new(),
            hooks,
            upgrade: false,
            crds: CrdPolicy::Create,
            settings: settings(),
            me: me(),
            health: HealthChecks::default(),
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
            hooks: if self.settings.disable_hooks {
                &[]
            } else {
                &self.hooks
            },
            upgrade: self.upgrade,
            rollback: false,
            crds: self.crds,
            run: "uid-shop/1".into(),
            settings: self.settings,
            me: &self.me,
            test: None,
            rules: &[],
            health: &self.health,
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
                Outcome::Need(wanted) => {
                    if wanted.crds {
                        for i in 0..self.plan.crds.len() {
                            observed.crds.entry(i).or_insert(None);
                        }
                    }
                    absent(&mut observed, &wanted)
                }
            }
        }
        panic!("the step keeps asking for observations");
    }

    fn started(&self) -> SequencedReleaseStatus {
        begin(
            &self.revision(),
            1,
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
    for &h in &wanted.hooks {
        observed.hooks.entry(h).or_insert(None);
    }
    for &e in &wanted.hook_external {
        observed.hook_external.entry(e).or_insert(None);
    }
    for &h in &wanted.hook_logs {
        observed.hook_logs.entry(h).or_insert(None);
    }
}

fn me() -> Identity {
    Identity {
        owner: "shop/shop".into(),
        release_name: "shop".into(),
        target_namespace: "shop".into(),
        uid: "uid-shop".into(),
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
    // The API server did not answer for 10 s meanwhile: 11 s counted, not timed out, and the
    // next look is when the 20 s are reached.
    let mut paused = slow.clone();
    paused.outages = sequenced::rollout::outages::Outages::new([(at(6), at(16))]);
    let d3 = fx.step(&d2.status, &paused, at(21));
    assert_eq!(d3.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(d3.timeouts, 0);
    assert_eq!(d3.requeue_after, Some(Duration::from_secs(9)));
    let d4 = fx.step(&d2.status, &paused, at(31));
    assert_eq!(d4.status.phase, Some(ReleasePhase::Failed));
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
    let (fx, crd) = widget_chart(CrdPolicy::Create);
    let status = fx.started();
    assert_eq!(status.layers[0].name, CRD_LAYER);
    let d1 = fx.step(&status, &Observations::default(), at(1));
    assert_eq!(d1.actions, [InstallAction::ApplyCrds { replace: false }]);
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

/// A chart with CRD `widgets.example.com` in `crds/` and a Widget using it, under `policy`.
fn widget_chart(policy: CrdPolicy) -> (Fixture, Value) {
    let crd = widget_crd();
    let plan = plan_of(&[
        ("crds/widgets.yaml", crd.to_string()),
        ("templates/widget.yaml", object("Widget", "w", &[])),
    ]);
    let mut fx = Fixture::new(plan);
    fx.crds = policy;
    (fx, crd)
}

#[test]
fn skipped_crds_have_no_stage_and_the_layers_start_at_once() {
    let (fx, _) = widget_chart(CrdPolicy::Skip);
    let status = fx.started();
    let names: Vec<&str> = status.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["(default)"], "no (crds) entry that never starts");
    assert!(!install::wanted(&fx.revision(), &status).crds);
    let d1 = fx.step(&status, &Observations::default(), at(1));
    assert_eq!(d1.actions, [InstallAction::ApplyLayer(0)]);
}

#[test]
fn create_replace_reads_whose_the_crds_are_then_applies_every_one_before_anything_else() {
    let (fx, crd) = widget_chart(CrdPolicy::CreateReplace);
    let status = fx.started();
    assert_eq!(status.layers[0].name, CRD_LAYER);
    // Whose they are is read before anything is written.
    assert!(install::wanted(&fx.revision(), &status).crds);
    match install::step(&fx.revision(), &status, &Observations::default(), &at(1)) {
        Outcome::Need(wanted) => assert!(wanted.crds),
        Outcome::Decided(step) => panic!("decided without reading the CRDs: {step:?}"),
    }
    // Absent, ours, or no release's (created by `helm install` or by hand): applied.
    let mut ours = crd.clone();
    ours["metadata"]["annotations"] = json!({"sequenced.dev/owner": "shop/shop"});
    for seen in [None, Some(crd.clone()), Some(ours)] {
        let mut observed = Observations::default();
        observed.crds.insert(0, seen);
        let d1 = fx.step(&status, &observed, at(1));
        assert_eq!(d1.actions, [InstallAction::ApplyCrds { replace: true }]);
        assert_eq!(d1.status.layers[0].phase, LayerPhase::Waiting);
        assert_eq!(d1.status.layers[1].phase, LayerPhase::Pending);
    }
}

#[test]
fn create_replace_leaves_a_crd_of_another_release_alone_and_fails_naming_it() {
    let (fx, crd) = widget_chart(CrdPolicy::CreateReplace);
    let mut theirs = crd;
    theirs["metadata"]["annotations"] = json!({"meta.helm.sh/release-name": "prometheus", "meta.helm.sh/release-namespace": "monitoring"});
    let mut observed = Observations::default();
    observed.crds.insert(0, Some(theirs));
    let d1 = fx.step(&fx.started(), &observed, at(1));
    assert!(d1.actions.is_empty(), "nothing written: {:?}", d1.actions);
    assert!(d1.finished);
    let message = "CustomResourceDefinition widgets.example.com (chart shop, crds/widgets.yaml) belongs to Helm release prometheus in namespace monitoring; it is left alone (spec.crds: CreateReplace updates only CRDs of this release or of none)";
    assert_eq!(d1.status.layers[0].phase, LayerPhase::Failed);
    assert_eq!(d1.status.layers[0].message.as_deref(), Some(message));
    assert_eq!(d1.status.layers[1].phase, LayerPhase::Pending);
    assert_eq!(d1.status.phase, Some(ReleasePhase::Failed));
    let ready = d1
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, Reason::OwnershipConflict.to_string());
    assert!(
        d1.events
            .iter()
            .any(|e| e.warning && e.reason == EventReason::LayerFailed && e.message == message)
    );
}

#[test]
fn create_creates_only_and_a_refused_crd_update_fails_the_revision_naming_it() {
    let (fx, _) = widget_chart(CrdPolicy::Create);
    let status = fx.started();
    // Create reads nothing before: it only creates what does not exist.
    assert!(!install::wanted(&fx.revision(), &status).crds);
    let d1 = fx.step(&status, &Observations::default(), at(1));
    assert_eq!(d1.actions, [InstallAction::ApplyCrds { replace: false }]);

    // CreateReplace whose apply the API server refuses: the (crds) entry and the revision fail
    // with the controller's message, the layers were not reached.
    let (fx, crd) = widget_chart(CrdPolicy::CreateReplace);
    let mut observed = Observations::default();
    observed.crds.insert(0, Some(crd));
    let before = fx.started();
    let d1 = fx.step(&before, &observed, at(1));
    let refused = ActionFailure {
        transient: false,
        reason: Reason::ApplyFailed,
        message: "applying CustomResourceDefinition widgets.example.com: it is invalid (chart shop, crds/widgets.yaml)".into(),
    };
    let (failed, events, _) =
        install::fail_action(&fx.revision(), &before, &d1, 0, &refused, &at(1));
    assert_eq!(failed.layers[0].phase, LayerPhase::Failed);
    assert_eq!(
        failed.layers[0].message.as_deref(),
        Some(refused.message.as_str())
    );
    assert_eq!(failed.layers[1].phase, LayerPhase::Pending);
    assert_eq!(failed.phase, Some(ReleasePhase::Failed));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].message, refused.message);
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
    let status = begin(
        &fx.revision(),
        previous.revision.unwrap_or(0) + 1,
        &previous,
        Some(2),
        "sha256:2",
        None,
        &at(0),
    );
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
    let (status, events, retry) =
        install::fail_action(&fx.revision(), &fx.started(), &d1, 0, &refused, &at(1));
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
    let (status, events, retry) =
        install::fail_action(&fx.revision(), &fx.started(), &d1, 1, &busy, &at(1));
    assert_eq!(status.phase, Some(ReleasePhase::Deploying));
    // It did not start: tried again later, the same failure makes the same entry.
    let again = fx.step(&fx.started(), &Observations::default(), at(9));
    let (later, _, _) =
        install::fail_action(&fx.revision(), &fx.started(), &again, 1, &busy, &at(9));
    assert_eq!(later.layers[1], status.layers[1]);
    assert_eq!(later.layers[1].started_at, None);
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
    let u = rollout::Uninstall {
        inventory,
        sequenced,
        hooks: &[],
        run: "uid-shop/1",
        timeout: Duration::from_secs(300),
    };
    uninstall_with(&u, status, observed, now)
}

fn uninstall_with(
    u: &rollout::Uninstall,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    now: Time,
) -> UninstallStep {
    let mut observed = observed.clone();
    for _ in 0..4 {
        match rollout::uninstall_step(u, status, &observed, &me(), &now) {
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
    let retry = begin(
        &revision,
        first.status.revision.unwrap_or(0) + 1,
        &first.status,
        Some(1),
        "sha256:1",
        None,
        &at(10),
    );
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
    let changed = begin(
        &revision,
        third.revision.unwrap_or(0) + 1,
        &third,
        Some(2),
        "sha256:1",
        None,
        &at(50),
    );
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

// Hooks (DESIGN.md "Stages" 2 and 5): one at a time by weight, each waited on until done.

/// The run marker of revision 1's hooks of `event`.
fn run(event: &str) -> String {
    format!("uid-shop/1/{event}")
}

/// A hook object as the API server returns it: ours, created by run `run` (None: by no run).
fn hook_object(kind: &str, name: &str, run: Option<&str>, status: Value) -> Value {
    let mut annotations = json!({"sequenced.dev/owner": "shop/shop"});
    if let Some(run) = run {
        annotations["sequenced.dev/hook-run"] = json!(run);
    }
    let api_version = if kind == "Job" { "batch/v1" } else { "v1" };
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        "status": status,
    })
}

/// Job statuses as kube-controller-manager writes them (tests/apiserver-recordings,
/// requests-lifecycle.json).
fn job_running() -> Value {
    json!({"startTime": "2026-11-23T19:11:57Z", "active": 1, "ready": 0, "terminating": 0,
           "uncountedTerminatedPods": {}})
}

fn job_complete() -> Value {
    json!({
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods"}
        ],
        "startTime": "2026-11-23T19:11:57Z", "completionTime": "2026-11-23T19:11:59Z",
        "succeeded": 1, "terminating": 0, "uncountedTerminatedPods": {}, "ready": 0
    })
}

fn job_failed() -> Value {
    json!({
        "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}
        ],
        "startTime": "2026-11-23T19:11:57Z", "failed": 1, "terminating": 0,
        "uncountedTerminatedPods": {}, "ready": 0
    })
}

impl Fixture {
    fn hook(&self, name: &str) -> usize {
        self.hooks.iter().position(|h| h.key.name == name).unwrap()
    }

    /// Observes the hooks given, by name.
    fn with_hooks(&self, mut observed: Observations, hooks: &[(&str, Value)]) -> Observations {
        for (name, object) in hooks {
            observed.hooks.insert(self.hook(name), Some(object.clone()));
        }
        observed
    }

    /// Observes that these hooks' objects exist, ours (what a clean-up looks at).
    fn with_present(&self, mut observed: Observations, names: &[&str]) -> Observations {
        for name in names {
            let key = self.hooks[self.hook(name)].key.clone();
            observed.present.insert(key, claim("shop/shop"));
        }
        observed
    }

    fn stage_names(&self, status: &SequencedReleaseStatus) -> Vec<String> {
        status.layers.iter().map(|l| l.name.clone()).collect()
    }

    /// The actions of a step, named: `apply a`, `create migrate (run)`, `delete migrate`.
    fn named(&self, step: &InstallStep) -> Vec<String> {
        step.actions
            .iter()
            .map(|a| match a {
                InstallAction::ApplyLayer(i) => format!("apply {}", self.plan.layers[*i].name),
                InstallAction::Hook { action, .. } => match action {
                    HookAction::Create { hook, run } => {
                        format!("create {} ({run})", self.hooks[*hook].key.name)
                    }
                    HookAction::Delete { hook } => format!("delete {}", self.hooks[*hook].key.name),
                },
                other => format!("{other:?}"),
            })
            .collect()
    }
}

/// A hook of a test chart: kind, name, annotations.
type HookSpec<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

fn layered_with_hooks(hooks: &[HookSpec]) -> Fixture {
    let mut documents = vec![
        (
            "templates/config.yaml".to_string(),
            object("ConfigMap", "config", &[("helm.sh/layer", "a")]),
        ),
        (
            "templates/app.yaml".to_string(),
            object(
                "ConfigMap",
                "app",
                &[("helm.sh/layer", "b"), ("helm.sh/depends-on/layers", "a")],
            ),
        ),
    ];
    for (kind, name, annotations) in hooks {
        documents.push((
            format!("templates/{name}.yaml"),
            object(kind, name, annotations),
        ));
    }
    let documents: Vec<(&str, String)> = documents
        .iter()
        .map(|(f, y)| (f.as_str(), y.clone()))
        .collect();
    Fixture::new(plan_of(&documents))
}

fn event_reasons(step: &InstallStep) -> Vec<EventReason> {
    step.events.iter().map(|e| e.reason).collect()
}

#[test]
fn a_pre_install_job_completes_before_the_first_layer_and_post_install_runs_after_the_last() {
    let fx = layered_with_hooks(&[
        ("Job", "migrate", &[("helm.sh/hook", "pre-install")]),
        ("Job", "notify", &[("helm.sh/hook", "post-install")]),
        ("Job", "upgrade-only", &[("helm.sh/hook", "pre-upgrade")]),
    ]);
    let status = fx.started();
    assert_eq!(
        fx.stage_names(&status),
        ["(pre-install)", "a", "b", "(post-install)"]
    );
    // Only the hook is created; no layer starts.
    let s1 = fx.step(&status, &Observations::default(), at(1));
    assert_eq!(
        fx.named(&s1),
        [format!("create migrate ({})", run("pre-install"))]
    );
    assert_eq!(event_reasons(&s1), [EventReason::HookStarted]);
    assert_eq!(s1.status.layers[0].phase, LayerPhase::Waiting);
    // Running: nothing to do, the status names the hook and why it is not done.
    let running = fx.with_hooks(
        Observations::default(),
        &[(
            "migrate",
            hook_object("Job", "migrate", Some(&run("pre-install")), job_running()),
        )],
    );
    let s2 = fx.step(&s1.status, &running, at(2));
    assert!(s2.actions.is_empty(), "{:?}", s2.actions);
    assert_eq!(
        s2.status.message.as_deref(),
        Some(
            "pre-install hooks: hook 1 of 1: waiting for Job migrate: running: 0 of 1 completions succeeded (1 active)"
                .replace("0 of 1 completions succeeded", "0 pods succeeded")
                .as_str()
        )
    );
    // Complete: the first layer starts in the same step.
    let done = fx.with_hooks(
        Observations::default(),
        &[(
            "migrate",
            hook_object("Job", "migrate", Some(&run("pre-install")), job_complete()),
        )],
    );
    let s3 = fx.step(&s2.status, &done, at(3));
    assert_eq!(fx.named(&s3), ["apply a"]);
    assert_eq!(
        event_reasons(&s3),
        [EventReason::HookSucceeded, EventReason::LayerStarted]
    );
    assert_eq!(s3.status.layers[0].phase, LayerPhase::Ready);
    // Layer a ready starts b; the post-install hook waits for b.
    let objects = fx.observe(&[("config", json!({"kind": "ConfigMap"}))]);
    let s4 = fx.step(&s3.status, &objects, at(4));
    assert_eq!(fx.named(&s4), ["apply b"]);
    let objects = fx.observe(&[
        ("config", json!({"kind": "ConfigMap"})),
        ("app", json!({"kind": "ConfigMap"})),
    ]);
    let s5 = fx.step(&s4.status, &objects, at(5));
    assert_eq!(
        fx.named(&s5),
        [format!("create notify ({})", run("post-install"))]
    );
    assert!(!s5.finished);
    let s6 = fx.step(
        &s5.status,
        &fx.with_hooks(
            objects,
            &[(
                "notify",
                hook_object("Job", "notify", Some(&run("post-install")), job_complete()),
            )],
        ),
        at(6),
    );
    assert!(s6.finished && s6.actions.is_empty());
    assert_eq!(s6.status.phase, Some(ReleasePhase::Ready));
    assert_eq!(
        s6.status.message.as_deref(),
        Some("revision 1 (chart version 0.1.0) is ready: 2 layers, 2 resources, 2 hooks")
    );
}

#[test]
fn hooks_run_one_at_a_time_by_weight_with_their_delete_policies() {
    let fx = layered_with_hooks(&[
        (
            "Job",
            "second",
            &[
                ("helm.sh/hook", "pre-install"),
                ("helm.sh/hook-weight", "1"),
                ("helm.sh/hook-delete-policy", "hook-succeeded"),
            ],
        ),
        (
            "Job",
            "first",
            &[
                ("helm.sh/hook", "pre-install"),
                ("helm.sh/hook-weight", "-1"),
            ],
        ),
    ]);
    let pre = run("pre-install");
    let status = fx.started();
    // An object of `first` from an earlier run: deleted (before-hook-creation, the default),
    // and its deletion awaited before the hook is created again.
    let earlier = hook_object(
        "Job",
        "first",
        Some("uid-shop/0/pre-install"),
        job_complete(),
    );
    let s1 = fx.step(
        &status,
        &fx.with_hooks(Observations::default(), &[("first", earlier.clone())]),
        at(1),
    );
    assert_eq!(fx.named(&s1), ["delete first"]);
    assert_eq!(s1.status.layers[0].phase, LayerPhase::Deleting);
    let s2 = fx.step(
        &s1.status,
        &fx.with_hooks(Observations::default(), &[("first", earlier)]),
        at(2),
    );
    assert!(s2.actions.is_empty());
    assert!(
        s2.status.layers[0]
            .message
            .as_deref()
            .unwrap()
            .contains("deleting the previous Job shop/first (before-hook-creation)"),
        "{:?}",
        s2.status.layers[0].message
    );
    let s3 = fx.step(&s2.status, &Observations::default(), at(3));
    assert_eq!(fx.named(&s3), [format!("create first ({pre})")]);
    // `first` done (kept: no hook-succeeded policy); `second` is created only now.
    let first_done = hook_object("Job", "first", Some(&pre), job_complete());
    let s4 = fx.step(
        &s3.status,
        &fx.with_hooks(Observations::default(), &[("first", first_done.clone())]),
        at(4),
    );
    assert_eq!(fx.named(&s4), [format!("create second ({pre})")]);
    assert_eq!(s4.status.layers[0].ready, 1);
    // `second` done: deleted (hook-succeeded), and the first layer starts.
    let both_done = fx.with_hooks(
        Observations::default(),
        &[
            ("first", first_done),
            (
                "second",
                hook_object("Job", "second", Some(&pre), job_complete()),
            ),
        ],
    );
    // `second` done: the stage is over, and hook-succeeded deletes `second` before any layer
    // starts; its deletion is awaited.
    let s5 = fx.step(
        &s4.status,
        &fx.with_present(both_done.clone(), &["second"]),
        at(5),
    );
    assert_eq!(fx.named(&s5), ["delete second"]);
    assert_eq!(s5.status.layers[0].phase, LayerPhase::CleaningUp);
    assert_eq!(
        s5.status.layers[0].message.as_deref(),
        Some("all 2 hooks succeeded; deleting Job/second (hook-succeeded, 1 of 1)")
    );
    // Gone: the first layer starts.
    let s6 = fx.step(&s5.status, &both_done, at(6));
    assert_eq!(fx.named(&s6), ["apply a"]);
    assert_eq!(s6.status.layers[0].phase, LayerPhase::Ready);
}

#[test]
fn a_failed_hook_job_fails_the_operation_naming_it_once_hook_failed_deleted_it() {
    let fx = layered_with_hooks(&[(
        "Job",
        "x-admission-create",
        &[
            ("helm.sh/hook", "pre-install"),
            (
                "helm.sh/hook-delete-policy",
                "before-hook-creation,hook-failed",
            ),
        ],
    )]);
    let pre = run("pre-install");
    let s1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let failed = fx.with_hooks(
        Observations::default(),
        &[(
            "x-admission-create",
            hook_object("Job", "x-admission-create", Some(&pre), job_failed()),
        )],
    );
    // Failed: the failure is told at once, and the status says so before anything is deleted
    // (a hook found gone while it is waited on counts as done).
    let present = fx.with_present(failed.clone(), &["x-admission-create"]);
    let s2 = fx.step(&s1.status, &present, at(2));
    assert!(s2.actions.is_empty(), "{:?}", s2.actions);
    assert!(!s2.finished);
    assert_eq!(s2.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(s2.status.layers[0].phase, LayerPhase::CleaningUp);
    let message = "pre-install hook Job/x-admission-create (chart shop, templates/x-admission-create.yaml) failed: Job x-admission-create: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)";
    assert_eq!(
        s2.status.message.as_deref(),
        Some(format!("pre-install hooks: {message}").as_str())
    );
    assert_eq!(event_reasons(&s2), [EventReason::HookFailed]);
    // Then the hook is deleted (hook-failed), and its deletion awaited.
    let s2 = fx.step(&s2.status, &present, at(2));
    assert_eq!(fx.named(&s2), ["delete x-admission-create"]);
    assert!(!s2.finished && s2.events.is_empty());
    assert_eq!(s2.status.layers[0].phase, LayerPhase::CleaningUp);
    // Gone: the operation fails, naming the hook.
    let s3 = fx.step(&s2.status, &failed, at(3));
    assert!(s3.actions.is_empty(), "{:?}", s3.actions);
    assert!(s3.finished);
    assert_eq!(s3.status.phase, Some(ReleasePhase::Failed));
    assert_eq!(s3.status.message.as_deref(), Some(message));
    let stalled = s3
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap();
    assert_eq!(stalled.reason, Reason::HookFailed.as_str());
    assert!(event_reasons(&s3).is_empty());
    assert_eq!(s3.status.layers[0].phase, LayerPhase::Failed);
    assert!(
        s3.status.layers[1..3]
            .iter()
            .all(|l| l.phase == LayerPhase::Pending)
    );
}

/// The admission-webhook certificate pattern: a Job's ServiceAccount, Role and RoleBinding are
/// hooks of the same event at lower weights, all `before-hook-creation,hook-succeeded`.
fn webhook_certs() -> Fixture {
    let policy = (
        "helm.sh/hook-delete-policy",
        "before-hook-creation,hook-succeeded",
    );
    let event = ("helm.sh/hook", "pre-install,pre-upgrade");
    layered_with_hooks(&[
        (
            "ServiceAccount",
            "x-admission",
            &[event, policy, ("helm.sh/hook-weight", "-1")],
        ),
        (
            "Role",
            "x-admission",
            &[event, policy, ("helm.sh/hook-weight", "-1")],
        ),
        (
            "RoleBinding",
            "x-admission",
            &[event, policy, ("helm.sh/hook-weight", "-1")],
        ),
        ("Job", "x-admission-create", &[event, policy]),
    ])
}

/// Every hook of `fx` done as created by `run`: Jobs complete, the rest as they are.
fn all_done(fx: &Fixture, run: &str) -> Observations {
    let hooks: Vec<(String, Value)> = fx
        .hooks
        .iter()
        .map(|h| {
            let status = if h.key.kind == "Job" {
                job_complete()
            } else {
                json!({})
            };
            (
                h.key.name.clone(),
                hook_object(&h.key.kind, &h.key.name, Some(run), status),
            )
        })
        .collect();
    let mut observed = Observations::default();
    for (i, h) in fx.hooks.iter().enumerate() {
        let (_, object) = &hooks[i];
        let mut object = object.clone();
        object["kind"] = json!(h.key.kind);
        observed.hooks.insert(i, Some(object));
    }
    observed
}

#[test]
fn hook_succeeded_deletes_only_after_every_hook_of_the_stage_in_reverse_order_each_awaited() {
    let fx = webhook_certs();
    let pre = run("pre-install");
    // Helm's order: weight, then name, then kind: the three at -1 share a name, so kind order.
    let order: Vec<String> = fx
        .hooks
        .iter()
        .map(|h| format!("{}/{}", h.key.kind, h.key.name))
        .collect();
    assert_eq!(
        order,
        [
            "ServiceAccount/x-admission",
            "Role/x-admission",
            "RoleBinding/x-admission",
            "Job/x-admission-create"
        ]
    );
    // Each hook is created once the one before is done; nothing is deleted on the way.
    let mut status = fx.started();
    let done = all_done(&fx, &pre);
    let mut created = Vec::new();
    for second in 1..=4 {
        let mut seen = Observations::default();
        for i in 0..(second - 1) {
            seen.hooks.insert(i, done.hooks[&i].clone());
        }
        let step = fx.step(&status, &seen, at(second as i64));
        created.extend(fx.named(&step));
        status = step.status;
    }
    assert_eq!(
        created,
        [
            format!("create x-admission ({pre})"),
            format!("create x-admission ({pre})"),
            format!("create x-admission ({pre})"),
            format!("create x-admission-create ({pre})"),
        ]
    );
    // The Job done: the clean-up deletes in reverse run order, one at a time, each awaited;
    // no layer starts meanwhile.
    let everything = ["x-admission", "x-admission-create"];
    let mut deleted = Vec::new();
    let mut present: Vec<usize> = (0..4).collect();
    let key = |i: usize| fx.hooks[i].key.clone();
    for second in 10..20 {
        let mut seen = done.clone();
        for &i in &present {
            seen.present.insert(key(i), claim("shop/shop"));
        }
        let step = fx.step(&status, &seen, at(second));
        status = step.status.clone();
        let actions: Vec<&InstallAction> = step.actions.iter().collect();
        match actions.as_slice() {
            [
                InstallAction::Hook {
                    action: HookAction::Delete { hook },
                    ..
                },
            ] => {
                assert_eq!(status.layers[0].phase, LayerPhase::CleaningUp);
                deleted.push(format!(
                    "{}/{}",
                    fx.hooks[*hook].key.kind, fx.hooks[*hook].key.name
                ));
                // Awaited: while it is being deleted (a finalizer holds it), nothing more is.
                let mut deleting = seen.clone();
                deleting.present.insert(
                    key(*hook),
                    Some(Claim {
                        deleting_with: vec!["example.com/cleanup".into()],
                        ..claim("shop/shop").unwrap()
                    }),
                );
                let again = fx.step(&status, &deleting, at(second));
                assert!(again.actions.is_empty(), "{:?}", again.actions);
                assert_eq!(again.status.layers[0].phase, LayerPhase::CleaningUp);
                present.retain(|i| i != hook);
            }
            [InstallAction::ApplyLayer(_)] => {
                assert!(present.is_empty());
                break;
            }
            other => panic!("unexpected actions {other:?}"),
        }
    }
    let _ = everything;
    assert_eq!(
        deleted,
        [
            "Job/x-admission-create",
            "RoleBinding/x-admission",
            "Role/x-admission",
            "ServiceAccount/x-admission"
        ]
    );
    assert_eq!(status.layers[0].phase, LayerPhase::Ready);
}

#[test]
fn a_failed_hook_deletes_itself_then_the_earlier_succeeded_hooks_in_run_order() {
    let fx = layered_with_hooks(&[
        (
            "ServiceAccount",
            "runner",
            &[
                ("helm.sh/hook", "pre-install"),
                ("helm.sh/hook-weight", "-2"),
                ("helm.sh/hook-delete-policy", "hook-succeeded"),
            ],
        ),
        (
            "Role",
            "runner",
            &[
                ("helm.sh/hook", "pre-install"),
                ("helm.sh/hook-weight", "-1"),
                (
                    "helm.sh/hook-delete-policy",
                    "hook-succeeded,before-hook-creation",
                ),
            ],
        ),
        (
            "Job",
            "migrate",
            &[
                ("helm.sh/hook", "pre-install"),
                ("helm.sh/hook-delete-policy", "hook-failed"),
            ],
        ),
    ]);
    let pre = run("pre-install");
    let mut status = fx.started();
    // Run the three: the Job fails.
    let mut seen = Observations::default();
    for (second, kind) in [(1, "ServiceAccount"), (2, "Role"), (3, "Job")] {
        status = fx.step(&status, &seen, at(second)).status;
        let i = fx.hooks.iter().position(|h| h.key.kind == kind).unwrap();
        let name = fx.hooks[i].key.name.clone();
        let state = if kind == "Job" {
            job_running()
        } else {
            json!({})
        };
        seen.hooks
            .insert(i, Some(hook_object(kind, &name, Some(&pre), state)));
    }
    assert_eq!(status.layers[0].ready, 2);
    assert_eq!(status.layers[0].phase, LayerPhase::Waiting);
    seen = fx.with_hooks(
        seen,
        &[(
            "migrate",
            hook_object("Job", "migrate", Some(&pre), job_failed()),
        )],
    );
    let mut present: Vec<usize> = (0..3).collect();
    let mut deleted = Vec::new();
    let mut last = None;
    for second in 10..20 {
        let mut now_seen = seen.clone();
        for &i in &present {
            now_seen
                .present
                .insert(fx.hooks[i].key.clone(), claim("shop/shop"));
        }
        let step = fx.step(&status, &now_seen, at(second));
        status = step.status.clone();
        if step.finished {
            last = Some(step);
            break;
        }
        for action in &step.actions {
            if let InstallAction::Hook {
                action: HookAction::Delete { hook },
                ..
            } = action
            {
                deleted.push(format!(
                    "{}/{}",
                    fx.hooks[*hook].key.kind, fx.hooks[*hook].key.name
                ));
                present.retain(|i| i != hook);
            }
        }
    }
    assert_eq!(
        deleted,
        ["Job/migrate", "ServiceAccount/runner", "Role/runner"]
    );
    let last = last.expect("the operation fails once the clean-up is done");
    assert_eq!(last.status.phase, Some(ReleasePhase::Failed));
    assert!(
        last.status.message.as_deref().unwrap().starts_with("pre-install hook Job/migrate (chart shop, templates/migrate.yaml) failed: Job migrate: failed"),
        "{:?}",
        last.status.message
    );
}

#[test]
fn a_crd_hook_is_never_deleted_by_a_delete_policy() {
    let fx = layered_with_hooks(&[(
        "CustomResourceDefinition",
        "widgets.example.com",
        &[
            ("helm.sh/hook", "pre-install"),
            (
                "helm.sh/hook-delete-policy",
                "before-hook-creation,hook-succeeded",
            ),
        ],
    )]);
    let pre = run("pre-install");
    let established = json!({"conditions": [
        {"type": "NamesAccepted", "status": "True"}, {"type": "Established", "status": "True"}]});
    let crd = |run: &str| {
        let mut o = hook_object(
            "CustomResourceDefinition",
            "widgets.example.com",
            Some(run),
            established.clone(),
        );
        o["apiVersion"] = json!("apiextensions.k8s.io/v1");
        o
    };
    // An earlier one is applied over, not deleted (before-hook-creation).
    let earlier = fx.with_hooks(
        Observations::default(),
        &[("widgets.example.com", crd("uid-shop/0/pre-install"))],
    );
    let s1 = fx.step(&fx.started(), &earlier, at(1));
    assert_eq!(
        fx.named(&s1),
        [format!("create widgets.example.com ({pre})")]
    );
    // Established: done, and not deleted (hook-succeeded) either; the layers start.
    let done = fx.with_hooks(
        Observations::default(),
        &[("widgets.example.com", crd(&pre))],
    );
    let done = fx.with_present(done, &["widgets.example.com"]);
    let s2 = fx.step(&s1.status, &done, at(2));
    assert_eq!(fx.named(&s2), ["apply a"]);
}

#[test]
fn a_controller_that_takes_over_before_the_clean_up_carries_it_out_once() {
    let fx = webhook_certs();
    let pre = run("pre-install");
    let done = all_done(&fx, &pre);
    // The previous holder wrote the stage with the Job running, and stopped.
    let mut status = fx.started();
    status.layers[0].phase = LayerPhase::Waiting;
    status.layers[0].ready = 3;
    status.layers[0].started_at = Some(at(5));
    // This controller sees the Job complete: the clean-up starts with the Job.
    let everything = fx.with_present(done.clone(), &["x-admission", "x-admission-create"]);
    let s1 = fx.step(&status, &everything, at(6));
    assert_eq!(fx.named(&s1), ["delete x-admission-create"]);
    // It stopped again after two deletions (the Job and the RoleBinding are gone); the next
    // holder deletes the Role, not the Job again.
    let mut seen = done.clone();
    for name in ["ServiceAccount", "Role"] {
        let i = fx.hooks.iter().position(|h| h.key.kind == name).unwrap();
        seen.present
            .insert(fx.hooks[i].key.clone(), claim("shop/shop"));
    }
    let s2 = fx.step(&s1.status, &seen, at(7));
    assert_eq!(fx.named(&s2), ["delete x-admission"]);
    let InstallAction::Hook {
        action: HookAction::Delete { hook },
        ..
    } = &s2.actions[0]
    else {
        unreachable!()
    };
    assert_eq!(fx.hooks[*hook].key.kind, "Role");
    // Everything gone: the stage is Ready and never cleans up again, whatever appears later.
    let s3 = fx.step(&s2.status, &done, at(8));
    assert_eq!(fx.named(&s3), ["apply a"]);
    assert_eq!(s3.status.layers[0].phase, LayerPhase::Ready);
    let s4 = fx.step(&s3.status, &everything, at(9));
    assert!(
        s4.actions
            .iter()
            .all(|a| !matches!(a, InstallAction::Hook { .. })),
        "{:?}",
        s4.actions
    );
}

#[test]
fn a_failed_hook_tells_the_end_of_its_pods_log_and_a_hook_succeeded_log_policy_its_success() {
    let fx = layered_with_hooks(&[
        (
            "Job",
            "a-seed",
            &[
                ("helm.sh/hook", "pre-install"),
                ("helm.sh/hook-output-log-policy", "hook-succeeded"),
            ],
        ),
        ("Job", "b-migrate", &[("helm.sh/hook", "pre-install")]),
    ]);
    let pre = run("pre-install");
    let s1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let mut seen = fx.with_hooks(
        Observations::default(),
        &[(
            "a-seed",
            hook_object("Job", "a-seed", Some(&pre), job_complete()),
        )],
    );
    seen.hook_logs.insert(
        fx.hook("a-seed"),
        Some(rollout::HookLog::tail(
            "a-seed-x1",
            "main",
            "seeding\nseeded 3 rows\n",
        )),
    );
    let s2 = fx.step(&s1.status, &seen, at(2));
    let note = &s2
        .events
        .iter()
        .find(|e| e.reason == EventReason::HookSucceeded)
        .unwrap()
        .message;
    assert_eq!(
        note,
        "pre-install hook Job/a-seed (chart shop, templates/a-seed.yaml) succeeded\nlast 2 log lines of pod a-seed-x1 (container main):\nseeding\nseeded 3 rows"
    );
    // b-migrate fails: the end of its log is in the status message and the event, at most 20
    // lines and 1 KiB, the last ones.
    let log: String = (1..=40).map(|i| format!("line {i}\n")).collect::<String>()
        + "ERROR: relation \"users\" does not exist\n";
    let seen = fx.with_hooks(
        seen,
        &[(
            "b-migrate",
            hook_object("Job", "b-migrate", Some(&pre), job_failed()),
        )],
    );
    let mut seen = seen;
    seen.hook_logs.insert(
        fx.hook("b-migrate"),
        Some(rollout::HookLog::tail("b-migrate-k2", "main", &log)),
    );
    let s3 = fx.step(&s2.status, &seen, at(3));
    let s4 = fx.step(&s3.status, &seen, at(4));
    let s4 = fx.step(&s4.status, &seen, at(5));
    assert_eq!(s4.status.phase, Some(ReleasePhase::Failed));
    let message = s4.status.message.clone().unwrap();
    let mut lines = message.lines();
    assert!(lines.next().unwrap().ends_with("failed: Job b-migrate: failed (BackoffLimitExceeded: Job has reached the specified backoff limit)"));
    assert_eq!(
        lines.next(),
        Some("last 20 log lines of pod b-migrate-k2 (container main):")
    );
    let tail: Vec<&str> = lines.collect();
    assert_eq!(tail.len(), 20);
    assert_eq!(tail[0], "line 22");
    assert_eq!(tail[19], "ERROR: relation \"users\" does not exist");
    let note = &s3
        .events
        .iter()
        .find(|e| e.reason == EventReason::HookFailed)
        .unwrap()
        .message;
    assert!(note.len() <= 1024, "{}", note.len());
    assert!(
        note.ends_with("ERROR: relation \"users\" does not exist"),
        "{note}"
    );
}

#[test]
fn a_log_tail_keeps_the_last_lines_and_bytes() {
    let long = "x".repeat(3000);
    let tail = rollout::HookLog::tail("p", "c", &format!("first\n{long}END\n"));
    assert_eq!(tail.lines.len(), 1);
    assert_eq!(tail.lines[0].len(), 1024);
    assert!(tail.lines[0].ends_with("xEND"));
    assert!(rollout::HookLog::tail("p", "c", "\n\n").lines.is_empty());
    assert_eq!(rollout::HookLog::tail("p", "c", "").told(1024), None);
    let two = rollout::HookLog::tail("p", "c", "a\r\nb\r\n");
    assert_eq!(two.lines, ["a", "b"]);
    // Told within a budget: the first lines go first.
    assert_eq!(
        two.told(43).as_deref(),
        Some("last 1 log line of pod p (container c):\nb")
    );
    assert_eq!(
        two.told(44).as_deref(),
        Some("last 2 log lines of pod p (container c):\na\nb")
    );
}

#[test]
fn a_hook_pod_must_succeed_and_a_hook_not_done_within_the_timeout_fails() {
    let fx = layered_with_hooks(&[("Pod", "check", &[("helm.sh/hook", "pre-install")])]).with(
        Settings {
            timeout: Duration::from_secs(20),
            ..settings()
        },
    );
    let pre = run("pre-install");
    let s1 = fx.step(&fx.started(), &Observations::default(), at(1));
    let pod = |status: Value| {
        fx.with_hooks(
            Observations::default(),
            &[("check", hook_object("Pod", "check", Some(&pre), status))],
        )
    };
    let running = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
    let s2 = fx.step(&s1.status, &pod(running.clone()), at(5));
    assert!(s2.actions.is_empty());
    assert!(
        s2.status
            .message
            .as_deref()
            .unwrap()
            .contains("waiting for it to complete"),
        "{:?}",
        s2.status.message
    );
    assert_eq!(s2.requeue_after, Some(Duration::from_secs(16)));
    let s3 = fx.step(&s1.status, &pod(json!({"phase": "Succeeded"})), at(6));
    assert_eq!(fx.named(&s3), ["apply a"]);
    let s4 = fx.step(&s1.status, &pod(json!({"phase": "Failed"})), at(6));
    assert_eq!(s4.status.phase, Some(ReleasePhase::Failed));
    // Still running 20 s after it was created: spec.timeout is over.
    let s5 = fx.step(&s1.status, &pod(running), at(22));
    assert_eq!(s5.status.phase, Some(ReleasePhase::Failed));
    assert!(
        s5.status
            .message
            .as_deref()
            .unwrap()
            .contains("readiness timeout after 20s"),
        "{:?}",
        s5.status.message
    );
}

#[test]
fn after_a_takeover_a_hook_created_by_this_run_is_not_created_again() {
    let fx = layered_with_hooks(&[("Job", "migrate", &[("helm.sh/hook", "pre-install")])]);
    let pre = run("pre-install");
    // The previous holder created the Job, then died before its status said so.
    let mut status = fx.started();
    status.layers[0].phase = LayerPhase::Applying;
    let running = fx.with_hooks(
        Observations::default(),
        &[(
            "migrate",
            hook_object("Job", "migrate", Some(&pre), job_running()),
        )],
    );
    let s1 = fx.step(&status, &running, at(1));
    assert!(s1.actions.is_empty(), "{:?}", fx.named(&s1));
    assert_eq!(s1.status.layers[0].phase, LayerPhase::Waiting);
    // Done and already deleted by its policy (or a ttlSecondsAfterFinished): the stage goes on.
    status.layers[0].phase = LayerPhase::Waiting;
    let s2 = fx.step(&status, &Observations::default(), at(2));
    assert_eq!(fx.named(&s2), ["apply a"]);
}

#[test]
fn a_multi_event_hook_is_created_again_for_each_event_and_upgrades_run_upgrade_hooks() {
    let events = "pre-install,post-install,pre-upgrade";
    let fx = layered_with_hooks(&[("ServiceAccount", "hook-sa", &[("helm.sh/hook", events)])]);
    let mut status = fx.started();
    for layer in &mut status.layers[..3] {
        layer.phase = LayerPhase::Ready;
        layer.ready = layer.resources;
    }
    // At post-install the object made at pre-install is replaced by one of this event.
    let made_before = hook_object(
        "ServiceAccount",
        "hook-sa",
        Some(&run("pre-install")),
        json!(null),
    );
    let objects = fx.observe(&[
        ("config", json!({"kind": "ConfigMap"})),
        ("app", json!({"kind": "ConfigMap"})),
    ]);
    let s1 = fx.step(
        &status,
        &fx.with_hooks(objects.clone(), &[("hook-sa", made_before)]),
        at(1),
    );
    assert_eq!(fx.named(&s1), ["delete hook-sa"]);
    let s2 = fx.step(&s1.status, &objects, at(2));
    assert_eq!(
        fx.named(&s2),
        [format!("create hook-sa ({})", run("post-install"))]
    );

    let mut upgrade =
        layered_with_hooks(&[("ServiceAccount", "hook-sa", &[("helm.sh/hook", events)])]);
    upgrade.upgrade = true;
    assert_eq!(
        upgrade.stage_names(&upgrade.started()),
        ["(pre-upgrade)", "a", "b"]
    );
    let mut disabled =
        layered_with_hooks(&[("ServiceAccount", "hook-sa", &[("helm.sh/hook", events)])]);
    disabled.settings.disable_hooks = true;
    let s = disabled.step(&disabled.started(), &Observations::default(), at(1));
    assert_eq!(disabled.named(&s), ["apply a"]);
}

#[test]
fn a_hook_waits_for_its_external_dependency_before_it_is_created() {
    let fx = layered_with_hooks(&[(
        "Job",
        "migrate",
        &[
            ("helm.sh/hook", "pre-install"),
            (
                "db.external-dependency.werf.io/resource",
                "secret/db-credentials",
            ),
        ],
    )]);
    let s1 = fx.step(&fx.started(), &Observations::default(), at(1));
    assert!(s1.actions.is_empty());
    assert!(
        s1.status.message.as_deref().unwrap().contains(
            "waiting for external dependency secret db-credentials: secret db-credentials: not found"
        ),
        "{:?}",
        s1.status.message
    );
    let mut observed = Observations::default();
    observed.hooks.insert(fx.hook("migrate"), None);
    observed.hook_external.insert(
        (fx.hook("migrate"), 0),
        Some(json!({"kind": "Secret", "metadata": {"name": "db-credentials"}})),
    );
    let s2 = fx.step(&s1.status, &observed, at(2));
    assert_eq!(
        fx.named(&s2),
        [format!("create migrate ({})", run("pre-install"))]
    );
}

/// The uninstall of revision 1 of `fx`, sequenced, with its hooks.
fn uninstalling<'a>(fx: &'a Fixture, inventory: &'a Inventory) -> rollout::Uninstall<'a> {
    rollout::Uninstall {
        inventory,
        sequenced: true,
        hooks: &fx.hooks,
        run: "uid-shop/1",
        timeout: Duration::from_secs(300),
    }
}

#[test]
fn uninstall_runs_pre_delete_hooks_first_post_delete_last_and_retries_a_failed_one() {
    let fx = layered_with_hooks(&[
        ("Job", "backup", &[("helm.sh/hook", "pre-delete")]),
        ("Job", "cleanup", &[("helm.sh/hook", "post-delete")]),
    ]);
    let inventory = Inventory::from_plan(&fx.plan, |_| Some("shop".into()));
    let u = uninstalling(&fx, &inventory);
    let first = "uid-shop/1/0/pre-delete";
    let s1 = uninstall_with(
        &u,
        &SequencedReleaseStatus::default(),
        &Observations::default(),
        at(1),
    );
    let names: Vec<&str> = s1.status.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["(pre-delete)", "b", "a", "(post-delete)"]);
    assert_eq!(
        s1.hooks_before,
        [HookAction::Create {
            hook: fx.hook("backup"),
            run: first.into()
        }]
    );
    assert!(s1.deletes.is_empty());
    // The backup fails: the uninstall waits and says how to get past it.
    let failed = fx.with_hooks(
        Observations::default(),
        &[(
            "backup",
            hook_object("Job", "backup", Some(first), job_failed()),
        )],
    );
    let s2 = uninstall_with(&u, &s1.status, &failed, at(2));
    assert!(s2.deletes.is_empty() && !s2.finished);
    assert_eq!(s2.requeue_after, Some(Duration::from_secs(5)));
    assert!(
        s2.status.message.as_deref().unwrap().starts_with(
            "uninstall blocked: pre-delete hook Job/backup (chart shop, templates/backup.yaml) failed"
        ),
        "{:?}",
        s2.status.message
    );
    assert!(
        s2.status
            .message
            .as_deref()
            .unwrap()
            .contains("spec.disableHooks: true")
    );
    let s3 = uninstall_with(&u, &s2.status, &failed, at(4));
    assert!(s3.hooks_before.is_empty());
    // Five seconds later, a new attempt: the failed Job goes, then the hook runs again.
    let s4 = uninstall_with(&u, &s2.status, &failed, at(8));
    assert_eq!(
        s4.hooks_before,
        [HookAction::Delete {
            hook: fx.hook("backup")
        }]
    );
    let second = "uid-shop/1/1/pre-delete";
    let s5 = uninstall_with(&u, &s4.status, &Observations::default(), at(9));
    assert_eq!(
        s5.hooks_before,
        [HookAction::Create {
            hook: fx.hook("backup"),
            run: second.into()
        }]
    );
    // Done: the layers are deleted, dependents first; the post-delete hook comes last.
    let done = fx.with_hooks(
        Observations::default(),
        &[(
            "backup",
            hook_object("Job", "backup", Some(second), job_complete()),
        )],
    );
    let s6 = uninstall_with(&u, &s5.status, &done, at(10));
    assert!(s6.hooks_before.is_empty() && s6.hooks_after.is_empty());
    assert_eq!(s6.deletes.len(), 1, "layer b first");
    let s7 = uninstall_with(&u, &s6.status, &done, at(11));
    let s8 = uninstall_with(&u, &s7.status, &done, at(12));
    assert_eq!(
        s8.hooks_after,
        [HookAction::Create {
            hook: fx.hook("cleanup"),
            run: second.replace("pre", "post")
        }]
    );
    assert!(!s8.finished);
}

/// One row of the table of timed-out steps: the status the step starts from, what it sees, and
/// the message the timeout must give (and the layers it must leave Pending).
struct TimedOut {
    case: &'static str,
    from: SequencedReleaseStatus,
    seen: Observations,
    message: &'static str,
    pending: &'static [&'static str],
}

#[test]
fn a_timed_out_step_names_what_it_waited_for_and_the_layers_it_did_not_start() {
    let fx = shop();
    let started = fx.started();
    let both = fx.step(&started, &Observations::default(), at(1)).status;
    let db_waits = fx
        .step(
            &both,
            &fx.observe(&[
                ("db", deployment("db", false)),
                ("queue", config_map("queue")),
            ]),
            at(2),
        )
        .status;
    let rows = [
        TimedOut {
            case: "a layer still waits on its Deployment",
            from: db_waits.clone(),
            seen: fx.observe(&[("db", deployment("db", false))]),
            message: "timed out after 5m (spec.timeout), still waiting for layer database of chart shop: waiting for Deployment db",
            pending: &["app"],
        },
        TimedOut {
            case: "the layer waited on became ready just now: the next one is not started",
            from: db_waits.clone(),
            seen: fx.observe(&[("db", deployment("db", true))]),
            message: "timed out after 5m (spec.timeout), still waiting for layer database of chart shop, ready only after the timeout; layer app of chart shop was not started",
            pending: &["app"],
        },
        TimedOut {
            case: "nothing was started yet",
            from: started.clone(),
            seen: Observations::default(),
            message: "timed out after 5m (spec.timeout): layer database of chart shop, layer queue of chart shop were not started",
            pending: &["database", "queue", "app"],
        },
        TimedOut {
            case: "two layers at work, one of them waiting",
            from: both.clone(),
            seen: fx.observe(&[
                ("db", deployment("db", false)),
                (
                    "queue",
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "queue"}}),
                ),
            ]),
            message: "timed out after 5m (spec.timeout), still waiting for layer database of chart shop: waiting for Deployment db",
            pending: &["app"],
        },
    ];
    for row in rows {
        let step = fx.step(&row.from, &row.seen, at(300));
        let step = install::time_out(
            &fx.revision(),
            &row.from,
            step,
            Duration::from_secs(300),
            &at(300),
        );
        let told = step.status.message.clone().unwrap_or_default();
        assert!(
            told.starts_with(row.message),
            "{}: {told}\n  expected it to start with: {}",
            row.case,
            row.message
        );
        assert!(!told.contains(": applied"), "{}: {told}", row.case);
        assert!(step.finished, "{}", row.case);
        assert!(step.actions.is_empty(), "{}: {:?}", row.case, step.actions);
        assert_eq!(
            step.status.phase,
            Some(ReleasePhase::Failed),
            "{}",
            row.case
        );
        assert_eq!(
            condition(&step.status, "Stalled").1,
            "Timeout",
            "{}",
            row.case
        );
        for layer in row.pending {
            let l = layer_status(&step.status, layer);
            assert_eq!(l.phase, LayerPhase::Pending, "{}: layer {layer}", row.case);
            assert_eq!(l.started_at, None, "{}: layer {layer}", row.case);
        }
        assert_eq!(
            reasons(&step),
            [EventReason::LayerFailed],
            "{}: one event, no LayerStarted",
            row.case
        );
    }
}

#[test]
fn a_hook_still_running_when_the_operation_times_out_has_failed_and_its_stage_cleans_up() {
    let fx = webhook_certs();
    let pre = run("pre-install");
    // The ServiceAccount, Role and RoleBinding are done; the Job runs (its Pod never starts).
    let mut status = fx.started();
    let done = all_done(&fx, &pre);
    for second in 1..=4 {
        let mut seen = Observations::default();
        for i in 0..(second - 1) {
            seen.hooks.insert(i, done.hooks[&i].clone());
        }
        status = fx.step(&status, &seen, at(second as i64)).status;
    }
    let job = fx.hook("x-admission-create");
    let mut running = done.clone();
    running.hooks.insert(
        job,
        Some(hook_object(
            "Job",
            "x-admission-create",
            Some(&pre),
            job_running(),
        )),
    );
    let step = fx.step(&status, &running, at(300));
    assert!(!step.finished);
    let step = install::time_out(
        &fx.revision(),
        &status,
        step,
        Duration::from_secs(300),
        &at(300),
    );
    assert!(step.finished);
    assert_eq!(step.status.phase, Some(ReleasePhase::Failed));
    // Helm's order for a failed hook: it (no hook-failed here), then the hooks before it that
    // have hook-succeeded, in run order.
    let deleted: Vec<String> = step
        .actions
        .iter()
        .map(|a| match a {
            InstallAction::Hook {
                action: HookAction::Delete { hook },
                ..
            } => format!("{}/{}", fx.hooks[*hook].key.kind, fx.hooks[*hook].key.name),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        deleted,
        [
            "ServiceAccount/x-admission",
            "Role/x-admission",
            "RoleBinding/x-admission"
        ]
    );
    let (_, reason) = condition(&step.status, "Stalled");
    assert_eq!(reason, "Timeout");
    let told = step.status.message.clone().unwrap_or_default();
    assert!(
        told.starts_with(
            "timed out after 5m (spec.timeout), still waiting for pre-install hooks: "
        ) && told.contains("x-admission-create")
            && !told.contains("not started"),
        "{told}"
    );
}

#[test]
fn a_failed_pre_delete_stage_is_run_again_from_its_first_hook() {
    let fx = layered_with_hooks(&[
        (
            "ServiceAccount",
            "backup",
            &[
                ("helm.sh/hook", "pre-delete"),
                ("helm.sh/hook-weight", "-1"),
                ("helm.sh/hook-delete-policy", "hook-succeeded"),
            ],
        ),
        ("Job", "backup", &[("helm.sh/hook", "pre-delete")]),
    ]);
    let inventory = Inventory::from_plan(&fx.plan, |_| Some("shop".into()));
    let u = uninstalling(&fx, &inventory);
    let first = "uid-shop/1/0/pre-delete";
    let account = fx
        .hooks
        .iter()
        .position(|h| h.key.kind == "ServiceAccount")
        .unwrap();
    let job = fx.hooks.iter().position(|h| h.key.kind == "Job").unwrap();
    let s1 = uninstall_with(
        &u,
        &SequencedReleaseStatus::default(),
        &Observations::default(),
        at(1),
    );
    assert_eq!(
        s1.hooks_before,
        [HookAction::Create {
            hook: account,
            run: first.into()
        }]
    );
    let mut seen = Observations::default();
    seen.hooks.insert(
        account,
        Some(hook_object(
            "ServiceAccount",
            "backup",
            Some(first),
            json!({}),
        )),
    );
    let s2 = uninstall_with(&u, &s1.status, &seen, at(2));
    assert_eq!(
        s2.hooks_before,
        [HookAction::Create {
            hook: job,
            run: first.into()
        }]
    );
    // The Job fails: its ServiceAccount goes (hook-succeeded), then the stage is Failed.
    seen.hooks.insert(
        job,
        Some(hook_object("Job", "backup", Some(first), job_failed())),
    );
    seen.present
        .insert(fx.hooks[account].key.clone(), claim("shop/shop"));
    let s3 = uninstall_with(&u, &s2.status, &seen, at(3));
    let s4 = uninstall_with(&u, &s3.status, &seen, at(3));
    assert_eq!(s4.hooks_before, [HookAction::Delete { hook: account }]);
    seen.present.insert(fx.hooks[account].key.clone(), None);
    let s5 = uninstall_with(&u, &s4.status, &seen, at(4));
    assert_eq!(s5.status.layers[0].phase, LayerPhase::Failed);
    // Tried again: from the ServiceAccount, which the Job needs, not from the Job.
    let second = "uid-shop/1/1/pre-delete";
    let s6 = uninstall_with(&u, &s5.status, &Observations::default(), at(20));
    assert_eq!(
        s6.hooks_before,
        [HookAction::Create {
            hook: account,
            run: second.into()
        }]
    );
}
