//! `sequenced install`, `sequenced upgrade`: a release deployed from a terminal or a CI job, with
//! Helm's names, flags and exit codes, and no operator. The command is a second driver of the
//! operator's executor ([`crate::controller::drive::Driver`]): the same pipeline, the same pure
//! lifecycle and the same steps, the same per-release Lease; the release's status lives in its
//! release record instead of a SequencedRelease object ([`home::RecordHome`]).

pub mod args;
pub mod home;
pub mod output;
pub mod values;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use serde_json::{Value, json};

use self::args::{Connection, DeployArgs, OutputFormat};
use self::home::{Loaded, RecordHome};
use self::output::{Output, Summary};
use crate::api::{
    FINALIZER, FORCE_REQUEST_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, ReleasePhase,
    SequencedRelease,
};
use crate::controller::drive::{Driver, Stepped};
use crate::history::HelmStatus;
use crate::history::summary::Writer;

/// Exit code of a command that failed (as Helm's, for every error).
pub const EXIT_FAILED: u8 = 1;
/// Exit codes of a command stopped by SIGINT and SIGTERM, as a shell reports a process killed
/// by them.
pub const EXIT_SIGINT: u8 = 130;
pub const EXIT_SIGTERM: u8 = 143;

/// The most a step that waits (for readiness, a hook) is left before it is looked at again when
/// nothing wakes it sooner.
const POLL: Duration = Duration::from_millis(500);
/// After a signal, how long the step in flight has to reach its next write.
const IN_FLIGHT_BOUND: Duration = Duration::from_secs(5);

/// Which command deploys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Install,
    Upgrade { install: bool },
}

impl Mode {
    /// Helm's words before an error: `INSTALLATION FAILED`, `UPGRADE FAILED`.
    fn failed(self) -> &'static str {
        match self {
            Mode::Install => "INSTALLATION FAILED",
            Mode::Upgrade { .. } => "UPGRADE FAILED",
        }
    }
}

/// Why a command stopped before its outcome.
#[derive(Debug)]
pub struct Failure(pub String);

impl<T: std::fmt::Display> From<T> for Failure {
    fn from(e: T) -> Failure {
        Failure(e.to_string())
    }
}

/// Runs `sequenced install` or `sequenced upgrade`.
pub fn run(args: &DeployArgs, mode: Mode) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            return helm_error(
                mode.failed(),
                &format!("cannot start the async runtime: {e}"),
            );
        }
    };
    let result = runtime.block_on(deploy(args, mode));
    runtime.shutdown_timeout(Duration::from_millis(500));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Failure(message)) => helm_error(mode.failed(), &message),
    }
}

/// `Error: WHAT: message` on stderr, exit 1, as Helm reports a failed command.
pub fn helm_error(what: &str, message: &str) -> ExitCode {
    eprintln!("Error: {what}: {message}");
    ExitCode::from(EXIT_FAILED)
}

/// The kube configuration of `--kubeconfig`/`KUBECONFIG` and `--kube-context`, else the
/// in-cluster one; and the namespace of `-n`, `HELM_NAMESPACE`, else the context's.
pub async fn connect(connection: &Connection) -> Result<(kube::Config, String), Failure> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let options = KubeConfigOptions {
        context: connection.kube_context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &connection.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Failure(format!("--kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| Failure(format!("--kubeconfig {}: {e}", path.display())))?
        }
        None => match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(kubeconfig) => kube::Config::incluster().map_err(|_| {
                Failure(format!(
                    "no cluster to talk to (kubeconfig or in-cluster config): {kubeconfig}"
                ))
            })?,
        },
    };
    let namespace = connection
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((config, namespace))
}

/// `cli:USER@HOST`: who holds a release's Lease while a command runs (a random session id
/// follows it in the Lease's holder).
pub fn identity() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    format!("cli:{user}@{}", host_name())
}

fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length, and gethostname writes at most that.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    let end = buffer.iter().position(|b| *b == 0).unwrap_or(buffer.len());
    match std::str::from_utf8(&buffer[..end]) {
        Ok(name) if result == 0 && !name.is_empty() => name.to_string(),
        _ => std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".to_string()),
    }
}

