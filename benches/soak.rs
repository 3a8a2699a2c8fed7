//! kill -9 at every stage of every operation: a `sequenced run` process is killed with SIGKILL
//! at each of the stages below and a new one started (the same identity, as when the kubelet
//! restarts the container of a killed process; `--new-identity`: another one, as when the pod
//! is replaced), against the in-process test API server (its requests can be held: the process
//! is killed while the server holds the very request that marks the stage, which then never
//! reaches it). Each trial checks that the release ends in the state the operation would have
//! reached, on the right revision; that each hook ran as often as Helm allows (these hooks have
//! no `before-hook-creation` policy: once per revision); that no object of a layer the status
//! said was done was applied again; that every release record is there (none after an
//! uninstall); and that the lock is released. Per stage: trials, recovered, median and max
//! time from the kill to the final state.
//!
//! `cargo bench --bench soak` runs 100 trials per stage; `cargo bench --bench soak -- 20` runs
//! 20; `-- --stage prune 20` one stage. Without `--bench` (and as the test `soak_short`, which
//! CI runs through `cargo nextest run --all-targets`) it runs 2 trials per stage.

use sequenced_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use sequenced::api::v1alpha1::SequencedRelease;
use serde_json::{Value, json};
use support::apiserver::{RecordedRequest, TestApiServer};
use support::charts::{chart, is_ready, release};
use support::operator::{Kubelet, install_crd};

/// Where every trial's release lives.
const NS: &str = "soak";
/// The release's name.
const NAME: &str = "soak";
/// The controller's identity.
const IDENTITY: &str = "soak-controller";
/// How long a trial may take to reach its kill point, and then its final state.
const BOUND: Duration = Duration::from_secs(120);

/// The stages at which the controller is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    PreInstallHook,
    HookSucceeded,
    InstallLayer,
    UpgradeLayer,
    Prune,
    Rollback,
    UninstallLayers,
    PostDeleteHook,
    DriftCorrection,
    ShardMove,
}

const STAGES: [Stage; 10] = [
    Stage::PreInstallHook,
    Stage::HookSucceeded,
    Stage::InstallLayer,
    Stage::UpgradeLayer,
    Stage::Prune,
    Stage::Rollback,
    Stage::UninstallLayers,
    Stage::PostDeleteHook,
    Stage::DriftCorrection,
    Stage::ShardMove,
];

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::PreInstallHook => "pre-install-hook",
            Stage::HookSucceeded => "hook-succeeded",
            Stage::InstallLayer => "install-layer",
            Stage::UpgradeLayer => "upgrade-layer",
            Stage::Prune => "prune",
            Stage::Rollback => "rollback",
            Stage::UninstallLayers => "uninstall-layers",
            Stage::PostDeleteHook => "post-delete-hook",
            Stage::DriftCorrection => "drift-correction",
            Stage::ShardMove => "shard-move",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Stage::PreInstallHook => "a pre-install hook running",
            Stage::HookSucceeded => "between a hook's success and its hook-succeeded deletion",
            Stage::InstallLayer => "mid-layer of an install",
            Stage::UpgradeLayer => "mid-layer of an upgrade with objects to prune",
            Stage::Prune => "during prune",
            Stage::Rollback => "mid-way through a rollback",
            Stage::UninstallLayers => "between two layers of an uninstall",
            Stage::PostDeleteHook => "during a post-delete hook",
            Stage::DriftCorrection => "during a drift correction",
            Stage::ShardMove => "while a shard moves between replicas",
        }
    }

    /// What the release ends as: Ready at this revision, or gone (None).
    fn final_revision(self) -> Option<i64> {
        match self {
            Stage::PreInstallHook
            | Stage::HookSucceeded
            | Stage::InstallLayer
            | Stage::DriftCorrection
            | Stage::ShardMove => Some(1),
            Stage::UpgradeLayer | Stage::Prune => Some(2),
            Stage::Rollback => Some(3),
            Stage::UninstallLayers | Stage::PostDeleteHook => None,
        }
    }

    /// How many times each hook Job runs in the whole trial, as Helm runs them.
    fn hook_runs(self) -> [(&'static str, usize); 2] {
        let pre = match self {
            Stage::UpgradeLayer | Stage::Prune | Stage::Rollback => 2,
            _ => 1,
        };
        let cleanup = match self {
            Stage::UninstallLayers | Stage::PostDeleteHook => 1,
            _ => 0,
        };
        [("pre", pre), ("cleanup", cleanup)]
    }
}

