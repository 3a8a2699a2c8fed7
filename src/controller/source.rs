//! The spec's inputs, read and resolved: the chart source (a range resolved to one version, again
//! every `interval`), the values (`valuesFrom` in order, then `values`, as ordered values files),
//! and the digest of both, which decides when a new revision starts.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use super::watches::{Input, InputKind};
use super::{Error, Tenancy};
use crate::api::ObjectKey;
use crate::api::{
    CommonMetadata, KeyReference, PostRenderer, Reason, SequencedRelease, ValuesKind,
    VerifyProvider,
};
use crate::chart::source::{ChartCache, ChartReference, Credentials};
use crate::chart::verify::{Keyring, Verification};
use crate::cluster::{Cluster, ClusterError};
use crate::digest::{Asked, Digests};
use crate::helm::Helm;
use crate::pipeline::{self, ChartSource, Resolved, ValueFlags, ValuesEntry, ValuesFile};
use crate::rollout::lifecycle::{Refusal, Source};

/// A spec made concrete: the chart resolved, the values files, and their digest.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub resolved: Resolved,
    /// The values files helm is given, in order.
    pub values: Vec<ValuesFile>,
    pub release_name: String,
    pub namespace: String,
    /// `spec.commonMetadata`, stamped on what is rendered.
    pub common_metadata: Option<CommonMetadata>,
    /// `spec.postRenderers`, run over what is rendered before it is planned.
    pub post_renderers: Vec<PostRenderer>,
    /// `--set` flags given to helm after the values files: none for a release (the operator
    /// has only files); `sequenced diff NAME --set` previews a change with them.
    pub flags: ValueFlags,
    /// The digests under every scheme that can express the spec (see [`crate::digest`]); the
    /// current one is what the plan is cached by and a new revision records.
    pub digests: Digests,
}

impl Prepared {
    /// What the lifecycle needs of it.
    pub fn source(&self) -> Source {
        Source {
            digests: self.digests.clone(),
            chart_version: self.resolved.version.clone(),
            artifact: self.resolved.artifact.clone(),
        }
    }
}

/// What a spec asks for, read but not resolved yet.
struct Inputs {
    source: ChartSource,
    credentials: Option<Credentials>,
    values: Vec<ValuesEntry>,
    verification: Option<Verification>,
}

/// A chart source with how it is verified: what a resolution is kept for.
type Checked = (ChartSource, Option<Verification>);

/// Values files merged for a digest: `(digest, files)`.
type Merged = (String, Vec<ValuesFile>);

/// The resolutions of remote charts, by release: a version range is resolved again once
/// `interval` has passed, or when the chart reference changes.
#[derive(Default)]
pub struct Sources {
    resolved: Mutex<HashMap<ObjectRef<SequencedRelease>, (Checked, Resolved, Instant)>>,
    /// The chart on disk each release uses now: kept when the cache evicts.
    in_use: Mutex<HashMap<ObjectRef<SequencedRelease>, PathBuf>>,
    /// `helm pull` timeouts in a row, by release.
    timeouts: super::TimeoutStreaks,
    /// Values merged with `targetPath` entries (helm sets each path), by release, with the
    /// digest they were merged for.
    merged: Mutex<HashMap<ObjectRef<SequencedRelease>, Merged>>,
    /// A verification given on the command line (`sequenced diff --verify --keyring`): used
    /// instead of `spec.chart.verify`'s.
    verification: Option<Verification>,
}

impl Sources {
    /// The same sources, verifying every chart as `verification` says (when Some) instead of
    /// as the release's `spec.chart.verify` says.
    pub fn verifying_with(mut self, verification: Option<Verification>) -> Self {
        self.verification = verification;
        self
    }

    pub fn forget(&self, release: &ObjectRef<SequencedRelease>) {
        if let Ok(mut resolved) = self.resolved.lock() {
            resolved.remove(release);
        }
        if let Ok(mut merged) = self.merged.lock() {
            merged.remove(release);
        }
        if let Ok(mut in_use) = self.in_use.lock() {
            in_use.remove(release);
        }
        self.timeouts.ended(release);
    }

