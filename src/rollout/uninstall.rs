//! An uninstall, stepped through the `pre-delete` hooks, the uninstall steps of the last
//! revision's inventory (a step is deleted once the steps it comes after are gone, and waits
//! until its objects have disappeared), and the `post-delete` hooks. The hooks come from the
//! revision's record, not from the chart, which may be gone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use std::time::Duration;

use super::hooks::{self, HookAction, Stage};
use super::install::{layer_label, settle_deletion};
use super::status::{elapsed, progressing, retry_delay, set_stalled};
use super::{Note, Observations, Outcome, RecordUpdate, Wanted};
use crate::api::{
    EventReason, Identity, LayerPhase, LayerStatus, ObjectKey, Reason, ReleasePhase,
    SequencedReleaseStatus,
};
use crate::history::{HookRecord, Inventory};

/// What an uninstall works from: the last revision's inventory and hooks.
#[derive(Debug, Clone, Copy)]
pub struct Uninstall<'a> {
    pub inventory: &'a Inventory,
    /// Whether the revision was sequenced; `false` deletes everything at once.
    pub sequenced: bool,
    /// The revision's hooks (none with `spec.disableHooks`).
    pub hooks: &'a [HookRecord],
    /// `<release uid>/<revision>`.
    pub run: &'a str,
    /// `spec.timeout`: how long one hook may take.
    pub timeout: Duration,
}

/// The outcome of [`uninstall_step`].
#[derive(Debug, Clone, PartialEq)]
pub struct UninstallStep {
    /// The `pre-delete` hook actions, done first.
    pub hooks_before: Vec<HookAction>,
    /// For each step that starts now, by index into the inventory's steps: its objects that
    /// still exist and are ours, in delete order.
    pub deletes: Vec<(usize, Vec<ObjectKey>)>,
    pub status: SequencedReleaseStatus,
    /// The `post-delete` hook actions, done last.
    pub hooks_after: Vec<HookAction>,
    pub events: Vec<Note>,
    /// When to look again even without an event: a hook's timeout, a failed hook's retry.
    pub requeue_after: Option<Duration>,
    /// Every step is deleted and the hooks are done: the finalizer can go.
    pub finished: bool,
    /// The release records whose status changes with this step.
    pub records: Vec<RecordUpdate>,
}

/// The stages of an uninstall: the `pre-delete` hooks, the inventory's steps, the
/// `post-delete` hooks. A failed hook is run again as a new attempt (`status.failures`), whose
/// objects are marked apart from the failed one.
fn stages<'a>(
    u: &Uninstall<'a>,
    status: &SequencedReleaseStatus,
) -> (Option<Stage<'a>>, Option<Stage<'a>>) {
    let run = format!("{}/{}", u.run, status.failures.unwrap_or(0));
    (
        Stage::of(u.hooks, "pre-delete", &run, u.timeout),
        Stage::of(u.hooks, "post-delete", &run, u.timeout),
    )
}

fn layout(u: &Uninstall, status: &SequencedReleaseStatus) -> Vec<LayerStatus> {
    let (pre, post) = stages(u, status);
    let chart = u
        .inventory
        .steps
        .first()
        .map(|s| s.chart.clone())
        .or_else(|| u.hooks.first().map(|h| h.chart.clone()))
        .unwrap_or_default();
    let mut layers = Vec::with_capacity(u.inventory.steps.len() + 2);
    layers.extend(pre.map(|stage| stage.entry(&chart)));
    layers.extend(u.inventory.steps.iter().map(|s| LayerStatus {
        chart: s.chart.clone(),
        name: s.name.clone(),
        resources: i32::try_from(s.objects.len()).unwrap_or(i32::MAX),
        ..LayerStatus::default()
    }));
    layers.extend(post.map(|stage| stage.entry(&chart)));
    layers
}

/// Starts an uninstall: every stage Pending.
fn begin_uninstall(
    u: &Uninstall,
    status: &SequencedReleaseStatus,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    status.phase = Some(ReleasePhase::Uninstalling);
    status.failures = None;
    status.layers = layout(u, &status);
    let message = "uninstalling".to_string();
    status.message = Some(message.clone());
    progressing(&mut status, Reason::Uninstalling, &message, now);
    status
}

