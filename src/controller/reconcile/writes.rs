//! What a reconcile writes about the release itself, under its lock: the status (and the
//! lock's mirror in it), a failed reconcile told in the conditions, the Events; taking, renewing
//! and releasing the lock.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::{FORBIDDEN_RETRY, MAX_MESSAGE, Reconcile};
use crate::api::{EventReason, Reason, ReleasePhase, SequencedReleaseStatus};
use crate::cluster::ClusterError;
use crate::controller::home::Written;
use crate::controller::{Error, Halt, Stop};
use crate::lock::Acquired;
use crate::rollout::{self, Note};

impl Reconcile<'_> {
    /// A step that failed again for a transient reason keeps the conditions that tell the
    /// failure (the step had set them back, expecting to go through): the status this reconcile
    /// writes is then what it was, so that its own write does not wake the release at once and
    /// the retry backs off.
    pub(super) fn keep_told_failure(&self, status: &mut SequencedReleaseStatus) {
        if rollout::status::tells_reconcile_failure(&self.facts.status) {
            status.conditions = self.facts.status.conditions.clone();
        }
    }

    /// This reconcile failed with `error`: from the second failure in a row on (at once when the
    /// release has no conditions yet, or while an API group it needs is unavailable), the
    /// conditions and a Warning event say what failed, so that no retry is silent. The phase and
    /// message stay as they are; the next reconcile that goes through sets the conditions back.
    pub(super) async fn report(&mut self, error: &Error) {
        let attempt = self.ctx.failures_of(&self.key).saturating_add(1);
        // A remote cluster that does not answer is told at once, as a group that is down.
        let unreachable = matches!(error, Error::Unreachable { .. });
        let waiting =
            unreachable || matches!(error, Error::Cluster(ClusterError::GroupUnavailable { .. }));
        let unseen = self.facts.status.conditions.is_empty();
        if self.ctx.stopping() {
            return;
        }
        if attempt < 2 && !waiting && !unseen {
            // The API server could not serve it: told after it can, if this was all before a
            // long silence (a replica cut off stops reconciling).
            if error.server_side() {
                self.ctx
                    .untold(&self.key, attempt, &error.to_string(), &self.facts.now);
            }
            return;
        }
        // The same words at every failure: a status that changed would wake the release at once
        // (its own write), and the retry would not back off.
        let (reason, message) = if unreachable {
            (
                Reason::RemoteClusterUnreachable,
                format!("waiting: {error}; asked again with backoff"),
            )
        } else if waiting {
            (
                Reason::GroupUnavailable,
                format!("waiting: {error}; asked again with backoff"),
            )
        } else {
            (
                Reason::ReconcileFailed,
                format!("reconcile failed, tried again with backoff: {error}"),
            )
        };
        let status = rollout::status::reconcile_failed(
            &self.facts.status,
            reason,
            &message,
            &self.facts.now,
        );
        if let Err(stop) = self.write_status(&status).await {
            // The API server (or etcd behind it) could not store it: told once it can.
            tracing::debug!(?stop, "could not tell a failed reconcile in the status");
            self.ctx
                .untold(&self.key, attempt, &error.to_string(), &self.facts.now);
            return;
        }
        // Told now: the failures of the run before this one need no telling after.
        self.ctx.take_untold(&self.key);
        let event = if unreachable {
            EventReason::RemoteClusterUnreachable
        } else {
            EventReason::ReconcileFailed
        };
        self.publish(&[Note::warning(event, error.to_string())])
            .await;
    }

    /// After a reconcile that went through: the failures the API server could not serve, whose
    /// telling in the status it could not store either (or that were the first of their run),
    /// are told by a Warning event, naming how many, since when, and the last.
    pub(super) async fn tell_untold(&self) {
        let Some(untold) = self.ctx.take_untold(&self.key) else {
            return;
        };
        let message = format!(
            "{} reconcile(s) failed in a row from {} while the API server could not serve them, and the status did not tell it then; the last: {}",
            untold.failures,
            untold.since.0.strftime("%Y-%m-%dT%H:%M:%SZ"),
            untold.last
        );
        self.publish(&[Note::warning(EventReason::ReconcileFailed, message)])
            .await;
    }

    /// The release's service account may not read what the lifecycle needs to see: Failed and
    /// Stalled with reason `Forbidden` (an uninstall stays Uninstalling, Stalled), looked at
    /// again a minute later or when the release changes.
    pub(super) async fn forbidden(&mut self, refused: &ClusterError) -> Result<Action, Stop> {
        let message = refused.to_string();
        let uninstalling = self.sr().metadata.deletion_timestamp.is_some()
            || self.facts.status.phase == Some(ReleasePhase::Uninstalling);
        let status = if uninstalling {
            let mut status = self.facts.status.clone();
            status.message = Some(message.clone());
            rollout::status::set_stalled(&mut status, Reason::Forbidden, &message, &self.facts.now);
            status
        } else {
            rollout::status::stalled(
                &self.facts.status,
                self.sr().metadata.generation,
                Reason::Forbidden,
                &message,
                &self.facts.now,
            )
        };
        let event = (self.facts.status.message.as_deref() != Some(message.as_str()))
            .then(|| Note::warning(EventReason::Stalled, message.clone()));
        self.write_status(&status).await?;
        self.publish(event.as_slice()).await;
        Ok(Action::requeue(FORBIDDEN_RETRY.min(self.settings.interval)))
    }

    /// Writes `status` unless it is what the object already has, under the release's lock.
    /// While an operation is in progress the status mirrors the lock (renewed when due); once it
    /// has ended, the lock is released after the write.
    pub(super) async fn write_status(
        &mut self,
        status: &SequencedReleaseStatus,
    ) -> Result<(), Stop> {
        let keep = rollout::holds_lock(status.phase);
        if keep && self.ctx.locks.holds(&self.key) {
            self.lock().await?;
        }
        let mut status = status.clone();
        status.lock = keep.then(|| self.ctx.locks.mirror(&self.key)).flatten();
        status.acting_as = Some(match &self.remote {
            None => self
                .cluster
                .account()
                .map_or_else(|| "controller".to_string(), ToString::to_string),
            Some(remote) => format!(
                "{} on the remote cluster {}",
                self.cluster
                    .account()
                    .map_or_else(|| "the kubeconfig's user".to_string(), ToString::to_string),
                remote.server
            ),
        });
        if let Some(message) = status.message.as_mut() {
            cut(message);
        }
        for layer in &mut status.layers {
            if let Some(message) = layer.message.as_mut() {
                cut(message);
            }
        }
        if self.sr().status.as_ref() != Some(&status) {
            self.lock().await?;
            status.lock = keep.then(|| self.ctx.locks.mirror(&self.key)).flatten();
            self.write_status_as_is(&status).await?;
        }
        if !keep {
            self.unlock().await;
        }
        if status.phase == Some(ReleasePhase::Ready) {
            // Until something is applied again, the plan is only looked at.
            self.ctx.plans.slim(&self.key);
        }
        Ok(())
    }

    /// Replaces the status. What is written is what the rest of this reconcile goes on from. On
    /// a 409 (the release changed since the copy this reconcile went from: another replica's
    /// write, one the cache has not shown yet, or lost) the release is read again at once and the
    /// reconcile starts again from it ([`Reconcile::conflicted`]): it never waits for an event
    /// that may have come already.
    pub(super) async fn write_status_as_is(
        &mut self,
        status: &SequencedReleaseStatus,
    ) -> Result<(), Stop> {
        let mut object = self.sr().clone();
        object.status = Some(status.clone());
        match self.home.replace_status(self.ctx, &object).await? {
            Written::Written(written) => {
                self.ctx.wrote(
                    self.sr().metadata.resource_version.as_deref(),
                    (*written).clone(),
                );
                self.facts.status = written.status.clone().unwrap_or_default();
                self.facts.release = Arc::new(*written);
                Ok(())
            }
            Written::Conflict => Err(self.conflicted().await),
        }
    }

    /// A write of the release answered 409: the release as the API server has it now, to start
    /// the reconcile again from ([`Halt::Restart`]), or the error of reading it.
    pub(super) async fn conflicted(&self) -> Stop {
        self.ctx.options.metrics.status_conflicts.inc();
        tracing::debug!("the release changed since it was read (409): reading it again");
        match self.home.read(self.ctx, self.sr()).await {
            Ok(fresh) => Halt::Restart(Box::new(fresh)).into(),
            Err(e) => e.into(),
        }
    }

    /// Takes the release's lock before a write, or makes sure it is still held (renewed once a
    /// third of its duration has passed). A lock taken fresh, or taken over, is followed by a
    /// fresh read of the release: when it changed since the cached copy, the reconcile starts
    /// again from it ([`Halt::Restart`]).
    pub(super) async fn lock(&mut self) -> Result<(), Stop> {
        if self.locked && self.ctx.locks.safely_held(&self.key) {
            return Ok(());
        }
        // A release whose namespace is being deleted is uninstalled without a lease: none can
        // be created there any more, and the deletions it does are idempotent. A release being
        // deleted asks before its first write (a status that tells a failure included), whatever
        // step it is at: a namespace deleted while no controller ran has lost the lease already.
        if self.facts.namespace_terminating.is_none()
            && self.sr().metadata.deletion_timestamp.is_some()
        {
            self.facts.namespace_terminating = Some(self.namespace_terminating().await?);
        }
        if self.facts.namespace_terminating == Some(true) {
            self.locked = true;
            return Ok(());
        }
        let acquired = self
            .ctx
            .locks
            .acquire(self.sr(), self.settings.timeout, self.locked)
            .await?;
        match acquired {
            // A lease just created: no other session acted on the release before it.
            Acquired::Kept | Acquired::Renewed | Acquired::Created => {}
            Acquired::Fresh => self.read_fresh().await?,
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
                self.publish(&[Note::warning(EventReason::LockTakenOver, message)])
                    .await;
                self.read_fresh().await?;
            }
            Acquired::Busy {
                holder,
                retry_after,
            } => {
                return Err(Halt::Busy {
                    holder,
                    retry_after,
                }
                .into());
            }
            Acquired::Lost { holder } => return Err(Halt::Lost { holder }.into()),
        }
        self.locked = true;
        Ok(())
    }

    /// After taking the lock: the release as the API server has it now, so that the operation
    /// goes on from where the previous holder left it.
    pub(super) async fn read_fresh(&self) -> Result<(), Stop> {
        let fresh = self.home.read(self.ctx, self.sr()).await?;
        if fresh.resource_version() == self.sr().resource_version() {
            Ok(())
        } else {
            Err(Halt::Restart(Box::new(fresh)).into())
        }
    }

    /// Before each write of a step: stop when the controller is shutting down, and renew the
    /// lock unless it is held with time to spare.
    pub(super) async fn still_held(&mut self) -> Result<(), Stop> {
        if self.ctx.stopping() {
            return Err(Halt::Interrupted.into());
        }
        self.lock().await
    }

    /// Releases the lock (the operation is over); a failure leaves the lease to expire.
    pub(super) async fn unlock(&self) {
        if let Err(e) = self.ctx.locks.release(&self.key).await {
            tracing::warn!(error = %e, "releasing the release's lease; it expires by itself");
        }
    }

    pub(super) async fn publish(&self, notes: &[Note]) {
        // Events are new objects in the release's namespace: none can be created there while
        // it is being deleted; the log keeps them.
        if self.facts.namespace_terminating == Some(true) {
            for note in notes {
                tracing::info!(reason = %note.reason, message = %note.message, "namespace terminating: event not recorded");
            }
            return;
        }
        for note in notes {
            if note.reason == EventReason::DriftCorrected {
                self.ctx.options.metrics.drift_corrections.inc();
            }
            if let Err(e) = self.home.tell(self.ctx, self.sr(), note).await {
                tracing::debug!(error = %e, reason = %note.reason, "publishing an event");
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
