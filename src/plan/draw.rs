//! Pictures of a plan for people: a text view of the levels, Graphviz dot, and Mermaid.
//!
//! Layers are nodes labelled with their resource counts; charts are clusters (subgraphs), nested
//! as the chart tree is. Edges point the way things happen: from what comes first to what waits
//! for it.

use std::fmt::Write as _;

use super::{ChartPlan, Grouping, Plan, Wait, in_subtree};

/// How many resources a layer lists by name in the text view before it summarises the rest.
const LISTED: usize = 4;

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The readable view: stages, then the layers level by level with what each waits for, then the
/// uninstall order.
pub fn text(plan: &Plan) -> String {
    let mut out = String::new();
    let root_version = plan
        .charts
        .first()
        .map(|c| c.version.as_str())
        .unwrap_or("");
    let _ = writeln!(
        out,
        "Chart {} {root_version}: {}, {}, {} in {}",
        plan.chart,
        plural(plan.resources.len(), "resource"),
        plural(plan.layers.len(), "layer"),
        plural(plan.levels(), "level"),
        plural(plan.charts.len(), "chart"),
    );
    for chart in &plan.charts {
        for disabled in &chart.disabled {
            let _ = writeln!(out, "  not rendered: {}/{disabled}", chart.path);
        }
    }
    out.push('\n');
    if plan.crds.is_empty() {
        out.push_str("CRDs: none\n");
    } else {
        let _ = writeln!(
            out,
            "CRDs (applied first, each waited on until Established): {}",
            plural(plan.crds.len(), "CRD")
        );
        for crd in &plan.crds {
            let _ = writeln!(out, "  {}  ({} {})", crd.name, crd.chart, crd.template);
        }
    }
    if plan.hooks.is_empty() {
        out.push_str("Hooks: none\n");
    } else {
        out.push_str("Hooks (one at a time, by weight):\n");
        for hook in &plan.hooks {
            let _ = writeln!(
                out,
                "  {:<28} weight {:<4} {}  ({} {})",
                hook.events.join(","),
                hook.weight,
                hook.resource.id(),
                hook.resource.chart,
                hook.resource.template
            );
        }
    }
    out.push('\n');
    let titles: Vec<String> = (0..plan.layers.len())
        .map(|l| layer_title(plan, l))
        .collect();
    let width = titles.iter().map(String::len).max().unwrap_or(0);
    let mut current = 0;
    for (index, layer) in plan.layers.iter().enumerate() {
        if layer.level != current {
            current = layer.level;
            let note = if current == 1 {
                " (starts at once)"
            } else {
                ""
            };
            let _ = writeln!(out, "Level {current}{note}");
        }
        let names: Vec<String> = layer
            .resources
            .iter()
            .take(LISTED)
            .filter_map(|&r| plan.resources.get(r).map(|r| r.id()))
            .collect();
        let more = layer.resources.len().saturating_sub(LISTED);
        let listed = if more > 0 {
            format!("{}, and {more} more", names.join(", "))
        } else {
            names.join(", ")
        };
        let _ = writeln!(
            out,
            "  {:<width$}  {:>13}  {listed}",
            titles[index],
            plural(layer.resources.len(), "resource"),
        );
        let mut after: Vec<String> = layer
            .depends_on
            .iter()
            .filter_map(|d| {
                let title = titles.get(d.layer)?;
                Some(match d.wait {
                    Wait::Ready => title.clone(),
                    Wait::Gates => {
                        format!("{title} (applied; its kots.io/wait-for-* resources ready)")
                    }
                })
            })
            .collect();
        after.extend(
            layer
                .after_charts
                .iter()
                .map(|c| format!("all of chart {c}")),
        );
        if !after.is_empty() {
            let _ = writeln!(out, "    after {}", after.join(", "));
        }
        for external in &layer.external {
            let group = external
                .group
                .as_deref()
                .map(|g| format!(".{g}"))
                .unwrap_or_default();
            let namespace = external
                .namespace
                .as_deref()
                .map(|n| format!(" in namespace {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "    waits for {}{group}/{}{namespace} (outside the release, declared by {})",
                external.kind, external.name, external.declared_by
            );
        }
    }
    if !plan.uninstall.is_empty() {
        out.push_str("\nUninstall, in this order (CRDs are kept):\n");
        for (i, step) in plan.uninstall.iter().enumerate() {
            let title = plan
                .layers
                .iter()
                .position(|l| l.chart == step.chart && l.name == step.name)
                .map(|l| titles[l].clone())
                .unwrap_or_else(|| format!("{} {}", step.chart, step.name));
            let _ = writeln!(
                out,
                "  {:>2}. {:<width$}  {}",
                i + 1,
                title,
                plural(step.resources.len(), "resource")
            );
        }
    }
    out
}

fn quote_dot(text: &str) -> String {
    format!(
        "\"{}\"",
        text.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    )
}

fn children<'a>(
    plan: &'a Plan,
    chart: &'a ChartPlan,
) -> impl Iterator<Item = (usize, &'a ChartPlan)> + 'a {
    plan.charts.iter().enumerate().filter(move |(_, c)| {
        c.path
            .strip_prefix(chart.path.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|rest| !rest.contains('/'))
    })
}

/// The first and last layer (by deploy order) of a chart's subtree, to hang chart edges on.
fn subtree_ends(plan: &Plan, chart: &str) -> Option<(usize, usize)> {
    let mut inside = plan
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| in_subtree(&l.chart, chart))
        .map(|(i, _)| i);
    let first = inside.next()?;
    let last = inside.next_back().unwrap_or(first);
    Some((first, last))
}

fn chart_label(chart: &ChartPlan) -> String {
    format!("{} {}", chart.path, chart.version)
}

