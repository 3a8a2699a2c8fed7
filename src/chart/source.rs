//! Where charts come from: a local path, an HTTP chart repository, or an OCI registry.
//!
//! Remote charts are downloaded with `helm pull` into an on-disk cache, one directory per source
//! and one file per version. Helm resolves a version range (`^1.2`, or none: the newest stable
//! version) against the repository's index or the registry's tags; the version it chose is read
//! from the Chart.yaml of the archive it pulled. An exact version that is already cached needs no
//! network at all.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::egress::{Guard, Refused, SourcePolicy};
use crate::helm::{Helm, HelmError};

/// The environment variable that overrides the cache directory.
pub const CACHE_ENV: &str = "SEQUENCED_CACHE_DIR";

/// A chart to deploy, before it is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChartReference {
    /// A chart directory or packaged chart on disk.
    Path(PathBuf),
    /// A chart in an HTTP chart repository.
    Repository {
        url: String,
        name: String,
        version: Option<String>,
    },
    /// A chart in an OCI registry (`oci://registry/path/name`).
    Oci {
        reference: String,
        version: Option<String>,
        plain_http: bool,
    },
}

impl std::fmt::Display for ChartReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let version = |v: &Option<String>| {
            v.as_ref()
                .map(|v| format!(" version {v}"))
                .unwrap_or_default()
        };
        match self {
            ChartReference::Path(path) => write!(f, "{}", path.display()),
            ChartReference::Repository {
                url,
                name,
                version: v,
            } => {
                write!(f, "chart {name} from {url}{}", version(v))
            }
            ChartReference::Oci {
                reference,
                version: v,
                ..
            } => write!(f, "{reference}{}", version(v)),
        }
    }
}

/// A username and password for a repository or registry, and who gave them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// The trust boundary they came from (a release's namespace; empty on the command line):
    /// a chart fetched with them is served from the cache only to the same boundary with the
    /// same credentials.
    pub scope: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("scope", &self.scope)
            .finish()
    }
}

/// How [`ChartCache::fetch_with`] fetches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchOptions {
    /// Bring the provenance file too.
    pub provenance: bool,
    /// Pull an exact version again, even when it is cached.
    pub refresh: bool,
}

/// A chart on disk, ready to load and render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedChart {
    /// The chart directory or packaged chart.
    pub path: PathBuf,
    /// The version that was resolved, for remote charts.
    pub version: Option<String>,
    /// Whether this call downloaded it (false: it was on disk or in the cache).
    pub downloaded: bool,
    /// `sha256:<hex>` of the archive, for remote charts.
    pub digest: Option<String>,
    /// The manifest digest of an OCI chart, as the registry served it when it was pulled.
    pub oci_digest: Option<String>,
}

/// Why a chart could not be fetched. Every message names the repository or registry.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// `helm pull` failed or did not finish; Helm's message is kept whole.
    #[error("{source_name}: {source}")]
    Pull {
        source_name: String,
        #[source]
        source: HelmError,
    },
    #[error("{source_name}: {message}")]
    Pulled {
        source_name: String,
        message: String,
    },
    #[error("chart cache {path}: {message}")]
    Cache { path: String, message: String },
    /// The source, or an address it led helm to, is not allowed ([`SourcePolicy`]).
    #[error("{source_name}: {refused}")]
    NotAllowed {
        source_name: String,
        refused: Refused,
    },
    /// A `@sha256:` pin that is not one.
    #[error("{source_name}: {message}")]
    BadPin {
        source_name: String,
        message: String,
    },
    /// The chart fetched is not the one the pin names.
    #[error("{source_name}: {message}")]
    DigestMismatch {
        source_name: String,
        message: String,
    },
    /// A guarded fetch failed: what the source answered is not told (it may be a service's
    /// answer a tenant may not read), only which host and HTTP status, or what kind of failure.
    #[error("{source_name}: {summary} (helm's own message is in the operator's log)")]
    Failed {
        source_name: String,
        summary: String,
    },
}

