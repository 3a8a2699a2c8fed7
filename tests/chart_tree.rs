//! The chart tree: nested subcharts (directories and .tgz), aliases, conditions and tags, missing
//! dependencies. Every case is also rendered by the real helm, and the charts sequenced considers
//! enabled must be exactly the charts helm rendered.

use sequenced_testkit as support;

use std::collections::BTreeSet;
use std::path::Path;

use sequenced::chart::{self, ChartError, ValueOptions};
use support::{chart, helm_chart_paths, package, tar_gz, write};
use tempfile::TempDir;

/// The enabled chart paths, by sequenced, for these `--set` flags.
fn ours(path: &Path, set: &[&str]) -> BTreeSet<String> {
    let loaded = chart::load(path).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let values = ValueOptions {
        set: set.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
    .merge()
    .expect("values");
    let tree = chart::resolve(&loaded, &values).unwrap_or_else(|e| panic!("resolve: {e}"));
    tree.charts().iter().map(|c| c.path.clone()).collect()
}

/// Asserts sequenced and helm agree, and that the result is `expected`.
fn check(path: &Path, set: &[&str], expected: &[&str]) {
    let mut helm_args = Vec::new();
    for s in set {
        helm_args.push("--set");
        helm_args.push(s);
    }
    let by_helm = helm_chart_paths(path, &helm_args);
    let by_us = ours(path, set);
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        by_us, by_helm,
        "sequenced and helm disagree for --set {set:?}"
    );
    assert_eq!(by_us, expected, "unexpected charts for --set {set:?}");
}

fn nested(dir: &Path) {
    chart(
        dir,
        "foo",
        "1.0.0",
        "dependencies:\n- name: bar\n  version: 0.1.0\n",
    );
    chart(
        &dir.join("charts/bar"),
        "bar",
        "0.1.0",
        "dependencies:\n- name: baz\n  version: '>=0.1.0'\n",
    );
    chart(&dir.join("charts/bar/charts/baz"), "baz", "0.2.0", "");
}

#[test]
fn nested_directories_give_chart_paths_at_every_depth() {
    let dir = TempDir::new().unwrap();
    nested(dir.path());
    check(dir.path(), &[], &["foo", "foo/bar", "foo/bar/baz"]);
    let loaded = chart::load(dir.path()).unwrap();
    let tree = chart::resolve(&loaded, &Default::default()).unwrap();
    let baz = tree.find("foo/bar/baz").expect("foo/bar/baz");
    assert_eq!(baz.metadata.version, "0.2.0");
    assert_eq!(baz.dependency.as_ref().unwrap().version, ">=0.1.0");
    assert!(tree.find("foo/baz").is_none());
}

#[test]
fn packaged_subcharts_nested_in_packaged_charts() {
    let dir = TempDir::new().unwrap();
    let sources = dir.path().join("src");
    nested(&sources.join("foo"));
    // baz as a .tgz inside bar, bar as a .tgz inside foo, foo itself packaged.
    tar_gz(
        &sources.join("foo/charts/bar/charts/baz"),
        "baz",
        &sources.join("foo/charts/bar/charts/baz-0.2.0.tgz"),
    );
    std::fs::remove_dir_all(sources.join("foo/charts/bar/charts/baz")).unwrap();
    tar_gz(
        &sources.join("foo/charts/bar"),
        "bar",
        &sources.join("foo/charts/bar-0.1.0.tgz"),
    );
    std::fs::remove_dir_all(sources.join("foo/charts/bar")).unwrap();
    check(
        &sources.join("foo"),
        &[],
        &["foo", "foo/bar", "foo/bar/baz"],
    );
    let archive = dir.path().join("foo-1.0.0.tgz");
    tar_gz(&sources.join("foo"), "foo", &archive);
    check(&archive, &[], &["foo", "foo/bar", "foo/bar/baz"]);
    let loaded = chart::load(&archive).unwrap();
    assert_eq!(loaded.metadata.name, "foo");
    assert_eq!(loaded.subcharts[0].subcharts[0].metadata.name, "baz");
    let location = loaded.subcharts[0].subcharts[0].location.to_string();
    assert!(
        location.ends_with("foo-1.0.0.tgz:charts/bar-0.1.0.tgz:charts/baz-0.2.0.tgz"),
        "{location}"
    );
    // helm package expands packaged subcharts into directories; that archive loads too.
    let packaged = package(&sources.join("foo"), &dir.path().join("packaged"));
    check(&packaged, &[], &["foo", "foo/bar", "foo/bar/baz"]);
}

