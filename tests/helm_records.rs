//! Release records in Helm's storage format, read by the real `helm` binary from the test API
//! server: `helm list`, `history`, `get manifest`, `get values` and `status` see what the
//! record says, and ignore what sequenced keeps beside Helm's fields.

use sequenced_testkit as support;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use sequenced::history::helm::{
    HELM_RECORD_KEY, HELM_RECORD_TYPE, HelmChart, HelmInfo, HelmRelease, HelmStatus,
    helm_record_name,
};
use serde_json::{Value, json};

fn release(version: i64, status: HelmStatus, description: &str) -> HelmRelease {
    let map = |v: Value| v.as_object().cloned().unwrap_or_default();
    HelmRelease {
        name: "shop".into(),
        namespace: "default".into(),
        version,
        info: HelmInfo {
            first_deployed: "2026-11-23T19:11:57Z".into(),
            last_deployed: format!("2026-11-23T19:1{version}:59Z"),
            deleted: String::new(),
            description: description.into(),
            status,
            notes: String::new(),
        },
        chart: HelmChart {
            metadata: map(
                json!({"name": "shop", "version": "0.1.0", "apiVersion": "v2", "appVersion": "1.0.0"}),
            ),
            values: map(json!({"replicas": 1})),
            templates: Vec::new(),
            files: Vec::new(),
        },
        config: map(json!({"replicas": version})),
        manifest: format!(
            "---\n# Source: shop/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{version}\n"
        ),
        hooks: Vec::new(),
        sequenced: Some(json!({"layers": [{"name": "a"}], "sequenced": true})),
    }
}

async fn helm(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let kubeconfig = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::run_helm(&kubeconfig, &args)
    })
    .await
    .expect("helm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_reads_records_written_in_its_storage_format() {
    let server = support::apiserver::TestApiServer::start().await;
    let secrets: Api<Secret> = Api::namespaced(server.client(), "default");
    for r in [
        release(1, HelmStatus::Superseded, "Install complete"),
        release(2, HelmStatus::Deployed, "Upgrade complete"),
    ] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": helm_record_name(&r.name, r.version), "labels": r.labels()},
            "type": HELM_RECORD_TYPE,
            "stringData": {HELM_RECORD_KEY: r.encode()},
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let dir = tempfile::TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &server.url(), "default");

    let list: Value =
        serde_json::from_str(&helm(&kubeconfig, &["list", "-o", "json"]).await).unwrap();
    assert_eq!(list[0]["name"], "shop");
    assert_eq!(list[0]["revision"], "2");
    assert_eq!(list[0]["status"], "deployed");
    assert_eq!(list[0]["chart"], "shop-0.1.0");
    let history: Value =
        serde_json::from_str(&helm(&kubeconfig, &["history", "shop", "-o", "json"]).await).unwrap();
    let statuses: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["superseded", "deployed"]);
    assert!(
        helm(&kubeconfig, &["get", "manifest", "shop"])
            .await
            .contains("name: cm-2")
    );
    assert!(
        helm(&kubeconfig, &["get", "manifest", "shop", "--revision", "1"])
            .await
            .contains("name: cm-1")
    );
    assert!(
        helm(&kubeconfig, &["get", "values", "shop"])
            .await
            .contains("replicas: 2")
    );
    assert!(
        helm(&kubeconfig, &["status", "shop"])
            .await
            .contains("STATUS: deployed")
    );

    // What Helm wrote is read back, sequenced's part included.
    let stored = secrets.get(&helm_record_name("shop", 2)).await.unwrap();
    let data = &stored.data.unwrap()[HELM_RECORD_KEY].0;
    let back = HelmRelease::decode("sh.helm.release.v1.shop.v2", data).unwrap();
    assert_eq!(back, release(2, HelmStatus::Deployed, "Upgrade complete"));
}
