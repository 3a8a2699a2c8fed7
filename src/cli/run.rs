//! `sequenced run`: the operator.

use std::process::ExitCode;

use super::{RunArgs, fail};
use crate::chart::source::ChartCache;
use crate::controller::{self, Options};
use crate::helm::Helm;

/// Runs the controller until SIGTERM or SIGINT.
pub fn run(args: &RunArgs) -> ExitCode {
    init_logging();
    let helm = match Helm::locate() {
        Ok(helm) => helm,
        Err(e) => return fail(&e.to_string()),
    };
    let identity = args.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "sequenced".to_string())
    });
    let options = Options {
        helm,
        cache: ChartCache::new(ChartCache::default_dir()),
        concurrency: args.concurrency,
        identity,
        stats: Default::default(),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("no cluster to talk to (kubeconfig or in-cluster config): {e}"))?;
        tracing::info!(
            concurrency = options.concurrency,
            metrics_addr = %args.metrics_addr,
            "starting; metrics and health endpoints arrive with issue 7"
        );
        controller::run(client, options, shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
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
    tracing::info!("shutting down: finishing the reconciles in flight");
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
