//! The controller scenarios on a real cluster (kind, k3d, ...): opt-in. Each test runs the
//! controller in-process against the cluster that `SEQUENCED_E2E_KUBECONFIG` names, in a fresh
//! namespace that it deletes at the end. The CRD is applied from crds/ first. Order is checked
//! through the release's status: a layer starts no earlier than the layers it depends on became
//! ready.
//!
//! ```sh
//! kind create cluster --name sequenced
//! kind get kubeconfig --name sequenced > /tmp/kind.yaml
//! SEQUENCED_E2E_KUBECONFIG=/tmp/kind.yaml cargo nextest run --test e2e --run-ignored all
//! ```
//!
//! (`cargo test --test e2e -- --include-ignored` with cargo's runner.)
//!
//! **Every test of this file is written the same way**, so that a run without a cluster reports
//! it skipped, never passed, and a run that asked for it fails without one:
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! #[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
//! async fn e2e_what_it_shows() {
//!     let e2e = setup().await; // panics when SEQUENCED_E2E_KUBECONFIG is not set
//!     // ...
//!     e2e.finish().await;
//! }
//! ```
//!
//! `tests/architecture.rs` checks that every test here carries that `#[ignore]`.

use sequenced_testkit as support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use sequenced::api::v1alpha1::{LayerPhase, LayerStatus, ReleasePhase, SequencedRelease};
use sequenced::chart::source::ChartCache;
use sequenced::controller::{self, Options};
use sequenced::helm::Helm;
use serde_json::{Value, json};
use support::charts::{
    chart, condition, config_map, deployment, is_ready, is_stalled, message, release,
};
use tokio::sync::oneshot;

struct E2e {
    client: Client,
    config: Config,
    namespace: String,
    controller: Option<Running>,
    /// The kubelet played for the test's namespace, on a cluster without Nodes.
    kubelet: Option<tokio::task::JoinHandle<()>>,
}

/// Plays the kubelet for the Pods of `namespace` when the cluster has no Node (a bare
/// kube-apiserver with kube-controller-manager, as built on a developer's machine): a Pod that
/// runs to completion (restartPolicy Never or OnFailure: a Job's) Succeeded a moment after it
/// appears, or Failed when labelled `sequenced.test/outcome: fail`; any other Pod is Running and
/// Ready. kube-controller-manager does the rest (Jobs complete, Deployments become available).
/// None on a cluster with Nodes: its kubelets run the Pods.
async fn play_kubelet(client: &Client, namespace: &str) -> Option<tokio::task::JoinHandle<()>> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::runtime::watcher;
    let nodes = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
        .ok()?;
    if !nodes.items.is_empty() {
        return None;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Some(tokio::spawn(async move {
        let mut events = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                Ok(_) => continue,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            if pod.metadata.deletion_timestamp.is_some()
                || matches!(phase.as_deref(), Some("Running" | "Succeeded" | "Failed"))
            {
                continue;
            }
            let Some(spec) = pod.spec.as_ref() else {
                continue;
            };
            let completes = matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure"));
            // What a kubelet would make of the containers: `sh -c '... exit 1'` fails (or the
            // test label says so); an image of a reserved `.invalid` host is never pulled.
            let exits_non_zero = |c: &k8s_openapi::api::core::v1::Container| {
                let script: Vec<String> = c
                    .command
                    .iter()
                    .flatten()
                    .chain(c.args.iter().flatten())
                    .cloned()
                    .collect();
                let script = script.join(" ");
                let code = script.rsplit_once("exit ").map(|(_, code)| {
                    code.chars()
                        .take_while(char::is_ascii_digit)
                        .collect::<String>()
                });
                code.and_then(|code| code.parse::<i32>().ok())
                    .is_some_and(|code| code != 0)
            };
            let fails = spec.containers.iter().any(exits_non_zero)
                || pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("sequenced.test/outcome"))
                    .is_some_and(|v| v == "fail");
            let unpullable = spec.containers.iter().any(|c| {
                c.image
                    .as_deref()
                    .and_then(|i| i.split('/').next())
                    .is_some_and(|host| host.ends_with(".invalid"))
            });
            if unpullable {
                continue;
            }
            // Nothing listens in a pause container: a probe of a port there never succeeds.
            let never_ready = spec.containers.iter().any(|c| {
                let probed = c
                    .readiness_probe
                    .as_ref()
                    .is_some_and(|p| p.tcp_socket.is_some() || p.http_get.is_some());
                probed && c.image.as_deref().is_some_and(|i| i.contains("/pause:"))
            });
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let now = format!("{}Z", &now[..19]);
            let containers: Vec<Value> = spec
                .containers
                .iter()
                .map(|c| {
                    let state = match (completes, fails) {
                        (false, _) => json!({"running": {"startedAt": now}}),
                        (true, false) => json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}),
                        (true, true) => json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}}),
                    };
                    json!({"name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                           "ready": !completes && !never_ready, "started": !completes, "restartCount": 0, "state": state})
                })
                .collect();
            let ready = if completes || never_ready {
                "False"
            } else {
                "True"
            };
            let phase = match (completes, fails) {
                (false, _) => "Running",
                (true, false) => "Succeeded",
                (true, true) => "Failed",
            };
            let condition = |type_: &str, status: &str| json!({"type": type_, "status": status, "lastTransitionTime": now});
            let status = json!({"status": {
                "phase": phase, "startTime": now, "hostIP": "10.0.0.10", "podIP": "10.0.0.11",
                "conditions": [condition("PodScheduled", "True"), condition("Initialized", "True"),
                               condition("ContainersReady", ready), condition("Ready", ready)],
                "containerStatuses": containers,
            }});
            if completes {
                // A Job's Pod runs a moment before it ends.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            let _ = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
    }))
}

/// A controller running in-process.
struct Running {
    identity: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _cache: tempfile::TempDir,
}

