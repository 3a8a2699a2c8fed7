//! Helm hook stages, pure: the hooks of one event (`pre-install`, `post-delete`, ...) run one at
//! a time in the order of the plan (`helm.sh/hook-weight`, Helm's kind order, name), each
//! waited on until done before the next is created, as Helm runs them.
//!
//! A stage is one entry of `status.layers` (`(pre-install)`); its `ready` counts the hooks
//! done, so the running hook is the `ready`-th, and its phase says where that hook is:
//! - `Applying`: not created yet (an earlier object of its name may still have to go);
//! - `Deleting`: the earlier object is being deleted (`before-hook-creation`), and its
//!   deletion is awaited before the hook is created again;
//! - `Waiting`: created by this run (`startedAt` is when), judged until done: a Job until
//!   Complete, a Pod until Succeeded, anything else by the readiness rules;
//! - `Ready` once every hook is done, `Failed` when one failed or was not done within
//!   `spec.timeout`.
//!
//! Each hook object carries [`HOOK_RUN_ANNOTATION`] naming the run that created it, so a
//! controller that takes over in the middle of a stage recognises a hook already created (or
//! already done) and never creates it again.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::status::elapsed;
use super::{Note, Observations, Wanted, external_blocker};
use crate::api::{
    Claim, EventReason, HOOK_RUN_ANNOTATION, Identity, LayerPhase, LayerStatus, Owner, Reason,
    hook_stage,
};
use crate::history::HookRecord;
use crate::readiness::{self, Rules, Verdict};

/// The policy that deletes an earlier object of a hook before the hook is created again
/// (Helm's default when a hook names none).
pub const BEFORE_HOOK_CREATION: &str = "before-hook-creation";
/// The policy that deletes a hook once it succeeded.
pub const HOOK_SUCCEEDED: &str = "hook-succeeded";
/// The policy that deletes a hook once it failed.
pub const HOOK_FAILED: &str = "hook-failed";

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

    /// What must be observed before the stage can be stepped: the running hook and, before it
    /// is created, its external dependencies.
    pub fn wanted(&self, entry: &LayerStatus, wanted: &mut Wanted) {
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

/// What one step of a hook stage decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageStep {
    pub actions: Vec<HookAction>,
    pub events: Vec<Note>,
    /// The stage failed: the reason and the message naming the hook.
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

/// Steps a started stage (its entry not Pending): creates, judges and deletes hooks, one at a
/// time, until one must be waited on. `None` when an object it needs has not been observed
/// (the stage's [`Stage::wanted`] of the entry as it is now names it).
pub fn step(
    stage: &Stage,
    entry: &mut LayerStatus,
    observed: &Observations,
    me: &Identity,
    now: &Time,
) -> Option<StageStep> {
    let mut out = StageStep::default();
    if entry.phase == LayerPhase::Pending {
        entry.phase = LayerPhase::Applying;
        entry.ready = 0;
        entry.started_at = Some(now.clone());
        entry.finished_at = None;
        entry.message = None;
    }
    loop {
        let Some(index) = stage.current(entry) else {
            entry.phase = LayerPhase::Ready;
            entry.finished_at = Some(now.clone());
            entry.message = None;
            return Some(out);
        };
        let hook = stage.hooks.get(index)?;
        let position = format!("hook {} of {}", entry.ready + 1, stage.order.len());
        match entry.phase {
            LayerPhase::Applying | LayerPhase::Deleting => {
                let seen = observed.hooks.get(&index)?;
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
                        return Some(fail(entry, out, Reason::OwnershipConflict, message, now));
                    }
                    if hook.has_policy(BEFORE_HOOK_CREATION) {
                        if entry.phase == LayerPhase::Applying {
                            out.actions.push(HookAction::Delete { hook: index });
                            entry.phase = LayerPhase::Deleting;
                        }
                        entry.message = Some(format!(
                            "{position}: deleting the previous {} ({BEFORE_HOOK_CREATION})",
                            hook.key
                        ));
                        return Some(out);
                    }
                    // Without before-hook-creation the earlier object is applied over.
                }
                for e in 0..hook.external.len() {
                    let external = &hook.external[e];
                    let seen = observed.hook_external.get(&(index, e))?;
                    if let Some(reason) = external_blocker(external, seen.as_ref()) {
                        entry.phase = LayerPhase::Applying;
                        entry.message = Some(format!("{position}: {} {reason}", hook.label()));
                        return Some(out);
                    }
                }
                out.actions.push(HookAction::Create {
                    hook: index,
                    run: stage.run.clone(),
                });
                entry.phase = LayerPhase::Waiting;
                entry.started_at = Some(now.clone());
                entry.message = Some(format!("{position}: {} created", hook.label()));
                out.events.push(Note::normal(
                    EventReason::HookStarted,
                    format!("Running {} hook {}", stage.event, hook.label()),
                ));
                return Some(out);
            }
            LayerPhase::Waiting => {
                let verdict = match observed.hooks.get(&index)? {
                    Some(object) if created_by(object, &stage.run) => {
                        let rules = Rules::from_object(&hook.object)
                            .unwrap_or_default()
                            .require_completion();
                        let waited = elapsed(entry.started_at.as_ref(), now);
                        let verdict = readiness::check(object, &rules, waited, stage.timeout);
                        if let (Verdict::InProgress(_), Some(waited)) = (&verdict, waited) {
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
                match verdict {
                    Verdict::Ready => {
                        out.events.push(Note::normal(
                            EventReason::HookSucceeded,
                            format!("{} hook {} succeeded", stage.event, hook.label()),
                        ));
                        if hook.has_policy(HOOK_SUCCEEDED)
                            && matches!(observed.hooks.get(&index), Some(Some(_)))
                        {
                            out.actions.push(HookAction::Delete { hook: index });
                        }
                        entry.ready += 1;
                        entry.phase = LayerPhase::Applying;
                        entry.message = None;
                    }
                    Verdict::InProgress(reason) => {
                        entry.message = Some(format!("{position}: waiting for {reason}"));
                        return Some(out);
                    }
                    Verdict::Failed(reason) => {
                        if hook.has_policy(HOOK_FAILED) {
                            out.actions.push(HookAction::Delete { hook: index });
                        }
                        let message =
                            format!("{} hook {} failed: {reason}", stage.event, hook.label());
                        return Some(fail(entry, out, Reason::HookFailed, message, now));
                    }
                }
            }
            _ => return Some(out),
        }
    }
}

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
    out.events
        .push(Note::warning(EventReason::HookFailed, message.clone()));
    out.requeue_after = None;
    out.failure = Some((reason, message));
    out
}