fn layout_matches(u: &Uninstall, status: &SequencedReleaseStatus) -> bool {
    let fresh = layout(u, status);
    status.phase == Some(ReleasePhase::Uninstalling)
        && status.layers.len() == fresh.len()
        && status
            .layers
            .iter()
            .zip(&fresh)
            .all(|(l, f)| l.chart == f.chart && l.name == f.name && l.resources == f.resources)
}

/// What a hook stage of an uninstall did.
#[derive(Default)]
struct HookOutcome {
    actions: Vec<HookAction>,
    events: Vec<Note>,
    requeue_after: Option<Duration>,
    failed: bool,
}

/// Steps a hook stage of an uninstall. A failed hook is run again after a delay (doubling from
/// 5 s to 5 min), as a new attempt; [`Outcome::Need`] with what must be observed first.
fn step_stage(
    stage: &Stage,
    slot: usize,
    st: &mut SequencedReleaseStatus,
    observed: &Observations,
    me: &Identity,
    now: &Time,
) -> Outcome<HookOutcome> {
    let mut outcome = HookOutcome::default();
    let entry = &st.layers[slot];
    match entry.phase {
        LayerPhase::Ready => return Outcome::Decided(outcome),
        LayerPhase::Failed => {
            let failures = u32::try_from(st.failures.unwrap_or(0)).unwrap_or(u32::MAX);
            let delay = retry_delay(failures);
            let waited = elapsed(entry.finished_at.as_ref(), now).unwrap_or(delay);
            if waited < delay {
                outcome.requeue_after = Some(delay - waited);
                outcome.failed = true;
                return Outcome::Decided(outcome);
            }
            // A new attempt runs the stage again from its first hook, as `helm uninstall` run
            // again does: the hooks before the failed one (its ServiceAccount, say) were
            // deleted by their delete policies.
            st.layers[slot].phase = LayerPhase::Pending;
        }
        _ => {}
    }
    let mut entry = st.layers[slot].clone();
    let out = match hooks::step(stage, &mut entry, observed, me, now) {
        Outcome::Need(wanted) => return Outcome::Need(wanted),
        Outcome::Decided(out) => out,
    };
    st.layers[slot] = entry;
    outcome.events = out.events;
    outcome.actions = out.actions;
    outcome.requeue_after = out.requeue_after;
    if out.failure.is_some() {
        let failures = st.failures.unwrap_or(0) + 1;
        st.failures = Some(failures);
        outcome.requeue_after = Some(retry_delay(u32::try_from(failures).unwrap_or(u32::MAX)));
        outcome.failed = true;
    }
    Outcome::Decided(outcome)
}

