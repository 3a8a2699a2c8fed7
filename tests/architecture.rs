//! The shape of the source that ARCHITECTURE.md promises a newcomer: within each module of
//! `src/`, no file imports a file that imports it back (directly or round a longer circle), and
//! no file of the controller grows past about 600 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files of a directory (not below it), by name without `.rs`.
fn files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// The names `text` imports from its sibling files: `super::x`, `super::{x, y::z}` and
/// `crate::<module>::x`, outside its `#[cfg(test)]` part.
fn imports(text: &str, module: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut found = BTreeSet::new();
    for prefix in ["super::".to_string(), format!("crate::{module}::")] {
        let mut rest = code;
        while let Some(at) = rest.find(&prefix) {
            rest = &rest[at + prefix.len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                group[..end].split(',').collect()
            } else {
                vec![rest]
            };
            for name in names {
                let name: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if siblings.contains(&name) {
                    found.insert(name);
                }
            }
        }
    }
    found
}

/// A circle of imports among the files of `dir`, if there is one.
fn circle(dir: &Path, module: &str) -> Option<Vec<String>> {
    let files = files(dir);
    let names: BTreeSet<String> = files.keys().filter(|n| *n != "mod").cloned().collect();
    let graph: BTreeMap<&String, BTreeSet<String>> = files
        .iter()
        .filter(|(n, _)| *n != "mod")
        .map(|(n, text)| {
            let mut deps = imports(text, module, &names);
            deps.remove(n);
            (n, deps)
        })
        .collect();
    fn visit(
        node: &str,
        graph: &BTreeMap<&String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(&node.to_string()).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(found) = visit(node, &graph, &mut Vec::new(), &mut done) {
            return Some(found);
        }
    }
    None
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let src = repo().join("src");
    let mut circles = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        if entry.path().is_dir() {
            let module = entry.file_name().to_string_lossy().into_owned();
            if let Some(found) = circle(&entry.path(), &module) {
                circles.push(format!("src/{module}: {}", found.join(" -> ")));
            }
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn the_checker_finds_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rs"), "use super::b::B;\n").unwrap();
    std::fs::write(dir.path().join("b.rs"), "use super::{c, x};\n").unwrap();
    std::fs::write(dir.path().join("c.rs"), "use crate::m::a::A;\n").unwrap();
    assert_eq!(
        circle(dir.path(), "m"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    std::fs::write(
        dir.path().join("c.rs"),
        "#[cfg(test)]\nuse crate::m::a::A;\n",
    )
    .unwrap();
    assert_eq!(circle(dir.path(), "m"), None);
}

#[test]
fn no_controller_file_is_over_about_six_hundred_lines() {
    let mut long = Vec::new();
    let mut dirs = vec![repo().join("src/controller")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path).unwrap().lines().count();
                if lines > 650 {
                    long.push(format!("{} ({lines} lines)", path.display()));
                }
            }
        }
    }
    assert!(long.is_empty(), "{long:?}");
}

/// The end-to-end tests need a real cluster: each is `#[ignore]`d, so that a run without one
/// reports them skipped, never passed (`tests/e2e.rs` says how to run them, and how a test there
/// is written).
#[test]
fn every_end_to_end_test_is_ignored_unless_asked_for() {
    let text = std::fs::read_to_string(repo().join("tests/e2e.rs")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
    let mut tests = 0;
    for (at, line) in lines.iter().enumerate() {
        if !(line.starts_with("#[tokio::test") || line.starts_with("#[test]")) {
            continue;
        }
        tests += 1;
        let attributes: Vec<&str> = lines[at..]
            .iter()
            .copied()
            .take_while(|l| l.starts_with("#["))
            .collect();
        let function = lines.get(at + attributes.len()).copied().unwrap_or("");
        assert!(
            attributes.iter().any(|a| a.starts_with(
                "#[ignore = \"needs a real cluster: SEQUENCED_E2E_KUBECONFIG, see the top of tests/e2e.rs\"]"
            )),
            "tests/e2e.rs: `{function}` is not ignored: give it the #[ignore] the top of the file shows"
        );
    }
    assert!(tests >= 16, "only {tests} tests found in tests/e2e.rs");
}
