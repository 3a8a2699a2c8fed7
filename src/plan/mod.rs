//! The sequencing planner: from the attributed documents of a rendered chart tree to a plan.
//!
//! A plan is plain data (serde): the stages of an install (CRDs, hooks, main resources), the main
//! resources as a DAG of layers per chart, the kind order inside each layer, the uninstall order,
//! and which resources must be ready before what. It is pure: no I/O, no clock. The controller
//! executes it and release records store it.
//!
//! Every dialect of the seeds is read into one model (see DESIGN.md "Sequencing semantics"):
//! - named layers (`helm.sh/layer` / `helm.sh/resource-group`, `helm.sh/depends-on/layers` /
//!   `helm.sh/depends-on/resource-groups`); resources without one go after every layer of their
//!   chart, in the layer [`DEFAULT_LAYER`];
//! - werf weights (`werf.io/weight`): groups in ascending order, each ready before the next;
//! - KOTS phases (`kots.io/creation-phase`): groups in ascending order, applied without waiting
//!   except for resources marked `kots.io/wait-for-ready` or `kots.io/wait-for-properties`;
//! - subcharts (`dependencies[].depends-on`, `helm.sh/depends-on/subcharts`): a chart's subtree
//!   starts after the subtrees it depends on are ready.

pub mod annotations;
mod build;
pub mod draw;
pub mod kind_order;

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chart::ChartTree;
use crate::render::Rendered;

/// The layer of the resources of a chart that uses named layers but gives them none. Its
/// parentheses keep it apart from every name a chart can write.
pub const DEFAULT_LAYER: &str = "(default)";

/// What the planner makes of a rendered chart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The top chart's name.
    pub chart: String,
    /// Stage 1: CRDs from the charts' `crds/` directories, applied first, in kind and file order.
    pub crds: Vec<Resource>,
    /// Stages 2 and 5: the hooks, in the order they run (weight, kind, name).
    pub hooks: Vec<Hook>,
    /// Stage 3: the main resources, in deploy order (layer by layer, kind order inside a layer).
    pub resources: Vec<Resource>,
    /// The layers of the main resources, in deploy order. Layers of one level may run at once.
    pub layers: Vec<Layer>,
    /// Every chart of the tree, parents before their subcharts.
    pub charts: Vec<ChartPlan>,
    /// The order of an uninstall, first step first.
    pub uninstall: Vec<UninstallStep>,
    /// What the planner noticed but did not refuse.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Diagnostic>,
}

/// One object to apply, with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// The chart path: `foo`, `foo/bar`.
    pub chart: String,
    /// The file inside that chart: `templates/app.yaml`.
    pub template: String,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object to apply: as rendered, without the sequencing annotations whose keys a real API
    /// server rejects.
    pub object: Value,
    /// Later KOTS phases wait until this resource is ready (`kots.io/wait-for-ready`,
    /// `kots.io/wait-for-properties`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gate: bool,
}

impl Resource {
    /// `Kind/name`, as messages name resources.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// The API group (empty for the core group).
    pub fn group(&self) -> &str {
        api_group(&self.api_version)
    }
}

/// The group of an apiVersion: `apps` of `apps/v1`, empty for the core group (`v1`).
pub fn api_group(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map(|(group, _)| group)
        .unwrap_or("")
}

/// How a chart groups its main resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Dialect {
    /// No sequencing annotation: one layer.
    None,
    /// `helm.sh/layer` / `helm.sh/resource-group` (seed 000, HIP-0025).
    Layers,
    /// `werf.io/weight` (seed 003).
    Weights,
    /// `kots.io/creation-phase` (seed 002).
    Phases,
}

/// What puts resources into a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Grouping {
    /// A named layer.
    Named,
    /// The resources without a layer ([`DEFAULT_LAYER`]), or every resource of a chart without
    /// sequencing annotations.
    Default,
    /// A `werf.io/weight` group.
    Weight(i64),
    /// A `kots.io/creation-phase` group.
    Phase(i64),
}

