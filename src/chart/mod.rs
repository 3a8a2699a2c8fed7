//! Charts: loading a chart and its whole subchart tree, and deciding which subcharts are enabled.
//!
//! [`load`] reads a chart directory or packaged `.tgz` with every subchart in `charts/`
//! (directories or `.tgz`, nested at any depth), keeping what sequencing needs from each
//! Chart.yaml. [`resolve`] then applies the merged values the way Helm does (conditions, tags,
//! aliases) and gives the [`ChartTree`] of enabled charts, each with its chart path (`foo`,
//! `foo/bar`). [`source`] fetches remote charts into a cache.

pub mod constraint;
mod deps;
pub mod helmignore;
mod load;
pub mod metadata;
pub mod source;
pub mod strvals;
pub mod values;

pub use deps::{ChartNode, ChartTree, DisabledDependency, resolve};
pub use load::{load, load_archive};
pub use metadata::{Dependency, Metadata};
pub use values::Values;

use std::fmt;

/// A chart as loaded, before values decide which subcharts are enabled.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub metadata: Metadata,
    /// The chart's values.yaml.
    pub values: Values,
    /// Every chart found in charts/, sorted by file name.
    pub subcharts: Vec<Chart>,
    /// Where the chart was read from, for messages.
    pub location: Location,
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
}

impl Location {
    /// A chart directory on disk.
    pub fn directory(path: impl Into<String>) -> Self {
        let mut root = path.into();
        if !root.ends_with('/') {
            root.push('/');
        }
        Location {
            root,
            inner: String::new(),
        }
    }

    /// A packaged chart on disk.
    pub fn archive(path: impl Into<String>) -> Self {
        Location {
            root: format!("{}:", path.into()),
            inner: String::new(),
        }
    }

    /// The subchart directory `charts/NAME` of this chart.
    fn subchart_directory(&self, name: &str) -> Self {
        Location {
            root: self.root.clone(),
            inner: format!("{}charts/{name}/", self.inner),
        }
    }

    /// The packaged subchart `charts/NAME.tgz` of this chart.
    fn subchart_archive(&self, file_name: &str) -> Self {
        Location {
            root: format!("{}{}charts/{file_name}:", self.root, self.inner),
            inner: String::new(),
        }
    }

    /// How to name a file of this chart in a message.
    pub fn file(&self, name: &str) -> String {
        format!("{}{}{name}", self.root, self.inner)
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
    #[error("{file}: {message}")]
    Values { file: String, message: String },
    #[error("{flag} {input:?}: {message}")]
    ValueFlag {
        flag: &'static str,
        input: String,
        message: String,
    },
    #[error(
        "chart {chart} ({file}): found in Chart.yaml, but missing in charts/ directory: {names}"
    )]
    MissingDependencies {
        chart: String,
        file: String,
        names: String,
    },
    #[error("chart {chart}: {message}")]
    Coalesce { chart: String, message: String },
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
            ChartError::Values { .. } | ChartError::ValueFlag { .. } => "values",
            ChartError::MissingDependencies { .. } => "missing_dependency",
            ChartError::Coalesce { .. } => "values",
        }
    }
}

/// The values a user gives on the command line, merged as Helm merges them: every values file in
/// order, then `--set-json`, `--set`, `--set-string` and `--set-literal`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueOptions {
    pub files: Vec<std::path::PathBuf>,
    pub set_json: Vec<String>,
    pub set: Vec<String>,
    pub set_string: Vec<String>,
    pub set_literal: Vec<String>,
}

impl ValueOptions {
    /// The merged user values. Errors name the file or the flag.
    pub fn merge(&self) -> Result<Values, ChartError> {
        let mut merged = Values::new();
        for file in &self.files {
            let display = file.display().to_string();
            let text = std::fs::read_to_string(file).map_err(|e| ChartError::Read {
                path: display.clone(),
                message: io_message(&e),
            })?;
            let values = values::parse_values(&text).map_err(|message| ChartError::Values {
                file: display,
                message,
            })?;
            merged = values::merge_maps(merged, values);
        }
        type Parser = fn(&str, &mut Values) -> Result<(), strvals::Error>;
        let flags: [(&'static str, &[String], Parser); 4] = [
            ("--set-json", &self.set_json, strvals::parse_set_json),
            ("--set", &self.set, strvals::parse_set),
            ("--set-string", &self.set_string, strvals::parse_set_string),
            (
                "--set-literal",
                &self.set_literal,
                strvals::parse_set_literal,
            ),
        ];
        for (flag, inputs, parse) in flags {
            for input in inputs {
                parse(input, &mut merged).map_err(|e| ChartError::ValueFlag {
                    flag,
                    input: input.clone(),
                    message: e.to_string(),
                })?;
            }
        }
        Ok(merged)
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
