//! Convergence on the in-process test API server (issue "Convergence on a real cluster"): drift
//! corrected in order or only reported, fields an HPA owns left alone, `spec.timeout` bounding
//! an operation, an uninstall that names the finalizer it waits for, a superseded revision, and
//! namespace deletion that always finishes, also after the controller was down.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use sequenced::api::ReleasePhase;
use sequenced::api::v1alpha1::SequencedRelease;
use serde_json::{Value, json};
use support::charts::{chart, condition, config_map, deployment, is_ready, message, release};
use support::operator::{Operator, is_dry_run, is_shard_keeping, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

/// Chart `shop`: layer `config` (ConfigMaps `settings` and `extra`), then layer `app`
/// (Deployment `app`), which depends on it.
fn shop() -> TempDir {
    chart(
        "shop",
        &[
            (
                "templates/settings.yaml",
                &format!(
                    "{}---\n{}",
                    config_map("settings", "helm.sh/layer: config"),
                    config_map("extra", "helm.sh/layer: config")
                ),
            ),
            (
                "templates/app.yaml",
                &deployment(
                    "app",
                    "helm.sh/layer: app\n    helm.sh/depends-on/layers: config",
                ),
            ),
            ("values.yaml", "version: 1\n"),
        ],
    )
}

fn config_maps(op: &Operator, namespace: &str) -> Api<ConfigMap> {
    Api::namespaced(op.client.clone(), namespace)
}

/// The requests with `verb` for `kind` `name` from request `from` on.
fn requests_since(op: &Operator, from: usize, verb: &str, kind: &str, name: &str) -> usize {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| {
            r.verb == verb
                && r.status < 300
                && r.kind.as_deref() == Some(kind)
                && r.name.as_deref() == Some(name)
                && !r.query.contains("dryRun")
        })
        .count()
}

/// Creates release `name` of chart `name` in `dir`, in namespace `default`, with an `interval`
/// of an hour: what happens sooner is the watches' doing.
async fn create(op: &Operator, dir: &TempDir, name: &str) {
    op.create(
        "default",
        release(name, &dir.path().join(name), json!({"interval": "1h"})),
    )
    .await;
}

async fn ready_at(op: &Operator, namespace: &str, name: &str, revision: i64) -> SequencedRelease {
    op.wait_release(
        namespace,
        name,
        &format!("revision {revision} Ready"),
        |sr| is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(revision),
    )
    .await
}

/// The shop chart released as `shop` in `default` with these spec fields, Ready at revision 1;
/// the chart's directory lives as long as the value returned.
async fn ready_shop(op: &Operator, spec: Value) -> TempDir {
    let dir = shop();
    op.create("default", release("shop", &dir.path().join("shop"), spec))
        .await;
    ready_at(op, "default", "shop", 1).await;
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_object_is_recreated_at_once_and_the_layers_after_it_are_only_checked() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let dir = shop();
        create(&op, &dir, "shop").await;
        ready_at(&op, "default", "shop", 1).await;

        let before = op.server.requests().len();
        config_maps(&op, "default")
            .delete("settings", &DeleteParams::default())
            .await
            .unwrap();
        let note = op.wait_event("default", "shop", "DriftCorrected").await;
        assert_eq!(
            note,
            "correcting drift of revision 1: ConfigMap default/settings deleted; applying layer config again"
        );
        op.wait_object("v1", "ConfigMap", "default", "settings").await;
        let sr = op
            .wait_release("default", "shop", "Ready after the correction", |sr| {
                is_ready(sr) && status(sr).last_drift_correction.is_some()
            })
            .await;
        let st = status(&sr);
        assert_eq!(st.revision, Some(1), "a correction is not a new revision");
        let correction = st.last_drift_correction.as_ref().unwrap();
        assert_eq!(correction.revision, 1);
        assert_eq!(correction.objects, ["ConfigMap default/settings deleted"]);
        assert_eq!(st.history.len(), 1);
        assert_eq!(st.history[0].phase, ReleasePhase::Ready);
        // Layer config was applied again; layer app, which depends on it, was only checked.
        assert_eq!(requests_since(&op, before, "apply", "ConfigMap", "settings"), 1);
        assert_eq!(requests_since(&op, before, "apply", "Deployment", "app"), 0);
        assert_eq!(op.metrics.drift_corrections.get(), 1);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_changed_by_an_edit_is_taken_back_within_seconds_without_waiting_for_the_interval()
{
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let dir = shop();
        // An interval of an hour: the edit's watch event is what finds it.
        create(&op, &dir, "shop").await;
        ready_at(&op, "default", "shop", 1).await;
        let edited_at = std::time::Instant::now();
        // What `kubectl edit` does: an update by another field manager.
        let edit = PatchParams {
            field_manager: Some("kubectl-edit".to_string()),
            ..PatchParams::default()
        };
        config_maps(&op, "default")
            .patch("extra", &edit, &Patch::Merge(json!({"data": {"a": "edited"}})))
            .await
            .unwrap();
        let note = op.wait_event("default", "shop", "DriftCorrected").await;
        assert_eq!(
            note,
            "correcting drift of revision 1: ConfigMap default/extra changed: .data.a; applying layer config again"
        );
        assert!(
            edited_at.elapsed() < Duration::from_secs(5),
            "corrected {:?} after the edit",
            edited_at.elapsed()
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let cm = config_maps(&op, "default").get("extra").await.unwrap();
            if cm.data.as_ref().and_then(|d| d.get("a")).map(String::as_str) == Some("b") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the edit is never taken back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ready_at(&op, "default", "shop", 1).await;
        op.stop().await;
    })
    .await;
}

