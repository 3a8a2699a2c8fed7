//! The lifecycle decision as table tests: for a release in a given state, with the facts the
//! controller would gather, the one next step. These are the decisions the controller scenarios
//! on the test API server (tests/controller.rs, tests/lock.rs) exercise end to end, here without
//! a server, a clock or helm: each case takes milliseconds.

use sequenced_testkit as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use sequenced::api::{
    Claim, CrdPolicy, EventReason, LayerPhase, ObjectKey, Reason, ReleasePhase, SequencedRelease,
    SequencedReleaseStatus, TEST_REQUEST_ANNOTATION,
};
use sequenced::digest::Digests;
use sequenced::history::{Inventory, Record};
use sequenced::plan::{self, Plan};
use sequenced::rollout::dependencies::{Dependency, DependencyFacts, Edge, Seen, Target};
use sequenced::rollout::drift::{Drift, DriftReport, Drifted};
use sequenced::rollout::install::InstallAction;
use sequenced::rollout::lifecycle::{Begin, PlanFact, Refusal, Revisions, Source};
use sequenced::rollout::recovery::rollback_record;
use sequenced::rollout::uninstall::fail_delete;
use sequenced::rollout::{
    ActionFailure, Deployable, Facts, LockView, Need, Next, Requeue, Settings, holds_lock, next,
    requeue,
};
use serde_json::{Value, json};
use support::{chart_tree, object, rendered, widget_crd};
use tempfile::TempDir;

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
}

/// A SequencedRelease `shop` in namespace `apps` with this spec (merged over a path chart) and
/// metadata, as the API server would hand it over.
fn release(spec: Value, metadata: Value) -> SequencedRelease {
    let mut object = json!({
        "apiVersion": "sequenced.dev/v1alpha1",
        "kind": "SequencedRelease",
        "metadata": {"name": "shop", "namespace": "apps", "generation": 1, "uid": "u1",
                     "resourceVersion": "10", "finalizers": ["sequenced.dev/finalizer"]},
        "spec": {"chart": {"path": "/charts/shop"}},
    });
    for (k, v) in spec.as_object().unwrap() {
        object["spec"][k] = v.clone();
    }
    for (k, v) in metadata.as_object().unwrap() {
        object["metadata"][k] = v.clone();
    }
    serde_json::from_value(object).unwrap()
}

fn with_status(mut sr: SequencedRelease, status: SequencedReleaseStatus) -> SequencedRelease {
    sr.status = Some(status);
    sr
}

/// The facts of `sr`, with no release records in the cluster yet.
fn facts(sr: SequencedRelease) -> Facts {
    let mut facts = Facts::new(Arc::new(sr), LockView::Free, at(100));
    facts.revisions = Some(Revisions::default());
    facts.namespace_terminating = Some(false);
    facts
}

fn source(digest: &str) -> Option<Result<Source, Refusal>> {
    Some(Ok(Source {
        digests: Digests {
            current: digest.to_string(),
            v2: None,
            v1: None,
        },
        chart_version: Some("1.2.0".to_string()),
        artifact: None,
    }))
}

/// Chart shop 1.2.0 rendered as these `(source, document)` pairs, planned.
fn plan_of(docs: &[(&str, String)]) -> Plan {
    let dir = TempDir::new().unwrap();
    let tree = chart_tree(
        dir.path(),
        &[("shop", "apiVersion: v2\nname: shop\nversion: 1.2.0\n")],
        &[],
    );
    plan::plan(&tree, rendered(&tree, docs)).unwrap()
}

/// The shop example planned: database and queue, then app; every object in namespace apps.
fn deployable() -> Arc<Deployable> {
    let plan = plan_of(&[
        (
            "shop/templates/db.yaml",
            object("Deployment", "db", &[("helm.sh/layer", "database")]),
        ),
        (
            "shop/templates/queue.yaml",
            object("ConfigMap", "queue", &[("helm.sh/layer", "queue")]),
        ),
        (
            "shop/templates/app.yaml",
            object(
                "ConfigMap",
                "app",
                &[
                    ("helm.sh/layer", "app"),
                    ("helm.sh/depends-on/layers", "database, queue"),
                ],
            ),
        ),
    ]);
    let keys: Vec<ObjectKey> = plan
        .resources
        .iter()
        .map(|r| ObjectKey {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: Some("apps".into()),
            name: r.name.clone(),
        })
        .collect();
    let inventory = Inventory::from_plan(&plan, |_| Some("apps".into()));
    Arc::new(Deployable {
        plan,
        chart_version: Some("1.2.0".into()),
        keys,
        crd_keys: Vec::new(),
        hooks: Vec::new(),
        inventory,
        content: Default::default(),
        slim: false,
        rules: Default::default(),
    })
}

fn plan_fact(digest: &str, is_upgrade: bool) -> Option<PlanFact> {
    Some(PlanFact {
        digest: digest.to_string(),
        is_upgrade,
        outcome: Ok(deployable()),
    })
}

fn record(revision: i64, digest: &str, inventory: Inventory) -> Option<Arc<Record>> {
    Some(Arc::new(Record {
        revision,
        digest: digest.to_string(),
        chart: "shop".into(),
        chart_version: Some("1.2.0".into()),
        chart_artifact: None,
        sequenced: true,
        inventory,
        prune: Vec::new(),
        hooks: Vec::new(),
        upgrade: None,
        crds: None,
        plan: None,
        rollback_to: None,
        went_on_from: None,
        tests: Vec::new(),
        content: Default::default(),
        info: Default::default(),
    }))
}

fn condition(status: &SequencedReleaseStatus, type_: &str) -> (String, String, String) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// A release whose revision `revision` of digest `digest` is Ready.
fn ready(revision: i64, digest: &str) -> SequencedReleaseStatus {
    let mut facts = facts(release(json!({}), json!({})));
    facts.source = source(digest);
    facts.plan = plan_fact(digest, false);
    facts.dependencies = Some(DependencyFacts::default());
    let Next::Begin(begin) = next(&facts) else {
        panic!("a first revision begins")
    };
    let mut status = begin.status;
    status.revision = Some(revision);
    status.phase = Some(ReleasePhase::Ready);
    for layer in &mut status.layers {
        layer.phase = LayerPhase::Ready;
    }
    status.history[0].revision = revision;
    status.history[0].phase = ReleasePhase::Ready;
    status.history[0].finished_at = Some(at(50));
    status
}

#[test]
fn a_new_release_gets_the_finalizer_first_and_a_foreign_deletion_is_left_alone() {
    let new = release(json!({}), json!({"finalizers": []}));
    assert_eq!(next(&facts(new.clone())), Next::AddFinalizer);
    let deleting = release(
        json!({}),
        json!({"finalizers": ["other/finalizer"], "deletionTimestamp": "2027-01-15T08:00:00Z"}),
    );
    assert_eq!(next(&facts(deleting)), Next::Idle);
}

#[test]
fn a_valid_lease_of_another_session_blocks_everything_until_it_may_expire() {
    for sr in [
        release(json!({}), json!({})),
        release(json!({}), json!({"finalizers": []})),
        release(
            json!({}),
            json!({"deletionTimestamp": "2027-01-15T08:00:00Z"}),
        ),
    ] {
        let mut f = facts(sr);
        f.lock = LockView::Blocked {
            holder: "b/0011".into(),
            remaining: Duration::from_secs(30),
        };
        assert_eq!(
            next(&f),
            Next::Blocked {
                holder: "b/0011".into(),
                requeue: Requeue::After(Duration::from_millis(30_050)),
            }
        );
    }
}

