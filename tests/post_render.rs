//! `spec.postRenderers`: the chart of `tests/charts/post-render` patched and re-imaged by two
//! kustomize post-renderers, compared with what Helm 4 itself does with the same kustomizations
//! run by a post-renderer plugin (the way Flux's helm-controller runs them: Helm annotates every
//! template and hook with its file, the post-renderer runs kustomize, Helm attributes what comes
//! back); the plan that follows the sequencing annotations a patch adds; and the controller
//! deploying it, starting a revision when a post-renderer changes, and stalling on a patch
//! kustomize refuses.

use sequenced_testkit as support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use sequenced::api::PostRenderer;
use sequenced::helm::Helm;
use sequenced::kubectl::Kubectl;
use sequenced::pipeline::{self, RenderRequest};
use sequenced::render::Rendered;
use serde_json::{Value, json};
use support::charts::{condition, is_ready, is_stalled, release};
use support::operator::Operator;
use tempfile::TempDir;

const DIGEST: &str = "sha256:1ff6c18fbef2045af6b9c16bf034cc421a29027b800e4f9b68ae9b1cb3e9ae07";

fn chart() -> PathBuf {
    support::charts::repo().join("tests/charts/post-render")
}

/// Two post-renderers: strategic merge patches with and without a target, JSON 6902 patches
/// with targets by kind, group, label selector and name pattern, image overrides by new name,
/// tag and digest (in containers and init containers); then a second kustomization over the
/// first one's output. The patches add sequencing annotations: the ConfigMap becomes layer
/// `settings`, the web Deployment layer `frontend` after it, the subchart's Deployment layer
/// `backend`.
fn post_renderers(web_tag: &str) -> Value {
    json!([
        {"kustomize": {
            "patches": [
                {"patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: r-web\n  annotations:\n    helm.sh/layer: frontend\n    helm.sh/depends-on/layers: settings\nspec:\n  replicas: 2\n  template:\n    spec:\n      containers:\n      - name: web\n        env:\n        - name: MODE\n          value: patched\n"},
                {"patch": "- op: add\n  path: /metadata/annotations/helm.sh~1layer\n  value: backend\n",
                 "target": {"kind": "Deployment", "labelSelector": "app=cache"}},
                {"patch": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: any\n  annotations:\n    helm.sh/layer: settings\ndata:\n  mode: patched\n",
                 "target": {"version": "v1", "kind": "ConfigMap", "name": ".*-settings"}},
                {"patch": "- op: add\n  path: /metadata/labels\n  value:\n    stage: migrate\n",
                 "target": {"group": "batch", "kind": "Job"}}
            ],
            "images": [
                {"name": "nginx", "newName": "mirror.example.com/nginx", "newTag": web_tag},
                {"name": "redis", "digest": DIGEST},
                {"name": "busybox", "newTag": "1.37"}
            ]
        }},
        {"kustomize": {
            "patches": [
                {"patch": "- op: add\n  path: /metadata/annotations/example.com~1patched\n  value: second\n",
                 "target": {"kind": "Service"}}
            ]
        }}
    ])
}

fn renderers(web_tag: &str) -> Vec<PostRenderer> {
    serde_json::from_value(post_renderers(web_tag)).expect("post-renderers")
}

