//! Status transitions shared by every part of the lifecycle: the three conditions with kstatus
//! meanings, and the phases a release enters when it waits, fails, stalls or is interrupted.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{READY, RECONCILING, Reason, ReleasePhase, STALLED, SequencedReleaseStatus};

/// A timestamp the API server keeps as it is: whole seconds.
pub fn seconds(now: Time) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(now.0.as_second()).unwrap_or(now.0))
}

/// How long since `since`, None when it is not set.
pub(super) fn elapsed(since: Option<&Time>, now: &Time) -> Option<Duration> {
    let since = since?;
    let d = now.0.duration_since(since.0);
    Some(Duration::try_from(d).unwrap_or(Duration::ZERO))
}

/// Sets condition `type_`, keeping its transition time when its status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    set_condition_to(
        conditions,
        type_,
        Some(status),
        reason,
        message,
        generation,
        now,
    );
}

/// [`set_condition`] to True, False or Unknown (`None`).
pub fn set_condition_to(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Option<bool>,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let status = match status {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    }
    .to_string();
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
pub(super) fn set_conditions(
    status: &mut SequencedReleaseStatus,
    reason: Reason,
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

/// Not Ready and Stalled with `reason` and `message`, the phase as it is (an uninstall that
/// cannot go on).
pub fn set_stalled(status: &mut SequencedReleaseStatus, reason: Reason, message: &str, now: &Time) {
    set_conditions(
        status,
        reason,
        now,
        [(false, message), (false, ""), (true, message)],
    );
}

/// The three conditions for a release that is making progress (`reason` says how).
pub fn progressing(status: &mut SequencedReleaseStatus, reason: Reason, message: &str, now: &Time) {
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
    reason: Reason,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = entering(status, generation, ReleasePhase::Failed, message);
    set_stalled(&mut status, reason, message, now);
    if let Some(current) = status.history.first_mut()
        && Some(current.revision) == status.revision
        && current.finished_at.is_none()
    {
        current.phase = ReleasePhase::Failed;
        current.finished_at = Some(now.clone());
    }
    status
}

/// Whether the release runs revision `number` because `spec.onFailure` rolled back to it after
/// the revision its spec asked for failed (not a rollback someone asked for).
pub fn remediated_rollback(status: &SequencedReleaseStatus, number: i64) -> bool {
    status
        .rollback
        .as_ref()
        .is_some_and(|r| !r.requested && r.revision == number)
}

/// The conditions of a release [`remediated_rollback`]: its objects are ready, but the spec it
/// was given failed and is held back until it changes, which only a person can do. So it is not
/// Ready, and Stalled (kstatus reads Failed, as for a Flux HelmRelease a rollback remediated),
/// with reason `RolledBack` and `message`.
pub fn held_back(status: &mut SequencedReleaseStatus, message: &str, now: &Time) {
    set_conditions(
        status,
        Reason::RolledBack,
        now,
        [(false, message), (false, ""), (true, message)],
    );
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
    reason: Reason,
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
    let conditions = &mut status.conditions;
    set_condition(conditions, READY, false, reason, &retrying, generation, now);
    set_condition(
        conditions,
        RECONCILING,
        true,
        Reason::RetryScheduled,
        &retrying,
        generation,
        now,
    );
    set_condition(conditions, STALLED, false, reason, "", generation, now);
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
    progressing(&mut status, Reason::Interrupted, message, now);
    status
}

/// A release waiting for something outside it (another release): phase Pending.
pub fn pending(
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    reason: Reason,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = entering(status, generation, ReleasePhase::Pending, message);
    progressing(&mut status, reason, message, now);
    status
}

/// The status at `generation` in `phase`, saying `message`.
fn entering(
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    phase: ReleasePhase,
    message: &str,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    status.observed_generation = generation;
    status.phase = Some(phase);
    status.message = Some(message.to_string());
    status
}

/// Whether an operation is under way in this phase: the release's lock is held through it.
pub fn holds_lock(phase: Option<ReleasePhase>) -> bool {
    matches!(
        phase,
        Some(
            ReleasePhase::Deploying
                | ReleasePhase::Rendering
                | ReleasePhase::RollingBack
                | ReleasePhase::Uninstalling
                | ReleasePhase::Testing
        )
    )
}

/// A reconcile failed (`reason` ReconcileFailed, GroupUnavailable while an API group the
/// release needs cannot be served, or RemoteClusterUnreachable while the remote cluster of
/// `spec.kubeConfig` does not answer): the conditions name what failed, the phase and message stay
/// as they are. A Ready release stays Ready (its objects are as they were) and is Reconciling
/// with the failure; any other is not Ready, with the failure. The next reconcile that does not
/// fail sets them back ([`clear_reconcile_failure`]).
pub fn reconcile_failed(
    status: &SequencedReleaseStatus,
    reason: Reason,
    message: &str,
    now: &Time,
) -> SequencedReleaseStatus {
    let mut status = status.clone();
    let generation = status.observed_generation;
    let ready = status.phase == Some(ReleasePhase::Ready)
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == READY && c.status == "True");
    let conditions = &mut status.conditions;
    if !ready {
        set_condition(conditions, READY, false, reason, message, generation, now);
    }
    set_condition(
        conditions,
        RECONCILING,
        true,
        reason,
        message,
        generation,
        now,
    );
    if !conditions.iter().any(|c| c.type_ == STALLED) {
        set_condition(conditions, STALLED, false, reason, "", generation, now);
    }
    status
}

/// Whether the conditions still tell a failed reconcile ([`reconcile_failed`]).
pub fn tells_reconcile_failure(status: &SequencedReleaseStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == RECONCILING
            && (c.reason == Reason::ReconcileFailed.as_str()
                || c.reason == Reason::GroupUnavailable.as_str()
                || c.reason == Reason::RemoteClusterUnreachable.as_str())
    })
}

/// A reconcile went through after failing: the conditions the failure set are set back from
/// the phase and the message, which it left as they were.
pub fn clear_reconcile_failure(status: &mut SequencedReleaseStatus, now: &Time) {
    if !tells_reconcile_failure(status) {
        return;
    }
    let message = status.message.clone().unwrap_or_default();
    let generation = status.observed_generation;
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == STALLED && c.status == "True")
        .map(|c| c.reason.clone());
    match status.phase {
        Some(ReleasePhase::Ready) => {
            set_conditions(
                status,
                Reason::Succeeded,
                now,
                [(true, &message), (false, ""), (false, "")],
            );
        }
        phase if holds_lock(phase) => progressing(status, Reason::Progressing, &message, now),
        _ => {
            // Failed (or not started): not Ready with what the status says, no longer
            // reconciling; a Stalled condition keeps its reason.
            let reason = stalled
                .as_deref()
                .and_then(Reason::parse)
                .unwrap_or(Reason::Progressing);
            let conditions = &mut status.conditions;
            set_condition(conditions, READY, false, reason, &message, generation, now);
            set_condition(conditions, RECONCILING, false, reason, "", generation, now);
        }
    }
}
