//! Remote charts: pulled with `helm pull` from a chart repository or an OCI registry served on
//! loopback. Helm resolves version ranges; the cache holds one file per source and version, and
//! an exact version that is cached is not downloaded again.

use sequenced_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sequenced::chart::source::{
    ChartCache, ChartReference, Credentials, FetchedChart, SourceError,
};
use sequenced::helm::{Helm, HelmError};
use sha2::{Digest, Sha256};
use support::http::{Request, Response, Server, serve_dir as serve, unauthorized};
use support::{chart, package, recording_helm};
use tempfile::TempDir;

fn helm() -> Helm {
    Helm::at(support::helm())
}

/// Fetches `reference` into `cache` with the test's helm.
fn fetch(
    cache: &ChartCache,
    reference: &ChartReference,
    credentials: Option<&Credentials>,
) -> Result<FetchedChart, SourceError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(cache.fetch(&helm(), reference, credentials))
}

/// Packages `demo` in the given versions into `dir`.
fn demo_charts(dir: &Path, versions: &[&str]) -> Vec<PathBuf> {
    versions
        .iter()
        .map(|version| {
            let source = TempDir::new().unwrap();
            chart(source.path(), "demo", version, "");
            package(source.path(), dir)
        })
        .collect()
}

/// A chart repository: the packaged charts plus the index.yaml `helm repo index` writes.
fn repository(versions: &[&str]) -> TempDir {
    let dir = TempDir::new().unwrap();
    demo_charts(dir.path(), versions);
    let status = Command::new(support::helm())
        .arg("repo")
        .arg("index")
        .arg(dir.path())
        .status()
        .expect("helm repo index");
    assert!(status.success());
    dir
}

fn repo_ref(server: &Server, version: Option<&str>) -> ChartReference {
    ChartReference::Repository {
        url: server.url(),
        name: "demo".into(),
        version: version.map(str::to_string),
    }
}

fn version_of(path: &Path) -> String {
    sequenced::chart::load(path)
        .expect("load the fetched chart")
        .metadata
        .version
}

#[test]
fn a_repository_chart_is_downloaded_once_then_served_from_the_cache() {
    let repo = repository(&["0.1.0", "0.2.0", "1.0.0-rc.1"]);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());

    let first = fetch(&cache, &repo_ref(&server, Some(">=0.1.0")), None).unwrap();
    assert!(first.downloaded);
    assert_eq!(
        first.version.as_deref(),
        Some("0.2.0"),
        "a range picks the newest stable match"
    );
    assert!(first.path.starts_with(cache_dir.path()));
    assert_eq!(version_of(&first.path), "0.2.0");
    assert_eq!(server.count("GET", "/demo-0.2.0.tgz"), 1);

    // A range is Helm's to resolve, so it is pulled again; the cache keeps one file per version.
    let second = fetch(&cache, &repo_ref(&server, Some(">=0.1.0")), None).unwrap();
    assert_eq!(second.version.as_deref(), Some("0.2.0"));
    assert_eq!(second.path, first.path);

    // No version: the newest stable one.
    let latest = fetch(&cache, &repo_ref(&server, None), None).unwrap();
    assert_eq!(latest.version.as_deref(), Some("0.2.0"));
    assert_eq!(latest.path, first.path);

    // A pre-release only when asked for.
    let rc = fetch(&cache, &repo_ref(&server, Some("1.0.0-rc.1")), None).unwrap();
    assert!(rc.downloaded);
    assert_eq!(version_of(&rc.path), "1.0.0-rc.1");

    // An exact version that is cached needs no network at all.
    let exact = fetch(&cache, &repo_ref(&server, Some("0.1.0")), None).unwrap();
    assert!(exact.downloaded);
    let url = server.url();
    drop(server);
    let offline = ChartReference::Repository {
        url,
        name: "demo".into(),
        version: Some("0.1.0".into()),
    };
    let again = fetch(&cache, &offline, None).unwrap();
    assert!(!again.downloaded);
    assert_eq!(version_of(&again.path), "0.1.0");
}