/// A group of resources of one chart applied together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Layer {
    /// The chart path.
    pub chart: String,
    /// The layer's name: as written for named layers, [`DEFAULT_LAYER`], `weight N` or `phase N`.
    pub name: String,
    pub grouping: Grouping,
    /// 1 for layers that can start at once; otherwise one more than the highest level this layer
    /// waits for.
    pub level: usize,
    /// Indices into [`Plan::resources`], in apply order.
    pub resources: Vec<usize>,
    /// Layers of the same chart that come first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<LayerDependency>,
    /// Chart paths whose whole subtree (every resource of the chart and its subcharts) must be
    /// ready before this layer starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_charts: Vec<String>,
    /// Objects outside the release that must exist and be ready first (werf).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<ExternalDependency>,
}

/// A layer of the same chart that must come first, and how much of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerDependency {
    /// Index into [`Plan::layers`].
    pub layer: usize,
    pub wait: Wait,
}

/// What a dependency waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Wait {
    /// Every resource of the layer is ready.
    Ready,
    /// The layer is applied and its gate resources ([`Resource::gate`]) are ready (KOTS phases).
    Gates,
}

/// An object outside the release that a layer or hook waits for
/// (`<id>.external-dependency.werf.io/resource: KIND[.GROUP]/NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalDependency {
    /// The `<id>` of the annotation.
    pub id: String,
    /// The kind as written (`secret`, `Deployment`); matched without regard to case.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub name: String,
    /// `<id>.external-dependency.werf.io/namespace`; without it, the release namespace (for
    /// namespaced kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The resource that declared it (`Kind/name`) and its file.
    pub declared_by: String,
    pub template: String,
}

/// A Helm hook and when it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub resource: Resource,
    /// `pre-install`, `post-upgrade`, ... as written in `helm.sh/hook`.
    pub events: Vec<String>,
    /// `helm.sh/hook-weight` (0 when absent).
    pub weight: i64,
    /// `helm.sh/hook-delete-policy`; `before-hook-creation` when absent.
    pub delete_policies: Vec<String>,
    /// `helm.sh/hook-output-log-policy`: `hook-succeeded`, `hook-failed` (a Job's or Pod's log
    /// is told when it succeeded, or failed; a failed one's always is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_log_policies: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external: Vec<ExternalDependency>,
}

impl Hook {
    /// Whether this hook runs at `event` (`pre-install`, ...).
    pub fn runs_at(&self, event: &str) -> bool {
        self.events.iter().any(|e| e == event)
    }

    /// `test` hooks run only on `helm test`, never on install or upgrade.
    pub fn is_test(&self) -> bool {
        self.events.iter().any(|e| is_test_event(e))
    }

    /// A hook of `helm test` only: the operator never runs it.
    pub fn only_test(&self) -> bool {
        self.events.iter().all(|e| is_test_event(e))
    }
}

/// `test` (and Helm 2's `test-success`): run by `helm test`, never by the operator.
pub fn is_test_event(event: &str) -> bool {
    event == "test" || event == "test-success"
}

/// One chart of the tree and how it is ordered against its siblings and subcharts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChartPlan {
    /// `foo`, `foo/bar`.
    pub path: String,
    /// The name its parent uses (alias or name).
    pub name: String,
    pub version: String,
    pub dialect: Dialect,
    /// Indices into [`Plan::layers`] of this chart's own layers, in deploy order.
    pub layers: Vec<usize>,
    /// Sibling chart paths whose subtrees must be ready before this chart's subtree starts
    /// (the parent's `dependencies[].depends-on`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// Subchart paths that must be ready before this chart's own resources start
    /// (`helm.sh/depends-on/subcharts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_after: Vec<String>,
    /// Dependencies of which Helm rendered nothing (disabled by a condition or tags, or enabled
    /// and empty); edges to them are dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disabled: Vec<String>,
}

/// A group of resources deleted together on uninstall.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UninstallStep {
    pub chart: String,
    /// The layer's name, or `deletion phase N` for `kots.io/deletion-phase` groups.
    pub name: String,
    /// Indices into [`Plan::resources`], in delete order.
    pub resources: Vec<usize>,
    /// Indices into [`Plan::uninstall`] of the steps whose objects must be gone first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<usize>,
}

