//! One reconcile of one release: gather the facts the lifecycle asks for, execute the step it
//! chooses, write the status it hands back. Every write happens under the release's lock,
//! taken lazily at the first write; a lock taken fresh (or over) is followed by a fresh read of
//! the release, and the reconcile starts again when it changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::objects::{Failed, Objects};
use super::records::Put;
use super::run::Context;
use super::source::Prepared;
use super::{Error, Halt, Stop, account_of, kube_error};
use crate::api::{
    EventReason, FINALIZER, Identity, LayerPhase, Reason, ReleasePhase, SequencedRelease,
    SequencedReleaseStatus,
};
use crate::cluster::{Cluster, ClusterError};
use crate::history::HookRecord;
use crate::lock::Acquired;
use crate::rollout::dependencies::{self, DependencyFacts, DependencyState};
use crate::rollout::install::{self, InstallAction, InstallStep};
use crate::rollout::lifecycle::{Begin, Facts, LockView, Need, Next, Requeue};
use crate::rollout::recovery::{self, RecordUpdate};
use crate::rollout::uninstall::{self, UninstallStep};
use crate::rollout::{self, Deployable, Note, Settings};

/// How soon a release refused for its service account's rights is looked at again.
const FORBIDDEN_RETRY: Duration = Duration::from_secs(60);
/// The longest status message; longer ones (many planner errors) are cut.
const MAX_MESSAGE: usize = 8 * 1024;
/// How many facts one reconcile may gather; more means the lifecycle keeps asking for something
/// the controller cannot give, which is a bug, reported instead of spinning.
const MAX_GATHERS: usize = 32;

/// Reconciles `sr` once.
pub(super) async fn reconcile(sr: Arc<SequencedRelease>, ctx: &Context) -> Result<Action, Stop> {
    if ctx.stopping() {
        return Ok(Action::await_change());
    }
    let account = account_of(&sr, &ctx.options.tenancy);
    let cluster = ctx.cluster_for(account.as_ref()).map_err(kube_error(
        "making a client that impersonates the release's service account",
    ))?;
    let mut reconcile = Reconcile::new(sr, ctx, cluster);
    match reconcile.run().await {
        Err(Stop::Failed(error)) => {
            reconcile.report(&error).await;
            Err(Stop::Failed(error))
        }
        done => done,
    }
}

fn action(requeue: Requeue) -> Action {
    match requeue {
        Requeue::After(delay) => Action::requeue(delay),
        Requeue::AwaitChange => Action::await_change(),
    }
}

/// One reconcile of one release.
struct Reconcile<'a> {
    ctx: &'a Context,
    key: ObjectRef<SequencedRelease>,
    api: Api<SequencedRelease>,
    me: Identity,
    settings: Settings,
    facts: Facts,
    /// The spec's inputs, once gathered.
    prepared: Option<Prepared>,
    /// Whether the lock was taken or checked in this reconcile.
    locked: bool,
    /// The API server as the account the release acts as.
    cluster: Arc<Cluster>,
}

