//! Controller benchmarks on the in-process test API server (a bench binary, not criterion: each
//! sample is a whole scenario).
//!
//! 1. Layer hand-off latency: from the status write that makes the last prerequisite of layer
//!    `app` ready to the first apply request of `app`. Target: median under 100 ms.
//! 2. `dependsOn` hand-off latency: from the status write that makes a Deployment a release
//!    depends on available to the first apply of that release (target: well under a second).
//! 3. A reconcile that finds nothing to do: API writes (target 0) and the CPU time of one
//!    reconcile (target under 2 ms), summed over the polls of its future on thread CPU clocks;
//!    and, as an upper bound, the whole process's CPU time per touch of the release (the
//!    reconcile, the watch events that trigger it, the test server's own work).
//!
//! `cargo bench --bench controller` (set SEQUENCED_HELM or run scripts/install-helm.sh first).

use sequenced_testkit as support;

use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use sequenced::api::v1alpha1::LayerPhase;
use sequenced::controller::Tenancy;
use serde_json::json;
use support::charts::{is_ready, pair, release, repo};
use support::operator::{Controller, Operator, is_dry_run, is_shard_keeping, is_write};
use support::process::cpu_time;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn layer_is(
    sr: &sequenced::api::v1alpha1::SequencedRelease,
    name: &str,
    phase: LayerPhase,
) -> bool {
    sr.status
        .as_ref()
        .is_some_and(|s| s.layers.iter().any(|l| l.name == name && l.phase == phase))
}

async fn handoff(op: &Operator, samples: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let ns = format!("handoff-{i}");
        op.namespace(&ns).await;
        op.create(
            &ns,
            release("shop", &repo().join("examples/shop"), json!({})),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", &ns, "db").await;
        op.wait_object("apps/v1", "Deployment", &ns, "queue-processor")
            .await;
        op.wait_release(&ns, "shop", "database and queue waiting", |sr| {
            layer_is(sr, "database", LayerPhase::Waiting)
                && layer_is(sr, "queue", LayerPhase::Waiting)
        })
        .await;
        assert!(op.deployment_ready(&ns, "db"));
        op.wait_release(&ns, "shop", "database ready", |sr| {
            layer_is(sr, "database", LayerPhase::Ready)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let ready_at = Instant::now();
        assert!(op.deployment_ready(&ns, "queue-processor"));
        op.wait_object("apps/v1", "Deployment", &ns, "my-app").await;
        let applied = op
            .first_apply("Deployment", &ns, "my-app")
            .expect("my-app applied");
        latencies.push(applied.saturating_duration_since(ready_at));
    }
    latencies
}

/// From the status write that makes a Deployment a release `dependsOn` available to the first
/// apply of that release's object (its `interval` is an hour: only the watch on the Deployment
/// can start it).
async fn dependency_handoff(op: &Operator, samples: usize) -> Vec<Duration> {
    let web = support::charts::chart(
        "web",
        &[(
            "templates/web.yaml",
            &support::charts::config_map("web", "a.b/c: d"),
        )],
    );
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let ns = format!("dependency-{i}");
        op.namespace(&ns).await;
        let mut db: serde_json::Value =
            serde_yaml_ng::from_str(&support::charts::deployment("db", "a.b/c: d")).unwrap();
        db["metadata"]["namespace"] = json!(ns);
        let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
            kube::Api::namespaced(op.client.clone(), &ns);
        deployments
            .create(&Default::default(), &serde_json::from_value(db).unwrap())
            .await
            .unwrap();
        op.create(
            &ns,
            release(
                "web",
                &web.path().join("web"),
                json!({"interval": "1h", "dependsOn": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "db"}]}),
            ),
        )
        .await;
        op.wait_release(&ns, "web", "waiting for db", |sr| {
            sr.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.starts_with("waiting for Deployment"))
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let ready_at = Instant::now();
        assert!(op.deployment_ready(&ns, "db"));
        op.wait_object("v1", "ConfigMap", &ns, "web").await;
        let applied = op
            .first_apply("ConfigMap", &ns, "web")
            .expect("web applied");
        latencies.push(applied.saturating_duration_since(ready_at));
    }
    latencies
}

