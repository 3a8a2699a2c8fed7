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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::dependencies::{self, DependencyFacts};
use super::drift::{self, DriftReport};
use super::ignore::IgnoreRules;
use super::install::{self, InstallStep};
use super::recovery::{self, Cause, Requests, RollbackRequest};
use super::status::pending as pending_status;
use super::status::{holds_lock, pending, retry_due, set_condition_to, stalled};
use super::takeover::{self, Continuation, Origin, Pending, Seen, Standing};
use super::uninstall::{self, Uninstall, UninstallStep, uninstall_step};
use super::{
    Deployable, Expressions, Note, Observations, Outcome, RecordUpdate, Revision, Settings, Wanted,
};
use crate::api::{
    ChartArtifact, DriftDetection, EventReason, FINALIZER, Identity, LayerPhase, OWNER_ANNOTATION,
    ObjectKey, OnFailure, RECONCILING, Reason, ReleasePhase, RemediationAction, RemediationStatus,
    SequencedRelease, SequencedReleaseStatus, TEST_EVENT, TEST_SUCCESS, hook_stage,
};
use crate::digest::Digests;
use crate::history::{HelmStatus, Info, Inventory, Record, WentOnFrom};
use crate::readiness::HealthChecks;
use crate::readiness::cel::NO_HEALTH_CHECKS;

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
    /// The digests of what the spec asks for: under the current scheme, which a new revision
    /// records, and under v1 when v1 can express the spec (see `crate::digest`).
    pub digests: Digests,
    /// The chart version a range resolved to, for repository and OCI charts.
    pub chart_version: Option<String>,
    /// The fetched archive's digests (remote and packaged charts).
    pub artifact: Option<ChartArtifact>,
}

impl Source {
    /// Whether a stored digest is this source's, under the scheme that wrote it.
    pub fn matches(&self, stored: Option<&str>) -> bool {
        stored.is_some_and(|stored| self.digests.matches(stored))
    }
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
    /// What the records of these revisions stored, ready to apply; `None` when a record stored
    /// no plan.
    pub stored: BTreeMap<i64, Option<Arc<Deployable>>>,
    /// The revisions that have a record.
    pub revisions: Option<Revisions>,
    /// Records of the release name that sequenced did not write (Helm's), by revision, read
    /// as what the revision that goes on from them prunes against; `None` when unreadable.
    pub helm_records: BTreeMap<i64, Option<Arc<Record>>>,
    /// How long a pending record of Helm's must stay unchanged before it is taken over
    /// (`--take-pending-after`).
    pub pending_bound: Duration,
    pub observed: Observations,
    /// When this controller first saw the operation in progress (install, upgrade, rollback,
    /// uninstall): `spec.timeout` is measured from it, not from a time another replica wrote.
    pub operation_since: Option<Time>,
    /// Whether the release's namespace is being deleted; gathered for an uninstall.
    pub namespace_terminating: Option<bool>,
    /// For an uninstall whose record is missing: the objects found by their owner annotation
    /// (in the release's and the target namespace, and cluster-scoped), or why they could not
    /// all be looked for.
    pub leftovers: Option<Result<Vec<ObjectKey>, String>>,
    /// How the objects of a Ready revision differ from what it applied.
    pub drift: Option<DriftReport>,
    /// The controller refuses references outside the release's namespace
    /// (`--no-cross-namespace-refs`).
    pub no_cross_namespace_refs: bool,
    /// Whose rights releases act with ([`account_name`]).
    pub accounts: AccountPolicy,
    /// `spec.driftDetection.ignore`, read once (its targets are regular expressions to
    /// compile); Err names what cannot be read, and the release stalls on it.
    pub ignore: Result<IgnoreRules, String>,
    /// Whether the cluster the release's objects are on can be used: Err for a
    /// `spec.kubeConfig` that cannot (a missing Secret, a refused kubeconfig), read by the
    /// controller before anything else (it says where every other fact is gathered).
    pub target: Result<(), Refusal>,
    /// The spec's CEL (`healthCheckExprs`, `dependsOn[].readyExpr`), compiled once per spec:
    /// the controller sets what it compiled for this generation; unset, [`Facts::expressions`]
    /// compiles it when first asked. Err names the expression that does not compile.
    pub expressions: OnceLock<Arc<Result<Expressions, String>>>,
}

impl Facts {
    /// The facts of a release as the controller first sees it.
    pub fn new(release: Arc<SequencedRelease>, lock: LockView, now: Time) -> Facts {
        let ignore = IgnoreRules::read(release.spec.drift_detection.ignore());
        Facts {
            status: release.status.clone().unwrap_or_default(),
            release,
            now,
            lock,
            source: None,
            dependencies: None,
            plan: None,
            records: BTreeMap::new(),
            stored: BTreeMap::new(),
            revisions: None,
            helm_records: BTreeMap::new(),
            pending_bound: takeover::DEFAULT_PENDING_BOUND,
            observed: Observations::default(),
            operation_since: None,
            namespace_terminating: None,
            leftovers: None,
            drift: None,
            no_cross_namespace_refs: false,
            accounts: AccountPolicy::default(),
            target: Ok(()),
            ignore,
            expressions: OnceLock::new(),
        }
    }

    /// `spec.healthCheckExprs`, compiled (none when the spec's CEL does not compile: the
    /// release stalls on it).
    pub fn health(&self) -> &HealthChecks {
        match self.expressions() {
            Ok(expressions) => &expressions.health,
            Err(_) => &NO_HEALTH_CHECKS,
        }
    }

    /// The spec's CEL, compiled (see [`Facts::expressions`] the field).
    pub fn expressions(&self) -> &Result<Expressions, String> {
        self.expressions
            .get_or_init(|| Arc::new(Expressions::compile(&self.release.spec)))
    }

    /// The release's identity, for judging whose objects are.
    pub fn identity(&self) -> Identity {
        Identity::of(&self.release)
    }

    /// What the revision being stepped deploys: the plan rendered for the spec, or for a
    /// rollback the plan its record stored.
    pub fn deployable(&self) -> Option<&Arc<Deployable>> {
        let record = self.records.get(&self.status.revision?)?.as_ref()?;
        if record.rollback_to.is_some() {
            self.stored.get(&record.revision)?.as_ref()
        } else {
            self.plan.as_ref()?.outcome.as_ref().ok()
        }
    }

    /// The revision being stepped: its plan and record, when both are known.
    pub fn revision<'a>(&'a self, me: &'a Identity) -> Option<Revision<'a>> {
        let settings = Settings::of(&self.release.spec);
        let deployable = self.deployable()?;
        let record = self.records.get(&self.status.revision?)?.as_ref()?;
        let revision = Revision::of(
            deployable,
            record,
            settings,
            me,
            record.is_upgrade(),
            self.health(),
        );
        Some(with_tests(
            revision,
            deployable,
            &self.release.spec,
            Some(&self.status),
        ))
    }
}

/// The release records in the release's namespace under its release name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Revisions {
    /// The revisions of this release's records.
    pub ours: BTreeSet<i64>,
    /// Every record under the release name (this release's too), as seen: what
    /// [`takeover::decide`] judges.
    pub seen: Vec<Seen>,
    /// Helm's records of the name kept by another storage driver (`ConfigMap`), when seen.
    pub other_driver: Option<String>,
}

