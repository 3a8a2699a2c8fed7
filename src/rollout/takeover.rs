//! Whose a release name is and where its history stands: the one decision both drivers of
//! sequenced (the operator for a SequencedRelease, the command line for `sequenced upgrade`)
//! take before a revision begins, from the summaries of every record under the name. Pure: the
//! drivers gather the records and how long each stayed unchanged ([`crate::history::Sightings`]),
//! and execute what this answers.
//!
//! The rules (the book's "Moving from Helm" tells them to users):
//! - Only the records after sequenced's own newest one count: older ones, whoever wrote them,
//!   are the history it went on from. A record of Helm's that sequenced took over (marked
//!   `failed`, or given sequenced's part before the first revision of its own) is still Helm's
//!   here, so that a takeover cut short is decided the same way again.
//! - A record of another live sequenced identity (another SequencedRelease, or a release of the
//!   command line) is that identity's: refused, `OwnershipConflict`.
//! - Records Helm wrote (Helm 3's and Helm 4's are one format), or that a SequencedRelease wrote
//!   that no longer exists (an orphan: a release handed back to Helm, an uninstall that kept its
//!   history), are gone on from only with the opt-in (`spec.adopt`; the command line's user
//!   opted in by naming the release). Without it the refusal names the record and the field.
//! - Their newest record `pending-install|upgrade|rollback` (or `uninstalling`): a helm process
//!   may still run. It is waited for until it has stayed unchanged for the bound (Helm's default
//!   `--timeout` of 5m plus an allowance), then marked `failed` ([`TAKEN_OVER`]) and the next
//!   revision begins.
//! - The next revision is the newest + 1. It is an upgrade (upgrade hooks, `spec.crds` of an
//!   upgrade) when a revision was ever deployed (a record `deployed` or `superseded`), pruning
//!   what the last deployed manifest has (failing that, as `helm upgrade` falls back, the newest
//!   failed or superseded one's); an install again after a failed first install (only `failed`
//!   records) and after an uninstall that kept its history.
//! - Helm records stored by another driver (ConfigMaps) cannot be continued: refused, naming it.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::api::Reason;
use crate::history::{HelmStatus, RecordSummary, Writer};

/// How long a pending record of Helm's must stay unchanged before it is taken over, unless the
/// driver is told otherwise (`--take-pending-after`): Helm's default `--timeout` (5m) and a
/// minute more.
pub const DEFAULT_PENDING_BOUND: Duration = Duration::from_secs(6 * 60);

/// The description a pending record taken over gets, when it is marked `failed`.
pub const TAKEN_OVER: &str =
    "not finished by the helm process that began it; taken over by sequenced";

/// One record under the release name, as the driver saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub summary: RecordSummary,
    /// How long this process has seen it at its resourceVersion.
    pub unchanged_for: Duration,
    /// For a record the operator wrote for another SequencedRelease: that SequencedRelease no
    /// longer exists.
    pub owner_gone: bool,
}

/// The question: who asks, about which records, with which opt-in.
#[derive(Debug, Clone)]
pub struct Question<'a> {
    /// The identity that asks, `namespace/name` (the owner annotation it writes).
    pub me: &'a str,
    /// The release name and the namespace of its records, for messages.
    pub release_name: &'a str,
    pub namespace: &'a str,
    /// Every record Secret under the release name, in any order.
    pub records: &'a [Seen],
    /// Helm's records of the name kept by another storage driver (`ConfigMap`), when seen.
    pub other_driver: Option<&'a str>,
    /// Whether the driver may go on from a release it did not write.
    pub opted_in: bool,
    /// The setting that opts in, as a refusal names it (`spec.adopt: true`).
    pub opt_in: &'a str,
    /// How long a pending record must stay unchanged before it is taken over.
    pub bound: Duration,
}

