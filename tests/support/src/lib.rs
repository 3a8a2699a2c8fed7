//! Shared helpers for the integration tests and benches of `sequenced`: the in-process test
//! Kubernetes API server ([`apiserver`]), the controller run in-process against it
//! ([`operator`]), charts and release objects for scenarios ([`charts`]), a small HTTP server
//! ([`http`](crate::http)), and helm and chart helpers here.
//!
//! A workspace crate that the tests and benches use as a dev-dependency, so that it is compiled
//! once rather than into every test binary.

use std::path::PathBuf;

/// The helm binary the tests run: `$SEQUENCED_HELM`, else the copy that
/// `scripts/install-helm.sh` put into `.tools/bin`, else `helm` on PATH.
pub fn helm() -> PathBuf {
    tool("SEQUENCED_HELM", "helm")
}

/// Helm 3, the oracle of the releases Helm 3 wrote: `$SEQUENCED_HELM3`, else the copy that
/// `scripts/install-helm.sh 3` put into `.tools/bin`, else `helm3` on PATH.
pub fn helm3() -> PathBuf {
    tool("SEQUENCED_HELM3", "helm3")
}

/// `$VAR`, else `.tools/bin/NAME` of this repository, else `NAME` on PATH.
fn tool(var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let local = charts::repo().join(".tools/bin").join(name);
    if local.is_file() {
        return local;
    }
    PathBuf::from(name)
}

/// The kubectl binary the tests run kustomize with (`spec.postRenderers`, and as the oracle of
/// them): `$SEQUENCED_KUBECTL`, else the copy that `scripts/install-kubectl.sh` put into
/// `.tools/bin`, else `kubectl` on PATH.
pub fn kubectl() -> PathBuf {
    tool("SEQUENCED_KUBECTL", "kubectl")
}

/// A helm that writes each command line it is given, and the mode of every file it names, to
/// `log`, then runs the real helm.
pub fn recording_helm(dir: &Path) -> (sequenced::helm::Helm, PathBuf) {
    let log = dir.join("helm.log");
    let script = dir.join("helm");
    let text = format!(
        "#!/bin/sh\nprintf 'ARGS %s\\n' \"$*\" >> '{log}'\nfor a in \"$@\"; do\n  if [ -f \"$a\" ]; then printf 'FILE %s %s\\n' \"$(stat -c %a \"$a\")\" \"$a\" >> '{log}'; fi\ndone\nexec '{helm}' \"$@\"\n",
        log = log.display(),
        helm = helm().display(),
    );
    std::fs::write(&script, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (sequenced::helm::Helm::at(&script), log)
}

pub mod archives;
pub mod charts;
pub mod demo;
pub mod http;
pub mod operator;
pub mod process;
pub mod signing;
pub mod tenants;
pub mod workloads;

use std::path::Path;
use std::process::Command;

/// The built `sequenced` binary at `bin`, talking only to the cluster of `kubeconfig`: its HOME
/// beside the kubeconfig and no in-cluster variables, so nothing of the environment can point it
/// at another cluster; stdin empty, stdout and stderr captured. The caller adds the arguments.
pub fn sequenced_command(bin: &str, kubeconfig: &Path) -> Command {
    let home = kubeconfig.parent().expect("kubeconfig dir");
    let mut command = Command::new(bin);
    command
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

/// Runs the real helm with `args` against the cluster of `kubeconfig`, and returns what it
/// printed; a helm that fails fails the test with its message.
pub fn run_helm(kubeconfig: &Path, args: &[&str]) -> String {
    run_helm_binary(&helm(), kubeconfig, args)
}

/// [`run_helm`] with this helm binary (such as [`helm3`]).
pub fn run_helm_binary(helm: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A kubeconfig in `dir` for `url` (plain HTTP, no credentials) whose context's namespace is
/// `namespace`.
pub fn kubeconfig(dir: &tempfile::TempDir, url: &str, namespace: &str) -> PathBuf {
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n\
             users:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    \
             user: test\n    namespace: {namespace}\ncurrent-context: test\n"
        ),
    )
    .expect("write kubeconfig");
    path
}

/// The resource of `kind` at `api_version` (`v1`, `group/version`) whose plural is `plural`.
pub fn api_resource(api_version: &str, kind: &str, plural: &str) -> kube::core::ApiResource {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(group, version, kind),
        plural,
    )
}

/// Writes `content` to `dir/relative`, creating directories.
pub fn write(dir: &Path, relative: &str, content: &str) {
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create directories");
    }
    std::fs::write(&path, content).expect("write file");
}

/// Writes a minimal chart into `dir`: Chart.yaml from `name`, `version` and `extra` (more
/// Chart.yaml lines such as `dependencies:`), and one ConfigMap template named after the chart so
/// that every chart of a tree shows up in `helm template`.
pub fn chart(dir: &Path, name: &str, version: &str, extra: &str) {
    write(
        dir,
        "Chart.yaml",
        &format!("apiVersion: v2\nname: {name}\nversion: {version}\n{extra}"),
    );
    write(
        dir,
        "templates/configmap.yaml",
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{{{ .Release.Name }}}}-{{{{ .Chart.Name }}}}-{name}\ndata:\n  chart: {name}\n"
        ),
    );
}