impl Running {
    /// A controller whose shard Leases are in `namespace` (the test's own, so that the
    /// controllers of tests running at once do not divide one set of shards among them).
    fn start(config: &Config, identity: String, namespace: &str) -> Running {
        let cache = tempfile::tempdir().unwrap();
        let options = Options {
            helm: Helm::at(support::helm()),
            kubectl: sequenced::kubectl::Kubectl::at(support::kubectl()),
            cache: ChartCache::new(cache.path()),
            concurrency: 8,
            identity: identity.clone(),
            metrics: std::sync::Arc::new(sequenced::metrics::Metrics::new().unwrap()),
            tenancy: Default::default(),
            sharding: sequenced::lock::Sharding {
                namespace: namespace.to_string(),
                lease_duration: std::time::Duration::from_secs(3),
                ..Default::default()
            },
            drift_full_check_interval: sequenced::controller::DRIFT_FULL_CHECK_INTERVAL,
            take_pending_after: sequenced::rollout::takeover::DEFAULT_PENDING_BOUND,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let controller_config = config.clone();
        let task = tokio::spawn(async move {
            let _ = controller::run(controller_config, options, async move {
                let _ = stopped.await;
            })
            .await;
        });
        Running {
            identity,
            stop: Some(stop),
            task: Some(task),
            _cache: cache,
        }
    }

    /// Kills it: it stops wherever it is and releases nothing (its Leases stay as they were).
    async fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Stops it as SIGTERM does; how long it took to exit.
    async fn stop(mut self) -> Duration {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        started.elapsed()
    }
}

/// The cluster of `SEQUENCED_E2E_KUBECONFIG`, a fresh namespace and a running controller. A
/// test run without the variable fails here: it was asked for (`--run-ignored`) and cannot run.
async fn setup() -> E2e {
    let Some(path) = std::env::var_os("SEQUENCED_E2E_KUBECONFIG") else {
        panic!(
            "SEQUENCED_E2E_KUBECONFIG is not set: the end-to-end tests need a real cluster \
             (see the top of tests/e2e.rs)"
        );
    };
    let kubeconfig = Kubeconfig::read_from(&path).expect("read the kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let client = Client::try_from(config.clone()).expect("client");
    let text = std::fs::read_to_string(support::charts::repo().join("crds/sequencedrelease.yaml"))
        .unwrap();
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            "sequencedreleases.sequenced.dev",
            &PatchParams::apply("sequenced-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply the CRD");
    let namespace = format!("sequenced-e2e-{:08x}", fastrand::u32(..));
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let controller = Running::start(&config, format!("e2e-{namespace}"), &namespace);
    let kubelet = play_kubelet(&client, &namespace).await;
    E2e {
        client,
        config,
        namespace,
        controller: Some(controller),
        kubelet,
    }
}

impl E2e {
    fn releases(&self) -> Api<SequencedRelease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn create(&self, release: Value) {
        let sr: SequencedRelease = serde_json::from_value(release).unwrap();
        self.releases()
            .create(&PostParams::default(), &sr)
            .await
            .expect("create the release");
    }

    async fn wait(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&SequencedRelease) -> bool,
    ) -> SequencedRelease {
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut last = None;
        while Instant::now() < deadline {
            if let Ok(Some(sr)) = self.releases().get_opt(name).await {
                if check(&sr) {
                    return sr;
                }
                last = Some(sr);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{name} never got {what}: {:?}", last.and_then(|s| s.status));
    }

    /// Deletes the release and waits until it is gone (uninstalled, its finalizer removed).
    async fn uninstall(&self, name: &str) {
        self.releases()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.releases().get_opt(name).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "{name} never uninstalled");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The names of the Jobs in the test's namespace.
    async fn jobs(&self) -> Vec<String> {
        let jobs: Api<k8s_openapi::api::batch::v1::Job> =
            Api::namespaced(self.client.clone(), &self.namespace);
        jobs.list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|j| j.metadata.name)
            .collect()
    }

    /// Stops the controller and deletes the test's namespace; the finalizers of the releases
    /// left in it are removed, so that nothing of the test stays behind (the namespace deletion
    /// of releases is tested on the test API server, tests/convergence.rs).
    async fn finish(mut self) {
        if let Some(controller) = self.controller.take() {
            controller.stop().await;
        }
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.abort();
        }
        let namespaces = Api::<Namespace>::all(self.client.clone());
        let _ = namespaces
            .delete(&self.namespace, &DeleteParams::default())
            .await;
        let releases = self.releases();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && namespaces
                .get_opt(&self.namespace)
                .await
                .is_ok_and(|ns| ns.is_some())
        {
            for sr in releases
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let name = sr.metadata.name.clone().unwrap_or_default();
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = releases
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn layer<'a>(sr: &'a SequencedRelease, name: &str) -> &'a LayerStatus {
    sr.status
        .as_ref()
        .unwrap()
        .layers
        .iter()
        .find(|l| l.name == name)
        .unwrap()
}

/// `later` started no earlier than `earlier` became ready.
fn after(sr: &SequencedRelease, later: &str, earlier: &str) {
    let started = layer(sr, later).started_at.clone().unwrap();
    let ready = layer(sr, earlier).finished_at.clone().unwrap();
    assert!(
        started.0 >= ready.0,
        "{later} started at {started:?}, before {earlier} was ready at {ready:?}"
    );
}

fn failed(sr: &SequencedRelease) -> bool {
    sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_shop_installs_in_order_upgrades_and_uninstalls() {
    let e2e = setup().await;
    e2e.create(release(
        "shop",
        &support::charts::repo().join("examples/shop"),
        json!({}),
    ))
    .await;
    let sr = e2e.wait("shop", "Ready", is_ready).await;
    after(&sr, "app", "database");
    after(&sr, "app", "queue");
    // Upgrade: two replicas of the app.
    let patch = json!({"spec": {"values": {"replicas": 2}}});
    e2e.releases()
        .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    e2e.wait("shop", "revision 2 Ready", |sr| {
        is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
    })
    .await;
    // Uninstall.
    e2e.uninstall("shop").await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    assert!(
        deployments
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_migration_hook_runs_before_the_layers_on_install_and_upgrade() {
    let e2e = setup().await;
    e2e.create(release(
        "migrate",
        &support::charts::repo().join("examples/migrate"),
        json!({}),
    ))
    .await;
    let sr = e2e.wait("migrate", "Ready", is_ready).await;
    after(&sr, "config", "(pre-install)");
    assert_eq!(layer(&sr, "(pre-install)").ready, 2);
    let jobs: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    // hook-succeeded: the Job is gone; the ServiceAccount hook stays, as with Helm.
    assert!(jobs.get_opt("migrate-migrate").await.unwrap().is_none());
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    assert!(accounts.get_opt("migrate-migrate").await.unwrap().is_some());
    // An upgrade runs the migration again, as pre-upgrade.
    let patch =
        json!({"spec": {"values": {"databaseUrl": "postgres://db2.example.internal/shop"}}});
    e2e.releases()
        .patch("migrate", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let sr = e2e
        .wait("migrate", "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2)
        })
        .await;
    after(&sr, "config", "(pre-upgrade)");
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_the_subchart_example_follows_the_seed_order() {
    let e2e = setup().await;
    e2e.create(release(
        "foo",
        &support::charts::repo().join("examples/foo"),
        json!({}),
    ))
    .await;
    let sr = e2e.wait("foo", "Ready", is_ready).await;
    let chart_started = |chart: &str| {
        sr.status
            .as_ref()
            .unwrap()
            .layers
            .iter()
            .filter(|l| l.chart == chart)
            .filter_map(|l| l.started_at.clone())
            .map(|t| t.0)
            .min()
            .unwrap()
    };
    let chart_ready = |chart: &str| {
        sr.status
            .as_ref()
            .unwrap()
            .layers
            .iter()
            .filter(|l| l.chart == chart)
            .filter_map(|l| l.finished_at.clone())
            .map(|t| t.0)
            .max()
            .unwrap()
    };
    assert!(chart_started("foo/bar") >= chart_ready("foo/nginx"));
    assert!(chart_started("foo/bar") >= chart_ready("foo/rabbitmq"));
    assert!(chart_started("foo") >= chart_ready("foo/bar"));
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_failures_timeouts_cycles_and_ownership() {
    let e2e = setup().await;
    let slow = chart(
        "slow",
        &[(
            "templates/web.yaml",
            &deployment("web", "helm.sh/readiness-timeout: 15s")
                .replace("registry.k8s.io/pause:3.10", "registry.invalid/none:1"),
        )],
    );
    e2e.create(release("slow", &slow.path().join("slow"), json!({})))
        .await;
    let cycle = chart(
        "loop",
        &[
            (
                "templates/a.yaml",
                &config_map("a", "helm.sh/layer: a\n    helm.sh/depends-on/layers: b"),
            ),
            (
                "templates/b.yaml",
                &config_map("b", "helm.sh/layer: b\n    helm.sh/depends-on/layers: a"),
            ),
        ],
    );
    e2e.create(release("loop", &cycle.path().join("loop"), json!({})))
        .await;
    let cms: Api<ConfigMap> = Api::namespaced(e2e.client.clone(), &e2e.namespace);
    let theirs: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "shared", "annotations": {
        "meta.helm.sh/release-name": "other", "meta.helm.sh/release-namespace": e2e.namespace}}}))
        .unwrap();
    cms.create(&PostParams::default(), &theirs).await.unwrap();
    let mine = chart(
        "mine",
        &[(
            "templates/cm.yaml",
            &config_map("shared", "helm.sh/layer: one"),
        )],
    );
    e2e.create(release("mine", &mine.path().join("mine"), json!({})))
        .await;

    let sr = e2e.wait("slow", "Failed", failed).await;
    assert!(
        message(&sr).contains("readiness timeout after 15s: Deployment web"),
        "{}",
        message(&sr)
    );
    let sr = e2e.wait("loop", "Stalled", is_stalled).await;
    assert!(condition(&sr, "Stalled").unwrap().2.contains("a -> b -> a"));
    let sr = e2e.wait("mine", "Stalled", is_stalled).await;
    assert!(
        condition(&sr, "Stalled")
            .unwrap()
            .2
            .contains("Helm release other")
    );
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_depends_on_and_twenty_releases() {
    let e2e = setup().await;
    let db = chart(
        "db",
        &[(
            "templates/db.yaml",
            &deployment("database", "helm.sh/layer: db"),
        )],
    );
    let web = chart(
        "web",
        &[(
            "templates/web.yaml",
            &config_map("web", "helm.sh/layer: web"),
        )],
    );
    e2e.create(release(
        "web",
        &web.path().join("web"),
        json!({"dependsOn": [{"name": "db"}]}),
    ))
    .await;
    e2e.create(release("db", &db.path().join("db"), json!({})))
        .await;
    let web_sr = e2e.wait("web", "Ready", is_ready).await;
    let db_sr = e2e.wait("db", "Ready", is_ready).await;
    let db_ready = db_sr.status.unwrap().history[0]
        .finished_at
        .clone()
        .unwrap();
    let web_started = web_sr.status.unwrap().history[0]
        .started_at
        .clone()
        .unwrap();
    assert!(web_started.0 >= db_ready.0);
    let many = chart(
        "many",
        &[(
            "templates/cm.yaml",
            &config_map("{{ .Release.Name }}-cm", "helm.sh/layer: one"),
        )],
    );
    for i in 0..20 {
        e2e.create(release(
            &format!("many-{i}"),
            &many.path().join("many"),
            json!({}),
        ))
        .await;
    }
    for i in 0..20 {
        e2e.wait(&format!("many-{i}"), "Ready", is_ready).await;
    }
    e2e.finish().await;
}

/// `kubectl wait` on a release, with the kubeconfig of the suite: true when it exited 0.
/// kubectl is `$SEQUENCED_KUBECTL`, else `.tools/bin/kubectl` (`scripts/install-kubectl.sh`),
/// else the one on PATH.
async fn kubectl_wait(e2e: &E2e, condition: &str, name: &str, timeout: &str) -> bool {
    let kubectl = std::env::var_os("SEQUENCED_KUBECTL")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            Some(support::charts::repo().join(".tools/bin/kubectl")).filter(|p| p.is_file())
        })
        .unwrap_or_else(|| "kubectl".into());
    let kubeconfig = std::env::var_os("SEQUENCED_E2E_KUBECONFIG").expect("the suite's kubeconfig");
    let out = tokio::process::Command::new(&kubectl)
        .env("KUBECONFIG", kubeconfig)
        .args([
            "wait",
            &format!("--for=condition={condition}"),
            &format!("--timeout={timeout}"),
            "-n",
            &e2e.namespace,
            &format!("sequencedrelease/{name}"),
        ])
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "running {} failed ({e}): scripts/install-kubectl.sh installs kubectl, or set SEQUENCED_KUBECTL",
                kubectl.display()
            )
        });
    out.status.success()
}

