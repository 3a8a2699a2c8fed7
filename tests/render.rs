//! Rendering with the real helm: every document attributed to its chart path and template file,
//! CRDs and hooks kept apart, Helm's own errors passed on intact.

use sequenced_testkit as support;

use std::path::Path;

use sequenced::helm::{Helm, HelmError};
use sequenced::pipeline::{self, RenderRequest, ValuesFile};
use sequenced::render::{self, RenderError, Rendered};
use support::{chart, write};
use tempfile::TempDir;

fn helm() -> Helm {
    Helm::at(support::helm())
}

fn options(release: &str) -> RenderRequest {
    RenderRequest {
        release_name: release.to_string(),
        namespace: "shop".to_string(),
        ..Default::default()
    }
}

fn render_dir(path: &Path, request: &RenderRequest) -> Result<Rendered, pipeline::Error> {
    support::pipeline_render(&helm(), path, request).map(|rendered| rendered.documents)
}

/// (chart, template, resource) of every document of a stage.
fn summary(documents: &[render::Document]) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = documents
        .iter()
        .map(|d| (d.chart.clone(), d.template.clone(), d.resource()))
        .collect();
    out.sort();
    out
}

fn row(chart: &str, template: &str, resource: &str) -> (String, String, String) {
    (
        chart.to_string(),
        template.to_string(),
        resource.to_string(),
    )
}

/// A three-level tree with CRDs (two in one file, one in a subchart), hooks, a test hook, a
/// template with several documents, an empty document and a List.
fn fixture(dir: &Path) {
    chart(
        dir,
        "foo",
        "0.1.0",
        "dependencies:\n- name: bar\n  version: 0.1.0\n",
    );
    write(
        dir,
        "crds/widgets.yaml",
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.com\nspec:\n  group: example.com\n  names: {kind: Widget, plural: widgets}\n  scope: Namespaced\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: gadgets.example.com\nspec:\n  group: example.com\n  names: {kind: Gadget, plural: gadgets}\n  scope: Namespaced\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]\n",
    );
    write(
        dir,
        "templates/hooks.yaml",
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations:\n    helm.sh/hook: pre-install,pre-upgrade\n    helm.sh/hook-weight: \"-5\"\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: m, image: busybox}]\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: smoke-test\n  annotations:\n    helm.sh/hook: test\nspec:\n  containers: [{name: t, image: busybox}]\n",
    );
    write(
        dir,
        "templates/many.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports: [{port: 80}]\n---\n# only a comment\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: listed-a\n- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: listed-b\n",
    );
    chart(&dir.join("charts/bar"), "bar", "0.1.0", "");
    write(
        &dir.join("charts/bar"),
        "crds/things.yaml",
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: things.example.com\nspec:\n  group: example.com\n  names: {kind: Thing, plural: things}\n  scope: Namespaced\n  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]\n",
    );
    chart(&dir.join("charts/bar/charts/baz"), "baz", "0.1.0", "");
    write(
        &dir.join("charts/bar/charts/baz"),
        "templates/deep/deployment.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}-deep\n  annotations:\n    helm.sh/layer: deep\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: c, image: busybox}]\n",
    );
}