/// A fact the decision needs and the controller has not gathered.
#[derive(Debug, Clone, PartialEq)]
pub enum Need {
    /// The chart source resolved and the values read: the digest.
    Source,
    /// What these `dependsOn` entries name (releases and objects), read fresh, and the graph
    /// of all releases.
    Dependencies(Vec<dependencies::Dependency>),
    /// The chart rendered and planned for this digest.
    Plan { digest: String, is_upgrade: bool },
    /// The release record of this revision.
    Record(i64),
    /// The record of this revision that Helm wrote (the one a takeover upgrades).
    HelmRecord(i64),
    /// The plan the record of this revision stored, ready to apply.
    StoredPlan(i64),
    /// Which revisions have a record.
    Revisions,
    /// Whether the release's namespace is being deleted.
    Namespace,
    /// Whether the objects of the current (Ready) revision still match what it applied.
    Drift,
    /// The release's objects, found by their owner annotation: its record is missing.
    Leftovers,
    /// These objects, read from the cluster.
    Observe(Wanted),
}

/// A new revision: create the target namespace if asked, write its record, update the status
/// of the `records` it changes, drop those past `maxHistory`, publish `events`, then go on
/// stepping from `status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Begin {
    /// A pending record of Helm's to mark `failed` first, only while it is still at the
    /// resourceVersion it was seen unchanged at.
    pub take_pending: Option<Pending>,
    pub record: Record,
    pub records: Vec<RecordUpdate>,
    pub drop_records: Vec<i64>,
    pub events: Vec<Note>,
    pub status: SequencedReleaseStatus,
    pub create_namespace: bool,
}

/// Update the `records`, write `status`, publish `events`; nothing else is done to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub records: Vec<RecordUpdate>,
    pub status: SequencedReleaseStatus,
    pub events: Vec<Note>,
    pub requeue: Requeue,
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
    /// Step the uninstall (of the release, or of a failed revision's objects).
    Uninstall(Box<UninstallStep>),
    /// A change of the status and records alone: a rollback refused, the end of a remediation.
    Write(Box<Write>),
    /// Everything is gone: publish `events`, update the `records` kept (`uninstall.keepHistory`)
    /// and delete the others (`delete`, revisions), drop the finalizer and the lease.
    FinishUninstall {
        events: Vec<Note>,
        records: Vec<RecordUpdate>,
        delete: Vec<i64>,
    },
}

/// The next step for the release the facts describe.
pub fn next(facts: &Facts) -> Next {
    let mut next = choose(facts);
    let waiting = matches!(next, Next::WaitForDependencies { .. });
    let operation = matches!(next, Next::Install(_) | Next::Uninstall(_));
    if let Some(status) = status_of(&mut next) {
        if operation {
            tell_outages(facts, status);
        }
        // This reconcile goes through: what a failed one set in the conditions goes.
        super::status::clear_reconcile_failure(status, &facts.now);
        // What the release waited for is told only while it waits.
        if !waiting {
            status.dependencies.clear();
        }
    }
    next
}

