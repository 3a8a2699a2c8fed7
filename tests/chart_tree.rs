//! The chart tree as the chart pipeline builds it from what the real helm rendered: nested
//! subcharts (directories and .tgz), aliases, charts no dependency selected, dependencies Helm
//! rendered nothing of, and Helm's own errors naming the chart.

use sequenced_testkit as support;

use std::collections::BTreeSet;
use std::path::Path;

use sequenced::chart::{self, ChartTree};
use sequenced::helm::Helm;
use sequenced::pipeline::{self, RenderRequest, ValueFlags};
use support::{chart, helm_chart_paths, package, tar_gz, write};
use tempfile::TempDir;

/// The chart pipeline's result for the chart at `path` with these `--set` flags.
fn render(path: &Path, set: &[&str]) -> Result<pipeline::Rendered, pipeline::Error> {
    let request = RenderRequest {
        release_name: "r".into(),
        namespace: "default".into(),
        flags: ValueFlags {
            set: set.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    support::pipeline_render(&Helm::at(support::helm()), path, &request)
}

fn tree(path: &Path, set: &[&str]) -> ChartTree {
    render(path, set)
        .unwrap_or_else(|e| panic!("render {}: {e}", path.display()))
        .tree
}

/// Asserts the tree holds exactly the charts helm rendered, and that those are `expected`.
fn check(path: &Path, set: &[&str], expected: &[&str]) -> ChartTree {
    let mut helm_args = Vec::new();
    for s in set {
        helm_args.push("--set");
        helm_args.push(s);
    }
    let by_helm = helm_chart_paths(path, &helm_args);
    let tree = tree(path, set);
    let ours: BTreeSet<String> = tree.charts().iter().map(|c| c.path.clone()).collect();
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    assert_eq!(ours, by_helm, "the tree and helm differ for --set {set:?}");
    assert_eq!(ours, expected, "unexpected charts for --set {set:?}");
    tree
}

/// `(chart path, name, what it declares)` of every dependency Helm rendered nothing of.
fn not_rendered(tree: &ChartTree) -> Vec<(String, String, Option<String>)> {
    tree.charts()
        .iter()
        .flat_map(|node| {
            node.not_rendered.iter().map(|d| {
                (
                    node.path.clone(),
                    d.effective_name().to_string(),
                    d.switches(),
                )
            })
        })
        .collect()
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
    let tree = check(dir.path(), &[], &["foo", "foo/bar", "foo/bar/baz"]);
    let baz = tree.find("foo/bar/baz").expect("foo/bar/baz");
    assert_eq!(baz.metadata.version, "0.2.0");
    assert_eq!(baz.dependency.as_ref().unwrap().version, ">=0.1.0");
    assert!(tree.find("foo/baz").is_none());
    assert!(not_rendered(&tree).is_empty());
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
    let tree = check(&archive, &[], &["foo", "foo/bar", "foo/bar/baz"]);
    let location = tree.find("foo/bar/baz").unwrap().location.to_string();
    assert!(
        location.ends_with("foo-1.0.0.tgz:charts/bar-0.1.0.tgz:charts/baz-0.2.0.tgz"),
        "{location}"
    );
    let loaded = chart::load(&archive).unwrap();
    assert_eq!(loaded.metadata.name, "foo");
    assert_eq!(loaded.subcharts[0].subcharts[0].metadata.name, "baz");
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
    // The directory's name is not the chart's: Helm goes by the name in Chart.yaml.
    chart(&dir.path().join("charts/cache-dir"), "cache", "1.2.0", "");
    let tree = check(dir.path(), &[], &["shop", "shop/pages", "shop/sessions"]);
    let sessions = tree.find("shop/sessions").unwrap();
    assert_eq!(sessions.name, "sessions");
    assert_eq!(sessions.metadata.name, "cache");
    assert_eq!(
        sessions.dependency.as_ref().unwrap().alias.as_deref(),
        Some("sessions")
    );
    let tree = check(
        dir.path(),
        &["pages.enabled=false"],
        &["shop", "shop/sessions"],
    );
    assert_eq!(
        not_rendered(&tree),
        vec![(
            "shop".to_string(),
            "pages".to_string(),
            Some("condition pages.enabled".to_string())
        )]
    );
}

#[test]
fn a_subchart_whose_version_does_not_match_keeps_its_own_name() {
    // Helm: the entry does not match, so the alias is not applied and the chart stays under its
    // own name; the entry itself renders nothing.
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "app",
        "1.0.0",
        "dependencies:\n- name: db\n  version: ^2.0.0\n  alias: database\n",
    );
    chart(&dir.path().join("charts/db"), "db", "1.0.0", "");
    let tree = check(dir.path(), &[], &["app", "app/db"]);
    assert_eq!(tree.find("app/db").unwrap().dependency, None);
    assert_eq!(
        not_rendered(&tree),
        vec![("app".to_string(), "database".to_string(), None)]
    );
}

#[test]
fn of_two_charts_of_one_name_the_one_of_the_dependency_version_is_read() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "app",
        "1.0.0",
        "dependencies:\n- name: db\n  version: 2.0.0\n  alias: database\n",
    );
    chart(
        &dir.path().join("charts/db-1"),
        "db",
        "1.0.0",
        "annotations:\n  which: old\n",
    );
    chart(
        &dir.path().join("charts/db-2"),
        "db",
        "2.0.0",
        "annotations:\n  which: new\n",
    );
    let tree = check(dir.path(), &[], &["app", "app/database", "app/db"]);
    let database = tree.find("app/database").unwrap();
    assert_eq!(database.metadata.version, "2.0.0");
    assert_eq!(database.metadata.annotations["which"], "new");
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
         - name: quiet\n  version: 0.1.0\n  condition: quiet.enabled\n",
    );
    chart(&dir.join("charts/bar"), "bar", "0.1.0", "");
    chart(&dir.join("charts/web"), "web", "0.1.0", "");
    chart(&dir.join("charts/api"), "api", "0.1.0", "");
    // Disabled by its own default values.
    chart(&dir.join("charts/quiet"), "quiet", "0.1.0", "");
    write(&dir.join("charts/quiet"), "values.yaml", "enabled: false\n");
}

