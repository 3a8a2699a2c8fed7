//! The one chart pipeline, used by the CLI (`template`, `graph`, `lint`) and the operator alike:
//! source -> resolve -> fetch -> load -> render -> post-render -> plan.
//!
//! - [`resolve`] turns a chart source into one chart on disk, a version range into one version
//!   (so that the digest of a release hashes what will be deployed, never the range's text);
//! - [`load`] reads the chart's tree within the loader's limits (one budget for the whole tree:
//!   a chart past one never reaches helm);
//! - [`render`] (or [`render_loaded`], after [`load`]) runs `helm template` with the values files
//!   in order (and `--set` flags as they are), builds the tree of the charts Helm rendered from
//!   the Chart.yaml files and the chart paths of its output, and attributes every document to the
//!   chart of the tree it came from;
//! - [`post_render`] runs a release's `spec.postRenderers` (kustomize) over what helm rendered,
//!   every document keeping its attribution;
//! - [`plan`] is the pure planner.
//!
//! Helm merges the values, parses `--set`, decides which subcharts are enabled and resolves
//! version ranges; nothing here computes any of that a second time, but for what Flux does
//! itself: `valuesFrom[].targetPath` entries between values files are merged in their order
//! ([`values_files`]: map by map, each path set by helm's own `--set` parser).

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::api::{ChartArtifact, PostRenderer, Reason};
use crate::chart::source::{ChartCache, ChartReference, Credentials, FetchOptions, SourceError};
use crate::chart::verify::Verification;
use crate::chart::{ChartError, ChartTree};
use crate::helm::{Helm, HelmError};
use crate::kubectl::Kubectl;
use crate::plan::{Plan, PlanError};
use crate::render::postrender::PostRenderError;
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

/// One entry of a release's values, in the order Helm merges them: a values file, or a key's
/// value set at a values path (`valuesFrom[].targetPath`).
#[derive(Debug, Clone, PartialEq)]
pub enum ValuesEntry {
    File(ValuesFile),
    /// `origin` names the entry in errors; `value` is the key's text as it is.
    TargetPath {
        origin: String,
        path: String,
        value: String,
    },
}

impl ValuesEntry {
    /// What the digest reads of it.
    pub fn digest_input(&self) -> crate::digest::ValuesInput<'_> {
        match self {
            ValuesEntry::File(file) => crate::digest::ValuesInput::File(&file.text),
            ValuesEntry::TargetPath { path, value, .. } => {
                crate::digest::ValuesInput::TargetPath { path, value }
            }
        }
    }
}

/// The values files helm is given for these entries: the files as they are when no entry sets
/// a path; else one file, the entries merged in order as Flux merges them (files map by map,
/// later ones win; a path set with Helm's own `--set` parser, by helm itself, or with
/// `--set-string` when the value is in single or double quotes, which are dropped).
pub async fn values_files(helm: &Helm, entries: &[ValuesEntry]) -> Result<Vec<ValuesFile>, Error> {
    if !entries
        .iter()
        .any(|e| matches!(e, ValuesEntry::TargetPath { .. }))
    {
        return Ok(entries
            .iter()
            .filter_map(|e| match e {
                ValuesEntry::File(file) => Some(file.clone()),
                ValuesEntry::TargetPath { .. } => None,
            })
            .collect());
    }
    let mut merged = serde_json::Map::new();
    let mut origins = Vec::with_capacity(entries.len());
    for entry in entries {
        match entry {
            ValuesEntry::File(file) => {
                origins.push(file.origin.clone());
                // Checked as helm checks a -f file, so that a bad one is named.
                check_values(file)?;
                if let Ok(Value::Object(map)) = crate::yaml::parse(&file.text) {
                    merge_values(&mut merged, map);
                }
            }
            ValuesEntry::TargetPath {
                origin,
                path,
                value,
            } => {
                origins.push(origin.clone());
                merged = set_path(helm, merged, origin, path, value).await?;
            }
        }
    }
    Ok(vec![ValuesFile {
        origin: origins.join(", "),
        text: Value::Object(merged).to_string(),
    }])
}

