//! What to do next for a release: one pure function, [`next`], from everything known about it
//! ([`Facts`]) to one step ([`Next`]), as Flux's helm-controller chooses its `NextAction`.
//!
//! The controller gathers facts lazily: [`next`] answers [`Next::Need`] when it lacks one (the
//! chart source and digest, the `dependsOn` states, the plan, a release record, observations of
//! the cluster), the controller gathers it, and asks again. The decision itself (the new-revision
//! test, `dependsOn` gating and cycles, revision numbering, ownership of the objects about to be
//! written, the requeue policy, which phases hold the lock, what the status says after a failure)
//! is made here and only here; the controller executes the step and writes the status it is
//! handed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::dependencies::{self, DependencyFacts};
use super::install::{self, InstallStep};
use super::status::{pending, retry_due, stalled};
use super::uninstall::{Uninstall, UninstallStep, uninstall_step};
use super::{Deployable, Note, Observations, Outcome, Revision, Settings, Wanted};
use crate::api::{
    EventReason, FINALIZER, Identity, Reason, ReleasePhase, SequencedRelease,
    SequencedReleaseStatus,
};
use crate::history::Record;

/// How long a release in progress waits without any event before it is looked at again.
pub const FALLBACK_REQUEUE: Duration = Duration::from_secs(60);
/// How long after a lease may have expired a blocked release is looked at again.
const LOCK_SLACK: Duration = Duration::from_millis(50);

/// Where the release's lock stands for this controller.
#[derive(Debug, Clone, PartialEq)]
pub enum LockView {
    /// This controller holds it.
    Ours,
    /// Nobody holds it, or the holder's lease may have expired: it can be taken when needed.
    Free,
    /// Another session holds it and renews it, as far as this controller has seen.
    Blocked { holder: String, remaining: Duration },
}

/// The chart and values the spec asks for now, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// `sha256:<hex>` of the resolved chart, the values, the release name and namespace.
    pub digest: String,
    /// The chart version a range resolved to, for repository and OCI charts.
    pub chart_version: Option<String>,
}

/// A problem only a change of the spec or the chart can fix.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
}

/// The plan rendered for one digest.
#[derive(Debug, Clone)]
pub struct PlanFact {
    pub digest: String,
    pub is_upgrade: bool,
    pub outcome: Result<Arc<Deployable>, Refusal>,
}

/// Everything known about a release in this reconcile. The facts the controller has not gathered
/// yet are `None` (or absent from the maps); [`next`] asks for them.
#[derive(Debug, Clone)]
pub struct Facts {
    pub release: Arc<SequencedRelease>,
    /// The status the decision starts from: the release's own, or what a step of this reconcile
    /// made of it (a revision just begun).
    pub status: SequencedReleaseStatus,
    pub now: Time,
    pub lock: LockView,
    pub source: Option<Result<Source, Refusal>>,
    pub dependencies: Option<DependencyFacts>,
    pub plan: Option<PlanFact>,
    /// Release records by revision; `None` when there is none.
    pub records: BTreeMap<i64, Option<Arc<Record>>>,
    pub observed: Observations,
}

impl Facts {
    /// The facts of a release as the controller first sees it.
    pub fn new(release: Arc<SequencedRelease>, lock: LockView, now: Time) -> Facts {
        Facts {
            status: release.status.clone().unwrap_or_default(),
            release,
            now,
            lock,
            source: None,
            dependencies: None,
            plan: None,
            records: BTreeMap::new(),
            observed: Observations::default(),
        }
    }

    /// The release's identity, for judging whose objects are.
    pub fn identity(&self) -> Identity {
        Identity::of(&self.release)
    }

    /// The revision being stepped: its plan and record, when both are known.
    pub fn revision<'a>(&'a self, me: &'a Identity) -> Option<Revision<'a>> {
        let settings = Settings::of(&self.release.spec);
        let plan = self.plan.as_ref()?;
        let deployable = plan.outcome.as_ref().ok()?;
        let record = self.records.get(&self.status.revision?)?.as_ref()?;
        Some(Revision::of(
            deployable,
            record,
            settings,
            me,
            plan.is_upgrade,
        ))
    }
}