impl<'a> Reconcile<'a> {
    fn new(sr: Arc<SequencedRelease>, ctx: &'a Context, cluster: Arc<Cluster>) -> Reconcile<'a> {
        let key = ObjectRef::from_obj(&*sr);
        let lock = if ctx.locks.holds(&key) {
            LockView::Ours
        } else {
            match ctx.locks.blocked(&key) {
                Some((holder, remaining)) => LockView::Blocked { holder, remaining },
                None => LockView::Free,
            }
        };
        let now = rollout::seconds(Time(k8s_openapi::jiff::Timestamp::now()));
        let blocked = matches!(lock, LockView::Blocked { .. });
        let operation_since = ctx.operations.running_for(&sr, blocked).and_then(|ran| {
            let ran = k8s_openapi::jiff::SignedDuration::try_from(ran).ok()?;
            now.0.checked_sub(ran).ok().map(Time)
        });
        Reconcile {
            api: Api::namespaced(
                ctx.client.clone(),
                sr.namespace().as_deref().unwrap_or("default"),
            ),
            me: Identity::of(&sr),
            settings: Settings::of(&sr.spec),
            key,
            ctx,
            facts: Facts {
                operation_since,
                no_cross_namespace_refs: ctx.options.tenancy.no_cross_namespace_refs,
                ..Facts::new(sr, lock, now)
            },
            prepared: None,
            locked: false,
            cluster,
        }
    }

    fn sr(&self) -> &SequencedRelease {
        &self.facts.release
    }

    async fn run(&mut self) -> Result<Action, Stop> {
        for _ in 0..MAX_GATHERS {
            match rollout::next(&self.facts) {
                Next::Need(need) => match self.gather(need).await {
                    // What the release's service account may not read: a person must grant it.
                    Err(Stop::Failed(Error::Cluster(refused @ ClusterError::Forbidden { .. }))) => {
                        return self.forbidden(&refused).await;
                    }
                    gathered => gathered?,
                },
                Next::Blocked { holder, requeue } => {
                    tracing::debug!(%holder, "locked by another session");
                    return Ok(action(requeue));
                }
                Next::Idle => {
                    if self.facts.status.phase == Some(ReleasePhase::Ready) {
                        self.ctx.plans.slim(&self.key);
                    }
                    return Ok(Action::await_change());
                }
                Next::AddFinalizer => {
                    self.lock().await?;
                    let mut finalizers = self.sr().finalizers().to_vec();
                    finalizers.push(FINALIZER.to_string());
                    self.patch_finalizers(finalizers).await?;
                    // The change wakes this release again.
                    return Ok(Action::await_change());
                }
                Next::Suspend { status } => {
                    if let Some(status) = status {
                        self.write_status_as_is(&status).await?;
                        self.unlock().await;
                    }
                    return Ok(Action::await_change());
                }
                Next::Stall {
                    status,
                    event,
                    requeue,
                } => {
                    self.write_status(&status).await?;
                    self.publish(event.as_slice()).await;
                    return Ok(action(requeue));
                }
                Next::WaitForDependencies { status, requeue } => {
                    self.write_status(&status).await?;
                    return Ok(action(requeue));
                }
                // A revision records its plan whole: the decision is taken again from it.
                Next::Begin(_) if self.make_whole().await? => {}
                Next::Begin(begin) => self.begin(*begin).await?,
                Next::RestartRevision { status } => {
                    self.write_status(&status).await?;
                    return Ok(Action::requeue(Duration::from_millis(100)));
                }
                Next::Install(step) if !step.actions.is_empty() && self.make_whole().await? => {}
                Next::Install(step) => return self.install(*step).await,
                Next::Uninstall(step) => return self.uninstall(*step).await,
                Next::Write(write) => {
                    self.update_records(&write.records).await?;
                    self.write_status(&write.status).await?;
                    self.publish(&write.events).await;
                    return Ok(action(write.requeue));
                }
                Next::FinishUninstall {
                    events,
                    records,
                    delete,
                } => {
                    self.update_records(&records).await?;
                    self.publish(&events).await;
                    return self.finish_uninstall(&delete).await;
                }
            }
        }
        Err(Stop::Failed(Error::Internal(format!(
            "reconciling {}: the lifecycle kept asking for facts; giving up on this reconcile",
            self.me.owner
        ))))
    }

    /// The plan for the chart source, from the cache or rendered now; `whole` unpacks a slim
    /// one.
    async fn plan(&mut self, is_upgrade: bool, whole: bool) -> Result<(), Stop> {
        let ctx = self.ctx;
        let Some(prepared) = &self.prepared else {
            return Err(Stop::Failed(Error::Internal(
                "the plan was asked for before the chart source".to_string(),
            )));
        };
        let fact = ctx
            .plans
            .get(
                &self.key,
                prepared,
                is_upgrade,
                whole,
                &ctx.cluster,
                &ctx.options.helm,
                &ctx.options.metrics,
            )
            .await?;
        self.facts.plan = Some(fact);
        Ok(())
    }

    /// Makes the plan whole when it is slim (a Ready release's): before anything of it is
    /// applied, compared or recorded. True when it was slim.
    async fn make_whole(&mut self) -> Result<bool, Stop> {
        let is_upgrade = match &self.facts.plan {
            Some(fact) if fact.outcome.as_ref().is_ok_and(|d| d.slim) => fact.is_upgrade,
            _ => return Ok(false),
        };
        self.plan(is_upgrade, true).await?;
        Ok(true)
    }

    /// Gathers one fact the lifecycle asked for.
    async fn gather(&mut self, need: Need) -> Result<(), Stop> {
        let ctx = self.ctx;
        match need {
            Need::Source => {
                // A change of what it reads wakes the release from now on.
                ctx.watches
                    .reads(&self.key, super::source::inputs_of(&self.facts.release));
                let prepared = ctx
                    .sources
                    .prepare(
                        &ctx.client,
                        &ctx.options.helm,
                        &ctx.options.cache,
                        &self.facts.release,
                        self.settings.interval,
                    )
                    .await?;
                self.facts.source = Some(
                    prepared
                        .as_ref()
                        .map(Prepared::source)
                        .map_err(Clone::clone),
                );
                self.prepared = prepared.ok();
            }
            Need::Dependencies(wanted) => {
                self.facts.dependencies = Some(self.dependencies(&wanted).await?);
            }
            Need::Plan { is_upgrade, .. } => self.plan(is_upgrade, false).await?,
            Need::Record(revision) => {
                // The current revision's record is read on every wake and cached without its
                // stored plan; another revision's is wanted for a rollback, plan and all.
                let record = if Some(revision) == self.facts.status.revision {
                    ctx.records.get(&self.key, &self.me, revision).await?
                } else {
                    ctx.records
                        .whole(&self.key, &self.me, revision)
                        .await?
                        .map(Arc::new)
                };
                self.facts.records.insert(revision, record);
            }
            Need::StoredPlan(revision) => {
                let stored = ctx.records.stored(&self.key, &self.me, revision).await?;
                self.facts.stored.insert(revision, stored);
            }
            Need::Revisions => {
                let status = &self.facts.status;
                let fresh = status.revision.is_none() && status.history.is_empty();
                let revisions = ctx.records.revisions(&self.key, &self.me, fresh).await?;
                self.facts.revisions = Some(revisions);
            }
            Need::Drift => {
                let full = ctx.drift_check_due(&self.key, self.settings.interval);
                if full {
                    // The objects are compared with what applying them would make.
                    self.make_whole().await?;
                }
                let report = match self.deployable() {
                    Some(deployable) => {
                        let report = self.objects().drift(&deployable, full).await?;
                        if full {
                            ctx.drift_checked(&self.key);
                        }
                        report
                    }
                    None => Default::default(),
                };
                self.facts.drift = Some(report);
            }
            Need::Namespace => {
                self.facts.namespace_terminating = Some(self.namespace_terminating().await?);
            }
            Need::Observe(wanted) => {
                let deployable = self.deployable();
                let hooks = self.hooks();
                let observed = self
                    .objects()
                    .observe(deployable.as_deref(), &hooks, &wanted)
                    .await?;
                self.facts.observed.extend(observed);
            }
        }
        Ok(())
    }

    /// Whether the release's namespace is being deleted (or is gone).
    async fn namespace_terminating(&self) -> Result<bool, Error> {
        let namespace = self.key.namespace.as_deref().unwrap_or("default");
        let api: Api<Namespace> = Api::all(self.ctx.client.clone());
        let found = api
            .get_opt(namespace)
            .await
            .map_err(kube_error(format!("reading namespace {namespace}")))?;
        Ok(found.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()))
    }

