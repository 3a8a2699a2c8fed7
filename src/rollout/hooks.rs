//! Helm hook stages, pure: the hooks of one event (`pre-install`, `post-delete`, ...) run one at
//! a time in Helm's order (`helm.sh/hook-weight`, then name, then Helm's kind order), each waited
//! on until done before the next is created, and the delete policies are carried out when Helm 4
//! carries them out (`pkg/action/hooks.go`):
//! - `before-hook-creation` (the default): an earlier object of the hook's name is deleted, and
//!   its deletion awaited, right before the hook is created;
//! - `hook-succeeded`: only once **every** hook of the stage succeeded, in reverse run order,
//!   each deletion awaited before the next (a hook Job's ServiceAccount and Role are hooks of the
//!   same event at a lower weight, and must outlive the Job);
//! - when a hook fails: that hook if it has `hook-failed`, then the hooks before it that have
//!   `hook-succeeded`, in run order, each awaited; then the stage fails;
//! - a CustomResourceDefinition is never deleted by a delete policy.
//!
//! A stage is one entry of `status.layers` (`(pre-install)`); its `ready` counts the hooks
//! done, so the running hook is the `ready`-th, and its phase says where that hook is:
//! - `Applying`: not created yet (an earlier object of its name may still have to go);
//! - `Deleting`: the earlier object is being deleted (`before-hook-creation`), and its
//!   deletion is awaited before the hook is created again;
//! - `Waiting`: created by this run (`startedAt` is when), judged until done: a Job until
//!   Complete, a Pod until Succeeded, a CustomResourceDefinition until Established, anything
//!   else (as Helm) once it exists, unless it carries readiness annotations;
//! - `CleaningUp`: the delete policies are carried out, one object at a time. With `ready` equal
//!   to the number of hooks, every hook succeeded; with fewer, the `ready`-th failed and
//!   `message` says why (the stage fails once the clean-up is done). Which object is next is
//!   read from the cluster each time (the first of the clean-up's list that still exists and is
//!   ours), so a controller that takes over in the middle carries it on, and carries it out once;
//! - `Ready` once every hook is done and cleaned up, `Failed` when one failed or was not done
//!   within `spec.timeout`.
//!
//! Each hook object carries [`HOOK_RUN_ANNOTATION`] naming the run that created it, so a
//! controller that takes over in the middle of a stage recognises a hook already created (or
//! already done) and never creates it again.
//!
//! Beyond Helm: a failed Job's or Pod's last log lines are in the failure's message and its
//! `HookFailed` event (Helm prints them only with `helm.sh/hook-output-log-policy`); a hook that
//! succeeded with `helm.sh/hook-output-log-policy: hook-succeeded` has them in its
//! `HookSucceeded` event.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::{HookLog, Note, Observations, Outcome, Wanted, external_blocker};
use crate::api::{
    Claim, EventReason, HOOK_RUN_ANNOTATION, Identity, LayerPhase, LayerStatus, Owner, Reason,
    TEST_EVENT, hook_stage,
};
use crate::history::HookRecord;
use crate::readiness::{self, Rules, Verdict};

/// The policy that deletes an earlier object of a hook before the hook is created again
/// (Helm's default when a hook names none).
pub const BEFORE_HOOK_CREATION: &str = "before-hook-creation";
/// The policy that deletes a hook once every hook of its stage succeeded.
pub const HOOK_SUCCEEDED: &str = "hook-succeeded";
/// The policy that deletes a hook once it failed.
pub const HOOK_FAILED: &str = "hook-failed";

/// The longest event note the API server keeps (`events.k8s.io/v1` `note`).
const EVENT_NOTE: usize = 1024;
/// The most of a status message a log tail may take.
const STATUS_TAIL: usize = 2 * HookLog::MAX_BYTES;

/// One thing a hook stage does to the cluster. The index is into the revision's hooks.
#[derive(Debug, Clone, PartialEq)]
pub enum HookAction {
    /// Create (server-side apply) the hook, marked with `run` ([`HOOK_RUN_ANNOTATION`]).
    Create { hook: usize, run: String },
    /// Delete the hook's object (a delete policy).
    Delete { hook: usize },
}