fn choose(facts: &Facts) -> Next {
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
        // A release that never deployed a revision has nothing on its cluster to uninstall:
        // an unusable kubeconfig does not hold its deletion.
        let deployed = facts.status.revision.is_some();
        return match (&facts.target, finalized) {
            (_, false) => Next::Idle,
            (Err(refusal), true) if deployed => target_unusable(facts, refusal),
            (_, true) => uninstall(facts),
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
    if let Err(refusal) = &facts.target {
        return target_unusable(facts, refusal);
    }
    let requests = recovery::requests(sr, &facts.status);
    let mut next = deploy(facts, &requests);
    if let (Some(token), Some(status)) = (&requests.reconcile, status_of(&mut next)) {
        // A reconcile was requested: the status this step writes says it was acted on.
        status.last_handled_reconcile_at = Some(token.to_string());
    }
    next
}

/// The status a step writes, when it writes one.
fn status_of(next: &mut Next) -> Option<&mut SequencedReleaseStatus> {
    match next {
        Next::Stall { status, .. }
        | Next::WaitForDependencies { status, .. }
        | Next::RestartRevision { status } => Some(status),
        Next::Begin(begin) => Some(&mut begin.status),
        Next::Install(step) => Some(&mut step.status),
        Next::Uninstall(step) => Some(&mut step.status),
        Next::Write(write) => Some(&mut write.status),
        _ => None,
    }
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

/// The cluster of the release's objects cannot be used (`spec.kubeConfig`): Stalled with the
/// refusal's reason until the spec or the kubeconfig Secret changes (it is watched). An
/// uninstall stays Uninstalling: its objects are on that cluster.
fn target_unusable(facts: &Facts, refusal: &Refusal) -> Next {
    let settings = Settings::of(&facts.release.spec);
    let uninstalling = facts.release.metadata.deletion_timestamp.is_some()
        || facts.status.phase == Some(ReleasePhase::Uninstalling);
    if !uninstalling {
        return stall(facts, refusal.reason, &refusal.message, &settings);
    }
    let mut status = facts.status.clone();
    status.message = Some(refusal.message.clone());
    super::status::set_stalled(&mut status, refusal.reason, &refusal.message, &facts.now);
    let event = (facts.status.message.as_deref() != Some(refusal.message.as_str()))
        .then(|| Note::warning(EventReason::Stalled, refusal.message.clone()));
    Next::Stall {
        requeue: requeue(&settings, &status, None, &facts.now),
        status,
        event,
    }
}

/// Whose rights releases act with: the controller's `--default-service-account`, and whether
/// it runs multi-tenant (where no release ever acts with the controller's own rights).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AccountPolicy {
    pub default_service_account: Option<String>,
    pub multi_tenant: bool,
}

/// The ServiceAccount (of the release's own namespace) a release with `spec` acts as: its
/// `serviceAccountName`, else the controller's default; None for the controller's own identity,
/// which only a single-tenant controller lends. Err says why the release may not act at all:
/// an empty or invalid name (an empty name once meant "the controller's rights", which is how a
/// tenant escaped its account), or no name in multi-tenant mode without a default.
pub fn account_name(
    spec: &crate::api::SequencedReleaseSpec,
    policy: &AccountPolicy,
) -> Result<Option<String>, String> {
    match spec.service_account_name.as_deref() {
        Some("") => Err(
            "spec.serviceAccountName: must not be empty: name a ServiceAccount of the release's \
             namespace, or leave the field out"
                .to_string(),
        ),
        Some(name) if !crate::plan::annotations::valid_dns_subdomain(name.as_bytes()) => {
            Err(format!(
                "spec.serviceAccountName: {name:?} is not a ServiceAccount name (lowercase \
                 letters, digits, '-' and '.')"
            ))
        }
        Some(name) => Ok(Some(name.to_string())),
        None => match &policy.default_service_account {
            Some(name) => Ok(Some(name.clone())),
            None if policy.multi_tenant => Err(
                "spec.serviceAccountName: required: this controller runs multi-tenant \
                 (--multi-tenant) without --default-service-account, and never acts for a \
                 release with its own rights"
                    .to_string(),
            ),
            None => Ok(None),
        },
    }
}

/// The references of `sr` outside its own namespace, as a message; None when there are none.
/// `valuesFrom`, `chart.configMapRef`, `chart.secretRef` and `chart.credentialsSecretRef` name
/// objects of the release's namespace only, so they cannot be.
pub fn cross_namespace_refs(sr: &SequencedRelease) -> Option<String> {
    let own = sr.metadata.namespace.as_deref().unwrap_or("default");
    let mut refs = Vec::new();
    if let Some(target) = sr.spec.target_namespace.as_deref().filter(|t| *t != own) {
        refs.push(format!("spec.targetNamespace {target}"));
    }
    for (i, dependency) in sr.spec.depends_on.iter().enumerate() {
        if let Some(ns) = dependency.namespace.as_deref().filter(|n| *n != own) {
            let kind = match &dependency.kind {
                Some(kind) => format!("{kind} "),
                None => String::new(),
            };
            refs.push(format!(
                "spec.dependsOn[{i}] {kind}{ns}/{}",
                dependency.name
            ));
        }
    }
    (!refs.is_empty()).then(|| {
        format!(
            "this controller refuses references outside the release's namespace {own} (--no-cross-namespace-refs): {}",
            refs.join(", ")
        )
    })
}

fn deploy(facts: &Facts, requests: &Requests) -> Next {
    let sr = &facts.release;
    let generation = sr.metadata.generation;
    let now = &facts.now;
    let settings = Settings::of(&sr.spec);
    if let Some(message) = Settings::problem(&sr.spec)
        .or_else(|| account_name(&sr.spec, &facts.accounts).err())
        .or_else(|| facts.ignore.as_ref().err().cloned())
        .or_else(|| facts.expressions().as_ref().err().cloned())
    {
        return stall(facts, Reason::InvalidSpec, &message, &settings);
    }
    if facts.no_cross_namespace_refs
        && let Some(message) = cross_namespace_refs(sr)
    {
        return stall(facts, Reason::CrossNamespaceRef, &message, &settings);
    }
    let source = match &facts.source {
        None => return Next::Need(Need::Source),
        Some(Err(refusal)) => {
            return stall(facts, refusal.reason, &refusal.message, &settings);
        }
        Some(Ok(source)) => source,
    };
    let status = &facts.status;
    if let Some(request) = &requests.rollback {
        return rollback_on_request(facts, request, source, &settings);
    }
    // A rollback holds the release on its revision until the spec or the chart changes, or a
    // reconcile is requested.
    let pinned = recovery::pinned(status, generation, |d| source.matches(d));
    let changed = status.observed_generation != generation
        || !source.matches(status.last_applied_digest.as_deref());
    let retry_now = retry_due(status, settings.retries, now) == Some(Duration::ZERO);
    let retry_requested = requests.reconcile.is_some()
        && (requests.force
            || status.phase == Some(ReleasePhase::Failed)
            || (pinned && !holds_lock(status.phase))
            || (status.phase == Some(ReleasePhase::Ready)
                && drift::chart_changed(status, source.artifact.as_ref()).is_some()));
    let new_revision = (changed && !pinned) || retry_now || retry_requested;
    if !new_revision {
        if recovery::remediation_due(&settings, status) {
            return remediate(facts, source, &settings);
        }
        if status.phase == Some(ReleasePhase::Uninstalling) && recovery::uninstalled(status) {
            return uninstall_failed(facts, status, false);
        }
    }
    // Tests asked for: run on the Ready revision; after an operation under way; refused when
    // the release is not Ready.
    if !new_revision && let Some(token) = &requests.test {
        match status.phase {
            Some(ReleasePhase::Ready) => return begin_test(facts, token, source, &settings),
            phase if holds_lock(phase) => {}
            _ => return refuse_test(facts, token, &not_ready(status), &settings),
        }
    }
    if new_revision {
        let wanted = dependencies::dependencies(sr);
        if !wanted.is_empty() {
            let Some(known) = &facts.dependencies else {
                return Next::Need(Need::Dependencies(wanted));
            };
            let me = dependencies::reference_of(sr);
            let ready_exprs = match facts.expressions() {
                Ok(expressions) => &expressions.ready,
                Err(_) => &BTreeMap::new(),
            };
            match dependencies::check(&me, &wanted, ready_exprs, known) {
                dependencies::Dependencies::Ready => {}
                dependencies::Dependencies::Cycle(cycle) => {
                    let message = format!("release dependency cycle: {cycle}");
                    return stall(facts, Reason::DependencyCycle, &message, &settings);
                }
                dependencies::Dependencies::Waiting { message, statuses } => {
                    let mut status = pending(
                        status,
                        generation,
                        Reason::DependencyNotReady,
                        &message,
                        now,
                    );
                    status.dependencies = statuses;
                    // The dependency's own changes wake this release.
                    let requeue = Requeue::After(settings.interval);
                    return Next::WaitForDependencies { status, requeue };
                }
            }
        }
    }
    // A history sequenced did not write that the new revision goes on from (a Helm release's).
    let mut took: Option<(Continuation, Option<Pending>)> = None;
    // The record of ours the revision goes on under (begun before the status said so).
    let mut begun: Option<Arc<Record>> = None;
    let number = if new_revision {
        // After every record of the release, also those an uninstall kept (as `helm install
        // --replace` numbers).
        let revisions = match revisions(facts, &settings) {
            Ok(revisions) => revisions,
            Err(next) => return *next,
        };
        match standing(facts, &settings, revisions) {
            Standing::Ours { .. } => {}
            Standing::Refuse { reason, message } => {
                return stall(facts, reason, &message, &settings);
            }
            Standing::WaitPending(pending) => return wait_pending(facts, &pending),
            Standing::Continue(then) => took = Some((then, None)),
            Standing::TakePending { pending, then } => took = Some((then, Some(pending))),
        }
        let last = revisions.ours.last().copied().unwrap_or(0);
        match begun_unknown(facts, last, source) {
            Ok(true) => {
                begun = facts.records.get(&last).cloned().flatten();
                last
            }
            Ok(false) => {
                let theirs = took.as_ref().map_or(0, |(then, _)| then.last);
                status.revision.unwrap_or(0).max(last).max(theirs) + 1
            }
            Err(next) => return *next,
        }
    } else {
        status.revision.unwrap_or(1)
    };
    if !new_revision {
        return step_revision(facts, number, source, &settings);
    }
    // Whether this revision is an upgrade: decided when it begins, and kept in its record.
    // Going on from Helm's history, the record it upgrades is Helm's.
    let previous = match (&took, previous_record(facts)) {
        (Some((then, _)), _) => match then.base {
            None => None,
            Some(base) => match facts.helm_records.get(&base) {
                None => return Next::Need(Need::HelmRecord(base)),
                Some(record) => record.clone(),
            },
        },
        (None, Ok(previous)) => previous,
        (None, Err(next)) => return *next,
    };
    let is_upgrade = match (&begun, &took) {
        (Some(record), _) => record.is_upgrade(),
        (None, Some((then, _))) => then.upgrade,
        (None, None) => {
            (earlier_ready(status, number) || previous.as_ref().is_some_and(|p| p.is_upgrade()))
                && !recovery::uninstalled(status)
        }
    };
    let deployable = match rendered(facts, source, is_upgrade, &settings) {
        Ok(deployable) => deployable,
        Err(next) => return *next,
    };
    let revisions = match revisions(facts, &settings) {
        Ok(revisions) => revisions,
        Err(next) => return *next,
    };
    let me = facts.identity();
    let chart_version = source
        .chart_version
        .clone()
        .or_else(|| deployable.chart_version.clone());
    let record = Record {
        revision: number,
        digest: source.digests.current.clone(),
        chart: deployable.plan.chart.clone(),
        chart_version: chart_version.clone(),
        chart_artifact: source.artifact.clone(),
        sequenced: settings.sequenced,
        inventory: deployable.inventory.clone(),
        prune: match &begun {
            // What it pruned when it began (from a record of Helm's, perhaps).
            Some(record) if record.went_on_from.is_some() => record.prune.clone(),
            _ => previous
                .as_ref()
                .map(|p| p.inventory.removed_in(&deployable.inventory))
                .unwrap_or_default(),
        },
        hooks: deployable.hooks.clone(),
        upgrade: Some(is_upgrade),
        crds: Some(settings.crd_policy(is_upgrade)),
        plan: Some(deployable.stored()),
        rollback_to: None,
        went_on_from: match (&begun, &took) {
            (Some(record), _) => record.went_on_from.clone(),
            (None, Some((then, pending))) => Some(WentOnFrom {
                origin: match &then.origin {
                    Origin::Helm => "helm".to_string(),
                    Origin::Orphan(owner) => owner.clone(),
                },
                last: then.last,
                base: then.base,
                took_pending: pending.as_ref().map(|p| p.revision),
            }),
            (None, None) => None,
        },
        tests: Vec::new(),
        content: deployable.content.clone(),
        info: Info {
            status: if is_upgrade {
                HelmStatus::PendingUpgrade
            } else {
                HelmStatus::PendingInstall
            },
            description: if is_upgrade {
                "Preparing upgrade".to_string()
            } else {
                "Initial install underway".to_string()
            },
            first_deployed: first_deployed(previous.as_deref(), now),
            last_deployed: now.0.to_string(),
        },
    };
    let revision = Revision::of(
        deployable,
        &record,
        settings,
        &me,
        is_upgrade,
        facts.health(),
    );
    let revision = with_tests(revision, deployable, &sr.spec, None);
    let mut status = install::begin(
        &revision,
        number,
        status,
        generation,
        &source.digests.current,
        chart_version.as_deref(),
        now,
    );
    install::with_artifact(&mut status, source.artifact.as_ref());
    status.rollback = None;
    status.inventory = kept_inventory(facts, &record);
    let mut events = Vec::new();
    let mut take_pending = None;
    if let Some((then, pending)) = took {
        let mut told = Vec::new();
        if let Some(pending) = pending {
            let message = pending.taken_message();
            events.push(Note::normal(
                EventReason::HelmRecordTakenOver,
                message.clone(),
            ));
            told.push(message);
            take_pending = Some(pending);
        }
        let message = then.message(&me.release_name, number);
        events.push(Note::normal(
            EventReason::HelmReleaseAdopted,
            message.clone(),
        ));
        told.insert(0, message);
        if let Some(entry) = status.history.first_mut().filter(|e| e.revision == number) {
            entry.description = Some(told.join("; "));
        }
        if let Some(progress) = &status.message {
            told.push(progress.clone());
        }
        status.message = Some(told.join("; "));
    }
    Next::Begin(Box::new(Begin {
        records: superseded(&facts.status, number),
        drop_records: past_history(revisions, &facts.status, number, &settings),
        events,
        take_pending,
        record,
        status,
        create_namespace: sr.spec.create_namespace,
    }))
}

/// Where the release name's history stands for this release ([`takeover::decide`]).
fn standing(facts: &Facts, settings: &Settings, revisions: &Revisions) -> Standing {
    let me = facts.identity();
    let namespace = facts
        .release
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    takeover::decide(&takeover::Question {
        me: &me.owner,
        release_name: &me.release_name,
        namespace,
        records: &revisions.seen,
        other_driver: revisions.other_driver.as_deref(),
        opted_in: settings.adopt,
        opt_in: "spec.adopt: true",
        bound: facts.pending_bound,
    })
}

/// The newest record of the release name is a pending one of Helm's, not yet unchanged for the
/// bound: the release waits (Pending, `HelmOperationPending`), saying until when, and is looked
/// at again then.
fn wait_pending(facts: &Facts, pending: &Pending) -> Next {
    let me = facts.identity();
    let remaining = Duration::from_secs(pending.remaining.as_secs_f64().ceil() as u64);
    let at = k8s_openapi::jiff::SignedDuration::try_from(remaining)
        .ok()
        .and_then(|d| facts.now.0.checked_add(d).ok())
        .map_or_else(|| "a later time".to_string(), |t| t.to_string());
    let mut message = pending.waiting_message(&me.release_name, &at);
    // The same wait, told once: the time it ends is not told again a second off.
    let unchanged = |m: &str| m.rsplit_once(" at ").map(|(head, _)| head.to_string());
    if let Some(told) = facts.status.message.as_deref()
        && facts.status.phase == Some(ReleasePhase::Pending)
        && unchanged(told) == unchanged(&message)
    {
        message = told.to_string();
    }
    let status = pending_status(
        &facts.status,
        facts.release.metadata.generation,
        Reason::HelmOperationPending,
        &message,
        &facts.now,
    );
    Next::Write(Box::new(Write {
        records: Vec::new(),
        status,
        events: Vec::new(),
        requeue: Requeue::After(remaining + LOCK_SLACK),
    }))
}

/// What `status.inventory` keeps while `record`'s revision is the current one: its objects
/// outside the release's namespace, with those it prunes, in uninstall order.
fn kept_inventory(facts: &Facts, record: &Record) -> Vec<crate::api::InventoryEntry> {
    let namespace = facts
        .release
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    record.uninstall_inventory().outside(namespace)
}

/// The record of the current revision, the one a new revision comes after.
/// Whether revision `last`, the newest record of the release, was begun for this very digest by
/// a controller that stopped before the status said so (a revision's record is written first,
/// then the status): it is that revision that goes on, not another one after it.
fn begun_unknown(facts: &Facts, last: i64, source: &Source) -> Result<bool, Box<Next>> {
    let status = &facts.status;
    let known =
        status.revision.unwrap_or(0) >= last || status.history.iter().any(|h| h.revision == last);
    if last == 0 || known {
        return Ok(false);
    }
    match facts.records.get(&last) {
        None => Err(Box::new(Next::Need(Need::Record(last)))),
        Some(Some(record)) => Ok(record.digest == source.digests.current
            && record.rollback_to.is_none()
            && matches!(
                record.info.status,
                HelmStatus::PendingInstall | HelmStatus::PendingUpgrade
            )),
        Some(None) => Ok(false),
    }
}

fn previous_record(facts: &Facts) -> Result<Option<Arc<Record>>, Box<Next>> {
    match facts.status.revision {
        Some(n) => match facts.records.get(&n) {
            None => Err(Box::new(Next::Need(Need::Record(n)))),
            Some(record) => Ok(record.clone()),
        },
        None => Ok(None),
    }
}

/// When the release was first deployed, as Helm keeps it from revision to revision.
fn first_deployed(previous: Option<&Record>, now: &Time) -> String {
    previous
        .map(|p| p.info.first_deployed.clone())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| now.0.to_string())
}