#[test]
fn a_suspended_release_does_nothing_and_lets_go_of_a_lock_it_holds() {
    let sr = release(json!({"suspend": true}), json!({}));
    assert_eq!(next(&facts(sr.clone())), Next::Suspend { status: None });
    let mut held = facts(sr);
    held.lock = LockView::Ours;
    let Next::Suspend {
        status: Some(status),
    } = next(&held)
    else {
        panic!("writes that it is suspended");
    };
    assert_eq!(
        status.message.as_deref(),
        Some("suspended: spec.suspend is true")
    );
    assert_eq!(status.lock, None);
}

#[test]
fn references_outside_the_namespace_stall_only_when_the_controller_refuses_them() {
    let sr = release(
        json!({"targetNamespace": "shared", "dependsOn": [{"name": "db", "namespace": "data"},
                                                          {"name": "cache"}]}),
        json!({}),
    );
    // Without the flag: on to the chart source.
    assert_eq!(next(&facts(sr.clone())), Next::Need(Need::Source));
    let mut refusing = facts(sr);
    refusing.no_cross_namespace_refs = true;
    let Next::Stall { status, event, .. } = next(&refusing) else {
        panic!("stalls");
    };
    assert_eq!(status.phase, Some(ReleasePhase::Failed));
    let (stalled, reason, message) = condition(&status, "Stalled");
    assert_eq!(
        (stalled.as_str(), reason.as_str()),
        ("True", "CrossNamespaceRef")
    );
    assert!(
        message.contains("spec.targetNamespace shared")
            && message.contains("spec.dependsOn[0] data/db")
            && !message.contains("cache"),
        "{message}"
    );
    assert!(event.is_some());
    // Its own namespace, named: no cross-namespace reference.
    let mut own = facts(release(
        json!({"targetNamespace": "apps", "dependsOn": [{"name": "db", "namespace": "apps"}]}),
        json!({}),
    ));
    own.no_cross_namespace_refs = true;
    assert_eq!(next(&own), Next::Need(Need::Source));
}

#[test]
fn unusable_specs_and_charts_stall_with_their_reason_once() {
    // A readiness timeout that is not a duration: stalled before anything is read.
    let bad = release(json!({"readinessTimeout": "soon"}), json!({}));
    let Next::Stall { status, event, .. } = next(&facts(bad.clone())) else {
        panic!("stalls");
    };
    assert_eq!(status.phase, Some(ReleasePhase::Failed));
    let (stalled, reason, message) = condition(&status, "Stalled");
    assert_eq!((stalled.as_str(), reason.as_str()), ("True", "InvalidSpec"));
    assert!(message.starts_with("spec.readinessTimeout:"), "{message}");
    assert_eq!(event.unwrap().reason, EventReason::Stalled);
    // Seen again with that status: no second event.
    let Next::Stall { event, .. } = next(&facts(with_status(bad, status))) else {
        panic!("stalls");
    };
    assert_eq!(event, None);

    // The source asks for the chart and values first; a missing valuesFrom object stalls.
    let sr = release(json!({}), json!({}));
    assert_eq!(next(&facts(sr.clone())), Next::Need(Need::Source));
    let mut f = facts(sr.clone());
    f.source = Some(Err(Refusal {
        reason: Reason::InvalidSpec,
        message: "spec.valuesFrom[1]: Secret apps/absent not found".into(),
    }));
    let Next::Stall { status, .. } = next(&f) else {
        panic!("stalls")
    };
    assert_eq!(
        condition(&status, "Stalled").2,
        "spec.valuesFrom[1]: Secret apps/absent not found"
    );

    // A chart that does not render, and one with hooks.
    let mut f = facts(sr);
    f.source = source("sha256:1");
    assert_eq!(
        next(&f),
        Next::Need(Need::Plan {
            digest: "sha256:1".into(),
            is_upgrade: false
        })
    );
    f.plan = Some(PlanFact {
        digest: "sha256:1".into(),
        is_upgrade: false,
        outcome: Err(Refusal {
            reason: Reason::RenderFailed,
            message: "rendering chart /charts/shop: helm template failed".into(),
        }),
    });
    let Next::Stall {
        status, requeue, ..
    } = next(&f)
    else {
        panic!("stalls")
    };
    assert_eq!(condition(&status, "Stalled").1, "RenderFailed");
    // Looked at again every interval: a new chart version may fix it.
    assert_eq!(requeue, Requeue::After(Duration::from_secs(600)));
}

/// A plan with hooks: a pre-install Job, a post-upgrade Job and a test Pod.
fn hooked() -> Arc<Deployable> {
    let plan = plan_of(&[
        (
            "shop/templates/job.yaml",
            object("Job", "db-migrate", &[("helm.sh/hook", "pre-install")]),
        ),
        (
            "shop/templates/notify.yaml",
            object("Job", "notify", &[("helm.sh/hook", "post-upgrade")]),
        ),
        (
            "shop/templates/test.yaml",
            object("Pod", "smoke", &[("helm.sh/hook", "test")]),
        ),
        ("shop/templates/app.yaml", object("ConfigMap", "app", &[])),
    ]);
    let (keys, hooks) = support::identities(&plan, "apps");
    let inventory = Inventory::from_plan(&plan, |_| Some("apps".into()));
    Arc::new(Deployable {
        plan,
        chart_version: None,
        keys,
        crd_keys: Vec::new(),
        hooks,
        inventory,
        content: Default::default(),
        slim: false,
        rules: Default::default(),
    })
}

/// The names of the `status.layers` a revision begins with.
fn stage_names(begin: &Begin) -> Vec<&str> {
    begin
        .status
        .layers
        .iter()
        .map(|l| l.name.as_str())
        .collect()
}

fn begin_with(f: &Facts) -> Box<Begin> {
    match next(f) {
        Next::Begin(begin) => begin,
        other => panic!("a revision begins: {other:?}"),
    }
}

#[test]
fn hook_stages_surround_the_layers_and_the_record_lists_hooks_apart() {
    let mut f = facts(release(json!({}), json!({})));
    f.source = source("sha256:1");
    let plan = |is_upgrade| {
        Some(PlanFact {
            digest: "sha256:1".into(),
            is_upgrade,
            outcome: Ok(hooked()),
        })
    };
    f.plan = plan(false);
    let begin = begin_with(&f);
    // A first install runs the pre-install hooks; post-upgrade hooks have no stage.
    assert_eq!(stage_names(&begin), ["(pre-install)", "(default)"]);
    assert_eq!(begin.status.layers[0].resources, 1);
    // The hooks are kept apart from the inventory, test hooks too (`sequenced test` runs them
    // from it); without spec.test.enable the revision has no (test) stage.
    let hooks: Vec<&str> = begin
        .record
        .hooks
        .iter()
        .map(|h| h.key.name.as_str())
        .collect();
    assert_eq!(hooks, ["db-migrate", "notify", "smoke"]);
    let inventory: Vec<&str> = begin
        .record
        .inventory
        .objects()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(inventory, ["app"]);
    assert_eq!(begin.record.upgrade, Some(false));

    // After a Ready revision, the next one is an upgrade: rendered as one, upgrade hooks.
    let mut f = facts(release(json!({}), json!({})));
    f.status = ready(1, "sha256:0");
    f.source = source("sha256:1");
    f.records
        .insert(1, record(1, "sha256:0", Inventory::default()));
    f.plan = plan(false);
    assert_eq!(
        next(&f),
        Next::Need(Need::Plan {
            digest: "sha256:1".into(),
            is_upgrade: true
        })
    );
    f.plan = plan(true);
    let begin = begin_with(&f);
    assert_eq!(stage_names(&begin), ["(default)", "(post-upgrade)"]);
    assert_eq!(begin.record.upgrade, Some(true));
}

