//! Small charts for controller scenarios, written into temporary directories.

use sequenced::api::v1alpha1::{LayerPhase, SequencedRelease};
use serde_json::{Value, json};
use tempfile::TempDir;

/// Where the repository is: two levels above this crate (tests/support).
pub fn repo() -> std::path::PathBuf {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .and_then(std::path::Path::parent)
        .expect("tests/support is two levels below the repository")
        .to_path_buf()
}

/// A chart named `name` in a temporary directory: Chart.yaml, then `(file, content)` pairs.
/// The chart is at `dir.path().join(name)`.
pub fn chart(name: &str, files: &[(&str, &str)]) -> TempDir {
    let dir = TempDir::new().expect("temp dir");
    let root = dir.path().join(name);
    crate::write(
        &root,
        "Chart.yaml",
        &format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n"),
    );
    for (file, content) in files {
        crate::write(&root, file, content);
    }
    dir
}

/// A ConfigMap template with these annotation lines (indented by the caller after the first).
pub fn config_map(name: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  annotations:\n    {annotations}\ndata:\n  a: b\n"
    )
}

/// A Deployment template of one pause container, valid on a real cluster.
pub fn deployment(name: &str, annotations: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  annotations:\n    {annotations}\nspec:\n  replicas: 1\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n    spec:\n      containers:\n        - name: main\n          image: registry.k8s.io/pause:3.10\n"
    )
}

/// The chart `pair`: layer `settings` (ConfigMap settings), then layer `app` (Deployment app),
/// which waits for it.
pub fn pair() -> TempDir {
    chart(
        "pair",
        &[
            (
                "templates/settings.yaml",
                &config_map("settings", "helm.sh/layer: settings"),
            ),
            (
                "templates/app.yaml",
                &deployment(
                    "app",
                    "helm.sh/layer: app\n    helm.sh/depends-on/layers: settings",
                ),
            ),
        ],
    )
}

/// A SequencedRelease of the chart at `path`, with more spec fields from `extra`.
pub fn release(name: &str, path: &std::path::Path, extra: Value) -> Value {
    let mut release = json!({
        "apiVersion": "sequenced.dev/v1alpha1",
        "kind": "SequencedRelease",
        "metadata": {"name": name},
        "spec": {"chart": {"path": path.display().to_string()}}
    });
    if let (Some(spec), Some(extra)) = (release["spec"].as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    release
}

/// The condition `type_` of a release: (status, reason, message).
pub fn condition(sr: &SequencedRelease, type_: &str) -> Option<(String, String, String)> {
    sr.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub fn is_ready(sr: &SequencedRelease) -> bool {
    condition(sr, "Ready").is_some_and(|c| c.0 == "True")
        && sr.status.as_ref().and_then(|s| s.observed_generation) == sr.metadata.generation
}

pub fn is_stalled(sr: &SequencedRelease) -> bool {
    condition(sr, "Stalled").is_some_and(|c| c.0 == "True")
        && sr.status.as_ref().and_then(|s| s.observed_generation) == sr.metadata.generation
}

/// The phase of layer `name` in the release's status.
pub fn layer_phase(sr: &SequencedRelease, name: &str) -> Option<LayerPhase> {
    sr.status
        .as_ref()?
        .layers
        .iter()
        .find(|l| l.name == name)
        .map(|l| l.phase)
}

/// The release's status message.
pub fn message(sr: &SequencedRelease) -> String {
    sr.status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default()
}