/// What a GitOps pipeline does after committing a release: `kubectl wait
/// --for=condition=Ready` returns once the release is Ready, here only after the Deployment it
/// depends on (`dependsOn` an object, not a release) is available; a release whose revision
/// failed is never Ready and `kubectl wait --for=condition=Stalled` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_kubectl_wait_sees_a_release_ready_after_its_dependency_and_a_failed_one_stalled() {
    let e2e = setup().await;
    let web = chart(
        "web",
        &[(
            "templates/web.yaml",
            &config_map("web", "helm.sh/layer: web"),
        )],
    );
    e2e.create(release(
        "web",
        &web.path().join("web"),
        json!({"dependsOn": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "db",
            "readyExpr": "has(self.status) && has(self.status.availableReplicas) && self.status.availableReplicas >= 1"}]}),
    ))
    .await;
    let sr = e2e
        .wait("web", "Pending", |sr| {
            sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Pending)
        })
        .await;
    assert!(
        message(&sr).contains("waiting for Deployment"),
        "{}",
        message(&sr)
    );
    assert!(
        !kubectl_wait(&e2e, "Ready", "web", "2s").await,
        "not Ready yet"
    );
    let db: k8s_openapi::api::apps::v1::Deployment =
        serde_yaml_ng::from_str(&deployment("db", "a.b/c: d")).unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    deployments
        .create(&PostParams::default(), &db)
        .await
        .expect("create the Deployment");
    assert!(
        kubectl_wait(&e2e, "Ready", "web", "240s").await,
        "kubectl wait --for=condition=Ready never returned"
    );
    let sr = e2e.releases().get("web").await.unwrap();
    assert!(is_ready(&sr));

    let slow = chart(
        "slow",
        &[(
            "templates/web.yaml",
            &deployment("web", "helm.sh/readiness-timeout: 15s")
                .replace("registry.k8s.io/pause:3.10", "registry.invalid/none:1"),
        )],
    );
    e2e.create(release("slow", &slow.path().join("slow"), json!({})))
        .await;
    assert!(
        kubectl_wait(&e2e, "Stalled", "slow", "240s").await,
        "kubectl wait --for=condition=Stalled never returned"
    );
    assert!(!kubectl_wait(&e2e, "Ready", "slow", "3s").await);
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_two_controllers_share_releases_and_a_stopped_one_hands_over() {
    let mut e2e = setup().await;
    let first = e2e.controller.take().unwrap();
    let second = Running::start(
        &e2e.config,
        format!("e2e-{}-b", e2e.namespace),
        &e2e.namespace,
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    let holder = |name: String| {
        let leases = leases.clone();
        async move {
            leases
                .get_opt(&format!("sequenced.lock.{name}"))
                .await
                .unwrap()
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| !h.is_empty())
        }
    };
    let pair = chart(
        "pair",
        &[
            (
                "templates/a.yaml",
                &config_map("{{ .Release.Name }}-a", "helm.sh/layer: a"),
            ),
            (
                "templates/b.yaml",
                &config_map(
                    "{{ .Release.Name }}-b",
                    "helm.sh/layer: b\n    helm.sh/depends-on/layers: a",
                ),
            ),
        ],
    );
    for i in 0..10 {
        e2e.create(release(
            &format!("pair-{i}"),
            &pair.path().join("pair"),
            json!({}),
        ))
        .await;
    }
    for i in 0..10 {
        let sr = e2e.wait(&format!("pair-{i}"), "Ready", is_ready).await;
        let status = sr.status.unwrap();
        assert_eq!(status.revision, Some(1), "pair-{i} installed once");
        assert_eq!(status.history.len(), 1);
        assert_eq!(status.lock, None);
        assert_eq!(holder(format!("pair-{i}")).await, None);
    }

    // A layer that takes a while: whichever controller holds the release is stopped, and the
    // other goes on at once.
    let slow = chart(
        "slow",
        &[
            (
                "templates/db.yaml",
                &deployment("slow-db", "helm.sh/layer: db").replace(
                    "image: registry.k8s.io/pause:3.10\n",
                    "image: registry.k8s.io/pause:3.10\n          readinessProbe:\n            tcpSocket:\n              port: 1\n            initialDelaySeconds: 1\n            periodSeconds: 1\n",
                ),
            ),
            (
                "templates/app.yaml",
                &config_map("slow-app", "helm.sh/layer: app\n    helm.sh/depends-on/layers: db"),
            ),
        ],
    );
    // The test fixes the Deployment outside the release's spec below: drift detection, which
    // would take the fix back, only reports it.
    e2e.create(release(
        "slow",
        &slow.path().join("slow"),
        json!({"readinessTimeout": "10m", "driftDetection": "warn"}),
    ))
    .await;
    let sr = e2e
        .wait("slow", "layer db waiting", |sr| {
            sr.status.as_ref().is_some_and(|s| {
                s.lock.is_some()
                    && s.layers
                        .iter()
                        .any(|l| l.name == "db" && l.phase == LayerPhase::Waiting)
            })
        })
        .await;
    let holding = sr.status.unwrap().lock.unwrap().holder.unwrap();
    let (stopped, running) = if holding == first.identity {
        (first, second)
    } else {
        (second, first)
    };
    let took = stopped.stop().await;
    assert!(took < Duration::from_secs(10), "stopping took {took:?}");
    let sr = e2e.releases().get("slow").await.unwrap();
    assert_eq!(condition(&sr, "Reconciling").unwrap().1, "Interrupted");
    assert_eq!(holder("slow".to_string()).await, None);
    // The probe never succeeds: make it succeed (a fix outside the spec of the release).
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "readinessProbe": null}]}}}});
    deployments
        .patch(
            "slow-db",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap();
    let sr = e2e.wait("slow", "Ready", is_ready).await;
    assert_eq!(sr.status.unwrap().revision, Some(1));
    e2e.controller = Some(running);
    e2e.finish().await;
}

