//! The `sequenced` command line.

mod diff;
mod graph;
mod lint;
mod ready;
pub mod reference;
pub mod release;
mod request;
mod run;
pub mod status;
mod template;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::chart::source::{ChartCache, ChartReference, Credentials};
use crate::pipeline::{ValueFlags, ValuesFile};

/// Exit code for an error (bad input, a chart that cannot be rendered, a failed command).
pub const EXIT_ERROR: u8 = 2;

/// Exit code of `sequenced lint` when the chart has errors.
pub const EXIT_LINT_ERRORS: u8 = 1;

#[derive(Debug, Parser)]
#[command(
    name = "sequenced",
    version,
    about = "Deploy Helm charts in dependency order",
    long_about = "sequenced deploys Helm charts in dependency order. As an operator (`sequenced run`) it \
                  reconciles SequencedRelease objects: it renders the chart, groups its resources into \
                  layers from their annotations and applies one layer at a time, each only after the \
                  layers it depends on are ready. The other commands help chart authors see that order \
                  before they ship."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the operator against the cluster of the current kubeconfig (or in-cluster config).
    #[command(
        long_about = "Run the operator: watch SequencedRelease objects and deploy each chart layer by \
                      layer, recording every step in the object's status. Uses the current kubeconfig \
                      context, or the in-cluster configuration inside a pod."
    )]
    Run(RunArgs),
    /// Render a chart and print its documents with the chart and file each came from.
    #[command(
        long_about = "Render a chart with `helm template` (CRDs included) and print every document with \
                      its chart path (`foo`, `foo/bar` for subchart bar) and template file. CRDs, hooks \
                      and main resources are printed under their own stage headers. The output is valid \
                      multi-document YAML.\n\nCHART is a chart directory, a packaged chart (.tgz), an \
                      oci:// reference, or a chart name with --repo."
    )]
    Template(TemplateArgs),
    /// Print the layer graph of a chart (text, Graphviz dot or Mermaid).
    #[command(
        long_about = "Print the dependency graph of a chart's layers and subcharts: as readable text, as \
                      Graphviz dot, or as a Mermaid diagram for Markdown."
    )]
    Graph(GraphArgs),
    /// Check a chart's sequencing annotations and report every error and warning.
    #[command(
        long_about = "Check a chart's sequencing annotations: cycles, dependencies on unknown layers, \
                      mixed dialects, malformed annotation values, ignored annotations on hooks. Exit \
                      code 1 when there are errors."
    )]
    Lint(LintArgs),
    /// Print the SequencedRelease CustomResourceDefinition.
    #[command(
        long_about = "Print the SequencedRelease CustomResourceDefinition generated from the Rust types, \
                      as committed in crds/sequencedrelease.yaml. Apply it with \
                      `sequenced crd | kubectl apply --server-side -f -`. With --format markdown, print \
                      its API reference instead: every field of spec and status with its type, default, \
                      allowed values and description (the book's docs/src/reference/api.md)."
    )]
    Crd(CrdArgs),
    /// Show the layer progress of a SequencedRelease in the cluster.
    #[command(
        long_about = "Show a live SequencedRelease: its layers with progress, the object that blocks, and \
                      who holds its lock."
    )]
    Status(StatusArgs),
    /// Judge whether Kubernetes objects are ready, as the operator would.
    #[command(
        long_about = "Read Kubernetes objects (one, many, or a List; YAML or JSON) from a file or stdin and \
                      print, for each, whether it is ready and why, using the same rules as the operator: \
                      the built-in rule of its kind, or its readiness annotations \
                      (helm.sh/readiness-success, helm.sh/readiness-failure, kots.io/wait-for-properties). \
                      Timeouts (helm.sh/readiness-timeout) are not applied: a single look has not waited. \
                      Exit code 0 when all are ready, 1 when any is in progress, 2 when any failed or the \
                      input is bad.\n\nExample: kubectl get deploy web -o yaml | sequenced ready -f -"
    )]
    Ready(ReadyArgs),
    /// Ask the operator to reconcile a SequencedRelease now.
    #[command(
        long_about = "Ask the operator to reconcile a SequencedRelease now (annotation \
                      reconcile.sequenced.dev/requestedAt): a Failed or Stalled release is tried again \
                      with the same spec as a new revision; with --force a Ready release is applied \
                      again. Waits until the operator has acted and the operation has ended; exit code \
                      0 when the release is Ready, 1 when it failed."
    )]
    Reconcile(ReconcileArgs),
    /// Ask the operator to roll a SequencedRelease back to an earlier revision.
    #[command(
        long_about = "Ask the operator to roll a SequencedRelease back (annotations \
                      rollback.sequenced.dev/requestedAt and rollback.sequenced.dev/revision) to REVISION, \
                      or to the Ready revision before the current one. The revision's stored plan is \
                      applied again in its own order, as a new revision; the release stays there until \
                      its spec changes. Waits until the operation has ended; exit code 0 when Ready, 1 \
                      when it failed or was refused."
    )]
    Rollback(RollbackArgs),
    /// Ask the operator to run the Helm tests of a SequencedRelease now, as `helm test`.
    #[command(
        long_about = "Ask the operator to run the Helm tests (`helm.sh/hook: test`) of a Ready \
                      SequencedRelease now (annotation test.sequenced.dev/requestedAt), whether \
                      spec.test.enable is set or not, with spec.test's filters and timeout. A release \
                      in the middle of an operation is tested once it ends Ready; one that is not \
                      Ready is refused. A failed test is reported, never remediated: the release \
                      stays Ready, its TestSuccess condition False. Waits until the tests have run and \
                      prints each test's outcome, with the last log lines of the failed ones; exit \
                      code 0 when every test passed, 1 when one failed or the run was refused."
    )]
    Test(RequestArgs),
    /// Show what the next revision of a SequencedRelease would do to the cluster.
    #[command(
        long_about = "Show what the next revision of a SequencedRelease would do to the cluster, stage by \
                      stage and layer by layer in rollout order: the CRDs, the hooks that would run, the \
                      objects to create, the objects to change (each with a unified diff of the fields \
                      sequenced manages, from a server-side apply dry run against the live object), the \
                      objects to prune in their delete order, and the layers whose order changed. Secret \
                      values are never shown, only whether they change. Nothing is written to the cluster.\n\n\
                      Three forms: `sequenced diff -f release.yaml` (a SequencedRelease manifest, against \
                      the live release of its name, or against nothing when there is none yet); \
                      `sequenced diff NAME [-f values.yaml] [--set k=v]` (the live release with these \
                      values merged over its own, as if they were added last to its spec); `sequenced \
                      diff NAME --revision N` (what a rollback to revision N would do).\n\n\
                      The chart is rendered here with helm, through the same pipeline as the operator: a \
                      chart.path is a path on this machine, relative to the current directory. Exit code \
                      0, also when something would change unless --exit-code is given; with --exit-code, \
                      2 when something would change; 1 on an error."
    )]
    Diff(DiffArgs),
    /// Install a chart as a release, layer by layer, without an operator (as `helm install`).
    #[command(
        long_about = "Install CHART as release NAME from this terminal or CI job, as `helm install` \
                      does but in dependency order: CRDs, hooks, then each layer once the layers it \
                      depends on are ready, with the operator's pipeline, lifecycle and steps and no \
                      operator or CRD in the cluster. The release is written in Helm's format (`helm \
                      list|history|status|get` read it; `helm upgrade|rollback|uninstall` go on from \
                      it) and is locked by its Lease (holder cli:USER@HOST/SESSION, lasting \
                      --timeout, renewed) while the command runs. A failed first install is retried \
                      by the same command. Exit code 0 when deployed, 1 when it failed, 130/143 on \
                      SIGINT/SIGTERM (the revision marked failed, `interrupted`, the lock released)."
    )]
    Install(release::args::DeployArgs),
    /// Upgrade a release, layer by layer, without an operator (as `helm upgrade`).
    #[command(
        long_about = "Upgrade release NAME to CHART from this terminal or CI job, as `helm upgrade` \
                      does but in dependency order; with --install, install it when it does not \
                      exist. Goes on from a release this command, the operator's records or `helm \
                      install` made, at the next revision. A command killed in the middle (kill -9) is \
                      continued by running it again: it names who holds the lock and until when, \
                      waits for it within --timeout, and goes on from where the killed one stopped. \
                      Exit code 0 when deployed, 1 when it failed, 130/143 on SIGINT/SIGTERM."
    )]
    Upgrade(release::args::UpgradeArgs),
    /// Print the help of every command as Markdown (the book's docs/src/reference/cli.md).
    #[command(hide = true)]
    CliReference,
}

