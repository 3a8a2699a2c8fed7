//! The per-release state machine. Pure: from the plan of the current revision, the status the
//! controller wrote last time and what it observed now, decide the next step. No I/O and no
//! clock: the time comes in as an argument.
//!
//! A revision walks these entries of `status.layers`, in order:
//! - `(crds)`: the CRDs of every chart's `crds/` directory, created and waited on until
//!   Established (only when the chart has CRDs);
//! - every layer of the plan: a layer starts when the layers and charts it depends on are ready
//!   (or, for KOTS phases, applied) and its external dependencies are ready; layers with no
//!   relation start together;
//! - `(prune)`: the objects of the previous revision that this one no longer renders, deleted in
//!   the reverse order of that revision's plan (only when there are any).
//!
//! An uninstall walks the uninstall steps of the revision's inventory the same way.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

use crate::api::v1alpha1::{
    HistoryEntry, LayerPhase, LayerStatus, ReleasePhase, SequencedReleaseStatus,
};
use crate::history::{Inventory, ObjectKey};
use crate::plan::Plan;
use crate::readiness::{self, Rules, Verdict};

/// The `status.layers` entry of the CRD stage.
pub const CRD_LAYER: &str = "(crds)";
/// The `status.layers` entry of the prune stage.
pub const PRUNE_LAYER: &str = "(prune)";

/// Condition types, with kstatus meanings.
pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";

/// What the spec says about how to deploy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// `sequencing: ordered`; false applies everything at once.
    pub sequenced: bool,
    /// `wait`: every resource must be ready, not only those something waits on.
    pub wait: bool,
    /// `readinessTimeout`, unless a resource says otherwise.
    pub readiness_timeout: Duration,
    /// `maxHistory` (0 keeps every entry).
    pub max_history: usize,
    /// `retries`: how many times a failed operation is tried again.
    pub retries: u32,
}

/// What the current revision deploys.
#[derive(Debug, Clone, Copy)]
pub struct Revision<'a> {
    pub plan: &'a Plan,
    /// Objects of the previous revision to delete at the end, in delete order.
    pub prune: &'a [ObjectKey],
    pub settings: Settings,
}

/// What the controller read from the cluster for this step. A key that is missing was not
/// looked at; `None` means the object does not exist.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    /// By index into [`Plan::crds`].
    pub crds: HashMap<usize, Option<Value>>,
    /// By index into [`Plan::resources`].
    pub resources: HashMap<usize, Option<Value>>,
    /// By (layer, index into its `external`).
    pub external: HashMap<(usize, usize), Option<Value>>,
    /// Whether each object to be deleted still exists.
    pub exists: HashMap<ObjectKey, bool>,
}

/// What the controller must read before [`step`] can decide.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub crds: bool,
    pub resources: BTreeSet<usize>,
    pub external: Vec<(usize, usize)>,
    pub exists: Vec<ObjectKey>,
}

impl Wanted {
    pub fn is_empty(&self) -> bool {
        !self.crds
            && self.resources.is_empty()
            && self.external.is_empty()
            && self.exists.is_empty()
    }
}

/// One thing to do to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create the CRDs that do not exist yet (existing CRDs are left as they are, as Helm does).
    ApplyCrds,
    /// Server-side apply every resource of this plan layer, in order.
    ApplyLayer(usize),
    /// Delete the prune objects, in order.
    Prune,
    /// Delete the objects of this inventory step, in order.
    DeleteStep(usize),
}

/// A Kubernetes Event to record on the SequencedRelease.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Note {
    fn normal(reason: &'static str, message: String) -> Note {
        Note {
            warning: false,
            reason,
            message,
        }
    }

    fn warning(reason: &'static str, message: String) -> Note {
        Note {
            warning: true,
            reason,
            message,
        }
    }
}

/// The outcome of [`step`]: what to do, the status once it is done, and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub status: SequencedReleaseStatus,
    pub events: Vec<Note>,
    /// When to look again even without an event: the next readiness timeout.
    pub requeue_after: Option<Duration>,
    /// The operation is over (Ready, Failed, or an uninstall finished).
    pub finished: bool,
    /// Resources found past their readiness timeout in this step.
    pub timeouts: usize,
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

