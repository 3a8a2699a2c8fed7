//! Wiring and shutdown: the kube-runtime controller over SequencedReleases, the watches that wake
//! releases, the error policy, and what happens on SIGTERM.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};

use super::context::Context;
use super::events::Events;
use super::watches::Watches;
use super::{Error, Halt, Options, Stop, home, kube_error, outage, reconcile, stats};
use crate::api::{ReleasePhase, SequencedRelease};
use crate::cluster::{Health, health, reconnecting};
use crate::lock::{Locks, Shards};
use crate::rollout;

/// The longest backoff after API errors.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The longest backoff while a release's remote cluster is unreachable: it goes on within this
/// of the cluster answering again, even when nothing else wakes it.
const UNREACHABLE_BACKOFF: Duration = Duration::from_secs(15);
/// The longest wait before a request refused by a starting API server is tried again.
const STARTING_RETRY: Duration = Duration::from_secs(2);
/// After SIGTERM, how long the reconciles in flight may take to finish their current API call.
const IN_FLIGHT_BOUND: Duration = Duration::from_secs(5);
/// After SIGTERM, how long releasing the leases may take.
const RELEASE_BOUND: Duration = Duration::from_secs(3);
/// How many times a reconcile starts again from a fresher object after taking the lock.
const MAX_RESTARTS: usize = 3;

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
    // Every request of every client of this API server is seen by one Health: whether the
    // server is away, back, or starting (cluster/health.rs).
    let health = Arc::new(Health::new());
    let client = health::client(config.clone(), &health).map_err(kube_error("making a client"))?;
    health.probe_with(client.clone());
    let api: Api<SequencedRelease> = Api::all(client.clone());
    outage::crd_served(&api, &health).await?;
    let (trigger, triggers) = futures::channel::mpsc::unbounded();
    // The SequencedRelease watch reconnects on its own (`reconnecting`): kube-runtime's trigger
    // backoff would hold back every wake of every release after each of its errors.
    let (store, writer) = kube::runtime::reflector::store();
    let releases = kube::runtime::reflector(
        writer,
        reconnecting(
            watcher(api.clone(), watcher::Config::default().any_semantic()).boxed(),
            &health,
        ),
    )
    .applied_objects();
    let controller =
        Controller::for_stream(releases, store.clone()).trigger_backoff(outage::NoPause);
    let concurrency = options.concurrency;
    let identity = options.identity.clone();
    let shards = Arc::new(Shards::new(
        client.clone(),
        identity.clone(),
        options.sharding.clone(),
        Arc::clone(&health),
    ));
    // The first round before anything else: a lone replica owns every shard from the start.
    shards.round().await;
    options
        .metrics
        .shards_owned
        .set(shards.watch().borrow().len() as i64);
    let phases = store.clone();
    let phase_shards = Arc::clone(&shards);
    options.metrics.set_phase_source(Box::new(move || {
        phases
            .state()
            .iter()
            .filter(|sr| phase_shards.owns(&sr.uid().unwrap_or_default()))
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
    let locks = Arc::new(Locks::new(
        client.clone(),
        identity.clone(),
        Arc::clone(&shards),
    ));
    locks.watch(trigger.clone());
    // The locks a killed process of this identity left: released where another replica owns the
    // release now, taken over where this one does.
    let owned = Arc::clone(&shards.watch().borrow());
    match locks.find_earlier().await {
        Ok(()) => locks.release_earlier(&owned).await,
        Err(e) => {
            tracing::warn!(error = %e, "listing the release Leases an earlier process of this controller held")
        }
    }
    let context = Arc::new(Context::new(
        client.clone(),
        config,
        health,
        options,
        store.clone(),
        Watches::new(client.clone(), trigger.clone(), Arc::clone(&shards)),
        Events::new(client, "sequenced".to_string(), identity.clone()),
        locks,
        shards,
    ));
    let discovery = watch_discovery(&context, trigger_for_discovery.clone());
    let _keeping = Aborted(keep_shards(&context, trigger_for_discovery));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signal = {
        let context = Arc::clone(&context);
        async move {
            shutdown.await;
            context.stop();
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
    let dependencies = reconnecting(
        watcher(api, watcher::Config::default().any_semantic()).boxed(),
        context.cluster.health(),
    )
    .applied_objects();
    let controller = controller
        .watches_stream(dependencies, move |dependency| {
            dependents(&store, &dependency)
        })
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
        if tokio::time::timeout(RELEASE_BOUND, context.shards.hand_over())
            .await
            .is_err()
        {
            tracing::warn!(
                "could not give the shards back in time; their Leases expire by themselves"
            );
        }
    }
    Ok(())
}

/// A task aborted when this is dropped (when `run` returns, or its future is dropped).
struct Aborted(tokio::task::JoinHandle<()>);

impl Drop for Aborted {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps this replica's shards, one round every third of a shard Lease's duration, one at once
/// when the API server answers again after being away, and one every second while rounds fail
/// against a server that answers (a starting server refuses the controller's service account for
/// a moment). Releases of shards gained are reconciled at once (resumed from their status); those
/// of shards lost to another replica are forgotten (and woken, so that a lock still held on one
/// is handed over). A replica cut off from the API server for most of a Lease stops acting on
/// its shards; those nobody took meanwhile are its own again when it is back, with what it knew
/// of their releases.
/// When the API server answers again after being away, the releases in the middle of an
/// operation go on at once, their backoff forgotten: the backoff grown while the server was away
/// does not decide when they go on. Releases with nothing to do are not woken.
fn keep_shards(
    context: &Arc<Context>,
    trigger: futures::channel::mpsc::UnboundedSender<ObjectRef<SequencedRelease>>,
) -> tokio::task::JoinHandle<()> {
    let context = Arc::clone(context);
    tokio::spawn(async move {
        let shards = Arc::clone(&context.shards);
        let health = Arc::clone(context.cluster.health());
        let metrics = Arc::clone(&context.options.metrics);
        let mut backs = health.backs();
        let mut failed = false;
        // Shards not acted on while this replica was cut off, that nobody took meanwhile: their
        // releases are not forgotten, and not all woken when they come back (nobody else acted
        // on them); the releases in the middle of an operation go on as after any outage.
        let mut suspended: std::collections::BTreeSet<u32> = Default::default();
        loop {
            let wait = match failed && !health.away() {
                true => shards.period().min(Duration::from_secs(1)),
                false => shards.period(),
            };
            let back = tokio::select! {
                () = tokio::time::sleep(wait) => false,
                changed = backs.changed() => match changed {
                    Ok(()) => true,
                    Err(_) => {
                        tokio::time::sleep(wait).await;
                        false
                    }
                },
            };
            if context.stopping() {
                return;
            }
            let round = shards.round().await;
            failed = round.failed;
            metrics
                .shards_owned
                .set(shards.watch().borrow().len() as i64);
            metrics
                .shard_moves
                .with_label_values(&["acquired"])
                .inc_by(round.gained.len() as u64);
            metrics
                .shard_moves
                .with_label_values(&["released"])
                .inc_by(round.lost.len() as u64);
            let held = shards.held();
            let owned = shards.watch().borrow().clone();
            if !round.failed {
                context.locks.release_earlier(&owned).await;
            }
            // Lost for good: another replica holds them (or they are free). Lost while cut off
            // but still held: suspended.
            let mut lost: std::collections::BTreeSet<u32> = round
                .lost
                .iter()
                .chain(suspended.iter())
                .filter(|n| !held.contains(n))
                .copied()
                .collect();
            suspended.extend(round.lost.iter().filter(|n| held.contains(n)));
            let resumed_shards: Vec<u32> = round
                .gained
                .iter()
                .filter(|n| suspended.contains(n))
                .copied()
                .collect();
            suspended.retain(|n| held.contains(n) && !owned.contains(n));
            lost.retain(|n| !owned.contains(n));
            let gained: Vec<u32> = round
                .gained
                .iter()
                .filter(|n| !resumed_shards.contains(n))
                .copied()
                .collect();
            let recovered = back || round.reconnected || !resumed_shards.is_empty();
            if gained.is_empty() && lost.is_empty() && !recovered {
                continue;
            }
            if recovered {
                context.forgive_all();
            }
            let back_at = health.back_at().unwrap_or_else(std::time::Instant::now);
            for sr in context.store.state() {
                let shard = shards.shard(&sr.uid().unwrap_or_default());
                let key = ObjectRef::from_obj(&*sr);
                let resumed = recovered && owned.contains(&shard) && in_progress(&sr);
                if resumed {
                    context.recovery.expect(key.clone(), back_at);
                }
                let wake = if lost.contains(&shard) {
                    context.forget(&key);
                    context.locks.holds(&key)
                } else {
                    gained.contains(&shard) || resumed
                };
                if wake && trigger.unbounded_send(key).is_err() {
                    return;
                }
            }
        }
    })
}

/// Whether a release is in the middle of something: an operation, an uninstall, or reconciles
/// that fail.
fn in_progress(sr: &SequencedRelease) -> bool {
    if sr.metadata.deletion_timestamp.is_some() {
        return true;
    }
    let Some(status) = sr.status.as_ref() else {
        return true;
    };
    !matches!(
        status.phase,
        Some(ReleasePhase::Ready | ReleasePhase::Failed)
    ) || rollout::status::tells_reconcile_failure(status)
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
    use kube::core::{ApiResource, GroupVersionKind, PartialObjectMeta};
    let resource = |group: &str, kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
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
        reconnecting(
            watcher(api, watcher::Config::default().any_semantic()).boxed(),
            context.cluster.health(),
        )
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
    let failures = ctx.failed(ObjectRef::from_obj(&*sr));
    // A starting API server is asked again soon (within its own `retryAfterSeconds`, at most
    // every other second: kube-apiserver says 5 s, and served custom resources 1.7 and 2.4 s
    // after it answered again in the recordings), without a backoff grown meanwhile.
    let delay = match error.retry_soon(ctx.cluster.health()) {
        Some(after) => after
            .clamp(Duration::from_millis(500), STARTING_RETRY)
            .mul_f64(0.75 + fastrand::f64() * 0.5),
        None if matches!(error, Error::Unreachable { .. }) => {
            backoff(failures, fastrand::f64()).min(UNREACHABLE_BACKOFF)
        }
        None => backoff(failures, fastrand::f64()),
    };
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
    let uid = sr.uid().unwrap_or_default();
    if !ctx.shards.owns(&uid) {
        // Another replica's release: nothing to do here, but hand over a lock still held on it
        // (its shard moved in the middle of an operation). A shard not acted on while this
        // replica is cut off is still its own: its locks are kept.
        let moved = !ctx.shards.held().contains(&ctx.shards.shard(&uid));
        if moved && ctx.locks.holds(&key) {
            interrupt_all(&ctx, std::slice::from_ref(&key)).await;
        }
        return Ok(Action::await_change());
    }
    ctx.recovery.reconciling(&key);
    let release = format!("{}/{}", sr.namespace().unwrap_or_default(), sr.name_any());
    let span = tracing::info_span!("reconcile", release = %release);
    let started = std::time::Instant::now();
    let mut current = ctx.newest(sr);
    let mut cpu = Duration::ZERO;
    let mut restarts = 0;
    let stop = loop {
        let timed = stats::CpuTimed::new(reconcile::reconcile(
            Arc::clone(&current),
            &ctx,
            &home::Object,
        ));
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
    if result.is_ok() {
        ctx.succeeded(&key);
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
