//! From a SequencedRelease's spec to a plan: the chart source, the values, the digest of both,
//! and the render and plan pipeline (run off the async threads: helm is a subprocess).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::api::v1alpha1::{KeyReference, SequencedRelease, ValuesKind};
use crate::chart::source::{ChartCache, ChartReference, Credentials};
use crate::chart::values::{Values, merge_maps, parse_values};
use crate::helm::Helm;
use crate::plan::Plan;
use crate::render::RenderOptions;

/// Why a spec cannot be used as it is; `field` names the spec field.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

/// Preparing the spec failed: either the spec is unusable (Stalled until it changes) or the
/// API server did not answer (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("reading {what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// Where the chart is, once the spec is read.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A reference the chart cache understands (a path, a repository, a registry).
    Reference(ChartReference),
    /// A packaged chart held in a ConfigMap or Secret.
    Packaged { field: String, bytes: Vec<u8> },
}

/// A spec made concrete: the chart, the merged values and their digest.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub source: Source,
    pub credentials: Option<Credentials>,
    pub values: Values,
    pub release_name: String,
    pub namespace: String,
    /// `sha256:<hex>` over the chart and the values.
    pub digest: String,
}

fn spec_error(field: impl Into<String>, message: impl Into<String>) -> PrepareError {
    PrepareError::Spec(SpecError {
        field: field.into(),
        message: message.into(),
    })
}

/// Reads the spec's chart source and values (ConfigMaps and Secrets through the API).
pub async fn prepare(client: &Client, sr: &SequencedRelease) -> Result<Prepared, PrepareError> {
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    let spec = &sr.spec;
    let mut values = Values::new();
    for (i, reference) in spec.values_from.iter().enumerate() {
        let field = format!("spec.valuesFrom[{i}]");
        let text = match reference.kind {
            ValuesKind::ConfigMap => {
                config_map_text(client, &namespace, &reference.name, &reference.values_key).await
            }
            ValuesKind::Secret => {
                secret_text(client, &namespace, &reference.name, &reference.values_key).await
            }
        };
        let text = match text? {
            Ok(text) => text,
            Err(_) if reference.optional => continue,
            Err(missing) => return Err(spec_error(field, missing)),
        };
        let parsed = parse_values(&text).map_err(|e| {
            spec_error(
                &field,
                format!(
                    "{:?} {}/{} key {}: {e}",
                    reference.kind, namespace, reference.name, reference.values_key
                ),
            )
        })?;
        values = merge_maps(values, parsed);
    }
    if let Some(inline) = &spec.values {
        values = merge_maps(values, inline.clone());
    }

    let chart = &spec.chart;
    let source = if let Some(path) = &chart.path {
        if !Path::new(path).exists() {
            return Err(spec_error(
                "spec.chart.path",
                format!("chart {path}: no such file or directory in the operator's file system"),
            ));
        }
        Source::Reference(ChartReference::Path(PathBuf::from(path)))
    } else if let (Some(url), Some(name)) = (&chart.repository, &chart.name) {
        Source::Reference(ChartReference::Repository {
            url: url.clone(),
            name: name.clone(),
            version: chart.version.clone(),
        })
    } else if let Some(reference) = &chart.oci {
        Source::Reference(ChartReference::Oci {
            reference: reference.clone(),
            version: chart.version.clone(),
            plain_http: chart.plain_http.unwrap_or(false),
        })
    } else if let Some(key) = &chart.config_map_ref {
        let bytes = packaged(client, &namespace, key, ValuesKind::ConfigMap).await?;
        let field = "spec.chart.configMapRef".to_string();
        Source::Packaged {
            bytes: bytes.map_err(|m| spec_error(&field, m))?,
            field,
        }
    } else if let Some(key) = &chart.secret_ref {
        let bytes = packaged(client, &namespace, key, ValuesKind::Secret).await?;
        let field = "spec.chart.secretRef".to_string();
        Source::Packaged {
            bytes: bytes.map_err(|m| spec_error(&field, m))?,
            field,
        }
    } else {
        return Err(spec_error(
            "spec.chart",
            "needs exactly one source: repository (with name), oci, path, configMapRef or secretRef",
        ));
    };

    let credentials = match &chart.credentials_secret_ref {
        None => None,
        Some(reference) => {
            let field = "spec.chart.credentialsSecretRef";
            let username = secret_text(client, &namespace, &reference.name, "username")
                .await?
                .map_err(|m| spec_error(field, m))?;
            let password = secret_text(client, &namespace, &reference.name, "password")
                .await?
                .map_err(|m| spec_error(field, m))?;
            Some(Credentials { username, password })
        }
    };

    let release_name = spec.release_name.clone().unwrap_or_else(|| sr.name_any());
    let target = spec.target_namespace.clone().unwrap_or(namespace);
    let digest = digest(&source, &values, &release_name, &target)
        .map_err(|m| spec_error("spec.chart.path", m))?;
    Ok(Prepared {
        source,
        credentials,
        values,
        release_name,
        namespace: target,
        digest,
    })
}