/// Packages the chart directory `dir` with `helm package` into `destination` and returns the
/// archive's path.
pub fn package(dir: &Path, destination: &Path) -> PathBuf {
    std::fs::create_dir_all(destination).expect("create destination");
    let output = Command::new(helm())
        .arg("package")
        .arg(dir)
        .arg("--destination")
        .arg(destination)
        .output()
        .expect("run helm package (is helm installed? scripts/install-helm.sh)");
    assert!(
        output.status.success(),
        "helm package failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout
        .trim()
        .rsplit(": ")
        .next()
        .expect("helm package prints the archive path");
    PathBuf::from(path)
}

/// The chart paths (`foo`, `foo/bar`) of every document `helm template` prints for `chart`.
pub fn helm_chart_paths(chart: &Path, args: &[&str]) -> std::collections::BTreeSet<String> {
    let output = Command::new(helm())
        .arg("template")
        .arg("r")
        .arg(chart)
        .args(args)
        .output()
        .expect("run helm template");
    assert!(
        output.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("# Source: "))
        .map(|source| sequenced::render::attribute(source).0)
        .collect()
}

/// Packs the chart directory `dir` into `destination` as a gzip'd tar with one top directory
/// named `top`, keeping `.tgz` files in charts/ as they are (unlike `helm package`, which expands
/// packaged subcharts into directories).
pub fn tar_gz(dir: &Path, top: &str, destination: &Path) {
    let file = std::fs::File::create(destination).expect("create archive");
    let encoder = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut builder = tar::Builder::new(encoder);
    builder
        .append_dir_all(top, dir)
        .expect("add the chart to the archive");
    builder
        .into_inner()
        .expect("finish the tar stream")
        .finish()
        .expect("finish the gzip stream");
}

/// Writes Chart.yaml files under `dir` (`("shop", "...")`, `("shop/charts/db", "...")`) and
/// returns the chart tree of the first as it is when Helm rendered documents for the chart paths
/// `rendered` (`"shop/db"`; the top chart is always in the tree). No helm involved.
pub fn chart_tree(
    dir: &Path,
    charts: &[(&str, &str)],
    rendered: &[&str],
) -> sequenced::chart::ChartTree {
    for (path, chart_yaml) in charts {
        write(&dir.join(path), "Chart.yaml", chart_yaml);
    }
    let root = dir.join(charts[0].0);
    let chart = sequenced::chart::load(&root).unwrap_or_else(|e| panic!("load: {e}"));
    let rendered = rendered.iter().map(|p| p.to_string()).collect();
    sequenced::chart::tree(&chart, &rendered)
}

/// The chart pipeline's rendering of the chart directory or archive at `path`: resolved, then
/// rendered as `request` asks, with `helm`, on a runtime of its own.
pub fn pipeline_render(
    helm: &sequenced::helm::Helm,
    path: &Path,
    request: &sequenced::pipeline::RenderRequest,
) -> Result<sequenced::pipeline::Rendered, sequenced::pipeline::Error> {
    use sequenced::chart::source::{ChartCache, ChartReference};
    use sequenced::pipeline::{self, ChartSource};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let cache = tempfile::TempDir::new().expect("cache");
        let source = ChartSource::Reference(ChartReference::Path(path.to_path_buf()));
        let resolved =
            pipeline::resolve(helm, &ChartCache::new(cache.path()), &source, None).await?;
        pipeline::render(helm, &resolved, request).await
    })
}

/// CustomResourceDefinition `widgets.example.com` (kind Widget, version v1, any object), as a
/// chart's `crds/` directory holds it.
pub fn widget_crd() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced",
                 "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}
    })
}

/// A Kubernetes object as YAML (JSON is YAML), with the annotations given.
pub fn object(kind: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    let api_version = match kind {
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" => "apps/v1",
        "Job" | "CronJob" => "batch/v1",
        "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding" => {
            "rbac.authorization.k8s.io/v1"
        }
        "CustomResourceDefinition" => "apiextensions.k8s.io/v1",
        "Widget" => "example.com/v1",
        _ => "v1",
    };
    let mut metadata = serde_json::json!({ "name": name });
    if !annotations.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        metadata["annotations"] = serde_json::Value::Object(map);
    }
    serde_json::json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata }).to_string()
}

/// Every planned object's identity in `namespace`, and the hooks (those of `helm test` too),
/// as the controller resolves them against a cluster that serves every kind namespaced.
pub fn identities(
    plan: &sequenced::plan::Plan,
    namespace: &str,
) -> (
    Vec<sequenced::api::ObjectKey>,
    Vec<sequenced::history::HookRecord>,
) {
    let key = |r: &sequenced::plan::Resource| sequenced::api::ObjectKey {
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        namespace: Some(namespace.to_string()),
        name: r.name.clone(),
    };
    let keys = plan.resources.iter().map(key).collect();
    let hooks = plan
        .hooks
        .iter()
        .map(|h| sequenced::history::HookRecord::of(h, key(&h.resource)))
        .collect();
    (keys, hooks)
}

/// What `helm template` would print for these documents: `(source, yaml)` pairs, where source
/// is the `# Source:` path (`shop/templates/app.yaml`, `foo/charts/bar/templates/x.yaml`).
pub fn rendered(
    tree: &sequenced::chart::ChartTree,
    documents: &[(&str, String)],
) -> sequenced::render::Rendered {
    let mut text = String::new();
    for (source, yaml) in documents {
        text.push_str(&format!("---\n# Source: {source}\n{yaml}\n"));
    }
    sequenced::render::parse_output(&text, tree).unwrap_or_else(|e| panic!("parse: {e}"))
}

pub mod apiserver;
