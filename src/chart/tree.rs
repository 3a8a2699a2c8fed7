//! The tree of charts Helm rendered, built from the loaded Chart.yaml files and the chart paths
//! of the documents `helm template` printed (`# Source: foo/charts/bar/templates/x.yaml` is chart
//! `foo/bar`).
//!
//! Helm decides which subcharts are enabled (values, conditions, tags) and renames a subchart to
//! its dependency's alias; sequenced does not decide it a second time. A chart is in the tree
//! when it or one of its subcharts rendered a document. A path segment names the dependency with
//! that alias, else the dependency with that name, else a chart of that name in charts/ that no
//! dependency selected (Helm keeps those under their own name).
//!
//! What is not reproduced: Helm matches a dependency to a chart in charts/ by name and version
//! constraint. Here the name alone decides; when charts/ holds two charts of one name, the one
//! whose version equals the dependency's version string is taken, else the first by file name.
//! A declared dependency of which nothing was rendered is listed in
//! [`ChartNode::not_rendered`] whether Helm disabled it (condition, tags) or it renders no
//! documents; the two order the same way (edges to it are dropped, waiting on nothing is instant).

use std::collections::BTreeSet;
use std::ops::Bound;

use super::{Chart, Dependency, Location, Metadata};

/// The charts of a release that Helm rendered, each with its chart path.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartTree {
    pub root: ChartNode,
}

/// One chart of the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartNode {
    /// `foo` for the top chart, `foo/bar` for its subchart bar, `foo/bar/baz` below that.
    pub path: String,
    /// The name the parent uses: the dependency's alias, else the chart's name.
    pub name: String,
    /// The chart's own Chart.yaml.
    pub metadata: Metadata,
    /// The entry of the parent's `dependencies` this chart was rendered for, if one was.
    pub dependency: Option<Dependency>,
    /// Subcharts that rendered something, by name.
    pub subcharts: Vec<ChartNode>,
    /// Dependencies of this chart of which Helm rendered nothing: disabled by a condition or
    /// tags, or enabled and empty.
    pub not_rendered: Vec<Dependency>,
    /// Where the chart was read from.
    pub location: Location,
}

impl ChartTree {
    /// Every chart, parents before their subcharts.
    pub fn charts(&self) -> Vec<&ChartNode> {
        let mut out = Vec::new();
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            out.push(node);
            stack.extend(node.subcharts.iter().rev());
        }
        out
    }

    /// The chart with this chart path.
    pub fn find(&self, path: &str) -> Option<&ChartNode> {
        let mut parts = path.split('/');
        if parts.next()? != self.root.name {
            return None;
        }
        let mut node = &self.root;
        for part in parts {
            node = node.subcharts.iter().find(|s| s.name == part)?;
        }
        Some(node)
    }
}

/// The tree of `chart` with the charts Helm rendered: `rendered` holds the chart path of every
/// document `helm template` printed. A rendered path that names no chart of `charts/` is left
/// out (the document that names it is reported when it is attributed).
pub fn tree(chart: &Chart, rendered: &BTreeSet<String>) -> ChartTree {
    let name = chart.metadata.name.clone();
    ChartTree {
        root: node(chart, name.clone(), name, None, rendered),
    }
}

fn node(
    chart: &Chart,
    path: String,
    name: String,
    dependency: Option<Dependency>,
    rendered: &BTreeSet<String>,
) -> ChartNode {
    let prefix = format!("{path}/");
    // The names directly below this chart that something was rendered for.
    let mut segments: BTreeSet<&str> = rendered
        .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
        .take_while(|p| p.starts_with(&prefix))
        .filter_map(|p| p[prefix.len()..].split('/').next())
        .collect();
    let mut subcharts = Vec::new();
    let mut not_rendered = Vec::new();
    for dep in chart.metadata.dependencies.iter().flatten() {
        let effective = dep.effective_name();
        if !segments.remove(effective) {
            not_rendered.push(dep.clone());
            continue;
        }
        let candidates = || {
            chart
                .subcharts
                .iter()
                .filter(|s| s.metadata.name == dep.name)
        };
        let chosen = candidates()
            .find(|s| s.metadata.version == dep.version)
            .or_else(|| candidates().next());
        if let Some(sub) = chosen {
            let child = format!("{prefix}{effective}");
            subcharts.push(node(
                sub,
                child,
                effective.to_string(),
                Some(dep.clone()),
                rendered,
            ));
        }
    }
    // Charts that no dependency selected keep their own name.
    for segment in segments {
        if let Some(sub) = chart.subcharts.iter().find(|s| s.metadata.name == segment) {
            let child = format!("{prefix}{segment}");
            subcharts.push(node(sub, child, segment.to_string(), None, rendered));
        }
    }
    subcharts.sort_by(|a, b| a.name.cmp(&b.name));
    ChartNode {
        path,
        name,
        metadata: chart.metadata.clone(),
        dependency,
        subcharts,
        not_rendered,
        location: chart.location.clone(),
    }
}