/// The `status.layers` of a fresh revision: `(crds)`, the plan's layers, `(prune)`.
pub fn layout(revision: &Revision) -> Vec<LayerStatus> {
    let plan = revision.plan;
    let mut layers = Vec::with_capacity(plan.layers.len() + 2);
    if !plan.crds.is_empty() {
        layers.push(entry(&plan.chart, CRD_LAYER, plan.crds.len()));
    }
    layers.extend(
        plan.layers
            .iter()
            .map(|l| entry(&l.chart, &l.name, l.resources.len())),
    );
    if !revision.prune.is_empty() {
        layers.push(entry(&plan.chart, PRUNE_LAYER, revision.prune.len()));
    }
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
    main: usize,
    prune: Option<usize>,
}

fn slots(revision: &Revision) -> Slots {
    let crds = (!revision.plan.crds.is_empty()).then_some(0);
    let main = usize::from(crds.is_some());
    let prune = (!revision.prune.is_empty()).then_some(main + revision.plan.layers.len());
    Slots { crds, main, prune }
}

/// A timestamp the API server keeps as it is: whole seconds.
pub fn seconds(now: Time) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(now.0.as_second()).unwrap_or(now.0))
}

fn elapsed(since: Option<&Time>, now: &Time) -> Option<Duration> {
    let since = since?;
    let d = now.0.duration_since(since.0);
    Some(Duration::try_from(d).unwrap_or(Duration::ZERO))
}

/// Sets condition `type_`, keeping its transition time when its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    let condition = Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time: transition,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = condition,
        None => conditions.push(condition),
    }
}

/// Sets Ready, Reconciling and Stalled at once, each `(status, message)`, all with `reason`.
fn set_conditions(
    status: &mut SequencedReleaseStatus,
    reason: &str,
    now: &Time,
    [ready, reconciling, stalled]: [(bool, &str); 3],
) {
    let generation = status.observed_generation;
    for (type_, (value, message)) in [
        (READY, ready),
        (RECONCILING, reconciling),
        (STALLED, stalled),
    ] {
        set_condition(
            &mut status.conditions,
            type_,
            value,
            reason,
            message,
            generation,
            now,
        );
    }
}

/// The three conditions for a release that is making progress (`reason` says how).
pub fn progressing(status: &mut SequencedReleaseStatus, reason: &str, message: &str, now: &Time) {
    set_conditions(
        status,
        reason,
        now,
        [(false, message), (true, message), (false, "")],
    );
}

/// A release that cannot go on until something changes: phase Failed, Stalled with `reason`.
pub fn stalled(
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    status.observed_generation = generation;
    status.phase = Some(ReleasePhase::Failed);
    status.message = Some(message.to_string());
    set_conditions(
        &mut status,
        reason,
        now,
        [(false, message), (false, ""), (true, message)],
    );
    if let Some(current) = status.history.first_mut()
        && Some(current.revision) == status.revision
        && current.finished_at.is_none()
    {
        current.phase = ReleasePhase::Failed;
        current.finished_at = Some(now.clone());
    }
    status
}

/// The delay before retry `n` (from 1): 5 s, doubling up to 5 min.
pub fn retry_delay(n: u32) -> Duration {
    let exponent = n.saturating_sub(1).min(16);
    Duration::from_secs(5)
        .saturating_mul(1 << exponent)
        .min(Duration::from_secs(300))
}

/// An operation failed (`reason`, `message`): phase Failed, and one more consecutive failure.
/// While `retries` are left the release is Reconciling with a retry scheduled, and the delay
/// before it is returned; otherwise it is Stalled until the spec changes.
pub fn failed(
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    retries: u32,
    now: &Time,
) -> (SequencedReleaseStatus, Option<Duration>) {
    let mut status = stalled(status, generation, reason, message, now);
    let failures = status.failures.unwrap_or(0).saturating_add(1);
    status.failures = Some(failures);
    let n = u32::try_from(failures).unwrap_or(u32::MAX);
    if n > retries {
        return (status, None);
    }
    let delay = retry_delay(n);
    let retrying = format!("{message}; retry {n} of {retries} in {}s", delay.as_secs());
    status.message = Some(retrying.clone());
    let generation = status.observed_generation;
    set_condition(
        &mut status.conditions,
        READY,
        false,
        reason,
        &retrying,
        generation,
        now,
    );
    set_condition(
        &mut status.conditions,
        RECONCILING,
        true,
        "RetryScheduled",
        &retrying,
        generation,
        now,
    );
    set_condition(
        &mut status.conditions,
        STALLED,
        false,
        reason,
        "",
        generation,
        now,
    );
    (status, Some(delay))
}