/// A revision still in progress when revision `number` begins is superseded by it.
fn superseded(status: &SequencedReleaseStatus, number: i64) -> Vec<RecordUpdate> {
    status
        .history
        .first()
        .filter(|h| h.finished_at.is_none() && h.revision < number)
        .map(|h| RecordUpdate {
            revision: h.revision,
            status: HelmStatus::Superseded,
            description: format!("Superseded by revision {number} before it finished"),
            only_from: None,
            tests: None,
        })
        .into_iter()
        .collect()
}

/// The revisions that have records, before a new one is written (whose the release name is,
/// [`standing`] judges).
fn revisions<'a>(facts: &'a Facts, _settings: &Settings) -> Result<&'a Revisions, Box<Next>> {
    match &facts.revisions {
        None => Err(Box::new(Next::Need(Need::Revisions))),
        Some(revisions) => Ok(revisions),
    }
}

/// The records past `maxHistory` once revision `number` is written: all of them, also when the
/// cap was lowered (and those of the history, which records of the earlier format have).
fn past_history(
    revisions: &Revisions,
    status: &SequencedReleaseStatus,
    number: i64,
    settings: &Settings,
) -> Vec<i64> {
    let max = i64::try_from(settings.max_history).unwrap_or(i64::MAX);
    if max == 0 {
        return Vec::new();
    }
    let mut all = revisions.ours.clone();
    all.extend(status.history.iter().map(|h| h.revision));
    all.into_iter().filter(|&r| r <= number - max).collect()
}

