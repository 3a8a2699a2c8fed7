//! Wiring and shutdown: the kube-runtime controller over SequencedReleases, the watches that wake
//! releases, the error policy, and what happens on SIGTERM.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::events::Events;
use super::plans::Plans;
use super::records::Records;
use super::source::Sources;
use super::watches::Watches;
use super::{Error, Halt, Options, Stop, kube_error, reconcile, stats};
use crate::api::{ReleasePhase, SequencedRelease};
use crate::cluster::{Account, Cluster};
use crate::lock::Locks;
use crate::rollout;

/// The longest backoff after API errors.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// After SIGTERM, how long the reconciles in flight may take to finish their current API call.
const IN_FLIGHT_BOUND: Duration = Duration::from_secs(5);
/// After SIGTERM, how long releasing the leases may take.
const RELEASE_BOUND: Duration = Duration::from_secs(3);
/// How many times a reconcile starts again from a fresher object after taking the lock.
const MAX_RESTARTS: usize = 3;

/// What every reconcile shares.
pub(super) struct Context {
    pub client: Client,
    /// The controller's own configuration, from which the clients that impersonate service
    /// accounts are made.
    pub config: kube::Config,
    /// The API server as the controller itself.
    pub cluster: Arc<Cluster>,
    /// The API server as each service account a release acts as.
    accounts: Mutex<HashMap<Account, Arc<Cluster>>>,
    pub options: Options,
    pub store: Store<SequencedRelease>,
    pub watches: Watches,
    pub events: Events,
    pub sources: Sources,
    pub plans: Plans,
    pub records: Records,
    pub locks: Arc<Locks>,
    /// When this controller first saw each operation in progress (`spec.timeout`).
    pub operations: Operations,
    /// When each release's objects were last compared with what it applied.
    drift_checks: Mutex<HashMap<ObjectRef<SequencedRelease>, Instant>>,
    /// The releases this controller wrote and its cache may not show yet.
    written: Mutex<HashMap<ObjectRef<SequencedRelease>, Written>>,
    /// Errors in a row per release, for the backoff.
    failures: Mutex<HashMap<ObjectRef<SequencedRelease>, u32>>,
    /// Set on SIGTERM: no new step starts.
    stopping: AtomicBool,
}

/// A release as this controller last wrote it, and the resourceVersions its writes replaced.
struct Written {
    replaced: Vec<String>,
    object: Arc<SequencedRelease>,
}

impl Context {
    /// `sr` as the cache holds it, or what this controller wrote over it when the cache has not
    /// caught up with that write yet: a reconcile woken before the watch brings its own write
    /// back goes on from it, instead of writing again over a stale resourceVersion (a 409) and
    /// repeating the step.
    pub fn newest(&self, sr: Arc<SequencedRelease>) -> Arc<SequencedRelease> {
        let key = ObjectRef::from_obj(&*sr);
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = written.get(&key) else {
            return sr;
        };
        let rv = sr.metadata.resource_version.clone().unwrap_or_default();
        if entry.replaced.contains(&rv) && entry.object.metadata.uid == sr.metadata.uid {
            return Arc::clone(&entry.object);
        }
        // The cache caught up, or someone else changed the release since: the cache decides.
        written.remove(&key);
        sr
    }

