//! `sequenced install|upgrade` as a terminal or a CI job runs them: the built binary against the
//! in-process test API server (with no CRD installed: no operator), the test playing the
//! Deployment controller, and the real helm 4 as the oracle of the records it writes.

use sequenced_testkit as support;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::apiserver::TestApiServer;
use support::charts::repo;
use support::operator::mark_deployment_ready;
use tempfile::TempDir;
use tokio::process::{Child, Command};

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(180), test)
        .await
        .expect("the test did not finish in time");
}

/// A test API server without the CRD, and a kubeconfig for it.
async fn cluster() -> (TestApiServer, TempDir, PathBuf) {
    let server = TestApiServer::start().await;
    let dir = TempDir::new().unwrap();
    let kubeconfig = support::kubeconfig(&dir, &server.url(), "default");
    (server, dir, kubeconfig)
}

fn spawn(kubeconfig: &Path, args: &[&str]) -> Child {
    let mut command = Command::from(support::sequenced_command(
        env!("CARGO_BIN_EXE_sequenced"),
        kubeconfig,
    ));
    command
        .env("SEQUENCED_HELM", support::helm())
        .env("USER", "ci")
        .args(args)
        .kill_on_drop(true);
    command.spawn().expect("run sequenced")
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("sequenced did not exit in time")
        .expect("wait for sequenced")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn helm(kubeconfig: &Path, args: &[&str]) -> String {
    support::run_helm(kubeconfig, args)
}

/// Waits until the object exists.
async fn wait_object(server: &TestApiServer, api_version: &str, kind: &str, name: &str) {
    assert!(
        server
            .wait_until(Duration::from_secs(60), |s| {
                s.object(api_version, kind, Some("default"), name).is_some()
            })
            .await,
        "{kind} {name} never appeared"
    );
}

/// When the first successful apply of `kind` `name` arrived.
fn first_apply(server: &TestApiServer, kind: &str, name: &str) -> Option<Instant> {
    server
        .requests()
        .iter()
        .find(|r| {
            r.verb == "apply"
                && r.kind.as_deref() == Some(kind)
                && r.name.as_deref() == Some(name)
                && r.status < 300
        })
        .map(|r| r.at)
}

fn applies(server: &TestApiServer, kind: &str, name: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| {
            r.verb == "apply"
                && r.kind.as_deref() == Some(kind)
                && r.name.as_deref() == Some(name)
                && r.status < 300
        })
        .count()
}

/// The chart `web`: layer `config` (a ConfigMap, werf weight 0), then layer `app` (a
/// Deployment of `replicas`, weight 10): annotations that plain helm can apply too.
fn web_chart() -> TempDir {
    let deployment = support::charts::deployment("web", "werf.io/weight: \"10\"")
        .replace("replicas: 1", "replicas: {{ .Values.replicas }}");
    support::charts::chart(
        "web",
        &[
            ("values.yaml", "replicas: 1\n"),
            (
                "templates/config.yaml",
                &support::charts::config_map("config", "werf.io/weight: \"0\""),
            ),
            ("templates/app.yaml", &deployment),
        ],
    )
}

