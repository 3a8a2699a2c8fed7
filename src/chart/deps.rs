//! Which subcharts are enabled, decided from the merged values exactly as Helm decides it.
//!
//! At every chart that lists `dependencies`, Helm (1) matches each entry to a chart in charts/
//! with the same name whose version satisfies the entry's version constraint, renaming it to the
//! entry's alias (the same chart may be used under several aliases), keeping charts no entry
//! matches; (2) coalesces the values with the defaults of the chart tree; (3) applies `tags`
//! (a dependency with only false tags is disabled) and then `condition` (the first path that holds
//! a boolean decides, overriding tags); (4) drops disabled charts and repeats for each remaining
//! subchart, with condition paths prefixed by the subchart's name. A chart whose Chart.yaml has no
//! `dependencies` at all stops that process: its subcharts are all kept as they are.

use std::collections::{BTreeSet, HashSet};

use serde_json::Value;

use super::constraint::is_compatible_range;
use super::values::{Values, ValuesSource, coalesce, path_value, table};
use super::{Chart, ChartError, Dependency, Location, Metadata};

/// The enabled charts of a release, each with its chart path.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartTree {
    pub root: ChartNode,
}

/// One enabled chart of the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartNode {
    /// `foo` for the top chart, `foo/bar` for its subchart bar, `foo/bar/baz` below that.
    pub path: String,
    /// The name the parent uses: the dependency's alias, else the chart's name.
    pub name: String,
    /// The chart's own Chart.yaml.
    pub metadata: Metadata,
    /// The entry of the parent's `dependencies` that selected this chart, if one did.
    pub dependency: Option<Dependency>,
    /// Enabled subcharts.
    pub subcharts: Vec<ChartNode>,
    /// Dependencies of this chart that the values disabled.
    pub disabled: Vec<DisabledDependency>,
    /// Where the chart was read from.
    pub location: Location,
}

/// A dependency left out of the release, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct DisabledDependency {
    pub dependency: Dependency,
    /// For example `condition bar.enabled is false` or `tags front-end are false`.
    pub reason: String,
}

impl ChartTree {
    /// Every enabled chart, parents before their subcharts.
    pub fn charts(&self) -> Vec<&ChartNode> {
        let mut out = Vec::new();
        let mut stack = vec![&self.root];
        while let Some(node) = stack.pop() {
            out.push(node);
            stack.extend(node.subcharts.iter().rev());
        }
        out
    }

    /// The enabled chart with this chart path.
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

/// A chart while its dependencies are processed.
#[derive(Clone)]
struct Work<'a> {
    chart: &'a Chart,
    name: String,
    requirements: Option<Vec<Dependency>>,
    subcharts: Vec<Work<'a>>,
    selected_by: Option<Dependency>,
    disabled: Vec<DisabledDependency>,
}

impl<'a> Work<'a> {
    fn new(chart: &'a Chart) -> Self {
        Work {
            chart,
            name: chart.metadata.name.clone(),
            requirements: chart.metadata.dependencies.clone(),
            subcharts: chart.subcharts.iter().map(Work::new).collect(),
            selected_by: None,
            disabled: Vec::new(),
        }
    }
}

impl ValuesSource for Work<'_> {
    fn values_name(&self) -> &str {
        &self.name
    }
    fn default_values(&self) -> &Values {
        &self.chart.values
    }
    fn values_subcharts(&self) -> Box<dyn Iterator<Item = &Self> + '_> {
        Box::new(self.subcharts.iter())
    }
}

/// Decides which subcharts of `chart` are enabled with the user's merged values (the values files
/// and `--set` flags, without the chart's defaults, which this adds as Helm does).
pub fn resolve(chart: &Chart, user_values: &Values) -> Result<ChartTree, ChartError> {
    check_missing(chart, &chart.metadata.name)?;
    let mut root = Work::new(chart);
    process(&mut root, user_values, "", &chart.metadata.name)?;
    Ok(ChartTree {
        root: into_node(root, None)?,
    })
}

