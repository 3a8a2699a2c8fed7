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

/// Runs the real helm against the test server, in [`NAMESPACE`].
async fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    let kubeconfig = kubeconfig.to_path_buf();
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.extend(["--namespace".to_string(), NAMESPACE.to_string()]);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::run_helm(&kubeconfig, &args)
    })
    .await
    .expect("helm")
}

/// `helm history shop`: (revision, status, description) of each revision.
async fn history(kubeconfig: &Path, name: &str) -> Vec<(i64, String, String)> {
    let text = helm(kubeconfig, &["history", name, "-o", "json"]).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_release_goes_on_under_a_sequenced_release_at_its_next_revision_with_adopt() {
    let op = Operator::start(2).await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &op.server.url(), NAMESPACE);
    let chart = shop();
    let path = chart_path(&chart);
    let path_text = path.display().to_string();
    helm(&kubeconfig, &["install", "shop", &path_text]).await;
    helm(
        &kubeconfig,
        &["upgrade", "shop", &path_text, "--set", "level=2"],
    )
    .await;
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
