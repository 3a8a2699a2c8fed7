//! Where charts come from: a local path, an HTTP chart repository, or an OCI registry.
//!
//! Remote charts are downloaded with `helm pull` into an on-disk cache keyed by the source and the
//! resolved version, so a second use does not download again. A version range (`^1.2`) is resolved
//! first, against the repository's index.yaml or the registry's tag list, the way Helm resolves it;
//! an exact version that is already cached needs no network at all.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::constraint::{self, Constraint};
use crate::helm::{Helm, HelmError};

/// The environment variable that overrides the cache directory.
pub const CACHE_ENV: &str = "SEQUENCED_CACHE_DIR";

/// Largest index.yaml or tag list we read (large public repositories have indexes of tens of MiB).
const MAX_INDEX_SIZE: u64 = 256 * 1024 * 1024;

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
    #[error("chart repository {url}: {message}")]
    Repository { url: String, message: String },
    #[error("chart repository {url}: no chart named {name:?} in its index.yaml")]
    NoSuchChart { url: String, name: String },
    #[error(
        "{source_name}: no version of chart {name} matches {constraint:?} (available: {available})"
    )]
    NoMatchingVersion {
        source_name: String,
        name: String,
        constraint: String,
        available: String,
    },
    #[error("{source_name}: invalid version {version:?}: {message}")]
    BadVersion {
        source_name: String,
        version: String,
        message: String,
    },
    #[error("OCI registry {reference}: {message}")]
    Registry { reference: String, message: String },
    #[error("downloading {reference} with helm pull failed:\n{source}")]
    Pull {
        reference: String,
        #[source]
        source: HelmError,
    },
    #[error("chart cache {path}: {message}")]
    Cache { path: String, message: String },
}

impl SourceError {
    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            SourceError::Repository { .. } | SourceError::Registry { .. } => "unreachable",
            SourceError::NoSuchChart { .. } | SourceError::NoMatchingVersion { .. } => {
                "no_such_chart"
            }
            SourceError::BadVersion { .. } => "bad_version",
            SourceError::Pull { .. } => "pull_failed",
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
    pub fn fetch(
        &self,
        helm: &Helm,
        reference: &ChartReference,
        credentials: Option<&Credentials>,
    ) -> Result<FetchedChart, SourceError> {
        match reference {
            ChartReference::Path(path) => Ok(FetchedChart {
                path: path.clone(),
                version: None,
                downloaded: false,
            }),
            ChartReference::Repository { url, name, version } => {
                self.fetch_from_repository(helm, url, name, version.as_deref(), credentials)
            }
            ChartReference::Oci {
                reference,
                version,
                plain_http,
            } => self.fetch_from_registry(
                helm,
                reference,
                version.as_deref(),
                *plain_http,
                credentials,
            ),
        }
    }

    fn fetch_from_repository(
        &self,
        helm: &Helm,
        url: &str,
        name: &str,
        version: Option<&str>,
        credentials: Option<&Credentials>,
    ) -> Result<FetchedChart, SourceError> {
        let url = url.trim_end_matches('/');
        let key = format!("repository\n{url}\n{name}");
        // An exact version that is cached needs no index: Helm picks an exact match first.
        if let Some(exact) = version.filter(|v| is_exact(v))
            && let Some(path) = self.cached(&key, name, exact)
        {
            return Ok(FetchedChart {
                path,
                version: Some(exact.to_string()),
                downloaded: false,
            });
        }
        let resolved = resolve_in_index(url, name, version, credentials)?;
        if let Some(path) = self.cached(&key, name, &resolved) {
            return Ok(FetchedChart {
                path,
                version: Some(resolved),
                downloaded: false,
            });
        }
        let mut args: Vec<OsString> = vec![
            "pull".into(),
            name.into(),
            "--repo".into(),
            url.into(),
            "--version".into(),
            resolved.clone().into(),
        ];
        push_credentials(&mut args, credentials);
        let path = self.download(
            helm,
            &key,
            name,
            &resolved,
            args,
            &format!("{url} chart {name}"),
        )?;
        Ok(FetchedChart {
            path,
            version: Some(resolved),
            downloaded: true,
        })
    }

