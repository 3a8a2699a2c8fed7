//! Recovery on the in-process test API server (DESIGN.md "Rollback" and "Release records"):
//! records in Helm's storage format read by the real `helm` binary, `maxHistory` lowered,
//! `spec.onFailure` rollback and uninstall after the retries, a rollback on request that applies
//! the target revision in its own order, a reconcile on request, and records of the earlier
//! format still read after an operator upgrade.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::{ReleasePhase, RemediationAction, SequencedRelease};
use sequenced::api::{
    FORCE_REQUEST_ANNOTATION, ObjectKey, RECONCILE_REQUEST_ANNOTATION, ROLLBACK_REQUEST_ANNOTATION,
    ROLLBACK_REVISION_ANNOTATION, record_name,
};
use sequenced::history::{Inventory, InventoryStep, Record};
use serde_json::{Value, json};
use support::charts::{chart, condition, config_map, deployment, is_ready, message, release};
use support::operator::{Operator, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// A Job in layer `layer` that the emulated Job controller fails.
fn failing_job(name: &str, layer: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  labels:\n    sequenced.test/outcome: fail\n  annotations:\n    helm.sh/layer: {layer}\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n"
    )
}

/// Chart `shop`: layer `config` (ConfigMap `settings`) then layer `app` (Deployment `app`); with
/// `.Values.broken`, layer `extra` after them adds ConfigMap `added` and a Job that fails.
fn shop() -> TempDir {
    let broken = format!(
        "{{{{- if .Values.broken }}}}\n{}---\n{}{{{{- end }}}}\n",
        config_map(
            "added",
            "helm.sh/layer: extra\n    helm.sh/depends-on/layers: app"
        ),
        failing_job("check", "extra").replace(
            "helm.sh/layer: extra",
            "helm.sh/layer: extra\n    helm.sh/depends-on/layers: app"
        ),
    );
    chart(
        "shop",
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
            ("templates/broken.yaml", &broken),
        ],
    )
}

/// The release runs a revision `spec.onFailure` rolled back to: the rollback is done.
fn rolled_back(sr: &SequencedRelease) -> bool {
    sr.status.as_ref().is_some_and(|s| {
        s.phase == Some(ReleasePhase::Ready)
            && s.rollback.is_some()
            && s.observed_generation == sr.metadata.generation
    })
}

fn path(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.path().join(name)
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

async fn annotate(op: &Operator, name: &str, annotations: Value) {
    let patch = json!({"metadata": {"annotations": annotations}});
    op.releases("default")
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Runs the real helm against the test API server, in namespace default.
async fn helm(op: &Operator, args: &[&str]) -> String {
    let url = op.server.url();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let dir = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&dir, &url, "default");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::run_helm(&kubeconfig, &args)
    })
    .await
    .expect("helm")
}