/// One step of an uninstall: run the `pre-delete` hooks, delete each step once the steps it
/// comes after are gone and wait until its objects have disappeared (`sequenced: false` deletes
/// everything at once), then run the `post-delete` hooks. The objects of a step must be observed
/// before it starts ([`Outcome::Need`]): only those that still exist and are ours are deleted.
pub fn uninstall_step(
    u: &Uninstall,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    me: &Identity,
    now: &Time,
) -> Outcome<UninstallStep> {
    let inventory = u.inventory;
    let mut st = if layout_matches(u, status) {
        status.clone()
    } else {
        begin_uninstall(u, status, now)
    };
    let (pre, post) = stages(u, &st);
    let offset = usize::from(pre.is_some());
    let mut events = Vec::new();
    let mut requeue_after = None;
    let mut hook_failed = false;

    // The hooks before the layers.
    let mut hooks_before = Vec::new();
    if let Some(stage) = &pre {
        match step_stage(stage, 0, &mut st, observed, me, now) {
            Outcome::Need(wanted) => return Outcome::Need(wanted),
            Outcome::Decided(outcome) => {
                hooks_before = outcome.actions;
                events.extend(outcome.events);
                requeue_after = outcome.requeue_after.or(requeue_after);
                hook_failed |= outcome.failed;
            }
        }
    }
    let pre_done = pre.is_none() || st.layers[0].phase == LayerPhase::Ready;

    // What is being deleted is waited on until it is gone.
    let deleting: Vec<ObjectKey> = st.layers[offset..]
        .iter()
        .zip(&inventory.steps)
        .filter(|(l, _)| l.phase == LayerPhase::Deleting)
        .flat_map(|(_, s)| s.objects.iter().cloned())
        .collect();
    let missing = unseen(&deleting, observed);
    if !missing.is_empty() {
        return Outcome::Need(missing);
    }
    let mut starting = Vec::new();
    for (i, step) in inventory.steps.iter().enumerate() {
        let slot = offset + i;
        if st.layers[slot].phase != LayerPhase::Deleting {
            continue;
        }
        if settle_deletion(&mut st.layers[slot], &step.objects, observed, me, now) {
            let message = format!("Layer {} is deleted", layer_label(&st.layers[slot]));
            events.push(Note::normal(EventReason::LayerDeleted, message));
        }
    }
    for (i, step) in inventory.steps.iter().enumerate() {
        let slot = offset + i;
        if !pre_done || st.layers[slot].phase != LayerPhase::Pending {
            continue;
        }
        let blocker = step.after.iter().filter(|_| u.sequenced).find(|&&a| {
            st.layers
                .get(offset + a)
                .is_some_and(|l| l.phase != LayerPhase::Deleted)
        });
        match blocker {
            None => {
                starting.push(i);
                let layer = &mut st.layers[slot];
                layer.phase = LayerPhase::Deleting;
                layer.started_at = Some(now.clone());
                layer.message = None;
                events.push(Note::normal(
                    EventReason::LayerDeleting,
                    format!(
                        "Deleting layer {} ({} resources)",
                        layer_label(layer),
                        layer.resources
                    ),
                ));
            }
            Some(&a) => {
                let label = layer_label(&st.layers[offset + a]);
                st.layers[slot].message = Some(format!("waiting for layer {label} to be deleted"));
            }
        }
    }
    let objects: Vec<ObjectKey> = starting
        .iter()
        .flat_map(|&i| inventory.steps[i].objects.iter().cloned())
        .collect();
    let missing = unseen(&objects, observed);
    if !missing.is_empty() {
        return Outcome::Need(missing);
    }
    let deletes = starting
        .iter()
        .map(|&i| {
            let ours = inventory.steps[i]
                .objects
                .iter()
                .filter(|k| observed.ours(k, me))
                .cloned()
                .collect();
            (i, ours)
        })
        .collect();
    let deleted = pre_done
        && st.layers[offset..offset + inventory.steps.len()]
            .iter()
            .all(|l| l.phase == LayerPhase::Deleted);

    // The hooks after the layers.
    let mut hooks_after = Vec::new();
    if let Some(stage) = &post
        && deleted
    {
        let slot = offset + inventory.steps.len();
        match step_stage(stage, slot, &mut st, observed, me, now) {
            Outcome::Need(wanted) => return Outcome::Need(wanted),
            Outcome::Decided(outcome) => {
                hooks_after = outcome.actions;
                events.extend(outcome.events);
                requeue_after = outcome.requeue_after.or(requeue_after);
                hook_failed |= outcome.failed;
            }
        }
    }
    let finished = deleted
        && st
            .layers
            .iter()
            .all(|l| matches!(l.phase, LayerPhase::Deleted | LayerPhase::Ready));
    let active = |l: &&LayerStatus| {
        matches!(
            l.phase,
            LayerPhase::Deleting
                | LayerPhase::Waiting
                | LayerPhase::Applying
                | LayerPhase::Failed
                | LayerPhase::CleaningUp
        )
    };
    // The stage that waits on something names it; one that just started says less.
    let message = match st
        .layers
        .iter()
        .filter(active)
        .find(|l| l.message.is_some())
        .or_else(|| st.layers.iter().find(active))
    {
        Some(l) if l.phase == LayerPhase::Failed => format!(
            "uninstall blocked: {}; it is run again in {}s (set spec.disableHooks: true to uninstall without hooks)",
            l.message.as_deref().unwrap_or("a hook failed"),
            requeue_after.unwrap_or_default().as_secs()
        ),
        Some(l) if super::install::is_hook_stage(l) => format!(
            "uninstalling, {} hooks: {}",
            l.name.trim_matches(|c| c == '(' || c == ')'),
            l.message.as_deref().unwrap_or("running")
        ),
        Some(l) => format!(
            "uninstalling layer {}: {}",
            layer_label(l),
            l.message.as_deref().unwrap_or("deleting")
        ),
        None if finished => "uninstalled".to_string(),
        None => "uninstalling".to_string(),
    };
    st.message = Some(message.clone());
    let reason = if hook_failed {
        Reason::HookFailed
    } else {
        Reason::Uninstalling
    };
    progressing(&mut st, reason, &message, now);
    Outcome::Decided(UninstallStep {
        hooks_before,
        deletes,
        hooks_after,
        status: st,
        events,
        requeue_after,
        finished,
        records: Vec::new(),
    })
}

