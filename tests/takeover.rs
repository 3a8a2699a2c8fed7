//! The takeover decision (`rollout::takeover::decide`) as table tests: whose a release name is
//! and where its history stands, from the summaries of its records, for the operator and the
//! command line alike. Pure: each case runs in microseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use sequenced::api::{DRIVER_ANNOTATION, DRIVER_CLI, DRIVER_HELM, OWNER_ANNOTATION, Reason};
use sequenced::history::{HelmStatus, RecordSummary};
use sequenced::rollout::takeover::{
    Continuation, DEFAULT_PENDING_BOUND, Origin, Pending, Question, Seen, Standing, decide,
};

const ME: &str = "apps/shop";

/// A record of revision `revision` with `status`, written by `owner` (None: Helm), unchanged
/// for `minutes`.
fn record(revision: i64, status: &str, owner: Option<&str>, minutes: u64) -> Seen {
    let labels = BTreeMap::from([
        ("owner".to_string(), "helm".to_string()),
        ("name".to_string(), "shop".to_string()),
        ("status".to_string(), status.to_string()),
        ("version".to_string(), revision.to_string()),
    ]);
    let mut annotations = BTreeMap::new();
    if let Some(owner) = owner {
        annotations.insert(OWNER_ANNOTATION.to_string(), owner.to_string());
    }
    Seen {
        summary: RecordSummary::of(
            &format!("sh.helm.release.v1.shop.v{revision}"),
            &labels,
            &annotations,
            &format!("{}", 100 + revision),
        )
        .unwrap(),
        unchanged_for: Duration::from_secs(60 * minutes),
        owner_gone: false,
    }
}

fn helm(revision: i64, status: &str) -> Seen {
    record(revision, status, None, 60)
}

fn ours(revision: i64, status: &str) -> Seen {
    record(revision, status, Some(ME), 60)
}

fn ask(records: &[Seen], opted_in: bool) -> Standing {
    decide(&Question {
        me: ME,
        release_name: "shop",
        namespace: "apps",
        records,
        other_driver: None,
        opted_in,
        opt_in: "spec.adopt: true",
        bound: DEFAULT_PENDING_BOUND,
    })
}

fn revisions(r: &[i64]) -> BTreeSet<i64> {
    r.iter().copied().collect()
}

fn continued(standing: Standing) -> Continuation {
    match standing {
        Standing::Continue(c) => c,
        other => panic!("expected Continue, got {other:?}"),
    }
}

fn refused(standing: Standing) -> (Reason, String) {
    match standing {
        Standing::Refuse { reason, message } => (reason, message),
        other => panic!("expected Refuse, got {other:?}"),
    }
}

#[test]
fn no_records_or_only_ours_is_ours() {
    assert_eq!(
        ask(&[], false),
        Standing::Ours {
            revisions: BTreeSet::new()
        }
    );
    assert_eq!(
        ask(&[ours(2, "deployed"), ours(1, "superseded")], false),
        Standing::Ours {
            revisions: revisions(&[1, 2])
        }
    );
    // Our own pending record is the revision being deployed: the lock decides, not this.
    assert_eq!(
        ask(
            &[
                ours(1, "deployed"),
                record(2, "pending-upgrade", Some(ME), 0)
            ],
            false
        ),
        Standing::Ours {
            revisions: revisions(&[1, 2])
        }
    );
}

#[test]
fn a_helm_release_is_refused_without_the_opt_in_naming_the_record_and_the_field() {
    let (reason, message) = refused(ask(&[helm(1, "superseded"), helm(2, "deployed")], false));
    assert_eq!(reason, Reason::OwnershipConflict);
    assert_eq!(
        message,
        "release name shop in namespace apps belongs to a Helm release (its last record \
         sh.helm.release.v1.shop.v2, revision 2, deployed); set spec.adopt: true to go on from \
         it at revision 3, or spec.releaseName to another name"
    );
}

#[test]
fn a_deployed_helm_release_is_upgraded_at_the_next_revision_pruning_against_the_deployed_one() {
    let c = continued(ask(&[helm(2, "deployed"), helm(1, "superseded")], true));
    assert_eq!(
        c,
        Continuation {
            origin: Origin::Helm,
            last: 2,
            last_status: HelmStatus::Deployed,
            upgrade: true,
            base: Some(2),
            revisions: revisions(&[1, 2]),
        }
    );
    assert_eq!(
        c.message("shop", 3),
        "went on from Helm release shop at revision 3 (its revision 2 was deployed; this one is an upgrade)"
    );
}