#[test]
fn aliases_rename_subcharts_and_may_use_one_chart_twice() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "shop",
        "1.0.0",
        "dependencies:\n- name: cache\n  version: 1.x\n  alias: sessions\n- name: cache\n  version: ^1.0.0\n  alias: pages\n  condition: pages.enabled\n",
    );
    chart(&dir.path().join("charts/cache"), "cache", "1.2.0", "");
    check(dir.path(), &[], &["shop", "shop/pages", "shop/sessions"]);
    check(
        dir.path(),
        &["pages.enabled=false"],
        &["shop", "shop/sessions"],
    );
    let loaded = chart::load(dir.path()).unwrap();
    let tree = chart::resolve(&loaded, &Default::default()).unwrap();
    let sessions = tree.find("shop/sessions").unwrap();
    assert_eq!(sessions.name, "sessions");
    assert_eq!(sessions.metadata.name, "cache");
    assert_eq!(
        sessions.dependency.as_ref().unwrap().alias.as_deref(),
        Some("sessions")
    );
}

#[test]
fn a_subchart_whose_version_does_not_match_keeps_its_own_name() {
    // Helm quirk: the entry does not match, so the alias is not applied and the chart stays.
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "app",
        "1.0.0",
        "dependencies:\n- name: db\n  version: ^2.0.0\n  alias: database\n",
    );
    chart(&dir.path().join("charts/db"), "db", "1.0.0", "");
    check(dir.path(), &[], &["app", "app/db"]);
}

fn conditional(dir: &Path) {
    chart(
        dir,
        "foo",
        "0.1.0",
        "dependencies:\n\
         - name: bar\n  version: 0.1.0\n  condition: bar.enabled,global.bar.enabled\n\
         - name: web\n  version: 0.1.0\n  tags: [front-end, web]\n\
         - name: api\n  version: 0.1.0\n  tags: [back-end]\n  condition: api.enabled\n\
         - name: quiet\n  version: 0.1.0\n  condition: quiet.enabled\n\
         - name: odd\n  version: 0.1.0\n  condition: odd.enabled\n",
    );
    write(dir, "values.yaml", "odd:\n  enabled: \"no\"\n");
    chart(&dir.join("charts/bar"), "bar", "0.1.0", "");
    chart(&dir.join("charts/web"), "web", "0.1.0", "");
    chart(&dir.join("charts/api"), "api", "0.1.0", "");
    // Disabled by its own default values.
    chart(&dir.join("charts/quiet"), "quiet", "0.1.0", "");
    write(&dir.join("charts/quiet"), "values.yaml", "enabled: false\n");
    chart(&dir.join("charts/odd"), "odd", "0.1.0", "");
}

#[test]
fn conditions_decide_from_merged_values() {
    let dir = TempDir::new().unwrap();
    conditional(dir.path());
    let all = ["foo", "foo/api", "foo/bar", "foo/odd", "foo/web"];
    check(dir.path(), &[], &all);
    check(
        dir.path(),
        &["bar.enabled=false"],
        &["foo", "foo/api", "foo/odd", "foo/web"],
    );
    // The first path that holds a boolean decides.
    check(
        dir.path(),
        &["bar.enabled=true,global.bar.enabled=false"],
        &all,
    );
    check(
        dir.path(),
        &["quiet.enabled=true"],
        &[
            "foo",
            "foo/api",
            "foo/bar",
            "foo/odd",
            "foo/quiet",
            "foo/web",
        ],
    );
    // A condition that is not a boolean is ignored (values.yaml has odd.enabled: "no").
    check(
        dir.path(),
        &["odd.enabled=false"],
        &["foo", "foo/api", "foo/bar", "foo/web"],
    );
}

