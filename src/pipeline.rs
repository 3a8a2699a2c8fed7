//! The one chart pipeline, used by the CLI (`template`, `graph`, `lint`) and the operator alike:
//! source -> resolve -> fetch -> load -> render -> plan.
//!
//! - [`resolve`] turns a chart source into one chart on disk, a version range into one version
//!   (so that the digest of a release hashes what will be deployed, never the range's text);
//! - [`render`] runs `helm template` with the values files in order and attributes every
//!   document to the chart of the tree it came from;
//! - [`plan`] is the pure planner.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::api::Reason;
use crate::chart::source::{ChartCache, ChartReference, Credentials, SourceError};
use crate::chart::{ChartError, ChartTree, ValueOptions};
use crate::helm::Helm;
use crate::plan::{Plan, PlanError};
use crate::render::{RenderError, RenderOptions};

/// Where the chart comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ChartSource {
    /// A path, a chart repository or an OCI registry.
    Reference(ChartReference),
    /// A packaged chart (.tgz) held elsewhere (a ConfigMap or Secret); `origin` names it.
    Packaged { origin: String, bytes: Vec<u8> },
}

/// A values file given to helm (`-f`), in order; `origin` names it in errors (a path, or the
/// spec field it came from).
#[derive(Debug, Clone, PartialEq)]
pub struct ValuesFile {
    pub origin: String,
    pub text: String,
}

/// `--set`, `--set-string`, `--set-json` and `--set-literal` flags, passed to helm as they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueFlags {
    pub set: Vec<String>,
    pub set_string: Vec<String>,
    pub set_json: Vec<String>,
    pub set_literal: Vec<String>,
}

/// A chart resolved to one version, on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The chart directory or packaged chart.
    pub path: PathBuf,
    /// The version a repository or registry chart resolved to.
    pub version: Option<String>,
    /// What identifies the chart for the digest: the source and resolved version of a remote
    /// chart, the content hash of a local or packaged one.
    pub identity: String,
}

/// What `helm template` is asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderRequest {
    pub release_name: String,
    pub namespace: String,
    pub values: Vec<ValuesFile>,
    pub flags: ValueFlags,
    /// `--kube-version`, `--api-versions`: the cluster's, for `.Capabilities`.
    pub kube_version: Option<String>,
    pub api_versions: Vec<String>,
    /// `.Release.IsUpgrade`.
    pub is_upgrade: bool,
}

/// A rendered chart: the tree of charts Helm enabled, and the documents attributed to them.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub tree: ChartTree,
    pub documents: crate::render::Rendered,
}

/// Why the pipeline stopped. Every message names the chart, file, source or values concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{origin}: {message}")]
    Values { origin: String, message: String },
    #[error("{0}")]
    Source(#[from] SourceError),
    #[error("{0}")]
    Chart(#[from] ChartError),
    #[error("{0}")]
    Render(#[from] RenderError),
    #[error("{0}")]
    Plan(#[from] PlanError),
    #[error("{what}: {message}")]
    Io { what: String, message: String },
}

impl Error {
    /// The reason users read when this stops a release.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Values { .. } => Reason::InvalidSpec,
            Error::Source(_) | Error::Io { .. } => Reason::ChartUnavailable,
            Error::Chart(_) => Reason::InvalidChart,
            Error::Render(_) => Reason::RenderFailed,
            Error::Plan(_) => Reason::PlanFailed,
        }
    }

    /// Whether trying again later may help: a download or a helm that did not start, as
    /// opposed to a chart that does not load, render or plan.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Source(_) | Error::Io { .. } => true,
            Error::Render(RenderError::Helm { source, .. }) => source.is_transient(),
            Error::Values { .. } | Error::Chart(_) | Error::Render(_) | Error::Plan(_) => false,
        }
    }

    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Values { .. } => "values",
            Error::Source(e) => e.category(),
            Error::Chart(e) => e.category(),
            Error::Render(e) => e.category(),
            Error::Plan(e) => e.category(),
            Error::Io { .. } => "io",
        }
    }
}

/// Makes the chart available on disk, resolved to one version.
pub async fn resolve(
    helm: &Helm,
    cache: &ChartCache,
    source: &ChartSource,
    credentials: Option<&Credentials>,
) -> Result<Resolved, Error> {
    let (helm, cache, source, credentials) = (
        helm.clone(),
        cache.clone(),
        source.clone(),
        credentials.cloned(),
    );
    blocking(move || resolve_blocking(&helm, &cache, &source, credentials.as_ref())).await
}

