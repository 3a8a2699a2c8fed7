//! `sequenced-demo`: what `scripts/demo.sh` needs around the real operator, as a binary of this
//! test support crate (`cargo run -p sequenced-testkit --bin sequenced-demo`), so that the
//! embedded API server never ships in the `sequenced` binary.
//!
//! ```text
//! sequenced-demo serve KUBECONFIG PACE            the embedded cluster (see serve.rs)
//! sequenced-demo probe                            does the current kubeconfig's cluster answer?
//! sequenced-demo nodes                            how many Nodes it has
//! sequenced-demo crd ensure FILE | crd remove     the SequencedRelease CRD
//! sequenced-demo namespace NS                     creates the demo's namespace
//! sequenced-demo apply NS NAME CHART VALUES       a SequencedRelease (VALUES is JSON)
//! sequenced-demo delete NS NAME                   asks for its uninstall
//! sequenced-demo wait NS NAME ready|failed|gone SECONDS [OPERATOR_PID]
//! sequenced-demo events NS NAME REASON...         the release's events with these reasons
//! sequenced-demo watch NS LOG [PACE]              records what happens in NS (see watch.rs)
//! sequenced-demo mark LOG LABEL                   a mark in that record
//! sequenced-demo timings LOG NS NAME REVISION MARK
//! sequenced-demo deletions LOG NAME MARK
//! sequenced-demo cleanup NS [OPERATOR_PID]        uninstalls what is left, deletes NS
//! ```
//!
//! Every command talks to the cluster of the current kubeconfig (`KUBECONFIG`), prints what it
//! found on stdout, and fails with one line on stderr and exit code 2.

mod cluster;
mod serve;
mod timings;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

/// What went wrong, in one line for the user.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error(message.to_string())
    }
}

type Result<T> = std::result::Result<T, Error>;

const USAGE: &str = "usage: sequenced-demo serve|probe|nodes|crd|namespace|apply|delete|wait|events|watch|mark|timings|deletions|cleanup ARGS (see tests/support/src/demo/mod.rs)";

/// Runs the command the arguments name; exit code 0, 1 (`wait` saw the other outcome, `probe`
/// found no cluster) or 2 (an error).
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sequenced-demo: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(run(&args));
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("sequenced-demo: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: &[String]) -> Result<u8> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["serve", kubeconfig, pace] => serve::serve(kubeconfig, seconds(pace)?).await,
        ["probe"] => cluster::probe().await,
        ["nodes"] => cluster::nodes().await,
        ["crd", "ensure", file] => cluster::crd_ensure(file).await,
        ["crd", "remove"] => cluster::crd_remove().await,
        ["namespace", namespace] => cluster::namespace(namespace).await,
        ["apply", namespace, name, chart, values] => {
            cluster::apply(namespace, name, chart, values).await
        }
        ["delete", namespace, name] => cluster::delete(namespace, name).await,
        ["wait", namespace, name, what, timeout, rest @ ..] if rest.len() <= 1 => {
            let operator = match rest.first() {
                Some(pid) => Some(pid_of(pid)?),
                None => None,
            };
            cluster::wait(namespace, name, what, seconds(timeout)?, operator).await
        }
        ["events", namespace, name, reasons @ ..] => {
            cluster::events(namespace, name, reasons).await
        }
        ["watch", namespace, log, rest @ ..] if rest.len() <= 1 => {
            let pace = match rest.first() {
                Some(pace) => Some(seconds(pace)?),
                None => None,
            };
            watch::watch(namespace, log, pace).await
        }
        ["mark", log, label] => watch::mark(log, label),
        ["timings", log, namespace, name, revision, mark] => {
            let revision = revision
                .parse::<i64>()
                .map_err(|_| format!("not a revision: {revision:?}"))?;
            timings::timings(log, namespace, name, revision, mark).await
        }
        ["deletions", log, name, mark] => timings::deletions(log, name, mark),
        ["cleanup", namespace, rest @ ..] if rest.len() <= 1 => {
            let operator = match rest.first() {
                Some(pid) => Some(pid_of(pid)?),
                None => None,
            };
            cluster::cleanup(namespace, operator).await
        }
        _ => Err(USAGE.into()),
    }
}

fn pid_of(text: &str) -> Result<u32> {
    text.parse::<u32>()
        .map_err(|_| Error(format!("not a process id: {text:?}")))
}

/// `1.5` (seconds) as a duration.
fn seconds(text: &str) -> Result<Duration> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| Error(format!("not a number of seconds: {text:?}")))
}

/// A client for the cluster of the current kubeconfig, with timeouts, so that a cluster that
/// does not answer is told rather than waited for.
async fn client() -> Result<kube::Client> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| format!("no cluster to talk to: {e}"))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(config).map_err(|e| Error(format!("no cluster to talk to: {e}")))
}

/// Exits this process when its parent does (the demo's shell was killed): the embedded cluster
/// and the watch never outlive the demo.
fn exit_with_parent() {
    #[cfg(unix)]
    {
        let parent = std::os::unix::process::parent_id();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if std::os::unix::process::parent_id() != parent {
                    std::process::exit(0);
                }
            }
        });
    }
}