#[test]
fn helm_does_not_trim_the_second_condition_path() {
    let dir = TempDir::new().unwrap();
    conditional(dir.path());
    // `bar.enabled,global.bar.enabled` splits into two paths; a global false disables bar...
    check(
        dir.path(),
        &["global.bar.enabled=false"],
        &["foo", "foo/api", "foo/odd", "foo/web"],
    );
    // ...but with a space after the comma Helm looks up " global.bar.enabled", which never exists.
    let text = std::fs::read_to_string(dir.path().join("Chart.yaml")).unwrap();
    write(
        dir.path(),
        "Chart.yaml",
        &text.replace(
            "bar.enabled,global.bar.enabled",
            "bar.enabled, global.bar.enabled",
        ),
    );
    check(
        dir.path(),
        &["global.bar.enabled=false"],
        &["foo", "foo/api", "foo/bar", "foo/odd", "foo/web"],
    );
}

#[test]
fn tags_disable_and_conditions_override_tags() {
    let dir = TempDir::new().unwrap();
    conditional(dir.path());
    check(
        dir.path(),
        &["tags.front-end=false"],
        &["foo", "foo/api", "foo/bar", "foo/odd"],
    );
    // One true tag keeps the chart.
    check(
        dir.path(),
        &["tags.front-end=false,tags.web=true"],
        &["foo", "foo/api", "foo/bar", "foo/odd", "foo/web"],
    );
    check(
        dir.path(),
        &["tags.back-end=false"],
        &["foo", "foo/bar", "foo/odd", "foo/web"],
    );
    check(
        dir.path(),
        &["tags.back-end=false,api.enabled=true"],
        &["foo", "foo/api", "foo/bar", "foo/odd", "foo/web"],
    );
}

#[test]
fn disabled_dependencies_say_why() {
    let dir = TempDir::new().unwrap();
    conditional(dir.path());
    let loaded = chart::load(dir.path()).unwrap();
    let values = ValueOptions {
        set: vec!["bar.enabled=false,tags.front-end=false".into()],
        ..Default::default()
    }
    .merge()
    .unwrap();
    let tree = chart::resolve(&loaded, &values).unwrap();
    let reasons: Vec<(String, String)> = tree
        .root
        .disabled
        .iter()
        .map(|d| (d.dependency.effective_name().to_string(), d.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (
                "bar".to_string(),
                "condition bar.enabled is false".to_string()
            ),
            ("web".to_string(), "tags front-end are false".to_string()),
            (
                "quiet".to_string(),
                "condition quiet.enabled is false".to_string()
            ),
        ]
    );
}

#[test]
fn nested_conditions_are_paths_below_the_subchart() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "top",
        "0.1.0",
        "dependencies:\n- name: mid\n  version: 0.1.0\n  alias: middle\n",
    );
    chart(
        &dir.path().join("charts/mid"),
        "mid",
        "0.1.0",
        "dependencies:\n- name: leaf\n  version: 0.1.0\n  condition: leaf.enabled\n",
    );
    chart(
        &dir.path().join("charts/mid/charts/leaf"),
        "leaf",
        "0.1.0",
        "",
    );
    check(dir.path(), &[], &["top", "top/middle", "top/middle/leaf"]);
    check(
        dir.path(),
        &["middle.leaf.enabled=false"],
        &["top", "top/middle"],
    );
    check(
        dir.path(),
        &["leaf.enabled=false"],
        &["top", "top/middle", "top/middle/leaf"],
    );
}

#[test]
fn a_chart_without_dependencies_keeps_every_subchart() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "plain", "0.1.0", "");
    chart(&dir.path().join("charts/extra"), "extra", "0.1.0", "");
    write(&dir.path().join("charts"), "README.md.prov", "signature\n");
    std::fs::create_dir_all(dir.path().join("charts/_ignored")).unwrap();
    write(
        &dir.path().join("charts/.hidden"),
        "Chart.yaml",
        "not: a chart\n",
    );
    check(dir.path(), &[], &["plain", "plain/extra"]);
}

#[test]
fn helmignore_can_leave_a_subchart_out() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "app", "0.1.0", "");
    chart(&dir.path().join("charts/kept"), "kept", "0.1.0", "");
    chart(&dir.path().join("charts/skipped"), "skipped", "0.1.0", "");
    write(dir.path(), ".helmignore", "# not shipped\nskipped/\n");
    check(dir.path(), &[], &["app", "app/kept"]);
}

