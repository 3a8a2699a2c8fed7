//! Recovery, pure: the requests users make through annotations (`sequenced reconcile`,
//! `sequenced rollback`), rollbacks to a stored revision, what `spec.onFailure` does once a
//! failed operation's retries are spent, and the statuses of the release records as Helm spells
//! them.
//!
//! A rollback is a new revision (as `helm rollback` makes one) whose plan is the stored plan of
//! the revision it goes back to, applied in that revision's order, sequenced or not as it was;
//! its prune stage deletes what the revision rolled back from had and the target has not, in
//! reverse order of the rolled-back revision's plan. While it holds, the release stays on it:
//! `status.rollback` names the spec generation and digest it holds back, and a new revision
//! starts only when one of them changes or a reconcile is requested.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::install::{self};
use super::status::{held_back, progressing, set_conditions, set_stalled};
use super::{Note, RecordUpdate, Revision, Settings};
use crate::api::{
    CrdPolicy, EventReason, FORCE_REQUEST_ANNOTATION, OnFailure, RECONCILE_REQUEST_ANNOTATION,
    ROLLBACK_REQUEST_ANNOTATION, ROLLBACK_REVISION_ANNOTATION, Reason, ReleasePhase,
    RemediationAction, RemediationStatus, RollbackStatus, SequencedRelease, SequencedReleaseStatus,
    TEST_REQUEST_ANNOTATION,
};
use crate::history::{HelmStatus, Info, Record};

/// The requests of a release's annotations that were not acted on yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests {
    /// A reconcile: its token.
    pub reconcile: Option<String>,
    /// With it, `--force`: a Ready release is applied again.
    pub force: bool,
    pub rollback: Option<RollbackRequest>,
    /// A test run (`sequenced test`): its token.
    pub test: Option<String>,
}

/// A rollback asked for with `sequenced rollback`.
#[derive(Debug, Clone, PartialEq)]
pub struct RollbackRequest {
    pub token: String,
    /// The revision asked for; None for the Ready revision before the current one; an error when
    /// the annotation is not a revision number.
    pub revision: Result<Option<i64>, String>,
}

/// The requests of `sr` that `status` does not say were handled.
pub fn requests(sr: &SequencedRelease, status: &SequencedReleaseStatus) -> Requests {
    let annotation = |key: &str| {
        sr.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let reconcile = annotation(RECONCILE_REQUEST_ANNOTATION)
        .filter(|token| status.last_handled_reconcile_at.as_deref() != Some(*token));
    let force = reconcile.is_some() && annotation(FORCE_REQUEST_ANNOTATION) == reconcile;
    let rollback = annotation(ROLLBACK_REQUEST_ANNOTATION)
        .filter(|token| status.last_handled_rollback_at.as_deref() != Some(*token))
        .map(|token| RollbackRequest {
            token: token.to_string(),
            revision: match annotation(ROLLBACK_REVISION_ANNOTATION) {
                None => Ok(None),
                Some(text) => match text.trim().parse::<i64>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(format!(
                        "annotation {ROLLBACK_REVISION_ANNOTATION}: {text:?} is not a revision number"
                    )),
                },
            },
        });
    let test = annotation(TEST_REQUEST_ANNOTATION)
        .filter(|token| status.last_handled_test_at.as_deref() != Some(*token))
        .map(str::to_string);
    Requests {
        reconcile: reconcile.map(str::to_string),
        force,
        rollback,
        test,
    }
}

/// The latest revision before `revision` that reached Ready, as the history tells.
pub fn last_ready_before(status: &SequencedReleaseStatus, revision: i64) -> Option<i64> {
    status
        .history
        .iter()
        .filter(|h| h.revision < revision && h.phase == ReleasePhase::Ready)
        .map(|h| h.revision)
        .max()
}

/// Whether a rollback holds the release: it was made at this generation and at a digest that
/// `is_current` takes for the spec's (under the scheme that wrote it).
pub fn pinned(
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    is_current: impl Fn(Option<&str>) -> bool,
) -> bool {
    status
        .rollback
        .as_ref()
        .is_some_and(|r| r.generation == generation && is_current(r.digest.as_deref()))
}

/// Whether the current revision's failure is to be remediated now: it failed as an operation
/// (not a chart that does not render), its retries are spent, `spec.onFailure` is not `keep`,
/// it is no rollback itself, and it was not remediated yet.
pub fn remediation_due(settings: &Settings, status: &SequencedReleaseStatus) -> bool {
    let Some(revision) = status.revision else {
        return false;
    };
    let failures = u32::try_from(status.failures.unwrap_or(0)).unwrap_or(0);
    status.phase == Some(ReleasePhase::Failed)
        && settings.on_failure != OnFailure::Keep
        && failures > 0
        && failures > settings.retries
        && status
            .history
            .iter()
            .any(|h| h.revision == revision && h.phase == ReleasePhase::Failed)
        && status.rollback.as_ref().map(|r| r.revision) != Some(revision)
        && status.remediation.as_ref().map(|r| r.failed_revision) != Some(revision)
}