fn request() -> RenderRequest {
    RenderRequest {
        release_name: "r".to_string(),
        namespace: "default".to_string(),
        ..Default::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// What sequenced makes of the chart: rendered by helm, post-rendered by `renderers`.
fn ours(renderers: &[PostRenderer]) -> Result<pipeline::Rendered, pipeline::Error> {
    let helm = Helm::at(support::helm());
    let rendered = support::pipeline_render(&helm, &chart(), &request())?;
    runtime().block_on(pipeline::post_render(
        &Kubectl::at(support::kubectl()),
        rendered,
        renderers,
    ))
}

/// What Helm 4 makes of the chart with the same post-renderers, as Flux's helm-controller runs
/// them: a post-renderer plugin (the way Helm 4 takes post-renderers) that runs each
/// kustomization as Flux writes it (its resource the rendered manifests, its patches and
/// images) with `kubectl kustomize`, one after the other. Returns helm's output, attributed.
fn helm_with_kustomize(renderers: &Value) -> Rendered {
    let work = TempDir::new().expect("temp dir");
    let plugin = work.path().join("plugins/kustomize");
    support::write(
        &plugin,
        "plugin.yaml",
        "apiVersion: v1\nname: kustomize\nversion: 0.1.0\ntype: postrenderer/v1\nruntime: subprocess\nruntimeConfig:\n  platformCommand:\n  - command: \"${HELM_PLUGIN_DIR}/run.sh\"\n",
    );
    support::write(
        &plugin,
        "run.sh",
        "#!/bin/sh\n# KUBECTL DIR...: each DIR holds a kustomization of helm-output.yaml.\nset -eu\nkubectl=\"$1\"; shift\ninput=\"$(mktemp)\"\ncat > \"$input\"\nfor dir in \"$@\"; do\n  cp \"$input\" \"$dir/helm-output.yaml\"\n  \"$kubectl\" kustomize \"$dir\" > \"$input\"\ndone\ncat \"$input\"\nrm -f \"$input\"\n",
    );
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        plugin.join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    let mut args: Vec<String> = vec![
        "template".into(),
        "r".into(),
        chart().display().to_string(),
        "--namespace".into(),
        "default".into(),
        "--include-crds".into(),
        "--post-renderer".into(),
        "kustomize".into(),
        "--post-renderer-args".into(),
        support::kubectl().display().to_string(),
    ];
    for (i, renderer) in renderers.as_array().expect("a list").iter().enumerate() {
        // Flux's kustomization: its kind and version, the one resource, patches, images.
        let kustomize = &renderer["kustomize"];
        let mut kustomization = json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["helm-output.yaml"],
        });
        for field in ["patches", "images"] {
            if let Some(value) = kustomize.get(field) {
                kustomization[field] = value.clone();
            }
        }
        let dir = work.path().join(format!("kustomization-{i}"));
        support::write(&dir, "kustomization.yaml", &kustomization.to_string());
        args.push("--post-renderer-args".into());
        args.push(dir.display().to_string());
    }
    let out = std::process::Command::new(support::helm())
        .args(&args)
        .env("HELM_PLUGINS", work.path().join("plugins"))
        .env("HELM_CACHE_HOME", work.path().join("cache"))
        .env("HELM_CONFIG_HOME", work.path().join("config"))
        .env("HELM_DATA_HOME", work.path().join("data"))
        .output()
        .expect("run helm template");
    assert!(
        out.status.success(),
        "the oracle: helm template with the kustomize post-renderer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let output = String::from_utf8_lossy(&out.stdout).into_owned();
    let loaded = sequenced::chart::load(&chart()).expect("load the chart");
    let crd_files = loaded.crd_files();
    let tree = sequenced::chart::tree(
        &loaded,
        &sequenced::render::rendered_charts(&output, &crd_files),
    );
    sequenced::render::parse_output_with(&output, &tree, &crd_files).expect("helm's output")
}

/// Every document of a stage as `(source, Kind/name, object)`.
fn documents(documents: &[sequenced::render::Document]) -> BTreeSet<(String, String, String)> {
    documents
        .iter()
        .map(|d| (d.source.clone(), d.resource(), d.object.to_string()))
        .collect()
}

fn object<'a>(rendered: &'a Rendered, kind: &str, name: &str) -> &'a Value {
    &rendered
        .all()
        .find(|d| d.kind() == kind && d.name() == name)
        .unwrap_or_else(|| panic!("{kind}/{name} rendered"))
        .object
}

