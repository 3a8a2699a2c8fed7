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
use sequenced::api::v1alpha1::{RemediationAction, SequencedRelease};
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
            ("templates/settings.yaml", &config_map("settings", "helm.sh/layer: config")),
            (
                "templates/app.yaml",
                &deployment("app", "helm.sh/layer: app\n    helm.sh/depends-on/layers: config"),
            ),
            ("templates/broken.yaml", &broken),
        ],
    )
}

fn path(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.path().join(name)
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

async fn patch_spec(op: &Operator, name: &str, spec: Value) {
    op.releases("default")
        .patch(name, &PatchParams::default(), &Patch::Merge(&json!({ "spec": spec })))
        .await
        .unwrap();
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
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), "default");
    let out = tokio::process::Command::new(support::helm())
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .output()
        .await
        .expect("run helm");
    assert!(out.status.success(), "helm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    op.server.object(api_version, kind, Some("default"), name).is_some()
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
        patch_spec(&op, "shop", json!({"values": {"broken": true}})).await;
        let sr = op
            .wait_release("default", "shop", "rolled back", |sr| {
                is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(3)
            })
            .await;
        let st = status(&sr);
        assert_eq!(
            message(&sr),
            "rolled back to revision 1 after revision 2 failed: layer extra of chart shop failed: Job check: failed (BackoffLimitExceeded: Job has reached the specified backoff limit); spec generation 2 not applied"
        );
        let (ready, reason, _) = condition(&sr, "Ready").unwrap();
        assert_eq!((ready.as_str(), reason.as_str()), ("True", "RolledBack"));
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
        patch_spec(&op, "shop", json!({"values": {"broken": false, "more": 1}})).await;
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
