//! Pictures of a plan for people: a text view of the levels, Graphviz dot, and Mermaid.
//!
//! Layers are nodes labelled with their resource counts; charts are clusters (subgraphs), nested
//! as the chart tree is. The pre-install and post-install hooks, when a chart has some, are one
//! node each, before the first layers and after the last. Edges point the way things happen: from
//! what comes first to what waits for it.

use std::fmt::Write as _;

use super::{ChartPlan, ExternalDependency, Grouping, Hook, Plan, Wait, in_subtree};

/// How many resources a layer lists by name in the text view before it summarises the rest.
const LISTED: usize = 4;

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The readable view, in the order things run: CRDs, pre-install hooks, the layers level by
/// level with what each waits for, post-install hooks, the hooks an install does not run, then
/// the uninstall order between the pre-delete and post-delete hooks.
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
        hook_stage(plan, PRE_INSTALL, &mut out);
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
        write_externals(&layer.external, "    ", &mut out);
    }
    if !plan.hooks.is_empty() {
        out.push('\n');
        hook_stage(plan, POST_INSTALL, &mut out);
        other_hooks(plan, &mut out);
    }
    if plan.hooks_at(PRE_DELETE).next().is_some() {
        out.push('\n');
        hook_stage(plan, PRE_DELETE, &mut out);
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
    if plan.hooks_at(POST_DELETE).next().is_some() {
        out.push('\n');
        hook_stage(plan, POST_DELETE, &mut out);
    }
    out
}

const PRE_INSTALL: &str = "pre-install";
const POST_INSTALL: &str = "post-install";
const PRE_DELETE: &str = "pre-delete";
const POST_DELETE: &str = "post-delete";

/// `KIND[.GROUP]/NAME[ in namespace NS]`: an object outside the release that something waits for.
pub fn external_name(external: &ExternalDependency) -> String {
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
    format!("{}{group}/{}{namespace}", external.kind, external.name)
}

fn write_externals(externals: &[ExternalDependency], pad: &str, out: &mut String) {
    for external in externals {
        let _ = writeln!(
            out,
            "{pad}waits for {} (outside the release, declared by {})",
            external_name(external),
            external.declared_by
        );
    }
}

/// `(chart template)`, where a hook comes from.
fn hook_origin(hook: &Hook) -> String {
    format!("({} {})", hook.resource.chart, hook.resource.template)
}

/// The hooks of one event, in the order they run, with the other events they run at too.
fn hook_stage(plan: &Plan, event: &str, out: &mut String) {
    let title = match event {
        PRE_INSTALL => "Pre-install hooks",
        POST_INSTALL => "Post-install hooks",
        PRE_DELETE => "Pre-delete hooks, before the uninstall steps",
        _ => "Post-delete hooks, after the uninstall steps",
    };
    let hooks: Vec<&Hook> = plan.hooks_at(event).collect();
    if hooks.is_empty() {
        let _ = writeln!(out, "{title}: none");
        return;
    }
    let _ = writeln!(
        out,
        "{title} (one at a time, by weight, each waited on until done):"
    );
    let ids: Vec<String> = hooks.iter().map(|h| h.resource.id()).collect();
    let width = ids.iter().map(String::len).max().unwrap_or(0);
    for (hook, id) in hooks.iter().zip(&ids) {
        let also: Vec<&str> = hook
            .events
            .iter()
            .map(String::as_str)
            .filter(|e| *e != event)
            .collect();
        let also = if also.is_empty() {
            String::new()
        } else {
            format!("  also {}", also.join(","))
        };
        let _ = writeln!(
            out,
            "  weight {:<4} {id:<width$}  {}{also}",
            hook.weight,
            hook_origin(hook)
        );
        write_externals(&hook.external, "    ", out);
    }
}

/// The hooks an install does not run (upgrade, rollback, delete and test hooks), each with its
/// events.
fn other_hooks(plan: &Plan, out: &mut String) {
    let hooks: Vec<&Hook> = plan
        .hooks
        .iter()
        .filter(|h| !h.runs_at(PRE_INSTALL) && !h.runs_at(POST_INSTALL))
        .collect();
    if hooks.is_empty() {
        return;
    }
    out.push_str("\nOther hooks (an install does not run them):\n");
    let events: Vec<String> = hooks.iter().map(|h| h.events.join(",")).collect();
    let ids: Vec<String> = hooks.iter().map(|h| h.resource.id()).collect();
    let events_width = events.iter().map(String::len).max().unwrap_or(0);
    let id_width = ids.iter().map(String::len).max().unwrap_or(0);
    for ((hook, events), id) in hooks.iter().zip(&events).zip(&ids) {
        let test = if hook.is_test() {
            "  never run by the operator (helm test)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {events:<events_width$}  weight {:<4} {id:<id_width$}  {}{test}",
            hook.weight,
            hook_origin(hook)
        );
    }
}

