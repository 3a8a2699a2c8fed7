//! Charts: loading a chart's Chart.yaml files, and the tree of the charts Helm rendered.
//!
//! [`load`] reads a chart directory or packaged `.tgz` with every subchart in `charts/`
//! (directories or `.tgz`, nested up to [`Limits::depth`] levels), keeping what sequencing needs
//! from each Chart.yaml, within one budget for the whole tree ([`Limits`]). Which subcharts are enabled is Helm's decision, read from what `helm template`
//! rendered: [`tree`] builds the [`ChartTree`] of the charts that rendered something, each with
//! its chart path (`foo`, `foo/bar`). [`source`] fetches remote charts into a cache.

pub mod egress;
pub mod helmignore;
mod load;
pub mod metadata;
pub mod pin;
pub mod source;
mod tree;
pub mod verify;

pub use load::{
    Gathered, Limit, Limits, gather, gather_archive, load, load_archive, load_archive_with,
};
pub use metadata::{Dependency, Metadata};
pub use tree::{ChartNode, ChartTree, tree};

use std::fmt;

use serde_json::Value;

/// A chart as loaded, with every chart in its charts/ directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub metadata: Metadata,
    /// Every chart found in charts/, sorted by file name.
    pub subcharts: Vec<Chart>,
    /// Where the chart was read from, for messages.
    pub location: Location,
    /// The files of its `crds/` directory that Helm reads as CRDs (`.yaml`, `.yml`, `.json`, at
    /// any depth), as Helm's loader holds them: `helm template --include-crds` prints each whole.
    pub crds: Vec<ChartFile>,
}

/// A file of a chart: its name inside the chart (`crds/widgets.yaml`) and its bytes, with a
/// byte order mark removed as Helm's loader removes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartFile {
    pub name: String,
    pub data: Vec<u8>,
}

impl Chart {
    /// The `crds/` files of this chart and of every chart in its charts/ directories.
    pub fn crd_files(&self) -> Vec<&ChartFile> {
        let mut files: Vec<&ChartFile> = self.crds.iter().collect();
        for sub in &self.subcharts {
            files.extend(sub.crd_files());
        }
        files
    }
}

/// Whether Helm reads a file of `crds/` as a CRD: by its extension, as `hasManifestExtension`.
pub(crate) fn is_crd_file(name: &str) -> bool {
    name.starts_with("crds/")
        && [".yaml", ".yml", ".json"]
            .iter()
            .any(|extension| name.ends_with(extension))
}

/// Where a chart's files are: a directory, or a place inside a packaged chart (possibly inside
/// another packaged chart). Used to name files in error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The directory or archive as the user named it, with the path inside archives
    /// (`foo-1.0.0.tgz:charts/bar-0.1.0.tgz:`).
    root: String,
    /// The chart's directory relative to `root`, empty or ending in `/`.
    inner: String,
    /// How much of `root` names the top chart (the rest is the way down to this one).
    top: usize,
}

impl Location {
    /// A chart directory on disk.
    pub fn directory(path: impl Into<String>) -> Self {
        let mut root = path.into();
        if !root.ends_with('/') {
            root.push('/');
        }
        Location {
            top: root.len(),
            root,
            inner: String::new(),
        }
    }

    /// A packaged chart on disk.
    pub fn archive(path: impl Into<String>) -> Self {
        let root = format!("{}:", path.into());
        Location {
            top: root.len(),
            root,
            inner: String::new(),
        }
    }

    /// The subchart directory `charts/NAME` of this chart.
    fn subchart_directory(&self, name: &str) -> Self {
        Location {
            root: self.root.clone(),
            inner: format!("{}charts/{name}/", self.inner),
            top: self.top,
        }
    }

    /// The directory `relative` (to this chart, such as `charts/a/charts/b`) as a subchart.
    fn subchart_path(&self, relative: &str) -> Self {
        Location {
            root: self.root.clone(),
            inner: format!("{}{relative}/", self.inner),
            top: self.top,
        }
    }

    /// The packaged subchart `charts/NAME.tgz` of this chart.
    fn subchart_archive(&self, file_name: &str) -> Self {
        Location {
            root: format!("{}{}charts/{file_name}:", self.root, self.inner),
            inner: String::new(),
            top: self.top,
        }
    }

    /// How to name a file of this chart in a message.
    pub fn file(&self, name: &str) -> String {
        format!("{}{}{name}", self.root, self.inner)
    }

    /// The top chart, as the user named it.
    pub fn top(&self) -> String {
        let top = &self.root[..self.top];
        top.strip_suffix([':', '/']).unwrap_or(top).to_string()
    }

    /// The way from the top chart to the file `name` of this chart (to this chart itself when
    /// `name` is empty): `charts/bar-0.1.0.tgz:templates/a.yaml`.
    pub fn inside(&self, name: &str) -> String {
        let file = self.file(name);
        file[self.top..].trim_end_matches(['/', ':']).to_string()
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = format!("{}{}", self.root, self.inner);
        f.write_str(full.trim_end_matches(['/', ':']))
    }
}

/// Why a chart could not be loaded or resolved. Every message names the file or chart.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("chart {path}: no such file or directory")]
    NotFound { path: String },
    #[error("{path} is not a chart: {reason}")]
    NotAChart { path: String, reason: String },
    #[error("{path}: {message}")]
    Read { path: String, message: String },
    #[error("chart archive {path}: {message}")]
    Archive { path: String, message: String },
    #[error("{file}: {message}")]
    ChartYaml { file: String, message: String },
    /// The chart tree goes past one of the loader's [`Limits`]: `inside` is the way from the
    /// top chart to the file or subchart where it did (empty: the top archive itself).
    #[error("chart {chart}: {}{limit}", if inside.is_empty() { String::new() } else { format!("{inside}: ") })]
    TooLarge {
        chart: String,
        inside: String,
        limit: Limit,
    },
}

impl ChartError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            ChartError::NotFound { .. } => "not_found",
            ChartError::NotAChart { .. } => "not_a_chart",
            ChartError::Read { .. } => "io",
            ChartError::Archive { .. } => "archive",
            ChartError::ChartYaml { .. } => "chart_yaml",
            ChartError::TooLarge { .. } => "too_large",
        }
    }
}

/// An I/O error in words, without the `(os error 2)` suffix.
pub(crate) fn io_message(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => {
            let text = error.to_string();
            match text.find(" (os error") {
                Some(at) => text[..at].to_string(),
                None => text,
            }
        }
    }
}

/// A few words naming the type of a value, for error messages.
pub fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}