    /// The charts on disk that releases use now.
    fn used(&self) -> HashSet<PathBuf> {
        self.in_use
            .lock()
            .map(|in_use| in_use.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Reads the spec's inputs through `reader` (in multi-tenant mode the release's account, so
    /// that a tenant reads nothing its account may not) and resolves the chart: Ok(Err) when
    /// the spec or the chart cannot be used as it is (the release stalls), Err when trying again
    /// later may help (or the account may not read an input: Stalled `Forbidden`).
    pub async fn prepare(
        &self,
        reader: &Cluster,
        tenancy: &Tenancy,
        helm: &Helm,
        cache: &ChartCache,
        sr: &SequencedRelease,
        interval: Duration,
    ) -> Result<Result<Prepared, Refusal>, Error> {
        let mut inputs = match read_inputs(reader, tenancy, sr).await? {
            Ok(inputs) => inputs,
            Err(refusal) => return Ok(Err(refusal)),
        };
        if let Some(verification) = &self.verification {
            inputs.verification = Some(verification.clone());
        }
        let key = ObjectRef::from_obj(sr);
        let remote = matches!(
            inputs.source,
            ChartSource::Reference(ChartReference::Repository { .. } | ChartReference::Oci { .. })
        );
        // Resolved before for this source: its interval has passed (or its archive was
        // evicted), so an exact version is pulled again, and bytes pushed again under it seen.
        let refresh = remote
            && self.resolved.lock().ok().is_some_and(|resolved| {
                resolved
                    .get(&key)
                    .is_some_and(|((source, _), _, _)| *source == inputs.source)
            });
        let known = self.resolved.lock().ok().and_then(|resolved| {
            resolved
                .get(&key)
                .filter(|((source, verification), _, at)| {
                    *source == inputs.source
                        && *verification == inputs.verification
                        && at.elapsed() < interval
                })
                // An archive the cache removed (it was not in use then) is fetched again.
                .filter(|(_, resolved, _)| resolved.path.exists())
                .map(|(_, resolved, _)| resolved.clone())
        });
        let resolved = match known {
            Some(resolved) => resolved,
            None => {
                let streak = match &inputs.source {
                    ChartSource::Reference(reference) => reference.to_string(),
                    ChartSource::Packaged { origin, .. } => origin.clone(),
                };
                if let Some(refusal) = self.timeouts.stalled(&key, &streak, "helm pull") {
                    return Ok(Err(refusal));
                }
                let resolved = match pipeline::resolve_with(
                    helm,
                    cache,
                    &inputs.source,
                    inputs.credentials.as_ref(),
                    inputs.verification.as_ref(),
                    refresh,
                )
                .await
                {
                    Ok(resolved) => resolved,
                    Err(e) if e.timed_out() => {
                        return match self.timeouts.timed_out(&key, &streak, "helm pull") {
                            Some(refusal) => Ok(Err(refusal)),
                            None => Err(e.into()),
                        };
                    }
                    Err(e) if e.is_transient() => return Err(e.into()),
                    Err(e) => return Ok(Err(refusal_of(&e))),
                };
                self.timeouts.ended(&key);
                if !matches!(
                    inputs.source,
                    ChartSource::Reference(ChartReference::Path(_))
                ) {
                    if let Ok(mut in_use) = self.in_use.lock() {
                        in_use.insert(key.clone(), resolved.path.clone());
                    }
                    // What this fetch added may take the cache over its budget.
                    let used = self.used();
                    let cache = cache.clone();
                    let _ = tokio::task::spawn_blocking(move || cache.evict(&used)).await;
                }
                if remote && let Ok(mut known) = self.resolved.lock() {
                    known.insert(
                        key.clone(),
                        (
                            (inputs.source.clone(), inputs.verification.clone()),
                            resolved.clone(),
                            Instant::now(),
                        ),
                    );
                }
                resolved
            }
        };
        let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
        let release_name = sr
            .spec
            .release_name
            .clone()
            .unwrap_or_else(|| sr.name_any());
        let target = sr.spec.target_namespace.clone().unwrap_or(namespace);
        let common_metadata = sr.spec.common_metadata.clone().filter(|c| !c.is_empty());
        let digests = Digests::of(&Asked {
            chart: &resolved.identity,
            values: inputs
                .values
                .iter()
                .map(ValuesEntry::digest_input)
                .collect(),
            release_name: &release_name,
            namespace: &target,
            common_metadata: common_metadata.as_ref(),
            post_renderers: &sr.spec.post_renderers,
        });
        // Merged by helm when a path is set: once per digest, not at every reconcile.
        let sets_paths = inputs
            .values
            .iter()
            .any(|e| matches!(e, ValuesEntry::TargetPath { .. }));
        let known = self.merged.lock().ok().and_then(|merged| {
            merged
                .get(&key)
                .filter(|(at, _)| sets_paths && *at == digests.current)
                .map(|(_, files)| files.clone())
        });
        let values = match known {
            Some(files) => files,
            None => match pipeline::values_files(helm, &inputs.values).await {
                Ok(files) => {
                    if sets_paths && let Ok(mut merged) = self.merged.lock() {
                        merged.insert(key, (digests.current.clone(), files.clone()));
                    }
                    files
                }
                Err(e) if e.is_transient() => return Err(e.into()),
                Err(e) => return Ok(Err(refusal_of(&e))),
            },
        };
        Ok(Ok(Prepared {
            resolved,
            values,
            release_name,
            namespace: target,
            common_metadata,
            post_renderers: sr.spec.post_renderers.clone(),
            flags: ValueFlags::default(),
            digests,
        }))
    }
}

/// The ConfigMaps and Secrets the spec reads: `valuesFrom`, a packaged chart in
/// `chart.configMapRef` or `chart.secretRef`, and `chart.credentialsSecretRef`.
pub(super) fn inputs_of(sr: &SequencedRelease) -> HashSet<Input> {
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    let spec = &sr.spec;
    let of = |kind: ValuesKind| match kind {
        ValuesKind::ConfigMap => InputKind::ConfigMap,
        ValuesKind::Secret => InputKind::Secret,
    };
    let values = spec
        .values_from
        .iter()
        .map(|r| (of(r.kind), r.name.clone()));
    let chart = [
        spec.chart
            .config_map_ref
            .as_ref()
            .map(|k| (InputKind::ConfigMap, k.name.clone())),
        spec.chart
            .secret_ref
            .as_ref()
            .map(|k| (InputKind::Secret, k.name.clone())),
        spec.chart
            .credentials_secret_ref
            .as_ref()
            .map(|r| (InputKind::Secret, r.name.clone())),
        spec.chart
            .verify
            .as_ref()
            .and_then(|v| v.secret_ref.as_ref())
            .map(|r| (InputKind::Secret, r.name.clone())),
        spec.kube_config
            .as_ref()
            .map(|k| (InputKind::Secret, k.secret_ref.name.clone())),
    ];
    values
        .chain(chart.into_iter().flatten())
        .map(|(kind, name)| (kind, namespace.clone(), name))
        .collect()
}

/// The kubeconfig `spec.kubeConfig` names, read through `reader` as `valuesFrom` is (in
/// multi-tenant mode the release's account): its key, else `value`, else `value.yaml`, as Flux
/// reads it. Ok(Err(why)) when the Secret or the key is missing.
pub(super) async fn kubeconfig(reader: &Cluster, sr: &SequencedRelease) -> Found<Vec<u8>> {
    let Some(reference) = &sr.spec.kube_config else {
        return Ok(Err("the release has no spec.kubeConfig".to_string()));
    };
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    let name = &reference.secret_ref.name;
    if let Some(key) = &reference.secret_ref.key {
        return secret_bytes(reader, &namespace, name, key).await;
    }
    match secret_bytes(reader, &namespace, name, "value").await? {
        Ok(bytes) => Ok(Ok(bytes)),
        Err(missing) if missing.ends_with("not found") => Ok(Err(missing)),
        Err(_) => Ok(secret_bytes(reader, &namespace, name, "value.yaml")
            .await?
            .map_err(|_| {
                format!("Secret {namespace}/{name} has neither the key value nor value.yaml")
            })),
    }
}

/// What stalls a release whose chart or values the pipeline refused (an error that is not
/// transient).
pub(super) fn refusal_of(e: &pipeline::Error) -> Refusal {
    Refusal {
        reason: e.reason(),
        message: e.to_string(),
    }
}

fn refusal(field: impl std::fmt::Display, message: impl std::fmt::Display) -> Refusal {
    Refusal {
        reason: Reason::InvalidSpec,
        message: format!("{field}: {message}"),
    }
}

/// Reads the spec's chart source and values (ConfigMaps and Secrets through the API, as
/// `reader`).
async fn read_inputs(
    reader: &Cluster,
    tenancy: &Tenancy,
    sr: &SequencedRelease,
) -> Result<Result<Inputs, Refusal>, Error> {
    let namespace = sr.namespace().unwrap_or_else(|| "default".to_string());
    let spec = &sr.spec;
    let mut values = Vec::with_capacity(spec.values_from.len() + 1);
    for (i, reference) in spec.values_from.iter().enumerate() {
        let field = format!("spec.valuesFrom[{i}]");
        let (name, key) = (&reference.name, &reference.values_key);
        let text = match reference.kind {
            ValuesKind::ConfigMap => config_map_text(reader, &namespace, name, key).await,
            ValuesKind::Secret => secret_text(reader, &namespace, name, key).await,
        };
        let origin = format!(
            "{field} ({:?} {namespace}/{name} key {key})",
            reference.kind
        );
        match text? {
            Ok(value) => match &reference.target_path {
                Some(path) => values.push(ValuesEntry::TargetPath {
                    origin: format!(
                        "{field}.targetPath {path} ({:?} {namespace}/{name} key {key})",
                        reference.kind
                    ),
                    path: path.clone(),
                    value,
                }),
                None => values.push(ValuesEntry::File(ValuesFile {
                    origin,
                    text: value,
                })),
            },
            Err(_) if reference.optional => continue,
            Err(missing) => return Ok(Err(refusal(field, missing))),
        }
    }
    if let Some(inline) = &spec.values {
        values.push(ValuesEntry::File(ValuesFile {
            origin: "spec.values".to_string(),
            // JSON is YAML.
            text: serde_json::to_string(inline).unwrap_or_default(),
        }));
    }

    let chart = &spec.chart;
    let source = if let Some(path) = &chart.path {
        if tenancy.is_multi_tenant()
            && let Err(refused) = local_chart_allowed(Path::new(path), &tenancy.allow_local_charts)
        {
            return Ok(Err(refusal("spec.chart.path", refused)));
        }
        if !Path::new(path).exists() {
            return Ok(Err(refusal(
                "spec.chart.path",
                format!("chart {path}: no such file or directory in the operator's file system"),
            )));
        }
        ChartSource::Reference(ChartReference::Path(PathBuf::from(path)))
    } else if let (Some(url), Some(name)) = (&chart.repository, &chart.name) {
        ChartSource::Reference(ChartReference::Repository {
            url: url.clone(),
            name: name.clone(),
            version: chart.version.clone(),
        })
    } else if let Some(reference) = &chart.oci {
        ChartSource::Reference(ChartReference::Oci {
            reference: reference.clone(),
            version: chart.version.clone(),
            plain_http: chart.plain_http.unwrap_or(false),
        })
    } else if let Some(key) = &chart.config_map_ref {
        let origin = "spec.chart.configMapRef";
        match packaged(reader, &namespace, key, ValuesKind::ConfigMap).await? {
            Ok(bytes) => ChartSource::Packaged {
                origin: origin.to_string(),
                bytes,
            },
            Err(missing) => return Ok(Err(refusal(origin, missing))),
        }
    } else if let Some(key) = &chart.secret_ref {
        let origin = "spec.chart.secretRef";
        match packaged(reader, &namespace, key, ValuesKind::Secret).await? {
            Ok(bytes) => ChartSource::Packaged {
                origin: origin.to_string(),
                bytes,
            },
            Err(missing) => return Ok(Err(refusal(origin, missing))),
        }
    } else {
        return Ok(Err(refusal(
            "spec.chart",
            "needs exactly one source: repository (with name), oci, path, configMapRef or secretRef",
        )));
    };

    let credentials = match &chart.credentials_secret_ref {
        None => None,
        Some(reference) => {
            let field = "spec.chart.credentialsSecretRef";
            let username = secret_text(reader, &namespace, &reference.name, "username").await?;
            let password = secret_text(reader, &namespace, &reference.name, "password").await?;
            match (username, password) {
                (Ok(username), Ok(password)) => Some(Credentials {
                    username,
                    password,
                    scope: namespace.clone(),
                }),
                (Err(missing), _) | (_, Err(missing)) => return Ok(Err(refusal(field, missing))),
            }
        }
    };
    let verification = match chart.verify.as_ref().map(|v| (v.provider, &v.secret_ref)) {
        None if tenancy.require_verified_charts => {
            return Ok(Err(Refusal {
                reason: Reason::VerificationFailed,
                message: "spec.chart.verify: this controller runs with \
                          --require-verified-charts and deploys only charts verified by a \
                          signature: set spec.chart.verify (a repository or OCI chart)"
                    .to_string(),
            }));
        }
        None => None,
        Some((VerifyProvider::Helm, reference)) => {
            let field = "spec.chart.verify.secretRef";
            let Some(name) = reference.as_ref().map(|r| &r.name) else {
                return Ok(Err(refusal(
                    field,
                    "is needed: the Secret of the public keys",
                )));
            };
            let what = format!("Secret {namespace}/{name}");
            let Some(secret) = get_object::<Secret>(reader, &namespace, name, &what).await? else {
                return Ok(Err(refusal(field, format!("{what} not found"))));
            };
            let data = secret.data.unwrap_or_default().into_iter();
            match Keyring::of_secret(what, data.map(|(k, v)| (k, v.0))) {
                Ok(keyring) => Some(Verification::Helm(keyring)),
                Err(missing) => return Ok(Err(refusal(field, missing))),
            }
        }
    };
    Ok(Ok(Inputs {
        source,
        credentials,
        values,
        verification,
    }))
}

/// An object's content, `Err(why)` when it or its key is missing.
pub(super) type Found<T> = Result<Result<T, String>, Error>;

/// The object, None when it does not exist, read as `reader`; `what` names it in errors. An
/// account that may not read it is told as [`ClusterError::Forbidden`], naming the verb and
/// the object (the release stalls `Forbidden`).
async fn get_object<K>(
    reader: &Cluster,
    namespace: &str,
    name: &str,
    what: &str,
) -> Result<Option<K>, Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(reader.client().clone(), namespace);
    api.get_opt(name).await.map_err(|source| {
        let key = ObjectKey {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespace: Some(namespace.to_string()),
            name: name.to_string(),
        };
        match reader.error("reading", &key, source) {
            refused @ ClusterError::Forbidden { .. } => Error::Cluster(refused),
            ClusterError::Api { source, .. } => Error::SpecRead {
                what: what.to_string(),
                source,
            },
            other => Error::Cluster(other),
        }
    })
}

/// Whether `path` is under one of the `allowed` directories (`--allow-local-charts`), judged
/// first by its text alone (nothing outside them is even looked at: no file's existence is told)
/// and then with symbolic links resolved. Err says why not.
fn local_chart_allowed(path: &Path, allowed: &[PathBuf]) -> Result<(), String> {
    let refused = || {
        format!(
            "{}: this controller runs multi-tenant and reads local charts only under the \
             directories --allow-local-charts lists{}",
            path.display(),
            if allowed.is_empty() {
                " (none)".to_string()
            } else {
                format!(
                    " ({})",
                    allowed
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )
    };
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir));
    if !plain || !allowed.iter().any(|dir| path.starts_with(dir)) {
        return Err(refused());
    }
    // A link inside an allowed directory may still point out of it.
    match std::fs::canonicalize(path) {
        Ok(real) => {
            let inside = allowed
                .iter()
                .any(|dir| std::fs::canonicalize(dir).is_ok_and(|dir| real.starts_with(dir)));
            if inside { Ok(()) } else { Err(refused()) }
        }
        // Missing: told as missing by the caller, which may now say so.
        Err(_) => Ok(()),
    }
}

async fn config_map_text(
    reader: &Cluster,
    namespace: &str,
    name: &str,
    key: &str,
) -> Found<String> {
    let what = format!("ConfigMap {namespace}/{name}");
    let Some(cm) = get_object::<ConfigMap>(reader, namespace, name, &what).await? else {
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

async fn secret_bytes(reader: &Cluster, namespace: &str, name: &str, key: &str) -> Found<Vec<u8>> {
    let what = format!("Secret {namespace}/{name}");
    let Some(secret) = get_object::<Secret>(reader, namespace, name, &what).await? else {
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

async fn secret_text(reader: &Cluster, namespace: &str, name: &str, key: &str) -> Found<String> {
    Ok(secret_bytes(reader, namespace, name, key)
        .await?
        .and_then(|bytes| {
            String::from_utf8(bytes)
                .map_err(|_| format!("Secret {namespace}/{name} key {key} is not UTF-8 text"))
        }))
}

async fn packaged(
    reader: &Cluster,
    namespace: &str,
    key: &KeyReference,
    kind: ValuesKind,
) -> Found<Vec<u8>> {
    match kind {
        ValuesKind::Secret => secret_bytes(reader, namespace, &key.name, &key.key).await,
        ValuesKind::ConfigMap => {
            let what = format!("ConfigMap {namespace}/{}", key.name);
            let Some(cm) = get_object::<ConfigMap>(reader, namespace, &key.name, &what).await?
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