/// The controller's requests from request `from` on, but the shard keeping's (Lease list and
/// member renewal) and the watches' long-running requests.
fn controller_requests_since(op: &Operator, from: usize) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| r.client.is_some() && r.verb != "watch" && !is_shard_keeping(r))
        .map(|r| format!("{} {}?{} {}", r.verb, r.path, r.query, r.status))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_release_sends_no_request_at_its_interval_when_nothing_changed() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let _dir = ready_shop(&op, json!({"interval": "1s"})).await;
        // Let the writes that end the install settle (the lease's release, the last event).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = op.server.requests().len();
        let reconciles = op.metrics.reconciles.with_label_values(&["success"]).get();
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Woken at every interval (five times), and not one request: no drift check reads the
        // objects when no watch event said one changed.
        let woken = op.metrics.reconciles.with_label_values(&["success"]).get() - reconciles;
        assert!(woken >= 3, "woken {woken} times in 5 s at interval 1s");
        let sent = controller_requests_since(&op, before);
        assert!(sent.is_empty(), "an idle Ready release sent {sent:#?}");
        // An edit of a label (no new generation of a Deployment, only metadata) is still found.
        let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), "default");
        let edit = PatchParams {
            field_manager: Some("kubectl-label".to_string()),
            ..PatchParams::default()
        };
        deployments
            .patch(
                "app",
                &edit,
                &Patch::Merge(json!({"metadata": {"labels": {"example.com/team": "x"}}})),
            )
            .await
            .unwrap();
        // The label is not the chart's: not drift, and nothing corrected, but the objects were
        // compared in full once (a GET and a dry run each), then nothing again.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after_edit = op.server.requests().len();
        let compared = op
            .server
            .requests()
            .iter()
            .skip(before)
            .filter(|r| r.client.is_some() && r.query.contains("dryRun"))
            .count();
        assert_eq!(compared, 3, "one dry run per object after the edit");
        assert_eq!(op.metrics.drift_corrections.get(), 0);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let sent = controller_requests_since(&op, after_edit);
        assert!(sent.is_empty(), "sent after the comparison: {sent:#?}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_with_warn_is_reported_and_left_as_it_is() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let _dir = ready_shop(&op, json!({"driftDetection": "warn", "interval": "1h"})).await;
        config_maps(&op, "default")
            .delete("settings", &DeleteParams::default())
            .await
            .unwrap();
        let sr = op
            .wait_release("default", "shop", "condition Drifted", |sr| {
                condition(sr, "Drifted").is_some_and(|c| c.0 == "True")
            })
            .await;
        let (_, reason, text) = condition(&sr, "Drifted").unwrap();
        assert_eq!(reason, "Drifted");
        assert_eq!(
            text,
            "revision 1 drifted (spec.driftDetection: warn, not corrected): ConfigMap default/settings deleted"
        );
        assert!(is_ready(&sr), "warn leaves the release Ready");
        let note = op.wait_event("default", "shop", "DriftDetected").await;
        assert_eq!(note, text);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "settings")
                .is_none(),
            "warn changes nothing"
        );
        assert_eq!(op.metrics.drift_corrections.get(), 0);
        assert!(status(&sr).last_drift_correction.is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_an_hpa_sets_through_scale_are_never_fought_over() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let dir = shop();
        op.create(
            "default",
            release("shop", &dir.path().join("shop"), json!({"interval": "1s"})),
        )
        .await;
        ready_at(&op, "default", "shop", 1).await;
        // What the HorizontalPodAutoscaler controller does: it writes /scale.
        let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), "default");
        let hpa = PatchParams {
            field_manager: Some("kube-controller-manager".to_string()),
            ..PatchParams::default()
        };
        deployments
            .patch_scale("app", &hpa, &Patch::Merge(json!({"spec": {"replicas": 5}})))
            .await
            .unwrap();
        let replicas = |d: &Deployment| d.spec.as_ref().and_then(|s| s.replicas);
        // Two full drift checks later nothing was corrected.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(replicas(&deployments.get("app").await.unwrap()), Some(5));
        assert_eq!(op.metrics.drift_corrections.get(), 0);

        // An upgrade applies the Deployment again and leaves replicas to the HPA.
        op.releases("default")
            .patch(
                "shop",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"values": {"version": 2}}})),
            )
            .await
            .unwrap();
        ready_at(&op, "default", "shop", 2).await;
        let app = deployments.get("app").await.unwrap();
        assert_eq!(replicas(&app), Some(5));
        let owners: Vec<(String, Option<String>)> = app
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter(|e| {
                serde_json::to_string(&e.fields_v1)
                    .unwrap_or_default()
                    .contains("f:replicas")
            })
            .map(|e| (e.manager.unwrap_or_default(), e.subresource))
            .collect();
        assert_eq!(
            owners,
            [(
                "kube-controller-manager".to_string(),
                Some("scale".to_string())
            )],
            "only the HPA owns spec.replicas"
        );
        op.stop().await;
    })
    .await;
}

