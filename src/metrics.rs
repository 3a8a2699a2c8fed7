//! Prometheus metrics of the controller, and the HTTP server for `/metrics`, `/healthz` and
//! `/readyz`. Labels are bounded: a result, an error category, a phase; never an object's name or
//! an error's text.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets from a millisecond to ten minutes: API calls, renders, layer waits.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];
/// Buckets for the CPU time of one reconcile: ten microseconds to a second.
const CPU_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 1.0,
];

/// Every phase a release can be in, so that `sequenced_releases` shows zeros too.
pub const PHASES: [&str; 9] = [
    "None",
    "Pending",
    "Rendering",
    "Deploying",
    "Ready",
    "Failed",
    "RollingBack",
    "Uninstalling",
    "Testing",
];

/// The controller's metrics, registered in their own registry, and its readiness.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by result: `success` or `error`.
    pub reconciles: IntCounterVec,
    /// Failed reconciles by error category.
    pub reconcile_errors: IntCounterVec,
    /// Wall time of one reconcile.
    pub reconcile_duration: Histogram,
    /// CPU time of one reconcile.
    pub reconcile_cpu: Histogram,
    /// Time `helm template` and planning took.
    pub render_duration: Histogram,
    /// Time applying one layer took, by stage (`crds`, `layer`, `prune`, `delete`).
    pub layer_apply_duration: HistogramVec,
    /// Time from a layer's start to its readiness.
    pub layer_wait_duration: Histogram,
    /// Releases by phase.
    pub releases: IntGaugeVec,
    /// Leases taken over from a holder that stopped renewing them.
    pub lock_takeovers: IntCounter,
    /// Writes of a release's status or finalizers answered 409 (read again, the reconcile
    /// started again from the fresh copy).
    pub status_conflicts: IntCounter,
    /// Resources that did not become ready in time.
    pub readiness_timeouts: IntCounter,
    /// Drift corrections started (`spec.driftDetection: enabled`).
    pub drift_corrections: IntCounter,
    /// Shards this replica owns (acts on, watches and caches the releases of).
    pub shards_owned: IntGauge,
    /// Shards this replica gained (`acquired`) or stopped owning (`released`).
    pub shard_moves: IntCounterVec,
    /// From the API server answering again after an outage to the first step of each release
    /// that was in the middle of an operation.
    pub outage_recovery: Histogram,
    synced: AtomicBool,
    /// Reads the phase of every release when `sequenced_releases` is scraped.
    phases: std::sync::Mutex<Option<PhaseSource>>,
}

/// The phases of every release, read at scrape time.
pub type PhaseSource = Box<dyn Fn() -> Vec<String> + Send + Sync>;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn histogram(name: &str, help: &str, buckets: &[f64]) -> Result<Histogram, prometheus::Error> {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
}

