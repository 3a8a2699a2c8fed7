//! kube-runtime wiring: the SequencedRelease controller, its watches, one reconcile step at a
//! time, the finalizer, status and events.
//!
//! Each reconcile reads the spec (chart and values, hashed into a digest), plans the chart when
//! the digest is new (the plan is cached), asks the pure state machine in [`crate::rollout`]
//! what the current step needs, does it, writes the status when it changed, and returns. It
//! never sleeps: watches on the objects it applied wake it when something changes.

pub mod source;
pub mod stats;
pub mod watches;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::api::v1alpha1::{
    LayerPhase, ReleasePhase, SequencedRelease, SequencedReleaseSpec, SequencedReleaseStatus,
    Sequencing,
};
use crate::chart::source::ChartCache;
use crate::cluster::{Cluster, ClusterError};
use crate::helm::Helm;
use crate::history::{Inventory, ObjectKey, RECORD_KEY, RECORD_TYPE, Record, RecordError};
use crate::lock::{Acquired, LockError, Locks};
use crate::plan::Plan;
use crate::readiness::parse_duration;
use crate::rollout::{self, Action as Step, Observations, Revision, Settings, Wanted};
use source::{PlanFailure, PrepareError, Prepared, RenderContext};
use watches::{MANAGED_BY, MANAGED_BY_LABEL, OWNER_ANNOTATION, Watches};

/// The finalizer that makes deleting a SequencedRelease uninstall its chart first.
pub const FINALIZER: &str = "sequenced.dev/finalizer";
/// Helm's ownership annotations.
pub const RELEASE_NAME_ANNOTATION: &str = "meta.helm.sh/release-name";
pub const RELEASE_NAMESPACE_ANNOTATION: &str = "meta.helm.sh/release-namespace";

/// How long a release in progress waits without any event before it is looked at again.
const FALLBACK_REQUEUE: Duration = Duration::from_secs(60);
/// The longest backoff after API errors.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The longest status message; longer ones (many planner errors) are cut.
const MAX_MESSAGE: usize = 8 * 1024;
/// After SIGTERM, how long the reconciles in flight may take to finish their current API call.
const IN_FLIGHT_BOUND: Duration = Duration::from_secs(5);
/// After SIGTERM, how long releasing the leases may take.
const RELEASE_BOUND: Duration = Duration::from_secs(3);
/// `spec.timeout` when it cannot be read.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub helm: Helm,
    pub cache: ChartCache,
    /// How many releases are reconciled at once.
    pub concurrency: u16,
    /// Who this controller is, for events.
    pub identity: String,
    /// The Prometheus metrics the controller updates.
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Anything that stops a reconcile; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error("{0}")]
    Plan(PlanFailure),
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Another session holds the release's lock, this controller lost it, or the Lease could not
    /// be written.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The controller is shutting down: no new step starts.
    #[error("the controller is shutting down")]
    Interrupted,
    /// The lock was just taken and the release had changed since it was read: start again from
    /// the object as it is now.
    #[error("the release changed before its lock was taken")]
    Restart(Box<SequencedRelease>),
}

impl Error {
    /// A fixed short category, for metrics labels and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Cluster(e) => e.category(),
            Error::Prepare(_) => "spec_read",
            Error::Plan(_) => "chart",
            Error::Kube { .. } | Error::Lock(_) => "api",
            Error::Interrupted => "api",
            Error::Restart(_) => "conflict",
        }
    }
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// A plan with every resource's identity resolved against the cluster.
#[derive(Debug)]
struct Resolved {
    plan: Plan,
    chart_version: Option<String>,
    /// By index into `plan.resources`.
    keys: Vec<ObjectKey>,
    /// By index into `plan.crds`.
    crd_keys: Vec<ObjectKey>,
    inventory: Inventory,
}

/// The last plan of one release, by digest.
struct Cached {
    digest: String,
    is_upgrade: bool,
    outcome: Result<Arc<Resolved>, PlanFailure>,
}

/// Release records by (release, revision).
type RecordCache = HashMap<(ObjectRef<SequencedRelease>, i64), Arc<Record>>;

/// What every reconcile shares.
pub struct Context {
    client: Client,
    cluster: Cluster,
    options: Options,
    store: Store<SequencedRelease>,
    watches: Watches,
    recorder: Recorder,
    plans: Mutex<HashMap<ObjectRef<SequencedRelease>, Arc<Cached>>>,
    records: Mutex<RecordCache>,
    failures: Mutex<HashMap<ObjectRef<SequencedRelease>, u32>>,
    locks: Arc<Locks>,
    /// Set on SIGTERM: no new step starts.
    stopping: AtomicBool,
}