    /// This controller wrote the release at resourceVersion `from`, which made `object`.
    pub fn wrote(&self, from: Option<&str>, object: SequencedRelease) {
        let key = ObjectRef::from_obj(&object);
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let from = from.unwrap_or_default().to_string();
        let mut replaced = match written.remove(&key) {
            Some(entry) if entry.object.metadata.resource_version.as_deref() == Some(&from) => {
                entry.replaced
            }
            _ => Vec::new(),
        };
        replaced.push(from);
        written.insert(
            key,
            Written {
                replaced,
                object: Arc::new(object),
            },
        );
    }

    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// How many reconciles of the release failed in a row before this one.
    pub fn failures_of(&self, release: &ObjectRef<SequencedRelease>) -> u32 {
        self.failures
            .lock()
            .map(|failures| failures.get(release).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// The API server as `account` sees it (impersonated), or as the controller itself.
    pub fn cluster_for(&self, account: Option<&Account>) -> Result<Arc<Cluster>, kube::Error> {
        let Some(account) = account else {
            return Ok(Arc::clone(&self.cluster));
        };
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = accounts.get(account) {
            return Ok(Arc::clone(cluster));
        }
        let cluster = Arc::new(self.cluster.acting_as(&self.config, account.clone())?);
        accounts.insert(account.clone(), Arc::clone(&cluster));
        Ok(cluster)
    }

    /// Forgets what the caches keep of a release that is gone.
    pub fn forget(&self, release: &ObjectRef<SequencedRelease>) {
        self.sources.forget(release);
        self.watches.forget_reads(release);
        self.plans.forget(release);
        self.records.forget(release);
        self.operations.forget(release);
        if let Ok(mut checks) = self.drift_checks.lock() {
            checks.remove(release);
        }
        if let Ok(mut written) = self.written.lock() {
            written.remove(release);
        }
    }

    /// Whether the release's objects are due for a full comparison with what it applied: once
    /// every `interval`, and once when this controller first sees the release Ready.
    pub fn drift_check_due(
        &self,
        release: &ObjectRef<SequencedRelease>,
        interval: Duration,
    ) -> bool {
        self.drift_checks
            .lock()
            .ok()
            .and_then(|checks| {
                checks
                    .get(release)
                    .map(|at| at.elapsed() >= interval.mul_f64(0.9))
            })
            .unwrap_or(true)
    }

    /// The release's objects were just compared in full.
    pub fn drift_checked(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut checks) = self.drift_checks.lock() {
            checks.insert(release.clone(), Instant::now());
        }
    }
}

/// An operation in progress: the release's uid, its revision, and whether it uninstalls.
type Operation = (String, i64, bool);

/// When this controller first saw each operation in progress, on its own monotonic clock:
/// `spec.timeout` is measured from there, never from a time another replica wrote.
#[derive(Default)]
pub(super) struct Operations {
    seen: Mutex<HashMap<ObjectRef<SequencedRelease>, (Operation, Instant)>>,
}

impl Operations {
    /// How long ago this controller first saw the release's current operation while no other
    /// session held its lock; None when none is in progress (or another session runs it: a
    /// controller that takes an operation over gives it a whole timeout).
    pub fn running_for(&self, sr: &SequencedRelease, blocked: bool) -> Option<Duration> {
        let key = ObjectRef::from_obj(sr);
        let status = sr.status.as_ref();
        let phase = status.and_then(|s| s.phase);
        let Ok(mut seen) = self.seen.lock() else {
            return None;
        };
        if blocked || !rollout::holds_lock(phase) {
            seen.remove(&key);
            return None;
        }
        let operation = (
            sr.metadata.uid.clone().unwrap_or_default(),
            status.and_then(|s| s.revision).unwrap_or(0),
            phase == Some(ReleasePhase::Uninstalling) || sr.metadata.deletion_timestamp.is_some(),
        );
        let entry = seen
            .entry(key)
            .or_insert_with(|| (operation.clone(), Instant::now()));
        if entry.0 != operation {
            *entry = (operation, Instant::now());
        }
        Some(entry.1.elapsed())
    }

    fn forget(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.remove(release);
        }
    }
}

/// Runs the controller with the identity `config` gives it until `shutdown` resolves and the
/// reconciles in flight have finished.
pub async fn run(
    config: kube::Config,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    // No blanket retry inside the client: kube's retries a 503 fifteen times over minutes, so a
    // single aggregated API whose backend is down (its group-version answers 503) held up
    // discovery, and every release with it. Failed requests fail the reconcile, which is retried
    // with backoff and says why in the status; discovery leaves a failing group-version out.
    let mut config = config;
    config.default_retry = false;
    let client = Client::try_from(config.clone()).map_err(kube_error("making a client"))?;
    let api: Api<SequencedRelease> = Api::all(client.clone());
    api.list(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(kube_error(
            "listing SequencedReleases (is the CRD installed? `sequenced crd | kubectl apply -f -`)",
        ))?;
    let (trigger, triggers) = futures::channel::mpsc::unbounded();
    let controller = Controller::new(api.clone(), watcher::Config::default().any_semantic());
    let store = controller.store();
    let concurrency = options.concurrency;
    let phases = store.clone();
    options.metrics.set_phase_source(Box::new(move || {
        phases
            .state()
            .iter()
            .map(|sr| phase_name(sr.status.as_ref().and_then(|s| s.phase)))
            .collect()
    }));
    let synced = store.clone();
    let metrics = Arc::clone(&options.metrics);
    tokio::spawn(async move {
        // A single long wait on the store was seen never to wake on the test API server, while
        // a fresh wait returns at once once the initial list is in: ask again every 200 ms.
        loop {
            let wait = synced.wait_until_ready();
            match tokio::time::timeout(Duration::from_millis(200), wait).await {
                Ok(Ok(())) => {
                    metrics.set_synced();
                    return;
                }
                Ok(Err(_)) => return,
                Err(_) => {}
            }
        }
    });
    let trigger_for_discovery = trigger.clone();
    let locks = Arc::new(Locks::new(client.clone(), options.identity.clone()));
    locks.watch(trigger.clone());
    let context = Arc::new(Context {
        cluster: Arc::new(Cluster::new(client.clone())),
        accounts: Mutex::new(HashMap::new()),
        config,
        watches: Watches::new(client.clone(), trigger.clone()),
        events: Events::new(
            client.clone(),
            "sequenced".to_string(),
            options.identity.clone(),
        ),
        sources: Sources::default(),
        plans: Plans::default(),
        records: Records::new(client.clone()),
        client,
        options,
        store: store.clone(),
        failures: Mutex::new(HashMap::new()),
        operations: Operations::default(),
        drift_checks: Mutex::new(HashMap::new()),
        written: Mutex::new(HashMap::new()),
        locks,
        stopping: AtomicBool::new(false),
    });
    let discovery = watch_discovery(&context, trigger_for_discovery);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signal = {
        let context = Arc::clone(&context);
        async move {
            shutdown.await;
            context.stopping.store(true, Ordering::SeqCst);
            let _ = stop.send(true);
        }
    };
    let signal = tokio::spawn(signal);
    let graceful = {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let controller = controller
        .watches(
            api,
            watcher::Config::default().any_semantic(),
            move |dependency| dependents(&store, &dependency),
        )
        .reconcile_on(triggers)
        .with_config(controller::Config::default().concurrency(concurrency))
        .graceful_shutdown_on(graceful)
        .run(reconcile_one, error_policy, Arc::clone(&context))
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile");
            }
        });
    // After the signal, the reconciles in flight get IN_FLIGHT_BOUND to finish.
    let bound = {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
            tokio::time::sleep(IN_FLIGHT_BOUND).await;
        }
    };
    tokio::select! {
        () = controller => {}
        () = bound => {
            tracing::warn!("reconciles still in flight {}s after the signal: abandoning them", IN_FLIGHT_BOUND.as_secs());
        }
    }
    signal.abort();
    discovery.abort();
    if *stopped.borrow() {
        let held = context.locks.held();
        if tokio::time::timeout(RELEASE_BOUND, interrupt_all(&context, &held))
            .await
            .is_err()
        {
            tracing::warn!(
                "could not release every lease within {}s; they expire by themselves",
                RELEASE_BOUND.as_secs()
            );
        }
    }
    Ok(())
}

