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

/// A username and password for a repository or registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
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
        }
    }
}

/// The on-disk cache of downloaded charts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartCache {
    dir: PathBuf,
}

impl ChartCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ChartCache { dir: dir.into() }
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
        let (key, name, source_name) = match reference {
            ChartReference::Path(path) => return Ok(FetchedChart::local(path)),
            ChartReference::Repository { url, name, .. } => {
                let url = url.trim_end_matches('/');
                let key = format!("repository\n{url}\n{name}");
                (key, name.clone(), format!("chart repository {url}"))
            }
            ChartReference::Oci { reference, .. } => {
                let reference = reference.trim_end_matches('/');
                let name = reference.rsplit('/').next().unwrap_or(reference);
                let key = format!("oci\n{reference}");
                (
                    key,
                    name.to_string(),
                    format!("OCI registry {}", registry_of(reference)),
                )
            }
        };
        let version = match reference {
            ChartReference::Repository { version, .. } | ChartReference::Oci { version, .. } => {
                version.as_deref().filter(|v| !v.is_empty())
            }
            ChartReference::Path(_) => None,
        };
        // An exact version that is cached needs no network: Helm would pick that very version.
        if let Some(exact) = version.filter(|v| is_exact(v)) {
            let path = self.source_dir(&key).join(archive_name(&name, exact));
            if path.is_file() {
                return Ok(FetchedChart {
                    path,
                    version: Some(exact.to_string()),
                    downloaded: false,
                });
            }
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
            ChartReference::Oci {
                reference,
                plain_http,
                ..
            } => {
                let reference = reference.trim_end_matches('/');
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
        };
        let fetched = self.download(helm, &pull, secrets.as_ref(), args).await;
        drop(secrets);
        fetched
    }

    /// The directory of one source in the cache.
    fn source_dir(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        self.dir.join(hex::encode(&digest[..12]))
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
        let pull_error = |source| SourceError::Pull {
            source_name: source_name.to_string(),
            source,
        };
        if let Some(update) = secrets.and_then(|s| s.update.as_ref()) {
            helm.run_reporting_stdout(command, update, helm.timeouts().pull)
                .await
                .map_err(pull_error)?;
        }
        args.push("--destination".into());
        args.push(staging.path().into());
        helm.run(command, &args, helm.timeouts().pull)
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
        let target = dir.join(archive_name(name, &version));
        std::fs::rename(&pulled, &target).map_err(|e| cache_error(&target, e))?;
        let note = format!("{}\n", key.replace('\n', " "));
        // The note only helps people browsing the cache; failing to write it changes nothing.
        let _ = std::fs::write(dir.join("source.txt"), note);
        Ok(FetchedChart {
            path: target,
            version: Some(version),
            downloaded: true,
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