/// The plan rendered for the spec's digest, or the step that asks for it or stalls on it.
fn rendered<'a>(
    facts: &'a Facts,
    source: &Source,
    is_upgrade: bool,
    settings: &Settings,
) -> Result<&'a Arc<Deployable>, Box<Next>> {
    match &facts.plan {
        Some(plan) if plan.digest == source.digests.current && plan.is_upgrade == is_upgrade => {
            match &plan.outcome {
                Ok(deployable) => Ok(deployable),
                Err(refusal) => Err(Box::new(stall(
                    facts,
                    refusal.reason,
                    &refusal.message,
                    settings,
                ))),
            }
        }
        _ => Err(Box::new(Next::Need(Need::Plan {
            digest: source.digests.current.clone(),
            is_upgrade,
        }))),
    }
}

/// Steps revision `number`, which is in progress or done: its plan is the one rendered for the
/// spec, or for a rollback the one its record stored.
fn step_revision(facts: &Facts, number: i64, source: &Source, settings: &Settings) -> Next {
    let status = &facts.status;
    let generation = facts.release.metadata.generation;
    let now = &facts.now;
    let record = match facts.records.get(&number) {
        None => return Next::Need(Need::Record(number)),
        Some(None) => {
            let mut status = status.clone();
            status.last_applied_digest = None;
            status.rollback = None;
            let message = "restarting the revision: its record is missing";
            let status = pending(&status, generation, Reason::Progressing, message, now);
            return Next::RestartRevision { status };
        }
        Some(Some(record)) => record,
    };
    let deployable = match deployed(facts, record, source, settings) {
        Ok(deployable) => deployable,
        Err(next) => return *next,
    };
    let me = facts.identity();
    let revision = Revision::of(
        deployable,
        record,
        *settings,
        &me,
        record.is_upgrade(),
        facts.health(),
    );
    let revision = with_tests(revision, deployable, &facts.release.spec, Some(status));
    if status.phase == Some(ReleasePhase::Ready)
        && let Some((status, events)) = drift::judge_chart(status, source.artifact.as_ref(), now)
    {
        return Next::Write(Box::new(Write {
            records: Vec::new(),
            requeue: requeue(settings, &status, None, now),
            status,
            events,
        }));
    }
    if status.phase == Some(ReleasePhase::Ready) && settings.drift != DriftDetection::Disabled {
        let Some(report) = &facts.drift else {
            return Next::Need(Need::Drift);
        };
        if let Some((status, events)) = drift::judge(&revision, status, report, now) {
            let requeue = if status.phase == Some(ReleasePhase::Ready) {
                requeue(settings, &status, None, now)
            } else {
                Requeue::After(Duration::from_millis(100))
            };
            return Next::Write(Box::new(Write {
                records: Vec::new(),
                status,
                events,
                requeue,
            }));
        }
    }
    let missing = facts.observed.missing(&install::wanted(&revision, status));
    if !missing.is_empty() {
        return Next::Need(Need::Observe(missing));
    }
    match install::step(&revision, status, &facts.observed, now) {
        Outcome::Need(wanted) => Next::Need(Need::Observe(wanted)),
        Outcome::Decided(step) => {
            let mut step = match timed_out(facts, settings) {
                Some(limit) => install::time_out(&revision, status, step, limit, now),
                None => step,
            };
            step.records =
                recovery::finish(status, &mut step.status, record, &mut step.events, now);
            Next::Install(Box::new(step))
        }
    }
}

/// What revision `record` deploys: the plan rendered for the spec, or for a rollback the plan
/// its record stored; or the step that asks for it or stalls on it.
fn deployed<'a>(
    facts: &'a Facts,
    record: &Record,
    source: &Source,
    settings: &Settings,
) -> Result<&'a Arc<Deployable>, Box<Next>> {
    let number = record.revision;
    if record.rollback_to.is_none() {
        return rendered(facts, source, record.is_upgrade(), settings);
    }
    match facts.stored.get(&number) {
        None => Err(Box::new(Next::Need(Need::StoredPlan(number)))),
        Some(Some(deployable)) => Ok(deployable),
        Some(None) => {
            let message =
                format!("the record of revision {number} has no stored plan to roll back with");
            Err(Box::new(stall(
                facts,
                Reason::InvalidSpec,
                &message,
                settings,
            )))
        }
    }
}

/// The revision with its `(test)` stage, when it has one: `spec.test.enable` (in a revision
/// that is no rollback: as Flux, a rollback is not tested), a run on request under way (phase
/// Testing, named after its token), or the stage such a run left in `status` (the layout of a
/// revision does not change once it began). `status` is None for a revision that begins.
pub(super) fn with_tests<'a>(
    revision: Revision<'a>,
    deployable: &'a Deployable,
    spec: &crate::api::SequencedReleaseSpec,
    status: Option<&SequencedReleaseStatus>,
) -> Revision<'a> {
    let enabled = spec.test.as_ref().is_some_and(|t| t.enable) && !revision.rollback;
    let (present, on_demand) = match status {
        None => (enabled, None),
        Some(status) => {
            let testing = status.phase == Some(ReleasePhase::Testing);
            let staged = status
                .layers
                .iter()
                .any(|l| l.name == hook_stage(TEST_EVENT));
            let on_demand = status.last_handled_test_at.clone().filter(|_| testing);
            (enabled || staged || testing, on_demand)
        }
    };
    if present {
        revision.with_tests(&deployable.hooks, spec, on_demand)
    } else {
        revision
    }
}

/// Runs the tests of the Ready revision, as `sequenced test` asked with `token`: its `(test)`
/// stage starts afresh (and is added to its layers when tests are not enabled), the release is
/// Testing and stays Ready; a chart without tests passes at once.
fn begin_test(facts: &Facts, token: &str, source: &Source, settings: &Settings) -> Next {
    let status = &facts.status;
    let now = &facts.now;
    let Some(number) = status.revision else {
        return refuse_test(facts, token, "the release has no revision yet", settings);
    };
    let record = match facts.records.get(&number) {
        None => return Next::Need(Need::Record(number)),
        Some(None) => {
            let message = format!("the record of revision {number} is missing");
            return refuse_test(facts, token, &message, settings);
        }
        Some(Some(record)) => record,
    };
    let deployable = match deployed(facts, record, source, settings) {
        Ok(deployable) => deployable,
        Err(next) => return *next,
    };
    let me = facts.identity();
    let revision = Revision::of(
        deployable,
        record,
        *settings,
        &me,
        record.is_upgrade(),
        facts.health(),
    )
    .with_tests(
        &deployable.hooks,
        &facts.release.spec,
        Some(token.to_string()),
    );
    let mut st = status.clone();
    st.last_handled_test_at = Some(token.to_string());
    st.test_refused = None;
    st.tests.clear();
    let generation = st.observed_generation;
    let stage = revision.test.as_ref().and_then(|t| t.stage.as_ref());
    let Some(stage) = stage else {
        let message = format!("revision {number}: no tests to run");
        set_condition_to(
            &mut st.conditions,
            TEST_SUCCESS,
            Some(true),
            Reason::TestSucceeded,
            &message,
            generation,
            now,
        );
        return Next::Write(Box::new(Write {
            records: Vec::new(),
            requeue: requeue(settings, &st, None, now),
            events: vec![Note::normal(EventReason::TestSucceeded, message)],
            status: st,
        }));
    };
    let entry = stage.entry(&revision.plan.chart);
    match st.layers.iter().position(|l| l.name == entry.name) {
        Some(i) => st.layers[i] = entry,
        None => st.layers.push(entry),
    }
    let count = stage.order.len();
    let message = format!(
        "revision {number}: running {count} test{}, as requested",
        if count == 1 { "" } else { "s" }
    );
    st.phase = Some(ReleasePhase::Testing);
    st.message = Some(message.clone());
    // The release stays Ready while its tests run: nothing of it changes.
    set_condition_to(
        &mut st.conditions,
        RECONCILING,
        Some(true),
        Reason::Progressing,
        &message,
        generation,
        now,
    );
    Next::Write(Box::new(Write {
        records: Vec::new(),
        status: st,
        events: Vec::new(),
        requeue: Requeue::After(Duration::from_millis(100)),
    }))
}