/// Where the history of the release name stands for the one that asks.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Nothing to take over: no record, or sequenced's own are the newest. `revisions` are
    /// every revision of the history (older records of Helm's it went on from included).
    Ours { revisions: BTreeSet<i64> },
    /// Go on from a history sequenced did not write.
    Continue(Continuation),
    /// The newest record is pending and may still be a helm process's: wait.
    WaitPending(Pending),
    /// The newest record is pending and stayed unchanged for the bound: mark it `failed`
    /// ([`TAKEN_OVER`]), only while it is still at the resourceVersion seen, then go on.
    TakePending {
        pending: Pending,
        then: Continuation,
    },
    /// Not ours to go on from.
    Refuse { reason: Reason, message: String },
}

/// A pending record of Helm's.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub revision: i64,
    pub status: HelmStatus,
    /// Its Secret and the resourceVersion it was seen unchanged at.
    pub record: String,
    pub resource_version: String,
    /// How long until it is taken over (zero once it may be).
    pub remaining: Duration,
}

/// Whose history is gone on from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Helm's.
    Helm,
    /// A SequencedRelease's that no longer exists, `namespace/name`.
    Orphan(String),
}

/// How a revision goes on from a history sequenced did not write.
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    pub origin: Origin,
    /// The newest revision of the history: the first of sequenced's is the next.
    pub last: i64,
    /// Its status, as found (before a pending one was marked failed).
    pub last_status: HelmStatus,
    /// Whether the revision is an upgrade (upgrade hooks, `.Release.IsUpgrade`, the CRD policy
    /// of an upgrade), else an install again.
    pub upgrade: bool,
    /// The record the upgrade goes on from: its manifest is what the new revision prunes
    /// against, its `deployed` status becomes `superseded` when the new one is deployed.
    pub base: Option<i64>,
    /// Every revision of the history, the pending one taken over included.
    pub revisions: BTreeSet<i64>,
}

impl Continuation {
    /// `went on from Helm release shop at revision 3 (its revision 2 was deployed)`, as the
    /// status and an event say it; `revision` is sequenced's first.
    pub fn message(&self, release_name: &str, revision: i64) -> String {
        let whose = match &self.origin {
            Origin::Helm => format!("Helm release {release_name}"),
            Origin::Orphan(owner) => format!(
                "the records of release {release_name} left by SequencedRelease {owner}, which no longer exists,"
            ),
        };
        format!(
            "went on from {whose} at revision {revision} (its revision {} was {}; this one {})",
            self.last,
            self.last_status.as_str(),
            if self.upgrade {
                "is an upgrade"
            } else {
                "installs again"
            }
        )
    }
}

impl Pending {
    /// `took over a pending-upgrade record of revision 4`.
    pub fn taken_message(&self) -> String {
        format!(
            "took over a {} record of revision {} (Secret {}): {TAKEN_OVER}; marked failed",
            self.status.as_str(),
            self.revision,
            self.record
        )
    }

    /// What the status says while it is waited for; `at` is when it will be taken over.
    pub fn waiting_message(&self, release_name: &str, at: &str) -> String {
        format!(
            "waiting for Helm release {release_name}: its last record (revision {}, Secret {}) is {}, so a helm process may still be running; unless it changes, it is taken over at {at}",
            self.revision,
            self.record,
            self.status.as_str()
        )
    }
}

/// Whether an uninstall may still run on the record: held as a pending one is.
fn held(status: HelmStatus) -> bool {
    status.is_pending() || status == HelmStatus::Uninstalling
}

