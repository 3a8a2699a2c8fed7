//! One reconcile of one release: gather the facts the lifecycle asks for, execute the step it
//! chooses, write the status it hands back. Every write happens under the release's lock,
//! taken lazily at the first write; a lock taken fresh (or over) is followed by a fresh read of
//! the release, and the reconcile starts again when it changed.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::home::Home;
use super::objects::Objects;
use super::remotes::Remote;
use super::source::Prepared;
use super::target::Target;
use super::{Error, Stop, account_of, kube_error};
use crate::api::{FINALIZER, Identity, ReleasePhase, SequencedRelease};
use crate::cluster::{Cluster, ClusterError};
use crate::history::HookRecord;
use crate::rollout::drift::DriftReport;
use crate::rollout::ignore::IgnoreRules;
use crate::rollout::lifecycle::{Facts, LockView, Need, Next, Requeue};
use crate::rollout::{self, Deployable, Settings};

/// How soon a release refused for its service account's rights is looked at again.
const FORBIDDEN_RETRY: Duration = Duration::from_secs(60);
/// The longest status message; longer ones (many planner errors) are cut.
const MAX_MESSAGE: usize = 8 * 1024;
/// How many facts one reconcile may gather; more means the lifecycle keeps asking for something
/// the controller cannot give, which is a bug, reported instead of spinning.
const MAX_GATHERS: usize = 32;

/// Reconciles `sr` once; its status, finalizer and notes go to `home`.
pub(super) async fn reconcile(
    sr: Arc<SequencedRelease>,
    ctx: &Context,
    home: &dyn Home,
) -> Result<Action, Stop> {
    if ctx.stopping() {
        return Ok(Action::await_change());
    }
    // A release that may not act at all (an empty service account name, none in multi-tenant
    // mode) is stalled by the lifecycle before it touches anything of its chart; should anything
    // still be asked, it is asked as the `default` ServiceAccount of the release's own
    // namespace, never as the controller.
    let account = account_of(&sr, &ctx.options.tenancy).unwrap_or_else(|_| {
        Some(crate::cluster::Account {
            namespace: sr.namespace().unwrap_or_else(|| "default".to_string()),
            name: "default".to_string(),
        })
    });
    let local = ctx.cluster_for(account.as_ref()).map_err(kube_error(
        "making a client that impersonates the release's service account",
    ))?;
    // Where the release acts (a remote cluster, for `spec.kubeConfig`), before anything else.
    let (target, failed) =
        match super::target::of(ctx, &sr, account.as_ref(), Arc::clone(&local)).await {
            Ok(target) => (target, None),
            Err(error) => (Target::local(ctx, local), Some(error)),
        };
    let names = target.remote_names(&sr);
    let mut reconcile = Reconcile::new(sr, ctx, home, target);
    let result = match failed {
        // The account may not read the kubeconfig Secret (multi-tenant mode): as for valuesFrom,
        // a person must grant it.
        Some(Error::Cluster(refused @ ClusterError::Forbidden { .. })) => {
            reconcile.forbidden(&refused).await
        }
        Some(error) => Err(Stop::Failed(error)),
        None => reconcile.run().await,
    };
    match result {
        Err(Stop::Failed(error)) => {
            // A request to the remote cluster that got no answer: the cluster is unreachable.
            let error = match (names, &error) {
                (Some((server, origin)), e)
                    if e.is_unreachable() && !matches!(e, Error::Unreachable { .. }) =>
                {
                    Error::Unreachable {
                        server,
                        origin,
                        message: e.to_string(),
                    }
                }
                _ => error,
            };
            reconcile.report(&error).await;
            Err(Stop::Failed(error))
        }
        Ok(action) => {
            reconcile.tell_untold().await;
            Ok(action)
        }
        done => done,
    }
}

/// What a step is called in the logs; None for what is not a step (gathering a fact, waiting
/// for a lock, nothing to do).
fn step_name(next: &Next) -> Option<&'static str> {
    Some(match next {
        Next::Need(_) | Next::Blocked { .. } | Next::Idle => return None,
        Next::AddFinalizer => "add the finalizer",
        Next::Suspend { .. } => "suspend",
        Next::Stall { .. } => "stall",
        Next::WaitForDependencies { .. } => "wait for dependencies",
        Next::Begin(_) => "begin a revision",
        Next::RestartRevision { .. } => "restart the revision",
        Next::Install(_) => "install step",
        Next::Uninstall(_) => "uninstall step",
        Next::Write(_) => "write the status",
        Next::FinishUninstall { .. } => "finish the uninstall",
    })
}

fn action(requeue: Requeue) -> Action {
    match requeue {
        Requeue::After(delay) => Action::requeue(delay),
        Requeue::AwaitChange => Action::await_change(),
    }
}

mod execute;
mod writes;