/// The hooks of one event, in run order.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage<'a> {
    pub event: &'static str,
    /// All hooks of the revision; `order` indexes them.
    pub hooks: &'a [HookRecord],
    pub order: Vec<usize>,
    /// The value of [`HOOK_RUN_ANNOTATION`] of this run: `<release uid>/<revision>/<event>`.
    pub run: String,
    /// `spec.timeout`: how long one hook may take.
    pub timeout: Duration,
}

impl<'a> Stage<'a> {
    /// The stage of `event`, or None when no hook runs at it.
    pub fn of(
        hooks: &'a [HookRecord],
        event: &'static str,
        run: &str,
        timeout: Duration,
    ) -> Option<Stage<'a>> {
        let order: Vec<usize> = hooks
            .iter()
            .enumerate()
            .filter(|(_, h)| h.runs_at(event))
            .map(|(i, _)| i)
            .collect();
        (!order.is_empty()).then(|| Stage {
            event,
            hooks,
            order,
            run: format!("{run}/{event}"),
            timeout,
        })
    }

    /// The stage of Helm's tests (`test`, and Helm 2's `test-success`) among `hooks`: those
    /// `selects` keeps (by `metadata.name`, as `helm test --filter`), in run order; None when
    /// none is left. `run` names this test run.
    pub fn tests(
        hooks: &'a [HookRecord],
        selects: impl Fn(&str) -> bool,
        run: String,
        timeout: Duration,
    ) -> Option<Stage<'a>> {
        let order: Vec<usize> = hooks
            .iter()
            .enumerate()
            .filter(|(_, h)| h.events.iter().any(|e| crate::plan::is_test_event(e)))
            .filter(|(_, h)| selects(&h.key.name))
            .map(|(i, _)| i)
            .collect();
        (!order.is_empty()).then_some(Stage {
            event: TEST_EVENT,
            hooks,
            order,
            run,
            timeout,
        })
    }

    /// Its fresh `status.layers` entry.
    pub fn entry(&self, chart: &str) -> LayerStatus {
        LayerStatus {
            chart: chart.to_string(),
            name: hook_stage(self.event),
            phase: LayerPhase::Pending,
            resources: i32::try_from(self.order.len()).unwrap_or(i32::MAX),
            ..LayerStatus::default()
        }
    }

    /// The running hook of a stage whose entry is `entry`: its index into the hooks.
    fn current(&self, entry: &LayerStatus) -> Option<usize> {
        let done = usize::try_from(entry.ready).ok()?;
        self.order.get(done).copied()
    }

    /// What the delete policies delete once the stage is over, in that order (indexes into the
    /// hooks): with every hook done, those with `hook-succeeded` in reverse run order; when the
    /// `ready`-th failed, it if it has `hook-failed`, then the earlier ones with
    /// `hook-succeeded` in run order. Never a CustomResourceDefinition.
    pub(super) fn clean_up(&self, entry: &LayerStatus) -> Vec<usize> {
        let done = usize::try_from(entry.ready)
            .unwrap_or(0)
            .min(self.order.len());
        let with = |policy: &'static str| {
            move |&&h: &&usize| {
                self.hooks
                    .get(h)
                    .is_some_and(|hook| hook.has_policy(policy) && hook.deletable())
            }
        };
        match self.order.get(done) {
            None => self
                .order
                .iter()
                .rev()
                .filter(with(HOOK_SUCCEEDED))
                .copied()
                .collect(),
            Some(failed) => std::iter::once(failed)
                .filter(with(HOOK_FAILED))
                .chain(self.order[..done].iter().filter(with(HOOK_SUCCEEDED)))
                .copied()
                .collect(),
        }
    }

    /// What must be observed before the stage can be stepped: the running hook and, before it
    /// is created, its external dependencies; while it cleans up, whether the objects to delete
    /// still exist.
    pub fn wanted(&self, entry: &LayerStatus, wanted: &mut Wanted) {
        if entry.phase == LayerPhase::CleaningUp {
            wanted.present.extend(
                self.clean_up(entry)
                    .into_iter()
                    .filter_map(|h| Some(self.hooks.get(h)?.key.clone())),
            );
            return;
        }
        let Some(hook) = self.current(entry) else {
            return;
        };
        match entry.phase {
            LayerPhase::Applying | LayerPhase::Deleting => {
                wanted.hooks.insert(hook);
                let count = self.hooks.get(hook).map_or(0, |h| h.external.len());
                wanted.hook_external.extend((0..count).map(|e| (hook, e)));
            }
            LayerPhase::Waiting => {
                wanted.hooks.insert(hook);
            }
            _ => {}
        }
    }
}

