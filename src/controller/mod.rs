//! The controller: kube-runtime wiring that executes, for each SequencedRelease, the one step the
//! pure lifecycle ([`crate::rollout::lifecycle`]) chooses. It decides nothing itself.
//!
//! Split by job (no file imports one that imports it back):
//! - [`run`]: wiring (the controller, its watches, the lease and discovery watches), the error
//!   policy and shutdown;
//! - [`context`]: what every reconcile shares (clients, caches, the lock table, what is kept per
//!   release between reconciles);
//! - [`reconcile`]: one reconcile: gather the facts the lifecycle asks for, then execute its
//!   step (`reconcile/execute.rs`) and write the status it is handed, under the release's lock
//!   (`reconcile/writes.rs`, also where a failed reconcile is told);
//! - [`home`]: where the status, the finalizer and the notes of a release go (the
//!   SequencedRelease object and its Events, for the operator);
//! - [`source`]: the spec's inputs (chart source, `valuesFrom`), resolved, and their digest;
//! - [`dependencies`]: what `dependsOn` names (releases, any object), read and watched;
//! - [`plans`]: the plan cache, rendering through the chart pipeline;
//! - [`records`]: the release records in the cluster; `kubeconfigs`: the kubeconfig Secrets of
//!   remote releases kept (a finalizer) while a release needs them;
//! - [`objects`]: applying, deleting and observing the release's objects;
//! - [`watches`]: what wakes a release besides its own object; [`stats`]: CPU time;
//! - [`events`]: the Events recorded on a release, one per distinct note;
//! - `outage`: waiting for the API server at start, the trigger stream that never pauses, and
//!   where the time goes after an outage.

mod context;
mod dependencies;
pub mod drive;
mod events;
mod home;
mod inputs;
mod kubeconfigs;
mod leftovers;
mod objects;
mod outage;
pub mod plans;
mod reconcile;
pub mod records;
mod remotes;
mod run;
pub mod source;
pub mod stats;
mod target;
pub mod watches;

use std::sync::Arc;
use std::time::Duration;

use crate::api::SequencedRelease;
use crate::chart::source::ChartCache;
use crate::cluster::ClusterError;
use crate::helm::Helm;
use crate::lock::LockError;

pub(crate) use context::Context;
pub(crate) use home::{Home, Written};
pub use objects::as_applied;
pub use run::{backoff, run};

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub helm: Helm,
    /// kubectl, for the kustomize of `spec.postRenderers`; found when first needed.
    pub kubectl: crate::kubectl::Kubectl,
    pub cache: ChartCache,
    /// How many releases are reconciled at once.
    pub concurrency: u16,
    /// Who this controller is, for events.
    pub identity: String,
    /// The Prometheus metrics the controller updates.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Whose rights releases act with, and which references they may make.
    pub tenancy: Tenancy,
    /// How releases are divided among replicas.
    pub sharding: crate::lock::Sharding,
    /// How often a Ready release's objects are compared in full with what it applied when no
    /// watch event said one changed (`--drift-full-check-interval`, 24 h by default).
    pub drift_full_check_interval: Duration,
    /// `--take-pending-after`: how long a pending record of Helm's must stay unchanged before a
    /// release with `spec.adopt: true` marks it failed and goes on.
    pub take_pending_after: std::time::Duration,
}

/// The default of `--drift-full-check-interval`.
pub const DRIFT_FULL_CHECK_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// The ServiceAccount `sr` acts as, in the release's own namespace (the pure rule:
/// [`crate::rollout::lifecycle::account_name`]); Ok(None) for the controller's own identity,
/// Err(why) when the release may not act at all (the lifecycle stalls it with that message).
pub(crate) fn account_of(
    sr: &SequencedRelease,
    tenancy: &Tenancy,
) -> Result<Option<crate::cluster::Account>, String> {
    let name = crate::rollout::lifecycle::account_name(&sr.spec, &tenancy.accounts())?;
    Ok(name.map(|name| crate::cluster::Account {
        namespace: sr
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name,
    }))
}

