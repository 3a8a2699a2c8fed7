//! Outages as a real cluster has them (DESIGN.md, "Lock and recovery"): the test API server
//! restarts as the recorded kube-apiserver 1.36 does (`tests/apiserver-recordings/restart/`,
//! replayed here first), and a release in the middle of an operation goes on within 15 s of it
//! answering again; a restarted server refusing service accounts for a moment stalls nobody;
//! an etcd outage is told once the status can be written again; a killed replica's member
//! Lease is deleted by the replica that takes its shards, and a replica started long after a
//! crash owns every shard in its first round.

use sequenced_testkit as support;

use std::future::Future;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use sequenced::api::v1alpha1::SequencedRelease;
use sequenced::controller::Tenancy;
use serde_json::{Value, json};
use support::apiserver::{Restart, TestApiServer};
use support::charts::{chart, deployment, is_ready, is_stalled, pair, release};
use support::operator::{Controller, Operator, is_write};
use support::tenants::admin_apply;
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// The chart `chain`: five layers l1..l5, one Deployment each, each waiting for the one before.
fn chain() -> TempDir {
    let templates: Vec<(String, String)> = (1..=5)
        .map(|i| {
            let after = if i == 1 {
                String::new()
            } else {
                format!("\n    helm.sh/depends-on/layers: l{}", i - 1)
            };
            (
                format!("templates/d{i}.yaml"),
                deployment(&format!("d{i}"), &format!("helm.sh/layer: l{i}{after}")),
            )
        })
        .collect();
    let files: Vec<(&str, &str)> = templates
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    chart("chain", &files)
}

/// The release as the server stores it (read in-process: a client's own retries, such as
/// kube's wait for a 503's `Retry-After`, are not measured).
fn stored(server: &TestApiServer, namespace: &str, name: &str) -> Option<SequencedRelease> {
    let object = server.object(
        "sequenced.dev/v1alpha1",
        "SequencedRelease",
        Some(namespace),
        name,
    )?;
    serde_json::from_value(object).ok()
}

