//! Property tests of the planner on random graphs: every resource appears once, every
//! dependency precedes its dependent, and every cycle is reported as a real cycle.

use sequenced_testkit as support;

use std::collections::{BTreeMap, BTreeSet};

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use proptest::prelude::*;
use sequenced::plan::{self, Plan, Problem, kind_order};
use support::{chart_tree, object, rendered};
use tempfile::TempDir;

const KINDS: [&str; 6] = [
    "Deployment",
    "ConfigMap",
    "Service",
    "Widget",
    "Namespace",
    "StatefulSet",
];

/// A chart of `layers` named layers, `edges` (dependent, dependency), `sizes[i]` resources in
/// layer i and `plain` resources without annotations.
fn plan_graph(
    layers: usize,
    edges: &[(usize, usize)],
    sizes: &[usize],
    plain: usize,
) -> Result<Plan, plan::PlanError> {
    let dir = TempDir::new().expect("temp dir");
    let tree = chart_tree(
        dir.path(),
        &[("g", "apiVersion: v2\nname: g\nversion: 1.0.0\n")],
        &[],
    );
    let mut depends: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for &(from, to) in edges {
        depends.entry(from).or_default().push(format!("l{to}"));
    }
    let mut documents = Vec::new();
    let mut n = 0;
    for (layer, size) in sizes.iter().enumerate().take(layers) {
        for _ in 0..(*size).max(1) {
            let name = format!("l{layer}");
            let deps = depends
                .get(&layer)
                .map(|d| d.join(", "))
                .unwrap_or_default();
            let mut annotations = vec![("helm.sh/layer", name.as_str())];
            if !deps.is_empty() {
                annotations.push(("helm.sh/depends-on/layers", deps.as_str()));
            }
            documents.push((
                "g/templates/x.yaml",
                object(KINDS[n % KINDS.len()], &format!("r{n}"), &annotations),
            ));
            n += 1;
        }
    }
    for _ in 0..plain {
        documents.push((
            "g/templates/plain.yaml",
            object(KINDS[n % KINDS.len()], &format!("r{n}"), &[]),
        ));
        n += 1;
    }
    plan::plan(&tree, rendered(&tree, &documents))
}

