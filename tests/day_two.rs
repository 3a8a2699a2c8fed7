//! Day-two fields on the in-process test API server: `valuesFrom[].targetPath` merged in order
//! as Flux merges it (each path set by helm's own `--set` parser), `spec.commonMetadata`
//! stamped on every applied object, and a release deployed by the operator of the commit before
//! the digest was versioned (fixtures of what it wrote) served by this one without a revision.

use sequenced_testkit as support;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::charts::{chart, is_ready, is_stalled, message, release};
use support::operator::{Operator, repo};

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the scenario did not finish in time");
}

async fn config_map(op: &Operator, name: &str, data: Value) {
    let cms: Api<ConfigMap> = Api::namespaced(op.client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap(),
    )
    .await
    .unwrap();
}

/// A chart whose ConfigMap `shown` prints `.Values` as JSON.
fn values_chart() -> tempfile::TempDir {
    chart(
        "shown",
        &[(
            "templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shown\ndata:\n  values: {{ toJson .Values | quote }}\n",
        )],
    )
}

/// What the API server answers when it refuses to create this release.
async fn refused(op: &Operator, release: Value) -> String {
    op.releases("default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(release).unwrap(),
        )
        .await
        .expect_err("the API server refuses the release")
        .to_string()
}

fn shown(op: &Operator) -> Value {
    let cm = op
        .server
        .object("v1", "ConfigMap", Some("default"), "shown")
        .expect("the chart's ConfigMap is applied");
    serde_json::from_str(cm["data"]["values"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_paths_are_set_in_the_order_of_values_from_with_helms_set_rules() {
    within(async {
        let op = Operator::start(4).await;
        config_map(
            &op,
            "settings",
            json!({
                "values.yaml": "db:\n  host: base\n  port: 5432\nreplicas: 1\nlist: [a, b]\n",
                "host": "db.example.com",
                "replicas": "3",
                "quoted": "\"3\"",
                "second": "z",
            }),
        )
        .await;
        let dir = values_chart();
        let from = |key: &str, path: Option<&str>| {
            let mut r = json!({"kind": "ConfigMap", "name": "settings", "valuesKey": key});
            if let Some(path) = path {
                r["targetPath"] = json!(path);
            }
            r
        };
        op.create(
            "default",
            release(
                "shown",
                &dir.path().join("shown"),
                json!({
                    "valuesFrom": [
                        from("host", Some("db.host")),
                        // A later file wins over an earlier path...
                        from("values.yaml", None),
                        // ...and a later path over an earlier file.
                        from("replicas", Some("replicas")),
                        from("quoted", Some("asString")),
                        from("second", Some("list[1]")),
                        from("host", Some("dotted\\.key")),
                    ],
                    "values": {"inline": true},
                }),
            ),
        )
        .await;
        op.wait_release("default", "shown", "Ready", is_ready).await;
        let values = shown(&op);
        assert_eq!(values["db"]["host"], "base", "{values}");
        assert_eq!(values["db"]["port"], 5432);
        // `--set replicas=3` is a number; a quoted value is a string (`--set-string`).
        assert_eq!(values["replicas"], 3);
        assert_eq!(values["asString"], "3");
        assert_eq!(values["list"], json!(["a", "z"]));
        assert_eq!(values["dotted.key"], "db.example.com");
        assert_eq!(values["inline"], true);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_path_helm_cannot_set_stalls_the_release_naming_it() {
    within(async {
        let op = Operator::start(4).await;
        config_map(&op, "settings", json!({"v": "x"})).await;
        let dir = values_chart();
        op.create(
            "default",
            release(
                "shown",
                &dir.path().join("shown"),
                json!({"valuesFrom": [
                    {"kind": "ConfigMap", "name": "settings", "valuesKey": "v", "targetPath": "items[99999]"}
                ]}),
            ),
        )
        .await;
        let sr = op
            .wait_release("default", "shown", "Stalled", is_stalled)
            .await;
        let text = message(&sr);
        assert!(text.contains("spec.valuesFrom[0].targetPath items[99999]"), "{text}");
        assert!(text.contains("ConfigMap default/settings key v"), "{text}");
        assert!(text.contains("65536"), "helm's own reason is kept: {text}");
        assert!(
            op.server
                .object("v1", "ConfigMap", Some("default"), "shown")
                .is_none()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_the_api_server_refuses_is_refused_at_admission() {
    within(async {
        let op = Operator::start(4).await;
        let dir = values_chart();
        let refused = refused(
            &op,
            release(
                "shown",
                &dir.path().join("shown"),
                json!({"valuesFrom": [
                    {"kind": "ConfigMap", "name": "settings", "targetPath": "a b"}
                ]}),
            ),
        )
        .await;
        assert!(refused.to_string().contains("targetPath"), "{refused}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_metadata_is_stamped_on_every_object_and_a_change_is_a_new_revision() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "stamped",
            &[
                (
                    "templates/cm.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain\n  labels:\n    team: chart\n    keep: chart\ndata: {}\n",
                ),
                (
                    "templates/hook.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hooked\n  annotations:\n    helm.sh/hook: post-install,post-upgrade\n    helm.sh/hook-delete-policy: before-hook-creation\ndata: {}\n",
                ),
            ],
        );
        op.create(
            "default",
            release(
                "stamped",
                &dir.path().join("stamped"),
                json!({"commonMetadata": {
                    "labels": {"team": "platform", "cost-center": "42"},
                    "annotations": {"example.com/owner": "platform"},
                }}),
            ),
        )
        .await;
        let sr = op
            .wait_release("default", "stamped", "Ready", is_ready)
            .await;
        assert_eq!(sr.status.unwrap().revision, Some(1));
        for name in ["plain", "hooked"] {
            let cm = op
                .server
                .object("v1", "ConfigMap", Some("default"), name)
                .unwrap();
            let labels = &cm["metadata"]["labels"];
            assert_eq!(labels["team"], "platform", "{name}: {labels}");
            assert_eq!(labels["cost-center"], "42", "{name}");
            assert_eq!(labels["app.kubernetes.io/managed-by"], "sequenced", "{name}");
            assert_eq!(
                cm["metadata"]["annotations"]["example.com/owner"],
                "platform",
                "{name}"
            );
            assert_eq!(
                cm["metadata"]["annotations"]["meta.helm.sh/release-name"],
                "stamped"
            );
        }
        let plain = op
            .server
            .object("v1", "ConfigMap", Some("default"), "plain")
            .unwrap();
        assert_eq!(plain["metadata"]["labels"]["keep"], "chart");

        // Dropping a label is a new revision, and the label is gone from what it applies.
        op.patch_spec(
            "stamped",
            json!({"commonMetadata": {"labels": {"cost-center": null}}}),
        )
        .await;
        let sr = op
            .wait_release("default", "stamped", "revision 2 Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
            })
            .await;
        let digest = sr.status.unwrap().last_applied_digest.unwrap();
        assert!(digest.starts_with("v3:sha256:"), "{digest}");
        let plain = op
            .server
            .object("v1", "ConfigMap", Some("default"), "plain")
            .unwrap();
        assert_eq!(plain["metadata"]["labels"].get("cost-center"), None);
        assert_eq!(plain["metadata"]["labels"]["team"], "platform");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn common_metadata_may_not_set_what_sequenced_owns() {
    within(async {
        let op = Operator::start(4).await;
        let dir = values_chart();
        for (field, key) in [
            ("labels", "app.kubernetes.io/managed-by"),
            ("annotations", "meta.helm.sh/release-name"),
            ("annotations", "helm.sh/layer"),
            ("annotations", "sequenced.dev/owner"),
        ] {
            let refused = refused(
                &op,
                release(
                    "shown",
                    &dir.path().join("shown"),
                    json!({"commonMetadata": {field: {key: "x"}}}),
                ),
            )
            .await;
            assert!(
                refused.to_string().contains("commonMetadata"),
                "{key}: {refused}"
            );
        }
        op.stop().await;
    })
    .await;
}

/// Fixtures that the operator of the commit before the digest was versioned (38c36df) wrote
/// for `tests/charts/digest-fixture` installed with values from a ConfigMap and inline values:
/// its SequencedRelease with status, its release record and its applied ConfigMap.
fn fixture(name: &str) -> Value {
    let path = repo().join("tests/fixtures/previous-operator").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Drops what the server assigns, so that the fixture can be created again.
fn fresh(mut object: Value) -> Value {
    if let Some(metadata) = object["metadata"].as_object_mut() {
        for field in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
        ] {
            metadata.remove(field);
        }
    }
    object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_the_previous_operator_deployed_starts_no_revision() {
    within(previous_operator_release(None)).await;
}

/// The same release as an operator of scheme v2 (before `spec.postRenderers`) left it: its
/// status holds the v2 digest of its spec, which that operator wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_a_v2_operator_deployed_starts_no_revision() {
    let chart = repo().join("tests/charts/digest-fixture");
    let helm = sequenced::helm::Helm::at(support::helm());
    let cache = tempfile::TempDir::new().unwrap();
    let resolved = sequenced::pipeline::resolve(
        &helm,
        &sequenced::chart::source::ChartCache::new(cache.path()),
        &sequenced::pipeline::ChartSource::Reference(
            sequenced::chart::source::ChartReference::Path(chart),
        ),
        None,
    )
    .await
    .unwrap();
    let configmap = fixture("values-configmap.json");
    let release = fixture("release.json");
    let inline = serde_json::to_string(&release["spec"]["values"]).unwrap();
    let digests = sequenced::digest::Digests::of(&sequenced::digest::Asked {
        chart: &resolved.identity,
        values: vec![
            sequenced::digest::ValuesInput::File(
                configmap["data"]["values.yaml"].as_str().unwrap(),
            ),
            sequenced::digest::ValuesInput::File(&inline),
        ],
        release_name: "digest-fixture",
        namespace: "default",
        common_metadata: None,
        post_renderers: &[],
    });
    let v2 = digests.v2.expect("v2 expresses the fixture's spec");
    within(previous_operator_release(Some(v2))).await;
}

/// Serves what an earlier operator left of `tests/charts/digest-fixture` (the fixtures, with
/// `digest` as the stored digest when given) to this operator, asks it to reconcile, and checks
/// that no revision starts and nothing is applied.
async fn previous_operator_release(digest: Option<String>) {
    {
        let op = Operator::without_controller().await;
        let client = op.client.clone();
        let post = PostParams::default();
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        for name in ["values-configmap.json", "applied-configmap.json"] {
            cms.create(
                &post,
                &serde_json::from_value(fresh(fixture(name))).unwrap(),
            )
            .await
            .unwrap();
        }
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(client.clone(), "default");
        secrets
            .create(
                &post,
                &serde_json::from_value(fresh(fixture("record.json"))).unwrap(),
            )
            .await
            .unwrap();
        let mut sr = fresh(fixture("release.json"));
        let status = sr.as_object_mut().unwrap().remove("status").unwrap();
        sr["spec"]["chart"]["path"] = json!(
            repo()
                .join("tests/charts/digest-fixture")
                .display()
                .to_string()
        );
        let created = op
            .releases("default")
            .create(&post, &serde_json::from_value(sr).unwrap())
            .await
            .unwrap();
        let mut status = status;
        if let Some(digest) = &digest {
            status["lastAppliedDigest"] = json!(digest);
            status["history"][0]["digest"] = json!(digest);
        }
        let mut with_status = serde_json::to_value(&created).unwrap();
        with_status["status"] = status.clone();
        // The generation the status observed is the one the server gave the object again.
        with_status["status"]["observedGeneration"] = json!(created.metadata.generation);
        op.releases("default")
            .replace_status(
                "digest-fixture",
                &post,
                &serde_json::from_value(with_status).unwrap(),
            )
            .await
            .unwrap();
        let stored = status["lastAppliedDigest"].as_str().unwrap().to_string();
        let scheme = if digest.is_some() {
            "v2:sha256:"
        } else {
            "sha256:"
        };
        assert!(stored.starts_with(scheme), "a {scheme} digest: {stored}");

        let before = op.server.requests().len();
        let controller = op.spawn("new-operator", 4);
        // Asked to reconcile (not forced): the operator looks at the release, resolves its
        // source and digest, and finds nothing to do.
        let asked =
            json!({"metadata": {"annotations": {"reconcile.sequenced.dev/requestedAt": "now"}}});
        op.releases("default")
            .patch(
                "digest-fixture",
                &PatchParams::default(),
                &Patch::Merge(&asked),
            )
            .await
            .unwrap();
        let sr = op
            .wait_release("default", "digest-fixture", "the request handled", |sr| {
                sr.status
                    .as_ref()
                    .and_then(|s| s.last_handled_reconcile_at.as_deref())
                    == Some("now")
            })
            .await;
        let status = sr.status.unwrap();
        assert_eq!(status.revision, Some(1), "{status:?}");
        assert_eq!(status.last_applied_digest.as_deref(), Some(stored.as_str()));
        assert!(is_ready(
            &op.releases("default").get("digest-fixture").await.unwrap()
        ));
        let applied: Vec<_> = op.server.requests()[before..]
            .iter()
            .filter(|r| support::operator::is_write(r) && r.path.contains("/configmaps"))
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert!(applied.is_empty(), "nothing is applied again: {applied:?}");
        controller.stop().await;
        op.stop().await;
    }
}