    fn fetch_from_registry(
        &self,
        helm: &Helm,
        reference: &str,
        version: Option<&str>,
        plain_http: bool,
        credentials: Option<&Credentials>,
    ) -> Result<FetchedChart, SourceError> {
        let reference = reference.trim_end_matches('/');
        let name = reference
            .rsplit('/')
            .next()
            .unwrap_or(reference)
            .to_string();
        let key = format!("oci\n{reference}");
        let resolved = match version.filter(|v| is_exact(v)) {
            Some(exact) => exact.to_string(),
            None => {
                let tags = list_tags(reference, plain_http, credentials)?;
                select_version(reference, &name, version, tags.iter().map(String::as_str))?
            }
        };
        if let Some(path) = self.cached(&key, &name, &resolved) {
            return Ok(FetchedChart {
                path,
                version: Some(resolved),
                downloaded: false,
            });
        }
        let mut args: Vec<OsString> = vec![
            "pull".into(),
            reference.into(),
            "--version".into(),
            resolved.clone().into(),
        ];
        if plain_http {
            args.push("--plain-http".into());
        }
        push_credentials(&mut args, credentials);
        let path = self.download(helm, &key, &name, &resolved, args, reference)?;
        Ok(FetchedChart {
            path,
            version: Some(resolved),
            downloaded: true,
        })
    }

    /// The directory of one source in the cache.
    fn source_dir(&self, key: &str) -> PathBuf {
        let digest = Sha256::digest(key.as_bytes());
        self.dir.join(hex::encode(&digest[..12]))
    }

    fn cached(&self, key: &str, name: &str, version: &str) -> Option<PathBuf> {
        let path = self.source_dir(key).join(archive_name(name, version));
        path.is_file().then_some(path)
    }

    /// Runs `helm pull` into a temporary directory and moves the chart into the cache, so that a
    /// concurrent reader never sees a half-written file.
    fn download(
        &self,
        helm: &Helm,
        key: &str,
        name: &str,
        version: &str,
        mut args: Vec<OsString>,
        reference: &str,
    ) -> Result<PathBuf, SourceError> {
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
        helm.run("helm pull", &args)
            .map_err(|source| SourceError::Pull {
                reference: reference.to_string(),
                source,
            })?;
        let pulled = std::fs::read_dir(staging.path())
            .map_err(|e| cache_error(staging.path(), e))?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.path())
            .find(|path| path.extension().is_some_and(|ext| ext == "tgz"))
            .ok_or_else(|| SourceError::Cache {
                path: staging.path().display().to_string(),
                message: "helm pull wrote no .tgz file".to_string(),
            })?;
        let target = dir.join(archive_name(name, version));
        std::fs::rename(&pulled, &target).map_err(|e| cache_error(&target, e))?;
        let note = format!("{}\n", key.replace('\n', " "));
        // The note only helps people browsing the cache; failing to write it changes nothing.
        let _ = std::fs::write(dir.join("source.txt"), note);
        Ok(target)
    }
}

fn archive_name(name: &str, version: &str) -> String {
    format!("{name}-{version}.tgz")
}

/// An exact version (not a range): what Helm looks up without resolving.
fn is_exact(version: &str) -> bool {
    semver::Version::parse(version.strip_prefix('v').unwrap_or(version)).is_ok()
}