/// What a release may do, for clusters shared by teams.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    /// The ServiceAccount (in the release's own namespace) a release without
    /// `spec.serviceAccountName` acts as; None: the controller's own identity, unless
    /// multi-tenant.
    pub default_service_account: Option<String>,
    /// Refuse `targetNamespace` and `dependsOn` outside the release's own namespace.
    pub no_cross_namespace_refs: bool,
    /// `--multi-tenant`: no release acts as the controller, tenant inputs are read as the
    /// release's account, local charts are refused outside `allow_local_charts`. Also on when
    /// `default_service_account` is set ([`Tenancy::is_multi_tenant`]).
    pub multi_tenant: bool,
    /// `--allow-local-charts`: the directories `spec.chart.path` may be under in multi-tenant
    /// mode.
    pub allow_local_charts: Vec<std::path::PathBuf>,
    /// `--require-verified-charts`: a release without `spec.chart.verify` is refused.
    pub require_verified_charts: bool,
}

impl Tenancy {
    /// Multi-tenant mode: `--multi-tenant`, or a `--default-service-account` (a hand-written
    /// Deployment with the lockdown flags gets every protection).
    pub fn is_multi_tenant(&self) -> bool {
        self.multi_tenant || self.default_service_account.is_some()
    }

    /// What the lifecycle needs to judge whose rights a release acts with.
    pub fn accounts(&self) -> crate::rollout::lifecycle::AccountPolicy {
        crate::rollout::lifecycle::AccountPolicy {
            default_service_account: self.default_service_account.clone(),
            multi_tenant: self.is_multi_tenant(),
        }
    }
}

/// How many helm timeouts in a row stall a release (`RenderTimeout`).
const TIMEOUTS_IN_A_ROW: u32 = 3;
/// How long a release stalled by timeouts waits before helm is run for it again.
const TIMEOUT_HOLD: Duration = Duration::from_secs(600);

/// Helm timeouts in a row, by release and the digest they were for: a chart that makes helm
/// time out again and again (a render without end, a source that never answers) stalls its
/// release `RenderTimeout` instead of holding helm's slots for ever; it is tried again after
/// [`TIMEOUT_HOLD`], or at once when its inputs change.
#[derive(Default)]
pub(crate) struct TimeoutStreaks {
    streaks: std::sync::Mutex<
        std::collections::HashMap<
            kube::runtime::reflector::ObjectRef<SequencedRelease>,
            (String, u32, std::time::Instant),
        >,
    >,
}

impl TimeoutStreaks {
    fn refusal(what: &str, count: u32) -> crate::rollout::lifecycle::Refusal {
        crate::rollout::lifecycle::Refusal {
            reason: crate::api::Reason::RenderTimeout,
            message: format!(
                "{what} did not finish in time {count} times in a row; it is run again in {} \
                 or when the release's spec or inputs change",
                crate::readiness::format_duration(TIMEOUT_HOLD)
            ),
        }
    }

    /// Helm timed out for `release` on `digest`: the refusal that stalls it once the streak is
    /// long enough, else None (the error is retried with backoff).
    pub fn timed_out(
        &self,
        release: &kube::runtime::reflector::ObjectRef<SequencedRelease>,
        digest: &str,
        what: &str,
    ) -> Option<crate::rollout::lifecycle::Refusal> {
        let mut streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
        let entry = streaks
            .entry(release.clone())
            .or_insert_with(|| (digest.to_string(), 0, std::time::Instant::now()));
        if entry.0 != digest {
            *entry = (digest.to_string(), 0, std::time::Instant::now());
        }
        entry.1 = entry.1.saturating_add(1);
        entry.2 = std::time::Instant::now();
        (entry.1 >= TIMEOUTS_IN_A_ROW).then(|| Self::refusal(what, entry.1))
    }

    /// The refusal of a release whose streak holds it back now (same digest, within the hold).
    pub fn stalled(
        &self,
        release: &kube::runtime::reflector::ObjectRef<SequencedRelease>,
        digest: &str,
        what: &str,
    ) -> Option<crate::rollout::lifecycle::Refusal> {
        let streaks = self.streaks.lock().unwrap_or_else(|e| e.into_inner());
        let (at, count, since) = streaks.get(release)?;
        (at == digest && *count >= TIMEOUTS_IN_A_ROW && since.elapsed() < TIMEOUT_HOLD)
            .then(|| Self::refusal(what, *count))
    }

    /// Helm finished for `release` (or it is gone): the streak ends.
    pub fn ended(&self, release: &kube::runtime::reflector::ObjectRef<SequencedRelease>) {
        self.streaks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(release);
    }
}

