//! One revision of an install or upgrade, stepped through `status.layers`: `(crds)`, the
//! `pre-install` (or `pre-upgrade`) hooks, the plan's layers, `(prune)`, the `post-install` (or
//! `post-upgrade`) hooks. Stages that have nothing to do have no entry.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::hooks::{self, HookAction, HookOutcome, Stage};
use super::status::{
    elapsed, failed, held_back, progressing, remediated_rollback, set_condition_to, set_conditions,
};
use super::{
    ActionFailure, Note, Observations, Outcome, RecordUpdate, Revision, Wanted, external_blocker,
};
use crate::api::{
    CRD_LAYER, ChartArtifact, Claim, CrdPolicy, EventReason, HistoryEntry, Identity, LayerPhase,
    LayerStatus, ObjectKey, Owner, PRUNE_LAYER, Reason, ReleasePhase, SequencedReleaseStatus,
    TEST_EVENT, TEST_SUCCESS, TestPhase, TestStatus, hook_stage,
};
use crate::history::HookRecord;
use crate::readiness::{self, HealthCheck, Rules, Verdict};

/// One thing an install or upgrade does to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum InstallAction {
    /// Create the CRDs that do not exist yet (`spec.crds: Create`: existing CRDs are left as
    /// they are, as Helm does); with `replace` (`CreateReplace`), server-side apply every CRD,
    /// which also updates those that changed. A CRD is never deleted.
    ApplyCrds { replace: bool },
    /// Server-side apply every resource of this plan layer, in order.
    ApplyLayer(usize),
    /// Delete these objects of the previous revision, in order: those that still exist and are
    /// ours.
    Prune(Vec<ObjectKey>),
    /// Create or delete a hook of the stage before the layers (`post: false`) or after them.
    Hook { post: bool, action: HookAction },
    /// Create or delete a Helm test of the `(test)` stage.
    Test(HookAction),
}

/// The outcome of [`step`]: what to do, the status once it is done, and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallStep {
    pub actions: Vec<InstallAction>,
    pub status: SequencedReleaseStatus,
    pub events: Vec<Note>,
    /// When to look again even without an event: the next readiness timeout, or the retry.
    pub requeue_after: Option<Duration>,
    /// The operation is over (Ready or Failed).
    pub finished: bool,
    /// Resources found past their readiness timeout in this step.
    pub timeouts: usize,
    /// The release records whose status changes with this step (the operation ended).
    pub records: Vec<RecordUpdate>,
    /// The layers are applied to correct drift ([`correcting`]): the fields the
    /// ignore rules name keep their live values (`spec.driftDetection.ignore`).
    pub correcting: bool,
}

fn entry(chart: &str, name: &str, resources: usize) -> LayerStatus {
    LayerStatus {
        chart: chart.to_string(),
        name: name.to_string(),
        phase: LayerPhase::Pending,
        resources: i32::try_from(resources).unwrap_or(i32::MAX),
        ..LayerStatus::default()
    }
}

/// The hook events of a revision: `pre-install`/`post-install`, or the upgrade ones.
fn events(revision: &Revision) -> (&'static str, &'static str) {
    if revision.rollback {
        ("pre-rollback", "post-rollback")
    } else if revision.upgrade {
        ("pre-upgrade", "post-upgrade")
    } else {
        ("pre-install", "post-install")
    }
}

/// The hook stages of a revision: before and after the layers (None when no hook runs there).
fn stages<'a>(revision: &Revision<'a>) -> (Option<Stage<'a>>, Option<Stage<'a>>) {
    let (pre, post) = events(revision);
    let timeout = revision.settings.timeout;
    (
        Stage::of(revision.hooks, pre, &revision.run, timeout),
        Stage::of(revision.hooks, post, &revision.run, timeout),
    )
}

/// Whether the revision has a `(crds)` stage: the charts have CRDs, and its CRD policy is not
/// `Skip` (a skipped stage has no entry, rather than one that never starts).
fn has_crd_stage(revision: &Revision) -> bool {
    !revision.plan.crds.is_empty() && revision.crds != CrdPolicy::Skip
}

/// The `status.layers` of a fresh revision: `(crds)`, `(pre-install)`, the plan's layers,
/// `(prune)`, `(post-install)`.
pub fn layout(revision: &Revision) -> Vec<LayerStatus> {
    let plan = revision.plan;
    let (pre, post) = stages(revision);
    let mut layers = Vec::with_capacity(plan.layers.len() + 4);
    if has_crd_stage(revision) {
        layers.push(entry(&plan.chart, CRD_LAYER, plan.crds.len()));
    }
    layers.extend(pre.map(|stage| stage.entry(&plan.chart)));
    layers.extend(
        plan.layers
            .iter()
            .map(|l| entry(&l.chart, &l.name, l.resources.len())),
    );
    if !revision.prune.is_empty() {
        layers.push(entry(&plan.chart, PRUNE_LAYER, revision.prune.len()));
    }
    layers.extend(post.map(|stage| stage.entry(&plan.chart)));
    layers.extend(test_stage(revision).map(|stage| stage.entry(&plan.chart)));
    layers
}

fn same_layout(a: &[LayerStatus], b: &[LayerStatus]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.chart == y.chart && x.name == y.name && x.resources == y.resources)
}

/// Where the stages sit in `status.layers`.
struct Slots {
    crds: Option<usize>,
    pre: Option<usize>,
    main: usize,
    prune: Option<usize>,
    post: Option<usize>,
    test: Option<usize>,
}

/// The revision's `(test)` stage, when it has one with tests to run.
fn test_stage<'r, 'a>(revision: &'r Revision<'a>) -> Option<&'r Stage<'a>> {
    revision.test.as_ref()?.stage.as_ref()
}

fn slots(revision: &Revision) -> Slots {
    let (pre, post) = stages(revision);
    let crds = has_crd_stage(revision).then_some(0);
    let pre = pre.map(|_| usize::from(crds.is_some()));
    let main = usize::from(crds.is_some()) + usize::from(pre.is_some());
    let after = main + revision.plan.layers.len();
    let prune = (!revision.prune.is_empty()).then_some(after);
    let post = post.map(|_| after + usize::from(prune.is_some()));
    let test = test_stage(revision)
        .map(|_| after + usize::from(prune.is_some()) + usize::from(post.is_some()));
    Slots {
        crds,
        pre,
        main,
        prune,
        post,
        test,
    }
}

/// The entry in `status.layers` of an action.
fn slot_of(revision: &Revision, action: &InstallAction) -> usize {
    let s = slots(revision);
    match action {
        InstallAction::ApplyCrds { .. } => s.crds.unwrap_or(0),
        InstallAction::ApplyLayer(i) => s.main + i,
        InstallAction::Prune(_) => s.main + revision.plan.layers.len(),
        InstallAction::Hook { post: false, .. } => s.pre.unwrap_or(0),
        InstallAction::Hook { post: true, .. } => s.post.unwrap_or(0),
        InstallAction::Test(_) => s.test.unwrap_or(0),
    }
}