/// `helm history NAME`: (revision, status, description) of every record.
async fn history(op: &Operator, name: &str) -> Vec<(i64, String, String)> {
    let text = helm(op, &["history", name, "-o", "json"]).await;
    let history: Value = serde_json::from_str(&text).unwrap();
    history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["revision"].as_i64().unwrap(),
                h["status"].as_str().unwrap().to_string(),
                h["description"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The names of the objects of `kind` applied (server-side apply) from request `from` on, in
/// order, without repeats.
fn applied_since(op: &Operator, from: usize, kinds: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in op.server.requests().iter().skip(from) {
        if r.verb == "apply"
            && r.status < 300
            && !support::operator::is_dry_run(r)
            && r.kind.as_deref().is_some_and(|k| kinds.contains(&k))
            && let Some(name) = &r.name
            && !names.contains(name)
        {
            names.push(name.clone());
        }
    }
    names
}

fn exists(op: &Operator, api_version: &str, kind: &str, name: &str) -> bool {
    op.server
        .object(api_version, kind, Some("default"), name)
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_upgrade_rolls_back_to_the_last_ready_revision_in_its_order() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let _jobs = op.job_controller(Duration::from_millis(100));
        let dir = shop();
        op.create("default", release("shop", &path(&dir, "shop"), json!({"onFailure": "rollback"})))
            .await;
        op.wait_release("default", "shop", "revision 1 Ready", is_ready).await;
        assert_eq!(history(&op, "shop").await, [(1, "deployed".into(), "Install complete".into())]);

        let before = op.server.requests().len();
        op.patch_spec("shop", json!({"values": {"broken": true}})).await;
        let sr = op
            .wait_release("default", "shop", "rolled back", |sr| {
                rolled_back(sr) && sr.status.as_ref().unwrap().revision == Some(3)
            })
            .await;
        let st = status(&sr);
        assert_eq!(
            message(&sr),
            "rolled back to revision 1 after revision 2 failed: layer extra of chart shop failed: Job check: failed (BackoffLimitExceeded: Job has reached the specified backoff limit); spec generation 2 not applied"
        );
        // Its objects are ready, but the spec's revision failed and is held back: not Ready,
        // and Stalled until the spec changes (kstatus reads Failed, Argo CD Degraded).
        let (ready, reason, _) = condition(&sr, "Ready").unwrap();
        assert_eq!((ready.as_str(), reason.as_str()), ("False", "RolledBack"));
        let (stalled, reason, _) = condition(&sr, "Stalled").unwrap();
        assert_eq!((stalled.as_str(), reason.as_str()), ("True", "RolledBack"));
        assert_eq!(st.phase, Some(ReleasePhase::Ready));
        let rollback = st.rollback.as_ref().expect("status.rollback");
        assert_eq!((rollback.revision, rollback.to, rollback.from), (3, 1, Some(2)));
        assert!(!rollback.requested);
        let remediation = st.remediation.as_ref().expect("status.remediation");
        assert_eq!(remediation.failed_revision, 2);
        assert_eq!(remediation.action, RemediationAction::Rollback);
        let layers: Vec<&str> = st.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(layers, ["config", "app", "(prune)"]);
        // What revision 2 added is gone; revision 1's objects are there.
        assert!(exists(&op, "v1", "ConfigMap", "settings"));
        assert!(exists(&op, "apps/v1", "Deployment", "app"));
        assert!(!exists(&op, "v1", "ConfigMap", "added"));
        assert!(!exists(&op, "batch/v1", "Job", "check"));
        // Revision 2 applied config, app, then extra; the rollback applied config then app.
        let rolling_back = op
            .server
            .requests()
            .iter()
            .position(|r| {
                r.verb == "create" && r.name.as_deref() == Some("sh.helm.release.v1.shop.v3")
            })
            .expect("the record of revision 3 is created");
        assert!(rolling_back > before);
        assert_eq!(
            applied_since(&op, rolling_back, &["ConfigMap", "Deployment", "Job"]),
            ["settings", "app"]
        );
        // The deletes of the prune come after the layers.
        let deletes: Vec<String> = op
            .server
            .requests()
            .iter()
            .skip(rolling_back)
            .filter(|r| is_write(r) && r.verb == "delete" && r.kind.as_deref() != Some("Lease"))
            .filter_map(|r| r.name.clone())
            .collect();
        assert_eq!(deletes, ["check", "added"], "reverse order of revision 2's plan");
        op.wait_event("default", "shop", "RollbackStarted").await;
        op.wait_event("default", "shop", "RolledBack").await;

        // Helm sees the three revisions as Helm would have written them.
        let seen = history(&op, "shop").await;
        let statuses: Vec<(i64, &str)> = seen.iter().map(|(n, s, _)| (*n, s.as_str())).collect();
        assert_eq!(statuses, [(1, "superseded"), (2, "failed"), (3, "deployed")]);
        assert_eq!(seen[2].2, "Rollback to 1 complete");
        assert!(seen[1].2.starts_with("Upgrade failed: layer extra of chart shop failed"), "{seen:?}");
        let manifest = helm(&op, &["get", "manifest", "shop"]).await;
        assert!(manifest.contains("# Source: shop/templates/settings.yaml"), "{manifest}");
        assert!(!manifest.contains("name: added"), "{manifest}");
        let failed = helm(&op, &["get", "manifest", "shop", "--revision", "2"]).await;
        assert!(failed.contains("name: added"), "{failed}");
        assert!(helm(&op, &["get", "values", "shop", "--revision", "2"]).await.contains("broken: true"));
        let list: Value = serde_json::from_str(&helm(&op, &["list", "-o", "json"]).await).unwrap();
        assert_eq!(list[0]["revision"], "3");
        assert_eq!(list[0]["status"], "deployed");
        assert_eq!(list[0]["chart"], "shop-0.1.0");

        // The release stays rolled back: no new revision while the spec is unchanged.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sr = op.releases("default").get("shop").await.unwrap();
        assert_eq!(status(&sr).revision, Some(3));
        // A spec change is applied: a new revision, no longer held.
        op.patch_spec("shop", json!({"values": {"broken": false, "more": 1}})).await;
        let sr = op
            .wait_release("default", "shop", "revision 4 Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(4)
            })
            .await;
        assert!(status(&sr).rollback.is_none());
        assert!(message(&sr).starts_with("revision 4"), "{}", message(&sr));
        op.stop().await;
    })
    .await;
}

