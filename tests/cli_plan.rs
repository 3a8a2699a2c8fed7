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

/// A chart with hooks of every stage: a pre-install Job (weight -1) that waits for a Secret
/// outside the release, a ServiceAccount of both pre-install and post-install, a post-install
/// Job, a pre-delete Job and a test Pod, around two named layers and the default one.
fn hooked_chart() -> tempfile::TempDir {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let root = dir.path();
    support::chart(root, "hooked", "0.1.0", "");
    support::write(
        root,
        "templates/database.yaml",
        &support::object("ConfigMap", "db", &[("helm.sh/layer", "database")]),
    );
    support::write(
        root,
        "templates/app.yaml",
        &support::object(
            "ConfigMap",
            "app",
            &[
                ("helm.sh/layer", "app"),
                ("helm.sh/depends-on/layers", "database"),
            ],
        ),
    );
    let hook = |kind: &str, name: &str, annotations: &[(&str, &str)]| {
        support::write(
            root,
            &format!("templates/hook-{name}.yaml"),
            &support::object(kind, name, annotations),
        );
    };
    hook(
        "Job",
        "migrate",
        &[
            ("helm.sh/hook", "pre-install"),
            ("helm.sh/hook-weight", "-1"),
            (
                "creds.external-dependency.werf.io/resource",
                "secret/db-credentials",
            ),
        ],
    );
    hook(
        "ServiceAccount",
        "hooks",
        &[("helm.sh/hook", "pre-install,post-install")],
    );
    hook("Job", "smoke", &[("helm.sh/hook", "post-install")]);
    hook(
        "Job",
        "cleanup",
        &[
            ("helm.sh/hook", "pre-delete"),
            ("helm.sh/hook-delete-policy", "hook-succeeded"),
        ],
    );
    hook("Pod", "check", &[("helm.sh/hook", "test")]);
    dir
}

#[test]
fn template_prints_hooks_in_the_stage_of_an_install_that_runs_them() {
    let chart = hooked_chart();
    let stdout = stdout_of(&["template", chart.path().to_str().expect("utf-8 path")]);
    let marks: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("## ") || l.starts_with("# Runs again"))
        .collect();
    assert_eq!(
        marks,
        vec![
            "## STAGE: crds (0 documents)",
            "## STAGE: pre-install hooks (2 documents)",
            "## START hook: hooked Job/migrate  events pre-install  weight -1  delete policy before-hook-creation",
            "## END hook: hooked Job/migrate",
            "## START hook: hooked ServiceAccount/hooks  events pre-install,post-install  weight 0  delete policy before-hook-creation",
            "# Runs again at post-install, after the layers (printed only here).",
            "## END hook: hooked ServiceAccount/hooks",
            "## STAGE: resources (3 documents in 3 layers)",
            "## START layer: hooked database",
            "## END layer: hooked database",
            "## START layer: hooked app",
            "## END layer: hooked app",
            "## START layer: hooked (default)",
            "## END layer: hooked (default)",
            "## STAGE: post-install hooks (1 document)",
            "# Runs again here: hooked ServiceAccount/hooks (printed under pre-install hooks)",
            "## START hook: hooked Job/smoke  events post-install  weight 0  delete policy before-hook-creation",
            "## END hook: hooked Job/smoke",
            "## STAGE: other hooks (2 documents: upgrade, rollback, delete and test hooks; an install does not run them, and the operator never runs test hooks)",
            "## START hook: hooked Pod/check  events test  weight 0  delete policy before-hook-creation",
            "## END hook: hooked Pod/check",
            "## START hook: hooked Job/cleanup  events pre-delete  weight 0  delete policy hook-succeeded",
            "## END hook: hooked Job/cleanup",
        ],
        "{stdout}"
    );
    // The werf dependency of the pre-install Job is named inside its hook.
    let migrate = stdout
        .find("## START hook: hooked Job/migrate")
        .expect("migrate");
    let waits = stdout
        .find("# Waits for: secret/db-credentials\n")
        .expect("waits for");
    let end = stdout.find("## END hook: hooked Job/migrate").expect("end");
    assert!(migrate < waits && waits < end, "{stdout}");
    assert!(
        stdout.contains("# A test hook: run by `helm test`, never by the operator."),
        "{stdout}"
    );
    // Valid multi-document YAML, every object exactly once: kubectl apply -f takes it.
    let documents = sequenced::yaml::parse_documents(&stdout).expect("valid YAML");
    let mut objects: Vec<String> = documents
        .iter()
        .filter(|d| d.is_object())
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    objects.sort();
    assert_eq!(
        objects,
        vec![
            "ConfigMap/app",
            "ConfigMap/db",
            "ConfigMap/hooked-hooked-hooked",
            "Job/cleanup",
            "Job/migrate",
            "Job/smoke",
            "Pod/check",
            "ServiceAccount/hooks",
        ]
    );
}