/// The chart source of CHART: a directory or packaged chart, `REPO/NAME` of a repository Helm
/// knows (its repositories file), `NAME` with `--repo`, or an `oci://` reference.
fn chart_source(chart: &str, repo: Option<&str>, version: Option<&str>) -> Result<Value, Failure> {
    if let Some(url) = repo {
        return Ok(json!({"repository": url, "name": chart, "version": version}));
    }
    if chart.starts_with("oci://") {
        return Ok(json!({"oci": chart, "version": version}));
    }
    let path = Path::new(chart);
    if path.exists() {
        let absolute = std::fs::canonicalize(path)
            .map_err(|e| Failure(format!("{chart}: {}", crate::chart::io_message(&e))))?;
        if version.is_some() {
            return Err(Failure(format!(
                "--version applies to repository and oci:// charts, not to the local chart {chart}"
            )));
        }
        return Ok(json!({"path": absolute.display().to_string()}));
    }
    if let Some((repository, name)) = chart.split_once('/')
        && !name.contains('/')
        && !repository.starts_with('.')
    {
        let url = repository_url(repository)?;
        return Ok(json!({"repository": url, "name": name, "version": version}));
    }
    Err(Failure(format!(
        "{chart}: no such chart directory or packaged chart, and not REPO/NAME of a repository \
         helm knows, a NAME with --repo or an oci:// reference"
    )))
}

/// Helm's repositories file: `$HELM_REPOSITORY_CONFIG`, else Helm's default place.
fn repositories_file() -> PathBuf {
    if let Some(path) = std::env::var_os("HELM_REPOSITORY_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let config = std::env::var_os("HELM_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CONFIG_HOME")
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(p).join("helm"))
        })
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".config/helm")
        });
    config.join("repositories.yaml")
}

/// The URL of the repository Helm knows as `name`.
fn repository_url(name: &str) -> Result<String, Failure> {
    let file = repositories_file();
    let text = std::fs::read_to_string(&file).map_err(|e| {
        Failure(format!(
            "repository {name:?}: cannot read helm's repositories file {}: {} (add it with `helm repo add`)",
            file.display(),
            crate::chart::io_message(&e)
        ))
    })?;
    let parsed =
        crate::yaml::parse(&text).map_err(|e| Failure(format!("{}: {e}", file.display())))?;
    parsed
        .get("repositories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| r.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|r| r.get("url").and_then(Value::as_str))
        .map(str::to_string)
        .ok_or_else(|| {
            Failure(format!(
                "repo {name} not found in {} (add it with `helm repo add {name} URL`)",
                file.display()
            ))
        })
}

/// The release object the executor drives: never stored anywhere, its status comes from the
/// records and goes back to them.
fn release_object(
    args: &DeployArgs,
    namespace: &str,
    values: serde_json::Map<String, Value>,
    status: Option<crate::api::SequencedReleaseStatus>,
    request: Option<&str>,
) -> Result<SequencedRelease, Failure> {
    let chart = chart_source(&args.chart, args.repo.as_deref(), args.version.as_deref())?;
    let mut spec = json!({
        "chart": chart,
        "values": values,
        "createNamespace": args.create_namespace,
        "timeout": format!("{}s", args.timeout.as_secs().max(1)),
        "wait": args.waits(),
        "disableHooks": args.no_hooks,
        "onFailure": if args.rollback_on_failure || args.atomic { "rollback" } else { "keep" },
        // Helm's upgrade lets none go (a lone command has nothing to correct drift with).
        "driftDetection": {"mode": "disabled"},
    });
    if let Some(max) = args.max_history {
        spec["maxHistory"] = json!(max);
    }
    let spec = serde_json::from_value(spec).map_err(|e| Failure(format!("the release: {e}")))?;
    let mut release = SequencedRelease::new(&args.name, spec);
    release.metadata.namespace = Some(namespace.to_string());
    release.metadata.generation = Some(1);
    release.metadata.resource_version = Some("1".to_string());
    release.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    if let Some(token) = request {
        release.metadata.annotations = Some(
            [
                (RECONCILE_REQUEST_ANNOTATION.to_string(), token.to_string()),
                (FORCE_REQUEST_ANNOTATION.to_string(), token.to_string()),
            ]
            .into(),
        );
    }
    release.status = status;
    Ok(release)
}

/// A SequencedRelease of the name in the namespace manages the release: the command line
/// must not act on it (the operator would undo it).
pub async fn refuse_managed(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(), Failure> {
    let api: Api<SequencedRelease> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(_)) => Err(Failure(format!(
            "release {name} is managed by SequencedRelease {namespace}/{name}: the operator \
             deploys it (change its spec, or use `sequenced reconcile|rollback {name} -n {namespace}`)"
        ))),
        // No such object, or the CRD is not installed (no operator), or not readable.
        Ok(None) | Err(_) => Ok(()),
    }
}