/// What became of one hook in a step: created, succeeded, or failed (the message naming it,
/// with its pod's last log lines).
#[derive(Debug, Clone, PartialEq)]
pub enum HookOutcome {
    Started,
    Succeeded,
    Failed(String),
}

/// What one step of a hook stage decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageStep {
    pub actions: Vec<HookAction>,
    pub events: Vec<Note>,
    /// What became of the hooks (by index into the revision's hooks), in order: what the
    /// status of a test run tells of each test.
    pub outcomes: Vec<(usize, HookOutcome)>,
    /// The stage failed, its clean-up done: the reason and the message naming the hook.
    pub failure: Option<(Reason, String)>,
    /// When the running hook's timeout falls.
    pub requeue_after: Option<Duration>,
}

/// Whether `object` was created by the run `run`.
fn created_by(object: &Value, run: &str) -> bool {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(HOOK_RUN_ANNOTATION))
        .and_then(Value::as_str)
        == Some(run)
}

/// Whether a hook that exists is done, as Helm judges it: a Job once Complete, a Pod once
/// Succeeded (their failures are failures); beyond Helm, a CustomResourceDefinition once
/// Established and an object with readiness annotations by them; anything else at once.
fn judge(
    hook: &HookRecord,
    object: &Value,
    waited: Option<Duration>,
    timeout: Duration,
) -> Verdict {
    let rules = Rules::from_object(&hook.object).unwrap_or_default();
    let judged = hook.runs_to_completion()
        || hook.key.kind == "CustomResourceDefinition"
        || !rules.is_empty();
    if !judged {
        return Verdict::Ready;
    }
    readiness::check(object, &rules.require_completion(), waited, timeout)
}

/// A message with the end of a log after it, in at most `budget` bytes: the message first,
/// then as many of the last lines as fit.
fn with_log(message: &str, log: Option<&HookLog>, budget: usize) -> String {
    let told = log.and_then(|log| log.told(budget.saturating_sub(message.len() + 1)));
    match told {
        Some(told) => format!("{message}\n{told}"),
        None => message.to_string(),
    }
}

