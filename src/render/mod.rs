//! Rendering: `helm template`, then every document attributed to the chart it came from.
//!
//! Helm prints each rendered document after a `# Source: foo/charts/bar/templates/x.yaml` line.
//! From it we take the chart path (`foo/bar`) and the template file (`templates/x.yaml`); the
//! chart paths of all documents are also what says which subcharts Helm enabled
//! ([`rendered_charts`]). CRDs from `crds/` directories and hooks (`helm.sh/hook`) are kept apart
//! from the main resources, because they run in their own stages.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::Value;

#[cfg(doc)]
use crate::chart::Chart;
pub mod postrender;

use crate::chart::{ChartFile, ChartTree};
use crate::helm::{Helm, HelmError};

/// The annotation that makes a document a Helm hook.
pub const HOOK_ANNOTATION: &str = "helm.sh/hook";

/// What `helm template` is asked to render.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RenderOptions {
    pub release_name: String,
    pub namespace: String,
    /// `-f` files, in order.
    pub values_files: Vec<PathBuf>,
    /// `--set-json` flags, in order.
    pub set_json: Vec<String>,
    /// `--set` flags, in order.
    pub set: Vec<String>,
    /// `--set-string` flags, in order.
    pub set_string: Vec<String>,
    /// `--set-literal` flags, in order.
    pub set_literal: Vec<String>,
    /// `--kube-version`: the cluster's version for `.Capabilities.KubeVersion`.
    pub kube_version: Option<String>,
    /// `--api-versions`: the cluster's API versions for `.Capabilities.APIVersions`.
    pub api_versions: Vec<String>,
    /// Render as an upgrade (`.Release.IsUpgrade`).
    pub is_upgrade: bool,
}

/// One rendered Kubernetes object with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// The chart path: `foo`, `foo/bar` for subchart bar of foo.
    pub chart: String,
    /// The file inside that chart: `templates/deployment.yaml`, `crds/widgets.yaml`.
    pub template: String,
    /// The `# Source:` path as Helm printed it.
    pub source: String,
    /// The object.
    pub object: Value,
    /// The YAML text Helm printed for it (for an item of a `kind: List`, that item alone).
    pub text: String,
}

impl Document {
    fn field<'a>(&'a self, path: &[&str]) -> Option<&'a str> {
        let mut value = &self.object;
        for key in path {
            value = value.get(key)?;
        }
        value.as_str()
    }

    pub fn api_version(&self) -> &str {
        self.field(&["apiVersion"]).unwrap_or_default()
    }

    pub fn kind(&self) -> &str {
        self.field(&["kind"]).unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.field(&["metadata", "name"]).unwrap_or_default()
    }

    pub fn namespace(&self) -> Option<&str> {
        self.field(&["metadata", "namespace"])
    }

    /// The annotations whose values are strings. (Sequencing annotations written as YAML lists are
    /// read by the planner from [`Document::object`].)
    pub fn annotations(&self) -> BTreeMap<&str, &str> {
        self.object
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `Kind/name`, as messages name resources.
    pub fn resource(&self) -> String {
        format!("{}/{}", self.kind(), self.name())
    }

    /// Whether this is a Helm hook.
    pub fn is_hook(&self) -> bool {
        self.object
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(HOOK_ANNOTATION))
            .is_some_and(|v| !v.is_null())
    }
}

/// The rendered chart, split into the stages that run apart.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rendered {
    /// CRDs from the `crds/` directories, applied first.
    pub crds: Vec<Document>,
    /// Hooks (`helm.sh/hook`), run around the main resources.
    pub hooks: Vec<Document>,
    /// Everything else, in the order Helm printed it.
    pub resources: Vec<Document>,
}

impl Rendered {
    /// Every document, CRDs first, then hooks, then main resources.
    pub fn all(&self) -> impl Iterator<Item = &Document> {
        self.crds.iter().chain(&self.hooks).chain(&self.resources)
    }
}

