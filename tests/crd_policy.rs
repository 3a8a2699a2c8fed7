//! `spec.crds` (issue 28, part 2) on the in-process test API server: what an install and an
//! upgrade do with the CRDs of a chart's `crds/` directory under `Skip`, `Create` and
//! `CreateReplace` (Flux's names; unset is `Create` on install and `Skip` on upgrade), an update
//! the API server refuses, and CRDs that are never deleted.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use sequenced::api::{LayerPhase, ReleasePhase, SequencedRelease};
use serde_json::{Value, json};
use support::charts::{chart, config_map, is_ready, layer_phase, message, release};
use support::operator::{Operator, is_write};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(150), test)
        .await
        .expect("the scenario did not finish in time");
}

/// CRD `widgets.example.com` (kind Widget) with these versions.
fn widget_crd(versions: Value) -> String {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": versions,
        }
    });
    serde_yaml_ng::to_string(&crd).unwrap()
}

/// Version `name` of the Widget CRD whose spec has these fields (integers and strings).
fn version(name: &str, storage: bool, fields: &[(&str, &str)]) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|(field, type_)| (field.to_string(), json!({"type": type_})))
        .collect();
    json!({
        "name": name, "served": true, "storage": storage,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": properties}
        }}}
    })
}

/// The Widget CRD at v1, before (`size`) and after (`size` and `color`) it gained a field.
fn crd_v1() -> String {
    widget_crd(json!([version("v1", true, &[("size", "integer")])]))
}

fn crd_v1_with_color() -> String {
    widget_crd(json!([version(
        "v1",
        true,
        &[("size", "integer"), ("color", "string")]
    )]))
}

/// Widget `gadget` in layer `app`, after layer `config`, with these spec lines.
fn widget(spec: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: gadget\n  annotations:\n    helm.sh/layer: app\n    helm.sh/depends-on/layers: config\nspec:\n{spec}"
    )
}

/// Chart `gadgets` version `chart_version` with `crds/widgets.yaml` (and more files).
fn gadgets(chart_version: &str, crd: &str, files: &[(&str, &str)]) -> TempDir {
    let mut all: Vec<(&str, &str)> = vec![
        ("crds/widgets.yaml", crd),
        (
            "templates/config.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  annotations:\n    helm.sh/layer: config\ndata:\n  a: b\n",
        ),
    ];
    all.extend_from_slice(files);
    let dir = chart("gadgets", &all);
    support::write(
        &dir.path().join("gadgets"),
        "Chart.yaml",
        &format!("apiVersion: v2\nname: gadgets\nversion: {chart_version}\n"),
    );
    dir
}

/// The chart before the upgrade: the CRD without `color`, a Widget with `size`.
fn before() -> TempDir {
    gadgets(
        "1.0.0",
        &crd_v1(),
        &[("templates/widget.yaml", &widget("  size: 3\n"))],
    )
}

/// The chart after: the CRD gained `color`, the Widget sets it; a pre-upgrade hook (deleted
/// once it succeeded, so that the next release of the chart creates it again).
fn after() -> TempDir {
    gadgets(
        "2.0.0",
        &crd_v1_with_color(),
        &[
            (
                "templates/widget.yaml",
                &widget("  size: 3\n  color: blue\n"),
            ),
            (
                "templates/hook.yaml",
                &config_map(
                    "upgrade-marker",
                    "helm.sh/hook: pre-upgrade\n    helm.sh/hook-delete-policy: hook-succeeded",
                ),
            ),
        ],
    )
}

/// The live CRD's v1 schema of `spec`: its field names.
fn live_fields(op: &Operator) -> Vec<String> {
    let crd = op
        .server
        .object(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            None,
            "widgets.example.com",
        )
        .expect("the CRD exists");
    let mut fields: Vec<String> = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    fields.sort();
    fields
}

fn live_widget(op: &Operator) -> Value {
    op.server
        .object("example.com/v1", "Widget", Some("default"), "gadget")
        .expect("the Widget exists")
}

fn layer_names(sr: &SequencedRelease) -> Vec<String> {
    sr.status
        .as_ref()
        .map(|s| s.layers.iter().map(|l| l.name.clone()).collect())
        .unwrap_or_default()
}

/// Waits until revision `revision` of release `name` is Ready.
async fn ready_at(op: &Operator, name: &str, revision: i64) -> SequencedRelease {
    op.wait_release(
        "default",
        name,
        &format!("revision {revision} Ready"),
        |sr| is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(revision),
    )
    .await
}

/// Release `gadgets` of chart `old` with the spec fields `install`, Ready at revision 1, then
/// upgraded to chart `new` with the spec fields `upgrade`; the index of the server's first
/// request after revision 1 was Ready.
async fn upgraded(
    op: &Operator,
    old: &TempDir,
    new: &TempDir,
    install: Value,
    upgrade: Value,
) -> usize {
    op.create(
        "default",
        release("gadgets", &old.path().join("gadgets"), install),
    )
    .await;
    ready_at(op, "gadgets", 1).await;
    let from = op.server.requests().len();
    let mut spec = upgrade;
    spec["chart"] = json!({"path": new.path().join("gadgets")});
    op.patch_spec("gadgets", spec).await;
    from
}

