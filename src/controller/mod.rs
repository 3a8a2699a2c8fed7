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
//! - [`source`]: the spec's inputs (chart source, `valuesFrom`), resolved, and their digest;
//! - [`dependencies`]: what `dependsOn` names (releases, any object), read and watched;
//! - [`plans`]: the plan cache, rendering through the chart pipeline;
//! - [`records`]: the release records in the cluster;
//! - [`objects`]: applying, deleting and observing the release's objects;
//! - [`watches`]: what wakes a release besides its own object; [`stats`]: CPU time;
//! - [`events`]: the Events recorded on a release, one per distinct note.

mod context;
mod dependencies;
mod events;
mod objects;
pub mod plans;
mod reconcile;
pub mod records;
mod run;
pub mod source;
pub mod stats;
pub mod watches;

use std::sync::Arc;
use std::time::Duration;

use crate::api::SequencedRelease;
use crate::chart::source::ChartCache;
use crate::cluster::ClusterError;
use crate::helm::Helm;
use crate::lock::LockError;

pub use objects::as_applied;
pub use run::{backoff, run};

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
    /// Whose rights releases act with, and which references they may make.
    pub tenancy: Tenancy,
    /// How releases are divided among replicas.
    pub sharding: crate::lock::Sharding,
}

/// The ServiceAccount `sr` acts as: its `spec.serviceAccountName`, else the controller's
/// default, in the release's own namespace; None for the controller's own identity.
pub(crate) fn account_of(
    sr: &SequencedRelease,
    tenancy: &Tenancy,
) -> Option<crate::cluster::Account> {
    let name = sr
        .spec
        .service_account_name
        .as_ref()
        .or(tenancy.default_service_account.as_ref())
        .filter(|n| !n.is_empty())?;
    Some(crate::cluster::Account {
        namespace: sr
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        name: name.clone(),
    })
}

/// What a release may do, for clusters shared by teams.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    /// The ServiceAccount (in the release's own namespace) a release without
    /// `spec.serviceAccountName` acts as; None: the controller's own identity.
    pub default_service_account: Option<String>,
    /// Refuse `targetNamespace` and `dependsOn` outside the release's own namespace.
    pub no_cross_namespace_refs: bool,
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
}

impl Error {
    /// A fixed short category, for metrics labels and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Cluster(e) => e.category(),
            Error::Pipeline(_) => "chart",
            Error::Kube { .. } | Error::Lock(_) => "api",
            Error::SpecRead { .. } => "spec_read",
            Error::Internal(_) => "internal",
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
