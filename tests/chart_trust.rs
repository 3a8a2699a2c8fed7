//! Charts a platform can trust, on the test API server with a chart repository on loopback:
//! the digests of what each revision deployed (status, history, release record), versions
//! pinned by digest, charts signed by the real `helm package --sign` verified (and refused when
//! changed after signing, unsigned, or signed by a key not in the keyring), and a chart whose
//! bytes changed under the same version noticed.

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
use support::signing::Signer;
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

/// Packages chart `demo` at `version` into the chart repository `dir`, signed by `signer`
/// (`helm package --sign`) or not, and indexes it again. Its ConfigMap is named after the
/// release. The archive's path.
fn publish_chart(
    dir: &Path,
    version: &str,
    signer: Option<&Signer>,
    data: &str,
) -> std::path::PathBuf {
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
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{{{ .Release.Name }}}}\n  annotations:\n    helm.sh/layer: one\ndata:\n  a: {data:?}\n"
        ),
    );
    let archive = match signer {
        Some(signer) => signer.package(source.path(), dir),
        None => support::package(source.path(), dir),
    };
    let status = std::process::Command::new(support::helm())
        .arg("repo")
        .arg("index")
        .arg(dir)
        .status()
        .expect("helm repo index");
    assert!(status.success());
    archive
}

fn sha256_of(path: &Path) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
    )
}

/// A Secret of public keys, `{name: bytes}`.
async fn key_secret(op: &Operator, name: &str, keys: &[(&str, &[u8])]) {
    use base64::Engine;
    let data: serde_json::Map<String, Value> = keys
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                json!(base64::engine::general_purpose::STANDARD.encode(v)),
            )
        })
        .collect();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": data,
    }))
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(op.client.clone(), "default");
    secrets.create(&Default::default(), &secret).await.unwrap();
}