/// Whether the newest record is one a command line or Helm deployed (a name in use).
fn deployed(loaded: &Loaded) -> bool {
    loaded
        .records
        .iter()
        .any(|(summary, _)| summary.status == HelmStatus::Deployed)
}

async fn deploy(args: &DeployArgs, mode: Mode) -> Result<u8, Failure> {
    // A dry run must never deploy: until it prints what it would do, it is refused.
    if args.dry_run.is_some() {
        return Err(Failure(
            "--dry-run is not supported by this command yet (nothing was read or changed): \
             `sequenced diff -f RELEASE.yaml` shows what a revision of a SequencedRelease \
             manifest would do"
                .to_string(),
        ));
    }
    if args.description.is_some() {
        eprintln!(
            "warning: --description is not recorded yet: `helm history` shows sequenced's own \
             description of the revision"
        );
    }
    let (config, namespace) = connect(&args.connection).await?;
    let helm = crate::helm::Helm::locate()?;
    let values = values::merged(&helm, &args.value_args())
        .await
        .map_err(Failure)?;
    let options = crate::controller::Options {
        helm,
        kubectl: crate::kubectl::Kubectl::locate(),
        cache: crate::chart::source::ChartCache::new(
            crate::chart::source::ChartCache::default_dir(),
        ),
        concurrency: 1,
        identity: identity(),
        metrics: Arc::new(crate::metrics::Metrics::new()?),
        tenancy: Default::default(),
        sharding: Default::default(),
        // A pending record of Helm's (a `helm upgrade` killed) is judged as the operator
        // judges it: held by a live helm until it stayed unchanged for Helm's 5m and a margin.
        take_pending_after: crate::rollout::takeover::DEFAULT_PENDING_BOUND,
        // One command deploys and ends: no interval of a Ready release comes.
        drift_full_check_interval: crate::controller::DRIFT_FULL_CHECK_INTERVAL,
    };
    let driver = Driver::new(config, options)?;
    let client = driver.client();
    refuse_managed(&client, &namespace, &args.name).await?;
    let loaded = home::load(&client, &namespace, &args.name)
        .await
        .map_err(Failure)?;
    if let Some((summary, _)) = loaded
        .records
        .iter()
        .rev()
        .find(|(s, _)| s.writer == Writer::Operator)
        && loaded.status.is_none()
    {
        return Err(Failure(format!(
            "release {} has records a SequencedRelease wrote ({}): hand it back with a \
             SequencedRelease of that name",
            args.name, summary.name
        )));
    }
    match mode {
        Mode::Install if deployed(&loaded) => {
            return Err(Failure(
                "cannot re-use a name that is still in use".to_string(),
            ));
        }
        Mode::Upgrade { install: false } if loaded.records.is_empty() => {
            return Err(Failure(format!(
                "\"{}\" has no deployed releases",
                args.name
            )));
        }
        _ => {}
    }
    let status = loaded.status.clone();
    let before = status.as_ref().and_then(|s| s.revision);
    let in_progress = status
        .as_ref()
        .is_some_and(|s| crate::rollout::holds_lock(s.phase));
    // A release at an end (deployed or failed) gets a new revision, as every `helm upgrade`
    // makes one; one in the middle of an operation (a command killed) goes on with it.
    let token = (!in_progress && status.is_some())
        .then(|| format!("{:.9}", k8s_openapi::jiff::Timestamp::now()));
    let mut release = release_object(args, &namespace, values, status, token.as_deref())?;
    // `sequenced upgrade` of a release `helm install` made goes on from its history at its
    // next revision, as `helm upgrade` would (the operator's opt-in, given by the command).
    release.spec.adopt = loaded
        .records
        .iter()
        .any(|(summary, _)| summary.writer == Writer::Helm);
    let json = args.output == OutputFormat::Json;
    let output = Arc::new(Output::new(std::io::stdout().is_terminal(), json));
    let home = RecordHome::new(client, release, Arc::clone(&output));
    let finished = drive(&driver, &home, &output, args.timeout, |sr| {
        ended(sr, token.as_deref(), before)
    })
    .await?;
    let release = home.current();
    let (code, outcome) = match finished {
        Finished::Ended(true) => (0, "deployed"),
        Finished::Ended(false) => (EXIT_FAILED, "failed"),
        Finished::Signalled(code) => (code, "interrupted"),
    };
    if json {
        let summary = Summary::of(&release, outcome);
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&release, outcome, mode);
    }
    if code == EXIT_FAILED {
        let message = release
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_else(|| "the release failed".to_string());
        eprintln!("Error: {}: {message}", mode.failed());
    }
    Ok(code)
}