/// Edges of a random DAG: each layer may depend on layers with a lower number.
fn dag() -> impl Strategy<Value = (usize, Vec<(usize, usize)>, Vec<usize>, usize)> {
    (1usize..24).prop_flat_map(|layers| {
        (
            Just(layers),
            proptest::collection::vec((0..layers, 0..layers), 0..layers * 2),
            proptest::collection::vec(1usize..4, layers),
            0usize..4,
        )
            .prop_map(|(layers, pairs, sizes, plain)| {
                let edges: BTreeSet<(usize, usize)> = pairs
                    .into_iter()
                    .filter(|(a, b)| a != b)
                    .map(|(a, b)| (a.max(b), a.min(b)))
                    .collect();
                (layers, edges.into_iter().collect(), sizes, plain)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn every_resource_once_and_every_dependency_first((layers, edges, sizes, plain) in dag()) {
        let plan = plan_graph(layers, &edges, &sizes, plain).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Every resource exactly once, in the resources and in exactly one layer.
        let total: usize = sizes.iter().map(|s| (*s).max(1)).sum::<usize>() + plain;
        prop_assert_eq!(plan.resources.len(), total);
        let names: BTreeSet<&str> = plan.resources.iter().map(|r| r.name.as_str()).collect();
        prop_assert_eq!(names.len(), total);
        let mut placed: Vec<usize> = plan.layers.iter().flat_map(|l| l.resources.iter().copied()).collect();
        placed.sort_unstable();
        prop_assert_eq!(placed, (0..total).collect::<Vec<_>>());
        // Every dependency precedes its dependent, in order and in level.
        let position = |name: String| plan.layers.iter().position(|l| l.name == name);
        for &(from, to) in &edges {
            let dependent = position(format!("l{from}")).expect("dependent layer");
            let dependency = position(format!("l{to}")).expect("dependency layer");
            prop_assert!(dependency < dependent);
            prop_assert!(plan.layers[dependency].level < plan.layers[dependent].level);
            prop_assert!(plan.layers[dependent].depends_on.iter().any(|d| d.layer == dependency));
            // And on uninstall, the dependent's objects are gone first.
            let step = |i: usize| plan.uninstall.iter().position(|s| s.name == plan.layers[i].name).expect("step");
            prop_assert!(step(dependent) < step(dependency));
            prop_assert!(plan.uninstall[step(dependency)].after.contains(&step(dependent)));
        }
        // The unannotated resources come after every layer.
        if plain > 0 {
            let last = plan.layers.last().expect("layers");
            prop_assert_eq!(last.name.as_str(), plan::DEFAULT_LAYER);
            prop_assert!(plan.layers.iter().all(|l| std::ptr::eq(l, last) || l.level < last.level));
        }
        // Inside a layer, kind order.
        for layer in &plan.layers {
            let keys: Vec<_> = layer.resources.iter()
                .map(|&r| kind_order::sort_key(&plan.resources[r].kind, kind_order::Direction::Install))
                .collect();
            prop_assert!(keys.windows(2).all(|w| w[0] <= w[1]));
        }
        // Levels are as low as the dependencies allow.
        for layer in &plan.layers {
            let expected = layer.depends_on.iter().map(|d| plan.layers[d.layer].level).max().unwrap_or(0) + 1;
            prop_assert_eq!(layer.level, expected);
        }
    }

    #[test]
    fn every_cycle_is_reported(
        layers in 1usize..12,
        pairs in proptest::collection::vec((0usize..12, 0usize..12), 0..30),
    ) {
        let edges: BTreeSet<(usize, usize)> = pairs
            .into_iter()
            .map(|(a, b)| (a % layers, b % layers))
            .collect();
        let edges: Vec<(usize, usize)> = edges.into_iter().collect();
        let mut graph: DiGraph<(), ()> = DiGraph::new();
        for _ in 0..layers {
            graph.add_node(());
        }
        for &(a, b) in &edges {
            graph.add_edge(NodeIndex::new(a), NodeIndex::new(b), ());
        }
        let cyclic_components = tarjan_scc(&graph)
            .into_iter()
            .filter(|c| c.len() > 1 || edges.contains(&(c[0].index(), c[0].index())))
            .count();
        let sizes = vec![1; layers];
        match plan_graph(layers, &edges, &sizes, 0) {
            Ok(_) => prop_assert_eq!(cyclic_components, 0),
            Err(e) => {
                let cycles: Vec<&str> = e.errors.iter()
                    .filter(|d| d.problem == Problem::Cycle)
                    .map(|d| d.message.as_str())
                    .collect();
                prop_assert_eq!(cycles.len(), cyclic_components, "{}", e);
                prop_assert_eq!(cycles.len(), e.errors.len(), "only cycles expected: {}", e);
                for message in cycles {
                    let path = message
                        .strip_prefix("layer cycle in chart g: ")
                        .and_then(|rest| rest.split(" (").next())
                        .expect("cycle message");
                    let nodes: Vec<usize> = path
                        .split(" -> ")
                        .map(|n| n.trim_start_matches('l').parse().expect("layer number"))
                        .collect();
                    prop_assert!(nodes.len() >= 2);
                    prop_assert_eq!(nodes.first(), nodes.last());
                    for pair in nodes.windows(2) {
                        prop_assert!(edges.contains(&(pair[0], pair[1])), "{} is not an edge of {:?}", message, edges);
                    }
                }
            }
        }
    }

    #[test]
    fn sibling_subcharts_follow_their_depends_on(
        count in 1usize..8,
        pairs in proptest::collection::vec((0usize..8, 0usize..8), 0..16),
    ) {
        let edges: BTreeSet<(usize, usize)> = pairs
            .into_iter()
            .map(|(a, b)| (a % count, b % count))
            .filter(|(a, b)| a != b)
            .map(|(a, b)| (a.max(b), a.min(b)))
            .collect();
        let mut root = String::from("apiVersion: v2\nname: top\nversion: 1.0.0\ndependencies:\n");
        for i in 0..count {
            let deps: Vec<String> = edges.iter().filter(|(a, _)| *a == i).map(|(_, b)| format!("s{b}")).collect();
            root.push_str(&format!("  - name: s{i}\n    version: 1.0.0\n    depends-on: [{}]\n", deps.join(", ")));
        }
        let dir = TempDir::new().expect("temp dir");
        let mut charts: Vec<(String, String)> = vec![("top".into(), root)];
        for i in 0..count {
            charts.push((format!("top/charts/s{i}"), format!("apiVersion: v2\nname: s{i}\nversion: 1.0.0\n")));
        }
        let refs: Vec<(&str, &str)> = charts.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let paths: Vec<String> = (0..count).map(|i| format!("top/s{i}")).collect();
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        let tree = chart_tree(dir.path(), &refs, &paths);
        let sources: Vec<String> = (0..count).map(|i| format!("top/charts/s{i}/templates/x.yaml")).collect();
        let documents: Vec<(&str, String)> = (0..count)
            .map(|i| (sources[i].as_str(), object("ConfigMap", &format!("c{i}"), &[])))
            .collect();
        let plan = plan::plan(&tree, rendered(&tree, &documents)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let level = |i: usize| plan.layers.iter().find(|l| l.chart == format!("top/s{i}")).expect("layer").level;
        for &(a, b) in &edges {
            prop_assert!(level(b) < level(a), "s{} must come before s{}", b, a);
        }
    }
}