/// For a Failed release with retries left: how long until the next retry is due (zero when it
/// is due now). None when no retry is scheduled.
pub fn retry_due(status: &SequencedReleaseStatus, retries: u32, now: &Time) -> Option<Duration> {
    if status.phase != Some(ReleasePhase::Failed) {
        return None;
    }
    let n = u32::try_from(status.failures?).ok()?;
    if n == 0 || n > retries {
        return None;
    }
    let failed_at = status
        .history
        .first()
        .filter(|h| Some(h.revision) == status.revision)
        .and_then(|h| h.finished_at.as_ref());
    let waited = elapsed(failed_at, now).unwrap_or(Duration::MAX);
    Some(retry_delay(n).saturating_sub(waited))
}

/// The controller stopped (SIGTERM) in the middle of an operation: Reconciling with reason
/// `Interrupted`; the next controller resumes from the layers' phases.
pub fn interrupted(
    status: &SequencedReleaseStatus,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    status.message = Some(message.to_string());
    status.lock = None;
    progressing(&mut status, "Interrupted", message, now);
    status
}

/// A release waiting for something outside it (another release, a lock): phase Pending.
pub fn pending(
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    reason: &str,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    status.observed_generation = generation;
    status.phase = Some(ReleasePhase::Pending);
    status.message = Some(message.to_string());
    progressing(&mut status, reason, message, now);
    status
}