#[derive(Debug, Args)]
pub struct CrdArgs {
    /// Output format: the CRD as YAML, or its API reference as Markdown.
    #[arg(long, value_enum, default_value = "yaml")]
    pub format: CrdFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CrdFormat {
    Yaml,
    Markdown,
}

/// What `reconcile`, `rollback` and `test` share.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Name of the SequencedRelease.
    pub name: String,
    /// Its namespace (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// How long to wait for the operator to act and the operation to end (`90s`, `5m`, `1h`).
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    #[arg(value_parser = crate::readiness::parse_duration)]
    pub timeout: std::time::Duration,
    /// Return once the request is made.
    #[arg(long)]
    pub no_wait: bool,
}

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// Apply a Ready release again, as a new revision.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// The revision to roll back to (default: the Ready revision before the current one).
    #[arg(value_parser = clap::value_parser!(u32).range(1..))]
    pub revision: Option<u32>,
}

/// How many releases `sequenced run` reconciles at once unless told.
pub const DEFAULT_CONCURRENCY: u16 = 16;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Address of the Prometheus metrics (/metrics) and health (/healthz, /readyz) endpoints.
    #[arg(long, value_name = "HOST:PORT", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// How many releases are reconciled at once.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONCURRENCY, env = "SEQUENCED_CONCURRENCY", value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// This controller's name in events (default: the host name, as a pod's name).
    #[arg(long, value_name = "NAME", env = "SEQUENCED_IDENTITY")]
    pub identity: Option<String>,
    /// The ServiceAccount, in each release's own namespace, that a release without
    /// spec.serviceAccountName acts as (impersonated). Unset: such releases act with the
    /// controller's own rights.
    #[arg(long, value_name = "NAME", env = "SEQUENCED_DEFAULT_SERVICE_ACCOUNT", value_parser = service_account_name)]
    pub default_service_account: Option<String>,
    /// Refuse releases whose targetNamespace or dependsOn point outside their own namespace
    /// (Stalled, reason CrossNamespaceRef).
    #[arg(long, env = "SEQUENCED_NO_CROSS_NAMESPACE_REFS")]
    pub no_cross_namespace_refs: bool,
    /// Multi-tenant mode (also on with --default-service-account): no release ever acts with
    /// the controller's own rights, tenant inputs (valuesFrom, chart ConfigMaps and Secrets,
    /// credentials, hook logs) are read as the release's account, spec.chart.path is refused
    /// outside --allow-local-charts, and chart sources on internal addresses are refused.
    #[arg(long, env = "SEQUENCED_MULTI_TENANT")]
    pub multi_tenant: bool,
    /// Directories whose charts spec.chart.path may name in multi-tenant mode (repeatable, or
    /// comma-separated). Unset: spec.chart.path is refused in multi-tenant mode.
    #[arg(
        long,
        value_name = "DIR",
        env = "SEQUENCED_ALLOW_LOCAL_CHARTS",
        value_delimiter = ','
    )]
    pub allow_local_charts: Vec<PathBuf>,
    /// Refuse every release whose spec.chart has no verify (Stalled, reason
    /// VerificationFailed): only charts verified by a signature are deployed. For clusters
    /// shared by teams that must all run signed charts.
    #[arg(long, env = "SEQUENCED_REQUIRE_VERIFIED_CHARTS")]
    pub require_verified_charts: bool,
    /// Hosts (charts.example.com, *.example.com) or CIDRs (10.20.0.0/16) that charts may be
    /// fetched from (repeatable, or comma-separated). Set: only these. Unset: any host, except,
    /// in multi-tenant mode, hosts whose addresses are not public (loopback, link-local,
    /// private, shared and reserved ranges, which hold the cluster's pods and services).
    #[arg(
        long,
        value_name = "HOST|CIDR",
        env = "SEQUENCED_CHART_SOURCE_ALLOW",
        value_delimiter = ','
    )]
    pub chart_source_allow: Vec<String>,
    /// More address ranges charts are never fetched from (repeatable, or comma-separated): a
    /// cluster whose pod or service ranges are public addresses lists them here.
    #[arg(
        long,
        value_name = "CIDR",
        env = "SEQUENCED_CHART_SOURCE_DENY",
        value_delimiter = ','
    )]
    pub chart_source_deny: Vec<String>,
    /// How much disk the chart cache may take (512Mi, 2Gi, or bytes): past it, the least
    /// recently used archives that no release uses now are removed.
    #[arg(long, value_name = "SIZE", default_value = "512Mi", env = "SEQUENCED_CHART_CACHE_SIZE", value_parser = byte_size)]
    pub chart_cache_size: u64,
    /// The most `helm template` may print for one release (32Mi, or bytes); a chart that
    /// renders more is refused (Stalled, reason RenderTooLarge) and helm is stopped.
    #[arg(long, value_name = "SIZE", default_value = "32Mi", env = "SEQUENCED_RENDER_OUTPUT_LIMIT", value_parser = byte_size)]
    pub render_output_limit: u64,
    /// How many shards releases are divided into (by a hash of their uid); every replica must
    /// use the same number. Each replica owns a share of them through one Lease per shard.
    #[arg(long, value_name = "N", default_value_t = crate::lock::shards::DEFAULT_SHARDS, env = "SEQUENCED_SHARDS", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub shards: u32,
    /// The namespace of the shard Leases (default: $POD_NAMESPACE, else `default`).
    #[arg(long, value_name = "NAMESPACE", env = "SEQUENCED_SHARD_NAMESPACE")]
    pub shard_namespace: Option<String>,
    /// How long a shard Lease lasts without renewal (renewed every third of it): how long the
    /// shards of a replica that died wait before others take them.
    #[arg(long, value_name = "DURATION", default_value = "15s", env = "SEQUENCED_SHARD_LEASE_DURATION", value_parser = lease_duration)]
    pub shard_lease_duration: std::time::Duration,
    /// How often a Ready release's objects are compared in full with what it applied (a GET
    /// and a dry-run apply each) when no watch event said one of them changed; also at first
    /// sight. Edits and deletions are found from the watches' events within seconds.
    #[arg(long, value_name = "DURATION", default_value = "24h", env = "SEQUENCED_DRIFT_FULL_CHECK_INTERVAL", value_parser = full_check_interval)]
    pub drift_full_check_interval: std::time::Duration,
    /// How long the last record of a Helm release must stay `pending-install`, `pending-upgrade`
    /// or `pending-rollback` unchanged (as this replica sees it) before a SequencedRelease with
    /// `spec.adopt: true` marks it failed and goes on: Helm's default `--timeout` (5m) and a
    /// minute more.
    #[arg(long, value_name = "DURATION", default_value = "6m", env = "SEQUENCED_TAKE_PENDING_AFTER", value_parser = go_duration)]
    pub take_pending_after: std::time::Duration,
}