fn push_credentials(args: &mut Vec<OsString>, credentials: Option<&Credentials>) {
    if let Some(credentials) = credentials {
        args.push("--username".into());
        args.push(credentials.username.clone().into());
        args.push("--password".into());
        args.push(credentials.password.clone().into());
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(120)))
        .timeout_connect(Some(Duration::from_secs(15)))
        .http_status_as_error(false)
        .user_agent(concat!("sequenced/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

fn basic_auth(credentials: &Credentials) -> String {
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", credentials.username, credentials.password));
    format!("Basic {token}")
}

/// A network error in one line, without the library's internals.
fn transport_message(error: &ureq::Error) -> String {
    match error {
        ureq::Error::Io(e) => super::io_message(e),
        ureq::Error::Timeout(_) => "timed out".to_string(),
        ureq::Error::HostNotFound => "host not found".to_string(),
        ureq::Error::ConnectionFailed => "connection failed".to_string(),
        other => other.to_string(),
    }
}

/// Reads `url/index.yaml` and picks the version of `name` Helm would pick for `version`.
fn resolve_in_index(
    url: &str,
    name: &str,
    version: Option<&str>,
    credentials: Option<&Credentials>,
) -> Result<String, SourceError> {
    let index_url = format!("{url}/index.yaml");
    let error = |message: String| SourceError::Repository {
        url: url.to_string(),
        message,
    };
    let mut request = agent().get(&index_url);
    if let Some(credentials) = credentials {
        request = request.header("Authorization", basic_auth(credentials));
    }
    let mut response = request.call().map_err(|e| {
        error(format!(
            "cannot fetch index.yaml: {}",
            transport_message(&e)
        ))
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(error(format!("GET {index_url} answered {status}")));
    }
    let body = read_body(&mut response, "index.yaml").map_err(error)?;
    let index = crate::yaml::parse(&body)
        .map_err(|e| error(format!("index.yaml is not valid YAML: {e}")))?;
    let entries = index
        .get("entries")
        .and_then(|entries| entries.get(name))
        .and_then(Value::as_array)
        .ok_or_else(|| SourceError::NoSuchChart {
            url: url.to_string(),
            name: name.to_string(),
        })?;
    let versions: Vec<&str> = entries
        .iter()
        .filter_map(|entry| entry.get("version").and_then(Value::as_str))
        .collect();
    select_version(url, name, version, versions.into_iter())
}

/// Helm's choice among available versions: an exact string match first, else the highest version
/// that satisfies the constraint (`*`, which excludes pre-releases, when none is given).
fn select_version<'a>(
    source_name: &str,
    name: &str,
    version: Option<&str>,
    available: impl Iterator<Item = &'a str> + Clone,
) -> Result<String, SourceError> {
    let wanted = version.filter(|v| !v.is_empty());
    if let Some(wanted) = wanted
        && let Some(exact) = available.clone().find(|v| *v == wanted)
    {
        return Ok(exact.to_string());
    }
    let constraint_text = wanted.unwrap_or("*");
    let constraint = Constraint::parse(constraint_text).map_err(|e| SourceError::BadVersion {
        source_name: source_name.to_string(),
        version: constraint_text.to_string(),
        message: e.to_string(),
    })?;
    constraint::best_match(&constraint, available.clone())
        .map(str::to_string)
        .ok_or_else(|| {
            let mut listed: Vec<&str> = available.collect();
            listed.sort_by(|a, b| {
                let parse = |v: &str| constraint::parse_version(v).ok();
                parse(b).cmp(&parse(a))
            });
            let total = listed.len();
            listed.truncate(10);
            let mut available = listed.join(", ");
            if total > 10 {
                available.push_str(&format!(" and {} more", total - 10));
            }
            if available.is_empty() {
                available = "none".to_string();
            }
            SourceError::NoMatchingVersion {
                source_name: source_name.to_string(),
                name: name.to_string(),
                constraint: constraint_text.to_string(),
                available,
            }
        })
}

/// The tags of an OCI repository, through the registry API (`/v2/<name>/tags/list`), with the
/// anonymous or basic token exchange registries ask for. Helm writes `+` of a version as `_` in
/// tags; they are given back with `+`.
fn list_tags(
    reference: &str,
    plain_http: bool,
    credentials: Option<&Credentials>,
) -> Result<Vec<String>, SourceError> {
    let error = |message: String| SourceError::Registry {
        reference: reference.to_string(),
        message,
    };
    let rest = reference
        .strip_prefix("oci://")
        .ok_or_else(|| error("an OCI reference starts with oci://".to_string()))?;
    let (host, repository) = rest
        .split_once('/')
        .filter(|(host, repo)| !host.is_empty() && !repo.is_empty())
        .ok_or_else(|| error("expected oci://REGISTRY/PATH/CHART".to_string()))?;
    let scheme = if plain_http { "http" } else { "https" };
    let agent = agent();
    let mut next = Some(format!("{scheme}://{host}/v2/{repository}/tags/list"));
    let mut authorization = credentials.map(basic_auth);
    let mut tags = Vec::new();
    let mut pages = 0;
    while let Some(url) = next.take() {
        pages += 1;
        if pages > 100 {
            return Err(error("the tag list has more than 100 pages".to_string()));
        }
        let mut response = send(&agent, &url, authorization.as_deref(), &error)?;
        if response.status() == 401 {
            let challenge = response
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            authorization = Some(authorize(&agent, &challenge, credentials, &error)?);
            response = send(&agent, &url, authorization.as_deref(), &error)?;
        }
        let status = response.status();
        if !status.is_success() {
            return Err(error(format!("GET {url} answered {status}")));
        }
        next = response
            .headers()
            .get("link")
            .and_then(|v| v.to_str().ok())
            .and_then(|link| next_link(link, scheme, host));
        let body = read_body(&mut response, "the tag list").map_err(error)?;
        let list: Value = serde_json::from_str(&body)
            .map_err(|e| error(format!("the tag list is not JSON: {e}")))?;
        tags.extend(
            list.get("tags")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|tag| tag.replace('_', "+")),
        );
    }
    Ok(tags)
}

/// A response body as text, at most [`MAX_INDEX_SIZE`] bytes; `what` names it in errors.
fn read_body(
    response: &mut ureq::http::Response<ureq::Body>,
    what: &str,
) -> Result<String, String> {
    let mut body = String::new();
    response
        .body_mut()
        .as_reader()
        .take(MAX_INDEX_SIZE + 1)
        .read_to_string(&mut body)
        .map_err(|e| format!("cannot read {what}: {}", super::io_message(&e)))?;
    if body.len() as u64 > MAX_INDEX_SIZE {
        return Err(format!(
            "{what} is larger than {} MiB",
            MAX_INDEX_SIZE / 1024 / 1024
        ));
    }
    Ok(body)
}

fn send(
    agent: &ureq::Agent,
    url: &str,
    authorization: Option<&str>,
    error: &impl Fn(String) -> SourceError,
) -> Result<ureq::http::Response<ureq::Body>, SourceError> {
    let mut request = agent.get(url).header("Accept", "application/json");
    if let Some(authorization) = authorization {
        request = request.header("Authorization", authorization);
    }
    request.call().map_err(|e| {
        error(format!(
            "cannot reach the registry: {}",
            transport_message(&e)
        ))
    })
}

/// Answers a `WWW-Authenticate` challenge: basic credentials, or a bearer token from the realm.
fn authorize(
    agent: &ureq::Agent,
    challenge: &str,
    credentials: Option<&Credentials>,
    error: &impl Fn(String) -> SourceError,
) -> Result<String, SourceError> {
    let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return credentials
            .map(basic_auth)
            .ok_or_else(|| error("the registry needs credentials".to_string()));
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(error(format!(
            "unsupported authentication challenge {challenge:?}"
        )));
    }
    let params = parse_challenge(params);
    let realm = params
        .iter()
        .find(|(k, _)| k == "realm")
        .map(|(_, v)| v.clone())
        .ok_or_else(|| error("the registry's bearer challenge names no realm".to_string()))?;
    let mut request = agent.get(&realm);
    for (key, value) in &params {
        if key == "service" || key == "scope" {
            request = request.query(key, value);
        }
    }
    if let Some(credentials) = credentials {
        request = request.header("Authorization", basic_auth(credentials));
    }
    let mut response = request.call().map_err(|e| {
        error(format!(
            "cannot get a token from {realm}: {}",
            transport_message(&e)
        ))
    })?;
    if !response.status().is_success() {
        return Err(error(format!(
            "the token service {realm} answered {}",
            response.status()
        )));
    }
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| error(format!("cannot read the token: {}", transport_message(&e))))?;
    let token: Value =
        serde_json::from_str(&body).map_err(|e| error(format!("the token is not JSON: {e}")))?;
    token
        .get("token")
        .or_else(|| token.get("access_token"))
        .and_then(Value::as_str)
        .map(|t| format!("Bearer {t}"))
        .ok_or_else(|| error("the token service gave no token".to_string()))
}

