//! Drift of a Ready release (`spec.driftDetection`): objects of its revision deleted, or fields
//! it manages changed by someone else. The controller finds them; what to do about them is
//! decided here. With `enabled` the layers of the drifted objects are applied again, in order,
//! and the layers that depend on them are checked again (not applied); with `warn` the
//! condition `Drifted` says what differs and nothing is changed.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::install;
use super::status::set_condition;
use super::{Note, Revision};
use crate::api::{
    CHART_CHANGED, ChartArtifact, DRIFTED, DriftCorrection, DriftDetection, EventReason, Reason,
    SequencedReleaseStatus,
};

/// How one object drifted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// It is gone.
    Deleted,
    /// These fields it manages differ from what was applied (`.data.x`, `.spec.replicas`).
    Changed(Vec<String>),
}

/// One drifted object of the revision, by index into its plan's resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drifted {
    pub resource: usize,
    pub drift: Drift,
}

/// What the controller found: the drifted objects (none when everything matches).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriftReport {
    pub drifted: Vec<Drifted>,
}

/// At most this many fields of one object are named in a message.
const MAX_FIELDS: usize = 5;

/// `ConfigMap shop/a deleted`, `ConfigMap shop/b changed: .data.x`.
pub fn describe(revision: &Revision, drifted: &Drifted) -> String {
    let object = match revision.keys.get(drifted.resource) {
        Some(key) => key.to_string(),
        None => format!("resource {}", drifted.resource),
    };
    match &drifted.drift {
        Drift::Deleted => format!("{object} deleted"),
        Drift::Changed(fields) => {
            let mut named = fields
                .iter()
                .take(MAX_FIELDS)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            if fields.len() > MAX_FIELDS {
                named.push_str(&format!(" and {} more", fields.len() - MAX_FIELDS));
            }
            format!("{object} changed: {named}")
        }
    }
}

/// The deployed chart and the one its source serves now, when they differ under one version.
pub fn chart_changed<'a>(
    status: &'a SequencedReleaseStatus,
    fetched: Option<&'a ChartArtifact>,
) -> Option<(&'a ChartArtifact, &'a ChartArtifact)> {
    let deployed = status.chart.as_ref()?;
    let fetched = fetched?;
    (deployed.version.is_some()
        && deployed.version == fetched.version
        && deployed.digest != fetched.digest)
        .then_some((deployed, fetched))
}

/// What a Ready release does when its chart's source serves other bytes under the version the
/// current revision deployed (a version pushed again): the condition `ChartChanged` says so, and
/// an event once. No revision starts for it (what the spec asks for did not change, see
/// `crate::digest`); a reconcile request starts one. The condition goes when the bytes are
/// the deployed ones again, or a revision deploys them. None when nothing changes.
pub fn judge_chart(
    status: &SequencedReleaseStatus,
    fetched: Option<&ChartArtifact>,
    now: &Time,
) -> Option<(SequencedReleaseStatus, Vec<Note>)> {
    let flagged = status.conditions.iter().any(|c| c.type_ == CHART_CHANGED);
    let Some((deployed, fetched)) = chart_changed(status, fetched) else {
        let mut st = status.clone();
        st.conditions.retain(|c| c.type_ != CHART_CHANGED);
        return flagged.then_some((st, Vec::new()));
    };
    let number = status.revision.unwrap_or(0);
    let version = fetched.version.as_deref().unwrap_or_default();
    let message = format!(
        "chart version {version} changed at its source: its archive is now {} (revision {number} \
         deployed {}); no revision is started for it: pin the digest you trust (version: \
         {version}@sha256:…), or request a reconcile (sequenced reconcile) to deploy what the \
         source serves now",
        fetched.digest, deployed.digest
    );
    if status
        .conditions
        .iter()
        .any(|c| c.type_ == CHART_CHANGED && c.message == message)
    {
        return None;
    }
    let mut st = status.clone();
    set_condition(
        &mut st.conditions,
        CHART_CHANGED,
        true,
        Reason::ChartChanged,
        &message,
        st.observed_generation,
        now,
    );
    Some((st, vec![Note::warning(EventReason::ChartChanged, message)]))
}

/// What a Ready release does about `report`: a status to write and the events to publish, or
/// None when nothing changes.
pub fn judge(
    revision: &Revision,
    status: &SequencedReleaseStatus,
    report: &DriftReport,
    now: &Time,
) -> Option<(SequencedReleaseStatus, Vec<Note>)> {
    let flagged = status.conditions.iter().any(|c| c.type_ == DRIFTED);
    if report.drifted.is_empty() {
        // Drift reported before (`warn`) is gone: so is the condition.
        let mut st = status.clone();
        st.conditions.retain(|c| c.type_ != DRIFTED);
        return flagged.then_some((st, Vec::new()));
    }
    let what: Vec<String> = report
        .drifted
        .iter()
        .map(|d| describe(revision, d))
        .collect();
    let number = status.revision.unwrap_or(0);
    match revision.settings.drift {
        DriftDetection::Disabled => None,
        DriftDetection::Warn => {
            let message = format!(
                "revision {number} drifted (spec.driftDetection: warn, not corrected): {}",
                what.join("; ")
            );
            let same = status
                .conditions
                .iter()
                .any(|c| c.type_ == DRIFTED && c.message == message);
            if same {
                return None;
            }
            let mut st = status.clone();
            set_condition(
                &mut st.conditions,
                DRIFTED,
                true,
                Reason::Drifted,
                &message,
                st.observed_generation,
                now,
            );
            Some((st, vec![Note::warning(EventReason::DriftDetected, message)]))
        }
        DriftDetection::Enabled => {
            let layers: BTreeSet<usize> = report
                .drifted
                .iter()
                .filter_map(|d| {
                    revision
                        .plan
                        .layers
                        .iter()
                        .position(|l| l.resources.contains(&d.resource))
                })
                .collect();
            let names: Vec<&str> = layers
                .iter()
                .filter_map(|&i| revision.plan.layers.get(i).map(|l| l.name.as_str()))
                .collect();
            let message = format!(
                "correcting drift of revision {number}: {}; applying layer {} again",
                what.join("; "),
                names.join(", ")
            );
            let mut st = install::correct(revision, status, &layers, &message, now);
            st.conditions.retain(|c| c.type_ != DRIFTED);
            st.last_drift_correction = Some(DriftCorrection {
                time: now.clone(),
                revision: number,
                objects: what,
            });
            Some((st, vec![Note::normal(EventReason::DriftCorrected, message)]))
        }
    }
}
