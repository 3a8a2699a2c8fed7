//! The documentation: the book in docs/ (mdBook), README.md, CHANGELOG.md and ARCHITECTURE.md.
//! Every relative link and anchor resolves (anchors as mdBook and GitHub make them), every page
//! of the book is in its SUMMARY, the generated reference pages are what the code generates,
//! every reason the operator writes has a troubleshooting entry, the console samples of the book
//! are what the binary prints, and every SequencedRelease the docs show is admitted by the CRD;
//! the README's first release is deployed.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::Api;
use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use sequenced::api::{Reason, SequencedRelease};
use sequenced::cli::reference::{API_FILE, CLI_FILE, slug};
use sequenced_testkit as support;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The book's sources.
fn book() -> PathBuf {
    repo().join("docs/src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.md` file under `dir`, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the book's directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Every document the checks cover: the three at the top and the book's pages.
fn documents() -> Vec<PathBuf> {
    let mut documents: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "ARCHITECTURE.md"]
        .iter()
        .map(|name| repo().join(name))
        .collect();
    documents.extend(markdown_under(&book()));
    documents
}

/// What the checks need of one Markdown file, parsed as mdBook parses it.
#[derive(Default)]
struct Page {
    /// (level, text, anchor) of every heading, in order.
    headings: Vec<(HeadingLevel, String, String)>,
    /// (destination, line) of every link and image.
    links: Vec<(String, usize)>,
    /// (info string, text) of every fenced code block.
    code: Vec<(String, String)>,
}

fn parse(text: &str) -> Page {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_HEADING_ATTRIBUTES;
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    let mut page = Page::default();
    let mut used = HashSet::new();
    let mut heading: Option<(HeadingLevel, Option<String>, String)> = None;
    let mut code: Option<(String, String)> = None;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { level, id, .. }) => {
                heading = Some((level, id.map(|id| id.to_string()), String::new()));
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((level, id, text)) = heading.take() {
                    // mdBook keeps an explicit id as it is, and numbers repeated slugs -1, -2, ...
                    let anchor = id.unwrap_or_else(|| unique(slug(&text), &mut used));
                    page.headings.push((level, text, anchor));
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((_, _, heading)) = &mut heading {
                    heading.push_str(&t);
                }
                if let Some((_, code)) = &mut code {
                    code.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                page.links
                    .push((dest_url.to_string(), line_of(range.start)));
            }
            Event::Start(Tag::CodeBlock(kind)) => {
                let info = match kind {
                    CodeBlockKind::Fenced(info) => info.to_string(),
                    CodeBlockKind::Indented => String::new(),
                };
                code = Some((info, String::new()));
            }
            Event::End(TagEnd::CodeBlock) => page.code.extend(code.take()),
            _ => {}
        }
    }
    page
}

/// mdBook's `unique_id`: the slug, else the slug with the first free suffix `-1`, `-2`, ...
fn unique(slug: String, used: &mut HashSet<String>) -> String {
    if used.insert(slug.clone()) {
        return slug;
    }
    (1..)
        .map(|n| format!("{slug}-{n}"))
        .find(|candidate| used.insert(candidate.clone()))
        .expect("a free suffix")
}

fn anchors(path: &Path) -> BTreeSet<String> {
    parse(&read(path))
        .headings
        .into_iter()
        .map(|(_, _, anchor)| anchor)
        .collect()
}

