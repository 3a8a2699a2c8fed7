//! What the controller does about the API server going away and coming back, besides the health
//! every request reports to (`cluster::health`) and the shard keeping that wakes the releases in
//! progress (`run.rs`): it waits for the server at start, its trigger stream never pauses, and
//! it tells where the time goes after an outage.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::{Error, kube_error};
use crate::api::SequencedRelease;
use crate::cluster::{Health, health};

/// The controller's trigger stream is never held back: each watch waits on its own after an
/// error ([`reconnecting`]), so that the errors of one (the SequencedRelease watch meeting a
/// restarted API server: 410, then 503) do not hold back the wakes of every release, as
/// kube-runtime's trigger backoff would.
#[derive(Debug, Clone, Copy)]
pub(super) struct NoPause;

impl Iterator for NoPause {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for NoPause {
    fn reset(&mut self) {}
}

/// Waits until SequencedReleases are served: an API server that is away or starting is waited
/// for (an operator started with its cluster must not crash-loop); a CRD that is not installed
/// or a refusal of a server that is up ends the run.
pub(super) async fn crd_served(api: &Api<SequencedRelease>, health: &Health) -> Result<(), Error> {
    let what =
        "listing SequencedReleases (is the CRD installed? `sequenced crd | kubectl apply -f -`)";
    let mut failures = 0;
    loop {
        let error = match api.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        let waits = match &error {
            kube::Error::Api(status) => {
                status.code >= 500
                    || status.code == 429
                    || crate::cluster::starting(health, &error).is_some()
            }
            _ => true,
        };
        if !waits {
            return Err(kube_error(what)(error));
        }
        if failures == 0 {
            tracing::warn!(error = %error, "the API server does not serve SequencedReleases yet; waiting");
        }
        tokio::time::sleep(health::reconnect_delay(failures)).await;
        failures = failures.saturating_add(1);
    }
}

/// Where the time goes after an outage: for each release that was in the middle of an
/// operation when the API server answered again, when it was first reconciled and when it took
/// its first step, each logged once (and the second observed in
/// `sequenced_outage_recovery_seconds`).
#[derive(Default)]
pub(crate) struct Recovery {
    /// By release: when the server answered again, and whether it was reconciled since.
    waiting: Mutex<HashMap<ObjectRef<SequencedRelease>, (Instant, bool)>>,
}

impl Recovery {
    /// The server answered again at `back`; `release` was in the middle of an operation.
    pub fn expect(&self, release: ObjectRef<SequencedRelease>, back: Instant) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.insert(release, (back, false));
        }
    }

    /// A reconcile of `release` starts.
    pub fn reconciling(&self, release: &ObjectRef<SequencedRelease>) {
        let Ok(mut waiting) = self.waiting.lock() else {
            return;
        };
        if let Some((back, seen)) = waiting.get_mut(release)
            && !*seen
        {
            *seen = true;
            tracing::info!(release = %release, after_s = back.elapsed().as_secs_f64(), "first reconcile since the API server answered again");
        }
    }

    /// `release` takes a step (`step`); the first since the server answered again is logged and
    /// measured.
    pub fn stepped(
        &self,
        release: &ObjectRef<SequencedRelease>,
        step: &str,
        metrics: &crate::metrics::Metrics,
    ) {
        let Some((back, _)) = self
            .waiting
            .lock()
            .ok()
            .and_then(|mut waiting| waiting.remove(release))
        else {
            return;
        };
        let after = back.elapsed();
        metrics.outage_recovery.observe(after.as_secs_f64());
        tracing::info!(release = %release, after_s = after.as_secs_f64(), step, "first step since the API server answered again");
    }

    pub fn forget(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.remove(release);
        }
    }
}
