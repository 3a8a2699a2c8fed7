//! The release lock on the in-process test API server: two controllers racing over many
//! releases, a killed controller taken over after its lease expires, SIGTERM, a valid lease that
//! blocks, clock skew, and failed installs that are retried.

use sequenced_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use sequenced::api::v1alpha1::{LayerPhase, ReleasePhase, SequencedRelease};
use serde_json::{Value, json};
use support::charts::{chart, condition, deployment, is_ready, layer_phase, release};
use support::operator::{Operator, is_shard_keeping, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// Two layers: Deployment db, then Deployment app, which waits for db.
fn duo() -> TempDir {
    chart(
        "duo",
        &[
            ("templates/db.yaml", &deployment("db", "helm.sh/layer: db")),
            (
                "templates/app.yaml",
                &deployment(
                    "app",
                    "helm.sh/layer: app\n    helm.sh/depends-on/layers: db",
                ),
            ),
        ],
    )
}

fn duo_release(name: &str, dir: &TempDir, extra: Value) -> Value {
    release(name, &dir.path().join("duo"), extra)
}

fn lease_of(op: &Operator, namespace: &str, release: &str) -> Option<Value> {
    op.server.object(
        "coordination.k8s.io/v1",
        "Lease",
        Some(namespace),
        &format!("sequenced.lock.{release}"),
    )
}

/// The release's Lease once its holder is cleared, which follows the status write that ends an
/// operation.
async fn released_lease(op: &Operator, namespace: &str, release: &str) -> Value {
    let released = op
        .server
        .wait_until(Duration::from_secs(10), |_| {
            lease_of(op, namespace, release).is_some_and(|l| holder(&l).is_none())
        })
        .await;
    assert!(released, "{namespace}/{release}: the lease is still held");
    lease_of(op, namespace, release).unwrap()
}

fn holder(lease: &Value) -> Option<String> {
    lease
        .pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
}

/// Which clients applied `kind` `namespace/name` (server-side apply that succeeded).
fn appliers(op: &Operator, kind: &str, namespace: &str, name: &str) -> BTreeSet<String> {
    op.server
        .requests()
        .iter()
        .filter(|r| {
            matches!(r.verb, "apply" | "create")
                && is_write(r)
                && r.status < 300
                && r.kind.as_deref() == Some(kind)
                && r.namespace.as_deref() == Some(namespace)
                && r.name.as_deref() == Some(name)
        })
        .map(|r| r.client.clone().unwrap_or_default())
        .collect()
}

/// The write requests of `client` that the server carried out about release `namespace/name`
/// (its object, its status, its record and the objects of its chart).
fn writes_by(op: &Operator, client: &str, namespace: &str) -> Vec<String> {
    op.server
        .requests()
        .iter()
        .filter(|r| {
            // A write the server refused changed nothing: a Lease create that meets the other
            // controller's Lease (409) when this one's lease watch has not shown it yet.
            is_write(r)
                && r.status < 300
                && r.client.as_deref() == Some(client)
                && r.namespace.as_deref() == Some(namespace)
                && r.kind.as_deref() != Some("Event")
                && !is_shard_keeping(r)
        })
        .map(|r| format!("{} {} {}", r.verb, r.path, r.status))
        .collect()
}

/// When `client` first wrote anything but an Event.
fn first_write_by(op: &Operator, client: &str) -> Instant {
    op.server
        .requests()
        .iter()
        .filter(|r| is_write(r) && r.client.as_deref() == Some(client))
        .filter(|r| r.kind.as_deref() != Some("Event") && !is_shard_keeping(r))
        .map(|r| r.at)
        .min()
        .expect("a write")
}

/// A controller and a release of [`duo`] whose db never becomes ready in time (no kubelet,
/// `readinessTimeout: 1s`), with `retries`.
async fn failing_release(retries: i32) -> (Operator, TempDir) {
    let op = Operator::start(4).await;
    let dir = duo();
    op.create(
        "default",
        duo_release(
            "duo",
            &dir,
            json!({"readinessTimeout": "1s", "retries": retries}),
        ),
    )
    .await;
    (op, dir)
}

/// A Lease of another controller for release `namespace/name`, renewed at `renew_time`.
async fn foreign_lease(
    op: &Operator,
    namespace: &str,
    release: &str,
    holder: &str,
    seconds: i32,
    renew_time: Timestamp,
) -> Lease {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": format!("sequenced.lock.{release}"),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "sequenced"},
            "annotations": {"sequenced.dev/owner": format!("{namespace}/{release}")},
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "acquireTime": MicroTime(renew_time),
            "renewTime": MicroTime(renew_time),
            "leaseTransitions": 0,
        }
    }))
    .unwrap();
    let api: Api<Lease> = Api::namespaced(op.client.clone(), namespace);
    api.create(&PostParams::default(), &lease)
        .await
        .expect("create the lease")
}

