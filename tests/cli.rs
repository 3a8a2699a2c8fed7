//! The `sequenced` command line as a user runs it: output, exit codes and one-line errors.

use sequenced_testkit as support;

use std::path::Path;
use std::process::{Command, Output};

use support::{chart, write};
use tempfile::TempDir;

fn sequenced(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(args)
        .env("SEQUENCED_HELM", support::helm())
        .env(
            "SEQUENCED_CACHE_DIR",
            std::env::temp_dir().join("sequenced-cli-test-cache"),
        )
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sequenced")
}

/// Runs a command that must fail with exit code 2 and a single error line; returns that line.
fn one_line_error(args: &[&str]) -> String {
    let output = sequenced(args);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?} printed to stdout");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?} should print one line: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr.trim_end().to_string()
}

/// Runs a command on which helm fails: exit code 2, the chart named on the first line, then
/// Helm's own message whole, which must hold `helm_says`.
fn helm_error(args: &[&str], chart: &str, helm_says: &str) -> String {
    let output = sequenced(args);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?} printed to stdout");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: rendering chart {chart}: helm template failed (exit code 1): "
        )),
        "{stderr}"
    );
    assert!(stderr.contains(helm_says), "{helm_says:?} in {stderr}");
    stderr
}

#[test]
fn template_prints_every_document_with_its_chart_path_and_file() {
    let output = sequenced(&["template", "examples/foo"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in [
        "# Chart: foo  File: templates/foo.yaml  Resource: ConfigMap/foo-foo",
        "# Chart: foo/bar  File: templates/bar.yaml  Resource: Deployment/foo-bar",
        "# Chart: foo/nginx  File: templates/nginx.yaml  Resource: Service/foo-nginx",
        "# Chart: foo/rabbitmq  File: templates/rabbitmq.yaml  Resource: Deployment/foo-rabbitmq",
        "## STAGE: crds (0 documents)",
        "## STAGE: resources (8 documents in 4 layers)",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    // Still valid multi-document YAML: 8 objects.
    let documents = sequenced::yaml::parse_documents(&stdout).expect("valid YAML");
    let objects = documents.iter().filter(|d| d.is_object()).count();
    assert_eq!(objects, 8);
}

#[test]
fn template_takes_values_files_set_namespace_and_release_name() {
    let dir = TempDir::new().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "bar:\n  enabled: false\n").unwrap();
    let output = sequenced(&[
        "template",
        "examples/foo",
        "-f",
        values.to_str().unwrap(),
        "--set",
        "image=busybox",
        "--namespace",
        "prod",
        "--release-name",
        "web",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("release web in namespace prod"), "{stdout}");
    assert!(
        stdout.contains("# Not rendered: foo/bar (condition bar.enabled)"),
        "{stdout}"
    );
    assert!(!stdout.contains("# Chart: foo/bar "), "{stdout}");
    assert!(stdout.contains("Resource: Deployment/web-foo"), "{stdout}");
    assert!(stdout.contains("image: busybox"), "{stdout}");
}

#[test]
fn set_json_and_set_literal_count_like_in_helm() {
    let output = sequenced(&[
        "template",
        "examples/foo",
        "--set-json",
        r#"bar={"enabled":false}"#,
        "--set-literal",
        "image=registry.k8s.io/pause:3.10,debug",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("# Not rendered: foo/bar (condition bar.enabled)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("image: registry.k8s.io/pause:3.10,debug"),
        "{stdout}"
    );
}

#[test]
fn crd_prints_the_crd() {
    let output = sequenced(&["crd"]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("name: sequencedreleases.sequenced.dev"));
}

#[test]
fn every_command_has_help() {
    for command in ["run", "template", "graph", "lint", "crd", "status", "ready"] {
        let output = sequenced(&[command, "--help"]);
        assert!(output.status.success(), "{command} --help");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("Usage: sequenced"), "{command}: {stdout}");
        assert!(
            stdout.len() > 200,
            "{command} --help is too short: {stdout}"
        );
    }
    let output = sequenced(&["--help"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for command in ["run", "template", "graph", "lint", "crd", "status", "ready"] {
        assert!(
            stdout.contains(&format!("  {command} ")),
            "{command} missing in --help"
        );
    }
}

#[test]
fn a_path_that_does_not_exist() {
    assert_eq!(
        one_line_error(&["template", "examples/nope"]),
        "error: chart examples/nope: no such file or directory"
    );
}

#[test]
fn a_directory_that_is_not_a_chart() {
    assert_eq!(
        one_line_error(&["template", "src"]),
        "error: src is not a chart: the directory has no Chart.yaml"
    );
}

#[test]
fn a_corrupt_archive() {
    // Read before helm is run (an archive is checked against the loader's limits first), so
    // the loader names what is wrong.
    let dir = TempDir::new().unwrap();
    let garbage = dir.path().join("broken.tgz");
    std::fs::write(&garbage, b"this is not a chart").unwrap();
    let path = garbage.to_str().unwrap();
    assert_eq!(
        one_line_error(&["template", path]),
        format!(
            "error: chart archive {path}: not a packaged chart: the file is not gzip-compressed \
             (expected a .tgz made by helm package)"
        )
    );
    // Truncated gzip.
    let truncated = dir.path().join("truncated.tgz");
    let bytes = std::fs::read(support::package(Path::new("examples/shop"), dir.path())).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let path = truncated.to_str().unwrap();
    let error = one_line_error(&["template", path]);
    assert!(
        error.starts_with(&format!("error: chart archive {path}: corrupt archive: ")),
        "{error}"
    );
}

#[test]
fn a_chart_yaml_that_is_not_yaml() {
    let dir = TempDir::new().unwrap();
    write(dir.path(), "Chart.yaml", "apiVersion: v2\nname: [broken\n");
    let path = dir.path().to_str().unwrap();
    helm_error(
        &["template", path],
        path,
        "cannot load Chart.yaml: error converting YAML to JSON: yaml: line 2",
    );
}

#[test]
fn a_subchart_chart_yaml_with_a_wrong_field() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "foo", "0.1.0", "");
    write(
        &dir.path().join("charts/bar"),
        "Chart.yaml",
        "apiVersion: v2\nname: bar\nversion: 0.1.0\nannotations:\n  helm.sh/depends-on/subcharts: [a, b]\n",
    );
    let path = dir.path().to_str().unwrap();
    helm_error(
        &["template", path],
        path,
        "error unpacking subchart bar in foo: cannot load Chart.yaml",
    );
}

#[test]
fn two_dependencies_with_the_same_name_or_alias() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: redis\n  version: 1.0.0\n  alias: cache\n- name: cache\n  version: 1.0.0\n",
    );
    let path = dir.path().to_str().unwrap();
    helm_error(
        &["template", path],
        path,
        "more than one dependency with name or alias \"cache\"",
    );
}

#[test]
fn a_values_file_that_is_not_yaml() {
    let dir = TempDir::new().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "image: {tag: [\n").unwrap();
    let line = one_line_error(&["template", "examples/shop", "-f", values.to_str().unwrap()]);
    assert!(
        line.starts_with(&format!(
            "error: {}: invalid YAML at line",
            values.display()
        )),
        "{line}"
    );
    std::fs::write(&values, "- a list\n").unwrap();
    let line = one_line_error(&["template", "examples/shop", "-f", values.to_str().unwrap()]);
    assert_eq!(
        line,
        format!(
            "error: {}: document 1 is a list, but values must be a mapping of keys to values",
            values.display()
        )
    );
    let missing = dir.path().join("missing.yaml");
    let line = one_line_error(&["template", "examples/shop", "-f", missing.to_str().unwrap()]);
    assert_eq!(
        line,
        format!("error: {}: no such file or directory", missing.display())
    );
}

#[test]
fn a_chart_values_yaml_that_is_not_yaml() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "foo", "0.1.0", "");
    write(dir.path(), "values.yaml", "a: b: c\n");
    let path = dir.path().to_str().unwrap();
    helm_error(&["template", path], path, "cannot load values.yaml");
}

