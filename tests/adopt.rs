//! Helm's releases move under sequenced: a SequencedRelease whose release name is a Helm
//! release's goes on from it (`spec.adopt: true`), with the real helm 4 as the oracle, run
//! against the same test API server: helm installs and upgrades, then sequenced goes on at the
//! next revision, as an upgrade, pruning what the new render no longer has, and `helm history`
//! reads one history.

use sequenced_testkit as support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::Api;
use serde_json::{Value, json};
use support::charts::{condition, is_ready, is_stalled, message, release};
use support::operator::Operator;
use tempfile::TempDir;

/// The namespace of every release here (the one the testkit's `patch_spec` patches in).
const NAMESPACE: &str = "default";

/// A chart `shop` whose templates are two werf weights of ConfigMaps (`settings` at 0, then `app` at 1), a
/// ConfigMap `old` rendered while `.Values.old` (true by default), a ClusterRole (cluster-scoped,
/// rendered at every revision), and two hooks that leave a ConfigMap saying the level they ran
/// at: `pre-install-hook` and `pre-upgrade-hook`.
fn shop() -> TempDir {
    let hook = |event: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {event}-hook\n  annotations:\n    helm.sh/hook: {event}\ndata:\n  level: \"{{{{ .Values.level }}}}\"\n"
        )
    };
    support::charts::chart(
        "shop",
        &[
            ("values.yaml", "old: true\nlevel: 1\n"),
            (
                "templates/settings.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  annotations:\n    werf.io/weight: \"0\"\ndata:\n  level: \"{{ .Values.level }}\"\n",
            ),
            (
                "templates/app.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  annotations:\n    werf.io/weight: \"1\"\ndata:\n  level: \"{{ .Values.level }}\"\n",
            ),
            (
                "templates/old.yaml",
                "{{- if .Values.old }}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: old\n  annotations:\n    werf.io/weight: \"0\"\ndata:\n  a: b\n{{- end }}\n",
            ),
            (
                "templates/role.yaml",
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: shop-reader\n  annotations:\n    werf.io/weight: \"0\"\nrules: []\n",
            ),
            ("templates/pre-install.yaml", &hook("pre-install")),
            ("templates/pre-upgrade.yaml", &hook("pre-upgrade")),
        ],
    )
}

/// Runs the real helm 4 against the test server, in [`NAMESPACE`].
async fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    run_helm(support::helm(), kubeconfig, args).await
}

/// Runs the helm binary `helm` (helm 4, or [`support::helm3`]) against the test server, in
/// [`NAMESPACE`].
async fn run_helm(helm: PathBuf, kubeconfig: &Path, args: &[&str]) -> String {
    let kubeconfig = kubeconfig.to_path_buf();
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.extend(["--namespace".to_string(), NAMESPACE.to_string()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::run_helm_binary(&helm, &kubeconfig, &args)
    })
    .await
    .expect("helm")
}

/// `helm history shop`: (revision, status, description) of each revision.
async fn history(kubeconfig: &Path, name: &str) -> Vec<(i64, String, String)> {
    history_by(support::helm(), kubeconfig, name).await
}