impl Metrics {
    /// A fresh registry with every metric, and the process metrics (memory, CPU, open fds).
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let metrics = Metrics {
            reconciles: IntCounterVec::new(
                Opts::new(
                    "sequenced_reconcile_total",
                    "Reconciles by result (success, error)",
                ),
                &["result"],
            )?,
            reconcile_errors: IntCounterVec::new(
                Opts::new(
                    "sequenced_reconcile_errors_total",
                    "Failed reconciles by error category",
                ),
                &["category"],
            )?,
            reconcile_duration: histogram(
                "sequenced_reconcile_duration_seconds",
                "Wall time of one reconcile",
                BUCKETS,
            )?,
            reconcile_cpu: histogram(
                "sequenced_reconcile_cpu_seconds",
                "CPU time of one reconcile",
                CPU_BUCKETS,
            )?,
            render_duration: histogram(
                "sequenced_render_duration_seconds",
                "Time to render (helm template) and plan a chart",
                BUCKETS,
            )?,
            layer_apply_duration: HistogramVec::new(
                HistogramOpts::new(
                    "sequenced_layer_apply_duration_seconds",
                    "Time to apply (or delete) the objects of one layer",
                )
                .buckets(BUCKETS.to_vec()),
                &["stage"],
            )?,
            layer_wait_duration: histogram(
                "sequenced_layer_wait_duration_seconds",
                "Time from a layer's start until all its resources were ready",
                BUCKETS,
            )?,
            releases: IntGaugeVec::new(
                Opts::new("sequenced_releases", "SequencedReleases by phase"),
                &["phase"],
            )?,
            lock_takeovers: IntCounter::new(
                "sequenced_lock_takeovers_total",
                "Release locks taken over from a holder that stopped renewing them",
            )?,
            status_conflicts: IntCounter::new(
                "sequenced_status_conflicts_total",
                "Writes of a release's status or finalizers answered 409 Conflict: the release was read again and its reconcile started again from it at once",
            )?,
            readiness_timeouts: IntCounter::new(
                "sequenced_readiness_timeouts_total",
                "Resources that did not become ready within their readiness timeout",
            )?,
            drift_corrections: IntCounter::new(
                "sequenced_drift_corrections_total",
                "Drift corrections: releases whose deleted or changed objects were applied again",
            )?,
            shards_owned: IntGauge::new(
                "sequenced_shards_owned",
                "Shards this replica owns: it reconciles, watches and caches their releases only",
            )?,
            shard_moves: IntCounterVec::new(
                Opts::new(
                    "sequenced_shard_moves_total",
                    "Shards this replica acquired or released (handed over, given back or lost)",
                ),
                &["move"],
            )?,
            outage_recovery: histogram(
                "sequenced_outage_recovery_seconds",
                "Time from the API server answering again after an outage to the next step of each release that was in the middle of an operation",
                BUCKETS,
            )?,
            registry,
            synced: AtomicBool::new(false),
            phases: std::sync::Mutex::new(None),
        };
        let r = &metrics.registry;
        r.register(Box::new(metrics.reconciles.clone()))?;
        r.register(Box::new(metrics.reconcile_errors.clone()))?;
        r.register(Box::new(metrics.reconcile_duration.clone()))?;
        r.register(Box::new(metrics.reconcile_cpu.clone()))?;
        r.register(Box::new(metrics.render_duration.clone()))?;
        r.register(Box::new(metrics.layer_apply_duration.clone()))?;
        r.register(Box::new(metrics.layer_wait_duration.clone()))?;
        r.register(Box::new(metrics.releases.clone()))?;
        r.register(Box::new(metrics.lock_takeovers.clone()))?;
        r.register(Box::new(metrics.status_conflicts.clone()))?;
        r.register(Box::new(metrics.readiness_timeouts.clone()))?;
        r.register(Box::new(metrics.drift_corrections.clone()))?;
        r.register(Box::new(metrics.shards_owned.clone()))?;
        r.register(Box::new(metrics.shard_moves.clone()))?;
        r.register(Box::new(metrics.outage_recovery.clone()))?;
        for direction in ["acquired", "released"] {
            metrics
                .shard_moves
                .with_label_values(&[direction])
                .inc_by(0);
        }
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        for phase in PHASES {
            metrics.releases.with_label_values(&[phase]).set(0);
        }
        Ok(metrics)
    }

    /// Sets `sequenced_releases` from the phases of every release.
    pub fn set_releases<'a>(&self, phases: impl IntoIterator<Item = &'a str>) {
        let mut counts = std::collections::BTreeMap::new();
        for phase in PHASES {
            counts.insert(phase, 0i64);
        }
        for phase in phases {
            if let Some(count) = counts.get_mut(phase) {
                *count += 1;
            }
        }
        for (phase, count) in counts {
            self.releases.with_label_values(&[phase]).set(count);
        }
    }

    /// Where `sequenced_releases` comes from: the controller's cache of releases.
    pub fn set_phase_source(&self, source: PhaseSource) {
        if let Ok(mut phases) = self.phases.lock() {
            *phases = Some(source);
        }
    }

    /// Marks the controller's caches as synced (for `/readyz`).
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let phases = self
            .phases
            .lock()
            .ok()
            .and_then(|source| source.as_ref().map(|read| read()));
        if let Some(phases) = phases {
            self.set_releases(phases.iter().map(String::as_str));
        }
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Counts a finished reconcile.
    pub fn reconciled(&self, error_category: Option<&str>, wall: Duration, cpu: Duration) {
        let result = if error_category.is_some() {
            "error"
        } else {
            "success"
        };
        self.reconciles.with_label_values(&[result]).inc();
        if let Some(category) = error_category {
            self.reconcile_errors.with_label_values(&[category]).inc();
        }
        self.reconcile_duration.observe(wall.as_secs_f64());
        self.reconcile_cpu.observe(cpu.as_secs_f64());
    }
}

/// What `/readyz` asks beyond the caches: whether the API server answers.
pub type ApiCheck = Arc<dyn Fn() -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

/// An [`ApiCheck`] that asks the API server for its version, waiting at most two seconds.
pub fn version_check(client: kube::Client) -> ApiCheck {
    Arc::new(move || {
        let client = client.clone();
        Box::pin(async move {
            matches!(
                tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await,
                Ok(Ok(_))
            )
        })
    })
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until the task is dropped.
/// Returns the bound address (for port 0) and the server's future.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    api_reachable: ApiCheck,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let server = async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = Arc::clone(&metrics);
            let api_reachable = Arc::clone(&api_reachable);
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let metrics = Arc::clone(&metrics);
                    let api_reachable = Arc::clone(&api_reachable);
                    async move {
                        Ok::<_, Infallible>(
                            answer(request.uri().path(), &metrics, &api_reachable).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    };
    Ok((bound, server))
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert("content-type", value);
    }
    response
}

async fn answer(path: &str, metrics: &Metrics, api_reachable: &ApiCheck) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => {
            if !metrics.is_synced() {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "caches not synced yet\n".into(),
                );
            }
            if !api_reachable().await {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "the API server does not answer\n".into(),
                );
            }
            text(StatusCode::OK, "text/plain", "ok\n".into())
        }
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_of_the_design_is_exposed_with_bounded_labels() {
        let metrics = Metrics::new().unwrap();
        metrics.reconciled(None, Duration::from_millis(3), Duration::from_micros(200));
        metrics.reconciled(Some("conflict"), Duration::from_millis(3), Duration::ZERO);
        metrics.set_releases(["Ready", "Ready", "Failed", "Nonsense"]);
        let text = metrics.encode();
        for name in [
            "sequenced_reconcile_total{result=\"success\"} 1",
            "sequenced_reconcile_total{result=\"error\"} 1",
            "sequenced_reconcile_errors_total{category=\"conflict\"} 1",
            "sequenced_reconcile_duration_seconds_count 2",
            "sequenced_render_duration_seconds_count 0",
            "sequenced_layer_wait_duration_seconds_count 0",
            "sequenced_releases{phase=\"Ready\"} 2",
            "sequenced_releases{phase=\"Failed\"} 1",
            "sequenced_releases{phase=\"Deploying\"} 0",
            "sequenced_lock_takeovers_total 0",
            "sequenced_status_conflicts_total 0",
            "sequenced_readiness_timeouts_total 0",
            "sequenced_drift_corrections_total 0",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        assert!(!text.contains("Nonsense"));
    }
}
