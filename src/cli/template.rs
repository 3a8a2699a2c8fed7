//! `sequenced template`: the rendered documents of a chart with their chart paths.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::{ChartArgs, TemplateArgs};
use crate::chart::{ChartNode, ChartTree};
use crate::helm::{Helm, HelmError};
use crate::pipeline::{self, ChartSource, RenderRequest, Resolved};
use crate::plan::{Hook, Plan, Resource, draw};
use crate::render::Rendered;

/// Anything that stops a chart from being fetched, rendered or planned.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Helm(#[from] HelmError),
    #[error(transparent)]
    Pipeline(#[from] pipeline::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("interrupted")]
    Interrupted,
}

/// A chart resolved, rendered, and its tree built from what Helm rendered.
pub struct LoadedChart {
    pub resolved: Resolved,
    pub tree: ChartTree,
    pub rendered: Rendered,
    pub release_name: String,
    pub namespace: String,
}

/// Resolves and renders the chart the arguments name, through the chart pipeline the operator
/// uses. Ctrl-C stops helm too.
pub fn load_and_render(args: &ChartArgs) -> Result<LoadedChart, CommandError> {
    let helm = Helm::locate()?;
    // Read the user's values before any download, so a typo fails fast.
    let values = args.values_files()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CommandError::Runtime)?;
    runtime.block_on(async {
        tokio::select! {
            loaded = load(&helm, args, values) => loaded,
            _ = tokio::signal::ctrl_c() => Err(CommandError::Interrupted),
        }
    })
}

async fn load(
    helm: &Helm,
    args: &ChartArgs,
    values: Vec<pipeline::ValuesFile>,
) -> Result<LoadedChart, CommandError> {
    let source = ChartSource::Reference(args.reference());
    let credentials = args.credentials();
    let verification = args.verify.verification()?;
    let resolved = pipeline::resolve_verified(
        helm,
        &args.cache(),
        &source,
        credentials.as_ref(),
        verification.as_ref(),
    )
    .await?;
    let loaded = pipeline::load(&resolved).await?;
    // The release is named after the chart unless told otherwise. A chart whose Chart.yaml
    // cannot be read is left for helm to report.
    let release_name = args.release_name.clone().unwrap_or_else(|| {
        loaded
            .name()
            .map_or_else(|| "release-name".to_string(), str::to_string)
    });
    let request = RenderRequest {
        release_name: release_name.clone(),
        namespace: args.namespace.clone(),
        values,
        flags: args.value_flags(),
        kube_version: args.kube_version.clone(),
        api_versions: args.api_versions.clone(),
        is_upgrade: false,
    };
    let rendered = pipeline::render_loaded(helm, &resolved, loaded, &request).await?;
    Ok(LoadedChart {
        resolved,
        tree: rendered.tree,
        rendered: rendered.documents,
        release_name,
        namespace: args.namespace.clone(),
    })
}

/// Runs the command and returns what it prints.
pub fn run(args: &TemplateArgs) -> Result<String, CommandError> {
    let mut loaded = load_and_render(&args.chart)?;
    let texts = original_texts(&loaded.rendered);
    // The planner takes the documents; the output needs only their texts, kept above.
    let rendered = pipeline::Rendered {
        tree: loaded.tree.clone(),
        documents: std::mem::take(&mut loaded.rendered),
    };
    let plan = pipeline::plan(rendered)?;
    Ok(format_output(&loaded, &plan, &texts))
}

/// Where a rendered object came from and what it is: how a plan's resource is matched to the
/// text Helm printed for it.
type TextKey = (String, String, String, String, Option<String>);

fn text_key(
    chart: &str,
    template: &str,
    kind: &str,
    name: &str,
    namespace: Option<&str>,
) -> TextKey {
    (
        chart.to_string(),
        template.to_string(),
        kind.to_string(),
        name.to_string(),
        namespace.map(str::to_string),
    )
}