#[test]
fn a_pending_helm_record_is_waited_for_then_taken_over() {
    let fresh = [helm(1, "deployed"), record(2, "pending-upgrade", None, 1)];
    let Standing::WaitPending(pending) = ask(&fresh, true) else {
        panic!("a pending record seen for a minute is waited for");
    };
    assert_eq!(
        pending,
        Pending {
            revision: 2,
            status: HelmStatus::PendingUpgrade,
            record: "sh.helm.release.v1.shop.v2".into(),
            resource_version: "102".into(),
            remaining: Duration::from_secs(5 * 60),
        }
    );
    assert_eq!(
        pending.waiting_message("shop", "2026-11-23T19:20:00Z"),
        "waiting for Helm release shop: its last record (revision 2, Secret \
         sh.helm.release.v1.shop.v2) is pending-upgrade, so a helm process may still be running; \
         unless it changes, it is taken over at 2026-11-23T19:20:00Z"
    );
    // Unchanged for the whole bound: marked failed, and the next revision upgrades from the
    // deployed revision 1.
    let stale = [helm(1, "deployed"), record(2, "pending-upgrade", None, 6)];
    let Standing::TakePending { pending, then } = ask(&stale, true) else {
        panic!("a pending record unchanged for the bound is taken over");
    };
    assert_eq!(pending.remaining, Duration::ZERO);
    assert!(
        pending
            .taken_message()
            .starts_with("took over a pending-upgrade record of revision 2"),
        "{}",
        pending.taken_message()
    );
    assert_eq!(
        then,
        Continuation {
            origin: Origin::Helm,
            last: 2,
            last_status: HelmStatus::PendingUpgrade,
            upgrade: true,
            base: Some(1),
            revisions: revisions(&[1, 2]),
        }
    );
    // Without the opt-in, a pending record is refused like any other of Helm's.
    assert_eq!(refused(ask(&stale, false)).0, Reason::OwnershipConflict);
}

#[test]
fn every_pending_status_and_a_killed_uninstall_are_held() {
    for status in ["pending-install", "pending-rollback", "uninstalling"] {
        let records = [record(1, status, None, 2)];
        assert!(
            matches!(ask(&records, true), Standing::WaitPending(_)),
            "{status}"
        );
        let records = [record(1, status, None, 7)];
        let Standing::TakePending { then, .. } = ask(&records, true) else {
            panic!("{status} taken over after the bound");
        };
        // Nothing was ever deployed (or it was being uninstalled): an install again.
        assert!(!then.upgrade && then.base.is_none(), "{status}: {then:?}");
    }
}

#[test]
fn a_failed_first_install_is_installed_again() {
    for records in [
        vec![helm(1, "failed")],
        vec![helm(1, "failed"), helm(2, "failed")],
    ] {
        let c = continued(ask(&records, true));
        assert!(!c.upgrade, "{records:?}");
        assert_eq!(c.base, None);
        assert_eq!(c.last, records.len() as i64);
    }
}

#[test]
fn a_failed_upgrade_upgrades_from_the_deployed_revision_as_helm_upgrade_does() {
    let c = continued(ask(&[helm(1, "deployed"), helm(2, "failed")], true));
    assert_eq!((c.upgrade, c.base, c.last), (true, Some(1), 2));
    // No deployed record left (helm's --history-max dropped it): the newest failed or
    // superseded one, as `helm upgrade` falls back to the last release.
    let c = continued(ask(&[helm(4, "superseded"), helm(5, "failed")], true));
    assert_eq!((c.upgrade, c.base, c.last), (true, Some(5), 5));
}

#[test]
fn an_uninstall_that_kept_its_history_is_installed_again() {
    let c = continued(ask(&[helm(1, "superseded"), helm(2, "uninstalled")], true));
    assert_eq!((c.upgrade, c.base, c.last), (false, None, 2));
}

