//! `spec.postRenderers`: the rendered chart through a real kustomize, as Flux's helm-controller
//! runs its kustomize post-renderer (Helm 4's "combined" way: hooks and the other templates in
//! one stream, the CRDs of `crds/` directories not at all).
//!
//! Each document goes in with Helm 4's annotation `postrenderer.helm.sh/postrender-filename`
//! set to its `# Source:` path, and comes out attributed to it again, the annotation removed: a
//! post-rendered document keeps its chart and template file, so that the plan, its messages and
//! the release record name them as before. Each post-renderer is one `kubectl kustomize` of a
//! kustomization holding the documents, its patches and its images, in input order
//! (`sortOptions: fifo`), so that the documents stay in the order helm printed them. After the
//! last one, documents are hooks or not by their annotations as they now are, as Helm sorts
//! them after post-rendering.
//!
//! The kustomization, the stream and the reading of kustomize's output are pure; running
//! kustomize is the one I/O ([`post_render`]).

use serde_json::{Map, Value, json};

use super::{Document, Rendered, attribute, check_object};
use crate::api::{KustomizePostRenderer, PatchTarget, PostRenderer};
use crate::chart::ChartTree;
use crate::kubectl::{Kubectl, KubectlError};

/// The annotation each document carries through kustomize (Helm 4's): its `# Source:` path.
pub const FILENAME_ANNOTATION: &str = "postrenderer.helm.sh/postrender-filename";

/// The file of the kustomization that holds the rendered documents.
const INPUT: &str = "helm-output.yaml";

/// Why the post-renderers could not run, or what kustomize made of the chart could not be used.
/// Every message names the post-renderer by its place in `spec.postRenderers`.
#[derive(Debug, thiserror::Error)]
pub enum PostRenderError {
    /// kustomize refused the patches or images (a patch that does not parse, a strategic merge
    /// patch that matches no object, a JSON 6902 operation on a missing path).
    #[error("spec.postRenderers[{index}] (kustomize): {message}")]
    Kustomize { index: usize, message: String },
    /// kubectl is missing, did not start or did not finish in time.
    #[error("spec.postRenderers[{index}] (kustomize): {source}")]
    Kubectl {
        index: usize,
        #[source]
        source: KubectlError,
    },
    /// What kustomize printed is not what a chart may render.
    #[error("spec.postRenderers[{index}] (kustomize) made {what}: {message}")]
    Output {
        index: usize,
        what: String,
        message: String,
    },
    #[error("spec.postRenderers[{index}] (kustomize): {what}: {message}")]
    Io {
        index: usize,
        what: String,
        message: String,
    },
}

impl PostRenderError {
    /// Whether running it again later may help: a kubectl that was missing or too slow.
    pub fn is_transient(&self) -> bool {
        match self {
            PostRenderError::Kubectl { source, .. } => source.is_transient(),
            PostRenderError::Io { .. } => true,
            PostRenderError::Kustomize { .. } | PostRenderError::Output { .. } => false,
        }
    }

    /// A fixed short category, for metrics labels.
    pub fn category(&self) -> &'static str {
        match self {
            PostRenderError::Kustomize { .. } => "post_render",
            PostRenderError::Kubectl { source, .. } => source.category(),
            PostRenderError::Output { .. } => "post_render_output",
            PostRenderError::Io { .. } => "io",
        }
    }
}

/// Whether any of `renderers` does something.
pub fn any(renderers: &[PostRenderer]) -> bool {
    renderers.iter().any(|r| r.kustomize.is_some())
}

/// Runs `renderers` in order over the hooks and main resources of `rendered` (of chart `tree`),
/// each a `kubectl kustomize`; the CRDs of `crds/` directories are left as they are.
pub async fn post_render(
    kubectl: &Kubectl,
    tree: &ChartTree,
    mut rendered: Rendered,
    renderers: &[PostRenderer],
) -> Result<Rendered, PostRenderError> {
    if !any(renderers) {
        return Ok(rendered);
    }
    let originals: Vec<Document> = rendered
        .hooks
        .drain(..)
        .chain(rendered.resources.drain(..))
        .collect();
    let mut documents = originals.clone();
    for (index, renderer) in renderers.iter().enumerate() {
        let Some(kustomize) = &renderer.kustomize else {
            continue;
        };
        let io = |what: &str, e: std::io::Error| PostRenderError::Io {
            index,
            what: what.to_string(),
            message: crate::chart::io_message(&e),
        };
        let dir = tempfile::Builder::new()
            .prefix("sequenced-postrender-")
            .tempdir()
            .map_err(|e| io("a temporary directory", e))?;
        std::fs::write(dir.path().join(INPUT), stream(&documents))
            .map_err(|e| io("writing the rendered chart", e))?;
        std::fs::write(
            dir.path().join("kustomization.yaml"),
            kustomization(kustomize).to_string(),
        )
        .map_err(|e| io("writing the kustomization", e))?;
        let output = match kubectl.kustomize(dir.path()).await {
            Ok(output) => output,
            Err(source) if source.is_transient() => {
                return Err(PostRenderError::Kubectl { index, source });
            }
            Err(source) => {
                return Err(PostRenderError::Kustomize {
                    index,
                    message: source.message(),
                });
            }
        };
        documents = read_output(&output, tree, &originals, index)?;
    }
    for document in documents {
        if document.is_hook() {
            rendered.hooks.push(document);
        } else {
            rendered.resources.push(document);
        }
    }
    Ok(rendered)
}

