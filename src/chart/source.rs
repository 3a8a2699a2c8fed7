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
        let (key, name, source_name, mut args) = match reference {
            ChartReference::Path(path) => {
                return Ok(FetchedChart {
                    path: path.clone(),
                    version: None,
                    downloaded: false,
                });
            }
            ChartReference::Repository { url, name, .. } => {
                let url = url.trim_end_matches('/');
                let args: Vec<OsString> =
                    vec!["pull".into(), name.into(), "--repo".into(), url.into()];
                let key = format!("repository\n{url}\n{name}");
                (key, name.clone(), format!("chart repository {url}"), args)
            }
            ChartReference::Oci {
                reference,
                plain_http,
                ..
            } => {
                let reference = reference.trim_end_matches('/');
                let name = reference.rsplit('/').next().unwrap_or(reference);
                let registry = reference.strip_prefix("oci://").unwrap_or(reference);
                let registry = registry.split('/').next().unwrap_or(registry);
                let mut args: Vec<OsString> = vec!["pull".into(), reference.into()];
                if *plain_http {
                    args.push("--plain-http".into());
                }
                let key = format!("oci\n{reference}");
                (
                    key,
                    name.to_string(),
                    format!("OCI registry {registry}"),
                    args,
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
        let mut command = format!("helm pull {}", args[1].to_string_lossy());
        if let Some(version) = version {
            args.push("--version".into());
            args.push(version.into());
            command.push_str(&format!(" --version {version}"));
        }
        if let Some(credentials) = credentials {
            args.push("--username".into());
            args.push(credentials.username.clone().into());
            args.push("--password".into());
            args.push(credentials.password.clone().into());
        }
        self.download(helm, &key, &name, &source_name, &command, args)
            .await
    }

    /// The directory of one source in the cache.
    fn source_dir(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        self.dir.join(hex::encode(&digest[..12]))
    }

    /// Runs `helm pull` into a temporary directory and moves the chart into the cache under the
    /// version its Chart.yaml names, so that a concurrent reader never sees a half-written file.
    async fn download(
        &self,
        helm: &Helm,
        key: &str,
        name: &str,
        source_name: &str,
        command: &str,
        mut args: Vec<OsString>,
    ) -> Result<FetchedChart, SourceError> {
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
        args.push("--destination".into());
        args.push(staging.path().into());
        helm.run(command, &args, helm.timeouts().pull)
            .await
            .map_err(|source| SourceError::Pull {
                source_name: source_name.to_string(),
                source,
            })?;
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
