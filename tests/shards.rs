//! Releases divided among replicas by shard Leases (DESIGN.md, "Lock and recovery"): the shards
//! spread over the live replicas and follow them as they come and go, each replica watches the
//! objects of its shards only (a label selector), no release is acted on by two replicas, a
//! replica killed in the middle of a layer is taken over, and after an API-server outage the
//! releases in the middle of an operation go on while those with nothing to do send nothing.

use sequenced_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use sequenced::api::shard_of;
use sequenced::api::v1alpha1::SequencedRelease;
use serde_json::json;
use support::charts::{is_ready, pair, release};
use support::operator::{Operator, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// Releases `pair` in namespaces `team-0..n`, each as `pair`; their uids.
async fn create_releases(op: &Operator, dir: &TempDir, n: usize) -> BTreeMap<String, String> {
    let mut uids = BTreeMap::new();
    for i in 0..n {
        let ns = format!("team-{i}");
        op.namespace(&ns).await;
        let sr = op
            .create(&ns, release("pair", &dir.path().join("pair"), json!({})))
            .await;
        uids.insert(ns, sr.metadata.uid.clone().unwrap());
    }
    uids
}

async fn wait_all_ready(op: &Operator, n: usize) -> Vec<SequencedRelease> {
    let mut ready = Vec::new();
    for i in 0..n {
        ready.push(
            op.wait_release(&format!("team-{i}"), "pair", "Ready", is_ready)
                .await,
        );
    }
    ready
}

/// The clients that applied objects of namespace `ns` (server-side applies that succeeded).
fn appliers(op: &Operator, ns: &str) -> BTreeSet<String> {
    op.server
        .requests()
        .iter()
        .filter(|r| {
            r.verb == "apply" && is_write(r) && r.status < 300 && r.namespace.as_deref() == Some(ns)
        })
        .map(|r| r.client.clone().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_spread_over_the_replicas_and_follow_them_from_three_to_two_to_four() {
    within(async {
        let op = Operator::without_controller().await;
        let _kubelet = op.kubelet();
        let a = op.spawn("replica-a", 4);
        let b = op.spawn("replica-b", 4);
        let c = op.spawn("replica-c", 4);
        let counts = op
            .wait_shards_spread(&["replica-a", "replica-b", "replica-c"])
            .await;
        eprintln!("three replicas: {counts:?}");
        assert_eq!(counts.values().sum::<usize>(), 32);
        // Each replica's gauge says what its Leases say (once its round has published them).
        for replica in [&a, &b, &c] {
            let expected = counts[&replica.identity] as i64;
            let published = op
                .server
                .wait_until(Duration::from_secs(10), |_| {
                    replica.metrics.shards_owned.get() == expected
                })
                .await;
            assert!(published, "{}: sequenced_shards_owned", replica.identity);
        }
        let dir = pair();
        let uids = create_releases(&op, &dir, 12).await;
        wait_all_ready(&op, 12).await;

        // A replica stops (a rolling update): it hands its shards over, and the two left share
        // all of them; nothing is left without an owner.
        c.stop().await;
        let counts = op.wait_shards_spread(&["replica-a", "replica-b"]).await;
        eprintln!("two replicas: {counts:?}");

        // Two more start: the shards spread over four, without a restart of the others.
        let d = op.spawn("replica-d", 4);
        let e = op.spawn("replica-e", 4);
        let counts = op
            .wait_shards_spread(&["replica-a", "replica-b", "replica-d", "replica-e"])
            .await;
        eprintln!("four replicas: {counts:?}");
        assert!(b.metrics.shard_moves.with_label_values(&["released"]).get() > 0);

        // Every release is still served: a change of each rolls out, by its shard's owner.
        op.server.clear_requests();
        let holders = op.shard_holders().await;
        for ns in uids.keys() {
            let api = op.releases(ns);
            api.patch(
                "pair",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"values": {"changed": true}}})),
            )
            .await
            .unwrap();
        }
        for (ns, uid) in &uids {
            let sr = op
                .wait_release(ns, "pair", "revision 2 Ready", |sr| {
                    is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
                })
                .await;
            assert_eq!(sr.status.unwrap().revision, Some(2));
            let owner = &holders[&shard_of(uid, 32)];
            let who = appliers(&op, ns);
            assert_eq!(
                who,
                BTreeSet::from([owner.clone()]),
                "{ns}: applied by {who:?}"
            );
        }
        for replica in [a, b, d, e] {
            replica.stop().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_watches_the_objects_of_its_shards_only_and_no_release_is_acted_on_by_two() {
    within(async {
        let op = Operator::without_controller().await;
        let _kubelet = op.kubelet();
        let names = ["replica-a", "replica-b", "replica-c"];
        let replicas: Vec<_> = names.iter().map(|n| op.spawn(n, 4)).collect();
        op.wait_shards_spread(&names).await;
        let holders = op.shard_holders().await;
        let dir = pair();
        let uids = create_releases(&op, &dir, 18).await;
        wait_all_ready(&op, 18).await;

        // The ConfigMap watches: one per replica for its shards (a label selector naming
        // exactly the shards it holds), one for objects of no shard; none over every ConfigMap.
        let mut selected: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for r in op.server.requests() {
            if r.verb != "watch" || r.kind.as_deref() != Some("ConfigMap") || r.namespace.is_some()
            {
                continue;
            }
            let client = r.client.clone().unwrap_or_default();
            let query = urlencoding_decode(&r.query);
            let selector = query
                .split('&')
                .find_map(|p| p.strip_prefix("labelSelector="))
                .unwrap_or_else(|| panic!("{client}: a ConfigMap watch without selector: {query}"));
            if let Some(list) = selector
                .strip_prefix("sequenced.dev/shard in (")
                .and_then(|s| s.strip_suffix(')'))
            {
                selected
                    .entry(client)
                    .or_default()
                    .extend(list.split(',').map(|n| n.parse::<u32>().unwrap()));
            } else {
                assert_eq!(selector, "!sequenced.dev/shard", "{client}");
            }
        }
        for name in names {
            let held: BTreeSet<u32> = holders
                .iter()
                .filter(|(_, h)| h.as_str() == name)
                .map(|(n, _)| *n)
                .collect();
            assert_eq!(
                selected.get(name),
                Some(&held),
                "{name}'s watch selects its shards"
            );
        }

        // Each release by one replica, its shard's owner; its objects carry the shard label.
        let mut by_replica: BTreeMap<String, usize> = BTreeMap::new();
        for (ns, uid) in &uids {
            let shard = shard_of(uid, 32);
            let who = appliers(&op, ns);
            assert_eq!(who, BTreeSet::from([holders[&shard].clone()]), "{ns}");
            *by_replica.entry(holders[&shard].clone()).or_default() += 1;
            let settings = op
                .server
                .object("v1", "ConfigMap", Some(ns), "settings")
                .unwrap();
            assert_eq!(
                settings.pointer("/metadata/labels/sequenced.dev~1shard"),
                Some(&json!(shard.to_string())),
                "{ns}"
            );
        }
        eprintln!("releases by replica: {by_replica:?}");
        for replica in replicas {
            replica.stop().await;
        }
    })
    .await;
}

/// `%2F` and friends back to characters (the selectors' `/`, `(`, `,` and spaces).
fn urlencoding_decode(query: &str) -> String {
    let mut out = Vec::new();
    let bytes = query.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_in_the_middle_of_a_layer_is_taken_over_and_nothing_is_left_behind() {
    within(async {
        let op = Operator::without_controller().await;
        let a = op.spawn("replica-a", 4);
        let b = op.spawn("replica-b", 4);
        op.wait_shards_spread(&["replica-a", "replica-b"]).await;
        let holders = op.shard_holders().await;
        let dir = pair();
        // No kubelet yet: every release waits in its app layer.
        let uids = create_releases(&op, &dir, 8).await;
        let of_a: Vec<&String> = uids
            .iter()
            .filter(|(_, uid)| holders[&shard_of(uid, 32)] == "replica-a")
            .map(|(ns, _)| ns)
            .collect();
        assert!(!of_a.is_empty(), "some release is replica-a's");
        for ns in &of_a {
            op.wait_release(ns, "pair", "waiting for app", |sr| {
                sr.status
                    .as_ref()
                    .and_then(|s| s.lock.as_ref())
                    .and_then(|l| l.holder.as_deref())
                    == Some("replica-a")
                    && op
                        .server
                        .object("apps/v1", "Deployment", Some(ns), "app")
                        .is_some()
            })
            .await;
        }
        // SIGKILL: no hand-over, its Leases stay as they were.
        a.kill().await;
        let counts = op.wait_shards_spread(&["replica-b"]).await;
        assert_eq!(counts["replica-b"], 32);
        let _kubelet = op.kubelet();
        for ns in &of_a {
            let note = op.wait_event(ns, "pair", "LockTakenOver").await;
            assert!(note.contains("replica-a"), "{note}");
        }
        for sr in wait_all_ready(&op, 8).await {
            let status = sr.status.unwrap();
            assert_eq!(status.revision, Some(1), "one revision");
            assert_eq!(status.lock, None, "no lock left");
        }
        assert!(b.metrics.lock_takeovers.get() >= of_a.len() as u64);
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_releases_in_the_middle_of_an_operation_go_on_and_the_others_send_nothing()
{
    within(async {
        let op = Operator::start(4).await;
        let dir = pair();
        // Three releases Ready, then one that waits for its Deployment (no kubelet yet).
        let kubelet = op.kubelet();
        create_releases(&op, &dir, 3).await;
        wait_all_ready(&op, 3).await;
        drop(kubelet);
        op.namespace("busy").await;
        op.create("busy", release("pair", &dir.path().join("pair"), json!({})))
            .await;
        op.wait_object("apps/v1", "Deployment", "busy", "app").await;

        // The API server goes away for longer than the controller's shard Lease (3 s here):
        // the controller stops acting on its shards, its reconciles fail and back off.
        op.server.set_down(true);
        tokio::time::sleep(Duration::from_secs(8)).await;
        op.server.clear_requests();
        op.server.set_down(false);
        let _kubelet = op.kubelet();
        let sr = op.wait_release("busy", "pair", "Ready", is_ready).await;
        assert_eq!(sr.status.unwrap().revision, Some(1));
        // Nothing was written for the releases that had nothing to do.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let herd: Vec<String> = op
            .server
            .requests()
            .iter()
            .filter(|r| {
                is_write(r)
                    && r.namespace
                        .as_deref()
                        .is_some_and(|n| n.starts_with("team-"))
            })
            .map(|r| format!("{} {}", r.verb, r.path))
            .collect();
        assert!(herd.is_empty(), "writes after the outage: {herd:?}");
        op.stop().await;
    })
    .await;
}