impl SourceError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            SourceError::Pull { source, .. } => match source {
                HelmError::Failed { .. } => "pull_failed",
                other => other.category(),
            },
            SourceError::Pulled { .. } => "bad_archive",
            SourceError::Cache { .. } => "cache",
            SourceError::NotAllowed { .. } => "source_not_allowed",
            SourceError::Failed { .. } => "pull_failed",
            SourceError::BadPin { .. } => "bad_pin",
            SourceError::DigestMismatch { .. } => "digest_mismatch",
        }
    }

    /// Whether trying again later may help: not for a source the policy refuses, nor for a
    /// pin that is not one or that the chart does not match.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self,
            SourceError::NotAllowed { .. }
                | SourceError::BadPin { .. }
                | SourceError::DigestMismatch { .. }
        )
    }
}

/// The on-disk cache of downloaded charts: one directory per source and trust boundary (charts
/// fetched without credentials are public; with credentials, they are kept apart by the
/// namespace that gave them and a salted fingerprint of the credentials), held to a size
/// budget, and fetched under a [`SourcePolicy`].
#[derive(Debug, Clone)]
pub struct ChartCache {
    dir: PathBuf,
    policy: SourcePolicy,
    /// The most the archives may take; None: no limit.
    budget: Option<u64>,
}