impl Rendered {
    /// Stamps `spec.commonMetadata` on every hook and main resource (not the CRDs of `crds/`
    /// directories, which Helm never post-renders either): its labels and annotations override
    /// the chart's own; the ownership ones are set after this, so they always win. The text is
    /// written again for a document it changed, so that the release record shows them.
    pub fn stamp(&mut self, common: &crate::api::CommonMetadata) {
        if common.is_empty() {
            return;
        }
        for document in self.hooks.iter_mut().chain(self.resources.iter_mut()) {
            let Some(metadata) = document
                .object
                .get_mut("metadata")
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            for (field, stamped) in [
                ("labels", &common.labels),
                ("annotations", &common.annotations),
            ] {
                if stamped.is_empty() {
                    continue;
                }
                let entry = metadata
                    .entry(field)
                    .or_insert_with(|| Value::Object(Default::default()));
                if !entry.is_object() {
                    *entry = Value::Object(Default::default());
                }
                if let Some(map) = entry.as_object_mut() {
                    for (key, value) in stamped {
                        map.insert(key.clone(), Value::String(value.clone()));
                    }
                }
            }
            if let Ok(text) = serde_yaml_ng::to_string(&document.object) {
                document.text = text;
            }
        }
    }
}

/// Why a chart could not be rendered. Every message names the chart, file and resource.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// Helm failed; its message is kept whole.
    #[error("rendering chart {chart}: {source}")]
    Helm {
        chart: String,
        #[source]
        source: HelmError,
    },
    #[error("{source_path}: {message}")]
    Document {
        source_path: String,
        message: String,
    },
    #[error("helm printed document {index} without a # Source: line")]
    NoSource { index: usize },
    #[error(
        "{source_path}: rendered for chart {chart}, which is not a chart of {root} found in its charts/ directories (charts: {enabled})"
    )]
    UnknownChart {
        source_path: String,
        chart: String,
        root: String,
        enabled: String,
    },
}

impl RenderError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            RenderError::Helm { source, .. } => source.category(),
            RenderError::Document { .. } => "bad_document",
            RenderError::NoSource { .. } | RenderError::UnknownChart { .. } => "attribution",
        }
    }
}

/// Renders `chart` (a directory or .tgz) with `helm template`, CRDs included, and returns what
/// helm printed.
pub async fn template(
    helm: &Helm,
    chart: &Path,
    options: &RenderOptions,
) -> Result<String, RenderError> {
    let args = template_args(chart, options);
    helm.run("helm template", &args, helm.timeouts().template)
        .await
        .map_err(|source| RenderError::Helm {
            chart: chart.display().to_string(),
            source,
        })
}

/// The chart path (`foo`, `foo/bar`) of every document in the output of `helm template`;
/// `crd_files` are the `crds/` files of the chart helm rendered ([`Chart::crd_files`]).
pub fn rendered_charts(output: &str, crd_files: &[&ChartFile]) -> BTreeSet<String> {
    split_output(output, crd_files)
        .into_iter()
        .filter_map(|raw| raw.source)
        .map(|source| attribute(source).0)
        .collect()
}

/// The arguments of `helm template` for these options.
pub fn template_args(chart: &Path, options: &RenderOptions) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "template".into(),
        options.release_name.clone().into(),
        chart.into(),
        "--namespace".into(),
        options.namespace.clone().into(),
        "--include-crds".into(),
    ];
    for file in &options.values_files {
        args.push("--values".into());
        args.push(file.into());
    }
    let flags = [
        ("--set-json", &options.set_json),
        ("--set", &options.set),
        ("--set-string", &options.set_string),
        ("--set-literal", &options.set_literal),
    ];
    for (flag, values) in flags {
        for value in values {
            args.push(flag.into());
            args.push(value.into());
        }
    }
    if let Some(version) = &options.kube_version {
        args.push("--kube-version".into());
        args.push(version.into());
    }
    for api in &options.api_versions {
        args.push("--api-versions".into());
        args.push(api.into());
    }
    if options.is_upgrade {
        args.push("--is-upgrade".into());
    }
    args
}

/// A document of helm's output before it is parsed.
struct RawDocument<'a> {
    source: Option<&'a str>,
    text: String,
}

