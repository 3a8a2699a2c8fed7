//! What every reconcile of this controller shares: the clients, the caches, the watches, the
//! lock table, and what it keeps per release between reconciles (its own writes the cache may
//! not show yet, errors in a row, when each operation was first seen and each release's objects
//! last compared).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Options;
use super::events::Events;
use super::plans::Plans;
use super::records::Records;
use super::remotes::{Remote, Remotes};
use super::source::Sources;
use super::watches::Watches;
use crate::api::{ReleasePhase, SequencedRelease};
use crate::cluster::{Account, Cluster, Health};
use crate::lock::{Locks, Shards};
use crate::rollout;

/// How many impersonating clients are kept (each holds a connection pool and its discovery).
const ACCOUNTS: std::num::NonZeroUsize = std::num::NonZeroUsize::new(256).expect("not zero");

/// Where a release acts: on the cluster the controller runs in (`remote` None) or on a remote
/// one, as an account or (`account` None) as the controller.
#[derive(Clone, Copy, Default)]
pub(crate) struct Place<'a> {
    pub remote: Option<&'a Remote>,
    pub account: Option<&'a Account>,
}

impl<'a> From<Option<&'a Account>> for Place<'a> {
    fn from(account: Option<&'a Account>) -> Place<'a> {
        Place {
            remote: None,
            account,
        }
    }
}

/// What every reconcile shares.
pub(crate) struct Context {
    pub client: Client,
    /// The controller's own configuration, from which the clients that impersonate service
    /// accounts are made.
    pub config: kube::Config,
    /// The API server as the controller itself.
    pub cluster: Arc<Cluster>,
    /// The API server as each service account a release acts as, the most recently used ones
    /// ([`ACCOUNTS`] at most: a tenant that names many accounts does not grow it for ever).
    accounts: Mutex<lru::LruCache<Account, Arc<Cluster>>>,
    pub options: Options,
    pub store: Store<SequencedRelease>,
    pub watches: Watches,
    pub events: Events,
    pub sources: Sources,
    pub plans: Plans,
    pub records: Records,
    /// The remote clusters releases target (`spec.kubeConfig`).
    pub remotes: Arc<Remotes>,
    pub locks: Arc<Locks>,
    /// The shards this replica owns: it acts on their releases only.
    pub shards: Arc<Shards>,
    /// When this controller first saw each operation in progress (`spec.timeout`).
    pub operations: Operations,
    /// When each release's objects were last compared with what it applied.
    drift_checks: Mutex<HashMap<ObjectRef<SequencedRelease>, Instant>>,
    /// The releases this controller wrote and its cache may not show yet.
    written: Mutex<HashMap<ObjectRef<SequencedRelease>, Written>>,
    /// Errors in a row per release, for the backoff.
    failures: Mutex<HashMap<ObjectRef<SequencedRelease>, u32>>,
    /// Failures of each release that its status could not tell (it could not be written).
    untold: Mutex<HashMap<ObjectRef<SequencedRelease>, Untold>>,
    /// Set on SIGTERM: no new step starts.
    stopping: AtomicBool,
    /// The releases in progress when the API server answered again after an outage, until
    /// their first step.
    pub recovery: super::outage::Recovery,
    /// Each release's CEL (`healthCheckExprs`, `dependsOn[].readyExpr`), compiled once per
    /// generation of its spec.
    expressions: Mutex<HashMap<ObjectRef<SequencedRelease>, CompiledExpressions>>,
}

/// A release's compiled CEL, and the generation of the spec it was compiled from.
type CompiledExpressions = (Option<i64>, Arc<Result<rollout::Expressions, String>>);

/// A release as this controller last wrote it, and the resourceVersions its writes replaced.
struct Written {
    replaced: Vec<String>,
    object: Arc<SequencedRelease>,
}

