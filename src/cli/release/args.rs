//! The flags of the commands that act on a release from the command line, spelt as Helm 4
//! spells them, with Helm's environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::values::ValueArgs;

/// Where the release is: the cluster and the namespace.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Namespace of the release (default: the kubeconfig context's).
    #[arg(short = 'n', long, env = "HELM_NAMESPACE")]
    pub namespace: Option<String>,
    /// Name of the kubeconfig context to use.
    #[arg(long, value_name = "CONTEXT", env = "HELM_KUBECONTEXT")]
    pub kube_context: Option<String>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// The output of a command that deploys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    /// Progress lines (a layer tree on a terminal), then the release's name, status and
    /// revision.
    #[default]
    Table,
    /// Progress lines on stderr; on stdout one JSON summary: revision, outcome, reason and
    /// each layer with its start and end.
    Json,
}

/// `--wait`: on by default; `--wait=ordered` as the sequencing proposal spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WaitStrategy {
    /// Layer by layer, each after the ones it depends on are ready (what sequenced always does).
    Ordered,
    /// Helm 4's default name: the same here.
    Watcher,
    /// Helm 4's name for the polling wait: the same here.
    Legacy,
    /// Wait for hooks only: layers are applied in order without waiting for readiness.
    #[value(name = "hookOnly")]
    HookOnly,
}

/// `sequenced install NAME CHART` and `sequenced upgrade NAME CHART`.
#[derive(Debug, Clone, Args)]
pub struct DeployArgs {
    /// Release name.
    pub name: String,
    /// Chart: a directory, a packaged chart (.tgz), REPO/NAME of a repository helm knows, NAME
    /// with --repo, or an oci:// reference.
    pub chart: String,
    #[command(flatten)]
    pub connection: Connection,
    /// Create the release namespace if not present.
    #[arg(long)]
    pub create_namespace: bool,
    /// Values file (repeatable; later files win).
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// Set a value, as `helm --set` (repeatable): a.b=c, list={x,y}.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Set a string value, as `helm --set-string` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub set_string: Vec<String>,
    /// Set a value from a file's content, as `helm --set-file` (repeatable): key=path.
    #[arg(long, value_name = "KEY=PATH")]
    pub set_file: Vec<String>,
    /// Set a JSON value, as `helm --set-json` (repeatable): a.b={"x":1}.
    #[arg(long, value_name = "KEY=JSON")]
    pub set_json: Vec<String>,
    /// Set a literal string value, as `helm --set-literal` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub set_literal: Vec<String>,
    /// Chart version or semver range for repository and oci:// charts (default: the newest
    /// stable).
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Chart repository URL to find CHART in.
    #[arg(long, value_name = "URL")]
    pub repo: Option<String>,
    /// How long the operation may take (a Go duration: 90s, 5m, 1h); also how long the
    /// release's lock lasts without renewal, and about how long to wait for another session's.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::readiness::parse_duration)]
    pub timeout: Duration,
    /// On failure, roll back in order to the last deployed revision (a first install is
    /// uninstalled in reverse order).
    #[arg(long)]
    pub rollback_on_failure: bool,
    /// Helm 3's name of --rollback-on-failure.
    #[arg(long)]
    pub atomic: bool,
    /// Wait for each layer to be ready before the next (always on); `--wait=ordered` as the
    /// sequencing proposal spells it, `--wait=hookOnly` to wait for hooks only.
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "ordered")]
    pub wait: Option<WaitStrategy>,
    /// Run no hooks.
    #[arg(long)]
    pub no_hooks: bool,
    /// Not supported yet: refused with exit code 1 before anything is read or changed (a
    /// manifest of the release given to `sequenced diff -f` shows what a revision would do).
    #[arg(long, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<String>,
    /// Accepted as Helm takes it, but not recorded yet: `helm history` shows sequenced's own
    /// description of the revision (a warning says so).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// How many revisions the release keeps (0: no limit).
    #[arg(long, value_name = "N")]
    pub max_history: Option<i32>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

impl DeployArgs {
    pub fn value_args(&self) -> ValueArgs {
        ValueArgs {
            files: self.values.clone(),
            set: self.set.clone(),
            set_string: self.set_string.clone(),
            set_json: self.set_json.clone(),
            set_file: self.set_file.clone(),
            set_literal: self.set_literal.clone(),
        }
    }

    /// Whether each layer waits for readiness.
    pub fn waits(&self) -> bool {
        self.wait != Some(WaitStrategy::HookOnly)
    }
}

/// `sequenced upgrade NAME CHART [--install]`.
#[derive(Debug, Clone, Args)]
pub struct UpgradeArgs {
    /// If the release does not exist, install it.
    #[arg(short = 'i', long)]
    pub install: bool,
    #[command(flatten)]
    pub deploy: DeployArgs,
}