/// The node ids of the pre-install and post-install hook stages in dot and Mermaid.
const PRE_NODE: &str = "hooks_pre_install";
const POST_NODE: &str = "hooks_post_install";

/// The labels of the hook stages of an install, for the stages that have hooks.
struct InstallHooks {
    pre: Option<String>,
    post: Option<String>,
}

impl InstallHooks {
    fn of(plan: &Plan) -> Self {
        InstallHooks {
            pre: stage_label(plan, PRE_INSTALL),
            post: stage_label(plan, POST_INSTALL),
        }
    }

    /// The edges of the hook stages: to every layer of level 1 from the pre-install hooks, and
    /// from every layer nothing else waits on to the post-install hooks.
    fn edges(&self, plan: &Plan) -> Vec<(String, String)> {
        let mut edges = Vec::new();
        if self.pre.is_some() {
            for (i, layer) in plan.layers.iter().enumerate() {
                if layer.level == 1 {
                    edges.push((PRE_NODE.to_string(), format!("l{i}")));
                }
            }
        }
        if self.post.is_some() {
            let waited_on = waited_on(plan);
            for (i, waited) in waited_on.iter().enumerate() {
                if !waited {
                    edges.push((format!("l{i}"), POST_NODE.to_string()));
                }
            }
        }
        if plan.layers.is_empty() && self.pre.is_some() && self.post.is_some() {
            edges.push((PRE_NODE.to_string(), POST_NODE.to_string()));
        }
        edges
    }
}

/// `pre-install hooks`, how many, and the first few by name, one a line; None without hooks.
fn stage_label(plan: &Plan, event: &str) -> Option<String> {
    let hooks: Vec<&Hook> = plan.hooks_at(event).collect();
    if hooks.is_empty() {
        return None;
    }
    let mut label = format!("{event} hooks: {}", hooks.len());
    for hook in hooks.iter().take(LISTED) {
        label.push('\n');
        label.push_str(&hook.resource.id());
    }
    if hooks.len() > LISTED {
        let _ = write!(label, "\nand {} more", hooks.len() - LISTED);
    }
    Some(label)
}

/// For each layer, whether another layer waits for it, directly or through its chart.
fn waited_on(plan: &Plan) -> Vec<bool> {
    let mut waited = vec![false; plan.layers.len()];
    for layer in &plan.layers {
        for dependency in &layer.depends_on {
            if let Some(w) = waited.get_mut(dependency.layer) {
                *w = true;
            }
        }
        for chart in &layer.after_charts {
            for (i, other) in plan.layers.iter().enumerate() {
                if in_subtree(&other.chart, chart) {
                    waited[i] = true;
                }
            }
        }
    }
    waited
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
    let stages = InstallHooks::of(plan);
    if let Some(label) = &stages.pre {
        let _ = writeln!(
            out,
            "  {PRE_NODE} [label={}, fillcolor=\"#fff4e0\"];",
            quote_dot(label)
        );
    }
    if let Some(root) = plan.charts.first() {
        dot_cluster(plan, 0, root, 1, &mut out);
    }
    if let Some(label) = &stages.post {
        let _ = writeln!(
            out,
            "  {POST_NODE} [label={}, fillcolor=\"#fff4e0\"];",
            quote_dot(label)
        );
    }
    for (from, to) in stages.edges(plan) {
        let _ = writeln!(out, "  {from} -> {to};");
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
    let stages = InstallHooks::of(plan);
    if let Some(label) = &stages.pre {
        let _ = writeln!(out, "  {PRE_NODE}[{}]", quote_mermaid(label));
    }
    if let Some(root) = plan.charts.first() {
        mermaid_cluster(plan, 0, root, 1, &mut out);
    }
    if let Some(label) = &stages.post {
        let _ = writeln!(out, "  {POST_NODE}[{}]", quote_mermaid(label));
    }
    for (from, to) in stages.edges(plan) {
        let _ = writeln!(out, "  {from} --> {to}");
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