/// A `--drift-full-check-interval`: a Go duration of at least 1s.
fn full_check_interval(text: &str) -> Result<std::time::Duration, String> {
    match crate::readiness::duration::parse_duration(text) {
        Ok(d) if d >= std::time::Duration::from_secs(1) => Ok(d),
        Ok(_) => Err("at least 1s".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// A Go duration (`6m`, `90s`).
fn go_duration(text: &str) -> Result<std::time::Duration, String> {
    crate::readiness::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// A shard Lease duration: a Go duration of at least 3s.
fn lease_duration(text: &str) -> Result<std::time::Duration, String> {
    match crate::readiness::duration::parse_duration(text) {
        Ok(d) if d >= std::time::Duration::from_secs(3) => Ok(d),
        Ok(_) => Err(format!("{text:?}: a shard Lease lasts at least 3s")),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

/// A size in bytes, as Kubernetes writes quantities of memory: `512Mi`, `2Gi`, `100M`, `1024`.
pub fn byte_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: not a size such as 512Mi, 2Gi or 1048576"))?;
    let unit: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?}: not a size such as 512Mi, 2Gi or 1048576"
            ));
        }
    };
    number
        .checked_mul(unit)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?}: a size above zero and below 16Ei"))
}

/// A ServiceAccount name: a DNS subdomain (lowercase letters, digits, '-' and '.').
fn service_account_name(name: &str) -> Result<String, String> {
    if crate::plan::annotations::valid_dns_subdomain(name.as_bytes()) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a ServiceAccount name (lowercase letters, digits, '-' and '.')"
        ))
    }
}