/// Chart `slow`: layer `config` (ConfigMap `settings`), then layer `app` (Deployment `app`),
/// which never becomes ready without a kubelet.
fn slow() -> TempDir {
    chart(
        "slow",
        &[
            (
                "templates/settings.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            ),
            (
                "templates/app.yaml",
                &deployment(
                    "app",
                    "helm.sh/layer: app\n    helm.sh/depends-on/layers: config",
                ),
            ),
            ("values.yaml", "version: 1\n"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_timeout_ends_an_operation_that_never_finishes() {
    within(async {
        let op = Operator::start(4).await;
        let dir = slow();
        op.create(
            "default",
            release(
                "slow",
                &dir.path().join("slow"),
                json!({"timeout": "3s", "readinessTimeout": "1h"}),
            ),
        )
        .await;
        let sr = op
            .wait_release("default", "slow", "timed out", |sr| {
                condition(sr, "Stalled").is_some_and(|c| c.0 == "True" && c.1 == "Timeout")
            })
            .await;
        let text = message(&sr);
        assert!(
            text.starts_with("timed out after 3s (spec.timeout), still waiting for layer app of chart slow: waiting for Deployment app"),
            "{text}"
        );
        let st = status(&sr);
        assert_eq!(st.phase, Some(ReleasePhase::Failed));
        assert_eq!(st.history[0].phase, ReleasePhase::Failed);
        let app = st.layers.iter().find(|l| l.name == "app").unwrap();
        assert_eq!(app.phase, sequenced::api::LayerPhase::Failed);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_replaced_while_it_waits_is_superseded_not_failed() {
    within(async {
        let op = Operator::start(4).await;
        let dir = slow();
        op.create(
            "default",
            release("slow", &dir.path().join("slow"), json!({})),
        )
        .await;
        op.wait_release("default", "slow", "layer app waiting", |sr| {
            support::charts::layer_phase(sr, "app") == Some(sequenced::api::LayerPhase::Waiting)
        })
        .await;
        op.releases("default")
            .patch(
                "slow",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"values": {"version": 2}}})),
            )
            .await
            .unwrap();
        let _kubelet = op.kubelet();
        let sr = ready_at(&op, "default", "slow", 2).await;
        let phases: Vec<(i64, ReleasePhase)> = status(&sr)
            .history
            .iter()
            .map(|h| (h.revision, h.phase))
            .collect();
        assert_eq!(
            phases,
            [(2, ReleasePhase::Ready), (1, ReleasePhase::Superseded)]
        );
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(op.client.clone(), "default");
        let first = secrets.get("sh.helm.release.v1.slow.v1").await.unwrap();
        assert_eq!(
            first
                .metadata
                .labels
                .unwrap_or_default()
                .get("status")
                .map(String::as_str),
            Some("superseded")
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_held_by_a_finalizer_says_so_and_finishes_once_it_is_removed() {
    within(async {
        let op = Operator::start(4).await;
        let held = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers:\n    - example.com/hold\ndata:\n  a: b\n";
        let dir = chart("held", &[("templates/held.yaml", held)]);
        op.create(
            "default",
            release("held", &dir.path().join("held"), json!({"timeout": "3s"})),
        )
        .await;
        ready_at(&op, "default", "held", 1).await;
        op.releases("default")
            .delete("held", &DeleteParams::default())
            .await
            .unwrap();
        let sr = op
            .wait_release("default", "held", "an uninstall past its timeout", |sr| {
                condition(sr, "Stalled").is_some_and(|c| c.0 == "True" && c.1 == "Timeout")
            })
            .await;
        assert_eq!(
            message(&sr),
            "uninstall not done after 3s (spec.timeout): uninstalling layer (default) of chart held: waiting for ConfigMap default/held to be deleted: it is held by finalizer example.com/hold, which its controller has not removed; it goes on once that changes"
        );
        assert_eq!(status(&sr).phase, Some(ReleasePhase::Uninstalling));
        op.server
            .remove_finalizers("v1", "ConfigMap", Some("default"), "held");
        op.wait_deleted("default", "held").await;
        op.stop().await;
    })
    .await;
}

/// Chart `wide`: a ClusterRole (cluster-scoped, outside the namespace) in layer `rbac`, then a
/// ConfigMap in layer `config`.
fn wide(role: &str) -> TempDir {
    let cluster_role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {role}\n  annotations:\n    helm.sh/layer: rbac\nrules:\n  - apiGroups: [\"\"]\n    resources: [\"configmaps\"]\n    verbs: [\"get\"]\n"
    );
    chart(
        "wide",
        &[
            ("templates/role.yaml", &cluster_role),
            (
                "templates/settings.yaml",
                &config_map(
                    "settings",
                    "helm.sh/layer: config\n    helm.sh/depends-on/layers: rbac",
                ),
            ),
        ],
    )
}

async fn delete_namespace(op: &Operator, name: &str) {
    let namespaces: Api<Namespace> = Api::all(op.client.clone());
    namespaces
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

async fn wait_namespace_gone(op: &Operator, name: &str) {
    let namespaces: Api<Namespace> = Api::all(op.client.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while namespaces.get_opt(name).await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "namespace {name} stays Terminating"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn cluster_role(op: &Operator, name: &str) -> Option<Value> {
    op.server
        .object("rbac.authorization.k8s.io/v1", "ClusterRole", None, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_namespace_of_a_ready_release_finishes_and_removes_what_it_had_outside() {
    within(async {
        let op = Operator::start(4).await;
        op.namespace("doomed").await;
        let dir = wide("doomed-reader");
        op.create(
            "doomed",
            release("wide", &dir.path().join("wide"), json!({})),
        )
        .await;
        let sr = ready_at(&op, "doomed", "wide", 1).await;
        let kept: Vec<(&str, &str)> = status(&sr)
            .inventory
            .iter()
            .map(|e| (e.kind.as_str(), e.name.as_str()))
            .collect();
        assert_eq!(kept, [("ClusterRole", "doomed-reader")], "status.inventory");
        assert!(cluster_role(&op, "doomed-reader").is_some());

        let before = op.server.requests().len();
        delete_namespace(&op, "doomed").await;
        wait_namespace_gone(&op, "doomed").await;
        assert!(
            cluster_role(&op, "doomed-reader").is_none(),
            "the ClusterRole is left behind"
        );
        // Nothing is created in the namespace once the controller saw it terminating: a create
        // may race the deletion (a step that read the namespace just before), once, and is
        // refused; the uninstall does not depend on it.
        let refused: Vec<String> = op
            .server
            .requests()
            .iter()
            .skip(before)
            .filter(|r| is_write(r) && r.status == 403 && r.kind.as_deref() == Some("Lease"))
            .map(|r| format!("{} {:?} {:?}", r.verb, r.kind, r.name))
            .collect();
        assert!(refused.len() <= 1, "refused Lease writes: {refused:?}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_deleted_while_the_controller_was_down_finishes_when_it_is_back() {
    within(async {
        let mut op = Operator::start(4).await;
        op.namespace("lost").await;
        let dir = wide("lost-reader");
        op.create("lost", release("wide", &dir.path().join("wide"), json!({})))
            .await;
        ready_at(&op, "lost", "wide", 1).await;
        op.take_controller().stop().await;

        delete_namespace(&op, "lost").await;
        // The namespace controller deletes the Lease and the records; the release stays, held
        // by its finalizer, and so does the namespace.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(op.client.clone(), "lost");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !secrets
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the records are never deleted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let sr = op.releases("lost").get("wide").await.unwrap();
        assert!(sr.metadata.deletion_timestamp.is_some());
        assert!(cluster_role(&op, "lost-reader").is_some());

        let back = op.spawn("controller-back", 4);
        wait_namespace_gone(&op, "lost").await;
        assert!(
            cluster_role(&op, "lost-reader").is_none(),
            "the ClusterRole is left behind"
        );
        back.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drift_correction_cut_short_by_a_killed_controller_is_finished_by_the_next_one() {
    within(async {
        let op = Operator::without_controller().await;
        let a = op.spawn("controller-a", 4);
        let dir = shop();
        op.create(
            "default",
            release("shop", &dir.path().join("shop"), json!({"timeout": "3s", "interval": "1h"})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "app").await;
        assert!(op.deployment_ready("default", "app"));
        ready_at(&op, "default", "shop", 1).await;

        // The Deployment is deleted; controller a applies it again and waits for it, then dies.
        let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), "default");
        deployments.delete("app", &DeleteParams::default()).await.unwrap();
        let note = op.wait_event("default", "shop", "DriftCorrected").await;
        assert_eq!(
            note,
            "correcting drift of revision 1: Deployment default/app deleted; applying layer app again"
        );
        op.wait_release("default", "shop", "layer app waiting", |sr| {
            support::charts::layer_phase(sr, "app") == Some(sequenced::api::LayerPhase::Waiting)
        })
        .await;
        a.kill().await;
        let b = op.spawn("controller-b", 4);
        assert!(op.deployment_ready("default", "app"));
        op.wait_event("default", "shop", "LockTakenOver").await;
        let sr = ready_at(&op, "default", "shop", 1).await;
        assert!(status(&sr).last_drift_correction.is_some());
        assert_eq!(status(&sr).history.len(), 1, "still revision 1");
        // b resumed from the status: the Deployment a applied is not applied again.
        let appliers: Vec<Option<String>> = op
            .server
            .requests()
            .iter()
            .filter(|r| {
                r.verb == "apply"
                    && r.kind.as_deref() == Some("Deployment")
                    && !r.query.contains("dryRun")
            })
            .map(|r| r.client.clone())
            .collect();
        assert_eq!(
            appliers,
            [Some("controller-a".to_string()), Some("controller-a".to_string())],
            "installed, then re-created, both by controller-a"
        );
        assert_eq!(b.metrics.lock_takeovers.get(), 1);
        b.stop().await;
    })
    .await;
}

/// The message of the release's first layer.
fn layer_message(sr: &SequencedRelease) -> String {
    sr.status
        .as_ref()
        .and_then(|s| s.layers.first())
        .and_then(|l| l.message.clone())
        .unwrap_or_default()
}

/// Chart `ext`: ConfigMap `app`, which waits for objects outside the release, one annotation
/// per spelling kubectl accepts.
fn waits_for(spellings: &[(&str, &str)]) -> TempDir {
    let annotations: Vec<String> = spellings
        .iter()
        .map(|(id, reference)| format!("{id}.external-dependency.werf.io/resource: {reference}"))
        .collect();
    chart(
        "ext",
        &[(
            "templates/app.yaml",
            &config_map("app", &annotations.join("\n    ")),
        )],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_dependencies_are_found_in_every_spelling_kubectl_accepts() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let dir = waits_for(&[
            ("lower", "secret/ext-secret"),
            ("upper", "Secret/ext-secret"),
            ("short", "cm/ext-config"),
            ("plural", "configmaps/ext-config"),
            ("grouped", "deployment.apps/ext-web"),
            ("pluralgroup", "deployments.apps/ext-web"),
            ("versioned", "Deployment.v1.apps/ext-web"),
        ]);
        create(&op, &dir, "ext").await;
        // The dependencies are waited for in the order of their ids; each spelling left
        // unresolved would keep the release waiting for good.
        op.wait_release("default", "ext", "waiting for the Deployment", |sr| {
            layer_message(sr).contains(
                "waiting for external dependency deployment.apps ext-web: deployment.apps ext-web: not found",
            )
        })
        .await;
        let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), "default");
        let web: Value = serde_yaml_ng::from_str(&deployment("ext-web", "a.b/c: d")).unwrap();
        deployments
            .create(&Default::default(), &serde_json::from_value(web).unwrap())
            .await
            .unwrap();
        op.wait_release("default", "ext", "waiting for the Secret", |sr| {
            layer_message(sr).contains("waiting for external dependency secret ext-secret")
        })
        .await;
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(op.client.clone(), "default");
        secrets
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": "ext-secret"}})).unwrap(),
            )
            .await
            .unwrap();
        op.wait_release("default", "ext", "waiting for the ConfigMap", |sr| {
            layer_message(sr).contains("waiting for external dependency configmaps ext-config")
        })
        .await;
        config_maps(&op, "default")
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": "ext-config"}})).unwrap(),
            )
            .await
            .unwrap();
        // The watches on the external objects wake the release: the interval is an hour.
        ready_at(&op, "default", "ext", 1).await;
        op.wait_object("v1", "ConfigMap", "default", "app").await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_dependency_of_a_kind_nothing_serves_stalls_the_release_naming_the_annotation()
{
    within(async {
        let op = Operator::start(4).await;
        let dir = waits_for(&[("db", "secrte/ext-secret")]);
        create(&op, &dir, "ext").await;
        let sr = op
            .wait_release("default", "ext", "Stalled", support::charts::is_stalled)
            .await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "PlanFailed");
        assert!(
            text.contains("annotation db.external-dependency.werf.io/resource of ConfigMap/app")
                && text.contains("the API server serves no resource \"secrte\""),
            "{text}"
        );
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "app")
                .is_none(),
            "nothing is applied"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_failure_keeps_its_reason_on_the_first_line_of_the_condition_and_the_event() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "bad",
            &[("templates/bad.yaml", "{{ .Values.missing.field }}\n")],
        );
        create(&op, &dir, "bad").await;
        let sr = op
            .wait_release("default", "bad", "Stalled", support::charts::is_stalled)
            .await;
        // kubectl shows the first line of a column or an event, then "...".
        let (_, reason, text) = condition(&sr, "Ready").unwrap();
        assert_eq!(reason, "RenderFailed");
        let first = text.lines().next().unwrap_or_default();
        assert!(
            first.contains("helm template failed (exit code 1): bad/templates/bad.yaml:1:10")
                && first.ends_with("nil pointer evaluating interface {}.field"),
            "{text}"
        );
        let note = op.wait_event("default", "bad", "Stalled").await;
        assert!(
            note.lines()
                .next()
                .is_some_and(|l| l.ends_with("nil pointer evaluating interface {}.field")),
            "{note}"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_layer_has_its_own_event_as_kubectl_get_events_lists_them() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "abc",
            &[
                ("templates/a.yaml", &config_map("a", "helm.sh/layer: a")),
                (
                    "templates/b.yaml",
                    &config_map("b", "helm.sh/layer: b\n    helm.sh/depends-on/layers: a"),
                ),
                (
                    "templates/c.yaml",
                    &config_map("c", "helm.sh/layer: c\n    helm.sh/depends-on/layers: b"),
                ),
            ],
        );
        create(&op, &dir, "abc").await;
        ready_at(&op, "default", "abc", 1).await;
        // What `kubectl get events` reads: core/v1 Events, with their count.
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(op.client.clone(), "default");
        // ReleaseReady is published right after the status that says Ready.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let all = loop {
            let all: Vec<_> = events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("abc"))
                .collect();
            let done = all
                .iter()
                .any(|e| e.reason.as_deref() == Some("ReleaseReady"));
            if done || std::time::Instant::now() > deadline {
                break all;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let reasons: Vec<&str> = all.iter().filter_map(|e| e.reason.as_deref()).collect();
        // Layer c's readiness is the release's: ReleaseReady says it.
        assert_eq!(
            reasons.iter().filter(|r| **r == "ReleaseReady").count(),
            1,
            "{reasons:?}"
        );
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        let mut started: Vec<(String, Option<i32>)> = all
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("LayerStarted"))
            .map(|e| (e.message.unwrap_or_default(), e.count))
            .collect();
        started.sort();
        let notes: Vec<&str> = started.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(
            notes,
            [
                "Applying layer a of chart abc (1 resources)",
                "Layer a of chart abc is ready (1 resources); applying layer b of chart abc (1 resources)",
                "Layer b of chart abc is ready (1 resources); applying layer c of chart abc (1 resources)",
            ],
            "one event per layer, which says the layer before is ready"
        );
        assert!(
            started.iter().all(|(_, count)| count.unwrap_or(1) == 1),
            "{started:?}"
        );
        op.stop().await;
    })
    .await;
}

/// Chart `scaled`: Deployment `web` and its HorizontalPodAutoscaler, at the apiVersion the
/// values name (`autoscaling/v1` or `autoscaling/v2`), with a CPU target of 70 %.
fn scaled() -> TempDir {
    let hpa = r#"{{- if eq .Values.hpa "autoscaling/v1" }}
apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata:
  name: web
  annotations:
    helm.sh/layer: scaling
    helm.sh/depends-on/layers: app
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 4
  targetCPUUtilizationPercentage: 70
{{- else }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: web
  annotations:
    helm.sh/layer: scaling
    helm.sh/depends-on/layers: app
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 4
  metrics:
    - type: Resource
      resource:
        name: cpu
        target: {type: Utilization, averageUtilization: 70}
{{- end }}
"#;
    chart(
        "scaled",
        &[
            (
                "templates/web.yaml",
                &deployment("web", "helm.sh/layer: app"),
            ),
            ("templates/hpa.yaml", hpa),
            ("values.yaml", "hpa: autoscaling/v1\n"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_that_changes_the_served_version_updates_the_object_and_does_not_prune_it() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let dir = scaled();
        create(&op, &dir, "scaled").await;
        ready_at(&op, "default", "scaled", 1).await;
        let v1 = op
            .server
            .object(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                Some("default"),
                "web",
            )
            .expect("the HPA, through autoscaling/v1");
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 70);
        let uid = v1["metadata"]["uid"].clone();

        let before = op.server.requests().len();
        op.releases("default")
            .patch(
                "scaled",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"values": {"hpa": "autoscaling/v2"}}})),
            )
            .await
            .unwrap();
        let sr = ready_at(&op, "default", "scaled", 2).await;
        let v2 = op
            .server
            .object(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                Some("default"),
                "web",
            )
            .expect("the HPA is still there after the upgrade");
        assert_eq!(v2["metadata"]["uid"], uid, "the same object, updated");
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            70
        );
        assert_eq!(
            requests_since(&op, before, "delete", "HorizontalPodAutoscaler", "web"),
            0,
            "the upgrade pruned what it had just applied"
        );
        let inventory = &status(&sr).inventory;
        assert!(
            inventory.is_empty(),
            "nothing outside the namespace: {inventory:?}"
        );
        op.stop().await;
    })
    .await;
}

/// Chart `valued` (version `version`): ConfigMap `shown`, whose `data.v` is `.Values.v`.
fn valued(version: &str) -> TempDir {
    chart(
        "valued",
        &[
            (
                "templates/shown.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shown\ndata:\n  v: {{ .Values.v | quote }}\n",
            ),
            ("values.yaml", "v: default\n"),
            (
                "Chart.yaml",
                &format!("apiVersion: v2\nname: valued\nversion: {version}\n"),
            ),
        ],
    )
}

/// `data.v` of ConfigMap `shown`, once it is `want`.
async fn shown(op: &Operator, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v = op
            .server
            .object("v1", "ConfigMap", Some("default"), "shown")
            .and_then(|o| o["data"]["v"].as_str().map(str::to_string));
        if v.as_deref() == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ConfigMap shown has v {v:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn revision(sr: &SequencedRelease) -> Option<i64> {
    sr.status.as_ref().and_then(|s| s.revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_values_from_config_map_or_secret_starts_a_revision_at_once() {
    within(async {
        let op = Operator::start(4).await;
        let dir = valued("0.1.0");
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(op.client.clone(), "default");
        config_maps(&op, "default")
            .create(
                &Default::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": "vals"}, "data": {"values.yaml": "v: one\n"}}),
                )
                .unwrap(),
            )
            .await
            .unwrap();
        op.create(
            "default",
            release(
                "valued",
                &dir.path().join("valued"),
                json!({"interval": "1h", "valuesFrom": [
                    {"kind": "ConfigMap", "name": "vals"},
                    {"kind": "Secret", "name": "secret-vals", "optional": true}
                ]}),
            ),
        )
        .await;
        ready_at(&op, "default", "valued", 1).await;
        shown(&op, "one").await;

        // The interval is an hour: only the watch on the ConfigMap explains a new revision.
        config_maps(&op, "default")
            .patch(
                "vals",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"values.yaml": "v: two\n"}})),
            )
            .await
            .unwrap();
        ready_at(&op, "default", "valued", 2).await;
        shown(&op, "two").await;

        // A label leaves the digest as it is: woken, but no new revision.
        let before = op.server.requests().len();
        config_maps(&op, "default")
            .patch(
                "vals",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
            )
            .await
            .unwrap();
        // The optional Secret appears later, and wins (it comes after the ConfigMap).
        secrets
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": "secret-vals"},
                    "stringData": {"values.yaml": "v: three\n"}}))
                .unwrap(),
            )
            .await
            .unwrap();
        let sr = ready_at(&op, "default", "valued", 3).await;
        shown(&op, "three").await;
        assert_eq!(
            revision(&sr),
            Some(3),
            "the label started no revision of its own"
        );
        assert!(
            requests_since(&op, before, "get", "ConfigMap", "vals") >= 1,
            "the release read its inputs again"
        );

        // A ConfigMap nobody reads wakes nothing (once the steps after Ready are done).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let reads = op.server.requests().len();
        config_maps(&op, "default")
            .create(
                &Default::default(),
                &serde_json::from_value(json!({"metadata": {"name": "unrelated"}})).unwrap(),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            requests_since(&op, reads, "get", "ConfigMap", "vals"),
            0,
            "an unrelated ConfigMap woke the release"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_replaced_in_its_config_map_starts_a_revision_at_once() {
    within(async {
        let op = Operator::start(4).await;
        let archive = |version: &str| {
            let dir = valued(version);
            let out = tempfile::tempdir().unwrap();
            let path = support::package(&dir.path().join("valued"), out.path());
            std::fs::read(path).unwrap()
        };
        let configmap = |bytes: Vec<u8>| -> ConfigMap {
            serde_json::from_value(json!({"metadata": {"name": "charts"},
                "binaryData": {"valued.tgz": k8s_openapi::ByteString(bytes)}}))
            .unwrap()
        };
        config_maps(&op, "default")
            .create(&Default::default(), &configmap(archive("0.1.0")))
            .await
            .unwrap();
        op.create(
            "default",
            json!({
                "apiVersion": "sequenced.dev/v1alpha1",
                "kind": "SequencedRelease",
                "metadata": {"name": "valued"},
                "spec": {"chart": {"configMapRef": {"name": "charts", "key": "valued.tgz"}},
                    "interval": "1h"}
            }),
        )
        .await;
        let sr = ready_at(&op, "default", "valued", 1).await;
        assert_eq!(
            status(&sr).history[0].chart_version.as_deref(),
            Some("0.1.0")
        );
        config_maps(&op, "default")
            .replace("charts", &Default::default(), &configmap(archive("0.2.0")))
            .await
            .unwrap();
        let sr = ready_at(&op, "default", "valued", 2).await;
        assert_eq!(
            status(&sr)
                .history
                .first()
                .and_then(|h| h.chart_version.as_deref()),
            Some("0.2.0"),
            "{:?}",
            status(&sr).history
        );
        op.stop().await;
    })
    .await;
}

// Drift ignore rules (`spec.driftDetection: {mode, ignore}`, Flux's spelling).

/// The write requests (not dry runs) the controller sent since request `from`: applies of
/// objects and writes of the release itself.
fn writes_since(op: &Operator, from: usize) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .skip(from)
        .filter(|r| is_write(r) && r.status < 300)
        .filter(|r| r.verb == "apply" || r.kind.as_deref() == Some("SequencedRelease"))
        .map(|r| format!("{} {:?} {:?}", r.verb, r.kind, r.name))
        .collect()
}

/// What another manager does with a plain update (no `/scale`): an autoscaler that writes the
/// Deployment itself, `kubectl edit`.
async fn scale_by_update(op: &Operator, replicas: i32) {
    let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), "default");
    let autoscaler = PatchParams {
        field_manager: Some("autoscaler".to_string()),
        ..PatchParams::default()
    };
    deployments
        .patch(
            "app",
            &autoscaler,
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
}

fn replicas_of(op: &Operator) -> Option<i64> {
    op.server
        .object("apps/v1", "Deployment", Some("default"), "app")
        .and_then(|d| d.pointer("/spec/replicas").and_then(Value::as_i64))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_another_manager_updates_are_drift_without_an_ignore_rule() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        // The object form without ignore rules, mode warn: the drift is only reported.
        let _dir = ready_shop(&op, json!({"driftDetection": {"mode": "warn"}, "interval": "1s"})).await;
        scale_by_update(&op, 5).await;
        let sr = op
            .wait_release("default", "shop", "condition Drifted", |sr| {
                condition(sr, "Drifted").is_some_and(|c| c.0 == "True")
            })
            .await;
        assert_eq!(
            condition(&sr, "Drifted").unwrap().2,
            "revision 1 drifted (spec.driftDetection: warn, not corrected): Deployment default/app changed: .spec.replicas"
        );
        assert_eq!(replicas_of(&op), Some(5), "warn changes nothing");
        assert_eq!(op.metrics.drift_corrections.get(), 0);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignored_replicas_are_neither_reported_nor_corrected_nor_reset_by_a_correction() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let _dir = ready_shop(
            &op,
            json!({
                "driftDetection": {
                    "mode": "enabled",
                    "ignore": [{
                        "paths": ["/spec/replicas"],
                        "target": {"group": "apps", "kind": "Deployment", "name": "app"},
                    }],
                },
                "interval": "1s",
            }),
        )
        .await;
        let before = op.server.requests().len();
        scale_by_update(&op, 5).await;
        // Two full drift checks later: nothing reported, nothing corrected, nothing written.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(replicas_of(&op), Some(5));
        assert_eq!(op.metrics.drift_corrections.get(), 0);
        let sr = ready_at(&op, "default", "shop", 1).await;
        assert!(condition(&sr, "Drifted").is_none());
        assert!(
            op.server.requests().iter().skip(before).any(is_dry_run),
            "the drift checks ran"
        );
        assert_eq!(writes_since(&op, before), Vec::<String>::new());

        // Another field of the same object is drift: the correction applies the chart's image
        // again and keeps the replicas the other manager set.
        let edit = PatchParams {
            field_manager: Some("kubectl-edit".to_string()),
            ..PatchParams::default()
        };
        let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), "default");
        deployments
            .patch(
                "app",
                &edit,
                &Patch::<Value>::Json(
                    serde_json::from_value(json!([{
                        "op": "replace",
                        "path": "/spec/template/spec/containers/0/image",
                        "value": "registry.k8s.io/pause:edited",
                    }]))
                    .unwrap(),
                ),
            )
            .await
            .unwrap();
        let note = op.wait_event("default", "shop", "DriftCorrected").await;
        assert!(
            note.starts_with("correcting drift of revision 1: Deployment default/app changed: ")
                && note.contains("image")
                && !note.contains("replicas"),
            "{note}"
        );
        let sr = op
            .wait_release("default", "shop", "Ready after the correction", |sr| {
                is_ready(sr) && status(sr).last_drift_correction.is_some()
            })
            .await;
        assert_eq!(status(&sr).revision, Some(1));
        let app = op
            .server
            .object("apps/v1", "Deployment", Some("default"), "app")
            .unwrap();
        assert_eq!(
            app.pointer("/spec/template/spec/containers/0/image"),
            Some(&json!("registry.k8s.io/pause:3.10")),
            "the edit is taken back"
        );
        assert_eq!(replicas_of(&op), Some(5), "the ignored field is not reset");
        op.stop().await;
    })
    .await;
}

/// Chart `hooks`: a ValidatingWebhookConfiguration and a MutatingWebhookConfiguration, as the
/// charts whose certificate Job patches `caBundle` after install render them (ingress-nginx,
/// kube-prometheus-stack). With `placeholder`, each renders `caBundle: Cg==`, as older charts
/// did; without, it leaves caBundle out, as those two charts do today.
fn webhooks(placeholder: bool) -> TempDir {
    let config = |kind: &str, name: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\nwebhooks:\n  - name: {name}.example.com\n    clientConfig:\n      service:\n        namespace: default\n        name: webhook\n        path: /{name}\n{{{{- if .Values.placeholder }}}}\n      caBundle: Cg==\n{{{{- end }}}}\n    rules:\n      - apiGroups: [\"\"]\n        apiVersions: [v1]\n        operations: [CREATE]\n        resources: [configmaps]\n    failurePolicy: Ignore\n    sideEffects: None\n    admissionReviewVersions: [v1]\n"
        )
    };
    chart(
        "hooks",
        &[
            (
                "templates/validating.yaml",
                &config("ValidatingWebhookConfiguration", "validate"),
            ),
            (
                "templates/mutating.yaml",
                &config("MutatingWebhookConfiguration", "mutate"),
            ),
            ("values.yaml", &format!("placeholder: {placeholder}\n")),
        ],
    )
}