/// What stops a reconcile and is retried with backoff. Each variant keeps its cause's type;
/// whether trying again can help was decided by the cause before it got here.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::Error),
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A ConfigMap or Secret the spec names could not be read.
    #[error("reading {what}: {source}")]
    SpecRead {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A bug: the controller could not do what the lifecycle asked.
    #[error("{0}")]
    Internal(String),
    /// The remote cluster of `spec.kubeConfig` does not answer.
    #[error("the remote cluster {server} ({origin}) is unreachable: {message}")]
    Unreachable {
        server: String,
        /// The Secret it was read from.
        origin: String,
        message: String,
    },
}

impl Error {
    /// A fixed short category, for metrics labels and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Cluster(e) => e.category(),
            Error::Unreachable { .. } => "remote_unreachable",
            Error::Pipeline(_) => "chart",
            Error::Kube { .. } | Error::Lock(_) => "api",
            Error::SpecRead { .. } => "spec_read",
            Error::Internal(_) => "internal",
        }
    }

    /// Whether the API server (or etcd behind it) could not serve the request: no answer, a
    /// 5xx or 429, or a starting server's refusal. Such failures are told once the status can be
    /// written again, even the first of a run ([`Context::untold`]).
    pub fn server_side(&self) -> bool {
        fn unavailable(source: &kube::Error) -> bool {
            match source {
                kube::Error::Api(status) => status.code >= 500 || status.code == 429,
                _ => true,
            }
        }
        match self {
            Error::Cluster(ClusterError::Starting { .. }) => true,
            Error::Cluster(ClusterError::Discovery(source))
            | Error::Cluster(ClusterError::Api { source, .. })
            | Error::Kube { source, .. }
            | Error::SpecRead { source, .. }
            | Error::Lock(LockError::Api { source, .. }) => unavailable(source),
            // The remote cluster's own unreachability is its own condition, told at once.
            Error::Cluster(_)
            | Error::Pipeline(_)
            | Error::Internal(_)
            | Error::Unreachable { .. } => false,
        }
    }

    /// How soon to try again when the request that failed met an API server that is starting
    /// (the one judgement: [`crate::cluster::starting`]): its `retryAfterSeconds`, or a second
    /// for a refusal while it starts. None for everything else, which backs off.
    pub fn retry_soon(&self, health: &crate::cluster::Health) -> Option<Duration> {
        match self {
            Error::Cluster(e) => e.retry_soon(),
            Error::Kube { source, .. }
            | Error::SpecRead { source, .. }
            | Error::Lock(LockError::Api { source, .. }) => {
                crate::cluster::starting(health, source)
            }
            Error::Pipeline(_) | Error::Internal(_) | Error::Unreachable { .. } => None,
        }
    }
}

impl Error {
    /// Whether a request got no answer at all (see [`ClusterError::is_unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Cluster(e) => e.is_unreachable(),
            Error::Kube { source, .. } => crate::cluster::unanswered(source),
            Error::Unreachable { .. } => true,
            _ => false,
        }
    }
}

/// A failed API call on `what`.
fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube { what, source }
}

/// Why a reconcile stopped early without failing: control flow, not an error.
#[derive(Debug)]
enum Halt {
    /// The controller is shutting down: no new step starts.
    Interrupted,
    /// Another session holds the release's lock (or won the race for it).
    Busy {
        holder: String,
        retry_after: Duration,
    },
    /// This controller held the lock, but another session has it now.
    Lost { holder: String },
    /// The lock was just taken and the release had changed since it was read: start again from
    /// the object as it is now.
    Restart(Box<SequencedRelease>),
}

/// What ends a reconcile early: an error (retried with backoff) or a halt.
#[derive(Debug)]
enum Stop {
    Failed(Error),
    Halted(Halt),
}

impl From<Error> for Stop {
    fn from(error: Error) -> Stop {
        Stop::Failed(error)
    }
}

impl From<ClusterError> for Stop {
    fn from(error: ClusterError) -> Stop {
        Stop::Failed(error.into())
    }
}

impl From<LockError> for Stop {
    fn from(error: LockError) -> Stop {
        Stop::Failed(error.into())
    }
}

impl From<Halt> for Stop {
    fn from(halt: Halt) -> Stop {
        Stop::Halted(halt)
    }
}
