//! Runs the controller in-process against the test API server, and plays the kubelet and the
//! built-in controllers by writing status through the server.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::chart::source::ChartCache;
use sequenced::controller::{self, Options, Tenancy};
use sequenced::helm::Helm;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::apiserver::{RecordedRequest, TestApiServer};
pub use crate::charts::repo;

/// A test API server with the CRD installed and a controller running against it.
pub struct Operator {
    pub server: TestApiServer,
    pub client: Client,
    /// The controller's metrics.
    pub metrics: std::sync::Arc<sequenced::metrics::Metrics>,
    controller: Option<Controller>,
}

/// One controller process, run in-process: its requests are recorded as sent by its identity.
pub struct Controller {
    pub identity: String,
    pub metrics: std::sync::Arc<sequenced::metrics::Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    _cache: tempfile::TempDir,
}

impl Controller {
    /// Starts a controller named `identity` against `server`.
    pub fn start(server: &TestApiServer, identity: &str, concurrency: u16) -> Controller {
        Controller::start_with(server, identity, concurrency, Tenancy::default())
    }

    /// Starts a controller named `identity` with the tenancy flags `tenancy`.
    pub fn start_with(
        server: &TestApiServer,
        identity: &str,
        concurrency: u16,
        tenancy: Tenancy,
    ) -> Controller {
        Controller::start_as(server.config_as(identity), identity, concurrency, tenancy)
    }

    /// Starts a controller named `identity` that talks to the server with `config` (an
    /// identity of its own: [`TestApiServer::config_as_user`]).
    pub fn start_as(
        config: kube::Config,
        identity: &str,
        concurrency: u16,
        tenancy: Tenancy,
    ) -> Controller {
        // Shard Leases of 3 s: shards move within a second or two in tests.
        let sharding = sequenced::lock::Sharding {
            lease_duration: Duration::from_secs(3),
            ..sequenced::lock::Sharding::default()
        };
        Controller::start_sharded(config, identity, concurrency, tenancy, sharding)
    }

    /// Starts a controller with its shards kept as `sharding` says.
    pub fn start_sharded(
        config: kube::Config,
        identity: &str,
        concurrency: u16,
        tenancy: Tenancy,
        sharding: sequenced::lock::Sharding,
    ) -> Controller {
        Controller::start_configured(config, identity, concurrency, |options| {
            options.tenancy = tenancy;
            options.sharding = sharding;
        })
    }