impl ChartCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ChartCache {
            dir: dir.into(),
            policy: SourcePolicy::default(),
            budget: None,
        }
    }

    /// The same cache, fetching only from the sources `policy` allows.
    pub fn with_policy(mut self, policy: SourcePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The same cache, held to `bytes` of archives ([`ChartCache::evict`]).
    pub fn with_budget(mut self, bytes: u64) -> Self {
        self.budget = Some(bytes);
        self
    }

    pub fn policy(&self) -> &SourcePolicy {
        &self.policy
    }

    /// `$SEQUENCED_CACHE_DIR`, else `$XDG_CACHE_HOME/sequenced/charts`, else
    /// `~/.cache/sequenced/charts`, else a directory in the system's temporary directory.
    pub fn default_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os(CACHE_ENV).filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir).join("sequenced/charts");
        }
        if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(home).join(".cache/sequenced/charts");
        }
        std::env::temp_dir().join("sequenced-charts")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the chart available on disk: a local path as it is, a remote chart from the cache or
    /// downloaded into it.
    pub async fn fetch(
        &self,
        helm: &Helm,
        reference: &ChartReference,
        credentials: Option<&Credentials>,
    ) -> Result<FetchedChart, SourceError> {
        self.fetch_with(helm, reference, credentials, FetchOptions::default())
            .await
    }

    /// [`ChartCache::fetch`] as `options` say: with `provenance`, the chart's provenance file
    /// too (`helm pull --prov`), kept beside the archive (`.tgz.prov`) when the source serves
    /// one (a cached archive without one is pulled again); with `refresh`, an exact version is
    /// pulled again even when it is cached (a pinned OCI chart never is: its digest names its
    /// bytes).
    pub async fn fetch_with(
        &self,
        helm: &Helm,
        reference: &ChartReference,
        credentials: Option<&Credentials>,
        options: FetchOptions,
    ) -> Result<FetchedChart, SourceError> {
        let FetchOptions {
            provenance,
            refresh,
        } = options;
        let (key, name, source_name, url) = match reference {
            ChartReference::Path(path) => return Ok(FetchedChart::local(path)),
            ChartReference::Repository { url, name, .. } => {
                let url = url.trim_end_matches('/');
                let key = format!("repository\n{url}\n{name}");
                (key, name.clone(), format!("chart repository {url}"), url)
            }
            ChartReference::Oci { reference, .. } => {
                let reference = reference.trim_end_matches('/');
                let bare = reference.split('@').next().unwrap_or(reference);
                let last = bare.rsplit('/').next().unwrap_or(bare);
                let name = last.split(':').next().unwrap_or(last);
                let key = format!("oci\n{reference}");
                (
                    key,
                    name.to_string(),
                    format!("OCI registry {}", registry_of(reference)),
                    reference,
                )
            }
        };
        let pinned = match reference {
            ChartReference::Repository { url, version, .. } => {
                super::pin::repository(url, version.as_deref())
            }
            ChartReference::Oci {
                reference, version, ..
            } => super::pin::oci(reference, version.as_deref()),
            ChartReference::Path(path) => return Ok(FetchedChart::local(path)),
        }
        .map_err(|e| SourceError::BadPin {
            source_name: source_name.clone(),
            message: e.to_string(),
        })?;
        // A pinned OCI chart has a directory of its own (its reference holds the pin).
        let key = match reference {
            ChartReference::Oci { .. } => format!("oci\n{}", pinned.reference),
            _ => key,
        };
        // The archive's file name comes from the spec: never a path.
        if !is_file_name(&name) {
            return Err(SourceError::Pulled {
                source_name,
                message: format!("{name:?} is not a chart name (never a path)"),
            });
        }
        if let Err(refused) = self.policy.check_url(url).await {
            return Err(SourceError::NotAllowed {
                source_name,
                refused,
            });
        }
        let key = self.scoped(&key, credentials)?;
        let version = pinned.version.as_deref();
        let oci = matches!(reference, ChartReference::Oci { .. });
        // An exact version that is cached (in this trust boundary) needs no network: Helm would
        // pick that very version. A pinned chart is served from the cache only when it is the
        // one pinned.
        let cached = match (version.filter(|v| is_exact(v)), &pinned.digest) {
            (_, Some(pin)) if oci => cached_pinned(&self.source_dir(&key), pin),
            _ if refresh => None,
            (Some(exact), _) => Some(self.source_dir(&key).join(archive_name(&name, exact))),
            (None, _) => None,
        };
        if let Some(path) = cached
            .filter(|p| p.is_file())
            .filter(|p| !provenance || super::verify::provenance::file_of(p).is_file())
            && let Ok(digest) = super::pin::archive_digest(&path)
            && (oci || pinned.digest.as_ref().is_none_or(|pin| *pin == digest))
        {
            touch(&path);
            let oci_digest = oci.then(|| read_sidecar(&path)).flatten();
            let version = match version {
                Some(version) => version.to_string(),
                None => path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .and_then(|s| s.strip_prefix(&format!("{name}-")))
                    .unwrap_or_default()
                    .to_string(),
            };
            return Ok(FetchedChart {
                path,
                version: Some(version),
                downloaded: false,
                digest: Some(digest),
                oci_digest,
            });
        }
        let secrets = match credentials {
            Some(credentials) => {
                Some(CredentialFiles::new(reference, credentials).map_err(|e| {
                    SourceError::Cache {
                        path: std::env::temp_dir().display().to_string(),
                        message: super::io_message(&e),
                    }
                })?)
            }
            None => None,
        };
        let (mut command, mut args): (String, Vec<OsString>) = match reference {
            ChartReference::Repository { url, name, .. } => {
                let url = url.trim_end_matches('/');
                let command = format!("helm pull {name}");
                match &secrets {
                    // The repository and its credentials are in a repositories file of their own.
                    Some(secrets) => {
                        let mut args = vec![
                            "pull".into(),
                            format!("{CREDENTIALS_REPOSITORY}/{name}").into(),
                        ];
                        args.extend(secrets.args.iter().cloned());
                        (command, args)
                    }
                    None => (
                        command,
                        vec!["pull".into(), name.into(), "--repo".into(), url.into()],
                    ),
                }
            }
            ChartReference::Oci { plain_http, .. } => {
                let reference = pinned.reference.as_str();
                let mut args: Vec<OsString> = vec!["pull".into(), reference.into()];
                if *plain_http {
                    args.push("--plain-http".into());
                }
                if let Some(secrets) = &secrets {
                    args.extend(secrets.args.iter().cloned());
                }
                (format!("helm pull {reference}"), args)
            }
            ChartReference::Path(path) => return Ok(FetchedChart::local(path)),
        };
        if provenance {
            args.push("--prov".into());
        }
        if let Some(version) = version {
            args.push("--version".into());
            args.push(version.into());
            command.push_str(&format!(" --version {version}"));
        }
        let pull = Pull {
            key: &key,
            name: &name,
            source_name: &source_name,
            command: &command,
            pin: pinned.digest.as_deref(),
            oci,
        };
        let fetched = self.download(helm, &pull, secrets.as_ref(), args).await;
        drop(secrets);
        fetched
    }

    /// The directory of one source (and trust boundary) in the cache.
    fn source_dir(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        self.dir.join(hex::encode(&digest[..12]))
    }

    /// `key` in its trust boundary: public without credentials; with them, the namespace that
    /// gave them and a fingerprint of them, salted with a secret of this cache (so that the
    /// directory's name tells nothing of the password).
    fn scoped(&self, key: &str, credentials: Option<&Credentials>) -> Result<String, SourceError> {
        let Some(credentials) = credentials else {
            return Ok(format!("public\n{key}"));
        };
        let salt = self.salt()?;
        let mut hasher = Sha256::new();
        hasher.update(&salt);
        for part in [&credentials.username, &credentials.password] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        Ok(format!(
            "private\n{}\n{}\n{key}",
            credentials.scope,
            hex::encode(hasher.finalize())
        ))
    }

    /// The cache's secret salt (`.salt`, 0600, made of 32 random bytes on first use).
    fn salt(&self) -> Result<Vec<u8>, SourceError> {
        let path = self.dir.join(".salt");
        let cache_error = |e: std::io::Error| SourceError::Cache {
            path: path.display().to_string(),
            message: super::io_message(&e),
        };
        match std::fs::read(&path) {
            Ok(salt) if salt.len() == 32 => return Ok(salt),
            Ok(_) | Err(_) => {}
        }
        std::fs::create_dir_all(&self.dir).map_err(cache_error)?;
        let mut salt = vec![0u8; 32];
        {
            use std::io::Read;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut salt))
                .map_err(cache_error)?;
        }
        let staged = self.dir.join(format!(".salt-{}", std::process::id()));
        let _ = std::fs::remove_file(&staged);
        write_private(&staged, &salt).map_err(cache_error)?;
        // Another process may have made one meanwhile: theirs wins, as hard_link fails.
        match std::fs::hard_link(&staged, &path) {
            Ok(()) => {
                let _ = std::fs::remove_file(&staged);
                Ok(salt)
            }
            Err(_) => {
                let _ = std::fs::remove_file(&staged);
                std::fs::read(&path).map_err(cache_error)
            }
        }
    }

    /// Removes the least recently used archives that are not in `in_use` until the cache
    /// holds at most its budget; what it removed. Archives are the `.tgz` files of the
    /// cache's source directories and of `packaged/`; their modification time is their last
    /// use (set when they are fetched or served).
    pub fn evict(&self, in_use: &std::collections::HashSet<PathBuf>) -> Evicted {
        let Some(budget) = self.budget else {
            return Evicted::default();
        };
        let mut archives = Vec::new();
        let dirs = std::fs::read_dir(&self.dir).into_iter().flatten().flatten();
        for dir in dirs.filter(|d| d.file_type().is_ok_and(|t| t.is_dir())) {
            for file in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = file.path();
                let Ok(meta) = file.metadata() else { continue };
                if meta.is_file() && path.extension().is_some_and(|e| e == "tgz") {
                    let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    archives.push((used, meta.len(), path));
                }
            }
        }
        let mut total: u64 = archives.iter().map(|(_, size, _)| size).sum();
        let mut evicted = Evicted {
            before: total,
            ..Evicted::default()
        };
        archives.sort();
        for (_, size, path) in archives {
            if total <= budget {
                break;
            }
            if in_use.contains(&path) {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                let _ = std::fs::remove_file(sidecar_of(&path));
                let _ = std::fs::remove_file(super::verify::provenance::file_of(&path));
                total = total.saturating_sub(size);
                evicted.removed += 1;
                evicted.freed += size;
            }
        }
        evicted.after = total;
        if evicted.removed > 0 {
            tracing::info!(
                removed = evicted.removed,
                freed = evicted.freed,
                held = total,
                budget,
                "chart cache over its budget: removed the least recently used archives"
            );
        }
        evicted
    }

    /// Runs `helm pull` into a temporary directory and moves the chart into the cache under the
    /// version its Chart.yaml names, so that a concurrent reader never sees a half-written file.
    /// With credentials for a repository, `helm repo update` reads its index first.
    async fn download(
        &self,
        helm: &Helm,
        pull: &Pull<'_>,
        secrets: Option<&CredentialFiles>,
        mut args: Vec<OsString>,
    ) -> Result<FetchedChart, SourceError> {
        let Pull {
            key,
            name,
            source_name,
            command,
            pin,
            oci,
        } = *pull;
        let cache_error = |path: &Path, e: std::io::Error| SourceError::Cache {
            path: path.display().to_string(),
            message: super::io_message(&e),
        };
        let dir = self.source_dir(key);
        std::fs::create_dir_all(&dir).map_err(|e| cache_error(&dir, e))?;
        let staging = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&dir)
            .map_err(|e| cache_error(&dir, e))?;
        // Guarded: every connection helm makes goes through a proxy that holds it to the
        // policy, however the source redirects it.
        let guard = if self.policy.guarded() {
            Some(
                Guard::start(self.policy.clone())
                    .await
                    .map_err(|e| cache_error(&dir, e))?,
            )
        } else {
            None
        };
        let env = guard.as_ref().map(Guard::environment).unwrap_or_default();
        let pull_error = |source: HelmError| match guard.as_ref().and_then(|g| g.refused().pop()) {
            Some(refused) => SourceError::NotAllowed {
                source_name: source_name.to_string(),
                refused,
            },
            None if self.policy.multi_tenant => {
                tracing::warn!(source = source_name, error = %source, "fetching a chart failed");
                SourceError::Failed {
                    source_name: source_name.to_string(),
                    summary: summary(&source),
                }
            }
            None => SourceError::Pull {
                source_name: source_name.to_string(),
                source,
            },
        };
        if let Some(update) = secrets.and_then(|s| s.update.as_ref()) {
            helm.run_reporting_stdout(command, update, helm.timeouts().pull, &env)
                .await
                .map_err(pull_error)?;
        }
        args.push("--destination".into());
        args.push(staging.path().into());
        let (_, said) = helm
            .run_with_env_and_stderr(command, &args, helm.timeouts().pull, &env)
            .await
            .map_err(pull_error)?;
        let pulled = std::fs::read_dir(staging.path())
            .map_err(|e| cache_error(staging.path(), e))?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "tgz"))
            .ok_or_else(|| SourceError::Pulled {
                source_name: source_name.to_string(),
                message: format!("{command} wrote no .tgz file"),
            })?;
        let metadata = {
            let pulled = pulled.clone();
            tokio::task::spawn_blocking(move || super::load::archive_metadata(&pulled))
                .await
                .map_err(|e| SourceError::Pulled {
                    source_name: source_name.to_string(),
                    message: format!("reading the pulled chart stopped: {e}"),
                })?
        }
        .map_err(|e| SourceError::Pulled {
            source_name: source_name.to_string(),
            message: format!("{command}: {e}"),
        })?;
        let version = metadata.version;
        if version.is_empty() || version.starts_with('.') || version.contains(['/', '\\']) {
            return Err(SourceError::Pulled {
                source_name: source_name.to_string(),
                message: format!("{command}: the chart's version {version:?} is not a version"),
            });
        }
        let file = archive_name(name, &version);
        if !is_file_name(&file) {
            return Err(SourceError::Pulled {
                source_name: source_name.to_string(),
                message: format!("{command}: {file:?} is not a file name of the cache"),
            });
        }
        let digest = super::pin::archive_digest(&pulled).map_err(|e| cache_error(&pulled, e))?;
        let oci_digest = if oci {
            super::pin::pulled_digest(&said)
        } else {
            None
        };
        if let Some(pin) = pin {
            let (what, got) = if oci {
                ("manifest digest", oci_digest.as_deref())
            } else {
                ("archive's digest", Some(digest.as_str()))
            };
            if got != Some(pin) {
                return Err(SourceError::DigestMismatch {
                    source_name: source_name.to_string(),
                    message: format!(
                        "{command}: chart {name} version {version} has the {what} {}, not the pinned {pin}",
                        got.unwrap_or("(none said)")
                    ),
                });
            }
        }
        let target = dir.join(file);
        std::fs::rename(&pulled, &target).map_err(|e| cache_error(&target, e))?;
        touch(&target);
        // The provenance file pulled with it, or none: never one of other bytes.
        let prov = super::verify::provenance::file_of(&target);
        let pulled_prov = super::verify::provenance::file_of(&pulled);
        if pulled_prov.is_file() {
            std::fs::rename(&pulled_prov, &prov).map_err(|e| cache_error(&prov, e))?;
        } else {
            let _ = std::fs::remove_file(&prov);
        }
        let sidecar = sidecar_of(&target);
        let _ = std::fs::remove_file(&sidecar);
        if let Some(oci_digest) = &oci_digest {
            // Without it a cached pinned chart is pulled again: no harm but a download.
            let _ = std::fs::write(&sidecar, oci_digest);
        }
        let note = format!("{}\n", key.replace('\n', " "));
        // The note only helps people browsing the cache; failing to write it changes nothing.
        let _ = std::fs::write(dir.join("source.txt"), note);
        Ok(FetchedChart {
            path: target,
            version: Some(version),
            downloaded: true,
            digest: Some(digest),
            oci_digest,
        })
    }
}