/// One reconcile of one release.
struct Reconcile<'a> {
    ctx: &'a Context,
    /// Where the release's status, finalizer and notes go.
    home: &'a dyn Home,
    key: ObjectRef<SequencedRelease>,
    me: Identity,
    settings: Settings,
    /// `spec.driftDetection.ignore`, read.
    ignore: IgnoreRules,
    facts: Facts,
    /// The spec's inputs, once gathered.
    prepared: Option<Prepared>,
    /// Whether the lock was taken or checked in this reconcile.
    locked: bool,
    /// The cluster of the release's objects, as the account the release acts as.
    cluster: Arc<Cluster>,
    /// The same cluster as the controller: records, hook logs.
    books: Arc<Cluster>,
    /// The remote cluster of `spec.kubeConfig`.
    remote: Option<Arc<Remote>>,
    /// The cluster the controller runs in as the release's account: its inputs, read as the
    /// account in multi-tenant mode.
    inputs: Arc<Cluster>,
}

impl<'a> Reconcile<'a> {
    fn new(
        sr: Arc<SequencedRelease>,
        ctx: &'a Context,
        home: &'a dyn Home,
        target: Target,
    ) -> Reconcile<'a> {
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
        // The time the API servers it uses did not answer is not counted against its timeouts.
        let mut outages = ctx.cluster.health().outages();
        outages.extend(target.cluster.health().outages());
        let mut facts = Facts {
            operation_since,
            no_cross_namespace_refs: ctx.options.tenancy.no_cross_namespace_refs,
            accounts: ctx.options.tenancy.accounts(),
            target: target.usable,
            expressions: ctx.expressions(&sr).into(),
            pending_bound: ctx.options.take_pending_after,
            ..Facts::new(sr.clone(), lock, now)
        };
        facts.observed.outages = rollout::outages::Outages::new(outages);
        Reconcile {
            home,
            me: Identity::of(&sr),
            settings: Settings::of(&sr.spec),
            // Rules that cannot be read stall the release before anything is compared.
            ignore: facts.ignore.clone().unwrap_or_default(),
            key,
            ctx,
            facts,
            prepared: None,
            locked: false,
            cluster: target.cluster,
            books: target.books,
            remote: target.remote,
            inputs: target.inputs,
        }
    }

    fn sr(&self) -> &SequencedRelease {
        &self.facts.release
    }

    async fn run(&mut self) -> Result<Action, Stop> {
        for _ in 0..MAX_GATHERS {
            let next = rollout::next(&self.facts);
            if let Some(step) = step_name(&next) {
                self.ctx
                    .recovery
                    .stepped(&self.key, step, &self.ctx.options.metrics);
            }
            match next {
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
                &self.books,
                &ctx.options.helm,
                &ctx.options.kubectl,
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
                // In multi-tenant mode the tenant's inputs are read as its account.
                let reader = if ctx.options.tenancy.is_multi_tenant() {
                    &self.inputs
                } else {
                    &ctx.cluster
                };
                let prepared = ctx
                    .sources
                    .prepare(
                        reader,
                        &ctx.options.tenancy,
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
                let found =
                    super::dependencies::gather(ctx, &self.cluster, &self.key, &wanted).await?;
                self.facts.dependencies = Some(found);
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
            Need::HelmRecord(revision) => {
                let record = ctx
                    .records
                    .helm_record(&self.key, &self.me, revision, &self.cluster)
                    .await?;
                self.facts
                    .helm_records
                    .insert(revision, record.map(Arc::new));
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
                // In full when a watch event said one of its objects changed (or went), else
                // only at `--drift-full-check-interval` and at first sight: an idle release
                // sends nothing (deletions are looked up in the watches' index).
                let changed = ctx.watches.take_changed(&self.key);
                let full = changed
                    || ctx.drift_check_due(&self.key, ctx.options.drift_full_check_interval);
                let compared = self.compare(full).await;
                if compared.is_err() && changed {
                    // A comparison that fails (its status says so) is tried again in full by
                    // the next reconcile, as the watch event asked.
                    ctx.watches.mark_changed(&self.key);
                }
                self.facts.drift = Some(compared?);
            }
            Need::Leftovers => {
                let namespace = self.key.namespace.as_deref().unwrap_or("default");
                let found = super::leftovers::find(&self.cluster, &self.me, namespace).await?;
                self.facts.leftovers = Some(found);
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

    /// What drifted of the release's objects: in `full`, each compared with what applying it
    /// would make (a dry run each), else only their deletions (the watches' index).
    async fn compare(&mut self, full: bool) -> Result<DriftReport, Stop> {
        if full {
            self.make_whole().await?;
        }
        let Some(deployable) = self.deployable() else {
            return Ok(DriftReport::default());
        };
        let report = self.objects().drift(&deployable, full).await?;
        if full {
            self.ctx.drift_checked(&self.key);
        }
        Ok(report)
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
            books: &self.books,
            me: &self.me,
            release: self.key.clone(),
            ignore: &self.ignore,
            health: self.facts.health(),
        }
    }
}
