//! `sequenced diff`: what the next revision of a release would do to the cluster, without
//! writing anything. The spec is prepared, rendered and planned by the operator's own code
//! (`controller::source`, `controller::plans`), the live revision is read from its record, and
//! every object of the plan is compared with the live one through a server-side apply dry run of
//! exactly what the operator would apply ([`crate::controller::as_applied`],
//! [`Cluster::apply_dry_run`]). Comparing and drawing are pure ([`report`]).

mod report;

use std::io::{IsTerminal as _, Read as _};
use std::path::Path;
use std::process::ExitCode;

use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt as _};

use self::report::{Action, LayerDiff, ObjectDiff, Report, StageDiff};
use super::status::{error_chain, object_missing, one_line};
use super::{DiffArgs, DiffOutput};
use crate::api::{CRD_LAYER, CrdPolicy, Identity, ObjectKey, PRUNE_LAYER, SequencedRelease};
use crate::chart::source::ChartCache;
use crate::cluster::{Cluster, ClusterError};
use crate::controller::as_applied;
use crate::controller::plans::Plans;
use crate::controller::records::Records;
use crate::controller::source::Sources;
use crate::helm::Helm;
use crate::history::{HookRecord, Record};
use crate::pipeline::{ValueFlags, ValuesFile};
use crate::rollout::hooks::Stage;
use crate::rollout::{Deployable, Settings};

/// Exit code of an error.
pub const EXIT_ERROR: u8 = 1;
/// Exit code with `--exit-code` when something would change.
pub const EXIT_CHANGES: u8 = 2;

/// Why there is no diff to show.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("no cluster to talk to (kubeconfig or in-cluster config): {0}")]
    NoCluster(String),
    #[error("{0}")]
    Usage(String),
    #[error("{file}: {message}")]
    Manifest { file: String, message: String },
    #[error("SequencedRelease {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error(
        "the cluster does not serve SequencedRelease (sequenced.dev/v1alpha1): install the CRD with `sequenced crd | kubectl apply --server-side -f -`"
    )]
    CrdMissing,
    #[error("SequencedRelease {release}: {message}")]
    Release { release: String, message: String },
    #[error("{0}")]
    Helm(#[from] crate::helm::HelmError),
    #[error("{0}")]
    Controller(Box<crate::controller::Error>),
    #[error("{0}")]
    Cluster(Box<ClusterError>),
    #[error("{what}: {message}")]
    Io { what: String, message: String },
}

impl From<crate::controller::Error> for DiffError {
    fn from(e: crate::controller::Error) -> DiffError {
        DiffError::Controller(Box::new(e))
    }
}

impl From<ClusterError> for DiffError {
    fn from(e: ClusterError) -> DiffError {
        DiffError::Cluster(Box::new(e))
    }
}

/// Runs the command: prints what would change; exit code 0, or 2 with `--exit-code` when
/// something would change, 1 on an error.
pub fn run(args: &DiffArgs) -> ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DiffError::Io {
            what: "starting the async runtime".to_string(),
            message: e.to_string(),
        })
        .and_then(|runtime| runtime.block_on(preview(args)));
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let printed = match args.output {
        DiffOutput::Json => report::format_json(&report),
        DiffOutput::Text => {
            let colour = std::io::stdout().is_terminal()
                && !args.no_color
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            report::format_text(&report, colour)
        }
    };
    print!("{printed}");
    if args.exit_code && report.changes {
        ExitCode::from(EXIT_CHANGES)
    } else {
        ExitCode::SUCCESS
    }
}

/// The SequencedRelease of a manifest file (`-` for stdin).
fn read_manifest(file: &Path) -> Result<SequencedRelease, DiffError> {
    let origin = file.display().to_string();
    let error = |message: String| DiffError::Manifest {
        file: origin.clone(),
        message,
    };
    let text = if file == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| error(e.to_string()))?;
        text
    } else {
        std::fs::read_to_string(file).map_err(|e| error(crate::chart::io_message(&e)))?
    };
    let value = crate::yaml::parse(&text).map_err(|e| error(format!("invalid YAML at {e}")))?;
    let kind = value.get("kind").and_then(serde_json::Value::as_str);
    if kind != Some("SequencedRelease") {
        return Err(error(format!(
            "not a SequencedRelease (kind {})",
            kind.unwrap_or("missing")
        )));
    }
    let release: SequencedRelease =
        serde_json::from_value(value).map_err(|e| error(format!("not a SequencedRelease: {e}")))?;
    if release.metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err(error("metadata.name is missing".to_string()));
    }
    Ok(release)
}

