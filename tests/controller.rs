//! Controller scenarios on the in-process test API server: install in layer order, subcharts,
//! upgrade and prune, uninstall, failures, ownership, dependsOn, many releases. Each runs under a
//! timeout; the server plays the kubelet through status writes.

use sequenced_testkit as support;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use sequenced::api::v1alpha1::{LayerPhase, ReleasePhase};
use serde_json::{Value, json};
use support::charts::{
    chart, condition, config_map, deployment, is_ready, is_stalled, layer_phase, message, release,
};
use support::operator::{Operator, is_shard_keeping, is_write, repo};
use tempfile::TempDir;

async fn within<F: Future<Output = ()>>(test: F) {
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("the scenario did not finish in time");
}

fn chart_path(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.path().join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shop_applies_app_only_after_database_and_queue_are_ready() {
    within(async {
        let op = Operator::start(4).await;
        op.create(
            "default",
            release("shop", &repo().join("examples/shop"), json!({})),
        )
        .await;
        // database and queue start together.
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        op.wait_object("apps/v1", "Deployment", "default", "queue-processor")
            .await;
        op.wait_object("v1", "ConfigMap", "default", "queue-config")
            .await;
        let sr = op
            .wait_release(
                "default",
                "shop",
                "layers database and queue waiting",
                |sr| {
                    layer_phase(sr, "database") == Some(LayerPhase::Waiting)
                        && layer_phase(sr, "queue") == Some(LayerPhase::Waiting)
                },
            )
            .await;
        assert_eq!(layer_phase(&sr, "app"), Some(LayerPhase::Pending));
        assert_eq!(
            sr.status.as_ref().unwrap().phase,
            Some(ReleasePhase::Deploying)
        );
        let app_layer = sr
            .status
            .as_ref()
            .unwrap()
            .layers
            .iter()
            .find(|l| l.name == "app")
            .unwrap()
            .clone();
        let waiting_for = app_layer.message.unwrap_or_default();
        assert!(
            waiting_for.contains("(chart shop) to be ready"),
            "app names what it waits for: {waiting_for}"
        );

        // Only the database becomes ready: app still waits.
        assert!(op.deployment_ready("default", "db"));
        op.wait_release("default", "shop", "layer database ready", |sr| {
            layer_phase(sr, "database") == Some(LayerPhase::Ready)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            op.first_apply("Deployment", "default", "my-app").is_none(),
            "app applied before queue was ready"
        );
        let sr = op.releases("default").get("shop").await.unwrap();
        let blocking = sr
            .status
            .as_ref()
            .unwrap()
            .layers
            .iter()
            .find(|l| l.name == "queue")
            .unwrap()
            .message
            .clone()
            .unwrap();
        assert!(
            blocking.contains("Deployment queue-processor"),
            "{blocking}"
        );

        // The queue too: app follows at once.
        let ready_at = Instant::now();
        assert!(op.deployment_ready("default", "queue-processor"));
        op.wait_object("apps/v1", "Deployment", "default", "my-app")
            .await;
        let applied_at = op.first_apply("Deployment", "default", "my-app").unwrap();
        assert!(applied_at > ready_at);
        // The Service of layer app is applied too, after the Deployment's layer-mates in kind order.
        op.wait_object("v1", "Service", "default", "my-app").await;

        assert!(op.deployment_ready("default", "my-app"));
        let sr = op.wait_release("default", "shop", "Ready", is_ready).await;
        let status = sr.status.unwrap();
        assert_eq!(status.phase, Some(ReleasePhase::Ready));
        assert_eq!(status.revision, Some(1));
        assert_eq!(status.progress.as_deref(), Some("3/3"));
        assert_eq!(status.history.len(), 1);
        assert_eq!(status.history[0].phase, ReleasePhase::Ready);
        assert!(
            status
                .last_applied_digest
                .unwrap()
                .starts_with("v3:sha256:")
        );
        assert_eq!(
            condition(
                &op.releases("default").get("shop").await.unwrap(),
                "Stalled"
            )
            .unwrap()
            .0,
            "False"
        );

        // Applied objects carry the ownership labels and annotations, without invalid keys.
        let app = op
            .server
            .object("apps/v1", "Deployment", Some("default"), "my-app")
            .unwrap();
        assert_eq!(
            app["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "sequenced"
        );
        assert_eq!(
            app["metadata"]["annotations"]["meta.helm.sh/release-name"],
            "shop"
        );
        assert_eq!(
            app["metadata"]["annotations"]["meta.helm.sh/release-namespace"],
            "default"
        );
        assert!(
            app["metadata"]["annotations"]
                .get("helm.sh/depends-on/layers")
                .is_none()
        );
        // Server-side apply with field manager sequenced.
        let apply = op
            .server
            .requests()
            .into_iter()
            .find(|r| r.verb == "apply" && r.kind.as_deref() == Some("Deployment"))
            .unwrap();
        assert!(
            apply.query.contains("fieldManager=sequenced"),
            "{}",
            apply.query
        );

        // Events on the release; the last one is published right after the status that says Ready.
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(op.client.clone(), "default");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let shop: Vec<_> = events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("shop"))
                .collect();
            let reasons: std::collections::BTreeSet<String> =
                shop.iter().filter_map(|e| e.reason.clone()).collect();
            let wanted = ["LayerStarted", "ReleaseReady"];
            // The layers' readiness is told: on its own or ahead of the layer it lets start.
            let told = |layer: &str| {
                shop.iter().any(|e| {
                    e.note.as_deref().is_some_and(|n| {
                        n.contains(&format!("Layer {layer} of chart shop is ready"))
                    })
                })
            };
            if wanted.iter().all(|r| reasons.contains(*r)) && told("database") && told("queue") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "events {reasons:?}, wanted {wanted:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subchart_example_follows_the_seed_order() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        op.create(
            "default",
            release("foo", &repo().join("examples/foo"), json!({})),
        )
        .await;
        op.wait_release("default", "foo", "Ready", is_ready).await;
        let applies: Vec<String> = op
            .writes("Deployment")
            .into_iter()
            .filter(|(verb, _)| verb == "apply")
            .map(|(_, name)| name)
            .collect();
        let first = |needle: &str| {
            applies
                .iter()
                .position(|n| n.contains(needle))
                .unwrap_or_else(|| panic!("{needle} in {applies:?}"))
        };
        assert!(
            first("default/foo-nginx") < first("default/foo-bar"),
            "{applies:?}"
        );
        assert!(
            first("default/foo-rabbitmq") < first("default/foo-bar"),
            "{applies:?}"
        );
        assert!(
            first("default/foo-bar") < first("default/foo-foo"),
            "{applies:?}"
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_adds_and_removes_resources_and_prunes_at_the_end() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "up",
            &[(
                "templates/cms.yaml",
                "{{ range .Values.names }}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ . }}\n  annotations:\n    helm.sh/layer: first\ndata:\n  a: b\n{{ end }}\n",
            )],
        );
        let path = chart_path(&dir, "up");
        op.create("default", release("up", &path, json!({"values": {"names": ["a", "b"]}}))).await;
        op.wait_release("default", "up", "Ready", is_ready).await;
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "b").is_some());

        let patch = json!({"spec": {"values": {"names": ["a", "c"]}}});
        op.releases("default").patch("up", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let sr = op
            .wait_release("default", "up", "revision 2 Ready", |sr| is_ready(sr) && sr.status.as_ref().unwrap().revision == Some(2))
            .await;
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "c").is_some());
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "b").is_none(), "b is pruned");
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "a").is_some());
        let status = sr.status.unwrap();
        assert_eq!(status.history.len(), 2);
        assert_eq!(status.history[0].revision, 2);
        assert_eq!(status.layers.last().unwrap().name, "(prune)");
        // c was applied before b was deleted.
        let writes = op.writes("ConfigMap");
        let c = writes.iter().position(|w| w.1 == "default/c").unwrap();
        let b = writes.iter().position(|w| w.0 == "delete" && w.1 == "default/b").unwrap();
        assert!(c < b, "{writes:?}");
        // Both revisions are recorded.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(op.client.clone(), "default");
        assert!(secrets.get_opt("sh.helm.release.v1.up.v1").await.unwrap().is_some());
        assert!(secrets.get_opt("sh.helm.release.v1.up.v2").await.unwrap().is_some());
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_deletes_layers_in_reverse_order_waiting_for_each() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        op.create(
            "default",
            release("shop", &repo().join("examples/shop"), json!({})),
        )
        .await;
        op.wait_release("default", "shop", "Ready", is_ready).await;
        // db-service carries a finalizer of someone else: the database layer waits for it.
        let patch = json!({"metadata": {"finalizers": ["example.com/hold"]}});
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(op.client.clone(), "default");
        services
            .patch("db-service", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        op.server.clear_requests();

        op.releases("default")
            .delete("shop", &DeleteParams::default())
            .await
            .unwrap();
        let sr = op
            .wait_release(
                "default",
                "shop",
                "the database layer waiting for db-service",
                |sr| {
                    layer_phase(sr, "database") == Some(LayerPhase::Deleting)
                        && message(sr).contains("db-service")
                },
            )
            .await;
        assert_eq!(
            sr.status.as_ref().unwrap().phase,
            Some(ReleasePhase::Uninstalling)
        );
        assert!(message(&sr).contains("db-service"), "{}", message(&sr));
        assert!(
            op.server
                .object("apps/v1", "Deployment", Some("default"), "my-app")
                .is_none()
        );
        // Still there: the release holds on until its objects are gone.
        assert!(
            op.releases("default")
                .get_opt("shop")
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            op.server
                .remove_finalizers("v1", "Service", Some("default"), "db-service")
        );
        op.wait_deleted("default", "shop").await;
        let deletes: Vec<String> = op
            .server
            .requests()
            .iter()
            .filter(|r| r.verb == "delete" && r.kind.as_deref() != Some("Secret"))
            .map(|r| r.name.clone().unwrap_or_default())
            .collect();
        let at = |n: &str| {
            deletes
                .iter()
                .position(|d| d == n)
                .unwrap_or_else(|| panic!("{n} in {deletes:?}"))
        };
        assert!(at("my-app") < at("db"), "{deletes:?}");
        assert!(at("my-app") < at("queue-processor"), "{deletes:?}");
        for name in ["db", "queue-processor", "my-app"] {
            assert!(
                op.server
                    .object("apps/v1", "Deployment", Some("default"), name)
                    .is_none()
            );
        }
        // The release records went with it.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(op.client.clone(), "default");
        assert!(
            secrets
                .get_opt("sh.helm.release.v1.shop.v1")
                .await
                .unwrap()
                .is_none()
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_fails_the_release_naming_it() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "jobs",
            &[(
                "templates/job.yaml",
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\n  annotations:\n    helm.sh/layer: migrate\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: m\n          image: busybox\n",
            ), ("templates/after.yaml", &config_map("after", "helm.sh/depends-on/layers: migrate"))],
        );
        op.create("default", release("jobs", &chart_path(&dir, "jobs"), json!({}))).await;
        op.wait_object("batch/v1", "Job", "default", "migrate").await;
        op.server.set_status("batch/v1", "Job", Some("default"), "migrate", json!({
            "failed": 7,
            "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]
        }));
        let sr = op
            .wait_release("default", "jobs", "Failed", |sr| sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Failed))
            .await;
        assert!(message(&sr).contains("Job migrate"), "{}", message(&sr));
        assert!(message(&sr).contains("BackoffLimitExceeded") || message(&sr).contains("backoff limit"), "{}", message(&sr));
        assert_eq!(condition(&sr, "Stalled").unwrap().0, "True");
        assert_eq!(condition(&sr, "Ready").unwrap().0, "False");
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "after").is_none(), "nothing after a failed layer");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_that_never_becomes_ready_times_out() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "slow",
            &[(
                "templates/web.yaml",
                &deployment("web", "helm.sh/readiness-timeout: 2s"),
            )],
        );
        op.create(
            "default",
            release("slow", &chart_path(&dir, "slow"), json!({})),
        )
        .await;
        let sr = op
            .wait_release("default", "slow", "Failed", |sr| {
                sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Failed)
            })
            .await;
        assert!(
            message(&sr).contains("readiness timeout after 2s: Deployment web"),
            "{}",
            message(&sr)
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_cycle_stalls_the_release_with_the_whole_cycle() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "loop",
            &[
                (
                    "templates/a.yaml",
                    &config_map("a", "helm.sh/layer: a\n    helm.sh/depends-on/layers: b"),
                ),
                (
                    "templates/b.yaml",
                    &config_map("b", "helm.sh/layer: b\n    helm.sh/depends-on/layers: a"),
                ),
            ],
        );
        op.create(
            "default",
            release("loop", &chart_path(&dir, "loop"), json!({})),
        )
        .await;
        let sr = op
            .wait_release("default", "loop", "Stalled", is_stalled)
            .await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "PlanFailed");
        assert!(
            text.contains("layer cycle in chart loop: a -> b -> a"),
            "{text}"
        );
        assert!(op.writes("ConfigMap").is_empty(), "nothing is applied");
        // No retry storm: the chart is rendered once while the spec stays.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let writes_before = op
            .server
            .requests()
            .iter()
            .filter(|r| is_write(r) && !is_shard_keeping(r))
            .count();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(
            op.server
                .requests()
                .iter()
                .filter(|r| is_write(r) && !is_shard_keeping(r))
                .count(),
            writes_before
        );
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_of_another_release_is_left_alone_and_named() {
    within(async {
        let op = Operator::start(4).await;
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(op.client.clone(), "default");
        let theirs = json!({"metadata": {"name": "shared", "annotations": {
            "meta.helm.sh/release-name": "other", "meta.helm.sh/release-namespace": "default"}}, "data": {"owner": "other"}});
        cms.create(&Default::default(), &serde_json::from_value(theirs).unwrap()).await.unwrap();
        let dir = chart("mine", &[("templates/cm.yaml", &config_map("shared", "helm.sh/layer: one"))]);
        op.create("default", release("mine", &chart_path(&dir, "mine"), json!({}))).await;
        let sr = op.wait_release("default", "mine", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "OwnershipConflict");
        assert!(text.contains("ConfigMap default/shared"), "{text}");
        assert!(text.contains("Helm release other"), "{text}");
        let shared = op.server.object("v1", "ConfigMap", Some("default"), "shared").unwrap();
        assert_eq!(shared["data"]["owner"], "other", "never modified");

        // An object nobody owns needs adopt: true.
        cms.create(&Default::default(), &serde_json::from_value(json!({"metadata": {"name": "loose"}})).unwrap()).await.unwrap();
        let dir2 = chart("adopter", &[("templates/cm.yaml", &config_map("loose", "helm.sh/layer: one"))]);
        op.create("default", release("adopter", &chart_path(&dir2, "adopter"), json!({}))).await;
        let sr = op.wait_release("default", "adopter", "Stalled", is_stalled).await;
        assert!(condition(&sr, "Stalled").unwrap().2.contains("adopt"), "{:?}", condition(&sr, "Stalled"));
        let patch = json!({"spec": {"adopt": true}});
        op.releases("default").patch("adopter", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        op.wait_release("default", "adopter", "Ready", is_ready).await;
        let loose = op.server.object("v1", "ConfigMap", Some("default"), "loose").unwrap();
        assert_eq!(loose["metadata"]["annotations"]["meta.helm.sh/release-name"], "adopter");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depends_on_waits_for_the_other_release_and_a_cycle_stalls() {
    within(async {
        let op = Operator::start(4).await;
        let db = chart("db", &[("templates/db.yaml", &deployment("database", "helm.sh/layer: db"))]);
        let web = chart("web", &[("templates/web.yaml", &config_map("web", "helm.sh/layer: web"))]);
        op.create("default", release("web", &chart_path(&web, "web"), json!({"dependsOn": [{"name": "db"}]}))).await;
        let sr = op
            .wait_release("default", "web", "Pending", |sr| sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Pending))
            .await;
        assert!(message(&sr).contains("SequencedRelease default/db"), "{}", message(&sr));
        op.create("default", release("db", &chart_path(&db, "db"), json!({}))).await;
        op.wait_object("apps/v1", "Deployment", "default", "database").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "web").is_none(), "web waits for db");
        let ready_at = Instant::now();
        op.deployment_ready("default", "database");
        op.wait_release("default", "web", "Ready", is_ready).await;
        assert!(op.first_apply("ConfigMap", "default", "web").unwrap() > ready_at);

        // A cycle among releases.
        op.create("default", release("x", &chart_path(&web, "web"), json!({"dependsOn": [{"name": "y"}], "targetNamespace": "default", "releaseName": "x"}))).await;
        op.create("default", release("y", &chart_path(&web, "web"), json!({"dependsOn": [{"name": "x"}], "releaseName": "y"}))).await;
        let sr = op.wait_release("default", "x", "Stalled", is_stalled).await;
        let text = condition(&sr, "Stalled").unwrap().2;
        assert!(text.contains("default/x -> default/y -> default/x"), "{text}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_releases_install_at_once() {
    within(async {
        let op = Operator::start(8).await;
        let _kubelet = op.kubelet();
        for i in 0..20 {
            let ns = format!("team-{i}");
            op.namespace(&ns).await;
            op.create(
                &ns,
                release("shop", &repo().join("examples/shop"), json!({})),
            )
            .await;
        }
        for i in 0..20 {
            let sr = op
                .wait_release(&format!("team-{i}"), "shop", "Ready", is_ready)
                .await;
            assert_eq!(sr.status.unwrap().progress.as_deref(), Some("3/3"));
        }
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_specs_stall_naming_the_cause() {
    within(async {
        let op = Operator::start(4).await;
        op.create("default", release("nowhere", Path::new("/no/such/chart"), json!({}))).await;
        let sr = op.wait_release("default", "nowhere", "Stalled", is_stalled).await;
        let (_, reason, text) = condition(&sr, "Stalled").unwrap();
        assert_eq!(reason, "InvalidSpec");
        assert!(text.starts_with("spec.chart.path: chart /no/such/chart"), "{text}");

        let plain = chart("plain", &[("templates/cm.yaml", &config_map("plain", "helm.sh/layer: one"))]);
        op.create("default", release("novalues", &chart_path(&plain, "plain"), json!({
            "valuesFrom": [{"kind": "ConfigMap", "name": "missing", "optional": true}, {"kind": "Secret", "name": "absent"}]
        }))).await;
        let sr = op.wait_release("default", "novalues", "Stalled", is_stalled).await;
        let text = condition(&sr, "Stalled").unwrap().2;
        assert!(text.starts_with("spec.valuesFrom[1]: Secret default/absent not found"), "{text}");

        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_from_config_maps_are_merged_before_inline_values() {
    within(async {
        let op = Operator::start(4).await;
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(op.client.clone(), "default");
        cms.create(&Default::default(), &serde_json::from_value(json!({
            "metadata": {"name": "vals"}, "data": {"values.yaml": "greeting: hello\nname: base\n"}
        })).unwrap()).await.unwrap();
        let dir = chart("greet", &[("templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: greeting\ndata:\n  text: \"{{ .Values.greeting }} {{ .Values.name }}\"\n")]);
        op.create("default", release("greet", &chart_path(&dir, "greet"), json!({
            "valuesFrom": [{"kind": "ConfigMap", "name": "vals"}], "values": {"name": "inline"}
        }))).await;
        op.wait_release("default", "greet", "Ready", is_ready).await;
        let cm = op.server.object("v1", "ConfigMap", Some("default"), "greeting").unwrap();
        assert_eq!(cm["data"]["text"], "hello inline");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_render_with_the_servers_version_and_api_versions() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart("caps", &[("templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: caps\ndata:\n  version: {{ .Capabilities.KubeVersion.Version | quote }}\n  leases: {{ .Capabilities.APIVersions.Has \"coordination.k8s.io/v1/Lease\" | quote }}\n  widgets: {{ .Capabilities.APIVersions.Has \"example.com/v1\" | quote }}\n")]);
        op.create("default", release("caps", &chart_path(&dir, "caps"), json!({}))).await;
        op.wait_release("default", "caps", "Ready", is_ready).await;
        let cm = op.server.object("v1", "ConfigMap", Some("default"), "caps").unwrap();
        // The test API server answers /version as the recorded kube-apiserver did.
        let recorded = std::fs::read_to_string(repo().join("tests/apiserver-recordings/version.json")).unwrap();
        let version: Value = serde_json::from_str(&recorded).unwrap();
        assert_eq!(cm["data"]["version"], version["gitVersion"]);
        assert_eq!(cm["data"]["leases"], "true");
        assert_eq!(cm["data"]["widgets"], "false");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequencing_none_applies_everything_at_once_and_records_it() {
    within(async {
        let op = Operator::start(4).await;
        op.create(
            "default",
            release(
                "flat",
                &repo().join("examples/shop"),
                json!({"sequencing": "none"}),
            ),
        )
        .await;
        op.wait_object("apps/v1", "Deployment", "default", "my-app")
            .await;
        op.wait_object("apps/v1", "Deployment", "default", "db")
            .await;
        let _kubelet = op.kubelet();
        let sr = op.wait_release("default", "flat", "Ready", is_ready).await;
        assert!(!sr.status.unwrap().history[0].sequenced);
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_release_is_left_alone_without_writes() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        op.create(
            "default",
            release("shop", &repo().join("examples/shop"), json!({})),
        )
        .await;
        op.wait_release("default", "shop", "Ready", is_ready).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        op.server.clear_requests();
        // Touch the release without changing its spec: it is reconciled and nothing is written.
        for i in 0..5 {
            let patch = json!({"metadata": {"annotations": {"example.com/touch": i.to_string()}}});
            op.releases("default")
                .patch("shop", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let writes: Vec<_> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| {
                is_write(r)
                    && !(r.kind.as_deref() == Some("SequencedRelease")
                        && r.verb == "patch"
                        && r.subresource.is_none())
            })
            .map(|r| format!("{} {}", r.verb, r.path))
            .collect();
        assert!(writes.is_empty(), "{writes:?}");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_and_the_release_still_converges() {
    within(async {
        let op = Operator::start(4).await;
        let _kubelet = op.kubelet();
        op.server
            .fail_next("PATCH", "/configmaps/queue-config", 500, 2);
        op.create(
            "default",
            release("shop", &repo().join("examples/shop"), json!({})),
        )
        .await;
        op.wait_release("default", "shop", "Ready", is_ready).await;
        let failed = op
            .server
            .requests()
            .iter()
            .filter(|r| r.status == 500)
            .count();
        assert_eq!(failed, 2);
        op.stop().await;
    })
    .await;
}

/// GET `path` from the metrics server: (status, body). HTTP/1.0, so the body is not chunked.
async fn scrape(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics server answers");
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample `name` (with its labels, as printed), or 0.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_follow_what_the_controller_does() {
    within(async {
        let op = Operator::start(4).await;
        let (addr, server) = sequenced::metrics::serve(
            "127.0.0.1:0".parse().unwrap(),
            op.metrics.clone(),
            sequenced::metrics::version_check(op.client.clone()),
        )
        .await
        .unwrap();
        let server = tokio::spawn(server);
        assert_eq!(scrape(addr, "/healthz").await.0, 200);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, body) = scrape(addr, "/readyz").await;
            if status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "never ready: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(scrape(addr, "/nope").await.0, 404);

        let _kubelet = op.kubelet();
        op.server.fail_next("PATCH", "/configmaps/queue-config", 500, 1);
        op.create("default", release("shop", &repo().join("examples/shop"), json!({}))).await;
        let slow = chart(
            "slow",
            &[(
                "templates/job.yaml",
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: never\n  annotations:\n    helm.sh/readiness-timeout: 1s\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: m\n          image: busybox\n",
            )],
        );
        op.create("default", release("slow", &chart_path(&slow, "slow"), json!({}))).await;
        op.wait_release("default", "shop", "Ready", is_ready).await;
        op.wait_release("default", "slow", "Failed", |sr| {
            sr.status.as_ref().and_then(|s| s.phase) == Some(ReleasePhase::Failed)
        })
        .await;

        // The gauge reads the controller's cache and the counters move when a reconcile returns,
        // both a moment after the status a test can read.
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let (status, text) = scrape(addr, "/metrics").await;
            assert_eq!(status, 200);
            let settled = sample(&text, "sequenced_releases{phase=\"Ready\"}") == 1.0
                && sample(&text, "sequenced_releases{phase=\"Failed\"}") == 1.0
                && sample(&text, "sequenced_reconcile_total{result=\"success\"}") >= 3.0;
            if settled || Instant::now() > deadline {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(sample(&text, "sequenced_reconcile_total{result=\"success\"}") >= 3.0, "{text}");
        assert!(sample(&text, "sequenced_reconcile_total{result=\"error\"}") >= 1.0, "{text}");
        assert!(sample(&text, "sequenced_reconcile_errors_total{category=\"server\"}") >= 1.0, "{text}");
        assert_eq!(sample(&text, "sequenced_render_duration_seconds_count"), 2.0, "{text}");
        assert!(sample(&text, "sequenced_layer_apply_duration_seconds_count{stage=\"layer\"}") >= 4.0, "{text}");
        assert!(sample(&text, "sequenced_layer_wait_duration_seconds_count") >= 3.0, "{text}");
        assert_eq!(sample(&text, "sequenced_releases{phase=\"Ready\"}"), 1.0, "{text}");
        assert_eq!(sample(&text, "sequenced_releases{phase=\"Failed\"}"), 1.0, "{text}");
        assert_eq!(sample(&text, "sequenced_readiness_timeouts_total"), 1.0, "{text}");
        assert_eq!(sample(&text, "sequenced_lock_takeovers_total"), 0.0, "{text}");
        assert!(sample(&text, "process_resident_memory_bytes") > 0.0, "{text}");
        assert!(sample(&text, "process_open_fds") > 0.0, "{text}");
        server.abort();
        op.stop().await;
    })
    .await;
}

/// Packages chart `demo` at `version` into `dir` (a chart repository) and indexes it again, as
/// a chart publisher does. Its ConfigMap says which version rendered it.
fn publish(dir: &Path, version: &str) {
    let source = TempDir::new().unwrap();
    support::write(
        source.path(),
        "Chart.yaml",
        &format!("apiVersion: v2\nname: demo\nversion: {version}\n"),
    );
    support::write(
        source.path(),
        "templates/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n  annotations:\n    helm.sh/layer: one\ndata:\n  version: {{ .Chart.Version | quote }}\n",
    );
    support::package(source.path(), dir);
    let status = std::process::Command::new(support::helm())
        .arg("repo")
        .arg("index")
        .arg(dir)
        .status()
        .expect("helm repo index");
    assert!(status.success());
}

/// Serves the files of `dir` on loopback: a chart repository.
fn serve(dir: &Path) -> support::http::Server {
    let dir = dir.to_path_buf();
    support::http::Server::start(move |request| {
        let name = request.path.trim_start_matches('/');
        match std::fs::read(dir.join(name)) {
            Ok(body) if !name.contains("..") => {
                support::http::Response::ok("application/octet-stream", body)
            }
            _ => support::http::Response::not_found(),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newly_published_version_in_the_range_starts_a_revision_within_interval() {
    within(async {
        let repository = TempDir::new().unwrap();
        publish(repository.path(), "1.0.0");
        let server = serve(repository.path());
        let op = Operator::start(4).await;
        let chart = json!({"repository": server.url(), "name": "demo", "version": "^1.0"});
        op.create(
            "default",
            release(
                "demo",
                Path::new("/unused"),
                json!({"chart": chart, "interval": "2s"}),
            ),
        )
        .await;
        let sr = op.wait_release("default", "demo", "Ready", is_ready).await;
        let status = sr.status.unwrap();
        assert_eq!(status.history[0].chart_version.as_deref(), Some("1.0.0"));
        assert!(
            message_of(&status).contains("chart version 1.0.0"),
            "{:?}",
            status.message
        );
        let cm = op
            .server
            .object("v1", "ConfigMap", Some("default"), "demo")
            .unwrap();
        assert_eq!(cm["data"]["version"], "1.0.0");

        // A version outside the range is never picked; one inside it is, at the next interval,
        // without any change to the SequencedRelease.
        publish(repository.path(), "2.0.0");
        publish(repository.path(), "1.1.0");
        let sr = op
            .wait_release("default", "demo", "revision 2 Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
            })
            .await;
        let status = sr.status.unwrap();
        assert_eq!(status.history[0].chart_version.as_deref(), Some("1.1.0"));
        assert_eq!(status.history[1].chart_version.as_deref(), Some("1.0.0"));
        assert!(
            message_of(&status).contains("chart version 1.1.0"),
            "{:?}",
            status.message
        );
        assert_eq!(sr.metadata.generation, Some(1), "the spec did not change");
        let cm = op
            .server
            .object("v1", "ConfigMap", Some("default"), "demo")
            .unwrap();
        assert_eq!(cm["data"]["version"], "1.1.0");
        op.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_deploys_a_newer_matching_version_as_a_new_revision() {
    within(async {
        let repository = TempDir::new().unwrap();
        publish(repository.path(), "1.0.0");
        let server = serve(repository.path());
        let mut op = Operator::start(4).await;
        let chart = json!({"repository": server.url(), "name": "demo", "version": "1.x"});
        op.create(
            "default",
            release("demo", Path::new("/unused"), json!({"chart": chart})),
        )
        .await;
        op.wait_release("default", "demo", "Ready", is_ready).await;
        op.take_controller().stop().await;
        // While no operator runs, 1.1.0 is published. The next operator resolves the range
        // again before it hashes: it does not render 1.1.0 under revision 1's record.
        publish(repository.path(), "1.1.0");
        let _next = op.spawn("next", 4);
        let sr = op
            .wait_release("default", "demo", "revision 2 Ready", |sr| {
                is_ready(sr) && sr.status.as_ref().and_then(|s| s.revision) == Some(2)
            })
            .await;
        let status = sr.status.unwrap();
        assert_eq!(status.history[0].chart_version.as_deref(), Some("1.1.0"));
        assert_eq!(status.history[1].chart_version.as_deref(), Some("1.0.0"));
        assert_ne!(status.history[0].digest, status.history[1].digest);
    })
    .await;
}

fn message_of(status: &sequenced::api::SequencedReleaseStatus) -> String {
    status.message.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_name_a_helm_release_uses_is_refused_and_a_kept_history_goes_on_numbering() {
    within(async {
        let op = Operator::start(4).await;
        let dir = chart(
            "app",
            &[(
                "templates/cm.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\n  annotations:\n    helm.sh/layer: config\ndata:\n  a: b\n",
            )],
        );
        let path = chart_path(&dir, "app");
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(op.client.clone(), "default");
        // `helm install taken` was here first.
        let helms: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
            "metadata": {"name": "sh.helm.release.v1.taken.v1",
                         "labels": {"owner": "helm", "name": "taken", "version": "1", "status": "deployed"}},
            "type": "helm.sh/release.v1",
            "data": {"release": "SDRzSUFBQUFBQUFBL3dFQUFQLy9BQUFBQUFBQUFBQT0="}
        }))
        .unwrap();
        let created = secrets.create(&Default::default(), &helms).await.unwrap();
        op.create("default", release("taken", &path, json!({}))).await;
        let sr = op
            .wait_release("default", "taken", "Stalled OwnershipConflict", |sr| {
                condition(sr, "Stalled").is_some_and(|(s, r, _)| s == "True" && r == "OwnershipConflict")
            })
            .await;
        let said = message(&sr);
        assert!(said.contains("release name taken in namespace default belongs to a Helm release"), "{said}");
        assert!(said.contains("sh.helm.release.v1.taken.v1") && said.contains("spec.adopt: true"), "{said}");
        let left = secrets.get("sh.helm.release.v1.taken.v1").await.unwrap();
        assert_eq!(
            left.metadata.resource_version, created.metadata.resource_version,
            "Helm's record is left alone"
        );
        assert!(op.server.object("v1", "ConfigMap", Some("default"), "taken-settings").is_none());

        // An uninstall that kept its history, then the same release again: revision 2.
        let kept = json!({"uninstall": {"keepHistory": true}});
        op.create("default", release("kept", &path, kept.clone())).await;
        op.wait_release("default", "kept", "Ready", is_ready).await;
        op.releases("default").delete("kept", &DeleteParams::default()).await.unwrap();
        op.wait_deleted("default", "kept").await;
        // Kept as Helm keeps it: marked uninstalled.
        let first = secrets.get("sh.helm.release.v1.kept.v1").await.unwrap();
        let label = |s: &k8s_openapi::api::core::v1::Secret| {
            s.metadata.labels.as_ref().and_then(|l| l.get("status")).cloned()
        };
        assert_eq!(label(&first).as_deref(), Some("uninstalled"));
        op.create("default", release("kept", &path, kept)).await;
        let sr = op
            .wait_release("default", "kept", "Ready", is_ready)
            .await;
        assert_eq!(sr.status.as_ref().unwrap().revision, Some(2));
        let v1 = secrets.get("sh.helm.release.v1.kept.v1").await.unwrap();
        assert_eq!(v1.metadata.resource_version, first.metadata.resource_version, "the kept record is not overwritten");
        assert!(secrets.get_opt("sh.helm.release.v1.kept.v2").await.unwrap().is_some());
        op.stop().await;
    })
    .await;
}

/// A chain of 4 layers of 5 ConfigMaps (the scale benchmark's chart): what one install costs
/// the API server in writes. Each object is applied once, the status is written when a layer
/// starts and when the release is Ready, one event per layer plus `ReleaseReady`, and nothing
/// the controller applied is read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_layers_costs_one_status_write_and_one_event_per_layer() {
    within(async {
        let mut files = Vec::new();
        for layer in 1..=4 {
            let after = match layer {
                1 => String::new(),
                _ => format!("\n    helm.sh/depends-on/layers: l{}", layer - 1),
            };
            let text: String = (1..=5)
                .map(|i| format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: l{layer}-{i}\n  annotations:\n    helm.sh/layer: l{layer}{after}\ndata:\n  a: b\n"))
                .collect();
            files.push((format!("templates/l{layer}.yaml"), text));
        }
        let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
        let dir = chart("chained", &files);
        let op = Operator::start(4).await;
        op.create("default", release("chained", &chart_path(&dir, "chained"), json!({}))).await;
        op.wait_release("default", "chained", "Ready", is_ready).await;
        // The last event follows the status that says Ready.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ours: Vec<_> = op
            .server
            .requests()
            .into_iter()
            .filter(|r| r.client.as_deref() == Some("test-controller"))
            .collect();
        let count = |verb: &str, kind: &str, sub: Option<&str>| {
            ours.iter()
                .filter(|r| r.verb == verb && r.kind.as_deref() == Some(kind) && r.subresource.as_deref() == sub)
                .count()
        };
        assert_eq!(count("apply", "ConfigMap", None), 20);
        assert_eq!(count("update", "SequencedRelease", Some("status")), 5, "4 layers and Ready");
        assert_eq!(count("create", "Event", None), 5, "4 LayerStarted and ReleaseReady");
        // Its records are listed once, before revision 1: a Helm release of its name may have
        // records (from any revision on: Helm's --history-max drops the first ones).
        assert_eq!(count("list", "Secret", None), 1, "a new release's records are listed once");
        let first_apply = ours.iter().position(|r| r.verb == "apply").unwrap();
        let reads: Vec<_> = ours[first_apply..]
            .iter()
            .filter(|r| r.verb == "get" && r.kind.as_deref() == Some("ConfigMap"))
            .map(|r| r.name.clone())
            .collect();
        assert!(reads.is_empty(), "applied objects read back: {reads:?}");
        op.stop().await;
    })
    .await;
}