/// The decision (see the module's rules).
pub fn decide(q: &Question) -> Standing {
    let mut records: Vec<&Seen> = q.records.iter().collect();
    records.sort_by_key(|r| r.summary.revision);
    let all: BTreeSet<i64> = records.iter().map(|r| r.summary.revision).collect();
    let name = q.release_name;
    let ns = q.namespace;
    if let Some(driver) = q.other_driver {
        return Standing::Refuse {
            reason: Reason::HelmStorageUnsupported,
            message: format!(
                "release name {name} in namespace {ns} is a Helm release kept by Helm's {driver} storage driver (HELM_DRIVER={}): sequenced reads and writes Helm's records as Secrets only (Helm's default driver); move the release to the Secret driver, or set spec.releaseName to another name",
                driver.to_lowercase()
            ),
        };
    }
    let mine = records
        .iter()
        .rposition(|r| r.summary.written_by(q.me))
        .map_or(0, |i| i + 1);
    let later = &records[mine..];
    let Some(newest) = later.last() else {
        return Standing::Ours { revisions: all };
    };
    // Another identity of sequenced, alive: its name.
    if let Some(other) = later.iter().find_map(|r| {
        let owner = r.summary.owner.as_deref().filter(|o| *o != q.me)?;
        match r.summary.writer {
            Writer::Cli => Some(format!(
                "the command line's release {owner} (sequenced upgrade) has its records (Secret {})",
                r.summary.name
            )),
            _ if !r.owner_gone => Some(format!(
                "SequencedRelease {owner} has its records (Secret {})",
                r.summary.name
            )),
            _ => None,
        }
    }) {
        return Standing::Refuse {
            reason: Reason::OwnershipConflict,
            message: format!(
                "release name {name} is taken in namespace {ns}: {other}; set spec.releaseName to another name"
            ),
        };
    }
    // Helm's history (records of Helm's, taken over by us or not), or a gone release's.
    let origin = later
        .iter()
        .rev()
        .find_map(|r| {
            let owner = r.summary.owner.as_deref().filter(|o| *o != q.me)?;
            Some(Origin::Orphan(owner.to_string()))
        })
        .unwrap_or(Origin::Helm);
    let last = newest.summary.revision;
    if !q.opted_in {
        let whose = match &origin {
            Origin::Helm => format!(
                "belongs to a Helm release (its last record {}, revision {last}, {})",
                newest.summary.name,
                newest.summary.status.as_str()
            ),
            Origin::Orphan(owner) => format!(
                "has the records of SequencedRelease {owner}, which no longer exists (its last record {}, revision {last}, {})",
                newest.summary.name,
                newest.summary.status.as_str()
            ),
        };
        return Standing::Refuse {
            reason: Reason::OwnershipConflict,
            message: format!(
                "release name {name} in namespace {ns} {whose}; set {} to go on from it at revision {}, or spec.releaseName to another name",
                q.opt_in,
                last + 1
            ),
        };
    }
    if held(newest.summary.status) {
        let pending = Pending {
            revision: last,
            status: newest.summary.status,
            record: newest.summary.name.clone(),
            resource_version: newest.summary.resource_version.clone(),
            remaining: q.bound.saturating_sub(newest.unchanged_for),
        };
        if !pending.remaining.is_zero() {
            return Standing::WaitPending(pending);
        }
        let before: Vec<&Seen> = records[..records.len() - 1].to_vec();
        let uninstalling = newest.summary.status == HelmStatus::Uninstalling;
        let then = continuation(&before, origin, newest, all, uninstalling);
        return Standing::TakePending { pending, then };
    }
    Standing::Continue(continuation(&records, origin, newest, all, false))
}

/// How to go on after `newest`, from the `history` judged (the pending record taken over left
/// out): see the module's rules.
fn continuation(
    history: &[&Seen],
    origin: Origin,
    newest: &Seen,
    revisions: BTreeSet<i64>,
    after_uninstall: bool,
) -> Continuation {
    let uninstalled = after_uninstall
        || history
            .last()
            .is_some_and(|r| r.summary.status == HelmStatus::Uninstalled);
    let ever_deployed = history.iter().any(|r| {
        matches!(
            r.summary.status,
            HelmStatus::Deployed | HelmStatus::Superseded
        )
    });
    let upgrade = ever_deployed && !uninstalled;
    let base = upgrade
        .then(|| {
            history
                .iter()
                .rev()
                .find(|r| r.summary.status == HelmStatus::Deployed)
                .or_else(|| {
                    history.last().filter(|r| {
                        matches!(
                            r.summary.status,
                            HelmStatus::Failed | HelmStatus::Superseded
                        )
                    })
                })
                .map(|r| r.summary.revision)
        })
        .flatten();
    Continuation {
        origin,
        last: newest.summary.revision,
        last_status: newest.summary.status,
        upgrade,
        base,
        revisions,
    }
}