/// Every dependency a chart lists in its Chart.yaml, enabled or not, must have a chart of that
/// name in its charts/ (Helm checks this for the top chart; sequenced for every enabled chart).
fn check_missing(chart: &Chart, path: &str) -> Result<(), ChartError> {
    let present: HashSet<&str> = chart
        .subcharts
        .iter()
        .map(|s| s.metadata.name.as_str())
        .collect();
    let missing: BTreeSet<&str> = chart
        .metadata
        .dependencies
        .iter()
        .flatten()
        .map(|d| d.name.as_str())
        .filter(|name| !present.contains(name))
        .collect();
    if !missing.is_empty() {
        return Err(ChartError::MissingDependencies {
            chart: path.to_string(),
            file: chart.location.file("Chart.yaml"),
            names: missing.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    Ok(())
}

fn process(
    work: &mut Work<'_>,
    values: &Values,
    prefix: &str,
    path: &str,
) -> Result<(), ChartError> {
    let Some(requirements) = work.requirements.clone() else {
        return Ok(());
    };

    // Match entries to charts. Charts that no entry matches stay, under their own names.
    let loaded = std::mem::take(&mut work.subcharts);
    let matches = |sub: &Work<'_>, dep: &Dependency| {
        sub.name == dep.name && is_compatible_range(&dep.version, &sub.chart.metadata.version)
    };
    let mut subcharts: Vec<Work<'_>> = loaded
        .iter()
        .filter(|sub| !requirements.iter().any(|dep| matches(sub, dep)))
        .cloned()
        .collect();
    for dependency in &requirements {
        if let Some(found) = loaded.iter().find(|sub| matches(sub, dependency)) {
            let mut selected = found.clone();
            selected.name = dependency.effective_name().to_string();
            selected.selected_by = Some(dependency.clone());
            subcharts.push(selected);
        }
    }
    work.subcharts = subcharts;

    let coalesced = coalesce(work, values).map_err(|message| ChartError::Coalesce {
        chart: path.to_string(),
        message,
    })?;

    // Tags, then conditions; a condition that holds a boolean overrides the tags.
    let tags = table(&coalesced, "tags");
    let mut removed = HashSet::new();
    for dependency in &requirements {
        let mut enabled = true;
        let mut reason = String::new();
        if let Some(tags) = tags {
            let mut any_true = false;
            let mut false_tags = Vec::new();
            for tag in &dependency.tags {
                match tags.get(tag) {
                    Some(Value::Bool(true)) => any_true = true,
                    Some(Value::Bool(false)) => false_tags.push(tag.as_str()),
                    _ => {}
                }
            }
            if !any_true && !false_tags.is_empty() {
                enabled = false;
                reason = format!("tags {} are false", false_tags.join(", "));
            }
        }
        // Helm splits on commas without trimming each path, so `a.enabled, b.enabled` never
        // finds ` b.enabled`; we do the same so that both tools agree.
        for condition in dependency.condition.trim().split(',') {
            if condition.is_empty() {
                continue;
            }
            if let Some(Value::Bool(value)) =
                path_value(&coalesced, &format!("{prefix}{condition}"))
            {
                enabled = *value;
                reason = format!("condition {} is false", condition.trim());
                break;
            }
        }
        if !enabled {
            removed.insert(dependency.effective_name().to_string());
            work.disabled.push(DisabledDependency {
                dependency: dependency.clone(),
                reason,
            });
        }
    }
    work.subcharts.retain(|sub| !removed.contains(&sub.name));

    for sub in &mut work.subcharts {
        let sub_prefix = format!("{prefix}{}.", sub.name);
        let sub_path = format!("{path}/{}", sub.name);
        process(sub, &coalesced, &sub_prefix, &sub_path)?;
    }
    Ok(())
}

/// The enabled chart as a node of the tree, checking that its dependencies are all there.
fn into_node(work: Work<'_>, parent_path: Option<&str>) -> Result<ChartNode, ChartError> {
    let path = match parent_path {
        Some(parent) => format!("{parent}/{}", work.name),
        None => work.name.clone(),
    };
    if parent_path.is_some() {
        check_missing(work.chart, &path)?;
    }
    let mut subcharts = work
        .subcharts
        .into_iter()
        .map(|sub| into_node(sub, Some(&path)))
        .collect::<Result<Vec<ChartNode>, ChartError>>()?;
    subcharts.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ChartNode {
        path,
        name: work.name,
        metadata: work.chart.metadata.clone(),
        dependency: work.selected_by,
        subcharts,
        disabled: work.disabled,
        location: work.chart.location.clone(),
    })
}