    /// A step that failed again for a transient reason keeps the conditions that tell the
    /// failure (the step had set them back, expecting to go through): the status this reconcile
    /// writes is then what it was, so that its own write does not wake the release at once and
    /// the retry backs off.
    fn keep_told_failure(&self, status: &mut SequencedReleaseStatus) {
        if rollout::status::tells_reconcile_failure(&self.facts.status) {
            status.conditions = self.facts.status.conditions.clone();
        }
    }

    /// This reconcile failed with `error`: from the second failure in a row on (at once when the
    /// release has no conditions yet, or while an API group it needs is unavailable), the
    /// conditions and a Warning event say what failed, so that no retry is silent. The phase and
    /// message stay as they are; the next reconcile that goes through sets the conditions back.
    async fn report(&mut self, error: &Error) {
        let attempt = self.ctx.failures_of(&self.key).saturating_add(1);
        let waiting = matches!(error, Error::Cluster(ClusterError::GroupUnavailable { .. }));
        let unseen = self.facts.status.conditions.is_empty();
        if self.ctx.stopping() || (attempt < 2 && !waiting && !unseen) {
            return;
        }
        // The same words at every failure: a status that changed would wake the release at once
        // (its own write), and the retry would not back off.
        let (reason, message) = if waiting {
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
            tracing::debug!(?stop, "could not tell a failed reconcile in the status");
            return;
        }
        self.publish(&[Note::warning(
            EventReason::ReconcileFailed,
            error.to_string(),
        )])
        .await;
    }