/// Whether the current revision's objects were uninstalled after its failure (or are being): the
/// next revision is an install again.
pub fn uninstalled(status: &SequencedReleaseStatus) -> bool {
    status.remediation.as_ref().is_some_and(|r| {
        r.action == RemediationAction::Uninstall && Some(r.failed_revision) == status.revision
    })
}

/// The record of revision `number`, which re-applies `target` and deletes what `from` (the
/// revision rolled back from) has that `target` has not.
pub fn rollback_record(target: &Record, from: Option<&Record>, number: i64, now: &Time) -> Record {
    let prune = from
        .map(|f| f.uninstall_inventory().removed_in(&target.inventory))
        .unwrap_or_default();
    Record {
        revision: number,
        prune,
        upgrade: Some(true),
        // As `helm rollback`: the CRDs are left as they are.
        crds: Some(CrdPolicy::Skip),
        rollback_to: Some(target.revision),
        went_on_from: None,
        tests: Vec::new(),
        info: Info {
            status: HelmStatus::PendingRollback,
            description: format!("Rollback to {}", target.revision),
            first_deployed: target.info.first_deployed.clone(),
            last_deployed: now.0.to_string(),
        },
        ..target.clone()
    }
}

/// Why a rollback starts: asked for, or a remediation of a failure.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    Requested { token: String },
    Failure { failed: i64, message: String },
}

/// Starts rollback revision `revision` (whose record [`rollback_record`] made): phase
/// RollingBack, every stage Pending, and `status.rollback` holding back the spec at
/// `generation` and `digest`.
pub fn begin_rollback(
    revision: &Revision,
    record: &Record,
    status: &SequencedReleaseStatus,
    generation: Option<i64>,
    digest: &str,
    cause: &Cause,
    now: &Time,
) -> (SequencedReleaseStatus, Note) {
    let to = record.rollback_to.unwrap_or_default();
    let from = status.revision;
    let mut st = install::begin(
        revision,
        record.revision,
        status,
        generation,
        &record.digest,
        record.chart_version.as_deref(),
        now,
    );
    install::with_artifact(&mut st, record.chart_artifact.as_ref());
    st.failures = None;
    st.phase = Some(ReleasePhase::RollingBack);
    if let Some(entry) = st.history.first_mut() {
        entry.phase = ReleasePhase::RollingBack;
    }
    let message = match cause {
        Cause::Requested { token } => {
            st.last_handled_rollback_at = Some(token.clone());
            format!("rolling back to revision {to}, as requested")
        }
        Cause::Failure { failed, message } => {
            st.remediation = Some(RemediationStatus {
                failed_revision: *failed,
                action: RemediationAction::Rollback,
                failure: Some(message.clone()),
            });
            format!("rolling back to revision {to}: revision {failed} failed: {message}")
        }
    };
    st.rollback = Some(RollbackStatus {
        revision: record.revision,
        to,
        from,
        requested: matches!(cause, Cause::Requested { .. }),
        generation,
        digest: Some(digest.to_string()),
    });
    st.message = Some(message.clone());
    progressing(&mut st, Reason::RollingBack, &message, now);
    let note = match cause {
        Cause::Requested { .. } => Note::normal(EventReason::RollbackStarted, message),
        Cause::Failure { .. } => Note::warning(EventReason::RollbackStarted, message),
    };
    (st, note)
}