impl Context {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

/// Runs the controller until `shutdown` resolves and the reconciles in flight have finished.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let api: Api<SequencedRelease> = Api::all(client.clone());
    api.list(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(kube_error(
            "listing SequencedReleases (is the CRD installed? `sequenced crd | kubectl apply -f -`)",
        ))?;
    let (trigger, triggers) = futures::channel::mpsc::unbounded();
    let controller = Controller::new(api.clone(), watcher::Config::default().any_semantic());
    let store = controller.store();
    let reporter = Reporter {
        controller: "sequenced".to_string(),
        instance: Some(options.identity.clone()),
    };
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
    let locks = Arc::new(Locks::new(client.clone(), options.identity.clone()));
    locks.watch(trigger.clone());
    let context = Arc::new(Context {
        cluster: Cluster::new(client.clone()),
        watches: Watches::new(client.clone(), trigger),
        recorder: Recorder::new(client.clone(), reporter),
        client,
        options,
        store: store.clone(),
        plans: Mutex::new(HashMap::new()),
        records: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
        locks,
        stopping: AtomicBool::new(false),
    });
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
        .run(reconcile, error_policy, Arc::clone(&context))
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
    let name = dependency.name_any();
    let namespace = dependency.namespace().unwrap_or_default();
    store
        .state()
        .into_iter()
        .filter(|sr| {
            let own = sr.namespace().unwrap_or_default();
            sr.spec
                .depends_on
                .iter()
                .any(|d| d.name == name && d.namespace.as_deref().unwrap_or(&own) == namespace)
        })
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

async fn reconcile(sr: Arc<SequencedRelease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = ObjectRef::from_obj(&*sr);
    let release = format!("{}/{}", sr.namespace().unwrap_or_default(), sr.name_any());
    let span = tracing::info_span!("reconcile", release = %release);
    let started = std::time::Instant::now();
    let mut current = sr;
    let mut cpu = Duration::ZERO;
    let mut restarts = 0;
    let result = loop {
        let timed = stats::CpuTimed::new(Reconcile::new(&current, &ctx).run());
        let (result, spent) = tracing::Instrument::instrument(timed, span.clone()).await;
        cpu += spent;
        match result {
            // The lock was just taken and the cached object was behind: go on from the fresh one.
            Err(Error::Restart(fresh)) if restarts < 3 => {
                restarts += 1;
                current = Arc::new(*fresh);
            }
            other => break other,
        }
    };
    let result = match result {
        Err(Error::Lock(LockError::Busy {
            holder,
            retry_after,
        })) => {
            tracing::debug!(%holder, retry_in_ms = retry_after.as_millis() as u64, "locked by another session");
            Ok(Action::requeue(retry_after + Duration::from_millis(50)))
        }
        Err(Error::Lock(LockError::Lost { holder })) => {
            tracing::warn!(%holder, "lost the release's lock; its new holder goes on");
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(Error::Interrupted) => Ok(Action::await_change()),
        Err(Error::Restart(_)) => Ok(Action::requeue(Duration::from_millis(100))),
        other => other,
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

/// Whose an existing object is.
#[derive(Debug, PartialEq)]
enum Owner {
    Us,
    Nobody,
    Other(String),
}

/// One reconcile of one release.
struct Reconcile<'a> {
    sr: &'a SequencedRelease,
    ctx: &'a Context,
    api: Api<SequencedRelease>,
    namespace: String,
    name: String,
    owner: String,
    release_name: String,
    target_namespace: String,
    now: Time,
    /// Whether the lock was taken or checked in this reconcile.
    locked: AtomicBool,
}

impl<'a> Reconcile<'a> {
    fn new(sr: &'a SequencedRelease, ctx: &'a Context) -> Reconcile<'a> {
        let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
        let name = sr.name_any();
        Reconcile {
            api: Api::namespaced(ctx.client.clone(), &namespace),
            owner: format!("{namespace}/{name}"),
            release_name: sr.spec.release_name.clone().unwrap_or_else(|| name.clone()),
            target_namespace: sr
                .spec
                .target_namespace
                .clone()
                .unwrap_or_else(|| namespace.clone()),
            namespace,
            name,
            sr,
            ctx,
            now: rollout::seconds(Time(k8s_openapi::jiff::Timestamp::now())),
            locked: AtomicBool::new(false),
        }
    }

    fn key(&self) -> ObjectRef<SequencedRelease> {
        ObjectRef::from_obj(self.sr)
    }

    fn status(&self) -> SequencedReleaseStatus {
        self.sr.status.clone().unwrap_or_default()
    }

    async fn run(self) -> Result<Action, Error> {
        if self.ctx.stopping() {
            return Ok(Action::await_change());
        }
        // Another session holds the release's lock: do not touch it until the lease is
        // released (the lease watch wakes the release) or may have expired.
        if let Some((holder, remaining)) = self.ctx.locks.blocked(&self.key()) {
            tracing::debug!(%holder, retry_in_ms = remaining.as_millis() as u64, "locked by another session");
            return Ok(Action::requeue(remaining + Duration::from_millis(50)));
        }
        if self.sr.metadata.deletion_timestamp.is_some() {
            return self.uninstall().await;
        }
        if !self.sr.finalizers().iter().any(|f| f == FINALIZER) {
            self.lock(false).await?;
            let mut finalizers = self.sr.finalizers().to_vec();
            finalizers.push(FINALIZER.to_string());
            self.patch_finalizers(finalizers).await?;
            // The change wakes this release again.
            return Ok(Action::await_change());
        }
        if self.sr.spec.suspend {
            if self.ctx.locks.holds(&self.key()) {
                let mut status = self.status();
                status.lock = None;
                status.message = Some("suspended: spec.suspend is true".to_string());
                self.write_status_as_is(&status).await?;
                self.unlock().await;
            }
            return Ok(Action::await_change());
        }
        self.deploy().await
    }

    async fn patch_finalizers(&self, finalizers: Vec<String>) -> Result<(), Error> {
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": self.sr.resource_version(),
            }
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            // Changed meanwhile: the newer object comes with its own event.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_error(format!(
                "updating the finalizers of {}",
                self.owner
            ))(e)),
        }
    }

    /// Writes `status` unless it is what the object already has, under the release's lock.
    /// While an operation is in progress the status mirrors the lock (renewed when due); once it
    /// has ended, the lock is released after the write.
    async fn write_status(&self, status: &SequencedReleaseStatus) -> Result<(), Error> {
        let key = self.key();
        let keep = in_progress(status.phase);
        if keep && self.ctx.locks.holds(&key) {
            self.lock(false).await?;
        }
        let mut status = status.clone();
        status.lock = keep.then(|| self.ctx.locks.mirror(&key)).flatten();
        if let Some(message) = status.message.as_mut() {
            cut(message);
        }
        for layer in &mut status.layers {
            if let Some(message) = layer.message.as_mut() {
                cut(message);
            }
        }
        if self.sr.status.as_ref() != Some(&status) {
            self.lock(false).await?;
            status.lock = keep.then(|| self.ctx.locks.mirror(&key)).flatten();
            self.write_status_as_is(&status).await?;
        }
        if !keep {
            self.unlock().await;
        }
        Ok(())
    }

    /// Replaces the status (a 409 is left for the newer object's own reconcile).
    async fn write_status_as_is(&self, status: &SequencedReleaseStatus) -> Result<(), Error> {
        let mut object = self.sr.clone();
        object.metadata.managed_fields = None;
        object.status = Some(status.clone());
        match self
            .api
            .replace_status(&self.name, &PostParams::default(), &object)
            .await
        {
            Ok(_) => Ok(()),
            // Someone changed the object since it was read; its newer version wakes us again.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_error(format!("writing the status of {}", self.owner))(
                e,
            )),
        }
    }

    /// The lease duration: `spec.timeout`.
    fn lock_duration(&self) -> Duration {
        parse_duration(&self.sr.spec.timeout).unwrap_or(DEFAULT_TIMEOUT)
    }

    /// Takes the release's lock before a write, or makes sure it is still held. `step` renews it
    /// (once per reconcile): a step of the operation is about to apply or delete. A lock taken
    /// fresh, or taken over, is followed by a fresh read of the release: when it changed since the
    /// cached copy, the reconcile starts again from it ([`Error::Restart`]).
    async fn lock(&self, step: bool) -> Result<(), Error> {
        let key = self.key();
        let checked = self.locked.load(Ordering::SeqCst);
        if checked && self.ctx.locks.safely_held(&key) {
            return Ok(());
        }
        let acquired = self
            .ctx
            .locks
            .acquire(self.sr, self.lock_duration(), step || checked)
            .await?;
        self.locked.store(true, Ordering::SeqCst);
        match acquired {
            Acquired::Kept | Acquired::Renewed => Ok(()),
            Acquired::Fresh => self.read_fresh().await,
            Acquired::TakenOver {
                previous,
                unchanged_for,
            } => {
                self.ctx.options.metrics.lock_takeovers.inc();
                let message = format!(
                    "took over the lock from {previous}: its lease was not renewed for {}s; resuming from the status",
                    unchanged_for.as_secs()
                );
                tracing::warn!(%previous, "took over an expired lock");
                self.publish(&[rollout::Note {
                    warning: true,
                    reason: "LockTakenOver",
                    message,
                }])
                .await;
                self.read_fresh().await
            }
        }
    }

    /// After taking the lock: the release as the API server has it now, so that the operation
    /// goes on from where the previous holder left it.
    async fn read_fresh(&self) -> Result<(), Error> {
        let fresh = self
            .api
            .get(&self.name)
            .await
            .map_err(kube_error(format!("reading {}", self.owner)))?;
        if fresh.resource_version() == self.sr.resource_version() {
            Ok(())
        } else {
            Err(Error::Restart(Box::new(fresh)))
        }
    }

    /// Before each write of a step: stop when the controller is shutting down, and renew the
    /// lock unless it is held with time to spare.
    async fn still_held(&self) -> Result<(), Error> {
        if self.ctx.stopping() {
            return Err(Error::Interrupted);
        }
        self.lock(false).await
    }

    /// Releases the lock (the operation is over); a failure leaves the lease to expire.
    async fn unlock(&self) {
        if let Err(e) = self.ctx.locks.release(&self.key()).await {
            tracing::warn!(error = %e, "releasing the release's lease; it expires by itself");
        }
    }

    async fn publish(&self, notes: &[rollout::Note]) {
        let reference = self.sr.object_ref(&());
        for note in notes {
            let event = Event {
                type_: if note.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: note.reason.to_string(),
                note: Some(note.message.clone()),
                action: "Reconcile".to_string(),
                secondary: None,
            };
            if let Err(e) = self.ctx.recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, reason = note.reason, "publishing an event");
            }
        }
    }

    /// Where this release stands with its `dependsOn` releases. The cycle check reads the
    /// controller's cache; the dependencies themselves are read fresh, because the event that woke
    /// this release may be ahead of the cache.
    async fn dependencies(&self) -> Result<Dependencies, Error> {
        let mut all: BTreeMap<String, Arc<SequencedRelease>> = self
            .ctx
            .store
            .state()
            .into_iter()
            .map(|o| (reference_of(&o), o))
            .collect();
        for dependency in depends_on(self.sr) {
            let Some((namespace, name)) = dependency.split_once('/') else {
                continue;
            };
            let api: Api<SequencedRelease> = Api::namespaced(self.ctx.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(found)) => {
                    all.insert(dependency, Arc::new(found));
                }
                Ok(None) => {
                    all.remove(&dependency);
                }
                Err(e) => {
                    return Err(kube_error(format!("reading SequencedRelease {dependency}"))(e));
                }
            }
        }
        Ok(check_dependencies(self.sr, &all))
    }

    /// Marks the release Stalled and waits for a change of its spec.
    async fn stall(&self, reason: &str, message: &str) -> Result<Action, Error> {
        let status = rollout::stalled(
            &self.status(),
            self.sr.metadata.generation,
            reason,
            message,
            &self.now,
        );
        let first = self.sr.status.as_ref().and_then(|s| s.message.as_deref()) != Some(message);
        self.write_status(&status).await?;
        if first {
            self.publish(&[rollout::Note {
                warning: true,
                reason: "Stalled",
                message: message.to_string(),
            }])
            .await;
        }
        Ok(Action::await_change())
    }

    fn settings(&self) -> Result<Settings, String> {
        let spec: &SequencedReleaseSpec = &self.sr.spec;
        let readiness_timeout = parse_duration(&spec.readiness_timeout)
            .map_err(|e| format!("spec.readinessTimeout: {e}"))?;
        Ok(Settings {
            sequenced: spec.sequencing == Sequencing::Ordered,
            wait: spec.wait,
            readiness_timeout,
            max_history: usize::try_from(spec.max_history).unwrap_or(0),
            retries: self.retries(),
        })
    }

    /// `spec.retries` (a negative number, which the CRD refuses, counts as none).
    fn retries(&self) -> u32 {
        u32::try_from(self.sr.spec.retries).unwrap_or(0)
    }

    fn interval(&self) -> Duration {
        parse_duration(&self.sr.spec.interval).unwrap_or(Duration::from_secs(600))
    }

    async fn deploy(&self) -> Result<Action, Error> {
        let settings = match self.settings() {
            Ok(s) => s,
            Err(message) => return self.stall("InvalidSpec", &message).await,
        };
        let prepared = match source::prepare(&self.ctx.client, self.sr).await {
            Ok(p) => Arc::new(p),
            Err(PrepareError::Spec(e)) => return self.stall("InvalidSpec", &e.to_string()).await,
            Err(e) => return Err(e.into()),
        };
        let status = self.status();
        let generation = self.sr.metadata.generation;
        let retry_now =
            rollout::retry_due(&status, settings.retries, &self.now) == Some(Duration::ZERO);
        let new_revision = status.observed_generation != generation
            || status.last_applied_digest.as_deref() != Some(prepared.digest.as_str())
            || retry_now;
        if new_revision {
            match self.dependencies().await? {
                Dependencies::Ready => {}
                Dependencies::Cycle(cycle) => {
                    return self
                        .stall(
                            "DependencyCycle",
                            &format!("release dependency cycle: {cycle}"),
                        )
                        .await;
                }
                Dependencies::Waiting(message) => {
                    let status = rollout::pending(
                        &status,
                        generation,
                        "DependencyNotReady",
                        &message,
                        &self.now,
                    );
                    self.write_status(&status).await?;
                    // The dependency's own changes wake this release.
                    return Ok(Action::requeue(self.interval()));
                }
            }
        }
        let number = if new_revision {
            status.revision.unwrap_or(0) + 1
        } else {
            status.revision.unwrap_or(1)
        };
        let resolved = match self.resolved(&prepared, number > 1).await {
            Ok(r) => r,
            Err(failure) if failure.transient => return Err(Error::Plan(failure)),
            Err(failure) => return self.stall(failure.reason, &failure.message).await,
        };
        let hooks: Vec<String> = resolved
            .plan
            .hooks
            .iter()
            .filter(|h| !h.is_test())
            .map(|h| {
                format!(
                    "{} {}/{}",
                    h.events.join(","),
                    h.resource.kind,
                    h.resource.name
                )
            })
            .collect();
        if !hooks.is_empty() {
            let message = format!("hooks are not supported yet: {}", hooks.join(", "));
            return self.stall("HooksNotSupported", &message).await;
        }

        let (record, status) = if new_revision {
            let previous = match status.revision {
                Some(n) => self.record(n).await?,
                None => None,
            };
            let record = Record {
                revision: number,
                digest: prepared.digest.clone(),
                chart: resolved.plan.chart.clone(),
                chart_version: resolved.chart_version.clone(),
                sequenced: settings.sequenced,
                inventory: resolved.inventory.clone(),
                prune: previous
                    .map(|p| p.inventory.removed_in(&resolved.inventory))
                    .unwrap_or_default(),
            };
            if self.sr.spec.create_namespace {
                self.create_namespace().await?;
            }
            self.write_record(&record, settings.max_history).await?;
            let record = Arc::new(record);
            let revision = Revision {
                plan: &resolved.plan,
                prune: &record.prune,
                settings,
            };
            let status = rollout::begin(
                &revision,
                &status,
                generation,
                &prepared.digest,
                resolved.chart_version.as_deref(),
                &self.now,
            );
            (record, status)
        } else {
            match self.record(number).await? {
                Some(record) => (record, status),
                None => {
                    // The record is gone (deleted by hand): start the revision again.
                    let mut status = status;
                    status.last_applied_digest = None;
                    let status = rollout::pending(
                        &status,
                        generation,
                        "Progressing",
                        "restarting the revision: its record is missing",
                        &self.now,
                    );
                    self.write_status(&status).await?;
                    return Ok(Action::requeue(Duration::from_millis(100)));
                }
            }
        };

        let revision = Revision {
            plan: &resolved.plan,
            prune: &record.prune,
            settings,
        };
        let wanted = rollout::wanted(&revision, &status);
        let observed = self.observe(&resolved, &wanted).await?;
        let decision = rollout::step(&revision, &status, &observed, &self.now);
        let next = decision.status.clone();
        let metrics = &self.ctx.options.metrics;
        metrics
            .readiness_timeouts
            .inc_by(u64::try_from(decision.timeouts).unwrap_or(0));
        observe_waits(metrics, &status, &decision.status);
        if !decision.actions.is_empty() {
            // A step of the operation: renew the lock (or take it) before the first write.
            self.lock(true).await?;
        }
        for (done, action) in decision.actions.iter().enumerate() {
            if let Err(e) = self.still_held().await {
                return self.cut_short(&revision, &decision, done, e).await;
            }
            let applying = std::time::Instant::now();
            let result = self.execute(&resolved, &record, action).await;
            metrics
                .layer_apply_duration
                .with_label_values(&[stage_of(action)])
                .observe(applying.elapsed().as_secs_f64());
            if let Err(failure) = result {
                return self
                    .failed_action(&revision, &decision, done, failure)
                    .await;
            }
        }
        self.write_status(&next).await?;
        self.publish(&decision.events).await;
        Ok(self.next_look(&next, decision.requeue_after))
    }

    /// When to look at the release again without an event: at `interval` once Ready, when the
    /// retry of a failure is due, and while in progress at the next readiness timeout, within
    /// a minute and within a third of the lease duration (so that the lock is renewed).
    fn next_look(
        &self,
        status: &SequencedReleaseStatus,
        requeue_after: Option<Duration>,
    ) -> Action {
        match status.phase {
            Some(ReleasePhase::Ready) => Action::requeue(self.interval()),
            Some(ReleasePhase::Failed) => {
                match rollout::retry_due(status, self.retries(), &self.now) {
                    Some(due) => Action::requeue(due + Duration::from_millis(100)),
                    None => Action::await_change(),
                }
            }
            _ => {
                let limit = FALLBACK_REQUEUE.min(self.lock_duration() / 3);
                Action::requeue(requeue_after.map_or(limit, |d| d.min(limit)))
            }
        }
    }

    /// The controller is stopping (or lost the lock) before action `done` of the decision: the
    /// status keeps what was done, and the layers not reached go back to Pending.
    async fn cut_short(
        &self,
        revision: &Revision<'_>,
        decision: &rollout::Decision,
        done: usize,
        error: Error,
    ) -> Result<Action, Error> {
        if done > 0 && matches!(error, Error::Interrupted) {
            let mut status = decision.status.clone();
            unreached(revision, decision, done, &mut status);
            status.lock = self.ctx.locks.mirror(&self.key());
            self.write_status_as_is(&status).await?;
        }
        Err(error)
    }

    /// An action failed after `done` actions of the decision succeeded: the status says which
    /// layer and object, the layers not reached go back to Pending, and the release is Stalled
    /// (a refusal) or retried with backoff (a transient error).
    async fn failed_action(
        &self,
        revision: &Revision<'_>,
        decision: &rollout::Decision,
        done: usize,
        failure: ActionError,
    ) -> Result<Action, Error> {
        let mut status = decision.status.clone();
        let message = failure.to_string();
        if let Some(slot) = decision
            .actions
            .get(done)
            .and_then(|a| slot_of(revision, a))
            && let Some(layer) = status.layers.get_mut(slot)
        {
            layer.phase = if failure.is_transient() {
                LayerPhase::Applying
            } else {
                LayerPhase::Failed
            };
            layer.message = Some(message.clone());
        }
        unreached(revision, decision, done + 1, &mut status);
        match failure {
            ActionError::Refused { reason, .. } => {
                let (status, _) = rollout::failed(
                    &status,
                    self.sr.metadata.generation,
                    reason,
                    &message,
                    self.retries(),
                    &self.now,
                );
                self.write_status(&status).await?;
                self.publish(&[rollout::Note {
                    warning: true,
                    reason: "LayerFailed",
                    message: message.clone(),
                }])
                .await;
                Ok(self.next_look(&status, None))
            }
            ActionError::Transient(error) => {
                status.message = Some(message);
                self.write_status(&status).await?;
                Err(error)
            }
        }
    }

    /// The plan for this digest, from the cache or rendered now.
    async fn resolved(
        &self,
        prepared: &Arc<Prepared>,
        is_upgrade: bool,
    ) -> Result<Arc<Resolved>, PlanFailure> {
        let key = self.key();
        let cached = self
            .ctx
            .plans
            .lock()
            .ok()
            .and_then(|plans| plans.get(&key).cloned());
        if let Some(cached) = cached
            && cached.digest == prepared.digest
            && cached.is_upgrade == is_upgrade
        {
            return cached.outcome.clone();
        }
        let (kube_version, api_versions) =
            self.ctx
                .cluster
                .capabilities()
                .await
                .map_err(|e| PlanFailure {
                    reason: "DiscoveryFailed",
                    transient: true,
                    message: e.to_string(),
                })?;
        let context = RenderContext {
            helm: self.ctx.options.helm.clone(),
            cache: self.ctx.options.cache.clone(),
            kube_version,
            api_versions,
            is_upgrade,
        };
        let rendering = std::time::Instant::now();
        let planned = source::plan_blocking(Arc::clone(prepared), context).await;
        self.ctx
            .options
            .metrics
            .render_duration
            .observe(rendering.elapsed().as_secs_f64());
        let outcome = match planned {
            Ok(planned) => Ok(Arc::new(self.resolve(planned).await)),
            Err(failure) if failure.transient => return Err(failure),
            Err(failure) => Err(failure),
        };
        if let Ok(mut plans) = self.ctx.plans.lock() {
            plans.insert(
                key,
                Arc::new(Cached {
                    digest: prepared.digest.clone(),
                    is_upgrade,
                    outcome: outcome.clone(),
                }),
            );
        }
        outcome
    }

    /// Gives every planned object its namespace, as the cluster scopes its kind.
    async fn resolve(&self, planned: source::Planned) -> Resolved {
        let plan = planned.plan;
        let crd_scopes: HashMap<(String, String), bool> = plan
            .crds
            .iter()
            .filter_map(|crd| {
                let spec = crd.object.get("spec")?;
                let group = spec.get("group")?.as_str()?;
                let kind = spec.pointer("/names/kind")?.as_str()?;
                let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
                Some(
                    spec.get("versions")?
                        .as_array()?
                        .iter()
                        .filter_map(|v| v.get("name")?.as_str())
                        .map(|v| ((format!("{group}/{v}"), kind.to_string()), namespaced))
                        .collect::<Vec<_>>(),
                )
            })
            .flatten()
            .collect();
        let mut keys = Vec::with_capacity(plan.resources.len());
        for resource in &plan.resources {
            let namespaced = match self
                .ctx
                .cluster
                .kind(&resource.api_version, &resource.kind)
                .await
            {
                Ok(kind) => kind.namespaced,
                Err(_) => crd_scopes
                    .get(&(resource.api_version.clone(), resource.kind.clone()))
                    .copied()
                    .unwrap_or(true),
            };
            keys.push(ObjectKey {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
                namespace: namespaced.then(|| {
                    resource
                        .namespace
                        .clone()
                        .unwrap_or_else(|| self.target_namespace.clone())
                }),
                name: resource.name.clone(),
            });
        }
        let crd_keys = plan
            .crds
            .iter()
            .map(|crd| ObjectKey {
                api_version: crd.api_version.clone(),
                kind: crd.kind.clone(),
                namespace: None,
                name: crd.name.clone(),
            })
            .collect();
        let inventory =
            Inventory::from_plan(&plan, |i| keys.get(i).and_then(|k| k.namespace.clone()));
        Resolved {
            plan,
            chart_version: planned.chart_version,
            keys,
            crd_keys,
            inventory,
        }
    }

    /// `createNamespace`: the target namespace, unless it exists.
    async fn create_namespace(&self) -> Result<(), Error> {
        self.lock(false).await?;
        let key = ObjectKey {
            api_version: "v1".to_string(),
            kind: "Namespace".to_string(),
            namespace: None,
            name: self.target_namespace.clone(),
        };
        let object = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.target_namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        });
        self.ctx.cluster.create_if_absent(&key, &object).await?;
        Ok(())
    }

    fn record_secrets(&self) -> Api<Secret> {
        Api::namespaced(self.ctx.client.clone(), &self.namespace)
    }

    /// The record of revision `revision`, from the cache or the cluster.
    async fn record(&self, revision: i64) -> Result<Option<Arc<Record>>, Error> {
        let key = (self.key(), revision);
        if let Some(found) = self
            .ctx
            .records
            .lock()
            .ok()
            .and_then(|r| r.get(&key).cloned())
        {
            return Ok(Some(found));
        }
        let name = Record::secret_name(&self.name, revision);
        let Some(secret) = self
            .record_secrets()
            .get_opt(&name)
            .await
            .map_err(kube_error(format!(
                "reading release record {}/{name}",
                self.namespace
            )))?
        else {
            return Ok(None);
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(RECORD_KEY))
            .map(|b| b.0.as_slice())
            .unwrap_or_default();
        match Record::decode(&name, bytes) {
            Ok(record) => {
                let record = Arc::new(record);
                if let Ok(mut records) = self.ctx.records.lock() {
                    records.insert(key, Arc::clone(&record));
                }
                Ok(Some(record))
            }
            Err(RecordError { name, message }) => {
                tracing::warn!(record = %name, %message, "ignoring an unreadable release record");
                Ok(None)
            }
        }
    }

    /// Writes the record of a new revision and drops the one that falls out of `maxHistory`.
    async fn write_record(&self, record: &Record, max_history: usize) -> Result<(), Error> {
        self.lock(false).await?;
        let name = Record::secret_name(&self.name, record.revision);
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": { MANAGED_BY_LABEL: MANAGED_BY },
                "annotations": { OWNER_ANNOTATION: self.owner },
            },
            "type": RECORD_TYPE,
            "data": { RECORD_KEY: ByteString(record.encode()) },
        });
        self.record_secrets()
            .patch(
                &name,
                &PatchParams::apply(crate::cluster::FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(kube_error(format!(
                "writing release record {}/{name}",
                self.namespace
            )))?;
        if let Ok(mut records) = self.ctx.records.lock() {
            records.retain(|(owner, _), _| *owner != self.key());
            records.insert((self.key(), record.revision), Arc::new(record.clone()));
        }
        let max_history = i64::try_from(max_history).unwrap_or(i64::MAX);
        if max_history > 0 && record.revision > max_history {
            self.delete_record(record.revision - max_history).await?;
        }
        Ok(())
    }

    async fn delete_record(&self, revision: i64) -> Result<(), Error> {
        self.lock(false).await?;
        let name = Record::secret_name(&self.name, revision);
        match self
            .record_secrets()
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(kube_error(format!(
                "deleting release record {}/{name}",
                self.namespace
            ))(e)),
        }
    }

    fn owner_of(&self, object: &Value) -> Owner {
        let annotation = |key: &str| {
            object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
        };
        if let Some(owner) = annotation(OWNER_ANNOTATION) {
            return if owner == self.owner {
                Owner::Us
            } else {
                Owner::Other(format!("SequencedRelease {owner}"))
            };
        }
        match (
            annotation(RELEASE_NAME_ANNOTATION),
            annotation(RELEASE_NAMESPACE_ANNOTATION),
        ) {
            (Some(name), Some(namespace))
                if name == self.release_name && namespace == self.target_namespace =>
            {
                Owner::Us
            }
            (Some(name), namespace) => Owner::Other(format!(
                "Helm release {name} in namespace {}",
                namespace.unwrap_or("?")
            )),
            _ => Owner::Nobody,
        }
    }

    /// The object as it is applied: its namespace, and the ownership labels and annotations.
    fn owned(&self, object: &Value, key: &ObjectKey) -> Value {
        let mut object = object.clone();
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            if let Some(ns) = &key.namespace {
                metadata.insert("namespace".into(), Value::String(ns.clone()));
            }
            let labels = metadata
                .entry("labels")
                .or_insert_with(|| Value::Object(Default::default()));
            if !labels.is_object() {
                *labels = Value::Object(Default::default());
            }
            if let Some(labels) = labels.as_object_mut() {
                labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
            }
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| Value::Object(Default::default()));
            if !annotations.is_object() {
                *annotations = Value::Object(Default::default());
            }
            if let Some(annotations) = annotations.as_object_mut() {
                annotations.insert(
                    RELEASE_NAME_ANNOTATION.into(),
                    self.release_name.clone().into(),
                );
                annotations.insert(
                    RELEASE_NAMESPACE_ANNOTATION.into(),
                    self.target_namespace.clone().into(),
                );
                annotations.insert(OWNER_ANNOTATION.into(), self.owner.clone().into());
            }
        }
        object
    }

    /// Reads what the rollout wants to see.
    async fn observe(&self, resolved: &Resolved, wanted: &Wanted) -> Result<Observations, Error> {
        let mut observed = Observations::default();
        if wanted.is_empty() {
            return Ok(observed);
        }
        let cluster = &self.ctx.cluster;
        let pending: Vec<(usize, ObjectKey)> = wanted
            .resources
            .iter()
            .filter_map(|&r| resolved.keys.get(r).map(|k| (r, k.clone())))
            .collect();
        let mut resources = Vec::with_capacity(pending.len());
        for chunk in pending.chunks(16) {
            let found =
                futures::future::join_all(chunk.iter().map(|(_, key)| cluster.find(key))).await;
            for ((r, _), found) in chunk.iter().zip(found) {
                resources.push((*r, found?));
            }
        }
        observed.resources.extend(resources);
        if wanted.crds {
            for (i, key) in resolved.crd_keys.iter().enumerate() {
                observed.crds.insert(i, cluster.find(key).await?);
            }
        }
        for &(layer, index) in &wanted.external {
            let Some(external) = resolved
                .plan
                .layers
                .get(layer)
                .and_then(|l| l.external.get(index))
            else {
                continue;
            };
            let api_version = match &external.group {
                Some(group) if !group.is_empty() => match self.preferred_version(group).await {
                    Some(v) => format!("{group}/{v}"),
                    None => {
                        observed.external.insert((layer, index), None);
                        continue;
                    }
                },
                _ => "v1".to_string(),
            };
            let kind = match self.ctx.cluster.kind(&api_version, &external.kind).await {
                Ok(kind) => kind,
                Err(ClusterError::UnknownKind { .. }) => {
                    observed.external.insert((layer, index), None);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let namespace = kind.namespaced.then(|| {
                external
                    .namespace
                    .clone()
                    .unwrap_or_else(|| self.target_namespace.clone())
            });
            self.ctx
                .watches
                .external(&kind, namespace.as_deref(), &external.name, self.key());
            let key = ObjectKey {
                api_version,
                kind: external.kind.clone(),
                namespace,
                name: external.name.clone(),
            };
            observed
                .external
                .insert((layer, index), cluster.find(&key).await?);
        }
        observed.exists = self.ours_existing(&wanted.exists).await?;
        Ok(observed)
    }

    async fn preferred_version(&self, group: &str) -> Option<String> {
        let (_, api_versions) = self.ctx.cluster.capabilities().await.ok()?;
        let prefix = format!("{group}/");
        api_versions
            .iter()
            .filter_map(|gv| gv.strip_prefix(&prefix))
            .find(|v| !v.contains('/'))
            .map(str::to_string)
    }

    async fn execute(
        &self,
        resolved: &Resolved,
        record: &Record,
        action: &Step,
    ) -> Result<(), ActionError> {
        match action {
            Step::ApplyCrds => {
                for (crd, key) in resolved.plan.crds.iter().zip(&resolved.crd_keys) {
                    let kind = self.ctx.cluster.kind(&key.api_version, &key.kind).await?;
                    self.ctx.watches.managed(&kind);
                    let object = self.owned(&crd.object, key);
                    self.ctx
                        .cluster
                        .create_if_absent(key, &object)
                        .await
                        .map_err(|e| ActionError::from_cluster(e, &crd.chart, &crd.template))?;
                }
                Ok(())
            }
            Step::ApplyLayer(layer) => {
                let Some(layer) = resolved.plan.layers.get(*layer) else {
                    return Ok(());
                };
                for &r in &layer.resources {
                    let (Some(resource), Some(key)) =
                        (resolved.plan.resources.get(r), resolved.keys.get(r))
                    else {
                        continue;
                    };
                    let where_ =
                        |e| ActionError::from_cluster(e, &resource.chart, &resource.template);
                    let kind = self
                        .ctx
                        .cluster
                        .kind(&key.api_version, &key.kind)
                        .await
                        .map_err(where_)?;
                    self.ctx.watches.managed(&kind);
                    if let Some(existing) = self.ctx.cluster.get(key).await.map_err(where_)? {
                        match self.owner_of(&existing) {
                            Owner::Us => {}
                            Owner::Nobody if self.sr.spec.adopt => {}
                            Owner::Nobody => {
                                return Err(ActionError::Refused {
                                    reason: "OwnershipConflict",
                                    message: format!(
                                        "{key} (chart {}, {}) exists and belongs to no release; it is left alone (set spec.adopt: true to take it over)",
                                        resource.chart, resource.template
                                    ),
                                });
                            }
                            Owner::Other(other) => {
                                return Err(ActionError::Refused {
                                    reason: "OwnershipConflict",
                                    message: format!(
                                        "{key} (chart {}, {}) belongs to {other}; it is left alone",
                                        resource.chart, resource.template
                                    ),
                                });
                            }
                        }
                    }
                    let object = self.owned(&resource.object, key);
                    self.ctx.cluster.apply(key, &object).await.map_err(where_)?;
                }
                Ok(())
            }
            Step::Prune => self.delete_all(&record.prune).await,
            Step::DeleteStep(_) => Ok(()),
        }
    }

    /// Deletes the objects that are ours, in order.
    async fn delete_all(&self, keys: &[ObjectKey]) -> Result<(), ActionError> {
        for key in keys {
            if let Some(existing) = self.ctx.cluster.find(key).await?
                && self.owner_of(&existing) == Owner::Us
            {
                if let Ok(kind) = self.ctx.cluster.kind(&key.api_version, &key.kind).await {
                    self.ctx.watches.managed(&kind);
                }
                self.ctx.cluster.delete(key).await?;
            }
        }
        Ok(())
    }

    async fn uninstall(&self) -> Result<Action, Error> {
        if !self.sr.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        let status = self.status();
        let record = match status.revision {
            Some(n) => self.record(n).await?,
            None => None,
        };
        let Some(record) = record else {
            return self.finish_uninstall(&status).await;
        };
        let inventory = record.uninstall_inventory();
        let wanted = rollout::wanted_for_uninstall(&inventory, &status);
        let observed = Observations {
            exists: self.ours_existing(&wanted.exists).await?,
            ..Observations::default()
        };
        let decision =
            rollout::uninstall_step(&inventory, record.sequenced, &status, &observed, &self.now);
        if !decision.actions.is_empty() {
            self.lock(true).await?;
        }
        for action in &decision.actions {
            let Step::DeleteStep(i) = action else {
                continue;
            };
            self.still_held().await?;
            let Some(step) = inventory.steps.get(*i) else {
                continue;
            };
            let deleting = std::time::Instant::now();
            let result = self.delete_all(&step.objects).await;
            self.ctx
                .options
                .metrics
                .layer_apply_duration
                .with_label_values(&[stage_of(action)])
                .observe(deleting.elapsed().as_secs_f64());
            if let Err(e) = result {
                let mut status = decision.status.clone();
                status.message = Some(e.to_string());
                self.write_status(&status).await?;
                return Err(match e {
                    ActionError::Transient(e) => e,
                    refused => Error::Plan(PlanFailure {
                        reason: "DeleteFailed",
                        transient: false,
                        message: refused.to_string(),
                    }),
                });
            }
        }
        if decision.finished {
            self.publish(&decision.events).await;
            return self.finish_uninstall(&decision.status).await;
        }
        self.write_status(&decision.status).await?;
        self.publish(&decision.events).await;
        Ok(self.next_look(&decision.status, None))
    }

    /// Whether each object still exists as ours: an object that is not ours is not ours to
    /// wait for.
    async fn ours_existing(&self, keys: &[ObjectKey]) -> Result<HashMap<ObjectKey, bool>, Error> {
        let mut exists = HashMap::with_capacity(keys.len());
        for key in keys {
            let found = self.ctx.cluster.find(key).await?;
            let ours = found.is_some_and(|object| self.owner_of(&object) == Owner::Us);
            exists.insert(key.clone(), ours);
        }
        Ok(exists)
    }

    /// Everything is gone: drop the records (unless kept) and the finalizer.
    async fn finish_uninstall(&self, status: &SequencedReleaseStatus) -> Result<Action, Error> {
        self.lock(false).await?;
        let keep = self
            .sr
            .spec
            .uninstall
            .as_ref()
            .is_some_and(|u| u.keep_history);
        if !keep {
            let mut revisions: HashSet<i64> = status.history.iter().map(|h| h.revision).collect();
            revisions.extend(status.revision);
            for revision in revisions {
                self.delete_record(revision).await?;
            }
        }
        if let Ok(mut plans) = self.ctx.plans.lock() {
            plans.remove(&self.key());
        }
        if let Ok(mut records) = self.ctx.records.lock() {
            records.retain(|(owner, _), _| *owner != self.key());
        }
        let finalizers: Vec<String> = self
            .sr
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        self.patch_finalizers(finalizers).await?;
        if let Err(e) = self.ctx.locks.remove(&self.key()).await {
            tracing::warn!(error = %e, "deleting the release's lease");
        }
        Ok(Action::await_change())
    }
}

/// Whether an operation is under way in this phase: the release's lock is held through it.
fn in_progress(phase: Option<ReleasePhase>) -> bool {
    matches!(
        phase,
        Some(
            ReleasePhase::Deploying
                | ReleasePhase::Rendering
                | ReleasePhase::RollingBack
                | ReleasePhase::Uninstalling
        )
    )
}

/// The entry in `status.layers` of an action.
fn slot_of(revision: &Revision, action: &Step) -> Option<usize> {
    let crds = usize::from(!revision.plan.crds.is_empty());
    match action {
        Step::ApplyCrds => Some(0),
        Step::ApplyLayer(i) => Some(crds + i),
        Step::Prune => Some(crds + revision.plan.layers.len()),
        Step::DeleteStep(i) => Some(*i),
    }
}

/// The layers of the decision's actions from `from` on were not reached: back to Pending.
fn unreached(
    revision: &Revision,
    decision: &rollout::Decision,
    from: usize,
    status: &mut SequencedReleaseStatus,
) {
    for action in decision.actions.iter().skip(from) {
        if let Some(layer) = slot_of(revision, action).and_then(|s| status.layers.get_mut(s))
            && matches!(layer.phase, LayerPhase::Waiting | LayerPhase::Deleting)
        {
            layer.phase = LayerPhase::Pending;
            layer.started_at = None;
        }
    }
}

/// The `stage` label of an action's duration.
fn stage_of(action: &Step) -> &'static str {
    match action {
        Step::ApplyCrds => "crds",
        Step::ApplyLayer(_) => "layer",
        Step::Prune => "prune",
        Step::DeleteStep(_) => "delete",
    }
}