/// What a revision that [`begin`] started deploys of a fetched chart: its digests, in
/// `status.chart` and its history entry. A chart directory has none.
pub fn with_artifact(status: &mut SequencedReleaseStatus, artifact: Option<&ChartArtifact>) {
    status.chart = artifact.cloned();
    // What the source serves now is what this revision deploys.
    status
        .conditions
        .retain(|c| c.type_ != crate::api::CHART_CHANGED);
    if let Some(entry) = status.history.first_mut() {
        entry.chart_digest = artifact.map(|a| a.digest.clone());
    }
}

/// Starts revision `number`: every entry Pending, a new history entry, Reconciling.
pub fn begin(
    revision: &Revision,
    number: i64,
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    digest: &str,
    chart_version: Option<&str>,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    // A retry keeps counting; a changed spec or chart starts again.
    if status.observed_generation != generation
        || status.last_applied_digest.as_deref() != Some(digest)
    {
        status.failures = None;
    }
    status.revision = Some(number);
    status.observed_generation = generation;
    status.last_applied_digest = Some(digest.to_string());
    status.phase = Some(ReleasePhase::Deploying);
    status.layers = layout(revision);
    // The tests of the revision before are not this one's.
    status.tests.clear();
    status.conditions.retain(|c| c.type_ != TEST_SUCCESS);
    let message = match chart_version {
        Some(version) => format!("deploying revision {number} (chart version {version})"),
        None => format!("deploying revision {number}"),
    };
    status.message = Some(message.clone());
    status.progress = Some(progress(revision, &status.layers));
    // An operation cut short by a new revision ends here: superseded, not failed (its record
    // says the same).
    if let Some(previous) = status.history.first_mut()
        && previous.finished_at.is_none()
    {
        previous.phase = ReleasePhase::Superseded;
        previous.finished_at = Some(now.clone());
    }
    status.history.insert(
        0,
        HistoryEntry {
            revision: number,
            chart_version: chart_version.map(str::to_string),
            digest: Some(digest.to_string()),
            chart_digest: None,
            phase: ReleasePhase::Deploying,
            started_at: Some(now.clone()),
            finished_at: None,
            sequenced: revision.settings.sequenced,
            description: None,
        },
    );
    if revision.settings.max_history > 0 {
        status.history.truncate(revision.settings.max_history);
    }
    progressing(&mut status, Reason::Progressing, &message, now);
    status
}

/// Starts correcting the drift of a Ready revision: the plan layers in `layers` are applied
/// again (Pending), the layers that depend on them, directly or not, are checked again
/// (Waiting) without being applied, the rest stays Ready. The revision is Deploying again; its
/// history entry and record are kept.
pub fn correct(
    revision: &Revision,
    status: &SequencedReleaseStatus,
    layers: &BTreeSet<usize>,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let plan = revision.plan;
    let mut st = status.clone();
    let fresh = layout(revision);
    let mut apply = layers.clone();
    if !same_layout(&st.layers, &fresh) {
        // Not the layout of this revision (an older operator's status): apply every layer.
        st.layers = fresh;
        apply = (0..plan.layers.len()).collect();
    }
    // The layers that depend on a re-applied one, until none more is found.
    let mut recheck = BTreeSet::new();
    let mut grew = true;
    while grew {
        grew = false;
        for j in 0..plan.layers.len() {
            if apply.contains(&j) || recheck.contains(&j) {
                continue;
            }
            let on = |i: &usize| apply.contains(i) || recheck.contains(i);
            let resources_on = plan.must_be_ready(j).into_iter().any(|r| {
                plan.layers
                    .iter()
                    .position(|l| l.resources.contains(&r))
                    .is_some_and(|i| on(&i))
            });
            if plan.must_be_applied(j).iter().any(on) || resources_on {
                recheck.insert(j);
                grew = true;
            }
        }
    }
    let s = slots(revision);
    for (i, layer) in st.layers[s.main..s.main + plan.layers.len()]
        .iter_mut()
        .enumerate()
    {
        if apply.contains(&i) {
            layer.phase = LayerPhase::Pending;
            layer.ready = 0;
            layer.started_at = None;
            layer.finished_at = None;
            layer.message = None;
        } else if recheck.contains(&i) {
            layer.phase = LayerPhase::Waiting;
            layer.started_at = Some(now.clone());
            layer.finished_at = None;
            layer.message = None;
        }
    }
    st.phase = Some(if revision.rollback {
        ReleasePhase::RollingBack
    } else {
        ReleasePhase::Deploying
    });
    st.progress = Some(progress(revision, &st.layers));
    st.message = Some(message.to_string());
    progressing(&mut st, Reason::Drifted, message, now);
    st
}

/// Whether the revision in `status` is being applied again to correct its drift (what
/// `drift::judge` started with [`correct`]): the last correction recorded is of the revision
/// `status.revision`. An upgrade or a rollback is a new revision, so it is not: ignore rules say
/// what drift detection leaves alone, and an upgrade applies the chart as it is, as in Flux.
pub fn correcting(status: &SequencedReleaseStatus) -> bool {
    status
        .last_drift_correction
        .as_ref()
        .is_some_and(|c| Some(c.revision) == status.revision)
}

/// Ready main layers out of all of them: `3/5`.
fn progress(revision: &Revision, layers: &[LayerStatus]) -> String {
    let s = slots(revision);
    let main = layers
        .get(s.main..s.main + revision.plan.layers.len())
        .unwrap_or(&[]);
    let ready = main.iter().filter(|l| l.phase == LayerPhase::Ready).count();
    format!("{ready}/{}", revision.plan.layers.len())
}

/// Resources whose readiness counts: all of them with `wait`, else those something waits on.
fn checked_resources(revision: &Revision) -> Option<BTreeSet<usize>> {
    if revision.settings.wait {
        return None;
    }
    let plan = revision.plan;
    let mut needed = BTreeSet::new();
    for layer in 0..plan.layers.len() {
        needed.extend(plan.must_be_ready(layer));
    }
    Some(needed)
}