/// The text Helm printed for each document whose annotations the planner keeps as they are.
/// Documents that lose annotations (keys a real API server rejects) are printed from the object.
fn original_texts(rendered: &Rendered) -> HashMap<TextKey, String> {
    rendered
        .all()
        .filter(|d| {
            d.object
                .pointer("/metadata/annotations")
                .and_then(|a| a.as_object())
                .is_none_or(|a| {
                    a.keys()
                        .all(|k| crate::plan::annotations::valid_annotation_key(k))
                })
        })
        .map(|d| {
            (
                text_key(&d.chart, &d.template, d.kind(), d.name(), d.namespace()),
                d.text.clone(),
            )
        })
        .collect()
}

fn write_resource(out: &mut String, resource: &Resource, texts: &HashMap<TextKey, String>) {
    let key = text_key(
        &resource.chart,
        &resource.template,
        &resource.kind,
        &resource.name,
        resource.namespace.as_deref(),
    );
    let _ = writeln!(
        out,
        "# Source: {}",
        source_path(&resource.chart, &resource.template)
    );
    let _ = writeln!(
        out,
        "# Chart: {}  File: {}  Resource: {}",
        resource.chart,
        resource.template,
        resource.id()
    );
    match texts.get(&key) {
        Some(text) => out.push_str(text.trim_end()),
        None => match serde_yaml_ng::to_string(&resource.object) {
            Ok(text) => out.push_str(text.trim_end()),
            Err(e) => {
                let _ = write!(out, "# cannot print {}: {e}", resource.id());
            }
        },
    }
    out.push('\n');
}

/// The `# Source:` path Helm prints: `foo/charts/bar/templates/x.yaml` for chart path `foo/bar`.
fn source_path(chart: &str, template: &str) -> String {
    format!("{}/{template}", chart.replace('/', "/charts/"))
}

/// The rendered documents in the order of an install, under `## STAGE:` lines: CRDs, the
/// pre-install hooks, the main resources layer by layer between `## START layer:` and
/// `## END layer:` lines (seed 000), the post-install hooks, and last the hooks an install does
/// not run. Each hook sits between `## START hook:` and `## END hook:` lines and is printed once,
/// in the first stage that runs it. The output stays valid multi-document YAML: the annotations
/// are comments.
pub fn format_output(
    loaded: &LoadedChart,
    plan: &Plan,
    texts: &HashMap<TextKey, String>,
) -> String {
    let root = &loaded.tree.root;
    let mut out = String::new();
    let version = loaded
        .resolved
        .version
        .as_deref()
        .unwrap_or(&root.metadata.version);
    let _ = writeln!(
        out,
        "# sequenced template: chart {} {version} ({}), release {} in namespace {}",
        root.metadata.name,
        loaded.resolved.path.display(),
        loaded.release_name,
        loaded.namespace,
    );
    let charts: Vec<String> = loaded
        .tree
        .charts()
        .iter()
        .map(|c| describe_chart(c))
        .collect();
    let _ = writeln!(out, "# Charts: {}", charts.join(", "));
    // Helm decided which dependencies are enabled; what can be said of one it rendered nothing
    // of is what it declares to switch it on or off, not the value those had.
    for node in loaded.tree.charts() {
        for dependency in &node.not_rendered {
            let switches = dependency
                .switches()
                .unwrap_or_else(|| "no condition or tags".to_string());
            let _ = writeln!(
                out,
                "# Not rendered: {}/{} ({switches})",
                node.path,
                dependency.effective_name(),
            );
        }
    }
    let _ = writeln!(
        out,
        "# Documents are in install order: CRDs, pre-install hooks, the layers, post-install hooks;"
    );
    let _ = writeln!(out, "# last, the hooks an install does not run.");
    let _ = writeln!(out, "## STAGE: crds ({})", documents(plan.crds.len()));
    for crd in &plan.crds {
        out.push_str("---\n");
        write_resource(&mut out, crd, texts);
    }
    let stages = HookStages::of(plan);
    let _ = writeln!(
        out,
        "## STAGE: pre-install hooks ({})",
        documents(stages.pre_install.len())
    );
    for hook in &stages.pre_install {
        write_hook(&mut out, hook, texts);
    }
    let _ = writeln!(
        out,
        "## STAGE: resources ({} in {})",
        documents(plan.resources.len()),
        plural(plan.layers.len(), "layer")
    );
    for layer in &plan.layers {
        out.push_str("---\n");
        let _ = writeln!(out, "## START layer: {} {}", layer.chart, layer.name);
        let mut after: Vec<String> = layer
            .depends_on
            .iter()
            .filter_map(|d| plan.layers.get(d.layer))
            .map(|l| format!("{} {}", l.chart, l.name))
            .collect();
        after.extend(layer.after_charts.iter().map(|c| format!("chart {c}")));
        if !after.is_empty() {
            let _ = writeln!(out, "# After: {}", after.join(", "));
        }
        for (i, &r) in layer.resources.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            if let Some(resource) = plan.resources.get(r) {
                write_resource(&mut out, resource, texts);
            }
        }
        let _ = writeln!(out, "## END layer: {} {}", layer.chart, layer.name);
    }
    let _ = writeln!(
        out,
        "## STAGE: post-install hooks ({})",
        documents(stages.post_install.len())
    );
    for hook in plan.hooks_at(POST_INSTALL) {
        if hook.runs_at(PRE_INSTALL) {
            // Printed once, in the pre-install stage; its place in this stage's order is kept.
            let _ = writeln!(
                out,
                "# Runs again here: {} (printed under pre-install hooks)",
                hook_title(hook)
            );
        } else {
            write_hook(&mut out, hook, texts);
        }
    }
    let _ = writeln!(
        out,
        "## STAGE: other hooks ({}: upgrade, rollback, delete and test hooks; an install does not \
         run them, and the operator never runs test hooks)",
        documents(stages.other.len())
    );
    for hook in &stages.other {
        write_hook(&mut out, hook, texts);
    }
    out
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