/// The index in the server's requests of the first successful write of `kind` `name` after
/// request `from`.
fn first_write(op: &Operator, from: usize, kind: &str, name: &str) -> Option<usize> {
    op.server
        .requests()
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, r)| {
            is_write(r)
                && r.status < 300
                && r.kind.as_deref() == Some(kind)
                && r.name.as_deref() == Some(name)
        })
        .map(|(i, _)| i)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_creates_the_crds_first_marked_as_the_releases() {
    within(async {
        let op = Operator::start(4).await;
        let chart = before();
        op.create(
            "default",
            release("gadgets", &chart.path().join("gadgets"), json!({})),
        )
        .await;
        let sr = ready_at(&op, "gadgets", 1).await;
        assert_eq!(layer_names(&sr), ["(crds)", "config", "app"]);
        assert_eq!(layer_phase(&sr, "(crds)"), Some(LayerPhase::Ready));
        let crd = op
            .server
            .object(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                None,
                "widgets.example.com",
            )
            .unwrap();
        assert_eq!(
            crd.pointer("/metadata/annotations/sequenced.dev~1owner"),
            Some(&json!("default/gadgets"))
        );
        // Created (not applied: Create never updates), before anything of the chart.
        let crd_write = first_write(&op, 0, "CustomResourceDefinition", "widgets.example.com")
            .expect("the CRD was written");
        let config = first_write(&op, 0, "ConfigMap", "settings").unwrap();
        assert!(crd_write < config);
        assert_eq!(op.server.requests()[crd_write].verb, "create");
        assert_eq!(live_widget(&op).pointer("/spec/size"), Some(&json!(3)));
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_leaves_a_changed_crd_as_it_is_by_default_and_under_skip() {
    within(async {
        let op = Operator::start(4).await;
        let old = before();
        let new = after();
        for (name, policy) in [("unset", json!({})), ("skip", json!({"crds": "Skip"}))] {
            op.create(
                "default",
                release(name, &old.path().join("gadgets"), policy.clone()),
            )
            .await;
            ready_at(&op, name, 1).await;
            let mut spec = policy;
            spec["chart"] = json!({"path": new.path().join("gadgets")});
            op.patch_spec(name, spec).await;
            // The Widget of the new chart sets a field the CRD left as it was does not have:
            // kube-apiserver refuses that apply (500, "field not declared in schema"), the same
            // every time, so the revision fails at once, naming the object and the field.
            let sr = op
                .wait_release("default", name, "revision 2 Failed", |sr| {
                    sr.status.as_ref().is_some_and(|s| {
                        s.revision == Some(2) && s.phase == Some(ReleasePhase::Failed)
                    })
                })
                .await;
            // No (crds) entry that never finishes: the stage is not there.
            assert_eq!(
                layer_names(&sr),
                ["(pre-upgrade)", "config", "app"],
                "{name}"
            );
            let text = message(&sr);
            assert!(
                text.contains("Widget default/gadget")
                    && text.contains(".spec.color: field not declared in schema"),
                "{name}: {text}"
            );
            assert_eq!(
                live_fields(&op),
                ["size"],
                "{name}: the CRD was left as it was"
            );
            let widget = live_widget(&op);
            assert_eq!(widget.pointer("/spec/color"), None, "{name}");
            assert_eq!(widget.pointer("/spec/size"), Some(&json!(3)), "{name}");
            // Uninstalled (the CRD stays), so the next release creates the Widget as its own.
            op.releases("default")
                .delete(name, &Default::default())
                .await
                .unwrap();
            op.wait_deleted("default", name).await;
        }
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_replace_updates_a_changed_crd_before_any_hook_or_layer() {
    within(async {
        let op = Operator::start(4).await;
        let old = before();
        let new = after();
        let from = upgraded(&op, &old, &new, json!({}), json!({"crds": "CreateReplace"})).await;
        let sr = ready_at(&op, "gadgets", 2).await;
        assert_eq!(
            layer_names(&sr),
            ["(crds)", "(pre-upgrade)", "config", "app"]
        );
        assert_eq!(live_fields(&op), ["color", "size"]);
        // The CRD first, then the hook, then the layers.
        let crd = first_write(&op, from, "CustomResourceDefinition", "widgets.example.com")
            .expect("the CRD was updated");
        assert_eq!(op.server.requests()[crd].verb, "apply");
        let hook = first_write(&op, from, "ConfigMap", "upgrade-marker").unwrap();
        let config = first_write(&op, from, "ConfigMap", "settings").unwrap();
        let widget = first_write(&op, from, "Widget", "gadget").unwrap();
        assert!(crd < hook && hook < config && config < widget);
        // The layer that uses the new field is Ready, with the field.
        assert_eq!(layer_phase(&sr, "app"), Some(LayerPhase::Ready));
        assert_eq!(
            live_widget(&op).pointer("/spec/color"),
            Some(&json!("blue"))
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_on_upgrade_creates_a_missing_crd_and_leaves_a_changed_one() {
    within(async {
        let op = Operator::start(4).await;
        let old = before();
        let gizmo = r#"{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
 "metadata": {"name": "gizmos.example.com"},
 "spec": {"group": "example.com", "scope": "Namespaced",
  "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "listKind": "GizmoList"},
  "versions": [{"name": "v1", "served": true, "storage": true,
   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}"#;
        let new = gadgets(
            "2.0.0",
            &crd_v1_with_color(),
            &[
                ("crds/gizmos.yaml", gizmo),
                // The Widget does not use the field the CRD gained: it was not updated.
                ("templates/widget.yaml", &widget("  size: 4\n")),
            ],
        );
        upgraded(&op, &old, &new, json!({}), json!({"crds": "Create"})).await;
        let sr = ready_at(&op, "gadgets", 2).await;
        assert_eq!(layer_phase(&sr, "(crds)"), Some(LayerPhase::Ready));
        assert!(
            op.server
                .object(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    "gizmos.example.com"
                )
                .is_some(),
            "the CRD added to crds/ was created"
        );
        assert_eq!(live_fields(&op), ["size"], "the changed CRD was not updated");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_update_the_api_server_refuses_fails_the_revision_naming_the_crd_and_the_reason() {
    within(async {
        let op = Operator::start(4).await;
        let old = before();
        // v2 replaces v1, which objects were stored in: the API server refuses it until a
        // storage migration removed v1 from status.storedVersions.
        let new = gadgets(
            "2.0.0",
            &widget_crd(json!([version("v2", true, &[("size", "integer")])])),
            &[("templates/widget.yaml", &widget("  size: 3\n"))],
        );
        let from = upgraded(&op, &old, &new, json!({}), json!({"crds": "CreateReplace"})).await;
        let sr = op
            .wait_release("default", "gadgets", "Failed", |sr| {
                sr.status.as_ref().is_some_and(|s| {
                    s.revision == Some(2) && s.phase == Some(ReleasePhase::Failed)
                })
            })
            .await;
        let reason = "CustomResourceDefinition.apiextensions.k8s.io \"widgets.example.com\" is invalid: status.storedVersions[0]: Invalid value: \"v1\": missing from spec.versions; v1 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1 and it is removed from status.storedVersions";
        let expected = format!(
            "applying CustomResourceDefinition widgets.example.com: {reason} (chart gadgets, crds/widgets.yaml)"
        );
        let status = sr.status.as_ref().unwrap();
        let crds = status.layers.iter().find(|l| l.name == "(crds)").unwrap();
        assert_eq!(crds.phase, LayerPhase::Failed);
        assert_eq!(crds.message.as_deref(), Some(expected.as_str()));
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason, "ApplyFailed");
        assert!(ready.message.contains(&expected), "{}", ready.message);
        assert_eq!(op.wait_event("default", "gadgets", "LayerFailed").await, expected);
        // Nothing after the CRDs was written; the CRD is as it was.
        assert_eq!(first_write(&op, from, "ConfigMap", "settings"), None);
        assert_eq!(first_write(&op, from, "Widget", "gadget"), None);
        assert_eq!(live_fields(&op), ["size"]);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_are_never_deleted_by_a_prune_or_an_uninstall() {
    within(async {
        let op = Operator::start(4).await;
        let old = before();
        // The next chart has no crds/ any more and no Widget.
        let new = chart(
            "gadgets",
            &[(
                "templates/config.yaml",
                &config_map("settings", "helm.sh/layer: config"),
            )],
        );
        upgraded(&op, &old, &new, json!({"crds": "CreateReplace"}), json!({})).await;
        ready_at(&op, "gadgets", 2).await;
        // The Widget was pruned; its CRD stays.
        assert!(
            op.server
                .object("example.com/v1", "Widget", Some("default"), "gadget")
                .is_none()
        );
        op.releases("default")
            .delete("gadgets", &Default::default())
            .await
            .unwrap();
        op.wait_deleted("default", "gadgets").await;
        assert!(
            op.server
                .object(
                    "apiextensions.k8s.io/v1",
                    "CustomResourceDefinition",
                    None,
                    "widgets.example.com"
                )
                .is_some()
        );
        let deletes = op
            .writes("CustomResourceDefinition")
            .into_iter()
            .filter(|(verb, _)| verb == "delete")
            .count();
        assert_eq!(deletes, 0);
        op.stop().await;
    })
    .await;
}