fn verified_release(name: &str, url: &str, version: &str) -> Value {
    release(
        name,
        Path::new("/unused"),
        json!({"chart": {"repository": url, "name": "demo", "version": version,
                         "verify": {"provider": "helm", "secretRef": {"name": "keys"}}}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_signed_by_helm_package_sign_is_verified_and_one_that_is_not_is_stalled_with_nothing_applied()
 {
    within(async {
        let publisher = Signer::new("Chart Publisher <charts@example.com>");
        let stranger = Signer::new("Someone Else <else@example.com>");
        let repository = TempDir::new().unwrap();
        let signed = publish_chart(repository.path(), "1.0.0", Some(&publisher), "b");
        // 1.0.1: signed, then its archive replaced by other bytes under the same version.
        let tampered = publish_chart(repository.path(), "1.0.1", Some(&publisher), "b");
        let signed_digest = sha256_of(&tampered);
        let other = TempDir::new().unwrap();
        let replacement = publish_chart(other.path(), "1.0.1", None, "changed");
        std::fs::copy(&replacement, &tampered).unwrap();
        let tampered_digest = sha256_of(&tampered);
        assert_ne!(signed_digest, tampered_digest);
        // 1.0.2: not signed at all; 1.0.3: signed by a key the keyring does not hold.
        publish_chart(repository.path(), "1.0.2", None, "b");
        publish_chart(repository.path(), "1.0.3", Some(&stranger), "b");
        // The index again, now that the tampered archive is in place.
        let indexed = std::process::Command::new(support::helm())
            .args(["repo", "index"])
            .arg(repository.path())
            .status()
            .unwrap();
        assert!(indexed.success());
        let server = serve(repository.path());
        let op = Operator::start(4).await;
        key_secret(
            &op,
            "keys",
            &[
                ("publisher.asc", publisher.public_key_armored().as_bytes()),
                ("README", b"not a key: ignored"),
            ],
        )
        .await;
        let url = server.url();

        op.create("default", verified_release("good", &url, "1.0.0"))
            .await;
        let sr = op.wait_release("default", "good", "Ready", is_ready).await;
        let chart = status(&sr).chart.clone().expect("status.chart");
        assert_eq!(chart.digest, sha256_of(&signed));
        let verified = chart.verified.expect("status.chart.verified");
        assert_eq!(verified.provider, "helm");
        assert_eq!(verified.key.as_deref(), Some(publisher.fingerprint.as_str()));
        assert_eq!(verified.signer.as_deref(), Some(publisher.user.as_str()));
        let stored = record(&op, "good", 1).await;
        assert_eq!(
            stored["chartArtifact"]["verified"]["key"],
            json!(publisher.fingerprint)
        );
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "good").is_some());

        let refused = [
            (
                "tampered",
                "1.0.1",
                format!(
                    "the archive's digest {tampered_digest} is not the {signed_digest} its provenance file signs for demo-1.0.1.tgz"
                ),
            ),
            (
                "unsigned",
                "1.0.2",
                "no provenance file: the source serves no demo-1.0.2.tgz.prov".to_string(),
            ),
            (
                "stranger",
                "1.0.3",
                format!(
                    "the provenance file is not signed by a key of Secret default/keys (signed by {}; tried publisher.asc: {})",
                    stranger.fingerprint, publisher.fingerprint
                ),
            ),
        ];
        for (name, version, _) in &refused {
            op.create("default", verified_release(name, &url, version))
                .await;
        }
        for (name, version, why) in &refused {
            let sr = op.wait_release("default", name, "Stalled", is_stalled).await;
            let (_, reason, message) = condition(&sr, "Stalled").unwrap();
            assert_eq!(reason, "VerificationFailed", "{name}");
            assert_eq!(
                message,
                format!(
                    "chart demo version {version} from {url}: not verified (provider helm): {why}"
                ),
                "{name}"
            );
            assert!(
                op.server.object("v1", "ConfigMap", Some("default"), name).is_none(),
                "{name}: nothing of a chart that does not verify is applied"
            );
            assert_eq!(revision(&sr), None, "{name}");
        }
        op.stop().await;
    })
    .await;
}

/// `helm verify --keyring`, the oracle: whether helm verifies the archive with this keyring.
fn helm_verifies(archive: &Path, keyring: &Path) -> bool {
    std::process::Command::new(support::helm())
        .arg("verify")
        .arg("--keyring")
        .arg(keyring)
        .arg(archive)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn provenance_is_verified_as_helm_verify_does_with_binary_or_armored_keys() {
    use sequenced::chart::verify::{Keyring, provenance};
    let publisher = Signer::new("Chart Publisher <charts@example.com>");
    let dir = TempDir::new().unwrap();
    let archive = publish_chart(dir.path(), "2.0.0", Some(&publisher), "b");
    let keyring_file = dir.path().join("pubring.gpg");
    std::fs::write(&keyring_file, publisher.public_key()).unwrap();
    let keyring = |name: &str, bytes: Vec<u8>| Keyring {
        origin: "Secret default/keys".into(),
        keys: vec![(name.to_string(), bytes)],
    };

    assert!(helm_verifies(&archive, &keyring_file));
    for key in [
        keyring("publisher.gpg", publisher.public_key()),
        keyring("publisher.asc", publisher.public_key_armored().into_bytes()),
    ] {
        let verified = provenance::verify_file(&archive, &key).unwrap();
        assert_eq!(
            verified.key.as_deref(),
            Some(publisher.fingerprint.as_str())
        );
    }

    // Changed after signing: helm refuses it, and so does the verifier.
    let other = TempDir::new().unwrap();
    let changed = publish_chart(other.path(), "2.0.0", None, "changed");
    std::fs::copy(&changed, &archive).unwrap();
    assert!(!helm_verifies(&archive, &keyring_file));
    let err = provenance::verify_file(&archive, &keyring("publisher.gpg", publisher.public_key()))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("the archive's digest sha256:"), "{err}");

    let err = provenance::verify_file(&archive, &keyring("bad.gpg", b"garbage".to_vec()))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("key bad.gpg of Secret default/keys: not an OpenPGP public key"),
        "{err}"
    );
}

/// Runs the `sequenced` binary with `args`: (success, stdout, stderr).
fn sequenced(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(args)
        .env("SEQUENCED_HELM", support::helm())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sequenced_template_verify_checks_the_provenance_file_against_the_keyring() {
    let publisher = Signer::new("Chart Publisher <charts@example.com>");
    let stranger = Signer::new("Someone Else <else@example.com>");
    let repository = TempDir::new().unwrap();
    publish_chart(repository.path(), "3.0.0", Some(&publisher), "b");
    let server = serve(repository.path());
    let keys = TempDir::new().unwrap();
    let good = keys.path().join("publisher.asc");
    std::fs::write(&good, publisher.public_key_armored()).unwrap();
    let other = keys.path().join("other.gpg");
    std::fs::write(&other, stranger.public_key()).unwrap();
    let cache = TempDir::new().unwrap();
    let url = server.url();
    let run = |keyring: &Path| {
        sequenced(&[
            "template".as_ref(),
            "demo".as_ref(),
            "--repo".as_ref(),
            url.as_ref(),
            "--version".as_ref(),
            "3.0.0".as_ref(),
            "--cache-dir".as_ref(),
            cache.path().as_os_str(),
            "--verify".as_ref(),
            "--keyring".as_ref(),
            keyring.as_os_str(),
        ])
    };
    let (ok, stdout, stderr) = run(&good);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("kind: ConfigMap"), "{stdout}");
    let (ok, _, stderr) = run(&other);
    assert!(!ok);
    assert!(
        stderr.contains(&format!(
            "chart demo version 3.0.0 from {url}: not verified (provider helm): the provenance file is not signed by a key of keyring {} (signed by {}; tried other.gpg: {})",
            other.display(),
            publisher.fingerprint,
            stranger.fingerprint
        )),
        "{stderr}"
    );
    // Without --verify the same chart renders: verification is asked for, never assumed.
    let (ok, _, stderr) = sequenced(&[
        "template".as_ref(),
        "demo".as_ref(),
        "--repo".as_ref(),
        url.as_ref(),
        "--version".as_ref(),
        "3.0.0".as_ref(),
        "--cache-dir".as_ref(),
        cache.path().as_os_str(),
    ]);
    assert!(ok, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_verified_charts_a_release_without_verify_is_refused() {
    within(async {
        let repository = TempDir::new().unwrap();
        publish(repository.path(), "1.0.0", "first");
        let server = serve(repository.path());
        let mut op = Operator::without_controller().await;
        let controller = support::operator::Controller::start_with(
            &op.server,
            "strict",
            4,
            sequenced::controller::Tenancy {
                require_verified_charts: true,
                ..Default::default()
            },
        );
        op.adopt(controller);
        let chart = json!({"repository": server.url(), "name": "demo", "version": "1.0.0"});
        op.create(
            "default",
            release("demo", Path::new("/unused"), json!({"chart": chart})),
        )
        .await;
        let sr = op.wait_release("default", "demo", "Stalled", is_stalled).await;
        let (_, reason, message) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "VerificationFailed");
        assert_eq!(
            message,
            "spec.chart.verify: this controller runs with --require-verified-charts and deploys only charts verified by a signature: set spec.chart.verify (a repository or OCI chart)"
        );
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "demo").is_none());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_pushed_again_with_other_bytes_is_noticed_and_deployed_only_on_request() {
    within(async {
        let repository = TempDir::new().unwrap();
        let first = publish(repository.path(), "1.0.0", "first");
        let server = serve(repository.path());
        let op = Operator::start(4).await;
        let chart = json!({"repository": server.url(), "name": "demo", "version": "1.0.0"});
        op.create(
            "default",
            release(
                "demo",
                Path::new("/unused"),
                json!({"chart": chart, "interval": "1s"}),
            ),
        )
        .await;
        op.wait_release("default", "demo", "Ready", is_ready).await;

        // The same version, other bytes.
        let second = publish(repository.path(), "1.0.0", "second");
        assert_ne!(first, second);
        let sr = op
            .wait_release("default", "demo", "ChartChanged", |sr| {
                condition(sr, "ChartChanged").is_some_and(|c| c.0 == "True")
            })
            .await;
        let (_, reason, message) = condition(&sr, "ChartChanged").unwrap();
        assert_eq!(reason, "ChartChanged");
        assert_eq!(
            message,
            format!(
                "chart version 1.0.0 changed at its source: its archive is now {second} (revision 1 deployed {first}); no revision is started for it: pin the digest you trust (version: 1.0.0@sha256:…), or request a reconcile (sequenced reconcile) to deploy what the source serves now"
            )
        );
        let event = op.wait_event("default", "demo", "ChartChanged").await;
        assert!(event.contains(&second), "{event}");
        // Still Ready on what it deployed: no revision started by itself.
        assert!(is_ready(&sr));
        assert_eq!(revision(&sr), Some(1));
        assert_eq!(status(&sr).chart.as_ref().unwrap().digest, first);
        let cm = op
            .server
            .object("v1", "ConfigMap", Some("default"), "demo")
            .unwrap();
        assert_eq!(cm["data"]["data"], "first");

        // A reconcile request deploys what the source serves now.
        let patch =
            json!({"metadata": {"annotations": {sequenced::api::RECONCILE_REQUEST_ANNOTATION: "now"}}});
        op.releases("default")
            .patch(
                "demo",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        let sr = op
            .wait_release("default", "demo", "revision 2 Ready", |sr| {
                is_ready(sr) && revision(sr) == Some(2)
            })
            .await;
        assert_eq!(status(&sr).chart.as_ref().unwrap().digest, second);
        assert_eq!(status(&sr).history[1].chart_digest.as_deref(), Some(first.as_str()));
        assert!(condition(&sr, "ChartChanged").is_none());
        let cm = op
            .server
            .object("v1", "ConfigMap", Some("default"), "demo")
            .unwrap();
        assert_eq!(cm["data"]["data"], "second");
        op.stop().await;
    })
    .await;
}