/// Chart verification on the command line, as Helm's `--verify --keyring`: the commands that
/// fetch a chart flatten it (`template`, `graph`, `lint`, `diff`).
#[derive(Debug, Clone, Default, Args)]
pub struct VerifyFlags {
    /// Verify the chart's provenance file (.prov, from `helm package --sign`) before anything
    /// reads the chart, as `helm pull --verify` does; a chart that does not verify is refused.
    #[arg(long)]
    pub verify: bool,
    /// The public keys to verify with: binary or ASCII-armored OpenPGP keys
    /// [default: ~/.gnupg/pubring.gpg, as helm's].
    #[arg(long, value_name = "FILE", requires = "verify")]
    pub keyring: Option<PathBuf>,
}

impl VerifyFlags {
    /// The verification the flags ask for: None without `--verify`; Err when the keyring file
    /// cannot be read.
    pub fn verification(
        &self,
    ) -> Result<Option<crate::chart::verify::Verification>, crate::pipeline::Error> {
        if !self.verify {
            return Ok(None);
        }
        let path = match &self.keyring {
            Some(path) => path.clone(),
            None => std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default()
                .join(".gnupg/pubring.gpg"),
        };
        let bytes = std::fs::read(&path).map_err(|e| crate::pipeline::Error::Io {
            what: format!("keyring {}", path.display()),
            message: crate::chart::io_message(&e),
        })?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Some(crate::chart::verify::Verification::Helm(
            crate::chart::verify::Keyring {
                origin: format!("keyring {}", path.display()),
                keys: vec![(name, bytes)],
            },
        )))
    }
}