/// `values` with `value` set at `path`. Helm's own `--set` parser reads the path (a chart of
/// one template that prints `.Values` is rendered with them), but never the value: it may be a
/// Secret's, and helm's command line is readable by every process of the node and its errors
/// end up in statuses. Helm sets a random token at the path, which is then replaced by the
/// value, typed as `--set` types a scalar ([`typed`]).
async fn set_path(
    helm: &Helm,
    values: serde_json::Map<String, Value>,
    origin: &str,
    path: &str,
    value: &str,
) -> Result<serde_json::Map<String, Value>, Error> {
    let io = |e: std::io::Error| Error::Io {
        what: format!("{origin}: a chart to set the values path with"),
        message: crate::chart::io_message(&e),
    };
    let chart = values_chart("sequenced-set-").map_err(io)?;
    let current = values_file(&ValuesFile {
        origin: origin.to_string(),
        text: Value::Object(values).to_string(),
    })?;
    let token = format!(
        "sequenced-value-{:016x}{:016x}",
        fastrand::u64(..),
        fastrand::u64(..)
    );
    let options = RenderOptions {
        release_name: "values".to_string(),
        namespace: "default".to_string(),
        values_files: vec![current.path().to_path_buf()],
        set_string: vec![format!("{path}={token}")],
        ..RenderOptions::default()
    };
    let output = match crate::render::template(helm, chart.path(), &options).await {
        Ok(output) => output,
        Err(crate::render::RenderError::Helm {
            source: HelmError::Failed { stderr, .. },
            ..
        }) => {
            // What helm says names the path and the token, never the value.
            return Err(Error::Values {
                origin: origin.to_string(),
                message: format!(
                    "cannot set values path {path}: {}",
                    crate::helm::gist(&stderr).replace(&token, "<value>")
                ),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let printed = output
        .lines()
        .filter(|l| !l.starts_with("---") && !l.starts_with("# Source:"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut merged = match serde_json::from_str::<Value>(printed.trim()) {
        Ok(Value::Object(map)) => Value::Object(map),
        Ok(Value::Null) => Value::Object(serde_json::Map::new()),
        _ => {
            return Err(Error::Io {
                what: format!("{origin}: setting values path {path}"),
                message: "helm printed no values object".to_string(),
            });
        }
    };
    if !replace_token(&mut merged, &token, &typed(value)) {
        return Err(Error::Values {
            origin: origin.to_string(),
            message: format!("cannot set values path {path}: helm set nothing there"),
        });
    }
    match merged {
        Value::Object(map) => Ok(map),
        _ => Ok(serde_json::Map::new()),
    }
}

/// Replaces every string `token` in `value` by `with`; whether there was one.
fn replace_token(value: &mut Value, token: &str, with: &Value) -> bool {
    match value {
        Value::String(s) if s == token => {
            *value = with.clone();
            true
        }
        Value::Array(items) => {
            let mut found = false;
            for item in items {
                found |= replace_token(item, token, with);
            }
            found
        }
        Value::Object(map) => {
            let mut found = false;
            for item in map.values_mut() {
                found |= replace_token(item, token, with);
            }
            found
        }
        _ => false,
    }
}

/// The value a `valuesFrom[].targetPath` entry sets: in single or double quotes, the string
/// between them (as Flux reads it); else one scalar typed as Helm's `--set` types a scalar
/// (`true`, `false` and `null` in any case, and integers without a leading zero; anything else
/// is a string). The whole text is the value: a comma, brace or backslash in it (a password)
/// is kept as it is, where `--set` would split it or fail.
pub fn typed(text: &str) -> Value {
    let quoted = text.len() >= 2
        && ((text.starts_with('"') && text.ends_with('"'))
            || (text.starts_with('\'') && text.ends_with('\'')));
    if quoted {
        return Value::String(text[1..text.len() - 1].to_string());
    }
    if text.eq_ignore_ascii_case("true") {
        return Value::Bool(true);
    }
    if text.eq_ignore_ascii_case("false") {
        return Value::Bool(false);
    }
    if text.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    if text == "0" {
        return Value::from(0);
    }
    if !text.starts_with('0')
        && let Ok(n) = text.parse::<i64>()
    {
        return Value::from(n);
    }
    Value::String(text.to_string())
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
    /// chart (with the pin, when the spec pins a digest), the content hash of a local or
    /// packaged one.
    pub identity: String,
    /// The archive's digests, for a remote or packaged chart.
    pub artifact: Option<ChartArtifact>,
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

/// A rendered chart: the tree of charts Helm rendered, and the documents attributed to them.
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
    #[error("{0}")]
    PostRender(#[from] PostRenderError),
    /// The chart did not verify (`spec.chart.verify`, `--verify`).
    #[error("{chart}: not verified (provider {provider}): {message}")]
    Verification {
        chart: String,
        provider: &'static str,
        message: String,
    },
}

impl Error {
    /// The reason users read when this stops a release.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Values { .. } => Reason::InvalidSpec,
            Error::Source(SourceError::NotAllowed { .. }) => Reason::SourceNotAllowed,
            Error::Source(SourceError::BadPin { .. }) => Reason::InvalidSpec,
            Error::Source(SourceError::DigestMismatch { .. }) => Reason::VerificationFailed,
            Error::Render(RenderError::Helm {
                source: HelmError::TooLarge { .. },
                ..
            }) => Reason::RenderTooLarge,
            Error::Source(_) | Error::Io { .. } => Reason::ChartUnavailable,
            Error::Chart(_) => Reason::InvalidChart,
            Error::Render(_) => Reason::RenderFailed,
            Error::Plan(_) => Reason::PlanFailed,
            Error::PostRender(_) => Reason::PostRenderFailed,
            Error::Verification { .. } => Reason::VerificationFailed,
        }
    }

    /// Whether trying again later may help: a download, or a helm that did not start or did not
    /// finish in time, as opposed to a chart that does not load, render or plan.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Source(e) => e.is_transient(),
            Error::Io { .. } => true,
            Error::Render(RenderError::Helm { source, .. }) => source.is_transient(),
            Error::PostRender(e) => e.is_transient(),
            Error::Values { .. }
            | Error::Chart(_)
            | Error::Render(_)
            | Error::Plan(_)
            | Error::Verification { .. } => false,
        }
    }

    /// Whether helm did not finish in time (rendering or pulling).
    pub fn timed_out(&self) -> bool {
        matches!(
            self,
            Error::Render(RenderError::Helm {
                source: HelmError::TimedOut { .. },
                ..
            }) | Error::Source(SourceError::Pull {
                source: HelmError::TimedOut { .. },
                ..
            })
        )
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
            Error::PostRender(e) => e.category(),
            Error::Verification { .. } => "verification_failed",
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
    resolve_verified(helm, cache, source, credentials, None).await
}

/// [`resolve`], then the chart verified as `verification` says before anything reads it: the
/// verified fact is in [`Resolved::artifact`]. A chart that does not verify is
/// [`Error::Verification`].
pub async fn resolve_verified(
    helm: &Helm,
    cache: &ChartCache,
    source: &ChartSource,
    credentials: Option<&Credentials>,
    verification: Option<&Verification>,
) -> Result<Resolved, Error> {
    resolve_with(helm, cache, source, credentials, verification, false).await
}

/// [`resolve_verified`]; with `refresh`, an exact version is fetched again even when it is
/// cached, so that bytes its source now serves under it are seen.
pub async fn resolve_with(
    helm: &Helm,
    cache: &ChartCache,
    source: &ChartSource,
    credentials: Option<&Credentials>,
    verification: Option<&Verification>,
    refresh: bool,
) -> Result<Resolved, Error> {
    let options = FetchOptions {
        provenance: verification.is_some_and(Verification::needs_provenance),
        refresh,
    };
    let mut resolved = resolve_unverified(helm, cache, source, credentials, options).await?;
    let Some(verification) = verification else {
        return Ok(resolved);
    };
    let (archive, check) = (resolved.path.clone(), verification.clone());
    let verified = blocking(move || Ok(crate::chart::verify::verify(&archive, &check))).await?;
    let version = resolved.version.as_deref().unwrap_or("(none)");
    let chart = match source {
        ChartSource::Reference(ChartReference::Repository { url, name, .. }) => {
            format!("chart {name} version {version} from {url}")
        }
        ChartSource::Reference(ChartReference::Oci { reference, .. }) => {
            format!("chart {reference} version {version}")
        }
        ChartSource::Reference(reference) => reference.to_string(),
        ChartSource::Packaged { origin, .. } => origin.clone(),
    };
    match verified {
        Ok(fact) => {
            if let Some(artifact) = resolved.artifact.as_mut() {
                artifact.verified = Some(fact);
            }
            Ok(resolved)
        }
        Err(failed) => Err(Error::Verification {
            chart,
            provider: verification.provider(),
            message: failed.0,
        }),
    }
}

async fn resolve_unverified(
    helm: &Helm,
    cache: &ChartCache,
    source: &ChartSource,
    credentials: Option<&Credentials>,
    options: FetchOptions,
) -> Result<Resolved, Error> {
    match source {
        ChartSource::Reference(ChartReference::Path(path)) => {
            let path = path.clone();
            blocking(move || local_chart(path)).await
        }
        ChartSource::Reference(reference) => {
            let fetched = cache
                .fetch_with(helm, reference, credentials, options)
                .await?;
            let mut identity = match (reference, &fetched.version) {
                (ChartReference::Repository { url, name, .. }, Some(version)) => {
                    format!("repository {url} {name} {version}")
                }
                (ChartReference::Oci { reference, .. }, Some(version)) => {
                    format!("oci {reference} {version}")
                }
                _ => format!("reference {reference}"),
            };
            // A pin in the version is part of what is asked for: changing it starts a
            // revision. (A pin in an OCI reference is in the reference already.)
            if let ChartReference::Repository { version, .. } | ChartReference::Oci { version, .. } =
                reference
                && let Some((_, pin)) = version.as_deref().and_then(|v| v.split_once('@'))
            {
                identity.push_str(&format!(" @{pin}"));
            }
            let artifact = fetched.digest.map(|digest| ChartArtifact {
                version: fetched.version.clone(),
                digest,
                oci_digest: fetched.oci_digest,
                verified: None,
            });
            Ok(Resolved {
                path: fetched.path,
                version: fetched.version,
                identity,
                artifact,
            })
        }
        ChartSource::Packaged { origin, bytes } => {
            let (dir, origin, bytes) =
                (cache.dir().join("packaged"), origin.clone(), bytes.clone());
            blocking(move || packaged_chart(&dir, &origin, &bytes)).await
        }
    }
}

/// A chart directory or packaged chart on disk, identified by its content.
fn local_chart(path: PathBuf) -> Result<Resolved, Error> {
    let display = path.display().to_string();
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ChartError::NotFound { path: display }.into());
        }
        Err(e) => {
            return Err(ChartError::Read {
                path: display,
                message: crate::chart::io_message(&e),
            }
            .into());
        }
        Ok(metadata) if metadata.is_dir() && !path.join("Chart.yaml").is_file() => {
            return Err(ChartError::NotAChart {
                path: display,
                reason: "the directory has no Chart.yaml".to_string(),
            }
            .into());
        }
        Ok(_) => {}
    }
    let mut hasher = Sha256::new();
    hash_path(&mut hasher, &path, Path::new("")).map_err(|message| Error::Io {
        what: format!("chart {display}"),
        message,
    })?;
    Ok(Resolved {
        path,
        version: None,
        identity: format!("path sha256:{}", hex::encode(hasher.finalize())),
        artifact: None,
    })
}

/// A packaged chart held elsewhere, written into the cache under its digest.
fn packaged_chart(dir: &Path, origin: &str, bytes: &[u8]) -> Result<Resolved, Error> {
    let io = |e: std::io::Error, path: &Path| Error::Io {
        what: format!("{origin}: {}", path.display()),
        message: crate::chart::io_message(&e),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
    let digest = hex::encode(Sha256::digest(bytes));
    let path = dir.join(format!("{digest}.tgz"));
    if !path.exists() {
        std::fs::write(&path, bytes).map_err(|e| io(e, &path))?;
    }
    Ok(Resolved {
        path,
        version: None,
        identity: format!("packaged sha256:{digest}"),
        artifact: Some(ChartArtifact {
            version: None,
            digest: format!("sha256:{digest}"),
            oci_digest: None,
            verified: None,
        }),
    })
}

/// Hashes a file, or a directory's files in name order, without following symbolic links.
fn hash_path(hasher: &mut Sha256, path: &Path, relative: &Path) -> Result<(), String> {
    let error = |e: std::io::Error| format!("{}: {}", path.display(), crate::chart::io_message(&e));
    let metadata = std::fs::symlink_metadata(path).map_err(error)?;
    if metadata.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(error)?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        entries.sort();
        for name in entries {
            hash_path(hasher, &path.join(&name), &relative.join(&name))?;
        }
    } else if metadata.is_file() {
        let bytes = std::fs::read(path).map_err(error)?;
        hasher.update(relative.to_string_lossy().as_bytes());
        hasher.update(b"\0");
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(())
}

/// A chart read within the loader's limits ([`crate::chart::Limits`]), ready to render: what
/// was wrong with its Chart.yaml files, if anything, is told after helm had its say.
#[derive(Debug)]
pub struct Loaded {
    chart: Result<crate::chart::Chart, ChartError>,
}

impl Loaded {
    /// The top chart's name, when its Chart.yaml files could be read.
    pub fn name(&self) -> Option<&str> {
        self.chart.as_ref().ok().map(|c| c.metadata.name.as_str())
    }
}

/// Reads the resolved chart's tree within the loader's limits. A chart past one (a
/// decompression bomb, a nesting too deep, an archive that leaves its directory) is refused
/// here, so that helm never reads it.
pub async fn load(resolved: &Resolved) -> Result<Loaded, Error> {
    let path = resolved.path.clone();
    blocking(move || {
        let gathered = crate::chart::gather(&path, &crate::chart::Limits::DEFAULT)?;
        Ok(Loaded {
            chart: gathered.build(),
        })
    })
    .await
}

/// Loads ([`load`]) and renders ([`render_loaded`]) the resolved chart.
pub async fn render(
    helm: &Helm,
    resolved: &Resolved,
    request: &RenderRequest,
) -> Result<Rendered, Error> {
    let loaded = load(resolved).await?;
    render_loaded(helm, resolved, loaded, request).await
}

/// Renders the resolved chart, loaded by [`load`], with `helm template`. A chart both helm and
/// the loader refuse is told in helm's words.
pub async fn render_loaded(
    helm: &Helm,
    resolved: &Resolved,
    loaded: Loaded,
    request: &RenderRequest,
) -> Result<Rendered, Error> {
    // The files live until helm has read them, and are removed when this returns.
    let files = request
        .values
        .iter()
        .map(values_file)
        .collect::<Result<Vec<_>, Error>>()?;
    let flags = &request.flags;
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
    let output = crate::render::template(helm, &resolved.path, &options).await?;
    drop(files);
    let chart = loaded.chart?;
    blocking(move || {
        let crd_files = chart.crd_files();
        let tree = crate::chart::tree(&chart, &crate::render::rendered_charts(&output, &crd_files));
        let documents = crate::render::parse_output_with(&output, &tree, &crd_files)?;
        Ok(Rendered { tree, documents })
    })
    .await
}

/// Runs `spec.postRenderers` over a rendered chart (its hooks and main resources; the CRDs of
/// `crds/` directories are left as they are), keeping every document's attribution. Nothing to
/// do without post-renderers: kubectl is then never looked for.
pub async fn post_render(
    kubectl: &Kubectl,
    rendered: Rendered,
    renderers: &[PostRenderer],
) -> Result<Rendered, Error> {
    if !crate::render::postrender::any(renderers) {
        return Ok(rendered);
    }
    let Rendered { tree, documents } = rendered;
    let documents =
        crate::render::postrender::post_render(kubectl, &tree, documents, renderers).await?;
    Ok(Rendered { tree, documents })
}

/// Checks that a values text is YAML holding mappings (what Helm accepts in a `-f` file), so
/// that a bad one is named by its origin rather than by a temporary file.
fn check_values(values: &ValuesFile) -> Result<(), Error> {
    let invalid = |message: String| Error::Values {
        origin: values.origin.clone(),
        message,
    };
    // Helm reads the text with a final newline added (it matters to a block scalar at the end).
    let mut text = values.text.trim_start_matches('\u{feff}').to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let documents =
        crate::yaml::parse_documents(&text).map_err(|e| invalid(format!("invalid YAML at {e}")))?;
    for (index, document) in documents.iter().enumerate() {
        if !matches!(document, Value::Object(_) | Value::Null) {
            return Err(invalid(format!(
                "document {} is {}, but values must be a mapping of keys to values",
                index + 1,
                crate::chart::describe(document)
            )));
        }
    }
    Ok(())
}

/// A values text, checked ([`check_values`]), written to a file only its owner can read.
fn values_file(values: &ValuesFile) -> Result<tempfile::NamedTempFile, Error> {
    check_values(values)?;
    let io = |e: std::io::Error| Error::Io {
        what: format!("{}: a temporary values file", values.origin),
        message: crate::chart::io_message(&e),
    };
    let mut file = tempfile::Builder::new()
        .prefix("sequenced-values-")
        .suffix(".yaml")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile()
        .map_err(io)?;
    file.write_all(values.text.as_bytes()).map_err(io)?;
    file.flush().map_err(io)?;
    Ok(file)
}

/// What Helm's readers show of a rendered chart (pure): the top chart's metadata, the user's
/// values merged as Helm merges `-f` files (later files win, maps merge key by key), and the
/// manifest as `helm get manifest` prints it (the main resources, hooks and CRDs aside). A values
/// file that is not a map adds nothing: helm refused it before rendering.
pub fn content(rendered: &Rendered, values: &[ValuesFile]) -> crate::history::Content {
    let meta = &rendered.tree.root.metadata;
    let mut chart_metadata = serde_json::Map::new();
    let mut put = |key: &str, value: Value| {
        chart_metadata.insert(key.to_string(), value);
    };
    put("apiVersion", Value::from(meta.api_version.as_str()));
    put("name", Value::from(meta.name.as_str()));
    put("version", Value::from(meta.version.as_str()));
    if let Some(app_version) = &meta.app_version {
        put("appVersion", Value::from(app_version.as_str()));
    }
    if let Some(chart_type) = &meta.chart_type {
        put("type", Value::from(chart_type.as_str()));
    }
    if !meta.annotations.is_empty() {
        put("annotations", serde_json::json!(meta.annotations));
    }
    let mut merged = serde_json::Map::new();
    for file in values {
        if let Ok(Value::Object(map)) = crate::yaml::parse(&file.text) {
            merge_values(&mut merged, map);
        }
    }
    let mut manifest = String::new();
    for document in &rendered.documents.resources {
        manifest.push_str("---\n# Source: ");
        manifest.push_str(&document.source);
        manifest.push('\n');
        manifest.push_str(document.text.trim_end());
        manifest.push('\n');
    }
    crate::history::Content {
        chart_metadata,
        values: merged,
        manifest,
    }
}

/// Helm's merge of two values files: `over` wins, maps merge key by key.
fn merge_values(base: &mut serde_json::Map<String, Value>, over: serde_json::Map<String, Value>) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(inner)), Value::Object(more)) => merge_values(inner, more),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Plans a rendered chart (pure).
pub fn plan(rendered: Rendered) -> Result<Plan, Error> {
    Ok(crate::plan::plan(&rendered.tree, rendered.documents)?)
}

/// Runs file work and parsing off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(Error::Io {
            what: "the chart pipeline".to_string(),
            message: format!("stopped: {e}"),
        })
    })
}

/// A temporary chart whose one template prints its values as JSON: `helm template` of it merges
/// values files and `--set` flags exactly as Helm merges them for a real chart.
pub(crate) fn values_chart(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    let chart = tempfile::Builder::new().prefix(prefix).tempdir()?;
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: values\nversion: 0.0.0\n",
    )?;
    std::fs::create_dir(chart.path().join("templates"))?;
    std::fs::write(
        chart.path().join("templates").join("values.yaml"),
        "{{ toJson .Values }}\n",
    )?;
    Ok(chart)
}