/// A fact the decision needs and the controller has not gathered.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// The chart source resolved and the values read: the digest.
    Source,
    /// The states of these `dependsOn` releases (`namespace/name`), and the graph of all.
    Dependencies(Vec<String>),
    /// The chart rendered and planned for this digest.
    Plan { digest: String, is_upgrade: bool },
    /// The release record of this revision.
    Record(i64),
    /// These objects, read from the cluster.
    Observe(Wanted),
}

/// A new revision: write its record (and drop the one past `maxHistory`), create the target
/// namespace if asked, then go on stepping from `status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Begin {
    pub record: Record,
    pub drop_record: Option<i64>,
    pub status: SequencedReleaseStatus,
    pub create_namespace: bool,
}

/// When to look at a release again without an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    After(Duration),
    AwaitChange,
}

/// The one next step for a release.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Gather this fact, then ask again.
    Need(Need),
    /// Another session holds the release's lock: touch nothing.
    Blocked { holder: String, requeue: Requeue },
    /// Nothing to do (a release being deleted that is not ours to clean up).
    Idle,
    /// Add the finalizer; the change wakes the release again.
    AddFinalizer,
    /// `spec.suspend`: nothing is done. When this controller holds the lock, write `status`
    /// and release the lock.
    Suspend {
        status: Option<SequencedReleaseStatus>,
    },
    /// The release cannot go on until its spec (or chart) changes.
    Stall {
        status: SequencedReleaseStatus,
        event: Option<Note>,
        requeue: Requeue,
    },
    /// A `dependsOn` release is not Ready: write `status` (Pending) and wait for it.
    WaitForDependencies {
        status: SequencedReleaseStatus,
        requeue: Requeue,
    },
    /// Start a new revision.
    Begin(Box<Begin>),
    /// The current revision's record is missing: start the revision again.
    RestartRevision { status: SequencedReleaseStatus },
    /// Step the current revision.
    Install(Box<InstallStep>),
    /// Step the uninstall.
    Uninstall(Box<UninstallStep>),
    /// Everything is gone: publish `events`, delete the `records` (revisions), drop the
    /// finalizer and the lease.
    FinishUninstall {
        events: Vec<Note>,
        records: Vec<i64>,
    },
}

/// The next step for the release the facts describe.
pub fn next(facts: &Facts) -> Next {
    let sr = &facts.release;
    if let LockView::Blocked { holder, remaining } = &facts.lock {
        return Next::Blocked {
            holder: holder.clone(),
            requeue: Requeue::After(*remaining + LOCK_SLACK),
        };
    }
    let finalized = sr
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    if sr.metadata.deletion_timestamp.is_some() {
        return if finalized {
            uninstall(facts)
        } else {
            Next::Idle
        };
    }
    if !finalized {
        return Next::AddFinalizer;
    }
    if sr.spec.suspend {
        let status = (facts.lock == LockView::Ours).then(|| {
            let mut status = facts.status.clone();
            status.lock = None;
            status.message = Some("suspended: spec.suspend is true".to_string());
            status
        });
        return Next::Suspend { status };
    }
    deploy(facts)
}

/// Marks the release Stalled with `reason`; the first time with this message, an event too.
fn stall(facts: &Facts, reason: Reason, message: &str, settings: &Settings) -> Next {
    let status = stalled(
        &facts.status,
        facts.release.metadata.generation,
        reason,
        message,
        &facts.now,
    );
    let event = (facts.status.message.as_deref() != Some(message))
        .then(|| Note::warning(EventReason::Stalled, message.to_string()));
    let requeue = requeue(settings, &status, None, &facts.now);
    Next::Stall {
        status,
        event,
        requeue,
    }
}