impl FetchedChart {
    /// A chart on disk, used where it is.
    fn local(path: &Path) -> FetchedChart {
        FetchedChart {
            path: path.to_path_buf(),
            version: None,
            downloaded: false,
            digest: None,
            oci_digest: None,
        }
    }
}

/// What one `helm pull` fetches, for its messages and its place in the cache.
#[derive(Clone, Copy)]
struct Pull<'a> {
    key: &'a str,
    name: &'a str,
    source_name: &'a str,
    /// The command as messages show it (never with credentials).
    command: &'a str,
    /// The digest the reference or version pins (`sha256:<hex>`).
    pin: Option<&'a str>,
    /// Whether it is an OCI chart (a pin is its manifest digest).
    oci: bool,
}

/// Where the manifest digest of a cached OCI archive is kept: beside it.
fn sidecar_of(archive: &Path) -> PathBuf {
    let mut name = archive.as_os_str().to_owned();
    name.push(".digest");
    PathBuf::from(name)
}

fn read_sidecar(archive: &Path) -> Option<String> {
    let text = std::fs::read_to_string(sidecar_of(archive)).ok()?;
    Some(text.trim().to_string()).filter(|t| t.starts_with("sha256:"))
}

/// The cached archive of a directory whose manifest digest is `pin`.
fn cached_pinned(dir: &Path, pin: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "tgz"))
        .find(|path| read_sidecar(path).as_deref() == Some(pin))
}