async fn idle_reconciles(op: &Operator, touches: usize) -> Idle {
    let kubelet = op.kubelet();
    op.namespace("idle").await;
    op.create(
        "idle",
        release("shop", &repo().join("examples/shop"), json!({})),
    )
    .await;
    op.wait_release("idle", "shop", "Ready", is_ready).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(kubelet);
    tokio::time::sleep(Duration::from_millis(100)).await;
    op.server.clear_requests();
    let api = op.releases("idle");
    let before = cpu_time();
    let reconciles_before = op.metrics.reconcile_cpu.get_sample_count();
    let reconcile_cpu_before = op.metrics.reconcile_cpu.get_sample_sum();
    for i in 0..touches {
        let patch = json!({"metadata": {"annotations": {"example.com/touch": i.to_string()}}});
        api.patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cpu = cpu_time().saturating_sub(before);
    let reconciles = op.metrics.reconcile_cpu.get_sample_count() - reconciles_before;
    let reconcile_cpu = Duration::from_secs_f64(
        (op.metrics.reconcile_cpu.get_sample_sum() - reconcile_cpu_before).max(0.0),
    );
    let writes = op
        .server
        .requests()
        .iter()
        .filter(|r| {
            is_write(r)
                && !is_shard_keeping(r)
                && !(r.kind.as_deref() == Some("SequencedRelease") && r.subresource.is_none())
        })
        .count();
    // The drift check of a woken Ready release looks deletions up in the watches' index.
    let reads = op
        .server
        .requests()
        .iter()
        .filter(|r| {
            matches!(r.verb, "get" | "list")
                && r.kind.as_deref() != Some("SequencedRelease")
                && !is_shard_keeping(r)
        })
        .count();
    Idle {
        reads,
        writes,
        reconciles,
        reconcile_cpu: reconcile_cpu / u32::try_from(reconciles.max(1)).unwrap_or(1),
        process_cpu: cpu / touches as u32,
    }
}

/// What the drift checks of a Ready release cost: requests per full check (at each
/// `interval`) and how long one takes, over `seconds` with `interval: 1s`.
async fn drift_checks(op: &Operator, seconds: u64) -> (usize, usize, usize, Duration) {
    let kubelet = op.kubelet();
    op.namespace("drift").await;
    op.create(
        "drift",
        release(
            "shop",
            &repo().join("examples/shop"),
            json!({"interval": "1s"}),
        ),
    )
    .await;
    op.wait_release("drift", "shop", "Ready", is_ready).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(kubelet);
    op.server.clear_requests();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let requests = op.server.requests();
    let ours: Vec<_> = requests
        .iter()
        .filter(|r| {
            r.namespace.as_deref() == Some("drift")
                && !matches!(
                    r.kind.as_deref(),
                    Some("SequencedRelease" | "Lease" | "Event" | "Secret")
                )
                && r.verb != "watch"
        })
        .collect();
    let dry_runs: Vec<_> = ours.iter().filter(|r| is_dry_run(r)).collect();
    let objects = dry_runs
        .iter()
        .filter_map(|r| r.name.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let checks = dry_runs.len() / objects.max(1);
    // One check: from its first request to its last (they come in a burst).
    let mut longest = Duration::ZERO;
    for burst in ours.chunk_by(|a, b| b.at.duration_since(a.at) < Duration::from_millis(200)) {
        if let (Some(first), Some(last)) = (burst.first(), burst.last()) {
            longest = longest.max(last.at.duration_since(first.at));
        }
    }
    (ours.len(), checks, objects, longest)
}

/// What the reconciles of a release that has nothing to do cost.
struct Idle {
    /// Reads of anything but the release itself.
    reads: usize,
    writes: usize,
    reconciles: u64,
    /// CPU time of one reconcile, summed over its polls.
    reconcile_cpu: Duration,
    /// The whole process's CPU time per touch of the release: the reconcile, the watch events,
    /// the test API server's work. An upper bound.
    process_cpu: Duration,
}

/// A release in the middle of a rollout (its second layer waits for a Deployment) when the API
/// server is killed for `down`; restarted as kube-apiserver 1.36 restarts (custom resources 503
/// for 2.4 s, service accounts refused for 1.4 s, watches from before 410), the Deployment
/// becomes available at once: how long from the server answering again to the release being
/// Ready (read in-process, so that no client's own wait for a 503's `Retry-After` is counted).
/// The controller keeps its shards as the operator does by default (15 s Leases).
async fn outage(down: Duration) -> Duration {
    let op = Operator::without_controller().await;
    let controller = Controller::start_sharded(
        op.server.config_as("outage"),
        "outage",
        8,
        Tenancy::default(),
        sequenced::lock::Sharding::default(),
    );
    op.wait_shards_spread(&["outage"]).await;
    let dir = pair();
    op.create(
        "default",
        release("pair", &dir.path().join("pair"), json!({})),
    )
    .await;
    op.wait_object("apps/v1", "Deployment", "default", "app")
        .await;
    op.server.kill();
    tokio::time::sleep(down).await;
    op.server.restart();
    let up = Instant::now();
    let _kubelet = op.kubelet();
    let ready = op
        .server
        .wait_until(Duration::from_secs(120), |server| {
            server
                .object(
                    "sequenced.dev/v1alpha1",
                    "SequencedRelease",
                    Some("default"),
                    "pair",
                )
                .and_then(|o| serde_json::from_value(o).ok())
                .is_some_and(|sr| is_ready(&sr))
        })
        .await;
    assert!(ready, "the release is Ready after the restart");
    let after = up.elapsed();
    controller.stop().await;
    after
}

fn main() {
    // Test runners list tests first (`--list`): this binary has none to offer them.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `cargo bench` passes --bench; anything else runs a short version.
    let quick = !std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let op = Operator::start(8).await;
        let samples = if quick { 2 } else { 30 };
        let mut latencies = handoff(&op, samples).await;
        latencies.sort();
        println!(
            "layer hand-off: median {:.1} ms, p90 {:.1} ms, max {:.1} ms over {} samples",
            percentile(&latencies, 0.5).as_secs_f64() * 1000.0,
            percentile(&latencies, 0.9).as_secs_f64() * 1000.0,
            latencies.last().unwrap().as_secs_f64() * 1000.0,
            latencies.len()
        );
        let mut latencies = dependency_handoff(&op, samples).await;
        latencies.sort();
        println!(
            "dependsOn hand-off (a Deployment becomes available -> the dependent's first apply): median {:.1} ms, p90 {:.1} ms, max {:.1} ms over {} samples",
            percentile(&latencies, 0.5).as_secs_f64() * 1000.0,
            percentile(&latencies, 0.9).as_secs_f64() * 1000.0,
            latencies.last().unwrap().as_secs_f64() * 1000.0,
            latencies.len()
        );
        let touches = if quick { 5 } else { 200 };
        let idle = idle_reconciles(&op, touches).await;
        println!(
            "reconcile with nothing to do: {} API writes and {} reads of its objects over {} reconciles ({touches} touches); {:.3} ms CPU per reconcile; {:.3} ms process CPU per touch (upper bound: watch events and the test server included)",
            idle.writes,
            idle.reads,
            idle.reconciles,
            idle.reconcile_cpu.as_secs_f64() * 1000.0,
            idle.process_cpu.as_secs_f64() * 1000.0
        );
        let seconds = if quick { 3 } else { 20 };
        let (requests, checks, objects, longest) = drift_checks(&op, seconds).await;
        println!(
            "drift checks (interval 1s, {seconds} s): {checks} full checks of {objects} objects, {requests} requests ({:.1} per object per check), the longest check {:.1} ms",
            requests as f64 / (checks.max(1) * objects.max(1)) as f64,
            longest.as_secs_f64() * 1000.0
        );
        op.stop().await;
        let outages: &[u64] = if quick { &[2] } else { &[10, 20, 30] };
        let runs = if quick { 1 } else { 5 };
        for &seconds in outages {
            let mut after = Vec::new();
            for _ in 0..runs {
                after.push(outage(Duration::from_secs(seconds)).await);
            }
            after.sort();
            println!(
                "API server killed for {seconds} s in the middle of a rollout and restarted: the release Ready {:.1} s (median of {runs}, max {:.1} s) after it answers again",
                percentile(&after, 0.5).as_secs_f64(),
                after.last().copied().unwrap_or_default().as_secs_f64()
            );
        }
    });
}