/// Steps a started stage (its entry not Pending): creates, judges and deletes hooks, one at a
/// time, until one must be waited on. [`Outcome::Need`] names what must be observed first.
pub fn step(
    stage: &Stage,
    entry: &mut LayerStatus,
    observed: &Observations,
    me: &Identity,
    now: &Time,
) -> Outcome<StageStep> {
    let mut out = StageStep::default();
    if entry.phase == LayerPhase::Pending {
        entry.phase = LayerPhase::Applying;
        entry.ready = 0;
        entry.started_at = Some(now.clone());
        entry.finished_at = None;
        entry.message = None;
    }
    let need = |entry: &LayerStatus| {
        let mut wanted = Wanted::default();
        stage.wanted(entry, &mut wanted);
        Outcome::Need(wanted)
    };
    loop {
        if entry.phase == LayerPhase::CleaningUp {
            return clean_up(stage, entry, observed, me, now, out);
        }
        let Some(index) = stage.current(entry) else {
            // Every hook is done: what `hook-succeeded` deletes goes now.
            entry.phase = LayerPhase::CleaningUp;
            continue;
        };
        let Some(hook) = stage.hooks.get(index) else {
            return Outcome::Decided(out);
        };
        let position = format!("hook {} of {}", entry.ready + 1, stage.order.len());
        match entry.phase {
            LayerPhase::Applying | LayerPhase::Deleting => {
                let Some(seen) = observed.hooks.get(&index) else {
                    return need(entry);
                };
                if let Some(object) = seen {
                    if created_by(object, &stage.run) {
                        // Created by this run before the status could say so (a takeover).
                        entry.phase = LayerPhase::Waiting;
                        continue;
                    }
                    if let Owner::Other(other) = Claim::of(object).judge(me) {
                        let message = format!(
                            "{} hook {} cannot be created: {} belongs to {other}; it is left alone",
                            stage.event,
                            hook.label(),
                            hook.key
                        );
                        out.events
                            .push(Note::warning(EventReason::HookFailed, message.clone()));
                        return Outcome::Decided(fail(
                            entry,
                            out,
                            Reason::OwnershipConflict,
                            message,
                            now,
                        ));
                    }
                    if hook.has_policy(BEFORE_HOOK_CREATION) && hook.deletable() {
                        if entry.phase == LayerPhase::Applying {
                            out.actions.push(HookAction::Delete { hook: index });
                            entry.phase = LayerPhase::Deleting;
                        }
                        entry.message = Some(format!(
                            "{position}: deleting the previous {} ({BEFORE_HOOK_CREATION})",
                            hook.key
                        ));
                        return Outcome::Decided(out);
                    }
                    // Without before-hook-creation (or for a CRD) the earlier object is applied
                    // over.
                }
                for e in 0..hook.external.len() {
                    let external = &hook.external[e];
                    let Some(seen) = observed.hook_external.get(&(index, e)) else {
                        return need(entry);
                    };
                    if let Some(reason) = external_blocker(external, seen.as_ref()) {
                        entry.phase = LayerPhase::Applying;
                        entry.message = Some(format!("{position}: {} {reason}", hook.label()));
                        return Outcome::Decided(out);
                    }
                }
                out.actions.push(HookAction::Create {
                    hook: index,
                    run: stage.run.clone(),
                });
                out.outcomes.push((index, HookOutcome::Started));
                entry.phase = LayerPhase::Waiting;
                entry.started_at = Some(now.clone());
                entry.message = Some(format!("{position}: {} created", hook.label()));
                out.events.push(Note::normal(
                    EventReason::HookStarted,
                    format!("Running {} hook {}", stage.event, hook.label()),
                ));
                return Outcome::Decided(out);
            }
            LayerPhase::Waiting => {
                let Some(seen) = observed.hooks.get(&index) else {
                    return need(entry);
                };
                let verdict = match seen {
                    Some(object) if created_by(object, &stage.run) => {
                        let waited = observed.outages.waited(entry.started_at.as_ref(), now);
                        let verdict = judge(hook, object, waited, stage.timeout);
                        if let (Verdict::InProgress(_), Some(waited)) = (&verdict, waited) {
                            let rules = Rules::from_object(&hook.object).unwrap_or_default();
                            let left = rules
                                .effective_timeout(stage.timeout)
                                .saturating_sub(waited);
                            out.requeue_after = Some(left.max(Duration::from_secs(1)));
                        }
                        verdict
                    }
                    // Gone once created (a Job's ttlSecondsAfterFinished, say): done, as Helm
                    // counts a hook deleted while it is waited on.
                    _ => Verdict::Ready,
                };
                // The log a Job or Pod leaves is read before anything deletes it.
                let log_wanted = hook.runs_to_completion()
                    && seen.is_some()
                    && match &verdict {
                        Verdict::Failed(_) => true,
                        Verdict::Ready => hook.has_output_log_policy(HOOK_SUCCEEDED),
                        Verdict::InProgress(_) => false,
                    };
                let log = if log_wanted {
                    match observed.hook_logs.get(&index) {
                        Some(log) => log.as_ref(),
                        None => {
                            return Outcome::Need(Wanted {
                                hook_logs: [index].into(),
                                ..Wanted::default()
                            });
                        }
                    }
                } else {
                    None
                };
                match verdict {
                    Verdict::Ready => {
                        let message = format!("{} hook {} succeeded", stage.event, hook.label());
                        out.events.push(Note::normal(
                            EventReason::HookSucceeded,
                            with_log(&message, log, EVENT_NOTE),
                        ));
                        out.outcomes.push((index, HookOutcome::Succeeded));
                        entry.ready += 1;
                        entry.phase = LayerPhase::Applying;
                        entry.message = None;
                    }
                    Verdict::InProgress(reason) => {
                        entry.message = Some(format!("{position}: waiting for {reason}"));
                        return Outcome::Decided(out);
                    }
                    Verdict::Failed(reason) => {
                        let message =
                            format!("{} hook {} failed: {reason}", stage.event, hook.label());
                        out.events.push(Note::warning(
                            EventReason::HookFailed,
                            with_log(&message, log, EVENT_NOTE),
                        ));
                        // The failed hook stays the `ready`-th; its message is the failure's. The
                        // clean-up starts from the next step, once the status says the hook
                        // failed: a hook found gone while it is waited on counts as done, so its
                        // deletion must not come before that.
                        entry.phase = LayerPhase::CleaningUp;
                        entry.message = Some(with_log(&message, log, message.len() + STATUS_TAIL));
                        out.outcomes.push((
                            index,
                            HookOutcome::Failed(entry.message.clone().unwrap_or_default()),
                        ));
                        if stage.clean_up(entry).is_empty() {
                            continue;
                        }
                        out.requeue_after = Some(Duration::from_millis(100));
                        return Outcome::Decided(out);
                    }
                }
            }
            _ => return Outcome::Decided(out),
        }
    }
}

