//! `sequenced template`: the rendered documents of a chart with their chart paths.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::{ChartArgs, TemplateArgs};
use crate::chart::{ChartNode, ChartTree};
use crate::helm::{Helm, HelmError};
use crate::pipeline::{self, ChartSource, RenderRequest, Resolved};
use crate::plan::{Plan, Resource};
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
    let resolved = pipeline::resolve(helm, &args.cache(), &source, credentials.as_ref()).await?;
    // The release is named after the chart unless told otherwise. A chart whose Chart.yaml
    // cannot be read is left for helm to report.
    let release_name = args.release_name.clone().unwrap_or_else(|| {
        crate::chart::load(&resolved.path)
            .map(|chart| chart.metadata.name)
            .unwrap_or_else(|_| "release-name".to_string())
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
    let rendered = pipeline::render(helm, &resolved, &request).await?;
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

/// The rendered documents in deploy order: CRDs, then hooks in run order, then the main
/// resources layer by layer between `## START layer:` and `## END layer:` lines (seed 000). The
/// output stays valid multi-document YAML: the annotations are comments.
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
        "# Documents are in deploy order: CRDs, hooks in run order, then the layers."
    );
    let _ = writeln!(out, "## STAGE: crds ({} documents)", plan.crds.len());
    for crd in &plan.crds {
        out.push_str("---\n");
        write_resource(&mut out, crd, texts);
    }
    let _ = writeln!(out, "## STAGE: hooks ({} documents)", plan.hooks.len());
    for hook in &plan.hooks {
        out.push_str("---\n");
        let _ = writeln!(
            out,
            "# Hook: {}  weight {}  delete policy {}",
            hook.events.join(","),
            hook.weight,
            hook.delete_policies.join(",")
        );
        write_resource(&mut out, &hook.resource, texts);
    }
    let _ = writeln!(
        out,
        "## STAGE: resources ({} documents in {} layers)",
        plan.resources.len(),
        plan.layers.len()
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
    out
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
