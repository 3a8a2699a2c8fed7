//! `sequenced reconcile` and `sequenced rollback`: ask the operator, through annotations on the
//! SequencedRelease, to reconcile it now or to roll it back, then wait until it has acted and the
//! operation has ended (as `flux reconcile` does).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::{RequestArgs, fail};
use crate::api::{
    FORCE_REQUEST_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, ROLLBACK_REQUEST_ANNOTATION,
    ROLLBACK_REVISION_ANNOTATION, ReleasePhase, SequencedRelease, SequencedReleaseStatus,
};
use crate::readiness::parse_duration;

/// How often the release is read while waiting.
const POLL: Duration = Duration::from_millis(250);

/// What is asked for.
pub enum Request {
    Reconcile { force: bool },
    Rollback { revision: Option<u32> },
}

impl Request {
    fn annotations(&self, token: &str) -> Value {
        match self {
            Request::Reconcile { force } => json!({
                RECONCILE_REQUEST_ANNOTATION: token,
                FORCE_REQUEST_ANNOTATION: if *force { Value::from(token) } else { Value::Null },
            }),
            Request::Rollback { revision } => json!({
                ROLLBACK_REQUEST_ANNOTATION: token,
                ROLLBACK_REVISION_ANNOTATION: revision.map(|r| Value::from(r.to_string())),
            }),
        }
    }

    fn handled(&self, status: &SequencedReleaseStatus) -> Option<String> {
        match self {
            Request::Reconcile { .. } => status.last_handled_reconcile_at.clone(),
            Request::Rollback { .. } => status.last_handled_rollback_at.clone(),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Request::Reconcile { force: false } => "a reconcile",
            Request::Reconcile { force: true } => "a forced reconcile",
            Request::Rollback { .. } => "a rollback",
        }
    }
}

pub fn run(args: &RequestArgs, request: Request) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("cannot start: {e}")),
    };
    match runtime.block_on(ask(args, &request)) {
        Ok(code) => code,
        Err(message) => fail(&message),
    }
}

async fn ask(args: &RequestArgs, request: &Request) -> Result<ExitCode, String> {
    let timeout = parse_duration(&args.timeout).map_err(|e| format!("--timeout: {e}"))?;
    let config = kube::Config::infer()
        .await
        .map_err(|e| format!("no cluster to talk to: {e}"))?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(|e| format!("no cluster: {e}"))?;
    let api: Api<SequencedRelease> = Api::namespaced(client, &namespace);
    let release = format!("{namespace}/{}", args.name);
    let token = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"metadata": {"annotations": request.annotations(&token)}});
    match api
        .patch(&args.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(format!("SequencedRelease {release} not found"));
        }
        Err(e) => return Err(format!("requesting {} of {release}: {e}", request.what())),
    }
    if args.no_wait {
        println!("requested {} of {release} (token {token})", request.what());
        return Ok(ExitCode::SUCCESS);
    }
    let deadline = Instant::now() + timeout;
    loop {
        let sr = api
            .get(&args.name)
            .await
            .map_err(|e| format!("reading SequencedRelease {release}: {e}"))?;
        let status = sr.status.unwrap_or_default();
        let handled = request.handled(&status).as_deref() == Some(token.as_str());
        let busy =
            crate::rollout::holds_lock(status.phase) || status.phase == Some(ReleasePhase::Pending);
        if handled && !busy {
            let phase = status
                .phase
                .map(|p| format!("{p:?}"))
                .unwrap_or_else(|| "no phase".to_string());
            let revision = status.revision.unwrap_or(0);
            let message = status.message.unwrap_or_default();
            println!("{}: {phase} at revision {revision}: {message}", args.name);
            let refused = matches!(request, Request::Rollback { .. })
                && message.starts_with("rollback refused");
            return Ok(if status.phase == Some(ReleasePhase::Failed) || refused {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            });
        }
        if Instant::now() >= deadline {
            let waiting = if handled {
                "the operation to end"
            } else {
                "the operator to act on it"
            };
            return Err(format!(
                "requested {} of {release}; gave up after {} waiting for {waiting}",
                request.what(),
                args.timeout
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}
