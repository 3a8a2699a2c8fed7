//! The reasons users read: in the `Ready`, `Reconciling` and `Stalled` conditions, and on the
//! Events recorded on a release. One enum each, so that a reason is never a string literal
//! somewhere in the controller.

use std::fmt;

/// The reason of a release's conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    // An operation in progress, or done.
    /// A revision is being deployed.
    Progressing,
    /// The revision is deployed and ready.
    Succeeded,
    /// A `dependsOn` release is not Ready yet.
    DependencyNotReady,
    /// A failed operation is tried again after a delay (`spec.retries`).
    RetryScheduled,
    /// The controller stopped in the middle of an operation; the next one resumes it.
    Interrupted,
    /// The release is being uninstalled.
    Uninstalling,
    /// An earlier revision is being re-applied (`sequenced rollback`, `spec.onFailure: rollback`).
    RollingBack,
    /// The release runs a revision rolled back to; its spec is held back.
    RolledBack,
    /// A failed revision's objects were uninstalled (`spec.onFailure: uninstall`).
    Uninstalled,
    /// Every Helm test of the last test run passed (condition `TestSuccess`).
    TestSucceeded,
    /// A Helm test failed (condition `TestSuccess`; and `Ready`, when the failure fails the
    /// revision).
    TestFailed,
    /// Objects of the release were changed or deleted by someone else
    /// (`spec.driftDetection`): being corrected, or reported only (`warn`).
    Drifted,
    /// The chart's source serves other bytes under the version the current revision deployed
    /// (condition `ChartChanged`): no revision is started for it.
    ChartChanged,

    // Failures that only a change of the spec (or chart) can fix: never retried.
    /// The spec cannot be used: a missing chart path, a missing `valuesFrom` object or key.
    InvalidSpec,
    /// The chart cannot be loaded.
    InvalidChart,
    /// `helm template` failed.
    RenderFailed,
    /// The chart's sequencing cannot be planned: a cycle, an unknown layer, a bad annotation.
    PlanFailed,
    /// `dependsOn` releases form a cycle.
    DependencyCycle,
    /// The spec refers outside the release's namespace (`targetNamespace`, `dependsOn`) while
    /// the controller runs with `--no-cross-namespace-refs`.
    CrossNamespaceRef,
    /// The chart has objects of a kind no API server serves, and no CRD of the chart defines
    /// it (as `helm install` refuses it: "ensure CRDs are installed first"). The release goes on
    /// by itself once the kind is served.
    UnknownKind,

    // Failures of an operation: retried `spec.retries` times.
    /// A resource failed or was not ready within its readiness timeout.
    ReadinessFailed,
    /// An object belongs to another release, or to none without `spec.adopt`.
    OwnershipConflict,
    /// The API server refused an object.
    ApplyFailed,
    /// The service account the release acts as may not do what the chart needs.
    Forbidden,
    /// The API server refused a deletion.
    DeleteFailed,
    /// A Helm hook failed, or was not done within `spec.timeout`.
    HookFailed,
    /// The operation (install, upgrade, rollback, uninstall) did not finish within
    /// `spec.timeout`.
    Timeout,

    // Transient: retried with backoff, and said from the second failure on.
    /// The chart could not be downloaded.
    ChartUnavailable,
    /// A reconcile failed (an API error, helm that did not run): tried again with backoff; the
    /// conditions name what failed from the second failure in a row on.
    ReconcileFailed,
    /// A kind the release needs belongs to an API group the API server cannot serve now (an
    /// aggregated API whose backend is down): the release waits for it.
    GroupUnavailable,
    /// The chart's repository or registry (or an address it led to) is not an allowed chart
    /// source: `--chart-source-allow`, `--chart-source-deny`, or, in multi-tenant mode, an
    /// address that is not public.
    SourceNotAllowed,
    /// `helm template` printed more than `--render-output-limit`: helm was stopped.
    RenderTooLarge,
    /// `helm template` (or `helm pull`) did not finish in time several times in a row: the
    /// release is looked at again at its interval instead of at once.
    RenderTimeout,
    /// An uninstall's release record is missing and the release's objects could not all be
    /// found by their owner annotation: the uninstall waits until they can be, or until a
    /// person removes the finalizer.
    RecordMissing,

    /// `spec.postRenderers` could not be applied to the rendered chart: kustomize refused a
    /// patch or an image (never retried until the spec changes), or kubectl is missing.
    PostRenderFailed,
    /// `spec.kubeConfig` cannot be used: its Secret or key is missing, it does not parse, it
    /// names no cluster, or it asks for what the operator refuses (exec plugins, auth
    /// providers, files of the operator's file system). Never retried until the spec or the
    /// Secret changes.
    InvalidKubeConfig,
    /// The remote cluster of `spec.kubeConfig` does not answer (or answers only errors of its
    /// own): the release waits for it, and goes on by itself when it answers again.
    RemoteClusterUnreachable,
    /// The release name's last Helm record is `pending-install`, `pending-upgrade` or
    /// `pending-rollback` (or `uninstalling`): a helm process may still be running it. The
    /// release waits until the record has stayed unchanged for the bound (`--take-pending-after`,
    /// 6m), then marks it failed and goes on; the message says when.
    HelmOperationPending,
    /// The release name is a Helm release kept by another storage driver of Helm (ConfigMaps);
    /// sequenced reads and writes Helm's records as Secrets only. Not retried until the spec
    /// changes.
    HelmStorageUnsupported,
    /// The chart is not the one the spec trusts: its signature does not verify against the
    /// keys of `spec.chart.verify` (or it has none), or it is not the one a `@sha256:` pin
    /// names. Nothing of it is rendered or applied; never retried until the spec, its keys or
    /// the chart change.
    VerificationFailed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Progressing => "Progressing",
            Reason::Succeeded => "Succeeded",
            Reason::DependencyNotReady => "DependencyNotReady",
            Reason::RetryScheduled => "RetryScheduled",
            Reason::Interrupted => "Interrupted",
            Reason::Uninstalling => "Uninstalling",
            Reason::RollingBack => "RollingBack",
            Reason::RolledBack => "RolledBack",
            Reason::Drifted => "Drifted",
            Reason::ChartChanged => "ChartChanged",
            Reason::TestSucceeded => "TestSucceeded",
            Reason::TestFailed => "TestFailed",
            Reason::Timeout => "Timeout",
            Reason::Uninstalled => "Uninstalled",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::InvalidChart => "InvalidChart",
            Reason::RenderFailed => "RenderFailed",
            Reason::PlanFailed => "PlanFailed",
            Reason::DependencyCycle => "DependencyCycle",
            Reason::CrossNamespaceRef => "CrossNamespaceRef",
            Reason::UnknownKind => "UnknownKind",
            Reason::ReconcileFailed => "ReconcileFailed",
            Reason::GroupUnavailable => "GroupUnavailable",
            Reason::Forbidden => "Forbidden",
            Reason::ReadinessFailed => "ReadinessFailed",
            Reason::OwnershipConflict => "OwnershipConflict",
            Reason::ApplyFailed => "ApplyFailed",
            Reason::DeleteFailed => "DeleteFailed",
            Reason::HookFailed => "HookFailed",
            Reason::ChartUnavailable => "ChartUnavailable",
            Reason::SourceNotAllowed => "SourceNotAllowed",
            Reason::RenderTooLarge => "RenderTooLarge",
            Reason::RenderTimeout => "RenderTimeout",
            Reason::RecordMissing => "RecordMissing",
            Reason::PostRenderFailed => "PostRenderFailed",
            Reason::InvalidKubeConfig => "InvalidKubeConfig",
            Reason::RemoteClusterUnreachable => "RemoteClusterUnreachable",
            Reason::HelmOperationPending => "HelmOperationPending",
            Reason::HelmStorageUnsupported => "HelmStorageUnsupported",
            Reason::VerificationFailed => "VerificationFailed",
        }
    }
}