fn deploy(facts: &Facts) -> Next {
    let sr = &facts.release;
    let generation = sr.metadata.generation;
    let now = &facts.now;
    let settings = Settings::of(&sr.spec);
    if let Some(message) = Settings::problem(&sr.spec) {
        return stall(facts, Reason::InvalidSpec, &message, &settings);
    }
    let source = match &facts.source {
        None => return Next::Need(Need::Source),
        Some(Err(refusal)) => {
            return stall(facts, refusal.reason, &refusal.message, &settings);
        }
        Some(Ok(source)) => source,
    };
    let status = &facts.status;
    let retry_now = retry_due(status, settings.retries, now) == Some(Duration::ZERO);
    let new_revision = status.observed_generation != generation
        || status.last_applied_digest.as_deref() != Some(source.digest.as_str())
        || retry_now;
    if new_revision {
        let wanted = dependencies::depends_on(sr);
        if !wanted.is_empty() {
            let Some(known) = &facts.dependencies else {
                return Next::Need(Need::Dependencies(wanted));
            };
            let me = dependencies::reference_of(sr);
            match dependencies::check(&me, &wanted, known) {
                dependencies::Dependencies::Ready => {}
                dependencies::Dependencies::Cycle(cycle) => {
                    let message = format!("release dependency cycle: {cycle}");
                    return stall(facts, Reason::DependencyCycle, &message, &settings);
                }
                dependencies::Dependencies::Waiting(message) => {
                    let status = pending(
                        status,
                        generation,
                        Reason::DependencyNotReady,
                        &message,
                        now,
                    );
                    // The dependency's own changes wake this release.
                    let requeue = Requeue::After(settings.interval);
                    return Next::WaitForDependencies { status, requeue };
                }
            }
        }
    }
    let number = if new_revision {
        status.revision.unwrap_or(0) + 1
    } else {
        status.revision.unwrap_or(1)
    };
    // Whether this revision is an upgrade: decided when it begins, and kept in its record.
    let is_upgrade = if new_revision {
        let previous = match status.revision {
            Some(n) => match facts.records.get(&n) {
                None => return Next::Need(Need::Record(n)),
                Some(record) => record.clone(),
            },
            None => None,
        };
        earlier_ready(status, number) || previous.is_some_and(|p| p.is_upgrade())
    } else {
        match facts.records.get(&number) {
            None => return Next::Need(Need::Record(number)),
            Some(None) => {
                let mut status = status.clone();
                status.last_applied_digest = None;
                let message = "restarting the revision: its record is missing";
                let status = pending(&status, generation, Reason::Progressing, message, now);
                return Next::RestartRevision { status };
            }
            Some(Some(record)) => record.is_upgrade(),
        }
    };
    let deployable = match &facts.plan {
        Some(plan) if plan.digest == source.digest && plan.is_upgrade == is_upgrade => {
            match &plan.outcome {
                Ok(deployable) => deployable,
                Err(refusal) => {
                    return stall(facts, refusal.reason, &refusal.message, &settings);
                }
            }
        }
        _ => {
            return Next::Need(Need::Plan {
                digest: source.digest.clone(),
                is_upgrade,
            });
        }
    };
    let me = facts.identity();
    if new_revision {
        let previous = match status.revision {
            Some(n) => match facts.records.get(&n) {
                None => return Next::Need(Need::Record(n)),
                Some(record) => record.clone(),
            },
            None => None,
        };
        let chart_version = source
            .chart_version
            .clone()
            .or_else(|| deployable.chart_version.clone());
        let record = Record {
            revision: number,
            digest: source.digest.clone(),
            chart: deployable.plan.chart.clone(),
            chart_version: chart_version.clone(),
            sequenced: settings.sequenced,
            inventory: deployable.inventory.clone(),
            prune: previous
                .map(|p| p.inventory.removed_in(&deployable.inventory))
                .unwrap_or_default(),
            hooks: deployable.hooks.clone(),
            upgrade: Some(is_upgrade),
        };
        let revision = Revision::of(deployable, &record, settings, &me, is_upgrade);
        let status = install::begin(
            &revision,
            status,
            generation,
            &source.digest,
            chart_version.as_deref(),
            now,
        );
        let max_history = i64::try_from(settings.max_history).unwrap_or(i64::MAX);
        let drop_record = (max_history > 0 && number > max_history).then(|| number - max_history);
        return Next::Begin(Box::new(Begin {
            record,
            drop_record,
            status,
            create_namespace: sr.spec.create_namespace,
        }));
    }
    // Read above: a revision in progress has its record.
    let Some(Some(record)) = facts.records.get(&number) else {
        return Next::Need(Need::Record(number));
    };
    let revision = Revision::of(deployable, record, settings, &me, is_upgrade);
    let missing = facts.observed.missing(&install::wanted(&revision, status));
    if !missing.is_empty() {
        return Next::Need(Need::Observe(missing));
    }
    match install::step(&revision, status, &facts.observed, now) {
        Outcome::Need(wanted) => Next::Need(Need::Observe(wanted)),
        Outcome::Decided(step) => Next::Install(Box::new(step)),
    }
}