#[test]
fn documents_are_attributed_to_chart_paths_and_template_files() {
    let dir = TempDir::new().unwrap();
    fixture(dir.path());
    let rendered = render_dir(dir.path(), &options("rel")).expect("render");
    assert_eq!(
        summary(&rendered.crds),
        vec![
            row(
                "foo",
                "crds/widgets.yaml",
                "CustomResourceDefinition/gadgets.example.com"
            ),
            row(
                "foo",
                "crds/widgets.yaml",
                "CustomResourceDefinition/widgets.example.com"
            ),
            row(
                "foo/bar",
                "crds/things.yaml",
                "CustomResourceDefinition/things.example.com"
            ),
        ]
    );
    assert_eq!(
        summary(&rendered.hooks),
        vec![
            row("foo", "templates/hooks.yaml", "Job/migrate"),
            row("foo", "templates/hooks.yaml", "Pod/smoke-test"),
        ]
    );
    assert_eq!(
        summary(&rendered.resources),
        vec![
            row("foo", "templates/configmap.yaml", "ConfigMap/rel-foo-foo"),
            row("foo", "templates/many.yaml", "ConfigMap/listed-a"),
            row("foo", "templates/many.yaml", "ConfigMap/listed-b"),
            row("foo", "templates/many.yaml", "Service/web"),
            row(
                "foo/bar",
                "templates/configmap.yaml",
                "ConfigMap/rel-bar-bar"
            ),
            row(
                "foo/bar/baz",
                "templates/configmap.yaml",
                "ConfigMap/rel-baz-baz"
            ),
            row(
                "foo/bar/baz",
                "templates/deep/deployment.yaml",
                "Deployment/rel-deep"
            ),
        ]
    );
    let listed = rendered
        .resources
        .iter()
        .find(|d| d.name() == "listed-b")
        .unwrap();
    assert_eq!(
        sequenced::yaml::parse(&listed.text).unwrap(),
        listed.object,
        "an item of a List carries its own text"
    );
    assert!(!listed.text.contains("listed-a"));
    let deep = rendered
        .resources
        .iter()
        .find(|d| d.name() == "rel-deep")
        .unwrap();
    assert_eq!(
        deep.source,
        "foo/charts/bar/charts/baz/templates/deep/deployment.yaml"
    );
    assert_eq!(deep.annotations().get("helm.sh/layer"), Some(&"deep"));
    assert!(deep.text.contains("kind: Deployment"));
    assert_eq!(
        deep.object["spec"]["template"]["spec"]["containers"][0]["image"],
        "busybox"
    );
}

#[test]
fn release_name_namespace_and_values_reach_helm() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "app", "0.1.0", "");
    write(
        dir.path(),
        "templates/info.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: info\n  namespace: {{ .Release.Namespace }}\ndata:\n  release: {{ .Release.Name }}\n  color: {{ .Values.color | quote }}\n  size: {{ .Values.size | quote }}\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n  upgrade: {{ .Release.IsUpgrade | quote }}\n",
    );
    write(dir.path(), "values.yaml", "color: red\nsize: small\n");
    let mut options = options("my-release");
    options.values = vec![
        ValuesFile {
            origin: "first".into(),
            text: "color: green\nsize: medium\n".into(),
        },
        ValuesFile {
            origin: "second".into(),
            text: "color: blue".into(),
        },
    ];
    options.flags.set = vec!["size=large".into()];
    options.kube_version = Some("v1.31.2".into());
    options.is_upgrade = true;
    let rendered = render_dir(dir.path(), &options).expect("render");
    let info = rendered
        .resources
        .iter()
        .find(|d| d.name() == "info")
        .unwrap();
    assert_eq!(info.namespace(), Some("shop"));
    assert_eq!(info.object["data"]["release"], "my-release");
    assert_eq!(info.object["data"]["color"], "blue");
    assert_eq!(info.object["data"]["size"], "large");
    assert_eq!(info.object["data"]["kube"], "v1.31.2");
    assert_eq!(info.object["data"]["upgrade"], "true");
}