#[test]
fn repository_errors_name_the_repository_and_keep_helms_message() {
    let repo = repository(&["0.1.0"]);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let url = server.url();

    let err = fetch(&cache, &repo_ref(&server, Some("^5.0.0")), None).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Pull {
                source: HelmError::Failed { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "chart repository {url}: helm pull demo --version ^5.0.0 failed (exit code 1): \
             chart \"demo\" version \"^5.0.0\" not found in {url} repository"
        )
    );

    let missing = ChartReference::Repository {
        url: url.clone(),
        name: "nope".into(),
        version: None,
    };
    let err = fetch(&cache, &missing, None).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "chart repository {url}: helm pull nope failed (exit code 1): \
             chart \"nope\" not found in {url} repository"
        )
    );

    let unreachable = ChartReference::Repository {
        url: "http://127.0.0.1:9".into(),
        name: "demo".into(),
        version: Some("^0.1".into()),
    };
    let err = fetch(&cache, &unreachable, None).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "chart repository http://127.0.0.1:9: helm pull demo --version ^0.1 failed (exit code 1): "
        ),
        "{err}"
    );
    assert!(err.contains("cannot be reached"), "{err}");
}

#[test]
fn repository_credentials_reach_helm_and_no_message_shows_them() {
    let repo = repository(&["0.3.0"]);
    let server = serve(repo.path(), Some("s3cret"));
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let err = fetch(&cache, &repo_ref(&server, None), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("401"), "{err}");
    let wrong = Credentials {
        username: "ci".into(),
        password: "wr0ng-s3cret".into(),
        scope: "team".into(),
    };
    let err = fetch(&cache, &repo_ref(&server, None), Some(&wrong))
        .unwrap_err()
        .to_string();
    assert!(err.contains("401"), "{err}");
    assert!(!err.contains("wr0ng-s3cret"), "{err}");
    let credentials = Credentials {
        username: "ci".into(),
        password: "s3cret".into(),
        scope: "team".into(),
    };
    let fetched = fetch(&cache, &repo_ref(&server, None), Some(&credentials)).unwrap();
    assert_eq!(version_of(&fetched.path), "0.3.0");
    assert!(!format!("{credentials:?}").contains("s3cret"));
}

/// A minimal OCI registry holding the given packaged charts, as `helm push` would store them.
fn registry(charts: &[PathBuf]) -> Server {
    registry_with(charts, None)
}

/// [`registry`], answering only requests with the basic credentials `ci:PASSWORD` when a
/// password is given (401 with a Basic challenge otherwise, as a registry with htpasswd does).
fn registry_with(charts: &[PathBuf], password: Option<&'static str>) -> Server {
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut manifests: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let digest = |data: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(data)));
    for path in charts {
        let archive = std::fs::read(path).unwrap();
        let loaded = sequenced::chart::load(path).unwrap();
        let config = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v2",
            "name": loaded.metadata.name,
            "version": loaded.metadata.version,
        }))
        .unwrap();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.cncf.helm.config.v1+json",
                "digest": digest(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                "digest": digest(&archive),
                "size": archive.len(),
            }],
            "annotations": {
                "org.opencontainers.image.title": loaded.metadata.name,
                "org.opencontainers.image.version": loaded.metadata.version,
            },
        }))
        .unwrap();
        blobs.insert(digest(&config), config);
        blobs.insert(digest(&archive), archive);
        manifests.insert(digest(&manifest), manifest.clone());
        manifests.insert(loaded.metadata.version.replace('+', "_"), manifest);
    }
    let blobs = Arc::new(blobs);
    let manifests = Arc::new(manifests);
    Server::start(move |request: &Request| {
        if let Some(refused) = unauthorized(
            request,
            password,
            "registry",
            b"{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}",
        ) {
            return refused;
        }
        let path = request.path.as_str();
        if path == "/v2/" || path == "/v2" {
            return Response::ok("application/json", "{}");
        }
        if path == "/v2/charts/demo/tags/list" {
            let tags: Vec<&String> = manifests
                .keys()
                .filter(|k| !k.starts_with("sha256:"))
                .collect();
            let body = serde_json::json!({"name": "charts/demo", "tags": tags}).to_string();
            return Response::ok("application/json", body);
        }
        if let Some(reference) = path.strip_prefix("/v2/charts/demo/manifests/") {
            return match manifests.get(reference) {
                Some(manifest) => {
                    let digest = format!("sha256:{}", hex::encode(Sha256::digest(manifest)));
                    Response::ok(
                        "application/vnd.oci.image.manifest.v1+json",
                        manifest.clone(),
                    )
                    .header("Docker-Content-Digest", &digest)
                }
                None => Response::not_found(),
            };
        }
        if let Some(digest) = path.strip_prefix("/v2/charts/demo/blobs/") {
            return match blobs.get(digest) {
                Some(blob) => Response::ok("application/octet-stream", blob.clone())
                    .header("Docker-Content-Digest", digest),
                None => Response::not_found(),
            };
        }
        Response::not_found()
    })
}