/// Whether a revision before `number` was Ready, as far as the history tells: a new revision is
/// an upgrade when one was (or when the revision before it was an upgrade itself). A first
/// install and its retries are installs (as Flux retries a failed install), rendered with
/// `.Release.IsInstall` and running the `pre-install`/`post-install` hooks.
fn earlier_ready(status: &SequencedReleaseStatus, number: i64) -> bool {
    status
        .history
        .iter()
        .any(|h| h.revision != number && h.phase == ReleasePhase::Ready)
}

fn uninstall(facts: &Facts) -> Next {
    let sr = &facts.release;
    let status = &facts.status;
    let keep_history = sr.spec.uninstall.as_ref().is_some_and(|u| u.keep_history);
    let records = if keep_history {
        Vec::new()
    } else {
        let mut revisions: Vec<i64> = status.history.iter().map(|h| h.revision).collect();
        revisions.extend(status.revision);
        revisions.sort_unstable();
        revisions.dedup();
        revisions
    };
    let record = match status.revision {
        None => None,
        Some(n) => match facts.records.get(&n) {
            None => return Next::Need(Need::Record(n)),
            Some(record) => record.clone(),
        },
    };
    let Some(record) = record else {
        return Next::FinishUninstall {
            events: Vec::new(),
            records,
        };
    };
    let inventory = record.uninstall_inventory();
    let me = facts.identity();
    let settings = Settings::of(&sr.spec);
    let run = format!("{}/{}", me.uid, record.revision);
    let u = Uninstall {
        inventory: &inventory,
        sequenced: record.sequenced,
        hooks: if settings.disable_hooks {
            &[]
        } else {
            &record.hooks
        },
        run: &run,
        timeout: settings.timeout,
    };
    match uninstall_step(&u, status, &facts.observed, &me, &facts.now) {
        Outcome::Need(wanted) => Next::Need(Need::Observe(wanted)),
        // What the last step's hooks ask (a delete policy) is done first.
        Outcome::Decided(step)
            if step.finished && step.hooks_before.is_empty() && step.hooks_after.is_empty() =>
        {
            Next::FinishUninstall {
                events: step.events,
                records,
            }
        }
        Outcome::Decided(step) => Next::Uninstall(Box::new(step)),
    }
}

/// When to look at the release again without an event, given the status it was left in: at
/// `interval` once Ready (and once Failed for good, to see whether a new chart version has
/// been published), when the retry of a failure is due, and while in progress at the next
/// readiness timeout, within [`FALLBACK_REQUEUE`] and within a third of the lease duration (so
/// that the lock is renewed).
pub fn requeue(
    settings: &Settings,
    status: &SequencedReleaseStatus,
    requeue_after: Option<Duration>,
    now: &Time,
) -> Requeue {
    match status.phase {
        Some(ReleasePhase::Ready) => Requeue::After(settings.interval),
        Some(ReleasePhase::Failed) => match retry_due(status, settings.retries, now) {
            Some(due) => Requeue::After(due + Duration::from_millis(100)),
            None => Requeue::After(settings.interval),
        },
        _ => {
            let limit = FALLBACK_REQUEUE.min(settings.timeout / 3);
            Requeue::After(requeue_after.map_or(limit, |d| d.min(limit)))
        }
    }
}
