//! An uninstall, stepped through the uninstall steps of the last revision's inventory: a step is
//! deleted once the steps it comes after are gone, and waits until its objects have disappeared.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::install::{layer_label, settle_deletion};
use super::status::progressing;
use super::{Note, Observations, Outcome, Wanted};
use crate::api::{
    EventReason, Identity, LayerPhase, LayerStatus, ObjectKey, Reason, ReleasePhase,
    SequencedReleaseStatus,
};
use crate::history::Inventory;

/// The outcome of [`uninstall_step`].
#[derive(Debug, Clone, PartialEq)]
pub struct UninstallStep {
    /// For each step that starts now, by index into the inventory's steps: its objects that
    /// still exist and are ours, in delete order.
    pub deletes: Vec<(usize, Vec<ObjectKey>)>,
    pub status: SequencedReleaseStatus,
    pub events: Vec<Note>,
    /// Every step is deleted: the finalizer can go.
    pub finished: bool,
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
        .map(|s| LayerStatus {
            chart: s.chart.clone(),
            name: s.name.clone(),
            resources: i32::try_from(s.objects.len()).unwrap_or(i32::MAX),
            ..LayerStatus::default()
        })
        .collect();
    let message = "uninstalling".to_string();
    status.message = Some(message.clone());
    progressing(&mut status, Reason::Uninstalling, &message, now);
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

/// One step of an uninstall: delete each step once the steps it comes after are gone, and wait
/// until its objects have disappeared. `sequenced: false` deletes everything at once. The
/// objects of a step must be observed before it starts ([`Outcome::Need`]): only those that
/// still exist and are ours are deleted.
pub fn uninstall_step(
    inventory: &Inventory,
    sequenced: bool,
    status: &SequencedReleaseStatus,
    observed: &Observations,
    me: &Identity,
    now: &Time,
) -> Outcome<UninstallStep> {
    let mut st = if uninstall_layout_matches(inventory, status) {
        status.clone()
    } else {
        begin_uninstall(inventory, status, now)
    };
    // What is being deleted is waited on until it is gone.
    let deleting: Vec<ObjectKey> = st
        .layers
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
    let mut events = Vec::new();
    for (i, step) in inventory.steps.iter().enumerate() {
        if st.layers[i].phase != LayerPhase::Deleting {
            continue;
        }
        if settle_deletion(
            &mut st.layers[i],
            &step.objects,
            |k| observed.ours(k, me),
            now,
        ) {
            let message = format!("Layer {} is deleted", layer_label(&st.layers[i]));
            events.push(Note::normal(EventReason::LayerDeleted, message));
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
                starting.push(i);
                let layer = &mut st.layers[i];
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
                let label = layer_label(&st.layers[a]);
                st.layers[i].message = Some(format!("waiting for layer {label} to be deleted"));
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
    progressing(&mut st, Reason::Uninstalling, &message, now);
    Outcome::Decided(UninstallStep {
        deletes,
        status: st,
        events,
        finished,
    })
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

/// Deleting step `step` failed: the status says why; the uninstall goes on from there when it
/// is tried again.
pub fn fail_delete(step: &UninstallStep, message: &str) -> SequencedReleaseStatus {
    let mut status = step.status.clone();
    status.message = Some(message.to_string());
    status
}