/// `realm="https://x",service="y",scope="a:b:pull"` into pairs.
fn parse_challenge(params: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = params.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remainder) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.push((key, value.to_string()));
        rest = remainder.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

/// The `rel="next"` target of a Link header, made absolute.
fn next_link(link: &str, scheme: &str, host: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        if !params.contains("rel=\"next\"") && !params.contains("rel=next") {
            return None;
        }
        let target = target.trim().trim_start_matches('<').trim_end_matches('>');
        Some(
            if target.starts_with("http://") || target.starts_with("https://") {
                target.to_string()
            } else {
                format!("{scheme}://{host}{target}")
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_selected_as_helm_selects_them() {
        let available = ["2.0.0-rc.1", "1.10.0", "1.9.3", "1.2.0", "0.9.0"];
        let pick = |v: Option<&str>| select_version("repo", "app", v, available.iter().copied());
        assert_eq!(pick(None).unwrap(), "1.10.0");
        assert_eq!(pick(Some("^1.2")).unwrap(), "1.10.0");
        assert_eq!(pick(Some("~1.9.0")).unwrap(), "1.9.3");
        assert_eq!(pick(Some("1.2.0")).unwrap(), "1.2.0");
        assert_eq!(pick(Some("2.0.0-rc.1")).unwrap(), "2.0.0-rc.1");
        let err = pick(Some("^3")).unwrap_err().to_string();
        assert!(
            err.contains("no version of chart app matches \"^3\""),
            "{err}"
        );
        assert!(err.contains("available: 2.0.0-rc.1, 1.10.0"), "{err}");
        let err = pick(Some(">>1")).unwrap_err().to_string();
        assert!(err.contains("invalid version \">>1\""), "{err}");
    }

    #[test]
    fn challenges_and_links_are_parsed() {
        let params = parse_challenge(
            r#"realm="https://auth.example.com/token",service="registry.example.com",scope="repository:charts/app:pull""#,
        );
        assert_eq!(
            params[0],
            ("realm".into(), "https://auth.example.com/token".into())
        );
        assert_eq!(
            params[2],
            ("scope".into(), "repository:charts/app:pull".into())
        );
        assert_eq!(
            next_link(
                r#"</v2/charts/app/tags/list?n=100&last=1.0.0>; rel="next""#,
                "https",
                "r.io"
            )
            .as_deref(),
            Some("https://r.io/v2/charts/app/tags/list?n=100&last=1.0.0")
        );
        assert_eq!(next_link(r#"<x>; rel="prev""#, "https", "r.io"), None);
    }

    #[test]
    fn exact_versions_skip_resolution() {
        assert!(is_exact("1.2.3"));
        assert!(is_exact("v1.2.3"));
        assert!(is_exact("1.2.3-rc.1+build"));
        assert!(!is_exact("^1.2"));
        assert!(!is_exact("1.2"));
        assert!(!is_exact(">=1.0.0"));
    }
}