fn documents(n: usize) -> String {
    plural(n, "document")
}

const PRE_INSTALL: &str = "pre-install";
const POST_INSTALL: &str = "post-install";

/// The hooks of a plan by the stage of an install they are printed in, each hook once, in run
/// order: a hook of both pre-install and post-install is printed with the pre-install ones.
struct HookStages<'a> {
    pre_install: Vec<&'a Hook>,
    post_install: Vec<&'a Hook>,
    other: Vec<&'a Hook>,
}

impl<'a> HookStages<'a> {
    fn of(plan: &'a Plan) -> Self {
        let mut stages = HookStages {
            pre_install: Vec::new(),
            post_install: Vec::new(),
            other: Vec::new(),
        };
        for hook in &plan.hooks {
            if hook.runs_at(PRE_INSTALL) {
                stages.pre_install.push(hook);
            } else if hook.runs_at(POST_INSTALL) {
                stages.post_install.push(hook);
            } else {
                stages.other.push(hook);
            }
        }
        stages
    }
}

/// `<chart> <Kind>/<name>`, as the `## START hook:` and `## END hook:` lines name a hook.
fn hook_title(hook: &Hook) -> String {
    format!("{} {}", hook.resource.chart, hook.resource.id())
}

/// One hook document between `## START hook:` and `## END hook:` lines, with when it runs.
fn write_hook(out: &mut String, hook: &Hook, texts: &HashMap<TextKey, String>) {
    out.push_str("---\n");
    let _ = writeln!(
        out,
        "## START hook: {}  events {}  weight {}  delete policy {}",
        hook_title(hook),
        hook.events.join(","),
        hook.weight,
        hook.delete_policies.join(",")
    );
    if !hook.external.is_empty() {
        let waits: Vec<String> = hook.external.iter().map(draw::external_name).collect();
        let _ = writeln!(out, "# Waits for: {}", waits.join(", "));
    }
    if hook.runs_at(PRE_INSTALL) && hook.runs_at(POST_INSTALL) {
        let _ = writeln!(
            out,
            "# Runs again at post-install, after the layers (printed only here)."
        );
    }
    if hook.is_test() {
        let _ = writeln!(
            out,
            "# A test hook: run by `helm test`, never by the operator."
        );
    }
    write_resource(out, &hook.resource, texts);
    let _ = writeln!(out, "## END hook: {}", hook_title(hook));
}

fn describe_chart(node: &ChartNode) -> String {
    match &node.dependency {
        Some(dep) if dep.alias.is_some() => format!(
            "{} ({} {}, alias)",
            node.path, node.metadata.name, node.metadata.version
        ),
        _ => format!("{} ({})", node.path, node.metadata.version),
    }
}