/// [`history`] as the helm binary `helm` reads it.
async fn history_by(helm: PathBuf, kubeconfig: &Path, name: &str) -> Vec<(i64, String, String)> {
    let text = run_helm(helm, kubeconfig, &["history", name, "-o", "json"]).await;
    let rows: Value = serde_json::from_str(&text).expect("helm history -o json");
    rows.as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            (
                r["revision"].as_i64().unwrap_or_default(),
                r["status"].as_str().unwrap_or_default().to_string(),
                r["description"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn chart_path(dir: &TempDir) -> PathBuf {
    dir.path().join("shop")
}

/// `helm install shop CHART` then `helm upgrade shop CHART --set level=2` with the helm binary
/// `helm`: revision 1 superseded, 2 deployed.
async fn install_and_upgrade(helm: PathBuf, kubeconfig: &Path, chart: &str) {
    run_helm(helm.clone(), kubeconfig, &["install", "shop", chart]).await;
    run_helm(
        helm,
        kubeconfig,
        &["upgrade", "shop", chart, "--set", "level=2"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_release_goes_on_under_a_sequenced_release_at_its_next_revision_with_adopt() {
    let op = Operator::start(2).await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    let chart = shop();
    let path = chart_path(&chart);
    let path_text = path.display().to_string();
    install_and_upgrade(support::helm(), &kubeconfig, &path_text).await;
    let maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), NAMESPACE);
    assert!(maps.get_opt("old").await.unwrap().is_some());
    let level = |map: ConfigMap| map.data.unwrap_or_default()["level"].clone();
    assert_eq!(level(maps.get("pre-install-hook").await.unwrap()), "1");
    assert_eq!(level(maps.get("pre-upgrade-hook").await.unwrap()), "2");

    // Without the opt-in: refused, naming the record and the field.
    let values = json!({"values": {"old": false, "level": 3}});
    op.create(NAMESPACE, release("shop", &path, values.clone()))
        .await;
    let stalled = op
        .wait_release(NAMESPACE, "shop", "Stalled", is_stalled)
        .await;
    let (_, reason, text) = condition(&stalled, "Stalled").unwrap();
    assert_eq!(reason, "OwnershipConflict");
    assert!(
        text.contains("sh.helm.release.v1.shop.v2") && text.contains("spec.adopt: true"),
        "{text}"
    );
    assert!(
        text.contains("belongs to a Helm release") && text.contains("revision 3"),
        "{text}"
    );
    // Nothing of Helm's was touched.
    assert_eq!(
        maps.get("settings").await.unwrap().data.unwrap()["level"],
        "2"
    );
    assert_eq!(history(&kubeconfig, "shop").await.len(), 2);

    // With it: revision 3, an upgrade, in layer order; `old` pruned.
    op.patch_spec("shop", json!({"adopt": true})).await;
    let ready = op.wait_release(NAMESPACE, "shop", "Ready", is_ready).await;
    let status = ready.status.clone().unwrap();
    assert_eq!(status.revision, Some(3));
    assert_eq!(
        maps.get("settings").await.unwrap().data.unwrap()["level"],
        "3"
    );
    assert_eq!(maps.get("app").await.unwrap().data.unwrap()["level"], "3");
    assert!(maps.get_opt("old").await.unwrap().is_none(), "pruned");
    let roles: Api<ClusterRole> = Api::all(op.client.clone());
    assert!(
        roles.get_opt("shop-reader").await.unwrap().is_some(),
        "a cluster-scoped object the new render has is kept"
    );
    // Upgrade hooks, not install hooks.
    assert_eq!(level(maps.get("pre-upgrade-hook").await.unwrap()), "3");
    assert_eq!(level(maps.get("pre-install-hook").await.unwrap()), "1");
    // The layers ran in order: settings before app.
    let applied: Vec<String> = op
        .server
        .requests()
        .into_iter()
        .filter(|r| r.client.as_deref() == Some("test-controller") && r.verb == "apply")
        .filter(|r| r.kind.as_deref() == Some("ConfigMap"))
        .filter_map(|r| r.name)
        .collect();
    let at = |name: &str| applied.iter().position(|n| n == name).unwrap();
    assert!(at("settings") < at("app"), "{applied:?}");
    let adopted = op.wait_event(NAMESPACE, "shop", "HelmReleaseAdopted").await;
    assert!(
        adopted.starts_with("went on from Helm release shop at revision 3 (its revision 2 was deployed; this one is an upgrade)"),
        "{adopted} / {}",
        message(&ready)
    );

    // One history.
    let rows = history(&kubeconfig, "shop").await;
    let statuses: Vec<(i64, &str)> = rows.iter().map(|(r, s, _)| (*r, s.as_str())).collect();
    assert_eq!(
        statuses,
        [(1, "superseded"), (2, "superseded"), (3, "deployed")],
        "{rows:?}"
    );
    // As `helm upgrade` leaves them: a superseded record keeps its description.
    assert_eq!(rows[1].2, "Upgrade complete", "{rows:?}");
    assert_eq!(rows[2].2, "Upgrade complete", "{rows:?}");
    assert!(
        helm(&kubeconfig, &["get", "values", "shop"])
            .await
            .contains("level: 3")
    );
    // The record Helm wrote keeps what Helm wrote (its chart, for `helm rollback`), marked as
    // taken over.
    let secrets: Api<Secret> = Api::namespaced(op.client.clone(), NAMESPACE);
    let v2 = secrets.get("sh.helm.release.v1.shop.v2").await.unwrap();
    let annotations = v2.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("sequenced.dev/driver").map(String::as_str),
        Some("helm")
    );
    op.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_helm_3_wrote_goes_on_under_sequenced_and_its_status_keeps_saying_so() {
    let op = Operator::start(2).await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    let chart = shop();
    let path = chart_path(&chart);
    let path_text = path.display().to_string();
    let helm3 = support::helm3();
    let version = run_helm(helm3.clone(), &kubeconfig, &["version", "--short"]).await;
    assert!(
        version.starts_with("v3."),
        "{helm3:?} is not Helm 3: {version}"
    );
    install_and_upgrade(helm3.clone(), &kubeconfig, &path_text).await;

    // Helm 3's records are read as Helm 4's: revision 3, an upgrade, `old` pruned.
    let spec = json!({"adopt": true, "values": {"old": false, "level": 3}});
    op.create(NAMESPACE, release("shop", &path, spec)).await;
    let ready = op.wait_release(NAMESPACE, "shop", "Ready", is_ready).await;
    let status = ready.status.clone().unwrap();
    assert_eq!(status.revision, Some(3));
    let maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), NAMESPACE);
    let level = |map: ConfigMap| map.data.unwrap_or_default()["level"].clone();
    assert_eq!(level(maps.get("pre-upgrade-hook").await.unwrap()), "3");
    assert_eq!(level(maps.get("pre-install-hook").await.unwrap()), "1");
    assert!(maps.get_opt("old").await.unwrap().is_none(), "pruned");
    let began = "went on from Helm release shop at revision 3 (its revision 2 was deployed; this one is an upgrade)";
    let description = |status: &sequenced::api::v1alpha1::SequencedReleaseStatus, revision| {
        status
            .history
            .iter()
            .find(|e| e.revision == revision)
            .and_then(|e| e.description.clone())
            .unwrap_or_default()
    };
    assert!(
        description(&status, 3).starts_with(began),
        "{:?}",
        status.history
    );

    // The next revision is a plain upgrade; how revision 3 began stays in the history, and
    // `sequenced status` says it, long after the message and the event have moved on.
    op.patch_spec("shop", json!({"values": {"old": false, "level": 4}}))
        .await;
    let at_4 = |sr: &sequenced::api::v1alpha1::SequencedRelease| {
        is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(4)
    };
    let ready = op.wait_release(NAMESPACE, "shop", "Ready at 4", at_4).await;
    let status = ready.status.clone().unwrap();
    assert_eq!(description(&status, 4), "", "{:?}", status.history);
    assert!(
        description(&status, 3).starts_with(began),
        "{:?}",
        status.history
    );
    assert!(
        !message(&ready).contains("went on from"),
        "{}",
        message(&ready)
    );
    let shown = sequenced::cli::status::format_status(&ready, Default::default());
    assert!(
        shown.contains(&format!("\nHISTORY      revision 3: {began}")),
        "{shown}"
    );

    // Helm 3 and Helm 4 read one history, and Helm 3 the release sequenced deployed.
    for binary in [helm3.clone(), support::helm()] {
        let rows = history_by(binary.clone(), &kubeconfig, "shop").await;
        let statuses: Vec<(i64, &str)> = rows.iter().map(|(r, s, _)| (*r, s.as_str())).collect();
        assert_eq!(
            statuses,
            [
                (1, "superseded"),
                (2, "superseded"),
                (3, "superseded"),
                (4, "deployed")
            ],
            "{binary:?}: {rows:?}"
        );
    }
    let values = run_helm(helm3.clone(), &kubeconfig, &["get", "values", "shop"]).await;
    assert!(values.contains("level: 4"), "{values}");
    let shown = run_helm(helm3, &kubeconfig, &["status", "shop"]).await;
    assert!(
        shown.contains("STATUS: deployed") && shown.contains("REVISION: 4"),
        "{shown}"
    );
    op.stop().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A controller whose `--take-pending-after` is `bound`, on a fresh server with the CRD.
async fn operator_with_bound(bound: Duration) -> Operator {
    let mut op = Operator::without_controller().await;
    let controller = support::operator::Controller::start_configured(
        op.server.config_as("test-controller"),
        "test-controller",
        2,
        |options| options.take_pending_after = bound,
    );
    op.adopt(controller);
    op
}

/// The `status` label of record `name`.
async fn record_status(op: &Operator, name: &str) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(op.client.clone(), NAMESPACE);
    secrets
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|s| s.metadata.labels?.get("status").cloned())
}

/// A chart `db` with a Deployment that is Ready only when the test plays the Deployment
/// controller ([`Operator::kubelet`]), and a ConfigMap saying the level.
fn db() -> TempDir {
    support::charts::chart(
        "db",
        &[
            ("values.yaml", "level: 1\n"),
            (
                "templates/settings.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: db-settings\ndata:\n  level: \"{{ .Values.level }}\"\n",
            ),
            (
                "templates/db.yaml",
                &support::charts::deployment("db", "werf.io/weight: \"0\""),
            ),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_upgrade_killed_while_it_waits_is_taken_over_after_the_bound_and_not_before() {
    let bound = Duration::from_secs(4);
    let op = operator_with_bound(bound).await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    let chart = db();
    let path = chart.path().join("db");
    let path_text = path.display().to_string();
    helm(&kubeconfig, &["install", "db", &path_text]).await;
    // `helm upgrade --wait` waits for the Deployment, which nothing makes ready: killed with
    // SIGKILL while it waits, it leaves its record pending-upgrade.
    let mut upgrade = std::process::Command::new(support::helm())
        .args(["upgrade", "db", &path_text, "--set", "level=2", "--wait"])
        .args(["--timeout", "5m", "--namespace", NAMESPACE, "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("helm upgrade");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while record_status(&op, "sh.helm.release.v1.db.v2")
        .await
        .as_deref()
        != Some("pending-upgrade")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no pending-upgrade record"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    upgrade.kill().expect("SIGKILL helm");
    upgrade.wait().expect("helm is gone");
    // Every helm refuses now.
    let refused = std::process::Command::new(support::helm())
        .args([
            "upgrade",
            "db",
            &path_text,
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("another operation"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // A SequencedRelease going on from it waits first: the record is recent.
    let values = json!({"adopt": true, "values": {"level": 3}});
    op.create(NAMESPACE, release("db", &path, values)).await;
    let waiting = op
        .wait_release(NAMESPACE, "db", "Pending HelmOperationPending", |sr| {
            condition(sr, "Reconciling").is_some_and(|(_, r, _)| r == "HelmOperationPending")
        })
        .await;
    let told = message(&waiting);
    assert!(
        told.contains(
            "its last record (revision 2, Secret sh.helm.release.v1.db.v2) is pending-upgrade"
        ) && told.contains("it is taken over at"),
        "{told}"
    );
    assert_eq!(
        record_status(&op, "sh.helm.release.v1.db.v2")
            .await
            .as_deref(),
        Some("pending-upgrade"),
        "a recent pending record is waited for, not taken"
    );

    // After the bound: revision 2 marked failed, revision 3 deployed, no manual step.
    let _kubelet = op.kubelet();
    let ready = op.wait_release(NAMESPACE, "db", "Ready", is_ready).await;
    assert_eq!(ready.status.as_ref().unwrap().revision, Some(3));
    let taken = op.wait_event(NAMESPACE, "db", "HelmRecordTakenOver").await;
    assert!(
        taken.starts_with("took over a pending-upgrade record of revision 2"),
        "{taken}"
    );
    // The history entry of revision 3 keeps both: where it went on from, what it took over.
    let history_entry = ready.status.as_ref().unwrap().history.first().cloned();
    let description = history_entry
        .as_ref()
        .and_then(|e| e.description.clone())
        .unwrap_or_default();
    assert!(
        description.starts_with("went on from Helm release db at revision 3")
            && description.contains("; took over a pending-upgrade record of revision 2"),
        "{history_entry:?}"
    );
    let rows = history(&kubeconfig, "db").await;
    let statuses: Vec<(i64, &str)> = rows.iter().map(|(r, s, _)| (*r, s.as_str())).collect();
    assert_eq!(
        statuses,
        [(1, "superseded"), (2, "failed"), (3, "deployed")],
        "{rows:?}"
    );
    assert_eq!(
        rows[1].2,
        "not finished by the helm process that began it; taken over by sequenced"
    );
    let maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), NAMESPACE);
    assert_eq!(
        maps.get("db-settings").await.unwrap().data.unwrap()["level"],
        "3"
    );
    // And helm goes on from it again.
    helm(&kubeconfig, &["status", "db"]).await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_install_helm_failed_is_installed_again_at_revision_two() {
    let op = Operator::start(2).await;
    let _jobs = op.server.job_controller(Duration::from_millis(50));
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    // A pre-install hook Job that fails while `.Values.outcome` is `fail`.
    let chart = support::charts::chart(
        "migrated",
        &[
            ("values.yaml", "outcome: fail\n"),
            (
                "templates/migrate.yaml",
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  labels:\n    sequenced.test/outcome: \"{{ .Values.outcome }}\"\n  annotations:\n    helm.sh/hook: pre-install\n    helm.sh/hook-delete-policy: before-hook-creation\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: migrate\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", \"exit 0\"]\n",
            ),
            (
                "templates/settings.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: migrated-settings\ndata:\n  a: b\n",
            ),
        ],
    );
    let path = chart.path().join("migrated");
    let path_text = path.display().to_string();
    let failed = std::process::Command::new(support::helm())
        .args([
            "install",
            "migrated",
            &path_text,
            "--wait",
            "--timeout",
            "60s",
        ])
        .args(["--namespace", NAMESPACE, "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert!(!failed.status.success(), "the hook fails the install");
    let rows = history(&kubeconfig, "migrated").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, "failed", "{rows:?}");

    let values = json!({"adopt": true, "values": {"outcome": "succeed"}});
    op.create(NAMESPACE, release("migrated", &path, values))
        .await;
    let ready = op
        .wait_release(NAMESPACE, "migrated", "Ready", is_ready)
        .await;
    assert_eq!(ready.status.as_ref().unwrap().revision, Some(2));
    let adopted = op
        .wait_event(NAMESPACE, "migrated", "HelmReleaseAdopted")
        .await;
    assert!(
        adopted.contains("its revision 1 was failed; this one installs again"),
        "{adopted}"
    );
    let rows = history(&kubeconfig, "migrated").await;
    let statuses: Vec<(i64, &str)> = rows.iter().map(|(r, s, _)| (*r, s.as_str())).collect();
    assert_eq!(statuses, [(1, "failed"), (2, "deployed")], "{rows:?}");
    assert_eq!(rows[1].2, "Install complete");
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_handed_back_to_helm_goes_on_with_helm_upgrade_and_helm_uninstall_removes_it() {
    let op = Operator::start(2).await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    let chart = shop();
    let path = chart_path(&chart);
    let path_text = path.display().to_string();
    helm(&kubeconfig, &["install", "shop", &path_text]).await;
    let values = json!({"adopt": true, "deletionPolicy": "Orphan", "values": {"level": 2}});
    op.create(NAMESPACE, release("shop", &path, values)).await;
    let ready = op.wait_release(NAMESPACE, "shop", "Ready", is_ready).await;
    assert_eq!(ready.status.as_ref().unwrap().revision, Some(2));

    // Deleted with the Orphan policy: nothing is uninstalled.
    op.releases(NAMESPACE)
        .delete("shop", &Default::default())
        .await
        .unwrap();
    op.wait_deleted(NAMESPACE, "shop").await;
    let told = op.wait_event(NAMESPACE, "shop", "HandedBackToHelm").await;
    assert!(
        told.starts_with("handed release shop back to Helm at revision 2"),
        "{told}"
    );
    let maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), NAMESPACE);
    assert_eq!(
        maps.get("settings").await.unwrap().data.unwrap()["level"],
        "2"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(op.client.clone(), NAMESPACE);
    let left: Vec<String> = leases
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .filter(|n| n.contains("shop"))
        .collect();
    assert!(left.is_empty(), "the release's Lease is gone: {left:?}");
    let statuses: Vec<(i64, String)> = history(&kubeconfig, "shop")
        .await
        .into_iter()
        .map(|(r, s, _)| (r, s))
        .collect();
    assert_eq!(
        statuses,
        [(1, "superseded".to_string()), (2, "deployed".to_string())]
    );

    // helm goes on at the next revision.
    helm(
        &kubeconfig,
        &["upgrade", "shop", &path_text, "--set", "level=4"],
    )
    .await;
    assert_eq!(
        maps.get("settings").await.unwrap().data.unwrap()["level"],
        "4"
    );
    let statuses: Vec<(i64, String)> = history(&kubeconfig, "shop")
        .await
        .into_iter()
        .map(|(r, s, _)| (r, s))
        .collect();
    assert_eq!(
        statuses,
        [
            (1, "superseded".to_string()),
            (2, "superseded".to_string()),
            (3, "deployed".to_string())
        ]
    );

    // And `helm uninstall` removes every object and record.
    helm(&kubeconfig, &["uninstall", "shop"]).await;
    for name in ["settings", "app", "old"] {
        assert!(
            maps.get_opt(name).await.unwrap().is_none(),
            "{name} is left"
        );
    }
    let roles: Api<ClusterRole> = Api::all(op.client.clone());
    assert!(roles.get_opt("shop-reader").await.unwrap().is_none());
    let secrets: Api<Secret> = Api::namespaced(op.client.clone(), NAMESPACE);
    let records: Vec<String> = secrets
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .filter(|n| n.starts_with("sh.helm.release.v1.shop."))
        .collect();
    assert!(records.is_empty(), "{records:?}");
    op.stop().await;
}

/// A chart `widgets` with a CRD among its templates and a ConfigMap, both under
/// `helm.sh/resource-policy: keep` (kept by an uninstall, as argo-cd's CRDs are).
fn widgets() -> TempDir {
    support::charts::chart(
        "widgets",
        &[
            (
                "templates/crd.yaml",
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\n  annotations:\n    helm.sh/resource-policy: keep\nspec:\n  group: example.com\n  scope: Namespaced\n  names:\n    plural: widgets\n    singular: widget\n    kind: Widget\n  versions:\n    - name: v1\n      served: true\n      storage: true\n      schema:\n        openAPIV3Schema:\n          type: object\n          x-kubernetes-preserve-unknown-fields: true\n",
            ),
            (
                "templates/kept.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\n  annotations:\n    helm.sh/resource-policy: keep\ndata:\n  a: b\n",
            ),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_of_a_release_that_no_longer_exists_are_orphans_not_conflicts() {
    let op = Operator::start(2).await;
    op.namespace("other").await;
    let chart = widgets();
    let path = chart.path().join("widgets");
    op.create(NAMESPACE, release("first", &path, json!({})))
        .await;
    op.wait_release(NAMESPACE, "first", "Ready", is_ready).await;
    op.releases(NAMESPACE)
        .delete("first", &Default::default())
        .await
        .unwrap();
    op.wait_deleted(NAMESPACE, "first").await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(op.client.clone());
    let owner = |crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| {
        crd.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("sequenced.dev/owner").cloned())
    };
    let kept = crds.get("widgets.example.com").await.unwrap();
    assert_eq!(
        owner(&kept).as_deref(),
        Some("default/first"),
        "kept by the uninstall"
    );
    let maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), NAMESPACE);
    assert!(maps.get_opt("kept").await.unwrap().is_some());

    // Installed again by a new release in another namespace: its CRD is taken over, no adopt.
    op.create("other", release("second", &path, json!({})))
        .await;
    op.wait_release("other", "second", "Ready", is_ready).await;
    let taken = crds.get("widgets.example.com").await.unwrap();
    assert_eq!(owner(&taken).as_deref(), Some("other/second"));

    // Any other orphan is taken only with adopt: true, and the refusal says why.
    let config = support::charts::chart(
        "config",
        &[(
            "templates/kept.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\ndata:\n  a: c\n",
        )],
    );
    let config_path = config.path().join("config");
    op.create(NAMESPACE, release("heir", &config_path, json!({})))
        .await;
    let stalled = op
        .wait_release(NAMESPACE, "heir", "Stalled", |sr| {
            condition(sr, "Stalled").is_some_and(|(s, _, _)| s == "True")
                || sr.status.as_ref().and_then(|s| s.phase)
                    == Some(sequenced::api::ReleasePhase::Failed)
        })
        .await;
    let said = message(&stalled);
    assert!(
        said.contains("ConfigMap default/kept")
            && said.contains("belongs to SequencedRelease default/first, which no longer exists")
            && said.contains("spec.adopt: true"),
        "{said}"
    );
    assert_eq!(maps.get("kept").await.unwrap().data.unwrap()["a"], "b");
    op.patch_spec("heir", json!({"adopt": true})).await;
    op.wait_release(NAMESPACE, "heir", "Ready", is_ready).await;
    assert_eq!(maps.get("kept").await.unwrap().data.unwrap()["a"], "c");
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_helm_releases_object_and_a_configmap_driver_release_are_refused() {
    let op = Operator::start(2).await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    let chart = support::charts::chart(
        "shared",
        &[(
            "templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata:\n  a: b\n",
        )],
    );
    let path = chart.path().join("shared");
    let path_text = path.display().to_string();
    helm(&kubeconfig, &["install", "theirs", &path_text]).await;
    // Another Helm release's object: not ours to take, adopt or not.
    op.create(NAMESPACE, release("mine", &path, json!({"adopt": true})))
        .await;
    let refused = op
        .wait_release(NAMESPACE, "mine", "refused", |sr| {
            condition(sr, "Ready").is_some_and(|(_, r, _)| r == "OwnershipConflict")
        })
        .await;
    let said = message(&refused);
    assert!(
        said.contains("belongs to Helm release theirs in namespace default"),
        "{said}"
    );

    // A Helm release kept by the ConfigMap driver: refused, naming the driver.
    let other = support::charts::chart(
        "cmdriven",
        &[(
            "templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cmdriven\ndata:\n  a: b\n",
        )],
    );
    let other_path = other.path().join("cmdriven");
    // What `HELM_DRIVER=configmap helm install cmdriven` stores: a ConfigMap record, labelled
    // as Helm's ConfigMap driver labels it. (The test API server cannot take the protobuf body
    // helm's ConfigMap driver sends, so the record is written as it would be.)
    let record: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "sh.helm.release.v1.cmdriven.v1",
            "labels": {"owner": "helm", "name": "cmdriven", "status": "deployed", "version": "1"}
        },
        "data": {"release": "H4sIAAAAAAAA/wEAAP//AAAAAAAAAAA="}
    }))
    .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(op.client.clone(), NAMESPACE);
    maps.create(&Default::default(), &record).await.unwrap();
    op.create(
        NAMESPACE,
        release("cmdriven", &other_path, json!({"adopt": true})),
    )
    .await;
    let stalled = op
        .wait_release(NAMESPACE, "cmdriven", "Stalled", is_stalled)
        .await;
    let (_, reason, text) = condition(&stalled, "Stalled").unwrap();
    assert_eq!(reason, "HelmStorageUnsupported");
    assert!(text.contains("ConfigMap storage driver"), "{text}");
    op.stop().await;
}
