//! Charts a platform can trust, on the test API server with a chart repository on loopback:
//! the digests of what each revision deployed (status, history, release record), versions
//! pinned by digest, and a chart whose bytes changed under the same version noticed.

use sequenced_testkit as support;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use sequenced::api::v1alpha1::SequencedRelease;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::charts::{condition, is_ready, is_stalled, release};
use support::operator::Operator;
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the scenario did not finish in time");
}

/// Packages chart `demo` at `version` into `dir` (a chart repository) and indexes it again; its
/// ConfigMap holds `data`, so that two packagings of one version can differ.
fn publish(dir: &Path, version: &str, data: &str) -> String {
    let source = TempDir::new().unwrap();
    support::write(
        source.path(),
        "Chart.yaml",
        &format!("apiVersion: v2\nname: demo\nversion: {version}\n"),
    );
    support::write(
        source.path(),
        "templates/cm.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n  annotations:\n    helm.sh/layer: one\ndata:\n  data: {data:?}\n"
        ),
    );
    let archive = support::package(source.path(), dir);
    let status = std::process::Command::new(support::helm())
        .arg("repo")
        .arg("index")
        .arg(dir)
        .status()
        .expect("helm repo index");
    assert!(status.success());
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(std::fs::read(archive).unwrap()))
    )
}

/// Serves the files of `dir` on loopback: a chart repository.
fn serve(dir: &Path) -> support::http::Server {
    support::http::serve_dir(dir, None)
}

fn status(sr: &SequencedRelease) -> &sequenced::api::SequencedReleaseStatus {
    sr.status.as_ref().expect("a status")
}

/// sequenced's part of release record `revision` of `name`.
async fn record(op: &Operator, name: &str, revision: i64) -> Value {
    let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "default");
    let secret = secrets
        .get(&format!("sh.helm.release.v1.{name}.v{revision}"))
        .await
        .unwrap();
    let data = &secret.data.unwrap()["release"].0;
    let helm = sequenced::history::helm::HelmRelease::decode("record", data).unwrap();
    helm.sequenced.expect("sequenced's part")
}

fn revision(sr: &SequencedRelease) -> Option<i64> {
    sr.status.as_ref().and_then(|s| s.revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_archives_digest_is_in_status_history_and_record_and_a_pin_is_held_to() {
    within(async {
        let repository = TempDir::new().unwrap();
        let digest = publish(repository.path(), "1.0.0", "first");
        let server = serve(repository.path());
        let op = Operator::start(4).await;
        let chart = json!({"repository": server.url(), "name": "demo", "version": "1.0.0"});
        op.create(
            "default",
            release("demo", Path::new("/unused"), json!({"chart": chart})),
        )
        .await;
        let sr = op.wait_release("default", "demo", "Ready", is_ready).await;
        let chart = status(&sr).chart.clone().expect("status.chart");
        assert_eq!(chart.digest, digest);
        assert_eq!(chart.version.as_deref(), Some("1.0.0"));
        assert_eq!(chart.oci_digest, None);
        assert_eq!(
            status(&sr).history[0].chart_digest.as_deref(),
            Some(digest.as_str())
        );
        let stored = record(&op, "demo", 1).await;
        assert_eq!(stored["chartArtifact"]["digest"], json!(digest));

        // Pinned to the digest it has: what is asked for changed (a revision), the chart not.
        op.patch_spec(
            "demo",
            json!({"chart": {"version": format!("1.0.0@{digest}")}}),
        )
        .await;
        let sr = op
            .wait_release("default", "demo", "revision 2 Ready", |sr| {
                is_ready(sr) && revision(sr) == Some(2)
            })
            .await;
        assert_eq!(status(&sr).chart.as_ref().unwrap().digest, digest);

        // Pinned to another: refused, and nothing of it applied.
        let other = format!("sha256:{}", "e".repeat(64));
        op.patch_spec(
            "demo",
            json!({"chart": {"version": format!("1.0.0@{other}")}}),
        )
        .await;
        let sr = op
            .wait_release("default", "demo", "Stalled", is_stalled)
            .await;
        let (_, reason, message) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "VerificationFailed");
        assert_eq!(
            message,
            format!(
                "chart repository {}: helm pull demo --version 1.0.0: chart demo version 1.0.0 has the archive's digest {digest}, not the pinned {other}",
                server.url()
            )
        );
        assert_eq!(revision(&sr), Some(2));
        op.stop().await;
    })
    .await;
}