/// Chart `first`: layer `a` (ConfigMap `one`), then layer `b` with a Job that fails.
fn failing_first_install() -> TempDir {
    chart(
        "first",
        &[
            ("templates/one.yaml", &config_map("one", "helm.sh/layer: a")),
            (
                "templates/check.yaml",
                &failing_job("check", "b").replace(
                    "helm.sh/layer: b",
                    "helm.sh/layer: b\n    helm.sh/depends-on/layers: a",
                ),
            ),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_install_with_rollback_is_uninstalled_in_reverse_order_and_a_reconcile_retries_it()
 {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(100));
        let dir = failing_first_install();
        op.create("default", release("first", &path(&dir, "first"), json!({"onFailure": "rollback"})))
            .await;
        let sr = op
            .wait_release("default", "first", "uninstalled", |sr| {
                support::charts::is_stalled(sr)
                    && condition(sr, "Stalled").is_some_and(|c| c.1 == "Uninstalled")
            })
            .await;
        assert_eq!(
            message(&sr),
            "revision 1 failed: layer b of chart first failed: Job check: failed (BackoffLimitExceeded: Job has reached the specified backoff limit); its objects were uninstalled (spec.onFailure); change the spec or run `sequenced reconcile` to install again"
        );
        let st = status(&sr);
        assert_eq!(st.revision, Some(1));
        assert_eq!(st.remediation.as_ref().unwrap().action, RemediationAction::Uninstall);
        assert!(!exists(&op, "v1", "ConfigMap", "one"));
        assert!(!exists(&op, "batch/v1", "Job", "check"));
        // Layer b went before layer a, the reverse of the install.
        let deletes: Vec<String> = op
            .writes("ConfigMap")
            .into_iter()
            .chain(op.writes("Job"))
            .filter(|(verb, _)| verb == "delete")
            .map(|(_, name)| name)
            .collect();
        assert_eq!(deletes.len(), 2, "{deletes:?}");
        let job_deleted = op
            .server
            .requests()
            .iter()
            .position(|r| r.verb == "delete" && r.name.as_deref() == Some("check"))
            .unwrap();
        let config_deleted = op
            .server
            .requests()
            .iter()
            .position(|r| r.verb == "delete" && r.name.as_deref() == Some("one"))
            .unwrap();
        assert!(job_deleted < config_deleted);
        op.wait_event("default", "first", "UninstallStarted").await;
        op.wait_event("default", "first", "Uninstalled").await;
        let seen = history(&op, "first").await;
        assert_eq!(seen, [(1, "uninstalled".into(), "Uninstallation complete".into())]);
        // Nothing happens by itself (the spec is the same)...
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(status(&op.releases("default").get("first").await.unwrap()).revision, Some(1));
        // ...until a reconcile is requested: the same spec is installed again, as revision 2.
        annotate(&op, "first", json!({RECONCILE_REQUEST_ANNOTATION: "2026-11-24T10:00:00Z"})).await;
        let sr = op
            .wait_release("default", "first", "revision 2 handled", |sr| {
                sr.status.as_ref().is_some_and(|s| {
                    s.revision == Some(2)
                        && s.last_handled_reconcile_at.as_deref() == Some("2026-11-24T10:00:00Z")
                })
            })
            .await;
        assert_eq!(status(&sr).history[0].revision, 2);
        op.wait_object("v1", "ConfigMap", "default", "one").await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_come_first_then_on_failure_uninstall_removes_everything_of_the_release() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let _jobs = op.job_controller(Duration::from_millis(50));
        let dir = shop();
        op.create(
            "default",
            release(
                "shop",
                &path(&dir, "shop"),
                json!({"onFailure": "uninstall", "retries": 1}),
            ),
        )
        .await;
        op.wait_release("default", "shop", "revision 1 Ready", is_ready)
            .await;
        op.patch_spec("shop", json!({"values": {"broken": true}}))
            .await;
        // Revision 2 fails, revision 3 retries it (after 5 s) and fails too; then the release's
        // objects are uninstalled.
        let sr = op
            .wait_release("default", "shop", "uninstalled", |sr| {
                condition(sr, "Stalled").is_some_and(|c| c.0 == "True" && c.1 == "Uninstalled")
            })
            .await;
        let st = status(&sr);
        assert_eq!(st.revision, Some(3), "one retry, then the remediation");
        assert_eq!(st.remediation.as_ref().unwrap().failed_revision, 3);
        for (api_version, kind, name) in [
            ("v1", "ConfigMap", "settings"),
            ("apps/v1", "Deployment", "app"),
            ("v1", "ConfigMap", "added"),
            ("batch/v1", "Job", "check"),
        ] {
            assert!(
                !exists(&op, api_version, kind, name),
                "{kind} {name} is uninstalled"
            );
        }
        let statuses: Vec<(i64, String)> = history(&op, "shop")
            .await
            .into_iter()
            .map(|(n, s, _)| (n, s))
            .collect();
        assert_eq!(
            statuses,
            [
                (1, "superseded".into()),
                (2, "failed".into()),
                (3, "uninstalled".into())
            ]
        );
        // A spec change installs again: an install, not an upgrade.
        op.patch_spec("shop", json!({"values": {"broken": false}}))
            .await;
        op.wait_release("default", "shop", "revision 4 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(4)
        })
        .await;
        let seen = history(&op, "shop").await;
        assert_eq!(seen.last().unwrap().2, "Install complete");
        op.stop().await;
    })
    .await;
}