#[test]
fn an_unreachable_chart_repository() {
    let output = sequenced(&[
        "template",
        "demo",
        "--repo",
        "http://127.0.0.1:9/charts",
        "--version",
        "^1",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: chart repository http://127.0.0.1:9/charts: helm pull demo --version ^1 failed (exit code 1): "
        ),
        "{stderr}"
    );
    assert!(stderr.contains("cannot be reached"), "{stderr}");
}

#[test]
fn a_missing_dependency() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: nginx\n  version: 18.3.1\n",
    );
    let path = dir.path().to_str().unwrap();
    helm_error(
        &["template", path],
        path,
        "found in Chart.yaml, but missing in charts/ directory: nginx",
    );
}

#[test]
fn a_bad_set_flag() {
    helm_error(
        &["template", "examples/shop", "--set", "a.b"],
        "examples/shop",
        "failed parsing --set data: key \"b\" has no value",
    );
}

#[test]
fn no_helm_at_all() {
    let output = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(["template", "examples/shop"])
        .env_remove("SEQUENCED_HELM")
        .env("PATH", "")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error: helm not found: install Helm 4"),
        "{stderr}"
    );
    assert!(stderr.contains("SEQUENCED_HELM"), "{stderr}");
}

#[test]
fn helm_errors_are_passed_on_whole() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "foo", "0.1.0", "");
    write(
        dir.path(),
        "templates/bad.yaml",
        "{{ .Values.missing.field }}\n",
    );
    let output = sequenced(&["template", dir.path().to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let chart = dir.path().display();
    assert!(
        stderr.starts_with(&format!(
            "error: rendering chart {chart}: helm template failed (exit code 1): \
             foo/templates/bad.yaml:1:10 executing \"foo/templates/bad.yaml\" at <.Values.missing.field>: nil pointer evaluating interface {{}}.field\n"
        )),
        "the reason on the first line: {stderr}"
    );
    // Helm's own message, line for line.
    assert!(
        stderr.contains(
            "\nError: foo/templates/bad.yaml:1:10\n  executing \"foo/templates/bad.yaml\" at <.Values.missing.field>:\n    nil pointer evaluating interface {}.field\n\nUse --debug flag to render out invalid YAML\n"
        ),
        "{stderr}"
    );
}

#[test]
fn run_without_a_cluster_says_so_in_one_line() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .arg("run")
        .env("SEQUENCED_HELM", support::helm())
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .expect("run sequenced");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: no cluster to talk to (kubeconfig or in-cluster config)"),
        "{stderr}"
    );
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
}

#[test]
fn run_refuses_a_bad_metrics_address() {
    let line = one_line_error(&["run", "--metrics-addr", "localhost"]);
    assert!(
        line.contains("--metrics-addr \"localhost\": not a HOST:PORT address"),
        "{line}"
    );
}