/// Observes how long each layer that became ready in this step waited.
fn observe_waits(
    metrics: &crate::metrics::Metrics,
    before: &SequencedReleaseStatus,
    after: &SequencedReleaseStatus,
) {
    for (old, new) in before.layers.iter().zip(&after.layers) {
        if old.phase != LayerPhase::Ready
            && new.phase == LayerPhase::Ready
            && let (Some(started), Some(finished)) = (&new.started_at, &new.finished_at)
        {
            let waited = finished.0.duration_since(started.0);
            metrics
                .layer_wait_duration
                .observe(waited.as_secs_f64().max(0.0));
        }
    }
}

/// Why an action could not be done.
#[derive(Debug, thiserror::Error)]
enum ActionError {
    /// The API server or the controller refused it for a reason that a retry does not change.
    #[error("{message}")]
    Refused {
        reason: &'static str,
        message: String,
    },
    #[error(transparent)]
    Transient(Error),
}

impl ActionError {
    fn from_cluster(error: ClusterError, chart: &str, template: &str) -> ActionError {
        if error.is_transient() {
            ActionError::Transient(error.into())
        } else {
            ActionError::Refused {
                reason: "ApplyFailed",
                message: format!("{error} (chart {chart}, {template})"),
            }
        }
    }

    fn is_transient(&self) -> bool {
        matches!(self, ActionError::Transient(_))
    }
}