/// The uninstall ran past `spec.timeout` (`timeout`) without finishing: it stays Uninstalling
/// and goes on when what blocks it changes, but the status says it is stuck (Stalled, reason
/// `Timeout`) and names what it waits for, such as a finalizer nobody removes.
pub fn time_out(mut step: UninstallStep, timeout: Duration, now: &Time) -> UninstallStep {
    if step.finished {
        return step;
    }
    let waiting = step
        .status
        .message
        .clone()
        .unwrap_or_else(|| "uninstalling".to_string());
    let message = format!(
        "uninstall not done after {} (spec.timeout): {waiting}; it goes on once that changes",
        crate::readiness::format_duration(timeout)
    );
    step.status.message = Some(message.clone());
    set_stalled(&mut step.status, Reason::Timeout, &message, now);
    step
}

fn unseen(keys: &[ObjectKey], observed: &Observations) -> Wanted {
    Wanted {
        present: keys
            .iter()
            .filter(|k| !observed.present.contains_key(*k))
            .cloned()
            .collect(),
        ..Wanted::default()
    }
}

/// Step `step` failed after it issued the deletes of its first `issued` layers (of
/// `step.deletes`): the status says why; the uninstall goes on from there when it is tried
/// again. The layers whose deletes were not issued are Pending again, so that the next step
/// deletes them rather than waiting for objects nobody deletes. A refusal that a retry does not
/// change (the release's service account may not delete the object) also makes it Stalled with
/// that reason, so that it is not taken for an uninstall in progress.
pub fn fail_delete(
    step: &UninstallStep,
    issued: usize,
    failure: &super::ActionFailure,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = step.status.clone();
    let message = &failure.message;
    status.message = Some(message.clone());
    let offset = usize::from(
        status
            .layers
            .first()
            .is_some_and(|l| l.name.starts_with("(pre-")),
    );
    for (i, _) in step.deletes.iter().skip(issued) {
        if let Some(layer) = status.layers.get_mut(offset + i) {
            layer.phase = LayerPhase::Pending;
            layer.started_at = None;
            layer.message = Some(message.clone());
        }
    }
    if !failure.transient {
        let message = format!("uninstall blocked: {message}; it goes on once that changes");
        set_stalled(&mut status, failure.reason, &message, now);
    }
    status
}

/// A hook of an uninstall step failed (before its deletes, or after them with `post`): what
/// [`fail_delete`] says, and the hook stage is to run again, not taken as done (a hook whose
/// creation failed must not read as one deleted by its `hook-succeeded` policy).
pub fn fail_hook(
    step: &UninstallStep,
    post: bool,
    failure: &super::ActionFailure,
    now: &Time,
) -> SequencedReleaseStatus {
    let issued = if post { step.deletes.len() } else { 0 };
    let mut status = fail_delete(step, issued, failure, now);
    let stage = if post {
        status
            .layers
            .last_mut()
            .filter(|l| l.name.starts_with("(post-"))
    } else {
        status
            .layers
            .first_mut()
            .filter(|l| l.name.starts_with("(pre-"))
    };
    if let Some(layer) = stage {
        layer.phase = LayerPhase::Pending;
        layer.started_at = None;
        layer.finished_at = None;
        layer.message = Some(failure.message.clone());
    }
    status
}