/// What the end of an operation changes beyond the step's status: the records' statuses (the
/// revision `deployed` or `failed`, the one deployed before it `superseded`), and for a
/// rollback that is Ready, a status that says what it holds back, and a `RolledBack` event.
pub fn finish(
    before: &SequencedReleaseStatus,
    after: &mut SequencedReleaseStatus,
    record: &Record,
    events: &mut Vec<Note>,
    now: &Time,
) -> Vec<RecordUpdate> {
    let number = record.revision;
    // A test run on request: the record keeps its status, and the run (`helm status`).
    if before.phase == Some(ReleasePhase::Testing)
        && after.phase == Some(ReleasePhase::Ready)
        && after.revision == Some(number)
    {
        return vec![RecordUpdate {
            tests: Some(after.tests.clone()),
            ..RecordUpdate::new(number, record.info.status, record.info.description.clone())
        }];
    }
    let in_progress = matches!(
        before.phase,
        Some(ReleasePhase::Deploying | ReleasePhase::RollingBack)
    );
    if !in_progress || after.revision != Some(number) {
        return Vec::new();
    }
    // A drift correction re-applies a revision that had finished: its record stays as it was.
    let correcting = before
        .history
        .iter()
        .any(|h| h.revision == number && h.finished_at.is_some());
    if correcting {
        return Vec::new();
    }
    let operation = match record.rollback_to {
        Some(to) => format!("Rollback to {to}"),
        None if record.is_upgrade() => "Upgrade".to_string(),
        None => "Install".to_string(),
    };
    match after.phase {
        Some(ReleasePhase::Ready) => {
            let mut updates = vec![RecordUpdate {
                tests: tested(after),
                ..RecordUpdate::new(
                    number,
                    HelmStatus::Deployed,
                    format!("{operation} complete"),
                )
            }];
            // The first revision that went on from Helm's history supersedes its deployed
            // record, as `helm upgrade` does.
            let previous = last_ready_before(after, number)
                .or_else(|| record.went_on_from.as_ref().and_then(|w| w.base));
            if let Some(previous) = previous {
                updates.push(RecordUpdate {
                    only_from: Some(HelmStatus::Deployed),
                    ..RecordUpdate::new(
                        previous,
                        HelmStatus::Superseded,
                        "Superseded by a later revision".to_string(),
                    )
                });
            }
            if let Some(rollback) = after.rollback.clone().filter(|r| r.revision == number) {
                let message = rolled_back_message(after, &rollback, record);
                after.message = Some(message.clone());
                if rollback.requested {
                    // What was asked for runs: Ready.
                    set_conditions(
                        after,
                        Reason::RolledBack,
                        now,
                        [(true, &message), (false, ""), (false, "")],
                    );
                } else {
                    // The spec's revision failed: not Ready, and Stalled until it changes.
                    held_back(after, &message, now);
                }
                events.push(Note::normal(EventReason::RolledBack, message));
            }
            updates
        }
        Some(ReleasePhase::Failed) => {
            let message = after.message.clone().unwrap_or_default();
            if let Some(rollback) = after.rollback.as_ref().filter(|r| r.revision == number) {
                let message = format!("rollback to revision {} failed: {message}", rollback.to);
                after.message = Some(message);
            }
            vec![RecordUpdate {
                tests: tested(after),
                ..RecordUpdate::new(
                    number,
                    HelmStatus::Failed,
                    format!("{operation} failed: {message}"),
                )
            }]
        }
        _ => Vec::new(),
    }
}

/// The tests the revision ran, for its record: None when it ran none.
fn tested(status: &SequencedReleaseStatus) -> Option<Vec<crate::api::TestStatus>> {
    (!status.tests.is_empty()).then(|| status.tests.clone())
}

/// "rolled back to revision 3 after revision 4 failed: ...; spec generation 7 not applied".
fn rolled_back_message(
    status: &SequencedReleaseStatus,
    rollback: &RollbackStatus,
    record: &Record,
) -> String {
    let mut message = format!("rolled back to revision {}", rollback.to);
    if let Some(remediation) = status.remediation.as_ref().filter(|r| {
        r.action == RemediationAction::Rollback && Some(r.failed_revision) == rollback.from
    }) {
        message.push_str(&format!(
            " after revision {} failed",
            remediation.failed_revision
        ));
        if let Some(failure) = &remediation.failure {
            message.push_str(&format!(": {failure}"));
        }
    }
    let held_back = rollback.digest.as_deref() != Some(record.digest.as_str());
    if held_back {
        match rollback.generation {
            Some(generation) => {
                message.push_str(&format!("; spec generation {generation} not applied"))
            }
            None => message.push_str("; the spec is not applied"),
        }
    }
    message
}