fn resolve_blocking(
    helm: &Helm,
    cache: &ChartCache,
    source: &ChartSource,
    credentials: Option<&Credentials>,
) -> Result<Resolved, Error> {
    match source {
        ChartSource::Reference(ChartReference::Path(path)) => {
            let mut hasher = Sha256::new();
            hash_path(&mut hasher, path, Path::new("")).map_err(|message| Error::Io {
                what: format!("chart {}", path.display()),
                message,
            })?;
            Ok(Resolved {
                path: path.clone(),
                version: None,
                identity: format!("path sha256:{}", hex::encode(hasher.finalize())),
            })
        }
        ChartSource::Reference(reference) => {
            let fetched = cache.fetch(helm, reference, credentials)?;
            let identity = match (reference, &fetched.version) {
                (ChartReference::Repository { url, name, .. }, Some(version)) => {
                    format!("repository {url} {name} {version}")
                }
                (ChartReference::Oci { reference, .. }, Some(version)) => {
                    format!("oci {reference} {version}")
                }
                _ => format!("reference {reference}"),
            };
            Ok(Resolved {
                path: fetched.path,
                version: fetched.version,
                identity,
            })
        }
        ChartSource::Packaged { origin, bytes } => {
            let io = |e: std::io::Error, path: &Path| Error::Io {
                what: format!("{origin}: {}", path.display()),
                message: crate::chart::io_message(&e),
            };
            let dir = cache.dir().join("packaged");
            std::fs::create_dir_all(&dir).map_err(|e| io(e, &dir))?;
            let digest = hex::encode(Sha256::digest(bytes));
            let path = dir.join(format!("{digest}.tgz"));
            if !path.exists() {
                std::fs::write(&path, bytes).map_err(|e| io(e, &path))?;
            }
            Ok(Resolved {
                path,
                version: None,
                identity: format!("packaged sha256:{digest}"),
            })
        }
    }
}

/// Hashes a file, or a directory's files in name order, without following symbolic links.
fn hash_path(hasher: &mut Sha256, path: &Path, relative: &Path) -> Result<(), String> {
    let display = || path.display().to_string();
    let metadata =
        std::fs::symlink_metadata(path).map_err(|e| format!("chart {}: {e}", display()))?;
    if metadata.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("chart {}: {e}", display()))?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        entries.sort();
        for name in entries {
            hash_path(hasher, &path.join(&name), &relative.join(&name))?;
        }
    } else if metadata.is_file() {
        let bytes = std::fs::read(path).map_err(|e| format!("chart {}: {e}", display()))?;
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(())
}

/// Renders the resolved chart with `helm template`.
pub async fn render(
    helm: &Helm,
    resolved: &Resolved,
    request: &RenderRequest,
) -> Result<Rendered, Error> {
    let (helm, resolved, request) = (helm.clone(), resolved.clone(), request.clone());
    blocking(move || render_blocking(&helm, &resolved, &request)).await
}

fn render_blocking(
    helm: &Helm,
    resolved: &Resolved,
    request: &RenderRequest,
) -> Result<Rendered, Error> {
    let mut merged = crate::chart::Values::new();
    let mut files = Vec::with_capacity(request.values.len());
    for values in &request.values {
        let parsed =
            crate::chart::values::parse_values(&values.text).map_err(|message| Error::Values {
                origin: values.origin.clone(),
                message,
            })?;
        merged = crate::chart::values::merge_maps(merged, parsed);
        let file = tempfile::Builder::new()
            .prefix("sequenced-values-")
            .suffix(".yaml")
            .tempfile()
            .map_err(|e| Error::Io {
                what: "values file".to_string(),
                message: e.to_string(),
            })?;
        std::fs::write(file.path(), &values.text).map_err(|e| Error::Io {
            what: "values file".to_string(),
            message: e.to_string(),
        })?;
        files.push(file);
    }
    let flags = &request.flags;
    let options = ValueOptions {
        files: Vec::new(),
        set_json: flags.set_json.clone(),
        set: flags.set.clone(),
        set_string: flags.set_string.clone(),
        set_literal: flags.set_literal.clone(),
    };
    let with_flags = options.merge()?;
    let values = crate::chart::values::merge_maps(merged, with_flags);
    let chart = crate::chart::load(&resolved.path)?;
    let tree = crate::chart::resolve(&chart, &values)?;
    let options = RenderOptions {
        release_name: request.release_name.clone(),
        namespace: request.namespace.clone(),
        values_files: files.iter().map(|f| f.path().to_path_buf()).collect(),
        set_json: flags.set_json.clone(),
        set: flags.set.clone(),
        set_string: flags.set_string.clone(),
        set_literal: flags.set_literal.clone(),
        kube_version: request.kube_version.clone(),
        api_versions: request.api_versions.clone(),
        is_upgrade: request.is_upgrade,
    };
    let documents = crate::render::render(helm, &resolved.path, &tree, &options)?;
    Ok(Rendered { tree, documents })
}

/// Plans a rendered chart (pure).
pub fn plan(rendered: Rendered) -> Result<Plan, Error> {
    Ok(crate::plan::plan(&rendered.tree, rendered.documents)?)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(Error::Io {
            what: "rendering".to_string(),
            message: format!("stopped: {e}"),
        })
    })
}