fn oci_ref(server: &Server, version: Option<&str>) -> ChartReference {
    ChartReference::Oci {
        reference: format!("oci://127.0.0.1:{}/charts/demo", server.port),
        version: version.map(str::to_string),
        plain_http: true,
    }
}

#[test]
fn an_oci_chart_of_an_exact_version_is_downloaded_once_and_helm_resolves_ranges() {
    let packages = TempDir::new().unwrap();
    let charts = demo_charts(packages.path(), &["0.1.0", "0.2.0", "0.2.1"]);
    let server = registry(&charts);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());

    let first = fetch(&cache, &oci_ref(&server, Some("0.1.0")), None).unwrap();
    assert!(first.downloaded);
    assert_eq!(version_of(&first.path), "0.1.0");
    let blob_requests = server.count("GET", "") - server.count("GET", "/tags/list");
    assert!(blob_requests > 0);

    let before = server.requests().len();
    let second = fetch(&cache, &oci_ref(&server, Some("0.1.0")), None).unwrap();
    assert!(!second.downloaded);
    assert_eq!(second.path, first.path);
    assert_eq!(
        server.requests().len(),
        before,
        "an exact cached version needs no request"
    );

    // Helm resolves a range against the registry's tags; the version it chose is what the
    // pulled chart says, and that file is then an exact version of the cache.
    let ranged = fetch(&cache, &oci_ref(&server, Some("~0.2.0")), None).unwrap();
    assert!(ranged.downloaded);
    assert_eq!(ranged.version.as_deref(), Some("0.2.1"));
    assert_eq!(version_of(&ranged.path), "0.2.1");
    assert!(server.count("GET", "/tags/list") >= 1);
    let before = server.requests().len();
    let exact = fetch(&cache, &oci_ref(&server, Some("0.2.1")), None).unwrap();
    assert!(!exact.downloaded);
    assert_eq!(exact.path, ranged.path);
    assert_eq!(server.requests().len(), before);

    let latest = fetch(&cache, &oci_ref(&server, None), None).unwrap();
    assert_eq!(latest.version.as_deref(), Some("0.2.1"));

    let err = fetch(&cache, &oci_ref(&server, Some("^1")), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "OCI registry 127.0.0.1:{}: helm pull oci://127.0.0.1:{}/charts/demo --version ^1 failed (exit code 1): ",
            server.port, server.port
        )),
        "{err}"
    );
}

#[test]
fn the_template_command_renders_a_remote_chart() {
    let repo = repository(&["0.4.0"]);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sequenced"))
        .args([
            "template",
            "demo",
            "--repo",
            &server.url(),
            "--version",
            "^0.4",
        ])
        .env("SEQUENCED_HELM", support::helm())
        .env("SEQUENCED_CACHE_DIR", cache_dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("# sequenced template: chart demo 0.4.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "# Chart: demo  File: templates/configmap.yaml  Resource: ConfigMap/demo-demo-demo"
        ),
        "{stdout}"
    );
}