/// The problems of one link of `file`, if any.
fn check_link(file: &Path, dest: &str) -> Option<String> {
    if dest.contains("://") || dest.starts_with("mailto:") {
        return None;
    }
    let (path, fragment) = match dest.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (dest, None),
    };
    let target = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a directory").join(path)
    };
    let Ok(target) = target.canonicalize() else {
        return Some(format!("{dest}: no such file"));
    };
    let book = book().canonicalize().expect("docs/src");
    if file.starts_with(&book) {
        // The built book holds only docs/src, and mdBook turns README.md into index.html
        // without rewriting the links to it.
        if !target.starts_with(&book) {
            return Some(format!(
                "{dest}: outside docs/src, so broken in the built book"
            ));
        }
        if target.is_dir() || target.extension().is_none_or(|e| e != "md") {
            return Some(format!("{dest}: the book links to its own .md pages only"));
        }
        if target.file_name().is_some_and(|n| n == "README.md") {
            return Some(format!("{dest}: mdBook renames README.md to index.html"));
        }
    }
    let fragment = fragment?;
    if target.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "{dest}: an anchor into a file that is not Markdown"
        ));
    }
    if !anchors(&target).contains(fragment) {
        return Some(format!(
            "{dest}: no heading of {} has the anchor #{fragment}",
            target.display()
        ));
    }
    None
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let page = parse(&read(&file));
        for (dest, line) in &page.links {
            checked += 1;
            let file = file.canonicalize().expect("the document");
            if let Some(problem) = check_link(&file, dest) {
                broken.push(format!(
                    "{}:{line}: {problem}",
                    file.strip_prefix(repo().canonicalize().unwrap())
                        .unwrap_or(&file)
                        .display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 300,
        "only {checked} links found: is the parser reading the docs?"
    );
}

#[test]
fn the_link_checker_finds_what_is_broken() {
    let file = book().join("concepts/layers.md").canonicalize().unwrap();
    for (dest, ok) in [
        ("readiness.md", true),
        ("readiness.md#built-in-rules", true),
        ("#the-rules", true),
        ("../reference/api.md#specvaluesfromkind", true),
        ("https://example.com/x#y", true),
        ("readiness.md#no-such-heading", false),
        ("no-such-page.md", false),
        ("#nowhere", false),
        ("../../../ARCHITECTURE.md", false),
        ("../../../examples/shop", false),
    ] {
        assert_eq!(check_link(&file, dest).is_none(), ok, "{dest}");
    }
    // Outside the book a directory, or a file, anywhere in the repository is fine.
    let readme = repo().join("README.md").canonicalize().unwrap();
    assert!(check_link(&readme, "examples/shop").is_none());
    assert!(check_link(&readme, "ARCHITECTURE.md#testing").is_none());
    assert!(check_link(&readme, "ARCHITECTURE.md#no-such-heading").is_some());
}

#[test]
fn anchors_are_the_ones_mdbook_makes() {
    let page = parse("# A `b` c\n\n## A b c\n\n### Über {#own}\n\n## spec.valuesFrom[].kind\n");
    let anchors: Vec<&str> = page.headings.iter().map(|(_, _, a)| a.as_str()).collect();
    assert_eq!(anchors, ["a-b-c", "a-b-c-1", "own", "specvaluesfromkind"]);
}

#[test]
fn every_page_of_the_book_is_in_its_summary_and_the_other_way_round() {
    let summary = book().join("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = parse(&read(&summary))
        .links
        .iter()
        .map(|(dest, _)| book().join(dest))
        .collect();
    let pages: BTreeSet<PathBuf> = markdown_under(&book())
        .into_iter()
        .filter(|p| *p != summary)
        .collect();
    assert_eq!(listed, pages);
}

/// The built `sequenced` with `args`, run in the repository, with environment variables that
/// must not leak into generated output.
fn sequenced(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args(args)
        .current_dir(repo())
        .env("SEQUENCED_HELM", support::helm())
        .env("SEQUENCED_CONCURRENCY", "3")
        .env("SEQUENCED_IDENTITY", "someone-s-laptop")
        .env("SEQUENCED_PASSWORD", "hunter2")
        .output()
        .expect("run sequenced")
}

fn generated(args: &[&str], file: &str) {
    let output = sequenced(args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let committed = std::fs::read_to_string(repo().join(file)).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&output.stdout) == committed,
        "{file} differs from what `sequenced {}` writes; run scripts/generate-docs.sh and commit \
         the result",
        args.join(" ")
    );
}

#[test]
fn the_api_reference_is_generated_from_the_crd() {
    generated(&["crd", "--format", "markdown"], API_FILE);
    // Every field of the CRD has its heading.
    let page = read(&repo().join(API_FILE));
    for path in [
        "spec.chart.oci",
        "spec.valuesFrom[].valuesKey",
        "spec.driftDetection",
        "status.layers[].phase",
        "status.conditions[].reason",
    ] {
        assert!(page.contains(&format!("\n### {path}\n")), "{path}");
    }
}

#[test]
fn the_cli_reference_is_generated_from_the_help() {
    generated(&["cli-reference"], CLI_FILE);
    let page = read(&repo().join(CLI_FILE));
    assert!(!page.contains("someone-s-laptop") && !page.contains("hunter2"));
}

/// The variants of `enum NAME` in src/api/reason.rs, read from the source: an exhaustive list
/// that no one has to keep by hand.
fn variants(name: &str) -> Vec<String> {
    let source = read(&repo().join("src/api/reason.rs"));
    let start = source
        .find(&format!("pub enum {name} {{"))
        .unwrap_or_else(|| panic!("enum {name} in src/api/reason.rs"));
    source[start..]
        .lines()
        .skip(1)
        .map(str::trim)
        .take_while(|line| *line != "}")
        .filter(|line| !line.starts_with("//") && !line.starts_with('#'))
        .filter_map(|line| line.strip_suffix(','))
        .map(str::to_string)
        .collect()
}

/// The level-3 headings of a troubleshooting page.
fn entries(page: &str) -> BTreeSet<String> {
    parse(&read(&book().join("troubleshooting").join(page)))
        .headings
        .into_iter()
        .filter(|(level, _, _)| *level == HeadingLevel::H3)
        .map(|(_, text, _)| text)
        .collect()
}

#[test]
fn every_reason_and_event_has_a_troubleshooting_entry() {
    let reasons: BTreeSet<String> = variants("Reason").into_iter().collect();
    // The source is read right: it lists exactly the reasons the code knows.
    let known: BTreeSet<String> = Reason::ALL.iter().map(|r| r.as_str().to_string()).collect();
    assert_eq!(reasons, known);
    assert_eq!(
        entries("reasons.md"),
        reasons,
        "docs/src/troubleshooting/reasons.md"
    );

    let events: BTreeSet<String> = variants("EventReason").into_iter().collect();
    assert!(events.contains("LayerStarted") && events.contains("ReconcileFailed"));
    assert_eq!(
        entries("events.md"),
        events,
        "docs/src/troubleshooting/events.md"
    );
}

/// The commands of the book's samples that need no cluster.
const OFFLINE: [&str; 5] = ["graph", "lint", "template", "ready", "crd"];

/// A ```console sample: `$ command` lines, each followed by what it prints. Samples whose every
/// command is an offline `sequenced` command (or `echo $?`) are run, and must print exactly
/// that, with that exit code.
fn check_console(sample: &str) -> Result<bool, String> {
    let mut steps: Vec<(String, String)> = Vec::new();
    for line in sample.lines() {
        match line.strip_prefix("$ ") {
            Some(command) => steps.push((command.to_string(), String::new())),
            None => match steps.last_mut() {
                Some((_, output)) => {
                    output.push_str(line);
                    output.push('\n');
                }
                None => return Ok(false),
            },
        }
    }
    let runnable = |command: &str| {
        command == "echo $?"
            || command.strip_prefix("sequenced ").is_some_and(|rest| {
                OFFLINE.contains(&rest.split_whitespace().next().unwrap_or(""))
                    && !rest.contains(['|', '>', '<', '"', '\'', '$'])
            })
    };
    if steps.is_empty() || !steps.iter().all(|(command, _)| runnable(command)) {
        return Ok(false);
    }
    let mut last_code = None;
    for (command, expected) in &steps {
        if command == "echo $?" {
            let code = last_code.ok_or("echo $? before any command")?;
            if expected.trim() != format!("{code}") {
                return Err(format!("exit code {code}, the sample says {expected:?}"));
            }
            continue;
        }
        let args: Vec<&str> = command.split_whitespace().skip(1).collect();
        let output = sequenced(&args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        if stdout != *expected {
            return Err(format!(
                "`{command}` prints:\n{stdout}\nthe sample says:\n{expected}\n(stderr: {})",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        last_code = output.status.code();
    }
    Ok(true)
}

#[test]
fn the_console_samples_are_what_the_binary_prints() {
    let mut checked = Vec::new();
    let mut wrong = Vec::new();
    for file in documents() {
        for (info, sample) in parse(&read(&file)).code {
            if info != "console" {
                continue;
            }
            match check_console(&sample) {
                Ok(true) => checked.push(sample.lines().next().unwrap_or("").to_string()),
                Ok(false) => {}
                Err(problem) => wrong.push(format!("{}: {problem}", file.display())),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    for sample in [
        "$ sequenced graph examples/foo",
        "$ sequenced graph examples/migrate",
        "$ sequenced lint examples/shop",
        "$ sequenced ready -f examples/readiness/shop.yaml",
    ] {
        assert!(checked.iter().any(|c| c == sample), "{sample} not checked");
    }
}

/// Every SequencedRelease in the YAML samples of `file`.
fn releases_in(file: &Path) -> Vec<Value> {
    parse(&read(file))
        .code
        .into_iter()
        .filter(|(info, _)| info == "yaml")
        .flat_map(|(_, text)| {
            text.split("\n---\n")
                .filter_map(|document| serde_yaml_ng::from_str::<Value>(document).ok())
                .filter(|object| object["kind"] == "SequencedRelease")
                .collect::<Vec<_>>()
        })
        .collect()
}

async fn within<F: std::future::Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the scenario did not finish in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sequenced_release_the_docs_show_is_admitted() {
    within(async {
        let op = support::operator::Operator::without_controller().await;
        let mut namespaces = BTreeSet::from(["default".to_string()]);
        let mut admitted = 0;
        for file in documents() {
            for (i, release) in releases_in(&file).into_iter().enumerate() {
                let namespace = release["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                if namespaces.insert(namespace.clone()) {
                    op.namespace(&namespace).await;
                }
                // Each under a name of its own: several samples are called shop.
                let mut release = release.clone();
                release["metadata"]["name"] = json!(format!("sample-{admitted}-{i}"));
                let sr: SequencedRelease = serde_json::from_value(release.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}: {release}", file.display()));
                if let Err(e) = op
                    .releases(&namespace)
                    .create(&Default::default(), &sr)
                    .await
                {
                    panic!("{}: refused: {e}\n{release}", file.display());
                }
                admitted += 1;
            }
        }
        assert!(
            admitted >= 4,
            "only {admitted} SequencedReleases in the docs"
        );
    })
    .await;
}

/// The README's first release, done as its commands do it: `helm package examples/shop`, the
/// archive in a ConfigMap (`kubectl create configmap --from-file` puts a file that is not UTF-8
/// under binaryData), and the SequencedRelease as the README writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_first_release_deploys_in_layer_order() {
    let readme = read(&repo().join("README.md"));
    for command in [
        "helm package examples/shop",
        "kubectl create configmap shop-chart --from-file=shop-0.1.0.tgz",
        "kubectl apply -f shop.yaml",
    ] {
        assert!(readme.contains(command), "the README runs {command}");
    }
    let releases = releases_in(&repo().join("README.md"));
    assert_eq!(releases.len(), 1, "the README shows one SequencedRelease");
    // Getting started shows the same object.
    assert_eq!(releases_in(&book().join("getting-started.md")), releases);
    let release = releases[0].clone();
    within(async {
        let out = tempfile::tempdir().unwrap();
        let archive = support::package(&repo().join("examples/shop"), out.path());
        assert_eq!(
            archive.file_name().and_then(|n| n.to_str()),
            Some("shop-0.1.0.tgz")
        );
        let op = support::operator::Operator::start(2).await;
        let _kubelet = op.kubelet();
        let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(op.client.clone(), "default");
        let config_map = serde_json::from_value(json!({
            "metadata": {"name": "shop-chart"},
            "binaryData": {"shop-0.1.0.tgz": k8s_openapi::ByteString(std::fs::read(&archive).unwrap())},
        }))
        .unwrap();
        config_maps
            .create(&Default::default(), &config_map)
            .await
            .unwrap();
        op.create("default", release).await;
        let sr = op
            .wait_release("default", "shop", "Ready", support::charts::is_ready)
            .await;
        let status = sr.status.expect("a status");
        let layer = |name: &str| {
            status
                .layers
                .iter()
                .find(|l| l.name == name)
                .unwrap_or_else(|| panic!("layer {name}"))
        };
        for earlier in ["database", "queue"] {
            let ready = layer(earlier).finished_at.clone().expect("ready");
            let started = layer("app").started_at.clone().expect("started");
            assert!(started.0 >= ready.0, "app started before {earlier} was ready");
        }
        op.stop().await;
    })
    .await;
}

/// The status tree of the README (checked against the binary by tests/status_cli.rs) is the
/// one the book's `sequenced status` page shows.
#[test]
fn the_book_shows_the_readme_status_tree() {
    let tree = |file: &Path| -> Vec<String> {
        parse(&read(file))
            .code
            .into_iter()
            .filter(|(info, text)| {
                info == "text" && text.starts_with("SequencedRelease apps/shop\n")
            })
            .map(|(_, text)| text)
            .collect()
    };
    let readme = tree(&repo().join("README.md"));
    assert_eq!(readme.len(), 1, "the README's status tree");
    assert_eq!(tree(&book().join("cli/status.md")), readme);
}