/// Chart shop with CRD `widgets.example.com` in `crds/` and a ConfigMap.
fn with_crd() -> Arc<Deployable> {
    let crd = widget_crd();
    let plan = plan_of(&[
        ("shop/crds/widgets.yaml", crd.to_string()),
        ("shop/templates/app.yaml", object("ConfigMap", "app", &[])),
    ]);
    let crd_keys = plan
        .crds
        .iter()
        .map(|c| ObjectKey {
            api_version: c.api_version.clone(),
            kind: c.kind.clone(),
            namespace: None,
            name: c.name.clone(),
        })
        .collect();
    let keys = vec![ObjectKey {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: Some("apps".into()),
        name: "app".into(),
    }];
    let inventory = Inventory::from_plan(&plan, |_| Some("apps".into()));
    Arc::new(Deployable {
        plan,
        chart_version: Some("1.2.0".into()),
        keys,
        crd_keys,
        hooks: Vec::new(),
        inventory,
        content: Default::default(),
        slim: false,
        rules: Default::default(),
    })
}

#[test]
fn the_crd_policy_is_create_on_install_and_skip_on_upgrade_unless_set_and_kept_in_the_record() {
    let first = |spec: Value| {
        let mut f = facts(release(spec, json!({})));
        f.source = source("sha256:1");
        f.plan = Some(PlanFact {
            digest: "sha256:1".into(),
            is_upgrade: false,
            outcome: Ok(with_crd()),
        });
        begin_with(&f)
    };
    let upgrade = |spec: Value| {
        let mut f = facts(release(spec, json!({})));
        f.status = ready(1, "sha256:0");
        f.source = source("sha256:1");
        f.records
            .insert(1, record(1, "sha256:0", Inventory::default()));
        f.plan = Some(PlanFact {
            digest: "sha256:1".into(),
            is_upgrade: true,
            outcome: Ok(with_crd()),
        });
        begin_with(&f)
    };
    // Unset: Create on install, Skip on upgrade (no (crds) entry at all).
    let begin = first(json!({}));
    assert_eq!(begin.record.crds, Some(CrdPolicy::Create));
    assert_eq!(stage_names(&begin), ["(crds)", "(default)"]);
    let begin = upgrade(json!({}));
    assert_eq!(begin.record.crds, Some(CrdPolicy::Skip));
    assert_eq!(stage_names(&begin), ["(default)"]);
    // Set: the same at install and upgrade.
    for (spelt, policy) in [
        ("Skip", CrdPolicy::Skip),
        ("Create", CrdPolicy::Create),
        ("CreateReplace", CrdPolicy::CreateReplace),
    ] {
        for begin in [
            first(json!({"crds": spelt})),
            upgrade(json!({"crds": spelt})),
        ] {
            assert_eq!(begin.record.crds, Some(policy), "{spelt}");
            let staged = stage_names(&begin).contains(&"(crds)");
            assert_eq!(staged, policy != CrdPolicy::Skip, "{spelt}");
        }
    }
    // A revision in progress keeps the policy its record says, whatever the spec says now.
    let begin = upgrade(json!({"crds": "CreateReplace"}));
    let mut f = facts(release(json!({"crds": "Skip"}), json!({})));
    f.status = begin.status.clone();
    f.records.insert(2, Some(Arc::new(begin.record.clone())));
    f.plan = Some(PlanFact {
        digest: "sha256:1".into(),
        is_upgrade: true,
        outcome: Ok(with_crd()),
    });
    let me = f.identity();
    let revision = f.revision(&me).unwrap();
    assert_eq!(revision.crds, CrdPolicy::CreateReplace);
    // A record written before the policy was kept: the missing CRDs are created, as then.
    let mut old = begin.record.clone();
    old.crds = None;
    f.records.insert(2, Some(Arc::new(old)));
    assert_eq!(f.revision(&me).unwrap().crds, CrdPolicy::Create);
}

#[test]
fn a_rollback_never_touches_crds() {
    let begin = {
        let mut f = facts(release(json!({"crds": "CreateReplace"}), json!({})));
        f.source = source("sha256:1");
        f.plan = Some(PlanFact {
            digest: "sha256:1".into(),
            is_upgrade: false,
            outcome: Ok(with_crd()),
        });
        begin_with(&f)
    };
    let rollback = rollback_record(&begin.record, None, 3, &at(100));
    assert_eq!(rollback.crds, Some(CrdPolicy::Skip));
    let deployable = Deployable::from_record(&rollback).unwrap();
    let f = facts(release(json!({"crds": "CreateReplace"}), json!({})));
    let me = f.identity();
    let revision = sequenced::rollout::Revision::of(
        &deployable,
        &rollback,
        Settings::of(&f.release.spec),
        &me,
        true,
        f.health(),
    );
    let names: Vec<String> = sequenced::rollout::layout(&revision)
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(names, ["(default)"]);
}

#[test]
fn a_retry_of_a_failed_first_install_is_an_install_and_disable_hooks_drops_the_stages() {
    let mut f = facts(release(json!({"disableHooks": true}), json!({})));
    f.source = source("sha256:1");
    f.plan = Some(PlanFact {
        digest: "sha256:1".into(),
        is_upgrade: false,
        outcome: Ok(hooked()),
    });
    let begin = begin_with(&f);
    assert_eq!(
        stage_names(&begin),
        ["(default)"],
        "spec.disableHooks: no hook stage"
    );

    // Revision 1 failed; a spec change starts revision 2, still an install.
    let mut failed = begin.status.clone();
    failed.phase = Some(ReleasePhase::Failed);
    failed.history[0].phase = ReleasePhase::Failed;
    let mut f = facts(release(json!({}), json!({})));
    f.status = failed;
    f.source = source("sha256:2");
    f.records.insert(1, Some(Arc::new(begin.record.clone())));
    assert_eq!(
        next(&f),
        Next::Need(Need::Plan {
            digest: "sha256:2".into(),
            is_upgrade: false
        })
    );
}

#[test]
fn depends_on_gates_a_new_revision_and_a_cycle_stalls_naming_it() {
    let sr = release(json!({"dependsOn": [{"name": "db"}]}), json!({}));
    let mut f = facts(sr);
    f.source = source("sha256:1");
    assert_eq!(
        next(&f),
        Next::Need(Need::Dependencies(vec![Dependency {
            index: 0,
            target: Target::Release("apps/db".into())
        }]))
    );
    let graph = |edges: &[(&str, &str)]| -> BTreeMap<String, Vec<Edge>> {
        edges
            .iter()
            .map(|(a, b)| {
                let edge = Edge {
                    to: b.to_string(),
                    via: None,
                };
                (a.to_string(), vec![edge])
            })
            .collect()
    };
    let db = |ready: &str| Seen::Found {
        object: Some(json!({"metadata": {"name": "db", "generation": 1},
            "status": {"observedGeneration": 1, "conditions": [
                {"type": "Ready", "status": ready, "message": "layer db waiting"}]}})),
        cluster_scoped: false,
    };
    f.dependencies = Some(DependencyFacts {
        graph: graph(&[("apps/shop", "apps/db")]),
        seen: BTreeMap::from([(0, db("False"))]),
    });
    let Next::WaitForDependencies { status, requeue } = next(&f) else {
        panic!("waits");
    };
    assert_eq!(status.phase, Some(ReleasePhase::Pending));
    assert_eq!(
        condition(&status, "Reconciling"),
        (
            "True".into(),
            "DependencyNotReady".into(),
            "waiting for SequencedRelease apps/db to be Ready (not Ready: layer db waiting)".into()
        )
    );
    assert_eq!(requeue, Requeue::After(Duration::from_secs(600)));
    // The status says what it waits for, and why.
    assert_eq!(status.dependencies.len(), 1);
    assert_eq!(status.dependencies[0].kind, "SequencedRelease");
    assert!(!status.dependencies[0].ready);

    f.dependencies = Some(DependencyFacts {
        graph: graph(&[("apps/shop", "apps/db"), ("apps/db", "apps/shop")]),
        seen: BTreeMap::from([(0, db("False"))]),
    });
    let Next::Stall { status, .. } = next(&f) else {
        panic!("stalls");
    };
    assert_eq!(
        condition(&status, "Stalled"),
        (
            "True".into(),
            "DependencyCycle".into(),
            "release dependency cycle: apps/shop -> apps/db -> apps/shop".into()
        )
    );

    // Ready: the revision goes on to its plan.
    f.dependencies = Some(DependencyFacts {
        graph: graph(&[("apps/shop", "apps/db")]),
        seen: BTreeMap::from([(0, db("True"))]),
    });
    assert!(matches!(next(&f), Next::Need(Need::Plan { .. })));
}