/// The live release, None when it does not exist; `crd_missing_is_none`: also when the cluster
/// does not serve the kind (a manifest for a cluster without the operator yet).
async fn live_release(
    client: &Client,
    namespace: &str,
    name: &str,
    crd_missing_is_none: bool,
) -> Result<Option<SequencedRelease>, DiffError> {
    let api: Api<SequencedRelease> = Api::namespaced(client.clone(), namespace);
    match api.get(name).await {
        Ok(release) => Ok(Some(release)),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            if object_missing(&status) || crd_missing_is_none {
                Ok(None)
            } else {
                Err(DiffError::CrdMissing)
            }
        }
        Err(e) => Err(DiffError::Release {
            release: format!("{namespace}/{name}"),
            message: format!("cannot read it: {}", error_chain(&e)),
        }),
    }
}

/// What the revision would deploy, and how it runs.
struct Next {
    deployable: Deployable,
    operation: &'static str,
    events: (&'static str, &'static str),
    crds: CrdPolicy,
    prune: Vec<ObjectKey>,
    new_revision: bool,
    /// Why a new revision would start, in words.
    because: Option<String>,
    rollback_to: Option<i64>,
}

/// Reads, renders, plans and compares; writes nothing.
async fn preview(args: &DiffArgs) -> Result<Report, DiffError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| DiffError::NoCluster(error_chain(&e)))?;
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|e| DiffError::NoCluster(error_chain(&e)))?;
    let (wanted, live) = match &args.name {
        Some(name) => {
            let namespace = args.namespace.clone().unwrap_or(default_namespace);
            let live = live_release(&client, &namespace, name, false)
                .await?
                .ok_or_else(|| DiffError::NotFound {
                    namespace,
                    name: name.clone(),
                })?;
            (live.clone(), Some(live))
        }
        None => {
            let [file] = args.files.as_slice() else {
                return Err(DiffError::Usage(
                    "give the NAME of a live release, or one SequencedRelease manifest with -f"
                        .to_string(),
                ));
            };
            let mut wanted = read_manifest(file)?;
            let namespace = wanted
                .metadata
                .namespace
                .clone()
                .or_else(|| args.namespace.clone())
                .unwrap_or(default_namespace);
            wanted.metadata.namespace = Some(namespace.clone());
            let live = live_release(&client, &namespace, &wanted.name_any(), true).await?;
            (wanted, live)
        }
    };
    let release = ObjectRef::from_obj(&wanted);
    let me = Identity::of(&wanted);
    let records = Records::new(client.clone());
    let live_values = live.as_ref().map(|l| l.spec.values.clone());
    let status = live.and_then(|l| l.status).unwrap_or_default();
    let current = match status.revision {
        Some(n) => records.whole(&release, &me, n).await?,
        None => None,
    };
    let cluster = Cluster::new(client.clone());
    let settings = Settings::of(&wanted.spec);
    let next = match args.revision {
        Some(n) => rollback(&records, &release, &me, i64::from(n), current.as_ref()).await?,
        None => {
            let helm = Helm::locate()?;
            let cache = ChartCache::new(
                args.cache_dir
                    .clone()
                    .unwrap_or_else(ChartCache::default_dir),
            );
            let refused = |message: String| DiffError::Release {
                release: me.owner.clone(),
                message,
            };
            let mut prepared = Sources::default()
                .verifying_with(
                    args.verify
                        .verification()
                        .map_err(|e| DiffError::Usage(e.to_string()))?,
                )
                .prepare(
                    &cluster,
                    &crate::controller::Tenancy::default(),
                    &helm,
                    &cache,
                    &wanted,
                    settings.interval,
                )
                .await?
                .map_err(|r| refused(r.message))?;
            // Values given with NAME are a change of the release's values: a new revision.
            let flags = overridden(args);
            let overrides =
                args.name.is_some() && (!args.files.is_empty() || flags != ValueFlags::default());
            if args.name.is_some() {
                prepared.values.extend(values_files(args)?);
                prepared.flags = flags;
            }
            let number = status.revision.unwrap_or(0) + 1;
            let is_upgrade = (crate::rollout::lifecycle::earlier_ready(&status, number)
                || current.as_ref().is_some_and(Record::is_upgrade))
                && !crate::rollout::recovery::uninstalled(&status);
            let metrics = crate::metrics::Metrics::new().map_err(|e| DiffError::Io {
                what: "metrics".to_string(),
                message: e.to_string(),
            })?;
            let fact = Plans::default()
                .get(
                    &release,
                    &prepared,
                    is_upgrade,
                    true,
                    &cluster,
                    &helm,
                    &crate::kubectl::Kubectl::locate(),
                    &metrics,
                )
                .await?;
            let deployable = (*fact.outcome.map_err(|r| refused(r.message))?).clone();
            let prune = current
                .as_ref()
                .map(|c| c.inventory.removed_in(&deployable.inventory))
                .unwrap_or_default();
            let digest = status.last_applied_digest.as_deref();
            let new_revision = current.is_none() || !prepared.source().matches(digest) || overrides;
            let because = new_revision.then(|| {
                let spec_values_changed = live_values
                    .as_ref()
                    .is_some_and(|v| *v != wanted.spec.values);
                why_new_revision(
                    current.as_ref(),
                    &deployable,
                    overrides,
                    spec_values_changed,
                )
            });
            Next {
                deployable,
                operation: if is_upgrade { "upgrade" } else { "install" },
                events: if is_upgrade {
                    ("pre-upgrade", "post-upgrade")
                } else {
                    ("pre-install", "post-install")
                },
                crds: settings.crd_policy(is_upgrade),
                prune,
                new_revision,
                because,
                rollback_to: None,
            }
        }
    };
    let previous = current.as_ref().and_then(Deployable::from_record);
    let mut report = Report {
        release: me.owner.clone(),
        operation: next.operation.to_string(),
        from_revision: current.as_ref().map(|c| c.revision),
        rollback_to: next.rollback_to,
        new_revision: next.new_revision,
        new_revision_reason: next.because.clone(),
        changes: false,
        stages: Vec::new(),
        layer_order: previous
            .as_ref()
            .map(|p| report::layer_order(&p.plan, &next.deployable.plan))
            .unwrap_or_default(),
        summary: Default::default(),
    };
    let compare = Compare {
        cluster: &cluster,
        me: &me,
    };
    let deployable = &next.deployable;
    let plan = &deployable.plan;
    let hooks: &[HookRecord] = if settings.disable_hooks || !next.new_revision {
        &[]
    } else {
        &deployable.hooks
    };
    if !plan.crds.is_empty() {
        report
            .stages
            .push(compare.crds(deployable, next.crds).await?);
    }
    report
        .stages
        .extend(hook_stage(hooks, next.events.0, &plan.chart));
    let mut layers = Vec::with_capacity(plan.layers.len());
    for layer in &plan.layers {
        let mut objects = Vec::with_capacity(layer.resources.len());
        for &r in &layer.resources {
            let (Some(resource), Some(key)) = (plan.resources.get(r), deployable.keys.get(r))
            else {
                continue;
            };
            let mut object = compare
                .object(
                    key,
                    &resource.object,
                    true,
                    &resource.chart,
                    &resource.template,
                )
                .await?;
            object.chart = Some(resource.chart.clone());
            object.template = Some(resource.template.clone());
            objects.push(object);
        }
        layers.push(LayerDiff {
            chart: layer.chart.clone(),
            name: layer.name.clone(),
            objects,
        });
    }
    report.stages.push(StageDiff {
        stage: "layers".to_string(),
        note: (!settings.sequenced).then(|| "sequencing: none, every layer at once".to_string()),
        layers,
    });
    let mut pruned = Vec::new();
    for key in &next.prune {
        if cluster.find(key).await?.is_some() {
            pruned.push(object_of(key, Action::Delete, None));
        }
    }
    if !pruned.is_empty() {
        report.stages.push(StageDiff {
            stage: "prune".to_string(),
            note: None,
            layers: vec![LayerDiff {
                chart: plan.chart.clone(),
                name: PRUNE_LAYER.to_string(),
                objects: pruned,
            }],
        });
    }
    report
        .stages
        .extend(hook_stage(hooks, next.events.1, &plan.chart));
    Ok(report.finish())
}