/// What [`step`] needs to see first, given the status: the objects of the layers waited on, the
/// external dependencies of the layers still pending, the prune objects being deleted.
pub fn wanted(revision: &Revision, status: &SequencedReleaseStatus) -> Wanted {
    let mut wanted = Wanted::default();
    let over = matches!(
        status.phase,
        Some(ReleasePhase::Ready | ReleasePhase::Failed)
    );
    if over || !same_layout(&status.layers, &layout(revision)) {
        return wanted;
    }
    let s = slots(revision);
    let plan = revision.plan;
    if let Some(c) = s.crds {
        wanted.crds = match status.layers[c].phase {
            LayerPhase::Waiting => true,
            // Whose the CRDs are, before they are updated.
            LayerPhase::Pending | LayerPhase::Applying => revision.crds == CrdPolicy::CreateReplace,
            _ => false,
        };
    }
    let checked = checked_resources(revision);
    for (i, layer) in plan.layers.iter().enumerate() {
        match status.layers[s.main + i].phase {
            LayerPhase::Waiting => wanted.resources.extend(
                layer
                    .resources
                    .iter()
                    .filter(|r| checked.as_ref().is_none_or(|c| c.contains(r))),
            ),
            LayerPhase::Pending if revision.settings.sequenced => {
                wanted
                    .external
                    .extend((0..layer.external.len()).map(|e| (i, e)));
            }
            _ => {}
        }
    }
    if let Some(p) = s.prune
        && status.layers[p].phase == LayerPhase::Deleting
    {
        wanted.present.extend(revision.prune.iter().cloned());
    }
    let (pre, post) = stages(revision);
    for (stage, slot) in [(pre, s.pre), (post, s.post)] {
        if let (Some(stage), Some(slot)) = (stage, slot) {
            stage.wanted(&status.layers[slot], &mut wanted);
        }
    }
    if let (Some(stage), Some(slot)) = (test_stage(revision), s.test) {
        stage.wanted(&status.layers[slot], &mut wanted);
    }
    wanted
}

/// Steps the hook stage at `slot` of `st` (started unless Ready or Failed), adding its actions
/// and events; [`Outcome::Need`] with what must be observed first.
#[allow(clippy::too_many_arguments)]
fn step_hooks(
    stage: &Stage,
    post: bool,
    slot: usize,
    st: &mut SequencedReleaseStatus,
    revision: &Revision,
    observed: &Observations,
    now: &Time,
    progress: &mut Progress,
) -> Outcome<()> {
    if matches!(
        st.layers[slot].phase,
        LayerPhase::Ready | LayerPhase::Failed
    ) {
        return Outcome::Decided(());
    }
    let mut entry = st.layers[slot].clone();
    let out = match hooks::step(stage, &mut entry, observed, revision.me, now) {
        Outcome::Need(wanted) => return Outcome::Need(wanted),
        Outcome::Decided(out) => out,
    };
    st.layers[slot] = entry;
    progress.actions.extend(
        out.actions
            .into_iter()
            .map(|action| InstallAction::Hook { post, action }),
    );
    progress.events.extend(out.events);
    progress.requeue_after = min_duration(progress.requeue_after, out.requeue_after);
    if let Some(failure) = out.failure {
        progress.failure.get_or_insert(failure);
    }
    Outcome::Decided(())
}

/// What a step has decided so far.
#[derive(Default)]
struct Progress {
    actions: Vec<InstallAction>,
    events: Vec<Note>,
    requeue_after: Option<Duration>,
    failure: Option<(Reason, String)>,
}

fn verdict_of(
    object: Option<&Option<Value>>,
    (rules, health): (&Rules, Option<&HealthCheck>),
    waited: Option<Duration>,
    default_timeout: Duration,
    name: impl FnOnce() -> String,
) -> Verdict {
    match object {
        Some(Some(object)) => readiness::check_with(object, rules, health, waited, default_timeout),
        _ => {
            let reason = format!("{}: not found", name());
            match waited {
                Some(w) if w >= rules.effective_timeout(default_timeout) => {
                    Verdict::Failed(format!(
                        "readiness timeout after {}: {reason}",
                        readiness::format_duration(rules.effective_timeout(default_timeout))
                    ))
                }
                _ => Verdict::InProgress(reason),
            }
        }
    }
}

fn rules_of(object: &Value) -> Rules {
    // The planner refused objects with bad rules, so this cannot fail for planned objects.
    Rules::from_object(object).unwrap_or_default()
}

/// How a set of resources fares: how many are ready, the first that blocks, a failure, and
/// when the next timeout falls.
#[derive(Default)]
struct Tally {
    ready: usize,
    timeouts: usize,
    blocking: Option<String>,
    failed: Option<String>,
    next_timeout: Option<Duration>,
}

impl Tally {
    fn add(
        &mut self,
        verdict: Verdict,
        rules: &Rules,
        waited: Option<Duration>,
        default: Duration,
    ) {
        match verdict {
            Verdict::Ready => self.ready += 1,
            Verdict::Failed(reason) => {
                if reason.starts_with("readiness timeout") {
                    self.timeouts += 1;
                }
                self.failed.get_or_insert(reason);
            }
            Verdict::InProgress(reason) => {
                self.blocking.get_or_insert(reason);
                if let Some(waited) = waited {
                    let left = rules.effective_timeout(default).saturating_sub(waited);
                    let left = left.max(Duration::from_secs(1));
                    self.next_timeout = Some(self.next_timeout.map_or(left, |t| t.min(left)));
                }
            }
        }
    }
}

