//! The second driver of the executor: one release stepped from a command (`sequenced install`,
//! `upgrade`, `rollback`, `uninstall`) instead of a kube-runtime controller. It runs the same
//! reconcile (the lifecycle's step, executed by `reconcile/`), with a [`Home`] of the command's
//! own (the release record instead of a SequencedRelease object), and nothing in the cluster but
//! the release's objects, its records and its Lease: no CRD, no watch of SequencedReleases, no
//! shard Leases. What wakes the release between steps is the same metadata watches of the kinds
//! it applied that the operator uses; a step that waits is otherwise looked at again after a
//! short delay.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::events::Events;
use super::home::Home;
use super::watches::Watches;
use super::{Error, Halt, Options, Stop, kube_error, reconcile};
use crate::api::{Identity, Reason, SequencedRelease};
use crate::cluster::{Health, health};
use crate::history::HelmStatus;
use crate::lock::{Locks, Shards};
use crate::rollout::{self, RecordUpdate};

/// How one step went.
#[derive(Debug)]
pub enum Stepped {
    /// The step was taken (or there was nothing to do): look at the release again.
    Taken,
    /// Another session holds the release's Lease: try again after `retry_after` at the latest
    /// (it may be released sooner).
    Busy {
        holder: String,
        retry_after: Duration,
    },
    /// The lock was held, and another session has it now.
    Lost { holder: String },
    /// The command is stopping: no step was started.
    Interrupted,
}

/// One release driven from a command line.
pub struct Driver {
    ctx: Arc<Context>,
    woken: tokio::sync::Mutex<UnboundedReceiver<ObjectRef<SequencedRelease>>>,
}

impl Driver {
    /// A driver with the identity `options.identity` (`cli:USER@HOST`) on the cluster of
    /// `config`. Nothing is read or written yet.
    pub fn new(config: kube::Config, options: Options) -> Result<Driver, Box<Error>> {
        let mut config = config;
        config.default_retry = false;
        let health = Arc::new(Health::new());
        let client = health::client(config.clone(), &health)
            .map_err(|e| kube_error("making a client")(e))?;
        let identity = options.identity.clone();
        let (trigger, woken) = futures::channel::mpsc::unbounded();
        let shards = Arc::new(Shards::new(
            client.clone(),
            identity.clone(),
            options.sharding.clone(),
            Arc::clone(&health),
        ));
        let locks = Arc::new(Locks::for_command_line(
            client.clone(),
            identity.clone(),
            Arc::clone(&shards),
        ));
        let (_store, writer) = kube::runtime::reflector::store::<SequencedRelease>();
        let store = writer.as_reader();
        let ctx = Context::for_command_line(
            client.clone(),
            config,
            health,
            options,
            store,
            Watches::new(client.clone(), trigger, Arc::clone(&shards)),
            Events::new(client, "sequenced".to_string(), identity),
            locks,
            shards,
        );
        Ok(Driver {
            ctx: Arc::new(ctx),
            woken: tokio::sync::Mutex::new(woken),
        })
    }

    /// The client of the driver's cluster.
    pub fn client(&self) -> kube::Client {
        self.ctx.client.clone()
    }

    /// Takes the step the lifecycle chooses for `sr` now, its status, finalizer and notes going
    /// to `home`. An error is the reconcile's (an API call that failed); the status says so
    /// from the second in a row, as the operator's does.
    pub(crate) async fn step(
        &self,
        sr: Arc<SequencedRelease>,
        home: &dyn Home,
    ) -> Result<Stepped, Error> {
        let key = ObjectRef::from_obj(&*sr);
        match reconcile::reconcile(sr, &self.ctx, home).await {
            Ok(_) => {
                self.ctx.succeeded(&key);
                Ok(Stepped::Taken)
            }
            Err(Stop::Failed(error)) => {
                self.ctx.failed(key);
                Err(error)
            }
            Err(Stop::Halted(halt)) => Ok(match halt {
                Halt::Busy {
                    holder,
                    retry_after,
                } => Stepped::Busy {
                    holder,
                    retry_after,
                },
                Halt::Lost { holder } => Stepped::Lost { holder },
                Halt::Interrupted => Stepped::Interrupted,
                // The home keeps the fresher release the restart is for.
                Halt::Restart(_) => Stepped::Taken,
            }),
        }
    }

    /// Waits until something the release applied changes, or `at_most`.
    pub async fn wait(&self, at_most: Duration) {
        let mut woken = self.woken.lock().await;
        let _ = tokio::time::timeout(at_most, woken.next()).await;
        // Wakes that came together count once.
        while woken.try_recv().is_ok() {}
    }

    /// A signal came: no further step starts (one in flight stops before its next write).
    pub fn stop(&self) {
        self.ctx.stop();
    }

    /// Whether this driver holds the release's Lease.
    pub fn holds(&self, sr: &SequencedRelease) -> bool {
        self.ctx.locks.holds(&ObjectRef::from_obj(sr))
    }

    /// How many reconciles of the release failed in a row.
    pub fn failures(&self, sr: &SequencedRelease) -> u32 {
        self.ctx.failures_of(&ObjectRef::from_obj(sr))
    }

    /// After a signal: when this driver holds the release's Lease, the revision in progress is
    /// marked failed with `message` (the status in `home`, the record's Helm status `failed`),
    /// and the Lease is released, so that the next command starts at once. A release whose
    /// Lease another session holds is left alone.
    pub(crate) async fn interrupt(
        &self,
        sr: &SequencedRelease,
        home: &dyn Home,
        message: &str,
    ) -> Result<(), Error> {
        let key = ObjectRef::from_obj(sr);
        if !self.ctx.locks.holds(&key) {
            return Ok(());
        }
        let now = rollout::seconds(Time(k8s_openapi::jiff::Timestamp::now()));
        let current = sr.status.clone().unwrap_or_default();
        let mut result = Ok(());
        if rollout::holds_lock(current.phase) {
            let status = rollout::status::stalled(
                &current,
                sr.metadata.generation,
                Reason::Interrupted,
                message,
                &now,
            );
            let mut written = sr.clone();
            written.status = Some(status);
            result = home.replace_status(&self.ctx, &written).await.map(|_| ());
            if let Some(revision) = current.revision {
                let update = RecordUpdate {
                    only_from: None,
                    ..RecordUpdate::new(revision, HelmStatus::Failed, message.to_string())
                };
                let me = Identity::of(sr);
                let pending = self
                    .ctx
                    .records
                    .get(&key, &me, revision)
                    .await?
                    .is_some_and(|r| r.info.status.is_pending());
                if pending {
                    self.ctx.records.update(&key, &me, &update).await?;
                }
            }
        }
        self.ctx.locks.release(&key).await?;
        result
    }

    /// Releases the release's Lease if this driver still holds it.
    pub async fn release(&self, sr: &SequencedRelease) {
        if let Err(e) = self.ctx.locks.release(&ObjectRef::from_obj(sr)).await {
            tracing::debug!(error = %e, "releasing the lease; it expires by itself");
        }
    }
}