#[test]
fn depends_on_an_object_waits_for_it_by_kstatus_or_its_ready_expr() {
    let sr = release(
        json!({"dependsOn": [
            {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "name": "databases.example.com"},
            {"apiVersion": "example.com/v1", "kind": "Database", "name": "main",
             "namespace": "data", "readyExpr": "self.status.phase == 'Running'"}]}),
        json!({}),
    );
    let mut f = facts(sr.clone());
    f.source = source("sha256:1");
    let Next::Need(Need::Dependencies(wanted)) = next(&f) else {
        panic!("asks for its dependencies");
    };
    assert_eq!(
        wanted[1].target,
        Target::Object {
            api_version: "example.com/v1".into(),
            kind: "Database".into(),
            namespace: "data".into(),
            name: "main".into(),
            explicit_namespace: true,
        }
    );
    let crd = |established: &str| Seen::Found {
        object: Some(json!({"apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition", "metadata": {"name": "databases.example.com"},
            "status": {"conditions": [{"type": "Established", "status": established},
                {"type": "NamesAccepted", "status": "True"}]}})),
        cluster_scoped: true,
    };
    let database = |phase: &str| Seen::Found {
        object: Some(json!({"apiVersion": "example.com/v1", "kind": "Database",
            "metadata": {"name": "main", "namespace": "data"}, "status": {"phase": phase}})),
        cluster_scoped: false,
    };
    f.dependencies = Some(DependencyFacts {
        graph: BTreeMap::new(),
        seen: BTreeMap::from([(0, crd("False")), (1, database("Running"))]),
    });
    let Next::WaitForDependencies { status, .. } = next(&f) else {
        panic!("waits for the CRD");
    };
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .starts_with("waiting for CustomResourceDefinition databases.example.com: "),
        "{:?}",
        status.message
    );
    assert_eq!(status.dependencies[0].namespace, None);
    assert!(status.dependencies[1].ready);
    f.dependencies = Some(DependencyFacts {
        graph: BTreeMap::new(),
        seen: BTreeMap::from([(0, crd("True")), (1, database("Pending"))]),
    });
    let Next::WaitForDependencies { status, .. } = next(&f) else {
        panic!("waits for the database");
    };
    assert_eq!(
        status.message.as_deref(),
        Some(
            "waiting for Database data/main: readyExpr \"self.status.phase == 'Running'\" is false"
        )
    );
    f.dependencies = Some(DependencyFacts {
        graph: BTreeMap::new(),
        seen: BTreeMap::from([(0, crd("True")), (1, database("Running"))]),
    });
    let Next::Need(Need::Plan { .. }) = next(&f) else {
        panic!("goes on");
    };

    // Another namespace, under --no-cross-namespace-refs: refused naming the entry.
    let mut f = facts(sr);
    f.no_cross_namespace_refs = true;
    let Next::Stall { status, .. } = next(&f) else {
        panic!("stalls");
    };
    assert!(
        condition(&status, "Stalled")
            .2
            .ends_with("spec.dependsOn[1] Database data/main"),
        "{:?}",
        condition(&status, "Stalled")
    );
}

#[test]
fn a_ready_expr_or_health_check_that_does_not_compile_stalls_naming_it() {
    let sr = release(
        json!({"dependsOn": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "flag",
            "readyExpr": "self.data.ready =="}]}),
        json!({}),
    );
    let f = facts(sr);
    let Next::Stall { status, .. } = next(&f) else {
        panic!("stalls");
    };
    let (_, reason, message) = condition(&status, "Stalled");
    assert_eq!(reason, "InvalidSpec");
    assert!(
        message.starts_with("spec.dependsOn[0].readyExpr: \"self.data.ready ==\": "),
        "{message}"
    );
    let sr = release(
        json!({"healthCheckExprs": [{"apiVersion": "example.com/v1", "kind": "Database",
            "current": "status.conditions.exist(c, c.type == 'Ready')"}]}),
        json!({}),
    );
    let Next::Stall { status, .. } = next(&facts(sr)) else {
        panic!("stalls");
    };
    assert_eq!(
        condition(&status, "Stalled").2,
        "spec.healthCheckExprs[0].current: \"status.conditions.exist(c, c.type == 'Ready')\": unknown function exist"
    );
}

