//! Executing the step the lifecycle chose: beginning a revision, an install or uninstall step's
//! actions (and what a failed one leaves in the status), the end of an uninstall, the records.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::{Reconcile, action};
use crate::api::{FINALIZER, LayerPhase, ReleasePhase, SequencedReleaseStatus};
use crate::controller::home::Written;
use crate::controller::objects::Failed;
use crate::controller::records::Put;
use crate::controller::{Error, Halt, Stop};
use crate::rollout::install::{self, InstallAction, InstallStep};
use crate::rollout::lifecycle::Begin;
use crate::rollout::uninstall::{self, UninstallStep};
use crate::rollout::{self, Deployable, RecordUpdate, recovery};

impl Reconcile<'_> {
    /// When to look at the release again after writing `status` (the lifecycle's requeue
    /// policy, with the step's own `after`).
    fn requeue(&self, status: &SequencedReleaseStatus, after: Option<Duration>) -> Action {
        action(rollout::requeue(
            &self.settings,
            status,
            after,
            &self.facts.now,
        ))
    }

    pub(super) async fn begin(&mut self, begin: Begin) -> Result<(), Stop> {
        if begin.create_namespace {
            self.lock().await?;
            self.objects().create_namespace().await?;
        }
        self.lock().await?;
        if let Some(pending) = &begin.take_pending
            && !self
                .ctx
                .records
                .take_pending(&self.key, &self.me, pending)
                .await?
        {
            // The pending record changed (its helm process finished it after all): decide again.
            return Err(Halt::Restart(Box::new(self.sr().clone())).into());
        }
        let put = self
            .ctx
            .records
            .put(&self.key, &self.me, &begin.record)
            .await?;
        if put == Put::Taken {
            // Records were there after all: list them and choose the revision again.
            return Err(Halt::Restart(Box::new(self.sr().clone())).into());
        }
        self.update_records(&begin.records).await?;
        self.delete_records(&begin.drop_records).await?;
        self.publish(&begin.events).await;
        self.facts.status = begin.status;
        let number = begin.record.revision;
        if begin.record.rollback_to.is_some() {
            let stored = Deployable::from_record(&begin.record).map(Arc::new);
            self.facts.stored.insert(number, stored);
        }
        self.facts
            .records
            .insert(number, Some(Arc::new(begin.record)));
        Ok(())
    }

    /// Deletes the records of these revisions, in Helm's format when they are, else in the
    /// earlier one.
    pub(super) async fn delete_records(&self, revisions: &[i64]) -> Result<(), Error> {
        let ours = self
            .facts
            .revisions
            .as_ref()
            .map(|r| r.ours.clone())
            .unwrap_or_default();
        for &revision in revisions {
            self.ctx
                .records
                .delete(&self.key, &self.me, revision, &ours)
                .await?;
        }
        Ok(())
    }

    /// Changes the status of release records, under the lock.
    pub(super) async fn update_records(&mut self, updates: &[RecordUpdate]) -> Result<(), Stop> {
        for update in updates {
            self.lock().await?;
            self.ctx.records.update(&self.key, &self.me, update).await?;
        }
        Ok(())
    }

    pub(super) async fn install(&mut self, step: InstallStep) -> Result<Action, Stop> {
        let metrics = &self.ctx.options.metrics;
        metrics
            .readiness_timeouts
            .inc_by(u64::try_from(step.timeouts).unwrap_or(0));
        observe_waits(metrics, &self.facts.status, &step.status);
        let deployable = self.deployable();
        if !step.actions.is_empty() {
            // A step of the operation: renew the lock (or take it) before the first write.
            self.lock().await?;
        }
        for (done, action) in step.actions.iter().enumerate() {
            if let Err(stop) = self.still_held().await {
                return self.cut_short(&step, done, stop).await;
            }
            let Some(deployable) = deployable.as_deref() else {
                break;
            };
            let applying = Instant::now();
            let objects = self.objects();
            let (stage, result) = match action {
                InstallAction::ApplyCrds { replace } => {
                    ("crds", objects.apply_crds(deployable, *replace).await)
                }
                InstallAction::ApplyLayer(i) => (
                    "layer",
                    objects.apply_layer(deployable, *i, step.correcting).await,
                ),
                InstallAction::Prune(keys) => ("prune", objects.delete(keys).await),
                InstallAction::Hook { action, .. } | InstallAction::Test(action) => {
                    ("hook", objects.hook(&deployable.hooks, action).await)
                }
            };
            metrics
                .layer_apply_duration
                .with_label_values(&[stage])
                .observe(applying.elapsed().as_secs_f64());
            if let Err(failed) = result {
                return self.failed_action(&step, done, failed).await;
            }
        }
        self.update_records(&step.records).await?;
        self.write_status(&step.status).await?;
        if step.status.phase == Some(ReleasePhase::Ready) {
            // This controller applied every object and watched them become ready: they match
            // what it applied, so the next full comparison is due an `interval` from now.
            self.ctx.drift_checked(&self.key);
        }
        self.publish(&step.events).await;
        Ok(self.requeue(&step.status, step.requeue_after))
    }

    /// The controller is stopping (or lost the lock) before action `done` of the step: the
    /// status keeps what was done.
    pub(super) async fn cut_short(
        &mut self,
        step: &InstallStep,
        done: usize,
        stop: Stop,
    ) -> Result<Action, Stop> {
        if done > 0
            && matches!(stop, Stop::Halted(Halt::Interrupted))
            && let Some(revision) = self.facts.revision(&self.me)
        {
            let mut status = install::cut_short(&revision, step, done);
            status.lock = self.ctx.locks.mirror(&self.key);
            self.write_status_as_is(&status).await?;
        }
        Err(stop)
    }

    /// Action `done` of the step failed: write the status the lifecycle makes of it; a
    /// transient error is retried with backoff, a refusal as the lifecycle says.
    pub(super) async fn failed_action(
        &mut self,
        step: &InstallStep,
        done: usize,
        failed: Failed,
    ) -> Result<Action, Stop> {
        let Some(revision) = self.facts.revision(&self.me) else {
            return Err(Stop::Failed(failed.error));
        };
        let (mut status, mut events, retry) = install::fail_action(
            &revision,
            &self.facts.status,
            step,
            done,
            &failed.failure,
            &self.facts.now,
        );
        let record = self
            .facts
            .status
            .revision
            .and_then(|n| self.facts.records.get(&n)?.clone());
        if let Some(record) = record {
            let updates = recovery::finish(
                &self.facts.status,
                &mut status,
                &record,
                &mut events,
                &self.facts.now,
            );
            self.update_records(&updates).await?;
        }
        if failed.failure.transient {
            self.keep_told_failure(&mut status);
        }
        self.write_status(&status).await?;
        self.publish(&events).await;
        if failed.failure.transient {
            return Err(Stop::Failed(failed.error));
        }
        Ok(self.requeue(&status, retry))
    }

    pub(super) async fn uninstall(&mut self, step: UninstallStep) -> Result<Action, Stop> {
        let writes = !step.deletes.is_empty()
            || !step.hooks_before.is_empty()
            || !step.hooks_after.is_empty();
        if writes {
            self.lock().await?;
        }
        self.update_records(&step.records).await?;
        let hooks = self.hooks();
        for action in &step.hooks_before {
            self.still_held().await?;
            if let Err(failed) = self.objects().hook(&hooks, action).await {
                let status = uninstall::fail_hook(&step, false, &failed.failure, &self.facts.now);
                return self.failed_uninstall(status, failed).await;
            }
        }
        for (issued, (_, keys)) in step.deletes.iter().enumerate() {
            self.still_held().await?;
            let deleting = Instant::now();
            let result = self.objects().delete(keys).await;
            self.ctx
                .options
                .metrics
                .layer_apply_duration
                .with_label_values(&["delete"])
                .observe(deleting.elapsed().as_secs_f64());
            if let Err(failed) = result {
                let status =
                    uninstall::fail_delete(&step, issued, &failed.failure, &self.facts.now);
                return self.failed_uninstall(status, failed).await;
            }
        }
        for action in &step.hooks_after {
            self.still_held().await?;
            if let Err(failed) = self.objects().hook(&hooks, action).await {
                let status = uninstall::fail_hook(&step, true, &failed.failure, &self.facts.now);
                return self.failed_uninstall(status, failed).await;
            }
        }
        // What the step did is told even when its status write meets a 409 and the reconcile
        // starts again: the objects are gone, and the step taken again finds nothing to delete
        // (an install step taken again applies again, and tells it then).
        let written = self.write_status(&step.status).await;
        self.publish(&step.events).await;
        written?;
        if step.finished {
            // Done once the last hook's delete policy is carried out: finish at once.
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        Ok(self.requeue(&step.status, step.requeue_after))
    }

    /// A deletion (or hook) of an uninstall step failed: `status` says why
    /// ([`uninstall::fail_delete`], [`uninstall::fail_hook`]); the uninstall goes on from there
    /// when it is tried again.
    pub(super) async fn failed_uninstall(
        &mut self,
        mut status: SequencedReleaseStatus,
        failed: Failed,
    ) -> Result<Action, Stop> {
        if failed.failure.transient {
            self.keep_told_failure(&mut status);
        }
        self.write_status(&status).await?;
        Err(Stop::Failed(failed.error))
    }

    /// Everything is gone: drop the records, the finalizer and the lease.
    pub(super) async fn finish_uninstall(&mut self, records: &[i64]) -> Result<Action, Stop> {
        self.lock().await?;
        self.delete_records(records).await?;
        if self.sr().spec.kube_config.is_some() {
            // Its kubeconfig Secret is let go unless another release there needs it.
            let namespace = self.key.namespace.as_deref().unwrap_or("default");
            crate::controller::kubeconfigs::settle(self.ctx, namespace, Some(&self.key.name))
                .await?;
        }
        self.ctx.forget(&self.key);
        let finalizers: Vec<String> = self
            .sr()
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        self.patch_finalizers(finalizers).await?;
        if let Err(e) = self.ctx.locks.remove(&self.key).await {
            tracing::warn!(error = %e, "deleting the release's lease");
        }
        Ok(Action::await_change())
    }

    pub(super) async fn patch_finalizers(&self, finalizers: Vec<String>) -> Result<(), Stop> {
        match self
            .home
            .set_finalizers(self.ctx, self.sr(), finalizers)
            .await?
        {
            Written::Written(written) => {
                self.ctx
                    .wrote(self.sr().metadata.resource_version.as_deref(), *written);
                Ok(())
            }
            // Changed meanwhile: read again and start again from it, at once.
            Written::Conflict => Err(self.conflicted().await),
        }
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