type Found<T> = Result<Result<T, String>, PrepareError>;

/// The object, None when it does not exist; `what` names it in errors.
async fn get_object<K>(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
) -> Result<Option<K>, PrepareError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    api.get_opt(name).await.map_err(|source| PrepareError::Api {
        what: what.to_string(),
        source,
    })
}

async fn config_map_text(client: &Client, namespace: &str, name: &str, key: &str) -> Found<String> {
    let what = format!("ConfigMap {namespace}/{name}");
    let Some(cm) = get_object::<ConfigMap>(client, namespace, name, &what).await? else {
        return Ok(Err(format!("{what} not found")));
    };
    if let Some(text) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Ok(Ok(text.clone()));
    }
    if let Some(bytes) = cm.binary_data.as_ref().and_then(|d| d.get(key)) {
        return Ok(String::from_utf8(bytes.0.clone())
            .map_err(|_| format!("{what} key {key} is not UTF-8 text")));
    }
    Ok(Err(format!("{what} has no key {key}")))
}

async fn secret_bytes(client: &Client, namespace: &str, name: &str, key: &str) -> Found<Vec<u8>> {
    let what = format!("Secret {namespace}/{name}");
    let Some(secret) = get_object::<Secret>(client, namespace, name, &what).await? else {
        return Ok(Err(format!("{what} not found")));
    };
    match secret.data.as_ref().and_then(|d| d.get(key)) {
        Some(bytes) => Ok(Ok(bytes.0.clone())),
        None => match secret.string_data.as_ref().and_then(|d| d.get(key)) {
            Some(text) => Ok(Ok(text.clone().into_bytes())),
            None => Ok(Err(format!("{what} has no key {key}"))),
        },
    }
}

async fn secret_text(client: &Client, namespace: &str, name: &str, key: &str) -> Found<String> {
    Ok(secret_bytes(client, namespace, name, key)
        .await?
        .and_then(|bytes| {
            String::from_utf8(bytes)
                .map_err(|_| format!("Secret {namespace}/{name} key {key} is not UTF-8 text"))
        }))
}

async fn packaged(
    client: &Client,
    namespace: &str,
    key: &KeyReference,
    kind: ValuesKind,
) -> Found<Vec<u8>> {
    match kind {
        ValuesKind::Secret => secret_bytes(client, namespace, &key.name, &key.key).await,
        ValuesKind::ConfigMap => {
            let what = format!("ConfigMap {namespace}/{}", key.name);
            let Some(cm) = get_object::<ConfigMap>(client, namespace, &key.name, &what).await?
            else {
                return Ok(Err(format!("{what} not found")));
            };
            match cm.binary_data.as_ref().and_then(|d| d.get(&key.key)) {
                Some(bytes) => Ok(Ok(bytes.0.clone())),
                None => Ok(Err(format!(
                    "{what} has no binaryData key {} holding a packaged chart",
                    key.key
                ))),
            }
        }
    }
}