/// Where the chart comes from and how it is rendered: the flags `template`, `graph` and `lint` share.
#[derive(Debug, Args)]
pub struct ChartArgs {
    /// Chart directory, packaged chart (.tgz), oci:// reference, or chart name with --repo.
    #[arg(value_name = "CHART")]
    pub chart: String,
    /// Chart repository URL to find CHART in (as `helm template --repo`).
    #[arg(long, value_name = "URL")]
    pub repo: Option<String>,
    /// Chart version or semver range for --repo and oci:// charts (default: the newest stable).
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Talk plain HTTP to the OCI registry.
    #[arg(long)]
    pub plain_http: bool,
    /// Username for the chart repository or registry.
    #[arg(long, requires = "password")]
    pub username: Option<String>,
    /// Password for the chart repository or registry (better given in the environment).
    #[arg(long, env = "SEQUENCED_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Values file (repeatable; later files win).
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    pub values: Vec<PathBuf>,
    /// Set a value, as `helm --set` (repeatable): a.b=c, list={x,y}, a[0]=v.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Set a string value, as `helm --set-string` (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub set_string: Vec<String>,
    /// Set a JSON value, as `helm --set-json` (repeatable): a.b={"x":1}.
    #[arg(long, value_name = "KEY=JSON")]
    pub set_json: Vec<String>,
    /// Set a literal string value, as `helm --set-literal` (repeatable; no escaping).
    #[arg(long, value_name = "KEY=VALUE")]
    pub set_literal: Vec<String>,
    /// Namespace of the release.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Release name (default: the chart's name).
    #[arg(long, value_name = "NAME")]
    pub release_name: Option<String>,
    /// Kubernetes version for .Capabilities.KubeVersion (as `helm template --kube-version`).
    #[arg(long, value_name = "VERSION")]
    pub kube_version: Option<String>,
    /// API versions for .Capabilities.APIVersions (repeatable).
    #[arg(long = "api-versions", value_name = "GROUP/VERSION")]
    pub api_versions: Vec<String>,
    /// Directory of the chart download cache.
    #[arg(long, value_name = "DIR", env = "SEQUENCED_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    #[command(flatten)]
    pub verify: VerifyFlags,
}