/// The chart: a pre-install/pre-upgrade hook Job `pre` and a post-delete hook Job `cleanup`
/// (both `hook-succeeded`, no `before-hook-creation`: each runs once per revision); layer l1
/// (ConfigMaps a1, a2), l2 (b1, b2, b3, and b4, b5 while `extra`), l3 (Deployment app and
/// ConfigMap c1), each after the one before. Every ConfigMap carries `.Values.version`.
fn soak_chart() -> tempfile::TempDir {
    let config_map = |name: &str, layer: &str, after: Option<&str>| {
        let after = after
            .map(|l| format!("\n    helm.sh/depends-on/layers: {l}"))
            .unwrap_or_default();
        format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  annotations:\n    helm.sh/layer: {layer}{after}\ndata:\n  version: {{{{ .Values.version | quote }}}}\n"
        )
    };
    let job = |name: &str, hook: &str| {
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  annotations:\n    helm.sh/hook: {hook}\n    helm.sh/hook-delete-policy: hook-succeeded\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: main\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", \"true\"]\n"
        )
    };
    let l1 = format!(
        "{}{}",
        config_map("a1", "l1", None),
        config_map("a2", "l1", None)
    );
    let mut l2: String = ["b1", "b2", "b3"]
        .iter()
        .map(|n| config_map(n, "l2", Some("l1")))
        .collect();
    l2.push_str("{{- if .Values.extra }}\n");
    l2.push_str(&config_map("b4", "l2", Some("l1")));
    l2.push_str(&config_map("b5", "l2", Some("l1")));
    l2.push_str("{{- end }}\n");
    let l3 = format!(
        "{}---\n{}",
        config_map("c1", "l3", Some("l2")),
        support::charts::deployment(
            "app",
            "helm.sh/layer: l3\n    helm.sh/depends-on/layers: l2"
        )
    );
    chart(
        "soak",
        &[
            ("values.yaml", "version: 1\nextra: true\n"),
            ("templates/pre.yaml", &job("pre", "pre-install,pre-upgrade")),
            ("templates/cleanup.yaml", &job("cleanup", "post-delete")),
            ("templates/l1.yaml", &l1),
            ("templates/l2.yaml", &l2),
            ("templates/l3.yaml", &l3),
        ],
    )
}

/// The objects of each layer of the chart (both values).
fn layer_objects(layer: &str) -> &'static [&'static str] {
    match layer {
        "l1" => &["a1", "a2"],
        "l2" => &["b1", "b2", "b3", "b4", "b5"],
        "l3" => &["app", "c1"],
        _ => &[],
    }
}

/// Where a process's log goes: a new file in `$SOAK_LOGS` when set (to look into a trial that
/// failed), else nowhere.
fn log_file(identity: &str) -> Stdio {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let Some(dir) = std::env::var_os("SOAK_LOGS") else {
        return Stdio::null();
    };
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let path = Path::new(&dir).join(format!("{n:05}-{identity}.log"));
    match std::fs::File::create(&path) {
        Ok(file) => Stdio::from(file),
        Err(_) => Stdio::null(),
    }
}

/// One `sequenced run` process.
struct Process {
    child: Child,
}

