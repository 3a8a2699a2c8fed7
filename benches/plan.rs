//! Planning 10,000 resources in 500 layers across 20 subcharts (DESIGN.md target: under 50 ms).
//!
//! The chart tree is loaded from Chart.yaml files written to a temporary directory (every subchart
//! counted as rendered), and the rendered documents are built in memory, both outside the
//! measurement; what is measured is `sequenced::plan::plan` alone, the step a reconcile runs
//! after rendering.

use std::fmt::Write as _;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sequenced::plan;
use sequenced::render::{Document, Rendered};
use serde_json::json;

const SUBCHARTS: usize = 20;
const LAYERS_PER_CHART: usize = 25;
const RESOURCES_PER_LAYER: usize = 20;
const KINDS: [(&str, &str); 5] = [
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("v1", "Secret"),
    ("example.com/v1", "Widget"),
];

/// A top chart with 19 subcharts; each subchart depends on the one before it (a chain), and the
/// top chart's own resources wait for the last one.
fn tree(dir: &std::path::Path) -> sequenced::chart::ChartTree {
    let mut root = String::from("apiVersion: v2\nname: big\nversion: 1.0.0\n");
    root.push_str(&format!(
        "annotations:\n  helm.sh/depends-on/subcharts: s{}\ndependencies:\n",
        SUBCHARTS - 2
    ));
    for i in 0..SUBCHARTS - 1 {
        let _ = write!(root, "  - name: s{i}\n    version: 1.0.0\n");
        if i > 0 {
            let _ = writeln!(root, "    depends-on: [s{}]", i - 1);
        }
        let sub = dir.join(format!("big/charts/s{i}"));
        std::fs::create_dir_all(&sub).expect("mkdir");
        std::fs::write(
            sub.join("Chart.yaml"),
            format!("apiVersion: v2\nname: s{i}\nversion: 1.0.0\n"),
        )
        .expect("write");
    }
    std::fs::write(dir.join("big/Chart.yaml"), root).expect("write");
    let chart = sequenced::chart::load(&dir.join("big")).expect("load");
    // Every subchart renders documents.
    let rendered = (0..SUBCHARTS - 1).map(|i| format!("big/s{i}")).collect();
    sequenced::chart::tree(&chart, &rendered)
}

/// 25 layers per chart, 20 resources per layer; layer i depends on layers i-1 and i-3 (written
/// in both spellings), so the DAG has width and depth.
fn documents() -> Rendered {
    let mut resources = Vec::with_capacity(SUBCHARTS * LAYERS_PER_CHART * RESOURCES_PER_LAYER);
    for chart in 0..SUBCHARTS {
        let chart_path = if chart == SUBCHARTS - 1 {
            "big".to_string()
        } else {
            format!("big/s{chart}")
        };
        for layer in 0..LAYERS_PER_CHART {
            for r in 0..RESOURCES_PER_LAYER {
                let (api_version, kind) = KINDS[r % KINDS.len()];
                let mut annotations = serde_json::Map::new();
                annotations.insert("helm.sh/layer".into(), json!(format!("layer-{layer}")));
                if layer > 0 {
                    annotations.insert(
                        "helm.sh/depends-on/layers".into(),
                        json!(format!("[\"layer-{}\"]", layer - 1)),
                    );
                }
                if layer > 2 {
                    annotations.insert(
                        "helm.sh/depends-on/resource-groups".into(),
                        json!(format!("layer-{}", layer - 3)),
                    );
                }
                annotations.insert("example.com/owner".into(), json!("team-a"));
                let name = format!("c{chart}-l{layer}-r{r}");
                let object = json!({
                    "apiVersion": api_version,
                    "kind": kind,
                    "metadata": { "name": name, "annotations": annotations, "labels": {"app": "big"} },
                    "data": { "key": "value" },
                });
                resources.push(Document {
                    chart: chart_path.clone(),
                    template: format!("templates/layer-{layer}.yaml"),
                    source: String::new(),
                    object,
                    text: String::new(),
                });
            }
        }
    }
    Rendered {
        crds: Vec::new(),
        hooks: Vec::new(),
        resources,
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let tree = tree(dir.path());
    let rendered = documents();
    let planned = plan::plan(&tree, rendered.clone()).expect("plan");
    assert_eq!(planned.resources.len(), 10_000);
    assert_eq!(planned.layers.len(), 500);
    assert_eq!(planned.charts.len(), SUBCHARTS);
    c.bench_function("plan 10k resources, 500 layers, 20 charts", |b| {
        b.iter_batched(
            || rendered.clone(),
            |rendered| plan::plan(&tree, rendered).expect("plan"),
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