/// Splits helm's output into documents, each with the `# Source:` line helm wrote for it, never a
/// comment of the chart's own file.
///
/// Helm prints every template document as `---`, `# Source: PATH`, then the document: it split
/// the template's output at its `---` lines, so in that part of the output every `---` line is
/// helm's and the line after it is helm's `# Source:` (a template's own `# Source:` comment comes
/// after it). A `# Source:` line is only ever taken for helm's when it names a file helm could
/// print: one of `crds/` or `templates/` of the top chart or of a chart below it. With `--include-crds`, each file of a `crds/` directory comes first, printed whole
/// after its `---` and `# Source:` lines: the file's own `---` lines and comments are part of it.
/// When the file's bytes are known (`crd_files`, from the chart's loader), exactly those bytes
/// are that file; otherwise it ends at the next `---` line followed by a `# Source:` line that
/// names a `crds/` or `templates/` file of the same top chart, as helm would write it. The
/// documents of a CRD file each carry the file's source.
fn split_output<'a>(output: &'a str, crd_files: &[&ChartFile]) -> Vec<RawDocument<'a>> {
    let mut documents = Vec::new();
    // The top chart's name, with which every path helm writes begins.
    let mut root: Option<&str> = None;
    let mut rest = output;
    // Text before the first header (never printed by helm) is a document without a source.
    let mut source: Option<&'a str> = None;
    while !rest.is_empty() {
        let (header, body_start) = match header(rest) {
            Some((path, after)) => (Some(path), after),
            None => (None, rest),
        };
        if let Some(path) = header {
            source = Some(path);
            root.get_or_insert_with(|| path.split('/').next().unwrap_or_default());
        }
        let is_crd_file = header.is_some_and(|path| attribute(path).1.starts_with("crds/"));
        let body_len = match header {
            Some(path) if is_crd_file => crd_body(body_start, path, crd_files)
                .unwrap_or_else(|| crd_body_by_headers(body_start, root)),
            Some(_) => template_body(body_start, root),
            // Not a header (a `---` line helm did not write, or text before the first one): its
            // first line belongs to it, whatever it is, so that the loop always moves on.
            None => {
                let first = body_start.find('\n').map_or(body_start.len(), |at| at + 1);
                first + template_body(&body_start[first..], root)
            }
        };
        let (body, after) = body_start.split_at(body_len);
        push_documents(&mut documents, source, body, header.is_some());
        rest = after;
    }
    documents
}

/// `---` then `# Source: PATH` at the start of `text`: PATH and the text after the two lines.
fn header(text: &str) -> Option<(&str, &str)> {
    let (first, after_first) = text.split_once('\n').unwrap_or((text, ""));
    if !is_separator(first.trim_end_matches('\r')) {
        return None;
    }
    let (second, after) = after_first.split_once('\n').unwrap_or((after_first, ""));
    let path = second.trim_end_matches('\r').strip_prefix("# Source: ")?;
    Some((path.trim(), after))
}

/// The length of a template document: up to the next `---` line (helm splits templates at them,
/// so the next one is its own), unless a `# Source:` line that helm cannot have written follows
/// it (then this is a CRD file after all, whose bytes were not known).
fn template_body(text: &str, root: Option<&str>) -> usize {
    next_separator(text, |from| {
        header(from).is_none_or(|(path, _)| helm_could_write(path, root))
    })
    .unwrap_or(text.len())
}

/// Whether helm could have written `# Source: path` for a chart whose top chart is `root`: a file
/// of `crds/` or `templates/` of that chart or of a chart in its `charts/` directories. Before
/// the first header (`root` None: helm's output of a chart with nothing but hooks begins with an
/// empty line) any chart's.
fn helm_could_write(path: &str, root: Option<&str>) -> bool {
    let (chart, file) = attribute(path);
    root.is_none_or(|root| chart.split('/').next() == Some(root))
        && (file.starts_with("crds/") || file.starts_with("templates/"))
}

/// The byte offset of the first `---` line of `text` (not its first line's start unless it is
/// one) for which `accept` holds of the text from there on.
fn next_separator(text: &str, accept: impl Fn(&str) -> bool) -> Option<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if is_separator(line.trim_end_matches(['\n', '\r'])) && accept(&text[offset..]) {
            return Some(offset);
        }
        offset += line.len();
    }
    None
}

/// The length of the printed CRD file `path` when its bytes are known: the longest file of that
/// name whose bytes the text begins with, followed by helm's newline and then the end or the next
/// header.
fn crd_body(text: &str, path: &str, crd_files: &[&ChartFile]) -> Option<usize> {
    let (_, name) = attribute(path);
    crd_files
        .iter()
        .filter(|file| file.name == name)
        .map(|file| file.data.as_slice())
        .filter(|data| {
            let bytes = text.as_bytes();
            bytes.starts_with(data)
                && bytes.get(data.len()) == Some(&b'\n')
                && text.is_char_boundary(data.len() + 1)
                && {
                    let after = &text[data.len() + 1..];
                    after.is_empty() || header(after).is_some()
                }
        })
        .map(|data| data.len() + 1)
        .max()
}

