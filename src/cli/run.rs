//! `sequenced run`: the operator, with its metrics and health endpoints.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use super::{RunArgs, fail};
use crate::chart::source::ChartCache;
use crate::controller::{self, Options, Tenancy};
use crate::helm::Helm;
use crate::metrics::{self, Metrics};

/// Runs the controller until SIGTERM or SIGINT.
pub fn run(args: &RunArgs) -> ExitCode {
    init_logging();
    let helm = match Helm::locate() {
        Ok(helm) => helm,
        Err(e) => return fail(&e.to_string()),
    };
    let metrics_addr: SocketAddr = match args.metrics_addr.parse() {
        Ok(addr) => addr,
        Err(_) => {
            return fail(&format!(
                "--metrics-addr {:?}: not a HOST:PORT address such as 0.0.0.0:8080",
                args.metrics_addr
            ));
        }
    };
    let metrics = match Metrics::new() {
        Ok(metrics) => Arc::new(metrics),
        Err(e) => return fail(&format!("cannot register the metrics: {e}")),
    };
    let identity = args.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "sequenced".to_string())
    });
    let multi_tenant = args.multi_tenant || args.default_service_account.is_some();
    let policy = match source_policy(args, multi_tenant) {
        Ok(policy) => policy,
        Err(e) => return fail(&e),
    };
    let options = Options {
        helm: helm.with_output_limit(args.render_output_limit),
        kubectl: crate::kubectl::Kubectl::locate(),
        cache: ChartCache::new(ChartCache::default_dir())
            .with_policy(policy)
            .with_budget(args.chart_cache_size),
        concurrency: args.concurrency,
        identity,
        metrics: Arc::clone(&metrics),
        tenancy: Tenancy {
            default_service_account: args.default_service_account.clone(),
            no_cross_namespace_refs: args.no_cross_namespace_refs,
            multi_tenant: args.multi_tenant,
            allow_local_charts: args.allow_local_charts.clone(),
            require_verified_charts: args.require_verified_charts,
        },
        sharding: crate::lock::Sharding {
            shards: args.shards,
            namespace: args.shard_namespace.clone().unwrap_or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "default".to_string())
            }),
            lease_duration: args.shard_lease_duration,
        },
        drift_full_check_interval: args.drift_full_check_interval,
        take_pending_after: args.take_pending_after,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(async {
        let config = kube::Config::infer()
            .await
            .map_err(|e| format!("no cluster to talk to (kubeconfig or in-cluster config): {e}"))?;
        let client = kube::Client::try_from(config.clone())
            .map_err(|e| format!("no cluster to talk to (kubeconfig or in-cluster config): {e}"))?;
        let (bound, server) = metrics::serve(
            metrics_addr,
            metrics,
            metrics::version_check(client.clone()),
        )
        .await
        .map_err(|e| format!("--metrics-addr {metrics_addr}: {e}"))?;
        tokio::spawn(server);
        tracing::info!(
            concurrency = options.concurrency,
            metrics = %bound,
            "starting: /metrics, /healthz and /readyz are served"
        );
        controller::run(config, options, shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    });
    // A chart render still running in a blocking thread must not hold the exit back.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// Where charts may be fetched from, as the flags say.
fn source_policy(
    args: &RunArgs,
    multi_tenant: bool,
) -> Result<crate::chart::egress::SourcePolicy, String> {
    let allow = args
        .chart_source_allow
        .iter()
        .filter(|a| !a.trim().is_empty())
        .map(|a| a.parse().map_err(|e| format!("--chart-source-allow: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let deny = args
        .chart_source_deny
        .iter()
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            let d = d.trim();
            d.parse::<ipnet::IpNet>()
                .or_else(|_| d.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    format!("--chart-source-deny: {d:?} is not an address range (10.96.0.0/12)")
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(crate::chart::egress::SourcePolicy {
        allow,
        deny,
        multi_tenant,
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!(
        "shutting down: no new steps; the API calls in flight finish, then every lease held is released"
    );
}

/// Logs to stderr: human-readable on a terminal, one JSON object a line elsewhere (in a pod);
/// the level from `RUST_LOG` (default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if std::io::stderr().is_terminal() {
        builder.try_init()
    } else {
        builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    };
}