/// A failing upgrade rolled back by `onFailure: rollback`, read with the real helm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_failed_upgrade_is_rolled_back_and_helm_reads_the_history() {
    let e2e = setup().await;
    let broken = format!(
        "{{{{- if .Values.broken }}}}\n{}{{{{- end }}}}\n",
        deployment(
            "extra",
            "helm.sh/layer: extra\n    helm.sh/depends-on/layers: app\n    helm.sh/readiness-timeout: 15s"
        )
        .replace("registry.k8s.io/pause:3.10", "registry.invalid/none:1"),
    );
    let dir = chart(
        "undo",
        &[
            (
                "templates/config.yaml",
                &config_map("config", "helm.sh/layer: config"),
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
    );
    e2e.create(release(
        "undo",
        &dir.path().join("undo"),
        json!({"onFailure": "rollback"}),
    ))
    .await;
    e2e.wait("undo", "Ready", is_ready).await;
    let patch = json!({"spec": {"values": {"broken": true}}});
    e2e.releases()
        .patch("undo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let sr = e2e
        .wait("undo", "rolled back", |sr| {
            sr.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(ReleasePhase::Ready) && s.revision == Some(3))
        })
        .await;
    let status = sr.status.as_ref().unwrap();
    assert_eq!(status.rollback.as_ref().unwrap().to, 1);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    assert!(deployments.get_opt("extra").await.unwrap().is_none());
    if let Some(path) = std::env::var_os("SEQUENCED_E2E_KUBECONFIG") {
        let text = support::run_helm(
            std::path::Path::new(&path),
            &["history", "undo", "-o", "json", "-n", &e2e.namespace],
        );
        let history: serde_json::Value = serde_json::from_str(&text).unwrap();
        let statuses: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, ["superseded", "failed", "deployed"]);
    }
    e2e.finish().await;
}