/// A test run asked for with `token` that cannot run (the release is not Ready): handled, and
/// `status.testRefused` and a warning say why; nothing else changes.
fn refuse_test(facts: &Facts, token: &str, why: &str, settings: &Settings) -> Next {
    let mut st = facts.status.clone();
    let message = format!("tests not run: {why}");
    st.last_handled_test_at = Some(token.to_string());
    st.test_refused = Some(message.clone());
    Next::Write(Box::new(Write {
        records: Vec::new(),
        requeue: requeue(settings, &st, None, &facts.now),
        status: st,
        events: vec![Note::warning(EventReason::TestRefused, message)],
    }))
}

/// Why a release in `status` cannot be tested now: it is not Ready.
fn not_ready(status: &SequencedReleaseStatus) -> String {
    let phase = status
        .phase
        .map_or_else(|| "new".to_string(), |p| format!("{p:?}"));
    let mut why = match status.revision {
        Some(revision) => format!("the release is {phase} at revision {revision}, not Ready"),
        None => "the release has no revision yet".to_string(),
    };
    if let Some(message) = status.message.as_deref().and_then(|m| m.lines().next())
        && status.revision.is_some()
    {
        why.push_str(": ");
        why.push_str(message);
    }
    why
}

/// `spec.timeout` when the operation in progress has run that long, as this controller saw it.
/// Tests under way are bounded by their own timeout (`spec.test.timeout`), each.
fn timed_out(facts: &Facts, settings: &Settings) -> Option<Duration> {
    let testing = facts.status.layers.iter().any(|l| {
        l.name == hook_stage(TEST_EVENT)
            && matches!(
                l.phase,
                LayerPhase::Applying
                    | LayerPhase::Waiting
                    | LayerPhase::Deleting
                    | LayerPhase::CleaningUp
            )
    });
    if testing {
        return None;
    }
    let since = facts.operation_since.as_ref()?;
    // The time the API server did not answer is not counted (`super::outages`).
    let ran = facts.observed.outages.waited(Some(since), &facts.now)?;
    (holds_lock(facts.status.phase) && ran >= settings.timeout).then_some(settings.timeout)
}

/// An operation that was paused while the API server did not answer says for how long, in
/// its message and in the conditions that carry the message.
fn tell_outages(facts: &Facts, status: &mut SequencedReleaseStatus) {
    let note = super::outages::told(&facts.observed.outages, facts.operation_since.as_ref());
    let Some(message) = status.message.clone().filter(|_| !note.is_empty()) else {
        return;
    };
    let told = format!("{message}{note}");
    for condition in &mut status.conditions {
        if condition.message == message {
            condition.message.clone_from(&told);
        }
    }
    status.message = Some(told);
}

/// A rollback asked for with `sequenced rollback`: to the revision it names, or to the Ready
/// revision before the current one.
fn rollback_on_request(
    facts: &Facts,
    request: &RollbackRequest,
    source: &Source,
    settings: &Settings,
) -> Next {
    let status = &facts.status;
    let cause = Cause::Requested {
        token: request.token.clone(),
    };
    let Some(current) = status.revision else {
        let message = "nothing to roll back: the release has no revision yet".to_string();
        return refuse_rollback(facts, &cause, &message, settings);
    };
    let target = match &request.revision {
        Err(message) => return refuse_rollback(facts, &cause, message, settings),
        Ok(Some(target)) => *target,
        Ok(None) => match recovery::last_ready_before(status, current) {
            Some(target) => target,
            None => {
                let message = format!(
                    "no revision before revision {current} was Ready: nothing to roll back to"
                );
                return refuse_rollback(facts, &cause, &message, settings);
            }
        },
    };
    if target > current {
        let message = format!("there is no revision {target}: the latest is {current}");
        return refuse_rollback(facts, &cause, &message, settings);
    }
    begin_rollback(facts, target, &cause, source, settings)
}

/// Begins a new revision that rolls back to revision `target`.
fn begin_rollback(
    facts: &Facts,
    target: i64,
    cause: &Cause,
    source: &Source,
    settings: &Settings,
) -> Next {
    let status = &facts.status;
    let now = &facts.now;
    let stored = match facts.records.get(&target) {
        None => return Next::Need(Need::Record(target)),
        Some(None) => {
            let message = format!(
                "cannot roll back to revision {target}: its record is gone (spec.maxHistory keeps {})",
                settings.max_history
            );
            return refuse_rollback(facts, cause, &message, settings);
        }
        Some(Some(record)) => record,
    };
    if stored.plan.is_none() {
        let message = format!(
            "cannot roll back to revision {target}: its record holds no plan (written by an earlier sequenced, or too large for a Secret with it)"
        );
        return refuse_rollback(facts, cause, &message, settings);
    }
    let from = match previous_record(facts) {
        Ok(from) => from,
        Err(next) => return *next,
    };
    let revisions = match revisions(facts, settings) {
        Ok(revisions) => revisions,
        Err(next) => return *next,
    };
    let number = status.revision.unwrap_or(0) + 1;
    let record = recovery::rollback_record(stored, from.as_deref(), number, now);
    let Some(deployable) = Deployable::from_record(&record) else {
        return Next::Need(Need::Record(target));
    };
    let me = facts.identity();
    let revision = Revision::of(&deployable, &record, *settings, &me, true, facts.health());
    let (mut status, note) = recovery::begin_rollback(
        &revision,
        &record,
        status,
        facts.release.metadata.generation,
        &source.digests.current,
        cause,
        now,
    );
    status.inventory = kept_inventory(facts, &record);
    Next::Begin(Box::new(Begin {
        records: superseded(&facts.status, number),
        drop_records: past_history(revisions, &facts.status, number, settings),
        events: vec![note],
        take_pending: None,
        record,
        status,
        create_namespace: false,
    }))
}

/// A rollback that cannot be done: the status and a warning say why. A requested one is
/// handled (not tried again); a remediation leaves the failed revision's objects as they are.
fn refuse_rollback(facts: &Facts, cause: &Cause, message: &str, settings: &Settings) -> Next {
    let mut status = facts.status.clone();
    let message = match cause {
        Cause::Requested { token } => {
            status.last_handled_rollback_at = Some(token.clone());
            format!("rollback refused: {message}")
        }
        Cause::Failure {
            failed,
            message: failure,
        } => {
            status.remediation = Some(RemediationStatus {
                failed_revision: *failed,
                action: RemediationAction::Rollback,
                failure: Some(failure.clone()),
            });
            format!("revision {failed} failed: {failure}; {message}; its objects are kept")
        }
    };
    status.message = Some(message.clone());
    let requeue = requeue(settings, &status, None, &facts.now);
    Next::Write(Box::new(Write {
        status,
        events: vec![Note::warning(EventReason::RollbackRefused, message)],
        records: Vec::new(),
        requeue,
    }))
}