/// Whether a layer is all of its chart (a chart without sequencing annotations).
fn whole_chart(plan: &Plan, layer: usize) -> bool {
    let l = &plan.layers[layer];
    l.grouping == Grouping::Default
        && plan
            .charts
            .iter()
            .find(|c| c.path == l.chart)
            .is_some_and(|c| c.layers.len() == 1)
}

fn layer_label(plan: &Plan, layer: usize) -> String {
    let l = &plan.layers[layer];
    let count = plural(l.resources.len(), "resource");
    if whole_chart(plan, layer) {
        count
    } else {
        format!("{}\n{count}", l.name)
    }
}

/// How the text view names a layer: `shop app`, or just `foo/nginx` for a chart in one layer.
fn layer_title(plan: &Plan, layer: usize) -> String {
    let l = &plan.layers[layer];
    if whole_chart(plan, layer) {
        l.chart.clone()
    } else {
        format!("{} {}", l.chart, l.name)
    }
}

/// Graphviz dot: `sequenced graph CHART --format dot | dot -Tsvg > plan.svg`.
pub fn dot(plan: &Plan) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote_dot(&plan.chart));
    out.push_str("  compound=true;\n  rankdir=TB;\n  newrank=true;\n  fontname=\"Helvetica\";\n");
    out.push_str("  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef4ff\", fontname=\"Helvetica\"];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=10];\n");
    if let Some(root) = plan.charts.first() {
        dot_cluster(plan, 0, root, 1, &mut out);
    }
    for (i, layer) in plan.layers.iter().enumerate() {
        for dep in &layer.depends_on {
            let style = match dep.wait {
                Wait::Ready => String::new(),
                Wait::Gates => " [style=dashed, label=\"applied\"]".to_string(),
            };
            let _ = writeln!(out, "  l{} -> l{i}{style};", dep.layer);
        }
    }
    for (c, chart) in plan.charts.iter().enumerate() {
        let Some((first, _)) = subtree_ends(plan, &chart.path) else {
            continue;
        };
        for before in &chart.after {
            let Some((_, last)) = subtree_ends(plan, before) else {
                continue;
            };
            let b = plan
                .charts
                .iter()
                .position(|x| &x.path == before)
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "  l{last} -> l{first} [ltail=cluster_{b}, lhead=cluster_{c}, penwidth=2, label=\"chart ready\"];"
            );
        }
        for sub in &chart.own_after {
            let Some((_, last)) = subtree_ends(plan, sub) else {
                continue;
            };
            let b = plan.charts.iter().position(|x| &x.path == sub).unwrap_or(0);
            for &own in &chart.layers {
                if plan.layers[own].after_charts.iter().any(|a| a == sub) {
                    let _ = writeln!(
                        out,
                        "  l{last} -> l{own} [ltail=cluster_{b}, penwidth=2, label=\"chart ready\"];"
                    );
                }
            }
        }
    }
    out.push_str("}\n");
    out
}

fn dot_cluster(plan: &Plan, index: usize, chart: &ChartPlan, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    let _ = writeln!(out, "{pad}subgraph cluster_{index} {{");
    let _ = writeln!(out, "{pad}  label={};", quote_dot(&chart_label(chart)));
    let _ = writeln!(out, "{pad}  style=rounded;");
    if chart.layers.is_empty() && children(plan, chart).next().is_none() {
        let _ = writeln!(
            out,
            "{pad}  c{index} [label=\"no resources\", shape=plaintext];"
        );
    }
    for &layer in &chart.layers {
        let _ = writeln!(
            out,
            "{pad}  l{layer} [label={}];",
            quote_dot(&layer_label(plan, layer))
        );
    }
    for (child_index, child) in children(plan, chart) {
        dot_cluster(plan, child_index, child, depth + 1, out);
    }
    let _ = writeln!(out, "{pad}}}");
}

fn quote_mermaid(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "#quot;").replace('\n', "<br/>"))
}

/// Mermaid: paste into a Markdown ```mermaid block.
pub fn mermaid(plan: &Plan) -> String {
    let mut out = String::from("flowchart TB\n");
    if let Some(root) = plan.charts.first() {
        mermaid_cluster(plan, 0, root, 1, &mut out);
    }
    for (i, layer) in plan.layers.iter().enumerate() {
        for dep in &layer.depends_on {
            let arrow = match dep.wait {
                Wait::Ready => "-->",
                Wait::Gates => "-. applied .->",
            };
            let _ = writeln!(out, "  l{} {arrow} l{i}", dep.layer);
        }
    }
    for (c, chart) in plan.charts.iter().enumerate() {
        for before in &chart.after {
            let b = plan
                .charts
                .iter()
                .position(|x| &x.path == before)
                .unwrap_or(0);
            let _ = writeln!(out, "  c{b} ==> c{c}");
        }
        for sub in &chart.own_after {
            let b = plan.charts.iter().position(|x| &x.path == sub).unwrap_or(0);
            for &own in &chart.layers {
                if plan.layers[own].after_charts.iter().any(|a| a == sub) {
                    let _ = writeln!(out, "  c{b} ==> l{own}");
                }
            }
        }
    }
    out
}

fn mermaid_cluster(plan: &Plan, index: usize, chart: &ChartPlan, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    let _ = writeln!(
        out,
        "{pad}subgraph c{index}[{}]",
        quote_mermaid(&chart_label(chart))
    );
    for &layer in &chart.layers {
        let _ = writeln!(
            out,
            "{pad}  l{layer}[{}]",
            quote_mermaid(&layer_label(plan, layer))
        );
    }
    for (child_index, child) in children(plan, chart) {
        mermaid_cluster(plan, child_index, child, depth + 1, out);
    }
    let _ = writeln!(out, "{pad}end");
}