#[test]
fn another_live_identitys_records_are_its_own() {
    let other = [record(1, "deployed", Some("apps/other"), 60)];
    let (reason, message) = refused(ask(&other, true));
    assert_eq!(reason, Reason::OwnershipConflict);
    assert_eq!(
        message,
        "release name shop is taken in namespace apps: SequencedRelease apps/other has its \
         records (Secret sh.helm.release.v1.shop.v1); set spec.releaseName to another name"
    );
    // The command line's, even if no SequencedRelease of that name exists.
    let mut cli = record(1, "deployed", Some("apps/shop-cli"), 60);
    cli.owner_gone = true;
    let labels = BTreeMap::from([
        ("status".to_string(), "deployed".to_string()),
        ("version".to_string(), "1".to_string()),
    ]);
    let annotations = BTreeMap::from([
        (OWNER_ANNOTATION.to_string(), "apps/shop-cli".to_string()),
        (DRIVER_ANNOTATION.to_string(), DRIVER_CLI.to_string()),
    ]);
    cli.summary =
        RecordSummary::of("sh.helm.release.v1.shop.v1", &labels, &annotations, "1").unwrap();
    let (_, message) = refused(ask(&[cli], true));
    assert!(
        message.contains("the command line's release apps/shop-cli"),
        "{message}"
    );
}

#[test]
fn records_of_a_sequenced_release_that_no_longer_exists_are_an_orphans() {
    let mut gone = record(3, "deployed", Some("apps/old"), 60);
    gone.owner_gone = true;
    let records = [helm(1, "superseded"), helm(2, "superseded"), gone];
    let (reason, message) = refused(ask(&records, false));
    assert_eq!(reason, Reason::OwnershipConflict);
    assert!(
        message.contains("SequencedRelease apps/old, which no longer exists")
            && message.contains("set spec.adopt: true"),
        "{message}"
    );
    let c = continued(ask(&records, true));
    assert_eq!(c.origin, Origin::Orphan("apps/old".into()));
    assert_eq!((c.last, c.base, c.upgrade), (3, Some(3), true));
}

#[test]
fn only_records_after_our_newest_count() {
    // Helm's older records are the history we went on from: ours.
    let records = [
        helm(1, "superseded"),
        helm(2, "superseded"),
        ours(3, "deployed"),
    ];
    assert_eq!(
        ask(&records, false),
        Standing::Ours {
            revisions: revisions(&[1, 2, 3])
        }
    );
    // A `helm upgrade` run after ours: a Helm release again, continued only with the opt-in.
    let records = [ours(1, "superseded"), helm(2, "deployed")];
    assert_eq!(refused(ask(&records, false)).0, Reason::OwnershipConflict);
    let c = continued(ask(&records, true));
    assert_eq!((c.last, c.base, c.upgrade), (2, Some(2), true));
    assert_eq!(c.revisions, revisions(&[1, 2]));
}

#[test]
fn records_of_helms_we_took_over_before_our_first_revision_are_still_helms() {
    // A takeover cut short (the controller killed after marking the pending record failed and
    // taking Helm's records, before its own revision): decided again the same way.
    let taken = |revision: i64, status: &str| {
        let mut seen = record(revision, status, Some(ME), 60);
        let labels = BTreeMap::from([
            ("status".to_string(), status.to_string()),
            ("version".to_string(), revision.to_string()),
        ]);
        let annotations = BTreeMap::from([
            (OWNER_ANNOTATION.to_string(), ME.to_string()),
            (DRIVER_ANNOTATION.to_string(), DRIVER_HELM.to_string()),
        ]);
        seen.summary = RecordSummary::of(&seen.summary.name, &labels, &annotations, "7").unwrap();
        seen
    };
    let c = continued(ask(&[taken(1, "deployed"), taken(2, "failed")], true));
    assert_eq!(
        (c.origin, c.last, c.base, c.upgrade),
        (Origin::Helm, 2, Some(1), true)
    );
    // Once our own revision is written, they are the history we went on from.
    assert_eq!(
        ask(
            &[
                taken(1, "superseded"),
                taken(2, "failed"),
                ours(3, "deployed")
            ],
            false
        ),
        Standing::Ours {
            revisions: revisions(&[1, 2, 3])
        }
    );
}

#[test]
fn another_storage_driver_is_refused_naming_it() {
    let standing = decide(&Question {
        me: ME,
        release_name: "shop",
        namespace: "apps",
        records: &[],
        other_driver: Some("ConfigMap"),
        opted_in: true,
        opt_in: "spec.adopt: true",
        bound: DEFAULT_PENDING_BOUND,
    });
    let (reason, message) = refused(standing);
    assert_eq!(reason, Reason::HelmStorageUnsupported);
    assert!(
        message.contains("Helm's ConfigMap storage driver (HELM_DRIVER=configmap)"),
        "{message}"
    );
}