#[test]
fn credentials_reach_helm_only_in_private_files_that_are_gone_after_the_pull() {
    let scratch = TempDir::new().unwrap();
    let (helm, log) = recording_helm(scratch.path());
    let credentials = Credentials {
        username: "ci".into(),
        password: "s3cret-pa55".into(),
        scope: "team".into(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let repo = repository(&["0.3.0"]);
    let repo_server = serve(repo.path(), Some("s3cret-pa55"));
    let packages = TempDir::new().unwrap();
    let charts = demo_charts(packages.path(), &["0.4.0"]);
    let registry_server = registry_with(&charts, Some("s3cret-pa55"));
    for (reference, version) in [
        (repo_ref(&repo_server, None), "0.3.0"),
        (oci_ref(&registry_server, None), "0.4.0"),
    ] {
        let cache_dir = TempDir::new().unwrap();
        let cache = ChartCache::new(cache_dir.path());
        let fetched = runtime
            .block_on(cache.fetch(&helm, &reference, Some(&credentials)))
            .unwrap_or_else(|e| panic!("{reference:?}: {e}"));
        assert_eq!(version_of(&fetched.path), version);
    }
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(
        !written.contains("s3cret-pa55") && !written.contains("--password"),
        "a command line holds the password:\n{written}"
    );
    let files: Vec<(&str, &str)> = written
        .lines()
        .filter_map(|l| l.strip_prefix("FILE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let configs: Vec<&(&str, &str)> = files
        .iter()
        .filter(|(_, path)| path.ends_with("repositories.yaml") || path.ends_with("registry.json"))
        .collect();
    assert!(
        configs
            .iter()
            .any(|(_, p)| p.ends_with("repositories.yaml"))
            && configs.iter().any(|(_, p)| p.ends_with("registry.json")),
        "helm was not given the credential files:\n{written}"
    );
    for (mode, path) in configs {
        assert_eq!(*mode, "600", "{path} may be read by others");
        assert!(!Path::new(path).exists(), "{path} is left behind");
    }
}

fn credentials(password: &str, scope: &str) -> Credentials {
    Credentials {
        username: "ci".into(),
        password: password.into(),
        scope: scope.into(),
    }
}

#[test]
fn a_private_chart_is_served_from_the_cache_only_to_its_namespace_and_credentials() {
    let repo = repository(&["0.3.0"]);
    let server = serve(repo.path(), Some("s3cret"));
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let exact = repo_ref(&server, Some("0.3.0"));
    let team_a = credentials("s3cret", "team-a");
    assert!(fetch(&cache, &exact, Some(&team_a)).unwrap().downloaded);
    // The same namespace with the same credentials: from the cache.
    assert!(!fetch(&cache, &exact, Some(&team_a)).unwrap().downloaded);
    // Without credentials, or with others: never from the cache; the repository says no.
    for asked in [None, Some(credentials("guess", "team-a"))] {
        let err = fetch(&cache, &exact, asked.as_ref())
            .unwrap_err()
            .to_string();
        assert!(err.contains("401"), "{err}");
    }
    // Another namespace with the same credentials fetches its own copy.
    let team_b = credentials("s3cret", "team-b");
    let theirs = fetch(&cache, &exact, Some(&team_b)).unwrap();
    assert!(theirs.downloaded);
    assert_eq!(server.count("GET", "/demo-0.3.0.tgz"), 2);
    // The cache's directory names tell nothing of the password.
    for entry in std::fs::read_dir(cache_dir.path()).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let unsalted = hex::encode(Sha256::digest(b"s3cret"));
        assert!(!name.contains(&unsalted[..12]), "{name}");
    }
    let salt = std::fs::metadata(cache_dir.path().join(".salt")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(salt.permissions().mode() & 0o777, 0o600);
}

#[test]
fn chart_names_that_are_paths_never_reach_the_cache() {
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    for name in ["../other/app", "..", ".hidden", "a/b"] {
        let reference = ChartReference::Repository {
            url: "http://127.0.0.1:9".into(),
            name: name.into(),
            version: Some("1.0.0".into()),
        };
        let err = fetch(&cache, &reference, None).unwrap_err().to_string();
        assert!(err.contains("is not a chart name"), "{name}: {err}");
    }
    assert_eq!(std::fs::read_dir(cache_dir.path()).unwrap().count(), 0);
}

#[test]
fn over_its_budget_the_cache_removes_the_least_recently_used_archives_no_release_uses() {
    let versions = ["0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0"];
    let repo = repository(&versions);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let size = std::fs::metadata(repo.path().join("demo-0.1.0.tgz"))
        .unwrap()
        .len();
    // Room for two archives and a half.
    let cache = ChartCache::new(cache_dir.path()).with_budget(size * 5 / 2);
    let mut paths = Vec::new();
    for version in versions {
        let fetched = fetch(&cache, &repo_ref(&server, Some(version)), None).unwrap();
        paths.push(fetched.path);
        // Far enough apart for the file system's clock.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // 0.1.0 is used by a release now: kept, whatever its age.
    let in_use: std::collections::HashSet<PathBuf> = [paths[0].clone()].into();
    let evicted = cache.evict(&in_use);
    assert_eq!(evicted.removed, 3, "{evicted:?}");
    assert!(evicted.after <= size * 5 / 2, "{evicted:?}");
    let kept: Vec<bool> = paths.iter().map(|p| p.exists()).collect();
    assert_eq!(kept, [true, false, false, false, true]);
    // A removed archive is fetched again when asked for.
    let again = fetch(&cache, &repo_ref(&server, Some("0.2.0")), None).unwrap();
    assert!(again.downloaded);
    // Without a budget nothing is removed.
    assert_eq!(
        ChartCache::new(cache_dir.path()).evict(&in_use),
        Default::default()
    );
}

/// The manifest digest the test registry serves for `version`.
fn manifest_digest(server: &Server, version: &str) -> String {
    let out = Command::new(support::helm())
        .args([
            "pull",
            &format!("oci://127.0.0.1:{}/charts/demo", server.port),
            "--version",
            version,
            "--plain-http",
            "-d",
        ])
        .arg(TempDir::new().unwrap().path())
        .output()
        .unwrap();
    assert!(out.status.success());
    sequenced::chart::pin::pulled_digest(&String::from_utf8_lossy(&out.stderr)).unwrap()
}

fn sha256_of(path: &Path) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
    )
}

#[test]
fn every_fetched_chart_has_its_archive_digest_and_an_oci_chart_its_manifest_digest() {
    let repo = repository(&["0.1.0"]);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let served = sha256_of(&repo.path().join("demo-0.1.0.tgz"));
    let first = fetch(&cache, &repo_ref(&server, Some("0.1.0")), None).unwrap();
    assert_eq!(first.digest.as_deref(), Some(served.as_str()));
    assert_eq!(first.oci_digest, None);
    let cached = fetch(&cache, &repo_ref(&server, Some("0.1.0")), None).unwrap();
    assert!(!cached.downloaded);
    assert_eq!(cached.digest.as_deref(), Some(served.as_str()));

    let packages = TempDir::new().unwrap();
    let charts = demo_charts(packages.path(), &["0.1.0"]);
    let registry = registry(&charts);
    let manifest = manifest_digest(&registry, "0.1.0");
    let pulled = fetch(&cache, &oci_ref(&registry, Some("0.1.0")), None).unwrap();
    assert_eq!(pulled.digest, Some(sha256_of(&charts[0])));
    assert_eq!(pulled.oci_digest.as_deref(), Some(manifest.as_str()));
    let cached = fetch(&cache, &oci_ref(&registry, Some("0.1.0")), None).unwrap();
    assert!(!cached.downloaded);
    assert_eq!(cached.oci_digest.as_deref(), Some(manifest.as_str()));
}

#[test]
fn an_oci_chart_is_pulled_by_the_digest_of_its_reference_or_version_and_a_wrong_pin_is_refused() {
    let packages = TempDir::new().unwrap();
    let charts = demo_charts(packages.path(), &["0.1.0", "0.2.0"]);
    let server = registry(&charts);
    let manifest = manifest_digest(&server, "0.1.0");
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let base = format!("oci://127.0.0.1:{}/charts/demo", server.port);

    let by_reference = ChartReference::Oci {
        reference: format!("{base}@{manifest}"),
        version: None,
        plain_http: true,
    };
    let pulled = fetch(&cache, &by_reference, None).unwrap();
    assert!(pulled.downloaded);
    assert_eq!(pulled.version.as_deref(), Some("0.1.0"));
    assert_eq!(pulled.oci_digest.as_deref(), Some(manifest.as_str()));
    assert_eq!(
        server.count("GET", &format!("/manifests/{manifest}")),
        1,
        "pulled by its digest: {:?}",
        server.requests()
    );
    // Pinned and cached: no request.
    let before = server.requests().len();
    let again = fetch(&cache, &by_reference, None).unwrap();
    assert!(!again.downloaded);
    assert_eq!(again.path, pulled.path);
    assert_eq!(again.version.as_deref(), Some("0.1.0"));
    assert_eq!(server.requests().len(), before);

    let by_version = ChartReference::Oci {
        reference: base.clone(),
        version: Some(format!("0.1.0@{manifest}")),
        plain_http: true,
    };
    let pulled = fetch(&cache, &by_version, None).unwrap();
    assert_eq!(pulled.version.as_deref(), Some("0.1.0"));
    assert_eq!(pulled.oci_digest.as_deref(), Some(manifest.as_str()));

    // 0.2.0 pinned to 0.1.0's digest: helm checks the tag against the manifest it pulled by
    // digest, or the manifest's version against the tag; either way nothing is cached.
    let other = "0".repeat(64);
    let err = fetch(
        &cache,
        &ChartReference::Oci {
            reference: base.clone(),
            version: Some(format!("0.1.0@sha256:{other}")),
            plain_http: true,
        },
        None,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!("@sha256:{other}")),
        "{err}"
    );
    let err = fetch(
        &cache,
        &ChartReference::Oci {
            reference: base.clone(),
            version: Some("0.1.0@sha256:abc".into()),
            plain_http: true,
        },
        None,
    )
    .unwrap_err();
    assert!(matches!(err, SourceError::BadPin { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "OCI registry 127.0.0.1:{}: \"0.1.0@sha256:abc\": a pin is @sha256: and 64 lowercase hexadecimal digits",
            server.port
        )
    );
}

#[test]
fn a_repository_chart_pinned_to_another_archive_digest_is_refused() {
    let repo = repository(&["0.1.0"]);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let served = sha256_of(&repo.path().join("demo-0.1.0.tgz"));
    let pinned = fetch(
        &cache,
        &repo_ref(&server, Some(&format!("0.1.0@{served}"))),
        None,
    )
    .unwrap();
    assert_eq!(pinned.digest.as_deref(), Some(served.as_str()));
    assert_eq!(pinned.version.as_deref(), Some("0.1.0"));

    let other = format!("sha256:{}", "e".repeat(64));
    let err = fetch(
        &cache,
        &repo_ref(&server, Some(&format!("0.1.0@{other}"))),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, SourceError::DigestMismatch { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert_eq!(
        err.to_string(),
        format!(
            "chart repository {}: helm pull demo --version 0.1.0: chart demo version 0.1.0 has the archive's digest {served}, not the pinned {other}",
            server.url()
        )
    );
}