/// `sha256:<hex>` of the chart (its files, its bytes, or its repository reference), the values,
/// the release name and namespace.
fn digest(
    source: &Source,
    values: &Values,
    release_name: &str,
    namespace: &str,
) -> Result<String, String> {
    let mut hasher = Sha256::new();
    match source {
        Source::Reference(ChartReference::Path(path)) => {
            hasher.update(b"path\0");
            hash_path(&mut hasher, path, Path::new(""))?;
        }
        Source::Reference(reference) => {
            hasher.update(b"reference\0");
            hasher.update(reference.to_string().as_bytes());
        }
        Source::Packaged { bytes, .. } => {
            hasher.update(b"packaged\0");
            hasher.update(bytes);
        }
    }
    hasher.update(b"\0values\0");
    hasher.update(serde_json::to_vec(values).unwrap_or_default());
    hasher.update(b"\0release\0");
    hasher.update(release_name.as_bytes());
    hasher.update(b"\0");
    hasher.update(namespace.as_bytes());
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
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

/// A rendered and planned chart.
#[derive(Debug)]
pub struct Planned {
    pub plan: Plan,
    pub chart_version: Option<String>,
}

/// Why a chart could not be planned: `reason` is the Stalled condition's reason.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct PlanFailure {
    pub reason: &'static str,
    /// Whether trying again later may help (a download), as opposed to a broken chart.
    pub transient: bool,
    pub message: String,
}

/// What rendering needs besides the prepared spec.
#[derive(Debug, Clone)]
pub struct RenderContext {
    pub helm: Helm,
    pub cache: ChartCache,
    pub kube_version: Option<String>,
    pub api_versions: Vec<String>,
    pub is_upgrade: bool,
}

/// Fetches, loads, renders and plans the chart. Blocking: call it from a blocking thread.
pub fn render_and_plan(
    prepared: &Prepared,
    context: &RenderContext,
) -> Result<Planned, PlanFailure> {
    let fail = |reason, transient, message: String| PlanFailure {
        reason,
        transient,
        message,
    };
    let path = match &prepared.source {
        Source::Reference(reference) => {
            context
                .cache
                .fetch(&context.helm, reference, prepared.credentials.as_ref())
                .map_err(|e| fail("ChartUnavailable", true, e.to_string()))?
                .path
        }
        Source::Packaged { field, bytes } => {
            let dir = context.cache.dir().join("packaged");
            std::fs::create_dir_all(&dir)
                .map_err(|e| fail("ChartUnavailable", true, format!("{}: {e}", dir.display())))?;
            let path = dir.join(format!("{}.tgz", hex::encode(Sha256::digest(bytes))));
            if !path.exists() {
                std::fs::write(&path, bytes).map_err(|e| {
                    fail(
                        "ChartUnavailable",
                        true,
                        format!("{field}: {}: {e}", path.display()),
                    )
                })?;
            }
            path
        }
    };
    let chart =
        crate::chart::load(&path).map_err(|e| fail("InvalidChart", false, e.to_string()))?;
    let tree = crate::chart::resolve(&chart, &prepared.values)
        .map_err(|e| fail("InvalidChart", false, e.to_string()))?;
    let values_file = tempfile::Builder::new()
        .prefix("sequenced-values-")
        .suffix(".json")
        .tempfile()
        .map_err(|e| fail("RenderFailed", true, format!("values file: {e}")))?;
    std::fs::write(
        values_file.path(),
        serde_json::to_vec(&Value::Object(prepared.values.clone())).unwrap_or_default(),
    )
    .map_err(|e| fail("RenderFailed", true, format!("values file: {e}")))?;
    let options = RenderOptions {
        release_name: prepared.release_name.clone(),
        namespace: prepared.namespace.clone(),
        values_files: vec![values_file.path().to_path_buf()],
        kube_version: context.kube_version.clone(),
        api_versions: context.api_versions.clone(),
        is_upgrade: context.is_upgrade,
        ..RenderOptions::default()
    };
    let rendered = crate::render::render(&context.helm, &path, &tree, &options)
        .map_err(|e| fail("RenderFailed", false, e.to_string()))?;
    let plan =
        crate::plan::plan(&tree, rendered).map_err(|e| fail("PlanFailed", false, e.to_string()))?;
    Ok(Planned {
        plan,
        chart_version: Some(chart.metadata.version.clone()),
    })
}

/// Runs [`render_and_plan`] on a blocking thread.
pub async fn plan_blocking(
    prepared: Arc<Prepared>,
    context: RenderContext,
) -> Result<Planned, PlanFailure> {
    tokio::task::spawn_blocking(move || render_and_plan(&prepared, &context))
        .await
        .unwrap_or_else(|e| {
            Err(PlanFailure {
                reason: "RenderFailed",
                transient: true,
                message: format!("rendering stopped: {e}"),
            })
        })
}