/// What kube-webhook-certgen's `patch` does once the certificate exists: reads the webhook
/// configuration and updates it with the CA in each webhook's `caBundle`.
async fn patch_ca_bundle(op: &Operator, kind: &str, name: &str) {
    let resource = kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        kind,
    ));
    let api: Api<kube::api::DynamicObject> = Api::all_with(op.client.clone(), &resource);
    let mut object = api.get(name).await.unwrap();
    if let Some(hooks) = object.data["webhooks"].as_array_mut() {
        for hook in hooks {
            hook["clientConfig"]["caBundle"] = json!("Q0EK");
        }
    }
    let certgen = kube::api::PostParams {
        field_manager: Some("kube-webhook-certgen".to_string()),
        ..Default::default()
    };
    api.replace(name, &certgen, &object).await.unwrap();
}

fn ca_bundle(op: &Operator, kind: &str, name: &str) -> Option<Value> {
    op.server
        .object("admissionregistration.k8s.io/v1", kind, None, name)
        .and_then(|o| o.pointer("/webhooks/0/clientConfig/caBundle").cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_bundle_patched_after_install_is_not_drift_when_the_chart_leaves_it_out() {
    within(async {
        let op = Operator::start(4).await;
        let dir = webhooks(false);
        op.create(
            "default",
            release(
                "hooks",
                &dir.path().join("hooks"),
                json!({"driftDetection": "enabled", "interval": "1s"}),
            ),
        )
        .await;
        ready_at(&op, "default", "hooks", 1).await;
        let before = op.server.requests().len();
        patch_ca_bundle(&op, "ValidatingWebhookConfiguration", "validate").await;
        patch_ca_bundle(&op, "MutatingWebhookConfiguration", "mutate").await;
        // A field sequenced does not apply is not its own: no rule is needed.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(op.metrics.drift_corrections.get(), 0);
        assert_eq!(writes_since(&op, before), Vec::<String>::new());
        for (kind, name) in [
            ("ValidatingWebhookConfiguration", "validate"),
            ("MutatingWebhookConfiguration", "mutate"),
        ] {
            assert_eq!(ca_bundle(&op, kind, name), Some(json!("Q0EK")), "{kind}");
        }
        let sr = ready_at(&op, "default", "hooks", 1).await;
        assert!(condition(&sr, "Drifted").is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignore_rule_keeps_a_ca_bundle_the_chart_renders_and_only_for_its_target() {
    within(async {
        let op = Operator::start(4).await;
        let dir = webhooks(true);
        // The rule names the ValidatingWebhookConfiguration only: the same field of the
        // MutatingWebhookConfiguration is still drift, corrected as the chart says.
        op.create(
            "default",
            release(
                "hooks",
                &dir.path().join("hooks"),
                json!({
                    "driftDetection": {
                        "ignore": [{
                            "paths": ["/webhooks/0/clientConfig/caBundle"],
                            "target": {"kind": "ValidatingWebhookConfiguration"},
                        }],
                    },
                    "interval": "1s",
                }),
            ),
        )
        .await;
        ready_at(&op, "default", "hooks", 1).await;
        patch_ca_bundle(&op, "ValidatingWebhookConfiguration", "validate").await;
        patch_ca_bundle(&op, "MutatingWebhookConfiguration", "mutate").await;
        let note = op.wait_event("default", "hooks", "DriftCorrected").await;
        assert!(
            note.starts_with(
                "correcting drift of revision 1: MutatingWebhookConfiguration mutate changed: "
            ) && note.contains("caBundle")
                && !note.contains("ValidatingWebhookConfiguration"),
            "{note}"
        );
        op.wait_release("default", "hooks", "Ready after the correction", |sr| {
            is_ready(sr) && status(sr).last_drift_correction.is_some()
        })
        .await;
        assert_eq!(
            ca_bundle(&op, "MutatingWebhookConfiguration", "mutate"),
            Some(json!("Cg==")),
            "no rule: the chart's placeholder is applied again"
        );
        assert_eq!(
            ca_bundle(&op, "ValidatingWebhookConfiguration", "validate"),
            Some(json!("Q0EK")),
            "the ignored caBundle is kept through the correction of its layer"
        );
        // From now on the release is stable: the Job's CA in the ignored field is no drift.
        let before = op.server.requests().len();
        let corrections = op.metrics.drift_corrections.get();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(op.metrics.drift_corrections.get(), corrections);
        assert_eq!(writes_since(&op, before), Vec::<String>::new());
        ready_at(&op, "default", "hooks", 1).await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_form_with_mode_disabled_looks_at_nothing() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let _dir = ready_shop(
            &op,
            json!({"driftDetection": {"mode": "disabled", "ignore": []}, "interval": "1s"}),
        )
        .await;
        let before = op.server.requests().len();
        config_maps(&op, "default")
            .delete("settings", &DeleteParams::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "settings")
                .is_none(),
            "disabled corrects nothing"
        );
        assert!(
            !op.server.requests().iter().skip(before).any(is_dry_run),
            "and compares nothing"
        );
        let sr = ready_at(&op, "default", "shop", 1).await;
        assert!(condition(&sr, "Drifted").is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drift_detection_the_controller_cannot_read_stalls_naming_what_is_wrong() {
    within(async {
        let op = Operator::start(4).await;
        let dir = shop();
        for (name, drift, expected) in [
            (
                "pointer",
                json!({"ignore": [{"paths": ["/spec/replicas", "spec/template"]}]}),
                "spec.driftDetection.ignore[0].paths[1]: \"spec/template\" is not a JSON pointer: it must start with / (such as /spec/replicas), or be \"\" for the whole object",
            ),
            (
                "escape",
                json!({"ignore": [{"paths": ["/metadata/annotations/a~2b"]}]}),
                "spec.driftDetection.ignore[0].paths[0]: \"/metadata/annotations/a~2b\" is not a JSON pointer: ~ must be followed by 0 (for ~) or 1 (for /)",
            ),
            (
                "mode",
                json!("sometimes"),
                "spec.driftDetection: \"sometimes\" is not one of enabled, warn, disabled",
            ),
            (
                "selector",
                json!({"ignore": [{"paths": ["/a"], "target": {"labelSelector": "app=x"}}]}),
                "spec.driftDetection: unknown field `labelSelector`",
            ),
        ] {
            let mut sr = release(
                name,
                &dir.path().join("shop"),
                json!({"driftDetection": drift}),
            );
            sr["spec"]["releaseName"] = json!(format!("shop-{name}"));
            op.create("default", sr).await;
            let sr = op
                .wait_release("default", name, "Stalled", support::charts::is_stalled)
                .await;
            let (_, reason, text) = condition(&sr, "Stalled").unwrap();
            assert_eq!(reason, "InvalidSpec", "{name}");
            assert!(text.starts_with(expected), "{name}: {text}");
        }
        assert!(
            op.server
                .objects("v1", "ConfigMap", Some("default"))
                .iter()
                .all(|cm| cm.pointer("/metadata/name") != Some(&json!("settings"))),
            "nothing was applied"
        );
        op.stop().await;
    })
    .await;
}