/// The `--set*` flags.
fn overridden(args: &DiffArgs) -> ValueFlags {
    ValueFlags {
        set: args.set.clone(),
        set_string: args.set_string.clone(),
        set_json: args.set_json.clone(),
        set_literal: args.set_literal.clone(),
    }
}

/// The `-f` values files given with NAME, read in order.
fn values_files(args: &DiffArgs) -> Result<Vec<ValuesFile>, DiffError> {
    args.files
        .iter()
        .map(|path| {
            let origin = path.display().to_string();
            std::fs::read_to_string(path)
                .map(|text| ValuesFile {
                    origin: origin.clone(),
                    text,
                })
                .map_err(|e| DiffError::Io {
                    what: origin,
                    message: crate::chart::io_message(&e),
                })
        })
        .collect()
}

/// A rollback to `revision`: its stored plan applied again, in its order, then what the current
/// revision has that it has not deleted; the CRDs left alone; the rollback hooks.
async fn rollback(
    records: &Records,
    release: &ObjectRef<SequencedRelease>,
    me: &Identity,
    revision: i64,
    current: Option<&Record>,
) -> Result<Next, DiffError> {
    let refused = |message: String| DiffError::Release {
        release: me.owner.clone(),
        message,
    };
    let Some(target) = records.whole(release, me, revision).await? else {
        return Err(refused(format!(
            "there is no revision {revision} to roll back to{}",
            current
                .map(|c| format!(" (the latest is {})", c.revision))
                .unwrap_or_default()
        )));
    };
    let deployable = Deployable::from_record(&target).ok_or_else(|| {
        refused(format!(
            "revision {revision} has no stored plan (its record was written before rollbacks, or was too large): it cannot be rolled back to"
        ))
    })?;
    let prune = current
        .map(|c| c.uninstall_inventory().removed_in(&target.inventory))
        .unwrap_or_default();
    Ok(Next {
        deployable,
        operation: "rollback",
        events: ("pre-rollback", "post-rollback"),
        crds: CrdPolicy::Skip,
        prune,
        new_revision: true,
        because: Some(format!("a rollback to revision {revision}")),
        rollback_to: Some(revision),
    })
}

