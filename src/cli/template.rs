//! `sequenced template`: the rendered documents of a chart with their chart paths.

use std::fmt::Write as _;

use super::{ChartArgs, TemplateArgs};
use crate::chart::source::{FetchedChart, SourceError};
use crate::chart::{ChartError, ChartNode, ChartTree};
use crate::helm::{Helm, HelmError};
use crate::render::{Document, RenderError, RenderOptions, Rendered};

/// Anything that stops a chart from being loaded and rendered.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Helm(#[from] HelmError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Chart(#[from] ChartError),
    #[error(transparent)]
    Render(#[from] RenderError),
}

/// A chart fetched, loaded, resolved against the values and rendered.
pub struct LoadedChart {
    pub fetched: FetchedChart,
    pub tree: ChartTree,
    pub rendered: Rendered,
    pub release_name: String,
    pub namespace: String,
}

/// Fetches, loads and renders the chart the arguments name.
pub fn load_and_render(args: &ChartArgs) -> Result<LoadedChart, CommandError> {
    let helm = Helm::locate()?;
    let values = args.value_options();
    // Read the user's values before any download, so a typo fails fast.
    let user_values = values.merge()?;
    let fetched = args
        .cache()
        .fetch(&helm, &args.reference(), args.credentials().as_ref())?;
    let chart = crate::chart::load(&fetched.path)?;
    let tree = crate::chart::resolve(&chart, &user_values)?;
    let release_name = args
        .release_name
        .clone()
        .unwrap_or_else(|| chart.metadata.name.clone());
    let options = RenderOptions {
        release_name: release_name.clone(),
        namespace: args.namespace.clone(),
        values_files: values.files.clone(),
        set_json: values.set_json.clone(),
        set: values.set.clone(),
        set_string: values.set_string.clone(),
        set_literal: values.set_literal.clone(),
        kube_version: args.kube_version.clone(),
        api_versions: args.api_versions.clone(),
        is_upgrade: false,
    };
    let rendered = crate::render::render(&helm, &fetched.path, &tree, &options)?;
    Ok(LoadedChart {
        fetched,
        tree,
        rendered,
        release_name,
        namespace: args.namespace.clone(),
    })
}

/// Runs the command and returns what it prints.
pub fn run(args: &TemplateArgs) -> Result<String, CommandError> {
    let loaded = load_and_render(&args.chart)?;
    Ok(format_output(&loaded))
}

/// The rendered documents under stage headers, each with its chart path, file and resource. The
/// output stays valid multi-document YAML: the annotations are comments.
pub fn format_output(loaded: &LoadedChart) -> String {
    let root = &loaded.tree.root;
    let mut out = String::new();
    let version = loaded
        .fetched
        .version
        .as_deref()
        .unwrap_or(&root.metadata.version);
    let _ = writeln!(
        out,
        "# sequenced template: chart {} {version} ({}), release {} in namespace {}",
        root.metadata.name,
        loaded.fetched.path.display(),
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
    for node in loaded.tree.charts() {
        for disabled in &node.disabled {
            let _ = writeln!(
                out,
                "# Disabled: {}/{} ({})",
                node.path,
                disabled.dependency.effective_name(),
                disabled.reason
            );
        }
    }
    let _ = writeln!(
        out,
        "# Documents are in the order Helm printed them, grouped by stage."
    );
    let stages: [(&str, &[Document]); 3] = [
        ("crds", &loaded.rendered.crds),
        ("hooks", &loaded.rendered.hooks),
        ("resources", &loaded.rendered.resources),
    ];
    for (stage, documents) in stages {
        let _ = writeln!(out, "## STAGE: {stage} ({} documents)", documents.len());
        for document in documents {
            out.push_str("---\n");
            let _ = writeln!(out, "# Source: {}", document.source);
            let _ = writeln!(
                out,
                "# Chart: {}  File: {}  Resource: {}",
                document.chart,
                document.template,
                document.resource()
            );
            out.push_str(document.text.trim_end());
            out.push('\n');
        }
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