/// The current revision failed and its retries are spent: `spec.onFailure` says what now.
/// `rollback` goes back to the last revision that was Ready; with none (a first install), or
/// with `uninstall`, the failed revision's objects are uninstalled in reverse order.
fn remediate(facts: &Facts, source: &Source, settings: &Settings) -> Next {
    let status = &facts.status;
    let Some(failed) = status.revision else {
        return Next::Idle;
    };
    let failure = status.message.clone().unwrap_or_default();
    if settings.on_failure == OnFailure::Rollback
        && let Some(target) = recovery::last_ready_before(status, failed)
    {
        let cause = Cause::Failure {
            failed,
            message: failure,
        };
        return begin_rollback(facts, target, &cause, source, settings);
    }
    let mut status = status.clone();
    status.remediation = Some(RemediationStatus {
        failed_revision: failed,
        action: RemediationAction::Uninstall,
        failure: Some(failure),
    });
    uninstall_failed(facts, &status, true)
}

/// Steps the uninstall of the failed current revision's objects (`starting` it now); once
/// everything is gone, the release is Failed and Stalled until its spec changes.
fn uninstall_failed(facts: &Facts, status: &SequencedReleaseStatus, starting: bool) -> Next {
    let Some(number) = status.revision else {
        return Next::Idle;
    };
    let settings = Settings::of(&facts.release.spec);
    let record = match facts.records.get(&number) {
        None => return Next::Need(Need::Record(number)),
        Some(record) => record.clone(),
    };
    let finished = |status: &SequencedReleaseStatus, mut events: Vec<Note>| {
        let (status, note) = recovery::uninstalled_status(status, number, &facts.now);
        events.push(note);
        let mut records = vec![RecordUpdate {
            revision: number,
            status: HelmStatus::Uninstalled,
            description: "Uninstallation complete".to_string(),
            only_from: None,
            tests: None,
        }];
        // The revision deployed before is no longer deployed either: its objects are gone too.
        records.extend(
            recovery::last_ready_before(&status, number).map(|previous| RecordUpdate {
                revision: previous,
                status: HelmStatus::Superseded,
                description: format!("Uninstalled after revision {number} failed"),
                only_from: Some(HelmStatus::Deployed),
                tests: None,
            }),
        );
        Next::Write(Box::new(Write {
            records,
            requeue: requeue(&settings, &status, None, &facts.now),
            status,
            events,
        }))
    };
    let Some(record) = record else {
        return finished(status, Vec::new());
    };
    let inventory = record.uninstall_inventory();
    let step = step_uninstall(
        facts,
        &inventory,
        record.sequenced,
        &record.hooks,
        record.revision,
        status,
    );
    match step {
        Outcome::Need(wanted) => Next::Need(Need::Observe(wanted)),
        Outcome::Decided(step) if timed_out(facts, &settings).is_some() && !step.finished => {
            Next::Uninstall(Box::new(uninstall::time_out(
                step,
                settings.timeout,
                &facts.now,
            )))
        }
        Outcome::Decided(step)
            if !starting
                && step.finished
                && step.hooks_before.is_empty()
                && step.hooks_after.is_empty() =>
        {
            finished(&step.status, step.events)
        }
        Outcome::Decided(mut step) => {
            if starting {
                let message = format!(
                    "uninstalling the objects of revision {number}, which failed (spec.onFailure: {})",
                    match settings.on_failure {
                        OnFailure::Rollback => "rollback, with no earlier Ready revision",
                        _ => "uninstall",
                    }
                );
                step.events
                    .insert(0, Note::warning(EventReason::UninstallStarted, message));
                step.records.push(RecordUpdate {
                    revision: number,
                    status: HelmStatus::Uninstalling,
                    description: "Deletion in progress".to_string(),
                    only_from: None,
                    tests: None,
                });
            }
            Next::Uninstall(Box::new(step))
        }
    }
}

/// Whether a revision before `number` was Ready, as far as the history tells: a new revision is
/// an upgrade when one was (or when the revision before it was an upgrade itself). A first
/// install and its retries are installs (as Flux retries a failed install), rendered with
/// `.Release.IsInstall` and running the `pre-install`/`post-install` hooks.
pub fn earlier_ready(status: &SequencedReleaseStatus, number: i64) -> bool {
    status
        .history
        .iter()
        .any(|h| h.revision != number && h.phase == ReleasePhase::Ready)
}

fn uninstall(facts: &Facts) -> Next {
    let sr = &facts.release;
    let status = &facts.status;
    let settings = Settings::of(&sr.spec);
    let keep_history = sr.spec.uninstall.as_ref().is_some_and(|u| u.keep_history);
    // Handed back to Helm: nothing of the release is touched, only let go of.
    if sr.spec.deletion_policy == Some(crate::api::DeletionPolicy::Orphan) {
        let me = facts.identity();
        let told = match status.revision {
            Some(n) => format!(
                "handed release {} back to Helm at revision {n} (spec.deletionPolicy: Orphan): its objects and records are left as they are; helm upgrade goes on at revision {}, helm uninstall removes them",
                me.release_name,
                n + 1
            ),
            None => format!(
                "let go of release {} (spec.deletionPolicy: Orphan): it never deployed a revision",
                me.release_name
            ),
        };
        return Next::FinishUninstall {
            events: vec![Note::normal(EventReason::HandedBackToHelm, told)],
            records: Vec::new(),
            delete: Vec::new(),
        };
    }
    // In a namespace being deleted nothing new can be created there (no lease, no hook, no
    // record), and the namespace controller deletes the records itself. A remote release's
    // records and hooks are on its remote cluster, whose namespace is not being deleted: they
    // are uninstalled there as ever (its lease and events, in the namespace being deleted, are
    // left out by the controller).
    let Some(terminating) = facts.namespace_terminating else {
        return Next::Need(Need::Namespace);
    };
    let terminating = terminating && sr.spec.kube_config.is_none();
    let record = match status.revision {
        None => None,
        Some(n) => match facts.records.get(&n) {
            None => return Next::Need(Need::Record(n)),
            Some(record) => record.clone(),
        },
    };
    let finish = |events: Vec<Note>| {
        if terminating {
            return Next::FinishUninstall {
                events,
                records: Vec::new(),
                delete: Vec::new(),
            };
        }
        let Some(revisions) = &facts.revisions else {
            return Next::Need(Need::Revisions);
        };
        let (records, delete) = if keep_history {
            let kept = status.revision.map(|revision| RecordUpdate {
                revision,
                status: HelmStatus::Uninstalled,
                description: "Uninstallation complete".to_string(),
                only_from: None,
                tests: None,
            });
            (kept.into_iter().collect(), Vec::new())
        } else {
            let mut delete: BTreeSet<i64> = revisions.ours.clone();
            delete.extend(status.history.iter().map(|h| h.revision));
            delete.extend(status.revision);
            (Vec::new(), delete.into_iter().collect())
        };
        Next::FinishUninstall {
            events,
            records,
            delete,
        }
    };
    // Without its record: deleted with its namespace (whose objects go with it), what the status
    // kept of the objects outside the namespace is uninstalled; deleted by hand or lost, the
    // objects are looked for by their owner annotation, and the uninstall waits, Stalled, when
    // they cannot all be looked for, rather than leave them behind unsaid.
    let mut missing = None;
    let (mut inventory, sequenced, hooks, revision) = match &record {
        Some(record) => (
            record.uninstall_inventory(),
            record.sequenced,
            record.hooks.as_slice(),
            record.revision,
        ),
        None if !terminating && let Some(n) = status.revision => {
            let found = match &facts.leftovers {
                None => return Next::Need(Need::Leftovers),
                Some(Err(why)) => {
                    let message = format!(
                        "uninstalling: the record of revision {n} is missing, and the release's \
                         objects cannot all be found by their owner annotation {OWNER_ANNOTATION}: \
                         {why}; the uninstall goes on once they can be (or remove the finalizer \
                         {FINALIZER} to leave them)"
                    );
                    return stall_uninstalling(facts, Reason::RecordMissing, &message, &settings);
                }
                Some(Ok(found)) => found,
            };
            let inventory = leftover_inventory(found, &status.inventory, &me_chart(facts));
            let count = inventory
                .steps
                .iter()
                .map(|s| s.objects.len())
                .sum::<usize>();
            missing = Some(Note::warning(
                EventReason::RecordMissing,
                format!(
                    "the record of revision {n} is missing: uninstalling the {count} object{} \
                     found by their owner annotation, in Helm's kind order",
                    if count == 1 { "" } else { "s" }
                ),
            ));
            (inventory, false, &[][..], n)
        }
        None if !status.inventory.is_empty() => (
            Inventory::from_entries(&status.inventory),
            true,
            &[][..],
            status.revision.unwrap_or(0),
        ),
        None => return finish(Vec::new()),
    };
    // Nothing is deleted for a release that may not act (an empty service account name, or
    // none in multi-tenant mode): as which account would it?
    if let Err(message) = account_name(&sr.spec, &facts.accounts) {
        return stall_uninstalling(facts, Reason::InvalidSpec, &message, &settings);
    }
    // Only what was applied is uninstalled: nothing is looked for (as the account, which may
    // have been refused it) that no revision applied.
    let applied = only_applied(&mut inventory, status, revision);
    let hooks = if terminating || !applied {
        &[][..]
    } else {
        hooks
    };
    // The missing record is told once, when the uninstall of what was found starts (none of
    // its steps begun in the status yet).
    let begun = status.layers.iter().any(|layer| {
        layer.phase != LayerPhase::Pending && inventory.steps.iter().any(|s| s.name == layer.name)
    });
    let missing = missing.filter(|_| !begun);
    match step_uninstall(facts, &inventory, sequenced, hooks, revision, status) {
        Outcome::Need(wanted) => Next::Need(Need::Observe(wanted)),
        Outcome::Decided(mut step) if missing.is_some() && !step.finished => {
            step.events.extend(missing);
            Next::Uninstall(Box::new(step))
        }
        Outcome::Decided(step) if timed_out(facts, &settings).is_some() && !step.finished => {
            Next::Uninstall(Box::new(uninstall::time_out(
                step,
                settings.timeout,
                &facts.now,
            )))
        }
        // What the last step's hooks ask (a delete policy) is done first.
        Outcome::Decided(step)
            if step.finished && step.hooks_before.is_empty() && step.hooks_after.is_empty() =>
        {
            finish(step.events)
        }
        Outcome::Decided(mut step) => {
            if terminating {
                step.records.clear();
            }
            Next::Uninstall(Box::new(step))
        }
    }
}