    /// The release's service account may not read what the lifecycle needs to see: Failed and
    /// Stalled with reason `Forbidden` (an uninstall stays Uninstalling, Stalled), looked at
    /// again a minute later or when the release changes.
    async fn forbidden(&mut self, refused: &ClusterError) -> Result<Action, Stop> {
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

    fn deployable(&self) -> Option<Arc<Deployable>> {
        self.facts.deployable().cloned()
    }

    /// The hooks the lifecycle's observations and actions index: the revision's record's while
    /// uninstalling (the chart may be gone), the revision's plan's otherwise.
    fn hooks(&self) -> Vec<HookRecord> {
        let uninstalling = self.sr().metadata.deletion_timestamp.is_some()
            || self.facts.status.phase == Some(ReleasePhase::Uninstalling);
        if uninstalling {
            self.facts
                .status
                .revision
                .and_then(|n| self.facts.records.get(&n)?.clone())
                .map(|record| record.hooks.clone())
                .unwrap_or_default()
        } else {
            self.deployable()
                .map(|d| d.hooks.clone())
                .unwrap_or_default()
        }
    }

    fn objects(&self) -> Objects<'_> {
        Objects {
            ctx: self.ctx,
            cluster: &self.cluster,
            me: &self.me,
            release: self.key.clone(),
        }
    }

    /// The `dependsOn` graph from the controller's cache, and the dependencies themselves read
    /// fresh, because the event that woke this release may be ahead of the cache.
    async fn dependencies(&self, wanted: &[String]) -> Result<DependencyFacts, Error> {
        let graph: BTreeMap<String, Vec<String>> = self
            .ctx
            .store
            .state()
            .iter()
            .map(|sr| (dependencies::reference_of(sr), dependencies::depends_on(sr)))
            .collect();
        let mut states = BTreeMap::new();
        for dependency in wanted {
            let Some((namespace, name)) = dependency.split_once('/') else {
                continue;
            };
            let api: Api<SequencedRelease> = Api::namespaced(self.ctx.client.clone(), namespace);
            let found = api
                .get_opt(name)
                .await
                .map_err(kube_error(format!("reading SequencedRelease {dependency}")))?;
            states.insert(dependency.clone(), DependencyState::of(found.as_ref()));
        }
        Ok(DependencyFacts { graph, states })
    }