#[test]
fn the_examples_render_with_their_chart_paths() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rendered = render_dir(&root.join("examples/foo"), &options("foo")).expect("render foo");
    assert!(rendered.crds.is_empty() && rendered.hooks.is_empty());
    assert_eq!(
        summary(&rendered.resources),
        vec![
            row("foo", "templates/foo.yaml", "ConfigMap/foo-foo"),
            row("foo", "templates/foo.yaml", "Deployment/foo-foo"),
            row("foo/bar", "templates/bar.yaml", "Deployment/foo-bar"),
            row("foo/bar", "templates/bar.yaml", "Service/foo-bar"),
            row("foo/nginx", "templates/nginx.yaml", "Deployment/foo-nginx"),
            row("foo/nginx", "templates/nginx.yaml", "Service/foo-nginx"),
            row(
                "foo/rabbitmq",
                "templates/rabbitmq.yaml",
                "Deployment/foo-rabbitmq"
            ),
            row(
                "foo/rabbitmq",
                "templates/rabbitmq.yaml",
                "Service/foo-rabbitmq"
            ),
        ]
    );
    let rendered = render_dir(&root.join("examples/shop"), &options("shop")).expect("render shop");
    let layers: Vec<(String, String)> = rendered
        .resources
        .iter()
        .map(|d| {
            (
                d.resource(),
                d.annotations()
                    .get("helm.sh/layer")
                    .unwrap_or(&"")
                    .to_string(),
            )
        })
        .collect();
    for (resource, layer) in [
        ("Service/db-service", "database"),
        ("Deployment/db", "database"),
        ("Deployment/queue-processor", "queue"),
        ("ConfigMap/queue-config", "queue"),
        ("Deployment/my-app", "app"),
        ("Service/my-app", "app"),
    ] {
        assert!(
            layers.contains(&(resource.to_string(), layer.to_string())),
            "{resource} in layer {layer}: {layers:?}"
        );
    }
    let app = rendered
        .resources
        .iter()
        .find(|d| d.resource() == "Deployment/my-app")
        .unwrap();
    assert_eq!(
        app.annotations()["helm.sh/depends-on/layers"],
        r#"["database, queue"]"#
    );
}

#[test]
fn helm_failures_reach_the_user_intact() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "broken", "0.1.0", "");
    write(
        dir.path(),
        "templates/fail.yaml",
        "{{ fail \"the database password is required: set db.password\" }}\n",
    );
    let err = render_dir(dir.path(), &options("r")).unwrap_err();
    assert!(matches!(
        err,
        pipeline::Error::Render(RenderError::Helm { .. })
    ));
    assert!(
        !err.is_transient(),
        "a chart that fails to render stays failed"
    );
    let message = err.to_string();
    assert!(message.starts_with("rendering chart "), "{message}");
    assert!(
        message.contains(
            "Error: execution error at (broken/templates/fail.yaml:1:3): the database password is required: set db.password"
        ),
        "{message}"
    );
}

#[test]
fn a_template_that_does_not_render_an_object_is_named() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "odd", "0.1.0", "");
    write(
        dir.path(),
        "templates/nameless.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  labels: {a: b}\n",
    );
    let message = render_dir(dir.path(), &options("r"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        "odd/templates/nameless.yaml: a ConfigMap without metadata.name"
    );
}

#[test]
fn a_missing_helm_says_how_to_install_it() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "app", "0.1.0", "");
    let missing = Helm::at(dir.path().join("no-such-helm"));
    let err = support::pipeline_render(&missing, dir.path(), &options("r")).unwrap_err();
    assert!(err.is_transient(), "helm may be installed later");
    let message = err.to_string();
    assert!(message.contains("no-such-helm"), "{message}");
    assert!(message.contains("no such file or directory"), "{message}");
    let not_found = HelmError::NotFound.to_string();
    assert!(not_found.contains("SEQUENCED_HELM"), "{not_found}");
    assert!(not_found.contains("scripts/install-helm.sh"), "{not_found}");
}

