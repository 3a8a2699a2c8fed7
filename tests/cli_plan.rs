//! `sequenced template`, `graph` and `lint` on the seed's examples and on bad charts, as a chart
//! author runs them.

use sequenced_testkit as support;

use std::process::{Command, Output};

fn sequenced(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(args)
        .env("SEQUENCED_HELM", support::helm())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sequenced")
}

fn stdout_of(args: &[&str]) -> String {
    let output = sequenced(args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn layer_lines(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("## START layer:") || l.starts_with("## END layer:"))
        .collect()
}

#[test]
fn template_prints_the_seed_layers_example_in_deploy_order() {
    let stdout = stdout_of(&["template", "examples/shop"]);
    assert_eq!(
        layer_lines(&stdout),
        vec![
            "## START layer: shop database",
            "## END layer: shop database",
            "## START layer: shop queue",
            "## END layer: shop queue",
            "## START layer: shop app",
            "## END layer: shop app",
        ]
    );
    assert!(
        stdout.contains("# After: shop database, shop queue"),
        "{stdout}"
    );
    // The dependency annotation has two '/', which a real API server rejects: it is not printed.
    assert!(!stdout.contains("helm.sh/depends-on/layers"), "{stdout}");
    assert!(stdout.contains("helm.sh/layer: app"), "{stdout}");
    // Still valid multi-document YAML with every object.
    let documents = sequenced::yaml::parse_documents(&stdout).expect("valid YAML");
    assert_eq!(documents.iter().filter(|d| d.is_object()).count(), 6);
    // Inside the database layer, the Service comes before the Deployment (kind order).
    let service = stdout
        .find("Resource: Service/db-service")
        .expect("service");
    let deployment = stdout.find("Resource: Deployment/db").expect("deployment");
    assert!(service < deployment);
}

#[test]
fn template_prints_the_seed_subchart_example_in_deploy_order() {
    let stdout = stdout_of(&["template", "examples/foo"]);
    assert_eq!(
        layer_lines(&stdout),
        vec![
            "## START layer: foo/nginx (default)",
            "## END layer: foo/nginx (default)",
            "## START layer: foo/rabbitmq (default)",
            "## END layer: foo/rabbitmq (default)",
            "## START layer: foo/bar (default)",
            "## END layer: foo/bar (default)",
            "## START layer: foo (default)",
            "## END layer: foo (default)",
        ]
    );
    assert!(
        stdout.contains("# After: chart foo/bar, chart foo/rabbitmq"),
        "{stdout}"
    );
    let stdout = stdout_of(&["template", "examples/foo", "--set", "bar.enabled=false"]);
    assert!(!stdout.contains("layer: foo/bar"), "{stdout}");
    assert!(stdout.contains("# After: chart foo/rabbitmq\n"), "{stdout}");
}

#[test]
fn graph_text_shows_the_levels() {
    let stdout = stdout_of(&["graph", "examples/foo"]);
    let expected = "\
Level 1 (starts at once)
  foo/nginx       2 resources  Service/foo-nginx, Deployment/foo-nginx
  foo/rabbitmq    2 resources  Service/foo-rabbitmq, Deployment/foo-rabbitmq
Level 2
  foo/bar         2 resources  Service/foo-bar, Deployment/foo-bar
    after all of chart foo/nginx, all of chart foo/rabbitmq
Level 3
  foo             2 resources  ConfigMap/foo-foo, Deployment/foo-foo
    after all of chart foo/bar, all of chart foo/rabbitmq
";
    assert!(stdout.contains(expected), "{stdout}");
    assert!(stdout.starts_with("Chart foo 0.1.0: 8 resources, 4 layers, 3 levels in 4 charts"));
}

#[test]
fn graph_dot_has_clusters_for_charts_and_renders() {
    let stdout = stdout_of(&["graph", "examples/foo", "--format", "dot"]);
    for line in [
        "digraph \"foo\" {",
        "subgraph cluster_0 {",
        "label=\"foo/bar 0.1.0\";",
        "[label=\"2 resources\"];",
        "lhead=cluster_1",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    assert_eq!(stdout.matches('{').count(), stdout.matches('}').count());
    // When Graphviz is installed, it must accept the output.
    if let Ok(mut dot) = Command::new("dot")
        .arg("-Tsvg")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        dot.stdin
            .take()
            .expect("stdin")
            .write_all(stdout.as_bytes())
            .expect("write");
        let output = dot.wait_with_output().expect("dot");
        assert!(
            output.status.success(),
            "dot rejected it: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(String::from_utf8_lossy(&output.stdout).contains("<svg"));
    }
}

#[test]
fn graph_mermaid_has_subgraphs_and_edges() {
    let stdout = stdout_of(&["graph", "examples/shop", "--format", "mermaid"]);
    assert_eq!(
        stdout,
        "flowchart TB
  subgraph c0[\"shop 0.1.0\"]
    l0[\"database<br/>2 resources\"]
    l1[\"queue<br/>2 resources\"]
    l2[\"app<br/>2 resources\"]
  end
  l0 --> l2
  l1 --> l2
"
    );
    let stdout = stdout_of(&["graph", "examples/foo", "--format", "mermaid"]);
    for line in [
        "  c2 ==> c1",
        "  c3 ==> c1",
        "  c1 ==> l3",
        "  c3 ==> l3",
        "    subgraph c1[\"foo/bar 0.1.0\"]",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
}

#[test]
fn lint_passes_the_examples() {
    for chart in ["examples/shop", "examples/foo"] {
        let output = sequenced(&["lint", chart]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{stdout}");
        assert!(stdout.contains("OK: 0 errors, 0 warnings"), "{stdout}");
    }
}

#[test]
fn lint_reports_a_chart_that_does_not_render_as_an_error() {
    let output = sequenced(&["lint", "examples/does-not-exist"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("[ERROR] "), "{stdout}");
    assert!(stdout.contains("examples/does-not-exist"), "{stdout}");
}

#[test]
fn template_and_graph_refuse_a_chart_that_cannot_be_planned() {
    for command in ["template", "graph"] {
        let output = sequenced(&[command, "tests/plan-corpus/layer-cycle"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(output.stdout.is_empty());
        assert_eq!(
            stderr.trim_end(),
            "error: layer cycle in chart cyclic: app -> queue -> app (templates/app.yaml ConfigMap/app: app depends on queue; templates/queue.yaml ConfigMap/queue: queue depends on app)"
        );
    }
}