/// The kustomization of one post-renderer: the rendered documents as its one resource file,
/// kept in their order, its patches and its images.
pub fn kustomization(renderer: &KustomizePostRenderer) -> Value {
    let patches: Vec<Value> = renderer
        .patches
        .iter()
        .map(|p| {
            let mut patch = Map::new();
            patch.insert("patch".into(), json!(p.patch));
            if let Some(target) = &p.target {
                patch.insert("target".into(), selector(target));
            }
            Value::Object(patch)
        })
        .collect();
    let images: Vec<Value> = renderer
        .images
        .iter()
        .map(|i| {
            let mut image = Map::new();
            image.insert("name".into(), json!(i.name));
            for (field, value) in [
                ("newName", &i.new_name),
                ("newTag", &i.new_tag),
                ("digest", &i.digest),
            ] {
                if let Some(value) = value {
                    image.insert(field.into(), json!(value));
                }
            }
            Value::Object(image)
        })
        .collect();
    let mut kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [INPUT],
        "sortOptions": {"order": "fifo"},
    });
    if let Some(map) = kustomization.as_object_mut() {
        if !patches.is_empty() {
            map.insert("patches".into(), Value::Array(patches));
        }
        if !images.is_empty() {
            map.insert("images".into(), Value::Array(images));
        }
    }
    kustomization
}

fn selector(target: &PatchTarget) -> Value {
    let mut map = Map::new();
    for (field, value) in [
        ("group", &target.group),
        ("version", &target.version),
        ("kind", &target.kind),
        ("name", &target.name),
        ("namespace", &target.namespace),
        ("labelSelector", &target.label_selector),
        ("annotationSelector", &target.annotation_selector),
    ] {
        if let Some(value) = value {
            map.insert(field.into(), json!(value));
        }
    }
    Value::Object(map)
}

/// The documents as kustomize reads them: each object as JSON (exactly the values helm's YAML
/// gave), with [`FILENAME_ANNOTATION`] naming its source, separated by `---`.
pub fn stream(documents: &[Document]) -> String {
    let mut out = String::new();
    for document in documents {
        let mut object = document.object.clone();
        if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| Value::Object(Map::new()));
            if !annotations.is_object() {
                *annotations = Value::Object(Map::new());
            }
            if let Some(map) = annotations.as_object_mut() {
                map.insert(FILENAME_ANNOTATION.into(), json!(document.source));
            }
        }
        out.push_str("---\n");
        out.push_str(&object.to_string());
        out.push('\n');
    }
    out
}

/// The documents kustomize printed for post-renderer `index`, each attributed to the source its
/// annotation names (the annotation removed), read as helm reads YAML. A document whose
/// annotation is gone (a patch removed the annotations) is attributed to the top chart, as
/// `generated-by-postrender-N.yaml`, as Helm 4 names it. A document equal to one that went in
/// keeps that one's text.
pub fn read_output(
    output: &str,
    tree: &ChartTree,
    originals: &[Document],
    index: usize,
) -> Result<Vec<Document>, PostRenderError> {
    let values = crate::yaml::parse_documents(output).map_err(|e| PostRenderError::Output {
        index,
        what: "YAML that does not parse".to_string(),
        message: e.to_string(),
    })?;
    let mut documents = Vec::with_capacity(values.len());
    for (n, mut object) in values.into_iter().enumerate() {
        if object.is_null() {
            continue;
        }
        let source = take_source(&mut object).unwrap_or_else(|| {
            format!(
                "{}/generated-by-postrender-{n}.yaml",
                tree.root.path.split('/').next().unwrap_or_default()
            )
        });
        let (mut chart, template) = attribute(&source);
        if tree.find(&chart).is_none() {
            // An annotation a patch rewrote to name no chart of the tree: the top chart's.
            chart = tree.root.path.clone();
        }
        let text = originals
            .iter()
            .find(|o| o.source == source && o.object == object)
            .map(|o| o.text.clone())
            .unwrap_or_else(|| serde_yaml_ng::to_string(&object).unwrap_or_default());
        let document = Document {
            chart,
            template,
            source,
            object,
            text,
        };
        check_object(&document).map_err(|e| PostRenderError::Output {
            index,
            what: format!("document {}", n + 1),
            message: e.to_string(),
        })?;
        documents.push(document);
    }
    Ok(documents)
}