/// Why the operator would begin a new revision rather than leave the live one: what differs
/// from the live revision's record (its chart, its values), in words.
fn why_new_revision(
    current: Option<&Record>,
    next: &Deployable,
    overrides: bool,
    spec_values_changed: bool,
) -> String {
    let Some(current) = current else {
        return "the release has no live revision".to_string();
    };
    if overrides {
        return "values given on the command line".to_string();
    }
    let mut changed = Vec::new();
    let version = |v: &Option<String>| v.clone().unwrap_or_else(|| "(no version)".to_string());
    if current.chart != next.plan.chart || current.chart_version != next.chart_version {
        changed.push(format!(
            "the chart changed ({} {} -> {} {})",
            current.chart,
            version(&current.chart_version),
            next.plan.chart,
            version(&next.chart_version)
        ));
    }
    if current.content.values != next.content.values {
        changed.push(if spec_values_changed {
            "spec.values changed".to_string()
        } else {
            "the values of spec.valuesFrom changed".to_string()
        });
    }
    if changed.is_empty() {
        // The digest says something the record does not keep changed.
        "the chart's files or spec.commonMetadata changed".to_string()
    } else {
        changed.join(", ")
    }
}

/// The hooks that run at `event`, in run order, as one stage.
fn hook_stage(hooks: &[HookRecord], event: &'static str, chart: &str) -> Option<StageDiff> {
    let stage = Stage::of(hooks, event, "", std::time::Duration::ZERO)?;
    let objects = stage
        .order
        .iter()
        .filter_map(|&i| hooks.get(i))
        .map(|hook| ObjectDiff {
            chart: Some(hook.chart.clone()),
            template: Some(hook.template.clone()),
            weight: Some(hook.weight),
            ..object_of(&hook.key, Action::Run, None)
        })
        .collect();
    Some(StageDiff {
        stage: event.to_string(),
        note: None,
        layers: vec![LayerDiff {
            chart: chart.to_string(),
            name: crate::api::hook_stage(event),
            objects,
        }],
    })
}