/// The name of the repository in the repositories file made for credentials.
const CREDENTIALS_REPOSITORY: &str = "sequenced-source";

/// Credentials handed to helm in files of a private directory (mode 0700, the files 0600),
/// never on its command line, where every process of the node could read them: a
/// repositories file (`--repository-config`, with its own index cache) for an HTTP
/// repository, a registry config (`--registry-config`) for an OCI registry. Removed when
/// dropped.
struct CredentialFiles {
    _dir: tempfile::TempDir,
    /// What `helm pull` needs to find them.
    args: Vec<OsString>,
    /// For a repository: `helm repo update` with those files, before the pull.
    update: Option<Vec<OsString>>,
}

impl CredentialFiles {
    fn new(reference: &ChartReference, credentials: &Credentials) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("sequenced-credentials-")
            .tempdir()?;
        match reference {
            ChartReference::Repository { url, .. } => {
                let config = dir.path().join("repositories.yaml");
                let cache = dir.path().join("cache");
                std::fs::create_dir(&cache)?;
                let repositories = serde_json::json!({
                    "apiVersion": "",
                    "repositories": [{
                        "name": CREDENTIALS_REPOSITORY,
                        "url": url.trim_end_matches('/'),
                        "username": credentials.username,
                        "password": credentials.password,
                    }],
                });
                // JSON is YAML: no YAML writer needed for one file.
                write_private(&config, repositories.to_string().as_bytes())?;
                let files: Vec<OsString> = vec![
                    "--repository-config".into(),
                    config.into(),
                    "--repository-cache".into(),
                    cache.into(),
                ];
                let mut update: Vec<OsString> = vec!["repo".into(), "update".into()];
                update.extend(files.iter().cloned());
                Ok(CredentialFiles {
                    _dir: dir,
                    args: files,
                    update: Some(update),
                })
            }
            ChartReference::Oci { reference, .. } => {
                use base64::Engine;
                let config = dir.path().join("registry.json");
                let auth = base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", credentials.username, credentials.password));
                let registry = registry_of(reference.trim_end_matches('/'));
                let auths = serde_json::json!({"auths": {registry: {"auth": auth}}});
                write_private(&config, auths.to_string().as_bytes())?;
                Ok(CredentialFiles {
                    _dir: dir,
                    args: vec!["--registry-config".into(), config.into()],
                    update: None,
                })
            }
            ChartReference::Path(_) => Ok(CredentialFiles {
                _dir: dir,
                args: Vec::new(),
                update: None,
            }),
        }
    }
}