impl From<ClusterError> for ActionError {
    fn from(error: ClusterError) -> ActionError {
        if error.is_transient() {
            ActionError::Transient(error.into())
        } else {
            ActionError::Refused {
                reason: "DeleteFailed",
                message: error.to_string(),
            }
        }
    }
}

fn cut(message: &mut String) {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" …");
    }
}

/// Where a release stands with the releases it depends on.
#[derive(Debug, PartialEq)]
pub enum Dependencies {
    Ready,
    Waiting(String),
    /// The whole cycle: `ns/a -> ns/b -> ns/a`.
    Cycle(String),
}

fn reference_of(sr: &SequencedRelease) -> String {
    format!("{}/{}", sr.namespace().unwrap_or_default(), sr.name_any())
}

fn depends_on(sr: &SequencedRelease) -> Vec<String> {
    let own = sr.namespace().unwrap_or_default();
    sr.spec
        .depends_on
        .iter()
        .map(|d| format!("{}/{}", d.namespace.as_deref().unwrap_or(&own), d.name))
        .collect()
}

/// Whether `sr`'s `dependsOn` releases are Ready (at their current generation), and whether they
/// form a cycle, given every release by `namespace/name`.
pub fn check_dependencies(
    sr: &SequencedRelease,
    all: &BTreeMap<String, Arc<SequencedRelease>>,
) -> Dependencies {
    let me = reference_of(sr);
    // A cycle through this release: depth-first from each dependency back to it.
    let mut path = vec![me.clone()];
    let mut seen = HashSet::new();
    if let Some(cycle) = find_cycle(&me, &depends_on(sr), all, &mut path, &mut seen) {
        return Dependencies::Cycle(cycle.join(" -> "));
    }
    for dependency in depends_on(sr) {
        let Some(other) = all.get(&dependency) else {
            return Dependencies::Waiting(format!(
                "waiting for SequencedRelease {dependency}, which does not exist"
            ));
        };
        let status = other.status.as_ref();
        let ready = status.is_some_and(|s| {
            s.observed_generation == other.metadata.generation
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == rollout::READY && c.status == "True")
        });
        if !ready {
            return Dependencies::Waiting(format!(
                "waiting for SequencedRelease {dependency} to be Ready"
            ));
        }
    }
    Dependencies::Ready
}

fn find_cycle(
    me: &str,
    next: &[String],
    all: &BTreeMap<String, Arc<SequencedRelease>>,
    path: &mut Vec<String>,
    seen: &mut HashSet<String>,
) -> Option<Vec<String>> {
    for dependency in next {
        if dependency == me {
            let mut cycle = path.clone();
            cycle.push(me.to_string());
            return Some(cycle);
        }
        if !seen.insert(dependency.clone()) {
            continue;
        }
        if let Some(other) = all.get(dependency) {
            path.push(dependency.clone());
            if let Some(cycle) = find_cycle(me, &depends_on(other), all, path, seen) {
                return Some(cycle);
            }
            path.pop();
        }
    }
    None
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