/// Watches what changes discovery: CustomResourceDefinitions and APIServices (metadata only,
/// cluster-wide). When one is created, changed or deleted, discovery is read again at the next
/// kind it does not know, group-versions that failed are asked again, and the releases that wait
/// for a kind (Stalled `UnknownKind`) or fail to reconcile are woken: a CRD installed later lets
/// them go on within seconds, not at their next `interval`.
fn watch_discovery(
    context: &Arc<Context>,
    trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<SequencedRelease>>,
) -> tokio::task::JoinHandle<()> {
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, PartialObjectMeta};
    use kube::runtime::WatchStreamExt;
    let resource = |group: &str, kind: &str, plural: &str| ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: kind.into(),
        plural: plural.into(),
    };
    let kinds = [
        resource(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
        resource("apiregistration.k8s.io", "APIService", "apiservices"),
    ];
    let streams = kinds.map(|kind| {
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(context.client.clone(), &kind);
        watcher::watcher(api, watcher::Config::default().any_semantic())
            .default_backoff()
            .boxed()
    });
    let context = Arc::clone(context);
    tokio::spawn(async move {
        let mut events = futures::stream::select_all(streams);
        let mut warned = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {}
                Ok(_) => continue,
                Err(e) => {
                    if !warned {
                        tracing::warn!(error = %e, "watching CustomResourceDefinitions and APIServices (grant list and watch on them): until it works, releases waiting for a kind go on at their interval");
                    }
                    warned = true;
                    continue;
                }
            }
            context.cluster.invalidate().await;
            for sr in context.store.state() {
                let waits = sr.status.as_ref().is_some_and(|status| {
                    rollout::status::tells_reconcile_failure(status)
                        || status.conditions.iter().any(|c| {
                            c.type_ == crate::api::STALLED
                                && c.status == "True"
                                && c.reason == crate::api::Reason::UnknownKind.as_str()
                        })
                });
                if waits {
                    let _ = trigger.unbounded_send(ObjectRef::from_obj(&*sr));
                }
            }
        }
    })
}