impl ChartArgs {
    /// Where the chart comes from.
    pub fn reference(&self) -> ChartReference {
        if let Some(url) = &self.repo {
            ChartReference::Repository {
                url: url.clone(),
                name: self.chart.clone(),
                version: self.version.clone(),
            }
        } else if self.chart.starts_with("oci://") {
            ChartReference::Oci {
                reference: self.chart.clone(),
                version: self.version.clone(),
                plain_http: self.plain_http,
            }
        } else {
            ChartReference::Path(PathBuf::from(&self.chart))
        }
    }

    pub fn credentials(&self) -> Option<Credentials> {
        match (&self.username, &self.password) {
            (Some(username), Some(password)) => Some(Credentials {
                username: username.clone(),
                password: password.clone(),
                scope: String::new(),
            }),
            _ => None,
        }
    }

    pub fn cache(&self) -> ChartCache {
        ChartCache::new(
            self.cache_dir
                .clone()
                .unwrap_or_else(ChartCache::default_dir),
        )
    }

    /// The `-f` files, read in order; an error names the file.
    pub fn values_files(&self) -> Result<Vec<ValuesFile>, crate::pipeline::Error> {
        self.values
            .iter()
            .map(|path| {
                let origin = path.display().to_string();
                match std::fs::read_to_string(path) {
                    Ok(text) => Ok(ValuesFile { origin, text }),
                    Err(e) => Err(crate::pipeline::Error::Values {
                        origin,
                        message: crate::chart::io_message(&e),
                    }),
                }
            })
            .collect()
    }