#[test]
fn graph_text_shows_hooks_where_they_run() {
    let chart = hooked_chart();
    let stdout = stdout_of(&["graph", chart.path().to_str().expect("utf-8 path")]);
    let expected = "
CRDs: none
Pre-install hooks (one at a time, by weight, each waited on until done):
  weight -1   Job/migrate           (hooked templates/hook-migrate.yaml)
    waits for secret/db-credentials (outside the release, declared by Job/migrate)
  weight 0    ServiceAccount/hooks  (hooked templates/hook-hooks.yaml)  also post-install

Level 1 (starts at once)
  hooked database      1 resource  ConfigMap/db
Level 2
  hooked app           1 resource  ConfigMap/app
    after hooked database
Level 3
  hooked (default)     1 resource  ConfigMap/hooked-hooked-hooked
    after hooked app

Post-install hooks (one at a time, by weight, each waited on until done):
  weight 0    ServiceAccount/hooks  (hooked templates/hook-hooks.yaml)  also pre-install
  weight 0    Job/smoke             (hooked templates/hook-smoke.yaml)

Other hooks (an install does not run them):
  test        weight 0    Pod/check    (hooked templates/hook-check.yaml)  never run by the operator (helm test)
  pre-delete  weight 0    Job/cleanup  (hooked templates/hook-cleanup.yaml)

Pre-delete hooks, before the uninstall steps (one at a time, by weight, each waited on until done):
  weight 0    Job/cleanup  (hooked templates/hook-cleanup.yaml)

Uninstall, in this order (CRDs are kept):
   1. hooked (default)  1 resource
   2. hooked app        1 resource
   3. hooked database   1 resource
";
    assert!(stdout.contains(expected), "{stdout}");
}

#[test]
fn graph_dot_and_mermaid_show_the_install_hook_stages() {
    let chart = hooked_chart();
    let path = chart.path().to_str().expect("utf-8 path");
    let dot = stdout_of(&["graph", path, "--format", "dot"]);
    for line in [
        "  hooks_pre_install [label=\"pre-install hooks: 2\\nJob/migrate\\nServiceAccount/hooks\", fillcolor=\"#fff4e0\"];",
        "  hooks_post_install [label=\"post-install hooks: 2\\nServiceAccount/hooks\\nJob/smoke\", fillcolor=\"#fff4e0\"];",
        // To the one layer of level 1, from the one layer nothing waits on.
        "  hooks_pre_install -> l0;\n  l2 -> hooks_post_install;\n",
    ] {
        assert!(dot.contains(line), "missing {line:?} in:\n{dot}");
    }
    assert_eq!(dot.matches("hooks_pre_install ->").count(), 1, "{dot}");
    assert_eq!(dot.matches("-> hooks_post_install").count(), 1, "{dot}");
    let mermaid = stdout_of(&["graph", path, "--format", "mermaid"]);
    for line in [
        "  hooks_pre_install[\"pre-install hooks: 2<br/>Job/migrate<br/>ServiceAccount/hooks\"]",
        "  hooks_pre_install --> l0\n  l2 --> hooks_post_install\n",
    ] {
        assert!(mermaid.contains(line), "missing {line:?} in:\n{mermaid}");
    }
    // A chart without hooks has no hook nodes.
    let dot = stdout_of(&["graph", "examples/foo", "--format", "dot"]);
    assert!(!dot.contains("hooks_"), "{dot}");
}