#[test]
fn the_examples_resolve_as_the_seed_describes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    check(&root.join("examples/shop"), &[], &["shop"]);
    check(
        &root.join("examples/foo"),
        &[],
        &["foo", "foo/bar", "foo/nginx", "foo/rabbitmq"],
    );
    check(
        &root.join("examples/foo"),
        &["bar.enabled=false"],
        &["foo", "foo/nginx", "foo/rabbitmq"],
    );
    let loaded = chart::load(&root.join("examples/foo")).unwrap();
    let tree = chart::resolve(&loaded, &Default::default()).unwrap();
    let bar = tree.find("foo/bar").unwrap();
    assert_eq!(
        bar.dependency.as_ref().unwrap().depends_on,
        vec!["nginx", "rabbitmq"]
    );
    assert_eq!(
        tree.root.metadata.annotations["helm.sh/depends-on/subcharts"],
        r#"["bar", "rabbitmq"]"#
    );
}

#[test]
fn a_missing_dependency_is_an_error_naming_it() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: nginx\n  version: 1.0.0\n  repository: oci://registry.example.com/charts\n- name: bar\n  version: 0.1.0\n",
    );
    chart(&dir.path().join("charts/bar"), "bar", "0.1.0", "");
    let loaded = chart::load(dir.path()).unwrap();
    let err = chart::resolve(&loaded, &Default::default()).unwrap_err();
    assert!(matches!(err, ChartError::MissingDependencies { .. }));
    let message = err.to_string();
    assert!(
        message.contains("found in Chart.yaml, but missing in charts/ directory: nginx"),
        "{message}"
    );
    assert!(message.contains("Chart.yaml"), "{message}");
    // Nested too, naming the chart path.
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: bar\n  version: 0.1.0\n",
    );
    chart(
        &dir.path().join("charts/bar"),
        "bar",
        "0.1.0",
        "dependencies:\n- name: baz\n  version: 0.1.0\n",
    );
    let loaded = chart::load(dir.path()).unwrap();
    let message = chart::resolve(&loaded, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("chart foo/bar ("), "{message}");
    assert!(message.contains("charts/bar/Chart.yaml"), "{message}");
    assert!(
        message.ends_with("missing in charts/ directory: baz"),
        "{message}"
    );
}

#[test]
fn values_null_removes_a_default_like_helm() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: bar\n  version: 0.1.0\n  condition: bar.enabled\n",
    );
    write(dir.path(), "values.yaml", "bar:\n  enabled: false\n");
    chart(&dir.path().join("charts/bar"), "bar", "0.1.0", "");
    check(dir.path(), &[], &["foo"]);
    // A user null deletes the parent's default...
    check(dir.path(), &["bar.enabled=null"], &["foo", "foo/bar"]);
    // ...and the subchart's own default too: Helm drops the key all the way down.
    write(
        &dir.path().join("charts/bar"),
        "values.yaml",
        "enabled: false\n",
    );
    check(dir.path(), &[], &["foo"]);
    check(dir.path(), &["bar.enabled=null"], &["foo", "foo/bar"]);
}

#[test]
fn yaml_1_1_booleans_decide_conditions_as_in_helm() {
    // Helm reads YAML with go-yaml v2: `off`, `no`, `n` are false, `on`, `yes`, `y` are true.
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: bar\n  version: 0.1.0\n  condition: bar.enabled\n- name: baz\n  version: 0.1.0\n  condition: baz.enabled\n",
    );
    write(
        dir.path(),
        "values.yaml",
        "bar:\n  enabled: off\nbaz:\n  enabled: \"off\"\n",
    );
    chart(&dir.path().join("charts/bar"), "bar", "0.1.0", "");
    chart(&dir.path().join("charts/baz"), "baz", "0.1.0", "");
    check(dir.path(), &[], &["foo", "foo/baz"]);
    let values = dir.path().join("override.yaml");
    std::fs::write(&values, "bar:\n  enabled: yes\nbaz:\n  enabled: n\n").unwrap();
    let by_helm = helm_chart_paths(dir.path(), &["-f", values.to_str().unwrap()]);
    let loaded = chart::load(dir.path()).unwrap();
    let merged = ValueOptions {
        files: vec![values],
        ..Default::default()
    }
    .merge()
    .unwrap();
    let tree = chart::resolve(&loaded, &merged).unwrap();
    let ours: BTreeSet<String> = tree.charts().iter().map(|c| c.path.clone()).collect();
    assert_eq!(ours, by_helm);
    assert_eq!(
        ours,
        ["foo", "foo/bar"].iter().map(|s| s.to_string()).collect()
    );
}