/// What Helm prints after an install or upgrade.
fn print_summary(release: &SequencedRelease, outcome: &str, mode: Mode) {
    let status = release.status.clone().unwrap_or_default();
    let name = release.metadata.name.as_deref().unwrap_or_default();
    let namespace = release.metadata.namespace.as_deref().unwrap_or_default();
    println!("NAME: {name}");
    println!("NAMESPACE: {namespace}");
    println!("STATUS: {outcome}");
    if let Some(revision) = status.revision {
        println!("REVISION: {revision}");
    }
    if let Some(progress) = &status.progress {
        println!("LAYERS READY: {progress}");
    }
    let _ = mode;
}

/// How a driven operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// It ended: true when deployed (Ready), false when it failed.
    Ended(bool),
    /// A signal stopped it (the exit code).
    Signalled(u8),
}

/// Whether the release has ended for this command (None: not yet): the request `token` handled
/// (or a revision after `before` begun) and the operation over.
fn ended(release: &SequencedRelease, token: Option<&str>, before: Option<i64>) -> Option<bool> {
    let status = release.status.as_ref()?;
    if status.observed_generation != release.metadata.generation {
        return None;
    }
    let phase = status.phase?;
    if crate::rollout::holds_lock(Some(phase)) || phase == ReleasePhase::Pending {
        return None;
    }
    if let Some(token) = token
        && status.last_handled_reconcile_at.as_deref() != Some(token)
        && status.revision <= before
    {
        return None;
    }
    match phase {
        ReleasePhase::Ready => Some(true),
        ReleasePhase::Failed => Some(false),
        _ => None,
    }
}

/// SIGINT and SIGTERM, as the exit codes they call for.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) -> u8 {
        tokio::select! {
            _ = self.interrupt.recv() => EXIT_SIGINT,
            _ = self.terminate.recv() => EXIT_SIGTERM,
        }
    }
}