/// Applies `object` with the test's own (admin) identity.
async fn e2e_apply(e2e: &E2e, object: Value) {
    let api_version = object["apiVersion"].as_str().unwrap().to_string();
    let kind = object["kind"].as_str().unwrap().to_string();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let resource = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        group, version, &kind,
    ));
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(e2e.client.clone(), &e2e.namespace, &resource);
    api.patch(
        &name,
        &PatchParams::apply("sequenced-e2e"),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_release_acts_as_its_service_account_and_a_layer_it_may_not_write_is_forbidden() {
    let e2e = setup().await;
    let ns = e2e.namespace.clone();
    e2e_apply(
        &e2e,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "deployer"}}),
    )
    .await;
    e2e_apply(
        &e2e,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "deployer"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                          "verbs": ["get", "list", "watch", "create", "patch", "delete"]}]}),
    )
    .await;
    e2e_apply(
        &e2e,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "deployer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployer"},
               "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": ns}]}),
    )
    .await;
    let allowed = chart(
        "tenant",
        &[(
            "templates/cm.yaml",
            &config_map("settings", "helm.sh/layer: config"),
        )],
    );
    e2e.create(release(
        "tenant",
        &allowed.path().join("tenant"),
        json!({"serviceAccountName": "deployer"}),
    ))
    .await;
    let sr = e2e.wait("tenant", "Ready", is_ready).await;
    assert_eq!(
        sr.status.as_ref().unwrap().acting_as.as_deref(),
        Some(format!("serviceaccount {ns}:deployer").as_str())
    );
    let role = format!("sequenced-e2e-{ns}");
    let refused = chart(
        "escalate",
        &[(
            "templates/role.yaml",
            &format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {role}\nrules: []\n"
            ),
        )],
    );
    e2e.create(release(
        "escalate",
        &refused.path().join("escalate"),
        json!({"serviceAccountName": "deployer"}),
    ))
    .await;
    let sr = e2e
        .wait("escalate", "Stalled Forbidden", |sr| {
            condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "Forbidden")
        })
        .await;
    assert!(failed(&sr));
    let message = sr
        .status
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(
        message.contains(&format!("serviceaccount {ns}:deployer cannot")),
        "{message}"
    );
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(e2e.client.clone());
    assert!(roles.get_opt(&role).await.unwrap().is_none());
    e2e.finish().await;
}

/// A name no other test uses, for cluster-scoped objects.
fn unique(prefix: &str) -> String {
    format!("{prefix}{:06x}", fastrand::u32(..) & 0xff_ffff)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_the_admission_webhook_pattern_runs_its_jobs_as_their_hook_service_account() {
    let e2e = setup().await;
    let name = unique("web");
    e2e.create(release(
        &name,
        &support::charts::repo().join("tests/charts/hook-patterns/webhook-certs"),
        json!({}),
    ))
    .await;
    let sr = e2e.wait(&name, "Ready", is_ready).await;
    assert_eq!(layer(&sr, "(pre-install)").phase, LayerPhase::Ready);
    assert_eq!(layer(&sr, "(post-install)").phase, LayerPhase::Ready);
    // The Jobs ran (their Pods admitted: their ServiceAccount outlived them), and every hook
    // went by its hook-succeeded policy once its stage was over.
    assert_eq!(e2e.jobs().await, Vec::<String>::new());
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    assert!(
        accounts
            .get_opt(&format!("{name}-admission"))
            .await
            .unwrap()
            .is_none()
    );
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(e2e.client.clone());
    assert!(
        roles
            .get_opt(&format!("{name}-admission"))
            .await
            .unwrap()
            .is_none()
    );
    e2e.uninstall(&name).await;
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_failed_hook_deletes_itself_and_the_hooks_before_it() {
    let e2e = setup().await;
    let name = unique("broken");
    e2e.create(release(
        &name,
        &support::charts::repo().join("tests/charts/hook-patterns/failing-hook"),
        json!({}),
    ))
    .await;
    let sr = e2e
        .wait(&name, "Stalled HookFailed", |sr| {
            condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "HookFailed")
        })
        .await;
    assert!(message(&sr).contains("failed: Job"), "{}", message(&sr));
    assert_eq!(e2e.jobs().await, Vec::<String>::new());
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    let left: Vec<String> = accounts
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|a| a.metadata.name)
        .filter(|n| n != "default")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    e2e.finish().await;
}