    /// Starts a controller named `identity` talking with `config`, with the options of
    /// [`Controller::start_as`] (no tenancy flags, 3 s shard Leases, a chart cache of its own
    /// in a temporary directory, [`Controller::cache_dir`]) changed by `configure`.
    pub fn start_configured(
        config: kube::Config,
        identity: &str,
        concurrency: u16,
        configure: impl FnOnce(&mut Options),
    ) -> Controller {
        let cache = tempfile::tempdir().expect("cache dir");
        let mut options = Options {
            helm: Helm::at(crate::helm()),
            kubectl: sequenced::kubectl::Kubectl::at(crate::kubectl()),
            cache: ChartCache::new(cache.path()),
            concurrency,
            identity: identity.to_string(),
            metrics: std::sync::Arc::new(sequenced::metrics::Metrics::new().unwrap()),
            tenancy: Tenancy::default(),
            sharding: sequenced::lock::Sharding {
                lease_duration: Duration::from_secs(3),
                ..sequenced::lock::Sharding::default()
            },
            drift_full_check_interval: sequenced::controller::DRIFT_FULL_CHECK_INTERVAL,
            take_pending_after: sequenced::rollout::takeover::DEFAULT_PENDING_BOUND,
        };
        configure(&mut options);
        let metrics = options.metrics.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = controller::run(config, options, shutdown).await {
                panic!("the controller stopped: {e}");
            }
        });
        Controller {
            identity: identity.to_string(),
            metrics,
            stop: Some(stop),
            task: Some(task),
            _cache: cache,
        }
    }

    /// The directory of the controller's chart cache (unless `configure` gave it another).
    pub fn cache_dir(&self) -> &std::path::Path {
        self._cache.path()
    }

    /// Stops the controller as SIGTERM does, and waits until it has exited; how long that took.
    pub async fn stop(mut self) -> Duration {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("the controller exits after the signal")
                .expect("the controller task");
        }
        started.elapsed()
    }

    /// Kills the controller: it stops wherever it is, releases nothing and writes nothing more.
    pub async fn kill(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Installs the SequencedRelease CRD from crds/ and waits until it is served.
pub async fn install_crd(client: &Client) {
    let text =
        std::fs::read_to_string(repo().join("crds/sequencedrelease.yaml")).expect("CRD file");
    let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("CRD YAML");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.create(&PostParams::default(), &crd)
        .await
        .expect("create the CRD");
    let releases: Api<SequencedRelease> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while releases.list(&Default::default()).await.is_err() {
        assert!(Instant::now() < deadline, "the CRD is never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Operator {
    /// A fresh server, the CRD, and a controller reconciling `concurrency` releases at once.
    pub async fn start(concurrency: u16) -> Operator {
        let mut operator = Operator::without_controller().await;
        let controller = operator.spawn("test-controller", concurrency);
        operator.metrics = controller.metrics.clone();
        operator.controller = Some(controller);
        operator
    }

    /// [`Operator::start`] with a controller run with the tenancy flags `tenancy`.
    pub async fn start_with(concurrency: u16, tenancy: Tenancy) -> Operator {
        let mut operator = Operator::without_controller().await;
        let controller =
            Controller::start_with(&operator.server, "test-controller", concurrency, tenancy);
        operator.metrics = controller.metrics.clone();
        operator.controller = Some(controller);
        operator
    }

    /// A fresh server with the CRD, and no controller yet.
    pub async fn without_controller() -> Operator {
        let server = TestApiServer::start().await;
        let client = server.client();
        install_crd(&client).await;
        Operator {
            server,
            client,
            metrics: std::sync::Arc::new(sequenced::metrics::Metrics::new().unwrap()),
            controller: None,
        }
    }

    /// Another controller process against the same server.
    pub fn spawn(&self, identity: &str, concurrency: u16) -> Controller {
        Controller::start(&self.server, identity, concurrency)
    }

    /// Makes `controller` the one [`Operator::stop`] stops (its metrics, the operator's).
    pub fn adopt(&mut self, controller: Controller) {
        self.metrics = controller.metrics.clone();
        self.controller = Some(controller);
    }

    /// The controller's chart cache directory.
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.controller.as_ref().map(Controller::cache_dir)
    }

    /// The controller [`Operator::start`] started, for a test to stop or kill.
    pub fn take_controller(&mut self) -> Controller {
        self.controller.take().expect("a controller")
    }

    /// Stops the controller and waits for it.
    pub async fn stop(mut self) {
        if let Some(controller) = self.controller.take() {
            controller.stop().await;
        }
    }

    pub async fn namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
    }

    /// Creates a SequencedRelease from its JSON.
    pub async fn create(&self, namespace: &str, release: Value) -> SequencedRelease {
        let api: Api<SequencedRelease> = Api::namespaced(self.client.clone(), namespace);
        let sr: SequencedRelease = serde_json::from_value(release).expect("release JSON");
        api.create(&PostParams::default(), &sr)
            .await
            .expect("create the release")
    }

    pub fn releases(&self, namespace: &str) -> Api<SequencedRelease> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Merges `spec` into the spec of release `name` in `default` (a JSON merge patch).
    pub async fn patch_spec(&self, name: &str, spec: Value) {
        self.releases("default")
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await
            .expect("patch the release's spec");
    }

    /// Waits until the release satisfies `check`; panics with its last status otherwise.
    pub async fn wait_release(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        check: impl Fn(&SequencedRelease) -> bool,
    ) -> SequencedRelease {
        let api = self.releases(namespace);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = None;
        while Instant::now() < deadline {
            if let Ok(Some(sr)) = api.get_opt(name).await {
                if check(&sr) {
                    return sr;
                }
                last = Some(sr);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "{namespace}/{name} never got {what}; last status: {}",
            serde_json::to_string_pretty(&last.and_then(|s| s.status)).unwrap_or_default()
        );
    }

    /// Waits until the release is gone (its uninstall finished and the finalizer was dropped).
    pub async fn wait_deleted(&self, namespace: &str, name: &str) {
        self.wait_deleted_within(namespace, name, Duration::from_secs(60))
            .await;
    }

    /// [`Operator::wait_deleted`], failing the test once `within` has passed.
    pub async fn wait_deleted_within(&self, namespace: &str, name: &str, within: Duration) {
        let started = Instant::now();
        while let Some(sr) = self
            .releases(namespace)
            .get_opt(name)
            .await
            .expect("read the release")
        {
            assert!(
                started.elapsed() < within,
                "{namespace}/{name} was never removed (still there after {within:?}): {:?}",
                sr.status
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until an event with `reason` about release `namespace/name` is recorded; its note.
    pub async fn wait_event(&self, namespace: &str, name: &str, reason: &str) -> String {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), namespace);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let found = events
                .list(&Default::default())
                .await
                .expect("list events")
                .items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        && e.reason.as_deref() == Some(reason)
                });
            if let Some(event) = found {
                return event.note.unwrap_or_default();
            }
            assert!(
                Instant::now() < deadline,
                "no {reason} event about {namespace}/{name}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the server holds `kind/name`, or panics.
    pub async fn wait_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(object) = self.server.object(api_version, kind, Some(namespace), name) {
                return object;
            }
            assert!(
                Instant::now() < deadline,
                "{kind} {namespace}/{name} never appeared"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Who holds each shard Lease (in `default`, where the testkit's controllers keep them).
    pub async fn shard_holders(&self) -> std::collections::BTreeMap<u32, String> {
        shard_holders(&self.client, "default").await
    }

    /// Waits until the 32 shards are held by `replicas` and by nobody else, evenly (none holds
    /// more than its share, `ceil(32 / n)`); the holders' counts.
    pub async fn wait_shards_spread(
        &self,
        replicas: &[&str],
    ) -> std::collections::BTreeMap<String, usize> {
        let share = 32usize.div_ceil(replicas.len());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let holders = self.shard_holders().await;
            let mut counts = std::collections::BTreeMap::new();
            for holder in holders.values() {
                *counts.entry(holder.clone()).or_insert(0usize) += 1;
            }
            let spread = holders.len() == 32
                && counts.len() == replicas.len()
                && replicas.iter().all(|r| counts.contains_key(*r))
                && counts.values().all(|&c| c <= share);
            if spread {
                return counts;
            }
            assert!(
                Instant::now() < deadline,
                "the shards never spread over {replicas:?}: {counts:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Plays the Deployment controller and the kubelet: the Deployment's Pods are all available.
    pub fn deployment_ready(&self, namespace: &str, name: &str) -> bool {
        mark_deployment_ready(&self.server, namespace, name)
    }

    /// Marks every Deployment the server holds ready, every 20 ms, until the returned guard drops.
    pub fn kubelet(&self) -> Kubelet {
        self.server.deployment_controller(Duration::ZERO)
    }

    /// The write requests (apply, create, update, patch, delete) the controller sent for `kind`,
    /// as `(verb, namespace/name)`, in order.
    pub fn writes(&self, kind: &str) -> Vec<(String, String)> {
        self.server
            .requests()
            .iter()
            .filter(|r| is_write(r) && r.kind.as_deref() == Some(kind))
            .map(|r| {
                (
                    r.verb.to_string(),
                    format!(
                        "{}/{}",
                        r.namespace.clone().unwrap_or_default(),
                        r.name.clone().unwrap_or_default()
                    ),
                )
            })
            .collect()
    }

    /// When the first server-side apply of `kind` `namespace/name` arrived.
    pub fn first_apply(&self, kind: &str, namespace: &str, name: &str) -> Option<Instant> {
        self.server
            .requests()
            .iter()
            .find(|r| {
                r.verb == "apply"
                    && r.kind.as_deref() == Some(kind)
                    && r.namespace.as_deref() == Some(namespace)
                    && r.name.as_deref() == Some(name)
                    && r.status < 300
            })
            .map(|r| r.at)
    }
}

impl TestApiServer {
    /// Plays the Deployment controller and the kubelet until the returned guard drops: looks
    /// every 20 ms, and marks a Deployment whose status is not of its current generation ready
    /// (all its replicas available) once it has been seen at that generation for `delay`.
    pub fn deployment_controller(&self, delay: Duration) -> Kubelet {
        let server = self.clone();
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::all(self.client());
        let handle = tokio::spawn(async move {
            // When each Deployment (by uid) was first seen at its current generation.
            let mut seen: std::collections::HashMap<String, (Value, Instant)> =
                std::collections::HashMap::new();
            loop {
                let names: Vec<(String, String)> = match deployments.list(&Default::default()).await
                {
                    Ok(list) => list
                        .items
                        .iter()
                        .map(|d| {
                            (
                                d.metadata.namespace.clone().unwrap_or_default(),
                                d.metadata.name.clone().unwrap_or_default(),
                            )
                        })
                        .collect(),
                    Err(_) => Vec::new(),
                };
                for (namespace, name) in names {
                    let Some(object) =
                        server.object("apps/v1", "Deployment", Some(&namespace), &name)
                    else {
                        continue;
                    };
                    let generation = object
                        .pointer("/metadata/generation")
                        .cloned()
                        .unwrap_or(Value::Null);
                    if Some(&generation) == object.pointer("/status/observedGeneration") {
                        continue;
                    }
                    let uid = object
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let since = match seen.get(&uid) {
                        Some((at_generation, since)) if *at_generation == generation => *since,
                        _ => {
                            seen.insert(uid, (generation, Instant::now()));
                            Instant::now()
                        }
                    };
                    if since.elapsed() >= delay {
                        mark_deployment_ready(&server, &namespace, &name);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Kubelet(handle)
    }
}

/// Writes the status the Deployment controller writes once all of a Deployment's Pods are
/// available; false when the Deployment does not exist.
pub fn mark_deployment_ready(server: &TestApiServer, namespace: &str, name: &str) -> bool {
    let Some(object) = server.object("apps/v1", "Deployment", Some(namespace), name) else {
        return false;
    };
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let replicas = object
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    server.set_status(
        "apps/v1",
        "Deployment",
        Some(namespace),
        name,
        json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability."},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": format!("ReplicaSet \"{name}-5d4f8c\" has successfully progressed.")}
            ]
        }),
    )
}

/// Whether a request writes for a release (a dry run does not, nor the renewal of the replicas'
/// shard and member Leases, which belong to no release: [`is_shard_keeping`]).
pub fn is_write(r: &RecordedRequest) -> bool {
    matches!(
        r.verb,
        "create" | "update" | "patch" | "apply" | "delete" | "deletecollection"
    ) && !is_dry_run(r)
        && !is_shard_keeping(r)
}

/// Who holds each shard Lease of `namespace` (where controllers keep them): shard number to
/// holder, for the shards whose Lease names one.
pub async fn shard_holders(
    client: &Client,
    namespace: &str,
) -> std::collections::BTreeMap<u32, String> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), namespace);
    let listed = leases
        .list(&kube::api::ListParams::default().labels("sequenced.dev/lease=shard"))
        .await
        .expect("list the shard Leases");
    listed
        .items
        .into_iter()
        .filter_map(|lease| {
            let n = lease.metadata.labels.as_ref()?.get("sequenced.dev/shard")?;
            let holder = lease.spec?.holder_identity.filter(|h| !h.is_empty())?;
            Some((n.parse().ok()?, holder))
        })
        .collect()
}

/// Whether a request keeps the replicas' shards: the shard and member Leases (listed, renewed,
/// claimed and given back every few seconds), which belong to no release.
pub fn is_shard_keeping(r: &RecordedRequest) -> bool {
    if r.kind.as_deref() != Some("Lease") {
        return false;
    }
    let named = r
        .name
        .as_deref()
        .is_some_and(|n| n.starts_with("sequenced.shard.") || n.starts_with("sequenced.member."));
    let labelled = r
        .body
        .as_ref()
        .and_then(|b| b.pointer("/metadata/labels"))
        .and_then(|l| l.get(sequenced::api::SHARD_LEASE_LABEL))
        .is_some();
    let listed = r.query.contains("labelSelector=sequenced.dev%2Flease")
        || r.query.contains("labelSelector=sequenced.dev/lease");
    named || labelled || listed
}

/// Whether a request asked for a dry run (`dryRun=All`): the drift check's applies.
pub fn is_dry_run(r: &RecordedRequest) -> bool {
    r.query.split('&').any(|p| p == "dryRun=All")
}

/// Stops the kubelet loop when dropped.
pub struct Kubelet(tokio::task::JoinHandle<()>);

impl From<tokio::task::JoinHandle<()>> for Kubelet {
    fn from(handle: tokio::task::JoinHandle<()>) -> Kubelet {
        Kubelet(handle)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.0.abort();
    }
}