/// Leaves out of `inventory` the objects of the layers no revision applied: a first revision
/// (no other in the history) whose layer never started (Pending, no start time), as a release
/// Stalled `Forbidden`, `InvalidSpec` or on its source leaves them. Once the uninstall has begun,
/// the layers it laid out with no objects are those it left out, and stay so. False when
/// nothing of the release was applied at all (its uninstall hooks are not run either: it is let
/// go at once).
fn only_applied(inventory: &mut Inventory, status: &SequencedReleaseStatus, revision: i64) -> bool {
    let layer = |chart: &str, name: &str| {
        status
            .layers
            .iter()
            .find(|l| l.chart == chart && l.name == name)
    };
    let left_out = |step: &crate::history::InventoryStep| {
        let Some(l) = layer(&step.chart, &step.name) else {
            return false;
        };
        if status.phase == Some(ReleasePhase::Uninstalling) {
            l.resources == 0
        } else {
            status.history.iter().all(|h| h.revision == revision)
                && l.phase == LayerPhase::Pending
                && l.started_at.is_none()
        }
    };
    let mut any = false;
    for step in &mut inventory.steps {
        if left_out(step) {
            step.objects.clear();
        }
        any |= !step.objects.is_empty();
    }
    any
}

/// The chart path the leftovers of a release without a record are told under: its release
/// name (the chart's own is in the lost record).
fn me_chart(facts: &Facts) -> String {
    facts.identity().release_name
}

/// The uninstall of objects found by their owner annotation (and of the objects outside the
/// namespace the status kept): one step per kind, in Helm's uninstall kind order, each after
/// the one before it.
fn leftover_inventory(
    found: &[ObjectKey],
    kept: &[crate::api::InventoryEntry],
    chart: &str,
) -> Inventory {
    let mut objects: Vec<ObjectKey> = found.to_vec();
    for entry in kept {
        let key = ObjectKey {
            api_version: entry.api_version.clone(),
            kind: entry.kind.clone(),
            namespace: entry.namespace.clone(),
            name: entry.name.clone(),
        };
        if !objects.iter().any(|o| o.identity() == key.identity()) {
            objects.push(key);
        }
    }
    objects.sort_by(|a, b| {
        crate::plan::kind_order::compare(
            &a.kind,
            &b.kind,
            crate::plan::kind_order::Direction::Uninstall,
        )
        .then_with(|| a.namespace.cmp(&b.namespace))
        .then_with(|| a.name.cmp(&b.name))
    });
    let mut steps: Vec<crate::history::InventoryStep> = Vec::new();
    for object in objects {
        match steps.last_mut() {
            Some(step) if step.name == object.kind => step.objects.push(object),
            _ => {
                let after = steps.len().checked_sub(1).into_iter().collect();
                steps.push(crate::history::InventoryStep {
                    chart: chart.to_string(),
                    name: object.kind.clone(),
                    objects: vec![object],
                    after,
                });
            }
        }
    }
    Inventory { steps }
}

/// An uninstall that cannot go on until a person acts (the spec changes, or the finalizer is
/// removed on purpose): the release stays Uninstalling, Stalled with `reason`, looked at again
/// within a minute; the first time with this message, an event too.
fn stall_uninstalling(facts: &Facts, reason: Reason, message: &str, settings: &Settings) -> Next {
    let mut status = facts.status.clone();
    status.phase = Some(ReleasePhase::Uninstalling);
    status.message = Some(message.to_string());
    super::status::set_stalled(&mut status, reason, message, &facts.now);
    let event = (facts.status.message.as_deref() != Some(message))
        .then(|| Note::warning(EventReason::Stalled, message.to_string()));
    Next::Stall {
        status,
        event,
        requeue: Requeue::After(FALLBACK_REQUEUE.min(settings.interval)),
    }
}

/// One step of the uninstall of `inventory` (revision `revision`'s, sequenced or not as it
/// was), with its `hooks` (none with `spec.disableHooks`), from `status`.
fn step_uninstall(
    facts: &Facts,
    inventory: &Inventory,
    sequenced: bool,
    hooks: &[crate::history::HookRecord],
    revision: i64,
    status: &SequencedReleaseStatus,
) -> Outcome<UninstallStep> {
    let settings = Settings::of(&facts.release.spec);
    let me = facts.identity();
    let run = format!("{}/{}", me.uid, revision);
    let u = Uninstall {
        inventory,
        sequenced,
        hooks: if settings.disable_hooks { &[] } else { hooks },
        run: &run,
        timeout: settings.timeout,
    };
    uninstall_step(&u, status, &facts.observed, &me, &facts.now)
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
            None if recovery::remediation_due(settings, status) => {
                Requeue::After(Duration::from_millis(100))
            }
            None => Requeue::After(settings.interval),
        },
        _ => {
            let limit = FALLBACK_REQUEUE.min(settings.timeout / 3);
            Requeue::After(requeue_after.map_or(limit, |d| d.min(limit)))
        }
    }
}