impl Process {
    fn start(kubeconfig: &Path, identity: &str, shard_lease: &str) -> Process {
        let child = Command::new(env!("CARGO_BIN_EXE_sequenced"))
            .args([
                "run",
                "--metrics-addr",
                "127.0.0.1:0",
                "--identity",
                identity,
                "--shard-namespace",
                "default",
                "--shard-lease-duration",
                shard_lease,
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", kubeconfig.parent().unwrap_or(Path::new("/tmp")))
            .env("SEQUENCED_HELM", support::helm())
            .env(
                "RUST_LOG",
                std::env::var("SOAK_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            )
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(identity))
            .spawn()
            .expect("start sequenced run");
        Process { child }
    }

    /// SIGKILL, and the process reaped.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One trial's outcome: the time from the kill to the final state, or what went wrong.
type Outcome = Result<Duration, String>;

/// The stored release (read in-process).
fn stored(server: &TestApiServer) -> Option<SequencedRelease> {
    let object = server.object("sequenced.dev/v1alpha1", "SequencedRelease", Some(NS), NAME)?;
    serde_json::from_value(object).ok()
}

fn revision(sr: &SequencedRelease) -> Option<i64> {
    sr.status.as_ref().and_then(|s| s.revision)
}

/// Waits until `check` holds on the server, at most [`BOUND`].
async fn until(
    server: &TestApiServer,
    what: &str,
    check: impl Fn(&TestApiServer) -> bool,
) -> Result<(), String> {
    if server.wait_until(BOUND, check).await {
        Ok(())
    } else {
        Err(format!(
            "never {what}; the release: {}",
            stored(server)
                .and_then(|sr| sr.status)
                .map(|s| format!("{:?} {:?}", s.phase, s.message))
                .unwrap_or_else(|| "gone".into())
        ))
    }
}

fn ready_at(server: &TestApiServer, rev: i64) -> bool {
    stored(server).is_some_and(|sr| is_ready(&sr) && revision(&sr) == Some(rev))
}

fn exists(server: &TestApiServer, api_version: &str, kind: &str, name: &str) -> bool {
    server.object(api_version, kind, Some(NS), name).is_some()
}

/// Holds the next request `method` on `contains`, waits for it, kills `process` while it is
/// held, and drops it: the kill lands at that very point.
async fn kill_at(
    server: &TestApiServer,
    process: Process,
    method: &str,
    contains: &str,
    then: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), String> {
    server.hold(method, contains, None);
    then.await?;
    if !server.wait_held(BOUND).await {
        server.drop_held();
        return Err(format!("the controller never sent {method} {contains}"));
    }
    process.kill();
    server.drop_held();
    Ok(())
}

/// Patches the release's spec as a user would.
async fn patch_spec(client: &kube::Client, spec: Value) -> Result<(), String> {
    let api: Api<SequencedRelease> = Api::namespaced(client.clone(), NS);
    api.patch(
        NAME,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("patching the release: {e}"))
}

/// Successful applies of `name` (ConfigMaps and Deployments of the chart) after `since`.
fn applies_after(requests: &[RecordedRequest], since: Instant, name: &str) -> usize {
    requests
        .iter()
        .filter(|r| {
            r.at > since
                && r.verb == "apply"
                && r.status < 300
                && !r.query.split('&').any(|p| p == "dryRun=All")
                && r.namespace.as_deref() == Some(NS)
                && r.name.as_deref() == Some(name)
                && matches!(r.kind.as_deref(), Some("ConfigMap" | "Deployment"))
        })
        .count()
}

/// One trial of `stage` with the chart at `chart`; with `$SOAK_LOGS`, the requests of a trial
/// that failed are written there.
async fn trial(stage: Stage, chart: &Path, new_identity: bool) -> Outcome {
    let server = TestApiServer::start().await;
    let outcome = trial_on(&server, stage, chart, new_identity).await;
    if outcome
        .as_ref()
        .is_err_and(|e| !e.contains("not this stage"))
        && let Some(dir) = std::env::var_os("SOAK_LOGS")
    {
        let lines: Vec<String> = server
            .requests()
            .iter()
            .map(|r| {
                let body = r
                    .body
                    .as_ref()
                    .map(|b| b.to_string().chars().take(600).collect::<String>())
                    .unwrap_or_default();
                format!(
                    "{:?} {} {} {}?{} {}",
                    r.at, r.status, r.method, r.path, r.query, body
                )
            })
            .collect();
        let name = format!("{}-{}.requests", stage.name(), fastrand::u32(..));
        let _ = std::fs::write(Path::new(&dir).join(name), lines.join("\n"));
    }
    outcome
}

async fn trial_on(
    server: &TestApiServer,
    stage: Stage,
    chart: &Path,
    new_identity: bool,
) -> Outcome {
    let server = server.clone();
    let admin = server.client();
    install_crd(&admin).await;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let kubeconfig = support::kubeconfig(&dir, &server.url(), NS);
    {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        namespaces
            .create(&Default::default(), &ns)
            .await
            .map_err(|e| e.to_string())?;
    }
    // The Job controller and kubelet: a hook Job runs for 800 ms.
    let _jobs = server.job_controller(Duration::from_millis(800));
    let kubelet: Option<Kubelet>;
    let releases: Api<SequencedRelease> = Api::namespaced(admin.clone(), NS);
    let create = || async {
        let sr: SequencedRelease =
            serde_json::from_value(release(NAME, &chart.join("soak"), json!({}))).unwrap();
        releases
            .create(&Default::default(), &sr)
            .await
            .map(|_| ())
            .map_err(|e| format!("creating the release: {e}"))
    };
    let lease = "15s";
    let mut controller = Process::start(&kubeconfig, IDENTITY, lease);
    let mut others: Vec<Process> = Vec::new();
    // To the stage, where the controller is killed.
    match stage {
        Stage::PreInstallHook => {
            kubelet = Some(server.deployment_controller(Duration::ZERO));
            create().await?;
            until(&server, "ran the pre-install hook", |s| {
                exists(s, "batch/v1", "Job", "pre")
            })
            .await?;
            controller.kill();
        }
        Stage::HookSucceeded => {
            kubelet = Some(server.deployment_controller(Duration::ZERO));
            kill_at(&server, controller, "DELETE", "/jobs/pre", create()).await?;
        }
        Stage::InstallLayer => {
            kubelet = Some(server.deployment_controller(Duration::ZERO));
            kill_at(&server, controller, "PATCH", "/configmaps/b2?", create()).await?;
        }
        Stage::UpgradeLayer | Stage::Prune | Stage::Rollback => {
            kubelet = Some(server.deployment_controller(Duration::ZERO));
            create().await?;
            until(&server, "Ready", |s| ready_at(s, 1)).await?;
            let upgrade = patch_spec(&admin, json!({"values": {"version": 2, "extra": false}}));
            match stage {
                Stage::UpgradeLayer => {
                    kill_at(&server, controller, "PATCH", "/configmaps/b2?", upgrade).await?;
                }
                Stage::Prune => {
                    // The first delete of the two objects to prune (b4 and b5, deleted at once).
                    kill_at(&server, controller, "DELETE", "/configmaps/b", upgrade).await?;
                }
                _ => {
                    upgrade.await?;
                    until(&server, "Ready at revision 2", |s| ready_at(s, 2)).await?;
                    let rollback = async {
                        releases
                            .patch(
                                NAME,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"metadata": {"annotations": {
                                    "rollback.sequenced.dev/requestedAt": "soak",
                                    "rollback.sequenced.dev/revision": "1",
                                }}})),
                            )
                            .await
                            .map(|_| ())
                            .map_err(|e| format!("requesting a rollback: {e}"))
                    };
                    kill_at(&server, controller, "PATCH", "/configmaps/b2?", rollback).await?;
                }
            }
        }
        Stage::UninstallLayers | Stage::PostDeleteHook => {
            kubelet = Some(server.deployment_controller(Duration::ZERO));
            create().await?;
            until(&server, "Ready", |s| ready_at(s, 1)).await?;
            let delete = async {
                releases
                    .delete(NAME, &Default::default())
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("deleting the release: {e}"))
            };
            if stage == Stage::UninstallLayers {
                // The first delete of layer l2's objects: l3 is gone, l2 not started.
                kill_at(&server, controller, "DELETE", "/configmaps/b", delete).await?;
            } else {
                delete.await?;
                until(&server, "ran the post-delete hook", |s| {
                    exists(s, "batch/v1", "Job", "cleanup")
                })
                .await?;
                controller.kill();
            }
        }
        Stage::DriftCorrection => {
            kubelet = Some(server.deployment_controller(Duration::ZERO));
            create().await?;
            until(&server, "Ready", |s| ready_at(s, 1)).await?;
            let drift = async {
                let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
                    Api::namespaced(admin.clone(), NS);
                configmaps
                    .delete("a1", &Default::default())
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("deleting a1: {e}"))
            };
            kill_at(&server, controller, "PATCH", "/configmaps/a1?", drift).await?;
        }
        Stage::ShardMove => {
            // The release waits for its Deployment while a second replica starts and this one
            // gives it the release's shard: killed as it writes that shard's Lease.
            create().await?;
            until(&server, "waiting for app", |s| {
                exists(s, "apps/v1", "Deployment", "app")
            })
            .await?;
            let uid = stored(&server)
                .and_then(|sr| sr.metadata.uid)
                .ok_or("the release has no uid")?;
            let shard = sequenced::api::shard_of(&uid, sequenced::lock::shards::DEFAULT_SHARDS);
            if shard < sequenced::lock::shards::DEFAULT_SHARDS / 2 {
                // This replica keeps the lower half; start the other first so that it keeps it.
                return Err(format!(
                    "shard {shard} stays with its replica: not this stage"
                ));
            }
            let start_other = async {
                others.push(Process::start(&kubeconfig, "soak-other", lease));
                Ok(())
            };
            kill_at(
                &server,
                controller,
                "PUT",
                &format!("/leases/{}", sequenced::lock::shards::shard_lease(shard)),
                start_other,
            )
            .await?;
            kubelet = Some(server.deployment_controller(Duration::ZERO));
        }
    }
    let killed = Instant::now();
    // What the status said was done when it was killed.
    let done: BTreeSet<&str> = stored(&server)
        .and_then(|sr| sr.status)
        .map(|status| {
            status
                .layers
                .iter()
                .filter(|l| {
                    l.phase == sequenced::api::v1alpha1::LayerPhase::Ready
                        && matches!(l.name.as_str(), "l1" | "l2" | "l3")
                })
                .flat_map(|l| layer_objects(&l.name).iter().copied())
                .collect()
        })
        .unwrap_or_default();
    let identity = if new_identity {
        "soak-replacement"
    } else {
        IDENTITY
    };
    controller = Process::start(&kubeconfig, identity, lease);
    // The final state.
    match stage.final_revision() {
        Some(rev) => {
            until(&server, &format!("Ready at revision {rev}"), |s| {
                ready_at(s, rev)
            })
            .await?
        }
        None => until(&server, "uninstalled", |s| stored(s).is_none()).await?,
    }
    let took = killed.elapsed();
    // The lock is released right after the last status write.
    let lock_name = sequenced::lock::lease_name(NAME);
    let released = |s: &TestApiServer| {
        s.object("coordination.k8s.io/v1", "Lease", Some(NS), &lock_name)
            .is_none_or(|l| {
                l.pointer("/spec/holderIdentity")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            })
    };
    server.wait_until(Duration::from_secs(10), released).await;
    drop(kubelet);
    // What it should be.
    let requests = server.requests();
    let mut wrong = Vec::new();
    for (hook, runs) in stage.hook_runs() {
        let created = requests
            .iter()
            .filter(|r| {
                matches!(r.verb, "create" | "apply")
                    && r.status == 201
                    && r.kind.as_deref() == Some("Job")
                    && r.name.as_deref() == Some(hook)
            })
            .count();
        if created != runs {
            wrong.push(format!("hook {hook} ran {created} times, not {runs}"));
        }
    }
    for name in &done {
        if stage == Stage::DriftCorrection && *name == "a1" {
            continue;
        }
        let again = applies_after(&requests, killed, name);
        if again > 0 {
            wrong.push(format!(
                "{name} applied {again} more time(s) after the status said its layer was done"
            ));
        }
    }
    let secrets = server.objects("v1", "Secret", Some(NS));
    let records: BTreeSet<String> = secrets
        .iter()
        .filter_map(|s| s.pointer("/metadata/name").and_then(Value::as_str))
        .filter(|n| n.starts_with("sh.helm.release.v1.soak.v"))
        .map(String::from)
        .collect();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let lock = leases
        .get_opt(&sequenced::lock::lease_name(NAME))
        .await
        .map_err(|e| e.to_string())?;
    let holder = lock
        .as_ref()
        .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        .filter(|h| !h.is_empty());
    match stage.final_revision() {
        Some(rev) => {
            let expected: BTreeSet<String> = (1..=rev)
                .map(|n| format!("sh.helm.release.v1.soak.v{n}"))
                .collect();
            if records != expected {
                wrong.push(format!("records {records:?}, not {expected:?}"));
            }
            if let Some(holder) = holder {
                wrong.push(format!("the lock is still held by {holder}"));
            }
            let extra = exists(&server, "v1", "ConfigMap", "b4");
            let wanted_extra = stage != Stage::UpgradeLayer && stage != Stage::Prune;
            if extra != wanted_extra {
                wrong.push(format!("b4 exists: {extra}, should: {wanted_extra}"));
            }
            for name in ["a1", "a2", "b1", "b2", "b3", "c1"] {
                if !exists(&server, "v1", "ConfigMap", name) {
                    wrong.push(format!("{name} is missing"));
                }
            }
        }
        None => {
            if !records.is_empty() {
                wrong.push(format!("records left: {records:?}"));
            }
            if lock.is_some() {
                wrong.push("the lock Lease is left".into());
            }
            let left: Vec<String> = server
                .objects("v1", "ConfigMap", Some(NS))
                .iter()
                .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str))
                .filter(|n| *n != "kube-root-ca.crt")
                .map(String::from)
                .collect();
            if !left.is_empty() {
                wrong.push(format!("objects left: {left:?}"));
            }
        }
    }
    controller.kill();
    drop(others);
    if wrong.is_empty() {
        Ok(took)
    } else {
        Err(wrong.join("; "))
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `trials` trials of each stage; prints the table; false when one did not recover.
fn run(stages: &[Stage], trials: usize, new_identity: bool) -> bool {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let chart_dir = soak_chart();
    let mut all_recovered = true;
    let mut rows: BTreeMap<Stage, (usize, Vec<Duration>, Vec<String>)> = BTreeMap::new();
    for &stage in stages {
        let mut times = Vec::new();
        let mut failures = Vec::new();
        let mut ran = 0;
        let mut skipped = 0;
        while ran < trials {
            let outcome = runtime.block_on(trial(stage, chart_dir.path(), new_identity));
            match outcome {
                // A release whose shard its replica keeps: not this stage; another trial.
                Err(e) if e.contains("not this stage") && skipped < trials * 10 => {
                    skipped += 1;
                    continue;
                }
                Ok(took) => times.push(took),
                Err(e) => {
                    eprintln!("{} trial {}: {e}", stage.name(), ran + 1);
                    failures.push(e);
                }
            }
            ran += 1;
        }
        times.sort();
        all_recovered &= failures.is_empty();
        println!(
            "{:<62} trials {:>3}  recovered {:>3}  median {:>6.2} s  max {:>6.2} s",
            format!("{} ({})", stage.describe(), stage.name()),
            ran,
            times.len(),
            percentile(&times, 0.5).as_secs_f64(),
            times.last().copied().unwrap_or_default().as_secs_f64()
        );
        rows.insert(stage, (ran, times, failures));
    }
    all_recovered
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // The test runners' protocol (nextest lists tests with `--list --format terse`, then runs
    // each by name): one test, the short mode.
    if args.iter().any(|a| a == "--list") {
        if !args.iter().any(|a| a == "--ignored") {
            println!("soak_short: test");
        }
        return;
    }
    let bench = args.iter().any(|a| a == "--bench");
    let new_identity = args.iter().any(|a| a == "--new-identity");
    let stages: Vec<Stage> = match args.iter().position(|a| a == "--stage") {
        Some(at) => {
            let name = args.get(at + 1).cloned().unwrap_or_default();
            STAGES
                .iter()
                .copied()
                .filter(|s| s.name() == name)
                .collect()
        }
        None => STAGES.to_vec(),
    };
    if stages.is_empty() {
        eprintln!("--stage: one of {:?}", STAGES.map(Stage::name));
        std::process::exit(2);
    }
    let trials = args
        .iter()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(if bench { 100 } else { 2 });
    let started = Instant::now();
    let recovered = run(&stages, trials, new_identity);
    println!(
        "{} trial(s) per stage in {:.0} s ({})",
        trials,
        started.elapsed().as_secs_f64(),
        if new_identity {
            "each new process with another identity, as a replaced pod"
        } else {
            "each new process with the killed one's identity, as a restarted container"
        }
    );
    if !recovered {
        std::process::exit(1);
    }
}