/// A namespaced CRD of kind `kind` in `group`, any fields allowed.
fn crd(group: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_kind_no_server_serves_is_refused_and_goes_on_once_its_crd_is_installed() {
    let e2e = setup().await;
    let group = format!("{}.example.com", unique("g"));
    let widget = format!(
        "apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: gadget\n  annotations:\n    helm.sh/layer: app\n    helm.sh/depends-on/layers: config\nspec:\n  size: 3\n"
    );
    let dir = chart(
        "gadgets",
        &[
            (
                "templates/config.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            ),
            ("templates/widget.yaml", widget.as_str()),
        ],
    );
    e2e.create(release("gadgets", &dir.path().join("gadgets"), json!({})))
        .await;
    let sr = e2e.wait("gadgets", "Stalled", is_stalled).await;
    let (_, reason, text) = condition(&sr, "Stalled").unwrap();
    assert_eq!(reason, "UnknownKind");
    assert!(
        text.starts_with(&format!(
            "no matches for kind \"Widget\" in version \"{group}/v1\" (Widget/gadget of chart gadgets, templates/widget.yaml)"
        )),
        "{text}"
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(e2e.client.clone(), &e2e.namespace);
    assert!(config_maps.get_opt("settings").await.unwrap().is_none());
    let crds: Api<CustomResourceDefinition> = Api::all(e2e.client.clone());
    crds.create(&PostParams::default(), &crd(&group, "Widget", "widgets"))
        .await
        .unwrap();
    let installed = Instant::now();
    e2e.wait("gadgets", "Ready", is_ready).await;
    assert!(
        installed.elapsed() < Duration::from_secs(60),
        "went on only after {:?}",
        installed.elapsed()
    );
    e2e.uninstall("gadgets").await;
    let _ = crds
        .delete(&format!("widgets.{group}"), &DeleteParams::default())
        .await;
    e2e.finish().await;
}

/// Chart `gadgets` `version` with CRD `widgets.<group>` in crds/ whose `spec` has `fields`, and
/// Widget `gadget` (layer app, after layer config) with `spec`.
fn widget_chart(group: &str, version: &str, fields: Value, spec: Value) -> tempfile::TempDir {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object", "properties": fields}}}}}]}
    });
    let widget = json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "gadget", "annotations": {"helm.sh/layer": "app", "helm.sh/depends-on/layers": "config"}},
        "spec": spec,
    });
    let crd = serde_yaml_ng::to_string(&crd).unwrap();
    let widget = serde_yaml_ng::to_string(&widget).unwrap();
    let config = config_map("settings", "helm.sh/layer: config");
    let dir = chart(
        "gadgets",
        &[
            ("crds/widgets.yaml", crd.as_str()),
            ("templates/config.yaml", config.as_str()),
            ("templates/widget.yaml", widget.as_str()),
        ],
    );
    support::write(
        &dir.path().join("gadgets"),
        "Chart.yaml",
        &format!("apiVersion: v2\nname: gadgets\nversion: {version}\n"),
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_an_upgrade_whose_crd_gained_a_field_updates_it_under_create_replace_and_leaves_it_under_skip()
 {
    let e2e = setup().await;
    let crds: Api<CustomResourceDefinition> = Api::all(e2e.client.clone());
    for policy in ["Skip", "CreateReplace"] {
        let group = format!("{}.example.com", unique("crd"));
        let name = policy.to_lowercase();
        let old = widget_chart(
            &group,
            "1.0.0",
            json!({"size": {"type": "integer"}}),
            json!({"size": 3}),
        );
        let new = widget_chart(
            &group,
            "2.0.0",
            json!({"size": {"type": "integer"}, "color": {"type": "string"}}),
            json!({"size": 3, "color": "blue"}),
        );
        // Installed with the policy unset: Create.
        e2e.create(release(&name, &old.path().join("gadgets"), json!({})))
            .await;
        let sr = e2e.wait(&name, "Ready", is_ready).await;
        assert_eq!(layer(&sr, "(crds)").phase, LayerPhase::Ready);
        let patch =
            json!({"spec": {"chart": {"path": new.path().join("gadgets")}, "crds": policy}});
        e2e.releases()
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        // Under Skip the new Widget's `color` is a field its CRD does not have: kube-apiserver
        // refuses the apply (500, "field not declared in schema") and the revision fails at
        // once, naming it.
        let sr = e2e
            .wait(&name, "revision 2 done", |sr| {
                let status = sr.status.as_ref().unwrap();
                status.revision == Some(2)
                    && if policy == "Skip" {
                        status.phase == Some(ReleasePhase::Failed)
                    } else {
                        is_ready(sr)
                    }
            })
            .await;
        let live = crds.get(&format!("widgets.{group}")).await.unwrap();
        let live = serde_json::to_value(&live).unwrap();
        let fields = live
            .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties")
            .and_then(Value::as_object)
            .unwrap();
        let widgets: Api<kube::api::DynamicObject> = Api::namespaced_with(
            e2e.client.clone(),
            &e2e.namespace,
            &kube::core::ApiResource::from_gvk_with_plural(
                &kube::core::GroupVersionKind::gvk(&group, "v1", "Widget"),
                "widgets",
            ),
        );
        let widget = serde_json::to_value(widgets.get("gadget").await.unwrap()).unwrap();
        let names: Vec<&str> = sr
            .status
            .as_ref()
            .unwrap()
            .layers
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        if policy == "Skip" {
            assert!(
                !fields.contains_key("color"),
                "Skip updated the CRD: {fields:?}"
            );
            assert_eq!(live.pointer("/metadata/generation"), Some(&json!(1)));
            assert_eq!(names, ["config", "app"], "no (crds) entry under Skip");
            let text = message(&sr);
            assert!(
                text.contains(".spec.color: field not declared in schema"),
                "{text}"
            );
            assert_eq!(widget.pointer("/spec/color"), None);
        } else {
            assert!(
                fields.contains_key("color"),
                "CreateReplace left the CRD: {fields:?}"
            );
            assert_eq!(live.pointer("/metadata/generation"), Some(&json!(2)));
            assert_eq!(names, ["(crds)", "config", "app"]);
            after(&sr, "config", "(crds)");
            assert_eq!(widget.pointer("/spec/color"), Some(&json!("blue")));
        }
        // Uninstalled, the CRD stays: sequenced never deletes one. The test removes it.
        e2e.uninstall(&name).await;
        assert!(
            crds.get_opt(&format!("widgets.{group}"))
                .await
                .unwrap()
                .is_some()
        );
        let _ = crds
            .delete(&format!("widgets.{group}"), &DeleteParams::default())
            .await;
    }
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_down_aggregated_api_holds_up_only_the_release_that_needs_it() {
    let e2e = setup().await;
    // An APIService whose Service does not exist: its group-version answers 503.
    let group = format!("{}.example.io", unique("agg"));
    let name = format!("v1alpha1.{group}");
    let apiservices: Api<kube::api::DynamicObject> = Api::all_with(
        e2e.client.clone(),
        &support::api_resource("apiregistration.k8s.io/v1", "APIService", "apiservices"),
    );
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": name},
        "spec": {"group": group, "version": "v1alpha1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "insecureSkipTLSVerify": true,
                 "service": {"name": "absent", "namespace": e2e.namespace, "port": 443}}
    });
    apiservices
        .create(
            &PostParams::default(),
            &serde_json::from_value(apiservice).unwrap(),
        )
        .await
        .unwrap();
    // A release that does not use it: Ready as ever.
    let plain = chart(
        "plain",
        &[(
            "templates/config.yaml",
            &config_map("settings", "helm.sh/layer: config"),
        )],
    );
    e2e.create(release("plain", &plain.path().join("plain"), json!({})))
        .await;
    e2e.wait("plain", "Ready", is_ready).await;
    // One that needs a kind of the group (an external dependency) waits, naming the APIService.
    let needs = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: uses-gizmo\n  annotations:\n    gizmo.external-dependency.werf.io/resource: gizmo.{group}/main\ndata:\n  a: b\n"
    );
    let dir = chart("needs", &[("templates/uses.yaml", needs.as_str())]);
    e2e.create(release("needs", &dir.path().join("needs"), json!({})))
        .await;
    let sr = e2e
        .wait("needs", "waiting for the group", |sr| {
            condition(sr, "Ready").is_some_and(|c| c.1 == "GroupUnavailable")
        })
        .await;
    let (_, _, text) = condition(&sr, "Ready").unwrap();
    assert!(
        text.contains(&format!(
            "APIService {name} is not Available (ServiceNotFound:"
        )),
        "{text}"
    );
    assert!(text.contains("503"), "{text}");
    let _ = apiservices.delete(&name, &DeleteParams::default()).await;
    e2e.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_target_paths_common_metadata_and_ignore_rules_hold_under_drift_detection() {
    let e2e = setup().await;
    let name = "daytwo";
    let webhook = unique("daytwo-");
    let settings: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "settings"},
        "data": {"values.yaml": "replicas: 1\ndb: {host: base}\n", "host": "db.example.com"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(e2e.client.clone(), &e2e.namespace)
        .create(&PostParams::default(), &settings)
        .await
        .unwrap();
    let app = deployment("app", "helm.sh/layer: app")
        .replace("replicas: 1", "replicas: {{ .Values.replicas }}");
    let webhook_config = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: {{{{ .Values.webhook }}}}\nwebhooks:\n- name: check.example.com\n  clientConfig:\n    service: {{namespace: {ns}, name: absent, path: /check}}\n  rules:\n  - {{apiGroups: [example.invalid], apiVersions: [v1], operations: [CREATE], resources: [things]}}\n  failurePolicy: Ignore\n  sideEffects: None\n  admissionReviewVersions: [v1]\n",
        ns = e2e.namespace
    );
    let dir = chart(
        name,
        &[
            (
                "templates/shown.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shown\ndata:\n  host: {{ .Values.db.host | quote }}\n",
            ),
            ("templates/app.yaml", app.as_str()),
            ("templates/webhook.yaml", webhook_config.as_str()),
        ],
    );
    e2e.create(release(
        name,
        &dir.path().join(name),
        json!({
            "valuesFrom": [
                {"kind": "ConfigMap", "name": "settings"},
                {"kind": "ConfigMap", "name": "settings", "valuesKey": "host", "targetPath": "db.host"},
            ],
            "values": {"webhook": webhook},
            "commonMetadata": {"labels": {"team": "platform"}},
            "driftDetection": {"mode": "enabled", "ignore": [
                {"paths": ["/spec/replicas"], "target": {"kind": "Deployment", "name": "app"}}
            ]},
            "interval": "2s",
        }),
    ))
    .await;
    e2e.wait(name, "Ready", is_ready).await;
    let cms: Api<ConfigMap> = Api::namespaced(e2e.client.clone(), &e2e.namespace);
    let shown = cms.get("shown").await.unwrap();
    assert_eq!(shown.data.unwrap()["host"], "db.example.com");
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(e2e.client.clone(), &e2e.namespace);
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration> =
        Api::all(e2e.client.clone());
    for labels in [
        shown.metadata.labels.clone().unwrap(),
        deployments
            .get("app")
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap(),
        webhooks
            .get(&webhook)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap(),
    ] {
        assert_eq!(labels["team"], "platform", "{labels:?}");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "sequenced");
    }

    // What a webhook certificate Job and a scaler do after the install, as other managers.
    let ca = json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Y2EK"}]);
    webhooks
        .patch(
            &webhook,
            &PatchParams {
                field_manager: Some("cert-job".into()),
                ..Default::default()
            },
            &Patch::Json::<()>(serde_json::from_value(ca).unwrap()),
        )
        .await
        .unwrap();
    deployments
        .patch(
            "app",
            &PatchParams {
                field_manager: Some("scaler".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    // Several intervals: every one compares each object with what the release applied.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sr = e2e.releases().get(name).await.unwrap();
    let status = sr.status.clone().unwrap();
    assert!(is_ready(&sr), "{status:?}");
    assert_eq!(status.revision, Some(1));
    assert!(
        condition(&sr, "Drifted").is_none_or(|(s, _, _)| s == "False"),
        "{:?}",
        condition(&sr, "Drifted")
    );
    let live = webhooks.get(&webhook).await.unwrap();
    assert_eq!(
        live.webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone()),
        Some(b"ca\n".to_vec()),
        "the certificate Job's CA is left alone"
    );
    let replicas = deployments.get("app").await.unwrap().spec.unwrap().replicas;
    assert_eq!(replicas, Some(3), "the ignored replicas are left alone");

    e2e.uninstall(name).await;
    assert!(webhooks.get_opt(&webhook).await.unwrap().is_none());
    e2e.finish().await;
}

/// Done when (Helm tests, issue 26): a chart's failing test hook fails the release with the
/// failing Pod's log tail in the status, and `onFailure: rollback` then rolls back. The test
/// Job prints two lines and, once the values say `broken`, exits 1. On a cluster with Nodes its
/// kubelet runs busybox and keeps the log; on one without, the played kubelet fails the Pod and
/// there is no log to read (the failure is told without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_failing_helm_test_fails_the_upgrade_with_its_log_and_rolls_back() {
    let e2e = setup().await;
    let smoke = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: smoke
  annotations:
    helm.sh/hook: test
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: smoke
          image: busybox:1.36
          command: ["sh", "-c", "echo GET /healthz; {{ if .Values.broken }}echo 'FAIL: /healthz answered 503'; exit 1{{ else }}echo ok{{ end }}"]
"#;
    let dir = chart(
        "proved",
        &[
            (
                "templates/config.yaml",
                &config_map("config", "helm.sh/layer: config"),
            ),
            ("templates/tests/smoke.yaml", smoke),
        ],
    );
    e2e.create(release(
        "proved",
        &dir.path().join("proved"),
        json!({"test": {"enable": true}, "onFailure": "rollback"}),
    ))
    .await;
    let sr = e2e.wait("proved", "Ready", is_ready).await;
    assert_eq!(
        condition(&sr, "TestSuccess").map(|c| (c.0, c.1)),
        Some(("True".to_string(), "TestSucceeded".to_string()))
    );
    let status = sr.status.as_ref().unwrap();
    assert_eq!(status.tests.len(), 1);
    assert_eq!(status.tests[0].name, "smoke");
    assert_eq!(
        status.tests[0].phase,
        sequenced::api::v1alpha1::TestPhase::Succeeded
    );
    // hook-succeeded: the Job is gone once the tests passed.
    assert_eq!(e2e.jobs().await, Vec::<String>::new());

    let patch = json!({"spec": {"values": {"broken": true}}});
    e2e.releases()
        .patch("proved", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let sr = e2e
        .wait("proved", "rolled back after the failed test", |sr| {
            sr.status
                .as_ref()
                .is_some_and(|s| s.phase == Some(ReleasePhase::Ready) && s.revision == Some(3))
        })
        .await;
    let status = sr.status.as_ref().unwrap();
    assert_eq!(status.rollback.as_ref().unwrap().to, 1);
    let remediation = status.remediation.as_ref().expect("status.remediation");
    assert_eq!(remediation.failed_revision, 2);
    let failure = remediation.failure.clone().unwrap_or_default();
    assert!(
        failure.starts_with("test hook Job/smoke (chart proved, templates/tests/smoke.yaml) failed: Job smoke: failed"),
        "{failure}"
    );
    if e2e.kubelet.is_none() {
        // A real kubelet ran the test: the end of its Pod's log is in the status.
        assert!(
            failure.contains("\nlast 2 log lines of pod smoke-"),
            "{failure}"
        );
        assert!(
            failure.ends_with("GET /healthz\nFAIL: /healthz answered 503"),
            "{failure}"
        );
    }
    let phases: Vec<(i64, ReleasePhase)> = status
        .history
        .iter()
        .map(|h| (h.revision, h.phase))
        .collect();
    assert_eq!(
        phases,
        [
            (3, ReleasePhase::Ready),
            (2, ReleasePhase::Failed),
            (1, ReleasePhase::Ready)
        ]
    );
    // The failed test's Job stays (no hook-failed policy), for kubectl logs.
    assert_eq!(e2e.jobs().await, ["smoke"]);
    if let Some(path) = std::env::var_os("SEQUENCED_E2E_KUBECONFIG") {
        let text = support::run_helm(
            std::path::Path::new(&path),
            &["history", "proved", "-o", "json", "-n", &e2e.namespace],
        );
        let history: serde_json::Value = serde_json::from_str(&text).unwrap();
        let statuses: Vec<&str> = history
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, ["superseded", "failed", "deployed"]);
    }
    e2e.finish().await;
}

