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

use crate::chart::ChartTree;
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

/// The chart path (`foo`, `foo/bar`) of every document in the output of `helm template`.
pub fn rendered_charts(output: &str) -> BTreeSet<String> {
    split_output(output)
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

/// Splits helm's output at `---` lines, reading the `# Source:` line of each document. A document
/// without one (several documents in one file of `crds/`) belongs to the source before it.
fn split_output(output: &str) -> Vec<RawDocument<'_>> {
    let mut documents = Vec::new();
    let mut current = RawDocument {
        source: None,
        text: String::new(),
    };
    let mut last_source = None;
    for line in output.lines() {
        if is_separator(line) {
            if !current.text.trim().is_empty() || current.source.is_some() {
                documents.push(current);
            }
            current = RawDocument {
                source: last_source,
                text: String::new(),
            };
            continue;
        }
        if current.text.is_empty()
            && let Some(source) = line.strip_prefix("# Source: ")
        {
            current.source = Some(source.trim());
            last_source = current.source;
            continue;
        }
        current.text.push_str(line);
        current.text.push('\n');
    }
    if !current.text.trim().is_empty() {
        documents.push(current);
    }
    documents
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

/// Parses the output of `helm template` into attributed documents.
pub fn parse_output(output: &str, tree: &ChartTree) -> Result<Rendered, RenderError> {
    let mut rendered = Rendered::default();
    for (index, raw) in split_output(output).into_iter().enumerate() {
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
        let docs = split_output(output);
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

    #[test]
    fn resource_hint_reads_kind_and_name() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\n  labels:\n    name: x\ndata: [\n";
        assert_eq!(resource_hint(text), "ConfigMap/web: ");
        assert_eq!(resource_hint("a: ["), "");
    }
}