#[test]
fn what_helm_disabled_is_listed_with_the_condition_and_tags_it_declares() {
    let dir = TempDir::new().unwrap();
    conditional(dir.path());
    let tree = check(dir.path(), &[], &["foo", "foo/api", "foo/bar", "foo/web"]);
    assert_eq!(
        not_rendered(&tree),
        vec![(
            "foo".to_string(),
            "quiet".to_string(),
            Some("condition quiet.enabled".to_string())
        )]
    );
    let tree = check(
        dir.path(),
        &["bar.enabled=false,tags.front-end=false,tags.back-end=false"],
        &["foo"],
    );
    let declared: Vec<(String, Option<String>)> = not_rendered(&tree)
        .into_iter()
        .map(|(_, name, switches)| (name, switches))
        .collect();
    assert_eq!(
        declared,
        vec![
            (
                "bar".to_string(),
                Some("condition bar.enabled,global.bar.enabled".to_string())
            ),
            ("web".to_string(), Some("tags front-end, web".to_string())),
            (
                "api".to_string(),
                Some("condition api.enabled, tag back-end".to_string())
            ),
            (
                "quiet".to_string(),
                Some("condition quiet.enabled".to_string())
            ),
        ]
    );
    // Helm's decision stands, whatever it is: a condition overrides the tags.
    check(
        dir.path(),
        &["tags.back-end=false,api.enabled=true"],
        &["foo", "foo/api", "foo/bar", "foo/web"],
    );
}

#[test]
fn nested_subcharts_below_an_alias() {
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
    let tree = check(
        dir.path(),
        &["middle.leaf.enabled=false"],
        &["top", "top/middle"],
    );
    assert_eq!(
        not_rendered(&tree),
        vec![(
            "top/middle".to_string(),
            "leaf".to_string(),
            Some("condition leaf.enabled".to_string())
        )]
    );
}

#[test]
fn a_chart_is_in_the_tree_when_it_or_a_subchart_rendered_something() {
    let dir = TempDir::new().unwrap();
    // foo/bar renders nothing itself but its subchart does; foo/empty renders nothing at all.
    write(
        dir.path(),
        "Chart.yaml",
        "apiVersion: v2\nname: foo\nversion: 0.1.0\ndependencies:\n- name: bar\n  version: 0.1.0\n- name: empty\n  version: 0.1.0\n",
    );
    write(
        &dir.path().join("charts/bar"),
        "Chart.yaml",
        "apiVersion: v2\nname: bar\nversion: 0.1.0\ndependencies:\n- name: baz\n  version: 0.1.0\n",
    );
    chart(
        &dir.path().join("charts/bar/charts/baz"),
        "baz",
        "0.1.0",
        "",
    );
    write(
        &dir.path().join("charts/empty"),
        "Chart.yaml",
        "apiVersion: v2\nname: empty\nversion: 0.1.0\n",
    );
    let tree = tree(dir.path(), &[]);
    let paths: Vec<&str> = tree.charts().iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, vec!["foo", "foo/bar", "foo/bar/baz"]);
    assert_eq!(
        not_rendered(&tree),
        vec![("foo".to_string(), "empty".to_string(), None)]
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
    let tree = check(
        &root.join("examples/foo"),
        &[],
        &["foo", "foo/bar", "foo/nginx", "foo/rabbitmq"],
    );
    let bar = tree.find("foo/bar").unwrap();
    assert_eq!(
        bar.dependency.as_ref().unwrap().depends_on,
        vec!["nginx", "rabbitmq"]
    );
    assert_eq!(
        tree.root.metadata.annotations["helm.sh/depends-on/subcharts"],
        r#"["bar", "rabbitmq"]"#
    );
    let tree = check(
        &root.join("examples/foo"),
        &["bar.enabled=false"],
        &["foo", "foo/nginx", "foo/rabbitmq"],
    );
    assert_eq!(
        not_rendered(&tree),
        vec![(
            "foo".to_string(),
            "bar".to_string(),
            Some("condition bar.enabled".to_string())
        )]
    );
}

#[test]
fn a_missing_dependency_is_helms_error_naming_the_chart() {
    let dir = TempDir::new().unwrap();
    chart(
        dir.path(),
        "foo",
        "0.1.0",
        "dependencies:\n- name: nginx\n  version: 1.0.0\n  repository: oci://registry.example.com/charts\n- name: bar\n  version: 0.1.0\n",
    );
    chart(&dir.path().join("charts/bar"), "bar", "0.1.0", "");
    let err = render(dir.path(), &[]).unwrap_err();
    assert!(!err.is_transient(), "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "rendering chart {}: helm template failed (exit code 1): ",
            dir.path().display()
        )),
        "{message}"
    );
    assert!(
        message.contains("found in Chart.yaml, but missing in charts/ directory: nginx"),
        "{message}"
    );
}