#[test]
fn post_rendered_documents_are_what_helm_and_kustomize_make_of_the_chart() {
    let ours = ours(&renderers("1.27")).expect("post-render").documents;
    let oracle = helm_with_kustomize(&post_renderers("1.27"));
    assert_eq!(documents(&ours.crds), documents(&oracle.crds), "CRDs");
    assert_eq!(documents(&ours.hooks), documents(&oracle.hooks), "hooks");
    assert_eq!(
        documents(&ours.resources),
        documents(&oracle.resources),
        "main resources"
    );

    // And what the two agree on is what the post-renderers ask for.
    let web = object(&ours, "Deployment", "r-web");
    assert_eq!(web["spec"]["replicas"], 2);
    let containers = &web["spec"]["template"]["spec"]["containers"];
    assert_eq!(containers[0]["image"], "mirror.example.com/nginx:1.27");
    assert_eq!(
        containers[0]["env"],
        json!([{"name": "MODE", "value": "patched"}])
    );
    assert_eq!(
        containers[1]["image"], "nginx/nginx-prometheus-exporter:1.1.0",
        "another image is left alone"
    );
    assert_eq!(
        web["spec"]["template"]["spec"]["initContainers"][0]["image"],
        "busybox:1.37"
    );
    assert_eq!(
        object(&ours, "Deployment", "r-cache")["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("redis@{DIGEST}")
    );
    assert_eq!(
        object(&ours, "ConfigMap", "r-settings")["data"]["mode"],
        "patched"
    );
    assert_eq!(
        object(&ours, "Service", "r-web")["metadata"]["annotations"]["example.com/patched"],
        "second"
    );
    // The hook is post-rendered too.
    let migrate = object(&ours, "Job", "r-migrate");
    assert_eq!(migrate["metadata"]["labels"]["stage"], "migrate");
    assert_eq!(
        migrate["spec"]["template"]["spec"]["containers"][0]["image"],
        "busybox:1.37"
    );
    assert!(ours.hooks.iter().any(|h| h.name() == "r-migrate"));
    // Each keeps the chart and template it came from, the subchart's included.
    let cache = ours
        .resources
        .iter()
        .find(|d| d.name() == "r-cache")
        .expect("r-cache");
    assert_eq!(
        (cache.chart.as_str(), cache.template.as_str()),
        ("web/cache", "templates/cache.yaml")
    );
    assert!(
        ours.all()
            .all(|d| !d.object.to_string().contains("postrender-filename")),
        "the attribution annotation never stays"
    );
}

#[test]
fn sequencing_annotations_a_patch_adds_change_the_plan() {
    let plain = ours(&[]).expect("render");
    let plan = pipeline::plan(plain).expect("plan");
    let layers = |plan: &sequenced::plan::Plan| -> Vec<(String, String, Vec<String>)> {
        plan.layers
            .iter()
            .map(|l| {
                (
                    l.chart.clone(),
                    l.name.clone(),
                    l.resources
                        .iter()
                        .map(|&r| plan.resources[r].name.clone())
                        .collect(),
                )
            })
            .collect()
    };
    assert!(
        layers(&plan).iter().all(|(_, name, _)| name == "(default)"),
        "the chart alone has no layers: {:?}",
        layers(&plan)
    );

    let patched = ours(&renderers("1.27")).expect("post-render");
    let plan = pipeline::plan(patched).expect("plan");
    let layers = layers(&plan);
    let position = |chart: &str, name: &str| {
        layers
            .iter()
            .position(|(c, n, _)| c == chart && n == name)
            .unwrap_or_else(|| panic!("layer {chart} {name} in {layers:?}"))
    };
    assert!(position("web", "settings") < position("web", "frontend"));
    assert_eq!(layers[position("web", "settings")].2, vec!["r-settings"]);
    assert_eq!(layers[position("web", "frontend")].2, vec!["r-web"]);
    assert_eq!(layers[position("web/cache", "backend")].2, vec!["r-cache"]);
    let frontend = &plan.layers[position("web", "frontend")];
    assert!(
        frontend
            .depends_on
            .iter()
            .any(|d| plan.layers[d.layer].name == "settings"),
        "frontend waits for settings: {frontend:?}"
    );
}

#[test]
fn a_patch_kustomize_refuses_names_the_post_renderer_and_kustomize_s_reason() {
    let refused: Vec<PostRenderer> = serde_json::from_value(json!([
        {"kustomize": {"images": [{"name": "nginx", "newTag": "1.27"}]}},
        {"kustomize": {"patches": [
            {"patch": "- op: replace\n  path: /spec/missing/field\n  value: 1\n", "target": {"kind": "Deployment", "name": "r-web"}}
        ]}}
    ]))
    .unwrap();
    let err = ours(&refused).expect_err("kustomize refuses the patch");
    assert!(!err.is_transient(), "only a spec change can fix it");
    assert_eq!(err.reason(), sequenced::api::Reason::PostRenderFailed);
    let message = err.to_string();
    assert!(
        message.starts_with("spec.postRenderers[1] (kustomize): "),
        "{message}"
    );
    assert!(message.contains("/spec/missing/field"), "{message}");

    // A kubectl that cannot be run is a wait, not a verdict on the spec.
    let helm = Helm::at(support::helm());
    let rendered = support::pipeline_render(&helm, &chart(), &request()).unwrap();
    let missing = Kubectl::at("/nonexistent/kubectl");
    let err = runtime()
        .block_on(pipeline::post_render(&missing, rendered, &refused))
        .expect_err("no kubectl");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("/nonexistent/kubectl"), "{err}");
}