#[test]
fn a_first_install_begins_revision_one_and_records_it() {
    let sr = release(json!({"createNamespace": true}), json!({}));
    let mut f = facts(sr);
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    assert_eq!(begin.record.revision, 1);
    assert_eq!(begin.record.digest, "sha256:1");
    assert_eq!(begin.record.chart_version.as_deref(), Some("1.2.0"));
    assert!(begin.record.prune.is_empty());
    assert!(begin.create_namespace);
    assert!(begin.drop_records.is_empty());
    let status = &begin.status;
    assert_eq!(status.revision, Some(1));
    assert_eq!(status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(
        status.message.as_deref(),
        Some("deploying revision 1 (chart version 1.2.0)")
    );
    assert_eq!(status.history[0].chart_version.as_deref(), Some("1.2.0"));
    assert_eq!(status.progress.as_deref(), Some("0/3"));

    // The controller writes the record and goes on from the new status: the layers that can
    // start are observed first (nothing of the release exists), then applied.
    f.status = begin.status.clone();
    f.records.insert(1, Some(Arc::new(begin.record.clone())));
    let Next::Need(Need::Observe(wanted)) = next(&f) else {
        panic!("observes the objects of the starting layers");
    };
    assert_eq!(wanted.resources.len(), 2);
    for r in wanted.resources {
        f.observed.resources.insert(r, None);
    }
    let Next::Install(step) = next(&f) else {
        panic!("steps");
    };
    assert_eq!(step.actions.len(), 2);
    assert!(
        step.actions
            .iter()
            .all(|a| matches!(a, InstallAction::ApplyLayer(_)))
    );
}

#[test]
fn a_revision_begun_by_a_controller_killed_before_its_status_said_so_goes_on_under_its_number() {
    // The record of revision 1 is written first, then the status: a controller killed between
    // the two leaves a pending record the status does not know.
    let mut f = facts(release(json!({}), json!({})));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    f.revisions = Some(Revisions {
        ours: std::collections::BTreeSet::from([1]),
        ..Default::default()
    });
    assert_eq!(next(&f), Next::Need(Need::Record(1)));
    let pending = |digest: &str| {
        let mut record = (*record(1, digest, Inventory::default()).unwrap()).clone();
        record.info.status = sequenced::history::HelmStatus::PendingInstall;
        Some(Arc::new(record))
    };
    f.records.insert(1, pending("sha256:1"));
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    assert_eq!(begin.record.revision, 1, "the same revision goes on");
    assert_eq!(begin.status.revision, Some(1));
    // Begun for another spec (it changed meanwhile), or finished: a revision after it.
    f.records.insert(1, pending("sha256:0"));
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    assert_eq!(begin.record.revision, 2);
    f.records
        .insert(1, record(1, "sha256:1", Inventory::default()));
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    assert_eq!(begin.record.revision, 2);
}

#[test]
fn an_upgrade_begins_the_next_revision_pruning_what_the_last_one_had() {
    let sr = release(json!({"maxHistory": 2}), json!({"generation": 2}));
    let mut previous = deployable().inventory.clone();
    let gone = ObjectKey {
        api_version: "v1".into(),
        kind: "Secret".into(),
        namespace: Some("apps".into()),
        name: "old".into(),
    };
    previous.steps[0].objects.push(gone.clone());
    let mut f = facts(with_status(sr, ready(2, "sha256:1")));
    f.source = source("sha256:2");
    f.plan = plan_fact("sha256:2", true);
    assert_eq!(next(&f), Next::Need(Need::Record(2)));
    f.records.insert(2, record(2, "sha256:1", previous));
    f.revisions = None;
    assert_eq!(next(&f), Next::Need(Need::Revisions));
    f.revisions = Some(Revisions {
        ours: [1, 2].into(),
        ..Default::default()
    });
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    assert_eq!(begin.record.revision, 3);
    assert_eq!(begin.record.prune, [gone]);
    assert_eq!(begin.drop_records, [1], "maxHistory 2 keeps 2 and 3");
    assert_eq!(begin.status.history.len(), 2);
    assert_eq!(begin.status.failures, None);
}

#[test]
fn a_ready_release_with_nothing_new_does_nothing_and_reads_nothing() {
    let status = ready(1, "sha256:1");
    let mut f = facts(with_status(release(json!({}), json!({})), status.clone()));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    assert_eq!(next(&f), Next::Need(Need::Record(1)));
    f.records
        .insert(1, record(1, "sha256:1", deployable().inventory.clone()));
    // Drift detection (on by default) asks whether the objects still match.
    assert_eq!(next(&f), Next::Need(Need::Drift));
    f.drift = Some(DriftReport::default());
    let Next::Install(step) = next(&f) else {
        panic!("an idle step");
    };
    assert!(step.actions.is_empty() && step.events.is_empty());
    assert_eq!(step.status, status, "the status is not written again");
    let settings = Settings::of(&f.release.spec);
    assert_eq!(
        requeue(&settings, &step.status, None, &f.now),
        Requeue::After(Duration::from_secs(600))
    );
}

#[test]
fn a_missing_record_restarts_the_revision() {
    let mut status = ready(1, "sha256:1");
    status.phase = Some(ReleasePhase::Deploying);
    let mut f = facts(with_status(release(json!({}), json!({})), status));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    f.records.insert(1, None);
    let Next::RestartRevision { status } = next(&f) else {
        panic!("restarts");
    };
    assert_eq!(status.last_applied_digest, None);
    assert_eq!(status.phase, Some(ReleasePhase::Pending));
}

#[test]
fn a_failed_revision_is_retried_when_due_as_a_new_revision_and_a_spec_change_starts_over() {
    let mut failed = ready(1, "sha256:1");
    failed.phase = Some(ReleasePhase::Failed);
    failed.failures = Some(1);
    failed.history[0].phase = ReleasePhase::Failed;
    failed.history[0].finished_at = Some(at(98));
    let sr = release(json!({"retries": 2}), json!({}));
    let mut f = facts(with_status(sr.clone(), failed.clone()));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    f.records
        .insert(1, record(1, "sha256:1", deployable().inventory.clone()));
    // Two seconds after the failure: the 5 s delay has not passed.
    let Next::Install(step) = next(&f) else {
        panic!("waits for the retry");
    };
    assert!(step.actions.is_empty());
    let settings = Settings::of(&sr.spec);
    assert_eq!(
        requeue(&settings, &step.status, None, &f.now),
        Requeue::After(Duration::from_millis(3_100))
    );
    // Due: a new revision, the count goes on. No revision was Ready: still an install.
    f.now = at(104);
    f.plan = plan_fact("sha256:1", false);
    let Next::Begin(begin) = next(&f) else {
        panic!("retries");
    };
    assert_eq!(begin.status.revision, Some(2));
    assert_eq!(begin.status.failures, Some(1));
    // A changed digest (a new chart version) starts over at once.
    f.now = at(99);
    f.source = source("sha256:2");
    f.plan = plan_fact("sha256:2", false);
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    assert_eq!(begin.status.failures, None);
}

#[test]
fn another_releases_object_is_refused_before_the_layer_is_written() {
    let mut f = facts(release(json!({}), json!({})));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    f.status = begin.status;
    f.records.insert(1, Some(Arc::new(begin.record)));
    let d = deployable();
    let queue = d
        .plan
        .resources
        .iter()
        .position(|r| r.name == "queue")
        .unwrap();
    let db = d
        .plan
        .resources
        .iter()
        .position(|r| r.name == "db")
        .unwrap();
    f.observed.resources.insert(db, None);
    f.observed.resources.insert(
        queue,
        Some(json!({"metadata": {"name": "queue", "annotations": {"sequenced.dev/owner": "apps/other"}}})),
    );
    let Next::Install(step) = next(&f) else {
        panic!("steps");
    };
    assert!(step.actions.is_empty(), "nothing is written");
    let (_, reason, message) = condition(&step.status, "Stalled");
    assert_eq!(reason, "OwnershipConflict");
    assert_eq!(
        message,
        "ConfigMap apps/queue (chart shop, templates/queue.yaml) belongs to SequencedRelease apps/other; it is left alone"
    );
}

/// Every object of `inventory` exists and is the release's.
fn all_present_and_ours(f: &mut Facts, inventory: &Inventory) {
    let ours = Claim {
        owner: Some("apps/shop".into()),
        ..Claim::default()
    };
    for k in inventory.objects() {
        f.observed.present.insert(k.clone(), Some(ours.clone()));
    }
}

#[test]
fn a_refused_delete_is_issued_again_when_the_uninstall_is_tried_again() {
    let deleting = json!({"deletionTimestamp": "2027-01-15T08:00:00Z"});
    let mut f = facts(with_status(
        release(json!({}), deleting),
        ready(2, "sha256:1"),
    ));
    let inventory = deployable().inventory.clone();
    f.records
        .insert(2, record(2, "sha256:1", inventory.clone()));
    all_present_and_ours(&mut f, &inventory);
    let Next::Uninstall(step) = next(&f) else {
        panic!("deletes");
    };
    let first = inventory.steps[0].objects.clone();
    assert_eq!(step.deletes, [(0, first.clone())]);
    // The service account may not delete them: nothing was deleted.
    let refused = ActionFailure {
        transient: false,
        reason: Reason::Forbidden,
        message: "serviceaccount apps:deployer cannot delete configmaps".into(),
    };
    let status = fail_delete(&step, 0, &refused, &f.now);
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled")
        .expect("Stalled");
    assert_eq!(stalled.reason, "Forbidden");
    assert!(
        stalled.message.contains("cannot delete"),
        "{}",
        stalled.message
    );
    // Tried again (the rights are back, the objects still there): the same deletes, not a wait
    // for objects nobody deletes.
    f.status = status;
    let Next::Uninstall(again) = next(&f) else {
        panic!("deletes again");
    };
    assert_eq!(again.deletes, [(0, first)]);
    // Once issued, the step's deletes are not issued twice.
    let issued = fail_delete(&again, 1, &refused, &f.now);
    f.status = issued;
    let Next::Uninstall(waits) = next(&f) else {
        panic!("waits");
    };
    assert!(waits.deletes.is_empty(), "{:?}", waits.deletes);
}

#[test]
fn uninstall_walks_the_inventory_then_finishes_dropping_the_records() {
    let deleting = json!({"deletionTimestamp": "2027-01-15T08:00:00Z"});
    let mut status = ready(2, "sha256:1");
    status.history.push(status.history[0].clone());
    status.history[1].revision = 1;
    // No revision was ever recorded: nothing to delete but the finalizer.
    let f = facts(release(json!({}), deleting.clone()));
    assert_eq!(
        next(&f),
        Next::FinishUninstall {
            events: Vec::new(),
            records: Vec::new(),
            delete: Vec::new(),
        }
    );
    let mut f = facts(with_status(
        release(json!({}), deleting.clone()),
        status.clone(),
    ));
    assert_eq!(next(&f), Next::Need(Need::Record(2)));
    let inventory = deployable().inventory.clone();
    f.records
        .insert(2, record(2, "sha256:1", inventory.clone()));
    let first = inventory.steps[0].objects.clone();
    let Next::Need(Need::Observe(wanted)) = next(&f) else {
        panic!("observes the first step's objects");
    };
    assert_eq!(wanted.present, first);
    all_present_and_ours(&mut f, &inventory);
    let Next::Uninstall(step) = next(&f) else {
        panic!("deletes");
    };
    assert_eq!(step.deletes, [(0, first)]);
    assert_eq!(step.status.phase, Some(ReleasePhase::Uninstalling));
    assert!(holds_lock(step.status.phase));
    // Everything gone: the records of every revision go, unless keepHistory.
    let mut f2 = facts(with_status(
        release(json!({}), deleting.clone()),
        step.status.clone(),
    ));
    f2.records
        .insert(2, record(2, "sha256:1", inventory.clone()));
    for k in inventory.objects() {
        f2.observed.present.insert(k.clone(), None);
    }
    let mut done = f2.clone();
    loop {
        match next(&done) {
            Next::Uninstall(step) => done.status = step.status,
            Next::FinishUninstall { delete, .. } => {
                assert_eq!(delete, [1, 2]);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let kept = facts(with_status(
        release(json!({"uninstall": {"keepHistory": true}}), deleting),
        SequencedReleaseStatus::default(),
    ));
    assert_eq!(
        next(&kept),
        Next::FinishUninstall {
            events: Vec::new(),
            records: Vec::new(),
            delete: Vec::new(),
        }
    );
}

#[test]
fn a_release_never_acts_as_the_controller_by_an_empty_name_nor_in_multi_tenant_mode() {
    use sequenced::rollout::lifecycle::{AccountPolicy, account_name};
    let single = AccountPolicy::default();
    let locked = AccountPolicy {
        default_service_account: None,
        multi_tenant: true,
    };
    let defaulted = AccountPolicy {
        default_service_account: Some("default".into()),
        multi_tenant: true,
    };
    let spec = |sa: Option<&str>| {
        release(
            sa.map_or_else(|| json!({}), |sa| json!({"serviceAccountName": sa})),
            json!({}),
        )
        .spec
    };
    assert_eq!(account_name(&spec(None), &single), Ok(None));
    assert_eq!(
        account_name(&spec(Some("ci")), &single),
        Ok(Some("ci".into()))
    );
    assert_eq!(
        account_name(&spec(None), &defaulted),
        Ok(Some("default".into()))
    );
    // The empty name once meant "the controller's rights", the default applied before it.
    for policy in [&single, &locked, &defaulted] {
        let refused = account_name(&spec(Some("")), policy).unwrap_err();
        assert!(refused.contains("must not be empty"), "{refused}");
    }
    assert!(account_name(&spec(Some("Bad Name")), &single).is_err());
    let refused = account_name(&spec(None), &locked).unwrap_err();
    assert!(refused.contains("required"), "{refused}");
    // The lifecycle stalls such a release before it reads anything of its chart...
    let mut f = facts(release(json!({"serviceAccountName": ""}), json!({})));
    f.accounts = defaulted.clone();
    let Next::Stall { status, .. } = next(&f) else {
        panic!("stalls");
    };
    let (_, reason, message) = condition(&status, "Stalled");
    assert_eq!(reason, "InvalidSpec");
    assert!(message.starts_with("spec.serviceAccountName"), "{message}");
    // ...and deletes nothing of it when it is deleted: as which account would it?
    let mut f = facts(with_status(
        release(
            json!({"serviceAccountName": ""}),
            json!({"deletionTimestamp": "2027-01-15T08:00:00Z"}),
        ),
        ready(1, "sha256:1"),
    ));
    f.accounts = defaulted;
    f.records
        .insert(1, record(1, "sha256:1", deployable().inventory.clone()));
    let Next::Stall { status, .. } = next(&f) else {
        panic!("stalls");
    };
    assert_eq!(status.phase, Some(ReleasePhase::Uninstalling));
    assert_eq!(condition(&status, "Stalled").1, "InvalidSpec");
}

#[test]
fn an_uninstall_without_its_record_deletes_what_the_owner_annotation_finds_or_waits() {
    let deleting = json!({"deletionTimestamp": "2027-01-15T08:00:00Z"});
    let mut f = facts(with_status(
        release(json!({}), deleting),
        ready(3, "sha256:1"),
    ));
    f.records.insert(3, None);
    assert_eq!(next(&f), Next::Need(Need::Leftovers));
    // They cannot all be looked for: Uninstalling, Stalled, saying how to leave them.
    f.leftovers = Some(Err("API group metrics.k8s.io/v1beta1 is unavailable".into()));
    let Next::Stall { status, event, .. } = next(&f) else {
        panic!("stalls");
    };
    assert_eq!(status.phase, Some(ReleasePhase::Uninstalling));
    let (stalled, reason, message) = condition(&status, "Stalled");
    assert_eq!(
        (stalled.as_str(), reason.as_str()),
        ("True", "RecordMissing")
    );
    assert!(
        message.contains("the record of revision 3 is missing")
            && message.contains("metrics.k8s.io/v1beta1 is unavailable")
            && message.contains("remove the finalizer"),
        "{message}"
    );
    assert!(event.is_some());
    // Found: deleted all at once as `helm uninstall` deletes, in Helm's uninstall kind order
    // (the Deployment before its ConfigMap), and the missing record told in an event.
    let key = |kind: &str, api_version: &str, name: &str| ObjectKey {
        api_version: api_version.into(),
        kind: kind.into(),
        namespace: Some("apps".into()),
        name: name.into(),
    };
    let found = vec![
        key("ConfigMap", "v1", "settings"),
        key("Deployment", "apps/v1", "web"),
    ];
    f.leftovers = Some(Ok(found.clone()));
    let Next::Need(Need::Observe(wanted)) = next(&f) else {
        panic!("observes whose the objects are");
    };
    assert_eq!(wanted.present.first(), Some(&found[1]));
    for k in &found {
        f.observed.present.insert(
            k.clone(),
            Some(Claim {
                owner: Some("apps/shop".into()),
                ..Claim::default()
            }),
        );
    }
    let Next::Uninstall(step) = next(&f) else {
        panic!("deletes");
    };
    assert_eq!(
        step.deletes,
        [(0, vec![found[1].clone()]), (1, vec![found[0].clone()])]
    );
    let told: Vec<_> = step
        .events
        .iter()
        .filter(|e| e.reason == EventReason::RecordMissing)
        .collect();
    assert_eq!(told.len(), 1);
    assert!(
        told[0]
            .message
            .contains("uninstalling the 2 objects found by their owner annotation"),
        "{}",
        told[0].message
    );
    // Once begun, not told again.
    f.status = step.status.clone();
    if let Next::Uninstall(step) = next(&f) {
        assert!(
            step.events
                .iter()
                .all(|e| e.reason != EventReason::RecordMissing)
        );
    }
}

#[test]
fn requeues_follow_the_phase() {
    let sr = release(
        json!({"timeout": "90s", "interval": "5m", "retries": 1}),
        json!({}),
    );
    let settings = Settings::of(&sr.spec);
    let now = at(100);
    let phase = |phase| SequencedReleaseStatus {
        phase: Some(phase),
        ..SequencedReleaseStatus::default()
    };
    let table = [
        (
            phase(ReleasePhase::Ready),
            None,
            Requeue::After(Duration::from_secs(300)),
        ),
        // Stalled for good: the next interval may bring a new chart version.
        (
            phase(ReleasePhase::Failed),
            None,
            Requeue::After(Duration::from_secs(300)),
        ),
        // In progress: within a third of the lease, a minute, or the next readiness timeout.
        (
            phase(ReleasePhase::Deploying),
            None,
            Requeue::After(Duration::from_secs(30)),
        ),
        (
            phase(ReleasePhase::Deploying),
            Some(Duration::from_secs(7)),
            Requeue::After(Duration::from_secs(7)),
        ),
        (
            phase(ReleasePhase::Uninstalling),
            None,
            Requeue::After(Duration::from_secs(30)),
        ),
    ];
    for (status, after, expected) in table {
        assert_eq!(
            requeue(&settings, &status, after, &now),
            expected,
            "{:?}",
            status.phase
        );
    }
    for (phase, held) in [
        (ReleasePhase::Pending, false),
        (ReleasePhase::Deploying, true),
        (ReleasePhase::Ready, false),
        (ReleasePhase::Failed, false),
        (ReleasePhase::Uninstalling, true),
    ] {
        assert_eq!(holds_lock(Some(phase)), held, "{phase:?}");
    }
}

/// A Ready release at revision 1 of [`deployable`], with its record and plan gathered.
fn ready_facts(spec: Value) -> Facts {
    let status = ready(1, "sha256:1");
    let mut f = facts(with_status(release(spec, json!({})), status));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    f.records
        .insert(1, record(1, "sha256:1", deployable().inventory.clone()));
    f
}

#[test]
fn with_drift_detection_disabled_a_ready_release_reads_nothing() {
    let f = ready_facts(json!({"driftDetection": "disabled"}));
    let Next::Install(step) = next(&f) else {
        panic!("an idle step");
    };
    assert!(step.actions.is_empty());
}

#[test]
fn a_deleted_object_reapplies_its_layer_and_rechecks_the_layers_that_depend_on_it() {
    let mut f = ready_facts(json!({}));
    // ConfigMap queue (layer queue) is gone; layer app depends on queue and database.
    let queue = deployable()
        .plan
        .resources
        .iter()
        .position(|r| r.name == "queue")
        .unwrap();
    f.drift = Some(DriftReport {
        drifted: vec![Drifted {
            resource: queue,
            drift: Drift::Deleted,
        }],
    });
    let Next::Write(write) = next(&f) else {
        panic!("a correction begins");
    };
    let phases: Vec<(&str, LayerPhase)> = write
        .status
        .layers
        .iter()
        .map(|l| (l.name.as_str(), l.phase))
        .collect();
    assert_eq!(
        phases,
        [
            ("database", LayerPhase::Ready),
            ("queue", LayerPhase::Pending),
            ("app", LayerPhase::Waiting)
        ]
    );
    assert_eq!(write.status.phase, Some(ReleasePhase::Deploying));
    assert_eq!(write.status.revision, Some(1), "no new revision");
    assert!(write.records.is_empty(), "the record is left as it is");
    let note = &write.events[0];
    assert_eq!(note.reason, EventReason::DriftCorrected);
    assert_eq!(
        note.message,
        "correcting drift of revision 1: ConfigMap apps/queue deleted; applying layer queue again"
    );
    let correction = write.status.last_drift_correction.as_ref().unwrap();
    assert_eq!(correction.objects, ["ConfigMap apps/queue deleted"]);
    // The next step applies layer queue only.
    let mut f2 = f.clone();
    f2.status = write.status.clone();
    f2.drift = None;
    for (i, _) in deployable().keys.iter().enumerate() {
        f2.observed.resources.insert(i, None);
    }
    for key in deployable().keys.iter() {
        f2.observed.present.insert(key.clone(), None);
    }
    let Next::Install(step) = next(&f2) else {
        panic!("the correction steps");
    };
    assert_eq!(step.actions, [InstallAction::ApplyLayer(1)]);
}

#[test]
fn drift_with_warn_sets_the_drifted_condition_once_and_clears_it() {
    let mut f = ready_facts(json!({"driftDetection": "warn"}));
    f.drift = Some(DriftReport {
        drifted: vec![Drifted {
            resource: 0,
            drift: Drift::Changed(vec![".spec.template.spec.containers[0].image".into()]),
        }],
    });
    let Next::Write(write) = next(&f) else {
        panic!("the condition is written");
    };
    assert_eq!(write.status.phase, Some(ReleasePhase::Ready));
    let drifted = write
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Drifted")
        .unwrap();
    assert_eq!(
        drifted.message,
        "revision 1 drifted (spec.driftDetection: warn, not corrected): Deployment apps/db changed: .spec.template.spec.containers[0].image"
    );
    assert_eq!(write.events[0].reason, EventReason::DriftDetected);
    // Written once: the same drift again changes nothing.
    let mut again = f.clone();
    again.status = write.status.clone();
    assert!(matches!(next(&again), Next::Install(_)));
    // Gone: so is the condition.
    again.drift = Some(DriftReport::default());
    let Next::Write(cleared) = next(&again) else {
        panic!("the condition is removed");
    };
    assert!(
        cleared
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != "Drifted")
    );
}

/// A first install with `spec.timeout: timeout` just begun, nothing of it in the cluster yet.
fn begun_with_timeout(timeout: &str) -> Facts {
    let mut f = facts(release(json!({ "timeout": timeout }), json!({})));
    f.source = source("sha256:1");
    f.plan = plan_fact("sha256:1", false);
    let Next::Begin(begin) = next(&f) else {
        panic!("begins");
    };
    f.status = begin.status.clone();
    f.records.insert(1, Some(Arc::new(begin.record.clone())));
    for key in deployable().keys.iter() {
        f.observed.present.insert(key.clone(), None);
    }
    for (i, _) in deployable().keys.iter().enumerate() {
        f.observed.resources.insert(i, None);
    }
    f
}

#[test]
fn an_operation_past_spec_timeout_fails_with_reason_timeout() {
    let mut f = begun_with_timeout("30s");
    // Seen in progress since 29 s: still going.
    f.operation_since = Some(at(71));
    let Next::Install(step) = next(&f) else {
        panic!("steps");
    };
    assert!(!step.actions.is_empty());
    // Since 30 s: over.
    f.operation_since = Some(at(70));
    let Next::Install(step) = next(&f) else {
        panic!("steps");
    };
    assert!(step.actions.is_empty(), "nothing more is started");
    assert_eq!(step.status.phase, Some(ReleasePhase::Failed));
    let (_, reason, message) = condition(&step.status, "Stalled");
    assert_eq!(reason, "Timeout");
    // Nothing was started before the timeout: the message says so, not that it was applied.
    assert_eq!(
        message,
        "timed out after 30s (spec.timeout): layer database of chart shop, layer queue of chart shop were not started"
    );
    assert_eq!(step.records.len(), 1, "the record says failed");
}

#[test]
fn the_time_the_api_server_did_not_answer_is_not_counted_against_spec_timeout() {
    use sequenced::rollout::outages::Outages;
    let mut f = begun_with_timeout("30s");
    // In progress for 40 s, of which the API server was away for 20 s (and starting after it,
    // until 5 s from now): 15 s count, the operation goes on and says how long was paused.
    f.operation_since = Some(at(60));
    f.observed.outages = Outages::new([(at(70), at(95)), (at(95), at(105))]);
    let Next::Install(step) = next(&f) else {
        panic!("steps");
    };
    assert!(!step.actions.is_empty(), "not timed out");
    assert_eq!(step.status.phase, Some(ReleasePhase::Deploying));
    let message = step.status.message.clone().unwrap_or_default();
    assert!(
        message.ends_with(
            " (35s while the API server did not answer or was starting not counted against spec.timeout and the readiness timeouts)"
        ),
        "{message}"
    );
    let (_, _, reconciling) = condition(&step.status, "Reconciling");
    assert_eq!(reconciling, message, "the condition says it too");
    // The same span long before the operation began counts for nothing.
    f.observed.outages = Outages::new([(at(10), at(35))]);
    let Next::Install(step) = next(&f) else {
        panic!("steps");
    };
    assert!(step.actions.is_empty(), "timed out: 40s counted");
    let (_, reason, message) = condition(&step.status, "Stalled");
    assert_eq!(reason, "Timeout");
    assert!(!message.contains("not counted"), "{message}");
}

#[test]
fn in_a_terminating_namespace_without_records_the_kept_inventory_is_uninstalled() {
    let deleting = json!({"deletionTimestamp": "2027-01-15T08:00:00Z"});
    let mut status = ready(1, "sha256:1");
    status.inventory = vec![sequenced::api::InventoryEntry {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        namespace: None,
        name: "reader".into(),
        chart: "shop".into(),
        layer: "rbac".into(),
    }];
    let mut f = facts(with_status(release(json!({}), deleting), status));
    f.namespace_terminating = None;
    assert_eq!(next(&f), Next::Need(Need::Namespace));
    f.namespace_terminating = Some(true);
    // The records went with the namespace.
    f.records.insert(1, None);
    let role = ObjectKey {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        namespace: None,
        name: "reader".into(),
    };
    assert!(matches!(next(&f), Next::Need(Need::Observe(_))));
    let ours = sequenced::api::Claim {
        owner: Some("apps/shop".into()),
        ..Default::default()
    };
    f.observed.present.insert(role.clone(), Some(ours));
    let Next::Uninstall(step) = next(&f) else {
        panic!("uninstalls");
    };
    assert_eq!(step.deletes, [(0, vec![role.clone()])]);
    assert!(
        step.records.is_empty(),
        "no record is written in the namespace"
    );
    f.status = step.status.clone();
    f.observed.present.insert(role, None);
    let Next::FinishUninstall {
        records, delete, ..
    } = next(&f)
    else {
        panic!("finishes");
    };
    assert!(
        records.is_empty() && delete.is_empty(),
        "the namespace controller deletes the records"
    );
}

#[test]
fn enabled_tests_are_the_last_stage_and_a_request_runs_them_on_a_ready_release_only() {
    // spec.test.enable: the revision's last stage is (test).
    let mut f = facts(release(json!({"test": {"enable": true}}), json!({})));
    f.source = source("sha256:1");
    f.plan = Some(PlanFact {
        digest: "sha256:1".into(),
        is_upgrade: false,
        outcome: Ok(hooked()),
    });
    assert_eq!(
        stage_names(&begin_with(&f)),
        ["(pre-install)", "(default)", "(test)"]
    );

    // Asked for on a Ready release without spec.test: its (test) stage is added, the release
    // is Testing, still Ready, at the same revision.
    let asked = json!({"annotations": {TEST_REQUEST_ANNOTATION: "t1"}});
    let mut status = ready(1, "sha256:1");
    status.layers = vec![sequenced::api::LayerStatus {
        chart: "shop".into(),
        name: "(default)".into(),
        phase: LayerPhase::Ready,
        resources: 1,
        ready: 1,
        ..Default::default()
    }];
    let mut f = facts(with_status(
        release(json!({}), asked.clone()),
        status.clone(),
    ));
    f.source = source("sha256:1");
    f.plan = Some(PlanFact {
        digest: "sha256:1".into(),
        is_upgrade: false,
        outcome: Ok(hooked()),
    });
    f.records
        .insert(1, record(1, "sha256:1", Inventory::default()));
    let Next::Write(write) = next(&f) else {
        panic!("the test run starts: {:?}", next(&f))
    };
    let st = &write.status;
    assert_eq!(st.phase, Some(ReleasePhase::Testing));
    assert_eq!(st.revision, Some(1));
    assert_eq!(st.last_handled_test_at.as_deref(), Some("t1"));
    assert_eq!(st.test_refused, None);
    let layers: Vec<(&str, LayerPhase)> = st
        .layers
        .iter()
        .map(|l| (l.name.as_str(), l.phase))
        .collect();
    assert_eq!(
        layers,
        [
            ("(default)", LayerPhase::Ready),
            ("(test)", LayerPhase::Pending)
        ]
    );
    assert_eq!(
        condition(st, "Ready"),
        condition(&status, "Ready"),
        "Ready is not touched"
    );
    assert_eq!(condition(st, "Reconciling").0, "True");
    assert!(write.records.is_empty());

    // Asked for while an operation is under way: it waits for its end (the token is not
    // handled yet).
    let mut deploying = status.clone();
    deploying.phase = Some(ReleasePhase::Deploying);
    let mut f2 = facts(with_status(release(json!({}), asked.clone()), deploying));
    f2.source = f.source.clone();
    f2.plan = f.plan.clone();
    f2.records = f.records.clone();
    match next(&f2) {
        Next::Write(w) => panic!("not a test run while deploying: {w:?}"),
        Next::Install(step) => assert_eq!(step.status.last_handled_test_at, None),
        _ => {}
    }

    // Asked for on a Failed release: refused, the rest as it was.
    let mut failed = status;
    failed.phase = Some(ReleasePhase::Failed);
    failed.message = Some("layer app of chart shop failed: boom".into());
    let mut f3 = facts(with_status(release(json!({}), asked), failed.clone()));
    f3.source = f.source.clone();
    let Next::Write(write) = next(&f3) else {
        panic!("refused: {:?}", next(&f3))
    };
    assert_eq!(write.status.last_handled_test_at.as_deref(), Some("t1"));
    assert_eq!(
        write.status.test_refused.as_deref(),
        Some(
            "tests not run: the release is Failed at revision 1, not Ready: layer app of chart shop failed: boom"
        )
    );
    assert_eq!(write.status.phase, Some(ReleasePhase::Failed));
    assert_eq!(write.status.message, failed.message);
    assert_eq!(write.events.len(), 1);
    assert_eq!(write.events[0].reason, EventReason::TestRefused);
}

/// `spec.kubeConfig` that cannot be used (a missing Secret, a refused kubeconfig): the release
/// stalls with the refusal's reason before reading anything else; a deployed release being
/// deleted waits Uninstalling (its objects are on that cluster), one that never deployed a
/// revision is let go.
#[test]
fn an_unusable_kubeconfig_stalls_and_holds_only_the_deletion_of_a_deployed_release() {
    let refusal = Refusal {
        reason: Reason::InvalidKubeConfig,
        message: "spec.kubeConfig.secretRef: Secret apps/fleet-a not found".to_string(),
    };
    let mut f = facts(release(json!({}), json!({})));
    f.target = Err(refusal.clone());
    let Next::Stall { status, event, .. } = next(&f) else {
        panic!("stalls");
    };
    assert_eq!(status.message.as_deref(), Some(refusal.message.as_str()));
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Stalled" && c.status == "True" && c.reason == "InvalidKubeConfig")
    );
    assert!(event.is_some());

    let deleting = json!({"deletionTimestamp": "2027-01-15T08:00:00Z"});
    let mut never = facts(release(json!({}), deleting.clone()));
    never.target = Err(refusal.clone());
    assert_eq!(
        next(&never),
        Next::FinishUninstall {
            events: Vec::new(),
            records: Vec::new(),
            delete: Vec::new(),
        }
    );

    let mut deployed = facts(with_status(
        release(json!({}), deleting),
        ready(1, "sha256:1"),
    ));
    deployed.target = Err(refusal.clone());
    let Next::Stall { status, .. } = next(&deployed) else {
        panic!("waits, stalled");
    };
    assert_eq!(status.phase, Some(ReleasePhase::Ready));
    assert_eq!(status.message.as_deref(), Some(refusal.message.as_str()));
}