/// Starts a new revision: every entry Pending, a new history entry, Reconciling.
pub fn begin(
    revision: &Revision,
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
    let number = status.revision.unwrap_or(0) + 1;
    status.revision = Some(number);
    status.observed_generation = generation;
    status.last_applied_digest = Some(digest.to_string());
    status.phase = Some(ReleasePhase::Deploying);
    status.layers = layout(revision);
    let message = format!("deploying revision {number}");
    status.message = Some(message.clone());
    status.progress = Some(progress(revision, &status.layers));
    // An operation cut short by a new revision ends here.
    if let Some(previous) = status.history.first_mut()
        && previous.finished_at.is_none()
    {
        previous.phase = ReleasePhase::Failed;
        previous.finished_at = Some(now.clone());
    }
    status.history.insert(
        0,
        HistoryEntry {
            revision: number,
            chart_version: chart_version.map(str::to_string),
            digest: Some(digest.to_string()),
            phase: ReleasePhase::Deploying,
            started_at: Some(now.clone()),
            finished_at: None,
            sequenced: revision.settings.sequenced,
        },
    );
    if revision.settings.max_history > 0 {
        status.history.truncate(revision.settings.max_history);
    }
    progressing(&mut status, "Progressing", &message, now);
    status
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

/// What [`step`] needs to see, given the status.
pub fn wanted(revision: &Revision, status: &SequencedReleaseStatus) -> Wanted {
    let mut wanted = Wanted::default();
    if !same_layout(&status.layers, &layout(revision)) {
        return wanted;
    }
    let s = slots(revision);
    let plan = revision.plan;
    if let Some(c) = s.crds
        && status.layers[c].phase == LayerPhase::Waiting
    {
        wanted.crds = true;
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
        wanted.exists.extend(revision.prune.iter().cloned());
    }
    wanted
}

fn verdict_of(
    object: Option<&Option<Value>>,
    rules: &Rules,
    waited: Option<Duration>,
    default_timeout: Duration,
    name: impl FnOnce() -> String,
) -> Verdict {
    match object {
        Some(Some(object)) => readiness::check(object, rules, waited, default_timeout),
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

fn layer_label(layer: &LayerStatus) -> String {
    format!("{} of chart {}", layer.name, layer.chart)
}

/// One step of an install or upgrade that [`begin`] started.
pub fn step(
    revision: &Revision,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    now: &Time,
) -> Decision {
    let plan = revision.plan;
    let settings = revision.settings;
    let mut st = status.clone();
    let mut actions = Vec::new();
    let mut events = Vec::new();
    let mut requeue_after = None;
    let fresh = layout(revision);
    if !same_layout(&st.layers, &fresh) {
        st.layers = fresh;
    }
    if matches!(st.phase, Some(ReleasePhase::Ready | ReleasePhase::Failed)) {
        return Decision {
            actions,
            status: st,
            events,
            requeue_after,
            finished: true,
            timeouts: 0,
        };
    }
    let s = slots(revision);
    let timeout = settings.readiness_timeout;
    let mut failure: Option<String> = None;
    let mut timeouts = 0;

    // Stage 1: CRDs.
    if let Some(c) = s.crds {
        match st.layers[c].phase {
            LayerPhase::Pending | LayerPhase::Applying => {
                actions.push(Action::ApplyCrds);
                start(&mut st.layers[c], now, &mut events);
            }
            LayerPhase::Waiting => {
                let waited = elapsed(st.layers[c].started_at.as_ref(), now);
                let mut tally = Tally::default();
                for (i, crd) in plan.crds.iter().enumerate() {
                    let rules = rules_of(&crd.object);
                    let verdict =
                        verdict_of(observed.crds.get(&i), &rules, waited, timeout, || {
                            format!("CustomResourceDefinition {}", crd.name)
                        });
                    tally.add(verdict, &rules, waited, timeout);
                }
                requeue_after = min_duration(requeue_after, tally.next_timeout);
                timeouts += tally.timeouts;
                settle(&mut st.layers[c], tally, now, &mut events, &mut failure);
            }
            _ => {}
        }
    }
    let crds_done = s
        .crds
        .is_none_or(|c| st.layers[c].phase == LayerPhase::Ready);

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
                let waited = elapsed(st.layers[slot].started_at.as_ref(), now);
                let mut tally = Tally::default();
                for &r in &layer.resources {
                    let Some(resource) = plan.resources.get(r) else {
                        continue;
                    };
                    if checked.as_ref().is_some_and(|c| !c.contains(&r)) {
                        tally.ready += 1;
                        continue;
                    }
                    let rules = rules_of(&resource.object);
                    let verdict =
                        verdict_of(observed.resources.get(&r), &rules, waited, timeout, || {
                            format!("{} {}", resource.kind, resource.name)
                        });
                    if verdict.is_ready()
                        && let Some(flag) = ready_now.get_mut(r)
                    {
                        *flag = true;
                    }
                    tally.add(verdict, &rules, waited, timeout);
                }
                requeue_after = min_duration(requeue_after, tally.next_timeout);
                timeouts += tally.timeouts;
                settle(&mut st.layers[slot], tally, now, &mut events, &mut failure);
            }
            _ => {}
        }
    }

    // Then start every layer whose prerequisites hold, until none more can start.
    if failure.is_none() && crds_done {
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
                        actions.push(Action::ApplyLayer(i));
                        start(&mut st.layers[slot], now, &mut events);
                        started = true;
                    }
                    Some(reason) => st.layers[slot].message = Some(reason),
                }
            }
        }
    }

    let main_ready = st.layers[s.main..s.main + plan.layers.len()]
        .iter()
        .all(|l| l.phase == LayerPhase::Ready);

    // Stage 4: prune.
    let mut pruned = true;
    if let Some(p) = s.prune
        && failure.is_none()
    {
        pruned = st.layers[p].phase == LayerPhase::Deleted;
        if main_ready && crds_done {
            match st.layers[p].phase {
                LayerPhase::Pending | LayerPhase::Applying => {
                    actions.push(Action::Prune);
                    st.layers[p].phase = LayerPhase::Deleting;
                    st.layers[p].started_at = Some(now.clone());
                    events.push(Note::normal(
                        "PruneStarted",
                        format!(
                            "Deleting {} objects the previous revision had",
                            revision.prune.len()
                        ),
                    ));
                }
                LayerPhase::Deleting => {
                    pruned = settle_deletion(&mut st.layers[p], revision.prune, observed, now);
                }
                _ => {}
            }
        }
    }

    st.progress = Some(progress(revision, &st.layers));
    let finished;
    if let Some(reason) = failure {
        finished = true;
        st.phase = Some(ReleasePhase::Failed);
        st.message = Some(reason.clone());
        let generation = st.observed_generation;
        let (mut failed, retry) = self::failed(
            &st,
            generation,
            "ReadinessFailed",
            &reason,
            settings.retries,
            now,
        );
        failed.progress = st.progress.clone();
        st = failed;
        requeue_after = retry;
    } else if crds_done && main_ready && pruned {
        finished = true;
        st.phase = Some(ReleasePhase::Ready);
        st.failures = None;
        let number = st.revision.unwrap_or(0);
        let message = format!(
            "revision {number} is ready: {} layers, {} resources",
            plan.layers.len(),
            plan.resources.len()
        );
        st.message = Some(message.clone());
        set_conditions(
            &mut st,
            "Succeeded",
            now,
            [(true, &message), (false, ""), (false, "")],
        );
        if let Some(current) = st.history.first_mut()
            && current.finished_at.is_none()
        {
            current.phase = ReleasePhase::Ready;
            current.finished_at = Some(now.clone());
        }
        events.push(Note::normal("ReleaseReady", message));
    } else {
        finished = false;
        st.phase = Some(ReleasePhase::Deploying);
        let message = st
            .layers
            .iter()
            .find(|l| matches!(l.phase, LayerPhase::Waiting | LayerPhase::Deleting))
            .map(|l| match &l.message {
                Some(m) => format!("layer {}: {m}", layer_label(l)),
                None => format!("layer {}: applied", layer_label(l)),
            })
            .unwrap_or_else(|| format!("deploying revision {}", st.revision.unwrap_or(0)));
        st.message = Some(message.clone());
        progressing(&mut st, "Progressing", &message, now);
    }
    Decision {
        actions,
        status: st,
        events,
        requeue_after,
        finished,
        timeouts,
    }
}