/// Steps the release of `home` until `done` says it ended, a signal comes, or the time runs
/// out: the operation's own `timeout` is the lifecycle's (it fails the revision past it); the
/// wait for another session's Lease may take as long again, and a little more, since a Lease is
/// only taken over once it stayed unchanged for its whole duration.
pub async fn drive(
    driver: &Driver,
    home: &RecordHome,
    output: &Output,
    timeout: Duration,
    done: impl Fn(&SequencedRelease) -> Option<bool>,
) -> Result<Finished, Failure> {
    let mut signals = Signals::new()?;
    let started = Instant::now();
    let lock_bound = timeout + timeout / 10 + Duration::from_secs(2);
    let mut waited_since: Option<Instant> = None;
    let mut told_holder: Option<String> = None;
    let mut deadline = started + lock_bound + timeout;
    loop {
        let release = home.current();
        if let Some(ready) = done(&release) {
            driver.release(&release).await;
            return Ok(Finished::Ended(ready));
        }
        if Instant::now() > deadline {
            driver.release(&release).await;
            return Err(Failure(format!(
                "timed out after {}s waiting for the release to finish",
                started.elapsed().as_secs()
            )));
        }
        let version = release.metadata.resource_version.clone();
        let step = driver.step(Arc::new(release), home);
        tokio::pin!(step);
        let (stepped, signal) = tokio::select! {
            stepped = &mut step => (stepped, None),
            code = signals.recv() => {
                driver.stop();
                let stepped = tokio::time::timeout(IN_FLIGHT_BOUND, &mut step)
                    .await
                    .unwrap_or(Ok(Stepped::Interrupted));
                (stepped, Some(code))
            }
        };
        if let Some(code) = signal {
            return interrupted(driver, home, output, code).await;
        }
        let pause = match stepped {
            Ok(Stepped::Taken) => {
                if waited_since.take().is_some() {
                    // The operation itself gets its whole timeout from when the lock came.
                    deadline = Instant::now() + timeout + Duration::from_secs(5);
                }
                let changed = home.current().metadata.resource_version != version;
                if changed { Duration::ZERO } else { POLL }
            }
            Ok(Stepped::Busy {
                holder,
                retry_after,
            }) => {
                let since = *waited_since.get_or_insert_with(Instant::now);
                if since.elapsed() > lock_bound {
                    return Err(Failure(format!(
                        "another session holds the lock of {}/{}: {holder}; waited {}s",
                        home.current().metadata.namespace.unwrap_or_default(),
                        home.current().metadata.name.unwrap_or_default(),
                        since.elapsed().as_secs()
                    )));
                }
                if told_holder.as_deref() != Some(holder.as_str()) {
                    let until = k8s_openapi::jiff::Timestamp::now()
                        .checked_add(
                            k8s_openapi::jiff::SignedDuration::try_from(retry_after)
                                .unwrap_or_default(),
                        )
                        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
                    output.say(&format!(
                        "Locked: {holder} holds the lock of this release until {} at the latest \
                         (unless it renews it); waiting for it",
                        until.strftime("%Y-%m-%dT%H:%M:%SZ")
                    ));
                    told_holder = Some(holder);
                }
                retry_after.clamp(Duration::from_millis(200), Duration::from_secs(2))
            }
            Ok(Stepped::Lost { holder }) => {
                return Err(Failure(format!(
                    "lost the lock of the release to {holder} while deploying"
                )));
            }
            Ok(Stepped::Interrupted) => POLL,
            Err(error) => {
                let failures = driver.failures(&home.current());
                if failures >= 8 {
                    driver.release(&home.current()).await;
                    return Err(Failure(error.to_string()));
                }
                output.line(&format!("Retrying after an error: {error}"));
                crate::controller::backoff(failures, fastrand::f64()).min(Duration::from_secs(10))
            }
        };
        if pause.is_zero() {
            continue;
        }
        tokio::select! {
            () = driver.wait(pause) => {}
            code = signals.recv() => {
                driver.stop();
                return interrupted(driver, home, output, code).await;
            }
        }
    }
}

/// A signal stopped the command: the revision in progress is marked failed, its reason
/// `interrupted`, and the Lease released.
async fn interrupted(
    driver: &Driver,
    home: &RecordHome,
    output: &Output,
    code: u8,
) -> Result<Finished, Failure> {
    let signal = if code == EXIT_SIGINT {
        "SIGINT"
    } else {
        "SIGTERM"
    };
    let message = format!(
        "interrupted: the command ({}) got {signal}; the next command starts again from here",
        identity()
    );
    let release = home.current();
    let held = driver.holds(&release);
    if let Err(e) = driver.interrupt(&release, home, &message).await {
        output.say(&format!("could not mark the release interrupted: {e}"));
    }
    if held {
        output.say(&format!(
            "Interrupted ({signal}): the revision is marked failed and the lock released"
        ));
    }
    Ok(Finished::Signalled(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_names_the_user_and_host() {
        let id = identity();
        assert!(id.starts_with("cli:"), "{id}");
        assert!(id.contains('@'), "{id}");
    }
}