    async fn begin(&mut self, begin: Begin) -> Result<(), Stop> {
        if begin.create_namespace {
            self.lock().await?;
            self.objects().create_namespace().await?;
        }
        self.lock().await?;
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
    async fn delete_records(&self, revisions: &[i64]) -> Result<(), Error> {
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
    async fn update_records(&mut self, updates: &[RecordUpdate]) -> Result<(), Stop> {
        for update in updates {
            self.lock().await?;
            self.ctx.records.update(&self.key, &self.me, update).await?;
        }
        Ok(())
    }

    async fn install(&mut self, step: InstallStep) -> Result<Action, Stop> {
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
                InstallAction::ApplyCrds => ("crds", objects.apply_crds(deployable).await),
                InstallAction::ApplyLayer(i) => {
                    ("layer", objects.apply_layer(deployable, *i).await)
                }
                InstallAction::Prune(keys) => ("prune", objects.delete(keys).await),
                InstallAction::Hook { action, .. } => {
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
        let requeue = rollout::requeue(
            &self.settings,
            &step.status,
            step.requeue_after,
            &self.facts.now,
        );
        Ok(action(requeue))
    }

    /// The controller is stopping (or lost the lock) before action `done` of the step: the
    /// status keeps what was done.
    async fn cut_short(
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
    async fn failed_action(
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
        Ok(action(rollout::requeue(
            &self.settings,
            &status,
            retry,
            &self.facts.now,
        )))
    }

    async fn uninstall(&mut self, step: UninstallStep) -> Result<Action, Stop> {
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
                return self.failed_delete(&step, 0, failed).await;
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
                return self.failed_delete(&step, issued, failed).await;
            }
        }
        for action in &step.hooks_after {
            self.still_held().await?;
            if let Err(failed) = self.objects().hook(&hooks, action).await {
                return self.failed_delete(&step, step.deletes.len(), failed).await;
            }
        }
        self.write_status(&step.status).await?;
        self.publish(&step.events).await;
        if step.finished {
            // Done once the last hook's delete policy is carried out: finish at once.
            return Ok(Action::requeue(Duration::from_millis(100)));
        }
        let requeue = rollout::requeue(
            &self.settings,
            &step.status,
            step.requeue_after,
            &self.facts.now,
        );
        Ok(action(requeue))
    }

    /// A deletion (or hook) of an uninstall step failed after the first `issued` of its deletes:
    /// the status says why; the uninstall goes on from there when it is tried again.
    async fn failed_delete(
        &mut self,
        step: &UninstallStep,
        issued: usize,
        failed: Failed,
    ) -> Result<Action, Stop> {
        let mut status = uninstall::fail_delete(step, issued, &failed.failure, &self.facts.now);
        if failed.failure.transient {
            self.keep_told_failure(&mut status);
        }
        self.write_status(&status).await?;
        Err(Stop::Failed(failed.error))
    }

    /// Everything is gone: drop the records, the finalizer and the lease.
    async fn finish_uninstall(&mut self, records: &[i64]) -> Result<Action, Stop> {
        self.lock().await?;
        self.delete_records(records).await?;
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

    async fn patch_finalizers(&self, finalizers: Vec<String>) -> Result<(), Error> {
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": self.sr().resource_version(),
            }
        });
        let name = self.key.name.as_str();
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                self.ctx
                    .wrote(self.sr().metadata.resource_version.as_deref(), written);
                Ok(())
            }
            // Changed meanwhile: the newer object comes with its own event.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_error(format!(
                "updating the finalizers of {}",
                self.me.owner
            ))(e)),
        }
    }

    /// Writes `status` unless it is what the object already has, under the release's lock.
    /// While an operation is in progress the status mirrors the lock (renewed when due); once it
    /// has ended, the lock is released after the write.
    async fn write_status(&mut self, status: &SequencedReleaseStatus) -> Result<(), Stop> {
        let keep = rollout::holds_lock(status.phase);
        if keep && self.ctx.locks.holds(&self.key) {
            self.lock().await?;
        }
        let mut status = status.clone();
        status.lock = keep.then(|| self.ctx.locks.mirror(&self.key)).flatten();
        status.acting_as = Some(
            self.cluster
                .account()
                .map_or_else(|| "controller".to_string(), ToString::to_string),
        );
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

    /// Replaces the status (a 409 is left for the newer object's own reconcile). What is written
    /// is what the rest of this reconcile goes on from.
    async fn write_status_as_is(&mut self, status: &SequencedReleaseStatus) -> Result<(), Error> {
        let mut object = self.sr().clone();
        object.metadata.managed_fields = None;
        object.status = Some(status.clone());
        match self
            .api
            .replace_status(&self.key.name, &PostParams::default(), &object)
            .await
        {
            Ok(written) => {
                self.ctx.wrote(
                    self.sr().metadata.resource_version.as_deref(),
                    written.clone(),
                );
                self.facts.status = written.status.clone().unwrap_or_default();
                self.facts.release = Arc::new(written);
                Ok(())
            }
            // Someone changed the object since it was read; its newer version wakes us again.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(kube_error(format!(
                "writing the status of {}",
                self.me.owner
            ))(e)),
        }
    }

    /// Takes the release's lock before a write, or makes sure it is still held (renewed once a
    /// third of its duration has passed). A lock taken fresh, or taken over, is followed by a
    /// fresh read of the release: when it changed since the cached copy, the reconcile starts
    /// again from it ([`Halt::Restart`]).
    async fn lock(&mut self) -> Result<(), Stop> {
        if self.locked && self.ctx.locks.safely_held(&self.key) {
            return Ok(());
        }
        // A release whose namespace is being deleted is uninstalled without a lease: none can
        // be created there any more, and the deletions it does are idempotent.
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
    async fn read_fresh(&self) -> Result<(), Stop> {
        let fresh = self
            .api
            .get(&self.key.name)
            .await
            .map_err(kube_error(format!("reading {}", self.me.owner)))?;
        if fresh.resource_version() == self.sr().resource_version() {
            Ok(())
        } else {
            Err(Halt::Restart(Box::new(fresh)).into())
        }
    }

    /// Before each write of a step: stop when the controller is shutting down, and renew the
    /// lock unless it is held with time to spare.
    async fn still_held(&mut self) -> Result<(), Stop> {
        if self.ctx.stopping() {
            return Err(Halt::Interrupted.into());
        }
        self.lock().await
    }

    /// Releases the lock (the operation is over); a failure leaves the lease to expire.
    async fn unlock(&self) {
        if let Err(e) = self.ctx.locks.release(&self.key).await {
            tracing::warn!(error = %e, "releasing the release's lease; it expires by itself");
        }
    }

    async fn publish(&self, notes: &[Note]) {
        // Events are new objects in the release's namespace: none can be created there while
        // it is being deleted; the log keeps them.
        if self.facts.namespace_terminating == Some(true) {
            for note in notes {
                tracing::info!(reason = %note.reason, message = %note.message, "namespace terminating: event not recorded");
            }
            return;
        }
        let reference = self.sr().object_ref(&());
        for note in notes {
            if note.reason == EventReason::DriftCorrected {
                self.ctx.options.metrics.drift_corrections.inc();
            }
            let published = self
                .ctx
                .events
                .publish(
                    &reference,
                    note.warning,
                    &note.reason.to_string(),
                    &note.message,
                )
                .await;
            if let Err(e) = published {
                tracing::debug!(error = %e, reason = %note.reason, "publishing an event");
            }
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