fn start(layer: &mut LayerStatus, now: &Time, events: &mut Vec<Note>) {
    layer.phase = LayerPhase::Waiting;
    layer.started_at = Some(now.clone());
    layer.finished_at = None;
    layer.ready = 0;
    layer.message = None;
    events.push(Note::normal(
        "LayerStarted",
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
    failure: &mut Option<String>,
) {
    layer.ready = i32::try_from(tally.ready).unwrap_or(i32::MAX);
    if let Some(reason) = tally.failed {
        layer.phase = LayerPhase::Failed;
        layer.finished_at = Some(now.clone());
        layer.message = Some(reason.clone());
        let message = format!("layer {} failed: {reason}", layer_label(layer));
        events.push(Note::warning("LayerFailed", message.clone()));
        failure.get_or_insert(message);
    } else if let Some(reason) = tally.blocking {
        layer.message = Some(format!("waiting for {reason}"));
    } else {
        layer.phase = LayerPhase::Ready;
        layer.finished_at = Some(now.clone());
        layer.message = None;
        events.push(Note::normal(
            "LayerReady",
            format!(
                "Layer {} is ready ({} resources)",
                layer_label(layer),
                layer.resources
            ),
        ));
    }
}

/// Counts the deleted objects of a Deleting entry; true (and Deleted) once none is left.
fn settle_deletion(
    layer: &mut LayerStatus,
    objects: &[ObjectKey],
    observed: &Observations,
    now: &Time,
) -> bool {
    let mut left = objects
        .iter()
        .filter(|k| observed.exists.get(*k).copied().unwrap_or(true));
    let first = left.next();
    let remaining = first.map_or(0, |_| 1 + left.count());
    layer.ready = i32::try_from(objects.len() - remaining).unwrap_or(0);
    match first {
        None => {
            layer.phase = LayerPhase::Deleted;
            layer.finished_at = Some(now.clone());
            layer.message = None;
            true
        }
        Some(first) => {
            layer.message = Some(format!("waiting for {first} to be deleted"));
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
        let kind = match &external.group {
            Some(g) if !g.is_empty() => format!("{}.{g}", external.kind),
            _ => external.kind.clone(),
        };
        let name = match &external.namespace {
            Some(ns) => format!("{ns}/{}", external.name),
            None => external.name.clone(),
        };
        let verdict = match observed.external.get(&(i, e)) {
            Some(Some(object)) => readiness::check(object, &Rules::default(), None, Duration::MAX),
            _ => Verdict::InProgress(format!("{kind} {name}: not found")),
        };
        if let Some(reason) = verdict.reason().filter(|_| !verdict.is_ready()) {
            return Some(format!(
                "waiting for external dependency {kind} {name}: {reason}"
            ));
        }
    }
    None
}

/// Starts an uninstall of `inventory`: every step Pending.
pub fn begin_uninstall(
    inventory: &Inventory,
    status: &SequencedReleaseStatus,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    status.phase = Some(ReleasePhase::Uninstalling);
    status.layers = inventory
        .steps
        .iter()
        .map(|s| entry(&s.chart, &s.name, s.objects.len()))
        .collect();
    let message = "uninstalling".to_string();
    status.message = Some(message.clone());
    progressing(&mut status, "Uninstalling", &message, now);
    status
}

fn uninstall_layout_matches(inventory: &Inventory, status: &SequencedReleaseStatus) -> bool {
    status.phase == Some(ReleasePhase::Uninstalling)
        && status.layers.len() == inventory.steps.len()
        && status
            .layers
            .iter()
            .zip(&inventory.steps)
            .all(|(l, s)| l.chart == s.chart && l.name == s.name)
}

/// What [`uninstall_step`] needs to see: whether the objects of the steps being deleted exist.
pub fn wanted_for_uninstall(inventory: &Inventory, status: &SequencedReleaseStatus) -> Wanted {
    let mut wanted = Wanted::default();
    if !uninstall_layout_matches(inventory, status) {
        return wanted;
    }
    for (layer, step) in status.layers.iter().zip(&inventory.steps) {
        if layer.phase == LayerPhase::Deleting {
            wanted.exists.extend(step.objects.iter().cloned());
        }
    }
    wanted
}

/// One step of an uninstall: delete each step once the steps it comes after are gone, and wait
/// until its objects have disappeared. `sequenced: false` deletes everything at once.
pub fn uninstall_step(
    inventory: &Inventory,
    sequenced: bool,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    now: &Time,
) -> Decision {
    let mut st = if uninstall_layout_matches(inventory, status) {
        status.clone()
    } else {
        begin_uninstall(inventory, status, now)
    };
    let mut actions = Vec::new();
    let mut events = Vec::new();
    for (i, step) in inventory.steps.iter().enumerate() {
        if st.layers[i].phase != LayerPhase::Deleting {
            continue;
        }
        if settle_deletion(&mut st.layers[i], &step.objects, observed, now) {
            let message = format!("Layer {} is deleted", layer_label(&st.layers[i]));
            events.push(Note::normal("LayerDeleted", message));
        }
    }
    for (i, step) in inventory.steps.iter().enumerate() {
        if st.layers[i].phase != LayerPhase::Pending {
            continue;
        }
        let blocker = step.after.iter().filter(|_| sequenced).find(|&&a| {
            st.layers
                .get(a)
                .is_some_and(|l| l.phase != LayerPhase::Deleted)
        });
        match blocker {
            None => {
                actions.push(Action::DeleteStep(i));
                let layer = &mut st.layers[i];
                layer.phase = LayerPhase::Deleting;
                layer.started_at = Some(now.clone());
                layer.message = None;
                events.push(Note::normal(
                    "LayerDeleting",
                    format!(
                        "Deleting layer {} ({} resources)",
                        layer_label(layer),
                        layer.resources
                    ),
                ));
            }
            Some(&a) => {
                let label = layer_label(&st.layers[a]);
                st.layers[i].message = Some(format!("waiting for layer {label} to be deleted"));
            }
        }
    }
    let finished = st.layers.iter().all(|l| l.phase == LayerPhase::Deleted);
    let deleting = |l: &&LayerStatus| l.phase == LayerPhase::Deleting;
    // The layer that waits on an object names it; a layer that just started says less.
    let message = match st
        .layers
        .iter()
        .filter(deleting)
        .find(|l| l.message.is_some())
        .or_else(|| st.layers.iter().find(deleting))
    {
        Some(l) => format!(
            "uninstalling layer {}: {}",
            layer_label(l),
            l.message.as_deref().unwrap_or("deleting")
        ),
        None if finished => "uninstalled".to_string(),
        None => "uninstalling".to_string(),
    };
    st.message = Some(message.clone());
    progressing(&mut st, "Uninstalling", &message, now);
    Decision {
        actions,
        status: st,
        events,
        requeue_after: None,
        finished,
        timeouts: 0,
    }
}