/// The documents of `tests/charts/hook-patterns/own-sources`, whose files carry their own
/// `# Source:` comments, attributed to the files helm read: what `helm install` installs.
fn assert_own_sources_attributed(rendered: &Rendered) {
    assert_eq!(
        summary(&rendered.crds),
        vec![
            row(
                "own-sources",
                "crds/vendored.yaml",
                "CustomResourceDefinition/gizmos.sources.example.com"
            ),
            row(
                "own-sources",
                "crds/widgets.yaml",
                "CustomResourceDefinition/gadgets.sources.example.com"
            ),
            row(
                "own-sources",
                "crds/widgets.yaml",
                "CustomResourceDefinition/widgets.sources.example.com"
            ),
            row(
                "own-sources/upstream",
                "crds/doohickeys.yaml",
                "CustomResourceDefinition/doohickeys.sources.example.com"
            ),
        ]
    );
    assert_eq!(
        summary(&rendered.hooks),
        vec![row(
            "own-sources",
            "templates/hook.yaml",
            "ConfigMap/r-pre-settings"
        )]
    );
    assert_eq!(
        summary(&rendered.resources),
        vec![
            row("own-sources", "templates/app.yaml", "ConfigMap/r-app"),
            row("own-sources", "templates/app.yaml", "ConfigMap/r-settings"),
            row(
                "own-sources/upstream",
                "templates/service-account.yaml",
                "ServiceAccount/r-upstream"
            ),
        ]
    );
    // The file's own comment stays in the document's text, after helm's line (as `helm get
    // manifest` shows it), and a block scalar keeps its `# Source:` line.
    let app = rendered
        .resources
        .iter()
        .find(|d| d.name() == "r-app")
        .expect("r-app");
    assert_eq!(app.source, "own-sources/templates/app.yaml");
    assert!(
        app.text.starts_with(
            "# Source: https://raw.githubusercontent.com/example/app/v1.2.3/deploy/configmap.yaml\n"
        ),
        "{}",
        app.text
    );
    assert_eq!(
        app.object["data"]["script"],
        "# Source: own-sources/templates/not-this-one.yaml\necho level 1\n"
    );
    let gizmos = rendered
        .crds
        .iter()
        .find(|d| d.name() == "gizmos.sources.example.com")
        .expect("gizmos");
    assert_eq!(gizmos.source, "own-sources/crds/vendored.yaml");
}

#[test]
fn a_file_s_own_source_comment_never_attributes_it() {
    let chart =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/charts/hook-patterns/own-sources");
    let rendered = render_dir(&chart, &options("r")).expect("render the directory");
    assert_own_sources_attributed(&rendered);
    // Packaged, the same: helm reads the CRD files out of the archive.
    let packaged = TempDir::new().unwrap();
    let out = std::process::Command::new(support::helm())
        .arg("package")
        .arg(&chart)
        .arg("--destination")
        .arg(packaged.path())
        .output()
        .expect("run helm package");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = packaged.path().join("own-sources-0.1.0.tgz");
    let rendered = render_dir(&archive, &options("r")).expect("render the archive");
    assert_own_sources_attributed(&rendered);
}

#[test]
fn a_crd_file_with_a_byte_order_mark_and_crlf_lines_is_one_file() {
    let dir = TempDir::new().unwrap();
    chart(dir.path(), "bom", "0.1.0", "");
    let crd = "# Source: https://example.com/crds.yaml\r\napiVersion: apiextensions.k8s.io/v1\r\nkind: CustomResourceDefinition\r\nmetadata:\r\n  name: widgets.example.com\r\n---\r\n# Source: https://example.com/crds.yaml\r\napiVersion: apiextensions.k8s.io/v1\r\nkind: CustomResourceDefinition\r\nmetadata:\r\n  name: gadgets.example.com";
    std::fs::create_dir_all(dir.path().join("crds")).unwrap();
    std::fs::write(
        dir.path().join("crds/all.yaml"),
        [b"\xef\xbb\xbf".as_slice(), crd.as_bytes()].concat(),
    )
    .unwrap();
    let rendered = render_dir(dir.path(), &options("r")).expect("render");
    assert_eq!(
        summary(&rendered.crds),
        vec![
            row(
                "bom",
                "crds/all.yaml",
                "CustomResourceDefinition/gadgets.example.com"
            ),
            row(
                "bom",
                "crds/all.yaml",
                "CustomResourceDefinition/widgets.example.com"
            ),
        ]
    );
}