/// Waits until the stored release satisfies `check`, at most `bound`; panics with its status
/// otherwise.
async fn stored_until(
    server: &TestApiServer,
    namespace: &str,
    name: &str,
    bound: Duration,
    what: &str,
    check: impl Fn(&SequencedRelease) -> bool,
) -> SequencedRelease {
    let deadline = Instant::now() + bound;
    loop {
        let sr = stored(server, namespace, name);
        if let Some(sr) = sr.as_ref().filter(|sr| check(sr)) {
            return sr.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{namespace}/{name} did not get {what} within {bound:?}; its status: {}",
            serde_json::to_string_pretty(&sr.and_then(|sr| sr.status)).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A controller with the operator's default shards (15 s Leases), as in a cluster.
fn production_controller(op: &Operator, name: &str) -> Controller {
    Controller::start_sharded(
        op.server.config_as(name),
        name,
        8,
        Tenancy::default(),
        sequenced::lock::Sharding::default(),
    )
}

/// A client that does not retry 429, 503 and 504 itself, to see each answer.
fn plain_client(server: &TestApiServer) -> kube::Client {
    let mut config = server.config();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// One request: status, `Retry-After`, body.
async fn ask(
    client: &kube::Client,
    path: &str,
    impersonate: Option<&str>,
) -> (u16, Option<String>, String) {
    let mut request = http::Request::get(path);
    if let Some(user) = impersonate {
        request = request.header("Impersonate-User", user);
    }
    let request = request.body(kube::client::Body::empty()).unwrap();
    let answer = client.send(request).await.expect("an answer");
    let status = answer.status().as_u16();
    let retry_after = answer
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry_after,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The body of a recorded sample (after its request and status lines).
fn sample(name: &str) -> String {
    let path = support::charts::repo()
        .join("tests/apiserver-recordings/restart")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    text.splitn(3, '\n')
        .nth(2)
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_api_server_restarts_as_the_recorded_kube_apiserver() {
    within(async {
        let op = Operator::without_controller().await;
        let admin = plain_client(&op.server);
        op.namespace("team").await;
        admin_apply(&op, json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "deployer", "namespace": "team"}})).await;
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "deployer", "namespace": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": "team"}]})).await;
        let before = op.server.resource_version();
        let sa = "system:serviceaccount:team:deployer";
        let configmaps = "/api/v1/namespaces/team/configmaps?limit=1";
        assert_eq!(ask(&admin, configmaps, Some(sa)).await.0, 200);

        // A watch open when it is killed ends without a clean end of its stream.
        let leases: Api<Lease> = Api::namespaced(admin.clone(), "default");
        let mut watch = leases
            .watch(&Default::default(), &before.to_string())
            .await
            .unwrap()
            .boxed();
        op.server.kill();
        use futures::StreamExt;
        let ended = tokio::time::timeout(Duration::from_secs(5), watch.next()).await;
        assert!(
            matches!(ended, Ok(Some(Err(_)))),
            "an open watch ends with an error: {ended:?}"
        );
        let addr = op.server.url().trim_start_matches("http://").to_string();
        let refused = tokio::net::TcpStream::connect(&addr).await;
        assert_eq!(
            refused.err().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionRefused),
            "connections are refused while it is down"
        );

        op.server.restart_with(Restart {
            not_ready: Duration::from_secs(4),
            custom_resources: Duration::from_secs(3),
            rbac: Duration::from_secs(2),
        });
        // Core lists answer at once, /readyz does not.
        assert_eq!(ask(&admin, configmaps, None).await.0, 200);
        let (status, _, body) = ask(&admin, "/readyz?verbose", None).await;
        assert_eq!((status, body.trim_end()), (500, sample("run1-samples/readyz-500-17.txt").as_str()));
        // Custom resources: the recorded 503 with Retry-After.
        let (status, retry_after, body) =
            ask(&admin, "/apis/sequenced.dev/v1alpha1/sequencedreleases?limit=1", None).await;
        assert_eq!(status, 503);
        assert_eq!(retry_after.as_deref(), Some("5"));
        assert_eq!(json_of(&body), json_of(&sample("run1-samples/list-sqr-503-13.txt")));
        // A service account with the rights: the recorded 403.
        let (status, _, body) = ask(&admin, configmaps, Some(sa)).await;
        assert_eq!(status, 403);
        let recorded = sample("run2-samples/list-configmaps-as-serviceaccount-with-rights-403-18.txt")
            .replace("rc-w2-ten-moeuz", "team");
        assert_eq!(json_of(&body), json_of(&recorded));
        // A watch resumed from before: 200 with one ERROR event, 410 Expired.
        let (status, _, body) = ask(
            &admin,
            &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={before}&timeoutSeconds=1"),
            None,
        )
        .await;
        assert_eq!(status, 200);
        let event: Value = serde_json::from_str(body.trim()).unwrap();
        let recorded: Value =
            serde_json::from_str(&sample("run1-samples/watch-configmaps-from-old-rv-200-14.txt")).unwrap();
        assert_eq!(event["type"], recorded["type"]);
        assert_eq!(event["object"]["reason"], recorded["object"]["reason"]);
        assert_eq!(event["object"]["code"], recorded["object"]["code"]);
        let message = event["object"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("too old resource version: {before} (")),
            "{message}"
        );

        // Once the windows are over, everything answers.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(ask(&admin, configmaps, Some(sa)).await.0, 200);
        assert_eq!(
            ask(&admin, "/apis/sequenced.dev/v1alpha1/sequencedreleases?limit=1", None).await.0,
            200
        );
        assert_eq!(ask(&admin, "/readyz", None).await.0, 200);
        assert!(op.server.is_ready());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_the_middle_of_a_rollout_is_ready_within_15_s_of_a_restart() {
    within(async {
        let op = Operator::without_controller().await;
        let controller = production_controller(&op, "outage");
        op.wait_shards_spread(&["outage"]).await;
        let dir = pair();
        // Three releases with nothing to do, and one in the middle of a five-layer rollout.
        let kubelet = op.kubelet();
        for i in 0..3 {
            let ns = format!("idle-{i}");
            op.namespace(&ns).await;
            op.create(&ns, release("pair", &dir.path().join("pair"), json!({})))
                .await;
            op.wait_release(&ns, "pair", "Ready", is_ready).await;
        }
        drop(kubelet);
        let chain_dir = chain();
        let _kubelet = op.server.deployment_controller(Duration::from_millis(500));
        op.create(
            "default",
            release("chain", &chain_dir.path().join("chain"), json!({})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "d2")
            .await;

        op.server.kill();
        tokio::time::sleep(Duration::from_secs(10)).await;
        op.server.clear_requests();
        op.server.restart();
        let back = Instant::now();
        let sr = stored_until(
            &op.server,
            "default",
            "chain",
            Duration::from_secs(15),
            "Ready",
            is_ready,
        )
        .await;
        eprintln!(
            "Ready {:.1} s after the API server answered again",
            back.elapsed().as_secs_f64()
        );
        assert_eq!(sr.status.and_then(|s| s.revision), Some(1));
        // The restart was the real one: the SequencedReleases answered 503 for a while.
        assert!(
            op.server
                .requests()
                .iter()
                .any(|r| { r.status == 503 && r.kind.as_deref() == Some("SequencedRelease") })
        );
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
                        .is_some_and(|n| n.starts_with("idle-"))
            })
            .map(|r| format!("{} {}", r.verb, r.path))
            .collect();
        assert!(herd.is_empty(), "writes after the restart: {herd:?}");
        controller.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_the_api_server_was_away_does_not_count_against_spec_timeout() {
    within(async {
        let op = Operator::without_controller().await;
        let controller = production_controller(&op, "paused");
        op.wait_shards_spread(&["paused"]).await;
        let dir = pair();
        op.create(
            "default",
            release("pair", &dir.path().join("pair"), json!({"timeout": "40s"})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "app")
            .await;
        let applied = Instant::now();

        // 30 s without an API server in the middle of the rollout; the Deployment is available
        // (as kube-controller-manager makes it, well after the restart) 20 s after it answers
        // again: 50 s after it was applied, past the 40 s of spec.timeout.
        op.server.kill();
        tokio::time::sleep(Duration::from_secs(30)).await;
        op.server.restart();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            stored(&op.server, "default", "pair").is_some_and(|sr| !is_stalled(&sr)),
            "timed out while the API server was away"
        );
        assert!(op.deployment_ready("default", "app"));
        let sr = stored_until(
            &op.server,
            "default",
            "pair",
            Duration::from_secs(15),
            "Ready",
            is_ready,
        )
        .await;
        assert!(applied.elapsed() > Duration::from_secs(40));
        let status = sr.status.unwrap_or_default();
        let told = status.message.unwrap_or_default();
        // Away 30 s (from the first request that got no answer), then starting until 10 s
        // after it answered again and its `/readyz` said ok (7.6 s not ready, recorded).
        let note = "s while the API server did not answer or was starting not counted against spec.timeout and the readiness timeouts)";
        assert!(
            told.starts_with("revision 1 ") && told.ends_with(note),
            "the message says how long was paused: {told}"
        );
        let head = &told[..told.len() - note.len()];
        let paused: u64 = head
            .rsplit(" (")
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{told}"));
        assert!((30..=50).contains(&paused), "{told}");
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.reason != "Timeout"),
            "{:?}",
            status.conditions
        );
        controller.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_release_is_stalled_forbidden_while_a_restarted_server_refuses_service_accounts() {
    within(async {
        let op = Operator::without_controller().await;
        // The controller runs as its own service account (cluster-admin), and the release acts
        // as `deployer`, which may do everything in its namespace: both are refused by a
        // restarted server until RBAC's caches are loaded.
        let controller_account = "system:serviceaccount:sequenced-system:sequenced";
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "sequenced"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "sequenced", "namespace": "sequenced-system"}]})).await;
        op.namespace("team").await;
        admin_apply(&op, json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "deployer", "namespace": "team"}})).await;
        admin_apply(&op, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "deployer", "namespace": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": "team"}]})).await;
        let controller = Controller::start_as(
            op.server.config_as_user("sequenced", controller_account, &[]),
            "sequenced",
            8,
            Tenancy::default(),
        );
        let dir = pair();
        op.create(
            "team",
            release("pair", &dir.path().join("pair"), json!({"serviceAccountName": "deployer"})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "team", "app").await;

        op.server.kill();
        tokio::time::sleep(Duration::from_secs(3)).await;
        op.server.clear_requests();
        // A refusal window longer than the recorded 1.4 s, so that reconciles meet it.
        op.server.restart_with(Restart {
            rbac: Duration::from_secs(4),
            ..Restart::default()
        });
        let _kubelet = op.kubelet();
        let sr = stored_until(
            &op.server,
            "team",
            "pair",
            Duration::from_secs(30),
            "Ready",
            is_ready,
        )
        .await;
        assert_eq!(sr.status.as_ref().and_then(|s| s.revision), Some(1));
        let requests = op.server.requests();
        let refused = requests
            .iter()
            .filter(|r| r.status == 403 && r.client.as_deref() == Some("sequenced"))
            .count();
        assert!(refused > 0, "the controller was refused after the restart");
        let stalled: Vec<&Value> = requests
            .iter()
            .filter(|r| r.kind.as_deref() == Some("SequencedRelease") && r.subresource.as_deref() == Some("status"))
            .filter_map(|r| r.body.as_ref())
            .filter(|body| {
                body.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|conditions| {
                        conditions.iter().any(|c| {
                            c["type"] == "Stalled" && c["status"] == "True" && c["reason"] == "Forbidden"
                        })
                    })
            })
            .collect();
        assert!(stalled.is_empty(), "stalled Forbidden by the refusals of a starting server: {stalled:?}");
        assert!(!is_stalled(&sr));
        controller.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_goes_on_after_an_etcd_outage_and_what_failed_meanwhile_is_told() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        let dir = pair();
        op.create(
            "default",
            release("pair", &dir.path().join("pair"), json!({})),
        )
        .await;
        op.wait_release("default", "pair", "Ready", is_ready).await;
        // An upgrade, and etcd goes away as it starts: requests wait 2 s for it, then answer
        // 504. The reconciles fail, and so does every write of the status that would tell it.
        op.server.set_storage_timeout(Duration::from_secs(2));
        op.patch_spec("pair", json!({"values": {"version": 2}}))
            .await;
        op.server.set_storage_down(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        op.server.set_storage_down(false);
        let sr = stored_until(
            &op.server,
            "default",
            "pair",
            Duration::from_secs(15),
            "Ready at revision 2",
            |sr| is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2),
        )
        .await;
        assert!(sr.status.is_some());
        let note = op.wait_event("default", "pair", "ReconcileFailed").await;
        assert!(
            note.contains("while the API server could not serve them") && note.contains("Timeout"),
            "{note}"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_member_lease_is_deleted_by_the_replica_that_took_its_shards() {
    within(async {
        let op = Operator::without_controller().await;
        let a = op.spawn("replica-a", 4);
        let b = op.spawn("replica-b", 4);
        op.wait_shards_spread(&["replica-a", "replica-b"]).await;
        let leases: Api<Lease> = Api::namespaced(op.client.clone(), "default");
        assert!(
            leases
                .get_opt("sequenced.member.replica-a")
                .await
                .unwrap()
                .is_some()
        );
        let dir = pair();
        op.create(
            "default",
            release("pair", &dir.path().join("pair"), json!({})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "app")
            .await;
        a.kill().await;
        // replica-b takes every shard, and deletes replica-a's member Lease.
        op.wait_shards_spread(&["replica-b"]).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while leases
            .get_opt("sequenced.member.replica-a")
            .await
            .unwrap()
            .is_some()
        {
            assert!(
                Instant::now() < deadline,
                "replica-a's member Lease is left behind"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _kubelet = op.kubelet();
        let sr = op.wait_release("default", "pair", "Ready", is_ready).await;
        assert_eq!(sr.status.as_ref().and_then(|s| s.revision), Some(1));
        assert_eq!(sr.status.and_then(|s| s.lock), None);
        b.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_replica_started_long_after_a_crash_owns_every_shard_in_its_first_round() {
    within(async {
        let op = Operator::without_controller().await;
        // A replica with the operator's Leases (15 s) that crashed in the middle of a layer.
        let crashed = production_controller(&op, "crashed");
        op.wait_shards_spread(&["crashed"]).await;
        let dir = pair();
        op.create("default", release("pair", &dir.path().join("pair"), json!({})))
            .await;
        op.wait_object("apps/v1", "Deployment", "default", "app").await;
        crashed.kill().await;
        // Long ago: its member Lease was last renewed ten minutes before now.
        let leases: Api<Lease> = Api::namespaced(op.client.clone(), "default");
        let long_ago = k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(600))
            .unwrap();
        leases
            .patch(
                "sequenced.member.crashed",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(long_ago)}})),
            )
            .await
            .unwrap();
        op.server.clear_requests();
        let fresh = production_controller(&op, "fresh");
        let _kubelet = op.kubelet();
        let sr = op.wait_release("default", "pair", "Ready", is_ready).await;
        assert_eq!(sr.status.and_then(|s| s.revision), Some(1));
        // Its first round (before its second listing of the Leases) claimed all 32 shards.
        let requests = op.server.requests();
        let rounds: Vec<usize> = requests
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.client.as_deref() == Some("fresh")
                    && r.verb == "list"
                    && r.kind.as_deref() == Some("Lease")
                    && r.query.contains("sequenced.dev%2Flease")
            })
            .map(|(i, _)| i)
            .collect();
        let first_round = &requests[rounds[0]..rounds.get(1).copied().unwrap_or(requests.len())];
        let claimed = first_round
            .iter()
            .filter(|r| {
                r.client.as_deref() == Some("fresh")
                    && r.verb == "update"
                    && r.status == 200
                    && r.name.as_deref().is_some_and(|n| n.starts_with("sequenced.shard."))
            })
            .count();
        assert_eq!(claimed, 32, "every shard in the first round");
        assert!(
            leases.get_opt("sequenced.member.crashed").await.unwrap().is_none(),
            "the crashed replica's member Lease is gone"
        );
        let note = op.wait_event("default", "pair", "LockTakenOver").await;
        assert!(note.contains("crashed"), "{note}");
        fresh.stop().await;
    })
    .await;
}