/// Removes [`FILENAME_ANNOTATION`] from the object (and the annotations, when it was the only
/// one), returning its value.
fn take_source(object: &mut Value) -> Option<String> {
    let metadata = object.get_mut("metadata")?.as_object_mut()?;
    let annotations = metadata.get_mut("annotations")?.as_object_mut()?;
    let source = annotations.remove(FILENAME_ANNOTATION)?;
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    source.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KustomizeImage, KustomizePatch};

    fn document(source: &str, object: Value) -> Document {
        let (chart, template) = attribute(source);
        Document {
            chart,
            template,
            source: source.to_string(),
            text: serde_yaml_ng::to_string(&object).unwrap(),
            object,
        }
    }

    #[test]
    fn the_stream_carries_each_source_and_its_exact_values() {
        let docs = [
            document(
                "shop/templates/a.yaml",
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"on": "yes"}}),
            ),
            document(
                "shop/charts/db/templates/b.yaml",
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b", "annotations": {"x": "y"}}}),
            ),
        ];
        let stream = stream(&docs);
        let values = crate::yaml::parse_documents(&stream).unwrap();
        assert_eq!(values.len(), 2);
        assert_eq!(
            values[0]["metadata"]["annotations"][FILENAME_ANNOTATION],
            "shop/templates/a.yaml"
        );
        assert_eq!(values[0]["data"]["on"], "yes");
        assert_eq!(values[1]["metadata"]["annotations"]["x"], "y");
        assert_eq!(
            values[1]["metadata"]["annotations"][FILENAME_ANNOTATION],
            "shop/charts/db/templates/b.yaml"
        );
    }

    #[test]
    fn the_kustomization_holds_patches_targets_and_images_in_kustomize_s_spelling() {
        let renderer = KustomizePostRenderer {
            patches: vec![
                KustomizePatch {
                    patch: "- op: add\n  path: /a\n  value: 1\n".into(),
                    target: Some(PatchTarget {
                        kind: Some("Deployment".into()),
                        label_selector: Some("app=web".into()),
                        ..Default::default()
                    }),
                },
                KustomizePatch {
                    patch: "kind: X".into(),
                    target: None,
                },
            ],
            images: vec![KustomizeImage {
                name: "nginx".into(),
                new_tag: Some("1.27".into()),
                ..Default::default()
            }],
        };
        assert_eq!(
            kustomization(&renderer),
            json!({
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["helm-output.yaml"],
                "sortOptions": {"order": "fifo"},
                "patches": [
                    {"patch": "- op: add\n  path: /a\n  value: 1\n", "target": {"kind": "Deployment", "labelSelector": "app=web"}},
                    {"patch": "kind: X"},
                ],
                "images": [{"name": "nginx", "newTag": "1.27"}],
            })
        );
    }

    fn tree() -> ChartTree {
        use crate::chart::{ChartNode, Location, Metadata};
        let node = |path: &str, name: &str, subcharts| ChartNode {
            path: path.to_string(),
            name: name.to_string(),
            metadata: Metadata {
                name: name.to_string(),
                ..Default::default()
            },
            dependency: None,
            subcharts,
            not_rendered: Vec::new(),
            location: Location::directory("/charts/shop"),
        };
        ChartTree {
            root: node("shop", "shop", vec![node("shop/db", "db", vec![])]),
        }
    }

    #[test]
    fn kustomize_s_output_is_attributed_to_the_documents_it_came_from() {
        let unchanged = document(
            "shop/templates/a.yaml",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}),
        );
        let originals = vec![unchanged.clone()];
        let output = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  annotations:\n    {FILENAME_ANNOTATION}: shop/templates/a.yaml\n  name: a\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  annotations:\n    helm.sh/layer: app\n    {FILENAME_ANNOTATION}: shop/charts/db/templates/d.yaml\n  name: d\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: s\n"
        );
        let docs = read_output(&output, &tree(), &originals, 0).unwrap();
        let summary: Vec<(&str, &str, &str)> = docs
            .iter()
            .map(|d| (d.chart.as_str(), d.template.as_str(), d.name()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("shop", "templates/a.yaml", "a"),
                ("shop/db", "templates/d.yaml", "d"),
                ("shop", "generated-by-postrender-2.yaml", "s"),
            ]
        );
        assert_eq!(
            docs[0].object, unchanged.object,
            "the annotation is removed"
        );
        assert_eq!(
            docs[0].text, unchanged.text,
            "an unchanged document keeps its text"
        );
        assert_eq!(
            docs[1].object["metadata"]["annotations"],
            json!({"helm.sh/layer": "app"})
        );
        assert!(
            !docs[1].text.contains(FILENAME_ANNOTATION),
            "{}",
            docs[1].text
        );
    }

    #[test]
    fn an_output_that_is_not_an_object_names_the_post_renderer_and_the_document() {
        let err = read_output(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
            &tree(),
            &[],
            2,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.postRenderers[2] (kustomize) made document 1: shop/generated-by-postrender-0.yaml: a ConfigMap without metadata.name"
        );
        assert!(!err.is_transient());
    }
}