fn object_of(key: &ObjectKey, action: Action, diff: Option<String>) -> ObjectDiff {
    ObjectDiff {
        action,
        api_version: key.api_version.clone(),
        kind: key.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        chart: None,
        template: None,
        weight: None,
        diff,
    }
}

/// Compares planned objects with the live ones.
struct Compare<'a> {
    cluster: &'a Cluster,
    me: &'a Identity,
}

impl Compare<'_> {
    /// One object: to create when it does not exist, else changed or not as a server-side
    /// apply dry run of what the operator applies says; `dry_run` false: an existing one is
    /// left as it is (unchanged).
    async fn object(
        &self,
        key: &ObjectKey,
        rendered: &serde_json::Value,
        dry_run: bool,
        chart: &str,
        template: &str,
    ) -> Result<ObjectDiff, DiffError> {
        let Some(live) = self.cluster.find(key).await? else {
            let applied = as_applied(rendered, key, self.me, None);
            let diff = report::created(&key.api_version, &key.kind, &applied);
            return Ok(object_of(key, Action::Create, Some(diff)));
        };
        // The shard label as the operator wrote it (its shard count is the operator's).
        let shard = live
            .pointer(&format!(
                "/metadata/labels/{}",
                crate::api::SHARD_LABEL.replace('/', "~1")
            ))
            .and_then(serde_json::Value::as_str);
        let applied = as_applied(rendered, key, self.me, shard);
        if !dry_run {
            return Ok(object_of(key, Action::Unchanged, None));
        }
        let after = self
            .cluster
            .apply_dry_run(key, &applied)
            .await
            .map_err(|e| DiffError::Io {
                what: format!("dry run of {key} (chart {chart}, {template})"),
                message: e.to_string(),
            })?;
        Ok(
            match report::changed(&key.api_version, &key.kind, &applied, &live, &after) {
                Some(diff) => object_of(key, Action::Change, Some(diff)),
                None => object_of(key, Action::Unchanged, None),
            },
        )
    }

    /// The `(crds)` stage: what the revision's CRD policy does with the charts' CRDs.
    async fn crds(
        &self,
        deployable: &Deployable,
        policy: CrdPolicy,
    ) -> Result<StageDiff, DiffError> {
        let plan = &deployable.plan;
        let mut objects = Vec::new();
        for (crd, key) in plan.crds.iter().zip(&deployable.crd_keys) {
            if policy == CrdPolicy::Skip {
                continue;
            }
            let replace = policy == CrdPolicy::CreateReplace;
            let mut object = self
                .object(key, &crd.object, replace, &crd.chart, &crd.template)
                .await?;
            object.chart = Some(crd.chart.clone());
            object.template = Some(crd.template.clone());
            objects.push(object);
        }
        let note = match policy {
            CrdPolicy::Skip => "spec.crds Skip: left as they are",
            CrdPolicy::Create => "spec.crds Create: the missing ones created",
            CrdPolicy::CreateReplace => "spec.crds CreateReplace: created or updated",
        };
        Ok(StageDiff {
            stage: "crds".to_string(),
            note: Some(note.to_string()),
            layers: vec![LayerDiff {
                chart: plan.chart.clone(),
                name: CRD_LAYER.to_string(),
                objects,
            }],
        })
    }
}