/// Marks every Deployment of the namespace ready, every 20 ms, until dropped.
fn kubelet(server: &TestApiServer) -> support::operator::Kubelet {
    server.deployment_controller(Duration::ZERO)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_applies_the_shop_layer_by_layer_and_helm_reads_the_release() {
    within(async {
        let (server, _dir, kubeconfig) = cluster().await;
        let shop = repo().join("examples/shop");
        let child = spawn(
            &kubeconfig,
            &[
                "install",
                "shop",
                shop.to_str().unwrap(),
                "--timeout",
                "60s",
            ],
        );
        // database and queue first; app only once both are ready.
        wait_object(&server, "apps/v1", "Deployment", "db").await;
        wait_object(&server, "apps/v1", "Deployment", "queue-processor").await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(first_apply(&server, "Deployment", "my-app").is_none());
        assert!(mark_deployment_ready(&server, "default", "db"));
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(
            first_apply(&server, "Deployment", "my-app").is_none(),
            "app applied before queue was ready"
        );
        let queue_ready = Instant::now();
        assert!(mark_deployment_ready(&server, "default", "queue-processor"));
        wait_object(&server, "apps/v1", "Deployment", "my-app").await;
        assert!(first_apply(&server, "Deployment", "my-app").unwrap() > queue_ready);
        assert!(mark_deployment_ready(&server, "default", "my-app"));
        let out = finish(child).await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        // Without a terminal: one line per layer started and ready, with its time.
        for layer in ["database", "queue", "app"] {
            let started = stdout.lines().find(|l| {
                l.contains(" LayerStarted ")
                    && l.to_lowercase()
                        .contains(&format!("applying layer {layer} of chart shop"))
            });
            let started = started.unwrap_or_else(|| panic!("layer {layer} started: {stdout}"));
            assert!(
                started.starts_with("20") && started.contains('T'),
                "the line starts with its time: {started}"
            );
            let ready = format!("Layer {layer} of chart shop is ready");
            assert!(
                stdout.lines().any(|l| l.contains(&ready)) || layer == "app",
                "a line for layer {layer} ready: {stdout}"
            );
        }
        assert!(
            stdout.lines().any(|l| l.contains(" ReleaseReady ")),
            "{stdout}"
        );
        assert!(stdout.contains("STATUS: deployed"), "{stdout}");
        assert!(stdout.contains("REVISION: 1"), "{stdout}");

        // The real helm reads the release.
        let list = helm(&kubeconfig, &["list", "-n", "default", "-o", "json"]);
        let list: Value = serde_json::from_str(&list).unwrap();
        assert_eq!(list[0]["name"], "shop", "{list}");
        assert_eq!(list[0]["status"], "deployed", "{list}");
        assert_eq!(list[0]["revision"], "1", "{list}");
        let history = helm(
            &kubeconfig,
            &["history", "shop", "-n", "default", "-o", "json"],
        );
        let history: Value = serde_json::from_str(&history).unwrap();
        assert_eq!(history.as_array().unwrap().len(), 1, "{history}");
        assert_eq!(history[0]["status"], "deployed");
        let manifest = helm(&kubeconfig, &["get", "manifest", "shop", "-n", "default"]);
        for name in ["db", "queue-processor", "my-app"] {
            assert!(
                manifest.contains(&format!("name: {name}\n")),
                "helm get manifest names {name}: {manifest}"
            );
            assert_eq!(
                applies(&server, "Deployment", name),
                1,
                "{name} applied once"
            );
        }
        // The lock is free.
        let lease = server
            .object(
                "coordination.k8s.io/v1",
                "Lease",
                Some("default"),
                "sequenced.lock.shop",
            )
            .expect("the release's Lease");
        assert!(
            lease.pointer("/spec/holderIdentity").is_none(),
            "released: {lease}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_then_sequenced_upgrade_then_helm_rollback_keep_one_history() {
    within(async {
        let (server, _dir, kubeconfig) = cluster().await;
        let _kubelet = kubelet(&server);
        let chart = web_chart();
        let web = chart.path().join("web");
        let web = web.to_str().unwrap();
        let out = finish(spawn(&kubeconfig, &["install", "web", web, "-o", "json"])).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["outcome"], "deployed", "{summary}");
        assert_eq!(summary["revision"], 1, "{summary}");
        assert_eq!(summary["layers"].as_array().unwrap().len(), 2, "{summary}");
        assert!(summary["layers"][0]["startedAt"].is_string(), "{summary}");
        assert!(summary["layers"][0]["finishedAt"].is_string(), "{summary}");

        // sequenced upgrade goes on at revision 2, with the values Helm merged.
        let out = finish(spawn(
            &kubeconfig,
            &["upgrade", "web", web, "--set", "replicas=3"],
        ))
        .await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("REVISION: 2"),
            "{}",
            text(&out.stdout)
        );
        let values = helm(
            &kubeconfig,
            &["get", "values", "web", "-n", "default", "-o", "json"],
        );
        assert_eq!(
            serde_json::from_str::<Value>(&values).unwrap()["replicas"],
            3
        );
        let deployment = server
            .object("apps/v1", "Deployment", Some("default"), "web")
            .unwrap();
        assert_eq!(deployment["spec"]["replicas"], 3);
        // The real helm goes on from it: an upgrade, then a rollback to sequenced's revision.
        helm(
            &kubeconfig,
            &[
                "upgrade",
                "web",
                web,
                "-n",
                "default",
                "--set",
                "replicas=4",
            ],
        );
        helm(&kubeconfig, &["rollback", "web", "2", "-n", "default"]);
        let history = helm(
            &kubeconfig,
            &["history", "web", "-n", "default", "-o", "json"],
        );
        let history: Value = serde_json::from_str(&history).unwrap();
        let statuses: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["status"].as_str().unwrap())
            .collect();
        assert_eq!(
            statuses,
            ["superseded", "superseded", "superseded", "deployed"],
            "{history}"
        );
        let deployment = server
            .object("apps/v1", "Deployment", Some("default"), "web")
            .unwrap();
        assert_eq!(
            deployment["spec"]["replicas"], 3,
            "back at revision 2's values"
        );
        // And sequenced goes on from Helm's revision 4 at 5.
        let out = finish(spawn(
            &kubeconfig,
            &["upgrade", "web", web, "--set", "replicas=5"],
        ))
        .await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("REVISION: 5"),
            "{}",
            text(&out.stdout)
        );
        let history = helm(
            &kubeconfig,
            &["history", "web", "-n", "default", "-o", "json"],
        );
        let history: Value = serde_json::from_str(&history).unwrap();
        assert_eq!(history.as_array().unwrap().len(), 5, "{history}");
        assert_eq!(history[4]["status"], "deployed", "{history}");
        assert_eq!(history[3]["status"], "superseded", "{history}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequenced_upgrade_goes_on_from_a_helm_install_at_the_next_revision() {
    within(async {
        let (server, _dir, kubeconfig) = cluster().await;
        let _kubelet = kubelet(&server);
        let chart = web_chart();
        let web = chart.path().join("web");
        let web = web.to_str().unwrap();
        helm(&kubeconfig, &["install", "web", web, "-n", "default"]);
        server.clear_requests();
        let out = finish(spawn(
            &kubeconfig,
            &["upgrade", "web", web, "--set", "replicas=2"],
        ))
        .await;
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains("REVISION: 2"),
            "{}",
            text(&out.stdout)
        );
        let history = helm(
            &kubeconfig,
            &["history", "web", "-n", "default", "-o", "json"],
        );
        let history: Value = serde_json::from_str(&history).unwrap();
        let statuses: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, ["superseded", "deployed"], "{history}");
        // Its objects are the release's own: applied in layer order, config before app.
        let config = first_apply(&server, "ConfigMap", "config").expect("config applied");
        let app = first_apply(&server, "Deployment", "web").expect("web applied");
        assert!(config < app);
        let deployment = server
            .object("apps/v1", "Deployment", Some("default"), "web")
            .unwrap();
        assert_eq!(deployment["spec"]["replicas"], 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_install_is_retried_by_the_same_command() {
    within(async {
        let (server, _dir, kubeconfig) = cluster().await;
        let chart = web_chart();
        let web = chart.path().join("web");
        let web = web.to_str().unwrap();
        let args = ["upgrade", "--install", "web", web, "--timeout", "3s"];
        // Nobody makes the Deployment ready: the install fails past its timeout.
        let out = finish(spawn(&kubeconfig, &args)).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}{stderr}", text(&out.stdout));
        assert!(stderr.starts_with("Error: UPGRADE FAILED: "), "{stderr}");
        assert!(
            stderr.contains("Deployment web"),
            "names what blocked: {stderr}"
        );
        let history = helm(
            &kubeconfig,
            &["history", "web", "-n", "default", "-o", "json"],
        );
        let history: Value = serde_json::from_str(&history).unwrap();
        assert_eq!(history[0]["status"], "failed", "{history}");
        // The same command again, with the cluster working: deployed, never Helm's "cannot
        // re-use a name that is still in use".
        let _kubelet = kubelet(&server);
        let out = finish(spawn(&kubeconfig, &args)).await;
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        assert!(stdout.contains("STATUS: deployed"), "{stdout}");
        let list = helm(&kubeconfig, &["list", "-n", "default", "-o", "json"]);
        let list: Value = serde_json::from_str(&list).unwrap();
        assert_eq!(list[0]["status"], "deployed", "{list}");
        // An install of a deployed name is refused as Helm refuses it.
        let out = finish(spawn(&kubeconfig, &["install", "web", web])).await;
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            text(&out.stderr).trim_end(),
            "Error: INSTALLATION FAILED: cannot re-use a name that is still in use"
        );
        // A usage error exits 1, as Helm's.
        let out = finish(spawn(&kubeconfig, &["upgrade", "web"])).await;
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_is_refused_and_changes_nothing() {
    within(async {
        let (server, _dir, kubeconfig) = cluster().await;
        let chart = web_chart();
        let web = chart.path().join("web");
        let web = web.to_str().unwrap();
        for args in [
            &["install", "web", web, "--dry-run"][..],
            &["upgrade", "--install", "web", web, "--dry-run=server"][..],
        ] {
            let out = finish(spawn(&kubeconfig, args)).await;
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(stderr.contains("--dry-run is not supported"), "{stderr}");
        }
        // Not one write reached the cluster: no object, no record, no Lease.
        let writes: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| !matches!(r.verb, "get" | "list" | "watch"))
            .map(|r| format!("{} {:?} {:?}", r.verb, r.kind, r.name))
            .collect();
        assert!(writes.is_empty(), "{writes:?}");
    })
    .await;
}