/// The status once the objects of failed revision `failed` are uninstalled
/// (`spec.onFailure: uninstall`, or `rollback` with nothing to roll back to): Failed and Stalled
/// until the spec changes or a reconcile is requested.
pub fn uninstalled_status(
    status: &SequencedReleaseStatus,
    failed: i64,
    now: &Time,
) -> (SequencedReleaseStatus, Note) {
    let failure = status
        .remediation
        .as_ref()
        .and_then(|r| r.failure.clone())
        .unwrap_or_else(|| "it failed".to_string());
    let message = format!(
        "revision {failed} failed: {failure}; its objects were uninstalled (spec.onFailure); \
         change the spec or run `sequenced reconcile` to install again"
    );
    let mut st = status.clone();
    st.phase = Some(ReleasePhase::Failed);
    st.message = Some(message.clone());
    set_stalled(&mut st, Reason::Uninstalled, &message, now);
    (st, Note::warning(EventReason::Uninstalled, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HistoryEntry, SequencedReleaseSpec};
    use std::time::Duration;

    fn release(annotations: &[(&str, &str)]) -> SequencedRelease {
        let mut sr = SequencedRelease::new(
            "shop",
            serde_json::from_value::<SequencedReleaseSpec>(
                serde_json::json!({"chart": {"path": "/c"}}),
            )
            .unwrap(),
        );
        sr.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        sr
    }

    #[test]
    fn requests_are_the_tokens_not_handled_yet_and_force_needs_the_same_token() {
        let handled = SequencedReleaseStatus {
            last_handled_reconcile_at: Some("a".into()),
            last_handled_rollback_at: Some("r".into()),
            ..SequencedReleaseStatus::default()
        };
        let none = requests(&release(&[(RECONCILE_REQUEST_ANNOTATION, "a")]), &handled);
        assert_eq!(none, Requests::default());
        let sr = release(&[
            (RECONCILE_REQUEST_ANNOTATION, "b"),
            (FORCE_REQUEST_ANNOTATION, "a"),
        ]);
        let r = requests(&sr, &handled);
        assert_eq!((r.reconcile.as_deref(), r.force), (Some("b"), false));
        let sr = release(&[
            (RECONCILE_REQUEST_ANNOTATION, "b"),
            (FORCE_REQUEST_ANNOTATION, "b"),
        ]);
        assert!(requests(&sr, &handled).force);
        let sr = release(&[
            (ROLLBACK_REQUEST_ANNOTATION, "s"),
            (ROLLBACK_REVISION_ANNOTATION, "three"),
        ]);
        let rollback = requests(&sr, &handled).rollback.unwrap();
        assert_eq!(
            rollback.revision,
            Err(
                "annotation rollback.sequenced.dev/revision: \"three\" is not a revision number"
                    .into()
            )
        );
        let sr = release(&[(ROLLBACK_REQUEST_ANNOTATION, "r")]);
        assert!(requests(&sr, &handled).rollback.is_none(), "handled");
    }

    fn entry(revision: i64, phase: ReleasePhase) -> HistoryEntry {
        HistoryEntry {
            revision,
            chart_version: None,
            chart_digest: None,
            digest: None,
            phase,
            started_at: None,
            finished_at: None,
            sequenced: true,
            description: None,
        }
    }

    #[test]
    fn remediation_is_due_once_the_retries_of_an_operation_failure_are_spent() {
        let settings = |on_failure, retries| Settings {
            sequenced: true,
            wait: true,
            readiness_timeout: Duration::from_secs(1),
            max_history: 10,
            retries,
            adopt: false,
            timeout: Duration::from_secs(1),
            interval: Duration::from_secs(1),
            disable_hooks: false,
            crds: None,
            on_failure,
            drift: crate::api::DriftDetection::Enabled,
        };
        let failed = SequencedReleaseStatus {
            phase: Some(ReleasePhase::Failed),
            revision: Some(3),
            failures: Some(2),
            history: vec![
                entry(3, ReleasePhase::Failed),
                entry(2, ReleasePhase::Failed),
                entry(1, ReleasePhase::Ready),
            ],
            ..SequencedReleaseStatus::default()
        };
        assert!(remediation_due(&settings(OnFailure::Rollback, 1), &failed));
        assert!(
            !remediation_due(&settings(OnFailure::Rollback, 2), &failed),
            "a retry is left"
        );
        assert!(!remediation_due(&settings(OnFailure::Keep, 0), &failed));
        assert_eq!(last_ready_before(&failed, 3), Some(1));
        // Done once.
        let done = SequencedReleaseStatus {
            remediation: Some(RemediationStatus {
                failed_revision: 3,
                action: RemediationAction::Rollback,
                failure: None,
            }),
            ..failed.clone()
        };
        assert!(!remediation_due(&settings(OnFailure::Rollback, 0), &done));
        // A chart that does not render (no failure counted) is no operation failure.
        let stalled = SequencedReleaseStatus {
            failures: None,
            ..failed.clone()
        };
        assert!(!remediation_due(
            &settings(OnFailure::Uninstall, 0),
            &stalled
        ));
        // A failed rollback is not remediated.
        let rollback = SequencedReleaseStatus {
            rollback: Some(RollbackStatus {
                revision: 3,
                to: 1,
                ..RollbackStatus::default()
            }),
            ..failed
        };
        assert!(!remediation_due(
            &settings(OnFailure::Rollback, 0),
            &rollback
        ));
    }
}