/// After SIGTERM: every release whose lock this controller holds is marked Reconciling with
/// reason Interrupted, and its lease is released, so that the next controller resumes at once.
async fn interrupt_all(context: &Context, held: &[ObjectRef<SequencedRelease>]) {
    let identity = &context.options.identity;
    let now = &rollout::seconds(Time(k8s_openapi::jiff::Timestamp::now()));
    futures::future::join_all(held.iter().map(|release| async move {
        let namespace = release.namespace.as_deref().unwrap_or("default");
        let api: Api<SequencedRelease> = Api::namespaced(context.client.clone(), namespace);
        for _ in 0..2 {
            let Ok(Some(mut sr)) = api.get_opt(&release.name).await else {
                break;
            };
            let message = format!(
                "interrupted: controller {identity} stopped during the operation; the next controller resumes it"
            );
            sr.status = Some(rollout::interrupted(
                &sr.status.clone().unwrap_or_default(),
                &message,
                now,
            ));
            sr.metadata.managed_fields = None;
            match api
                .replace_status(&release.name, &PostParams::default(), &sr)
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    tracing::warn!(release = %release, error = %e, "marking the release Interrupted");
                    break;
                }
                Ok(_) => break,
            }
        }
        if let Err(e) = context.locks.release(release).await {
            tracing::warn!(release = %release, error = %e, "releasing the lease");
        }
    }))
    .await;
}

/// The `sequenced_releases` label of a phase.
fn phase_name(phase: Option<ReleasePhase>) -> String {
    match phase {
        Some(phase) => format!("{phase:?}"),
        None => "None".to_string(),
    }
}

/// The releases whose `dependsOn` names `dependency`.
fn dependents(
    store: &Store<SequencedRelease>,
    dependency: &SequencedRelease,
) -> Vec<ObjectRef<SequencedRelease>> {
    let name = rollout::dependencies::reference_of(dependency);
    store
        .state()
        .into_iter()
        .filter(|sr| rollout::dependencies::depends_on(sr).contains(&name))
        .map(|sr| ObjectRef::from_obj(&*sr))
        .collect()
}

fn error_policy(sr: Arc<SequencedRelease>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = ObjectRef::from_obj(&*sr);
    let failures = {
        let mut map = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = backoff(failures, fastrand::f64());
    tracing::warn!(
        release = %format!("{}/{}", sr.namespace().unwrap_or_default(), sr.name_any()),
        category = error.category(),
        error = %error,
        retry_in_ms = delay.as_millis() as u64,
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// Exponential backoff from 1 s up to 5 min, with ±25 % jitter (`random` in 0..1).
pub fn backoff(failures: u32, random: f64) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    let base = Duration::from_secs(1)
        .saturating_mul(1 << exponent)
        .min(MAX_BACKOFF);
    base.mul_f64(0.75 + random.clamp(0.0, 1.0) * 0.5)
}

/// One reconcile, with its span, CPU time and metrics; a restart after taking the lock goes on
/// from the fresher object, and the halts become the requeue they call for.
async fn reconcile_one(sr: Arc<SequencedRelease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(&*sr);
    let release = format!("{}/{}", sr.namespace().unwrap_or_default(), sr.name_any());
    let span = tracing::info_span!("reconcile", release = %release);
    let started = std::time::Instant::now();
    let mut current = ctx.newest(sr);
    let mut cpu = Duration::ZERO;
    let mut restarts = 0;
    let stop = loop {
        let timed = stats::CpuTimed::new(reconcile::reconcile(Arc::clone(&current), &ctx));
        let (result, spent) = tracing::Instrument::instrument(timed, span.clone()).await;
        cpu += spent;
        match result {
            Ok(action) => break Ok(action),
            // The lock was just taken and the cached object was behind: go on from the fresh one.
            Err(Stop::Halted(Halt::Restart(fresh))) if restarts < MAX_RESTARTS => {
                restarts += 1;
                current = Arc::new(*fresh);
            }
            Err(stop) => break Err(stop),
        }
    };
    let result = match stop {
        Ok(action) => Ok(action),
        Err(Stop::Failed(error)) => Err(error),
        Err(Stop::Halted(halt)) => Ok(match halt {
            Halt::Busy {
                holder,
                retry_after,
            } => {
                tracing::debug!(%holder, retry_in_ms = retry_after.as_millis() as u64, "locked by another session");
                Action::requeue(retry_after + Duration::from_millis(50))
            }
            Halt::Lost { holder } => {
                tracing::warn!(%holder, "lost the release's lock; its new holder goes on");
                Action::requeue(Duration::from_secs(1))
            }
            Halt::Interrupted => Action::await_change(),
            Halt::Restart(_) => Action::requeue(Duration::from_millis(100)),
        }),
    };
    ctx.options.metrics.reconciled(
        result.as_ref().err().map(Error::category),
        started.elapsed(),
        cpu,
    );
    if result.is_ok()
        && let Ok(mut failures) = ctx.failures.lock()
    {
        failures.remove(&key);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_five_minutes_with_jitter() {
        assert_eq!(backoff(1, 0.5), Duration::from_secs(1));
        assert_eq!(backoff(3, 0.5), Duration::from_secs(4));
        assert_eq!(backoff(40, 0.5), MAX_BACKOFF);
        assert_eq!(backoff(1, 0.0), Duration::from_millis(750));
        assert_eq!(backoff(1, 1.0), Duration::from_millis(1250));
    }
}