impl Context {
    /// The context of a controller with these clients, caches and options; nothing kept yet.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        config: kube::Config,
        health: Arc<Health>,
        options: Options,
        store: Store<SequencedRelease>,
        watches: Watches,
        events: Events,
        locks: Arc<Locks>,
        shards: Arc<Shards>,
    ) -> Context {
        Context {
            remotes: Arc::clone(watches.remotes()),
            cluster: Arc::new(Cluster::with_health(client.clone(), health)),
            accounts: Mutex::new(lru::LruCache::new(ACCOUNTS)),
            config,
            watches,
            events,
            sources: Sources::default(),
            plans: Plans::default(),
            records: Records::new(client.clone()),
            client,
            options,
            store,
            failures: Mutex::new(HashMap::new()),
            untold: Mutex::new(HashMap::new()),
            operations: Operations::default(),
            drift_checks: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            locks,
            shards,
            stopping: AtomicBool::new(false),
            recovery: super::outage::Recovery::default(),
            expressions: Mutex::new(HashMap::new()),
        }
    }

    /// The context of a command-line driver (`drive::Driver`): as [`Context::new`] (the
    /// command's home marks the records it writes `sequenced.dev/driver: cli`).
    #[allow(clippy::too_many_arguments)]
    pub fn for_command_line(
        client: Client,
        config: kube::Config,
        health: Arc<Health>,
        options: Options,
        store: Store<SequencedRelease>,
        watches: Watches,
        events: Events,
        locks: Arc<Locks>,
        shards: Arc<Shards>,
    ) -> Context {
        Context::new(
            client, config, health, options, store, watches, events, locks, shards,
        )
    }

    /// The release's CEL, compiled: from the cache when its spec's generation has not
    /// changed since, else compiled now and kept.
    pub fn expressions(&self, sr: &SequencedRelease) -> Arc<Result<rollout::Expressions, String>> {
        let key = ObjectRef::from_obj(sr);
        let generation = sr.metadata.generation;
        let mut cached = self.expressions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, compiled)) = cached.get(&key)
            && *at == generation
        {
            return Arc::clone(compiled);
        }
        let compiled = Arc::new(rollout::Expressions::compile(&sr.spec));
        cached.insert(key, (generation, Arc::clone(&compiled)));
        compiled
    }

    /// SIGTERM: no new step starts from now on.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// A reconcile of `release` failed: how many did in a row, this one included.
    pub fn failed(&self, release: ObjectRef<SequencedRelease>) -> u32 {
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(release).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// The API server answers again after an outage: every release's errors in a row are
    /// forgotten, so that the backoff grown while it was away does not hold them back.
    pub fn forgive_all(&self) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.clear();
        }
    }

    /// The `failures`-th failure in a row of `release`, `error`, could not be told in its
    /// status at `now`.
    pub fn untold(
        &self,
        release: &ObjectRef<SequencedRelease>,
        failures: u32,
        error: &str,
        now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    ) {
        let mut untold = self.untold.lock().unwrap_or_else(|e| e.into_inner());
        let entry = untold.entry(release.clone()).or_insert_with(|| Untold {
            failures,
            since: now.clone(),
            last: String::new(),
        });
        entry.failures = failures;
        entry.last = error.to_string();
    }

    /// The failures of `release` its status could not tell, once (forgotten here).
    pub fn take_untold(&self, release: &ObjectRef<SequencedRelease>) -> Option<Untold> {
        self.untold.lock().ok()?.remove(release)
    }

    /// A reconcile of `release` went through: the errors in a row start again from none.
    pub fn succeeded(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(release);
        }
    }

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

    /// The API server of `place` (AGREEMENTS §3): the cluster the controller runs in or a
    /// remote cluster (`spec.kubeConfig`), as the release's account (impersonated) or as the
    /// controller itself (on a remote cluster: the kubeconfig's own identity). An account alone
    /// (`ctx.cluster_for(account)`) is the cluster the controller runs in.
    pub fn cluster_for<'a>(
        &self,
        place: impl Into<Place<'a>>,
    ) -> Result<Arc<Cluster>, kube::Error> {
        let Place { remote, account } = place.into();
        if let Some(remote) = remote {
            return remote.as_account(account);
        }
        let Some(account) = account else {
            return Ok(Arc::clone(&self.cluster));
        };
        let mut accounts = self.accounts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = accounts.get(account) {
            return Ok(Arc::clone(cluster));
        }
        let cluster = Arc::new(self.cluster.acting_as(&self.config, account.clone())?);
        accounts.put(account.clone(), Arc::clone(&cluster));
        Ok(cluster)
    }

    /// Forgets what the caches keep of a release that is gone.
    pub fn forget(&self, release: &ObjectRef<SequencedRelease>) {
        // The clients and watches of a remote cluster no release targets any more go.
        for id in self.remotes.target(release, None).0 {
            self.watches.forget_remote(&id);
        }
        self.sources.forget(release);
        self.watches.forget_reads(release);
        self.watches.forget_changed(release);
        self.plans.forget(release);
        self.records.forget(release);
        self.operations.forget(release);
        self.recovery.forget(release);
        if let Ok(mut untold) = self.untold.lock() {
            untold.remove(release);
        }
        if let Ok(mut checks) = self.drift_checks.lock() {
            checks.remove(release);
        }
        if let Ok(mut written) = self.written.lock() {
            written.remove(release);
        }
        if let Ok(mut expressions) = self.expressions.lock() {
            expressions.remove(release);
        }
    }

    /// Whether the release's objects are due for a full comparison with what it applied without
    /// a watch event that says one changed: once every `interval`
    /// (`--drift-full-check-interval`), and once when this controller first sees the release
    /// Ready.
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
pub(crate) struct Operations {
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

/// Failures in a row that a release's status could not tell.
pub(crate) struct Untold {
    /// How many reconciles failed in a row, by the last one.
    pub failures: u32,
    /// When the first of them could not be told.
    pub since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// The last error.
    pub last: String,
}