impl Plan {
    /// Indices of the resources that must be ready before `layer` starts: all resources of the
    /// layers it waits on fully and of the chart subtrees it waits for, and the gate resources of
    /// the KOTS phases before it.
    pub fn must_be_ready(&self, layer: usize) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        let Some(l) = self.layers.get(layer) else {
            return out;
        };
        for dependency in &l.depends_on {
            if let Some(d) = self.layers.get(dependency.layer) {
                match dependency.wait {
                    Wait::Ready => out.extend(d.resources.iter().copied()),
                    Wait::Gates => out.extend(
                        d.resources
                            .iter()
                            .copied()
                            .filter(|&r| self.resources.get(r).is_some_and(|r| r.gate)),
                    ),
                }
            }
        }
        for chart in &l.after_charts {
            for other in &self.layers {
                if in_subtree(&other.chart, chart) {
                    out.extend(other.resources.iter().copied());
                }
            }
        }
        out
    }

    /// Indices of the layers that must have been applied before `layer` starts.
    pub fn must_be_applied(&self, layer: usize) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        let Some(l) = self.layers.get(layer) else {
            return out;
        };
        out.extend(l.depends_on.iter().map(|d| d.layer));
        for chart in &l.after_charts {
            out.extend(
                self.layers
                    .iter()
                    .enumerate()
                    .filter(|(_, other)| in_subtree(&other.chart, chart))
                    .map(|(i, _)| i),
            );
        }
        out
    }

    /// The hooks that run at `event`, in order.
    pub fn hooks_at<'a>(&'a self, event: &'a str) -> impl Iterator<Item = &'a Hook> + 'a {
        self.hooks.iter().filter(move |h| h.runs_at(event))
    }

    /// The number of levels of the layer DAG.
    pub fn levels(&self) -> usize {
        self.layers.iter().map(|l| l.level).max().unwrap_or(0)
    }
}

/// Whether chart path `chart` is `root` or below it.
pub fn in_subtree(chart: &str, root: &str) -> bool {
    chart == root
        || chart
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Errors and warnings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Severity {
    Error,
    Warning,
}

/// The kinds of problems, as fixed short categories (metrics labels, tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Problem {
    /// A cycle among layers or subcharts.
    Cycle,
    /// A dependency on a layer no resource of the chart declares.
    UnknownLayer,
    /// A dependency on a subchart name or tag the chart does not have.
    UnknownSubchart,
    /// Named layers, werf weights and KOTS phases mixed in one chart.
    MixedDialects,
    /// An annotation value that cannot be read.
    BadAnnotation,
    /// An annotation key a real API server rejects.
    InvalidAnnotationKey,
    /// The same object rendered twice.
    DuplicateResource,
    /// A document without kind or name, or from a chart not in the tree.
    BadDocument,
    /// A sequencing annotation that has no effect where it is (on a hook, say).
    Ignored,
}

impl Problem {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            Problem::Cycle => "cycle",
            Problem::UnknownLayer => "unknown_layer",
            Problem::UnknownSubchart => "unknown_subchart",
            Problem::MixedDialects => "mixed_dialects",
            Problem::BadAnnotation => "bad_annotation",
            Problem::InvalidAnnotationKey => "invalid_annotation_key",
            Problem::DuplicateResource => "duplicate_resource",
            Problem::BadDocument => "bad_document",
            Problem::Ignored => "ignored",
        }
    }
}

/// One error or warning, naming the chart, file and resource it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    pub severity: Severity,
    pub problem: Problem,
    /// The chart path.
    pub chart: String,
    /// The file (`templates/app.yaml`, or the path of a Chart.yaml).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// `Kind/name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The whole message, naming the chart, file and resource.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A chart that cannot be planned: every error found, and the warnings.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct PlanError {
    pub errors: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
}

impl PlanError {
    /// The category of the first error, for metrics labels.
    pub fn category(&self) -> &'static str {
        self.errors
            .first()
            .map(|e| e.problem.category())
            .unwrap_or("plan")
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&error.message)?;
        }
        Ok(())
    }
}

/// Plans a rendered chart tree. Every error is collected, so one run reports them all.
pub fn plan(tree: &ChartTree, rendered: Rendered) -> Result<Plan, PlanError> {
    build::Builder::new(tree).build(rendered)
}

/// Every error and warning of a plan's outcome, errors first.
pub fn diagnostics(outcome: Result<Plan, PlanError>) -> Vec<Diagnostic> {
    let mut out = match outcome {
        Ok(plan) => plan.warnings,
        Err(e) => e.errors.into_iter().chain(e.warnings).collect(),
    };
    out.sort_by_key(|d| d.severity);
    out
}