/// The web chart's objects in `default` as the server holds them, less what the operator adds.
async fn live(op: &Operator, kind: &str, api_version: &str, name: &str) -> Value {
    op.server
        .object(api_version, kind, Some("default"), name)
        .unwrap_or_else(|| panic!("{kind}/{name} on the server"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_deploys_the_post_rendered_chart_in_the_order_its_patches_ask_for() {
    tokio::time::timeout(Duration::from_secs(120), async {
        let op = Operator::start(2).await;
        let _jobs = op.job_controller(Duration::from_millis(50));
        let _deployments = op.kubelet();
        op.create(
            "default",
            release(
                "r",
                &chart(),
                json!({"postRenderers": post_renderers("1.27")}),
            ),
        )
        .await;
        let sr = op
            .wait_release("default", "r", "Ready", is_ready)
            .await;
        let status = sr.status.as_ref().unwrap();
        let layers: Vec<(String, String)> = status
            .layers
            .iter()
            .map(|l| (l.chart.clone(), l.name.clone()))
            .collect();
        for layer in [("web", "settings"), ("web", "frontend"), ("web/cache", "backend")] {
            assert!(
                layers.contains(&(layer.0.to_string(), layer.1.to_string())),
                "{layer:?} in {layers:?}"
            );
        }
        // The Deployment of layer frontend is applied only once its layer settings is ready.
        let settings = op.first_apply("ConfigMap", "default", "r-settings").unwrap();
        let web = op.first_apply("Deployment", "default", "r-web").unwrap();
        assert!(settings < web, "settings before frontend");

        let deployed = live(&op, "Deployment", "apps/v1", "r-web").await;
        assert_eq!(
            deployed["spec"]["template"]["spec"]["containers"][0]["image"],
            "mirror.example.com/nginx:1.27"
        );
        assert_eq!(deployed["metadata"]["annotations"]["helm.sh/layer"], "frontend");
        assert_eq!(
            deployed["metadata"]["annotations"].get("helm.sh/depends-on/layers"),
            None,
            "an annotation key the API server refuses is stripped, as from the chart"
        );
        let migrate = live(&op, "Job", "batch/v1", "r-migrate").await;
        assert_eq!(migrate["metadata"]["labels"]["stage"], "migrate");
        assert_eq!(
            migrate["spec"]["template"]["spec"]["containers"][0]["image"],
            "busybox:1.37"
        );
        let settings = live(&op, "ConfigMap", "v1", "r-settings").await;
        assert_eq!(settings["data"]["mode"], "patched");
        assert!(
            op.server
                .object(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    "gadgets.postrender.example.com"
                )
                .is_some()
        );

        // A changed post-renderer is a new revision that deploys the change.
        op.patch_spec("r", json!({"postRenderers": post_renderers("1.28")}))
            .await;
        op.wait_release("default", "r", "revision 2 Ready", |sr| {
            is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
        })
        .await;
        let deployed = live(&op, "Deployment", "apps/v1", "r-web").await;
        assert_eq!(
            deployed["spec"]["template"]["spec"]["containers"][0]["image"],
            "mirror.example.com/nginx:1.28"
        );

        // A patch kustomize refuses stalls the release, naming it.
        op.patch_spec(
            "r",
            json!({"postRenderers": [{"kustomize": {"patches": [
                {"patch": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: no-such-deployment\nspec:\n  replicas: 3\n"}
            ]}}]}),
        )
        .await;
        let sr = op
            .wait_release("default", "r", "Stalled", is_stalled)
            .await;
        let (_, reason, message) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "PostRenderFailed", "{message}");
        assert!(
            message.starts_with("spec.postRenderers[0] (kustomize): "),
            "{message}"
        );
        assert!(message.contains("no-such-deployment"), "{message}");
        assert_eq!(
            sr.status.as_ref().and_then(|s| s.revision),
            Some(2),
            "nothing of it was deployed"
        );
        op.stop().await;
    })
    .await
    .expect("the scenario did not finish in time");
}