/// Waits until the 32 shards are held by exactly `replicas`, none above its share.
async fn wait_spread(e2e: &E2e, replicas: &[&str]) {
    let share = 32usize.div_ceil(replicas.len());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let holders = support::operator::shard_holders(&e2e.client, &e2e.namespace).await;
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for h in holders.values() {
            *counts.entry(h.as_str()).or_default() += 1;
        }
        if holders.len() == 32
            && counts.len() == replicas.len()
            && replicas.iter().all(|r| counts.contains_key(r))
            && counts.values().all(|&c| c <= share)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "shards never spread over {replicas:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_three_replicas_share_the_shards_and_a_killed_one_is_taken_over() {
    let mut e2e = setup().await;
    let ns = e2e.namespace.clone();
    let a = e2e.controller.take().unwrap();
    let (b_name, c_name) = (format!("e2e-{ns}-b"), format!("e2e-{ns}-c"));
    let b = Running::start(&e2e.config, b_name.clone(), &ns);
    let c = Running::start(&e2e.config, c_name.clone(), &ns);
    let a_name = format!("e2e-{ns}");
    wait_spread(&e2e, &[&a_name, &b_name, &c_name]).await;
    let chain = chart(
        "chain",
        &[
            (
                "templates/one.yaml",
                &config_map("{{ .Release.Name }}-one", "helm.sh/layer: one"),
            ),
            (
                "templates/two.yaml",
                &config_map(
                    "{{ .Release.Name }}-two",
                    "helm.sh/layer: two\n    helm.sh/depends-on/layers: one",
                ),
            ),
        ],
    );
    let n = 60;
    for i in 0..n {
        e2e.create(release(
            &format!("shard-{i}"),
            &chain.path().join("chain"),
            json!({}),
        ))
        .await;
    }
    for i in 0..n {
        let sr = e2e.wait(&format!("shard-{i}"), "Ready", is_ready).await;
        // Its objects carry its shard, and were applied by its shard's owner only.
        let cm: ConfigMap = Api::namespaced(e2e.client.clone(), &ns)
            .get(&format!("shard-{i}-one"))
            .await
            .unwrap();
        let shard = sequenced::api::shard_of(sr.metadata.uid.as_deref().unwrap(), 32);
        assert_eq!(
            cm.metadata.labels.unwrap().get("sequenced.dev/shard"),
            Some(&shard.to_string())
        );
    }
    // An upgrade of every release, and one replica killed in the middle of it.
    for i in 0..n {
        Api::<SequencedRelease>::namespaced(e2e.client.clone(), &ns)
            .patch(
                &format!("shard-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"values": {"changed": "yes"}}})),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.kill().await;
    wait_spread(&e2e, &[&a_name, &c_name]).await;
    for i in 0..n {
        e2e.wait(&format!("shard-{i}"), "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
        })
        .await;
    }
    c.stop().await;
    e2e.controller = Some(a);
    e2e.finish().await;
}

/// A TCP proxy in front of the cluster's API server that can be cut: its open connections are
/// dropped and new ones closed at once while it is down. What a real API server's restart does to
/// its clients' connections, without killing it (the rest of a restart, its 503s, 403s and 410s,
/// is played by the test API server: tests/outage.rs).
struct Cut {
    addr: std::net::SocketAddr,
    down: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Cut {
    async fn start(target: std::net::SocketAddr) -> Cut {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (down, _) = tokio::sync::watch::channel(false);
        let downs = down.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if *downs.borrow() {
                    continue;
                }
                let mut cut = downs.subscribe();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut inbound, mut outbound) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|down| *down) => {}
                    }
                });
            }
        });
        Cut { addr, down, task }
    }

    fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs"]