/// The length of a printed CRD file whose bytes are not known: up to the next `---` line followed
/// by a `# Source:` line that names a `crds/` or `templates/` file of the top chart `root`.
fn crd_body_by_headers(text: &str, root: Option<&str>) -> usize {
    next_separator(text, |from| {
        header(from).is_some_and(|(path, _)| helm_could_write(path, root))
    })
    .unwrap_or(text.len())
}

/// The documents of `body` (split at its `---` lines), each with `source`. A body right after a
/// header is kept even when empty, so that a template that printed nothing is still seen.
fn push_documents<'a>(
    documents: &mut Vec<RawDocument<'a>>,
    source: Option<&'a str>,
    body: &str,
    after_header: bool,
) {
    let mut current = String::new();
    let mut first = true;
    for line in body.lines() {
        if is_separator(line) {
            if !current.trim().is_empty() || (first && after_header) {
                documents.push(RawDocument {
                    source,
                    text: std::mem::take(&mut current),
                });
            }
            current.clear();
            first = false;
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.trim().is_empty() || (first && after_header) {
        documents.push(RawDocument {
            source,
            text: current,
        });
    }
}

fn is_separator(line: &str) -> bool {
    match line.strip_prefix("---") {
        Some(rest) => {
            let rest = rest.trim();
            rest.is_empty() || rest.starts_with('#')
        }
        None => false,
    }
}

/// Splits a `# Source:` path into the chart path and the file inside that chart:
/// `foo/charts/bar/templates/x.yaml` is chart `foo/bar`, file `templates/x.yaml`.
pub fn attribute(source: &str) -> (String, String) {
    let parts: Vec<&str> = source.split('/').collect();
    let mut chart = vec![parts.first().copied().unwrap_or_default()];
    let mut index = 1;
    while index + 1 < parts.len() && parts[index] == "charts" {
        chart.push(parts[index + 1]);
        index += 2;
    }
    (chart.join("/"), parts[index.min(parts.len())..].join("/"))
}

/// Parses the output of `helm template` into attributed documents, without the bytes of the
/// chart's `crds/` files (see [`parse_output_with`]): for output written by hand.
pub fn parse_output(output: &str, tree: &ChartTree) -> Result<Rendered, RenderError> {
    parse_output_with(output, tree, &[])
}

/// Parses the output of `helm template` into attributed documents; `crd_files` are the `crds/`
/// files of the chart helm rendered ([`Chart::crd_files`]), which helm prints whole, their own
/// `---` lines and `# Source:` comments included.
pub fn parse_output_with(
    output: &str,
    tree: &ChartTree,
    crd_files: &[&ChartFile],
) -> Result<Rendered, RenderError> {
    let mut rendered = Rendered::default();
    for (index, raw) in split_output(output, crd_files).into_iter().enumerate() {
        let Some(source) = raw.source else {
            return Err(RenderError::NoSource { index: index + 1 });
        };
        let value = crate::yaml::parse(&raw.text).map_err(|e| RenderError::Document {
            source_path: source.to_string(),
            message: format!("{}invalid YAML at {e}", resource_hint(&raw.text)),
        })?;
        if value.is_null() {
            continue;
        }
        let (chart, template) = attribute(source);
        if tree.find(&chart).is_none() {
            return Err(RenderError::UnknownChart {
                source_path: source.to_string(),
                chart,
                root: tree.root.path.clone(),
                enabled: tree
                    .charts()
                    .iter()
                    .map(|c| c.path.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let (objects, from_list) = flatten(value, source)?;
        for object in objects {
            // An item of a List gets its own text, so that printing every document does not
            // repeat the whole List.
            let text = if from_list {
                serde_yaml_ng::to_string(&object).map_err(|e| RenderError::Document {
                    source_path: source.to_string(),
                    message: format!("cannot print an item of a List: {e}"),
                })?
            } else {
                raw.text.clone()
            };
            let document = Document {
                chart: chart.clone(),
                template: template.clone(),
                source: source.to_string(),
                object,
                text,
            };
            check_object(&document)?;
            if template.starts_with("crds/") {
                rendered.crds.push(document);
            } else if document.is_hook() {
                rendered.hooks.push(document);
            } else {
                rendered.resources.push(document);
            }
        }
    }
    Ok(rendered)
}

/// `kind: List` documents hold their objects in `items`; Helm applies each of them. Returns the
/// objects and whether they came out of a List.
fn flatten(value: Value, source: &str) -> Result<(Vec<Value>, bool), RenderError> {
    let is_list = value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind == "List")
        && value.get("items").is_some();
    if !is_list {
        return Ok((vec![value], false));
    }
    match value.get("items") {
        Some(Value::Array(items)) => Ok((items.clone(), true)),
        Some(Value::Null) => Ok((Vec::new(), true)),
        _ => Err(RenderError::Document {
            source_path: source.to_string(),
            message: "kind List whose items is not a list".to_string(),
        }),
    }
}

/// A rendered document must be a Kubernetes object with apiVersion, kind and metadata.name.
fn check_object(document: &Document) -> Result<(), RenderError> {
    let error = |message: String| RenderError::Document {
        source_path: document.source.clone(),
        message,
    };
    if !document.object.is_object() {
        return Err(error(format!(
            "the document is {}, not a Kubernetes object",
            crate::chart::describe(&document.object)
        )));
    }
    let mut missing = Vec::new();
    if document.api_version().is_empty() {
        missing.push("apiVersion");
    }
    if document.kind().is_empty() {
        missing.push("kind");
    }
    if document.name().is_empty() {
        missing.push("metadata.name");
    }
    if missing.is_empty() {
        return Ok(());
    }
    let what = match (document.kind(), document.name()) {
        ("", "") => "an object".to_string(),
        (kind, "") => format!("a {kind}"),
        ("", name) => format!("object {name}"),
        (kind, name) => format!("{kind}/{name}"),
    };
    Err(error(format!("{what} without {}", missing.join(", "))))
}

/// `Kind/name: ` for a document that failed to parse, when its text shows them.
fn resource_hint(text: &str) -> String {
    let mut kind = None;
    let mut name = None;
    let mut in_metadata = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("kind:") {
            kind = Some(rest.trim().trim_matches(['"', '\'']).to_string());
        }
        if line.starts_with("metadata:") {
            in_metadata = true;
            continue;
        }
        if in_metadata {
            if !line.starts_with(' ') {
                in_metadata = false;
            } else if let Some(rest) = line.trim_start().strip_prefix("name:")
                && line.len() - line.trim_start().len() == 2
            {
                name = Some(rest.trim().trim_matches(['"', '\'']).to_string());
            }
        }
    }
    match (kind, name) {
        (Some(kind), Some(name)) => format!("{kind}/{name}: "),
        (Some(kind), None) => format!("{kind}: "),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribution_of_source_paths() {
        let cases = [
            ("foo/templates/a.yaml", "foo", "templates/a.yaml"),
            (
                "foo/charts/bar/templates/a.yaml",
                "foo/bar",
                "templates/a.yaml",
            ),
            (
                "foo/charts/bar/charts/baz/templates/x/a.yaml",
                "foo/bar/baz",
                "templates/x/a.yaml",
            ),
            ("foo/crds/c.yaml", "foo", "crds/c.yaml"),
            ("foo/charts/bar/crds/c.yaml", "foo/bar", "crds/c.yaml"),
            (
                "foo/templates/charts/a.yaml",
                "foo",
                "templates/charts/a.yaml",
            ),
        ];
        for (source, chart, template) in cases {
            assert_eq!(
                attribute(source),
                (chart.to_string(), template.to_string()),
                "{source}"
            );
        }
    }

    #[test]
    fn splitting_keeps_sources_and_drops_empty_documents() {
        let output = "---\n# Source: foo/crds/c.yaml\nkind: A\n---\nkind: B\n\n---\n# Source: foo/templates/e.yaml\n---\n# Source: foo/templates/x.yaml\nkind: C\n";
        let docs = split_output(output, &[]);
        let summary: Vec<(Option<&str>, &str)> =
            docs.iter().map(|d| (d.source, d.text.trim())).collect();
        assert_eq!(
            summary,
            vec![
                (Some("foo/crds/c.yaml"), "kind: A"),
                (Some("foo/crds/c.yaml"), "kind: B"),
                (Some("foo/templates/e.yaml"), ""),
                (Some("foo/templates/x.yaml"), "kind: C"),
            ]
        );
    }

    /// A chart of nothing but hooks: helm's output begins with an empty line (its empty manifests),
    /// then the hooks, each with its header.
    #[test]
    fn output_that_begins_with_an_empty_line_keeps_its_sources() {
        let output = "\n---\n# Source: hooked/templates/migrate.yaml\nkind: Job\n---\n# Source: hooked/templates/b.yaml\nkind: B\n";
        let docs = split_output(output, &[]);
        assert_eq!(
            summary(&docs),
            vec![
                (Some("hooked/templates/migrate.yaml"), "kind: Job"),
                (Some("hooked/templates/b.yaml"), "kind: B"),
            ]
        );
    }

    /// What helm prints for a chart whose CRD file and template carry their own `# Source:`
    /// comments, the CRD file copied from another chart's `helm template` output.
    const OWN_SOURCES: &str = "---\n# Source: foo/crds/c.yaml\n---\n# Source: foo/templates/crds.yaml\nkind: A\n---\n# Source: https://x/crd?ref=v1\nkind: B\n\n---\n# Source: foo/charts/bar/crds/d.yaml\n# Source: config/crd/d.yaml\nkind: D\n---\n# Source: foo/templates/x.yaml\n# Source: https://x/x.yaml\nkind: C\n";

    fn summary<'a>(docs: &'a [RawDocument<'a>]) -> Vec<(Option<&'a str>, &'a str)> {
        docs.iter()
            .filter(|d| !d.text.trim().is_empty())
            .map(|d| (d.source, d.text.trim()))
            .collect()
    }

    #[test]
    fn a_crd_file_is_the_bytes_the_chart_holds() {
        let files = [
            ChartFile {
                name: "crds/c.yaml".to_string(),
                data: b"---\n# Source: foo/templates/crds.yaml\nkind: A\n---\n# Source: https://x/crd?ref=v1\nkind: B\n".to_vec(),
            },
            ChartFile {
                name: "crds/d.yaml".to_string(),
                data: b"# Source: config/crd/d.yaml\nkind: D".to_vec(),
            },
        ];
        let files: Vec<&ChartFile> = files.iter().collect();
        let docs = split_output(OWN_SOURCES, &files);
        assert_eq!(
            summary(&docs),
            vec![
                (
                    Some("foo/crds/c.yaml"),
                    "# Source: foo/templates/crds.yaml\nkind: A"
                ),
                (
                    Some("foo/crds/c.yaml"),
                    "# Source: https://x/crd?ref=v1\nkind: B"
                ),
                (
                    Some("foo/charts/bar/crds/d.yaml"),
                    "# Source: config/crd/d.yaml\nkind: D"
                ),
                (
                    Some("foo/templates/x.yaml"),
                    "# Source: https://x/x.yaml\nkind: C"
                ),
            ]
        );
    }

    #[test]
    fn without_the_bytes_a_crd_file_ends_where_helm_could_have_written_a_source() {
        // Only the comment that names a file helm could print is taken for helm's.
        let docs = split_output(OWN_SOURCES, &[]);
        assert_eq!(
            summary(&docs),
            vec![
                (Some("foo/templates/crds.yaml"), "kind: A"),
                (
                    Some("foo/templates/crds.yaml"),
                    "# Source: https://x/crd?ref=v1\nkind: B"
                ),
                (
                    Some("foo/charts/bar/crds/d.yaml"),
                    "# Source: config/crd/d.yaml\nkind: D"
                ),
                (
                    Some("foo/templates/x.yaml"),
                    "# Source: https://x/x.yaml\nkind: C"
                ),
            ]
        );
    }

    #[test]
    fn a_file_of_another_name_or_other_bytes_is_not_taken_for_the_crd_file() {
        let other = [
            ChartFile {
                name: "crds/other.yaml".to_string(),
                data: b"---\n# Source: foo/templates/crds.yaml\nkind: A\n---\n# Source: https://x/crd?ref=v1\nkind: B\n".to_vec(),
            },
            ChartFile {
                name: "crds/c.yaml".to_string(),
                data: b"kind: Z\n".to_vec(),
            },
        ];
        let other: Vec<&ChartFile> = other.iter().collect();
        assert_eq!(
            summary(&split_output(OWN_SOURCES, &other)),
            summary(&split_output(OWN_SOURCES, &[]))
        );
    }

    #[test]
    fn resource_hint_reads_kind_and_name() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n  labels:\n    name: x\ndata: [\n";
        assert_eq!(resource_hint(text), "ConfigMap/web: ");
        assert_eq!(resource_hint("a: ["), "");
    }
}