impl Reason {
    /// The reason named `text` ([`Reason::as_str`]), if it is one.
    pub fn parse(text: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == text)
    }

    /// Every reason.
    pub const ALL: [Reason; 40] = [
        Reason::Progressing,
        Reason::Succeeded,
        Reason::DependencyNotReady,
        Reason::RetryScheduled,
        Reason::Interrupted,
        Reason::Uninstalling,
        Reason::RollingBack,
        Reason::RolledBack,
        Reason::Uninstalled,
        Reason::Drifted,
        Reason::TestSucceeded,
        Reason::TestFailed,
        Reason::InvalidSpec,
        Reason::InvalidChart,
        Reason::RenderFailed,
        Reason::PlanFailed,
        Reason::DependencyCycle,
        Reason::CrossNamespaceRef,
        Reason::UnknownKind,
        Reason::ReadinessFailed,
        Reason::OwnershipConflict,
        Reason::ApplyFailed,
        Reason::Forbidden,
        Reason::DeleteFailed,
        Reason::HookFailed,
        Reason::Timeout,
        Reason::ChartUnavailable,
        Reason::ReconcileFailed,
        Reason::GroupUnavailable,
        Reason::SourceNotAllowed,
        Reason::RenderTooLarge,
        Reason::RenderTimeout,
        Reason::RecordMissing,
        Reason::PostRenderFailed,
        Reason::InvalidKubeConfig,
        Reason::RemoteClusterUnreachable,
        Reason::HelmOperationPending,
        Reason::HelmStorageUnsupported,
        Reason::VerificationFailed,
        Reason::ChartChanged,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reason of an Event recorded on a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventReason {
    LayerStarted,
    LayerReady,
    LayerFailed,
    ReleaseReady,
    PruneStarted,
    LayerDeleting,
    LayerDeleted,
    Stalled,
    LockTakenOver,
    HookStarted,
    HookSucceeded,
    HookFailed,
    RollbackStarted,
    RolledBack,
    RollbackRefused,
    UninstallStarted,
    Uninstalled,
    ReconcileRequested,
    DriftDetected,
    DriftCorrected,
    /// Every Helm test of a test run passed.
    TestSucceeded,
    /// A Helm test failed.
    TestFailed,
    /// A test run asked for with `sequenced test` was refused: the release is not Ready.
    TestRefused,
    /// A reconcile failed again (from the second failure in a row), naming what failed.
    ReconcileFailed,
    /// An uninstall found its release record missing: what it uninstalls instead (the objects
    /// found by their owner annotation).
    RecordMissing,
    /// The remote cluster of `spec.kubeConfig` did not answer (at each failure, from the first).
    RemoteClusterUnreachable,
    /// The first revision went on from the history of a Helm release of the release name
    /// (`spec.adopt: true`): "went on from Helm release NAME at revision N".
    HelmReleaseAdopted,
    /// A pending record of Helm's (`pending-upgrade`, ...) that stayed unchanged for the bound
    /// was marked `failed` before the next revision began.
    HelmRecordTakenOver,
    /// The SequencedRelease was deleted with `spec.deletionPolicy: Orphan`: its objects and
    /// records were left for Helm.
    HandedBackToHelm,
    /// The chart's source serves other bytes under the version the current revision deployed.
    ChartChanged,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::LayerStarted => "LayerStarted",
            EventReason::LayerReady => "LayerReady",
            EventReason::LayerFailed => "LayerFailed",
            EventReason::ReleaseReady => "ReleaseReady",
            EventReason::PruneStarted => "PruneStarted",
            EventReason::LayerDeleting => "LayerDeleting",
            EventReason::LayerDeleted => "LayerDeleted",
            EventReason::Stalled => "Stalled",
            EventReason::LockTakenOver => "LockTakenOver",
            EventReason::HookStarted => "HookStarted",
            EventReason::HookSucceeded => "HookSucceeded",
            EventReason::HookFailed => "HookFailed",
            EventReason::RollbackStarted => "RollbackStarted",
            EventReason::RolledBack => "RolledBack",
            EventReason::RollbackRefused => "RollbackRefused",
            EventReason::UninstallStarted => "UninstallStarted",
            EventReason::ReconcileFailed => "ReconcileFailed",
            EventReason::Uninstalled => "Uninstalled",
            EventReason::ReconcileRequested => "ReconcileRequested",
            EventReason::DriftDetected => "DriftDetected",
            EventReason::DriftCorrected => "DriftCorrected",
            EventReason::TestSucceeded => "TestSucceeded",
            EventReason::TestFailed => "TestFailed",
            EventReason::TestRefused => "TestRefused",
            EventReason::RemoteClusterUnreachable => "RemoteClusterUnreachable",
            EventReason::RecordMissing => "RecordMissing",
            EventReason::ChartChanged => "ChartChanged",
            EventReason::HelmReleaseAdopted => "HelmReleaseAdopted",
            EventReason::HelmRecordTakenOver => "HelmRecordTakenOver",
            EventReason::HandedBackToHelm => "HandedBackToHelm",
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
