//! What multi-tenant mode's bounds cost (a bench binary, not criterion: it runs the real helm).
//!
//! - Renders per second through the render permits shared fairly between namespaces, against a
//!   plain semaphore of as many permits as cores (the operator before them), for releases of one
//!   namespace and of four; and how long another namespace's render waits behind a namespace with
//!   a queue of slow renders.
//! - The chart cache's eviction under a budget: a cache of many archives over its budget.
//!
//! `cargo bench --bench tenancy` (set SEQUENCED_HELM or run scripts/install-helm.sh first).

use sequenced_testkit as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sequenced::chart::source::{ChartCache, ChartReference};
use sequenced::controller::plans::Renders;
use sequenced::helm::Helm;
use sequenced::pipeline::{self, ChartSource, RenderRequest, Resolved};

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// How the renders of the bench wait for their turn.
#[derive(Clone)]
enum Gate {
    /// The operator before: one semaphore of as many permits as cores.
    Plain(Arc<tokio::sync::Semaphore>),
    /// Now: permits shared between namespaces.
    Fair(Arc<Renders>),
}

impl Gate {
    /// Renders `chart` for a release of `namespace` once it has its permit; the moment it got it.
    async fn render(&self, namespace: &str, helm: &Helm, chart: &Resolved) -> Instant {
        let request = RenderRequest {
            release_name: "bench".into(),
            namespace: namespace.into(),
            ..RenderRequest::default()
        };
        let (_plain, _fair);
        match self {
            Gate::Plain(semaphore) => _plain = Some(semaphore.acquire().await.expect("open")),
            Gate::Fair(renders) => _fair = Some(renders.acquire(namespace).await),
        }
        let permitted = Instant::now();
        pipeline::render(helm, chart, &request)
            .await
            .expect("render");
        permitted
    }
}

async fn resolve(helm: &Helm, path: &std::path::Path) -> Resolved {
    let cache = ChartCache::new(std::env::temp_dir());
    pipeline::resolve(
        helm,
        &cache,
        &ChartSource::Reference(ChartReference::Path(path.to_path_buf())),
        None,
    )
    .await
    .expect("resolve")
}

/// Renders per second for `renders` renders spread over `namespaces` namespaces, all asked at once.
async fn throughput(
    gate: &Gate,
    helm: &Helm,
    chart: &Resolved,
    renders: usize,
    namespaces: usize,
) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..renders)
        .map(|i| {
            let (gate, helm, chart) = (gate.clone(), helm.clone(), chart.clone());
            tokio::spawn(async move {
                gate.render(&format!("team-{}", i % namespaces), &helm, &chart)
                    .await;
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("render task");
    }
    renders as f64 / started.elapsed().as_secs_f64()
}

/// How long one render of `team-b` waits for its permit while `team-a` has `queued` slow renders
/// asked before it.
async fn waited(
    gate: &Gate,
    helm: &Helm,
    slow: &Resolved,
    fast: &Resolved,
    queued: usize,
) -> Duration {
    let tasks: Vec<_> = (0..queued)
        .map(|_| {
            let (gate, helm, slow) = (gate.clone(), helm.clone(), slow.clone());
            tokio::spawn(async move {
                gate.render("team-a", &helm, &slow).await;
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    // The render's own time is not waiting: measured to the moment it has its permit.
    let permitted = gate.render("team-b", helm, fast).await;
    for task in tasks {
        task.await.expect("slow task");
    }
    permitted - asked
}

fn eviction() {
    let dir = tempfile::tempdir().expect("cache dir");
    let (sources, per_source, size) = (100usize, 10usize, 50 * 1024usize);
    let body = vec![7u8; size];
    for s in 0..sources {
        let source = dir.path().join(format!("{s:024x}"));
        std::fs::create_dir_all(&source).unwrap();
        for v in 0..per_source {
            std::fs::write(source.join(format!("chart-{v}.0.0.tgz")), &body).unwrap();
        }
    }
    let total = (sources * per_source * size) as u64;
    let cache = ChartCache::new(dir.path()).with_budget(total / 4);
    let in_use: std::collections::HashSet<_> = (0..sources)
        .map(|s| dir.path().join(format!("{s:024x}")).join("chart-0.0.0.tgz"))
        .collect();
    let started = Instant::now();
    let evicted = cache.evict(&in_use);
    let took = started.elapsed();
    let again = Instant::now();
    let idle = cache.evict(&in_use);
    println!(
        "eviction: {} archives ({} MiB) over a budget of {} MiB, {} in use: removed {} ({} MiB) in {:.1} ms; under the budget, a pass takes {:.1} ms and removes {}",
        sources * per_source,
        total >> 20,
        (total / 4) >> 20,
        in_use.len(),
        evicted.removed,
        evicted.freed >> 20,
        took.as_secs_f64() * 1000.0,
        again.elapsed().as_secs_f64() * 1000.0,
        idle.removed,
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let helm = Helm::at(support::helm());
    let shop = support::charts::repo().join("examples/shop");
    let slow_dir = support::charts::chart(
        "slow",
        &[(
            "templates/slow.yaml",
            "{{- range until 3000000 }}{{- end }}\nkind: ConfigMap\napiVersion: v1\nmetadata:\n  name: slow\n",
        )],
    );
    runtime.block_on(async {
        let chart = resolve(&helm, &shop).await;
        let slow = resolve(&helm, &slow_dir.path().join("slow")).await;
        let cores = cores();
        println!("{cores} cores; renders of examples/shop with helm {}", helm.version().await.unwrap_or_default());
        let renders = 48;
        for namespaces in [1, 4] {
            let plain = Gate::Plain(Arc::new(tokio::sync::Semaphore::new(cores)));
            let fair = Gate::Fair(Arc::new(Renders::new(cores)));
            // A warm-up render each, then the measures.
            throughput(&plain, &helm, &chart, 2, 1).await;
            let before = throughput(&plain, &helm, &chart, renders, namespaces).await;
            let after = throughput(&fair, &helm, &chart, renders, namespaces).await;
            println!(
                "{renders} renders over {namespaces} namespace(s): {before:.1} renders/s before (a semaphore of {cores}), {after:.1} renders/s with fair permits ({:+.0} %)",
                (after / before - 1.0) * 100.0
            );
        }
        for queued in [8] {
            let plain = Gate::Plain(Arc::new(tokio::sync::Semaphore::new(cores)));
            let fair = Gate::Fair(Arc::new(Renders::new(cores)));
            let before = waited(&plain, &helm, &slow, &chart, queued).await;
            let after = waited(&fair, &helm, &slow, &chart, queued).await;
            println!(
                "another namespace's render behind {queued} slow renders of one namespace: waited {:.2} s before, {:.3} s with fair permits",
                before.as_secs_f64(),
                after.as_secs_f64()
            );
        }
    });
    eviction();
}