    /// The `--set*` flags, passed to helm as they are.
    pub fn value_flags(&self) -> ValueFlags {
        ValueFlags {
            set: self.set.clone(),
            set_string: self.set_string.clone(),
            set_json: self.set_json.clone(),
            set_literal: self.set_literal.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct TemplateArgs {
    #[command(flatten)]
    pub chart: ChartArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GraphFormat {
    Text,
    Dot,
    Mermaid,
}

#[derive(Debug, Args)]
pub struct GraphArgs {
    #[command(flatten)]
    pub chart: ChartArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: GraphFormat,
}

#[derive(Debug, Args)]
pub struct LintArgs {
    #[command(flatten)]
    pub chart: ChartArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Name of the SequencedRelease.
    pub name: String,
    /// Its namespace (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Redraw on every change until the release is Ready or Failed.
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "tree")]
    pub output: StatusOutput,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StatusOutput {
    Tree,
    Json,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Name of a live SequencedRelease (omit it to give the release as a manifest with -f).
    pub name: Option<String>,
    /// Without NAME: the SequencedRelease manifest (YAML or JSON; `-` for stdin). With NAME: a
    /// values file merged over the release's values (repeatable; later files win).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// With NAME: set a value over the release's values, as `helm --set` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", requires = "name")]
    pub set: Vec<String>,
    /// With NAME: set a string value, as `helm --set-string` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", requires = "name")]
    pub set_string: Vec<String>,
    /// With NAME: set a JSON value, as `helm --set-json` (repeatable).
    #[arg(long, value_name = "KEY=JSON", requires = "name")]
    pub set_json: Vec<String>,
    /// With NAME: set a literal string value, as `helm --set-literal` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", requires = "name")]
    pub set_literal: Vec<String>,
    /// With NAME: show what a rollback to this revision would do instead.
    #[arg(long, value_name = "N", requires = "name", conflicts_with_all = ["files", "set", "set_string", "set_json", "set_literal"])]
    #[arg(value_parser = clap::value_parser!(u32).range(1..))]
    pub revision: Option<u32>,
    /// Namespace of the release (default: the manifest's, else the kubeconfig context's).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: DiffOutput,
    /// Exit with code 2 when something would change (as `git diff --exit-code`).
    #[arg(long)]
    pub exit_code: bool,
    /// No colour, even on a terminal (also when NO_COLOR is set).
    #[arg(long)]
    pub no_color: bool,
    /// Directory of the chart download cache.
    #[arg(long, value_name = "DIR", env = "SEQUENCED_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// With --verify, the chart is verified with this keyring instead of the release's
    /// spec.chart.verify Secret.
    #[command(flatten)]
    pub verify: VerifyFlags,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiffOutput {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ReadyArgs {
    /// File with the objects, `-` for stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub file: PathBuf,
}

/// Parses the command line and runs the command. A command line `sequenced diff` cannot use
/// exits 1, not clap's 2: `diff --exit-code` says "changes" with 2.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() && std::env::args().nth(1).as_deref() == Some("diff") => {
            let _ = e.print();
            return ExitCode::from(diff::EXIT_ERROR);
        }
        // The commands named after Helm's exit as Helm does on a usage error.
        Err(e)
            if e.use_stderr()
                && matches!(
                    std::env::args().nth(1).as_deref(),
                    Some("install" | "upgrade")
                ) =>
        {
            let _ = e.print();
            return ExitCode::from(release::EXIT_FAILED);
        }
        Err(e) => e.exit(),
    };
    run(cli)
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd(args) => {
            let printed = match args.format {
                CrdFormat::Yaml => crate::api::crd_yaml().map_err(|e| e.to_string()),
                CrdFormat::Markdown => {
                    use kube::CustomResourceExt as _;
                    serde_json::to_value(crate::api::SequencedRelease::crd())
                        .map(|crd| reference::api_markdown(&crd))
                        .map_err(|e| e.to_string())
                }
            };
            match printed {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&format!("cannot generate the CRD: {e}")),
            }
        }
        Command::CliReference => {
            print!("{}", reference::cli_markdown());
            ExitCode::SUCCESS
        }
        Command::Template(args) => match template::run(&args) {
            Ok(output) => {
                print!("{output}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        },
        Command::Run(args) => run::run(&args),
        Command::Graph(args) => match graph::run(&args) {
            Ok(output) => {
                print!("{output}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        },
        Command::Lint(args) => {
            let report = lint::run(&args);
            print!("{}", report.output);
            if report.errors > 0 {
                ExitCode::from(EXIT_LINT_ERRORS)
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Status(args) => status::run(&args),
        Command::Ready(args) => ready::run(&args),
        Command::Diff(args) => diff::run(&args),
        Command::Reconcile(args) => request::run(
            &args.request,
            request::Request::Reconcile { force: args.force },
        ),
        Command::Rollback(args) => request::run(
            &args.request,
            request::Request::Rollback {
                revision: args.revision,
            },
        ),
        Command::Test(args) => request::run(&args, request::Request::Test),
        Command::Install(args) => release::run(&args, release::Mode::Install),
        Command::Upgrade(args) => release::run(
            &args.deploy,
            release::Mode::Upgrade {
                install: args.install,
            },
        ),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_ERROR)
}
