//! Remote charts: pulled with `helm pull` from a chart repository or an OCI registry served on
//! loopback, cached by source and resolved version, and not downloaded again on a second use.

use sequenced_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sequenced::chart::source::{ChartCache, ChartReference, Credentials, SourceError};
use sequenced::helm::Helm;
use sha2::{Digest, Sha256};
use support::http::{Request, Response, Server};
use support::{chart, package};
use tempfile::TempDir;

fn helm() -> Helm {
    Helm::at(support::helm())
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

/// Serves the files of `dir`; with `password`, only to requests with those basic credentials.
fn serve(dir: &Path, password: Option<&'static str>) -> Server {
    let dir = dir.to_path_buf();
    Server::start(move |request: &Request| {
        if let Some(password) = password {
            use base64::Engine;
            let expected = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("ci:{password}"))
            );
            if request.headers.get("authorization") != Some(&expected) {
                return Response {
                    status: 401,
                    headers: vec![("WWW-Authenticate".into(), "Basic realm=\"charts\"".into())],
                    body: b"unauthorized\n".to_vec(),
                };
            }
        }
        let name = request.path.trim_start_matches('/');
        if name.contains("..") {
            return Response::not_found();
        }
        match std::fs::read(dir.join(name)) {
            Ok(body) => Response::ok("application/octet-stream", body),
            Err(_) => Response::not_found(),
        }
    })
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

    let first = cache
        .fetch(&helm(), &repo_ref(&server, Some(">=0.1.0")), None)
        .unwrap();
    assert!(first.downloaded);
    assert_eq!(
        first.version.as_deref(),
        Some("0.2.0"),
        "a range picks the newest stable match"
    );
    assert!(first.path.starts_with(cache_dir.path()));
    assert_eq!(version_of(&first.path), "0.2.0");
    assert_eq!(server.count("GET", "/demo-0.2.0.tgz"), 1);

    let second = cache
        .fetch(&helm(), &repo_ref(&server, Some(">=0.1.0")), None)
        .unwrap();
    assert!(!second.downloaded);
    assert_eq!(second.path, first.path);
    assert_eq!(
        server.count("GET", "/demo-0.2.0.tgz"),
        1,
        "the chart was downloaded again"
    );

    // No version: the newest stable one, already cached.
    let latest = cache
        .fetch(&helm(), &repo_ref(&server, None), None)
        .unwrap();
    assert_eq!(latest.version.as_deref(), Some("0.2.0"));
    assert!(!latest.downloaded);

    // A pre-release only when asked for.
    let rc = cache
        .fetch(&helm(), &repo_ref(&server, Some("1.0.0-rc.1")), None)
        .unwrap();
    assert!(rc.downloaded);
    assert_eq!(version_of(&rc.path), "1.0.0-rc.1");

    // An exact version that is cached needs no network at all.
    let exact = cache
        .fetch(&helm(), &repo_ref(&server, Some("0.1.0")), None)
        .unwrap();
    assert!(exact.downloaded);
    let url = server.url();
    drop(server);
    let offline = ChartReference::Repository {
        url,
        name: "demo".into(),
        version: Some("0.1.0".into()),
    };
    let again = cache.fetch(&helm(), &offline, None).unwrap();
    assert!(!again.downloaded);
    assert_eq!(version_of(&again.path), "0.1.0");
}

#[test]
fn repository_errors_name_the_repository() {
    let repo = repository(&["0.1.0"]);
    let server = serve(repo.path(), None);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());

    let err = cache
        .fetch(&helm(), &repo_ref(&server, Some("^5.0.0")), None)
        .unwrap_err();
    assert!(matches!(err, SourceError::NoMatchingVersion { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: no version of chart demo matches \"^5.0.0\" (available: 0.1.0)",
            server.url()
        )
    );

    let missing = ChartReference::Repository {
        url: server.url(),
        name: "nope".into(),
        version: None,
    };
    let err = cache
        .fetch(&helm(), &missing, None)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "chart repository {}: no chart named \"nope\" in its index.yaml",
            server.url()
        )
    );

    let unreachable = ChartReference::Repository {
        url: "http://127.0.0.1:9".into(),
        name: "demo".into(),
        version: Some("^0.1".into()),
    };
    let err = cache
        .fetch(&helm(), &unreachable, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("chart repository http://127.0.0.1:9: cannot fetch index.yaml:"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn repository_credentials_are_used_for_the_index_and_the_chart() {
    let repo = repository(&["0.3.0"]);
    let server = serve(repo.path(), Some("s3cret"));
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());
    let err = cache
        .fetch(&helm(), &repo_ref(&server, None), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("answered 401"), "{err}");
    let credentials = Credentials {
        username: "ci".into(),
        password: "s3cret".into(),
    };
    let fetched = cache
        .fetch(&helm(), &repo_ref(&server, None), Some(&credentials))
        .unwrap();
    assert_eq!(version_of(&fetched.path), "0.3.0");
    assert!(!format!("{credentials:?}").contains("s3cret"));
}

/// A minimal OCI registry holding the given packaged charts, as `helm push` would store them.
fn registry(charts: &[PathBuf]) -> Server {
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
fn an_oci_chart_is_downloaded_once_then_served_from_the_cache() {
    let packages = TempDir::new().unwrap();
    let charts = demo_charts(packages.path(), &["0.1.0", "0.2.0", "0.2.1"]);
    let server = registry(&charts);
    let cache_dir = TempDir::new().unwrap();
    let cache = ChartCache::new(cache_dir.path());

    let first = cache
        .fetch(&helm(), &oci_ref(&server, Some("0.1.0")), None)
        .unwrap();
    assert!(first.downloaded);
    assert_eq!(version_of(&first.path), "0.1.0");
    let blob_requests = server.count("GET", "") - server.count("GET", "/tags/list");
    assert!(blob_requests > 0);

    let before = server.requests().len();
    let second = cache
        .fetch(&helm(), &oci_ref(&server, Some("0.1.0")), None)
        .unwrap();
    assert!(!second.downloaded);
    assert_eq!(second.path, first.path);
    assert_eq!(
        server.requests().len(),
        before,
        "an exact cached version needs no request"
    );

    // A range is resolved against the registry's tags, then cached like an exact version.
    let ranged = cache
        .fetch(&helm(), &oci_ref(&server, Some("~0.2.0")), None)
        .unwrap();
    assert!(ranged.downloaded);
    assert_eq!(ranged.version.as_deref(), Some("0.2.1"));
    assert_eq!(version_of(&ranged.path), "0.2.1");
    let layer_gets = |s: &Server| {
        s.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains("/blobs/"))
            .count()
    };
    let blobs_before = layer_gets(&server);
    let again = cache
        .fetch(&helm(), &oci_ref(&server, Some("~0.2.0")), None)
        .unwrap();
    assert!(!again.downloaded);
    assert_eq!(
        layer_gets(&server),
        blobs_before,
        "the chart was downloaded again"
    );
    assert!(server.count("GET", "/tags/list") >= 2);

    let latest = cache.fetch(&helm(), &oci_ref(&server, None), None).unwrap();
    assert_eq!(latest.version.as_deref(), Some("0.2.1"));

    let err = cache
        .fetch(&helm(), &oci_ref(&server, Some("^1")), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no version of chart demo matches \"^1\""),
        "{err}"
    );
    assert!(err.contains("available: 0.2.1, 0.2.0, 0.1.0"), "{err}");
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