async fn e2e_a_release_in_the_middle_of_a_rollout_goes_on_after_the_api_server_was_unreachable() {
    let mut e2e = setup().await;
    // The controller reaches the API server through a proxy that can be cut, under the server's
    // own name for TLS.
    let url = e2e.config.cluster_url.clone();
    let host = url.host().unwrap_or("127.0.0.1").to_string();
    let port = url.port_u16().unwrap_or(443);
    let target = tokio::net::lookup_host((host.as_str(), port))
        .await
        .unwrap()
        .next()
        .expect("the API server's address");
    let cut = Cut::start(target).await;
    let mut config = e2e.config.clone();
    config.tls_server_name = config.tls_server_name.clone().or(Some(host.clone()));
    config.cluster_url = format!("{}://{}", url.scheme_str().unwrap_or("https"), cut.addr)
        .parse()
        .unwrap();
    if let Some(controller) = e2e.controller.take() {
        controller.stop().await;
    }
    let ns = e2e.namespace.clone();
    let controller = Running::start(&config, format!("e2e-{ns}-cut"), &ns);
    let dir = chart(
        "cut",
        &[
            (
                "templates/one.yaml",
                &config_map("one", "helm.sh/layer: one"),
            ),
            (
                "templates/app.yaml",
                &deployment(
                    "app",
                    "helm.sh/layer: app\n    helm.sh/depends-on/layers: one",
                ),
            ),
            (
                "templates/three.yaml",
                &config_map(
                    "three",
                    "helm.sh/layer: three\n    helm.sh/depends-on/layers: app",
                ),
            ),
        ],
    );
    e2e.create(release("cut", &dir.path().join("cut"), json!({})))
        .await;
    e2e.wait("cut", "layer app started", |sr| {
        sr.status.as_ref().is_some_and(|s| {
            s.layers
                .iter()
                .any(|l| l.name == "app" && l.phase != LayerPhase::Pending)
        })
    })
    .await;
    cut.set_down(true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    cut.set_down(false);
    let back = Instant::now();
    // Once the Deployment is available (the cluster's own controllers go on by themselves), the
    // release goes on within 15 s.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(e2e.client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(300);
    let available = loop {
        let ready = deployments
            .get_opt("app")
            .await
            .ok()
            .flatten()
            .is_some_and(|d| {
                d.status
                    .and_then(|s| s.available_replicas)
                    .is_some_and(|n| n >= 1)
            });
        if ready {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the Deployment never became available"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let sr = e2e.wait("cut", "Ready", is_ready).await;
    let after = available.max(back).elapsed();
    assert!(
        after < Duration::from_secs(15),
        "Ready {after:?} after the API server was reachable and the Deployment available"
    );
    assert_eq!(sr.status.and_then(|s| s.revision), Some(1));
    controller.stop().await;
    e2e.finish().await;
}