fn min_duration(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(super) fn layer_label(layer: &LayerStatus) -> String {
    format!("{} of chart {}", layer.name, layer.chart)
}

/// One step of an install or upgrade that [`begin`] started: judge the layers waited on, run
/// the hooks before the layers, start every layer whose prerequisites hold, prune, run the hooks
/// after them. Before a layer starts, the objects it writes must have been observed
/// ([`Outcome::Need`]); an object that belongs to someone else fails the step before anything
/// is written.
pub fn step(
    revision: &Revision,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    now: &Time,
) -> Outcome<InstallStep> {
    let plan = revision.plan;
    let settings = revision.settings;
    let correcting = correcting(status);
    let mut st = status.clone();
    let mut p = Progress::default();
    let fresh = layout(revision);
    if !same_layout(&st.layers, &fresh) {
        st.layers = fresh;
    }
    if matches!(st.phase, Some(ReleasePhase::Ready | ReleasePhase::Failed)) {
        return Outcome::Decided(InstallStep {
            actions: Vec::new(),
            status: st,
            events: Vec::new(),
            requeue_after: None,
            finished: true,
            timeouts: 0,
            records: Vec::new(),
            correcting,
        });
    }
    let s = slots(revision);
    let (pre, post) = stages(revision);
    let timeout = settings.readiness_timeout;
    let mut timeouts = 0;
    // Tests that failed before this step were told then: ignored, run on request, or the
    // failure of an operation that ended. A drift correction of the revision does not run
    // them again, nor fail on them.
    let tests_failed_before = s
        .test
        .is_some_and(|i| st.layers[i].phase == LayerPhase::Failed);
    let done = |st: &SequencedReleaseStatus, slot: Option<usize>| {
        slot.is_none_or(|i| st.layers[i].phase == LayerPhase::Ready)
    };

    // Stage 1: CRDs.
    if let Some(c) = s.crds {
        match st.layers[c].phase {
            LayerPhase::Pending | LayerPhase::Applying => {
                let replace = revision.crds == CrdPolicy::CreateReplace;
                if replace && (0..plan.crds.len()).any(|i| !observed.crds.contains_key(&i)) {
                    return Outcome::Need(Wanted {
                        crds: true,
                        ..Wanted::default()
                    });
                }
                match crd_refusal(revision, observed).filter(|_| replace) {
                    // Updating a CRD of someone else: refused before any CRD is written.
                    Some(message) => {
                        let layer = &mut st.layers[c];
                        layer.phase = LayerPhase::Failed;
                        layer.finished_at = Some(now.clone());
                        layer.message = Some(message.clone());
                        p.events
                            .push(Note::warning(EventReason::LayerFailed, message.clone()));
                        p.failure = Some((Reason::OwnershipConflict, message));
                    }
                    None => {
                        p.actions.push(InstallAction::ApplyCrds { replace });
                        start(&mut st.layers[c], now, &mut p.events);
                    }
                }
            }
            LayerPhase::Waiting => {
                let waited = observed
                    .outages
                    .waited(st.layers[c].started_at.as_ref(), now);
                let mut tally = Tally::default();
                for (i, crd) in plan.crds.iter().enumerate() {
                    let rules = rules_of(&crd.object);
                    let verdict = verdict_of(
                        observed.crds.get(&i),
                        (&rules, None),
                        waited,
                        timeout,
                        || format!("CustomResourceDefinition {}", crd.name),
                    );
                    tally.add(verdict, &rules, waited, timeout);
                }
                p.requeue_after = min_duration(p.requeue_after, tally.next_timeout);
                timeouts += tally.timeouts;
                settle(&mut st.layers[c], tally, now, &mut p.events, &mut p.failure);
            }
            _ => {}
        }
    }
    let crds_done = done(&st, s.crds);

    // Stage 2: the hooks before the layers, one at a time.
    if let (Some(stage), Some(slot)) = (&pre, s.pre)
        && crds_done
        && p.failure.is_none()
        && let Outcome::Need(wanted) =
            step_hooks(stage, false, slot, &mut st, revision, observed, now, &mut p)
    {
        return Outcome::Need(wanted);
    }
    let pre_done = crds_done && done(&st, s.pre);

    // Stage 3: the layers. First judge those that were applied.
    let checked = checked_resources(revision);
    let mut ready_now = vec![false; plan.resources.len()];
    for (i, layer) in plan.layers.iter().enumerate() {
        let slot = s.main + i;
        match st.layers[slot].phase {
            LayerPhase::Ready => {
                for &r in &layer.resources {
                    if let Some(flag) = ready_now.get_mut(r) {
                        *flag = true;
                    }
                }
            }
            LayerPhase::Waiting => {
                let waited = observed
                    .outages
                    .waited(st.layers[slot].started_at.as_ref(), now);
                let mut tally = Tally::default();
                for &r in &layer.resources {
                    let Some(resource) = plan.resources.get(r) else {
                        continue;
                    };
                    if checked.as_ref().is_some_and(|c| !c.contains(&r)) {
                        tally.ready += 1;
                        continue;
                    }
                    let rules = revision.rules(r, &resource.object);
                    let health = revision.health_check(resource.group(), &resource.kind);
                    let verdict = verdict_of(
                        observed.resources.get(&r),
                        (&rules, health),
                        waited,
                        timeout,
                        || format!("{} {}", resource.kind, resource.name),
                    );
                    if verdict.is_ready()
                        && let Some(flag) = ready_now.get_mut(r)
                    {
                        *flag = true;
                    }
                    tally.add(verdict, &rules, waited, timeout);
                }
                p.requeue_after = min_duration(p.requeue_after, tally.next_timeout);
                timeouts += tally.timeouts;
                settle(
                    &mut st.layers[slot],
                    tally,
                    now,
                    &mut p.events,
                    &mut p.failure,
                );
            }
            _ => {}
        }
    }
    // What a refusal of the objects about to be written goes back to.
    let judged = (st.clone(), p.events.len());

    // Then start every layer whose prerequisites hold, until none more can start.
    if p.failure.is_none() && pre_done {
        let mut started = true;
        while started {
            started = false;
            for i in 0..plan.layers.len() {
                let slot = s.main + i;
                if !matches!(
                    st.layers[slot].phase,
                    LayerPhase::Pending | LayerPhase::Applying
                ) {
                    continue;
                }
                let blocker = if settings.sequenced {
                    blocked_by(revision, i, &st.layers, s.main, &ready_now, observed)
                } else {
                    None
                };
                match blocker {
                    None => {
                        p.actions.push(InstallAction::ApplyLayer(i));
                        start(&mut st.layers[slot], now, &mut p.events);
                        started = true;
                    }
                    Some(reason) => st.layers[slot].message = Some(reason),
                }
            }
        }
    }

    let main_ready = pre_done
        && st.layers[s.main..s.main + plan.layers.len()]
            .iter()
            .all(|l| l.phase == LayerPhase::Ready);

    // Stage 4: prune.
    if let Some(i) = s.prune
        && p.failure.is_none()
        && main_ready
    {
        match st.layers[i].phase {
            LayerPhase::Pending | LayerPhase::Applying => {
                p.actions.push(InstallAction::Prune(Vec::new()));
                st.layers[i].phase = LayerPhase::Deleting;
                st.layers[i].started_at = Some(now.clone());
                p.events.push(Note::normal(
                    EventReason::PruneStarted,
                    format!(
                        "Deleting {} objects the previous revision had",
                        revision.prune.len()
                    ),
                ));
            }
            LayerPhase::Deleting => {
                settle_deletion(
                    &mut st.layers[i],
                    revision.prune,
                    observed,
                    revision.me,
                    now,
                );
            }
            _ => {}
        }
    }
    let pruned = main_ready
        && s.prune
            .is_none_or(|i| st.layers[i].phase == LayerPhase::Deleted);

    // Stage 5: the hooks after the layers.
    if let (Some(stage), Some(slot)) = (&post, s.post)
        && pruned
        && p.failure.is_none()
        && let Outcome::Need(wanted) =
            step_hooks(stage, true, slot, &mut st, revision, observed, now, &mut p)
    {
        return Outcome::Need(wanted);
    }
    let post_done = pruned && done(&st, s.post);

    // Stage 6: the Helm tests, once everything else is done.
    if let (Some(stage), Some(slot)) = (test_stage(revision), s.test)
        && post_done
        && p.failure.is_none()
        && let Outcome::Need(wanted) =
            step_tests(stage, slot, &mut st, revision, observed, now, &mut p)
    {
        return Outcome::Need(wanted);
    }
    let ignored = revision
        .test
        .as_ref()
        .is_some_and(|t| t.ignore_failures || t.on_demand.is_some());
    let tests_done = post_done
        && s.test.is_none_or(|i| {
            st.layers[i].phase == LayerPhase::Ready
                || (st.layers[i].phase == LayerPhase::Failed && (ignored || tests_failed_before))
        });

    // Before anything is written: whose are the objects about to be written or deleted?
    let unseen = unseen(revision, &p.actions, observed);
    if !unseen.is_empty() {
        return Outcome::Need(unseen);
    }
    if let Some((i, message)) = refusal(revision, &p.actions, observed) {
        let (mut st, kept) = judged;
        let mut events = p.events;
        events.truncate(kept);
        let slot = s.main + i;
        st.layers[slot].phase = LayerPhase::Failed;
        st.layers[slot].message = Some(message.clone());
        st.progress = Some(progress(revision, &st.layers));
        let generation = st.observed_generation;
        let (st, retry) = failed(
            &st,
            generation,
            Reason::OwnershipConflict,
            &message,
            settings.retries,
            now,
        );
        events.push(Note::warning(EventReason::LayerFailed, message));
        // The hooks before the layers are done; what their delete policies ask still happens.
        let actions = p
            .actions
            .into_iter()
            .filter(|a| matches!(a, InstallAction::Hook { post: false, .. }))
            .collect();
        return Outcome::Decided(InstallStep {
            actions,
            status: st,
            events,
            requeue_after: retry,
            finished: true,
            timeouts,
            records: Vec::new(),
            correcting,
        });
    }
    for action in &mut p.actions {
        if let InstallAction::Prune(keys) = action {
            *keys = revision
                .prune
                .iter()
                .filter(|k| observed.ours(k, revision.me))
                .cloned()
                .collect();
        }
    }

    st.progress = Some(progress(revision, &st.layers));
    let mut requeue_after = p.requeue_after;
    let finished;
    if let Some((reason, message)) = p.failure {
        finished = true;
        st.phase = Some(ReleasePhase::Failed);
        st.message = Some(message.clone());
        let generation = st.observed_generation;
        let (mut failed, retry) = failed(&st, generation, reason, &message, settings.retries, now);
        failed.progress = st.progress.clone();
        st = failed;
        requeue_after = retry;
    } else if tests_done {
        finished = true;
        st.phase = Some(ReleasePhase::Ready);
        st.failures = None;
        let number = st.revision.unwrap_or(0);
        let version = st
            .history
            .first()
            .filter(|h| Some(h.revision) == st.revision)
            .and_then(|h| h.chart_version.as_deref())
            .map(|v| format!(" (chart version {v})"))
            .unwrap_or_default();
        let ran: usize = [&pre, &post]
            .iter()
            .filter_map(|stage| stage.as_ref().map(|s| s.order.len()))
            .sum();
        let hooks = if ran > 0 {
            format!(", {ran} hooks")
        } else {
            String::new()
        };
        let mut message = format!(
            "revision {number}{version} is ready: {} layers, {} resources{hooks}",
            plan.layers.len(),
            plan.resources.len()
        );
        if let Some(tests) = tests_told(revision, &mut st, now) {
            message.push_str("; ");
            message.push_str(&tests);
        }
        match st.rollback.as_ref() {
            // A drift correction of a revision `spec.onFailure` rolled back to: the spec is
            // still held back.
            Some(rollback) if correcting && remediated_rollback(&st, number) => {
                message.push_str(&format!(
                    "; rolled back to revision {} after a failed revision (spec.onFailure): spec generation {} not applied",
                    rollback.to,
                    rollback.generation.unwrap_or_default()
                ));
                st.message = Some(message.clone());
                held_back(&mut st, &message, now);
            }
            _ => {
                st.message = Some(message.clone());
                set_conditions(
                    &mut st,
                    Reason::Succeeded,
                    now,
                    [(true, &message), (false, ""), (false, "")],
                );
            }
        }
        if let Some(current) = st.history.first_mut()
            && current.finished_at.is_none()
        {
            current.phase = ReleasePhase::Ready;
            current.finished_at = Some(now.clone());
        }
        // A test run on request ends with its own event (TestSucceeded, TestFailed).
        if status.phase != Some(ReleasePhase::Testing) {
            p.events
                .push(Note::normal(EventReason::ReleaseReady, message));
        }
    } else {
        finished = false;
        st.phase = Some(if status.phase == Some(ReleasePhase::Testing) {
            ReleasePhase::Testing
        } else if revision.rollback {
            ReleasePhase::RollingBack
        } else {
            ReleasePhase::Deploying
        });
        let message = st
            .layers
            .iter()
            .find(|l| {
                matches!(
                    l.phase,
                    LayerPhase::Waiting | LayerPhase::Deleting | LayerPhase::CleaningUp
                ) || (is_hook_stage(l) && l.phase == LayerPhase::Applying && l.message.is_some())
            })
            // Nothing at work: a layer that cannot start says why (an external dependency).
            .or_else(|| {
                st.layers
                    .iter()
                    .find(|l| l.phase == LayerPhase::Pending && l.message.is_some())
            })
            .map(|l| match &l.message {
                Some(m) if is_hook_stage(l) => {
                    format!(
                        "{} hooks: {m}",
                        l.name.trim_matches(|c| c == '(' || c == ')')
                    )
                }
                Some(m) => format!("layer {}: {m}", layer_label(l)),
                None => format!("layer {}: applied", layer_label(l)),
            })
            .unwrap_or_else(|| {
                let doing = if revision.rollback {
                    "rolling back, revision"
                } else {
                    "deploying revision"
                };
                format!("{doing} {}", st.revision.unwrap_or(0))
            });
        st.message = Some(message.clone());
        progressing(&mut st, Reason::Progressing, &message, now);
    }
    Outcome::Decided(InstallStep {
        actions: p.actions,
        status: st,
        events: super::fold_ready(p.events),
        requeue_after,
        finished,
        timeouts,
        records: Vec::new(),
        correcting,
    })
}

/// Whether a `status.layers` entry is a hook stage: `(pre-install)`, ..., `(test)`.
pub(super) fn is_hook_stage(layer: &LayerStatus) -> bool {
    layer.name.starts_with("(pre-")
        || layer.name.starts_with("(post-")
        || layer.name == hook_stage(TEST_EVENT)
}

/// Steps the `(test)` stage at `slot` of `st` (started unless Ready or Failed) as any hook
/// stage, and tells each test's outcome in `status.tests` and the run's in the `TestSuccess`
/// condition and a `TestSucceeded` or `TestFailed` event. A failed test fails the revision
/// unless the run ignores failures (`spec.test.ignoreFailures`, a run on request).
fn step_tests(
    stage: &Stage,
    slot: usize,
    st: &mut SequencedReleaseStatus,
    revision: &Revision,
    observed: &Observations,
    now: &Time,
    progress: &mut Progress,
) -> Outcome<()> {
    let phase = st.layers[slot].phase;
    if matches!(phase, LayerPhase::Ready | LayerPhase::Failed) {
        return Outcome::Decided(());
    }
    let mut entry = st.layers[slot].clone();
    let out = match hooks::step(stage, &mut entry, observed, revision.me, now) {
        Outcome::Need(wanted) => return Outcome::Need(wanted),
        Outcome::Decided(out) => out,
    };
    let number = st.revision.unwrap_or(0);
    if phase == LayerPhase::Pending {
        st.tests.clear();
        let count = stage.order.len();
        let message = format!(
            "revision {number}: running {count} test{}",
            if count == 1 { "" } else { "s" }
        );
        set_test_success(st, None, Reason::Progressing, &message, now);
    }
    st.layers[slot] = entry;
    progress
        .actions
        .extend(out.actions.into_iter().map(InstallAction::Test));
    progress.events.extend(out.events);
    progress.requeue_after = min_duration(progress.requeue_after, out.requeue_after);
    for (hook, outcome) in out.outcomes {
        if let Some(hook) = stage.hooks.get(hook) {
            record_test(st, hook, outcome, now);
        }
    }
    match st.layers[slot].phase {
        LayerPhase::Ready => {
            let count = stage.order.len();
            let message = format!(
                "revision {number}: {count} test{} succeeded",
                if count == 1 { "" } else { "s" }
            );
            set_test_success(st, Some(true), Reason::TestSucceeded, &message, now);
            progress
                .events
                .push(Note::normal(EventReason::TestSucceeded, message));
        }
        LayerPhase::Failed => {
            let why = out
                .failure
                .map(|(_, message)| message)
                .or_else(|| st.layers[slot].message.clone())
                .unwrap_or_else(|| "a test failed".to_string());
            // A test still running failed with the stage (its time ran out, say).
            for test in st.tests.iter_mut() {
                if test.phase == TestPhase::Running {
                    test.phase = TestPhase::Failed;
                    test.finished_at = Some(now.clone());
                    test.message = Some(why.clone());
                }
            }
            let ignored = revision
                .test
                .as_ref()
                .is_some_and(|t| t.ignore_failures || t.on_demand.is_some());
            let message = format!("revision {number}: {why}");
            set_test_success(st, Some(false), Reason::TestFailed, &message, now);
            progress
                .events
                .push(Note::warning(EventReason::TestFailed, message.clone()));
            if !ignored {
                progress.failure.get_or_insert((Reason::TestFailed, why));
            }
        }
        _ => {}
    }
    Outcome::Decided(())
}

/// Sets the `TestSuccess` condition: True, False, or Unknown (`None`) while the tests run.
fn set_test_success(
    st: &mut SequencedReleaseStatus,
    value: Option<bool>,
    reason: Reason,
    message: &str,
    now: &Time,
) {
    let generation = st.observed_generation;
    set_condition_to(
        &mut st.conditions,
        TEST_SUCCESS,
        value,
        reason,
        message,
        generation,
        now,
    );
}

/// What became of one test, in `status.tests`.
fn record_test(
    st: &mut SequencedReleaseStatus,
    hook: &HookRecord,
    outcome: HookOutcome,
    now: &Time,
) {
    let at = st.tests.iter().position(|t| t.name == hook.key.name);
    if let HookOutcome::Started = outcome {
        let test = TestStatus {
            name: hook.key.name.clone(),
            kind: hook.key.kind.clone(),
            phase: TestPhase::Running,
            started_at: Some(now.clone()),
            ..TestStatus::default()
        };
        match at {
            Some(i) => st.tests[i] = test,
            None => st.tests.push(test),
        }
        return;
    }
    let Some(test) = at.and_then(|i| st.tests.get_mut(i)) else {
        return;
    };
    test.finished_at = Some(now.clone());
    test.duration = elapsed(test.started_at.as_ref(), now).map(readiness::format_duration);
    match outcome {
        HookOutcome::Failed(message) => {
            test.phase = TestPhase::Failed;
            test.message = Some(message);
        }
        _ => test.phase = TestPhase::Succeeded,
    }
}

/// What the Ready message says of the revision's tests (`2 tests succeeded`, `test
/// Pod/shop-test failed (spec.test.ignoreFailures)`), None when it ran none; a revision that
/// tests a chart without tests says so in `TestSuccess`.
fn tests_told(revision: &Revision, st: &mut SequencedReleaseStatus, now: &Time) -> Option<String> {
    let test = revision.test.as_ref()?;
    if test.stage.is_none() {
        let message = format!("revision {}: no tests to run", st.revision.unwrap_or(0));
        set_test_success(st, Some(true), Reason::TestSucceeded, &message, now);
        return None;
    }
    let failed: Vec<String> = st
        .tests
        .iter()
        .filter(|t| t.phase == TestPhase::Failed)
        .map(|t| format!("{}/{}", t.kind, t.name))
        .collect();
    if failed.is_empty() {
        let count = st.tests.len();
        return Some(format!(
            "{count} test{} succeeded",
            if count == 1 { "" } else { "s" }
        ));
    }
    let why = if test.on_demand.is_some() {
        "run on request"
    } else {
        "spec.test.ignoreFailures"
    };
    Some(format!("test {} failed ({why})", failed.join(", ")))
}

/// The objects the actions write or delete that have not been looked at.
fn unseen(revision: &Revision, actions: &[InstallAction], observed: &Observations) -> Wanted {
    let mut wanted = Wanted::default();
    for action in actions {
        match action {
            InstallAction::ApplyLayer(i) => {
                let layer = revision.plan.layers.get(*i).map(|l| l.resources.as_slice());
                wanted.resources.extend(
                    layer
                        .unwrap_or_default()
                        .iter()
                        .filter(|r| !observed.resources.contains_key(r)),
                );
            }
            InstallAction::Prune(_) => wanted.present.extend(
                revision
                    .prune
                    .iter()
                    .filter(|k| !observed.present.contains_key(*k))
                    .cloned(),
            ),
            InstallAction::ApplyCrds { .. }
            | InstallAction::Hook { .. }
            | InstallAction::Test(_) => {}
        }
    }
    wanted
}

/// The first CRD of the charts that exists and belongs to another release, and why it is not
/// updated. A CRD of no release (created by `helm install` from `crds/`, which marks none, or
/// by hand) is ours to update: `spec.crds: CreateReplace` asks for exactly that.
fn crd_refusal(revision: &Revision, observed: &Observations) -> Option<String> {
    revision.plan.crds.iter().enumerate().find_map(|(i, crd)| {
        let object = observed.crds.get(&i)?.as_ref()?;
        match Claim::of(object).judge(revision.me) {
            Owner::Us | Owner::Nobody => None,
            // An owner that no longer exists holds it: a CRD kept after an uninstall is taken.
            Owner::Other(other) if observed.gone.contains(&other) => None,
            Owner::Other(other) => Some(format!(
                "CustomResourceDefinition {} (chart {}, {}) belongs to {other}; it is left alone (spec.crds: CreateReplace updates only CRDs of this release or of none)",
                crd.name, crd.chart, crd.template
            )),
        }
    })
}

/// The first object of a starting layer that is not ours to write: its layer and why.
fn refusal(
    revision: &Revision,
    actions: &[InstallAction],
    observed: &Observations,
) -> Option<(usize, String)> {
    actions.iter().find_map(|action| {
        let InstallAction::ApplyLayer(i) = action else {
            return None;
        };
        let layer = revision.plan.layers.get(*i)?;
        layer.resources.iter().find_map(|&r| {
            let object = observed.resources.get(&r)?.as_ref()?;
            let resource = revision.plan.resources.get(r)?;
            let key = revision.keys.get(r)?;
            let whose = match Claim::of(object).judge(revision.me) {
                Owner::Us => return None,
                Owner::Nobody if revision.settings.adopt => return None,
                Owner::Nobody => "exists and belongs to no release; it is left alone (set spec.adopt: true to take it over)".to_string(),
                // Its owner is gone (an orphan): a CRD the chart carries is taken over, as Helm
                // and Flux treat `crds/`; any other object with the opt-in.
                Owner::Other(other) if observed.gone.contains(&other) => {
                    if resource.kind == "CustomResourceDefinition" || revision.settings.adopt {
                        return None;
                    }
                    format!(
                        "belongs to {other}, which no longer exists; it is left alone (set spec.adopt: true to take it over)"
                    )
                }
                Owner::Other(other) => format!("belongs to {other}; it is left alone"),
            };
            Some((
                *i,
                format!(
                    "{key} (chart {}, {}) {whose}",
                    resource.chart, resource.template
                ),
            ))
        })
    })
}

/// Action `done` of `step` failed: the status names the layer and the object, the layers of
/// the actions after it were not reached (back to Pending), and a refusal fails the operation
/// (retried `spec.retries` times), while a transient error only says what failed, the layer
/// keeping the start time it had `before` the step (it did not start: tried again, the same
/// failure writes the same status, so that the retry is not woken at once by its own write).
/// Returns the status, the events and, for a refusal, when to retry.
pub fn fail_action(
    revision: &Revision,
    before: &SequencedReleaseStatus,
    step: &InstallStep,
    done: usize,
    failure: &ActionFailure,
    now: &Time,
) -> (SequencedReleaseStatus, Vec<Note>, Option<Duration>) {
    let mut status = step.status.clone();
    let action = step.actions.get(done);
    let slot = action.map(|a| slot_of(revision, a));
    if let Some(layer) = slot.and_then(|slot| status.layers.get_mut(slot)) {
        if failure.transient {
            layer.phase = LayerPhase::Applying;
            layer.started_at = slot
                .and_then(|slot| before.layers.get(slot))
                .filter(|l| l.name == layer.name && l.chart == layer.chart)
                .and_then(|l| l.started_at.clone());
        } else {
            layer.phase = LayerPhase::Failed;
        }
        layer.message = Some(failure.message.clone());
    }
    unreached(revision, step, done + 1, &mut status);
    if failure.transient {
        status.message = Some(failure.message.clone());
        return (status, Vec::new(), None);
    }
    let generation = status.observed_generation;
    let (status, retry) = failed(
        &status,
        generation,
        failure.reason,
        &failure.message,
        revision.settings.retries,
        now,
    );
    let reason = match action {
        Some(InstallAction::Hook { .. } | InstallAction::Test(_)) => EventReason::HookFailed,
        _ => EventReason::LayerFailed,
    };
    let event = Note::warning(reason, failure.message.clone());
    (status, vec![event], retry)
}

/// The operation ran past `spec.timeout` (`timeout`) without finishing: the step's actions are
/// dropped, the stages still at work are Failed, and the revision fails with reason `Timeout`,
/// naming what it still waited for. A layer the step was about to start (`before` is the
/// status the step came from) was not started: it is Pending again, and the message says so
/// rather than calling it applied; what it waited for is then the stage that became ready too
/// late. A hook still running has failed, as Helm's hook timeout fails it: the delete policies
/// of its stage are carried out (`hook-failed` on it, then `hook-succeeded` on the hooks before
/// it), at once. A step that finished (Ready or Failed) is kept as it is.
pub fn time_out(
    revision: &Revision,
    before: &SequencedReleaseStatus,
    step: InstallStep,
    timeout: Duration,
    now: &Time,
) -> InstallStep {
    if step.finished {
        return step;
    }
    let mut st = step.status.clone();
    // What the step was about to start did not start.
    let mut not_started = Vec::new();
    for action in &step.actions {
        if matches!(action, InstallAction::Hook { .. } | InstallAction::Test(_)) {
            continue;
        }
        let slot = slot_of(revision, action);
        let (Some(layer), Some(was)) = (st.layers.get_mut(slot), before.layers.get(slot)) else {
            continue;
        };
        if matches!(was.phase, LayerPhase::Pending) && !not_started.contains(&slot) {
            *layer = was.clone();
            not_started.push(slot);
        }
    }
    // What waits on a stage that did not start says what it said before.
    for (layer, was) in st.layers.iter_mut().zip(&before.layers) {
        if layer.phase == LayerPhase::Pending && was.name == layer.name {
            layer.message.clone_from(&was.message);
        }
    }
    let waiting = waited_for(before, &st, &not_started);
    let started = not_started
        .iter()
        .filter_map(|&slot| st.layers.get(slot))
        .map(|l| {
            if is_hook_stage(l) {
                format!("{} hooks", l.name.trim_matches(|c| c == '(' || c == ')'))
            } else {
                format!("layer {}", layer_label(l))
            }
        })
        .collect::<Vec<_>>();
    let after = format!(
        "timed out after {} (spec.timeout)",
        readiness::format_duration(timeout)
    );
    let not = match started.len() {
        0 => String::new(),
        1 => format!("{} was not started", started[0]),
        _ => format!("{} were not started", started.join(", ")),
    };
    let message = match (waiting, not.is_empty()) {
        (Some(waiting), true) => format!("{after}, still waiting for {waiting}"),
        (Some(waiting), false) => format!("{after}, still waiting for {waiting}; {not}"),
        (None, false) => format!("{after}: {not}"),
        (None, true) => format!(
            "{after}, still waiting for revision {}",
            st.revision.unwrap_or(0)
        ),
    };
    let mut actions = Vec::new();
    let (pre, post) = stages(revision);
    let s = slots(revision);
    if let (Some(stage), Some(slot)) = (test_stage(revision), s.test)
        && let Some(entry) = st.layers.get(slot)
        && entry.phase == LayerPhase::Waiting
    {
        actions.extend(
            stage
                .clean_up(entry)
                .into_iter()
                .map(|hook| InstallAction::Test(HookAction::Delete { hook })),
        );
    }
    for (stage, slot, post) in [(pre, s.pre, false), (post, s.post, true)] {
        if let (Some(stage), Some(slot)) = (stage, slot)
            && let Some(entry) = st.layers.get(slot)
            && entry.phase == LayerPhase::Waiting
        {
            actions.extend(
                stage
                    .clean_up(entry)
                    .into_iter()
                    .map(|hook| InstallAction::Hook {
                        post,
                        action: HookAction::Delete { hook },
                    }),
            );
        }
    }
    for layer in &mut st.layers {
        if matches!(
            layer.phase,
            LayerPhase::Applying
                | LayerPhase::Waiting
                | LayerPhase::Deleting
                | LayerPhase::CleaningUp
        ) {
            layer.phase = LayerPhase::Failed;
            layer.finished_at = Some(now.clone());
        }
    }
    let generation = st.observed_generation;
    let (st, retry) = failed(
        &st,
        generation,
        Reason::Timeout,
        &message,
        revision.settings.retries,
        now,
    );
    InstallStep {
        actions,
        status: st,
        events: vec![Note::warning(EventReason::LayerFailed, message)],
        requeue_after: retry,
        finished: true,
        timeouts: step.timeouts,
        records: Vec::new(),
        correcting: step.correcting,
    }
}

/// The controller stopped before action `done` of `step`: the status keeps what was done, and
/// the layers not reached go back to Pending.
pub fn cut_short(revision: &Revision, step: &InstallStep, done: usize) -> SequencedReleaseStatus {
    let mut status = step.status.clone();
    unreached(revision, step, done, &mut status);
    status
}

/// The layers of the step's actions from `from` on were not reached: back to Pending. A hook
/// stage keeps the hooks it has done: its running hook is created (or its earlier object
/// deleted) again.
/// What a timed-out step really waited for: the stages still at work (with what each waits
/// on), else those the step came from that became ready only now, else a stage that cannot
/// start and says why (an external dependency). `skip`: the slots of stages that were not
/// started.
fn waited_for(
    before: &SequencedReleaseStatus,
    st: &SequencedReleaseStatus,
    skip: &[usize],
) -> Option<String> {
    let at_work = |l: &LayerStatus| {
        matches!(
            l.phase,
            LayerPhase::Applying
                | LayerPhase::Waiting
                | LayerPhase::Deleting
                | LayerPhase::CleaningUp
        )
    };
    let told = |l: &LayerStatus, what: Option<&str>| {
        let name = if is_hook_stage(l) {
            format!("{} hooks", l.name.trim_matches(|c| c == '(' || c == ')'))
        } else {
            format!("layer {}", layer_label(l))
        };
        match what {
            Some(what) => format!("{name}: {what}"),
            None => name,
        }
    };
    let working: Vec<String> = st
        .layers
        .iter()
        .enumerate()
        .filter(|(i, l)| !skip.contains(i) && at_work(l))
        .map(|(_, l)| told(l, Some(l.message.as_deref().unwrap_or("not ready yet"))))
        .collect();
    if !working.is_empty() {
        return Some(working.join("; "));
    }
    let late: Vec<String> = before
        .layers
        .iter()
        .zip(&st.layers)
        .filter(|(was, now)| at_work(was) && now.phase == LayerPhase::Ready)
        .map(|(was, _)| format!("{}, ready only after the timeout", told(was, None)))
        .collect();
    if !late.is_empty() {
        return Some(late.join("; "));
    }
    st.layers
        .iter()
        .find(|l| l.phase == LayerPhase::Pending && l.message.is_some())
        .map(|l| told(l, l.message.as_deref()))
}

fn unreached(
    revision: &Revision,
    step: &InstallStep,
    from: usize,
    status: &mut SequencedReleaseStatus,
) {
    for action in step.actions.iter().skip(from) {
        if let Some(layer) = status.layers.get_mut(slot_of(revision, action))
            && matches!(layer.phase, LayerPhase::Waiting | LayerPhase::Deleting)
        {
            if matches!(action, InstallAction::Hook { .. } | InstallAction::Test(_)) {
                layer.phase = LayerPhase::Applying;
            } else {
                layer.phase = LayerPhase::Pending;
                layer.started_at = None;
            }
        }
    }
}

fn start(layer: &mut LayerStatus, now: &Time, events: &mut Vec<Note>) {
    layer.phase = LayerPhase::Waiting;
    layer.started_at = Some(now.clone());
    layer.finished_at = None;
    layer.ready = 0;
    layer.message = None;
    events.push(Note::normal(
        EventReason::LayerStarted,
        format!(
            "Applying layer {} ({} resources)",
            layer_label(layer),
            layer.resources
        ),
    ));
}

fn settle(
    layer: &mut LayerStatus,
    tally: Tally,
    now: &Time,
    events: &mut Vec<Note>,
    failure: &mut Option<(Reason, String)>,
) {
    layer.ready = i32::try_from(tally.ready).unwrap_or(i32::MAX);
    if let Some(reason) = tally.failed {
        layer.phase = LayerPhase::Failed;
        layer.finished_at = Some(now.clone());
        layer.message = Some(reason.clone());
        let message = format!("layer {} failed: {reason}", layer_label(layer));
        events.push(Note::warning(EventReason::LayerFailed, message.clone()));
        failure.get_or_insert((Reason::ReadinessFailed, message));
    } else if let Some(reason) = tally.blocking {
        layer.message = Some(format!("waiting for {reason}"));
    } else {
        layer.phase = LayerPhase::Ready;
        layer.finished_at = Some(now.clone());
        layer.message = None;
        events.push(Note::normal(
            EventReason::LayerReady,
            format!(
                "Layer {} is ready ({} resources)",
                layer_label(layer),
                layer.resources
            ),
        ));
    }
}

/// Counts the deleted objects of a Deleting entry; true (and Deleted) once none is left. The
/// entry's message names the first object left, and the finalizers that hold it when it is
/// being deleted (an uninstall does not hang silently on a finalizer nobody removes).
pub(super) fn settle_deletion(
    layer: &mut LayerStatus,
    objects: &[ObjectKey],
    observed: &Observations,
    me: &Identity,
    now: &Time,
) -> bool {
    let mut remaining = objects.iter().filter(|k| observed.ours(k, me));
    let first = remaining.next();
    let count = first.map_or(0, |_| 1 + remaining.count());
    layer.ready = i32::try_from(objects.len() - count).unwrap_or(0);
    match first {
        None => {
            layer.phase = LayerPhase::Deleted;
            layer.finished_at = Some(now.clone());
            layer.message = None;
            true
        }
        Some(first) => {
            let held = observed
                .present
                .get(first)
                .and_then(Option::as_ref)
                .map(|claim| claim.deleting_with.as_slice())
                .unwrap_or_default();
            layer.message = Some(if held.is_empty() {
                format!("waiting for {first} to be deleted")
            } else {
                format!(
                    "waiting for {first} to be deleted: it is held by finalizer {}, which its controller has not removed",
                    held.join(", ")
                )
            });
            false
        }
    }
}

/// Why plan layer `i` cannot start yet, or None when it can.
fn blocked_by(
    revision: &Revision,
    i: usize,
    layers: &[LayerStatus],
    main: usize,
    ready_now: &[bool],
    observed: &Observations,
) -> Option<String> {
    let plan = revision.plan;
    for d in plan.must_be_applied(i) {
        let status = layers.get(main + d)?;
        if !matches!(status.phase, LayerPhase::Waiting | LayerPhase::Ready) {
            return Some(format!("waiting for layer {}", layer_label(status)));
        }
    }
    for r in plan.must_be_ready(i) {
        if !ready_now.get(r).copied().unwrap_or(false) {
            let resource = plan.resources.get(r)?;
            return Some(format!(
                "waiting for {} {} (chart {}) to be ready",
                resource.kind, resource.name, resource.chart
            ));
        }
    }
    let layer = plan.layers.get(i)?;
    for (e, external) in layer.external.iter().enumerate() {
        let seen = observed.external.get(&(i, e)).and_then(Option::as_ref);
        if let Some(reason) = external_blocker(external, seen) {
            return Some(reason);
        }
    }
    None
}