/// Writes a file only its owner may read (0600).
fn write_private(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)?.write_all(content)
}

/// What is left of the cache after [`ChartCache::evict`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Bytes of archives before and after.
    pub before: u64,
    pub after: u64,
    pub removed: usize,
    pub freed: u64,
}

/// Marks an archive as just used (its modification time), for the cache's eviction order.
fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(std::time::SystemTime::now());
    }
}

/// A name that stays one file of its directory: not empty, no separator, not `.`-led (so not
/// `.` or `..`), no NUL.
fn is_file_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0'])
}

/// What a failed fetch may tell a tenant: the host and HTTP status a source answered, or the
/// kind of failure; never the body of an answer (helm quotes what it could not parse).
fn summary(error: &HelmError) -> String {
    let HelmError::Failed { stderr, .. } = error else {
        return error.to_string();
    };
    static STATUS: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(?:failed to fetch|fetching|GET|response status code|unexpected status( code)?|:) ?(?P<url>(?:https?|oci)://[^\s:/]+(?::\d+)?)?[^\n]*?\b(?P<code>[1-5]\d\d) (?P<text>[A-Z][A-Za-z ]{1,40}?)\b(?:\n|$|[^A-Za-z])").expect("pattern")
    });
    static HOST: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(?:https?|oci)://(?:[^@\s/]+@)?(?P<host>\[[^\]\s]+\]|[A-Za-z0-9.-]+)(?::(?P<port>\d+))?").expect("pattern")
    });
    let host = HOST.captures(stderr).map(|c| {
        let host = c.name("host").map_or("", |m| m.as_str());
        match c.name("port") {
            Some(port) => format!("{host}:{}", port.as_str()),
            None => host.to_string(),
        }
    });
    let at = host.map(|h| format!(" from {h}")).unwrap_or_default();
    let lower = stderr.to_ascii_lowercase();
    if let Some(c) = STATUS.captures(stderr) {
        let code = c.name("code").map_or("", |m| m.as_str());
        let text = c.name("text").map_or("", |m| m.as_str().trim());
        return format!("HTTP {code} {text}{at}");
    }
    let kind = if lower.contains("not found in") && lower.contains("chart") {
        "the chart or version is not in the repository's index"
    } else if lower.contains("connection refused") {
        "connection refused"
    } else if lower.contains("no such host") || lower.contains("server misbehaving") {
        "the host name does not resolve"
    } else if lower.contains("timeout") || lower.contains("deadline exceeded") {
        "the connection timed out"
    } else if lower.contains("x509") || lower.contains("certificate") || lower.contains("tls") {
        "the TLS handshake failed"
    } else if lower.contains("unauthorized") || lower.contains("authentication") {
        "the credentials were refused"
    } else if lower.contains("connection reset") || lower.contains("eof") {
        "the connection was closed"
    } else {
        "the answer is not a chart repository or registry"
    };
    format!("helm pull failed: {kind}{at}")
}

/// The registry host of an OCI reference: `oci://registry:5000/charts/x` -> `registry:5000`.
fn registry_of(reference: &str) -> &str {
    let rest = reference.strip_prefix("oci://").unwrap_or(reference);
    rest.split('/').next().unwrap_or(rest)
}

fn archive_name(name: &str, version: &str) -> String {
    format!("{name}-{version}.tgz")
}

/// An exact version (not a range), which also makes a safe file name.
fn is_exact(version: &str) -> bool {
    semver::Version::parse(version.strip_prefix('v').unwrap_or(version)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_versions_are_recognised() {
        assert!(is_exact("1.2.3"));
        assert!(is_exact("v1.2.3"));
        assert!(is_exact("1.2.3-rc.1+build"));
        assert!(!is_exact("^1.2"));
        assert!(!is_exact("1.2"));
        assert!(!is_exact(">=1.0.0"));
        assert!(!is_exact("../1.2.3"));
    }
}