/// Carries out the delete policies of a stage whose hooks are over: deletes the first object of
/// the clean-up's list that is still there and ours, and waits until it is gone; once none is
/// left, the stage is Ready, or Failed with the failure it recorded.
fn clean_up(
    stage: &Stage,
    entry: &mut LayerStatus,
    observed: &Observations,
    me: &Identity,
    now: &Time,
    mut out: StageStep,
) -> Outcome<StageStep> {
    let list = stage.clean_up(entry);
    let failed = stage.current(entry).is_some();
    for (n, &index) in list.iter().enumerate() {
        let Some(hook) = stage.hooks.get(index) else {
            continue;
        };
        let claim = match observed.present.get(&hook.key) {
            None => {
                let mut wanted = Wanted::default();
                stage.wanted(entry, &mut wanted);
                return Outcome::Need(wanted);
            }
            Some(None) => continue,
            Some(Some(claim)) => claim,
        };
        // An object someone else made since is not ours to delete.
        if claim.judge(me) != Owner::Us {
            continue;
        }
        if claim.deleting_with.is_empty() {
            out.actions.push(HookAction::Delete { hook: index });
        }
        // Only the failed hook itself is deleted for `hook-failed`.
        let policy = if stage.current(entry) == Some(index) {
            HOOK_FAILED
        } else {
            HOOK_SUCCEEDED
        };
        let doing = format!(
            "deleting {}/{} ({policy}, {} of {})",
            hook.key.kind,
            hook.key.name,
            n + 1,
            list.len()
        );
        if !failed {
            entry.message = Some(format!(
                "all {} hooks succeeded; {doing}",
                stage.order.len()
            ));
        }
        return Outcome::Decided(out);
    }
    if failed {
        let message = entry
            .message
            .clone()
            .unwrap_or_else(|| format!("{} hook failed", stage.event));
        return Outcome::Decided(fail(entry, out, Reason::HookFailed, message, now));
    }
    entry.phase = LayerPhase::Ready;
    entry.finished_at = Some(now.clone());
    entry.message = None;
    Outcome::Decided(out)
}

/// The stage failed (its events already told): Failed, with the failure for the operation.
fn fail(
    entry: &mut LayerStatus,
    mut out: StageStep,
    reason: Reason,
    message: String,
    now: &Time,
) -> StageStep {
    entry.phase = LayerPhase::Failed;
    entry.finished_at = Some(now.clone());
    entry.message = Some(message.clone());
    out.requeue_after = None;
    out.failure = Some((reason, message));
    out
}