/// Another controller renews (or clears, with `holder` None) its lease.
async fn renew_foreign(
    op: &Operator,
    namespace: &str,
    release: &str,
    holder: Option<&str>,
    renew_time: Timestamp,
) {
    let api: Api<Lease> = Api::namespaced(op.client.clone(), namespace);
    let patch = json!({"spec": {"holderIdentity": holder, "renewTime": MicroTime(renew_time)}});
    api.patch(
        &format!("sequenced.lock.{release}"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("renew the lease");
}

fn status_lock(sr: &SequencedRelease) -> Option<(String, String)> {
    let lock = sr.status.as_ref()?.lock.as_ref()?;
    Some((lock.holder.clone()?, lock.session_id.clone()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_racing_over_fifty_releases_install_each_once() {
    within(async {
        let op = Operator::without_controller().await;
        let a = op.spawn("controller-a", 8);
        let b = op.spawn("controller-b", 8);
        // Once the shards are divided, each release has one owner; no shard moves meanwhile.
        op.wait_shards_spread(&["controller-a", "controller-b"])
            .await;
        let _kubelet = op.kubelet();
        let dir = duo();
        for i in 0..50 {
            let ns = format!("team-{i}");
            op.namespace(&ns).await;
            op.create(&ns, duo_release("duo", &dir, json!({}))).await;
        }
        let mut by_controller: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..50 {
            let ns = format!("team-{i}");
            let sr = op.wait_release(&ns, "duo", "Ready", is_ready).await;
            let status = sr.status.clone().unwrap();
            assert_eq!(status.revision, Some(1), "{ns}: installed once");
            assert_eq!(status.history.len(), 1, "{ns}: one revision");
            // No layer applied by both: every object of the release, and its record, from one
            // controller.
            let mut all = BTreeSet::new();
            for name in ["db", "app"] {
                let who = appliers(&op, "Deployment", &ns, name);
                assert_eq!(who.len(), 1, "{ns}: Deployment {name} applied by {who:?}");
                all.extend(who);
            }
            let record = appliers(&op, "Secret", &ns, "sh.helm.release.v1.duo.v1");
            assert_eq!(record.len(), 1, "{ns}: record written by {record:?}");
            all.extend(record);
            assert_eq!(all.len(), 1, "{ns}: release acted on by {all:?}");
            *by_controller
                .entry(all.into_iter().next().unwrap())
                .or_default() += 1;
            assert!(
                op.server
                    .object("v1", "Secret", Some(&ns), "sh.helm.release.v1.duo.v2")
                    .is_none()
            );
        }
        // Each operation ended: the holder is cleared and the status shows no lock.
        for i in 0..50 {
            let ns = format!("team-{i}");
            released_lease(&op, &ns, "duo").await;
            let sr = op.releases(&ns).get("duo").await.unwrap();
            assert_eq!(sr.status.unwrap().lock, None);
        }
        eprintln!("releases installed by each controller: {by_controller:?}");
        assert_eq!(by_controller.values().sum::<usize>(), 50);
        assert_eq!(
            by_controller.len(),
            2,
            "the releases spread over both controllers"
        );
        a.stop().await;
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_renews_its_lease_while_a_layer_waits() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        let a = op.spawn("controller-a", 4);
        let b = op.spawn("controller-b", 4);
        // The shards settle first: a shard that moves while db is waited for hands the release
        // to the other replica at a step boundary, which is right but not what this test counts.
        op.wait_shards_spread(&["controller-a", "controller-b"])
            .await;
        op.create(
            "default",
            duo_release("duo", &dir, json!({"timeout": "6s"})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        // db takes 5 s, most of the operation's timeout (the lease's duration).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let lease = lease_of(&op, "default", "duo").unwrap();
        let holding = holder(&lease).expect("held while db is waited for");
        let _kubelet = op.kubelet();
        op.wait_release("default", "duo", "Ready", is_ready).await;
        let who = appliers(&op, "Deployment", "default", "db");
        assert_eq!(who.len(), 1, "{who:?}");
        assert_eq!(appliers(&op, "Deployment", "default", "app"), who);
        assert!(
            holding.starts_with(who.first().unwrap().as_str()),
            "{holding}"
        );
        let renewals = op
            .server
            .requests()
            .iter()
            .filter(|r| r.verb == "update" && r.kind.as_deref() == Some("Lease"))
            .count();
        assert!(
            renewals >= 2,
            "{renewals} lease updates in 5 s of a 6 s lease"
        );
        assert_eq!(
            a.metrics.lock_takeovers.get() + b.metrics.lock_takeovers.get(),
            0
        );
        a.stop().await;
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_with_a_stale_cache_reads_the_release_again_after_taking_the_lock() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        let a = op.spawn("controller-a", 4);
        op.create(
            "default",
            duo_release("duo", &dir, json!({"timeout": "8s"})),
        )
        .await;
        op.wait_release("default", "duo", "layer db waiting", |sr| {
            layer_phase(sr, "db") == Some(LayerPhase::Waiting)
        })
        .await;
        // b keeps its shards apart (another namespace) in one shard, so it owns every release
        // as a does and the two meet at the release's lock. A member Lease of a's there, as a
        // live replica of b's group keeps one, tells b that a is alive: without it, b judges a
        // lease a sharded replica wrote, whose member Lease it does not see, a dead one's.
        let now = MicroTime(Timestamp::now());
        let member: Lease = serde_json::from_value(json!({
            "metadata": {"name": sequenced::lock::shards::member_lease("controller-a"),
                         "namespace": "kube-public",
                         "labels": {sequenced::api::names::SHARD_LEASE_LABEL: "member"}},
            "spec": {"holderIdentity": "controller-a", "leaseDurationSeconds": 3600,
                     "acquireTime": now, "renewTime": now}
        }))
        .unwrap();
        Api::<Lease>::namespaced(op.client.clone(), "kube-public")
            .create(&PostParams::default(), &member)
            .await
            .unwrap();
        let b = support::operator::Controller::start_sharded(
            op.server.config_as("controller-b"),
            "controller-b",
            4,
            Default::default(),
            sequenced::lock::Sharding {
                shards: 1,
                namespace: "kube-public".to_string(),
                lease_duration: Duration::from_secs(3),
            },
        );
        let synced = op
            .server
            .wait_until(Duration::from_secs(10), |_| b.metrics.is_synced())
            .await;
        assert!(synced);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // b's watches stall: its cache keeps db waiting and app pending, and its sighting of the
        // lease stops moving, so the lease looks expired to it after 8 s.
        op.server.pause_watches("controller-b");
        let _kubelet = op.kubelet();
        op.wait_release("default", "duo", "Ready", is_ready).await;
        released_lease(&op, "default", "duo").await;
        // b wakes (its requeue at the lease's possible expiry), takes the free lock, and must
        // read the release again instead of going on from its stale copy.
        let took_lock = op
            .server
            .wait_until(Duration::from_secs(30), |server| {
                server.requests().iter().any(|r| {
                    r.client.as_deref() == Some("controller-b")
                        && r.kind.as_deref() == Some("Lease")
                        && !is_shard_keeping(r)
                        && matches!(r.verb, "create" | "update")
                        && r.status < 300
                })
            })
            .await;
        assert!(took_lock, "controller-b never took the lock");
        released_lease(&op, "default", "duo").await;
        for name in ["db", "app"] {
            assert_eq!(
                appliers(&op, "Deployment", "default", name),
                BTreeSet::from(["controller-a".to_string()]),
                "Deployment {name}"
            );
        }
        let sr = op.releases("default").get("duo").await.unwrap();
        assert!(is_ready(&sr));
        assert_eq!(sr.status.unwrap().revision, Some(1));
        op.server.resume_watches("controller-b");
        a.stop().await;
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_controller_is_taken_over_after_its_lease_expires() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        let a = op.spawn("controller-a", 4);
        op.create(
            "default",
            duo_release("duo", &dir, json!({"timeout": "3s"})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        assert!(op.deployment_ready("default", "db"));
        op.wait_object("apps/v1", "Deployment", "default", "app")
            .await;
        let sr = op
            .wait_release("default", "duo", "layer app waiting", |sr| {
                layer_phase(sr, "app") == Some(LayerPhase::Waiting)
            })
            .await;
        let (holder_a, session_a) = status_lock(&sr).expect("status.lock while deploying");
        assert_eq!(holder_a, "controller-a");
        let lease = lease_of(&op, "default", "duo").unwrap();
        assert_eq!(
            holder(&lease).as_deref(),
            Some(format!("controller-a/{session_a}").as_str())
        );
        assert_eq!(lease.pointer("/spec/leaseDurationSeconds"), Some(&json!(3)));

        // Killed in the middle of layer app: nothing is released.
        a.kill().await;
        let started = Instant::now();
        let b = op.spawn("controller-b", 4);
        assert!(op.deployment_ready("default", "app"));
        let note = op.wait_event("default", "duo", "LockTakenOver").await;
        assert!(
            note.contains(&format!("controller-a/{session_a}")),
            "the event names the previous holder: {note}"
        );
        let sr = op.wait_release("default", "duo", "Ready", is_ready).await;
        // b waited for the lease to stay unchanged for its whole duration before writing.
        let first_write = first_write_by(&op, "controller-b");
        assert!(
            first_write.duration_since(started) >= Duration::from_secs(3),
            "controller-b wrote {:?} after it started, before the lease expired",
            first_write.duration_since(started)
        );
        // It resumed from the status: neither the Ready layer nor the applied one again.
        for name in ["db", "app"] {
            assert_eq!(
                appliers(&op, "Deployment", "default", name),
                BTreeSet::from(["controller-a".to_string()]),
                "Deployment {name}"
            );
        }
        let status = sr.status.unwrap();
        assert_eq!(status.revision, Some(1));
        assert_eq!(status.lock, None);
        assert_eq!(b.metrics.lock_takeovers.get(), 1);
        let lease = released_lease(&op, "default", "duo").await;
        assert_eq!(lease.pointer("/spec/leaseTransitions"), Some(&json!(1)));
        b.stop().await;
    })
    .await;
}

/// After a takeover, the release changes where the new holder's cache does not show it (its
/// SequencedRelease watch is held back), so the holder's next status write, from its cached copy,
/// meets a 409 in the middle of the operation: it reads the release again and writes at once,
/// instead of waiting for an event of the release (the kill case of the scale issue: a release
/// that waited until `spec.timeout` on a layer whose objects were ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_refused_with_409_after_a_takeover_is_read_again_and_retried_at_once() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        let a = op.spawn("controller-a", 4);
        op.create(
            "default",
            duo_release("duo", &dir, json!({"timeout": "3s"})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        op.wait_release("default", "duo", "layer db waiting", |sr| {
            layer_phase(sr, "db") == Some(LayerPhase::Waiting)
        })
        .await;
        a.kill().await;
        let b = op.spawn("controller-b", 4);
        op.wait_event("default", "duo", "LockTakenOver").await;
        // b holds the lock; from here on it sees no event of the release, which changes (an
        // annotation: a new resourceVersion) behind its cache.
        op.server
            .pause_watches_of("controller-b", "sequencedreleases");
        let touched = op
            .releases("default")
            .patch(
                "duo",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"example.com/touched": "yes"}}})),
            )
            .await
            .unwrap();
        // db becomes ready: b (woken by the Deployment's event) writes from its stale copy.
        assert!(op.deployment_ready("default", "db"));
        let at = Instant::now();
        let moved = op
            .server
            .wait_until(Duration::from_secs(10), |server| {
                server
                    .object(
                        "sequenced.dev/v1alpha1",
                        "SequencedRelease",
                        Some("default"),
                        "duo",
                    )
                    .and_then(|sr| {
                        let layers = sr.pointer("/status/layers")?.as_array()?.clone();
                        Some(layers.iter().any(|l| {
                            l["name"] == "db" && l["phase"] == "Ready"
                        }))
                    })
                    .unwrap_or(false)
            })
            .await;
        let waited = at.elapsed();
        assert!(moved, "layer db not Ready in the status 10 s after it was ready");
        assert!(
            waited < Duration::from_secs(3),
            "layer db Ready in the status {waited:?} after it was ready, with no event of the release to wake b"
        );
        let conflicts = op
            .server
            .requests()
            .iter()
            .filter(|r| {
                r.client.as_deref() == Some("controller-b")
                    && r.path.ends_with("/sequencedreleases/duo/status")
                    && r.status == 409
            })
            .count();
        assert!(conflicts >= 1, "b's write from its stale copy met no 409");
        assert_eq!(b.metrics.status_conflicts.get() as usize, conflicts);
        assert!(op.deployment_ready("default", "app"));
        let sr = op.wait_release("default", "duo", "Ready", is_ready).await;
        assert_eq!(
            sr.metadata.annotations.unwrap()["example.com/touched"],
            "yes",
            "{:?}",
            touched.metadata.resource_version
        );
        assert_eq!(sr.status.unwrap().revision, Some(1));
        assert_eq!(b.metrics.lock_takeovers.get(), 1);
        op.server
            .resume_watches("controller-b/sequencedreleases");
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_lease_and_the_next_controller_resumes_at_once() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        let a = op.spawn("controller-a", 4);
        // The default timeout: a lease left behind would block for 5 minutes.
        op.create("default", duo_release("duo", &dir, json!({})))
            .await;
        op.wait_release("default", "duo", "layer db waiting", |sr| {
            layer_phase(sr, "db") == Some(LayerPhase::Waiting)
        })
        .await;
        assert!(
            lease_of(&op, "default", "duo")
                .and_then(|l| holder(&l))
                .is_some()
        );

        let took = a.stop().await;
        assert!(took < Duration::from_secs(10), "stopping took {took:?}");
        let lease = lease_of(&op, "default", "duo").unwrap();
        assert_eq!(holder(&lease), None, "the lease is released");
        let sr = op.releases("default").get("duo").await.unwrap();
        let (status, reason, text) = condition(&sr, "Reconciling").unwrap();
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Interrupted"));
        assert!(text.contains("controller-a"), "{text}");
        let st = sr.status.clone().unwrap();
        assert_eq!(st.lock, None);
        assert_eq!(st.phase, Some(ReleasePhase::Deploying));
        assert_eq!(layer_phase(&sr, "db"), Some(LayerPhase::Waiting));

        let b = op.spawn("controller-b", 4);
        let _kubelet = op.kubelet();
        let sr = op.wait_release("default", "duo", "Ready", is_ready).await;
        assert_eq!(sr.status.unwrap().revision, Some(1));
        assert_eq!(
            appliers(&op, "Deployment", "default", "db"),
            BTreeSet::from(["controller-a".to_string()]),
            "db, applied before the signal, is not applied again"
        );
        assert_eq!(
            appliers(&op, "Deployment", "default", "app"),
            BTreeSet::from(["controller-b".to_string()])
        );
        assert_eq!(b.metrics.lock_takeovers.get(), 0, "nothing to take over");
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_lease_of_another_controller_blocks_the_release() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        foreign_lease(
            &op,
            "default",
            "duo",
            "elsewhere/0001",
            300,
            Timestamp::now(),
        )
        .await;
        let c = op.spawn("controller-c", 4);
        op.create("default", duo_release("duo", &dir, json!({})))
            .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let writes = writes_by(&op, "controller-c", "default");
        assert!(writes.is_empty(), "the release was touched: {writes:?}");
        let sr = op.releases("default").get("duo").await.unwrap();
        assert_eq!(sr.status, None);

        // The other controller's operation ends: this one goes on at once, not after 5 minutes.
        renew_foreign(&op, "default", "duo", None, Timestamp::now()).await;
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        let sr = op
            .wait_release("default", "duo", "layer db waiting", |sr| {
                layer_phase(sr, "db") == Some(LayerPhase::Waiting)
            })
            .await;
        assert_eq!(status_lock(&sr).unwrap().0, "controller-c");
        assert_eq!(c.metrics.lock_takeovers.get(), 0);
        c.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewed_by_a_node_whose_clock_is_behind_is_not_taken_over() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        // The holder's clock is an hour behind: by renewTime its 3 s lease expired long ago.
        let behind = || {
            Timestamp::now()
                .checked_sub(SignedDuration::from_hours(1))
                .unwrap()
        };
        foreign_lease(&op, "default", "duo", "elsewhere/0002", 3, behind()).await;
        let c = op.spawn("controller-c", 4);
        op.create("default", duo_release("duo", &dir, json!({})))
            .await;
        // It keeps renewing every 300 ms for 4.5 s (one and a half times its duration).
        for _ in 0..15 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            renew_foreign(&op, "default", "duo", Some("elsewhere/0002"), behind()).await;
        }
        let writes = writes_by(&op, "controller-c", "default");
        assert!(writes.is_empty(), "a live lease was taken over: {writes:?}");
        // It stops renewing (it died): taken over once unchanged for its duration.
        let note = op.wait_event("default", "duo", "LockTakenOver").await;
        assert!(note.contains("elsewhere/0002"), "{note}");
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        assert_eq!(c.metrics.lock_takeovers.get(), 1);
        c.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_renew_time_is_in_the_future_expires_only_after_its_duration() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        // The holder's clock is a day ahead, and it died right after writing.
        let ahead = Timestamp::now()
            .checked_add(SignedDuration::from_hours(24))
            .unwrap();
        foreign_lease(&op, "default", "duo", "elsewhere/0003", 3, ahead).await;
        let started = Instant::now();
        let c = op.spawn("controller-c", 4);
        op.create("default", duo_release("duo", &dir, json!({})))
            .await;
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        let first_write = first_write_by(&op, "controller-c");
        assert!(
            first_write.duration_since(started) >= Duration::from_secs(3),
            "taken over {:?} after the controller started, before the lease's 3 s",
            first_write.duration_since(started)
        );
        let note = op.wait_event("default", "duo", "LockTakenOver").await;
        assert!(note.contains("elsewhere/0003"), "{note}");
        c.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_install_succeeds_once_the_spec_fixes_it() {
    within(async {
        // Nothing becomes ready (no kubelet yet): db times out and the install fails.
        let (mut op, _dir) = failing_release(0).await;
        let sr = op
            .wait_release("default", "duo", "Failed", |sr| {
                sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Failed)
            })
            .await;
        assert_eq!(condition(&sr, "Stalled").unwrap().0, "True");
        assert_eq!(sr.status.as_ref().unwrap().failures, Some(1));
        // A failed operation releases the lock (right after its status write).
        released_lease(&op, "default", "duo").await;

        // The fix is a spec change (a longer timeout); nothing is deleted by hand.
        let _kubelet = op.kubelet();
        let patch = json!({"spec": {"readinessTimeout": "5m"}});
        op.releases("default")
            .patch("duo", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let sr = op.wait_release("default", "duo", "Ready", is_ready).await;
        let status = sr.status.unwrap();
        assert_eq!(status.revision, Some(2));
        assert_eq!(status.failures, None);
        let history: Vec<(i64, ReleasePhase)> = status
            .history
            .iter()
            .map(|h| (h.revision, h.phase))
            .collect();
        assert_eq!(
            history,
            vec![(2, ReleasePhase::Ready), (1, ReleasePhase::Failed)],
            "the failed revision stays in the history"
        );
        let controller = op.take_controller();
        controller.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_install_is_retried_with_backoff_up_to_spec_retries() {
    within(async {
        let op = Operator::start(4).await;
        let dir = duo();
        // A Deployment db that no release owns is in the way: applying layer db fails. (The
        // readiness failures that are retried are in retries_run_out_and_the_release_stalls;
        // this cause can be removed without racing a readiness timeout.)
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(op.client.clone(), "default");
        let squatter: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": "db"},
            "spec": {
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
                }
            }
        }))
        .unwrap();
        deployments
            .create(&PostParams::default(), &squatter)
            .await
            .unwrap();
        op.create("default", duo_release("duo", &dir, json!({"retries": 2})))
            .await;
        // The first attempt fails; a retry is scheduled, so the release is not Stalled.
        let sr = op
            .wait_release("default", "duo", "Failed with a retry scheduled", |sr| {
                sr.status.as_ref().and_then(|s| s.failures) == Some(1)
            })
            .await;
        let (reconciling, reason, text) = condition(&sr, "Reconciling").unwrap();
        assert_eq!(
            (reconciling.as_str(), reason.as_str()),
            ("True", "RetryScheduled")
        );
        assert!(text.contains("retry 1 of 2 in 5s"), "{text}");
        assert!(text.contains("belongs to no release"), "{text}");
        assert_eq!(condition(&sr, "Stalled").unwrap().0, "False");

        // The cause is removed outside the spec: the retry, a new revision of the same spec,
        // succeeds.
        deployments
            .delete("db", &Default::default())
            .await
            .unwrap();
        let _kubelet = op.kubelet();
        let sr = op.wait_release("default", "duo", "Ready", is_ready).await;
        let status = sr.status.unwrap();
        assert_eq!(status.revision, Some(2));
        assert_eq!(status.failures, None);
        assert_eq!(status.history[1].phase, ReleasePhase::Failed);
        assert_eq!(status.history[0].digest, status.history[1].digest);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_run_out_and_the_release_stalls() {
    within(async {
        let (op, _dir) = failing_release(1).await;
        let sr = op
            .wait_release("default", "duo", "Stalled after one retry", |sr| {
                condition(sr, "Stalled").is_some_and(|c| c.0 == "True")
            })
            .await;
        let status = sr.status.unwrap();
        assert_eq!(status.failures, Some(2));
        assert_eq!(status.revision, Some(2));
        assert_eq!(status.phase, Some(ReleasePhase::Failed));
        op.stop().await;
    })
    .await;
}

/// `sequenced run` as a process, against the test API server.
fn run_process(kubeconfig: &std::path::Path, identity: &str) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--identity",
            identity,
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .env("SEQUENCED_HELM", support::helm())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start sequenced run")
}

/// Sends `signal` and waits for the process to exit: its status, how long it took, its stderr.
async fn signal_and_wait(
    mut child: std::process::Child,
    signal: i32,
) -> (std::process::ExitStatus, Duration, String) {
    let pid = i32::try_from(child.id()).unwrap();
    let sent = Instant::now();
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let deadline = sent + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sequenced run") {
            break status;
        }
        assert!(Instant::now() < deadline, "sequenced run does not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = sent.elapsed();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status, took, stderr)
}

fn assert_interrupted_by(op: &Operator, sr: &SequencedRelease, identity: &str) {
    let (status, reason, text) = condition(sr, "Reconciling").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Interrupted"));
    assert!(text.contains(identity), "{text}");
    assert_eq!(sr.status.as_ref().unwrap().lock, None);
    let lease = lease_of(op, "default", "duo").unwrap();
    assert_eq!(holder(&lease), None, "the lease is released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequenced_run_releases_its_leases_on_sigterm_and_sigint_and_exits_within_ten_seconds() {
    within(async {
        let op = Operator::without_controller().await;
        let dir = duo();
        let home = TempDir::new().unwrap();
        let kubeconfig = support::kubeconfig(&home, &op.server.url(), "default");
        op.create("default", duo_release("duo", &dir, json!({})))
            .await;

        let first = run_process(&kubeconfig, "process-1");
        op.wait_release("default", "duo", "layer db waiting", |sr| {
            layer_phase(sr, "db") == Some(LayerPhase::Waiting)
        })
        .await;
        let (status, took, stderr) = signal_and_wait(first, libc::SIGTERM).await;
        assert!(status.success(), "{status}: {stderr}");
        assert!(took < Duration::from_secs(10), "SIGTERM took {took:?}");
        let sr = op.releases("default").get("duo").await.unwrap();
        assert_interrupted_by(&op, &sr, "process-1");

        // A restarted controller resumes at once (the 5 minute lease is not waited out).
        let second = run_process(&kubeconfig, "process-2");
        assert!(op.deployment_ready("default", "db"));
        op.wait_release("default", "duo", "layer app waiting", |sr| {
            layer_phase(sr, "app") == Some(LayerPhase::Waiting)
        })
        .await;
        let (status, took, stderr) = signal_and_wait(second, libc::SIGINT).await;
        assert!(status.success(), "{status}: {stderr}");
        assert!(took < Duration::from_secs(10), "SIGINT took {took:?}");
        let sr = op.releases("default").get("duo").await.unwrap();
        assert_interrupted_by(&op, &sr, "process-2");

        let third = op.spawn("controller-3", 4);
        let _kubelet = op.kubelet();
        let sr = op.wait_release("default", "duo", "Ready", is_ready).await;
        assert_eq!(sr.status.unwrap().revision, Some(1));
        assert_eq!(third.metrics.lock_takeovers.get(), 0);
        third.stop().await;
    })
    .await;
}