/// Chart `order`: ConfigMaps `alpha` and `beta` in layers of those names; with `.Values.flip`
/// false, `beta` depends on `alpha`, else `alpha` on `beta`.
fn order() -> TempDir {
    let alpha = "{{- if .Values.flip }}\n    helm.sh/depends-on/layers: beta\n{{- end }}";
    let beta = "{{- if not .Values.flip }}\n    helm.sh/depends-on/layers: alpha\n{{- end }}";
    chart(
        "order",
        &[
            (
                "templates/alpha.yaml",
                &config_map("alpha", &format!("helm.sh/layer: alpha{alpha}")),
            ),
            (
                "templates/beta.yaml",
                &config_map("beta", &format!("helm.sh/layer: beta{beta}")),
            ),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_rollback_applies_the_target_revision_in_its_own_order_and_holds_until_the_spec_changes()
 {
    within(async {
        let op = Operator::start(4).await;
        let dir = order();
        op.create("default", release("order", &path(&dir, "order"), json!({})))
            .await;
        op.wait_release("default", "order", "revision 1 Ready", is_ready)
            .await;
        let first = op.server.requests().len();
        op.patch_spec("order", json!({"values": {"flip": true}}))
            .await;
        op.wait_release("default", "order", "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
        })
        .await;
        assert_eq!(
            applied_since(&op, first, &["ConfigMap"]),
            ["beta", "alpha"],
            "revision 2: beta first"
        );

        // A revision that does not exist is refused, and handled.
        annotate(
            &op,
            "order",
            json!({ROLLBACK_REQUEST_ANNOTATION: "t1", ROLLBACK_REVISION_ANNOTATION: "9"}),
        )
        .await;
        let sr = op
            .wait_release("default", "order", "refused", |sr| {
                sr.status
                    .as_ref()
                    .unwrap()
                    .last_handled_rollback_at
                    .as_deref()
                    == Some("t1")
            })
            .await;
        assert_eq!(
            message(&sr),
            "rollback refused: there is no revision 9: the latest is 2"
        );
        assert_eq!(status(&sr).revision, Some(2));
        op.wait_event("default", "order", "RollbackRefused").await;

        let before = op.server.requests().len();
        annotate(
            &op,
            "order",
            json!({ROLLBACK_REQUEST_ANNOTATION: "t2", ROLLBACK_REVISION_ANNOTATION: "1"}),
        )
        .await;
        let sr = op
            .wait_release("default", "order", "rolled back", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(3)
            })
            .await;
        assert_eq!(
            message(&sr),
            "rolled back to revision 1; spec generation 2 not applied"
        );
        assert!(status(&sr).rollback.as_ref().unwrap().requested);
        assert_eq!(status(&sr).last_handled_rollback_at.as_deref(), Some("t2"));
        // The order of revision 1, not of the spec: alpha, then beta.
        assert_eq!(
            applied_since(&op, before, &["ConfigMap"]),
            ["alpha", "beta"]
        );
        let seen = history(&op, "order").await;
        assert_eq!(
            seen[2],
            (3, "deployed".into(), "Rollback to 1 complete".into())
        );
        assert_eq!(seen[1].1, "superseded");

        // It holds: an interval-like wake changes nothing; a reconcile request without --force
        // retries the spec, since it is not applied.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            status(&op.releases("default").get("order").await.unwrap()).revision,
            Some(3)
        );
        annotate(&op, "order", json!({RECONCILE_REQUEST_ANNOTATION: "r1"})).await;
        let sr = op
            .wait_release("default", "order", "revision 4 Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(4)
            })
            .await;
        assert!(status(&sr).rollback.is_none());
        assert_eq!(status(&sr).last_handled_reconcile_at.as_deref(), Some("r1"));
        // A Ready release: a reconcile request is handled without a new revision; with --force,
        // it is applied again as a new revision.
        annotate(&op, "order", json!({RECONCILE_REQUEST_ANNOTATION: "r2"})).await;
        let sr = op
            .wait_release("default", "order", "r2 handled", |sr| {
                sr.status
                    .as_ref()
                    .unwrap()
                    .last_handled_reconcile_at
                    .as_deref()
                    == Some("r2")
            })
            .await;
        assert_eq!(status(&sr).revision, Some(4));
        annotate(
            &op,
            "order",
            json!({RECONCILE_REQUEST_ANNOTATION: "r3", FORCE_REQUEST_ANNOTATION: "r3"}),
        )
        .await;
        op.wait_release("default", "order", "revision 5 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(5)
        })
        .await;
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_max_history_deletes_every_record_past_the_cap() {
    within(async {
        let op = Operator::start(4).await;
        let dir = order();
        op.create("default", release("order", &path(&dir, "order"), json!({})))
            .await;
        for n in 1..=4 {
            if n > 1 {
                op.patch_spec("order", json!({"values": {"n": n}})).await;
            }
            op.wait_release("default", "order", "Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(n)
            })
            .await;
        }
        let revisions: Vec<i64> = history(&op, "order").await.iter().map(|h| h.0).collect();
        assert_eq!(revisions, [1, 2, 3, 4]);
        op.patch_spec("order", json!({"maxHistory": 2, "values": {"n": 5}}))
            .await;
        op.wait_release("default", "order", "revision 5 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(5)
        })
        .await;
        let seen = history(&op, "order").await;
        let revisions: Vec<i64> = seen.iter().map(|h| h.0).collect();
        assert_eq!(revisions, [4, 5], "{seen:?}");
        let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "default");
        for n in 1..=3 {
            let name = format!("sh.helm.release.v1.order.v{n}");
            assert!(
                secrets.get_opt(&name).await.unwrap().is_none(),
                "{name} is deleted"
            );
        }
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_earlier_format_are_read_and_rewritten_in_helms() {
    within(async {
        // A release the previous operator version installed: revision 1 Ready, its objects
        // applied, its record in the earlier format.
        let mut op = Operator::start(4).await;
        let dir = order();
        op.create("default", release("order", &path(&dir, "order"), json!({}))).await;
        op.wait_release("default", "order", "Ready", is_ready).await;
        op.take_controller().stop().await;
        let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "default");
        secrets
            .delete("sh.helm.release.v1.order.v1", &Default::default())
            .await
            .unwrap();
        let key = |kind: &str, name: &str| ObjectKey {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some("default".into()),
            name: name.into(),
        };
        // It also had ConfigMap `old`, which the chart no longer renders.
        let old: Value = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "old", "namespace": "default",
            "annotations": {"sequenced.dev/owner": "default/order"}}});
        let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(op.client.clone(), "default");
        configmaps
            .create(&PostParams::default(), &serde_json::from_value(old).unwrap())
            .await
            .unwrap();
        let step = |name: &str, objects| InventoryStep {
            chart: "order".into(),
            name: name.into(),
            objects,
            after: vec![],
        };
        let record = Record {
            revision: 1,
            digest: "sha256:earlier".into(),
            chart: "order".into(),
            chart_version: Some("0.1.0".into()),
            chart_artifact: None,
            sequenced: true,
            inventory: Inventory {
                steps: vec![
                    step("beta", vec![key("ConfigMap", "beta")]),
                    step("alpha", vec![key("ConfigMap", "alpha"), key("ConfigMap", "old")]),
                ],
            },
            prune: vec![],
            hooks: vec![],
            upgrade: None,
            crds: None,
            plan: None,
            rollback_to: None,
            went_on_from: None,
            tests: Vec::new(),
            content: Default::default(),
            info: Default::default(),
        };
        let earlier: Secret = serde_json::from_value(json!({
            "metadata": {"name": record_name("order", 1),
                         "labels": {"app.kubernetes.io/managed-by": "sequenced"},
                         "annotations": {"sequenced.dev/owner": "default/order"}},
            "type": "sequenced.dev/release.v1",
            "data": {"release": k8s_openapi::ByteString(record.encode())},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &earlier).await.unwrap();

        // The new operator upgrades it: the earlier record's inventory says what to prune.
        let upgraded = op.spawn("upgraded-controller", 4);
        op.patch_spec("order", json!({"values": {"n": 2}})).await;
        op.wait_release("default", "order", "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
        })
        .await;
        assert!(!exists(&op, "v1", "ConfigMap", "old"), "pruned from the earlier record");
        assert!(exists(&op, "v1", "ConfigMap", "alpha"));
        // Revision 1's record now reads as Helm's, superseded; the earlier Secret is gone.
        let statuses: Vec<(i64, String)> =
            history(&op, "order").await.into_iter().map(|(n, s, _)| (n, s)).collect();
        assert_eq!(statuses, [(1, "superseded".into()), (2, "deployed".into())]);
        assert!(secrets.get_opt(&record_name("order", 1)).await.unwrap().is_none());
        // A rollback to it is refused: it has no stored plan.
        annotate(&op, "order", json!({ROLLBACK_REQUEST_ANNOTATION: "t", ROLLBACK_REVISION_ANNOTATION: "1"}))
            .await;
        let sr = op
            .wait_release("default", "order", "refused", |sr| {
                sr.status.as_ref().unwrap().last_handled_rollback_at.as_deref() == Some("t")
            })
            .await;
        assert_eq!(
            message(&sr),
            "rollback refused: cannot roll back to revision 1: its record holds no plan (written by an earlier sequenced, or too large for a Secret with it)"
        );
        upgraded.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_too_large_for_a_secret_with_its_plan_is_written_without_it() {
    within(async {
        let op = Operator::start(4).await;
        // 700 KB that gzip cannot shrink much: twice over (manifest and plan) it passes the
        // 1 MiB a Secret may hold.
        let mut seed: u64 = 42;
        let noise: String = (0..700_000)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(seed >> 33) as usize % 36])
            })
            .collect();
        let big = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n  noise: {noise}\n"
        );
        let dir = chart("large", &[("templates/big.yaml", &big)]);
        op.create("default", release("large", &path(&dir, "large"), json!({})))
            .await;
        op.wait_release("default", "large", "Ready", is_ready).await;
        let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "default");
        let secret = secrets.get("sh.helm.release.v1.large.v1").await.unwrap();
        let data = &secret.data.unwrap()["release"].0;
        let helm = sequenced::history::helm::HelmRelease::decode("s", data).unwrap();
        assert!(helm.manifest.contains(&noise[..100]));
        assert!(helm.sequenced.as_ref().unwrap().get("plan").is_none());
        assert_eq!(history(&op, "large").await[0].1, "deployed");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_runs_the_target_revisions_rollback_hooks_around_its_layers() {
    within(async {
        let op = Operator::start(4).await;
        let _jobs = op.job_controller(Duration::from_millis(50));
        let hook = |name: &str, event: &str| {
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  annotations:\n    helm.sh/hook: {event}\n    helm.sh/hook-delete-policy: before-hook-creation\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n"
            )
        };
        let dir = chart(
            "hooked",
            &[
                ("templates/c.yaml", &config_map("c", "helm.sh/layer: c")),
                ("templates/before.yaml", &hook("before", "pre-rollback")),
                ("templates/after.yaml", &hook("after", "post-rollback")),
            ],
        );
        op.create("default", release("hooked", &path(&dir, "hooked"), json!({}))).await;
        op.wait_release("default", "hooked", "Ready", is_ready).await;
        // Neither install nor upgrade runs them.
        op.patch_spec("hooked", json!({"values": {"n": 2}})).await;
        op.wait_release("default", "hooked", "revision 2", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
        })
        .await;
        assert!(!exists(&op, "batch/v1", "Job", "before"));
        let from = op.server.requests().len();
        annotate(&op, "hooked", json!({ROLLBACK_REQUEST_ANNOTATION: "go"})).await;
        let sr = op
            .wait_release("default", "hooked", "rolled back", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(3)
            })
            .await;
        let stages: Vec<&str> = status(&sr).layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(stages, ["(pre-rollback)", "c", "(post-rollback)"]);
        assert_eq!(message(&sr), "rolled back to revision 1; spec generation 2 not applied");
        // pre-rollback, then the layer, then post-rollback.
        let applied = applied_since(&op, from, &["Job", "ConfigMap"]);
        assert_eq!(applied, ["before", "c", "after"]);
        op.stop().await;
    })
    .await;
}
