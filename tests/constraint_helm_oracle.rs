//! Checks `sequenced::chart::constraint` against the helm binary itself.
//!
//! Helm matches a subchart in `charts/` to a `dependencies[]` entry of
//! `Chart.yaml` only when the subchart's version satisfies the entry's version
//! constraint; an entry with an alias then renders the subchart under the
//! alias. So for each (constraint, version) below, a parent chart gets a
//! subchart `sub` of that version and the dependency
//! `{name: sub, version: <constraint>, alias: matched}`, and `helm template`
//! tells whether helm matched them: the subchart's template is rendered as
//! `parent/charts/matched/...` if so and as `parent/charts/sub/...` if not.

use sequenced_testkit as support;

use std::fs;
use std::path::Path;
use std::process::Command;

use sequenced::chart::constraint::is_compatible_range;

/// (constraint, subchart version): common ranges, and the corners where the
/// Go library's answer is surprising.
const CASES: &[(&str, &str)] = &[
    ("^1.2", "1.5.0"),
    ("^1.2", "2.0.0"),
    ("^1.2", "1.5.0-rc.1"),
    (">=1.2.3-0", "1.3.0-alpha"),
    ("~1.2.3", "1.3.0"),
    ("1.2.x", "1.2.9"),
    (">= 1.2, < 3", "2.9.9"),
    ("^1 || ^2", "2.3.0"),
    ("1.0 - 2.0", "2.0.1"),
    ("v1.2.3", "1.2.3+build"),
    ("=< 1.2", "1.2.9"),
    (">11.1", "11.1.1"),
    ("^0.0", "0.1.0"),
    ("!=1.2.x-beta", "1.2.0-rc"),
    ("1.2-3", "1.2.1"),
    ("x.2.3", "7.0.0"),
    ("^*", "1.0.0"),
    ("<=*", "0.1.0"),
    ("1||2 - 3", "5.0.0"),
    ("", "1.0.0"),
    ("foo", "1.0.0"),
    ("1x", "1.0.0"),
];

fn yaml_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create chart directory");
    }
    fs::write(path, text).expect("write chart file");
}

/// Whether helm matches a subchart of `version` to a dependency on
/// `constraint`.
fn helm_matches(constraint: &str, version: &str) -> bool {
    let dir = tempfile::tempdir().expect("temporary directory");
    let parent = dir.path().join("parent");
    write(
        &parent.join("Chart.yaml"),
        &format!(
            "apiVersion: v2\nname: parent\nversion: 0.1.0\ndependencies:\n  - name: sub\n    version: {}\n    alias: matched\n",
            yaml_quote(constraint)
        ),
    );
    write(
        &parent.join("charts/sub/Chart.yaml"),
        &format!(
            "apiVersion: v2\nname: sub\nversion: {}\n",
            yaml_quote(version)
        ),
    );
    write(
        &parent.join("charts/sub/templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: sub\n",
    );

    let output = Command::new(support::helm())
        .args(["template", "release"])
        .arg(&parent)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run helm ({e}); run scripts/install-helm.sh or set SEQUENCED_HELM")
        });
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "helm template failed for {constraint:?} / {version:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    if stdout.contains("# Source: parent/charts/matched/") {
        true
    } else if stdout.contains("# Source: parent/charts/sub/") {
        false
    } else {
        panic!("unexpected helm output for {constraint:?} / {version:?}:\n{stdout}");
    }
}

#[test]
fn constraints_match_subcharts_like_helm() {
    let mut disagreements = Vec::new();
    for &(constraint, version) in CASES {
        let helm = helm_matches(constraint, version);
        let ours = is_compatible_range(constraint, version);
        if ours != helm {
            disagreements.push(format!(
                "{constraint:?} vs {version:?}: helm says {helm}, we say {ours}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}
